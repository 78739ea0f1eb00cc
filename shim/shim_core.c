/*
 * shim_core.c - state, lazy start-up, logging and real-symbol lookup.
 *
 * The shim starts at the first intercepted CUDA call, not in a constructor:
 * LD_PRELOAD is inherited by every child of the wrapped command (shells,
 * compilers, ...), and only processes that really use CUDA should register
 * with the controller.
 */
#define _GNU_SOURCE
#include "shim.h"
#include "shim_part.h"
#include "shim_trace.h"
#include "unixutil.h"

#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct cb_counters local_ctr __attribute__((aligned(CB_LINE)));
static struct cb_control local_ctl __attribute__((aligned(CB_LINE)));
struct cb_counters *shim_ctr = &local_ctr;
struct cb_control *shim_ctl = &local_ctl;
int shim_started;
/* initial-exec: a preloaded library gets static TLS, and the launch path
 * then pays no __tls_get_addr call */
__thread int shim_in_runtime __attribute__((tls_model("initial-exec")));

static pthread_mutex_t start_lock = PTHREAD_MUTEX_INITIALIZER;
static struct cb_block *block;
static int quiet = -1;

void shim_log(const char *fmt, ...)
{
	va_list ap;

	if (quiet < 0) {
		const char *q = getenv("COLOCATE_QUIET");
		quiet = q && *q && strcmp(q, "0") != 0;
	}
	if (quiet)
		return;
	va_start(ap, fmt);
	colocate_vlog("colocate", (unsigned)getpid(), fmt, ap);
	va_end(ap);
}

/* ------------------------------------------------------------------ */
/* glibc's own dlsym: we export a dlsym override (hook_drv.c), so every plain
 * call to dlsym inside this library would land there. */
static shim_dlsym_fn real_dlsym;

shim_dlsym_fn shim_glibc_dlsym(void)
{
	shim_dlsym_fn f = __atomic_load_n(&real_dlsym, __ATOMIC_RELAXED);

	if (f)
		return f;
	/* the version node of dlsym differs by glibc release and architecture */
	f = (shim_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
	if (!f)
		f = (shim_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
	if (!f)
		f = (shim_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
	__atomic_store_n(&real_dlsym, f, __ATOMIC_RELAXED);
	return f;
}

void *shim_dlsym(void *handle, const char *name)
{
	shim_dlsym_fn f = shim_glibc_dlsym();

	return f ? f(handle, name) : NULL;
}

struct find_lib {
	const char *prefix;     /* basename prefix, e.g. "libcudart"        */
	const char *prefer;     /* a version suffix to prefer, e.g. ".so.13" */
	char path[PATH_MAX];    /* the best loaded object that matches      */
	int preferred;          /* path has the preferred suffix            */
};

/* Only look here: dlopen under dl_iterate_phdr's lock is not allowed.  The
 * first match with the preferred major version wins; else the first match
 * (another major version of a library may be loaded privately by a plugin). */
static int find_object(struct dl_phdr_info *info, size_t size, void *arg)
{
	struct find_lib *f = arg;
	const char *base = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
	int pref;

	(void)size;
	base = base ? base + 1 : info->dlpi_name;
	if (!base || strncmp(base, f->prefix, strlen(f->prefix)) != 0 || !strstr(base, ".so") ||
	    strlen(info->dlpi_name) >= sizeof(f->path))
		return 0;
	pref = f->prefer && strstr(base, f->prefer) != NULL;
	if (!f->path[0] || (pref && !f->preferred)) {
		strcpy(f->path, info->dlpi_name);
		f->preferred = pref;
	}
	return f->preferred;
}

/*
 * The real definition of name: the next object after us in the global
 * scope; else a library of that soname loaded RTLD_LOCAL (hidden from
 * RTLD_NEXT); else any loaded object whose file name starts with prefix -
 * wheels vendor a renamed runtime (PyTorch's libcudart-<hash>.so.13), loaded
 * privately, whose users still bind their CUDA calls to our hooks.
 */
void *shim_real_in(const char *const *libs, const char *prefix, const char *prefer,
		   const char *name)
{
	void *p = shim_dlsym(RTLD_NEXT, name);
	struct find_lib f = { .prefix = prefix, .prefer = prefer };

	for (; !p && *libs; libs++) {
		void *h = dlopen(*libs, RTLD_NOLOAD | RTLD_LAZY);

		if (h) {
			p = shim_dlsym(h, name);
			dlclose(h);   /* NOLOAD took a reference; give it back */
		}
	}
	if (!p && (dl_iterate_phdr(find_object, &f), f.path[0])) {
		void *h = dlopen(f.path, RTLD_NOLOAD | RTLD_LAZY);

		if (h) {
			p = shim_dlsym(h, name);
			dlclose(h);
		}
	}
	return p;
}

void *shim_real_rt(const char *name)
{
	static const char *const libs[] = { "libcudart.so.13", "libcudart.so", NULL };
	void *p = shim_real_in(libs, "libcudart", ".so.13", name);

	if (!p)
		shim_log("the CUDA runtime has no %s; returning an error to the app", name);
	return p;
}

void *shim_real_drv(const char *name)
{
	static const char *const libs[] = { "libcuda.so.1", "libcuda.so", NULL };

	return shim_real_in(libs, "libcuda.so", ".so.1", name);
}

/* ------------------------------------------------------------------ */
static void on_fork_child(void)
{
	/* The child shares nothing with the parent's controller connection or
	 * slot: count privately and register again at its next CUDA call. */
	memset(&local_ctr, 0, sizeof(local_ctr));
	memset(&local_ctl, 0, sizeof(local_ctl));
	shim_ctr = &local_ctr;
	shim_ctl = &local_ctl;
	block = NULL;          /* the mapping stays; it is simply not used */
	shim_ledger_forget();  /* the same for the parent's ledger */
	shim_ctl_forget();
	shim_fwd_forget();
	shim_names_after_fork();
	pthread_mutex_init(&start_lock, NULL);
	__atomic_store_n(&shim_started, 0, __ATOMIC_RELEASE);
}

static void on_exit_cb(void)
{
	int (*has_twin)(const char *);

	shim_fwd_exit();     /* leave the worker before the controller hears */
	/* The controller frees our slot once it sees the exit (the ledger's
	 * state or the message) and may give it to another app; CUDA work
	 * done later in exit (handlers registered before ours, other threads)
	 * is counted privately, never into that slot. */
	__atomic_store_n(&shim_ctr, &local_ctr, __ATOMIC_RELEASE);
	__atomic_store_n(&shim_ctl, &local_ctl, __ATOMIC_RELEASE);
	/* simgpu tells which kernels had a host twin; a real runtime has no
	 * such symbol, and "twin" is then unknown */
	*(void **)&has_twin = shim_dlsym(RTLD_DEFAULT, "simgpu_kernel_has_twin");
	shim_ledger_exit(has_twin);
	shim_ctl_exit();     /* a nudge: the ledger already says it all */
}

void shim_start_slow(void)
{
	static int atfork_done, atexit_done;
	struct shim_settings set = { 0 };
	char why[256] = "";
	int slot;

	pthread_mutex_lock(&start_lock);
	if (shim_started)
		goto out;
	if (!atfork_done) {
		pthread_atfork(NULL, NULL, on_fork_child);
		atfork_done = 1;
	}
	local_ctl.quota_pct = 100;
	slot = shim_ctl_register(&set, why, sizeof(why));
	if (slot >= 0) {
		char path[4096];

		snprintf(path, sizeof(path), "%s/ctlblock", shim_runtime_dir());
		block = cb_open(path, 0);
		if (!block) {
			snprintf(why, sizeof(why), "cannot map %.200s: %s", path, strerror(errno));
			slot = -1;
		} else if (block->slots[slot].k.pid != (uint32_t)getpid()) {
			snprintf(why, sizeof(why), "slot %d of %.200s is not ours", slot, path);
			cb_close(block);
			block = NULL;
			slot = -1;
		}
	}
	if (slot >= 0) {
		struct cb_counters *c = &block->slots[slot].c;

		/* carry over what was counted before registration */
		shim_add(&c->launches, local_ctr.launches);
		shim_add(&c->forwarded, local_ctr.forwarded);
		shim_add(&c->h2d_bytes, local_ctr.h2d_bytes);
		shim_add(&c->d2h_bytes, local_ctr.d2h_bytes);
		shim_add_signed(&c->allocs_live, local_ctr.allocs_live);
		shim_add_signed(&c->alloc_bytes_live, local_ctr.alloc_bytes_live);
		shim_add(&c->syncs, local_ctr.syncs);
		shim_ctl = &block->slots[slot].k;
		__atomic_store_n(&shim_ctr, c, __ATOMIC_RELEASE);
		/* what the controller asked for, to the parts that do it */
		if (set.feed)
			shim_trace_feed_on();
		if (set.fwd_window)
			shim_fwd_set_window(set.fwd_window);
		if (set.partitions)
			shim_part_mps_unlimit();
		/* without its ledger the app still runs and counts; the
		 * controller then has only what messages bring */
		if (shim_ledger_attach(slot, why, sizeof(why)) == 0)
			shim_names_attach();
		else
			shim_log("%s; the controller gets this app's records by message only", why);
		if (!atexit_done) {
			atexit(on_exit_cb);
			atexit_done = 1;
		}
	} else {
		shim_log("%s; running natively", why);
	}
	__atomic_store_n(&shim_started, 1, __ATOMIC_RELEASE);
out:
	pthread_mutex_unlock(&start_lock);
}

void shim_sync_note(void)
{
	if (shim_in_runtime)
		return;
	shim_add(&shim_ctr->syncs, 1);
	__atomic_store_n(&shim_ctr->last_sync_ns, shim_now_ns(), __ATOMIC_RELAXED);
}
