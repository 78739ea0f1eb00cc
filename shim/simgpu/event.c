/*
 * event.c - events: markers in a stream that complete with a device time.
 *
 * cudaEventRecord enqueues a record operation; when the executor reaches
 * it the event completes with the stream's modelled time, so
 * cudaEventElapsedTime reports modelled device time, not host time.
 * Each record bumps the event's generation; a stale record (the event was
 * recorded again, or destroyed) completes nothing.
 *
 * Event objects are pooled and never freed, because queued record
 * operations may still point at an event the application destroyed.
 *
 * In a stream capture a record is no operation: the event keeps the
 * capture's frontier, and a cudaStreamWaitEvent on it forks another stream
 * into the capture or joins it back (capture.c).
 */
#include <stdlib.h>
#include <string.h>

#include "graph.h"

struct sg_event {
	unsigned          flags;
	pthread_mutex_t   mu;       /* s, seq, gen of the latest record */
	struct sg_stream *s;        /* NULL: never recorded             */
	uint64_t          seq;
	atomic_ullong     gen;
	atomic_ullong     done_gen;
	_Atomic double    t;
	struct sg_cevent *cap;      /* recorded in a capture, under mu  */
	struct sg_event  *pool_next;
};

static struct sg_hset handles = SG_HSET_INIT;
static struct sg_event *pool;
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;

void sg_event_complete(struct sg_event *ev, uint64_t gen, double t)
{
	if (atomic_load(&ev->gen) != gen)
		return;
	atomic_store(&ev->t, t);
	atomic_store(&ev->done_gen, gen);
}

static struct sg_event *lookup(cudaEvent_t e)
{
	return e && sg_hset_has(&handles, e) ? (struct sg_event *)e : NULL;
}

struct sg_event *sg_event_lookup(cudaEvent_t e)
{
	return lookup(e);
}

/* Forget a record made in a capture (mu held); the caller frees it. */
static struct sg_cevent *cap_take(struct sg_event *ev)
{
	struct sg_cevent *c = ev->cap;

	ev->cap = NULL;
	return c;
}

/* Whether ev was last recorded in a capture that goes on: it cannot be
 * waited for or queried then (CUDA: cudaErrorStreamCaptureUnsupported). */
static int in_capture(struct sg_event *ev)
{
	int r;

	if (SG_LIKELY(!atomic_load_explicit(&sg_captures, memory_order_relaxed)))
		return 0;
	pthread_mutex_lock(&ev->mu);
	r = sg_cevent_live(ev->cap);
	pthread_mutex_unlock(&ev->mu);
	return r;
}

SG_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
	struct sg_event *ev;
	struct sg_cevent *old;

	sg_init();
	if (!event)
		return sg_err(cudaErrorInvalidValue);
	if (flags & ~(unsigned)(cudaEventBlockingSync | cudaEventDisableTiming |
				cudaEventInterprocess))
		return sg_err(cudaErrorInvalidValue);
	if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming))
		return sg_err(cudaErrorInvalidValue);
	pthread_mutex_lock(&pool_mu);
	ev = pool;
	if (ev)
		pool = ev->pool_next;
	pthread_mutex_unlock(&pool_mu);
	if (!ev) {
		ev = calloc(1, sizeof(*ev));
		if (!ev)
			return sg_err(cudaErrorMemoryAllocation);
		pthread_mutex_init(&ev->mu, NULL);
	}
	pthread_mutex_lock(&ev->mu);
	ev->flags = flags;
	ev->s = NULL;
	ev->seq = 0;
	atomic_fetch_add(&ev->gen, 1);   /* orphan records of a former life */
	old = cap_take(ev);
	pthread_mutex_unlock(&ev->mu);
	sg_cevent_free(old);
	if (sg_hset_add(&handles, ev) < 0)
		return sg_err(cudaErrorMemoryAllocation);
	*event = (cudaEvent_t)ev;
	return cudaSuccess;
}

SG_API cudaError_t cudaEventCreate(cudaEvent_t *event)
{
	return cudaEventCreateWithFlags(event, 0);
}

SG_API cudaError_t cudaEventDestroy(cudaEvent_t event)
{
	struct sg_event *ev;
	struct sg_cevent *old;

	sg_init();
	ev = lookup(event);
	if (!ev)
		return sg_err(cudaErrorInvalidResourceHandle);
	sg_hset_del(&handles, ev);
	pthread_mutex_lock(&ev->mu);
	atomic_fetch_add(&ev->gen, 1);
	ev->s = NULL;
	old = cap_take(ev);
	pthread_mutex_unlock(&ev->mu);
	sg_cevent_free(old);
	pthread_mutex_lock(&pool_mu);
	ev->pool_next = pool;
	pool = ev;
	pthread_mutex_unlock(&pool_mu);
	return cudaSuccess;
}

cudaError_t sg_event_enqueue_record(struct sg_event *ev, struct sg_stream *s)
{
	struct sg_cevent *old;
	struct sg_op *op;

	op = sg_op_new(SG_OP_RECORD, 0);
	if (!op)
		return cudaErrorMemoryAllocation;
	pthread_mutex_lock(&ev->mu);
	op->u.rec.ev = ev;
	op->u.rec.gen = atomic_fetch_add(&ev->gen, 1) + 1;
	ev->s = s;
	ev->seq = sg_enqueue(s, op);
	old = cap_take(ev);
	pthread_mutex_unlock(&ev->mu);
	sg_cevent_free(old);
	return cudaSuccess;
}

/*
 * In a capture a record is no node: the event remembers the capture's
 * frontier for a cudaStreamWaitEvent to fork or join on.  With
 * cudaEventRecordExternal it is a node, an event record run at each launch.
 */
static cudaError_t record_captured(struct sg_event *ev, struct sg_stream *s, unsigned flags)
{
	struct sg_cevent *c, *old;
	struct sg_op *op;
	cudaError_t e;

	if (flags & cudaEventRecordExternal) {
		op = sg_op_new(SG_OP_RECORD, 0);
		if (!op)
			return cudaErrorMemoryAllocation;
		op->u.rec.ev = ev;
		return sg_capture_add(s, op, sizeof(*op), cudaGraphNodeTypeEventRecord);
	}
	c = sg_capture_record(s, &e);
	if (!c)
		return e == cudaSuccess ? sg_event_enqueue_record(ev, s) : e;  /* it ended */
	pthread_mutex_lock(&ev->mu);
	old = ev->cap;
	ev->cap = c;
	pthread_mutex_unlock(&ev->mu);
	sg_cevent_free(old);
	return cudaSuccess;
}

static cudaError_t record(cudaEvent_t event, cudaStream_t stream, unsigned flags, int ptsz)
{
	struct sg_event *ev;
	struct sg_stream *s;
	cudaError_t e;
	int capturing;

	sg_init();
	ev = lookup(event);
	if (!ev)
		return sg_err(cudaErrorInvalidResourceHandle);
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	if (flags & ~1u)    /* cudaEventRecordExternal is the only flag */
		return sg_err(cudaErrorInvalidValue);
	e = sg_capture_gate(s, &capturing);
	if (e == cudaSuccess)
		e = capturing ? record_captured(ev, s, flags) : sg_event_enqueue_record(ev, s);
	return e == cudaSuccess ? e : sg_err(e);
}

SG_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
	return record(event, stream, 0, 0);
}

SG_API cudaError_t cudaEventRecord_ptsz(cudaEvent_t event, cudaStream_t stream)
{
	return record(event, stream, 0, 1);
}

SG_API cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
					    unsigned int flags)
{
	return record(event, stream, flags, 0);
}

SG_API cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t event, cudaStream_t stream,
						 unsigned int flags)
{
	return record(event, stream, flags, 1);
}

SG_API cudaError_t cudaEventQuery(cudaEvent_t event)
{
	struct sg_event *ev;
	int recorded;
	uint64_t gen;

	sg_init();
	ev = lookup(event);
	if (!ev)
		return sg_err(cudaErrorInvalidResourceHandle);
	if (in_capture(ev))
		return sg_err(cudaErrorStreamCaptureUnsupported);
	pthread_mutex_lock(&ev->mu);
	recorded = ev->s != NULL;
	gen = atomic_load(&ev->gen);
	pthread_mutex_unlock(&ev->mu);
	if (!recorded)
		return cudaSuccess;
	if (sg_sticky() != cudaSuccess)
		return sg_err(sg_sticky());
	return atomic_load(&ev->done_gen) >= gen ? cudaSuccess : cudaErrorNotReady;
}

SG_API cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
	struct sg_event *ev;
	struct sg_stream *s;
	uint64_t seq;

	sg_init();
	ev = lookup(event);
	if (!ev)
		return sg_err(cudaErrorInvalidResourceHandle);
	if (in_capture(ev))
		return sg_err(cudaErrorStreamCaptureUnsupported);
	pthread_mutex_lock(&ev->mu);
	s = ev->s;
	seq = ev->seq;
	pthread_mutex_unlock(&ev->mu);
	if (s)
		sg_stream_wait(s, seq);
	return sg_sync_status();
}

SG_API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
	struct sg_event *a, *b;
	int rec_a, rec_b;
	uint64_t ga, gb;

	sg_init();
	if (!ms)
		return sg_err(cudaErrorInvalidValue);
	a = lookup(start);
	b = lookup(end);
	if (!a || !b)
		return sg_err(cudaErrorInvalidResourceHandle);
	if ((a->flags | b->flags) & cudaEventDisableTiming)
		return sg_err(cudaErrorInvalidResourceHandle);
	pthread_mutex_lock(&a->mu);
	rec_a = a->s != NULL;
	ga = atomic_load(&a->gen);
	pthread_mutex_unlock(&a->mu);
	pthread_mutex_lock(&b->mu);
	rec_b = b->s != NULL;
	gb = atomic_load(&b->gen);
	pthread_mutex_unlock(&b->mu);
	if (!rec_a || !rec_b)
		return sg_err(cudaErrorInvalidResourceHandle);
	if (atomic_load(&a->done_gen) < ga || atomic_load(&b->done_gen) < gb)
		return cudaErrorNotReady;     /* a state, not an error to remember */
	*ms = (float)((atomic_load(&b->t) - atomic_load(&a->t)) * 1e3);
	return cudaSuccess;
}

/* cudaEventElapsedTime_v2 appeared in CUDA 12.8; same semantics here. */
SG_API cudaError_t cudaEventElapsedTime_v2(float *ms, cudaEvent_t start, cudaEvent_t end)
{
	return cudaEventElapsedTime(ms, start, end);
}

cudaError_t sg_event_enqueue_wait(struct sg_stream *s, struct sg_event *ev)
{
	struct sg_stream *es;
	struct sg_op *op;
	uint64_t seq;

	pthread_mutex_lock(&ev->mu);
	es = ev->s;
	seq = ev->seq;
	pthread_mutex_unlock(&ev->mu);
	if (!es || es == s)
		return cudaSuccess;     /* nothing to wait for, or FIFO already */
	op = sg_op_new(SG_OP_WAIT, 0);
	if (!op)
		return cudaErrorMemoryAllocation;
	sg_op_add_dep(op, es, seq);
	sg_enqueue(s, op);
	return cudaSuccess;
}

/*
 * With a capture about: an event recorded in a live capture forks s into
 * it or joins s's nodes (sg_capture_wait); a capturing stream may wait on
 * an outside event only as a node (cudaEventWaitExternal).
 */
static cudaError_t wait_captured(struct sg_stream *s, struct sg_event *ev, unsigned flags,
				 int capturing, int *done)
{
	struct sg_op *op;
	cudaError_t e = cudaSuccess;
	int recorded;

	*done = 1;
	pthread_mutex_lock(&ev->mu);
	if (sg_cevent_live(ev->cap)) {
		e = sg_capture_wait(s, ev->cap);
		pthread_mutex_unlock(&ev->mu);
		return e;
	}
	recorded = ev->s != NULL;
	pthread_mutex_unlock(&ev->mu);
	if (!capturing) {
		*done = 0;              /* an ordinary wait */
		return cudaSuccess;
	}
	if (flags & cudaEventWaitExternal) {
		op = sg_op_new(SG_OP_WAIT, 0);
		if (!op)
			return cudaErrorMemoryAllocation;
		op->u.rec.ev = ev;
		return sg_capture_add(s, op, sizeof(*op), cudaGraphNodeTypeWaitEvent);
	}
	/* never recorded: nothing to wait for, in a capture too */
	return recorded ? sg_capture_wait(s, NULL) : cudaSuccess;
}

static cudaError_t wait_event(cudaStream_t stream, cudaEvent_t event, unsigned flags, int ptsz)
{
	struct sg_event *ev;
	struct sg_stream *s;
	cudaError_t e;
	int capturing, done = 0;

	sg_init();
	s = sg_stream_resolve(stream, ptsz);
	ev = lookup(event);
	if (!s || !ev)
		return sg_err(cudaErrorInvalidResourceHandle);
	if (flags & ~1u)    /* cudaEventWaitExternal */
		return sg_err(cudaErrorInvalidValue);
	e = sg_capture_gate(s, &capturing);
	if (e == cudaSuccess && atomic_load_explicit(&sg_captures, memory_order_relaxed))
		e = wait_captured(s, ev, flags, capturing, &done);
	if (e == cudaSuccess && !done)
		e = sg_event_enqueue_wait(s, ev);
	return e == cudaSuccess ? e : sg_err(e);
}

SG_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
	return wait_event(stream, event, flags, 0);
}

SG_API cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t stream, cudaEvent_t event,
					    unsigned int flags)
{
	return wait_event(stream, event, flags, 1);
}
