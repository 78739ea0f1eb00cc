/*
 * launch.c - cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel
 * (each with _ptsz, the per-thread default stream) and cuLaunchHostFunc.
 *
 * A launch is the runtime's launch of the same kernel record (drvglue.c):
 * queued on the runtime's stream, run by its host twin, timed by the
 * device model.  Arguments come as kernelParams (one pointer per
 * parameter, as cudaLaunchKernel takes them) or packed in `extra`
 * (CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE), which is cut at the cubin's
 * parameter offsets.  Passing both is CUDA_ERROR_INVALID_VALUE.
 *
 * In a green context (cuCtxFromGreenCtx's, current) the default stream
 * is the green context's (green.c), so its kernels keep to its SMs.
 *
 * cuGraphLaunch is CUDA_ERROR_NOT_SUPPORTED: graphs are not modelled by
 * the driver library.
 */
#include <string.h>

#include "drv.h"

/* Prototypes cuda.h gives only under other macro settings. */
CUresult cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
			     unsigned, unsigned, CUstream, void **, void **);
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned,
					unsigned, unsigned, unsigned, CUstream, void **);
CUresult cuGraphLaunch_ptsz(CUgraphExec, CUstream);
CUresult cuLaunchHostFunc_ptsz(CUstream, CUhostFn, void *);

/* The packed buffer of `extra`, or an error. */
static CUresult extra_buf(void **extra, const void **buf, size_t *n)
{
	int i;

	*buf = NULL;
	*n = 0;
	for (i = 0; i < 64 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
		if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
			*buf = extra[i + 1];
		else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
			*n = *(const size_t *)extra[i + 1];
		else
			return CUDA_ERROR_INVALID_VALUE;
	}
	if (i >= 64 || !*buf)
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, const unsigned dims[6], unsigned shmem, CUstream s,
		       void **params, void **extra, int ptsz, int coop)
{
	const void *buf = NULL;
	struct drv_ctx *c;
	size_t n = 0;
	CUresult r = drv_ctx_check(&c);

	if (r != CUDA_SUCCESS)
		return r;
	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	/* the default stream of a current green context is its own */
	s = drv_green_stream(c, s, &ptsz);
	if (params && extra)
		return CUDA_ERROR_INVALID_VALUE;
	if (extra) {
		r = extra_buf(extra, &buf, &n);
		if (r != CUDA_SUCCESS)
			return r;
	}
	return drv_err(simgpu_drv_launch(f, dims, shmem, s, params, buf, n, ptsz, coop));
}

#define DIMS { gx, gy, gz, bx, by, bz }

/* the last CUlaunchAttributeID of CUDA 13.0's cuda.h */
#define LAST_ATTRIBUTE CU_LAUNCH_ATTRIBUTE_NVLINK_UTIL_CENTRIC_SCHEDULING

DRV_API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
				unsigned int bx, unsigned int by, unsigned int bz,
				unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
				void **extra)
{
	const unsigned dims[6] = DIMS;

	return launch(f, dims, sharedMemBytes, hStream, kernelParams, extra, 0, 0);
}

DRV_API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
				     unsigned int gz, unsigned int bx, unsigned int by,
				     unsigned int bz, unsigned int sharedMemBytes, CUstream hStream,
				     void **kernelParams, void **extra)
{
	const unsigned dims[6] = DIMS;

	return launch(f, dims, sharedMemBytes, hStream, kernelParams, extra, 1, 0);
}

DRV_API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
					   unsigned int gz, unsigned int bx, unsigned int by,
					   unsigned int bz, unsigned int sharedMemBytes,
					   CUstream hStream, void **kernelParams)
{
	const unsigned dims[6] = DIMS;

	return launch(f, dims, sharedMemBytes, hStream, kernelParams, NULL, 0, 1);
}

DRV_API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
						unsigned int gz, unsigned int bx, unsigned int by,
						unsigned int bz, unsigned int sharedMemBytes,
						CUstream hStream, void **kernelParams)
{
	const unsigned dims[6] = DIMS;

	return launch(f, dims, sharedMemBytes, hStream, kernelParams, NULL, 1, 1);
}

/*
 * The attributes of a config: cooperative launches are honoured, the
 * scheduling hints (priority, cluster shape, ...) accepted and ignored;
 * an attribute id this header does not know is CUDA_ERROR_INVALID_VALUE.
 */
static CUresult launch_ex(const CUlaunchConfig *c, CUfunction f, void **params, void **extra,
			  int ptsz)
{
	unsigned i, dims[6];
	int coop = 0;

	if (!c || (c->numAttrs && !c->attrs))
		return CUDA_ERROR_INVALID_VALUE;
	for (i = 0; i < c->numAttrs; i++) {
		if ((int)c->attrs[i].id <= 0 || (int)c->attrs[i].id > LAST_ATTRIBUTE)
			return CUDA_ERROR_INVALID_VALUE;
		if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_COOPERATIVE && c->attrs[i].value.cooperative)
			coop = 1;
	}
	dims[0] = c->gridDimX, dims[1] = c->gridDimY, dims[2] = c->gridDimZ;
	dims[3] = c->blockDimX, dims[4] = c->blockDimY, dims[5] = c->blockDimZ;
	if (coop && extra)
		return CUDA_ERROR_INVALID_VALUE;
	return launch(f, dims, c->sharedMemBytes, c->hStream, params, extra, ptsz, coop);
}

DRV_API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
				  void **extra)
{
	return launch_ex(config, f, kernelParams, extra, 0);
}

DRV_API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
				       void **kernelParams, void **extra)
{
	return launch_ex(config, f, kernelParams, extra, 1);
}

static CUresult host_func(CUstream s, CUhostFn fn, void *data, int ptsz)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!fn)
		return CUDA_ERROR_INVALID_VALUE;
	return drv_err(simgpu_drv_host_func(s, fn, data, ptsz));
}

DRV_API CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
	return host_func(hStream, fn, userData, 0);
}

DRV_API CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void *userData)
{
	return host_func(hStream, fn, userData, 1);
}

DRV_API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
	CUresult r = drv_ready();

	(void)hGraphExec, (void)hStream;
	return r != CUDA_SUCCESS ? r : CUDA_ERROR_NOT_SUPPORTED;
}

DRV_API CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
	CUresult r = drv_ready();

	(void)hGraphExec, (void)hStream;
	return r != CUDA_SUCCESS ? r : CUDA_ERROR_NOT_SUPPORTED;
}
