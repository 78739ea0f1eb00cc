/* Host twins of bench/rodinia/lud (simgpu; see shim/simgpu/simgpu_twin.h).
 *
 * Each twin does the float operations of its kernel in the kernel's order
 * (the kernels spell them __fmul_rn/__fsub_rn/__fdiv_rn, so nvcc fuses
 * nothing), so that its result is the GPU's bit for bit (by construction;
 * not yet compared on a GPU).  Keep the C compiler from fusing them too.
 *
 * Cost model.  bytes: every global load and store the kernel issues, with
 * no credit for caches (hotspot's convention).  flops: SM time, in FP32
 * flops.  simgpu has one SM rate (SIMGPU_SM_GFLOPS, an H100 SM's 128 FP32
 * lanes x 2 flops per clock), but LUD's kernels spend most of their SM time
 * in shared memory, not in arithmetic: one shared-memory access of a warp
 * (conflict-free, or a broadcast) occupies the SM's 128-byte-per-clock
 * shared-memory path for one clock, the time of 256 FP32 flops, whatever
 * number of its lanes are active.  So each warp-wide shared access (a
 * "wavefront") counts as WAVE flops, added to the arithmetic (the two pipes
 * overlap a little; adding them keeps the count simple).  A float division
 * counts as FDIV flops (nvcc's IEEE division: a reciprocal and a few FMAs).
 * Index arithmetic is not counted.
 *
 * With that, lud_internal does 34 wavefronts per warp (2 tile stores, 2 x 16
 * reads) and 32 flops per thread against 16 bytes: ~19 flops per byte, at
 * the device's balance point (132 x 500 GFLOP/s over 3350 GB/s = 19.7;
 * 23 over what DRAM delivers, 3350 / 1.179), so its time keeps falling as
 * the SM quota grows, if less than pure compute's near 100 %, where DRAM
 * starts to bind: compute-intensive, as C-Laius classifies LUD.  lud_diagonal (one block) and lud_perimeter (32
 * threads per block) use few SMs whatever the quota.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <string.h>

#include "simgpu_twin.h"

#define BS    16        /* the kernels' tile edge */
#define WAVE  256.0     /* flops per warp-wide shared-memory access */
#define FDIV  8.0       /* flops per float division */

/* __global__ void lud_diagonal(float *a, int n, int d)  <<<1, 16>>> */
void simgpu_twin__Z12lud_diagonalPfii(const simgpu_launch *l)
{
	float *a = SIMGPU_ARG(l, 0, float *);
	int n = SIMGPU_ARG(l, 1, int), d = SIMGPU_ARG(l, 2, int);
	float t[BS][BS];

	for (int r = 0; r < BS; r++)
		memcpy(t[r], a + (size_t)(d + r) * n + d, sizeof(t[r]));
	for (int k = 0; k < BS - 1; k++)
		for (int r = k + 1; r < BS; r++) {
			float lk = t[r][k] / t[k][k];
			t[r][k] = lk;
			for (int j = k + 1; j < BS; j++)
				t[r][j] = t[r][j] - lk * t[k][j];
		}
	for (int r = 0; r < BS; r++)
		memcpy(a + (size_t)(d + r) * n + d, t[r], sizeof(t[r]));
}

/* One warp.  Per k < 15, the 15-k threads below k: a division, then 15-k
 * multiply-subtracts; shared: 3 accesses for the division, 3 per
 * multiply-subtract; staging 16 + 16.  Global: 256 loads, 256 stores. */
void simgpu_cost__Z12lud_diagonalPfii(const simgpu_launch *l, double *flops, double *bytes)
{
	double ar = 0, wf = 32, blocks = (double)l->grid.x * l->grid.y * l->grid.z;

	for (int k = 0; k < BS - 1; k++) {
		ar += (BS - 1 - k) * (FDIV + 2.0 * (BS - 1 - k));
		wf += 3 + 3 * (BS - 1 - k);
	}
	*flops = blocks * (ar + wf * WAVE);
	*bytes = blocks * 2.0 * BS * BS * sizeof(float);
}

/* __global__ void lud_perimeter(float *a, int n, int d)  <<<rest, 32>>> */
void simgpu_twin__Z13lud_perimeterPfii(const simgpu_launch *l)
{
	float *a = SIMGPU_ARG(l, 0, float *);
	int n = SIMGPU_ARG(l, 1, int), d = SIMGPU_ARG(l, 2, int);
	float dg[BS][BS], ut[BS][BS], lt[BS][BS];

	for (int r = 0; r < BS; r++)
		memcpy(dg[r], a + (size_t)(d + r) * n + d, sizeof(dg[r]));
	for (unsigned b = 0; b < l->grid.x; b++) {
		int c0 = d + (int)(b + 1) * BS;
		for (int r = 0; r < BS; r++) {
			memcpy(ut[r], a + (size_t)(d + r) * n + c0, sizeof(ut[r]));
			memcpy(lt[r], a + (size_t)(c0 + r) * n + d, sizeof(lt[r]));
		}
		for (int c = 0; c < BS; c++)            /* threads 0..15 */
			for (int i = 1; i < BS; i++) {
				float acc = ut[i][c];
				for (int k = 0; k < i; k++)
					acc = acc - dg[i][k] * ut[k][c];
				ut[i][c] = acc;
			}
		for (int r = 0; r < BS; r++)            /* threads 16..31 */
			for (int j = 0; j < BS; j++) {
				float acc = lt[r][j];
				for (int k = 0; k < j; k++)
					acc = acc - lt[r][k] * dg[k][j];
				lt[r][j] = acc / dg[j][j];
			}
		for (int r = 0; r < BS; r++) {
			memcpy(a + (size_t)(d + r) * n + c0, ut[r], sizeof(ut[r]));
			memcpy(a + (size_t)(c0 + r) * n + d, lt[r], sizeof(lt[r]));
		}
	}
}

/* One warp per block whose halves diverge (so their accesses add up).
 * U half: per row i, 1 read, i x (2 reads, mul, sub), 1 write.  L half: per
 * column j, 1 read, j x (2 reads, mul, sub), pivot read, division, 1 write.
 * Staging: 768 loads (24 wavefronts), 512 stores (16).  Global: 3 tiles
 * read, 2 written. */
void simgpu_cost__Z13lud_perimeterPfii(const simgpu_launch *l, double *flops, double *bytes)
{
	double ar = 0, wf = 24 + 16, blocks = (double)l->grid.x * l->grid.y * l->grid.z;

	for (int i = 1; i < BS; i++) {
		ar += BS * 2.0 * i;
		wf += 2 + 2 * i;
	}
	for (int j = 0; j < BS; j++) {
		ar += BS * (2.0 * j + FDIV);
		wf += 3 + 2 * j;
	}
	*flops = blocks * (ar + wf * WAVE);
	*bytes = blocks * 5.0 * BS * BS * sizeof(float);
}

/* __global__ void lud_internal(float *a, int n, int d)  <<<(rest, rest), (16, 16)>>>
 * Row by row of the trailing matrix, in chunks of columns, k outside c:
 * each element still sums its 16 products from k = 0 up, as its GPU
 * thread does, then subtracts the sum once. */
void simgpu_twin__Z12lud_internalPfii(const simgpu_launch *l)
{
	float *a = SIMGPU_ARG(l, 0, float *);
	int n = SIMGPU_ARG(l, 1, int), d = SIMGPU_ARG(l, 2, int);
	int cols = (int)l->grid.x * BS, rows = (int)l->grid.y * BS;
	float sum[1024];

	for (int r = 0; r < rows; r++) {
		float *ar = a + (size_t)(d + BS + r) * n + d;
		for (int c0 = 0; c0 < cols; c0 += 1024) {
			int w = cols - c0 < 1024 ? cols - c0 : 1024;
			memset(sum, 0, sizeof(float) * w);
			for (int k = 0; k < BS; k++) {
				float lk = ar[k];
				const float *uk = a + (size_t)(d + k) * n + d + BS + c0;
				for (int c = 0; c < w; c++)
					sum[c] = sum[c] + lk * uk[c];
			}
			for (int c = 0; c < w; c++)
				ar[BS + c0 + c] = ar[BS + c0 + c] - sum[c];
		}
	}
}

/* Per thread 16 multiply-adds and 4 global accesses (two tile loads, the
 * element's read and write); per warp 2 shared stores and 32 reads (the L
 * value is a broadcast, the U row conflict-free). */
void simgpu_cost__Z12lud_internalPfii(const simgpu_launch *l, double *flops, double *bytes)
{
	double blocks = (double)l->grid.x * l->grid.y * l->grid.z;
	double threads = BS * BS, warps = threads / 32;

	*flops = blocks * (threads * 2.0 * BS + warps * (2 + 2 * BS) * WAVE);
	*bytes = blocks * threads * 4.0 * sizeof(float);
}
