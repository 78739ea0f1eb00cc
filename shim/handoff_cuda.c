/*
 * handoff_cuda.c - the CUDA calls of the hand-off library, found at run
 * time rather than linked:
 *
 *  - the library then loads in a process without CUDA (Python importing
 *    shim.handoff to parse a handle, a host-only last stage) and says
 *    what is missing at the first call that needs it;
 *  - libcudart.so.13 is whatever LD_LIBRARY_PATH resolves (simgpu's or
 *    NVIDIA's), loaded RTLD_GLOBAL, and each name is looked up in the
 *    global scope (RTLD_DEFAULT), so a preloaded libcolocate.so sees our
 *    cudaMalloc/cudaMemcpy like the app's own.
 *
 * The VMM calls come from cudaGetDriverEntryPointByVersion, as in
 * shim_vmm.c (simgpu emulates them; it lacks cuMemRetainAllocationHandle,
 * which only exporting VMM memory we did not allocate needs).
 */
#define _GNU_SOURCE
#include "handoff_int.h"
#include "vmm_drv.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static struct hf_rt rt;
static int rt_state;                    /* 0 not tried, 1 ok, -1 failed */
static char rt_why[200];
static pthread_once_t rt_once = PTHREAD_ONCE_INIT;

static void *sym(const char *name)
{
	return dlsym(RTLD_DEFAULT, name);
}

static void rt_load(void)
{
	static const char *const libs[] = { "libcudart.so.13", "libcudart.so", NULL };
	static const struct vmm_sym vsyms[] = {
#define S(n, f) { #n, offsetof(struct hf_rt, f) }
		S(cuMemGetAllocationGranularity, gran), S(cuMemCreate, create),
		S(cuMemRelease, release), S(cuMemAddressReserve, reserve),
		S(cuMemAddressFree, addr_free), S(cuMemMap, map), S(cuMemUnmap, unmap),
		S(cuMemSetAccess, access), S(cuMemExportToShareableHandle, export_),
		S(cuMemImportFromShareableHandle, import_),
#undef S
	};
	vmm_entry_fn get;
	cudaError_t before;
	char why[200];
	size_t i;

	/* already in the process (the app's, or cupy's): promote it to the
	 * global scope; else load it.  Always: a preloaded libcolocate.so
	 * defines cudaMalloc but not every name we need */
	for (i = 0; libs[i]; i++)
		if (dlopen(libs[i], RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD) ||
		    dlopen(libs[i], RTLD_NOW | RTLD_GLOBAL))
			break;
#define R(f, n) (rt.f = (__typeof__(rt.f))sym(n))
	if (!R(malloc_, "cudaMalloc") || !R(free_, "cudaFree") || !R(ipc_get, "cudaIpcGetMemHandle") ||
	    !R(ipc_open, "cudaIpcOpenMemHandle") || !R(ipc_close, "cudaIpcCloseMemHandle") ||
	    !R(memcpy_, "cudaMemcpy") || !R(get_device, "cudaGetDevice") ||
	    !R(set_device, "cudaSetDevice") || !R(errstr, "cudaGetErrorString")) {
		snprintf(rt_why, sizeof(rt_why), "no CUDA runtime: libcudart.so.13 not found or "
			 "incomplete (%s)", dlerror() ? "dlopen failed" : "a symbol is missing");
		rt_state = -1;
		return;
	}
	R(props, "cudaGetDeviceProperties");
	R(get_last, "cudaGetLastError");
	R(peek_last, "cudaPeekAtLastError");
#undef R
	rt.simgpu = sym("simgpu_map_peer") != NULL;
	get = (vmm_entry_fn)sym("cudaGetDriverEntryPointByVersion");
	before = hf_quiet_begin();              /* the look-ups below are probes */
	rt.vmm = get && vmm_entry_points(get, vsyms, sizeof(vsyms) / sizeof(vsyms[0]), &rt, why,
					 sizeof(why)) == 0;
	if (get) {
		enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
		void *fn = NULL;

		/* a probe: simgpu has no such entry point, and says so with
		 * cudaErrorSymbolNotFound as the runtime's last error - not the
		 * app's to see at its next cudaGetLastError() */
		if (get("cuMemRetainAllocationHandle", &fn, VMM_DRV_VERSION, cudaEnableDefault, &q) ==
		    cudaSuccess && q == cudaDriverEntryPointSuccess)
			rt.retain = (__typeof__(rt.retain))fn;
	}
	hf_quiet_end(before);
	rt_state = 1;
}

cudaError_t hf_quiet_begin(void)
{
	return rt.peek_last ? rt.peek_last() : cudaSuccess;
}

void hf_quiet_end(cudaError_t before)
{
	if (before == cudaSuccess && rt.get_last)
		rt.get_last();
}

int hf_rt_get(const struct hf_rt **out)
{
	pthread_once(&rt_once, rt_load);
	if (rt_state < 0)
		return hf_err(COLOCATE_HANDOFF_E_CUDA, "%s", rt_why);
	*out = &rt;
	return COLOCATE_HANDOFF_OK;
}

int hf_cuda_err(const char *what, int err)
{
	const char *s = rt.errstr ? rt.errstr((cudaError_t)err) : NULL;

	return hf_err(COLOCATE_HANDOFF_E_CUDA, "%s: CUDA error %d (%s)", what, err, s ? s : "?");
}

#define HF_MAX_DEV 64
static uint8_t uuid_cache[HF_MAX_DEV][16];
static int uuid_known[HF_MAX_DEV];

int hf_cur_device(int *dev, uint8_t uuid[16])
{
	const struct hf_rt *r;
	struct cudaDeviceProp p;
	cudaError_t e;
	int rc = hf_rt_get(&r);

	if (rc)
		return rc;
	e = r->get_device(dev);
	if (e != cudaSuccess)
		return hf_cuda_err("cudaGetDevice", e);
	memset(uuid, 0, 16);
	/* the UUID tells two processes they see the same GPU whatever their
	 * CUDA_VISIBLE_DEVICES; without it the mapping attempt decides.
	 * Cached: cudaGetDeviceProperties is not cheap, and a device's UUID
	 * does not change (a benign race: two threads store the same) */
	if (*dev >= 0 && *dev < HF_MAX_DEV && __atomic_load_n(&uuid_known[*dev], __ATOMIC_ACQUIRE)) {
		memcpy(uuid, uuid_cache[*dev], 16);
		return COLOCATE_HANDOFF_OK;
	}
	if (r->props && r->props(&p, *dev) == cudaSuccess) {
		memcpy(uuid, p.uuid.bytes, 16);
		if (*dev >= 0 && *dev < HF_MAX_DEV) {
			memcpy(uuid_cache[*dev], uuid, 16);
			__atomic_store_n(&uuid_known[*dev], 1, __ATOMIC_RELEASE);
		}
	}
	return COLOCATE_HANDOFF_OK;
}

/* Map h over a fresh reservation, read-write for dev. */
static int map_rw(int dev, uint64_t n, CUmemGenericAllocationHandle h, void **ptr)
{
	CUdeviceptr va = 0;
	CUmemAccessDesc acc;
	CUresult r;

	r = rt.reserve(&va, n, 0, 0, 0);
	if (r != CUDA_SUCCESS)
		return hf_err(COLOCATE_HANDOFF_E_CUDA, "cuMemAddressReserve(%llu): CUresult %d",
			      (unsigned long long)n, (int)r);
	r = rt.map(va, n, 0, h, 0);
	if (r != CUDA_SUCCESS) {
		rt.addr_free(va, n);
		return hf_err(COLOCATE_HANDOFF_E_CUDA, "cuMemMap: CUresult %d", (int)r);
	}
	vmm_rw_access(&acc, dev);
	r = rt.access(va, n, &acc, 1);
	if (r != CUDA_SUCCESS) {
		rt.unmap(va, n);
		rt.addr_free(va, n);
		return hf_err(COLOCATE_HANDOFF_E_CUDA, "cuMemSetAccess: CUresult %d", (int)r);
	}
	*ptr = (void *)(uintptr_t)va;
	return COLOCATE_HANDOFF_OK;
}

static int need_vmm(void)
{
	const struct hf_rt *r;
	int rc = hf_rt_get(&r);

	if (rc)
		return rc;
	if (!r->vmm)
		return hf_err(COLOCATE_HANDOFF_E_UNSUPPORTED, "the CUDA runtime offers no driver VMM "
			      "calls (cudaGetDriverEntryPointByVersion): no fd hand-off");
	return COLOCATE_HANDOFF_OK;
}

int hf_vmm_alloc(int dev, uint64_t size, void **ptr, uint64_t *alloc_size,
		 CUmemGenericAllocationHandle *h)
{
	CUmemAllocationProp prop;
	size_t g = 0;
	uint64_t n;
	CUresult r;
	int rc = need_vmm();

	if (rc)
		return rc;
	vmm_alloc_prop(&prop, dev);
	r = rt.gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
	if (r != CUDA_SUCCESS || !g)
		return hf_err(COLOCATE_HANDOFF_E_CUDA, "cuMemGetAllocationGranularity: CUresult %d",
			      (int)r);
	n = (size + g - 1) / g * g;
	r = rt.create(h, n, &prop, 0);
	if (r != CUDA_SUCCESS)
		return hf_err(r == CUDA_ERROR_OUT_OF_MEMORY ? COLOCATE_HANDOFF_E_NOMEM :
			      COLOCATE_HANDOFF_E_CUDA, "cuMemCreate(%llu): CUresult %d",
			      (unsigned long long)n, (int)r);
	rc = map_rw(dev, n, *h, ptr);
	if (rc) {
		rt.release(*h);
		return rc;
	}
	*alloc_size = n;
	return COLOCATE_HANDOFF_OK;
}

void hf_vmm_free(void *ptr, uint64_t alloc_size, CUmemGenericAllocationHandle h)
{
	CUdeviceptr va = (CUdeviceptr)(uintptr_t)ptr;

	/* unmap first: the physical memory goes once no mapping and no
	 * handle is left (another process may still map it: that is the point) */
	rt.unmap(va, alloc_size);
	rt.addr_free(va, alloc_size);
	rt.release(h);
}

int hf_vmm_import(int fd, int dev, uint64_t alloc_size, void **ptr,
		  CUmemGenericAllocationHandle *h)
{
	CUresult r;
	int rc = need_vmm();

	if (rc)
		return rc;
	r = rt.import_(h, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
	if (r != CUDA_SUCCESS)
		return hf_err(COLOCATE_HANDOFF_E_CUDA, "cuMemImportFromShareableHandle: CUresult %d",
			      (int)r);
	rc = map_rw(dev, alloc_size, *h, ptr);
	if (rc)
		rt.release(*h);
	return rc;
}

HF_API int colocate_handoff_host_addressable(const void *ptr)
{
	const struct hf_rt *r;

	/* simgpu's device memory is host memory at the same address; a real
	 * GPU's is not (a CPU read of it faults) */
	return ptr && hf_rt_get(&r) == COLOCATE_HANDOFF_OK && r->simgpu;
}
