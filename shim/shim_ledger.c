/*
 * shim_ledger.c - this process's ledger (ledger.h): the records that must
 * reach the controller whatever happens to messages or to the process.
 *
 * The controller creates <runtime dir>/apps/<slot>-<pid>.ledger before it
 * answers "register"; shim_ledger_attach() maps it.  From then on:
 *   - every kernel's launch counter lives in the ledger (shim_names.c points
 *     struct shim_kernel.count at its entry), so the launch path does the
 *     same one atomic add as any counter, into shared memory, and a SIGKILLed
 *     app's kernel table is still there for the controller to read;
 *   - query boundaries count here (begun, ended, late, a latency
 *     histogram) before any message is tried, so a dropped message costs
 *     the policy a reaction but never a count;
 *   - the exit handler writes the twins and then state = LG_EXITED: the
 *     controller's next tick sees it even if the exit message never comes.
 *
 * Nothing here blocks or makes a system call after attach, except the one
 * clock read the exit path already made.  Without a ledger (no controller,
 * an older one, or a mapping that failed) every function is a no-op and the
 * counts stay in the process.
 */
#define _GNU_SOURCE
#include "shim.h"
#include "ledger.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct lg_header *lg;     /* NULL: no ledger (published with release) */
static uint64_t qos_ns;          /* COLOCATE_QOS_MS, 0: no target            */

static struct lg_header *ledger(void)
{
	return __atomic_load_n(&lg, __ATOMIC_ACQUIRE);
}

int shim_ledger_attach(int slot, char *why, size_t whylen)
{
	char path[PATH_MAX];
	const char *q = getenv("COLOCATE_QOS_MS");
	struct lg_header *l;
	double ms;

	if (snprintf(path, sizeof(path), "%s/apps/%d-%d.ledger", shim_runtime_dir(), slot,
		     (int)getpid()) >= (int)sizeof(path)) {
		snprintf(why, whylen, "ledger path too long");
		return -1;
	}
	l = lg_open(path, 0, (uint32_t)getpid(), (uint32_t)slot);
	if (!l) {
		snprintf(why, whylen, "cannot map %.200s: %s", path,
			 errno == EPROTO ? "not this process's ledger of this version" : strerror(errno));
		return -1;
	}
	ms = q && *q ? atof(q) : 0.0;
	qos_ns = ms > 0 && ms < 1e9 ? (uint64_t)(ms * 1e6) : 0;
	__atomic_store_n(&l->attached_pid, (uint32_t)getpid(), __ATOMIC_RELAXED);
	__atomic_store_n(&l->state, LG_LIVE, __ATOMIC_RELEASE);
	__atomic_store_n(&lg, l, __ATOMIC_RELEASE);
	return 0;
}

int shim_ledger_on(void)
{
	return ledger() != NULL;
}

/*
 * A kernel entry for name, starting at launches (counted before the ledger
 * existed).  Called under the kernel table's lock, so entries are appended
 * by one thread at a time; nkernels is published after the entry is whole.
 * Returns its counter, or NULL (no ledger, or it is full: the kernel then
 * counts privately, and kernels_lost says how many the table misses).
 */
uint64_t *shim_ledger_kernel(const char *name, uint64_t launches)
{
	struct lg_header *l = ledger();
	struct lg_kernel *e;
	uint64_t n, off;
	size_t len;
	char *dst;

	if (!l)
		return NULL;
	n = __atomic_load_n(&l->nkernels, __ATOMIC_RELAXED);
	len = strlen(name);
	off = __atomic_load_n(&l->names_used, __ATOMIC_RELAXED);
	if (n >= LG_MAX_KERNELS || len >= UINT32_MAX || off + len + 1 > LG_NAMES_BYTES) {
		__atomic_fetch_add(&l->kernels_lost, 1, __ATOMIC_RELAXED);
		return NULL;
	}
	dst = (char *)l + l->names_off + off;
	memcpy(dst, name, len + 1);
	e = lg_kernel_at(l, (uint32_t)n);
	e->name_off = (uint32_t)off;
	e->name_len = (uint32_t)len;
	e->twin = -1;
	__atomic_store_n(&e->launches, launches, __ATOMIC_RELAXED);
	__atomic_store_n(&l->names_used, off + len + 1, __ATOMIC_RELAXED);
	__atomic_store_n(&l->nkernels, n + 1, __ATOMIC_RELEASE);
	return &e->launches;
}

/* The counts below are of one rule; a change (inferred -> api) restarts them. */
static void take_rule(struct lg_header *l, uint32_t rule)
{
	uint32_t i;

	if (__atomic_load_n(&l->q_rule, __ATOMIC_RELAXED) == rule)
		return;
	__atomic_store_n(&l->q_begun, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&l->q_ended, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&l->q_violations, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&l->q_lat_sum_ns, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&l->q_lat_max_ns, 0, __ATOMIC_RELAXED);
	for (i = 0; i < LG_HBUCKETS; i++)
		__atomic_store_n(&l->q_hist[i], 0, __ATOMIC_RELAXED);
	__atomic_store_n(&l->q_rule, rule, __ATOMIC_RELEASE);
}

/* Called under the query lock (shim_query.c): one writer at a time. */
void shim_ledger_query_begin(int api)
{
	struct lg_header *l = ledger();

	if (!l)
		return;
	take_rule(l, api ? LG_RULE_API : LG_RULE_INFERRED);
	__atomic_fetch_add(&l->q_begun, 1, __ATOMIC_RELAXED);
}

/* A query ended after latency_ns (< 0: its begin is unknown, not counted). */
void shim_ledger_query_end(int api, int64_t latency_ns)
{
	struct lg_header *l = ledger();
	uint64_t v = (uint64_t)latency_ns;

	if (!l || latency_ns < 0)
		return;
	take_rule(l, api ? LG_RULE_API : LG_RULE_INFERRED);
	__atomic_fetch_add(&l->q_hist[lg_bucket(v)], 1, __ATOMIC_RELAXED);
	__atomic_fetch_add(&l->q_lat_sum_ns, v, __ATOMIC_RELAXED);
	if (v > __atomic_load_n(&l->q_lat_max_ns, __ATOMIC_RELAXED))
		__atomic_store_n(&l->q_lat_max_ns, v, __ATOMIC_RELAXED);
	if (qos_ns && v > qos_ns)
		__atomic_fetch_add(&l->q_violations, 1, __ATOMIC_RELAXED);
	/* ended last: a reader that sees the count sees its latency */
	__atomic_fetch_add(&l->q_ended, 1, __ATOMIC_RELEASE);
}

void shim_ledger_msg_dropped(void)
{
	struct lg_header *l = ledger();

	if (l)
		__atomic_fetch_add(&l->msgs_dropped, 1, __ATOMIC_RELAXED);
}

/* The task feed's totals (shim_feed.c, under its lock). */
void shim_ledger_feed(uint64_t fed, uint64_t sent, uint64_t dropped)
{
	struct lg_header *l = ledger();

	if (!l)
		return;
	__atomic_store_n(&l->tasks_fed, fed, __ATOMIC_RELAXED);
	__atomic_store_n(&l->tasks_sent, sent, __ATOMIC_RELAXED);
	__atomic_store_n(&l->tasks_dropped, dropped, __ATOMIC_RELAXED);
}

/*
 * At exit, after the counters have left the control-block slot: which
 * kernels had a host twin (simgpu), then LG_EXITED.  has_twin may be NULL.
 */
void shim_ledger_exit(int (*has_twin)(const char *))
{
	struct lg_header *l = ledger();
	struct timespec ts;
	uint64_t i, n;

	if (!l)
		return;
	n = __atomic_load_n(&l->nkernels, __ATOMIC_ACQUIRE);
	for (i = 0; has_twin && i < n; i++) {
		struct lg_kernel *e = lg_kernel_at(l, (uint32_t)i);

		if (__atomic_load_n(&e->launches, __ATOMIC_RELAXED))
			e->twin = has_twin((const char *)l + l->names_off + e->name_off);
	}
	clock_gettime(CLOCK_REALTIME, &ts);
	__atomic_store_n(&l->exit_ns, (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec,
			 __ATOMIC_RELAXED);
	__atomic_store_n(&l->state, LG_EXITED, __ATOMIC_RELEASE);
}

/* A forked child: the parent's ledger is the parent's (the mapping stays,
 * unused, like the control block's). */
void shim_ledger_forget(void)
{
	__atomic_store_n(&lg, NULL, __ATOMIC_RELEASE);
}
