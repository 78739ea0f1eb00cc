// launchloop: a launch-bound program for the interception-overhead benchmark.
//
//   launchloop [--launches N] [--warmup W]
//
// W (default 1) untimed warm-up launches + one sync (module loading, first-
// launch lookups), then N (default 200000) launches of a tiny kernel (1 block
// of 32 threads; thread 0 stores value + blockIdx.x into one int) back to back
// on the default stream, then one cudaDeviceSynchronize.  Launch i of the
// timed loop passes value = i, so the int must read N - 1 at the end (the
// last launch ran, after the others, in stream order).
// Prints `LAUNCHLOOP launches=N issue_s=... total_s=... launches_per_s=...`,
// `STATS ...` and `PASS launchloop ...` / `FAIL launchloop <reason>`.
// The loop itself calls nothing but the launch; launch errors are sticky in
// cudaGetLastError(), which is checked right after the loop.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *NAME = "launchloop";

#include "progutil.h"

__global__ void launchloop_tick(int *out, int value)
{
	if (threadIdx.x == 0)
		out[0] = value + (int)blockIdx.x;
}

int main(int argc, char **argv)
{
	long long n = 200000, warmup = 1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--launches"))
			n = arg_int(argc, argv, &i, 1, 0x7fffffffLL);
		else if (!strcmp(argv[i], "--warmup"))
			warmup = arg_int(argc, argv, &i, 0, 1000000);
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: launchloop [--launches N] [--warmup W]\n");
			return 0;
		} else
			fail("unknown option %s%s", argv[i], "");
	}
	unsigned long long launches = 0, h2d = 0, d2h = 0;
	int *dout, init = -1, got = -2;
	CK(cudaMalloc((void **)&dout, sizeof(int)));
	CK(cudaMemcpy(dout, &init, sizeof init, cudaMemcpyHostToDevice));
	h2d += sizeof init;
	for (long long w = 0; w < warmup; w++) {
		launchloop_tick<<<1, 32>>>(dout, -1000000 - (int)w);
		launches++;
	}
	CK(cudaGetLastError());
	CK(cudaDeviceSynchronize());

	int nn = (int)n;
	double t0 = now_s();
	for (int i = 0; i < nn; i++)
		launchloop_tick<<<1, 32>>>(dout, i);
	double t1 = now_s();
	CK(cudaGetLastError());
	CK(cudaDeviceSynchronize());
	double t2 = now_s();
	launches += (unsigned long long)n;

	CK(cudaMemcpy(&got, dout, sizeof got, cudaMemcpyDeviceToHost));
	d2h += sizeof got;
	CK(cudaFree(dout));

	double issue = t1 - t0, total = t2 - t0;
	printf("LAUNCHLOOP launches=%lld warmup=%lld issue_s=%.6f total_s=%.6f "
	       "launches_per_s=%.1f issue_ns_per_launch=%.1f\n",
	       n, warmup, issue, total, total > 0 ? n / total : 0.0,
	       issue * 1e9 / (double)n);
	printf("STATS launches=%llu h2d_bytes=%llu d2h_bytes=%llu\n", launches, h2d, d2h);
	if (got != nn - 1) {
		printf("FAIL %s the int reads %d after the loop, want %d\n", NAME, got, nn - 1);
		return 1;
	}
	printf("PASS %s launches=%lld launches_per_s=%.1f\n", NAME, n,
	       total > 0 ? n / total : 0.0);
	return 0;
}
