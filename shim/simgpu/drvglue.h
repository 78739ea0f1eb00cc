/*
 * drvglue.h - the private interface between simgpu's libcudart.so.13 and
 * its libcuda.so.1 (shim/simgpu/driver/).
 *
 * The driver library is a thin layer over the runtime's device: one
 * memory arena, one set of streams and events, one kernel table.  It must
 * not call the runtime's public entry points by name (cudaMalloc,
 * cudaLaunchKernel, ...): under LD_PRELOAD colocate's runtime hooks would
 * intercept them and count the work a second time, after the driver hooks
 * already did.  So libcudart exports these simgpu_drv_* functions, which
 * nobody hooks.  They reach the runtime's own definitions directly (or
 * its internals), never through the interposable symbol table, and they
 * leave the runtime's per-thread last error as it was: driver calls do not
 * touch cudaGetLastError on a GPU either.
 *
 * Every function returns a cudaError_t as an int (the driver maps it to a
 * CUresult, driver/errors.c).  Handles are the runtime's: a CUstream is a
 * cudaStream_t, a CUevent a cudaEvent_t, a CUfunction and a CUkernel are
 * cudaKernel_t records of a library loaded with cudaLibraryLoadData.
 */
#ifndef SIMGPU_DRVGLUE_H
#define SIMGPU_DRVGLUE_H

#include <stddef.h>
#include <stdint.h>

#define SIMGPU_DRV_ABI 3               /* 3: simgpu_drv_device_sms */

/* Directions of simgpu_drv_copy: cudaMemcpyKind's values. */
enum { SG_DRV_H2H = 0, SG_DRV_H2D = 1, SG_DRV_D2H = 2, SG_DRV_D2D = 3, SG_DRV_ANY = 4 };

/* The driver's cuGetProcAddress_v2, for cudaGetDriverEntryPoint. */
typedef int (*simgpu_drv_getproc_fn)(const char *symbol, void **pfn, int version,
				      unsigned long long flags, int *status);

int   simgpu_drv_abi(void);                        /* SIMGPU_DRV_ABI      */
int   simgpu_drv_init(void);
int   simgpu_drv_runtime_ready(void);             /* initialised already */
void  simgpu_drv_attach(simgpu_drv_getproc_fn getproc);
void *simgpu_drv_vmm_entry(const char *name);      /* vmm.c's, or NULL    */

/* device */
int simgpu_drv_device_attr(int *value, int attr);  /* CUdevice_attribute  */
int simgpu_drv_device_sms(int *value);             /* all, not the share  */
int simgpu_drv_device_name(char *name, int len);
int simgpu_drv_device_uuid(unsigned char uuid[16]);
int simgpu_drv_sync_all(void);

/* memory */
int simgpu_drv_mem_alloc(void **p, size_t n);
int simgpu_drv_mem_free(void *p);
int simgpu_drv_mem_info(size_t *free_b, size_t *total_b);
int simgpu_drv_mem_range(const void *p, void **base, size_t *size);
int simgpu_drv_host_alloc(void **p, size_t n);
int simgpu_drv_host_free(void *p);
int simgpu_drv_is_dev(const void *p, size_t n);    /* 1: device memory    */
int simgpu_drv_copy(void *dst, const void *src, size_t n, int dir, void *stream, int ptsz,
		    int async);
/* count elements of width 1, 2 or 4 bytes, each set to the low bytes of value */
int simgpu_drv_memset(void *dst, unsigned value, unsigned width, size_t count, void *stream,
		      int ptsz, int async);

/* libraries and kernels */
int simgpu_drv_library_load(void **lib, const void *image);
int simgpu_drv_library_unload(void *lib);
int simgpu_drv_library_kernel(void **kernel, void *lib, const char *name);
int simgpu_drv_library_count(unsigned *n, void *lib);
int simgpu_drv_library_kernels(void **kernels, unsigned n, void *lib);
int simgpu_drv_kernel_name(const char **name, const void *kernel);
int simgpu_drv_kernel_param(const void *kernel, size_t i, size_t *off, size_t *size);
int simgpu_drv_kernel_attr(const void *kernel, int *regs, int *smem_static);
/* dims: grid x y z, block x y z.  args: kernelParams; or, when NULL and
 * buf is set, the packed CU_LAUNCH_PARAM_BUFFER_POINTER buffer of size n. */
int simgpu_drv_launch(const void *kernel, const unsigned dims[6], unsigned shmem, void *stream,
		      void **args, const void *buf, size_t n, int ptsz, int coop);

/* streams and events */
int simgpu_drv_stream_create(void **s, unsigned flags, int prio);
int simgpu_drv_stream_destroy(void *s);
int simgpu_drv_stream_sync(void *s, int ptsz);
int simgpu_drv_stream_query(void *s, int ptsz);
int simgpu_drv_stream_wait_event(void *s, void *e, unsigned flags, int ptsz);
int simgpu_drv_stream_flags(void *s, unsigned *flags, int ptsz);
int simgpu_drv_host_func(void *s, void (*fn)(void *), void *data, int ptsz);
/* a green context's stream: its kernels run on at most sms SMs; green is
 * the driver's tag, handed back by simgpu_drv_stream_green_of (NULL none) */
int simgpu_drv_stream_set_green(void *s, void *green, unsigned sms);
int simgpu_drv_stream_green_of(void *s, int ptsz, void **green);
int simgpu_drv_stream_capturing(void *s, int *status, int ptsz);  /* cudaStreamCaptureStatus */
int simgpu_drv_mem_alloc_async(void **p, size_t n, void *s, int ptsz);
int simgpu_drv_mem_free_async(void *p, void *s, int ptsz);
int simgpu_drv_event_create(void **e, unsigned flags);
int simgpu_drv_event_destroy(void *e);
int simgpu_drv_event_record(void *e, void *s, int ptsz);
int simgpu_drv_event_sync(void *e);
int simgpu_drv_event_query(void *e);
int simgpu_drv_event_elapsed(float *ms, void *start, void *end);

/* libcudart's own side (hidden; simgpu_impl.h included first) */
#ifdef SIMGPU_IMPL_H
void *sg_vmm_entry(const char *name);                             /* vmm.c     */
int   sg_drv_entry(const char *symbol, void **fn, unsigned version,  /* drvglue.c */
		   unsigned long long flags, enum cudaDriverEntryPointQueryResult *status);
#endif

#endif
