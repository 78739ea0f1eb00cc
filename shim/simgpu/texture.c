/*
 * texture.c - texture and surface objects: their creation and queries
 * (cudaCreateTextureObject, cudaCreateSurfaceObject, ...) and the sampling
 * functions host twins call in place of tex2D, surf2Dwrite, ... (the API
 * is documented in simgpu_twin.h).
 *
 * Handles.  An object lives in a slot of a table that only grows; its
 * handle is (generation << 32) | (slot + 1), so 0 is never a handle, a
 * destroyed object's handle stops working even after its slot is reused,
 * and a garbage value is looked up, never dereferenced.  Twins sample under
 * the table's read lock: destroying an object a twin still samples (an
 * application bug) waits for the sample instead of freeing under it.
 *
 * Sampling follows the CUDA Programming Guide, appendix "Texture Fetching"
 * (sections "Nearest-Point Sampling", "Linear Filtering", "Table Lookup")
 * and the addressing modes of "Texture Memory" (Programming Interface):
 *   - normalized coordinates are scaled by the size N of their dimension;
 *   - wrap replaces x by frac(x) = x - floor(x), mirror by frac(x) or
 *     1 - frac(x) as floor(x) is even or odd, both before scaling; they are
 *     only supported with normalized coordinates and act as clamp without
 *     (cudaCreateTextureObject's documentation);
 *   - point sampling: tex(x) = T[i], i = floor(x);
 *   - linear filtering: xB = x - 0.5, i = floor(xB), alpha = frac(xB),
 *     tex(x) = (1 - alpha) T[i] + alpha T[i + 1] (and its 2D/3D products),
 *     "where alpha is stored in 9-bit fixed point format with 8 bits of
 *     fractional value" - we round alpha to a multiple of 1/256;
 *   - texel indices outside [0, N) are clamped (clamp: the guide's linear
 *     filtering figure is flat beyond the edge texels' centres), wrapped or
 *     mirrored, or read as the border colour (border).
 * Linear memory (tex1Dfetch) is not addressed or filtered: an index out of
 * range reads zeros.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "simgpu_impl.h"
#include "texture.h"

#define CHUNK      1024
#define MAX_CHUNKS 1024         /* a million live objects */

enum { OBJ_FREE, OBJ_TEX, OBJ_SURF };

struct obj {
	uint32_t gen;              /* bumped at every create */
	int      kind;             /* OBJ_* */
	int      next_free;        /* free list, slot index or -1 */
	struct cudaResourceDesc     res;
	struct cudaTextureDesc      td;
	struct cudaResourceViewDesc view;
	struct sg_array *arr;      /* reference, for array resources */
	/* what the sampler needs, resolved at creation */
	struct sg_fmt fmt;
	const char *base;
	size_t   n[3];             /* texels per dimension, 1 when unused */
	int      dims;             /* 1, 2 or 3 */
	size_t   es, pitch, slice;
	int      linear;           /* cudaResourceTypeLinear: no addressing */
	int      as_norm;          /* integer data read as normalized float */
};

static pthread_rwlock_t tab_lock = PTHREAD_RWLOCK_INITIALIZER;
static struct obj *chunks[MAX_CHUNKS];
static int nslots;              /* slots ever handed out */
static int free_head = -1;

static struct obj *slot(int i)
{
	return &chunks[i / CHUNK][i % CHUNK];
}

/* The object of a handle if it is live and of that kind; tab_lock held. */
static struct obj *lookup(unsigned long long h, int kind)
{
	uint64_t idx = (h & 0xffffffffULL);
	struct obj *o;

	if (idx == 0 || idx > (uint64_t)nslots)
		return NULL;
	o = slot((int)(idx - 1));
	if (o->kind != kind || o->gen != (uint32_t)(h >> 32))
		return NULL;
	return o;
}

/* A new slot, write lock held; -1 when out of memory or slots. */
static int slot_alloc(void)
{
	int i = free_head;

	if (i >= 0) {
		free_head = slot(i)->next_free;
		return i;
	}
	if (nslots >= CHUNK * MAX_CHUNKS)
		return -1;
	if (!chunks[nslots / CHUNK]) {
		chunks[nslots / CHUNK] = calloc(CHUNK, sizeof(struct obj));
		if (!chunks[nslots / CHUNK])
			return -1;
	}
	return nslots++;
}

/* ---------------------------------------------------------------- resources */

/*
 * What CUDA's documentation requires of linear and pitch2D resources.  The
 * base must be aligned to cudaDeviceProp::textureAlignment (512); simgpu
 * asks for 256, its cudaMalloc's alignment, because a GPU's cudaMalloc
 * happens to return 512-aligned memory and programs rely on it.
 */
#define TEX_ALIGN   SG_ALIGN
#define PITCH_ALIGN 32          /* cudaDeviceProp::texturePitchAlignment */
#define MAX_1D_LINEAR (1ULL << 28)
#define MAX_2D_LINEAR 131072

/* Resolve r into o's sampler fields; takes an array reference. */
static cudaError_t resolve(struct obj *o, const struct cudaResourceDesc *r)
{
	struct sg_array *a;
	size_t span;

	switch (r->resType) {
	case cudaResourceTypeArray:
		a = sg_array_get(r->res.array.array);
		if (!a)
			return cudaErrorInvalidResourceHandle;
		o->arr = a;
		o->fmt = a->fmt;
		o->base = a->data;
		o->es = a->es;
		o->pitch = a->pitch;
		o->slice = a->slice;
		o->n[0] = a->w;
		o->n[1] = a->h ? a->h : 1;
		o->n[2] = a->d ? a->d : 1;
		o->dims = a->d ? 3 : a->h ? 2 : 1;
		return cudaSuccess;
	case cudaResourceTypeLinear:
		if (sg_fmt_of(&r->res.linear.desc, &o->fmt) < 0)
			return cudaErrorInvalidChannelDescriptor;
		o->es = sg_fmt_size(&o->fmt);
		if (!r->res.linear.devPtr || (uintptr_t)r->res.linear.devPtr % TEX_ALIGN ||
		    r->res.linear.sizeInBytes < o->es ||
		    r->res.linear.sizeInBytes / o->es > MAX_1D_LINEAR ||
		    !sg_dev_range_ok(r->res.linear.devPtr, r->res.linear.sizeInBytes))
			return cudaErrorInvalidValue;
		o->base = r->res.linear.devPtr;
		o->n[0] = r->res.linear.sizeInBytes / o->es;
		o->n[1] = o->n[2] = 1;
		o->pitch = o->slice = r->res.linear.sizeInBytes;
		o->dims = 1;
		o->linear = 1;
		return cudaSuccess;
	case cudaResourceTypePitch2D:
		if (sg_fmt_of(&r->res.pitch2D.desc, &o->fmt) < 0)
			return cudaErrorInvalidChannelDescriptor;
		o->es = sg_fmt_size(&o->fmt);
		if (!r->res.pitch2D.devPtr || (uintptr_t)r->res.pitch2D.devPtr % TEX_ALIGN ||
		    r->res.pitch2D.width == 0 || r->res.pitch2D.height == 0 ||
		    r->res.pitch2D.width > MAX_2D_LINEAR || r->res.pitch2D.height > MAX_2D_LINEAR ||
		    r->res.pitch2D.pitchInBytes % PITCH_ALIGN ||
		    r->res.pitch2D.pitchInBytes < r->res.pitch2D.width * o->es)
			return cudaErrorInvalidValue;
		span = (r->res.pitch2D.height - 1) * r->res.pitch2D.pitchInBytes +
		       r->res.pitch2D.width * o->es;
		if (!sg_dev_range_ok(r->res.pitch2D.devPtr, span))
			return cudaErrorInvalidValue;
		o->base = r->res.pitch2D.devPtr;
		o->n[0] = r->res.pitch2D.width;
		o->n[1] = r->res.pitch2D.height;
		o->n[2] = 1;
		o->pitch = r->res.pitch2D.pitchInBytes;
		o->slice = o->pitch * o->n[1];
		o->dims = 2;
		return cudaSuccess;
	case cudaResourceTypeMipmappedArray:
		sg_log("mipmapped-array textures are not modelled");
		return cudaErrorInvalidValue;
	}
	return cudaErrorInvalidValue;
}

static int tex_desc_ok(const struct cudaTextureDesc *t)
{
	int i;

	for (i = 0; i < 3; i++)
		if ((unsigned)t->addressMode[i] > cudaAddressModeBorder)
			return 0;
	return (unsigned)t->filterMode <= cudaFilterModeLinear &&
	       (unsigned)t->readMode <= cudaReadModeNormalizedFloat &&
	       (unsigned)t->mipmapFilterMode <= cudaFilterModeLinear;
}

/* A view may only restate the resource: simgpu reinterprets no formats. */
static int view_ok(const struct obj *o, const struct cudaResourceViewDesc *v)
{
	if (v->format != cudaResViewFormatNone || v->firstMipmapLevel || v->lastMipmapLevel ||
	    v->firstLayer || v->lastLayer)
		return 0;
	return v->width == o->n[0] && (v->height == 0 || v->height == o->n[1]) &&
	       (v->depth == 0 || v->depth == o->n[2]);
}

static cudaError_t create(unsigned long long *out, int kind, const struct cudaResourceDesc *r,
			  const struct cudaTextureDesc *t, const struct cudaResourceViewDesc *v)
{
	struct obj tmp, *o;
	cudaError_t e;
	int i;

	sg_init();
	if (!out || !r || (kind == OBJ_TEX && !t))
		return sg_err(cudaErrorInvalidValue);
	if (kind == OBJ_TEX && !tex_desc_ok(t))
		return sg_err(cudaErrorInvalidValue);
	memset(&tmp, 0, sizeof(tmp));
	if (kind == OBJ_SURF && r->resType != cudaResourceTypeArray)
		return sg_err(cudaErrorInvalidValue);
	e = resolve(&tmp, r);
	if (kind == OBJ_TEX && e != cudaSuccess)
		e = cudaErrorInvalidValue;      /* the only code it documents */
	if (e == cudaSuccess && kind == OBJ_SURF && !(tmp.arr->flags & cudaArraySurfaceLoadStore))
		e = cudaErrorInvalidValue;
	if (e == cudaSuccess && kind == OBJ_TEX && v && !view_ok(&tmp, v)) {
		sg_log("texture resource views that change format, levels or layers "
		       "are not modelled");
		e = cudaErrorInvalidValue;
	}
	if (e != cudaSuccess) {
		sg_array_put(tmp.arr);
		return sg_err(e);
	}
	tmp.kind = kind;
	tmp.res = *r;
	if (t) {
		tmp.td = *t;
		/* only 8- and 16-bit integers are promoted (header docs) */
		tmp.as_norm = tmp.fmt.norm || (t->readMode == cudaReadModeNormalizedFloat &&
					       tmp.fmt.kind != SG_FK_FLOAT && tmp.fmt.bits <= 16);
		if (t->sRGB)
			sg_log("texture sRGB conversion is not modelled");
	}
	if (v)
		tmp.view = *v;
	pthread_rwlock_wrlock(&tab_lock);
	i = slot_alloc();
	if (i < 0) {
		pthread_rwlock_unlock(&tab_lock);
		sg_array_put(tmp.arr);
		return sg_err(cudaErrorMemoryAllocation);
	}
	o = slot(i);
	tmp.gen = o->gen + 1 ? o->gen + 1 : 1;
	tmp.next_free = -1;
	*o = tmp;
	*out = ((unsigned long long)o->gen << 32) | (unsigned long long)(i + 1);
	pthread_rwlock_unlock(&tab_lock);
	return cudaSuccess;
}

static cudaError_t destroy(unsigned long long h, int kind)
{
	struct sg_array *a = NULL;
	struct obj *o;

	sg_init();
	if (h == 0)
		return cudaSuccess;       /* like freeing NULL */
	pthread_rwlock_wrlock(&tab_lock);
	o = lookup(h, kind);
	if (o) {
		a = o->arr;
		o->arr = NULL;
		o->kind = OBJ_FREE;
		o->next_free = free_head;
		free_head = (int)((h & 0xffffffffULL) - 1);
	}
	pthread_rwlock_unlock(&tab_lock);
	if (!o)
		return sg_err(cudaErrorInvalidValue);
	sg_array_put(a);
	return cudaSuccess;
}

/*
 * cudaDeviceReset: every texture and surface object goes, then every array
 * (whose storage the arena is about to lose).  Twins no longer run then.
 */
void sg_textures_reset(void)
{
	struct sg_array **drop;
	int i, n = 0;

	pthread_rwlock_wrlock(&tab_lock);
	drop = calloc((size_t)nslots + 1, sizeof(*drop));
	for (i = 0; i < nslots; i++) {
		struct obj *o = slot(i);

		if (o->kind == OBJ_FREE)
			continue;
		if (drop)
			drop[n++] = o->arr;    /* else leaked: no memory to do better */
		o->arr = NULL;
		o->kind = OBJ_FREE;
		o->next_free = free_head;
		free_head = i;
	}
	pthread_rwlock_unlock(&tab_lock);
	for (i = 0; i < n; i++)
		sg_array_put(drop[i]);
	free(drop);
	sg_arrays_reset();
}

/* Copy out a descriptor of a live object. */
static cudaError_t query(unsigned long long h, int kind, struct cudaResourceDesc *r,
			 struct cudaTextureDesc *t, struct cudaResourceViewDesc *v)
{
	struct obj *o;

	sg_init();
	if (!r && !t && !v)
		return sg_err(cudaErrorInvalidValue);
	pthread_rwlock_rdlock(&tab_lock);
	o = lookup(h, kind);
	if (o) {
		if (r)
			*r = o->res;
		if (t)
			*t = o->td;
		if (v)
			*v = o->view;
	}
	pthread_rwlock_unlock(&tab_lock);
	return o ? cudaSuccess : sg_err(cudaErrorInvalidValue);
}

SG_API cudaError_t cudaCreateTextureObject(cudaTextureObject_t *pTexObject,
					   const struct cudaResourceDesc *pResDesc,
					   const struct cudaTextureDesc *pTexDesc,
					   const struct cudaResourceViewDesc *pResViewDesc)
{
	return create(pTexObject, OBJ_TEX, pResDesc, pTexDesc, pResViewDesc);
}

SG_API cudaError_t cudaDestroyTextureObject(cudaTextureObject_t texObject)
{
	return destroy(texObject, OBJ_TEX);
}

SG_API cudaError_t cudaGetTextureObjectResourceDesc(struct cudaResourceDesc *pResDesc,
						    cudaTextureObject_t texObject)
{
	if (!pResDesc)
		return sg_err(cudaErrorInvalidValue);
	return query(texObject, OBJ_TEX, pResDesc, NULL, NULL);
}

SG_API cudaError_t cudaGetTextureObjectTextureDesc(struct cudaTextureDesc *pTexDesc,
						   cudaTextureObject_t texObject)
{
	if (!pTexDesc)
		return sg_err(cudaErrorInvalidValue);
	return query(texObject, OBJ_TEX, NULL, pTexDesc, NULL);
}

SG_API cudaError_t cudaGetTextureObjectResourceViewDesc(struct cudaResourceViewDesc *pResViewDesc,
							cudaTextureObject_t texObject)
{
	if (!pResViewDesc)
		return sg_err(cudaErrorInvalidValue);
	return query(texObject, OBJ_TEX, NULL, NULL, pResViewDesc);
}

SG_API cudaError_t cudaCreateSurfaceObject(cudaSurfaceObject_t *pSurfObject,
					   const struct cudaResourceDesc *pResDesc)
{
	return create(pSurfObject, OBJ_SURF, pResDesc, NULL, NULL);
}

SG_API cudaError_t cudaDestroySurfaceObject(cudaSurfaceObject_t surfObject)
{
	return destroy(surfObject, OBJ_SURF);
}

SG_API cudaError_t cudaGetSurfaceObjectResourceDesc(struct cudaResourceDesc *pResDesc,
						    cudaSurfaceObject_t surfObject)
{
	if (!pResDesc)
		return sg_err(cudaErrorInvalidValue);
	return query(surfObject, OBJ_SURF, pResDesc, NULL, NULL);
}

/* ---------------------------------------------------------------- sampling */

static atomic_int warned;

/* A bad handle from a twin: zeros, and one line with SIMGPU_DEBUG. */
static int bad_handle(const char *fn, unsigned long long h)
{
	if (!atomic_exchange(&warned, 1))
		sg_log("%s: %#llx is not a live object of its kind; reading zeros "
		       "(further bad handles are not logged)", fn, h);
	return -1;
}

/* IEEE half to float, subnormals and specials included. */
static float half_to_float(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, bits;
	float f;

	if (e == 0) {
		f = ldexpf((float)m, -24);      /* zero or subnormal */
		return sign ? -f : f;
	}
	if (e == 31)
		bits = sign | 0x7f800000u | (m << 13);
	else
		bits = sign | ((e + 112) << 23) | (m << 13);
	memcpy(&f, &bits, sizeof(f));
	return f;
}

/* Channel c of the element at p, as an integer (sign- or zero-extended). */
static int64_t raw_int(const struct sg_fmt *f, const char *p, int c)
{
	switch (f->bits) {
	case 8:
		return f->kind == SG_FK_SIGNED ? (int64_t)((const int8_t *)p)[c] :
						 (int64_t)((const uint8_t *)p)[c];
	case 16: {
		uint16_t v;

		memcpy(&v, p + 2 * c, 2);
		return f->kind == SG_FK_SIGNED ? (int64_t)(int16_t)v : (int64_t)v;
	}
	default: {
		uint32_t v;

		memcpy(&v, p + 4 * c, 4);
		return f->kind == SG_FK_SIGNED ? (int64_t)(int32_t)v : (int64_t)v;
	}
	}
}

/* One texel as a float fetch returns it (simgpu_twin.h). */
static void texel_f(const struct obj *o, const char *p, float out[4])
{
	const struct sg_fmt *f = &o->fmt;
	int c;

	for (c = 0; c < f->nch; c++) {
		if (f->kind == SG_FK_FLOAT && f->bits == 32) {
			memcpy(&out[c], p + 4 * c, 4);
		} else if (f->kind == SG_FK_FLOAT) {
			uint16_t hv;

			memcpy(&hv, p + 2 * c, 2);
			out[c] = half_to_float(hv);
		} else if (o->as_norm) {
			/* Programming Guide, "Texture Memory": [0, 1] or [-1, 1] */
			int64_t v = raw_int(f, p, c);
			float full = (float)((1LL << (f->kind == SG_FK_SIGNED ? f->bits - 1 : f->bits)) - 1);

			out[c] = (float)v / full;
			if (out[c] < -1.0f)
				out[c] = -1.0f;    /* -128 / 127 reads as -1 */
		} else {
			out[c] = (float)raw_int(f, p, c);
		}
	}
	for (; c < 4; c++)
		out[c] = 0;
}

/* One texel as an element-type (integer) fetch returns it. */
static void texel_i(const struct obj *o, const char *p, int out[4])
{
	const struct sg_fmt *f = &o->fmt;
	int c;

	for (c = 0; c < f->nch; c++) {
		if (f->kind == SG_FK_FLOAT) {
			uint32_t bits = 0;

			memcpy(&bits, p + (f->bits / 8) * c, f->bits / 8);
			out[c] = (int)bits;
		} else {
			out[c] = (int)(uint32_t)raw_int(f, p, c);
		}
	}
	for (; c < 4; c++)
		out[c] = 0;
}

/* The border colour: floats, or for integer fetches their bit patterns
 * (cudaCreateTextureObject: integer border colours are reinterpret_cast). */
static void border_f(const struct obj *o, float out[4])
{
	int c;

	for (c = 0; c < 4; c++)
		out[c] = c < o->fmt.nch ? o->td.borderColor[c] : 0;
}

static void border_i(const struct obj *o, int out[4])
{
	int c;

	for (c = 0; c < 4; c++) {
		out[c] = 0;
		if (c < o->fmt.nch)
			memcpy(&out[c], &o->td.borderColor[c], sizeof(int));
	}
}

/* The address mode of dimension d as it applies (wrap and mirror need
 * normalized coordinates; without them CUDA switches to clamp). */
static int mode_of(const struct obj *o, int d)
{
	int m = o->td.addressMode[d];

	if (!o->td.normalizedCoords && (m == cudaAddressModeWrap || m == cudaAddressModeMirror))
		return cudaAddressModeClamp;
	return m;
}

/* Texel index i of a dimension of n texels under mode m; -1: the border. */
static long address(long i, long n, int m)
{
	long p;

	switch (m) {
	case cudaAddressModeWrap:
		i %= n;
		return i < 0 ? i + n : i;
	case cudaAddressModeMirror:
		p = 2 * n;
		i %= p;
		if (i < 0)
			i += p;
		return i < n ? i : p - 1 - i;
	case cudaAddressModeBorder:
		return i < 0 || i >= n ? -1 : i;
	default:
		return i < 0 ? 0 : i >= n ? n - 1 : i;
	}
}

/* A texture coordinate in texels: normalized ones wrapped or mirrored
 * (before scaling, as the guide defines them) and scaled by n. */
static float texel_coord(const struct obj *o, float x, long n, int m)
{
	if (!isfinite(x))
		x = isnan(x) ? 0.0f : x > 0 ? 1e9f : -1e9f;
	if (o->td.normalizedCoords) {
		float fl = floorf(x), fr = x - fl;

		if (m == cudaAddressModeWrap)
			x = fr;
		else if (m == cudaAddressModeMirror)
			x = fmodf(fl, 2.0f) != 0.0f ? 1.0f - fr : fr;
		x *= (float)n;
	}
	/* keep the floor within a long on every platform */
	return x < -1e9f ? -1e9f : x > 1e9f ? 1e9f : x;
}

struct footprint {
	long  i[3][2];     /* texel index per dimension, -1 for the border */
	float a[3];        /* weight of i[d][1], 9-bit fixed point         */
	int   filter;      /* linear filtering                             */
};

/* Where a fetch at coordinates x[0..nc-1] reads, and with what weights. */
static void locate(const struct obj *o, const float *x, int nc, int want_int,
		   struct footprint *fp)
{
	int d;

	/* CUDA filters only fetches that return floating point */
	fp->filter = !want_int && o->td.filterMode == cudaFilterModeLinear && !o->linear &&
		     (o->fmt.kind == SG_FK_FLOAT || o->as_norm);
	for (d = 0; d < 3; d++) {
		long n = (long)o->n[d];
		int m = mode_of(o, d);
		float u, fl;

		fp->a[d] = 0;
		if (d >= o->dims || d >= nc) {
			fp->i[d][0] = fp->i[d][1] = 0;
			continue;
		}
		if (o->linear) {
			/* linear memory: no addressing, no filtering */
			fl = floorf(texel_coord(o, x[d], n, m));
			fp->i[d][0] = fp->i[d][1] = fl < 0 || fl >= (float)n ? -1 : (long)fl;
			continue;
		}
		u = texel_coord(o, x[d], n, m);
		if (fp->filter) {
			/* "Linear Filtering": xB = x - 0.5, alpha = frac(xB) in 1/256ths */
			u -= 0.5f;
			fl = floorf(u);
			fp->a[d] = floorf((u - fl) * 256.0f + 0.5f) / 256.0f;
			fp->i[d][0] = address((long)fl, n, m);
			fp->i[d][1] = address((long)fl + 1, n, m);
		} else {
			/* "Nearest-Point Sampling": tex(x) = T[floor(x)] */
			fp->i[d][0] = fp->i[d][1] = address((long)floorf(u), n, m);
		}
	}
}

static const char *texel_at(const struct obj *o, long i, long j, long k)
{
	return o->base + (size_t)k * o->slice + (size_t)j * o->pitch + (size_t)i * o->es;
}

/* A whole fetch, as floats; tab_lock held. */
static void fetch_f(const struct obj *o, const float *x, int nc, float out[4])
{
	struct footprint fp;
	float v[4];
	int corner, c, d, ncorner;

	locate(o, x, nc, 0, &fp);
	memset(out, 0, 4 * sizeof(float));
	ncorner = fp.filter ? 1 << o->dims : 1;
	for (corner = 0; corner < ncorner; corner++) {
		long idx[3];
		float w = 1.0f;
		int border = 0;

		for (d = 0; d < 3; d++) {
			int b = (corner >> d) & 1;

			idx[d] = fp.i[d][b];
			if (fp.filter && d < o->dims)
				w *= b ? fp.a[d] : 1.0f - fp.a[d];
			border |= idx[d] < 0;
		}
		if (w == 0.0f)
			continue;
		if (border && o->linear)
			memset(v, 0, sizeof(v));
		else if (border)
			border_f(o, v);
		else
			texel_f(o, texel_at(o, idx[0], idx[1], idx[2]), v);
		for (c = 0; c < 4; c++)
			out[c] += w * v[c];
	}
}

/* A whole fetch, as element-type integers (point sampling); tab_lock held. */
static void fetch_i(const struct obj *o, const float *x, int nc, int out[4])
{
	struct footprint fp;

	locate(o, x, nc, 1, &fp);
	if (fp.i[0][0] < 0 || fp.i[1][0] < 0 || fp.i[2][0] < 0) {
		if (o->linear)
			memset(out, 0, 4 * sizeof(int));
		else
			border_i(o, out);
		return;
	}
	texel_i(o, texel_at(o, fp.i[0][0], fp.i[1][0], fp.i[2][0]), out);
}

/*
 * tex1Dfetch: an integer index.  For linear memory (its purpose) out of
 * range reads zeros; on other resources the index goes through the
 * addressing of unnormalized coordinates.
 */
static int fetch1d(unsigned long long tex, int x, float *outf, int *outi, const char *fn)
{
	const struct obj *o;
	float u = (float)x + 0.5f;       /* the centre of texel x */
	struct obj tmp;

	pthread_rwlock_rdlock(&tab_lock);
	o = lookup(tex, OBJ_TEX);
	if (!o) {
		pthread_rwlock_unlock(&tab_lock);
		if (outf)
			memset(outf, 0, 4 * sizeof(float));
		else
			memset(outi, 0, 4 * sizeof(int));
		return bad_handle(fn, tex);
	}
	if (o->linear) {
		/* the index itself: a float would lose it past 2^24 elements */
		int in = x >= 0 && (size_t)x < o->n[0];

		if (outf && in)
			texel_f(o, texel_at(o, x, 0, 0), outf);
		else if (in)
			texel_i(o, texel_at(o, x, 0, 0), outi);
		else if (outf)
			memset(outf, 0, 4 * sizeof(float));
		else
			memset(outi, 0, 4 * sizeof(int));
		pthread_rwlock_unlock(&tab_lock);
		return 0;
	}
	/* unnormalized, point: a copy of the descriptor says so */
	tmp = *o;
	tmp.td.normalizedCoords = 0;
	tmp.td.filterMode = cudaFilterModePoint;
	if (outf)
		fetch_f(&tmp, &u, 1, outf);
	else
		fetch_i(&tmp, &u, 1, outi);
	pthread_rwlock_unlock(&tab_lock);
	return 0;
}

static int fetch(unsigned long long tex, const float *x, int nc, float *outf, int *outi,
		 const char *fn)
{
	const struct obj *o;

	pthread_rwlock_rdlock(&tab_lock);
	o = lookup(tex, OBJ_TEX);
	if (!o) {
		pthread_rwlock_unlock(&tab_lock);
		if (outf)
			memset(outf, 0, 4 * sizeof(float));
		else
			memset(outi, 0, 4 * sizeof(int));
		return bad_handle(fn, tex);
	}
	if (outf)
		fetch_f(o, x, nc, outf);
	else
		fetch_i(o, x, nc, outi);
	pthread_rwlock_unlock(&tab_lock);
	return 0;
}

SG_API int simgpu_tex1Dfetch(simgpu_tex_t tex, int x, float out[4])
{
	return fetch1d(tex, x, out, NULL, __func__);
}

SG_API int simgpu_tex1D(simgpu_tex_t tex, float x, float out[4])
{
	return fetch(tex, &x, 1, out, NULL, __func__);
}

SG_API int simgpu_tex2D(simgpu_tex_t tex, float x, float y, float out[4])
{
	float c[2] = { x, y };

	return fetch(tex, c, 2, out, NULL, __func__);
}

SG_API int simgpu_tex3D(simgpu_tex_t tex, float x, float y, float z, float out[4])
{
	float c[3] = { x, y, z };

	return fetch(tex, c, 3, out, NULL, __func__);
}

SG_API int simgpu_tex1Dfetch_i(simgpu_tex_t tex, int x, int out[4])
{
	return fetch1d(tex, x, NULL, out, __func__);
}

SG_API int simgpu_tex1D_i(simgpu_tex_t tex, float x, int out[4])
{
	return fetch(tex, &x, 1, NULL, out, __func__);
}

SG_API int simgpu_tex2D_i(simgpu_tex_t tex, float x, float y, int out[4])
{
	float c[2] = { x, y };

	return fetch(tex, c, 2, NULL, out, __func__);
}

SG_API int simgpu_tex3D_i(simgpu_tex_t tex, float x, float y, float z, int out[4])
{
	float c[3] = { x, y, z };

	return fetch(tex, c, 3, NULL, out, __func__);
}

/* ---------------------------------------------------------------- surfaces */

static long clampl(long v, long lo, long hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

/*
 * One surface access of size bytes at (xb bytes, y, z).  rd: into val,
 * else from src.  Returns 0, 1 out of range (handled per mode), -1 bad.
 */
static int surf_access(unsigned long long s, void *val, const void *src, size_t size, long xb,
		       long y, long z, int mode, const char *fn)
{
	const struct obj *o;
	long row, in;
	int rc = 0;

	if (size != 1 && size != 2 && size != 4 && size != 8 && size != 16) {
		if (val)
			memset(val, 0, size < 16 ? size : 16);
		return -1;
	}
	pthread_rwlock_rdlock(&tab_lock);
	o = lookup(s, OBJ_SURF);
	if (!o) {
		pthread_rwlock_unlock(&tab_lock);
		if (val)
			memset(val, 0, size);
		return bad_handle(fn, s);
	}
	row = (long)(o->n[0] * o->es);
	in = xb >= 0 && xb + (long)size <= row && y >= 0 && y < (long)o->n[1] && z >= 0 &&
	     z < (long)o->n[2];
	if (!in && mode == SIMGPU_BOUNDARY_CLAMP && row >= (long)size) {
		xb = clampl(xb, 0, row - (long)size);
		y = clampl(y, 0, (long)o->n[1] - 1);
		z = clampl(z, 0, (long)o->n[2] - 1);
		in = 1;
		rc = 1;
	}
	if (in) {
		char *p = (char *)texel_at(o, 0, y, z) + xb;

		if (val)
			memcpy(val, p, size);
		else
			memcpy(p, src, size);
	} else {
		if (val)
			memset(val, 0, size);
		if (mode != SIMGPU_BOUNDARY_ZERO) {
			/* trap: the kernel fails, as on the GPU */
			sg_log("%s: (%ld bytes, %ld, %ld) is outside the surface: trap", fn, xb, y, z);
			sg_async_error(cudaErrorIllegalAddress, 1);
		}
		rc = 1;
	}
	pthread_rwlock_unlock(&tab_lock);
	return rc;
}

SG_API int simgpu_surf1Dread(simgpu_surf_t surf, void *val, size_t size, int x_bytes, int mode)
{
	return surf_access(surf, val, NULL, size, x_bytes, 0, 0, mode, __func__);
}

SG_API int simgpu_surf1Dwrite(simgpu_surf_t surf, const void *val, size_t size, int x_bytes,
			      int mode)
{
	return surf_access(surf, NULL, val, size, x_bytes, 0, 0, mode, __func__);
}

SG_API int simgpu_surf2Dread(simgpu_surf_t surf, void *val, size_t size, int x_bytes, int y,
			     int mode)
{
	return surf_access(surf, val, NULL, size, x_bytes, y, 0, mode, __func__);
}

SG_API int simgpu_surf2Dwrite(simgpu_surf_t surf, const void *val, size_t size, int x_bytes,
			      int y, int mode)
{
	return surf_access(surf, NULL, val, size, x_bytes, y, 0, mode, __func__);
}

SG_API int simgpu_surf3Dread(simgpu_surf_t surf, void *val, size_t size, int x_bytes, int y,
			     int z, int mode)
{
	return surf_access(surf, val, NULL, size, x_bytes, y, z, mode, __func__);
}

SG_API int simgpu_surf3Dwrite(simgpu_surf_t surf, const void *val, size_t size, int x_bytes,
			      int y, int z, int mode)
{
	return surf_access(surf, NULL, val, size, x_bytes, y, z, mode, __func__);
}
