/*
 * Host twins of bench/camelot/stage.cu (simgpu; see shim/simgpu/simgpu_twin.h).
 * The kernels are grid-stride loops over every element, so a twin is a plain
 * loop over every element.  Same arithmetic, same order, no contraction
 * (built with -ffp-contract=off): the same bits as the GPU.  The compute
 * twin runs the multiply-add chain on chunks of elements side by side so
 * that the compiler vectorises it (the chains are independent).
 */
#include "simgpu_twin.h"

#define FMA_A 0.999f
#define FMA_B 0.0005f
#define CHUNK 512

/* camelot_fma(const float *in, long long in_n, float *out, long long out_n, int batch, int iters) */
void simgpu_twin_camelot_fma(const simgpu_launch *l)
{
	const float *in = SIMGPU_ARG(l, 0, const float *);
	long long in_n = SIMGPU_ARG(l, 1, long long);
	float *out = SIMGPU_ARG(l, 2, float *);
	long long out_n = SIMGPU_ARG(l, 3, long long);
	int batch = SIMGPU_ARG(l, 4, int), iters = SIMGPU_ARG(l, 5, int);
	float x[CHUNK], v[CHUNK];

	for (long long q = 0; q < batch; q++)
		for (long long j0 = 0; j0 < out_n; j0 += CHUNK) {
			int n = out_n - j0 < CHUNK ? (int)(out_n - j0) : CHUNK;

			for (int k = 0; k < n; k++)
				v[k] = x[k] = in[q * in_n + (j0 + k) % in_n];
			for (int it = 0; it < iters; it++)
				for (int k = 0; k < n; k++)
					v[k] = v[k] * FMA_A + FMA_B;
			for (int k = 0; k < n; k++)
				out[q * out_n + j0 + k] = v[k] + x[k];
		}
}

void simgpu_cost_camelot_fma(const simgpu_launch *l, double *flops, double *bytes)
{
	double n = (double)SIMGPU_ARG(l, 4, int) * (double)SIMGPU_ARG(l, 3, long long);

	*flops = n * (2.0 * SIMGPU_ARG(l, 5, int) + 1.0);
	*bytes = n * 2.0 * sizeof(float);            /* read the input, write the output */
}

/* camelot_fill(const float *in, long long in_n, float *ws, long long ws_n, int batch) */
void simgpu_twin_camelot_fill(const simgpu_launch *l)
{
	const float *in = SIMGPU_ARG(l, 0, const float *);
	long long in_n = SIMGPU_ARG(l, 1, long long);
	float *ws = SIMGPU_ARG(l, 2, float *);
	long long ws_n = SIMGPU_ARG(l, 3, long long);
	int batch = SIMGPU_ARG(l, 4, int);

	for (long long q = 0; q < batch; q++)
		for (long long i = 0; i < ws_n; i++)
			ws[q * ws_n + i] = in[q * in_n + i % in_n] * 0.5f + (float)(i & 1023) * (1.0f / 1024);
}

void simgpu_cost_camelot_fill(const simgpu_launch *l, double *flops, double *bytes)
{
	double ws = (double)SIMGPU_ARG(l, 4, int) * (double)SIMGPU_ARG(l, 3, long long);
	double in = (double)SIMGPU_ARG(l, 4, int) * (double)SIMGPU_ARG(l, 1, long long);

	*flops = 2.0 * ws;
	*bytes = (ws + (in < ws ? in : ws)) * sizeof(float);
}

/* camelot_scan(const float *in, long long in_n, const float *aux, long long aux_n,
 *              float *out, long long out_n, int batch) */
void simgpu_twin_camelot_scan(const simgpu_launch *l)
{
	const float *in = SIMGPU_ARG(l, 0, const float *);
	long long in_n = SIMGPU_ARG(l, 1, long long);
	const float *aux = SIMGPU_ARG(l, 2, const float *);
	long long aux_n = SIMGPU_ARG(l, 3, long long);
	float *out = SIMGPU_ARG(l, 4, float *);
	long long out_n = SIMGPU_ARG(l, 5, long long);
	int batch = SIMGPU_ARG(l, 6, int);

	for (long long q = 0; q < batch; q++) {
		const float *a = aux + q * aux_n;

		float *o = out + q * out_n;

		for (long long j = 0; j < out_n; j++)
			o[j] = in[q * in_n + j % in_n] + a[j % aux_n] * 0.125f;
		/* the kernel's per-element sum, k = 1, 2, ...: row by row (same order
		 * for each element, cache-friendly) */
		for (long long i0 = out_n; i0 < aux_n; i0 += out_n) {
			long long n = aux_n - i0 < out_n ? aux_n - i0 : out_n;

			for (long long j = 0; j < n; j++)
				o[j] = o[j] + a[i0 + j] * 0.125f;
		}
	}
}

void simgpu_cost_camelot_scan(const simgpu_launch *l, double *flops, double *bytes)
{
	double b = (double)SIMGPU_ARG(l, 6, int);
	double aux = b * (double)SIMGPU_ARG(l, 3, long long), out = b * (double)SIMGPU_ARG(l, 5, long long);

	*flops = 2.0 * (aux > out ? aux : out);
	*bytes = (aux + 2.0 * out) * sizeof(float);  /* aux once, the input, the output */
}
