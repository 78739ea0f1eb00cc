/* Host twins of bench/progs/mallocfree (simgpu; see shim/simgpu/simgpu_twin.h). */
#include "simgpu_twin.h"

/* __global__ void mallocfree_fill(int *p, int value): p[t] = value + t */
void simgpu_twin__Z15mallocfree_fillPii(const simgpu_launch *l)
{
	int *p = SIMGPU_ARG(l, 0, int *);
	int value = SIMGPU_ARG(l, 1, int);

	for (unsigned t = 0; t < l->block.x; t++)
		p[t] = value + (int)t;
}

void simgpu_cost__Z15mallocfree_fillPii(const simgpu_launch *l, double *flops, double *bytes)
{
	*flops = l->block.x;
	*bytes = l->block.x * sizeof(int);
}
