/*
 * tonic_adapt.h - how a Table I stage turns its predecessor's floats into
 * its network's input units, shared by the adapt kernel and the reference
 * pass (tonic_stage.cu) and the kernel's simgpu twin (tonic_stage_twins.c),
 * so that all three give the same bits.  The rule is written above
 * camelot_tonic_adapt.
 */
#ifndef CAMELOT_TONIC_ADAPT_H
#define CAMELOT_TONIC_ADAPT_H

#include <stdint.h>

#ifdef __CUDACC__
#define CT_FN __host__ __device__ static inline
#else
#define CT_FN static inline
#endif

#define CT_MAX_FEATS 4                  /* bench/tonic/net.h's NET_MAX_FEATS */

struct ct_rows {
	int n[CT_MAX_FEATS];              /* rows of each word feature (row 0: padding) */
};

/* splitmix64's finaliser: a unit from a float's bits and its position */
CT_FN uint32_t ct_mix(uint32_t bits, long long pos)
{
	uint64_t z = ((uint64_t)bits << 32 | (uint32_t)pos) + 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (uint32_t)(z ^ (z >> 31));
}

/* Value t of a pass, value j of its query, from the bits of its query's float. */
CT_FN void ct_adapt_one(uint32_t bits, long long j, long long t, void *out, int nfeat,
			const struct ct_rows *rows)
{
	uint32_t h = ct_mix(bits, j);

	if (nfeat == 0) {
		((float *)out)[t] = (float)((h >> 8) & 0xffffu) * (1.0f / 65536) - 0.5f;
	} else {
		int r = rows->n[j % nfeat];

		((int32_t *)out)[t] = r > 1 ? (int32_t)(1 + h % (uint32_t)(r - 1)) : 0;
	}
}

#endif
