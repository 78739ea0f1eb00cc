// streams2: three streams and the legacy default stream, ordered only by
// CUDA's stream rules - the program for checking that a route that moves
// kernels elsewhere (an SM partition's shadow streams, a process-pool
// worker) keeps every order the app relies on.
//
//   streams2 [--n N] [--rounds R] [--repeat K] [--pause-us P] [--lead-rounds L]
//   streams2 --steps [--n N] [--rounds R] [--lead-rounds L]
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
// before the producer starts shows in the data).
//
// --steps: two fixed sequences on A, each stopping at "STEP x" lines (on
// stdout) until a line arrives on stdin, so that a test changes the route
// at exactly those points (tests/test_partition.py writes the routes named):
//   a  (a partition)   lead; bump(x)                     x = 1
//      event record on A
//   b  (another one)   twice(y, x)                       y = 2: follows bump
//   c  (a partition)   bump(z)                           z = 1
//   d  (local)         lead; bump(z)                     z = 2 (on all SMs)
//   e  (c's again)     twice(y, z)                       y = 4: follows it
//   f  (b's again)     lead; bump(x)                     x = 2
//      event record on A
//   g  (a's again)     twice(y, x)                       y = 4: follows bump
// then PASS, or FAIL at the first wrong element.  (b and g move to a
// partition A has used before: its shadow there exists.)  Prints CHECK (a checksum of the last repeat's arrays),
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

/* Print "STEP name", then wait for a line on stdin (the route changes). */
static void step(const char *name)
{
	char line[64];

	printf("STEP %s\n", name);
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		fail("stdin closed at step %s%s", name, "");
}

static int run_steps(cudaStream_t a, cudaEvent_t ea, float *x, float *y, float *z, float *scratch,
		     float *hy, int n, int blocks, int threads, int rounds, int lead)
{
	size_t bytes = (size_t)n * sizeof(float);

	CK(cudaMemset(y, 0, bytes));
	CK(cudaDeviceSynchronize());
	step("a");
	s2_bump<<<blocks, threads, 0, a>>>(scratch, n, lead);
	s2_bump<<<blocks, threads, 0, a>>>(x, n, rounds);
	CK(cudaEventRecord(ea, a));
	step("b");
	s2_twice<<<blocks, threads, 0, a>>>(y, x, n, rounds);
	CK(cudaMemcpyAsync(hy, y, bytes, cudaMemcpyDeviceToHost, a));
	CK(cudaStreamSynchronize(a));
	expect(hy, n, 2.0f, "step b: twice on another partition after bump: ");
	step("c");
	s2_bump<<<blocks, threads, 0, a>>>(z, n, rounds);
	step("d");
	s2_bump<<<blocks, threads, 0, a>>>(scratch, n, lead);
	s2_bump<<<blocks, threads, 0, a>>>(z, n, rounds);
	step("e");
	s2_twice<<<blocks, threads, 0, a>>>(y, z, n, rounds);
	CK(cudaMemcpyAsync(hy, y, bytes, cudaMemcpyDeviceToHost, a));
	CK(cudaStreamSynchronize(a));
	expect(hy, n, 4.0f, "step e: twice back on the partition after a local bump: ");
	step("f");
	s2_bump<<<blocks, threads, 0, a>>>(scratch, n, lead);
	s2_bump<<<blocks, threads, 0, a>>>(x, n, rounds);
	CK(cudaEventRecord(ea, a));
	step("g");
	s2_twice<<<blocks, threads, 0, a>>>(y, x, n, rounds);
	CK(cudaMemcpyAsync(hy, y, bytes, cudaMemcpyDeviceToHost, a));
	CK(cudaStreamSynchronize(a));
	expect(hy, n, 4.0f, "step g: twice back on an earlier partition after bump: ");
	CK(cudaGetLastError());
	printf("STATS launches=10 h2d_bytes=0 d2h_bytes=%zu\n", 3 * bytes);
	printf("PASS %s steps\n", NAME);
	return 0;
}

int main(int argc, char **argv)
{
	long long n = 1 << 16, rounds = 64, repeat = 20, pause_us = 0, lead = 0;
	int steps = 0;
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
		else if (!strcmp(argv[i], "--steps"))
			steps = 1;
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
	if (steps)
		return run_steps(a, ea, x, y, z, scratch, hy, (int)n, blocks, threads, (int)rounds,
				 (int)(lead ? lead : 256));
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
