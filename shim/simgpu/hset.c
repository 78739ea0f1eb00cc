/*
 * hset.c - a small set of pointers, used to validate the stream and event
 * handles an application passes in.  A handle is only dereferenced after
 * the set says we made it, so a garbage handle yields an error, not a crash.
 *
 * Open addressing with linear probing; deleted slots become tombstones and
 * the table is rebuilt when live entries plus tombstones fill half of it.
 * Readers take the read side of a rwlock (one atomic, no syscall).
 */
#include <stdlib.h>

#include "simgpu_impl.h"

#define TOMB ((const void *)1)

static size_t slot_of(const void *p, size_t cap)
{
	uint64_t x = (uint64_t)(uintptr_t)p;

	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	return (size_t)x & (cap - 1);
}

static int rebuild(struct sg_hset *h, size_t cap)
{
	const void **nt = calloc(cap, sizeof(*nt));
	size_t i, j, used = 0;

	if (!nt)
		return -1;
	for (i = 0; i < h->cap; i++) {
		const void *p = h->tab[i];

		if (!p || p == TOMB)
			continue;
		for (j = slot_of(p, cap); nt[j]; j = (j + 1) & (cap - 1))
			;
		nt[j] = p;
		used++;
	}
	free(h->tab);
	h->tab = nt;
	h->cap = cap;
	h->used = used;
	return 0;
}

int sg_hset_add(struct sg_hset *h, const void *p)
{
	size_t j;
	int rc = 0;

	if (!p || p == TOMB)
		return -1;
	pthread_rwlock_wrlock(&h->lock);
	if ((h->used + 1) * 2 > h->cap) {
		size_t cap = h->cap ? h->cap : 16;

		while ((h->used + 1) * 4 > cap)
			cap *= 2;
		if (rebuild(h, cap) < 0) {
			rc = -1;
			goto out;
		}
	}
	{
		size_t hole = (size_t)-1;

		for (j = slot_of(p, h->cap); h->tab[j]; j = (j + 1) & (h->cap - 1)) {
			if (h->tab[j] == p)
				goto out;
			if (h->tab[j] == TOMB && hole == (size_t)-1)
				hole = j;
		}
		if (hole != (size_t)-1)
			j = hole;          /* reuse a tombstone */
		else
			h->used++;
		h->tab[j] = p;
	}
out:
	pthread_rwlock_unlock(&h->lock);
	return rc;
}

void sg_hset_del(struct sg_hset *h, const void *p)
{
	size_t j;

	pthread_rwlock_wrlock(&h->lock);
	if (h->cap)
		for (j = slot_of(p, h->cap); h->tab[j]; j = (j + 1) & (h->cap - 1))
			if (h->tab[j] == p) {
				h->tab[j] = TOMB;
				break;
			}
	pthread_rwlock_unlock(&h->lock);
}

int sg_hset_has(struct sg_hset *h, const void *p)
{
	size_t j;
	int found = 0;

	if (!p || p == TOMB)
		return 0;
	pthread_rwlock_rdlock(&h->lock);
	if (h->cap)
		for (j = slot_of(p, h->cap); h->tab[j]; j = (j + 1) & (h->cap - 1))
			if (h->tab[j] == p) {
				found = 1;
				break;
			}
	pthread_rwlock_unlock(&h->lock);
	return found;
}
