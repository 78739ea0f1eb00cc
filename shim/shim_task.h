/*
 * shim_task.h - tasks and queries: the contract between the library-call
 * hooks (hook_lib.c) and the task layer (shim_task.c, shim_query.c).
 *
 * A *task* is what the predictors learn about (C-Laius, Table 1): a kernel
 * launch, or one call of a cuDNN/cuBLAS entry point (a *library task*).
 * Kernels launched while a library task is open on this thread belong to
 * that task and are not tasks of their own.
 *
 * A *query* is one request of a user-facing service, from its input
 * arriving to its result being back on the host: marked by the app with
 * shim/include/colocate.h, or inferred by the shim when the app does not.
 */
#ifndef COLOCATE_SHIM_TASK_H
#define COLOCATE_SHIM_TASK_H

#include <stddef.h>
#include <stdint.h>

/* One recorded parameter of a library task, e.g. {"n", 64}, {"k_h", 3}. */
struct shim_task_param {
	const char *key;        /* a string literal                          */
	double      val;
};

#define SHIM_TASK_MAX_PARAMS 24

/*
 * A library call begins on this thread: api is the entry point's name
 * ("cudnnConvolutionForward"), params what the predictors key on, stream
 * the CUDA stream the library will use (NULL: default stream).  Calls may
 * not nest: a begin inside an open task on the same thread is ignored
 * (cuBLAS calling cuBLAS stays one task), and the matching end too.
 * Returns a token for shim_task_lib_end (0 when ignored).
 */
uint64_t shim_task_lib_begin(const char *api, const struct shim_task_param *params,
			     int nparams, void *stream);
/* The library call returned rc (its own status type, as an int). */
void shim_task_lib_end(uint64_t token, int rc);

/* Non-zero while a library task is open on this thread. */
int shim_task_in_lib(void);

#endif
