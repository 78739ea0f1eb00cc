/* Host twins of bench/rodinia/pathfinder (simgpu; see shim/simgpu/simgpu_twin.h).
 *
 * Blocks share nothing but the src row they read and write disjoint
 * columns of dst, so running them one after the other, each with its own
 * prev/result rows as shared memory, gives exactly the GPU's result.
 *
 * Cost, from the launch shape and arguments alone: the global-memory
 * sectors (32 bytes, the unit L2 and DRAM move) each block requests - its
 * src window, per row the wall cells it computes, the dst columns it
 * writes, all runs of consecutive ints - and the integer operations, 2 min
 * + 1 add per computed cell.  Neighbouring blocks overlap by 2P columns and
 * both fetch and compute them: that is the price of the ghost zone, and it
 * counts twice (the model's bandwidth stands for the whole path between
 * the SMs and memory; L2 hits are not cheaper in it).
 */
#include <stdlib.h>
#include "simgpu_twin.h"

#define BLOCK_SIZE 256
#define HALO 1
#define SECTOR 32

#define IN_RANGE(x, lo, hi) ((x) >= (lo) && (x) <= (hi))

static inline int imin(int a, int b) { return a < b ? a : b; }
static inline int imax(int a, int b) { return a > b ? a : b; }

/* One block's geometry, as the kernel derives it. */
struct blk {
	int x0;                  /* grid column of thread 0 */
	int vmin, vmax;          /* threads inside the grid */
};

static struct blk block_at(unsigned bx, int iters, int cols, int border)
{
	struct blk b;
	int small_cols = BLOCK_SIZE - iters * HALO * 2;
	int xmax;

	b.x0 = small_cols * (int)bx - border;
	xmax = b.x0 + BLOCK_SIZE - 1;
	b.vmin = b.x0 < 0 ? -b.x0 : 0;
	b.vmax = xmax > cols - 1 ? BLOCK_SIZE - 1 - (xmax - cols + 1) : BLOCK_SIZE - 1;
	return b;
}

/* __global__ void dynproc_kernel(int iters, const int *wall, const int *src, int *dst,
 *                                int cols, int start_row, int border) */
void simgpu_twin__Z14dynproc_kerneliPKiS0_Piiii(const simgpu_launch *l)
{
	int iters = SIMGPU_ARG(l, 0, int);
	const int *wall = SIMGPU_ARG(l, 1, const int *);
	const int *src = SIMGPU_ARG(l, 2, const int *);
	int *dst = SIMGPU_ARG(l, 3, int *);
	int cols = SIMGPU_ARG(l, 4, int), start_row = SIMGPU_ARG(l, 5, int);
	int border = SIMGPU_ARG(l, 6, int);
	int nt = (int)(l->block.x < BLOCK_SIZE ? l->block.x : BLOCK_SIZE);
	int prev[BLOCK_SIZE], result[BLOCK_SIZE];

	if (iters <= 0)
		return;
	for (unsigned bx = 0; bx < l->grid.x; bx++) {
		struct blk b = block_at(bx, iters, cols, border);
		/* the threads that can ever compute: inside the grid and the block */
		int lo = imax(b.vmin, 1), hi = imin(b.vmax, imin(nt - 1, BLOCK_SIZE - 2));

		if (lo > hi)
			continue;
		for (int tx = lo - 1; tx <= hi + 1; tx++)
			if (tx >= 0 && tx < nt && IN_RANGE(b.x0 + tx, 0, cols - 1))
				prev[tx] = src[b.x0 + tx];
		int clo = lo, chi = hi;      /* last row's computed threads */
		for (int i = 0; i < iters; i++) {
			clo = imax(lo, i + 1);
			chi = imin(hi, BLOCK_SIZE - i - 2);
			const int *wr = wall + (long)(start_row + i) * cols + b.x0;
			for (int tx = clo; tx <= chi; tx++) {
				int w = imax(tx - 1, b.vmin), e = imin(tx + 1, b.vmax);
				int m = imin(prev[w], imin(prev[tx], prev[e]));
				result[tx] = m + wr[tx];
			}
			if (i == iters - 1)
				break;
			for (int tx = clo; tx <= chi; tx++)
				prev[tx] = result[tx];
		}
		for (int tx = clo; tx <= chi; tx++)
			dst[b.x0 + tx] = result[tx];
	}
}

/* Sectors spanned by the ints [c0, c1] of a row starting at int offset row0. */
static double span_ints(long row0, long c0, long c1)
{
	if (c1 < c0)
		return 0;
	long s0 = (row0 + c0) * 4 / SECTOR, s1 = ((row0 + c1) * 4 + 3) / SECTOR;
	return (double)(s1 - s0 + 1) * SECTOR;
}

void simgpu_cost__Z14dynproc_kerneliPKiS0_Piiii(const simgpu_launch *l, double *flops,
						 double *bytes)
{
	int iters = SIMGPU_ARG(l, 0, int);
	int cols = SIMGPU_ARG(l, 4, int), start_row = SIMGPU_ARG(l, 5, int);
	int border = SIMGPU_ARG(l, 6, int);
	int nt = (int)(l->block.x < BLOCK_SIZE ? l->block.x : BLOCK_SIZE);
	double ops = 0, b = 0;

	*flops = *bytes = 0;
	if (iters <= 0 || nt <= 0)
		return;
	for (unsigned bx = 0; bx < l->grid.x; bx++) {
		struct blk k = block_at(bx, iters, cols, border);
		int lo = imax(k.vmin, 1), hi = imin(k.vmax, imin(nt - 1, BLOCK_SIZE - 2));
		int clo = 0, chi = -1;

		if (lo > hi)
			continue;
		b += span_ints(0, k.x0 + imax(k.vmin, 0), k.x0 + imin(k.vmax, nt - 1));   /* src */
		for (int i = 0; i < iters; i++) {
			clo = imax(lo, i + 1);
			chi = imin(hi, BLOCK_SIZE - i - 2);
			if (chi < clo)
				break;
			ops += 3.0 * (chi - clo + 1);
			b += span_ints((long)(start_row + i) * cols, k.x0 + clo, k.x0 + chi); /* wall */
		}
		if (chi >= clo)
			b += span_ints(0, k.x0 + clo, k.x0 + chi);                          /* dst */
	}
	*flops = ops * l->grid.y * l->grid.z;
	*bytes = b * l->grid.y * l->grid.z;
}
