/*
 * dnn_impl.h - internals of simgpu's CPU cuDNN (libcudnn.so.9) and cuBLAS
 * (libcublas.so.13).
 *
 * Every library call that does math enqueues one or more "kernels" on the
 * caller's stream through the public runtime API (cudaLaunchKernel, a
 * dynamic call, so a preloaded shim sees it), with a kernel handle made by
 * simgpu_kernel_define().  simgpu runs each kernel through its host twin,
 * simgpu_twin_<name>, exported from the library, and times it with
 * simgpu_cost_<name>.  The kernel's arguments are plain values copied at
 * launch (descriptors are flattened into an argument struct), so a
 * descriptor changed or destroyed after the call does not change the work
 * already queued, just as on a GPU.
 *
 * Kernels (their names are what simgpu reports and what the shim counts):
 *   sgpu_cudnn_conv_fwd      implicit-GEMM convolution (algos 0 and 1)
 *   sgpu_cudnn_im2col        GEMM algo (2), step 1: one image into the workspace
 *   sgpu_cudnn_conv_gemm     GEMM algo (2), step 2: filter x columns, per group
 *   sgpu_cudnn_activation_fwd
 *   sgpu_cudnn_pooling_fwd
 *   sgpu_cudnn_softmax_fwd
 *   sgpu_cudnn_add_tensor
 *   sgpu_sgemm               cublasSgemm_v2, cublasGemmEx (fp32), cublasSgemmStridedBatched
 *
 * Float32 only.  Tensors may have any positive strides (NCHW, NHWC, or
 * the ...Ex layouts); filters must be packed NCHW (KCRS).
 */
#ifndef SGPU_DNN_IMPL_H
#define SGPU_DNN_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "../../include/colocate_dnn.h"
#include "../simgpu_twin.h"

#define SGPU_EXPORT __attribute__((visibility("default")))
#define SGPU_HIDDEN __attribute__((visibility("hidden")))

/* ---- kernel argument structs: plain values, copied at launch -------- */

/* A 4-d float tensor view: dims and element strides. */
struct sgpu_tensor {
	int n, c, h, w;
	int ns, cs, hs, ws;
};

static inline long long sgpu_off(const struct sgpu_tensor *t, int n, int c, int h, int w)
{
	return (long long)n * t->ns + (long long)c * t->cs + (long long)h * t->hs +
	       (long long)w * t->ws;
}

static inline double sgpu_count(const struct sgpu_tensor *t)
{
	return (double)t->n * t->c * t->h * t->w;
}

/* Convolution: x (N,C,H,W) * filter (K, C/groups, R, S) -> y (N,K,P,Q). */
struct sgpu_conv_args {
	struct sgpu_tensor x, y;
	int k, c, r, s;            /* filter dims; c is per group              */
	int pad_h, pad_w, u, v;    /* padding, vertical/horizontal stride      */
	int dil_h, dil_w;
	int groups;
	int flip;                  /* CUDNN_CONVOLUTION: filter flipped        */
	float alpha, beta;
};

/*
 * GEMM on strided views: C[i,j] = alpha * sum_p A[i,p] B[p,j] + beta * C[i,j]
 * for i < m, j < n, p < k, in each of batch problems; element (i,p) of A
 * is at A[i*a_rs + p*a_cs] (already op()'d), likewise B and C.  With
 * beta == 0, C is not read (it may hold NaNs), as cuBLAS and cuDNN promise.
 * alpha_dev/beta_dev: CUBLAS_POINTER_MODE_DEVICE, read when the kernel runs.
 */
struct sgpu_gemm_args {
	int m, n, k, batch;
	long long a_rs, a_cs, b_rs, b_cs, c_rs, c_cs;
	long long stride_a, stride_b, stride_c;
	float alpha, beta;
	const float *alpha_dev, *beta_dev;
};

struct sgpu_act_args {
	struct sgpu_tensor x, y;
	int mode;                  /* cudnnActivationMode_t                    */
	int nan_prop;
	float coef;
	float alpha, beta;
};

struct sgpu_pool_args {
	struct sgpu_tensor x, y;
	int mode, nan_prop;
	int win_h, win_w, pad_h, pad_w, u, v;
	float alpha, beta;
};

struct sgpu_softmax_args {
	struct sgpu_tensor x, y;
	int algo, mode;
	float alpha, beta;
};

/* C = alpha * A + beta * C, A broadcast over its dims of size 1. */
struct sgpu_add_args {
	struct sgpu_tensor a, c;
	float alpha, beta;
};

/* ---- launching (launch.c, in both libraries) ------------------------- */

/* A kernel of this library: its name and parameter sizes; handle filled in
 * on first use by simgpu_kernel_define. */
struct sgpu_kdef {
	const char     *name;
	int             nparams;
	unsigned        sizes[6];
	void           *handle;
};

/* Launch def on stream with grid/block and args (args[i] -> i-th param).
 * Returns the runtime's error (cudaErrorMemoryAllocation when the kernel
 * could not be defined). */
SGPU_HIDDEN int sgpu_launch(struct sgpu_kdef *def, unsigned gx, unsigned gy, unsigned gz,
			    unsigned block, void **args, cudaStream_t stream);

/* Grid edge for `work` items of `per` each (at least 1, at most max). */
static inline unsigned sgpu_blocks(double work, double per, unsigned max)
{
	double b = work / per;
	unsigned u = b < 1.0 ? 1u : (b >= (double)max ? max : (unsigned)b);

	if ((double)u * per < work && u < max)
		u++;
	return u;
}

/* ---- the shared GEMM core (gemm.c, in both libraries) ---------------- */

SGPU_HIDDEN void sgpu_gemm_run(const float *A, const float *B, float *C,
			       const struct sgpu_gemm_args *g);
SGPU_HIDDEN void sgpu_gemm_cost(const struct sgpu_gemm_args *g, double *flops, double *bytes);
/*
 * GEMM-like kernels (sgemm, the convolutions) launch SGPU_GEMM_THREADS
 * threads per block, each block one 64 x 64 output tile (128 x 64 for the
 * implicit convolution).  simgpu's occupancy rule puts 2048 / threads
 * blocks on an SM: 4 here, about what register-heavy SGEMM kernels get, so
 * a GEMM occupies as many SMs as its tiles can fill and no more.
 */
#define SGPU_GEMM_THREADS 512
/* blocks of the GEMM grid: 64 x 64 output tiles, batch in z */
SGPU_HIDDEN void sgpu_gemm_grid(const struct sgpu_gemm_args *g, unsigned *gx, unsigned *gy,
				unsigned *gz);

/* ---- cuDNN descriptors (cudnn_desc.c) -------------------------------- */

#define SGPU_MAGIC_HANDLE  0x646e6e68u   /* "dnnh" */
#define SGPU_MAGIC_TENSOR  0x646e6e74u
#define SGPU_MAGIC_FILTER  0x646e6e66u
#define SGPU_MAGIC_CONV    0x646e6e63u
#define SGPU_MAGIC_ACT     0x646e6e61u
#define SGPU_MAGIC_POOL    0x646e6e70u

struct cudnnContext {
	unsigned      magic;
	cudaStream_t  stream;
};

struct cudnnTensorStruct {
	unsigned            magic;
	int                 set;
	cudnnDataType_t     dtype;
	struct sgpu_tensor  t;
};

struct cudnnFilterStruct {
	unsigned            magic;
	int                 set;
	cudnnDataType_t     dtype;
	cudnnTensorFormat_t format;
	int                 k, c, r, s;
};

struct cudnnConvolutionStruct {
	unsigned               magic;
	int                    set;
	int                    pad_h, pad_w, u, v, dil_h, dil_w;
	cudnnConvolutionMode_t mode;
	cudnnDataType_t        compute;
	int                    groups;
	cudnnMathType_t        math;
};

struct cudnnActivationStruct {
	unsigned              magic;
	int                   set;
	cudnnActivationMode_t mode;
	cudnnNanPropagation_t nan;
	double                coef;
};

struct cudnnPoolingStruct {
	unsigned              magic;
	int                   set;
	cudnnPoolingMode_t    mode;
	cudnnNanPropagation_t nan;
	int                   win_h, win_w, pad_h, pad_w, u, v;
};

/* Validity checks shared by the operations: SUCCESS, BAD_PARAM, NOT_SUPPORTED. */
SGPU_HIDDEN cudnnStatus_t sgpu_check_handle(cudnnHandle_t h);
SGPU_HIDDEN cudnnStatus_t sgpu_check_tensor(const struct cudnnTensorStruct *t);
SGPU_HIDDEN cudnnStatus_t sgpu_check_filter(const struct cudnnFilterStruct *f);
SGPU_HIDDEN cudnnStatus_t sgpu_check_conv(const struct cudnnConvolutionStruct *c);
/* Output dims of a convolution, or BAD_PARAM when the shapes do not fit. */
SGPU_HIDDEN cudnnStatus_t sgpu_conv_out(const struct cudnnConvolutionStruct *cv,
					const struct cudnnTensorStruct *x,
					const struct cudnnFilterStruct *f,
					int *n, int *c, int *h, int *w);
/* Read a float scale factor given by host pointer (cuDNN's alpha/beta). */
SGPU_HIDDEN cudnnStatus_t sgpu_scale(const void *p, float *out);

#endif
