/*
 * handoff_export.c - the exporter: its table of buffers and the calls of
 * the stage that owns them (Camelot §VI-B, the sender M1 of Fig. 10).
 *
 * A buffer's slot index is its id; each use of a slot gets a new
 * generation (a random start plus a counter), so a handle of a freed
 * buffer never names its successor (stale), and one cannot be guessed.
 * A buffer lives while the exporter holds its own reference (until
 * colocate_handoff_drop), any importer connection holds one (counted in
 * refs; which connection holds what is the service thread's business), a
 * pre-paid reference of an export is unclaimed and not yet expired, or an
 * importer keeps a mapping of it (its connection's maps[] count): memory
 * is never freed under an importer's mapping.
 * Memory is freed outside the lock, by whoever dropped the last
 * reference, since cudaFree may synchronise the device and a free_fn may
 * call back into us.
 */
#define _GNU_SOURCE
#include "handoff_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

/* The exporter's shared table, locks and struct (the service thread is
 * stopped, or never started). */
static void exporter_release(struct colocate_handoff_exporter *ex)
{
	if (ex->tab) {
		munmap(ex->tab, sizeof(*ex->tab));
		close(ex->tab_fd);
	}
	pthread_mutex_destroy(&ex->mu);
	pthread_cond_destroy(&ex->cv);
	free(ex);
}

HF_API int colocate_handoff_exporter_new(const char *dir, struct colocate_handoff_exporter **out)
{
	static uint32_t serial;             /* several exporters in one process */
	struct colocate_handoff_exporter *ex;
	char d[COLOCATE_HANDOFF_PATH_MAX];
	uint64_t seed = 0;
	int rc, n;

	if (!out)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "exporter_new: NULL out");
	*out = NULL;
	rc = hf_runtime_dir(dir, d, sizeof(d));
	if (rc)
		return rc;
	ex = calloc(1, sizeof(*ex));
	if (!ex)
		return hf_err(COLOCATE_HANDOFF_E_NOMEM, "exporter_new: out of memory");
	n = snprintf(ex->path, sizeof(ex->path), "%s/hf-%u-%u.sock", d, (unsigned)getpid(),
		     __atomic_add_fetch(&serial, 1, __ATOMIC_RELAXED));
	if (n < 0 || (size_t)n >= sizeof(ex->path)) {
		free(ex);
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "exporter socket path under %s is longer than %d "
			      "bytes (a Unix socket's limit): use a shorter runtime dir", d,
			      COLOCATE_HANDOFF_PATH_MAX - 1);
	}
	if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != sizeof(seed))
		seed = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid();
	ex->gen_next = seed | 1;
	ex->uid = (uint32_t)geteuid();
	ex->pid = (uint32_t)getpid();
	ex->lfd = ex->wake[0] = ex->wake[1] = -1;
	ex->tab_fd = -1;
	ex->prepaid_timeout_ns = (int64_t)COLOCATE_HANDOFF_PREPAID_TIMEOUT_MS * 1000000;
	ex->svc_deadline = ex->svc_sleep_until = HF_NEVER;
	/* the table importers read for the fast path; without it (no memfd)
	 * every open asks the service thread */
	{
		int tfd = memfd_create("colocate-handoff-tab", MFD_CLOEXEC);
		void *m = MAP_FAILED;

		if (tfd >= 0 && ftruncate(tfd, sizeof(struct hf_shm_tab)) == 0)
			m = mmap(NULL, sizeof(struct hf_shm_tab), PROT_READ | PROT_WRITE, MAP_SHARED, tfd, 0);
		if (m != MAP_FAILED) {
			ex->tab = m;
			ex->tab->magic = HF_SHM_MAGIC;
			ex->tab->nslots = HF_SHM_SLOTS;
			ex->tab_fd = tfd;
		} else if (tfd >= 0)
			close(tfd);
	}
	pthread_mutex_init(&ex->mu, NULL);
	pthread_cond_init(&ex->cv, NULL);
	rc = hf_service_start(ex);
	if (rc) {
		exporter_release(ex);
		return rc;
	}
	*out = ex;
	return COLOCATE_HANDOFF_OK;
}

HF_API const char *colocate_handoff_exporter_path(const struct colocate_handoff_exporter *ex)
{
	return ex ? ex->path : "";
}

static int wait_released(struct colocate_handoff_exporter *ex, int wait_ms)
{
	struct timespec dl;
	size_t i;

	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += wait_ms / 1000;
	dl.tv_nsec += (long)(wait_ms % 1000) * 1000000L;
	if (dl.tv_nsec >= 1000000000L) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000L;
	}
	for (;;) {
		int busy = 0;

		for (i = 0; i < ex->nbufs; i++)
			busy |= ex->bufs[i].used && hf_total_refs(ex, (uint32_t)i);
		if (!busy)
			return 0;
		if (pthread_cond_timedwait(&ex->cv, &ex->mu, &dl) == ETIMEDOUT)
			return -1;
	}
}

/* Legacy IPC memory a live importer maps must not be freed (undefined
 * behaviour); VMM memory may: the driver keeps it for the mapping. */
static int must_keep(const struct hf_buf *b)
{
	return b->pinned && b->kind == COLOCATE_HANDOFF_KIND_IPC;
}

HF_API int colocate_handoff_exporter_free(struct colocate_handoff_exporter *ex, int wait_ms)
{
	size_t i;
	int late = 0;

	if (!ex)
		return COLOCATE_HANDOFF_OK;
	pthread_mutex_lock(&ex->mu);
	if (wait_ms > 0)
		late = wait_released(ex, wait_ms) < 0;
	/* no importer may take a fast reference from now on */
	for (i = 0; i < ex->nbufs; i++)
		hf_unpublish(ex, (uint32_t)i);
	pthread_mutex_unlock(&ex->mu);
	/* importers still holding references see EOF: their views stay
	 * mapped until they close them (see the header); what a live one
	 * still maps is pinned by hf_service_stop, and IPC memory of it is
	 * left allocated (the process's exit frees it) */
	hf_service_stop(ex);
	for (i = 0; i < ex->nbufs; i++)
		if (ex->bufs[i].used && !must_keep(&ex->bufs[i]))
			hf_buf_free(&ex->bufs[i]);
	free(ex->bufs);
	exporter_release(ex);
	if (late)
		return hf_err(COLOCATE_HANDOFF_E_TIMEOUT, "exporter_free: importers still held buffers "
			      "after %d ms; they were cut off", wait_ms);
	return COLOCATE_HANDOFF_OK;
}

HF_API int colocate_handoff_exporter_stats(struct colocate_handoff_exporter *ex,
					   struct colocate_handoff_exporter_stats *st)
{
	if (!ex || !st)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "exporter_stats: NULL argument");
	pthread_mutex_lock(&ex->mu);
	*st = ex->st;
	st->connections = ex->nconns;
	/* the fast path's references and counts live in the connections' tables */
	{
		size_t c, s;

		for (c = 0; c < ex->nconns; c++) {
			struct hf_shm_conn *sc = ex->conns[c].shm;

			if (!sc)
				continue;
			st->acquires += HF_LOAD(&sc->acquires);
			st->releases += HF_LOAD(&sc->releases);
			for (s = 0; s < HF_SHM_SLOTS && s < ex->nbufs; s++)
				st->held_refs += HF_LOAD(&sc->refs[s]);
		}
	}
	pthread_mutex_unlock(&ex->mu);
	return COLOCATE_HANDOFF_OK;
}

HF_API int colocate_handoff_exporter_hold_stats(struct colocate_handoff_exporter *ex,
						struct colocate_handoff_exporter_hold_stats *st)
{
	uint64_t prepaid = 0, mapped = 0;
	size_t s;

	if (!ex || !st)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "exporter_hold_stats: NULL argument");

	pthread_mutex_lock(&ex->mu);
	for (s = 0; s < ex->nbufs; s++) {
		if (!ex->bufs[s].used)
			continue;
		hf_settle(ex, (uint32_t)s);
		prepaid += ex->bufs[s].prepaid;
		mapped += hf_total_maps(ex, (uint32_t)s);
	}
	*st = ex->hst;
	st->prepaid = prepaid;
	st->mapped = mapped;
	st->prepaid_timeout_ms = (uint64_t)(ex->prepaid_timeout_ns / 1000000);
	pthread_mutex_unlock(&ex->mu);
	return COLOCATE_HANDOFF_OK;
}

HF_API int colocate_handoff_exporter_set_prepaid_timeout(struct colocate_handoff_exporter *ex, int ms)
{
	if (!ex || ms <= 0)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "set_prepaid_timeout: %d ms (more than 0 needed)",
			      ms);
	pthread_mutex_lock(&ex->mu);
	ex->prepaid_timeout_ns = (int64_t)ms * 1000000;
	pthread_mutex_unlock(&ex->mu);
	return COLOCATE_HANDOFF_OK;
}

/* A free slot for a new buffer (table grown when full): its index, or -1. */
static long new_slot(struct colocate_handoff_exporter *ex)
{
	size_t i;

	for (i = 0; i < ex->nbufs; i++)
		if (!ex->bufs[i].used)
			return (long)i;
	if (ex->nbufs == ex->capbufs) {
		size_t nc = ex->capbufs ? ex->capbufs * 2 : 16;
		struct hf_buf *nb = realloc(ex->bufs, nc * sizeof(*nb));

		if (!nb)
			return -1;
		ex->bufs = nb;
		ex->capbufs = nc;
	}
	memset(&ex->bufs[ex->nbufs], 0, sizeof(ex->bufs[0]));
	return (long)ex->nbufs++;
}

/* Put b in a free slot with a fresh generation; OK, or E_NOMEM.  mu held. */
static int add_buf(struct colocate_handoff_exporter *ex, struct hf_buf *b)
{
	long s = new_slot(ex);

	if (s < 0)
		return hf_err(COLOCATE_HANDOFF_E_NOMEM, "exporter: out of memory for the buffer table");
	b->used = 1;
	b->own = 1;
	b->gen = ex->gen_next++;
	ex->bufs[s] = *b;
	ex->st.live_buffers++;
	return COLOCATE_HANDOFF_OK;
}

static long find_ptr(struct colocate_handoff_exporter *ex, const void *p)
{
	size_t i;

	for (i = 0; i < ex->nbufs; i++)
		if (ex->bufs[i].used && ex->bufs[i].ptr == p)
			return (long)i;
	return -1;
}

int hf_lookup(struct colocate_handoff_exporter *ex, uint64_t id, uint64_t gen, uint64_t size)
{
	struct hf_buf *b;

	if (id >= ex->nbufs)
		return hf_err(COLOCATE_HANDOFF_E_STALE, "no buffer %llu in exporter pid %u (never "
			      "exported, or forged)", (unsigned long long)id, ex->pid);
	b = &ex->bufs[id];
	if (!b->used || !b->exported || b->gen != gen)
		return hf_err(COLOCATE_HANDOFF_E_STALE, "stale handle: buffer %llu of exporter pid %u "
			      "was freed (generation %llx is gone)", (unsigned long long)id, ex->pid,
			      (unsigned long long)gen);
	if (size != b->size)
		return hf_err(COLOCATE_HANDOFF_E_SIZE, "handle says %llu bytes, buffer %llu has %llu",
			      (unsigned long long)size, (unsigned long long)id,
			      (unsigned long long)b->size);
	return (int)id;
}

uint64_t hf_total_refs(struct colocate_handoff_exporter *ex, uint32_t s)
{
	uint64_t n = ex->bufs[s].refs;
	size_t c;

	if (s >= HF_SHM_SLOTS)
		return n;
	for (c = 0; c < ex->nconns; c++)
		if (ex->conns[c].shm)
			n += HF_LOAD(&ex->conns[c].shm->refs[s]);
	return n;
}

void hf_publish(struct colocate_handoff_exporter *ex, uint32_t s)
{
	const struct hf_buf *b = &ex->bufs[s];

	if (!ex->tab || s >= HF_SHM_SLOTS || !b->used || !b->own || !b->exported)
		return;
	if (HF_LOAD(&ex->tab->s[s].gen) == b->gen)
		return;
	/* the size first: a reader checks the generation before and after */
	HF_STORE(&ex->tab->s[s].size, b->size);
	HF_STORE(&ex->tab->s[s].gen, b->gen);
}

void hf_unpublish(struct colocate_handoff_exporter *ex, uint32_t s)
{
	if (ex->tab && s < HF_SHM_SLOTS)
		HF_STORE(&ex->tab->s[s].gen, 0);
}

uint64_t hf_total_maps(struct colocate_handoff_exporter *ex, uint32_t s)
{
	uint64_t n = 0;
	size_t c;

	if (s >= HF_SHM_SLOTS)
		return 0;
	for (c = 0; c < ex->nconns; c++)
		if (ex->conns[c].shm)
			n += HF_LOAD(&ex->conns[c].shm->maps[s]);
	return n;
}

int64_t hf_now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* n pre-paid references of b go (claimed, expired or revoked).  mu held. */
static uint64_t prepaid_take(struct colocate_handoff_exporter *ex, struct hf_buf *b, uint64_t n)
{
	if (n > b->prepaid)
		n = b->prepaid;
	b->prepaid -= n;
	ex->prepaid_total -= n;
	return n;
}

void hf_settle(struct colocate_handoff_exporter *ex, uint32_t s)
{
	struct hf_buf *b = &ex->bufs[s];
	size_t c;

	if (s >= HF_SHM_SLOTS)
		return;
	for (c = 0; c < ex->nconns; c++) {
		struct hf_conn *cn = &ex->conns[c];
		uint32_t now, d;

		if (!cn->shm || !cn->claims_seen)
			continue;
		now = HF_LOAD(&cn->shm->claims[s]);
		d = now - cn->claims_seen[s];           /* monotonic, wraps */
		if (!d)
			continue;
		cn->claims_seen[s] = now;
		/* claims past what was paid count for nothing: a connection
		 * cannot take over more than was paid */
		if (b->used)
			ex->hst.prepaid_claimed += prepaid_take(ex, b, d);
	}
}

void hf_claim(struct colocate_handoff_exporter *ex, uint32_t s)
{
	hf_settle(ex, s);
	ex->hst.prepaid_claimed += prepaid_take(ex, &ex->bufs[s], 1);
}

int hf_take_dead(struct colocate_handoff_exporter *ex, uint32_t slot, struct hf_buf *out)
{
	struct hf_buf *b = &ex->bufs[slot];

	if (!b->used || b->own || hf_total_refs(ex, slot))
		return 0;
	if (hf_total_maps(ex, slot)) {
		/* an importer still maps it: freed once it unmaps (a message
		 * that follows the unmap brings us back, or hf_reap) */
		if (!b->held_by_map) {
			int64_t reap = hf_now_ns() + (int64_t)HF_REAP_MS * 1000000;

			ex->map_pending++;
			/* the service thread reaps within HF_REAP_MS: wake it if
			 * it sleeps longer (once: then it keeps a timer) */
			if (ex->thread_on && ex->svc_sleep_until > reap) {
				ex->svc_sleep_until = reap;
				if (write(ex->wake[1], "r", 1) < 0) {
					/* full: it is awake already */
				}
			}
		}
		b->held_by_map = 1;
		return 0;
	}
	/* claims made while a reference was held were counted before it
	 * went: settled after the references were read as 0 */
	hf_settle(ex, slot);
	if (b->prepaid)
		return 0;
	*out = *b;
	b->used = 0;
	ex->st.live_buffers--;
	ex->st.frees++;
	if (b->held_by_map) {
		ex->hst.frees_after_unmap++;
		ex->map_pending--;
	}
	ex->hst.last_free_ns = (uint64_t)hf_now_ns();
	return 1;
}

void hf_reap(struct colocate_handoff_exporter *ex)
{
	for (;;) {
		struct hf_buf dead;
		int freeit = 0;
		size_t s;

		pthread_mutex_lock(&ex->mu);
		for (s = 0; ex->map_pending && s < ex->nbufs && !freeit; s++)
			if (ex->bufs[s].used && ex->bufs[s].held_by_map)
				freeit = hf_take_dead(ex, (uint32_t)s, &dead);
		if (freeit)
			pthread_cond_broadcast(&ex->cv);
		pthread_mutex_unlock(&ex->mu);
		if (!freeit)
			return;
		hf_buf_free(&dead);
	}
}

int64_t hf_expire(struct colocate_handoff_exporter *ex)
{
	int64_t next;

	for (;;) {
		struct hf_buf dead;
		int freeit = 0;
		int64_t now = hf_now_ns();
		size_t s;

		next = HF_NEVER;
		pthread_mutex_lock(&ex->mu);
		for (s = 0; ex->prepaid_total && s < ex->nbufs && !freeit; s++) {
			struct hf_buf *b = &ex->bufs[s];

			if (!b->used || !b->prepaid)
				continue;
			if (b->prepaid_deadline > now) {
				if (b->prepaid_deadline < next)
					next = b->prepaid_deadline;
				continue;
			}
			hf_settle(ex, (uint32_t)s);
			ex->hst.prepaid_expired += prepaid_take(ex, b, b->prepaid);
			freeit = hf_take_dead(ex, (uint32_t)s, &dead);
			pthread_cond_broadcast(&ex->cv);
		}
		if (!freeit)
			ex->svc_deadline = next;      /* the service thread's next wake-up */
		pthread_mutex_unlock(&ex->mu);
		if (!freeit)
			return next;
		hf_buf_free(&dead);                   /* and look again */
	}
}

void hf_buf_free(const struct hf_buf *b)
{
	const struct hf_rt *r;
	int cur = -1;

	if (b->how_free == HF_FREE_FN) {
		b->free_fn(b->free_arg, b->ptr);
		return;
	}
	if (hf_rt_get(&r))
		return;
	/* this may be the service thread: the buffer's device, not thread 0's */
	if (r->get_device(&cur) == cudaSuccess && cur != b->device)
		r->set_device(b->device);
	switch (b->how_free) {
	case HF_FREE_VMM:
		hf_vmm_free(b->ptr, b->alloc_size, b->vh);
		break;
	case HF_FREE_RETAINED:
		r->release(b->vh);          /* the reference retain took */
		r->free_(b->ptr);
		break;
	default:
		r->free_(b->ptr);
		break;
	}
}

HF_API int colocate_handoff_alloc(struct colocate_handoff_exporter *ex, uint64_t size,
				  unsigned flags, void **ptr)
{
	const struct hf_rt *r;
	struct hf_buf b;
	uint8_t uuid[16];
	cudaError_t e;
	int rc;

	if (!ex || !ptr || !size || (flags & ~COLOCATE_HANDOFF_ALLOC_VMM))
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "alloc: bad argument (size %llu, flags %#x)",
			      (unsigned long long)size, flags);
	rc = hf_rt_get(&r);
	if (rc)
		return rc;
	hf_reap(ex);                        /* memory importers no longer map, first */
	memset(&b, 0, sizeof(b));
	rc = hf_cur_device(&b.device, uuid);
	if (rc)
		return rc;
	b.size = b.alloc_size = size;
	if (!(flags & COLOCATE_HANDOFF_ALLOC_VMM)) {
		e = r->malloc_(&b.ptr, size);
		if (e != cudaSuccess)
			return hf_cuda_err("cudaMalloc", e);
		cudaError_t before = hf_quiet_begin();

		e = r->ipc_get(&b.ipc, b.ptr);
		if (e == cudaSuccess) {
			b.kind = COLOCATE_HANDOFF_KIND_IPC;
			b.how_free = HF_FREE_CUDA;
		} else {
			hf_quiet_end(before);       /* a probe: not the app's error */
			/* cudaMalloc gave VMM memory (the shim's COLOCATE_MEM=vmm):
			 * cudaIpc cannot share it, so make our own, shareable by fd */
			r->free_(b.ptr);
			b.ptr = NULL;
		}
	}
	if (!b.ptr) {
		rc = hf_vmm_alloc(b.device, size, &b.ptr, &b.alloc_size, &b.vh);
		if (rc)
			return rc;
		b.kind = COLOCATE_HANDOFF_KIND_FD;
		b.how_free = HF_FREE_VMM;
	}
	pthread_mutex_lock(&ex->mu);
	rc = add_buf(ex, &b);
	pthread_mutex_unlock(&ex->mu);
	if (rc) {
		hf_buf_free(&b);
		return rc;
	}
	*ptr = b.ptr;
	return COLOCATE_HANDOFF_OK;
}

/* A pointer the caller allocated: how to share it (IPC, or the fd of its
 * VMM allocation) and how to free it.  No lock held (CUDA calls). */
static int adopt(void *ptr, uint64_t size, void (*free_fn)(void *, void *), void *arg,
		 struct hf_buf *b)
{
	const struct hf_rt *r;
	uint8_t uuid[16];
	cudaError_t e;
	CUresult cr;
	int rc = hf_rt_get(&r);

	if (rc)
		return rc;
	memset(b, 0, sizeof(*b));
	rc = hf_cur_device(&b->device, uuid);
	if (rc)
		return rc;
	b->ptr = ptr;
	b->size = b->alloc_size = size;
	b->free_fn = free_fn;
	b->free_arg = arg;
	b->how_free = free_fn ? HF_FREE_FN : HF_FREE_CUDA;
	{
		cudaError_t before = hf_quiet_begin();

		e = r->ipc_get(&b->ipc, ptr);
		if (e == cudaSuccess) {
			b->kind = COLOCATE_HANDOFF_KIND_IPC;
			return COLOCATE_HANDOFF_OK;
		}
		hf_quiet_end(before);               /* a probe: not the app's error */
	}
	/* not cudaMalloc memory: VMM memory (the shim's COLOCATE_MEM=vmm)
	 * is shared by the fd of its allocation handle */
	if (!r->retain || !r->vmm)
		return hf_err(COLOCATE_HANDOFF_E_UNSUPPORTED, "export %p: cudaIpcGetMemHandle failed "
			      "(CUDA error %d: not the start of a cudaMalloc allocation?) and the driver "
			      "offers no cuMemRetainAllocationHandle for VMM memory; allocate hand-off "
			      "buffers with colocate_handoff_alloc", ptr, (int)e);
	cr = r->retain(&b->vh, ptr);
	if (cr != CUDA_SUCCESS)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "export %p: neither cudaMalloc memory (CUDA "
			      "error %d) nor VMM memory (cuMemRetainAllocationHandle: CUresult %d)",
			      ptr, (int)e, (int)cr);
	b->kind = COLOCATE_HANDOFF_KIND_FD;
	/* the importer maps the allocation whole: its size rounded up to the
	 * granularity, as cuMemCreate rounded it (the shim's shim_vmm.c does) */
	{
		CUmemAllocationProp prop;
		size_t g = 0;

		memset(&prop, 0, sizeof(prop));
		prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
		prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
		prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
		prop.location.id = b->device;
		if (r->gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) != CUDA_SUCCESS || !g)
			g = 2u << 20;
		b->alloc_size = (size + g - 1) / g * g;
	}
	if (!free_fn)
		b->how_free = HF_FREE_RETAINED;
	return COLOCATE_HANDOFF_OK;
}

static void fill_handle(struct colocate_handoff_exporter *ex, long s,
			struct colocate_handoff_handle *h)
{
	const struct hf_buf *b = &ex->bufs[s];
	uint8_t uuid[16];
	int dev;

	memset(h, 0, sizeof(*h));
	h->magic = COLOCATE_HANDOFF_MAGIC;
	h->version = COLOCATE_HANDOFF_VERSION;
	h->kind = (uint16_t)b->kind;
	h->pid = ex->pid;
	h->uid = ex->uid;
	h->id = (uint64_t)s;
	h->gen = b->gen;
	h->size = b->size;
	h->device = b->device;
	if (hf_cur_device(&dev, uuid) == COLOCATE_HANDOFF_OK && dev == b->device)
		memcpy(h->uuid, uuid, sizeof(h->uuid));
	if (b->kind == COLOCATE_HANDOFF_KIND_IPC)
		memcpy(h->ipc, &b->ipc, sizeof(h->ipc));
	memcpy(h->path, ex->path, sizeof(h->path));
	h->checksum = hf_checksum(h);
}

/* consumers pre-paid references for slot s, expiring after the timeout;
 * the service thread woken if it sleeps past that.  mu held. */
static void prepay(struct colocate_handoff_exporter *ex, long s, uint32_t consumers)
{
	struct hf_buf *b = &ex->bufs[s];
	int64_t dl;

	if (!consumers)
		return;
	/* claims of earlier exports first: they must not eat these */
	hf_settle(ex, (uint32_t)s);
	dl = hf_now_ns() + ex->prepaid_timeout_ns;
	b->prepaid += consumers;
	b->prepaid_deadline = dl;
	ex->prepaid_total += consumers;
	ex->hst.prepaid_issued += consumers;
	if (dl < ex->svc_deadline && ex->thread_on) {
		ex->svc_deadline = dl;
		if (write(ex->wake[1], "d", 1) < 0) {
			/* full: the thread is awake already */
		}
	}
}

HF_API int colocate_handoff_export(struct colocate_handoff_exporter *ex, void *ptr, uint64_t size,
				   void (*free_fn)(void *arg, void *ptr), void *free_arg,
				   struct colocate_handoff_handle *out)
{
	return colocate_handoff_export_ex(ex, ptr, size, free_fn, free_arg, 0, out);
}

HF_API int colocate_handoff_export_ex(struct colocate_handoff_exporter *ex, void *ptr, uint64_t size,
				      void (*free_fn)(void *arg, void *ptr), void *free_arg,
				      uint32_t consumers, struct colocate_handoff_handle *out)
{
	struct hf_buf b;
	long s;
	int rc;

	if (!ex || !ptr || !out)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "export: NULL argument");
	pthread_mutex_lock(&ex->mu);
	s = find_ptr(ex, ptr);
	if (s >= 0) {
		struct hf_buf *kb = &ex->bufs[s];

		if (!kb->own) {
			pthread_mutex_unlock(&ex->mu);
			return hf_err(COLOCATE_HANDOFF_E_STALE, "export %p: already dropped by the "
				      "exporter (importers still hold it)", ptr);
		}
		if (size && size != kb->size) {
			pthread_mutex_unlock(&ex->mu);
			return hf_err(COLOCATE_HANDOFF_E_SIZE, "export %p: %llu bytes, it has %llu", ptr,
				      (unsigned long long)size, (unsigned long long)kb->size);
		}
		if (!kb->exported)
			ex->st.exports++;
		kb->exported = 1;
		hf_publish(ex, (uint32_t)s);
		prepay(ex, s, consumers);
		fill_handle(ex, s, out);
		pthread_mutex_unlock(&ex->mu);
		return COLOCATE_HANDOFF_OK;
	}
	pthread_mutex_unlock(&ex->mu);
	if (!size)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "export %p: size 0 (a pointer not from "
			      "colocate_handoff_alloc needs its size)", ptr);
	rc = adopt(ptr, size, free_fn, free_arg, &b);
	if (rc)
		return rc;
	b.exported = 1;
	pthread_mutex_lock(&ex->mu);
	s = find_ptr(ex, ptr);
	if (s >= 0) {
		/* another thread exported it meanwhile: one record only */
		pthread_mutex_unlock(&ex->mu);
		if (b.how_free == HF_FREE_RETAINED) {
			const struct hf_rt *r;

			if (hf_rt_get(&r) == COLOCATE_HANDOFF_OK)
				r->release(b.vh);
		}
		return colocate_handoff_export_ex(ex, ptr, size, free_fn, free_arg, consumers, out);
	}
	rc = add_buf(ex, &b);
	if (rc == COLOCATE_HANDOFF_OK) {
		s = find_ptr(ex, ptr);
		ex->st.exports++;
		hf_publish(ex, (uint32_t)s);
		prepay(ex, s, consumers);
		fill_handle(ex, s, out);
	}
	pthread_mutex_unlock(&ex->mu);
	return rc;
}

HF_API int colocate_handoff_drop(struct colocate_handoff_exporter *ex, void *ptr)
{
	struct hf_buf dead;
	int rc = COLOCATE_HANDOFF_OK, freeit = 0;
	long s;

	if (!ex || !ptr)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "drop: NULL argument");
	pthread_mutex_lock(&ex->mu);
	s = find_ptr(ex, ptr);
	if (s < 0)
		rc = hf_err(COLOCATE_HANDOFF_E_STALE, "drop %p: not a live buffer of this exporter", ptr);
	else if (!ex->bufs[s].own)
		rc = hf_err(COLOCATE_HANDOFF_E_STALE, "drop %p: already dropped", ptr);
	else {
		ex->bufs[s].own = 0;
		/* withdrawn before the references are summed (see handoff_int.h) */
		hf_unpublish(ex, (uint32_t)s);
		freeit = hf_take_dead(ex, (uint32_t)s, &dead);
	}
	pthread_mutex_unlock(&ex->mu);
	if (freeit)
		hf_buf_free(&dead);
	return rc;
}

HF_API int colocate_handoff_refs(struct colocate_handoff_exporter *ex, void *ptr, uint64_t *refs)
{
	long s;

	if (!ex || !ptr || !refs)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "refs: NULL argument");
	pthread_mutex_lock(&ex->mu);
	s = find_ptr(ex, ptr);
	if (s >= 0)
		*refs = hf_total_refs(ex, (uint32_t)s);
	pthread_mutex_unlock(&ex->mu);
	if (s < 0)
		return hf_err(COLOCATE_HANDOFF_E_STALE, "refs %p: not a live buffer of this exporter", ptr);
	return COLOCATE_HANDOFF_OK;
}

HF_API int colocate_handoff_revoke(struct colocate_handoff_exporter *ex, void *ptr)
{
	struct hf_buf dead;
	uint64_t n = 0;
	int freeit = 0;
	long s;

	if (!ex || !ptr)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "revoke: NULL argument");
	pthread_mutex_lock(&ex->mu);
	s = find_ptr(ex, ptr);
	if (s >= 0) {
		hf_settle(ex, (uint32_t)s);
		n = prepaid_take(ex, &ex->bufs[s], ex->bufs[s].prepaid);
		ex->hst.prepaid_revoked += n;
		freeit = hf_take_dead(ex, (uint32_t)s, &dead);
		pthread_cond_broadcast(&ex->cv);
	}
	pthread_mutex_unlock(&ex->mu);
	if (s < 0)
		return hf_err(COLOCATE_HANDOFF_E_STALE, "revoke %p: not a live buffer of this exporter", ptr);
	if (freeit)
		hf_buf_free(&dead);
	return n > INT32_MAX ? INT32_MAX : (int)n;
}
