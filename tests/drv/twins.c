/* Host twins of tests/drv/kernels.cu (simgpu; see shim/simgpu/simgpu_twin.h). */
#include "simgpu_twin.h"

/* one thread per element along x; y and z copies compute the same thing */
static long index_of(const simgpu_launch *l, unsigned bx, unsigned tx)
{
	return (long)bx * l->block.x + tx;
}

/* extern "C" __global__ void saxpy(float a, const float *x, float *y, int n) */
void simgpu_twin_saxpy(const simgpu_launch *l)
{
	float a = SIMGPU_ARG(l, 0, float);
	const float *x = SIMGPU_ARG(l, 1, const float *);
	float *y = SIMGPU_ARG(l, 2, float *);
	int n = SIMGPU_ARG(l, 3, int);

	for (unsigned bx = 0; bx < l->grid.x; bx++)
		for (unsigned tx = 0; tx < l->block.x; tx++) {
			long i = index_of(l, bx, tx);

			if (i < n)
				y[i] = a * x[i] + y[i];
		}
}

/* __global__ void scale(float *p, float s, int n) */
void simgpu_twin__Z5scalePffi(const simgpu_launch *l)
{
	float *p = SIMGPU_ARG(l, 0, float *);
	float s = SIMGPU_ARG(l, 1, float);
	int n = SIMGPU_ARG(l, 2, int);

	for (unsigned bx = 0; bx < l->grid.x; bx++)
		for (unsigned tx = 0; tx < l->block.x; tx++) {
			long i = index_of(l, bx, tx);

			if (i < n)
				p[i] *= s;
		}
}

/* __global__ void add_i32(int *p, int v, int n) */
void simgpu_twin__Z7add_i32Piii(const simgpu_launch *l)
{
	int *p = SIMGPU_ARG(l, 0, int *);
	int v = SIMGPU_ARG(l, 1, int);
	int n = SIMGPU_ARG(l, 2, int);

	for (unsigned bx = 0; bx < l->grid.x; bx++)
		for (unsigned tx = 0; tx < l->block.x; tx++) {
			long i = index_of(l, bx, tx);

			if (i < n)
				p[i] += v;
		}
}
