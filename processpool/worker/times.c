/*
 * times.c - device times of an app's timed launches (FWD_LF_TIMED: its
 * trace or task feed is on), written into its page for the shim.
 *
 * A timed launch is bracketed by two events on its worker stream.  Its
 * completion mark (launcher.c) runs as a host function, which may make no
 * CUDA call on a GPU, so it only counts the launch in tmarks and wakes
 * the launcher; the launcher then reads the events here and writes the
 * times into the page's slots (fwd_proto.h, "times"), stream by stream in
 * launch order, publishing timed[sidx] after each.  Untimed launches cost
 * nothing here: no event, no wake.
 *
 * Start times count from the app's time zero: an event recorded on an idle
 * stream of its own at the app's first timed launch, anchored to the host
 * clock (CLOCK_MONOTONIC) at that moment, so that the shim can put worker
 * and local times on one axis (exactly so on simgpu's shared device clock;
 * on a GPU up to the latency of that record).
 *
 * Nothing here may stop the launches: an event that cannot be made or
 * recorded leaves its launch untimed (the page says so: timed[] moves on
 * and the slot does not hold the seq).
 */
#define _GNU_SOURCE
#include "worker.h"

#include <stdlib.h>
#include <time.h>

static int64_t mono_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000ll + t.tv_nsec;
}

static int64_t ms_to_ns(float ms)
{
	double ns = (double)ms * 1e6;

	return (int64_t)(ns + (ns >= 0 ? 0.5 : -0.5));
}

static cudaEvent_t ev_get(struct wapp *a)
{
	cudaEvent_t ev;

	if (a->nevpool)
		return a->evpool[--a->nevpool];
	if (cudaEventCreateWithFlags(&ev, cudaEventDefault) != cudaSuccess) {
		cudaGetLastError();
		return NULL;
	}
	return ev;
}

static void ev_put(struct wapp *a, cudaEvent_t ev)
{
	if (!ev)
		return;
	if (a->nevpool == a->evcap) {
		unsigned cap = a->evcap ? 2 * a->evcap : 64;
		cudaEvent_t *p = realloc(a->evpool, cap * sizeof(*p));

		if (!p) {
			cudaEventDestroy(ev);
			return;
		}
		a->evpool = p;
		a->evcap = cap;
	}
	a->evpool[a->nevpool++] = ev;
}

/* The app's time zero, once: 0 when there is one. */
static int tzero(struct wapp *a)
{
	cudaStream_t s;
	int64_t t0, t1;

	if (a->tzero)
		return 0;
	if (a->tzero_failed)
		return -1;
	a->tzero = ev_get(a);
	if (!a->tzero || cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
		cudaGetLastError();
		goto fail;
	}
	/* an idle stream: the event completes as soon as it is recorded */
	t0 = mono_ns();
	if (cudaEventRecord(a->tzero, s) != cudaSuccess) {
		cudaGetLastError();
		cudaStreamDestroy(s);
		goto fail;
	}
	t1 = mono_ns();
	a->tzero_ns = t0 + (t1 - t0) / 2;
	/* complete before any time is read against it (it is on another
	 * stream than the launches); an idle stream: no real wait, once */
	if (cudaEventSynchronize(a->tzero) != cudaSuccess) {
		cudaGetLastError();
		cudaStreamDestroy(s);
		goto fail;
	}
	cudaStreamDestroy(s);
	return 0;
fail:
	ev_put(a, a->tzero);
	a->tzero = NULL;
	a->tzero_failed = 1;
	w_log("app %s (pid %u): cannot make a timing event; its timed launches get no times",
	      a->name, a->pid);
	return -1;
}

void w_time_begin(struct wapp *a, struct wstream *ws, cudaEvent_t ev[2])
{
	ev[0] = ev[1] = NULL;
	if (tzero(a) < 0)
		return;
	ev[0] = ev_get(a);
	ev[1] = ev[0] ? ev_get(a) : NULL;
	if (ev[1] && cudaEventRecord(ev[0], ws->s) == cudaSuccess)
		return;
	cudaGetLastError();
	ev_put(a, ev[0]);
	ev_put(a, ev[1]);
	ev[0] = ev[1] = NULL;
}

void w_time_end(struct wapp *a, struct wstream *ws, uint64_t seq, cudaEvent_t ev[2], int ok)
{
	struct wtimed *t;

	if (ev[0] && (!ok || cudaEventRecord(ev[1], ws->s) != cudaSuccess)) {
		cudaGetLastError();
		ev_put(a, ev[0]);
		ev_put(a, ev[1]);
		ev[0] = ev[1] = NULL;
	}
	if (!ws->timed && !(ws->timed = calloc(W_MARKS, sizeof(*ws->timed)))) {
		/* no room to remember it: it gets no time, now (nothing of this
		 * stream can be pending either: there was never a table) */
		ev_put(a, ev[0]);
		ev_put(a, ev[1]);
		__atomic_store_n(&a->page->timed[ws->idx], seq, __ATOMIC_RELEASE);
		return;
	}
	while (ws->thead - ws->ttail >= W_MARKS) {
		/* the app ran W_MARKS launches ahead of their times: wait */
		w_times_poll(a);
		if (ws->thead - ws->ttail >= W_MARKS) {
			cudaStreamSynchronize(ws->s);
			cudaGetLastError();
		}
	}
	t = &ws->timed[ws->thead & (W_MARKS - 1)];
	t->seq = seq;
	t->ev[0] = ev[0];
	t->ev[1] = ev[1];
	ws->thead++;
	a->tpending++;
}

int w_times_due(struct wapp *a)
{
	return a->tpending &&
	       atomic_load_explicit(&a->tmarks, memory_order_acquire) != a->tmarks_seen;
}

/* One slot, as a seqlock (fwd_proto.h): readers never see half of it. */
static void put_time(struct wapp *a, uint64_t seq, int64_t start, uint64_t dur)
{
	struct fwd_time *t = &fwd_times(a->page)[seq % FWD_TIMES_N];

	__atomic_store_n(&t->seq, 0, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	__atomic_store_n(&t->start_ns, start, __ATOMIC_RELAXED);
	__atomic_store_n(&t->dur_ns, dur, __ATOMIC_RELAXED);
	__atomic_store_n(&t->seq, seq, __ATOMIC_RELEASE);
}

/* The head of ws's timed launches: 1 written (or given up), 0 not yet. */
static int resolve_one(struct wapp *a, struct wstream *ws)
{
	struct wtimed *t = &ws->timed[ws->ttail & (W_MARKS - 1)];
	float ms0, ms1;

	if (t->ev[0]) {
		cudaError_t q = cudaEventQuery(t->ev[1]);

		if (q == cudaSuccess)
			q = cudaEventElapsedTime(&ms0, a->tzero, t->ev[0]);
		if (q == cudaSuccess)
			q = cudaEventElapsedTime(&ms1, t->ev[0], t->ev[1]);
		if (q == cudaErrorNotReady) {
			cudaGetLastError();
			return 0;
		}
		if (w_sticky(q))
			w_die(q);
		if (q == cudaSuccess) {
			int64_t dur = ms_to_ns(ms1);

			put_time(a, t->seq, a->tzero_ns + ms_to_ns(ms0), dur > 0 ? (uint64_t)dur : 0);
		} else {
			cudaGetLastError();
		}
		ev_put(a, t->ev[0]);
		ev_put(a, t->ev[1]);
		t->ev[0] = t->ev[1] = NULL;
	}
	__atomic_store_n(&a->page->timed[ws->idx], t->seq, __ATOMIC_RELEASE);
	ws->ttail++;
	a->tpending--;
	return 1;
}

void w_times_poll(struct wapp *a)
{
	unsigned i;

	if (!a->tpending)
		return;
	/* marks counted after this load make the next w_times_due true */
	a->tmarks_seen = atomic_load_explicit(&a->tmarks, memory_order_acquire);
	for (i = 0; i < FWD_MAX_STREAMS && a->tpending; i++) {
		struct wstream *ws = a->streams[i];

		while (ws && ws->thead != ws->ttail && resolve_one(a, ws))
			;
	}
}

void w_times_free(struct wapp *a)
{
	unsigned i;

	for (i = 0; i < FWD_MAX_STREAMS; i++) {
		struct wstream *ws = a->streams[i];

		for (; ws && ws->ttail != ws->thead; ws->ttail++) {
			struct wtimed *t = &ws->timed[ws->ttail & (W_MARKS - 1)];

			if (t->ev[0]) {
				cudaEventDestroy(t->ev[0]);
				cudaEventDestroy(t->ev[1]);
			}
		}
		if (ws) {
			free(ws->timed);
			ws->timed = NULL;
		}
	}
	a->tpending = 0;
	while (a->nevpool)
		cudaEventDestroy(a->evpool[--a->nevpool]);
	free(a->evpool);
	a->evpool = NULL;
	a->evcap = 0;
	if (a->tzero)
		cudaEventDestroy(a->tzero);
	a->tzero = NULL;
	cudaGetLastError();
}
