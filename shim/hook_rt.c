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
#include "shim_graph.h"
#include "shim_trace.h"
#include "shim_vmm.h"

#include <cuda_runtime_api.h>

/* Declared by the CUDA headers only for C++ (crt/host_runtime.h,
 * crt/device_functions.h); same prototypes here for C. */
void **__cudaRegisterFatBinary(void *fatCubin);
void __cudaRegisterFatBinaryEnd(void **fatCubinHandle);
void __cudaUnregisterFatBinary(void **fatCubinHandle);
void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
			    const char *deviceName, int thread_limit, uint3 *tid, uint3 *bid,
			    dim3 *bDim, dim3 *gDim, int *wSize);
void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
		       const char *deviceName, int ext, size_t size, int constant, int global);
void __cudaRegisterManagedVar(void **fatCubinHandle, void **hostVarPtrAddress,
			      char *deviceAddress, const char *deviceName, int ext, size_t size,
			      int constant, int global);
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
__typeof__(cudaGraphInstantiateWithParams) cudaGraphInstantiateWithParams_ptsz;
__typeof__(cudaStreamBeginCapture) cudaStreamBeginCapture_ptsz;
__typeof__(cudaStreamBeginCaptureToGraph) cudaStreamBeginCaptureToGraph_ptsz;
__typeof__(cudaStreamEndCapture) cudaStreamEndCapture_ptsz;
__typeof__(cudaMallocAsync) cudaMallocAsync_ptsz;
__typeof__(cudaFreeAsync) cudaFreeAsync_ptsz;
__typeof__(cudaMemcpy) cudaMemcpy_ptds;
__typeof__(cudaMemcpyAsync) cudaMemcpyAsync_ptsz;
__typeof__(cudaMemset) cudaMemset_ptds;
__typeof__(cudaMemsetAsync) cudaMemsetAsync_ptsz;
__typeof__(cudaMemcpy2D) cudaMemcpy2D_ptds;
__typeof__(cudaMemcpy2DAsync) cudaMemcpy2DAsync_ptsz;
__typeof__(cudaMemcpy2DToArray) cudaMemcpy2DToArray_ptds;
__typeof__(cudaMemcpy2DToArrayAsync) cudaMemcpy2DToArrayAsync_ptsz;
__typeof__(cudaMemcpy2DFromArray) cudaMemcpy2DFromArray_ptds;
__typeof__(cudaMemcpy2DFromArrayAsync) cudaMemcpy2DFromArrayAsync_ptsz;
__typeof__(cudaMemcpy3D) cudaMemcpy3D_ptds;
__typeof__(cudaMemcpy3DAsync) cudaMemcpy3DAsync_ptsz;
__typeof__(cudaMemcpyToSymbol) cudaMemcpyToSymbol_ptds;
__typeof__(cudaMemcpyToSymbolAsync) cudaMemcpyToSymbolAsync_ptsz;
__typeof__(cudaMemcpyFromSymbol) cudaMemcpyFromSymbol_ptds;
__typeof__(cudaMemcpyFromSymbolAsync) cudaMemcpyFromSymbolAsync_ptsz;
__typeof__(cudaStreamSynchronize) cudaStreamSynchronize_ptsz;
__typeof__(cudaEventRecord) cudaEventRecord_ptsz;
__typeof__(cudaEventRecordWithFlags) cudaEventRecordWithFlags_ptsz;
__typeof__(cudaStreamWaitEvent) cudaStreamWaitEvent_ptsz;
__typeof__(cudaStreamQuery) cudaStreamQuery_ptsz;
__typeof__(cudaLaunchHostFunc) cudaLaunchHostFunc_ptsz;
__typeof__(cudaStreamAddCallback) cudaStreamAddCallback_ptsz;

/* The real function, looked up once.  On a miss the hook returns an error
 * of the function's own kind rather than crashing the application. */
#define FIND_REAL(fn, on_missing)                                         \
	static __typeof__(&fn) real_;                                     \
	if (!real_ && !(real_ = (__typeof__(&fn))shim_real_rt(#fn)))      \
		return on_missing

/* ... and start the shim (register with the controller) if not yet done. */
#define REAL(fn, on_missing)                                              \
	FIND_REAL(fn, on_missing);                                        \
	shim_start()


#define NOSYM cudaErrorSharedObjectSymbolNotFound

/* Work on a capturing stream is recorded into a graph, not run: it is
 * neither fenced (nothing runs yet, and a fence's synchronisation would
 * invalidate the capture) nor counted (the graph's launches count it), and
 * never forwarded.  One relaxed load while nothing captures. */
#define CAPTURED(s, ptsz, call)                                           \
	if (shim_graph_capturing((void *)(s), ptsz))                      \
		return IN_RUNTIME(call)

/* ---- registration ---------------------------------------------------- */
/*
 * The registration hooks never start the shim (register with the
 * controller): they run from static constructors, possibly inside another
 * thread's dlopen() holding the loader lock, and starting means dlopen'ing
 * libzmq, which needs that lock.  The first real API call starts it.
 */
SHIM_API void **__cudaRegisterFatBinary(void *fatCubin)
{
	void **h;

	FIND_REAL(__cudaRegisterFatBinary, NULL);
	h = IN_RUNTIME(real_(fatCubin));
	/* the image a worker needs to run these kernels: its address only */
	shim_module_register(h, fatCubin);
	return h;
}

SHIM_API void __cudaRegisterFatBinaryEnd(void **h)
{
	FIND_REAL(__cudaRegisterFatBinaryEnd, );
	shim_in_runtime++;
	real_(h);
	shim_in_runtime--;
}

SHIM_API void __cudaUnregisterFatBinary(void **h)
{
	FIND_REAL(__cudaUnregisterFatBinary, );
	shim_module_unregister(h);        /* its image may go with its library */
	shim_in_runtime++;
	real_(h);
	shim_in_runtime--;
}

SHIM_API void __cudaRegisterFunction(void **h, const char *hostFun, char *deviceFun,
				     const char *deviceName, int thread_limit, uint3 *tid,
				     uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize)
{
	FIND_REAL(__cudaRegisterFunction, );
	/* deviceFun is the mangled device name: what a launch is called; h
	 * says which fat binary (module) holds its code; a stub registered
	 * again (dlclose, dlopen) follows its newer module */
	shim_kernel_register(hostFun, deviceFun, shim_module_of(h));
	real_(h, hostFun, deviceFun, deviceName, thread_limit, tid, bid, bDim, gDim, wSize);
}

/* Device variables: the worker would run the module's kernels against its
 * own copy of them (fwd_proto.h, FWD_MF_VARS). */
SHIM_API void __cudaRegisterVar(void **h, char *hostVar, char *deviceAddress,
				const char *deviceName, int ext, size_t size, int constant,
				int global)
{
	FIND_REAL(__cudaRegisterVar, );
	shim_module_note_vars(h);
	real_(h, hostVar, deviceAddress, deviceName, ext, size, constant, global);
}

SHIM_API void __cudaRegisterManagedVar(void **h, void **hostVarPtrAddress, char *deviceAddress,
				       const char *deviceName, int ext, size_t size, int constant,
				       int global)
{
	FIND_REAL(__cudaRegisterManagedVar, );
	shim_module_note_vars(h);
	real_(h, hostVarPtrAddress, deviceAddress, deviceName, ext, size, constant, global);
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
/*
 * Routed to a worker (shim_fwd_check: the slot's route epoch is not the one
 * known to be local), a launch goes to shim_fwd_launch(), which forwards it
 * or runs it locally in order, and counts it.  Otherwise: the real call, plus
 * that one relaxed load.
 */
#define LAUNCH_VIA(cond, run, entry, ptsz, key, g, b, sh, s, a, cfg)       \
	if (cond) {                                                       \
		struct shim_launch l_ = {                                 \
			entry, ptsz, (const void *)(key), (void *)real_,  \
			{ (g).x, (g).y, (g).z }, { (b).x, (b).y, (b).z }, \
			(sh), (void *)(s), (a), (cfg) };                  \
		return (cudaError_t)run(&l_);                             \
	}
#define FWD_LAUNCH(...) LAUNCH_VIA(shim_fwd_check(), shim_fwd_launch, __VA_ARGS__)

/* Tracing on, or a library task open (shim_task_hot: one relaxed load):
 * the task layer runs the launch, as a task or inside its library task. */
#define TASK_LAUNCH(...) LAUNCH_VIA(shim_task_hot(), shim_task_launch, __VA_ARGS__)

#define LAUNCH_HOOK(name, entry, ptsz, KT)                                \
	SHIM_API cudaError_t name(KT f, dim3 g, dim3 b, void **a, size_t sh, cudaStream_t s) \
	{                                                                 \
		cudaError_t r;                                            \
		REAL(name, NOSYM);                                        \
		CAPTURED(s, ptsz, real_(f, g, b, a, sh, s));              \
		TASK_LAUNCH(entry, ptsz, f, g, b, sh, s, a, NULL)         \
		FWD_LAUNCH(entry, ptsz, f, g, b, sh, s, a, NULL)          \
		r = IN_RUNTIME(real_(f, g, b, a, sh, s));                 \
		if (r == cudaSuccess)                                     \
			shim_count_launch(f);                             \
		return r;                                                 \
	}

LAUNCH_HOOK(__cudaLaunchKernel, SHIM_E_NVCC, 0, cudaKernel_t)
LAUNCH_HOOK(__cudaLaunchKernel_ptsz, SHIM_E_NVCC, 1, cudaKernel_t)
LAUNCH_HOOK(cudaLaunchKernel, SHIM_E_LAUNCH, 0, const void *)
LAUNCH_HOOK(cudaLaunchKernel_ptsz, SHIM_E_LAUNCH, 1, const void *)
LAUNCH_HOOK(cudaLaunchCooperativeKernel, SHIM_E_COOP, 0, const void *)
LAUNCH_HOOK(cudaLaunchCooperativeKernel_ptsz, SHIM_E_COOP, 1, const void *)

static const dim3 no_dim;

#define LAUNCH_EXC_HOOK(name, ptsz)                                       \
	SHIM_API cudaError_t name(const cudaLaunchConfig_t *c, const void *f, void **a) \
	{                                                                 \
		cudaError_t r;                                            \
		REAL(name, NOSYM);                                        \
		CAPTURED(c ? c->stream : NULL, ptsz, real_(c, f, a));     \
		TASK_LAUNCH(SHIM_E_EXC, ptsz, f, no_dim, no_dim, 0, NULL, a, c) \
		FWD_LAUNCH(SHIM_E_EXC, ptsz, f, no_dim, no_dim, 0, NULL, a, c) \
		r = IN_RUNTIME(real_(c, f, a));                           \
		if (r == cudaSuccess)                                     \
			shim_count_launch(f);                             \
		return r;                                                 \
	}
LAUNCH_EXC_HOOK(cudaLaunchKernelExC, 0)
LAUNCH_EXC_HOOK(cudaLaunchKernelExC_ptsz, 1)

/* A graph launch counts each kernel node of the graph (shim_graph.c); it
 * is never forwarded (it runs locally, in order with forwarded work).
 * Launched into a capturing stream it becomes a node of that capture. */
#define GRAPH_HOOK(name, ptsz)                                            \
	SHIM_API cudaError_t name(cudaGraphExec_t e, cudaStream_t s)      \
	{                                                                 \
		cudaError_t r;                                            \
		REAL(name, NOSYM);                                        \
		CAPTURED(s, ptsz, real_(e, s));                           \
		TASK_LAUNCH(SHIM_E_GRAPH, ptsz, e, no_dim, no_dim, 0, s, NULL, NULL) \
		FWD_LAUNCH(SHIM_E_GRAPH, ptsz, e, no_dim, no_dim, 0, s, NULL, NULL) \
		r = IN_RUNTIME(real_(e, s));                              \
		if (r == cudaSuccess)                                     \
			shim_graph_count(e);                              \
		return r;                                                 \
	}
GRAPH_HOOK(cudaGraphLaunch, 0)
GRAPH_HOOK(cudaGraphLaunch_ptsz, 1)

/* Local work while launches may be forwarded: wait for the forwarded work
 * it must follow (or report an error a forwarded launch left), and after
 * an asynchronous operation, have the next forwarded launch on its stream
 * wait for it.  One relaxed load when nothing is forwarded. */
#define FWD_FENCE(s, ptsz, scope)                                         \
	do {                                                              \
		int e_;                                                   \
		if (shim_fwd_active() && (e_ = shim_fwd_fence((void *)(s), ptsz, scope))) \
			return (cudaError_t)e_;                           \
	} while (0)
#define FWD_LOCAL(s, ptsz)                                                \
	do {                                                              \
		if (shim_fwd_active())                                    \
			shim_fwd_local_done((void *)(s), ptsz);           \
	} while (0)

/*
 * Stream work that runs here, in order with forwarded launches: fenced
 * behind the launches forwarded before it, then marked done on its
 * stream so the next forwarded launch there need not wait for it.
 * SYNC_WORK is a call on the default stream (legacy, or per-thread when
 * ptsz); STREAM_WORK one on stream st, recorded untouched while st
 * captures.  params and args are the hook's parameter list and the call's
 * argument list, in parentheses; then runs after a successful call.
 */
#define SYNC_WORK(name, ptsz, params, args, then)                                            \
	SHIM_API cudaError_t name params                                                     \
	{                                                                                    \
		cudaError_t r;                                                               \
		struct shim_op_site op_ __attribute__((unused)) = SHIM_OP_SITE(#name, NULL); \
		REAL(name, NOSYM);                                                           \
		FWD_FENCE(NULL, ptsz, SHIM_FENCE_STREAM);                                    \
		r = IN_RUNTIME(real_ args);                                                  \
		if (r == cudaSuccess)                                                        \
			then;                                                                \
		FWD_LOCAL(NULL, ptsz);                                                       \
		return r;                                                                    \
	}
#define STREAM_WORK(name, ptsz, st, params, args, then)                                    \
	SHIM_API cudaError_t name params                                                   \
	{                                                                                  \
		cudaError_t r;                                                             \
		struct shim_op_site op_ __attribute__((unused)) = SHIM_OP_SITE(#name, st); \
		REAL(name, NOSYM);                                                         \
		CAPTURED(st, ptsz, real_ args);                                            \
		FWD_FENCE(st, ptsz, SHIM_FENCE_STREAM);                                    \
		r = IN_RUNTIME(real_ args);                                                \
		if (r == cudaSuccess)                                                      \
			then;                                                              \
		FWD_LOCAL(st, ptsz);                                                       \
		return r;                                                                  \
	}

/* ---- device memory --------------------------------------------------- */
SHIM_API cudaError_t cudaMalloc(void **p, size_t n)
{
	cudaError_t r;

	REAL(cudaMalloc, NOSYM);
	/* COLOCATE_MEM=vmm: shared with workers at the same address
	 * (shim_vmm.c); a failure there falls back to the real allocator.
	 * Not from inside the runtime: a runtime's own nested allocations
	 * (simgpu's cudaMallocPitch and cudaMalloc3D call cudaMalloc) must
	 * stay the runtime's. */
	if (!shim_in_runtime && p && n && shim_vmm_on() && shim_vmm_malloc(p, n) == 0) {
		shim_alloc_note(*p, n);
		return cudaSuccess;
	}
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
	if (r == cudaSuccess && p) {
		if (!shim_in_runtime)
			shim_vmm_note_native("cudaMallocManaged");
		shim_alloc_note(*p, n);
	}
	return r;
}

SHIM_API cudaError_t cudaMallocPitch(void **p, size_t *pitch, size_t w, size_t h)
{
	cudaError_t r;

	REAL(cudaMallocPitch, NOSYM);
	if (!shim_in_runtime && p && pitch && w && h && shim_vmm_on()) {
		/* rows 512-byte aligned: a valid pitch for any 2D copy or
		 * texture on the GPUs we run on (the real call may choose less) */
		size_t pt = (w + 511) / 512 * 512;

		if (pt <= (size_t)-1 / h && shim_vmm_malloc(p, pt * h) == 0) {
			*pitch = pt;
			shim_alloc_note(*p, pt * h);
			return cudaSuccess;
		}
	}
	r = IN_RUNTIME(real_(p, pitch, w, h));
	if (r == cudaSuccess && p && pitch)
		shim_alloc_note(*p, *pitch * h);
	return r;
}

#define MALLOC_ASYNC_HOOK(name, ptsz)                                     \
	SHIM_API cudaError_t name(void **p, size_t n, cudaStream_t s)     \
	{                                                                 \
		cudaError_t r;                                            \
		REAL(name, NOSYM);                                        \
		r = IN_RUNTIME(real_(p, n, s));                           \
		if (r == cudaSuccess && p) {                              \
			if (!shim_in_runtime)                             \
				shim_vmm_note_native(#name);              \
			shim_alloc_note(*p, n);                           \
		}                                                         \
		FWD_LOCAL(s, ptsz);                                       \
		return r;                                                 \
	}
MALLOC_ASYNC_HOOK(cudaMallocAsync, 0)
MALLOC_ASYNC_HOOK(cudaMallocAsync_ptsz, 1)

SHIM_API cudaError_t cudaFree(void *p)
{
	cudaError_t r;
	void *t;

	REAL(cudaFree, NOSYM);
	/* forwarded kernels may still use it, as queued local ones may */
	if (p)
		FWD_FENCE(NULL, 0, SHIM_FENCE_ALL);
	t = shim_free_take(p);
	/* anything in our VMM span is ours to free: workers unmap it first;
	 * an interior pointer or a double free is cudaErrorInvalidValue and
	 * never reaches the real allocator */
	if (!shim_in_runtime && p && shim_vmm_in_span(p))
		r = shim_vmm_free(p);
	else
		r = IN_RUNTIME(real_(p));
	shim_free_done(t, r == cudaSuccess);
	return r;
}

#define FREE_ASYNC_HOOK(name, ptsz)                                       \
	SHIM_API cudaError_t name(void *p, cudaStream_t s)                \
	{                                                                 \
		cudaError_t r;                                            \
		void *t;                                                  \
		REAL(name, NOSYM);                                        \
		if (!shim_in_runtime && p && shim_vmm_in_span(p)) {       \
			/* ours (cudaFree's rules): every worker unmaps   \
			 * it, so all forwarded work is fenced, and the   \
			 * free waits for the device (stream order kept) */ \
			FWD_FENCE(NULL, 0, SHIM_FENCE_ALL);               \
			t = shim_free_take(p);                            \
			r = (cudaError_t)shim_vmm_free(p);                \
			shim_free_done(t, r == cudaSuccess);              \
			return r;                                         \
		}                                                         \
		FWD_FENCE(s, ptsz, SHIM_FENCE_STREAM);                    \
		t = shim_free_take(p);                                    \
		r = IN_RUNTIME(real_(p, s));                              \
		shim_free_done(t, r == cudaSuccess);                      \
		FWD_LOCAL(s, ptsz);                                       \
		return r;                                                 \
	}
FREE_ASYNC_HOOK(cudaFreeAsync, 0)
FREE_ASYNC_HOOK(cudaFreeAsync_ptsz, 1)

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

/* Returns the kind, Default resolved, for the task layer (-1: not counted). */
static int count_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
	if (shim_in_runtime || n == 0)
		return -1;
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
	return kind;
}

/* Blocking copies run on the default stream (legacy, or per-thread for
 * _ptds); even they may return before a device-side copy has finished. */
#define COPY_HOOK(name, ptsz)                                                            \
	SYNC_WORK(name, ptsz, (void *d, const void *s, size_t n, enum cudaMemcpyKind k), \
		  (d, s, n, k), shim_task_copy(count_copy(d, s, n, k), n, 1, &op_))
COPY_HOOK(cudaMemcpy, 0)
COPY_HOOK(cudaMemcpy_ptds, 1)

#define COPY_ASYNC_HOOK(name, ptsz)                                                             \
	STREAM_WORK(name, ptsz, st,                                                             \
		    (void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st), \
		    (d, s, n, k, st), shim_task_copy(count_copy(d, s, n, k), n, 0, &op_))
COPY_ASYNC_HOOK(cudaMemcpyAsync, 0)
COPY_ASYNC_HOOK(cudaMemcpyAsync_ptsz, 1)

/* 2D copies: width x height bytes, in order with forwarded launches. */
#define COPY2D_HOOK(name, ptsz)                                                      \
	SYNC_WORK(name, ptsz,                                                        \
		  (void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h, \
		   enum cudaMemcpyKind k),                                           \
		  (d, dp, s, sp, w, h, k),                                           \
		  shim_task_copy(count_copy(d, s, w * h, k), w * h, 1, &op_))
COPY2D_HOOK(cudaMemcpy2D, 0)
COPY2D_HOOK(cudaMemcpy2D_ptds, 1)

#define COPY2D_ASYNC_HOOK(name, ptsz)                                                  \
	STREAM_WORK(name, ptsz, st,                                                    \
		    (void *d, size_t dp, const void *s, size_t sp, size_t w, size_t h, \
		     enum cudaMemcpyKind k, cudaStream_t st),                          \
		    (d, dp, s, sp, w, h, k, st),                                       \
		    shim_task_copy(count_copy(d, s, w * h, k), w * h, 0, &op_))
COPY2D_ASYNC_HOOK(cudaMemcpy2DAsync, 0)
COPY2D_ASYNC_HOOK(cudaMemcpy2DAsync_ptsz, 1)

/*
 * Copies to and from __device__ variables: kind is HostToDevice (to) or
 * DeviceToHost (from) unless the caller says DeviceToDevice or Default;
 * the symbol is device memory, so Default means "the other side decides".
 */
static int count_symbol_copy(int to, const void *host, size_t n, enum cudaMemcpyKind k)
{
	if (k == cudaMemcpyDefault)
		k = is_device_ptr(host) ? cudaMemcpyDeviceToDevice
		    : to ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
	if (k == cudaMemcpyDeviceToDevice || k == (to ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost))
		return count_copy(NULL, NULL, n, k);
	return -1;
}

/*
 * Copies to and from CUDA arrays: the array is device memory, like a
 * symbol, so the other side decides a cudaMemcpyDefault (count_symbol_copy).
 * width is in bytes for the 2D calls.
 */
#define TO_ARRAY2D_HOOK(name, ptsz)                                                         \
	SYNC_WORK(name, ptsz,                                                               \
		  (cudaArray_t a, size_t wo, size_t ho, const void *s, size_t sp, size_t w, \
		   size_t h, enum cudaMemcpyKind k),                                        \
		  (a, wo, ho, s, sp, w, h, k),                                              \
		  shim_task_copy(count_symbol_copy(1, s, w * h, k), w * h, 1, &op_))
TO_ARRAY2D_HOOK(cudaMemcpy2DToArray, 0)
TO_ARRAY2D_HOOK(cudaMemcpy2DToArray_ptds, 1)

#define TO_ARRAY2D_ASYNC_HOOK(name, ptsz)                                                     \
	STREAM_WORK(name, ptsz, st,                                                           \
		    (cudaArray_t a, size_t wo, size_t ho, const void *s, size_t sp, size_t w, \
		     size_t h, enum cudaMemcpyKind k, cudaStream_t st),                       \
		    (a, wo, ho, s, sp, w, h, k, st),                                          \
		    shim_task_copy(count_symbol_copy(1, s, w * h, k), w * h, 0, &op_))
TO_ARRAY2D_ASYNC_HOOK(cudaMemcpy2DToArrayAsync, 0)
TO_ARRAY2D_ASYNC_HOOK(cudaMemcpy2DToArrayAsync_ptsz, 1)

#define FROM_ARRAY2D_HOOK(name, ptsz)                                                       \
	SYNC_WORK(name, ptsz,                                                               \
		  (void *d, size_t dp, cudaArray_const_t a, size_t wo, size_t ho, size_t w, \
		   size_t h, enum cudaMemcpyKind k),                                        \
		  (d, dp, a, wo, ho, w, h, k),                                              \
		  shim_task_copy(count_symbol_copy(0, d, w * h, k), w * h, 1, &op_))
FROM_ARRAY2D_HOOK(cudaMemcpy2DFromArray, 0)
FROM_ARRAY2D_HOOK(cudaMemcpy2DFromArray_ptds, 1)

#define FROM_ARRAY2D_ASYNC_HOOK(name, ptsz)                                                   \
	STREAM_WORK(name, ptsz, st,                                                           \
		    (void *d, size_t dp, cudaArray_const_t a, size_t wo, size_t ho, size_t w, \
		     size_t h, enum cudaMemcpyKind k, cudaStream_t st),                       \
		    (d, dp, a, wo, ho, w, h, k, st),                                          \
		    shim_task_copy(count_symbol_copy(0, d, w * h, k), w * h, 0, &op_))
FROM_ARRAY2D_ASYNC_HOOK(cudaMemcpy2DFromArrayAsync, 0)
FROM_ARRAY2D_ASYNC_HOOK(cudaMemcpy2DFromArrayAsync_ptsz, 1)

/*
 * cudaMemcpy3D: extent.width counts bytes between pitched pointers and
 * elements when an array takes part (its element size from the runtime).
 * Returns the kind counted, for the task layer (-1: none).
 */
static int count_copy_3d(const struct cudaMemcpy3DParms *p, size_t *n)
{
	static __typeof__(&cudaArrayGetInfo) info;
	cudaArray_const_t arr;
	struct cudaChannelFormatDesc desc;
	struct cudaExtent ext;
	enum cudaMemcpyKind k;
	unsigned flags;
	size_t es = 1;
	int sdev, ddev;

	*n = 0;
	if (!p || shim_in_runtime)
		return -1;
	arr = p->srcArray ? (cudaArray_const_t)p->srcArray : p->dstArray;
	if (arr) {
		if (!info && !(info = (__typeof__(info))shim_real_rt("cudaArrayGetInfo")))
			return -1;
		shim_in_runtime++;
		if (info(&desc, &ext, &flags, (cudaArray_t)arr) == cudaSuccess)
			es = (size_t)(desc.x + desc.y + desc.z + desc.w) / 8;
		shim_in_runtime--;
	}
	k = p->kind;
	if (k == cudaMemcpyDefault) {
		sdev = p->srcArray || is_device_ptr(p->srcPtr.ptr);
		ddev = p->dstArray || is_device_ptr(p->dstPtr.ptr);
		k = ddev ? (sdev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
			 : (sdev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
	}
	*n = p->extent.width * es * p->extent.height * p->extent.depth;
	return count_copy(NULL, NULL, *n, k);
}

static void task_copy_3d(const struct cudaMemcpy3DParms *p, int blocking,
			 const struct shim_op_site *at)
{
	size_t n;
	int kind = count_copy_3d(p, &n);

	shim_task_copy(kind, n, blocking, at);
}

#define COPY3D_HOOK(name, ptsz) \
	SYNC_WORK(name, ptsz, (const struct cudaMemcpy3DParms *p), (p), task_copy_3d(p, 1, &op_))
COPY3D_HOOK(cudaMemcpy3D, 0)
COPY3D_HOOK(cudaMemcpy3D_ptds, 1)

#define COPY3D_ASYNC_HOOK(name, ptsz)                                                              \
	STREAM_WORK(name, ptsz, st, (const struct cudaMemcpy3DParms *p, cudaStream_t st), (p, st), \
		    task_copy_3d(p, 0, &op_))
COPY3D_ASYNC_HOOK(cudaMemcpy3DAsync, 0)
COPY3D_ASYNC_HOOK(cudaMemcpy3DAsync_ptsz, 1)

#define TO_SYMBOL_HOOK(name, ptsz)                                                               \
	SYNC_WORK(name, ptsz,                                                                    \
		  (const void *sym, const void *s, size_t n, size_t off, enum cudaMemcpyKind k), \
		  (sym, s, n, off, k), shim_task_copy(count_symbol_copy(1, s, n, k), n, 1, &op_))
TO_SYMBOL_HOOK(cudaMemcpyToSymbol, 0)
TO_SYMBOL_HOOK(cudaMemcpyToSymbol_ptds, 1)

#define TO_SYMBOL_ASYNC_HOOK(name, ptsz)                                                          \
	STREAM_WORK(name, ptsz, st,                                                               \
		    (const void *sym, const void *s, size_t n, size_t off, enum cudaMemcpyKind k, \
		     cudaStream_t st),                                                            \
		    (sym, s, n, off, k, st),                                                      \
		    shim_task_copy(count_symbol_copy(1, s, n, k), n, 0, &op_))
TO_SYMBOL_ASYNC_HOOK(cudaMemcpyToSymbolAsync, 0)
TO_SYMBOL_ASYNC_HOOK(cudaMemcpyToSymbolAsync_ptsz, 1)

#define FROM_SYMBOL_HOOK(name, ptsz)                                                       \
	SYNC_WORK(name, ptsz,                                                              \
		  (void *d, const void *sym, size_t n, size_t off, enum cudaMemcpyKind k), \
		  (d, sym, n, off, k), shim_task_copy(count_symbol_copy(0, d, n, k), n, 1, &op_))
FROM_SYMBOL_HOOK(cudaMemcpyFromSymbol, 0)
FROM_SYMBOL_HOOK(cudaMemcpyFromSymbol_ptds, 1)

#define FROM_SYMBOL_ASYNC_HOOK(name, ptsz)                                                  \
	STREAM_WORK(name, ptsz, st,                                                         \
		    (void *d, const void *sym, size_t n, size_t off, enum cudaMemcpyKind k, \
		     cudaStream_t st),                                                      \
		    (d, sym, n, off, k, st),                                                \
		    shim_task_copy(count_symbol_copy(0, d, n, k), n, 0, &op_))
FROM_SYMBOL_ASYNC_HOOK(cudaMemcpyFromSymbolAsync, 0)
FROM_SYMBOL_ASYNC_HOOK(cudaMemcpyFromSymbolAsync_ptsz, 1)

/* Memsets: stream work kept in order with forwarded launches; nothing is
 * counted for them. */
#define MEMSET_HOOK(name, ptsz) \
	SYNC_WORK(name, ptsz, (void *p, int v, size_t n), (p, v, n), shim_task_memset(n, 1, &op_))
MEMSET_HOOK(cudaMemset, 0)
MEMSET_HOOK(cudaMemset_ptds, 1)

#define MEMSET_ASYNC_HOOK(name, ptsz)                                                        \
	STREAM_WORK(name, ptsz, s, (void *p, int v, size_t n, cudaStream_t s), (p, v, n, s), \
		    shim_task_memset(n, 0, &op_))
MEMSET_ASYNC_HOOK(cudaMemsetAsync, 0)
MEMSET_ASYNC_HOOK(cudaMemsetAsync_ptsz, 1)

/* ---- synchronisation ------------------------------------------------- */
SHIM_API cudaError_t cudaDeviceSynchronize(void)
{
	struct shim_op_site op_ = SHIM_OP_SITE("cudaDeviceSynchronize", NULL);
	cudaError_t r;

	REAL(cudaDeviceSynchronize, NOSYM);
	FWD_FENCE(NULL, 0, SHIM_FENCE_ALL);
	r = IN_RUNTIME(real_());
	if (r == cudaSuccess && shim_fwd_active())
		shim_fwd_synced();
	shim_sync_note();
	shim_task_sync(&op_);
	return r;
}

/* The context and every event in it die here: the trace forgets its
 * events first (they are still valid then) so it never touches one again. */
SHIM_API cudaError_t cudaDeviceReset(void)
{
	REAL(cudaDeviceReset, NOSYM);
	shim_trace_device_reset();
	return IN_RUNTIME(real_());
}

#define STREAM_SYNC_HOOK(name, ptsz)                              \
	SHIM_API cudaError_t name(cudaStream_t s)                 \
	{                                                         \
		struct shim_op_site op_ = SHIM_OP_SITE(#name, s); \
		cudaError_t r;                                    \
		REAL(name, NOSYM);                                \
		FWD_FENCE(s, ptsz, SHIM_FENCE_STREAM);            \
		r = IN_RUNTIME(real_(s));                         \
		shim_sync_note();                                 \
		shim_task_sync(&op_);                             \
		return r;                                         \
	}
STREAM_SYNC_HOOK(cudaStreamSynchronize, 0)
STREAM_SYNC_HOOK(cudaStreamSynchronize_ptsz, 1)

/* Events are recorded locally, after a fence: an event then completes
 * after the forwarded work before it, so cudaEventSynchronize, queries,
 * waits and timings cover it. */
SHIM_API cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
	struct shim_op_site op_ = SHIM_OP_SITE("cudaEventSynchronize", NULL);
	cudaError_t r;

	REAL(cudaEventSynchronize, NOSYM);
	r = IN_RUNTIME(real_(e));
	shim_sync_note();
	shim_task_sync(&op_);
	return r;
}

#define EVENT_RECORD_HOOK(name, ptsz)                                     \
	SHIM_API cudaError_t name(cudaEvent_t e, cudaStream_t s)          \
	{                                                                 \
		REAL(name, NOSYM);                                        \
		CAPTURED(s, ptsz, real_(e, s));                           \
		FWD_FENCE(s, ptsz, SHIM_FENCE_STREAM);                    \
		return IN_RUNTIME(real_(e, s));                           \
	}
EVENT_RECORD_HOOK(cudaEventRecord, 0)
EVENT_RECORD_HOOK(cudaEventRecord_ptsz, 1)

#define EVENT_RECORD_FLAGS_HOOK(name, ptsz)                               \
	SHIM_API cudaError_t name(cudaEvent_t e, cudaStream_t s, unsigned int f) \
	{                                                                 \
		REAL(name, NOSYM);                                        \
		CAPTURED(s, ptsz, real_(e, s, f));                        \
		FWD_FENCE(s, ptsz, SHIM_FENCE_STREAM);                    \
		return IN_RUNTIME(real_(e, s, f));                        \
	}
EVENT_RECORD_FLAGS_HOOK(cudaEventRecordWithFlags, 0)
EVENT_RECORD_FLAGS_HOOK(cudaEventRecordWithFlags_ptsz, 1)

/* A stream that waits for an event locally: the next launch forwarded on
 * it waits for that first. */
#define STREAM_WAIT_HOOK(name, ptsz)                                      \
	SHIM_API cudaError_t name(cudaStream_t s, cudaEvent_t e, unsigned int f) \
	{                                                                 \
		cudaError_t r;                                            \
		REAL(name, NOSYM);                                        \
		r = IN_RUNTIME(real_(s, e, f));                           \
		FWD_LOCAL(s, ptsz);                                       \
		return r;                                                 \
	}
STREAM_WAIT_HOOK(cudaStreamWaitEvent, 0)
STREAM_WAIT_HOOK(cudaStreamWaitEvent_ptsz, 1)

#define STREAM_QUERY_HOOK(name, ptsz)                                     \
	SHIM_API cudaError_t name(cudaStream_t s)                         \
	{                                                                 \
		REAL(name, NOSYM);                                        \
		if (shim_fwd_active() && shim_fwd_pending((void *)s, ptsz)) \
			return cudaErrorNotReady;                         \
		return IN_RUNTIME(real_(s));                              \
	}
STREAM_QUERY_HOOK(cudaStreamQuery, 0)
STREAM_QUERY_HOOK(cudaStreamQuery_ptsz, 1)

/* Host functions run locally, after the forwarded work before them. */
#define HOST_FUNC_HOOK(name, ptsz)                                        \
	STREAM_WORK(name, ptsz, s,                                        \
	            (cudaStream_t s, cudaHostFn_t fn, void *d),           \
	            (s, fn, d),                                           \
	            (void)0)
HOST_FUNC_HOOK(cudaLaunchHostFunc, 0)
HOST_FUNC_HOOK(cudaLaunchHostFunc_ptsz, 1)

#define CALLBACK_HOOK(name, ptsz)                                         \
	SHIM_API cudaError_t name(cudaStream_t s, cudaStreamCallback_t cb, void *d, \
				  unsigned int f)                         \
	{                                                                 \
		cudaError_t r;                                            \
		REAL(name, NOSYM);                                        \
		FWD_FENCE(s, ptsz, SHIM_FENCE_STREAM);                    \
		r = IN_RUNTIME(real_(s, cb, d, f));                       \
		FWD_LOCAL(s, ptsz);                                       \
		return r;                                                 \
	}
CALLBACK_HOOK(cudaStreamAddCallback, 0)
CALLBACK_HOOK(cudaStreamAddCallback_ptsz, 1)

/* ---- stream capture and graphs (shim_graph.c) ------------------------ */
#define BEGIN_CAPTURE_HOOK(name)                                          \
	SHIM_API cudaError_t name(cudaStream_t s, enum cudaStreamCaptureMode m) \
	{                                                                 \
		cudaError_t r;                                            \
		REAL(name, NOSYM);                                        \
		r = IN_RUNTIME(real_(s, m));                              \
		if (r == cudaSuccess)                                     \
			shim_graph_capture_begun();                       \
		return r;                                                 \
	}
BEGIN_CAPTURE_HOOK(cudaStreamBeginCapture)
BEGIN_CAPTURE_HOOK(cudaStreamBeginCapture_ptsz)

#define BEGIN_CAPTURE_TO_GRAPH_HOOK(name)                                 \
	SHIM_API cudaError_t name(cudaStream_t s, cudaGraph_t g, const cudaGraphNode_t *d, \
				  const cudaGraphEdgeData *ed, size_t n,  \
				  enum cudaStreamCaptureMode m)           \
	{                                                                 \
		cudaError_t r;                                            \
		REAL(name, NOSYM);                                        \
		r = IN_RUNTIME(real_(s, g, d, ed, n, m));                 \
		if (r == cudaSuccess)                                     \
			shim_graph_capture_begun();                       \
		return r;                                                 \
	}
BEGIN_CAPTURE_TO_GRAPH_HOOK(cudaStreamBeginCaptureToGraph)
BEGIN_CAPTURE_TO_GRAPH_HOOK(cudaStreamBeginCaptureToGraph_ptsz)

/* The capture is over once its stream no longer captures, whatever the
 * call returned (an invalidated capture ends with an error). */
#define END_CAPTURE_HOOK(name, ptsz)                                      \
	SHIM_API cudaError_t name(cudaStream_t s, cudaGraph_t *g)         \
	{                                                                 \
		cudaError_t r;                                            \
		int was;                                                  \
		REAL(name, NOSYM);                                        \
		was = shim_graph_capturing((void *)s, ptsz);              \
		r = IN_RUNTIME(real_(s, g));                              \
		shim_graph_capture_end((void *)s, ptsz, was);             \
		return r;                                                 \
	}
END_CAPTURE_HOOK(cudaStreamEndCapture, 0)
END_CAPTURE_HOOK(cudaStreamEndCapture_ptsz, 1)

#define INSTANTIATE_HOOK(name)                                            \
	SHIM_API cudaError_t name(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long f) \
	{                                                                 \
		cudaError_t r;                                            \
		REAL(name, NOSYM);                                        \
		r = IN_RUNTIME(real_(e, g, f));                           \
		if (r == cudaSuccess && e && !shim_in_runtime)            \
			shim_graph_note(*e, g);                           \
		return r;                                                 \
	}
INSTANTIATE_HOOK(cudaGraphInstantiate)
INSTANTIATE_HOOK(cudaGraphInstantiateWithFlags)

#define INSTANTIATE_PARAMS_HOOK(name)                                     \
	SHIM_API cudaError_t name(cudaGraphExec_t *e, cudaGraph_t g,      \
				  cudaGraphInstantiateParams *p)          \
	{                                                                 \
		cudaError_t r;                                            \
		REAL(name, NOSYM);                                        \
		r = IN_RUNTIME(real_(e, g, p));                           \
		if (r == cudaSuccess && e && p && !shim_in_runtime &&     \
		    p->result_out == cudaGraphInstantiateSuccess)         \
			shim_graph_note(*e, g);                           \
		return r;                                                 \
	}
INSTANTIATE_PARAMS_HOOK(cudaGraphInstantiateWithParams)
INSTANTIATE_PARAMS_HOOK(cudaGraphInstantiateWithParams_ptsz)

/* An update makes the exec run the new graph's nodes. */
SHIM_API cudaError_t cudaGraphExecUpdate(cudaGraphExec_t e, cudaGraph_t g,
					 cudaGraphExecUpdateResultInfo *info)
{
	cudaError_t r;

	REAL(cudaGraphExecUpdate, NOSYM);
	r = IN_RUNTIME(real_(e, g, info));
	if (r == cudaSuccess && !shim_in_runtime)
		shim_graph_note(e, g);
	return r;
}

SHIM_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e)
{
	REAL(cudaGraphExecDestroy, NOSYM);
	if (!shim_in_runtime)
		shim_graph_forget(e);   /* first: its address may be reused at once */
	return IN_RUNTIME(real_(e));
}
