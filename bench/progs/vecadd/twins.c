/* Host twins of bench/progs/vecadd (simgpu; see shim/simgpu/simgpu_twin.h). */
#include "simgpu_twin.h"

/* __global__ void vecadd(const float *a, const float *b, float *c, int n) */
void simgpu_twin__Z6vecaddPKfS0_Pfi(const simgpu_launch *l)
{
	const float *a = SIMGPU_ARG(l, 0, const float *);
	const float *b = SIMGPU_ARG(l, 1, const float *);
	float *c = SIMGPU_ARG(l, 2, float *);
	int n = SIMGPU_ARG(l, 3, int);
	SIMGPU_FOR_EACH_THREAD(l, bx, by, bz, tx, ty, tz) {
		/* the kernel only uses the x dimension: every (y, z) copy of a
		 * thread computes the same i and stores the same value */
		int i = (int)(bx * l->block.x + tx);
		if (i < n)
			c[i] = a[i] + b[i];
		(void)by; (void)bz; (void)ty; (void)tz;
	}
}

void simgpu_cost__Z6vecaddPKfS0_Pfi(const simgpu_launch *l, double *flops, double *bytes)
{
	int n = SIMGPU_ARG(l, 3, int);
	double per_copy = (double)l->grid.x * l->block.x;   /* threads along x */
	double active = n < 0 ? 0 : (per_copy < n ? per_copy : (double)n);
	double copies = (double)l->grid.y * l->grid.z * l->block.y * l->block.z;
	*flops = active * copies;                       /* one add per element    */
	*bytes = active * copies * 3.0 * sizeof(float); /* read a, b; write c      */
}
