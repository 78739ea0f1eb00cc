/*
 * hints.c - what an application tells the driver about where memory should
 * live and how a stream should use the caches, none of which changes what a
 * program computes: managed-memory advice and prefetches
 * (cudaMemAdvise, cudaMemPrefetchAsync, cudaStreamAttachMemAsync,
 * cudaMemRangeGetAttribute[s]) and stream attributes (L2 access policy
 * window, synchronisation policy, priority, memory sync domain;
 * cudaStreamSet/GetAttribute, cudaStreamCopyAttributes,
 * cudaCtxResetPersistingL2Cache).
 *
 * simgpu's managed memory is arena memory the host and the "device" share,
 * so nothing ever migrates.  The calls are validated as CUDA validates them
 * (a range must lie inside one managed allocation, else
 * cudaErrorInvalidValue) and what they set is recorded, so that
 * cudaMemRangeGetAttribute answers what CUDA would.  Advice is recorded per
 * range: a sorted array of segments, each a page-aligned piece of one
 * allocation with its own advice; pieces never advised have the defaults
 * (no read-mostly, no preferred location, accessed by nobody, never
 * prefetched).  Ranges are rounded out to CPU pages, as CUDA rounds them,
 * and clipped to their allocation.
 *
 * A prefetch records its location at the call: CUDA documents that the last
 * prefetch location is the one last asked for, whether or not the
 * migration has begun.  It also queues a host operation in its stream that
 * does nothing, so that the prefetch has its place in stream order (an
 * event recorded after it completes after it) and costs no device time:
 * kernels are not charged for page faults on managed memory here either.
 * cudaStreamAttachMemAsync is ordered the same way.
 *
 * Stream attributes live in a side table keyed by the stream object; the
 * device model does not use them (it has no L2 and schedules no priority).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "simgpu_impl.h"

/* stream.c's; the CUDA headers declare _ptsz names only for per-thread builds */
cudaError_t cudaStreamGetPriority_ptsz(cudaStream_t hStream, int *priority);

#define PAGE       4096UL             /* CPU page: how CUDA rounds ranges */
#define ACC_HOST   1u                 /* cudaMemAdviseSetAccessedBy: host  */
#define ACC_DEV0   2u                 /*                             device 0 */

/* ---------------------------------------------------------------- range records */

struct seg {
	uintptr_t lo, hi;                 /* [lo, hi) inside one allocation */
	int       read_mostly;
	unsigned  accessed;               /* ACC_* */
	struct cudaMemLocation pref;      /* type Invalid: none            */
	struct cudaMemLocation last;      /* type Invalid: never prefetched */
};

static pthread_mutex_t seg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct seg *segs;
static size_t nsegs, capsegs;

static int same_loc(struct cudaMemLocation a, struct cudaMemLocation b)
{
	return a.type == b.type && (a.type == cudaMemLocationTypeInvalid || a.id == b.id);
}

static int same_advice(const struct seg *a, const struct seg *b)
{
	return a->read_mostly == b->read_mostly && a->accessed == b->accessed &&
	       same_loc(a->pref, b->pref) && same_loc(a->last, b->last);
}

/* First segment ending after x; seg_mu held. */
static size_t seg_first(uintptr_t x)
{
	size_t lo = 0, hi = nsegs;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (segs[mid].hi <= x)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static int seg_reserve(size_t more)
{
	size_t nc = capsegs ? capsegs : 32;
	struct seg *ns;

	while (nc < nsegs + more)
		nc *= 2;
	if (nc == capsegs)
		return 0;
	ns = realloc(segs, nc * sizeof(*ns));
	if (!ns)
		return -1;
	segs = ns;
	capsegs = nc;
	return 0;
}

/* Insert s at index i; room reserved beforehand. */
static void seg_insert(size_t i, const struct seg *s)
{
	memmove(&segs[i + 1], &segs[i], (nsegs - i) * sizeof(*segs));
	segs[i] = *s;
	nsegs++;
}

/* Make x a segment boundary; room reserved beforehand. */
static void seg_split(uintptr_t x)
{
	size_t i = seg_first(x);
	struct seg right;

	if (i == nsegs || segs[i].lo >= x)
		return;
	right = segs[i];
	right.lo = x;
	segs[i].hi = x;
	seg_insert(i + 1, &right);
}

static void seg_default(struct seg *s, uintptr_t lo, uintptr_t hi)
{
	memset(s, 0, sizeof(*s));
	s->lo = lo;
	s->hi = hi;
	s->pref.type = cudaMemLocationTypeInvalid;
	s->last.type = cudaMemLocationTypeInvalid;
}

/* Join touching neighbours with equal advice; seg_mu held. */
static void seg_merge(void)
{
	size_t i, o = 0;

	for (i = 0; i < nsegs; i++) {
		if (o && segs[o - 1].hi == segs[i].lo && same_advice(&segs[o - 1], &segs[i]))
			segs[o - 1].hi = segs[i].hi;
		else
			segs[o++] = segs[i];
	}
	nsegs = o;
}

typedef void (*seg_fn)(struct seg *s, const void *arg);

/*
 * Apply fn to every page of [lo, hi), creating default segments where none
 * is; all or nothing: the room is reserved before anything changes.
 */
static cudaError_t seg_apply(uintptr_t lo, uintptr_t hi, seg_fn fn, const void *arg)
{
	uintptr_t cur = lo;
	size_t i, inside;

	pthread_mutex_lock(&seg_mu);
	for (i = seg_first(lo), inside = 0; i < nsegs && segs[i].lo < hi; i++)
		inside++;
	/* two splits, and a gap before each segment inside plus one after */
	if (seg_reserve(inside + 3) < 0) {
		pthread_mutex_unlock(&seg_mu);
		return cudaErrorMemoryAllocation;
	}
	seg_split(lo);
	seg_split(hi);
	i = seg_first(lo);
	while (cur < hi) {
		if (i == nsegs || segs[i].lo > cur) {
			struct seg gap;
			uintptr_t end = i < nsegs && segs[i].lo < hi ? segs[i].lo : hi;

			seg_default(&gap, cur, end);
			seg_insert(i, &gap);
		}
		fn(&segs[i], arg);
		cur = segs[i].hi;
		i++;
	}
	seg_merge();
	pthread_mutex_unlock(&seg_mu);
	return cudaSuccess;
}

/* What [lo, hi) has in common: the query side of seg_apply. */
struct summary {
	int      read_mostly;       /* every page */
	unsigned accessed;          /* by every page */
	int      pref_same, last_same;
	struct cudaMemLocation pref, last;
};

static void summarise(uintptr_t lo, uintptr_t hi, struct summary *m)
{
	uintptr_t cur = lo;
	int first = 1;
	size_t i;

	pthread_mutex_lock(&seg_mu);
	i = seg_first(lo);
	while (cur < hi) {
		struct seg piece;

		if (i < nsegs && segs[i].lo <= cur) {
			piece = segs[i++];
		} else {
			uintptr_t end = i < nsegs && segs[i].lo < hi ? segs[i].lo : hi;

			seg_default(&piece, cur, end);
		}
		if (first) {
			m->read_mostly = piece.read_mostly;
			m->accessed = piece.accessed;
			m->pref = piece.pref;
			m->last = piece.last;
			m->pref_same = m->last_same = 1;
			first = 0;
		} else {
			m->read_mostly &= piece.read_mostly;
			m->accessed &= piece.accessed;
			m->pref_same &= same_loc(m->pref, piece.pref);
			m->last_same &= same_loc(m->last, piece.last);
		}
		cur = piece.hi;
	}
	pthread_mutex_unlock(&seg_mu);
	if (!m->pref_same)
		m->pref.type = cudaMemLocationTypeInvalid;
	if (!m->last_same)
		m->last.type = cudaMemLocationTypeInvalid;
}

/* cudaFree of managed memory: its advice goes with it (memory.c). */
void sg_hints_forget(const void *p)
{
	void *base;
	size_t size, i, o = 0;
	int kind;
	uintptr_t lo, hi;

	if (!sg_arena_find(p, &base, &size, &kind) || kind != SG_MEM_MANAGED)
		return;
	lo = (uintptr_t)base;
	hi = lo + size;
	pthread_mutex_lock(&seg_mu);
	for (i = 0; i < nsegs; i++)
		if (segs[i].hi <= lo || segs[i].lo >= hi)
			segs[o++] = segs[i];
	nsegs = o;
	pthread_mutex_unlock(&seg_mu);
}

/* cudaDeviceReset freed every allocation. */
void sg_hints_reset(void)
{
	pthread_mutex_lock(&seg_mu);
	nsegs = 0;
	pthread_mutex_unlock(&seg_mu);
}

/*
 * [p, p + n) inside one managed allocation of this process, rounded out to
 * pages and clipped to the allocation.
 */
static cudaError_t managed_range(const void *p, size_t n, uintptr_t *lo, uintptr_t *hi)
{
	void *base;
	size_t size, off;
	int kind;
	uintptr_t b, a;

	if (!p || !n)
		return cudaErrorInvalidValue;
	if (!sg_arena_find(p, &base, &size, &kind) || kind != SG_MEM_MANAGED)
		return cudaErrorInvalidValue;
	b = (uintptr_t)base;
	off = (uintptr_t)p - b;
	if (n > size - off)
		return cudaErrorInvalidValue;
	a = (uintptr_t)p & ~(PAGE - 1);
	*lo = a < b ? b : a;
	a = ((uintptr_t)p + n + PAGE - 1) & ~(PAGE - 1);
	*hi = a > b + size ? b + size : a;
	return cudaSuccess;
}

/*
 * A location as recorded: device 0, the host, or host NUMA node 0 (where
 * allowed).  Other devices do not exist; other location types are invalid.
 */
static cudaError_t norm_loc(struct cudaMemLocation in, int numa_ok, struct cudaMemLocation *out)
{
	switch (in.type) {
	case cudaMemLocationTypeDevice:
		if (in.id != 0)
			return cudaErrorInvalidDevice;
		out->type = cudaMemLocationTypeDevice;
		out->id = 0;
		return cudaSuccess;
	case cudaMemLocationTypeHost:
		out->type = cudaMemLocationTypeHost;
		out->id = 0;                  /* ignored, as CUDA ignores it */
		return cudaSuccess;
	case cudaMemLocationTypeHostNuma:
		if (!numa_ok || in.id != 0)    /* one host NUMA node */
			return cudaErrorInvalidValue;
		*out = in;
		return cudaSuccess;
	case cudaMemLocationTypeHostNumaCurrent:
		if (!numa_ok)
			return cudaErrorInvalidValue;
		out->type = cudaMemLocationTypeHostNuma;
		out->id = 0;
		return cudaSuccess;
	default:
		return cudaErrorInvalidValue;
	}
}

/* The pre-CUDA-12 device id of a location: a GPU, the CPU, or none. */
static int legacy_id(struct cudaMemLocation l)
{
	switch (l.type) {
	case cudaMemLocationTypeDevice:
		return l.id;
	case cudaMemLocationTypeHost:
	case cudaMemLocationTypeHostNuma:
		return cudaCpuDeviceId;
	default:
		return cudaInvalidDeviceId;
	}
}

/* ---------------------------------------------------------------- advice */

struct advice {
	enum cudaMemoryAdvise  what;
	struct cudaMemLocation loc;
	unsigned               acc;   /* ACC_* of loc, for the accessed-by advice */
};

static void advise_seg(struct seg *s, const void *arg)
{
	const struct advice *a = arg;

	switch (a->what) {
	case cudaMemAdviseSetReadMostly:          s->read_mostly = 1; break;
	case cudaMemAdviseUnsetReadMostly:        s->read_mostly = 0; break;
	case cudaMemAdviseSetPreferredLocation:   s->pref = a->loc; break;
	case cudaMemAdviseUnsetPreferredLocation: s->pref.type = cudaMemLocationTypeInvalid; break;
	case cudaMemAdviseSetAccessedBy:          s->accessed |= a->acc; break;
	case cudaMemAdviseUnsetAccessedBy:        s->accessed &= ~a->acc; break;
	}
}

SG_API cudaError_t cudaMemAdvise(const void *devPtr, size_t count, enum cudaMemoryAdvise advice,
				 struct cudaMemLocation location)
{
	struct advice a;
	uintptr_t lo, hi;
	cudaError_t e;

	sg_init();
	e = managed_range(devPtr, count, &lo, &hi);
	if (e != cudaSuccess)
		return sg_err(e);
	memset(&a, 0, sizeof(a));
	a.what = advice;
	switch (advice) {
	case cudaMemAdviseSetReadMostly:
	case cudaMemAdviseUnsetReadMostly:
	case cudaMemAdviseUnsetPreferredLocation:
		break;                          /* the location is ignored */
	case cudaMemAdviseSetPreferredLocation:
		e = norm_loc(location, 1, &a.loc);
		break;
	case cudaMemAdviseSetAccessedBy:
	case cudaMemAdviseUnsetAccessedBy:
		/* a device or the host; NUMA nodes are invalid here */
		e = norm_loc(location, 0, &a.loc);
		a.acc = a.loc.type == cudaMemLocationTypeDevice ? ACC_DEV0 : ACC_HOST;
		break;
	default:
		e = cudaErrorInvalidValue;
	}
	if (e == cudaSuccess)
		e = seg_apply(lo, hi, advise_seg, &a);
	return sg_err(e);
}

/* ---------------------------------------------------------------- prefetch, attach */

static void set_last(struct seg *s, const void *arg)
{
	s->last = *(const struct cudaMemLocation *)arg;
}

/* The operation that holds a prefetch's or an attach's place in its stream. */
static void in_order(void *arg)
{
	(void)arg;
}

static cudaError_t enqueue_marker(struct sg_stream *s)
{
	struct sg_op *op = sg_op_new(SG_OP_HOST, 0);

	if (!op)
		return cudaErrorMemoryAllocation;
	op->u.host.fn = in_order;
	op->u.host.data = NULL;
	sg_enqueue(s, op);
	return cudaSuccess;
}

/* Validate one prefetch; *lo, *hi, *loc: what to record. */
static cudaError_t prefetch_check(const void *p, size_t n, struct cudaMemLocation in,
				  uintptr_t *lo, uintptr_t *hi, struct cudaMemLocation *loc)
{
	cudaError_t e = managed_range(p, n, lo, hi);

	return e != cudaSuccess ? e : norm_loc(in, 1, loc);
}

static cudaError_t prefetch(const void *devPtr, size_t count, struct cudaMemLocation location,
			    unsigned int flags, cudaStream_t stream, int ptsz)
{
	struct cudaMemLocation loc;
	struct sg_stream *s;
	uintptr_t lo, hi;
	cudaError_t e;

	sg_init();
	if (flags)
		return sg_err(cudaErrorInvalidValue);
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	e = prefetch_check(devPtr, count, location, &lo, &hi, &loc);
	if (e == cudaSuccess)
		e = seg_apply(lo, hi, set_last, &loc);
	if (e == cudaSuccess)
		e = enqueue_marker(s);
	return sg_err(e);
}

SG_API cudaError_t cudaMemPrefetchAsync(const void *devPtr, size_t count, struct cudaMemLocation location,
					unsigned int flags, cudaStream_t stream)
{
	return prefetch(devPtr, count, location, flags, stream, 0);
}

SG_API cudaError_t cudaMemPrefetchAsync_ptsz(const void *devPtr, size_t count,
					     struct cudaMemLocation location, unsigned int flags,
					     cudaStream_t stream)
{
	return prefetch(devPtr, count, location, flags, stream, 1);
}

/* The location of batch entry i: prefetchLocIdxs[k] starts location k. */
static size_t batch_loc(const size_t *idxs, size_t nlocs, size_t i)
{
	size_t k = 0;

	while (k + 1 < nlocs && idxs[k + 1] <= i)
		k++;
	return k;
}

static cudaError_t prefetch_batch(void **dptrs, size_t *sizes, size_t count,
				  struct cudaMemLocation *locs, size_t *idxs, size_t nlocs,
				  unsigned long long flags, cudaStream_t stream, int ptsz)
{
	struct cudaMemLocation loc;
	struct sg_stream *s;
	uintptr_t lo, hi;
	cudaError_t e;
	size_t i, k;

	sg_init();
	if (flags || !count || !dptrs || !sizes || !locs || !idxs || !nlocs || nlocs > count ||
	    idxs[0] != 0)
		return sg_err(cudaErrorInvalidValue);
	for (k = 1; k < nlocs; k++)
		if (idxs[k] <= idxs[k - 1] || idxs[k] >= count)
			return sg_err(cudaErrorInvalidValue);
	/* the legacy NULL stream is refused by CUDA */
	if (!ptsz && (!stream || stream == cudaStreamLegacy))
		return sg_err(cudaErrorInvalidValue);
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	/* all checked before anything is recorded */
	for (i = 0; i < count; i++) {
		e = prefetch_check(dptrs[i], sizes[i], locs[batch_loc(idxs, nlocs, i)], &lo, &hi, &loc);
		if (e != cudaSuccess)
			return sg_err(e);
	}
	for (i = 0; i < count; i++) {
		prefetch_check(dptrs[i], sizes[i], locs[batch_loc(idxs, nlocs, i)], &lo, &hi, &loc);
		e = seg_apply(lo, hi, set_last, &loc);
		if (e != cudaSuccess)
			return sg_err(e);
	}
	return sg_err(enqueue_marker(s));
}

SG_API cudaError_t cudaMemPrefetchBatchAsync(void **dptrs, size_t *sizes, size_t count,
					     struct cudaMemLocation *prefetchLocs,
					     size_t *prefetchLocIdxs, size_t numPrefetchLocs,
					     unsigned long long flags, cudaStream_t stream)
{
	return prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs,
			      flags, stream, 0);
}

SG_API cudaError_t cudaMemPrefetchBatchAsync_ptsz(void **dptrs, size_t *sizes, size_t count,
						  struct cudaMemLocation *prefetchLocs,
						  size_t *prefetchLocIdxs, size_t numPrefetchLocs,
						  unsigned long long flags, cudaStream_t stream)
{
	return prefetch_batch(dptrs, sizes, count, prefetchLocs, prefetchLocIdxs, numPrefetchLocs,
			      flags, stream, 1);
}

static cudaError_t attach(cudaStream_t stream, void *devPtr, size_t length, unsigned int flags,
			  int ptsz)
{
	struct sg_stream *s;
	void *base;
	size_t size;
	int kind;

	sg_init();
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost && flags != cudaMemAttachSingle)
		return sg_err(cudaErrorInvalidValue);
	/* "illegal to attach singly to the NULL stream" */
	if (flags == cudaMemAttachSingle && s == sg_stream_legacy())
		return sg_err(cudaErrorInvalidValue);
	if (!devPtr || !sg_arena_find(devPtr, &base, &size, &kind) || kind != SG_MEM_MANAGED)
		return sg_err(cudaErrorInvalidValue);
	/* the whole allocation (length 0 or its size: the arena rounds sizes
	 * up to SG_ALIGN, so any length that rounds to it) */
	if (length && (devPtr != base || (length + SG_ALIGN - 1) / SG_ALIGN * SG_ALIGN != size))
		return sg_err(cudaErrorInvalidValue);
	return sg_err(enqueue_marker(s));
}

SG_API cudaError_t cudaStreamAttachMemAsync(cudaStream_t stream, void *devPtr, size_t length,
					    unsigned int flags)
{
	return attach(stream, devPtr, length, flags, 0);
}

SG_API cudaError_t cudaStreamAttachMemAsync_ptsz(cudaStream_t stream, void *devPtr, size_t length,
						 unsigned int flags)
{
	return attach(stream, devPtr, length, flags, 1);
}

/* ---------------------------------------------------------------- range queries */

static cudaError_t range_attr(void *data, size_t size, enum cudaMemRangeAttribute attr,
			      const struct summary *m)
{
	int v, *out = data;
	size_t i, n;

	if (!data)
		return cudaErrorInvalidValue;
	switch (attr) {
	case cudaMemRangeAttributeReadMostly:
		v = m->read_mostly;
		break;
	case cudaMemRangeAttributePreferredLocation:
		v = legacy_id(m->pref);
		break;
	case cudaMemRangeAttributeLastPrefetchLocation:
		v = legacy_id(m->last);
		break;
	case cudaMemRangeAttributePreferredLocationType:
		v = (int)m->pref.type;
		break;
	case cudaMemRangeAttributeLastPrefetchLocationType:
		v = (int)m->last.type;
		break;
	case cudaMemRangeAttributePreferredLocationId:
		v = m->pref.type == cudaMemLocationTypeInvalid ? cudaInvalidDeviceId : m->pref.id;
		break;
	case cudaMemRangeAttributeLastPrefetchLocationId:
		v = m->last.type == cudaMemLocationTypeInvalid ? cudaInvalidDeviceId : m->last.id;
		break;
	case cudaMemRangeAttributeAccessedBy:
		if (size == 0 || size % sizeof(int))
			return cudaErrorInvalidValue;
		n = size / sizeof(int);
		i = 0;
		if ((m->accessed & ACC_DEV0) && i < n)
			out[i++] = 0;
		if ((m->accessed & ACC_HOST) && i < n)
			out[i++] = cudaCpuDeviceId;
		while (i < n)
			out[i++] = cudaInvalidDeviceId;
		return cudaSuccess;
	default:
		return cudaErrorInvalidValue;
	}
	if (size != sizeof(int))
		return cudaErrorInvalidValue;
	memcpy(data, &v, sizeof(v));
	return cudaSuccess;
}

SG_API cudaError_t cudaMemRangeGetAttribute(void *data, size_t dataSize,
					    enum cudaMemRangeAttribute attribute, const void *devPtr,
					    size_t count)
{
	struct summary m;
	uintptr_t lo, hi;
	cudaError_t e;

	sg_init();
	e = managed_range(devPtr, count, &lo, &hi);
	if (e != cudaSuccess)
		return sg_err(e);
	summarise(lo, hi, &m);
	return sg_err(range_attr(data, dataSize, attribute, &m));
}

SG_API cudaError_t cudaMemRangeGetAttributes(void **data, size_t *dataSizes,
					     enum cudaMemRangeAttribute *attributes,
					     size_t numAttributes, const void *devPtr, size_t count)
{
	struct summary m;
	uintptr_t lo, hi;
	cudaError_t e;
	size_t i;

	sg_init();
	if (!numAttributes || !data || !dataSizes || !attributes)
		return sg_err(cudaErrorInvalidValue);
	e = managed_range(devPtr, count, &lo, &hi);
	if (e != cudaSuccess)
		return sg_err(e);
	summarise(lo, hi, &m);
	for (i = 0; i < numAttributes; i++) {
		e = range_attr(data[i], dataSizes[i], attributes[i], &m);
		if (e != cudaSuccess)
			return sg_err(e);
	}
	return cudaSuccess;
}

/* ---------------------------------------------------------------- stream attributes */

/* The stream attributes CUDA 13 knows; a bit of `set` per attribute. */
struct sattr {
	struct sg_stream             *s;
	unsigned                      set;     /* 1 << cudaLaunchAttributeID */
	struct cudaAccessPolicyWindow apw;
	enum cudaSynchronizationPolicy sync;
	int                           prio;
	cudaLaunchMemSyncDomainMap    dmap;
	cudaLaunchMemSyncDomain       dom;
	unsigned                      nvlink;
};

static pthread_mutex_t sa_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sattr *sas;
static size_t nsas, capsas;

/* The record of s, made when `make`; NULL if none (or out of memory). */
static struct sattr *sa_of(struct sg_stream *s, int make)
{
	size_t i;

	for (i = 0; i < nsas; i++)
		if (sas[i].s == s)
			return &sas[i];
	if (!make)
		return NULL;
	if (nsas == capsas) {
		size_t nc = capsas ? capsas * 2 : 16;
		struct sattr *n = realloc(sas, nc * sizeof(*n));

		if (!n)
			return NULL;
		sas = n;
		capsas = nc;
	}
	memset(&sas[nsas], 0, sizeof(*sas));
	sas[nsas].s = s;
	return &sas[nsas++];
}

/*
 * A destroyed stream's object is reused for a later stream (stream.c):
 * its attributes must not come back with it.  stream.c may call this on
 * cudaStreamDestroy.
 */
void sg_stream_attr_forget(struct sg_stream *s)
{
	size_t i;

	pthread_mutex_lock(&sa_mu);
	for (i = 0; i < nsas; i++)
		if (sas[i].s == s) {
			sas[i] = sas[--nsas];
			break;
		}
	pthread_mutex_unlock(&sa_mu);
}

static cudaError_t check_apw(const struct cudaAccessPolicyWindow *w)
{
	/* cudaDevAttrMaxAccessPolicyWindowSize (device.c) */
	if (w->num_bytes > 134213632)
		return cudaErrorInvalidValue;
	if (!(w->hitRatio >= 0.0f && w->hitRatio <= 1.0f))
		return cudaErrorInvalidValue;
	if ((unsigned)w->hitProp > cudaAccessPropertyPersisting)
		return cudaErrorInvalidValue;
	/* missProp: normal or streaming only */
	if ((unsigned)w->missProp > cudaAccessPropertyStreaming)
		return cudaErrorInvalidValue;
	return cudaSuccess;
}

static cudaError_t check_value(cudaLaunchAttributeID id, const cudaLaunchAttributeValue *v)
{
	switch (id) {
	case cudaLaunchAttributeAccessPolicyWindow:
		return check_apw(&v->accessPolicyWindow);
	case cudaLaunchAttributeSynchronizationPolicy:
		return v->syncPolicy >= cudaSyncPolicyAuto && v->syncPolicy <= cudaSyncPolicyBlockingSync
		       ? cudaSuccess : cudaErrorInvalidValue;
	case cudaLaunchAttributeMemSyncDomain:
		return (unsigned)v->memSyncDomain <= cudaLaunchMemSyncDomainRemote
		       ? cudaSuccess : cudaErrorInvalidValue;
	case cudaLaunchAttributePriority:
	case cudaLaunchAttributeMemSyncDomainMap:
	case cudaLaunchAttributeNvlinkUtilCentricScheduling:
		return cudaSuccess;
	default:
		return cudaErrorInvalidValue;   /* not a stream attribute */
	}
}

static cudaError_t set_attr(cudaStream_t stream, cudaLaunchAttributeID id,
			    const cudaLaunchAttributeValue *v, int ptsz)
{
	struct sg_stream *s;
	struct sattr *a;
	cudaError_t e;

	sg_init();
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	if (!v)
		return sg_err(cudaErrorInvalidValue);
	e = check_value(id, v);
	if (e != cudaSuccess)
		return sg_err(e);
	pthread_mutex_lock(&sa_mu);
	a = sa_of(s, 1);
	if (!a) {
		pthread_mutex_unlock(&sa_mu);
		return sg_err(cudaErrorMemoryAllocation);
	}
	switch (id) {
	case cudaLaunchAttributeAccessPolicyWindow:
		a->apw = v->accessPolicyWindow;
		break;
	case cudaLaunchAttributeSynchronizationPolicy:
		a->sync = v->syncPolicy;
		break;
	case cudaLaunchAttributePriority:
		/* clamped to [greatest, least] = [-5, 0] as stream creation does */
		a->prio = v->priority < -5 ? -5 : v->priority > 0 ? 0 : v->priority;
		break;
	case cudaLaunchAttributeMemSyncDomainMap:
		a->dmap = v->memSyncDomainMap;
		break;
	case cudaLaunchAttributeMemSyncDomain:
		a->dom = v->memSyncDomain;
		break;
	default:
		a->nvlink = v->nvlinkUtilCentricScheduling;
		break;
	}
	a->set |= 1u << id;
	pthread_mutex_unlock(&sa_mu);
	return cudaSuccess;
}

SG_API cudaError_t cudaStreamSetAttribute(cudaStream_t hStream, cudaLaunchAttributeID attr,
					  const cudaLaunchAttributeValue *value)
{
	return set_attr(hStream, attr, value, 0);
}

SG_API cudaError_t cudaStreamSetAttribute_ptsz(cudaStream_t hStream, cudaLaunchAttributeID attr,
					       const cudaLaunchAttributeValue *value)
{
	return set_attr(hStream, attr, value, 1);
}

static cudaError_t get_attr(cudaStream_t stream, cudaLaunchAttributeID id,
			    cudaLaunchAttributeValue *v, int ptsz)
{
	struct sattr a, *r;
	struct sg_stream *s;
	cudaError_t e;

	sg_init();
	s = sg_stream_resolve(stream, ptsz);
	if (!s)
		return sg_err(cudaErrorInvalidResourceHandle);
	if (!v)
		return sg_err(cudaErrorInvalidValue);
	pthread_mutex_lock(&sa_mu);
	r = sa_of(s, 0);
	if (r)
		a = *r;
	else
		memset(&a, 0, sizeof(a));
	pthread_mutex_unlock(&sa_mu);
	memset(v, 0, sizeof(*v));
	switch (id) {
	case cudaLaunchAttributeAccessPolicyWindow:
		v->accessPolicyWindow = a.apw;   /* unset: all zero, no window */
		return cudaSuccess;
	case cudaLaunchAttributeSynchronizationPolicy:
		v->syncPolicy = a.set & (1u << id) ? a.sync : cudaSyncPolicyAuto;
		return cudaSuccess;
	case cudaLaunchAttributePriority:
		if (a.set & (1u << id)) {
			v->priority = a.prio;
			return cudaSuccess;
		}
		/* never set: the priority the stream was created with */
		e = ptsz ? cudaStreamGetPriority_ptsz(stream, &v->priority)
			 : cudaStreamGetPriority(stream, &v->priority);
		return sg_err(e);
	case cudaLaunchAttributeMemSyncDomainMap:
		if (a.set & (1u << id))
			v->memSyncDomainMap = a.dmap;
		else
			v->memSyncDomainMap.remote = 1;   /* default 0, remote 1 */
		return cudaSuccess;
	case cudaLaunchAttributeMemSyncDomain:
		v->memSyncDomain = a.dom;
		return cudaSuccess;
	case cudaLaunchAttributeNvlinkUtilCentricScheduling:
		v->nvlinkUtilCentricScheduling = a.nvlink;
		return cudaSuccess;
	default:
		return sg_err(cudaErrorInvalidValue);
	}
}

SG_API cudaError_t cudaStreamGetAttribute(cudaStream_t hStream, cudaLaunchAttributeID attr,
					  cudaLaunchAttributeValue *value_out)
{
	return get_attr(hStream, attr, value_out, 0);
}

SG_API cudaError_t cudaStreamGetAttribute_ptsz(cudaStream_t hStream, cudaLaunchAttributeID attr,
					       cudaLaunchAttributeValue *value_out)
{
	return get_attr(hStream, attr, value_out, 1);
}

static cudaError_t copy_attrs(cudaStream_t dst, cudaStream_t src, int ptsz)
{
	struct sg_stream *d, *s;
	struct sattr *from, *to;
	cudaError_t e = cudaSuccess;

	sg_init();
	d = sg_stream_resolve(dst, ptsz);
	s = sg_stream_resolve(src, ptsz);
	if (!d || !s)
		return sg_err(cudaErrorInvalidResourceHandle);
	if (d == s)
		return cudaSuccess;
	/* what was set on src replaces what was set on dst; a priority never
	 * set stays the one each stream was created with */
	pthread_mutex_lock(&sa_mu);
	to = sa_of(d, 1);
	from = sa_of(s, 0);            /* after: sa_of(d, 1) may move the table */
	if (!to) {
		e = cudaErrorMemoryAllocation;
	} else if (from) {
		*to = *from;
		to->s = d;
	} else {
		memset(to, 0, sizeof(*to));
		to->s = d;
	}
	pthread_mutex_unlock(&sa_mu);
	return sg_err(e);
}

SG_API cudaError_t cudaStreamCopyAttributes(cudaStream_t dst, cudaStream_t src)
{
	return copy_attrs(dst, src, 0);
}

SG_API cudaError_t cudaStreamCopyAttributes_ptsz(cudaStream_t dst, cudaStream_t src)
{
	return copy_attrs(dst, src, 1);
}

/* No L2 is modelled: there are no persisting lines to reset. */
SG_API cudaError_t cudaCtxResetPersistingL2Cache(void)
{
	sg_init();
	return cudaSuccess;
}
