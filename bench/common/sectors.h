/*
 * sectors.h - for host twins' cost functions: the global-memory sectors
 * (32 bytes, the unit L2 and DRAM move) the blocks of a launch request.
 *
 * A stamp per sector says which block counted it last, so a block counts
 * each sector once (coalescing, L1) and the next block starts afresh
 * without clearing anything; the same sector requested by two blocks
 * counts twice.  Without memory for the stamps every touch counts, an
 * upper bound.
 *
 *   struct sectors s;
 *   sectors_open(&s, bytes_of_the_array);
 *   per block: sectors_next_block(&s); touch(&s, offset) ...
 *   bytes = sectors_close(&s);
 */
#ifndef BENCH_SECTORS_H
#define BENCH_SECTORS_H

#include <stdlib.h>

#define SECTOR 32

struct sectors {
	unsigned *stamp;
	size_t n;
	unsigned block;      /* current block + 1 */
	double count;
};

static inline void sectors_open(struct sectors *s, size_t bytes)
{
	s->n = bytes / SECTOR + 1;
	s->stamp = (unsigned *)calloc(s->n, sizeof(unsigned));
	s->block = 1;
	s->count = 0;
}

static inline void sectors_next_block(struct sectors *s)
{
	s->block++;
}

static inline void touch(struct sectors *s, size_t off)
{
	size_t k = off / SECTOR;

	if (s->stamp && k < s->n) {
		if (s->stamp[k] == s->block)
			return;
		s->stamp[k] = s->block;
	}
	s->count++;
}

static inline void touch_range(struct sectors *s, size_t off, size_t len)
{
	for (size_t k = off / SECTOR; len && k <= (off + len - 1) / SECTOR; k++)
		touch(s, k * SECTOR);
}

/* Bytes requested; frees the stamps. */
static inline double sectors_close(struct sectors *s)
{
	free(s->stamp);
	s->stamp = NULL;
	return s->count * SECTOR;
}

#endif
