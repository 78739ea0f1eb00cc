/*
 * memory.c - allocation entry points: device memory (from the arena),
 * managed memory (also the arena: the host can touch it anyway), pinned
 * host memory (ordinary memory we keep a record of, because pinned and
 * pageable memory behave differently in asynchronous copies), and pointer
 * attributes.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "simgpu_impl.h"
#include "graph.h"

/* Pinned ranges, sorted by address. */
struct pin {
	char  *p;
	size_t n;
	int    owned;    /* ours to free (cudaMallocHost), else registered */
};

static pthread_mutex_t pin_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pin *pins;
static size_t npins, cappins;

/* Index of the pinned range containing p, or -1; pin_mu held. */
static long pin_find(const void *p)
{
	size_t lo = 0, hi = npins;
	const char *c = p;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (pins[mid].p + pins[mid].n <= c)
			lo = mid + 1;
		else if (pins[mid].p > c)
			hi = mid;
		else
			return (long)mid;
	}
	return -1;
}

static int pin_add(void *p, size_t n, int owned)
{
	size_t i = 0;
	int rc = 0;

	pthread_mutex_lock(&pin_mu);
	if (npins == cappins) {
		size_t nc = cappins ? cappins * 2 : 32;
		struct pin *np = realloc(pins, nc * sizeof(*np));

		if (!np) {
			rc = -1;
			goto out;
		}
		pins = np;
		cappins = nc;
	}
	while (i < npins && pins[i].p < (char *)p)
		i++;
	memmove(&pins[i + 1], &pins[i], (npins - i) * sizeof(*pins));
	pins[i].p = p;
	pins[i].n = n ? n : 1;
	pins[i].owned = owned;
	npins++;
out:
	pthread_mutex_unlock(&pin_mu);
	return rc;
}

/* Remove the range starting exactly at p; returns its owned flag or -1. */
static int pin_del(const void *p)
{
	long i;
	int owned = -1;

	pthread_mutex_lock(&pin_mu);
	i = pin_find(p);
	if (i >= 0 && pins[i].p == p) {
		owned = pins[i].owned;
		memmove(&pins[i], &pins[i + 1], (npins - (size_t)i - 1) * sizeof(*pins));
		npins--;
	}
	pthread_mutex_unlock(&pin_mu);
	return owned;
}

int sg_is_pinned(const void *p, size_t n)
{
	long i;
	int ok;

	pthread_mutex_lock(&pin_mu);
	i = pin_find(p);
	ok = i >= 0 && (size_t)((const char *)p - pins[i].p) + n <= pins[i].n;
	pthread_mutex_unlock(&pin_mu);
	return ok;
}

/* ---------------------------------------------------------------- device */

SG_API cudaError_t cudaMalloc(void **devPtr, size_t size)
{
	cudaError_t e;

	sg_init();
	if (!devPtr)
		return sg_err(cudaErrorInvalidValue);
	/* "potentially unsafe" during a stream capture, as in CUDA */
	if ((e = sg_capture_unsafe()) != cudaSuccess)
		return sg_err(e);
	if (size == 0) {
		*devPtr = NULL;
		return cudaSuccess;
	}
	e = sg_arena_alloc(size, SG_MEM_DEVICE, devPtr);
	if (e != cudaSuccess) {
		*devPtr = NULL;
		return sg_err(e);
	}
	return cudaSuccess;
}

SG_API cudaError_t cudaFree(void *devPtr)
{
	cudaError_t e;

	sg_init();
	if (!devPtr)
		return cudaSuccess;     /* the classic "init the context" idiom */
	if (!sg_arena_find(devPtr, NULL, NULL, NULL))
		return sg_err(cudaErrorInvalidValue);
	if ((e = sg_capture_unsafe()) != cudaSuccess)
		return sg_err(e);
	/* CUDA synchronises here: queued kernels may still use the memory. */
	sg_sync_all();
	/* A pool's allocation leaves its pool's books, managed memory its
	 * advice (mempool.c, hints.c); a pool block already freed is not ours. */
	if (sg_pool_forget(devPtr) < 0)
		return sg_err(cudaErrorInvalidValue);
	sg_hints_forget(devPtr);
	return sg_err(sg_arena_free(devPtr));
}

SG_API cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
	cudaError_t e;

	sg_init();
	if (!devPtr || size == 0 ||
	    (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost))
		return sg_err(cudaErrorInvalidValue);
	e = sg_arena_alloc(size, SG_MEM_MANAGED, devPtr);
	if (e != cudaSuccess) {
		*devPtr = NULL;
		return sg_err(e);
	}
	return cudaSuccess;
}

SG_API cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height)
{
	size_t p;

	sg_init();
	if (!devPtr || !pitch)
		return sg_err(cudaErrorInvalidValue);
	p = (width + 511) / 512 * 512;      /* texture pitch alignment */
	if (width && height && p > (size_t)-1 / height)
		return sg_err(cudaErrorMemoryAllocation);
	*pitch = p;
	return cudaMalloc(devPtr, p * height);
}

static cudaError_t malloc_async(void **devPtr, size_t size, cudaStream_t stream, int ptsz)
{
	struct sg_stream *s;

	sg_init();
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	/* Stream-ordered allocation, from the device's current pool
	 * (mempool.c): usable at once is a valid ordering. */
	return sg_pool_malloc(devPtr, size, NULL, s);
}

SG_API cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream)
{
	return malloc_async(devPtr, size, hStream, 0);
}

SG_API cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream)
{
	return malloc_async(devPtr, size, hStream, 1);
}

static cudaError_t free_async(void *devPtr, cudaStream_t stream, int ptsz)
{
	struct sg_stream *s;
	struct sg_op *op;
	cudaError_t e;

	sg_init();
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	if (!devPtr)
		return cudaSuccess;
	/* Pool memory goes back to its pool when the stream gets there
	 * (mempool.c); cudaMalloc's memory goes back to the arena. */
	if (sg_pool_free_async(devPtr, s, &e))
		return e;
	if (!sg_arena_find(devPtr, NULL, NULL, NULL))
		return sg_err(cudaErrorInvalidValue);
	op = sg_op_new(SG_OP_FREE, 0);
	if (!op)
		return sg_err(cudaErrorMemoryAllocation);
	op->u.free.ptr = devPtr;
	sg_enqueue(s, op);
	return cudaSuccess;
}

SG_API cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream)
{
	return free_async(devPtr, hStream, 0);
}

SG_API cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream)
{
	return free_async(devPtr, hStream, 1);
}

SG_API cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
	size_t f, t;

	sg_init();
	if (!free_b || !total_b)
		return sg_err(cudaErrorInvalidValue);
	sg_arena_mem_info(&f, &t);
	*free_b = f;
	*total_b = t;
	return cudaSuccess;
}

/* ---------------------------------------------------------------- host */

SG_API cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
	void *p;

	sg_init();
	if (!pHost)
		return sg_err(cudaErrorInvalidValue);
	if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped |
				cudaHostAllocWriteCombined))
		return sg_err(cudaErrorInvalidValue);
	if (size == 0) {
		*pHost = NULL;
		return cudaSuccess;
	}
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		*pHost = NULL;
		return sg_err(cudaErrorMemoryAllocation);
	}
	if (pin_add(p, size, 1) < 0) {
		munmap(p, size);
		*pHost = NULL;
		return sg_err(cudaErrorMemoryAllocation);
	}
	*pHost = p;
	return cudaSuccess;
}

SG_API cudaError_t cudaMallocHost(void **ptr, size_t size)
{
	return cudaHostAlloc(ptr, size, cudaHostAllocDefault);
}

SG_API cudaError_t cudaFreeHost(void *ptr)
{
	size_t n = 0;
	long i;

	sg_init();
	if (!ptr)
		return cudaSuccess;
	pthread_mutex_lock(&pin_mu);
	i = pin_find(ptr);
	if (i >= 0 && pins[i].p == ptr && pins[i].owned)
		n = pins[i].n;
	pthread_mutex_unlock(&pin_mu);
	if (!n)
		return sg_err(cudaErrorInvalidValue);
	sg_sync_all();     /* as cudaFree: queued copies may still read it */
	pin_del(ptr);
	munmap(ptr, n);
	return cudaSuccess;
}

SG_API cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
	sg_init();
	(void)flags;
	if (!ptr || size == 0)
		return sg_err(cudaErrorInvalidValue);
	if (sg_is_pinned(ptr, 1))
		return sg_err(cudaErrorHostMemoryAlreadyRegistered);
	if (pin_add(ptr, size, 0) < 0)
		return sg_err(cudaErrorMemoryAllocation);
	return cudaSuccess;
}

SG_API cudaError_t cudaHostUnregister(void *ptr)
{
	sg_init();
	if (!ptr)
		return sg_err(cudaErrorInvalidValue);
	if (pin_del(ptr) != 0)
		return sg_err(cudaErrorHostMemoryNotRegistered);
	return cudaSuccess;
}

SG_API cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
	sg_init();
	if (!pDevice || flags)
		return sg_err(cudaErrorInvalidValue);
	if (!sg_is_pinned(pHost, 1))
		return sg_err(cudaErrorInvalidValue);
	*pDevice = pHost;    /* unified addressing: the same address */
	return cudaSuccess;
}

SG_API cudaError_t cudaHostGetFlags(unsigned int *pFlags, void *pHost)
{
	sg_init();
	if (!pFlags || !sg_is_pinned(pHost, 1))
		return sg_err(cudaErrorInvalidValue);
	*pFlags = cudaHostAllocMapped;
	return cudaSuccess;
}

/* ---------------------------------------------------------------- attributes */

SG_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attr, const void *ptr)
{
	void *base;
	int kind;

	sg_init();
	if (!attr)
		return sg_err(cudaErrorInvalidValue);
	memset(attr, 0, sizeof(*attr));
	attr->device = 0;
	if (sg_arena_find(ptr, &base, NULL, &kind)) {
		attr->type = kind == SG_MEM_MANAGED ? cudaMemoryTypeManaged : cudaMemoryTypeDevice;
		attr->devicePointer = (void *)ptr;
		attr->hostPointer = kind == SG_MEM_MANAGED ? (void *)ptr : NULL;
	} else if ((sg_in_region(ptr) && simgpu_map_peer(ptr) == 0) ||
		   sg_vmm_find(ptr, NULL, NULL)) {
		/* another process's device memory (IPC), or VMM-mapped memory */
		attr->type = cudaMemoryTypeDevice;
		attr->devicePointer = (void *)ptr;
	} else if (ptr && sg_is_pinned(ptr, 1)) {
		attr->type = cudaMemoryTypeHost;
		attr->devicePointer = (void *)ptr;
		attr->hostPointer = (void *)ptr;
	} else {
		attr->type = cudaMemoryTypeUnregistered;
		attr->device = -2;
	}
	return cudaSuccess;
}
