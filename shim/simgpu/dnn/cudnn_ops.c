/*
 * cudnn_ops.c - the element-wise and reduction operations of simgpu's CPU
 * cuDNN: activation, pooling, softmax and add-tensor, each one kernel on
 * the handle's stream.  y = alpha * op(x) + beta * y; with beta == 0, y is
 * not read (it may hold NaNs), as cuDNN promises.  x and y may be the same
 * buffer (in place) where cuDNN allows it: each output element depends
 * only on inputs already read (activation, add) or the op is out of place
 * by shape (pooling).  Softmax reads a whole row before writing it.
 */
#include <math.h>
#include <stdlib.h>

#include "dnn_impl.h"

static inline float epi(float v, float alpha, float beta, const float *old)
{
	return beta == 0.0f ? alpha * v : alpha * v + beta * *old;
}

static int same_dims(const struct sgpu_tensor *a, const struct sgpu_tensor *b)
{
	return a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w;
}

static cudnnStatus_t launched(int e)
{
	if (e == cudaSuccess)
		return CUDNN_STATUS_SUCCESS;
	return e == cudaErrorMemoryAllocation ? CUDNN_STATUS_ALLOC_FAILED
					      : CUDNN_STATUS_EXECUTION_FAILED;
}

/* x and y valid, float, and (when same) of equal dims. */
static cudnnStatus_t check_xy(cudnnHandle_t h, const struct cudnnTensorStruct *x, const void *xp,
			      const struct cudnnTensorStruct *y, const void *yp, int same)
{
	cudnnStatus_t sx, sy;

	if (sgpu_check_handle(h) || !xp || !yp)
		return CUDNN_STATUS_BAD_PARAM;
	sx = sgpu_check_tensor(x), sy = sgpu_check_tensor(y);
	if (sx == CUDNN_STATUS_BAD_PARAM || sy == CUDNN_STATUS_BAD_PARAM)
		return CUDNN_STATUS_BAD_PARAM;
	if (same && !same_dims(&x->t, &y->t))
		return CUDNN_STATUS_BAD_PARAM;
	return sx != CUDNN_STATUS_SUCCESS ? sx : sy;
}

static unsigned elem_blocks(const struct sgpu_tensor *t)
{
	return sgpu_blocks(sgpu_count(t), 256, 0x7fffffff);
}

/* ---- activation ----------------------------------------------------------- */

/* __global__ void sgpu_cudnn_activation_fwd(const float *x, float *y,
 *                                           struct sgpu_act_args a)        */
static struct sgpu_kdef k_act = {
	"sgpu_cudnn_activation_fwd", 3,
	{ sizeof(void *), sizeof(void *), sizeof(struct sgpu_act_args) }, NULL
};

static inline float act(const struct sgpu_act_args *a, float v)
{
	switch (a->mode) {
	case CUDNN_ACTIVATION_SIGMOID:
		return 1.0f / (1.0f + expf(-v));
	case CUDNN_ACTIVATION_RELU:
		return a->nan_prop && isnan(v) ? v : fmaxf(v, 0.0f);
	case CUDNN_ACTIVATION_TANH:
		return tanhf(v);
	case CUDNN_ACTIVATION_CLIPPED_RELU:
		return a->nan_prop && isnan(v) ? v : fminf(fmaxf(v, 0.0f), a->coef);
	case CUDNN_ACTIVATION_ELU:
		return v >= 0.0f ? v : a->coef * (expf(v) - 1.0f);
	case CUDNN_ACTIVATION_SWISH:     /* swish beta: cuDNN's default, 1 */
		return v / (1.0f + expf(-v));
	default:                         /* CUDNN_ACTIVATION_IDENTITY */
		return v;
	}
}

SGPU_EXPORT void simgpu_twin_sgpu_cudnn_activation_fwd(const simgpu_launch *l)
{
	const float *x = SIMGPU_ARG(l, 0, const float *);
	float *y = SIMGPU_ARG(l, 1, float *);
	const struct sgpu_act_args *a = &SIMGPU_ARG(l, 2, struct sgpu_act_args);

	for (int n = 0; n < a->x.n; n++)
		for (int c = 0; c < a->x.c; c++)
			for (int h = 0; h < a->x.h; h++)
				for (int w = 0; w < a->x.w; w++) {
					float *o = y + sgpu_off(&a->y, n, c, h, w);

					*o = epi(act(a, x[sgpu_off(&a->x, n, c, h, w)]), a->alpha,
						 a->beta, o);
				}
}

SGPU_EXPORT void simgpu_cost_sgpu_cudnn_activation_fwd(const simgpu_launch *l, double *flops,
						       double *bytes)
{
	static const double per[] = { 4, 1, 6, 2, 4, 1, 5 };   /* by mode */
	const struct sgpu_act_args *a = &SIMGPU_ARG(l, 2, struct sgpu_act_args);
	double n = sgpu_count(&a->x);

	*flops = n * (per[(unsigned)a->mode < 7 ? a->mode : 1] + 2.0);
	*bytes = sizeof(float) * n * (a->beta != 0.0f ? 3.0 : 2.0);
}

SGPU_EXPORT cudnnStatus_t cudnnActivationForward(cudnnHandle_t handle,
						 cudnnActivationDescriptor_t activationDesc,
						 const void *alpha,
						 const cudnnTensorDescriptor_t xDesc, const void *x,
						 const void *beta,
						 const cudnnTensorDescriptor_t yDesc, void *y)
{
	struct sgpu_act_args a = { 0 };
	cudnnStatus_t st;

	if (!activationDesc || activationDesc->magic != SGPU_MAGIC_ACT || !activationDesc->set)
		return CUDNN_STATUS_BAD_PARAM;
	if ((st = check_xy(handle, xDesc, x, yDesc, y, 1)))
		return st;
	if ((st = sgpu_scale(alpha, &a.alpha)) || (st = sgpu_scale(beta, &a.beta)))
		return st;
	a.x = xDesc->t, a.y = yDesc->t;
	a.mode = activationDesc->mode;
	a.nan_prop = activationDesc->nan == CUDNN_PROPAGATE_NAN;
	a.coef = (float)activationDesc->coef;
	{
		void *args[3] = { &x, &y, &a };

		return launched(sgpu_launch(&k_act, elem_blocks(&a.x), 1, 1, 256, args,
					    handle->stream));
	}
}

/* ---- pooling -------------------------------------------------------------- */

/* __global__ void sgpu_cudnn_pooling_fwd(const float *x, float *y,
 *                                        struct sgpu_pool_args a)          */
static struct sgpu_kdef k_pool = {
	"sgpu_cudnn_pooling_fwd", 3,
	{ sizeof(void *), sizeof(void *), sizeof(struct sgpu_pool_args) }, NULL
};

static float pool_one(const float *x, const struct sgpu_pool_args *a, int n, int c, int p, int q)
{
	int h0 = p * a->u - a->pad_h, w0 = q * a->v - a->pad_w, inside = 0;
	int is_max = a->mode == CUDNN_POOLING_MAX || a->mode == CUDNN_POOLING_MAX_DETERMINISTIC;
	float acc = is_max ? -INFINITY : 0.0f;

	for (int r = 0; r < a->win_h; r++) {
		int ih = h0 + r;

		if (ih < 0 || ih >= a->x.h)
			continue;
		for (int s = 0; s < a->win_w; s++) {
			int iw = w0 + s;
			float v;

			if (iw < 0 || iw >= a->x.w)
				continue;
			v = x[sgpu_off(&a->x, n, c, ih, iw)];
			inside++;
			if (!is_max)
				acc += v;
			else if (isnan(v) ? a->nan_prop : v > acc)
				acc = v;
		}
	}
	if (is_max)
		return acc;
	if (a->mode == CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING)
		return acc / (float)(a->win_h * a->win_w);
	return inside ? acc / (float)inside : 0.0f;
}

SGPU_EXPORT void simgpu_twin_sgpu_cudnn_pooling_fwd(const simgpu_launch *l)
{
	const float *x = SIMGPU_ARG(l, 0, const float *);
	float *y = SIMGPU_ARG(l, 1, float *);
	const struct sgpu_pool_args *a = &SIMGPU_ARG(l, 2, struct sgpu_pool_args);

	for (int n = 0; n < a->y.n; n++)
		for (int c = 0; c < a->y.c; c++)
			for (int p = 0; p < a->y.h; p++)
				for (int q = 0; q < a->y.w; q++) {
					float *o = y + sgpu_off(&a->y, n, c, p, q);

					*o = epi(pool_one(x, a, n, c, p, q), a->alpha, a->beta, o);
				}
}

/* each output: one compare or add per window element; the input is read
 * about once (windows overlap in cache), the output written once */
SGPU_EXPORT void simgpu_cost_sgpu_cudnn_pooling_fwd(const simgpu_launch *l, double *flops,
						    double *bytes)
{
	const struct sgpu_pool_args *a = &SIMGPU_ARG(l, 2, struct sgpu_pool_args);
	double out = sgpu_count(&a->y);

	*flops = out * ((double)a->win_h * a->win_w + 2.0);
	*bytes = sizeof(float) * (sgpu_count(&a->x) + out * (a->beta != 0.0f ? 2.0 : 1.0));
}

SGPU_EXPORT cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle,
					      const cudnnPoolingDescriptor_t poolingDesc,
					      const void *alpha,
					      const cudnnTensorDescriptor_t xDesc, const void *x,
					      const void *beta,
					      const cudnnTensorDescriptor_t yDesc, void *y)
{
	struct sgpu_pool_args a = { 0 };
	cudnnStatus_t st;
	int n, c, h, w;

	if ((st = check_xy(handle, xDesc, x, yDesc, y, 0)))
		return st;
	if (cudnnGetPooling2dForwardOutputDim(poolingDesc, xDesc, &n, &c, &h, &w) ||
	    yDesc->t.n != n || yDesc->t.c != c || yDesc->t.h != h || yDesc->t.w != w)
		return CUDNN_STATUS_BAD_PARAM;
	if ((st = sgpu_scale(alpha, &a.alpha)) || (st = sgpu_scale(beta, &a.beta)))
		return st;
	a.x = xDesc->t, a.y = yDesc->t;
	a.mode = poolingDesc->mode;
	a.nan_prop = poolingDesc->nan == CUDNN_PROPAGATE_NAN;
	a.win_h = poolingDesc->win_h, a.win_w = poolingDesc->win_w;
	a.pad_h = poolingDesc->pad_h, a.pad_w = poolingDesc->pad_w;
	a.u = poolingDesc->u, a.v = poolingDesc->v;
	{
		void *args[3] = { &x, &y, &a };

		return launched(sgpu_launch(&k_pool, elem_blocks(&a.y), 1, 1, 256, args,
					    handle->stream));
	}
}

/* ---- softmax -------------------------------------------------------------- */

/* __global__ void sgpu_cudnn_softmax_fwd(const float *x, float *y,
 *                                        struct sgpu_softmax_args a)       */
static struct sgpu_kdef k_softmax = {
	"sgpu_cudnn_softmax_fwd", 3,
	{ sizeof(void *), sizeof(void *), sizeof(struct sgpu_softmax_args) }, NULL
};

/*
 * One softmax row: the elements (n, c, h, w) with c in [0, C) and, in
 * INSTANCE mode, every h and w too; in CHANNEL mode h and w are fixed.
 * Three passes (max, sum, write), as a GPU kernel does: the row is read
 * in full before any element of it is written, so x == y is safe.
 */
static void softmax_row(const float *x, float *y, const struct sgpu_softmax_args *a, int n,
			int h0, int h1, int w0, int w1)
{
	float mx = -INFINITY;
	double sum = 0.0;

#define ROW for (int c = 0; c < a->x.c; c++) for (int h = h0; h < h1; h++) for (int w = w0; w < w1; w++)
	if (a->algo != CUDNN_SOFTMAX_FAST)
		ROW mx = fmaxf(mx, x[sgpu_off(&a->x, n, c, h, w)]);
	else
		mx = 0.0f;
	ROW sum += exp((double)(x[sgpu_off(&a->x, n, c, h, w)] - mx));
	ROW {
		float v = x[sgpu_off(&a->x, n, c, h, w)] - mx, r;
		float *o = y + sgpu_off(&a->y, n, c, h, w);

		r = a->algo == CUDNN_SOFTMAX_LOG ? v - (float)log(sum) : (float)(exp((double)v) / sum);
		*o = epi(r, a->alpha, a->beta, o);
	}
#undef ROW
}

SGPU_EXPORT void simgpu_twin_sgpu_cudnn_softmax_fwd(const simgpu_launch *l)
{
	const float *x = SIMGPU_ARG(l, 0, const float *);
	float *y = SIMGPU_ARG(l, 1, float *);
	const struct sgpu_softmax_args *a = &SIMGPU_ARG(l, 2, struct sgpu_softmax_args);

	for (int n = 0; n < a->x.n; n++) {
		if (a->mode == CUDNN_SOFTMAX_MODE_INSTANCE) {
			softmax_row(x, y, a, n, 0, a->x.h, 0, a->x.w);
			continue;
		}
		for (int h = 0; h < a->x.h; h++)
			for (int w = 0; w < a->x.w; w++)
				softmax_row(x, y, a, n, h, h + 1, w, w + 1);
	}
}

/* max, subtract, exp, sum, scale per element; x read twice, y written */
SGPU_EXPORT void simgpu_cost_sgpu_cudnn_softmax_fwd(const simgpu_launch *l, double *flops,
						    double *bytes)
{
	const struct sgpu_softmax_args *a = &SIMGPU_ARG(l, 2, struct sgpu_softmax_args);
	double n = sgpu_count(&a->x);

	*flops = n * 5.0;
	*bytes = sizeof(float) * n * (a->beta != 0.0f ? 4.0 : 3.0);
}

SGPU_EXPORT cudnnStatus_t cudnnSoftmaxForward(cudnnHandle_t handle,
					      cudnnSoftmaxAlgorithm_t algo,
					      cudnnSoftmaxMode_t mode, const void *alpha,
					      const cudnnTensorDescriptor_t xDesc, const void *x,
					      const void *beta,
					      const cudnnTensorDescriptor_t yDesc, void *y)
{
	struct sgpu_softmax_args a = { 0 };
	cudnnStatus_t st;
	unsigned gx;

	if ((unsigned)algo > CUDNN_SOFTMAX_LOG || (unsigned)mode > CUDNN_SOFTMAX_MODE_CHANNEL)
		return CUDNN_STATUS_BAD_PARAM;
	if ((st = check_xy(handle, xDesc, x, yDesc, y, 1)))
		return st;
	if ((st = sgpu_scale(alpha, &a.alpha)) || (st = sgpu_scale(beta, &a.beta)))
		return st;
	a.x = xDesc->t, a.y = yDesc->t;
	a.algo = algo, a.mode = mode;
	/* a block per instance, or per 256 (n, h, w) rows across the channels */
	gx = mode == CUDNN_SOFTMAX_MODE_INSTANCE
		     ? sgpu_blocks(a.x.n, 1, 0x7fffffff)
		     : sgpu_blocks((double)a.x.n * a.x.h * a.x.w, 256, 0x7fffffff);
	{
		void *args[3] = { &x, &y, &a };

		return launched(sgpu_launch(&k_softmax, gx, 1, 1, 256, args, handle->stream));
	}
}

/* ---- add tensor ----------------------------------------------------------- */

/* __global__ void sgpu_cudnn_add_tensor(const float *A, float *C,
 *                                       struct sgpu_add_args a)            */
static struct sgpu_kdef k_add = {
	"sgpu_cudnn_add_tensor", 3,
	{ sizeof(void *), sizeof(void *), sizeof(struct sgpu_add_args) }, NULL
};

SGPU_EXPORT void simgpu_twin_sgpu_cudnn_add_tensor(const simgpu_launch *l)
{
	const float *A = SIMGPU_ARG(l, 0, const float *);
	float *C = SIMGPU_ARG(l, 1, float *);
	const struct sgpu_add_args *a = &SIMGPU_ARG(l, 2, struct sgpu_add_args);
	/* a dim of size 1 in A is broadcast: its stride counts as 0 */
	struct sgpu_tensor b = a->a;

	b.ns = b.n == 1 ? 0 : b.ns, b.cs = b.c == 1 ? 0 : b.cs;
	b.hs = b.h == 1 ? 0 : b.hs, b.ws = b.w == 1 ? 0 : b.ws;
	for (int n = 0; n < a->c.n; n++)
		for (int c = 0; c < a->c.c; c++)
			for (int h = 0; h < a->c.h; h++)
				for (int w = 0; w < a->c.w; w++) {
					float *o = C + sgpu_off(&a->c, n, c, h, w);

					*o = epi(A[sgpu_off(&b, n, c, h, w)], a->alpha, a->beta, o);
				}
}

SGPU_EXPORT void simgpu_cost_sgpu_cudnn_add_tensor(const simgpu_launch *l, double *flops,
						   double *bytes)
{
	const struct sgpu_add_args *a = &SIMGPU_ARG(l, 2, struct sgpu_add_args);
	double n = sgpu_count(&a->c);

	*flops = n * (a->beta != 0.0f ? 3.0 : 1.0);
	*bytes = sizeof(float) * (sgpu_count(&a->a) + n * (a->beta != 0.0f ? 2.0 : 1.0));
}

static int broadcasts(int from, int to)
{
	return from == to || from == 1;
}

SGPU_EXPORT cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void *alpha,
					 const cudnnTensorDescriptor_t aDesc, const void *A,
					 const void *beta, const cudnnTensorDescriptor_t cDesc,
					 void *C)
{
	struct sgpu_add_args a = { 0 };
	cudnnStatus_t st;

	if ((st = check_xy(handle, aDesc, A, cDesc, C, 0)))
		return st;
	if (!broadcasts(aDesc->t.n, cDesc->t.n) || !broadcasts(aDesc->t.c, cDesc->t.c) ||
	    !broadcasts(aDesc->t.h, cDesc->t.h) || !broadcasts(aDesc->t.w, cDesc->t.w))
		return CUDNN_STATUS_BAD_PARAM;
	if ((st = sgpu_scale(alpha, &a.alpha)) || (st = sgpu_scale(beta, &a.beta)))
		return st;
	a.a = aDesc->t, a.c = cDesc->t;
	{
		void *args[3] = { &A, &C, &a };

		return launched(sgpu_launch(&k_add, elem_blocks(&a.c), 1, 1, 256, args,
					    handle->stream));
	}
}
