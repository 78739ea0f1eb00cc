/*
 * modules.c - the apps' fat binaries (MODULE frames): checked, loaded with
 * cudaLibraryLoadData, and cached for the worker's life; and the kernels
 * DEFINEs take from them (cudaLibraryGetKernel), their layout checked.
 *
 * A MODULE names a file the app's shim wrote into the runtime dir.  Any
 * process that reaches the worker's socket can name any path, so the file
 * is taken only as safe_file() takes twin libraries (a regular file of
 * ours or root's, not writable by others) and, unlike them, not writable by
 * its group either (as the shim's reusable() wants); opened O_NOFOLLOW, so never
 * through a symbolic link), of exactly the size the frame says, with the
 * fatbin magic and a header that adds up to that size, and whose fwd_image_hash64
 * hash is the frame's.  It is read (not mapped: a file truncated under a
 * mapping would kill the worker with SIGBUS) and the copy is kept while
 * the library is loaded: with lazy loading (CUDA_MODULE_LOADING=LAZY, the
 * default) a runtime may go back to the image at a kernel's first launch.
 *
 * Cache: libraries by (hash, size), shared by every app: a second app of
 * the same binary loads nothing.  An app holds a reference per module id
 * it mapped, dropped when the app is freed (its launcher has finished, so
 * none of its kernels is in flight).  The table is bounded (W_MAX_LIBS);
 * when full, a library no app holds is unloaded to make room, and when
 * every one is held the MODULE is refused.
 *
 * Threads: MODULE and DEFINE frames come from the apps' launcher threads
 * (out of their rings), and the main thread drops references when it frees
 * an app, so the table has a mutex (mu).  It is held only to find, insert
 * and reference entries, never across a read, hash or cudaLibraryLoadData:
 * a big or JIT-compiled image takes seconds, during which other apps'
 * launchers load and launch, and the main thread stamps every app's
 * heartbeat (2 s without one and the apps drop the worker).  An entry being
 * loaded is in state L_LOADING, with a reference for its loader; a second
 * app of the same (hash, size) takes a reference and waits on loaded_cv
 * (its own launcher only: the main thread never takes a MODULE or DEFINE).
 * Dropping references never waits: an entry is evicted only when loaded
 * (or failed) and unreferenced.  Test hook: COLOCATE_WORKER_LOAD_DELAY_MS
 * (worker.h) makes every load that long.
 */
#define _GNU_SOURCE
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define W_MAX_LIBS 256

enum { L_FREE, L_LOADING, L_LOADED, L_FAILED };

struct wlib {
	uint64_t hash, size;           /* fixed while the entry is not free     */
	int state;                     /* L_*; mu                               */
	cudaLibrary_t lib;             /* L_LOADED                              */
	void *image;                   /* kept while loaded (see above)         */
	unsigned refs;                 /* app module ids mapped to it, and its
	                                  loader while L_LOADING; mu            */
	char *path;                    /* the file it was read from, for logs   */
	char why[200];                 /* L_FAILED: the refusal                 */
};

#define REFUSAL_LOG_CAP 200   /* as frames.c: garbage must not fill a disk */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t loaded_cv = PTHREAD_COND_INITIALIZER;   /* a load ended */
static struct wlib libs[W_MAX_LIBS];
static unsigned nloaded;
static uint64_t nloads;
static unsigned nrefusals;

/* One line per refusal (which file, why), up to a cap. */
static void log_refusal(const struct wapp *a, const char *why)
{
	unsigned n = __atomic_add_fetch(&nrefusals, 1, __ATOMIC_RELAXED);

	if (n <= REFUSAL_LOG_CAP)
		w_log("app %s (pid %u): %s%s", a->name, a->pid, why,
		      n == REFUSAL_LOG_CAP ? " (further module refusals are not logged)" : "");
}

unsigned w_modules_loaded(void)
{
	return __atomic_load_n(&nloaded, __ATOMIC_RELAXED);
}

uint64_t w_module_loads(void)
{
	return __atomic_load_n(&nloads, __ATOMIC_RELAXED);
}

/* The whole file into a buffer of ours, checked; NULL with a reason. */
static void *read_image(const char *path, uint64_t size, uint64_t hash, char *why, size_t whylen)
{
	struct stat st;
	const char *bad;
	unsigned char *buf;
	uint64_t got = 0, fat;
	uint32_t magic;
	uint16_t hdr;
	int fd;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		snprintf(why, whylen, "%s", errno == ELOOP ? "it is a symbolic link" : strerror(errno));
		return NULL;
	}
	if (fstat(fd, &st) < 0) {
		snprintf(why, whylen, "fstat: %s", strerror(errno));
		close(fd);
		return NULL;
	}
	bad = w_file_unsafe(&st);
	/* the shim reuses a module file on the same terms (reusable()) */
	if (!bad && (st.st_mode & S_IWGRP))
		bad = "writable by its group";
	if (bad) {
		snprintf(why, whylen, "%s", bad);
		close(fd);
		return NULL;
	}
	if ((uint64_t)st.st_size != size) {
		snprintf(why, whylen, "%lld bytes, the app says %" PRIu64, (long long)st.st_size, size);
		close(fd);
		return NULL;
	}
	buf = malloc(size);
	if (!buf) {
		snprintf(why, whylen, "out of memory for %" PRIu64 " bytes", size);
		close(fd);
		return NULL;
	}
	while (got < size) {
		ssize_t r = read(fd, buf + got, size - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (uint64_t)r;
	}
	close(fd);
	if (got != size) {
		snprintf(why, whylen, "read %" PRIu64 " of %" PRIu64 " bytes", got, size);
		goto fail;
	}
	memcpy(&magic, buf, sizeof(magic));
	memcpy(&hdr, buf + 6, sizeof(hdr));
	memcpy(&fat, buf + 8, sizeof(fat));
	if (magic != FWD_FATBIN_MAGIC) {
		snprintf(why, whylen, "no fatbin magic (0x%08x)", magic);
		goto fail;
	}
	if (hdr < 16 || fat > size || hdr != size - fat) {
		snprintf(why, whylen, "its header says %u + %" PRIu64 " bytes, not %" PRIu64, hdr,
			 fat, size);
		goto fail;
	}
	if (fwd_image_hash64(buf, size) != hash) {
		snprintf(why, whylen, "its content does not match the app's hash %016" PRIx64
			 " (damaged, or replaced by another image)", hash);
		goto fail;
	}
	return buf;
fail:
	free(buf);
	return NULL;
}

/* COLOCATE_WORKER_LOAD_DELAY_MS (test hook): every load takes that long
 * more, outside the mutex, as a big or JIT-compiled image would. */
static unsigned load_delay_ms(void)
{
	static int said = -1;
	const char *v = getenv("COLOCATE_WORKER_LOAD_DELAY_MS");
	unsigned ms = v ? (unsigned)strtoul(v, NULL, 10) : 0;

	if (ms > 60000)
		ms = 60000;
	if (ms && __atomic_exchange_n(&said, 1, __ATOMIC_RELAXED) != 1)
		w_log("COLOCATE_WORKER_LOAD_DELAY_MS=%u: every module load is delayed (a test "
		      "hook)", ms);
	return ms;
}

/* An entry back to free; mu held. */
static void entry_clear(struct wlib *l)
{
	if (l->state == L_LOADED) {
		if (cudaLibraryUnload(l->lib) != cudaSuccess)
			cudaGetLastError();
		__atomic_sub_fetch(&nloaded, 1, __ATOMIC_RELAXED);
	}
	free(l->image);
	free(l->path);
	memset(l, 0, sizeof(*l));
}

/* One reference less; a failed entry nobody holds is freed (a loaded one
 * stays cached).  Never waits.  mu held. */
static void entry_put(struct wlib *l)
{
	if (l->refs)
		l->refs--;
	if (!l->refs && l->state == L_FAILED)
		entry_clear(l);
}

/* A free entry, unloading an unheld library if need be; mu held.  An
 * entry being loaded is always held (by its loader), so never taken. */
static struct wlib *free_entry(void)
{
	struct wlib *victim = NULL;
	unsigned i;

	for (i = 0; i < W_MAX_LIBS; i++) {
		if (libs[i].state == L_FREE)
			return &libs[i];
		if (!libs[i].refs && libs[i].state != L_LOADING && !victim)
			victim = &libs[i];
	}
	if (!victim)
		return NULL;
	w_log("unloading module %s (no app uses it) to make room", victim->path);
	entry_clear(victim);
	return victim;
}

/*
 * The entry of (hash, size) with a reference taken: a loaded one, or one
 * loading from the same path, or a new one in L_LOADING whose load is the caller's (*mine = 1).
 * A failed entry is not reused: the next MODULE reads the file again.
 * NULL with a reason when the table is full of held entries.  mu held.
 */
static struct wlib *entry_get(const char *path, uint64_t size, uint64_t hash, int *mine,
			      char *why, size_t whylen)
{
	struct wlib *l;
	unsigned i;

	*mine = 0;
	for (i = 0; i < W_MAX_LIBS; i++) {
		l = &libs[i];
		/* a load under way is joined only for the same file: another
		 * path may hold a good copy where this one is refused */
		if (l->hash == hash && l->size == size &&
		    (l->state == L_LOADED || (l->state == L_LOADING && !strcmp(l->path, path)))) {
			l->refs++;
			return l;
		}
	}
	l = free_entry();
	if (!l) {
		snprintf(why, whylen, "this worker holds %d modules in use already", W_MAX_LIBS);
		return NULL;
	}
	l->path = strdup(path);
	if (!l->path) {
		snprintf(why, whylen, "out of memory");
		return NULL;
	}
	l->hash = hash;
	l->size = size;
	l->state = L_LOADING;
	l->refs = 1;
	*mine = 1;
	return l;
}

/*
 * Read, check and load the entry's image, without mu (the entry is ours
 * while L_LOADING: nobody else writes it or frees it), then publish the
 * outcome and wake the waiters.  a: the app it is loaded for (its refusal
 * is logged under its name).
 */
static void module_load(struct wapp *a, struct wlib *l)
{
	cudaLibrary_t lib = NULL;
	unsigned delay = load_delay_ms();
	char why[200] = "";
	cudaError_t e;
	void *image;

	image = read_image(l->path, l->size, l->hash, why, sizeof(why));
	if (image && delay)
		usleep(delay * 1000u);
	if (image) {
		e = cudaLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0);
		if (e != cudaSuccess) {
			cudaGetLastError();
			snprintf(why, sizeof(why), "cudaLibraryLoadData: %s", cudaGetErrorName(e));
			free(image);
			image = NULL;
		}
	}
	pthread_mutex_lock(&mu);
	if (image) {
		l->lib = lib;
		l->image = image;
		l->state = L_LOADED;
		__atomic_add_fetch(&nloaded, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&nloads, 1, __ATOMIC_RELAXED);
	} else {
		l->state = L_FAILED;
		snprintf(l->why, sizeof(l->why), "%s", why);
	}
	pthread_cond_broadcast(&loaded_cv);
	pthread_mutex_unlock(&mu);
	if (image) {
		w_log("loaded module %s (%" PRIu64 " bytes)", l->path, l->size);
	} else {
		char msg[sizeof(why) + 600];

		snprintf(msg, sizeof(msg), "module file %s refused: %s", l->path, why);
		log_refusal(a, msg);
	}
}

/* Wait (launcher threads only) until l is not loading; its state.  mu held. */
static int entry_wait(struct wlib *l)
{
	while (l->state == L_LOADING)
		pthread_cond_wait(&loaded_cv, &mu);
	return l->state;
}

int w_app_module(struct wapp *a, const struct fwd_module *m, const char *path, char *why,
		 size_t whylen)
{
	struct wlib *l = a->mods[m->mid];
	char sub[200];
	int mine, state;

	if (l) {
		/* idempotent: the same image again is fine */
		if (l->hash == m->hash && l->size == m->size)
			return 0;
		snprintf(why, whylen, "MODULE %u (%s): the id names another image already", m->mid,
			 path);
		return FWD_E_MALFORMED;   /* the shim never reuses an id */
	}
	if ((m->h.flags & FWD_MF_VARS) && !wstate.has_by_name) {
		/* a GPU (or a simgpu worker told to act as one) */
		snprintf(why, whylen, "module %u (%s) has __device__/__constant__ variables: this "
			 "worker's copy of them would not hold the app's values", m->mid, path);
		log_refusal(a, why);
		return FWD_E_MODULE;
	}
	pthread_mutex_lock(&mu);
	l = entry_get(path, m->size, m->hash, &mine, sub, sizeof(sub));
	pthread_mutex_unlock(&mu);
	if (!l) {
		snprintf(why, whylen, "module file %s refused: %s", path, sub);
		log_refusal(a, why);
		return FWD_E_MODULE;
	}
	if (mine)
		module_load(a, l);
	pthread_mutex_lock(&mu);
	state = entry_wait(l);
	if (state != L_LOADED) {
		snprintf(why, whylen, "module file %s refused: %s", path, l->why);
		if (!mine)                 /* the loader logged it already */
			log_refusal(a, why);
		entry_put(l);
	}
	pthread_mutex_unlock(&mu);
	if (state != L_LOADED)
		return FWD_E_MODULE;
	a->mods[m->mid] = l;
	return 0;
}

/*
 * The handle of kernel k (its DEFINE named module k->mid) from the app's
 * library (a refusal is logged by the caller, with the DEFINE), after checking that the library gives it the layout the app
 * sent: a kernel of that name with other parameters is another kernel (or
 * another build of it), and launching it would misread the arguments.
 */
int w_module_kernel(struct wapp *a, struct wkernel *k, char *why, size_t whylen)
{
	struct wlib *l = a->mods[k->mid];
	cudaKernel_t h;
	cudaError_t e;
	size_t off, size;
	unsigned i;

	if (!l) {
		if (a->mod_refused[k->mid / 64] & (1ull << (k->mid % 64)))
			snprintf(why, whylen, "kernel %s: its module %u was refused (see above)",
				 k->name, k->mid);
		else
			snprintf(why, whylen, "kernel %s: module %u was not shipped before its DEFINE",
				 k->name, k->mid);
		return FWD_E_MODULE;
	}
	pthread_mutex_lock(&mu);
	if (entry_wait(l) != L_LOADED) {
		snprintf(why, whylen, "kernel %s: its module %u was refused (see above): %s",
			 k->name, k->mid, l->why);
		pthread_mutex_unlock(&mu);
		return FWD_E_MODULE;
	}
	pthread_mutex_unlock(&mu);
	e = cudaLibraryGetKernel(&h, l->lib, k->name);
	if (e != cudaSuccess) {
		cudaGetLastError();
		snprintf(why, whylen, "kernel %s is not in module file %s (%s)", k->name, l->path,
			 cudaGetErrorName(e));
		return FWD_E_MODULE;
	}
	if (wstate.param_info) {
		for (i = 0; i <= k->nparams; i++) {
			e = wstate.param_info((const void *)h, i, &off, &size);
			if (i == k->nparams ? e == cudaSuccess
					    : e != cudaSuccess || off != k->params[i].offset ||
						      size != k->params[i].size)
				break;
		}
		cudaGetLastError();
		if (i <= k->nparams) {
			snprintf(why, whylen, "kernel %s in module file %s: parameter %u is not what "
				 "the app says (layout mismatch)", k->name, l->path, i);
			return FWD_E_MODULE;
		}
	}
	/* with lazy loading (CUDA_MODULE_LOADING=LAZY, the default) a kernel
	 * is loaded at its first use: make that now, outside any timed launch,
	 * and refuse here a kernel that does not load */
	{
		struct cudaFuncAttributes fa;

		e = cudaFuncGetAttributes(&fa, (const void *)h);
		if (e != cudaSuccess) {
			cudaGetLastError();
			snprintf(why, whylen, "kernel %s in module file %s does not load (%s)",
				 k->name, l->path, cudaGetErrorName(e));
			return FWD_E_MODULE;
		}
	}
	k->handle = (void *)h;
	return 0;
}

/* The app is being freed: its references go (the libraries stay cached).
 * Never waits: its launcher has finished, so no load of its is running. */
void w_app_modules_drop(struct wapp *a)
{
	unsigned i;

	pthread_mutex_lock(&mu);
	for (i = 0; i < FWD_MAX_MODULES; i++) {
		if (a->mods[i])
			entry_put(a->mods[i]);
		a->mods[i] = NULL;
	}
	pthread_mutex_unlock(&mu);
}
