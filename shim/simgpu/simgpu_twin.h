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

/*
 * The device's clock at the start of the kernel whose twin is running, in
 * ns: what %globaltimer reads in the kernel's first instruction (exported by
 * simgpu's libcudart.so.13, as the texture functions below).  simgpu's
 * device clock reads the host's CLOCK_MONOTONIC at the device's epoch and
 * counts modelled time from there, so at SIMGPU_TIMESCALE=1 it is the
 * host's clock at the kernel's modelled start, not when the twin ran; at
 * other timescales it runs at the device's rate.  The start is when the
 * kernel was sent to the SMs: its stream's earlier work, its dependencies
 * and its own launch call done, plus SIMGPU_LAUNCH_US.  The model decides
 * after the twin has run whether its first block started later: when SMs
 * were held by other contexts' blocks, or when its stream thread ran it
 * after the device's next event had passed (the launch log's wait_us).  At
 * SIMGPU_TIMESCALE=0 there is no device clock: it reads the host's clock
 * when called.  0 outside a twin.
 */
unsigned long long simgpu_globaltimer(void);

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


/* ================================================================
 * Textures and surfaces, for twins (texture.c)
 *
 * A kernel gets its cudaTextureObject_t / cudaSurfaceObject_t as an
 * argument (an unsigned long long); its twin passes that value on to
 * these functions, exported by simgpu's libcudart.so.13 (the twins'
 * shared object needs no -l flag: simgpu is loaded when it loads them).
 * Handles belong to the process that made them.
 *
 * The functions follow the CUDA Programming Guide, "Texture Fetching":
 * addressing (wrap, clamp, mirror, border; wrap and mirror need
 * normalized coordinates, else they act as clamp), point sampling tex(x) = T[floor(x)], linear filtering on the texel grid
 * shifted by 0.5 with weights in 9-bit fixed point (8 fractional bits).
 *
 * Channels: out[0..3] are x, y, z, w; channels the format lacks are 0.
 * Every function returns 0, or -1 for a handle that is not a live object
 * of the right kind (out is then all zeros; simgpu logs it once with
 * SIMGPU_DEBUG).  Never a crash, never a CUDA error.
 *
 * Float fetches return what tex*<float|float2|float4> returns: the float
 * data, or 8/16-bit integer data as normalized float when the texture's
 * read mode is cudaReadModeNormalizedFloat (unsigned: v / (2^n - 1);
 * signed: max(v / (2^(n-1) - 1), -1)).  On an element-type integer
 * texture they return the integers converted to float, and filter as
 * point: CUDA filters only textures that return floating point.
 * Integer fetches (_i) return the element-type integers (sign- or zero-
 * extended to 32 bits; unsigned 32-bit data as its bit pattern); on float
 * data they return the float's bits.  They sample as point.
 *
 * Coordinates: tex1Dfetch takes an element index into linear memory
 * (out of range: zeros); the others take float texture coordinates, in
 * [0, N) or normalized [0, 1) per the texture's normalizedCoords.
 * A texture with fewer dimensions than the call ignores the extra
 * coordinates; one with more reads index 0 of the dimensions not given.
 */
typedef unsigned long long simgpu_tex_t;
typedef unsigned long long simgpu_surf_t;

int simgpu_tex1Dfetch(simgpu_tex_t tex, int x, float out[4]);
int simgpu_tex1D(simgpu_tex_t tex, float x, float out[4]);
int simgpu_tex2D(simgpu_tex_t tex, float x, float y, float out[4]);
int simgpu_tex3D(simgpu_tex_t tex, float x, float y, float z, float out[4]);

int simgpu_tex1Dfetch_i(simgpu_tex_t tex, int x, int out[4]);
int simgpu_tex1D_i(simgpu_tex_t tex, float x, int out[4]);
int simgpu_tex2D_i(simgpu_tex_t tex, float x, float y, int out[4]);
int simgpu_tex3D_i(simgpu_tex_t tex, float x, float y, float z, int out[4]);

/*
 * Surfaces: surf*Dread/surf*Dwrite of size bytes (1, 2, 4, 8 or 16) at
 * byte offset x_bytes of row y of slice z, as CUDA's surf2Dread<T>(&v,
 * surf, x_bytes, y, mode) with size = sizeof(T).  mode is CUDA's
 * cudaSurfaceBoundaryMode (the same values):
 *   SIMGPU_BOUNDARY_ZERO   out of range: reads give zeros, writes are dropped
 *   SIMGPU_BOUNDARY_CLAMP  out of range: the nearest in-range access
 *   SIMGPU_BOUNDARY_TRAP   out of range: the kernel fails (CUDA's default) -
 *                          simgpu records cudaErrorIllegalAddress (sticky),
 *                          reads give zeros, writes are dropped
 * Return 0, -1 for a bad handle or size (nothing done), 1 out of range.
 */
#define SIMGPU_BOUNDARY_ZERO  0
#define SIMGPU_BOUNDARY_CLAMP 1
#define SIMGPU_BOUNDARY_TRAP  2

int simgpu_surf1Dread(simgpu_surf_t surf, void *val, size_t size, int x_bytes, int mode);
int simgpu_surf1Dwrite(simgpu_surf_t surf, const void *val, size_t size, int x_bytes, int mode);
int simgpu_surf2Dread(simgpu_surf_t surf, void *val, size_t size, int x_bytes, int y, int mode);
int simgpu_surf2Dwrite(simgpu_surf_t surf, const void *val, size_t size, int x_bytes, int y,
		       int mode);
int simgpu_surf3Dread(simgpu_surf_t surf, void *val, size_t size, int x_bytes, int y, int z,
		      int mode);
int simgpu_surf3Dwrite(simgpu_surf_t surf, const void *val, size_t size, int x_bytes, int y,
		       int z, int mode);

#ifdef __cplusplus
}
#endif

#endif
