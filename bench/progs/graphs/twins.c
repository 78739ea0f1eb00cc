/* Host twins of bench/progs/graphs (simgpu; see shim/simgpu/simgpu_twin.h).
 * Every kernel is one-dimensional: element i = blockIdx.x * blockDim.x +
 * threadIdx.x, for i < n. */
#include "simgpu_twin.h"

/* the elements the grid covers along x, at most n */
static long covered(const simgpu_launch *l, int n)
{
	long t = (long)l->grid.x * l->block.x;

	return n < 0 ? 0 : (t < n ? t : n);
}

/* __global__ void iota(int *v, int n) */
void simgpu_twin__Z4iotaPii(const simgpu_launch *l)
{
	int *v = SIMGPU_ARG(l, 0, int *);
	long n = covered(l, SIMGPU_ARG(l, 1, int));

	for (long i = 0; i < n; i++)
		v[i] = (int)(i % 97) - 40;
}

/* __global__ void inc(int *acc, const int *x, int n) */
void simgpu_twin__Z3incPiPKii(const simgpu_launch *l)
{
	int *acc = SIMGPU_ARG(l, 0, int *);
	const int *x = SIMGPU_ARG(l, 1, const int *);
	long n = covered(l, SIMGPU_ARG(l, 2, int));

	for (long i = 0; i < n; i++)
		acc[i] += x[i];
}

/* __global__ void count(int *cnt, int n) */
void simgpu_twin__Z5countPii(const simgpu_launch *l)
{
	int *cnt = SIMGPU_ARG(l, 0, int *);
	long n = covered(l, SIMGPU_ARG(l, 1, int));

	for (long i = 0; i < n; i++)
		cnt[i] += 1;
}

/* __global__ void combine(int *out, const int *acc, const int *cnt, int k, int n) */
void simgpu_twin__Z7combinePiPKiS1_ii(const simgpu_launch *l)
{
	int *out = SIMGPU_ARG(l, 0, int *);
	const int *acc = SIMGPU_ARG(l, 1, const int *);
	const int *cnt = SIMGPU_ARG(l, 2, const int *);
	int k = SIMGPU_ARG(l, 3, int);
	long n = covered(l, SIMGPU_ARG(l, 4, int));

	for (long i = 0; i < n; i++)
		out[i] = acc[i] * k + cnt[i];
}

/* __global__ void addto(int *m, const int *x, int n) */
void simgpu_twin__Z5addtoPiPKii(const simgpu_launch *l)
{
	int *m = SIMGPU_ARG(l, 0, int *);
	const int *x = SIMGPU_ARG(l, 1, const int *);
	long n = covered(l, SIMGPU_ARG(l, 2, int));

	for (long i = 0; i < n; i++)
		m[i] += x[i];
}

/* __global__ void bump(int *c, int n) */
void simgpu_twin__Z4bumpPii(const simgpu_launch *l)
{
	int *c = SIMGPU_ARG(l, 0, int *);
	long n = covered(l, SIMGPU_ARG(l, 1, int));

	for (long i = 0; i < n; i++)
		c[i] += 1;
}
