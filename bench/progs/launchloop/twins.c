/* Host twins of bench/progs/launchloop (simgpu; see shim/simgpu/simgpu_twin.h). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "simgpu_twin.h"

/* $LAUNCHLOOP_TWIN_MS: each twin call sleeps this long, a stand-in for a
 * twin with real work, after creating $LAUNCHLOOP_TWIN_MARK if set
 * (tests/test_simgpu_waits.py: a late executor). */
static double twin_sleep_s(void)
{
	static double s = -1;

	if (s < 0) {
		const char *v = getenv("LAUNCHLOOP_TWIN_MS");

		s = v && *v ? atof(v) * 1e-3 : 0;
	}
	return s;
}

/* __global__ void launchloop_tick(int *out, int value):
 *   thread 0 of every block stores value + blockIdx.x into out[0]
 *   (several blocks race; on a GPU any of them may win - here the last). */
void simgpu_twin__Z15launchloop_tickPii(const simgpu_launch *l)
{
	int *out = SIMGPU_ARG(l, 0, int *);
	int value = SIMGPU_ARG(l, 1, int);
	double pause = twin_sleep_s();

	if (pause > 0) {
		struct timespec ts = { (time_t)pause, (long)((pause - (double)(time_t)pause) * 1e9) };
		const char *mark = getenv("LAUNCHLOOP_TWIN_MARK");
		FILE *f = mark && *mark ? fopen(mark, "a") : NULL;

		if (f)                  /* a test's sign that a twin is sleeping */
			fclose(f);
		nanosleep(&ts, NULL);
	}
	if (l->block.x == 0 || l->block.y == 0 || l->block.z == 0)
		return;
	/* threadIdx.x == 0 holds for block.y * block.z threads of each block;
	 * they all store the same value */
	for (unsigned bz = 0; bz < l->grid.z; bz++)
		for (unsigned by = 0; by < l->grid.y; by++)
			for (unsigned bx = 0; bx < l->grid.x; bx++)
				out[0] = value + (int)bx;
}

void simgpu_cost__Z15launchloop_tickPii(const simgpu_launch *l, double *flops, double *bytes)
{
	double writers = (double)l->grid.x * l->grid.y * l->grid.z * l->block.y * l->block.z;
	*flops = writers;                 /* one integer add per storing thread */
	*bytes = writers * sizeof(int);   /* one 4-byte store each               */
}
