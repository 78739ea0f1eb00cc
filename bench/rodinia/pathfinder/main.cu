// pathfinder: Rodinia-style dynamic programming on a 2D grid, pyramid kernel.
//
//   pathfinder [--cols C] [--rows R] [--pyramid P] [--seed S]
//              [--repeat N] [--duration SEC] [--check]
//   (--size is an alias of --cols)
//
// A grid of R rows x C columns of weights 0..9 (seeded splitmix64; default
// 100000 x 100 with P = 20, Rodinia's `pathfinder 100000 100 20`).  A path
// goes down one row per step, to the same column or a neighbouring one; the
// result is, for every column of the last row, the smallest total weight of
// a path ending there:
//
//   dst[c] = wall[r][c] + min(src[c-1], src[c], src[c+1])   (missing ones skipped)
//
// The GPU computes P rows per launch (Rodinia's ghost-zone "pyramid", Che et
// al., IISWC 2009; Meng & Skadron, ICS 2009): a block of 256 threads loads
// 256 consecutive columns of the current row into shared memory and steps
// P rows down in shared memory, its valid part shrinking by one column on
// each side per row; only the 256 - 2P columns in its middle are written
// back.  Blocks overlap by 2P columns, so the grid redoes some work to save
// P - 1 trips through global memory.  Columns outside the grid clamp to the
// edge (a path cannot leave it).  Integer weights: the check is exact.
//
// One run (repeated --repeat N times, or until --duration SEC passed):
// cudaMemcpy H2D the first row, ceil((R-1)/P) launches ping-ponging two row
// buffers, cudaMemcpy D2H the last row.  Rows 1..R-1 (the "wall") are
// uploaded once.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *NAME = "pathfinder";

#include "progutil.h"

#define BLOCK_SIZE 256
#define HALO 1

#define IN_RANGE(x, lo, hi) ((x) >= (lo) && (x) <= (hi))

// Rows start_row+1 .. start_row+iters of the grid from row start_row (src).
// wall holds rows 1..R-1: grid row r is wall row r-1.  border = P * HALO, the
// columns the grid's blocks are shifted left by; iters <= P.
__global__ void dynproc_kernel(int iters, const int *wall, const int *src, int *dst, int cols,
			       int start_row, int border)
{
	__shared__ int prev[BLOCK_SIZE];
	__shared__ int result[BLOCK_SIZE];
	int tx = threadIdx.x;
	int small_cols = BLOCK_SIZE - iters * HALO * 2;   /* columns a block finishes */
	int blk_x = small_cols * blockIdx.x - border;      /* its first loaded column */
	int blk_xmax = blk_x + BLOCK_SIZE - 1;
	int x = blk_x + tx;
	/* the block's part inside the grid, in thread numbers */
	int valid_min = blk_x < 0 ? -blk_x : 0;
	int valid_max = blk_xmax > cols - 1 ? BLOCK_SIZE - 1 - (blk_xmax - cols + 1) : BLOCK_SIZE - 1;
	int w = tx - 1 < valid_min ? valid_min : tx - 1;
	int e = tx + 1 > valid_max ? valid_max : tx + 1;
	bool valid = IN_RANGE(tx, valid_min, valid_max);

	if (IN_RANGE(x, 0, cols - 1))
		prev[tx] = src[x];
	__syncthreads();
	bool computed = false;
	for (int i = 0; i < iters; i++) {
		computed = false;
		/* row i+1 of the pyramid: one column less on each side */
		if (IN_RANGE(tx, i + 1, BLOCK_SIZE - i - 2) && valid) {
			computed = true;
			int m = min(prev[w], min(prev[tx], prev[e]));
			result[tx] = m + wall[(start_row + i) * cols + x];
		}
		__syncthreads();
		if (i == iters - 1)
			break;
		if (computed)
			prev[tx] = result[tx];
		__syncthreads();
	}
	if (computed)
		dst[x] = result[tx];
}

static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

int main(int argc, char **argv)
{
	long long cols = 100000, rows = 100, pyramid = 20, seed = 1, repeat = 1;
	double duration = 0;
	int check = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--cols") || !strcmp(argv[i], "--size"))
			cols = arg_int(argc, argv, &i, 1, 1LL << 28);
		else if (!strcmp(argv[i], "--rows"))
			rows = arg_int(argc, argv, &i, 2, 1LL << 20);
		else if (!strcmp(argv[i], "--pyramid"))
			pyramid = arg_int(argc, argv, &i, 1, BLOCK_SIZE / 2 - 1);
		else if (!strcmp(argv[i], "--seed"))
			seed = arg_int(argc, argv, &i, 0, 1LL << 62);
		else if (!strcmp(argv[i], "--repeat"))
			repeat = arg_int(argc, argv, &i, 1, 1LL << 30);
		else if (!strcmp(argv[i], "--duration"))
			duration = arg_seconds(argc, argv, &i);
		else if (!strcmp(argv[i], "--check"))
			check = 1;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: pathfinder [--cols C] [--rows R] [--pyramid P] [--seed S] "
			       "[--repeat N] [--duration SEC] [--check]\n");
			return 0;
		} else
			fail("unknown option %s%s", argv[i], "");
	}
	if ((double)cols * rows > 1.0 * (1LL << 31))
		fail("grid of %s x %s cells is too big", "cols", "rows");
	int C = (int)cols, R = (int)rows, P = (int)pyramid;
	size_t cells = (size_t)C * R, rowb = (size_t)C * sizeof(int);
	int *data = (int *)malloc(cells * sizeof(int)), *out = (int *)malloc(rowb);
	if (!data || !out)
		fail("host malloc of %s%s failed", "the grid", "");
	uint64_t s = (uint64_t)seed;
	for (size_t i = 0; i < cells; i++)
		data[i] = (int)(splitmix64(&s) % 10);

	unsigned long long launches = 0, h2d = 0, d2h = 0;
	int *dwall, *drow[2];
	size_t wallb = (size_t)(R - 1) * rowb;
	CK(cudaMalloc((void **)&dwall, wallb));
	CK(cudaMalloc((void **)&drow[0], rowb));
	CK(cudaMalloc((void **)&drow[1], rowb));
	CK(cudaMemcpy(dwall, data + C, wallb, cudaMemcpyHostToDevice));
	h2d += wallb;

	int border = P * HALO, small_cols = BLOCK_SIZE - P * HALO * 2;
	dim3 grid((C + small_cols - 1) / small_cols), block(BLOCK_SIZE);
	long long runs = 0;
	int cur = 0;
	double t0 = now_s();
	while (runs < repeat || (duration > 0 && now_s() - t0 < duration)) {
		CK(cudaMemcpy(drow[0], data, rowb, cudaMemcpyHostToDevice));
		h2d += rowb;
		cur = 0;
		for (int t = 0; t < R - 1; t += P) {
			int iters = P < R - 1 - t ? P : R - 1 - t;
			dynproc_kernel<<<grid, block>>>(iters, dwall, drow[cur], drow[1 - cur], C, t,
							border);
			CK(cudaGetLastError());
			launches++;
			cur = 1 - cur;
		}
		CK(cudaMemcpy(out, drow[cur], rowb, cudaMemcpyDeviceToHost));
		d2h += rowb;
		runs++;
	}
	double elapsed = now_s() - t0;
	CK(cudaFree(dwall));
	CK(cudaFree(drow[0]));
	CK(cudaFree(drow[1]));

	long long best = -1;
	for (int c = 0; c < C; c++)
		if (best < 0 || out[c] < best)
			best = out[c];
	printf("PATHFINDER cols=%d rows=%d pyramid=%d launches_per_run=%d min_path=%lld runs=%lld "
	       "elapsed_s=%.6f\n", C, R, P, (R - 1 + P - 1) / P, best, runs, elapsed);
	printf("STATS launches=%llu h2d_bytes=%llu d2h_bytes=%llu\n", launches, h2d, d2h);
	print_throughput(runs, elapsed);
	int rc = 0;
	if (check) {
		unsigned long long hsh = fnv1a64(FNV1A64_INIT, out, rowb);
		printf("CHECK fnv1a64=%016llx\n", hsh);
		int *a = (int *)malloc(rowb), *b = (int *)malloc(rowb);
		if (!a || !b)
			fail("host malloc of %s%s failed", "reference rows", "");
		memcpy(a, data, rowb);
		for (int r = 1; r < R; r++) {
			const int *wr = data + (size_t)r * C;
			for (int c = 0; c < C; c++) {
				int m = a[c];
				if (c > 0 && a[c - 1] < m)
					m = a[c - 1];
				if (c < C - 1 && a[c + 1] < m)
					m = a[c + 1];
				b[c] = wr[c] + m;
			}
			int *t = a;
			a = b;
			b = t;
		}
		long long bad = 0, first = -1;
		for (int c = 0; c < C; c++)
			if (out[c] != a[c] && bad++ == 0)
				first = c;
		if (bad) {
			printf("FAIL %s %lld of %d columns differ (first %lld: got %d want %d)\n", NAME,
			       bad, C, first, out[first], a[first]);
			rc = 1;
		} else {
			printf("PASS %s cols=%d rows=%d pyramid=%d min_path=%lld\n", NAME, C, R, P,
			       best);
		}
		free(a);
		free(b);
	}
	free(data);
	free(out);
	return rc;
}
