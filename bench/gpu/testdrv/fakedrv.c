/*
 * fakedrv.c - a pretend CUDA driver for tests/test_gpu_probes.py, never for
 * measuring anything.
 *
 * The GPU probes fetch their driver functions through
 * cudaGetDriverEntryPointByVersion.  simgpu (our CPU libcudart) has none, so
 * on simgpu the probes stop with exit code 2.  Preloaded, this library
 * provides that entry point and the VMM calls on plain host memory, so that
 * everything around them - fork + exec of the child at its own percentage,
 * the fd passed by SCM_RIGHTS, the hint and arena logic, the kernels (their
 * host twins, testdrv/twins.c), the check, the JSON line, the exit codes -
 * runs for real without a GPU:
 *
 *   cuMemCreate            a memfd of the size (the "physical" memory)
 *   cuMemAddressReserve    mmap PROT_NONE at the hint, without MAP_FIXED:
 *                          the kernel gives the hint when it is free, some
 *                          other place otherwise - what the real call does
 *   cuMemMap / Unmap       the memfd mapped MAP_SHARED|MAP_FIXED there, and
 *                          back to PROT_NONE
 *   cuMemExport / Import   dup of the memfd
 *
 * Failure injection for the tests (environment, read in every process):
 *   FAKEDRV_FAIL=cuName    that function returns CUDA_ERROR_NOT_SUPPORTED
 *   FAKEDRV_CRASH=cuName   that function kills the process with SIGSEGV
 *   ...=child:cuName       the same, only in vmm_probe's child (a process
 *                          with --child among its arguments)
 *   FAKEDRV_MPS=1          CU_DEVICE_ATTRIBUTE_MPS_ENABLED says 1
 *   FAKEDRV_NO_HINT=1      cuMemAddressReserve ignores its hint (a driver
 *                          that never grants one: "different address")
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

/* 1 in vmm_probe's child: "--child" is one of our arguments. */
static int is_child(void)
{
	char buf[4096];
	ssize_t n = 0;
	int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);

	if (fd >= 0) {
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
	}
	for (ssize_t i = 0; i < n; i += (ssize_t)strlen(buf + i) + 1) {
		buf[n] = 0;
		if (!strcmp(buf + i, "--child"))
			return 1;
	}
	return 0;
}

/* Does the injection spec (NAME or child:NAME) name this call here? */
static int names(const char *spec, const char *name)
{
	if (!spec)
		return 0;
	if (!strncmp(spec, "child:", 6))
		return !strcmp(spec + 6, name) && is_child();
	return !strcmp(spec, name);
}

/* Injected failure or crash for this function name; 0 to go on. */
static CUresult injected(const char *name)
{
	if (names(getenv("FAKEDRV_CRASH"), name)) {
		signal(SIGSEGV, SIG_DFL);   /* simgpu has a handler of its own */
		raise(SIGSEGV);
	}
	if (names(getenv("FAKEDRV_FAIL"), name))
		return CUDA_ERROR_NOT_SUPPORTED;
	return CUDA_SUCCESS;
}

#define INJECT(name)                                    \
	do {                                            \
		CUresult r_ = injected(name);           \
		if (r_ != CUDA_SUCCESS)                 \
			return r_;                      \
	} while (0)

static int fd_of(CUmemGenericAllocationHandle h)
{
	return (int)h - 1;               /* handles are fd + 1: never 0 */
}

API CUresult cuGetErrorName(CUresult e, const char **s)
{
	*s = e == CUDA_SUCCESS ? "CUDA_SUCCESS"
	     : e == CUDA_ERROR_NOT_SUPPORTED ? "CUDA_ERROR_NOT_SUPPORTED"
	     : e == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY"
					      : "CUDA_ERROR_INVALID_VALUE";
	return CUDA_SUCCESS;
}

API CUresult cuGetErrorString(CUresult e, const char **s)
{
	*s = e == CUDA_ERROR_NOT_SUPPORTED ? "operation not supported (fakedrv)" : "fakedrv error";
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
	INJECT("cuDeviceGet");
	*d = ordinal;
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
	(void)d;
	INJECT("cuDeviceGetAttribute");
	switch (a) {
	case CU_DEVICE_ATTRIBUTE_MPS_ENABLED:
		*v = getenv("FAKEDRV_MPS") ? 1 : 0;
		break;
	case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT:
		*v = 132;
		break;
	case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
	case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
		*v = 1;
		break;
	default:
		*v = 0;
	}
	return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
	(void)d;
	strncpy(name, "fakedrv on simgpu", (size_t)len);
	name[len - 1] = 0;
	return CUDA_SUCCESS;
}

API CUresult cuCtxGetExecAffinity(CUexecAffinityParam *p, CUexecAffinityType t)
{
	(void)p;
	(void)t;
	return CUDA_ERROR_NOT_SUPPORTED;    /* as a context without affinity may answer */
}

API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *p,
					   CUmemAllocationGranularity_flags o)
{
	(void)p;
	(void)o;
	INJECT("cuMemGetAllocationGranularity");
	*g = 2 << 20;
	return CUDA_SUCCESS;
}

API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
			 const CUmemAllocationProp *p, unsigned long long flags)
{
	int fd;

	(void)flags;
	INJECT("cuMemCreate");
	if (p->requestedHandleTypes != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	fd = memfd_create("fakedrv", MFD_CLOEXEC);
	if (fd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	if (ftruncate(fd, (off_t)size) < 0) {
		close(fd);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	*h = (CUmemGenericAllocationHandle)fd + 1;
	return CUDA_SUCCESS;
}

API CUresult cuMemRelease(CUmemGenericAllocationHandle h)
{
	INJECT("cuMemRelease");
	return close(fd_of(h)) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
				 unsigned long long flags)
{
	void *p;

	(void)align;
	(void)flags;
	INJECT("cuMemAddressReserve");
	if (getenv("FAKEDRV_NO_HINT"))
		addr = 0;
	p = mmap((void *)addr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*ptr = (CUdeviceptr)p;
	return CUDA_SUCCESS;
}

API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
	INJECT("cuMemAddressFree");
	return munmap((void *)ptr, size) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t off, CUmemGenericAllocationHandle h,
		      unsigned long long flags)
{
	(void)flags;
	INJECT("cuMemMap");
	if (mmap((void *)ptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd_of(h),
		 (off_t)off) == MAP_FAILED)
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
	INJECT("cuMemUnmap");
	if (mmap((void *)ptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
		 -1, 0) == MAP_FAILED)
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *d, size_t n)
{
	(void)ptr;
	(void)size;
	(void)d;
	(void)n;
	INJECT("cuMemSetAccess");
	return CUDA_SUCCESS;
}

API CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle h,
					  CUmemAllocationHandleType t, unsigned long long flags)
{
	int fd;

	(void)flags;
	INJECT("cuMemExportToShareableHandle");
	if (t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	fd = dup(fd_of(h));          /* like the real one: a new fd, no close-on-exec */
	if (fd < 0)
		return CUDA_ERROR_OUT_OF_MEMORY;
	*(int *)out = fd;
	return CUDA_SUCCESS;
}

API CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *h, void *os,
					    CUmemAllocationHandleType t)
{
	int fd;

	INJECT("cuMemImportFromShareableHandle");
	if (t != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
		return CUDA_ERROR_NOT_SUPPORTED;
	fd = fcntl((int)(intptr_t)os, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		return CUDA_ERROR_INVALID_VALUE;
	*h = (CUmemGenericAllocationHandle)fd + 1;
	return CUDA_SUCCESS;
}

/* The one runtime function simgpu lacks: every name above, by dlsym. */
API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn,
						 unsigned int version, unsigned long long flags,
						 enum cudaDriverEntryPointQueryResult *status)
{
	(void)version;
	(void)flags;
	*fn = strncmp(symbol, "cu", 2) == 0 && strncmp(symbol, "cuda", 4) != 0
		      ? dlsym(RTLD_DEFAULT, symbol)
		      : NULL;
	if (status)
		*status = *fn ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
	return cudaSuccess;
}
