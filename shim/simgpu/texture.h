/*
 * texture.h - what array.c (CUDA arrays) and texture.c (texture and
 * surface objects) share, and nobody else needs.
 *
 * A CUDA array is opaque to the application, so simgpu picks its layout:
 * elements packed row after row, rows packed slice after slice (pitch =
 * width * element size).  The deprecated cudaMemcpyToArray family copies
 * "count bytes from (wOffset, hOffset) on", which on this layout is one
 * contiguous run.  Storage comes from the device arena, so arrays count
 * against device memory (cudaMemGetInfo) as they do on a GPU.
 *
 * Arrays are reference counted: the handle holds one reference, every
 * texture or surface object and every queued copy that uses the array
 * holds one more.  cudaFreeArray drops the handle's, so a copy still in a
 * stream, or a texture a twin still samples, never touches freed memory.
 */
#ifndef SIMGPU_TEXTURE_H
#define SIMGPU_TEXTURE_H

#include <stdatomic.h>
#include <stddef.h>

#include <cuda_runtime_api.h>

/* Channel data as the sampler reads it. */
enum sg_fk { SG_FK_SIGNED, SG_FK_UNSIGNED, SG_FK_FLOAT };

struct sg_fmt {
	int nch;     /* channels: 1, 2 or 4                                  */
	int bits;    /* bits per channel: 8, 16 or 32                        */
	int kind;    /* enum sg_fk                                           */
	int norm;    /* a cudaChannelFormatKind*Normalized* kind: always read
	                as normalized float, whatever the read mode          */
};

struct sg_array {
	struct cudaChannelFormatDesc desc;   /* as the application gave it  */
	struct sg_fmt fmt;
	size_t w, h, d;          /* extent as allocated: h, d 0 when unused  */
	size_t es;               /* bytes per element                        */
	size_t pitch, slice;     /* bytes per row, per slice                 */
	unsigned flags;
	char *data;
	atomic_int refs;
	struct sg_array *next;   /* every live handle (arrays_mu), for a reset */
};

/* 0, or -1 when simgpu does not model the format (or it is malformed). */
int sg_fmt_of(const struct cudaChannelFormatDesc *d, struct sg_fmt *f);

static inline size_t sg_fmt_size(const struct sg_fmt *f)
{
	return (size_t)f->nch * (size_t)f->bits / 8;
}

/* A live array by its handle, with a reference taken; NULL if unknown. */
struct sg_array *sg_array_get(cudaArray_const_t a);
void sg_array_put(struct sg_array *a);

/* cudaDeviceReset: every array handle goes (array.c); and every texture
 * and surface object first (texture.c, sg_textures_reset in simgpu_impl.h) */
void sg_arrays_reset(void);

#endif
