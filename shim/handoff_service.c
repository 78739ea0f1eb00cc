/*
 * handoff_service.c - the exporter's service thread: accepts importers on
 * its Unix socket and answers their requests (ACQUIRE, RELEASE, STAT,
 * COPY), one message each way.
 *
 * Each connection keeps the list of references it took (one entry per
 * reference).  When a connection ends - RELEASE never came because the
 * importer died, SIGKILL included - the kernel closes its socket, poll
 * reports it, and every reference in its list is dropped here: that is
 * what frees a buffer whose importer died (its kept mappings and fast
 * claims go with its table).  Only processes of our own uid
 * are served (SO_PEERCRED), on top of the 0700 directory.
 *
 * The thread blocks every signal (they are the application's), and a
 * reply that cannot be sent within 1 s ends that connection rather than
 * stalling the others.
 */
#define _GNU_SOURCE
#include "handoff_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

static void *loop(void *arg);

int hf_service_start(struct colocate_handoff_exporter *ex)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	sigset_t all, old;
	int e;

	memcpy(sa.sun_path, ex->path, strlen(ex->path) + 1);
	ex->lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (ex->lfd < 0)
		return hf_err(COLOCATE_HANDOFF_E_SYS, "exporter socket: %s", strerror(errno));
	/* the name has our pid: a file there is a dead namesake's */
	unlink(ex->path);
	if (bind(ex->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || chmod(ex->path, 0600) < 0 ||
	    listen(ex->lfd, 64) < 0) {
		e = errno;
		goto fail;
	}
	if (pipe2(ex->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
		e = errno;
		goto fail;
	}
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	e = pthread_create(&ex->thr, NULL, loop, ex);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (e)
		goto fail;
	ex->thread_on = 1;
	return COLOCATE_HANDOFF_OK;
fail:
	close(ex->lfd);
	unlink(ex->path);
	if (ex->wake[0] >= 0) {
		close(ex->wake[0]);
		close(ex->wake[1]);
	}
	ex->lfd = ex->wake[0] = ex->wake[1] = -1;
	return hf_err(COLOCATE_HANDOFF_E_SYS, "exporter socket %s: %s", ex->path, strerror(e));
}

void hf_service_stop(struct colocate_handoff_exporter *ex)
{
	if (!ex->thread_on)
		return;
	pthread_mutex_lock(&ex->mu);
	ex->stopping = 1;
	pthread_mutex_unlock(&ex->mu);
	if (write(ex->wake[1], "x", 1) < 0) {
		/* the pipe is non-blocking and empty: cannot fail; the thread
		 * checks `stopping` at its next wake-up anyway */
	}
	pthread_join(ex->thr, NULL);
	ex->thread_on = 0;
	close(ex->wake[0]);
	close(ex->wake[1]);
}

/* ---------------------------------------------------------------- connections */

static long conn_of(struct colocate_handoff_exporter *ex, int fd)
{
	size_t i;

	for (i = 0; i < ex->nconns; i++)
		if (ex->conns[i].fd == fd)
			return (long)i;
	return -1;
}

static void reply_err(int fd, int status, const char *text)
{
	struct hf_msg r;

	hf_msg_init(&r, HF_REPLY);
	r.status = status;
	snprintf(r.text, sizeof(r.text), "%s", text);
	hf_send(fd, &r, -1);
}

static void accept_one(struct colocate_handoff_exporter *ex, int *paused)
{
	struct timeval tv = { 1, 0 };
	struct ucred cr;
	socklen_t cl = sizeof(cr);
	int fd = accept4(ex->lfd, NULL, NULL, SOCK_CLOEXEC);

	if (fd < 0) {
		/* out of fds: stop accepting until a connection goes, rather
		 * than spin on a listening socket that stays readable */
		if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
			*paused = 1;
		return;
	}
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0 || cr.uid != ex->uid) {
		char t[96];

		snprintf(t, sizeof(t), "exporter serves uid %u only, not uid %d", ex->uid,
			 cl == sizeof(cr) ? (int)cr.uid : -1);
		reply_err(fd, COLOCATE_HANDOFF_E_PERM, t);
		close(fd);
		return;
	}
	pthread_mutex_lock(&ex->mu);
	if (ex->nconns == ex->capconns) {
		size_t nc = ex->capconns ? ex->capconns * 2 : 8;
		struct hf_conn *n = realloc(ex->conns, nc * sizeof(*n));

		if (!n) {
			pthread_mutex_unlock(&ex->mu);
			reply_err(fd, COLOCATE_HANDOFF_E_NOMEM, "exporter out of memory");
			close(fd);
			return;
		}
		ex->conns = n;
		ex->capconns = nc;
	}
	memset(&ex->conns[ex->nconns], 0, sizeof(ex->conns[0]));
	ex->conns[ex->nconns++].fd = fd;
	pthread_mutex_unlock(&ex->mu);
}

/* The peer of an idle connection has gone (EOF or hang-up pending)? */
static int peer_gone(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char b;

	if (poll(&p, 1, 0) <= 0)
		return 0;
	if (p.revents & (POLLHUP | POLLERR))
		return 1;
	return recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* The connection at ci ends: drop every reference it held, its kept
 * mappings and its claims, freeing buffers nobody holds any more (outside
 * the lock), then forget it.  Its fast counts go with its table, which
 * leaves the sums first.  stop: the exporter is being freed and cuts it
 * off; a buffer a live importer still maps is pinned then, not freed
 * (colocate_handoff_exporter_free frees the rest). */
static void conn_close(struct colocate_handoff_exporter *ex, size_t ci, int dead)
{
	int stop = !dead, alive = stop && !peer_gone(ex->conns[ci].fd);
	struct hf_conn c;
	size_t s, i;

	pthread_mutex_lock(&ex->mu);
	c = ex->conns[ci];
	/* its fast claims count against the pre-paid references first */
	for (s = 0; c.shm && s < ex->nbufs && s < HF_SHM_SLOTS; s++)
		if (ex->bufs[s].used)
			hf_settle(ex, (uint32_t)s);
	if (alive) {
		for (s = 0; c.shm && s < ex->nbufs && s < HF_SHM_SLOTS; s++)
			if (HF_LOAD(&c.shm->refs[s]) || HF_LOAD(&c.shm->maps[s]))
				ex->bufs[s].pinned = 1;
		for (i = 0; i < c.nheld; i++)
			ex->bufs[c.held[i]].pinned = 1;
	}
	ex->conns[ci] = ex->conns[--ex->nconns];
	if (c.shm) {
		ex->st.acquires += HF_LOAD(&c.shm->acquires);
		ex->st.releases += HF_LOAD(&c.shm->releases);
		for (s = 0; dead && s < ex->nbufs && s < HF_SHM_SLOTS; s++)
			if (ex->bufs[s].used)
				ex->st.refs_dropped_dead += HF_LOAD(&c.shm->refs[s]);
	}
	while (c.nheld) {
		uint32_t hs = c.held[--c.nheld];

		ex->bufs[hs].refs--;
		ex->st.held_refs--;
		if (dead)
			ex->st.refs_dropped_dead++;
	}
	pthread_cond_broadcast(&ex->cv);
	pthread_mutex_unlock(&ex->mu);
	close(c.fd);
	/* what it held may be free now (stop: exporter_free does it) */
	for (s = 0; !stop; s++) {
		struct hf_buf d;
		int freeit, more;

		pthread_mutex_lock(&ex->mu);
		more = s < ex->nbufs;
		freeit = more && hf_take_dead(ex, (uint32_t)s, &d);
		pthread_mutex_unlock(&ex->mu);
		if (!more)
			break;
		if (freeit)
			hf_buf_free(&d);
	}
	if (c.shm)
		munmap(c.shm, sizeof(*c.shm));
	free(c.held);
	free(c.claims_seen);
}

/* ---------------------------------------------------------------- requests */

static int acquire(struct colocate_handoff_exporter *ex, struct hf_conn *c,
		   const struct hf_msg *q, struct hf_msg *r, int *pass_fd)
{
	const struct hf_rt *rt;
	struct hf_buf *b;
	int s = hf_lookup(ex, q->id, q->gen, q->size);

	if (s < 0)
		return s;
	b = &ex->bufs[s];
	if (c->nheld == c->cap) {
		size_t nc = c->cap ? c->cap * 2 : 8;
		uint32_t *n = realloc(c->held, nc * sizeof(*n));

		if (!n)
			return hf_err(COLOCATE_HANDOFF_E_NOMEM, "exporter out of memory");
		c->held = n;
		c->cap = nc;
	}
	if (b->kind == COLOCATE_HANDOFF_KIND_FD) {
		CUresult cr;

		if (hf_rt_get(&rt))
			return COLOCATE_HANDOFF_E_CUDA;
		/* a fresh fd per importer: it is closed once sent */
		cr = rt->export_(pass_fd, b->vh, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
		if (cr != CUDA_SUCCESS) {
			*pass_fd = -1;
			return hf_err(COLOCATE_HANDOFF_E_CUDA, "cuMemExportToShareableHandle: CUresult %d",
				      (int)cr);
		}
	}
	c->held[c->nheld++] = (uint32_t)s;
	b->refs++;
	ex->st.held_refs++;
	ex->st.acquires++;
	if (q->kind & HF_Q_CLAIM)
		hf_claim(ex, (uint32_t)s);      /* a pre-paid reference becomes this one */
	r->refs = hf_total_refs(ex, (uint32_t)s);
	r->kind = (uint32_t)b->kind;
	r->size = b->size;
	r->ptr = (uint64_t)(uintptr_t)b->ptr;
	r->alloc_size = b->alloc_size;
	return COLOCATE_HANDOFF_OK;
}

/* RELEASE: one reference of this connection.  *dead set when it was the
 * last one of the buffer (to free outside the lock). */
static int release(struct colocate_handoff_exporter *ex, struct hf_conn *c,
		   const struct hf_msg *q, struct hf_msg *r, struct hf_buf *dead, int *freeit)
{
	size_t i;

	for (i = 0; i < c->nheld; i++) {
		uint32_t s = c->held[i];

		if (s != q->id || ex->bufs[s].gen != q->gen)
			continue;
		c->held[i] = c->held[--c->nheld];
		ex->bufs[s].refs--;
		ex->st.held_refs--;
		ex->st.releases++;
		r->refs = hf_total_refs(ex, s);
		*freeit = hf_take_dead(ex, s, dead);
		pthread_cond_broadcast(&ex->cv);
		return COLOCATE_HANDOFF_OK;
	}
	return hf_err(COLOCATE_HANDOFF_E_STALE, "release: this importer holds no reference to "
		      "buffer %llu (released twice, or stale)", (unsigned long long)q->id);
}

/* COPY: the data in a fresh memfd.  The buffer is held (refs) during the
 * copy, which runs without the lock.  OK with *pass_fd, or an error. */
static int copy_out(struct colocate_handoff_exporter *ex, const struct hf_msg *q,
		    struct hf_msg *r, int *pass_fd)
{
	const struct hf_rt *rt;
	struct hf_buf b, dead;
	cudaError_t e = cudaSuccess;
	int s, fd, rc = COLOCATE_HANDOFF_OK, freeit, cur = -1;
	void *m = MAP_FAILED;

	pthread_mutex_lock(&ex->mu);
	s = hf_lookup(ex, q->id, q->gen, q->size);
	if (s >= 0) {
		ex->bufs[s].refs++;
		if (q->kind & HF_Q_CLAIM)
			hf_claim(ex, (uint32_t)s);  /* the copy is this consumer's open */
		b = ex->bufs[s];
	}
	pthread_mutex_unlock(&ex->mu);
	if (s < 0)
		return s;
	if (hf_rt_get(&rt)) {
		rc = COLOCATE_HANDOFF_E_CUDA;
		goto out;
	}
	fd = memfd_create("colocate-handoff-copy", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, (off_t)b.size) < 0 ||
	    (m = mmap(NULL, b.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		rc = hf_err(COLOCATE_HANDOFF_E_SYS, "copy of %llu bytes: %s",
			    (unsigned long long)b.size, strerror(errno));
		if (fd >= 0)
			close(fd);
		goto out;
	}
	if (rt->get_device(&cur) == cudaSuccess && cur != b.device)
		rt->set_device(b.device);
	e = rt->memcpy_(m, b.ptr, b.size, cudaMemcpyDeviceToHost);
	munmap(m, b.size);
	if (e != cudaSuccess) {
		close(fd);
		rc = hf_cuda_err("copy (cudaMemcpy device to host)", e);
		goto out;
	}
	*pass_fd = fd;
	r->size = b.size;
	r->kind = (uint32_t)b.kind;
out:
	pthread_mutex_lock(&ex->mu);
	ex->bufs[s].refs--;
	if (rc == COLOCATE_HANDOFF_OK) {
		ex->st.copies_served++;
		ex->st.copy_bytes += b.size;
	}
	r->refs = hf_total_refs(ex, (uint32_t)s);
	freeit = hf_take_dead(ex, (uint32_t)s, &dead);
	pthread_cond_broadcast(&ex->cv);
	pthread_mutex_unlock(&ex->mu);
	if (freeit)
		hf_buf_free(&dead);
	return rc;
}

/* HELLO: the connection's own table of fast references (a fresh memfd,
 * mapped here) and the exporter's table, as two fds.  OK, or an error
 * (the importer then keeps to the slow path). */
static int hello(struct colocate_handoff_exporter *ex, struct hf_conn *c, int fds[2])
{
	uint32_t *seen;
	void *m;
	int fd;

	if (!ex->tab)
		return hf_err(COLOCATE_HANDOFF_E_UNSUPPORTED, "exporter has no shared table");
	if (c->shm)
		return hf_err(COLOCATE_HANDOFF_E_PROTO, "HELLO twice on one connection");
	seen = calloc(HF_SHM_SLOTS, sizeof(*seen));     /* the table starts at 0 */
	if (!seen)
		return hf_err(COLOCATE_HANDOFF_E_NOMEM, "exporter out of memory");
	fd = memfd_create("colocate-handoff-conn", MFD_CLOEXEC);
	if (fd < 0 || ftruncate(fd, sizeof(struct hf_shm_conn)) < 0 ||
	    (m = mmap(NULL, sizeof(struct hf_shm_conn), PROT_READ | PROT_WRITE, MAP_SHARED, fd,
		      0)) == MAP_FAILED) {
		int e = errno;

		if (fd >= 0)
			close(fd);
		free(seen);
		return hf_err(COLOCATE_HANDOFF_E_SYS, "connection table: %s", strerror(e));
	}
	pthread_mutex_lock(&ex->mu);
	c->claims_seen = seen;
	c->shm = m;
	pthread_mutex_unlock(&ex->mu);
	fds[0] = fd;
	fds[1] = ex->tab_fd;
	return COLOCATE_HANDOFF_OK;
}

/* A NOTIFY: an importer dropped a fast reference or a kept mapping of
 * slot id while the exporter's own reference was gone; free it if nobody
 * holds it now. */
static void notify(struct colocate_handoff_exporter *ex, const struct hf_msg *q)
{
	struct hf_buf dead;
	int freeit = 0;

	pthread_mutex_lock(&ex->mu);
	if (q->id < ex->nbufs) {
		freeit = hf_take_dead(ex, (uint32_t)q->id, &dead);
		pthread_cond_broadcast(&ex->cv);
	}
	pthread_mutex_unlock(&ex->mu);
	if (freeit)
		hf_buf_free(&dead);
}

/* One request of connection ci: 0, or -1 when the connection is to go. */
static int serve(struct colocate_handoff_exporter *ex, size_t ci)
{
	struct hf_msg q, r;
	struct hf_buf dead;
	int fd = ex->conns[ci].fd, pass = -1, rc, freeit = 0, ret = 0;
	ssize_t n = hf_recv(fd, &q, NULL);   /* fds from importers: closed */

	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return 0;
	if (n <= 0)
		return -1;
	hf_msg_init(&r, HF_REPLY);
	if (n != (ssize_t)sizeof(q) || q.magic != HF_MSG_MAGIC || q.version != HF_MSG_VERSION) {
		snprintf(r.text, sizeof(r.text), "exporter: a request of %zd bytes that is not a "
			 "hand-off request (truncated, or another protocol version)", n);
		r.status = COLOCATE_HANDOFF_E_PROTO;
		return hf_send(fd, &r, -1) < 0 ? -1 : 0;
	}
	switch (q.op) {
	case HF_NOTIFY:
		notify(ex, &q);
		return 0;                     /* one-way */
	case HF_RELEASE1:
		pthread_mutex_lock(&ex->mu);
		rc = release(ex, &ex->conns[ci], &q, &r, &dead, &freeit);
		pthread_mutex_unlock(&ex->mu);
		if (freeit)
			hf_buf_free(&dead);
		return 0;                     /* one-way: an error has nobody to go to */
	case HF_HELLO: {
		int fds[2] = { -1, -1 };

		rc = hello(ex, &ex->conns[ci], fds);
		r.status = rc;
		if (rc) {
			snprintf(r.text, sizeof(r.text), "%s", colocate_handoff_last_error());
			return hf_send(fd, &r, -1) < 0 ? -1 : 0;
		}
		ret = hf_sendv(fd, &r, fds, 2) < 0 ? -1 : 0;
		close(fds[0]);                /* the table stays mapped here */
		return ret;
	}
	case HF_ACQUIRE:
		pthread_mutex_lock(&ex->mu);
		rc = acquire(ex, &ex->conns[ci], &q, &r, &pass);
		pthread_mutex_unlock(&ex->mu);
		break;
	case HF_RELEASE:
		pthread_mutex_lock(&ex->mu);
		rc = release(ex, &ex->conns[ci], &q, &r, &dead, &freeit);
		pthread_mutex_unlock(&ex->mu);
		break;
	case HF_STAT:
		pthread_mutex_lock(&ex->mu);
		rc = hf_lookup(ex, q.id, q.gen, q.size);
		if (rc >= 0) {
			r.refs = hf_total_refs(ex, (uint32_t)rc);
			rc = COLOCATE_HANDOFF_OK;
		}
		pthread_mutex_unlock(&ex->mu);
		break;
	case HF_COPY:
		rc = copy_out(ex, &q, &r, &pass);
		break;
	default:
		rc = hf_err(COLOCATE_HANDOFF_E_PROTO, "exporter: unknown request %u", q.op);
	}
	if (freeit)
		hf_buf_free(&dead);
	r.status = rc;
	if (rc)
		snprintf(r.text, sizeof(r.text), "%s", colocate_handoff_last_error());
	if (hf_send(fd, &r, pass) < 0)
		ret = -1;             /* the importer went: its references go */
	if (pass >= 0)
		close(pass);          /* the importer has its own copy now */
	return ret;
}

/* ---------------------------------------------------------------- the loop */

static void *loop(void *arg)
{
	struct colocate_handoff_exporter *ex = arg;
	struct pollfd *pf = NULL;
	size_t cap = 0, n, i;
	int paused = 0;
	int64_t reap_at = HF_NEVER;

	for (;;) {
		int64_t dl, now, wake;
		int tmo = -1;

		pthread_mutex_lock(&ex->mu);
		if (ex->stopping) {
			pthread_mutex_unlock(&ex->mu);
			break;
		}
		n = ex->nconns + 2;
		if (n > cap) {
			struct pollfd *np = realloc(pf, n * 2 * sizeof(*np));

			if (!np) {
				pthread_mutex_unlock(&ex->mu);
				usleep(10000);        /* try again: no memory now */
				continue;
			}
			pf = np;
			cap = n * 2;
		}
		pf[0] = (struct pollfd){ .fd = ex->wake[0], .events = POLLIN };
		pf[1] = (struct pollfd){ .fd = paused ? -1 : ex->lfd, .events = POLLIN };
		for (i = 0; i < ex->nconns; i++)
			pf[i + 2] = (struct pollfd){ .fd = ex->conns[i].fd, .events = POLLIN };
		dl = ex->svc_deadline;                /* pre-paid references expire then */
		now = hf_now_ns();
		if (!ex->map_pending)
			reap_at = HF_NEVER;
		else if (reap_at == HF_NEVER)
			reap_at = now + (int64_t)HF_REAP_MS * 1000000;
		wake = dl < reap_at ? dl : reap_at;
		ex->svc_sleep_until = wake;
		pthread_mutex_unlock(&ex->mu);
		if (wake != HF_NEVER)
			tmo = wake <= now ? 0 : (int)((wake - now + 999999) / 1000000);
		if (poll(pf, n, tmo) < 0)
			continue;                     /* EINTR; nothing else is expected */
		now = hf_now_ns();
		if (dl != HF_NEVER && now >= dl)
			hf_expire(ex);                /* sets the next deadline */
		if (reap_at != HF_NEVER && now >= reap_at) {
			hf_reap(ex);                  /* kept mappings given back unannounced */
			reap_at = HF_NEVER;
		}
		if (pf[0].revents) {
			char b[64];

			/* stopping (checked at the top), or an earlier deadline */
			while (read(ex->wake[0], b, sizeof(b)) > 0)
				;
			continue;
		}
		for (i = 2; i < n; i++) {
			long ci;

			if (!pf[i].revents)
				continue;
			ci = conn_of(ex, pf[i].fd);   /* only this thread changes conns */
			if (ci < 0)
				continue;
			if (serve(ex, (size_t)ci) < 0) {
				conn_close(ex, (size_t)ci, 1);
				paused = 0;
			}
		}
		if (pf[1].revents)
			accept_one(ex, &paused);
	}
	/* stopping: cut every importer off (their views stay mapped) */
	while (ex->nconns)
		conn_close(ex, ex->nconns - 1, 0);
	free(ex->conns);
	ex->conns = NULL;
	ex->capconns = 0;
	free(pf);
	close(ex->lfd);
	unlink(ex->path);
	return NULL;
}
