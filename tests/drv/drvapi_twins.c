/* Host twins of tests/drv/drvapi_kernels.cu (simgpu; see shim/simgpu/simgpu_twin.h). */
#include "simgpu_twin.h"

static void each(const simgpu_launch *l, int add)
{
	float *p = SIMGPU_ARG(l, 0, float *);
	int n = SIMGPU_ARG(l, 1, int);

	for (unsigned bx = 0; bx < l->grid.x; bx++)
		for (unsigned tx = 0; tx < l->block.x; tx++) {
			long i = (long)bx * l->block.x + tx;

			if (i < n)
				p[i] = add ? p[i] + 1.0f : p[i] * 2.0f;
		}
}

/* extern "C" __global__ void add_one(float *p, int n) */
void simgpu_twin_add_one(const simgpu_launch *l)
{
	each(l, 1);
}

/* extern "C" __global__ void scale2(float *p, int n) */
void simgpu_twin_scale2(const simgpu_launch *l)
{
	each(l, 0);
}
