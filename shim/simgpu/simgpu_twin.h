/*
 * simgpu_twin.h - the host-twin ABI of simgpu, the CPU test device.
 *
 * A CUDA program that wants to run meaningfully on simgpu ships a small
 * shared object of "host twins": for each kernel, a C function that does on
 * the CPU what the kernel does on the GPU, for the whole grid.  The program
 * itself stays plain CUDA and runs unchanged on a real GPU, which never
 * loads the twins.
 *
 * Lookup (by simgpu, at the kernel's first launch):
 *   symbol  "simgpu_twin_" + <mangled device name>   (required for effect)
 *   symbol  "simgpu_cost_" + <mangled device name>   (optional cost model)
 * searched in, in this order:
 *   1. every path in $SIMGPU_TWINS (colon-separated shared objects),
 *   2. "<path of the executable>.twins.so",
 *   3. the global symbol namespace (dlsym(RTLD_DEFAULT)).
 * A kernel without a twin is timed by the device model but does nothing;
 * simgpu counts such kernels (simgpu_kernel_has_twin()).
 *
 * Twins are also what a process-pool worker runs on simgpu, which is why
 * they live in a shared object and not in the executable.
 */
#ifndef SIMGPU_TWIN_H
#define SIMGPU_TWIN_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct simgpu_dim3 {
	unsigned int x, y, z;
} simgpu_dim3;

typedef struct simgpu_launch {
	simgpu_dim3 grid;
	simgpu_dim3 block;
	size_t      shmem;
	void      **args;    /* exactly as given to the launch: args[i] points
	                        at the i-th kernel parameter                  */
} simgpu_launch;

/* Run the whole grid on the CPU. */
typedef void (*simgpu_twin_fn)(const simgpu_launch *l);

/*
 * Optional: the kernel's work, so the device model can time it.
 *   *flops  arithmetic operations of the whole grid
 *   *bytes  global-memory bytes read + written by the whole grid
 * Without it simgpu derives both from the launch shape
 * (SIMGPU_DEFAULT_FLOPS_PER_THREAD, SIMGPU_DEFAULT_BYTES_PER_THREAD).
 */
typedef void (*simgpu_cost_fn)(const simgpu_launch *l, double *flops,
			       double *bytes);

#define SIMGPU_TWIN_PREFIX "simgpu_twin_"
#define SIMGPU_COST_PREFIX "simgpu_cost_"

/* Argument i of a launch, as a value of type T (C and C++). */
#define SIMGPU_ARG(l, i, T) (*(T *)((l)->args[(i)]))

/* Iterate every thread of the grid: bx..bz block index, tx..tz thread index. */
#define SIMGPU_FOR_EACH_THREAD(l, bx, by, bz, tx, ty, tz)                     \
	for (unsigned bz = 0; bz < (l)->grid.z; bz++)                         \
	for (unsigned by = 0; by < (l)->grid.y; by++)                         \
	for (unsigned bx = 0; bx < (l)->grid.x; bx++)                         \
	for (unsigned tz = 0; tz < (l)->block.z; tz++)                        \
	for (unsigned ty = 0; ty < (l)->block.y; ty++)                        \
	for (unsigned tx = 0; tx < (l)->block.x; tx++)

#ifdef __cplusplus
}
#endif

#endif
