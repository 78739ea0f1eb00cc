// hotspot: Rodinia-style 2D transient thermal simulation of a chip.
//
//   hotspot [--size N] [--iters K] [--pyramid P] [--repeat R] [--duration SEC] [--check]
//
// A square N x N grid of cell temperatures (K) and dissipated power (W),
// default 512 x 512 (Rodinia's temp_512/power_512 input).  Every time step
// computes each cell's new temperature from its 4 neighbours (edge cells use
// themselves for missing neighbours), its power and the ambient temperature,
// with the RC model and constants of Rodinia's hotspot (Huang et al.,
// HotSpot; Che et al., Rodinia):
//
//   Cap = FACTOR_CHIP * SPEC_HEAT_SI * t_chip * gw * gh
//   Rx  = gw / (2 K_SI t_chip gh),  Ry = gh / (2 K_SI t_chip gw),
//   Rz  = t_chip / (K_SI gh gw),    step = PRECISION / max_slope,
//   max_slope = MAX_PD / (FACTOR_CHIP * t_chip * SPEC_HEAT_SI)
//   T' = T + step/Cap * ( P + (S + N - 2T)/Ry + (E + W - 2T)/Rx + (amb - T)/Rz )
//
// Temporal blocking ("pyramid", as Rodinia's hotspot; Meng & Skadron, ICS
// 2009): a launch does P time steps (default 2, the pyramid height of
// Rodinia's run script).  A block of 16x16 threads loads a 16x16 tile of
// temperatures into shared memory and steps it P times there; after step k
// only the tile's inner 16-2k cells per side are still right (each step
// needs its neighbours' previous values), so the block writes back the
// middle (16-2P)^2 cells and blocks overlap by 2P cells per axis.  The grid
// thus recomputes a halo of cells in exchange for P-1 fewer trips through
// global memory.  K steps take ceil(K/P) launches, the last one doing the
// remainder.  P = 1 runs the plain one-step kernel hotspot_step (16x16
// cells per block from an 18x18 tile), exactly as before the pyramid.
// Ping-pong buffers: a launch reads one and writes the other, never both,
// so any launch can safely be run twice.
//
// Each run re-uploads the initial temperatures and does the K steps again, so
// the result is always that of K steps; --repeat R runs R times, --duration
// SEC keeps running until SEC seconds passed (at least R runs).
// The kernels' float arithmetic is spelled with __fadd_rn/__fsub_rn/__fmul_rn
// so that nvcc does not contract it into FMAs: the CPU reference (plain
// step by step), the simgpu twins and the GPU then do the same IEEE float
// operations in the same order, and every P gives the same bits.
//
// --check also prints `CHECK fnv1a64=<hex>`, a hash of the output grid's
// bytes, so that runs on different routes can be compared bit for bit.
// The exit line `THROUGHPUT hotspot iters_per_s=<runs/s> iters=<runs>
// seconds=<s>` counts whole runs, as the other Rodinia apps do.
//
// CUDA calls per process: cudaMalloc x3, cudaMemcpy H2D power once, per run
// cudaMemcpy H2D temp + cudaMemset + ceil(K/P) launches, cudaDeviceSynchronize,
// cudaMemcpy D2H once, cudaFree x3.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *NAME = "hotspot";

#define BLOCK 16
#define TILE (BLOCK + 2)
#define MAX_PYRAMID 7     /* a block must still finish 16 - 2P >= 2 cells per axis */

/* Rodinia hotspot constants */
#define MAX_PD        (3.0e6)   /* max power density (W/m^3)            */
#define PRECISION     0.001     /* required precision (degrees)          */
#define SPEC_HEAT_SI  1.75e6
#define K_SI          100
#define FACTOR_CHIP   0.5       /* capacitance fitting factor           */
static const double t_chip = 0.0005, chip_height = 0.016, chip_width = 0.016;
static const double amb_temp = 80.0;

#include "progutil.h"

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// One iteration.  Block (16,16); grid (ceil(cols/16), ceil(rows/16)).
// Every thread of a block first helps load the block's 18x18 tile of src
// (clamped at the chip's edges) into shared memory, then the threads inside
// the chip compute their cell.
__global__ void hotspot_step(const float *power, const float *src, float *dst, int rows,
			     int cols, float step_div_cap, float rx_1, float ry_1, float rz_1,
			     float amb)
{
	__shared__ float tile[TILE][TILE];
	int tid = threadIdx.y * BLOCK + threadIdx.x;
	int y0 = (int)(blockIdx.y * BLOCK) - 1, x0 = (int)(blockIdx.x * BLOCK) - 1;
	for (int k = tid; k < TILE * TILE; k += BLOCK * BLOCK) {
		int ly = k / TILE, lx = k % TILE;
		int gy = min(max(y0 + ly, 0), rows - 1);
		int gx = min(max(x0 + lx, 0), cols - 1);
		tile[ly][lx] = src[gy * cols + gx];
	}
	__syncthreads();
	int r = blockIdx.y * BLOCK + threadIdx.y, c = blockIdx.x * BLOCK + threadIdx.x;
	if (r >= rows || c >= cols)
		return;
	int ty = threadIdx.y + 1, tx = threadIdx.x + 1;
	float t = tile[ty][tx];
	float t2 = __fmul_rn(2.0f, t);
	float ns = __fsub_rn(__fadd_rn(tile[ty + 1][tx], tile[ty - 1][tx]), t2);
	float ew = __fsub_rn(__fadd_rn(tile[ty][tx + 1], tile[ty][tx - 1]), t2);
	float sum = __fadd_rn(power[r * cols + c], __fmul_rn(ns, ry_1));
	sum = __fadd_rn(sum, __fmul_rn(ew, rx_1));
	sum = __fadd_rn(sum, __fmul_rn(__fsub_rn(amb, t), rz_1));
	dst[r * cols + c] = __fadd_rn(t, __fmul_rn(step_div_cap, sum));
}

// `steps` (1..MAX_PYRAMID) time steps.  Block (16,16); grid
// (ceil(cols/out), ceil(rows/out)) with out = 16 - 2*steps.  Thread (tx,ty)
// owns tile cell (ty,tx), chip cell (gy,gx); block b's tile starts at chip
// row/column b*out - steps.  Tile cells outside the chip are never loaded
// nor computed: an edge cell's missing neighbour is itself, through the
// neighbour indices clamped to the tile's part inside the chip.  Step k
// (0-based) computes the cells k+1 .. 14-k of each axis from the previous
// step's values, in the other half of the shared ping-pong buffer.
__global__ void hotspot_pyramid(const float *power, const float *src, float *dst, int rows,
				int cols, int steps, float step_div_cap, float rx_1, float ry_1,
				float rz_1, float amb)
{
	__shared__ float tile[2][BLOCK][BLOCK];
	int out = BLOCK - 2 * steps;
	int tx = threadIdx.x, ty = threadIdx.y;
	int y0 = (int)blockIdx.y * out - steps, x0 = (int)blockIdx.x * out - steps;
	int gy = y0 + ty, gx = x0 + tx;
	/* the tile's part inside the chip, in tile coordinates */
	int ymin = max(-y0, 0), ymax = min(rows - 1 - y0, BLOCK - 1);
	int xmin = max(-x0, 0), xmax = min(cols - 1 - x0, BLOCK - 1);
	bool in_chip = ty >= ymin && ty <= ymax && tx >= xmin && tx <= xmax;
	int idx = gy * cols + gx;
	float p = 0.0f;
	if (in_chip) {
		tile[0][ty][tx] = src[idx];
		/* only cells that step 0 computes need their power */
		if (ty >= 1 && ty <= BLOCK - 2 && tx >= 1 && tx <= BLOCK - 2)
			p = power[idx];
	}
	int n = max(ty - 1, ymin), s = min(ty + 1, ymax);
	int w = max(tx - 1, xmin), e = min(tx + 1, xmax);
	__syncthreads();
	int cur = 0;
	for (int k = 0; k < steps; k++) {
		if (in_chip && ty > k && ty < BLOCK - 1 - k && tx > k && tx < BLOCK - 1 - k) {
			float t = tile[cur][ty][tx];
			float t2 = __fmul_rn(2.0f, t);
			float ns = __fsub_rn(__fadd_rn(tile[cur][s][tx], tile[cur][n][tx]), t2);
			float ew = __fsub_rn(__fadd_rn(tile[cur][ty][e], tile[cur][ty][w]), t2);
			float sum = __fadd_rn(p, __fmul_rn(ns, ry_1));
			sum = __fadd_rn(sum, __fmul_rn(ew, rx_1));
			sum = __fadd_rn(sum, __fmul_rn(__fsub_rn(amb, t), rz_1));
			tile[1 - cur][ty][tx] = __fadd_rn(t, __fmul_rn(step_div_cap, sum));
		}
		__syncthreads();
		cur = 1 - cur;
	}
	/* the cells every step got right: the middle out x out */
	if (in_chip && ty >= steps && ty < BLOCK - steps && tx >= steps && tx < BLOCK - steps)
		dst[idx] = tile[cur][ty][tx];
}

// CPU reference: the same float operations in the same order (stores through
// volatile keep the host compiler from fusing them either).
static void cpu_step(const float *power, const float *src, float *dst, int rows, int cols,
		     float step_div_cap, float rx_1, float ry_1, float rz_1, float amb)
{
	for (int r = 0; r < rows; r++)
		for (int c = 0; c < cols; c++) {
			float t = src[r * cols + c];
			float s = src[clampi(r + 1, 0, rows - 1) * cols + c];
			float n = src[clampi(r - 1, 0, rows - 1) * cols + c];
			float e = src[r * cols + clampi(c + 1, 0, cols - 1)];
			float w = src[r * cols + clampi(c - 1, 0, cols - 1)];
			volatile float t2 = 2.0f * t;
			volatile float ns = s + n;
			ns = ns - t2;
			volatile float ew = e + w;
			ew = ew - t2;
			volatile float p = ns * ry_1, sum = power[r * cols + c] + p;
			p = ew * rx_1;
			sum = sum + p;
			volatile float d = amb - t;
			p = d * rz_1;
			sum = sum + p;
			p = step_div_cap * sum;
			dst[r * cols + c] = t + p;
		}
}

int main(int argc, char **argv)
{
	long long size = 512, iters = 20, pyramid = 2, repeat = 1;
	double duration = 0;
	int check = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--size"))
			size = arg_int(argc, argv, &i, 1, 16384);
		else if (!strcmp(argv[i], "--iters"))
			iters = arg_int(argc, argv, &i, 1, 1LL << 30);
		else if (!strcmp(argv[i], "--pyramid"))
			pyramid = arg_int(argc, argv, &i, 1, MAX_PYRAMID);
		else if (!strcmp(argv[i], "--repeat"))
			repeat = arg_int(argc, argv, &i, 1, 1LL << 30);
		else if (!strcmp(argv[i], "--duration"))
			duration = arg_seconds(argc, argv, &i);
		else if (!strcmp(argv[i], "--check"))
			check = 1;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: hotspot [--size N] [--iters K] [--pyramid P] [--repeat R] "
			       "[--duration SEC] [--check]\n");
			return 0;
		} else
			fail("unknown option %s%s", argv[i], "");
	}
	int rows = (int)size, cols = (int)size;
	size_t cells = (size_t)rows * cols, bytes = cells * sizeof(float);

	/* model constants, as in Rodinia's compute_tran_temp(), folded once */
	double gh = chip_height / rows, gw = chip_width / cols;
	double cap = FACTOR_CHIP * SPEC_HEAT_SI * t_chip * gw * gh;
	double rx = gw / (2.0 * K_SI * t_chip * gh);
	double ry = gh / (2.0 * K_SI * t_chip * gw);
	double rz = t_chip / (K_SI * gh * gw);
	double max_slope = MAX_PD / (FACTOR_CHIP * t_chip * SPEC_HEAT_SI);
	double step = PRECISION / max_slope;
	float step_div_cap = (float)(step / cap);
	float rx_1 = (float)(1.0 / rx), ry_1 = (float)(1.0 / ry), rz_1 = (float)(1.0 / rz);
	float amb = (float)amb_temp;

	/* initial state: temperatures 320..340 K, power with a few hot blocks;
	 * total power ~ 100 W over the chip, whatever the resolution */
	float *temp0 = (float *)malloc(bytes), *power = (float *)malloc(bytes);
	float *ref[2] = {(float *)malloc(bytes), (float *)malloc(bytes)};
	float *out = (float *)malloc(bytes);
	if (!temp0 || !power || !ref[0] || !ref[1] || !out)
		fail("host malloc of %s%s failed", "5 grids", "");
	unsigned s = 12345u;
	double per_cell = 100.0 / (double)cells;
	for (size_t i = 0; i < cells; i++) {
		s = s * 1664525u + 1013904223u;
		int r = (int)(i / cols), c = (int)(i % cols);
		temp0[i] = 320.0f + (float)(s >> 8) * (20.0f / 16777216.0f);
		int hot = ((r * 8 / rows) + (c * 8 / cols)) % 5 == 0;
		power[i] = (float)(per_cell * (hot ? 4.0 : 0.25) * (0.5 + (s & 255) / 256.0));
	}

	unsigned long long launches = 0, h2d = 0, d2h = 0;
	float *dpower, *dt[2];
	CK(cudaMalloc((void **)&dpower, bytes));
	CK(cudaMalloc((void **)&dt[0], bytes));
	CK(cudaMalloc((void **)&dt[1], bytes));
	CK(cudaMemcpy(dpower, power, bytes, cudaMemcpyHostToDevice));
	h2d += bytes;

	dim3 block(BLOCK, BLOCK), grid((cols + BLOCK - 1) / BLOCK, (rows + BLOCK - 1) / BLOCK);
	int cur = 0;
	long long runs = 0;
	double t0 = now_s();
	while (runs < repeat || (duration > 0 && now_s() - t0 < duration)) {
		CK(cudaMemcpy(dt[0], temp0, bytes, cudaMemcpyHostToDevice));
		h2d += bytes;
		CK(cudaMemset(dt[1], 0, bytes));
		cur = 0;
		for (long long it = 0; it < iters; it += pyramid) {
			if (pyramid == 1) {
				hotspot_step<<<grid, block>>>(dpower, dt[cur], dt[1 - cur], rows, cols,
							      step_div_cap, rx_1, ry_1, rz_1, amb);
			} else {
				int steps = (int)(iters - it < pyramid ? iters - it : pyramid);
				int out = BLOCK - 2 * steps;
				dim3 pgrid((cols + out - 1) / out, (rows + out - 1) / out);
				hotspot_pyramid<<<pgrid, block>>>(dpower, dt[cur], dt[1 - cur], rows,
								  cols, steps, step_div_cap, rx_1,
								  ry_1, rz_1, amb);
			}
			launches++;
			CK(cudaGetLastError());
			cur = 1 - cur;
		}
		runs++;
	}
	CK(cudaDeviceSynchronize());
	double elapsed = now_s() - t0;
	CK(cudaMemcpy(out, dt[cur], bytes, cudaMemcpyDeviceToHost));
	d2h += bytes;
	CK(cudaFree(dpower));
	CK(cudaFree(dt[0]));
	CK(cudaFree(dt[1]));
	CK(cudaDeviceSynchronize());

	memcpy(ref[0], temp0, bytes);
	int rc = 0;
	for (long long it = 0; it < iters; it++, rc = 1 - rc)
		cpu_step(power, ref[rc], ref[1 - rc], rows, cols, step_div_cap, rx_1, ry_1, rz_1,
			 amb);
	double max_err = 0, tmin = 1e30, tmax = -1e30;
	size_t bad = 0, worst = 0;
	const double tol = 1e-3; /* Rodinia's PRECISION, in kelvin */
	for (size_t i = 0; i < cells; i++) {
		double err = fabs((double)out[i] - (double)ref[rc][i]);
		if (!(err <= tol))    /* NaN counts as wrong */
			bad++;
		if (!(err <= max_err)) {
			max_err = err;
			worst = i;
		}
		if (out[i] < tmin) tmin = out[i];
		if (out[i] > tmax) tmax = out[i];
	}
	double total_iters = (double)iters * (double)runs;
	printf("HOTSPOT size=%lld iters=%lld pyramid=%lld repeat=%lld elapsed_s=%.6f "
	       "iters_per_s=%.1f max_err=%.3g temp_min=%.4f temp_max=%.4f\n",
	       size, iters, pyramid, runs, elapsed, elapsed > 0 ? total_iters / elapsed : 0.0,
	       max_err, tmin, tmax);
	printf("STATS launches=%llu h2d_bytes=%llu d2h_bytes=%llu\n", launches, h2d, d2h);
	print_throughput(runs, elapsed);
	if (check) {
		/* FNV-1a over the output grid's bytes */
		unsigned long long hsh = fnv1a64(FNV1A64_INIT, out, bytes);
		printf("CHECK fnv1a64=%016llx\n", hsh);
	}
	if (bad) {
		printf("FAIL %s %zu of %zu cells off by more than %g K (max_err %.3g at %zu: got "
		       "%.6f want %.6f)\n",
		       NAME, bad, cells, tol, max_err, worst, out[worst], ref[rc][worst]);
		return 1;
	}
	printf("PASS %s size=%lld iters=%lld repeat=%lld max_err=%.3g iters_per_s=%.1f\n", NAME,
	       size, iters, runs, max_err, elapsed > 0 ? total_iters / elapsed : 0.0);
	free(temp0);
	free(power);
	free(ref[0]);
	free(ref[1]);
	free(out);
	return 0;
}
