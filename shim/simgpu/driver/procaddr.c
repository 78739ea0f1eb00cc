/*
 * procaddr.c - cuGetProcAddress[_v2] (and its _ptsz), cuGetExportTable,
 * and the VMM calls.
 *
 * cuGetProcAddress behaves as the driver's, as far as a caller can tell:
 * the symbol is the base name ("cuMemAlloc"); the requested CUDA version
 * picks the entry point of that version (cuMemAlloc_v2 from 3020,
 * cuGetProcAddress_v2 from 12000, ...), and a name known only in newer
 * versions is CUDA_ERROR_NOT_FOUND with CU_GET_PROC_ADDRESS_VERSION_NOT_-
 * SUFFICIENT; CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM picks the
 * _ptds/_ptsz variant where there is one; an unknown name is
 * CUDA_ERROR_NOT_FOUND with CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND.  The
 * table lists what this library implements; simgpu's libcudart hands it
 * out through cudaGetDriverEntryPoint[ByVersion] (init.c attaches it).
 *
 * cuGetExportTable answers CUDA_ERROR_NOT_SUPPORTED: the private tables a
 * real libcudart needs do not exist here (simgpu's runtime replaces it).
 *
 * The VMM calls (cuMemCreate, cuMemMap, ...) are simgpu's emulation in
 * libcudart (vmm.c), exported here under their driver names.
 */
#include <string.h>

#include "drv.h"

#undef cuGetProcAddress

/* ---------------------------------------------------------------- VMM */

#define VMM(name, params, args)                                                   \
	DRV_API CUresult name params                                             \
	{                                                                         \
		static __typeof__(&name) fn;                                      \
		if (!fn)                                                          \
			fn = (__typeof__(fn))simgpu_drv_vmm_entry(#name);         \
		if (!fn)                                                          \
			return CUDA_ERROR_NOT_SUPPORTED;                          \
		if (!atomic_load(&drv_initialized))                               \
			return CUDA_ERROR_NOT_INITIALIZED;                        \
		return fn args;                                                   \
	}

VMM(cuMemGetAllocationGranularity,
    (size_t *g, const CUmemAllocationProp *p, CUmemAllocationGranularity_flags o), (g, p, o))
VMM(cuMemCreate,
    (CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *p,
     unsigned long long f), (h, n, p, f))
VMM(cuMemRelease, (CUmemGenericAllocationHandle h), (h))
VMM(cuMemAddressReserve,
    (CUdeviceptr *p, size_t n, size_t a, CUdeviceptr addr, unsigned long long f),
    (p, n, a, addr, f))
VMM(cuMemAddressFree, (CUdeviceptr p, size_t n), (p, n))
VMM(cuMemMap,
    (CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h, unsigned long long f),
    (p, n, off, h, f))
VMM(cuMemUnmap, (CUdeviceptr p, size_t n), (p, n))
VMM(cuMemSetAccess, (CUdeviceptr p, size_t n, const CUmemAccessDesc *d, size_t c), (p, n, d, c))
VMM(cuMemExportToShareableHandle,
    (void *out, CUmemGenericAllocationHandle h, CUmemAllocationHandleType t, unsigned long long f),
    (out, h, t, f))
VMM(cuMemImportFromShareableHandle,
    (CUmemGenericAllocationHandle *h, void *os, CUmemAllocationHandleType t), (h, os, t))

/* ---------------------------------------------------------------- export table */

DRV_API CUresult cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)
{
	if (!ppExportTable || !pExportTableId)
		return CUDA_ERROR_INVALID_VALUE;
	*ppExportTable = NULL;
	return CUDA_ERROR_NOT_SUPPORTED;
}

/* ---------------------------------------------------------------- the table */

/* Entry points defined elsewhere under names cuda.h does not declare
 * (or declares under other macro settings). */
#undef cuEventElapsedTime
#undef cuDeviceGetUuid
#define DECL(name) void name(void)
DECL(cuCtxCreate_v2);
DECL(cuDeviceGetUuid);
DECL(cuEventElapsedTime);
DECL(cuLaunchKernel_ptsz);
DECL(cuLaunchKernelEx_ptsz);
DECL(cuLaunchCooperativeKernel_ptsz);
DECL(cuLaunchHostFunc_ptsz);
DECL(cuGraphLaunch_ptsz);
DECL(cuMemcpy_ptds);
DECL(cuMemcpyAsync_ptsz);
DECL(cuMemcpyHtoD_v2_ptds);
DECL(cuMemcpyDtoH_v2_ptds);
DECL(cuMemcpyDtoD_v2_ptds);
DECL(cuMemcpyHtoDAsync_v2_ptsz);
DECL(cuMemcpyDtoHAsync_v2_ptsz);
DECL(cuMemcpyDtoDAsync_v2_ptsz);
DECL(cuMemsetD8_v2_ptds);
DECL(cuMemsetD16_v2_ptds);
DECL(cuMemsetD32_v2_ptds);
DECL(cuMemsetD8Async_ptsz);
DECL(cuMemsetD16Async_ptsz);
DECL(cuMemsetD32Async_ptsz);
DECL(cuStreamSynchronize_ptsz);
DECL(cuStreamQuery_ptsz);
DECL(cuStreamWaitEvent_ptsz);
DECL(cuStreamGetFlags_ptsz);
DECL(cuStreamIsCapturing_ptsz);
DECL(cuMemAllocAsync_ptsz);
DECL(cuMemFreeAsync_ptsz);
DECL(cuEventRecord_ptsz);
DRV_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
				  cuuint64_t flags);
DRV_API CUresult cuGetProcAddress_v2_ptsz(const char *symbol, void **pfn, int cudaVersion,
					  cuuint64_t flags,
					  CUdriverProcAddressQueryResult *symbolStatus);

#define FN(f) ((void *)(f))

/* deprecated, still handed out */
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

/* name, first CUDA version of this entry point, it, its per-thread variant */
static const struct proc {
	const char *name;
	int         since;
	void       *fn;
	void       *ptds;
} procs[] = {
	{ "cuInit", 2000, FN(cuInit), NULL },
	{ "cuDriverGetVersion", 2020, FN(cuDriverGetVersion), NULL },
	{ "cuGetErrorString", 6000, FN(cuGetErrorString), NULL },
	{ "cuGetErrorName", 6000, FN(cuGetErrorName), NULL },
	{ "cuGetExportTable", 3000, FN(cuGetExportTable), NULL },
	{ "cuGetProcAddress", 11030, FN(cuGetProcAddress), NULL },
	{ "cuGetProcAddress", 12000, FN(cuGetProcAddress_v2), FN(cuGetProcAddress_v2_ptsz) },
	/* device */
	{ "cuDeviceGet", 2000, FN(cuDeviceGet), NULL },
	{ "cuDeviceGetCount", 2000, FN(cuDeviceGetCount), NULL },
	{ "cuDeviceGetName", 2000, FN(cuDeviceGetName), NULL },
	{ "cuDeviceGetUuid", 9020, FN(cuDeviceGetUuid), NULL },
	{ "cuDeviceGetUuid", 11040, FN(cuDeviceGetUuid_v2), NULL },
	{ "cuDeviceTotalMem", 3020, FN(cuDeviceTotalMem_v2), NULL },
	{ "cuDeviceGetAttribute", 2000, FN(cuDeviceGetAttribute), NULL },
	{ "cuDeviceComputeCapability", 2000, FN(cuDeviceComputeCapability), NULL },
	/* contexts */
	{ "cuDevicePrimaryCtxRetain", 7000, FN(cuDevicePrimaryCtxRetain), NULL },
	{ "cuDevicePrimaryCtxRelease", 11000, FN(cuDevicePrimaryCtxRelease_v2), NULL },
	{ "cuDevicePrimaryCtxSetFlags", 11000, FN(cuDevicePrimaryCtxSetFlags_v2), NULL },
	{ "cuDevicePrimaryCtxReset", 11000, FN(cuDevicePrimaryCtxReset_v2), NULL },
	{ "cuDevicePrimaryCtxGetState", 7000, FN(cuDevicePrimaryCtxGetState), NULL },
	{ "cuCtxCreate", 3020, FN(cuCtxCreate_v2), NULL },
	{ "cuCtxCreate", 12050, FN(cuCtxCreate_v4), NULL },
	{ "cuCtxDestroy", 4000, FN(cuCtxDestroy_v2), NULL },
	{ "cuCtxPushCurrent", 4000, FN(cuCtxPushCurrent_v2), NULL },
	{ "cuCtxPopCurrent", 4000, FN(cuCtxPopCurrent_v2), NULL },
	{ "cuCtxSetCurrent", 4000, FN(cuCtxSetCurrent), NULL },
	{ "cuCtxGetCurrent", 4000, FN(cuCtxGetCurrent), NULL },
	{ "cuCtxGetDevice", 2000, FN(cuCtxGetDevice), NULL },
	{ "cuCtxGetFlags", 7000, FN(cuCtxGetFlags), NULL },
	{ "cuCtxGetApiVersion", 3020, FN(cuCtxGetApiVersion), NULL },
	{ "cuCtxSynchronize", 2000, FN(cuCtxSynchronize), NULL },
	/* modules, libraries, functions */
	{ "cuModuleLoad", 2000, FN(cuModuleLoad), NULL },
	{ "cuModuleLoadData", 2000, FN(cuModuleLoadData), NULL },
	{ "cuModuleLoadDataEx", 2010, FN(cuModuleLoadDataEx), NULL },
	{ "cuModuleLoadFatBinary", 2000, FN(cuModuleLoadFatBinary), NULL },
	{ "cuModuleUnload", 2000, FN(cuModuleUnload), NULL },
	{ "cuModuleGetFunction", 2000, FN(cuModuleGetFunction), NULL },
	{ "cuModuleGetFunctionCount", 12040, FN(cuModuleGetFunctionCount), NULL },
	{ "cuModuleEnumerateFunctions", 12040, FN(cuModuleEnumerateFunctions), NULL },
	{ "cuModuleGetGlobal", 3020, FN(cuModuleGetGlobal_v2), NULL },
	{ "cuLibraryLoadData", 12000, FN(cuLibraryLoadData), NULL },
	{ "cuLibraryLoadFromFile", 12000, FN(cuLibraryLoadFromFile), NULL },
	{ "cuLibraryUnload", 12000, FN(cuLibraryUnload), NULL },
	{ "cuLibraryGetKernel", 12000, FN(cuLibraryGetKernel), NULL },
	{ "cuLibraryGetKernelCount", 12040, FN(cuLibraryGetKernelCount), NULL },
	{ "cuLibraryGetGlobal", 12000, FN(cuLibraryGetGlobal), NULL },
	{ "cuKernelGetFunction", 12000, FN(cuKernelGetFunction), NULL },
	{ "cuKernelGetName", 12030, FN(cuKernelGetName), NULL },
	{ "cuKernelGetParamInfo", 12040, FN(cuKernelGetParamInfo), NULL },
	{ "cuFuncGetName", 12030, FN(cuFuncGetName), NULL },
	{ "cuFuncGetParamInfo", 12040, FN(cuFuncGetParamInfo), NULL },
	{ "cuFuncGetAttribute", 2020, FN(cuFuncGetAttribute), NULL },
	{ "cuFuncSetAttribute", 9000, FN(cuFuncSetAttribute), NULL },
	{ "cuFuncSetCacheConfig", 3000, FN(cuFuncSetCacheConfig), NULL },
	/* launches */
	{ "cuLaunchKernel", 4000, FN(cuLaunchKernel), FN(cuLaunchKernel_ptsz) },
	{ "cuLaunchKernelEx", 11060, FN(cuLaunchKernelEx), FN(cuLaunchKernelEx_ptsz) },
	{ "cuLaunchCooperativeKernel", 9000, FN(cuLaunchCooperativeKernel),
	  FN(cuLaunchCooperativeKernel_ptsz) },
	{ "cuLaunchHostFunc", 10000, FN(cuLaunchHostFunc), FN(cuLaunchHostFunc_ptsz) },
	{ "cuGraphLaunch", 10000, FN(cuGraphLaunch), FN(cuGraphLaunch_ptsz) },
	/* memory */
	{ "cuMemAlloc", 3020, FN(cuMemAlloc_v2), NULL },
	{ "cuMemFree", 3020, FN(cuMemFree_v2), NULL },
	{ "cuMemGetInfo", 3020, FN(cuMemGetInfo_v2), NULL },
	{ "cuMemGetAddressRange", 3020, FN(cuMemGetAddressRange_v2), NULL },
	{ "cuMemAllocHost", 3020, FN(cuMemAllocHost_v2), NULL },
	{ "cuMemHostAlloc", 2020, FN(cuMemHostAlloc), NULL },
	{ "cuMemFreeHost", 2000, FN(cuMemFreeHost), NULL },
	{ "cuMemAllocAsync", 11020, FN(cuMemAllocAsync), FN(cuMemAllocAsync_ptsz) },
	{ "cuMemFreeAsync", 11020, FN(cuMemFreeAsync), FN(cuMemFreeAsync_ptsz) },
	{ "cuMemcpy", 4000, FN(cuMemcpy), FN(cuMemcpy_ptds) },
	{ "cuMemcpyAsync", 4000, FN(cuMemcpyAsync), FN(cuMemcpyAsync_ptsz) },
	{ "cuMemcpyHtoD", 3020, FN(cuMemcpyHtoD_v2), FN(cuMemcpyHtoD_v2_ptds) },
	{ "cuMemcpyDtoH", 3020, FN(cuMemcpyDtoH_v2), FN(cuMemcpyDtoH_v2_ptds) },
	{ "cuMemcpyDtoD", 3020, FN(cuMemcpyDtoD_v2), FN(cuMemcpyDtoD_v2_ptds) },
	{ "cuMemcpyHtoDAsync", 3020, FN(cuMemcpyHtoDAsync_v2), FN(cuMemcpyHtoDAsync_v2_ptsz) },
	{ "cuMemcpyDtoHAsync", 3020, FN(cuMemcpyDtoHAsync_v2), FN(cuMemcpyDtoHAsync_v2_ptsz) },
	{ "cuMemcpyDtoDAsync", 3020, FN(cuMemcpyDtoDAsync_v2), FN(cuMemcpyDtoDAsync_v2_ptsz) },
	{ "cuMemsetD8", 3020, FN(cuMemsetD8_v2), FN(cuMemsetD8_v2_ptds) },
	{ "cuMemsetD16", 3020, FN(cuMemsetD16_v2), FN(cuMemsetD16_v2_ptds) },
	{ "cuMemsetD32", 3020, FN(cuMemsetD32_v2), FN(cuMemsetD32_v2_ptds) },
	{ "cuMemsetD8Async", 3020, FN(cuMemsetD8Async), FN(cuMemsetD8Async_ptsz) },
	{ "cuMemsetD16Async", 3020, FN(cuMemsetD16Async), FN(cuMemsetD16Async_ptsz) },
	{ "cuMemsetD32Async", 3020, FN(cuMemsetD32Async), FN(cuMemsetD32Async_ptsz) },
	/* VMM (libcudart's vmm.c) */
	{ "cuMemGetAllocationGranularity", 10020, FN(cuMemGetAllocationGranularity), NULL },
	{ "cuMemCreate", 10020, FN(cuMemCreate), NULL },
	{ "cuMemRelease", 10020, FN(cuMemRelease), NULL },
	{ "cuMemAddressReserve", 10020, FN(cuMemAddressReserve), NULL },
	{ "cuMemAddressFree", 10020, FN(cuMemAddressFree), NULL },
	{ "cuMemMap", 10020, FN(cuMemMap), NULL },
	{ "cuMemUnmap", 10020, FN(cuMemUnmap), NULL },
	{ "cuMemSetAccess", 10020, FN(cuMemSetAccess), NULL },
	{ "cuMemExportToShareableHandle", 10020, FN(cuMemExportToShareableHandle), NULL },
	{ "cuMemImportFromShareableHandle", 10020, FN(cuMemImportFromShareableHandle), NULL },
	/* streams, events */
	{ "cuStreamCreate", 2000, FN(cuStreamCreate), NULL },
	{ "cuStreamCreateWithPriority", 5050, FN(cuStreamCreateWithPriority), NULL },
	{ "cuStreamDestroy", 4000, FN(cuStreamDestroy_v2), NULL },
	{ "cuStreamSynchronize", 2000, FN(cuStreamSynchronize), FN(cuStreamSynchronize_ptsz) },
	{ "cuStreamQuery", 2000, FN(cuStreamQuery), FN(cuStreamQuery_ptsz) },
	{ "cuStreamWaitEvent", 3020, FN(cuStreamWaitEvent), FN(cuStreamWaitEvent_ptsz) },
	{ "cuStreamGetFlags", 5050, FN(cuStreamGetFlags), FN(cuStreamGetFlags_ptsz) },
	{ "cuStreamIsCapturing", 10000, FN(cuStreamIsCapturing), FN(cuStreamIsCapturing_ptsz) },
	{ "cuEventCreate", 2000, FN(cuEventCreate), NULL },
	{ "cuEventDestroy", 4000, FN(cuEventDestroy_v2), NULL },
	{ "cuEventRecord", 2000, FN(cuEventRecord), FN(cuEventRecord_ptsz) },
	{ "cuEventSynchronize", 2000, FN(cuEventSynchronize), NULL },
	{ "cuEventQuery", 2000, FN(cuEventQuery), NULL },
	{ "cuEventElapsedTime", 2000, FN(cuEventElapsedTime), NULL },
	{ "cuEventElapsedTime", 12080, FN(cuEventElapsedTime_v2), NULL },
	/* green contexts (green.c) */
	{ "cuDeviceGetDevResource", 12040, FN(cuDeviceGetDevResource), NULL },
	{ "cuCtxGetDevResource", 12040, FN(cuCtxGetDevResource), NULL },
	{ "cuGreenCtxGetDevResource", 12040, FN(cuGreenCtxGetDevResource), NULL },
	{ "cuDevSmResourceSplitByCount", 12040, FN(cuDevSmResourceSplitByCount), NULL },
	{ "cuDevResourceGenerateDesc", 12040, FN(cuDevResourceGenerateDesc), NULL },
	{ "cuGreenCtxCreate", 12040, FN(cuGreenCtxCreate), NULL },
	{ "cuGreenCtxDestroy", 12040, FN(cuGreenCtxDestroy), NULL },
	{ "cuCtxFromGreenCtx", 12040, FN(cuCtxFromGreenCtx), NULL },
	{ "cuGreenCtxRecordEvent", 12040, FN(cuGreenCtxRecordEvent), NULL },
	{ "cuGreenCtxWaitEvent", 12040, FN(cuGreenCtxWaitEvent), NULL },
	{ "cuStreamGetGreenCtx", 12040, FN(cuStreamGetGreenCtx), NULL },
	{ "cuGreenCtxStreamCreate", 12050, FN(cuGreenCtxStreamCreate), NULL },
	{ "cuGreenCtxGetId", 12090, FN(cuGreenCtxGetId), NULL },
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

/* CUDA 12+ (cuda.h's cuGetProcAddress): what cudart itself calls. */
DRV_API CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
				     cuuint64_t flags, CUdriverProcAddressQueryResult *symbolStatus)
{
	return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/* A --default-stream per-thread build's: the default is per-thread. */
DRV_API CUresult cuGetProcAddress_v2_ptsz(const char *symbol, void **pfn, int cudaVersion,
					  cuuint64_t flags,
					  CUdriverProcAddressQueryResult *symbolStatus);
DRV_API CUresult cuGetProcAddress_v2_ptsz(const char *symbol, void **pfn, int cudaVersion,
					  cuuint64_t flags,
					  CUdriverProcAddressQueryResult *symbolStatus)
{
	if (flags == CU_GET_PROC_ADDRESS_DEFAULT)
		flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
	return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/* CUDA 11.3 - 11.8: no status out-parameter. */
DRV_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
				  cuuint64_t flags);
DRV_API CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
				  cuuint64_t flags)
{
	return lookup(symbol, pfn, cudaVersion, flags, NULL);
}

/* For simgpu's cudaGetDriverEntryPoint (init.c attaches it). */
int drv_getproc_for_runtime(const char *symbol, void **pfn, int version,
			    unsigned long long flags, int *status);
int drv_getproc_for_runtime(const char *symbol, void **pfn, int version,
			    unsigned long long flags, int *status)
{
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	CUresult r = lookup(symbol, pfn, version, flags, &st);

	if (status)
		*status = (int)st;
	return (int)r;
}
