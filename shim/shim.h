/*
 * shim.h - internals shared by the files of libcolocate.so.
 *
 *   shim_core.c   state, lazy start-up, logging, finding the real functions
 *   shim_ctl.c    the control path: ZeroMQ messages to the controller
 *   shim_ledger.c this app's ledger (ledger.h): kernel table, query and task
 *                 counts, exit - what must reach the controller even when
 *                 messages are dropped or the process is SIGKILLed
 *   shim_names.c  kernel handle -> device name table, allocation sizes
 *   hook_rt.c     CUDA runtime API hooks (what nvcc 13 emits)
 *   hook_drv.c    driver API hooks: dlsym, cuGetProcAddress, launches, memory
 *   shim_fwd.c    launch forwarding to process-pool workers: routes, fences,
 *                 replay (and the files shim_fwd.h names: holds, task
 *                 times, one connection to a worker, ...)
 *   shim_part.c   SM partitions inside the app (route kind partition):
 *                 green contexts, shadow streams, order kept by events
 *   zmqdl.c       libzmq loaded with dlopen (shared with colocate-worker)
 *
 * The launch path touches only this process's counter line of the shared
 * control block (ctlblock.h) and a process-local table: no lock, no syscall,
 * no Python.  Routed to a worker, a launch takes the forwarding path instead
 * (a mutex and a copy into shared memory; still no syscall unless the
 * worker's launcher sleeps and must be woken).
 */
#ifndef COLOCATE_SHIM_H
#define COLOCATE_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "ctlblock.h"

#define SHIM_API __attribute__((visibility("default")))

/* Counters of this process: the shared slot once registered, a private
 * line before that (or for ever, when no controller is reachable). */
extern struct cb_counters *shim_ctr;
extern struct cb_control *shim_ctl;

/* Non-zero while a runtime hook is inside the real runtime: the driver hooks
 * then do not count again what the runtime hook already counted. */
extern __thread int shim_in_runtime __attribute__((tls_model("initial-exec")));
/* Evaluate expr (a call into the real runtime or driver) as "inside the
 * runtime": hooks it lands in again count nothing. */
#define IN_RUNTIME(expr) ({ __typeof__(expr) r_; shim_in_runtime++; r_ = (expr); shim_in_runtime--; r_; })

/* Start-up: cheap after the first call (one relaxed load). */
void shim_start_slow(void);
extern int shim_started;
static inline void shim_start(void)
{
	if (__builtin_expect(!__atomic_load_n(&shim_started, __ATOMIC_ACQUIRE), 0))
		shim_start_slow();
}

/* Logging to stderr with a "colocate: " prefix; silenced by COLOCATE_QUIET=1. */
void shim_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The real definition of a runtime/driver function: dlsym(RTLD_NEXT), else
 * the already-loaded library (RTLD_LOCAL loads hide it from RTLD_NEXT). */
void *shim_real_rt(const char *name);
void *shim_real_drv(const char *name);
/* The same for any library: RTLD_NEXT, then the sonames in libs (NULL-ended)
 * loaded RTLD_LOCAL, then any loaded object whose file name starts with
 * prefix (one with `prefer` in its name first, e.g. ".so.13"). */
void *shim_real_in(const char *const *libs, const char *prefix, const char *prefer,
		   const char *name);
/* glibc's dlsym, since this library overrides dlsym itself. */
typedef void *(*shim_dlsym_fn)(void *, const char *);
shim_dlsym_fn shim_glibc_dlsym(void);
void *shim_dlsym(void *handle, const char *name);

static inline uint64_t shim_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline void shim_add(uint64_t *p, uint64_t v)
{
	__atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

static inline void shim_add_signed(int64_t *p, int64_t v)
{
	__atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}

/* --- kernel names (shim_names.c) ------------------------------------- */
struct shim_kernel {
	const char *name;       /* mangled device name, or "?" when unknown */
	uint64_t *count;        /* its launch counter: the entry in the ledger
	                           (shim_ledger.c), else launches below     */
	uint64_t launches;      /* the private counter                      */
	void *fwd;              /* forwarding's view (shim_fwd.c), under its lock */
	int32_t module;         /* its fat binary's id (below), -1 none     */
	uint32_t gen;           /* bumped when a re-registration changes its
	                           module or name: forwarding's view is then
	                           stale and rebuilt (a new kernel id)       */
};

/* --- modules (shim_names.c): the fat binaries the app registered ------ */
/* A module id is an index in this table and, as is, the forwarding
 * protocol's module id (FWD_MAX_MODULES, checked in shim_fwd.c). */
#define SHIM_MAX_MODULES 1024u
/* __cudaRegisterFatBinary returned handle for wrapper: remember the image
 * it points to when it is a sound fat binary (no copy, no CUDA call, no
 * allocation: this runs in static constructors, under the loader lock). */
void shim_module_register(void **handle, const void *wrapper);
/* __cudaRegisterVar/__cudaRegisterManagedVar under handle: its module has
 * device variables (a worker's copy of them would not be the app's). */
void shim_module_note_vars(void **handle);
/* 1 when module mid registered device variables. */
int  shim_module_has_vars(int mid);
/* __cudaUnregisterFatBinary: the image may go; its module is gone. */
void shim_module_unregister(void **handle);
/* The module registered under handle (the newest), or -1. */
int  shim_module_of(void **handle);
/* Module mid's image and its bytes (fatbin header included): 0, or -1
 * when there is none (never registered, or unregistered since). */
int  shim_module_image(int mid, const void **image, uint64_t *size);
/* __cudaRegisterFunction: key's entry (made if new), tied to module mid
 * (-1: none) and named name.  A key registered again under another module
 * or name (its library unloaded and loaded again, maybe another one at the
 * same address) takes them, and its gen moves on. */
struct shim_kernel *shim_kernel_register(const void *key, const char *name, int mid);

/* Register key (host stub, cudaKernel_t, CUfunction) under a device name. */
struct shim_kernel *shim_kernel_add(const void *key, const char *name);
/* Make key2 an alias of key's entry (e.g. cudaKernel_t of a host stub). */
void shim_kernel_alias(const void *key, const void *key2);
struct shim_kernel *shim_kernel_find(const void *key);
/* A key never registered: its name from the runtime (cudaFuncGetName), or "?". */
struct shim_kernel *shim_kernel_learn(const void *key);
/* Visit every kernel launched at least once. */
void shim_kernel_each(void (*fn)(const struct shim_kernel *k, void *arg), void *arg);
int shim_kernel_table_full(void);
/* Forked child: zero the inherited per-kernel counts, re-create the locks. */
void shim_names_after_fork(void);

/* One successful launch of the kernel known by key (may be unknown).
 * Like every counting helper, it counts only in the outermost hook: a
 * runtime that calls its own exported entry points (simgpu's cudaMallocPitch
 * calls cudaMalloc) lands in our hooks again, with shim_in_runtime > 0. */
/* n launches of kernel k (a graph launch counts each kernel node). */
static inline void shim_count_kernel(struct shim_kernel *k, uint64_t n)
{
	shim_add(&shim_ctr->launches, n);
	if (k)
		shim_add(__atomic_load_n(&k->count, __ATOMIC_RELAXED), n);
}

static inline void shim_count_launch(const void *key)
{
	struct shim_kernel *k;

	if (shim_in_runtime)
		return;
	k = shim_kernel_find(key);
	if (__builtin_expect(!k, 0))
		k = shim_kernel_learn(key);
	shim_add(&shim_ctr->launches, 1);
	if (k)
		shim_add(__atomic_load_n(&k->count, __ATOMIC_RELAXED), 1);
}

/* A kernel's launches so far. */
static inline uint64_t shim_kernel_launches(const struct shim_kernel *k)
{
	return __atomic_load_n(__atomic_load_n(&k->count, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}

/* Device allocations: size remembered so that a free can subtract it. */
void shim_alloc_note(const void *ptr, size_t size);
/* A free: take the record before the real call, settle it after. */
void *shim_free_take(const void *ptr);
void shim_free_done(void *token, int freed);

void shim_sync_note(void);

/* --- the ledger (shim_ledger.c, layout in ledger.h) ------------------- */
/* Map <runtime dir>/apps/<slot>-<pid>.ledger after registration: 0, or -1
 * and a reason in why.  Then shim_names_attach() moves the kernel counters. */
int  shim_ledger_attach(int slot, char *why, size_t whylen);
int  shim_ledger_on(void);
/* A new entry's counter (under the kernel table's lock), or NULL. */
uint64_t *shim_ledger_kernel(const char *name, uint64_t launches);
void shim_ledger_query_begin(int api);
void shim_ledger_query_end(int api, int64_t latency_ns);
void shim_ledger_msg_dropped(void);
void shim_ledger_feed(uint64_t fed, uint64_t sent, uint64_t dropped);
void shim_ledger_exit(int (*has_twin)(const char *));
void shim_ledger_forget(void);
/* Every kernel known so far counts into the ledger from now on. */
void shim_names_attach(void);

/* --- control path (shim_ctl.c) --------------------------------------- */
/* What the controller's answer to "register" asks of this process; the
 * start-up (shim_core.c) hands each part to the file that owns it, so the
 * control path depends on no other part of the shim. */
struct shim_settings {
	int feed;               /* the policy wants completed tasks (task feed) */
	uint32_t fwd_window;    /* routed launches in flight at most; 0: default */
	int partitions;         /* quotas are SM partitions in the app         */
};
/* Register with the controller; on success returns the slot index in
 * <runtime dir>/ctlblock and fills *set; on failure returns -1 and a
 * reason in why. */
int shim_ctl_register(struct shim_settings *set, char *why, size_t whylen);
/* Tell the controller this process is exiting (best effort, bounded). */
void shim_ctl_exit(void);
/* A one-way message (JSON) to the controller after registration, without
 * blocking; 0 sent, -1 not. */
int shim_ctl_send(const char *json);
/* Forget the parent's connection in a forked child. */
void shim_ctl_forget(void);
/* This process's slot (-1 when not registered). */
int shim_ctl_slot(void);
/* Is the controller we registered with still running?  (Its pid, from the
 * reply to "register"; else whether its socket still listens.)  Costs a
 * kill(2) and a /proc read: call it every few ms at most. */
int shim_ctl_alive(void);
const char *shim_runtime_dir(void);

/* --- launch forwarding (shim_fwd.c, shim_fwd_conn.c) ------------------ */
/*
 * The launch fast path asks one question: is the slot's route_epoch the one
 * for which this process already knows it runs locally?  shim_fwd_epoch is
 * that epoch, or ~0 while launches must take shim_fwd_launch() (routed to a
 * worker, or an error waits to be reported).  So route == 0 costs one
 * relaxed load of the slot's control line more than before forwarding.
 */
extern uint64_t shim_fwd_epoch;
/* Non-zero while forwarded work may be outstanding or an error is pending:
 * copies, memsets, syncs and event records then fence first. */
extern int shim_fwd_busy;

static inline int shim_fwd_check(void)
{
	return __builtin_expect(__atomic_load_n(&shim_ctl->route_epoch, __ATOMIC_RELAXED) !=
				__atomic_load_n(&shim_fwd_epoch, __ATOMIC_RELAXED), 0);
}

static inline int shim_fwd_active(void)
{
	return __builtin_expect(__atomic_load_n(&shim_fwd_busy, __ATOMIC_RELAXED), 0);
}

/* Which hook a launch came through: how to run it locally and replay it. */
enum shim_entry {
	SHIM_E_NVCC = 1,        /* __cudaLaunchKernel[_ptsz] (cudaKernel_t)  */
	SHIM_E_LAUNCH,          /* cudaLaunchKernel[_ptsz]                   */
	SHIM_E_COOP,            /* cudaLaunchCooperativeKernel[_ptsz]        */
	SHIM_E_EXC,             /* cudaLaunchKernelExC[_ptsz]                */
	SHIM_E_GRAPH,           /* cudaGraphLaunch[_ptsz]: never forwarded   */
};

struct shim_launch {
	int entry;              /* enum shim_entry                           */
	int ptsz;               /* the _ptsz variant: stream 0 is per-thread */
	const void *key;        /* host stub, cudaKernel_t or graph exec     */
	void *real;             /* the real entry point the hook would call  */
	uint32_t grid[3], block[3];
	size_t shmem;
	void *stream;
	void **args;
	const void *config;     /* SHIM_E_EXC: the cudaLaunchConfig_t        */
};

/* Run a launch as its hook would have, locally, and count it (shim_task.c):
 * what the hooks do when not routed, and what forwarding does with a
 * launch that stays local while routed.  Returns its cudaError_t. */
int shim_launch_local(const struct shim_launch *l);

/* A launch while shim_fwd_check() says so: forwards it, or runs it locally
 * in order with forwarded work; counts it.  Returns its cudaError_t.  A
 * route of CB_ROUTE_HOLD makes it wait here first (see ctlblock.h). */
int shim_fwd_launch(const struct shim_launch *l);
/* Act on a route change now, at a launch boundary (a hold waits here), so
 * that what the task layer records about the launch is what happens.
 * Returns 1 when launches go through shim_fwd_launch (routed to a worker
 * or an error pending), else 0. */
int shim_fwd_follow(void);
/* At most n (1..4096) routed launches in flight (the controller's "fwd_window"). */
void shim_fwd_set_window(uint32_t n);

/* A driver-API kernel launch (cuLaunchKernel*) while shim_fwd_active():
 * on an SM partition, the shadow stream to launch it on instead, with
 * fwd.mu held until shim_fwd_drv_end(its CUresult) -- a failure there
 * (counted) means the caller launches it on the app's stream, as it does
 * when this returns NULL.  Driver launches are never forwarded. */
void *shim_fwd_drv_begin(void *stream, int ptsz, int *eager);
void shim_fwd_drv_end(void *stream, int ptsz, int eager, int code);
/* A driver launch that stays on all SMs (cooperative, a graph): counted
 * when partitioned. */
void shim_fwd_drv_all_sms(void);

/* Scopes of a fence before a local operation. */
#define SHIM_FENCE_STREAM 0     /* the stream, with default-stream rules  */
#define SHIM_FENCE_ALL    1     /* every stream (device sync, cudaFree)   */
/* Before a local operation on stream s: wait for the forwarded work it must
 * follow.  Returns a pending error to report instead (once), else 0. */
int shim_fwd_fence(void *stream, int ptsz, int scope);
/* After an asynchronous local operation queued on s while routed: the next
 * forwarded launch on s waits for it first. */
void shim_fwd_local_done(void *stream, int ptsz);
/* A whole-device sync (cudaDeviceSynchronize) returned successfully. */
void shim_fwd_synced(void);
/* Forwarded work on s not finished yet (cudaStreamQuery). */
int shim_fwd_pending(void *stream, int ptsz);
/* Drain and leave the worker at exit; forget everything in a fork child. */
void shim_fwd_exit(void);
void shim_fwd_forget(void);

#endif
