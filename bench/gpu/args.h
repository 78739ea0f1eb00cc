/*
 * args.h - the GPU probes' option values: the number after an option,
 * checked against its range.  Each returns 0 and moves *i past the value,
 * or -1 (missing, not a number, out of range) leaving *i alone.
 */
#ifndef BENCH_GPU_ARGS_H
#define BENCH_GPU_ARGS_H

#include <errno.h>
#include <math.h>
#include <stdlib.h>

static inline int arg_ll(int argc, char **argv, int *i, long long lo, long long hi,
			 long long *out)
{
	char *end;
	long long v;

	if (*i + 1 >= argc)
		return -1;
	errno = 0;
	v = strtoll(argv[*i + 1], &end, 0);
	if (errno || *end || end == argv[*i + 1] || v < lo || v > hi)
		return -1;
	*out = v;
	*i += 1;
	return 0;
}

static inline int arg_ull(int argc, char **argv, int *i, unsigned long long lo,
			  unsigned long long hi, unsigned long long *out)
{
	char *end;
	unsigned long long v;

	if (*i + 1 >= argc)
		return -1;
	errno = 0;
	v = strtoull(argv[*i + 1], &end, 0);
	if (errno || *end || end == argv[*i + 1] || v < lo || v > hi)
		return -1;
	*out = v;
	*i += 1;
	return 0;
}

static inline int arg_d(int argc, char **argv, int *i, double lo, double hi, double *out)
{
	char *end;
	double v;

	if (*i + 1 >= argc)
		return -1;
	errno = 0;
	v = strtod(argv[*i + 1], &end);
	if (errno || *end || end == argv[*i + 1] || !isfinite(v) || v < lo || v > hi)
		return -1;
	*out = v;
	*i += 1;
	return 0;
}

#endif
