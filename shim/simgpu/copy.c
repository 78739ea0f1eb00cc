/*
 * copy.c - cudaMemcpy, cudaMemset and the __device__ symbol copies.
 *
 * Every copy is an operation in a stream, so it is ordered with kernels
 * and takes modelled time (PCIe rate host<->device, BW device<->device).
 * Synchronous variants enqueue on the legacy stream (the per-thread stream
 * for _ptds) and wait for exactly that operation.  Asynchronous ones
 * follow CUDA's pageable-memory rules: a host-to-device copy from pageable
 * memory snapshots the source at enqueue and returns; a device-to-host
 * copy into pageable memory returns only once the data is there; pinned
 * memory is read and written when the copy executes.
 *
 * Device pointers are checked against the allocator (or the owning peer's
 * arena) before anything is queued, so a bad pointer is an error.
 *
 * On a capturing stream an asynchronous copy or memset becomes a graph
 * node (capture.c) that reads its source when the graph runs.  A
 * synchronous copy from the device into host memory, pinned or pageable,
 * is legal while another stream captures in global mode (an H200 and an
 * H100, CUDA 13.0, driver 580.159: cudaMemcpy D2H into cudaMallocHost and
 * into malloc memory returned cudaSuccess and the capture stayed valid;
 * bench/progs/graphs, bench/RESULTS.md); the other synchronous copies
 * (from the host, device to device: not measured) stay "potentially
 * unsafe".
 */
#include <stdlib.h>
#include <string.h>

#include "graph.h"

static cudaError_t classify(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
			    int *dir)
{
	int dd = sg_is_dev(dst), sd = sg_is_dev(src);

	switch (kind) {
	case cudaMemcpyHostToHost:
	case cudaMemcpyDefault:
		break;
	case cudaMemcpyHostToDevice:
		if (!dd)
			return cudaErrorInvalidValue;
		break;
	case cudaMemcpyDeviceToHost:
		if (!sd)
			return cudaErrorInvalidValue;
		break;
	case cudaMemcpyDeviceToDevice:
		if (!dd || !sd)
			return cudaErrorInvalidValue;
		break;
	default:
		return cudaErrorInvalidMemcpyDirection;
	}
	if ((dd && !sg_dev_range_ok(dst, n)) || (sd && !sg_dev_range_ok(src, n)))
		return cudaErrorInvalidValue;
	*dir = dd ? (sd ? SG_D2D : SG_H2D) : (sd ? SG_D2H : SG_H2H);
	return cudaSuccess;
}

/* A validated copy operation; NULL *out for zero bytes (nothing to do). */
cudaError_t sg_copy_op_new(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
			   struct sg_op **out)
{
	struct sg_op *op;
	cudaError_t e;
	int dir;

	*out = NULL;
	if (n == 0)
		return cudaSuccess;
	if (!dst || !src)
		return cudaErrorInvalidValue;
	e = classify(dst, src, n, kind, &dir);
	if (e != cudaSuccess)
		return e;
	op = sg_op_new(SG_OP_COPY, 0);
	if (!op)
		return cudaErrorMemoryAllocation;
	op->u.copy.dst = dst;
	op->u.copy.src = src;
	op->u.copy.n = n;
	op->u.copy.dir = dir;
	*out = op;
	return cudaSuccess;
}

static cudaError_t do_copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind,
			   cudaStream_t stream, int ptsz, int async)
{
	struct sg_stream *s;
	struct sg_op *op;
	cudaError_t e;
	uint64_t seq;
	int dir, wait = !async, capturing;

	sg_init();
	if (sg_sticky() != cudaSuccess)
		return sg_err(sg_sticky());
	/* a synchronous copy is "potentially unsafe" during a capture, except
	 * one from the device into host memory (the comment at the top) */
	if (!async && !((kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDefault) &&
			sg_is_dev(src) && !sg_is_dev(dst)) &&
	    (e = sg_capture_unsafe()) != cudaSuccess)
		return sg_err(e);
	e = sg_copy_op_new(dst, src, n, kind, &op);
	if (e != cudaSuccess)
		return sg_err(e);
	if (!op)
		return cudaSuccess;
	dir = op->u.copy.dir;
	s = sg_stream_resolve(stream, ptsz);
	if (!s) {
		sg_op_free(op);
		return sg_err(cudaErrorInvalidResourceHandle);
	}
	e = sg_capture_gate(s, &capturing);
	if (e == cudaSuccess && capturing && !async) {
		e = sg_capture_forbid(s);      /* it would wait for a capture */
		capturing = 0;
	}
	if (e != cudaSuccess) {
		sg_op_free(op);
		return sg_err(e);
	}
	if (capturing) {
		/* a node reads its source when the graph runs: no snapshot */
		e = sg_capture_add(s, op, sizeof(*op), cudaGraphNodeTypeMemcpy);
		return e == cudaSuccess ? e : sg_err(e);
	}
	if (async && (dir == SG_H2D || dir == SG_H2H) && !sg_is_pinned(src, n)) {
		void *snap = malloc(n);

		if (snap) {
			memcpy(snap, src, n);
			op->u.copy.src = snap;
			op->u.copy.owned = snap;
		} else {
			wait = 1;
		}
	}
	if (async && (dir == SG_D2H || dir == SG_H2H) && !sg_is_pinned(dst, n))
		wait = 1;
	seq = sg_enqueue(s, op);
	if (!wait)
		return cudaSuccess;
	sg_stream_wait(s, seq);
	return sg_sync_status();
}

SG_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
	return do_copy(dst, src, count, kind, NULL, 0, 0);
}

SG_API cudaError_t cudaMemcpy_ptds(void *dst, const void *src, size_t count,
				   enum cudaMemcpyKind kind)
{
	return do_copy(dst, src, count, kind, NULL, 1, 0);
}

SG_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
				   enum cudaMemcpyKind kind, cudaStream_t stream)
{
	return do_copy(dst, src, count, kind, stream, 0, 1);
}

SG_API cudaError_t cudaMemcpyAsync_ptsz(void *dst, const void *src, size_t count,
					enum cudaMemcpyKind kind, cudaStream_t stream)
{
	return do_copy(dst, src, count, kind, stream, 1, 1);
}

SG_API cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice,
				  size_t count)
{
	if (dstDevice != 0 || srcDevice != 0)
		return sg_err(cudaErrorInvalidDevice);
	return do_copy(dst, src, count, cudaMemcpyDeviceToDevice, NULL, 0, 0);
}

SG_API cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice,
				       size_t count, cudaStream_t stream)
{
	if (dstDevice != 0 || srcDevice != 0)
		return sg_err(cudaErrorInvalidDevice);
	return do_copy(dst, src, count, cudaMemcpyDeviceToDevice, stream, 0, 1);
}

/* ---------------------------------------------------------------- memset */

/* A validated memset operation; NULL *out for zero bytes. */
cudaError_t sg_set_op_new(void *dst, int value, size_t n, struct sg_op **out)
{
	struct sg_op *op;

	*out = NULL;
	if (n == 0)
		return cudaSuccess;
	if (!sg_dev_range_ok(dst, n))
		return cudaErrorInvalidValue;
	op = sg_op_new(SG_OP_MEMSET, 0);
	if (!op)
		return cudaErrorMemoryAllocation;
	op->u.set.dst = dst;
	op->u.set.val = value;
	op->u.set.n = n;
	*out = op;
	return cudaSuccess;
}

static cudaError_t do_set(void *dst, int value, size_t n, cudaStream_t stream, int ptsz)
{
	struct sg_stream *s;
	struct sg_op *op;
	cudaError_t e;
	int capturing;

	sg_init();
	if (sg_sticky() != cudaSuccess)
		return sg_err(sg_sticky());
	e = sg_set_op_new(dst, value, n, &op);
	if (e != cudaSuccess)
		return sg_err(e);
	if (!op)
		return cudaSuccess;
	s = sg_stream_resolve(stream, ptsz);
	if (!s) {
		sg_op_free(op);
		return sg_err(cudaErrorInvalidResourceHandle);
	}
	e = sg_capture_gate(s, &capturing);
	if (e != cudaSuccess) {
		sg_op_free(op);
		return sg_err(e);
	}
	if (capturing) {
		e = sg_capture_add(s, op, sizeof(*op), cudaGraphNodeTypeMemset);
		return e == cudaSuccess ? e : sg_err(e);
	}
	/* asynchronous with respect to the host, even cudaMemset */
	sg_enqueue(s, op);
	return cudaSuccess;
}

SG_API cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
	return do_set(devPtr, value, count, NULL, 0);
}

SG_API cudaError_t cudaMemset_ptds(void *devPtr, int value, size_t count)
{
	return do_set(devPtr, value, count, NULL, 1);
}

SG_API cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
	return do_set(devPtr, value, count, stream, 0);
}

SG_API cudaError_t cudaMemsetAsync_ptsz(void *devPtr, int value, size_t count,
					cudaStream_t stream)
{
	return do_set(devPtr, value, count, stream, 1);
}

/* ---------------------------------------------------------------- symbols */

static cudaError_t to_symbol(const void *symbol, const void *src, size_t count, size_t offset,
			     enum cudaMemcpyKind kind, cudaStream_t stream, int ptsz, int async)
{
	void *dev;
	size_t size;
	cudaError_t e;

	sg_init();
	if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToDevice &&
	    kind != cudaMemcpyDefault)
		return sg_err(cudaErrorInvalidMemcpyDirection);
	e = sg_symbol(symbol, &dev, &size);
	if (e != cudaSuccess)
		return sg_err(e);
	if (offset > size || count > size - offset)
		return sg_err(cudaErrorInvalidValue);
	return do_copy((char *)dev + offset, src, count, kind, stream, ptsz, async);
}

static cudaError_t from_symbol(void *dst, const void *symbol, size_t count, size_t offset,
			       enum cudaMemcpyKind kind, cudaStream_t stream, int ptsz, int async)
{
	void *dev;
	size_t size;
	cudaError_t e;

	sg_init();
	if (kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDeviceToDevice &&
	    kind != cudaMemcpyDefault)
		return sg_err(cudaErrorInvalidMemcpyDirection);
	e = sg_symbol(symbol, &dev, &size);
	if (e != cudaSuccess)
		return sg_err(e);
	if (offset > size || count > size - offset)
		return sg_err(cudaErrorInvalidValue);
	return do_copy(dst, (char *)dev + offset, count, kind, stream, ptsz, async);
}

SG_API cudaError_t cudaMemcpyToSymbol(const void *symbol, const void *src, size_t count,
				      size_t offset, enum cudaMemcpyKind kind)
{
	return to_symbol(symbol, src, count, offset, kind, NULL, 0, 0);
}

SG_API cudaError_t cudaMemcpyToSymbol_ptds(const void *symbol, const void *src, size_t count,
					   size_t offset, enum cudaMemcpyKind kind)
{
	return to_symbol(symbol, src, count, offset, kind, NULL, 1, 0);
}

SG_API cudaError_t cudaMemcpyToSymbolAsync(const void *symbol, const void *src, size_t count,
					   size_t offset, enum cudaMemcpyKind kind,
					   cudaStream_t stream)
{
	return to_symbol(symbol, src, count, offset, kind, stream, 0, 1);
}

SG_API cudaError_t cudaMemcpyToSymbolAsync_ptsz(const void *symbol, const void *src,
						size_t count, size_t offset,
						enum cudaMemcpyKind kind, cudaStream_t stream)
{
	return to_symbol(symbol, src, count, offset, kind, stream, 1, 1);
}

SG_API cudaError_t cudaMemcpyFromSymbol(void *dst, const void *symbol, size_t count,
					size_t offset, enum cudaMemcpyKind kind)
{
	return from_symbol(dst, symbol, count, offset, kind, NULL, 0, 0);
}

SG_API cudaError_t cudaMemcpyFromSymbol_ptds(void *dst, const void *symbol, size_t count,
					     size_t offset, enum cudaMemcpyKind kind)
{
	return from_symbol(dst, symbol, count, offset, kind, NULL, 1, 0);
}

SG_API cudaError_t cudaMemcpyFromSymbolAsync(void *dst, const void *symbol, size_t count,
					     size_t offset, enum cudaMemcpyKind kind,
					     cudaStream_t stream)
{
	return from_symbol(dst, symbol, count, offset, kind, stream, 0, 1);
}

SG_API cudaError_t cudaMemcpyFromSymbolAsync_ptsz(void *dst, const void *symbol, size_t count,
						  size_t offset, enum cudaMemcpyKind kind,
						  cudaStream_t stream)
{
	return from_symbol(dst, symbol, count, offset, kind, stream, 1, 1);
}

SG_API cudaError_t cudaGetSymbolAddress(void **devPtr, const void *symbol)
{
	size_t size;
	void *dev;
	cudaError_t e;

	sg_init();
	if (!devPtr)
		return sg_err(cudaErrorInvalidValue);
	e = sg_symbol(symbol, &dev, &size);
	if (e != cudaSuccess)
		return sg_err(e);
	*devPtr = dev;
	return cudaSuccess;
}

SG_API cudaError_t cudaGetSymbolSize(size_t *size, const void *symbol)
{
	void *dev;
	size_t n;
	cudaError_t e;

	sg_init();
	if (!size)
		return sg_err(cudaErrorInvalidValue);
	e = sg_symbol(symbol, &dev, &n);
	if (e != cudaSuccess)
		return sg_err(e);
	*size = n;
	return cudaSuccess;
}
