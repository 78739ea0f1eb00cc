/*
 * module.c - modules, libraries, functions and launches of the fake
 * driver.  Handles are records on lists that are never freed (an unloaded
 * module's functions just stop being valid), so a stale or garbage handle
 * is detected instead of dereferenced.
 *
 * An entry point never calls another exported one (cuLaunchKernel_ptsz does
 * not call cuLaunchKernel): with a hook preloaded, that call would land in
 * the hook and one launch would be counted twice.
 */
#include <ctype.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "fakecuda.h"

#define MAX_IMAGE_SCAN 65536

enum { K_NOOP, K_ADD_ONE, K_SCALE2 };

struct fc_mod;

struct fc_func {
	char            name[128];
	int             kind;
	struct fc_mod  *mod;
	struct fc_func *next;      /* all functions */
};

struct fc_mod {
	int            live;
	struct fc_mod *next;       /* all modules */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct fc_mod *mods;
static struct fc_func *funcs;
static atomic_ullong launches;

FC_API unsigned long long fakecuda_launch_count(void)
{
	return atomic_load(&launches);
}

/* ---------------------------------------------------------------- images */

static CUresult load(const void *image, struct fc_mod **out)
{
	const char *s = image, *end;
	struct fc_mod *m;
	size_t len;

	if (!fc_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!out || !s)
		return CUDA_ERROR_INVALID_VALUE;
	len = strnlen(s, MAX_IMAGE_SCAN);
	if (len < 7 || strncmp(s, "FAKEMOD", 7) != 0 || (len > 7 && !isspace((unsigned char)s[7])))
		return CUDA_ERROR_INVALID_IMAGE;
	m = calloc(1, sizeof(*m));
	if (!m)
		return CUDA_ERROR_OUT_OF_MEMORY;
	m->live = 1;
	end = s + len;
	s += 7;
	pthread_mutex_lock(&mu);
	while (s < end) {
		const char *w;
		struct fc_func *f;
		size_t n;

		while (s < end && isspace((unsigned char)*s))
			s++;
		for (w = s; s < end && !isspace((unsigned char)*s); s++)
			;
		n = (size_t)(s - w);
		if (n == 0)
			break;
		f = calloc(1, sizeof(*f));
		if (!f)
			break;
		if (n >= sizeof(f->name))
			n = sizeof(f->name) - 1;
		memcpy(f->name, w, n);
		f->kind = !strcmp(f->name, "add_one") ? K_ADD_ONE :
			  !strcmp(f->name, "scale2") ? K_SCALE2 : K_NOOP;
		f->mod = m;
		f->next = funcs;
		funcs = f;
	}
	m->next = mods;
	mods = m;
	pthread_mutex_unlock(&mu);
	*out = m;
	return CUDA_SUCCESS;
}

static struct fc_mod *mod_check(const void *h)
{
	struct fc_mod *m;

	pthread_mutex_lock(&mu);
	for (m = mods; m; m = m->next)
		if ((const void *)m == h && m->live)
			break;
	pthread_mutex_unlock(&mu);
	return m;
}

struct fc_func *fc_func_check(const void *h)
{
	struct fc_func *f;

	pthread_mutex_lock(&mu);
	for (f = funcs; f; f = f->next)
		if ((const void *)f == h && f->mod->live)
			break;
	pthread_mutex_unlock(&mu);
	return f;
}

static CUresult get_func(struct fc_func **out, const void *modh, const char *name)
{
	struct fc_mod *m = mod_check(modh);
	struct fc_func *f;

	if (!out || !name)
		return CUDA_ERROR_INVALID_VALUE;
	if (!m)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	for (f = funcs; f; f = f->next)
		if (f->mod == m && !strcmp(f->name, name))
			break;
	pthread_mutex_unlock(&mu);
	if (!f)
		return CUDA_ERROR_NOT_FOUND;
	*out = f;
	return CUDA_SUCCESS;
}

static CUresult unload(const void *h)
{
	struct fc_mod *m = mod_check(h);

	if (!m)
		return CUDA_ERROR_INVALID_HANDLE;
	pthread_mutex_lock(&mu);
	m->live = 0;
	pthread_mutex_unlock(&mu);
	return CUDA_SUCCESS;
}

FC_API CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
	return load(image, (struct fc_mod **)module);
}

FC_API CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions,
				   CUjit_option *options, void **optionValues)
{
	(void)numOptions, (void)options, (void)optionValues;
	return load(image, (struct fc_mod **)module);
}

FC_API CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
	return load(fatCubin, (struct fc_mod **)module);
}

FC_API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
	return get_func((struct fc_func **)hfunc, hmod, name);
}

FC_API CUresult cuModuleUnload(CUmodule hmod)
{
	return unload(hmod);
}

FC_API CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions,
				  void **jitOptionsValues, unsigned int numJitOptions,
				  CUlibraryOption *libraryOptions, void **libraryOptionValues,
				  unsigned int numLibraryOptions)
{
	(void)jitOptions, (void)jitOptionsValues, (void)numJitOptions;
	(void)libraryOptions, (void)libraryOptionValues, (void)numLibraryOptions;
	return load(code, (struct fc_mod **)library);
}

FC_API CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
	return get_func((struct fc_func **)pKernel, library, name);
}

FC_API CUresult cuLibraryUnload(CUlibrary library)
{
	return unload(library);
}

/* A CUkernel and its CUfunction are the same record here. */
FC_API CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
	if (!pFunc)
		return CUDA_ERROR_INVALID_VALUE;
	if (!fc_func_check(kernel))
		return CUDA_ERROR_INVALID_HANDLE;
	*pFunc = (CUfunction)(void *)kernel;
	return CUDA_SUCCESS;
}

FC_API CUresult cuFuncGetName(const char **name, CUfunction hfunc)
{
	struct fc_func *f = fc_func_check(hfunc);

	if (!name)
		return CUDA_ERROR_INVALID_VALUE;
	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	*name = f->name;
	return CUDA_SUCCESS;
}

/* ---------------------------------------------------------------- launches */

/* Arguments (CUdeviceptr p, int n) from kernelParams or from `extra`. */
static CUresult args_of(void **params, void **extra, CUdeviceptr *p, int *n)
{
	if (params) {
		if (extra || !params[0] || !params[1])
			return CUDA_ERROR_INVALID_VALUE;
		memcpy(p, params[0], sizeof(*p));
		memcpy(n, params[1], sizeof(*n));
		return CUDA_SUCCESS;
	}
	if (extra) {
		const char *buf = NULL;
		size_t size = 0;
		int i;

		for (i = 0; i < 16 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
			if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
				buf = extra[i + 1];
			else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
				size = *(size_t *)extra[i + 1];
			else
				return CUDA_ERROR_INVALID_VALUE;
		}
		if (!buf || size < sizeof(CUdeviceptr) + sizeof(int))
			return CUDA_ERROR_INVALID_VALUE;
		memcpy(p, buf, sizeof(*p));
		memcpy(n, buf + sizeof(*p), sizeof(*n));
		return CUDA_SUCCESS;
	}
	return CUDA_ERROR_INVALID_VALUE;
}

CUresult fc_run(struct fc_func *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
		unsigned by, unsigned bz, void **params, void **extra)
{
	unsigned long long threads = (unsigned long long)gx * gy * gz * bx * by * bz;
	CUdeviceptr dp;
	CUresult rc;
	float *p;
	int n, i;

	if (!fc_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!f)
		return CUDA_ERROR_INVALID_HANDLE;
	if (!threads || (unsigned long long)bx * by * bz > 1024)
		return CUDA_ERROR_INVALID_VALUE;
	if (f->kind != K_NOOP) {
		rc = args_of(params, extra, &dp, &n);
		if (rc != CUDA_SUCCESS)
			return rc;
		if ((unsigned long long)n > threads)
			n = (int)threads;             /* threads past the grid do nothing */
		if (n > 0 && !fc_mem_ok(dp, (size_t)n * sizeof(float)))
			return CUDA_ERROR_ILLEGAL_ADDRESS;
		p = (float *)(uintptr_t)dp;
		for (i = 0; i < n; i++)
			p[i] = f->kind == K_ADD_ONE ? p[i] + 1 : p[i] * 2;
	}
	atomic_fetch_add(&launches, 1);
	return CUDA_SUCCESS;
}

FC_API CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz,
			       unsigned int bx, unsigned int by, unsigned int bz,
			       unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
			       void **extra)
{
	(void)sharedMemBytes, (void)hStream;
	return fc_run(fc_func_check(f), gx, gy, gz, bx, by, bz, kernelParams, extra);
}

FC_API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
				    unsigned int gz, unsigned int bx, unsigned int by,
				    unsigned int bz, unsigned int sharedMemBytes, CUstream hStream,
				    void **kernelParams, void **extra);
FC_API CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
				    unsigned int gz, unsigned int bx, unsigned int by,
				    unsigned int bz, unsigned int sharedMemBytes, CUstream hStream,
				    void **kernelParams, void **extra)
{
	(void)sharedMemBytes, (void)hStream;
	return fc_run(fc_func_check(f), gx, gy, gz, bx, by, bz, kernelParams, extra);
}

static CUresult launch_ex(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
			  void **extra)
{
	if (!config)
		return CUDA_ERROR_INVALID_VALUE;
	return fc_run(fc_func_check(f), config->gridDimX, config->gridDimY, config->gridDimZ,
		      config->blockDimX, config->blockDimY, config->blockDimZ, kernelParams, extra);
}

FC_API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
				 void **extra)
{
	return launch_ex(config, f, kernelParams, extra);
}

FC_API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
				      void **kernelParams, void **extra);
FC_API CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
				      void **kernelParams, void **extra)
{
	return launch_ex(config, f, kernelParams, extra);
}

FC_API CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gx, unsigned int gy,
					  unsigned int gz, unsigned int bx, unsigned int by,
					  unsigned int bz, unsigned int sharedMemBytes,
					  CUstream hStream, void **kernelParams)
{
	(void)sharedMemBytes, (void)hStream;
	return fc_run(fc_func_check(f), gx, gy, gz, bx, by, bz, kernelParams, NULL);
}

FC_API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
					       unsigned int gz, unsigned int bx, unsigned int by,
					       unsigned int bz, unsigned int sharedMemBytes,
					       CUstream hStream, void **kernelParams);
FC_API CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gx, unsigned int gy,
					       unsigned int gz, unsigned int bx, unsigned int by,
					       unsigned int bz, unsigned int sharedMemBytes,
					       CUstream hStream, void **kernelParams)
{
	(void)sharedMemBytes, (void)hStream;
	return fc_run(fc_func_check(f), gx, gy, gz, bx, by, bz, kernelParams, NULL);
}

/* Graphs are not modelled. */
FC_API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
	(void)hGraphExec, (void)hStream;
	return CUDA_ERROR_NOT_SUPPORTED;
}

FC_API CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream);
FC_API CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
	(void)hGraphExec, (void)hStream;
	return CUDA_ERROR_NOT_SUPPORTED;
}

static CUresult host_func(CUhostFn fn, void *userData)
{
	if (!fc_initialized)
		return CUDA_ERROR_NOT_INITIALIZED;
	if (!fn)
		return CUDA_ERROR_INVALID_VALUE;
	fn(userData);
	return CUDA_SUCCESS;
}

FC_API CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
	(void)hStream;
	return host_func(fn, userData);
}

FC_API CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void *userData);
FC_API CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void *userData)
{
	(void)hStream;
	return host_func(fn, userData);
}
