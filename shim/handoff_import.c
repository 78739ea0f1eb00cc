/*
 * handoff_import.c - the importer (Camelot §VI-B, the receiver M2 of
 * Fig. 10): opens handles over one connection per exporter (the
 * connection carries its references: when this process dies the exporter
 * drops them; kept idle for the next handle once the last view closed),
 * and falls back to a copy when the buffer cannot be mapped here.
 *
 * Opening:
 *   1. the handle's bytes are checked (length, magic, version, checksum,
 *      uid) before anyone is contacted;
 *   2. same device (UUID) and no copy asked for: ACQUIRE, then map it
 *      (cudaIpcOpenMemHandle, or the fd from the reply with cuMemMap; in
 *      the exporter's own process, its pointer);
 *   3. otherwise, or when mapping fails (another GPU, another simulated
 *      device): RELEASE what was acquired, COPY, and put the data in a
 *      device buffer of ours (or leave it in host memory when asked),
 *      counted in the statistics.
 * Views and connections are plain arrays under one mutex; a request and
 * its reply go under it, so replies cannot cross.
 *
 * The fast path (handoff_int.h): where the exporter shared its tables
 * (HELLO, once per connection), a reference is taken and given back in
 * shared memory, without waking the exporter - a round trip to a thread
 * that sleeps costs 20 us hot and 150-250 us once its CPU went idle.
 * Releases that need the exporter (it dropped its own reference) and the
 * slow path's releases are one-way messages: the exporter reads them in
 * order, so a later request on the connection sees them, and a connection
 * that ends drops what it still held.
 *
 * Mappings are kept (a small cache per importer, keyed by connection,
 * buffer id and generation) after their last view closed, so that a
 * buffer handed over batch after batch is mapped once.  A kept mapping
 * holds its buffer (maps[] in the connection's table, taken while a view
 * holds a reference): the exporter never frees memory mapped here.  It
 * goes when the exporter withdraws the buffer (drop: its table entry
 * changes), seen at our next open or close (or trim); when the connection
 * ends; or with the importer.  Unmapped first, then the hold given back.
 * The exporter frees a withdrawn buffer once its holds are gone: at once
 * where a message follows (the release of a view's reference, a trim's
 * NOTIFY, the connection's end), else at its next alloc or within its
 * service thread's reaping period (HF_REAP_MS): a NOTIFY per eviction
 * would wake it on every fresh buffer's hand-off.
 *
 * Pre-paid references: the open that starts this connection's hold on a
 * buffer (no view of it open here) claims one, in shared memory on the
 * fast path (claims[]), in the ACQUIRE or COPY request otherwise.
 * COLOCATE_HANDOFF_SLOW=1 in the environment turns both off (every open
 * asks the exporter and maps anew, as before).
 */
#define _GNU_SOURCE
#include "handoff_int.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

struct hf_iconn {
	int      fd;                    /* -1: slot free                         */
	uint32_t pid;
	uint32_t nviews;
	int      gone;                  /* EOF seen: views stay, no new ones     */
	const struct hf_shm_tab *tab;   /* after HELLO (NULL: slow path only)    */
	struct hf_shm_conn *shm;
	char     path[COLOCATE_HANDOFF_PATH_MAX];
};

/* A mapping, kept while views use it and after (see above). */
struct hf_map {
	int      used;
	long     conn;
	uint64_t id, gen;
	uint32_t kind, nviews;
	void    *ptr;
	uint64_t map_size;
	CUmemGenericAllocationHandle vh;
};

#define HF_MAP_CACHE 64

struct hf_view {
	int      used;
	uint32_t serial;                /* with the index, the view's token      */
	long     conn;                  /* -1 for copies                         */
	long     map;                   /* kept mapping, or -1                   */
	int      fast;                  /* its reference is a fast one           */
	uint64_t id, gen;
	uint32_t how, kind;
	void    *ptr;
	uint64_t size, map_size;
	CUmemGenericAllocationHandle vh;
	int      device;
};

struct colocate_handoff_importer {
	pthread_mutex_t mu;
	struct hf_iconn *conns;
	size_t nconns;
	struct hf_view *views;
	size_t nviews;
	uint32_t serial;
	int slow;                       /* COLOCATE_HANDOFF_SLOW: no fast path, no cache */
	uint32_t pid;                   /* ours (a forked child makes its own importer) */
	struct hf_map maps[HF_MAP_CACHE];
	struct colocate_handoff_importer_stats st;
	struct colocate_handoff_importer_cache_stats cst;
};

HF_API int colocate_handoff_importer_new(struct colocate_handoff_importer **out)
{
	struct colocate_handoff_importer *im;
	const char *slow = getenv("COLOCATE_HANDOFF_SLOW");

	if (!out)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "importer_new: NULL out");
	im = calloc(1, sizeof(*im));
	if (!im)
		return hf_err(COLOCATE_HANDOFF_E_NOMEM, "importer_new: out of memory");
	pthread_mutex_init(&im->mu, NULL);
	im->slow = slow && *slow && strcmp(slow, "0") != 0;
	im->pid = (uint32_t)getpid();
	*out = im;
	return COLOCATE_HANDOFF_OK;
}

/* ---------------------------------------------------------------- mappings */

static void unmap_raw(uint32_t kind, void *ptr, uint64_t map_size, CUmemGenericAllocationHandle vh)
{
	const struct hf_rt *rt;

	if (hf_rt_get(&rt))
		return;
	if (kind == COLOCATE_HANDOFF_KIND_FD)
		hf_vmm_free(ptr, map_size, vh);
	else
		rt->ipc_close(ptr);
}

static int post(struct colocate_handoff_importer *im, long c, int op, uint64_t id, uint64_t gen);

/* Unmap kept mapping mi, then give back its hold; with tell, tell the
 * exporter when it waits for that (the buffer withdrawn), else it reaps
 * it soon (see above).  mu held. */
static void map_evict(struct colocate_handoff_importer *im, long mi, int tell)
{
	struct hf_map *m = &im->maps[mi];
	struct hf_iconn *ic = &im->conns[m->conn];

	unmap_raw(m->kind, m->ptr, m->map_size, m->vh);
	m->used = 0;
	im->cst.cached--;
	im->cst.unmaps++;
	if (ic->fd < 0 || !ic->shm)
		return;
	/* the Dekker pair of handoff_int.h: the exporter withdraws the buffer
	 * and then sums the holds; we give ours back and then look */
	HF_SUB(&ic->shm->maps[m->id], 1);
	if (tell && !ic->gone && HF_LOAD(&ic->tab->s[m->id].gen) != m->gen)
		post(im, m->conn, HF_NOTIFY, m->id, m->gen);
}

static long map_find(struct colocate_handoff_importer *im, long c, uint64_t id, uint64_t gen)
{
	long i;

	for (i = 0; i < HF_MAP_CACHE; i++)
		if (im->maps[i].used && im->maps[i].conn == c && im->maps[i].id == id &&
		    im->maps[i].gen == gen)
			return i;
	return -1;
}

/* Drop kept mappings nobody uses whose buffer the exporter withdrew (or
 * all of connection c's, c >= 0, its connection going; or all, all set).
 * tell: as map_evict.  How many.  mu held. */
static int map_sweep(struct colocate_handoff_importer *im, long c, int all, int tell)
{
	long i;
	int n = 0;

	for (i = 0; i < HF_MAP_CACHE; i++) {
		struct hf_map *m = &im->maps[i];
		const struct hf_iconn *ic;

		if (!m->used || m->nviews)
			continue;
		ic = &im->conns[m->conn];
		if (all || m->conn == c || ic->fd < 0 || ic->gone || !ic->tab ||
		    HF_LOAD(&ic->tab->s[m->id].gen) != m->gen) {
			map_evict(im, i, tell && m->conn != c);
			n++;
		}
	}
	return n;
}

/* ---------------------------------------------------------------- connections */

/* An idle connection is still good: the exporter never speaks unasked,
 * so anything readable (EOF included) or a hang-up means it went. */
static int conn_idle_ok(const struct hf_iconn *c)
{
	struct pollfd p = { .fd = c->fd, .events = POLLIN };

	return poll(&p, 1, 0) == 0;
}

/* Connection c ends here (idle, or its exporter gone).  mu held. */
static void conn_end(struct colocate_handoff_importer *im, long c)
{
	struct hf_iconn *ic = &im->conns[c];

	map_sweep(im, c, 0, 0);
	if (ic->tab)
		munmap((void *)ic->tab, sizeof(*ic->tab));
	if (ic->shm)
		munmap(ic->shm, sizeof(*ic->shm));
	ic->tab = NULL;
	ic->shm = NULL;
	close(ic->fd);
	ic->fd = -1;
	im->st.connections--;
}

/* HELLO on a new connection: the exporter's tables for the fast path.
 * OK (with or without them: an exporter without them answers an error),
 * or E_GONE / E_TIMEOUT / E_PROTO. */
static int conn_hello(struct hf_iconn *ic)
{
	struct hf_msg q, r;
	int fds[2], rc = COLOCATE_HANDOFF_OK;
	ssize_t n;
	void *a = MAP_FAILED, *b = MAP_FAILED;

	hf_msg_init(&q, HF_HELLO);
	if (hf_send(ic->fd, &q, -1) < 0)
		return hf_err(COLOCATE_HANDOFF_E_GONE, "exporter gone (send: %s)", strerror(errno));
	n = hf_recvv(ic->fd, &r, fds, 2);
	if (n <= 0)
		return hf_recv_failed(n);
	if (n != (ssize_t)sizeof(r) || r.magic != HF_MSG_MAGIC || r.op != HF_REPLY)
		rc = hf_err(COLOCATE_HANDOFF_E_PROTO, "exporter's reply is not a hand-off reply");
	else if (!r.status && fds[0] >= 0 && fds[1] >= 0) {
		a = mmap(NULL, sizeof(struct hf_shm_conn), PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
		b = mmap(NULL, sizeof(struct hf_shm_tab), PROT_READ, MAP_SHARED, fds[1], 0);
		if (a != MAP_FAILED && b != MAP_FAILED &&
		    ((const struct hf_shm_tab *)b)->magic == HF_SHM_MAGIC &&
		    ((const struct hf_shm_tab *)b)->nslots == HF_SHM_SLOTS) {
			ic->shm = a;
			ic->tab = b;
			a = b = MAP_FAILED;
		}
	}
	if (a != MAP_FAILED)
		munmap(a, sizeof(struct hf_shm_conn));
	if (b != MAP_FAILED)
		munmap(b, sizeof(struct hf_shm_tab));
	if (fds[0] >= 0)
		close(fds[0]);
	if (fds[1] >= 0)
		close(fds[1]);
	return rc;
}

/* The open connection to the handle's exporter, or a new one.  mu held. */
static long conn_get(struct colocate_handoff_importer *im, const struct colocate_handoff_handle *h)
{
	size_t i;
	long fr = -1;
	int fd, rc;

	for (i = 0; i < im->nconns; i++) {
		struct hf_iconn *c = &im->conns[i];

		if (c->fd >= 0 && !c->gone && c->pid == h->pid && !strcmp(c->path, h->path)) {
			if (!c->nviews && !conn_idle_ok(c))
				/* the exporter went while we kept the connection idle */
				conn_end(im, (long)i);
			else
				return (long)i;
		}
		if (c->fd < 0 && fr < 0)
			fr = (long)i;
	}
	fd = hf_connect(h->path, h->pid);
	if (fd < 0)
		return fd;
	if (fr < 0) {
		struct hf_iconn *n = realloc(im->conns, (im->nconns + 1) * sizeof(*n));

		if (!n) {
			close(fd);
			return hf_err(COLOCATE_HANDOFF_E_NOMEM, "importer: out of memory");
		}
		im->conns = n;
		fr = (long)im->nconns++;
	}
	memset(&im->conns[fr], 0, sizeof(im->conns[0]));
	im->conns[fr].fd = fd;
	im->conns[fr].pid = h->pid;
	memcpy(im->conns[fr].path, h->path, sizeof(h->path));
	im->st.connections++;
	if (!im->slow) {
		rc = conn_hello(&im->conns[fr]);
		if (rc == COLOCATE_HANDOFF_E_GONE || rc == COLOCATE_HANDOFF_E_TIMEOUT) {
			conn_end(im, fr);
			return rc;
		}
	}
	return fr;
}

/* A view of connection c went.  With its last view the connection holds
 * no reference; it is kept open (idle) for the next handle of that
 * exporter - a connect and accept cost more than the rest of an open -
 * unless the exporter has gone or HF_IDLE_CONNS others are idle already. */
#define HF_IDLE_CONNS 4

static void conn_put(struct colocate_handoff_importer *im, long c)
{
	size_t i, idle = 0;

	if (c < 0 || im->conns[c].fd < 0)
		return;
	if (im->conns[c].nviews)
		im->conns[c].nviews--;
	if (im->conns[c].nviews)
		return;
	for (i = 0; i < im->nconns; i++)
		idle += im->conns[i].fd >= 0 && !im->conns[i].nviews && (long)i != c;
	if (im->conns[c].gone || idle >= HF_IDLE_CONNS)
		conn_end(im, c);
}

/* A request on connection c: OK with the reply, or the reply's error
 * (with the exporter's message), or E_GONE/E_TIMEOUT/E_PROTO.  qflags:
 * HF_Q_*.  mu held. */
static int call(struct colocate_handoff_importer *im, long c, int op, unsigned qflags,
		const struct colocate_handoff_handle *h, uint64_t id, uint64_t gen,
		struct hf_msg *r, int *got_fd)
{
	struct hf_msg q;
	int rc;

	hf_msg_init(&q, op);
	q.kind = qflags;
	q.id = id;
	q.gen = gen;
	q.size = h ? h->size : 0;
	rc = hf_call(im->conns[c].fd, &q, r, got_fd);
	if (rc == COLOCATE_HANDOFF_E_GONE || rc == COLOCATE_HANDOFF_E_TIMEOUT)
		im->conns[c].gone = 1;
	if (rc)
		return rc;
	if (r->status) {
		if (got_fd && *got_fd >= 0) {
			close(*got_fd);
			*got_fd = -1;
		}
		if (r->status > 0 || r->status < COLOCATE_HANDOFF_E_TIMEOUT)
			return hf_err(COLOCATE_HANDOFF_E_PROTO, "exporter answered status %d",
				      r->status);
		return hf_err(r->status, "%s", r->text);
	}
	return COLOCATE_HANDOFF_OK;
}

/* A one-way message on connection c (RELEASE1, NOTIFY): OK, or E_GONE
 * (the connection is marked gone).  mu held. */
static int post(struct colocate_handoff_importer *im, long c, int op, uint64_t id, uint64_t gen)
{
	struct hf_msg q;
	int rc;

	hf_msg_init(&q, op);
	q.id = id;
	q.gen = gen;
	rc = hf_post(im->conns[c].fd, &q);
	if (rc) {
		im->conns[c].gone = 1;
		rc = COLOCATE_HANDOFF_E_GONE;
	}
	return rc;
}

/* Connection c's exporter still there (nothing readable: it never
 * speaks unasked)?  Marks it gone if not.  mu held. */
static int conn_alive(struct colocate_handoff_importer *im, long c)
{
	if (!im->conns[c].gone && !conn_idle_ok(&im->conns[c]))
		im->conns[c].gone = 1;
	return !im->conns[c].gone;
}

/* Take a reference to h's buffer in shared memory: 1 if taken (the
 * exporter holds its own reference to that very buffer, so it cannot
 * go before we give ours back), 0 if the slow path must ask.  claim: and
 * claim a pre-paid reference (counted while ours is held, so before the
 * exporter can see ours go).  mu held. */
static int fast_acquire(struct colocate_handoff_importer *im, long c,
			const struct colocate_handoff_handle *h, int claim)
{
	struct hf_iconn *ic = &im->conns[c];
	uint32_t s = (uint32_t)h->id;

	HF_ADD(&ic->shm->refs[s], 1);
	if (HF_LOAD(&ic->tab->s[s].gen) == h->gen && HF_LOAD(&ic->tab->s[s].size) == h->size &&
	    HF_LOAD(&ic->tab->s[s].gen) == h->gen) {
		if (claim)
			HF_ADD(&ic->shm->claims[s], 1);
		HF_ADD(&ic->shm->acquires, 1);
		im->cst.fast_acquires++;
		return 1;
	}
	/* not ours to take: undo, and let the exporter recheck the slot (our
	 * passing count may have kept it from freeing its buffer) */
	HF_SUB(&ic->shm->refs[s], 1);
	post(im, c, HF_NOTIFY, s, h->gen);
	return 0;
}

/* Give a fast reference back.  mu held. */
static void fast_release(struct colocate_handoff_importer *im, long c, uint64_t id, uint64_t gen,
			 int count)
{
	struct hf_iconn *ic = &im->conns[c];

	HF_SUB(&ic->shm->refs[id], 1);
	if (count) {
		HF_ADD(&ic->shm->releases, 1);
		im->cst.fast_releases++;
	}
	/* the exporter dropped its own reference: it may be waiting for ours */
	if (HF_LOAD(&ic->tab->s[id].gen) != gen)
		post(im, c, HF_NOTIFY, id, gen);
}

/* ---------------------------------------------------------------- views */

static long view_new(struct colocate_handoff_importer *im)
{
	size_t i;

	for (i = 0; i < im->nviews; i++)
		if (!im->views[i].used)
			return (long)i;
	{
		size_t nn = im->nviews ? im->nviews * 2 : 8;
		struct hf_view *n = realloc(im->views, nn * sizeof(*n));

		if (!n)
			return hf_err(COLOCATE_HANDOFF_E_NOMEM, "importer: out of memory");
		memset(n + im->nviews, 0, (nn - im->nviews) * sizeof(*n));
		im->views = n;
		i = im->nviews;
		im->nviews = nn;
	}
	return (long)i;
}

static long view_of(struct colocate_handoff_importer *im, const struct colocate_handoff_view *v)
{
	uint64_t idx = v->token >> 32;

	if (!v->token || idx == 0 || idx > im->nviews || !im->views[idx - 1].used ||
	    im->views[idx - 1].serial != (uint32_t)v->token)
		return -1;
	return (long)(idx - 1);
}

/* A view of (connection c, id, gen) open here: then this connection
 * holds the buffer already, and an open claims no pre-paid reference.
 * mu held. */
static int has_view(const struct colocate_handoff_importer *im, long c, uint64_t id, uint64_t gen)
{
	size_t i;

	for (i = 0; i < im->nviews; i++)
		if (im->views[i].used && im->views[i].conn == c && im->views[i].id == id &&
		    im->views[i].gen == gen)
			return 1;
	return 0;
}

/* Map a buffer acquired over a connection: r the ACQUIRE's reply (NULL
 * after a fast acquire: the IPC kind, another process), fd for the fd kind. */
static int map_view(const struct hf_rt *rt, const struct colocate_handoff_handle *h,
		    const struct hf_msg *r, int fd, struct hf_view *w)
{
	cudaIpcMemHandle_t ih;
	cudaError_t e;
	int rc;

	if (r && h->pid == (uint32_t)getpid()) {
		/* CUDA refuses to open a handle in its own process; the pointer
		 * is valid here as it is */
		w->how = COLOCATE_HANDOFF_SAME_PROCESS;
		w->ptr = (void *)(uintptr_t)r->ptr;
		return COLOCATE_HANDOFF_OK;
	}
	if (r && r->kind == COLOCATE_HANDOFF_KIND_FD) {
		if (fd < 0)
			return hf_err(COLOCATE_HANDOFF_E_PROTO, "exporter sent no fd for a VMM buffer");
		if (r->alloc_size < h->size)
			return hf_err(COLOCATE_HANDOFF_E_PROTO, "exporter's allocation (%llu bytes) is "
				      "smaller than the handle's size", (unsigned long long)r->alloc_size);
		rc = hf_vmm_import(fd, w->device, r->alloc_size, &w->ptr, &w->vh);
		if (rc)
			return rc;
		w->map_size = r->alloc_size;
		w->how = COLOCATE_HANDOFF_MAPPED;
		return COLOCATE_HANDOFF_OK;
	}
	memcpy(&ih, h->ipc, sizeof(ih));
	{
		cudaError_t before = hf_quiet_begin();

		e = rt->ipc_open(&w->ptr, ih, cudaIpcMemLazyEnablePeerAccess);
		if (e != cudaSuccess) {
			/* expected where the buffer is another GPU's: the caller
			 * falls back to a copy, and the app did not fail */
			hf_quiet_end(before);
			return hf_cuda_err("cudaIpcOpenMemHandle", e);
		}
	}
	w->how = COLOCATE_HANDOFF_MAPPED;
	return COLOCATE_HANDOFF_OK;
}

static void unmap_view(const struct hf_view *w)
{
	const struct hf_rt *rt;

	if (hf_rt_get(&rt))
		return;
	switch (w->how) {
	case COLOCATE_HANDOFF_MAPPED:
		unmap_raw(w->kind, w->ptr, w->map_size, w->vh);
		break;
	case COLOCATE_HANDOFF_COPY_DEVICE:
		rt->free_(w->ptr);
		break;
	case COLOCATE_HANDOFF_COPY_HOST:
		munmap(w->ptr, w->size);
		break;
	default:
		break;
	}
}

/* Keep w's new mapping in the cache (an idle entry makes room): its
 * index, or -1 when it is not kept (w unmapped at close).  mu held. */
static long map_keep(struct colocate_handoff_importer *im, struct hf_view *w)
{
	long i, fr = -1;
	const struct hf_iconn *ic = &im->conns[w->conn];

	if (im->slow || !ic->tab || w->id >= HF_SHM_SLOTS)
		return -1;         /* nothing would tell when the buffer goes */
	for (i = 0; i < HF_MAP_CACHE && fr < 0; i++)
		if (!im->maps[i].used)
			fr = i;
	for (i = 0; i < HF_MAP_CACHE && fr < 0; i++)
		if (!im->maps[i].nviews) {
			map_evict(im, i, 0);
			fr = i;
		}
	if (fr < 0)
		return -1;
	/* the hold, taken while w's reference keeps the buffer */
	HF_ADD(&ic->shm->maps[w->id], 1);
	im->maps[fr] = (struct hf_map){ .used = 1, .conn = w->conn, .id = w->id, .gen = w->gen,
					.kind = w->kind, .nviews = 1, .ptr = w->ptr,
					.map_size = w->map_size, .vh = w->vh };
	im->cst.cached++;
	return fr;
}

/* The data as a copy: the exporter's memfd, mapped; then, for a
 * device copy, into cudaMalloc memory of ours.  mu held. */
static int copy_view(struct colocate_handoff_importer *im, long c,
		     const struct colocate_handoff_handle *h, unsigned flags, int claim,
		     struct hf_view *w)
{
	const struct hf_rt *rt;
	struct hf_msg r;
	cudaError_t e;
	void *m;
	int fd = -1, rc;

	rc = call(im, c, HF_COPY, claim ? HF_Q_CLAIM : 0, h, h->id, h->gen, &r, &fd);
	if (rc)
		return rc;
	if (fd < 0)
		return hf_err(COLOCATE_HANDOFF_E_PROTO, "exporter sent no data for a copy");
	m = mmap(NULL, h->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED)
		return hf_err(COLOCATE_HANDOFF_E_SYS, "mapping the copy: %s", strerror(errno));
	w->size = h->size;
	if (flags & COLOCATE_HANDOFF_OPEN_HOST) {
		w->how = COLOCATE_HANDOFF_COPY_HOST;
		w->ptr = m;
		w->device = -1;
		return COLOCATE_HANDOFF_OK;
	}
	rc = hf_rt_get(&rt);
	if (!rc) {
		e = rt->malloc_(&w->ptr, h->size);
		if (e != cudaSuccess)
			rc = hf_cuda_err("copy: cudaMalloc", e);
		else if ((e = rt->memcpy_(w->ptr, m, h->size, cudaMemcpyHostToDevice)) != cudaSuccess) {
			rt->free_(w->ptr);
			rc = hf_cuda_err("copy: cudaMemcpy host to device", e);
		}
	}
	munmap(m, h->size);
	if (rc)
		return rc;
	w->how = COLOCATE_HANDOFF_COPY_DEVICE;
	return COLOCATE_HANDOFF_OK;
}

/* Give back the reference w holds (fast, or a one-way RELEASE).  mu held. */
static int give_back(struct colocate_handoff_importer *im, const struct hf_view *w, int count)
{
	if (w->fast) {
		fast_release(im, w->conn, w->id, w->gen, count);
		return COLOCATE_HANDOFF_OK;
	}
	return post(im, w->conn, HF_RELEASE1, w->id, w->gen);
}

HF_API int colocate_handoff_open(struct colocate_handoff_importer *im, const void *bytes,
				 size_t len, uint64_t expect_size, unsigned flags,
				 struct colocate_handoff_view *out)
{
	struct colocate_handoff_handle h;
	const struct hf_rt *rt;
	struct hf_view w;
	struct hf_msg r;
	uint8_t uuid[16];
	long c, vi;
	int rc, fd = -1, want_copy, claim;

	if (!im || !out)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "open: NULL argument");
	if (flags & ~(COLOCATE_HANDOFF_OPEN_COPY | COLOCATE_HANDOFF_OPEN_HOST))
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "open: unknown flags %#x", flags);
	memset(out, 0, sizeof(*out));
	rc = colocate_handoff_parse(bytes, len, &h);
	if (rc)
		return rc;
	if (expect_size && expect_size != h.size)
		return hf_err(COLOCATE_HANDOFF_E_SIZE, "handle is for %llu bytes, %llu expected",
			      (unsigned long long)h.size, (unsigned long long)expect_size);
	memset(&w, 0, sizeof(w));
	w.id = h.id;
	w.gen = h.gen;
	w.kind = h.kind;
	w.size = h.size;
	w.conn = -1;
	w.map = -1;
	want_copy = !!(flags & (COLOCATE_HANDOFF_OPEN_COPY | COLOCATE_HANDOFF_OPEN_HOST));
	if (!(flags & COLOCATE_HANDOFF_OPEN_HOST)) {
		rc = hf_cur_device(&w.device, uuid);
		if (rc)
			return rc;
		/* another GPU (the UUID names it whatever the ordinals) */
		if (memcmp(uuid, h.uuid, sizeof(uuid)) != 0)
			want_copy = 1;
	}
	rc = hf_rt_get(&rt);
	if (rc)
		return rc;
	pthread_mutex_lock(&im->mu);
	map_sweep(im, -1, 0, 0);
	c = conn_get(im, &h);
	if (c < 0) {
		pthread_mutex_unlock(&im->mu);
		return (int)c;
	}
	/* this open starts the connection's hold on the buffer: it takes
	 * over a pre-paid reference, if the exporter paid one */
	claim = !has_view(im, c, h.id, h.gen);
	im->conns[c].nviews++;              /* held while we work on it */
	if (!want_copy) {
		long mi = im->slow ? -1 : map_find(im, c, h.id, h.gen);

		w.conn = c;
		/* no round trip where the exporter shares its table and the
		 * mapping needs nothing from it (the IPC kind, or kept) */
		if (!im->slow && im->conns[c].shm && h.id < HF_SHM_SLOTS &&
		    h.pid != im->pid && (h.kind == COLOCATE_HANDOFF_KIND_IPC || mi >= 0)) {
			if (!conn_alive(im, c)) {
				rc = hf_err(COLOCATE_HANDOFF_E_GONE, "exporter (pid %u) gone (connection "
					    "closed)", h.pid);
				goto fail;
			}
			w.fast = fast_acquire(im, c, &h, claim);
		}
		if (!w.fast) {
			rc = call(im, c, HF_ACQUIRE, claim ? HF_Q_CLAIM : 0, &h, h.id, h.gen, &r, &fd);
			if (rc)
				goto fail;
			im->cst.slow_acquires++;
		}
		claim = 0;                  /* claimed (a copy below must not again) */
		if (mi >= 0) {
			/* a kept mapping of this very buffer (id and generation) */
			w.ptr = im->maps[mi].ptr;
			w.map_size = im->maps[mi].map_size;
			w.vh = im->maps[mi].vh;
			w.how = COLOCATE_HANDOFF_MAPPED;
			w.map = mi;
			im->maps[mi].nviews++;
			im->cst.hits++;
			rc = COLOCATE_HANDOFF_OK;
		} else {
			rc = map_view(rt, &h, w.fast ? NULL : &r, fd, &w);
			if (rc == COLOCATE_HANDOFF_OK && w.how == COLOCATE_HANDOFF_MAPPED) {
				im->cst.map_calls++;
				w.map = map_keep(im, &w);
			}
		}
		if (fd >= 0)
			close(fd);          /* the mapping (or the failure) is done with it */
		if (rc == COLOCATE_HANDOFF_OK) {
			im->st.maps++;
		} else {
			/* the exporter vouched for the buffer: it is only this
			 * process that cannot map it, so a copy will do */
			if (give_back(im, &w, 0) == COLOCATE_HANDOFF_E_GONE) {
				rc = hf_err(COLOCATE_HANDOFF_E_GONE, "exporter (pid %u) gone", h.pid);
				goto fail;
			}
			w.conn = -1;
			w.fast = 0;
			want_copy = 1;
		}
	}
	if (want_copy) {
		rc = copy_view(im, c, &h, flags, claim, &w);
		if (rc)
			goto fail;
		im->st.copies++;
		im->st.copy_bytes += h.size;
		conn_put(im, c);            /* a copy holds nothing of the exporter's */
	}
	vi = view_new(im);
	if (vi < 0) {
		rc = (int)vi;
		if (w.map >= 0)
			im->maps[w.map].nviews--;
		else
			unmap_view(&w);
		if (w.conn >= 0) {
			give_back(im, &w, 0);
			goto fail;
		}
		pthread_mutex_unlock(&im->mu);
		return rc;
	}
	w.used = 1;
	w.serial = ++im->serial ? im->serial : ++im->serial;
	im->views[vi] = w;
	im->st.open_views++;
	out->ptr = w.ptr;
	out->size = w.size;
	out->device = w.device;
	out->how = w.how;
	out->token = ((uint64_t)(vi + 1) << 32) | w.serial;
	pthread_mutex_unlock(&im->mu);
	return COLOCATE_HANDOFF_OK;
fail:
	{
		char msg[256];

		/* conn_put must not overwrite the message */
		snprintf(msg, sizeof(msg), "%s", colocate_handoff_last_error());
		conn_put(im, c);
		pthread_mutex_unlock(&im->mu);
		return hf_err(rc, "%s", msg);
	}
}

HF_API int colocate_handoff_close(struct colocate_handoff_importer *im,
				  struct colocate_handoff_view *v)
{
	struct hf_view w;
	long vi;
	int rc = COLOCATE_HANDOFF_OK;

	if (!im || !v)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "close: NULL argument");
	pthread_mutex_lock(&im->mu);
	vi = view_of(im, v);
	if (vi < 0) {
		pthread_mutex_unlock(&im->mu);
		return hf_err(COLOCATE_HANDOFF_E_STALE, "close: not an open view (closed twice?)");
	}
	w = im->views[vi];
	im->views[vi].used = 0;
	im->st.open_views--;
	/* unmap before telling the exporter: once it hears, it may free (a
	 * kept mapping stays until the exporter withdraws the buffer; if it
	 * has, it goes now, so that the release below lets it free) */
	if (w.map >= 0) {
		struct hf_map *m = &im->maps[w.map];
		const struct hf_iconn *ic = &im->conns[m->conn];

		if (!--m->nviews && ic->tab && HF_LOAD(&ic->tab->s[m->id].gen) != m->gen)
			map_evict(im, w.map, 0);
	} else
		unmap_view(&w);
	if (w.conn >= 0) {
		if (!conn_alive(im, w.conn) ||
		    give_back(im, &w, 1) == COLOCATE_HANDOFF_E_GONE) {
			rc = hf_err(COLOCATE_HANDOFF_E_GONE, "close: the exporter (pid %u) had gone; "
				    "the view is closed", im->conns[w.conn].pid);
			im->st.gone++;
		}
		conn_put(im, w.conn);
	}
	map_sweep(im, -1, 0, 0);
	pthread_mutex_unlock(&im->mu);
	memset(v, 0, sizeof(*v));
	return rc;
}

HF_API int colocate_handoff_importer_cache_stats(struct colocate_handoff_importer *im,
						 struct colocate_handoff_importer_cache_stats *st)
{
	if (!im || !st)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "importer_cache_stats: NULL argument");
	pthread_mutex_lock(&im->mu);
	*st = im->cst;
	pthread_mutex_unlock(&im->mu);
	return COLOCATE_HANDOFF_OK;
}

HF_API int colocate_handoff_importer_trim(struct colocate_handoff_importer *im, int all)
{
	int n;

	if (!im)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "importer_trim: NULL argument");
	pthread_mutex_lock(&im->mu);
	n = map_sweep(im, -1, all, 1);
	pthread_mutex_unlock(&im->mu);
	return n;
}

HF_API int colocate_handoff_view_alive(struct colocate_handoff_importer *im,
				       const struct colocate_handoff_view *v)
{
	struct pollfd p;
	char b;
	long vi;
	int alive = 1;

	if (!im || !v)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "view_alive: NULL argument");
	pthread_mutex_lock(&im->mu);
	vi = view_of(im, v);
	if (vi < 0) {
		pthread_mutex_unlock(&im->mu);
		return hf_err(COLOCATE_HANDOFF_E_STALE, "view_alive: not an open view");
	}
	if (im->views[vi].conn >= 0) {
		struct hf_iconn *c = &im->conns[im->views[vi].conn];

		/* the exporter never speaks unasked: anything readable on an
		 * idle connection is its EOF */
		p.fd = c->fd;
		p.events = POLLIN;
		p.revents = 0;
		if (c->gone || (poll(&p, 1, 0) > 0 &&
				((p.revents & (POLLHUP | POLLERR)) ||
				 recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) <= 0))) {
			c->gone = 1;
			alive = 0;
		}
	}
	pthread_mutex_unlock(&im->mu);
	return alive;
}

HF_API int colocate_handoff_importer_stats(struct colocate_handoff_importer *im,
					   struct colocate_handoff_importer_stats *st)
{
	if (!im || !st)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "importer_stats: NULL argument");
	pthread_mutex_lock(&im->mu);
	*st = im->st;
	pthread_mutex_unlock(&im->mu);
	return COLOCATE_HANDOFF_OK;
}

HF_API int colocate_handoff_importer_free(struct colocate_handoff_importer *im)
{
	size_t i;

	if (!im)
		return COLOCATE_HANDOFF_OK;
	for (i = 0; i < im->nviews; i++) {
		struct colocate_handoff_view v;

		if (!im->views[i].used)
			continue;
		v.token = ((uint64_t)(i + 1) << 32) | im->views[i].serial;
		colocate_handoff_close(im, &v);
	}
	pthread_mutex_lock(&im->mu);
	for (i = 0; i < im->nconns; i++)
		if (im->conns[i].fd >= 0)
			conn_end(im, (long)i);      /* its kept mappings go with it */
	pthread_mutex_unlock(&im->mu);
	free(im->views);
	free(im->conns);
	pthread_mutex_destroy(&im->mu);
	free(im);
	return COLOCATE_HANDOFF_OK;
}

HF_API int colocate_handoff_remote_refs(const void *bytes, size_t len, uint64_t *refs)
{
	struct colocate_handoff_handle h;
	struct hf_msg q, r;
	int fd, rc;

	if (!refs)
		return hf_err(COLOCATE_HANDOFF_E_INVAL, "remote_refs: NULL argument");
	rc = colocate_handoff_parse(bytes, len, &h);
	if (rc)
		return rc;
	fd = hf_connect(h.path, h.pid);
	if (fd < 0)
		return fd;
	hf_msg_init(&q, HF_STAT);
	q.id = h.id;
	q.gen = h.gen;
	q.size = h.size;
	rc = hf_call(fd, &q, &r, NULL);
	close(fd);
	if (rc)
		return rc;
	if (r.status)
		return hf_err(r.status < 0 && r.status >= COLOCATE_HANDOFF_E_TIMEOUT ? r.status :
			      COLOCATE_HANDOFF_E_PROTO, "%s", r.text);
	*refs = r.refs;
	return COLOCATE_HANDOFF_OK;
}
