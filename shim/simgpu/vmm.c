/*
 * vmm.c - the driver's virtual memory management calls, emulated, and the
 * runtime entry points a program takes them from.
 *
 * A GPU program reaches the driver from the runtime with
 * cudaGetDriverEntryPointByVersion("cuMemCreate", &fn, 12000, 0, &status).
 * simgpu has no driver, so it hands out functions of its own, with the
 * CUDA 13 prototypes of <cuda.h>, for the VMM subset that colocate's shim
 * and workers use to share device memory at the same address:
 *
 *   cuMemCreate                 a memfd of the size ("physical" memory);
 *                               POSIX file descriptor handles only
 *   cuMemExportToShareableHandle a dup of the memfd (no close-on-exec, as
 *                               the driver's), sent by SCM_RIGHTS
 *   cuMemImportFromShareableHandle a handle of our own on a dup of that fd
 *   cuMemAddressReserve         PROT_NONE mapping; the address is a hint,
 *                               honoured only when free (MAP_FIXED_NOREPLACE),
 *                               else anywhere, as the driver does.
 *                               SIMGPU_VMM_IGNORE_HINT=1 never honours it,
 *                               so that callers' fallbacks can be tested
 *   cuMemMap / cuMemUnmap       the memfd MAP_SHARED|MAP_FIXED over the
 *                               reservation, PROT_NONE until cuMemSetAccess
 *                               (a GPU faults on a mapping without access,
 *                               so a missing call must fail here too), and
 *                               back to a PROT_NONE reservation
 *   cuMemSetAccess              read-write (or read) over a range of one or
 *                               more adjacent mappings, as the driver allows
 *
 * Mapped ranges are registered: copies, memsets, pointer attributes and
 * kernels treat them as device memory (sg_vmm_range_ok), as the arena's.
 * Names not in the table answer cudaErrorSymbolNotFound with status
 * cudaDriverEntryPointSymbolNotFound.  The functions are not exported by
 * their cu* names from libcudart; simgpu's libcuda.so.1 (driver/) exports
 * them, and while it is loaded cudaGetDriverEntryPoint[ByVersion] asks
 * its cuGetProcAddress first (drvglue.c), which hands out these same
 * functions for the VMM names.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "simgpu_impl.h"
#include "drvglue.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define VMM_GRAN   (2ull << 20)         /* as a GPU's minimum granularity   */
#define VMH_MAGIC  0x686d6d76u          /* "vmmh"                           */

struct vmh {                            /* a CUmemGenericAllocationHandle   */
	uint32_t magic;
	int      fd;
	size_t   size;
};

struct vrange {
	uintptr_t base;
	size_t    size;
	int       access;               /* maps: cuMemSetAccess made it usable */
};

/* reservations and mappings, each sorted by base; vmu guards both */
static pthread_rwlock_t vmu = PTHREAD_RWLOCK_INITIALIZER;
static struct vrange *resv, *maps;
static size_t nresv, capresv, nmaps, capmaps;
static struct sg_hset handles = SG_HSET_INIT;

/* ---------------------------------------------------------------- ranges */

/* Index of the range containing a, or -1; lock held. */
static long range_find(const struct vrange *r, size_t n, uintptr_t a)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (r[mid].base + r[mid].size <= a)
			lo = mid + 1;
		else if (r[mid].base > a)
			hi = mid;
		else
			return (long)mid;
	}
	return -1;
}

/* Does [a, a+n) overlap any range?  lock held. */
static int range_overlaps(const struct vrange *r, size_t cnt, uintptr_t a, size_t n)
{
	size_t i;

	for (i = 0; i < cnt; i++)
		if (r[i].base < a + n && a < r[i].base + r[i].size)
			return 1;
	return 0;
}

static int range_add(struct vrange **r, size_t *n, size_t *cap, uintptr_t a, size_t len)
{
	size_t i = 0;

	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 32;
		struct vrange *nr = realloc(*r, nc * sizeof(*nr));

		if (!nr)
			return -1;
		*r = nr;
		*cap = nc;
	}
	while (i < *n && (*r)[i].base < a)
		i++;
	memmove(&(*r)[i + 1], &(*r)[i], (*n - i) * sizeof(**r));
	(*r)[i].base = a;
	(*r)[i].size = len;
	(*r)[i].access = 0;
	(*n)++;
	return 0;
}

static void range_del(struct vrange *r, size_t *n, size_t i)
{
	memmove(&r[i], &r[i + 1], (*n - i - 1) * sizeof(*r));
	(*n)--;
}

int sg_vmm_find(const void *p, void **base, size_t *size)
{
	long i;

	if (!p || !__atomic_load_n(&nmaps, __ATOMIC_RELAXED))
		return 0;
	pthread_rwlock_rdlock(&vmu);
	i = range_find(maps, nmaps, (uintptr_t)p);
	if (i >= 0 && !maps[i].access)
		i = -1;                 /* mapped, not accessible: not usable */
	if (i >= 0) {
		if (base)
			*base = (void *)maps[i].base;
		if (size)
			*size = maps[i].size;
	}
	pthread_rwlock_unlock(&vmu);
	return i >= 0;
}

int sg_vmm_range_ok(const void *p, size_t n)
{
	void *b;
	size_t sz;

	if (!sg_vmm_find(p, &b, &sz))
		return 0;
	return (size_t)((const char *)p - (char *)b) + (n ? n : 1) <= sz;
}

/* ---------------------------------------------------------------- handles */

static struct vmh *vmh_of(CUmemGenericAllocationHandle h)
{
	struct vmh *v = (struct vmh *)(uintptr_t)h;

	if (!h || !sg_hset_has(&handles, v) || v->magic != VMH_MAGIC)
		return NULL;
	return v;
}

static CUresult vmh_new(int fd, size_t size, CUmemGenericAllocationHandle *out)
{
	struct vmh *v = malloc(sizeof(*v));

	if (!v)
		return CUDA_ERROR_OUT_OF_MEMORY;
	v->magic = VMH_MAGIC;
	v->fd = fd;
	v->size = size;
	if (sg_hset_add(&handles, v) < 0) {
		free(v);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*out = (CUmemGenericAllocationHandle)(uintptr_t)v;
	return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- the calls */

static CUresult CUDAAPI sg_cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p,
							 CUmemAllocationGranularity_flags o)
{
	if (!g || !p || p->type != CU_MEM_ALLOCATION_TYPE_PINNED)
		return CUDA_ERROR_INVALID_VALUE;
	(void)o;                /* minimum and recommended are the same here */
	*g = VMM_GRAN;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI sg_cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
				       const CUmemAllocationProp *p, unsigned long long flags)
{
	CUresult r;
	int fd;

	if (!h || !p || flags || size == 0 || size % VMM_GRAN ||
	    p->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
	    p->location.type != CU_MEM_LOCATION_TYPE_DEVICE || p->location.id != 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (p->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	fd = memfd_create("simgpu-vmm", MFD_CLOEXEC);
	if (fd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (ftruncate(fd, (off_t)size) < 0) {
		close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	r = vmh_new(fd, size, h);
	if (r != CUDA_SUCCESS)
		close(fd);
	return r;
}

static CUresult CUDAAPI sg_cuMemRelease(CUmemGenericAllocationHandle h)
{
	struct vmh *v = vmh_of(h);

	if (!v)
		return CUDA_ERROR_INVALID_VALUE;
	sg_hset_del(&handles, v);
	/* mappings keep the memory alive, as the driver's do */
	close(v->fd);
	v->magic = 0;
	free(v);
	return CUDA_SUCCESS;
}

static int ignore_hint(void)
{
	const char *e = getenv("SIMGPU_VMM_IGNORE_HINT");

	return e && *e && strcmp(e, "0") != 0;
}

static CUresult CUDAAPI sg_cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align,
					       CUdeviceptr addr, unsigned long long flags)
{
	size_t al = align > VMM_GRAN ? align : VMM_GRAN, len;
	char *p = MAP_FAILED;
	uintptr_t a;

	if (!ptr || flags || size == 0 || size % VMM_GRAN || (align & (align - 1)))
		return CUDA_ERROR_INVALID_VALUE;
	if (addr && !ignore_hint() && addr % al == 0) {
		p = mmap((void *)(uintptr_t)addr, size, PROT_NONE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
		if (p != MAP_FAILED && p != (char *)(uintptr_t)addr) {
			munmap(p, size);        /* an old kernel took it as a hint */
			p = MAP_FAILED;
		}
	}
	if (p == MAP_FAILED) {
		/* anywhere, aligned: over-reserve and trim both ends */
		len = size + al;
		p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (p == MAP_FAILED)
			return CUDA_ERROR_OUT_OF_MEMORY;
		a = ((uintptr_t)p + al - 1) / al * al;
		if (a > (uintptr_t)p)
			munmap(p, a - (uintptr_t)p);
		if ((uintptr_t)p + len > a + size)
			munmap((char *)(a + size), (uintptr_t)p + len - (a + size));
		p = (char *)a;
	}
	pthread_rwlock_wrlock(&vmu);
	if (range_add(&resv, &nresv, &capresv, (uintptr_t)p, size) < 0) {
		pthread_rwlock_unlock(&vmu);
		munmap(p, size);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_rwlock_unlock(&vmu);
	*ptr = (CUdeviceptr)(uintptr_t)p;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI sg_cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	long i;

	pthread_rwlock_wrlock(&vmu);
	i = range_find(resv, nresv, (uintptr_t)ptr);
	if (i < 0 || resv[i].base != ptr || resv[i].size != size ||
	    range_overlaps(maps, nmaps, (uintptr_t)ptr, size)) {
		/* the driver wants every mapping in it unmapped first */
		pthread_rwlock_unlock(&vmu);
		return CUDA_ERROR_INVALID_VALUE;
	}
	range_del(resv, &nresv, (size_t)i);
	munmap((void *)(uintptr_t)ptr, size);
	pthread_rwlock_unlock(&vmu);
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI sg_cuMemMap(CUdeviceptr ptr, size_t size, size_t off,
				    CUmemGenericAllocationHandle h, unsigned long long flags)
{
	struct vmh *v = vmh_of(h);
	long i;

	if (!v || flags || off || size == 0 || size > v->size || ptr % VMM_GRAN || size % VMM_GRAN)
		return CUDA_ERROR_INVALID_VALUE;
	pthread_rwlock_wrlock(&vmu);
	i = range_find(resv, nresv, (uintptr_t)ptr);
	if (i < 0 || ptr + size > resv[i].base + resv[i].size) {
		pthread_rwlock_unlock(&vmu);
		return CUDA_ERROR_INVALID_VALUE;     /* not inside a reservation */
	}
	if (range_overlaps(maps, nmaps, (uintptr_t)ptr, size)) {
		pthread_rwlock_unlock(&vmu);
		return CUDA_ERROR_ALREADY_MAPPED;
	}
	if (mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED,
		 v->fd, 0) == MAP_FAILED) {
		pthread_rwlock_unlock(&vmu);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	if (range_add(&maps, &nmaps, &capmaps, (uintptr_t)ptr, size) < 0) {
		mmap((void *)(uintptr_t)ptr, size, PROT_NONE,
		     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
		pthread_rwlock_unlock(&vmu);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	pthread_rwlock_unlock(&vmu);
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI sg_cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	long i;

	pthread_rwlock_wrlock(&vmu);
	i = range_find(maps, nmaps, (uintptr_t)ptr);
	if (i < 0 || maps[i].base != ptr || maps[i].size != size) {
		pthread_rwlock_unlock(&vmu);
		return CUDA_ERROR_INVALID_VALUE;
	}
	range_del(maps, &nmaps, (size_t)i);
	/* back to reserved-but-inaccessible, as after cuMemAddressReserve */
	mmap((void *)(uintptr_t)ptr, size, PROT_NONE,
	     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
	pthread_rwlock_unlock(&vmu);
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI sg_cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *d,
					  size_t n)
{
	uintptr_t a = (uintptr_t)ptr, end = a + size;
	int prot;
	long i;

	if (!d || !n || !size || end < a || ptr % VMM_GRAN || size % VMM_GRAN)
		return CUDA_ERROR_INVALID_VALUE;
	/* the last descriptor for our (only) device decides */
	switch (d[n - 1].flags) {
	case CU_MEM_ACCESS_FLAGS_PROT_READWRITE: prot = PROT_READ | PROT_WRITE; break;
	case CU_MEM_ACCESS_FLAGS_PROT_READ:      prot = PROT_READ; break;
	case CU_MEM_ACCESS_FLAGS_PROT_NONE:      prot = PROT_NONE; break;
	default:                                 return CUDA_ERROR_INVALID_VALUE;
	}
	pthread_rwlock_wrlock(&vmu);
	/* every byte mapped, through adjacent mappings */
	while (a < end) {
		i = range_find(maps, nmaps, a);
		if (i < 0) {
			pthread_rwlock_unlock(&vmu);
			return CUDA_ERROR_INVALID_VALUE;
		}
		a = maps[i].base + maps[i].size;
	}
	if (mprotect((void *)(uintptr_t)ptr, size, prot) < 0) {
		pthread_rwlock_unlock(&vmu);
		return CUDA_ERROR_INVALID_VALUE;
	}
	for (a = (uintptr_t)ptr; a < end; a = maps[i].base + maps[i].size) {
		i = range_find(maps, nmaps, a);
		maps[i].access = prot != PROT_NONE;
	}
	pthread_rwlock_unlock(&vmu);
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI sg_cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
							CUmemAllocationHandleType t,
							unsigned long long flags)
{
	struct vmh *v = vmh_of(h);
	int fd;

	if (!v || !out || flags)
		return CUDA_ERROR_INVALID_VALUE;
	if (t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	fd = dup(v->fd);
	if (fd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*(int *)out = fd;
	return CUDA_SUCCESS;
}

static CUresult CUDAAPI sg_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h,
							  void *os, CUmemAllocationHandleType t)
{
	struct stat st;
	CUresult r;
	int fd;

	if (!h)
		return CUDA_ERROR_INVALID_VALUE;
	if (t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	fd = fcntl((int)(intptr_t)os, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
	    (uint64_t)st.st_size % VMM_GRAN) {
		close(fd);
		return CUDA_ERROR_INVALID_VALUE;    /* not memory of ours */
	}
	r = vmh_new(fd, (size_t)st.st_size, h);
	if (r != CUDA_SUCCESS)
		close(fd);
	return r;
}

/* ---------------------------------------------------------------- entry points */

static const struct {
	const char *name;
	void *fn;
} entries[] = {
	{ "cuMemGetAllocationGranularity", (void *)sg_cuMemGetAllocationGranularity },
	{ "cuMemCreate", (void *)sg_cuMemCreate },
	{ "cuMemRelease", (void *)sg_cuMemRelease },
	{ "cuMemAddressReserve", (void *)sg_cuMemAddressReserve },
	{ "cuMemAddressFree", (void *)sg_cuMemAddressFree },
	{ "cuMemMap", (void *)sg_cuMemMap },
	{ "cuMemUnmap", (void *)sg_cuMemUnmap },
	{ "cuMemSetAccess", (void *)sg_cuMemSetAccess },
	{ "cuMemExportToShareableHandle", (void *)sg_cuMemExportToShareableHandle },
	{ "cuMemImportFromShareableHandle", (void *)sg_cuMemImportFromShareableHandle },
};

/* The emulated function of that name, or NULL: simgpu's libcuda.so.1
 * hands these out too (drvglue.c), so both ways reach the same code. */
void *sg_vmm_entry(const char *name)
{
	size_t i;

	for (i = 0; i < sizeof(entries) / sizeof(entries[0]); i++)
		if (!strcmp(name, entries[i].name))
			return entries[i].fn;
	return NULL;
}

/* With simgpu's libcuda.so.1 loaded, its cuGetProcAddress answers, as the
 * driver answers a real runtime; without it, the VMM table below. */
static cudaError_t entry_point(const char *symbol, void **fn, unsigned int version,
			       unsigned long long flags,
			       enum cudaDriverEntryPointQueryResult *status)
{
	size_t i;

	sg_init();
	if (!symbol || !fn)
		return sg_err(cudaErrorInvalidValue);
	*fn = NULL;
	if (sg_drv_entry(symbol, fn, version, flags, status))
		return *fn ? cudaSuccess : sg_err(cudaErrorSymbolNotFound);
	for (i = 0; i < sizeof(entries) / sizeof(entries[0]); i++) {
		if (strcmp(symbol, entries[i].name) != 0)
			continue;
		if (version && version < 10020) {       /* VMM came with CUDA 10.2 */
			if (status)
				*status = cudaDriverEntryPointVersionNotSufficent;
			return sg_err(cudaErrorSymbolNotFound);
		}
		*fn = entries[i].fn;
		if (status)
			*status = cudaDriverEntryPointSuccess;
		return cudaSuccess;
	}
	if (status)
		*status = cudaDriverEntryPointSymbolNotFound;
	return sg_err(cudaErrorSymbolNotFound);
}

SG_API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **funcPtr,
						    unsigned int cudaVersion,
						    unsigned long long flags,
						    enum cudaDriverEntryPointQueryResult *driverStatus)
{
	return entry_point(symbol, funcPtr, cudaVersion, flags, driverStatus);
}

SG_API cudaError_t cudaGetDriverEntryPoint(const char *symbol, void **funcPtr,
					   unsigned long long flags,
					   enum cudaDriverEntryPointQueryResult *driverStatus)
{
	return entry_point(symbol, funcPtr, 0, flags, driverStatus);
}
