/*
 * vmm.c - apps' device memory, mapped into this worker at the apps'
 * addresses (COLOCATE_MEM=vmm in the apps; protocol: fwd_proto.h, "mem
 * socket").
 *
 * At start the worker reserves the whole colocate region at its address
 * (cuMemAddressReserve takes the address as a hint: ptr == hint is
 * checked) and listens on <runtime dir>/worker-<N>.mem.sock (0600).  Each
 * app connection sends MAP (with the allocation's fd) and UNMAP, one at a
 * time, each ACKed.  A MAP is imported and mapped at the app's address
 * inside the reservation; when that cannot be had (the region was not
 * granted at its address, or another app holds the range), anywhere in a
 * reservation of its own, and the app's launches then have their pointer
 * arguments translated (w_vmm_translate; counted, logged once per app).
 *
 * The main thread does all of this (the driver calls are short); launcher
 * threads only read the mapping table, under a read lock, and only when
 * some mapping is not at its app's address.
 *
 * A mem connection belongs to one app entry: the newest one of its pid
 * that said FWD_HF_VMM and has none yet (the shim connects right after its
 * HELLO was answered).  Mappings are the connection's and are translated
 * for that app entry only.  When the connection closes (the shim left that
 * entry, or died) the entry leaves after its queued launches and the
 * mappings are orphaned: unmapped once its launcher has finished (it
 * synchronises its streams first), not when the pid goes - the same app
 * may come back at once on a new connection and map the same addresses.
 * A MAP over an orphan waits briefly for the orphan's launches, then takes
 * its place.
 *
 * Peers must be of our uid; a MAP must lie in the colocate region and not
 * overlap a live mapping of any connection.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "worker.h"
#include "vmm_drv.h"
#include "zmqdl.h"

#define MAX_MCONN   W_VMM_MAX_CONNS
#define MAX_FDS     4                /* fds taken per recvmsg; more are closed */
#define BAD_LOG_CAP 200

struct mconn {
	int fd;                          /* -1: free                         */
	uint32_t peer;                   /* SO_PEERCRED pid                  */
	uint64_t aserial;                /* its app entry (app.c), 0: none   */
	unsigned char buf[sizeof(struct fwd_mem_msg)];
	size_t got;
	int fds[MAX_FDS];
	int nfds;
	int trunc;                       /* some fds did not fit (MSG_CTRUNC)  */
	int said_moved;
};

struct wmap {
	uint32_t pid;
	int conn;                        /* index in conns, -1: orphaned     */
	uint64_t aserial;                /* the app entry that may use it    */
	uint64_t addr, size, waddr;
	uint64_t own_resv;               /* a reservation of its own, or 0   */
	CUmemGenericAllocationHandle h;
};

static struct {
	__typeof__(&cuMemImportFromShareableHandle) import_;
	__typeof__(&cuMemRelease) release;
	__typeof__(&cuMemAddressReserve) reserve;
	__typeof__(&cuMemAddressFree) addr_free;
	__typeof__(&cuMemMap) map;
	__typeof__(&cuMemUnmap) unmap;
	__typeof__(&cuMemSetAccess) access;
} D;

static int lfd = -1;
static char sock_path[256];
static struct mconn conns[MAX_MCONN];
static pthread_rwlock_t maps_mu = PTHREAD_RWLOCK_INITIALIZER;
static struct wmap *maps;
static size_t nmaps, capmaps;
static int device;
static _Atomic uint64_t nbad;
static uint64_t nmapped, nunmapped;  /* MAP / UNMAP requests done (main thread) */

static int load_driver(char *why, size_t whylen)
{
	static const struct vmm_sym syms[] = {
#define S(n, f) { #n, offsetof(__typeof__(D), f) }
		S(cuMemImportFromShareableHandle, import_), S(cuMemRelease, release),
		S(cuMemAddressReserve, reserve), S(cuMemAddressFree, addr_free),
		S(cuMemMap, map), S(cuMemUnmap, unmap), S(cuMemSetAccess, access),
#undef S
	};
	vmm_entry_fn get = (vmm_entry_fn)dlsym(RTLD_DEFAULT, "cudaGetDriverEntryPointByVersion");

	if (!get) {
		snprintf(why, whylen, "the runtime has no cudaGetDriverEntryPointByVersion");
		return -1;
	}
	if (vmm_entry_points(get, syms, sizeof(syms) / sizeof(syms[0]), &D, why, whylen) < 0) {
		cudaGetLastError();      /* the worker's own context: clear it */
		return -1;
	}
	return 0;
}

int w_vmm_init(void)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	CUdeviceptr got = 0;
	char why[200];
	CUresult r;
	int i;

	for (i = 0; i < MAX_MCONN; i++)
		conns[i].fd = -1;
	if (load_driver(why, sizeof(why)) < 0) {
		snprintf(wstate.vmm_why, sizeof(wstate.vmm_why), "%s", why);
		w_log("VMM-shared app memory cannot be mapped here: %s", why);
		return -1;
	}
	if (cudaGetDevice(&device) != cudaSuccess)
		device = 0;
	r = D.reserve(&got, FWD_MEM_SIZE, FWD_MEM_ALIGN, FWD_MEM_BASE, 0);
	if (r != CUDA_SUCCESS) {
		got = 0;
		w_log("cannot reserve the colocate region (CUresult %d): every app allocation gets "
		      "an address of its own here, and pointer arguments are translated", (int)r);
	} else if (got != FWD_MEM_BASE) {
		w_log("the colocate region was reserved at 0x%llx, not at its address 0x%llx (the "
		      "address is only a hint to the driver): apps' memory cannot have the same "
		      "address here; pointer arguments of their launches will be translated",
		      (unsigned long long)got, (unsigned long long)FWD_MEM_BASE);
	}
	wstate.vmm_base = got;
	if ((size_t)snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/worker-%u.mem.sock", wstate.rundir,
			     wstate.id) >= sizeof(sa.sun_path)) {
		snprintf(wstate.vmm_why, sizeof(wstate.vmm_why), "mem socket path too long");
		w_log("%s", wstate.vmm_why);
		return -1;
	}
	snprintf(sock_path, sizeof(sock_path), "%s", sa.sun_path);
	unlink(sock_path);
	lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    chmod(sock_path, 0600) < 0 || listen(lfd, 64) < 0) {
		snprintf(wstate.vmm_why, sizeof(wstate.vmm_why), "mem socket %.150s: %s", sock_path,
			 strerror(errno));
		w_log("%s", wstate.vmm_why);
		if (lfd >= 0)
			close(lfd);
		lfd = -1;
		unlink(sock_path);
		return -1;
	}
	wstate.vmm_ok = 1;
	return 0;
}

/* ---------------------------------------------------------------- mappings */

/* Index of app entry aserial's mapping holding app address v, or -1;
 * maps_mu held. */
static long map_find(uint64_t aserial, uint64_t v)
{
	size_t i;

	for (i = 0; aserial && i < nmaps; i++)
		if (maps[i].aserial == aserial && v >= maps[i].addr &&
		    v - maps[i].addr < maps[i].size)
			return (long)i;
	return -1;
}

static int overlaps(const struct wmap *w, uint64_t addr, uint64_t size)
{
	return addr < w->addr + w->size && w->addr < addr + size;
}

/* Unmap and forget mapping i; maps_mu held for writing. */
static void map_drop(size_t i)
{
	struct wmap *m = &maps[i];
	CUresult r = D.unmap(m->waddr, m->size);

	if (r == CUDA_SUCCESS)
		r = D.release(m->h);
	if (r != CUDA_SUCCESS)
		w_log("app pid %u: unmapping 0x%llx: CUresult %d", m->pid,
		      (unsigned long long)m->waddr, (int)r);
	if (m->own_resv)
		D.addr_free(m->own_resv, m->size);
	if (m->waddr != m->addr)
		atomic_fetch_sub(&wstate.vmm_moved, 1);
	memmove(&maps[i], &maps[i + 1], (nmaps - i - 1) * sizeof(*maps));
	nmaps--;
}

/* Map handle h (size bytes) for app address addr: 0 and where, or a
 * CUresult.  Same address when the region is ours at its address and the
 * range is free; else at the same offset of our region wherever it is;
 * else in a reservation of its own. */
static CUresult place(uint64_t addr, uint64_t size, CUmemGenericAllocationHandle h,
		      uint64_t *waddr, uint64_t *own)
{
	CUmemAccessDesc acc;
	CUdeviceptr at = 0;
	CUresult r = CUDA_ERROR_INVALID_VALUE;

	*own = 0;
	if (wstate.vmm_base && addr >= FWD_MEM_BASE && addr + size <= FWD_MEM_BASE + FWD_MEM_SIZE) {
		at = wstate.vmm_base + (addr - FWD_MEM_BASE);
		r = D.map(at, size, 0, h, 0);
	}
	if (r != CUDA_SUCCESS) {
		r = D.reserve(&at, size, FWD_MEM_ALIGN, 0, 0);
		if (r != CUDA_SUCCESS)
			return r;
		r = D.map(at, size, 0, h, 0);
		if (r != CUDA_SUCCESS) {
			D.addr_free(at, size);
			return r;
		}
		*own = at;
	}
	vmm_rw_access(&acc, device);
	r = D.access(at, size, &acc, 1);
	if (r != CUDA_SUCCESS) {
		D.unmap(at, size);
		if (*own)
			D.addr_free(*own, size);
		return r;
	}
	*waddr = at;
	return CUDA_SUCCESS;
}

#define ORPHAN_WAIT_NS 200000000L    /* a MAP waits this long for an orphan */

/* Drop the orphans whose app entry can no longer launch (all of them when
 * pid is 0, else that pid's); maps_mu not held. */
static void drop_idle_orphans(uint32_t pid)
{
	size_t i;

	pthread_rwlock_wrlock(&maps_mu);
	for (i = 0; i < nmaps;) {
		if (maps[i].conn < 0 && (!pid || maps[i].pid == pid) &&
		    !w_app_serial_busy(maps[i].aserial))
			map_drop(i);
		else
			i++;
	}
	pthread_rwlock_unlock(&maps_mu);
}

/*
 * Orphans in [addr, addr + size) (e.g. the same app back on a new
 * connection right after its old one closed, or a new app in a dead one's
 * slot): their app entries are leaving (conn_close told them), so wait a
 * little for their launchers to finish, then unmap them so that the new
 * mapping can have the address.  One still busy after the wait stays (the
 * new one is then placed elsewhere and translated).  Main thread.
 */
static void drop_orphans_over(uint64_t addr, uint64_t size)
{
	struct timespec nap = { 0, 1000000L };
	uint64_t deadline = w_now_ns() + ORPHAN_WAIT_NS;
	size_t i;
	int busy;

	for (;;) {
		busy = 0;
		pthread_rwlock_wrlock(&maps_mu);
		for (i = 0; i < nmaps;) {
			if (maps[i].conn < 0 && overlaps(&maps[i], addr, size)) {
				if (!w_app_serial_busy(maps[i].aserial)) {
					map_drop(i);
					continue;
				}
				busy = 1;
			}
			i++;
		}
		pthread_rwlock_unlock(&maps_mu);
		if (!busy || w_now_ns() >= deadline)
			return;
		nanosleep(&nap, NULL);
	}
}

static int do_map(struct mconn *c, int ci, const struct fwd_mem_msg *m, int fd, uint64_t *waddr,
		  char *why, size_t whylen)
{
	CUmemGenericAllocationHandle h;
	struct wmap *nm;
	uint64_t own;
	CUresult r;
	int dup_;

	/* the region only (no app maps elsewhere), and no live mapping of
	 * any connection in the range (whole ranges compared) */
	if (m->addr < FWD_MEM_BASE || m->size > FWD_MEM_SIZE ||
	    m->addr - FWD_MEM_BASE > FWD_MEM_SIZE - m->size) {
		snprintf(why, whylen, "0x%llx (%llu bytes) is outside the colocate region",
			 (unsigned long long)m->addr, (unsigned long long)m->size);
		return FWD_MEM_S_REFUSED;
	}
	pthread_rwlock_rdlock(&maps_mu);
	dup_ = 0;
	for (size_t i = 0; i < nmaps && !dup_; i++)
		dup_ = maps[i].conn >= 0 && overlaps(&maps[i], m->addr, m->size);
	pthread_rwlock_unlock(&maps_mu);
	if (dup_) {
		snprintf(why, whylen, "0x%llx overlaps a live mapping", (unsigned long long)m->addr);
		return FWD_MEM_S_REFUSED;
	}
	drop_orphans_over(m->addr, m->size);
	r = D.import_(&h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS) {
		snprintf(why, whylen, "cuMemImportFromShareableHandle: CUresult %d", (int)r);
		return FWD_MEM_S_FAILED;
	}
	r = place(m->addr, m->size, h, waddr, &own);
	if (r != CUDA_SUCCESS) {
		D.release(h);
		snprintf(why, whylen, "mapping %llu bytes: CUresult %d", (unsigned long long)m->size,
			 (int)r);
		return FWD_MEM_S_FAILED;
	}
	pthread_rwlock_wrlock(&maps_mu);
	if (nmaps == capmaps) {
		size_t ncap = capmaps ? capmaps * 2 : 64;

		nm = realloc(maps, ncap * sizeof(*nm));
		if (!nm) {
			pthread_rwlock_unlock(&maps_mu);
			D.unmap(*waddr, m->size);
			D.release(h);
			if (own)
				D.addr_free(own, m->size);
			snprintf(why, whylen, "out of memory");
			return FWD_MEM_S_FAILED;
		}
		maps = nm;
		capmaps = ncap;
	}
	maps[nmaps++] = (struct wmap){ m->pid, ci, c->aserial, m->addr, m->size, *waddr, own, h };
	if (*waddr != m->addr)
		atomic_fetch_add(&wstate.vmm_moved, 1);
	pthread_rwlock_unlock(&maps_mu);
	if (*waddr != m->addr && !c->said_moved) {
		c->said_moved = 1;
		w_log("app pid %u: memory at 0x%llx is mapped at 0x%llx here: the same address "
		      "could not be had (%s); its launches' pointer arguments are translated",
		      m->pid, (unsigned long long)m->addr, (unsigned long long)*waddr,
		      !wstate.vmm_base ? "no colocate region here"
		      : wstate.vmm_base != FWD_MEM_BASE ? "the region is elsewhere in this worker"
						   : "the range is taken by another app");
	}
	return FWD_MEM_S_OK;
}

static int do_unmap(int ci, const struct fwd_mem_msg *m, char *why, size_t whylen)
{
	long i;

	pthread_rwlock_wrlock(&maps_mu);
	for (i = 0; i < (long)nmaps; i++)
		if (maps[i].conn == ci && maps[i].addr == m->addr)
			break;
	if (i == (long)nmaps || maps[i].size != m->size) {
		pthread_rwlock_unlock(&maps_mu);
		snprintf(why, whylen, "no mapping 0x%llx of %llu bytes from this connection",
			 (unsigned long long)m->addr, (unsigned long long)m->size);
		return FWD_MEM_S_REFUSED;
	}
	map_drop((size_t)i);
	pthread_rwlock_unlock(&maps_mu);
	return FWD_MEM_S_OK;
}

/* ---------------------------------------------------------------- connections */

static void bad(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void bad(const char *fmt, ...)
{
	uint64_t n = atomic_fetch_add(&nbad, 1) + 1;
	char msg[300];
	va_list ap;

	if (n > BAD_LOG_CAP)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	w_log("mem socket: refused: %s%s", msg,
	      n == BAD_LOG_CAP ? " (further refusals are not logged)" : "");
}

static void drop_fds(struct mconn *c)
{
	int i;

	for (i = 0; i < c->nfds; i++)
		close(c->fds[i]);
	c->nfds = 0;
}

static void conn_close(int ci)
{
	struct mconn *c = &conns[ci];
	size_t i;

	drop_fds(c);
	close(c->fd);
	c->fd = -1;
	/* orphaned: unmapped once the app entry's launcher has finished
	 * (w_vmm_tick); that entry leaves after its queued launches */
	pthread_rwlock_wrlock(&maps_mu);
	for (i = 0; i < nmaps;) {
		if (maps[i].conn == ci) {
			maps[i].conn = -1;
			if (!w_app_serial_busy(maps[i].aserial)) {
				map_drop(i);     /* no launch can use it */
				continue;
			}
		}
		i++;
	}
	pthread_rwlock_unlock(&maps_mu);
	w_app_mem_closed(c->aserial);
}

static void ack(struct mconn *c, const struct fwd_mem_msg *m, uint32_t status, uint64_t waddr)
{
	struct fwd_mem_msg a;
	ssize_t n;

	memset(&a, 0, sizeof(a));
	a.magic = FWD_MEM_MAGIC;
	a.version = FWD_MEM_VERSION;
	a.op = FWD_MEM_ACK;
	a.len = sizeof(a);
	a.status = status;
	a.pid = m->pid;
	a.addr = m->addr;
	a.size = m->size;
	a.waddr = status == FWD_MEM_S_OK ? waddr : 0;
	/* 48 bytes into an empty stream socket buffer (one request at a
	 * time): never partial; a peer that does not read loses its acks */
	n = send(c->fd, &a, sizeof(a), MSG_NOSIGNAL | MSG_DONTWAIT);
	(void)n;
}

/* One whole message in c->buf: act on it.  Returns -1 to close. */
static int handle(int ci)
{
	struct mconn *c = &conns[ci];
	struct fwd_mem_msg m;
	const char *why;
	char sub[200];
	uint64_t waddr = 0;
	uint32_t st;

	memcpy(&m, c->buf, sizeof(m));
	c->got = 0;
	why = fwd_mem_check(&m, c->trunc ? -1 : c->nfds);
	c->trunc = 0;
	if (why) {
		bad("pid %u: %s", c->peer, why);
		ack(c, &m, FWD_MEM_S_REFUSED, 0);
		drop_fds(c);
		/* a stream cannot be resynchronised after a framing error */
		return m.magic != FWD_MEM_MAGIC || m.version != FWD_MEM_VERSION ||
		       m.len != sizeof(m) ? -1 : 0;
	}
	if (m.pid != c->peer) {
		bad("message for pid %u from pid %u", m.pid, c->peer);
		ack(c, &m, FWD_MEM_S_REFUSED, 0);
		drop_fds(c);
		return 0;
	}
	if (m.op == FWD_MEM_MAP)
		st = (uint32_t)do_map(c, ci, &m, c->fds[0], &waddr, sub, sizeof(sub));
	else
		st = (uint32_t)do_unmap(ci, &m, sub, sizeof(sub));
	drop_fds(c);
	if (st == FWD_MEM_S_OK)
		(*(m.op == FWD_MEM_MAP ? &nmapped : &nunmapped))++;
	if (st != FWD_MEM_S_OK)
		bad("pid %u: %s of 0x%llx: %s", m.pid, m.op == FWD_MEM_MAP ? "MAP" : "UNMAP",
		    (unsigned long long)m.addr, sub);
	ack(c, &m, st, waddr);
	return 0;
}

/* Read what conn ci has; -1 when it is closed (or must be). */
static int conn_read(int ci)
{
	struct mconn *c = &conns[ci];
	char cbuf[CMSG_SPACE(MAX_FDS * sizeof(int))];
	struct iovec iov;
	struct msghdr mh;
	struct cmsghdr *cm;
	ssize_t n;

	for (;;) {
		memset(&mh, 0, sizeof(mh));
		iov.iov_base = c->buf + c->got;
		iov.iov_len = sizeof(c->buf) - c->got;
		mh.msg_iov = &iov;
		mh.msg_iovlen = 1;
		mh.msg_control = cbuf;
		mh.msg_controllen = sizeof(cbuf);
		n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
		for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
			int k, cnt;

			if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
				continue;
			cnt = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
			for (k = 0; k < cnt; k++) {
				int fd;

				memcpy(&fd, CMSG_DATA(cm) + k * sizeof(int), sizeof(int));
				if (c->nfds < MAX_FDS)
					c->fds[c->nfds++] = fd;
				else
					close(fd);
			}
		}
		if (mh.msg_flags & MSG_CTRUNC)
			c->trunc = 1;        /* fds were lost: the message is refused */
		if (n == 0)
			return -1;
		c->got += (size_t)n;
		if (c->got == sizeof(c->buf) && handle(ci) < 0)
			return -1;
	}
}

static void accept_all(void)
{
	for (;;) {
		struct ucred cr;
		socklen_t len = sizeof(cr);
		int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK), i;

		if (fd < 0)
			return;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
			close(fd);
			continue;
		}
		if (cr.uid != geteuid()) {   /* the socket is 0600; be sure */
			bad("peer pid %d runs as uid %u, not ours", (int)cr.pid, (unsigned)cr.uid);
			close(fd);
			continue;
		}
		for (i = 0; i < MAX_MCONN && conns[i].fd >= 0; i++)
			;
		if (i == MAX_MCONN) {
			bad("too many mem connections (pid %d)", (int)cr.pid);
			close(fd);
			continue;
		}
		/* the pid's orphans whose launches are done go first */
		drop_idle_orphans((uint32_t)cr.pid);
		memset(&conns[i], 0, sizeof(conns[i]));
		conns[i].fd = fd;
		conns[i].peer = (uint32_t)cr.pid;
		conns[i].aserial = w_app_pair_mem((uint32_t)cr.pid);
	}
}

int w_vmm_items(struct zmqdl_pollitem *it, int max)
{
	int i, n = 0;

	if (lfd < 0 || max < 1)
		return 0;
	it[n++] = (struct zmqdl_pollitem){ NULL, lfd, ZMQ_POLLIN, 0 };
	for (i = 0; i < MAX_MCONN && n < max; i++)
		it[n++] = (struct zmqdl_pollitem){ NULL, conns[i].fd, conns[i].fd >= 0 ? ZMQ_POLLIN : 0,
						   0 };
	return n;
}

void w_vmm_serve(const struct zmqdl_pollitem *it, int n)
{
	int i;

	for (i = 1; i < n; i++) {
		int ci = i - 1;

		if (conns[ci].fd < 0 || conns[ci].fd != it[i].fd || !it[i].revents)
			continue;
		if (conn_read(ci) < 0)
			conn_close(ci);
	}
	if (n > 0 && it[0].revents)
		accept_all();
}

void w_vmm_tick(void)
{
	drop_idle_orphans(0);
}

void w_vmm_close(void)
{
	int i;

	for (i = 0; i < MAX_MCONN; i++)
		if (conns[i].fd >= 0)
			conn_close(i);
	if (lfd >= 0) {
		close(lfd);
		unlink(sock_path);
		lfd = -1;
	}
}

uint64_t w_vmm_bad(void)
{
	return atomic_load(&nbad);
}

void w_vmm_counts(uint64_t *mapped, uint64_t *unmapped, uint64_t *live)
{
	*mapped = nmapped;
	*unmapped = nunmapped;
	pthread_rwlock_rdlock(&maps_mu);
	*live = nmaps;
	pthread_rwlock_unlock(&maps_mu);
}

/* ---------------------------------------------------------------- translation */

int w_vmm_translate(struct wapp *a, const unsigned char *args, uint32_t argbytes,
		    const struct wkernel *k, unsigned char *out)
{
	int changed = 0;
	unsigned i;

	pthread_rwlock_rdlock(&maps_mu);
	for (i = 0; i < k->nparams; i++) {
		uint32_t off = k->params[i].offset;
		uint64_t v;
		long j;

		if (k->params[i].size != 8 || off % 8 || (uint64_t)off + 8 > argbytes)
			continue;
		memcpy(&v, args + off, 8);
		j = map_find(a->serial, v);
		if (j < 0 || maps[j].waddr == maps[j].addr)
			continue;
		if (!changed)
			memcpy(out, args, argbytes);
		v = v - maps[j].addr + maps[j].waddr;
		memcpy(out + off, &v, 8);
		changed = 1;
	}
	pthread_rwlock_unlock(&maps_mu);
	if (changed) {
		atomic_fetch_add(&a->translated, 1);
		atomic_fetch_add(&wstate.translated, 1);
		if (!a->translate_said) {
			a->translate_said = 1;
			w_log("app %s (pid %u): its memory is not at the same address here: pointer "
			      "arguments of its launches are translated (top-level ones only: a "
			      "pointer stored in device memory is not)", a->name, a->pid);
		}
	}
	return changed;
}
