/*
 * green.c - green contexts (CUDA 12.4+): SM resources, their split into
 * partitions, descriptors, green contexts and their streams.
 *
 * A green context is a context whose kernels run on a partition of the
 * device's SMs.  Here it is a context record (init.c lists it, so
 * cuCtxFromGreenCtx's handle works wherever a CUcontext does) plus an SM
 * count.  Its streams are the runtime's, tagged with that count
 * (simgpu_drv_stream_set_green): the device model caps each of their
 * kernels to it, as it caps a process to its MPS percentage (exec.c).
 * Which SMs a partition holds is not modelled, only how many.
 *
 * The split follows cuda.h's guideline per compute capability (sm_90:
 * groups of at least 8 SMs, a multiple of 8; with
 * CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING by TPC, 2 SMs) and what
 * an H200 (132 SMs, CUDA 13.0, driver 580.159; bench/gpu/green_probe.cu
 * split, bench/RESULTS.md) did: a size past the device is the whole device
 * (132 -> 132, not an error), the device's smCoscheduledAlignment is 8,
 * and coscheduled groups keep to the chip's GPCs, so the device made 15
 * groups of 8 and left 12 SMs, not 16 and 4 (groups_fit() below).  A
 * CUdevResource carries our tag in its _internal_padding: where it came
 * from and which split made it, so that a split result is not split again
 * and a descriptor takes resources of one split only, as cuda.h requires.
 *
 * Records (descriptors, green contexts) are never freed: a destroyed or
 * garbage handle is an error, not a crash.
 */
#include <stdlib.h>
#include <string.h>

#include "drv.h"

#define GREEN_MAGIC 0x6e657267u                /* "gren"                 */
#define DESC_MAGIC  0x63736564u                /* "desc"                 */
#define RES_MAGIC   0x73657273u                /* "sres"                 */

enum { RES_DEVICE = 1, RES_GROUP, RES_REMAINING, RES_GREEN };

/* what simgpu keeps in a CUdevResource's _internal_padding */
struct res_tag {
	uint32_t magic;
	uint32_t origin;                       /* RES_*                       */
	uint64_t split;                        /* the split that made it, 0   */
};

_Static_assert(sizeof(struct res_tag) <= sizeof(((CUdevResource *)0)->_internal_padding),
	       "the tag fits CUDA's padding");

struct drv_desc {
	uint32_t         magic;
	unsigned         sms;
	struct drv_desc *next;
};

struct drv_green {
	uint32_t          magic;
	int               live;
	unsigned          sms;
	unsigned long long id;
	struct drv_ctx    ctx;                 /* cuCtxFromGreenCtx's        */
	CUstream          stream;              /* CU_GREEN_CTX_DEFAULT_STREAM */
	struct drv_green *next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct drv_desc *descs;                 /* never freed */
static struct drv_green *greens;               /* never freed */
static uint64_t splits;                        /* under mu */
static unsigned long long green_ids;           /* under mu */

/* ---------------------------------------------------------------- rules */

/* Minimum partition and its granularity for this device (cuda.h's
 * guideline per compute capability). */
static CUresult sm_rules(unsigned flags, unsigned *min, unsigned *align)
{
	int major = 0;
	CUresult r = drv_err(simgpu_drv_device_attr(&major,
						   CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR));

	if (r != CUDA_SUCCESS)
		return r;
	if (flags & CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING) {
		*min = 2, *align = 2;          /* one TPC */
	} else if (major >= 9) {
		*min = 8, *align = 8;
	} else if (major == 8) {
		*min = 4, *align = 2;
	} else {
		*min = 2, *align = 2;
	}
	return CUDA_SUCCESS;
}

/* An SM resource of n SMs, tagged. */
static void res_make(CUdevResource *res, unsigned n, unsigned min, unsigned align, int origin,
		     uint64_t split)
{
	struct res_tag tag = { RES_MAGIC, (uint32_t)origin, split };

	memset(res, 0, sizeof(*res));
	res->type = CU_DEV_RESOURCE_TYPE_SM;
	memcpy(res->_internal_padding, &tag, sizeof(tag));
	res->sm.smCount = n;
	res->sm.minSmPartitionSize = min;
	res->sm.smCoscheduledAlignment = align;
}

/* The tag of an SM resource we made, or CUDA_ERROR_INVALID_* */
static CUresult res_tag_of(const CUdevResource *res, struct res_tag *tag)
{
	if (res->type != CU_DEV_RESOURCE_TYPE_SM)
		return CUDA_ERROR_INVALID_RESOURCE_TYPE;
	memcpy(tag, res->_internal_padding, sizeof(*tag));
	if (tag->magic != RES_MAGIC || tag->origin < RES_DEVICE || tag->origin > RES_GREEN)
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

/* An SM resource of n SMs as the device, a context or a green context has. */
static CUresult whole(CUdevResource *res, CUdevResourceType type, unsigned n, int origin)
{
	unsigned min, align;
	CUresult r;

	if (!res)
		return CUDA_ERROR_INVALID_VALUE;
	if (type != CU_DEV_RESOURCE_TYPE_SM)
		return CUDA_ERROR_INVALID_RESOURCE_TYPE;
	r = sm_rules(0, &min, &align);
	if (r != CUDA_SUCCESS)
		return r;
	/* the H200 said 8 for its 132 SMs (not a divisor: the GPCs differ) */
	res_make(res, n, min, align, origin, 0);
	return CUDA_SUCCESS;
}

/*
 * How many groups of `size` SMs a split of `total` makes.  What was
 * measured (an H200 and an H100, 132 SMs each): coscheduled groups of 8
 * are 15, with 12 SMs left -- they keep to the chip's GPCs (TPCs
 * 9,9,9,8,8,8,8,7 is a layout that gives that; the layout itself was not
 * read).  Groups of 16, 24, 32, 64, 72, 104 and 128 on the H100 were as
 * many as fit (8, 5, 4, 2, 1, 1, 1), which is the rule here for every
 * other size; other SM counts were not measured.
 */
static unsigned groups_fit(unsigned size, unsigned total, unsigned flags)
{
	if (total == 132 && size == 8 && !(flags & CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING))
		return 15;
	return size <= total ? total / size : 0;
}

/* The device's SMs.  Under an MPS percentage the SM-count attribute says
 * the client's share (as a GPU's does); what cuDeviceGetDevResource says
 * there has not been measured, so simgpu keeps the whole device, which is
 * what it says without MPS and what the shim's partitions see (it clears
 * the percentage when it uses them). */
static CUresult device_sms(unsigned *n)
{
	int v = 0;
	CUresult r = drv_err(simgpu_drv_device_sms(&v));

	if (r == CUDA_SUCCESS && v <= 0)
		r = CUDA_ERROR_INVALID_DEVICE;
	*n = (unsigned)v;
	return r;
}

DRV_API CUresult cuDeviceGetDevResource(CUdevice device, CUdevResource *resource,
					CUdevResourceType type)
{
	unsigned n;
	CUresult r;

	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (device != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	r = device_sms(&n);
	return r != CUDA_SUCCESS ? r : whole(resource, type, n, RES_DEVICE);
}

/* ---------------------------------------------------------------- green records */

static struct drv_green *green_of(CUgreenCtx h)
{
	struct drv_green *g;

	pthread_mutex_lock(&mu);
	for (g = greens; g; g = g->next)
		if (g == (struct drv_green *)h && g->live)
			break;
	pthread_mutex_unlock(&mu);
	return g;
}

/* An entry point's green context: CUDA's error when the driver is not
 * initialised or h names no live green context. */
static CUresult green_get(CUgreenCtx h, struct drv_green **g)
{
	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	*g = green_of(h);
	return *g ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static int desc_known(CUdevResourceDesc h)
{
	struct drv_desc *d;

	pthread_mutex_lock(&mu);
	for (d = descs; d; d = d->next)
		if (d == (struct drv_desc *)h)
			break;
	pthread_mutex_unlock(&mu);
	return d != NULL;
}

/* A context's SMs: a green context's partition, else the device's. */
DRV_API CUresult cuCtxGetDevResource(CUcontext hCtx, CUdevResource *resource,
				     CUdevResourceType type)
{
	struct drv_ctx *c = (struct drv_ctx *)hCtx;
	unsigned n;
	CUresult r;

	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!drv_ctx_valid(c))
		return CUDA_ERROR_INVALID_CONTEXT;
	if (c->green)
		return whole(resource, type, c->green->sms, RES_GREEN);
	r = device_sms(&n);
	return r != CUDA_SUCCESS ? r : whole(resource, type, n, RES_DEVICE);
}

DRV_API CUresult cuGreenCtxGetDevResource(CUgreenCtx hCtx, CUdevResource *resource,
					  CUdevResourceType type)
{
	struct drv_green *g;
	CUresult r = green_get(hCtx, &g);

	if (r != CUDA_SUCCESS)
		return r;
	return whole(resource, type, g->sms, RES_GREEN);
}

/* ---------------------------------------------------------------- split */

static CUresult split_check(const unsigned *nb, const CUdevResource *input, unsigned flags,
			    struct res_tag *tag)
{
	CUresult r;

	if (!nb || !input)
		return CUDA_ERROR_INVALID_VALUE;
	if (flags & ~(unsigned)(CU_DEV_SM_RESOURCE_SPLIT_IGNORE_SM_COSCHEDULING |
				CU_DEV_SM_RESOURCE_SPLIT_MAX_POTENTIAL_CLUSTER_SIZE))
		return CUDA_ERROR_INVALID_VALUE;
	r = res_tag_of(input, tag);
	if (r != CUDA_SUCCESS)
		return r;
	/* a split's result is split again only through a green context */
	if (tag->origin == RES_GROUP || tag->origin == RES_REMAINING)
		return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
	return CUDA_SUCCESS;
}

/*
 * Groups of minCount SMs, rounded up to the granularity (at least the
 * minimum partition), as many as fit and as asked (*nbGroups in; out: how
 * many were made, or with result NULL how many would be); the rest go to
 * remaining.  A group larger than the input is an impossible request.
 */
DRV_API CUresult cuDevSmResourceSplitByCount(CUdevResource *result, unsigned int *nbGroups,
					     const CUdevResource *input,
					     CUdevResource *remaining, unsigned int useFlags,
					     unsigned int minCount)
{
	unsigned min, align, size, fit, made, i;
	struct res_tag tag;
	uint64_t id;
	CUresult r;

	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	r = split_check(nbGroups, input, useFlags, &tag);
	if (r != CUDA_SUCCESS)
		return r;
	if (result && *nbGroups == 0)
		return CUDA_ERROR_INVALID_VALUE;
	if (minCount > input->sm.smCount)
		return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
	r = sm_rules(useFlags, &min, &align);
	if (r != CUDA_SUCCESS)
		return r;
	size = minCount < min ? min : (minCount + align - 1) / align * align;
	if (size > input->sm.smCount)
		size = input->sm.smCount;      /* the H200: 132 -> all 132 */
	fit = groups_fit(size, input->sm.smCount, useFlags);
	if (fit == 0)
		return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
	if (!result) {
		*nbGroups = fit;
		return CUDA_SUCCESS;
	}
	made = *nbGroups < fit ? *nbGroups : fit;
	pthread_mutex_lock(&mu);
	id = ++splits;
	pthread_mutex_unlock(&mu);
	for (i = 0; i < made; i++)
		res_make(&result[i], size, min, align, RES_GROUP, id);
	if (remaining)
		res_make(remaining, input->sm.smCount - made * size, min,
			 input->sm.smCoscheduledAlignment, RES_REMAINING, id);
	*nbGroups = made;
	return CUDA_SUCCESS;
}

/*
 * One descriptor of the resources' SMs together.  More than one must come
 * from the same split (its groups and its remaining), as cuda.h says.
 */
DRV_API CUresult cuDevResourceGenerateDesc(CUdevResourceDesc *phDesc, CUdevResource *resources,
					   unsigned int nbResources)
{
	struct res_tag tag, first;
	struct drv_desc *d;
	unsigned long long sms = 0;
	unsigned i;
	CUresult r;

	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!phDesc || !resources || nbResources == 0)
		return CUDA_ERROR_INVALID_VALUE;
	for (i = 0; i < nbResources; i++) {
		r = res_tag_of(&resources[i], &tag);
		if (r != CUDA_SUCCESS)
			return r;
		if (i == 0)
			first = tag;
		else if (tag.split == 0 || tag.split != first.split)
			return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
		sms += resources[i].sm.smCount;
	}
	if (sms == 0 || sms > 1u << 20)
		return CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
	d = calloc(1, sizeof(*d));
	if (!d)
		return CUDA_ERROR_OUT_OF_MEMORY;
	d->magic = DESC_MAGIC;
	d->sms = (unsigned)sms;
	pthread_mutex_lock(&mu);
	d->next = descs;
	descs = d;
	pthread_mutex_unlock(&mu);
	*phDesc = (CUdevResourceDesc)(void *)d;
	return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- green contexts */

/* A green context's stream: the runtime's, capped to its SMs. */
static CUresult green_stream(struct drv_green *g, CUstream *ph, unsigned flags, int prio)
{
	void *s = NULL;
	CUresult r = drv_err(simgpu_drv_stream_create(&s, flags, prio));

	if (r != CUDA_SUCCESS)
		return r;
	r = drv_err(simgpu_drv_stream_set_green(s, g, g->sms));
	if (r != CUDA_SUCCESS) {
		(void)simgpu_drv_stream_destroy(s);
		return r;
	}
	*ph = (CUstream)s;
	return CUDA_SUCCESS;
}

/*
 * The default stream (CU_GREEN_CTX_DEFAULT_STREAM, required) is where NULL
 * and CU_STREAM_LEGACY launch in the green context.  It is a blocking
 * stream of the device, so that copies and syncs on the NULL stream (the
 * device's legacy one here) stay ordered with it.
 */
DRV_API CUresult cuGreenCtxCreate(CUgreenCtx *phCtx, CUdevResourceDesc desc, CUdevice dev,
				  unsigned int flags)
{
	struct drv_desc *d = (struct drv_desc *)desc;
	struct drv_green *g;
	CUresult r;

	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (dev != 0)
		return CUDA_ERROR_INVALID_DEVICE;
	if (!phCtx || !desc_known(desc) || flags != CU_GREEN_CTX_DEFAULT_STREAM)
		return CUDA_ERROR_INVALID_VALUE;
	g = calloc(1, sizeof(*g));
	if (!g)
		return CUDA_ERROR_OUT_OF_MEMORY;
	g->magic = GREEN_MAGIC;
	g->sms = d->sms;
	g->ctx.magic = CTX_MAGIC;
	g->ctx.green = g;
	r = green_stream(g, &g->stream, 0, 0);
	if (r != CUDA_SUCCESS) {
		free(g);                       /* never published */
		return r;
	}
	drv_ctx_add(&g->ctx);
	pthread_mutex_lock(&mu);
	g->id = ++green_ids;
	g->live = 1;
	g->next = greens;
	greens = g;
	pthread_mutex_unlock(&mu);
	*phCtx = (CUgreenCtx)(void *)g;
	return CUDA_SUCCESS;
}

/* Streams made with cuGreenCtxStreamCreate stay (cuda.h: the caller
 * destroys them first) and keep their SM cap. */
DRV_API CUresult cuGreenCtxDestroy(CUgreenCtx hCtx)
{
	struct drv_green *g;
	CUresult r = green_get(hCtx, &g);

	if (r != CUDA_SUCCESS)
		return r;
	pthread_mutex_lock(&mu);
	g->live = 0;
	pthread_mutex_unlock(&mu);
	drv_ctx_retire(&g->ctx);
	/* its work still runs, in order, before the stream object is reused */
	(void)simgpu_drv_stream_destroy(g->stream);
	drv_mods_of_ctx_unload(&g->ctx);
	return CUDA_SUCCESS;
}

DRV_API CUresult cuCtxFromGreenCtx(CUcontext *pContext, CUgreenCtx hCtx)
{
	struct drv_green *g;

	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!pContext)
		return CUDA_ERROR_INVALID_VALUE;
	g = green_of(hCtx);
	if (!g)
		return CUDA_ERROR_INVALID_CONTEXT;
	*pContext = (CUcontext)(void *)&g->ctx;
	return CUDA_SUCCESS;
}

DRV_API CUresult cuGreenCtxGetId(CUgreenCtx greenCtx, unsigned long long *greenCtxId)
{
	struct drv_green *g;
	struct drv_ctx *c;

	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!greenCtxId)
		return CUDA_ERROR_INVALID_VALUE;
	if (!greenCtx) {
		/* NULL: the current context's, when it is a green one */
		if (drv_ctx_check(&c) != CUDA_SUCCESS || !c->green)
			return CUDA_ERROR_INVALID_CONTEXT;
		greenCtx = (CUgreenCtx)(void *)c->green;
	}
	g = green_of(greenCtx);
	if (!g)
		return CUDA_ERROR_INVALID_CONTEXT;
	*greenCtxId = g->id;
	return CUDA_SUCCESS;
}

/* CU_STREAM_NON_BLOCKING is required (cuda.h); priority clamped as ever. */
DRV_API CUresult cuGreenCtxStreamCreate(CUstream *phStream, CUgreenCtx greenCtx,
					unsigned int flags, int priority)
{
	struct drv_green *g;

	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!phStream || flags != CU_STREAM_NON_BLOCKING)
		return CUDA_ERROR_INVALID_VALUE;
	g = green_of(greenCtx);
	if (!g)
		return CUDA_ERROR_INVALID_CONTEXT;
	return green_stream(g, phStream, flags, priority);
}

DRV_API CUresult cuStreamGetGreenCtx(CUstream hStream, CUgreenCtx *phCtx)
{
	struct drv_ctx *c;
	void *g = NULL;
	CUresult r = drv_ctx_check(&c);

	if (r != CUDA_SUCCESS)
		return r;
	if (!phCtx)
		return CUDA_ERROR_INVALID_VALUE;
	if (!hStream || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD) {
		/* a special stream: the current context's green context */
		*phCtx = (CUgreenCtx)(void *)c->green;
		return CUDA_SUCCESS;
	}
	r = drv_err(simgpu_drv_stream_green_of(hStream, 0, &g));
	if (r == CUDA_SUCCESS)
		*phCtx = (CUgreenCtx)g;
	return r;
}

/*
 * Record and wait on the green context's default stream.  A GPU's record
 * captures the work of all the green context's streams; simgpu's captures
 * only the default stream's (work on cuGreenCtxStreamCreate streams is
 * not in it: record on those streams with cuEventRecord).
 */
DRV_API CUresult cuGreenCtxRecordEvent(CUgreenCtx hCtx, CUevent hEvent)
{
	struct drv_green *g;
	CUresult r = green_get(hCtx, &g);

	if (r != CUDA_SUCCESS)
		return r;
	if (!hEvent)
		return CUDA_ERROR_INVALID_HANDLE;
	return drv_err(simgpu_drv_event_record(hEvent, g->stream, 0));
}

DRV_API CUresult cuGreenCtxWaitEvent(CUgreenCtx hCtx, CUevent hEvent)
{
	struct drv_green *g;
	CUresult r = green_get(hCtx, &g);

	if (r != CUDA_SUCCESS)
		return r;
	if (!hEvent)
		return CUDA_ERROR_INVALID_HANDLE;
	return drv_err(simgpu_drv_stream_wait_event(g->stream, hEvent, 0, 0));
}

/* ---------------------------------------------------------------- launches */

CUstream drv_green_stream(struct drv_ctx *c, CUstream s, int *ptsz)
{
	if (!c || !c->green || (s && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD))
		return s;
	*ptsz = 0;
	return c->green->stream;
}
