/*
 * shim_task.c - tasks: what the predictors learn about (see shim_task.h).
 *
 * Every kernel launch is a task of its own, unless a library task is open
 * on the launching thread: the kernel then belongs to that task.  A library
 * task is one call of a cuDNN/cuBLAS entry point, opened and closed by the
 * library hooks on their own thread; calls do not nest.
 *
 * Counting stays off the launch path: library tasks and the kernels they
 * own are counted here, and kernel tasks are the process's launches minus
 * the kernels libraries own.  With tracing or the controller's task
 * feedback on, each task also becomes a record (shim_trace.c) bracketed by
 * two events on its stream.
 */
#define _GNU_SOURCE
#include "shim_graph.h"
#include "shim_trace.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Set while this thread has a library task open: the launch hooks' hot
 * check reads it (initial-exec: one %fs-relative load, no call). */
__thread int shim_task_lib_open __attribute__((tls_model("initial-exec")));

/* The library task open on this thread.  Default TLS model: only the
 * library path and hot launches touch it. */
struct lib_task {
	uint64_t token;          /* 0: none open */
	int traced;
	void *stream;
	uint32_t nkernels;
	struct shim_trace_rec rec;
};
static __thread struct lib_task cur;
/* Tokens are only compared on the thread that made them. */
static __thread uint64_t next_token;

/* Written by every library call on any thread: on a line of their own, so
 * that neither the launch path's flags nor anything else shares it. */
static struct {
	uint64_t tasks, kernels;
} __attribute__((aligned(64))) lib_ctr;   /* aligned(64): sized 64 too */

enum { DRV_NONE, DRV_LIB, DRV_TRACED };

/* ---- common fields ---------------------------------------------------- */
uint32_t shim_task_quota(void)
{
	static int mps = -1;
	struct cb_control *c = __atomic_load_n(&shim_ctl, __ATOMIC_ACQUIRE);
	uint32_t q;

	if (__atomic_load_n(&c->state, __ATOMIC_RELAXED) == CB_SLOT_LIVE) {
		q = __atomic_load_n(&c->quota_pct, __ATOMIC_RELAXED);
		if (q >= 1 && q <= 100)
			return q;
	}
	if (mps < 0) {
		/* read once, as MPS reads it once at context creation */
		const char *e = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
		int v = e && *e ? atoi(e) : 0;

		mps = v >= 1 && v <= 100 ? v : 100;
	}
	return (uint32_t)mps;
}

static char app_name[256];
static pthread_once_t app_once = PTHREAD_ONCE_INIT;

static void find_app_name(void)
{
	const char *n = getenv("COLOCATE_APP_NAME");
	char exe[PATH_MAX];
	ssize_t len;

	if (!n || !*n) {
		len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
		exe[len > 0 ? len : 0] = 0;
		n = strrchr(exe, '/') ? strrchr(exe, '/') + 1 : "app";
	}
	snprintf(app_name, sizeof(app_name), "%s", n);
}

const char *shim_app_name(void)
{
	pthread_once(&app_once, find_app_name);
	return app_name;
}

static void fill_common(struct shim_trace_rec *r, int kind, void *stream)
{
	struct cb_control *c = __atomic_load_n(&shim_ctl, __ATOMIC_ACQUIRE);

	memset(r, 0, offsetof(struct shim_trace_rec, params));
	r->kind = kind;
	r->stream = stream;
	r->quota = shim_task_quota();
	r->route = __atomic_load_n(&c->route, __ATOMIC_RELAXED);
	/* a hold given up runs locally; on an SM partition the kernel runs in
	 * this process, timed by events on its stream (shim_part.c orders
	 * them around it) */
	if (r->route == CB_ROUTE_HOLD || CB_ROUTE_IS_PART(r->route))
		r->route = 0;
	r->has_query = shim_query_current(&r->query);
	r->host_ns = shim_now_ns();
}

static void set_dims(struct shim_trace_rec *r, const uint32_t g[3], const uint32_t b[3], uint64_t shmem)
{
	memcpy(r->grid, g, sizeof(r->grid));
	memcpy(r->block, b, sizeof(r->block));
	r->shmem = shmem;
	r->has_dims = 1;
}

static const char *kernel_name(const void *key)
{
	struct shim_kernel *k = key ? shim_kernel_find(key) : NULL;

	return k ? k->name : "?";
}

/* ---- library tasks ---------------------------------------------------- */
uint64_t shim_task_lib_begin(const char *api, const struct shim_task_param *params,
			     int nparams, void *stream)
{
	struct lib_task *t = &cur;
	struct shim_trace_rec *r = &t->rec;
	int i, n = 0, routed;

	if (t->token)
		return 0;       /* nested: the outer call is the task */
	t->token = ++next_token;
	t->nkernels = 0;
	t->stream = stream;
	t->traced = shim_tracing();
	shim_task_lib_open = 1;
	shim_add(&lib_ctr.tasks, 1);
	if (!t->traced)
		return t->token;
	/* as for a kernel task: decided once, and routed to a worker the
	 * library's kernels run there, so events on this process's stream
	 * would not bracket them: recorded without device times */
	routed = shim_fwd_check() && shim_fwd_follow();
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	fill_common(r, SHIM_TASK_LIBRARY, stream);
	if (!routed)
		r->route = 0;
	snprintf(r->api, sizeof(r->api), "%s", api ? api : "?");
	for (i = 0; params && i < nparams && n < SHIM_TASK_MAX_PARAMS; i++)
		if (params[i].key)
			r->params[n++] = params[i];
	r->nparams = n;
	shim_trace_begin(r, r->route ? SHIM_EV_NONE : shim_trace_backend(0), stream, 0);
	return t->token;
}

void shim_task_lib_end(uint64_t token, int rc)
{
	struct lib_task *t = &cur;

	if (!token || token != t->token)
		return;
	if (t->traced) {
		t->rec.nkernels = t->nkernels;
		t->rec.rc = rc;
		shim_trace_end(&t->rec, 1, t->stream, 0);
	}
	t->token = 0;
	shim_task_lib_open = 0;
}

int shim_task_in_lib(void)
{
	return cur.token != 0;
}

static void lib_owns_one(void)
{
	cur.nkernels++;
	shim_add(&lib_ctr.kernels, 1);
}

void shim_task_counts(uint64_t *kernels, uint64_t *libraries)
{
	uint64_t all = __atomic_load_n(&__atomic_load_n(&shim_ctr, __ATOMIC_ACQUIRE)->launches,
				       __ATOMIC_RELAXED);
	uint64_t owned = __atomic_load_n(&lib_ctr.kernels, __ATOMIC_RELAXED);

	*kernels = all > owned ? all - owned : 0;
	*libraries = __atomic_load_n(&lib_ctr.tasks, __ATOMIC_RELAXED);
}

/* A forked child: the forking thread is the only one left, and nothing it
 * had open belongs to the child (shim_core.c zeroes the launch counters,
 * so the kernels libraries owned start over too). */
static void task_after_fork(void)
{
	memset(&cur, 0, sizeof(cur));
	shim_task_lib_open = 0;
	lib_ctr.tasks = lib_ctr.kernels = 0;
}

__attribute__((constructor)) static void task_ctor(void)
{
	pthread_atfork(NULL, NULL, task_after_fork);
}

/* ---- runtime launches ------------------------------------------------- */
typedef cudaError_t (*launch_fn)(const void *, dim3, dim3, void **, size_t, cudaStream_t);
typedef cudaError_t (*launch_exc_fn)(const cudaLaunchConfig_t *, const void *, void **);
typedef cudaError_t (*graph_fn)(cudaGraphExec_t, cudaStream_t);

static dim3 mkdim(const uint32_t v[3])
{
	dim3 d = { v[0], v[1], v[2] };

	return d;
}

/* What the hook does for a launch that is not routed; forwarding runs a
 * launch that stays local while routed the same way. */
int shim_launch_local(const struct shim_launch *l)
{
	cudaError_t r;

	shim_in_runtime++;
	switch (l->entry) {
	case SHIM_E_EXC:
		r = ((launch_exc_fn)l->real)(l->config, l->key, l->args);
		break;
	case SHIM_E_GRAPH:
		r = ((graph_fn)l->real)((cudaGraphExec_t)l->key, l->stream);
		break;
	default:
		r = ((launch_fn)l->real)(l->key, mkdim(l->grid), mkdim(l->block), l->args, l->shmem,
					 l->stream);
		break;
	}
	shim_in_runtime--;
	if (r == cudaSuccess && l->entry == SHIM_E_GRAPH)
		shim_graph_count(l->key);       /* its kernels (shim_graph.c) */
	else if (r == cudaSuccess)
		shim_count_launch(l->key);
	return r;
}

static int run(const struct shim_launch *l)
{
	return shim_fwd_check() ? shim_fwd_launch(l) : shim_launch_local(l);
}

int shim_task_launch(const struct shim_launch *l)
{
	const cudaLaunchConfig_t *c = l->config;
	struct shim_trace_rec rec;
	void *stream = l->stream;
	int r, routed;

	if (shim_in_runtime)
		return run(l);
	if (cur.token) {
		r = run(l);
		if (r == cudaSuccess)
			lib_owns_one();
		return r;
	}
	if (!shim_tracing())
		return run(l);

	/* decided once, so that the record says what really happened (a
	 * route change is acted on first: a hold waits there, before the
	 * record's times); the acquire pairs with the controller's release of
	 * the route epoch, after which quota and route read below are the new
	 * ones */
	routed = shim_fwd_check() && shim_fwd_follow();
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	if (l->entry == SHIM_E_EXC && c)
		stream = c->stream;
	fill_common(&rec, SHIM_TASK_KERNEL, stream);
	if (!routed)
		rec.route = 0;
	if (l->entry == SHIM_E_GRAPH) {
		rec.name = "cudaGraphLaunch";
	} else if (l->entry == SHIM_E_EXC) {
		rec.name = kernel_name(l->key);
		if (c) {
			uint32_t g[3] = { c->gridDim.x, c->gridDim.y, c->gridDim.z };
			uint32_t b[3] = { c->blockDim.x, c->blockDim.y, c->blockDim.z };

			set_dims(&rec, g, b, c->dynamicSmemBytes);
		}
	} else {
		rec.name = kernel_name(l->key);
		set_dims(&rec, l->grid, l->block, l->shmem);
	}
	/* routed to a worker, the kernel runs elsewhere: events on this
	 * process's stream would not bracket it */
	shim_trace_begin(&rec, rec.route ? SHIM_EV_NONE : shim_trace_backend(0), stream, l->ptsz);
	r = routed ? shim_fwd_launch(l) : shim_launch_local(l);
	shim_trace_end(&rec, r == cudaSuccess, stream, l->ptsz);
	return r;
}

/* ---- driver launches -------------------------------------------------- */
void shim_task_drv_begin(struct shim_task_drv *t)
{
	struct shim_trace_rec *r = &t->rec;

	t->state = DRV_NONE;
	if (cur.token) {
		t->state = DRV_LIB;
		return;
	}
	if (!shim_tracing())
		return;
	t->state = DRV_TRACED;
	fill_common(r, SHIM_TASK_KERNEL, t->stream);
	if (!t->graph)
		set_dims(r, t->grid, t->block, t->shmem);
	shim_trace_begin(r, shim_trace_backend(1), t->stream, t->ptsz);
}

void shim_task_drv_end(struct shim_task_drv *t, int rc)
{
	if (t->state == DRV_LIB && rc == CUDA_SUCCESS) {
		lib_owns_one();
	} else if (t->state == DRV_TRACED) {
		/* named now: the driver hook names a function at its first launch */
		t->rec.name = t->graph ? "cuGraphLaunch" : kernel_name(t->key);
		shim_trace_end(&t->rec, rc == CUDA_SUCCESS, t->stream, t->ptsz);
	}
}

/* ---- copies and syncs ------------------------------------------------- */
void shim_task_sync(const struct shim_op_site *at)
{
	if (shim_in_runtime)
		return;
	shim_query_sync();
	if (at && at->t0_ns && shim_trace_ops())
		shim_trace_op(SHIM_OP_SYNC, 0, 0, 1, at);
	if (shim_tracing())
		shim_trace_poll();
}

void shim_task_copy(int kind, size_t n, int blocking, const struct shim_op_site *at)
{
	if (kind < 0 || shim_in_runtime)
		return;
	shim_query_copy(kind, n, blocking);
	/* after the query's view: a copy that begins an inferred query is in it */
	if (at && at->t0_ns && kind != cudaMemcpyHostToHost && shim_trace_ops())
		shim_trace_op(SHIM_OP_COPY, kind, n, blocking, at);
	if (blocking && shim_tracing())
		shim_trace_poll();
}

void shim_task_memset(size_t n, int blocking, const struct shim_op_site *at)
{
	if (!shim_in_runtime && at && at->t0_ns && shim_trace_ops())
		shim_trace_op(SHIM_OP_MEMSET, 0, n, blocking, at);
}
