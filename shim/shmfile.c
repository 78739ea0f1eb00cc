/*
 * shmfile.c - create and publish a shared-memory file (shmfile.h).
 * Compiled into libcolocate.so and into the cffi module shim._proto,
 * like ctlblock.c and ledger.c, its two users.
 */
#define _GNU_SOURCE
#include "shmfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

void *shm_create(const char *path, uint64_t size, char *tmp, size_t tmplen)
{
	void *map;
	int fd, saved;

	if (snprintf(tmp, tmplen, "%s.new.%d", path, (int)getpid()) >= (int)tmplen) {
		errno = ENAMETOOLONG;
		return NULL;
	}
	fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return NULL;
	if (ftruncate(fd, (off_t)size) < 0)
		goto fail;
	map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		goto fail;
	close(fd);
	return map;
fail:
	saved = errno;
	close(fd);
	unlink(tmp);
	errno = saved;
	return NULL;
}

int shm_publish(void *map, uint64_t size, const char *tmp, const char *path)
{
	int saved;

	if (rename(tmp, path) == 0)
		return 0;
	saved = errno;
	munmap(map, size);
	unlink(tmp);
	errno = saved;
	return -1;
}
