/*
 * launch.c - kernel launches: the entry points nvcc's generated code calls
 * (__cudaPushCallConfiguration, __cudaPopCallConfiguration,
 * __cudaGetKernel, __cudaLaunchKernel[_ptsz]) and the public ones
 * (cudaLaunchKernel, cudaLaunchKernelExC, cudaLaunchCooperativeKernel,
 * each with _ptsz), plus function attributes and occupancy.
 *
 * The fast path: find the kernel record (lock-free), validate, copy the
 * argument values into the operation (the layout comes from the cubin),
 * push it on the stream's queue.  No lock, no system call.  If the layout
 * is unknown the launch lends its argument pointers to the executor and
 * waits until the twin has consumed them.  On a capturing stream the
 * operation becomes a graph node instead (capture.c); such a kernel, whose
 * arguments cannot be copied, cannot be captured.
 */
#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine.h"
#include "graph.h"

#define CFG_DEPTH 16

struct callcfg {
	dim3         grid, block;
	size_t       shmem;
	cudaStream_t stream;
};

static __thread struct callcfg cfgs[CFG_DEPTH];
static __thread int ncfg;

/* <<<grid, block, shmem, stream>>>: pushed before the stub is called... */
SG_API unsigned __cudaPushCallConfiguration(dim3 gridDim, dim3 blockDim, size_t sharedMem,
					    struct CUstream_st *stream)
{
	if (ncfg >= CFG_DEPTH)
		return 1;      /* nonzero: the generated code skips the launch */
	cfgs[ncfg].grid = gridDim;
	cfgs[ncfg].block = blockDim;
	cfgs[ncfg].shmem = sharedMem;
	cfgs[ncfg].stream = stream;
	ncfg++;
	return 0;
}

/* ...and popped by the stub. */
SG_API cudaError_t __cudaPopCallConfiguration(dim3 *gridDim, dim3 *blockDim, size_t *sharedMem,
					      void *stream)
{
	if (ncfg <= 0)
		return sg_err(cudaErrorMissingConfiguration);
	ncfg--;
	if (gridDim)
		*gridDim = cfgs[ncfg].grid;
	if (blockDim)
		*blockDim = cfgs[ncfg].block;
	if (sharedMem)
		*sharedMem = cfgs[ncfg].shmem;
	if (stream)
		*(cudaStream_t *)stream = cfgs[ncfg].stream;
	return cudaSuccess;
}

static int bad_dims(dim3 g, dim3 b)
{
	unsigned long long threads = (unsigned long long)b.x * b.y * b.z;

	return g.x == 0 || g.y == 0 || g.z == 0 || g.x > 0x7fffffffu || g.y > 65535 ||
	       g.z > 65535 || b.x == 0 || b.y == 0 || b.z == 0 || b.x > 1024 || b.y > 1024 ||
	       b.z > 64 || threads > 1024;
}

static int max_coresident(dim3 b, const struct sg_stream *s)
{
	int tpb = (int)(b.x * b.y * b.z), bps = 2048 / (tpb ? tpb : 1);

	if (bps < 1)
		bps = 1;
	if (bps > 32)
		bps = 32;
	/* co-resident on the SMs this stream's kernels may use */
	return bps * sg_cap_sms(sg_stream_sms(s));
}

static void wait_consumed(atomic_int *flag)
{
	while (!atomic_load(flag))
		syscall(SYS_futex, flag, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
}

static void set_shape(struct sg_op *op, struct sg_kernel *k, dim3 g, dim3 b, size_t shmem)
{
	op->u.kern.k = k;
	op->u.kern.l.grid.x = g.x;
	op->u.kern.l.grid.y = g.y;
	op->u.kern.l.grid.z = g.z;
	op->u.kern.l.block.x = b.x;
	op->u.kern.l.block.y = b.y;
	op->u.kern.l.block.z = b.z;
	op->u.kern.l.shmem = shmem;
}

/*
 * A kernel operation with its argument values copied: pointers, then the
 * values at their cubin offsets, 16-aligned.  Launches and graph nodes
 * (kernel nodes, captured launches) both make theirs here.
 */
cudaError_t sg_kernel_op_new(struct sg_kernel *k, dim3 g, dim3 b, void **args, size_t shmem,
			     struct sg_op **out, size_t *size)
{
	struct sg_op *op;
	size_t head;
	void **argv;
	char *buf;
	int n, i;

	if (SG_UNLIKELY(bad_dims(g, b)))
		return cudaErrorInvalidConfiguration;
	if (SG_UNLIKELY(shmem > 227 * 1024))
		return cudaErrorInvalidValue;
	if (SG_UNLIKELY(!atomic_load_explicit(&k->resolved, memory_order_acquire)))
		sg_kernel_resolve(k);
	n = k->params.n;
	if (n < 0)
		return cudaErrorNotSupported;      /* nothing says what to copy */
	if (n > 0 && !args)
		return cudaErrorInvalidValue;
	head = (sizeof(*op) + (size_t)n * sizeof(void *) + 15) & ~(size_t)15;
	op = sg_op_new(SG_OP_KERNEL, head - sizeof(*op) + k->params.total);
	if (!op)
		return cudaErrorMemoryAllocation;
	argv = (void **)(op + 1);
	buf = (char *)op + head;
	for (i = 0; i < n; i++) {
		if (SG_UNLIKELY(!args[i])) {
			sg_op_free(op);
			return cudaErrorInvalidValue;
		}
		argv[i] = buf + k->params.off[i];
		memcpy(argv[i], args[i], k->params.size[i]);
	}
	op->u.kern.l.args = argv;
	set_shape(op, k, g, b, shmem);
	*out = op;
	*size = head + k->params.total;
	return cudaSuccess;
}

static cudaError_t launch(struct sg_kernel *k, dim3 g, dim3 b, void **args, size_t shmem,
			  cudaStream_t stream, int ptsz, int coop)
{
	struct sg_stream *s;
	struct sg_op *op;
	atomic_int consumed = 0;
	cudaError_t e;
	size_t size;
	int capturing;

	sg_init();
	if (SG_UNLIKELY(sg_sticky() != cudaSuccess))
		return sg_err(sg_sticky());
	if (SG_UNLIKELY(!k))
		return sg_err(cudaErrorInvalidDeviceFunction);
	if (SG_UNLIKELY(bad_dims(g, b)))
		return sg_err(cudaErrorInvalidConfiguration);
	if (SG_UNLIKELY(shmem > 227 * 1024))
		return sg_err(cudaErrorInvalidValue);
	s = sg_stream_resolve(stream, ptsz);
	if (SG_UNLIKELY(!s))
		return sg_err(cudaErrorInvalidResourceHandle);
	if (coop && (unsigned long long)g.x * g.y * g.z > (unsigned long long)max_coresident(b, s))
		return sg_err(cudaErrorCooperativeLaunchTooLarge);
	e = sg_capture_gate(s, &capturing);
	if (SG_UNLIKELY(e != cudaSuccess))
		return sg_err(e);
	if (SG_UNLIKELY(!atomic_load_explicit(&k->resolved, memory_order_acquire)))
		sg_kernel_resolve(k);
	if (k->params.n >= 0) {
		e = sg_kernel_op_new(k, g, b, args, shmem, &op, &size);
		if (e != cudaSuccess)
			return sg_err(e);
		/* before capture: a graph's kernel node keeps its green context */
		op->u.kern.sms = sg_stream_sms(s);
		if (SG_UNLIKELY(capturing)) {
			/* recorded, not run: a graph launch runs (and counts) it */
			e = sg_capture_add(s, op, size, cudaGraphNodeTypeKernel);
			return e == cudaSuccess ? e : sg_err(e);
		}
	} else {
		/* arguments of unknown size cannot be copied into a graph */
		if (SG_UNLIKELY(capturing) && (e = sg_capture_forbid(s)) != cudaSuccess)
			return sg_err(e);
		op = sg_op_new(SG_OP_KERNEL, 0);
		if (!op)
			return sg_err(cudaErrorMemoryAllocation);
		op->u.kern.l.args = args;
		op->consumed = &consumed;
		op->u.kern.sms = sg_stream_sms(s);
		set_shape(op, k, g, b, shmem);
	}
	op->u.kern.seq = sg_launch_seq();
	atomic_fetch_add_explicit(&k->launches, 1, memory_order_relaxed);
	sg_enqueue(s, op);      /* op belongs to the executor from here */
	if (k->params.n < 0)
		wait_consumed(&consumed);
	return cudaSuccess;
}

SG_API cudaError_t __cudaGetKernel(cudaKernel_t *kernel, const void *stub)
{
	struct sg_kernel *k = sg_kernel_by_stub(stub);

	if (!kernel)
		return sg_err(cudaErrorInvalidValue);
	if (!k)
		return sg_err(cudaErrorInvalidDeviceFunction);
	*kernel = (cudaKernel_t)k;
	return cudaSuccess;
}

SG_API cudaError_t cudaGetKernel(cudaKernel_t *kernelPtr, const void *entryFuncAddr)
{
	sg_init();
	return __cudaGetKernel(kernelPtr, entryFuncAddr);
}

SG_API cudaError_t __cudaLaunchKernel(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
				      void **args, size_t sharedMem, cudaStream_t stream)
{
	return launch(sg_kernel_by_handle(kernel), gridDim, blockDim, args, sharedMem, stream, 0, 0);
}

SG_API cudaError_t __cudaLaunchKernel_ptsz(cudaKernel_t kernel, dim3 gridDim, dim3 blockDim,
					   void **args, size_t sharedMem, cudaStream_t stream)
{
	return launch(sg_kernel_by_handle(kernel), gridDim, blockDim, args, sharedMem, stream, 1, 0);
}

SG_API cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
				    size_t sharedMem, cudaStream_t stream)
{
	return launch(sg_kernel_by_handle(func), gridDim, blockDim, args, sharedMem, stream, 0, 0);
}

SG_API cudaError_t cudaLaunchKernel_ptsz(const void *func, dim3 gridDim, dim3 blockDim,
					 void **args, size_t sharedMem, cudaStream_t stream)
{
	return launch(sg_kernel_by_handle(func), gridDim, blockDim, args, sharedMem, stream, 1, 0);
}

SG_API cudaError_t cudaLaunchCooperativeKernel(const void *func, dim3 gridDim, dim3 blockDim,
					       void **args, size_t sharedMem, cudaStream_t stream)
{
	return launch(sg_kernel_by_handle(func), gridDim, blockDim, args, sharedMem, stream, 0, 1);
}

SG_API cudaError_t cudaLaunchCooperativeKernel_ptsz(const void *func, dim3 gridDim,
						    dim3 blockDim, void **args, size_t sharedMem,
						    cudaStream_t stream)
{
	return launch(sg_kernel_by_handle(func), gridDim, blockDim, args, sharedMem, stream, 1, 1);
}

static cudaError_t launch_ex(const cudaLaunchConfig_t *config, const void *func, void **args,
			     int ptsz)
{
	unsigned i;
	int coop = 0;

	sg_init();
	if (!config || (config->numAttrs && !config->attrs))
		return sg_err(cudaErrorInvalidValue);
	for (i = 0; i < config->numAttrs; i++)
		if (config->attrs[i].id == cudaLaunchAttributeCooperative &&
		    config->attrs[i].val.cooperative)
			coop = 1;
	return launch(sg_kernel_by_handle(func), config->gridDim, config->blockDim, args,
		      config->dynamicSmemBytes, config->stream, ptsz, coop);
}

SG_API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
				       void **args)
{
	return launch_ex(config, func, args, 0);
}

SG_API cudaError_t cudaLaunchKernelExC_ptsz(const cudaLaunchConfig_t *config, const void *func,
					    void **args)
{
	return launch_ex(config, func, args, 1);
}

/* ---------------------------------------------------------------- functions */

SG_API cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes *attr, const void *func)
{
	struct sg_kernel *k;

	sg_init();
	if (!attr)
		return sg_err(cudaErrorInvalidValue);
	k = sg_kernel_by_handle(func);
	if (!k)
		return sg_err(cudaErrorInvalidDeviceFunction);
	sg_kernel_resolve(k);
	memset(attr, 0, sizeof(*attr));
	attr->maxThreadsPerBlock = 1024;
	/* from the cubin when it says (what the device model uses too) */
	attr->numRegs = k->regs > 0 ? (int)k->regs : (int)sg_cfg.mp.regs_default;
	attr->sharedSizeBytes = (size_t)k->smem_static;
	attr->ptxVersion = 90;
	attr->binaryVersion = 90;
	attr->maxDynamicSharedSizeBytes = 48 * 1024;
	attr->preferredShmemCarveout = -1;
	return cudaSuccess;
}

SG_API cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
	sg_init();
	if (!sg_kernel_by_handle(func))
		return sg_err(cudaErrorInvalidDeviceFunction);
	if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize && (value < 0 || value > 227 * 1024))
		return sg_err(cudaErrorInvalidValue);
	return cudaSuccess;
}

SG_API cudaError_t cudaFuncSetCacheConfig(const void *func, enum cudaFuncCache cacheConfig)
{
	(void)cacheConfig;
	sg_init();
	return sg_kernel_by_handle(func) ? cudaSuccess : sg_err(cudaErrorInvalidDeviceFunction);
}

SG_API cudaError_t cudaFuncGetName(const char **name, const void *func)
{
	struct sg_kernel *k;

	sg_init();
	if (!name)
		return sg_err(cudaErrorInvalidValue);
	k = sg_kernel_by_handle(func);
	if (!k)
		return sg_err(cudaErrorInvalidDeviceFunction);
	*name = k->name;
	return cudaSuccess;
}

/* Offsets and sizes from the cubin: what a hook needs to ship arguments. */
SG_API cudaError_t cudaFuncGetParamInfo(const void *func, size_t paramIndex, size_t *paramOffset,
					size_t *paramSize)
{
	struct sg_kernel *k;

	sg_init();
	k = sg_kernel_by_handle(func);
	if (!k)
		return sg_err(cudaErrorInvalidDeviceFunction);
	if (!atomic_load_explicit(&k->resolved, memory_order_acquire))
		sg_kernel_resolve(k);
	if (!paramOffset || !paramSize || k->params.n < 0 || paramIndex >= (size_t)k->params.n)
		return sg_err(cudaErrorInvalidValue);
	*paramOffset = k->params.off[paramIndex];
	*paramSize = k->params.size[paramIndex];
	return cudaSuccess;
}

SG_API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int *numBlocks,
									  const void *func,
									  int blockSize,
									  size_t dynamicSMemSize,
									  unsigned int flags)
{
	struct sg_kernel *k;
	double n;

	(void)flags;
	sg_init();
	if (!numBlocks || blockSize <= 0 || blockSize > 1024)
		return sg_err(cudaErrorInvalidValue);
	k = sg_kernel_by_handle(func);
	if (!k)
		return sg_err(cudaErrorInvalidDeviceFunction);
	sg_kernel_resolve(k);
	/* the device model's occupancy rules (engine.c) */
	n = en_blocks_per_sm(&sg_cfg.mp, blockSize, k->regs,
			     (double)dynamicSMemSize + k->smem_static);
	if (k->smem_static + (double)dynamicSMemSize + sg_cfg.mp.block_smem > sg_cfg.mp.sm_smem)
		n = 0;          /* does not fit an SM at all */
	*numBlocks = (int)n;
	return cudaSuccess;
}

SG_API cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *numBlocks, const void *func,
								 int blockSize,
								 size_t dynamicSMemSize)
{
	return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(numBlocks, func, blockSize,
								      dynamicSMemSize, 0);
}
