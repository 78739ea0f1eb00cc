/*
 * handoff_msg.c - one fixed-size message, maybe with one fd, over the
 * exporter's SOCK_SEQPACKET socket.  SEQPACKET keeps message boundaries
 * (a short or long message is seen as such, never glued to the next) and,
 * unlike a datagram socket, tells each side when the other goes away:
 * that EOF is how references of a dead importer are dropped.
 */
#define _GNU_SOURCE
#include "handoff_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

void hf_msg_init(struct hf_msg *m, int op)
{
	memset(m, 0, sizeof(*m));
	m->magic = HF_MSG_MAGIC;
	m->version = HF_MSG_VERSION;
	m->op = (uint16_t)op;
}

int hf_sendv(int fd, const struct hf_msg *m, const int *fds, int nfds)
{
	char cbuf[CMSG_SPACE(sizeof(int) * 2)];
	struct iovec iov = { (void *)m, sizeof(*m) };
	struct msghdr mh = { 0 };
	ssize_t n;

	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	if (nfds > 0) {
		struct cmsghdr *c;

		if (nfds > 2) {
			errno = EINVAL;
			return -1;
		}
		memset(cbuf, 0, sizeof(cbuf));
		mh.msg_control = cbuf;
		mh.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
		memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)nfds);
	}
	do
		n = sendmsg(fd, &mh, MSG_NOSIGNAL);  /* a dead peer is EPIPE, not SIGPIPE */
	while (n < 0 && errno == EINTR);
	if (n == (ssize_t)sizeof(*m))
		return 0;
	if (n >= 0)
		errno = EPROTO;
	return -1;
}

int hf_send(int fd, const struct hf_msg *m, int pass_fd)
{
	return hf_sendv(fd, m, &pass_fd, pass_fd >= 0 ? 1 : 0);
}

ssize_t hf_recvv(int fd, struct hf_msg *m, int *got_fds, int maxfds)
{
	char cbuf[CMSG_SPACE(sizeof(int) * 4)];
	struct iovec iov = { m, sizeof(*m) };
	struct msghdr mh = { 0 };
	struct cmsghdr *c;
	ssize_t n;
	int k0, got = 0;

	for (k0 = 0; k0 < maxfds; k0++)
		got_fds[k0] = -1;
	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	mh.msg_control = cbuf;
	mh.msg_controllen = sizeof(cbuf);
	do
		n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
	while (n < 0 && errno == EINTR);
	if (n < 0)
		return -1;
	/* take what fds came; keep those wanted, close the rest (a peer
	 * must not be able to leak descriptors into us) */
	for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		size_t k, nfd;

		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (k = 0; k < nfd; k++) {
			int f;

			memcpy(&f, CMSG_DATA(c) + k * sizeof(int), sizeof(int));
			if (got < maxfds)
				got_fds[got++] = f;
			else
				close(f);
		}
	}
	if (mh.msg_flags & MSG_TRUNC)
		return (ssize_t)sizeof(*m) + 1;     /* longer than a message: caller rejects */
	return n;
}

ssize_t hf_recv(int fd, struct hf_msg *m, int *got_fd)
{
	int dummy;

	return hf_recvv(fd, m, got_fd ? got_fd : &dummy, got_fd ? 1 : 0);
}

int hf_post(int fd, const struct hf_msg *q)
{
	if (hf_send(fd, q, -1) == 0)
		return COLOCATE_HANDOFF_OK;
	if (errno == EAGAIN || errno == EWOULDBLOCK)
		return hf_err(COLOCATE_HANDOFF_E_TIMEOUT, "exporter did not take a message in %d ms",
			      HF_TIMEOUT_MS);
	return hf_err(COLOCATE_HANDOFF_E_GONE, "exporter gone (send: %s)", strerror(errno));
}

int hf_recv_failed(ssize_t n)
{
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return hf_err(COLOCATE_HANDOFF_E_TIMEOUT, "exporter did not answer in %d ms",
			      HF_TIMEOUT_MS);
	return hf_err(COLOCATE_HANDOFF_E_GONE, "exporter gone (%s)",
		      n == 0 ? "connection closed" : strerror(errno));
}

int hf_call(int fd, const struct hf_msg *q, struct hf_msg *r, int *got_fd)
{
	ssize_t n;

	if (got_fd)
		*got_fd = -1;
	if (hf_send(fd, q, -1) < 0) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return hf_err(COLOCATE_HANDOFF_E_TIMEOUT, "exporter did not take a request in %d ms",
				      HF_TIMEOUT_MS);
		return hf_err(COLOCATE_HANDOFF_E_GONE, "exporter gone (send: %s)", strerror(errno));
	}
	n = hf_recv(fd, r, got_fd);
	if (n <= 0)
		return hf_recv_failed(n);
	if (n != (ssize_t)sizeof(*r) || r->magic != HF_MSG_MAGIC || r->version != HF_MSG_VERSION ||
	    r->op != HF_REPLY) {
		if (got_fd && *got_fd >= 0) {
			close(*got_fd);
			*got_fd = -1;
		}
		return hf_err(COLOCATE_HANDOFF_E_PROTO, "exporter's reply is not a hand-off reply "
			      "(%zd bytes)", n);
	}
	r->text[sizeof(r->text) - 1] = 0;
	return COLOCATE_HANDOFF_OK;
}

int hf_connect(const char *path, uint32_t pid)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { HF_TIMEOUT_MS / 1000, (HF_TIMEOUT_MS % 1000) * 1000 };
	int fd, e;

	if (strlen(path) >= sizeof(sa.sun_path))
		return hf_err(COLOCATE_HANDOFF_E_FORGED, "handle: socket path too long");
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return hf_err(COLOCATE_HANDOFF_E_SYS, "socket: %s", strerror(errno));
	/* a hung exporter must not hang the importer */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
		return fd;
	e = errno;
	close(fd);
	if (e == EACCES || e == EPERM)
		return hf_err(COLOCATE_HANDOFF_E_PERM, "exporter socket %s: %s", path, strerror(e));
	if (e == ENOENT || e == ECONNREFUSED)
		return hf_err(COLOCATE_HANDOFF_E_GONE, "exporter (pid %u) gone: nobody listens on %s",
			      pid, path);
	if (e == EPROTOTYPE)
		return hf_err(COLOCATE_HANDOFF_E_FORGED, "handle: %s is not an exporter socket", path);
	return hf_err(COLOCATE_HANDOFF_E_SYS, "connect %s: %s", path, strerror(e));
}
