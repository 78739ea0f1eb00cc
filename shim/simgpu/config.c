/*
 * config.c - the simulated device's parameters, read once from the
 * environment, and device time.
 *
 * Device parameters: the compiled-in preset below (the same values, with
 * their sources, in presets/h100.env and bench/RESULTS.md), then the file
 * $SIMGPU_PRESET (KEY=VALUE lines, # comments), then the environment.
 *   SIMGPU_SMS=132            streaming multiprocessors
 *   SIMGPU_MEM_GIB=80         device memory capacity
 *   SIMGPU_BW_GBS=3350        device memory bandwidth
 *   SIMGPU_SM_GFLOPS=500      compute rate of one SM
 *   SIMGPU_SM_BW_GBS=101.3    bandwidth one SM pulls with DRAM idle (the
 *                             fluid model: 3*BW/SMS)
 *   SIMGPU_LAUNCH_US=3        fixed cost of one kernel
 *   SIMGPU_PCIE_H2D_GBS=54.8, SIMGPU_PCIE_D2H_GBS=55.1   copy rates
 *                             (SIMGPU_PCIE_GBS sets both; fluid model: 25)
 *   SIMGPU_SM_THREADS=2048, SIMGPU_SM_BLOCKS=32, SIMGPU_SM_REGS=65536,
 *   SIMGPU_SM_SMEM_KIB=228, SIMGPU_BLOCK_SMEM_RESERVED=1024,
 *   SIMGPU_REGS_DEFAULT=32    occupancy rules of one SM
 *   SIMGPU_SAT_WARPS=16       warps an SM needs to reach its peak
 *   SIMGPU_L1_GAMMA=0.2       L1 contention of memory-intense co-residents
 *   SIMGPU_BW_SHARPNESS=2.32, SIMGPU_BW_BETA=0.179, SIMGPU_BW_SHARE=0.83
 *                             DRAM: how the SMs' pull meets bw / (1 + beta),
 *                             and how kernels share it (simgpu_model.h)
 *   SIMGPU_TIMESLICE_US=2091, SIMGPU_CTX_SWITCH_US=150  no-MPS time slicing
 *                             (measured on an H100 and an H200)
 *   SIMGPU_MODEL=full|fluid   the device model (simgpu_model.h); fluid is
 *                             the model before block dispatch (all of the
 *                             mechanisms below off)
 *   SIMGPU_MODEL_OFF=LIST     mechanisms off: blocks,cores,bwq,slice,pcie
 *   SIMGPU_MPS=1              0: no MPS daemon: processes are time-sliced
 *   SIMGPU_DEVICE_TRACE=FILE  one JSON line per stretch a kernel executed
 *   SIMGPU_TIMESCALE=1.0      wall seconds per modelled second; 0 = never wait
 *   SIMGPU_WAKE_MARGIN_US=60  a wait for a modelled time sleeps until this
 *                             long before it and polls the rest (0: sleeps
 *                             throughout, waking by the host's latency late)
 *   SIMGPU_WAIT_US            how long (device time) the device waits for a
 *                             stream's queued work whose executor is late
 *                             (model.c; set by the process that starts the
 *                             device's time).  Default: 10 s of wall time
 *                             (1e7 / timescale) at a timescale of 10 or
 *                             more, where the twins' CPU time then never
 *                             shows in modelled time; 0 (off) below, where
 *                             a wait would hold every other process for a
 *                             late one's wake-up or twin, in wall time,
 *                             which a host that syncs sees
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

#include "engine.h"
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

/* $SIMGPU_PRESET, parsed once: KEY=VALUE lines. */
#define PRESET_MAX 64
static struct {
	char key[48];
	char val[80];
} preset[PRESET_MAX];
static int npreset;

static void read_preset(void)
{
	const char *path = getenv("SIMGPU_PRESET");
	char line[256];
	FILE *f;

	if (!path || !*path)
		return;
	f = fopen(path, "re");
	if (!f) {
		fprintf(stderr, "simgpu: cannot read SIMGPU_PRESET %s: %s\n", path, strerror(errno));
		return;
	}
	while (fgets(line, sizeof(line), f) && npreset < PRESET_MAX) {
		char *p = line, *eq, *e;

		while (*p == ' ' || *p == '\t')
			p++;
		if (*p == '#' || *p == '\n' || !*p)
			continue;
		eq = strchr(p, '=');
		e = p + strcspn(p, "#\n");
		while (e > p && (e[-1] == ' ' || e[-1] == '\t'))
			e--;
		if (!eq || eq > e || eq == p || (size_t)(eq - p) >= sizeof(preset[0].key) ||
		    (size_t)(e - eq - 1) >= sizeof(preset[0].val)) {
			fprintf(stderr, "simgpu: %s: ignoring line %.60s", path, line);
			continue;
		}
		memcpy(preset[npreset].key, p, (size_t)(eq - p));
		memcpy(preset[npreset].val, eq + 1, (size_t)(e - eq - 1));
		npreset++;
	}
	fclose(f);
}

/* A setting: the environment's, else the preset file's, else NULL. */
static const char *setting(const char *name)
{
	const char *v = getenv(name);
	int i;

	if (v && *v)
		return v;
	for (i = 0; i < npreset; i++)
		if (!strcmp(preset[i].key, name))
			return preset[i].val;
	return NULL;
}

/* A number from the settings; a bad value falls back to the default
 * (with a diagnostic) rather than producing a nonsense device. */
static double env_num(const char *name, double def, double lo, double hi)
{
	const char *v = setting(name);
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

/* SIMGPU_MODEL_OFF: the mechanisms a comma list names, as bits. */
static unsigned mech_off(const char *v)
{
	static const struct {
		const char *name;
		unsigned    bit;
	} names[] = {
		{ "blocks", SIMGPU_M_BLOCKS }, { "cores", SIMGPU_M_CORES },
		{ "bwq", SIMGPU_M_BWQ },       { "slice", SIMGPU_M_SLICE },
		{ "pcie", SIMGPU_M_PCIE },     { "all", SIMGPU_M_ALL },
	};
	unsigned off = 0, i;

	while (v && *v) {
		size_t n = strcspn(v, ", ");

		for (i = 0; n && i < sizeof(names) / sizeof(names[0]); i++)
			if (strlen(names[i].name) == n && !strncmp(v, names[i].name, n))
				break;
		if (n && i == sizeof(names) / sizeof(names[0]))
			fprintf(stderr, "simgpu: SIMGPU_MODEL_OFF: unknown mechanism %.*s "
				"(blocks, cores, bwq, slice, pcie, all)\n", (int)n, v);
		else if (n)
			off |= names[i].bit;
		v += n;
		v += strspn(v, ", ");
	}
	return off;
}

/* One SM's pull with DRAM idle on an H100, GB/s: bench/RESULTS.md. */
#define SM_BW_FITTED 101.3

/* A rate the fluid model keeps as it was (fluid_def) unless the environment
 * sets it, whatever a preset file says; the full model reads it as any
 * other setting. */
static double model_num(int fluid, const char *name, double fluid_def, double def, double lo,
			double hi)
{
	const char *v = getenv(name);

	if (fluid && !(v && *v))
		return fluid_def;
	return env_num(name, fluid ? fluid_def : def, lo, hi);
}

/* The device model's parameters (simgpu_model.h): preset, file, environment. */
static void read_model(struct sg_config *c)
{
	struct simgpu_model_params *m = &c->mp;
	const char *v = setting("SIMGPU_MODEL");
	int fluid = v && !strcmp(v, "fluid");
	double pcie, fluid_pcie;

	if (v && strcmp(v, "fluid") && strcmp(v, "full"))
		fprintf(stderr, "simgpu: ignoring SIMGPU_MODEL=%s (want full or fluid)\n", v);
	memset(m, 0, sizeof(*m));
	m->abi = SIMGPU_MODEL_ABI;
	m->mech = fluid ? 0 : SIMGPU_M_ALL & ~mech_off(setting("SIMGPU_MODEL_OFF"));
	m->mps = env_num("SIMGPU_MPS", 1, 0, 1) != 0;
	m->sms = c->sms;
	m->bw = c->bw;
	m->sm_flops = c->sm_flops;
	/* one SM's pull, fitted to the H100's memory-bound kernel alone on 12..132
	 * SMs (101.3 GB/s, bench/RESULTS.md): an SM's requests in flight over
	 * DRAM's idle latency, so a property of the SM, not of DRAM (the H200's
	 * same SM gave 95.9 with 43 % more bandwidth); the fluid model keeps its
	 * 3 BW / SMS (a third of the SMs saturate DRAM) and its results, whatever
	 * a preset file says (the environment still rules) */
	c->sm_bw = model_num(fluid, "SIMGPU_SM_BW_GBS", 3.0 * c->bw / c->sms / 1e9, SM_BW_FITTED,
			     1e-6, 1e9) * 1e9;
	m->sm_bw = c->sm_bw;
	m->sm_threads = env_num("SIMGPU_SM_THREADS", 2048, 32, 1 << 20);
	m->sm_blocks = env_num("SIMGPU_SM_BLOCKS", 32, 1, 1 << 20);
	m->sm_regs = env_num("SIMGPU_SM_REGS", 65536, 256, 1 << 30);
	m->sm_smem = env_num("SIMGPU_SM_SMEM_KIB", 228, 1, 1 << 20) * 1024;
	m->block_smem = env_num("SIMGPU_BLOCK_SMEM_RESERVED", 1024, 0, 1 << 20);
	m->regs_default = env_num("SIMGPU_REGS_DEFAULT", 32, 0, 255);
	m->sat_warps = env_num("SIMGPU_SAT_WARPS", 16, 0, 1 << 20);
	m->l1_gamma = env_num("SIMGPU_L1_GAMMA", 0.2, 0, 100);
	if (setting("SIMGPU_BW_KNEE"))
		fprintf(stderr, "simgpu: SIMGPU_BW_KNEE is no longer read (DRAM saturates smoothly "
				"since 2026-11-28: SIMGPU_BW_SHARPNESS, simgpu_model.h)\n");
	m->bw_sharp = env_num("SIMGPU_BW_SHARPNESS", 2.32, 0.1, 100);
	m->bw_beta = env_num("SIMGPU_BW_BETA", 0.179, 0, 100);
	m->bw_share = env_num("SIMGPU_BW_SHARE", 0.83, 0.05, 4);
	m->slice_s = env_num("SIMGPU_TIMESLICE_US", 2091, 1, 1e9) * 1e-6;
	m->switch_s = env_num("SIMGPU_CTX_SWITCH_US", 150, 0, 1e9) * 1e-6;
	/* the fluid model copied at 25 GB/s both ways: keep its results */
	pcie = env_num("SIMGPU_PCIE_GBS", fluid ? 25 : 0, 0, 1e9);
	fluid_pcie = pcie > 0 ? pcie : 25;
	m->pcie_h2d = model_num(fluid, "SIMGPU_PCIE_H2D_GBS", fluid_pcie, pcie > 0 ? pcie : 54.8,
				1e-6, 1e9) * 1e9;
	m->pcie_d2h = model_num(fluid, "SIMGPU_PCIE_D2H_GBS", fluid_pcie, pcie > 0 ? pcie : 55.1,
				1e-6, 1e9) * 1e9;
}

static void read_config(void)
{
	struct sg_config *c = &sg_cfg;
	const char *v;

	read_preset();
	v = setting("SIMGPU_DEBUG");
	c->debug = v && *v && strcmp(v, "0") != 0;
	c->sync = env_num("SIMGPU_SYNC", 0, 0, 1) != 0;
	c->timing_only = env_num("SIMGPU_TIMING_ONLY", 0, 0, 1) != 0;
	c->sms = (int)env_num("SIMGPU_SMS", 132, 1, 100000);
	c->mem_bytes = env_num("SIMGPU_MEM_GIB", 80, 1.0 / 1024, 1 << 20) * (double)(1ULL << 30);
	c->bw = env_num("SIMGPU_BW_GBS", 3350, 1e-3, 1e9) * 1e9;
	c->sm_flops = env_num("SIMGPU_SM_GFLOPS", 500, 1e-6, 1e12) * 1e9;
	c->launch_s = env_num("SIMGPU_LAUNCH_US", 3, 0, 1e9) * 1e-6;
	c->wake_margin_s = env_num("SIMGPU_WAKE_MARGIN_US", 60, 0, 1e6) * 1e-6;
	c->timescale = env_num("SIMGPU_TIMESCALE", 1.0, 0, 1e6);
	/* default: 10 s of wall time where device time runs 10x slower or
	 * more; off nearer real time (config's header) */
	c->wait_s = env_num("SIMGPU_WAIT_US", c->timescale >= 10 ? 1e7 / c->timescale : 0, 0,
			    1e9) * 1e-6;
	c->flops_per_thread = env_num("SIMGPU_DEFAULT_FLOPS_PER_THREAD", 16, 0, 1e15);
	c->bytes_per_thread = env_num("SIMGPU_DEFAULT_BYTES_PER_THREAD", 8, 0, 1e15);
	read_model(c);

	/* MPS reads the percentage once, at context creation; so do we (whole
	 * TPCs: en_quota_sms, which the simulator shares) */
	c->quota_pct = env_num("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", 100, 1e-9, 100);
	c->quota_sms = en_quota_sms(c->quota_pct, c->sms);

	v = setting("SIMGPU_NAME");
	snprintf(c->name, sizeof(c->name), "%s", v && *v ? v : "simgpu H100-like (CPU model)");
	v = setting("SIMGPU_DIR");
	if (v && *v)
		snprintf(c->dir, sizeof(c->dir), "%s", v);
	else
		snprintf(c->dir, sizeof(c->dir), "/dev/shm/simgpu-%u", (unsigned)getuid());
	make_dir(c->dir);
}

static pthread_once_t read_once = PTHREAD_ONCE_INIT;

static void init_once(void)
{
	pthread_once(&read_once, read_config);
	epoch = sg_mono();
	/* The shared model overrides the epoch so that processes agree. */
	if (sg_cfg.timescale > 0)
		sg_model_open();
	atomic_store_explicit(&sg_ready, 1, memory_order_release);
	sg_arena_init();
	sg_log("%d SMs, quota %.1f%% = %d SMs, %.0f GB/s, timescale %g, model mechanisms %#x, "
	       "mps %u, dir %s", sg_cfg.sms, sg_cfg.quota_pct, sg_cfg.quota_sms, sg_cfg.bw / 1e9,
	       sg_cfg.timescale, sg_cfg.mp.mech, sg_cfg.mp.mps, sg_cfg.dir);
}

/* The parameters without starting the device (a fitter loads simgpu only
 * to ask its model questions). */
SG_API int simgpu_model_params_get(struct simgpu_model_params *p)
{
	pthread_once(&read_once, read_config);
	if (p)
		*p = sg_cfg.mp;
	return 0;
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

double sg_dev_clock(double dev_t)
{
	return epoch + dev_t;
}

double sg_wall_of(double dev_t)
{
	return epoch + dev_t * sg_cfg.timescale;
}

/* Sleep until wake_margin_s before it, then poll (simgpu_impl.h). */
void sg_sleep_until(double dev_t)
{
	struct timespec ts;
	double w, s;

	if (sg_cfg.timescale <= 0)
		return;
	w = sg_wall_of(dev_t);
	s = w - sg_cfg.wake_margin_s;
	if (s > sg_mono()) {
		ts.tv_sec = (time_t)s;
		ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
			;
	}
	while (sg_mono() < w)
		sg_poll_yield();
}
