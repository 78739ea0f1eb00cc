/*
 * unixutil.c - see unixutil.h.
 */
#define _GNU_SOURCE
#include "unixutil.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int colocate_pid_alive(uint32_t pid)
{
	char path[64], buf[256], *p;
	ssize_t n;
	int fd;

	if (!pid || (kill((pid_t)pid, 0) < 0 && errno == ESRCH))
		return 0;
	snprintf(path, sizeof(path), "/proc/%u/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno != ENOENT;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 1;
	buf[n] = 0;
	/* a killed worker not yet reaped by its parent still answers kill(0) */
	p = strrchr(buf, ')');
	return !(p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X'));
}

int colocate_socket_listens(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, ok;

	if (strlen(path) >= sizeof(sa.sun_path))
		return 1;           /* cannot probe; let zmq try */
	memcpy(sa.sun_path, path, strlen(path) + 1);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return 1;
	ok = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 || errno != ECONNREFUSED;
	close(fd);
	return ok;
}

void colocate_vlog(const char *who, unsigned id, const char *fmt, va_list ap)
{
	char buf[1024];
	int n;

	n = snprintf(buf, sizeof(buf), "%s[%u]: ", who, id);
	if (n < 0 || n >= (int)sizeof(buf) - 1)
		return;
	vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
	n = (int)strlen(buf);
	buf[n++] = '\n';
	if (write(2, buf, (size_t)n) < 0)
		return;
}
