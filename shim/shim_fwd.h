/*
 * shim_fwd.h - internals shared by the forwarding client's files:
 *
 *   shim_fwd.c          routes, launches, fences, the window of launches
 *                       not yet completed and their local replay
 *   shim_fwd_hold.c     holds: launches wait while the route says so
 *   shim_fwd_span.c     routed tasks' device times, from the worker's page
 *   shim_fwd_conn.c     one connection to a worker: socket, completion
 *                       page, HELLO, liveness, waiting on the page
 *   shim_fwd_twins.c    the simgpu twin libraries a worker is told about
 *   shim_fwd_modfile.c  module files: the fat binaries a worker loads
 *
 * Locking: shim_fwd.c's mutex (fwd.mu, fwd_lock) covers its state, the
 * holds' and every send; a connection's socket has its own small mutex
 * (taken inside the first, or alone by a fence that waits without the
 * first), so a thread waiting for a stream never stops another thread's
 * launches.  A connection is
 * reference-counted: a waiter keeps the page mapped while the route moves
 * on under it.
 */
#ifndef COLOCATE_SHIM_FWD_H
#define COLOCATE_SHIM_FWD_H

#include <pthread.h>
#include <stdint.h>

#include "fwd_proto.h"
#include "shim.h"

struct fconn {
	int refs;                      /* atomic                               */
	uint32_t worker;               /* the route (worker id)                */
	uint32_t worker_pid;
	uint32_t quota;
	void *sock;
	pthread_mutex_t sock_mu;
	struct fwd_page *page;
	unsigned char *ring;           /* launch ring after the time slots     */
	uint32_t ring_size;
	size_t map_len;
	int lost;                      /* the worker said this connection lost
	                                  work (any ERROR frame); atomic       */
	int gone;                      /* closed without BYE: what it did not
	                                  finish will never be timed; atomic   */
	char lost_why[200];
	int vmm;                       /* HELLO said FWD_HF_VMM                 */
	int memfd;                     /* its mem socket (shim_vmm.c), or -1    */
	int failed_reported;           /* page->failed_seq turned into an error */
	uint64_t defined[FWD_MAX_KERNELS / 64];  /* DEFINE sent, by kernel id */
	uint64_t shipped[FWD_MAX_MODULES / 64];  /* MODULE sent, by module id */
	uint64_t refused[FWD_MAX_KERNELS / 64];  /* DEFINE refused by the worker:
	                                            runs locally while this
	                                            connection lives          */
	uint64_t ndefines;             /* DEFINEs sent (page defines_done)     */
	uint64_t last_check_ns;
	/* fconn_time: the completed launch whose time has not come yet, since
	 * when (callers resolve in order, so one is enough); atomic */
	uint64_t late_key;
	uint64_t late_since_ns;
};

struct fwait {
	uint32_t idx;                  /* stream index                          */
	uint64_t seq;                  /* wait until done[idx] >= seq           */
};

/* Connect to worker `worker` and say HELLO; NULL with a reason. */
struct fconn *fconn_open(uint32_t worker, char *why, size_t whylen);
void fconn_get(struct fconn *c);
void fconn_put(struct fconn *c);
/* Put one MODULE, DEFINE or LAUNCH frame into the connection's launch
 * ring, waiting for room while the worker lives; -1 when the worker is
 * lost or the frame is larger than half the ring. */
int fconn_send(struct fconn *c, const void *buf, size_t len);
/* Read what the worker sent (ERROR frames mark the connection lost). */
void fconn_poll(struct fconn *c);
/* 1 with a reason when the worker is gone, hung, or lost work. */
int fconn_lost(struct fconn *c, char *why, size_t whylen);
/* The same without a socket poll or a /proc read (route changes). */
int fconn_lost_quick(struct fconn *c, char *why, size_t whylen);
/* Wait until every done[w[i].idx] >= w[i].seq: 0, or -1 (lost, why). */
int fconn_wait(struct fconn *c, const struct fwait *w, int n, char *why, size_t whylen);
/* Wait until the worker has judged every DEFINE sent (page defines_done >=
 * c->ndefines): 0, or -1 (lost, why).  Then fconn_refused() tells. */
int fconn_wait_defines(struct fconn *c, char *why, size_t whylen);
/* The worker refused kernel kid's DEFINE (valid after fconn_wait_defines). */
static inline int fconn_refused(const struct fconn *c, uint32_t kid)
{
	return (__atomic_load_n(&c->page->refused_kid[kid / 64], __ATOMIC_ACQUIRE) >> (kid % 64)) & 1;
}
static inline int fconn_done(const struct fconn *c, uint32_t idx, uint64_t seq)
{
	return __atomic_load_n(&c->page->done[idx], __ATOMIC_ACQUIRE) >= seq;
}
/* Device time of timed launch seq on stream idx from the page: 1 and the
 * times, 0 not yet, -1 never (no time was taken, or the worker is gone). */
int fconn_time(struct fconn *c, uint64_t seq, uint32_t idx, int64_t *start_ns, int64_t *dur_ns);
/* Leave: BYE when the worker should expect nothing more from us (it has
 * finished our work), then drop the route's reference.  A reference held
 * elsewhere (a trace record) keeps the page mapped. */
void fconn_close(struct fconn *c, int bye);
/* "<exe>.twins.so" (if it exists), loaded twin libraries, and
 * $SIMGPU_TWINS, absolute, ':'-joined, for HELLO (shim_fwd_twins.c). */
void fconn_twins(char *out, size_t outlen);
/* Make sure the module image (size bytes) is in its file in the runtime
 * dir, <dir>/modules/<hash>-<size>.fatbin (shim_fwd_modfile.c): an
 * existing sound file of that size is taken as is, else the image is
 * written (temp file, rename).  0 with its hash and path, or -1 with a
 * reason. */
int fconn_module_file(const void *image, uint64_t size, uint64_t *hash, char *path,
		      size_t pathlen, char *why, size_t whylen);
/* Forget the process's ZeroMQ context in a fork child. */
void fconn_forget(void);
/* Polling before sleeping, in ns: 30 us with more than 4 cores, else 2 us. */
uint64_t shim_fwd_spin_ns(void);

/* --- the forwarding state's lock and view (shim_fwd.c) --------------------- */

/* Take fwd.mu: 0, or -1 when this thread already holds it (a hook reached
 * from inside the real runtime). */
int fwd_lock(void);
void fwd_unlock(void);
/* The fast path's view of the state (shim_fwd_epoch, shim_fwd_busy) from
 * it; fwd.mu held. */
void fwd_publish(void);

/* --- the app's streams (shim_fwd.c), fwd.mu held --------------------------- */

struct fstream {
	uint64_t key;                   /* handle value, or per-thread key      */
	void *handle;                   /* what the real runtime is given       */
	uint8_t kind;                   /* FWD_SK_*                             */
	uint8_t local_pending;          /* local work queued since last synced  */
	uint64_t last_seq;              /* last launch forwarded on it          */
};

/* Stream s's entry (made at first sight; its index never changes), or NULL
 * when the table is full or the runtime does not know the handle. */
struct fstream *fwd_stream(void *s, int ptsz);
/* The table and its length. */
struct fstream *fwd_streams(uint32_t *n);
/* The default-stream rules tie work on streams of kinds a and b: one is the
 * legacy stream and the other blocking (per-thread default streams and
 * streams made without cudaStreamNonBlocking), so each waits for the
 * other's earlier work. */
int fwd_streams_tied(uint8_t a, uint8_t b);

/* --- holds (shim_fwd_hold.c), fwd.mu held ------------------------------------ */

/* The route at epoch says hold: launches wait from now on. */
void fwd_hold_begin(uint64_t epoch);
/* It ends (any new epoch): the time held goes into the slot's held_ns. */
void fwd_hold_end(void);
/* A hold is in force (not given up, not ended). */
int fwd_held(void);
/* Wait, without fwd.mu, for the route to change from epoch: 1 act on the new
 * one, 0 run locally (the controller is gone, or COLOCATE_HOLD_MAX_MS). */
int fwd_hold_wait(uint64_t epoch);
/* Fork child: no hold, nobody waiting. */
void fwd_hold_forget(void);

/* --- this thread's routed task (shim_fwd_span.c) ---------------------------- */

/* A routed task is open on this thread: its launches go out timed. */
int fwd_span_timed(void);
/* Timed launch seq, on stream sidx of connection c, is the task's. */
void fwd_span_add(struct fconn *c, uint64_t seq, uint32_t sidx);
/* Launches gathered so far, and: the launch since count n was not
 * forwarded and timed (it ran here), so the task goes untimed. */
uint32_t fwd_span_count(void);
void fwd_span_local(uint32_t n);
/* Fork child: the parent's span (and its reference) are not ours. */
void fwd_span_forget(void);

#endif
