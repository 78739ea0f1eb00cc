/* Host twins of bench/progs/fwdprobe (simgpu; see shim/simgpu/simgpu_twin.h).
 *
 * The probe records when it ran and who ran it: CLOCK_MONOTONIC in ns and
 * the pid of the process running the twin - the application, or the
 * process-pool worker the launch was forwarded to. */
#define _GNU_SOURCE
#include <time.h>
#include <unistd.h>

#include "simgpu_twin.h"

/* __global__ void fwdprobe_mark(unsigned long long *rec, int i) */
void simgpu_twin__Z13fwdprobe_markPyi(const simgpu_launch *l)
{
	unsigned long long *rec = SIMGPU_ARG(l, 0, unsigned long long *);
	int i = SIMGPU_ARG(l, 1, int);
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	rec[2 * i] = (unsigned long long)ts.tv_sec * 1000000000ULL + (unsigned long long)ts.tv_nsec;
	rec[2 * i + 1] = (unsigned long long)getpid();
}
