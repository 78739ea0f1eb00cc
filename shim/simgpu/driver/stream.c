/*
 * stream.c - streams and events: the runtime's own (a CUstream is a
 * cudaStream_t, a CUevent a cudaEvent_t), so work a program queues
 * through the driver and through the runtime shares one order.
 * CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are the runtime's
 * cudaStreamLegacy and cudaStreamPerThread; NULL is the default stream
 * (the per-thread one for the _ptsz entry points).  Stream and event
 * flags have the runtime's values.
 */
#include "drv.h"

CUresult cuStreamSynchronize_ptsz(CUstream);
CUresult cuStreamQuery_ptsz(CUstream);
CUresult cuStreamWaitEvent_ptsz(CUstream, CUevent, unsigned int);
CUresult cuStreamGetFlags_ptsz(CUstream, unsigned int *);
CUresult cuEventRecord_ptsz(CUevent, CUstream);
CUresult cuStreamIsCapturing_ptsz(CUstream, CUstreamCaptureStatus *);

static CUresult create(CUstream *ph, unsigned flags, int prio)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!ph || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
		return CUDA_ERROR_INVALID_VALUE;
	return drv_err(simgpu_drv_stream_create((void **)ph, flags, prio));
}

DRV_API CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
	return create(phStream, Flags, 0);
}

DRV_API CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
	/* clamped to [-5, 0] by the runtime, as the driver clamps */
	return create(phStream, flags, priority);
}

DRV_API CUresult cuStreamDestroy_v2(CUstream hStream)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!hStream || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD)
		return CUDA_ERROR_INVALID_HANDLE;
	return drv_err(simgpu_drv_stream_destroy(hStream));
}

static CUresult sync_(CUstream s, int ptsz)
{
	CUresult r = drv_ready();

	return r != CUDA_SUCCESS ? r : drv_err(simgpu_drv_stream_sync(s, ptsz));
}

DRV_API CUresult cuStreamSynchronize(CUstream hStream)
{
	return sync_(hStream, 0);
}

DRV_API CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
	return sync_(hStream, 1);
}

static CUresult query(CUstream s, int ptsz)
{
	CUresult r = drv_ready();

	return r != CUDA_SUCCESS ? r : drv_err(simgpu_drv_stream_query(s, ptsz));
}

DRV_API CUresult cuStreamQuery(CUstream hStream)
{
	return query(hStream, 0);
}

DRV_API CUresult cuStreamQuery_ptsz(CUstream hStream)
{
	return query(hStream, 1);
}

static CUresult wait_event(CUstream s, CUevent e, unsigned flags, int ptsz)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
		return CUDA_ERROR_INVALID_VALUE;
	return drv_err(simgpu_drv_stream_wait_event(s, e, flags, ptsz));
}

DRV_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	return wait_event(hStream, hEvent, Flags, 0);
}

DRV_API CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
	return wait_event(hStream, hEvent, Flags, 1);
}

static CUresult get_flags(CUstream s, unsigned *flags, int ptsz)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!flags)
		return CUDA_ERROR_INVALID_VALUE;
	return drv_err(simgpu_drv_stream_flags(s, flags, ptsz));
}

DRV_API CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags)
{
	return get_flags(hStream, flags, 0);
}

DRV_API CUresult cuStreamGetFlags_ptsz(CUstream hStream, unsigned int *flags)
{
	return get_flags(hStream, flags, 1);
}

/* Capture is the runtime's (cudaStreamBeginCapture): a driver launch on
 * a capturing stream is captured as a runtime launch would be. */
static CUresult capturing(CUstream s, CUstreamCaptureStatus *st, int ptsz)
{
	int v = 0;
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!st)
		return CUDA_ERROR_INVALID_VALUE;
	r = drv_err(simgpu_drv_stream_capturing(s, &v, ptsz));
	if (r == CUDA_SUCCESS)
		*st = (CUstreamCaptureStatus)v;   /* the runtime's values */
	return r;
}

DRV_API CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
	return capturing(hStream, captureStatus, 0);
}

DRV_API CUresult cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
	return capturing(hStream, captureStatus, 1);
}

/* ---------------------------------------------------------------- events */

DRV_API CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!phEvent)
		return CUDA_ERROR_INVALID_VALUE;
	return drv_err(simgpu_drv_event_create((void **)phEvent, Flags));
}

DRV_API CUresult cuEventDestroy_v2(CUevent hEvent)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!hEvent)
		return CUDA_ERROR_INVALID_HANDLE;
	return drv_err(simgpu_drv_event_destroy(hEvent));
}

static CUresult record(CUevent e, CUstream s, int ptsz)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!e)
		return CUDA_ERROR_INVALID_HANDLE;
	return drv_err(simgpu_drv_event_record(e, s, ptsz));
}

DRV_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
	return record(hEvent, hStream, 0);
}

DRV_API CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
	return record(hEvent, hStream, 1);
}

DRV_API CUresult cuEventSynchronize(CUevent hEvent)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!hEvent)
		return CUDA_ERROR_INVALID_HANDLE;
	return drv_err(simgpu_drv_event_sync(hEvent));
}

DRV_API CUresult cuEventQuery(CUevent hEvent)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!hEvent)
		return CUDA_ERROR_INVALID_HANDLE;
	return drv_err(simgpu_drv_event_query(hEvent));
}

static CUresult elapsed(float *ms, CUevent a, CUevent b)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!ms)
		return CUDA_ERROR_INVALID_VALUE;
	if (!a || !b)
		return CUDA_ERROR_INVALID_HANDLE;
	return drv_err(simgpu_drv_event_elapsed(ms, a, b));
}

/* CUDA 13's cuEventElapsedTime, and the CUDA 2.0 - 12.x one */
DRV_API CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
	return elapsed(pMilliseconds, hStart, hEnd);
}

#undef cuEventElapsedTime
DRV_API CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);
DRV_API CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
	return elapsed(pMilliseconds, hStart, hEnd);
}
