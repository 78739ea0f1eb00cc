/*
 * shmfile.h - a new shared-memory file, made whole before anyone sees it.
 *
 * The control block and the apps' ledgers are both files that other
 * processes map MAP_SHARED.  A new one is never made by truncating an old
 * one (a process still mapping it would SIGBUS on its next write): it is
 * built under a temporary name beside its path, filled, then renamed into
 * place, so a reader finds either the old inode or the whole new file.
 */
#ifndef COLOCATE_SHMFILE_H
#define COLOCATE_SHMFILE_H

#include <stddef.h>
#include <stdint.h>

/* A file of size bytes named "<path>.new.<pid>" (its name into tmp),
 * mapped read-write; NULL with errno set (nothing left behind). */
void *shm_create(const char *path, uint64_t size, char *tmp, size_t tmplen);
/* Rename tmp to path.  0; or -1 with errno set, the mapping unmapped and
 * tmp removed. */
int shm_publish(void *map, uint64_t size, const char *tmp, const char *path);

#endif
