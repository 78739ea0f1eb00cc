// nw: Rodinia-style Needleman-Wunsch global alignment, block wavefront.
//
//   nw [--size N] [--penalty P] [--seed S] [--repeat R] [--duration SEC] [--check]
//
// Two random protein sequences of N residues (N a multiple of 16; default
// 2048 with gap penalty 10, Rodinia's `needle 2048 10`) over the 20 amino
// acids, drawn uniformly by a seeded splitmix64.  The (N+1) x (N+1) score
// matrix of Needleman & Wunsch (J. Mol. Biol. 1970) with a linear gap
// penalty and BLOSUM62 substitution scores (Henikoff & Henikoff, PNAS 1992):
//
//   F[i][0] = -i P,  F[0][j] = -j P,
//   F[i][j] = max(F[i-1][j-1] + ref[i][j], F[i][j-1] - P, F[i-1][j] - P)
//
// where ref[i][j] = BLOSUM62(a[i-1], b[j-1]) is precomputed into a matrix,
// as Rodinia does (Che et al., IISWC 2009), so that the kernels only read
// memory.  The matrix is cut into 16x16 blocks; the blocks of one
// anti-diagonal are independent, one launch each: nw_upper for the
// diagonals that grow (1..N/16 blocks), nw_lower for those that shrink.
// A block (16 threads) loads its reference tile, the row above and the
// column left of it into shared memory, sweeps its own 31 anti-diagonals
// (thread t owns column t) and writes the tile back.  Integer scores: the
// whole matrix is checked exactly against the plain CPU recurrence.
//
// One run (repeated --repeat R times, or until --duration SEC passed):
// cudaMemcpy H2D the initial score matrix (borders set), 2 N/16 - 1
// launches, cudaMemcpy D2H the score matrix.  The reference matrix is
// uploaded once.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *NAME = "nw";

#include "progutil.h"

#define BLOCK_SIZE 16

/* BLOSUM62 over A R N D C Q E G H I L K M F P S T W Y V, lower triangle
 * row by row (NCBI's matrix; the ambiguity codes B Z X and * left out). */
static const signed char blosum62_lower[] = {
	4,
	-1, 5,
	-2, 0, 6,
	-2, -2, 1, 6,
	0, -3, -3, -3, 9,
	-1, 1, 0, 0, -3, 5,
	-1, 0, 0, 2, -4, 2, 5,
	0, -2, 0, -1, -3, -2, -2, 6,
	-2, 0, 1, -1, -3, 0, 0, -2, 8,
	-1, -3, -3, -3, -1, -3, -3, -4, -3, 4,
	-1, -2, -3, -4, -1, -2, -3, -4, -3, 2, 4,
	-1, 2, 0, -1, -3, 1, 1, -2, -1, -3, -2, 5,
	-1, -1, -2, -3, -1, 0, -2, -3, -2, 1, 2, -1, 5,
	-2, -3, -3, -3, -2, -3, -3, -3, -1, 0, 0, -3, 0, 6,
	-1, -2, -2, -1, -3, -1, -1, -2, -2, -3, -3, -1, -2, -4, 7,
	1, -1, 1, 0, -1, 0, 0, 0, -1, -2, -2, 0, -1, -2, -1, 4,
	0, -1, 0, -1, -1, -1, -1, -2, -2, -1, -1, -1, -1, -2, -1, 1, 5,
	-3, -3, -4, -4, -2, -2, -3, -2, -2, -3, -2, -3, -1, 1, -4, -3, -2, 11,
	-2, -2, -2, -3, -2, -1, -2, -3, 2, -1, -1, -2, -1, 3, -3, -2, -2, 2, 7,
	0, -3, -3, -3, -1, -2, -2, -3, -3, 3, 1, -2, 1, -1, -2, -2, 0, -3, -1, 4,
};
#define AMINO 20

static int blosum62(int a, int b)
{
	if (a < b) {
		int t = a;
		a = b;
		b = t;
	}
	return blosum62_lower[a * (a + 1) / 2 + b];
}

__device__ static int max3(int a, int b, int c)
{
	return max(a, max(b, c));
}

// The 16x16 block whose top-left cell is score[y0+1][x0+1].
__device__ static void nw_block(const int *ref, int *score, int cols, int penalty, int x0,
				int y0)
{
	__shared__ int s[BLOCK_SIZE + 1][BLOCK_SIZE + 1];   /* block + row above + column left */
	__shared__ int r[BLOCK_SIZE][BLOCK_SIZE];
	int tx = threadIdx.x;
	for (int ty = 0; ty < BLOCK_SIZE; ty++)
		r[ty][tx] = ref[(y0 + 1 + ty) * cols + x0 + 1 + tx];
	if (tx == 0)
		s[0][0] = score[y0 * cols + x0];
	s[0][tx + 1] = score[y0 * cols + x0 + 1 + tx];
	s[tx + 1][0] = score[(y0 + 1 + tx) * cols + x0];
	__syncthreads();
	/* anti-diagonal d of the block: thread tx does row d - tx of column tx */
	for (int d = 0; d < 2 * BLOCK_SIZE - 1; d++) {
		int y = d - tx;
		if (y >= 0 && y < BLOCK_SIZE) {
			int i = y + 1, j = tx + 1;
			s[i][j] = max3(s[i - 1][j - 1] + r[y][tx], s[i][j - 1] - penalty,
				       s[i - 1][j] - penalty);
		}
		__syncthreads();
	}
	for (int ty = 0; ty < BLOCK_SIZE; ty++)
		score[(y0 + 1 + ty) * cols + x0 + 1 + tx] = s[ty + 1][tx + 1];
}

// Diagonal `diag` (1..nblk) of the upper-left triangle: blocks (bx, diag-1-bx).
__global__ void nw_upper(const int *ref, int *score, int cols, int penalty, int diag)
{
	int bx = blockIdx.x, by = diag - 1 - blockIdx.x;
	nw_block(ref, score, cols, penalty, bx * BLOCK_SIZE, by * BLOCK_SIZE);
}

// Diagonal with `diag` (nblk-1..1) blocks of the lower-right triangle:
// blocks (bx + nblk - diag, nblk - 1 - bx).
__global__ void nw_lower(const int *ref, int *score, int cols, int penalty, int diag, int nblk)
{
	int bx = blockIdx.x + nblk - diag, by = nblk - 1 - blockIdx.x;
	nw_block(ref, score, cols, penalty, bx * BLOCK_SIZE, by * BLOCK_SIZE);
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
	long long size = 2048, penalty = 10, seed = 1, repeat = 1;
	double duration = 0;
	int check = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--size"))
			size = arg_int(argc, argv, &i, BLOCK_SIZE, 1 << 15);
		else if (!strcmp(argv[i], "--penalty"))
			penalty = arg_int(argc, argv, &i, 0, 1000);
		else if (!strcmp(argv[i], "--seed"))
			seed = arg_int(argc, argv, &i, 0, 1LL << 62);
		else if (!strcmp(argv[i], "--repeat"))
			repeat = arg_int(argc, argv, &i, 1, 1LL << 30);
		else if (!strcmp(argv[i], "--duration"))
			duration = arg_seconds(argc, argv, &i);
		else if (!strcmp(argv[i], "--check"))
			check = 1;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: nw [--size N] [--penalty P] [--seed S] [--repeat R] "
			       "[--duration SEC] [--check]\n");
			return 0;
		} else
			fail("unknown option %s%s", argv[i], "");
	}
	if (size % BLOCK_SIZE)
		fail("--size must be a multiple of %s%s", "16", "");
	int n = (int)size, cols = n + 1, pen = (int)penalty, nblk = n / BLOCK_SIZE;
	size_t cells = (size_t)cols * cols, bytes = cells * sizeof(int);
	int *a = (int *)malloc((size_t)n * sizeof(int)), *b = (int *)malloc((size_t)n * sizeof(int));
	int *ref = (int *)calloc(cells, sizeof(int)), *init = (int *)calloc(cells, sizeof(int));
	int *out = (int *)malloc(bytes);
	if (!a || !b || !ref || !init || !out)
		fail("host malloc of %s%s failed", "the matrices", "");
	uint64_t s = (uint64_t)seed;
	for (int i = 0; i < n; i++)
		a[i] = (int)(splitmix64(&s) % AMINO);
	for (int i = 0; i < n; i++)
		b[i] = (int)(splitmix64(&s) % AMINO);
	for (int i = 1; i < cols; i++)
		for (int j = 1; j < cols; j++)
			ref[(size_t)i * cols + j] = blosum62(a[i - 1], b[j - 1]);
	for (int i = 0; i < cols; i++) {
		init[(size_t)i * cols] = -i * pen;
		init[i] = -i * pen;
	}

	unsigned long long launches = 0, h2d = 0, d2h = 0;
	int *dref, *dscore;
	CK(cudaMalloc((void **)&dref, bytes));
	CK(cudaMalloc((void **)&dscore, bytes));
	CK(cudaMemcpy(dref, ref, bytes, cudaMemcpyHostToDevice));
	h2d += bytes;

	long long runs = 0;
	double t0 = now_s();
	while (runs < repeat || (duration > 0 && now_s() - t0 < duration)) {
		CK(cudaMemcpy(dscore, init, bytes, cudaMemcpyHostToDevice));
		h2d += bytes;
		for (int d = 1; d <= nblk; d++) {
			nw_upper<<<d, BLOCK_SIZE>>>(dref, dscore, cols, pen, d);
			CK(cudaGetLastError());
			launches++;
		}
		for (int d = nblk - 1; d >= 1; d--) {
			nw_lower<<<d, BLOCK_SIZE>>>(dref, dscore, cols, pen, d, nblk);
			CK(cudaGetLastError());
			launches++;
		}
		CK(cudaMemcpy(out, dscore, bytes, cudaMemcpyDeviceToHost));
		d2h += bytes;
		runs++;
	}
	double elapsed = now_s() - t0;
	CK(cudaFree(dref));
	CK(cudaFree(dscore));

	int final_score = out[cells - 1];
	printf("NW size=%d penalty=%d score=%d launches_per_run=%d runs=%lld elapsed_s=%.6f\n", n,
	       pen, final_score, 2 * nblk - 1, runs, elapsed);
	printf("STATS launches=%llu h2d_bytes=%llu d2h_bytes=%llu\n", launches, h2d, d2h);
	print_throughput(runs, elapsed);
	int rc = 0;
	if (check) {
		unsigned long long hsh = fnv1a64(FNV1A64_INIT, out, bytes);
		printf("CHECK fnv1a64=%016llx\n", hsh);
		int *f = init;   /* not needed any more: the reference fills it in */
		for (int i = 1; i < cols; i++)
			for (int j = 1; j < cols; j++) {
				size_t k = (size_t)i * cols + j;
				int m = f[k - cols - 1] + ref[k];
				if (f[k - 1] - pen > m)
					m = f[k - 1] - pen;
				if (f[k - cols] - pen > m)
					m = f[k - cols] - pen;
				f[k] = m;
			}
		long long bad = 0;
		size_t first = 0;
		for (size_t k = 0; k < cells; k++)
			if (out[k] != f[k] && bad++ == 0)
				first = k;
		if (bad) {
			printf("FAIL %s %lld of %zu cells differ (first [%zu][%zu]: got %d want %d)\n",
			       NAME, bad, cells, first / cols, first % cols, out[first], f[first]);
			rc = 1;
		} else {
			printf("PASS %s size=%d penalty=%d score=%d\n", NAME, n, pen, final_score);
		}
	}
	free(a);
	free(b);
	free(ref);
	free(init);
	free(out);
	return rc;
}
