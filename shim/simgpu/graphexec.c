/*
 * graphexec.c - executable graphs (cudaGraphExec_t): instantiation, update,
 * and cudaGraphLaunch.
 *
 * Instantiation copies the graph's templates in a topological order, child
 * graphs flattened in their node's place, so an executable graph does not
 * depend on its graph any more (CUDA allows destroying the graph right
 * after instantiating it).  A launch clones every template and enqueues
 * the clones on the launch stream in that order: the nodes run one after
 * another, after the stream's earlier work and before its later work,
 * through the normal op path (exec.c times them in the device model).
 * Independent branches of a graph therefore do not overlap on simgpu;
 * their order is one CUDA could have picked.  Launched clones own their
 * copies: destroying or updating the exec never touches queued work.  A
 * graph launched into a capturing stream is appended to the capture node
 * by node.
 */
#include <stdlib.h>
#include <string.h>

#include "graph.h"

struct sg_xnode {
	int           type;
	struct sg_op *op;          /* NULL for an empty node */
	size_t        size;
	const struct sg_gnode *src;   /* the node it came from: identity only */
};

struct sg_gexec {
	size_t           n;
	struct sg_xnode *v;        /* topological order */
};

static struct sg_hset execs = SG_HSET_INIT;

/* ---------------------------------------------------------------- instantiate */

static void exec_free(struct sg_gexec *x)
{
	size_t i;

	for (i = 0; i < x->n; i++)
		free(x->v[i].op);
	free(x->v);
	free(x);
}

/*
 * Depth-first, dependencies before dependents, nodes taken in the order
 * they were added (so a captured stream replays in its own order).  An
 * explicit stack: a captured loop makes chains of thousands of nodes.
 * Marks: walk - 1 on the stack, walk placed (fresh values: marks only
 * grow).  0, -1 on a cycle, -2 out of memory.
 */
static int topo_order(struct sg_graph *g, struct sg_gnode **order)
{
	struct sg_gnode **stk;
	size_t *pos, top, i, n = 0;
	unsigned on, done;

	stk = malloc((g->n + 1) * sizeof(*stk));
	pos = malloc((g->n + 1) * sizeof(*pos));
	if (!stk || !pos) {
		free(stk);
		free(pos);
		return -2;
	}
	g->walk += 2;
	on = g->walk - 1;
	done = g->walk;
	for (i = 0; i < g->n; i++) {
		if (g->nodes[i]->mark == done)
			continue;
		top = 0;
		stk[top] = g->nodes[i];
		pos[top++] = 0;
		g->nodes[i]->mark = on;
		while (top) {
			struct sg_gnode *x = stk[top - 1];

			if (pos[top - 1] < x->ndeps) {
				struct sg_gnode *d = x->deps[pos[top - 1]++];

				if (d->mark == on) {
					free(stk);
					free(pos);
					return -1;
				}
				if (d->mark != done) {
					d->mark = on;
					stk[top] = d;
					pos[top++] = 0;
				}
				continue;
			}
			x->mark = done;
			order[n++] = x;
			top--;
		}
	}
	free(stk);
	free(pos);
	return 0;
}

/* The nodes a graph runs, its child graphs' included. */
static size_t flat_count(const struct sg_graph *g)
{
	size_t i, n = 0;

	for (i = 0; i < g->n; i++)
		n += g->nodes[i]->child ? flat_count(g->nodes[i]->child) : 1;
	return n;
}

/* Append g's nodes to x in a topological order, each child graph in its
 * node's place.  0, -1 a cycle, -2 out of memory. */
static int flatten(struct sg_graph *g, struct sg_gexec *x)
{
	struct sg_gnode **order = malloc((g->n + 1) * sizeof(*order));
	size_t i;
	int r;

	if (!order)
		return -2;
	r = topo_order(g, order);
	for (i = 0; r == 0 && i < g->n; i++) {
		struct sg_gnode *nd = order[i];

		if (nd->child) {
			r = flatten(nd->child, x);
			continue;
		}
		x->v[x->n].type = nd->type;
		x->v[x->n].size = nd->size;
		x->v[x->n].src = nd;
		if (nd->op && !(x->v[x->n].op = sg_op_copy(nd->op, nd->size)))
			r = -2;
		else
			x->n++;
	}
	free(order);
	return r;
}

static cudaError_t instantiate(cudaGraphExec_t *pExec, cudaGraph_t graph,
			       unsigned long long flags, cudaGraphInstantiateResult *result)
{
	struct sg_graph *g;
	struct sg_gexec *x;
	int r;

	sg_init();
	if (result)
		*result = cudaGraphInstantiateError;
	g = sg_graph_of(graph);
	if (!pExec || !g)
		return sg_err(cudaErrorInvalidValue);
	if (flags & ~(unsigned long long)(cudaGraphInstantiateFlagAutoFreeOnLaunch |
					  cudaGraphInstantiateFlagUpload |
					  cudaGraphInstantiateFlagDeviceLaunch |
					  cudaGraphInstantiateFlagUseNodePriority))
		return sg_err(cudaErrorInvalidValue);
	x = calloc(1, sizeof(*x));
	if (x)
		x->v = calloc(flat_count(g) + 1, sizeof(*x->v));
	if (!x || !x->v) {
		free(x);
		return sg_err(cudaErrorMemoryAllocation);
	}
	r = flatten(g, x);
	if (r < 0) {
		exec_free(x);
		if (r == -1 && result)
			*result = cudaGraphInstantiateInvalidStructure;
		return sg_err(r == -1 ? cudaErrorInvalidValue : cudaErrorMemoryAllocation);
	}
	if (sg_hset_add(&execs, x) < 0) {
		exec_free(x);
		return sg_err(cudaErrorMemoryAllocation);
	}
	if (result)
		*result = cudaGraphInstantiateSuccess;
	*pExec = (cudaGraphExec_t)x;
	return cudaSuccess;
}

SG_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
					unsigned long long flags)
{
	return instantiate(pGraphExec, graph, flags, NULL);
}

SG_API cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
						 unsigned long long flags)
{
	/* the upload flag belongs to cudaGraphInstantiateWithParams */
	if (flags & cudaGraphInstantiateFlagUpload)
		return sg_err(cudaErrorInvalidValue);
	return instantiate(pGraphExec, graph, flags, NULL);
}

static cudaError_t instantiate_params(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
				      cudaGraphInstantiateParams *p, int ptsz)
{
	cudaError_t e;

	sg_init();
	if (!p)
		return sg_err(cudaErrorInvalidValue);
	p->errNode_out = NULL;
	if ((p->flags & cudaGraphInstantiateFlagUpload) &&
	    !sg_stream_resolve(p->uploadStream, ptsz))
		return sg_err(cudaErrorInvalidResourceHandle);
	e = instantiate(pGraphExec, graph, p->flags, &p->result_out);
	return e;
}

SG_API cudaError_t cudaGraphInstantiateWithParams(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
						  cudaGraphInstantiateParams *p)
{
	return instantiate_params(pGraphExec, graph, p, 0);
}

SG_API cudaError_t cudaGraphInstantiateWithParams_ptsz(cudaGraphExec_t *pGraphExec,
						       cudaGraph_t graph,
						       cudaGraphInstantiateParams *p)
{
	return instantiate_params(pGraphExec, graph, p, 1);
}

SG_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
	sg_init();
	if (!graphExec || !sg_hset_has(&execs, graphExec))
		return sg_err(cudaErrorInvalidValue);
	sg_hset_del(&execs, graphExec);
	/* launched clones own their copies: nothing queued points in here */
	exec_free((struct sg_gexec *)graphExec);
	return cudaSuccess;
}

/*
 * The exec runs graph's nodes from now on, when graph has the same shape:
 * as many nodes, of the same types, in the same order.  (CUDA compares the
 * edges too; graphs captured from the same code, the common use, match.)
 */
SG_API cudaError_t cudaGraphExecUpdate(cudaGraphExec_t hGraphExec, cudaGraph_t hGraph,
				       cudaGraphExecUpdateResultInfo *info)
{
	struct sg_gexec *x, *nx;
	struct sg_xnode *v;
	cudaGraphExec_t tmp;
	cudaError_t e;
	size_t i, n;

	sg_init();
	if (info) {
		info->result = cudaGraphExecUpdateError;
		info->errorNode = info->errorFromNode = NULL;
	}
	if (!hGraphExec || !sg_hset_has(&execs, hGraphExec) || !sg_graph_of(hGraph))
		return sg_err(cudaErrorInvalidValue);
	x = (struct sg_gexec *)hGraphExec;
	e = instantiate(&tmp, hGraph, 0, NULL);
	if (e != cudaSuccess)
		return e;
	nx = (struct sg_gexec *)tmp;
	sg_hset_del(&execs, nx);
	for (i = 0; nx->n == x->n && i < x->n && nx->v[i].type == x->v[i].type; i++)
		;
	if (nx->n != x->n || i < x->n) {
		if (info) {
			info->result = nx->n != x->n ? cudaGraphExecUpdateErrorTopologyChanged
						    : cudaGraphExecUpdateErrorNodeTypeChanged;
			info->errorNode = i < nx->n ? (cudaGraphNode_t)nx->v[i].src : NULL;
		}
		exec_free(nx);
		return sg_err(cudaErrorGraphExecUpdateFailure);
	}
	v = x->v;                       /* swap: the old templates go with nx */
	n = x->n;
	x->v = nx->v;
	nx->v = v;
	nx->n = n;
	exec_free(nx);
	if (info)
		info->result = cudaGraphExecUpdateSuccess;
	return cudaSuccess;
}

/* New parameters for one kernel node of an exec, found by its graph node. */
SG_API cudaError_t cudaGraphExecKernelNodeSetParams(cudaGraphExec_t hGraphExec,
						    cudaGraphNode_t node,
						    const struct cudaKernelNodeParams *p)
{
	struct sg_gexec *x;
	struct sg_op *op;
	size_t size, i;
	cudaError_t e;

	sg_init();
	if (!hGraphExec || !sg_hset_has(&execs, hGraphExec) || !node)
		return sg_err(cudaErrorInvalidValue);
	x = (struct sg_gexec *)hGraphExec;
	for (i = 0; i < x->n && x->v[i].src != (const struct sg_gnode *)node; i++)
		;
	if (i == x->n || x->v[i].type != cudaGraphNodeTypeKernel)
		return sg_err(cudaErrorInvalidValue);
	e = sg_kernel_node_op(p, &op, &size);
	if (e != cudaSuccess)
		return sg_err(e);
	/* CUDA: "the function cannot change" (only its arguments and shape);
	 * the shim's count of this exec's kernels relies on it too */
	if (op->u.kern.k != x->v[i].op->u.kern.k) {
		free(op);
		return sg_err(cudaErrorInvalidValue);
	}
	free(x->v[i].op);
	x->v[i].op = op;
	x->v[i].size = size;
	return cudaSuccess;
}

/* ---------------------------------------------------------------- launch */

/* Nothing to upload to: the stream and the exec must be sound. */
static cudaError_t upload(cudaGraphExec_t e, cudaStream_t stream, int ptsz)
{
	sg_init();
	if (!e || !sg_hset_has(&execs, e))
		return sg_err(cudaErrorInvalidValue);
	if (!sg_stream_resolve(stream, ptsz))
		return sg_err(cudaErrorInvalidResourceHandle);
	return cudaSuccess;
}

SG_API cudaError_t cudaGraphUpload(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	return upload(graphExec, stream, 0);
}

SG_API cudaError_t cudaGraphUpload_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	return upload(graphExec, stream, 1);
}

cudaError_t sg_graph_exec_capture(cudaGraphExec_t e, struct sg_stream *s)
{
	struct sg_gexec *x = (struct sg_gexec *)e;
	cudaError_t r;
	size_t i;

	for (i = 0; i < x->n; i++) {
		struct sg_op *c;

		if (!x->v[i].op)
			continue;
		c = sg_op_copy(x->v[i].op, x->v[i].size);
		if (!c)
			return cudaErrorMemoryAllocation;
		r = sg_capture_add(s, c, x->v[i].size, x->v[i].type);
		if (r != cudaSuccess)
			return r;
	}
	return cudaSuccess;
}

void sg_graph_run_op(struct sg_stream *s, struct sg_op *op)
{
	switch (op->kind) {
	case SG_OP_RECORD:
		sg_event_enqueue_record(op->u.rec.ev, s);
		sg_op_free(op);
		break;
	case SG_OP_WAIT:
		sg_event_enqueue_wait(s, op->u.rec.ev);
		sg_op_free(op);
		break;
	case SG_OP_KERNEL:
		op->u.kern.seq = sg_launch_seq();
		atomic_fetch_add_explicit(&op->u.kern.k->launches, 1, memory_order_relaxed);
		sg_enqueue(s, op);
		break;
	default:
		sg_enqueue(s, op);
		break;
	}
}

static cudaError_t graph_launch(cudaGraphExec_t e, cudaStream_t stream, int ptsz)
{
	struct sg_gexec *x;
	struct sg_stream *s;
	struct sg_op **c;
	cudaError_t r;
	size_t i;
	int capturing;

	sg_init();
	if (sg_sticky() != cudaSuccess)
		return sg_err(sg_sticky());
	if (!e || !sg_hset_has(&execs, e))
		return sg_err(cudaErrorInvalidValue);
	x = (struct sg_gexec *)e;
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	r = sg_capture_gate(s, &capturing);
	if (r != cudaSuccess)
		return sg_err(r);
	if (capturing) {
		r = sg_graph_exec_capture(e, s);
		return r == cudaSuccess ? r : sg_err(r);
	}
	/* every clone first: a launch enqueues all of its nodes or none */
	c = calloc(x->n + 1, sizeof(*c));
	if (!c)
		return sg_err(cudaErrorMemoryAllocation);
	for (i = 0; i < x->n; i++) {
		if (x->v[i].op && !(c[i] = sg_op_copy(x->v[i].op, x->v[i].size))) {
			while (i--)
				free(c[i]);
			free(c);
			return sg_err(cudaErrorMemoryAllocation);
		}
	}
	for (i = 0; i < x->n; i++)
		if (c[i])
			sg_graph_run_op(s, c[i]);
	free(c);
	return cudaSuccess;
}

SG_API cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	return graph_launch(graphExec, stream, 0);
}

SG_API cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream)
{
	return graph_launch(graphExec, stream, 1);
}
