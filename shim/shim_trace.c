/*
 * shim_trace.c - the per-task trace: one JSON line per task when
 * COLOCATE_TRACE=<file> is set (`colocate trace` sets it), and the task
 * feed to the controller when its policy wants completed tasks (the feed
 * thread below); the records, events and resolving are shared.
 *
 * A task is bracketed by two events recorded on its stream through the
 * real event API (cudart's for runtime launches and library calls, the
 * driver's for driver launches), so its start and duration are device
 * time: modelled on simgpu, measured on a GPU.  A task routed to a pool
 * worker gets no event here: its launches go out timed and the worker
 * writes their device times into the connection's page (fwd_proto.h,
 * "times"; shim_fwd_span_*), which the record keeps mapped until resolved.  Nothing waits for them on
 * the launch path: records queue in issue order and are resolved when
 * they have completed, at the app's own synchronisations and at exit
 * (where the wait is bounded by COLOCATE_TRACE_WAIT_MS, default 2000).
 *
 * Lines are buffered and written with one write(2) per batch to a file
 * opened O_APPEND, so several processes of one command can share it.
 * Nothing here may crash or hang the app: a missing event API or a failed
 * event creation is logged once and tasks are then recorded without times;
 * a write error is logged once and turns tracing off.
 *
 * The trace must not change what the app sees either: every runtime call
 * it makes on an app thread keeps the thread's last error as it was
 * (ev_call), a stream being captured into a graph gets no events, and a
 * device reset makes it forget (never touch again) the events it had.
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
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <link.h>

#define PENDING_MAX  4096            /* records waiting for their events   */
#define POOL_MAX     (2 * PENDING_MAX + 8)
#define OUT_SIZE     (256 * 1024)
#define OUT_FLUSH    (192 * 1024)    /* write once this much is buffered   */
#define NAME_MAX_OUT 2048            /* longer kernel names are cut        */
#define APP_MAX_OUT  256             /* and app names                      */
#define KEY_MAX_OUT  64              /* and parameter names                */
/* The longest line we ever format, so that a flush before it means it is
 * never cut: each string byte may take 6 ("\u001f"); the app name; the
 * kernel name or the library's entry point (api[] is shorter); every
 * parameter as "key":number, (a number: at most 24 bytes); the rest (keys,
 * dims, ids, times) is well under LINE_FIXED.  emit_locked still drops a
 * line whole, counted, should it ever not fit. */
#define ESC_MAX      6
#define LINE_FIXED   1024
#define LINE_ROOM    (LINE_FIXED + ESC_MAX * (APP_MAX_OUT + NAME_MAX_OUT) + \
		      SHIM_TASK_MAX_PARAMS * (ESC_MAX * KEY_MAX_OUT + 4 + 24))
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
	/* optional: missing means "not capturing" */
	int (*capturing)(void *stream, int *status);
	int (*capturing_ptsz)(void *stream, int *status);
	/* runtime only: the thread's last error (the driver keeps none) */
	int (*peek)(void);
	int (*getlast)(void);
	/* optional, for the feed thread: the app's device (runtime) or context
	 * (driver) to take on, looked up here so that nothing under mu dlopens */
	int (*getcur)(void *out);
	int (*setcur)(void *arg);
	void *ref;                   /* the first start event: time zero      */
	int64_t ref_ns;              /* CLOCK_MONOTONIC when ref was recorded */
	void *pool[POOL_MAX];
	int npool;
	int create_failed;           /* said so (once)                         */
	int said_missing;
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
static uint64_t seq, records, untimed, dropped;
static uint64_t last_flush_ns;
static int pid;
static int started, atexit_n, events_seen, failed, file_failed, overflow;
static locale_t c_locale;
/* Where put() writes: the file's buffer, or the feed's (both under mu). */
static struct {
	char *buf;
	size_t *len;
	size_t size;
} ob;
/* Bumped by a device reset: events of an older generation died with the
 * context and are never recorded, queried, pooled or destroyed again. */
static uint32_t ev_gen;
/* Time zero of the process's start times (host clock, under mu): when its
 * first time-zero event was recorded, or the first forwarded task's
 * anchored start (fwd_proto.h) if that came first.  Each backend's event
 * times are moved onto it by the host time of their own ref, so local and
 * forwarded tasks share one axis (simgpu: exactly, its device clock is
 * shared; a GPU: up to the latency of recording each ref). */
static int64_t zero_ns;
static int zero_set;

static int64_t on_axis(int64_t anchored_ns)
{
	if (!zero_set) {
		zero_ns = anchored_ns;
		zero_set = 1;
	}
	return anchored_ns - zero_ns;
}

struct shim_flag_line shim_trace_flag;

/* The bits of shim_trace_flag.on: records are taken while any is set. */
#define ON_FILE 1u      /* COLOCATE_TRACE: lines to the file (shim_trace_to_file) */
#define ON_FEED 2u      /* the controller asked for task feedback           */

static int file_on(void)
{
	return (__atomic_load_n(&shim_trace_flag.on, __ATOMIC_ACQUIRE) & ON_FILE) != 0;
}

static int feed_on(void)
{
	return (__atomic_load_n(&shim_trace_flag.on, __ATOMIC_ACQUIRE) & ON_FEED) != 0;
}

static void feed_forget(void);
static void feed_stop_thread(void);
static int feed_put_locked(const struct shim_trace_rec *r, int timed, int64_t start_ns,
			   int64_t dur_ns, int force);
static void feed_start_locked(void);
static void feed_exit_locked(void);

int shim_trace_on(void)
{
	return shim_tracing();
}

/* ---- start-up ---------------------------------------------------------- */
__attribute__((constructor)) static void trace_ctor(void)
{
	shim_trace_init();
	/* a child has no feed until it registers itself (even when the
	 * parent took no record yet: after_fork_child is not installed then) */
	pthread_atfork(NULL, NULL, feed_forget);
}

void shim_trace_init(void)
{
	const char *p = getenv("COLOCATE_TRACE");

	if (!p || !*p)
		return;
	snprintf(path, sizeof(path), "%s", p);
	__atomic_or_fetch(&shim_trace_flag.on, ON_FILE, __ATOMIC_RELEASE);
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
	feed_forget();
	seq = records = untimed = dropped = 0;
	zero_set = 0;
	pid = getpid();
	for (b = SHIM_EV_RT; b <= SHIM_EV_DRV; b++) {
		api[b].ref = NULL;
		api[b].npool = 0;
		for (i = 0; i < POOL_MAX; i++)
			api[b].pool[i] = NULL;
	}
}

/* The file goes; the feed (if on) stays. */
static void turn_off(void)
{
	__atomic_and_fetch(&shim_trace_flag.on, ~ON_FILE, __ATOMIC_RELEASE);
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
		shim_log("trace: out of memory; tracing and task feedback off");
		failed = 1;
		__atomic_store_n(&shim_trace_flag.on, 0, __ATOMIC_RELEASE);
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

	if (file_failed)
		outlen = 0;     /* the file is off: nothing goes there */
	if (!outlen || file_failed)
		return;
	if (fd < 0) {
		/* O_NONBLOCK: a FIFO without a reader fails here (ENXIO) instead
		 * of blocking the app under mu; anything but a regular file is
		 * refused, so no write can block either */
		struct stat st;

		fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NONBLOCK, 0644);
		if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
			close(fd);
			fd = -1;
			errno = EINVAL;
			shim_log("trace: %s is not a regular file; tracing off", path);
		} else if (fd < 0) {
			shim_log("trace: cannot open %s: %s; tracing off", path, strerror(errno));
		}
		if (fd < 0) {
			file_failed = 1;
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
			file_failed = 1;
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

	if (*ob.len >= ob.size) {
		overflow = 1;
		return;
	}
	va_start(ap, fmt);
	n = vsnprintf(ob.buf + *ob.len, ob.size - *ob.len, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= ob.size - *ob.len) {
		overflow = 1;   /* cut: emit_locked drops the line */
		return;
	}
	*ob.len += (size_t)n;
}

static void put_str(const char *s, size_t max)
{
	size_t i;

	put("\"");
	for (i = 0; s[i] && i < max; i++) {
		unsigned char c = (unsigned char)s[i];

		if (*ob.len + 8 >= ob.size) {
			overflow = 1;
			return;
		}
		if (c == '"' || c == '\\')
			put("\\%c", c);
		else if (c < 0x20)
			put("\\u%04x", c);
		else
			ob.buf[(*ob.len)++] = (char)c;
	}
	put("\"");
}

static void put_num(double v)
{
	/* the range first: converting |v| >= 2^63 to long long is undefined */
	if (!isfinite(v))
		put("null");
	else if (fabs(v) < 9e15 && v == (double)(long long)v)
		put("%lld", (long long)v);
	else
		put("%.9g", v);
}

static void put_us(int64_t ns)
{
	put("%.3f", (double)ns / 1e3);
}

/* A task's fields after "kind": (the trace line and the feed share them). */
static void put_task(const struct shim_trace_rec *r, int timed, int64_t start_ns, int64_t dur_ns)
{
	int i;

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
			put_str(r->params[i].key, KEY_MAX_OUT);
			put(":");
			put_num(r->params[i].val);
		}
		put("},\"kernels\":%u,\"rc\":%d", r->nkernels, r->rc);
	}
}

/* One line; start/dur in ns, or < 0 when unknown (start may really be
 * negative: a task on another stream ahead of time zero). */
static void emit_locked(const struct shim_trace_rec *r, int timed, int64_t start_ns, int64_t dur_ns)
{
	locale_t old;
	size_t line;

	if (!file_on() || file_failed)
		return;
	old = uselocale(c_locale);   /* "%.3f" must print a dot */
	if (outlen + LINE_ROOM > OUT_SIZE)
		flush_locked();
	ob.buf = out, ob.len = &outlen, ob.size = OUT_SIZE;
	line = outlen;
	overflow = 0;
	put("{\"pid\":%d,\"app\":", pid);
	put_str(shim_app_name(), APP_MAX_OUT);
	put(",\"seq\":%llu,\"kind\":", (unsigned long long)seq);
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
		goto done;
	}
	put_task(r, timed, start_ns, dur_ns);
	put("}\n");
	if (!overflow) {
		records++;
		untimed += !timed;
	}
done:
	if (overflow) {
		outlen = line;  /* never half a line: drop it whole, counted */
		dropped++;
	} else {
		seq++;
	}
	uselocale(old);
}

/* ---- events -------------------------------------------------------------- */
/*
 * Every runtime call the trace makes on an app thread can set that thread's
 * last error (cudaEventQuery's cudaErrorNotReady on real cudart, a handle
 * that died, an event in a captured stream), which the app would then read
 * from its own cudaGetLastError/cudaPeekAtLastError.  So: peek before; if
 * ours failed and nothing was pending, take ours back out.  When the app
 * already had an error pending, ours may have replaced it - the runtime
 * has no way to put it back - but the app still sees an error, never a
 * spurious one.  The driver API keeps no last error (peek is NULL there).
 */
static int ev_call_begin(const struct evapi *a)
{
	shim_in_runtime++;
	return a->peek ? a->peek() : 0;
}

static int ev_call_end(const struct evapi *a, int saved, int rc)
{
	if (rc != 0 && saved == 0 && a->getlast)
		a->getlast();
	shim_in_runtime--;
	return rc;
}

#define EV_CALL(a, call) ({ int s_ = ev_call_begin(a); ev_call_end(a, s_, (call)); })

/* The runtime's functions through shim_real_rt(), as the hooks find them:
 * with a renamed, privately loaded libcudart (wheels vendor one) the trace
 * then uses the very instance the app's calls reach. */
#define RT(a, field, name) (*(void **)&(a)->field = shim_real_rt(name))
#define DRV(a, field, name) (*(void **)&(a)->field = shim_real_drv(name))

/* Once per backend, outside mu (pthread_once): lookups dlopen, and the
 * loader lock must never be taken while holding mu. */
static void lookup_rt(void)
{
	struct evapi *a = &api[SHIM_EV_RT];
	int ok;

	ok = RT(a, create, "cudaEventCreateWithFlags") && RT(a, record, "cudaEventRecord") &&
	     RT(a, query, "cudaEventQuery") && RT(a, elapsed, "cudaEventElapsedTime") &&
	     RT(a, destroy, "cudaEventDestroy") && RT(a, peek, "cudaPeekAtLastError") &&
	     RT(a, getlast, "cudaGetLastError");
	if (ok) {
		RT(a, record_ptsz, "cudaEventRecord_ptsz");
		RT(a, capturing, "cudaStreamIsCapturing");
		RT(a, capturing_ptsz, "cudaStreamIsCapturing_ptsz");
		RT(a, getcur, "cudaGetDevice");
		RT(a, setcur, "cudaSetDevice");
	}
	__atomic_store_n(&a->state, ok ? 1 : -1, __ATOMIC_RELEASE);
}

static void lookup_drv(void)
{
	struct evapi *a = &api[SHIM_EV_DRV];
	int ok;

	ok = DRV(a, create, "cuEventCreate") && DRV(a, record, "cuEventRecord") &&
	     DRV(a, query, "cuEventQuery") &&
	     (DRV(a, elapsed, "cuEventElapsedTime_v2") || DRV(a, elapsed, "cuEventElapsedTime")) &&
	     (DRV(a, destroy, "cuEventDestroy_v2") || DRV(a, destroy, "cuEventDestroy"));
	DRV(a, record_ptsz, "cuEventRecord_ptsz");
	DRV(a, capturing, "cuStreamIsCapturing");
	DRV(a, capturing_ptsz, "cuStreamIsCapturing_ptsz");
	DRV(a, getcur, "cuCtxGetCurrent");
	DRV(a, setcur, "cuCtxSetCurrent");
	__atomic_store_n(&a->state, ok ? 1 : -1, __ATOMIC_RELEASE);
}

static pthread_once_t once_rt = PTHREAD_ONCE_INIT, once_drv = PTHREAD_ONCE_INIT;

static int usable(int b)
{
	struct evapi *a = &api[b];
	int st = __atomic_load_n(&a->state, __ATOMIC_ACQUIRE);

	if (!st) {
		pthread_once(b == SHIM_EV_RT ? &once_rt : &once_drv,
			     b == SHIM_EV_RT ? lookup_rt : lookup_drv);
		st = __atomic_load_n(&a->state, __ATOMIC_ACQUIRE);
		/* the first thread to see it says it, once */
		if (st < 0 && !__atomic_exchange_n(&a->said_missing, 1, __ATOMIC_RELAXED))
			shim_log("trace: the %s has no event API; its tasks are recorded without "
				 "device times", a->what);
	}
	return st > 0;
}

/* Is a shared libcudart loaded, under its soname or a vendored name
 * (libcudart-<hash>.so.13)?  Looked for as shim_core.c looks for it. */
static int cudart_object(struct dl_phdr_info *info, size_t size, void *arg)
{
	const char *base = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;

	(void)size;
	(void)arg;
	base = base ? base + 1 : info->dlpi_name;
	return base && strncmp(base, "libcudart", 9) == 0;
}

static int have_rt;

static void find_rt(void)
{
	void *h = dlopen("libcudart.so.13", RTLD_NOLOAD | RTLD_LAZY);

	if (!h)
		h = dlopen("libcudart.so", RTLD_NOLOAD | RTLD_LAZY);
	if (h)
		dlclose(h);
	have_rt = h != NULL || dl_iterate_phdr(cudart_object, NULL) != 0;
}

int shim_trace_backend(int driver)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;
	int b = SHIM_EV_DRV;

	if (!driver) {
		/* runtime launches and library calls: cudart when the process
		 * has one (shared), else the driver (static cudart inside) */
		pthread_once(&once, find_rt);
		b = have_rt ? SHIM_EV_RT : SHIM_EV_DRV;
	}
	return usable(b) ? b : SHIM_EV_NONE;
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
	/* cudaEventDefault == CU_EVENT_DEFAULT: timed */
	rc = EV_CALL(a, a->create(&ev, 0));
	if (rc != 0) {
		if (!__atomic_exchange_n(&a->create_failed, 1, __ATOMIC_RELAXED))
			shim_log("trace: creating a %s event failed (error %d); tasks recorded without "
				 "device times while that lasts", a->what, rc);
		return NULL;
	}
	return ev;
}

/* Under mu.  An event of generation gen back to the pool; one from before
 * a device reset is simply forgotten (its context is gone). */
static void put_event_locked(int b, void *ev, uint32_t gen)
{
	struct evapi *a = &api[b];

	if (!ev || gen != ev_gen)
		return;
	if (a->npool < POOL_MAX) {
		a->pool[a->npool++] = ev;
		return;
	}
	EV_CALL(a, a->destroy(ev));
}

static void put_events(struct shim_trace_rec *r)
{
	if (r->backend == SHIM_EV_NONE)
		return;
	pthread_mutex_lock(&mu);
	put_event_locked(r->backend, r->ev[0], r->gen);
	put_event_locked(r->backend, r->ev[1], r->gen);
	pthread_mutex_unlock(&mu);
	r->ev[0] = r->ev[1] = NULL;
	r->backend = SHIM_EV_NONE;
}

static int record(int b, void *ev, void *stream, int ptsz)
{
	struct evapi *a = &api[b];

	return EV_CALL(a, ptsz && a->record_ptsz ? a->record_ptsz(ev, stream) : a->record(ev, stream));
}

/* A stream being captured into a graph must get no events: the record
 * would become a node of the graph, and the events could not be queried
 * or timed.  A failed check counts as capturing (e.g. the legacy stream
 * while another stream captures globally); a runtime without the call
 * (simgpu may lack it) captures nothing. */
static int capturing(int b, void *stream, int ptsz)
{
	struct evapi *a = &api[b];
	int (*fn)(void *, int *) = ptsz && a->capturing_ptsz ? a->capturing_ptsz : a->capturing;
	int status = 0;       /* cudaStreamCaptureStatusNone == CU_..._NONE */

	if (!fn)
		return 0;
	return EV_CALL(a, fn(stream, &status)) != 0 || status != 0;
}

/* ---- the queue ----------------------------------------------------------- */
void shim_trace_begin(struct shim_trace_rec *r, int backend, void *stream, int ptsz)
{
	struct evapi *a = &api[backend];
	uint32_t gen;

	r->backend = SHIM_EV_NONE;
	r->ev[0] = r->ev[1] = NULL;
	/* routed: the worker times its launches; no event here at all */
	if (backend == SHIM_EV_NONE && r->route)
		shim_fwd_span_open();
	pthread_mutex_lock(&mu);
	if (start_locked() < 0 || backend == SHIM_EV_NONE) {
		pthread_mutex_unlock(&mu);
		return;
	}
	if (!events_seen) {
		/* CUDA is up now.  Its own exit handlers were registered at its
		 * initialisation (again after a device reset); ours must run
		 * before them (atexit is LIFO).  trace_exit runs harmlessly
		 * more than once. */
		events_seen = 1;
		if (atexit_n < 4 && atexit(trace_exit) == 0)
			atexit_n++;
	}
	gen = r->gen = ev_gen;
	pthread_mutex_unlock(&mu);

	if (capturing(backend, stream, ptsz))
		return;         /* untimed: no events on that stream */
	r->ev[0] = get_event(backend);
	r->ev[1] = r->ev[0] ? get_event(backend) : NULL;
	r->backend = backend;
	if (!r->ev[1])
		goto untimed;
	if (!__atomic_load_n(&a->ref, __ATOMIC_ACQUIRE)) {
		void *ref = get_event(backend);
		int64_t t;

		if (!ref)
			goto untimed;
		t = (int64_t)shim_now_ns();
		if (record(backend, ref, stream, ptsz) != 0) {
			pthread_mutex_lock(&mu);
			put_event_locked(backend, ref, gen);
			pthread_mutex_unlock(&mu);
			goto untimed;
		}
		pthread_mutex_lock(&mu);
		if (!a->ref && gen == ev_gen) {
			a->ref_ns = t;
			on_axis(t);    /* the first ref: time zero */
			__atomic_store_n(&a->ref, ref, __ATOMIC_RELEASE);
		} else
			put_event_locked(backend, ref, gen);
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

	if (r->backend != SHIM_EV_NONE && r->gen == ev_gen && a->ref) {
		q = EV_CALL(a, a->query(r->ev[1]));
		if (q == 0 && EV_CALL(a, a->elapsed(&ms, r->ev[0], r->ev[1])) == 0) {
			dur = ms_to_ns(ms);
			q = EV_CALL(a, a->elapsed(&ms, a->ref, r->ev[0]));
			start = ms_to_ns(ms) + on_axis(a->ref_ns);
			timed = q == 0;
		}
		if (q == NOT_READY && !force)
			return 0;
	} else if (r->fwd.conn) {
		/* forwarded: the worker's times, from its page (never waits) */
		q = shim_fwd_span_time(&r->fwd, &start, &dur);
		if (q == 0 && !force)
			return 0;
		timed = q > 0;
		if (timed)
			start = on_axis(start);
	}
	/* the feed first: when its batch is full the record stays queued,
	 * events and all, for the next batch (queries are the file's only) */
	if ((r->kind == SHIM_TASK_KERNEL || r->kind == SHIM_TASK_LIBRARY) && feed_on() &&
	    !feed_put_locked(r, timed, start, dur, force))
		return 0;
	if (r->backend != SHIM_EV_NONE) {
		put_event_locked(r->backend, r->ev[0], r->gen);
		put_event_locked(r->backend, r->ev[1], r->gen);
	}
	shim_fwd_span_drop(&r->fwd);
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
	if (r->route)
		shim_fwd_span_close(&r->fwd);   /* its forwarded launches */
	if (!ok) {
		put_events(r);
		shim_fwd_span_drop(&r->fwd);
		return;
	}
	if (r->backend != SHIM_EV_NONE &&
	    (r->gen != __atomic_load_n(&ev_gen, __ATOMIC_RELAXED) ||
	     record(r->backend, r->ev[1], stream, ptsz) != 0))
		put_events(r);  /* a reset came in between: events are dead */
	pthread_mutex_lock(&mu);
	if (start_locked() < 0 || !shim_tracing()) {
		pthread_mutex_unlock(&mu);
		put_events(r);
		shim_fwd_span_drop(&r->fwd);
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
	if (feed_on())
		feed_start_locked();
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

/*
 * Called from colocate_query_end_v1, possibly inside a cudaLaunchHostFunc
 * callback where CUDA calls are forbidden: only queue the line, never
 * resolve (resolving queries events).  The next sync or exit writes it.
 * A full queue (thousands of tasks and no sync) drops it, counted.
 */
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
	if (start_locked() == 0 && file_on()) {
		if (count < PENDING_MAX) {
			ring[(head + count) % PENDING_MAX] = r;
			count++;
		} else {
			dropped++;
		}
	}
	pthread_mutex_unlock(&mu);
}

/* ---- settling: exit and device reset --------------------------------------- */
/* mu within about ns, else -1: exit() may run on a thread that already
 * holds it (a signal handler interrupted shim_trace_end), and then waiting
 * for it would hang the exit for ever. */
static int lock_bounded(uint64_t ns)
{
	uint64_t deadline = shim_now_ns() + ns;
	struct timespec nap = { 0, 1000000 };

	while (pthread_mutex_trylock(&mu) != 0) {
		if (shim_now_ns() >= deadline)
			return -1;
		nanosleep(&nap, NULL);
	}
	return 0;
}

#define LOCK_WAIT_NS 200000000ull

/* Under mu (held again on return when 0): write every queued record,
 * waiting up to wait_ns for the work still queued to complete on its own,
 * then giving up the times of the rest.  Returns the records given up,
 * or -1 when mu could not be had back (then it is not held). */
static long settle_locked(uint64_t wait_ns)
{
	uint64_t deadline = shim_now_ns() + wait_ns;
	struct timespec nap = { 0, 50000 };
	long late = 0;

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
		if (lock_bounded(LOCK_WAIT_NS) < 0)
			return -1;
	}
	return late;
}

static uint64_t wait_ms(void)
{
	const char *w = getenv("COLOCATE_TRACE_WAIT_MS");

	return (uint64_t)(w && *w ? atoll(w) : 2000);
}

/*
 * cudaDeviceReset destroys the context and with it every event: those in
 * the pool, those of queued records, ref.  Before the real reset (the
 * events are still alive): write what completes within the wait, then
 * forget them all; the next task creates fresh ones and a new time zero.
 * Records begun before and ended after the reset (another thread) see a
 * newer generation and go untimed.  Both backends: the runtime's context
 * is the driver's primary context.
 */
void shim_trace_device_reset(void)
{
	int b;

	pthread_mutex_lock(&mu);
	if (started && !failed && getpid() == pid && settle_locked(wait_ms() * 1000000ull) < 0)
		return;         /* mu not held: nothing else can be done */
	for (b = SHIM_EV_RT; b <= SHIM_EV_DRV; b++) {
		api[b].npool = 0;
		__atomic_store_n(&api[b].ref, NULL, __ATOMIC_RELEASE);
	}
	__atomic_store_n(&ev_gen, ev_gen + 1, __ATOMIC_RELEASE);
	zero_set = 0;           /* the next ref (or forwarded task) is time zero */
	events_seen = 0;        /* CUDA registers its exit handlers again */
	if (started && !failed)
		flush_locked();
	pthread_mutex_unlock(&mu);
}

/* ---- exit ---------------------------------------------------------------- */
static void trace_exit(void)
{
	uint64_t kernels, libs;
	long late;

	feed_stop_thread();     /* from here on, settling sends the feed's batches */
	if (lock_bounded(LOCK_WAIT_NS) < 0) {
		shim_log("trace: the trace lock stayed busy at exit (exit from a signal handler?); "
			 "the last records are not written");
		return;
	}
	if (!started || failed || getpid() != pid) {
		pthread_mutex_unlock(&mu);
		return;
	}
	/* the work still queued completes on its own: wait for it, bounded */
	late = settle_locked(wait_ms() * 1000000ull);
	if (late < 0) {
		shim_log("trace: the trace lock stayed busy at exit; the last records are not written");
		return;
	}
	flush_locked();
	feed_exit_locked();
	if (records || dropped) {
		shim_task_counts(&kernels, &libs);
		char drops[64] = "";

		if (dropped)
			snprintf(drops, sizeof(drops), "; %llu line(s) dropped",
				 (unsigned long long)dropped);
		shim_log("trace: %llu task record(s) (%llu kernel task(s), %llu library task(s) in "
			 "this process; %llu without device times%s%s) -> %s",
			 (unsigned long long)records, (unsigned long long)kernels,
			 (unsigned long long)libs, (unsigned long long)untimed,
			 late ? ", unfinished at exit" : "", drops, path);
		records = untimed = dropped = 0;
	}
	pthread_mutex_unlock(&mu);
}

/* ---- the feed: completed tasks to the controller, live ---------------------- */
/*
 * On when the controller's reply to "register" says "feed": true (the
 * policy wants on_task_done).  Records are taken and timed exactly as for
 * the file; a feed thread, started at the first record, resolves what has
 * completed every FEED_POLL_NS (a non-blocking event query: never a wait)
 * and sends it as one "tasks" message over the controller socket
 * (shim_ctl_send: one-way, never blocking).  One message per poll, at most
 * FEED_BYTES of tasks: a fuller batch leaves the rest queued for the next,
 * unless the queue of records is full (the app outruns the thread): the app
 * thread then sends the full batch itself.
 *
 * Nothing queues without bound: a message the socket refuses is dropped
 * and its tasks counted (the next message says how many in "dropped");
 * the controller gone (its pid, checked every FEED_ALIVE_NS), the feed
 * turns itself off.  At exit the thread stops first and what completes
 * within the trace's wait goes out from the exiting thread.  A forked
 * child has no thread and no feed until it registers itself.
 *
 * Event calls here run on the feed thread, whose last error is its own:
 * the app's cudaGetLastError never sees them (ev_call keeps it tidy too).
 */
#define FEED_BYTES    (60 * 1024)   /* tasks per message: schema.MAX_BYTES is 64 KiB */
#define FEED_MSG_ROOM (FEED_BYTES + 256)
#define FEED_POLL_NS  500000L       /* 0.5 ms                                  */
#define FEED_ALIVE_NS 100000000ull  /* controller liveness, every 100 ms       */

static char *feed_buf;              /* "{task},{task}..." under mu             */
static size_t feed_len;
static unsigned feed_n;             /* tasks in feed_buf                       */
static uint64_t feed_seq;           /* tasks fed or dropped so far: "n"        */
static uint64_t feed_dropped, feed_sent, feed_msgs;
static pthread_t feed_tid;
static int feed_live;               /* the thread runs (under mu)              */
static int feed_stop;               /* asks it to return (atomic)              */
static int feed_dev = -1;           /* the app thread's device, for the thread */
static void *feed_ctx;              /* and its driver context                  */
static int tried;                   /* to start the thread (once a process)    */

int shim_trace_feed_count(uint64_t *sent, uint64_t *dropped_out, uint64_t *msgs)
{
	pthread_mutex_lock(&mu);
	*sent = feed_sent;
	*dropped_out = feed_dropped;
	*msgs = feed_msgs;
	pthread_mutex_unlock(&mu);
	return feed_live;
}

void shim_trace_feed_on(void)
{
	__atomic_or_fetch(&shim_trace_flag.on, ON_FEED, __ATOMIC_RELEASE);
}

/* Off for good in this process (the controller is gone); mu held or not. */
static void feed_off(const char *why)
{
	if (__atomic_fetch_and(&shim_trace_flag.on, ~ON_FEED, __ATOMIC_ACQ_REL) & ON_FEED)
		shim_log("feed: %s; task feedback off (%llu task(s) sent, %llu dropped)", why,
			 (unsigned long long)feed_sent, (unsigned long long)feed_dropped);
}

/* Fork child: the parent's thread, batch and counts are not ours. */
static void feed_forget(void)
{
	__atomic_and_fetch(&shim_trace_flag.on, ~ON_FEED, __ATOMIC_RELEASE);
	feed_len = feed_n = 0;
	feed_seq = feed_dropped = feed_sent = feed_msgs = 0;
	feed_live = 0;
	feed_stop = 0;
	tried = 0;
}

/* Under mu.  The batch as one message into dst (cap FEED_MSG_ROOM); the
 * batch is emptied.  Returns the tasks in it (0: nothing to send). */
static unsigned feed_take_locked(char *dst, size_t cap)
{
	unsigned n = feed_n;
	int w;

	if (!n)
		return 0;
	w = snprintf(dst, cap, "{\"v\":1,\"type\":\"tasks\",\"pid\":%d,\"slot\":%d,\"dropped\":%llu,"
		     "\"tasks\":[%.*s]}", pid, shim_ctl_slot(), (unsigned long long)feed_dropped,
		     (int)feed_len, feed_buf);
	feed_len = feed_n = 0;
	if (w < 0 || (size_t)w >= cap) {
		feed_dropped += n;   /* cannot happen: the batch is bounded */
		shim_ledger_feed(feed_seq, feed_sent, feed_dropped);
		return 0;
	}
	return n;
}

/* After a send of n tasks (rc from shim_ctl_send).  Under mu. */
static void feed_sent_locked(unsigned n, int rc)
{
	if (rc == 0) {
		feed_sent += n;
		feed_msgs++;
	} else {
		feed_dropped += n;
	}
	shim_ledger_feed(feed_seq, feed_sent, feed_dropped);
}

/* Under mu, from a thread that may send (exit, or no feed thread). */
static void feed_flush_locked(void)
{
	static char msg[FEED_MSG_ROOM];
	unsigned n = feed_take_locked(msg, sizeof(msg));

	if (n)
		feed_sent_locked(n, shim_ctl_send(msg));
}

/* Under mu: one resolved task into the batch.  1 done (queued, sent or
 * dropped and counted), 0 the batch is full and the thread sends it soon:
 * leave the record queued (unless force). */
static int feed_put_locked(const struct shim_trace_rec *r, int timed, int64_t start_ns,
			   int64_t dur_ns, int force)
{
	locale_t old;
	size_t line;
	int tries;

	if (!feed_buf && !(feed_buf = malloc(FEED_BYTES))) {
		feed_dropped++;
		feed_seq++;
		shim_ledger_feed(feed_seq, feed_sent, feed_dropped);
		return 1;
	}
	old = uselocale(c_locale);
	for (tries = 0; tries < 2; tries++) {
		ob.buf = feed_buf, ob.len = &feed_len, ob.size = FEED_BYTES;
		line = feed_len;
		overflow = 0;
		put("%s{\"n\":%llu,\"kind\":", feed_len ? "," : "", (unsigned long long)feed_seq);
		put_task(r, timed, start_ns, dur_ns);
		put("}");
		if (!overflow) {
			feed_n++;
			feed_seq++;
			uselocale(old);
			return 1;
		}
		feed_len = line;
		if (!feed_n)
			break;          /* one task larger than a message: never */
		if (feed_live && !force) {
			uselocale(old);
			return 0;
		}
		/* no thread (exit), or the app outruns it (the queue is full):
		 * this thread sends the batch, in order, under mu */
		feed_flush_locked();
	}
	feed_dropped++;
	feed_seq++;
	shim_ledger_feed(feed_seq, feed_sent, feed_dropped);
	uselocale(old);
	return 1;
}

static void *feed_main(void *arg)
{
	struct timespec nap = { 0, FEED_POLL_NS };
	char *msg = malloc(FEED_MSG_ROOM);
	uint64_t last_alive = shim_now_ns();
	unsigned n;
	int rc;

	(void)arg;
	if (!msg)
		goto out;
	/* the device (runtime) and context (driver) the app's records live on:
	 * a thread starts on device 0 with no context */
	if (feed_dev >= 0 && api[SHIM_EV_RT].setcur)
		EV_CALL(&api[SHIM_EV_RT], ((int (*)(int))(void *)api[SHIM_EV_RT].setcur)(feed_dev));
	if (feed_ctx && api[SHIM_EV_DRV].setcur)
		api[SHIM_EV_DRV].setcur(feed_ctx);
	while (!__atomic_load_n(&feed_stop, __ATOMIC_ACQUIRE)) {
		nanosleep(&nap, NULL);
		pthread_mutex_lock(&mu);
		/* stop asked while it waited for mu: exit may be tearing the
		 * context down, so no CUDA call from here on */
		if (!feed_on() || getpid() != pid || __atomic_load_n(&feed_stop, __ATOMIC_ACQUIRE)) {
			pthread_mutex_unlock(&mu);
			break;
		}
		drain_locked();
		/* sent under mu (shim_ctl_send never blocks): an app thread
		 * that must send a full batch itself cannot overtake this one */
		n = feed_take_locked(msg, FEED_MSG_ROOM);
		rc = n ? shim_ctl_send(msg) : 0;
		if (n)
			feed_sent_locked(n, rc);
		pthread_mutex_unlock(&mu);
		if (rc < 0 || shim_now_ns() - last_alive >= FEED_ALIVE_NS) {
			last_alive = shim_now_ns();
			if (!shim_ctl_alive()) {
				feed_off("the controller is gone");
				break;
			}
		}
	}
out:
	free(msg);
	pthread_mutex_lock(&mu);
	__atomic_store_n(&feed_live, 0, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&mu);
	return NULL;
}

/* Under mu, on an app thread that just queued a record: the thread, once. */
static void feed_start_locked(void)
{
	pthread_attr_t at;
	sigset_t all, old;

	if (feed_live || tried || getpid() != pid)
		return;
	tried = 1;
	/* the getters were looked up with the event API (outside mu) */
	if (api[SHIM_EV_RT].state > 0 && api[SHIM_EV_RT].getcur) {
		int dev = -1;

		if (EV_CALL(&api[SHIM_EV_RT], api[SHIM_EV_RT].getcur(&dev)) == 0)
			feed_dev = dev;
	}
	if (api[SHIM_EV_DRV].state > 0 && api[SHIM_EV_DRV].getcur &&
	    api[SHIM_EV_DRV].getcur(&feed_ctx) != 0)
		feed_ctx = NULL;
	/* the app's signals are the app's threads' business */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&at);
	pthread_attr_setstacksize(&at, 256 * 1024);
	feed_stop = 0;
	if (pthread_create(&feed_tid, &at, feed_main, NULL) == 0)
		__atomic_store_n(&feed_live, 1, __ATOMIC_RELEASE);
	else
		shim_log("feed: cannot start its thread; tasks are sent at syncs and exit only");
	pthread_attr_destroy(&at);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* At exit, before mu: the thread returns (bounded: it may be waiting for
 * mu held by the very thread that exits). */
static void feed_stop_thread(void)
{
	struct timespec ts;
	int live;

	/* no mu here: exit may come on a thread that holds it */
	live = __atomic_load_n(&feed_live, __ATOMIC_ACQUIRE) && getpid() == pid;
	if (!live)
		return;
	__atomic_store_n(&feed_stop, 1, __ATOMIC_RELEASE);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += 300000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	if (pthread_timedjoin_np(feed_tid, NULL, &ts) != 0)
		shim_log("feed: its thread did not stop at exit");
}

/* Under mu, at exit after settling: the last batch. */
static void feed_exit_locked(void)
{
	if (feed_live)
		return;         /* still running (did not stop): it sends it */
	if (feed_on())
		feed_flush_locked();
}
