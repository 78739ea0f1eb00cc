/*
 * drv.h - what the GPU probes share: whether a real NVIDIA device is here
 * at all, the driver functions they need, and the record of a failed call.
 *
 * Driver functions come from cudaGetDriverEntryPointByVersion, each at the
 * ABI version whose PFN_ typedef we use (cuCtxSynchronize, for one, changed
 * its signature in 13.0): no -lcuda, the probes link only the shared cudart
 * like every bench program, and they still load where no libcuda.so.1
 * exists.  cudaGetDriverEntryPointByVersion itself is looked up with dlsym
 * rather than linked, so that a runtime without it (an older simgpu, a
 * stub) fails with a reason instead of a loader error; simgpu's hands out
 * only its VMM emulation, and gpu_absent() says "simgpu" there.
 *
 * Define `static const char *NAME` (the probe's name, for stderr) first.
 */
#ifndef BENCH_GPU_DRV_H
#define BENCH_GPU_DRV_H

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* The first failure decides the report; every one is printed to stderr. */
struct fail {
	char call[64];          /* "" while nothing failed */
	char msg[400];
	int code;
};

static inline void fail_note(struct fail *f, const char *call, int code, const char *what)
{
	char name[64];
	size_t k = strcspn(call, "(");   /* "cudaFree(0)" -> "cudaFree" */

	if (k >= sizeof(name))
		k = sizeof(name) - 1;
	memcpy(name, call, k);
	name[k] = 0;
	fprintf(stderr, "%s: %s failed: %s\n", NAME, name, what);
	if (f->call[0])
		return;
	snprintf(f->call, sizeof(f->call), "%s", name);
	snprintf(f->msg, sizeof(f->msg), "%s: %s", name, what);
	f->code = code;
}

static inline void fail_rt(struct fail *f, const char *call, cudaError_t e)
{
	char what[256];

	snprintf(what, sizeof(what), "%s (%s)", cudaGetErrorName(e), cudaGetErrorString(e));
	fail_note(f, call, (int)e, what);
}

/* The driver functions, at the ABI version of each typedef. */
struct drv {
	PFN_cuGetErrorName_v6000 GetErrorName;
	PFN_cuGetErrorString_v6000 GetErrorString;
	PFN_cuDeviceGet_v2000 DeviceGet;
	PFN_cuDeviceGetAttribute_v2000 DeviceGetAttribute;
	PFN_cuDeviceGetName_v2000 DeviceGetName;
	PFN_cuCtxGetExecAffinity_v11040 CtxGetExecAffinity;
	PFN_cuMemGetAllocationGranularity_v10020 MemGetAllocationGranularity;
	PFN_cuMemCreate_v10020 MemCreate;
	PFN_cuMemRelease_v10020 MemRelease;
	PFN_cuMemAddressReserve_v10020 MemAddressReserve;
	PFN_cuMemAddressFree_v10020 MemAddressFree;
	PFN_cuMemMap_v10020 MemMap;
	PFN_cuMemUnmap_v10020 MemUnmap;
	PFN_cuMemSetAccess_v10020 MemSetAccess;
	PFN_cuMemExportToShareableHandle_v10020 MemExportToShareableHandle;
	PFN_cuMemImportFromShareableHandle_v10020 MemImportFromShareableHandle;
};

static const struct drv_sym {
	const char *name;
	unsigned int version;
	size_t off;
} DRV_SYMS[] = {
	{ "cuGetErrorName", 6000, offsetof(struct drv, GetErrorName) },
	{ "cuGetErrorString", 6000, offsetof(struct drv, GetErrorString) },
	{ "cuDeviceGet", 2000, offsetof(struct drv, DeviceGet) },
	{ "cuDeviceGetAttribute", 2000, offsetof(struct drv, DeviceGetAttribute) },
	{ "cuDeviceGetName", 2000, offsetof(struct drv, DeviceGetName) },
	{ "cuCtxGetExecAffinity", 11040, offsetof(struct drv, CtxGetExecAffinity) },
	{ "cuMemGetAllocationGranularity", 10020, offsetof(struct drv, MemGetAllocationGranularity) },
	{ "cuMemCreate", 10020, offsetof(struct drv, MemCreate) },
	{ "cuMemRelease", 10020, offsetof(struct drv, MemRelease) },
	{ "cuMemAddressReserve", 10020, offsetof(struct drv, MemAddressReserve) },
	{ "cuMemAddressFree", 10020, offsetof(struct drv, MemAddressFree) },
	{ "cuMemMap", 10020, offsetof(struct drv, MemMap) },
	{ "cuMemUnmap", 10020, offsetof(struct drv, MemUnmap) },
	{ "cuMemSetAccess", 10020, offsetof(struct drv, MemSetAccess) },
	{ "cuMemExportToShareableHandle", 10020, offsetof(struct drv, MemExportToShareableHandle) },
	{ "cuMemImportFromShareableHandle", 10020, offsetof(struct drv, MemImportFromShareableHandle) },
};

typedef cudaError_t (*entry_fn)(const char *, void **, unsigned int, unsigned long long,
				enum cudaDriverEntryPointQueryResult *);

static inline void fail_drv(struct fail *f, const struct drv *d, const char *call, CUresult r)
{
	const char *name = NULL, *str = NULL;
	char what[256];

	if (d->GetErrorName)
		d->GetErrorName(r, &name);
	if (d->GetErrorString)
		d->GetErrorString(r, &str);
	snprintf(what, sizeof(what), "%s (%s)", name ? name : "CUDA_ERROR_?", str ? str : "?");
	fail_note(f, call, (int)r, what);
}

/* 0 on success; otherwise note the failure and give -1.  Used as
 * `if (DCK(MemMap, ...)) goto out;` with locals F (struct fail *) and
 * D (struct drv *) in scope. */
static inline int dck(struct fail *f, const struct drv *d, const char *call, CUresult r)
{
	if (r == CUDA_SUCCESS)
		return 0;
	fail_drv(f, d, call, r);
	return -1;
}

static inline int rck(struct fail *f, const char *call, cudaError_t e)
{
	if (e == cudaSuccess)
		return 0;
	fail_rt(f, call, e);
	return -1;
}

#define DCK(fn, ...) dck(F, D, "cu" #fn, D->fn(__VA_ARGS__))
#define RCK(call) rck(F, #call, (call))

/* Fetch every function of the table syms (n entries) into the struct of
 * size bytes at base; 0, or -1 with the failure noted.  A probe with
 * functions of its own has a table of its own (green_probe). */
static inline int drv_load_syms(void *base, size_t size, const struct drv_sym *syms, size_t n,
				struct fail *f)
{
	entry_fn get = (entry_fn)dlsym(RTLD_DEFAULT, "cudaGetDriverEntryPointByVersion");

	memset(base, 0, size);
	if (!get) {
		fail_note(f, "cudaGetDriverEntryPointByVersion", -1, "not in this libcudart");
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		const struct drv_sym *s = &syms[i];
		enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
		void *fn = NULL;
		cudaError_t e = get(s->name, &fn, s->version, cudaEnableDefault, &q);
		char what[160];

		if (e != cudaSuccess) {
			snprintf(what, sizeof(what), "%s: %s (%s)", s->name, cudaGetErrorName(e),
				 cudaGetErrorString(e));
			fail_note(f, "cudaGetDriverEntryPointByVersion", (int)e, what);
			return -1;
		}
		if (q != cudaDriverEntryPointSuccess || !fn) {
			snprintf(what, sizeof(what), "%s at version %u: %s", s->name, s->version,
				 q == cudaDriverEntryPointVersionNotSufficent ? "driver too old"
									      : "symbol not found");
			fail_note(f, "cudaGetDriverEntryPointByVersion", (int)q, what);
			return -1;
		}
		memcpy((char *)base + s->off, &fn, sizeof(fn));
	}
	return 0;
}

/* Fetch every driver function of struct drv. */
static inline int drv_load(struct drv *d, struct fail *f)
{
	return drv_load_syms(d, sizeof(*d), DRV_SYMS, sizeof(DRV_SYMS) / sizeof(DRV_SYMS[0]), f);
}

/*
 * Is a real NVIDIA device here?  0 if so; 2 (the probes' exit code for
 * "nothing to measure": simgpu, no driver, no device) or 1 (a driver that
 * fails) with the reason in why.  Asked before any call that creates a
 * context.
 */
static inline int gpu_absent(char *why, size_t n)
{
	int drv_ver = 0, count = 0;
	cudaError_t e;

	/* simgpu hands out only its VMM emulation, not a driver to measure;
	 * the tests' pretend driver (bench/gpu/testdrv) exports the driver's
	 * calls by name, and then we go on */
	if (dlsym(RTLD_DEFAULT, "simgpu_quota_pct") && !dlsym(RTLD_DEFAULT, "cuMemCreate")) {
		snprintf(why, n, "simgpu: this libcudart.so.13 is the CPU test device, "
				 "not NVIDIA's runtime on a GPU; nothing measured");
		return 2;
	}
	e = cudaDriverGetVersion(&drv_ver);
	if (e != cudaSuccess || drv_ver == 0) {
		snprintf(why, n, "no NVIDIA driver: cudaDriverGetVersion gives %d (%s); nothing measured",
			 drv_ver, cudaGetErrorName(e));
		return 2;
	}
	e = cudaGetDeviceCount(&count);
	if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
		snprintf(why, n, "no usable CUDA device: cudaGetDeviceCount: %s (%s); nothing measured",
			 cudaGetErrorName(e), cudaGetErrorString(e));
		return 2;
	}
	if (e != cudaSuccess) {
		/* a driver is there but fails (an MPS daemon that refuses us, say):
		 * that is a finding, not "no GPU" */
		snprintf(why, n, "cudaGetDeviceCount: %s (%s)", cudaGetErrorName(e),
			 cudaGetErrorString(e));
		return 1;
	}
	if (count < 1) {
		snprintf(why, n, "no CUDA device; nothing measured");
		return 2;
	}
	return 0;
}

static inline double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

/* Median / percentile of a sorted array (nearest rank on [0, n-1]). */
static inline double pct_sorted(const double *v, int n, double p)
{
	int k;

	if (n <= 0)
		return NAN;
	k = (int)(p * (n - 1) + 0.5);
	return v[k < 0 ? 0 : k >= n ? n - 1 : k];
}

static inline int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

#endif
