/*
 * jsonline.h - build ONE JSON object in a fixed buffer and print it as one
 * line on stdout.  The GPU probes report every fact they gathered this way,
 * also when they stop early, so that bench/gpu_pool.py (or a person reading
 * a device command's output) always finds a whole line to parse.
 *
 * Plain data, no allocation: a probe may call this on any error path.
 * Keys are literals of ours; string values are escaped (driver error
 * strings could in principle hold quotes).  A value that does not fit is
 * dropped and the line says "truncated": true.
 */
#ifndef BENCH_GPU_JSONLINE_H
#define BENCH_GPU_JSONLINE_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define JL_CAP 8192

struct jl {
	char buf[JL_CAP];
	size_t len;
	int n;          /* members so far: a comma before every one but the first */
	int nmark;      /* n before the member being written (for a rollback) */
	int truncated;
};

static inline void jl_begin(struct jl *j)
{
	j->buf[0] = '{';
	j->len = 1;
	j->n = 0;
	j->nmark = 0;
	j->truncated = 0;
}

/* Append printf-formatted text; on overflow roll the member back to `mark`. */
static inline int jl_put(struct jl *j, size_t mark, const char *fmt, ...)
{
	va_list ap;
	int w;

	if (j->len >= JL_CAP - 32)
		goto full;
	va_start(ap, fmt);
	w = vsnprintf(j->buf + j->len, JL_CAP - 32 - j->len, fmt, ap);
	va_end(ap);
	if (w < 0 || (size_t)w >= JL_CAP - 32 - j->len)
		goto full;
	j->len += (size_t)w;
	return 0;
full:
	j->len = mark;
	j->n = j->nmark;	/* the member written since mark is gone */
	j->buf[j->len] = 0;
	j->truncated = 1;
	return -1;
}

static inline size_t jl_key(struct jl *j, const char *key)
{
	size_t mark = j->len;

	j->nmark = j->n;
	if (jl_put(j, mark, "%s\"%s\":", j->n ? "," : "", key) == 0)
		j->n++;
	return mark;
}

static inline void jl_null(struct jl *j, const char *key)
{
	size_t mark = jl_key(j, key);

	jl_put(j, mark, "null");
}

/* String value, escaped; NULL gives null. */
static inline void jl_str(struct jl *j, const char *key, const char *v)
{
	size_t mark;

	if (!v) {
		jl_null(j, key);
		return;
	}
	mark = jl_key(j, key);
	if (jl_put(j, mark, "\"") < 0)
		return;
	for (; *v; v++) {
		unsigned char c = (unsigned char)*v;
		int r;

		if (c == '"' || c == '\\')
			r = jl_put(j, mark, "\\%c", c);
		else if (c < 0x20 || c >= 0x7f)
			r = jl_put(j, mark, "\\u%04x", c);
		else
			r = jl_put(j, mark, "%c", c);
		if (r < 0)
			return;
	}
	jl_put(j, mark, "\"");
}

static inline void jl_int(struct jl *j, const char *key, long long v)
{
	size_t mark = jl_key(j, key);

	jl_put(j, mark, "%lld", v);
}

/* A count that is negative while not known: null then. */
static inline void jl_count(struct jl *j, const char *key, long long v)
{
	if (v < 0)
		jl_null(j, key);
	else
		jl_int(j, key, v);
}

/* Addresses as "0x..." strings (easier to read than 47-bit decimals);
 * 0, never a valid one, is null. */
static inline void jl_hex(struct jl *j, const char *key, unsigned long long v)
{
	size_t mark;

	if (!v) {
		jl_null(j, key);
		return;
	}
	mark = jl_key(j, key);
	jl_put(j, mark, "\"0x%llx\"", v);
}

/* A real; NaN (our "not measured") gives null. */
static inline void jl_num(struct jl *j, const char *key, double v)
{
	size_t mark = jl_key(j, key);

	if (isnan(v) || isinf(v))
		jl_put(j, mark, "null");
	else
		jl_put(j, mark, "%.6g", v);
}

/* Tri-state: 1 true, 0 false, anything else (not known) null. */
static inline void jl_bool(struct jl *j, const char *key, int v)
{
	size_t mark = jl_key(j, key);

	jl_put(j, mark, v == 1 ? "true" : v == 0 ? "false" : "null");
}

static inline void jl_print(struct jl *j)
{
	if (j->truncated) {
		j->len = j->len < JL_CAP - 32 ? j->len : JL_CAP - 32;
		j->len += (size_t)snprintf(j->buf + j->len, 32, "%s\"truncated\":true",
					   j->n ? "," : "");
	}
	fputs(j->buf, stdout);
	fputs("}\n", stdout);
	fflush(stdout);
}

#endif
