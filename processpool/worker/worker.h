/*
 * worker.h - colocate-worker: a process-pool worker that runs forwarded
 * kernel launches at a fixed SM quota.
 *
 *   colocate-worker --id N --quota Q --runtime-dir DIR
 *
 * On a GPU it is an MPS client started with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=Q;
 * on simgpu the same variable gives its quota in the device model.  It binds
 * a ZeroMQ ROUTER at ipc://DIR/worker-N.sock, writes DIR/worker-N.pid and
 * prints "READY worker N quota Q pid P" once its CUDA context exists.
 * Protocol: shim/proto/fwd_proto.h.
 *
 * Test hook: COLOCATE_WORKER_REFUSE=<text> refuses (softly, as a kernel
 * missing from its module) every DEFINE whose kernel name contains <text>;
 * tests use it to refuse one kernel of a real program.  Never set it in
 * production.
 *
 * Test hook: COLOCATE_WORKER_LOAD_DELAY_MS=<ms> makes every module load
 * (modules.c) take that much longer, as a big or JIT-compiled fat binary
 * would; tests use it to show that heartbeats, stats and other apps go on
 * during a load.  Never set it in production.
 *
 * Files, one job each:
 *   main.c      start-up, signals, the poll loop, heartbeats, shutdown
 *   frames.c    the socket: HELLO, BYE, stats; checks, replies, ERRORs
 *   app.c       one connected application: HELLO, its page, kernels, twins
 *   modules.c   the apps' fat binaries: checked, loaded, cached; kernels
 *   ring.c      an app's launch ring: MODULE, DEFINE and LAUNCH frames
 *               taken out of shared memory, checked and run
 *   launcher.c  an application's launcher thread: streams, ordering, marks
 *   times.c     device times of timed launches, into the app's page
 *   vmm.c       apps' VMM-shared device memory mapped here (the mem socket),
 *               pointer translation when the same address cannot be had
 *
 * Threads: the main thread owns the socket and the app table; each app has
 * one launcher thread that takes its MODULE, DEFINE and LAUNCH frames out
 * of the app's ring in shared memory and makes the CUDA calls, so one app's
 * module load or launch that blocks (simgpu blocks a launch whose argument
 * layout it does not know until the kernel starts) never delays another
 * app, a stats request or a heartbeat.  Completions reach the app through
 * its page, written by host functions in stream order.  Neither direction
 * involves the main thread or a message.
 */
#ifndef COLOCATE_WORKER_H
#define COLOCATE_WORKER_H

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "fwd_proto.h"

#define W_MAX_APPS    256
#define W_MAX_RID     256          /* zmq routing ids are at most 255 bytes */
#define W_MARKS       8192u        /* outstanding marks per stream (2^k)    */
#define W_MARK_FAILED (1ull << 63) /* the marked launch failed              */
#define W_MARK_TIMED  (1ull << 62) /* it is timed: its host function wakes
                                      the launcher to read its events      */
#define W_MARK_SEQ    (W_MARK_TIMED - 1)

/* A timed launch whose device time is not in the page yet. */
struct wtimed {
	uint64_t seq;
	cudaEvent_t ev[2];             /* start, end; NULL: it gets no time     */
};

struct wlib;

struct wkernel {
	void *handle;                  /* cudaKernel_t, NULL if none            */
	uint32_t mid;                  /* its module, or FWD_NO_MODULE          */
	uint16_t nparams;
	uint32_t argbytes;
	struct fwd_param *params;
	char *name;
};

/* A worker stream serving one stream index of one app. */
struct wstream {
	cudaStream_t s;
	cudaEvent_t ev;                /* for default-stream ordering           */
	int kind;                      /* FWD_SK_* of the app's stream          */
	int idx;
	int dirty;                     /* blocking: work the legacy stream has
	                                  not waited for yet                    */
	uint64_t seen_legacy;          /* legacy launches this one waited for   */
	struct wapp *app;
	uint64_t marks[W_MARKS];       /* seq of each pending host-function mark */
	uint64_t mhead;                /* launcher thread                       */
	_Atomic uint64_t mtail;        /* host functions                        */
	struct wtimed *timed;          /* W_MARKS of them once one is timed;   */
	uint64_t thead, ttail;         /* launcher thread only                  */
};

struct wapp {
	unsigned char rid[W_MAX_RID];
	size_t rid_len;
	int delim;                     /* its frames carry an empty delimiter  */
	uint32_t pid;
	char name[64];
	struct fwd_page *page;
	size_t map_len;
	unsigned char *ring;           /* launch ring, after the time slots     */
	uint32_t ring_size;
	unsigned char *frame;          /* a frame copied out of the ring        */
	int poisoned;                  /* launcher: a refused frame stopped it  */
	/* launcher thread only (the ring's MODULE and DEFINE frames); the
	 * main thread frees them once the launcher has finished */
	uint64_t mod_refused[FWD_MAX_MODULES / 64];  /* MODULE refused softly  */
	struct wkernel *kernels[FWD_MAX_KERNELS];    /* written once per id    */
	struct wlib *mods[FWD_MAX_MODULES];         /* module id -> library    */
	struct wstream *streams[FWD_MAX_STREAMS];   /* launcher thread only    */
	uint64_t legacy_launches;                   /* launcher thread only    */

	/* device times of timed launches (times.c); launcher thread only,
	 * but tmarks, counted by host functions */
	cudaEvent_t tzero;             /* this app's time zero, NULL: none yet  */
	int64_t tzero_ns;              /* CLOCK_MONOTONIC when it was recorded  */
	int tzero_failed;              /* could not make one: nothing is timed  */
	cudaEvent_t *evpool;           /* free timing events                    */
	unsigned nevpool, evcap;
	uint64_t tpending;             /* timed launches not yet in the page    */
	_Atomic uint64_t tmarks;       /* timed launches completed so far       */
	uint64_t tmarks_seen;          /* tmarks when the page was last updated */

	pthread_t thread;
	int thread_ok;
	int stop;                      /* leave once the ring is empty (BYE,
	                                  shutdown); atomic                     */
	int abandon;                   /* leave now: the app is gone (atomic)   */
	atomic_int finished;           /* launcher thread has cleaned up        */
	int closing;                   /* main thread: no longer routable       */
	uint64_t last_alive_check_ns;
	int vmm;                       /* HELLO said FWD_HF_VMM                 */
	uint64_t serial;               /* unique per app entry (main thread)    */
	int mem_paired;                /* main thread: its mem connection came  */
	_Atomic uint64_t translated;   /* launches with pointers translated     */
	int translate_said;            /* launcher thread: logged once          */
};

/* ---- main.c */
struct wglobal {
	uint32_t id;
	uint32_t quota;
	uint32_t pid;
	const char *rundir;
	void *sock;
	int closing;
	int on_simgpu;                 /* device memory is shared with apps     */
	int has_by_name;               /* DEFINEs without a module are found by
	                                  name (simgpu, unless
	                                  COLOCATE_WORKER_BY_NAME=0)            */
	void *(*kernel_by_name)(const char *);
	cudaError_t (*param_info)(const void *, size_t, size_t *, size_t *);
	int (*has_twin)(const char *);   /* simgpu: 1 twin, 0 none, -1 unknown   */
	void *(*kernel_define)(const char *, int, const unsigned *, const unsigned *);
	int (*map_peer)(const void *);  /* simgpu: (re)map an app's arena       */
	char device[4096];             /* realpath($SIMGPU_DIR) or ""           */
	uint64_t spin_ns;              /* an idle launcher polls this long      */
	_Atomic uint64_t executed;     /* kernels completed for apps            */
	int vmm_ok;                    /* mem socket up: VMM apps are taken     */
	char vmm_why[256];             /* why not                               */
	uint64_t vmm_base;             /* the colocate region here, 0 none      */
	_Atomic uint64_t vmm_moved;    /* mappings not at their app's address   */
	_Atomic uint64_t translated;   /* launches with pointers translated     */
	_Atomic uint64_t bad_frames;
	_Atomic uint64_t refused_kernels; /* DEFINEs refused softly            */
	/* COLOCATE_WORKER_REFUSE=<text> (a test hook, never for production):
	 * every DEFINE whose kernel name contains <text> is refused softly, as
	 * a kernel missing from its module would be */
	const char *refuse_hook;
};
extern struct wglobal wstate;

void w_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The CUDA context is unusable (a sticky error): leave at once, from any
 * thread, so that apps replay their unfinished launches locally and the
 * pool starts a fresh worker. */
void w_die(cudaError_t e) __attribute__((noreturn));
int w_sticky(cudaError_t e);
uint64_t w_now_ns(void);
#include "unixutil.h"


/* ---- frames.c */
void w_frames_drain(void);     /* receive and handle queued messages (4096 at most) */
void w_send(struct wapp *a, const unsigned char *rid, size_t rid_len, int delim,
	    const void *buf, size_t len);
void w_send_error(const unsigned char *rid, size_t rid_len, int delim, uint32_t code,
		  uint64_t seq, const char *msg);

/* ---- app.c */
struct wapp *w_app_find(const unsigned char *rid, size_t rid_len);
int  w_app_count(void);
/* HELLO: fills reply status and message; returns the app or NULL */
struct wapp *w_app_hello(const unsigned char *rid, size_t rid_len, int delim,
			 const struct fwd_hello *m, const char *page, const char *twins,
			 const char *device, const char *name, uint32_t *status,
			 char *msg, size_t msglen);
/* DEFINE: 0, or a FWD_E_* code with the reason in why.  FWD_E_MODULE is a
 * soft refusal (the kernel cannot be served here; see fwd_proto.h
 * "Refusals"), any other code a malformed frame. */
int  w_app_define(struct wapp *a, const struct fwd_define *m, const struct fwd_param *params,
		  const char *name, char *why, size_t whylen);
/* After a DEFINE of kid on a soft-refusal page: its verdict into the page
 * (refused_kid, then defines_done), page waiters woken.  refused: the
 * reason, logged (capped). */
void w_app_verdict(struct wapp *a, uint32_t kid, const char *refused);
/* MODULE refused softly: remembered, so DEFINEs naming it say why. */
void w_app_module_refused(struct wapp *a, uint32_t mid);
/* NULL when st is a file we may load (twins, modules), else why not */
const char *w_file_unsafe(const struct stat *st);
void w_app_close(struct wapp *a, int abandon);   /* BYE / app death / shutdown */
void w_apps_tick(uint64_t now);                  /* heartbeats, deaths, reaping */
int  w_apps_shutdown(uint64_t deadline_ns);     /* 1: every app finished */

/* ---- modules.c (launcher threads, but w_app_modules_drop) */
/* MODULE: 0, or a FWD_E_* code with the reason in why (logged); FWD_E_MODULE
 * is a soft refusal, any other code a malformed frame.  May wait for a load
 * of the same image that another app's launcher started. */
int  w_app_module(struct wapp *a, const struct fwd_module *m, const char *path, char *why,
		  size_t whylen);
/* k->handle from the app's module k->mid, its layout checked: 0 or FWD_E_* */
int  w_module_kernel(struct wapp *a, struct wkernel *k, char *why, size_t whylen);
void w_app_modules_drop(struct wapp *a);
unsigned w_modules_loaded(void);           /* libraries loaded now          */
uint64_t w_module_loads(void);             /* cudaLibraryLoadData calls made */

/* ---- launcher.c */
void *w_launcher(void *arg);
void w_launch(struct wapp *a, const struct fwd_launch *m, struct wkernel *k,
	      const unsigned char *args);

/* ---- times.c */
/* Before a timed launch on ws: its start event, recorded (ev[0] NULL when
 * it cannot be timed). */
void w_time_begin(struct wapp *a, struct wstream *ws, cudaEvent_t ev[2]);
/* After it (ok: the launch call succeeded): its end event, and the launch
 * queued for w_times_poll, which writes its time into the page. */
void w_time_end(struct wapp *a, struct wstream *ws, uint64_t seq, cudaEvent_t ev[2], int ok);
/* Write the times of the timed launches that completed, in stream order. */
void w_times_poll(struct wapp *a);
/* Some timed launch completed since the last poll (host functions say). */
int  w_times_due(struct wapp *a);
/* The launcher leaves: every event of the app goes (streams synchronised). */
void w_times_free(struct wapp *a);

/* ---- vmm.c */
#define W_VMM_MAX_CONNS 64
struct zmqdl_pollitem;
/* Reserve the colocate region, listen on the mem socket: 0, or -1 (logged;
 * wstate.vmm_why says why VMM apps are refused). */
int  w_vmm_init(void);
/* Poll items for the mem socket and its connections (max >= 1 + W_VMM_MAX_CONNS);
 * w_vmm_serve acts on what poll found in them. */
int  w_vmm_items(struct zmqdl_pollitem *it, int max);
void w_vmm_serve(const struct zmqdl_pollitem *it, int n);
void w_vmm_tick(void);                 /* unmap what apps that left had      */
void w_vmm_close(void);
uint64_t w_vmm_bad(void);              /* mem messages refused               */
/* MAP and UNMAP requests done, mappings live now (main thread) */
void w_vmm_counts(uint64_t *mapped, uint64_t *unmapped, uint64_t *live);
/* The launch's arguments with app pointers moved to this worker's
 * addresses, into out (argbytes): 1, or 0 when nothing needed it. */
int  w_vmm_translate(struct wapp *a, const unsigned char *args, uint32_t argbytes,
		     const struct wkernel *k, unsigned char *out);
/* app.c: an app of that pid is still here (its launcher may run) */
/* The mem socket's view of apps (main thread): the newest app entry of pid
 * with FWD_HF_VMM and no mem connection yet takes this one (its serial, or
 * 0: none); an app entry that may still launch (exists, launcher not
 * finished); a paired app whose mem connection closed leaves after its
 * queued launches (its shim closed that connection). */
uint64_t w_app_pair_mem(uint32_t pid);
int  w_app_serial_busy(uint64_t serial);
void w_app_mem_closed(uint64_t serial);

/* ---- ring.c */
/* Run what the ring holds: >0 frames taken, 0 empty, -1 refused (poisoned). */
int  w_ring_run(struct wapp *a);
int  w_ring_empty(struct wapp *a);
void w_ring_sleep(struct wapp *a, int (*wake_up)(struct wapp *));
void w_ring_kick(struct wapp *a);

#endif
