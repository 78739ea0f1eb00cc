/*
 * shim_fwd_conn.c - one connection from this application to a worker.
 *
 * Opening: a worker whose pid file names a dead process, or whose socket
 * nobody listens on (one connect(2)), is refused at once; so is, for
 * COLOCATE_WORKER_TIMEOUT_MS, a worker that just failed a HELLO: a route to
 * a dead or hung worker must not stall every route change.  Then create
 * the page <runtime dir>/fwd-<pid>-<n>.page (completions, time slots and
 * the launch ring, RING_BYTES), connect a DEALER to
 * ipc://<runtime dir>/worker-<N>.sock, send HELLO and wait for HELLO_REPLY
 * (bounded by COLOCATE_WORKER_TIMEOUT_MS, at most 2000 ms here).  The
 * worker maps the page before answering; the file is then unlinked, so
 * nothing is left behind whoever dies first.
 *
 * Sending (fconn_send): MODULE, DEFINE and LAUNCH frames go into the ring,
 * never on the socket, waking the worker's launcher if it sleeps; when the
 * ring is full (the worker is that far behind), wait for room, looking at
 * liveness.  The socket carries HELLO, BYE and the worker's ERRORs.
 *
 * Liveness (fconn_lost): the worker's pid (from its HELLO_REPLY) must
 * exist and not be a zombie, its main loop must have stamped the page's
 * heartbeat within COLOCATE_WORKER_TIMEOUT_MS (default 2000), and it must
 * neither have stopped our ring (the page's refused_code: a frame of ours
 * was malformed) nor sent an ERROR frame (a bad message on the socket, or
 * its shutdown): the rest of the connection is then void.  A kernel the worker
 * cannot serve is not that: its DEFINE's verdict comes in the page
 * (fconn_wait_defines), and only that kernel runs locally.
 *
 * Waiting (fconn_wait): poll the page for a few microseconds, then sleep on
 * its futex word (process-shared: the worker's host functions wake it),
 * looking at liveness every 10 ms.
 */
#define _GNU_SOURCE
#include "shim_fwd.h"
#include "shim_vmm.h"
#include "unixutil.h"
#include "zmqdl.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#define CHECK_NS  10000000ull   /* liveness checks while waiting           */

static void *zctx;
static unsigned nconn;

/* The launch ring of a connection: a power of two within FWD_RING_MIN..
 * FWD_RING_MAX.  1 MiB holds thousands of launches (a LAUNCH is 56 bytes
 * and its arguments), so a full ring means a worker far behind, not a
 * burst; its pages are touched only as far as the ring is used. */
#define RING_BYTES (1u << 20)
_Static_assert(RING_BYTES >= FWD_RING_MIN && RING_BYTES <= FWD_RING_MAX &&
	       !(RING_BYTES & (RING_BYTES - 1)), "ring size");

/*
 * How long a waiter polls the page before sleeping on its futex.  As CUDA's
 * cudaDeviceScheduleAuto does: spin when there are cores to spare, yield
 * the core at once when there are few (on 2 vCPUs a spinning app slows the
 * very worker threads it waits for: measured 40 us per forwarded launch and
 * sync with 2 us of polling, 170 us with 100 us).  COLOCATE_FWD_SPIN_US.
 */
uint64_t shim_fwd_spin_ns(void)
{
	static uint64_t ns = ~0ull;

	if (ns == ~0ull) {
		const char *v = getenv("COLOCATE_FWD_SPIN_US");

		if (v && *v)
			ns = strtoull(v, NULL, 10) * 1000ull;
		else
			ns = sysconf(_SC_NPROCESSORS_ONLN) > 4 ? 30000ull : 2000ull;
	}
	return ns;
}

static int timeout_ms(void)
{
	static int ms;

	if (!ms) {
		const char *v = getenv("COLOCATE_WORKER_TIMEOUT_MS");
		int t = v && *v ? atoi(v) : 0;

		ms = t > 0 ? t : 2000;
	}
	return ms;
}


/* The pid in <runtime dir>/worker-<N>.pid, 0 when unreadable. */
static uint32_t pid_file(uint32_t worker)
{
	char path[PATH_MAX], buf[32];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/worker-%u.pid", shim_runtime_dir(), worker);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	buf[n > 0 ? n : 0] = 0;
	return (uint32_t)strtoul(buf, NULL, 10);
}

/* Workers that failed a HELLO lately, not to be waited on again soon. */
static struct {
	uint32_t worker;
	uint64_t until_ns;
} failed_recently[8];

static int failed_lately(uint32_t worker)
{
	uint64_t now = shim_now_ns();
	unsigned i;

	for (i = 0; i < 8; i++)
		if (failed_recently[i].worker == worker && failed_recently[i].until_ns > now)
			return 1;
	return 0;
}

static void note_failure(uint32_t worker)
{
	static unsigned next;

	failed_recently[next % 8].worker = worker;
	failed_recently[next % 8].until_ns = shim_now_ns() + (uint64_t)timeout_ms() * 1000000ull;
	next++;
}

/* ---------------------------------------------------------------- page */

static struct fwd_page *page_create(struct fconn *c, char *path, size_t pathlen, char *why,
				    size_t whylen)
{
	struct fwd_page *pg;
	int fd, tries;

	c->ring_size = RING_BYTES;
	c->map_len = FWD_RING_OFF + c->ring_size;     /* page, time slots, ring */
	snprintf(path, pathlen, "%s/fwd-%d-%u.page", shim_runtime_dir(), (int)getpid(),
		 __atomic_add_fetch(&nconn, 1, __ATOMIC_RELAXED));
	for (tries = 0; tries < 2; tries++) {
		fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd >= 0 || errno != EEXIST)
			break;
		unlink(path);        /* left by a dead process with our pid */
	}
	if (fd < 0) {
		snprintf(why, whylen, "cannot create %s: %s", path, strerror(errno));
		return NULL;
	}
	if (ftruncate(fd, (off_t)c->map_len) < 0) {
		snprintf(why, whylen, "cannot size %s: %s", path, strerror(errno));
		close(fd);
		unlink(path);
		return NULL;
	}
	pg = mmap(NULL, c->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (pg == MAP_FAILED) {
		snprintf(why, whylen, "cannot map %s: %s", path, strerror(errno));
		unlink(path);
		return NULL;
	}
	pg->version = FWD_PAGE_VERSION;
	pg->ring_size = c->ring_size;
	c->ring = (unsigned char *)pg + FWD_RING_OFF;
	__atomic_store_n(&pg->magic, FWD_PAGE_MAGIC, __ATOMIC_RELEASE);
	return pg;
}

/* ---------------------------------------------------------------- HELLO */

static size_t put(unsigned char *dst, const char *s, uint16_t *len)
{
	size_t n = strlen(s);

	if (n > FWD_MAX_STR)
		n = FWD_MAX_STR;
	memcpy(dst, s, n);
	*len = (uint16_t)n;
	return n;
}

static int hello(struct fconn *c, const char *page_path, char *why, size_t whylen)
{
	static unsigned char buf[sizeof(struct fwd_hello) + 4 * FWD_MAX_STR];
	char twins[FWD_MAX_STR + 1], exe[PATH_MAX] = "", device[PATH_MAX] = "";
	struct fwd_hello m;
	struct fwd_hello_reply r;
	struct zmqdl_pollitem it = { c->sock, 0, ZMQ_POLLIN, 0 };
	const char *name = getenv("COLOCATE_APP_NAME"), *sim = getenv("SIMGPU_DIR");
	unsigned char reply[sizeof(r) + 512];
	size_t o = sizeof(m);
	int n, wait_ms = timeout_ms() < 2000 ? timeout_ms() : 2000;
	ssize_t len;

	fconn_twins(twins, sizeof(twins));
	len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	exe[len > 0 ? len : 0] = 0;
	if (!name || !*name)
		name = strrchr(exe, '/') ? strrchr(exe, '/') + 1 : "app";
	/* pointers mean something only on the same simulated device */
	if (sim && *sim && shim_dlsym(RTLD_DEFAULT, "simgpu_kernel_has_twin")) {
		char *rp = realpath(sim, NULL);

		snprintf(device, sizeof(device), "%s", rp ? rp : sim);
		free(rp);
	}
	memset(&m, 0, sizeof(m));
	m.pid = (uint32_t)getpid();
	m.worker_id = c->worker;
	o += put(buf + o, page_path, &m.page_len);
	o += put(buf + o, twins, &m.twins_len);
	o += put(buf + o, device, &m.device_len);
	o += put(buf + o, name, &m.name_len);
	fwd_hdr_init(&m.h, FWD_T_HELLO, FWD_HF_RING | (c->vmm ? FWD_HF_VMM : 0), o);
	memcpy(buf, &m, sizeof(m));
	if (zmq.send(c->sock, buf, o, 0) < 0) {
		snprintf(why, whylen, "send: %s", zmq.strerror(zmq.errno_()));
		return -1;
	}
	for (;;) {
		struct fwd_hdr h;
		const char *bad;

		n = zmq.poll(&it, 1, wait_ms);
		if (n <= 0) {
			snprintf(why, whylen, "no answer to HELLO in %d ms", wait_ms);
			return -1;
		}
		n = zmq.recv(c->sock, reply, sizeof(reply), ZMQ_DONTWAIT);
		if (n < 0)
			continue;
		if (n > (int)sizeof(reply))
			continue;                  /* not a reply of ours */
		bad = fwd_check_hdr(reply, (size_t)n, &h);
		if (!bad)
			bad = fwd_check_body(reply, (size_t)n, h.type);
		if (bad || h.type != FWD_T_HELLO_REPLY) {
			snprintf(why, whylen, "unexpected answer to HELLO (%s)", bad ? bad : "type");
			return -1;
		}
		break;
	}
	memcpy(&r, reply, sizeof(r));
	if (r.status == FWD_S_OK && !(r.h.flags & FWD_HF_RING)) {
		snprintf(why, whylen, "the worker does not take launches through a ring");
		return -1;
	}
	if (r.status == FWD_S_OK && c->vmm && !(r.h.flags & FWD_HF_VMM)) {
		snprintf(why, whylen, "the worker does not map VMM-shared memory (COLOCATE_MEM=vmm)");
		return -1;
	}
	if (r.status != FWD_S_OK) {
		snprintf(why, whylen, "refused (status %u: %.*s)", r.status, (int)r.msg_len,
			 (const char *)reply + sizeof(r));
		return -1;
	}
	if (r.worker_id != c->worker ||
	    __atomic_load_n(&c->page->worker_pid, __ATOMIC_ACQUIRE) != r.pid) {
		snprintf(why, whylen, "inconsistent HELLO_REPLY (worker %u pid %u)", r.worker_id,
			 r.pid);
		return -1;
	}
	c->worker_pid = r.pid;
	c->quota = r.quota_pct;
	return 0;
}

struct fconn *fconn_open(uint32_t worker, char *why, size_t whylen)
{
	char sock_path[PATH_MAX], page_path[PATH_MAX], endpoint[PATH_MAX + 8], sub[160];
	struct fconn *c;
	struct stat st;
	uint32_t pid;
	int zero = 0, linger = 0;

	snprintf(sock_path, sizeof(sock_path), "%s/worker-%u.sock", shim_runtime_dir(), worker);
	if (stat(sock_path, &st) < 0) {
		snprintf(why, whylen, "no worker %u (%s missing)", worker, sock_path);
		return NULL;
	}
	pid = pid_file(worker);
	if (pid && !colocate_pid_alive(pid)) {
		snprintf(why, whylen, "worker %u (pid %u) is not running", worker, pid);
		return NULL;
	}
	if (!colocate_socket_listens(sock_path)) {
		snprintf(why, whylen, "worker %u does not listen on %s", worker, sock_path);
		return NULL;
	}
	if (failed_lately(worker)) {
		snprintf(why, whylen, "worker %u failed to answer less than %d ms ago", worker,
			 timeout_ms());
		return NULL;
	}
	if (zmqdl_load(shim_dlsym, why, whylen) < 0)
		return NULL;
	if (!zctx && !(zctx = zmq.ctx_new())) {
		snprintf(why, whylen, "zmq context: %s", zmq.strerror(zmq.errno_()));
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		snprintf(why, whylen, "out of memory");
		return NULL;
	}
	c->refs = 1;
	c->worker = worker;
	c->memfd = -1;
	/* the app's memory is VMM-shared: the worker maps it before our first
	 * launch (on a GPU, a worker takes us only so) */
	c->vmm = shim_vmm_on();
	c->last_check_ns = shim_now_ns();
	pthread_mutex_init(&c->sock_mu, NULL);
	c->page = page_create(c, page_path, sizeof(page_path), why, whylen);
	if (!c->page)
		goto fail;
	c->sock = zmq.socket(zctx, ZMQ_DEALER);
	if (!c->sock) {
		snprintf(why, whylen, "zmq socket: %s", zmq.strerror(zmq.errno_()));
		goto fail;
	}
	/* the launch window bounds what is queued; no frame is ever dropped */
	zmq.setsockopt(c->sock, ZMQ_SNDHWM, &zero, sizeof(zero));
	zmq.setsockopt(c->sock, ZMQ_RCVHWM, &zero, sizeof(zero));
	zmq.setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof(linger));
	snprintf(endpoint, sizeof(endpoint), "ipc://%s", sock_path);
	if (zmq.connect(c->sock, endpoint) < 0) {
		snprintf(why, whylen, "connect %s: %s", endpoint, zmq.strerror(zmq.errno_()));
		goto fail;
	}
	if (hello(c, page_path, sub, sizeof(sub)) < 0) {
		snprintf(why, whylen, "worker %u: %s", worker, sub);
		note_failure(worker);
		goto fail;
	}
	unlink(page_path);          /* both sides have it mapped now */
	if (c->vmm) {
		c->memfd = shim_vmm_attach(worker, sub, sizeof(sub));
		if (c->memfd < 0) {
			struct fwd_hdr h;

			snprintf(why, whylen, "worker %u: memory not shared: %s", worker, sub);
			note_failure(worker);
			fwd_hdr_init(&h, FWD_T_BYE, 0, sizeof(h));   /* it knows us */
			zmq.send(c->sock, &h, sizeof(h), ZMQ_DONTWAIT);
			goto fail_mapped;
		}
	}
	return c;
fail:
	if (c->page)
		unlink(page_path);
fail_mapped:
	if (c->page)
		munmap(c->page, c->map_len);
	if (c->sock) {
		int linger = 100;

		zmq.setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof(linger));
		zmq.close(c->sock);
	}
	pthread_mutex_destroy(&c->sock_mu);
	free(c);
	return NULL;
}

void fconn_get(struct fconn *c)
{
	__atomic_add_fetch(&c->refs, 1, __ATOMIC_RELAXED);
}

void fconn_put(struct fconn *c)
{
	if (__atomic_sub_fetch(&c->refs, 1, __ATOMIC_ACQ_REL))
		return;
	munmap(c->page, c->map_len);
	pthread_mutex_destroy(&c->sock_mu);
	free(c);
}

/* Copy len bytes into the ring at byte position pos, wrapping. */
static void ring_copy(struct fconn *c, uint64_t pos, const void *buf, size_t len)
{
	size_t off = (size_t)(pos & (c->ring_size - 1)), first = c->ring_size - off;

	if (first > len)
		first = len;
	memcpy(c->ring + off, buf, first);
	memcpy(c->ring, (const char *)buf + first, len - first);
}

/* Single producer: the caller holds shim_fwd.c's mutex. */
int fconn_send(struct fconn *c, const void *buf, size_t len)
{
	struct fwd_page *pg = c->page;
	uint64_t head = __atomic_load_n(&pg->ring_head, __ATOMIC_RELAXED);   /* ours */
	char why[200];

	if (len > c->ring_size / 2)
		return -1;
	/* full: the worker is a whole ring behind; wait for it (backpressure,
	 * as a GPU's launch queue gives), but not for a dead one */
	while (head + len - __atomic_load_n(&pg->ring_tail, __ATOMIC_ACQUIRE) > c->ring_size) {
		struct timespec ts = { 0, 50000 };
		if (shim_now_ns() - c->last_check_ns >= CHECK_NS && fconn_lost(c, why, sizeof(why)))
			return -1;
		nanosleep(&ts, NULL);
	}
	ring_copy(c, head, buf, len);
	/* seq_cst: pairs with the consumer's store of ring_sleeping */
	__atomic_store_n(&pg->ring_head, head + len, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&pg->ring_sleeping, __ATOMIC_SEQ_CST)) {
		__atomic_add_fetch(&pg->ring_wake, 1, __ATOMIC_SEQ_CST);
		syscall(SYS_futex, &pg->ring_wake, FUTEX_WAKE, 1, NULL, NULL, 0);
	}
	return 0;
}

void fconn_poll(struct fconn *c)
{
	unsigned char buf[sizeof(struct fwd_errmsg) + 300];

	pthread_mutex_lock(&c->sock_mu);
	while (c->sock) {
		struct fwd_errmsg m;
		struct fwd_hdr h;
		int n = zmq.recv(c->sock, buf, sizeof(buf), ZMQ_DONTWAIT);

		if (n < 0)
			break;
		if (n > (int)sizeof(buf) || fwd_check_hdr(buf, (size_t)n, &h) ||
		    fwd_check_body(buf, (size_t)n, h.type) || h.type != FWD_T_ERROR)
			continue;              /* nothing else is meant for us now */
		memcpy(&m, buf, sizeof(m));
		if (!__atomic_load_n(&c->lost, __ATOMIC_ACQUIRE)) {
			snprintf(c->lost_why, sizeof(c->lost_why), "worker error %u at launch %llu: %.*s",
				 m.code, (unsigned long long)m.seq, (int)m.msg_len,
				 (const char *)buf + sizeof(m));
			__atomic_store_n(&c->lost, 1, __ATOMIC_RELEASE);
		}
	}
	pthread_mutex_unlock(&c->sock_mu);
}

/* fconn_lost without a socket poll or a /proc read: its flags, the pid's
 * existence (one kill(2)) and the heartbeat. */
int fconn_lost_quick(struct fconn *c, char *why, size_t whylen)
{
	uint64_t now = shim_now_ns(), beat;
	int32_t code;

	if (__atomic_load_n(&c->lost, __ATOMIC_ACQUIRE)) {
		snprintf(why, whylen, "%s", c->lost_why);
		return 1;
	}
	if (c->memfd >= 0 && !shim_vmm_conn_ok(c->memfd)) {
		snprintf(why, whylen, "the worker could not map some of the app's memory");
		return 1;
	}
	code = __atomic_load_n(&c->page->refused_code, __ATOMIC_ACQUIRE);
	if (code) {
		snprintf(why, whylen, "worker refused launch %llu (error %d; see its log)",
			 (unsigned long long)__atomic_load_n(&c->page->refused_seq, __ATOMIC_RELAXED),
			 code);
		return 1;
	}
	if (!c->worker_pid || (kill((pid_t)c->worker_pid, 0) < 0 && errno == ESRCH)) {
		snprintf(why, whylen, "worker process %u exited", c->worker_pid);
		return 1;
	}
	beat = __atomic_load_n(&c->page->beat_ns, __ATOMIC_RELAXED);
	if (now > beat && now - beat > (uint64_t)timeout_ms() * 1000000ull) {
		snprintf(why, whylen, "no heartbeat from worker process %u for %llu ms",
			 c->worker_pid, (unsigned long long)((now - beat) / 1000000ull));
		return 1;
	}
	return 0;
}

int fconn_lost(struct fconn *c, char *why, size_t whylen)
{
	c->last_check_ns = shim_now_ns();
	fconn_poll(c);
	if (fconn_lost_quick(c, why, whylen))
		return 1;
	/* kill(0) answers for a killed worker its parent has not reaped yet */
	if (!colocate_pid_alive(c->worker_pid)) {
		snprintf(why, whylen, "worker process %u exited", c->worker_pid);
		return 1;
	}
	return 0;
}

struct waitfor {
	const struct fwait *w;         /* done[] targets, n of them            */
	int n;
	uint64_t defines;              /* or defines_done >= this (w NULL)     */
};

static int all_done(const struct fconn *c, const struct waitfor *f)
{
	int i;

	if (!f->w)
		return __atomic_load_n(&c->page->defines_done, __ATOMIC_ACQUIRE) >= f->defines;
	for (i = 0; i < f->n; i++)
		if (!fconn_done(c, f->w[i].idx, f->w[i].seq))
			return 0;
	return 1;
}

/* Poll, then sleep on the page's futex (the worker wakes it after done[]
 * and defines_done stores), looking at liveness every CHECK_NS. */
static int wait_for(struct fconn *c, const struct waitfor *f, char *why, size_t whylen)
{
	struct fwd_page *pg = c->page;
	uint64_t t0 = shim_now_ns(), last = t0;

	while (shim_now_ns() - t0 < shim_fwd_spin_ns())
		if (all_done(c, f))
			return 0;
	for (;;) {
		struct timespec ts = { 0, (long)CHECK_NS / 2 };
		uint32_t seen = __atomic_load_n(&pg->wake, __ATOMIC_SEQ_CST);
		uint64_t now;

		if (all_done(c, f))
			return 0;
		__atomic_add_fetch(&pg->waiters, 1, __ATOMIC_SEQ_CST);
		/* seq_cst both sides: the worker stores done, then reads waiters */
		if (!all_done(c, f))
			syscall(SYS_futex, &pg->wake, FUTEX_WAIT, seen, &ts, NULL, 0);
		__atomic_sub_fetch(&pg->waiters, 1, __ATOMIC_SEQ_CST);
		if (all_done(c, f))
			return 0;
		now = shim_now_ns();
		if (now - last >= CHECK_NS) {
			last = now;
			if (fconn_lost(c, why, whylen))
				return -1;
		}
	}
}

int fconn_wait(struct fconn *c, const struct fwait *w, int n, char *why, size_t whylen)
{
	struct waitfor f = { w, n, 0 };

	return wait_for(c, &f, why, whylen);
}

int fconn_wait_defines(struct fconn *c, char *why, size_t whylen)
{
	struct waitfor f = { NULL, 0, c->ndefines };

	return wait_for(c, &f, why, whylen);
}

/* One slot, read as the seqlock it is (fwd_proto.h): 1 when it holds seq. */
static int read_time(struct fconn *c, uint64_t seq, int64_t *start_ns, int64_t *dur_ns)
{
	struct fwd_time *t = &fwd_times(c->page)[seq % FWD_TIMES_N];
	int64_t start, dur;

	if (__atomic_load_n(&t->seq, __ATOMIC_ACQUIRE) != seq)
		return 0;
	start = __atomic_load_n(&t->start_ns, __ATOMIC_RELAXED);
	dur = (int64_t)__atomic_load_n(&t->dur_ns, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	if (__atomic_load_n(&t->seq, __ATOMIC_RELAXED) != seq)
		return 0;
	*start_ns = start;
	*dur_ns = dur;
	return 1;
}

/*
 * The worker writes a slot, then timed[idx] (release): once timed[idx] >=
 * seq, a slot without seq never gets it.  Until then: not yet, unless the
 * connection lost work or was dropped without waiting for it (lost, gone)
 * or the worker
 * died or hangs after completing the launch (done[] but no time: the quick
 * liveness test, a kill(0) and two loads, only in that case).  Lock-free:
 * the caller's reference keeps the page mapped.
 */
/* A completed launch's time later than this is given up (the task untimed). */
#define LATE_TIME_NS (100ull * 1000 * 1000)

int fconn_time(struct fconn *c, uint64_t seq, uint32_t idx, int64_t *start_ns, int64_t *dur_ns)
{
	char why[256];

	if (idx >= FWD_MAX_STREAMS)
		return -1;
	if (read_time(c, seq, start_ns, dur_ns))
		return 1;
	if (__atomic_load_n(&c->page->timed[idx], __ATOMIC_ACQUIRE) >= seq ||
	    __atomic_load_n(&c->gone, __ATOMIC_ACQUIRE) || __atomic_load_n(&c->lost, __ATOMIC_ACQUIRE))
		return read_time(c, seq, start_ns, dur_ns) ? 1 : -1;
	if (fconn_done(c, idx, seq)) {
		/* done, and its time should follow at once; a worker that never
		 * writes it (wedged, out of memory) must not hold every record
		 * behind this one, nor the app's exit */
		uint64_t key = seq * FWD_MAX_STREAMS + idx, now = shim_now_ns();

		if (fconn_lost_quick(c, why, sizeof(why)))
			return -1;
		if (__atomic_load_n(&c->late_key, __ATOMIC_RELAXED) != key) {
			__atomic_store_n(&c->late_since_ns, now, __ATOMIC_RELAXED);
			__atomic_store_n(&c->late_key, key, __ATOMIC_RELAXED);
		} else if (now - __atomic_load_n(&c->late_since_ns, __ATOMIC_RELAXED) > LATE_TIME_NS) {
			return -1;
		}
	}
	return 0;
}

void fconn_close(struct fconn *c, int bye)
{
	if (!bye)
		__atomic_store_n(&c->gone, 1, __ATOMIC_RELEASE);
	pthread_mutex_lock(&c->sock_mu);
	if (c->sock) {
		if (bye && !__atomic_load_n(&c->lost, __ATOMIC_ACQUIRE)) {
			struct fwd_hdr h;
			int linger = 100;

			/* the BYE is worth a short linger; nothing else is queued.
			 * The page says it first: a process that exits at once
			 * may take the frame with it */
			if (c->page)
				__atomic_store_n(&c->page->bye, 1, __ATOMIC_RELEASE);
			fwd_hdr_init(&h, FWD_T_BYE, 0, sizeof(h));
			zmq.setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof(linger));
			zmq.send(c->sock, &h, sizeof(h), ZMQ_DONTWAIT);
		}
		zmq.close(c->sock);
		c->sock = NULL;
	}
	pthread_mutex_unlock(&c->sock_mu);
	/* the worker unmaps our memory once our launches there are done */
	shim_vmm_detach(c->memfd);
	c->memfd = -1;
	fconn_put(c);
}

void fconn_forget(void)
{
	/* libzmq's threads did not survive the fork: never touch this context */
	zctx = NULL;
}
