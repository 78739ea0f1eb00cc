/*
 * twins.c - simgpu host twins of the GPU probes' kernels, for
 * tests/test_gpu_probes.py only (with testdrv/fakedrv.c): on a GPU the
 * probes never load them.  Each does on the CPU what its kernel does, with
 * the same float operations (fmaf is exactly rounded on both), and tells
 * simgpu's device model its work so that modelled times follow the
 * iteration count and the SM quota.
 */
#include <math.h>
#include <stdint.h>

#include "simgpu_twin.h"

#define API __attribute__((visibility("default")))
#define CHAINS 8
#define FMA_A 0.9999f
#define FMA_B 0.0001f

static uint64_t threads(const simgpu_launch *l)
{
	return (uint64_t)l->grid.x * l->grid.y * l->grid.z * l->block.x * l->block.y * l->block.z;
}

static uint32_t pattern(uint32_t i)
{
	return i * 2654435761u + 12345u;
}

/* vmm_fill(uint32_t *v, uint32_t n) */
API void simgpu_twin__Z8vmm_fillPjj(const simgpu_launch *l)
{
	uint32_t *v = SIMGPU_ARG(l, 0, uint32_t *), n = SIMGPU_ARG(l, 1, uint32_t);

	for (uint64_t i = 0; i < n && i < threads(l); i++)
		v[i] = pattern((uint32_t)i);
}

/* vmm_triple(uint32_t *v, uint32_t n) */
API void simgpu_twin__Z10vmm_triplePjj(const simgpu_launch *l)
{
	uint32_t *v = SIMGPU_ARG(l, 0, uint32_t *), n = SIMGPU_ARG(l, 1, uint32_t);

	for (uint64_t i = 0; i < n && i < threads(l); i++)
		v[i] = v[i] * 3u + 1u;
}

/* vmm_add7(uint32_t *v, uint32_t n) */
API void simgpu_twin__Z8vmm_add7Pjj(const simgpu_launch *l)
{
	uint32_t *v = SIMGPU_ARG(l, 0, uint32_t *), n = SIMGPU_ARG(l, 1, uint32_t);

	for (uint64_t i = 0; i < n && i < threads(l); i++)
		v[i] += 7u;
}

static float seed(uint32_t t, int c)
{
	return (float)((t * CHAINS + (uint32_t)c) & 1023u) * (1.0f / 1024.0f);
}

/* quota_fma(float *out, long long iters) */
API void simgpu_twin__Z9quota_fmaPfx(const simgpu_launch *l)
{
	float *out = SIMGPU_ARG(l, 0, float *);
	long long iters = SIMGPU_ARG(l, 1, long long);

	for (uint64_t t = 0; t < threads(l); t++) {
		float x[CHAINS], s = 0.0f;

		for (int c = 0; c < CHAINS; c++)
			x[c] = seed((uint32_t)t, c);
		for (long long k = 0; k < iters; k++)
			for (int c = 0; c < CHAINS; c++)
				x[c] = fmaf(x[c], FMA_A, FMA_B);
		for (int c = 0; c < CHAINS; c++)
			s += x[c];
		out[t] = s;
	}
}

API void simgpu_cost__Z9quota_fmaPfx(const simgpu_launch *l, double *flops, double *bytes)
{
	*flops = 2.0 * CHAINS * (double)SIMGPU_ARG(l, 1, long long) * (double)threads(l);
	*bytes = 4.0 * (double)threads(l);
}

static float init_val(uint64_t i)
{
	return (float)(((uint32_t)i * 2654435761u) >> 16) * (1.0f / 65536.0f);
}

/* quota_init(float *x, uint64_t n) */
API void simgpu_twin__Z10quota_initPfm(const simgpu_launch *l)
{
	float *x = SIMGPU_ARG(l, 0, float *);
	uint64_t n = SIMGPU_ARG(l, 1, uint64_t);

	for (uint64_t i = 0; i < n; i++)
		x[i] = init_val(i);
}

/* quota_stream(const float4 *x, float4 *y, uint64_t n4) */
API void simgpu_twin__Z12quota_streamPK6float4PS_m(const simgpu_launch *l)
{
	const float *x = SIMGPU_ARG(l, 0, const float *);
	float *y = SIMGPU_ARG(l, 1, float *);
	uint64_t n = 4 * SIMGPU_ARG(l, 2, uint64_t);

	for (uint64_t i = 0; i < n; i++)
		y[i] = fmaf(x[i], FMA_A, FMA_B);
}

API void simgpu_cost__Z12quota_streamPK6float4PS_m(const simgpu_launch *l, double *flops,
						    double *bytes)
{
	double n = 4.0 * (double)SIMGPU_ARG(l, 2, uint64_t);

	*flops = 2.0 * n;
	*bytes = 8.0 * n;
}
