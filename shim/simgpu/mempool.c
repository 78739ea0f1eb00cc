/*
 * mempool.c - stream-ordered memory pools: cudaMemPool*, the device's
 * current pool behind cudaMallocAsync, cudaMallocFromPoolAsync, and
 * cudaFreeAsync of pool memory.
 *
 * Seen from the host, a pool is device memory that freed allocations leave
 * behind for reuse instead of giving it back at once.  Every allocation of
 * a pool is one block of the arena (arena.c), so it counts against device
 * memory, works in kernels and copies as cudaMalloc's does, and the pool's
 * figures are sums of real arena blocks:
 *
 *   LIVE     handed out, not freed                    used, reserved
 *   PENDING  cudaFreeAsync queued, its stream not     used, reserved
 *            there yet
 *   CACHED   its free has been reached in stream      reserved
 *            order; the pool keeps the block
 *
 * A free becomes CACHED when its stream reaches it (a host operation
 * queued by cudaFreeAsync).  Until then only later allocations on the same
 * stream may take the block: stream order makes that safe, and it is what
 * CUDA does.  A CACHED block goes to any stream while
 * ReuseAllowOpportunistic or ReuseAllowInternalDependencies is on (its
 * free has completed: no dependency is needed), else only to the stream
 * that freed it.  Reuse is best fit among blocks at most twice the size
 * asked for: a block is handed out whole (no splitting), and its whole size
 * counts as used.
 *
 * Release threshold: CUDA gives reserved memory above it back at the next
 * stream, event or device synchronisation.  Those happen in other files,
 * so simgpu gives it back when a free is reached; after a synchronisation
 * the pool holds what CUDA's would.  cudaMemPoolTrimTo gives back CACHED
 * blocks while the pool keeps at least minBytesToKeep.
 *
 * When the arena is full, an allocation first gives back this pool's
 * cached blocks, then every pool's, then fails as CUDA does
 * (cudaErrorMemoryAllocation).
 *
 * Pool objects are never freed: queued frees point at them.  A destroyed
 * pool loses its handle, gives back its cached memory, and each of its
 * blocks goes back to the arena as it is freed.  One mutex guards
 * everything here: pools are not the launch fast path.  It is never held
 * while enqueueing (an inline stream runs the operation at once).
 */
#include <stdlib.h>
#include <string.h>

#include "simgpu_impl.h"

enum { B_LIVE = 1, B_PENDING, B_CACHED };

struct sg_pool {
	int      dead;                /* destroyed: no handle, no cache */
	int      reuse_follow;        /* cudaMemPoolReuseFollowEventDependencies   */
	int      reuse_opp;           /* cudaMemPoolReuseAllowOpportunistic        */
	int      reuse_internal;      /* cudaMemPoolReuseAllowInternalDependencies */
	uint64_t threshold;           /* cudaMemPoolAttrReleaseThreshold           */
	uint64_t max_size;            /* cudaMemPoolProps.maxSize; 0: no limit     */
	uint64_t reserved, reserved_high;
	uint64_t used, used_high;
	size_t   nidle;               /* PENDING + CACHED blocks: 0 skips scans */
	struct sg_pool *all_next;
};

/* One pool allocation; blks is sorted by address. */
struct pblk {
	char             *p;
	size_t            size;       /* bytes of its arena block */
	struct sg_pool   *pool;
	int               state;
	struct sg_stream *s;          /* PENDING / CACHED: the freeing stream */
	uint64_t          ticket;     /* of its latest free: stale frees are ignored */
};

/* What the queued free operation carries to free_reached(). */
struct free_note {
	void    *p;
	uint64_t ticket;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct sg_pool default_pool = { 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, NULL };
static struct sg_pool *current = &default_pool;   /* cudaDeviceSetMemPool's */
static struct sg_pool *all_pools = &default_pool;
static struct sg_hset handles = SG_HSET_INIT;      /* created pools */
static struct pblk *blks;
static size_t nblks, capblks;
static uint64_t next_ticket = 1;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

/* A child forked while another thread held mu must not inherit it held. */
static void after_fork_child(void)
{
	pthread_mutex_init(&mu, NULL);
}

static void fork_init(void)
{
	pthread_atfork(NULL, NULL, after_fork_child);
}

static void lock(void)
{
	pthread_once(&fork_once, fork_init);
	pthread_mutex_lock(&mu);
}

static void unlock(void)
{
	pthread_mutex_unlock(&mu);
}

/* The pool behind a handle, or NULL: a handle is only trusted once found. */
static struct sg_pool *pool_of(cudaMemPool_t h)
{
	if (!h)
		return NULL;
	if ((void *)h == (void *)&default_pool)
		return &default_pool;
	return sg_hset_has(&handles, h) ? (struct sg_pool *)h : NULL;
}

/* ---------------------------------------------------------------- blocks (mu held) */

static long blk_find(const void *p)
{
	size_t lo = 0, hi = nblks;
	const char *c = p;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (blks[mid].p < c)
			lo = mid + 1;
		else if (blks[mid].p > c)
			hi = mid;
		else
			return (long)mid;
	}
	return -1;
}

static int blk_insert(const struct pblk *b)
{
	size_t lo = 0, hi = nblks;

	if (nblks == capblks) {
		size_t nc = capblks ? capblks * 2 : 64;
		struct pblk *nb = realloc(blks, nc * sizeof(*nb));

		if (!nb)
			return -1;
		blks = nb;
		capblks = nc;
	}
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (blks[mid].p < b->p)
			lo = mid + 1;
		else
			hi = mid;
	}
	memmove(&blks[lo + 1], &blks[lo], (nblks - lo) * sizeof(*blks));
	blks[lo] = *b;
	nblks++;
	return 0;
}

static void blk_remove(size_t i)
{
	memmove(&blks[i], &blks[i + 1], (nblks - i - 1) * sizeof(*blks));
	nblks--;
}

static void note_used(struct sg_pool *pool, int64_t d)
{
	pool->used += (uint64_t)d;
	if (pool->used > pool->used_high)
		pool->used_high = pool->used;
}

static void note_reserved(struct sg_pool *pool, int64_t d)
{
	pool->reserved += (uint64_t)d;
	if (pool->reserved > pool->reserved_high)
		pool->reserved_high = pool->reserved;
}

/* Give block i back to the arena and drop its record. */
static void release(size_t i)
{
	struct pblk *b = &blks[i];

	note_reserved(b->pool, -(int64_t)b->size);
	if (b->state != B_CACHED)
		note_used(b->pool, -(int64_t)b->size);
	if (b->state != B_LIVE)
		b->pool->nidle--;
	if (sg_arena_free(b->p) != cudaSuccess)
		sg_log("pool block %p was no longer in the arena", (void *)b->p);
	blk_remove(i);
}

/*
 * Give back cached blocks of pool (every pool when NULL), largest first so
 * that few calls free much.  keep_min: TrimTo's rule, never go below keep;
 * otherwise the threshold's, stop once at or below keep.
 */
static void give_back(struct sg_pool *pool, uint64_t keep, int keep_min)
{
	if (pool && !pool->nidle)
		return;
	for (;;) {
		long best = -1;
		size_t i;

		for (i = 0; i < nblks; i++) {
			struct pblk *b = &blks[i];

			if (b->state != B_CACHED || (pool && b->pool != pool))
				continue;
			if (pool && (keep_min ? b->pool->reserved - b->size < keep
					      : b->pool->reserved <= keep))
				continue;
			if (best < 0 || b->size > blks[best].size)
				best = (long)i;
		}
		if (best < 0)
			return;
		release((size_t)best);
	}
}

/* A block pool may hand to stream s for need bytes, best fit, or -1. */
static long reusable(struct sg_pool *pool, size_t need, struct sg_stream *s)
{
	int any_stream = pool->reuse_opp || pool->reuse_internal;
	long best = -1;
	size_t i;

	if (!pool->nidle)
		return -1;        /* everything handed out: no scan */
	for (i = 0; i < nblks; i++) {
		struct pblk *b = &blks[i];

		if (b->pool != pool || b->size < need || b->size / 2 > need)
			continue;
		if (b->state == B_PENDING ? b->s != s
					  : b->state != B_CACHED || (!any_stream && b->s != s))
			continue;
		if (best < 0 || b->size < blks[best].size)
			best = (long)i;
	}
	return best;
}

/* ---------------------------------------------------------------- allocation */

/* A new arena block for pool, giving back cached memory when that helps. */
static cudaError_t grow(struct sg_pool *pool, size_t need, void **out)
{
	cudaError_t e;

	if (pool->max_size) {
		/* cudaMemPoolProps.maxSize bounds what the pool reserves */
		if (need > pool->max_size)
			return cudaErrorMemoryAllocation;
		if (pool->reserved + need > pool->max_size)
			give_back(pool, pool->max_size - need, 0);
		if (pool->reserved + need > pool->max_size)
			return cudaErrorMemoryAllocation;
	}
	e = sg_arena_alloc(need, SG_MEM_DEVICE, out);
	if (e == cudaSuccess)
		return e;
	give_back(pool, 0, 0);
	e = sg_arena_alloc(need, SG_MEM_DEVICE, out);
	if (e == cudaSuccess)
		return e;
	give_back(NULL, 0, 0);
	return sg_arena_alloc(need, SG_MEM_DEVICE, out);
}

static cudaError_t pool_malloc(void **out, size_t size, struct sg_pool *pool, struct sg_stream *s)
{
	size_t need = (size + SG_ALIGN - 1) / SG_ALIGN * SG_ALIGN;
	struct pblk b;
	cudaError_t e;
	long i;

	if (need < size)
		return cudaErrorMemoryAllocation;      /* size near SIZE_MAX */
	i = reusable(pool, need, s);
	if (i >= 0) {
		if (blks[i].state == B_CACHED)
			note_used(pool, (int64_t)blks[i].size);
		pool->nidle--;
		blks[i].state = B_LIVE;
		blks[i].ticket = 0;
		*out = blks[i].p;
		return cudaSuccess;
	}
	e = grow(pool, need, out);
	if (e != cudaSuccess)
		return e;
	b.p = *out;
	b.size = need;
	b.pool = pool;
	b.state = B_LIVE;
	b.s = s;
	b.ticket = 0;
	if (blk_insert(&b) < 0) {
		sg_arena_free(*out);
		return cudaErrorMemoryAllocation;
	}
	note_reserved(pool, (int64_t)need);
	note_used(pool, (int64_t)need);
	return cudaSuccess;
}

/* cudaMallocAsync (pool NULL: the current pool) and cudaMallocFromPoolAsync. */
cudaError_t sg_pool_malloc(void **devPtr, size_t size, cudaMemPool_t h, struct sg_stream *s)
{
	struct sg_pool *pool;
	cudaError_t e;

	if (!devPtr)
		return sg_err(cudaErrorInvalidValue);
	if (size == 0) {
		*devPtr = NULL;         /* as cudaMalloc: nothing to hand out */
		return cudaSuccess;
	}
	lock();
	pool = h ? pool_of(h) : current;
	if (!pool) {
		unlock();
		return sg_err(cudaErrorInvalidValue);
	}
	e = pool_malloc(devPtr, size, pool, s);
	unlock();
	if (e != cudaSuccess) {
		*devPtr = NULL;
		return sg_err(e);
	}
	return cudaSuccess;
}

/* ---------------------------------------------------------------- freeing */

/* The stream reached a cudaFreeAsync: the block is the pool's again. */
static void free_reached(void *arg)
{
	struct free_note *n = arg;
	struct sg_pool *pool;
	long i;

	lock();
	i = blk_find(n->p);
	/* reused by its own stream since (new ticket): the free is stale */
	if (i >= 0 && blks[i].state == B_PENDING && blks[i].ticket == n->ticket) {
		pool = blks[i].pool;
		blks[i].state = B_CACHED;
		note_used(pool, -(int64_t)blks[i].size);
		if (pool->dead)
			release((size_t)i);
		else if (pool->reserved > pool->threshold)
			give_back(pool, pool->threshold, 0);
	}
	unlock();
	free(n);
}

/*
 * cudaFreeAsync: 0 when p is no pool's (the caller frees it as any allocation),
 * else 1 with *err the call's result.
 */
int sg_pool_free_async(void *p, struct sg_stream *s, cudaError_t *err)
{
	struct free_note *n;
	struct sg_op *op;
	long i;

	lock();
	i = blk_find(p);
	unlock();
	if (i < 0)
		return 0;
	n = malloc(sizeof(*n));
	op = sg_op_new(SG_OP_HOST, 0);
	if (!n || !op) {
		free(n);
		if (op)
			sg_op_free(op);
		*err = sg_err(cudaErrorMemoryAllocation);
		return 1;
	}
	lock();
	i = blk_find(p);
	if (i < 0 || blks[i].state != B_LIVE) {
		/* freed twice, or released meanwhile by another thread's free */
		unlock();
		free(n);
		sg_op_free(op);
		*err = sg_err(cudaErrorInvalidValue);
		return 1;
	}
	blks[i].state = B_PENDING;
	blks[i].pool->nidle++;
	blks[i].s = s;
	blks[i].ticket = next_ticket++;
	n->p = p;
	n->ticket = blks[i].ticket;
	unlock();
	op->u.host.fn = free_reached;
	op->u.host.data = n;
	sg_enqueue(s, op);
	*err = cudaSuccess;
	return 1;
}

/*
 * cudaFree of pool memory (CUDA allows it; all streams are synchronised
 * by then): the block leaves its pool, the caller frees it in the arena.
 * Its bytes stay in the pool's UsedMemCurrent, as on an H200 (CUDA 13.0,
 * driver 580.159: 1 MiB cudaMallocAsync'ed then cudaFree'd left used at
 * 1 MiB, after a cudaDeviceSynchronize and a trim to 0 too; the pool's
 * reserved memory went: bench/progs/pools, bench/RESULTS.md).  Only that
 * one free was measured; that every such free leaves its bytes is our
 * extrapolation.
 * 0: not a pool block; 1: forgotten; -1: already freed.
 */
int sg_pool_forget(void *p)
{
	int rc = 0;
	long i;

	lock();
	i = blk_find(p);
	if (i >= 0) {
		struct pblk *b = &blks[i];

		if (b->state != B_LIVE) {
			rc = -1;
		} else {
			note_reserved(b->pool, -(int64_t)b->size);
			blk_remove((size_t)i);
			rc = 1;
		}
	}
	unlock();
	return rc;
}

/*
 * cudaDeviceReset freed the whole arena: forget every block, destroy the
 * created pools, and give the default pool its defaults back.
 */
void sg_pools_reset(void)
{
	struct sg_pool *pool;

	lock();
	nblks = 0;
	for (pool = all_pools; pool; pool = pool->all_next) {
		pool->reserved = pool->reserved_high = 0;
		pool->used = pool->used_high = 0;
		pool->nidle = 0;
		if (pool != &default_pool && !pool->dead) {
			pool->dead = 1;
			sg_hset_del(&handles, pool);
		}
	}
	default_pool.reuse_follow = default_pool.reuse_opp = default_pool.reuse_internal = 1;
	default_pool.threshold = 0;
	current = &default_pool;
	unlock();
}

/* ---------------------------------------------------------------- API */

static int device_ok(int device)
{
	return device == 0;
}

SG_API cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *memPool, int device)
{
	sg_init();
	if (!memPool)
		return sg_err(cudaErrorInvalidValue);
	if (!device_ok(device))
		return sg_err(cudaErrorInvalidDevice);
	*memPool = (cudaMemPool_t)&default_pool;
	return cudaSuccess;
}

SG_API cudaError_t cudaDeviceGetMemPool(cudaMemPool_t *memPool, int device)
{
	sg_init();
	if (!memPool)
		return sg_err(cudaErrorInvalidValue);
	if (!device_ok(device))
		return sg_err(cudaErrorInvalidDevice);
	lock();
	*memPool = (cudaMemPool_t)current;
	unlock();
	return cudaSuccess;
}

SG_API cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t memPool)
{
	struct sg_pool *pool;

	sg_init();
	if (!device_ok(device))
		return sg_err(cudaErrorInvalidDevice);
	lock();
	pool = pool_of(memPool);
	if (pool)
		current = pool;
	unlock();
	return pool ? cudaSuccess : sg_err(cudaErrorInvalidValue);
}

/* The location and type of the only pools simgpu has: pinned, device 0. */
static cudaError_t pool_location(const struct cudaMemLocation *loc, enum cudaMemAllocationType type)
{
	if (!loc)
		return cudaErrorInvalidValue;
	if (type != cudaMemAllocationTypePinned && type != cudaMemAllocationTypeManaged)
		return cudaErrorInvalidValue;
	switch (loc->type) {
	case cudaMemLocationTypeDevice:
		if (!device_ok(loc->id))
			return cudaErrorInvalidDevice;
		/* managed pools are not modelled */
		return type == cudaMemAllocationTypePinned ? cudaSuccess : cudaErrorNotSupported;
	case cudaMemLocationTypeHost:
	case cudaMemLocationTypeHostNuma:
	case cudaMemLocationTypeHostNumaCurrent:
		return cudaErrorNotSupported;    /* host memory pools are not modelled */
	default:
		return cudaErrorInvalidValue;
	}
}

SG_API cudaError_t cudaMemGetDefaultMemPool(cudaMemPool_t *memPool, struct cudaMemLocation *location,
					    enum cudaMemAllocationType type)
{
	cudaError_t e;

	sg_init();
	if (!memPool)
		return sg_err(cudaErrorInvalidValue);
	e = pool_location(location, type);
	if (e != cudaSuccess)
		return sg_err(e);
	return cudaDeviceGetDefaultMemPool(memPool, location->id);
}

SG_API cudaError_t cudaMemGetMemPool(cudaMemPool_t *memPool, struct cudaMemLocation *location,
				     enum cudaMemAllocationType type)
{
	cudaError_t e;

	sg_init();
	if (!memPool)
		return sg_err(cudaErrorInvalidValue);
	e = pool_location(location, type);
	if (e != cudaSuccess)
		return sg_err(e);
	return cudaDeviceGetMemPool(memPool, location->id);
}

SG_API cudaError_t cudaMemSetMemPool(struct cudaMemLocation *location, enum cudaMemAllocationType type,
				     cudaMemPool_t memPool)
{
	cudaError_t e;

	sg_init();
	e = pool_location(location, type);
	if (e != cudaSuccess)
		return sg_err(e);
	return cudaDeviceSetMemPool(location->id, memPool);
}

SG_API cudaError_t cudaMemPoolCreate(cudaMemPool_t *memPool, const struct cudaMemPoolProps *props)
{
	struct sg_pool *pool;
	cudaError_t e;
	size_t k;

	sg_init();
	if (!memPool || !props)
		return sg_err(cudaErrorInvalidValue);
	e = pool_location(&props->location, props->allocType);
	if (e != cudaSuccess)
		return sg_err(e);
	/* Exporting is not modelled (cudaMemPoolExport* are absent): a POSIX
	 * descriptor type is accepted for pools that never export, fabric
	 * handles are refused, Windows ones do not exist here. */
	if (props->handleTypes == cudaMemHandleTypeFabric)
		return sg_err(cudaErrorNotSupported);
	if ((props->handleTypes != cudaMemHandleTypeNone &&
	     props->handleTypes != cudaMemHandleTypePosixFileDescriptor) ||
	    props->win32SecurityAttributes ||
	    (props->usage & ~(unsigned)cudaMemPoolCreateUsageHwDecompress))
		return sg_err(cudaErrorInvalidValue);
	for (k = 0; k < sizeof(props->reserved); k++)
		if (props->reserved[k])
			return sg_err(cudaErrorInvalidValue);
	pool = calloc(1, sizeof(*pool));
	if (!pool)
		return sg_err(cudaErrorMemoryAllocation);
	pool->reuse_follow = pool->reuse_opp = pool->reuse_internal = 1;
	pool->max_size = props->maxSize;
	if (sg_hset_add(&handles, pool) < 0) {
		free(pool);
		return sg_err(cudaErrorMemoryAllocation);
	}
	lock();
	pool->all_next = all_pools;
	all_pools = pool;
	unlock();
	*memPool = (cudaMemPool_t)pool;
	return cudaSuccess;
}

SG_API cudaError_t cudaMemPoolDestroy(cudaMemPool_t memPool)
{
	struct sg_pool *pool;

	sg_init();
	lock();
	pool = pool_of(memPool);
	if (!pool || pool == &default_pool) {
		unlock();
		return sg_err(cudaErrorInvalidValue);
	}
	pool->dead = 1;
	sg_hset_del(&handles, pool);
	give_back(pool, 0, 0);
	if (current == pool)
		current = &default_pool;      /* as CUDA does */
	unlock();
	return cudaSuccess;
}

SG_API cudaError_t cudaMemPoolTrimTo(cudaMemPool_t memPool, size_t minBytesToKeep)
{
	struct sg_pool *pool;

	sg_init();
	lock();
	pool = pool_of(memPool);
	if (pool)
		give_back(pool, minBytesToKeep, 1);
	unlock();
	return pool ? cudaSuccess : sg_err(cudaErrorInvalidValue);
}

static cudaError_t set_attr(struct sg_pool *pool, enum cudaMemPoolAttr attr, const void *value)
{
	uint64_t v64;
	int v;

	switch (attr) {
	case cudaMemPoolReuseFollowEventDependencies:
	case cudaMemPoolReuseAllowOpportunistic:
	case cudaMemPoolReuseAllowInternalDependencies:
		memcpy(&v, value, sizeof(v));
		v = v != 0;
		if (attr == cudaMemPoolReuseFollowEventDependencies)
			pool->reuse_follow = v;
		else if (attr == cudaMemPoolReuseAllowOpportunistic)
			pool->reuse_opp = v;
		else
			pool->reuse_internal = v;
		return cudaSuccess;
	case cudaMemPoolAttrReleaseThreshold:
		memcpy(&pool->threshold, value, sizeof(pool->threshold));
		return cudaSuccess;
	case cudaMemPoolAttrReservedMemHigh:
	case cudaMemPoolAttrUsedMemHigh:
		/* only a reset to zero is allowed; a watermark cannot sit below
		 * what is held now, so it restarts from there */
		memcpy(&v64, value, sizeof(v64));
		if (v64)
			return cudaErrorInvalidValue;
		if (attr == cudaMemPoolAttrReservedMemHigh)
			pool->reserved_high = pool->reserved;
		else
			pool->used_high = pool->used;
		return cudaSuccess;
	default:
		return cudaErrorInvalidValue;   /* read-only or unknown */
	}
}

SG_API cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value)
{
	struct sg_pool *pool;
	cudaError_t e = cudaErrorInvalidValue;

	sg_init();
	if (!value)
		return sg_err(cudaErrorInvalidValue);
	lock();
	pool = pool_of(memPool);
	if (pool)
		e = set_attr(pool, attr, value);
	unlock();
	return sg_err(e);
}

static cudaError_t get_attr(const struct sg_pool *pool, enum cudaMemPoolAttr attr, void *value)
{
	uint64_t v64;
	int v;

	switch (attr) {
	case cudaMemPoolReuseFollowEventDependencies:
		v = pool->reuse_follow;
		break;
	case cudaMemPoolReuseAllowOpportunistic:
		v = pool->reuse_opp;
		break;
	case cudaMemPoolReuseAllowInternalDependencies:
		v = pool->reuse_internal;
		break;
	case cudaMemPoolAttrReleaseThreshold:   v64 = pool->threshold;     goto u64;
	case cudaMemPoolAttrReservedMemCurrent: v64 = pool->reserved;      goto u64;
	case cudaMemPoolAttrReservedMemHigh:    v64 = pool->reserved_high; goto u64;
	case cudaMemPoolAttrUsedMemCurrent:     v64 = pool->used;          goto u64;
	case cudaMemPoolAttrUsedMemHigh:        v64 = pool->used_high;     goto u64;
	default:
		return cudaErrorInvalidValue;
	}
	memcpy(value, &v, sizeof(v));
	return cudaSuccess;
u64:
	memcpy(value, &v64, sizeof(v64));
	return cudaSuccess;
}

SG_API cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t memPool, enum cudaMemPoolAttr attr, void *value)
{
	struct sg_pool *pool;
	cudaError_t e = cudaErrorInvalidValue;

	sg_init();
	if (!value)
		return sg_err(cudaErrorInvalidValue);
	lock();
	pool = pool_of(memPool);
	if (pool)
		e = get_attr(pool, attr, value);
	unlock();
	return sg_err(e);
}

/* One device: the pool's own, always read-write. */
SG_API cudaError_t cudaMemPoolSetAccess(cudaMemPool_t memPool, const struct cudaMemAccessDesc *descList,
					size_t count)
{
	size_t i;
	int ok;

	sg_init();
	lock();
	ok = pool_of(memPool) != NULL;
	unlock();
	if (!ok || (count && !descList))
		return sg_err(cudaErrorInvalidValue);
	for (i = 0; i < count; i++) {
		const struct cudaMemAccessDesc *d = &descList[i];

		if (d->location.type != cudaMemLocationTypeDevice)
			return sg_err(cudaErrorInvalidValue);
		if (!device_ok(d->location.id))
			return sg_err(cudaErrorInvalidDevice);
		if (d->flags != cudaMemAccessFlagsProtReadWrite)
			return sg_err(cudaErrorInvalidValue);  /* the owner keeps access */
	}
	return cudaSuccess;
}

SG_API cudaError_t cudaMemPoolGetAccess(enum cudaMemAccessFlags *flags, cudaMemPool_t memPool,
					struct cudaMemLocation *location)
{
	int ok;

	sg_init();
	lock();
	ok = pool_of(memPool) != NULL;
	unlock();
	if (!ok || !flags || !location)
		return sg_err(cudaErrorInvalidValue);
	switch (location->type) {
	case cudaMemLocationTypeDevice:
		if (!device_ok(location->id))
			return sg_err(cudaErrorInvalidDevice);
		*flags = cudaMemAccessFlagsProtReadWrite;
		return cudaSuccess;
	case cudaMemLocationTypeHost:
	case cudaMemLocationTypeHostNuma:
	case cudaMemLocationTypeHostNumaCurrent:
		*flags = cudaMemAccessFlagsProtNone;   /* device memory */
		return cudaSuccess;
	default:
		return sg_err(cudaErrorInvalidValue);
	}
}

static cudaError_t from_pool(void **ptr, size_t size, cudaMemPool_t memPool, cudaStream_t stream,
			     int ptsz)
{
	struct sg_stream *s;

	sg_init();
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	if (!memPool)
		return sg_err(cudaErrorInvalidValue);
	return sg_pool_malloc(ptr, size, memPool, s);
}

SG_API cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t memPool,
					   cudaStream_t stream)
{
	return from_pool(ptr, size, memPool, stream, 0);
}

SG_API cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t memPool,
						cudaStream_t stream)
{
	return from_pool(ptr, size, memPool, stream, 1);
}
