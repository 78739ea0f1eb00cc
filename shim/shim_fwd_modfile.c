/*
 * shim_fwd_modfile.c - the module files: the fat binaries a worker loads
 * are files <runtime dir>/modules/<fwd_image_hash64>-<size>.fatbin (0600
 * in a 0700 folder), written once per process per module (temp file,
 * rename) and shared by the apps of one binary: an existing one of the
 * right size, ours and closed to others, is taken without reading it back
 * (the worker checks the hash); anything else at that path is replaced.
 *
 * Locking: none of its own; the caller (module_ready) holds fwd.mu, and
 * temporary names are unique per process and call, so apps writing the
 * same module at once each rename a whole file.
 */
#define _GNU_SOURCE
#include "shim_fwd.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* <runtime dir>/modules, made 0700 if missing; it must be ours and closed
 * to others (workers load what is in it). */
static int modules_dir(char *dir, size_t dirlen, char *why, size_t whylen)
{
	struct stat st;

	snprintf(dir, dirlen, "%s/modules", shim_runtime_dir());
	if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
		snprintf(why, whylen, "cannot create %s: %s", dir, strerror(errno));
		return -1;
	}
	if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid() ||
	    (st.st_mode & (S_IWGRP | S_IWOTH))) {
		snprintf(why, whylen, "%s is not a folder of ours closed to others", dir);
		return -1;
	}
	return 0;
}

/* An existing file at path that a worker will take, of size bytes. */
static int reusable(const char *path, uint64_t size)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK), ok;

	if (fd < 0)
		return 0;
	ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == getuid() &&
	     !(st.st_mode & (S_IWGRP | S_IWOTH)) && (uint64_t)st.st_size == size;
	close(fd);
	return ok;
}

static int write_all(int fd, const unsigned char *p, uint64_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n > (1u << 30) ? (1u << 30) : (size_t)n);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (uint64_t)w;
	}
	return 0;
}

int fconn_module_file(const void *image, uint64_t size, uint64_t *hash, char *path,
		      size_t pathlen, char *why, size_t whylen)
{
	static unsigned ntmp;
	char dir[PATH_MAX], tmp[PATH_MAX + 64];
	int fd;

	if (modules_dir(dir, sizeof(dir), why, whylen) < 0)
		return -1;
	*hash = fwd_image_hash64(image, size);
	if ((size_t)snprintf(path, pathlen, "%s/%016llx-%llu.fatbin", dir,
			     (unsigned long long)*hash, (unsigned long long)size) >= pathlen ||
	    strlen(path) > FWD_MAX_STR) {
		snprintf(why, whylen, "runtime dir path too long");
		return -1;
	}
	/* apps of the same binary share it; the worker checks its content */
	if (reusable(path, size))
		return 0;
	snprintf(tmp, sizeof(tmp), "%s/.%016llx.%d.%u.tmp", dir, (unsigned long long)*hash,
		 (int)getpid(), __atomic_add_fetch(&ntmp, 1, __ATOMIC_RELAXED));
	fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0) {
		snprintf(why, whylen, "cannot create %s: %s", tmp, strerror(errno));
		return -1;
	}
	if (write_all(fd, image, size) < 0 || fchmod(fd, 0600) < 0) {
		snprintf(why, whylen, "cannot write %s: %s", tmp, strerror(errno));
		close(fd);
		unlink(tmp);
		return -1;
	}
	close(fd);
	/* a reader sees the old file or the whole new one, never a part */
	if (rename(tmp, path) < 0) {
		snprintf(why, whylen, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
		unlink(tmp);
		return -1;
	}
	return 0;
}
