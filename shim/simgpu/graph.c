/*
 * graph.c - CUDA graphs: cudaGraph_t, its nodes and their dependencies
 * (graphexec.c: executable graphs and their launches).
 *
 * A node holds a template operation (graph.h): a kernel's argument values
 * are copied when the node is added, or when a capture records the launch,
 * because CUDA copies them then too.  A child-graph node holds its own
 * copy of the graph it was given, as in CUDA.
 *
 * CUDA does not make graph objects thread-safe; neither do we, beyond
 * rejecting handles that are not (or no longer) graphs or nodes.
 */
#include <stdlib.h>
#include <string.h>

#include "graph.h"

static struct sg_hset graphs = SG_HSET_INIT;
static struct sg_hset nodes = SG_HSET_INIT;

/* ---------------------------------------------------------------- templates */

/*
 * A copy of a template.  A kernel operation points into itself (argument
 * pointers at its values): every such pointer is moved along.
 */
struct sg_op *sg_op_copy(const struct sg_op *t, size_t size)
{
	struct sg_op *c = malloc(size);
	int i;

	if (!c)
		return NULL;
	memcpy(c, t, size);
	atomic_store_explicit(&c->next, NULL, memory_order_relaxed);
	c->deps = c->dep_buf;
	c->ndeps = 0;
	c->consumed = NULL;
	if (t->kind == SG_OP_KERNEL && t->u.kern.l.args) {
		void **ta = t->u.kern.l.args, **ca = (void **)((char *)c + ((char *)ta - (char *)t));

		for (i = 0; i < t->u.kern.k->params.n; i++)
			ca[i] = (char *)c + ((char *)ta[i] - (char *)t);
		c->u.kern.l.args = ca;
	}
	return c;
}

/* ---------------------------------------------------------------- graphs */

struct sg_graph *sg_graph_new(void)
{
	struct sg_graph *g = calloc(1, sizeof(*g));

	if (g && sg_hset_add(&graphs, g) < 0) {
		free(g);
		return NULL;
	}
	return g;
}

void sg_graph_free(struct sg_graph *g)
{
	size_t i;

	if (!g)
		return;
	sg_hset_del(&graphs, g);
	for (i = 0; i < g->n; i++) {
		struct sg_gnode *nd = g->nodes[i];

		sg_hset_del(&nodes, nd);
		free(nd->op);     /* templates own no deps and no snapshot */
		sg_graph_free(nd->child);
		free(nd->deps);
		free(nd);
	}
	free(g->nodes);
	free(g);
}

struct sg_graph *sg_graph_of(cudaGraph_t h)
{
	return h && sg_hset_has(&graphs, h) ? (struct sg_graph *)h : NULL;
}

struct sg_gnode *sg_gnode_of(cudaGraphNode_t h)
{
	return h && sg_hset_has(&nodes, h) ? (struct sg_gnode *)h : NULL;
}

/* Whether deps[] (n of them) are all nodes of g. */
static int deps_ok(struct sg_graph *g, const cudaGraphNode_t *deps, size_t n)
{
	size_t i;

	if (n && !deps)
		return 0;
	for (i = 0; i < n; i++) {
		struct sg_gnode *d = sg_gnode_of(deps[i]);

		if (!d || d->g != g)
			return 0;
	}
	return 1;
}

cudaError_t sg_graph_add(struct sg_graph *g, int type, struct sg_op *op, size_t size,
			 struct sg_gnode *const *deps, size_t ndeps, struct sg_gnode **out)
{
	struct sg_gnode *nd;
	size_t i, j;

	if (g->n == g->cap) {
		size_t cap = g->cap ? g->cap * 2 : 16;
		struct sg_gnode **v = realloc(g->nodes, cap * sizeof(*v));

		if (!v)
			return cudaErrorMemoryAllocation;
		g->nodes = v;
		g->cap = cap;
	}
	nd = calloc(1, sizeof(*nd));
	if (!nd)
		return cudaErrorMemoryAllocation;
	if (ndeps) {
		nd->deps = malloc(ndeps * sizeof(*nd->deps));
		if (!nd->deps) {
			free(nd);
			return cudaErrorMemoryAllocation;
		}
	}
	for (i = 0; i < ndeps; i++) {       /* an edge twice is one edge */
		for (j = 0; j < nd->ndeps && nd->deps[j] != deps[i]; j++)
			;
		if (j == nd->ndeps)
			nd->deps[nd->ndeps++] = deps[i];
	}
	if (sg_hset_add(&nodes, nd) < 0) {
		free(nd->deps);
		free(nd);
		return cudaErrorMemoryAllocation;
	}
	nd->g = g;
	nd->type = type;
	nd->op = op;
	nd->size = size;
	nd->idx = g->n;
	g->nodes[g->n++] = nd;
	if (out)
		*out = nd;
	return cudaSuccess;
}

/* Is a among b and its ancestors?  Iterative: captured chains are long. */
int sg_gnode_reaches(const struct sg_gnode *a, const struct sg_gnode *b)
{
	struct sg_graph *g = b->g;
	struct sg_gnode **stack;
	size_t top = 0, i;
	unsigned m;
	int found = 0;

	if (a == b)
		return 1;
	if (a->g != g)
		return 0;
	stack = malloc((g->n + 1) * sizeof(*stack));
	if (!stack)
		return 1;      /* cannot tell: say yes, the caller's safe answer */
	m = ++g->walk;
	stack[top++] = (struct sg_gnode *)b;
	((struct sg_gnode *)b)->mark = m;
	while (top && !found) {
		struct sg_gnode *x = stack[--top];

		for (i = 0; i < x->ndeps; i++) {
			struct sg_gnode *d = x->deps[i];

			if (d == a) {
				found = 1;
				break;
			}
			if (d->mark != m) {
				d->mark = m;
				stack[top++] = d;
			}
		}
	}
	free(stack);
	return found;
}

SG_API cudaError_t cudaGraphCreate(cudaGraph_t *pGraph, unsigned int flags)
{
	struct sg_graph *g;

	sg_init();
	if (!pGraph || flags)
		return sg_err(cudaErrorInvalidValue);
	g = sg_graph_new();
	if (!g)
		return sg_err(cudaErrorMemoryAllocation);
	*pGraph = (cudaGraph_t)g;
	return cudaSuccess;
}

SG_API cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
	struct sg_graph *g;

	sg_init();
	g = sg_graph_of(graph);
	if (!g)
		return sg_err(cudaErrorInvalidValue);
	sg_graph_free(g);
	return cudaSuccess;
}

/*
 * A deep copy: templates, child graphs, and the edges between the copies
 * (CUDA copies a graph into a child-graph node, and for cudaGraphClone).
 */
static struct sg_graph *graph_clone(const struct sg_graph *src)
{
	struct sg_graph *g = sg_graph_new();
	size_t i, j;

	if (!g)
		return NULL;
	for (i = 0; i < src->n; i++) {
		const struct sg_gnode *a = src->nodes[i];
		struct sg_gnode *deps[16], **dv = deps, *nd;
		struct sg_op *op = NULL;
		cudaError_t e;

		if (a->ndeps > 16 && !(dv = malloc(a->ndeps * sizeof(*dv))))
			goto fail;
		for (j = 0; j < a->ndeps; j++)
			dv[j] = g->nodes[a->deps[j]->idx];
		if (a->op && !(op = sg_op_copy(a->op, a->size))) {
			if (dv != deps)
				free(dv);
			goto fail;
		}
		e = sg_graph_add(g, a->type, op, a->size, dv, a->ndeps, &nd);
		if (dv != deps)
			free(dv);
		if (e != cudaSuccess) {
			free(op);
			goto fail;
		}
		if (a->child && !(nd->child = graph_clone(a->child)))
			goto fail;
	}
	return g;
fail:
	sg_graph_free(g);
	return NULL;
}

SG_API cudaError_t cudaGraphClone(cudaGraph_t *pGraphClone, cudaGraph_t originalGraph)
{
	struct sg_graph *g, *c;

	sg_init();
	g = sg_graph_of(originalGraph);
	if (!pGraphClone || !g)
		return sg_err(cudaErrorInvalidValue);
	c = graph_clone(g);
	if (!c)
		return sg_err(cudaErrorMemoryAllocation);
	*pGraphClone = (cudaGraph_t)c;
	return cudaSuccess;
}

/* ---------------------------------------------------------------- nodes */

static cudaError_t add_node(cudaGraphNode_t *pNode, cudaGraph_t graph,
			    const cudaGraphNode_t *deps, size_t ndeps, int type, struct sg_op *op,
			    size_t size)
{
	struct sg_graph *g = sg_graph_of(graph);
	struct sg_gnode *nd;
	cudaError_t e;

	if (!pNode || !g || !deps_ok(g, deps, ndeps)) {
		sg_op_free(op);
		return sg_err(cudaErrorInvalidValue);
	}
	e = sg_graph_add(g, type, op, size, (struct sg_gnode *const *)deps, ndeps, &nd);
	if (e != cudaSuccess) {
		sg_op_free(op);
		return sg_err(e);
	}
	*pNode = (cudaGraphNode_t)nd;
	return cudaSuccess;
}

/* The driver's "extra" launch format: one buffer holding every argument. */
static cudaError_t args_of_extra(struct sg_kernel *k, void **extra, void ***out)
{
	void *buf = NULL, **args;
	size_t size = 0;
	int i;

	for (i = 0; extra[i] != (void *)0x00; i += 2) {
		if (extra[i] == (void *)0x01)          /* CU_LAUNCH_PARAM_BUFFER_POINTER */
			buf = extra[i + 1];
		else if (extra[i] == (void *)0x02)     /* CU_LAUNCH_PARAM_BUFFER_SIZE */
			size = *(size_t *)extra[i + 1];
		else
			return cudaErrorInvalidValue;
	}
	if (!buf || size < k->params.total)
		return cudaErrorInvalidValue;
	args = malloc(((size_t)k->params.n + 1) * sizeof(*args));
	if (!args)
		return cudaErrorMemoryAllocation;
	for (i = 0; i < k->params.n; i++)
		args[i] = (char *)buf + k->params.off[i];
	*out = args;
	return cudaSuccess;
}

SG_API cudaError_t cudaGraphAddKernelNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
					  const cudaGraphNode_t *pDependencies,
					  size_t numDependencies,
					  const struct cudaKernelNodeParams *p)
{
	struct sg_op *op;
	size_t size;
	cudaError_t e;

	sg_init();
	e = sg_kernel_node_op(p, &op, &size);
	if (e != cudaSuccess)
		return sg_err(e);
	return add_node(pGraphNode, graph, pDependencies, numDependencies,
			cudaGraphNodeTypeKernel, op, size);
}

SG_API cudaError_t cudaGraphKernelNodeGetParams(cudaGraphNode_t node,
						struct cudaKernelNodeParams *p)
{
	struct sg_gnode *nd;
	struct sg_kernel *k;
	const simgpu_launch *l;

	sg_init();
	nd = sg_gnode_of(node);
	if (!nd || !p || nd->type != cudaGraphNodeTypeKernel)
		return sg_err(cudaErrorInvalidValue);
	k = nd->op->u.kern.k;
	l = &nd->op->u.kern.l;
	memset(p, 0, sizeof(*p));
	/* the host stub, as a real runtime answers for registered kernels */
	p->func = k->stub ? (void *)k->stub : (void *)k;
	p->gridDim = (dim3){ l->grid.x, l->grid.y, l->grid.z };
	p->blockDim = (dim3){ l->block.x, l->block.y, l->block.z };
	p->sharedMemBytes = (unsigned)l->shmem;
	p->kernelParams = l->args;     /* the node's own copies, as in CUDA */
	p->extra = NULL;
	return cudaSuccess;
}

/* A kernel operation for node parameters, the "extra" format included. */
cudaError_t sg_kernel_node_op(const struct cudaKernelNodeParams *p, struct sg_op **op,
			      size_t *size)
{
	struct sg_kernel *k;
	void **args, **owned = NULL;
	cudaError_t e;

	if (!p)
		return cudaErrorInvalidValue;
	k = sg_kernel_by_handle(p->func);
	if (!k)
		return cudaErrorInvalidDeviceFunction;
	if (!atomic_load_explicit(&k->resolved, memory_order_acquire))
		sg_kernel_resolve(k);
	args = p->kernelParams;
	if (!args && p->extra && k->params.n >= 0) {
		e = args_of_extra(k, p->extra, &owned);
		if (e != cudaSuccess)
			return e;
		args = owned;
	}
	e = sg_kernel_op_new(k, p->gridDim, p->blockDim, args, p->sharedMemBytes, op, size);
	free(owned);
	return e;
}

SG_API cudaError_t cudaGraphKernelNodeSetParams(cudaGraphNode_t node,
						const struct cudaKernelNodeParams *p)
{
	struct sg_gnode *nd;
	struct sg_op *op;
	size_t size;
	cudaError_t e;

	sg_init();
	nd = sg_gnode_of(node);
	if (!nd || nd->type != cudaGraphNodeTypeKernel)
		return sg_err(cudaErrorInvalidValue);
	e = sg_kernel_node_op(p, &op, &size);
	if (e != cudaSuccess)
		return sg_err(e);
	free(nd->op);
	nd->op = op;
	nd->size = size;
	return cudaSuccess;
}

SG_API cudaError_t cudaGraphAddMemcpyNode1D(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
					    const cudaGraphNode_t *pDependencies,
					    size_t numDependencies, void *dst, const void *src,
					    size_t count, enum cudaMemcpyKind kind)
{
	struct sg_op *op = NULL;
	cudaError_t e;

	sg_init();
	e = sg_copy_op_new(dst, src, count, kind, &op);
	if (e != cudaSuccess)
		return sg_err(e);
	return add_node(pGraphNode, graph, pDependencies, numDependencies,
			op ? cudaGraphNodeTypeMemcpy : cudaGraphNodeTypeEmpty, op,
			op ? sizeof(*op) : 0);
}

/* The 3D form: only what is a 1D copy (no arrays, one row, no offsets). */
SG_API cudaError_t cudaGraphAddMemcpyNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
					  const cudaGraphNode_t *pDependencies,
					  size_t numDependencies,
					  const struct cudaMemcpy3DParms *p)
{
	sg_init();
	if (!p)
		return sg_err(cudaErrorInvalidValue);
	if (p->srcArray || p->dstArray || p->extent.height > 1 || p->extent.depth > 1 ||
	    p->srcPos.x || p->srcPos.y || p->srcPos.z || p->dstPos.x || p->dstPos.y ||
	    p->dstPos.z)
		return sg_err(cudaErrorNotSupported);
	return cudaGraphAddMemcpyNode1D(pGraphNode, graph, pDependencies, numDependencies,
					p->dstPtr.ptr, p->srcPtr.ptr, p->extent.width, p->kind);
}

/* Byte memsets only, and 2- or 4-byte values whose bytes are all equal;
 * rows must be contiguous. */
SG_API cudaError_t cudaGraphAddMemsetNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
					  const cudaGraphNode_t *pDependencies,
					  size_t numDependencies, const struct cudaMemsetParams *p)
{
	struct sg_op *op = NULL;
	unsigned es, b, i;
	size_t h, n;
	cudaError_t e;

	sg_init();
	if (!p || (p->elementSize != 1 && p->elementSize != 2 && p->elementSize != 4) ||
	    !p->width)
		return sg_err(cudaErrorInvalidValue);
	es = p->elementSize;
	h = p->height ? p->height : 1;
	if (h > 1 && p->pitch != p->width * es)
		return sg_err(cudaErrorNotSupported);
	b = p->value & 0xff;
	for (i = 1; i < es; i++)
		if (((p->value >> (8 * i)) & 0xff) != b)
			return sg_err(cudaErrorNotSupported);
	if (es < 4 && (p->value >> (8 * es)))
		return sg_err(cudaErrorInvalidValue);
	n = p->width * es * h;
	e = sg_set_op_new(p->dst, (int)b, n, &op);
	if (e != cudaSuccess)
		return sg_err(e);
	return add_node(pGraphNode, graph, pDependencies, numDependencies,
			cudaGraphNodeTypeMemset, op, sizeof(*op));
}

SG_API cudaError_t cudaGraphAddEmptyNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
					 const cudaGraphNode_t *pDependencies,
					 size_t numDependencies)
{
	sg_init();
	return add_node(pGraphNode, graph, pDependencies, numDependencies,
			cudaGraphNodeTypeEmpty, NULL, 0);
}

SG_API cudaError_t cudaGraphAddHostNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
					const cudaGraphNode_t *pDependencies,
					size_t numDependencies, const struct cudaHostNodeParams *p)
{
	struct sg_op *op;

	sg_init();
	if (!p || !p->fn)
		return sg_err(cudaErrorInvalidValue);
	op = sg_op_new(SG_OP_HOST, 0);
	if (!op)
		return sg_err(cudaErrorMemoryAllocation);
	op->u.host.fn = p->fn;
	op->u.host.data = p->userData;
	return add_node(pGraphNode, graph, pDependencies, numDependencies, cudaGraphNodeTypeHost,
			op, sizeof(*op));
}

static cudaError_t add_event_node(cudaGraphNode_t *pNode, cudaGraph_t graph,
				  const cudaGraphNode_t *deps, size_t ndeps, cudaEvent_t event,
				  int kind, int type)
{
	struct sg_event *ev;
	struct sg_op *op;

	sg_init();
	ev = sg_event_lookup(event);
	if (!ev)
		return sg_err(cudaErrorInvalidValue);
	op = sg_op_new(kind, 0);
	if (!op)
		return sg_err(cudaErrorMemoryAllocation);
	op->u.rec.ev = ev;
	return add_node(pNode, graph, deps, ndeps, type, op, sizeof(*op));
}

SG_API cudaError_t cudaGraphAddEventRecordNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
					       const cudaGraphNode_t *pDependencies,
					       size_t numDependencies, cudaEvent_t event)
{
	return add_event_node(pGraphNode, graph, pDependencies, numDependencies, event,
			      SG_OP_RECORD, cudaGraphNodeTypeEventRecord);
}

SG_API cudaError_t cudaGraphAddEventWaitNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
					     const cudaGraphNode_t *pDependencies,
					     size_t numDependencies, cudaEvent_t event)
{
	return add_event_node(pGraphNode, graph, pDependencies, numDependencies, event,
			      SG_OP_WAIT, cudaGraphNodeTypeWaitEvent);
}

SG_API cudaError_t cudaGraphAddDependencies(cudaGraph_t graph, const cudaGraphNode_t *from,
					    const cudaGraphNode_t *to,
					    const cudaGraphEdgeData *edgeData,
					    size_t numDependencies)
{
	struct sg_graph *g;
	size_t i, j;

	sg_init();
	g = sg_graph_of(graph);
	if (!g || !deps_ok(g, from, numDependencies) || !deps_ok(g, to, numDependencies))
		return sg_err(cudaErrorInvalidValue);
	for (i = 0; edgeData && i < numDependencies; i++)     /* default edges only */
		if (edgeData[i].type != cudaGraphDependencyTypeDefault || edgeData[i].from_port ||
		    edgeData[i].to_port)
			return sg_err(cudaErrorNotSupported);
	for (i = 0; i < numDependencies; i++) {
		struct sg_gnode *f = (struct sg_gnode *)from[i], *t = (struct sg_gnode *)to[i];
		struct sg_gnode **v;

		if (f == t || sg_gnode_reaches(t, f))
			return sg_err(cudaErrorInvalidValue);   /* a cycle */
		for (j = 0; j < t->ndeps && t->deps[j] != f; j++)
			;
		if (j < t->ndeps)
			continue;
		v = realloc(t->deps, (t->ndeps + 1) * sizeof(*v));
		if (!v)
			return sg_err(cudaErrorMemoryAllocation);
		v[t->ndeps++] = f;
		t->deps = v;
	}
	return cudaSuccess;
}

/* CUDA's array-out convention: count with NULL; else fill, NULL-pad, and
 * say how many were real. */
static void list_out(struct sg_gnode **v, size_t n, cudaGraphNode_t *out, size_t *num)
{
	size_t i;

	if (out) {
		for (i = 0; i < *num; i++)
			out[i] = i < n ? (cudaGraphNode_t)v[i] : NULL;
		if (n > *num)
			n = *num;
	}
	*num = n;
}

SG_API cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *out, size_t *numNodes)
{
	struct sg_graph *g;

	sg_init();
	g = sg_graph_of(graph);
	if (!g || !numNodes)
		return sg_err(cudaErrorInvalidValue);
	list_out(g->nodes, g->n, out, numNodes);
	return cudaSuccess;
}

SG_API cudaError_t cudaGraphGetRootNodes(cudaGraph_t graph, cudaGraphNode_t *out,
					 size_t *numRoots)
{
	struct sg_graph *g;
	struct sg_gnode **roots;
	size_t i, n = 0;

	sg_init();
	g = sg_graph_of(graph);
	if (!g || !numRoots)
		return sg_err(cudaErrorInvalidValue);
	roots = malloc((g->n + 1) * sizeof(*roots));
	if (!roots)
		return sg_err(cudaErrorMemoryAllocation);
	for (i = 0; i < g->n; i++)
		if (!g->nodes[i]->ndeps)
			roots[n++] = g->nodes[i];
	list_out(roots, n, out, numRoots);
	free(roots);
	return cudaSuccess;
}

SG_API cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node, enum cudaGraphNodeType *pType)
{
	struct sg_gnode *nd;

	sg_init();
	nd = sg_gnode_of(node);
	if (!nd || !pType)
		return sg_err(cudaErrorInvalidValue);
	*pType = (enum cudaGraphNodeType)nd->type;
	return cudaSuccess;
}

/* A copy node as one row of bytes; the kind says the direction it has. */
SG_API cudaError_t cudaGraphMemcpyNodeGetParams(cudaGraphNode_t node,
						struct cudaMemcpy3DParms *p)
{
	static const enum cudaMemcpyKind kinds[] = {
		[SG_H2H] = cudaMemcpyHostToHost, [SG_H2D] = cudaMemcpyHostToDevice,
		[SG_D2H] = cudaMemcpyDeviceToHost, [SG_D2D] = cudaMemcpyDeviceToDevice,
	};
	struct sg_gnode *nd;
	size_t n;

	sg_init();
	nd = sg_gnode_of(node);
	if (!nd || !p || nd->type != cudaGraphNodeTypeMemcpy)
		return sg_err(cudaErrorInvalidValue);
	n = nd->op->u.copy.n;
	memset(p, 0, sizeof(*p));
	p->srcPtr.ptr = (void *)nd->op->u.copy.src;
	p->srcPtr.pitch = p->srcPtr.xsize = n;
	p->srcPtr.ysize = 1;
	p->dstPtr.ptr = nd->op->u.copy.dst;
	p->dstPtr.pitch = p->dstPtr.xsize = n;
	p->dstPtr.ysize = 1;
	p->extent.width = n;
	p->extent.height = p->extent.depth = 1;
	p->kind = kinds[nd->op->u.copy.dir];
	return cudaSuccess;
}

SG_API cudaError_t cudaGraphMemsetNodeGetParams(cudaGraphNode_t node, struct cudaMemsetParams *p)
{
	struct sg_gnode *nd;

	sg_init();
	nd = sg_gnode_of(node);
	if (!nd || !p || nd->type != cudaGraphNodeTypeMemset)
		return sg_err(cudaErrorInvalidValue);
	memset(p, 0, sizeof(*p));
	p->dst = nd->op->u.set.dst;
	p->value = (unsigned)nd->op->u.set.val & 0xff;
	p->elementSize = 1;
	p->width = nd->op->u.set.n;
	p->height = 1;
	p->pitch = nd->op->u.set.n;
	return cudaSuccess;
}

/* The node's copy of the graph it was given: a launch runs it in place. */
SG_API cudaError_t cudaGraphAddChildGraphNode(cudaGraphNode_t *pGraphNode, cudaGraph_t graph,
					      const cudaGraphNode_t *pDependencies,
					      size_t numDependencies, cudaGraph_t childGraph)
{
	struct sg_graph *child;
	cudaError_t e;

	sg_init();
	child = sg_graph_of(childGraph);
	if (!child || childGraph == graph)
		return sg_err(cudaErrorInvalidValue);
	child = graph_clone(child);
	if (!child)
		return sg_err(cudaErrorMemoryAllocation);
	e = add_node(pGraphNode, graph, pDependencies, numDependencies, cudaGraphNodeTypeGraph,
		     NULL, 0);
	if (e != cudaSuccess) {
		sg_graph_free(child);
		return e;
	}
	((struct sg_gnode *)*pGraphNode)->child = child;
	return cudaSuccess;
}

/* The child's graph itself, as CUDA hands it out (not to be changed). */
SG_API cudaError_t cudaGraphChildGraphNodeGetGraph(cudaGraphNode_t node, cudaGraph_t *pGraph)
{
	struct sg_gnode *nd;

	sg_init();
	nd = sg_gnode_of(node);
	if (!nd || !pGraph || nd->type != cudaGraphNodeTypeGraph)
		return sg_err(cudaErrorInvalidValue);
	*pGraph = (cudaGraph_t)nd->child;
	return cudaSuccess;
}
