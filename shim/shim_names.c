/*
 * shim_names.c - which kernel a launch is, and how big each allocation is.
 *
 * Kernels: an open-addressing table from a handle (host stub, cudaKernel_t,
 * CUfunction) to an entry {device name, launch count}.  Inserts happen at
 * registration under a mutex; lookups on the launch path are lock-free
 * (a key is published with a release store after its entry is complete).
 * The table never shrinks: kernels are few and live as long as the process.
 *
 * Modules: the fat binaries registered with __cudaRegisterFatBinary, by
 * handle; a kernel registered under a handle belongs to its module, which
 * forwarding ships to a worker (shim_fwd.c).  Only pointers are kept: the
 * image is part of the binary and lives as long as its registration.
 *
 * Allocations: pointer -> size, so that frees can keep alloc_bytes_live
 * right.  Allocation is not on the launch path; a mutex is fine there.
 */
#define _GNU_SOURCE
#include "shim.h"
#include "fwd_proto.h"     /* the fat binary header and its cap */
#include "shim_vmm.h"

#include <cuda_runtime_api.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define KEY_SLOTS   131072u         /* power of two, > 2x MAX_KERNELS */
#define MAX_KERNELS 32768u          /* libtorch_cuda alone registers > 4096 */

struct key_slot {
	const void *key;                /* published last, with release */
	uint32_t idx;
};

static struct key_slot keys[KEY_SLOTS];
static struct shim_kernel kernels[MAX_KERNELS];
static uint32_t nkernels;
static pthread_mutex_t names_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t alloc_lock = PTHREAD_MUTEX_INITIALIZER;

static inline uint32_t hash_ptr(const void *p)
{
	uint64_t x = (uint64_t)(uintptr_t)p;

	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return (uint32_t)x & (KEY_SLOTS - 1);
}

struct shim_kernel *shim_kernel_find(const void *key)
{
	uint32_t h = hash_ptr(key), i;

	if (!key)
		return NULL;
	for (i = 0; i < KEY_SLOTS; i++, h = (h + 1) & (KEY_SLOTS - 1)) {
		const void *k = __atomic_load_n(&keys[h].key, __ATOMIC_ACQUIRE);

		if (k == key)
			return &kernels[keys[h].idx];
		if (!k)
			return NULL;
	}
	return NULL;
}

/* caller holds names_lock */
static void put_key(const void *key, uint32_t idx)
{
	uint32_t h = hash_ptr(key), i;

	for (i = 0; i < KEY_SLOTS; i++, h = (h + 1) & (KEY_SLOTS - 1)) {
		if (keys[h].key == key)
			return;
		if (!keys[h].key) {
			keys[h].idx = idx;
			__atomic_store_n(&keys[h].key, key, __ATOMIC_RELEASE);
			return;
		}
	}
}

struct shim_kernel *shim_kernel_add(const void *key, const char *name)
{
	struct shim_kernel *k;

	if (!key)
		return NULL;
	pthread_mutex_lock(&names_lock);
	k = shim_kernel_find(key);
	if (!k && nkernels < MAX_KERNELS) {
		k = &kernels[nkernels];
		k->name = strdup(name ? name : "?");
		if (!k->name)
			k->name = "?";
		k->module = -1;
		k->count = shim_ledger_kernel(k->name, 0);
		if (!k->count)
			k->count = &k->launches;
		put_key(key, nkernels);
		/* release: shim_kernel_each reads entries below nkernels */
		__atomic_store_n(&nkernels, nkernels + 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&names_lock);
	return k;
}

int shim_kernel_table_full(void)
{
	return __atomic_load_n(&nkernels, __ATOMIC_RELAXED) >= MAX_KERNELS;
}

void shim_names_after_fork(void)
{
	uint32_t i;

	/* the child's counts start at zero; locks a parent thread held at
	 * fork time would never be released in the child */
	for (i = 0; i < nkernels; i++) {
		kernels[i].count = &kernels[i].launches;
		kernels[i].launches = 0;
	}
	pthread_mutex_init(&names_lock, NULL);
	pthread_mutex_init(&alloc_lock, NULL);
	shim_vmm_forget();
}

void shim_kernel_alias(const void *key, const void *key2)
{
	struct shim_kernel *k = shim_kernel_find(key);

	if (!k || !key2)
		return;
	pthread_mutex_lock(&names_lock);
	put_key(key2, (uint32_t)(k - kernels));
	pthread_mutex_unlock(&names_lock);
}

void shim_kernel_each(void (*fn)(const struct shim_kernel *k, void *arg), void *arg)
{
	uint32_t i, n = __atomic_load_n(&nkernels, __ATOMIC_ACQUIRE);

	for (i = 0; i < n; i++)
		if (shim_kernel_launches(&kernels[i]))
			fn(&kernels[i], arg);
}

/*
 * Registration is done and the ledger mapped: every kernel known so far
 * gets its entry, with what it counted before.  Launches cannot race with
 * this: it runs inside shim_start_slow(), and every launch hook starts the
 * shim (and so waits for it) before it counts.
 */
void shim_names_attach(void)
{
	uint32_t i;

	pthread_mutex_lock(&names_lock);
	for (i = 0; i < nkernels; i++) {
		uint64_t *c;

		if (kernels[i].count != &kernels[i].launches)
			continue;
		c = shim_ledger_kernel(kernels[i].name, kernels[i].launches);
		if (c)
			__atomic_store_n(&kernels[i].count, c, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&names_lock);
}

/*
 * A launch of a key nobody registered (a library's kernel handle, made by
 * its runtime without __cudaRegisterFunction): ask the runtime its name
 * once, and remember "?" when it has none, so this costs one call per key.
 */
struct shim_kernel *shim_kernel_learn(const void *key)
{
	static cudaError_t (*get_name)(const char **, const void *);
	static int looked;
	const char *name = NULL;

	if (!key || shim_kernel_table_full())
		return NULL;
	if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
		*(void **)&get_name = shim_real_rt("cudaFuncGetName");
		__atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
	}
	if (get_name) {
		shim_in_runtime++;
		if (get_name(&name, key) != cudaSuccess)
			name = NULL;
		shim_in_runtime--;
	}
	return shim_kernel_add(key, name ? name : "?");
}

/* ------------------------------------------------------------------ modules */

#define WRAPPER_MAGIC  0x466243b1u      /* __cudaRegisterFatBinary's argument */

struct fat_wrapper {
	uint32_t magic;
	uint32_t version;
	const void *data;                /* the fat binary                     */
	const void *filename_or_fatbins;
};

struct shim_module {
	void **handle;                   /* NULL once unregistered             */
	const void *image;               /* published last, with release       */
	uint64_t size;
	int has_vars;                    /* device variables registered (atomic) */
};

static struct shim_module modules[SHIM_MAX_MODULES];
static uint32_t nmodules;

void shim_module_register(void **handle, const void *wrapper)
{
	struct fat_wrapper w;
	const unsigned char *img;
	uint32_t magic;
	uint16_t hdr;
	uint64_t fat;

	if (!handle || !wrapper)
		return;
	memcpy(&w, wrapper, sizeof(w));
	if (w.magic != WRAPPER_MAGIC || !w.data)
		return;          /* not a wrapper we know: its kernels have no module */
	img = w.data;
	memcpy(&magic, img, sizeof(magic));
	memcpy(&hdr, img + 6, sizeof(hdr));
	memcpy(&fat, img + 8, sizeof(fat));
	if (magic != FWD_FATBIN_MAGIC || hdr < 16 || fat > FWD_MAX_MODULE_BYTES - hdr)
		return;
	pthread_mutex_lock(&names_lock);
	if (nmodules < SHIM_MAX_MODULES) {
		struct shim_module *m = &modules[nmodules];

		m->handle = handle;
		m->size = hdr + fat;
		__atomic_store_n(&m->image, (const void *)img, __ATOMIC_RELEASE);
		__atomic_store_n(&nmodules, nmodules + 1, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&names_lock);
}

/* names_lock held */
static int find_module(void **handle)
{
	uint32_t i = nmodules;

	/* newest first: a handle reused after an unregistration, and the
	 * kernels that follow their fat binary's registration at once */
	while (i-- > 0)
		if (modules[i].handle == handle)
			return (int)i;
	return -1;
}

void shim_module_unregister(void **handle)
{
	int mid;

	pthread_mutex_lock(&names_lock);
	mid = handle ? find_module(handle) : -1;
	if (mid >= 0) {
		modules[mid].handle = NULL;
		__atomic_store_n(&modules[mid].image, NULL, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&names_lock);
}

int shim_module_of(void **handle)
{
	int mid;

	if (!handle)
		return -1;
	pthread_mutex_lock(&names_lock);
	mid = find_module(handle);
	pthread_mutex_unlock(&names_lock);
	return mid;
}

void shim_module_note_vars(void **handle)
{
	int mid = shim_module_of(handle);

	if (mid >= 0)
		__atomic_store_n(&modules[mid].has_vars, 1, __ATOMIC_RELEASE);
}

int shim_module_has_vars(int mid)
{
	if (mid < 0 || (uint32_t)mid >= __atomic_load_n(&nmodules, __ATOMIC_ACQUIRE))
		return 0;
	return __atomic_load_n(&modules[mid].has_vars, __ATOMIC_ACQUIRE);
}

int shim_module_image(int mid, const void **image, uint64_t *size)
{
	const void *img;

	if (mid < 0 || (uint32_t)mid >= __atomic_load_n(&nmodules, __ATOMIC_ACQUIRE))
		return -1;
	img = __atomic_load_n(&modules[mid].image, __ATOMIC_ACQUIRE);
	if (!img)
		return -1;
	*image = img;
	*size = modules[mid].size;
	return 0;
}

struct shim_kernel *shim_kernel_register(const void *key, const char *name, int mid)
{
	struct shim_kernel *k = shim_kernel_add(key, name);
	int moved, renamed;

	if (!k || !name)
		return k;
	pthread_mutex_lock(&names_lock);
	/* a module id is never reused (shim_module_register appends), so a
	 * new id means a new registration: the entry follows it, or its
	 * launches would name an unregistered module (and run locally for
	 * good) or, after another library took the address, another kernel */
	moved = mid >= 0 && mid != k->module;
	renamed = strcmp(k->name, name) != 0;
	if (renamed) {
		char *n = strdup(name);

		/* the old name stays: forwarding's stale view may still use it */
		if (n) {
			uint64_t *c = k->count != &k->launches ? shim_ledger_kernel(n, 0) : NULL;

			__atomic_store_n(&k->name, n, __ATOMIC_RELEASE);
			/* in the ledger, the new name counts from here in an
			 * entry of its own; the old one keeps what it had */
			if (c)
				__atomic_store_n(&k->count, c, __ATOMIC_RELEASE);
		}
	}
	if (moved)
		__atomic_store_n(&k->module, mid, __ATOMIC_RELEASE);
	if (moved || renamed)
		__atomic_add_fetch(&k->gen, 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&names_lock);
	return k;
}

/* ------------------------------------------------------------------ */
struct alloc {
	const void *ptr;
	size_t size;
	struct alloc *next;
};

#define ALLOC_BUCKETS 4096u
static struct alloc *allocs[ALLOC_BUCKETS];

void shim_alloc_note(const void *ptr, size_t size)
{
	struct alloc *a;
	uint32_t h = hash_ptr(ptr) & (ALLOC_BUCKETS - 1);

	if (shim_in_runtime)   /* counted by the outermost hook (shim.h) */
		return;
	/* COLOCATE_MEM=vmm: memory a worker will not see (cuMemAlloc, a
	 * fallback) keeps the app from being forwarded */
	if (ptr && !shim_vmm_owns(ptr))
		shim_vmm_note_native(NULL);
	a = malloc(sizeof(*a));
	if (!a)
		return;   /* neither count nor bytes: a free of it then undoes nothing */
	shim_add_signed(&shim_ctr->allocs_live, 1);
	shim_add_signed(&shim_ctr->alloc_bytes_live, (int64_t)size);
	a->ptr = ptr;
	a->size = size;
	pthread_mutex_lock(&alloc_lock);
	a->next = allocs[h];
	allocs[h] = a;
	pthread_mutex_unlock(&alloc_lock);
}

/*
 * Take ptr's record out BEFORE the real free: once the runtime has freed
 * it, another thread's allocation may return the same address and note
 * it, and that record must not be the one this free removes.
 */
void *shim_free_take(const void *ptr)
{
	uint32_t h = hash_ptr(ptr) & (ALLOC_BUCKETS - 1);
	struct alloc **pp, *a = NULL;

	if (shim_in_runtime || !ptr)
		return NULL;
	pthread_mutex_lock(&alloc_lock);
	for (pp = &allocs[h]; *pp; pp = &(*pp)->next) {
		if ((*pp)->ptr == ptr) {
			a = *pp;
			*pp = a->next;
			break;
		}
	}
	pthread_mutex_unlock(&alloc_lock);
	return a;   /* NULL: not ours (or failed allocation): nothing to undo */
}

/* After the real free: count it (freed), or put the record back. */
void shim_free_done(void *token, int freed)
{
	struct alloc *a = token;
	uint32_t h;

	if (!a)
		return;
	if (freed) {
		shim_add_signed(&shim_ctr->allocs_live, -1);
		shim_add_signed(&shim_ctr->alloc_bytes_live, -(int64_t)a->size);
		free(a);
		return;
	}
	h = hash_ptr(a->ptr) & (ALLOC_BUCKETS - 1);
	pthread_mutex_lock(&alloc_lock);
	a->next = allocs[h];
	allocs[h] = a;
	pthread_mutex_unlock(&alloc_lock);
}
