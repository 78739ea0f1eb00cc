/*
 * zmqdl.c - load libzmq with dlopen and fill the function table (zmqdl.h).
 */
#define _GNU_SOURCE
#include "zmqdl.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

struct zmqdl zmq;

int zmqdl_load(void *(*sym)(void *, const char *), char *why, size_t whylen)
{
	const char *path = getenv("COLOCATE_LIBZMQ");
	struct zmqdl t;
	void *h = NULL;

	if (__atomic_load_n(&zmq.ctx_new, __ATOMIC_ACQUIRE))
		return 0;
	if (path && *path)
		h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h)
		h = dlopen("libzmq.so.5", RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(why, whylen, "cannot load libzmq (%s)", dlerror());
		return -1;
	}
#define Z(field, name) \
	if (!(*(void **)&t.field = sym(h, name))) { \
		snprintf(why, whylen, "libzmq lacks %s", name); \
		return -1; \
	}
	Z(ctx_new, "zmq_ctx_new");
	Z(ctx_term, "zmq_ctx_term");
	Z(socket, "zmq_socket");
	Z(close, "zmq_close");
	Z(setsockopt, "zmq_setsockopt");
	Z(getsockopt, "zmq_getsockopt");
	Z(bind, "zmq_bind");
	Z(connect, "zmq_connect");
	Z(send, "zmq_send");
	Z(recv, "zmq_recv");
	Z(poll, "zmq_poll");
	Z(errno_, "zmq_errno");
	Z(strerror, "zmq_strerror");
#undef Z
	/* publish the table with ctx_new last: readers test ctx_new */
	{
		void *(*ctx_new)(void) = t.ctx_new;

		t.ctx_new = NULL;
		zmq = t;
		__atomic_store_n(&zmq.ctx_new, ctx_new, __ATOMIC_RELEASE);
	}
	return 0;
}
