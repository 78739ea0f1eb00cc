// querydemo: a tiny "service" that answers queries, for the query API and
// the shim's query inference (tests/test_tasks.py).
//
//   querydemo [--queries N] [--n N] [--kernels K] [--no-api] [--async]
//
// Each query: upload an input of n floats, K kernel launches, download the
// result, check it against the CPU.  With the API (the default) the query
// is bracketed by colocate_query_begin(id, n) / colocate_query_end(id)
// from shim/include/colocate.h (ids 1..N); --no-api leaves it to the shim
// to infer queries from the copies.  Default: blocking cudaMemcpy both
// ways on the default stream; --async: cudaMemcpyAsync on a created stream
// and cudaStreamSynchronize after the result copy.  Setup copies nothing,
// so the shim should see exactly N queries either way.
//
// Kernel: affine(x, y, n, a, b): y[i] = a * x[i] + b.  Launch 1 of a query
// computes y = 2 x + q from the input, launches 2..K add 1 in place; all
// values are small integers, so every float operation is exact on the GPU,
// on simgpu's twin and on the CPU.
//
// Prints `STATS queries=N launches=L h2d_bytes=H d2h_bytes=D api=0|1`, then
// `PASS querydemo ...` (exit 0) or `FAIL querydemo <reason>` (exit 1).
// Plain CUDA: runs on a real GPU and on simgpu, with or without colocate.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "colocate.h"

static const char *NAME = "querydemo";

#include "progutil.h"

__global__ void affine(const float *x, float *y, int n, float a, float b)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		y[i] = a * x[i] + b;
}

int main(int argc, char **argv)
{
	long long queries = 8, n = 4096, kernels = 2;
	int use_api = 1, use_async = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--queries"))
			queries = arg_int(argc, argv, &i, 1, 1LL << 30);
		else if (!strcmp(argv[i], "--n"))
			n = arg_int(argc, argv, &i, 1, 1LL << 26);
		else if (!strcmp(argv[i], "--kernels"))
			kernels = arg_int(argc, argv, &i, 1, 1024);
		else if (!strcmp(argv[i], "--no-api"))
			use_api = 0;
		else if (!strcmp(argv[i], "--async"))
			use_async = 1;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: querydemo [--queries N] [--n N] [--kernels K] [--no-api] "
			       "[--async]\n");
			return 0;
		} else
			fail("unknown option %s%s", argv[i], "");
	}

	size_t bytes = (size_t)n * sizeof(float);
	float *in = (float *)malloc(bytes), *res = (float *)malloc(bytes);
	if (!in || !res)
		fail("host malloc of %s%s failed", "2 x n floats", "");
	float *dx, *dy;
	CK(cudaMalloc((void **)&dx, bytes));
	CK(cudaMalloc((void **)&dy, bytes));
	cudaStream_t s = 0;
	if (use_async)
		CK(cudaStreamCreate(&s));

	unsigned grid = (unsigned)((n + 255) / 256);
	unsigned long long launches = 0, h2d = 0, d2h = 0, bad = 0;
	int api_active = -1;
	double t0 = now_s();
	for (long long q = 1; q <= queries; q++) {
		for (long long i = 0; i < n; i++)
			in[i] = (float)(i % 97 + q);
		if (use_api) {
			int r = colocate_query_begin((uint64_t)q, (uint64_t)n);
			api_active = api_active < 0 ? r == 0 : api_active && r == 0;
		}
		if (use_async)
			CK(cudaMemcpyAsync(dx, in, bytes, cudaMemcpyHostToDevice, s));
		else
			CK(cudaMemcpy(dx, in, bytes, cudaMemcpyHostToDevice));
		h2d += bytes;
		affine<<<grid, 256, 0, s>>>(dx, dy, (int)n, 2.0f, (float)q);
		launches++;
		for (long long k = 1; k < kernels; k++) {
			affine<<<grid, 256, 0, s>>>(dy, dy, (int)n, 1.0f, 1.0f);
			launches++;
		}
		CK(cudaGetLastError());
		if (use_async) {
			CK(cudaMemcpyAsync(res, dy, bytes, cudaMemcpyDeviceToHost, s));
			CK(cudaStreamSynchronize(s));
		} else {
			CK(cudaMemcpy(res, dy, bytes, cudaMemcpyDeviceToHost));
		}
		d2h += bytes;
		if (use_api)
			colocate_query_end((uint64_t)q);
		for (long long i = 0; i < n; i++) {
			float want = 2.0f * in[i] + (float)q + (float)(kernels - 1);
			if (res[i] != want && bad++ == 0)
				printf("query %lld: element %lld is %g, want %g\n", q, i, res[i], want);
		}
	}
	double elapsed = now_s() - t0;
	if (use_async)
		CK(cudaStreamDestroy(s));
	CK(cudaFree(dx));
	CK(cudaFree(dy));

	printf("STATS queries=%lld launches=%llu h2d_bytes=%llu d2h_bytes=%llu api=%d\n", queries,
	       launches, h2d, d2h, use_api ? api_active : 0);
	if (bad) {
		printf("FAIL %s %llu wrong element(s)\n", NAME, bad);
		return 1;
	}
	printf("PASS %s queries=%lld n=%lld kernels=%lld api=%d async=%d ms_per_query=%.3f\n", NAME,
	       queries, n, kernels, use_api, use_async, queries ? elapsed * 1e3 / queries : 0.0);
	free(in);
	free(res);
	return 0;
}
