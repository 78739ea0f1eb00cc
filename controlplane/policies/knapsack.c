/*
 * knapsack.c -- C-Laius batch packing (Eq. 4/5): a multiple-choice knapsack
 * over SM quota units with a memory-bandwidth cap.
 *
 * Each batch app i takes k in {0..nunits} units; it is worth value[i][k]
 * (predicted IPC at k units) and pulls bw[i][k] GB/s.  Maximise the summed
 * value subject to  sum k <= nunits  and, when use_cap,  sum bw <= bw_cap.
 *
 * The paper enumerates allocations best-first and rejects those that break
 * the bandwidth cap.  We get the same answer -- the best allocation that
 * meets the cap -- exactly, however deep in that order it lies, with a
 * depth-first branch and bound: the bound is the unconstrained optimum of the
 * apps not yet decided (a DP over units, Eq. 5 without the cap), and children
 * are visited best bound first, so with no cap binding the first leaf reached
 * is the optimum and nothing else is explored.  A k-best DP with a fixed k
 * would miss a feasible allocation ranked below k; this cannot.
 *
 * When the cap binds, that bound knows nothing of bandwidth and prunes
 * little.  So a child is also cut by Lagrangian bounds: for lambda >= 0,
 * the apps still to place can reach at most
 *     lbound_lambda[i][u] + lambda * (bandwidth left),
 * lbound_lambda being the same DP over value - lambda * bandwidth (any
 * allocation within the cap gains at least as much from the second term
 * as it loses in the first).  KS_LAG multipliers around the instance's
 * value per GB/s are tried; the smallest bound counts.
 *
 * The Python reference (claius.py: knapsack_py) runs the same search in the
 * same order with the same float operations, so both return the same choice,
 * ties included.  No I/O; the Lagrangian tables are one allocation.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define KS_MAX_APPS  64
#define KS_MAX_UNITS 100
#define KS_LAG       4          /* Lagrange multipliers tried */

/* multipliers, as multiples of (best uncapped value) / (bandwidth cap) */
static const double ks_lag_scale[KS_LAG] = { 0.25, 0.5, 1.0, 2.0 };

struct ks_search {
	int napps, nunits;
	const double *value, *bw;          /* napps x (nunits + 1), row-major */
	double cap;
	int use_cap;
	double bound[KS_MAX_APPS + 1][KS_MAX_UNITS + 1]; /* best of apps i.. with u units */
	double minbw[KS_MAX_APPS + 1];     /* least bandwidth apps i.. can pull  */
	double lam[KS_LAG];
	double *lbound;                    /* KS_LAG x (napps+1) x (nunits+1), or NULL */
	int cur[KS_MAX_APPS];
	int best_choice[KS_MAX_APPS];
	double best, best_bw;
	int found;
	long nodes, max_nodes;
};

#define V(s, i, k) ((s)->value[(size_t)(i) * ((s)->nunits + 1) + (k)])
#define B(s, i, k) ((s)->bw[(size_t)(i) * ((s)->nunits + 1) + (k)])
#define LB(s, m, i, u) \
	((s)->lbound[((size_t)(m) * ((s)->napps + 1) + (i)) * ((s)->nunits + 1) + (u)])

/* lbound[m][i][u]: the DP of ks_bounds over value - lam[m] * bandwidth. */
static void ks_lag_bounds(struct ks_search *s)
{
	int m, i, u, k;

	for (m = 0; m < KS_LAG; m++) {
		for (u = 0; u <= s->nunits; u++)
			LB(s, m, s->napps, u) = 0.0;
		for (i = s->napps - 1; i >= 0; i--)
			for (u = 0; u <= s->nunits; u++) {
				double b = (V(s, i, 0) - s->lam[m] * B(s, i, 0)) + LB(s, m, i + 1, u);

				for (k = 1; k <= u; k++) {
					double c = (V(s, i, k) - s->lam[m] * B(s, i, k)) +
						   LB(s, m, i + 1, u - k);

					if (c > b)
						b = c;
				}
				LB(s, m, i, u) = b;
			}
	}
}

/* The least Lagrangian bound of apps i.. with u units and rest GB/s left. */
static double ks_lag(const struct ks_search *s, int i, int u, double rest)
{
	double best = LB(s, 0, i, u) + s->lam[0] * rest;
	int m;

	for (m = 1; m < KS_LAG; m++) {
		double b = LB(s, m, i, u) + s->lam[m] * rest;

		if (b < best)
			best = b;
	}
	return best;
}

/* Unconstrained suffix optimum: bound[i][u] = max over k of V(i,k) + bound[i+1][u-k]. */
static void ks_bounds(struct ks_search *s)
{
	int i, u, k;

	for (u = 0; u <= s->nunits; u++)
		s->bound[s->napps][u] = 0.0;
	s->minbw[s->napps] = 0.0;
	for (i = s->napps - 1; i >= 0; i--) {
		double m = B(s, i, 0);

		for (k = 1; k <= s->nunits; k++)
			if (B(s, i, k) < m)
				m = B(s, i, k);
		s->minbw[i] = s->minbw[i + 1] + m;
		for (u = 0; u <= s->nunits; u++) {
			double b = V(s, i, 0) + s->bound[i + 1][u];

			for (k = 1; k <= u; k++) {
				double c = V(s, i, k) + s->bound[i + 1][u - k];

				if (c > b)
					b = c;
			}
			s->bound[i][u] = b;
		}
	}
}

static void ks_dfs(struct ks_search *s, int i, int left, double val, double used)
{
	int order[KS_MAX_UNITS + 1];
	double score[KS_MAX_UNITS + 1];
	int n, j, k;

	if (s->nodes++ >= s->max_nodes)
		return;
	if (i == s->napps) {
		if (!s->found || val > s->best) {
			s->found = 1;
			s->best = val;
			s->best_bw = used;
			memcpy(s->best_choice, s->cur, sizeof(int) * (size_t)s->napps);
		}
		return;
	}
	/* children by score, best first; equal scores keep ascending k (stable) */
	n = 0;
	for (k = 0; k <= left; k++) {
		double sc = V(s, i, k) + s->bound[i + 1][left - k];

		for (j = n; j > 0 && score[j - 1] < sc; j--) {
			score[j] = score[j - 1];
			order[j] = order[j - 1];
		}
		score[j] = sc;
		order[j] = k;
		n++;
	}
	for (j = 0; j < n; j++) {
		double nused;

		k = order[j];
		/* children are sorted: once one cannot beat the best, none can */
		if (s->found && val + score[j] <= s->best)
			break;
		nused = used + B(s, i, k);
		if (s->use_cap && nused + s->minbw[i + 1] > s->cap)
			continue;
		if (s->lbound && s->found &&
		    val + V(s, i, k) + ks_lag(s, i + 1, left - k, s->cap - nused) <= s->best)
			continue;
		s->cur[i] = k;
		ks_dfs(s, i + 1, left - k, val + V(s, i, k), nused);
		if (s->nodes >= s->max_nodes)
			return;
	}
}

/*
 * Solve one instance.  choice[napps] gets each app's units.  Returns 0 when
 * the optimum was found, 1 when max_nodes stopped the search first (choice
 * is the best allocation seen), 2 when no allocation meets the cap (choice
 * all zero), -1 on bad arguments.
 */
int ks_solve(int napps, int nunits, const double *value, const double *bw, double bw_cap,
	     int use_cap, long max_nodes, int *choice, double *value_out, double *bw_out,
	     long *nodes_out)
{
	struct ks_search s;
	int i;

	if (napps < 0 || napps > KS_MAX_APPS || nunits < 0 || nunits > KS_MAX_UNITS ||
	    (napps > 0 && (!value || !bw)) || (napps > 0 && !choice) || max_nodes <= 0)
		return -1;
	s.napps = napps;
	s.nunits = nunits;
	s.value = value;
	s.bw = bw;
	s.cap = bw_cap;
	s.use_cap = use_cap;
	s.best = 0.0;
	s.best_bw = 0.0;
	s.found = 0;
	s.nodes = 0;
	s.max_nodes = max_nodes;
	ks_bounds(&s);
	s.lbound = NULL;
	if (use_cap && bw_cap > 0 && napps > 0 && s.bound[0][nunits] > 0) {
		s.lbound = malloc(sizeof(double) * KS_LAG * (size_t)(napps + 1) * (size_t)(nunits + 1));
		if (s.lbound) {          /* without it: the plain bound, same answer, slower */
			for (i = 0; i < KS_LAG; i++)
				s.lam[i] = ks_lag_scale[i] * (s.bound[0][nunits] / bw_cap);
			ks_lag_bounds(&s);
		}
	}
	ks_dfs(&s, 0, nunits, 0.0, 0.0);
	free(s.lbound);
	if (nodes_out)
		*nodes_out = s.nodes;
	if (!s.found) {
		for (i = 0; i < napps; i++)
			choice[i] = 0;
		if (value_out)
			*value_out = 0.0;
		if (bw_out)
			*bw_out = 0.0;
		return s.nodes >= s.max_nodes ? 1 : 2;
	}
	for (i = 0; i < napps; i++)
		choice[i] = s.best_choice[i];
	if (value_out)
		*value_out = s.best;
	if (bw_out)
		*bw_out = s.best_bw;
	return s.nodes >= s.max_nodes ? 1 : 0;
}
