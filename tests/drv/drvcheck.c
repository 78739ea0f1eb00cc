/*
 * drvcheck.c - a CUDA driver-API program: a context, a module loaded from
 * a fat binary made by `nvcc -fatbin` (tests/drv/kernels.cu), launches
 * with cuLaunchKernel and cuLaunchKernelEx, copies in and out, memsets,
 * streams and events; it checks every result and prints its own counts.
 *
 * Linked with -lcuda (the toolkit's stub where there is one, else
 * simgpu's libcuda.so.1): on a GPU it runs on the real driver, on simgpu
 * on shim/lib/simgpu/libcuda.so.1 with its host twins in
 * bench/bin/drvcheck.twins.so.  The copies are made through pointers
 * from cuGetProcAddress, as a statically linked cudart makes them (and
 * the one place colocate's copy hooks reach them until shim/exports.txt
 * exports those hooks for direct -lcuda calls); the per-thread-stream
 * launch too.
 *
 * Usage: drvcheck [A B C [FATBIN]]   A saxpy, B scale, C add_i32 launches
 *        (default 3 4 2; FATBIN defaults to <this program>.fatbin)
 * Prints one JSON line:
 *   {"drvcheck":"PASS","launches":{"<name>":n,...},"h2d_bytes":n,
 *    "d2h_bytes":n,"d2d_bytes":n,"elapsed_ms":x}
 * or "drvcheck FAIL <what> (<CUresult name>)" and exits 1.
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../progs/readfile.h"

#define N     1000
#define BLOCK 128

static const char *K_SAXPY = "saxpy";
static const char *K_SCALE = "_Z5scalePffi";
static const char *K_ADD = "_Z7add_i32Piii";

static unsigned long long h2d, d2h, d2d;

typedef CUresult (*htod_t)(CUdeviceptr, const void *, size_t);
typedef CUresult (*dtoh_t)(void *, CUdeviceptr, size_t);
typedef CUresult (*dtod_t)(CUdeviceptr, CUdeviceptr, size_t);
typedef CUresult (*htod_async_t)(CUdeviceptr, const void *, size_t, CUstream);
typedef CUresult (*dtoh_async_t)(void *, CUdeviceptr, size_t, CUstream);
typedef CUresult (*launch_t)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
			     unsigned, unsigned, CUstream, void **, void **);

static htod_t htod;
static dtoh_t dtoh;
static dtod_t dtod;
static htod_async_t htod_async;
static dtoh_async_t dtoh_async;
static launch_t launch_ptsz;

static int fail(const char *what, CUresult r)
{
	const char *name = NULL;

	if (cuGetErrorName(r, &name) != CUDA_SUCCESS)
		name = "?";
	printf("drvcheck FAIL %s (%s)\n", what, name);
	return 1;
}

#define CHECK(call)                                   \
	do {                                          \
		CUresult r_ = (call);                 \
		if (r_ != CUDA_SUCCESS)               \
			return fail(#call, r_);       \
	} while (0)

static void *proc(const char *name, cuuint64_t flags)
{
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	void *fn = NULL;

	if (cuGetProcAddress(name, &fn, 13000, flags, &st) != CUDA_SUCCESS ||
	    st != CU_GET_PROC_ADDRESS_SUCCESS)
		return NULL;
	return fn;
}

int main(int argc, char **argv)
{
	int a = argc > 1 ? atoi(argv[1]) : 3;
	int b = argc > 2 ? atoi(argv[2]) : 4;
	int c = argc > 3 ? atoi(argv[3]) : 2;
	char path[4096], name[256];
	size_t len = 0, gsize = 0, free_b = 0, total_b = 0, off[3], sz[3];
	float *hx, *hy, *hy0, alpha = 0.5f, s = 1.5f, ms = -1;
	int *hp, n = N, v = 3, magic = 0, i, k, driver = 0, sms = 0;
	CUdevice dev;
	CUcontext ctx, cur;
	CUmodule mod, mod2;
	CUfunction f_saxpy, f_scale, f_add, f_tmp;
	CUdeviceptr dx, dy, dp, dz, gmagic, gtable;
	CUstream st;
	CUevent e0, start, stop;
	CUlaunchConfig cfg;
	CUlaunchAttribute attr;
	const char *fname;
	unsigned grid = (N + BLOCK - 1) / BLOCK;
	void *image;

	if (a < 0 || b < 0 || c < 1)
		return fail("launch counts: A, B >= 0 and C >= 1", CUDA_ERROR_INVALID_VALUE);
	if (argc > 4) {
		snprintf(path, sizeof(path), "%s", argv[4]);
	} else {
		ssize_t m = readlink("/proc/self/exe", path, sizeof(path) - 16);

		if (m <= 0)
			return fail("readlink /proc/self/exe", CUDA_ERROR_FILE_NOT_FOUND);
		strcpy(path + m, ".fatbin");
	}

	CHECK(cuInit(0));
	CHECK(cuDriverGetVersion(&driver));
	CHECK(cuDeviceGet(&dev, 0));
	CHECK(cuDeviceGetName(name, sizeof(name), dev));
	CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
	CHECK(cuDeviceTotalMem(&total_b, dev));
	if (driver < 12000 || sms <= 0 || total_b == 0)
		return fail("device queries", CUDA_ERROR_UNKNOWN);
	CHECK(cuCtxCreate(&ctx, NULL, 0, dev));
	CHECK(cuCtxGetCurrent(&cur));
	if (cur != ctx)
		return fail("cuCtxCreate made the context current", CUDA_ERROR_INVALID_CONTEXT);

	htod = (htod_t)proc("cuMemcpyHtoD", CU_GET_PROC_ADDRESS_DEFAULT);
	dtoh = (dtoh_t)proc("cuMemcpyDtoH", CU_GET_PROC_ADDRESS_DEFAULT);
	dtod = (dtod_t)proc("cuMemcpyDtoD", CU_GET_PROC_ADDRESS_DEFAULT);
	htod_async = (htod_async_t)proc("cuMemcpyHtoDAsync", CU_GET_PROC_ADDRESS_DEFAULT);
	dtoh_async = (dtoh_async_t)proc("cuMemcpyDtoHAsync", CU_GET_PROC_ADDRESS_DEFAULT);
	launch_ptsz = (launch_t)proc("cuLaunchKernel", CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
	if (!htod || !dtoh || !dtod || !htod_async || !dtoh_async || !launch_ptsz)
		return fail("cuGetProcAddress", CUDA_ERROR_NOT_FOUND);

	/* the module: from memory (freed at once: the driver keeps a copy) ... */
	image = test_read_file(path, &len);
	if (!image)
		return fail(path, CUDA_ERROR_FILE_NOT_FOUND);
	CHECK(cuModuleLoadData(&mod, image));
	memset(image, 0, len);
	free(image);
	CHECK(cuModuleGetFunction(&f_saxpy, mod, K_SAXPY));
	CHECK(cuModuleGetFunction(&f_scale, mod, K_SCALE));
	CHECK(cuModuleGetFunction(&f_add, mod, K_ADD));
	if (cuModuleGetFunction(&f_tmp, mod, "no_such_kernel") != CUDA_ERROR_NOT_FOUND)
		return fail("unknown kernel found", CUDA_ERROR_UNKNOWN);
	CHECK(cuFuncGetName(&fname, f_scale));
	if (strcmp(fname, K_SCALE) != 0)
		return fail("cuFuncGetName", CUDA_ERROR_UNKNOWN);
	/* ... and from the file, unloaded again: its functions die with it */
	CHECK(cuModuleLoad(&mod2, path));
	CHECK(cuModuleGetFunction(&f_tmp, mod2, K_SAXPY));
	CHECK(cuModuleUnload(mod2));
	if (cuModuleUnload(mod2) != CUDA_ERROR_INVALID_HANDLE)
		return fail("second cuModuleUnload", CUDA_ERROR_UNKNOWN);

	/* __device__ variables */
	CHECK(cuModuleGetGlobal(&gmagic, &gsize, mod, "magic"));
	if (gsize != sizeof(int))
		return fail("cuModuleGetGlobal size of magic", CUDA_ERROR_UNKNOWN);
	CHECK(dtoh(&magic, gmagic, sizeof(magic)));
	d2h += sizeof(magic);
	if (magic != 4242)
		return fail("initial value of magic", CUDA_ERROR_UNKNOWN);
	/* the same by the exported names a -lcuda program binds to
	 * (cuda.h makes them cuMemcpyHtoD_v2 / cuMemcpyDtoH_v2) */
	CHECK(cuMemcpyHtoD(gmagic, &magic, sizeof(magic)));
	h2d += sizeof(magic);
	magic = 0;
	CHECK(cuMemcpyDtoH(&magic, gmagic, sizeof(magic)));
	d2h += sizeof(magic);
	if (magic != 4242)
		return fail("magic after a direct round trip", CUDA_ERROR_UNKNOWN);
	CHECK(cuModuleGetGlobal(&gtable, &gsize, mod, "table"));
	if (gsize != 16 * sizeof(float))
		return fail("cuModuleGetGlobal size of table", CUDA_ERROR_UNKNOWN);

	/* memory: pageable x, pinned y and p */
	hx = malloc(N * sizeof(float));
	hy0 = malloc(N * sizeof(float));
	if (!hx || !hy0)
		return fail("malloc", CUDA_ERROR_OUT_OF_MEMORY);
	CHECK(cuMemAllocHost((void **)&hy, N * sizeof(float)));
	CHECK(cuMemAllocHost((void **)&hp, N * sizeof(int)));
	for (i = 0; i < N; i++) {
		hx[i] = (float)i;
		hy0[i] = hy[i] = (float)(N - i);
	}
	CHECK(cuMemAlloc(&dx, N * sizeof(float)));
	CHECK(cuMemAlloc(&dy, N * sizeof(float)));
	CHECK(cuMemAlloc(&dp, N * sizeof(int)));
	CHECK(cuMemAlloc(&dz, N * sizeof(float)));
	CHECK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
	CHECK(cuEventCreate(&e0, CU_EVENT_DISABLE_TIMING));
	CHECK(cuEventCreate(&start, CU_EVENT_DEFAULT));
	CHECK(cuEventCreate(&stop, CU_EVENT_DEFAULT));

	CHECK(htod(dx, hx, N * sizeof(float)));
	h2d += N * sizeof(float);
	CHECK(htod_async(dy, hy, N * sizeof(float), NULL));
	h2d += N * sizeof(float);
	/* 7 is not one byte repeated: the 32-bit pattern itself */
	CHECK(cuMemsetD32(dp, 7, N));
	CHECK(cuMemsetD8(dz, 0xff, N * sizeof(float)));

	/* saxpy on the legacy stream: y = a x + y, A times */
	{
		void *params[] = { &alpha, &dx, &dy, &n };

		for (k = 0; k < a; k++)
			CHECK(cuLaunchKernel(f_saxpy, grid, 1, 1, BLOCK, 1, 1, 0, NULL, params, NULL));
	}
	CHECK(cuEventRecord(e0, NULL));

	/* scale on a non-blocking stream, after saxpy (the event), timed */
	CHECK(cuStreamWaitEvent(st, e0, 0));
	memset(&cfg, 0, sizeof(cfg));
	memset(&attr, 0, sizeof(attr));
	attr.id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
	attr.value.priority = 0;
	cfg.gridDimX = grid;
	cfg.gridDimY = cfg.gridDimZ = 1;
	cfg.blockDimX = BLOCK;
	cfg.blockDimY = cfg.blockDimZ = 1;
	cfg.hStream = st;
	cfg.attrs = &attr;
	cfg.numAttrs = 1;
	CHECK(cuEventRecord(start, st));
	{
		void *params[] = { &dy, &s, &n };

		for (k = 0; k < b; k++)
			CHECK(cuLaunchKernelEx(&cfg, f_scale, params, NULL));
	}
	CHECK(cuEventRecord(stop, st));

	/* add_i32: once with a packed argument buffer, then on the
	 * per-thread default stream */
	{
		char buf[64];
		size_t bufsize = 0;
		void *extra[] = { CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE,
				  &bufsize, CU_LAUNCH_PARAM_END };
		void *params[] = { &dp, &v, &n };

		for (i = 0; i < 3; i++) {
			CHECK(cuFuncGetParamInfo(f_add, (size_t)i, &off[i], &sz[i]));
			if (off[i] + sz[i] > sizeof(buf))
				return fail("parameter layout", CUDA_ERROR_UNKNOWN);
		}
		memcpy(buf + off[0], &dp, sz[0]);
		memcpy(buf + off[1], &v, sz[1]);
		memcpy(buf + off[2], &n, sz[2]);
		bufsize = off[2] + sz[2];
		CHECK(cuLaunchKernel(f_add, grid, 1, 1, BLOCK, 1, 1, 0, NULL, NULL, extra));
		for (k = 1; k < c; k++)
			CHECK(launch_ptsz(f_add, grid, 1, 1, BLOCK, 1, 1, 0, NULL, params, NULL));
	}
	CHECK(cuCtxSynchronize());

	CHECK(cuEventSynchronize(stop));
	CHECK(cuEventElapsedTime(&ms, start, stop));
	if (ms < 0)
		return fail("elapsed time", CUDA_ERROR_UNKNOWN);

	/* results: y through pinned memory on the stream, p and z synchronously */
	memset(hy, 0, N * sizeof(float));
	CHECK(dtoh_async(hy, dy, N * sizeof(float), st));
	d2h += N * sizeof(float);
	CHECK(cuStreamSynchronize(st));
	if (cuStreamQuery(st) != CUDA_SUCCESS)
		return fail("cuStreamQuery after cuStreamSynchronize", CUDA_ERROR_NOT_READY);
	CHECK(dtoh(hp, dp, N * sizeof(int)));
	d2h += N * sizeof(int);
	{
		unsigned *hz = (unsigned *)hx;      /* x is not needed any more */

		CHECK(dtoh(hz, dz, N * sizeof(float)));
		d2h += N * sizeof(float);
		for (i = 0; i < N; i++)
			if (hz[i] != 0xffffffffu)
				return fail("cuMemsetD8", CUDA_ERROR_UNKNOWN);
		/* D2D: x again, then read back */
		CHECK(dtod(dz, dx, N * sizeof(float)));
		d2d += N * sizeof(float);
		CHECK(dtoh(hz, dz, N * sizeof(float)));
		d2h += N * sizeof(float);
		for (i = 0; i < N; i++)
			if (((float *)hz)[i] != (float)i)
				return fail("cuMemcpyDtoD", CUDA_ERROR_UNKNOWN);
	}
	for (i = 0; i < N; i++) {
		float want = hy0[i];

		for (k = 0; k < a; k++)
			want = alpha * (float)i + want;
		for (k = 0; k < b; k++)
			want *= s;
		if (hy[i] != want) {
			printf("drvcheck FAIL y[%d]=%g, want %g\n", i, hy[i], want);
			return 1;
		}
		if (hp[i] != 7 + c * v) {
			printf("drvcheck FAIL p[%d]=%d, want %d\n", i, hp[i], 7 + c * v);
			return 1;
		}
	}
	CHECK(cuMemGetInfo(&free_b, &total_b));
	if (free_b > total_b)
		return fail("cuMemGetInfo", CUDA_ERROR_UNKNOWN);

	/* teardown; a freed pointer is an error, not a crash */
	CHECK(cuEventDestroy(e0));
	CHECK(cuEventDestroy(start));
	CHECK(cuEventDestroy(stop));
	CHECK(cuStreamDestroy(st));
	CHECK(cuMemFree(dx));
	CHECK(cuMemFree(dy));
	CHECK(cuMemFree(dp));
	CHECK(cuMemFree(dz));
	if (cuMemFree(dz) == CUDA_SUCCESS)
		return fail("double cuMemFree", CUDA_ERROR_UNKNOWN);
	CHECK(cuMemFreeHost(hy));
	CHECK(cuMemFreeHost(hp));
	CHECK(cuModuleUnload(mod));
	CHECK(cuCtxDestroy(ctx));
	free(hx);
	free(hy0);

	printf("{\"drvcheck\":\"PASS\",\"device\":\"%s\",\"launches\":{\"%s\":%d,\"%s\":%d,"
	       "\"%s\":%d},\"h2d_bytes\":%llu,\"d2h_bytes\":%llu,\"d2d_bytes\":%llu,"
	       "\"elapsed_ms\":%.6f}\n",
	       name, K_SAXPY, a, K_SCALE, b, K_ADD, c, h2d, d2h, d2d, ms);
	return 0;
}
