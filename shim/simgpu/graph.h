/*
 * graph.h - stream capture and CUDA graphs inside simgpu: what graph.c
 * (graphs and nodes), graphexec.c (executable graphs, launches), capture.c
 * (stream capture) and the files whose operations a capture diverts
 * (launch.c, copy.c, event.c, stream.c) share.
 *
 * A node keeps a template operation: the sg_op its work would have been
 * had it been enqueued (kernel arguments copied at add time, as CUDA copies
 * them).  A graph launch clones each template in a topological order and
 * enqueues the clones on the launch stream, so replays take simgpu's normal
 * op path and the device model times them.  Templates are never enqueued.
 */
#ifndef SIMGPU_GRAPH_H
#define SIMGPU_GRAPH_H

#include "simgpu_impl.h"

struct sg_cevent;

/* ------------------------------------------------------------------ graph.c */

struct sg_gnode {
	struct sg_graph  *g;
	int               type;    /* enum cudaGraphNodeType           */
	struct sg_op     *op;      /* template; NULL for an empty node */
	size_t            size;    /* its bytes                        */
	struct sg_gnode **deps;    /* incoming edges                   */
	size_t            ndeps;
	size_t            idx;     /* its place in g->nodes            */
	struct sg_graph  *child;   /* a child-graph node's own copy    */
	unsigned          mark;    /* scratch of walks over the graph  */
};

struct sg_graph {
	struct sg_gnode **nodes;   /* in the order they were added     */
	size_t            n, cap;
	unsigned          walk;    /* the last walk's mark             */
};

struct sg_graph *sg_graph_of(cudaGraph_t h);       /* NULL: not a graph */
struct sg_gnode *sg_gnode_of(cudaGraphNode_t h);   /* NULL: not a node  */
/* A copy of a template (a kernel's argument pointers moved along). */
struct sg_op *sg_op_copy(const struct sg_op *t, size_t size);
/* The template of a kernel node with parameters p ("extra" included). */
cudaError_t sg_kernel_node_op(const struct cudaKernelNodeParams *p, struct sg_op **op,
			      size_t *size);

struct sg_graph *sg_graph_new(void);         /* NULL: out of memory      */
void sg_graph_free(struct sg_graph *g);
/* A node of type (enum cudaGraphNodeType) that takes over op (NULL for an
 * empty node; size: the op's bytes, for cloning), after deps. */
cudaError_t sg_graph_add(struct sg_graph *g, int type, struct sg_op *op, size_t size,
			 struct sg_gnode *const *deps, size_t ndeps, struct sg_gnode **out);
/* 1 when a is b or one of b's ancestors */
int sg_gnode_reaches(const struct sg_gnode *a, const struct sg_gnode *b);

/* ------------------------------------------------------------------ graphexec.c */

/* Run a copy of a template on s, as the call it stands for would have
 * (event records and waits through event.c); takes op. */
void sg_graph_run_op(struct sg_stream *s, struct sg_op *op);
/* the exec's nodes as clones, appended to a capture (cudaGraphLaunch into
 * a capturing stream: CUDA adds the graph as a child node) */
cudaError_t sg_graph_exec_capture(cudaGraphExec_t e, struct sg_stream *s);

/* ------------------------------------------------------------------ capture.c */

extern atomic_int sg_captures;               /* captures in progress       */

/* Before work goes to stream s: cudaSuccess and *capturing 0 (enqueue it)
 * or 1 (hand it to sg_capture_add), or the error the call must return (s
 * is in an invalidated capture; s is the legacy stream while a blocking
 * stream captures: CUDA's implicit synchronisation is illegal then). */
cudaError_t sg_capture_gate_slow(struct sg_stream *s, int *capturing);
static inline cudaError_t sg_capture_gate(struct sg_stream *s, int *capturing)
{
	*capturing = 0;
	if (SG_LIKELY(!atomic_load_explicit(&sg_captures, memory_order_relaxed)))
		return cudaSuccess;
	return sg_capture_gate_slow(s, capturing);
}
/* Record op (size bytes) as a node of s's capture instead of running it;
 * takes op.  When the capture ended meanwhile, enqueues it after all. */
cudaError_t sg_capture_add(struct sg_stream *s, struct sg_op *op, size_t size, int type);
/* A call illegal on a capturing stream (synchronise, query): invalidates
 * the capture and returns cudaErrorStreamCaptureUnsupported; else
 * cudaSuccess.  Cheap when nothing captures. */
cudaError_t sg_capture_forbid(struct sg_stream *s);
/* A "potentially unsafe" call (synchronous copy, ...) under the calling
 * thread's capture mode: cudaErrorStreamCaptureUnsupported (and the
 * captures that forbid it invalidated) or cudaSuccess. */
cudaError_t sg_capture_unsafe(void);
/* A synchronisation of every stream (cudaDeviceSynchronize) while any
 * capture goes on: they are all invalidated, and the call fails with
 * cudaErrorStreamCaptureUnsupported, whatever the capture modes. */
cudaError_t sg_capture_sync_all(void);
/* cudaEventRecord on capturing stream s: the capture's current frontier,
 * for a later cudaStreamWaitEvent (fork / join); NULL with *e set. */
struct sg_cevent *sg_capture_record(struct sg_stream *s, cudaError_t *e);
void sg_cevent_free(struct sg_cevent *c);
int  sg_cevent_live(const struct sg_cevent *c);   /* its capture goes on  */
/* cudaStreamWaitEvent(s, an event recorded in a capture): s joins that
 * capture, or takes its nodes as dependencies. */
cudaError_t sg_capture_wait(struct sg_stream *s, const struct sg_cevent *c);
/* cudaStreamDestroy of s: a capture it takes part in is invalidated (and
 * ended, with its graph, when s is the origin: no one can end it now). */
void sg_capture_stream_gone(struct sg_stream *s);

/* ------------------------------------------------------------------ stream.c */

int sg_stream_blocking(struct sg_stream *s);     /* syncs with legacy     */

/* ------------------------------------------------------------------ launch.c */

/* A kernel operation with the argument values copied (the layout must be
 * known: cudaErrorNotSupported otherwise); *size its bytes. */
cudaError_t sg_kernel_op_new(struct sg_kernel *k, dim3 g, dim3 b, void **args, size_t shmem,
			     struct sg_op **out, size_t *size);

/* ------------------------------------------------------------------ copy.c */

/* Validated copy / memset operations, for graph nodes (no snapshot: a node
 * reads its source when it runs). */
cudaError_t sg_copy_op_new(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
			   struct sg_op **out);
cudaError_t sg_set_op_new(void *dst, int value, size_t n, struct sg_op **out);

/* ------------------------------------------------------------------ event.c */

struct sg_event *sg_event_lookup(cudaEvent_t e);
/* a record / wait node run at a graph launch: as cudaEventRecord and
 * cudaStreamWaitEvent would enqueue them on s */
cudaError_t sg_event_enqueue_record(struct sg_event *ev, struct sg_stream *s);
cudaError_t sg_event_enqueue_wait(struct sg_stream *s, struct sg_event *ev);

#endif
