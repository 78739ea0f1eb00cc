/*
 * cublas.c - simgpu's CPU cuBLAS (libcublas.so.13): handles, streams,
 * pointer and math modes, and the three GEMM entry points the services
 * use, each one launch of the kernel sgpu_sgemm on the handle's stream.
 *
 * Column-major, as cuBLAS: C (m x n, ldc) = alpha op(A) op(B) + beta C,
 * op(A) m x k.  fp32 only: cublasGemmEx with other types, or an integer
 * or double compute type, returns CUBLAS_STATUS_NOT_SUPPORTED.
 */
#include <stdlib.h>

#include "dnn_impl.h"

#define CUBLAS_MAGIC 0x63626c73u   /* "cbls" */

struct cublasContext {
	unsigned            magic;
	cudaStream_t        stream;
	cublasPointerMode_t pmode;
	cublasMath_t        math;
};

/* The version we claim: cuBLAS 13.0.0 (major*10000 + minor*100 + patch). */
#define SGPU_CUBLAS_VERSION 130000

static int bad_handle(cublasHandle_t h)
{
	return !h || h->magic != CUBLAS_MAGIC;
}

SGPU_EXPORT cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
	cublasHandle_t h;

	if (!handle)
		return CUBLAS_STATUS_INVALID_VALUE;
	h = calloc(1, sizeof(*h));
	if (!h)
		return CUBLAS_STATUS_ALLOC_FAILED;
	h->magic = CUBLAS_MAGIC;
	h->pmode = CUBLAS_POINTER_MODE_HOST;
	h->math = CUBLAS_DEFAULT_MATH;
	*handle = h;
	return CUBLAS_STATUS_SUCCESS;
}

/* The real cuBLAS synchronises the device in cublasDestroy; work already
 * queued keeps its own copy of the arguments, so freeing is safe here. */
SGPU_EXPORT cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
	if (bad_handle(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	handle->magic = 0;
	free(handle);
	return CUBLAS_STATUS_SUCCESS;
}

SGPU_EXPORT cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int *version)
{
	if (bad_handle(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!version)
		return CUBLAS_STATUS_INVALID_VALUE;
	*version = SGPU_CUBLAS_VERSION;
	return CUBLAS_STATUS_SUCCESS;
}

SGPU_EXPORT cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId)
{
	if (bad_handle(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	handle->stream = streamId;
	return CUBLAS_STATUS_SUCCESS;
}

SGPU_EXPORT cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId)
{
	if (bad_handle(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!streamId)
		return CUBLAS_STATUS_INVALID_VALUE;
	*streamId = handle->stream;
	return CUBLAS_STATUS_SUCCESS;
}

SGPU_EXPORT cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode)
{
	if (bad_handle(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
		return CUBLAS_STATUS_INVALID_VALUE;
	handle->pmode = mode;
	return CUBLAS_STATUS_SUCCESS;
}

SGPU_EXPORT cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t *mode)
{
	if (bad_handle(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!mode)
		return CUBLAS_STATUS_INVALID_VALUE;
	*mode = handle->pmode;
	return CUBLAS_STATUS_SUCCESS;
}

/* Math modes change only speed and precision on a GPU; the CPU computes
 * fp32 throughout, so any documented mode is accepted and remembered. */
SGPU_EXPORT cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode)
{
	unsigned base = (unsigned)mode & ~(unsigned)CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;

	if (bad_handle(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (base > CUBLAS_FP32_EMULATED_BF16X9_MATH)
		return CUBLAS_STATUS_INVALID_VALUE;
	handle->math = mode;
	return CUBLAS_STATUS_SUCCESS;
}

SGPU_EXPORT cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode)
{
	if (bad_handle(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!mode)
		return CUBLAS_STATUS_INVALID_VALUE;
	*mode = handle->math;
	return CUBLAS_STATUS_SUCCESS;
}

SGPU_EXPORT const char *cublasGetStatusName(cublasStatus_t status)
{
	switch (status) {
	case CUBLAS_STATUS_SUCCESS:          return "CUBLAS_STATUS_SUCCESS";
	case CUBLAS_STATUS_NOT_INITIALIZED:  return "CUBLAS_STATUS_NOT_INITIALIZED";
	case CUBLAS_STATUS_ALLOC_FAILED:     return "CUBLAS_STATUS_ALLOC_FAILED";
	case CUBLAS_STATUS_INVALID_VALUE:    return "CUBLAS_STATUS_INVALID_VALUE";
	case CUBLAS_STATUS_ARCH_MISMATCH:    return "CUBLAS_STATUS_ARCH_MISMATCH";
	case CUBLAS_STATUS_MAPPING_ERROR:    return "CUBLAS_STATUS_MAPPING_ERROR";
	case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
	case CUBLAS_STATUS_INTERNAL_ERROR:   return "CUBLAS_STATUS_INTERNAL_ERROR";
	case CUBLAS_STATUS_NOT_SUPPORTED:    return "CUBLAS_STATUS_NOT_SUPPORTED";
	case CUBLAS_STATUS_LICENSE_ERROR:    return "CUBLAS_STATUS_LICENSE_ERROR";
	}
	return "CUBLAS_STATUS_UNKNOWN";
}

SGPU_EXPORT const char *cublasGetStatusString(cublasStatus_t status)
{
	switch (status) {
	case CUBLAS_STATUS_SUCCESS:          return "success";
	case CUBLAS_STATUS_NOT_INITIALIZED:  return "the library was not initialized";
	case CUBLAS_STATUS_ALLOC_FAILED:     return "the resource allocation failed";
	case CUBLAS_STATUS_INVALID_VALUE:    return "an invalid numeric value was used as an argument";
	case CUBLAS_STATUS_ARCH_MISMATCH:    return "an absent device architectural feature is required";
	case CUBLAS_STATUS_MAPPING_ERROR:    return "an access to GPU memory space failed";
	case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
	case CUBLAS_STATUS_INTERNAL_ERROR:   return "an internal operation failed";
	case CUBLAS_STATUS_NOT_SUPPORTED:    return "the functionality requested is not supported";
	case CUBLAS_STATUS_LICENSE_ERROR:    return "an error was detected when checking the current licensing";
	}
	return "unknown error";
}

/* ---- GEMM ------------------------------------------------------------ */

/* __global__ void sgpu_sgemm(const float *A, const float *B, float *C,
 *                            struct sgpu_gemm_args g)                    */
static struct sgpu_kdef k_sgemm = {
	"sgpu_sgemm", 4,
	{ sizeof(void *), sizeof(void *), sizeof(void *), sizeof(struct sgpu_gemm_args) }, NULL
};

SGPU_EXPORT void simgpu_twin_sgpu_sgemm(const simgpu_launch *l)
{
	sgpu_gemm_run(SIMGPU_ARG(l, 0, const float *), SIMGPU_ARG(l, 1, const float *),
		      SIMGPU_ARG(l, 2, float *), &SIMGPU_ARG(l, 3, struct sgpu_gemm_args));
}

SGPU_EXPORT void simgpu_cost_sgpu_sgemm(const simgpu_launch *l, double *flops, double *bytes)
{
	sgpu_gemm_cost(&SIMGPU_ARG(l, 3, struct sgpu_gemm_args), flops, bytes);
}

static int is_op(cublasOperation_t op)
{
	/* OP_C of a real matrix is OP_T; OP_CONJG is for complex types only */
	return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}

/* Check the shapes as cuBLAS does and fill the strided views. */
static cublasStatus_t gemm_args(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
				int lda, int ldb, int ldc, struct sgpu_gemm_args *g)
{
	int rows_a = ta == CUBLAS_OP_N ? m : k, rows_b = tb == CUBLAS_OP_N ? k : n;

	if (!is_op(ta) || !is_op(tb) || m < 0 || n < 0 || k < 0)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (lda < (rows_a > 1 ? rows_a : 1) || ldb < (rows_b > 1 ? rows_b : 1) ||
	    ldc < (m > 1 ? m : 1))
		return CUBLAS_STATUS_INVALID_VALUE;
	g->m = m, g->n = n, g->k = k, g->batch = 1;
	/* column-major: element (r, c) of a matrix with leading dim ld is at r + c*ld */
	if (ta == CUBLAS_OP_N)
		g->a_rs = 1, g->a_cs = lda;
	else
		g->a_rs = lda, g->a_cs = 1;
	if (tb == CUBLAS_OP_N)
		g->b_rs = 1, g->b_cs = ldb;
	else
		g->b_rs = ldb, g->b_cs = 1;
	g->c_rs = 1, g->c_cs = ldc;
	return CUBLAS_STATUS_SUCCESS;
}

/* alpha/beta: host values now, or device pointers read by the kernel. */
static cublasStatus_t gemm_scalars(cublasHandle_t h, const float *alpha, const float *beta,
				   struct sgpu_gemm_args *g)
{
	if (!alpha || !beta)
		return CUBLAS_STATUS_INVALID_VALUE;
	if (h->pmode == CUBLAS_POINTER_MODE_DEVICE) {
		g->alpha_dev = alpha, g->beta_dev = beta;
		g->alpha = 1.0f, g->beta = 1.0f;     /* for the cost model */
	} else {
		g->alpha = *alpha, g->beta = *beta;
	}
	return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t gemm_launch(cublasHandle_t h, const float *A, const float *B, float *C,
				  struct sgpu_gemm_args *g)
{
	void *args[4] = { &A, &B, &C, g };
	unsigned gx, gy, gz;
	int e;

	/* nothing to compute: cuBLAS returns at once */
	if (g->m == 0 || g->n == 0 || g->batch == 0)
		return CUBLAS_STATUS_SUCCESS;
	if (!C || ((!A || !B) && g->k > 0))
		return CUBLAS_STATUS_INVALID_VALUE;
	sgpu_gemm_grid(g, &gx, &gy, &gz);
	e = sgpu_launch(&k_sgemm, gx, gy, gz, SGPU_GEMM_THREADS, args, h->stream);
	if (e == cudaErrorMemoryAllocation)
		return CUBLAS_STATUS_ALLOC_FAILED;
	return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

SGPU_EXPORT cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
					  cublasOperation_t transb, int m, int n, int k,
					  const float *alpha, const float *A, int lda,
					  const float *B, int ldb, const float *beta, float *C,
					  int ldc)
{
	struct sgpu_gemm_args g = { 0 };
	cublasStatus_t st;

	if (bad_handle(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	st = gemm_args(transa, transb, m, n, k, lda, ldb, ldc, &g);
	if (st == CUBLAS_STATUS_SUCCESS)
		st = gemm_scalars(handle, alpha, beta, &g);
	if (st != CUBLAS_STATUS_SUCCESS)
		return st;
	return gemm_launch(handle, A, B, C, &g);
}

/* fp32 in and out; every fp32 compute type (TF32, BF16x9 and half-speed
 * variants only change GPU precision/speed) runs as plain fp32 here. */
static int fp32_compute(cublasComputeType_t t)
{
	switch (t) {
	case CUBLAS_COMPUTE_32F:
	case CUBLAS_COMPUTE_32F_PEDANTIC:
	case CUBLAS_COMPUTE_32F_FAST_16F:
	case CUBLAS_COMPUTE_32F_FAST_16BF:
	case CUBLAS_COMPUTE_32F_FAST_TF32:
	case CUBLAS_COMPUTE_32F_EMULATED_16BFX9:
		return 1;
	default:
		return 0;
	}
}

SGPU_EXPORT cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
					cublasOperation_t transb, int m, int n, int k,
					const void *alpha, const void *A, cudaDataType Atype,
					int lda, const void *B, cudaDataType Btype, int ldb,
					const void *beta, void *C, cudaDataType Ctype, int ldc,
					cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
	struct sgpu_gemm_args g = { 0 };
	cublasStatus_t st;

	if (bad_handle(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (!(algo == CUBLAS_GEMM_DEFAULT || (algo >= CUBLAS_GEMM_ALGO0 && algo <= CUBLAS_GEMM_ALGO23) ||
	      (algo >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && algo <= CUBLAS_GEMM_ALGO15_TENSOR_OP)))
		return CUBLAS_STATUS_INVALID_VALUE;
	if (Atype != CUDA_R_32F || Btype != CUDA_R_32F || Ctype != CUDA_R_32F ||
	    !fp32_compute(computeType))
		return CUBLAS_STATUS_NOT_SUPPORTED;
	st = gemm_args(transa, transb, m, n, k, lda, ldb, ldc, &g);
	if (st == CUBLAS_STATUS_SUCCESS)
		st = gemm_scalars(handle, alpha, beta, &g);
	if (st != CUBLAS_STATUS_SUCCESS)
		return st;
	return gemm_launch(handle, A, B, C, &g);
}

SGPU_EXPORT cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle,
						     cublasOperation_t transa,
						     cublasOperation_t transb, int m, int n, int k,
						     const float *alpha, const float *A, int lda,
						     long long int strideA, const float *B, int ldb,
						     long long int strideB, const float *beta,
						     float *C, int ldc, long long int strideC,
						     int batchCount)
{
	struct sgpu_gemm_args g = { 0 };
	cublasStatus_t st;

	if (bad_handle(handle))
		return CUBLAS_STATUS_NOT_INITIALIZED;
	if (batchCount < 0)
		return CUBLAS_STATUS_INVALID_VALUE;
	st = gemm_args(transa, transb, m, n, k, lda, ldb, ldc, &g);
	if (st == CUBLAS_STATUS_SUCCESS)
		st = gemm_scalars(handle, alpha, beta, &g);
	if (st != CUBLAS_STATUS_SUCCESS)
		return st;
	g.batch = batchCount;
	g.stride_a = strideA, g.stride_b = strideB, g.stride_c = strideC;
	return gemm_launch(handle, A, B, C, &g);
}
