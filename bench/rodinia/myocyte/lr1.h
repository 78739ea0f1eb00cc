/*
 * lr1.h - the cell model of bench/rodinia/myocyte: the Luo-Rudy (1991)
 * ventricular action potential model, integrated with classic RK4.  Shared
 * by the kernel and CPU reference (main.cu) and the simgpu twin (twins.c),
 * so all three do the same double operations in the same order.
 *
 * Luo C-H, Rudy Y. A model of the ventricular cardiac action potential.
 * Circ Res 1991;68:1501-1526.  Eight state variables: membrane potential V
 * (mV), the gates m, h, j (fast Na), d, f (slow inward Ca), x (K) and the
 * intracellular calcium Cai (mM); Cm = 1 uF/cm^2; Nao 140, Nai 18, Ko 5.4,
 * Ki 145 mM, 37 C.  Currents in uA/cm^2, time in ms.
 */
#ifndef MYOCYTE_LR1_H
#define MYOCYTE_LR1_H

#include <math.h>

#ifdef __CUDACC__
#define MYO_FN __host__ __device__ static inline
#else
#define MYO_FN static inline
#endif

#define LR1_NY   8        /* state variables */
#define LR1_NP   4        /* per-cell parameters, see below */
#define LR1_STIM 50.0     /* stimulus, uA/cm^2 (inward), for 1 ms */

/* reversal potentials from the concentrations above, RT/F = 26.708 mV */
#define LR1_ENA  54.785719533593410
#define LR1_EK   (-77.555205724184330)   /* PR_NaK = 0.01833 */
#define LR1_EK1  (-87.878875281819180)

enum { LR1_V, LR1_M, LR1_H, LR1_J, LR1_D, LR1_F, LR1_X, LR1_CAI };

/* Per-cell parameters: scale factors of the Na, slow inward and K
 * conductances, and the time step at which the stimulus starts. */
enum { LR1_GNA, LR1_GSI, LR1_GK, LR1_ON };

/* a (1 - g) - b g: a Hodgkin-Huxley gate's rate of change */
MYO_FN double lr1_gate(double a, double b, double g)
{
	return a * (1.0 - g) - b * g;
}

/* dy = f(y) for parameters p and stimulus current istim (<= 0). */
MYO_FN void lr1_deriv(const double *y, const double *p, double istim, double *dy)
{
	double v = y[LR1_V], am, bm, ah, bh, aj, bj;

	/* fast sodium current (0/0 at V = -47.13: use the limit) */
	double vm = v + 47.13;
	am = fabs(vm) < 1e-7 ? 3.2 : 0.32 * vm / (1.0 - exp(-0.1 * vm));
	bm = 0.08 * exp(-v / 11.0);
	if (v >= -40.0) {
		ah = 0.0;
		bh = 1.0 / (0.13 * (1.0 + exp((v + 10.66) / -11.1)));
		aj = 0.0;
		bj = 0.3 * exp(-2.535e-7 * v) / (1.0 + exp(-0.1 * (v + 32.0)));
	} else {
		ah = 0.135 * exp((80.0 + v) / -6.8);
		bh = 3.56 * exp(0.079 * v) + 3.1e5 * exp(0.35 * v);
		aj = (-1.2714e5 * exp(0.2444 * v) - 3.474e-5 * exp(-0.04391 * v)) * (v + 37.78) /
		     (1.0 + exp(0.311 * (v + 79.23)));
		bj = 0.1212 * exp(-0.01052 * v) / (1.0 + exp(-0.1378 * (v + 40.14)));
	}
	double m = y[LR1_M];
	double ina = 23.0 * p[LR1_GNA] * m * m * m * y[LR1_H] * y[LR1_J] * (v - LR1_ENA);

	/* slow inward (calcium) current */
	double esi = 7.7 - 13.0287 * log(y[LR1_CAI]);
	double isi = 0.09 * p[LR1_GSI] * y[LR1_D] * y[LR1_F] * (v - esi);
	double ad = 0.095 * exp(-0.01 * (v - 5.0)) / (1.0 + exp(-0.072 * (v - 5.0)));
	double bd = 0.07 * exp(-0.017 * (v + 44.0)) / (1.0 + exp(0.05 * (v + 44.0)));
	double af = 0.012 * exp(-0.008 * (v + 28.0)) / (1.0 + exp(0.15 * (v + 28.0)));
	double bf = 0.0065 * exp(-0.02 * (v + 30.0)) / (1.0 + exp(-0.2 * (v + 30.0)));

	/* time-dependent potassium current (0/0 at V = -77: use the limit) */
	double vk = v + 77.0, xi;
	if (v <= -100.0)
		xi = 1.0;
	else if (fabs(vk) < 1e-7)
		xi = 2.837 * 0.04 / exp(0.04 * (v + 35.0));
	else
		xi = 2.837 * (exp(0.04 * vk) - 1.0) / (vk * exp(0.04 * (v + 35.0)));
	double ik = 0.282 * p[LR1_GK] * y[LR1_X] * xi * (v - LR1_EK);
	double ax = 0.0005 * exp(0.083 * (v + 50.0)) / (1.0 + exp(0.057 * (v + 50.0)));
	double bx = 0.0013 * exp(-0.06 * (v + 20.0)) / (1.0 + exp(-0.04 * (v + 20.0)));

	/* time-independent potassium, plateau potassium and background currents */
	double vk1 = v - LR1_EK1;
	double ak1 = 1.02 / (1.0 + exp(0.2385 * (vk1 - 59.215)));
	double bk1 = (0.49124 * exp(0.08032 * (vk1 + 5.476)) + exp(0.06175 * (vk1 - 594.31))) /
		     (1.0 + exp(-0.5143 * (vk1 + 4.753)));
	double ik1 = 0.6047 * ak1 / (ak1 + bk1) * vk1;
	double ikp = 0.0183 / (1.0 + exp((7.488 - v) / 5.98)) * vk1;
	double ib = 0.03921 * (v + 59.87);

	dy[LR1_V] = -(ina + isi + ik + ik1 + ikp + ib + istim);
	dy[LR1_M] = lr1_gate(am, bm, m);
	dy[LR1_H] = lr1_gate(ah, bh, y[LR1_H]);
	dy[LR1_J] = lr1_gate(aj, bj, y[LR1_J]);
	dy[LR1_D] = lr1_gate(ad, bd, y[LR1_D]);
	dy[LR1_F] = lr1_gate(af, bf, y[LR1_F]);
	dy[LR1_X] = lr1_gate(ax, bx, y[LR1_X]);
	dy[LR1_CAI] = -1e-4 * isi + 0.07 * (1e-4 - y[LR1_CAI]);
}

/* One classic Runge-Kutta step of length dt, stimulus held over the step. */
MYO_FN void lr1_rk4(double *y, const double *p, double istim, double dt)
{
	double k1[LR1_NY], k2[LR1_NY], k3[LR1_NY], k4[LR1_NY], t[LR1_NY];
	int i;

	lr1_deriv(y, p, istim, k1);
	for (i = 0; i < LR1_NY; i++)
		t[i] = y[i] + 0.5 * dt * k1[i];
	lr1_deriv(t, p, istim, k2);
	for (i = 0; i < LR1_NY; i++)
		t[i] = y[i] + 0.5 * dt * k2[i];
	lr1_deriv(t, p, istim, k3);
	for (i = 0; i < LR1_NY; i++)
		t[i] = y[i] + dt * k3[i];
	lr1_deriv(t, p, istim, k4);
	for (i = 0; i < LR1_NY; i++)
		y[i] = y[i] + dt / 6.0 * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i]);
}

/*
 * Steps s0 .. s0+n-1 of one cell; the stimulus is on for steps
 * [p[LR1_ON], p[LR1_ON] + stim_steps): step numbers, so that every device
 * decides it exactly.  *vmax keeps the highest V seen.
 */
MYO_FN void lr1_run(double *y, const double *p, long long s0, int n, int stim_steps, double dt,
		    double *vmax)
{
	for (long long s = s0; s < s0 + n; s++) {
		double on = p[LR1_ON], st = (double)s;
		lr1_rk4(y, p, st >= on && st < on + stim_steps ? -LR1_STIM : 0.0, dt);
		if (y[LR1_V] > *vmax)
			*vmax = y[LR1_V];
	}
}

/*
 * Work of one lr1_run() step in FP32 flops (for the simgpu cost model; see
 * twins.c for the conventions): 4 derivatives of 29 exp (the V < -40
 * branch; 24 above), 1 log, 17 divisions and ~100 other double operations,
 * plus the RK4 combinations (~130 double operations).
 */
#define LR1_STEP_FLOPS (4.0 * (29 * 58 + 95 + 17 * 36 + 100 * 2) + 130 * 2)

#endif
