/*
 * drv.h - internals of simgpu's libcuda.so.1: the CUDA driver API over the
 * device of simgpu's libcudart.so.13 (one memory, one set of streams and
 * events, one kernel table: shim/simgpu/drvglue.h).
 *
 * One file, one job:
 *   init.c      cuInit, versions, the device, contexts (primary and created)
 *   errors.c    CUresult names and strings; runtime codes to driver codes
 *   image.c     what cuModuleLoadData may be given, made a fat binary
 *   module.c    modules and libraries: load, functions, kernels, unload
 *   globals.c   cuModuleGetGlobal: __device__ variables of a module
 *   launch.c    cuLaunchKernel[Ex], cooperative launches, host functions
 *   memory.c    allocation, copies, memsets, memory info
 *   stream.c    streams and events
 *   green.c     green contexts: SM resources, splits, descriptors, streams
 *   procaddr.c  cuGetProcAddress[_v2], cuGetExportTable, the VMM calls
 *
 * Every entry point is DRV_API (the library is built -fvisibility=hidden)
 * and never calls another exported one: with colocate's hooks preloaded
 * such a call would be counted twice (it is linked -Bsymbolic as well).
 * Bad input is an error code, never a crash: handles are looked up in
 * lists of records that are never freed before they are used.
 */
#ifndef SIMGPU_DRV_H
#define SIMGPU_DRV_H

#include <cuda.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "../drvglue.h"

#define DRV_API __attribute__((visibility("default")))

/* -------------------------------------------------------------- errors.c */

CUresult drv_err(int cuda_error);              /* cudaError_t -> CUresult */

/* -------------------------------------------------------------- init.c */

#define CTX_MAGIC 0x63747864u                  /* "dxtc"                  */

struct drv_ctx {
	uint32_t        magic;
	int             primary;
	unsigned        flags;
	int             refs;                  /* primary: retains           */
	int             live;
	struct drv_ctx *next;                  /* created contexts           */
	struct drv_green *green;               /* cuCtxFromGreenCtx's, else NULL */
};

struct drv_green;

extern atomic_int drv_initialized;

/* CUDA_SUCCESS when initialised and the thread has a current context
 * (*ctx: it), else CUDA_ERROR_NOT_INITIALIZED / CUDA_ERROR_INVALID_CONTEXT. */
CUresult drv_ctx_check(struct drv_ctx **ctx);
/* A context made elsewhere (a green context's): listed, so handles to it
 * are valid, until retired (then dead everywhere, off this thread's stack). */
int  drv_ctx_valid(const struct drv_ctx *c);    /* live (or primary) */
void drv_ctx_add(struct drv_ctx *c);
void drv_ctx_retire(struct drv_ctx *c);
static inline CUresult drv_ready(void)
{
	return drv_ctx_check(NULL);
}

/* -------------------------------------------------------------- green.c */

/* A launch's stream: NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD in a
 * green context are its default stream (*ptsz cleared then); others as
 * given. */
CUstream drv_green_stream(struct drv_ctx *c, CUstream s, int *ptsz);

/* -------------------------------------------------------------- image.c */

/* The image as a fat binary of its own (malloc'd, *len bytes): a fat
 * binary is copied, a bare cubin wrapped.  CUDA_ERROR_INVALID_IMAGE when
 * it is neither; CUDA_ERROR_JIT_COMPILER_NOT_FOUND for PTX (no JIT here).
 * max: the bytes known to be readable (a file's size), 0 unknown. */
CUresult drv_image_fatbin(const void *image, size_t max, void **out, size_t *len);
CUresult drv_image_read_file(const char *path, void **buf, size_t *len);

/* -------------------------------------------------------------- module.c */

#define MOD_MAGIC 0x646f6d64u                  /* "dmod"                  */

struct drv_global;

struct drv_mod {
	uint32_t            magic;
	int                 library;           /* CUlibrary, else CUmodule   */
	struct drv_ctx     *ctx;               /* NULL for a library         */
	void               *lib;               /* the runtime's cudaLibrary_t */
	void               *fatbin;            /* our copy, for globals      */
	size_t              fatbin_len;
	atomic_int          live;
	pthread_mutex_t     mu;                /* globals                    */
	struct drv_global  *globals;
	struct drv_mod     *next;
};

struct drv_mod *drv_mod_of(const void *h, int library);   /* live or NULL */
void drv_mods_of_ctx_unload(struct drv_ctx *ctx);

/* -------------------------------------------------------------- globals.c */

CUresult drv_global_get(struct drv_mod *m, const char *name, CUdeviceptr *dptr, size_t *bytes);
void     drv_globals_free(struct drv_mod *m);

#endif
