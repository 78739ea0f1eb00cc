/*
 * shim_trace_json.c - the trace's JSON writer: one line per task (and per
 * query boundary, and with COLOCATE_TRACE_OPS=1 per copy, memset and sync)
 * into a buffer, written to the COLOCATE_TRACE file, and the same task
 * fields for the feed's messages.
 *
 * Lines are buffered and written with one write(2) per batch to a file
 * opened O_APPEND, so several processes of one command can share it.
 * A line is never cut: it goes whole or is dropped, counted.  A write
 * error is logged once and turns tracing to the file off (the feed, if
 * on, stays).  Numbers are printed in the C locale, whatever the app's.
 *
 * Locking: everything here is under trace_mu (shim_trace_int.h).
 */
#define _GNU_SOURCE
#include "shim_trace_int.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define OUT_SIZE     (256 * 1024)
#define OUT_FLUSH    (192 * 1024)    /* write once this much is buffered   */
#define NAME_MAX_OUT 2048            /* longer kernel names are cut        */
#define APP_MAX_OUT  256             /* and app names                      */
#define KEY_MAX_OUT  64              /* and parameter names                */
/* The longest line we ever format, so that a flush before it means it is
 * never cut: each string byte may take 6 ("\u001f"); the app name; the
 * kernel name or the library's entry point (api[] is shorter); every
 * parameter as "key":number, (a number: at most 24 bytes); the rest (keys,
 * dims, ids, times) is well under LINE_FIXED.  trace_json_line_locked
 * still drops a line whole, counted, should it ever not fit. */
#define ESC_MAX      6
#define LINE_FIXED   1024
#define LINE_ROOM    (LINE_FIXED + ESC_MAX * (APP_MAX_OUT + NAME_MAX_OUT) + \
		      SHIM_TASK_MAX_PARAMS * (ESC_MAX * KEY_MAX_OUT + 4 + 24))
#define FLUSH_EVERY_NS 1000000000ull /* and at a sync after this long      */

static char path[PATH_MAX];
static int fd = -1;
static char *out;
static size_t outlen;
static uint64_t seq, records, untimed, dropped;
static uint64_t last_flush_ns;
static int file_failed, overflow;
static locale_t c_locale;
int shim_trace_ops_on;
/* Where put() writes: the file's buffer, or the feed's. */
static struct {
	char *buf;
	size_t *len;
	size_t size;
} ob;

void shim_trace_init(void)
{
	const char *p = getenv("COLOCATE_TRACE");

	if (!p || !*p)
		return;
	snprintf(path, sizeof(path), "%s", p);
	p = getenv("COLOCATE_TRACE_OPS");
	shim_trace_ops_on = p && *p && strcmp(p, "0") != 0;
	__atomic_or_fetch(&shim_trace_flag.on, TRACE_ON_FILE, __ATOMIC_RELEASE);
}

int trace_json_start(void)
{
	out = malloc(OUT_SIZE);
	c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
	last_flush_ns = shim_now_ns();
	return out && c_locale ? 0 : -1;
}

void trace_json_forget(void)
{
	outlen = 0;
	seq = records = untimed = dropped = 0;
}

/* The file goes; the feed (if on) stays. */
static void turn_off(void)
{
	__atomic_and_fetch(&shim_trace_flag.on, ~TRACE_ON_FILE, __ATOMIC_RELEASE);
}

void trace_json_flush_locked(void)
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
		overflow = 1;   /* cut: trace_json_line_locked drops the line */
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

/* A copy, memset or sync's fields after "kind": (untimed: what the host did). */
static void put_op(const struct shim_trace_rec *r)
{
	static const char *const dirs[] = { "h2h", "h2d", "d2h", "d2d" };
	static const char *const kinds[] = { "copy", "memset", "sync" };

	put("\"%s\",\"api\":", kinds[r->kind - SHIM_OP_COPY]);
	put_str(r->api, sizeof(r->api));
	if (r->kind == SHIM_OP_COPY)
		put(",\"dir\":\"%s\"", r->op_dir >= 0 && r->op_dir <= 3 ? dirs[r->op_dir] : "?");
	if (r->kind != SHIM_OP_SYNC)
		put(",\"bytes\":%llu,\"blocking\":%s", (unsigned long long)r->op_bytes,
		    r->op_blocking ? "true" : "false");
	put(",\"stream\":\"0x%llx\",\"host_us\":", (unsigned long long)(uintptr_t)r->stream);
	put_us((int64_t)r->host_ns);
	put(",\"wait_us\":");
	put_us(r->latency_ns);
	put(",\"query\":");
	if (r->has_query)
		put("%llu", (unsigned long long)r->query);
	else
		put("null");
}

/* One line; start/dur in ns, or < 0 when unknown (start may really be
 * negative: a task on another stream ahead of time zero). */
void trace_json_line_locked(const struct shim_trace_rec *r, int timed, int64_t start_ns,
			    int64_t dur_ns)
{
	locale_t old;
	size_t line;

	if (!trace_file_on() || file_failed)
		return;
	old = uselocale(c_locale);   /* "%.3f" must print a dot */
	if (outlen + LINE_ROOM > OUT_SIZE)
		trace_json_flush_locked();
	ob.buf = out, ob.len = &outlen, ob.size = OUT_SIZE;
	line = outlen;
	overflow = 0;
	put("{\"pid\":%d,\"app\":", trace_pid);
	put_str(shim_app_name(), APP_MAX_OUT);
	put(",\"seq\":%llu,\"kind\":", (unsigned long long)seq);
	if (r->kind == TRACE_REC_QBEGIN || r->kind == TRACE_REC_QEND) {
		put("\"%s\",\"id\":%llu", r->kind == TRACE_REC_QBEGIN ? "query_begin" : "query_end",
		    (unsigned long long)r->query);
		if (r->kind == TRACE_REC_QBEGIN || r->shmem)
			put(",\"size\":%llu", (unsigned long long)r->shmem);
		put(",\"rule\":\"%s\",\"host_us\":", r->api);
		put_us((int64_t)r->host_ns);
		if (r->kind == TRACE_REC_QEND) {
			put(",\"latency_us\":");
			if (r->latency_ns >= 0)
				put_us(r->latency_ns);
			else
				put("null");
		}
		put("}\n");
		goto done;
	}
	if (r->kind >= SHIM_OP_COPY && r->kind <= SHIM_OP_SYNC) {
		put_op(r);
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

void trace_json_flush_due_locked(int at_sync)
{
	if (outlen >= OUT_FLUSH ||
	    (at_sync && outlen && shim_now_ns() - last_flush_ns > FLUSH_EVERY_NS))
		trace_json_flush_locked();
}

void trace_json_drop_locked(void)
{
	dropped++;
}

void trace_json_report_locked(long late)
{
	uint64_t kernels, libs;

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
}

int trace_json_feed_task(char *buf, size_t *len, size_t size, uint64_t n,
			 const struct shim_trace_rec *r, int timed, int64_t start_ns, int64_t dur_ns)
{
	locale_t old = uselocale(c_locale);
	size_t line = *len;

	ob.buf = buf, ob.len = len, ob.size = size;
	overflow = 0;
	put("%s{\"n\":%llu,\"kind\":", line ? "," : "", (unsigned long long)n);
	put_task(r, timed, start_ns, dur_ns);
	put("}");
	uselocale(old);
	if (overflow) {
		*len = line;
		return -1;
	}
	return 0;
}
