/*
 * pair.h - lavaMD's pair interaction, shared by the kernel (main.cu), its
 * CPU reference (main.cu) and its simgpu twin (twins.c), so that all three
 * do the same operations in the same order.
 *
 * A particle is four doubles {v, x, y, z} with v = x^2 + y^2 + z^2, and a
 * charge q.  Particle j acts on particle i with the potential
 * q_j exp(-a2 r^2) and the force q_j 2 exp(-a2 r^2) (r_i - r_j), where
 * r^2 = v_i + v_j - 2 r_i.r_j (Rodinia's lavaMD; a2 = 2 alpha^2).
 */
#ifndef LAVAMD_PAIR_H
#define LAVAMD_PAIR_H

#include <math.h>

#ifdef __CUDACC__
#define LAVA_FN __host__ __device__ static inline
#else
#define LAVA_FN static inline
#endif

#define LAVA_NEI 27     /* a box and its 26 neighbours, at most */

/* Set c[0..3] to the potential and the force that j (charge qj) exerts on i. */
LAVA_FN void lava_pair(const double *ri, const double *rj, double qj, double a2, double *c)
{
	double dot = ri[1] * rj[1] + ri[2] * rj[2] + ri[3] * rj[3];
	double r2 = ri[0] + rj[0] - 2.0 * dot;
	double vij = exp(-(a2 * r2));
	double fs = 2.0 * vij;

	c[0] = qj * vij;
	c[1] = qj * (fs * (ri[1] - rj[1]));
	c[2] = qj * (fs * (ri[2] - rj[2]));
	c[3] = qj * (fs * (ri[3] - rj[3]));
}

/* Arithmetic of one lava_pair() plus its accumulation, in double flops:
 * dot 5, r2 3, u2 and its negation 2, fs 1, 3 differences, 3 + 4
 * multiplies, 4 additions = 25, and one exp(). */
#define LAVA_PAIR_DFLOPS 25

#endif
