/*
 * config.c - the simulated device's parameters, read once from the
 * environment, and device time.
 *
 * Environment (H100-like defaults):
 *   SIMGPU_SMS=132            streaming multiprocessors
 *   SIMGPU_MEM_GIB=80         device memory capacity
 *   SIMGPU_BW_GBS=3350        device memory bandwidth
 *   SIMGPU_SM_GFLOPS=500      compute rate of one SM
 *   SIMGPU_SM_BW_GBS          bandwidth one SM can pull (3*BW/SMS)
 *   SIMGPU_LAUNCH_US=3        fixed cost of one kernel
 *   SIMGPU_PCIE_GBS=25        host<->device copy rate
 *   SIMGPU_TIMESCALE=1.0      wall seconds per modelled second; 0 = never wait
 *   SIMGPU_DEFAULT_FLOPS_PER_THREAD=16, SIMGPU_DEFAULT_BYTES_PER_THREAD=8
 *   SIMGPU_NAME               device name
 *   SIMGPU_DIR                shared state (default /dev/shm/simgpu-$UID)
 *   SIMGPU_DEBUG=1            diagnostics on stderr
 *   SIMGPU_SYNC=1             no executor threads: every operation runs in
 *                             the calling thread when it is enqueued (debugging)
 *   SIMGPU_TIMING_ONLY=1      timing only: kernels take their modelled time but
 *                             their host twins do not run (results are wrong).
 *                             For scheduling experiments, where the twins' CPU
 *                             time would otherwise swamp modelled time on a
 *                             small machine; data-dependent control flow (bfs)
 *                             then goes wrong too
 *   SIMGPU_VMM_IGNORE_HINT=1  the emulated cuMemAddressReserve never grants
 *                             the address asked for (vmm.c; read at each call),
 *                             so that callers' fallbacks can be tested
 *   CUDA_MPS_ACTIVE_THREAD_PERCENTAGE  SM quota, read once as real MPS does
 *
 * Device time is modelled time.  With a timescale t > 0 one device second
 * lasts t wall seconds, and device time is (CLOCK_MONOTONIC - epoch) / t;
 * the epoch lives in the shared device state so every process of one
 * device agrees on it.  All processes of a device must use the same
 * SIMGPU_* settings (the quota excepted).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "simgpu_impl.h"

struct sg_config sg_cfg;
atomic_int sg_ready;

static pthread_once_t cfg_once = PTHREAD_ONCE_INIT;
static double epoch;

double sg_mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void sg_log(const char *fmt, ...)
{
	va_list ap;

	if (!sg_cfg.debug)
		return;
	va_start(ap, fmt);
	fprintf(stderr, "simgpu[%d]: ", (int)getpid());
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* A number from the environment; a bad value falls back to the default
 * (with a diagnostic) rather than producing a nonsense device. */
static double env_num(const char *name, double def, double lo, double hi)
{
	const char *v = getenv(name);
	char *end;
	double x;

	if (!v || !*v)
		return def;
	errno = 0;
	x = strtod(v, &end);
	while (*end == ' ')
		end++;
	if (end == v || *end || errno || !isfinite(x) || x < lo || x > hi) {
		fprintf(stderr, "simgpu: ignoring %s=%s (want %g..%g)\n", name, v, lo, hi);
		return def;
	}
	return x;
}

/* mkdir -p with mode 0700 for the components we create. */
static void make_dir(const char *path)
{
	char buf[sizeof(sg_cfg.dir)];
	size_t i, n = strlen(path);

	if (n == 0 || n >= sizeof(buf))
		return;
	memcpy(buf, path, n + 1);
	for (i = 1; i < n; i++) {
		if (buf[i] != '/')
			continue;
		buf[i] = 0;
		if (mkdir(buf, 0700) < 0 && errno != EEXIST)
			return;
		buf[i] = '/';
	}
	mkdir(buf, 0700);
}

static void read_config(void)
{
	struct sg_config *c = &sg_cfg;
	const char *v;

	c->debug = getenv("SIMGPU_DEBUG") && *getenv("SIMGPU_DEBUG") &&
		   strcmp(getenv("SIMGPU_DEBUG"), "0") != 0;
	c->sync = env_num("SIMGPU_SYNC", 0, 0, 1) != 0;
	c->timing_only = env_num("SIMGPU_TIMING_ONLY", 0, 0, 1) != 0;
	c->sms = (int)env_num("SIMGPU_SMS", 132, 1, 100000);
	c->mem_bytes = env_num("SIMGPU_MEM_GIB", 80, 1.0 / 1024, 1 << 20) * (double)(1ULL << 30);
	c->bw = env_num("SIMGPU_BW_GBS", 3350, 1e-3, 1e9) * 1e9;
	c->sm_flops = env_num("SIMGPU_SM_GFLOPS", 500, 1e-6, 1e12) * 1e9;
	c->sm_bw = env_num("SIMGPU_SM_BW_GBS", 3.0 * c->bw / 1e9 / c->sms, 1e-6, 1e9) * 1e9;
	c->launch_s = env_num("SIMGPU_LAUNCH_US", 3, 0, 1e9) * 1e-6;
	c->pcie = env_num("SIMGPU_PCIE_GBS", 25, 1e-6, 1e9) * 1e9;
	c->timescale = env_num("SIMGPU_TIMESCALE", 1.0, 0, 1e6);
	c->flops_per_thread = env_num("SIMGPU_DEFAULT_FLOPS_PER_THREAD", 16, 0, 1e15);
	c->bytes_per_thread = env_num("SIMGPU_DEFAULT_BYTES_PER_THREAD", 8, 0, 1e15);

	/* MPS reads the percentage once, at context creation; so do we. */
	c->quota_pct = env_num("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", 100, 1e-9, 100);
	c->quota_sms = (int)lround(c->quota_pct / 100.0 * c->sms);
	if (c->quota_sms < 1)
		c->quota_sms = 1;
	if (c->quota_sms > c->sms)
		c->quota_sms = c->sms;

	v = getenv("SIMGPU_NAME");
	snprintf(c->name, sizeof(c->name), "%s", v && *v ? v : "simgpu H100-like (CPU model)");
	v = getenv("SIMGPU_DIR");
	if (v && *v)
		snprintf(c->dir, sizeof(c->dir), "%s", v);
	else
		snprintf(c->dir, sizeof(c->dir), "/dev/shm/simgpu-%u", (unsigned)getuid());
	make_dir(c->dir);
}

static void init_once(void)
{
	read_config();
	epoch = sg_mono();
	/* The shared model overrides the epoch so that processes agree. */
	if (sg_cfg.timescale > 0)
		sg_model_open();
	atomic_store_explicit(&sg_ready, 1, memory_order_release);
	sg_arena_init();
	sg_log("%d SMs, quota %.1f%% = %d SMs, %.0f GB/s, timescale %g, dir %s",
	       sg_cfg.sms, sg_cfg.quota_pct, sg_cfg.quota_sms, sg_cfg.bw / 1e9,
	       sg_cfg.timescale, sg_cfg.dir);
}

void sg_init_slow(void)
{
	pthread_once(&cfg_once, init_once);
}

void sg_set_epoch(double mono)
{
	epoch = mono;
}

double sg_dev_now(void)
{
	if (sg_cfg.timescale <= 0)
		return 0;
	return (sg_mono() - epoch) / sg_cfg.timescale;
}

double sg_wall_of(double dev_t)
{
	return epoch + dev_t * sg_cfg.timescale;
}

void sg_sleep_until(double dev_t)
{
	struct timespec ts;
	double w;

	if (sg_cfg.timescale <= 0)
		return;
	w = sg_wall_of(dev_t);
	if (w <= sg_mono())
		return;
	ts.tv_sec = (time_t)w;
	ts.tv_nsec = (long)((w - (double)ts.tv_sec) * 1e9);
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}
