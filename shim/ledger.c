/*
 * ledger.c - create and map an application's ledger (ledger.h).
 * Compiled twice from this one file, like ctlblock.c: into libcolocate.so
 * (the application maps its ledger) and into the cffi module shim._proto
 * (the controller creates and reads them).
 */
#define _GNU_SOURCE
#include "ledger.h"
#include "shmfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096ull

static uint64_t round_page(uint64_t n)
{
	return (n + PAGE - 1) & ~(PAGE - 1);
}

static uint64_t kernels_off(void)
{
	return round_page(sizeof(struct lg_header));
}

static uint64_t names_off(void)
{
	return round_page(kernels_off() + (uint64_t)LG_MAX_KERNELS * sizeof(struct lg_kernel));
}

uint64_t lg_size(void)
{
	return names_off() + LG_NAMES_BYTES;
}

static int header_ok(const struct lg_header *h, uint32_t pid)
{
	return __atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) == LG_MAGIC &&
	       h->version == LG_VERSION && h->header_size == sizeof(struct lg_header) &&
	       h->kernel_size == sizeof(struct lg_kernel) && h->max_kernels == LG_MAX_KERNELS &&
	       h->names_cap == LG_NAMES_BYTES && h->kernels_off == kernels_off() &&
	       h->names_off == names_off() && h->pid == pid;
}

/*
 * Made under a temporary name and renamed into place (shmfile.h), so an
 * application never maps a half-made header, and a stale file of an earlier
 * app with the same slot and pid (pid reuse) is replaced without touching
 * the old inode a late reader may still have mapped.
 */
static struct lg_header *create(const char *path, uint32_t pid, uint32_t slot)
{
	char tmp[4096];
	struct lg_header *lg = shm_create(path, lg_size(), tmp, sizeof(tmp));
	struct timespec ts;

	if (!lg)
		return NULL;
	clock_gettime(CLOCK_REALTIME, &ts);
	lg->version = LG_VERSION;
	lg->header_size = sizeof(struct lg_header);
	lg->kernel_size = sizeof(struct lg_kernel);
	lg->max_kernels = LG_MAX_KERNELS;
	lg->names_cap = LG_NAMES_BYTES;
	lg->pid = pid;
	lg->slot = slot;
	lg->kernels_off = kernels_off();
	lg->names_off = names_off();
	lg->created_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	/* magic last: a reader that sees it sees a complete header */
	__atomic_store_n(&lg->magic, LG_MAGIC, __ATOMIC_RELEASE);
	return shm_publish(lg, lg_size(), tmp, path) == 0 ? lg : NULL;
}

struct lg_header *lg_open(const char *path, int create_it, uint32_t pid, uint32_t slot)
{
	struct lg_header *lg;
	struct stat st;
	int fd;

	if (create_it)
		return create(path, pid, slot);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	/* a short file would SIGBUS the first write past its end */
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < lg_size()) {
		close(fd);
		errno = EPROTO;
		return NULL;
	}
	lg = mmap(NULL, lg_size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (lg == MAP_FAILED)
		return NULL;
	if (!header_ok(lg, pid)) {
		munmap(lg, lg_size());
		errno = EPROTO;
		return NULL;
	}
	return lg;
}

void lg_close(struct lg_header *lg)
{
	if (lg)
		munmap(lg, lg_size());
}

/*
 * The offsets come from this file's constants, never from the header in
 * shared memory: the app could rewrite that, and the controller would then
 * read outside the mapping.
 */
struct lg_kernel *lg_kernel_at(struct lg_header *lg, uint32_t i)
{
	if (i >= LG_MAX_KERNELS)
		return NULL;
	return (struct lg_kernel *)((char *)lg + kernels_off()) + i;
}

const char *lg_name_at(struct lg_header *lg, uint32_t off, uint32_t len)
{
	/* the app writes names; the reader trusts nothing it did not check */
	if ((uint64_t)off + len >= LG_NAMES_BYTES)
		return NULL;
	return (const char *)lg + names_off() + off;
}
