/*
 * fdpass.h - one fixed-size message over a SOCK_SEQPACKET socket, with an
 * fd riding along as SCM_RIGHTS: how vmm_probe hands its VMM allocation to
 * its child, as the shim will hand app memory to pool workers (passing, not
 * inheritance: the fd can come from any process at any time).
 */
#ifndef BENCH_GPU_FDPASS_H
#define BENCH_GPU_FDPASS_H

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

/* Send len bytes as one message, with fd attached when fd >= 0; 0 or -1 (errno). */
static inline int send_msg(int sock, const void *buf, size_t len, int fd)
{
	struct msghdr m;
	struct iovec iov;
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct cmsghdr *c;

	memset(&m, 0, sizeof(m));
	memset(&u, 0, sizeof(u));
	iov.iov_base = (void *)buf;
	iov.iov_len = len;
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	if (fd >= 0) {
		m.msg_control = u.b;
		m.msg_controllen = sizeof(u.b);
		c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(fd));
	}
	return sendmsg(sock, &m, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

/* One message of exactly len bytes within timeout_ms, and the fd it
 * carries (-1 if none).  0; -1 error (errno); -2 timeout; -3 peer closed
 * or a message of the wrong size. */
static inline int recv_msg(int sock, void *buf, size_t len, int *fd, int timeout_ms)
{
	struct pollfd p = { sock, POLLIN, 0 };
	struct msghdr m;
	struct iovec iov;
	union {
		char b[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct cmsghdr *c;
	ssize_t r;
	int pr;

	if (fd)
		*fd = -1;
	do
		pr = poll(&p, 1, timeout_ms);
	while (pr < 0 && errno == EINTR);
	if (pr < 0)
		return -1;
	if (pr == 0)
		return -2;
	memset(&m, 0, sizeof(m));
	iov.iov_base = buf;
	iov.iov_len = len;
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	m.msg_control = u.b;
	m.msg_controllen = sizeof(u.b);
	do
		r = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
	while (r < 0 && errno == EINTR);
	if (r < 0)
		return -1;
	for (c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && fd)
			memcpy(fd, CMSG_DATA(c), sizeof(int));
	if (r != (ssize_t)len || (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
		return -3;
	return 0;
}

static inline const char *recv_why(int r)
{
	return r == -2 ? "timed out" : r == -3 ? "peer closed or sent a short message"
					     : strerror(errno);
}

#endif
