// mallocfree: what one cudaMalloc + cudaFree pair costs the app, for the
// forwarding benchmark's memory-sharing figure (COLOCATE_MEM=vmm makes every
// pair two acknowledged messages to each worker the app is connected to).
//
//   mallocfree [--n N] [--bytes B]
//
// One long-lived buffer is written by a kernel and synchronised first (so a
// routed app has joined its worker before the timed loop), then N (default
// 300) pairs of cudaMalloc(B) + cudaFree (B default 1 MiB) are timed, then
// the kernel writes the buffer again and the program reads it back.
// Prints `MALLOCFREE pairs=N bytes=B us_per_pair=...`, `STATS ...` and
// `PASS mallocfree` / `FAIL mallocfree <reason>`.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *NAME = "mallocfree";

#include "progutil.h"

__global__ void mallocfree_fill(int *p, int value)
{
	p[threadIdx.x] = value + (int)threadIdx.x;
}

int main(int argc, char **argv)
{
	long long n = 300, bytes = 1 << 20;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--n"))
			n = arg_int(argc, argv, &i, 1, 10000000);
		else if (!strcmp(argv[i], "--bytes"))
			bytes = arg_int(argc, argv, &i, 1, 1LL << 34);
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: mallocfree [--n N] [--bytes B]\n");
			return 0;
		} else
			fail("unknown option %s%s", argv[i], "");
	}
	unsigned long long launches = 0, d2h = 0;
	int *buf, host[32];
	CK(cudaMalloc((void **)&buf, sizeof(host)));
	mallocfree_fill<<<1, 32>>>(buf, 1);
	launches++;
	CK(cudaGetLastError());
	CK(cudaDeviceSynchronize());

	double t0 = now_s();
	for (long long i = 0; i < n; i++) {
		void *q;
		CK(cudaMalloc(&q, (size_t)bytes));
		CK(cudaFree(q));
	}
	double t1 = now_s();

	mallocfree_fill<<<1, 32>>>(buf, 100);
	launches++;
	CK(cudaGetLastError());
	CK(cudaMemcpy(host, buf, sizeof(host), cudaMemcpyDeviceToHost));
	d2h += sizeof(host);
	CK(cudaFree(buf));
	printf("MALLOCFREE pairs=%lld bytes=%lld us_per_pair=%.2f\n", n, bytes, (t1 - t0) / n * 1e6);
	printf("STATS launches=%llu h2d_bytes=0 d2h_bytes=%llu\n", launches, d2h);
	for (int i = 0; i < 32; i++)
		if (host[i] != 100 + i)
			fail("buffer word %s is wrong%s", i == 0 ? "0" : "> 0", "");
	printf("PASS mallocfree\n");
	return 0;
}
