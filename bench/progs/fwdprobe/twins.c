/* Host twins of bench/progs/fwdprobe (simgpu; see shim/simgpu/simgpu_twin.h).
 *
 * The probe records when it started and who ran it: the device clock, as
 * the kernel's %globaltimer does on a GPU (simgpu_globaltimer: at
 * SIMGPU_TIMESCALE=1 the host's CLOCK_MONOTONIC at its modelled start, at 0
 * the host's clock when the twin ran), in ns, and the pid of the process
 * running the twin - the application, or the process-pool worker the
 * launch was forwarded to. */
#define _GNU_SOURCE
#include <unistd.h>

#include "simgpu_twin.h"

/* __global__ void fwdprobe_mark(unsigned long long *rec, int i) */
void simgpu_twin__Z13fwdprobe_markPyi(const simgpu_launch *l)
{
	unsigned long long *rec = SIMGPU_ARG(l, 0, unsigned long long *);
	int i = SIMGPU_ARG(l, 1, int);
	rec[2 * i] = simgpu_globaltimer();
	rec[2 * i + 1] = (unsigned long long)getpid();
}
