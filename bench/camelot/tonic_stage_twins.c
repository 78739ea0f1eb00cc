/*
 * Host twin of bench/camelot/tonic_stage.cu's adapt kernel (simgpu; see
 * shim/simgpu/simgpu_twin.h): tonic_adapt.h's rule, as the kernel runs it,
 * integer hashing and exact FP32 steps: the same bits as the GPU.  The
 * networks' own kernels have their twins in bench/tonic/twins.c, their
 * cuDNN / cuBLAS calls are simgpu's libraries.
 */
#include <stdint.h>
#include <string.h>

#include "simgpu_twin.h"
#include "tonic_adapt.h"

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
		uint32_t bits;

		memcpy(&bits, &x, sizeof(bits));
		ct_adapt_one(bits, j, t, out, nfeat, &rows);
	}
}

void simgpu_cost_camelot_tonic_adapt(const simgpu_launch *l, double *flops, double *bytes)
{
	double n = (double)SIMGPU_ARG(l, 4, int) * (double)SIMGPU_ARG(l, 3, long long);

	*flops = 8.0 * n;                            /* the hash */
	*bytes = n * 2.0 * 4;                        /* read a float, write a float or an index */
}
