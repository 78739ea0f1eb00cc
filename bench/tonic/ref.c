/*
 * ref.c - the CPU reference forward pass of a plan (for --check).
 *
 * Plain loops with double accumulators, written from the layer
 * definitions and independent of cuDNN/cuBLAS conventions except the ones
 * the GPU path must honour: cross-correlation (no filter flip), floor
 * output sizes, per-sample softmax over C x H x W.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"

static float activate(double v, enum act_kind a)
{
	if (a == ACT_RELU)
		return v > 0 ? (float)v : 0.0f;
	if (a == ACT_HARDTANH)
		return v > 1 ? 1.0f : (v < -1 ? -1.0f : (float)v);
	return (float)v;
}

static void conv(const struct layer_plan *lp, const float *wt, const float *bias, int n,
		 const float *x, float *y)
{
	const struct layer_def *d = lp->def;
	int C = lp->in_c, H = lp->in_h, W = lp->in_w, K = lp->out_c;
	int P = lp->out_h, Q = lp->out_w, R = d->win;

	for (int b = 0; b < n; b++)
	for (int k = 0; k < K; k++)
	for (int p = 0; p < P; p++)
	for (int q = 0; q < Q; q++) {
		double acc = bias[k];

		for (int c = 0; c < C; c++)
		for (int r = 0; r < R; r++) {
			int iy = p * d->stride - d->pad + r;

			if (iy < 0 || iy >= H)
				continue;
			const float *xrow = x + (((size_t)b * C + c) * H + iy) * W;
			const float *wrow = wt + (((size_t)k * C + c) * R + r) * R;
			for (int s = 0; s < R; s++) {
				int ix = q * d->stride - d->pad + s;

				if (ix >= 0 && ix < W)
					acc += (double)xrow[ix] * wrow[s];
			}
		}
		y[(((size_t)b * K + k) * P + p) * Q + q] = activate(acc, d->act);
	}
}

static void maxpool(const struct layer_plan *lp, int n, const float *x, float *y)
{
	int C = lp->in_c, H = lp->in_h, W = lp->in_w, P = lp->out_h, Q = lp->out_w;
	int R = lp->def->win, st = lp->def->stride;

	for (int b = 0; b < n; b++)
	for (int c = 0; c < C; c++)
	for (int p = 0; p < P; p++)
	for (int q = 0; q < Q; q++) {
		const float *xp = x + ((size_t)b * C + c) * H * W;
		float m = -INFINITY;

		for (int r = 0; r < R; r++)
			for (int s = 0; s < R; s++) {
				float v = xp[(size_t)(p * st + r) * W + q * st + s];

				if (v > m)
					m = v;
			}
		y[(((size_t)b * C + c) * P + p) * Q + q] = m;
	}
}

static void fc(const struct layer_plan *lp, const float *wt, const float *bias, int n,
	       const float *x, float *y)
{
	int in = lp->fan_in, out = lp->out_c;

	for (int b = 0; b < n; b++)
		for (int o = 0; o < out; o++) {
			double acc = bias[o];
			const float *wr = wt + (size_t)o * in, *xr = x + (size_t)b * in;

			for (int i = 0; i < in; i++)
				acc += (double)wr[i] * xr[i];
			y[(size_t)b * out + o] = activate(acc, lp->def->act);
		}
}

static void softmax(const struct layer_plan *lp, int n, const float *x, float *y)
{
	size_t m = (size_t)lp->in_c * lp->in_h * lp->in_w;

	for (int b = 0; b < n; b++) {
		const float *xr = x + b * m;
		float *yr = y + b * m;
		double mx = -INFINITY, sum = 0;

		for (size_t i = 0; i < m; i++)
			mx = xr[i] > mx ? xr[i] : mx;
		for (size_t i = 0; i < m; i++)
			sum += exp((double)xr[i] - mx);
		for (size_t i = 0; i < m; i++)
			yr[i] = (float)(exp((double)xr[i] - mx) / sum);
	}
}

/* E has size + 2 * halo rows of D features; rows beyond the sentence are
 * every table's row 0 (padding). */
static void embed(const struct net_plan *p, const struct layer_plan *lp, const float *blob,
		  int size, const int32_t *ids, float *e)
{
	const struct net_def *d = p->def;
	int D = lp->out_c, rows = net_rows_of(p, size, 1);
	size_t toff = lp->w_off;
	int col = 0;

	for (int f = 0; f < d->nfeat; f++) {
		const float *tab = blob + toff;
		int dim = d->feat[f].dim;

		for (int t = 0; t < rows; t++) {
			int w = t - p->halo, row = 0;

			if (w >= 0 && w < size)
				row = net_word_row(ids[(size_t)w * d->nfeat + f], d->feat[f].rows);
			memcpy(e + (size_t)t * D + col, tab + (size_t)row * dim, dim * sizeof(float));
		}
		toff += (size_t)d->feat[f].rows * dim;
		col += dim;
	}
}

static void window(const struct layer_plan *lp, const float *wt, const float *bias, int size,
		   const float *e, float *y)
{
	int D = lp->in_c, O = lp->out_c, win = lp->def->win;

	for (int t = 0; t < size; t++)
		for (int o = 0; o < O; o++) {
			double acc = bias[o];

			for (int j = 0; j < win; j++) {
				const float *wr = wt + ((size_t)j * O + o) * D;
				const float *er = e + (size_t)(t + j) * D;

				for (int i = 0; i < D; i++)
					acc += (double)wr[i] * er[i];
			}
			y[(size_t)t * O + o] = activate(acc, lp->def->act);
		}
}

int net_ref_forward(const struct net_plan *p, const float *blob, int size, const void *in,
		    float *out)
{
	float *buf[2] = { malloc(p->max_act * sizeof(float)), malloc(p->max_act * sizeof(float)) };
	const float *x = in;
	int cur = 0;

	if (!buf[0] || !buf[1]) {
		free(buf[0]);
		free(buf[1]);
		return -1;
	}
	for (int i = 0; i < p->nlayers; i++) {
		const struct layer_plan *lp = &p->l[i];
		const float *wt = blob + lp->w_off, *bias = blob + lp->b_off;
		float *y = buf[cur];

		switch (lp->def->kind) {
		case L_CONV:
			conv(lp, wt, bias, size, x, y);
			break;
		case L_POOL:
			maxpool(lp, size, x, y);
			break;
		case L_FC:
			fc(lp, wt, bias, size, x, y);
			break;
		case L_SOFTMAX:
			softmax(lp, size, x, y);
			break;
		case L_EMBED:
			embed(p, lp, blob, size, in, y);
			break;
		case L_WINDOW:
			window(lp, wt, bias, size, x, y);
			break;
		}
		x = y;
		cur = 1 - cur;
	}
	memcpy(out, x, (size_t)size * p->out_per * sizeof(float));
	free(buf[0]);
	free(buf[1]);
	return 0;
}
