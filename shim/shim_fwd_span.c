/*
 * shim_fwd_span.c - the device times of routed tasks.  A task routed to a
 * worker (shim_trace.c) opens a span on its thread; its launches then go
 * out timed (FWD_LF_TIMED) and the span gathers the first and the last of
 * them, holding a reference to their connection, whose page the worker
 * writes their times into (fwd_proto.h, "times").  The task's record
 * keeps the span until its times are read, never waiting for them.
 *
 * Locking: none.  A span is its thread's own (thread-local) until it is
 * closed into a record, which the trace's lock then covers; the page is
 * read with atomics (fconn_time).
 */
#define _GNU_SOURCE
#include "shim_fwd.h"
#include "shim_trace.h"

#include <string.h>

/* The routed task open on this thread (shim_fwd_span_open), if span_on:
 * its launches go out timed and are gathered here. */
static __thread struct shim_fwd_span span;
static __thread int span_on;

int fwd_span_timed(void)
{
	return span_on;
}

uint32_t fwd_span_count(void)
{
	return span.n;
}

void fwd_span_local(uint32_t n)
{
	if (span_on && span.n == n)
		span.untimed++;
}

void fwd_span_forget(void)
{
	memset(&span, 0, sizeof(span));   /* its reference is the parent's */
	span_on = 0;
}

void fwd_span_add(struct fconn *c, uint64_t seq, uint32_t sidx)
{
	if (!span.conn) {
		fconn_get(c);
		span.conn = c;
		span.first = seq;
		span.sfirst = (uint16_t)sidx;
	} else if (span.conn != c) {
		span.untimed++;    /* two workers: two time bases */
	}
	span.last = seq;
	span.slast = (uint16_t)sidx;
	span.n++;
}

void shim_fwd_span_open(void)
{
	if (span.conn)
		fconn_put(span.conn);   /* a task left open (cannot happen) */
	memset(&span, 0, sizeof(span));
	span_on = 1;
}

void shim_fwd_span_close(struct shim_fwd_span *s)
{
	if (span_on)
		*s = span;
	else
		memset(s, 0, sizeof(*s));
	memset(&span, 0, sizeof(span));
	span_on = 0;
}

void shim_fwd_span_drop(struct shim_fwd_span *s)
{
	if (s->conn)
		fconn_put(s->conn);
	s->conn = NULL;
}

/* Library tasks: first start to last end (what events of ours around the
 * call would measure, gaps and all), not the sum of the kernels. */
int shim_fwd_span_time(const struct shim_fwd_span *s, int64_t *start_ns, int64_t *dur_ns)
{
	int64_t s1, d1, s2, d2;
	int r;

	if (!s->conn || !s->n || s->untimed)
		return -1;
	r = fconn_time(s->conn, s->first, s->sfirst, &s1, &d1);
	if (r <= 0)
		return r;
	if (s->last != s->first) {
		r = fconn_time(s->conn, s->last, s->slast, &s2, &d2);
		if (r <= 0)
			return r;
		d1 = s2 + d2 - s1;
		if (d1 < 0)
			d1 = 0;   /* the last launch, on another stream, ended first */
	}
	*start_ns = s1;
	*dur_ns = d1;
	return 1;
}
