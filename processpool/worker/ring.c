/*
 * ring.c - an app's launch ring: MODULE, DEFINE and LAUNCH frames in shared
 * memory, written by the app's shim, taken here by the app's launcher thread.
 *
 * The app can write anything into the ring at any time, so nothing in it is
 * trusted: indexes are checked against the ring's size, every frame is
 * copied out before fwd_check_hdr/fwd_check_body look at it, and the copy
 * is what runs.  A frame that fails a check stops this app's ring for good
 * (the rest of its stream order is void); the reason goes to the log and to
 * the page (refused_seq/refused_code), where the shim's liveness check
 * finds it and replays what did not complete, locally.  A MODULE or DEFINE
 * we cannot serve does not (on a version-5 page): the DEFINE's verdict goes
 * to the page, the shim runs that kernel itself, the ring goes on.
 */
#define _GNU_SOURCE
#include "worker.h"

#include <limits.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static void refuse(struct wapp *a, uint64_t seq, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void refuse(struct wapp *a, uint64_t seq, int code, const char *fmt, ...)
{
	char why[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	atomic_fetch_add(&wstate.bad_frames, 1);
	w_log("app %s (pid %u): refusing its launch ring: %s", a->name, a->pid, why);
	__atomic_store_n(&a->page->refused_seq, seq, __ATOMIC_RELAXED);
	__atomic_store_n(&a->page->refused_code, code, __ATOMIC_RELEASE);
	a->poisoned = 1;
}

static void ring_read(struct wapp *a, uint64_t pos, void *dst, size_t len)
{
	size_t off = (size_t)(pos & (a->ring_size - 1)), first = a->ring_size - off;

	if (first > len)
		first = len;
	memcpy(dst, a->ring + off, first);
	memcpy((char *)dst + first, a->ring, len - first);
}

int w_ring_empty(struct wapp *a)
{
	return __atomic_load_n(&a->page->ring_head, __ATOMIC_SEQ_CST) ==
	       __atomic_load_n(&a->page->ring_tail, __ATOMIC_RELAXED);
}

/* Take one frame into a->frame: its length, 0 if none, -1 if refused. */
static long take(struct wapp *a)
{
	struct fwd_page *pg = a->page;
	uint64_t head = __atomic_load_n(&pg->ring_head, __ATOMIC_ACQUIRE);
	uint64_t tail = __atomic_load_n(&pg->ring_tail, __ATOMIC_RELAXED);   /* ours */
	struct fwd_hdr h;

	if (head == tail)
		return 0;
	if (head - tail > a->ring_size || head - tail < sizeof(h)) {
		refuse(a, 0, FWD_E_MALFORMED, "ring indexes are inconsistent (head %llu tail %llu)",
		       (unsigned long long)head, (unsigned long long)tail);
		return -1;
	}
	ring_read(a, tail, &h, sizeof(h));
	if (h.len < sizeof(h) || h.len > FWD_MAX_FRAME || h.len > head - tail) {
		refuse(a, 0, FWD_E_MALFORMED, "frame length %u does not fit (%llu bytes queued)",
		       h.len, (unsigned long long)(head - tail));
		return -1;
	}
	ring_read(a, tail, a->frame, h.len);
	/* the copy is ours: give the space back before running it */
	__atomic_store_n(&pg->ring_tail, tail + h.len, __ATOMIC_RELEASE);
	return h.len;
}

static int run_frame(struct wapp *a, size_t n)
{
	static __thread struct fwd_param params[FWD_MAX_PARAMS];
	const unsigned char *buf = a->frame;
	struct fwd_hdr h = { 0 };
	const char *why = fwd_check_hdr(buf, n, &h);
	uint64_t seq = 0;

	if (!why)
		why = fwd_check_body(buf, n, h.type);
	if (!why && h.type == FWD_T_LAUNCH)
		memcpy(&seq, buf + offsetof(struct fwd_launch, seq), sizeof(seq));
	if (why) {
		/* as on the socket: another version only when it is our magic */
		refuse(a, seq,
		       h.magic == FWD_MAGIC && h.version != FWD_VERSION ? FWD_E_VERSION
								  : FWD_E_MALFORMED,
		       "frame of type %u: %s", h.type, why);
		return -1;
	}
	if (h.type == FWD_T_DEFINE) {
		struct fwd_define m;
		char name[FWD_MAX_STR + 1], sub[240];
		int code;

		memcpy(&m, buf, sizeof(m));
		memcpy(params, buf + sizeof(m), (size_t)m.nparams * sizeof(*params));
		memcpy(name, buf + sizeof(m) + (size_t)m.nparams * sizeof(*params), m.name_len);
		name[m.name_len] = 0;
		code = w_app_define(a, &m, params, name, sub, sizeof(sub));
		if (code && code != FWD_E_MODULE) {
			refuse(a, 0, code, "DEFINE %u: %s", m.kid, sub);
			return -1;
		}
		w_app_verdict(a, m.kid, code ? sub : NULL);
		return 0;
	}
	if (h.type == FWD_T_MODULE) {
		struct fwd_module m;
		char path[FWD_MAX_STR + 1], sub[240];
		int code;

		memcpy(&m, buf, sizeof(m));
		memcpy(path, buf + sizeof(m), m.path_len);
		path[m.path_len] = 0;
		code = w_app_module(a, &m, path, sub, sizeof(sub));
		if (code == FWD_E_MODULE) {
			/* its kernels' DEFINEs are refused (and answered) */
			w_app_module_refused(a, m.mid);
			return 0;
		}
		if (code) {
			refuse(a, 0, code, "%s", sub);
			return -1;
		}
		return 0;
	}
	if (h.type == FWD_T_LAUNCH) {
		struct fwd_launch m;
		struct wkernel *k;

		memcpy(&m, buf, sizeof(m));
		k = a->kernels[m.kid];
		if (!k) {
			refuse(a, seq, FWD_E_UNKNOWN_KERNEL, "LAUNCH %llu of undefined kernel %u",
			       (unsigned long long)seq, m.kid);
			return -1;
		}
		if (k->argbytes != m.argbytes) {
			refuse(a, seq, FWD_E_MALFORMED, "LAUNCH %llu: %u argument bytes, kernel %u takes %u",
			       (unsigned long long)seq, m.argbytes, m.kid, k->argbytes);
			return -1;
		}
		w_launch(a, &m, k, buf + sizeof(m));
		return 0;
	}
	refuse(a, seq, FWD_E_TYPE, "frame type %u does not belong in a launch ring", h.type);
	return -1;
}

int w_ring_run(struct wapp *a)
{
	int n = 0;

	while (!a->poisoned && !__atomic_load_n(&a->abandon, __ATOMIC_RELAXED)) {
		long len = take(a);

		if (len <= 0)
			break;
		if (run_frame(a, (size_t)len) < 0)
			break;
		n++;
	}
	return a->poisoned ? -1 : n;
}

/*
 * Sleep until the producer (or w_ring_kick) wakes us, or 100 ms pass.
 * The store to ring_sleeping and the producer's store to ring_head are
 * both seq_cst: either it sees us sleeping, or we see its frame.
 */
void w_ring_sleep(struct wapp *a, int (*wake_up)(struct wapp *))
{
	struct fwd_page *pg = a->page;
	struct timespec ts = { 0, 100000000 };
	uint32_t seen = __atomic_load_n(&pg->ring_wake, __ATOMIC_SEQ_CST);

	__atomic_store_n(&pg->ring_sleeping, 1, __ATOMIC_SEQ_CST);
	if (!wake_up(a))
		syscall(SYS_futex, &pg->ring_wake, FUTEX_WAIT, seen, &ts, NULL, 0);
	__atomic_store_n(&pg->ring_sleeping, 0, __ATOMIC_RELAXED);
}

/* Wake the launcher from another thread (stop, abandon). */
void w_ring_kick(struct wapp *a)
{
	__atomic_add_fetch(&a->page->ring_wake, 1, __ATOMIC_SEQ_CST);
	syscall(SYS_futex, &a->page->ring_wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}
