/* ref.h - the CPU reference forward pass (ref.c). */
#ifndef TONIC_REF_H
#define TONIC_REF_H

#include "net.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Forward `size` images / words of input `in` (float pixels or int32 ids)
 * with parameters `blob`; out gets size * p->out_per floats.
 * Returns 0, or -1 when out of host memory. */
int net_ref_forward(const struct net_plan *p, const float *blob, int size, const void *in,
		    float *out);

#ifdef __cplusplus
}
#endif

#endif
