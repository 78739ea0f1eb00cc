/*
 * fma.h - the compute-bound work the GPU probes time (quota_probe,
 * calib_probe, green_probe): CHAINS independent FMA chains per thread,
 * seeded from the thread's index.  The same functions run on the host for
 * the probes' checks: fmaf is exactly rounded on both sides, so the host
 * computes the very bits a thread stores.
 */
#ifndef BENCH_GPU_FMA_H
#define BENCH_GPU_FMA_H

#include <stdint.h>

#define CHAINS 8
#define FMA_A 0.9999f            /* x -> a x + b stays near b / (1 - a) = 1: */
#define FMA_B 0.0001f            /* no overflow, no denormals, any K */

/* unrolled on the device; the host compiler gets no pragma it would warn about */
#ifdef __CUDA_ARCH__
#define FMA_UNROLL _Pragma("unroll")
#else
#define FMA_UNROLL
#endif

__host__ __device__ static inline float seed(uint32_t t, int c)
{
	return (float)((t * CHAINS + (uint32_t)c) & 1023u) * (1.0f / 1024.0f);
}

/* Thread t's chains, seeded. */
__host__ __device__ static inline void fma_seed(float x[CHAINS], uint32_t t)
{
	FMA_UNROLL
	for (int c = 0; c < CHAINS; c++)
		x[c] = seed(t, c);
}

/* iters steps of every chain; the chains' sum (what a thread stores). */
__host__ __device__ static inline float fma_run(float x[CHAINS], long long iters)
{
	float s = 0.0f;

	for (long long k = 0; k < iters; k++) {
		FMA_UNROLL
		for (int c = 0; c < CHAINS; c++)
			x[c] = fmaf(x[c], FMA_A, FMA_B);
	}
	FMA_UNROLL
	for (int c = 0; c < CHAINS; c++)
		s += x[c];
	return s;
}

/* What thread t stores after iters steps (the host's check). */
static inline float host_fma_thread(uint32_t t, long long iters)
{
	float x[CHAINS];

	fma_seed(x, t);
	return fma_run(x, iters);
}

#endif
