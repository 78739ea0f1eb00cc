/*
 * module.c - modules (CUmodule) and libraries (CUlibrary), their
 * functions (CUfunction) and kernels (CUkernel).
 *
 * A module is a library of simgpu's runtime (cudaLibraryLoadData) plus
 * what the driver keeps: the context it was loaded in, a copy of its fat
 * binary for cuModuleGetGlobal, its globals.  A CUfunction and a CUkernel
 * are the runtime's cudaKernel_t record of the kernel itself: launches of
 * either run its host twin, and runtime and driver count the same record.
 * A record of an unloaded library stops being a kernel (kernels.c), so a
 * stale CUfunction is CUDA_ERROR_INVALID_HANDLE.
 *
 * Module records are never freed (only their fat binary copy and globals
 * are, at unload): a stale or garbage CUmodule is looked up, not followed.
 */
#include <stdlib.h>
#include <string.h>

#include "drv.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct drv_mod *mods;

struct drv_mod *drv_mod_of(const void *h, int library)
{
	struct drv_mod *m;

	if (!h)
		return NULL;
	pthread_mutex_lock(&mu);
	for (m = mods; m; m = m->next)
		if ((const void *)m == h)
			break;
	pthread_mutex_unlock(&mu);
	if (!m || m->library != library || !atomic_load(&m->live))
		return NULL;
	return m;
}

static CUresult load(struct drv_mod **out, const void *image, size_t max, int library)
{
	struct drv_ctx *ctx = NULL;
	struct drv_mod *m;
	void *fb = NULL, *lib = NULL;
	size_t len = 0;
	CUresult r;

	/* a library belongs to no context (it is loaded in each as needed) */
	r = library ? (atomic_load(&drv_initialized) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED)
		    : drv_ctx_check(&ctx);
	if (r != CUDA_SUCCESS)
		return r;
	if (!out || !image)
		return CUDA_ERROR_INVALID_VALUE;
	r = drv_image_fatbin(image, max, &fb, &len);
	if (r != CUDA_SUCCESS)
		return r;
	m = calloc(1, sizeof(*m));
	if (!m) {
		free(fb);
		return CUDA_ERROR_OUT_OF_MEMORY;
	}
	r = drv_err(simgpu_drv_library_load(&lib, fb));
	if (r != CUDA_SUCCESS) {
		free(fb);
		free(m);
		return r;
	}
	m->magic = MOD_MAGIC;
	m->library = library;
	m->ctx = ctx;
	m->lib = lib;
	m->fatbin = fb;
	m->fatbin_len = len;
	atomic_store(&m->live, 1);
	pthread_mutex_init(&m->mu, NULL);
	pthread_mutex_lock(&mu);
	m->next = mods;
	mods = m;
	pthread_mutex_unlock(&mu);
	*out = m;
	return CUDA_SUCCESS;
}

static CUresult unload(struct drv_mod *m)
{
	int was;

	pthread_mutex_lock(&mu);
	was = atomic_exchange(&m->live, 0);
	pthread_mutex_unlock(&mu);
	if (!was)
		return CUDA_ERROR_INVALID_HANDLE;     /* another thread was first */
	/* launches already queued keep their kernel records (never freed) */
	(void)simgpu_drv_library_unload(m->lib);
	drv_globals_free(m);
	pthread_mutex_lock(&m->mu);
	free(m->fatbin);
	m->fatbin = NULL;
	m->fatbin_len = 0;
	pthread_mutex_unlock(&m->mu);
	return CUDA_SUCCESS;
}

void drv_mods_of_ctx_unload(struct drv_ctx *ctx)
{
	struct drv_mod *m, *head;

	pthread_mutex_lock(&mu);
	head = mods;
	pthread_mutex_unlock(&mu);
	/* the list only grows at its head: walking from a snapshot is safe */
	for (m = head; m; m = m->next)
		if (!m->library && m->ctx == ctx && atomic_load(&m->live))
			(void)unload(m);
}

/* ---------------------------------------------------------------- modules */

DRV_API CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	return load((struct drv_mod **)module, image, 0, 0);
}

DRV_API CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
				    CUjit_option *options, void **optionValues)
{
	/* JIT options change nothing when nothing is compiled */
	if (numOptions && (!options || !optionValues))
		return CUDA_ERROR_INVALID_VALUE;
	return load((struct drv_mod **)module, image, 0, 0);
}

DRV_API CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
	return load((struct drv_mod **)module, fatCubin, 0, 0);
}

DRV_API CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
	void *buf = NULL;
	size_t len = 0;
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!module || !fname)
		return CUDA_ERROR_INVALID_VALUE;
	r = drv_image_read_file(fname, &buf, &len);
	if (r != CUDA_SUCCESS)
		return r;
	r = load((struct drv_mod **)module, buf, len, 0);
	free(buf);
	return r;
}

DRV_API CUresult cuModuleUnload(CUmodule hmod)
{
	struct drv_mod *m;

	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	m = drv_mod_of(hmod, 0);
	if (!m)
		return CUDA_ERROR_INVALID_HANDLE;
	return unload(m);
}

static CUresult get_kernel(void **out, struct drv_mod *m, const char *name)
{
	int e;

	if (!out || !name)
		return CUDA_ERROR_INVALID_VALUE;
	if (!m)
		return CUDA_ERROR_INVALID_HANDLE;
	e = simgpu_drv_library_kernel(out, m->lib, name);
	/* the runtime's cudaErrorSymbolNotFound is CUDA_ERROR_NOT_FOUND */
	return drv_err(e);
}

DRV_API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	return get_kernel((void **)hfunc, drv_mod_of(hmod, 0), name);
}

DRV_API CUresult cuModuleGetFunctionCount(unsigned int *count, CUmodule mod)
{
	struct drv_mod *m;
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	m = drv_mod_of(mod, 0);
	if (!m)
		return CUDA_ERROR_INVALID_HANDLE;
	return drv_err(simgpu_drv_library_count(count, m->lib));
}

DRV_API CUresult cuModuleEnumerateFunctions(CUfunction *functions, unsigned int numFunctions,
					    CUmodule mod)
{
	struct drv_mod *m;
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!functions && numFunctions)
		return CUDA_ERROR_INVALID_VALUE;
	m = drv_mod_of(mod, 0);
	if (!m)
		return CUDA_ERROR_INVALID_HANDLE;
	return drv_err(simgpu_drv_library_kernels((void **)functions, numFunctions, m->lib));
}

DRV_API CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod,
				      const char *name)
{
	struct drv_mod *m;
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!name || (!dptr && !bytes))
		return CUDA_ERROR_INVALID_VALUE;
	m = drv_mod_of(hmod, 0);
	if (!m)
		return CUDA_ERROR_INVALID_HANDLE;
	return drv_global_get(m, name, dptr, bytes);
}

/* ---------------------------------------------------------------- libraries */

DRV_API CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
				   void **jitOptionsValues, unsigned int numJitOptions,
				   CUlibraryOption *libraryOptions, void **libraryOptionValues,
				   unsigned int numLibraryOptions)
{
	if ((numJitOptions && (!jitOptions || !jitOptionsValues)) ||
	    (numLibraryOptions && (!libraryOptions || !libraryOptionValues)))
		return CUDA_ERROR_INVALID_VALUE;
	return load((struct drv_mod **)library, code, 0, 1);
}

DRV_API CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName,
				       CUjit_option *jitOptions, void **jitOptionsValues,
				       unsigned int numJitOptions, CUlibraryOption *libraryOptions,
				       void **libraryOptionValues, unsigned int numLibraryOptions)
{
	void *buf = NULL;
	size_t len = 0;
	CUresult r;

	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!library || !fileName || (numJitOptions && (!jitOptions || !jitOptionsValues)) ||
	    (numLibraryOptions && (!libraryOptions || !libraryOptionValues)))
		return CUDA_ERROR_INVALID_VALUE;
	r = drv_image_read_file(fileName, &buf, &len);
	if (r != CUDA_SUCCESS)
		return r;
	r = load((struct drv_mod **)library, buf, len, 1);
	free(buf);
	return r;
}

DRV_API CUresult cuLibraryUnload(CUlibrary library)
{
	struct drv_mod *m;

	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	m = drv_mod_of(library, 1);
	if (!m)
		return CUDA_ERROR_INVALID_HANDLE;
	return unload(m);
}

DRV_API CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	return get_kernel((void **)pKernel, drv_mod_of(library, 1), name);
}

DRV_API CUresult cuLibraryGetKernelCount(unsigned int *count, CUlibrary lib)
{
	struct drv_mod *m;

	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!count)
		return CUDA_ERROR_INVALID_VALUE;
	m = drv_mod_of(lib, 1);
	if (!m)
		return CUDA_ERROR_INVALID_HANDLE;
	return drv_err(simgpu_drv_library_count(count, m->lib));
}

DRV_API CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library,
				    const char *name)
{
	struct drv_mod *m;

	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!name || (!dptr && !bytes))
		return CUDA_ERROR_INVALID_VALUE;
	m = drv_mod_of(library, 1);
	if (!m)
		return CUDA_ERROR_INVALID_HANDLE;
	return drv_global_get(m, name, dptr, bytes);
}

/* A CUkernel is its CUfunction in every context here. */
DRV_API CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
	const char *name;
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pFunc)
		return CUDA_ERROR_INVALID_VALUE;
	if (simgpu_drv_kernel_name(&name, kernel) != 0)
		return CUDA_ERROR_INVALID_HANDLE;
	*pFunc = (CUfunction)(void *)kernel;
	return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- functions */

static CUresult func_name(const char **name, const void *f)
{
	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!name)
		return CUDA_ERROR_INVALID_VALUE;
	return simgpu_drv_kernel_name(name, f) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

DRV_API CUresult cuFuncGetName(const char **name, CUfunction hfunc)
{
	return func_name(name, hfunc);
}

DRV_API CUresult cuKernelGetName(const char **name, CUkernel hfunc)
{
	return func_name(name, hfunc);
}

static CUresult param_info(const void *f, size_t i, size_t *off, size_t *size)
{
	const char *name;
	int e;

	if (!atomic_load(&drv_initialized))
		return CUDA_ERROR_NOT_INITIALIZED;
	if (simgpu_drv_kernel_name(&name, f) != 0)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!off && !size)
		return CUDA_ERROR_INVALID_VALUE;
	e = simgpu_drv_kernel_param(f, i, off, size);
	return e ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

DRV_API CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset,
				    size_t *paramSize)
{
	return param_info(func, paramIndex, paramOffset, paramSize);
}

DRV_API CUresult cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t *paramOffset,
				      size_t *paramSize)
{
	return param_info(kernel, paramIndex, paramOffset, paramSize);
}

DRV_API CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
	int regs = 0, smem = 0;
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (!pi)
		return CUDA_ERROR_INVALID_VALUE;
	if (simgpu_drv_kernel_attr(hfunc, &regs, &smem) != 0)
		return CUDA_ERROR_INVALID_HANDLE;
	switch (attrib) {
	case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:      *pi = 1024; break;
	case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES:          *pi = smem; break;
	case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES:           *pi = 0; break;
	case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES:           *pi = 0; break;
	case CU_FUNC_ATTRIBUTE_NUM_REGS:                   *pi = regs; break;
	case CU_FUNC_ATTRIBUTE_PTX_VERSION:                *pi = 90; break;
	case CU_FUNC_ATTRIBUTE_BINARY_VERSION:             *pi = 90; break;
	case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA:              *pi = 0; break;
	case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *pi = 48 * 1024; break;
	case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *pi = -1; break;
	default:
		if ((int)attrib < 0 || (int)attrib >= (int)CU_FUNC_ATTRIBUTE_MAX)
			return CUDA_ERROR_INVALID_VALUE;
		*pi = 0;
		break;
	}
	return CUDA_SUCCESS;
}

/* Accepted and ignored: a CPU device has no carveout or cache to set. */
DRV_API CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
{
	const char *name;
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	if (simgpu_drv_kernel_name(&name, hfunc) != 0)
		return CUDA_ERROR_INVALID_HANDLE;
	if (attrib == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES &&
	    (value < 0 || value > 227 * 1024))
		return CUDA_ERROR_INVALID_VALUE;
	return CUDA_SUCCESS;
}

DRV_API CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config)
{
	const char *name;
	CUresult r = drv_ready();

	if (r != CUDA_SUCCESS)
		return r;
	(void)config;
	return simgpu_drv_kernel_name(&name, hfunc) == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}
