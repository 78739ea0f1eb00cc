/*
 * shim_trace_int.h - what the per-task trace's four files share:
 *
 *   shim_trace.c         the queue of records, start-up, settling, exit
 *   shim_trace_json.c    the JSON writer: trace lines and the file
 *   shim_trace_events.c  the event backends (runtime or driver) and time zero
 *   shim_feed.c          the feed thread: completed tasks to the controller
 *
 * Locking: one mutex, trace_mu (shim_trace.c), covers the state of all
 * four; a function named *_locked expects it held.  Event API calls and
 * dlopen-ing lookups happen outside it.
 */
#ifndef COLOCATE_SHIM_TRACE_INT_H
#define COLOCATE_SHIM_TRACE_INT_H

#include <pthread.h>
#include <stdint.h>

#include "shim_trace.h"

#define TRACE_PENDING_MAX 4096      /* records waiting for their events */

enum { TRACE_REC_QBEGIN = 10, TRACE_REC_QEND = 11 };   /* query lines share the queue */

/* The bits of shim_trace_flag.on: records are taken while any is set. */
#define TRACE_ON_FILE 1u    /* COLOCATE_TRACE: lines to the file (shim_trace_to_file) */
#define TRACE_ON_FEED 2u    /* the controller asked for task feedback           */

static inline int trace_file_on(void)
{
	return (__atomic_load_n(&shim_trace_flag.on, __ATOMIC_ACQUIRE) & TRACE_ON_FILE) != 0;
}

static inline int trace_feed_on(void)
{
	return (__atomic_load_n(&shim_trace_flag.on, __ATOMIC_ACQUIRE) & TRACE_ON_FEED) != 0;
}

/* --- the queue (shim_trace.c) --------------------------------------------- */

extern pthread_mutex_t trace_mu;
extern int trace_pid;           /* the process the state belongs to (forks) */
/* Resolve and hand on what has completed, in order (never waits). */
void trace_drain_locked(void);

/* --- the writer (shim_trace_json.c) --------------------------------------- */

/* Its buffer and the C locale; -1 when out of memory. */
int trace_json_start(void);
/* Fork child: the parent's buffered lines and counts are the parent's. */
void trace_json_forget(void);
/* Write what is buffered to the file. */
void trace_json_flush_locked(void);
/* Write it if the buffer is nearly full or, at_sync, if it is old. */
void trace_json_flush_due_locked(int at_sync);
/* One record as a line; start/dur in ns, or < 0 when unknown. */
void trace_json_line_locked(const struct shim_trace_rec *r, int timed, int64_t start_ns,
			    int64_t dur_ns);
/* A line that never made it into the queue, counted. */
void trace_json_drop_locked(void);
/* At exit: the tally of this process's lines, to the log (late: records
 * whose times were given up); the counts start over. */
void trace_json_report_locked(long late);
/* One task as the feed sends it, {"n":n,"kind":...}, appended to buf
 * (after a comma unless *len is 0): 0, or -1 when it does not fit within
 * size (buf is then as it was). */
int trace_json_feed_task(char *buf, size_t *len, size_t size, uint64_t n,
			 const struct shim_trace_rec *r, int timed, int64_t start_ns, int64_t dur_ns);

/* --- the event backends (shim_trace_events.c) ------------------------------ */

/* Bumped by a device reset: events of an older generation died with the
 * context and are never recorded, queried, pooled or destroyed again. */
extern uint32_t trace_ev_gen;
/* Time zero (on first use) and a CLOCK_MONOTONIC-anchored time on it. */
int64_t trace_axis(int64_t anchored_ns);
/* Outside trace_mu (r->gen read under it): r's start event recorded on
 * stream; anything that fails leaves r untimed. */
void trace_ev_begin(struct shim_trace_rec *r, int backend, void *stream, int ptsz);
/* Outside trace_mu: r's end event recorded, or its events given back. */
void trace_ev_end(struct shim_trace_rec *r, void *stream, int ptsz);
/* Outside trace_mu: r's events back to the pool; r untimed. */
void trace_ev_put(struct shim_trace_rec *r);
/* r's events back to the pool (r keeps its fields). */
void trace_ev_put_locked(const struct shim_trace_rec *r);
/* r's times from its events: -1 it has none alive, 0 not complete yet, 1
 * read (*timed says whether times came, in *start_ns and *dur_ns). */
int trace_ev_times_locked(const struct shim_trace_rec *r, int64_t *start_ns, int64_t *dur_ns,
			  int *timed);
/* cudaDeviceReset: every event is forgotten, time zero too. */
void trace_ev_reset_locked(void);
/* Fork child: the parent's events are the parent's. */
void trace_ev_forget(void);
/* The app thread's device and driver context (*dev untouched, *ctx NULL
 * when unknown), and taking them on another thread. */
void trace_ev_where(int *dev, void **ctx);
void trace_ev_go_to(int dev, void *ctx);

/* --- the feed (shim_feed.c) ----------------------------------------------- */

/* Fork child: no thread, no batch, no feed until it registers itself. */
void trace_feed_forget(void);
/* At exit, before trace_mu: the thread returns (bounded). */
void trace_feed_stop(void);
/* One resolved task into the batch: 1 done, 0 the batch is full and the
 * thread sends it soon (leave the record queued; never when force). */
int trace_feed_put_locked(const struct shim_trace_rec *r, int timed, int64_t start_ns,
			  int64_t dur_ns, int force);
/* On an app thread that just queued a record: the thread, once. */
void trace_feed_start_locked(void);
/* At exit after settling: the last batch. */
void trace_feed_exit_locked(void);

#endif
