/*
 * hook_lib.c - cuDNN and cuBLAS calls as *library tasks* (C-Laius): each
 * hooked entry point becomes one task, opened with the parameters the
 * predictors key on, and every kernel the library launches meanwhile
 * belongs to it (shim_task.h).
 *
 * Each hook: find the real function (dlsym(RTLD_NEXT), else the library
 * already loaded RTLD_LOCAL, found with dlopen(RTLD_NOLOAD)); read the
 * shapes through the real library's own getters; open the task on the
 * handle's stream; call through; close the task with the call's status;
 * return that status unchanged.  A getter that fails leaves its
 * parameters out, nothing more.  No lock on the path: function pointers
 * are looked up once and then read with a relaxed atomic load.
 *
 * Without the real library (an app that exports these names itself, or a
 * broken install), a hook returns the library's NOT_INITIALIZED status and
 * says so once per function, instead of crashing.
 *
 * Prototypes come from shim/include/colocate_dnn.h, which declares them as
 * cuDNN 9 / cuBLAS 13 do: the compiler checks each hook's signature.
 */
#define _GNU_SOURCE
#include "shim.h"
#include "shim_task.h"
#include "shim_trace.h"
#include "include/colocate_dnn.h"

#include <dlfcn.h>

/* ---- finding the real functions ---------------------------------------- */

enum { LIB_CUDNN, LIB_CUBLAS };

static const char *const lib_files[2][3] = {
	{ "libcudnn.so.9", "libcudnn.so", NULL },
	{ "libcublas.so.13", "libcublas.so", NULL },
};

/* What a loaded library's file name starts with, when it was loaded
 * privately under another name, and the major version to prefer. */
static const char *const lib_prefix[2] = { "libcudnn.so", "libcublas.so" };
static const char *const lib_major[2] = { ".so.9", ".so.13" };

struct real_fn {
	const char *name;
	int         lib;
	void       *fn;          /* found; read with a relaxed atomic load */
	int         complained;
	uint64_t    retry_ns;    /* a miss: not looked up again before this */
};

#define REAL_FN(var, lib, fn) static struct real_fn var = { #fn, lib, NULL, 0, 0 }

/* The real function, or NULL (logged once).  A miss is looked up again at
 * most once a second: the library may be dlopen()ed later, but a getter
 * that does not exist must not cost loader work on every call. */
static void *real(struct real_fn *r)
{
	void *p = __atomic_load_n(&r->fn, __ATOMIC_RELAXED);
	uint64_t now;

	if (__builtin_expect(p != NULL, 1))
		return p;
	now = shim_now_ns();
	if (now < __atomic_load_n(&r->retry_ns, __ATOMIC_RELAXED))
		return NULL;
	p = shim_real_in(lib_files[r->lib], lib_prefix[r->lib], lib_major[r->lib], r->name);
	if (p) {
		__atomic_store_n(&r->fn, p, __ATOMIC_RELAXED);
		return p;
	}
	__atomic_store_n(&r->retry_ns, now + 1000000000ull, __ATOMIC_RELAXED);
	if (!__atomic_exchange_n(&r->complained, 1, __ATOMIC_RELAXED))
		shim_log("%s: the real %s is not loaded; returning NOT_INITIALIZED", r->name,
			 lib_files[r->lib][0]);
	return NULL;
}

#define CALL(var, T) ((__typeof__(&T))real(&var))

/*
 * The parameters only go into the trace: with tracing off, or inside an
 * outer library task (whose parameters are the ones recorded), no
 * descriptor getter runs -- no cost, and no cuDNN error state of ours for
 * the app to see.  GETTER is CALL for those getters, NULL otherwise.
 */
static inline int recording(void)
{
	return shim_trace_on() && !shim_task_in_lib();
}

#define GETTER(var, T) (recording() ? CALL(var, T) : NULL)

/* ---- recording parameters ------------------------------------------------ */

struct params {
	struct shim_task_param p[SHIM_TASK_MAX_PARAMS];
	int n;
};

static inline void put(struct params *ps, const char *key, double val)
{
	if (ps->n < SHIM_TASK_MAX_PARAMS)
		ps->p[ps->n++] = (struct shim_task_param){ key, val };
}

REAL_FN(r_get_tensor, LIB_CUDNN, cudnnGetTensor4dDescriptor);
REAL_FN(r_get_filter, LIB_CUDNN, cudnnGetFilter4dDescriptor);
REAL_FN(r_get_conv, LIB_CUDNN, cudnnGetConvolution2dDescriptor);
REAL_FN(r_get_groups, LIB_CUDNN, cudnnGetConvolutionGroupCount);
REAL_FN(r_get_act, LIB_CUDNN, cudnnGetActivationDescriptor);
REAL_FN(r_get_pool, LIB_CUDNN, cudnnGetPooling2dDescriptor);
REAL_FN(r_dnn_stream, LIB_CUDNN, cudnnGetStream);
REAL_FN(r_blas_stream, LIB_CUBLAS, cublasGetStream_v2);
REAL_FN(r_blas_math, LIB_CUBLAS, cublasGetMathMode);

struct dims { cudnnDataType_t t; int n, c, h, w; };

static int tensor_dims(cudnnTensorDescriptor_t d, struct dims *o)
{
	__typeof__(&cudnnGetTensor4dDescriptor) f = GETTER(r_get_tensor, cudnnGetTensor4dDescriptor);
	int ns, cs, hs, ws;

	return f && f(d, &o->t, &o->n, &o->c, &o->h, &o->w, &ns, &cs, &hs, &ws) ==
			    CUDNN_STATUS_SUCCESS;
}

/* n, c, h, w and the data type of a tensor, under fixed keys */
static void put_tensor(struct params *ps, cudnnTensorDescriptor_t d)
{
	struct dims x;

	if (!tensor_dims(d, &x))
		return;
	put(ps, "n", x.n), put(ps, "c", x.c), put(ps, "h", x.h), put(ps, "w", x.w);
	put(ps, "dtype", x.t);
}

static void *dnn_stream(cudnnHandle_t h)
{
	__typeof__(&cudnnGetStream) f = GETTER(r_dnn_stream, cudnnGetStream);
	cudaStream_t s = NULL;

	if (!f || f(h, &s) != CUDNN_STATUS_SUCCESS)
		return NULL;
	return s;
}

static void *blas_stream(cublasHandle_t h)
{
	__typeof__(&cublasGetStream_v2) f = GETTER(r_blas_stream, cublasGetStream_v2);
	cudaStream_t s = NULL;

	if (!f || f(h, &s) != CUBLAS_STATUS_SUCCESS)
		return NULL;
	return s;
}

/* Open the task (the shim started first, so that the task has a slot to
 * count into); returns the token for shim_task_lib_end. */
static uint64_t begin(const char *api, const struct params *ps, void *stream)
{
	shim_start();
	return shim_task_lib_begin(api, ps->p, ps->n, stream);
}

/* ---- cuDNN ----------------------------------------------------------------- */

REAL_FN(r_conv_fwd, LIB_CUDNN, cudnnConvolutionForward);

SHIM_API cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
					       const cudnnTensorDescriptor_t xDesc, const void *x,
					       const cudnnFilterDescriptor_t wDesc, const void *w,
					       const cudnnConvolutionDescriptor_t convDesc,
					       cudnnConvolutionFwdAlgo_t algo, void *workSpace,
					       size_t workSpaceSizeInBytes, const void *beta,
					       const cudnnTensorDescriptor_t yDesc, void *y)
{
	__typeof__(&cudnnConvolutionForward) fn = CALL(r_conv_fwd, cudnnConvolutionForward);
	__typeof__(&cudnnGetFilter4dDescriptor) gf = GETTER(r_get_filter, cudnnGetFilter4dDescriptor);
	__typeof__(&cudnnGetConvolution2dDescriptor) gc =
		GETTER(r_get_conv, cudnnGetConvolution2dDescriptor);
	__typeof__(&cudnnGetConvolutionGroupCount) gg =
		GETTER(r_get_groups, cudnnGetConvolutionGroupCount);
	struct params ps = { .n = 0 };
	struct dims xd, yd;
	cudnnDataType_t ft, ct;
	cudnnTensorFormat_t fmt;
	cudnnConvolutionMode_t mode;
	int k = 0, fc = 0, r = 0, s = 0, ph, pw, u, v, dh, dw, groups = 1, have_x, have_y;
	uint64_t tok;
	cudnnStatus_t rc;

	if (!fn)
		return CUDNN_STATUS_NOT_INITIALIZED;
	have_x = tensor_dims(xDesc, &xd);
	have_y = tensor_dims(yDesc, &yd);
	if (have_x) {
		put(&ps, "n", xd.n), put(&ps, "c", xd.c), put(&ps, "h", xd.h), put(&ps, "w", xd.w);
		put(&ps, "dtype", xd.t);
	}
	if (gf && gf(wDesc, &ft, &fmt, &k, &fc, &r, &s) == CUDNN_STATUS_SUCCESS)
		put(&ps, "k", k), put(&ps, "r", r), put(&ps, "s", s);
	if (gc && gc(convDesc, &ph, &pw, &u, &v, &dh, &dw, &mode, &ct) == CUDNN_STATUS_SUCCESS) {
		put(&ps, "pad_h", ph), put(&ps, "pad_w", pw);
		put(&ps, "stride_h", u), put(&ps, "stride_w", v);
		put(&ps, "dil_h", dh), put(&ps, "dil_w", dw);
	}
	if (gg && gg(convDesc, &groups) == CUDNN_STATUS_SUCCESS)
		put(&ps, "groups", groups);
	if (have_y)
		put(&ps, "out_h", yd.h), put(&ps, "out_w", yd.w);
	put(&ps, "algo", algo);
	put(&ps, "workspace", (double)workSpaceSizeInBytes);
	if (have_y && k)   /* 2 N K P Q (C/groups) R S, C/groups being the filter's c */
		put(&ps, "flops", 2.0 * yd.n * k * yd.h * yd.w * (double)fc * r * s);

	tok = begin("cudnnConvolutionForward", &ps, dnn_stream(handle));
	rc = fn(handle, alpha, xDesc, x, wDesc, w, convDesc, algo, workSpace,
		workSpaceSizeInBytes, beta, yDesc, y);
	shim_task_lib_end(tok, (int)rc);
	return rc;
}

REAL_FN(r_act_fwd, LIB_CUDNN, cudnnActivationForward);

SHIM_API cudnnStatus_t cudnnActivationForward(cudnnHandle_t handle,
					      cudnnActivationDescriptor_t activationDesc,
					      const void *alpha,
					      const cudnnTensorDescriptor_t xDesc, const void *x,
					      const void *beta,
					      const cudnnTensorDescriptor_t yDesc, void *y)
{
	__typeof__(&cudnnActivationForward) fn = CALL(r_act_fwd, cudnnActivationForward);
	__typeof__(&cudnnGetActivationDescriptor) ga =
		GETTER(r_get_act, cudnnGetActivationDescriptor);
	struct params ps = { .n = 0 };
	cudnnActivationMode_t mode;
	cudnnNanPropagation_t nan;
	double coef;
	uint64_t tok;
	cudnnStatus_t rc;

	if (!fn)
		return CUDNN_STATUS_NOT_INITIALIZED;
	put_tensor(&ps, xDesc);
	if (ga && ga(activationDesc, &mode, &nan, &coef) == CUDNN_STATUS_SUCCESS)
		put(&ps, "mode", mode), put(&ps, "coef", coef);

	tok = begin("cudnnActivationForward", &ps, dnn_stream(handle));
	rc = fn(handle, activationDesc, alpha, xDesc, x, beta, yDesc, y);
	shim_task_lib_end(tok, (int)rc);
	return rc;
}

REAL_FN(r_pool_fwd, LIB_CUDNN, cudnnPoolingForward);

SHIM_API cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle,
					   const cudnnPoolingDescriptor_t poolingDesc,
					   const void *alpha, const cudnnTensorDescriptor_t xDesc,
					   const void *x, const void *beta,
					   const cudnnTensorDescriptor_t yDesc, void *y)
{
	__typeof__(&cudnnPoolingForward) fn = CALL(r_pool_fwd, cudnnPoolingForward);
	__typeof__(&cudnnGetPooling2dDescriptor) gp = GETTER(r_get_pool, cudnnGetPooling2dDescriptor);
	struct params ps = { .n = 0 };
	cudnnPoolingMode_t mode;
	cudnnNanPropagation_t nan;
	int wh, ww, ph, pw, u, v;
	struct dims yd;
	uint64_t tok;
	cudnnStatus_t rc;

	if (!fn)
		return CUDNN_STATUS_NOT_INITIALIZED;
	put_tensor(&ps, xDesc);
	if (gp && gp(poolingDesc, &mode, &nan, &wh, &ww, &ph, &pw, &u, &v) == CUDNN_STATUS_SUCCESS) {
		put(&ps, "mode", mode);
		put(&ps, "win_h", wh), put(&ps, "win_w", ww);
		put(&ps, "pad_h", ph), put(&ps, "pad_w", pw);
		put(&ps, "stride_h", u), put(&ps, "stride_w", v);
	}
	if (tensor_dims(yDesc, &yd))
		put(&ps, "out_h", yd.h), put(&ps, "out_w", yd.w);

	tok = begin("cudnnPoolingForward", &ps, dnn_stream(handle));
	rc = fn(handle, poolingDesc, alpha, xDesc, x, beta, yDesc, y);
	shim_task_lib_end(tok, (int)rc);
	return rc;
}

REAL_FN(r_softmax_fwd, LIB_CUDNN, cudnnSoftmaxForward);

SHIM_API cudnnStatus_t cudnnSoftmaxForward(cudnnHandle_t handle, cudnnSoftmaxAlgorithm_t algo,
					   cudnnSoftmaxMode_t mode, const void *alpha,
					   const cudnnTensorDescriptor_t xDesc, const void *x,
					   const void *beta, const cudnnTensorDescriptor_t yDesc,
					   void *y)
{
	__typeof__(&cudnnSoftmaxForward) fn = CALL(r_softmax_fwd, cudnnSoftmaxForward);
	struct params ps = { .n = 0 };
	uint64_t tok;
	cudnnStatus_t rc;

	if (!fn)
		return CUDNN_STATUS_NOT_INITIALIZED;
	put_tensor(&ps, xDesc);
	put(&ps, "algo", algo), put(&ps, "mode", mode);

	tok = begin("cudnnSoftmaxForward", &ps, dnn_stream(handle));
	rc = fn(handle, algo, mode, alpha, xDesc, x, beta, yDesc, y);
	shim_task_lib_end(tok, (int)rc);
	return rc;
}

REAL_FN(r_add_tensor, LIB_CUDNN, cudnnAddTensor);

SHIM_API cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void *alpha,
				      const cudnnTensorDescriptor_t aDesc, const void *A,
				      const void *beta, const cudnnTensorDescriptor_t cDesc,
				      void *C)
{
	__typeof__(&cudnnAddTensor) fn = CALL(r_add_tensor, cudnnAddTensor);
	struct params ps = { .n = 0 };
	struct dims ad;
	uint64_t tok;
	cudnnStatus_t rc;

	if (!fn)
		return CUDNN_STATUS_NOT_INITIALIZED;
	put_tensor(&ps, cDesc);      /* the output's shape: the work done */
	if (tensor_dims(aDesc, &ad)) {
		put(&ps, "a_n", ad.n), put(&ps, "a_c", ad.c);
		put(&ps, "a_h", ad.h), put(&ps, "a_w", ad.w);
	}

	tok = begin("cudnnAddTensor", &ps, dnn_stream(handle));
	rc = fn(handle, alpha, aDesc, A, beta, cDesc, C);
	shim_task_lib_end(tok, (int)rc);
	return rc;
}

/* ---- cuBLAS ---------------------------------------------------------------- */

/* The shape of a GEMM, common to the three entry points. */
static void put_gemm(struct params *ps, cublasHandle_t h, cublasOperation_t ta,
		     cublasOperation_t tb, int m, int n, int k, int lda, int ldb, int ldc,
		     int batch)
{
	__typeof__(&cublasGetMathMode) gm = GETTER(r_blas_math, cublasGetMathMode);
	cublasMath_t math;

	put(ps, "transa", ta), put(ps, "transb", tb);
	put(ps, "m", m), put(ps, "n", n), put(ps, "k", k);
	put(ps, "lda", lda), put(ps, "ldb", ldb), put(ps, "ldc", ldc);
	put(ps, "batch", batch);
	put(ps, "flops", 2.0 * m * n * (double)k * batch);
	if (gm && gm(h, &math) == CUBLAS_STATUS_SUCCESS)
		put(ps, "math", math);
}

REAL_FN(r_sgemm, LIB_CUBLAS, cublasSgemm_v2);

SHIM_API cublasStatus_t cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
				       cublasOperation_t transb, int m, int n, int k,
				       const float *alpha, const float *A, int lda, const float *B,
				       int ldb, const float *beta, float *C, int ldc)
{
	__typeof__(&cublasSgemm_v2) fn = CALL(r_sgemm, cublasSgemm_v2);
	struct params ps = { .n = 0 };
	uint64_t tok;
	cublasStatus_t rc;

	if (!fn)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	put_gemm(&ps, handle, transa, transb, m, n, k, lda, ldb, ldc, 1);
	put(&ps, "dtype", CUDA_R_32F);

	tok = begin("cublasSgemm_v2", &ps, blas_stream(handle));
	rc = fn(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
	shim_task_lib_end(tok, (int)rc);
	return rc;
}

REAL_FN(r_gemmex, LIB_CUBLAS, cublasGemmEx);

SHIM_API cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
				     cublasOperation_t transb, int m, int n, int k,
				     const void *alpha, const void *A, cudaDataType Atype, int lda,
				     const void *B, cudaDataType Btype, int ldb, const void *beta,
				     void *C, cudaDataType Ctype, int ldc,
				     cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
	__typeof__(&cublasGemmEx) fn = CALL(r_gemmex, cublasGemmEx);
	struct params ps = { .n = 0 };
	uint64_t tok;
	cublasStatus_t rc;

	if (!fn)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	put_gemm(&ps, handle, transa, transb, m, n, k, lda, ldb, ldc, 1);
	put(&ps, "dtype", Atype);
	put(&ps, "btype", Btype), put(&ps, "ctype", Ctype);
	put(&ps, "compute", computeType), put(&ps, "algo", algo);

	tok = begin("cublasGemmEx", &ps, blas_stream(handle));
	rc = fn(handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C,
		Ctype, ldc, computeType, algo);
	shim_task_lib_end(tok, (int)rc);
	return rc;
}

REAL_FN(r_sgemm_sb, LIB_CUBLAS, cublasSgemmStridedBatched);

SHIM_API cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle,
						  cublasOperation_t transa,
						  cublasOperation_t transb, int m, int n, int k,
						  const float *alpha, const float *A, int lda,
						  long long int strideA, const float *B, int ldb,
						  long long int strideB, const float *beta,
						  float *C, int ldc, long long int strideC,
						  int batchCount)
{
	__typeof__(&cublasSgemmStridedBatched) fn = CALL(r_sgemm_sb, cublasSgemmStridedBatched);
	struct params ps = { .n = 0 };
	uint64_t tok;
	cublasStatus_t rc;

	if (!fn)
		return CUBLAS_STATUS_NOT_INITIALIZED;
	put_gemm(&ps, handle, transa, transb, m, n, k, lda, ldb, ldc, batchCount);
	put(&ps, "dtype", CUDA_R_32F);
	put(&ps, "stride_a", (double)strideA), put(&ps, "stride_b", (double)strideB);
	put(&ps, "stride_c", (double)strideC);

	tok = begin("cublasSgemmStridedBatched", &ps, blas_stream(handle));
	rc = fn(handle, transa, transb, m, n, k, alpha, A, lda, strideA, B, ldb, strideB, beta, C,
		ldc, strideC, batchCount);
	shim_task_lib_end(tok, (int)rc);
	return rc;
}
