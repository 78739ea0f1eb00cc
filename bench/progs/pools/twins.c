/* Host twins of bench/progs/pools (simgpu; see shim/simgpu/simgpu_twin.h). */
#include "simgpu_twin.h"

/* __global__ void pools_fill(int *p, int n, int v): p[i] = v + i for i < n */
void simgpu_twin__Z10pools_fillPiii(const simgpu_launch *l)
{
	int *p = SIMGPU_ARG(l, 0, int *);
	int n = SIMGPU_ARG(l, 1, int);
	int v = SIMGPU_ARG(l, 2, int);
	SIMGPU_FOR_EACH_THREAD(l, bx, by, bz, tx, ty, tz) {
		/* one-dimensional kernel: every (y, z) copy stores the same value */
		int i = (int)(bx * l->block.x + tx);
		if (i < n)
			p[i] = v + i;
		(void)by; (void)bz; (void)ty; (void)tz;
	}
}

void simgpu_cost__Z10pools_fillPiii(const simgpu_launch *l, double *flops, double *bytes)
{
	int n = SIMGPU_ARG(l, 1, int);
	double threads = (double)l->grid.x * l->block.x;
	double active = n < 0 ? 0 : (threads < n ? threads : (double)n);

	*flops = active;                        /* one add per element */
	*bytes = active * sizeof(int);          /* one store           */
}
