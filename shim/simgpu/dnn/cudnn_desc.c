/*
 * cudnn_desc.c - simgpu's CPU cuDNN: library and handle functions, and the
 * descriptors (tensor, filter, convolution, activation, pooling) with
 * their output-dimension helpers.  Pure host code: nothing here touches
 * the device.
 *
 * Descriptors accept every data type and format cuDNN accepts; the
 * operations then refuse (CUDNN_STATUS_NOT_SUPPORTED) what this CPU
 * version does not compute, so a program learns it at the call that
 * matters, as with the real library's per-operation support matrix.
 */
#include <stdlib.h>

#include "dnn_impl.h"

/* ---- library and handle ---------------------------------------------- */

SGPU_EXPORT size_t cudnnGetVersion(void)
{
	return COLOCATE_DNN_CUDNN_VERSION;
}

SGPU_EXPORT const char *cudnnGetErrorString(cudnnStatus_t status)
{
	switch (status) {
#define S(x) case x: return #x;
	S(CUDNN_STATUS_SUCCESS)
	S(CUDNN_STATUS_NOT_INITIALIZED)
	S(CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH)
	S(CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH)
	S(CUDNN_STATUS_DEPRECATED)
	S(CUDNN_STATUS_LICENSE_ERROR)
	S(CUDNN_STATUS_RUNTIME_IN_PROGRESS)
	S(CUDNN_STATUS_RUNTIME_FP_OVERFLOW)
	S(CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED)
	S(CUDNN_STATUS_BAD_PARAM)
	S(CUDNN_STATUS_INVALID_VALUE)
	S(CUDNN_STATUS_BAD_PARAM_NULL_POINTER)
	S(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER)
	S(CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED)
	S(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND)
	S(CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT)
	S(CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH)
	S(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH)
	S(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES)
	S(CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE)
	S(CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH)
	S(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE)
	S(CUDNN_STATUS_NOT_SUPPORTED)
	S(CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN)
	S(CUDNN_STATUS_NOT_SUPPORTED_SHAPE)
	S(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE)
	S(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT)
	S(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER)
	S(CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART)
	S(CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH)
	S(CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING)
	S(CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE)
	S(CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT)
	S(CUDNN_STATUS_NOT_SUPPORTED_PADDING)
	S(CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM)
	S(CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API)
	S(CUDNN_STATUS_INTERNAL_ERROR)
	S(CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED)
	S(CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE)
	S(CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED)
	S(CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED)
	S(CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM)
	S(CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED)
	S(CUDNN_STATUS_EXECUTION_FAILED)
	S(CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER)
	S(CUDNN_STATUS_EXECUTION_FAILED_CUBLAS)
	S(CUDNN_STATUS_EXECUTION_FAILED_CUDART)
	S(CUDNN_STATUS_EXECUTION_FAILED_CURAND)
#undef S
	}
	return "CUDNN_STATUS_UNKNOWN";
}

SGPU_EXPORT cudnnStatus_t cudnnCreate(cudnnHandle_t *handle)
{
	cudnnHandle_t h;

	if (!handle)
		return CUDNN_STATUS_BAD_PARAM;
	h = calloc(1, sizeof(*h));
	if (!h)
		return CUDNN_STATUS_ALLOC_FAILED;
	h->magic = SGPU_MAGIC_HANDLE;
	*handle = h;
	return CUDNN_STATUS_SUCCESS;
}

/* Queued work holds its own copy of every argument: freeing is safe. */
SGPU_EXPORT cudnnStatus_t cudnnDestroy(cudnnHandle_t handle)
{
	if (sgpu_check_handle(handle) != CUDNN_STATUS_SUCCESS)
		return CUDNN_STATUS_BAD_PARAM;
	handle->magic = 0;
	free(handle);
	return CUDNN_STATUS_SUCCESS;
}

SGPU_EXPORT cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId)
{
	if (sgpu_check_handle(handle) != CUDNN_STATUS_SUCCESS)
		return CUDNN_STATUS_BAD_PARAM;
	handle->stream = streamId;
	return CUDNN_STATUS_SUCCESS;
}

SGPU_EXPORT cudnnStatus_t cudnnGetStream(cudnnHandle_t handle, cudaStream_t *streamId)
{
	if (sgpu_check_handle(handle) != CUDNN_STATUS_SUCCESS || !streamId)
		return CUDNN_STATUS_BAD_PARAM;
	*streamId = handle->stream;
	return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t sgpu_check_handle(cudnnHandle_t h)
{
	return h && h->magic == SGPU_MAGIC_HANDLE ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_BAD_PARAM;
}

cudnnStatus_t sgpu_scale(const void *p, float *out)
{
	if (!p)
		return CUDNN_STATUS_BAD_PARAM;
	*out = *(const float *)p;     /* float tensors take float scale factors */
	return CUDNN_STATUS_SUCCESS;
}

/* ---- one create/destroy pair per descriptor kind ---------------------- */

#define DESC_LIFE(Name, type, MAGIC)                                          \
	SGPU_EXPORT cudnnStatus_t cudnnCreate##Name##Descriptor(type *d)      \
	{                                                                     \
		type p;                                                       \
		if (!d)                                                       \
			return CUDNN_STATUS_BAD_PARAM;                        \
		p = calloc(1, sizeof(*p));                                    \
		if (!p)                                                       \
			return CUDNN_STATUS_ALLOC_FAILED;                     \
		p->magic = MAGIC;                                             \
		*d = p;                                                       \
		return CUDNN_STATUS_SUCCESS;                                  \
	}                                                                     \
	SGPU_EXPORT cudnnStatus_t cudnnDestroy##Name##Descriptor(type d)      \
	{                                                                     \
		if (!d)                                                       \
			return CUDNN_STATUS_SUCCESS;   /* as cuDNN: a no-op */ \
		if (d->magic != MAGIC)                                        \
			return CUDNN_STATUS_BAD_PARAM;                        \
		d->magic = 0;                                                 \
		free(d);                                                      \
		return CUDNN_STATUS_SUCCESS;                                  \
	}

DESC_LIFE(Tensor, cudnnTensorDescriptor_t, SGPU_MAGIC_TENSOR)
DESC_LIFE(Filter, cudnnFilterDescriptor_t, SGPU_MAGIC_FILTER)
DESC_LIFE(Convolution, cudnnConvolutionDescriptor_t, SGPU_MAGIC_CONV)
DESC_LIFE(Activation, cudnnActivationDescriptor_t, SGPU_MAGIC_ACT)
DESC_LIFE(Pooling, cudnnPoolingDescriptor_t, SGPU_MAGIC_POOL)

static int valid_dtype(cudnnDataType_t t)
{
	return (unsigned)t <= CUDNN_DATA_FAST_FLOAT_FOR_FP8;
}

/* ---- tensors ------------------------------------------------------------ */

SGPU_EXPORT cudnnStatus_t cudnnSetTensor4dDescriptorEx(cudnnTensorDescriptor_t d,
						       cudnnDataType_t dataType, int n, int c,
						       int h, int w, int nStride, int cStride,
						       int hStride, int wStride)
{
	if (!d || d->magic != SGPU_MAGIC_TENSOR || !valid_dtype(dataType))
		return CUDNN_STATUS_BAD_PARAM;
	if (n <= 0 || c <= 0 || h <= 0 || w <= 0 || nStride <= 0 || cStride <= 0 ||
	    hStride <= 0 || wStride <= 0)
		return CUDNN_STATUS_BAD_PARAM;
	d->dtype = dataType;
	d->t = (struct sgpu_tensor){ n, c, h, w, nStride, cStride, hStride, wStride };
	d->set = 1;
	return CUDNN_STATUS_SUCCESS;
}

SGPU_EXPORT cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d,
						     cudnnTensorFormat_t format,
						     cudnnDataType_t dataType, int n, int c, int h,
						     int w)
{
	if (!d || d->magic != SGPU_MAGIC_TENSOR)
		return CUDNN_STATUS_BAD_PARAM;
	if (n <= 0 || c <= 0 || h <= 0 || w <= 0)
		return CUDNN_STATUS_BAD_PARAM;
	/* strides in int, as the API's: refuse what would overflow them */
	if ((long long)n * c * h * w > 0x7fffffffLL)
		return CUDNN_STATUS_NOT_SUPPORTED;
	switch (format) {
	case CUDNN_TENSOR_NCHW:
		return cudnnSetTensor4dDescriptorEx(d, dataType, n, c, h, w, c * h * w, h * w, w, 1);
	case CUDNN_TENSOR_NHWC:
		return cudnnSetTensor4dDescriptorEx(d, dataType, n, c, h, w, c * h * w, 1, w * c, c);
	case CUDNN_TENSOR_NCHW_VECT_C:
		return CUDNN_STATUS_NOT_SUPPORTED;
	}
	return CUDNN_STATUS_BAD_PARAM;
}

SGPU_EXPORT cudnnStatus_t cudnnGetTensor4dDescriptor(const cudnnTensorDescriptor_t d,
						     cudnnDataType_t *dataType, int *n, int *c,
						     int *h, int *w, int *nStride, int *cStride,
						     int *hStride, int *wStride)
{
	if (sgpu_check_tensor(d) == CUDNN_STATUS_BAD_PARAM)
		return CUDNN_STATUS_BAD_PARAM;
	if (!dataType || !n || !c || !h || !w || !nStride || !cStride || !hStride || !wStride)
		return CUDNN_STATUS_BAD_PARAM;
	*dataType = d->dtype;
	*n = d->t.n, *c = d->t.c, *h = d->t.h, *w = d->t.w;
	*nStride = d->t.ns, *cStride = d->t.cs, *hStride = d->t.hs, *wStride = d->t.ws;
	return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t sgpu_check_tensor(const struct cudnnTensorStruct *t)
{
	if (!t || t->magic != SGPU_MAGIC_TENSOR || !t->set)
		return CUDNN_STATUS_BAD_PARAM;
	return t->dtype == CUDNN_DATA_FLOAT ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED;
}

/* ---- filters ------------------------------------------------------------ */

SGPU_EXPORT cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d,
						     cudnnDataType_t dataType,
						     cudnnTensorFormat_t format, int k, int c,
						     int h, int w)
{
	if (!d || d->magic != SGPU_MAGIC_FILTER || !valid_dtype(dataType))
		return CUDNN_STATUS_BAD_PARAM;
	if (k <= 0 || c <= 0 || h <= 0 || w <= 0 || (unsigned)format > CUDNN_TENSOR_NCHW_VECT_C)
		return CUDNN_STATUS_BAD_PARAM;
	if ((long long)k * c * h * w > 0x7fffffffLL)
		return CUDNN_STATUS_NOT_SUPPORTED;
	d->dtype = dataType;
	d->format = format;
	d->k = k, d->c = c, d->r = h, d->s = w;
	d->set = 1;
	return CUDNN_STATUS_SUCCESS;
}

SGPU_EXPORT cudnnStatus_t cudnnGetFilter4dDescriptor(const cudnnFilterDescriptor_t d,
						     cudnnDataType_t *dataType,
						     cudnnTensorFormat_t *format, int *k, int *c,
						     int *h, int *w)
{
	if (!d || d->magic != SGPU_MAGIC_FILTER || !d->set)
		return CUDNN_STATUS_BAD_PARAM;
	if (!dataType || !format || !k || !c || !h || !w)
		return CUDNN_STATUS_BAD_PARAM;
	*dataType = d->dtype, *format = d->format;
	*k = d->k, *c = d->c, *h = d->r, *w = d->s;
	return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t sgpu_check_filter(const struct cudnnFilterStruct *f)
{
	if (!f || f->magic != SGPU_MAGIC_FILTER || !f->set)
		return CUDNN_STATUS_BAD_PARAM;
	return f->dtype == CUDNN_DATA_FLOAT && f->format == CUDNN_TENSOR_NCHW
		       ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED;
}

/* ---- convolutions ------------------------------------------------------- */

SGPU_EXPORT cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d,
							  int pad_h, int pad_w, int u, int v,
							  int dilation_h, int dilation_w,
							  cudnnConvolutionMode_t mode,
							  cudnnDataType_t computeType)
{
	if (!d || d->magic != SGPU_MAGIC_CONV || !valid_dtype(computeType))
		return CUDNN_STATUS_BAD_PARAM;
	if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0 ||
	    (mode != CUDNN_CONVOLUTION && mode != CUDNN_CROSS_CORRELATION))
		return CUDNN_STATUS_BAD_PARAM;
	d->pad_h = pad_h, d->pad_w = pad_w, d->u = u, d->v = v;
	d->dil_h = dilation_h, d->dil_w = dilation_w;
	d->mode = mode, d->compute = computeType;
	if (!d->groups)
		d->groups = 1;
	d->set = 1;
	return CUDNN_STATUS_SUCCESS;
}

SGPU_EXPORT cudnnStatus_t cudnnGetConvolution2dDescriptor(const cudnnConvolutionDescriptor_t d,
							  int *pad_h, int *pad_w, int *u, int *v,
							  int *dilation_h, int *dilation_w,
							  cudnnConvolutionMode_t *mode,
							  cudnnDataType_t *computeType)
{
	if (!d || d->magic != SGPU_MAGIC_CONV || !d->set)
		return CUDNN_STATUS_BAD_PARAM;
	if (!pad_h || !pad_w || !u || !v || !dilation_h || !dilation_w || !mode || !computeType)
		return CUDNN_STATUS_BAD_PARAM;
	*pad_h = d->pad_h, *pad_w = d->pad_w, *u = d->u, *v = d->v;
	*dilation_h = d->dil_h, *dilation_w = d->dil_w;
	*mode = d->mode, *computeType = d->compute;
	return CUDNN_STATUS_SUCCESS;
}

SGPU_EXPORT cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t d,
							int groupCount)
{
	if (!d || d->magic != SGPU_MAGIC_CONV || groupCount <= 0)
		return CUDNN_STATUS_BAD_PARAM;
	d->groups = groupCount;
	return CUDNN_STATUS_SUCCESS;
}

SGPU_EXPORT cudnnStatus_t cudnnGetConvolutionGroupCount(cudnnConvolutionDescriptor_t d,
							int *groupCount)
{
	if (!d || d->magic != SGPU_MAGIC_CONV || !groupCount)
		return CUDNN_STATUS_BAD_PARAM;
	*groupCount = d->groups ? d->groups : 1;
	return CUDNN_STATUS_SUCCESS;
}

SGPU_EXPORT cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d,
						      cudnnMathType_t mathType)
{
	if (!d || d->magic != SGPU_MAGIC_CONV || (unsigned)mathType > CUDNN_FMA_MATH)
		return CUDNN_STATUS_BAD_PARAM;
	d->math = mathType;
	return CUDNN_STATUS_SUCCESS;
}

SGPU_EXPORT cudnnStatus_t cudnnGetConvolutionMathType(cudnnConvolutionDescriptor_t d,
						      cudnnMathType_t *mathType)
{
	if (!d || d->magic != SGPU_MAGIC_CONV || !mathType)
		return CUDNN_STATUS_BAD_PARAM;
	*mathType = d->math;
	return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t sgpu_check_conv(const struct cudnnConvolutionStruct *c)
{
	if (!c || c->magic != SGPU_MAGIC_CONV || !c->set)
		return CUDNN_STATUS_BAD_PARAM;
	return c->compute == CUDNN_DATA_FLOAT ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_NOT_SUPPORTED;
}

/* out = 1 + (in + 2 pad - ((filter - 1) dilation + 1)) / stride */
cudnnStatus_t sgpu_conv_out(const struct cudnnConvolutionStruct *cv,
			    const struct cudnnTensorStruct *x, const struct cudnnFilterStruct *f,
			    int *n, int *c, int *h, int *w)
{
	int groups = cv->groups ? cv->groups : 1;
	long long eh = (long long)(f->r - 1) * cv->dil_h + 1, ew = (long long)(f->s - 1) * cv->dil_w + 1;
	long long ih = (long long)x->t.h + 2LL * cv->pad_h, iw = (long long)x->t.w + 2LL * cv->pad_w;

	if (x->t.c != f->c * groups || f->k % groups != 0 || eh > ih || ew > iw)
		return CUDNN_STATUS_BAD_PARAM;
	*n = x->t.n;
	*c = f->k;
	*h = (int)(1 + (ih - eh) / cv->u);
	*w = (int)(1 + (iw - ew) / cv->v);
	return CUDNN_STATUS_SUCCESS;
}

SGPU_EXPORT cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(
	const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t inputTensorDesc,
	const cudnnFilterDescriptor_t filterDesc, int *n, int *c, int *h, int *w)
{
	/* dims only: any data type will do */
	if (!convDesc || convDesc->magic != SGPU_MAGIC_CONV || !convDesc->set ||
	    !inputTensorDesc || inputTensorDesc->magic != SGPU_MAGIC_TENSOR ||
	    !inputTensorDesc->set || !filterDesc || filterDesc->magic != SGPU_MAGIC_FILTER ||
	    !filterDesc->set || !n || !c || !h || !w)
		return CUDNN_STATUS_BAD_PARAM;
	return sgpu_conv_out(convDesc, inputTensorDesc, filterDesc, n, c, h, w);
}

/* ---- activation --------------------------------------------------------- */

SGPU_EXPORT cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t d,
						       cudnnActivationMode_t mode,
						       cudnnNanPropagation_t reluNanOpt,
						       double coef)
{
	if (!d || d->magic != SGPU_MAGIC_ACT || (unsigned)mode > CUDNN_ACTIVATION_SWISH ||
	    (unsigned)reluNanOpt > CUDNN_PROPAGATE_NAN)
		return CUDNN_STATUS_BAD_PARAM;
	d->mode = mode, d->nan = reluNanOpt, d->coef = coef;
	d->set = 1;
	return CUDNN_STATUS_SUCCESS;
}

SGPU_EXPORT cudnnStatus_t cudnnGetActivationDescriptor(const cudnnActivationDescriptor_t d,
						       cudnnActivationMode_t *mode,
						       cudnnNanPropagation_t *reluNanOpt,
						       double *coef)
{
	if (!d || d->magic != SGPU_MAGIC_ACT || !d->set || !mode || !reluNanOpt || !coef)
		return CUDNN_STATUS_BAD_PARAM;
	*mode = d->mode, *reluNanOpt = d->nan, *coef = d->coef;
	return CUDNN_STATUS_SUCCESS;
}

/* ---- pooling ------------------------------------------------------------ */

SGPU_EXPORT cudnnStatus_t cudnnSetPooling2dDescriptor(cudnnPoolingDescriptor_t d,
						      cudnnPoolingMode_t mode,
						      cudnnNanPropagation_t maxpoolingNanOpt,
						      int windowHeight, int windowWidth,
						      int verticalPadding, int horizontalPadding,
						      int verticalStride, int horizontalStride)
{
	if (!d || d->magic != SGPU_MAGIC_POOL || (unsigned)mode > CUDNN_POOLING_MAX_DETERMINISTIC ||
	    (unsigned)maxpoolingNanOpt > CUDNN_PROPAGATE_NAN)
		return CUDNN_STATUS_BAD_PARAM;
	if (windowHeight <= 0 || windowWidth <= 0 || verticalPadding < 0 || horizontalPadding < 0 ||
	    verticalStride <= 0 || horizontalStride <= 0)
		return CUDNN_STATUS_BAD_PARAM;
	d->mode = mode, d->nan = maxpoolingNanOpt;
	d->win_h = windowHeight, d->win_w = windowWidth;
	d->pad_h = verticalPadding, d->pad_w = horizontalPadding;
	d->u = verticalStride, d->v = horizontalStride;
	d->set = 1;
	return CUDNN_STATUS_SUCCESS;
}

SGPU_EXPORT cudnnStatus_t cudnnGetPooling2dDescriptor(const cudnnPoolingDescriptor_t d,
						      cudnnPoolingMode_t *mode,
						      cudnnNanPropagation_t *maxpoolingNanOpt,
						      int *windowHeight, int *windowWidth,
						      int *verticalPadding, int *horizontalPadding,
						      int *verticalStride, int *horizontalStride)
{
	if (!d || d->magic != SGPU_MAGIC_POOL || !d->set || !mode || !maxpoolingNanOpt ||
	    !windowHeight || !windowWidth || !verticalPadding || !horizontalPadding ||
	    !verticalStride || !horizontalStride)
		return CUDNN_STATUS_BAD_PARAM;
	*mode = d->mode, *maxpoolingNanOpt = d->nan;
	*windowHeight = d->win_h, *windowWidth = d->win_w;
	*verticalPadding = d->pad_h, *horizontalPadding = d->pad_w;
	*verticalStride = d->u, *horizontalStride = d->v;
	return CUDNN_STATUS_SUCCESS;
}

/* out = 1 + (in + 2 pad - window) / stride */
SGPU_EXPORT cudnnStatus_t cudnnGetPooling2dForwardOutputDim(const cudnnPoolingDescriptor_t d,
							    const cudnnTensorDescriptor_t x,
							    int *n, int *c, int *h, int *w)
{
	int ih, iw;

	if (!d || d->magic != SGPU_MAGIC_POOL || !d->set || !x || x->magic != SGPU_MAGIC_TENSOR ||
	    !x->set || !n || !c || !h || !w)
		return CUDNN_STATUS_BAD_PARAM;
	ih = x->t.h + 2 * d->pad_h, iw = x->t.w + 2 * d->pad_w;
	if (d->win_h > ih || d->win_w > iw)
		return CUDNN_STATUS_BAD_PARAM;
	*n = x->t.n, *c = x->t.c;
	*h = 1 + (ih - d->win_h) / d->u;
	*w = 1 + (iw - d->win_w) / d->v;
	return CUDNN_STATUS_SUCCESS;
}
