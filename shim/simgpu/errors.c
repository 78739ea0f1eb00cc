/*
 * errors.c - CUDA error semantics: the per-thread last error, errors that
 * surface later from asynchronous work, sticky errors, names and strings.
 *
 * As in CUDA: every failing call records its error as the calling thread's
 * last error (cudaGetLastError returns and clears it, cudaPeekAtLastError
 * only returns it).  A fault inside a kernel's twin is a sticky error
 * (cudaErrorIllegalAddress): every later synchronising call and launch
 * returns it until cudaDeviceReset.  An asynchronous copy that failed is
 * reported once, by the next synchronising call.
 */
#include <stddef.h>

#include "simgpu_impl.h"

static __thread cudaError_t last_error;
static atomic_int sticky_error;
static atomic_int async_error;

cudaError_t sg_err(cudaError_t e)
{
	if (e != cudaSuccess)
		last_error = e;
	return e;
}

void sg_async_error(cudaError_t e, int sticky)
{
	int expected = cudaSuccess;

	if (sticky)
		atomic_compare_exchange_strong(&sticky_error, &expected, (int)e);
	else
		atomic_compare_exchange_strong(&async_error, &expected, (int)e);
}

cudaError_t sg_sticky(void)
{
	return (cudaError_t)atomic_load_explicit(&sticky_error, memory_order_relaxed);
}

cudaError_t sg_sync_status(void)
{
	cudaError_t e = sg_sticky();

	if (e != cudaSuccess)
		return sg_err(e);
	e = (cudaError_t)atomic_exchange(&async_error, cudaSuccess);
	return sg_err(e);
}

/* cudaDeviceReset clears everything. */
void sg_errors_reset(void)
{
	atomic_store(&sticky_error, cudaSuccess);
	atomic_store(&async_error, cudaSuccess);
	last_error = cudaSuccess;
}

SG_API cudaError_t cudaGetLastError(void)
{
	cudaError_t e = last_error;
	cudaError_t s = sg_sticky();

	last_error = cudaSuccess;
	if (e == cudaSuccess && s != cudaSuccess)
		return s;
	return e;
}

SG_API cudaError_t cudaPeekAtLastError(void)
{
	cudaError_t s = sg_sticky();

	if (last_error == cudaSuccess && s != cudaSuccess)
		return s;
	return last_error;
}

#define E(x) { x, #x }
static const struct {
	cudaError_t code;
	const char *name;
} names[] = {
	E(cudaSuccess),
	E(cudaErrorInvalidValue),
	E(cudaErrorMemoryAllocation),
	E(cudaErrorInitializationError),
	E(cudaErrorCudartUnloading),
	E(cudaErrorProfilerDisabled),
	E(cudaErrorProfilerNotInitialized),
	E(cudaErrorProfilerAlreadyStarted),
	E(cudaErrorProfilerAlreadyStopped),
	E(cudaErrorInvalidConfiguration),
	E(cudaErrorInvalidPitchValue),
	E(cudaErrorInvalidSymbol),
	E(cudaErrorInvalidHostPointer),
	E(cudaErrorInvalidDevicePointer),
	E(cudaErrorInvalidTexture),
	E(cudaErrorInvalidTextureBinding),
	E(cudaErrorInvalidChannelDescriptor),
	E(cudaErrorInvalidMemcpyDirection),
	E(cudaErrorAddressOfConstant),
	E(cudaErrorTextureFetchFailed),
	E(cudaErrorTextureNotBound),
	E(cudaErrorSynchronizationError),
	E(cudaErrorInvalidFilterSetting),
	E(cudaErrorInvalidNormSetting),
	E(cudaErrorMixedDeviceExecution),
	E(cudaErrorNotYetImplemented),
	E(cudaErrorMemoryValueTooLarge),
	E(cudaErrorStubLibrary),
	E(cudaErrorInsufficientDriver),
	E(cudaErrorCallRequiresNewerDriver),
	E(cudaErrorInvalidSurface),
	E(cudaErrorDuplicateVariableName),
	E(cudaErrorDuplicateTextureName),
	E(cudaErrorDuplicateSurfaceName),
	E(cudaErrorDevicesUnavailable),
	E(cudaErrorIncompatibleDriverContext),
	E(cudaErrorMissingConfiguration),
	E(cudaErrorPriorLaunchFailure),
	E(cudaErrorLaunchMaxDepthExceeded),
	E(cudaErrorLaunchFileScopedTex),
	E(cudaErrorLaunchFileScopedSurf),
	E(cudaErrorSyncDepthExceeded),
	E(cudaErrorLaunchPendingCountExceeded),
	E(cudaErrorInvalidDeviceFunction),
	E(cudaErrorNoDevice),
	E(cudaErrorInvalidDevice),
	E(cudaErrorDeviceNotLicensed),
	E(cudaErrorSoftwareValidityNotEstablished),
	E(cudaErrorStartupFailure),
	E(cudaErrorInvalidKernelImage),
	E(cudaErrorDeviceUninitialized),
	E(cudaErrorMapBufferObjectFailed),
	E(cudaErrorUnmapBufferObjectFailed),
	E(cudaErrorArrayIsMapped),
	E(cudaErrorAlreadyMapped),
	E(cudaErrorNoKernelImageForDevice),
	E(cudaErrorAlreadyAcquired),
	E(cudaErrorNotMapped),
	E(cudaErrorNotMappedAsArray),
	E(cudaErrorNotMappedAsPointer),
	E(cudaErrorECCUncorrectable),
	E(cudaErrorUnsupportedLimit),
	E(cudaErrorDeviceAlreadyInUse),
	E(cudaErrorPeerAccessUnsupported),
	E(cudaErrorInvalidPtx),
	E(cudaErrorInvalidGraphicsContext),
	E(cudaErrorNvlinkUncorrectable),
	E(cudaErrorJitCompilerNotFound),
	E(cudaErrorUnsupportedPtxVersion),
	E(cudaErrorJitCompilationDisabled),
	E(cudaErrorUnsupportedExecAffinity),
	E(cudaErrorUnsupportedDevSideSync),
	E(cudaErrorContained),
	E(cudaErrorInvalidSource),
	E(cudaErrorFileNotFound),
	E(cudaErrorSharedObjectSymbolNotFound),
	E(cudaErrorSharedObjectInitFailed),
	E(cudaErrorOperatingSystem),
	E(cudaErrorInvalidResourceHandle),
	E(cudaErrorIllegalState),
	E(cudaErrorLossyQuery),
	E(cudaErrorSymbolNotFound),
	E(cudaErrorNotReady),
	E(cudaErrorIllegalAddress),
	E(cudaErrorLaunchOutOfResources),
	E(cudaErrorLaunchTimeout),
	E(cudaErrorLaunchIncompatibleTexturing),
	E(cudaErrorPeerAccessAlreadyEnabled),
	E(cudaErrorPeerAccessNotEnabled),
	E(cudaErrorSetOnActiveProcess),
	E(cudaErrorContextIsDestroyed),
	E(cudaErrorAssert),
	E(cudaErrorTooManyPeers),
	E(cudaErrorHostMemoryAlreadyRegistered),
	E(cudaErrorHostMemoryNotRegistered),
	E(cudaErrorHardwareStackError),
	E(cudaErrorIllegalInstruction),
	E(cudaErrorMisalignedAddress),
	E(cudaErrorInvalidAddressSpace),
	E(cudaErrorInvalidPc),
	E(cudaErrorLaunchFailure),
	E(cudaErrorCooperativeLaunchTooLarge),
	E(cudaErrorTensorMemoryLeak),
	E(cudaErrorNotPermitted),
	E(cudaErrorNotSupported),
	E(cudaErrorSystemNotReady),
	E(cudaErrorSystemDriverMismatch),
	E(cudaErrorCompatNotSupportedOnDevice),
	E(cudaErrorMpsConnectionFailed),
	E(cudaErrorMpsRpcFailure),
	E(cudaErrorMpsServerNotReady),
	E(cudaErrorMpsMaxClientsReached),
	E(cudaErrorMpsMaxConnectionsReached),
	E(cudaErrorMpsClientTerminated),
	E(cudaErrorCdpNotSupported),
	E(cudaErrorCdpVersionMismatch),
	E(cudaErrorStreamCaptureUnsupported),
	E(cudaErrorStreamCaptureInvalidated),
	E(cudaErrorStreamCaptureMerge),
	E(cudaErrorStreamCaptureUnmatched),
	E(cudaErrorStreamCaptureUnjoined),
	E(cudaErrorStreamCaptureIsolation),
	E(cudaErrorStreamCaptureImplicit),
	E(cudaErrorCapturedEvent),
	E(cudaErrorStreamCaptureWrongThread),
	E(cudaErrorTimeout),
	E(cudaErrorGraphExecUpdateFailure),
	E(cudaErrorExternalDevice),
	E(cudaErrorInvalidClusterSize),
	E(cudaErrorFunctionNotLoaded),
	E(cudaErrorInvalidResourceType),
	E(cudaErrorInvalidResourceConfiguration),
	E(cudaErrorUnknown),
};
#undef E

static const struct {
	cudaError_t code;
	const char *text;
} texts[] = {
	{ cudaSuccess, "no error" },
	{ cudaErrorInvalidValue, "invalid argument" },
	{ cudaErrorMemoryAllocation, "out of memory" },
	{ cudaErrorInitializationError, "initialization error" },
	{ cudaErrorCudartUnloading, "driver shutting down" },
	{ cudaErrorInvalidConfiguration, "invalid configuration argument" },
	{ cudaErrorInvalidPitchValue, "invalid pitch argument" },
	{ cudaErrorInvalidSymbol, "invalid device symbol" },
	{ cudaErrorInvalidHostPointer, "invalid host pointer" },
	{ cudaErrorInvalidDevicePointer, "invalid device pointer" },
	{ cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy" },
	{ cudaErrorMissingConfiguration, "__global__ function call is not configured" },
	{ cudaErrorInvalidDeviceFunction, "invalid device function" },
	{ cudaErrorNoDevice, "no CUDA-capable device is detected" },
	{ cudaErrorInvalidDevice, "invalid device ordinal" },
	{ cudaErrorDeviceUninitialized, "invalid device context" },
	{ cudaErrorMapBufferObjectFailed, "mapping of buffer object failed" },
	{ cudaErrorInvalidResourceHandle, "invalid resource handle" },
	{ cudaErrorSymbolNotFound, "named symbol not found" },
	{ cudaErrorNotReady, "device not ready" },
	{ cudaErrorIllegalAddress, "an illegal memory access was encountered" },
	{ cudaErrorLaunchOutOfResources, "too many resources requested for launch" },
	{ cudaErrorHostMemoryAlreadyRegistered, "part or all of the requested memory range is already mapped" },
	{ cudaErrorHostMemoryNotRegistered, "pointer does not correspond to a registered memory region" },
	{ cudaErrorLaunchFailure, "unspecified launch failure" },
	{ cudaErrorCooperativeLaunchTooLarge, "too many blocks in cooperative launch" },
	{ cudaErrorNotPermitted, "operation not permitted" },
	{ cudaErrorNotSupported, "operation not supported" },
	{ cudaErrorUnknown, "unknown error" },
};

SG_API const char *cudaGetErrorName(cudaError_t error)
{
	size_t i;

	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (names[i].code == error)
			return names[i].name;
	return "unrecognized error code";
}

SG_API const char *cudaGetErrorString(cudaError_t error)
{
	size_t i;

	for (i = 0; i < sizeof(texts) / sizeof(texts[0]); i++)
		if (texts[i].code == error)
			return texts[i].text;
	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (names[i].code == error)
			return names[i].name;   /* no prose for it: at least the name */
	return "unrecognized error code";
}
