/*
 * shim_trace.h - the task layer inside libcolocate.so: what the launch,
 * copy and sync hooks call (shim_task.c), the per-task trace (shim_trace.c
 * and the files shim_trace_int.h names) and queries (shim_query.c).  The
 * library-call hooks use shim_task.h.
 *
 * Off path: a launch hook asks shim_task_hot(): one load of the tracing
 * flag, which sits alone on a read-mostly cache line (written only when
 * tracing starts, stops or the process forks), and one load of an
 * initial-exec TLS flag set while this thread is inside a library task.
 * Library calls on other threads write nothing the launch path reads, so
 * apps calling cuBLAS/cuDNN from many threads do not bounce a shared line.
 */
#ifndef COLOCATE_SHIM_TRACE_H
#define COLOCATE_SHIM_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "shim.h"
#include "shim_task.h"

/* Non-zero while task records are taken: tracing (COLOCATE_TRACE) or the
 * controller's task feedback, one bit each; shim_trace.c owns it.
 * aligned(64) makes the struct 64 bytes: nothing else shares its line. */
struct shim_flag_line {
	unsigned on;
} __attribute__((aligned(64)));
extern struct shim_flag_line shim_trace_flag;
/* Non-zero while this thread has a library task open; shim_task.c owns it. */
extern __thread int shim_task_lib_open __attribute__((tls_model("initial-exec")));

static inline int shim_tracing(void)
{
	return __atomic_load_n(&shim_trace_flag.on, __ATOMIC_RELAXED) != 0;
}

/* Tracing to a file (COLOCATE_TRACE): the TRACE_ON_FILE bit. */
static inline int shim_trace_to_file(void)
{
	return (__atomic_load_n(&shim_trace_flag.on, __ATOMIC_RELAXED) & 1u) != 0;
}

static inline int shim_task_hot(void)
{
	return __builtin_expect(shim_tracing() || shim_task_lib_open, 0);
}

/* The same as shim_tracing(), as a function: for files that include only
 * shim_task.h (hook_lib.c skips gathering a nested call's parameters when
 * tracing is off). */
int shim_trace_on(void);

/* --- tasks (shim_task.c) ------------------------------------------------ */

/* A runtime launch while shim_task_hot(): makes it a task (or attributes it
 * to the open library task), then runs it as the hook would have: forwarded
 * when routed, else locally, counted.  Returns its cudaError_t. */
int shim_task_launch(const struct shim_launch *l);

/* Copies, memsets and syncs as trace lines too (COLOCATE_TRACE_OPS=1 with
 * COLOCATE_TRACE): a replayer needs them between the tasks.  Set once at
 * start-up; shim_trace_json.c owns it. */
extern int shim_trace_ops_on;

static inline int shim_trace_ops(void)
{
	return __builtin_expect(shim_trace_ops_on, 0) && shim_trace_to_file();
}

/* Where and when a copy, memset or sync was called, for its trace line:
 * taken before the real call (t0_ns 0 when op lines are off). */
struct shim_op_site {
	const char *api;
	void *stream;
	uint64_t t0_ns;
};
#define SHIM_OP_SITE(api, stream) { (api), (void *)(stream), shim_trace_ops() ? shim_now_ns() : 0 }

/* The app synchronised (device, stream or event): queries inferred from
 * copies may end, trace times may be resolved.  Cheap when neither applies.
 * at: the call, for its op line (NULL: none). */
void shim_task_sync(const struct shim_op_site *at);
/* A successful copy of n bytes; kind is a cudaMemcpyKind with Default
 * already resolved, or -1 for "not counted" (ignored).  blocking: cudaMemcpy
 * rather than cudaMemcpyAsync. */
void shim_task_copy(int kind, size_t n, int blocking, const struct shim_op_site *at);
/* A successful memset of n bytes (an op line only). */
void shim_task_memset(size_t n, int blocking, const struct shim_op_site *at);

/* Tasks of this process so far, by kind. */
void shim_task_counts(uint64_t *kernels, uint64_t *libraries);

/* --- trace (shim_trace.c) ----------------------------------------------- */

enum { SHIM_TASK_KERNEL = 1, SHIM_TASK_LIBRARY = 2 };
/* op lines' record kinds (after the query lines' 10 and 11) */
enum { SHIM_OP_COPY = 12, SHIM_OP_MEMSET = 13, SHIM_OP_SYNC = 14 };

/* A task's launches forwarded to a pool worker, timed there (shim_fwd_span.c
 * fills it while the task is open on its thread): the task's device times
 * come from the worker's page, not from events of ours. */
struct shim_fwd_span {
	void *conn;             /* the connection (a reference held), or NULL */
	uint64_t first, last;   /* seq of its first and last forwarded launch */
	uint16_t sfirst, slast; /* and their stream indexes                  */
	uint32_t n;             /* launches forwarded, timed                 */
	uint32_t untimed;       /* launches of it that cannot be timed there:
	                           ran locally, or on another connection     */
};
/* which API the bracketing events go through */
enum { SHIM_EV_NONE = 0, SHIM_EV_RT = 1, SHIM_EV_DRV = 2 };

struct shim_trace_rec {
	int kind;               /* SHIM_TASK_*                              */
	int backend;            /* SHIM_EV_*: set by shim_trace_begin       */
	int has_dims;
	int has_query;
	const char *name;       /* kernel: the name table's (stable) string */
	char api[64];           /* library: the entry point's name, copied  */
	uint32_t grid[3], block[3];
	uint64_t shmem;
	void *stream;
	uint32_t quota;         /* SM share at launch time                  */
	uint32_t route;         /* 0 local, else the pool worker's id       */
	uint64_t query;         /* the query it belongs to (has_query)      */
	uint64_t host_ns;       /* CLOCK_MONOTONIC when it was issued       */
	void *ev[2];            /* start/end events, NULL when untimed      */
	uint32_t nkernels;      /* library: kernels launched inside it      */
	int rc;                 /* library: its status                      */
	int64_t latency_ns;     /* query boundaries; op lines: host time in it */
	int op_dir;             /* copy: its cudaMemcpyKind                  */
	int op_blocking;        /* copy, memset: the synchronous call        */
	uint64_t op_bytes;      /* copy, memset: bytes                       */
	uint32_t gen;           /* event generation at begin (device resets) */
	struct shim_fwd_span fwd;   /* routed: times from the worker        */
	/* last: filling a record clears everything before params */
	int nparams;
	struct shim_task_param params[SHIM_TASK_MAX_PARAMS];
};

/* A driver launch while shim_task_hot() (outside a runtime hook): the hook
 * fills the first fields, calls begin, the real launch, then end. */
struct shim_task_drv {
	const void *key;        /* CUfunction, or the graph exec           */
	uint32_t grid[3], block[3];
	uint32_t shmem;
	void *stream;
	int ptsz;
	int graph;              /* cuGraphLaunch: no dims, no name         */
	int state;              /* the task layer's: none, library, traced */
	struct shim_trace_rec rec;
};
void shim_task_drv_begin(struct shim_task_drv *t);
void shim_task_drv_end(struct shim_task_drv *t, int rc);

/* Read COLOCATE_TRACE (a constructor does it once; shim_trace_json.c). */
void shim_trace_init(void);
/* Take events from the pool and record the start event on stream through
 * the backend's real API (SHIM_EV_NONE: an untimed record). */
void shim_trace_begin(struct shim_trace_rec *r, int backend, void *stream, int ptsz);
/* Record the end event and queue the record; ok == 0 drops it (the launch
 * failed: not a task). */
void shim_trace_end(struct shim_trace_rec *r, int ok, void *stream, int ptsz);
/* Resolve and write what has completed (never waits). */
void shim_trace_poll(void);
/* A query boundary ("query_begin" / "query_end") as a trace line. */
void shim_trace_query(int begin, uint64_t id, uint64_t size, const char *rule, uint64_t t_ns,
		      int64_t latency_ns);
/* A copy, memset or sync (SHIM_OP_*) as a trace line, queued like a
 * query boundary; the host time inside the call is measured from at. */
void shim_trace_op(int op, int dir, uint64_t bytes, int blocking, const struct shim_op_site *at);
/* The backend for a task on the runtime (cudart) or the driver API. */
int shim_trace_backend(int driver);
/* The app is about to reset the device (cudaDeviceReset): write what has
 * completed, then forget every event (they die with the context; never
 * destroyed or queried again); the next task creates fresh ones. */
void shim_trace_device_reset(void);

/* Task feedback (the controller's reply to "register" asked for it): take
 * records as the trace does and send completed ones to the controller from
 * a feed thread (shim_feed.c).  With COLOCATE_TRACE as well,
 * each task goes to both. */
void shim_trace_feed_on(void);
/* Tasks sent and dropped, messages sent; returns whether the thread runs. */
int shim_trace_feed_count(uint64_t *sent, uint64_t *dropped, uint64_t *msgs);

/* --- forwarded tasks' times (shim_fwd_span.c) ----------------------------- */

/* A routed task begins on this thread: its forwarded launches are sent
 * timed (FWD_LF_TIMED) and gathered in this thread's span. */
void shim_fwd_span_open(void);
/* It ends: the span (with its reference) moves to *s; empty when none was
 * open. */
void shim_fwd_span_close(struct shim_fwd_span *s);
/* Its device times: start = the first launch's start, duration = the last
 * launch's end - that start (one launch: its own).  Start is CLOCK_MONOTONIC-
 * anchored (fwd_proto.h).  1 timed, 0 not yet, -1 never.  Never blocks. */
int shim_fwd_span_time(const struct shim_fwd_span *s, int64_t *start_ns, int64_t *dur_ns);
/* The record is done with it: its reference goes. */
void shim_fwd_span_drop(struct shim_fwd_span *s);

/* --- queries (shim_query.c) ----------------------------------------------- */

/* The query the calling thread is inside, if any: 1 and *id, else 0. */
int shim_query_current(uint64_t *id);
/* Inference's view of copies and syncs (shim_task_copy/_sync pass them on). */
void shim_query_copy(int kind, size_t n, int blocking);
void shim_query_sync(void);

/* --- common fields (shim_task.c) --------------------------------------- */

/* The SM share a task runs at: the route quota from the control block, else
 * CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, else 100. */
uint32_t shim_task_quota(void);
/* The app's name as the controller knows it (COLOCATE_APP_NAME, else the
 * executable's basename). */
const char *shim_app_name(void);

#endif
