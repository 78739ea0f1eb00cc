/*
 * mlp.c - a trained MLPRegressor with its scaling (prep.py) in double
 * precision; see infer.h.  Results equal scikit-learn's within rounding:
 * the sums run in another order than BLAS's and may be fused (FMA).
 *
 * On x86-64 CPUs with AVX2 + FMA (checked once, at the first call), rows go
 * through the network in blocks of ROWS, so that each weight loaded serves
 * ROWS rows, and outputs in chunks of CHUNK whose accumulators stay in
 * vector registers for the whole sum over the inputs.  Elsewhere a plain C
 * loop, one row at a time, that the compiler vectorises for its target.
 * A 3 x 32 network's weights (~30 KB) stay in L1.  The one-hot part of the
 * first layer is never materialised: a code adds its weight row.
 */
#include <math.h>
#include <string.h>

#include "infer.h"

#define ROWS  4
#define CHUNK 8
#define WID   PR_MLP_MAX_WIDTH

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_AVX2_PATH 1
#endif

/* an activation over n values; the switch is outside the loops so that
 * ReLU becomes a branch-free vector max (a branch per unit would mispredict
 * half the time) */
static void activate(int act, double *v, int32_t n)
{
	int32_t j;

	switch (act) {
	case PR_RELU:
		for (j = 0; j < n; j++)
			v[j] = v[j] > 0.0 ? v[j] : 0.0;
		break;
	case PR_TANH:
		for (j = 0; j < n; j++)
			v[j] = tanh(v[j]);
		break;
	case PR_LOGISTIC:
		for (j = 0; j < n; j++)
			v[j] = 1.0 / (1.0 + exp(-v[j]));
		break;
	case PR_EXP:
		for (j = 0; j < n; j++)
			v[j] = exp(v[j]);
		break;
	default:
		break;
	}
}

/*
 * b + sum_i in[i] * w[i * stride]: one output (the last layer's, or a tail
 * narrower than a chunk), in four partial sums so that the additions do
 * not wait on each other.
 */
static inline double dot(const double *in, int32_t nin, const double *w, int32_t stride,
			 double b)
{
	double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
	int32_t i = 0;

	for (; i + 4 <= nin; i += 4) {
		s0 += in[i] * w[(int64_t)i * stride];
		s1 += in[i + 1] * w[(int64_t)(i + 1) * stride];
		s2 += in[i + 2] * w[(int64_t)(i + 2) * stride];
		s3 += in[i + 3] * w[(int64_t)(i + 3) * stride];
	}
	for (; i < nin; i++)
		s0 += in[i] * w[(int64_t)i * stride];
	return b + ((s0 + s1) + (s2 + s3));
}

/* out[j] = b[j] + sum_i in[i] * w[i][j]: the portable path, one row */
static void dense_plain(const double *in, int32_t nin, const double *w, const double *b,
			int32_t nout, double *restrict out)
{
	int32_t i, j;

	if (nout < 4) {
		for (j = 0; j < nout; j++)
			out[j] = dot(in, nin, w + j, nout, b[j]);
		return;
	}
	memcpy(out, b, (size_t)nout * sizeof(*out));
	for (i = 0; i < nin; i++) {
		const double a = in[i];
		const double *restrict row = w + (int64_t)i * nout;

		if (a == 0.0)           /* ReLU-dead units */
			continue;
		for (j = 0; j < nout; j++)
			out[j] += a * row[j];
	}
}

#ifdef HAVE_AVX2_PATH
/* four doubles; the u variant may sit at any 8-byte boundary (weight rows) */
typedef double v4d __attribute__((vector_size(32)));
typedef double v4du __attribute__((vector_size(32), aligned(8)));

/*
 * out[r][j] = b[j] + sum_i in[r][i] * w[i][j] for nr rows (rows WID apart).
 * Inlined into AVX2 functions with a constant nr, so the ROWS x CHUNK
 * accumulators are a fixed set of ymm registers: 2 x ROWS independent sums
 * hide the FMA latency.
 */
static inline __attribute__((always_inline))
void dense_n(const double *in, int32_t nin, const double *w, const double *b,
	     int32_t nout, double *restrict out, const int nr)
{
	int32_t i, j, j0;
	int r;

	for (j0 = 0; j0 + CHUNK <= nout; j0 += CHUNK) {
		v4d acc[ROWS][2];
		const v4d b0 = *(const v4du *)(b + j0), b1 = *(const v4du *)(b + j0 + 4);

		for (r = 0; r < nr; r++) {
			acc[r][0] = b0;
			acc[r][1] = b1;
		}
		for (i = 0; i < nin; i++) {
			const double *row = w + (int64_t)i * nout + j0;
			const v4d w0 = *(const v4du *)row, w1 = *(const v4du *)(row + 4);

			for (r = 0; r < nr; r++) {
				const double a = in[r * WID + i];

				acc[r][0] += a * w0;
				acc[r][1] += a * w1;
			}
		}
		for (r = 0; r < nr; r++) {
			*(v4du *)(out + r * WID + j0) = acc[r][0];
			*(v4du *)(out + r * WID + j0 + 4) = acc[r][1];
		}
	}
	for (r = 0; r < nr; r++)            /* a tail narrower than a chunk */
		for (j = j0; j < nout; j++)
			out[r * WID + j] = dot(in + r * WID, nin, w + j, nout, b[j]);
}

__attribute__((target("avx2,fma")))
static void dense_avx2_1(const double *in, int32_t nin, const double *w, const double *b,
			 int32_t nout, double *restrict out)
{
	dense_n(in, nin, w, b, nout, out, 1);
}

__attribute__((target("avx2,fma")))
static void dense_avx2_n(const double *in, int32_t nin, const double *w, const double *b,
			 int32_t nout, double *restrict out)
{
	dense_n(in, nin, w, b, nout, out, ROWS);
}

static int have_avx2(void)
{
	static int known = -1;          /* a race here only repeats the test */

	if (known < 0) {
		__builtin_cpu_init();
		known = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	}
	return known;
}
#else
static int have_avx2(void)
{
	return 0;
}
#endif

/* one layer for nr rows (ROWS at most), rows WID apart */
static void dense(const double *in, int32_t nin, const double *w, const double *b,
		  int32_t nout, double *out, int nr)
{
	int r;

#ifdef HAVE_AVX2_PATH
	if (have_avx2()) {
		if (nr == ROWS)
			dense_avx2_n(in, nin, w, b, nout, out);
		else
			for (r = 0; r < nr; r++)
				dense_avx2_1(in + r * WID, nin, w, b, nout, out + r * WID);
		return;
	}
#endif
	for (r = 0; r < nr; r++)
		dense_plain(in + r * WID, nin, w, b, nout, out + r * WID);
}

/* Prep's numeric part of one row into in[0..nnum) */
static void scale_row(const struct pr_mlp *m, const double *x, double *in)
{
	int32_t i;

	for (i = 0; i < m->nnum; i++) {
		double v = x[m->num_col[i]];

		if (m->num_log[i] && v != 0.0)
			/* log(1 + x), not log1p: several times faster in glibc;
			 * the two differ by less than 1e-15 absolute, far below
			 * what the 1e-6 agreement with sklearn allows */
			v = copysign(log(1.0 + fabs(v)), v);
		in[i] = (v - m->mean[i]) * m->inv_scale[i];
	}
}

/* the one-hot part of the first layer: each valid code adds its weight row
 * (an unknown or non-integral code is all zeros, as in Prep) */
static void add_codes(const struct pr_mlp *m, const double *x, double *out)
{
	int32_t c, j, off = m->nnum, nout = m->width[1];

	for (c = 0; c < m->ncat; c++) {
		double code = x[m->cat_col[c]];

		if (code >= 0.0 && code < (double)m->cat_size[c] && code == floor(code)) {
			const double *row = m->w + (int64_t)(off + (int32_t)code) * nout;

			for (j = 0; j < nout; j++)
				out[j] += row[j];
		}
		off += m->cat_size[c];
	}
}

/* nr (1 or ROWS) rows X[r * stride] -> y[r] */
static void eval_rows(const struct pr_mlp *m, const double *X, int64_t stride, int nr,
		      double *y)
{
	double buf[2][ROWS * WID];
	double *in = buf[0], *out = buf[1], *tmp;
	const double *w = m->w, *b = m->b;
	int32_t l;
	int r;

	for (r = 0; r < nr; r++)
		scale_row(m, X + r * stride, in + r * WID);
	for (l = 0; l < m->nlayers; l++) {
		int32_t nin = l ? m->width[l] : m->nnum, nout = m->width[l + 1];
		int act = l + 1 < m->nlayers ? m->act : m->out_act;

		dense(in, nin, w, b, nout, out, nr);
		if (l == 0)
			for (r = 0; r < nr; r++)
				add_codes(m, X + r * stride, out + r * WID);
		for (r = 0; r < nr; r++)
			activate(act, out + r * WID, nout);
		w += (int64_t)m->width[l] * nout;
		b += nout;
		tmp = in;
		in = out;
		out = tmp;
	}
	for (r = 0; r < nr; r++) {
		double z = in[r * WID];

		y[r] = m->ylog ? exp(z * m->yscale + m->ymean) : z;
	}
}

double pr_mlp_one(const struct pr_mlp *m, const double *x)
{
	double y;

	eval_rows(m, x, 0, 1, &y);
	return y;
}

void pr_mlp_batch(const struct pr_mlp *m, const double *X, int64_t nrows, int64_t stride,
		  double *out)
{
	int64_t r = 0;

	for (; r + ROWS <= nrows; r += ROWS)
		eval_rows(m, X + r * stride, stride, ROWS, out + r);
	for (; r < nrows; r++)
		eval_rows(m, X + r * stride, stride, 1, out + r);
}
