/*
 * capture.c - stream capture: cudaStreamBeginCapture .. cudaStreamEndCapture
 * record a stream's work as graph nodes instead of running it.
 *
 * A capture has an origin stream and a graph.  Each stream taking part (the
 * origin, and any stream that waited on an event recorded in the capture:
 * CUDA's fork) has a frontier: the nodes its next operation depends on.  An
 * operation on such a stream becomes a node after the frontier, and the
 * frontier becomes that node.  cudaEventRecord on a capturing stream keeps
 * a copy of the frontier in the event (sg_cevent); cudaStreamWaitEvent on
 * it adds those nodes to the waiting stream's frontier (a join), or makes a
 * stream outside the capture join it (a fork).  At the end every forked
 * stream must have been joined back into the origin, as CUDA demands.
 *
 * The rules CUDA enforces, and their errors:
 *   - the legacy stream cannot capture, and work on it while a blocking
 *     stream captures would synchronise with the capture
 *     (cudaErrorStreamCaptureImplicit; the capture is invalidated)
 *   - synchronising or querying a capturing stream
 *     (cudaErrorStreamCaptureUnsupported; invalidated)
 *   - "potentially unsafe" calls (a synchronous copy) while the thread's
 *     capture mode forbids them (cudaErrorStreamCaptureUnsupported)
 *   - an invalidated capture fails every later call on its streams and its
 *     end (cudaErrorStreamCaptureInvalidated)
 *   - waiting on an event from outside the capture
 *     (cudaErrorStreamCaptureIsolation), merging two captures
 *     (cudaErrorStreamCaptureMerge), ending it from another stream
 *     (cudaErrorStreamCaptureUnmatched) or thread
 *     (cudaErrorStreamCaptureWrongThread), a fork not joined back
 *     (cudaErrorStreamCaptureUnjoined)
 *
 * Captures are rare and short, so one mutex guards them all; operations
 * outside any capture pay one relaxed load of sg_captures.
 */
#include <stdlib.h>
#include <string.h>

#include "graph.h"

struct sg_capture {
	struct sg_graph    *g;
	int                 own_graph;   /* made here: destroyed on failure   */
	struct sg_stream   *origin;
	int                 mode;        /* enum cudaStreamCaptureMode         */
	pthread_t           thread;      /* that began it                      */
	unsigned long long  id;
	int                 invalid;
	struct sg_capture  *next;
};

/* A stream taking part in a capture. */
struct sg_cstream {
	struct sg_stream  *s;
	struct sg_capture *cap;
	struct sg_gnode  **front;
	size_t             nfront, capn;
	struct sg_cstream *next;
};

/* An event recorded in a capture: the capture, and its frontier then. */
struct sg_cevent {
	unsigned long long id;
	struct sg_gnode  **front;
	size_t             nfront;
};

atomic_int sg_captures;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct sg_capture *caps;
static struct sg_cstream *members;
static unsigned long long last_id;
static __thread int thread_mode;   /* cudaStreamCaptureModeGlobal is 0 */

/* ---------------------------------------------------------------- helpers (mu held) */

static struct sg_cstream *member(struct sg_stream *s)
{
	struct sg_cstream *m;

	for (m = members; m; m = m->next)
		if (m->s == s)
			return m;
	return NULL;
}

static struct sg_capture *capture_by_id(unsigned long long id)
{
	struct sg_capture *c;

	for (c = caps; c; c = c->next)
		if (c->id == id)
			return c;
	return NULL;
}

static int front_room(struct sg_cstream *m, size_t n)
{
	struct sg_gnode **v;
	size_t cap;

	if (n <= m->capn)
		return 0;
	cap = m->capn ? m->capn : 4;
	while (cap < n)
		cap *= 2;
	v = realloc(m->front, cap * sizeof(*v));
	if (!v)
		return -1;
	m->front = v;
	m->capn = cap;
	return 0;
}

/* frontier |= nodes (a join); -1 out of memory */
static int front_add(struct sg_cstream *m, struct sg_gnode *const *v, size_t n)
{
	size_t i, j;

	if (front_room(m, m->nfront + n) < 0)
		return -1;
	for (i = 0; i < n; i++) {
		for (j = 0; j < m->nfront && m->front[j] != v[i]; j++)
			;
		if (j == m->nfront)
			m->front[m->nfront++] = v[i];
	}
	return 0;
}

static struct sg_cstream *member_new(struct sg_stream *s, struct sg_capture *c,
				     struct sg_gnode *const *front, size_t n)
{
	struct sg_cstream *m = calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	m->s = s;
	m->cap = c;
	if (front_add(m, front, n) < 0) {
		free(m);
		return NULL;
	}
	m->next = members;
	members = m;
	return m;
}

static void members_drop(struct sg_capture *c)
{
	struct sg_cstream **pp = &members, *m;

	while ((m = *pp)) {
		if (m->cap == c) {
			*pp = m->next;
			free(m->front);
			free(m);
		} else {
			pp = &m->next;
		}
	}
}

static void capture_unlink(struct sg_capture *c)
{
	struct sg_capture **pp;

	for (pp = &caps; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	members_drop(c);
	atomic_fetch_sub(&sg_captures, 1);
}

/*
 * Whether a capture of a blocking stream is going on, which work on the
 * legacy stream would synchronise with: invalidate them all.
 */
static int legacy_conflict(void)
{
	struct sg_cstream *m;
	int hit = 0;

	for (m = members; m; m = m->next)
		if (!m->cap->invalid && sg_stream_blocking(m->s)) {
			m->cap->invalid = 1;
			hit = 1;
		}
	return hit;
}

/* ---------------------------------------------------------------- ops */

static cudaError_t check(struct sg_stream *s, int *capturing, int forbid)
{
	struct sg_cstream *m;
	cudaError_t e = cudaSuccess;

	pthread_mutex_lock(&mu);
	m = member(s);
	if (m) {
		if (m->cap->invalid) {
			e = cudaErrorStreamCaptureInvalidated;
		} else if (forbid) {
			m->cap->invalid = 1;
			e = cudaErrorStreamCaptureUnsupported;
		} else {
			*capturing = 1;
		}
	} else if (s == sg_stream_legacy() && legacy_conflict()) {
		e = cudaErrorStreamCaptureImplicit;
	}
	pthread_mutex_unlock(&mu);
	return e;
}

cudaError_t sg_capture_gate_slow(struct sg_stream *s, int *capturing)
{
	return check(s, capturing, 0);
}

cudaError_t sg_capture_forbid(struct sg_stream *s)
{
	int capturing = 0;

	if (SG_LIKELY(!atomic_load_explicit(&sg_captures, memory_order_relaxed)))
		return cudaSuccess;
	return check(s, &capturing, 1);
}

cudaError_t sg_capture_unsafe(void)
{
	pthread_t self = pthread_self();
	struct sg_capture *c;
	cudaError_t e = cudaSuccess;

	if (SG_LIKELY(!atomic_load_explicit(&sg_captures, memory_order_relaxed)) ||
	    thread_mode == cudaStreamCaptureModeRelaxed)
		return cudaSuccess;
	pthread_mutex_lock(&mu);
	for (c = caps; c; c = c->next) {
		int own = pthread_equal(c->thread, self);

		if ((own && c->mode != cudaStreamCaptureModeRelaxed) ||
		    (!own && c->mode == cudaStreamCaptureModeGlobal &&
		     thread_mode == cudaStreamCaptureModeGlobal)) {
			c->invalid = 1;
			e = cudaErrorStreamCaptureUnsupported;
		}
	}
	pthread_mutex_unlock(&mu);
	return e;
}

cudaError_t sg_capture_sync_all(void)
{
	struct sg_capture *c;
	cudaError_t e = cudaSuccess;

	if (SG_LIKELY(!atomic_load_explicit(&sg_captures, memory_order_relaxed)))
		return cudaSuccess;
	pthread_mutex_lock(&mu);
	for (c = caps; c; c = c->next) {
		c->invalid = 1;
		e = cudaErrorStreamCaptureUnsupported;
	}
	pthread_mutex_unlock(&mu);
	return e;
}

cudaError_t sg_capture_add(struct sg_stream *s, struct sg_op *op, size_t size, int type)
{
	struct sg_cstream *m;
	struct sg_gnode *nd;
	cudaError_t e;

	pthread_mutex_lock(&mu);
	m = member(s);
	if (!m) {
		/* the capture ended since the gate: the work runs after all */
		pthread_mutex_unlock(&mu);
		sg_graph_run_op(s, op);
		return cudaSuccess;
	}
	if (m->cap->invalid) {
		pthread_mutex_unlock(&mu);
		sg_op_free(op);
		return cudaErrorStreamCaptureInvalidated;
	}
	if (front_room(m, 1) < 0) {
		e = cudaErrorMemoryAllocation;
	} else {
		e = sg_graph_add(m->cap->g, type, op, size, m->front, m->nfront, &nd);
		if (e == cudaSuccess) {
			m->front[0] = nd;
			m->nfront = 1;
		}
	}
	if (e != cudaSuccess) {
		m->cap->invalid = 1;   /* the graph would lack the work */
		sg_op_free(op);
	}
	pthread_mutex_unlock(&mu);
	return e;
}

struct sg_cevent *sg_capture_record(struct sg_stream *s, cudaError_t *e)
{
	struct sg_cstream *m;
	struct sg_cevent *c = NULL;

	*e = cudaSuccess;
	pthread_mutex_lock(&mu);
	m = member(s);
	if (m && m->cap->invalid) {
		*e = cudaErrorStreamCaptureInvalidated;
	} else if (m) {
		c = calloc(1, sizeof(*c));
		if (c && m->nfront && !(c->front = malloc(m->nfront * sizeof(*c->front)))) {
			free(c);
			c = NULL;
		}
		if (!c) {
			*e = cudaErrorMemoryAllocation;
		} else {
			c->id = m->cap->id;
			c->nfront = m->nfront;
			if (m->nfront)
				memcpy(c->front, m->front, m->nfront * sizeof(*c->front));
		}
	}
	pthread_mutex_unlock(&mu);
	return c;
}

void sg_cevent_free(struct sg_cevent *c)
{
	if (c) {
		free(c->front);
		free(c);
	}
}

int sg_cevent_live(const struct sg_cevent *c)
{
	int live;

	if (!c)
		return 0;
	pthread_mutex_lock(&mu);
	live = capture_by_id(c->id) != NULL;
	pthread_mutex_unlock(&mu);
	return live;
}

cudaError_t sg_capture_wait(struct sg_stream *s, const struct sg_cevent *c)
{
	struct sg_cstream *m;
	struct sg_capture *cap;
	cudaError_t e = cudaSuccess;

	pthread_mutex_lock(&mu);
	m = member(s);
	cap = c ? capture_by_id(c->id) : NULL;
	if (!c || !cap) {
		/* an event from outside any live capture */
		if (m) {
			m->cap->invalid = 1;
			e = cudaErrorStreamCaptureIsolation;
		}
	} else if (cap->invalid) {
		e = cudaErrorStreamCaptureInvalidated;
	} else if (m && m->cap != cap) {
		m->cap->invalid = cap->invalid = 1;
		e = cudaErrorStreamCaptureMerge;
	} else if (m) {
		if (front_add(m, c->front, c->nfront) < 0) {
			cap->invalid = 1;
			e = cudaErrorMemoryAllocation;
		}
	} else if (s == sg_stream_legacy()) {
		cap->invalid = 1;
		e = cudaErrorStreamCaptureImplicit;
	} else if (!member_new(s, cap, c->front, c->nfront)) {
		cap->invalid = 1;
		e = cudaErrorMemoryAllocation;
	}
	pthread_mutex_unlock(&mu);
	return e;
}

void sg_capture_stream_gone(struct sg_stream *s)
{
	struct sg_cstream **pp, *m;
	struct sg_capture *c = NULL;

	if (SG_LIKELY(!atomic_load_explicit(&sg_captures, memory_order_relaxed)))
		return;
	pthread_mutex_lock(&mu);
	for (pp = &members; (m = *pp); pp = &m->next)
		if (m->s == s)
			break;
	if (m) {
		m->cap->invalid = 1;
		if (m->cap->origin == s) {
			c = m->cap;
			capture_unlink(c);        /* frees m with the others */
		} else {
			*pp = m->next;
			free(m->front);
			free(m);
		}
	}
	pthread_mutex_unlock(&mu);
	if (c) {
		if (c->own_graph)
			sg_graph_free(c->g);
		free(c);
	}
}

/* ---------------------------------------------------------------- API */

static cudaError_t begin(cudaStream_t stream, int ptsz, struct sg_graph *into,
			 const cudaGraphNode_t *deps, size_t ndeps, enum cudaStreamCaptureMode mode)
{
	struct sg_stream *s;
	struct sg_capture *c;
	cudaError_t e = cudaSuccess;

	sg_init();
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
	    mode != cudaStreamCaptureModeRelaxed)
		return sg_err(cudaErrorInvalidValue);
	if (s == sg_stream_legacy())
		return sg_err(cudaErrorStreamCaptureUnsupported);
	c = calloc(1, sizeof(*c));
	if (!c)
		return sg_err(cudaErrorMemoryAllocation);
	c->g = into ? into : sg_graph_new();
	c->own_graph = !into;
	c->origin = s;
	c->mode = mode;
	c->thread = pthread_self();
	if (!c->g) {
		free(c);
		return sg_err(cudaErrorMemoryAllocation);
	}
	pthread_mutex_lock(&mu);
	if (member(s)) {
		e = cudaErrorIllegalState;        /* capturing already */
	} else if (!member_new(s, c, (struct sg_gnode *const *)deps, ndeps)) {
		e = cudaErrorMemoryAllocation;
	} else {
		c->id = ++last_id;
		c->next = caps;
		caps = c;
		atomic_fetch_add(&sg_captures, 1);
	}
	pthread_mutex_unlock(&mu);
	if (e != cudaSuccess) {
		if (c->own_graph)
			sg_graph_free(c->g);
		free(c);
		return sg_err(e);
	}
	return cudaSuccess;
}

SG_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
	return begin(stream, 0, NULL, NULL, 0, mode);
}

SG_API cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t stream,
					       enum cudaStreamCaptureMode mode)
{
	return begin(stream, 1, NULL, NULL, 0, mode);
}

static cudaError_t begin_to_graph(cudaStream_t stream, cudaGraph_t graph,
				  const cudaGraphNode_t *deps, const cudaGraphEdgeData *edges,
				  size_t ndeps, enum cudaStreamCaptureMode mode, int ptsz)
{
	struct sg_graph *g = (struct sg_graph *)graph;
	cudaGraphNode_t n;
	size_t i, cnt = 0;

	sg_init();
	/* the graph must be one (its node count says so) and the deps its nodes */
	if (!graph || cudaGraphGetNodes(graph, NULL, &cnt) != cudaSuccess || (ndeps && !deps))
		return sg_err(cudaErrorInvalidValue);
	for (i = 0; i < ndeps; i++) {
		enum cudaGraphNodeType t;

		n = deps[i];
		if (cudaGraphNodeGetType(n, &t) != cudaSuccess)
			return sg_err(cudaErrorInvalidValue);
		if (edges && (edges[i].type != cudaGraphDependencyTypeDefault ||
			      edges[i].from_port || edges[i].to_port))
			return sg_err(cudaErrorNotSupported);
	}
	return begin(stream, ptsz, g, deps, ndeps, mode);
}

SG_API cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t stream, cudaGraph_t graph,
						 const cudaGraphNode_t *dependencies,
						 const cudaGraphEdgeData *dependencyData,
						 size_t numDependencies,
						 enum cudaStreamCaptureMode mode)
{
	return begin_to_graph(stream, graph, dependencies, dependencyData, numDependencies, mode,
			      0);
}

SG_API cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t stream, cudaGraph_t graph,
						      const cudaGraphNode_t *dependencies,
						      const cudaGraphEdgeData *dependencyData,
						      size_t numDependencies,
						      enum cudaStreamCaptureMode mode)
{
	return begin_to_graph(stream, graph, dependencies, dependencyData, numDependencies, mode,
			      1);
}

/* Every other stream of c joined back: its frontier lies behind the
 * origin's (each of its nodes is one of the origin's frontier or an
 * ancestor of one). */
static int all_joined(struct sg_capture *c, struct sg_cstream *origin)
{
	struct sg_cstream *m;
	size_t i, j;

	for (m = members; m; m = m->next) {
		if (m->cap != c || m == origin)
			continue;
		for (i = 0; i < m->nfront; i++) {
			for (j = 0; j < origin->nfront; j++)
				if (sg_gnode_reaches(m->front[i], origin->front[j]))
					break;
			if (j == origin->nfront)
				return 0;
		}
	}
	return 1;
}

static cudaError_t end(cudaStream_t stream, cudaGraph_t *pGraph, int ptsz)
{
	struct sg_stream *s;
	struct sg_cstream *m;
	struct sg_capture *c;
	cudaError_t e = cudaSuccess;

	sg_init();
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	if (!pGraph)
		return sg_err(cudaErrorInvalidValue);
	pthread_mutex_lock(&mu);
	m = member(s);
	if (!m) {
		pthread_mutex_unlock(&mu);
		return sg_err(cudaErrorIllegalState);       /* not capturing */
	}
	c = m->cap;
	if (c->origin != s) {
		c->invalid = 1;
		pthread_mutex_unlock(&mu);
		return sg_err(cudaErrorStreamCaptureUnmatched);
	}
	if (c->mode != cudaStreamCaptureModeRelaxed && !pthread_equal(c->thread, pthread_self())) {
		pthread_mutex_unlock(&mu);
		return sg_err(cudaErrorStreamCaptureWrongThread);
	}
	if (c->invalid)
		e = cudaErrorStreamCaptureInvalidated;
	else if (!all_joined(c, m))
		e = cudaErrorStreamCaptureUnjoined;
	capture_unlink(c);
	pthread_mutex_unlock(&mu);
	if (e != cudaSuccess) {
		if (c->own_graph)
			sg_graph_free(c->g);
		*pGraph = NULL;
		free(c);
		return sg_err(e);
	}
	*pGraph = (cudaGraph_t)c->g;
	free(c);
	return cudaSuccess;
}

SG_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
	return end(stream, pGraph, 0);
}

SG_API cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t stream, cudaGraph_t *pGraph)
{
	return end(stream, pGraph, 1);
}

/*
 * The state of stream s: None, Active or Invalidated, with the capture's
 * id, graph and the stream's frontier; the legacy stream while a blocking
 * stream captures cannot be asked (CUDA says Implicit).  The frontier
 * handed out stays valid until the next call on the stream (CUDA's rule):
 * it is the member's own array, which only that stream's operations change.
 */
struct cinfo {
	unsigned long long     id;
	cudaGraph_t            graph;
	const cudaGraphNode_t *front;
	size_t                 nfront;
};

static cudaError_t status_of(cudaStream_t stream, int ptsz, enum cudaStreamCaptureStatus *st,
			     struct cinfo *ci)
{
	struct sg_stream *s;
	struct sg_cstream *m;
	cudaError_t e = cudaSuccess;

	sg_init();
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return cudaErrorInvalidResourceHandle;
	*st = cudaStreamCaptureStatusNone;
	if (!atomic_load(&sg_captures))
		return cudaSuccess;
	pthread_mutex_lock(&mu);
	m = member(s);
	if (m) {
		*st = m->cap->invalid ? cudaStreamCaptureStatusInvalidated
				      : cudaStreamCaptureStatusActive;
		if (ci) {
			ci->id = m->cap->id;
			ci->graph = (cudaGraph_t)m->cap->g;
			ci->front = (const cudaGraphNode_t *)m->front;
			ci->nfront = m->nfront;
		}
	} else if (s == sg_stream_legacy()) {
		for (m = members; m; m = m->next)
			if (sg_stream_blocking(m->s))
				e = cudaErrorStreamCaptureImplicit;
	}
	pthread_mutex_unlock(&mu);
	return e;
}

static cudaError_t is_capturing(cudaStream_t stream, enum cudaStreamCaptureStatus *st, int ptsz)
{
	cudaError_t e;

	if (!st)
		return sg_err(cudaErrorInvalidValue);
	e = status_of(stream, ptsz, st, NULL);
	return e == cudaSuccess ? e : sg_err(e);
}

SG_API cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
					 enum cudaStreamCaptureStatus *pCaptureStatus)
{
	return is_capturing(stream, pCaptureStatus, 0);
}

SG_API cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t stream,
					      enum cudaStreamCaptureStatus *pCaptureStatus)
{
	return is_capturing(stream, pCaptureStatus, 1);
}

static cudaError_t capture_info(cudaStream_t stream, enum cudaStreamCaptureStatus *st,
				unsigned long long *id, cudaGraph_t *graph,
				const cudaGraphNode_t **deps, const cudaGraphEdgeData **edges,
				size_t *ndeps, int ptsz)
{
	struct cinfo ci;
	cudaError_t e;

	if (!st)
		return sg_err(cudaErrorInvalidValue);
	memset(&ci, 0, sizeof(ci));
	e = status_of(stream, ptsz, st, &ci);
	if (e != cudaSuccess)
		return sg_err(e);
	if (id)
		*id = ci.id;
	if (graph)
		*graph = ci.graph;
	if (deps)
		*deps = ci.front;
	if (edges)
		*edges = NULL;           /* all edges are default ones */
	if (ndeps)
		*ndeps = ci.nfront;
	return cudaSuccess;
}

SG_API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream,
					    enum cudaStreamCaptureStatus *captureStatus_out,
					    unsigned long long *id_out, cudaGraph_t *graph_out,
					    const cudaGraphNode_t **dependencies_out,
					    const cudaGraphEdgeData **edgeData_out,
					    size_t *numDependencies_out)
{
	return capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out,
			    edgeData_out, numDependencies_out, 0);
}

SG_API cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t stream,
						 enum cudaStreamCaptureStatus *captureStatus_out,
						 unsigned long long *id_out, cudaGraph_t *graph_out,
						 const cudaGraphNode_t **dependencies_out,
						 const cudaGraphEdgeData **edgeData_out,
						 size_t *numDependencies_out)
{
	return capture_info(stream, captureStatus_out, id_out, graph_out, dependencies_out,
			    edgeData_out, numDependencies_out, 1);
}

SG_API cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode)
{
	int old;

	sg_init();
	if (!mode || (*mode != cudaStreamCaptureModeGlobal &&
		      *mode != cudaStreamCaptureModeThreadLocal &&
		      *mode != cudaStreamCaptureModeRelaxed))
		return sg_err(cudaErrorInvalidValue);
	old = thread_mode;
	thread_mode = *mode;
	*mode = (enum cudaStreamCaptureMode)old;
	return cudaSuccess;
}
