/*
 * device.c - the one simulated device: properties and attributes (from the
 * device model's parameters, H100-like otherwise), versions, device
 * selection, device-wide synchronisation and reset, and the small calls
 * programs make at start-up.
 *
 * Exported extra:
 *   int simgpu_quota_pct(void)   the SM quota (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
 *                                as read at start-up, rounded; 100 if unset)
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "simgpu_impl.h"
#include "graph.h"

static __thread int cur_device;
static unsigned device_flags;

SG_API int simgpu_quota_pct(void)
{
	sg_init();
	return (int)lround(sg_cfg.quota_pct);
}

SG_API cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
	if (!runtimeVersion)
		return sg_err(cudaErrorInvalidValue);
	*runtimeVersion = 13000;
	return cudaSuccess;
}

SG_API cudaError_t cudaDriverGetVersion(int *driverVersion)
{
	if (!driverVersion)
		return sg_err(cudaErrorInvalidValue);
	*driverVersion = 13000;
	return cudaSuccess;
}

SG_API cudaError_t cudaGetDeviceCount(int *count)
{
	sg_init();
	if (!count)
		return sg_err(cudaErrorInvalidValue);
	*count = 1;
	return cudaSuccess;
}

SG_API cudaError_t cudaSetDevice(int device)
{
	sg_init();
	if (device != 0)
		return sg_err(cudaErrorInvalidDevice);
	cur_device = device;
	return cudaSuccess;
}

SG_API cudaError_t cudaInitDevice(int device, unsigned int deviceFlags, unsigned int flags)
{
	(void)deviceFlags, (void)flags;
	return cudaSetDevice(device);
}

SG_API cudaError_t cudaGetDevice(int *device)
{
	sg_init();
	if (!device)
		return sg_err(cudaErrorInvalidValue);
	*device = cur_device;
	return cudaSuccess;
}

SG_API cudaError_t cudaSetDeviceFlags(unsigned int flags)
{
	sg_init();
	device_flags = flags;
	return cudaSuccess;
}

SG_API cudaError_t cudaGetDeviceFlags(unsigned int *flags)
{
	sg_init();
	if (!flags)
		return sg_err(cudaErrorInvalidValue);
	*flags = device_flags;
	return cudaSuccess;
}

SG_API cudaError_t cudaChooseDevice(int *device, const struct cudaDeviceProp *prop)
{
	(void)prop;
	if (!device)
		return sg_err(cudaErrorInvalidValue);
	*device = 0;
	return cudaSuccess;
}

SG_API cudaError_t cudaDeviceSynchronize(void)
{
	cudaError_t e;

	sg_init();
	/* illegal while any stream captures: the captures are invalidated */
	if ((e = sg_capture_sync_all()) != cudaSuccess)
		return sg_err(e);
	sg_sync_all();
	return sg_sync_status();
}

SG_API cudaError_t cudaDeviceReset(void)
{
	sg_init();
	sg_sync_all();
	/* handles into the arena go before it: textures before arrays
	 * (sg_textures_reset), pools, managed-memory advice */
	sg_textures_reset();
	sg_pools_reset();
	sg_hints_reset();
	sg_arena_free_all();
	sg_kernels_reset();
	sg_errors_reset();
	return cudaSuccess;
}

SG_API cudaError_t cudaThreadSynchronize(void)
{
	return cudaDeviceSynchronize();
}

SG_API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
	const struct sg_config *c = &sg_cfg;

	sg_init();
	if (!prop)
		return sg_err(cudaErrorInvalidValue);
	if (device != 0)
		return sg_err(cudaErrorInvalidDevice);
	memset(prop, 0, sizeof(*prop));
	memcpy(prop->name, c->name, strnlen(c->name, sizeof(prop->name) - 1));
	memcpy(prop->uuid.bytes, "simgpu-device-00", 16);
	prop->totalGlobalMem = (size_t)c->mem_bytes;
	prop->sharedMemPerBlock = 48 * 1024;
	prop->regsPerBlock = 65536;
	prop->warpSize = 32;
	prop->memPitch = 2147483647;
	prop->maxThreadsPerBlock = 1024;
	prop->maxThreadsDim[0] = 1024;
	prop->maxThreadsDim[1] = 1024;
	prop->maxThreadsDim[2] = 64;
	prop->maxGridSize[0] = 2147483647;
	prop->maxGridSize[1] = 65535;
	prop->maxGridSize[2] = 65535;
	prop->totalConstMem = 65536;
	prop->major = 9;
	prop->minor = 0;
	prop->textureAlignment = 512;
	prop->texturePitchAlignment = 32;
	prop->multiProcessorCount = c->quota_sms;     /* as the attribute, below */
	prop->canMapHostMemory = 1;
	prop->maxTexture1D = 131072;
	prop->surfaceAlignment = 512;
	prop->concurrentKernels = 1;
	prop->ECCEnabled = 1;
	prop->pciBusID = 0x1b;
	prop->asyncEngineCount = 2;
	prop->unifiedAddressing = 1;
	prop->memoryBusWidth = 5120;
	prop->l2CacheSize = 50 * 1024 * 1024;
	prop->persistingL2CacheMaxSize = 32 * 1024 * 1024;
	prop->maxThreadsPerMultiProcessor = 2048;
	prop->streamPrioritiesSupported = 1;
	prop->globalL1CacheSupported = 1;
	prop->localL1CacheSupported = 1;
	prop->sharedMemPerMultiprocessor = 228 * 1024;
	prop->regsPerMultiprocessor = 65536;
	prop->managedMemory = 1;
	prop->hostNativeAtomicSupported = 0;
	prop->concurrentManagedAccess = 1;
	prop->computePreemptionSupported = 1;
	prop->cooperativeLaunch = 1;
	prop->sharedMemPerBlockOptin = 227 * 1024;
	prop->maxBlocksPerMultiProcessor = 32;
	prop->accessPolicyMaxWindowSize = 134213632;
	prop->reservedSharedMemPerBlock = 1024;
	prop->hostRegisterSupported = 1;
	prop->memoryPoolsSupported = 1;
	prop->clusterLaunch = 1;
	prop->deviceNumaId = -1;
	prop->hostNumaId = -1;
	prop->mpsEnabled = 0;
	return cudaSuccess;
}

/* Older headers map cudaGetDeviceProperties to _v2; CUDA 13 binaries do not. */
SG_API cudaError_t cudaGetDeviceProperties_v2(struct cudaDeviceProp *prop, int device)
{
	return cudaGetDeviceProperties(prop, device);
}

SG_API cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
	const struct sg_config *c = &sg_cfg;
	int v;

	sg_init();
	if (!value)
		return sg_err(cudaErrorInvalidValue);
	if (device != 0)
		return sg_err(cudaErrorInvalidDevice);
	switch (attr) {
	case cudaDevAttrMaxThreadsPerBlock:               v = 1024; break;
	case cudaDevAttrMaxBlockDimX:                     v = 1024; break;
	case cudaDevAttrMaxBlockDimY:                     v = 1024; break;
	case cudaDevAttrMaxBlockDimZ:                     v = 64; break;
	case cudaDevAttrMaxGridDimX:                      v = 2147483647; break;
	case cudaDevAttrMaxGridDimY:                      v = 65535; break;
	case cudaDevAttrMaxGridDimZ:                      v = 65535; break;
	case cudaDevAttrMaxSharedMemoryPerBlock:          v = 48 * 1024; break;
	case cudaDevAttrTotalConstantMemory:              v = 65536; break;
	case cudaDevAttrWarpSize:                         v = 32; break;
	case cudaDevAttrMaxPitch:                         v = 2147483647; break;
	case cudaDevAttrMaxRegistersPerBlock:             v = 65536; break;
	case cudaDevAttrClockRate:                        v = 1980000; break;
	case cudaDevAttrTextureAlignment:                 v = 512; break;
	case cudaDevAttrGpuOverlap:                       v = 1; break;
	/* Under MPS a client is told its own SMs, not the device's: the H100
	 * and H200 calibration runs (bench/calib/h100-2026-11-27.jsonl and h200-, sm_count)
	 * read 12, 26 ... 118 at 10, 20 ... 90 %, en_quota_sms's counts. */
	case cudaDevAttrMultiProcessorCount:              v = c->quota_sms; break;
	case cudaDevAttrIntegrated:                       v = 0; break;
	case cudaDevAttrCanMapHostMemory:                 v = 1; break;
	case cudaDevAttrComputeMode:                      v = 0; break;
	case cudaDevAttrConcurrentKernels:                v = 1; break;
	case cudaDevAttrEccEnabled:                       v = 1; break;
	case cudaDevAttrPciBusId:                         v = 0x1b; break;
	case cudaDevAttrMemoryClockRate:                  v = 2619000; break;
	case cudaDevAttrGlobalMemoryBusWidth:             v = 5120; break;
	case cudaDevAttrL2CacheSize:                      v = 50 * 1024 * 1024; break;
	case cudaDevAttrMaxThreadsPerMultiProcessor:      v = 2048; break;
	case cudaDevAttrAsyncEngineCount:                 v = 2; break;
	case cudaDevAttrUnifiedAddressing:                v = 1; break;
	case cudaDevAttrComputeCapabilityMajor:           v = 9; break;
	case cudaDevAttrComputeCapabilityMinor:           v = 0; break;
	case cudaDevAttrStreamPrioritiesSupported:        v = 1; break;
	case cudaDevAttrGlobalL1CacheSupported:           v = 1; break;
	case cudaDevAttrLocalL1CacheSupported:            v = 1; break;
	case cudaDevAttrMaxSharedMemoryPerMultiprocessor: v = 228 * 1024; break;
	case cudaDevAttrMaxRegistersPerMultiprocessor:    v = 65536; break;
	case cudaDevAttrManagedMemory:                    v = 1; break;
	case cudaDevAttrConcurrentManagedAccess:          v = 1; break;
	case cudaDevAttrComputePreemptionSupported:       v = 1; break;
	case cudaDevAttrCooperativeLaunch:                v = 1; break;
	case cudaDevAttrMaxSharedMemoryPerBlockOptin:     v = 227 * 1024; break;
	case cudaDevAttrHostRegisterSupported:            v = 1; break;
	case cudaDevAttrMaxBlocksPerMultiprocessor:       v = 32; break;
	case cudaDevAttrMaxPersistingL2CacheSize:         v = 32 * 1024 * 1024; break;
	case cudaDevAttrReservedSharedMemoryPerBlock:     v = 1024; break;
	case cudaDevAttrMemoryPoolsSupported:             v = 1; break;
	case cudaDevAttrClusterLaunch:                    v = 1; break;
	case cudaDevAttrNumaConfig:                       v = 0; break;
	case cudaDevAttrNumaId:                           v = -1; break;
	case cudaDevAttrHostNumaId:                       v = -1; break;
	/* 1 for an MPS client, as the calibration runs read under MPS (0
	 * without): simgpu's MPS is SIMGPU_MPS, on by default */
	case cudaDevAttrMpsEnabled:                       v = c->mp.mps ? 1 : 0; break;
	default:
		if ((int)attr <= 0 || (int)attr >= (int)cudaDevAttrMax)
			return sg_err(cudaErrorInvalidValue);
		v = 0;    /* a feature simgpu does not model */
		break;
	}
	*value = v;
	return cudaSuccess;
}

SG_API cudaError_t cudaDeviceGetLimit(size_t *pValue, enum cudaLimit limit)
{
	sg_init();
	if (!pValue)
		return sg_err(cudaErrorInvalidValue);
	switch (limit) {
	case cudaLimitStackSize:            *pValue = 1024; break;
	case cudaLimitPrintfFifoSize:       *pValue = 1 << 20; break;
	case cudaLimitMallocHeapSize:       *pValue = 8 << 20; break;
	case cudaLimitMaxL2FetchGranularity: *pValue = 64; break;
	default:                            *pValue = 0; break;
	}
	return cudaSuccess;
}

SG_API cudaError_t cudaDeviceSetLimit(enum cudaLimit limit, size_t value)
{
	(void)limit, (void)value;
	sg_init();
	return cudaSuccess;
}

SG_API cudaError_t cudaDeviceGetCacheConfig(enum cudaFuncCache *pCacheConfig)
{
	if (!pCacheConfig)
		return sg_err(cudaErrorInvalidValue);
	*pCacheConfig = cudaFuncCachePreferNone;
	return cudaSuccess;
}

SG_API cudaError_t cudaDeviceSetCacheConfig(enum cudaFuncCache cacheConfig)
{
	(void)cacheConfig;
	return cudaSuccess;
}

SG_API cudaError_t cudaDeviceCanAccessPeer(int *canAccessPeer, int device, int peerDevice)
{
	(void)device, (void)peerDevice;
	if (!canAccessPeer)
		return sg_err(cudaErrorInvalidValue);
	*canAccessPeer = 0;
	return cudaSuccess;
}

SG_API cudaError_t cudaDeviceGetPCIBusId(char *pciBusId, int len, int device)
{
	if (!pciBusId || len <= 0)
		return sg_err(cudaErrorInvalidValue);
	if (device != 0)
		return sg_err(cudaErrorInvalidDevice);
	snprintf(pciBusId, (size_t)len, "0000:1B:00.0");
	return cudaSuccess;
}

/* cudaStreamIsCapturing[_ptsz]: capture.c */

SG_API cudaError_t cudaProfilerStart(void)
{
	return cudaSuccess;
}

SG_API cudaError_t cudaProfilerStop(void)
{
	return cudaSuccess;
}
