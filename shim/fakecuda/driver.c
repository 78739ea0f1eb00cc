/*
 * driver.c - the fake driver's initialisation, device, context and error
 * calls, cuGetExportTable, and cuGetProcAddress[_v2].
 *
 * cuGetProcAddress behaves like the real one as far as interception
 * cares: the name is the base name ("cuMemAlloc"), the requested CUDA
 * version picks the versioned entry point (cuMemAlloc_v2 for >= 3020,
 * cuGetProcAddress_v2 for >= 12000), CU_GET_PROC_ADDRESS_PER_THREAD_-
 * DEFAULT_STREAM picks the _ptsz/_ptds variant where there is one, and an
 * unknown name is CUDA_ERROR_NOT_FOUND with CU_GET_PROC_ADDRESS_SYMBOL_-
 * NOT_FOUND.
 */
#include <stdio.h>
#include <string.h>

#include "fakecuda.h"

#undef cuGetProcAddress

int fc_initialized;

static struct { int dummy; } the_ctx;
static __thread CUcontext current;

FC_API CUresult cuInit(unsigned int flags)
{
	if (flags != 0)
		return CUDA_ERROR_INVALID_VALUE;
	fc_initialized = 1;
	return CUDA_SUCCESS;
}

FC_API CUresult cuDriverGetVersion(int *driverVersion)
{
	if (!driverVersion)
		return CUDA_ERROR_INVALID_VALUE;
	*driverVersion = 13000;
	return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetCount(int *count)
{
	if (!fc_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	*count = 1;
	return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
	if (!fc_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (ordinal != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*device = 0;
	return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
	if (!fc_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!name || len <= 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	snprintf(name, (size_t)len, "fakecuda device");
	return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
	if (!fc_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!bytes)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*bytes = 80ULL << 30;
	return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
	if (!fc_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!pi)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	switch (attrib) {
	case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:      *pi = 1024; break;
	case CU_DEVICE_ATTRIBUTE_WARP_SIZE:                  *pi = 32; break;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:       *pi = 132; break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:   *pi = 9; break;
	case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:   *pi = 0; break;
	case CU_DEVICE_ATTRIBUTE_MPS_ENABLED:                *pi = 0; break;
	case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:         *pi = 1; break;
	default:
		if ((int)attrib <= 0 || (int)attrib >= (int)CU_DEVICE_ATTRIBUTE_MAX)
			return CUDA_ERROR_INVALID_VALUE;
		*pi = 0;
		break;
	}
	return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- contexts */

static CUresult make_current(CUcontext *pctx, CUdevice dev)
{
	if (!fc_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	*pctx = (CUcontext)(void *)&the_ctx;
	return CUDA_SUCCESS;
}

FC_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
	return make_current(pctx, dev);
}

FC_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
	return dev == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

static CUresult create(CUcontext *pctx, CUdevice dev)
{
	CUresult rc = make_current(pctx, dev);

	if (rc == CUDA_SUCCESS)
		current = *pctx;
	return rc;
}

FC_API CUresult cuCtxCreate(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags,
			    CUdevice dev)
{
	(void)params, (void)flags;
	return create(pctx, dev);
}

/* The CUDA 3.2 - 12.x signature, still what cuGetProcAddress hands out
 * for older versions. */
FC_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
FC_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
	(void)flags;
	return create(pctx, dev);
}

FC_API CUresult cuCtxDestroy(CUcontext ctx)
{
	if (ctx != (CUcontext)(void *)&the_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	if (current == ctx)
		current = NULL;
	return CUDA_SUCCESS;
}

FC_API CUresult cuCtxSetCurrent(CUcontext ctx)
{
	if (!fc_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (ctx && ctx != (CUcontext)(void *)&the_ctx)
		return CUDA_ERROR_INVALID_CONTEXT;
	current = ctx;
	return CUDA_SUCCESS;
}

FC_API CUresult cuCtxGetCurrent(CUcontext *pctx)
{
	if (!fc_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!pctx)
		return CUDA_ERROR_INVALID_VALUE;
	*pctx = current;
	return CUDA_SUCCESS;
}

FC_API CUresult cuCtxGetDevice(CUdevice *device)
{
	if (!fc_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!device)
		return CUDA_ERROR_INVALID_VALUE;
	if (!current)
		return CUDA_ERROR_INVALID_CONTEXT;
	*device = 0;
	return CUDA_SUCCESS;
}

FC_API CUresult cuCtxSynchronize(void)
{
	return fc_initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

/* ---------------------------------------------------------------- errors */

static const struct {
	CUresult    code;
	const char *name, *text;
} errs[] = {
	{ CUDA_SUCCESS, "CUDA_SUCCESS", "no error" },
	{ CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument" },
	{ CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory" },
	{ CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error" },
	{ CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal" },
	{ CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid" },
	{ CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context" },
	{ CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle" },
	{ CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found" },
	{ CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
	  "an illegal memory access was encountered" },
	{ CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported" },
	{ CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error" },
};

FC_API CUresult cuGetErrorString(CUresult error, const char **pStr)
{
	size_t i;

	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	for (i = 0; i < sizeof(errs) / sizeof(errs[0]); i++)
		if (errs[i].code == error) {
			*pStr = errs[i].text;
			return CUDA_SUCCESS;
		}
	*pStr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

FC_API CUresult cuGetErrorName(CUresult error, const char **pStr)
{
	size_t i;

	if (!pStr)
		return CUDA_ERROR_INVALID_VALUE;
	for (i = 0; i < sizeof(errs) / sizeof(errs[0]); i++)
		if (errs[i].code == error) {
			*pStr = errs[i].name;
			return CUDA_SUCCESS;
		}
	*pStr = NULL;
	return CUDA_ERROR_INVALID_VALUE;
}

/* ---------------------------------------------------------------- export table */

/* Real cudart asks for private tables by UUID; a hook must pass the call
 * through untouched.  Any UUID gets this table: its first word is its
 * size, as in the real ones, and its entries are harmless. */
static CUresult dummy_entry(void)
{
	return CUDA_ERROR_NOT_SUPPORTED;
}

static const struct {
	size_t size;
	CUresult (*fn[4])(void);
} export_table = { sizeof(export_table), { dummy_entry, dummy_entry, dummy_entry, dummy_entry } };

FC_API CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
	if (!ppExportTable || !pExportTableId)
		return CUDA_ERROR_INVALID_VALUE;
	*ppExportTable = &export_table;
	return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- proc address */

FC_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
				 cuuint64_t flags);
FC_API CUresult cuGetProcAddress_v2_ptsz(const char *symbol, void **pfn, int cudaVersion,
					 cuuint64_t flags,
					 CUdriverProcAddressQueryResult *symbolStatus);

/* Prototypes the header only gives under other macro settings. */
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n);
CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n);
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
			     unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned,
					unsigned, unsigned, unsigned, CUstream, void **);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
CUresult cuLaunchHostFunc_ptsz(CUstream, CUhostFn, void *);

#define FN(f) ((void *)(f))

/* name, first CUDA version of this entry point, it, its per-thread variant */
static const struct proc {
	const char *name;
	int         since;
	void       *fn;
	void       *ptds;
} procs[] = {
	{ "cuInit", 2000, FN(cuInit), NULL },
	{ "cuDriverGetVersion", 2020, FN(cuDriverGetVersion), NULL },
	{ "cuDeviceGetCount", 2000, FN(cuDeviceGetCount), NULL },
	{ "cuDeviceGet", 2000, FN(cuDeviceGet), NULL },
	{ "cuDeviceGetName", 2000, FN(cuDeviceGetName), NULL },
	{ "cuDeviceTotalMem", 3020, FN(cuDeviceTotalMem), NULL },
	{ "cuDeviceGetAttribute", 2000, FN(cuDeviceGetAttribute), NULL },
	{ "cuDevicePrimaryCtxRetain", 7000, FN(cuDevicePrimaryCtxRetain), NULL },
	{ "cuDevicePrimaryCtxRelease", 11000, FN(cuDevicePrimaryCtxRelease), NULL },
	{ "cuCtxCreate", 3020, FN(cuCtxCreate_v2), NULL },
	{ "cuCtxCreate", 12050, FN(cuCtxCreate), NULL },
	{ "cuCtxDestroy", 4000, FN(cuCtxDestroy), NULL },
	{ "cuCtxSetCurrent", 4000, FN(cuCtxSetCurrent), NULL },
	{ "cuCtxGetCurrent", 4000, FN(cuCtxGetCurrent), NULL },
	{ "cuCtxGetDevice", 2000, FN(cuCtxGetDevice), NULL },
	{ "cuCtxSynchronize", 2000, FN(cuCtxSynchronize), NULL },
	{ "cuModuleLoadData", 2000, FN(cuModuleLoadData), NULL },
	{ "cuModuleLoadDataEx", 2010, FN(cuModuleLoadDataEx), NULL },
	{ "cuModuleLoadFatBinary", 2000, FN(cuModuleLoadFatBinary), NULL },
	{ "cuModuleGetFunction", 2000, FN(cuModuleGetFunction), NULL },
	{ "cuModuleUnload", 2000, FN(cuModuleUnload), NULL },
	{ "cuLibraryLoadData", 12000, FN(cuLibraryLoadData), NULL },
	{ "cuLibraryGetKernel", 12000, FN(cuLibraryGetKernel), NULL },
	{ "cuLibraryUnload", 12000, FN(cuLibraryUnload), NULL },
	{ "cuKernelGetFunction", 12000, FN(cuKernelGetFunction), NULL },
	{ "cuFuncGetName", 12030, FN(cuFuncGetName), NULL },
	{ "cuLaunchKernel", 4000, FN(cuLaunchKernel), FN(cuLaunchKernel_ptsz) },
	{ "cuLaunchKernelEx", 11060, FN(cuLaunchKernelEx), FN(cuLaunchKernelEx_ptsz) },
	{ "cuLaunchCooperativeKernel", 9000, FN(cuLaunchCooperativeKernel),
	  FN(cuLaunchCooperativeKernel_ptsz) },
	{ "cuGraphLaunch", 10000, FN(cuGraphLaunch), FN(cuGraphLaunch_ptsz) },
	{ "cuLaunchHostFunc", 10000, FN(cuLaunchHostFunc), FN(cuLaunchHostFunc_ptsz) },
	{ "cuMemAlloc", 3020, FN(cuMemAlloc), NULL },
	{ "cuMemFree", 3020, FN(cuMemFree), NULL },
	{ "cuMemcpyHtoD", 3020, FN(cuMemcpyHtoD), FN(cuMemcpyHtoD_v2_ptds) },
	{ "cuMemcpyDtoH", 3020, FN(cuMemcpyDtoH), FN(cuMemcpyDtoH_v2_ptds) },
	{ "cuGetErrorString", 6000, FN(cuGetErrorString), NULL },
	{ "cuGetErrorName", 6000, FN(cuGetErrorName), NULL },
	{ "cuGetExportTable", 3000, FN(cuGetExportTable), NULL },
	{ "cuGetProcAddress", 11030, FN(cuGetProcAddress), NULL },
	{ "cuGetProcAddress", 12000, FN(cuGetProcAddress_v2), FN(cuGetProcAddress_v2_ptsz) },
};

static CUresult lookup(const char *symbol, void **pfn, int version, cuuint64_t flags,
		       CUdriverProcAddressQueryResult *status)
{
	const struct proc *best = NULL;
	int known = 0;
	size_t i;

	if (status)
		*status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	if (!symbol || !pfn ||
	    (flags & ~(cuuint64_t)(CU_GET_PROC_ADDRESS_LEGACY_STREAM |
				   CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)))
		return CUDA_ERROR_INVALID_VALUE;
	*pfn = NULL;
	for (i = 0; i < sizeof(procs) / sizeof(procs[0]); i++) {
		if (strcmp(procs[i].name, symbol) != 0)
			continue;
		known = 1;
		if (procs[i].since <= version && (!best || procs[i].since > best->since))
			best = &procs[i];
	}
	if (!best) {
		if (known && status)
			*status = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
		return CUDA_ERROR_NOT_FOUND;
	}
	*pfn = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) && best->ptds ? best->ptds
										     : best->fn;
	if (status)
		*status = CU_GET_PROC_ADDRESS_SUCCESS;
	return CUDA_SUCCESS;
}

FC_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
				    cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
	return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/* What a --default-stream per-thread build calls: the default is per-thread. */
FC_API CUresult cuGetProcAddress_v2_ptsz(const char *symbol, void **pfn, int cudaVersion,
					 cuuint64_t flags,
					 CUdriverProcAddressQueryResult *symbolStatus)
{
	if (flags == CU_GET_PROC_ADDRESS_DEFAULT)
		flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
	return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/* CUDA 11.3 - 11.8: no status out-parameter. */
FC_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
				 cuuint64_t flags)
{
	return lookup(symbol, pfn, cudaVersion, flags, NULL);
}
