/*
 * launch.c - how the CPU cuDNN/cuBLAS put their work on the device: one
 * kernel handle per name from simgpu_kernel_define (with the parameter
 * layout, so a launch copies its arguments and returns at once), launched
 * with cudaLaunchKernel on the caller's stream.
 *
 * cudaLaunchKernel is called through the dynamic symbol (a plain call
 * through the PLT into libcudart.so.13): a preloaded libcolocate.so sees
 * these launches like any application's.  Compiled into both libraries.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "dnn_impl.h"

/* simgpu's export (shim/simgpu/kernels.c); no header of its own. */
void *simgpu_kernel_define(const char *mangled, int n, const unsigned *sizes);

/* Marks this library as one that carries host twins: a shim forwarding
 * this process's launches to a process-pool worker names it in its HELLO,
 * so that the worker loads it and can run our kernels too. */
SGPU_EXPORT const int simgpu_twin_library = 1;

static pthread_once_t global_once = PTHREAD_ONCE_INIT;

/*
 * simgpu finds twins with dlsym(RTLD_DEFAULT).  A program that links us
 * has us in the global scope already; one that dlopen()s us RTLD_LOCAL
 * (Python's ctypes, plugin loaders) does not.  Promote ourselves: a
 * no-load dlopen with RTLD_GLOBAL adds an already-loaded object to the
 * global scope.  The reference it takes is kept for the process's life.
 */
static void make_global(void)
{
	Dl_info info;

	if (!dladdr((void *)&make_global, &info) || !info.dli_fname)
		return;
	if (!dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL))
		fprintf(stderr, "simgpu-dnn: cannot make %s global: %s\n", info.dli_fname,
			dlerror());
}

static void *kernel_of(struct sgpu_kdef *def)
{
	void *h = __atomic_load_n(&def->handle, __ATOMIC_ACQUIRE);

	if (h)
		return h;
	pthread_once(&global_once, make_global);
	/* two threads may both define: simgpu hands out the same record */
	h = simgpu_kernel_define(def->name, def->nparams, def->sizes);
	if (h)
		__atomic_store_n(&def->handle, h, __ATOMIC_RELEASE);
	return h;
}

int sgpu_launch(struct sgpu_kdef *def, unsigned gx, unsigned gy, unsigned gz, unsigned block,
		void **args, cudaStream_t stream)
{
	void *k = kernel_of(def);
	dim3 grid = { gx, gy, gz }, blk = { block, 1, 1 };

	if (!k)
		return cudaErrorMemoryAllocation;
	return cudaLaunchKernel(k, grid, blk, args, 0, stream);
}
