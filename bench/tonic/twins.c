/* Host twins of the Tonic services' own kernels (gpu.cu) for simgpu; see
 * shim/simgpu/simgpu_twin.h.  The cuDNN/cuBLAS work runs through simgpu's
 * CPU libcudnn/libcublas, which carry their own twins.
 *
 * tonic_window_sum only adds, in the kernel's order: bit-identical floats.
 * Keep the C compiler from contracting anything anyway. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>

#include "simgpu_twin.h"

static double grid_threads(const simgpu_launch *l)
{
	return (double)l->grid.x * l->grid.y * l->grid.z *
	       (double)l->block.x * l->block.y * l->block.z;
}

/* Elements a 1-D guarded kernel touches: min(n, threads launched). */
static long covered(const simgpu_launch *l, long n)
{
	double t = grid_threads(l);

	return (double)n < t ? n : (long)t;
}

/* __global__ void tonic_embed(const int *ids, int nfeat, int f, int size, int halo,
 *                             const float *tab, int vocab, int dim, int col, int D,
 *                             float *e) */
void simgpu_twin__Z11tonic_embedPKiiiiiPKfiiiiPf(const simgpu_launch *l)
{
	const int *ids = SIMGPU_ARG(l, 0, const int *);
	int nfeat = SIMGPU_ARG(l, 1, int), f = SIMGPU_ARG(l, 2, int);
	int size = SIMGPU_ARG(l, 3, int), halo = SIMGPU_ARG(l, 4, int);
	const float *tab = SIMGPU_ARG(l, 5, const float *);
	int vocab = SIMGPU_ARG(l, 6, int), dim = SIMGPU_ARG(l, 7, int);
	int col = SIMGPU_ARG(l, 8, int), D = SIMGPU_ARG(l, 9, int);
	float *e = SIMGPU_ARG(l, 10, float *);
	long rows = size + 2L * halo, n = covered(l, rows * dim);

	for (long i = 0; i < n; i++) {
		int t = (int)(i / dim), d = (int)(i % dim), w = t - halo, row = 0;

		if (w >= 0 && w < size && vocab > 1)
			row = 1 + (int)((unsigned)ids[(long)w * nfeat + f] % (unsigned)(vocab - 1));
		e[(long)t * D + col + d] = tab[(long)row * dim + d];
	}
}

/* One table read and one store per element, an id read per word. */
void simgpu_cost__Z11tonic_embedPKiiiiiPKfiiiiPf(const simgpu_launch *l, double *flops,
						  double *bytes)
{
	int size = SIMGPU_ARG(l, 3, int), halo = SIMGPU_ARG(l, 4, int);
	int dim = SIMGPU_ARG(l, 7, int);
	long n = covered(l, (size + 2L * halo) * dim);

	*flops = (double)n;
	*bytes = (double)n * 2 * sizeof(float) + (double)size * sizeof(int);
}

/* __global__ void tonic_window_sum(const float *prod, const float *bias, int size,
 *                                  int win, int O, int rows_ext, int act, float *y) */
void simgpu_twin__Z16tonic_window_sumPKfS0_iiiiiPf(const simgpu_launch *l)
{
	const float *prod = SIMGPU_ARG(l, 0, const float *);
	const float *bias = SIMGPU_ARG(l, 1, const float *);
	int size = SIMGPU_ARG(l, 2, int), win = SIMGPU_ARG(l, 3, int);
	int O = SIMGPU_ARG(l, 4, int), rows_ext = SIMGPU_ARG(l, 5, int);
	int act = SIMGPU_ARG(l, 6, int);
	float *y = SIMGPU_ARG(l, 7, float *);
	long n = covered(l, (long)size * O);

	for (long i = 0; i < n; i++) {
		int t = (int)(i / O), o = (int)(i % O);
		float acc = bias[o];

		for (int j = 0; j < win; j++)
			acc += prod[((long)j * rows_ext + t + j) * O + o];
		if (act == 1)
			acc = acc > 0.0f ? acc : 0.0f;
		else if (act == 2)
			acc = fminf(1.0f, fmaxf(-1.0f, acc));
		y[i] = acc;
	}
}

/* Per output: win + 1 adds, win product reads, a bias read and a store. */
void simgpu_cost__Z16tonic_window_sumPKfS0_iiiiiPf(const simgpu_launch *l, double *flops,
						    double *bytes)
{
	int size = SIMGPU_ARG(l, 2, int), win = SIMGPU_ARG(l, 3, int);
	int O = SIMGPU_ARG(l, 4, int);
	long n = covered(l, (long)size * O);

	*flops = (double)n * (win + 1);
	*bytes = (double)n * (win + 2) * sizeof(float);
}
