/*
 * shim_ctl.c - the control path: ZeroMQ messages between this process and
 * the controller (`colocate serve`), protocol v1 (controlplane/protocol.py).
 *
 * libzmq is dlopen'ed (zmqdl.c), preferably the copy bundled in pyzmq's wheel
 * ($COLOCATE_LIBZMQ, set by `colocate run`), so no system package is needed
 * and nothing breaks when it is absent: the app then runs natively.
 *
 * The socket is a DEALER sending [empty, json] to the controller's ROUTER,
 * which is what a REQ socket would send, without REQ's lock-step state
 * machine (a timed-out REQ is unusable).  Only registration waits for a
 * reply, bounded by COLOCATE_CONNECT_TIMEOUT_MS (default 1000).  After it,
 * other files send one-way messages (query boundaries) with shim_ctl_send,
 * on this same socket: one ZeroMQ I/O thread per app, and every message
 * reaches the controller before the exit message.
 */
#define _GNU_SOURCE
#include "shim.h"
#include "unixutil.h"
#include "zmqdl.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static void *zctx, *zsock;
static int slot_index = -1;
/* zsock after registration: shim_ctl_send (any thread) and the exit message */
static pthread_mutex_t sock_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t dropped;
static char rundir[PATH_MAX];
static uint32_t ctl_pid;        /* the controller's, from its reply */

const char *shim_runtime_dir(void)
{
	const char *d;

	if (rundir[0])
		return rundir;
	if ((d = getenv("COLOCATE_RUNTIME_DIR")) && *d)
		snprintf(rundir, sizeof(rundir), "%s", d);
	else if ((d = getenv("XDG_RUNTIME_DIR")) && *d)
		snprintf(rundir, sizeof(rundir), "%s/colocate", d);
	else
		snprintf(rundir, sizeof(rundir), "/tmp/colocate-%u", (unsigned)getuid());
	return rundir;
}

/* Append s to out as a JSON string literal. */
static void json_str(char *out, size_t outlen, const char *s)
{
	size_t n = strlen(out);

	if (n + 2 >= outlen)
		return;
	out[n++] = '"';
	for (; *s && n + 8 < outlen; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\') {
			out[n++] = '\\';
			out[n++] = (char)c;
		} else if (c < 0x20) {
			n += (size_t)snprintf(out + n, outlen - n, "\\u%04x", c);
		} else {
			out[n++] = (char)c;
		}
	}
	out[n++] = '"';
	out[n] = 0;
}

static void json_raw(char *out, size_t outlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void json_raw(char *out, size_t outlen, const char *fmt, ...)
{
	size_t n = strlen(out);
	va_list ap;

	if (n >= outlen)
		return;
	va_start(ap, fmt);
	vsnprintf(out + n, outlen - n, fmt, ap);
	va_end(ap);
}

/* The value of "key" in a flat JSON reply, or NULL when absent. */
static const char *json_value(const char *msg, const char *key)
{
	char pat[64];
	const char *p;

	snprintf(pat, sizeof(pat), "\"%s\"", key);
	p = strstr(msg, pat);
	if (!p)
		return NULL;
	p += strlen(pat);
	while (*p == ' ' || *p == ':')
		p++;
	return p;
}

/* "key": integer in a flat JSON reply: 0 and *val, or -1. */
static int json_int(const char *msg, const char *key, long *val)
{
	const char *p = json_value(msg, key);
	char *end;

	if (!p)
		return -1;
	*val = strtol(p, &end, 10);
	return end == p ? -1 : 0;
}

/* "key": true|false in a flat JSON reply: 1, 0, or -1 when absent. */
static int json_bool(const char *msg, const char *key)
{
	const char *p = json_value(msg, key);

	if (!p)
		return -1;
	return strncmp(p, "true", 4) == 0 ? 1 : strncmp(p, "false", 5) == 0 ? 0 : -1;
}

static int send_msg(const char *json)
{
	if (zmq.send(zsock, "", 0, ZMQ_SNDMORE) < 0)
		return -1;
	return zmq.send(zsock, json, strlen(json), 0) < 0 ? -1 : 0;
}

static void close_socket(void)
{
	if (zsock)
		zmq.close(zsock);
	if (zctx)
		zmq.ctx_term(zctx);
	zsock = zctx = NULL;
}

static const char *env_or(const char *name, const char *dflt)
{
	const char *v = getenv(name);

	return v && *v ? v : dflt;
}

int shim_ctl_register(struct shim_settings *set, char *why, size_t whylen)
{
	char endpoint[PATH_MAX + 16], sock_path[PATH_MAX], exe[PATH_MAX] = "";
	char msg[8192] = "", reply[4096];
	const char *name, *cls, *qos, *quota;
	int timeout_ms = atoi(env_or("COLOCATE_CONNECT_TIMEOUT_MS", "1000"));
	int linger = 200, n;
	long slot;
	struct stat st;
	ssize_t len;

	snprintf(sock_path, sizeof(sock_path), "%s/ctl.sock", shim_runtime_dir());
	if (stat(sock_path, &st) < 0) {
		/* the usual case without a controller: say so without waiting */
		snprintf(why, whylen, "no controller (%s missing)", sock_path);
		return -1;
	}
	if (!colocate_socket_listens(sock_path)) {
		/* a crashed controller leaves its socket file: do not wait for
		 * an answer that cannot come */
		snprintf(why, whylen, "no controller (stale %s)", sock_path);
		return -1;
	}
	if (timeout_ms < 50 || timeout_ms > 60000)
		timeout_ms = 1000;
	if (zmqdl_load(shim_dlsym, why, whylen) < 0)
		return -1;
	zctx = zmq.ctx_new();
	zsock = zctx ? zmq.socket(zctx, ZMQ_DEALER) : NULL;
	if (!zsock) {
		snprintf(why, whylen, "zmq socket: %s", zmq.strerror(zmq.errno_()));
		close_socket();
		return -1;
	}
	zmq.setsockopt(zsock, ZMQ_LINGER, &linger, sizeof(linger));
	zmq.setsockopt(zsock, ZMQ_RCVTIMEO, &timeout_ms, sizeof(timeout_ms));
	zmq.setsockopt(zsock, ZMQ_SNDTIMEO, &timeout_ms, sizeof(timeout_ms));
	snprintf(endpoint, sizeof(endpoint), "ipc://%s", sock_path);
	if (zmq.connect(zsock, endpoint) < 0) {
		snprintf(why, whylen, "zmq connect %s: %s", endpoint, zmq.strerror(zmq.errno_()));
		close_socket();
		return -1;
	}

	len = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	exe[len > 0 ? len : 0] = 0;
	name = getenv("COLOCATE_APP_NAME");
	if (!name || !*name)
		name = strrchr(exe, '/') ? strrchr(exe, '/') + 1 : "app";
	cls = env_or("COLOCATE_APP_CLASS", "batch");
	qos = getenv("COLOCATE_QOS_MS");
	quota = getenv("COLOCATE_QUOTA_PCT");

	json_raw(msg, sizeof(msg), "{\"v\":1,\"type\":\"register\",\"pid\":%d,\"name\":", (int)getpid());
	json_str(msg, sizeof(msg), name);
	json_raw(msg, sizeof(msg), ",\"class\":");
	json_str(msg, sizeof(msg), cls);
	if (qos && *qos && isfinite(atof(qos)))   /* JSON has no inf/nan */
		json_raw(msg, sizeof(msg), ",\"qos_ms\":%g", atof(qos));
	else
		json_raw(msg, sizeof(msg), ",\"qos_ms\":null");
	if (quota && *quota)
		json_raw(msg, sizeof(msg), ",\"quota_pct\":%d", atoi(quota));
	else
		json_raw(msg, sizeof(msg), ",\"quota_pct\":null");
	json_raw(msg, sizeof(msg), ",\"device\":");
	json_str(msg, sizeof(msg), env_or("COLOCATE_DEVICE", "unknown"));
	json_raw(msg, sizeof(msg), ",\"exe\":");
	json_str(msg, sizeof(msg), exe);
	json_raw(msg, sizeof(msg), "}");

	if (send_msg(msg) < 0) {
		snprintf(why, whylen, "controller at %s unreachable (send: %s)", sock_path,
			 zmq.strerror(zmq.errno_()));
		close_socket();
		return -1;
	}
	/* [empty delimiter][json] */
	for (;;) {
		n = zmq.recv(zsock, reply, sizeof(reply) - 1, 0);
		if (n < 0) {
			snprintf(why, whylen, "controller at %s did not answer in %d ms", sock_path,
				 timeout_ms);
			close_socket();
			return -1;
		}
		if (n > 0)
			break;
	}
	reply[n < (int)sizeof(reply) ? n : (int)sizeof(reply) - 1] = 0;
	if (!strstr(reply, "\"registered\"") || json_int(reply, "slot", &slot) < 0 ||
	    slot < 0 || slot >= (long)CB_MAX_SLOTS) {
		snprintf(why, whylen, "controller refused registration: %.200s", reply);
		close_socket();
		return -1;
	}
	slot_index = (int)slot;
	if (json_int(reply, "controller_pid", &slot) == 0 && slot > 0 && slot <= INT32_MAX)
		ctl_pid = (uint32_t)slot;
	/* "feed": true - the policy wants this app's completed tasks (a
	 * controller that predates it says nothing: no feed) */
	set->feed = json_bool(reply, "feed") == 1;
	/* "partitions": true - route kind partition (shim_part.c) */
	set->partitions = json_bool(reply, "partitions") == 1;
	/* "fwd_window": N - at most N routed launches in flight (default 4096) */
	set->fwd_window = 0;
	if (json_int(reply, "fwd_window", &slot) == 0 && slot >= 1 && slot <= 4096)
		set->fwd_window = (uint32_t)slot;
	return slot_index;
}

int shim_ctl_slot(void)
{
	return __atomic_load_n(&slot_index, __ATOMIC_RELAXED);
}

int shim_ctl_alive(void)
{
	char sock_path[PATH_MAX + 16];

	if (ctl_pid)
		return colocate_pid_alive(ctl_pid);
	snprintf(sock_path, sizeof(sock_path), "%s/ctl.sock", shim_runtime_dir());
	return colocate_socket_listens(sock_path);
}

struct kjson {
	char *buf;
	size_t len;
	int count;
	int (*has_twin)(const char *);
	int private_only;       /* only kernels that count outside the ledger */
};

static void kernel_json(const struct shim_kernel *k, void *arg)
{
	struct kjson *j = arg;
	int twin;

	if (j->private_only && __atomic_load_n(&k->count, __ATOMIC_RELAXED) != &k->launches)
		return;
	twin = j->has_twin ? j->has_twin(k->name) : -1;

	if (strlen(j->buf) + strlen(k->name) + 128 >= j->len)
		return;   /* bounded message: the controller drops nothing else */
	json_raw(j->buf, j->len, "%s{\"name\":", j->count++ ? "," : "");
	json_str(j->buf, j->len, k->name);
	json_raw(j->buf, j->len, ",\"launches\":%llu,\"twin\":%s}",
		 (unsigned long long)shim_kernel_launches(k),
		 twin < 0 ? "null" : twin ? "true" : "false");
}

/* pthread_mutex_lock, giving up after ms milliseconds; 1 when locked. */
static int lock_bounded(pthread_mutex_t *m, int ms)
{
	struct timespec ts = { 0, 1000000 };   /* 1 ms */
	int i;

	for (i = 0; i <= ms; i++) {
		if (pthread_mutex_trylock(m) == 0)
			return 1;
		nanosleep(&ts, NULL);
	}
	return 0;
}

/*
 * A message that wants no answer, after registration: sent without
 * blocking (dropped, and counted, when the controller does not keep up);
 * the controller's replies to such messages are read and discarded here.
 * 0 sent, -1 not (not registered, closed, or full).
 */
int shim_ctl_send(const char *json)
{
	char sink[256];
	int r = -1;

	pthread_mutex_lock(&sock_mu);
	if (zsock && slot_index >= 0) {
		while (zmq.recv(zsock, sink, sizeof(sink), ZMQ_DONTWAIT) >= 0)
			;
		/* once the first frame is in, libzmq takes the rest of the
		 * message: send it without DONTWAIT, or a half message would
		 * glue itself onto the next one */
		if (zmq.send(zsock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0 &&
		    zmq.send(zsock, json, strlen(json), 0) >= 0)
			r = 0;
		else {
			/* the counts this message carried are in the ledger */
			shim_ledger_msg_dropped();
			if (!dropped++)
				shim_log("the controller does not keep up; messages dropped "
					 "(counts are kept in the ledger)");
		}
	}
	pthread_mutex_unlock(&sock_mu);
	return r;
}

/*
 * The exit message is a nudge: the ledger already says the app exited and
 * holds its kernel table, so the message carries the table only when there
 * is no ledger (with one: only kernels it had no room for, normally none).  It is sent without blocking and the socket lingers at most
 * EXIT_LINGER_MS for it: a stalled controller never holds up an exit.
 */
#define EXIT_LINGER_MS 20

void shim_ctl_exit(void)
{
	static char msg[60000];
	struct kjson j = { msg, sizeof(msg) - 8, 0, NULL, 0 };
	int linger = EXIT_LINGER_MS;

	/* exit() may run on a thread interrupted (by a signal handler that
	 * calls exit) while it held sock_mu in shim_ctl_send: never wait for
	 * ever; after 200 ms go without the exit message (the ledger, or the
	 * controller's liveness check, tells it) */
	if (!lock_bounded(&sock_mu, 200)) {
		shim_log("exit message not sent: the controller connection is busy");
		return;
	}
	if (!zsock || slot_index < 0) {
		pthread_mutex_unlock(&sock_mu);
		return;
	}
	/* with a ledger, only the kernels it had no room for (normally none) */
	j.private_only = shim_ledger_on();
	*(void **)&j.has_twin = shim_dlsym(RTLD_DEFAULT, "simgpu_kernel_has_twin");
	msg[0] = 0;
	json_raw(msg, sizeof(msg), "{\"v\":1,\"type\":\"exit\",\"pid\":%d,\"slot\":%d,\"kernels\":[",
		 (int)getpid(), slot_index);
	shim_kernel_each(kernel_json, &j);
	json_raw(msg, sizeof(msg), "]}");
	if (zmq.send(zsock, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0)
		zmq.send(zsock, msg, strlen(msg), 0);
	zmq.setsockopt(zsock, ZMQ_LINGER, &linger, sizeof(linger));
	close_socket();
	slot_index = -1;
	pthread_mutex_unlock(&sock_mu);
}

void shim_ctl_forget(void)
{
	/* a forked child must not touch the parent's libzmq threads */
	zsock = zctx = NULL;
	slot_index = -1;
	ctl_pid = 0;
	pthread_mutex_init(&sock_mu, NULL);
}
