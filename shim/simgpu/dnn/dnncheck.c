/*
 * dnncheck.c - a small CNN-shaped pipeline through cuDNN and cuBLAS, for
 * tests of the library-task hooks: the same binary runs on simgpu (with
 * shim/lib/simgpu's CPU libraries) and on a GPU with NVIDIA's, under
 * `colocate run` or not.
 *
 *   dnncheck [REPEAT]
 *
 * Prints one checksum line per stage (sum and sum of |v| of its output, so
 * two runs can be compared), then
 *   STATS launches=K calls=C      K: kernels the simgpu libraries launch
 *   PASS dnncheck                 every call returned SUCCESS
 * The launch count is what simgpu's libraries do (documented in
 * shim/simgpu/dnn/dnn_impl.h); NVIDIA's launch a different number.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "../../include/colocate_dnn.h"

static int failures;

#define CK_CUDA(x) check_cuda((x), #x)
#define CK_DNN(x) check_dnn((x), #x)
#define CK_BLAS(x) check_blas((x), #x)

static void check_cuda(cudaError_t e, const char *what)
{
	if (e != cudaSuccess) {
		fprintf(stderr, "dnncheck: %s: %s\n", what, cudaGetErrorString(e));
		exit(2);
	}
}

static void check_dnn(cudnnStatus_t s, const char *what)
{
	if (s != CUDNN_STATUS_SUCCESS) {
		fprintf(stderr, "dnncheck: %s: %s\n", what, cudnnGetErrorString(s));
		failures++;
	}
}

static void check_blas(cublasStatus_t s, const char *what)
{
	if (s != CUBLAS_STATUS_SUCCESS) {
		fprintf(stderr, "dnncheck: %s: status %d\n", what, (int)s);
		failures++;
	}
}

static float *dev_filled(size_t n, float scale, float phase)
{
	float *h = (float *)malloc(n * sizeof(float)), *d = NULL;

	if (!h)
		exit(2);
	for (size_t i = 0; i < n; i++)
		h[i] = scale * sinf(0.37f * (float)i + phase);
	CK_CUDA(cudaMalloc((void **)&d, n * sizeof(float)));
	CK_CUDA(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
	free(h);
	return d;
}

static float *dev_zero(size_t n)
{
	float *d = NULL;

	CK_CUDA(cudaMalloc((void **)&d, n * sizeof(float)));
	CK_CUDA(cudaMemset(d, 0, n * sizeof(float)));
	return d;
}

static void report(const char *name, const float *d, size_t n)
{
	float *h = (float *)malloc(n * sizeof(float));
	double sum = 0.0, abs_sum = 0.0;

	if (!h)
		exit(2);
	CK_CUDA(cudaMemcpy(h, d, n * sizeof(float), cudaMemcpyDeviceToHost));
	for (size_t i = 0; i < n; i++)
		sum += h[i], abs_sum += fabs(h[i]);
	printf("%s sum=%.6e abs=%.6e\n", name, sum, abs_sum);
	free(h);
}

static cudnnTensorDescriptor_t tensor(int n, int c, int h, int w)
{
	cudnnTensorDescriptor_t t;

	CK_DNN(cudnnCreateTensorDescriptor(&t));
	CK_DNN(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w));
	return t;
}

int main(int argc, char **argv)
{
	enum { N = 2, C0 = 3, H = 16, C1 = 8, C2 = 4, HP = 8, FC = 10 };
	int repeat = argc > 1 ? atoi(argv[1]) : 1, launches = 0, calls = 0;
	const float one = 1.0f, zero = 0.0f, half = 0.5f;
	cudnnHandle_t dnn;
	cublasHandle_t blas;
	cudaStream_t st;
	cudnnFilterDescriptor_t f1, f2;
	cudnnConvolutionDescriptor_t conv;
	cudnnActivationDescriptor_t relu;
	cudnnPoolingDescriptor_t pool;
	cudnnTensorDescriptor_t tx, ty1, tb, tp, ty2;
	size_t ws_size = 0;
	void *ws = NULL;

	if (repeat < 1) {
		fprintf(stderr, "usage: dnncheck [REPEAT>=1]\n");
		return 2;
	}
	CK_CUDA(cudaStreamCreate(&st));
	CK_DNN(cudnnCreate(&dnn));
	CK_DNN(cudnnSetStream(dnn, st));
	CK_BLAS(cublasCreate(&blas));
	CK_BLAS(cublasSetStream(blas, st));

	float *x = dev_filled((size_t)N * C0 * H * H, 1.0f, 0.0f);
	float *w1 = dev_filled((size_t)C1 * C0 * 9, 0.3f, 1.0f);
	float *bias = dev_filled(C1, 0.1f, 2.0f);
	float *w2 = dev_filled((size_t)C2 * C1 * 9, 0.2f, 3.0f);
	float *wfc = dev_filled((size_t)FC * C2 * HP * HP, 0.05f, 4.0f);
	float *y1 = dev_zero((size_t)N * C1 * H * H);
	float *p1 = dev_zero((size_t)N * C1 * HP * HP);
	float *y2 = dev_zero((size_t)N * C2 * HP * HP);
	float *sm = dev_zero((size_t)N * C2 * HP * HP);
	float *fc = dev_zero((size_t)FC * N);
	float *fc2 = dev_zero((size_t)FC * N);
	float *bt = dev_zero((size_t)N * FC * FC);

	tx = tensor(N, C0, H, H), ty1 = tensor(N, C1, H, H), tb = tensor(1, C1, 1, 1);
	tp = tensor(N, C1, HP, HP), ty2 = tensor(N, C2, HP, HP);
	CK_DNN(cudnnCreateFilterDescriptor(&f1));
	CK_DNN(cudnnSetFilter4dDescriptor(f1, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, C1, C0, 3, 3));
	CK_DNN(cudnnCreateFilterDescriptor(&f2));
	CK_DNN(cudnnSetFilter4dDescriptor(f2, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, C2, C1, 3, 3));
	CK_DNN(cudnnCreateConvolutionDescriptor(&conv));
	CK_DNN(cudnnSetConvolution2dDescriptor(conv, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
					       CUDNN_DATA_FLOAT));
	CK_DNN(cudnnCreateActivationDescriptor(&relu));
	CK_DNN(cudnnSetActivationDescriptor(relu, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN, 0.0));
	CK_DNN(cudnnCreatePoolingDescriptor(&pool));
	CK_DNN(cudnnSetPooling2dDescriptor(pool, CUDNN_POOLING_MAX, CUDNN_NOT_PROPAGATE_NAN, 2, 2, 0,
					   0, 2, 2));
	CK_DNN(cudnnGetConvolutionForwardWorkspaceSize(dnn, tp, f2, conv, ty2,
						       CUDNN_CONVOLUTION_FWD_ALGO_GEMM, &ws_size));
	if (ws_size)
		CK_CUDA(cudaMalloc(&ws, ws_size));

	for (int it = 0; it < repeat; it++) {
		CK_DNN(cudnnConvolutionForward(dnn, &one, tx, x, f1, w1, conv,
					       CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, NULL, 0,
					       &zero, ty1, y1));
		CK_DNN(cudnnAddTensor(dnn, &one, tb, bias, &one, ty1, y1));
		CK_DNN(cudnnActivationForward(dnn, relu, &one, ty1, y1, &zero, ty1, y1));
		CK_DNN(cudnnPoolingForward(dnn, pool, &one, ty1, y1, &zero, tp, p1));
		CK_DNN(cudnnConvolutionForward(dnn, &one, tp, p1, f2, w2, conv,
					       CUDNN_CONVOLUTION_FWD_ALGO_GEMM, ws, ws_size, &zero, ty2,
					       y2));
		CK_DNN(cudnnSoftmaxForward(dnn, CUDNN_SOFTMAX_ACCURATE, CUDNN_SOFTMAX_MODE_CHANNEL, &one,
					   ty2, y2, &zero, ty2, sm));
		/* fc: (FC x N) = wfc (FC x 256, col-major) * sm (256 x N, col-major) */
		CK_BLAS(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, FC, N, C2 * HP * HP, &one, wfc, FC,
				    sm, C2 * HP * HP, &zero, fc, FC));
		CK_BLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, FC, N, C2 * HP * HP, &half, wfc,
				     CUDA_R_32F, FC, sm, CUDA_R_32F, C2 * HP * HP, &zero, fc2,
				     CUDA_R_32F, FC, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
		/* per image: fc fc^T-like outer products, batched */
		CK_BLAS(cublasSgemmStridedBatched(blas, CUBLAS_OP_N, CUBLAS_OP_T, FC, FC, 1, &one, fc,
						  FC, FC, fc2, FC, FC, &zero, bt, FC, FC * FC, N));
		/* kernels of simgpu's libraries: conv 1, add 1, act 1, pool 1,
		 * GEMM conv 2 per image, softmax 1, three GEMMs */
		launches += 1 + 1 + 1 + 1 + 2 * N + 1 + 3;
		calls += 9;
	}
	CK_CUDA(cudaStreamSynchronize(st));

	report("conv1", y1, (size_t)N * C1 * H * H);
	report("pool", p1, (size_t)N * C1 * HP * HP);
	report("conv2", y2, (size_t)N * C2 * HP * HP);
	report("softmax", sm, (size_t)N * C2 * HP * HP);
	report("sgemm", fc, (size_t)FC * N);
	report("gemmex", fc2, (size_t)FC * N);
	report("batched", bt, (size_t)N * FC * FC);
	printf("STATS launches=%d calls=%d\n", launches, calls);

	cudnnDestroyTensorDescriptor(tx), cudnnDestroyTensorDescriptor(ty1);
	cudnnDestroyTensorDescriptor(tb), cudnnDestroyTensorDescriptor(tp);
	cudnnDestroyTensorDescriptor(ty2);
	cudnnDestroyFilterDescriptor(f1), cudnnDestroyFilterDescriptor(f2);
	cudnnDestroyConvolutionDescriptor(conv);
	cudnnDestroyActivationDescriptor(relu);
	cudnnDestroyPoolingDescriptor(pool);
	cublasDestroy(blas);
	cudnnDestroy(dnn);
	cudaFree(ws);
	cudaStreamDestroy(st);
	if (failures) {
		printf("FAIL dnncheck (%d calls failed)\n", failures);
		return 1;
	}
	printf("PASS dnncheck\n");
	return 0;
}
