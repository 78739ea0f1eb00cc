/*
 * progutil.h - what every bench program shares: the FAIL line and exit,
 * CUDA error checks, a monotonic clock, `--key value` integer and real
 * options, and the CHECK / THROUGHPUT lines.
 * Define `static const char *NAME` (printed in PASS/FAIL lines) first.
 */
#ifndef BENCH_PROGUTIL_H
#define BENCH_PROGUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void fail(const char *fmt, const char *a, const char *b)
{
	printf("FAIL %s ", NAME);
	printf(fmt, a, b);
	printf("\n");
	fflush(stdout);
	exit(1);
}

#define CK(call)                                                                \
	do {                                                                    \
		cudaError_t e_ = (call);                                        \
		if (e_ != cudaSuccess)                                          \
			fail("%s: %s", #call, cudaGetErrorString(e_));          \
	} while (0)

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static long long arg_int(int argc, char **argv, int *i, long long lo, long long hi)
{
	if (*i + 1 >= argc)
		fail("%s needs a value%s", argv[*i], "");
	char *end;
	long long v = strtoll(argv[*i + 1], &end, 0);
	if (*end || end == argv[*i + 1] || v < lo || v > hi)
		fail("bad value for %s: %s", argv[*i], argv[*i + 1]);
	*i += 1;
	return v;
}

/* `--key value` real option within [lo, hi]. */
static inline double arg_real(int argc, char **argv, int *i, double lo, double hi)
{
	if (*i + 1 >= argc)
		fail("%s needs a value%s", argv[*i], "");
	char *end;
	double v = strtod(argv[*i + 1], &end);
	if (*end || end == argv[*i + 1] || !(v >= lo && v <= hi))
		fail("bad value for %s: %s", argv[*i], argv[*i + 1]);
	*i += 1;
	return v;
}

/* `--duration SEC` */
static inline double arg_seconds(int argc, char **argv, int *i)
{
	return arg_real(argc, argv, i, 0, 1e7);
}

/* FNV-1a (64 bit) of n bytes, continuing from h (start with FNV1A64_INIT):
 * what `CHECK fnv1a64=` prints, to compare results between routes. */
#define FNV1A64_INIT 0xcbf29ce484222325ULL
static inline unsigned long long fnv1a64(unsigned long long h, const void *p, size_t n)
{
	const unsigned char *b = (const unsigned char *)p;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}

/* `THROUGHPUT <name> iters_per_s=.. iters=.. seconds=..`: whole runs done. */
static inline void print_throughput(long long runs, double seconds)
{
	printf("THROUGHPUT %s iters_per_s=%.3f iters=%lld seconds=%.6f\n", NAME,
	       seconds > 0 ? runs / seconds : 0.0, runs, seconds);
}

#endif
