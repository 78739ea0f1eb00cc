/*
 * ctlblock.c - create, map and edit the shared control block (ctlblock.h).
 * Compiled twice from this one file: into libcolocate.so (application side)
 * and into the cffi module shim._proto (controller side).
 */
#define _GNU_SOURCE
#include "ctlblock.h"
#include "shmfile.h"

#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

uint64_t cb_size(void)
{
	return sizeof(struct cb_block);
}

/* ns on the clock `id`, 0 if it cannot be read */
static uint64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	if (clock_gettime(id, &ts) != 0)
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int header_ok(const struct cb_header *h)
{
	return h->magic == CB_MAGIC && h->version == CB_VERSION &&
	       h->nslots == CB_MAX_SLOTS &&
	       h->slot_size == sizeof(struct cb_slot);
}

/*
 * A new controller never reuses the old file: applications of a previous
 * controller may still have it mapped (shmfile.h).
 */
static struct cb_block *create_block(const char *path)
{
	char tmp[4096];
	struct cb_block *cb = shm_create(path, cb_size(), tmp, sizeof(tmp));

	if (!cb)
		return NULL;
	cb->hdr.version = CB_VERSION;
	cb->hdr.nslots = CB_MAX_SLOTS;
	cb->hdr.slot_size = sizeof(struct cb_slot);
	cb->hdr.controller_pid = (uint32_t)getpid();
	cb->hdr.generation = clock_ns(CLOCK_REALTIME);
	cb->hdr.created_ns = cb->hdr.generation;
	/* magic last: a reader that sees it sees a complete header */
	__atomic_store_n(&cb->hdr.magic, CB_MAGIC, __ATOMIC_RELEASE);
	return shm_publish(cb, cb_size(), tmp, path) == 0 ? cb : NULL;
}

struct cb_block *cb_open(const char *path, int create)
{
	struct cb_block *cb;
	struct stat st;
	int fd, saved;

	if (create)
		return create_block(path);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) < 0)
		goto fail;
	if ((uint64_t)st.st_size != cb_size()) {
		errno = EPROTO;
		goto fail;
	}
	cb = mmap(NULL, cb_size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (cb == MAP_FAILED)
		goto fail;
	close(fd);
	if (!header_ok(&cb->hdr)) {
		munmap(cb, cb_size());
		errno = EPROTO;
		return NULL;
	}
	return cb;
fail:
	saved = errno;
	close(fd);
	errno = saved;
	return NULL;
}

void cb_close(struct cb_block *cb)
{
	if (cb)
		munmap(cb, cb_size());
}

int cb_claim_slot(struct cb_block *cb, uint32_t pid)
{
	uint32_t i, expected;

	for (i = 0; i < CB_MAX_SLOTS; i++) {
		struct cb_slot *s = &cb->slots[i];

		expected = CB_SLOT_FREE;
		if (!__atomic_compare_exchange_n(&s->k.state, &expected, CB_SLOT_LIVE,
						 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED))
			continue;
		memset(&s->c, 0, sizeof(s->c));
		s->k.pid = pid;
		s->k.route = CB_ROUTE_LOCAL;
		s->k.quota_pct = 100;
		s->k.route_epoch = 0;
		s->k.d2d_bytes = 0;
		s->k.held_ns = 0;
		s->k.registered_ns = clock_ns(CLOCK_REALTIME);
		__atomic_thread_fence(__ATOMIC_RELEASE);
		return (int)i;
	}
	return -1;
}

void cb_release_slot(struct cb_block *cb, uint32_t idx)
{
	if (idx >= CB_MAX_SLOTS)
		return;
	cb->slots[idx].k.pid = 0;
	__atomic_store_n(&cb->slots[idx].k.state, CB_SLOT_FREE, __ATOMIC_RELEASE);
}

uint64_t cb_set_route(struct cb_block *cb, uint32_t idx, uint32_t route,
		      uint32_t quota_pct)
{
	struct cb_control *k;

	if (idx >= CB_MAX_SLOTS)
		return 0;
	k = &cb->slots[idx].k;
	__atomic_store_n(&k->quota_pct, quota_pct, __ATOMIC_RELAXED);
	__atomic_store_n(&k->route, route, __ATOMIC_RELAXED);
	/* the epoch publishes the pair: readers load it with acquire */
	__atomic_fetch_add(&k->route_epoch, 1, __ATOMIC_RELEASE);
	/* when the app could first see it, read here rather than by a caller
	 * whose own return path (an interpreter woken on a cold CPU) may take
	 * microseconds: benchmarks time a route change from this */
	return clock_ns(CLOCK_MONOTONIC);
}

/*
 * A benchmark's route flipper (processpool/rig.py).  In C so that after a
 * write the flipper only goes back to sleep (one syscall): on two cores, an
 * interpreter doing so after its write delayed the app's next launch by
 * 10-20 us, which the switch figure then counted.
 */
int cb_flip_routes(struct cb_block *cb, uint32_t idx, const uint32_t *routes,
		   uint32_t nroutes, uint32_t quota_pct, uint64_t period_ns,
		   const int *stop, uint64_t *stamps, uint32_t max)
{
	struct timespec next;
	uint64_t at;
	uint32_t k;

	if (idx >= CB_MAX_SLOTS || nroutes == 0 || period_ns == 0 || max > INT32_MAX / 2)
		return -1;
	for (k = 0; k < max && !__atomic_load_n(stop, __ATOMIC_ACQUIRE); k++) {
		at = clock_ns(CLOCK_MONOTONIC);
		if (at == 0)
			return -1;
		stamps[2 * (size_t)k] = at;
		stamps[2 * (size_t)k + 1] = cb_set_route(cb, idx, routes[k % nroutes], quota_pct);
		/* one period from this write's start, never less: a write made late
		 * does not pull the next one closer (no burst after a stall) */
		at += period_ns;
		next.tv_sec = (time_t)(at / 1000000000u);
		next.tv_nsec = (long)(at % 1000000000u);
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL) == EINTR)
			;
	}
	return (int)k;
}

uint64_t cb_load64(const uint64_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

uint32_t cb_load32(const uint32_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}
