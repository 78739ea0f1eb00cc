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
 * fatbin magic and a header that adds up to that size, and whose FNV-1a
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
 * Threads: MODULE and DEFINE frames come from an app's launcher thread
 * (ring) or the main thread (zmq frames), so the table has a mutex; the
 * load happens under it, so two apps of one binary never load it twice.
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

struct wlib {
	uint64_t hash, size;
	cudaLibrary_t lib;             /* NULL: a free entry                    */
	void *image;                   /* kept while loaded (see above)         */
	unsigned refs;                 /* app module ids mapped to it           */
	char *path;                    /* the file it was read from, for logs   */
};

#define REFUSAL_LOG_CAP 200   /* as frames.c: garbage must not fill a disk */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
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
	if (fwd_fnv1a64(buf, size) != hash) {
		snprintf(why, whylen, "its content does not match the app's hash %016" PRIx64
			 " (damaged, or replaced by another image)", hash);
		goto fail;
	}
	return buf;
fail:
	free(buf);
	return NULL;
}

/* A free entry, unloading an unheld library if need be; mu held. */
static struct wlib *free_entry(void)
{
	struct wlib *victim = NULL;
	unsigned i;

	for (i = 0; i < W_MAX_LIBS; i++) {
		if (!libs[i].lib)
			return &libs[i];
		if (!libs[i].refs && !victim)
			victim = &libs[i];
	}
	if (!victim)
		return NULL;
	w_log("unloading module %s (no app uses it) to make room", victim->path);
	if (cudaLibraryUnload(victim->lib) != cudaSuccess)
		cudaGetLastError();
	free(victim->image);
	free(victim->path);
	memset(victim, 0, sizeof(*victim));
	__atomic_sub_fetch(&nloaded, 1, __ATOMIC_RELAXED);
	return victim;
}

/* The cached library of (hash, size), loaded from path if need be, with a
 * reference taken; NULL with a reason.  mu held. */
static struct wlib *get_lib(const char *path, uint64_t size, uint64_t hash, char *why,
			    size_t whylen)
{
	struct wlib *l;
	cudaLibrary_t lib;
	cudaError_t e;
	void *image;
	unsigned i;

	for (i = 0; i < W_MAX_LIBS; i++) {
		l = &libs[i];
		if (l->lib && l->hash == hash && l->size == size) {
			l->refs++;
			return l;
		}
	}
	image = read_image(path, size, hash, why, whylen);
	if (!image)
		return NULL;
	l = free_entry();
	if (!l) {
		snprintf(why, whylen, "this worker holds %d modules in use already", W_MAX_LIBS);
		free(image);
		return NULL;
	}
	e = cudaLibraryLoadData(&lib, image, NULL, NULL, 0, NULL, NULL, 0);
	if (e != cudaSuccess) {
		cudaGetLastError();
		snprintf(why, whylen, "cudaLibraryLoadData: %s", cudaGetErrorName(e));
		free(image);
		return NULL;
	}
	l->hash = hash;
	l->size = size;
	l->lib = lib;
	l->image = image;
	l->refs = 1;
	l->path = strdup(path);
	__atomic_add_fetch(&nloaded, 1, __ATOMIC_RELAXED);
	__atomic_add_fetch(&nloads, 1, __ATOMIC_RELAXED);
	w_log("loaded module %s (%" PRIu64 " bytes)", path, size);
	return l;
}

int w_app_module(struct wapp *a, const struct fwd_module *m, const char *path, char *why,
		 size_t whylen)
{
	struct wlib *l = a->mods[m->mid];
	char sub[200];

	if (l) {
		/* idempotent: the same image again is fine */
		if (l->hash == m->hash && l->size == m->size)
			return 0;
		snprintf(why, whylen, "MODULE %u (%s): the id names another image already", m->mid,
			 path);
		return FWD_E_MALFORMED;   /* the shim never reuses an id */
	}
	pthread_mutex_lock(&mu);
	l = get_lib(path, m->size, m->hash, sub, sizeof(sub));
	pthread_mutex_unlock(&mu);
	if (!l) {
		snprintf(why, whylen, "module file %s refused: %s", path, sub);
		log_refusal(a, why);
		return FWD_E_MODULE;
	}
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
	e = cudaLibraryGetKernel(&h, l->lib, k->name);
	if (e != cudaSuccess) {
		cudaGetLastError();
		snprintf(why, whylen, "kernel %s is not in module file %s (%s)", k->name, l->path,
			 cudaGetErrorName(e));
		return FWD_E_MODULE;
	}
	if (W.param_info) {
		for (i = 0; i <= k->nparams; i++) {
			e = W.param_info((const void *)h, i, &off, &size);
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

/* The app is being freed: its references go (the libraries stay cached). */
void w_app_modules_drop(struct wapp *a)
{
	unsigned i;

	pthread_mutex_lock(&mu);
	for (i = 0; i < FWD_MAX_MODULES; i++) {
		if (a->mods[i] && a->mods[i]->refs)
			a->mods[i]->refs--;
		a->mods[i] = NULL;
	}
	pthread_mutex_unlock(&mu);
}
