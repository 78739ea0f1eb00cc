/* Host twins of bench/progs/streams2 (simgpu; see shim/simgpu/simgpu_twin.h).
 * `rounds` only scales the modelled work: each thread does `rounds` flops
 * and moves its element once per round, so a test can make kernels long
 * enough that a missing order shows. */
#include "simgpu_twin.h"

#define EACH(l, n, body)                                                    \
	SIMGPU_FOR_EACH_THREAD(l, bx, by, bz, tx, ty, tz) {                 \
		int i = (int)(bx * (l)->block.x + tx);                       \
		if (i < (n))                                                 \
			body;                                                \
		(void)by; (void)bz; (void)ty; (void)tz;                      \
	}

static void cost(const simgpu_launch *l, int n, int rounds, double *flops, double *bytes)
{
	*flops = (double)n * rounds;
	*bytes = (double)n * rounds * 2.0 * sizeof(float);
}

/* __global__ void s2_bump(float *x, int n, int rounds) */
void simgpu_twin__Z7s2_bumpPfii(const simgpu_launch *l)
{
	float *x = SIMGPU_ARG(l, 0, float *);
	int n = SIMGPU_ARG(l, 1, int);

	EACH(l, n, x[i] += 1.0f);
}

void simgpu_cost__Z7s2_bumpPfii(const simgpu_launch *l, double *flops, double *bytes)
{
	cost(l, SIMGPU_ARG(l, 1, int), SIMGPU_ARG(l, 2, int), flops, bytes);
}

/* __global__ void s2_twice(float *y, const float *x, int n, int rounds) */
void simgpu_twin__Z8s2_twicePfPKfii(const simgpu_launch *l)
{
	float *y = SIMGPU_ARG(l, 0, float *);
	const float *x = SIMGPU_ARG(l, 1, const float *);
	int n = SIMGPU_ARG(l, 2, int);

	EACH(l, n, y[i] = 2.0f * x[i]);
}

void simgpu_cost__Z8s2_twicePfPKfii(const simgpu_launch *l, double *flops, double *bytes)
{
	cost(l, SIMGPU_ARG(l, 2, int), SIMGPU_ARG(l, 3, int), flops, bytes);
}

/* __global__ void s2_add(float *z, const float *w, int n, int rounds) */
void simgpu_twin__Z6s2_addPfPKfii(const simgpu_launch *l)
{
	float *z = SIMGPU_ARG(l, 0, float *);
	const float *w = SIMGPU_ARG(l, 1, const float *);
	int n = SIMGPU_ARG(l, 2, int);

	EACH(l, n, z[i] += w[i]);
}

void simgpu_cost__Z6s2_addPfPKfii(const simgpu_launch *l, double *flops, double *bytes)
{
	cost(l, SIMGPU_ARG(l, 2, int), SIMGPU_ARG(l, 3, int), flops, bytes);
}
