/* Host twins of bench/rodinia/hotspot (simgpu; see shim/simgpu/simgpu_twin.h).
 *
 * The kernels spell their arithmetic with __fadd_rn/__fsub_rn/__fmul_rn (no
 * FMA contraction), so doing the same float operations in the same order
 * here gives bit-identical temperatures.  Keep the C compiler from fusing
 * them too (x86-64 without -mfma never does; aarch64 gcc would). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "simgpu_twin.h"

#define BLOCK 16          /* the kernels' tile edge (they assume blockDim 16x16) */
#define TILE (BLOCK + 2)
#define MAX_PYRAMID 7

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }
static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* The model constants every kernel takes after its integer arguments. */
struct consts {
	float step_div_cap, rx_1, ry_1, rz_1, amb;
};

static struct consts consts_at(const simgpu_launch *l, int first)
{
	struct consts k = {
		SIMGPU_ARG(l, first, float), SIMGPU_ARG(l, first + 1, float),
		SIMGPU_ARG(l, first + 2, float), SIMGPU_ARG(l, first + 3, float),
		SIMGPU_ARG(l, first + 4, float),
	};
	return k;
}

/* One cell's new temperature: the kernels' 14 float operations, in their order. */
static inline float cell(float t, float s, float n, float e, float w, float p,
			 const struct consts *k)
{
	float t2 = 2.0f * t;
	float ns = (s + n) - t2;
	float ew = (e + w) - t2;
	float sum = p + ns * k->ry_1;
	sum = sum + ew * k->rx_1;
	sum = sum + (k->amb - t) * k->rz_1;
	return t + k->step_div_cap * sum;
}

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
	struct consts k = consts_at(l, 5);
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
			dst[(long)r * cols + c] = cell(row[c], rows_[c], rown[c], row[ce], row[cw],
						       power[(long)r * cols + c], &k);
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

/* __global__ void hotspot_pyramid(const float *power, const float *src, float *dst,
 *                                 int rows, int cols, int steps, float step_div_cap,
 *                                 float rx_1, float ry_1, float rz_1, float amb)
 * Done as the kernel does it, block by block and phase by phase (the phases
 * are what its __syncthreads() separate), with its index arithmetic: so
 * `--check` against the plain CPU steps also checks the tiling - which
 * cells each step may compute, the clamped neighbours at the chip's edges,
 * the cells written back - and not only the formula.  blockIdx.z plays no
 * part in the kernel: every z-slice would write the same cells. */
void simgpu_twin__Z15hotspot_pyramidPKfS0_Pfiiifffff(const simgpu_launch *l)
{
	const float *power = SIMGPU_ARG(l, 0, const float *);
	const float *src = SIMGPU_ARG(l, 1, const float *);
	float *dst = SIMGPU_ARG(l, 2, float *);
	int rows = SIMGPU_ARG(l, 3, int), cols = SIMGPU_ARG(l, 4, int);
	int steps = SIMGPU_ARG(l, 5, int);
	struct consts k = consts_at(l, 6);
	int bdx = l->block.x < BLOCK ? (int)l->block.x : BLOCK;
	int bdy = l->block.y < BLOCK ? (int)l->block.y : BLOCK;
	float tile[2][BLOCK][BLOCK], pw[BLOCK][BLOCK];

	/* main.cu launches 1..MAX_PYRAMID steps; others would make no sense */
	if (steps < 1 || steps > MAX_PYRAMID || l->grid.z < 1)
		return;
	int out = BLOCK - 2 * steps;
	for (unsigned by = 0; by < l->grid.y; by++)
	for (unsigned bx = 0; bx < l->grid.x; bx++) {
		int y0 = (int)by * out - steps, x0 = (int)bx * out - steps;
		int ymin = imax(-y0, 0), ymax = imin(rows - 1 - y0, BLOCK - 1);
		int xmin = imax(-x0, 0), xmax = imin(cols - 1 - x0, BLOCK - 1);
#define IN_CHIP(ty, tx) ((ty) >= ymin && (ty) <= ymax && (tx) >= xmin && (tx) <= xmax)
		for (int ty = 0; ty < bdy; ty++)
		for (int tx = 0; tx < bdx; tx++) {
			if (!IN_CHIP(ty, tx))
				continue;
			long idx = (long)(y0 + ty) * cols + (x0 + tx);
			tile[0][ty][tx] = src[idx];
			pw[ty][tx] = ty >= 1 && ty <= BLOCK - 2 && tx >= 1 && tx <= BLOCK - 2
				     ? power[idx] : 0.0f;
		}
		int cur = 0;
		for (int s = 0; s < steps; s++) {
			for (int ty = 0; ty < bdy; ty++)
			for (int tx = 0; tx < bdx; tx++) {
				if (!(IN_CHIP(ty, tx) && ty > s && ty < BLOCK - 1 - s && tx > s &&
				      tx < BLOCK - 1 - s))
					continue;
				int n = imax(ty - 1, ymin), so = imin(ty + 1, ymax);
				int w = imax(tx - 1, xmin), e = imin(tx + 1, xmax);
				const float (*t)[BLOCK] = tile[cur];
				tile[1 - cur][ty][tx] = cell(t[ty][tx], t[so][tx], t[n][tx], t[ty][e],
							     t[ty][w], pw[ty][tx], &k);
			}
			cur = 1 - cur;
		}
		for (int ty = 0; ty < bdy; ty++)
		for (int tx = 0; tx < bdx; tx++)
			if (IN_CHIP(ty, tx) && ty >= steps && ty < BLOCK - steps && tx >= steps &&
			    tx < BLOCK - steps)
				dst[(long)(y0 + ty) * cols + (x0 + tx)] = tile[cur][ty][tx];
#undef IN_CHIP
	}
}

/* Cells of [lo, hi] inside [0, n - 1]. */
static double overlap(long lo, long hi, long n)
{
	if (lo < 0)
		lo = 0;
	if (hi > n - 1)
		hi = n - 1;
	return hi >= lo ? (double)(hi - lo + 1) : 0.0;
}

/* One axis of a pyramid launch: summed over the g blocks along it, how many
 * of their tile positions 0..bd-1 lie inside the chip (loaded), and inside
 * both the chip and step s's region s+1 .. 14-s (computed at step s). */
struct axis {
	double load, comp[MAX_PYRAMID];
};

static struct axis axis_sums(unsigned g, unsigned bd, int n, int steps)
{
	struct axis a = { 0, { 0 } };
	long out = BLOCK - 2 * steps, last = imin((int)bd, BLOCK) - 1;

	for (unsigned b = 0; b < g; b++) {
		long o = (long)b * out - steps;     /* the tile's first chip cell */
		a.load += overlap(o, o + last, n);
		for (int s = 0; s < steps; s++)
			a.comp[s] += overlap(o + imax(s + 1, 0), o + imin(BLOCK - 2 - s, last), n);
	}
	return a;
}

/*
 * What one launch does, counted from the kernel's source:
 *
 * bytes: the in-chip cells of every tile (src loads), the power of every
 *   cell step 0 computes (the only cells that ever need it), and the out x out
 *   cells written back (= the cells the last step computes); 4 bytes each.
 *   Tile cells outside the chip are neither loaded nor computed.
 *
 * operations:
 *   14 float operations for every cell of every step (the cell formula above),
 *     including the halo cells that overlapping blocks compute twice;
 *   45 integer operations per thread, once: out = 16 - 2*steps (2), the
 *     tile origin y0, x0 (4), gy, gx (2), the tile's in-chip bounds
 *     ymin/ymax/xmin/xmax (10), in_chip (4 compares, 3 &&: 7), the global
 *     index gy*cols+gx (2), the clamped neighbours n/s/w/e (4 +-1, 4 min/max:
 *     8), the write-back test (16-steps, 4 compares, 4 &&: 9), the loop's
 *     final compare (1);
 *   12 integer operations per thread and step: loop compare and increment
 *     (2), ping-pong flip (1), the shrinking-region test (15-k, 4 compares,
 *     4 &&: 9) - evaluated by every thread, computing or not;
 *    7 integer operations per in-chip thread: the power-load test (4
 *     compares, 3 &&).
 * Shared-memory and global address arithmetic, loads, stores and barriers
 * are not counted, so this is a floor: the PTX nvcc 13 -O2 makes of the
 * kernel for sm_90 (its loop for steps < 4) has 54 integer instructions
 * per thread, 13 per thread and step, 8 per in-chip thread, 2 per power
 * load, 19 per computed cell (shared addresses) and 6 per stored cell.
 */
#define OPS_CELL    14.0
#define OPS_THREAD  45.0
#define OPS_STEP    12.0
#define OPS_IN_CHIP  7.0

void simgpu_cost__Z15hotspot_pyramidPKfS0_Pfiiifffff(const simgpu_launch *l, double *flops,
						     double *bytes)
{
	int rows = SIMGPU_ARG(l, 3, int), cols = SIMGPU_ARG(l, 4, int);
	int steps = SIMGPU_ARG(l, 5, int);

	*flops = *bytes = 0;
	if (steps < 1 || steps > MAX_PYRAMID || rows < 1 || cols < 1 || l->block.x < 1 ||
	    l->block.y < 1)
		return;
	unsigned bdx = l->block.x < BLOCK ? l->block.x : BLOCK;
	unsigned bdy = l->block.y < BLOCK ? l->block.y : BLOCK;
	struct axis ax = axis_sums(l->grid.x, bdx, cols, steps);
	struct axis ay = axis_sums(l->grid.y, bdy, rows, steps);
	double z = l->grid.z;
	double threads = (double)l->grid.x * bdx * l->grid.y * bdy * z;
	double loads = ax.load * ay.load * z, computed = 0;
	for (int s = 0; s < steps; s++)
		computed += ax.comp[s] * ay.comp[s] * z;
	double powers = ax.comp[0] * ay.comp[0] * z;
	double stores = ax.comp[steps - 1] * ay.comp[steps - 1] * z;

	*flops = OPS_CELL * computed + threads * (OPS_THREAD + OPS_STEP * steps) +
		 OPS_IN_CHIP * loads;
	*bytes = (loads + powers + stores) * sizeof(float);
}
