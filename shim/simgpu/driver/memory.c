/*
 * memory.c - device and pinned host memory, copies, memsets, memory info.
 *
 * Device memory is simgpu's arena (the runtime's cudaMalloc memory, at the
 * same addresses in every process of the device); pinned host memory is
 * the runtime's cudaMallocHost memory, so asynchronous copies from it
 * behave as from pinned memory.  Copies and memsets are the runtime's
 * operations on the runtime's streams: ordered with kernels, timed by the
 * device model, checked against the allocator before anything is queued.
 *
 * Synchronous copies use the legacy default stream (the per-thread one
 * for the _ptds entry points) and return when the data is there; the
 * memsets are asynchronous with respect to the host, as the driver's.
 */
#include "drv.h"

/* Prototypes cuda.h gives only with CUDA_API_PER_THREAD_DEFAULT_STREAM. */
CUresult cuMemcpy_ptds(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpyAsync_ptsz(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr, const void *, size_t);
CUresult cuMemcpyDtoH_v2_ptds(void *, CUdeviceptr, size_t);
CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr, CUdeviceptr, size_t);
CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr, const void *, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2_ptsz(void *, CUdeviceptr, size_t, CUstream);
CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr, CUdeviceptr, size_t, CUstream);
CUresult cuMemsetD8_v2_ptds(CUdeviceptr, unsigned char, size_t);
CUresult cuMemsetD16_v2_ptds(CUdeviceptr, unsigned short, size_t);
CUresult cuMemsetD32_v2_ptds(CUdeviceptr, unsigned int, size_t);
CUresult cuMemsetD8Async_ptsz(CUdeviceptr, unsigned char, size_t, CUstream);
CUresult cuMemsetD16Async_ptsz(CUdeviceptr, unsigned short, size_t, CUstream);
CUresult cuMemsetD32Async_ptsz(CUdeviceptr, unsigned int, size_t, CUstream);
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *, size_t, CUstream);
CUresult cuMemFreeAsync_ptsz(CUdeviceptr, CUstream);

#define PTR(d) ((void *)(uintptr_t)(d))

/* ---------------------------------------------------------------- allocation */

DRV_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
	void *p = NULL;
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!dptr || bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	r = drv_err(simgpu_drv_mem_alloc(&p, bytesize));
	if (r == CUDA_SUCCESS)
		*dptr = (CUdeviceptr)(uintptr_t)p;
	return r;
}

DRV_API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	return drv_err(simgpu_drv_mem_free(PTR(dptr)));
}

DRV_API CUresult cuMemGetInfo_v2(size_t *free_b, size_t *total_b)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!free_b || !total_b)
		return CUDA_ERROR_INVALID_VALUE;
	return drv_err(simgpu_drv_mem_info(free_b, total_b));
}

DRV_API CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
	void *base = NULL;
	size_t size = 0;
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (simgpu_drv_mem_range(PTR(dptr), &base, &size) != 0)
		return CUDA_ERROR_NOT_FOUND;
	if (pbase)
		*pbase = (CUdeviceptr)(uintptr_t)base;
	if (psize)
		*psize = size;
	return CUDA_SUCCESS;
}

DRV_API CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pp || bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	return drv_err(simgpu_drv_host_alloc(pp, bytesize));
}

/* Portable, mapped and write-combined memory are all plain pinned memory. */
DRV_API CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int flags)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pp || bytesize == 0 ||
	    (flags & ~(unsigned)(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
				 CU_MEMHOSTALLOC_WRITECOMBINED)))
		return CUDA_ERROR_INVALID_VALUE;
	return drv_err(simgpu_drv_host_alloc(pp, bytesize));
}

DRV_API CUresult cuMemFreeHost(void *p)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!p)
		return CUDA_ERROR_INVALID_VALUE;
	return drv_err(simgpu_drv_host_free(p));
}

/* Stream-ordered allocation: the runtime's cudaMallocAsync/cudaFreeAsync. */
static CUresult alloc_async(CUdeviceptr *dptr, size_t n, CUstream s, int ptsz)
{
	void *p = NULL;
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!dptr || n == 0)
		return CUDA_ERROR_INVALID_VALUE;
	r = drv_err(simgpu_drv_mem_alloc_async(&p, n, s, ptsz));
	if (r == CUDA_SUCCESS)
		*dptr = (CUdeviceptr)(uintptr_t)p;
	return r;
}

DRV_API CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	return alloc_async(dptr, bytesize, hStream, 0);
}

DRV_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
	return alloc_async(dptr, bytesize, hStream, 1);
}

static CUresult free_async(CUdeviceptr d, CUstream s, int ptsz)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!d)
		return CUDA_ERROR_INVALID_VALUE;
	return drv_err(simgpu_drv_mem_free_async(PTR(d), s, ptsz));
}

DRV_API CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
	return free_async(dptr, hStream, 0);
}

DRV_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
	return free_async(dptr, hStream, 1);
}

/* ---------------------------------------------------------------- copies */

static CUresult copy(void *dst, const void *src, size_t n, int dir, CUstream s, int ptsz,
		     int async)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (n == 0)
		return CUDA_SUCCESS;
	if (!dst || !src)
		return CUDA_ERROR_INVALID_VALUE;
	return drv_err(simgpu_drv_copy(dst, src, n, dir, s, ptsz, async));
}

#define SYNC_COPY(name, dty, sty, dir, ptsz)                                        \
	DRV_API CUresult name(dty dst, sty src, size_t n)                          \
	{                                                                           \
		return copy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, \
			    dir, NULL, ptsz, 0);                                    \
	}
#define ASYNC_COPY(name, dty, sty, dir, ptsz)                                       \
	DRV_API CUresult name(dty dst, sty src, size_t n, CUstream s)              \
	{                                                                           \
		return copy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n, \
			    dir, s, ptsz, 1);                                       \
	}

SYNC_COPY(cuMemcpyHtoD_v2, CUdeviceptr, const void *, SG_DRV_H2D, 0)
SYNC_COPY(cuMemcpyHtoD_v2_ptds, CUdeviceptr, const void *, SG_DRV_H2D, 1)
SYNC_COPY(cuMemcpyDtoH_v2, void *, CUdeviceptr, SG_DRV_D2H, 0)
SYNC_COPY(cuMemcpyDtoH_v2_ptds, void *, CUdeviceptr, SG_DRV_D2H, 1)
SYNC_COPY(cuMemcpyDtoD_v2, CUdeviceptr, CUdeviceptr, SG_DRV_D2D, 0)
SYNC_COPY(cuMemcpyDtoD_v2_ptds, CUdeviceptr, CUdeviceptr, SG_DRV_D2D, 1)
SYNC_COPY(cuMemcpy, CUdeviceptr, CUdeviceptr, SG_DRV_ANY, 0)
SYNC_COPY(cuMemcpy_ptds, CUdeviceptr, CUdeviceptr, SG_DRV_ANY, 1)

ASYNC_COPY(cuMemcpyHtoDAsync_v2, CUdeviceptr, const void *, SG_DRV_H2D, 0)
ASYNC_COPY(cuMemcpyHtoDAsync_v2_ptsz, CUdeviceptr, const void *, SG_DRV_H2D, 1)
ASYNC_COPY(cuMemcpyDtoHAsync_v2, void *, CUdeviceptr, SG_DRV_D2H, 0)
ASYNC_COPY(cuMemcpyDtoHAsync_v2_ptsz, void *, CUdeviceptr, SG_DRV_D2H, 1)
ASYNC_COPY(cuMemcpyDtoDAsync_v2, CUdeviceptr, CUdeviceptr, SG_DRV_D2D, 0)
ASYNC_COPY(cuMemcpyDtoDAsync_v2_ptsz, CUdeviceptr, CUdeviceptr, SG_DRV_D2D, 1)
ASYNC_COPY(cuMemcpyAsync, CUdeviceptr, CUdeviceptr, SG_DRV_ANY, 0)
ASYNC_COPY(cuMemcpyAsync_ptsz, CUdeviceptr, CUdeviceptr, SG_DRV_ANY, 1)

/* ---------------------------------------------------------------- memsets */

static CUresult set(CUdeviceptr d, unsigned v, unsigned width, size_t n, CUstream s, int ptsz,
		    int async)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	/* the driver wants D16 and D32 destinations aligned to their width */
	if (d % width)
		return CUDA_ERROR_INVALID_VALUE;
	if (n == 0)
		return CUDA_SUCCESS;
	return drv_err(simgpu_drv_memset(PTR(d), v, width, n, s, ptsz, async));
}

#define SYNC_SET(name, ty, width, ptsz)                                    \
	DRV_API CUresult name(CUdeviceptr d, ty v, size_t n)              \
	{                                                                  \
		return set(d, v, width, n, NULL, ptsz, 0);                 \
	}
#define ASYNC_SET(name, ty, width, ptsz)                                   \
	DRV_API CUresult name(CUdeviceptr d, ty v, size_t n, CUstream s)  \
	{                                                                  \
		return set(d, v, width, n, s, ptsz, 1);                    \
	}

SYNC_SET(cuMemsetD8_v2, unsigned char, 1, 0)
SYNC_SET(cuMemsetD8_v2_ptds, unsigned char, 1, 1)
SYNC_SET(cuMemsetD16_v2, unsigned short, 2, 0)
SYNC_SET(cuMemsetD16_v2_ptds, unsigned short, 2, 1)
SYNC_SET(cuMemsetD32_v2, unsigned int, 4, 0)
SYNC_SET(cuMemsetD32_v2_ptds, unsigned int, 4, 1)
ASYNC_SET(cuMemsetD8Async, unsigned char, 1, 0)
ASYNC_SET(cuMemsetD8Async_ptsz, unsigned char, 1, 1)
ASYNC_SET(cuMemsetD16Async, unsigned short, 2, 0)
ASYNC_SET(cuMemsetD16Async_ptsz, unsigned short, 2, 1)
ASYNC_SET(cuMemsetD32Async, unsigned int, 4, 0)
ASYNC_SET(cuMemsetD32Async_ptsz, unsigned int, 4, 1)
