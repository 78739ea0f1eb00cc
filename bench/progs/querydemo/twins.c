/* Host twins of bench/progs/querydemo (simgpu; see shim/simgpu/simgpu_twin.h). */
#include "simgpu_twin.h"

/* __global__ void affine(const float *x, float *y, int n, float a, float b)
 * x may be y (in place): each element is read before it is written. */
void simgpu_twin__Z6affinePKfPfiff(const simgpu_launch *l)
{
	const float *x = SIMGPU_ARG(l, 0, const float *);
	float *y = SIMGPU_ARG(l, 1, float *);
	int n = SIMGPU_ARG(l, 2, int);
	float a = SIMGPU_ARG(l, 3, float), b = SIMGPU_ARG(l, 4, float);
	long threads = (long)l->grid.x * l->block.x;

	for (long i = 0; i < threads && i < n; i++)
		y[i] = a * x[i] + b;
}

void simgpu_cost__Z6affinePKfPfiff(const simgpu_launch *l, double *flops, double *bytes)
{
	int n = SIMGPU_ARG(l, 2, int);
	double threads = (double)l->grid.x * l->block.x;
	double active = n < 0 ? 0 : (threads < n ? threads : (double)n);

	*flops = 2.0 * active;                          /* a multiply and an add */
	*bytes = active * 2.0 * sizeof(float);          /* read x, write y       */
}
