/*
 * shim_graph.c - the kernels of each executable graph, counted at its
 * launches, and stream capture, which runs nothing (shim_graph.h).
 *
 * The walk uses only calls a real libcudart has too (cudaGraphGetNodes,
 * cudaGraphNodeGetType, cudaGraphKernelNodeGetParams,
 * cudaGraphChildGraphNodeGetGraph, cudaGraphMemcpyNodeGetParams), so it
 * works on a GPU and on simgpu.  Copy nodes add their bytes to the
 * process's h2d / d2h / d2d counters at each launch, as copies do.
 * Kernel node functions are host stubs or cudaKernel_t handles: both are
 * keys of the kernel table (shim_kernel_find), and one never registered is
 * learnt by name (shim_kernel_learn).
 *
 * The table (exec -> kernels) is small and touched at instantiation,
 * destruction and graph launch only, so one mutex guards it; a graph launch
 * costs a lookup and one counter add per distinct kernel, not per node.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "shim.h"
#include "shim_graph.h"

__typeof__(cudaStreamIsCapturing) cudaStreamIsCapturing_ptsz;

#define BUCKETS    64
#define MAX_DEPTH  8        /* child graphs within child graphs */

struct gk {
	struct shim_kernel *k;  /* NULL: the kernel table is full */
	uint64_t            n;  /* its nodes in the graph          */
};

struct gexec {
	const void   *exec;
	struct gexec *next;
	uint64_t      h2d, d2h, d2d;   /* bytes its copy nodes move    */
	size_t        n;
	struct gk     v[];
};

int shim_graph_captures;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct gexec *table[BUCKETS];
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static int warned;

static unsigned bucket(const void *p)
{
	uintptr_t a = (uintptr_t)p;

	return (unsigned)((a >> 4) ^ (a >> 12)) % BUCKETS;
}

/* a forked child: the parent's graphs are not ours to launch */
static void after_fork(void)
{
	pthread_mutex_init(&mu, NULL);
}

static void fork_setup(void)
{
	pthread_atfork(NULL, NULL, after_fork);
}

static void warn_once(const char *what, void *g)
{
	if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
		shim_log("cannot list the kernels of graph %p (%s): each launch of such a graph "
			 "counts as one launch", g, what);
}

/* ---------------------------------------------------------------- capture */

int shim_graph_capturing_slow(void *stream, int ptsz)
{
	static __typeof__(&cudaStreamIsCapturing) is_cap, is_cap_ptsz;
	__typeof__(&cudaStreamIsCapturing) fn;
	enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
	cudaError_t r;

	if (!is_cap)
		is_cap = (__typeof__(is_cap))shim_real_rt("cudaStreamIsCapturing");
	if (ptsz && !is_cap_ptsz)
		is_cap_ptsz = (__typeof__(is_cap))shim_real_rt("cudaStreamIsCapturing_ptsz");
	fn = ptsz && is_cap_ptsz ? is_cap_ptsz : is_cap;
	if (!fn)
		return 0;
	shim_in_runtime++;
	r = fn((cudaStream_t)stream, &st);
	shim_in_runtime--;
	/* an error (cudaErrorStreamCaptureImplicit): the work fails too */
	return r != cudaSuccess || st != cudaStreamCaptureStatusNone;
}

void shim_graph_capture_begun(void)
{
	__atomic_fetch_add(&shim_graph_captures, 1, __ATOMIC_RELAXED);
}

void shim_graph_capture_end(void *stream, int ptsz, int was_capturing)
{
	int n;

	if (!was_capturing || shim_graph_capturing_slow(stream, ptsz))
		return;
	n = __atomic_load_n(&shim_graph_captures, __ATOMIC_RELAXED);
	while (n > 0 && !__atomic_compare_exchange_n(&shim_graph_captures, &n, n - 1, 0,
						     __ATOMIC_RELAXED, __ATOMIC_RELAXED))
		;
}

/* ---------------------------------------------------------------- the walk */

struct walk {
	__typeof__(&cudaGraphGetNodes) get_nodes;
	__typeof__(&cudaGraphNodeGetType) get_type;
	__typeof__(&cudaGraphKernelNodeGetParams) get_kparams;
	__typeof__(&cudaGraphChildGraphNodeGetGraph) get_child;   /* may be NULL */
	__typeof__(&cudaGraphMemcpyNodeGetParams) get_cparams;    /* may be NULL */
	__typeof__(&cudaPointerGetAttributes) get_attr;           /* may be NULL */
	struct gk *v;
	size_t     n, cap;
	uint64_t   h2d, d2h, d2d;
	const char *why;
};

static int add_kernel(struct walk *w, const void *func)
{
	struct shim_kernel *k = shim_kernel_find(func);
	size_t i;

	if (!k)
		k = shim_kernel_learn(func);
	for (i = 0; i < w->n; i++)
		if (w->v[i].k == k) {
			w->v[i].n++;
			return 0;
		}
	if (w->n == w->cap) {
		size_t cap = w->cap ? w->cap * 2 : 8;
		struct gk *v = realloc(w->v, cap * sizeof(*v));

		if (!v) {
			w->why = "out of memory";
			return -1;
		}
		w->v = v;
		w->cap = cap;
	}
	w->v[w->n].k = k;
	w->v[w->n].n = 1;
	w->n++;
	return 0;
}

static int is_dev(struct walk *w, const void *p)
{
	struct cudaPointerAttributes a;

	if (!w->get_attr || !p || w->get_attr(&a, p) != cudaSuccess)
		return 0;
	return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

/* The bytes of a copy node, by direction.  Best effort: a copy the runtime
 * will not describe is left uncounted, its kernels still are. */
static void add_copy(struct walk *w, cudaGraphNode_t node)
{
	struct cudaMemcpy3DParms p;
	enum cudaMemcpyKind k;
	uint64_t n;

	memset(&p, 0, sizeof(p));
	if (!w->get_cparams || w->get_cparams(node, &p) != cudaSuccess)
		return;
	n = (uint64_t)p.extent.width * (p.extent.height ? p.extent.height : 1) *
	    (p.extent.depth ? p.extent.depth : 1);
	k = p.kind;
	if (k == cudaMemcpyDefault) {
		int d = p.dstArray || is_dev(w, p.dstPtr.ptr), s = p.srcArray || is_dev(w, p.srcPtr.ptr);

		k = d ? (s ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
		      : (s ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
	}
	if (k == cudaMemcpyHostToDevice)
		w->h2d += n;
	else if (k == cudaMemcpyDeviceToHost)
		w->d2h += n;
	else if (k == cudaMemcpyDeviceToDevice)
		w->d2d += n;
}

static int walk_graph(struct walk *w, cudaGraph_t g, int depth)
{
	cudaGraphNode_t *nodes;
	size_t n = 0, i;
	int r = 0;

	if (depth > MAX_DEPTH) {
		w->why = "child graphs nested too deep";
		return -1;
	}
	if (w->get_nodes(g, NULL, &n) != cudaSuccess) {
		w->why = "cudaGraphGetNodes failed";
		return -1;
	}
	if (!n)
		return 0;
	nodes = malloc(n * sizeof(*nodes));
	if (!nodes) {
		w->why = "out of memory";
		return -1;
	}
	if (w->get_nodes(g, nodes, &n) != cudaSuccess) {
		w->why = "cudaGraphGetNodes failed";
		r = -1;
	}
	for (i = 0; r == 0 && i < n; i++) {
		enum cudaGraphNodeType t;
		struct cudaKernelNodeParams p;
		cudaGraph_t child;

		if (w->get_type(nodes[i], &t) != cudaSuccess) {
			w->why = "cudaGraphNodeGetType failed";
			r = -1;
			break;
		}
		switch (t) {
		case cudaGraphNodeTypeKernel:
			memset(&p, 0, sizeof(p));
			if (w->get_kparams(nodes[i], &p) != cudaSuccess || !p.func) {
				w->why = "cudaGraphKernelNodeGetParams failed";
				r = -1;
			} else {
				r = add_kernel(w, p.func);
			}
			break;
		case cudaGraphNodeTypeGraph:
			if (!w->get_child || w->get_child(nodes[i], &child) != cudaSuccess) {
				w->why = "cudaGraphChildGraphNodeGetGraph failed";
				r = -1;
			} else {
				r = walk_graph(w, child, depth + 1);
			}
			break;
		case cudaGraphNodeTypeMemcpy:
			add_copy(w, nodes[i]);
			break;
		case cudaGraphNodeTypeConditional:
			/* its body runs a data-dependent number of times */
			w->why = "a conditional node";
			r = -1;
			break;
		default:
			break;          /* memsets, events, host code */
		}
	}
	free(nodes);
	return r;
}

static struct gexec *table_take(const void *exec)
{
	struct gexec **pp, *x;

	for (pp = &table[bucket(exec)]; (x = *pp); pp = &x->next)
		if (x->exec == exec) {
			*pp = x->next;
			return x;
		}
	return NULL;
}

void shim_graph_note(void *exec, void *graph)
{
	struct walk w;
	struct gexec *x, *old;
	int r;

	if (!exec || !graph)
		return;
	pthread_once(&fork_once, fork_setup);
	memset(&w, 0, sizeof(w));
	w.get_nodes = (__typeof__(w.get_nodes))shim_real_rt("cudaGraphGetNodes");
	w.get_type = (__typeof__(w.get_type))shim_real_rt("cudaGraphNodeGetType");
	w.get_kparams = (__typeof__(w.get_kparams))shim_real_rt("cudaGraphKernelNodeGetParams");
	w.get_child = (__typeof__(w.get_child))shim_real_rt("cudaGraphChildGraphNodeGetGraph");
	w.get_cparams = (__typeof__(w.get_cparams))shim_real_rt("cudaGraphMemcpyNodeGetParams");
	w.get_attr = (__typeof__(w.get_attr))shim_real_rt("cudaPointerGetAttributes");
	if (!w.get_nodes || !w.get_type || !w.get_kparams) {
		w.why = "the runtime lacks the graph query calls";
		r = -1;
	} else {
		shim_in_runtime++;
		r = walk_graph(&w, (cudaGraph_t)graph, 0);
		shim_in_runtime--;
	}
	x = r == 0 ? malloc(sizeof(*x) + w.n * sizeof(x->v[0])) : NULL;
	if (r == 0 && !x)
		w.why = "out of memory";
	if (x) {
		x->exec = exec;
		x->h2d = w.h2d;
		x->d2h = w.d2h;
		x->d2d = w.d2d;
		x->n = w.n;
		if (w.n)
			memcpy(x->v, w.v, w.n * sizeof(x->v[0]));
	}
	free(w.v);
	if (!x)
		warn_once(w.why ? w.why : "unknown", graph);
	/* an update replaces what an exec runs; a failed walk forgets it */
	pthread_mutex_lock(&mu);
	old = table_take(exec);
	if (x) {
		x->next = table[bucket(exec)];
		table[bucket(exec)] = x;
	}
	pthread_mutex_unlock(&mu);
	free(old);
}

void shim_graph_forget(void *exec)
{
	struct gexec *x;

	if (!exec)
		return;
	pthread_mutex_lock(&mu);
	x = table_take(exec);
	pthread_mutex_unlock(&mu);
	free(x);
}

void shim_graph_count(const void *exec)
{
	struct gexec *x;
	size_t i;

	if (shim_in_runtime)
		return;
	pthread_mutex_lock(&mu);
	for (x = table[bucket(exec)]; x && x->exec != exec; x = x->next)
		;
	if (x) {
		for (i = 0; i < x->n; i++)
			shim_count_kernel(x->v[i].k, x->v[i].n);
		if (x->h2d)
			shim_add(&shim_ctr->h2d_bytes, x->h2d);
		if (x->d2h)
			shim_add(&shim_ctr->d2h_bytes, x->d2h);
		if (x->d2d)
			shim_add(&shim_ctl->d2d_bytes, x->d2d);
	}
	pthread_mutex_unlock(&mu);
	/* not walked: one launch of no known kernel.  Not shim_count_launch:
	 * learning a name would ask cudaFuncGetName about a graph, which
	 * fails and leaves that error as the app's last error */
	if (!x)
		shim_count_kernel(NULL, 1);
}
