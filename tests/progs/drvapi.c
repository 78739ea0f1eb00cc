/*
 * drvapi.c - talks to the CUDA driver exactly the way cudart and CuPy do,
 * to test driver-level interception:
 *
 *   - dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), then everything through
 *     dlsym(h, "cuGetProcAddress_v2"), as cudart does;
 *   - cuLaunchKernel once more by plain dlsym(h, "cuLaunchKernel"), as CuPy;
 *   - cuGetProcAddress asked for itself, and the answer used;
 *   - cuGetExportTable through cuGetProcAddress (must pass through);
 *   - launches of add_one through the default-stream pointer (A times), the
 *     per-thread-default-stream pointer (B times) and the dlsym pointer
 *     (C times), plus one cuLibraryLoadData / cuLibraryGetKernel /
 *     cuKernelGetFunction / cuLaunchKernelEx launch.
 *
 * Usage: test-drvapi [A B C]   (default 5 3 4)
 * Prints "DRVAPI launches=<n> allocs=<n> PASS", or "DRVAPI FAIL <why>" and
 * exits 1.  The module is "<this program>.fatbin" (bench/bin/test-drvapi.fatbin,
 * made by `nvcc -fatbin` from tests/drv/drvapi_kernels.cu: add_one, scale2),
 * or the file $DRVAPI_FATBIN; on simgpu's libcuda.so.1 its kernels run as
 * the host twins of bench/bin/test-drvapi.twins.so.
 */
#include <cuda.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "readfile.h"

#define N 256

typedef CUresult (*getproc_v2_t)(const char *, void **, int, cuuint64_t,
				 CUdriverProcAddressQueryResult *);
typedef CUresult (*init_t)(unsigned int);
typedef CUresult (*version_t)(int *);
typedef CUresult (*device_get_t)(CUdevice *, int);
typedef CUresult (*retain_t)(CUcontext *, CUdevice);
typedef CUresult (*set_current_t)(CUcontext);
typedef CUresult (*module_load_t)(CUmodule *, const void *);
typedef CUresult (*module_func_t)(CUfunction *, CUmodule, const char *);
typedef CUresult (*mem_alloc_t)(CUdeviceptr *, size_t);
typedef CUresult (*mem_free_t)(CUdeviceptr);
typedef CUresult (*htod_t)(CUdeviceptr, const void *, size_t);
typedef CUresult (*dtoh_t)(void *, CUdeviceptr, size_t);
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
			     unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*launch_ex_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*lib_load_t)(CUlibrary *, const void *, CUjit_option *, void **, unsigned,
			       CUlibraryOption *, void **, unsigned);
typedef CUresult (*lib_kernel_t)(CUkernel *, CUlibrary, const char *);
typedef CUresult (*kernel_func_t)(CUfunction *, CUkernel);
typedef CUresult (*export_table_t)(const void **, const CUuuid *);

static getproc_v2_t getproc;

/* The fat binary: $DRVAPI_FATBIN, else <this program>.fatbin; NULL if unreadable. */
static void *read_image(void)
{
	const char *env = getenv("DRVAPI_FATBIN");
	char path[4096];

	if (env && *env) {
		snprintf(path, sizeof(path), "%s", env);
	} else {
		ssize_t m = readlink("/proc/self/exe", path, sizeof(path) - 8);

		if (m <= 0)
			return NULL;
		strcpy(path + m, ".fatbin");
	}
	return test_read_file(path, NULL);
}

static int fail(const char *why, int rc)
{
	printf("DRVAPI FAIL %s (%d)\n", why, rc);
	return 1;
}

/* cuGetProcAddress_v2 for `name`, or NULL (and a message). */
static void *proc(const char *name, int version, cuuint64_t flags)
{
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	void *fn = NULL;
	CUresult rc = getproc(name, &fn, version, flags, &st);

	if (rc != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS || !fn) {
		printf("DRVAPI FAIL cuGetProcAddress(%s) rc=%d status=%d\n", name, (int)rc, (int)st);
		return NULL;
	}
	return fn;
}

#define PROC(var, type, name, version, flags)                    \
	type var = (type)proc(name, version, flags);             \
	if (!var)                                                \
		return 1

int main(int argc, char **argv)
{
	void *image;
	int a = argc > 1 ? atoi(argv[1]) : 5;
	int b = argc > 2 ? atoi(argv[2]) : 3;
	int c = argc > 3 ? atoi(argv[3]) : 4;
	int n = N, i, launches = 0, allocs = 0, version = 0;
	float host[N];
	CUdeviceptr dp;
	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction fn, lib_fn;
	CUlibrary lib;
	CUkernel kern;
	CUlaunchConfig cfg;
	CUuuid uuid;
	const void *table = NULL;
	void *params[2] = { &dp, &n };
	void *h, *unknown = (void *)1;
	CUdriverProcAddressQueryResult st;
	CUresult rc;

	if (a < 0 || b < 0 || c < 0)
		return fail("launch counts must be >= 0", 0);
	h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (!h)
		return fail(dlerror(), 0);
	getproc = (getproc_v2_t)dlsym(h, "cuGetProcAddress_v2");
	if (!getproc)
		return fail("no cuGetProcAddress_v2", 0);

	PROC(cu_init, init_t, "cuInit", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
	PROC(cu_device_get, device_get_t, "cuDeviceGet", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
	PROC(cu_retain, retain_t, "cuDevicePrimaryCtxRetain", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
	PROC(cu_set_current, set_current_t, "cuCtxSetCurrent", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
	PROC(cu_module_load, module_load_t, "cuModuleLoadData", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
	PROC(cu_module_func, module_func_t, "cuModuleGetFunction", 12000,
	     CU_GET_PROC_ADDRESS_DEFAULT);
	PROC(cu_mem_alloc, mem_alloc_t, "cuMemAlloc", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
	PROC(cu_mem_free, mem_free_t, "cuMemFree", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
	PROC(cu_htod, htod_t, "cuMemcpyHtoD", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
	PROC(cu_dtoh, dtoh_t, "cuMemcpyDtoH", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
	PROC(cu_launch, launch_t, "cuLaunchKernel", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
	PROC(cu_launch_ptsz, launch_t, "cuLaunchKernel", 12000,
	     CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
	PROC(cu_launch_ex, launch_ex_t, "cuLaunchKernelEx", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
	PROC(cu_lib_load, lib_load_t, "cuLibraryLoadData", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
	PROC(cu_lib_kernel, lib_kernel_t, "cuLibraryGetKernel", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
	PROC(cu_kernel_func, kernel_func_t, "cuKernelGetFunction", 12000,
	     CU_GET_PROC_ADDRESS_DEFAULT);
	PROC(cu_export, export_table_t, "cuGetExportTable", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
	PROC(cu_getproc, getproc_v2_t, "cuGetProcAddress", 12000, CU_GET_PROC_ADDRESS_DEFAULT);
	launch_t cu_launch_dlsym = (launch_t)dlsym(h, "cuLaunchKernel");   /* as CuPy */

	if (!cu_launch_dlsym)
		return fail("dlsym cuLaunchKernel", 0);

	/* the cuGetProcAddress we were handed must work too */
	{
		version_t cu_version = NULL;

		st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
		rc = cu_getproc("cuDriverGetVersion", (void **)&cu_version, 12000,
				CU_GET_PROC_ADDRESS_DEFAULT, &st);
		if (rc != CUDA_SUCCESS || !cu_version)
			return fail("cuGetProcAddress via itself", rc);
		rc = cu_version(&version);
		if (rc != CUDA_SUCCESS || version < 12000)
			return fail("cuDriverGetVersion", rc);
	}
	/* unknown names are not found */
	st = CU_GET_PROC_ADDRESS_SUCCESS;
	rc = getproc("cuNoSuchFunction", &unknown, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
	if (rc != CUDA_ERROR_NOT_FOUND || st != CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)
		return fail("unknown symbol found", rc);

	if ((rc = cu_init(0)) != CUDA_SUCCESS)
		return fail("cuInit", rc);
	if ((rc = cu_device_get(&dev, 0)) != CUDA_SUCCESS)
		return fail("cuDeviceGet", rc);
	if ((rc = cu_retain(&ctx, dev)) != CUDA_SUCCESS)
		return fail("cuDevicePrimaryCtxRetain", rc);
	if ((rc = cu_set_current(ctx)) != CUDA_SUCCESS)
		return fail("cuCtxSetCurrent", rc);
	/* passed through: the driver's own answer (simgpu's has no tables) */
	memset(&uuid, 0, sizeof(uuid));
	rc = cu_export(&table, &uuid);
	if (!(rc == CUDA_SUCCESS && table) && rc != CUDA_ERROR_NOT_SUPPORTED)
		return fail("cuGetExportTable", rc);
	{
		export_table_t direct = (export_table_t)dlsym(h, "cuGetExportTable");
		const void *t2 = NULL;

		if (!direct || direct(&t2, &uuid) != rc || t2 != table)
			return fail("cuGetExportTable not passed through", rc);
	}

	image = read_image();
	if (!image)
		return fail("cannot read the fat binary (DRVAPI_FATBIN, <program>.fatbin)", 0);

	if ((rc = cu_module_load(&mod, image)) != CUDA_SUCCESS)
		return fail("cuModuleLoadData", rc);
	if ((rc = cu_module_func(&fn, mod, "add_one")) != CUDA_SUCCESS)
		return fail("cuModuleGetFunction", rc);
	if ((rc = cu_mem_alloc(&dp, sizeof(host))) != CUDA_SUCCESS)
		return fail("cuMemAlloc", rc);
	allocs++;
	for (i = 0; i < N; i++)
		host[i] = (float)i;
	if ((rc = cu_htod(dp, host, sizeof(host))) != CUDA_SUCCESS)
		return fail("cuMemcpyHtoD", rc);

	for (i = 0; i < a; i++, launches++)
		if ((rc = cu_launch(fn, 1, 1, 1, N, 1, 1, 0, NULL, params, NULL)) != CUDA_SUCCESS)
			return fail("cuLaunchKernel", rc);
	for (i = 0; i < b; i++, launches++)
		if ((rc = cu_launch_ptsz(fn, 1, 1, 1, N, 1, 1, 0, NULL, params, NULL)) !=
		    CUDA_SUCCESS)
			return fail("cuLaunchKernel_ptsz", rc);
	for (i = 0; i < c; i++, launches++)
		if ((rc = cu_launch_dlsym(fn, 1, 1, 1, N, 1, 1, 0, NULL, params, NULL)) !=
		    CUDA_SUCCESS)
			return fail("dlsym cuLaunchKernel", rc);

	/* the CUDA 12 library path, launched with a config struct */
	if ((rc = cu_lib_load(&lib, image, NULL, NULL, 0, NULL, NULL, 0)) != CUDA_SUCCESS)
		return fail("cuLibraryLoadData", rc);
	if ((rc = cu_lib_kernel(&kern, lib, "add_one")) != CUDA_SUCCESS)
		return fail("cuLibraryGetKernel", rc);
	if ((rc = cu_kernel_func(&lib_fn, kern)) != CUDA_SUCCESS)
		return fail("cuKernelGetFunction", rc);
	memset(&cfg, 0, sizeof(cfg));
	cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
	cfg.blockDimX = N;
	cfg.blockDimY = cfg.blockDimZ = 1;
	if ((rc = cu_launch_ex(&cfg, lib_fn, params, NULL)) != CUDA_SUCCESS)
		return fail("cuLaunchKernelEx", rc);
	launches++;

	if ((rc = cu_dtoh(host, dp, sizeof(host))) != CUDA_SUCCESS)
		return fail("cuMemcpyDtoH", rc);
	for (i = 0; i < N; i++)
		if (host[i] != (float)(i + launches)) {
			printf("DRVAPI FAIL x[%d]=%g, want %d\n", i, host[i], i + launches);
			return 1;
		}
	if ((rc = cu_mem_free(dp)) != CUDA_SUCCESS)
		return fail("cuMemFree", rc);
	free(image);
	printf("DRVAPI launches=%d allocs=%d PASS\n", launches, allocs);
	return 0;
}
