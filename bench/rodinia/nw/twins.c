/* Host twins of bench/rodinia/nw (simgpu; see shim/simgpu/simgpu_twin.h).
 *
 * The blocks of one launch lie on one anti-diagonal of 16x16 blocks: each
 * reads only the row above and the column left of it (written by earlier
 * launches) and writes only its own cells.  Filling a block row by row
 * respects the recurrence's dependencies as the kernel's in-block
 * wavefront does, and max/+/- on ints is exact: the same matrix results.
 *
 * Cost, from the launch shape and arguments alone: the global-memory
 * sectors (32 bytes, the unit L2 and DRAM move) each block requests, and
 * the integer operations.  Per block: 16 rows of the reference tile and
 * the corner plus the row above (runs of 16 and 17 ints, whatever sectors
 * they span: a row is N+1 ints, so runs start unaligned), the column left
 * of it (16 ints in 16 rows: 16 sectors) and 16 written runs of 16 ints;
 * per cell 3 adds and 2 max.  A sector two blocks both request counts
 * twice (the model's bandwidth stands for the whole path between the SMs
 * and memory; L2 hits are not cheaper in it).
 */
#include "simgpu_twin.h"

#define BLOCK_SIZE 16
#define SECTOR 32

static inline int max3(int a, int b, int c)
{
	int m = a > b ? a : b;
	return m > c ? m : c;
}

static void nw_block(const int *ref, int *score, int cols, int penalty, int x0, int y0)
{
	for (int i = y0 + 1; i <= y0 + BLOCK_SIZE; i++) {
		int *row = score + (long)i * cols, *up = row - cols;
		const int *rr = ref + (long)i * cols;
		for (int j = x0 + 1; j <= x0 + BLOCK_SIZE; j++)
			row[j] = max3(up[j - 1] + rr[j], row[j - 1] - penalty, up[j] - penalty);
	}
}

/* Sectors spanned by n ints from int offset off. */
static double run_bytes(long off, long n)
{
	return (double)(((off + n) * 4 - 1) / SECTOR - off * 4 / SECTOR + 1) * SECTOR;
}

static void block_cost(int cols, int x0, int y0, double *flops, double *bytes)
{
	double b = run_bytes((long)y0 * cols + x0, BLOCK_SIZE + 1);        /* corner + row above */
	b += BLOCK_SIZE * SECTOR;                                            /* column left */
	for (int ty = 0; ty < BLOCK_SIZE; ty++) {
		long off = (long)(y0 + 1 + ty) * cols + x0 + 1;
		b += 2 * run_bytes(off, BLOCK_SIZE);                         /* ref in, score out */
	}
	*flops += 5.0 * BLOCK_SIZE * BLOCK_SIZE;
	*bytes += b;
}

/* __global__ void nw_upper(const int *ref, int *score, int cols, int penalty, int diag)
 * Block bx is block (bx, diag - 1 - bx) of the matrix. */
void simgpu_twin__Z8nw_upperPKiPiiii(const simgpu_launch *l)
{
	const int *ref = SIMGPU_ARG(l, 0, const int *);
	int *score = SIMGPU_ARG(l, 1, int *);
	int cols = SIMGPU_ARG(l, 2, int), penalty = SIMGPU_ARG(l, 3, int);
	int diag = SIMGPU_ARG(l, 4, int);

	for (unsigned bx = 0; bx < l->grid.x; bx++)
		nw_block(ref, score, cols, penalty, (int)bx * BLOCK_SIZE,
			 (diag - 1 - (int)bx) * BLOCK_SIZE);
}

void simgpu_cost__Z8nw_upperPKiPiiii(const simgpu_launch *l, double *flops, double *bytes)
{
	int cols = SIMGPU_ARG(l, 2, int), diag = SIMGPU_ARG(l, 4, int);

	*flops = *bytes = 0;
	for (unsigned bx = 0; bx < l->grid.x; bx++)
		block_cost(cols, (int)bx * BLOCK_SIZE, (diag - 1 - (int)bx) * BLOCK_SIZE, flops,
			   bytes);
}

/* __global__ void nw_lower(const int *ref, int *score, int cols, int penalty, int diag,
 *                          int nblk)
 * Block bx is block (bx + nblk - diag, nblk - 1 - bx) of the matrix. */
void simgpu_twin__Z8nw_lowerPKiPiiiii(const simgpu_launch *l)
{
	const int *ref = SIMGPU_ARG(l, 0, const int *);
	int *score = SIMGPU_ARG(l, 1, int *);
	int cols = SIMGPU_ARG(l, 2, int), penalty = SIMGPU_ARG(l, 3, int);
	int diag = SIMGPU_ARG(l, 4, int), nblk = SIMGPU_ARG(l, 5, int);

	for (unsigned bx = 0; bx < l->grid.x; bx++)
		nw_block(ref, score, cols, penalty, ((int)bx + nblk - diag) * BLOCK_SIZE,
			 (nblk - 1 - (int)bx) * BLOCK_SIZE);
}

void simgpu_cost__Z8nw_lowerPKiPiiiii(const simgpu_launch *l, double *flops, double *bytes)
{
	int cols = SIMGPU_ARG(l, 2, int);
	int diag = SIMGPU_ARG(l, 4, int), nblk = SIMGPU_ARG(l, 5, int);

	*flops = *bytes = 0;
	for (unsigned bx = 0; bx < l->grid.x; bx++)
		block_cost(cols, ((int)bx + nblk - diag) * BLOCK_SIZE,
			   (nblk - 1 - (int)bx) * BLOCK_SIZE, flops, bytes);
}
