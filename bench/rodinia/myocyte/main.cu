// myocyte: Rodinia-style cardiac myocyte simulation, one cell per GPU thread.
//
//   myocyte [--cells N] [--time MS] [--dt MS] [--launch-ms MS] [--seed S]
//           [--repeat R] [--duration S] [--check]
//
// Integrates the ODE model of a ventricular myocyte for N independent cells
// (Rodinia's "workloads") over MS milliseconds with fixed-step classic RK4.
// Each cell has its own Na, Ca and K conductance scale factors (0.8..1.2)
// and is stimulated once (50 uA/cm^2 for 1 ms) at its own time between 2
// and 12 ms, so that cells take different branches of the rate equations.
// One launch advances every cell by --launch-ms of simulated time, so that
// a run is a stream of launches (which the controller can move between SM
// quotas); the state lives in global memory between launches, one double
// array per variable (coalesced).
//
// REDUCED MODEL.  Rodinia's myocyte solves the model of Saucerman and Bers
// (cardiac electrical activity coupled to calcium/calmodulin and the
// calcineurin pathway, ~90 equations) with an adaptive Runge-Kutta-Fehlberg
// 7(8) solver.  This program keeps
// what makes it a compute-intensive batch job - many independent stiff
// ODE systems, dozens of exp() per derivative, little memory traffic - with
// a smaller, published and complete model: Luo-Rudy 1991 (8 equations,
// lr1.h), and fixed-step RK4 so that every device takes exactly the same
// steps.
//
// Defaults: --time 100 ms, as in Rodinia's run script (`myocyte.out 100 1
// 0`); --dt 0.01 ms;
// --launch-ms 1 (100 launches per run); --cells 262144, enough cells to fill
// an H100 (Rodinia's default of one workload would occupy one thread).  The
// tests use a few thousand cells and a few ms.
//
// --check integrates every cell on the CPU with the same code (lr1.h) and
// compares the 8 state variables and the peak voltage of each cell:
// |gpu - ref| <= 1e-6 |ref| + 1e-9 (double precision; a GPU differs by FMA
// contraction and exp() ulps, which this stable system does not amplify to
// anywhere near that).  It also requires every cell stimulated at least
// 5 ms before the end to have fired (peak V > 0 mV), and prints
// `CHECK fnv1a64=<hex>` of the final state's bytes.
//
// --repeat R runs the simulation R times from the resting state; --duration
// S keeps going until S seconds have passed (at least R runs).  CUDA calls:
// cudaMalloc x2, H2D of the parameters once, per repeat an H2D of the
// initial state, ceil(MS / launch-ms) launches and cudaDeviceSynchronize,
// D2H of the state once, cudaFree x2.  Plain CUDA: runs on a real GPU and
// on simgpu.
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *NAME = "myocyte";

#include "progutil.h"
#include "lr1.h"

#define THREADS 128
#define NOUT (LR1_NY + 1)        /* state variables, then the peak voltage */

// Cell c: variables y[k * ncells + c] (k < 8), peak V at y[8 * ncells + c],
// parameters p[k * ncells + c].  Steps s0 .. s0 + nsteps - 1.
__global__ void myocyte_kernel(double *y, const double *p, int ncells, long long s0,
			       int nsteps, int stim_steps, double dt)
{
	int c = blockIdx.x * blockDim.x + threadIdx.x;
	if (c >= ncells)
		return;
	double s[LR1_NY], q[LR1_NP], vmax = y[LR1_NY * (size_t)ncells + c];
	for (int k = 0; k < LR1_NY; k++)
		s[k] = y[k * (size_t)ncells + c];
	for (int k = 0; k < LR1_NP; k++)
		q[k] = p[k * (size_t)ncells + c];
	lr1_run(s, q, s0, nsteps, stim_steps, dt, &vmax);
	for (int k = 0; k < LR1_NY; k++)
		y[k * (size_t)ncells + c] = s[k];
	y[LR1_NY * (size_t)ncells + c] = vmax;
}

int main(int argc, char **argv)
{
	long long ncells = 262144, repeat = 1, seed = 1;
	double tmax = 100, dt = 0.01, launch_ms = 1, duration = 0;
	int check = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--cells"))
			ncells = arg_int(argc, argv, &i, 1, 1 << 28);
		else if (!strcmp(argv[i], "--time"))
			tmax = arg_real(argc, argv, &i, 1e-6, 1e7);
		else if (!strcmp(argv[i], "--dt"))
			dt = arg_real(argc, argv, &i, 1e-6, 1);
		else if (!strcmp(argv[i], "--launch-ms"))
			launch_ms = arg_real(argc, argv, &i, 1e-6, 1e7);
		else if (!strcmp(argv[i], "--seed"))
			seed = arg_int(argc, argv, &i, 0, 1LL << 62);
		else if (!strcmp(argv[i], "--repeat"))
			repeat = arg_int(argc, argv, &i, 1, 1LL << 40);
		else if (!strcmp(argv[i], "--duration"))
			duration = arg_real(argc, argv, &i, 0, 1e7);
		else if (!strcmp(argv[i], "--check"))
			check = 1;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: myocyte [--cells N (default 262144)] [--time MS (100)] "
			       "[--dt MS (0.01)] [--launch-ms MS (1)]\n"
			       "               [--seed S] [--repeat R] [--duration SECONDS] "
			       "[--check]\n");
			return 0;
		} else
			fail("unknown option %s%s", argv[i], "");
	}
	long long steps = llround(tmax / dt), per = llround(launch_ms / dt);
	int stim_steps = (int)llround(1.0 / dt);
	if (steps < 1)
		steps = 1;
	if (per < 1)
		per = 1;
	if (per > steps)
		per = steps;
	if (stim_steps < 1)
		stim_steps = 1;
	if (per > (1 << 30) || steps > (1LL << 50))
		fail("too many steps: %s%s", "--time / --dt", "");
	int n = (int)ncells;
	size_t ybytes = sizeof(double) * NOUT * (size_t)n, pbytes = sizeof(double) * LR1_NP * (size_t)n;

	/* resting state (the model's published initial values), parameters */
	static const double rest[LR1_NY] = {-84.5286, 0.0017, 0.9832, 0.995484, 0.000003, 1.0,
					    0.0057, 0.0002};
	double *y0 = (double *)malloc(ybytes), *p = (double *)malloc(pbytes);
	double *out = (double *)malloc(ybytes);
	if (!y0 || !p || !out)
		fail("host malloc of %s%s failed", "the cells", "");
	unsigned long long s = (unsigned long long)seed * 0x9e3779b97f4a7c15ULL + 3;
	for (int c = 0; c < n; c++) {
		for (int k = 0; k < LR1_NY; k++)
			y0[k * (size_t)n + c] = rest[k];
		y0[LR1_NY * (size_t)n + c] = rest[LR1_V];
		for (int k = 0; k < LR1_NP; k++) {
			s = s * 6364136223846793005ULL + 1442695040888963407ULL;
			double u = (double)(s >> 11) * (1.0 / 9007199254740992.0);    /* [0, 1) */
			p[k * (size_t)n + c] = k == LR1_ON ? floor((2.0 + 10.0 * u) / dt)
							   : 0.8 + 0.4 * u;
		}
	}

	unsigned long long launches = 0, h2d = 0, d2h = 0;
	double *dy, *dp;
	CK(cudaMalloc((void **)&dy, ybytes));
	CK(cudaMalloc((void **)&dp, pbytes));
	CK(cudaMemcpy(dp, p, pbytes, cudaMemcpyHostToDevice));
	h2d += pbytes;
	unsigned blocks = (unsigned)((n + THREADS - 1) / THREADS);
	long long runs = 0;
	double t0 = now_s(), elapsed = 0;
	while (runs < repeat || elapsed < duration) {
		CK(cudaMemcpy(dy, y0, ybytes, cudaMemcpyHostToDevice));
		h2d += ybytes;
		for (long long s0 = 0; s0 < steps; s0 += per) {
			int k = (int)(steps - s0 < per ? steps - s0 : per);
			myocyte_kernel<<<blocks, THREADS>>>(dy, dp, n, s0, k, stim_steps, dt);
			launches++;
			CK(cudaGetLastError());
		}
		CK(cudaDeviceSynchronize());
		runs++;
		elapsed = now_s() - t0;
	}
	CK(cudaMemcpy(out, dy, ybytes, cudaMemcpyDeviceToHost));
	d2h += ybytes;
	CK(cudaFree(dy));
	CK(cudaFree(dp));

	int fired = 0;
	for (int c = 0; c < n; c++)
		fired += out[LR1_NY * (size_t)n + c] > 0.0;
	printf("MYOCYTE cells=%d time_ms=%g dt_ms=%g steps=%lld runs=%lld elapsed_s=%.6f "
	       "fired=%d v0=%.6f\n",
	       n, tmax, dt, steps, runs, elapsed, fired, out[0]);
	printf("STATS launches=%llu h2d_bytes=%llu d2h_bytes=%llu\n", launches, h2d, d2h);
	print_throughput(runs, elapsed);
	if (!check)
		return 0;

	unsigned long long hsh = fnv1a64(FNV1A64_INIT, out, ybytes);
	printf("CHECK fnv1a64=%016llx\n", hsh);
	size_t bad = 0, worst = 0, silent = 0;
	double max_rel = 0;
	for (int c = 0; c < n; c++) {
		double ys[LR1_NY], q[LR1_NP], vmax = rest[LR1_V];
		for (int k = 0; k < LR1_NY; k++)
			ys[k] = rest[k];
		for (int k = 0; k < LR1_NP; k++)
			q[k] = p[k * (size_t)n + c];
		for (long long s0 = 0; s0 < steps; s0 += per)
			lr1_run(ys, q, s0, (int)(steps - s0 < per ? steps - s0 : per), stim_steps,
				dt, &vmax);
		for (int k = 0; k < NOUT; k++) {
			double want = k < LR1_NY ? ys[k] : vmax, got = out[k * (size_t)n + c];
			double tol = 1e-6 * fabs(want) + 1e-9, err = fabs(got - want);
			if (!(err <= tol))      /* NaN counts as wrong */
				bad++;
			if (!(err / tol <= max_rel)) {
				max_rel = err / tol;
				worst = k * (size_t)n + c;
			}
		}
		if ((double)steps - q[LR1_ON] >= 5.0 / dt && !(vmax > 0.0))
			silent++;
	}
	if (bad || silent) {
		printf("FAIL %s %zu of %zu values off (worst: variable %zu of cell %zu = %.17g, "
		       "max err/tol %.3g), %zu stimulated cells did not fire\n",
		       NAME, bad, (size_t)NOUT * n, worst / n, worst % n, out[worst], max_rel,
		       silent);
		return 1;
	}
	printf("PASS %s cells=%d time_ms=%g runs=%lld fired=%d max_err_over_tol=%.3g\n", NAME, n,
	       tmax, runs, fired, max_rel);
	free(y0);
	free(p);
	free(out);
	return 0;
}
