/*
 * shim_query.c - queries: where one request of a service begins and ends.
 *
 * Two rules, logged once each when first used:
 *
 *   api       the app calls colocate_query_begin_v1 / colocate_query_end_v1
 *             (shim/include/colocate.h, shim/query.py).  The first call
 *             turns inference off for good, and an inferred query still
 *             open is dropped (the controller drops it too when the rule
 *             changes).
 *   inferred  otherwise: a query is a host-to-device input copy (more may
 *             follow) ... a device-to-host result copy followed by a
 *             synchronisation, or a blocking device-to-host copy.  An input
 *             copy after an unsynchronised result starts the next query.
 *
 * Inference runs only for QoS apps and under a trace, where something
 * reads it (infer_wanted).  Each boundary is counted in the ledger
 * (shim_ledger.c: begun, ended, late, a latency histogram) and goes to the
 * controller as a query_begin / query_end message (controlplane/protocol.py)
 * and into the trace.  Messages leave on
 * the app's controller connection (shim_ctl_send), once it is registered,
 * without blocking: a full queue drops the message (logged once), it never
 * blocks the app.  They reach the controller before the app's exit message.
 *
 * Copies and syncs are not the launch path, and the inference state is
 * shared by the process's threads, so a mutex guards it; the sync hook
 * takes it only while a result copy waits for its sync.
 */
#define _GNU_SOURCE
#include "shim_trace.h"

#include <cuda_runtime_api.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define INFLIGHT 1024   /* API queries whose begin time we remember */

enum { INF_IDLE, INF_INPUT, INF_RESULT };

static pthread_mutex_t qmu = PTHREAD_MUTEX_INITIALIZER;
static int api_used;                    /* read without qmu on the copy path */
static int logged_api, logged_inferred, logged_drop;

/* the inferred query (under qmu; inf_state also read without it) */
static int inf_state;
static uint64_t inf_id, inf_t0, inf_size;

/* API queries in flight: id -> begin time, open addressing, for the
 * latency in the trace; the most recent one, for tasks of other threads */
static struct inflight { uint64_t id, t0; int used; } inflight[INFLIGHT];
static uint64_t last_id;
static int last_set;
static __thread uint64_t my_id;
static __thread int my_set;

/* the controller connection */
/* ---- controller messages ------------------------------------------------ */
static void after_fork_child(void)
{
	/* the parent's queries are the parent's */
	pthread_mutex_init(&qmu, NULL);
	inf_state = INF_IDLE;
	memset(inflight, 0, sizeof(inflight));
	last_set = 0;
	my_set = 0;
}

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void watch_forks(void)
{
	pthread_atfork(NULL, NULL, after_fork_child);
}

static int registered(void)
{
	struct cb_control *c = __atomic_load_n(&shim_ctl, __ATOMIC_ACQUIRE);

	return __atomic_load_n(&c->state, __ATOMIC_RELAXED) == CB_SLOT_LIVE &&
	       __atomic_load_n(&c->pid, __ATOMIC_RELAXED) == (uint32_t)getpid();
}

/* Under qmu: on the controller connection (shim_ctl.c), in order with the
 * app's exit message, never blocking. */
static void send_locked(const char *json)
{
	if (registered() && shim_ctl_send(json) < 0 && !logged_drop++)
		shim_log("queries: boundaries not delivered to the controller");
}

static void send_boundary_locked(int begin, uint64_t id, uint64_t size, const char *rule,
				 uint64_t t_ns)
{
	char msg[256];

	snprintf(msg, sizeof(msg),
		 "{\"v\":1,\"type\":\"%s\",\"pid\":%d,\"id\":%llu,\"size\":%llu,\"rule\":\"%s\","
		 "\"t_us\":%llu}", begin ? "query_begin" : "query_end", (int)getpid(),
		 (unsigned long long)id, (unsigned long long)size, rule,
		 (unsigned long long)(t_ns / 1000));
	send_locked(msg);
}

/* ---- the API ------------------------------------------------------------- */
static struct inflight *slot_of(uint64_t id, int add)
{
	uint64_t h = id * 0x9e3779b97f4a7c15ull;
	unsigned i, k = (unsigned)(h >> 54) % INFLIGHT;

	for (i = 0; i < INFLIGHT; i++, k = (k + 1) % INFLIGHT) {
		if (inflight[k].used && inflight[k].id == id)
			return &inflight[k];
		if (!inflight[k].used)
			return add ? &inflight[k] : NULL;
	}
	/* full: the app forgets to end queries; reuse the home slot */
	return add ? &inflight[(unsigned)(h >> 54) % INFLIGHT] : NULL;
}

/* Under qmu: the first API call switches inference off. */
static void api_first_locked(void)
{
	if (api_used)
		return;
	__atomic_store_n(&api_used, 1, __ATOMIC_RELAXED);
	inf_state = INF_IDLE;
	if (!logged_api++)
		shim_log("queries: marked by the app (colocate_query_begin/end); no inference");
}

static void inflight_del(struct inflight *f)
{
	/* backward-shift deletion keeps the probe chains unbroken */
	unsigned i = (unsigned)(f - inflight), j = i, k;

	inflight[i].used = 0;
	for (;;) {
		j = (j + 1) % INFLIGHT;
		if (!inflight[j].used)
			return;
		k = (unsigned)((inflight[j].id * 0x9e3779b97f4a7c15ull) >> 54) % INFLIGHT;
		if ((j > i && (k <= i || k > j)) || (j < i && (k <= i && k > j))) {
			inflight[i] = inflight[j];
			inflight[j].used = 0;
			i = j;
		}
	}
}

SHIM_API int colocate_query_begin_v1(uint64_t id, uint64_t input_size)
{
	uint64_t t = shim_now_ns();
	struct inflight *f;

	shim_start();
	pthread_once(&fork_once, watch_forks);
	pthread_mutex_lock(&qmu);
	api_first_locked();
	f = slot_of(id, 1);
	f->id = id;
	f->t0 = t;
	f->used = 1;
	last_id = id;
	last_set = 1;
	shim_ledger_query_begin(1);
	send_boundary_locked(1, id, input_size, "api", t);
	pthread_mutex_unlock(&qmu);
	my_id = id;
	my_set = 1;
	if (shim_tracing())
		shim_trace_query(1, id, input_size, "api", t, -1);
	return 0;
}

SHIM_API int colocate_query_end_v1(uint64_t id)
{
	uint64_t t = shim_now_ns();
	int64_t latency = -1;
	struct inflight *f;

	shim_start();
	pthread_once(&fork_once, watch_forks);
	pthread_mutex_lock(&qmu);
	api_first_locked();
	f = slot_of(id, 0);
	if (f) {
		latency = (int64_t)(t - f->t0);
		inflight_del(f);
	}
	if (last_set && last_id == id)
		last_set = 0;
	shim_ledger_query_end(1, latency);
	send_boundary_locked(0, id, 0, "api", t);
	pthread_mutex_unlock(&qmu);
	if (my_set && my_id == id)
		my_set = 0;
	if (shim_tracing())
		shim_trace_query(0, id, 0, "api", t, latency);
	return 0;
}

int shim_query_current(uint64_t *id)
{
	int found = 0;

	if (my_set) {
		*id = my_id;
		return 1;
	}
	pthread_mutex_lock(&qmu);
	if (last_set) {
		*id = last_id;
		found = 1;
	} else if (!api_used && inf_state != INF_IDLE) {
		*id = inf_id;
		found = 1;
	}
	pthread_mutex_unlock(&qmu);
	return found;
}

/* ---- inference ----------------------------------------------------------- */
/*
 * Only where something reads the result: a QoS app (its policy reacts to
 * query boundaries and its latency is what the run is judged by) or a
 * trace (profiles key tasks on queries).  A batch app's copies are then
 * not queries at all: no lock, no message.
 */
static int infer_wanted(void)
{
	static int qos = -1;

	if (__builtin_expect(qos < 0, 0)) {
		const char *c = getenv("COLOCATE_APP_CLASS");

		qos = c && strcmp(c, "qos") == 0;
	}
	return qos || shim_trace_to_file();
}

struct boundary { int what; uint64_t id, size, t, t0; };   /* 1 begin, 2 end */

/* Under qmu. */
static void inf_end_locked(uint64_t t, struct boundary *b)
{
	if (!logged_inferred++)
		shim_log("queries: not marked by the app; inferred from copies "
			 "(host-to-device input ... device-to-host result + sync)");
	shim_ledger_query_end(0, (int64_t)(t - inf_t0));
	send_boundary_locked(0, inf_id, inf_size, "inferred", t);
	b->what = 2;
	b->id = inf_id;
	b->size = inf_size;
	b->t = t;
	b->t0 = inf_t0;
	__atomic_store_n(&inf_state, INF_IDLE, __ATOMIC_RELAXED);
}

static void inf_begin_locked(uint64_t t, size_t n, struct boundary *b)
{
	inf_id++;
	inf_t0 = t;
	inf_size = n;
	shim_ledger_query_begin(0);
	send_boundary_locked(1, inf_id, n, "inferred", t);
	b->what = 1;
	b->id = inf_id;
	b->size = n;
	b->t = t;
	__atomic_store_n(&inf_state, INF_INPUT, __ATOMIC_RELAXED);
}

static void trace_boundaries(const struct boundary *b, int n)
{
	int i;

	if (!shim_tracing())
		return;
	for (i = 0; i < n; i++)
		if (b[i].what)
			shim_trace_query(b[i].what == 1, b[i].id, b[i].size, "inferred", b[i].t,
					 b[i].what == 2 ? (int64_t)(b[i].t - b[i].t0) : -1);
}

void shim_query_copy(int kind, size_t n, int blocking)
{
	struct boundary b[2] = { { 0 }, { 0 } };
	uint64_t t;

	if (__atomic_load_n(&api_used, __ATOMIC_RELAXED) || !infer_wanted())
		return;
	if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost)
		return;
	t = shim_now_ns();
	pthread_once(&fork_once, watch_forks);
	pthread_mutex_lock(&qmu);
	if (api_used) {
		/* the API won meanwhile */
	} else if (kind == cudaMemcpyHostToDevice) {
		if (inf_state == INF_RESULT)
			inf_end_locked(t, &b[0]);   /* next input before a sync */
		if (inf_state == INF_IDLE)
			inf_begin_locked(t, n, &b[1]);
		else
			inf_size += n;
	} else if (inf_state != INF_IDLE) {
		if (blocking)
			inf_end_locked(t, &b[0]);
		else
			__atomic_store_n(&inf_state, INF_RESULT, __ATOMIC_RELAXED);
	}
	pthread_mutex_unlock(&qmu);
	trace_boundaries(b, 2);
}

void shim_query_sync(void)
{
	struct boundary b = { 0 };

	if (__atomic_load_n(&inf_state, __ATOMIC_RELAXED) != INF_RESULT ||
	    __atomic_load_n(&api_used, __ATOMIC_RELAXED))
		return;
	pthread_mutex_lock(&qmu);
	if (inf_state == INF_RESULT && !api_used)
		inf_end_locked(shim_now_ns(), &b);
	pthread_mutex_unlock(&qmu);
	trace_boundaries(&b, 1);
}
