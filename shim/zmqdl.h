/*
 * zmqdl.h - libzmq, dlopen'ed at run time.
 *
 * Compiled into libcolocate.so (the control path and the forwarding client)
 * and into colocate-worker.  Nothing links against libzmq: the preferred
 * copy is the one bundled in pyzmq's wheel ($COLOCATE_LIBZMQ, set by
 * `colocate run` and by the process pool), else the system's libzmq.so.5.
 * When neither loads, callers carry on without ZeroMQ (the app runs
 * natively; the worker exits with a message).
 *
 * Only the stable C ABI of libzmq >= 4 is used; the constants below have
 * not changed since libzmq 3.
 */
#ifndef COLOCATE_ZMQDL_H
#define COLOCATE_ZMQDL_H

#include <stddef.h>

#define ZMQ_ROUTER   6
#define ZMQ_DEALER   5
#define ZMQ_DONTWAIT 1
#define ZMQ_SNDMORE  2
#define ZMQ_SNDHWM   23
#define ZMQ_RCVHWM   24
#define ZMQ_LINGER   17
#define ZMQ_RCVMORE  13
#define ZMQ_RCVTIMEO 27
#define ZMQ_SNDTIMEO 28
#define ZMQ_POLLIN   1
#define ZMQ_POLLOUT  2

/* zmq_pollitem_t on POSIX */
struct zmqdl_pollitem {
	void *socket;
	int fd;
	short events;
	short revents;
};

struct zmqdl {
	void *(*ctx_new)(void);
	int (*ctx_term)(void *);
	void *(*socket)(void *, int);
	int (*close)(void *);
	int (*setsockopt)(void *, int, const void *, size_t);
	int (*getsockopt)(void *, int, void *, size_t *);
	int (*bind)(void *, const char *);
	int (*connect)(void *, const char *);
	int (*send)(void *, const void *, size_t, int);
	int (*recv)(void *, void *, size_t, int);
	int (*poll)(struct zmqdl_pollitem *, int, long);
	int (*errno_)(void);
	const char *(*strerror)(int);
};

/* Filled by zmqdl_load(); all NULL before. */
extern struct zmqdl zmq;

/*
 * Load libzmq once ($COLOCATE_LIBZMQ, else libzmq.so.5).  sym is the dlsym
 * to use (the shim overrides dlsym and passes glibc's).  Returns 0, or -1
 * with a reason in why.  Safe to call again after success; callers
 * serialise the first call.
 */
int zmqdl_load(void *(*sym)(void *, const char *), char *why, size_t whylen);

#endif
