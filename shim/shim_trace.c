/*
 * shim_trace.c - the per-task trace: one JSON line per task when
 * COLOCATE_TRACE=<file> is set (`colocate trace` sets it), and the task
 * feed to the controller when its policy wants completed tasks
 * (shim_feed.c).  This file is the queue both share: records taken at
 * launch, resolved in order once their times are known, handed to the
 * feed and the writer (shim_trace_json.c); and start-up, settling at a
 * device reset and exit.
 *
 * A task is bracketed by two events on its stream (shim_trace_events.c),
 * so its start and duration are device time.  A task routed to a pool
 * worker gets no event here: its launches go out timed and the worker
 * writes their device times into the connection's page (fwd_proto.h,
 * "times"; shim_fwd_span_*), which the record keeps mapped until
 * resolved.  Nothing waits for them on the launch path: records queue in
 * issue order and are resolved when they have completed, at the app's own
 * synchronisations and at exit (where the wait is bounded by
 * COLOCATE_TRACE_WAIT_MS, default 2000).  Nothing here may crash or hang
 * the app.
 *
 * Locking: trace_mu covers the queue and, through shim_trace_int.h, the
 * state of the other three files; exit takes it with a bound, since it
 * may come on a thread that already holds it.
 */
#define _GNU_SOURCE
#include "shim_trace_int.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* the whole trace's: this file's state and that of the other three */
pthread_mutex_t trace_mu = PTHREAD_MUTEX_INITIALIZER;
int trace_pid;
static struct shim_trace_rec *ring;
static unsigned head, count;
static int started, atexit_n, events_seen, failed;

struct shim_flag_line shim_trace_flag;

int shim_trace_on(void)
{
	return shim_tracing();
}

/* ---- start-up ---------------------------------------------------------- */
__attribute__((constructor)) static void trace_ctor(void)
{
	shim_trace_init();
	/* a child has no feed until it registers itself (even when the
	 * parent took no record yet: after_fork_child is not installed then) */
	pthread_atfork(NULL, NULL, trace_feed_forget);
}

static void trace_exit(void);

static void after_fork_child(void)
{
	/* The parent's records, buffered lines and events are the parent's:
	 * its context does not exist here.  The fd and the file stay shared. */
	pthread_mutex_init(&trace_mu, NULL);
	head = count = 0;
	trace_json_forget();
	trace_feed_forget();
	trace_ev_forget();
	trace_pid = getpid();
}

/* Under trace_mu: buffers, atexit, fork handler, once. */
static int start_locked(void)
{
	int out_ok;

	if (started)
		return failed ? -1 : 0;
	started = 1;
	ring = malloc(sizeof(*ring) * TRACE_PENDING_MAX);
	out_ok = trace_json_start() == 0;
	if (!ring || !out_ok) {
		shim_log("trace: out of memory; tracing and task feedback off");
		failed = 1;
		__atomic_store_n(&shim_trace_flag.on, 0, __ATOMIC_RELEASE);
		return -1;
	}
	trace_pid = getpid();
	pthread_atfork(NULL, NULL, after_fork_child);
	atexit(trace_exit);
	atexit_n = 1;
	return 0;
}

/* ---- the queue ----------------------------------------------------------- */
void shim_trace_begin(struct shim_trace_rec *r, int backend, void *stream, int ptsz)
{
	r->backend = SHIM_EV_NONE;
	r->ev[0] = r->ev[1] = NULL;
	/* routed: the worker times its launches; no event here at all */
	if (backend == SHIM_EV_NONE && r->route)
		shim_fwd_span_open();
	pthread_mutex_lock(&trace_mu);
	if (start_locked() < 0 || backend == SHIM_EV_NONE) {
		pthread_mutex_unlock(&trace_mu);
		return;
	}
	if (!events_seen) {
		/* CUDA is up now.  Its own exit handlers were registered at its
		 * initialisation (again after a device reset); ours must run
		 * before them (atexit is LIFO).  trace_exit runs harmlessly
		 * more than once. */
		events_seen = 1;
		if (atexit_n < 4 && atexit(trace_exit) == 0)
			atexit_n++;
	}
	r->gen = trace_ev_gen;
	pthread_mutex_unlock(&trace_mu);
	trace_ev_begin(r, backend, stream, ptsz);
}

/* Under trace_mu.  Resolve the head record: 1 done (written), 0 not yet. */
static int resolve_head_locked(int force)
{
	struct shim_trace_rec *r = &ring[head];
	int64_t start = 0, dur = 0;
	int timed = 0, q;

	q = trace_ev_times_locked(r, &start, &dur, &timed);
	if (q == 0 && !force)
		return 0;
	if (q < 0 && r->fwd.conn) {
		/* forwarded: the worker's times, from its page (never waits) */
		q = shim_fwd_span_time(&r->fwd, &start, &dur);
		if (q == 0 && !force)
			return 0;
		timed = q > 0;
		if (timed)
			start = trace_axis(start);
	}
	/* the feed first: when its batch is full the record stays queued,
	 * events and all, for the next batch (queries are the file's only) */
	if ((r->kind == SHIM_TASK_KERNEL || r->kind == SHIM_TASK_LIBRARY) && trace_feed_on() &&
	    !trace_feed_put_locked(r, timed, start, dur, force))
		return 0;
	trace_ev_put_locked(r);
	shim_fwd_span_drop(&r->fwd);
	trace_json_line_locked(r, timed, start, dur);
	head = (head + 1) % TRACE_PENDING_MAX;
	count--;
	return 1;
}

void trace_drain_locked(void)
{
	while (count && resolve_head_locked(0))
		;
}

void shim_trace_end(struct shim_trace_rec *r, int ok, void *stream, int ptsz)
{
	if (r->route)
		shim_fwd_span_close(&r->fwd);   /* its forwarded launches */
	if (!ok) {
		trace_ev_put(r);
		shim_fwd_span_drop(&r->fwd);
		return;
	}
	trace_ev_end(r, stream, ptsz);
	pthread_mutex_lock(&trace_mu);
	if (start_locked() < 0 || !shim_tracing()) {
		pthread_mutex_unlock(&trace_mu);
		trace_ev_put(r);
		shim_fwd_span_drop(&r->fwd);
		return;
	}
	if (count == TRACE_PENDING_MAX)
		trace_drain_locked();
	if (count == TRACE_PENDING_MAX)
		resolve_head_locked(1);   /* the app never syncs: give up the oldest's times */
	ring[(head + count) % TRACE_PENDING_MAX] = *r;
	count++;
	trace_json_flush_due_locked(0);
	if (trace_feed_on())
		trace_feed_start_locked();
	pthread_mutex_unlock(&trace_mu);
}

void shim_trace_poll(void)
{
	pthread_mutex_lock(&trace_mu);
	if (started && !failed) {
		trace_drain_locked();
		trace_json_flush_due_locked(1);
	}
	pthread_mutex_unlock(&trace_mu);
}

/*
 * Called from colocate_query_end_v1, possibly inside a cudaLaunchHostFunc
 * callback where CUDA calls are forbidden: only queue the line, never
 * resolve (resolving queries events).  The next sync or exit writes it.
 * A full queue (thousands of tasks and no sync) drops it, counted.
 */
void shim_trace_query(int begin, uint64_t id, uint64_t size, const char *rule, uint64_t t_ns,
		      int64_t latency_ns)
{
	struct shim_trace_rec r;

	memset(&r, 0, offsetof(struct shim_trace_rec, params));
	r.kind = begin ? TRACE_REC_QBEGIN : TRACE_REC_QEND;
	r.query = id;
	r.shmem = size;
	r.host_ns = t_ns;
	r.latency_ns = latency_ns;
	snprintf(r.api, sizeof(r.api), "%s", rule);
	pthread_mutex_lock(&trace_mu);
	if (start_locked() == 0 && trace_file_on()) {
		if (count < TRACE_PENDING_MAX) {
			ring[(head + count) % TRACE_PENDING_MAX] = r;
			count++;
		} else {
			trace_json_drop_locked();
		}
	}
	pthread_mutex_unlock(&trace_mu);
}

/* Like a query boundary: queued, written in issue order with the tasks. */
void shim_trace_op(int op, int dir, uint64_t bytes, int blocking, const struct shim_op_site *at)
{
	struct shim_trace_rec r;
	uint64_t now = shim_now_ns();

	memset(&r, 0, offsetof(struct shim_trace_rec, params));
	r.kind = op;
	r.op_dir = dir;
	r.op_bytes = bytes;
	r.op_blocking = blocking;
	r.stream = at->stream;
	r.host_ns = at->t0_ns;
	r.latency_ns = now > at->t0_ns ? (int64_t)(now - at->t0_ns) : 0;
	r.has_query = shim_query_current(&r.query);
	snprintf(r.api, sizeof(r.api), "%s", at->api);
	pthread_mutex_lock(&trace_mu);
	if (start_locked() == 0 && trace_file_on()) {
		if (count == TRACE_PENDING_MAX)
			trace_drain_locked();
		if (count < TRACE_PENDING_MAX) {
			ring[(head + count) % TRACE_PENDING_MAX] = r;
			count++;
			trace_json_flush_due_locked(0);
		} else {
			trace_json_drop_locked();
		}
	}
	pthread_mutex_unlock(&trace_mu);
}

/* ---- settling: exit and device reset --------------------------------------- */
/* trace_mu within about ns, else -1: exit() may run on a thread that
 * already holds it (a signal handler interrupted shim_trace_end), and then waiting
 * for it would hang the exit for ever. */
static int lock_bounded(uint64_t ns)
{
	uint64_t deadline = shim_now_ns() + ns;
	struct timespec nap = { 0, 1000000 };

	while (pthread_mutex_trylock(&trace_mu) != 0) {
		if (shim_now_ns() >= deadline)
			return -1;
		nanosleep(&nap, NULL);
	}
	return 0;
}

#define LOCK_WAIT_NS 200000000ull

/* Under trace_mu (held again on return when 0): write every queued record,
 * waiting up to wait_ns for the work still queued to complete on its own,
 * then giving up the times of the rest.  Returns the records given up,
 * or -1 when trace_mu could not be had back (then it is not held). */
static long settle_locked(uint64_t wait_ns)
{
	uint64_t deadline = shim_now_ns() + wait_ns;
	struct timespec nap = { 0, 50000 };
	long late = 0;

	while (count) {
		if (resolve_head_locked(0))
			continue;
		if (shim_now_ns() >= deadline) {
			late += count;
			while (count)
				resolve_head_locked(1);
			break;
		}
		pthread_mutex_unlock(&trace_mu);
		nanosleep(&nap, NULL);
		if (lock_bounded(LOCK_WAIT_NS) < 0)
			return -1;
	}
	return late;
}

static uint64_t wait_ms(void)
{
	const char *w = getenv("COLOCATE_TRACE_WAIT_MS");

	return (uint64_t)(w && *w ? atoll(w) : 2000);
}

/*
 * cudaDeviceReset destroys the context and with it every event: those in
 * the pool, those of queued records, ref.  Before the real reset (the
 * events are still alive): write what completes within the wait, then
 * forget them all; the next task creates fresh ones and a new time zero.
 * Records begun before and ended after the reset (another thread) see a
 * newer generation and go untimed.  Both backends: the runtime's context
 * is the driver's primary context.
 */
void shim_trace_device_reset(void)
{
	pthread_mutex_lock(&trace_mu);
	if (started && !failed && getpid() == trace_pid &&
	    settle_locked(wait_ms() * 1000000ull) < 0)
		return;         /* trace_mu not held: nothing else can be done */
	trace_ev_reset_locked();
	events_seen = 0;        /* CUDA registers its exit handlers again */
	if (started && !failed)
		trace_json_flush_locked();
	pthread_mutex_unlock(&trace_mu);
}

/* ---- exit ---------------------------------------------------------------- */
static void trace_exit(void)
{
	long late;

	trace_feed_stop();     /* from here on, settling sends the feed's batches */
	if (lock_bounded(LOCK_WAIT_NS) < 0) {
		shim_log("trace: the trace lock stayed busy at exit (exit from a signal handler?); "
			 "the last records are not written");
		return;
	}
	if (!started || failed || getpid() != trace_pid) {
		pthread_mutex_unlock(&trace_mu);
		return;
	}
	/* the work still queued completes on its own: wait for it, bounded */
	late = settle_locked(wait_ms() * 1000000ull);
	if (late < 0) {
		shim_log("trace: the trace lock stayed busy at exit; the last records are not written");
		return;
	}
	trace_json_flush_locked();
	trace_feed_exit_locked();
	trace_json_report_locked(late);
	pthread_mutex_unlock(&trace_mu);
}
