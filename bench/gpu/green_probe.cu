// green_probe: CUDA green contexts (SM partitions) on the real GPU, the
// facts the shim's partition route (shim/shim_part.c) rests on.  One MODE
// per run; bench/gpu_session.sh (step green) runs them all.
//
//   gpu-green_probe MODE [--n N] [--sms S] [--sms-b S] [--ms M] [--iters K]
//                        [--waves V] [--target-ms T] [--spin-us U] [--tag T]
//
// Every line has the device facts: "probe" ("green"), "mode", "tag" (--tag,
// to tell runs apart in one file), "pid", "device", "cc", "sm_count",
// "driver_version", "runtime_version" (cudaDriverGetVersion /
// cudaRuntimeGetVersion), "mps_enabled", and the device's SM resource
// (cuDeviceGetDevResource): "sm_total", "min_partition"
// (minSmPartitionSize), "cosched_align" (smCoscheduledAlignment).
//
// Partitions are made as the shim makes them: cuDevSmResourceSplitByCount
// of the device's whole SM resource into ONE group of at least S SMs,
// cuDevResourceGenerateDesc, cuGreenCtxCreate(CU_GREEN_CTX_DEFAULT_STREAM),
// cuGreenCtxStreamCreate(CU_STREAM_NON_BLOCKING, priority 0); kernels
// compiled by nvcc go to that stream through the runtime (<<<..., stream>>>)
// with the primary context current, memory is cudaMalloc'ed there.
// Kernel times come from %globaltimer inside the kernel (first block start
// to last block end, atomicMin/atomicMax per block), not from events:
// cuEventRecord wants the event and the stream in the same context, and
// whether a green context counts as its primary's is one of the questions
// (`switch` answers it).  In JSON arrays "rc" is a CUresult (0 success) and
// "err" its name.
//
// split    for minCount in 1 2 4 8 9 16 20 24 32 64 66 100 128 132, one
//          group (nbGroups = 1) with useFlags 0 ("splits") and with
//          CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING
//          ("splits_ignore_cosched"), each entry {"min", "rc", "err", "nb",
//          "sms" (group), "rest" (remaining), "ctx_rc"/"ctx_err" (desc +
//          green context from that group, destroyed at once), "ctx_sms"
//          (cuGreenCtxGetDevResource of it)}; "ignore_cosched_flag" its value.
//          Then the whole device as the shim splits it (groups of
//          min_partition and the rest): "groups_nb", "groups_sms", "groups_rest",
//          contexts of the last group with the rest ("last_with_rest_*") and
//          of all of them ("all_with_rest_*"); and "multi": for each minCount
//          above, as many groups as the driver makes (64 asked),
//          "min:NxSIZE+REST" (or "min:rcN").
// bind     a compute-bound kernel (8 FMA chains per thread, 256-thread
//          blocks, grid = sm_count * blocks/SM * --waves (4): the same grid
//          everywhere, filling the whole GPU several times), K calibrated so
//          that it takes about --target-ms (5) on the primary context; then
//          --n (5) timed runs after one warm-up on the primary context (a
//          non-blocking stream) and on partitions of 8 16 32 64 96 128 SMs.
//          Each block ORs its %smid into a mask.  "runs": [{"ctx"
//          ("primary"|"green"), "want", "rc", "err" and "step" (a size the
//          driver refused: data, the next size is tried), "sms", "median_ms",
//          "min_ms", "max_ms", "rel" (median / primary median), "ideal_rel"
//          (sm_total / sms), "sm_used" (distinct %smid), "sm_min", "sm_max",
//          "check" (two outputs against the CPU)}]; also "iters", "grid",
//          "blocks_per_sm", "calib_ms", "n".  The share binds when sm_used
//          equals sms and rel follows ideal_rel.
// create   --n (20) times: make a partition of --sms (64) SMs, then its
//          stream, then one tiny kernel on it (launch + cuStreamSynchronize,
//          the first in that context: its module is loaded there then) and
//          a second, then destroy stream and context.  Microseconds
//          (host CLOCK_MONOTONIC): "make_us_*" (split + desc +
//          cuGreenCtxCreate), "ctx_create_us_*" (cuGreenCtxCreate alone),
//          "stream_us_*" (cuGreenCtxStreamCreate), "first_launch_us_*",
//          "next_launch_us_med", "destroy_us_*" (stream + context), each
//          "_med" (median) and "_max", some "_first" (the first repetition,
//          the process's first partition); "want", "sms", "n".
// switch   the shim's switch path.  An app stream S (non-blocking, primary
//          context), partitions A (--sms, 16 SMs) and B (--sms-b, 120, at
//          most all SMs) with one green stream each (PA, PB), the shim's events
//          (cudaEventCreateWithFlags(cudaEventDisableTiming) in the primary
//          context).  First "rec_on_green_rc"/"rec_on_green_err": the
//          runtime's cudaEventRecord of such an event on PA.  If it fails the
//          runs below use an event made in each green context
//          (cuCtxFromGreenCtx + cuCtxSetCurrent + cuEventCreate):
//          "event_ctx" says "primary" or "green".  Three arms of --n (1000)
//          iterations (plus 10 warm-up ones), each iteration on a quiet GPU:
//            plain    spin on S; tiny kernel on S (the baseline)
//            app      spin on S; record E on S; PX waits for E; tiny kernel
//                     on PX (X alternates A, B): the launch after an app
//                     operation
//            shadow   spin on PY; record E on PY; PX waits; tiny kernel on
//                     PX (X alternates, Y the other one): a switch of
//                     partition
//          then the host waits for PX (S).  "spin" is a 1-thread kernel that
//          busy-waits --spin-us (100) on %globaltimer and stores its end
//          time; the tiny kernel stores %globaltimer at its start.  Per arm
//          (prefix plain_, app_, shadow_): "pair_ns_med/p99" host ns of the
//          cudaEventRecord + cudaStreamWaitEvent pair (not plain);
//          "launch_ns_med/p99" host ns of the tiny kernel's launch call;
//          "gap_us_med/p99/min" device us from the end of the spin to the
//          start of the tiny kernel: the cost of the ordering on the device,
//          the host out of it because everything was queued while the spin
//          ran; "covered" iterations where it was (host time from the spin's
//          launch to the tiny kernel's launch returning under --spin-us; only
//          those count for gap), "violations" iterations where the tiny
//          kernel started before the spin ended (order broken: must be 0).
//          "timer_step_ns_min/mean": %globaltimer's resolution here (the
//          gaps are no finer).  Then idle round trips, each on an idle GPU
//          (--n of each): the tiny kernel launched, its stream synchronised,
//          then the device (what the shim does for an app's
//          cudaDeviceSynchronize), host ns from the launch call to the
//          return: "idle_plain_*" on S, "idle_same_*" on PA every time,
//          "idle_alt_*" on PA and PB by turns (every launch a switch of
//          partition on an idle GPU: does that cost more than staying?),
//          "idle_cold_*" on PB after 50 trips on PA (--n / 50 of them),
//          "idle_stale_*" on PB after 50 ms of trips on PA (40 of them: a
//          partition unused as long as between bench/partitions.py's flips);
//          each "us_med", "us_p99", "launch_ns_med" (the launch call
//          alone).  Host call to kernel start is not measured: that needs
//          the host and GPU clocks related, which costs more error than the
//          figures themselves.
// modload  a module from PTX in this file (put42: *p = 42), one partition of
//          --sms (16) SMs and its stream GS.  Variants, in this order (a
//          failure that poisons the context would show in those after it):
//            primary_on_primary    cuModuleLoadData in the primary context,
//                                  cuModuleGetFunction, cuLaunchKernel on a
//                                  primary-context stream (the control)
//            library_on_green      cuLibraryLoadData + cuLibraryGetKernel,
//                                  the CUkernel cast to CUfunction, launched
//                                  on GS
//            module_green_on_green cuModuleLoadData with the green context
//                                  current (cuCtxFromGreenCtx), launched on GS
//            module_primary_on_green  the control's CUfunction launched on GS
//          per variant (prefix NAME_): "load_rc", "launch_rc", "launch_err"
//          (the launch's error name, or the load's when loading failed),
//          "sync_rc", "value" (what the device memory holds after: 42 when
//          the kernel ran), "ok"; "green_ctx_is_primary" (cuCtxFromGreenCtx
//          gave the primary context).
// hold     for the two-process test: a partition of --sms (64) SMs, the bind
//          kernel with a FIXED --iters (4096) and grid (its SMs * blocks/SM
//          * --waves), launched back to back (at most 2 in flight) until
//          --ms (1000) ms have passed on the host.  "first_start_ns" /
//          "last_end_ns" (%globaltimer, one clock for every process on the
//          GPU: intervals of two processes compare), "iterations",
//          "span_ms" (last end - first start), "kernel_ms_med/max" (per
//          launch, first block start to last block end), "busy_frac" (sum of
//          kernel times / span), "sm_used", "sm_min", "sm_max", "sm_mask"
//          (hex, bit i = %smid i), "wall_ms", "iters", "grid", "want", "sms".
//          With --first F the partition is made as the shim makes it: the
//          device split into groups of min_partition SMs, the run of groups
//          from SM F on ("first"; -1 without): two processes with disjoint
//          runs must use disjoint %smid sets for the controller's spans to
//          isolate apps.
//
// Output: ONE JSON line on stdout, also when a call fails ("error" names the
// first failing call with its error name; "error_call" the call).  Exit 0:
// measured (a refusal that is the answer to a question, a split size the
// driver rejects or a launch in another context that fails, is data, not a
// failure); 1: a call or a check failed; 2: no NVIDIA driver or device, or
// simgpu (nothing measured).
#include <cuda_runtime.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *NAME = "green_probe";

#include "drv.h"
#include "jsonline.h"
#include "args.h"
#include "fma.h"

#define BLOCK 256
#define MASK_WORDS 16            /* %smid 0..511 */
#define MAX_N 100000
#define HOLD_SLOTS 200000
#define SWITCH_WARM 10
#define NSPLIT 14
#define NBIND 6

static const unsigned SPLIT_MIN[NSPLIT] = { 1, 2, 4, 8, 9, 16, 20, 24, 32, 64, 66, 100, 128, 132 };
static const unsigned BIND_SMS[NBIND] = { 8, 16, 32, 64, 96, 128 };

enum mode { M_SPLIT, M_BIND, M_CREATE, M_SWITCH, M_MODLOAD, M_HOLD, M_COUNT };
static const char *const MODES[M_COUNT] = { "split", "bind", "create", "switch", "modload", "hold" };

struct opts {
	int mode, n, waves;
	long long sms, sms_b, ms, iters, spin_us, first;
	double target_ms;
	const char *tag;
};

/* ------------------------------------------------------------ driver calls */

/* The green-context calls and the rest beyond drv.h's, each at the ABI
 * version of its PFN_ typedef (cudaTypedefs.h). */
struct gdrv {
	PFN_cuInit_v2000 Init;
	PFN_cuDeviceGetDevResource_v12040 DeviceGetDevResource;
	PFN_cuDevSmResourceSplitByCount_v12040 DevSmResourceSplitByCount;
	PFN_cuDevResourceGenerateDesc_v12040 DevResourceGenerateDesc;
	PFN_cuGreenCtxCreate_v12040 GreenCtxCreate;
	PFN_cuGreenCtxDestroy_v12040 GreenCtxDestroy;
	PFN_cuGreenCtxGetDevResource_v12040 GreenCtxGetDevResource;
	PFN_cuGreenCtxStreamCreate_v12050 GreenCtxStreamCreate;
	PFN_cuCtxFromGreenCtx_v12040 CtxFromGreenCtx;
	PFN_cuCtxGetCurrent_v4000 CtxGetCurrent;
	PFN_cuCtxSetCurrent_v4000 CtxSetCurrent;
	PFN_cuStreamDestroy_v4000 StreamDestroy;
	PFN_cuStreamSynchronize_v2000 StreamSynchronize;
	PFN_cuEventCreate_v2000 EventCreate;
	PFN_cuEventDestroy_v4000 EventDestroy;
	PFN_cuModuleLoadData_v2000 ModuleLoadData;
	PFN_cuModuleGetFunction_v2000 ModuleGetFunction;
	PFN_cuModuleUnload_v2000 ModuleUnload;
	PFN_cuLibraryLoadData_v12000 LibraryLoadData;
	PFN_cuLibraryGetKernel_v12000 LibraryGetKernel;
	PFN_cuLibraryUnload_v12000 LibraryUnload;
	PFN_cuLaunchKernel_v4000 LaunchKernel;
};

static const struct drv_sym GDRV_SYMS[] = {
	{ "cuInit", 2000, offsetof(struct gdrv, Init) },
	{ "cuDeviceGetDevResource", 12040, offsetof(struct gdrv, DeviceGetDevResource) },
	{ "cuDevSmResourceSplitByCount", 12040, offsetof(struct gdrv, DevSmResourceSplitByCount) },
	{ "cuDevResourceGenerateDesc", 12040, offsetof(struct gdrv, DevResourceGenerateDesc) },
	{ "cuGreenCtxCreate", 12040, offsetof(struct gdrv, GreenCtxCreate) },
	{ "cuGreenCtxDestroy", 12040, offsetof(struct gdrv, GreenCtxDestroy) },
	{ "cuGreenCtxGetDevResource", 12040, offsetof(struct gdrv, GreenCtxGetDevResource) },
	{ "cuGreenCtxStreamCreate", 12050, offsetof(struct gdrv, GreenCtxStreamCreate) },
	{ "cuCtxFromGreenCtx", 12040, offsetof(struct gdrv, CtxFromGreenCtx) },
	{ "cuCtxGetCurrent", 4000, offsetof(struct gdrv, CtxGetCurrent) },
	{ "cuCtxSetCurrent", 4000, offsetof(struct gdrv, CtxSetCurrent) },
	{ "cuStreamDestroy", 4000, offsetof(struct gdrv, StreamDestroy) },
	{ "cuStreamSynchronize", 2000, offsetof(struct gdrv, StreamSynchronize) },
	{ "cuEventCreate", 2000, offsetof(struct gdrv, EventCreate) },
	{ "cuEventDestroy", 4000, offsetof(struct gdrv, EventDestroy) },
	{ "cuModuleLoadData", 2000, offsetof(struct gdrv, ModuleLoadData) },
	{ "cuModuleGetFunction", 2000, offsetof(struct gdrv, ModuleGetFunction) },
	{ "cuModuleUnload", 2000, offsetof(struct gdrv, ModuleUnload) },
	{ "cuLibraryLoadData", 12000, offsetof(struct gdrv, LibraryLoadData) },
	{ "cuLibraryGetKernel", 12000, offsetof(struct gdrv, LibraryGetKernel) },
	{ "cuLibraryUnload", 12000, offsetof(struct gdrv, LibraryUnload) },
	{ "cuLaunchKernel", 4000, offsetof(struct gdrv, LaunchKernel) },
};

static struct {
	struct fail F;
	const struct opts *o;
	int driver_version, runtime_version, sm_count, cc_major, cc_minor, mps_enabled;
	int ok;                       /* the mode's own checks held */
	char device[128];
	CUdevice dev;
	CUcontext primary;
	CUdevResource res;
	int have_res;
} R;

static struct drv Dv;
static struct gdrv Gv;
static struct drv *const D = &Dv;      /* for DCK (drv.h) */
static struct gdrv *const G = &Gv;
static struct fail *const F = &R.F;

#define GCK(fn, ...) dck(F, D, "cu" #fn, G->fn(__VA_ARGS__))

static int gdrv_load(void)
{
	return drv_load_syms(G, sizeof(*G), GDRV_SYMS, sizeof(GDRV_SYMS) / sizeof(GDRV_SYMS[0]), F);
}

static const char *cu_name(CUresult r)
{
	const char *s = NULL;

	if (r == CUDA_SUCCESS)
		return NULL;
	if (D->GetErrorName)
		D->GetErrorName(r, &s);
	return s ? s : "CUDA_ERROR_?";
}

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------ JSON helpers */

/* A JSON array of objects, each built as a struct jl (its buffer without
 * the closing brace), for the modes with one entry per size. */
struct ab {
	char buf[JL_CAP];
	size_t len;
	int n, truncated;
};

static void ab_begin(struct ab *a)
{
	a->buf[0] = '[';
	a->buf[1] = 0;
	a->len = 1;
	a->n = 0;
	a->truncated = 0;
}

static void ab_add(struct ab *a, struct jl *o)
{
	size_t need = (a->n ? 1 : 0) + o->len + 1;

	if (o->truncated || a->len + need + 2 >= sizeof(a->buf)) {
		a->truncated = 1;
		return;
	}
	if (a->n)
		a->buf[a->len++] = ',';
	memcpy(a->buf + a->len, o->buf, o->len);
	a->len += o->len;
	a->buf[a->len++] = '}';
	a->buf[a->len] = 0;
	a->n++;
}

/* key: the array so far, closed; a lost entry makes the line "truncated". */
static void jl_array(struct jl *j, const char *key, struct ab *a)
{
	size_t mark = jl_key(j, key);

	if (a->len == 0) {
		jl_put(j, mark, "null");
		return;
	}
	jl_put(j, mark, "%s]", a->buf);
	if (a->truncated)
		j->truncated = 1;
}

static void jl_rc(struct jl *j, const char *key, const char *errkey, int rc)
{
	jl_count(j, key, rc);
	if (errkey && rc > 0)
		jl_str(j, errkey, cu_name((CUresult)rc));
}

static void stats(double *v, int n, double *med, double *p99, double *mx)
{
	if (n <= 0)
		return;
	qsort(v, (size_t)n, sizeof(double), cmp_double);
	if (med)
		*med = pct_sorted(v, n, 0.5);
	if (p99)
		*p99 = pct_sorted(v, n, 0.99);
	if (mx)
		*mx = v[n - 1];
}

/* ------------------------------------------------------------ kernels */

__device__ static inline unsigned dev_smid(void)
{
	unsigned r;

	asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
	return r;
}

__device__ static inline unsigned long long gtimer(void)
{
	unsigned long long t;

	asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
	return t;
}

/* slot[0] = earliest block start, slot[1] = latest block end (globaltimer);
 * mask: bit %smid of every block. */
__global__ void bind_fma(float *out, long long iters, unsigned *mask, unsigned long long *slot)
{
	uint32_t t = blockIdx.x * blockDim.x + threadIdx.x;
	float x[CHAINS];

	if (threadIdx.x == 0) {
		unsigned sm = dev_smid();

		atomicMin(&slot[0], gtimer());
		if (sm < MASK_WORDS * 32)
			atomicOr(&mask[sm >> 5], 1u << (sm & 31));
	}
	fma_seed(x, t);
	out[t] = fma_run(x, iters);
	__syncthreads();
	if (threadIdx.x == 0)
		atomicMax(&slot[1], gtimer());
}

__global__ void stamp(unsigned long long *t)
{
	*t = gtimer();
}

__global__ void spin(unsigned long long *end, unsigned long long ns)
{
	unsigned long long t0 = gtimer(), t;

	do
		t = gtimer();
	while (t - t0 < ns);
	*end = t;
}

/* out[0]: smallest step of %globaltimer seen; out[1]: mean step. */
__global__ void timer_res(unsigned long long *out)
{
	unsigned long long t0 = gtimer(), prev = t0, mind = ~0ull;
	int changes = 0;

	for (int i = 0; i < 1000000 && changes < 1000; i++) {
		unsigned long long t = gtimer();

		if (t != prev) {
			if (t - prev < mind)
				mind = t - prev;
			prev = t;
			changes++;
		}
	}
	out[0] = mind;
	out[1] = changes ? (prev - t0) / (unsigned long long)changes : 0;
}


/* put42 for modload, as nvcc -ptx writes it (PTX ISA 8.0: CUDA 12.0+). */
static const char PUT42_PTX[] =
	".version 8.0\n"
	".target sm_75\n"
	".address_size 64\n"
	".visible .entry put42(\n"
	"\t.param .u64 put42_param_0\n"
	")\n"
	"{\n"
	"\t.reg .b32 %r<2>;\n"
	"\t.reg .b64 %rd<3>;\n"
	"\tld.param.u64 %rd1, [put42_param_0];\n"
	"\tcvta.to.global.u64 %rd2, %rd1;\n"
	"\tmov.u32 %r1, 42;\n"
	"\tst.global.u32 [%rd2], %r1;\n"
	"\tret;\n"
	"}\n";

/* ------------------------------------------------------------ partitions */

struct green {
	CUgreenCtx g;
	CUstream s;
	unsigned want, sms, rest;
	CUresult rc;                  /* of the step that failed, or success */
	const char *step;             /* that step's call */
};

/* p's green context of the resources (and its stream when with_stream):
 * descriptor, context, stream; the failing step is kept in p. */
static CUresult green_from(struct green *p, CUdevResource *res, unsigned n, int with_stream)
{
	CUdevResourceDesc desc = NULL;

	p->step = "cuDevResourceGenerateDesc";
	if ((p->rc = G->DevResourceGenerateDesc(&desc, res, n)))
		return p->rc;
	p->step = "cuGreenCtxCreate";
	if ((p->rc = G->GreenCtxCreate(&p->g, desc, R.dev, CU_GREEN_CTX_DEFAULT_STREAM))) {
		p->g = NULL;
		return p->rc;
	}
	if (with_stream) {
		p->step = "cuGreenCtxStreamCreate";
		if ((p->rc = G->GreenCtxStreamCreate(&p->s, p->g, CU_STREAM_NON_BLOCKING, 0))) {
			p->s = NULL;
			return p->rc;
		}
	}
	p->step = NULL;
	return CUDA_SUCCESS;
}

/* A partition of at least `want` SMs (and its stream when with_stream).
 * The failing call is kept, not noted: a size the driver refuses is an
 * answer in split and bind; green_need() makes it a failure. */
static CUresult green_make(struct green *p, unsigned want, unsigned flags, int with_stream)
{
	CUdevResource grp, rest;
	unsigned nb = 1;

	memset(p, 0, sizeof(*p));
	memset(&grp, 0, sizeof(grp));
	memset(&rest, 0, sizeof(rest));
	p->want = want;
	p->step = "cuDevSmResourceSplitByCount";
	if ((p->rc = G->DevSmResourceSplitByCount(&grp, &nb, &R.res, &rest, flags, want)))
		return p->rc;
	if (nb != 1) {
		p->step = "cuDevSmResourceSplitByCount (no group)";
		return p->rc = CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
	}
	p->sms = grp.sm.smCount;
	p->rest = rest.type == CU_DEV_RESOURCE_TYPE_SM ? rest.sm.smCount : 0;
	return green_from(p, &grp, 1, with_stream);
}

/* The shim's way (shim/shim_part.c): the whole device split once into
 * groups of minSmPartitionSize SMs, the partition made of the run of groups
 * from SM `first` (a multiple of that size) on, at least `want` SMs.  Two
 * processes given disjoint runs get disjoint SMs only if every process's
 * split orders the SMs alike: the hold pairs with --first answer that. */
static int split_groups(CUdevResource *grp, unsigned max, CUdevResource *rest, CUresult *rc);

static CUresult green_span(struct green *p, unsigned first, unsigned want)
{
	enum { GMAX = 256 };
	CUdevResource grp[GMAX + 1], rest;
	unsigned gran = R.res.sm.minSmPartitionSize ? R.res.sm.minSmPartitionSize : 1;
	unsigned g0 = first / gran, count = (want + gran - 1) / gran;
	int nb;

	memset(p, 0, sizeof(*p));
	p->want = want;
	p->step = "cuDevSmResourceSplitByCount (groups)";
	if ((nb = split_groups(grp, GMAX, &rest, &p->rc)) < 0)
		return p->rc;
	if (rest.sm.smCount)          /* the SMs no whole group took: one more */
		grp[nb++] = rest;
	if (first % gran || g0 + count > (unsigned)nb) {
		p->step = "--first/--sms (span past the groups or off their size)";
		return p->rc = CUDA_ERROR_INVALID_VALUE;
	}
	for (unsigned i = 0; i < count; i++)
		p->sms += grp[g0 + i].sm.smCount;
	return green_from(p, &grp[g0], count, 1);
}

static int green_need(struct green *p, unsigned want)
{
	if (green_make(p, want, 0, 1) == CUDA_SUCCESS)
		return 0;
	fail_drv(F, D, p->step, p->rc);
	return -1;
}

/* Clean-up: a failure is printed, not made the report's error. */
static void green_drop(struct green *p)
{
	if (p->s && G->StreamDestroy(p->s) != CUDA_SUCCESS)
		fprintf(stderr, "%s: cuStreamDestroy failed\n", NAME);
	if (p->g && G->GreenCtxDestroy(p->g) != CUDA_SUCCESS)
		fprintf(stderr, "%s: cuGreenCtxDestroy failed\n", NAME);
	p->s = NULL;
	p->g = NULL;
}

/* ------------------------------------------------------------ SM masks */

struct smset {
	int used, lo, hi;
};

static struct smset mask_stats(const unsigned *m)
{
	struct smset r = { 0, -1, -1 };

	for (int i = 0; i < MASK_WORDS * 32; i++)
		if (m[i >> 5] >> (i & 31) & 1u) {
			if (r.lo < 0)
				r.lo = i;
			r.hi = i;
			r.used++;
		}
	return r;
}

/* The mask as one hexadecimal number, bit i = %smid i: int(s, 16). */
static void mask_hex(const unsigned *m, char *out, size_t n)
{
	size_t k = 0;
	int started = 0;

	for (int w = MASK_WORDS - 1; w >= 0 && k + 9 <= n; w--) {
		if (!started && !m[w] && w)
			continue;
		k += (size_t)snprintf(out + k, n - k, started ? "%08x" : "%x", m[w]);
		started = 1;
	}
	out[k] = 0;
}

/* Device buffers shared by bind and hold. */
static struct {
	float *out;
	unsigned *mask;
	unsigned long long *slots, *ts;
	int nslots;
} B;

static int slots_reset(int nslots)
{
	size_t bytes = (size_t)nslots * 2 * sizeof(unsigned long long);
	unsigned long long *h = (unsigned long long *)malloc(bytes);
	int rc;

	if (!h) {
		fail_note(F, "malloc", ENOMEM, "no memory for the time slots");
		return -1;
	}
	for (int i = 0; i < nslots; i++) {
		h[2 * i] = ULLONG_MAX;
		h[2 * i + 1] = 0;
	}
	rc = RCK(cudaMemcpy(B.slots, h, bytes, cudaMemcpyHostToDevice));
	free(h);
	return rc;
}

static double slot_ms(const unsigned long long *h, int i)
{
	if (h[2 * i] == ULLONG_MAX || h[2 * i + 1] < h[2 * i])
		return NAN;           /* the kernel did not run */
	return (double)(h[2 * i + 1] - h[2 * i]) / 1e6;
}

static int mask_reset(void)
{
	return RCK(cudaMemset(B.mask, 0, MASK_WORDS * sizeof(unsigned))) || RCK(cudaDeviceSynchronize());
}

/* One bind_fma on stream s into slot i, waited for. */
static int bind_launch(CUstream s, unsigned grid, long long iters, int slot, int wait)
{
	bind_fma<<<grid, BLOCK, 0, (cudaStream_t)s>>>(B.out, iters, B.mask, B.slots + 2 * slot);
	if (RCK(cudaGetLastError()))
		return -1;
	return wait ? GCK(StreamSynchronize, s) : 0;
}

/* ============================================================ split */

static struct {
	struct ab plain, ignore;
	/* the whole device in groups of min_partition SMs, as the shim splits
	 * it: how many, their SM counts, what is left; then a context of the
	 * last group with the rest, and of every group with the rest */
	int g_rc, g_nb, g_rest, last_rc, last_sms, all_rc, all_sms;
	char g_sms[1024];
	/* for each minCount of SPLIT_MIN, as many groups as the driver makes
	 * (64 asked): "min:groups x size + rest" (simgpu's model of counts
	 * other than groups of 8 was never measured) */
	char multi[1024];
} SP;

/* The device split as the shim splits it (groups of min_partition SMs and
 * the remaining ones, 0 SMs when none): the groups' count, or -1 (*rc). */
static int split_groups(CUdevResource *grp, unsigned max, CUdevResource *rest, CUresult *rc)
{
	unsigned gran = R.res.sm.minSmPartitionSize ? R.res.sm.minSmPartitionSize : 1;
	unsigned nb = R.res.sm.smCount / gran < max ? R.res.sm.smCount / gran : max;

	memset(grp, 0, max * sizeof(*grp));
	memset(rest, 0, sizeof(*rest));
	*rc = G->DevSmResourceSplitByCount(grp, &nb, &R.res, rest, 0, gran);
	if (*rc != CUDA_SUCCESS)
		return -1;
	if (rest->type != CU_DEV_RESOURCE_TYPE_SM)
		rest->sm.smCount = 0;
	return (int)nb;
}

/* A green context of these resources: its SM count, or -1 (*rc). */
static int ctx_of(CUdevResource *r, unsigned n, CUresult *rc)
{
	CUdevResourceDesc desc = NULL;
	CUdevResource got;
	CUgreenCtx g = NULL;
	int sms = -1;

	memset(&got, 0, sizeof(got));
	if ((*rc = G->DevResourceGenerateDesc(&desc, r, n)) != CUDA_SUCCESS ||
	    (*rc = G->GreenCtxCreate(&g, desc, R.dev, CU_GREEN_CTX_DEFAULT_STREAM)) != CUDA_SUCCESS)
		return -1;
	if (G->GreenCtxGetDevResource(g, &got, CU_DEV_RESOURCE_TYPE_SM) == CUDA_SUCCESS)
		sms = (int)got.sm.smCount;
	if (G->GreenCtxDestroy(g) != CUDA_SUCCESS)
		fprintf(stderr, "%s: cuGreenCtxDestroy failed\n", NAME);
	return sms;
}

static void split_whole(void)
{
	enum { GMAX = 256 };
	CUdevResource grp[GMAX + 1], rest;
	CUresult r;
	int nb = split_groups(grp, GMAX, &rest, &r);
	size_t off = 0;

	SP.g_rc = (int)r;
	SP.g_nb = nb;
	SP.last_rc = SP.all_rc = -1;
	SP.last_sms = SP.all_sms = -1;
	if (nb < 0)
		return;
	SP.g_rest = (int)rest.sm.smCount;
	for (int i = 0; i < nb && off + 16 < sizeof(SP.g_sms); i++)
		off += (size_t)snprintf(SP.g_sms + off, sizeof(SP.g_sms) - off, "%s%u", i ? "," : "",
					grp[i].sm.smCount);
	if (nb < 1 || !rest.sm.smCount)
		return;
	grp[nb] = rest;
	SP.last_sms = ctx_of(&grp[nb - 1], 2, &r);
	SP.last_rc = (int)r;
	SP.all_sms = ctx_of(grp, (unsigned)nb + 1, &r);
	SP.all_rc = (int)r;
}

static void split_multi(void)
{
	enum { GMAX = 64 };
	CUdevResource grp[GMAX], rest;
	size_t off = 0;

	for (int i = 0; i < NSPLIT && off + 48 < sizeof(SP.multi); i++) {
		unsigned nb = GMAX;
		CUresult r;

		memset(grp, 0, sizeof(grp));
		memset(&rest, 0, sizeof(rest));
		r = G->DevSmResourceSplitByCount(grp, &nb, &R.res, &rest, 0, SPLIT_MIN[i]);
		if (r != CUDA_SUCCESS)
			off += (size_t)snprintf(SP.multi + off, sizeof(SP.multi) - off, "%s%u:rc%d",
						off ? "," : "", SPLIT_MIN[i], (int)r);
		else
			off += (size_t)snprintf(SP.multi + off, sizeof(SP.multi) - off, "%s%u:%ux%u+%u",
						off ? "," : "", SPLIT_MIN[i], nb, nb ? grp[0].sm.smCount : 0,
						rest.type == CU_DEV_RESOURCE_TYPE_SM ? rest.sm.smCount : 0);
	}
}

static int mode_split(void)
{
	ab_begin(&SP.plain);
	ab_begin(&SP.ignore);
	split_whole();
	split_multi();
	for (int f = 0; f < 2; f++) {
		unsigned flags = f ? CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING : 0;
		struct ab *a = f ? &SP.ignore : &SP.plain;

		for (int i = 0; i < NSPLIT; i++) {
			CUdevResource grp, rest;
			unsigned nb = 1;
			int ctx_rc = -1, ctx_sms = -1;
			struct jl o;
			CUresult r;

			memset(&grp, 0, sizeof(grp));
			memset(&rest, 0, sizeof(rest));
			r = G->DevSmResourceSplitByCount(&grp, &nb, &R.res, &rest, flags, SPLIT_MIN[i]);
			if (r == CUDA_SUCCESS && nb == 1) {
				CUresult c;

				ctx_sms = ctx_of(&grp, 1, &c);
				ctx_rc = (int)c;
			}
			jl_begin(&o);
			jl_int(&o, "min", SPLIT_MIN[i]);
			jl_rc(&o, "rc", "err", (int)r);
			jl_count(&o, "nb", r == CUDA_SUCCESS ? (long long)nb : -1);
			jl_count(&o, "sms", r == CUDA_SUCCESS && nb ? (long long)grp.sm.smCount : -1);
			jl_count(&o, "rest", r != CUDA_SUCCESS ? -1
					     : rest.type == CU_DEV_RESOURCE_TYPE_SM ? (long long)rest.sm.smCount : 0);
			jl_rc(&o, "ctx_rc", "ctx_err", ctx_rc);
			jl_count(&o, "ctx_sms", ctx_sms);
			ab_add(a, &o);
		}
	}
	R.ok = 1;
	return 0;
}

static void emit_split(struct jl *j)
{
	jl_int(j, "ignore_cosched_flag", CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING);
	jl_array(j, "splits", &SP.plain);
	jl_array(j, "splits_ignore_cosched", &SP.ignore);
	jl_rc(j, "groups_rc", "groups_err", SP.g_rc);
	jl_int(j, "groups_nb", SP.g_nb);
	jl_str(j, "groups_sms", SP.g_sms);
	jl_int(j, "groups_rest", SP.g_rest);
	jl_rc(j, "last_with_rest_rc", "last_with_rest_err", SP.last_rc);
	jl_int(j, "last_with_rest_sms", SP.last_sms);
	jl_rc(j, "all_with_rest_rc", "all_with_rest_err", SP.all_rc);
	jl_int(j, "all_with_rest_sms", SP.all_sms);
	jl_str(j, "multi", SP.multi);
}

/* ============================================================ bind */

static struct {
	long long iters, grid;
	int bps, n;
	double calib_ms;
	struct ab runs;
} BI;

/* The runs of one context: n timed launches after a warm-up, the SM set,
 * a check of two outputs.  ok: 0/1 check result, -1 not checked. */
static int bind_size(CUstream s, double *med, double *mn, double *mx, struct smset *ss, int *ok)
{
	int n = BI.n;
	unsigned long long *h = (unsigned long long *)calloc((size_t)(n + 1) * 2, sizeof(*h));
	double *ms = (double *)calloc((size_t)n, sizeof(double));
	unsigned m[MASK_WORDS];
	uint64_t threads = (uint64_t)BI.grid * BLOCK;
	int rc = -1, k = 0;

	*ok = -1;
	if (!h || !ms) {
		fail_note(F, "calloc", ENOMEM, "no memory for the times");
		goto out;
	}
	if (slots_reset(n + 1) || mask_reset() ||
	    RCK(cudaMemset(B.out, 0xff, (size_t)threads * sizeof(float))) || RCK(cudaDeviceSynchronize()))
		goto out;
	for (int i = 0; i <= n; i++)          /* slot 0: the warm-up */
		if (bind_launch(s, (unsigned)BI.grid, BI.iters, i, 1))
			goto out;
	if (RCK(cudaMemcpy(h, B.slots, (size_t)(n + 1) * 2 * sizeof(*h), cudaMemcpyDeviceToHost)) ||
	    RCK(cudaMemcpy(m, B.mask, sizeof(m), cudaMemcpyDeviceToHost)))
		goto out;
	for (int i = 1; i <= n; i++)
		if (!isnan(slot_ms(h, i)))
			ms[k++] = slot_ms(h, i);
	if (k) {
		stats(ms, k, med, NULL, mx);
		*mn = ms[0];
	}
	*ss = mask_stats(m);
	if (BI.iters * CHAINS <= 100000000LL) {
		uint64_t t[2] = { 0, threads - 1 };

		*ok = 1;
		for (int i = 0; i < 2; i++) {
			float got, want = host_fma_thread((uint32_t)t[i], BI.iters);

			if (RCK(cudaMemcpy(&got, B.out + t[i], sizeof(got), cudaMemcpyDeviceToHost)))
				goto out;
			if (memcmp(&got, &want, sizeof(got)))
				*ok = 0;
		}
	}
	rc = k == n ? 0 : -1;
	if (k != n)
		fail_note(F, "bind_fma", -1, "a timed launch left no time stamps");
out:
	free(h);
	free(ms);
	return rc;
}

static void bind_entry(const char *ctx, const struct green *p, int rc, double med, double mn,
		       double mx, double base, const struct smset *ss, int ok)
{
	struct jl o;
	unsigned sms = p ? p->sms : (unsigned)R.res.sm.smCount;

	jl_begin(&o);
	jl_str(&o, "ctx", ctx);
	jl_count(&o, "want", p ? (long long)p->want : -1);
	jl_int(&o, "rc", rc);
	if (rc > 0)
		jl_str(&o, "err", cu_name((CUresult)rc));
	if (rc > 0 && p && p->step)
		jl_str(&o, "step", p->step);
	jl_count(&o, "sms", rc ? -1 : (long long)sms);
	jl_num(&o, "median_ms", med);
	jl_num(&o, "min_ms", mn);
	jl_num(&o, "max_ms", mx);
	jl_num(&o, "rel", med / base);
	jl_num(&o, "ideal_rel", rc || !sms ? NAN : (double)R.res.sm.smCount / sms);
	jl_count(&o, "sm_used", ss ? ss->used : -1);
	jl_count(&o, "sm_min", ss ? ss->lo : -1);
	jl_count(&o, "sm_max", ss ? ss->hi : -1);
	jl_bool(&o, "check", ok);
	ab_add(&BI.runs, &o);
}

static int mode_bind(const struct opts *o)
{
	cudaStream_t ps = NULL;
	double base = NAN, ms = 0;
	int all_ok = 1;
	unsigned long long h[2];

	ab_begin(&BI.runs);
	if (RCK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&BI.bps, bind_fma, BLOCK, 0)))
		return -1;
	BI.grid = (long long)R.sm_count * BI.bps * o->waves;
	if (BI.grid < 1 || BI.grid > 0x7fffffffLL) {
		fail_note(F, "grid", -1, "grid size out of range");
		return -1;
	}
	if (RCK(cudaMalloc(&B.out, (size_t)BI.grid * BLOCK * sizeof(float))) ||
	    RCK(cudaMalloc(&B.mask, MASK_WORDS * sizeof(unsigned))) ||
	    RCK(cudaMalloc(&B.slots, (size_t)(BI.n + 1) * 2 * sizeof(unsigned long long))) ||
	    RCK(cudaStreamCreateWithFlags(&ps, cudaStreamNonBlocking)))
		return -1;

	/* K: one tiny launch first (lazy loading), then x4 until a quarter of
	 * the target, then scaled */
	if (slots_reset(1) || bind_launch((CUstream)ps, (unsigned)BI.grid, 1, 0, 1))
		return -1;
	BI.iters = o->iters;
	for (long long k = 16; o->iters <= 0; k *= 4) {
		if (slots_reset(1) || bind_launch((CUstream)ps, (unsigned)BI.grid, k, 0, 1) ||
		    RCK(cudaMemcpy(h, B.slots, sizeof(h), cudaMemcpyDeviceToHost)))
			return -1;
		ms = slot_ms(h, 0);
		if (isnan(ms)) {
			fail_note(F, "bind_fma", -1, "the calibration launch left no time stamps");
			return -1;
		}
		if (ms >= o->target_ms / 4 || k >= (1LL << 30)) {
			BI.iters = ms > 0 ? (long long)(k * (o->target_ms / ms)) : k;
			BI.calib_ms = ms;
			break;
		}
	}
	if (BI.iters < 1)
		BI.iters = 1;

	{
		double med = NAN, mn = NAN, mx = NAN;
		struct smset ss;
		int ok;

		if (bind_size((CUstream)ps, &med, &mn, &mx, &ss, &ok)) {
			bind_entry("primary", NULL, 0, med, mn, mx, med, NULL, ok);
			cudaStreamDestroy(ps);
			return -1;
		}
		base = med;
		bind_entry("primary", NULL, 0, med, mn, mx, base, &ss, ok);
		all_ok &= ok != 0;
	}
	cudaStreamDestroy(ps);
	for (int i = 0; i < NBIND; i++) {
		struct green p;
		double med = NAN, mn = NAN, mx = NAN;
		struct smset ss;
		int ok = -1;
		CUresult r;

		if (BIND_SMS[i] > R.res.sm.smCount)
			continue;
		r = green_make(&p, BIND_SMS[i], 0, 1);
		if (r != CUDA_SUCCESS) {           /* a size refused: data */
			bind_entry("green", &p, (int)r, NAN, NAN, NAN, base, NULL, -1);
			green_drop(&p);
			continue;
		}
		if (bind_size(p.s, &med, &mn, &mx, &ss, &ok)) {
			bind_entry("green", &p, 0, med, mn, mx, base, NULL, ok);
			green_drop(&p);
			return -1;
		}
		bind_entry("green", &p, 0, med, mn, mx, base, &ss, ok);
		all_ok &= ok != 0;
		green_drop(&p);
	}
	R.ok = all_ok;
	if (!all_ok)
		fail_note(F, "check", -1, "a kernel's output differs from the CPU's");
	return 0;
}

static void emit_bind(struct jl *j)
{
	jl_count(j, "iters", BI.iters);
	jl_count(j, "grid", BI.grid);
	jl_int(j, "block", BLOCK);
	jl_count(j, "blocks_per_sm", BI.bps);
	jl_num(j, "calib_ms", BI.calib_ms);
	jl_int(j, "n", BI.n);
	jl_array(j, "runs", &BI.runs);
}

/* ============================================================ create */

static struct {
	unsigned want, sms;
	int n;
	double make_med, make_max, make_first, ctx_med, ctx_max, stream_med, stream_max,
		stream_first, first_launch_med, first_launch_max, first_launch_first,
		next_launch_med, destroy_med, destroy_max;
} CR;

static int mode_create(const struct opts *o)
{
	int n = o->n > 0 ? o->n : 20, k = 0, rc = -1;
	double *v = (double *)calloc((size_t)n * 6, sizeof(double));
	double *mk = v, *cx = v + n, *st = v + 2 * n, *fl = v + 3 * n, *nl = v + 4 * n, *ds = v + 5 * n;
	unsigned long long *d = NULL;

	if (!v) {
		fail_note(F, "calloc", ENOMEM, "no memory for the times");
		return -1;
	}
	if (RCK(cudaMalloc(&d, sizeof(*d))))
		goto out;
	for (; k < n; k++) {
		CUdevResource grp;
		CUdevResourceDesc desc;
		CUgreenCtx g = NULL;
		CUstream s = NULL;
		unsigned nb = 1;
		double t0, t1, t2, t3, t4, t5, t6;
		int bad;

		memset(&grp, 0, sizeof(grp));
		t0 = now_us();
		if (GCK(DevSmResourceSplitByCount, &grp, &nb, &R.res, NULL, 0, CR.want) ||
		    GCK(DevResourceGenerateDesc, &desc, &grp, 1))
			goto out;
		t1 = now_us();
		if (GCK(GreenCtxCreate, &g, desc, R.dev, CU_GREEN_CTX_DEFAULT_STREAM))
			goto out;
		t2 = now_us();
		CR.sms = grp.sm.smCount;
		bad = GCK(GreenCtxStreamCreate, &s, g, CU_STREAM_NON_BLOCKING, 0);
		t3 = now_us();
		if (!bad) {
			stamp<<<1, 1, 0, (cudaStream_t)s>>>(d);
			bad = RCK(cudaGetLastError()) || GCK(StreamSynchronize, s);
		}
		t4 = now_us();
		if (!bad) {
			stamp<<<1, 1, 0, (cudaStream_t)s>>>(d);
			bad = RCK(cudaGetLastError()) || GCK(StreamSynchronize, s);
		}
		t5 = now_us();
		if (s)
			bad |= GCK(StreamDestroy, s);
		bad |= GCK(GreenCtxDestroy, g);
		t6 = now_us();
		if (bad)
			goto out;
		mk[k] = t2 - t0;
		cx[k] = t2 - t1;
		st[k] = t3 - t2;
		fl[k] = t4 - t3;
		nl[k] = t5 - t4;
		ds[k] = t6 - t5;
	}
	rc = 0;
	R.ok = 1;
out:
	CR.n = k;
	if (k) {
		CR.make_first = mk[0];
		CR.stream_first = st[0];
		CR.first_launch_first = fl[0];
		stats(mk, k, &CR.make_med, NULL, &CR.make_max);
		stats(cx, k, &CR.ctx_med, NULL, &CR.ctx_max);
		stats(st, k, &CR.stream_med, NULL, &CR.stream_max);
		stats(fl, k, &CR.first_launch_med, NULL, &CR.first_launch_max);
		stats(nl, k, &CR.next_launch_med, NULL, NULL);
		stats(ds, k, &CR.destroy_med, NULL, &CR.destroy_max);
	}
	if (d)
		cudaFree(d);
	free(v);
	return rc;
}

static void emit_create(struct jl *j)
{
	jl_int(j, "want", CR.want);
	jl_count(j, "sms", CR.sms ? (long long)CR.sms : -1);
	jl_int(j, "n", CR.n);
	jl_num(j, "make_us_med", CR.make_med);
	jl_num(j, "make_us_max", CR.make_max);
	jl_num(j, "make_us_first", CR.make_first);
	jl_num(j, "ctx_create_us_med", CR.ctx_med);
	jl_num(j, "ctx_create_us_max", CR.ctx_max);
	jl_num(j, "stream_us_med", CR.stream_med);
	jl_num(j, "stream_us_max", CR.stream_max);
	jl_num(j, "stream_us_first", CR.stream_first);
	jl_num(j, "first_launch_us_med", CR.first_launch_med);
	jl_num(j, "first_launch_us_max", CR.first_launch_max);
	jl_num(j, "first_launch_us_first", CR.first_launch_first);
	jl_num(j, "next_launch_us_med", CR.next_launch_med);
	jl_num(j, "destroy_us_med", CR.destroy_med);
	jl_num(j, "destroy_us_max", CR.destroy_max);
}

/* ============================================================ switch */

enum { ARM_PLAIN, ARM_APP, ARM_SHADOW, NARM };
static const char *const ARM_NAME[NARM] = { "plain", "app", "shadow" };

/* idle round trips (a launch on an idle GPU, then the syncs the shim makes
 * for an app's cudaDeviceSynchronize: the shadow stream's, the device's):
 * on S; on PA every time; on PA and PB by turns (each launch a switch) */
enum { IDLE_PLAIN, IDLE_SAME, IDLE_ALT, IDLE_COLD, IDLE_STALE, NIDLE };
static const char *const IDLE_NAME[NIDLE] = { "plain", "same", "alt", "cold", "stale" };
#define COLD_RUN 50             /* cold: PB once after this many trips on PA */
#define STALE_MS 50             /* stale: PB once after this long on PA */
#define STALE_N 40

/* timed samples of idle arm a */
static int idle_count(int a, int n)
{
	return a == IDLE_COLD ? n / COLD_RUN : a == IDLE_STALE ? (n < STALE_N ? n : STALE_N) : n;
}

struct armstat {
	double pair_med, pair_p99, launch_med, launch_p99, gap_med, gap_p99, gap_min;
	int n, covered, violations;
};

static struct {
	unsigned want_a, want_b, sms_a, sms_b;
	int n, rec_rc;
	long long spin_us;
	const char *event_ctx;
	double step_min, step_mean;
	struct armstat arm[NARM];
	double idle_med[NIDLE], idle_p99[NIDLE], idle_launch_med[NIDLE];
} SW;

/* An event made in green context g (for the fallback). */
static int green_event(CUgreenCtx g, CUevent *e)
{
	CUcontext c;
	int bad;

	if (GCK(CtxFromGreenCtx, &c, g) || GCK(CtxSetCurrent, c))
		return -1;
	bad = GCK(EventCreate, e, CU_EVENT_DISABLE_TIMING);
	return GCK(CtxSetCurrent, R.primary) || bad;
}

static int switch_arm(int arm, int n, CUstream S, CUstream P[2], cudaEvent_t e_app,
		      cudaEvent_t e_sh[2], unsigned long long *d_end, unsigned long long *d_start,
		      uint64_t *h_pair, uint64_t *h_launch, unsigned char *covered)
{
	unsigned long long spin_ns = (unsigned long long)SW.spin_us * 1000ull;

	for (int i = -SWITCH_WARM; i < n; i++) {
		int x = (i + SWITCH_WARM) & 1;
		CUstream cur = arm == ARM_PLAIN ? S : P[x];
		CUstream prev = arm == ARM_SHADOW ? P[!x] : S;
		cudaEvent_t e = arm == ARM_APP ? e_app : e_sh[!x];
		int slot = i < 0 ? n : i;         /* warm-up: the spare slot */
		uint64_t h0, h1, h2, h3;

		h0 = now_ns();
		spin<<<1, 1, 0, (cudaStream_t)prev>>>(d_end + slot, spin_ns);
		h1 = now_ns();
		if (arm != ARM_PLAIN &&
		    (RCK(cudaEventRecord(e, (cudaStream_t)prev)) ||
		     RCK(cudaStreamWaitEvent((cudaStream_t)cur, e, 0))))
			return -1;
		h2 = now_ns();
		stamp<<<1, 1, 0, (cudaStream_t)cur>>>(d_start + slot);
		h3 = now_ns();
		if (RCK(cudaGetLastError()) || GCK(StreamSynchronize, cur))
			return -1;
		if (i >= 0) {
			h_pair[i] = h2 - h1;
			h_launch[i] = h3 - h2;
			covered[i] = h3 - h0 < spin_ns;
		}
	}
	return 0;
}

static void arm_stats(struct armstat *a, int arm, int n, const unsigned long long *end,
		      const unsigned long long *start, const uint64_t *pair, const uint64_t *launch,
		      const unsigned char *covered, double *tmp)
{
	int k = 0;

	a->n = n;
	a->covered = a->violations = 0;
	if (arm != ARM_PLAIN) {
		for (int i = 0; i < n; i++)
			tmp[i] = (double)pair[i];
		stats(tmp, n, &a->pair_med, &a->pair_p99, NULL);
	}
	for (int i = 0; i < n; i++)
		tmp[i] = (double)launch[i];
	stats(tmp, n, &a->launch_med, &a->launch_p99, NULL);
	for (int i = 0; i < n; i++) {
		if (start[i] < end[i])
			a->violations++;
		else if (covered[i])
			tmp[k++] = (double)(start[i] - end[i]) / 1e3;
	}
	a->covered = k;
	if (k) {
		stats(tmp, k, &a->gap_med, &a->gap_p99, NULL);
		a->gap_min = tmp[0];
	}
}

/* One idle round trip on stream cur: host ns from the launch call to the
 * device sync's return into *rt, the launch call alone into *lc. */
static int idle_trip(CUstream cur, unsigned long long *d, double *rt, double *lc)
{
	uint64_t h0, h1, h2;

	h0 = now_ns();
	stamp<<<1, 1, 0, (cudaStream_t)cur>>>(d);
	h1 = now_ns();
	if (RCK(cudaGetLastError()) || GCK(StreamSynchronize, cur) || RCK(cudaDeviceSynchronize()))
		return -1;
	h2 = now_ns();
	*rt = (double)(h2 - h0);
	*lc = (double)(h1 - h0);
	return 0;
}

/* The idle arms (IDLE_NAME), each into rt[a * n ...] and lc[a * n ...]:
 * plain, same, alt --n trips each (after warm-up ones); cold: COLD_RUN trips
 * on PA then the timed one on PB, n / COLD_RUN times; stale: trips on PA for
 * STALE_MS (the shim's flips in bench/partitions.py come 50 ms apart) then
 * the timed one on PB, STALE_N times. */
static int idle_trips(int n, CUstream S, CUstream P[2], unsigned long long *d, double *rt,
		      double *lc)
{
	double x, y;

	for (int a = 0; a < NIDLE; a++) {
		int m = idle_count(a, n);

		for (int i = -SWITCH_WARM; i < m; i++) {
			double *r = i < 0 ? &x : &rt[a * n + i], *l = i < 0 ? &y : &lc[a * n + i];
			CUstream cur = a == IDLE_PLAIN ? S : a == IDLE_ALT ? P[i & 1] : P[0];

			if (a == IDLE_COLD || a == IDLE_STALE) {
				uint64_t t0 = now_ns();

				for (int k = 0; a == IDLE_COLD ? k < COLD_RUN :
				     now_ns() - t0 < STALE_MS * 1000000ull; k++)
					if (idle_trip(P[0], d, &x, &y))
						return -1;
				cur = P[1];
			}
			if (idle_trip(cur, d, r, l))
				return -1;
		}
	}
	return 0;
}

static int mode_switch(void)
{
	struct green ga, gb;
	cudaStream_t S = NULL;
	cudaEvent_t e_app = NULL, e_sh = NULL, e_use[2] = { NULL, NULL };
	CUevent e_green[2] = { NULL, NULL };
	CUstream P[2];
	unsigned long long *d_end = NULL, *d_start = NULL, *h_end = NULL, *h_start = NULL, hr[2];
	uint64_t *h_pair = NULL, *h_launch = NULL;
	unsigned char *cov = NULL;
	double *tmp = NULL, *rt = NULL;
	int n = SW.n, rc = -1;
	size_t per = (size_t)n + 1;
	cudaError_t e;

	memset(&ga, 0, sizeof(ga));
	memset(&gb, 0, sizeof(gb));
	if (SW.want_b > R.res.sm.smCount)
		SW.want_b = R.res.sm.smCount;
	h_end = (unsigned long long *)calloc(NARM * per, sizeof(*h_end));
	h_start = (unsigned long long *)calloc(NARM * per, sizeof(*h_start));
	h_pair = (uint64_t *)calloc(NARM * per, sizeof(*h_pair));
	h_launch = (uint64_t *)calloc(NARM * per, sizeof(*h_launch));
	cov = (unsigned char *)calloc(NARM * per, 1);
	tmp = (double *)calloc(per, sizeof(double));
	if (!h_end || !h_start || !h_pair || !h_launch || !cov || !tmp) {
		fail_note(F, "calloc", ENOMEM, "no memory for the times");
		goto out;
	}
	if (green_need(&ga, SW.want_a) || green_need(&gb, SW.want_b))
		goto out;
	SW.sms_a = ga.sms;
	SW.sms_b = gb.sms;
	P[0] = ga.s;
	P[1] = gb.s;
	if (RCK(cudaStreamCreateWithFlags(&S, cudaStreamNonBlocking)) ||
	    RCK(cudaEventCreateWithFlags(&e_app, cudaEventDisableTiming)) ||
	    RCK(cudaEventCreateWithFlags(&e_sh, cudaEventDisableTiming)) ||
	    RCK(cudaMalloc(&d_end, NARM * per * sizeof(*d_end))) ||
	    RCK(cudaMalloc(&d_start, NARM * per * sizeof(*d_start))) ||
	    RCK(cudaMemset(d_end, 0, NARM * per * sizeof(*d_end))) ||
	    RCK(cudaMemset(d_start, 0, NARM * per * sizeof(*d_start))) ||
	    RCK(cudaDeviceSynchronize()))
		goto out;

	/* %globaltimer's resolution, on S */
	timer_res<<<1, 1, 0, S>>>(d_end);
	if (RCK(cudaGetLastError()) || RCK(cudaStreamSynchronize(S)) ||
	    RCK(cudaMemcpy(hr, d_end, sizeof(hr), cudaMemcpyDeviceToHost)))
		goto out;
	SW.step_min = hr[0] == ~0ull ? NAN : (double)hr[0];
	SW.step_mean = (double)hr[1];

	/* the shim's event, made in the primary context, recorded on a green stream */
	e = cudaEventRecord(e_sh, (cudaStream_t)P[0]);
	SW.rec_rc = (int)e;
	if (e == cudaSuccess) {
		SW.event_ctx = "primary";
		e_use[0] = e_use[1] = e_sh;
		if (GCK(StreamSynchronize, P[0]))
			goto out;
	} else {
		(void)cudaGetLastError();
		if (green_event(ga.g, &e_green[0]) || green_event(gb.g, &e_green[1]))
			goto out;
		SW.event_ctx = "green";
		e_use[0] = (cudaEvent_t)e_green[0];
		e_use[1] = (cudaEvent_t)e_green[1];
	}

	for (int a = 0; a < NARM; a++)
		if (switch_arm(a, n, (CUstream)S, P, e_app, e_use, d_end + a * per, d_start + a * per,
			       h_pair + a * per, h_launch + a * per, cov + a * per))
			goto out;
	if (RCK(cudaMemcpy(h_end, d_end, NARM * per * sizeof(*h_end), cudaMemcpyDeviceToHost)) ||
	    RCK(cudaMemcpy(h_start, d_start, NARM * per * sizeof(*h_start), cudaMemcpyDeviceToHost)))
		goto out;
	/* after the arms' times are read back: the idle trips stamp d_end */
	if (!(rt = (double *)calloc(2 * NIDLE * (size_t)n, sizeof(double)))) {
		fail_note(F, "calloc", ENOMEM, "no memory for the idle times");
		goto out;
	}
	if (idle_trips(n, (CUstream)S, P, d_end, rt, rt + NIDLE * n))
		goto out;
	for (int a = 0; a < NIDLE; a++) {
		int m = idle_count(a, n);

		stats(rt + a * n, m, &SW.idle_med[a], &SW.idle_p99[a], NULL);
		stats(rt + (NIDLE + a) * n, m, &SW.idle_launch_med[a], NULL, NULL);
	}
	R.ok = 1;
	for (int a = 0; a < NARM; a++) {
		arm_stats(&SW.arm[a], a, n, h_end + a * per, h_start + a * per, h_pair + a * per,
			  h_launch + a * per, cov + a * per, tmp);
		if (SW.arm[a].violations)
			R.ok = 0;
	}
	if (!R.ok)
		fail_note(F, "order", -1, "a kernel started before the kernel it was ordered after ended");
	rc = 0;
out:
	for (int i = 0; i < 2; i++)
		if (e_green[i])
			G->EventDestroy(e_green[i]);
	if (e_app)
		cudaEventDestroy(e_app);
	if (e_sh)
		cudaEventDestroy(e_sh);
	if (S)
		cudaStreamDestroy(S);
	green_drop(&ga);
	green_drop(&gb);
	if (d_end)
		cudaFree(d_end);
	if (d_start)
		cudaFree(d_start);
	free(h_end);
	free(h_start);
	free(h_pair);
	free(h_launch);
	free(cov);
	free(tmp);
	free(rt);
	return rc;
}

static void emit_switch(struct jl *j)
{
	char k[48];

	jl_int(j, "want_a", SW.want_a);
	jl_int(j, "want_b", SW.want_b);
	jl_count(j, "sms_a", SW.sms_a ? (long long)SW.sms_a : -1);
	jl_count(j, "sms_b", SW.sms_b ? (long long)SW.sms_b : -1);
	jl_int(j, "n", SW.n);
	jl_int(j, "spin_us", SW.spin_us);
	jl_count(j, "rec_on_green_rc", SW.rec_rc);
	jl_str(j, "rec_on_green_err", SW.rec_rc > 0 ? cudaGetErrorName((cudaError_t)SW.rec_rc) : NULL);
	jl_str(j, "event_ctx", SW.event_ctx);
	jl_num(j, "timer_step_ns_min", SW.step_min);
	jl_num(j, "timer_step_ns_mean", SW.step_mean);
	for (int a = 0; a < NARM; a++) {
		const struct armstat *s = &SW.arm[a];

#define K(suffix) (snprintf(k, sizeof(k), "%s_%s", ARM_NAME[a], suffix), k)
		if (a != ARM_PLAIN) {
			jl_num(j, K("pair_ns_med"), s->pair_med);
			jl_num(j, K("pair_ns_p99"), s->pair_p99);
		}
		jl_num(j, K("launch_ns_med"), s->launch_med);
		jl_num(j, K("launch_ns_p99"), s->launch_p99);
		jl_num(j, K("gap_us_med"), s->gap_med);
		jl_num(j, K("gap_us_p99"), s->gap_p99);
		jl_num(j, K("gap_us_min"), s->gap_min);
		jl_count(j, K("covered"), s->covered);
		jl_count(j, K("violations"), s->violations);
	}
	for (int a = 0; a < NIDLE; a++) {
#undef K
#define K(suffix) (snprintf(k, sizeof(k), "idle_%s_%s", IDLE_NAME[a], suffix), k)
		jl_num(j, K("us_med"), SW.idle_med[a] / 1e3);
		jl_num(j, K("us_p99"), SW.idle_p99[a] / 1e3);
		jl_num(j, K("launch_ns_med"), SW.idle_launch_med[a]);
#undef K
	}
}

/* ============================================================ modload */

enum { V_PRIM, V_LIB, V_MODGREEN, V_MODPRIM, NVAR };
static const char *const VAR_NAME[NVAR] = { "primary_on_primary", "library_on_green",
					    "module_green_on_green", "module_primary_on_green" };

static struct {
	unsigned want, sms;
	int green_is_primary;
	struct {
		int load_rc, launch_rc, sync_rc, ok;
		long long value;
	} v[NVAR];
} ML;

/* Launch f on s (put42 into d), wait, read the value back. */
static int put42_run(int v, CUfunction f, CUstream s, int *d)
{
	void *args[] = { &d };
	int val = 0;
	CUresult r;

	if (RCK(cudaMemset(d, 0, sizeof(int))) || RCK(cudaDeviceSynchronize()))
		return -1;
	r = G->LaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, args, NULL);
	ML.v[v].launch_rc = (int)r;
	if (r == CUDA_SUCCESS)
		ML.v[v].sync_rc = (int)G->StreamSynchronize(s);
	/* a launch refused is the answer; reading the value back failing is not */
	if (RCK(cudaMemcpy(&val, d, sizeof(val), cudaMemcpyDeviceToHost)))
		return -1;
	ML.v[v].value = val;
	ML.v[v].ok = r == CUDA_SUCCESS && ML.v[v].sync_rc == 0 && val == 42;
	return 0;
}

static int mode_modload(void)
{
	struct green p;
	cudaStream_t ps = NULL;
	CUmodule mp = NULL, mg = NULL;
	CUlibrary lib = NULL;
	CUfunction fp = NULL, fg = NULL;
	CUkernel kl = NULL;
	CUcontext gc = NULL;
	CUresult r;
	int *d = NULL, rc = -1;

	memset(&p, 0, sizeof(p));
	if (green_need(&p, ML.want) || RCK(cudaMalloc(&d, sizeof(int))) ||
	    RCK(cudaStreamCreateWithFlags(&ps, cudaStreamNonBlocking)))
		goto out;
	ML.sms = p.sms;

	/* the control: loaded and launched in the primary context */
	r = G->ModuleLoadData(&mp, PUT42_PTX);
	ML.v[V_PRIM].load_rc = ML.v[V_MODPRIM].load_rc = (int)r;
	if (r != CUDA_SUCCESS) {
		fail_drv(F, D, "cuModuleLoadData", r);
		goto out;
	}
	if (GCK(ModuleGetFunction, &fp, mp, "put42") || put42_run(V_PRIM, fp, (CUstream)ps, d))
		goto out;

	/* a library: context-independent CUkernel, cast to CUfunction */
	r = G->LibraryLoadData(&lib, PUT42_PTX, NULL, NULL, 0, NULL, NULL, 0);
	if (r == CUDA_SUCCESS)
		r = G->LibraryGetKernel(&kl, lib, "put42");
	ML.v[V_LIB].load_rc = (int)r;
	if (r == CUDA_SUCCESS && put42_run(V_LIB, (CUfunction)kl, p.s, d))
		goto out;

	/* the module loaded again with the green context current */
	if (GCK(CtxFromGreenCtx, &gc, p.g))
		goto out;
	ML.green_is_primary = gc == R.primary;
	if (GCK(CtxSetCurrent, gc))
		goto out;
	r = G->ModuleLoadData(&mg, PUT42_PTX);
	if (r == CUDA_SUCCESS)
		r = G->ModuleGetFunction(&fg, mg, "put42");
	ML.v[V_MODGREEN].load_rc = (int)r;
	if (GCK(CtxSetCurrent, R.primary))
		goto out;
	if (r == CUDA_SUCCESS && put42_run(V_MODGREEN, fg, p.s, d))
		goto out;

	/* the primary context's CUfunction on the green stream: last */
	if (put42_run(V_MODPRIM, fp, p.s, d))
		goto out;
	rc = 0;
	R.ok = ML.v[V_PRIM].ok == 1;
	if (!R.ok)
		fail_note(F, "put42", -1, "the control (primary context module on a primary stream) failed");
out:
	if (mg && G->ModuleUnload(mg) != CUDA_SUCCESS)
		fprintf(stderr, "%s: cuModuleUnload failed\n", NAME);
	if (mp && G->ModuleUnload(mp) != CUDA_SUCCESS)
		fprintf(stderr, "%s: cuModuleUnload failed\n", NAME);
	if (lib && G->LibraryUnload(lib) != CUDA_SUCCESS)
		fprintf(stderr, "%s: cuLibraryUnload failed\n", NAME);
	if (ps)
		cudaStreamDestroy(ps);
	if (d)
		cudaFree(d);
	green_drop(&p);
	return rc;
}

static void emit_modload(struct jl *j)
{
	char k[64];

	jl_int(j, "want", ML.want);
	jl_count(j, "sms", ML.sms ? (long long)ML.sms : -1);
	jl_bool(j, "green_ctx_is_primary", ML.green_is_primary);
	for (int v = 0; v < NVAR; v++) {
		const char *nm = VAR_NAME[v];

		snprintf(k, sizeof(k), "%s_load_rc", nm);
		jl_count(j, k, ML.v[v].load_rc);
		snprintf(k, sizeof(k), "%s_launch_rc", nm);
		jl_count(j, k, ML.v[v].launch_rc);
		snprintf(k, sizeof(k), "%s_launch_err", nm);
		jl_str(j, k, ML.v[v].launch_rc > 0 ? cu_name((CUresult)ML.v[v].launch_rc)
				 : ML.v[v].load_rc > 0 ? cu_name((CUresult)ML.v[v].load_rc) : NULL);
		snprintf(k, sizeof(k), "%s_sync_rc", nm);
		jl_count(j, k, ML.v[v].sync_rc);
		snprintf(k, sizeof(k), "%s_value", nm);
		if (ML.v[v].value == LLONG_MIN)
			jl_null(j, k);
		else
			jl_int(j, k, ML.v[v].value);
		snprintf(k, sizeof(k), "%s_ok", nm);
		jl_bool(j, k, ML.v[v].ok);
	}
}

/* ============================================================ hold */

static struct {
	unsigned want, sms;
	long long first;
	int bps;
	long long iters, grid, n_done;
	unsigned long long first_start, last_end;
	double wall_ms, kern_med, kern_max, busy_frac;
	unsigned mask[MASK_WORDS];
	int have_mask;
} HO;

static int mode_hold(const struct opts *o)
{
	struct green p;
	unsigned long long *h = NULL;
	double *ms = NULL, t0, busy = 0;
	int rc = -1, k = 0;

	memset(&p, 0, sizeof(p));
	if (o->first < 0 ? green_need(&p, HO.want) : green_span(&p, (unsigned)o->first, HO.want)) {
		if (o->first >= 0)
			fail_drv(F, D, p.step, p.rc);
		goto out;
	}
	HO.sms = p.sms;
	HO.first = o->first;
	if (RCK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&HO.bps, bind_fma, BLOCK, 0)))
		goto out;
	HO.grid = (long long)p.sms * HO.bps * o->waves;
	if (HO.grid < 1 || HO.grid > 0x7fffffffLL) {
		fail_note(F, "grid", -1, "grid size out of range");
		goto out;
	}
	h = (unsigned long long *)calloc((size_t)HOLD_SLOTS * 2, sizeof(*h));
	ms = (double *)calloc(HOLD_SLOTS, sizeof(double));
	if (!h || !ms) {
		fail_note(F, "calloc", ENOMEM, "no memory for the times");
		goto out;
	}
	if (RCK(cudaMalloc(&B.out, (size_t)HO.grid * BLOCK * sizeof(float))) ||
	    RCK(cudaMalloc(&B.mask, MASK_WORDS * sizeof(unsigned))) ||
	    RCK(cudaMalloc(&B.slots, (size_t)HOLD_SLOTS * 2 * sizeof(unsigned long long))))
		goto out;
	/* a warm-up (the module is loaded into the green context here), then
	 * fresh slots and mask */
	if (slots_reset(1) || bind_launch(p.s, (unsigned)HO.grid, HO.iters, 0, 1) ||
	    slots_reset(HOLD_SLOTS) || mask_reset())
		goto out;
	t0 = now_us();
	while (k < HOLD_SLOTS && now_us() - t0 < o->ms * 1e3) {
		if (bind_launch(p.s, (unsigned)HO.grid, HO.iters, k, k & 1))
			goto out;
		k++;
	}
	if (GCK(StreamSynchronize, p.s))
		goto out;
	HO.wall_ms = (now_us() - t0) / 1e3;
	HO.n_done = k;
	if (RCK(cudaMemcpy(h, B.slots, (size_t)k * 2 * sizeof(*h), cudaMemcpyDeviceToHost)) ||
	    RCK(cudaMemcpy(HO.mask, B.mask, sizeof(HO.mask), cudaMemcpyDeviceToHost)))
		goto out;
	HO.have_mask = 1;
	for (int i = 0; i < k; i++) {
		ms[i] = slot_ms(h, i);
		if (isnan(ms[i])) {
			fail_note(F, "bind_fma", -1, "a launch left no time stamps");
			goto out;
		}
		busy += ms[i];
	}
	if (k) {
		HO.first_start = h[0];
		HO.last_end = h[2 * (k - 1) + 1];
		if (HO.last_end > HO.first_start)
			HO.busy_frac = busy / ((double)(HO.last_end - HO.first_start) / 1e6);
		stats(ms, k, &HO.kern_med, NULL, &HO.kern_max);
	}
	rc = 0;
	R.ok = k > 0;
out:
	free(h);
	free(ms);
	green_drop(&p);
	return rc;
}

static void emit_hold(struct jl *j)
{
	struct smset ss = mask_stats(HO.mask);
	char hex[MASK_WORDS * 8 + 16];

	jl_int(j, "want", HO.want);
	jl_int(j, "first", HO.first);
	jl_count(j, "sms", HO.sms ? (long long)HO.sms : -1);
	jl_count(j, "iters", HO.iters);
	jl_count(j, "grid", HO.grid);
	jl_count(j, "blocks_per_sm", HO.bps);
	jl_count(j, "iterations", HO.n_done);
	jl_count(j, "first_start_ns", HO.first_start ? (long long)HO.first_start : -1);
	jl_count(j, "last_end_ns", HO.last_end ? (long long)HO.last_end : -1);
	jl_num(j, "span_ms", HO.last_end > HO.first_start && HO.first_start
				     ? (double)(HO.last_end - HO.first_start) / 1e6
				     : NAN);
	jl_num(j, "kernel_ms_med", HO.kern_med);
	jl_num(j, "kernel_ms_max", HO.kern_max);
	jl_num(j, "busy_frac", HO.busy_frac);
	jl_num(j, "wall_ms", HO.wall_ms);
	jl_count(j, "sm_used", HO.have_mask ? ss.used : -1);
	jl_count(j, "sm_min", HO.have_mask ? ss.lo : -1);
	jl_count(j, "sm_max", HO.have_mask ? ss.hi : -1);
	mask_hex(HO.mask, hex, sizeof(hex));
	jl_str(j, "sm_mask", HO.have_mask ? hex : NULL);
}

/* ============================================================ common */

/* Every figure "not known" (null) until measured, the sizes asked for set. */
static void results_init(const struct opts *o)
{
	BI.iters = BI.grid = -1;
	BI.bps = -1;
	BI.n = o->n > 0 ? o->n : 5;
	BI.calib_ms = NAN;

	CR.want = (unsigned)o->sms;
	CR.make_med = CR.make_max = CR.make_first = CR.ctx_med = CR.ctx_max = NAN;
	CR.stream_med = CR.stream_max = CR.stream_first = NAN;
	CR.first_launch_med = CR.first_launch_max = CR.first_launch_first = NAN;
	CR.next_launch_med = CR.destroy_med = CR.destroy_max = NAN;

	SW.n = o->n > 0 ? o->n : 1000;
	SW.spin_us = o->spin_us;
	SW.rec_rc = -1;
	SW.want_a = (unsigned)o->sms;
	SW.want_b = (unsigned)o->sms_b;
	SW.step_min = SW.step_mean = NAN;
	for (int a = 0; a < NARM; a++) {
		struct armstat *s = &SW.arm[a];

		s->pair_med = s->pair_p99 = s->launch_med = s->launch_p99 = NAN;
		s->gap_med = s->gap_p99 = s->gap_min = NAN;
		s->n = s->covered = s->violations = -1;
	}

	ML.want = (unsigned)o->sms;
	ML.green_is_primary = -1;
	for (int v = 0; v < NVAR; v++) {
		ML.v[v].load_rc = ML.v[v].launch_rc = ML.v[v].sync_rc = ML.v[v].ok = -1;
		ML.v[v].value = LLONG_MIN;
	}

	HO.want = (unsigned)o->sms;
	HO.iters = o->iters > 0 ? o->iters : 4096;
	HO.bps = -1;
	HO.grid = HO.n_done = -1;
	HO.wall_ms = HO.kern_med = HO.kern_max = HO.busy_frac = NAN;
}

static int report(int absent_rc, const char *absent_why)
{
	static struct jl j;           /* 8 KiB: off the stack */
	const struct opts *o = R.o;
	char cc[16];

	jl_begin(&j);
	jl_str(&j, "probe", "green");
	jl_str(&j, "mode", MODES[o->mode]);
	jl_str(&j, "tag", o->tag);
	jl_int(&j, "pid", (long long)getpid());
	jl_str(&j, "device", R.device[0] ? R.device : NULL);
	snprintf(cc, sizeof(cc), "%d.%d", R.cc_major, R.cc_minor);
	jl_str(&j, "cc", R.cc_major > 0 ? cc : NULL);
	jl_count(&j, "sm_count", R.sm_count);
	jl_int(&j, "driver_version", R.driver_version);
	jl_int(&j, "runtime_version", R.runtime_version);
	jl_bool(&j, "mps_enabled", R.mps_enabled);
	jl_count(&j, "sm_total", R.have_res ? (long long)R.res.sm.smCount : -1);
	jl_count(&j, "min_partition", R.have_res ? (long long)R.res.sm.minSmPartitionSize : -1);
	jl_count(&j, "cosched_align", R.have_res ? (long long)R.res.sm.smCoscheduledAlignment : -1);
	if (!absent_rc) {
		switch (o->mode) {
		case M_SPLIT: emit_split(&j); break;
		case M_BIND: emit_bind(&j); break;
		case M_CREATE: emit_create(&j); break;
		case M_SWITCH: emit_switch(&j); break;
		case M_MODLOAD: emit_modload(&j); break;
		case M_HOLD: emit_hold(&j); break;
		}
	}
	jl_str(&j, "error", absent_rc ? absent_why : R.F.call[0] ? R.F.msg : NULL);
	jl_str(&j, "error_call", absent_rc ? NULL : R.F.call[0] ? R.F.call : NULL);
	jl_print(&j);
	if (absent_rc)
		return absent_rc;
	return R.F.call[0] || R.ok != 1 ? 1 : 0;
}

static int run(const struct opts *o)
{
	char why[256];
	int rc;

	R.o = o;
	R.sm_count = R.mps_enabled = -1;
	results_init(o);
	cudaDriverGetVersion(&R.driver_version);     /* 0 without a driver: reported */
	cudaRuntimeGetVersion(&R.runtime_version);
	rc = gpu_absent(why, sizeof(why));
	if (rc)
		return report(rc, why);
	if (drv_load(D, F) || gdrv_load())
		return report(0, NULL);
	(void)cudaGetLastError();     /* a lookup that failed may have left one */
	/* cuInit: cudart did it already on NVIDIA's runtime, not on simgpu's */
	if (RCK(cudaSetDevice(0)) || RCK(cudaFree(0)) || GCK(Init, 0) || DCK(DeviceGet, &R.dev, 0) ||
	    DCK(DeviceGetName, R.device, (int)sizeof(R.device), R.dev) ||
	    DCK(DeviceGetAttribute, &R.mps_enabled, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, R.dev) ||
	    DCK(DeviceGetAttribute, &R.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, R.dev) ||
	    DCK(DeviceGetAttribute, &R.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, R.dev) ||
	    RCK(cudaDeviceGetAttribute(&R.sm_count, cudaDevAttrMultiProcessorCount, 0)) ||
	    GCK(CtxGetCurrent, &R.primary))
		return report(0, NULL);
	memset(&R.res, 0, sizeof(R.res));
	if (GCK(DeviceGetDevResource, R.dev, &R.res, CU_DEV_RESOURCE_TYPE_SM))
		return report(0, NULL);
	R.have_res = 1;
	switch (o->mode) {
	case M_SPLIT: mode_split(); break;
	case M_BIND: mode_bind(o); break;
	case M_CREATE: mode_create(o); break;
	case M_SWITCH: mode_switch(); break;
	case M_MODLOAD: mode_modload(); break;
	case M_HOLD: mode_hold(o); break;
	}
	/* freeing is clean-up: printed, the report is kept */
	if ((B.out && cudaFree(B.out) != cudaSuccess) || (B.mask && cudaFree(B.mask) != cudaSuccess) ||
	    (B.slots && cudaFree(B.slots) != cudaSuccess))
		fprintf(stderr, "%s: cudaFree failed\n", NAME);
	return report(0, NULL);
}

static void usage(void)
{
	fprintf(stderr,
		"usage: gpu-green_probe split|bind|create|switch|modload|hold [--n N] [--sms S]\n"
		"         [--sms-b S] [--ms M] [--iters K] [--waves V] [--target-ms T] [--spin-us U]\n"
		"         [--first F] [--tag T]\n"
		"  one JSON line on stdout; exit 0 measured, 1 a call or check failed, "
		"2 no device (or simgpu)\n");
}

int main(int argc, char **argv)
{
	static struct opts o;
	long long v = 0;
	double d = 0;
	const char *bad_arg = NULL;

	o.mode = -1;
	o.waves = 4;
	o.ms = 1000;
	o.sms_b = 120;
	o.first = -1;
	o.spin_us = 100;
	o.target_ms = 5;
	if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
		usage();
		return 0;
	}
	for (int m = 0; argc > 1 && m < M_COUNT; m++)
		if (!strcmp(argv[1], MODES[m]))
			o.mode = m;
	if (o.mode < 0)
		bad_arg = argc > 1 ? argv[1] : "(no mode)";
	for (int i = 2; !bad_arg && i < argc; i++) {
		const char *a = argv[i];
		int bad = 0;

		if (!strcmp(a, "--n"))
			bad = arg_ll(argc, argv, &i, 1, MAX_N, &v), o.n = (int)v;
		else if (!strcmp(a, "--sms"))
			bad = arg_ll(argc, argv, &i, 1, 4096, &v), o.sms = v;
		else if (!strcmp(a, "--sms-b"))
			bad = arg_ll(argc, argv, &i, 1, 4096, &v), o.sms_b = v;
		else if (!strcmp(a, "--first"))
			bad = arg_ll(argc, argv, &i, 0, 4096, &v), o.first = v;
		else if (!strcmp(a, "--ms"))
			bad = arg_ll(argc, argv, &i, 1, 600000, &v), o.ms = v;
		else if (!strcmp(a, "--iters"))
			bad = arg_ll(argc, argv, &i, 1, 1LL << 40, &v), o.iters = v;
		else if (!strcmp(a, "--waves"))
			bad = arg_ll(argc, argv, &i, 1, 1000, &v), o.waves = (int)v;
		else if (!strcmp(a, "--target-ms"))
			bad = arg_d(argc, argv, &i, 0.01, 10000, &d), o.target_ms = d;
		else if (!strcmp(a, "--spin-us"))
			bad = arg_ll(argc, argv, &i, 1, 1000000, &v), o.spin_us = v;
		else if (!strcmp(a, "--tag")) {
			if (i + 1 < argc)
				o.tag = argv[++i];
			else
				bad = 1;
		} else
			bad = 1;
		if (bad)
			bad_arg = a;
	}
	if (!o.sms)
		o.sms = o.mode == M_MODLOAD || o.mode == M_SWITCH ? 16 : 64;
	if (bad_arg) {
		struct jl j;
		char why[160];

		snprintf(why, sizeof(why), "bad argument %s", bad_arg);
		fprintf(stderr, "%s: %s\n", NAME, why);
		usage();
		jl_begin(&j);
		jl_str(&j, "probe", "green");
		jl_str(&j, "mode", o.mode >= 0 ? MODES[o.mode] : NULL);
		jl_str(&j, "error", why);
		jl_print(&j);
		return 1;
	}
	return run(&o);
}
