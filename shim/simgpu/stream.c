/*
 * stream.c - streams: ordered queues of device work, each drained by its
 * own executor thread.
 *
 * Enqueue is the launch fast path, so it takes no lock and makes no system
 * call while the executor is busy: an intrusive multi-producer queue
 * (Vyukov) takes the operation, and the executor is signalled only when it
 * has gone to sleep.  An idle executor spins a few tens of microseconds
 * before sleeping, because launch loops refill the queue sooner than that.
 *
 * Ordering is by counts: s->enq counts operations enqueued, s->done those
 * completed (in queue order).  "Wait for everything enqueued so far" is
 * "wait until done >= the enq we saw"; an operation may carry such
 * dependencies on other streams (events, and the legacy default stream:
 * work on the NULL stream waits for all earlier work on blocking streams,
 * and work on a blocking stream waits for earlier work on the NULL stream).
 *
 * Each stream also keeps a device clock: the modelled end time of its last
 * operation.  An operation starts at the latest of that clock, its own
 * enqueue time and the end times of its dependencies (looked up in a ring
 * of recent end times), so modelled time is free of host scheduling noise.
 *
 * Stream objects are never freed: a destroyed stream goes to a pool and is
 * reused, counters and thread included.  Dependencies that point at it
 * stay meaningful because its counters only ever grow.
 *
 * A capturing stream (capture.c) runs nothing: synchronising or querying
 * it is CUDA's cudaErrorStreamCaptureUnsupported, and its host functions
 * become graph nodes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

#include "graph.h"

#define RING       1024
#define SPIN_EXEC  30e-6    /* seconds an idle executor polls         */
#define SPIN_WAIT  100e-6   /* seconds a waiter polls before sleeping:
				* a device finishing within it is seen at
				* once (simgpu_impl.h, wake margin)     */

enum { K_LEGACY, K_PTDS, K_USER };

struct sg_stream {
	/* producer side */
	_Alignas(64) _Atomic(struct sg_op *) head;
	atomic_ullong enq;
	/* consumer side */
	_Alignas(64) struct sg_op *tail;
	atomic_ullong done;
	double        clock;
	struct sg_op  stub;
	/* bookkeeping */
	_Alignas(64) int kind;
	unsigned      flags;
	int           prio;
	atomic_int    blocking;
	atomic_int    sleeping;
	atomic_int    nwaiters;
	atomic_int    started;
	unsigned      sms;             /* green context's SMs, 0 no limit  */
	void         *green;           /* the driver's green context, tag  */
	int           inline_mode;     /* no executor thread could be made */
	pthread_mutex_t inline_mu;     /* serialises inline execution      */
	pthread_mutex_t mu;
	pthread_cond_t  wake_cv, done_cv;
	pthread_t       thread;
	struct sg_stream *all_next;
	struct sg_stream *pool_next;
	atomic_ullong ring_seq[RING];
	_Atomic double ring_t[RING];
};

static struct sg_stream legacy_stream;
static _Atomic(struct sg_stream *) all_streams;
static struct sg_stream *pool;
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sg_hset handles = SG_HSET_INIT;
static pthread_once_t legacy_once = PTHREAD_ONCE_INIT;
static pthread_key_t ptds_key;
static __thread struct sg_stream *ptds;

/* ---------------------------------------------------------------- queue */

static void q_init(struct sg_stream *s)
{
	atomic_store(&s->stub.next, NULL);
	atomic_store(&s->head, &s->stub);
	s->tail = &s->stub;
}

static void q_push(struct sg_stream *s, struct sg_op *op)
{
	struct sg_op *prev;

	atomic_store_explicit(&op->next, NULL, memory_order_relaxed);
	prev = atomic_exchange(&s->head, op);
	atomic_store(&prev->next, op);
}

/* Consumer only.  NULL when empty, or while a producer is mid-push. */
static struct sg_op *q_pop(struct sg_stream *s)
{
	struct sg_op *tail = s->tail;
	struct sg_op *next = atomic_load_explicit(&tail->next, memory_order_acquire);

	if (tail == &s->stub) {
		if (!next)
			return NULL;
		s->tail = next;
		tail = next;
		next = atomic_load_explicit(&next->next, memory_order_acquire);
	}
	if (next) {
		s->tail = next;
		return tail;
	}
	if (tail != atomic_load(&s->head))
		return NULL;
	q_push(s, &s->stub);
	next = atomic_load_explicit(&tail->next, memory_order_acquire);
	if (next) {
		s->tail = next;
		return tail;
	}
	return NULL;
}

/* ---------------------------------------------------------------- ops */

struct sg_op *sg_op_new(int kind, size_t extra)
{
	struct sg_op *op = malloc(sizeof(*op) + extra);

	if (!op)
		return NULL;
	memset(op, 0, sizeof(*op));
	op->kind = kind;
	op->deps = op->dep_buf;
	return op;
}

void sg_op_free(struct sg_op *op)
{
	if (!op)
		return;
	if (op->deps != op->dep_buf)
		free(op->deps);
	free(op);
}

int sg_op_add_dep(struct sg_op *op, struct sg_stream *s, uint64_t seq)
{
	int i;

	for (i = 0; i < op->ndeps; i++)
		if (op->deps[i].s == s) {
			if (op->deps[i].seq < seq)
				op->deps[i].seq = seq;
			return 0;
		}
	if (op->ndeps >= 2 && (op->ndeps & (op->ndeps - 1)) == 0) {
		/* grow at 2, 4, 8, ... */
		struct sg_dep *nd = malloc(sizeof(*nd) * (size_t)op->ndeps * 2);

		if (!nd) {
			/* cannot record it: honour it now, synchronously */
			sg_stream_wait(s, seq);
			return 0;
		}
		memcpy(nd, op->deps, sizeof(*nd) * (size_t)op->ndeps);
		if (op->deps != op->dep_buf)
			free(op->deps);
		op->deps = nd;
	}
	op->deps[op->ndeps].s = s;
	op->deps[op->ndeps].seq = seq;
	op->ndeps++;
	return 0;
}

/* ---------------------------------------------------------------- objects */

static void stream_init_obj(struct sg_stream *s)
{
	struct sg_stream *h;

	q_init(s);
	pthread_mutex_init(&s->inline_mu, NULL);
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->wake_cv, NULL);
	pthread_cond_init(&s->done_cv, NULL);
	/* publish on the list of all streams (never unlinked) */
	h = atomic_load(&all_streams);
	do
		s->all_next = h;
	while (!atomic_compare_exchange_weak(&all_streams, &h, s));
}

static void ptds_release(void *arg)
{
	struct sg_stream *s = arg;

	pthread_mutex_lock(&pool_mu);
	s->pool_next = pool;
	pool = s;
	pthread_mutex_unlock(&pool_mu);
}

/*
 * A child forked by a process that used simgpu has none of its executor
 * threads (CUDA does not allow that at all): give the child fresh, empty
 * streams.  The parent's queued work is the parent's; the child drops it.
 */
static void after_fork_child(void)
{
	struct sg_stream *s;

	pthread_mutex_init(&pool_mu, NULL);
	for (s = atomic_load(&all_streams); s; s = s->all_next) {
		q_init(s);
		pthread_mutex_init(&s->inline_mu, NULL);
		pthread_mutex_init(&s->mu, NULL);
		pthread_cond_init(&s->wake_cv, NULL);
		pthread_cond_init(&s->done_cv, NULL);
		atomic_store(&s->sleeping, 0);
		atomic_store(&s->nwaiters, 0);
		s->inline_mode = 0;
		atomic_store(&s->started, 0);
		atomic_store(&s->done, atomic_load(&s->enq));
	}
}

static void legacy_init(void)
{
	legacy_stream.kind = K_LEGACY;
	atomic_store(&legacy_stream.blocking, 1);
	stream_init_obj(&legacy_stream);
	pthread_key_create(&ptds_key, ptds_release);
	pthread_atfork(NULL, NULL, after_fork_child);
}

static struct sg_stream *stream_get(int kind, unsigned flags, int prio)
{
	struct sg_stream *s;

	pthread_once(&legacy_once, legacy_init);
	pthread_mutex_lock(&pool_mu);
	s = pool;
	if (s)
		pool = s->pool_next;
	pthread_mutex_unlock(&pool_mu);
	if (!s) {
		s = aligned_alloc(64, (sizeof(*s) + 63) / 64 * 64);
		if (!s)
			return NULL;
		memset(s, 0, sizeof(*s));
		stream_init_obj(s);
	}
	s->kind = kind;
	s->flags = flags;
	s->prio = prio;
	/* a reused object is no longer the green context's it was */
	s->sms = 0;
	s->green = NULL;
	atomic_store(&s->blocking, !(flags & cudaStreamNonBlocking));
	return s;
}

struct sg_stream *sg_stream_legacy(void)
{
	pthread_once(&legacy_once, legacy_init);
	return &legacy_stream;
}

static struct sg_stream *ptds_get(void)
{
	if (SG_LIKELY(ptds != NULL))
		return ptds;
	ptds = stream_get(K_PTDS, 0, 0);
	if (ptds)
		pthread_setspecific(ptds_key, ptds);
	return ptds;
}

struct sg_stream *sg_stream_resolve(cudaStream_t h, int ptsz)
{
	if (!h)
		return ptsz ? ptds_get() : sg_stream_legacy();
	if (h == cudaStreamLegacy)
		return sg_stream_legacy();
	if (h == cudaStreamPerThread)
		return ptds_get();
	if (sg_hset_has(&handles, h))
		return (struct sg_stream *)h;
	return NULL;
}

int sg_stream_blocking(struct sg_stream *s)
{
	return s != &legacy_stream && atomic_load_explicit(&s->blocking, memory_order_relaxed);
}

cudaStream_t sg_stream_handle(struct sg_stream *s)
{
	if (s == &legacy_stream)
		return NULL;
	if (s->kind == K_PTDS)
		return cudaStreamPerThread;
	return (cudaStream_t)s;
}

/*
 * A green context's stream (the driver's cuGreenCtxStreamCreate): its
 * kernels run on at most sms SMs.  Set once, before the driver hands the
 * handle out, so launches read it without a lock.  Only user streams: the
 * legacy and per-thread streams belong to no green context.
 */
int sg_stream_set_green(struct sg_stream *s, void *green, unsigned sms)
{
	if (!s || s->kind != K_USER)
		return -1;
	s->green = green;
	s->sms = sms;
	return 0;
}

unsigned sg_stream_sms(const struct sg_stream *s)
{
	return s->sms;
}

void *sg_stream_green(const struct sg_stream *s)
{
	return s->green;
}

/* ---------------------------------------------------------------- waiting */

double sg_stream_time_of(struct sg_stream *s, uint64_t seq)
{
	size_t i = seq % RING;
	uint64_t a = atomic_load(&s->ring_seq[i]);
	double t = atomic_load(&s->ring_t[i]);

	if (a != seq || atomic_load(&s->ring_seq[i]) != seq)
		return 0;     /* long gone: it cannot matter any more */
	return t;
}

void sg_stream_wait(struct sg_stream *s, uint64_t seq)
{
	double until;
	int i;

	if (atomic_load(&s->done) >= seq)
		return;
	until = sg_mono() + SPIN_WAIT;
	for (i = 1;; i++) {
		if (i > 200)            /* a short spin, then polls that yield */
			sg_poll_yield();
		else
			sg_cpu_relax();
		if (atomic_load(&s->done) >= seq)
			return;
		if ((i & 63) == 0 && sg_mono() > until)
			break;
	}
	atomic_fetch_add(&s->nwaiters, 1);
	pthread_mutex_lock(&s->mu);
	while (atomic_load(&s->done) < seq)
		pthread_cond_wait(&s->done_cv, &s->mu);
	pthread_mutex_unlock(&s->mu);
	atomic_fetch_sub(&s->nwaiters, 1);
}

void sg_stream_drain(struct sg_stream *s)
{
	sg_stream_wait(s, atomic_load(&s->enq));
}

void sg_sync_all(void)
{
	struct sg_stream *s;

	sg_stream_legacy();
	for (s = atomic_load(&all_streams); s; s = s->all_next)
		sg_stream_drain(s);
}

/* ---------------------------------------------------------------- executor */

/*
 * The first operation queued after op in its stream past event records
 * (and event waits, if past_waits), looking at most 8 ahead; NULL if none.
 * Consumer only: producers only append.
 */
static struct sg_op *next_queued(struct sg_stream *s, struct sg_op *op, int past_waits)
{
	struct sg_op *n = atomic_load_explicit(&op->next, memory_order_acquire);
	int i;

	for (i = 0; n && i < 8; i++) {
		if (n != &s->stub && n->kind != SG_OP_RECORD && !(past_waits && n->kind == SG_OP_WAIT))
			return n;
		n = atomic_load_explicit(&n->next, memory_order_acquire);
	}
	return NULL;
}

/*
 * Whether a kernel follows op in its stream, past event records and waits:
 * the device model keeps a time-sliced context whose next kernel is queued
 * already (its channel is not idle).
 */
int sg_stream_kernel_follows(struct sg_stream *s, struct sg_op *op)
{
	struct sg_op *n = next_queued(s, op, 1);

	return n && n->kind == SG_OP_KERNEL;
}

/* Whether op is work the device model times that starts as soon as its
 * stream lets it (no dependencies): a kernel, lead (its launch overhead)
 * after that, or a copy over PCIe. */
static int starts_in_model(const struct sg_op *op, double *lead)
{
	if (op->ndeps)
		return 0;
	if (op->kind == SG_OP_KERNEL) {
		*lead = sg_cfg.launch_s;
		return 1;
	}
	*lead = 0;
	return op->kind == SG_OP_COPY && (op->u.copy.dir == SG_H2D || op->u.copy.dir == SG_D2H);
}

/*
 * The next operation of op's stream, past event records, when it is
 * already queued and starts_in_model(): it starts *lead after op ends,
 * whatever the host does (model.c's waits).  NULL otherwise.
 */
struct sg_op *sg_stream_next_start(struct sg_stream *s, struct sg_op *op, double *lead)
{
	struct sg_op *n = next_queued(s, op, 0);

	return n && starts_in_model(n, lead) ? n : NULL;
}

static void run_one(struct sg_stream *s, struct sg_op *op)
{
	double t0 = op->enq_t > s->clock ? op->enq_t : s->clock, end;
	uint64_t n;
	int i;

	for (i = 0; i < op->ndeps; i++) {
		double td;

		sg_stream_wait(op->deps[i].s, op->deps[i].seq);
		td = sg_stream_time_of(op->deps[i].s, op->deps[i].seq);
		if (td > t0)
			t0 = td;
	}
	end = sg_exec_op(s, op, t0);
	if (end < t0)
		end = t0;
	s->clock = end;
	n = atomic_load_explicit(&s->done, memory_order_relaxed) + 1;
	atomic_store(&s->ring_seq[n % RING], 0);
	atomic_store(&s->ring_t[n % RING], end);
	atomic_store(&s->ring_seq[n % RING], n);
	sg_op_free(op);
	atomic_store(&s->done, n);
	if (atomic_load(&s->nwaiters)) {
		pthread_mutex_lock(&s->mu);
		pthread_cond_broadcast(&s->done_cv);
		pthread_mutex_unlock(&s->mu);
	}
}

static struct sg_op *next_op(struct sg_stream *s)
{
	struct sg_op *op;
	double until;
	int i;

	for (;;) {
		op = q_pop(s);
		if (op)
			return op;
		until = sg_mono() + SPIN_EXEC;
		for (i = 1;; i++) {
			sg_cpu_relax();
			if ((op = q_pop(s)))
				return op;
			if ((i & 63) == 0 && sg_mono() > until)
				break;
		}
		atomic_store(&s->sleeping, 1);
		/* pairs with the producer's push-then-check: one of us sees the other */
		atomic_thread_fence(memory_order_seq_cst);
		op = q_pop(s);
		if (op) {
			atomic_store(&s->sleeping, 0);
			return op;
		}
		pthread_mutex_lock(&s->mu);
		while (atomic_load(&s->sleeping))
			pthread_cond_wait(&s->wake_cv, &s->mu);
		pthread_mutex_unlock(&s->mu);
	}
}

static void *executor(void *arg)
{
	struct sg_stream *s = arg;
	sigset_t faults;

	/* faults in twins must reach fault.c, not kill the process */
	sigemptyset(&faults);
	sigaddset(&faults, SIGSEGV);
	sigaddset(&faults, SIGBUS);
	sigaddset(&faults, SIGFPE);
	sigaddset(&faults, SIGILL);
	pthread_sigmask(SIG_UNBLOCK, &faults, NULL);
	/* modelled waits are short: do not let the kernel round them up */
	prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
	pthread_setname_np(pthread_self(), "simgpu-exec");
	for (;;)
		run_one(s, next_op(s));
	return NULL;
}

static void start_executor(struct sg_stream *s)
{
	pthread_attr_t a;
	sigset_t all, old;

	pthread_mutex_lock(&s->mu);
	if (!atomic_load(&s->started)) {
		pthread_attr_init(&a);
		pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
		/* the executor must not take the application's signals */
		sigfillset(&all);
		pthread_sigmask(SIG_SETMASK, &all, &old);
		if (sg_cfg.sync) {
			s->inline_mode = 1;
		} else if (pthread_create(&s->thread, &a, executor, s) != 0) {
			s->inline_mode = 1;
			sg_log("cannot start an executor thread: running work inline");
		}
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		pthread_attr_destroy(&a);
		atomic_store(&s->started, 1);
	}
	pthread_mutex_unlock(&s->mu);
}

/* Legacy default stream semantics, as dependencies of op. */
static void legacy_deps(struct sg_stream *s, struct sg_op *op)
{
	struct sg_stream *t;

	if (s == &legacy_stream) {
		for (t = atomic_load(&all_streams); t; t = t->all_next) {
			uint64_t e;

			if (t == s || !atomic_load_explicit(&t->blocking, memory_order_relaxed))
				continue;
			e = atomic_load(&t->enq);
			if (atomic_load(&t->done) < e)
				sg_op_add_dep(op, t, e);
		}
	} else if (atomic_load_explicit(&s->blocking, memory_order_relaxed)) {
		uint64_t e = atomic_load(&legacy_stream.enq);

		if (atomic_load(&legacy_stream.done) < e)
			sg_op_add_dep(op, &legacy_stream, e);
	}
}

uint64_t sg_enqueue(struct sg_stream *s, struct sg_op *op)
{
	uint64_t seq;

	legacy_deps(s, op);
	op->enq_t = sg_dev_now();
	if (SG_UNLIKELY(!atomic_load_explicit(&s->started, memory_order_acquire)))
		start_executor(s);
	if (SG_UNLIKELY(s->inline_mode)) {
		/* no thread: execute now, in order (run_one may take s->mu) */
		pthread_mutex_lock(&s->inline_mu);
		seq = atomic_fetch_add(&s->enq, 1) + 1;
		run_one(s, op);
		pthread_mutex_unlock(&s->inline_mu);
		return seq;
	}
	seq = atomic_fetch_add(&s->enq, 1) + 1;
	q_push(s, op);
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load(&s->sleeping)) {
		pthread_mutex_lock(&s->mu);
		atomic_store(&s->sleeping, 0);
		pthread_cond_signal(&s->wake_cv);
		pthread_mutex_unlock(&s->mu);
	}
	return seq;
}

/* ---------------------------------------------------------------- API */

static cudaError_t create(cudaStream_t *ps, unsigned flags, int prio)
{
	struct sg_stream *s;

	sg_init();
	if (!ps)
		return sg_err(cudaErrorInvalidValue);
	if (flags & ~(unsigned)cudaStreamNonBlocking)
		return sg_err(cudaErrorInvalidValue);
	s = stream_get(K_USER, flags, prio);
	if (!s || sg_hset_add(&handles, s) < 0)
		return sg_err(cudaErrorMemoryAllocation);
	*ps = (cudaStream_t)s;
	return cudaSuccess;
}

SG_API cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
	return create(pStream, 0, 0);
}

SG_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
	return create(pStream, flags, 0);
}

SG_API cudaError_t cudaStreamCreateWithPriority(cudaStream_t *pStream, unsigned int flags,
						int priority)
{
	/* the range is [-5, 0], lower is higher priority; clamp as CUDA does */
	if (priority < -5)
		priority = -5;
	if (priority > 0)
		priority = 0;
	return create(pStream, flags, priority);
}

SG_API cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
	struct sg_stream *s;

	sg_init();
	if (!stream || stream == cudaStreamLegacy || stream == cudaStreamPerThread ||
	    !sg_hset_has(&handles, stream))
		return sg_err(cudaErrorInvalidResourceHandle);
	s = (struct sg_stream *)stream;
	sg_hset_del(&handles, s);
	sg_capture_stream_gone(s);      /* before the object can be reused */
	sg_stream_attr_forget(s);       /* a reused object starts with none */
	/* Pending work still runs, in order; the object is reused later. */
	pthread_mutex_lock(&pool_mu);
	s->pool_next = pool;
	pool = s;
	pthread_mutex_unlock(&pool_mu);
	return cudaSuccess;
}

static cudaError_t stream_sync(cudaStream_t stream, int ptsz)
{
	struct sg_stream *s;
	cudaError_t e;

	sg_init();
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	e = sg_capture_forbid(s);       /* a capturing stream runs nothing */
	if (e != cudaSuccess)
		return sg_err(e);
	sg_stream_drain(s);
	return sg_sync_status();
}

SG_API cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
	return stream_sync(stream, 0);
}

SG_API cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t stream)
{
	return stream_sync(stream, 1);
}

static cudaError_t stream_query(cudaStream_t stream, int ptsz)
{
	struct sg_stream *s;
	cudaError_t e;

	sg_init();
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	e = sg_capture_forbid(s);
	if (e != cudaSuccess)
		return sg_err(e);
	if (sg_sticky() != cudaSuccess)
		return sg_err(sg_sticky());
	/* not an error: cudaErrorNotReady does not become the last error */
	return atomic_load(&s->done) >= atomic_load(&s->enq) ? cudaSuccess : cudaErrorNotReady;
}

SG_API cudaError_t cudaStreamQuery(cudaStream_t stream)
{
	return stream_query(stream, 0);
}

SG_API cudaError_t cudaStreamQuery_ptsz(cudaStream_t stream)
{
	return stream_query(stream, 1);
}

static cudaError_t get_flags(cudaStream_t stream, unsigned int *flags, int ptsz)
{
	struct sg_stream *s;

	sg_init();
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	if (!flags)
		return sg_err(cudaErrorInvalidValue);
	*flags = s->flags;
	return cudaSuccess;
}

SG_API cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int *flags)
{
	return get_flags(hStream, flags, 0);
}

SG_API cudaError_t cudaStreamGetFlags_ptsz(cudaStream_t hStream, unsigned int *flags)
{
	return get_flags(hStream, flags, 1);
}

static cudaError_t get_prio(cudaStream_t stream, int *prio, int ptsz)
{
	struct sg_stream *s;

	sg_init();
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	if (!prio)
		return sg_err(cudaErrorInvalidValue);
	*prio = s->prio;
	return cudaSuccess;
}

SG_API cudaError_t cudaStreamGetPriority(cudaStream_t hStream, int *priority)
{
	return get_prio(hStream, priority, 0);
}

SG_API cudaError_t cudaStreamGetPriority_ptsz(cudaStream_t hStream, int *priority)
{
	return get_prio(hStream, priority, 1);
}

SG_API cudaError_t cudaDeviceGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
	if (leastPriority)
		*leastPriority = 0;
	if (greatestPriority)
		*greatestPriority = -5;
	return cudaSuccess;
}

static cudaError_t add_callback(cudaStream_t stream, cudaStreamCallback_t cb, void *data,
				unsigned int flags, int ptsz)
{
	struct sg_stream *s;
	struct sg_op *op;
	cudaError_t e;

	sg_init();
	if (!cb || flags != 0)
		return sg_err(cudaErrorInvalidValue);
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	/* CUDA cannot capture legacy callbacks (cudaLaunchHostFunc it can) */
	e = sg_capture_forbid(s);
	if (e != cudaSuccess)
		return sg_err(e);
	op = sg_op_new(SG_OP_CALLBACK, 0);
	if (!op)
		return sg_err(cudaErrorMemoryAllocation);
	op->u.cb.cb = cb;
	op->u.cb.data = data;
	op->u.cb.handle = stream;
	sg_enqueue(s, op);
	return cudaSuccess;
}

SG_API cudaError_t cudaStreamAddCallback(cudaStream_t stream, cudaStreamCallback_t callback,
					 void *userData, unsigned int flags)
{
	return add_callback(stream, callback, userData, flags, 0);
}

SG_API cudaError_t cudaStreamAddCallback_ptsz(cudaStream_t stream, cudaStreamCallback_t callback,
					      void *userData, unsigned int flags)
{
	return add_callback(stream, callback, userData, flags, 1);
}

static cudaError_t host_func(cudaStream_t stream, cudaHostFn_t fn, void *data, int ptsz)
{
	struct sg_stream *s;
	struct sg_op *op;
	cudaError_t e;
	int capturing;

	sg_init();
	if (!fn)
		return sg_err(cudaErrorInvalidValue);
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	op = sg_op_new(SG_OP_HOST, 0);
	if (!op)
		return sg_err(cudaErrorMemoryAllocation);
	op->u.host.fn = fn;
	op->u.host.data = data;
	e = sg_capture_gate(s, &capturing);
	if (e == cudaSuccess && capturing)
		e = sg_capture_add(s, op, sizeof(*op), cudaGraphNodeTypeHost);
	else if (e == cudaSuccess)
		sg_enqueue(s, op);
	else
		sg_op_free(op);
	if (e != cudaSuccess)
		return sg_err(e);
	return cudaSuccess;
}

SG_API cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
	return host_func(stream, fn, userData, 0);
}

SG_API cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
	return host_func(stream, fn, userData, 1);
}
