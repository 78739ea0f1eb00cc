/*
 * app.c - the applications connected to this worker.
 *
 * An app exists from its HELLO until its BYE, its death (pid polled every
 * 500 ms) or the worker's shutdown.  The main thread owns the table; the
 * app's launcher thread owns its kernel and module tables (it alone takes
 * the ring's MODULE and DEFINE frames) and its streams and, at the end,
 * destroys the streams and sets `finished`, after which the main thread
 * joins it and frees the rest (the page too: only the main thread's
 * lifetime of an app covers every heartbeat).  A HELLO that asks for no
 * launch ring is refused: the ring is the only way launches come in.
 *
 * Kernels: a DEFINE names the app's module (MODULE, modules.c) the kernel
 * is taken from, as a GPU needs; without one, simgpu finds it by name.  A
 * kernel we cannot serve is refused softly (w_app_verdict: in the page, the
 * app runs it itself).
 *
 * Host twins (simgpu): the app names its twin libraries in HELLO; they are
 * dlopen'ed RTLD_GLOBAL, which is where simgpu looks last for a twin
 * (dlsym(RTLD_DEFAULT)), so they work for any app at any time, not only
 * before the first kernel resolves as $SIMGPU_TWINS would.  Only regular
 * files owned by us (or root) and not writable by others are loaded: the
 * socket is reachable by anyone who can reach the runtime dir.
 */
#define _GNU_SOURCE
#include "worker.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define SOFT_LOG_CAP 200   /* as frames.c: a flood must not fill a disk */

static struct wapp *apps[W_MAX_APPS];
static uint64_t last_serial;          /* main thread */
static struct wapp *last_hit;

struct wapp *w_app_find(const unsigned char *rid, size_t rid_len)
{
	int i;

	if (last_hit && !last_hit->closing && last_hit->rid_len == rid_len &&
	    !memcmp(last_hit->rid, rid, rid_len))
		return last_hit;
	for (i = 0; i < W_MAX_APPS; i++) {
		struct wapp *a = apps[i];

		if (a && !a->closing && a->rid_len == rid_len && !memcmp(a->rid, rid, rid_len))
			return last_hit = a;
	}
	return NULL;
}

int w_app_count(void)
{
	int i, n = 0;

	for (i = 0; i < W_MAX_APPS; i++)
		n += apps[i] && !apps[i]->closing;
	return n;
}

const char *w_file_unsafe(const struct stat *st)
{
	if (!S_ISREG(st->st_mode))
		return "not a regular file";
	if (st->st_uid != getuid() && st->st_uid != 0)
		return "owned by another user";
	if (st->st_mode & S_IWOTH)
		return "writable by others";
	return NULL;
}

static int safe_file(const struct stat *st)
{
	return w_file_unsafe(st) == NULL;
}

static void load_twins(const char *list, const char *app)
{
	char *copy = strdup(list), *save = NULL, *p;

	if (!copy)
		return;
	for (p = strtok_r(copy, ":", &save); p; p = strtok_r(NULL, ":", &save)) {
		struct stat st;

		if (!*p)
			continue;
		if (stat(p, &st) < 0 || !safe_file(&st)) {
			w_log("app %s: not loading twins %s (missing, or not a file of ours)", app, p);
			continue;
		}
		if (!dlopen(p, RTLD_NOW | RTLD_GLOBAL))
			w_log("app %s: cannot load twins %s: %s", app, p, dlerror());
	}
	free(copy);
}

/* Map the app's page: its completions, time slots and launch ring. */
static int map_page(struct wapp *a, const char *path, char *msg, size_t msglen)
{
	struct fwd_page *pg;
	struct stat st;
	uint32_t ring;
	size_t len;
	int fd;

	fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		snprintf(msg, msglen, "cannot open page %s: %s", path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) < 0 || !safe_file(&st) || st.st_size < (off_t)FWD_PAGE_SIZE) {
		snprintf(msg, msglen, "page %s is not a file of ours of %u bytes or more", path,
			 FWD_PAGE_SIZE);
		close(fd);
		return -1;
	}
	pg = mmap(NULL, FWD_PAGE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (pg == MAP_FAILED) {
		snprintf(msg, msglen, "cannot map page %s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	if (__atomic_load_n(&pg->magic, __ATOMIC_ACQUIRE) != FWD_PAGE_MAGIC ||
	    pg->version != FWD_PAGE_VERSION) {
		snprintf(msg, msglen, "page %s has another magic or version", path);
		goto fail;
	}
	ring = pg->ring_size;
	if (ring < FWD_RING_MIN || ring > FWD_RING_MAX || (ring & (ring - 1))) {
		snprintf(msg, msglen, "page %s: bad ring size %u", path, ring);
		goto fail;
	}
	if ((uint64_t)st.st_size < (uint64_t)FWD_RING_OFF + ring) {
		snprintf(msg, msglen, "page %s: %lld bytes, too short for its time slots and ring",
			 path, (long long)st.st_size);
		goto fail;
	}
	len = FWD_RING_OFF + ring;
	munmap(pg, FWD_PAGE_SIZE);
	pg = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (pg == MAP_FAILED) {
		snprintf(msg, msglen, "cannot map the time slots and ring of %s: %s", path,
			 strerror(errno));
		close(fd);
		return -1;
	}
	a->frame = malloc(FWD_MAX_FRAME);
	if (!a->frame) {
		snprintf(msg, msglen, "out of memory");
		munmap(pg, len);
		close(fd);
		return -1;
	}
	a->ring = (unsigned char *)pg + FWD_RING_OFF;
	a->ring_size = ring;
	close(fd);
	a->page = pg;
	a->map_len = len;
	/* read once: the app may rewrite its page, we keep what we agreed */
	return 0;
fail:
	munmap(pg, FWD_PAGE_SIZE);
	close(fd);
	return -1;
}

static int same_device(const char *dev)
{
	char *r;
	int same;

	if (!*dev || !*wstate.device)
		return !*dev && !*wstate.device;
	r = realpath(dev, NULL);
	same = !strcmp(r ? r : dev, wstate.device);
	free(r);
	return same;
}

struct wapp *w_app_hello(const unsigned char *rid, size_t rid_len, int delim,
			 const struct fwd_hello *m, const char *page, const char *twins,
			 const char *device, const char *name, uint32_t *status,
			 char *msg, size_t msglen)
{
	struct wapp *a;
	int i, slot = -1;

	*status = FWD_S_OK;
	if (m->worker_id != wstate.id) {
		*status = FWD_S_WRONG_WORKER;
		snprintf(msg, msglen, "this is worker %u, not %u", wstate.id, m->worker_id);
		return NULL;
	}
	if (!(m->h.flags & FWD_HF_RING)) {
		*status = FWD_S_UNSUPPORTED;
		snprintf(msg, msglen, "worker %u takes launches only through the page's launch ring, "
			 "and this HELLO asks for none (FWD_HF_RING)", wstate.id);
		return NULL;
	}
	if ((m->h.flags & FWD_HF_VMM) && !wstate.vmm_ok) {
		*status = FWD_S_UNSUPPORTED;
		snprintf(msg, msglen, "worker %u cannot map the app's VMM-shared memory: %.150s",
			 wstate.id, wstate.vmm_why);
		return NULL;
	}
	if (!wstate.on_simgpu && !(m->h.flags & FWD_HF_VMM)) {
		/* kernels come as modules; the app's pointers would mean nothing
		 * here unless its memory is VMM-shared (simgpu: the arena) */
		*status = FWD_S_UNSUPPORTED;
		snprintf(msg, msglen, "worker %u: the app's device memory is not shared with "
			 "workers (run it with COLOCATE_MEM=vmm)", wstate.id);
		return NULL;
	}
	if (!same_device(device)) {
		*status = FWD_S_OTHER_DEVICE;
		snprintf(msg, msglen, "app device '%.100s' is not this worker's '%.100s'", device,
			 wstate.device);
		return NULL;
	}
	for (i = 0; i < W_MAX_APPS && slot < 0; i++)
		if (!apps[i])
			slot = i;
	if (slot < 0 || rid_len > W_MAX_RID) {
		*status = FWD_S_FULL;
		snprintf(msg, msglen, "worker %u serves %d apps already", wstate.id, W_MAX_APPS);
		return NULL;
	}
	a = calloc(1, sizeof(*a));
	if (!a) {
		*status = FWD_S_FULL;
		snprintf(msg, msglen, "out of memory");
		return NULL;
	}
	if (map_page(a, page, msg, msglen) < 0) {
		*status = FWD_S_BAD_PAGE;
		free(a);
		return NULL;
	}
	memcpy(a->rid, rid, rid_len);
	a->rid_len = rid_len;
	a->delim = delim;
	a->pid = m->pid;
	a->vmm = (m->h.flags & FWD_HF_VMM) != 0;
	a->serial = ++last_serial;
	snprintf(a->name, sizeof(a->name), "%s", *name ? name : "?");
	if (*twins)
		load_twins(twins, a->name);
	__atomic_store_n(&a->page->beat_ns, w_now_ns(), __ATOMIC_RELAXED);
	__atomic_store_n(&a->page->worker_pid, wstate.pid, __ATOMIC_RELEASE);
	a->last_alive_check_ns = w_now_ns();
	if (pthread_create(&a->thread, NULL, w_launcher, a) != 0) {
		*status = FWD_S_FULL;
		snprintf(msg, msglen, "cannot start a launcher thread");
		munmap(a->page, a->map_len);
		free(a->frame);
		free(a);
		return NULL;
	}
	a->thread_ok = 1;
	apps[slot] = a;
	return a;
}

/*
 * By name (simgpu; a DEFINE without a module): with its layout when simgpu
 * can take one (launches then copy their arguments and return at once),
 * else by name only (each launch waits until the kernel has read its
 * arguments).  Parameters must be in increasing offset order, as the shim
 * sends them.
 */
static void *by_name_handle(const struct wkernel *k)
{
	unsigned off[FWD_MAX_PARAMS], size[FWD_MAX_PARAMS];
	void *h;
	unsigned i;

	if (wstate.kernel_define) {
		for (i = 0; i < k->nparams; i++) {
			off[i] = k->params[i].offset;
			size[i] = k->params[i].size;
		}
		h = wstate.kernel_define(k->name, k->nparams, off, size);
		if (h)
			return h;
		w_log("%s: layout refused (defined differently before?); launches will wait "
		      "for their arguments to be read", k->name);
	}
	return wstate.kernel_by_name(k->name);
}

/* k->handle: from its module, or by name where this worker may. */
static int kernel_handle(struct wapp *a, struct wkernel *k, char *why, size_t whylen)
{
	if (wstate.refuse_hook && strstr(k->name, wstate.refuse_hook)) {
		snprintf(why, whylen, "kernel %s refused by COLOCATE_WORKER_REFUSE (a test hook)",
			 k->name);
		return FWD_E_MODULE;
	}
	if (k->mid != FWD_NO_MODULE)
		return w_module_kernel(a, k, why, whylen);
	if (!wstate.has_by_name) {
		snprintf(why, whylen, "kernel %s comes without a module, and this worker does not "
			 "find kernels by name (%s)", k->name,
			 wstate.on_simgpu ? "COLOCATE_WORKER_BY_NAME=0" : "not simgpu");
		return FWD_E_MODULE;
	}
	k->handle = by_name_handle(k);
	if (!k->handle)
		w_log("app %s: no kernel handle for %s; its launches will fail", a->name, k->name);
	return 0;
}

static void kernel_free(struct wkernel *k)
{
	free(k->params);
	free(k->name);
	free(k);
}

/* k->handle, and the twin check: 0 or FWD_E_*. */
static int kernel_resolve(struct wapp *a, struct wkernel *k, char *why, size_t whylen)
{
	int code = kernel_handle(a, k, why, whylen);

	if (code)
		return code;
	/* simgpu runs a kernel without a host twin as a timed no-op: here that
	 * would silently drop the app's work, so refuse it (the app replays
	 * locally, where its own libraries provide the twin) */
	if (k->handle && wstate.has_twin && wstate.has_twin(k->name) == 0) {
		w_log("app %s: no host twin for %s in this worker (twin libraries come from the "
		      "app's HELLO); refusing it", a->name, k->name);
		k->handle = NULL;
		snprintf(why, whylen, "no host twin for this kernel in the worker");
		return FWD_E_MODULE;
	}
	return 0;
}

int w_app_define(struct wapp *a, const struct fwd_define *m, const struct fwd_param *params,
		 const char *name, char *why, size_t whylen)
{
	struct wkernel *k = a->kernels[m->kid];
	int code;

	if (k) {
		/* idempotent: the same definition again is fine */
		if (k->nparams == m->nparams && k->argbytes == m->argbytes && k->mid == m->mid &&
		    !strcmp(k->name, name) &&
		    !memcmp(k->params, params, (size_t)m->nparams * sizeof(*params)))
			return 0;
		snprintf(why, whylen, "kernel id already defined differently");
		return FWD_E_MALFORMED;
	}
	k = calloc(1, sizeof(*k));
	if (!k) {
		snprintf(why, whylen, "out of memory");
		return FWD_E_MALFORMED;
	}
	k->params = malloc((size_t)(m->nparams ? m->nparams : 1) * sizeof(*params));
	k->name = strdup(name);
	if (!k->params || !k->name) {
		kernel_free(k);
		snprintf(why, whylen, "out of memory");
		return FWD_E_MALFORMED;
	}
	memcpy(k->params, params, (size_t)m->nparams * sizeof(*params));
	k->nparams = m->nparams;
	k->argbytes = m->argbytes;
	k->mid = m->mid;
	code = kernel_resolve(a, k, why, whylen);
	if (code) {
		kernel_free(k);
		return code;
	}
	a->kernels[m->kid] = k;
	return 0;
}

void w_app_verdict(struct wapp *a, uint32_t kid, const char *refused)
{
	struct fwd_page *pg = a->page;
	uint64_t bit = 1ull << (kid % 64);

	if (refused) {
		uint64_t n = atomic_fetch_add(&wstate.refused_kernels, 1) + 1;

		if (n <= SOFT_LOG_CAP)
			w_log("app %s (pid %u): kernel %u refused, the app runs it locally: %s%s",
			      a->name, a->pid, kid, refused,
			      n == SOFT_LOG_CAP ? " (further refusals are not logged)" : "");
		__atomic_fetch_or(&pg->refused_kid[kid / 64], bit, __ATOMIC_RELAXED);
	} else {
		__atomic_fetch_and(&pg->refused_kid[kid / 64], ~bit, __ATOMIC_RELAXED);
	}
	/* the bit before the count; seq_cst pairs with the waiter's
	 * increment of `waiters`, as on_mark's store of done[] does */
	__atomic_fetch_add(&pg->defines_done, 1, __ATOMIC_SEQ_CST);
	__atomic_fetch_add(&pg->wake, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&pg->waiters, __ATOMIC_SEQ_CST))
		syscall(SYS_futex, &pg->wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

void w_app_module_refused(struct wapp *a, uint32_t mid)
{
	a->mod_refused[mid / 64] |= 1ull << (mid % 64);
}

void w_app_close(struct wapp *a, int abandon)
{
	if (last_hit == a)
		last_hit = NULL;
	a->closing = 1;
	/* abandon before stop: a launcher that sees the stop also sees it */
	if (abandon)
		__atomic_store_n(&a->abandon, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&a->stop, 1, __ATOMIC_RELEASE);
	w_ring_kick(a);
}

static void app_free(struct wapp *a)
{
	int i;

	if (a->vmm)
		w_log("app %s (pid %u) left: VMM-shared memory, %llu launch%s translated", a->name,
		      a->pid, (unsigned long long)atomic_load(&a->translated),
		      atomic_load(&a->translated) == 1 ? "" : "es");

	for (i = 0; i < (int)FWD_MAX_KERNELS; i++)
		if (a->kernels[i])
			kernel_free(a->kernels[i]);
	w_app_modules_drop(a);
	/* the launcher is done with it; a shim may still read it (its own map) */
	munmap(a->page, a->map_len);
	free(a->frame);
	free(a);
}

/* Join and free apps whose launcher has finished. */
static int reap(void)
{
	int i, left = 0;

	for (i = 0; i < W_MAX_APPS; i++) {
		struct wapp *a = apps[i];

		if (!a)
			continue;
		if (!a->closing || !atomic_load(&a->finished)) {
			left++;
			continue;
		}
		if (a->thread_ok)
			pthread_join(a->thread, NULL);
		apps[i] = NULL;
		app_free(a);
	}
	return left;
}

uint64_t w_app_pair_mem(uint32_t pid)
{
	struct wapp *best = NULL;
	int i;

	for (i = 0; i < W_MAX_APPS; i++) {
		struct wapp *a = apps[i];

		if (a && a->pid == pid && a->vmm && !a->closing && !a->mem_paired &&
		    (!best || a->serial > best->serial))
			best = a;
	}
	if (!best)
		return 0;
	best->mem_paired = 1;
	return best->serial;
}

static struct wapp *by_serial(uint64_t serial)
{
	int i;

	for (i = 0; serial && i < W_MAX_APPS; i++)
		if (apps[i] && apps[i]->serial == serial)
			return apps[i];
	return NULL;
}

int w_app_serial_busy(uint64_t serial)
{
	struct wapp *a = by_serial(serial);

	/* the launcher synchronises its streams before it says finished */
	return a && !atomic_load(&a->finished);
}

void w_app_mem_closed(uint64_t serial)
{
	struct wapp *a = by_serial(serial);

	/* as at its BYE (which may come before or after this) */
	if (a && !a->closing)
		w_app_close(a, 0);
}

void w_apps_tick(uint64_t now)
{
	int i;

	for (i = 0; i < W_MAX_APPS; i++) {
		struct wapp *a = apps[i];

		if (!a || a->closing)
			continue;
		/* the app's liveness test of this worker: main loop responsive */
		__atomic_store_n(&a->page->beat_ns, now, __ATOMIC_RELAXED);
		if (now - a->last_alive_check_ns < 500000000ull)
			continue;
		a->last_alive_check_ns = now;
		if (colocate_pid_alive(a->pid))
			continue;
		/* an app that said BYE (synchronised first) may have taken the
		 * frame with it at its exit, or it is still on its way: its page
		 * says so, and it left as at a BYE */
		if (__atomic_load_n(&a->page->bye, __ATOMIC_ACQUIRE)) {
			w_app_close(a, 0);
			continue;
		}
		w_log("app %s (pid %u) is gone; dropping its queued launches", a->name, a->pid);
		w_app_close(a, 1);
	}
	reap();
}

int w_apps_shutdown(uint64_t deadline_ns)
{
	struct timespec ts = { 0, 10000000 };
	int i, left;

	for (i = 0; i < W_MAX_APPS; i++)
		if (apps[i] && !apps[i]->closing)
			w_app_close(apps[i], 0);
	/* finish what was queued; apps waiting on it still see heartbeats */
	for (;;) {
		uint64_t now = w_now_ns();

		left = 0;
		for (i = 0; i < W_MAX_APPS; i++) {
			if (!apps[i])
				continue;
			__atomic_store_n(&apps[i]->page->beat_ns, now, __ATOMIC_RELAXED);
			left += !atomic_load(&apps[i]->finished);
		}
		w_frames_drain();
		if (!left || now >= deadline_ns)
			break;
		nanosleep(&ts, NULL);
	}
	/* only now: an app told earlier would replay work still queued here */
	for (i = 0; i < W_MAX_APPS; i++)
		if (apps[i])
			w_send_error(apps[i]->rid, apps[i]->rid_len, apps[i]->delim, FWD_E_CLOSING,
				     0, "worker is shutting down");
	reap();
	return left == 0;
}
