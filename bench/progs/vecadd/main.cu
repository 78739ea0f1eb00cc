// vecadd: c = a + b on n floats.
//
//   vecadd [--n N] [--repeat R] [--stream] [--block B] [--symbol]
//
// Default variant: cudaMalloc, cudaMemcpy H2D (a, b), R launches on the
// default stream, cudaDeviceSynchronize, cudaMemcpy D2H (c), cudaFree.
// --stream: a created stream, cudaMemcpyAsync both ways, events around the
// launches, cudaStreamSynchronize / cudaEventElapsedTime.
// --symbol: also round-trips n through a __device__ variable
// (cudaMemcpyToSymbol, then cudaMemcpyFromSymbol after the launches).
//
// Checks c bit-exactly against a CPU reference (a float add is exact IEEE on
// both sides), prints `STATS ...` and then `PASS vecadd ...` (exit 0) or
// `FAIL vecadd <reason>` (exit 1).  Plain CUDA: runs on a real GPU and on simgpu.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *NAME = "vecadd";

#include "progutil.h"

__device__ int d_n;   // --symbol only

__global__ void vecadd(const float *a, const float *b, float *c, int n)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		c[i] = a[i] + b[i];
}

int main(int argc, char **argv)
{
	long long n = 1 << 20, repeat = 1, block = 256;
	int use_stream = 0, use_symbol = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--n"))
			n = arg_int(argc, argv, &i, 1, 1LL << 30);
		else if (!strcmp(argv[i], "--repeat"))
			repeat = arg_int(argc, argv, &i, 1, 1LL << 40);
		else if (!strcmp(argv[i], "--block"))
			block = arg_int(argc, argv, &i, 1, 1024);
		else if (!strcmp(argv[i], "--stream"))
			use_stream = 1;
		else if (!strcmp(argv[i], "--symbol"))
			use_symbol = 1;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: vecadd [--n N] [--repeat R] [--block B] [--stream] [--symbol]\n");
			return 0;
		} else
			fail("unknown option %s%s", argv[i], "");
	}

	size_t bytes = (size_t)n * sizeof(float);
	float *a = (float *)malloc(bytes), *b = (float *)malloc(bytes);
	float *c = (float *)malloc(bytes);
	if (!a || !b || !c)
		fail("host malloc of %s%s failed", "3 x n floats", "");
	for (long long i = 0; i < n; i++) {
		a[i] = (float)(i % 1009) * 0.25f - 100.0f;
		b[i] = 1.0f / (float)(1 + i % 7) + (float)(i % 13);
		c[i] = -1.0f;
	}
	unsigned long long launches = 0, h2d = 0, d2h = 0;

	float *da, *db, *dc;
	CK(cudaMalloc((void **)&da, bytes));
	CK(cudaMalloc((void **)&db, bytes));
	CK(cudaMalloc((void **)&dc, bytes));

	int n_int = (int)n, n_back = -1;
	if (use_symbol) {
		CK(cudaMemcpyToSymbol(d_n, &n_int, sizeof(n_int)));
		h2d += sizeof(n_int);
	}

	unsigned grid = (unsigned)((n + block - 1) / block);
	double kernel_ms;
	if (!use_stream) {
		CK(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
		h2d += bytes;
		CK(cudaMemcpy(db, b, bytes, cudaMemcpyHostToDevice));
		h2d += bytes;
		double t0 = now_s();
		for (long long r = 0; r < repeat; r++) {
			vecadd<<<grid, (unsigned)block>>>(da, db, dc, (int)n);
			launches++;
			CK(cudaGetLastError());
		}
		CK(cudaDeviceSynchronize());
		kernel_ms = (now_s() - t0) * 1e3;
		CK(cudaMemcpy(c, dc, bytes, cudaMemcpyDeviceToHost));
		d2h += bytes;
	} else {
		cudaStream_t s;
		cudaEvent_t e0, e1;
		CK(cudaStreamCreate(&s));
		CK(cudaEventCreate(&e0));
		CK(cudaEventCreate(&e1));
		CK(cudaMemcpyAsync(da, a, bytes, cudaMemcpyHostToDevice, s));
		h2d += bytes;
		CK(cudaMemcpyAsync(db, b, bytes, cudaMemcpyHostToDevice, s));
		h2d += bytes;
		CK(cudaEventRecord(e0, s));
		for (long long r = 0; r < repeat; r++) {
			vecadd<<<grid, (unsigned)block, 0, s>>>(da, db, dc, (int)n);
			launches++;
			CK(cudaGetLastError());
		}
		CK(cudaEventRecord(e1, s));
		CK(cudaMemcpyAsync(c, dc, bytes, cudaMemcpyDeviceToHost, s));
		d2h += bytes;
		CK(cudaStreamSynchronize(s));
		CK(cudaEventSynchronize(e1));
		float ms = 0;
		CK(cudaEventElapsedTime(&ms, e0, e1));
		kernel_ms = ms;
		CK(cudaEventDestroy(e0));
		CK(cudaEventDestroy(e1));
		CK(cudaStreamDestroy(s));
	}
	if (use_symbol) {
		CK(cudaMemcpyFromSymbol(&n_back, d_n, sizeof(n_back)));
		d2h += sizeof(n_back);
		if (n_back != n_int)
			fail("__device__ round trip gave %s%s", "a different value", "");
	}
	CK(cudaFree(da));
	CK(cudaFree(db));
	CK(cudaFree(dc));
	CK(cudaDeviceSynchronize());

	long long bad = 0, first_bad = -1;
	for (long long i = 0; i < n; i++) {
		float want = a[i] + b[i];
		if (memcmp(&want, &c[i], sizeof want)) {
			if (first_bad < 0)
				first_bad = i;
			bad++;
		}
	}
	printf("VECADD n=%lld repeat=%lld stream=%d block=%lld kernel_ms=%.3f\n", n, repeat,
	       use_stream, block, kernel_ms);
	printf("STATS launches=%llu h2d_bytes=%llu d2h_bytes=%llu\n", launches, h2d, d2h);
	if (bad) {
		printf("FAIL %s %lld of %lld elements wrong (first at %lld: got %g want %g)\n",
		       NAME, bad, n, first_bad, c[first_bad], a[first_bad] + b[first_bad]);
		return 1;
	}
	printf("PASS %s n=%lld repeat=%lld stream=%d\n", NAME, n, repeat, use_stream);
	free(a);
	free(b);
	free(c);
	return 0;
}
