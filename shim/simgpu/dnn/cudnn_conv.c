/*
 * cudnn_conv.c - forward convolution of simgpu's CPU cuDNN.
 *
 * Algorithms:
 *   IMPLICIT_GEMM, IMPLICIT_PRECOMP_GEMM  one kernel, sgpu_cudnn_conv_fwd,
 *                                         no workspace
 *   GEMM                                  per image: sgpu_cudnn_im2col into
 *                                         the workspace (C*R*S x P*Q floats),
 *                                         then sgpu_cudnn_conv_gemm, one GEMM
 *                                         per group (batched)
 *   the others (DIRECT, FFT*, WINOGRAD*)  CUDNN_STATUS_NOT_SUPPORTED
 * The GEMM algorithm needs an output whose rows are contiguous in
 * (h, w) (hStride == W * wStride, true of NCHW); otherwise it runs the
 * implicit kernel instead, which gives the same result.
 *
 * Groups, dilation, padding, strides, both convolution modes, alpha/beta,
 * any tensor strides.  Float32 data and compute only.
 */
#include <stdlib.h>
#include <string.h>

#include "dnn_impl.h"

/* ---- kernels ----------------------------------------------------------- */

/* __global__ void sgpu_cudnn_conv_fwd(const float *x, const float *w, float *y,
 *                                     struct sgpu_conv_args a)             */
static struct sgpu_kdef k_conv = {
	"sgpu_cudnn_conv_fwd", 4,
	{ sizeof(void *), sizeof(void *), sizeof(void *), sizeof(struct sgpu_conv_args) }, NULL
};
/* __global__ void sgpu_cudnn_im2col(const float *x, float *col,
 *                                   struct sgpu_conv_args a, int img)       */
static struct sgpu_kdef k_im2col = {
	"sgpu_cudnn_im2col", 4,
	{ sizeof(void *), sizeof(void *), sizeof(struct sgpu_conv_args), sizeof(int) }, NULL
};
/* __global__ void sgpu_cudnn_conv_gemm(const float *A, const float *B, float *C,
 *                                      struct sgpu_gemm_args g)             */
static struct sgpu_kdef k_gemm = {
	"sgpu_cudnn_conv_gemm", 4,
	{ sizeof(void *), sizeof(void *), sizeof(void *), sizeof(struct sgpu_gemm_args) }, NULL
};

static inline float epilogue(float acc, float alpha, float beta, const float *old)
{
	return beta == 0.0f ? alpha * acc : alpha * acc + beta * *old;
}

/* The input row/column a filter tap (r, s) reads for output (p, q). */
static inline int tap_r(const struct sgpu_conv_args *a, int r)
{
	return a->flip ? a->r - 1 - r : r;
}

static inline int tap_s(const struct sgpu_conv_args *a, int s)
{
	return a->flip ? a->s - 1 - s : s;
}

/* floor division for a possibly negative numerator, positive d */
static inline int fdiv(int n, int d)
{
	return n >= 0 ? n / d : -((-n + d - 1) / d);
}

/* One output element, no scratch memory: the fallback. */
static float conv_point(const float *x, const float *w, const struct sgpu_conv_args *a, int n,
			int k, int p, int q)
{
	int cg = a->c, kg = a->k / a->groups, g = k / kg;
	float acc = 0.0f;

	for (int c = 0; c < cg; c++)
		for (int r = 0; r < a->r; r++) {
			int ih = p * a->u - a->pad_h + tap_r(a, r) * a->dil_h;

			if (ih < 0 || ih >= a->x.h)
				continue;
			for (int s = 0; s < a->s; s++) {
				int iw = q * a->v - a->pad_w + tap_s(a, s) * a->dil_w;

				if (iw < 0 || iw >= a->x.w)
					continue;
				acc += w[(((long long)k * cg + c) * a->r + r) * a->s + s] *
				       x[sgpu_off(&a->x, n, g * cg + c, ih, iw)];
			}
		}
	return acc;
}

/*
 * Direct convolution, one output plane (n, k) at a time: for each filter
 * tap, add w * (the shifted input row) into a P x Q accumulator; the inner
 * loop runs over the output columns whose input column is in bounds.
 */
static void conv_run(const float *x, const float *w, float *y, const struct sgpu_conv_args *a)
{
	int P = a->y.h, Q = a->y.w, cg = a->c, kg = a->k / a->groups;
	float *acc = malloc((size_t)P * Q * sizeof(float));

	for (int n = 0; n < a->x.n; n++)
		for (int k = 0; k < a->k; k++) {
			int g = k / kg;

			if (!acc) {
				for (int p = 0; p < P; p++)
					for (int q = 0; q < Q; q++) {
						float *o = y + sgpu_off(&a->y, n, k, p, q);

						*o = epilogue(conv_point(x, w, a, n, k, p, q), a->alpha,
							      a->beta, o);
					}
				continue;
			}
			memset(acc, 0, (size_t)P * Q * sizeof(float));
			for (int c = 0; c < cg; c++)
				for (int r = 0; r < a->r; r++)
					for (int s = 0; s < a->s; s++) {
						float wv = w[(((long long)k * cg + c) * a->r + r) * a->s + s];
						int dw = tap_s(a, s) * a->dil_w - a->pad_w;
						/* q*v + dw in [0, W) */
						int q0 = dw >= 0 ? 0 : fdiv(-dw + a->v - 1, a->v);
						int q1 = fdiv(a->x.w - 1 - dw, a->v);

						if (q1 >= Q)
							q1 = Q - 1;
						for (int p = 0; p < P; p++) {
							int ih = p * a->u - a->pad_h + tap_r(a, r) * a->dil_h;
							const float *xr;
							float *ar = acc + (size_t)p * Q;

							if (ih < 0 || ih >= a->x.h)
								continue;
							xr = x + sgpu_off(&a->x, n, g * cg + c, ih, 0);
							for (int q = q0; q <= q1; q++)
								ar[q] += wv * xr[(long long)(q * a->v + dw) * a->x.ws];
						}
					}
			for (int p = 0; p < P; p++)
				for (int q = 0; q < Q; q++) {
					float *o = y + sgpu_off(&a->y, n, k, p, q);

					*o = epilogue(acc[(size_t)p * Q + q], a->alpha, a->beta, o);
				}
		}
	free(acc);
}

SGPU_EXPORT void simgpu_twin_sgpu_cudnn_conv_fwd(const simgpu_launch *l)
{
	conv_run(SIMGPU_ARG(l, 0, const float *), SIMGPU_ARG(l, 1, const float *),
		 SIMGPU_ARG(l, 2, float *), &SIMGPU_ARG(l, 3, struct sgpu_conv_args));
}

/* 2 N K P Q (C/groups) R S; the input, filter and output move once (the
 * output twice when beta != 0: read and written). */
SGPU_EXPORT void simgpu_cost_sgpu_cudnn_conv_fwd(const simgpu_launch *l, double *flops,
						 double *bytes)
{
	const struct sgpu_conv_args *a = &SIMGPU_ARG(l, 3, struct sgpu_conv_args);
	double out = sgpu_count(&a->y), filt = (double)a->k * a->c * a->r * a->s;

	*flops = 2.0 * out * a->c * a->r * a->s;
	*bytes = sizeof(float) * (sgpu_count(&a->x) + filt + (a->beta != 0.0f ? 2.0 : 1.0) * out);
}

/* col[(c R + r) S + s][p Q + q] = x[img, c, tap row, tap col], 0 in the padding */
SGPU_EXPORT void simgpu_twin_sgpu_cudnn_im2col(const simgpu_launch *l)
{
	const float *x = SIMGPU_ARG(l, 0, const float *);
	float *col = SIMGPU_ARG(l, 1, float *);
	const struct sgpu_conv_args *a = &SIMGPU_ARG(l, 2, struct sgpu_conv_args);
	int n = SIMGPU_ARG(l, 3, int), P = a->y.h, Q = a->y.w;
	size_t row = 0;

	for (int c = 0; c < a->x.c; c++)
		for (int r = 0; r < a->r; r++)
			for (int s = 0; s < a->s; s++, row++) {
				float *out = col + row * (size_t)P * Q;

				for (int p = 0; p < P; p++) {
					int ih = p * a->u - a->pad_h + tap_r(a, r) * a->dil_h;

					for (int q = 0; q < Q; q++) {
						int iw = q * a->v - a->pad_w + tap_s(a, s) * a->dil_w;

						out[(size_t)p * Q + q] =
							ih < 0 || ih >= a->x.h || iw < 0 || iw >= a->x.w
								? 0.0f : x[sgpu_off(&a->x, n, c, ih, iw)];
					}
				}
			}
}

/* A copy: one image read, C R S P Q floats written. */
SGPU_EXPORT void simgpu_cost_sgpu_cudnn_im2col(const simgpu_launch *l, double *flops,
					       double *bytes)
{
	const struct sgpu_conv_args *a = &SIMGPU_ARG(l, 2, struct sgpu_conv_args);
	double cols = (double)a->x.c * a->r * a->s * a->y.h * a->y.w;

	*flops = cols;     /* index arithmetic and the bounds test */
	*bytes = sizeof(float) * ((double)a->x.c * a->x.h * a->x.w + cols);
}

SGPU_EXPORT void simgpu_twin_sgpu_cudnn_conv_gemm(const simgpu_launch *l)
{
	sgpu_gemm_run(SIMGPU_ARG(l, 0, const float *), SIMGPU_ARG(l, 1, const float *),
		      SIMGPU_ARG(l, 2, float *), &SIMGPU_ARG(l, 3, struct sgpu_gemm_args));
}

SGPU_EXPORT void simgpu_cost_sgpu_cudnn_conv_gemm(const simgpu_launch *l, double *flops,
						  double *bytes)
{
	sgpu_gemm_cost(&SIMGPU_ARG(l, 3, struct sgpu_gemm_args), flops, bytes);
}

/* ---- API --------------------------------------------------------------- */

static int algo_supported(cudnnConvolutionFwdAlgo_t algo)
{
	return algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM ||
	       algo == CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM ||
	       algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM;
}

/* All four descriptors valid and consistent, y the right shape. */
static cudnnStatus_t check_shapes(const struct cudnnTensorStruct *x,
				  const struct cudnnFilterStruct *w,
				  const struct cudnnConvolutionStruct *cv,
				  const struct cudnnTensorStruct *y)
{
	cudnnStatus_t st;
	int n, c, h, wd;

	if (sgpu_check_tensor(x) == CUDNN_STATUS_BAD_PARAM ||
	    sgpu_check_tensor(y) == CUDNN_STATUS_BAD_PARAM ||
	    sgpu_check_filter(w) == CUDNN_STATUS_BAD_PARAM ||
	    sgpu_check_conv(cv) == CUDNN_STATUS_BAD_PARAM)
		return CUDNN_STATUS_BAD_PARAM;
	st = sgpu_conv_out(cv, x, w, &n, &c, &h, &wd);
	if (st != CUDNN_STATUS_SUCCESS)
		return st;
	if (y->t.n != n || y->t.c != c || y->t.h != h || y->t.w != wd)
		return CUDNN_STATUS_BAD_PARAM;
	if ((st = sgpu_check_tensor(x)) || (st = sgpu_check_tensor(y)) ||
	    (st = sgpu_check_filter(w)) || (st = sgpu_check_conv(cv)))
		return st;
	return CUDNN_STATUS_SUCCESS;
}

static size_t workspace_need(const struct cudnnTensorStruct *x, const struct cudnnFilterStruct *w,
			     const struct cudnnTensorStruct *y, cudnnConvolutionFwdAlgo_t algo)
{
	if (algo != CUDNN_CONVOLUTION_FWD_ALGO_GEMM)
		return 0;
	return (size_t)x->t.c * w->r * w->s * (size_t)y->t.h * y->t.w * sizeof(float);
}

SGPU_EXPORT cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(
	cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
	const cudnnFilterDescriptor_t wDesc, const cudnnConvolutionDescriptor_t convDesc,
	const cudnnTensorDescriptor_t yDesc, cudnnConvolutionFwdAlgo_t algo, size_t *sizeInBytes)
{
	cudnnStatus_t st;

	if (sgpu_check_handle(handle) || !sizeInBytes)
		return CUDNN_STATUS_BAD_PARAM;
	if ((st = check_shapes(xDesc, wDesc, convDesc, yDesc)))
		return st;
	if ((unsigned)algo >= CUDNN_CONVOLUTION_FWD_ALGO_COUNT)
		return CUDNN_STATUS_BAD_PARAM;
	if (!algo_supported(algo))
		return CUDNN_STATUS_NOT_SUPPORTED;
	*sizeInBytes = workspace_need(xDesc, wDesc, yDesc, algo);
	return CUDNN_STATUS_SUCCESS;
}

/* The heuristic's list: the implicit kernels first (no workspace), GEMM
 * next, then the algorithms this version does not have. */
SGPU_EXPORT cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(
	cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
	const cudnnFilterDescriptor_t filterDesc, const cudnnConvolutionDescriptor_t convDesc,
	const cudnnTensorDescriptor_t destDesc, const int requestedAlgoCount,
	int *returnedAlgoCount, cudnnConvolutionFwdAlgoPerf_t *perfResults)
{
	static const cudnnConvolutionFwdAlgo_t order[CUDNN_CONVOLUTION_FWD_ALGO_COUNT] = {
		CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
		CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
		CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
		CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
		CUDNN_CONVOLUTION_FWD_ALGO_FFT,
		CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
		CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
		CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
	};
	cudnnStatus_t st;
	int i, n;

	if (sgpu_check_handle(handle) || !returnedAlgoCount || !perfResults ||
	    requestedAlgoCount <= 0)
		return CUDNN_STATUS_BAD_PARAM;
	if ((st = check_shapes(srcDesc, filterDesc, convDesc, destDesc)))
		return st;
	n = requestedAlgoCount < CUDNN_CONVOLUTION_FWD_ALGO_COUNT ? requestedAlgoCount
								   : CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
	for (i = 0; i < n; i++) {
		cudnnConvolutionFwdAlgoPerf_t *r = &perfResults[i];

		memset(r, 0, sizeof(*r));
		r->algo = order[i];
		r->status = algo_supported(order[i]) ? CUDNN_STATUS_SUCCESS
						      : CUDNN_STATUS_NOT_SUPPORTED;
		r->time = -1.0f;       /* a heuristic, not a measurement */
		r->memory = algo_supported(order[i])
				    ? workspace_need(srcDesc, filterDesc, destDesc, order[i]) : 0;
		r->determinism = CUDNN_DETERMINISTIC;
		r->mathType = convDesc->math;
	}
	*returnedAlgoCount = n;
	return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t launched(int e)
{
	if (e == cudaSuccess)
		return CUDNN_STATUS_SUCCESS;
	return e == cudaErrorMemoryAllocation ? CUDNN_STATUS_ALLOC_FAILED
					      : CUDNN_STATUS_EXECUTION_FAILED;
}

/* GEMM algorithm: per image, unfold it into the workspace, then one GEMM
 * per group: y[img, group's K] (K/G x PQ) = w[group] (K/G x (C/G)RS) col. */
static cudnnStatus_t conv_by_gemm(cudnnHandle_t h, const float *x, const float *w, float *y,
				  float *col, const struct sgpu_conv_args *a)
{
	int G = a->groups, kg = a->k / G, PQ = a->y.h * a->y.w, crs = a->c * a->r * a->s;
	struct sgpu_gemm_args g = { 0 };
	unsigned gx, gy, gz;

	g.m = kg, g.n = PQ, g.k = crs, g.batch = G;
	g.a_rs = crs, g.a_cs = 1, g.stride_a = (long long)kg * crs;
	g.b_rs = PQ, g.b_cs = 1, g.stride_b = (long long)crs * PQ;
	g.c_rs = a->y.cs, g.c_cs = a->y.ws, g.stride_c = (long long)kg * a->y.cs;
	g.alpha = a->alpha, g.beta = a->beta;
	sgpu_gemm_grid(&g, &gx, &gy, &gz);
	for (int n = 0; n < a->x.n; n++) {
		float *yn = y + (long long)n * a->y.ns;
		const float *cw = col;
		void *cargs[4] = { &x, &col, (void *)a, &n };
		void *gargs[4] = { &w, &cw, &yn, &g };
		int e = sgpu_launch(&k_im2col, sgpu_blocks((double)a->x.c * a->r * a->s * PQ, 256, 0x7fffffff),
				    1, 1, 256, cargs, h->stream);

		if (e == cudaSuccess)
			e = sgpu_launch(&k_gemm, gx, gy, gz, SGPU_GEMM_THREADS, gargs, h->stream);
		if (e != cudaSuccess)
			return launched(e);
	}
	return CUDNN_STATUS_SUCCESS;
}

SGPU_EXPORT cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
						  const cudnnTensorDescriptor_t xDesc,
						  const void *x,
						  const cudnnFilterDescriptor_t wDesc,
						  const void *w,
						  const cudnnConvolutionDescriptor_t convDesc,
						  cudnnConvolutionFwdAlgo_t algo, void *workSpace,
						  size_t workSpaceSizeInBytes, const void *beta,
						  const cudnnTensorDescriptor_t yDesc, void *y)
{
	struct sgpu_conv_args a;
	cudnnStatus_t st;
	size_t need;

	if (sgpu_check_handle(handle) || !x || !w || !y)
		return CUDNN_STATUS_BAD_PARAM;
	if ((st = check_shapes(xDesc, wDesc, convDesc, yDesc)))
		return st;
	if ((unsigned)algo >= CUDNN_CONVOLUTION_FWD_ALGO_COUNT)
		return CUDNN_STATUS_BAD_PARAM;
	if (!algo_supported(algo))
		return CUDNN_STATUS_NOT_SUPPORTED;
	need = workspace_need(xDesc, wDesc, yDesc, algo);
	if (need > workSpaceSizeInBytes || (need && !workSpace))
		return CUDNN_STATUS_BAD_PARAM;
	memset(&a, 0, sizeof(a));
	if ((st = sgpu_scale(alpha, &a.alpha)) || (st = sgpu_scale(beta, &a.beta)))
		return st;
	a.x = xDesc->t, a.y = yDesc->t;
	a.k = wDesc->k, a.c = wDesc->c, a.r = wDesc->r, a.s = wDesc->s;
	a.pad_h = convDesc->pad_h, a.pad_w = convDesc->pad_w;
	a.u = convDesc->u, a.v = convDesc->v;
	a.dil_h = convDesc->dil_h, a.dil_w = convDesc->dil_w;
	a.groups = convDesc->groups ? convDesc->groups : 1;
	a.flip = convDesc->mode == CUDNN_CONVOLUTION;

	if (algo == CUDNN_CONVOLUTION_FWD_ALGO_GEMM && a.y.hs == a.y.w * a.y.ws)
		return conv_by_gemm(handle, x, w, y, workSpace, &a);
	{
		/* implicit GEMM shape: (N P Q) x K outputs in 128 x 64 tiles */
		void *args[4] = { &x, &w, &y, &a };
		unsigned gx = sgpu_blocks((double)a.y.n * a.y.h * a.y.w, 128, 0x7fffffff);
		unsigned gy = sgpu_blocks(a.k, 64, 65535);

		return launched(sgpu_launch(&k_conv, gx, gy, 1, SGPU_GEMM_THREADS, args,
					    handle->stream));
	}
}
