/*
 * gpu.h - a network plan on the GPU (gpu.cu): cuDNN and cuBLAS layers plus
 * two small kernels of our own, on one stream, with pinned host staging.
 */
#ifndef TONIC_GPU_H
#define TONIC_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "net.h"

#ifdef __cplusplus
extern "C" {
#endif

struct gpu_net;

/* Create handles, stream, descriptors and buffers for p and upload the
 * parameters.  NULL on failure, with the reason in err. */
struct gpu_net *gpu_net_open(const struct net_plan *p, const float *params, char *err,
			     size_t errlen);

/* Pinned host buffers: the input of a query goes to gpu_net_input()
 * (max_size * unit_bytes), its result comes back in gpu_net_output()
 * (max_size * out_per floats). */
void *gpu_net_input(struct gpu_net *g);
float *gpu_net_output(struct gpu_net *g);

/*
 * One query of `size` images / words already in gpu_net_input(): H2D copy,
 * every layer, D2H copy, stream sync.  *device_s is the device time of all
 * of it, between two CUDA events (modelled time on simgpu).  Returns 0, or
 * -1 with the failing call in err.
 */
int gpu_net_run(struct gpu_net *g, int size, double *device_s, char *err, size_t errlen);

/*
 * As gpu_net_run, with the input already on the device at `in` (size units
 * of unit_bytes, copied device-to-device) and the result copied
 * device-to-device to `out` (size * out_per floats): for callers that keep
 * their own device buffers (Camelot's pipeline stages hand them over as
 * IPC handles).  The caller's work on `in` must be complete (synchronised).
 */
int gpu_net_run_dev(struct gpu_net *g, int size, const void *in, float *out, double *device_s,
		    char *err, size_t errlen);

/*
 * Operators [start, end) of the forward pass for `size` images / words
 * (net.h: net_layer_ops numbers them), without the copies: they read
 * whatever the device buffers hold.  *device_s is their device time between
 * two CUDA events around them; *start_ns the host's CLOCK_MONOTONIC when
 * the first event was recorded.  Returns 0, or -1 with the reason in err
 * (a range outside [0, nops) included).
 */
int gpu_net_run_range(struct gpu_net *g, int size, int start, int end, double *device_s,
		      uint64_t *start_ns, char *err, size_t errlen);

void gpu_net_close(struct gpu_net *g);

#ifdef __cplusplus
}
#endif

#endif
