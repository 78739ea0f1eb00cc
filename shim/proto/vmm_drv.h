/*
 * vmm_drv.h - the driver's VMM calls, taken from the CUDA runtime the way a
 * program that links only the runtime reaches the driver
 * (cudaGetDriverEntryPointByVersion; simgpu answers it with its emulation).
 * Shared by the shim (shim/shim_vmm.c) and the worker (worker/vmm.c), each
 * with its own table of the calls it makes.
 */
#ifndef COLOCATE_VMM_DRV_H
#define COLOCATE_VMM_DRV_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* Every call we take exists with this ABI since CUDA 10.2 and has no _v2. */
#define VMM_DRV_VERSION 12000

typedef cudaError_t (*vmm_entry_fn)(const char *, void **, unsigned int, unsigned long long,
				    enum cudaDriverEntryPointQueryResult *);

/* A driver call and where its pointer goes in the caller's table. */
struct vmm_sym {
	const char *name;
	size_t off;
};

/* Fill tab from get for each of syms: 0, or -1 naming the call missing. */
static inline int vmm_entry_points(vmm_entry_fn get, const struct vmm_sym *syms, size_t n,
				   void *tab, char *why, size_t whylen)
{
	size_t i;

	for (i = 0; i < n; i++) {
		enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
		void *fn = NULL;
		cudaError_t e = get(syms[i].name, &fn, VMM_DRV_VERSION, cudaEnableDefault, &q);

		if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fn) {
			snprintf(why, whylen, "driver entry point %s not found (error %d, status %d)",
				 syms[i].name, (int)e, (int)q);
			return -1;
		}
		memcpy((char *)tab + syms[i].off, &fn, sizeof(fn));
	}
	return 0;
}

/* The allocation every VMM buffer of ours is: pinned device memory on dev,
 * shareable as a POSIX fd (sent over a Unix socket). */
static inline void vmm_alloc_prop(CUmemAllocationProp *p, int dev)
{
	memset(p, 0, sizeof(*p));
	p->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	p->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p->location.id = dev;
}

/* Read-write access to a mapping for device dev (cuMemSetAccess). */
static inline void vmm_rw_access(CUmemAccessDesc *a, int dev)
{
	memset(a, 0, sizeof(*a));
	a->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	a->location.id = dev;
	a->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

#endif
