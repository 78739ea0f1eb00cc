/*
 * Host twin of bench/camelot/tonic_stage.cu's adapt kernel (simgpu; see
 * shim/simgpu/simgpu_twin.h).  Integer hashing and exact FP32 steps only: the same
 * bits as the GPU.  The networks' own kernels have their twins in
 * bench/tonic/twins.c, their cuDNN / cuBLAS calls are simgpu's libraries.
 */
#include <stdint.h>
#include <string.h>

#include "simgpu_twin.h"

#define NET_MAX_FEATS 4                 /* bench/tonic/net.h */

struct ct_rows {
	int n[NET_MAX_FEATS];
};

/* tonic_stage.cu's ct_mix */
static uint32_t ct_mix(uint32_t bits, long long pos)
{
	uint64_t z = ((uint64_t)bits << 32 | (uint32_t)pos) + 0x9e3779b97f4a7c15ull;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (uint32_t)(z ^ (z >> 31));
}

/* camelot_tonic_adapt(const float *in, long long in_n, void *out, long long per_q,
 *                     int queries, int nfeat, struct ct_rows rows) */
void simgpu_twin_camelot_tonic_adapt(const simgpu_launch *l)
{
	const float *in = SIMGPU_ARG(l, 0, const float *);
	long long in_n = SIMGPU_ARG(l, 1, long long);
	void *out = SIMGPU_ARG(l, 2, void *);
	long long per_q = SIMGPU_ARG(l, 3, long long);
	int queries = SIMGPU_ARG(l, 4, int), nfeat = SIMGPU_ARG(l, 5, int);
	struct ct_rows rows = SIMGPU_ARG(l, 6, struct ct_rows);

	for (long long t = 0; t < (long long)queries * per_q; t++) {
		long long q = t / per_q, j = t % per_q;
		float x = in[q * in_n + j % in_n];
		uint32_t bits, h;
		int r;

		memcpy(&bits, &x, sizeof(bits));
		h = ct_mix(bits, j);
		if (nfeat == 0) {
			((float *)out)[t] = (float)((h >> 8) & 0xffffu) * (1.0f / 65536) - 0.5f;
			continue;
		}
		r = rows.n[j % nfeat];
		((int32_t *)out)[t] = r > 1 ? (int32_t)(1 + h % (uint32_t)(r - 1)) : 0;
	}
}

void simgpu_cost_camelot_tonic_adapt(const simgpu_launch *l, double *flops, double *bytes)
{
	double n = (double)SIMGPU_ARG(l, 4, int) * (double)SIMGPU_ARG(l, 3, long long);

	*flops = 8.0 * n;                            /* the hash */
	*bytes = n * 2.0 * 4;                        /* read a float, write a float or an index */
}
