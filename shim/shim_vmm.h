/*
 * shim_vmm.h - the app's device memory, shared with pool workers at the
 * same address through the driver's VMM calls (COLOCATE_MEM=vmm).
 *
 * Opt-in (default COLOCATE_MEM=native: cudaMalloc unchanged) because it is
 * not yet validated on a GPU, and because memory made with cuMemCreate
 * cannot be exported with cudaIpcGetMemHandle (an app that hands its
 * buffers to another process by IPC handle would break).
 */
#ifndef COLOCATE_SHIM_VMM_H
#define COLOCATE_SHIM_VMM_H

#include <stddef.h>
#include <stdint.h>

/* COLOCATE_MEM=vmm and this process's slot of the colocate region is
 * reserved at its address (set up at the first call). */
int  shim_vmm_on(void);
/* Allocate n bytes of shared memory: 0 with *p, or -1 (the caller falls
 * back to the real allocator; the app is then "not all shared"). */
int  shim_vmm_malloc(void **p, size_t n);
/* p is the start of a live allocation of ours. */
int  shim_vmm_owns(const void *p);
/* Free one (workers told first): cudaError_t. */
int  shim_vmm_free(void *p);
/* A native device allocation exists in vmm mode (what: its API, or NULL):
 * the app's memory is not all shared.  The first reason is kept. */
void shim_vmm_note_native(const char *what);
/* NULL while every device allocation of the app is shared (or vmm mode is
 * off), else why not: such an app is not forwarded. */
const char *shim_vmm_unshared(void);
/* After HELLO with FWD_HF_VMM was accepted by worker `worker`: open its mem
 * socket and map every live allocation there.  The connection's fd, or -1
 * with a reason. */
int  shim_vmm_attach(uint32_t worker, char *why, size_t whylen);
void shim_vmm_detach(int fd);
/* 0 once a MAP or UNMAP to this connection failed: the worker does not see
 * all of the app's memory; the connection is void. */
int  shim_vmm_conn_ok(int fd);
/* A forked child: the parent's connections, span and allocations are not
 * ours; vmm is off in the child from then on. */
void shim_vmm_forget(void);
/* p lies in this process's span (vmm on): only shim_vmm_free may free it. */
int  shim_vmm_in_span(const void *p);
/* Bumped (release) each time a connection is voided (a MAP or UNMAP not
 * acked): forwarding compares it with one relaxed load per launch and
 * then asks shim_vmm_conn_ok of its connection. */
extern uint64_t shim_vmm_voids;

#endif
