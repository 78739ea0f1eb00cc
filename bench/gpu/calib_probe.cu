// calib_probe: one role of the device model's calibration run, measured
// on a real GPU and reported as ONE JSON line.
// bench/calibrate.py starts several of these at once (each its own process,
// so each its own MPS client at its own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)
// and fits simgpu's model parameters (shim/simgpu/simgpu_model.h) to what
// they report.
//
//   gpu-calib_probe --kind compute|memory|fewblock|copy|slice
//                   [--blocks B] [--threads T] [--smem BYTES]
//                   [--iters K | --target-ms T] [--mb M]
//                   [--launches N | --duration S] [--warmup W]
//                   [--start-at T] [--dir h2d|d2h]
//                   [--method timer|events] [--gap-us G] [--tick-us U]
//                   [--tick-ref-us R] [--allow-sim]
//
// Kernels (what the model calls a task: blocks x threads, registers per
// thread, shared memory per block, flops, bytes):
//
//   compute   every thread runs 8 independent FMA chains of K steps (no
//             memory traffic but one 4-byte store per thread at the end);
//             default grid: SMs x resident blocks per SM x 2 (two waves)
//   memory    y = a*x + b over two --mb MiB buffers (512: far larger than
//             the 50 MB L2), by a grid-stride loop of float4, K passes
//             (alternately a->b and b->a); default grid: one wave
//   fewblock  the compute kernel on a small grid (default 8 blocks): it
//             holds a few SMs for long, as a latency-bound co-runner does
//
// --smem BYTES gives every block that much dynamic shared memory, really
// allocated (cudaFuncSetAttribute past 48 KiB) and touched (written, a
// barrier, read into the result), so that it limits residency as the
// model's occupancy rules say.  Without --iters, K is calibrated here so
// that one launch takes about --target-ms (5) ms; to compare runs, give
// every later run the K and the grid the first one reported (calibrate.py
// does).  flops and bytes in the line are what the kernel really does per
// launch (an FMA counts 2 flops; bytes are global-memory reads + writes).
//
// Timing: W warm-up launches (2), then the timed section: launches back to
// back on one stream, each between its own pair of events, at most 4 in
// flight so that the device never idles between them; the line gives the
// median, mean, 10th and 90th percentile, min and max of one launch (us).
// Next to a co-runner the times can be bimodal (launches in step with the
// co-runner's, or not), where the mean is the steadier figure.
// --launches N (20) stops after N; --duration S keeps launching for S
// seconds (a co-runner: it must outlast the process it disturbs) and
// SIGTERM or SIGINT ends it early, still reporting.  --start-at T (CLOCK_REALTIME seconds) holds
// the timed section until then, after context, buffers, calibration and
// warm-up, so that processes started apart begin together; "late_s" says
// how late this one was.  t_start / t_end (CLOCK_REALTIME) bound the timed
// section, so calibrate.py can check that a co-runner covered it.
//
//   copy      cudaMemcpyAsync of --mb MiB (64) pinned host memory to the
//             device (--dir h2d) or back (d2h), timed like a kernel; the
//             line gives GB/s of the median copy ("gbs") and over the whole
//             timed section ("gbs_span")
//   slice     time slicing without MPS: run it in two processes at once.
//             --method timer (default): ONE long kernel (one thread) reads
//             %globaltimer in a loop for --duration S (1) seconds and
//             notes every jump of more than --gap-us (5) us between two
//             reads: the time the context was switched out.  Runs are the
//             spans between gaps (the first and last, cut by start and
//             end, left out); the line gives their median ("run_us", the
//             slice) and the gaps' median ("gap_us": the other context's
//             slice plus two switches).  --method events: short kernels of
//             about --tick-us (100) us back to back for S seconds, an event
//             after each; an interval between completions longer than a
//             tick by more than --gap-us is a gap, where a tick is the
//             median interval or, better, --tick-ref-us R: a tick's time
//             alone (measured apart: calibrated next to the other context,
//             K would count its slices too; so give both --iters).  The
//             events method is the one simgpu can time (no %globaltimer on
//             the CPU device).
//
// simgpu (our CPU model of an H100) is detected as drv.h does; there the
// probe exits 2 unless --allow-sim is given, which lets the tests and
// `calibrate.py sim` run every role on the model (with cost twins for its
// kernels from $SIMGPU_TWINS: calibrate.py builds them).
//
// Output: ONE JSON line on stdout, also when a call fails ("error" names
// it).  Exit 0: measured; 1: a call failed or nothing could be timed; 2: no
// NVIDIA driver or device, or simgpu without --allow-sim (nothing measured).
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *NAME = "calib_probe";

#include "drv.h"
#include "jsonline.h"
#include "args.h"
#include "fma.h"

#define PCT_ENV "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
#define DEPTH 4                  /* launches in flight in the timed section */
#define MAX_TIMES (1 << 20)      /* per-launch times kept (--duration runs) */
#define MAX_GAPS (1 << 16)       /* slice: gaps the timer kernel records */
#define SMEM_DEFAULT_MAX (48 * 1024)

enum kind { K_COMPUTE, K_MEMORY, K_FEWBLOCK, K_COPY, K_SLICE };
static const char *const KIND_NAMES[] = { "compute", "memory", "fewblock", "copy", "slice" };

struct opts {
	enum kind kind;
	long long blocks, threads, smem, iters, mb, launches, warmup;
	double target_ms, duration, start_at, gap_us, tick_us, tick_ref_us;
	int d2h, events, allow_sim, have_duration;
};

static struct {
	struct fail F;
	const struct opts *o;
	const char *quota_env;
	int driver_version, runtime_version, mps_enabled, sm_count, bps, regs, sim;
	long long smem_static, blocks, iters, n_done;
	char device[256];
	int calibrated;
	double calib_ms, ctx_ms, late_s, t_start, t_end, span_ms;
	double median, mean, p10, p90, vmin, vmax, flops, bytes;
	/* slice */
	long long n_gaps, n_runs, samples;
	double run_us, gap_us, run_p10, run_p90, gap_p10, gap_p90, sample_ns, tick_med_us;
} R;

static volatile sig_atomic_t stop_flag;

static void on_stop(int sig)
{
	(void)sig;
	stop_flag = 1;
}

static double real_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sleep, then spin, until CLOCK_REALTIME t; how late we were (0 if not). */
static double wait_until(double t)
{
	double now = real_s();

	if (t <= 0)
		return 0;
	if (now > t)
		return now - t;
	if (t - now > 0.003) {
		double d = t - now - 0.002;
		struct timespec ts = { (time_t)d, (long)((d - (double)(time_t)d) * 1e9) };

		while (nanosleep(&ts, &ts) == -1 && errno == EINTR && !stop_flag)
			;
	}
	while (real_s() < t && !stop_flag)
		;
	return 0;
}

/* ---------------------------------------------------------------- kernels */

/* Write every word of the block's dynamic shared memory, then read one
 * back: the allocation is used, not only reserved. */
__device__ static inline float touch_smem(int words)
{
	extern __shared__ float sm[];

	if (words <= 0)
		return 0.0f;
	for (int i = threadIdx.x; i < words; i += blockDim.x)
		sm[i] = seed((uint32_t)i, 0);
	__syncthreads();
	return sm[(threadIdx.x * 7u) % (unsigned)words] * 1e-6f;
}

__global__ void calib_fma(float *out, long long iters, int smem_words)
{
	uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
	float x[CHAINS];

	fma_seed(x, t);
	x[0] += touch_smem(smem_words);
	out[t] = fma_run(x, iters);
}

__global__ void calib_stream(float4 *a, float4 *b, uint64_t n4, long long passes, int smem_words)
{
	float extra = touch_smem(smem_words);

	for (long long p = 0; p < passes; p++) {
		const float4 *src = (p & 1) ? b : a;
		float4 *dst = (p & 1) ? a : b;

		for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n4;
		     i += (uint64_t)gridDim.x * blockDim.x) {
			float4 v = src[i];

			v.x = fmaf(v.x, FMA_A, FMA_B) + extra;
			v.y = fmaf(v.y, FMA_A, FMA_B);
			v.z = fmaf(v.z, FMA_A, FMA_B);
			v.w = fmaf(v.w, FMA_A, FMA_B);
			dst[i] = v;
		}
	}
}

__global__ void calib_fill(float *x, uint64_t n)
{
	for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
	     i += (uint64_t)gridDim.x * blockDim.x)
		x[i] = (float)(((uint32_t)i * 2654435761u) >> 16) * (1.0f / 65536.0f);
}

__device__ static inline unsigned long long globaltimer(void)
{
	unsigned long long t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/*
 * One thread reads the global timer (ns) until dur_ns have passed; every
 * jump of more than thr_ns between two reads is a gap, recorded as the pair
 * (last read before, first read after).  info: first read, last read,
 * reads, gaps (all of them, also past max).
 */
__global__ void calib_slice(unsigned long long *gaps, unsigned long long *info,
			    unsigned long long dur_ns, unsigned long long thr_ns, int max)
{
	unsigned long long t0, prev, t, reads = 0, n = 0;

	if (threadIdx.x || blockIdx.x)
		return;
	t0 = prev = globaltimer();
	for (;;) {
		t = globaltimer();
		reads++;
		if (t - prev > thr_ns) {
			if (n < (unsigned long long)max) {
				gaps[2 * n] = prev;
				gaps[2 * n + 1] = t;
			}
			n++;
		}
		prev = t;
		if (t - t0 >= dur_ns)
			break;
	}
	info[0] = t0;
	info[1] = prev;
	info[2] = reads;
	info[3] = n;
}

/* ---------------------------------------------------------------- report */

/* A number in a format of our own: jl_num's 6 digits would round an
 * instant (CLOCK_REALTIME seconds) to 1000 s, and a kernel's work too. */
static void jl_fmt(struct jl *j, const char *key, const char *fmt, double v)
{
	size_t mark;

	if (isnan(v) || isinf(v)) {
		jl_null(j, key);
		return;
	}
	mark = jl_key(j, key);
	jl_put(j, mark, fmt, v);
}

static int is_kernel(enum kind k)
{
	return k == K_COMPUTE || k == K_MEMORY || k == K_FEWBLOCK;
}

static int report(int absent_rc, const char *absent_why)
{
	struct jl j;
	const struct opts *o = R.o;
	int measured = o->kind == K_SLICE ? R.samples > 0 : R.n_done > 0 && !isnan(R.median);

	jl_begin(&j);
	jl_str(&j, "probe", "calib");
	jl_str(&j, "kind", KIND_NAMES[o->kind]);
	jl_str(&j, "quota_env", R.quota_env);
	jl_bool(&j, "mps_enabled", R.mps_enabled);
	jl_bool(&j, "sim", R.sim);
	jl_str(&j, "device", R.device[0] ? R.device : NULL);
	jl_int(&j, "driver_version", R.driver_version);
	jl_int(&j, "runtime_version", R.runtime_version);
	jl_count(&j, "sm_count", R.sm_count);
	if (is_kernel(o->kind) || (o->kind == K_SLICE && o->events)) {
		jl_str(&j, "kernel", o->kind == K_MEMORY ? "stream" : "fma");
		jl_count(&j, "blocks", R.blocks);
		jl_int(&j, "threads", o->threads);
		jl_count(&j, "regs", R.regs);
		jl_count(&j, "smem_static", R.smem_static);
		jl_int(&j, "smem_dynamic", o->smem);
		jl_count(&j, "smem", R.smem_static < 0 ? -1 : R.smem_static + o->smem);
		jl_count(&j, "blocks_per_sm", R.bps);
		jl_count(&j, "iters", R.iters);
		jl_bool(&j, "calibrated", R.calibrated);
		jl_num(&j, "calib_ms", R.calib_ms);
		jl_fmt(&j, "flops", "%.12g", R.flops);
	}
	if (o->kind == K_MEMORY || o->kind == K_COPY)
		jl_int(&j, "mb", o->mb);
	if (o->kind != K_SLICE || o->events)
		jl_fmt(&j, "bytes", "%.12g", R.bytes);
	if (o->kind == K_COPY)
		jl_str(&j, "dir", o->d2h ? "d2h" : "h2d");
	if (o->kind != K_SLICE) {
		jl_int(&j, "launches", R.n_done);
		jl_int(&j, "warmup", o->warmup);
		jl_num(&j, "median_us", R.median);
		jl_num(&j, "mean_us", R.mean);
		jl_num(&j, "p10_us", R.p10);
		jl_num(&j, "p90_us", R.p90);
		jl_num(&j, "min_us", R.vmin);
		jl_num(&j, "max_us", R.vmax);
		jl_num(&j, "span_ms", R.span_ms);
		jl_num(&j, "busy", measured && R.span_ms > 0
					   ? R.median * 1e-3 * (double)R.n_done / R.span_ms : NAN);
	}
	if (o->kind == K_COPY) {
		jl_num(&j, "gbs", measured ? R.bytes / (R.median * 1e-6) / 1e9 : NAN);
		jl_num(&j, "gbs_span", measured && R.span_ms > 0
					       ? R.bytes * (double)R.n_done / (R.span_ms * 1e-3) / 1e9
					       : NAN);
	}
	if (o->kind == K_SLICE) {
		jl_str(&j, "method", o->events ? "events" : "timer");
		jl_num(&j, "duration_s", o->duration);
		jl_num(&j, "threshold_us", o->gap_us);
		jl_int(&j, "samples", R.samples);
		jl_num(&j, "sample_ns", R.sample_ns);
		jl_num(&j, "tick_us", R.tick_med_us);
		jl_num(&j, "tick_ref_us", o->tick_ref_us > 0 ? o->tick_ref_us : NAN);
		jl_int(&j, "gaps", R.n_gaps);
		jl_int(&j, "runs", R.n_runs);
		jl_num(&j, "run_us", R.run_us);
		jl_num(&j, "run_p10_us", R.run_p10);
		jl_num(&j, "run_p90_us", R.run_p90);
		jl_num(&j, "gap_us", R.gap_us);
		jl_num(&j, "gap_p10_us", R.gap_p10);
		jl_num(&j, "gap_p90_us", R.gap_p90);
	}
	jl_fmt(&j, "start_at", "%.6f", o->start_at > 0 ? o->start_at : NAN);
	jl_num(&j, "late_s", R.late_s);
	jl_fmt(&j, "t_start", "%.6f", R.t_start);
	jl_fmt(&j, "t_end", "%.6f", R.t_end);
	jl_bool(&j, "stopped", stop_flag ? 1 : 0);
	jl_num(&j, "ctx_ms", R.ctx_ms);
	jl_str(&j, "error", absent_rc ? absent_why : R.F.call[0] ? R.F.msg : NULL);
	jl_str(&j, "error_call", absent_rc ? NULL : R.F.call[0] ? R.F.call : NULL);
	jl_print(&j);
	if (absent_rc)
		return absent_rc;
	return R.F.call[0] || !measured ? 1 : 0;
}

/* ---------------------------------------------------------------- timing */

struct bufs {
	float *a, *b, *out;
	void *host;
	uint64_t n4;             /* memory: float4s per buffer */
	size_t copy_bytes;
};

static int launch(struct fail *F, const struct bufs *B, long long iters, unsigned int blocks)
{
	const struct opts *o = R.o;
	int words = (int)(o->smem / (long long)sizeof(float));

	switch (o->kind) {
	case K_MEMORY:
		calib_stream<<<blocks, (unsigned int)o->threads, (size_t)o->smem>>>(
			(float4 *)B->a, (float4 *)B->b, B->n4, iters, words);
		break;
	case K_COPY:
		return RCK(cudaMemcpyAsync(o->d2h ? B->host : (void *)B->a,
					   o->d2h ? (const void *)B->a : B->host, B->copy_bytes,
					   o->d2h ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, 0));
	default:        /* compute, fewblock, the events method's ticks */
		calib_fma<<<blocks, (unsigned int)o->threads, (size_t)o->smem>>>(B->out, iters, words);
		break;
	}
	return RCK(cudaGetLastError());
}

/* One launch between two events, in ms; NaN on failure (noted). */
static double time_one(struct fail *F, const struct bufs *B, long long iters, unsigned int blocks)
{
	cudaEvent_t e0 = NULL, e1 = NULL;
	float ms = 0;
	double r = NAN;

	if (!RCK(cudaEventCreate(&e0)) && !RCK(cudaEventCreate(&e1)) &&
	    !RCK(cudaEventRecord(e0, 0)) && !launch(F, B, iters, blocks) &&
	    !RCK(cudaEventRecord(e1, 0)) && !RCK(cudaEventSynchronize(e1)) &&
	    !RCK(cudaEventElapsedTime(&ms, e0, e1)))
		r = ms;
	if (e0)
		cudaEventDestroy(e0);
	if (e1)
		cudaEventDestroy(e1);
	return r;
}

/* K such that one launch takes about target_ms here: the fastest of three
 * launches at each K, so that another context's time slice (or any other
 * hiccup) does not pass for the kernel's own time. */
static int calibrate_iters(struct fail *F, const struct bufs *B, unsigned int blocks,
			   double target_ms, long long *iters)
{
	double ms = 0;
	long long k;

	for (k = 1;; k *= 4) {
		ms = INFINITY;
		for (int rep = 0; rep < 3; rep++) {
			double t = time_one(F, B, k, blocks);

			if (isnan(t))
				return -1;
			ms = t < ms ? t : ms;
		}
		if (ms >= target_ms / 4 || k >= (1LL << 34))
			break;
	}
	if (ms > 0)
		k = (long long)((double)k * (target_ms / ms));
	*iters = k < 1 ? 1 : k;
	R.calib_ms = ms;
	return 0;
}

/*
 * The timed section: launches back to back, DEPTH in flight, each between
 * its own events; until n launches, or until `seconds` passed (or a stop
 * signal) when seconds > 0.  times[] gets each launch's ms; done: how many.
 * span: ms from the first launch's start event to the last one's end.
 */
static int timed(struct fail *F, const struct bufs *B, long long iters, unsigned int blocks,
		 long long n, double seconds, double *times, long long cap, long long *done,
		 double *span)
{
	cudaEvent_t ev[2 * DEPTH], first = NULL;
	long long issued = 0, retired = 0;
	double t_stop = seconds > 0 ? now_us() + seconds * 1e6 : 0;
	int nev = 0, rc = -1;
	float ms;

	*done = 0;
	*span = NAN;
	for (; nev < 2 * DEPTH; nev++)
		if (RCK(cudaEventCreate(&ev[nev])))
			goto out;
	if (RCK(cudaEventCreate(&first)))
		goto out;
	for (;;) {
		int more = !stop_flag && (seconds > 0 ? now_us() < t_stop : issued < n) &&
			   issued < cap;

		if (more && issued - retired < DEPTH) {
			cudaEvent_t *e = &ev[2 * (issued % DEPTH)];

			if ((issued == 0 && RCK(cudaEventRecord(first, 0))) ||
			    RCK(cudaEventRecord(e[0], 0)) || launch(F, B, iters, blocks) ||
			    RCK(cudaEventRecord(e[1], 0)))
				goto out;
			issued++;
			continue;
		}
		if (retired == issued)
			break;
		{
			cudaEvent_t *e = &ev[2 * (retired % DEPTH)];

			if (RCK(cudaEventSynchronize(e[1])) || RCK(cudaEventElapsedTime(&ms, e[0], e[1])))
				goto out;
			times[retired++] = ms;
			*done = retired;
			if (retired == issued &&
			    !RCK(cudaEventElapsedTime(&ms, first, e[1])))
				*span = ms;
		}
	}
	rc = 0;
out:
	if (rc)
		cudaDeviceSynchronize();      /* no event of ours may still be pending */
	for (int i = 0; i < nev; i++)
		cudaEventDestroy(ev[i]);
	if (first)
		cudaEventDestroy(first);
	return rc;
}

static void summarise_us(double *ms, long long n)
{
	if (n <= 0)
		return;
	R.mean = 0;
	for (long long i = 0; i < n; i++) {
		ms[i] *= 1e3;
		R.mean += ms[i] / (double)n;
	}
	qsort(ms, (size_t)n, sizeof(double), cmp_double);
	R.median = pct_sorted(ms, (int)n, 0.5);
	R.p10 = pct_sorted(ms, (int)n, 0.1);
	R.p90 = pct_sorted(ms, (int)n, 0.9);
	R.vmin = ms[0];
	R.vmax = ms[n - 1];
}

/* Median, p10, p90 of v[0..n) (sorted in place), in the given unit. */
static void stats3(double *v, long long n, double *med, double *p10, double *p90)
{
	if (n <= 0)
		return;
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	*med = pct_sorted(v, (int)n, 0.5);
	*p10 = pct_sorted(v, (int)n, 0.1);
	*p90 = pct_sorted(v, (int)n, 0.9);
}

/* ---------------------------------------------------------------- roles */

static int setup_kernel(struct fail *F, struct bufs *B, const void *fn)
{
	const struct opts *o = R.o;
	struct cudaFuncAttributes fa;

	if (o->smem > SMEM_DEFAULT_MAX &&
	    RCK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)o->smem)))
		return -1;
	if (RCK(cudaFuncGetAttributes(&fa, fn)) ||
	    RCK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&R.bps, fn, (int)o->threads,
							      (size_t)o->smem)))
		return -1;
	R.regs = fa.numRegs;
	R.smem_static = (long long)fa.sharedSizeBytes;
	if (R.bps < 1) {
		fail_note(F, "occupancy", -1, "no block of this shape fits an SM (threads x regs, smem)");
		return -1;
	}
	if (o->blocks > 0)
		R.blocks = o->blocks;
	else if (o->kind == K_FEWBLOCK)
		R.blocks = 8;
	else if (o->kind == K_MEMORY)
		R.blocks = (long long)R.sm_count * R.bps;
	else
		R.blocks = (long long)R.sm_count * R.bps * 2;
	if (R.blocks < 1 || R.blocks > 0x7fffffffLL) {
		fail_note(F, "grid", -1, "grid size out of range");
		return -1;
	}
	if (o->kind == K_MEMORY) {
		uint64_t n = (uint64_t)o->mb * (1 << 20) / sizeof(float);

		B->n4 = n / 4;
		if (RCK(cudaMalloc(&B->a, n * sizeof(float))) ||
		    RCK(cudaMalloc(&B->b, n * sizeof(float))))
			return -1;
		calib_fill<<<(unsigned int)(R.sm_count > 0 ? R.sm_count * 4 : 64), 256>>>(B->a, n);
		if (RCK(cudaGetLastError()) || RCK(cudaMemset(B->b, 0, n * sizeof(float))))
			return -1;
	} else if (RCK(cudaMalloc(&B->out, (size_t)R.blocks * o->threads * sizeof(float)))) {
		return -1;
	}
	return RCK(cudaDeviceSynchronize());
}

/* Work per launch, as the model counts it. */
static void work(const struct bufs *B)
{
	const struct opts *o = R.o;
	double thr = (double)R.blocks * (double)o->threads;

	if (o->kind == K_MEMORY) {
		R.flops = 2.0 * 4.0 * (double)B->n4 * (double)R.iters;
		R.bytes = 2.0 * 16.0 * (double)B->n4 * (double)R.iters;
	} else {
		R.flops = 2.0 * CHAINS * (double)R.iters * thr;
		R.bytes = 4.0 * thr;
	}
}

static int run_kernel(struct fail *F, struct bufs *B, double *times, long long cap)
{
	const struct opts *o = R.o;
	const void *fn = o->kind == K_MEMORY ? (const void *)calib_stream : (const void *)calib_fma;

	if (setup_kernel(F, B, fn))
		return -1;
	/* one tiny launch: lazy module loading stays out of every time */
	if (launch(F, B, 1, (unsigned int)R.blocks) || RCK(cudaDeviceSynchronize()))
		return -1;
	R.iters = o->iters;
	R.calibrated = o->iters > 0 ? 0 : 1;
	if (o->iters <= 0 &&
	    calibrate_iters(F, B, (unsigned int)R.blocks, o->target_ms, &R.iters))
		return -1;
	work(B);
	for (long long i = 0; i < o->warmup; i++)
		if (launch(F, B, R.iters, (unsigned int)R.blocks))
			return -1;
	if (RCK(cudaDeviceSynchronize()))
		return -1;
	R.late_s = wait_until(o->start_at);
	R.t_start = real_s();
	if (timed(F, B, R.iters, (unsigned int)R.blocks, o->launches,
		  o->have_duration ? o->duration : 0, times, cap, &R.n_done, &R.span_ms))
		return -1;
	R.t_end = real_s();
	summarise_us(times, R.n_done);
	return 0;
}

static int run_copy(struct fail *F, struct bufs *B, double *times, long long cap)
{
	const struct opts *o = R.o;

	B->copy_bytes = (size_t)o->mb << 20;
	if (RCK(cudaMallocHost(&B->host, B->copy_bytes)) || RCK(cudaMalloc(&B->a, B->copy_bytes)))
		return -1;
	memset(B->host, 1, B->copy_bytes);     /* touch the pinned pages */
	if (RCK(cudaMemset(B->a, 0, B->copy_bytes)) || RCK(cudaDeviceSynchronize()))
		return -1;
	R.bytes = (double)B->copy_bytes;
	for (long long i = 0; i < o->warmup; i++)
		if (launch(F, B, 0, 0))
			return -1;
	if (RCK(cudaDeviceSynchronize()))
		return -1;
	R.late_s = wait_until(o->start_at);
	R.t_start = real_s();
	if (timed(F, B, 0, 0, o->launches, o->have_duration ? o->duration : 0, times, cap,
		  &R.n_done, &R.span_ms))
		return -1;
	R.t_end = real_s();
	summarise_us(times, R.n_done);
	return 0;
}

/*
 * Runs and gaps from the ends of a sequence: gap i spans (g0[i], g1[i]);
 * runs are the spans between consecutive gaps (the cut first and last
 * runs left out).  All in us.
 */
static int runs_and_gaps(struct fail *F, const double *g0, const double *g1, long long n)
{
	double *runs, *gaps;

	R.n_gaps = n;
	if (n <= 0)
		return 0;
	runs = (double *)calloc((size_t)n, sizeof(double));
	gaps = (double *)calloc((size_t)n, sizeof(double));
	if (!runs || !gaps) {
		free(runs);
		free(gaps);
		fail_note(F, "calloc", ENOMEM, "no memory for the gaps");
		return -1;
	}
	for (long long i = 0; i < n; i++)
		gaps[i] = g1[i] - g0[i];
	for (long long i = 1; i < n; i++)
		runs[i - 1] = g0[i] - g1[i - 1];
	R.n_runs = n - 1;
	stats3(gaps, n, &R.gap_us, &R.gap_p10, &R.gap_p90);
	stats3(runs, n - 1, &R.run_us, &R.run_p10, &R.run_p90);
	free(runs);
	free(gaps);
	return 0;
}

static int slice_timer(struct fail *F)
{
	const struct opts *o = R.o;
	unsigned long long *dgaps = NULL, *dinfo = NULL, info[4], *gaps = NULL;
	double *g0 = NULL, *g1 = NULL;
	long long n;
	int rc = -1;

	if (RCK(cudaMalloc(&dgaps, 2 * sizeof(unsigned long long) * MAX_GAPS)) ||
	    RCK(cudaMalloc(&dinfo, sizeof(info))))
		goto out;
	/* a short run first: module loading, and a check that the timer moves */
	calib_slice<<<1, 32>>>(dgaps, dinfo, 100000ULL, 1000000000ULL, MAX_GAPS);
	if (RCK(cudaGetLastError()) || RCK(cudaDeviceSynchronize()))
		goto out;
	R.late_s = wait_until(o->start_at);
	R.t_start = real_s();
	calib_slice<<<1, 32>>>(dgaps, dinfo, (unsigned long long)(o->duration * 1e9),
			       (unsigned long long)(o->gap_us * 1e3), MAX_GAPS);
	if (RCK(cudaGetLastError()) || RCK(cudaDeviceSynchronize()))
		goto out;
	R.t_end = real_s();
	if (RCK(cudaMemcpy(info, dinfo, sizeof(info), cudaMemcpyDeviceToHost)))
		goto out;
	R.samples = (long long)info[2];
	R.sample_ns = info[2] ? (double)(info[1] - info[0]) / (double)info[2] : NAN;
	n = (long long)(info[3] < MAX_GAPS ? info[3] : MAX_GAPS);
	gaps = (unsigned long long *)calloc(2 * (size_t)n + 2, sizeof(*gaps));
	g0 = (double *)calloc((size_t)n + 1, sizeof(double));
	g1 = (double *)calloc((size_t)n + 1, sizeof(double));
	if (!gaps || !g0 || !g1) {
		fail_note(F, "calloc", ENOMEM, "no memory for the gaps");
		goto out;
	}
	if (n && RCK(cudaMemcpy(gaps, dgaps, 2 * sizeof(*gaps) * (size_t)n, cudaMemcpyDeviceToHost)))
		goto out;
	for (long long i = 0; i < n; i++) {
		g0[i] = (double)(gaps[2 * i] - info[0]) * 1e-3;
		g1[i] = (double)(gaps[2 * i + 1] - info[0]) * 1e-3;
	}
	rc = runs_and_gaps(F, g0, g1, n);
	R.n_gaps = (long long)info[3];
out:
	if (dgaps)
		cudaFree(dgaps);
	if (dinfo)
		cudaFree(dinfo);
	free(gaps);
	free(g0);
	free(g1);
	return rc;
}

/*
 * The events method: ticks (one-block FMA kernels of about tick_us) back to
 * back, an event after each.  Completion times c[i] from the first event;
 * an interval longer than the median tick by more than gap_us is a gap of
 * (interval - median tick), ending at c[i] and starting a tick earlier.
 */
static int slice_events(struct fail *F, struct bufs *B)
{
	const struct opts *o = R.o;
	long long cap = (long long)(o->duration * 1e6 / (o->tick_us > 1 ? o->tick_us : 1)) * 4 + 64;
	cudaEvent_t ev[DEPTH], e0 = NULL;
	double *c = NULL, *d = NULL, *g0 = NULL, *g1 = NULL, t_stop;
	long long issued = 0, retired = 0, n = 0;
	int nev = 0, rc = -1;
	float ms;

	if (cap > MAX_TIMES)
		cap = MAX_TIMES;
	if (setup_kernel(F, B, (const void *)calib_fma))
		goto out;
	if (launch(F, B, 1, (unsigned int)R.blocks) || RCK(cudaDeviceSynchronize()))
		goto out;
	R.iters = o->iters;
	R.calibrated = o->iters > 0 ? 0 : 1;
	if (o->iters <= 0 &&
	    calibrate_iters(F, B, (unsigned int)R.blocks, o->tick_us * 1e-3, &R.iters))
		goto out;
	work(B);
	c = (double *)calloc((size_t)cap, sizeof(double));
	d = (double *)calloc((size_t)cap, sizeof(double));
	g0 = (double *)calloc((size_t)cap, sizeof(double));
	g1 = (double *)calloc((size_t)cap, sizeof(double));
	if (!c || !d || !g0 || !g1) {
		fail_note(F, "calloc", ENOMEM, "no memory for the ticks");
		goto out;
	}
	for (; nev < DEPTH; nev++)
		if (RCK(cudaEventCreate(&ev[nev])))
			goto out;
	if (RCK(cudaEventCreate(&e0)))
		goto out;
	R.late_s = wait_until(o->start_at);
	R.t_start = real_s();
	t_stop = now_us() + o->duration * 1e6;
	if (RCK(cudaEventRecord(e0, 0)))
		goto out;
	for (;;) {
		if (!stop_flag && now_us() < t_stop && issued < cap && issued - retired < DEPTH) {
			if (launch(F, B, R.iters, (unsigned int)R.blocks) ||
			    RCK(cudaEventRecord(ev[issued % DEPTH], 0)))
				goto out;
			issued++;
			continue;
		}
		if (retired == issued)
			break;
		if (RCK(cudaEventSynchronize(ev[retired % DEPTH])) ||
		    RCK(cudaEventElapsedTime(&ms, e0, ev[retired % DEPTH])))
			goto out;
		c[retired++] = (double)ms * 1e3;
	}
	R.t_end = real_s();
	R.samples = retired;
	for (long long i = 1; i < retired; i++)
		d[i - 1] = c[i] - c[i - 1];
	if (retired > 1) {
		double *s = (double *)calloc((size_t)retired, sizeof(double)), tick;

		if (!s) {
			fail_note(F, "calloc", ENOMEM, "no memory for the ticks");
			goto out;
		}
		memcpy(s, d, sizeof(double) * (size_t)(retired - 1));
		qsort(s, (size_t)(retired - 1), sizeof(double), cmp_double);
		tick = o->tick_ref_us > 0 ? o->tick_ref_us : pct_sorted(s, (int)(retired - 1), 0.5);
		free(s);
		R.tick_med_us = tick;
		R.sample_ns = tick * 1e3;
		for (long long i = 1; i < retired; i++)
			if (d[i - 1] > tick + o->gap_us) {
				g1[n] = c[i] - tick;         /* the tick's own work ran last */
				g0[n] = c[i - 1];
				n++;
			}
	}
	rc = runs_and_gaps(F, g0, g1, n);
out:
	for (int i = 0; i < nev; i++)
		cudaEventDestroy(ev[i]);
	if (e0)
		cudaEventDestroy(e0);
	free(c);
	free(d);
	free(g0);
	free(g1);
	return rc;
}

static int run(const struct opts *o)
{
	struct fail *F = &R.F;
	struct bufs B;
	double *times = NULL, t0;
	char why[256];
	long long cap = o->have_duration ? MAX_TIMES : o->launches;
	int rc;

	memset(&B, 0, sizeof(B));
	R.o = o;
	R.quota_env = getenv(PCT_ENV);
	R.mps_enabled = R.sm_count = R.bps = R.regs = R.calibrated = -1;
	R.smem_static = R.blocks = R.iters = -1;
	R.calib_ms = R.ctx_ms = R.late_s = R.t_start = R.t_end = R.span_ms = NAN;
	R.median = R.mean = R.p10 = R.p90 = R.vmin = R.vmax = R.flops = R.bytes = NAN;
	R.run_us = R.gap_us = R.run_p10 = R.run_p90 = R.gap_p10 = R.gap_p90 = NAN;
	R.sample_ns = R.tick_med_us = NAN;
	R.sim = dlsym(RTLD_DEFAULT, "simgpu_quota_pct") != NULL;
	cudaDriverGetVersion(&R.driver_version);     /* 0 without a driver: reported */
	cudaRuntimeGetVersion(&R.runtime_version);
	rc = gpu_absent(why, sizeof(why));
	if (rc && !(rc == 2 && R.sim && o->allow_sim))
		return report(rc, why);
	if (R.sim && o->kind == K_SLICE && !o->events) {
		fail_note(F, "slice", -1, "simgpu has no %globaltimer: use --method events");
		return report(0, NULL);
	}
	t0 = now_us();
	if (RCK(cudaSetDevice(0)) || RCK(cudaFree(0)))     /* the percentage is read here */
		return report(0, NULL);
	R.ctx_ms = (now_us() - t0) / 1e3;
	{
		struct cudaDeviceProp prop;
		int v = -1;

		if (RCK(cudaGetDeviceProperties(&prop, 0)) ||
		    RCK(cudaDeviceGetAttribute(&R.sm_count, cudaDevAttrMultiProcessorCount, 0)))
			return report(0, NULL);
		snprintf(R.device, sizeof(R.device), "%s", prop.name);
		/* optional: a runtime that does not know the attribute says nothing */
		if (cudaDeviceGetAttribute(&v, cudaDevAttrMpsEnabled, 0) == cudaSuccess)
			R.mps_enabled = v;
		cudaGetLastError();
	}
	if (o->kind != K_SLICE) {
		times = (double *)calloc((size_t)cap, sizeof(double));
		if (!times) {
			fail_note(F, "calloc", ENOMEM, "no memory for the times");
			return report(0, NULL);
		}
	}
	if (is_kernel(o->kind))
		run_kernel(F, &B, times, cap);
	else if (o->kind == K_COPY)
		run_copy(F, &B, times, cap);
	else if (o->events)
		slice_events(F, &B);
	else
		slice_timer(F);
	/* freeing is clean-up: its failure is printed, the report is kept */
	if (B.a && cudaFree(B.a) != cudaSuccess)
		fprintf(stderr, "%s: cudaFree failed\n", NAME);
	if (B.b && cudaFree(B.b) != cudaSuccess)
		fprintf(stderr, "%s: cudaFree failed\n", NAME);
	if (B.out && cudaFree(B.out) != cudaSuccess)
		fprintf(stderr, "%s: cudaFree failed\n", NAME);
	if (B.host && cudaFreeHost(B.host) != cudaSuccess)
		fprintf(stderr, "%s: cudaFreeHost failed\n", NAME);
	free(times);
	return report(0, NULL);
}

/* ---------------------------------------------------------------- options */

static void usage(void)
{
	fprintf(stderr,
		"usage: gpu-calib_probe --kind compute|memory|fewblock|copy|slice\n"
		"         [--blocks B] [--threads T] [--smem BYTES] [--iters K | --target-ms T]\n"
		"         [--mb M] [--launches N | --duration S] [--warmup W] [--start-at T]\n"
		"         [--dir h2d|d2h] [--method timer|events] [--gap-us G] [--tick-us U]\n"
		"         [--tick-ref-us R] [--allow-sim]\n"
		"  kernels: compute (FMA chains), memory (streaming over 2 x M MiB, K passes),\n"
		"  fewblock (FMA on 8 blocks); copy: pinned M MiB per cudaMemcpyAsync; slice:\n"
		"  run two at once without MPS: median run (the time slice) and gap between runs\n"
		"  one JSON line on stdout; exit 0 measured, 1 a call failed, 2 no device (or\n"
		"  simgpu, unless --allow-sim)\n");
}



static int arg_word(int argc, char **argv, int *i, const char *const *words, int n, int *out)
{
	if (*i + 1 >= argc)
		return -1;
	for (int k = 0; k < n; k++)
		if (!strcmp(argv[*i + 1], words[k])) {
			*out = k;
			*i += 1;
			return 0;
		}
	return -1;
}

static int bad_arg(const char *why, int has_kind, enum kind kind)
{
	struct jl j;

	fprintf(stderr, "%s: %s\n", NAME, why);
	usage();
	jl_begin(&j);
	jl_str(&j, "probe", "calib");
	if (has_kind)
		jl_str(&j, "kind", KIND_NAMES[kind]);
	jl_str(&j, "error", why);
	jl_print(&j);
	return 1;
}

int main(int argc, char **argv)
{
	static const char *const DIRS[] = { "h2d", "d2h" }, *const METHODS[] = { "timer", "events" };
	struct opts o;
	struct sigaction sa;
	int has_kind = 0, has_mb = 0, has_launches = 0, w = 0;

	memset(&o, 0, sizeof(o));
	o.threads = 256;
	o.launches = 20;
	o.warmup = 2;
	o.target_ms = 5;
	o.gap_us = 5;
	o.tick_us = 100;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int bad = 0;
		char why[160];

		if (!strcmp(a, "--kind"))
			bad = arg_word(argc, argv, &i, KIND_NAMES, 5, &w), o.kind = (enum kind)w,
			has_kind = !bad;
		else if (!strcmp(a, "--blocks"))
			bad = arg_ll(argc, argv, &i, 1, 0x7fffffffLL, &o.blocks);
		else if (!strcmp(a, "--threads"))
			bad = arg_ll(argc, argv, &i, 1, 1024, &o.threads);
		else if (!strcmp(a, "--smem"))
			bad = arg_ll(argc, argv, &i, 0, 227 * 1024, &o.smem);
		else if (!strcmp(a, "--iters"))
			bad = arg_ll(argc, argv, &i, 1, 1LL << 40, &o.iters);
		else if (!strcmp(a, "--target-ms"))
			bad = arg_d(argc, argv, &i, 0.001, 10000, &o.target_ms);
		else if (!strcmp(a, "--mb"))
			bad = arg_ll(argc, argv, &i, 1, 65536, &o.mb), has_mb = 1;
		else if (!strcmp(a, "--launches"))
			bad = arg_ll(argc, argv, &i, 1, MAX_TIMES, &o.launches), has_launches = 1;
		else if (!strcmp(a, "--duration"))
			bad = arg_d(argc, argv, &i, 0.001, 3600, &o.duration), o.have_duration = 1;
		else if (!strcmp(a, "--warmup"))
			bad = arg_ll(argc, argv, &i, 0, 1000, &o.warmup);
		else if (!strcmp(a, "--start-at"))
			bad = arg_d(argc, argv, &i, 0, 1e11, &o.start_at);
		else if (!strcmp(a, "--dir"))
			bad = arg_word(argc, argv, &i, DIRS, 2, &o.d2h);
		else if (!strcmp(a, "--method"))
			bad = arg_word(argc, argv, &i, METHODS, 2, &o.events);
		else if (!strcmp(a, "--gap-us"))
			bad = arg_d(argc, argv, &i, 0.001, 1e6, &o.gap_us);
		else if (!strcmp(a, "--tick-us"))
			bad = arg_d(argc, argv, &i, 1, 1e6, &o.tick_us);
		else if (!strcmp(a, "--tick-ref-us"))
			bad = arg_d(argc, argv, &i, 0.001, 1e6, &o.tick_ref_us);
		else if (!strcmp(a, "--allow-sim"))
			o.allow_sim = 1;
		else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage();
			return 0;
		} else
			bad = 1;
		if (bad) {
			snprintf(why, sizeof(why), "bad argument %s", a);
			return bad_arg(why, has_kind, o.kind);
		}
	}
	if (!has_kind)
		return bad_arg("--kind is required", 0, o.kind);
	if (has_launches && o.have_duration)
		return bad_arg("--launches and --duration exclude each other", 1, o.kind);
	if (!has_mb)
		o.mb = o.kind == K_COPY ? 64 : 512;
	if (o.kind == K_SLICE) {
		if (!o.have_duration)
			o.duration = 1.0;
		o.have_duration = 1;
		if (o.events && !o.blocks)
			o.blocks = 1;
	}
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop;
	sa.sa_flags = SA_RESTART;         /* a stop ends the loop, never a call */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	return run(&o);
}
