/* Host twins of bench/progs/texture (simgpu; see shim/simgpu/simgpu_twin.h):
 * the kernels' texture and surface accesses go through simgpu's sampling
 * functions, which take the object handles the kernels were given. */
#include "simgpu_twin.h"

typedef struct { float x, y; } f2;     /* CUDA's float2 */

/* Global x index of every thread: only the x dimension matters here. */
static unsigned long threads_x(const simgpu_launch *l)
{
	return (unsigned long)l->grid.x * l->block.x;
}

/* __global__ void sample2d(cudaTextureObject_t t, const float2 *xy, float *out, int n) */
void simgpu_twin__Z8sample2dyPK6float2Pfi(const simgpu_launch *l)
{
	simgpu_tex_t t = SIMGPU_ARG(l, 0, simgpu_tex_t);
	const f2 *xy = SIMGPU_ARG(l, 1, const f2 *);
	float *out = SIMGPU_ARG(l, 2, float *);
	int n = SIMGPU_ARG(l, 3, int);
	float v[4];

	for (long i = 0; i < n && (unsigned long)i < threads_x(l); i++) {
		simgpu_tex2D(t, xy[i].x, xy[i].y, v);
		out[i] = v[0];
	}
}

/* __global__ void fetch1d(cudaTextureObject_t t, const int *idx, float *out, int n) */
void simgpu_twin__Z7fetch1dyPKiPfi(const simgpu_launch *l)
{
	simgpu_tex_t t = SIMGPU_ARG(l, 0, simgpu_tex_t);
	const int *idx = SIMGPU_ARG(l, 1, const int *);
	float *out = SIMGPU_ARG(l, 2, float *);
	int n = SIMGPU_ARG(l, 3, int);
	float v[4];

	for (long i = 0; i < n && (unsigned long)i < threads_x(l); i++) {
		simgpu_tex1Dfetch(t, idx[i], v);
		out[i] = v[0];
	}
}

static float surf_val(int x, int y)
{
	return 0.5f + x - 2.0f * y;
}

/* Every (x, y) of the grid below (w, h), in the kernels' indexing. */
#define FOR_XY(l, w, h, x, y)                                                  \
	for (int y = 0; y < (h) && (unsigned)y < (l)->grid.y * (l)->block.y; y++) \
	for (int x = 0; x < (w) && (unsigned)x < (l)->grid.x * (l)->block.x; x++)

/* __global__ void surf_fill(cudaSurfaceObject_t s, int w, int h) */
void simgpu_twin__Z9surf_fillyii(const simgpu_launch *l)
{
	simgpu_surf_t s = SIMGPU_ARG(l, 0, simgpu_surf_t);
	int w = SIMGPU_ARG(l, 1, int), h = SIMGPU_ARG(l, 2, int);

	FOR_XY(l, w, h, x, y) {
		float v = surf_val(x, y);

		simgpu_surf2Dwrite(s, &v, sizeof(v), x * (int)sizeof(float), y, SIMGPU_BOUNDARY_TRAP);
	}
}

/* __global__ void surf_double(cudaSurfaceObject_t s, float *out, int w, int h) */
void simgpu_twin__Z11surf_doubleyPfii(const simgpu_launch *l)
{
	simgpu_surf_t s = SIMGPU_ARG(l, 0, simgpu_surf_t);
	float *out = SIMGPU_ARG(l, 1, float *);
	int w = SIMGPU_ARG(l, 2, int), h = SIMGPU_ARG(l, 3, int);

	FOR_XY(l, w, h, x, y) {
		float v, v1;

		simgpu_surf2Dread(s, &v, sizeof(v), x * (int)sizeof(float), y, SIMGPU_BOUNDARY_TRAP);
		out[y * w + x] = 2.0f * v;
		v1 = v + 1.0f;
		simgpu_surf2Dwrite(s, &v1, sizeof(v1), x * (int)sizeof(float), y, SIMGPU_BOUNDARY_TRAP);
	}
}
