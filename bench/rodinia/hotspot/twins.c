/* Host twins of bench/progs/hotspot (simgpu; see shim/simgpu/simgpu_twin.h).
 *
 * The kernel spells its arithmetic with __fadd_rn/__fsub_rn/__fmul_rn (no
 * FMA contraction), so doing the same float operations in the same order
 * here gives bit-identical temperatures.  Keep the C compiler from fusing
 * them too (x86-64 without -mfma never does; aarch64 gcc would). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "simgpu_twin.h"

#define BLOCK 16          /* the kernel's tile edge (it assumes blockDim 16x16) */
#define TILE (BLOCK + 2)

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* __global__ void hotspot_step(const float *power, const float *src, float *dst,
 *                              int rows, int cols, float step_div_cap,
 *                              float rx_1, float ry_1, float rz_1, float amb)
 * Reads src through a clamped 18x18 tile per block; the tile's neighbours of
 * cell (r, c) are exactly src at the clamped (r +- 1, c +- 1), read directly here. */
void simgpu_twin__Z12hotspot_stepPKfS0_Pfiifffff(const simgpu_launch *l)
{
	const float *power = SIMGPU_ARG(l, 0, const float *);
	const float *src = SIMGPU_ARG(l, 1, const float *);
	float *dst = SIMGPU_ARG(l, 2, float *);
	int rows = SIMGPU_ARG(l, 3, int), cols = SIMGPU_ARG(l, 4, int);
	float step_div_cap = SIMGPU_ARG(l, 5, float);
	float rx_1 = SIMGPU_ARG(l, 6, float), ry_1 = SIMGPU_ARG(l, 7, float);
	float rz_1 = SIMGPU_ARG(l, 8, float), amb = SIMGPU_ARG(l, 9, float);
	unsigned bdx = l->block.x < BLOCK ? l->block.x : BLOCK;
	unsigned bdy = l->block.y < BLOCK ? l->block.y : BLOCK;

	for (unsigned bz = 0; bz < l->grid.z; bz++)
	for (unsigned by = 0; by < l->grid.y; by++)
	for (unsigned ty = 0; ty < bdy; ty++) {
		int r = (int)(by * BLOCK + ty);
		if (r >= rows)
			continue;
		int rn = clampi(r - 1, 0, rows - 1), rs = clampi(r + 1, 0, rows - 1);
		const float *row = src + (long)r * cols;
		const float *rown = src + (long)rn * cols, *rows_ = src + (long)rs * cols;
		for (unsigned bx = 0; bx < l->grid.x; bx++)
		for (unsigned tx = 0; tx < bdx; tx++) {
			int c = (int)(bx * BLOCK + tx);
			if (c >= cols)
				continue;
			int cw = clampi(c - 1, 0, cols - 1), ce = clampi(c + 1, 0, cols - 1);
			float t = row[c];
			float t2 = 2.0f * t;
			float ns = (rows_[c] + rown[c]) - t2;
			float ew = (row[ce] + row[cw]) - t2;
			float sum = power[(long)r * cols + c] + ns * ry_1;
			sum = sum + ew * rx_1;
			sum = sum + (amb - t) * rz_1;
			dst[(long)r * cols + c] = t + step_div_cap * sum;
		}
	}
}

/* Per block: 18*18 tile loads of src (always, clamped).  Per cell inside the
 * chip: one power load, one dst store and 14 float operations
 * (2T, S+N, -2T, E+W, -2T, *Ry_1, +P, *Rx_1, +, amb-T, *Rz_1, +, *step/Cap, +T). */
void simgpu_cost__Z12hotspot_stepPKfS0_Pfiifffff(const simgpu_launch *l, double *flops,
						  double *bytes)
{
	int rows = SIMGPU_ARG(l, 3, int), cols = SIMGPU_ARG(l, 4, int);
	unsigned bdx = l->block.x < BLOCK ? l->block.x : BLOCK;
	unsigned bdy = l->block.y < BLOCK ? l->block.y : BLOCK;
	double cr = (double)l->grid.y * bdy, cc = (double)l->grid.x * bdx;
	if (cr > rows) cr = rows > 0 ? rows : 0;
	if (cc > cols) cc = cols > 0 ? cols : 0;
	double cells = cr * cc * l->grid.z;
	double blocks = (double)l->grid.x * l->grid.y * l->grid.z;
	*flops = cells * 14.0;
	*bytes = blocks * TILE * TILE * sizeof(float) + cells * 2.0 * sizeof(float);
}
