// quota_probe: how long one kernel takes at this process's MPS SM
// percentage (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, read at context creation).
// Run once per percentage, each as its own MPS client, the times show
// whether the quota is real (bench/gpu_pool.py does that).
//
//   gpu-quota_probe [--n N] [--warmup W] [--iters K | --target-ms T]
//                   [--grid G] [--waves V] [--mem [--mb M]]
//
// Compute-bound (default): every thread runs 8 independent FMA chains of K
// steps (no memory traffic but one store per thread), with --grid blocks of
// 256 threads; without --grid, the SM count times the blocks of this kernel
// that fit one SM times --waves (4), so that the grid fills every SM several
// times.  Without --iters, K is calibrated so that one launch takes about
// --target-ms (5) ms here.  To compare percentages, run the 100 % client
// first and give every other one the same --iters and --grid (gpu_pool.py
// does): under MPS the SM count a client sees may follow its percentage,
// and a grid sized from it would change the work being timed.
//
// Memory-bound (--mem): y = a*x + b over two --mb MiB (512) buffers, far
// larger than the L2, by a grid-stride loop; also reports GB/s (bytes read
// plus written over the median time).
//
// W warm-up launches (3), then N timed launches (30), each between its own
// pair of events on one stream; the line gives the median, 10th and 90th
// percentiles.  A sample of the outputs is checked against the same float
// operations on the CPU (fmaf is exactly rounded on both: bit equality).
//
// Output: ONE JSON line on stdout, also when a call fails ("error" names
// it).  Exit 0: measured; 1: a call failed or the check failed; 2: no
// NVIDIA driver or device, or simgpu (nothing measured).
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *NAME = "quota_probe";

#include "drv.h"
#include "jsonline.h"
#include "args.h"
#include "fma.h"

#define PCT_ENV "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
#define BLOCK 256
#define MAX_N 10000
#define CHECK_SAMPLES 64

struct opts {
	int n, warmup, waves, mem;
	long long iters, grid, mb;
	double target_ms;
};

static struct {
	struct fail F;
	const char *quota_env;
	int driver_version, runtime_version, mps_enabled, sm_count, exec_sm, bps;
	char device[128];
	long long grid, iters, n_done;
	int calibrated, check_ok;
	double calib_ms, ctx_ms, median, p10, p90, vmin, vmax;
	const struct opts *o;
} R;

__host__ __device__ static inline float init_val(uint64_t i)
{
	return (float)(((uint32_t)i * 2654435761u) >> 16) * (1.0f / 65536.0f);
}

__global__ void quota_fma(float *out, long long iters)
{
	uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
	float x[CHAINS];

	fma_seed(x, t);
	out[t] = fma_run(x, iters);
}

__global__ void quota_init(float *x, uint64_t n)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		x[i] = init_val(i);
}

__global__ void quota_stream(const float4 *x, float4 *y, uint64_t n4)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n4;
	     i += (uint64_t)gridDim.x * blockDim.x) {
		float4 v = x[i];

		v.x = fmaf(v.x, FMA_A, FMA_B);
		v.y = fmaf(v.y, FMA_A, FMA_B);
		v.z = fmaf(v.z, FMA_A, FMA_B);
		v.w = fmaf(v.w, FMA_A, FMA_B);
		y[i] = v;
	}
}

/* One launch of the kernel being measured. */
static cudaError_t launch(float *a, float *b, uint64_t n4)
{
	if (R.o->mem)
		quota_stream<<<(unsigned int)R.grid, BLOCK>>>((const float4 *)a, (float4 *)b, n4);
	else
		quota_fma<<<(unsigned int)R.grid, BLOCK>>>(a, R.iters);
	return cudaGetLastError();
}

/* Time one launch between two events, in ms; NaN on failure (noted). */
static double time_one(struct fail *F, cudaEvent_t e0, cudaEvent_t e1, float *a, float *b,
		       uint64_t n4)
{
	float ms = 0;

	if (RCK(cudaEventRecord(e0, 0)) || RCK(launch(a, b, n4)) || RCK(cudaEventRecord(e1, 0)) ||
	    RCK(cudaEventSynchronize(e1)) || RCK(cudaEventElapsedTime(&ms, e0, e1)))
		return NAN;
	return ms;
}

static int report(int absent_rc, const char *absent_why)
{
	struct jl j;
	const struct opts *o = R.o;
	int measured = R.n_done > 0 && !isnan(R.median);

	jl_begin(&j);
	jl_str(&j, "probe", "quota");
	jl_str(&j, "kind", o->mem ? "memory" : "compute");
	jl_str(&j, "quota_env", R.quota_env);
	jl_bool(&j, "mps_enabled", R.mps_enabled);
	jl_str(&j, "device", R.device[0] ? R.device : NULL);
	jl_int(&j, "driver_version", R.driver_version);
	jl_int(&j, "runtime_version", R.runtime_version);
	jl_count(&j, "sm_count", R.sm_count);
	jl_count(&j, "exec_affinity_sm", R.exec_sm);
	jl_count(&j, "blocks_per_sm", R.bps);
	jl_count(&j, "grid", R.grid);
	jl_int(&j, "block", BLOCK);
	jl_count(&j, "iters", o->mem ? -1 : R.iters);
	jl_count(&j, "mb", o->mem ? o->mb : -1);
	jl_bool(&j, "calibrated", o->mem ? -1 : R.calibrated);
	jl_num(&j, "calib_ms", R.calib_ms);
	jl_int(&j, "n", R.n_done);
	jl_int(&j, "warmup", o->warmup);
	jl_num(&j, "median_ms", R.median);
	jl_num(&j, "p10_ms", R.p10);
	jl_num(&j, "p90_ms", R.p90);
	jl_num(&j, "min_ms", R.vmin);
	jl_num(&j, "max_ms", R.vmax);
	if (o->mem)
		jl_num(&j, "gbps", measured ? 2.0 * o->mb * (1 << 20) / (R.median * 1e-3) / 1e9 : NAN);
	else
		jl_num(&j, "gflops", measured ? 2.0 * CHAINS * R.iters * R.grid * BLOCK /
							(R.median * 1e-3) / 1e9
					      : NAN);
	jl_bool(&j, "check_ok", R.check_ok);
	jl_num(&j, "ctx_ms", R.ctx_ms);
	jl_str(&j, "error", absent_rc ? absent_why : R.F.call[0] ? R.F.msg : NULL);
	jl_str(&j, "error_call", absent_rc ? NULL : R.F.call[0] ? R.F.call : NULL);
	jl_print(&j);
	if (absent_rc)
		return absent_rc;
	return R.F.call[0] || R.check_ok != 1 || !measured ? 1 : 0;
}

/* K such that one launch takes about target_ms here. */
static int calibrate(struct fail *F, cudaEvent_t e0, cudaEvent_t e1, float *out)
{
	double ms = 0;

	for (R.iters = 16;; R.iters *= 4) {
		ms = time_one(F, e0, e1, out, NULL, 0);
		if (isnan(ms))
			return -1;
		if (ms >= R.o->target_ms / 4 || R.iters >= (1LL << 30))
			break;
	}
	if (ms > 0)
		R.iters = (long long)(R.iters * (R.o->target_ms / ms));
	if (R.iters < 1)
		R.iters = 1;
	R.calib_ms = ms;
	R.calibrated = 1;
	return 0;
}

static int check(struct fail *F, float *a, float *b, uint64_t n)
{
	uint64_t threads = (uint64_t)R.grid * BLOCK;
	int nsamp = CHECK_SAMPLES;

	/* the CPU replays K * 8 FMAs per sampled thread: bound it near 1e8 */
	if (!R.o->mem && R.iters * CHAINS * nsamp > 100000000LL)
		nsamp = (int)(100000000LL / (R.iters * CHAINS)) + 2;
	for (int s = 0; s < nsamp; s++) {
		float got, want;

		if (R.o->mem) {
			/* first, last and spread over the buffer */
			uint64_t i = s == nsamp - 1 ? n - 1 : n / nsamp * s + s;

			if (RCK(cudaMemcpy(&got, b + i, sizeof(got), cudaMemcpyDeviceToHost)))
				return -1;
			want = fmaf(init_val(i), FMA_A, FMA_B);
		} else {
			uint64_t t = s == nsamp - 1 ? threads - 1 : threads / nsamp * s + s;

			if (RCK(cudaMemcpy(&got, a + t, sizeof(got), cudaMemcpyDeviceToHost)))
				return -1;
			want = host_fma_thread((uint32_t)t, R.iters);
		}
		if (memcmp(&got, &want, sizeof(got)) != 0) {
			char what[160];

			snprintf(what, sizeof(what), "sample %d: got %.9g, want %.9g", s, got, want);
			fail_note(F, "check", -1, what);
			R.check_ok = 0;
			return -1;
		}
	}
	R.check_ok = 1;
	return 0;
}

static int run(const struct opts *o)
{
	struct drv Dv, *D = &Dv;
	struct fail *F = &R.F;
	CUdevice dev;
	CUexecAffinityParam ea;
	cudaEvent_t *ev = NULL;
	float *a = NULL, *b = NULL;
	double *ms = NULL, t0;
	uint64_t n = 0;
	char why[256];
	int rc, nev = 0;

	R.o = o;
	R.quota_env = getenv(PCT_ENV);
	R.mps_enabled = R.sm_count = R.exec_sm = R.bps = R.check_ok = -1;
	R.grid = R.iters = -1;
	R.calibrated = o->mem ? -1 : o->iters > 0 ? 0 : -1;
	R.calib_ms = R.ctx_ms = R.median = R.p10 = R.p90 = R.vmin = R.vmax = NAN;
	cudaDriverGetVersion(&R.driver_version);     /* 0 without a driver: reported */
	cudaRuntimeGetVersion(&R.runtime_version);
	rc = gpu_absent(why, sizeof(why));
	if (rc)
		return report(rc, why);
	if (drv_load(D, F))
		goto out;
	t0 = now_us();
	if (RCK(cudaSetDevice(0)) || RCK(cudaFree(0)))     /* the percentage is read here */
		goto out;
	R.ctx_ms = (now_us() - t0) / 1e3;
	if (DCK(DeviceGet, &dev, 0) ||
	    DCK(DeviceGetAttribute, &R.mps_enabled, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, dev) ||
	    DCK(DeviceGetName, R.device, (int)sizeof(R.device), dev) ||
	    RCK(cudaDeviceGetAttribute(&R.sm_count, cudaDevAttrMultiProcessorCount, 0)))
		goto out;
	if (D->CtxGetExecAffinity(&ea, CU_EXEC_AFFINITY_TYPE_SM_COUNT) == CUDA_SUCCESS)
		R.exec_sm = (int)ea.param.smCount.val;     /* optional: no answer is no failure */
	if (o->mem) {
		if (RCK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&R.bps, quota_stream, BLOCK, 0)))
			goto out;
	} else if (RCK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&R.bps, quota_fma, BLOCK, 0))) {
		goto out;
	}
	R.grid = o->grid > 0 ? o->grid : (long long)R.sm_count * R.bps * o->waves;
	if (R.grid < 1 || R.grid > 0x7fffffffLL) {
		fail_note(F, "grid", -1, "grid size out of range");
		goto out;
	}

	if (o->mem) {
		n = (uint64_t)o->mb * (1 << 20) / sizeof(float);
		if (RCK(cudaMalloc(&a, n * sizeof(float))) || RCK(cudaMalloc(&b, n * sizeof(float))))
			goto out;
		quota_init<<<(unsigned int)R.grid, BLOCK>>>(a, n);
		if (RCK(cudaGetLastError()) || RCK(cudaMemset(b, 0xff, n * sizeof(float))) ||
		    RCK(cudaDeviceSynchronize()))
			goto out;
	} else if (RCK(cudaMalloc(&a, (size_t)R.grid * BLOCK * sizeof(float))) ||
		   RCK(cudaMemset(a, 0xff, (size_t)R.grid * BLOCK * sizeof(float)))) {
		goto out;
	}

	ev = (cudaEvent_t *)calloc(2 * (size_t)o->n, sizeof(cudaEvent_t));
	ms = (double *)calloc((size_t)o->n, sizeof(double));
	if (!ev || !ms) {
		fail_note(F, "calloc", ENOMEM, "no memory for the events");
		goto out;
	}
	for (; nev < 2 * o->n; nev++)
		if (RCK(cudaEventCreate(&ev[nev])))
			goto out;
	if (!o->mem) {
		/* one tiny launch first: lazy module loading would otherwise
		 * land inside the first calibration time */
		R.iters = 1;
		if (RCK(launch(a, b, 0)) || RCK(cudaDeviceSynchronize()))
			goto out;
		R.iters = o->iters;
		if (o->iters <= 0 && calibrate(F, ev[0], ev[1], a))
			goto out;
	}
	for (int i = 0; i < o->warmup; i++)
		if (RCK(launch(a, b, n / 4)))
			goto out;
	/* poison the output again: the check must see the timed launches' work */
	if (RCK(cudaMemset(o->mem ? b : a, 0xff,
			   o->mem ? n * sizeof(float) : (size_t)R.grid * BLOCK * sizeof(float))) ||
	    RCK(cudaDeviceSynchronize()))
		goto out;

	/* all launches queued back to back: each pair of events brackets one */
	for (int i = 0; i < o->n; i++)
		if (RCK(cudaEventRecord(ev[2 * i], 0)) || RCK(launch(a, b, n / 4)) ||
		    RCK(cudaEventRecord(ev[2 * i + 1], 0)))
			goto out;
	if (RCK(cudaDeviceSynchronize()))
		goto out;
	for (int i = 0; i < o->n; i++) {
		float t;

		if (RCK(cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1])))
			goto out;
		ms[i] = t;
		R.n_done = i + 1;
	}
	qsort(ms, (size_t)R.n_done, sizeof(double), cmp_double);
	R.median = pct_sorted(ms, (int)R.n_done, 0.5);
	R.p10 = pct_sorted(ms, (int)R.n_done, 0.1);
	R.p90 = pct_sorted(ms, (int)R.n_done, 0.9);
	R.vmin = ms[0];
	R.vmax = ms[R.n_done - 1];
	check(F, a, b, n);
out:
	for (int i = 0; i < nev; i++)
		cudaEventDestroy(ev[i]);
	/* freeing is clean-up: its failure is printed, the report is kept */
	if (a && cudaFree(a) != cudaSuccess)
		fprintf(stderr, "%s: cudaFree failed\n", NAME);
	if (b && cudaFree(b) != cudaSuccess)
		fprintf(stderr, "%s: cudaFree failed\n", NAME);
	free(ev);
	free(ms);
	return report(0, NULL);
}

static void usage(void)
{
	fprintf(stderr, "usage: gpu-quota_probe [--n N] [--warmup W] [--iters K | --target-ms T] "
			"[--grid G] [--waves V] [--mem [--mb M]]\n"
			"  one JSON line on stdout; exit 0 measured, 1 a call failed, "
			"2 no device (or simgpu)\n");
}


int main(int argc, char **argv)
{
	struct opts o;
	long long v = 0;

	memset(&o, 0, sizeof(o));
	o.n = 30;
	o.warmup = 3;
	o.waves = 4;
	o.mb = 512;
	o.target_ms = 5;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int bad = 0;

		if (!strcmp(a, "--n"))
			bad = arg_ll(argc, argv, &i, 1, MAX_N, &v), o.n = (int)v;
		else if (!strcmp(a, "--warmup"))
			bad = arg_ll(argc, argv, &i, 0, 1000, &v), o.warmup = (int)v;
		else if (!strcmp(a, "--iters"))
			bad = arg_ll(argc, argv, &i, 1, 1LL << 40, &v), o.iters = v;
		else if (!strcmp(a, "--target-ms"))
			bad = arg_ll(argc, argv, &i, 1, 10000, &v), o.target_ms = (double)v;
		else if (!strcmp(a, "--grid"))
			bad = arg_ll(argc, argv, &i, 1, 0x7fffffffLL, &v), o.grid = v;
		else if (!strcmp(a, "--waves"))
			bad = arg_ll(argc, argv, &i, 1, 1000, &v), o.waves = (int)v;
		else if (!strcmp(a, "--mb"))
			bad = arg_ll(argc, argv, &i, 1, 16384, &v), o.mb = v;
		else if (!strcmp(a, "--mem"))
			o.mem = 1;
		else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage();
			return 0;
		} else
			bad = 1;
		if (bad) {
			struct jl j;
			char why[160];

			snprintf(why, sizeof(why), "bad argument %s", a);
			fprintf(stderr, "%s: %s\n", NAME, why);
			usage();
			jl_begin(&j);
			jl_str(&j, "probe", "quota");
			jl_str(&j, "error", why);
			jl_print(&j);
			return 1;
		}
	}
	return run(&o);
}
