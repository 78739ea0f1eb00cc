/*
 * progutil.h - what every bench program shares: the FAIL line and exit,
 * CUDA error checks, a monotonic clock and `--key value` integer options.
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

#endif
