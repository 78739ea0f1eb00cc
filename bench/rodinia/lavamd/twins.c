/* Host twin of bench/rodinia/lavamd (simgpu; see shim/simgpu/simgpu_twin.h).
 *
 * The twin runs the kernel's loops with the same pair function (pair.h) in
 * the same order, so it matches the CPU reference bit for bit and a GPU up
 * to FMA contraction and exp() rounding.
 *
 * Cost model (the conventions of bench/rodinia/lud/twins.c).  bytes: every
 * global load and store the kernel issues, no credit for caches.  flops: SM
 * time in FP32 flops: double arithmetic counts twice (an H100 SM does half
 * as many FP64 as FP32 operations per clock), exp(double) counts EXP (nvcc
 * 13 expands it to 14 double FMAs and an add: 29 double flops), and each
 * warp-wide shared-memory access counts WAVE = 256 (one clock of the SM's
 * 128-byte-per-clock shared-memory path).
 *
 * Per pair: 25 double flops + exp = 108, and 5 shared reads per warp (the
 * neighbour's {v, x, y, z} and charge, the same address for the whole warp,
 * so one wavefront each) = 40 per thread: 148 flops.
 *   --accum global: + 64 bytes (read and write of the particle's 4 sums;
 *     counted as useful bytes, though the 32-byte stride between particles
 *     moves whole sectors): 2.3 flops per byte, below even one SM's balance
 *     (500 GFLOP/s over its 101.3 GB/s pull = 4.9), so the kernel is
 *     bandwidth-bound and its time falls ever more slowly once the quota's
 *     SMs pull more than DRAM delivers (28 of 132 SMs pull 3350 / 1.179
 *     GB/s, DRAM's limit): memory-intensive.
 *   --accum reg: 64 bytes per particle and neighbour box instead, i.e.
 *     64 / P per pair: compute-bound.
 * Per neighbour box the block also loads 40 P bytes (positions, charges)
 * into shared memory and reads its index; the home box is loaded once.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "simgpu_twin.h"
#include "pair.h"

#define WAVE 256.0      /* flops per warp-wide shared-memory access */
#define EXP  58.0       /* flops per exp(double) */

/* __global__ void lavamd_kernel(const int *nn, const int *nei, const double *rv,
 *                               const double *qv, double *fv, int par, double a2,
 *                               int global_acc)  <<<boxes, threads, 72 * par>>> */
void simgpu_twin__Z13lavamd_kernelPKiS0_PKdS2_Pdidi(const simgpu_launch *l)
{
	const int *nn = SIMGPU_ARG(l, 0, const int *), *nei = SIMGPU_ARG(l, 1, const int *);
	const double *rv = SIMGPU_ARG(l, 2, const double *), *qv = SIMGPU_ARG(l, 3, const double *);
	double *fv = SIMGPU_ARG(l, 4, double *);
	int par = SIMGPU_ARG(l, 5, int), global_acc = SIMGPU_ARG(l, 7, int);
	double a2 = SIMGPU_ARG(l, 6, double);

	for (unsigned home = 0; home < l->grid.x; home++)
		for (int k = 0; k < nn[home]; k++) {
			size_t nb = (size_t)nei[home * LAVA_NEI + k] * par;
			for (int i = 0; i < par; i++) {
				size_t pi = (size_t)home * par + i;
				double *f = fv + 4 * pi, s[4] = {0, 0, 0, 0}, c[4];
				for (int j = 0; j < par; j++) {
					lava_pair(rv + 4 * pi, rv + 4 * (nb + j), qv[nb + j], a2, c);
					for (int m = 0; m < 4; m++) {
						if (global_acc)
							f[m] = f[m] + c[m];
						else
							s[m] = s[m] + c[m];
					}
				}
				if (!global_acc)
					for (int m = 0; m < 4; m++)
						f[m] = f[m] + s[m];
			}
		}
}

/* Reads the neighbour counts through the nn argument: the pairs a launch
 * computes depend on them. */
void simgpu_cost__Z13lavamd_kernelPKiS0_PKdS2_Pdidi(const simgpu_launch *l, double *flops,
						    double *bytes)
{
	const int *nn = SIMGPU_ARG(l, 0, const int *);
	double p = SIMGPU_ARG(l, 5, int);
	int global_acc = SIMGPU_ARG(l, 7, int);
	double warps_i = (double)((SIMGPU_ARG(l, 5, int) + 31) / 32);   /* warps over P */
	double boxes = 0, pairs_f = 0, pairs_b = 0, stage_f = 0, stage_b = 0;

	for (unsigned home = 0; home < l->grid.x; home++)
		boxes += nn[home];
	/* arithmetic per thread-pair, shared reads per warp-pair */
	pairs_f = boxes * (p * p * (2.0 * LAVA_PAIR_DFLOPS + EXP) + warps_i * p * 5 * WAVE);
	pairs_b = global_acc ? boxes * p * p * 64.0 : boxes * p * 64.0;
	/* staging: 5 P doubles per neighbour box (2 wavefronts per 32), 4 P home */
	stage_f = (boxes * 5 * p + l->grid.x * 4 * p) / 32 * 2 * WAVE;
	stage_b = boxes * (40 * p + 4) + l->grid.x * (32 * p + 4);
	*flops = pairs_f + stage_f;
	*bytes = pairs_b + stage_b;
}
