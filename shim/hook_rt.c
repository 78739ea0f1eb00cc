/*
 * hook_rt.c - CUDA runtime API hooks, as nvcc 13 really calls the runtime.
 *
 * `kernel<<<g, b>>>(...)` compiled by nvcc 13 calls __cudaGetKernel once per
 * kernel and then __cudaLaunchKernel[_ptsz]; registration goes through
 * __cudaRegisterFatBinary/__cudaRegisterFunction, which gives each host stub
 * its mangled device name.  Only binaries linked with a shared libcudart
 * (nvcc -cudart shared) reach these hooks; statically linked cudart is seen
 * by the driver hooks (hook_drv.c) alone.
 *
 * Every hook: start the shim (cheap after the first call), call the real
 * function with shim_in_runtime set (so the driver hooks do not count the
 * same work again), and count only what succeeded.  Prototypes come from
 * <cuda_runtime_api.h>, so the compiler checks each hook against CUDA 13;
 * the _ptsz/_ptds twins take the type of their base with __typeof__.
 */
#define _GNU_SOURCE
#include "shim.h"

#include <cuda_runtime_api.h>

/* Declared by the CUDA headers only for C++ (crt/host_runtime.h,
 * crt/device_functions.h); same prototypes here for C. */
void **__cudaRegisterFatBinary(void *fatCubin);
void __cudaRegisterFatBinaryEnd(void **fatCubinHandle);
void __cudaUnregisterFatBinary(void **fatCubinHandle);
void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
			    const char *deviceName, int thread_limit, uint3 *tid, uint3 *bid,
			    dim3 *bDim, dim3 *gDim, int *wSize);
cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun);
cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim, void **args,
			       size_t sharedMem, cudaStream_t stream);
__typeof__(__cudaLaunchKernel) __cudaLaunchKernel_ptsz;

/* Per-thread-default-stream variants, declared by the headers only when
 * compiling with --default-stream per-thread. */
__typeof__(cudaLaunchKernel) cudaLaunchKernel_ptsz;
__typeof__(cudaLaunchKernelExC) cudaLaunchKernelExC_ptsz;
__typeof__(cudaLaunchCooperativeKernel) cudaLaunchCooperativeKernel_ptsz;
__typeof__(cudaGraphLaunch) cudaGraphLaunch_ptsz;
__typeof__(cudaMallocAsync) cudaMallocAsync_ptsz;
__typeof__(cudaFreeAsync) cudaFreeAsync_ptsz;
__typeof__(cudaMemcpy) cudaMemcpy_ptds;
__typeof__(cudaMemcpyAsync) cudaMemcpyAsync_ptsz;
__typeof__(cudaMemset) cudaMemset_ptds;
__typeof__(cudaMemsetAsync) cudaMemsetAsync_ptsz;
__typeof__(cudaStreamSynchronize) cudaStreamSynchronize_ptsz;

/* The real function, looked up once.  On a miss the hook returns an error
 * of the function's own kind rather than crashing the application. */
#define REAL(fn, on_missing)                                              \
	static __typeof__(&fn) real_;                                     \
	if (!real_ && !(real_ = (__typeof__(&fn))shim_real_rt(#fn)))      \
		return on_missing;                                        \
	shim_start()

#define IN_RUNTIME(expr) ({ __typeof__(expr) r_; shim_in_runtime++; r_ = (expr); shim_in_runtime--; r_; })

#define NOSYM cudaErrorSharedObjectSymbolNotFound

/* ---- registration ---------------------------------------------------- */
SHIM_API void **__cudaRegisterFatBinary(void *fatCubin)
{
	REAL(__cudaRegisterFatBinary, NULL);
	return IN_RUNTIME(real_(fatCubin));
}

SHIM_API void __cudaRegisterFatBinaryEnd(void **h)
{
	static __typeof__(&__cudaRegisterFatBinaryEnd) real_;

	if (!real_ && !(real_ = (__typeof__(real_))shim_real_rt("__cudaRegisterFatBinaryEnd")))
		return;
	shim_in_runtime++;
	real_(h);
	shim_in_runtime--;
}

SHIM_API void __cudaUnregisterFatBinary(void **h)
{
	static __typeof__(&__cudaUnregisterFatBinary) real_;

	if (!real_ && !(real_ = (__typeof__(real_))shim_real_rt("__cudaUnregisterFatBinary")))
		return;
	shim_in_runtime++;
	real_(h);
	shim_in_runtime--;
}

SHIM_API void __cudaRegisterFunction(void **h, const char *hostFun, char *deviceFun,
				     const char *deviceName, int thread_limit, uint3 *tid,
				     uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize)
{
	static __typeof__(&__cudaRegisterFunction) real_;

	if (!real_ && !(real_ = (__typeof__(real_))shim_real_rt("__cudaRegisterFunction")))
		return;
	/* deviceFun is the mangled device name: what a launch is called */
	shim_kernel_add(hostFun, deviceFun);
	real_(h, hostFun, deviceFun, deviceName, thread_limit, tid, bid, bDim, gDim, wSize);
}

SHIM_API cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *hostFun)
{
	cudaError_t r;

	REAL(__cudaGetKernel, NOSYM);
	r = IN_RUNTIME(real_(kernel, hostFun));
	if (r == cudaSuccess && kernel)
		shim_kernel_alias(hostFun, *kernel);
	return r;
}

/* ---- launches -------------------------------------------------------- */
#define LAUNCH_HOOK(name, key, params, args)                              \
	SHIM_API cudaError_t name params                                  \
	{                                                                 \
		cudaError_t r;                                            \
		REAL(name, NOSYM);                                        \
		r = IN_RUNTIME(real_ args);                               \
		if (r == cudaSuccess)                                     \
			shim_count_launch(key);                           \
		return r;                                                 \
	}

LAUNCH_HOOK(__cudaLaunchKernel, k,
	    (cudaKernel_t k, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s), (k, g, b, a, sh, s))
LAUNCH_HOOK(__cudaLaunchKernel_ptsz, k,
	    (cudaKernel_t k, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s), (k, g, b, a, sh, s))
LAUNCH_HOOK(cudaLaunchKernel, f,
	    (const void *f, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s), (f, g, b, a, sh, s))
LAUNCH_HOOK(cudaLaunchKernel_ptsz, f,
	    (const void *f, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s), (f, g, b, a, sh, s))
LAUNCH_HOOK(cudaLaunchKernelExC, f,
	    (const cudaLaunchConfig_t *c, const void *f, void **a), (c, f, a))
LAUNCH_HOOK(cudaLaunchKernelExC_ptsz, f,
	    (const cudaLaunchConfig_t *c, const void *f, void **a), (c, f, a))
LAUNCH_HOOK(cudaLaunchCooperativeKernel, f,
	    (const void *f, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s), (f, g, b, a, sh, s))
LAUNCH_HOOK(cudaLaunchCooperativeKernel_ptsz, f,
	    (const void *f, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s), (f, g, b, a, sh, s))
/* a graph launch counts as one launch; its kernels are not named */
LAUNCH_HOOK(cudaGraphLaunch, (const void *)e, (cudaGraphExec_t e, cudaStream_t s), (e, s))
LAUNCH_HOOK(cudaGraphLaunch_ptsz, (const void *)e, (cudaGraphExec_t e, cudaStream_t s), (e, s))

/* ---- device memory --------------------------------------------------- */
SHIM_API cudaError_t cudaMalloc(void **p, size_t n)
{
	cudaError_t r;

	REAL(cudaMalloc, NOSYM);
	r = IN_RUNTIME(real_(p, n));
	if (r == cudaSuccess && p)
		shim_alloc_note(*p, n);
	return r;
}

SHIM_API cudaError_t cudaMallocManaged(void **p, size_t n, unsigned int flags)
{
	cudaError_t r;

	REAL(cudaMallocManaged, NOSYM);
	r = IN_RUNTIME(real_(p, n, flags));
	if (r == cudaSuccess && p)
		shim_alloc_note(*p, n);
	return r;
}

SHIM_API cudaError_t cudaMallocPitch(void **p, size_t *pitch, size_t w, size_t h)
{
	cudaError_t r;

	REAL(cudaMallocPitch, NOSYM);
	r = IN_RUNTIME(real_(p, pitch, w, h));
	if (r == cudaSuccess && p && pitch)
		shim_alloc_note(*p, *pitch * h);
	return r;
}

#define MALLOC_ASYNC_HOOK(name)                                           \
	SHIM_API cudaError_t name(void **p, size_t n, cudaStream_t s)     \
	{                                                                 \
		cudaError_t r;                                            \
		REAL(name, NOSYM);                                        \
		r = IN_RUNTIME(real_(p, n, s));                           \
		if (r == cudaSuccess && p)                                \
			shim_alloc_note(*p, n);                           \
		return r;                                                 \
	}
MALLOC_ASYNC_HOOK(cudaMallocAsync)
MALLOC_ASYNC_HOOK(cudaMallocAsync_ptsz)

SHIM_API cudaError_t cudaFree(void *p)
{
	cudaError_t r;

	REAL(cudaFree, NOSYM);
	r = IN_RUNTIME(real_(p));
	if (r == cudaSuccess && p)
		shim_free_note(p);
	return r;
}

#define FREE_ASYNC_HOOK(name)                                             \
	SHIM_API cudaError_t name(void *p, cudaStream_t s)                \
	{                                                                 \
		cudaError_t r;                                            \
		REAL(name, NOSYM);                                        \
		r = IN_RUNTIME(real_(p, s));                              \
		if (r == cudaSuccess && p)                                \
			shim_free_note(p);                                \
		return r;                                                 \
	}
FREE_ASYNC_HOOK(cudaFreeAsync)
FREE_ASYNC_HOOK(cudaFreeAsync_ptsz)

/* Pinned host memory: passed through.  Hooked so that the copy path (and
 * the process pool's forwarding) can tell pinned from pageable sources. */
SHIM_API cudaError_t cudaMallocHost(void **p, size_t n)
{
	REAL(cudaMallocHost, NOSYM);
	return IN_RUNTIME(real_(p, n));
}

SHIM_API cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags)
{
	REAL(cudaHostAlloc, NOSYM);
	return IN_RUNTIME(real_(p, n, flags));
}

SHIM_API cudaError_t cudaFreeHost(void *p)
{
	REAL(cudaFreeHost, NOSYM);
	return IN_RUNTIME(real_(p));
}

/* ---- copies and memsets ---------------------------------------------- */
static int is_device_ptr(const void *p)
{
	static __typeof__(&cudaPointerGetAttributes) get;
	struct cudaPointerAttributes a;

	if (!get && !(get = (__typeof__(get))shim_real_rt("cudaPointerGetAttributes")))
		return 0;
	if (get(&a, p) != cudaSuccess)
		return 0;
	return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static void count_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
	if (kind == cudaMemcpyDefault) {
		int d = is_device_ptr(dst), s = is_device_ptr(src);

		kind = d ? (s ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
			 : (s ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
	}
	switch (kind) {
	case cudaMemcpyHostToDevice:
		shim_add(&shim_ctr->h2d_bytes, n);
		break;
	case cudaMemcpyDeviceToHost:
		shim_add(&shim_ctr->d2h_bytes, n);
		break;
	case cudaMemcpyDeviceToDevice:
		shim_add(&shim_ctl->d2d_bytes, n);
		break;
	default:
		break;
	}
}

#define COPY_HOOK(name)                                                   \
	SHIM_API cudaError_t name(void *d, const void *s, size_t n, enum cudaMemcpyKind k) \
	{                                                                 \
		cudaError_t r;                                            \
		REAL(name, NOSYM);                                        \
		r = IN_RUNTIME(real_(d, s, n, k));                        \
		if (r == cudaSuccess)                                     \
			count_copy(d, s, n, k);                           \
		return r;                                                 \
	}
COPY_HOOK(cudaMemcpy)
COPY_HOOK(cudaMemcpy_ptds)

#define COPY_ASYNC_HOOK(name)                                             \
	SHIM_API cudaError_t name(void *d, const void *s, size_t n, enum cudaMemcpyKind k, \
				  cudaStream_t st)                        \
	{                                                                 \
		cudaError_t r;                                            \
		REAL(name, NOSYM);                                        \
		r = IN_RUNTIME(real_(d, s, n, k, st));                    \
		if (r == cudaSuccess)                                     \
			count_copy(d, s, n, k);                           \
		return r;                                                 \
	}
COPY_ASYNC_HOOK(cudaMemcpyAsync)
COPY_ASYNC_HOOK(cudaMemcpyAsync_ptsz)

/* Memsets are passed through: they are stream work the process pool must
 * keep in order, but nothing is counted for them. */
#define MEMSET_HOOK(name)                                                 \
	SHIM_API cudaError_t name(void *p, int v, size_t n)               \
	{                                                                 \
		REAL(name, NOSYM);                                        \
		return IN_RUNTIME(real_(p, v, n));                        \
	}
MEMSET_HOOK(cudaMemset)
MEMSET_HOOK(cudaMemset_ptds)

#define MEMSET_ASYNC_HOOK(name)                                           \
	SHIM_API cudaError_t name(void *p, int v, size_t n, cudaStream_t s) \
	{                                                                 \
		REAL(name, NOSYM);                                        \
		return IN_RUNTIME(real_(p, v, n, s));                     \
	}
MEMSET_ASYNC_HOOK(cudaMemsetAsync)
MEMSET_ASYNC_HOOK(cudaMemsetAsync_ptsz)

/* ---- synchronisation ------------------------------------------------- */
SHIM_API cudaError_t cudaDeviceSynchronize(void)
{
	cudaError_t r;

	REAL(cudaDeviceSynchronize, NOSYM);
	r = IN_RUNTIME(real_());
	shim_sync_note();
	return r;
}

#define SYNC1_HOOK(name, T)                                               \
	SHIM_API cudaError_t name(T x)                                    \
	{                                                                 \
		cudaError_t r;                                            \
		REAL(name, NOSYM);                                        \
		r = IN_RUNTIME(real_(x));                                 \
		shim_sync_note();                                         \
		return r;                                                 \
	}
SYNC1_HOOK(cudaStreamSynchronize, cudaStream_t)
SYNC1_HOOK(cudaStreamSynchronize_ptsz, cudaStream_t)
SYNC1_HOOK(cudaEventSynchronize, cudaEvent_t)
