/* Host twin of bench/rodinia/myocyte (simgpu; see shim/simgpu/simgpu_twin.h).
 *
 * The twin runs each cell through lr1_run() (lr1.h), the code the kernel
 * and the CPU reference run, so it matches the reference bit for bit and a
 * GPU up to FMA contraction and exp()/log() rounding.
 *
 * Cost model (the conventions of bench/rodinia/lud/twins.c).  bytes: every
 * global load and store: per cell 8 state variables and the peak voltage
 * read and written, 4 parameters read (176 bytes, coalesced).  flops: SM
 * time in FP32 flops, double operations counting twice (an H100 SM does
 * half as many FP64 as FP32 operations per clock), exp(double) 58 (nvcc 13
 * expands it to 14 double FMAs and an add), log(double) 95, a double
 * division 36 (reciprocal estimate and Newton steps): LR1_STEP_FLOPS per
 * RK4 step.  At 100 steps per launch that is ~1e6 flops per 176 bytes, far
 * above the device's balance (19.7 flops per byte): the kernel's time falls
 * in proportion to the SMs it gets - compute-intensive, as C-Laius
 * classifies myocyte.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <stddef.h>

#include "simgpu_twin.h"
#include "lr1.h"

/* __global__ void myocyte_kernel(double *y, const double *p, int ncells, long long s0,
 *                                int nsteps, int stim_steps, double dt) */
void simgpu_twin__Z14myocyte_kernelPdPKdixiid(const simgpu_launch *l)
{
	double *y = SIMGPU_ARG(l, 0, double *);
	const double *p = SIMGPU_ARG(l, 1, const double *);
	int n = SIMGPU_ARG(l, 2, int), nsteps = SIMGPU_ARG(l, 4, int);
	int stim_steps = SIMGPU_ARG(l, 5, int);
	long long s0 = SIMGPU_ARG(l, 3, long long);
	double dt = SIMGPU_ARG(l, 6, double);
	size_t threads = (size_t)l->grid.x * l->block.x;

	for (size_t c = 0; c < threads && c < (size_t)n; c++) {
		double s[LR1_NY], q[LR1_NP], vmax = y[LR1_NY * (size_t)n + c];

		for (int k = 0; k < LR1_NY; k++)
			s[k] = y[k * (size_t)n + c];
		for (int k = 0; k < LR1_NP; k++)
			q[k] = p[k * (size_t)n + c];
		lr1_run(s, q, s0, nsteps, stim_steps, dt, &vmax);
		for (int k = 0; k < LR1_NY; k++)
			y[k * (size_t)n + c] = s[k];
		y[LR1_NY * (size_t)n + c] = vmax;
	}
}

void simgpu_cost__Z14myocyte_kernelPdPKdixiid(const simgpu_launch *l, double *flops,
					      double *bytes)
{
	int n = SIMGPU_ARG(l, 2, int), nsteps = SIMGPU_ARG(l, 4, int);
	double threads = (double)l->grid.x * l->block.x;
	double cells = threads < n ? threads : n;

	*flops = cells * nsteps * LR1_STEP_FLOPS;
	*bytes = cells * (2.0 * (LR1_NY + 1) + LR1_NP) * sizeof(double);
}
