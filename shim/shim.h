/*
 * shim.h - internals shared by the files of libcolocate.so.
 *
 *   shim_core.c   state, lazy start-up, logging, finding the real functions
 *   shim_ctl.c    the control path: ZeroMQ messages to the controller
 *   shim_names.c  kernel handle -> device name table, allocation sizes
 *   hook_rt.c     CUDA runtime API hooks (what nvcc 13 emits)
 *   hook_drv.c    driver API hooks: dlsym, cuGetProcAddress, launches, memory
 *
 * The launch path touches only this process's counter line of the shared
 * control block (ctlblock.h) and a process-local table: no lock, no syscall,
 * no Python.
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
	uint64_t launches;
};

/* Register key (host stub, cudaKernel_t, CUfunction) under a device name. */
struct shim_kernel *shim_kernel_add(const void *key, const char *name);
/* Make key2 an alias of key's entry (e.g. cudaKernel_t of a host stub). */
void shim_kernel_alias(const void *key, const void *key2);
struct shim_kernel *shim_kernel_find(const void *key);
/* Visit every kernel launched at least once. */
void shim_kernel_each(void (*fn)(const struct shim_kernel *k, void *arg), void *arg);
int shim_kernel_table_full(void);
/* Forked child: zero the inherited per-kernel counts, re-create the locks. */
void shim_names_after_fork(void);

/* One successful launch of the kernel known by key (may be unknown). */
static inline void shim_count_launch(const void *key)
{
	struct shim_kernel *k = shim_kernel_find(key);

	shim_add(&shim_ctr->launches, 1);
	if (k)
		shim_add(&k->launches, 1);
}

/* Device allocations: size remembered so that a free can subtract it. */
void shim_alloc_note(const void *ptr, size_t size);
void shim_free_note(const void *ptr);

void shim_sync_note(void);

/* --- control path (shim_ctl.c) --------------------------------------- */
/* Register with the controller; on success returns the slot index in
 * <runtime dir>/ctlblock; on failure returns -1 and a reason in why. */
int shim_ctl_register(char *why, size_t whylen);
/* Tell the controller this process is exiting (best effort, bounded). */
void shim_ctl_exit(void);
/* Forget the parent's connection in a forked child. */
void shim_ctl_forget(void);
const char *shim_runtime_dir(void);

#endif
