/*
 * forest.c - decision trees and forests with scikit-learn's semantics, so
 * that the outputs are bit-identical to DecisionTreeRegressor.predict and
 * RandomForestRegressor.predict (see infer.h).
 *
 * Nothing here rounds differently from scikit-learn: a double->float cast,
 * float->double promotion for the compare, one addition per tree in tree
 * order and one division, all in IEEE double without contraction (there is
 * no a * b + c for a compiler to fuse).
 *
 * Speed: a walk down a big tree is a chain of cache misses, one per level.
 * LANES independent walks (the trees of one row, or the rows of one tree)
 * advance together, one level each per step, so their misses overlap.
 */
#include <math.h>

#include "infer.h"

#define LANES 8

/* Walk nl (<= LANES) trees at once: walk k starts at nodes[root[k]] with
 * row x[k]; val[k] gets the leaf's value. */
static void walk(const struct pr_node *nodes, const int32_t *root, const double *const *x,
		 int nl, double *val)
{
	const struct pr_node *n[LANES];
	int k, live;

	for (k = 0; k < nl; k++)
		n[k] = &nodes[root[k]];
	do {
		live = 0;
		for (k = 0; k < nl; k++) {
			const struct pr_node *p = n[k];
			float v;

			if (p->left < 0)
				continue;
			v = (float)x[k][p->feat];       /* sklearn predicts on float32 X */
			if (isnan(v))
				n[k] = &nodes[p->nan_left ? p->left : p->right];
			else
				n[k] = &nodes[(double)v <= p->v ? p->left : p->right];
			live = 1;
		}
	} while (live);
	for (k = 0; k < nl; k++)
		val[k] = n[k]->v;
}

double pr_forest_one(const struct pr_forest *f, const double *x)
{
	const double *xs[LANES];
	double val[LANES], acc = 0.0;
	int32_t t, k, nl;

	for (k = 0; k < LANES; k++)
		xs[k] = x;
	if (!f->average) {
		walk(f->nodes, f->roots, xs, 1, val);
		return val[0];
	}
	for (t = 0; t < f->ntrees; t += nl) {
		nl = f->ntrees - t < LANES ? f->ntrees - t : LANES;
		walk(f->nodes, f->roots + t, xs, nl, val);
		for (k = 0; k < nl; k++)        /* in tree order, as sklearn sums */
			acc += val[k];
	}
	return acc / (double)f->ntrees;
}

void pr_forest_batch(const struct pr_forest *f, const double *X, int64_t nrows,
		     int64_t stride, double *out)
{
	const double *xs[LANES];
	int32_t root[LANES], t;
	double val[LANES];
	int64_t i;
	int k, nl;

	/* tree by tree (its nodes stay in cache for every row); each row
	 * still sums its trees in order */
	for (t = 0; t < f->ntrees; t++) {
		for (k = 0; k < LANES; k++)
			root[k] = f->roots[t];
		for (i = 0; i < nrows; i += nl) {
			nl = nrows - i < LANES ? (int)(nrows - i) : LANES;
			for (k = 0; k < nl; k++)
				xs[k] = X + (i + k) * stride;
			walk(f->nodes, root, xs, nl, val);
			for (k = 0; k < nl; k++) {
				if (!f->average)
					out[i + k] = val[k];
				else if (t == 0)
					out[i + k] = 0.0 + val[k];
				else
					out[i + k] += val[k];
			}
		}
		if (!f->average)
			return;
	}
	for (i = 0; i < nrows; i++)
		out[i] /= (double)f->ntrees;
}
