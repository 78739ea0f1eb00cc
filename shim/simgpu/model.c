/*
 * model.c - how long a kernel takes on the simulated device.
 *
 * Solo: a kernel that can use s SMs (its MPS quota, and no more SMs than
 * its blocks can fill) does its flops at s * SM rate and moves its bytes
 * at min(device bandwidth, s * per-SM bandwidth):
 *
 *     work time = max(flops / (s * sm_flops), bytes / min(BW, s * sm_bw))
 *
 * so a compute-bound kernel scales with its quota and a memory-bound one
 * stops scaling once about BW / sm_bw SMs saturate memory (the knee).
 * The launch overhead SIMGPU_LAUNCH_US is added by the executor.
 *
 * Together: kernels running at the same time on the device - in this
 * process or any other of the same $SIMGPU_DIR - share it as a fluid.
 * If their SM demands sum past the device's SMs, each gets a proportional
 * share (MPS percentages are caps, not reservations); if their bandwidth
 * demands then sum past BW, every kernel's bandwidth is scaled by the
 * same factor.  Each running kernel keeps the fraction of its work left;
 * rates are recomputed whenever a kernel starts or finishes.
 *
 * The shared state ($SIMGPU_DIR/device0) holds the running kernels under
 * a process-shared robust mutex.  It is advanced lazily: whoever takes the
 * lock first retires every kernel whose modelled finish has passed, at its
 * exact finish time, so the model does not depend on when executors wake.
 * A kernel may join at a time in the recent past (back to the last rate
 * change), which keeps executor wake-up latency out of modelled time.
 * An executor sleeps on a futex in the shared state until its kernel's
 * predicted finish; any rate change wakes it to recompute.  Entries of
 * dead processes are reclaimed.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "simgpu_impl.h"

#define DEV_MAGIC   0x73696d6764657630ULL   /* "simgdev0" */
#define DEV_VERSION 3
#define MAX_RUN     512

enum { E_FREE = 0, E_RUN = 1, E_DONE = 2 };

struct kent {
	int32_t  pid;
	uint32_t state;
	uint64_t id;
	double   sms, flops, bytes;
	double   rem;       /* fraction of the work left at dev->t_ref */
	double   rate;      /* fraction per device second              */
	double   t_join, t_end;
};

struct devstate {
	uint64_t        magic;
	uint32_t        version;
	uint32_t        size;
	double          epoch;      /* CLOCK_MONOTONIC s of device time 0 */
	double          timescale;  /* of the processes using it          */
	pthread_mutex_t lock;
	atomic_uint     seq;        /* futex: bumped at every rate change */
	atomic_uint     nwait;
	uint64_t        next_id;
	uint64_t        njoin;
	double          t_ref;      /* device time the rems refer to      */
	uint32_t        hi;         /* entries at or past hi are all free */
	struct kent     ent[MAX_RUN];
};

static struct devstate *dev;

static int retime(struct devstate *d);

/* Loops stop at the high-water mark, checked: the file is shared. */
static inline int top(void)
{
	return dev->hi < MAX_RUN ? (int)dev->hi : MAX_RUN;
}

static void free_ent(struct kent *e)
{
	e->state = E_FREE;
	e->pid = 0;
	while (dev->hi > 0 && dev->hi <= MAX_RUN && dev->ent[dev->hi - 1].state == E_FREE)
		dev->hi--;
}

static long futex(atomic_uint *uaddr, int op, unsigned val, const struct timespec *ts,
		  unsigned val3)
{
	return syscall(SYS_futex, uaddr, op, val, ts, NULL, val3);
}

double sg_model_solo(const struct sg_work *w)
{
	double s = w->sms > 0 ? w->sms : 1;
	double c = w->flops / (s * sg_cfg.sm_flops);
	double mbw = s * sg_cfg.sm_bw < sg_cfg.bw ? s * sg_cfg.sm_bw : sg_cfg.bw;
	double m = w->bytes / mbw;

	return c > m ? c : m;
}

/* SMs a launch can occupy: its quota, and no more than its blocks fill. */
int sg_kernel_sms(const simgpu_launch *l)
{
	double tpb = (double)l->block.x * l->block.y * l->block.z;
	double blocks = (double)l->grid.x * l->grid.y * l->grid.z;
	double bps, need;

	if (tpb < 1)
		tpb = 1;
	bps = floor(2048.0 / tpb);
	if (bps < 1)
		bps = 1;
	if (bps > 32)
		bps = 32;
	need = ceil(blocks / bps);
	if (need < 1)
		need = 1;
	return need < sg_cfg.quota_sms ? (int)need : sg_cfg.quota_sms;
}

/* ---- the fluid model; dev->lock held in everything below ---- */

static void set_rates(void)
{
	double ssum = 0, scale = 1, dsum = 0, dem[MAX_RUN];
	int i;

	for (i = 0; i < top(); i++)
		if (dev->ent[i].state == E_RUN)
			ssum += dev->ent[i].sms;
	if (ssum > sg_cfg.sms)
		scale = sg_cfg.sms / ssum;
	for (i = 0; i < top(); i++) {
		struct kent *e = &dev->ent[i];
		struct sg_work w;
		double t;

		dem[i] = 0;
		if (e->state != E_RUN)
			continue;
		w.sms = e->sms * scale;
		w.flops = e->flops;
		w.bytes = e->bytes;
		t = sg_model_solo(&w);
		e->rate = t > 0 ? 1.0 / t : 1e30;
		dem[i] = t > 0 ? e->bytes / t : 0;
		dsum += dem[i];
	}
	if (dsum <= sg_cfg.bw)
		return;
	for (i = 0; i < top(); i++) {
		struct kent *e = &dev->ent[i];
		double c, m, s;

		if (e->state != E_RUN || dem[i] <= 0)
			continue;
		s = e->sms * scale;
		c = e->flops / (s * sg_cfg.sm_flops);
		m = e->bytes / (dem[i] * sg_cfg.bw / dsum);
		e->rate = 1.0 / (c > m ? c : m);
	}
}

static void bump(void)
{
	atomic_fetch_add(&dev->seq, 1);
	if (atomic_load(&dev->nwait))
		futex(&dev->seq, FUTEX_WAKE, INT_MAX, NULL, 0);
}

/* Move every running kernel's progress forward to t (no finish before t). */
static void progress_to(double t)
{
	double dt = t - dev->t_ref;
	int i;

	if (dt <= 0)
		return;
	for (i = 0; i < top(); i++) {
		struct kent *e = &dev->ent[i];

		if (e->state != E_RUN)
			continue;
		e->rem -= e->rate * dt;
		if (e->rem < 0)
			e->rem = 0;
	}
	dev->t_ref = t;
}

/* Retire, in order and at their exact times, all kernels done by now. */
static void advance(double now)
{
	int changed = 0;

	for (;;) {
		double tmin = INFINITY;
		int i, imin = -1;

		for (i = 0; i < top(); i++) {
			struct kent *e = &dev->ent[i];
			double tf;

			if (e->state != E_RUN)
				continue;
			tf = dev->t_ref + e->rem / e->rate;
			if (tf < tmin) {
				tmin = tf;
				imin = i;
			}
		}
		if (imin < 0 || tmin > now)
			break;
		progress_to(tmin);
		for (i = 0; i < top(); i++) {
			struct kent *e = &dev->ent[i];

			if (e->state == E_RUN && (i == imin || e->rem <= 1e-12)) {
				e->state = E_DONE;
				e->rem = 0;
				e->t_end = tmin;
			}
		}
		set_rates();
		changed = 1;
	}
	if (changed)
		bump();
}

static int pid_dead(int pid)
{
	return pid > 0 && kill(pid, 0) < 0 && errno == ESRCH;
}

static void reclaim_dead(void)
{
	int i, changed = 0;

	for (i = 0; i < top(); i++) {
		struct kent *e = &dev->ent[i];

		if (e->state != E_FREE && e->pid != getpid() && pid_dead(e->pid)) {
			changed |= e->state == E_RUN;
			free_ent(e);
		}
	}
	if (changed) {
		set_rates();
		bump();
	}
}

static void lock_dev(void)
{
	int r = pthread_mutex_lock(&dev->lock);

	if (r == EOWNERDEAD) {
		/* The holder died mid-update: drop its kernels, make it usable. */
		pthread_mutex_consistent(&dev->lock);
		reclaim_dead();
		set_rates();
	}
}

static void unlock_dev(void)
{
	pthread_mutex_unlock(&dev->lock);
}

static void init_state(struct devstate *d, int shared)
{
	pthread_mutexattr_t a;

	memset(d, 0, sizeof(*d));
	pthread_mutexattr_init(&a);
	if (shared) {
		pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
		pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	}
	pthread_mutex_init(&d->lock, &a);
	pthread_mutexattr_destroy(&a);
	d->epoch = sg_mono();
	d->timescale = sg_cfg.timescale;
	d->version = DEV_VERSION;
	d->size = sizeof(*d);
	d->magic = DEV_MAGIC;
}

void sg_model_open(void)
{
	char path[600];
	struct stat st;
	struct devstate *d = MAP_FAILED;
	int fd;

	snprintf(path, sizeof(path), "%s/device0", sg_cfg.dir);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd >= 0 && flock(fd, LOCK_EX) == 0 && fstat(fd, &st) == 0 &&
	    ((size_t)st.st_size >= sizeof(*d) || ftruncate(fd, sizeof(*d)) == 0))
		d = mmap(NULL, sizeof(*d), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (d != MAP_FAILED) {
		if (d->magic != DEV_MAGIC || d->version != DEV_VERSION || d->size != sizeof(*d))
			init_state(d, 1);
		else if (d->timescale != sg_cfg.timescale && !retime(d)) {
			/* device time means something else to the running kernels */
			sg_log("%s runs at timescale %g, not %g: private device model", path,
			       d->timescale, sg_cfg.timescale);
			munmap(d, sizeof(*d));
			d = calloc(1, sizeof(*d));
			if (d)
				init_state(d, 0);
		}
		if (fd >= 0)
			flock(fd, LOCK_UN);
	} else {
		/* No shared state: this process is alone on its device. */
		sg_log("cannot share %s (%s): private device model", path, strerror(errno));
		d = calloc(1, sizeof(*d));
		if (d)
			init_state(d, 0);
	}
	if (fd >= 0)
		close(fd);
	dev = d;
	if (!dev)
		return;
	sg_set_epoch(dev->epoch);
	lock_dev();
	reclaim_dead();
	unlock_dev();
}

/*
 * A process with another timescale found the device: if nothing runs on
 * it, restart device time with the new scale (all times are relative).
 */
static int retime(struct devstate *d)
{
	int i, busy = 0, r = pthread_mutex_lock(&d->lock);

	if (r == EOWNERDEAD)
		pthread_mutex_consistent(&d->lock);
	else if (r != 0)
		return 0;
	for (i = 0; i < MAX_RUN; i++)
		if (d->ent[i].state == E_RUN && !pid_dead(d->ent[i].pid))
			busy = 1;
	if (!busy) {
		memset(d->ent, 0, sizeof(d->ent));
		d->hi = 0;
		d->epoch = sg_mono();
		d->t_ref = 0;
		d->timescale = sg_cfg.timescale;
	}
	pthread_mutex_unlock(&d->lock);
	return !busy;
}

static void futex_wait_until(atomic_uint *a, unsigned val, double wall)
{
	struct timespec ts;

	ts.tv_sec = (time_t)wall;
	ts.tv_nsec = (long)((wall - (double)ts.tv_sec) * 1e9);
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	if (ts.tv_nsec < 0)
		ts.tv_nsec = 0;
	futex(a, FUTEX_WAIT_BITSET, val, &ts, FUTEX_BITSET_MATCH_ANY);
}

/* At exit, kernels still modelled for this process stop competing. */
__attribute__((destructor)) static void model_exit(void)
{
	int i, r, changed = 0;

	/* an executor may hold the lock right now: never wait for it here */
	if (!dev)
		return;
	r = pthread_mutex_trylock(&dev->lock);
	if (r == EOWNERDEAD)
		pthread_mutex_consistent(&dev->lock);
	else if (r != 0)
		return;
	for (i = 0; i < top(); i++) {
		struct kent *e = &dev->ent[i];

		if (e->state != E_FREE && e->pid == getpid()) {
			changed |= e->state == E_RUN;
			free_ent(e);
		}
	}
	if (changed) {
		set_rates();
		bump();
	}
	pthread_mutex_unlock(&dev->lock);
}

/*
 * Run a kernel's work from device time t (the end of its launch overhead)
 * and wait until the model says it is finished.  Returns its end time.
 */
double sg_model_run(const struct sg_work *w, double t)
{
	double solo = sg_model_solo(w);
	uint64_t id;
	int i;

	if (solo <= 0)
		return t;
	if (sg_cfg.timescale <= 0 || !dev)
		goto alone;
	lock_dev();
	advance(sg_dev_now());
	if (t < dev->t_ref)
		t = dev->t_ref;
	progress_to(t);
	if (++dev->njoin % 256 == 0)
		reclaim_dead();
	for (i = 0; i < MAX_RUN && dev->ent[i].state != E_FREE; i++)
		;
	if (i == MAX_RUN) {
		reclaim_dead();
		for (i = 0; i < MAX_RUN && dev->ent[i].state != E_FREE; i++)
			;
	}
	if (i == MAX_RUN) {
		unlock_dev();
		goto alone;
	}
	if ((uint32_t)i + 1 > dev->hi)
		dev->hi = (uint32_t)i + 1;
	id = ++dev->next_id;
	dev->ent[i] = (struct kent){
		.pid = getpid(), .state = E_RUN, .id = id, .sms = w->sms,
		.flops = w->flops, .bytes = w->bytes, .rem = 1, .t_join = t,
	};
	set_rates();
	bump();
	unlock_dev();

	for (;;) {
		struct kent *e = &dev->ent[i];
		double tf;
		unsigned v;

		lock_dev();
		advance(sg_dev_now());
		if (e->id != id || e->state == E_FREE) {
			/* reclaimed under us (cannot happen to a live pid) */
			unlock_dev();
			return t + solo;
		}
		if (e->state == E_DONE) {
			tf = e->t_end;
			free_ent(e);
			unlock_dev();
			return tf;
		}
		tf = dev->t_ref + e->rem / e->rate;
		v = atomic_load(&dev->seq);
		atomic_fetch_add(&dev->nwait, 1);
		unlock_dev();
		futex_wait_until(&dev->seq, v, sg_wall_of(tf));
		atomic_fetch_sub(&dev->nwait, 1);
	}
alone:
	sg_sleep_until(t + solo);
	return t + solo;
}
