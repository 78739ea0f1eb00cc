// gpu.cu - run a network plan on the GPU: cuDNN for convolution, bias,
// ReLU, pooling and softmax, cuBLAS for the fully connected and window
// layers, and two kernels of our own for what neither library does (the
// word-feature lookup, and summing a window's per-position products with
// bias and hardtanh).  Host twins of our kernels: twins.c.
//
// Everything is issued on one stream; descriptors are set again only when
// the batch size changes.  Math is strict FP32 (cuDNN FMA math, cuBLAS
// default math, GemmEx with CUBLAS_COMPUTE_32F): Tonic predates TF32, and
// it keeps the --check tolerance tight on a real GPU.
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "colocate_dnn.h"
#include "gpu.h"

#define THREADS 256

// E (rows = size + 2 * halo, D columns): the feature-f columns [col,
// col + dim) of every row, from table row 0 (padding) outside the sentence
// and from the word's id (mod the vocabulary, see net_word_row) inside.
__global__ void tonic_embed(const int *ids, int nfeat, int f, int size, int halo,
			    const float *tab, int vocab, int dim, int col, int D, float *e)
{
	long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
	long rows = size + 2L * halo;
	if (i >= rows * dim)
		return;
	int t = (int)(i / dim), d = (int)(i % dim), w = t - halo, row = 0;
	if (w >= 0 && w < size && vocab > 1)
		row = 1 + (int)((unsigned)ids[(long)w * nfeat + f] % (unsigned)(vocab - 1));
	e[(long)t * D + col + d] = tab[(long)row * dim + d];
}

// y[t][o] = act(bias[o] + sum_j prod_j[t + j][o]) for the `size` words,
// where prod_j (rows_ext x O, one after the other) is window position j's
// weights times every padded row.  act: 0 none, 1 ReLU, 2 hardtanh.
// Additions only, in j order: the twin reproduces it bit for bit.
__global__ void tonic_window_sum(const float *prod, const float *bias, int size, int win,
				 int O, int rows_ext, int act, float *y)
{
	long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= (long)size * O)
		return;
	int t = (int)(i / O), o = (int)(i % O);
	float acc = bias[o];
	for (int j = 0; j < win; j++)
		acc += prod[((long)j * rows_ext + t + j) * O + o];
	if (act == 1)
		acc = acc > 0.0f ? acc : 0.0f;
	else if (act == 2)
		acc = fminf(1.0f, fmaxf(-1.0f, acc));
	y[i] = acc;
}

struct layer_gpu {
	cudnnTensorDescriptor_t      x, y, bias;
	cudnnFilterDescriptor_t      filt;
	cudnnConvolutionDescriptor_t conv;
	cudnnPoolingDescriptor_t     pool;
	cudnnConvolutionFwdAlgo_t    algo;
};

struct gpu_net {
	const struct net_plan      *p;
	cudnnHandle_t               dnn;
	cublasHandle_t              blas;
	cudaStream_t                stream;
	cudaEvent_t                 ev[2];
	cudnnActivationDescriptor_t relu;
	float                      *params;
	void                       *din;
	float                      *buf[2];
	float                      *scratch;
	void                       *work;
	size_t                      work_bytes;
	void                       *hin;
	float                      *hout;
	int                         cur_n;   // batch the descriptors describe
	struct layer_gpu            l[NET_MAX_LAYERS];
};

static const float one = 1.0f, zero = 0.0f;

static int failf(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -1;
}

#define CUDA_OK(call)                                                                   \
	do {                                                                            \
		cudaError_t e_ = (call);                                                \
		if (e_ != cudaSuccess)                                                  \
			return failf(err, errlen, "%s: %s", #call, cudaGetErrorString(e_)); \
	} while (0)
#define DNN_OK(call)                                                                    \
	do {                                                                            \
		cudnnStatus_t s_ = (call);                                              \
		if (s_ != CUDNN_STATUS_SUCCESS)                                         \
			return failf(err, errlen, "%s: %s", #call, cudnnGetErrorString(s_)); \
	} while (0)
#define BLAS_OK(call)                                                                   \
	do {                                                                            \
		cublasStatus_t s_ = (call);                                             \
		if (s_ != CUBLAS_STATUS_SUCCESS)                                        \
			return failf(err, errlen, "%s: %s", #call, cublasGetStatusString(s_)); \
	} while (0)

static int set4d(cudnnTensorDescriptor_t d, int n, int c, int h, int w, char *err,
		 size_t errlen)
{
	DNN_OK(cudnnSetTensor4dDescriptor(d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w));
	return 0;
}

// The fastest strict-FP32 algorithm cuDNN's heuristics offer for a layer;
// implicit precomputed GEMM (always available) if it offers none.
static cudnnConvolutionFwdAlgo_t pick_algo(struct gpu_net *g, struct layer_gpu *lg)
{
	cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
	int n = 0;

	if (cudnnGetConvolutionForwardAlgorithm_v7(g->dnn, lg->x, lg->filt, lg->conv, lg->y,
						   CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n,
						   perf) == CUDNN_STATUS_SUCCESS)
		for (int i = 0; i < n; i++)
			if (perf[i].status == CUDNN_STATUS_SUCCESS &&
			    perf[i].mathType != CUDNN_TENSOR_OP_MATH &&
			    perf[i].mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)
				return perf[i].algo;
	return CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM;
}

// Describe every layer for a batch of n (word nets: sentences of n words)
// and make sure the convolution workspace is large enough for it.
static int set_batch(struct gpu_net *g, int n, int pick, char *err, size_t errlen)
{
	const struct net_plan *p = g->p;

	if (n == g->cur_n)
		return 0;
	for (int i = 0; i < p->nlayers; i++) {
		const struct layer_plan *lp = &p->l[i];
		struct layer_gpu *lg = &g->l[i];
		size_t ws = 0;

		switch (lp->def->kind) {
		case L_CONV:
			if (set4d(lg->x, n, lp->in_c, lp->in_h, lp->in_w, err, errlen) ||
			    set4d(lg->y, n, lp->out_c, lp->out_h, lp->out_w, err, errlen))
				return -1;
			if (pick)
				lg->algo = pick_algo(g, lg);
			if (cudnnGetConvolutionForwardWorkspaceSize(g->dnn, lg->x, lg->filt, lg->conv,
								    lg->y, lg->algo, &ws) !=
			    CUDNN_STATUS_SUCCESS) {
				lg->algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
				DNN_OK(cudnnGetConvolutionForwardWorkspaceSize(
					g->dnn, lg->x, lg->filt, lg->conv, lg->y, lg->algo, &ws));
			}
			if (ws > g->work_bytes) {
				if (g->work)
					CUDA_OK(cudaFree(g->work));
				g->work = NULL;
				g->work_bytes = 0;
				CUDA_OK(cudaMalloc(&g->work, ws));
				g->work_bytes = ws;
			}
			break;
		case L_POOL:
		case L_SOFTMAX:
			if (set4d(lg->x, n, lp->in_c, lp->in_h, lp->in_w, err, errlen) ||
			    set4d(lg->y, n, lp->out_c, lp->out_h, lp->out_w, err, errlen))
				return -1;
			break;
		case L_FC:
			if (set4d(lg->y, n, lp->out_c, 1, 1, err, errlen))
				return -1;
			break;
		case L_EMBED:
		case L_WINDOW:
			break;
		}
	}
	g->cur_n = n;
	return 0;
}

static int layer_descs(struct gpu_net *g, int i, char *err, size_t errlen)
{
	const struct layer_plan *lp = &g->p->l[i];
	const struct layer_def *d = lp->def;
	struct layer_gpu *lg = &g->l[i];

	if (d->kind == L_CONV || d->kind == L_POOL || d->kind == L_SOFTMAX || d->kind == L_FC) {
		DNN_OK(cudnnCreateTensorDescriptor(&lg->x));
		DNN_OK(cudnnCreateTensorDescriptor(&lg->y));
	}
	if (lp->b_len) {
		DNN_OK(cudnnCreateTensorDescriptor(&lg->bias));
		if (set4d(lg->bias, 1, lp->out_c, 1, 1, err, errlen))
			return -1;
	}
	if (d->kind == L_CONV) {
		DNN_OK(cudnnCreateFilterDescriptor(&lg->filt));
		DNN_OK(cudnnSetFilter4dDescriptor(lg->filt, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW,
						  lp->out_c, lp->in_c, d->win, d->win));
		DNN_OK(cudnnCreateConvolutionDescriptor(&lg->conv));
		DNN_OK(cudnnSetConvolution2dDescriptor(lg->conv, d->pad, d->pad, d->stride,
						       d->stride, 1, 1, CUDNN_CROSS_CORRELATION,
						       CUDNN_DATA_FLOAT));
		DNN_OK(cudnnSetConvolutionMathType(lg->conv, CUDNN_FMA_MATH));
	}
	if (d->kind == L_POOL) {
		DNN_OK(cudnnCreatePoolingDescriptor(&lg->pool));
		DNN_OK(cudnnSetPooling2dDescriptor(lg->pool, CUDNN_POOLING_MAX,
						   CUDNN_NOT_PROPAGATE_NAN, d->win, d->win, 0, 0,
						   d->stride, d->stride));
	}
	return 0;
}

static int open_all(struct gpu_net *g, const float *params, char *err, size_t errlen)
{
	const struct net_plan *p = g->p;
	size_t in_bytes = (size_t)p->max_size * p->unit_bytes;
	size_t out_bytes = (size_t)p->max_size * p->out_per * sizeof(float);

	CUDA_OK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
	CUDA_OK(cudaEventCreate(&g->ev[0]));
	CUDA_OK(cudaEventCreate(&g->ev[1]));
	DNN_OK(cudnnCreate(&g->dnn));
	DNN_OK(cudnnSetStream(g->dnn, g->stream));
	BLAS_OK(cublasCreate(&g->blas));
	BLAS_OK(cublasSetStream(g->blas, g->stream));
	BLAS_OK(cublasSetMathMode(g->blas, CUBLAS_DEFAULT_MATH));
	DNN_OK(cudnnCreateActivationDescriptor(&g->relu));
	DNN_OK(cudnnSetActivationDescriptor(g->relu, CUDNN_ACTIVATION_RELU,
					    CUDNN_NOT_PROPAGATE_NAN, 0.0));

	CUDA_OK(cudaMalloc((void **)&g->params, p->nparams * sizeof(float)));
	CUDA_OK(cudaMemcpy(g->params, params, p->nparams * sizeof(float),
			   cudaMemcpyHostToDevice));
	CUDA_OK(cudaMalloc(&g->din, in_bytes));
	CUDA_OK(cudaMalloc((void **)&g->buf[0], p->max_act * sizeof(float)));
	CUDA_OK(cudaMalloc((void **)&g->buf[1], p->max_act * sizeof(float)));
	if (p->scratch)
		CUDA_OK(cudaMalloc((void **)&g->scratch, p->scratch * sizeof(float)));
	CUDA_OK(cudaMallocHost(&g->hin, in_bytes));
	CUDA_OK(cudaMallocHost((void **)&g->hout, out_bytes));

	for (int i = 0; i < p->nlayers; i++)
		if (layer_descs(g, i, err, errlen))
			return -1;
	// choose algorithms for the largest batch, size the workspace for it
	g->cur_n = 0;
	return set_batch(g, p->max_size, 1, err, errlen);
}

extern "C" struct gpu_net *gpu_net_open(const struct net_plan *p, const float *params,
					char *err, size_t errlen)
{
	struct gpu_net *g = (struct gpu_net *)calloc(1, sizeof(*g));

	if (!g) {
		failf(err, errlen, "out of host memory");
		return NULL;
	}
	g->p = p;
	if (open_all(g, params, err, errlen)) {
		gpu_net_close(g);
		return NULL;
	}
	return g;
}

extern "C" void *gpu_net_input(struct gpu_net *g)
{
	return g->hin;
}

extern "C" float *gpu_net_output(struct gpu_net *g)
{
	return g->hout;
}

static unsigned blocks_for(long n)
{
	return (unsigned)((n + THREADS - 1) / THREADS);
}

// Y (n x out) = X (n x in) W^T: column-major, that is Y^T = op(W) X^T with
// W read as the in x out column-major matrix it is in memory.
static int fc(struct gpu_net *g, const struct layer_plan *lp, int n, const float *x,
	      float *y, char *err, size_t errlen)
{
	const float *w = g->params + lp->w_off;
	int in = lp->fan_in, out = lp->out_c;

	if (lp->def->gemm == GEMM_EX)
		BLAS_OK(cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w,
				     CUDA_R_32F, in, x, CUDA_R_32F, in, &zero, y, CUDA_R_32F, out,
				     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
	else
		BLAS_OK(cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, w, in, x,
				    in, &zero, y, out));
	return 0;
}

// Which operators of the forward pass to issue: every call site takes the
// next operator number (net.h: net_layer_ops) and runs when it is in
// [start, end).  A full query is the range [0, nops).
struct oprange {
	int next, start, end;
};

static int want(struct oprange *r)
{
	int k = r->next++;

	return k >= r->start && k < r->end;
}

static int embed(struct gpu_net *g, const struct layer_plan *lp, int n, const int *ids,
		 float *e, struct oprange *r, char *err, size_t errlen)
{
	const struct net_def *d = g->p->def;
	const float *tab = g->params + lp->w_off;
	long rows = net_rows_of(g->p, n, 1);
	int col = 0;

	for (int f = 0; f < d->nfeat; f++) {
		int dim = d->feat[f].dim;

		if (want(r)) {
			tonic_embed<<<blocks_for(rows * dim), THREADS, 0, g->stream>>>(
				ids, d->nfeat, f, n, g->p->halo, tab, d->feat[f].rows, dim, col,
				lp->out_c, e);
			CUDA_OK(cudaGetLastError());
		}
		tab += (size_t)d->feat[f].rows * dim;
		col += dim;
	}
	return 0;
}

// One GEMM per window position j over all padded rows (a strided batch:
// same E, W_j and product j strided), then the shifted sum.
static int window(struct gpu_net *g, const struct layer_plan *lp, int n, const float *e,
		  float *y, struct oprange *r, char *err, size_t errlen)
{
	int D = lp->in_c, O = lp->out_c, win = lp->def->win;
	int rows = net_rows_of(g->p, n, 1);
	int act = lp->def->act == ACT_RELU ? 1 : lp->def->act == ACT_HARDTANH ? 2 : 0;

	if (want(r))
		BLAS_OK(cublasSgemmStridedBatched(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, O, rows, D,
						  &one, g->params + lp->w_off, D, (long long)O * D,
						  e, D, 0, &zero, g->scratch, O,
						  (long long)O * rows, win));
	if (want(r)) {
		tonic_window_sum<<<blocks_for((long)n * O), THREADS, 0, g->stream>>>(
			g->scratch, g->params + lp->b_off, n, win, O, rows, act, y);
		CUDA_OK(cudaGetLastError());
	}
	return 0;
}

// Issue the operators of r on the stream.  Every layer reads and writes
// the same buffers whatever the range, so a range that starts inside the
// network reads whatever activations those buffers hold (proto.h).
static int forward(struct gpu_net *g, int n, struct oprange *r, const float **out, char *err,
		   size_t errlen)
{
	const struct net_plan *p = g->p;
	const float *x = (const float *)g->din;

	for (int i = 0; i < p->nlayers; i++) {
		const struct layer_plan *lp = &p->l[i];
		struct layer_gpu *lg = &g->l[i];
		const float *bias = g->params + lp->b_off;
		float *y = g->buf[i & 1];

		switch (lp->def->kind) {
		case L_CONV:
			if (want(r))
				DNN_OK(cudnnConvolutionForward(g->dnn, &one, lg->x, x, lg->filt,
						       g->params + lp->w_off, lg->conv, lg->algo,
						       g->work, g->work_bytes, &zero, lg->y, y));
			break;
		case L_POOL:
			if (want(r))
				DNN_OK(cudnnPoolingForward(g->dnn, lg->pool, &one, lg->x, x, &zero,
							   lg->y, y));
			break;
		case L_FC:
			if (want(r) && fc(g, lp, n, x, y, err, errlen))
				return -1;
			break;
		case L_SOFTMAX:
			if (want(r))
				DNN_OK(cudnnSoftmaxForward(g->dnn, CUDNN_SOFTMAX_ACCURATE,
						   CUDNN_SOFTMAX_MODE_INSTANCE, &one, lg->x, x,
						   &zero, lg->y, y));
			break;
		case L_EMBED:
			if (embed(g, lp, n, (const int *)g->din, y, r, err, errlen))
				return -1;
			break;
		case L_WINDOW:
			if (window(g, lp, n, x, y, r, err, errlen))
				return -1;
			break;
		}
		if (lp->b_len && lp->def->kind != L_WINDOW && want(r))
			DNN_OK(cudnnAddTensor(g->dnn, &one, lg->bias, bias, &one, lg->y, y));
		if (lp->def->act == ACT_RELU && lp->def->kind != L_WINDOW && want(r))
			DNN_OK(cudnnActivationForward(g->dnn, g->relu, &one, lg->y, y, &zero, lg->y,
						      y));
		x = y;
	}
	*out = x;
	if (r->next != p->nops)   // net_layer_ops and this function disagree
		return failf(err, errlen, "forward pass issued %d operators, the plan counts %d",
			     r->next, p->nops);
	return 0;
}

// One query of n units: copy the input from `in` to the device input buffer
// (kind_in: host or device), every layer, copy the result to `out` (kind_out),
// sync; *device_s is the time between events around all of it.
static int run_copied(struct gpu_net *g, int n, const void *in, cudaMemcpyKind kind_in, float *out,
		      cudaMemcpyKind kind_out, double *device_s, char *err, size_t errlen)
{
	const struct net_plan *p = g->p;
	struct oprange r = { 0, 0, p->nops };
	const float *y = NULL;
	float ms = 0;

	if (n < 1 || n > p->max_size)
		return failf(err, errlen, "size %d is not in 1..%d", n, p->max_size);
	if (set_batch(g, n, 0, err, errlen))
		return -1;
	CUDA_OK(cudaEventRecord(g->ev[0], g->stream));
	CUDA_OK(cudaMemcpyAsync(g->din, in, (size_t)n * p->unit_bytes, kind_in, g->stream));
	if (forward(g, n, &r, &y, err, errlen))
		return -1;
	CUDA_OK(cudaMemcpyAsync(out, y, (size_t)n * p->out_per * sizeof(float), kind_out, g->stream));
	CUDA_OK(cudaEventRecord(g->ev[1], g->stream));
	CUDA_OK(cudaStreamSynchronize(g->stream));
	CUDA_OK(cudaEventElapsedTime(&ms, g->ev[0], g->ev[1]));
	*device_s = ms * 1e-3;
	return 0;
}

extern "C" int gpu_net_run(struct gpu_net *g, int n, double *device_s, char *err,
			   size_t errlen)
{
	return run_copied(g, n, g->hin, cudaMemcpyHostToDevice, g->hout, cudaMemcpyDeviceToHost, device_s,
			  err, errlen);
}

extern "C" int gpu_net_run_dev(struct gpu_net *g, int n, const void *in, float *out,
			       double *device_s, char *err, size_t errlen)
{
	return run_copied(g, n, in, cudaMemcpyDeviceToDevice, out, cudaMemcpyDeviceToDevice, device_s, err,
			  errlen);
}

extern "C" int gpu_net_run_range(struct gpu_net *g, int size, int start, int end,
				 double *device_s, uint64_t *start_ns, char *err, size_t errlen)
{
	const struct net_plan *p = g->p;
	struct oprange r = { 0, start, end };
	const float *out = NULL;
	struct timespec ts;
	float ms = 0;

	if (size < 1 || size > p->max_size)
		return failf(err, errlen, "size %d is not in 1..%d", size, p->max_size);
	if (start < 0 || start >= end || end > p->nops)
		return failf(err, errlen, "operator range [%d, %d) is not within [0, %d)", start,
			     end, p->nops);
	if (set_batch(g, size, 0, err, errlen))
		return -1;
	// the host clock at the first event's record: the stream is idle (one
	// request at a time), so the range starts on the device about then
	clock_gettime(CLOCK_MONOTONIC, &ts);
	CUDA_OK(cudaEventRecord(g->ev[0], g->stream));
	if (forward(g, size, &r, &out, err, errlen))
		return -1;
	CUDA_OK(cudaEventRecord(g->ev[1], g->stream));
	CUDA_OK(cudaStreamSynchronize(g->stream));
	CUDA_OK(cudaEventElapsedTime(&ms, g->ev[0], g->ev[1]));
	*device_s = ms * 1e-3;
	*start_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
	return 0;
}

extern "C" void gpu_net_close(struct gpu_net *g)
{
	if (!g)
		return;
	if (g->stream)
		cudaStreamSynchronize(g->stream);
	for (int i = 0; i < NET_MAX_LAYERS; i++) {
		struct layer_gpu *lg = &g->l[i];

		if (lg->x)
			cudnnDestroyTensorDescriptor(lg->x);
		if (lg->y)
			cudnnDestroyTensorDescriptor(lg->y);
		if (lg->bias)
			cudnnDestroyTensorDescriptor(lg->bias);
		if (lg->filt)
			cudnnDestroyFilterDescriptor(lg->filt);
		if (lg->conv)
			cudnnDestroyConvolutionDescriptor(lg->conv);
		if (lg->pool)
			cudnnDestroyPoolingDescriptor(lg->pool);
	}
	if (g->relu)
		cudnnDestroyActivationDescriptor(g->relu);
	if (g->blas)
		cublasDestroy(g->blas);
	if (g->dnn)
		cudnnDestroy(g->dnn);
	cudaFree(g->params);
	cudaFree(g->din);
	cudaFree(g->buf[0]);
	cudaFree(g->buf[1]);
	cudaFree(g->scratch);
	cudaFree(g->work);
	cudaFreeHost(g->hin);
	cudaFreeHost(g->hout);
	if (g->ev[0])
		cudaEventDestroy(g->ev[0]);
	if (g->ev[1])
		cudaEventDestroy(g->ev[1]);
	if (g->stream)
		cudaStreamDestroy(g->stream);
	free(g);
}
