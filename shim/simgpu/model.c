/*
 * model.c - the live simulated device: the engine's state (engine.c, what
 * the model means: simgpu_model.h) shared by every process of one
 * $SIMGPU_DIR, and how executors wait on it.
 *
 * The shared state ($SIMGPU_DIR/device0) holds the running tasks under a
 * process-shared robust mutex.  It is advanced lazily: whoever takes the
 * lock first handles every event whose time has passed, at its exact time,
 * so the model does not depend on when executors wake.  A task may join at
 * a time in the recent past (back to the last event), which keeps executor
 * wake-up latency out of modelled time.  An executor sleeps on a futex in
 * the shared state until the device's next event; every change wakes it to
 * look again.  Entries of dead processes are reclaimed.
 *
 * A stream's kernel that is queued behind the one ending joins when its
 * executor brings it, after that executor has woken and run the kernel's
 * twin on the CPU: milliseconds of wall time on a loaded host, several
 * device microseconds at the sampler's timescale 1000.  Other processes'
 * events handled meanwhile would push it late (a task joins no earlier
 * than the last event), so that the host's speed and load showed in
 * modelled co-run times.  Instead the device waits: no event past the
 * queued kernel's start is handled until it joins (engine.h, waits), or
 * for at most wait_s of device time past that start ($SIMGPU_WAIT_US of
 * the process that started the device's time; by default 10 s of wall
 * time at a timescale of 10 or more, off below: config.c); a kernel later
 * than that joins at the last event, as any late task does.  The same
 * holds from the moment an executor picks up modelled work no predecessor
 * announced (its stream was idle, or it was enqueued while its
 * predecessor ran: exec.c, successor()), and for work after what the model
 * does not time (memsets, device copies, records, from their end).  Only
 * an idle executor's own wake-up is not covered.
 *
 * $SIMGPU_DEVICE_TRACE=FILE appends one JSON line per stretch of a kernel's
 * execution, written by whichever process handled the event that ended it:
 *   {"pid","id" (the launch log's model id),"t0_us","t1_us"}
 * Without MPS (time slicing) two processes' stretches never overlap.
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

#include "engine.h"
#include "simgpu_impl.h"
#include "unixutil.h"

#define DEV_MAGIC   0x73696d6764657630ULL   /* "simgdev0" */
#define DEV_VERSION 8     /* 8: waits for queued work; 7: model params ABI 2 */
#define MAX_RUN     512
#define MAX_USERS   256
/* Time slicing: a context whose next kernel is already queued keeps the
 * device this long (wall time) for its executor to bring it; the kernel
 * joins at its modelled time, so this shows in modelled time only when
 * the kernel does not come. */
#define HOLD_WALL_S 2e-3

struct devstate {
	uint64_t        magic;
	uint32_t        version;
	uint32_t        size;
	double          epoch;      /* CLOCK_MONOTONIC s of device time 0 */
	double          timescale;  /* of the processes using it          */
	double          wait_s;     /* for queued work (header)           */
	pthread_mutex_t lock;
	atomic_uint     seq;        /* futex: bumped at every change      */
	atomic_uint     nwait;
	uint64_t        njoin;
	int32_t         users[MAX_USERS];   /* pids attached: their settings hold */
	struct en_state en;         /* MAX_RUN tasks follow: keep it last */
};

static struct devstate *dev;
static size_t dev_size;
static int trace_fd = -2;          /* -2 not looked at, -1 none */

static int retime(struct devstate *d);
static void attach(struct devstate *d);

static long futex(atomic_uint *uaddr, int op, unsigned val, const struct timespec *ts,
		  unsigned val3)
{
	return syscall(SYS_futex, uaddr, op, val, ts, NULL, val3);
}

/*
 * A task alone on the device.  Launch loops repeat one shape: each executor
 * thread remembers the last task it timed, so the timescale-0 path (every
 * kernel timed alone, as fast as the executor can go) costs a compare.
 */
double sg_model_solo(const struct sg_work *w)
{
	static __thread struct simgpu_model_task last;
	static __thread double last_s = -1;
	struct simgpu_model_task k = w->t;

	k.ctx = 0;             /* what the time depends on, and only that */
	k.arrive = 0;
	if (last_s >= 0 && !memcmp(&k, &last, sizeof(k)))
		return last_s;
	last = k;
	last_s = en_solo(&sg_cfg.mp, &k);
	return last_s;
}

/* SMs a launch's grid can span at its quota (for the launch log). */
double sg_model_sms(const struct sg_work *w)
{
	return en_span_sms(&sg_cfg.mp, &w->t);
}

/* ---- dev->lock held in everything below ---- */

static void trace_seg(void *arg, const struct en_task *t, double t0, double t1)
{
	char line[160];
	int n;

	(void)arg;
	if (trace_fd == -2) {
		const char *p = getenv("SIMGPU_DEVICE_TRACE");

		trace_fd = p && *p ? open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
	}
	if (trace_fd < 0)
		return;
	n = snprintf(line, sizeof(line), "{\"pid\":%d,\"id\":%llu,\"t0_us\":%.3f,\"t1_us\":%.3f}\n",
		     (int)t->ctx, (unsigned long long)t->id, t0 * 1e6, t1 * 1e6);
	if (n > 0 && (size_t)n < sizeof(line) && write(trace_fd, line, (size_t)n) < 0)
		sg_log("SIMGPU_DEVICE_TRACE: %s", strerror(errno));
}

static void bump(void)
{
	atomic_fetch_add(&dev->seq, 1);
	if (atomic_load(&dev->nwait))
		futex(&dev->seq, FUTEX_WAKE, INT_MAX, NULL, 0);
}

/* Handle every event up to device time t, or to the earliest queued
 * kernel's start (model.c's header); wake waiters if any happened. */
static void advance(double t)
{
	uint64_t ev = dev->en.events;
	double now = sg_dev_now();
	uint32_t lapsed = en_lapse(&dev->en, now, 0);

	if (lapsed)
		sg_log("gave up waiting for %u queued task(s) after %g us of device time", lapsed,
		       dev->wait_s * 1e6);
	en_advance(&dev->en, t, trace_seg, NULL);
	en_stamp(&dev->en, now, dev->wait_s);
	if (dev->en.events != ev || lapsed)
		bump();
}

static int pid_dead(int pid)
{
	/* a zombie (killed, not reaped by its parent yet) runs nothing either */
	return pid > 0 && !colocate_pid_alive((uint32_t)pid);
}

/* When to look at the device again: its next event, or, where a queued
 * kernel holds events back, when the device stops waiting for it (its
 * joining wakes us sooner). */
static double next_look(void)
{
	double tn = en_next_event(&dev->en), until = INFINITY;
	uint32_t i;

	if (!(tn > en_barrier(&dev->en, 0)))
		return tn;
	for (i = 0; i < dev->en.nwaits; i++)
		if (dev->en.waits[i].until < until)
			until = dev->en.waits[i].until;
	return until;
}

/* Held by a wait: drop those of processes that died (killed, their exit
 * handler never ran) rather than wait them out. */
static void reap_waits(void)
{
	uint32_t i;

	for (i = 0; i < dev->en.nwaits;) {
		int32_t ctx = dev->en.waits[i].ctx;

		if (ctx != getpid() && pid_dead(ctx) && en_lapse(&dev->en, -INFINITY, ctx))
			bump(); /* it moved another wait into slot i */
		else
			i++;
	}
}

static void reclaim_dead(void)
{
	uint32_t i;
	int changed = 0;

	for (i = 0; i < dev->en.hi && i < MAX_RUN; i++) {
		struct en_task *e = &dev->en.t[i];

		if (e->state != EN_FREE && e->ctx != getpid() && pid_dead(e->ctx)) {
			en_drop(&dev->en, (int)i, NULL, NULL);
			changed = 1;
		}
	}
	reap_waits();
	if (changed)
		bump();
}

/*
 * r from pthread_mutex_lock or _trylock on d's lock: whether we hold it.
 * A holder that died mid-update left the state to be made usable again.
 */
static int locked(struct devstate *d, int r)
{
	if (r == EOWNERDEAD)
		pthread_mutex_consistent(&d->lock);
	return r == 0 || r == EOWNERDEAD;
}

static void lock_dev(void)
{
	int r = pthread_mutex_lock(&dev->lock);

	if (r == EOWNERDEAD) {
		/* The holder died mid-update: drop its kernels, make it usable. */
		pthread_mutex_consistent(&dev->lock);
		if (dev->en.hi > MAX_RUN)
			dev->en.hi = MAX_RUN;
		reclaim_dead();
	}
}

static void unlock_dev(void)
{
	pthread_mutex_unlock(&dev->lock);
}

/* Device time starts now, at this process's timescale, with no task. */
static void start_time(struct devstate *d)
{
	en_init(&d->en, &sg_cfg.mp, MAX_RUN);
	d->en.hold_s = HOLD_WALL_S / sg_cfg.timescale;
	d->epoch = sg_mono();
	d->timescale = sg_cfg.timescale;
	d->wait_s = sg_cfg.wait_s;
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
	start_time(d);
	d->version = DEV_VERSION;
	d->size = (uint32_t)dev_size;
	d->magic = DEV_MAGIC;
}

/* Another process's device: same timescale and model parameters? */
static int same_device(const struct devstate *d)
{
	return d->timescale == sg_cfg.timescale &&
	       !memcmp(&d->en.p, &sg_cfg.mp, sizeof(sg_cfg.mp));
}

void sg_model_open(void)
{
	char path[600];
	struct stat st;
	struct devstate *d = MAP_FAILED;
	int fd;

	dev_size = sizeof(struct devstate) + MAX_RUN * sizeof(struct en_task);
	snprintf(path, sizeof(path), "%s/device0", sg_cfg.dir);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd >= 0 && flock(fd, LOCK_EX) == 0 && fstat(fd, &st) == 0 &&
	    ((size_t)st.st_size >= dev_size || ftruncate(fd, (off_t)dev_size) == 0))
		d = mmap(NULL, dev_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (d != MAP_FAILED) {
		if (d->magic != DEV_MAGIC || d->version != DEV_VERSION || d->size != dev_size) {
			init_state(d, 1);
			attach(d);
		} else if (!same_device(d) && !retime(d)) {
			/* device time or the model mean something else to its tasks */
			sg_log("%s runs at timescale %g, model %#x/%u, not %g, %#x/%u: private "
			       "device model", path, d->timescale, d->en.p.mech, d->en.p.mps,
			       sg_cfg.timescale, sg_cfg.mp.mech, sg_cfg.mp.mps);
			munmap(d, dev_size);
			d = calloc(1, dev_size);
			if (d)
				init_state(d, 0);
		} else {
			attach(d);
		}
		if (fd >= 0)
			flock(fd, LOCK_UN);
	} else {
		/* No shared state: this process is alone on its device. */
		sg_log("cannot share %s (%s): private device model", path, strerror(errno));
		d = calloc(1, dev_size);
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
	int busy = 0;
	uint32_t i;

	if (!locked(d, pthread_mutex_lock(&d->lock)))
		return 0;
	for (i = 0; i < MAX_USERS; i++)
		if (d->users[i] > 0 && d->users[i] != getpid() && !pid_dead(d->users[i]))
			busy = 1;
	for (i = 0; i < MAX_RUN && i < d->en.hi; i++)
		if (d->en.t[i].state == EN_RUN && !pid_dead(d->en.t[i].ctx))
			busy = 1;
	if (!busy) {
		memset(d->users, 0, sizeof(d->users));
		start_time(d);
	}
	pthread_mutex_unlock(&d->lock);
	return !busy;
}

/* This process uses the device: a process with other settings that comes
 * later gets a private model instead of changing time under our feet. */
static void attach(struct devstate *d)
{
	int i, slot = -1;

	if (!locked(d, pthread_mutex_lock(&d->lock)))
		return;
	for (i = 0; i < MAX_USERS; i++) {
		if (d->users[i] == getpid()) {
			slot = -1;
			break;
		}
		if (slot < 0 && (d->users[i] <= 0 || pid_dead(d->users[i])))
			slot = i;
	}
	if (slot >= 0)
		d->users[slot] = getpid();
	if (d->wait_s != sg_cfg.wait_s)
		sg_log("SIMGPU_WAIT_US: the device waits %g us (its first process's), not %g",
		       d->wait_s * 1e6, sg_cfg.wait_s * 1e6);
	pthread_mutex_unlock(&d->lock);
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

/* At exit, tasks still modelled for this process stop competing. */
__attribute__((destructor)) static void model_exit(void)
{
	uint32_t i;
	int changed = 0;

	/* an executor may hold the lock right now: never wait for it here */
	if (!dev || !locked(dev, pthread_mutex_trylock(&dev->lock)))
		return;
	for (i = 0; i < dev->en.hi && i < MAX_RUN; i++) {
		if (dev->en.t[i].state != EN_FREE && dev->en.t[i].ctx == getpid()) {
			en_drop(&dev->en, (int)i, NULL, NULL);
			changed = 1;
		}
	}
	if (en_lapse(&dev->en, -INFINITY, getpid()))
		changed = 1;
	if (changed)
		bump();
	pthread_mutex_unlock(&dev->lock);
}

/* Sleep until the device changes (seq moves from v) or wall time wall. */
static void wait_change(unsigned v, double wall)
{
	if (wall - sg_mono() <= sg_cfg.wake_margin_s) {
		/* too close to sleep through: poll for it or a change */
		unlock_dev();
		while (atomic_load(&dev->seq) == v && sg_mono() < wall)
			sg_poll_yield();
		return;
	}
	atomic_fetch_add(&dev->nwait, 1);
	unlock_dev();
	futex_wait_until(&dev->seq, v, wall - sg_cfg.wake_margin_s);
	atomic_fetch_sub(&dev->nwait, 1);
}

/* The task this executor thread last ran, when its stream's next work was
 * queued behind it: the device may be waiting for that work. */
static __thread uint64_t queued_after;

/* A wait for work due at device time t (engine.h, en_expect): its token
 * for the work's sg_work.wait, 0 for none. */
uint64_t sg_model_expect(double t)
{
	uint64_t tok;

	if (!sg_model_waits() || queued_after)
		return 0; /* queued_after: a task's end has it waited for */
	lock_dev();
	tok = en_expect(&dev->en, getpid(), t);
	en_stamp(&dev->en, sg_dev_now(), dev->wait_s);
	unlock_dev();
	return tok;
}

int sg_model_waits(void)
{
	return sg_cfg.timescale > 0 && dev && dev->wait_s > 0;
}

/*
 * Run a task from device time t (a kernel: the end of its launch overhead)
 * and wait until the model says it is finished.  Returns its end time;
 * w->start is when its first block was dispatched.
 */
double sg_model_run(struct sg_work *w, double t)
{
	double solo = sg_model_solo(w), now, lead = 0;
	uint64_t id;
	int i;
	uint64_t mine = queued_after;

	queued_after = 0;
	w->start = t;
	w->id = 0;
	if (sg_cfg.timescale <= 0 || !dev)
		goto alone;
	if (solo <= 0 && !mine && !w->wait)
		return t;
	lock_dev();
	if (w->wait) {
		/* enqueued on an idle stream or after unmodelled work: the device
		 * waits for it under this token (sg_model_expect) */
		if (en_keep(&dev->en, mine))
			bump();
		mine = w->wait;
	}
	if (solo <= 0) {
		if (en_keep(&dev->en, mine)) /* nothing to wait for */
			bump();
		unlock_dev();
		return t;
	}
	/* the task the device may be waiting for joins at t (its wait moves
	 * there if the host enqueued it late), once every other one due
	 * before t has joined; until then its own wait holds the device at t.
	 * Two cannot wait for each other: the earlier goes first. */
	if (en_due(&dev->en, mine, t))
		bump();
	for (;;) {
		double tn;
		unsigned v;

		if (!(t > en_barrier(&dev->en, mine)))
			break;
		advance(t); /* and gives up overdue waits */
		if (!(t > en_barrier(&dev->en, mine)))
			break;
		reap_waits();
		v = atomic_load(&dev->seq);
		/* look again at least every 50 ms (wall): a holder that was
		 * killed wakes no one */
		now = sg_dev_now() + 0.05 / sg_cfg.timescale;
		tn = next_look();
		wait_change(v, sg_wall_of(tn < now ? tn : now));
		lock_dev();
	}
	en_keep(&dev->en, mine); /* en_add below wakes the others */
	advance(t);
	if (t < dev->en.t_ref)
		t = dev->en.t_ref;
	if (++dev->njoin % 256 == 0)
		reclaim_dead();
	i = en_add(&dev->en, &w->t, getpid(), t, trace_seg, NULL);
	if (i < 0) {
		reclaim_dead();
		i = en_add(&dev->en, &w->t, getpid(), t, trace_seg, NULL);
	}
	if (i < 0) {
		bump(); /* its wait ended */
		unlock_dev();
		goto alone;
	}
	id = dev->en.t[i].id;
	dev->en.t[i].follow = (uint32_t)w->follow;
	/* w->s: waits are on; the twin has run, so look for work behind it now */
	dev->en.t[i].queued = w->s && sg_stream_next_start(w->s, w->op, &lead);
	dev->en.t[i].lead = lead;
	w->id = id;
	bump();
	unlock_dev();

	for (;;) {
		struct en_task *e = &dev->en.t[i];
		double tn;
		unsigned v;

		lock_dev();
		if (e->id == id && e->state == EN_RUN && !e->queued && w->s &&
		    sg_stream_next_start(w->s, w->op, &lead)) {
			/* enqueued while it ran (before its end is handled below) */
			e->queued = 1;
			e->lead = lead;
		}
		now = sg_dev_now();
		advance(now);
		if (e->id != id || e->state == EN_FREE) {
			/* reclaimed under us (cannot happen to a live pid) */
			unlock_dev();
			return t + solo;
		}
		if (e->state == EN_DONE) {
			double tf = e->t_end;

			w->start = e->t_start >= 0 ? e->t_start : t;
			if (e->queued)
				queued_after = id;
			en_drop(&dev->en, i, trace_seg, NULL);
			unlock_dev();
			return tf;
		}
		tn = next_look();
		if (tn > en_next_event(&dev->en))
			reap_waits();   /* held by a wait */
		if (!(tn < now + 0.05 / sg_cfg.timescale))
			tn = now + 0.05 / sg_cfg.timescale;   /* look again in 50 ms */
		v = atomic_load(&dev->seq);
		wait_change(v, sg_wall_of(tn));
	}
alone:
	sg_sleep_until(t + solo);
	return t + solo;
}
