/*
 * hook_drv.c - driver API hooks.
 *
 * Statically linked cudart (nvcc's default, and inside cuBLAS, cuDNN, NCCL,
 * CuPy) exports nothing to interpose: the only way in is the driver.  cudart
 * dlopen()s libcuda.so.1 and fetches every driver function through
 * cuGetProcAddress[_v2]; CuPy uses dlsym(handle, "cuLaunchKernel").  So:
 *
 *   - dlsym is overridden: a request for a hooked driver name returns our
 *     hook and remembers the real function;
 *   - cuGetProcAddress and cuGetProcAddress_v2 are wrapped: the driver picks
 *     the right variant for the version and flags asked (_v2, _ptsz, ...),
 *     and we substitute a hook when the pointer it returns is the real
 *     address of a function we hook.  Comparing addresses, not names, makes
 *     the substitution exactly as version- and flag-aware as the driver is,
 *     and everything else (cuGetExportTable included) passes through;
 *   - the same names are exported, for programs linked with -lcuda.
 *
 * Work a runtime hook already counted (shim_in_runtime) is not counted again.
 */
#define _GNU_SOURCE
#include "shim.h"
#include "shim_graph.h"
#include "shim_trace.h"
#include "shim_vmm.h"

#include <dlfcn.h>
#include <string.h>

#include <cuda.h>

/* cuda.h maps these names to their current versions with macros; we
 * define the exported symbols under their real names. */
#undef cuGetProcAddress
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
__typeof__(cuLaunchKernel) cuLaunchKernel_ptsz;
__typeof__(cuLaunchKernelEx) cuLaunchKernelEx_ptsz;
__typeof__(cuLaunchCooperativeKernel) cuLaunchCooperativeKernel_ptsz;
__typeof__(cuGraphLaunch) cuGraphLaunch_ptsz;

enum {
	H_GETPROC, H_GETPROC_V2,
	H_LAUNCH, H_LAUNCH_PTSZ, H_LAUNCH_EX, H_LAUNCH_EX_PTSZ,
	H_COOP, H_COOP_PTSZ, H_GRAPH, H_GRAPH_PTSZ,
	H_MEMALLOC, H_MEMFREE,
	H_MODLOAD, H_MODLOAD_EX, H_LIBLOAD,
	H_HTOD, H_HTOD_PTDS, H_DTOH, H_DTOH_PTDS, H_DTOD, H_DTOD_PTDS,
	H_HTOD_A, H_HTOD_A_PTSZ, H_DTOH_A, H_DTOH_A_PTSZ, H_DTOD_A, H_DTOD_A_PTSZ,
	H_COUNT
};

/* The copies' entry points, defined below (cuda.h declares the _ptds and
 * _ptsz ones only under CUDA_API_PER_THREAD_DEFAULT_STREAM). */
__typeof__(cuMemcpyHtoD_v2) cuMemcpyHtoD_v2_ptds;
__typeof__(cuMemcpyDtoH_v2) cuMemcpyDtoH_v2_ptds;
__typeof__(cuMemcpyDtoD_v2) cuMemcpyDtoD_v2_ptds;
__typeof__(cuMemcpyHtoDAsync_v2) cuMemcpyHtoDAsync_v2_ptsz;
__typeof__(cuMemcpyDtoHAsync_v2) cuMemcpyDtoHAsync_v2_ptsz;
__typeof__(cuMemcpyDtoDAsync_v2) cuMemcpyDtoDAsync_v2_ptsz;

struct drv_hook {
	const char *name;       /* exported symbol name in libcuda */
	void *hook;             /* ours */
	void *real;             /* libcuda's, once known */
};

static struct drv_hook hooks[H_COUNT] = {
	[H_GETPROC]        = { "cuGetProcAddress",               (void *)cuGetProcAddress, NULL },
	[H_GETPROC_V2]     = { "cuGetProcAddress_v2",            (void *)cuGetProcAddress_v2, NULL },
	[H_LAUNCH]         = { "cuLaunchKernel",                 (void *)cuLaunchKernel, NULL },
	[H_LAUNCH_PTSZ]    = { "cuLaunchKernel_ptsz",            (void *)cuLaunchKernel_ptsz, NULL },
	[H_LAUNCH_EX]      = { "cuLaunchKernelEx",               (void *)cuLaunchKernelEx, NULL },
	[H_LAUNCH_EX_PTSZ] = { "cuLaunchKernelEx_ptsz",          (void *)cuLaunchKernelEx_ptsz, NULL },
	[H_COOP]           = { "cuLaunchCooperativeKernel",      (void *)cuLaunchCooperativeKernel, NULL },
	[H_COOP_PTSZ]      = { "cuLaunchCooperativeKernel_ptsz", (void *)cuLaunchCooperativeKernel_ptsz, NULL },
	[H_GRAPH]          = { "cuGraphLaunch",                  (void *)cuGraphLaunch, NULL },
	[H_GRAPH_PTSZ]     = { "cuGraphLaunch_ptsz",             (void *)cuGraphLaunch_ptsz, NULL },
	[H_MEMALLOC]       = { "cuMemAlloc_v2",                  (void *)cuMemAlloc_v2, NULL },
	[H_MEMFREE]        = { "cuMemFree_v2",                   (void *)cuMemFree_v2, NULL },
	[H_MODLOAD]        = { "cuModuleLoadData",               (void *)cuModuleLoadData, NULL },
	[H_MODLOAD_EX]     = { "cuModuleLoadDataEx",             (void *)cuModuleLoadDataEx, NULL },
	[H_LIBLOAD]        = { "cuLibraryLoadData",              (void *)cuLibraryLoadData, NULL },
	[H_HTOD]           = { "cuMemcpyHtoD_v2",                (void *)cuMemcpyHtoD_v2, NULL },
	[H_HTOD_PTDS]      = { "cuMemcpyHtoD_v2_ptds",           (void *)cuMemcpyHtoD_v2_ptds, NULL },
	[H_DTOH]           = { "cuMemcpyDtoH_v2",                (void *)cuMemcpyDtoH_v2, NULL },
	[H_DTOH_PTDS]      = { "cuMemcpyDtoH_v2_ptds",           (void *)cuMemcpyDtoH_v2_ptds, NULL },
	[H_DTOD]           = { "cuMemcpyDtoD_v2",                (void *)cuMemcpyDtoD_v2, NULL },
	[H_DTOD_PTDS]      = { "cuMemcpyDtoD_v2_ptds",           (void *)cuMemcpyDtoD_v2_ptds, NULL },
	[H_HTOD_A]         = { "cuMemcpyHtoDAsync_v2",           (void *)cuMemcpyHtoDAsync_v2, NULL },
	[H_HTOD_A_PTSZ]    = { "cuMemcpyHtoDAsync_v2_ptsz",      (void *)cuMemcpyHtoDAsync_v2_ptsz, NULL },
	[H_DTOH_A]         = { "cuMemcpyDtoHAsync_v2",           (void *)cuMemcpyDtoHAsync_v2, NULL },
	[H_DTOH_A_PTSZ]    = { "cuMemcpyDtoHAsync_v2_ptsz",      (void *)cuMemcpyDtoHAsync_v2_ptsz, NULL },
	[H_DTOD_A]         = { "cuMemcpyDtoDAsync_v2",           (void *)cuMemcpyDtoDAsync_v2, NULL },
	[H_DTOD_A_PTSZ]    = { "cuMemcpyDtoDAsync_v2_ptsz",      (void *)cuMemcpyDtoDAsync_v2_ptsz, NULL },
};

static int find_hook(const char *name)
{
	int i;

	if (!name || name[0] != 'c' || name[1] != 'u')
		return -1;
	for (i = 0; i < H_COUNT; i++)
		if (strcmp(hooks[i].name, name) == 0)
			return i;
	return -1;
}

static int is_hook(const void *p)
{
	int i;

	for (i = 0; i < H_COUNT; i++)
		if (hooks[i].hook == p)
			return 1;
	return 0;
}

/* Learn every real address from the driver library that holds `any`. */
static void resolve_all_from(void *any)
{
	static int done;
	Dl_info info;
	void *h;
	int i;

	if (__atomic_load_n(&done, __ATOMIC_ACQUIRE))
		return;
	if (!any || !dladdr(any, &info) || !info.dli_fname)
		return;
	h = dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_LAZY);
	if (!h)
		return;
	for (i = 0; i < H_COUNT; i++) {
		void *p = shim_dlsym(h, hooks[i].name);

		if (p && !is_hook(p))
			__atomic_store_n(&hooks[i].real, p, __ATOMIC_RELEASE);
	}
	dlclose(h);
	__atomic_store_n(&done, 1, __ATOMIC_RELEASE);
}

/* The real driver function of hook i (for direct calls to our exports). */
static void *real_of(int i)
{
	void *p = __atomic_load_n(&hooks[i].real, __ATOMIC_ACQUIRE);

	if (p)
		return p;
	p = shim_real_drv(hooks[i].name);
	if (p && !is_hook(p)) {
		__atomic_store_n(&hooks[i].real, p, __ATOMIC_RELEASE);
		return p;
	}
	return NULL;
}

/* Hook for a real driver address, or the address itself. */
static void *substitute(void *real)
{
	int i;

	resolve_all_from(real);
	for (i = 0; i < H_COUNT; i++)
		if (real && __atomic_load_n(&hooks[i].real, __ATOMIC_ACQUIRE) == real)
			return hooks[i].hook;
	return real;
}

/* ---- dlsym ----------------------------------------------------------- */
/*
 * glibc resolves RTLD_NEXT (and decides which namespace to search) from the
 * return address of the dlsym call.  So a name we do not hook is handed to
 * glibc by a tail call: the return address on the stack is still the
 * application's, and glibc answers exactly as if we were not here
 * (tests/test_static.py checks that the compiler emitted a jump).  Only the
 * handful of hooked driver names take the slow path.
 */
static __attribute__((noinline)) void *dlsym_hooked(void *handle, const char *name, int i)
{
	/* RTLD_NEXT from here means "after libcolocate.so": the driver */
	void *p = shim_dlsym(handle, name);

	if (!p || is_hook(p))
		return p;
	__atomic_store_n(&hooks[i].real, p, __ATOMIC_RELEASE);
	return hooks[i].hook;
}

SHIM_API void *dlsym(void *handle, const char *name)
{
	shim_dlsym_fn real;
	int i = find_hook(name);

	if (i >= 0)
		return dlsym_hooked(handle, name, i);
	real = shim_glibc_dlsym();
	if (!real)
		return NULL;
	return real(handle, name);   /* sibling call: see above */
}

/* ---- cuGetProcAddress ------------------------------------------------ */
SHIM_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int ver, cuuint64_t flags,
				      CUdriverProcAddressQueryResult *status)
{
	__typeof__(&cuGetProcAddress_v2) real = real_of(H_GETPROC_V2);
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = real(symbol, pfn, ver, flags, status);
	if (r == CUDA_SUCCESS && pfn && *pfn) {
		resolve_all_from((void *)real);
		*pfn = substitute(*pfn);
	}
	return r;
}

SHIM_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int ver, cuuint64_t flags)
{
	__typeof__(&cuGetProcAddress) real = real_of(H_GETPROC);
	CUresult r;

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = real(symbol, pfn, ver, flags);
	if (r == CUDA_SUCCESS && pfn && *pfn) {
		resolve_all_from((void *)real);
		*pfn = substitute(*pfn);
	}
	return r;
}

/* ---- launches -------------------------------------------------------- */
/* First launch of a CUfunction: ask the driver its name, once.  When the
 * table is full, launches are still counted, just not by kernel. */
static __attribute__((noinline)) struct shim_kernel *name_function(CUfunction f)
{
	static __typeof__(&cuFuncGetName) get_name;
	const char *name = NULL;

	if (shim_kernel_table_full())
		return NULL;
	if (!get_name)
		get_name = (__typeof__(get_name))shim_real_drv("cuFuncGetName");
	if (get_name && get_name(&name, f) != CUDA_SUCCESS)
		name = NULL;
	return shim_kernel_add(f, name ? name : "?");
}

static inline void count_drv_launch(CUresult r, CUfunction f)
{
	struct shim_kernel *k;

	if (r != CUDA_SUCCESS || shim_in_runtime)
		return;
	k = f ? shim_kernel_find(f) : NULL;
	if (f && !k)
		k = name_function(f);
	shim_count_kernel(k, 1);
}

/*
 * Driver launches are never forwarded, but while the app is routed to a
 * worker they must still follow the forwarded work on their stream (and
 * forwarded work that follows must wait for them): the same fence as a
 * local copy.  A launch from inside the runtime was fenced by its runtime
 * hook already.
 */
static inline int drv_fence(CUstream s, int ptsz)
{
	if (shim_in_runtime || !shim_fwd_active())
		return 0;
	return shim_fwd_fence((void *)s, ptsz, SHIM_FENCE_STREAM);
}

static inline void drv_local_done(CUstream s, int ptsz)
{
	if (!shim_in_runtime && shim_fwd_active())
		shim_fwd_local_done((void *)s, ptsz);
}

/*
 * Work on a stream that a runtime capture records (a library with its own
 * static cudart launching into an app's cudaStreamBeginCapture, as cuBLAS
 * does under CUDA graphs): it runs nothing now, so it is neither fenced
 * (a fence would invalidate the capture) nor counted; the graph's
 * launches count it.  One relaxed load when nothing captures.
 */
#define DRV_CAPTURED(strm, ptsz, call)                                    \
	if (!shim_in_runtime && shim_graph_capturing((void *)(strm), ptsz)) \
		return call

/* Tracing on or a library task open (shim_task_hot: one relaxed load):
 * the task layer sees the launch, described by desc (struct shim_task_drv). */
#define TASK_DRV_BEGIN(...)   /* the description's braces hold commas */  \
	struct shim_task_drv t_;                                          \
	int tk_ = shim_task_hot() && !shim_in_runtime;                    \
	if (tk_) {                                                        \
		t_ = (struct shim_task_drv)__VA_ARGS__;                   \
		shim_task_drv_begin(&t_);                                 \
	}
#define TASK_DRV_END(r)                                                   \
	if (tk_)                                                          \
		shim_task_drv_end(&t_, r)

/* count(r, key) counts a successful launch: count_drv_launch (a kernel)
 * or count_drv_graph (a graph's kernels).  Cooperative kernels and graphs
 * stay on all SMs on a partition (counted there). */
#define LAUNCH(idx, params, args, count, key, strm, ptsz, desc)           \
	{                                                                 \
		CUresult (*real) params = real_of(idx);                   \
		CUresult r;                                               \
		if (!real)                                                \
			return CUDA_ERROR_NOT_INITIALIZED;                \
		shim_start();                                             \
		DRV_CAPTURED(strm, ptsz, real args);                      \
		if (drv_fence(strm, ptsz))                                \
			return CUDA_ERROR_LAUNCH_FAILED;                  \
		TASK_DRV_BEGIN(desc);                                     \
		r = real args;                                            \
		drv_local_done(strm, ptsz);                               \
		if (r == CUDA_SUCCESS && !shim_in_runtime && shim_fwd_active()) \
			shim_fwd_drv_all_sms();                           \
		count(r, key);                                            \
		TASK_DRV_END(r);                                          \
		return r;                                                 \
	}

/*
 * A kernel launch: on an SM partition (route kind partition) it goes to the
 * app stream's shadow in the partition's green context, args_on(ps_)
 * naming the shadow instead of the app's stream; a launch refused there (a
 * CUfunction bound to the primary context, on a driver that will not run
 * it in a green one) runs on the app's stream, counted.  Otherwise as
 * LAUNCH.  A launch from inside the runtime hooks was handled by them.
 */
#define LAUNCH_KERNEL(idx, params, args, args_on, strm, ptsz, desc)       \
	{                                                                 \
		CUresult (*real) params = real_of(idx);                   \
		CUresult r;                                               \
		CUlaunchConfig cc_;                                       \
		void *ps_ = NULL;                                         \
		int eager_ = 0;                                           \
		(void)cc_;                                                \
		if (!real)                                                \
			return CUDA_ERROR_NOT_INITIALIZED;                \
		shim_start();                                             \
		DRV_CAPTURED(strm, ptsz, real args);                      \
		/* the task layer first: fwd.mu is held from here on */   \
		TASK_DRV_BEGIN(desc);                                     \
		if (!shim_in_runtime && (shim_fwd_check() || shim_fwd_active())) \
			ps_ = shim_fwd_drv_begin((void *)(strm), ptsz, &eager_); \
		if (!ps_ && drv_fence(strm, ptsz)) {                      \
			TASK_DRV_END(CUDA_ERROR_LAUNCH_FAILED);           \
			return CUDA_ERROR_LAUNCH_FAILED;                  \
		}                                                         \
		r = CUDA_ERROR_UNKNOWN;                                   \
		if (ps_) {                                                \
			r = real args_on;                                 \
			shim_fwd_drv_end((void *)(strm), ptsz, eager_, r); \
		}                                                         \
		if (r != CUDA_SUCCESS) {                                  \
			r = real args;                                    \
			drv_local_done(strm, ptsz);                       \
		}                                                         \
		count_drv_launch(r, f);                                   \
		TASK_DRV_END(r);                                          \
		return r;                                                 \
	}

/* c with its stream replaced by s (for a launch on a partition). */
static const CUlaunchConfig *restream(const CUlaunchConfig *c, void *s, CUlaunchConfig *cc)
{
	if (!c)
		return NULL;
	*cc = *c;
	cc->hStream = (CUstream)s;
	return cc;
}

/* cuLaunchKernelEx with the cooperative attribute: never on a partition. */
static int cooperative(const CUlaunchConfig *c)
{
	unsigned i;

	for (i = 0; c && c->attrs && i < c->numAttrs; i++)
		if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && c->attrs[i].value.cooperative)
			return 1;
	return 0;
}

#define KPARAMS (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
		 unsigned bz, unsigned sh, CUstream s, void **p, void **e)
#define KARGS (f, gx, gy, gz, bx, by, bz, sh, s, p, e)
#define KDESC(ptsz) { f, { gx, gy, gz }, { bx, by, bz }, sh, s, ptsz, 0, 0, { 0 } }
#define KARGS_ON(st) (f, gx, gy, gz, bx, by, bz, sh, (CUstream)(st), p, e)
SHIM_API CUresult cuLaunchKernel KPARAMS
	LAUNCH_KERNEL(H_LAUNCH, KPARAMS, KARGS, KARGS_ON(ps_), s, 0, KDESC(0))
SHIM_API CUresult cuLaunchKernel_ptsz KPARAMS
	LAUNCH_KERNEL(H_LAUNCH_PTSZ, KPARAMS, KARGS, KARGS_ON(ps_), s, 1, KDESC(1))

#define XPARAMS (const CUlaunchConfig *c, CUfunction f, void **p, void **e)
#define XARGS (c, f, p, e)
#define XDESC(ptsz) { f, { c ? c->gridDimX : 0, c ? c->gridDimY : 0, c ? c->gridDimZ : 0 },     \
		      { c ? c->blockDimX : 0, c ? c->blockDimY : 0, c ? c->blockDimZ : 0 },  \
		      c ? c->sharedMemBytes : 0, c ? c->hStream : NULL, ptsz, 0, 0, { 0 } }
#define XARGS_ON(st) (restream(c, st, &cc_), f, p, e)
SHIM_API CUresult cuLaunchKernelEx XPARAMS
{
	if (cooperative(c))
		LAUNCH(H_LAUNCH_EX, XPARAMS, XARGS, count_drv_launch, f, c->hStream, 0, XDESC(0))
	LAUNCH_KERNEL(H_LAUNCH_EX, XPARAMS, XARGS, XARGS_ON(ps_), c ? c->hStream : NULL, 0, XDESC(0))
}
SHIM_API CUresult cuLaunchKernelEx_ptsz XPARAMS
{
	if (cooperative(c))
		LAUNCH(H_LAUNCH_EX_PTSZ, XPARAMS, XARGS, count_drv_launch, f, c->hStream, 1, XDESC(1))
	LAUNCH_KERNEL(H_LAUNCH_EX_PTSZ, XPARAMS, XARGS, XARGS_ON(ps_), c ? c->hStream : NULL, 1,
		      XDESC(1))
}

#define CPARAMS (CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
		 unsigned bz, unsigned sh, CUstream s, void **p)
#define CARGS (f, gx, gy, gz, bx, by, bz, sh, s, p)
SHIM_API CUresult cuLaunchCooperativeKernel CPARAMS
	LAUNCH(H_COOP, CPARAMS, CARGS, count_drv_launch, f, s, 0, KDESC(0))
SHIM_API CUresult cuLaunchCooperativeKernel_ptsz CPARAMS
	LAUNCH(H_COOP_PTSZ, CPARAMS, CARGS, count_drv_launch, f, s, 1, KDESC(1))

/*
 * A graph launch counts each kernel of a graph the runtime hooks walked at
 * instantiation (shim_graph.c), else one launch of an unnamed kernel:
 * graphs instantiated through the driver API are not walked.
 */
#define GDESC(ptsz) { g, { 0 }, { 0 }, 0, s, ptsz, 1, 0, { 0 } }
static inline void count_drv_graph(CUresult r, CUgraphExec g)
{
	if (r == CUDA_SUCCESS && !shim_in_runtime)
		shim_graph_count(g);
}

#define GPARAMS (CUgraphExec g, CUstream s)
SHIM_API CUresult cuGraphLaunch GPARAMS
	LAUNCH(H_GRAPH, GPARAMS, (g, s), count_drv_graph, g, s, 0, GDESC(0))
SHIM_API CUresult cuGraphLaunch_ptsz GPARAMS
	LAUNCH(H_GRAPH_PTSZ, GPARAMS, (g, s), count_drv_graph, g, s, 1, GDESC(1))

/* ---- memory ----------------------------------------------------------
 * COLOCATE_MEM=vmm: a statically linked cudart (and cuBLAS, cuDNN inside
 * it) allocates here, not through our cudaMalloc: the same VMM allocator
 * and the same fallback (a native allocation marks the app unshared).
 * From inside the runtime hooks (shim_in_runtime) the memory is the
 * runtime's own and passes through. */
SHIM_API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
	__typeof__(&cuMemAlloc_v2) real = real_of(H_MEMALLOC);
	CUresult r;

	shim_start();
	if (!shim_in_runtime && p && n && shim_vmm_on()) {
		void *q;

		if (shim_vmm_malloc(&q, n) == 0) {
			*p = (CUdeviceptr)(uintptr_t)q;
			shim_alloc_note(q, n);
			return CUDA_SUCCESS;
		}
	}
	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	r = real(p, n);
	if (r == CUDA_SUCCESS && p && !shim_in_runtime)
		shim_alloc_note((const void *)(uintptr_t)*p, n);
	return r;
}

SHIM_API CUresult cuMemFree_v2(CUdeviceptr p)
{
	__typeof__(&cuMemFree_v2) real = real_of(H_MEMFREE);
	CUresult r;
	void *t;

	shim_start();
	/* anything in our VMM span is ours: workers unmap it first (all
	 * forwarded work fenced, as cudaFree does); an interior pointer or a
	 * double free is CUDA_ERROR_INVALID_VALUE, never the real free's */
	if (!shim_in_runtime && p && shim_vmm_in_span((const void *)(uintptr_t)p)) {
		if (shim_fwd_active() && shim_fwd_fence(NULL, 0, SHIM_FENCE_ALL))
			return CUDA_ERROR_LAUNCH_FAILED;   /* a forwarded launch failed */
		t = shim_free_take((const void *)(uintptr_t)p);
		r = shim_vmm_free((void *)(uintptr_t)p) == 0 ? CUDA_SUCCESS
								    : CUDA_ERROR_INVALID_VALUE;
		shim_free_done(t, r == CUDA_SUCCESS);
		return r;
	}
	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	t = shim_free_take((const void *)(uintptr_t)p);   /* NULL inside the runtime */
	r = real(p);
	shim_free_done(t, r == CUDA_SUCCESS);
	return r;
}

/* ---- copies ----------------------------------------------------------
 * A statically linked cudart copies through these (fetched with
 * cuGetProcAddress), and so do driver-API programs: their bytes count as
 * the runtime hooks count cudaMemcpy's (shim_in_runtime: already counted).
 * They are fenced like launches while the app is routed to a worker.
 * Until exports.txt lists them, only calls through cuGetProcAddress and
 * dlsym reach them; a program linked with -lcuda calls the driver's. */
enum { C_H2D, C_D2H, C_D2D };

static inline void count_drv_copy(CUresult r, int dir, size_t n)
{
	if (r != CUDA_SUCCESS || shim_in_runtime || n == 0)
		return;
	if (dir == C_H2D)
		shim_add(&shim_ctr->h2d_bytes, n);
	else if (dir == C_D2H)
		shim_add(&shim_ctr->d2h_bytes, n);
	else
		shim_add(&shim_ctl->d2d_bytes, n);
}

#define COPY(idx, params, args, strm, ptsz, dir, n)                       \
	{                                                                 \
		CUresult (*real) params = real_of(idx);                   \
		CUresult r;                                               \
		if (!real)                                                \
			return CUDA_ERROR_NOT_INITIALIZED;                \
		shim_start();                                             \
		DRV_CAPTURED(strm, ptsz, real args);                      \
		if (drv_fence(strm, ptsz))                                \
			return CUDA_ERROR_LAUNCH_FAILED;                  \
		r = real args;                                            \
		drv_local_done(strm, ptsz);                               \
		count_drv_copy(r, dir, n);                                \
		return r;                                                 \
	}

#define H2D_P (CUdeviceptr d, const void *s, size_t n)
#define D2H_P (void *d, CUdeviceptr s, size_t n)
#define D2D_P (CUdeviceptr d, CUdeviceptr s, size_t n)
#define H2D_AP (CUdeviceptr d, const void *s, size_t n, CUstream st)
#define D2H_AP (void *d, CUdeviceptr s, size_t n, CUstream st)
#define D2D_AP (CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st)
SHIM_API CUresult cuMemcpyHtoD_v2 H2D_P COPY(H_HTOD, H2D_P, (d, s, n), NULL, 0, C_H2D, n)
SHIM_API CUresult cuMemcpyHtoD_v2_ptds H2D_P COPY(H_HTOD_PTDS, H2D_P, (d, s, n), NULL, 1, C_H2D, n)
SHIM_API CUresult cuMemcpyDtoH_v2 D2H_P COPY(H_DTOH, D2H_P, (d, s, n), NULL, 0, C_D2H, n)
SHIM_API CUresult cuMemcpyDtoH_v2_ptds D2H_P COPY(H_DTOH_PTDS, D2H_P, (d, s, n), NULL, 1, C_D2H, n)
SHIM_API CUresult cuMemcpyDtoD_v2 D2D_P COPY(H_DTOD, D2D_P, (d, s, n), NULL, 0, C_D2D, n)
SHIM_API CUresult cuMemcpyDtoD_v2_ptds D2D_P COPY(H_DTOD_PTDS, D2D_P, (d, s, n), NULL, 1, C_D2D, n)
SHIM_API CUresult cuMemcpyHtoDAsync_v2 H2D_AP
	COPY(H_HTOD_A, H2D_AP, (d, s, n, st), st, 0, C_H2D, n)
SHIM_API CUresult cuMemcpyHtoDAsync_v2_ptsz H2D_AP
	COPY(H_HTOD_A_PTSZ, H2D_AP, (d, s, n, st), st, 1, C_H2D, n)
SHIM_API CUresult cuMemcpyDtoHAsync_v2 D2H_AP
	COPY(H_DTOH_A, D2H_AP, (d, s, n, st), st, 0, C_D2H, n)
SHIM_API CUresult cuMemcpyDtoHAsync_v2_ptsz D2H_AP
	COPY(H_DTOH_A_PTSZ, D2H_AP, (d, s, n, st), st, 1, C_D2H, n)
SHIM_API CUresult cuMemcpyDtoDAsync_v2 D2D_AP
	COPY(H_DTOD_A, D2D_AP, (d, s, n, st), st, 0, C_D2D, n)
SHIM_API CUresult cuMemcpyDtoDAsync_v2_ptsz D2D_AP
	COPY(H_DTOD_A_PTSZ, D2D_AP, (d, s, n, st), st, 1, C_D2D, n)

/* ---- modules --------------------------------------------------------- */
/* Passed through for now; the process pool captures the images here to
 * load them in its workers. */
SHIM_API CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
	__typeof__(&cuModuleLoadData) real = real_of(H_MODLOAD);

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	shim_start();
	return real(m, image);
}

SHIM_API CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n,
				     CUjit_option *opts, void **vals)
{
	__typeof__(&cuModuleLoadDataEx) real = real_of(H_MODLOAD_EX);

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	shim_start();
	return real(m, image, n, opts, vals);
}

SHIM_API CUresult cuLibraryLoadData(CUlibrary *lib, const void *code, CUjit_option *jo,
				    void **jv, unsigned njo, CUlibraryOption *lo, void **lv,
				    unsigned nlo)
{
	__typeof__(&cuLibraryLoadData) real = real_of(H_LIBLOAD);

	if (!real)
		return CUDA_ERROR_NOT_INITIALIZED;
	shim_start();
	return real(lib, code, jo, jv, njo, lo, lv, nlo);
}
