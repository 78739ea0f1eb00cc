// lavamd: Rodinia-style lavaMD, particle potentials and forces in a 3D grid of boxes.
//
//   lavamd [--boxes B] [--par P] [--accum global|reg] [--seed S]
//          [--repeat R] [--duration S] [--check]
//
// Space is a B x B x B grid of unit boxes with P particles each (position,
// charge).  Every particle interacts with every particle of its own box and
// of the (up to) 26 boxes around it, with the potential and force of
// pair.h (Rodinia's lavaMD).  One launch computes all of them: one block
// per home box, 128 threads (fewer when P < 128), one thread per home
// particle.  The block stages its home box in shared memory, then, box by
// box, the neighbour's positions and charges, and each thread runs through
// the neighbour's particles in order.
//
// Like Rodinia's kernel (fA[wtx].v += ...), the default `--accum global`
// adds every pair's contribution straight into the particle's entry of the
// global force array.  nvcc 13 keeps such sums in registers (the PTX of a
// kernel written that way has no global access in its pair loop), so the
// accumulator here is a volatile pointer and the kernel really reads and
// writes the particle's 32 bytes of sums in global memory for every pair
// (4 ld.volatile.global + 4 st.volatile.global in the loop's PTX): a
// deliberate choice, so that the program does the memory traffic its source
// describes; with it lavaMD is memory-intensive in simgpu's model, as
// C-Laius classifies it.  `--accum reg` sums each neighbour box in
// registers and touches global memory once per box: the same result up to
// rounding, and compute-bound (see twins.c).
//
// Input: seeded; each particle sits uniformly inside its box, its charge is
// one of 0.1, 0.2, ..., 1.0 (Rodinia's distribution); alpha = 0.5.  The
// default B = 10, P = 100 is Rodinia's usual `-boxes1d 10` input
// (NUMBER_PAR_PER_BOX 100); the tests use B = 2..12 with small P.
//
// --check computes the same sums on the CPU (pair.h, same order) and
// compares each particle's four outputs with tolerance 1e-9 * (1 + 8 v_ref):
// the sums are in double, and 8 v_ref bounds the sum of the magnitudes of
// the particle's terms (|r_i - r_j| < 2 sqrt 3 between neighbour boxes),
// which bounds the rounding (FMA contraction and exp() ulps on a GPU).
// It also prints `CHECK fnv1a64=<hex>` of the output bytes.
//
// --repeat R runs the computation R times; --duration S keeps going until S
// seconds have passed (at least R runs).  CUDA calls: cudaMalloc x5, H2D of
// the neighbour lists, positions and charges once, per repeat a cudaMemset
// of the forces, one launch and cudaDeviceSynchronize, D2H of the forces
// once, cudaFree x5.  Plain CUDA: runs on a real GPU and on simgpu.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *NAME = "lavamd";

#include "progutil.h"
#include "pair.h"

#define MAX_THREADS 128      /* Rodinia's NUMBER_THREADS */
#define ALPHA 0.5

/* `--duration S`: seconds, fractions allowed */
// Block = home box.  nn[b] boxes in nei[b * 27 ...], the home box first.
// rv: 4 doubles per particle, qv: 1, fv: 4 (zeroed by the host).
// Dynamic shared memory: 9 P doubles (home positions, neighbour positions
// and charges).
__global__ void lavamd_kernel(const int *nn, const int *nei, const double *rv,
			      const double *qv, double *fv, int par, double a2, int global_acc)
{
	extern __shared__ double sh[];
	double *ra = sh, *rb = sh + 4 * par, *qb = sh + 8 * par;
	int tx = threadIdx.x, home = blockIdx.x, nk = nn[home];
	size_t first = (size_t)home * par;

	for (int i = tx; i < 4 * par; i += blockDim.x)
		ra[i] = rv[4 * first + i];
	for (int k = 0; k < nk; k++) {
		size_t nb = (size_t)nei[home * LAVA_NEI + k] * par;
		__syncthreads();        /* everyone is done with the last box */
		for (int i = tx; i < 4 * par; i += blockDim.x)
			rb[i] = rv[4 * nb + i];
		for (int i = tx; i < par; i += blockDim.x)
			qb[i] = qv[nb + i];
		__syncthreads();
		for (int i = tx; i < par; i += blockDim.x) {
			double c[4];
			if (global_acc) {
				volatile double *f = fv + 4 * (first + i);
				for (int j = 0; j < par; j++) {
					lava_pair(ra + 4 * i, rb + 4 * j, qb[j], a2, c);
					f[0] = f[0] + c[0];
					f[1] = f[1] + c[1];
					f[2] = f[2] + c[2];
					f[3] = f[3] + c[3];
				}
			} else {
				double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
				double *f = fv + 4 * (first + i);
				for (int j = 0; j < par; j++) {
					lava_pair(ra + 4 * i, rb + 4 * j, qb[j], a2, c);
					s0 = s0 + c[0];
					s1 = s1 + c[1];
					s2 = s2 + c[2];
					s3 = s3 + c[3];
				}
				f[0] = f[0] + s0;
				f[1] = f[1] + s1;
				f[2] = f[2] + s2;
				f[3] = f[3] + s3;
			}
		}
	}
}

// CPU reference: the kernel's loops, one home box at a time.
static void lavamd_cpu(const int *nn, const int *nei, const double *rv, const double *qv,
		       double *fv, int nbox, int par, double a2, int global_acc)
{
	memset(fv, 0, sizeof(double) * 4 * (size_t)nbox * par);
	for (int home = 0; home < nbox; home++)
		for (int k = 0; k < nn[home]; k++) {
			size_t nb = (size_t)nei[home * LAVA_NEI + k] * par;
			for (int i = 0; i < par; i++) {
				const double *ri = rv + 4 * ((size_t)home * par + i);
				double *f = fv + 4 * ((size_t)home * par + i), s[4] = {0, 0, 0, 0}, c[4];
				for (int j = 0; j < par; j++) {
					lava_pair(ri, rv + 4 * (nb + j), qv[nb + j], a2, c);
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

/* Neighbour lists: the box itself first, then its in-bounds neighbours. */
static void make_boxes(int b1, int *nn, int *nei)
{
	for (int z = 0; z < b1; z++)
		for (int y = 0; y < b1; y++)
			for (int x = 0; x < b1; x++) {
				int home = (z * b1 + y) * b1 + x, *l = nei + home * LAVA_NEI;
				l[0] = home;
				nn[home] = 1;
				for (int dz = -1; dz <= 1; dz++)
					for (int dy = -1; dy <= 1; dy++)
						for (int dx = -1; dx <= 1; dx++) {
							int X = x + dx, Y = y + dy, Z = z + dz;
							if ((dx | dy | dz) == 0 || X < 0 || Y < 0 ||
							    Z < 0 || X >= b1 || Y >= b1 || Z >= b1)
								continue;
							l[nn[home]++] = (Z * b1 + Y) * b1 + X;
						}
			}
}

static void make_particles(int b1, int par, double *rv, double *qv, unsigned long long seed)
{
	unsigned long long s = seed * 0x9e3779b97f4a7c15ULL + 7;
	for (int box = 0; box < b1 * b1 * b1; box++) {
		int x = box % b1, y = box / b1 % b1, z = box / (b1 * b1);
		for (int i = 0; i < par; i++) {
			double *r = rv + 4 * ((size_t)box * par + i), u[4];
			for (int m = 0; m < 4; m++) {
				s = s * 6364136223846793005ULL + 1442695040888963407ULL;
				u[m] = (double)(s >> 11) * (1.0 / 9007199254740992.0);    /* [0, 1) */
			}
			r[1] = x + u[0];
			r[2] = y + u[1];
			r[3] = z + u[2];
			r[0] = r[1] * r[1] + r[2] * r[2] + r[3] * r[3];
			qv[(size_t)box * par + i] = (1 + (int)(u[3] * 10)) / 10.0;
		}
	}
}

int main(int argc, char **argv)
{
	long long b1 = 10, par = 100, repeat = 1, seed = 1;
	double duration = 0;
	int check = 0, global_acc = 1;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--boxes"))
			b1 = arg_int(argc, argv, &i, 1, 1000);
		else if (!strcmp(argv[i], "--par"))
			par = arg_int(argc, argv, &i, 1, 512);
		else if (!strcmp(argv[i], "--accum") && i + 1 < argc &&
			 (!strcmp(argv[i + 1], "global") || !strcmp(argv[i + 1], "reg")))
			global_acc = !strcmp(argv[++i], "global");
		else if (!strcmp(argv[i], "--seed"))
			seed = arg_int(argc, argv, &i, 0, 1LL << 62);
		else if (!strcmp(argv[i], "--repeat"))
			repeat = arg_int(argc, argv, &i, 1, 1LL << 40);
		else if (!strcmp(argv[i], "--duration"))
			duration = arg_seconds(argc, argv, &i);
		else if (!strcmp(argv[i], "--check"))
			check = 1;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: lavamd [--boxes B (per dimension, default 10)] [--par P "
			       "(particles per box, default 100)]\n"
			       "              [--accum global|reg] [--seed S] [--repeat R] "
			       "[--duration SECONDS] [--check]\n");
			return 0;
		} else
			fail("unknown or incomplete option %s%s", argv[i], "");
	}
	int nbox = (int)(b1 * b1 * b1), threads = (int)((par + 31) / 32 * 32);
	if (threads > MAX_THREADS)
		threads = MAX_THREADS;
	size_t np = (size_t)nbox * par;
	size_t rbytes = np * 4 * sizeof(double), qbytes = np * sizeof(double);
	size_t lbytes = (size_t)nbox * LAVA_NEI * sizeof(int), nbytes = (size_t)nbox * sizeof(int);
	size_t shmem = 9 * (size_t)par * sizeof(double);
	double a2 = 2.0 * ALPHA * ALPHA;

	int *nn = (int *)malloc(nbytes), *nei = (int *)calloc((size_t)nbox * LAVA_NEI, sizeof(int));
	double *rv = (double *)malloc(rbytes), *qv = (double *)malloc(qbytes);
	double *fv = (double *)malloc(rbytes);
	if (!nn || !nei || !rv || !qv || !fv)
		fail("host malloc of %s%s failed", "the particles", "");
	make_boxes((int)b1, nn, nei);
	make_particles((int)b1, (int)par, rv, qv, (unsigned long long)seed);

	unsigned long long launches = 0, h2d = 0, d2h = 0;
	int *dnn, *dnei;
	double *drv, *dqv, *dfv;
	CK(cudaMalloc((void **)&dnn, nbytes));
	CK(cudaMalloc((void **)&dnei, lbytes));
	CK(cudaMalloc((void **)&drv, rbytes));
	CK(cudaMalloc((void **)&dqv, qbytes));
	CK(cudaMalloc((void **)&dfv, rbytes));
	CK(cudaMemcpy(dnn, nn, nbytes, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dnei, nei, lbytes, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(drv, rv, rbytes, cudaMemcpyHostToDevice));
	CK(cudaMemcpy(dqv, qv, qbytes, cudaMemcpyHostToDevice));
	h2d += nbytes + lbytes + rbytes + qbytes;

	long long runs = 0;
	double t0 = now_s(), elapsed = 0;
	while (runs < repeat || elapsed < duration) {
		CK(cudaMemset(dfv, 0, rbytes));
		lavamd_kernel<<<nbox, threads, shmem>>>(dnn, dnei, drv, dqv, dfv, (int)par, a2,
							 global_acc);
		launches++;
		CK(cudaGetLastError());
		CK(cudaDeviceSynchronize());
		runs++;
		elapsed = now_s() - t0;
	}
	CK(cudaMemcpy(fv, dfv, rbytes, cudaMemcpyDeviceToHost));
	d2h += rbytes;
	CK(cudaFree(dnn));
	CK(cudaFree(dnei));
	CK(cudaFree(drv));
	CK(cudaFree(dqv));
	CK(cudaFree(dfv));

	printf("LAVAMD boxes=%lld par=%lld accum=%s runs=%lld elapsed_s=%.6f v0=%.9g x0=%.9g\n",
	       b1, par, global_acc ? "global" : "reg", runs, elapsed, fv[0], fv[1]);
	printf("STATS launches=%llu h2d_bytes=%llu d2h_bytes=%llu\n", launches, h2d, d2h);
	print_throughput(runs, elapsed);
	if (!check)
		return 0;

	unsigned long long hsh = fnv1a64(FNV1A64_INIT, fv, rbytes);
	printf("CHECK fnv1a64=%016llx\n", hsh);
	double *ref = (double *)malloc(rbytes);
	if (!ref)
		fail("host malloc of %s%s failed", "the reference", "");
	lavamd_cpu(nn, nei, rv, qv, ref, nbox, (int)par, a2, global_acc);
	double max_rel = 0;
	size_t bad = 0, worst = 0;
	for (size_t i = 0; i < 4 * np; i++) {
		double err = fabs(fv[i] - ref[i]), tol = 1e-9 * (1 + 8 * fabs(ref[i / 4 * 4]));
		if (!(err <= tol))      /* NaN counts as wrong */
			bad++;
		if (!(err / tol <= max_rel)) {
			max_rel = err / tol;
			worst = i;
		}
	}
	if (bad) {
		printf("FAIL %s %zu of %zu values off (worst: particle %zu component %zu got "
		       "%.17g want %.17g)\n",
		       NAME, bad, 4 * np, worst / 4, worst % 4, fv[worst], ref[worst]);
		return 1;
	}
	printf("PASS %s boxes=%lld par=%lld accum=%s runs=%lld max_err_over_tol=%.3g\n", NAME,
	       b1, par, global_acc ? "global" : "reg", runs, max_rel);
	free(ref);
	free(nn);
	free(nei);
	free(rv);
	free(qv);
	free(fv);
	return 0;
}
