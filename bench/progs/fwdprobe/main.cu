// fwdprobe: where and when each kernel ran, for the forwarding benchmark.
//
//   fwdprobe [--n N] [--interval-us U] [--seconds S] [--dump]
//
// N iterations of: launch probe<<<1, 32>>>(rec, i); cudaDeviceSynchronize();
// then sleep U microseconds.  With --seconds, stop after S seconds if that
// comes first (N is then the most there is room for): a run long enough for
// a benchmark's route flips whatever an iteration costs on this device.
// Each probe kernel stores into rec[i] when it ran and who ran it: on a
// GPU %globaltimer and the SM id; on simgpu its host twin stores
// CLOCK_MONOTONIC (ns) and the pid of the process that ran it, i.e. the
// application or the process-pool worker it was forwarded to.
// The host times each iteration (launch to end of sync).
//
// Prints `FWDPROBE n=N lat_us_p50=... lat_us_p99=... lat_us_mean=...`,
// with --dump one line `I i t_launch_ns t_done_ns t_exec_ns who` per
// iteration (CLOCK_MONOTONIC), then STATS and PASS/FAIL (every record
// written, in order).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *NAME = "fwdprobe";

#include "progutil.h"

static long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// rec[2*i] = when, rec[2*i+1] = who
__global__ void fwdprobe_mark(unsigned long long *rec, int i)
{
	if (threadIdx.x == 0 && blockIdx.x == 0) {
		unsigned long long t, sm;
		asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
		asm volatile("mov.u32 %0, %%smid;" : "=r"(*(unsigned *)&sm));
		rec[2 * i] = t;
		rec[2 * i + 1] = sm & 0xffffffffULL;
	}
}

static int cmp_ll(const void *a, const void *b)
{
	long long x = *(const long long *)a, y = *(const long long *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	long long n = 1000, interval_us = 0, seconds = 0;
	int dump = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--n"))
			n = arg_int(argc, argv, &i, 1, 10000000);
		else if (!strcmp(argv[i], "--interval-us"))
			interval_us = arg_int(argc, argv, &i, 0, 10000000);
		else if (!strcmp(argv[i], "--seconds"))
			seconds = arg_int(argc, argv, &i, 0, 3600);
		else if (!strcmp(argv[i], "--dump"))
			dump = 1;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: fwdprobe [--n N] [--interval-us U] [--seconds S] [--dump]\n");
			return 0;
		} else
			fail("unknown option %s%s", argv[i], "");
	}
	size_t bytes = (size_t)n * 2 * sizeof(unsigned long long);
	unsigned long long *drec, *rec = (unsigned long long *)calloc(1, bytes);
	long long *t_launch = (long long *)malloc(n * sizeof(long long));
	long long *t_done = (long long *)malloc(n * sizeof(long long));
	long long *lat = (long long *)malloc(n * sizeof(long long));
	if (!rec || !t_launch || !t_done || !lat)
		fail("host malloc failed%s%s", "", "");
	CK(cudaMalloc((void **)&drec, bytes));
	CK(cudaMemset(drec, 0, bytes));
	struct timespec pause = { (time_t)(interval_us / 1000000), (long)(interval_us % 1000000) * 1000 };
	long long deadline = seconds ? now_ns() + seconds * 1000000000LL : 0;
	for (long long i = 0; i < n; i++) {
		if (deadline && i && now_ns() >= deadline) {
			n = i;     // the records after i stay unwritten and unreported
			break;
		}
		t_launch[i] = now_ns();
		fwdprobe_mark<<<1, 32>>>(drec, (int)i);
		CK(cudaGetLastError());
		CK(cudaDeviceSynchronize());
		t_done[i] = now_ns();
		lat[i] = t_done[i] - t_launch[i];
		if (interval_us)
			nanosleep(&pause, NULL);
	}
	CK(cudaMemcpy(rec, drec, bytes, cudaMemcpyDeviceToHost));
	CK(cudaFree(drec));
	long long bad = 0;
	for (long long i = 0; i < n; i++) {
		if (dump)
			printf("I %lld %lld %lld %llu %llu\n", i, t_launch[i], t_done[i], rec[2 * i],
			       rec[2 * i + 1]);
		if (!rec[2 * i] || (i && rec[2 * i] < rec[2 * i - 2]))
			bad++;
	}
	qsort(lat, n, sizeof(long long), cmp_ll);
	double mean = 0;
	for (long long i = 0; i < n; i++)
		mean += lat[i];
	mean /= n;
	printf("FWDPROBE n=%lld lat_us_p50=%.2f lat_us_p99=%.2f lat_us_mean=%.2f\n", n,
	       lat[n / 2] / 1e3, lat[(n * 99) / 100] / 1e3, mean / 1e3);
	printf("STATS launches=%lld h2d_bytes=0 d2h_bytes=%zu\n", n, bytes);
	if (bad) {
		printf("FAIL %s %lld of %lld records missing or out of order\n", NAME, bad, n);
		return 1;
	}
	printf("PASS %s n=%lld\n", NAME, n);
	return 0;
}
