/*
 * shim_part.h - SM partitions inside the app (shim_part.c): the route kind
 * "partition", which runs an app's launches on a green context of about its
 * quota's share of the device's SMs, with no worker and no shared memory.
 *
 * Called from shim_fwd.c, which owns routes and the stream table, with
 * fwd.mu held.
 */
#ifndef COLOCATE_SHIM_PART_H
#define COLOCATE_SHIM_PART_H

#include <stdint.h>

#include "shim.h"

/* Launches go to the partition of the span from start % to start + pct %
 * (pct 1..99) of the device's SMs (cb_part_span) from the next one on: 0,
 * or -1 when the device or driver cannot make it (said once; the app then
 * runs on all SMs until the route changes). */
int part_enter(uint32_t start, uint32_t pct);
/* Launches run on all SMs again: every app stream waits (on the device,
 * the host does not) for what its partition stream still has. */
void part_leave(void);
/* A partition is in force. */
int part_on(void);
/* Run l on the partition, in order with the app's stream. */
int part_launch(const struct shim_launch *l);
/* Before a local operation on stream (scope SHIM_FENCE_*): it waits on the
 * device for the partition work it must follow, by the default-stream
 * rules.  Never waits on the host. */
void part_fence(void *stream, int ptsz, int scope);
/* A whole-device sync returned (its part_fence(SHIM_FENCE_ALL) came
 * first): with nothing queued since, no later order needs an event. */
void part_synced(void);
/* After a local operation queued on stream: the next partition launch
 * there waits for it. */
void part_local_done(void *stream, int ptsz);
/* A driver-API launch on stream: the shadow stream to launch it on, with
 * its order in place, or NULL (launch it where the app asked, fenced).
 * Then part_drv_end with the launch's CUresult: 0 the stream owes it; else
 * it was refused there (a CUfunction of the primary context, say), is
 * counted in part_local and the caller launches it on the app's stream. */
void *part_drv_begin(void *stream, int ptsz, int *eager);
void part_drv_end(void *stream, int ptsz, int eager, int code);
/* One launch ran on all SMs while partitioned (part_local). */
void part_all_sms(void);
/* Route kind partition, said at registration: under MPS an active-thread
 * percentage below 100 would cap every partition, so the app's
 * CUDA_MPS_ACTIVE_THREAD_PERCENTAGE goes (said once).  Registration comes
 * at the app's first CUDA call, before its context exists. */
void shim_part_mps_unlimit(void);
/* Fork child: the parent's green contexts and streams are not ours. */
void part_forget(void);

#endif
