/*
 * infer.h - compiled evaluation of trained predictors (predictors/compiled.py
 * flattens scikit-learn models into these structs; cffi calls the functions).
 *
 * Trees follow scikit-learn's own traversal exactly, so the results are the
 * same doubles: the row is cast to float (sklearn predicts on float32 X),
 * a node sends x left when (double)x <= its float64 threshold, NaN goes where
 * the node's missing_go_to_left says; a forest sums its trees' leaf values in
 * order starting from 0.0 and divides by the tree count, as
 * RandomForestRegressor.predict does with one job.
 *
 * The MLP redoes prep.py's scaling, the dense layers and the target's inverse
 * transform in double precision: equal to scikit-learn's within rounding
 * (the order of the sums differs from BLAS), not bit for bit.
 *
 * Every array is owned by the caller (numpy arrays kept alive in Python).
 */
#ifndef PREDICTORS_INFER_H
#define PREDICTORS_INFER_H

#include <stdint.h>

/* One node; a leaf has left < 0 and keeps its value in v. */
struct pr_node {
	double  v;              /* threshold, or the leaf's value             */
	int32_t left;           /* child indices into the same node array     */
	int32_t right;
	int32_t feat;           /* feature the node compares                  */
	int32_t nan_left;       /* a NaN feature goes left                     */
};

struct pr_forest {
	const struct pr_node *nodes;    /* every tree's nodes, one after another */
	const int32_t *roots;           /* ntrees indices into nodes             */
	int32_t ntrees;
	int32_t average;                /* 1: forest mean; 0: the one tree's leaf */
};

double pr_forest_one(const struct pr_forest *f, const double *x);
/* X: n rows of the model's features, row-major; out: n values. */
void pr_forest_batch(const struct pr_forest *f, const double *X, int64_t nrows,
		     int64_t stride, double *out);

enum { PR_IDENTITY = 0, PR_RELU = 1, PR_TANH = 2, PR_LOGISTIC = 3, PR_EXP = 4 };

#define PR_MLP_MAX_WIDTH 256

struct pr_mlp {
	/* prep.py's Prep: numeric columns scaled, (x - mean) / scale, and
	 * categorical codes one-hot */
	int32_t nnum;
	const int32_t *num_col;         /* nnum columns of the row            */
	const int32_t *num_log;         /* nnum flags: sign(x) log1p(|x|) first */
	const double *mean;             /* nnum                                */
	const double *inv_scale;        /* nnum: 1 / scale (a multiply is cheaper) */
	int32_t ncat;
	const int32_t *cat_col;         /* ncat columns holding a code         */
	const int32_t *cat_size;        /* ncat: one-hot widths                 */
	/* the network (at most PR_MLP_MAX_WIDTH numeric inputs and units per
	 * layer; one-hot inputs are not limited): nlayers weight matrices (width[l] x width[l + 1],
	 * row-major as sklearn's coefs_) and biases, one after another */
	int32_t nlayers;
	const int32_t *width;           /* nlayers + 1; width[nlayers] == 1    */
	const double *w;
	const double *b;
	int32_t act;                    /* hidden layers' activation           */
	int32_t out_act;                /* PR_IDENTITY or PR_EXP               */
	/* the target transform's inverse: y = exp(z * yscale + ymean) when ylog */
	int32_t ylog;
	double ymean;
	double yscale;
};

double pr_mlp_one(const struct pr_mlp *m, const double *x);
void pr_mlp_batch(const struct pr_mlp *m, const double *X, int64_t nrows, int64_t stride,
		  double *out);

#endif
