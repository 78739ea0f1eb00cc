/*
 * fakecuda.h - internals of the fake libcuda.so.1.
 *
 * The fake driver exists only to test driver-API interception without a
 * GPU: the calls a program makes through dlsym / cuGetProcAddress reach
 * it, and a few kernels do real work on malloc-backed "device" memory so
 * a test can check that launches really went through.  Everything runs
 * synchronously on the calling thread.  Real cudart cannot run on it
 * (it needs private cuGetExportTable tables); simgpu replaces cudart.
 *
 * A module image is text: "FAKEMOD <kernel> <kernel> ...".  Known kernels:
 *   add_one(float *p, int n)   p[i] += 1
 *   scale2(float *p, int n)    p[i] *= 2
 * Other names load as kernels that do nothing.
 *
 * Exported extra: unsigned long long fakecuda_launch_count(void), the
 * number of launches the driver executed.
 */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <cuda.h>
#include <stddef.h>

#define FC_API __attribute__((visibility("default")))

extern int fc_initialized;

/* memory.c: is [p, p+n) inside one live allocation? */
int fc_mem_ok(CUdeviceptr p, size_t n);

/* module.c */
struct fc_func;
struct fc_func *fc_func_check(const void *handle);
CUresult fc_run(struct fc_func *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
		unsigned by, unsigned bz, void **params, void **extra);

#endif
