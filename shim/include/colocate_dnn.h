/*
 * colocate_dnn.h - the subset of cuDNN 9 and cuBLAS (CUDA 13) that the
 * colocate bench services use, declared exactly as NVIDIA's headers
 * declare it (same types, same enum values, same symbol names), so that a
 * program includes this file instead of <cudnn.h> / <cublas_v2.h> and
 * builds on a machine that has neither.
 *
 *   on a GPU machine:  links -lcudnn -lcublas against NVIDIA's libraries
 *                      (libcudnn.so.9, libcublas.so.13): same ABI;
 *   on simgpu:         links against shim/lib/simgpu/libcudnn.so.9 and
 *                      libcublas.so.13, CPU versions that launch their work
 *                      as kernels on simgpu's device model.
 *
 * Enum values are the real ABI values (checked against NVIDIA's cuDNN 9
 * API reference and cuBLAS 13 documentation; see the report that came with
 * this file for which ones).  Handles and descriptors are opaque pointers
 * to incomplete structs with NVIDIA's struct tags, so mixing this header
 * with the real one in one program is an error only at the duplicate
 * typedefs, never a silent ABI mismatch.
 *
 * The simgpu libraries implement float32 only; other data types and
 * filter formats return CUDNN_STATUS_NOT_SUPPORTED / CUBLAS_STATUS_NOT_SUPPORTED.
 */
#ifndef COLOCATE_DNN_H
#define COLOCATE_DNN_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>   /* cudaStream_t                       */
#include <library_types.h>      /* cudaDataType_t (CUDA_R_32F = 0 ...) */

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * cuDNN 9 (cudnn_graph.h, cudnn_ops.h, cudnn_cnn.h)
 * ====================================================================== */

/* The version this subset follows (CUDNN_MAJOR*10000 + MINOR*100 + PATCH). */
#define COLOCATE_DNN_CUDNN_VERSION 91300

typedef struct cudnnContext             *cudnnHandle_t;
typedef struct cudnnTensorStruct        *cudnnTensorDescriptor_t;
typedef struct cudnnFilterStruct        *cudnnFilterDescriptor_t;
typedef struct cudnnConvolutionStruct   *cudnnConvolutionDescriptor_t;
typedef struct cudnnActivationStruct    *cudnnActivationDescriptor_t;
typedef struct cudnnPoolingStruct       *cudnnPoolingDescriptor_t;

/* cuDNN 9 renumbered its status codes into categories of 1000. */
typedef enum {
	CUDNN_STATUS_SUCCESS                              = 0,

	CUDNN_STATUS_NOT_INITIALIZED                      = 1001,
	CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH          = 1002,
	CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH       = 1003,
	CUDNN_STATUS_DEPRECATED                           = 1004,
	CUDNN_STATUS_LICENSE_ERROR                        = 1005,
	CUDNN_STATUS_RUNTIME_IN_PROGRESS                  = 1006,
	CUDNN_STATUS_RUNTIME_FP_OVERFLOW                  = 1007,
	CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED            = 1008,

	CUDNN_STATUS_BAD_PARAM                            = 2000,
	CUDNN_STATUS_BAD_PARAM_NULL_POINTER               = 2002,
	CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER         = 2003,
	CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED              = 2004,
	CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND               = 2005,
	CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT          = 2006,
	CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH            = 2007,
	CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH             = 2008,
	CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES         = 2009,
	CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE             = 2010,
	CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH        = 2011,
	CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE            = 2012,

	CUDNN_STATUS_NOT_SUPPORTED                        = 3000,
	CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN          = 3001,
	CUDNN_STATUS_NOT_SUPPORTED_SHAPE                  = 3002,
	CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE              = 3003,
	CUDNN_STATUS_NOT_SUPPORTED_LAYOUT                 = 3004,
	CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER = 3005,
	CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART    = 3006,
	CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH          = 3007,
	CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING = 3008,
	CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE = 3009,
	CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT = 3010,
	CUDNN_STATUS_NOT_SUPPORTED_PADDING                = 3011,
	CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM       = 3012,
	CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API  = 3013,

	CUDNN_STATUS_INTERNAL_ERROR                       = 4000,
	CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED    = 4001,
	CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE      = 4002,
	CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED = 4003,
	CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED = 4004,
	CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM      = 4005,
	CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED = 4006,

	CUDNN_STATUS_EXECUTION_FAILED                     = 5000,
	CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER         = 5001,
	CUDNN_STATUS_EXECUTION_FAILED_CUBLAS              = 5002,
	CUDNN_STATUS_EXECUTION_FAILED_CUDART              = 5003,
	CUDNN_STATUS_EXECUTION_FAILED_CURAND              = 5004,

	/* pre-9 names kept by cuDNN 9 as aliases */
	CUDNN_STATUS_ALLOC_FAILED    = CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED,
	CUDNN_STATUS_INVALID_VALUE   = 2001,
	CUDNN_STATUS_ARCH_MISMATCH   = CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH,
	CUDNN_STATUS_MAPPING_ERROR   = CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED,
	CUDNN_STATUS_RUNTIME_PREREQUISITE_MISSING = CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING,
	CUDNN_STATUS_VERSION_MISMATCH = CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH,
} cudnnStatus_t;

typedef enum {
	CUDNN_DATA_FLOAT   = 0,
	CUDNN_DATA_DOUBLE  = 1,
	CUDNN_DATA_HALF    = 2,
	CUDNN_DATA_INT8    = 3,
	CUDNN_DATA_INT32   = 4,
	CUDNN_DATA_INT8x4  = 5,
	CUDNN_DATA_UINT8   = 6,
	CUDNN_DATA_UINT8x4 = 7,
	CUDNN_DATA_INT8x32 = 8,
	CUDNN_DATA_BFLOAT16 = 9,
	CUDNN_DATA_INT64   = 10,
	CUDNN_DATA_BOOLEAN = 11,
	CUDNN_DATA_FP8_E4M3 = 12,
	CUDNN_DATA_FP8_E5M2 = 13,
	CUDNN_DATA_FAST_FLOAT_FOR_FP8 = 14,
} cudnnDataType_t;

typedef enum {
	CUDNN_TENSOR_NCHW        = 0,
	CUDNN_TENSOR_NHWC        = 1,
	CUDNN_TENSOR_NCHW_VECT_C = 2,
} cudnnTensorFormat_t;

typedef enum {
	CUDNN_NOT_PROPAGATE_NAN = 0,
	CUDNN_PROPAGATE_NAN     = 1,
} cudnnNanPropagation_t;

typedef enum {
	CUDNN_DEFAULT_MATH                    = 0,
	CUDNN_TENSOR_OP_MATH                  = 1,
	CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION = 2,
	CUDNN_FMA_MATH                        = 3,
} cudnnMathType_t;

typedef enum {
	CUDNN_NON_DETERMINISTIC = 0,
	CUDNN_DETERMINISTIC     = 1,
} cudnnDeterminism_t;

typedef enum {
	CUDNN_CONVOLUTION       = 0,
	CUDNN_CROSS_CORRELATION = 1,
} cudnnConvolutionMode_t;

typedef enum {
	CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM         = 0,
	CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM = 1,
	CUDNN_CONVOLUTION_FWD_ALGO_GEMM                  = 2,
	CUDNN_CONVOLUTION_FWD_ALGO_DIRECT                = 3,
	CUDNN_CONVOLUTION_FWD_ALGO_FFT                   = 4,
	CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING            = 5,
	CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD              = 6,
	CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED     = 7,
	CUDNN_CONVOLUTION_FWD_ALGO_COUNT                 = 8,
} cudnnConvolutionFwdAlgo_t;

typedef struct cudnnConvolutionFwdAlgoPerfStruct {
	cudnnConvolutionFwdAlgo_t algo;
	cudnnStatus_t             status;
	float                     time;
	size_t                    memory;
	cudnnDeterminism_t        determinism;
	cudnnMathType_t           mathType;
	int                       reserved[3];
} cudnnConvolutionFwdAlgoPerf_t;

typedef enum {
	CUDNN_ACTIVATION_SIGMOID      = 0,
	CUDNN_ACTIVATION_RELU         = 1,
	CUDNN_ACTIVATION_TANH         = 2,
	CUDNN_ACTIVATION_CLIPPED_RELU = 3,
	CUDNN_ACTIVATION_ELU          = 4,
	CUDNN_ACTIVATION_IDENTITY     = 5,
	CUDNN_ACTIVATION_SWISH        = 6,
} cudnnActivationMode_t;

typedef enum {
	CUDNN_POOLING_MAX                           = 0,
	CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING = 1,
	CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING = 2,
	CUDNN_POOLING_MAX_DETERMINISTIC             = 3,
} cudnnPoolingMode_t;

typedef enum {
	CUDNN_SOFTMAX_FAST     = 0,
	CUDNN_SOFTMAX_ACCURATE = 1,
	CUDNN_SOFTMAX_LOG      = 2,
} cudnnSoftmaxAlgorithm_t;

typedef enum {
	CUDNN_SOFTMAX_MODE_INSTANCE = 0,
	CUDNN_SOFTMAX_MODE_CHANNEL  = 1,
} cudnnSoftmaxMode_t;

/* --- library, handle, stream */
size_t        cudnnGetVersion(void);
const char   *cudnnGetErrorString(cudnnStatus_t status);
cudnnStatus_t cudnnCreate(cudnnHandle_t *handle);
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle);
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId);
cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t *streamId);

/* --- tensor descriptors */
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *tensorDesc);
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t tensorDesc,
					 cudnnTensorFormat_t format,
					 cudnnDataType_t dataType,
					 int n, int c, int h, int w);
cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t tensorDesc,
					   cudnnDataType_t dataType,
					   int n, int c, int h, int w,
					   int nStride, int cStride, int hStride, int wStride);
cudnnStatus_t cudnnGetTensor4dDescriptor(const cudnnTensorDescriptor_t tensorDesc,
					 cudnnDataType_t *dataType,
					 int *n, int *c, int *h, int *w,
					 int *nStride, int *cStride, int *hStride, int *wStride);
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc);

/* --- filter descriptors */
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *filterDesc);
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t filterDesc,
					 cudnnDataType_t dataType,
					 cudnnTensorFormat_t format,
					 int k, int c, int h, int w);
cudnnStatus_t cudnnGetFilter4dDescriptor(const cudnnFilterDescriptor_t filterDesc,
					 cudnnDataType_t *dataType,
					 cudnnTensorFormat_t *format,
					 int *k, int *c, int *h, int *w);
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc);

/* --- convolution descriptors and forward convolution */
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *convDesc);
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t convDesc,
					      int pad_h, int pad_w, int u, int v,
					      int dilation_h, int dilation_w,
					      cudnnConvolutionMode_t mode,
					      cudnnDataType_t computeType);
cudnnStatus_t cudnnGetConvolution2dDescriptor(const cudnnConvolutionDescriptor_t convDesc,
					      int *pad_h, int *pad_w, int *u, int *v,
					      int *dilation_h, int *dilation_w,
					      cudnnConvolutionMode_t *mode,
					      cudnnDataType_t *computeType);
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc,
					    int groupCount);
cudnnStatus_t cudnnGetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc,
					    int *groupCount);
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc,
					  cudnnMathType_t mathType);
cudnnStatus_t cudnnGetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc,
					  cudnnMathType_t *mathType);
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc);
cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(const cudnnConvolutionDescriptor_t convDesc,
						    const cudnnTensorDescriptor_t inputTensorDesc,
						    const cudnnFilterDescriptor_t filterDesc,
						    int *n, int *c, int *h, int *w);
cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle,
						     const cudnnTensorDescriptor_t srcDesc,
						     const cudnnFilterDescriptor_t filterDesc,
						     const cudnnConvolutionDescriptor_t convDesc,
						     const cudnnTensorDescriptor_t destDesc,
						     const int requestedAlgoCount,
						     int *returnedAlgoCount,
						     cudnnConvolutionFwdAlgoPerf_t *perfResults);
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle,
						      const cudnnTensorDescriptor_t xDesc,
						      const cudnnFilterDescriptor_t wDesc,
						      const cudnnConvolutionDescriptor_t convDesc,
						      const cudnnTensorDescriptor_t yDesc,
						      cudnnConvolutionFwdAlgo_t algo,
						      size_t *sizeInBytes);
cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle,
				      const void *alpha,
				      const cudnnTensorDescriptor_t xDesc, const void *x,
				      const cudnnFilterDescriptor_t wDesc, const void *w,
				      const cudnnConvolutionDescriptor_t convDesc,
				      cudnnConvolutionFwdAlgo_t algo,
				      void *workSpace, size_t workSpaceSizeInBytes,
				      const void *beta,
				      const cudnnTensorDescriptor_t yDesc, void *y);

/* --- activation */
cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t *activationDesc);
cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t activationDesc,
					   cudnnActivationMode_t mode,
					   cudnnNanPropagation_t reluNanOpt,
					   double coef);
cudnnStatus_t cudnnGetActivationDescriptor(const cudnnActivationDescriptor_t activationDesc,
					   cudnnActivationMode_t *mode,
					   cudnnNanPropagation_t *reluNanOpt,
					   double *coef);
cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t activationDesc);
cudnnStatus_t cudnnActivationForward(cudnnHandle_t handle,
				     cudnnActivationDescriptor_t activationDesc,
				     const void *alpha,
				     const cudnnTensorDescriptor_t xDesc, const void *x,
				     const void *beta,
				     const cudnnTensorDescriptor_t yDesc, void *y);

/* --- pooling */
cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t *poolingDesc);
cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t poolingDesc,
					  cudnnPoolingMode_t mode,
					  cudnnNanPropagation_t maxpoolingNanOpt,
					  int windowHeight, int windowWidth,
					  int verticalPadding, int horizontalPadding,
					  int verticalStride, int horizontalStride);
cudnnStatus_t cudnnGetPooling2dDescriptor(const cudnnPoolingDescriptor_t poolingDesc,
					  cudnnPoolingMode_t *mode,
					  cudnnNanPropagation_t *maxpoolingNanOpt,
					  int *windowHeight, int *windowWidth,
					  int *verticalPadding, int *horizontalPadding,
					  int *verticalStride, int *horizontalStride);
cudnnStatus_t cudnnGetPooling2dForwardOutputDim(const cudnnPoolingDescriptor_t poolingDesc,
						const cudnnTensorDescriptor_t inputTensorDesc,
						int *n, int *c, int *h, int *w);
cudnnStatus_t cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t poolingDesc);
cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle,
				  const cudnnPoolingDescriptor_t poolingDesc,
				  const void *alpha,
				  const cudnnTensorDescriptor_t xDesc, const void *x,
				  const void *beta,
				  const cudnnTensorDescriptor_t yDesc, void *y);

/* --- softmax, add tensor */
cudnnStatus_t cudnnSoftmaxForward(cudnnHandle_t handle,
				  cudnnSoftmaxAlgorithm_t algo,
				  cudnnSoftmaxMode_t mode,
				  const void *alpha,
				  const cudnnTensorDescriptor_t xDesc, const void *x,
				  const void *beta,
				  const cudnnTensorDescriptor_t yDesc, void *y);
cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle,
			     const void *alpha,
			     const cudnnTensorDescriptor_t aDesc, const void *A,
			     const void *beta,
			     const cudnnTensorDescriptor_t cDesc, void *C);

/* ======================================================================
 * cuBLAS (CUDA 13: cublas_api.h, cublas_v2.h)
 * ====================================================================== */

typedef struct cublasContext *cublasHandle_t;

typedef enum {
	CUBLAS_STATUS_SUCCESS          = 0,
	CUBLAS_STATUS_NOT_INITIALIZED  = 1,
	CUBLAS_STATUS_ALLOC_FAILED     = 3,
	CUBLAS_STATUS_INVALID_VALUE    = 7,
	CUBLAS_STATUS_ARCH_MISMATCH    = 8,
	CUBLAS_STATUS_MAPPING_ERROR    = 11,
	CUBLAS_STATUS_EXECUTION_FAILED = 13,
	CUBLAS_STATUS_INTERNAL_ERROR   = 14,
	CUBLAS_STATUS_NOT_SUPPORTED    = 15,
	CUBLAS_STATUS_LICENSE_ERROR    = 16,
} cublasStatus_t;

typedef enum {
	CUBLAS_OP_N         = 0,
	CUBLAS_OP_T         = 1,
	CUBLAS_OP_C         = 2,
	CUBLAS_OP_HERMITAN  = 2,
	CUBLAS_OP_CONJG     = 3,
} cublasOperation_t;

typedef enum {
	CUBLAS_POINTER_MODE_HOST   = 0,
	CUBLAS_POINTER_MODE_DEVICE = 1,
} cublasPointerMode_t;

typedef enum {
	CUBLAS_DEFAULT_MATH                              = 0,
	CUBLAS_TENSOR_OP_MATH                            = 1,  /* deprecated */
	CUBLAS_PEDANTIC_MATH                             = 2,
	CUBLAS_TF32_TENSOR_OP_MATH                       = 3,
	CUBLAS_FP32_EMULATED_BF16X9_MATH                 = 4,
	CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16,
} cublasMath_t;

typedef enum {
	CUBLAS_COMPUTE_16F           = 64,
	CUBLAS_COMPUTE_16F_PEDANTIC  = 65,
	CUBLAS_COMPUTE_32F           = 68,
	CUBLAS_COMPUTE_32F_PEDANTIC  = 69,
	CUBLAS_COMPUTE_32F_FAST_16F  = 74,
	CUBLAS_COMPUTE_32F_FAST_16BF = 75,
	CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
	CUBLAS_COMPUTE_32F_EMULATED_16BFX9 = 78,
	CUBLAS_COMPUTE_64F           = 70,
	CUBLAS_COMPUTE_64F_PEDANTIC  = 71,
	CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT = 79,
	CUBLAS_COMPUTE_32I           = 72,
	CUBLAS_COMPUTE_32I_PEDANTIC  = 73,
} cublasComputeType_t;

typedef enum {
	CUBLAS_GEMM_DFALT             = -1,
	CUBLAS_GEMM_DEFAULT           = -1,
	CUBLAS_GEMM_ALGO0             = 0,
	CUBLAS_GEMM_ALGO1             = 1,
	CUBLAS_GEMM_ALGO2             = 2,
	CUBLAS_GEMM_ALGO3             = 3,
	CUBLAS_GEMM_ALGO4             = 4,
	CUBLAS_GEMM_ALGO5             = 5,
	CUBLAS_GEMM_ALGO6             = 6,
	CUBLAS_GEMM_ALGO7             = 7,
	CUBLAS_GEMM_ALGO8             = 8,
	CUBLAS_GEMM_ALGO9             = 9,
	CUBLAS_GEMM_ALGO10            = 10,
	CUBLAS_GEMM_ALGO11            = 11,
	CUBLAS_GEMM_ALGO12            = 12,
	CUBLAS_GEMM_ALGO13            = 13,
	CUBLAS_GEMM_ALGO14            = 14,
	CUBLAS_GEMM_ALGO15            = 15,
	CUBLAS_GEMM_ALGO16            = 16,
	CUBLAS_GEMM_ALGO17            = 17,
	CUBLAS_GEMM_ALGO18            = 18,
	CUBLAS_GEMM_ALGO19            = 19,
	CUBLAS_GEMM_ALGO20            = 20,
	CUBLAS_GEMM_ALGO21            = 21,
	CUBLAS_GEMM_ALGO22            = 22,
	CUBLAS_GEMM_ALGO23            = 23,
	CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99,
	CUBLAS_GEMM_DFALT_TENSOR_OP   = 99,
	CUBLAS_GEMM_ALGO0_TENSOR_OP   = 100,
	CUBLAS_GEMM_ALGO15_TENSOR_OP  = 115,
} cublasGemmAlgo_t;

/*
 * The real cublas_v2.h maps the plain names onto the _v2 entry points; the
 * libraries export only the _v2 names (and the un-suffixed batched ones).
 */
cublasStatus_t cublasCreate_v2(cublasHandle_t *handle);
cublasStatus_t cublasDestroy_v2(cublasHandle_t handle);
cublasStatus_t cublasGetVersion_v2(cublasHandle_t handle, int *version);
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId);
cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *streamId);
cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode);
cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t *mode);
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode);
cublasStatus_t cublasGetMathMode(cublasHandle_t handle, cublasMath_t *mode);
const char    *cublasGetStatusName(cublasStatus_t status);
const char    *cublasGetStatusString(cublasStatus_t status);

cublasStatus_t cublasSgemm_v2(cublasHandle_t handle,
			      cublasOperation_t transa, cublasOperation_t transb,
			      int m, int n, int k,
			      const float *alpha,
			      const float *A, int lda,
			      const float *B, int ldb,
			      const float *beta,
			      float *C, int ldc);
cublasStatus_t cublasGemmEx(cublasHandle_t handle,
			    cublasOperation_t transa, cublasOperation_t transb,
			    int m, int n, int k,
			    const void *alpha,
			    const void *A, cudaDataType Atype, int lda,
			    const void *B, cudaDataType Btype, int ldb,
			    const void *beta,
			    void *C, cudaDataType Ctype, int ldc,
			    cublasComputeType_t computeType,
			    cublasGemmAlgo_t algo);
cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle,
					 cublasOperation_t transa, cublasOperation_t transb,
					 int m, int n, int k,
					 const float *alpha,
					 const float *A, int lda, long long int strideA,
					 const float *B, int ldb, long long int strideB,
					 const float *beta,
					 float *C, int ldc, long long int strideC,
					 int batchCount);

#define cublasCreate          cublasCreate_v2
#define cublasDestroy         cublasDestroy_v2
#define cublasGetVersion      cublasGetVersion_v2
#define cublasSetStream       cublasSetStream_v2
#define cublasGetStream       cublasGetStream_v2
#define cublasSetPointerMode  cublasSetPointerMode_v2
#define cublasGetPointerMode  cublasGetPointerMode_v2
#define cublasSgemm           cublasSgemm_v2

#ifdef __cplusplus
}
#endif

#endif
