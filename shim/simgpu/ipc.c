/*
 * ipc.c - cudaIpc memory handles.
 *
 * Device memory already lives at one address in every process of the
 * device (arena.c), so a handle only has to name the allocation and prove
 * its owner is the same process that made it: { slot, generation of the
 * slot, offset, size, owner pid }.  Opening maps the owner's arena and
 * returns the very same pointer the owner uses.  (A real GPU returns a
 * different address; programs must not rely on either.)
 */
#include <string.h>
#include <unistd.h>

#include "simgpu_impl.h"

#define IPC_MAGIC 0x53474950u     /* "SGIP" */

struct ipc_mem {
	uint32_t magic;
	int32_t  pid;
	uint32_t slot;
	uint32_t gen;
	uint64_t off;
	uint64_t size;
};

_Static_assert(sizeof(struct ipc_mem) <= sizeof(cudaIpcMemHandle_t), "IPC handle too big");

SG_API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
	struct ipc_mem h;
	void *base;
	size_t size;
	int32_t pid;
	uint32_t gen;
	int slot, kind;

	sg_init();
	/* as CUDA: only cudaMalloc memory of this process, not managed memory */
	if (!handle || !sg_arena_find(devPtr, &base, &size, &kind) || kind != SG_MEM_DEVICE)
		return sg_err(cudaErrorInvalidValue);
	slot = sg_arena_own_slot();
	if (slot < 0 || sg_arena_slot_owner(slot, &pid, &gen) < 0)
		return sg_err(cudaErrorInvalidValue);
	memset(&h, 0, sizeof(h));
	h.magic = IPC_MAGIC;
	h.pid = pid;
	h.slot = (uint32_t)slot;
	h.gen = gen;
	h.off = (uint64_t)((uintptr_t)base - SG_ARENA_BASE - (uint64_t)slot * SG_SLOT_SPAN);
	h.size = size;
	memset(handle, 0, sizeof(*handle));
	memcpy(handle, &h, sizeof(h));
	return cudaSuccess;
}

SG_API cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle,
					unsigned int flags)
{
	struct ipc_mem h;
	int32_t pid;
	uint32_t gen;
	char *p;

	sg_init();
	if (!devPtr || (flags & ~(unsigned)cudaIpcMemLazyEnablePeerAccess))
		return sg_err(cudaErrorInvalidValue);
	memcpy(&h, &handle, sizeof(h));
	if (h.magic != IPC_MAGIC || h.slot >= SG_MAX_SLOTS || h.off >= SG_SLOT_SPAN ||
	    h.size == 0 || h.size > SG_SLOT_SPAN - h.off)
		return sg_err(cudaErrorInvalidValue);
	if (h.pid == (int32_t)getpid())
		return sg_err(cudaErrorDeviceUninitialized);   /* as CUDA: not in the owner */
	if (sg_arena_slot_owner((int)h.slot, &pid, &gen) < 0 || pid != h.pid || gen != h.gen)
		return sg_err(cudaErrorInvalidValue);           /* owner gone */
	p = (char *)(uintptr_t)(SG_ARENA_BASE + (uint64_t)h.slot * SG_SLOT_SPAN + h.off);
	if (simgpu_map_peer(p) < 0 || !sg_dev_range_ok(p, h.size))
		return sg_err(cudaErrorMapBufferObjectFailed);
	*devPtr = p;
	return cudaSuccess;
}

SG_API cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
	sg_init();
	/* The mapping stays: other handles may share it, and it costs nothing. */
	if (!sg_in_region(devPtr) || sg_arena_find(devPtr, NULL, NULL, NULL))
		return sg_err(cudaErrorInvalidValue);
	return cudaSuccess;
}

SG_API cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *handle, cudaEvent_t event)
{
	(void)handle, (void)event;
	return sg_err(cudaErrorNotSupported);
}

SG_API cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *event, cudaIpcEventHandle_t handle)
{
	(void)event, (void)handle;
	return sg_err(cudaErrorNotSupported);
}
