// streams2: three streams and the legacy default stream, ordered only by
// CUDA's stream rules - the program for checking that a route that moves
// kernels elsewhere (an SM partition's shadow streams, a process-pool
// worker) keeps every order the app relies on.
//
//   streams2 [--n N] [--rounds R] [--repeat K] [--pause-us P] [--lead-rounds L]
//
// Each repeat k (x, y, z, w start at 0):
//   A (non-blocking)  bump(x)              x = k+1
//                     copy x -> hx          (same-stream order)
//                     record eA
//   B (non-blocking)  wait eA; twice(y, x) y = 2(k+1)   (event order)
//                     copy y -> hy
//   legacy stream     bump(w)              w = k+1
//   C (blocking)      add(z, w)            z += w  (waits for the legacy
//                                                   stream's bump)
//   legacy            cudaMemcpy z -> hz   (waits for C: blocking stream)
//   host              sync A and B; check hx, hy, hz
// R scales each kernel's modelled work (the order must hold however long a
// kernel takes); P makes the host sleep before each kernel launch, so that
// a route changed from outside every few ms lands between an operation and
// the kernel that must follow it.  L > 0 first queues a kernel of L rounds
// on a scratch buffer on A each repeat, so that A's work starts late: a
// kernel elsewhere that misses its order with A then runs before it (a
// device runs a kernel's work when it starts, so only an order missed
// before the producer starts shows in the data).  Prints CHECK (a checksum of the last repeat's arrays),
// STATS and PASS, or FAIL at the first wrong element.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *NAME = "streams2";

#include "progutil.h"

__global__ void s2_bump(float *x, int n, int rounds)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		x[i] += 1.0f;
}

__global__ void s2_twice(float *y, const float *x, int n, int rounds)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		y[i] = 2.0f * x[i];
}

__global__ void s2_add(float *z, const float *w, int n, int rounds)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		z[i] += w[i];
}

static void expect(const float *h, int n, float want, const char *what)
{
	for (int i = 0; i < n; i++)
		if (h[i] != want) {
			char buf[96];
			snprintf(buf, sizeof(buf), "[%d] = %g, want %g", i, h[i], want);
			fail("%s%s", what, buf);
		}
}

int main(int argc, char **argv)
{
	long long n = 1 << 16, rounds = 64, repeat = 20, pause_us = 0, lead = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--n"))
			n = arg_int(argc, argv, &i, 1, 1 << 26);
		else if (!strcmp(argv[i], "--rounds"))
			rounds = arg_int(argc, argv, &i, 1, 1 << 20);
		else if (!strcmp(argv[i], "--repeat"))
			repeat = arg_int(argc, argv, &i, 1, 1 << 20);
		else if (!strcmp(argv[i], "--pause-us"))
			pause_us = arg_int(argc, argv, &i, 0, 10000000);
		else if (!strcmp(argv[i], "--lead-rounds"))
			lead = arg_int(argc, argv, &i, 0, 1 << 24);
		else
			fail("unknown option %s%s", argv[i], "");
	}
	size_t bytes = n * sizeof(float);
	float *x, *y, *z, *w, *scratch, *hx, *hy, *hz;
	cudaStream_t a, b, c;
	cudaEvent_t ea;
	CK(cudaMalloc(&x, bytes));
	CK(cudaMalloc(&y, bytes));
	CK(cudaMalloc(&z, bytes));
	CK(cudaMalloc(&w, bytes));
	CK(cudaMalloc(&scratch, bytes));
	CK(cudaMallocHost(&hx, bytes));
	CK(cudaMallocHost(&hy, bytes));
	CK(cudaMallocHost(&hz, bytes));
	CK(cudaMemset(x, 0, bytes));
	CK(cudaMemset(z, 0, bytes));
	CK(cudaMemset(w, 0, bytes));
	CK(cudaDeviceSynchronize());     /* A and B do not wait for the legacy stream */
	CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
	CK(cudaStreamCreate(&c));
	CK(cudaEventCreateWithFlags(&ea, cudaEventDisableTiming));
	int threads = 256, blocks = (int)((n + threads - 1) / threads), launches = 0;
	float zsum = 0;
	struct timespec pause = { (time_t)(pause_us / 1000000), (long)(pause_us % 1000000) * 1000 };
#define PAUSE() do { if (pause_us) nanosleep(&pause, NULL); } while (0)
	for (long long k = 0; k < repeat; k++) {
		float v = (float)(k + 1);
		if (lead) {
			s2_bump<<<blocks, threads, 0, a>>>(scratch, (int)n, (int)lead);
			launches++;
		}
		PAUSE();
		s2_bump<<<blocks, threads, 0, a>>>(x, (int)n, (int)rounds);
		CK(cudaMemcpyAsync(hx, x, bytes, cudaMemcpyDeviceToHost, a));
		CK(cudaEventRecord(ea, a));
		CK(cudaStreamWaitEvent(b, ea, 0));
		PAUSE();
		s2_twice<<<blocks, threads, 0, b>>>(y, x, (int)n, (int)rounds);
		CK(cudaMemcpyAsync(hy, y, bytes, cudaMemcpyDeviceToHost, b));
		PAUSE();
		s2_bump<<<blocks, threads>>>(w, (int)n, (int)rounds);
		PAUSE();
		s2_add<<<blocks, threads, 0, c>>>(z, w, (int)n, (int)rounds);
		CK(cudaMemcpy(hz, z, bytes, cudaMemcpyDeviceToHost));
		launches += 4;
		CK(cudaStreamSynchronize(a));
		CK(cudaStreamSynchronize(b));
		zsum += v;
		expect(hx, (int)n, v, "x after bump on A: ");
		expect(hy, (int)n, 2 * v, "y on B after waiting for A's event: ");
		expect(hz, (int)n, zsum, "z on C after the legacy stream's bump: ");
	}
	CK(cudaGetLastError());
	unsigned long long sum = 0;
	for (long long i = 0; i < n; i++)
		sum = sum * 31 + (unsigned long long)hx[i] + 7 * (unsigned long long)hy[i] +
		      13 * (unsigned long long)hz[i];
	printf("CHECK n=%lld repeat=%lld sum=%llu\n", n, repeat, sum);
	printf("STATS launches=%d h2d_bytes=0 d2h_bytes=%llu\n", launches,
	       (unsigned long long)(3 * repeat * bytes));
	printf("PASS %s\n", NAME);
	return 0;
}
