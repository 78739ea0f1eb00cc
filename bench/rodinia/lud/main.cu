// lud: Rodinia-style blocked LU decomposition of a dense matrix.
//
//   lud [--size N] [--seed S] [--repeat R] [--duration S] [--check]
//
// Factors an N x N float matrix A = L U in place, without pivoting (L unit
// lower triangular below the diagonal, U upper triangular on and above it),
// with the blocked right-looking algorithm of Rodinia's lud (Che et al.,
// IISWC 2009; blocked LU as in Golub & Van Loan, Matrix Computations, ch. 3).
// For each 16-wide diagonal step at offset d = 0, 16, ..., N-32:
//
//   lud_diagonal   1 block x 16 threads: factor the 16x16 diagonal tile
//                  A[d..d+16, d..d+16] in shared memory (one row per thread);
//   lud_perimeter  N/16-1-d/16 blocks x 32 threads: threads 0..15 solve the
//                  tile row to the right (U tiles: L_dd^-1 A), threads 16..31
//                  the tile column below (L tiles: A U_dd^-1);
//   lud_internal   (N/16-1-d/16)^2 blocks x 16x16 threads: Schur update of
//                  the trailing matrix, A_ij -= L_i * U_j, one 16-term dot
//                  product per element out of two shared-memory tiles;
//
// then lud_diagonal alone for the last tile: 3 N/16 - 2 launches per
// factorization.  The float arithmetic is spelled __fmul_rn/__fsub_rn/...
// so that nvcc does not contract it into FMAs: the GPU and the simgpu twins
// (twins.c) then do the same IEEE operations in the same order.
//
// Input: a seeded pseudo-random matrix, off-diagonal entries uniform in
// [-1, 1), diagonal N + [0, 1): strictly diagonally dominant, so LU without
// pivoting is stable.  N is a multiple of 16; the default 2048 is the
// largest of the inputs shipped with Rodinia (data/lud/2048.dat).  The tests
// check N = 64 and 256 and time N = 2048 in the device model (0.4 s of CPU
// on simgpu).
//
// --check factors the same matrix in double on the CPU (unblocked, the
// textbook k-i-j loop) and compares every entry of the packed L\U result:
// |gpu - ref| <= 1e-4 * (|ref| + 1/N).  Float LU of this diagonally
// dominant matrix stays well inside that up to N = 2048 (worst entry at
// 0.12 of its tolerance); L's entries are ~1/N in size, hence the 1/N
// floor.  It also prints `CHECK fnv1a64=<hex>` of the result's bytes: with
// no FMAs and the same order, a GPU and the simgpu twins compute the same
// bits (by construction; not yet compared on a GPU), so runs on different
// routes can be compared bit for bit.
//
// --repeat R runs the factorization R times (re-uploading A each time);
// --duration S keeps going until S seconds have passed (at least R runs).
// CUDA calls per run: cudaMalloc, per repeat cudaMemcpy H2D of A and
// 3 N/16 - 2 launches and cudaDeviceSynchronize, cudaMemcpy D2H once,
// cudaFree.  Plain CUDA: runs on a real GPU and on simgpu.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *NAME = "lud";

#include "progutil.h"

/* `--duration S`: seconds, fractions allowed */
#define BS 16            /* tile edge (Rodinia's BLOCK_SIZE) */
#define PAD (BS + 1)     /* row pitch of shared tiles walked down a column:
			    no bank conflicts when each thread owns a row */

// Factor the diagonal tile at (d, d).  Thread t owns row t of the tile:
// for each k it turns column k of its row into L (divide by the pivot),
// then subtracts l_tk * u_kj from the rest of its row (right-looking).
__global__ void lud_diagonal(float *a, int n, int d)
{
	__shared__ float t[BS][PAD];
	int tx = threadIdx.x;
	for (int r = 0; r < BS; r++)
		t[r][tx] = a[(size_t)(d + r) * n + d + tx];
	__syncthreads();
	for (int k = 0; k < BS - 1; k++) {
		if (tx > k) {
			float l = __fdiv_rn(t[tx][k], t[k][k]);
			t[tx][k] = l;
			for (int j = k + 1; j < BS; j++)
				t[tx][j] = __fsub_rn(t[tx][j], __fmul_rn(l, t[k][j]));
		}
		__syncthreads();
	}
	for (int r = 0; r < BS; r++)
		a[(size_t)(d + r) * n + d + tx] = t[r][tx];
}

// Block b handles tile b+1 to the right of the diagonal tile (a U tile) and
// tile b+1 below it (an L tile), 32 threads: 0..15 own a column of the U
// tile (forward substitution with the unit lower L_dd), 16..31 a row of the
// L tile (solve against the upper U_dd, dividing by its pivots).
__global__ void lud_perimeter(float *a, int n, int d)
{
	__shared__ float dg[BS][PAD], ut[BS][PAD], lt[BS][PAD];
	int tx = threadIdx.x, c0 = d + (blockIdx.x + 1) * BS;
	for (int i = tx; i < BS * BS; i += 2 * BS) {
		int r = i / BS, c = i % BS;
		dg[r][c] = a[(size_t)(d + r) * n + d + c];
		ut[r][c] = a[(size_t)(d + r) * n + c0 + c];
		lt[r][c] = a[(size_t)(c0 + r) * n + d + c];
	}
	__syncthreads();
	if (tx < BS) {
		int c = tx;
		for (int i = 1; i < BS; i++) {
			float acc = ut[i][c];
			for (int k = 0; k < i; k++)
				acc = __fsub_rn(acc, __fmul_rn(dg[i][k], ut[k][c]));
			ut[i][c] = acc;
		}
	} else {
		int r = tx - BS;
		for (int j = 0; j < BS; j++) {
			float acc = lt[r][j];
			for (int k = 0; k < j; k++)
				acc = __fsub_rn(acc, __fmul_rn(lt[r][k], dg[k][j]));
			lt[r][j] = __fdiv_rn(acc, dg[j][j]);
		}
	}
	__syncthreads();
	for (int i = tx; i < BS * BS; i += 2 * BS) {
		int r = i / BS, c = i % BS;
		a[(size_t)(d + r) * n + c0 + c] = ut[r][c];
		a[(size_t)(c0 + r) * n + d + c] = lt[r][c];
	}
}

// Trailing update of tile (blockIdx.y + 1, blockIdx.x + 1) past the
// diagonal tile: a_ij -= sum_k l_ik u_kj over the step's 16 columns k,
// the sum accumulated from k = 0 up, then subtracted once.
__global__ void lud_internal(float *a, int n, int d)
{
	__shared__ float lcol[BS][BS], urow[BS][BS];
	int tx = threadIdx.x, ty = threadIdx.y;
	int r0 = d + (blockIdx.y + 1) * BS, c0 = d + (blockIdx.x + 1) * BS;
	urow[ty][tx] = a[(size_t)(d + ty) * n + c0 + tx];
	lcol[ty][tx] = a[(size_t)(r0 + ty) * n + d + tx];
	__syncthreads();
	float sum = 0.0f;
	for (int k = 0; k < BS; k++)
		sum = __fadd_rn(sum, __fmul_rn(lcol[ty][k], urow[k][tx]));
	size_t i = (size_t)(r0 + ty) * n + c0 + tx;
	a[i] = __fsub_rn(a[i], sum);
}

// The whole factorization on the device: 3 n/16 - 2 launches.
static unsigned long long lud_device(float *da, int n)
{
	unsigned long long launches = 0;
	int d;
	for (d = 0; d < n - BS; d += BS) {
		int rest = (n - d) / BS - 1;
		lud_diagonal<<<1, BS>>>(da, n, d);
		lud_perimeter<<<rest, 2 * BS>>>(da, n, d);
		lud_internal<<<dim3(rest, rest), dim3(BS, BS)>>>(da, n, d);
		launches += 3;
		CK(cudaGetLastError());
	}
	lud_diagonal<<<1, BS>>>(da, n, d);
	CK(cudaGetLastError());
	return launches + 1;
}

// CPU reference: unblocked right-looking LU in double.
static void lud_cpu(const float *a, double *lu, int n)
{
	for (size_t i = 0; i < (size_t)n * n; i++)
		lu[i] = a[i];
	for (int k = 0; k < n - 1; k++) {
		double piv = lu[(size_t)k * n + k];
		const double *uk = lu + (size_t)k * n;
		for (int i = k + 1; i < n; i++) {
			double *ri = lu + (size_t)i * n;
			double l = ri[k] / piv;
			ri[k] = l;
			for (int j = k + 1; j < n; j++)
				ri[j] -= l * uk[j];
		}
	}
}

static void make_matrix(float *a, int n, unsigned long long seed)
{
	unsigned long long s = seed * 0x9e3779b97f4a7c15ULL + 1;
	for (size_t i = 0; i < (size_t)n * n; i++) {
		s = s * 6364136223846793005ULL + 1442695040888963407ULL;
		float u = (float)(s >> 40) * (1.0f / 16777216.0f);    /* [0, 1) */
		size_t r = i / n, c = i % n;
		a[i] = r == c ? (float)n + u : 2.0f * u - 1.0f;
	}
}

int main(int argc, char **argv)
{
	long long n = 2048, repeat = 1, seed = 1;
	double duration = 0;
	int check = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--size"))
			n = arg_int(argc, argv, &i, BS, 32768);
		else if (!strcmp(argv[i], "--seed"))
			seed = arg_int(argc, argv, &i, 0, 1LL << 62);
		else if (!strcmp(argv[i], "--repeat"))
			repeat = arg_int(argc, argv, &i, 1, 1LL << 40);
		else if (!strcmp(argv[i], "--duration"))
			duration = arg_seconds(argc, argv, &i);
		else if (!strcmp(argv[i], "--check"))
			check = 1;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: lud [--size N (multiple of 16, default 2048)] [--seed S] "
			       "[--repeat R] [--duration SECONDS] [--check]\n");
			return 0;
		} else
			fail("unknown option %s%s", argv[i], "");
	}
	if (n % BS)
		fail("--size must be a multiple of %s%s", "16", "");
	size_t cells = (size_t)n * n, bytes = cells * sizeof(float);
	float *a = (float *)malloc(bytes), *out = (float *)malloc(bytes);
	if (!a || !out)
		fail("host malloc of %s%s failed", "2 matrices", "");
	make_matrix(a, (int)n, (unsigned long long)seed);

	unsigned long long launches = 0, h2d = 0, d2h = 0;
	float *da;
	CK(cudaMalloc((void **)&da, bytes));
	long long runs = 0;
	double t0 = now_s(), elapsed = 0;
	while (runs < repeat || elapsed < duration) {
		CK(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
		h2d += bytes;
		launches += lud_device(da, (int)n);
		CK(cudaDeviceSynchronize());
		runs++;
		elapsed = now_s() - t0;
	}
	CK(cudaMemcpy(out, da, bytes, cudaMemcpyDeviceToHost));
	d2h += bytes;
	CK(cudaFree(da));

	printf("LUD size=%lld runs=%lld elapsed_s=%.6f u00=%.6f u_last=%.6f\n", n, runs, elapsed,
	       out[0], out[cells - 1]);
	printf("STATS launches=%llu h2d_bytes=%llu d2h_bytes=%llu\n", launches, h2d, d2h);
	print_throughput(runs, elapsed);
	if (!check)
		return 0;

	unsigned long long hsh = fnv1a64(FNV1A64_INIT, out, bytes);
	printf("CHECK fnv1a64=%016llx\n", hsh);
	double *ref = (double *)malloc(cells * sizeof(double));
	if (!ref)
		fail("host malloc of %s%s failed", "the reference", "");
	lud_cpu(a, ref, (int)n);
	double max_rel = 0, floor_ = 1.0 / (double)n;
	size_t bad = 0, worst = 0;
	for (size_t i = 0; i < cells; i++) {
		double err = fabs((double)out[i] - ref[i]), tol = 1e-4 * (fabs(ref[i]) + floor_);
		if (!(err <= tol))      /* NaN counts as wrong */
			bad++;
		if (!(err / tol <= max_rel)) {
			max_rel = err / tol;
			worst = i;
		}
	}
	if (bad) {
		printf("FAIL %s %zu of %zu entries off (worst: row %zu col %zu got %.9g want %.9g, "
		       "err/tol %.3g)\n",
		       NAME, bad, cells, worst / (size_t)n, worst % (size_t)n, out[worst], ref[worst],
		       max_rel);
		return 1;
	}
	printf("PASS %s size=%lld runs=%lld max_err_over_tol=%.3g\n", NAME, n, runs, max_rel);
	free(ref);
	free(a);
	free(out);
	return 0;
}
