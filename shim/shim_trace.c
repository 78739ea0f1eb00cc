/*
 * shim_trace.c - the per-task trace: one JSON line per task, on only when
 * COLOCATE_TRACE=<file> is set (`colocate trace` sets it).
 *
 * A task is bracketed by two events recorded on its stream through the
 * real event API (cudart's for runtime launches and library calls, the
 * driver's for driver launches), so its start and duration are device
 * time: modelled on simgpu, measured on a GPU.  Nothing waits for them on
 * the launch path: records queue in issue order and are resolved when
 * they have completed, at the app's own synchronisations and at exit
 * (where the wait is bounded by COLOCATE_TRACE_WAIT_MS, default 2000).
 *
 * Lines are buffered and written with one write(2) per batch to a file
 * opened O_APPEND, so several processes of one command can share it.
 * Nothing here may crash or hang the app: a missing event API or a failed
 * event creation is logged once and tasks are then recorded without times;
 * a write error is logged once and turns tracing off.
 */
#define _GNU_SOURCE
#include "shim_trace.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define PENDING_MAX  4096            /* records waiting for their events   */
#define POOL_MAX     (2 * PENDING_MAX + 8)
#define OUT_SIZE     (256 * 1024)
#define OUT_FLUSH    (192 * 1024)    /* write once this much is buffered   */
#define LINE_ROOM    (8 * 1024)      /* the longest line we ever format    */
#define NAME_MAX_OUT 2048            /* longer kernel names are cut        */
#define FLUSH_EVERY_NS 1000000000ull /* and at a sync after this long      */

enum { REC_QBEGIN = 10, REC_QEND = 11 };   /* query lines share the queue */

/* ---- event API, one per backend ------------------------------------------ */
struct evapi {
	const char *what;
	int state;                   /* 0 not looked up, 1 usable, -1 not     */
	int (*create)(void **ev, unsigned flags);
	int (*record)(void *ev, void *stream);
	int (*record_ptsz)(void *ev, void *stream);
	int (*query)(void *ev);
	int (*elapsed)(float *ms, void *a, void *b);
	int (*destroy)(void *ev);
	void *ref;                   /* the first start event: time zero      */
	void *pool[POOL_MAX];
	int npool;
	int create_failed;
};

static struct evapi api[3] = {
	[SHIM_EV_RT] = { .what = "CUDA runtime" },
	[SHIM_EV_DRV] = { .what = "CUDA driver" },
};

#define NOT_READY 600   /* cudaErrorNotReady == CUDA_ERROR_NOT_READY */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;   /* everything below */
static char path[PATH_MAX];
static int fd = -1;
static struct shim_trace_rec *ring;
static unsigned head, count;
static char *out;
static size_t outlen;
static uint64_t seq, records, untimed;
static uint64_t last_flush_ns;
static int pid;
static int started, atexit_n, events_seen, failed;
static locale_t c_locale;

/* ---- start-up ---------------------------------------------------------- */
__attribute__((constructor)) static void trace_ctor(void)
{
	shim_trace_init();
}

void shim_trace_init(void)
{
	const char *p = getenv("COLOCATE_TRACE");

	if (!p || !*p)
		return;
	snprintf(path, sizeof(path), "%s", p);
	__atomic_fetch_or(&shim_task_state, SHIM_TASK_TRACING, __ATOMIC_RELEASE);
}

static void trace_exit(void);

static void after_fork_child(void)
{
	int i, b;

	/* The parent's records, buffered lines and events are the parent's:
	 * its context does not exist here.  The fd and the file stay shared. */
	pthread_mutex_init(&mu, NULL);
	head = count = 0;
	outlen = 0;
	seq = records = untimed = 0;
	pid = getpid();
	for (b = SHIM_EV_RT; b <= SHIM_EV_DRV; b++) {
		api[b].ref = NULL;
		api[b].npool = 0;
		for (i = 0; i < POOL_MAX; i++)
			api[b].pool[i] = NULL;
	}
}

static void turn_off(void)
{
	__atomic_fetch_and(&shim_task_state, ~SHIM_TASK_TRACING, __ATOMIC_RELEASE);
}

/* Under mu: buffers, atexit, fork handler, once. */
static int start_locked(void)
{
	if (started)
		return failed ? -1 : 0;
	started = 1;
	ring = malloc(sizeof(*ring) * PENDING_MAX);
	out = malloc(OUT_SIZE);
	c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
	if (!ring || !out || !c_locale) {
		shim_log("trace: out of memory; tracing off");
		failed = 1;
		turn_off();
		return -1;
	}
	pid = getpid();
	last_flush_ns = shim_now_ns();
	pthread_atfork(NULL, NULL, after_fork_child);
	atexit(trace_exit);
	atexit_n = 1;
	return 0;
}

/* ---- output ------------------------------------------------------------ */
static void flush_locked(void)
{
	size_t off = 0;
	ssize_t n;

	if (failed)
		outlen = 0;     /* tracing is off: nothing goes anywhere */
	if (!outlen || failed)
		return;
	if (fd < 0) {
		fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
		if (fd < 0) {
			shim_log("trace: cannot open %s: %s; tracing off", path, strerror(errno));
			failed = 1;
			turn_off();
			outlen = 0;
			return;
		}
	}
	while (off < outlen) {
		n = write(fd, out + off, outlen - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			shim_log("trace: cannot write %s: %s; tracing off", path,
				 n < 0 ? strerror(errno) : "short write");
			failed = 1;
			turn_off();
			break;
		}
		off += (size_t)n;
	}
	outlen = 0;
	last_flush_ns = shim_now_ns();
}

static void put(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void put(const char *fmt, ...)
{
	va_list ap;
	int n;

	if (outlen >= OUT_SIZE)
		return;
	va_start(ap, fmt);
	n = vsnprintf(out + outlen, OUT_SIZE - outlen, fmt, ap);
	va_end(ap);
	if (n > 0)
		outlen += (size_t)n < OUT_SIZE - outlen ? (size_t)n : OUT_SIZE - outlen - 1;
}

static void put_str(const char *s, size_t max)
{
	size_t i;

	put("\"");
	for (i = 0; s[i] && i < max && outlen + 8 < OUT_SIZE; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '"' || c == '\\')
			put("\\%c", c);
		else if (c < 0x20)
			put("\\u%04x", c);
		else
			out[outlen++] = (char)c;
	}
	put("\"");
}

static void put_num(double v)
{
	if (!isfinite(v))
		put("null");
	else if (v == (double)(long long)v && fabs(v) < 9e15)
		put("%lld", (long long)v);
	else
		put("%.9g", v);
}

static void put_us(int64_t ns)
{
	put("%.3f", (double)ns / 1e3);
}

/* One line; start/dur in ns, or < 0 when unknown (start may really be
 * negative: a task on another stream ahead of time zero). */
static void emit_locked(const struct shim_trace_rec *r, int timed, int64_t start_ns, int64_t dur_ns)
{
	locale_t old = uselocale(c_locale);   /* "%.3f" must print a dot */
	int i;

	if (outlen + LINE_ROOM > OUT_SIZE)
		flush_locked();
	put("{\"pid\":%d,\"app\":", pid);
	put_str(shim_app_name(), 256);
	put(",\"seq\":%llu,\"kind\":", (unsigned long long)seq++);
	if (r->kind == REC_QBEGIN || r->kind == REC_QEND) {
		put("\"%s\",\"id\":%llu", r->kind == REC_QBEGIN ? "query_begin" : "query_end",
		    (unsigned long long)r->query);
		if (r->kind == REC_QBEGIN || r->shmem)
			put(",\"size\":%llu", (unsigned long long)r->shmem);
		put(",\"rule\":\"%s\",\"host_us\":", r->api);
		put_us((int64_t)r->host_ns);
		if (r->kind == REC_QEND) {
			put(",\"latency_us\":");
			if (r->latency_ns >= 0)
				put_us(r->latency_ns);
			else
				put("null");
		}
		put("}\n");
		uselocale(old);
		return;
	}
	put("\"%s\",\"name\":", r->kind == SHIM_TASK_LIBRARY ? "library" : "kernel");
	put_str(r->kind == SHIM_TASK_LIBRARY ? r->api : (r->name ? r->name : "?"), NAME_MAX_OUT);
	if (r->has_dims)
		put(",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"shmem\":%llu", r->grid[0], r->grid[1],
		    r->grid[2], r->block[0], r->block[1], r->block[2], (unsigned long long)r->shmem);
	else
		put(",\"grid\":null,\"block\":null,\"shmem\":null");
	put(",\"stream\":\"0x%llx\",\"host_us\":", (unsigned long long)(uintptr_t)r->stream);
	put_us((int64_t)r->host_ns);
	put(",\"start_us\":");
	if (timed)
		put_us(start_ns);
	else
		put("null");
	put(",\"dur_us\":");
	if (timed)
		put_us(dur_ns);
	else
		put("null");
	put(",\"quota\":%u,\"route\":\"%s\",\"worker\":", r->quota, r->route ? "worker" : "local");
	if (r->route)
		put("%u", r->route);
	else
		put("null");
	put(",\"query\":");
	if (r->has_query)
		put("%llu", (unsigned long long)r->query);
	else
		put("null");
	if (r->kind == SHIM_TASK_LIBRARY) {
		put(",\"params\":{");
		for (i = 0; i < r->nparams; i++) {
			put(i ? "," : "");
			put_str(r->params[i].key, 64);
			put(":");
			put_num(r->params[i].val);
		}
		put("},\"kernels\":%u,\"rc\":%d", r->nkernels, r->rc);
	}
	put("}\n");
	records++;
	untimed += !timed;
	uselocale(old);
}

/* ---- events -------------------------------------------------------------- */
static void *find(const char *const *libs, const char *name)
{
	void *p = shim_dlsym(RTLD_NEXT, name);

	for (; !p && *libs; libs++) {
		void *h = dlopen(*libs, RTLD_NOLOAD | RTLD_LAZY);

		if (h) {
			p = shim_dlsym(h, name);
			dlclose(h);
		}
	}
	return p;
}

#define LOOKUP(a, field, libs, name)                                   \
	(*(void **)&(a)->field = find(libs, name))

/* Under mu.  The state of backend b, looked up once. */
static int usable(int b)
{
	static const char *const rt[] = { "libcudart.so.13", "libcudart.so", NULL };
	static const char *const drv[] = { "libcuda.so.1", "libcuda.so", NULL };
	struct evapi *a = &api[b];
	int ok;

	if (a->state)
		return a->state > 0;
	if (b == SHIM_EV_RT) {
		ok = LOOKUP(a, create, rt, "cudaEventCreateWithFlags") &&
		     LOOKUP(a, record, rt, "cudaEventRecord") &&
		     LOOKUP(a, query, rt, "cudaEventQuery") &&
		     LOOKUP(a, elapsed, rt, "cudaEventElapsedTime") &&
		     LOOKUP(a, destroy, rt, "cudaEventDestroy");
		LOOKUP(a, record_ptsz, rt, "cudaEventRecord_ptsz");
	} else {
		ok = LOOKUP(a, create, drv, "cuEventCreate") &&
		     LOOKUP(a, record, drv, "cuEventRecord") &&
		     LOOKUP(a, query, drv, "cuEventQuery") &&
		     (LOOKUP(a, elapsed, drv, "cuEventElapsedTime_v2") ||
		      LOOKUP(a, elapsed, drv, "cuEventElapsedTime")) &&
		     (LOOKUP(a, destroy, drv, "cuEventDestroy_v2") ||
		      LOOKUP(a, destroy, drv, "cuEventDestroy"));
		LOOKUP(a, record_ptsz, drv, "cuEventRecord_ptsz");
	}
	__atomic_store_n(&a->state, ok ? 1 : -1, __ATOMIC_RELEASE);
	if (!ok)
		shim_log("trace: the %s has no event API; its tasks are recorded without device times",
			 a->what);
	return ok;
}

int shim_trace_backend(int driver)
{
	static int rt = -1;
	int b;

	if (!driver) {
		/* runtime launches and library calls: cudart when the process
		 * has one (shared), else the driver (static cudart inside) */
		int have = __atomic_load_n(&rt, __ATOMIC_RELAXED);

		if (have < 0) {
			void *h = dlopen("libcudart.so.13", RTLD_NOLOAD | RTLD_LAZY);

			if (!h)
				h = dlopen("libcudart.so", RTLD_NOLOAD | RTLD_LAZY);
			if (h)
				dlclose(h);
			have = h != NULL;
			__atomic_store_n(&rt, have, __ATOMIC_RELAXED);
		}
		b = have ? SHIM_EV_RT : SHIM_EV_DRV;
	} else {
		b = SHIM_EV_DRV;
	}
	if (__atomic_load_n(&api[b].state, __ATOMIC_ACQUIRE) > 0)
		return b;       /* looked up already: no lock per task */
	pthread_mutex_lock(&mu);
	if (!usable(b))
		b = SHIM_EV_NONE;
	pthread_mutex_unlock(&mu);
	return b;
}

static void *get_event(int b)
{
	struct evapi *a = &api[b];
	void *ev = NULL;
	int rc;

	pthread_mutex_lock(&mu);
	if (a->npool)
		ev = a->pool[--a->npool];
	pthread_mutex_unlock(&mu);
	if (ev)
		return ev;
	shim_in_runtime++;
	rc = a->create(&ev, 0);   /* cudaEventDefault == CU_EVENT_DEFAULT: timed */
	shim_in_runtime--;
	if (rc != 0) {
		if (!__atomic_exchange_n(&a->create_failed, 1, __ATOMIC_RELAXED))
			shim_log("trace: creating a %s event failed (error %d); tasks recorded without "
				 "device times while that lasts", a->what, rc);
		return NULL;
	}
	return ev;
}

/* Under mu. */
static void put_event_locked(int b, void *ev)
{
	struct evapi *a = &api[b];

	if (!ev)
		return;
	if (a->npool < POOL_MAX) {
		a->pool[a->npool++] = ev;
		return;
	}
	shim_in_runtime++;
	a->destroy(ev);
	shim_in_runtime--;
}

static void put_events(struct shim_trace_rec *r)
{
	if (r->backend == SHIM_EV_NONE)
		return;
	pthread_mutex_lock(&mu);
	put_event_locked(r->backend, r->ev[0]);
	put_event_locked(r->backend, r->ev[1]);
	pthread_mutex_unlock(&mu);
	r->ev[0] = r->ev[1] = NULL;
	r->backend = SHIM_EV_NONE;
}

static int record(int b, void *ev, void *stream, int ptsz)
{
	struct evapi *a = &api[b];
	int rc;

	shim_in_runtime++;
	rc = ptsz && a->record_ptsz ? a->record_ptsz(ev, stream) : a->record(ev, stream);
	shim_in_runtime--;
	return rc;
}

/* ---- the queue ----------------------------------------------------------- */
void shim_trace_begin(struct shim_trace_rec *r, int backend, void *stream, int ptsz)
{
	struct evapi *a = &api[backend];

	r->backend = SHIM_EV_NONE;
	r->ev[0] = r->ev[1] = NULL;
	pthread_mutex_lock(&mu);
	if (start_locked() < 0 || backend == SHIM_EV_NONE) {
		pthread_mutex_unlock(&mu);
		return;
	}
	if (!events_seen) {
		/* CUDA is up now.  Its own exit handlers were registered at its
		 * initialisation; ours must run before them (atexit is LIFO). */
		events_seen = 1;
		if (atexit_n < 2 && atexit(trace_exit) == 0)
			atexit_n = 2;
	}
	pthread_mutex_unlock(&mu);

	r->ev[0] = get_event(backend);
	r->ev[1] = r->ev[0] ? get_event(backend) : NULL;
	r->backend = backend;
	if (!r->ev[1])
		goto untimed;
	if (!__atomic_load_n(&a->ref, __ATOMIC_ACQUIRE)) {
		void *ref = get_event(backend);

		if (!ref || record(backend, ref, stream, ptsz) != 0)
			goto untimed;
		pthread_mutex_lock(&mu);
		if (!a->ref)
			__atomic_store_n(&a->ref, ref, __ATOMIC_RELEASE);
		else
			put_event_locked(backend, ref);
		pthread_mutex_unlock(&mu);
	}
	if (record(backend, r->ev[0], stream, ptsz) == 0)
		return;
untimed:
	put_events(r);
}

/* (no libm: the shim links libc only) */
static int64_t ms_to_ns(float ms)
{
	double ns = (double)ms * 1e6;

	return (int64_t)(ns + (ns >= 0 ? 0.5 : -0.5));
}

/* Under mu.  Resolve the head record: 1 done (written), 0 not yet. */
static int resolve_head_locked(int force)
{
	struct shim_trace_rec *r = &ring[head];
	struct evapi *a = &api[r->backend];
	int64_t start = 0, dur = 0;
	int timed = 0, q;
	float ms;

	if (r->backend != SHIM_EV_NONE) {
		shim_in_runtime++;
		q = a->query(r->ev[1]);
		if (q == 0 && a->elapsed(&ms, r->ev[0], r->ev[1]) == 0) {
			dur = ms_to_ns(ms);
			q = a->elapsed(&ms, a->ref, r->ev[0]);
			start = ms_to_ns(ms);
			timed = q == 0;
		}
		shim_in_runtime--;
		if (q == NOT_READY && !force)
			return 0;
		put_event_locked(r->backend, r->ev[0]);
		put_event_locked(r->backend, r->ev[1]);
	}
	emit_locked(r, timed, start, dur);
	head = (head + 1) % PENDING_MAX;
	count--;
	return 1;
}

static void drain_locked(void)
{
	while (count && resolve_head_locked(0))
		;
}

void shim_trace_end(struct shim_trace_rec *r, int ok, void *stream, int ptsz)
{
	if (!ok) {
		put_events(r);
		return;
	}
	if (r->backend != SHIM_EV_NONE && record(r->backend, r->ev[1], stream, ptsz) != 0)
		put_events(r);
	pthread_mutex_lock(&mu);
	if (start_locked() < 0 || !shim_tracing()) {
		pthread_mutex_unlock(&mu);
		put_events(r);
		return;
	}
	if (count == PENDING_MAX)
		drain_locked();
	if (count == PENDING_MAX)
		resolve_head_locked(1);   /* the app never syncs: give up the oldest's times */
	ring[(head + count) % PENDING_MAX] = *r;
	count++;
	if (outlen >= OUT_FLUSH)
		flush_locked();
	pthread_mutex_unlock(&mu);
}

void shim_trace_poll(void)
{
	pthread_mutex_lock(&mu);
	if (started && !failed) {
		drain_locked();
		if (outlen >= OUT_FLUSH || (outlen && shim_now_ns() - last_flush_ns > FLUSH_EVERY_NS))
			flush_locked();
	}
	pthread_mutex_unlock(&mu);
}

void shim_trace_query(int begin, uint64_t id, uint64_t size, const char *rule, uint64_t t_ns,
		      int64_t latency_ns)
{
	struct shim_trace_rec r;

	memset(&r, 0, offsetof(struct shim_trace_rec, params));
	r.kind = begin ? REC_QBEGIN : REC_QEND;
	r.query = id;
	r.shmem = size;
	r.host_ns = t_ns;
	r.latency_ns = latency_ns;
	snprintf(r.api, sizeof(r.api), "%s", rule);
	pthread_mutex_lock(&mu);
	if (start_locked() == 0 && shim_tracing()) {
		if (count == PENDING_MAX)
			drain_locked();
		if (count == PENDING_MAX)
			resolve_head_locked(1);
		ring[(head + count) % PENDING_MAX] = r;
		count++;
		drain_locked();
	}
	pthread_mutex_unlock(&mu);
}

/* ---- exit ---------------------------------------------------------------- */
static void trace_exit(void)
{
	const char *w = getenv("COLOCATE_TRACE_WAIT_MS");
	uint64_t wait_ns = (uint64_t)(w && *w ? atoll(w) : 2000) * 1000000ull;
	uint64_t deadline = shim_now_ns() + wait_ns;
	uint64_t kernels, libs;
	struct timespec nap = { 0, 50000 };
	int late = 0;

	pthread_mutex_lock(&mu);
	if (!started || failed || getpid() != pid) {
		pthread_mutex_unlock(&mu);
		return;
	}
	/* the work still queued completes on its own: wait for it, bounded */
	while (count) {
		if (resolve_head_locked(0))
			continue;
		if (shim_now_ns() >= deadline) {
			late += count;
			while (count)
				resolve_head_locked(1);
			break;
		}
		pthread_mutex_unlock(&mu);
		nanosleep(&nap, NULL);
		pthread_mutex_lock(&mu);
	}
	flush_locked();
	if (records) {
		shim_task_counts(&kernels, &libs);
		shim_log("trace: %llu task record(s) (%llu kernel task(s), %llu library task(s) in "
			 "this process; %llu without device times%s) -> %s",
			 (unsigned long long)records, (unsigned long long)kernels,
			 (unsigned long long)libs, (unsigned long long)untimed,
			 late ? ", unfinished at exit" : "", path);
		records = untimed = 0;
	}
	pthread_mutex_unlock(&mu);
}
