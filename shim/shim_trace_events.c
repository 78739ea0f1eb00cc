/*
 * shim_trace_events.c - the trace's event backends: a task is bracketed by
 * two events recorded on its stream through the real event API (cudart's
 * for runtime launches and library calls, the driver's for driver
 * launches), so its start and duration are device time: modelled on
 * simgpu, measured on a GPU.  Each backend keeps a pool of events and a
 * first event, its ref, recorded at a known host time; time zero is the
 * first ref (or the first forwarded task's start, shim_trace.c).
 *
 * Nothing here may crash the app or change what it sees: a missing event
 * API or a failed event creation is logged once and tasks are then
 * recorded without times; every runtime call made on an app thread keeps
 * the thread's last error as it was (EV_CALL); a stream being captured
 * into a graph gets no events; a device reset makes it forget (never
 * touch again) the events it had.
 *
 * Locking: the pools, the refs, time zero and the generation are under
 * trace_mu (shim_trace_int.h); event API calls and lookups are made
 * without it (lookups dlopen, and the loader lock must never be taken
 * while holding it).
 */
#define _GNU_SOURCE
#include "shim_trace_int.h"

#include <dlfcn.h>
#include <link.h>
#include <string.h>

#define POOL_MAX     (2 * TRACE_PENDING_MAX + 8)   /* both events of every queued record */

/* ---- event API, one per backend ------------------------------------------ */
struct evapi {
	const char *what;
	int state;                   /* 0 not looked up, 1 usable, -1 not     */
	int (*create)(void **ev, unsigned flags);
	int (*record)(void *ev, void *stream);
	int (*record_ptsz)(void *ev, void *stream);
	int (*query)(void *ev);
	int (*elapsed)(float *ms, void *a, void *b);
	int (*destroy)(void *ev);
	/* optional: missing means "not capturing" */
	int (*capturing)(void *stream, int *status);
	int (*capturing_ptsz)(void *stream, int *status);
	/* runtime only: the thread's last error (the driver keeps none) */
	int (*peek)(void);
	int (*getlast)(void);
	/* optional, for the feed thread: the app's device (runtime) or context
	 * (driver) to take on, looked up here so that nothing under trace_mu
	 * dlopens */
	int (*getcur)(void *out);
	int (*setcur)(void *arg);
	void *ref;                   /* the first start event: time zero      */
	int64_t ref_ns;              /* CLOCK_MONOTONIC when ref was recorded */
	void *pool[POOL_MAX];
	int npool;
	int create_failed;           /* said so (once)                         */
	int said_missing;
};

static struct evapi api[3] = {
	[SHIM_EV_RT] = { .what = "CUDA runtime" },
	[SHIM_EV_DRV] = { .what = "CUDA driver" },
};

#define NOT_READY 600   /* cudaErrorNotReady == CUDA_ERROR_NOT_READY */

uint32_t trace_ev_gen;

/* Time zero of the process's start times (host clock, under trace_mu):
 * when its first time-zero event was recorded, or the first forwarded task's
 * anchored start (fwd_proto.h) if that came first.  Each backend's event
 * times are moved onto it by the host time of their own ref, so local and
 * forwarded tasks share one axis (simgpu: exactly, its device clock is
 * shared; a GPU: up to the latency of recording each ref). */
static int64_t zero_ns;
static int zero_set;

int64_t trace_axis(int64_t anchored_ns)
{
	if (!zero_set) {
		zero_ns = anchored_ns;
		zero_set = 1;
	}
	return anchored_ns - zero_ns;
}

/* ---- calls --------------------------------------------------------------- */
/*
 * Every runtime call the trace makes on an app thread can set that thread's
 * last error (cudaEventQuery's cudaErrorNotReady on real cudart, a handle
 * that died, an event in a captured stream), which the app would then read
 * from its own cudaGetLastError/cudaPeekAtLastError.  So: peek before; if
 * ours failed and nothing was pending, take ours back out.  When the app
 * already had an error pending, ours may have replaced it - the runtime
 * has no way to put it back - but the app still sees an error, never a
 * spurious one.  The driver API keeps no last error (peek is NULL there).
 */
static int ev_call_begin(const struct evapi *a)
{
	shim_in_runtime++;
	return a->peek ? a->peek() : 0;
}

static int ev_call_end(const struct evapi *a, int saved, int rc)
{
	if (rc != 0 && saved == 0 && a->getlast)
		a->getlast();
	shim_in_runtime--;
	return rc;
}

#define EV_CALL(a, call) ({ int s_ = ev_call_begin(a); ev_call_end(a, s_, (call)); })

/* The runtime's functions through shim_real_rt(), as the hooks find them:
 * with a renamed, privately loaded libcudart (wheels vendor one) the trace
 * then uses the very instance the app's calls reach. */
#define RT(a, field, name) (*(void **)&(a)->field = shim_real_rt(name))
#define DRV(a, field, name) (*(void **)&(a)->field = shim_real_drv(name))

/* Once per backend, outside trace_mu (pthread_once): lookups dlopen, and
 * the loader lock must never be taken while holding trace_mu. */
static void lookup_rt(void)
{
	struct evapi *a = &api[SHIM_EV_RT];
	int ok;

	ok = RT(a, create, "cudaEventCreateWithFlags") && RT(a, record, "cudaEventRecord") &&
	     RT(a, query, "cudaEventQuery") && RT(a, elapsed, "cudaEventElapsedTime") &&
	     RT(a, destroy, "cudaEventDestroy") && RT(a, peek, "cudaPeekAtLastError") &&
	     RT(a, getlast, "cudaGetLastError");
	if (ok) {
		RT(a, record_ptsz, "cudaEventRecord_ptsz");
		RT(a, capturing, "cudaStreamIsCapturing");
		RT(a, capturing_ptsz, "cudaStreamIsCapturing_ptsz");
		RT(a, getcur, "cudaGetDevice");
		RT(a, setcur, "cudaSetDevice");
	}
	__atomic_store_n(&a->state, ok ? 1 : -1, __ATOMIC_RELEASE);
}

static void lookup_drv(void)
{
	struct evapi *a = &api[SHIM_EV_DRV];
	int ok;

	ok = DRV(a, create, "cuEventCreate") && DRV(a, record, "cuEventRecord") &&
	     DRV(a, query, "cuEventQuery") &&
	     (DRV(a, elapsed, "cuEventElapsedTime_v2") || DRV(a, elapsed, "cuEventElapsedTime")) &&
	     (DRV(a, destroy, "cuEventDestroy_v2") || DRV(a, destroy, "cuEventDestroy"));
	DRV(a, record_ptsz, "cuEventRecord_ptsz");
	DRV(a, capturing, "cuStreamIsCapturing");
	DRV(a, capturing_ptsz, "cuStreamIsCapturing_ptsz");
	DRV(a, getcur, "cuCtxGetCurrent");
	DRV(a, setcur, "cuCtxSetCurrent");
	__atomic_store_n(&a->state, ok ? 1 : -1, __ATOMIC_RELEASE);
}

static pthread_once_t once_rt = PTHREAD_ONCE_INIT, once_drv = PTHREAD_ONCE_INIT;

static int usable(int b)
{
	struct evapi *a = &api[b];
	int st = __atomic_load_n(&a->state, __ATOMIC_ACQUIRE);

	if (!st) {
		pthread_once(b == SHIM_EV_RT ? &once_rt : &once_drv,
			     b == SHIM_EV_RT ? lookup_rt : lookup_drv);
		st = __atomic_load_n(&a->state, __ATOMIC_ACQUIRE);
		/* the first thread to see it says it, once */
		if (st < 0 && !__atomic_exchange_n(&a->said_missing, 1, __ATOMIC_RELAXED))
			shim_log("trace: the %s has no event API; its tasks are recorded without "
				 "device times", a->what);
	}
	return st > 0;
}

/* Is a shared libcudart loaded, under its soname or a vendored name
 * (libcudart-<hash>.so.13)?  Looked for as shim_core.c looks for it. */
static int cudart_object(struct dl_phdr_info *info, size_t size, void *arg)
{
	const char *base = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;

	(void)size;
	(void)arg;
	base = base ? base + 1 : info->dlpi_name;
	return base && strncmp(base, "libcudart", 9) == 0;
}

static int have_rt;

static void find_rt(void)
{
	void *h = dlopen("libcudart.so.13", RTLD_NOLOAD | RTLD_LAZY);

	if (!h)
		h = dlopen("libcudart.so", RTLD_NOLOAD | RTLD_LAZY);
	if (h)
		dlclose(h);
	have_rt = h != NULL || dl_iterate_phdr(cudart_object, NULL) != 0;
}

int shim_trace_backend(int driver)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	int b = SHIM_EV_DRV;

	if (!driver) {
		/* runtime launches and library calls: cudart when the process
		 * has one (shared), else the driver (static cudart inside) */
		pthread_once(&once, find_rt);
		b = have_rt ? SHIM_EV_RT : SHIM_EV_DRV;
	}
	return usable(b) ? b : SHIM_EV_NONE;
}

/* ---- events ------------------------------------------------------------- */
static void *get_event(int b)
{
	struct evapi *a = &api[b];
	void *ev = NULL;
	int rc;

	pthread_mutex_lock(&trace_mu);
	if (a->npool)
		ev = a->pool[--a->npool];
	pthread_mutex_unlock(&trace_mu);
	if (ev)
		return ev;
	/* cudaEventDefault == CU_EVENT_DEFAULT: timed */
	rc = EV_CALL(a, a->create(&ev, 0));
	if (rc != 0) {
		if (!__atomic_exchange_n(&a->create_failed, 1, __ATOMIC_RELAXED))
			shim_log("trace: creating a %s event failed (error %d); tasks recorded without "
				 "device times while that lasts", a->what, rc);
		return NULL;
	}
	return ev;
}

/* Under trace_mu.  An event of generation gen back to the pool; one from
 * before a device reset is simply forgotten (its context is gone). */
static void put_event_locked(int b, void *ev, uint32_t gen)
{
	struct evapi *a = &api[b];

	if (!ev || gen != trace_ev_gen)
		return;
	if (a->npool < POOL_MAX) {
		a->pool[a->npool++] = ev;
		return;
	}
	EV_CALL(a, a->destroy(ev));
}

void trace_ev_put(struct shim_trace_rec *r)
{
	if (r->backend == SHIM_EV_NONE)
		return;
	pthread_mutex_lock(&trace_mu);
	put_event_locked(r->backend, r->ev[0], r->gen);
	put_event_locked(r->backend, r->ev[1], r->gen);
	pthread_mutex_unlock(&trace_mu);
	r->ev[0] = r->ev[1] = NULL;
	r->backend = SHIM_EV_NONE;
}

static int record(int b, void *ev, void *stream, int ptsz)
{
	struct evapi *a = &api[b];

	return EV_CALL(a, ptsz && a->record_ptsz ? a->record_ptsz(ev, stream) : a->record(ev, stream));
}

/* A stream being captured into a graph must get no events: the record
 * would become a node of the graph, and the events could not be queried
 * or timed.  A failed check counts as capturing (e.g. the legacy stream
 * while another stream captures globally); a runtime without the call
 * (simgpu may lack it) captures nothing. */
static int capturing(int b, void *stream, int ptsz)
{
	struct evapi *a = &api[b];
	int (*fn)(void *, int *) = ptsz && a->capturing_ptsz ? a->capturing_ptsz : a->capturing;
	int status = 0;       /* cudaStreamCaptureStatusNone == CU_..._NONE */

	if (!fn)
		return 0;
	return EV_CALL(a, fn(stream, &status)) != 0 || status != 0;
}

/* Outside trace_mu, r->gen taken under it. */
void trace_ev_begin(struct shim_trace_rec *r, int backend, void *stream, int ptsz)
{
	struct evapi *a = &api[backend];
	uint32_t gen = r->gen;

	if (capturing(backend, stream, ptsz))
		return;         /* untimed: no events on that stream */
	r->ev[0] = get_event(backend);
	r->ev[1] = r->ev[0] ? get_event(backend) : NULL;
	r->backend = backend;
	if (!r->ev[1])
		goto untimed;
	if (!__atomic_load_n(&a->ref, __ATOMIC_ACQUIRE)) {
		void *ref = get_event(backend);
		int64_t t;

		if (!ref)
			goto untimed;
		t = (int64_t)shim_now_ns();
		if (record(backend, ref, stream, ptsz) != 0) {
			pthread_mutex_lock(&trace_mu);
			put_event_locked(backend, ref, gen);
			pthread_mutex_unlock(&trace_mu);
			goto untimed;
		}
		pthread_mutex_lock(&trace_mu);
		if (!a->ref && gen == trace_ev_gen) {
			a->ref_ns = t;
			trace_axis(t);    /* the first ref: time zero */
			__atomic_store_n(&a->ref, ref, __ATOMIC_RELEASE);
		} else
			put_event_locked(backend, ref, gen);
		pthread_mutex_unlock(&trace_mu);
	}
	if (record(backend, r->ev[0], stream, ptsz) == 0)
		return;
untimed:
	trace_ev_put(r);
}

void trace_ev_end(struct shim_trace_rec *r, void *stream, int ptsz)
{
	if (r->backend != SHIM_EV_NONE &&
	    (r->gen != __atomic_load_n(&trace_ev_gen, __ATOMIC_RELAXED) ||
	     record(r->backend, r->ev[1], stream, ptsz) != 0))
		trace_ev_put(r);  /* a reset came in between: events are dead */
}

void trace_ev_put_locked(const struct shim_trace_rec *r)
{
	if (r->backend != SHIM_EV_NONE) {
		put_event_locked(r->backend, r->ev[0], r->gen);
		put_event_locked(r->backend, r->ev[1], r->gen);
	}
}

/* (no libm: the shim links libc only) */
static int64_t ms_to_ns(float ms)
{
	double ns = (double)ms * 1e6;

	return (int64_t)(ns + (ns >= 0 ? 0.5 : -0.5));
}

int trace_ev_times_locked(const struct shim_trace_rec *r, int64_t *start_ns, int64_t *dur_ns,
			  int *timed)
{
	struct evapi *a = &api[r->backend];
	float ms;
	int q;

	if (r->backend == SHIM_EV_NONE || r->gen != trace_ev_gen || !a->ref)
		return -1;
	q = EV_CALL(a, a->query(r->ev[1]));
	if (q == 0 && EV_CALL(a, a->elapsed(&ms, r->ev[0], r->ev[1])) == 0) {
		*dur_ns = ms_to_ns(ms);
		q = EV_CALL(a, a->elapsed(&ms, a->ref, r->ev[0]));
		*start_ns = ms_to_ns(ms) + trace_axis(a->ref_ns);
		*timed = q == 0;
	}
	return q == NOT_READY ? 0 : 1;
}

/* ---- forgetting --------------------------------------------------------- */
/* The events of both backends die with the context (the runtime's is the
 * driver's primary context): never destroyed or queried again. */
void trace_ev_reset_locked(void)
{
	int b;

	for (b = SHIM_EV_RT; b <= SHIM_EV_DRV; b++) {
		api[b].npool = 0;
		__atomic_store_n(&api[b].ref, NULL, __ATOMIC_RELEASE);
	}
	__atomic_store_n(&trace_ev_gen, trace_ev_gen + 1, __ATOMIC_RELEASE);
	zero_set = 0;           /* the next ref (or forwarded task) is time zero */
}

/* The parent's context does not exist in a fork child. */
void trace_ev_forget(void)
{
	int i, b;

	zero_set = 0;
	for (b = SHIM_EV_RT; b <= SHIM_EV_DRV; b++) {
		api[b].ref = NULL;
		api[b].npool = 0;
		for (i = 0; i < POOL_MAX; i++)
			api[b].pool[i] = NULL;
	}
}

/* ---- the feed thread's device ------------------------------------------- */
/* The getters were looked up with the event API (outside trace_mu). */
void trace_ev_where(int *dev, void **ctx)
{
	struct evapi *rt = &api[SHIM_EV_RT], *drv = &api[SHIM_EV_DRV];

	if (rt->state > 0 && rt->getcur) {
		int d = -1;

		if (EV_CALL(rt, rt->getcur(&d)) == 0)
			*dev = d;
	}
	if (drv->state > 0 && drv->getcur && drv->getcur(ctx) != 0)
		*ctx = NULL;
}

/* A thread starts on device 0 with no context. */
void trace_ev_go_to(int dev, void *ctx)
{
	struct evapi *rt = &api[SHIM_EV_RT], *drv = &api[SHIM_EV_DRV];

	if (dev >= 0 && rt->setcur)
		EV_CALL(rt, ((int (*)(int))(void *)rt->setcur)(dev));
	if (ctx && drv->setcur)
		drv->setcur(ctx);
}
