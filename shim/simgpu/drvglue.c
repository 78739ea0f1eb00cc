/*
 * drvglue.c - the entry points simgpu's libcuda.so.1 uses to reach the
 * runtime's device (drvglue.h says why they exist).
 *
 * Two kinds of glue:
 *   - memory, memsets, kernels' names and layouts, launches from a packed
 *     argument buffer: the internals of simgpu (simgpu_impl.h) directly;
 *   - streams, events, copies, launches, libraries: the runtime's own
 *     definitions of cudaStreamCreate and friends, which keep their state
 *     in their files.  They are looked up once with dlvsym on this very
 *     library (version node libcudart.so.13), which answers with our own
 *     definition whatever is preloaded: a call through the symbol table
 *     (or its address taken here) would land in colocate's hook instead.
 *
 * Every entry point leaves the runtime's last error as it found it: a
 * runtime definition that fails records its error for cudaGetLastError,
 * so the error the thread had before is put back (QUIET).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "simgpu_impl.h"
#include "drvglue.h"

#define GLUE SG_API

/* ---------------------------------------------------------------- the runtime's own */

static struct {
	cudaError_t (*peek)(void);
	cudaError_t (*get_last)(void);
	cudaError_t (*dev_attr)(int *, enum cudaDeviceAttr, int);
	cudaError_t (*dev_props)(struct cudaDeviceProp *, int);
	cudaError_t (*host_alloc)(void **, size_t);
	cudaError_t (*host_free)(void *);
	cudaError_t (*copy[2])(void *, const void *, size_t, enum cudaMemcpyKind);
	cudaError_t (*copy_async[2])(void *, const void *, size_t, enum cudaMemcpyKind,
				     cudaStream_t);
	cudaError_t (*set[2])(void *, int, size_t);
	cudaError_t (*set_async[2])(void *, int, size_t, cudaStream_t);
	cudaError_t (*launch[2])(cudaKernel_t, dim3, dim3, void **, size_t, cudaStream_t);
	cudaError_t (*coop[2])(const void *, dim3, dim3, void **, size_t, cudaStream_t);
	cudaError_t (*lib_load)(cudaLibrary_t *, const void *, enum cudaJitOption *, void **,
				unsigned, enum cudaLibraryOption *, void **, unsigned);
	cudaError_t (*lib_unload)(cudaLibrary_t);
	cudaError_t (*lib_kernel)(cudaKernel_t *, cudaLibrary_t, const char *);
	cudaError_t (*lib_count)(unsigned *, cudaLibrary_t);
	cudaError_t (*lib_enum)(cudaKernel_t *, unsigned, cudaLibrary_t);
	cudaError_t (*stream_create)(cudaStream_t *, unsigned, int);
	cudaError_t (*stream_destroy)(cudaStream_t);
	cudaError_t (*stream_sync[2])(cudaStream_t);
	cudaError_t (*stream_query[2])(cudaStream_t);
	cudaError_t (*stream_wait[2])(cudaStream_t, cudaEvent_t, unsigned);
	cudaError_t (*stream_flags[2])(cudaStream_t, unsigned *);
	cudaError_t (*host_func[2])(cudaStream_t, cudaHostFn_t, void *);
	cudaError_t (*event_create)(cudaEvent_t *, unsigned);
	cudaError_t (*event_destroy)(cudaEvent_t);
	cudaError_t (*event_record[2])(cudaEvent_t, cudaStream_t);
	cudaError_t (*event_sync)(cudaEvent_t);
	cudaError_t (*event_query)(cudaEvent_t);
	cudaError_t (*event_elapsed)(float *, cudaEvent_t, cudaEvent_t);
	/* optional: the driver answers CUDA_ERROR_NOT_SUPPORTED without them */
	cudaError_t (*capturing[2])(cudaStream_t, enum cudaStreamCaptureStatus *);
	cudaError_t (*malloc_async[2])(void **, size_t, cudaStream_t);
	cudaError_t (*free_async[2])(void *, cudaStream_t);
} rt;

static pthread_once_t rt_once = PTHREAD_ONCE_INIT;
static int rt_ok;                     /* every definition found */

static void *own(void *h, const char *name, int required)
{
	void *p = dlvsym(h, name, "libcudart.so.13");

	if (!p)
		p = dlsym(h, name);   /* a build without the version node */
	if (!p) {
		sg_log("driver glue: %s not found in this libcudart", name);
		if (required)
			rt_ok = 0;
	}
	return p;
}

#define OWN(field, name) (*(void **)&(field) = own(h, name, 1))
#define OWN_OPT(field, name) (*(void **)&(field) = own(h, name, 0))

static void rt_load(void)
{
	Dl_info info;
	void *h;

	if (!dladdr((void *)rt_load, &info) || !info.dli_fname) {
		sg_log("driver glue: cannot find this library's file");
		return;
	}
	/* already loaded: this only takes a reference, never closed */
	h = dlopen(info.dli_fname, RTLD_NOLOAD | RTLD_LAZY);
	if (!h) {
		sg_log("driver glue: %s", dlerror());
		return;
	}
	rt_ok = 1;
	OWN(rt.peek, "cudaPeekAtLastError");
	OWN(rt.get_last, "cudaGetLastError");
	OWN(rt.dev_attr, "cudaDeviceGetAttribute");
	OWN(rt.dev_props, "cudaGetDeviceProperties_v2");
	OWN(rt.host_alloc, "cudaMallocHost");
	OWN(rt.host_free, "cudaFreeHost");
	OWN(rt.copy[0], "cudaMemcpy");
	OWN(rt.copy[1], "cudaMemcpy_ptds");
	OWN(rt.copy_async[0], "cudaMemcpyAsync");
	OWN(rt.copy_async[1], "cudaMemcpyAsync_ptsz");
	OWN(rt.set[0], "cudaMemset");
	OWN(rt.set[1], "cudaMemset_ptds");
	OWN(rt.set_async[0], "cudaMemsetAsync");
	OWN(rt.set_async[1], "cudaMemsetAsync_ptsz");
	OWN(rt.launch[0], "__cudaLaunchKernel");
	OWN(rt.launch[1], "__cudaLaunchKernel_ptsz");
	OWN(rt.coop[0], "cudaLaunchCooperativeKernel");
	OWN(rt.coop[1], "cudaLaunchCooperativeKernel_ptsz");
	OWN(rt.lib_load, "cudaLibraryLoadData");
	OWN(rt.lib_unload, "cudaLibraryUnload");
	OWN(rt.lib_kernel, "cudaLibraryGetKernel");
	OWN(rt.lib_count, "cudaLibraryGetKernelCount");
	OWN(rt.lib_enum, "cudaLibraryEnumerateKernels");
	OWN(rt.stream_create, "cudaStreamCreateWithPriority");
	OWN(rt.stream_destroy, "cudaStreamDestroy");
	OWN(rt.stream_sync[0], "cudaStreamSynchronize");
	OWN(rt.stream_sync[1], "cudaStreamSynchronize_ptsz");
	OWN(rt.stream_query[0], "cudaStreamQuery");
	OWN(rt.stream_query[1], "cudaStreamQuery_ptsz");
	OWN(rt.stream_wait[0], "cudaStreamWaitEvent");
	OWN(rt.stream_wait[1], "cudaStreamWaitEvent_ptsz");
	OWN(rt.stream_flags[0], "cudaStreamGetFlags");
	OWN(rt.stream_flags[1], "cudaStreamGetFlags_ptsz");
	OWN(rt.host_func[0], "cudaLaunchHostFunc");
	OWN(rt.host_func[1], "cudaLaunchHostFunc_ptsz");
	OWN(rt.event_create, "cudaEventCreateWithFlags");
	OWN(rt.event_destroy, "cudaEventDestroy");
	OWN(rt.event_record[0], "cudaEventRecord");
	OWN(rt.event_record[1], "cudaEventRecord_ptsz");
	OWN(rt.event_sync, "cudaEventSynchronize");
	OWN(rt.event_query, "cudaEventQuery");
	OWN(rt.event_elapsed, "cudaEventElapsedTime");
	OWN_OPT(rt.capturing[0], "cudaStreamIsCapturing");
	OWN_OPT(rt.capturing[1], "cudaStreamIsCapturing_ptsz");
	OWN_OPT(rt.malloc_async[0], "cudaMallocAsync");
	OWN_OPT(rt.malloc_async[1], "cudaMallocAsync_ptsz");
	OWN_OPT(rt.free_async[0], "cudaFreeAsync");
	OWN_OPT(rt.free_async[1], "cudaFreeAsync_ptsz");
}

/* Whether the runtime's definitions were all found (once). */
static int rt_ready(void)
{
	sg_init();
	pthread_once(&rt_once, rt_load);
	return rt_ok;
}

/* Put back the thread's last error after a runtime definition failed. */
static int quiet_end(cudaError_t e, cudaError_t before)
{
	if (e != cudaSuccess && e != cudaErrorNotReady) {
		rt.get_last();
		if (before != cudaSuccess)
			sg_err(before);
	}
	return (int)e;
}

#define QUIET(call)                                                      \
	do {                                                             \
		cudaError_t before_;                                     \
		if (!rt_ready())                                         \
			return cudaErrorInitializationError;             \
		before_ = rt.peek();                                     \
		return quiet_end((call), before_);                       \
	} while (0)

/* ---------------------------------------------------------------- attach */

static _Atomic(simgpu_drv_getproc_fn) drv_getproc;

GLUE int simgpu_drv_abi(void)
{
	return SIMGPU_DRV_ABI;
}

GLUE int simgpu_drv_init(void)
{
	return rt_ready() ? cudaSuccess : cudaErrorInitializationError;
}

/* Whether the runtime was initialised before the driver asked. */
GLUE int simgpu_drv_runtime_ready(void)
{
	return atomic_load_explicit(&sg_ready, memory_order_acquire);
}

/* The driver's constructor: from now on cudaGetDriverEntryPoint hands out
 * its functions (vmm.c asks sg_drv_entry first). */
GLUE void simgpu_drv_attach(simgpu_drv_getproc_fn getproc)
{
	atomic_store(&drv_getproc, getproc);
}

GLUE void *simgpu_drv_vmm_entry(const char *name)
{
	return name ? sg_vmm_entry(name) : NULL;
}

/* 1: answered by the attached driver (found, or found too new) */
int sg_drv_entry(const char *symbol, void **fn, unsigned version, unsigned long long flags,
		 enum cudaDriverEntryPointQueryResult *status)
{
	simgpu_drv_getproc_fn gp = atomic_load(&drv_getproc);
	int st = 1;          /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */

	if (!gp)
		return 0;
	/* cudaEnable* flags have the CU_GET_PROC_ADDRESS_* values */
	if (gp(symbol, fn, version ? (int)version : 13000, flags, &st) == 0 && *fn) {
		if (status)
			*status = cudaDriverEntryPointSuccess;
		return 1;
	}
	*fn = NULL;
	if (st == 2) {       /* CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT */
		if (status)
			*status = cudaDriverEntryPointVersionNotSufficent;
		return 1;
	}
	return 0;
}

/* ---------------------------------------------------------------- device */

GLUE int simgpu_drv_device_attr(int *value, int attr)
{
	/* CUdevice_attribute and cudaDeviceAttr share their numbers */
	QUIET(rt.dev_attr(value, (enum cudaDeviceAttr)attr, 0));
}

/* The device's SMs, whatever this process's MPS share (the attribute says
 * the share, as a GPU's does): what green contexts split. */
GLUE int simgpu_drv_device_sms(int *value)
{
	if (!value)
		return cudaErrorInvalidValue;
	if (!rt_ready())
		return cudaErrorInitializationError;
	*value = sg_cfg.sms;
	return cudaSuccess;
}

static int props(struct cudaDeviceProp *p)
{
	QUIET(rt.dev_props(p, 0));
}

GLUE int simgpu_drv_device_name(char *name, int len)
{
	struct cudaDeviceProp p;
	int e;

	if (!name || len <= 0)
		return cudaErrorInvalidValue;
	e = props(&p);
	if (e != cudaSuccess)
		return e;
	strncpy(name, p.name, (size_t)len - 1);
	name[len - 1] = 0;
	return cudaSuccess;
}

GLUE int simgpu_drv_device_uuid(unsigned char uuid[16])
{
	struct cudaDeviceProp p;
	int e;

	if (!uuid)
		return cudaErrorInvalidValue;
	e = props(&p);
	if (e == cudaSuccess)
		memcpy(uuid, &p.uuid, 16);
	return e;
}

/* Everything queued, then the errors kernels left (sticky) or copies. */
GLUE int simgpu_drv_sync_all(void)
{
	cudaError_t e;

	sg_init();
	sg_sync_all();
	e = sg_sticky();
	if (e != cudaSuccess)
		return e;
	if (!rt_ready())
		return cudaErrorInitializationError;
	{
		cudaError_t before = rt.peek();

		return quiet_end(sg_sync_status(), before);
	}
}

/* ---------------------------------------------------------------- memory */

GLUE int simgpu_drv_mem_alloc(void **p, size_t n)
{
	sg_init();
	if (!p || n == 0)
		return cudaErrorInvalidValue;
	*p = NULL;
	return sg_arena_alloc(n, SG_MEM_DEVICE, p);
}

GLUE int simgpu_drv_mem_free(void *p)
{
	void *base;

	sg_init();
	if (!p || !sg_arena_find(p, &base, NULL, NULL) || base != p)
		return cudaErrorInvalidValue;
	/* as cudaFree: queued work may still use it */
	sg_sync_all();
	return sg_arena_free(p);
}

GLUE int simgpu_drv_mem_info(size_t *free_b, size_t *total_b)
{
	sg_init();
	if (!free_b || !total_b)
		return cudaErrorInvalidValue;
	sg_arena_mem_info(free_b, total_b);
	return cudaSuccess;
}

GLUE int simgpu_drv_mem_range(const void *p, void **base, size_t *size)
{
	void *b = NULL;
	size_t n = 0;

	sg_init();
	if (!sg_arena_find(p, &b, &n, NULL) && !sg_vmm_find(p, &b, &n))
		return cudaErrorInvalidValue;     /* CUDA_ERROR_NOT_FOUND in the driver */
	if (base)
		*base = b;
	if (size)
		*size = n;
	return cudaSuccess;
}

GLUE int simgpu_drv_host_alloc(void **p, size_t n)
{
	QUIET(rt.host_alloc(p, n));
}

GLUE int simgpu_drv_host_free(void *p)
{
	QUIET(rt.host_free(p));
}

GLUE int simgpu_drv_is_dev(const void *p, size_t n)
{
	sg_init();
	return sg_is_dev(p) && sg_dev_range_ok(p, n);
}

GLUE int simgpu_drv_copy(void *dst, const void *src, size_t n, int dir, void *stream, int ptsz,
			 int async)
{
	enum cudaMemcpyKind kind = dir == SG_DRV_ANY ? cudaMemcpyDefault : (enum cudaMemcpyKind)dir;

	ptsz = !!ptsz;
	if (dir < SG_DRV_H2H || dir > SG_DRV_ANY)
		return cudaErrorInvalidValue;
	if (async)
		QUIET(rt.copy_async[ptsz](dst, src, n, kind, (cudaStream_t)stream));
	QUIET(rt.copy[ptsz](dst, src, n, kind));
}

/* A pattern wider than a byte, not one byte repeated: copied from a
 * buffer of it (device-to-device time, as a memset's), or for a large
 * range written by a host function (untimed at timescale 0). */
struct fill {
	void    *dst;
	size_t   count;
	unsigned value, width;
};

static void fill_run(void *arg)
{
	struct fill *f = arg;
	size_t i;

	if (f->width == 2)
		for (i = 0; i < f->count; i++)
			((uint16_t *)f->dst)[i] = (uint16_t)f->value;
	else
		for (i = 0; i < f->count; i++)
			((uint32_t *)f->dst)[i] = f->value;
}

static void fill_host(void *arg)
{
	if (sg_protected_call(fill_run, arg) < 0) {
		sg_log("memset of %zu elements faulted", ((struct fill *)arg)->count);
		sg_async_error(cudaErrorIllegalAddress, 1);
	}
	free(arg);
}

#define FILL_BUF_MAX (64u << 20)

static int pattern_set(struct sg_stream *s, void *dst, unsigned value, unsigned width,
		       size_t count)
{
	size_t n = count * width;
	struct fill *f = malloc(sizeof(*f));
	struct sg_op *op;

	if (!f)
		return cudaErrorMemoryAllocation;
	f->dst = dst;
	f->count = count;
	f->value = value;
	f->width = width;
	if (n <= FILL_BUF_MAX) {
		void *buf = malloc(n);

		if (!buf) {
			free(f);
			return cudaErrorMemoryAllocation;
		}
		op = sg_op_new(SG_OP_COPY, 0);
		if (!op) {
			free(buf);
			free(f);
			return cudaErrorMemoryAllocation;
		}
		f->dst = buf;
		fill_run(f);
		free(f);
		op->u.copy.dst = dst;
		op->u.copy.src = buf;
		op->u.copy.n = n;
		op->u.copy.dir = SG_D2D;
		op->u.copy.owned = buf;       /* exec.c frees it */
	} else {
		op = sg_op_new(SG_OP_HOST, 0);
		if (!op) {
			free(f);
			return cudaErrorMemoryAllocation;
		}
		op->u.host.fn = fill_host;
		op->u.host.data = f;
	}
	sg_enqueue(s, op);
	return cudaSuccess;
}

GLUE int simgpu_drv_memset(void *dst, unsigned value, unsigned width, size_t count, void *stream,
			   int ptsz, int async)
{
	unsigned b = value & 0xff;
	struct sg_stream *s;

	ptsz = !!ptsz;
	if (width != 1 && width != 2 && width != 4)
		return cudaErrorInvalidValue;
	if (count > SIZE_MAX / width)
		return cudaErrorInvalidValue;
	if (width == 1 || (width == 2 && (value & 0xffff) == b * 0x101u) ||
	    (width == 4 && value == b * 0x01010101u)) {
		/* one byte repeated: the runtime's memset, timed and checked */
		if (async)
			QUIET(rt.set_async[ptsz](dst, (int)b, count * width, (cudaStream_t)stream));
		QUIET(rt.set[ptsz](dst, (int)b, count * width));
	}
	sg_init();
	if (sg_sticky() != cudaSuccess)
		return sg_sticky();
	if (count == 0)
		return cudaSuccess;
	if (!sg_dev_range_ok(dst, count * width))
		return cudaErrorInvalidValue;
	s = sg_stream_resolve(async ? (cudaStream_t)stream : NULL, ptsz);
	if (!s)
		return cudaErrorInvalidResourceHandle;
	return pattern_set(s, dst, value, width, count);
}

/* ---------------------------------------------------------------- libraries, kernels */

GLUE int simgpu_drv_library_load(void **lib, const void *image)
{
	QUIET(rt.lib_load((cudaLibrary_t *)lib, image, NULL, NULL, 0, NULL, NULL, 0));
}

GLUE int simgpu_drv_library_unload(void *lib)
{
	QUIET(rt.lib_unload((cudaLibrary_t)lib));
}

GLUE int simgpu_drv_library_kernel(void **kernel, void *lib, const char *name)
{
	QUIET(rt.lib_kernel((cudaKernel_t *)kernel, (cudaLibrary_t)lib, name));
}

GLUE int simgpu_drv_library_count(unsigned *n, void *lib)
{
	QUIET(rt.lib_count(n, (cudaLibrary_t)lib));
}

GLUE int simgpu_drv_library_kernels(void **kernels, unsigned n, void *lib)
{
	QUIET(rt.lib_enum((cudaKernel_t *)kernels, n, (cudaLibrary_t)lib));
}

static struct sg_kernel *kernel_of(const void *h)
{
	struct sg_kernel *k = sg_kernel_by_handle(h);

	if (k && !atomic_load_explicit(&k->resolved, memory_order_acquire))
		sg_kernel_resolve(k);
	return k;
}

GLUE int simgpu_drv_kernel_name(const char **name, const void *kernel)
{
	struct sg_kernel *k;

	sg_init();
	if (!name)
		return cudaErrorInvalidValue;
	k = sg_kernel_by_handle(kernel);
	if (!k)
		return cudaErrorInvalidResourceHandle;
	*name = k->name;
	return cudaSuccess;
}

GLUE int simgpu_drv_kernel_param(const void *kernel, size_t i, size_t *off, size_t *size)
{
	struct sg_kernel *k;

	sg_init();
	k = kernel_of(kernel);
	if (!k)
		return cudaErrorInvalidResourceHandle;
	if (k->params.n < 0 || i >= (size_t)k->params.n)
		return cudaErrorInvalidValue;
	if (off)
		*off = k->params.off[i];
	if (size)
		*size = k->params.size[i];
	return cudaSuccess;
}

GLUE int simgpu_drv_kernel_attr(const void *kernel, int *regs, int *smem_static)
{
	struct sg_kernel *k;

	sg_init();
	k = kernel_of(kernel);
	if (!k)
		return cudaErrorInvalidResourceHandle;
	if (regs)
		*regs = k->regs > 0 ? (int)k->regs : (int)sg_cfg.mp.regs_default;
	if (smem_static)
		*smem_static = (int)k->smem_static;
	return cudaSuccess;
}

#define ARGS_ON_STACK 32

GLUE int simgpu_drv_launch(const void *kernel, const unsigned dims[6], unsigned shmem,
			   void *stream, void **args, const void *buf, size_t n, int ptsz,
			   int coop)
{
	void *stack[ARGS_ON_STACK], **argv = args;
	dim3 g, b;
	cudaError_t before;
	int e, i;

	if (!rt_ready())
		return cudaErrorInitializationError;
	if (!dims)
		return cudaErrorInvalidValue;
	ptsz = !!ptsz;
	g.x = dims[0], g.y = dims[1], g.z = dims[2];
	b.x = dims[3], b.y = dims[4], b.z = dims[5];
	if (!args && buf) {
		/* the packed buffer, cut at the cubin's offsets */
		struct sg_kernel *k = kernel_of(kernel);

		if (!k)
			return cudaErrorInvalidResourceHandle;
		if (k->params.n < 0 || n < k->params.total)
			return cudaErrorInvalidValue;
		argv = k->params.n <= ARGS_ON_STACK ? stack
						    : malloc((size_t)k->params.n * sizeof(void *));
		if (!argv)
			return cudaErrorMemoryAllocation;
		for (i = 0; i < k->params.n; i++)
			argv[i] = (char *)buf + k->params.off[i];
	}
	before = rt.peek();
	if (coop)
		e = rt.coop[ptsz](kernel, g, b, argv, shmem, (cudaStream_t)stream);
	else
		e = rt.launch[ptsz]((cudaKernel_t)kernel, g, b, argv, shmem, (cudaStream_t)stream);
	/* arguments are copied at enqueue (or consumed before return) */
	if (argv != args && argv != stack)
		free(argv);
	return quiet_end(e, before);
}

/* ---------------------------------------------------------------- streams, events */

GLUE int simgpu_drv_stream_create(void **s, unsigned flags, int prio)
{
	QUIET(rt.stream_create((cudaStream_t *)s, flags, prio));
}

GLUE int simgpu_drv_stream_destroy(void *s)
{
	QUIET(rt.stream_destroy((cudaStream_t)s));
}

GLUE int simgpu_drv_stream_sync(void *s, int ptsz)
{
	QUIET(rt.stream_sync[!!ptsz]((cudaStream_t)s));
}

GLUE int simgpu_drv_stream_query(void *s, int ptsz)
{
	QUIET(rt.stream_query[!!ptsz]((cudaStream_t)s));
}

GLUE int simgpu_drv_stream_wait_event(void *s, void *e, unsigned flags, int ptsz)
{
	QUIET(rt.stream_wait[!!ptsz]((cudaStream_t)s, (cudaEvent_t)e, flags));
}

GLUE int simgpu_drv_stream_flags(void *s, unsigned *flags, int ptsz)
{
	QUIET(rt.stream_flags[!!ptsz]((cudaStream_t)s, flags));
}

GLUE int simgpu_drv_host_func(void *s, void (*fn)(void *), void *data, int ptsz)
{
	QUIET(rt.host_func[!!ptsz]((cudaStream_t)s, fn, data));
}

/* Only a stream this process created (never the legacy or per-thread one). */
GLUE int simgpu_drv_stream_set_green(void *s, void *green, unsigned sms)
{
	struct sg_stream *st;

	sg_init();
	if (!s || s == (void *)cudaStreamLegacy || s == (void *)cudaStreamPerThread)
		return cudaErrorInvalidResourceHandle;
	st = sg_stream_resolve((cudaStream_t)s, 0);
	if (!st || sg_stream_set_green(st, green, sms) < 0)
		return cudaErrorInvalidResourceHandle;
	return cudaSuccess;
}

GLUE int simgpu_drv_stream_green_of(void *s, int ptsz, void **green)
{
	struct sg_stream *st;

	sg_init();
	if (!green)
		return cudaErrorInvalidValue;
	st = sg_stream_resolve((cudaStream_t)s, !!ptsz);
	if (!st)
		return cudaErrorInvalidResourceHandle;
	*green = sg_stream_green(st);
	return cudaSuccess;
}

GLUE int simgpu_drv_stream_capturing(void *s, int *status, int ptsz)
{
	ptsz = !!ptsz;
	if (rt_ready() && !rt.capturing[ptsz])
		return cudaErrorNotSupported;
	QUIET(rt.capturing[ptsz]((cudaStream_t)s, (enum cudaStreamCaptureStatus *)status));
}

GLUE int simgpu_drv_mem_alloc_async(void **p, size_t n, void *s, int ptsz)
{
	ptsz = !!ptsz;
	if (rt_ready() && !rt.malloc_async[ptsz])
		return cudaErrorNotSupported;
	QUIET(rt.malloc_async[ptsz](p, n, (cudaStream_t)s));
}

GLUE int simgpu_drv_mem_free_async(void *p, void *s, int ptsz)
{
	ptsz = !!ptsz;
	if (rt_ready() && !rt.free_async[ptsz])
		return cudaErrorNotSupported;
	QUIET(rt.free_async[ptsz](p, (cudaStream_t)s));
}

GLUE int simgpu_drv_event_create(void **e, unsigned flags)
{
	QUIET(rt.event_create((cudaEvent_t *)e, flags));
}

GLUE int simgpu_drv_event_destroy(void *e)
{
	QUIET(rt.event_destroy((cudaEvent_t)e));
}

GLUE int simgpu_drv_event_record(void *e, void *s, int ptsz)
{
	QUIET(rt.event_record[!!ptsz]((cudaEvent_t)e, (cudaStream_t)s));
}

GLUE int simgpu_drv_event_sync(void *e)
{
	QUIET(rt.event_sync((cudaEvent_t)e));
}

GLUE int simgpu_drv_event_query(void *e)
{
	QUIET(rt.event_query((cudaEvent_t)e));
}

GLUE int simgpu_drv_event_elapsed(float *ms, void *start, void *end)
{
	QUIET(rt.event_elapsed(ms, (cudaEvent_t)start, (cudaEvent_t)end));
}
