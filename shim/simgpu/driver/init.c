/*
 * init.c - cuInit, versions, the one device, and contexts.
 *
 * Contexts all share simgpu's one device (memory, streams and kernels are
 * the runtime's); what they carry here is what a program can observe:
 * the thread's current context (a stack: cuCtxPush/PopCurrent), the
 * primary context's retain count, flags, and the modules loaded in a
 * context, unloaded when it is destroyed.  Context records are never
 * freed, so a destroyed or garbage handle is an error, not a crash.
 *
 * A thread without a current context gets CUDA_ERROR_INVALID_CONTEXT
 * from the calls that need one, as from the driver - except that when
 * the process used the runtime before cuInit, the primary context counts
 * as current on every thread (a GPU's runtime makes it current on each
 * thread it touches, which simgpu's runtime does not tell us about).
 */
#include <stdlib.h>
#include <string.h>

#include "drv.h"

#define STACK_MAX 32

atomic_int drv_initialized;
static int runtime_primary;                 /* runtime was there first */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct drv_ctx primary = { CTX_MAGIC, 1, 0, 0, 1, NULL, NULL };
static struct drv_ctx *created;             /* never freed */

static __thread struct drv_ctx *stack[STACK_MAX];
static __thread int depth;

/* The driver's cuGetProcAddress_v2, for the runtime (procaddr.c). */
int drv_getproc_for_runtime(const char *symbol, void **pfn, int version,
			    unsigned long long flags, int *status);

/* cudaGetDriverEntryPoint of simgpu's libcudart asks us from now on. */
__attribute__((constructor)) static void attach(void)
{
	simgpu_drv_attach(drv_getproc_for_runtime);
}

/* Not a driver function: how a tool tells simgpu's libcuda.so.1 from
 * NVIDIA's (cuInit succeeds on both), e.g. before deciding that a real
 * GPU is present: dlsym(handle, "simgpu_driver_abi"). */
DRV_API int simgpu_driver_abi(void);
DRV_API int simgpu_driver_abi(void)
{
	return SIMGPU_DRV_ABI;
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static CUresult init_result = CUDA_ERROR_NOT_INITIALIZED;

/* Once: whether the runtime was there first must be asked before our own
 * initialisation of it (and by one thread only). */
static void init(void)
{
	if (simgpu_drv_abi() != SIMGPU_DRV_ABI) {
		init_result = CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
		return;
	}
	runtime_primary = simgpu_drv_runtime_ready();
	if (simgpu_drv_init() != 0) {
		init_result = CUDA_ERROR_NO_DEVICE;
		return;
	}
	init_result = CUDA_SUCCESS;
	atomic_store(&drv_initialized, 1);
}

DRV_API CUresult cuInit(unsigned int flags)
{
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_once(&init_once, init);
	return init_result;
}

DRV_API CUresult cuDriverGetVersion(int *driverVersion)
{
	if (!driverVersion)
		return CUDA_ERROR_INVALID_VALUE;
	*driverVersion = 13000;
	return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- device */

static CUresult dev_ok(CUdevice dev)
{
	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	return dev == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

DRV_API CUresult cuDeviceGetCount(int *count)
{
	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	*count = 1;
	return CUDA_SUCCESS;
}

DRV_API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (ordinal != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*device = 0;
	return CUDA_SUCCESS;
}

DRV_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	CUresult r = dev_ok(dev);

	if (r != CUDA_SUCCESS)
		return r;
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	return drv_err(simgpu_drv_device_name(name, len));
}

#undef cuDeviceGetUuid
DRV_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
DRV_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
	CUresult r = dev_ok(dev);

	if (r != CUDA_SUCCESS)
		return r;
	if (!uuid)
		return CUDA_ERROR_INVALID_VALUE;
	return drv_err(simgpu_drv_device_uuid((unsigned char *)uuid->bytes));
}

DRV_API CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
	CUresult r = dev_ok(dev);

	if (r != CUDA_SUCCESS)
		return r;
	if (!uuid)
		return CUDA_ERROR_INVALID_VALUE;
	return drv_err(simgpu_drv_device_uuid((unsigned char *)uuid->bytes));
}

DRV_API CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
	CUresult r = dev_ok(dev);
	size_t free_b;

	if (r != CUDA_SUCCESS)
		return r;
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	return drv_err(simgpu_drv_mem_info(&free_b, bytes));
}

DRV_API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	CUresult r = dev_ok(dev);

	if (r != CUDA_SUCCESS)
		return r;
	if (!pi || (int)attrib <= 0 || (int)attrib >= (int)CU_DEVICE_ATTRIBUTE_MAX)
		return CUDA_ERROR_INVALID_VALUE;
	return drv_err(simgpu_drv_device_attr(pi, (int)attrib));
}

DRV_API CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice dev)
{
	CUresult r = dev_ok(dev);

	if (r != CUDA_SUCCESS)
		return r;
	if (!major || !minor)
		return CUDA_ERROR_INVALID_VALUE;
	r = drv_err(simgpu_drv_device_attr(major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR));
	if (r == CUDA_SUCCESS)
		r = drv_err(simgpu_drv_device_attr(minor,
						   CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR));
	return r;
}

/* ---------------------------------------------------------------- contexts */

static int ctx_valid(const struct drv_ctx *c)
{
	struct drv_ctx *p;
	int ok = 0;

	if (!c)
		return 0;
	pthread_mutex_lock(&mu);
	if (c == &primary)
		ok = 1;
	for (p = created; p && !ok; p = p->next)
		ok = p == c && p->live;
	pthread_mutex_unlock(&mu);
	return ok;
}

CUresult drv_ctx_check(struct drv_ctx **ctx)
{
	struct drv_ctx *c;

	if (!atomic_load_explicit(&drv_initialized, memory_order_acquire))
		return CUDA_ERROR_NOT_INITIALIZED;
	c = depth > 0 ? stack[depth - 1] : NULL;
	if (!c && runtime_primary)
		c = &primary;
	if (!c || !c->live)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (ctx)
		*ctx = c;
	return CUDA_SUCCESS;
}

DRV_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	CUresult r = dev_ok(dev);

	if (r != CUDA_SUCCESS)
		return r;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	primary.refs++;
	pthread_mutex_unlock(&mu);
	*pctx = (CUcontext)(void *)&primary;
	return CUDA_SUCCESS;
}

DRV_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
	CUresult r = dev_ok(dev);

	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&mu);
	if (primary.refs <= 0)
		r = CUDA_ERROR_INVALID_CONTEXT;
	else
		primary.refs--;
	pthread_mutex_unlock(&mu);
	return r;
}

DRV_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
	CUresult r = dev_ok(dev);

	if (r != CUDA_SUCCESS)
		return r;
	if (!flags || !active)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	*flags = primary.flags;
	*active = primary.refs > 0 || runtime_primary;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

DRV_API CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
	CUresult r = dev_ok(dev);

	if (r != CUDA_SUCCESS)
		return r;
	if (flags & ~(unsigned)(CU_CTX_SCHED_MASK | CU_CTX_MAP_HOST | CU_CTX_LMEM_RESIZE_TO_MAX |
				CU_CTX_COREDUMP_ENABLE | CU_CTX_USER_COREDUMP_ENABLE |
				CU_CTX_SYNC_MEMOPS))
		return CUDA_ERROR_INVALID_VALUE;
	pthread_mutex_lock(&mu);
	primary.flags = flags;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

DRV_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
	CUresult r = dev_ok(dev);

	if (r != CUDA_SUCCESS)
		return r;
	/* the device's memory and work are the runtime's: only wait for it */
	r = drv_err(simgpu_drv_sync_all());
	drv_mods_of_ctx_unload(&primary);
	pthread_mutex_lock(&mu);
	primary.refs = 0;
	primary.flags = 0;
	pthread_mutex_unlock(&mu);
	return r;
}

static CUresult create(CUcontext *pctx, unsigned flags, CUdevice dev)
{
	CUresult r = dev_ok(dev);
	struct drv_ctx *c;

	if (r != CUDA_SUCCESS)
		return r;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (depth >= STACK_MAX)
		return CUDA_ERROR_OUT_OF_MEMORY;
	c = calloc(1, sizeof(*c));
	if (!c)
		return CUDA_ERROR_OUT_OF_MEMORY;
	c->magic = CTX_MAGIC;
	c->flags = flags;
	c->live = 1;
	pthread_mutex_lock(&mu);
	c->next = created;
	created = c;
	pthread_mutex_unlock(&mu);
	stack[depth++] = c;          /* the new context is current */
	*pctx = (CUcontext)(void *)c;
	return CUDA_SUCCESS;
}

/* CUDA 13's cuCtxCreate (cuCtxCreate_v4): execution affinity and CIG
 * parameters are not modelled; asking for them is not supported. */
DRV_API CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
				CUdevice dev)
{
	if (params && (params->numExecAffinityParams > 0 || params->cigParams))
		return CUDA_ERROR_NOT_SUPPORTED;
	return create(pctx, flags, dev);
}

/* CUDA 3.2 - 12.x, still handed out by cuGetProcAddress for those. */
DRV_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
DRV_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	return create(pctx, flags, dev);
}

static void unstack(struct drv_ctx *c)
{
	int i, j;

	/* off this thread's stack; other threads find it dead */
	for (i = j = 0; i < depth; i++)
		if (stack[i] != c)
			stack[j++] = stack[i];
	depth = j;
}

int drv_ctx_valid(const struct drv_ctx *c)
{
	return ctx_valid(c);
}

void drv_ctx_add(struct drv_ctx *c)
{
	pthread_mutex_lock(&mu);
	c->live = 1;
	c->next = created;
	created = c;
	pthread_mutex_unlock(&mu);
}

void drv_ctx_retire(struct drv_ctx *c)
{
	pthread_mutex_lock(&mu);
	c->live = 0;
	pthread_mutex_unlock(&mu);
	unstack(c);
}

DRV_API CUresult cuCtxDestroy_v2(CUcontext ctx)
{
	struct drv_ctx *c = (struct drv_ctx *)ctx;

	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!ctx_valid(c))
		return CUDA_ERROR_INVALID_CONTEXT;
	/* cuDevicePrimaryCtxRelease; a green context's: cuGreenCtxDestroy */
	if (c == &primary || c->green)
		return CUDA_ERROR_INVALID_CONTEXT;
	(void)simgpu_drv_sync_all();
	drv_mods_of_ctx_unload(c);
	drv_ctx_retire(c);
	return CUDA_SUCCESS;
}

DRV_API CUresult cuCtxSetCurrent(CUcontext ctx)
{
	struct drv_ctx *c = (struct drv_ctx *)ctx;

	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!c) {
		if (depth > 0)
			depth--;
		return CUDA_SUCCESS;
	}
	if (!ctx_valid(c))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (depth == 0)
		depth = 1;
	stack[depth - 1] = c;
	return CUDA_SUCCESS;
}

DRV_API CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = depth > 0 ? (CUcontext)(void *)stack[depth - 1]
			  : runtime_primary ? (CUcontext)(void *)&primary : NULL;
	return CUDA_SUCCESS;
}

DRV_API CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!ctx_valid((struct drv_ctx *)ctx))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (depth >= STACK_MAX)
		return CUDA_ERROR_OUT_OF_MEMORY;
	stack[depth++] = (struct drv_ctx *)ctx;
	return CUDA_SUCCESS;
}

DRV_API CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (depth == 0)
		return CUDA_ERROR_INVALID_CONTEXT;
	depth--;
	if (pctx)
		*pctx = (CUcontext)(void *)stack[depth];
	return CUDA_SUCCESS;
}

DRV_API CUresult cuCtxGetDevice(CUdevice *device)
{
	CUresult r = drv_ctx_check(NULL);

	if (r != CUDA_SUCCESS)
		return r;
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	*device = 0;
	return CUDA_SUCCESS;
}

DRV_API CUresult cuCtxGetFlags(unsigned int *flags)
{
	struct drv_ctx *c;
	CUresult r = drv_ctx_check(&c);

	if (r != CUDA_SUCCESS)
		return r;
	if (!flags)
		return CUDA_ERROR_INVALID_VALUE;
	*flags = c->flags;
	return CUDA_SUCCESS;
}

DRV_API CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!version)
		return CUDA_ERROR_INVALID_VALUE;
	if (ctx ? !ctx_valid((struct drv_ctx *)ctx) : drv_ctx_check(NULL) != CUDA_SUCCESS)
		return CUDA_ERROR_INVALID_CONTEXT;
	*version = 3020;           /* what every context since CUDA 3.2 reports */
	return CUDA_SUCCESS;
}

/* Everything queued on the device: simgpu has one device for all contexts. */
DRV_API CUresult cuCtxSynchronize(void)
{
	CUresult r = drv_ctx_check(NULL);

	if (r != CUDA_SUCCESS)
		return r;
	return drv_err(simgpu_drv_sync_all());
}
