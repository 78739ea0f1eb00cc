/*
 * array.c - CUDA arrays (cudaMallocArray, cudaMalloc3DArray, ...) and the
 * strided copies and fills: cudaMemcpy{,2D}{To,From}Array, the array to
 * array copies, cudaMemcpy3D, cudaMemset2D and cudaMemset3D.
 *
 * Layout and lifetime of an array: texture.h.
 *
 * Every strided copy or fill is one operation in its stream, so it is
 * ordered with kernels and other copies exactly like copy.c's: it runs on
 * the stream's executor as a host-function operation (SG_OP_HOST) whose
 * function moves the rows.  Synchronous copies wait for that operation;
 * asynchronous ones follow copy.c's pageable-memory rules (a pageable
 * source is snapshotted at enqueue, a pageable destination is waited for).
 * It takes no modelled device time: exec.c models PCIe and DRAM time only
 * for its own contiguous SG_OP_COPY / SG_OP_MEMSET (a strided operation
 * kind there, timed by its bytes and direction, would fix that).
 *
 * Everything is checked before anything is queued: array bounds, device
 * ranges of linear memory, pitches, directions.  A bad argument is an
 * error code, never a crash; an unknown array handle is
 * cudaErrorInvalidValue, the code these calls document.
 */
#include <stdlib.h>
#include <string.h>

#include "simgpu_impl.h"
#include "texture.h"

/* H100-class limits (cudaDeviceProp::maxTexture1D/2D/3D). */
#define MAX_1D  131072
#define MAX_2DW 131072
#define MAX_2DH 65536
#define MAX_3D  16384

/* Live handles: the set validates them, the list finds them all (reset);
 * both change under arrays_mu only. */
static struct sg_hset arrays = SG_HSET_INIT;
static struct sg_array *all_arrays;
static pthread_mutex_t arrays_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---------------------------------------------------------------- formats */

int sg_fmt_of(const struct cudaChannelFormatDesc *d, struct sg_fmt *f)
{
	static const struct sg_fmt norm[] = {    /* kinds 5 .. 16 */
		{ 1, 8, SG_FK_UNSIGNED, 1 },  { 2, 8, SG_FK_UNSIGNED, 1 },
		{ 4, 8, SG_FK_UNSIGNED, 1 },  { 1, 16, SG_FK_UNSIGNED, 1 },
		{ 2, 16, SG_FK_UNSIGNED, 1 }, { 4, 16, SG_FK_UNSIGNED, 1 },
		{ 1, 8, SG_FK_SIGNED, 1 },    { 2, 8, SG_FK_SIGNED, 1 },
		{ 4, 8, SG_FK_SIGNED, 1 },    { 1, 16, SG_FK_SIGNED, 1 },
		{ 2, 16, SG_FK_SIGNED, 1 },   { 4, 16, SG_FK_SIGNED, 1 },
	};
	int b = d->x;

	if (d->f >= cudaChannelFormatKindUnsignedNormalized8X1 &&
	    d->f <= cudaChannelFormatKindSignedNormalized16X4) {
		*f = norm[d->f - cudaChannelFormatKindUnsignedNormalized8X1];
		return 0;
	}
	if (d->f != cudaChannelFormatKindSigned && d->f != cudaChannelFormatKindUnsigned &&
	    d->f != cudaChannelFormatKindFloat)
		return -1;    /* None, NV12, block-compressed, 10-10-10-2 */
	if (b != 8 && b != 16 && b != 32)
		return -1;
	if (d->f == cudaChannelFormatKindFloat && b == 8)
		return -1;
	/* channels fill x, y, z, w in order, all of one size; no 3-channel */
	if (d->y == 0 && d->z == 0 && d->w == 0)
		f->nch = 1;
	else if (d->y == b && d->z == 0 && d->w == 0)
		f->nch = 2;
	else if (d->y == b && d->z == b && d->w == b)
		f->nch = 4;
	else
		return -1;
	f->bits = b;
	f->kind = d->f == cudaChannelFormatKindSigned ? SG_FK_SIGNED :
		  d->f == cudaChannelFormatKindUnsigned ? SG_FK_UNSIGNED : SG_FK_FLOAT;
	f->norm = 0;
	return 0;
}

SG_API struct cudaChannelFormatDesc cudaCreateChannelDesc(int x, int y, int z, int w,
							  enum cudaChannelFormatKind f)
{
	struct cudaChannelFormatDesc d = { x, y, z, w, f };

	return d;
}

/* ---------------------------------------------------------------- arrays */

struct sg_array *sg_array_get(cudaArray_const_t h)
{
	struct sg_array *a = NULL;

	if (!h)
		return NULL;
	pthread_mutex_lock(&arrays_mu);
	if (sg_hset_has(&arrays, h)) {
		a = (struct sg_array *)h;
		atomic_fetch_add(&a->refs, 1);
	}
	pthread_mutex_unlock(&arrays_mu);
	return a;
}

void sg_array_put(struct sg_array *a)
{
	if (!a || atomic_fetch_sub(&a->refs, 1) != 1)
		return;
	if (sg_arena_free(a->data) != cudaSuccess)
		sg_log("array storage %p was not the arena's", (void *)a->data);
	free(a);
}

/* Extents CUDA accepts: (w), (w, h) or (w, h, d), each within limits. */
static int extent_ok(struct cudaExtent e)
{
	if (e.width == 0 || (e.height == 0 && e.depth != 0))
		return 0;
	if (e.depth)
		return e.width <= MAX_3D && e.height <= MAX_3D && e.depth <= MAX_3D;
	if (e.height)
		return e.width <= MAX_2DW && e.height <= MAX_2DH;
	return e.width <= MAX_1D;
}

static cudaError_t array_new(cudaArray_t *out, const struct cudaChannelFormatDesc *desc,
			     struct cudaExtent e, unsigned flags)
{
	const unsigned known = cudaArraySurfaceLoadStore | cudaArrayTextureGather;
	struct sg_array *a;
	cudaError_t rc;
	size_t n;

	sg_init();
	if (!out || !desc)
		return sg_err(cudaErrorInvalidValue);
	if (flags & (cudaArrayLayered | cudaArrayCubemap | cudaArraySparse |
		     cudaArrayDeferredMapping)) {
		sg_log("cudaMalloc3DArray: layered, cubemap, sparse and deferred-mapping "
		       "arrays are not modelled (flags %#x)", flags);
		return sg_err(cudaErrorNotSupported);
	}
	if ((flags & ~known) || !extent_ok(e))
		return sg_err(cudaErrorInvalidValue);
	a = calloc(1, sizeof(*a));
	if (!a)
		return sg_err(cudaErrorMemoryAllocation);
	if (sg_fmt_of(desc, &a->fmt) < 0) {
		free(a);
		return sg_err(cudaErrorInvalidValue);
	}
	a->desc = *desc;
	a->w = e.width;
	a->h = e.height;
	a->d = e.depth;
	a->es = sg_fmt_size(&a->fmt);
	a->pitch = a->w * a->es;
	a->slice = a->pitch * (a->h ? a->h : 1);
	a->flags = flags;
	n = a->slice * (a->d ? a->d : 1);     /* at most 16384^3 * 16: no overflow */
	atomic_init(&a->refs, 1);
	rc = sg_arena_alloc(n, SG_MEM_DEVICE, (void **)&a->data);
	if (rc != cudaSuccess) {
		free(a);
		return sg_err(rc);
	}
	pthread_mutex_lock(&arrays_mu);
	if (sg_hset_add(&arrays, a) < 0) {
		pthread_mutex_unlock(&arrays_mu);
		sg_array_put(a);
		return sg_err(cudaErrorMemoryAllocation);
	}
	a->next = all_arrays;
	all_arrays = a;
	pthread_mutex_unlock(&arrays_mu);
	*out = (cudaArray_t)a;
	return cudaSuccess;
}

SG_API cudaError_t cudaMallocArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
				   size_t width, size_t height, unsigned int flags)
{
	struct cudaExtent e = { width, height, 0 };

	return array_new(array, desc, e, flags);
}

SG_API cudaError_t cudaMalloc3DArray(cudaArray_t *array, const struct cudaChannelFormatDesc *desc,
				     struct cudaExtent extent, unsigned int flags)
{
	return array_new(array, desc, extent, flags);
}

/* Take a live handle off the set and the list; arrays_mu held. */
static void unlink_locked(struct sg_array *a)
{
	struct sg_array **pp;

	sg_hset_del(&arrays, a);
	for (pp = &all_arrays; *pp; pp = &(*pp)->next)
		if (*pp == a) {
			*pp = a->next;
			break;
		}
}

void sg_arrays_reset(void)
{
	struct sg_array *a, *next;

	pthread_mutex_lock(&arrays_mu);
	a = all_arrays;
	all_arrays = NULL;
	for (next = a; next; next = next->next)
		sg_hset_del(&arrays, next);
	pthread_mutex_unlock(&arrays_mu);
	for (; a; a = next) {
		next = a->next;
		sg_array_put(a);
	}
}

SG_API cudaError_t cudaFreeArray(cudaArray_t array)
{
	struct sg_array *a = NULL;

	sg_init();
	if (!array)
		return cudaSuccess;        /* as cudaFree(NULL) */
	pthread_mutex_lock(&arrays_mu);
	if (sg_hset_has(&arrays, array)) {
		a = (struct sg_array *)array;
		unlink_locked(a);
	}
	pthread_mutex_unlock(&arrays_mu);
	if (!a)
		return sg_err(cudaErrorInvalidValue);
	sg_array_put(a);      /* queued copies and textures keep their own */
	return cudaSuccess;
}

SG_API cudaError_t cudaArrayGetInfo(struct cudaChannelFormatDesc *desc, struct cudaExtent *extent,
				    unsigned int *flags, cudaArray_t array)
{
	struct sg_array *a;

	sg_init();
	a = sg_array_get(array);
	if (!a)
		return sg_err(cudaErrorInvalidValue);
	if (desc)
		*desc = a->desc;
	if (extent) {
		extent->width = a->w;
		extent->height = a->h;
		extent->depth = a->d;
	}
	if (flags)
		*flags = a->flags;
	sg_array_put(a);
	return cudaSuccess;
}

SG_API cudaError_t cudaGetChannelDesc(struct cudaChannelFormatDesc *desc, cudaArray_const_t array)
{
	struct sg_array *a;

	sg_init();
	if (!desc)
		return sg_err(cudaErrorInvalidValue);
	a = sg_array_get(array);
	if (!a)
		return sg_err(cudaErrorInvalidValue);
	*desc = a->desc;
	sg_array_put(a);
	return cudaSuccess;
}

/* ---------------------------------------------------------------- strided transfers */

/*
 * One strided copy or fill: d slices of h rows of w bytes.  A side is
 * either an array (ref holds it) or linear memory, device (dev) or host.
 */
struct side {
	char            *p;          /* first byte */
	size_t           pitch, slice;
	int              dev;
	struct sg_array *arr;        /* reference owned by the transfer */
};

struct xfer {
	struct side dst, src;
	size_t      w, h, d;
	int         set, val;        /* a fill of val, no source */
	void       *owned;           /* snapshot of a pageable source */
};

static size_t span(size_t pitch, size_t slice, size_t w, size_t h, size_t d)
{
	return (d - 1) * slice + (h - 1) * pitch + w;
}

static void side_release(struct side *s)
{
	sg_array_put(s->arr);
	s->arr = NULL;
}

static void xfer_free(struct xfer *x)
{
	side_release(&x->dst);
	side_release(&x->src);
	free(x->owned);
	free(x);
}

static void xfer_move(void *arg)
{
	struct xfer *x = arg;
	size_t z, y;

	for (z = 0; z < x->d; z++)
		for (y = 0; y < x->h; y++) {
			char *d = x->dst.p + z * x->dst.slice + y * x->dst.pitch;

			if (x->set)
				memset(d, x->val, x->w);
			else
				memmove(d, x->src.p + z * x->src.slice + y * x->src.pitch, x->w);
		}
}

/* The stream operation: move the data, then let go of the arrays. */
static void xfer_run(void *arg)
{
	struct xfer *x = arg;

	if (sg_protected_call(xfer_move, x) < 0) {
		sg_log("strided %s of %zu x %zu x %zu bytes faulted", x->set ? "memset" : "copy",
		       x->w, x->h, x->d);
		sg_async_error(cudaErrorIllegalAddress, 1);
	}
	xfer_free(x);
}

/* Replace a pageable host source by a packed copy taken now. */
static int snapshot(struct xfer *x)
{
	char *buf = malloc(x->w * x->h * x->d);
	size_t z, y;

	if (!buf)
		return -1;
	for (z = 0; z < x->d; z++)
		for (y = 0; y < x->h; y++)
			memcpy(buf + (z * x->h + y) * x->w,
			       x->src.p + z * x->src.slice + y * x->src.pitch, x->w);
	x->owned = buf;
	x->src.p = buf;
	x->src.pitch = x->w;
	x->src.slice = x->w * x->h;
	return 0;
}

/*
 * Queue x on its stream (and wait when the call is synchronous or the
 * destination is pageable).  Takes x whatever happens.
 */
static cudaError_t submit(struct xfer *x, cudaStream_t stream, int ptsz, int async)
{
	struct sg_stream *s;
	struct sg_op *op;
	uint64_t seq;
	int wait = !async;

	if (x->w == 0 || x->h == 0 || x->d == 0) {
		xfer_free(x);
		return cudaSuccess;
	}
	s = sg_stream_resolve(stream, ptsz);
	if (!s) {
		xfer_free(x);
		return sg_err(cudaErrorInvalidResourceHandle);
	}
	if (async && !x->set && !x->src.dev &&
	    !sg_is_pinned(x->src.p, span(x->src.pitch, x->src.slice, x->w, x->h, x->d)) &&
	    snapshot(x) < 0)
		wait = 1;
	if (async && !x->dst.dev &&
	    !sg_is_pinned(x->dst.p, span(x->dst.pitch, x->dst.slice, x->w, x->h, x->d)))
		wait = 1;
	op = sg_op_new(SG_OP_HOST, 0);
	if (!op) {
		xfer_free(x);
		return sg_err(cudaErrorMemoryAllocation);
	}
	op->u.host.fn = xfer_run;
	op->u.host.data = x;
	seq = sg_enqueue(s, op);
	if (!wait)
		return cudaSuccess;
	sg_stream_wait(s, seq);
	return sg_sync_status();
}

/*
 * Fill in a linear side and check it: device memory must lie within an
 * allocation; host memory cannot be checked.
 */
static cudaError_t side_linear(struct side *s, void *p, size_t pitch, size_t slice, size_t w,
			       size_t h, size_t d)
{
	s->p = p;
	s->pitch = pitch;
	s->slice = slice;
	s->arr = NULL;
	s->dev = sg_is_dev(p);
	if (!p)
		return cudaErrorInvalidValue;
	if (w == 0 || h == 0 || d == 0)
		return cudaSuccess;
	if ((h > 1 && pitch < w) || (d > 1 && slice < pitch * h))
		return cudaErrorInvalidPitchValue;
	if (s->dev && !sg_dev_range_ok(p, span(pitch, slice, w, h, d)))
		return cudaErrorInvalidValue;
	return cudaSuccess;
}

/*
 * An array side: the box at byte offset xb, row y, slice z of w bytes, h
 * rows, d slices must lie inside the array.  Takes a reference.
 */
static cudaError_t side_array(struct side *s, cudaArray_const_t h_, size_t xb, size_t y,
			      size_t z, size_t w, size_t h, size_t d)
{
	struct sg_array *a = sg_array_get(h_);
	size_t ah, ad;

	s->arr = a;
	if (!a)
		return cudaErrorInvalidValue;
	ah = a->h ? a->h : 1;
	ad = a->d ? a->d : 1;
	if (xb > a->pitch || w > a->pitch - xb || y > ah || h > ah - y || z > ad || d > ad - z)
		return cudaErrorInvalidValue;
	s->p = a->data + z * a->slice + y * a->pitch + xb;
	s->pitch = a->pitch;
	s->slice = a->slice;
	s->dev = 1;
	return cudaSuccess;
}

/* The direction the caller named must fit where the data is (as copy.c). */
static cudaError_t kind_ok(enum cudaMemcpyKind kind, int sdev, int ddev)
{
	switch (kind) {
	case cudaMemcpyDefault:
		return cudaSuccess;
	case cudaMemcpyHostToHost:
		return !sdev && !ddev ? cudaSuccess : cudaErrorInvalidValue;
	case cudaMemcpyHostToDevice:
		return ddev ? cudaSuccess : cudaErrorInvalidValue;
	case cudaMemcpyDeviceToHost:
		return sdev ? cudaSuccess : cudaErrorInvalidValue;
	case cudaMemcpyDeviceToDevice:
		return sdev && ddev ? cudaSuccess : cudaErrorInvalidValue;
	}
	return cudaErrorInvalidMemcpyDirection;
}

static struct xfer *xfer_new(size_t w, size_t h, size_t d)
{
	struct xfer *x = calloc(1, sizeof(*x));

	if (x) {
		x->w = w;
		x->h = h;
		x->d = d;
	}
	return x;
}

/* Check both sides' errors and the direction, then queue (or drop) x. */
static cudaError_t finish(struct xfer *x, cudaError_t e, enum cudaMemcpyKind kind,
			  cudaStream_t stream, int ptsz, int async)
{
	if (e == cudaSuccess && !x->set)
		e = kind_ok(kind, x->src.dev, x->dst.dev);
	if (e != cudaSuccess) {
		xfer_free(x);
		return sg_err(e);
	}
	return submit(x, stream, ptsz, async);
}

#define PROLOGUE()                                                   \
	do {                                                         \
		sg_init();                                           \
		if (sg_sticky() != cudaSuccess)                      \
			return sg_err(sg_sticky());                  \
	} while (0)

/* ---------------------------------------------------------------- 2D array copies */

static cudaError_t to_array_2d(cudaArray_t dst, size_t wo, size_t ho, const void *src,
			       size_t spitch, size_t width, size_t height,
			       enum cudaMemcpyKind kind, cudaStream_t stream, int ptsz, int async)
{
	struct xfer *x;
	cudaError_t e;

	PROLOGUE();
	x = xfer_new(width, height, 1);
	if (!x)
		return sg_err(cudaErrorMemoryAllocation);
	e = side_array(&x->dst, dst, wo, ho, 0, width, height, 1);
	if (e == cudaSuccess)
		e = side_linear(&x->src, (void *)src, spitch, 0, width, height, 1);
	return finish(x, e, kind, stream, ptsz, async);
}

static cudaError_t from_array_2d(void *dst, size_t dpitch, cudaArray_const_t src, size_t wo,
				 size_t ho, size_t width, size_t height,
				 enum cudaMemcpyKind kind, cudaStream_t stream, int ptsz, int async)
{
	struct xfer *x;
	cudaError_t e;

	PROLOGUE();
	x = xfer_new(width, height, 1);
	if (!x)
		return sg_err(cudaErrorMemoryAllocation);
	e = side_array(&x->src, src, wo, ho, 0, width, height, 1);
	if (e == cudaSuccess)
		e = side_linear(&x->dst, dst, dpitch, 0, width, height, 1);
	return finish(x, e, kind, stream, ptsz, async);
}

static cudaError_t array_to_array_2d(cudaArray_t dst, size_t dwo, size_t dho,
				     cudaArray_const_t src, size_t swo, size_t sho, size_t width,
				     size_t height, enum cudaMemcpyKind kind, int ptsz)
{
	struct xfer *x;
	cudaError_t e;

	PROLOGUE();
	if (kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
		return sg_err(cudaErrorInvalidMemcpyDirection);
	x = xfer_new(width, height, 1);
	if (!x)
		return sg_err(cudaErrorMemoryAllocation);
	e = side_array(&x->dst, dst, dwo, dho, 0, width, height, 1);
	if (e == cudaSuccess)
		e = side_array(&x->src, src, swo, sho, 0, width, height, 1);
	return finish(x, e, kind, NULL, ptsz, 0);
}

SG_API cudaError_t cudaMemcpy2DToArray(cudaArray_t dst, size_t wOffset, size_t hOffset,
				       const void *src, size_t spitch, size_t width, size_t height,
				       enum cudaMemcpyKind kind)
{
	return to_array_2d(dst, wOffset, hOffset, src, spitch, width, height, kind, NULL, 0, 0);
}

SG_API cudaError_t cudaMemcpy2DToArray_ptds(cudaArray_t dst, size_t wOffset, size_t hOffset,
					    const void *src, size_t spitch, size_t width,
					    size_t height, enum cudaMemcpyKind kind)
{
	return to_array_2d(dst, wOffset, hOffset, src, spitch, width, height, kind, NULL, 1, 0);
}

SG_API cudaError_t cudaMemcpy2DToArrayAsync(cudaArray_t dst, size_t wOffset, size_t hOffset,
					    const void *src, size_t spitch, size_t width,
					    size_t height, enum cudaMemcpyKind kind,
					    cudaStream_t stream)
{
	return to_array_2d(dst, wOffset, hOffset, src, spitch, width, height, kind, stream, 0, 1);
}

SG_API cudaError_t cudaMemcpy2DToArrayAsync_ptsz(cudaArray_t dst, size_t wOffset, size_t hOffset,
						 const void *src, size_t spitch, size_t width,
						 size_t height, enum cudaMemcpyKind kind,
						 cudaStream_t stream)
{
	return to_array_2d(dst, wOffset, hOffset, src, spitch, width, height, kind, stream, 1, 1);
}

SG_API cudaError_t cudaMemcpy2DFromArray(void *dst, size_t dpitch, cudaArray_const_t src,
					 size_t wOffset, size_t hOffset, size_t width,
					 size_t height, enum cudaMemcpyKind kind)
{
	return from_array_2d(dst, dpitch, src, wOffset, hOffset, width, height, kind, NULL, 0, 0);
}

SG_API cudaError_t cudaMemcpy2DFromArray_ptds(void *dst, size_t dpitch, cudaArray_const_t src,
					      size_t wOffset, size_t hOffset, size_t width,
					      size_t height, enum cudaMemcpyKind kind)
{
	return from_array_2d(dst, dpitch, src, wOffset, hOffset, width, height, kind, NULL, 1, 0);
}

SG_API cudaError_t cudaMemcpy2DFromArrayAsync(void *dst, size_t dpitch, cudaArray_const_t src,
					      size_t wOffset, size_t hOffset, size_t width,
					      size_t height, enum cudaMemcpyKind kind,
					      cudaStream_t stream)
{
	return from_array_2d(dst, dpitch, src, wOffset, hOffset, width, height, kind, stream, 0,
			     1);
}

SG_API cudaError_t cudaMemcpy2DFromArrayAsync_ptsz(void *dst, size_t dpitch,
						   cudaArray_const_t src, size_t wOffset,
						   size_t hOffset, size_t width, size_t height,
						   enum cudaMemcpyKind kind, cudaStream_t stream)
{
	return from_array_2d(dst, dpitch, src, wOffset, hOffset, width, height, kind, stream, 1,
			     1);
}

SG_API cudaError_t cudaMemcpy2DArrayToArray(cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst,
					    cudaArray_const_t src, size_t wOffsetSrc,
					    size_t hOffsetSrc, size_t width, size_t height,
					    enum cudaMemcpyKind kind)
{
	return array_to_array_2d(dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, width,
				 height, kind, 0);
}

SG_API cudaError_t cudaMemcpy2DArrayToArray_ptds(cudaArray_t dst, size_t wOffsetDst,
						 size_t hOffsetDst, cudaArray_const_t src,
						 size_t wOffsetSrc, size_t hOffsetSrc, size_t width,
						 size_t height, enum cudaMemcpyKind kind)
{
	return array_to_array_2d(dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, width,
				 height, kind, 1);
}

/* ---------------------------------------------------------------- deprecated linear array copies */

/*
 * cudaMemcpyToArray and friends (deprecated, still in CUDA 13): count bytes
 * from (wOffset, hOffset) on, running on into the next rows.  Packed rows
 * make that one run of count bytes; it must end inside the array.
 */
static cudaError_t array_run(struct side *s, cudaArray_const_t h, size_t wo, size_t ho,
			     size_t count)
{
	struct sg_array *a = sg_array_get(h);
	size_t total, off;

	s->arr = a;
	if (!a)
		return cudaErrorInvalidValue;
	total = a->slice * (a->d ? a->d : 1);
	if (wo > a->pitch || ho > (a->h ? a->h : 1))
		return cudaErrorInvalidValue;
	off = ho * a->pitch + wo;
	if (off > total || count > total - off)
		return cudaErrorInvalidValue;
	s->p = a->data + off;
	s->pitch = count;
	s->slice = count;
	s->dev = 1;
	return cudaSuccess;
}

static cudaError_t to_array_1d(cudaArray_t dst, size_t wo, size_t ho, const void *src,
			       size_t count, enum cudaMemcpyKind kind, cudaStream_t stream,
			       int ptsz, int async)
{
	struct xfer *x;
	cudaError_t e;

	PROLOGUE();
	x = xfer_new(count, 1, 1);
	if (!x)
		return sg_err(cudaErrorMemoryAllocation);
	e = array_run(&x->dst, dst, wo, ho, count);
	if (e == cudaSuccess)
		e = side_linear(&x->src, (void *)src, count, count, count, 1, 1);
	return finish(x, e, kind, stream, ptsz, async);
}

static cudaError_t from_array_1d(void *dst, cudaArray_const_t src, size_t wo, size_t ho,
				 size_t count, enum cudaMemcpyKind kind, cudaStream_t stream,
				 int ptsz, int async)
{
	struct xfer *x;
	cudaError_t e;

	PROLOGUE();
	x = xfer_new(count, 1, 1);
	if (!x)
		return sg_err(cudaErrorMemoryAllocation);
	e = array_run(&x->src, src, wo, ho, count);
	if (e == cudaSuccess)
		e = side_linear(&x->dst, dst, count, count, count, 1, 1);
	return finish(x, e, kind, stream, ptsz, async);
}

static cudaError_t array_to_array_1d(cudaArray_t dst, size_t dwo, size_t dho,
				     cudaArray_const_t src, size_t swo, size_t sho, size_t count,
				     enum cudaMemcpyKind kind, int ptsz)
{
	struct xfer *x;
	cudaError_t e;

	PROLOGUE();
	if (kind != cudaMemcpyDeviceToDevice && kind != cudaMemcpyDefault)
		return sg_err(cudaErrorInvalidMemcpyDirection);
	x = xfer_new(count, 1, 1);
	if (!x)
		return sg_err(cudaErrorMemoryAllocation);
	e = array_run(&x->dst, dst, dwo, dho, count);
	if (e == cudaSuccess)
		e = array_run(&x->src, src, swo, sho, count);
	return finish(x, e, kind, NULL, ptsz, 0);
}

SG_API cudaError_t cudaMemcpyToArray(cudaArray_t dst, size_t wOffset, size_t hOffset,
				     const void *src, size_t count, enum cudaMemcpyKind kind)
{
	return to_array_1d(dst, wOffset, hOffset, src, count, kind, NULL, 0, 0);
}

SG_API cudaError_t cudaMemcpyToArray_ptds(cudaArray_t dst, size_t wOffset, size_t hOffset,
					  const void *src, size_t count, enum cudaMemcpyKind kind)
{
	return to_array_1d(dst, wOffset, hOffset, src, count, kind, NULL, 1, 0);
}

SG_API cudaError_t cudaMemcpyToArrayAsync(cudaArray_t dst, size_t wOffset, size_t hOffset,
					  const void *src, size_t count, enum cudaMemcpyKind kind,
					  cudaStream_t stream)
{
	return to_array_1d(dst, wOffset, hOffset, src, count, kind, stream, 0, 1);
}

SG_API cudaError_t cudaMemcpyToArrayAsync_ptsz(cudaArray_t dst, size_t wOffset, size_t hOffset,
					       const void *src, size_t count,
					       enum cudaMemcpyKind kind, cudaStream_t stream)
{
	return to_array_1d(dst, wOffset, hOffset, src, count, kind, stream, 1, 1);
}

SG_API cudaError_t cudaMemcpyFromArray(void *dst, cudaArray_const_t src, size_t wOffset,
				       size_t hOffset, size_t count, enum cudaMemcpyKind kind)
{
	return from_array_1d(dst, src, wOffset, hOffset, count, kind, NULL, 0, 0);
}

SG_API cudaError_t cudaMemcpyFromArray_ptds(void *dst, cudaArray_const_t src, size_t wOffset,
					    size_t hOffset, size_t count, enum cudaMemcpyKind kind)
{
	return from_array_1d(dst, src, wOffset, hOffset, count, kind, NULL, 1, 0);
}

SG_API cudaError_t cudaMemcpyFromArrayAsync(void *dst, cudaArray_const_t src, size_t wOffset,
					    size_t hOffset, size_t count,
					    enum cudaMemcpyKind kind, cudaStream_t stream)
{
	return from_array_1d(dst, src, wOffset, hOffset, count, kind, stream, 0, 1);
}

SG_API cudaError_t cudaMemcpyFromArrayAsync_ptsz(void *dst, cudaArray_const_t src,
						 size_t wOffset, size_t hOffset, size_t count,
						 enum cudaMemcpyKind kind, cudaStream_t stream)
{
	return from_array_1d(dst, src, wOffset, hOffset, count, kind, stream, 1, 1);
}

SG_API cudaError_t cudaMemcpyArrayToArray(cudaArray_t dst, size_t wOffsetDst, size_t hOffsetDst,
					  cudaArray_const_t src, size_t wOffsetSrc,
					  size_t hOffsetSrc, size_t count, enum cudaMemcpyKind kind)
{
	return array_to_array_1d(dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, count,
				 kind, 0);
}

SG_API cudaError_t cudaMemcpyArrayToArray_ptds(cudaArray_t dst, size_t wOffsetDst,
					       size_t hOffsetDst, cudaArray_const_t src,
					       size_t wOffsetSrc, size_t hOffsetSrc, size_t count,
					       enum cudaMemcpyKind kind)
{
	return array_to_array_1d(dst, wOffsetDst, hOffsetDst, src, wOffsetSrc, hOffsetSrc, count,
				 kind, 1);
}

/* ---------------------------------------------------------------- cudaMemcpy3D */

/*
 * One side of a cudaMemcpy3D: an array (position and extent in elements)
 * or a pitched pointer (x in bytes; a slice is pitch * ysize bytes).
 */
static cudaError_t side_3d(struct side *s, cudaArray_const_t arr, struct cudaPos pos,
			   struct cudaPitchedPtr pp, size_t wb, size_t h, size_t d, size_t es)
{
	size_t slice;

	if (arr)
		return side_array(s, arr, pos.x * es, pos.y, pos.z, wb, h, d);
	if (!pp.ptr)
		return cudaErrorInvalidValue;
	if (d > 1 && pp.ysize < pos.y + h)
		return cudaErrorInvalidValue;
	if (pp.pitch && pos.x + wb > pp.pitch)
		return cudaErrorInvalidPitchValue;
	slice = pp.pitch * pp.ysize;
	return side_linear(s, (char *)pp.ptr + pos.z * slice + pos.y * pp.pitch + pos.x,
			   pp.pitch, slice, wb, h, d);
}

static cudaError_t copy_3d(const struct cudaMemcpy3DParms *p, cudaStream_t stream, int ptsz,
			   int async)
{
	struct sg_array *sa, *da;
	struct xfer *x;
	size_t es = 1;
	cudaError_t e;

	PROLOGUE();
	if (!p)
		return sg_err(cudaErrorInvalidValue);
	/* exactly one of array and pointer on each side */
	if (!p->srcArray == !p->srcPtr.ptr || !p->dstArray == !p->dstPtr.ptr)
		return sg_err(cudaErrorInvalidValue);
	/* with an array in the copy the extent's width counts its elements */
	sa = sg_array_get(p->srcArray);
	da = sg_array_get(p->dstArray);
	if ((p->srcArray && !sa) || (p->dstArray && !da)) {
		sg_array_put(sa);
		sg_array_put(da);
		return sg_err(cudaErrorInvalidValue);
	}
	if (sa && da && sa->es != da->es) {
		sg_array_put(sa);
		sg_array_put(da);
		return sg_err(cudaErrorInvalidValue);
	}
	es = sa ? sa->es : da ? da->es : 1;
	sg_array_put(sa);
	sg_array_put(da);
	if (p->extent.width > (size_t)-1 / es)
		return sg_err(cudaErrorInvalidValue);
	x = xfer_new(p->extent.width * es, p->extent.height, p->extent.depth);
	if (!x)
		return sg_err(cudaErrorMemoryAllocation);
	e = side_3d(&x->dst, p->dstArray, p->dstPos, p->dstPtr, x->w, x->h, x->d, es);
	if (e == cudaSuccess)
		e = side_3d(&x->src, p->srcArray, p->srcPos, p->srcPtr, x->w, x->h, x->d, es);
	return finish(x, e, p->kind, stream, ptsz, async);
}

SG_API cudaError_t cudaMemcpy3D(const struct cudaMemcpy3DParms *p)
{
	return copy_3d(p, NULL, 0, 0);
}

SG_API cudaError_t cudaMemcpy3D_ptds(const struct cudaMemcpy3DParms *p)
{
	return copy_3d(p, NULL, 1, 0);
}

SG_API cudaError_t cudaMemcpy3DAsync(const struct cudaMemcpy3DParms *p, cudaStream_t stream)
{
	return copy_3d(p, stream, 0, 1);
}

SG_API cudaError_t cudaMemcpy3DAsync_ptsz(const struct cudaMemcpy3DParms *p, cudaStream_t stream)
{
	return copy_3d(p, stream, 1, 1);
}

/* ---------------------------------------------------------------- pitched linear copies */

/*
 * cudaMemcpy2D: height rows of width bytes between two pitched buffers,
 * each side host or device memory; the same strided engine as the array
 * copies, so it is one operation in its stream.  CUDA refuses a pitch
 * narrower than the row (cudaErrorInvalidPitchValue).
 */
static cudaError_t copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch,
			   size_t width, size_t height, enum cudaMemcpyKind kind,
			   cudaStream_t stream, int ptsz, int async)
{
	struct xfer *x;
	cudaError_t e;

	PROLOGUE();
	if (width == 0 || height == 0)
		return cudaSuccess;
	if (dpitch < width || spitch < width)
		return sg_err(cudaErrorInvalidPitchValue);
	x = xfer_new(width, height, 1);
	if (!x)
		return sg_err(cudaErrorMemoryAllocation);
	e = side_linear(&x->dst, dst, dpitch, 0, width, height, 1);
	if (e == cudaSuccess)
		e = side_linear(&x->src, (void *)src, spitch, 0, width, height, 1);
	return finish(x, e, kind, stream, ptsz, async);
}

SG_API cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
				size_t width, size_t height, enum cudaMemcpyKind kind)
{
	return copy_2d(dst, dpitch, src, spitch, width, height, kind, NULL, 0, 0);
}

SG_API cudaError_t cudaMemcpy2D_ptds(void *dst, size_t dpitch, const void *src, size_t spitch,
				     size_t width, size_t height, enum cudaMemcpyKind kind)
{
	return copy_2d(dst, dpitch, src, spitch, width, height, kind, NULL, 1, 0);
}

SG_API cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
				     size_t width, size_t height, enum cudaMemcpyKind kind,
				     cudaStream_t stream)
{
	return copy_2d(dst, dpitch, src, spitch, width, height, kind, stream, 0, 1);
}

SG_API cudaError_t cudaMemcpy2DAsync_ptsz(void *dst, size_t dpitch, const void *src,
					  size_t spitch, size_t width, size_t height,
					  enum cudaMemcpyKind kind, cudaStream_t stream)
{
	return copy_2d(dst, dpitch, src, spitch, width, height, kind, stream, 1, 1);
}

/* cudaMalloc3D: cudaMallocPitch's rows, height * depth of them. */
SG_API cudaError_t cudaMalloc3D(struct cudaPitchedPtr *pp, struct cudaExtent extent)
{
	size_t pitch = 0, rows;
	void *p = NULL;
	cudaError_t e;

	PROLOGUE();
	if (!pp)
		return sg_err(cudaErrorInvalidValue);
	rows = extent.height * extent.depth;
	if (extent.depth && rows / extent.depth != extent.height)
		return sg_err(cudaErrorMemoryAllocation);
	e = cudaMallocPitch(&p, &pitch, extent.width, rows);
	if (e != cudaSuccess)
		return e;
	pp->ptr = p;
	pp->pitch = pitch;
	pp->xsize = extent.width;
	pp->ysize = extent.height;
	return cudaSuccess;
}

/* ---------------------------------------------------------------- cudaMemset2D / 3D */

/*
 * Fills of pitched device memory.  Like cudaMemset (copy.c) even the
 * "synchronous" ones are asynchronous with respect to the host.
 */
static cudaError_t fill(void *p, size_t pitch, size_t slice, int value, size_t w, size_t h,
			size_t d, cudaStream_t stream, int ptsz)
{
	struct xfer *x;
	cudaError_t e;

	PROLOGUE();
	if (w == 0 || h == 0 || d == 0)
		return cudaSuccess;
	x = xfer_new(w, h, d);
	if (!x)
		return sg_err(cudaErrorMemoryAllocation);
	x->set = 1;
	x->val = value;
	x->src.dev = 1;
	e = side_linear(&x->dst, p, pitch, slice, w, h, d);
	if (e == cudaErrorInvalidPitchValue || (e == cudaSuccess && !x->dst.dev))
		e = cudaErrorInvalidValue;     /* the only code the fills document */
	return finish(x, e, cudaMemcpyDefault, stream, ptsz, 1);
}

SG_API cudaError_t cudaMemset2D(void *devPtr, size_t pitch, int value, size_t width,
				size_t height)
{
	return fill(devPtr, pitch, pitch * height, value, width, height, 1, NULL, 0);
}

SG_API cudaError_t cudaMemset2D_ptds(void *devPtr, size_t pitch, int value, size_t width,
				     size_t height)
{
	return fill(devPtr, pitch, pitch * height, value, width, height, 1, NULL, 1);
}

SG_API cudaError_t cudaMemset2DAsync(void *devPtr, size_t pitch, int value, size_t width,
				     size_t height, cudaStream_t stream)
{
	return fill(devPtr, pitch, pitch * height, value, width, height, 1, stream, 0);
}

SG_API cudaError_t cudaMemset2DAsync_ptsz(void *devPtr, size_t pitch, int value, size_t width,
					  size_t height, cudaStream_t stream)
{
	return fill(devPtr, pitch, pitch * height, value, width, height, 1, stream, 1);
}

/* extent.width in bytes; a slice is pitch * ysize bytes */
static cudaError_t fill_3d(struct cudaPitchedPtr pp, int value, struct cudaExtent e,
			   cudaStream_t stream, int ptsz)
{
	if (e.depth > 1 && e.height > pp.ysize)
		return sg_err(cudaErrorInvalidValue);
	return fill(pp.ptr, pp.pitch, pp.pitch * pp.ysize, value, e.width, e.height, e.depth,
		    stream, ptsz);
}

SG_API cudaError_t cudaMemset3D(struct cudaPitchedPtr pitchedDevPtr, int value,
				struct cudaExtent extent)
{
	return fill_3d(pitchedDevPtr, value, extent, NULL, 0);
}

SG_API cudaError_t cudaMemset3D_ptds(struct cudaPitchedPtr pitchedDevPtr, int value,
				     struct cudaExtent extent)
{
	return fill_3d(pitchedDevPtr, value, extent, NULL, 1);
}

SG_API cudaError_t cudaMemset3DAsync(struct cudaPitchedPtr pitchedDevPtr, int value,
				     struct cudaExtent extent, cudaStream_t stream)
{
	return fill_3d(pitchedDevPtr, value, extent, stream, 0);
}

SG_API cudaError_t cudaMemset3DAsync_ptsz(struct cudaPitchedPtr pitchedDevPtr, int value,
					  struct cudaExtent extent, cudaStream_t stream)
{
	return fill_3d(pitchedDevPtr, value, extent, stream, 1);
}
