/*
 * memory.c - "device" memory of the fake driver: malloc'd blocks on a
 * list, so that every pointer a caller passes can be checked first.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

struct blk {
	char       *p;
	size_t      n;
	struct blk *next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct blk *blocks;

int fc_mem_ok(CUdeviceptr p, size_t n)
{
	struct blk *b;
	int ok = 0;

	pthread_mutex_lock(&mu);
	for (b = blocks; b; b = b->next)
		if ((char *)(uintptr_t)p >= b->p && n <= b->n &&
		    (size_t)((char *)(uintptr_t)p - b->p) <= b->n - n) {
			ok = 1;
			break;
		}
	pthread_mutex_unlock(&mu);
	return ok;
}

FC_API CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
	struct blk *b;

	if (!fc_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!dptr || bytesize == 0)
		return CUDA_ERROR_INVALID_VALUE;
	b = malloc(sizeof(*b));
	if (!b)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (posix_memalign((void **)&b->p, 256, bytesize) != 0) {
		free(b);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	memset(b->p, 0, bytesize);
	b->n = bytesize;
	pthread_mutex_lock(&mu);
	b->next = blocks;
	blocks = b;
	pthread_mutex_unlock(&mu);
	*dptr = (CUdeviceptr)(uintptr_t)b->p;
	return CUDA_SUCCESS;
}

FC_API CUresult cuMemFree(CUdeviceptr dptr)
{
	struct blk **pp, *b = NULL;

	if (!fc_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	pthread_mutex_lock(&mu);
	for (pp = &blocks; *pp; pp = &(*pp)->next)
		if ((*pp)->p == (char *)(uintptr_t)dptr) {
			b = *pp;
			*pp = b->next;
			break;
		}
	pthread_mutex_unlock(&mu);
	if (!b)
		return CUDA_ERROR_INVALID_VALUE;
	free(b->p);
	free(b);
	return CUDA_SUCCESS;
}

static CUresult htod(CUdeviceptr dst, const void *src, size_t n)
{
	if (!fc_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (n == 0)
		return CUDA_SUCCESS;
	if (!src || !fc_mem_ok(dst, n))
		return CUDA_ERROR_INVALID_VALUE;
	memcpy((void *)(uintptr_t)dst, src, n);
	return CUDA_SUCCESS;
}

static CUresult dtoh(void *dst, CUdeviceptr src, size_t n)
{
	if (!fc_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (n == 0)
		return CUDA_SUCCESS;
	if (!dst || !fc_mem_ok(src, n))
		return CUDA_ERROR_INVALID_VALUE;
	memcpy(dst, (void *)(uintptr_t)src, n);
	return CUDA_SUCCESS;
}

FC_API CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n)
{
	return htod(dst, src, n);
}

FC_API CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n)
{
	return dtoh(dst, src, n);
}

/* The per-thread-default-stream variants: everything is synchronous. */
FC_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n);
FC_API CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n);

FC_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void *src, size_t n)
{
	return htod(dst, src, n);
}

FC_API CUresult cuMemcpyDtoH_v2_ptds(void *dst, CUdeviceptr src, size_t n)
{
	return dtoh(dst, src, n);
}
