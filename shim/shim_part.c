/*
 * shim_part.c - SM partitions inside the app: the route kind "partition".
 *
 * The controller writes route CB_ROUTE_PART | start << 8 | pct (ctlblock.h).
 * From the next launch on, the app's kernels run on a green context (CUDA
 * 12.5+) made of the device's SMs from start % to start + pct %, in the app
 * itself: no worker, no copy of its arguments, no memory to share.  The
 * device is split once into groups of minSmPartitionSize SMs
 * (cuDevSmResourceSplitByCount); a partition is a run of them
 * (cuDevResourceGenerateDesc, cuGreenCtxCreate), made once per span and
 * kept, so apps on consecutive spans share no SM.  Each app stream gets a
 * shadow stream in it (cuGreenCtxStreamCreate, non-blocking) at its first
 * launch there.
 *
 * Order is kept on the device, never by waiting on the host, lazily:
 *
 *   launch on S   when S may have work its shadow P has not seen (a local
 *                 operation since, the first launch, another partition
 *                 before), an event recorded on S is waited for by P; the
 *                 kernel goes to P, and S now "owes" P's work
 *   local op on S (copy, memset, event record, callback, query, stream
 *                 sync, a graph launch: the hooks' FWD_FENCE) S first waits
 *                 for an event recorded on P, so the operation follows the
 *                 kernel as it would have on S
 *
 * The CUDA default-stream rules come along: before an operation on the
 * legacy stream every blocking stream pays what it owes, and before one on
 * a blocking stream the legacy stream does (the recorded event then carries
 * the implicit order).  Consecutive kernels on S cost nothing but the
 * launch on P.  A wait is skipped when what it would wait for is done: a
 * non-blocking stream that says idle, or a device nothing was queued on
 * since a whole-device sync returned.  Paying at once after each launch (and
 * always waiting before it): a per-thread default stream, which another
 * thread cannot name; every stream while the task layer brackets launches
 * with its own events (tracing); and driver launches, whose libraries may
 * order their streams with driver calls the shim does not hook.  A stream
 * that captures is never given a wait: it pays after its capture.
 * Whole-device syncs (cudaDeviceSynchronize, cudaFree) wait on the host for
 * every shadow with work first.
 *
 * A switch takes effect at the next launch boundary: leaving a partition
 * makes every owing stream wait for its shadow (device side: microseconds,
 * no drain), and a stream moving to another partition has its new shadow
 * follow the old one.
 *
 * What stays on all SMs, in order, counted in part_local: graph launches (a
 * graph's kernels keep the context they were captured in), cooperative
 * kernels (a partition may be too small for their grid), and a launch the
 * partition stream refused (it runs again on the app's stream).  When the
 * driver has no green contexts, or a partition cannot be made, the app runs
 * on all SMs until the route changes, and the log says why, once.
 *
 * Everything here runs with fwd.mu held (shim_fwd.c owns the route and the
 * stream table).
 */
#define _GNU_SOURCE
#include "shim_part.h"
#include "shim_fwd.h"
#include "shim_graph.h"
#include "shim_trace.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#define PART_MAX 160u             /* spans made; an H100's 16 groups have 136 */
#define GROUPS_MAX 64u            /* the device's groups of gran SMs        */

struct part {
	unsigned first, count;        /* its groups (cb_part_span)              */
	unsigned sms;                 /* SMs the driver gave                    */
	CUgreenCtx g;
	CUstream shadow[FWD_MAX_STREAMS];   /* by app stream index, lazily       */
};

struct pstream {
	struct part *owed;            /* its shadow there has work the app
	                                 stream has not waited for             */
	struct part *last;            /* where its last kernel went           */
	uint8_t fresh;                /* the app stream may have work its
	                                 shadow has not waited for             */
	cudaEvent_t ev_app;           /* recorded on the app stream           */
	cudaEvent_t ev_shadow;        /* recorded on its shadow               */
};

static struct {
	CUresult (*init)(unsigned);
	CUresult (*dev_get)(CUdevice *, int);
	CUresult (*dev_res)(CUdevice, CUdevResource *, CUdevResourceType);
	CUresult (*split)(CUdevResource *, unsigned *, const CUdevResource *, CUdevResource *,
			  unsigned, unsigned);
	CUresult (*gen_desc)(CUdevResourceDesc *, CUdevResource *, unsigned);
	CUresult (*green_create)(CUgreenCtx *, CUdevResourceDesc, CUdevice, unsigned);
	CUresult (*green_stream)(CUstream *, CUgreenCtx, unsigned, int);
	cudaError_t (*get_device)(int *);
	cudaError_t (*ev_create)(cudaEvent_t *, unsigned);
	cudaError_t (*ev_destroy)(cudaEvent_t);
	cudaError_t (*ev_record)(cudaEvent_t, cudaStream_t);
	cudaError_t (*wait)(cudaStream_t, cudaEvent_t, unsigned);
	cudaError_t (*stream_sync)(cudaStream_t);
	cudaError_t (*query)(cudaStream_t);
	cudaError_t (*priority)(cudaStream_t, int *);
	cudaError_t (*last_error)(void);
} fn;

static struct {
	int state;                    /* 0 not probed, 1 usable, -1 not         */
	CUdevice dev;
	CUdevResource res;            /* the device's SMs                       */
	unsigned total, gran;
	CUdevResource groups[GROUPS_MAX];   /* the device split in groups of gran */
	unsigned ngroups;
	CUdevResource rest;           /* SMs left after the last group (probe()) */
	struct part parts[PART_MAX];
	unsigned nparts;
	struct part *cur;             /* launches go there; NULL: all SMs       */
	struct pstream ps[FWD_MAX_STREAMS];
	unsigned refused;             /* the last span that could not be made
	                                 (first << 16 | count)                  */
	uint64_t enq;                 /* work queued while partitioned, counted  */
	int quiet;                    /* nothing queued since a whole-device sync
	                                 returned: the device is idle           */
	int said_event, said_launch, said_stream;   /* logged once             */
} pt;

/* enq when this thread's whole-device sync began (per thread: two threads'
 * syncs may overlap, and each vouches only for what preceded its own) */
static __thread uint64_t enq_at_sync;

/* ---------------------------------------------------------------- set-up */

/* A driver entry point as cudart finds it (cuGetProcAddress, CUDA 13.0
 * semantics), else by name; libcuda loaded if the app has not yet. */
static void *drv_sym(const char *name)
{
	static void *lib;
	static CUresult (*gpa)(const char *, void **, int, cuuint64_t,
			       CUdriverProcAddressQueryResult *);
	CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
	void *p = NULL;

	if (!lib && !(lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)) &&
	    !(lib = dlopen("libcuda.so.1", RTLD_NOW)))
		return NULL;
	if (!gpa)
		*(void **)&gpa = shim_glibc_dlsym()(lib, "cuGetProcAddress_v2");
	if (gpa && gpa(name, &p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st) == CUDA_SUCCESS &&
	    st == CU_GET_PROC_ADDRESS_SUCCESS && p)
		return p;
	return shim_glibc_dlsym()(lib, name);
}

#define DRV(field, name) (*(void **)&fn.field = drv_sym(name))
#define RT(field, name)  (*(void **)&fn.field = shim_real_rt(name))

/* Once: the entry points and the device's SM resource.  1 usable, -1 not. */
static int probe(void)
{
	CUdevResource rest;
	const char *why = NULL;
	CUresult r = CUDA_SUCCESS;
	int ord = 0;

	if (pt.state)
		return pt.state;
	pt.state = -1;
	if (!(RT(get_device, "cudaGetDevice") && RT(ev_create, "cudaEventCreateWithFlags") &&
	      RT(ev_destroy, "cudaEventDestroy") && RT(ev_record, "cudaEventRecord") &&
	      RT(wait, "cudaStreamWaitEvent") && RT(stream_sync, "cudaStreamSynchronize") &&
	      RT(query, "cudaStreamQuery") && RT(priority, "cudaStreamGetPriority") &&
	      RT(last_error, "cudaGetLastError")))
		why = "the CUDA runtime lacks an entry point it needs";
	else if (!(DRV(init, "cuInit") && DRV(dev_get, "cuDeviceGet") &&
		   DRV(dev_res, "cuDeviceGetDevResource") &&
		   DRV(split, "cuDevSmResourceSplitByCount") &&
		   DRV(gen_desc, "cuDevResourceGenerateDesc") &&
		   DRV(green_create, "cuGreenCtxCreate") &&
		   DRV(green_stream, "cuGreenCtxStreamCreate")))
		why = "the driver has no green contexts (CUDA 12.5+ is needed)";
	/* cudart initialised the driver already (simgpu's does not need to) */
	else if (IN_RUNTIME(fn.get_device(&ord)) != cudaSuccess || (r = fn.init(0)) != CUDA_SUCCESS ||
		 (r = fn.dev_get(&pt.dev, ord)) != CUDA_SUCCESS)
		why = "no current device";
	else if ((r = fn.dev_res(pt.dev, &pt.res, CU_DEV_RESOURCE_TYPE_SM)) != CUDA_SUCCESS ||
		 pt.res.sm.smCount == 0)
		why = "cuDeviceGetDevResource failed";
	if (why) {
		shim_log("SM partitions unavailable: %s (CUresult %d); the app runs on all SMs", why,
			 (int)r);
		return -1;
	}
	pt.total = pt.res.sm.smCount;
	/* the partition size the driver makes by default: sm_90 rounds every
	 * group up to a multiple of 8 (minSmPartitionSize) */
	pt.gran = pt.res.sm.minSmPartitionSize ? pt.res.sm.minSmPartitionSize : 1;
	/* the device in groups of gran SMs, once: a partition is a run of
	 * them, so that apps the controller gives consecutive spans get
	 * different SMs (a split of its own in each app would start every
	 * partition at the same SMs) */
	pt.ngroups = pt.total / pt.gran < GROUPS_MAX - 1 ? pt.total / pt.gran : GROUPS_MAX - 1;
	memset(&rest, 0, sizeof(rest));
	if ((r = fn.split(pt.groups, &pt.ngroups, &pt.res, &rest, 0, pt.gran)) != CUDA_SUCCESS ||
	    pt.ngroups == 0) {
		shim_log("SM partitions unavailable: cuDevSmResourceSplitByCount into groups of %u "
			 "SMs failed (CUresult %d); the app runs on all SMs", pt.gran, (int)r);
		return -1;
	}
	/* the SMs no whole group took: the driver's groups keep to the chip's
	 * layout, so it may make fewer groups than total / gran and leave
	 * more than total % gran (an H200: 15 groups of 8 and 12 left;
	 * bench/RESULTS.md, green contexts on the GPU).  Then they are one
	 * more group, the last; else a span that ends at the last group takes
	 * them too (span_total() says over how many groups spans are laid). */
	if (rest.type == CU_DEV_RESOURCE_TYPE_SM && rest.sm.smCount) {
		if (pt.ngroups < pt.total / pt.gran)
			pt.groups[pt.ngroups++] = rest;
		else
			pt.rest = rest;
	}
	if (pt.ngroups < pt.total / pt.gran)
		shim_log("the driver split the device's %u SMs into %u groups (the last %u SMs), "
			 "not %u of %u: partitions are runs of those %u", pt.total, pt.ngroups,
			 pt.groups[pt.ngroups - 1].sm.smCount, pt.total / pt.gran, pt.gran, pt.ngroups);
	return pt.state = 1;
}

/* The "total" cb_part_span lays spans over: the device's, where the driver
 * made its total / gran groups (the controller's reckoning, ctlblock.h);
 * else the groups it made, so that every span is a run of real groups. */
static unsigned span_total(void)
{
	return pt.ngroups < pt.total / pt.gran ? pt.ngroups * pt.gran : pt.total;
}

/* A green context of the resources: CUDA_SUCCESS or why not. */
static CUresult green_of(CUgreenCtx *g, CUdevResource *res, unsigned n)
{
	CUdevResourceDesc desc;
	CUresult r = fn.gen_desc(&desc, res, n);

	return r != CUDA_SUCCESS ? r : fn.green_create(g, desc, pt.dev, CU_GREEN_CTX_DEFAULT_STREAM);
}

/* The partition of groups [first, first + count), made at first use; NULL
 * (said once per span) when the driver refuses.  fwd.mu held (res is
 * static: a launch hook's stack is the app's). */
static struct part *part_of(unsigned first, unsigned count)
{
	static CUdevResource res[GROUPS_MAX + 1];
	struct part *q;
	unsigned i, n = count;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	for (i = 0; i < pt.nparts; i++)
		if (pt.parts[i].first == first && pt.parts[i].count == count)
			return &pt.parts[i];
	q = &pt.parts[pt.nparts];
	if (pt.nparts < PART_MAX && first + count <= pt.ngroups) {
		memcpy(res, &pt.groups[first], count * sizeof(res[0]));
		if (first + count == pt.ngroups && pt.rest.sm.smCount)
			res[n++] = pt.rest;
		memset(q, 0, sizeof(*q));
		r = green_of(&q->g, res, n);
		/* a rest smaller than a group was never seen to combine: without it */
		if (r != CUDA_SUCCESS && n > count) {
			n = count;
			r = green_of(&q->g, res, n);
		}
	}
	if (r != CUDA_SUCCESS) {
		if (pt.refused != (first << 16 | count))
			shim_log("cannot make an SM partition of groups %u..%u of %u SMs each (CUresult "
				 "%d%s); running on all SMs until the route changes", first,
				 first + count - 1, pt.gran, (int)r,
				 pt.nparts >= PART_MAX ? ", too many partitions" : "");
		pt.refused = first << 16 | count;
		return NULL;
	}
	q->first = first;
	q->count = count;
	for (i = 0; i < n; i++)
		q->sms += res[i].sm.smCount;
	pt.nparts++;
	return q;
}

static void publish(void)
{
	__atomic_store_n(&shim_ctl->part_sms, pt.cur ? pt.cur->sms : 0, __ATOMIC_RELAXED);
	__atomic_store_n(&shim_ctl->part_first, pt.cur ? pt.cur->first * pt.gran : 0,
			 __ATOMIC_RELAXED);
	__atomic_store_n(&shim_ctl->part_total, pt.total, __ATOMIC_RELAXED);
}

int part_enter(uint32_t start, uint32_t pct)
{
	unsigned first, count;
	struct part *q;

	if (probe() < 0)
		return -1;
	if (!pt.cur)
		pt.quiet = 0;          /* what ran before is not known here */
	/* the span's groups: cb_part_span (ctlblock.h), which the simulator
	 * and `colocate quotas` share */
	cb_part_span(start, pct, span_total(), pt.gran, &first, &count);
	q = part_of(first, count);
	if (!q)
		return -1;
	pt.cur = q;                    /* streams move over at their next launch */
	publish();
	return 0;
}

int part_on(void)
{
	return pt.cur != NULL;
}

/* ---------------------------------------------------------------- order on the device */

static uint32_t index_of(const struct fstream *st)
{
	uint32_t n;

	return (uint32_t)(st - fwd_streams(&n));
}

/* Work goes on the device (the app's, or ours). */
static void queued(void)
{
	pt.enq++;
	pt.quiet = 0;
}

/*
 * Whether nothing queued on a stream can still be waited for: yes when the
 * device is idle (nothing queued since a whole-device sync returned), else
 * only a non-blocking stream (shadows are) answers alone.  An idle legacy
 * or blocking stream still orders its next operation after the other kind's
 * pending work, which an event recorded on it carries and a query does not.
 */
static int idle(cudaStream_t s, uint8_t kind)
{
	return pt.quiet || (kind == FWD_SK_NONBLOCKING && IN_RUNTIME(fn.query(s)) == cudaSuccess);
}

/* `waiter` waits on the device for what `signaller` (of kind `kind`) has
 * queued so far; nothing when that is done already (an app that
 * synchronised: a switch after a sync then costs no event).  Should the
 * event calls fail, the host waits for signaller (correct, slower; said
 * once). */
static void order(cudaStream_t waiter, cudaStream_t signaller, uint8_t kind, cudaEvent_t ev)
{
	if (idle(signaller, kind))
		return;
	queued();
	if (ev && IN_RUNTIME(fn.ev_record(ev, signaller)) == cudaSuccess &&
	    IN_RUNTIME(fn.wait(waiter, ev, 0)) == cudaSuccess)
		return;
	if (!pt.said_event) {
		pt.said_event = 1;
		shim_log("SM partitions: ordering streams by events failed; waiting on the host "
			 "instead");
	}
	(void)IN_RUNTIME(fn.last_error());
	(void)IN_RUNTIME(fn.stream_sync(signaller));
}

/* App stream i waits for what its shadow has (it "pays what it owes"). */
static void pay(uint32_t i)
{
	struct pstream *p = &pt.ps[i];
	uint32_t n;

	struct fstream *st = &fwd_streams(&n)[i];

	if (!p->owed)
		return;
	/* a stream capturing now must not get our wait (it would end up in
	 * the graph, or invalidate the capture): it pays after its capture */
	if (shim_graph_capturing(st->handle, 0))
		return;
	order(st->handle, p->owed->shadow[i], FWD_SK_NONBLOCKING, p->ev_shadow);
	p->owed = NULL;
}

/* The default-stream rules: the other streams whose partition work an
 * operation on st must follow pay first; 1 when one did. */
static int pay_deps(const struct fstream *st)
{
	uint32_t i, n;
	struct fstream *tab = fwd_streams(&n);
	int paid = 0;

	for (i = 0; i < n; i++) {
		if (&tab[i] == st || !pt.ps[i].owed)
			continue;
		if (fwd_streams_tied(st->kind, tab[i].kind)) {
			pay(i);
			paid = 1;
		}
	}
	return paid;
}

static void pay_all(void)
{
	uint32_t i, n;

	fwd_streams(&n);
	for (i = 0; i < n; i++)
		pay(i);
}

void part_fence(void *stream, int ptsz, int scope)
{
	struct fstream *st;

	/* every SHIM_FENCE_ALL caller (cudaDeviceSynchronize, cudaFree, a VMM
	 * free) waits for the whole device.  Whether the primary context's
	 * implicit sync covers green contexts is documented for
	 * cuCtxSynchronize only: the host waits for every shadow with work
	 * first (no event; what it waits for is done, so nothing is owed) */
	if (scope == SHIM_FENCE_ALL) {
		uint32_t i, n;

		fwd_streams(&n);
		for (i = 0; i < n; i++)
			if (pt.ps[i].owed) {
				(void)IN_RUNTIME(fn.stream_sync(pt.ps[i].owed->shadow[i]));
				pt.ps[i].owed = NULL;
			}
		enq_at_sync = pt.enq;
		return;
	}
	if (!(st = fwd_stream(stream, ptsz))) {
		pay_all();
		return;
	}
	pay(index_of(st));
	pay_deps(st);
}

void part_synced(void)
{
	/* nothing we saw queued since the sync began: the device is idle, so
	 * the next switch or local operation orders nothing.  (An operation
	 * another thread queued meanwhile is counted by its hook after the
	 * call, under fwd.mu, and ends the quiet then.) */
	if (pt.enq == enq_at_sync)
		pt.quiet = 1;
}

void part_local_done(void *stream, int ptsz)
{
	struct fstream *st = fwd_stream(stream, ptsz), *tab;
	uint32_t i, n;

	queued();
	tab = fwd_streams(&n);
	for (i = 0; i < n; i++)
		if (!st || &tab[i] == st || fwd_streams_tied(st->kind, tab[i].kind))
			pt.ps[i].fresh = 1;
}

void part_leave(void)
{
	uint32_t i, n;

	if (!pt.cur)
		return;
	pay_all();
	/* what the app queues until it comes back is not tracked: its next
	 * launch on a partition waits for its stream, whatever it finds */
	fwd_streams(&n);
	for (i = 0; i < n; i++)
		pt.ps[i].fresh = 1;
	pt.cur = NULL;
	publish();
}

/* ---------------------------------------------------------------- launches */

/* A launch that stays on all SMs while partitioned, in order. */
static int on_all_sms(const struct shim_launch *l, void *stream)
{
	int r;

	part_fence(stream, l->ptsz, SHIM_FENCE_STREAM);
	queued();
	r = shim_launch_local(l);
	part_local_done(stream, l->ptsz);
	part_all_sms();
	return r;
}

/* Stream i's shadow in q and its two events, made at its first launch
 * there; -1 (said once) when they cannot be: the launch runs on all SMs.
 * A failed call's error is taken back from the runtime: it is ours, not
 * the app's. */
static int shadow_ready(struct part *q, uint32_t i, const struct fstream *st)
{
	struct pstream *p = &pt.ps[i];
	int prio = 0;
	CUresult r;

	if (!p->ev_app) {
		cudaEvent_t a = NULL, b = NULL;

		if (IN_RUNTIME(fn.ev_create(&a, cudaEventDisableTiming)) != cudaSuccess ||
		    IN_RUNTIME(fn.ev_create(&b, cudaEventDisableTiming)) != cudaSuccess) {
			(void)IN_RUNTIME(fn.last_error());
			if (a)
				(void)IN_RUNTIME(fn.ev_destroy(a));
			return -1;
		}
		p->ev_app = a;
		p->ev_shadow = b;
	}
	if (q->shadow[i])
		return 0;
	/* a service's high-priority stream keeps its priority */
	if ((st->kind == FWD_SK_BLOCKING || st->kind == FWD_SK_NONBLOCKING) &&
	    IN_RUNTIME(fn.priority(st->handle, &prio)) != cudaSuccess) {
		(void)IN_RUNTIME(fn.last_error());
		prio = 0;
	}
	r = fn.green_stream(&q->shadow[i], q->g, CU_STREAM_NON_BLOCKING, prio);
	if (r != CUDA_SUCCESS) {
		q->shadow[i] = NULL;
		if (!pt.said_stream) {
			pt.said_stream = 1;
			shim_log("cannot make a stream in the %u-SM partition (CUresult %d); those "
				 "launches run on all SMs", q->sms, (int)r);
		}
		return -1;
	}
	p->fresh = 1;
	return 0;
}

/*
 * Before a launch on the app stream st: the shadow it goes to, with the
 * order it needs in place (the default-stream rules, a move between
 * partitions, what the app stream queued since), or NULL: launch it where
 * the app asked (no shadow could be made).  *eager: pay back right after
 * it -- for a per-thread default stream (no other thread can name it),
 * while the task layer brackets launches with events on the app stream,
 * and for driver launches (drv), whose library may queue work on the app
 * stream through driver calls the shim does not hook: the shadow then
 * always waits for the app stream and the app stream for the shadow.
 */
static void *prepare(struct fstream *st, int drv, int *eager)
{
	struct part *q = pt.cur;
	uint32_t i = index_of(st);
	struct pstream *p = &pt.ps[i];

	if (shadow_ready(q, i, st) < 0)
		return NULL;
	*eager = drv || st->kind == FWD_SK_PERTHREAD || shim_task_hot();
	if (pay_deps(st))
		p->fresh = 1;
	if (p->owed && p->owed != q) {
		/* moving to another partition: when the app stream has nothing
		 * queued the new shadow need only follow the old one (no op on
		 * the app stream, none at all when the old one is idle too; the
		 * app stream owes the old one until this launch is made, so a
		 * launch refused there still runs after it); else the app
		 * stream pays and the new shadow follows it */
		if (idle(st->handle, st->kind)) {
			order(q->shadow[i], p->owed->shadow[i], FWD_SK_NONBLOCKING, p->ev_shadow);
			p->fresh = 0;
		} else {
			pay(i);
			p->fresh = 1;
		}
	} else if (!p->owed && p->last && p->last != q) {
		/* paid its last partition since: the app stream waited for it,
		 * so following the app stream follows it too */
		p->fresh = 1;
	}
	if (p->fresh || *eager) {
		order(q->shadow[i], st->handle, st->kind, p->ev_app);
		p->fresh = 0;
	}
	return q->shadow[i];
}

/* A launch went to st's shadow: the app stream owes it. */
static void launched(struct fstream *st, int eager)
{
	uint32_t i = index_of(st);

	pt.ps[i].owed = pt.ps[i].last = pt.cur;
	if (eager)
		pay(i);
}

static void refused(int code)
{
	if (!pt.said_launch) {
		pt.said_launch = 1;
		shim_log("a launch on the %u-SM partition failed (error %d); running it on all SMs "
			 "(said once)", pt.cur->sms, code);
	}
}

int part_launch(const struct shim_launch *l)
{
	const cudaLaunchConfig_t *cfg = l->config;
	struct shim_launch m = *l;
	cudaLaunchConfig_t c;
	struct fstream *st;
	void *stream = l->stream, *shadow;
	uint32_t i;
	int eager = 0, r;

	if (l->entry == SHIM_E_EXC) {
		if (!cfg)
			return shim_launch_local(l);       /* the runtime says why */
		stream = cfg->stream;
		for (i = 0; i < cfg->numAttrs && cfg->attrs; i++)
			if (cfg->attrs[i].id == cudaLaunchAttributeCooperative &&
			    cfg->attrs[i].val.cooperative)
				return on_all_sms(l, stream);
	}
	if (l->entry == SHIM_E_GRAPH || l->entry == SHIM_E_COOP)
		return on_all_sms(l, stream);
	st = fwd_stream(stream, l->ptsz);
	if (!st || !(shadow = prepare(st, 0, &eager)))
		return on_all_sms(l, stream);
	m.stream = shadow;
	if (l->entry == SHIM_E_EXC) {
		c = *cfg;
		c.stream = shadow;
		m.config = &c;
	}
	queued();
	r = shim_launch_local(&m);
	if (r != cudaSuccess) {
		/* refused there (not queued): run it where the app asked */
		(void)IN_RUNTIME(fn.last_error());
		refused(r);
		return on_all_sms(l, stream);
	}
	launched(st, eager);
	return r;
}

void *part_drv_begin(void *stream, int ptsz, int *eager)
{
	struct fstream *st = fwd_stream(stream, ptsz);
	void *shadow;

	/* the library may have queued work through driver calls the shim
	 * does not see: a quiet device is not vouched for */
	pt.quiet = 0;
	shadow = st ? prepare(st, 1, eager) : NULL;
	queued();              /* launched there or on the app's stream */
	if (!shadow)
		part_all_sms();
	return shadow;
}

void part_drv_end(void *stream, int ptsz, int eager, int code)
{
	struct fstream *st = fwd_stream(stream, ptsz);

	if (code == 0) {
		if (st)
			launched(st, eager);
		return;
	}
	refused(code);
	part_all_sms();
	part_fence(stream, ptsz, SHIM_FENCE_STREAM);
}

void part_all_sms(void)
{
	__atomic_fetch_add(&shim_ctl->part_local, 1, __ATOMIC_RELAXED);
}

void shim_part_mps_unlimit(void)
{
	const char *v = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");

	if (!v)
		return;
	if (strtol(v, NULL, 10) < 100)
		shim_log("route kind partition: dropping CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%s (it "
			 "would cap every SM partition)", v);
	unsetenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
}

void part_forget(void)
{
	memset(&pt, 0, sizeof(pt));
	memset(&fn, 0, sizeof(fn));
}
