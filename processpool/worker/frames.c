/*
 * frames.c - receive, check and dispatch what arrives on the ROUTER.
 *
 * A message is [routing id][optional empty delimiter][payload].  Payloads
 * starting with '{' are JSON requests (only "stats" is known); anything
 * else must be a binary frame of fwd_proto.h, of the two types a shim sends
 * on its socket: HELLO and BYE (MODULE, DEFINE and LAUNCH travel in the
 * app's launch ring, ring.c, and never reach this thread).  Every frame is
 * checked (fwd_check_hdr, fwd_check_body) before a field is used; a bad one is
 * logged in one line and answered with an ERROR frame, and the worker goes
 * on.  Logging is capped so that a flood of garbage cannot fill a disk.
 */
#define _GNU_SOURCE
#include "worker.h"
#include "zmqdl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD_LOG_CAP 200

static unsigned char rid[W_MAX_RID];
static unsigned char buf[FWD_MAX_FRAME + 1];
static unsigned char sink[256];

void w_send(struct wapp *a, const unsigned char *id, size_t id_len, int delim,
	    const void *msg, size_t len)
{
	if (a) {
		id = a->rid;
		id_len = a->rid_len;
		delim = a->delim;
	}
	/* ROUTER: never blocks; a message to a peer that left is dropped */
	if (zmq.send(wstate.sock, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
		return;
	if (delim && zmq.send(wstate.sock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
		return;
	zmq.send(wstate.sock, msg, len, ZMQ_DONTWAIT);
}

void w_send_error(const unsigned char *id, size_t id_len, int delim, uint32_t code,
		  uint64_t seq, const char *msg)
{
	unsigned char out[sizeof(struct fwd_errmsg) + 256];
	struct fwd_errmsg m;
	size_t n = strlen(msg);

	if (n > 256)
		n = 256;
	memset(&m, 0, sizeof(m));
	fwd_hdr_init(&m.h, FWD_T_ERROR, 0, sizeof(m) + n);
	m.code = code;
	m.seq = seq;
	m.msg_len = (uint16_t)n;
	memcpy(out, &m, sizeof(m));
	memcpy(out + sizeof(m), msg, n);
	w_send(NULL, id, id_len, delim, out, sizeof(m) + n);
}

static void hexid(const unsigned char *id, size_t n, char *out, size_t outlen)
{
	size_t i, o = 0;

	for (i = 0; i < n && o + 3 < outlen; i++)
		o += (size_t)snprintf(out + o, outlen - o, "%02x", id[i]);
	out[o] = 0;
}

/* Log (capped) and answer a frame we cannot take. */
static void reject(const unsigned char *id, size_t id_len, int delim, uint32_t code,
		   uint64_t seq, size_t len, const char *fmt, ...)
	__attribute__((format(printf, 7, 8)));
static void reject(const unsigned char *id, size_t id_len, int delim, uint32_t code,
		   uint64_t seq, size_t len, const char *fmt, ...)
{
	char why[256], who[80];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	uint64_t nbad = atomic_fetch_add(&wstate.bad_frames, 1) + 1;

	if (nbad <= BAD_LOG_CAP) {
		hexid(id, id_len, who, sizeof(who));
		w_log("bad frame from %s (%zu bytes): %s%s", who, len, why,
		      nbad == BAD_LOG_CAP ? " (further bad frames are not logged)" : "");
	}
	w_send_error(id, id_len, delim, code, seq, why);
}

/* ---------------------------------------------------------------- JSON */

/* The value of "type" in a flat JSON object, into out; -1 if none or if
 * the text is not an object.  Not a JSON parser: enough to tell a stats
 * request from anything else, and strict about what it reads. */
static int json_type(const char *js, size_t n, char *out, size_t outlen)
{
	const char *p, *end = js + n;
	size_t o = 0;

	while (end > js && (end[-1] == ' ' || end[-1] == '\n' || end[-1] == '\t' || end[-1] == '\r'))
		end--;
	if (end - js < 2 || js[0] != '{' || end[-1] != '}')
		return -1;
	p = memmem(js, (size_t)(end - js), "\"type\"", 6);
	if (!p)
		return -1;
	p += 6;
	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	if (p >= end || *p++ != ':')
		return -1;
	while (p < end && (*p == ' ' || *p == '\t'))
		p++;
	if (p >= end || *p++ != '"')
		return -1;
	while (p < end && *p != '"' && *p != '\\' && o + 1 < outlen)
		out[o++] = *p++;
	out[o] = 0;
	return p < end && *p == '"' ? 0 : -1;
}

static void handle_json(const unsigned char *id, size_t id_len, int delim, size_t n)
{
	char type[32], out[1024];
	uint64_t vm_mapped, vm_unmapped, vm_live;
	int len;

	if (json_type((const char *)buf, n, type, sizeof(type)) < 0 || strcmp(type, "stats") != 0) {
		if (atomic_fetch_add(&wstate.bad_frames, 1) < BAD_LOG_CAP)
			w_log("unknown JSON request (%zu bytes)", n);
		len = snprintf(out, sizeof(out),
			       "{\"v\":1,\"type\":\"error\",\"error\":\"unknown request; "
			       "only {\\\"type\\\":\\\"stats\\\"} is answered\"}");
		w_send(NULL, id, id_len, delim, out, (size_t)len);
		return;
	}
	w_vmm_counts(&vm_mapped, &vm_unmapped, &vm_live);
	len = snprintf(out, sizeof(out),
		       "{\"v\":1,\"type\":\"stats\",\"id\":%u,\"quota_pct\":%u,\"pid\":%u,"
		       "\"forwarded\":%llu,\"apps\":%d,\"state\":\"%s\",\"bad_frames\":%llu,"
		       "\"by_name\":%s,\"modules\":%u,\"module_loads\":%llu,\"vmm\":%s,"
		       "\"vmm_same_address\":%s,\"translated\":%llu,\"bad_mem\":%llu,"
		       "\"vmm_mapped\":%llu,\"vmm_unmapped\":%llu,\"vmm_live\":%llu,"
		       "\"refused_kernels\":%llu}",
		       wstate.id, wstate.quota, wstate.pid, (unsigned long long)atomic_load(&wstate.executed),
		       w_app_count(), wstate.closing ? "closing" : "ready",
		       (unsigned long long)atomic_load(&wstate.bad_frames), wstate.has_by_name ? "true" : "false",
		       w_modules_loaded(), (unsigned long long)w_module_loads(),
		       wstate.vmm_ok ? "true" : "false",
		       wstate.vmm_ok && wstate.vmm_base == FWD_MEM_BASE ? "true" : "false",
		       (unsigned long long)atomic_load(&wstate.translated),
		       (unsigned long long)w_vmm_bad(), (unsigned long long)vm_mapped,
		       (unsigned long long)vm_unmapped, (unsigned long long)vm_live,
		       (unsigned long long)atomic_load(&wstate.refused_kernels));
	w_send(NULL, id, id_len, delim, out, (size_t)len);
}

/* ---------------------------------------------------------------- binary */

static void copy_str(char *dst, const unsigned char *src, size_t n)
{
	memcpy(dst, src, n);
	dst[n] = 0;
}

static void handle_hello(const unsigned char *id, size_t id_len, int delim, size_t n)
{
	static char page[FWD_MAX_STR + 1], twins[FWD_MAX_STR + 1], device[FWD_MAX_STR + 1],
		name[FWD_MAX_STR + 1];
	unsigned char out[sizeof(struct fwd_hello_reply) + 256];
	struct fwd_hello_reply r;
	struct fwd_hello m;
	const unsigned char *p = buf + sizeof(m);
	char msg[256] = "";
	uint32_t status;
	struct wapp *a = NULL;
	size_t ml;

	(void)n;
	memcpy(&m, buf, sizeof(m));
	if (w_app_find(id, id_len)) {
		reject(id, id_len, delim, FWD_E_MALFORMED, 0, n, "second HELLO on one connection");
		return;
	}
	copy_str(page, p, m.page_len);
	p += m.page_len;
	copy_str(twins, p, m.twins_len);
	p += m.twins_len;
	copy_str(device, p, m.device_len);
	p += m.device_len;
	copy_str(name, p, m.name_len);
	if (wstate.closing) {
		status = FWD_S_CLOSING;
		snprintf(msg, sizeof(msg), "worker %u is shutting down", wstate.id);
	} else {
		a = w_app_hello(id, id_len, delim, &m, page, twins, device, name, &status, msg,
				sizeof(msg));
	}
	ml = strlen(msg);
	memset(&r, 0, sizeof(r));
	/* FWD_HF_RING echoed: launches are taken from the ring */
	/* FWD_HF_VMM echoed: its memory is mapped from the mem socket */
	fwd_hdr_init(&r.h, FWD_T_HELLO_REPLY,
		     (a ? FWD_HF_RING : 0) | (a && a->vmm ? FWD_HF_VMM : 0), sizeof(r) + ml);
	r.status = status;
	r.worker_id = wstate.id;
	r.quota_pct = wstate.quota;
	r.pid = wstate.pid;
	r.msg_len = (uint16_t)ml;
	memcpy(out, &r, sizeof(r));
	memcpy(out + sizeof(r), msg, ml);
	w_send(NULL, id, id_len, delim, out, sizeof(r) + ml);
}

static void handle_binary(const unsigned char *id, size_t id_len, int delim, size_t n)
{
	struct fwd_hdr h = { 0 };
	struct wapp *a;
	const char *why;

	why = fwd_check_hdr(buf, n, &h);
	if (why) {
		/* h is zero unless the frame held a whole header */
		reject(id, id_len, delim,
		       h.magic == FWD_MAGIC && h.version != FWD_VERSION ? FWD_E_VERSION
									 : FWD_E_MALFORMED,
		       0, n, "%s", why);
		return;
	}
	why = fwd_check_body(buf, n, h.type);
	if (why) {
		reject(id, id_len, delim, FWD_E_MALFORMED, 0, n, "type %u: %s", h.type, why);
		return;
	}
	if (h.type == FWD_T_HELLO) {
		handle_hello(id, id_len, delim, n);
		return;
	}
	if (h.type != FWD_T_BYE) {
		/* MODULE, DEFINE and LAUNCH travel only in the app's ring */
		reject(id, id_len, delim, FWD_E_TYPE, 0, n, "type %u is not taken on a worker's socket",
		       h.type);
		return;
	}
	if (wstate.closing)
		return;            /* every app is closing already */
	a = w_app_find(id, id_len);
	if (!a) {
		/* e.g. the app talked to the worker that had this socket before */
		reject(id, id_len, delim, FWD_E_UNKNOWN_APP, 0, n, "BYE before HELLO");
		return;
	}
	w_app_close(a, 0);
}

/* One part of a message: its size (may exceed the buffer: truncated), and
 * whether more parts follow. */
static int recv_part(void *dst, size_t cap, int flags, int *more)
{
	size_t sz = sizeof(*more);
	int n;

	do
		n = zmq.recv(wstate.sock, dst, cap, flags);
	while (n < 0 && zmq.errno_() == EINTR);
	if (n < 0)
		return -1;
	*more = 0;
	if (zmq.getsockopt(wstate.sock, ZMQ_RCVMORE, more, &sz) < 0)
		*more = 0;
	return n;
}

void w_frames_drain(void)
{
	int budget;

	/* bounded: under a flood the poll loop still stamps heartbeats */
	for (budget = 4096; budget > 0; budget--) {
		size_t id_len;
		int n, more, delim = 0, extra = 0;

		n = recv_part(rid, sizeof(rid), ZMQ_DONTWAIT, &more);
		if (n < 0) {
			if (zmq.errno_() != EAGAIN)
				w_log("zmq_recv: %s", zmq.strerror(zmq.errno_()));
			return;
		}
		id_len = (size_t)n < sizeof(rid) ? (size_t)n : sizeof(rid);
		if (!more)
			continue;          /* a ROUTER always delivers a payload */
		n = recv_part(buf, sizeof(buf), 0, &more);
		if (n == 0 && more) {
			delim = 1;
			n = recv_part(buf, sizeof(buf), 0, &more);
		}
		while (n >= 0 && more) {
			extra++;
			if (recv_part(sink, sizeof(sink), 0, &more) < 0)
				break;
		}
		if (n < 0)
			continue;
		if (extra) {
			reject(rid, id_len, delim, FWD_E_MALFORMED, 0, (size_t)n,
			       "%d extra message parts", extra);
			continue;
		}
		if ((size_t)n > FWD_MAX_FRAME) {
			reject(rid, id_len, delim, FWD_E_MALFORMED, 0, (size_t)n,
			       "larger than %u bytes", FWD_MAX_FRAME);
			continue;
		}
		if (n == 0) {
			reject(rid, id_len, delim, FWD_E_MALFORMED, 0, 0, "empty frame");
			continue;
		}
		if (buf[0] == '{')
			handle_json(rid, id_len, delim, (size_t)n);
		else
			handle_binary(rid, id_len, delim, (size_t)n);
	}
}
