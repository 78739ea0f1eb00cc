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

/* Launches go to a partition of about pct % (1..99) of the device's SMs
 * from the next one on: 0, or -1 when the device or driver cannot make it
 * (said once; the app then runs on all SMs until the route changes). */
int part_enter(uint32_t pct);
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
/* After a local operation queued on stream: the next partition launch
 * there waits for it. */
void part_local_done(void *stream, int ptsz);
/* Fork child: the parent's green contexts and streams are not ours. */
void part_forget(void);

#endif
