/*
 * plan.c - instantiate a network definition: scaled shapes, parameter
 * offsets, buffer sizes; deterministic parameters and synthetic inputs.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "net.h"

static const struct net_def *const all_nets[] = {
	&net_face, &net_dig, &net_imc, &net_pos, &net_chk, &net_ner,
	&net_fsr, &net_vgg, &net_cap, &net_sem, &net_gan, &net_bert, &net_nmt,
};
#define NNETS (sizeof(all_nets) / sizeof(all_nets[0]))

const struct net_def *net_find(const char *name)
{
	for (size_t i = 0; i < NNETS; i++)
		if (!strcmp(all_nets[i]->name, name))
			return all_nets[i];
	return NULL;
}

const char *net_names(void)
{
	return "face dig imc pos chk ner fsr vgg cap sem gan bert nmt";
}

static int bad(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

int net_rows_of(const struct net_plan *p, int size, int with_halo)
{
	return size + (with_halo ? 2 * p->halo : 0);
}

int net_layer_ops(const struct net_plan *p, int layer)
{
	const struct layer_plan *lp = &p->l[layer];
	enum layer_kind k = lp->def->kind;
	int n;

	if (k == L_EMBED)
		return p->def->nfeat;
	if (k == L_WINDOW)
		return 2;            /* GEMM, then the sum (bias and act inside) */
	n = 1;
	if (lp->b_len)
		n++;                 /* cudnnAddTensor */
	if (lp->def->act == ACT_RELU)
		n++;                 /* cudnnActivationForward */
	return n;
}

/* Output side of a window sliding over `in` with padding and stride. */
static int slide(int in, int win, int pad, int stride)
{
	if (in + 2 * pad < win || stride < 1)
		return 0;
	return (in + 2 * pad - win) / stride + 1;
}

int net_plan_make(struct net_plan *p, const struct net_def *d, double width, int res,
		  int max_size, uint64_t seed, char *err, size_t errlen)
{
	int c, h, w, i, embed_win = 0;
	size_t off = 0, rows;

	memset(p, 0, sizeof(*p));
	if (!(width > 0 && width <= 16))
		return bad(err, errlen, "width %g is not in (0, 16]", width);
	if (max_size < 1 || max_size > 65536)
		return bad(err, errlen, "max size %d is not in 1..65536", max_size);
	if (d->nlayers < 1 || d->nlayers > NET_MAX_LAYERS)
		return bad(err, errlen, "%s: %d layers", d->name, d->nlayers);
	p->def = d;
	p->nlayers = d->nlayers;
	p->max_size = max_size;
	p->seed = seed;
	if (d->input == TONIC_IMAGES) {
		c = d->c;
		h = w = res > 0 ? res : d->hw;
		p->unit_in = (size_t)c * h * w;
		p->unit_bytes = p->unit_in * sizeof(float);
	} else {
		if (d->nfeat < 1 || d->nfeat > NET_MAX_FEATS || d->layer[0].kind != L_EMBED)
			return bad(err, errlen, "%s: a word net starts with EMBED", d->name);
		c = d->nfeat;
		h = w = 1;
		p->unit_in = (size_t)d->nfeat;
		p->unit_bytes = p->unit_in * sizeof(int32_t);
		p->halo = d->layer[0].win / 2;
	}
	rows = (size_t)net_rows_of(p, max_size, 1);
	for (i = 0; i < d->nlayers; i++) {
		const struct layer_def *ld = &d->layer[i];
		struct layer_plan *lp = &p->l[i];
		int oc = c, oh = h, ow = w;

		lp->def = ld;
		lp->out = ld->out;
		if (!ld->fixed && ld->out > 0)
			lp->out = (int)fmax(1.0, lround(ld->out * width));
		lp->in_c = c, lp->in_h = h, lp->in_w = w;
		switch (ld->kind) {
		case L_CONV:
			oc = lp->out;
			oh = slide(h, ld->win, ld->pad, ld->stride);
			ow = slide(w, ld->win, ld->pad, ld->stride);
			lp->fan_in = c * ld->win * ld->win;
			lp->w_len = (size_t)oc * lp->fan_in;
			lp->b_len = (size_t)oc;
			break;
		case L_POOL:
			oh = slide(h, ld->win, 0, ld->stride);
			ow = slide(w, ld->win, 0, ld->stride);
			break;
		case L_FC:
			lp->fan_in = c * h * w;
			oc = lp->out, oh = ow = 1;
			lp->w_len = (size_t)oc * lp->fan_in;
			lp->b_len = (size_t)oc;
			break;
		case L_SOFTMAX:
			break;
		case L_EMBED:
			if (i != 0 || ld->win < 1 || ld->win % 2 == 0)
				return bad(err, errlen, "%s: EMBED must come first, odd window", d->name);
			embed_win = ld->win;
			oc = 0;
			for (int f = 0; f < d->nfeat; f++) {
				if (d->feat[f].rows < 1 || d->feat[f].dim < 1)
					return bad(err, errlen, "%s: empty feature %d", d->name, f);
				oc += d->feat[f].dim;
				lp->w_len += (size_t)d->feat[f].rows * d->feat[f].dim;
			}
			break;
		case L_WINDOW:
			if (ld->win != embed_win)
				return bad(err, errlen, "%s: WINDOW needs an EMBED of its window", d->name);
			lp->fan_in = ld->win * c;
			oc = lp->out;
			lp->w_len = (size_t)ld->win * oc * c;
			lp->b_len = (size_t)oc;
			if (ld->win * (size_t)oc * rows > p->scratch)
				p->scratch = ld->win * (size_t)oc * rows;
			break;
		default:
			return bad(err, errlen, "%s: layer %d has an unknown kind", d->name, i);
		}
		if (oc < 1 || oh < 1 || ow < 1)
			return bad(err, errlen, "%s: layer %d output is %dx%dx%d (input too small: raise --res)",
				   d->name, i, oc, oh, ow);
		lp->out_c = oc, lp->out_h = oh, lp->out_w = ow;
		lp->w_off = off;
		off += lp->w_len;
		lp->b_off = off;
		off += lp->b_len;
		if ((size_t)oc * oh * ow * rows > p->max_act)
			p->max_act = (size_t)oc * oh * ow * rows;
		c = oc, h = oh, w = ow;
	}
	p->nparams = off;
	p->out_per = c * h * w;
	for (i = 0; i < p->nlayers; i++)
		p->nops += net_layer_ops(p, i);
	return 0;
}

uint64_t net_fnv1a64(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t h = 0xcbf29ce484222325ULL;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ULL;
	return h;
}

/* splitmix64's output function: element i of a stream is mix(key + i). */
static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static uint64_t stream_key(uint64_t seed, uint64_t tag)
{
	return mix(seed ^ mix(tag));
}

/* n floats uniform in [-a, a) from a stream. */
static void uniform(float *dst, size_t n, uint64_t key, float a)
{
	for (size_t i = 0; i < n; i++) {
		double u = (double)(mix(key + i * 0x9e3779b97f4a7c15ULL) >> 40) * (1.0 / 16777216.0);
		dst[i] = (float)((2.0 * u - 1.0) * a);
	}
}

/*
 * Untrained but well-scaled: uniform weights of variance 2 / fan_in before
 * a ReLU (He) and 1 / fan_in otherwise, so activations neither vanish nor
 * blow up through the depth of AlexNet; small biases; embeddings in [-1, 1).
 */
void net_params_fill(const struct net_plan *p, float *blob)
{
	for (int i = 0; i < p->nlayers; i++) {
		const struct layer_plan *lp = &p->l[i];
		uint64_t kw = stream_key(p->seed, 2 * (uint64_t)i);
		uint64_t kb = stream_key(p->seed, 2 * (uint64_t)i + 1);
		double gain = lp->def->act == ACT_RELU ? 6.0 : 3.0;

		if (lp->def->kind == L_EMBED)
			uniform(blob + lp->w_off, lp->w_len, kw, 1.0f);
		else if (lp->w_len)
			uniform(blob + lp->w_off, lp->w_len, kw, (float)sqrt(gain / lp->fan_in));
		if (lp->b_len)
			uniform(blob + lp->b_off, lp->b_len, kb, 0.05f);
	}
}

void net_input_fill(const struct net_plan *p, int size, void *in)
{
	uint64_t key = stream_key(p->seed, 0x696e707574ULL);   /* "input" */
	size_t n = (size_t)size * p->unit_in;

	if (p->def->input == TONIC_IMAGES) {
		float *x = in;

		for (size_t i = 0; i < n; i++)
			x[i] = (float)((mix(key + i * 0x9e3779b97f4a7c15ULL) >> 40) *
				       (1.0 / 16777216.0));
	} else {
		int32_t *ids = in;

		for (size_t i = 0; i < n; i++) {
			int rows = p->def->feat[i % p->def->nfeat].rows;

			ids[i] = (int32_t)((mix(key + i * 0x9e3779b97f4a7c15ULL) >> 33) %
					   (uint64_t)rows);
		}
	}
}
