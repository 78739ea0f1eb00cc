/*
 * exec.c - what a queued operation does, and how long it takes, on the
 * executor thread of its stream.
 *
 * sg_exec_op() gets the device time t0 at which the operation may start
 * (its stream's clock, its enqueue time and its dependencies) and returns
 * its modelled end time; with a timescale > 0 it also waits, in wall time,
 * until then, so that the host sees the device being busy.
 *
 *   kernel   twin on the CPU (its CPU time overlaps the modelled time),
 *            then SIMGPU_LAUNCH_US, then the work in the device model
 *            (its blocks, threads, registers and shared memory, its flops
 *            and bytes from its cost twin or the launch shape)
 *
 * $SIMGPU_LAUNCH_LOG=FILE appends one JSON line per kernel run, what the
 * device model knew of it, for profilers (bandwidth and IPC per task):
 *   {"pid","seq" (launch order in the process),"name","grid","block",
 *    "flops","bytes","sms" (SMs its grid can span),"quota","start_us",
 *    "dur_us" (device time, from its start after the launch overhead),
 *    "wait_us" (from then to its first block on an SM: the co-runners'
 *    blocks it waited for), "id" (the model's, as in SIMGPU_DEVICE_TRACE),
 *    "regs" (per thread, 0: the default), "smem" (per block, bytes),
 *    "quota_sms" (SMs its quota allows): the rest of the model's task}
 * written with one write(2) per line (O_APPEND: processes may share it).
 *   copy     host<->device: bytes at its direction's share of PCIe (the
 *            device model); device<->device: bytes / BW
 *   memset   bytes / BW
 *   record   completes the event at t0
 *   host fn  runs the function; takes the wall time it took
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <linux/futex.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "simgpu_impl.h"

void sg_futex_wake(atomic_int *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

struct twin_call {
	simgpu_twin_fn       twin;
	simgpu_cost_fn       cost;
	const simgpu_launch *l;
	double               flops, bytes;
};

static void call_twin(void *arg)
{
	struct twin_call *c = arg;

	c->twin(c->l);
}

/* The running twin's kernel start on the device clock (simgpu_globaltimer),
 * device seconds; NAN outside a twin. */
static __thread double twin_start = NAN;

SG_API unsigned long long simgpu_globaltimer(void)
{
	if (isnan(twin_start))
		return 0;
	if (sg_cfg.timescale <= 0)      /* no device clock: the host's, now */
		return (unsigned long long)llround(sg_mono() * 1e9);
	return (unsigned long long)llround(sg_dev_clock(twin_start) * 1e9);
}

static void call_cost(void *arg)
{
	struct twin_call *c = arg;

	c->cost(c->l, &c->flops, &c->bytes);
}

static atomic_ullong launch_seq;
static int log_fd = -2;                 /* -2 not looked at, -1 none */
static pthread_once_t log_once = PTHREAD_ONCE_INIT;

uint64_t sg_launch_seq(void)
{
	return atomic_fetch_add_explicit(&launch_seq, 1, memory_order_relaxed) + 1;
}

static void open_log(void)
{
	const char *p = getenv("SIMGPU_LAUNCH_LOG");

	log_fd = p && *p ? open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644) : -1;
	if (p && *p && log_fd < 0)
		sg_log("cannot open SIMGPU_LAUNCH_LOG %s: %s", p, strerror(errno));
}

static void log_launch(const struct sg_op *op, const struct sg_work *w, double start, double end)
{
	const simgpu_launch *l = &op->u.kern.l;
	char line[1024];
	int n;

	pthread_once(&log_once, open_log);
	if (log_fd < 0)
		return;
	n = snprintf(line, sizeof(line),
		     "{\"pid\":%d,\"seq\":%llu,\"name\":\"%.600s\",\"grid\":[%u,%u,%u],"
		     "\"block\":[%u,%u,%u],\"flops\":%.17g,\"bytes\":%.17g,\"sms\":%g,"
		     "\"quota\":%g,\"start_us\":%.3f,\"dur_us\":%.3f,\"wait_us\":%.3f,"
		     "\"id\":%llu,\"regs\":%g,\"smem\":%g,\"quota_sms\":%g}\n",
		     (int)getpid(), (unsigned long long)op->u.kern.seq, op->u.kern.k->name,
		     l->grid.x, l->grid.y, l->grid.z, l->block.x, l->block.y, l->block.z,
		     w->t.flops, w->t.bytes, sg_model_sms(w), sg_cfg.quota_pct, start * 1e6,
		     (end - start) * 1e6, (w->start - start) * 1e6, (unsigned long long)w->id,
		     w->t.regs, w->t.smem, w->t.quota_sms);
	if (n > 0 && (size_t)n < sizeof(line) && write(log_fd, line, (size_t)n) < 0)
		sg_log("SIMGPU_LAUNCH_LOG: %s", strerror(errno));
}

/* What the device model must know of op, which starts at device time
 * start, before its executor brings it there (a twin, a copy): the wait
 * for it, and where to look for work queued behind it (model.c's waits). */
static void successor(struct sg_stream *s, struct sg_op *op, struct sg_work *w, double start)
{
	if (!sg_model_waits())
		return;
	/* the device waits for op itself from now (no wait yet: its stream was
	 * idle, or its predecessor's end did not know it was queued) */
	w->wait = op->wait ? op->wait : sg_model_expect(start);
	w->s = s;
	w->op = op;
}

/* Work the device model does not time (memsets, device copies, records,
 * waits) ends at end: the device waits for the queued operation after it. */
static void expect_next(struct sg_stream *s, struct sg_op *op, double end)
{
	struct sg_op *n;
	double lead;

	if (sg_model_waits() && (n = sg_stream_next_start(s, op, &lead)) && !n->wait)
		n->wait = sg_model_expect(end + lead);
}

static double exec_kernel(struct sg_stream *s, struct sg_op *op, double t0)
{
	struct sg_kernel *k = op->u.kern.k;
	simgpu_launch *l = &op->u.kern.l;
	struct twin_call c = { k->twin, k->cost, l, 0, 0 };
	double threads = (double)l->grid.x * l->grid.y * l->grid.z *
			 (double)l->block.x * l->block.y * l->block.z;
	struct sg_work w;
	double tj, end;

	memset(&w, 0, sizeof(w));

	tj = t0 + sg_cfg.launch_s;
	successor(s, op, &w, tj);
	twin_start = tj;
	if (k->twin && !sg_cfg.timing_only && sg_protected_call(call_twin, &c) < 0) {
		sg_log("kernel %s faulted: illegal address", k->name);
		sg_async_error(cudaErrorIllegalAddress, 1);
	}
	twin_start = NAN;
	if (k->cost && sg_protected_call(call_cost, &c) == 0 &&
	    isfinite(c.flops) && isfinite(c.bytes) && c.flops >= 0 && c.bytes >= 0) {
		w.t.flops = c.flops;
		w.t.bytes = c.bytes;
	} else {
		w.t.flops = threads * sg_cfg.flops_per_thread;
		w.t.bytes = threads * sg_cfg.bytes_per_thread;
	}
	w.t.kind = SIMGPU_T_KERNEL;
	w.t.blocks = (double)l->grid.x * l->grid.y * l->grid.z;
	w.t.threads = (double)l->block.x * l->block.y * l->block.z;
	w.t.regs = k->regs;
	w.t.smem = (double)l->shmem + k->smem_static;
	w.t.quota_sms = sg_cap_sms(op->u.kern.sms);
	/* only a time-sliced device asks whether its context stays busy */
	w.follow = sg_cfg.timescale > 0 && !sg_cfg.mp.mps && sg_stream_kernel_follows(s, op);
	if (op->consumed) {
		/* the launcher lent us its argument pointers: release it */
		atomic_store(op->consumed, 1);
		sg_futex_wake(op->consumed);
		op->consumed = NULL;
		l->args = NULL;
	}
	if (sg_cfg.timescale > 0) {
		sg_sleep_until(tj);
		end = sg_model_run(&w, tj);
	} else {
		end = tj + sg_model_solo(&w);
		w.start = tj;
	}
	atomic_fetch_add_explicit(&k->modelled_ns, (unsigned long long)llround((end - t0) * 1e9),
				  memory_order_relaxed);
	if (log_fd != -1)
		log_launch(op, &w, tj, end);
	return end;
}

struct copy_call {
	void       *dst;
	const void *src;
	size_t      n;
	int         val;
};

static void call_memcpy(void *arg)
{
	struct copy_call *c = arg;

	memmove(c->dst, c->src, c->n);
}

static void call_memset(void *arg)
{
	struct copy_call *c = arg;

	memset(c->dst, c->val, c->n);
}

static double exec_copy(struct sg_stream *s, struct sg_op *op, double t0)
{
	struct copy_call c = { op->u.copy.dst, op->u.copy.src, op->u.copy.n, 0 };
	struct sg_work w;
	double end;

	memset(&w, 0, sizeof(w));
	if (op->u.copy.dir == SG_H2D || op->u.copy.dir == SG_D2H)
		successor(s, op, &w, t0);
	if (c.n && sg_protected_call(call_memcpy, &c) < 0) {
		sg_log("copy of %zu bytes faulted", c.n);
		sg_async_error(cudaErrorIllegalAddress, 1);
	}
	free(op->u.copy.owned);
	switch (op->u.copy.dir) {
	case SG_H2D:
	case SG_D2H:
		/* PCIe, per direction, shared with every process's copies */
		w.t.kind = op->u.copy.dir == SG_H2D ? SIMGPU_T_H2D : SIMGPU_T_D2H;
		w.t.bytes = (double)c.n;
		if (sg_cfg.timescale > 0)
			return sg_model_run(&w, t0);
		return t0 + sg_model_solo(&w);
	case SG_D2D:
		end = t0 + (double)c.n / sg_cfg.bw;
		expect_next(s, op, end);
		break;
	default:
		return t0;
	}
	sg_sleep_until(end);
	return end;
}

static double exec_memset(struct sg_stream *s, struct sg_op *op, double t0)
{
	struct copy_call c = { op->u.set.dst, NULL, op->u.set.n, op->u.set.val };
	double end;

	if (c.n && sg_protected_call(call_memset, &c) < 0) {
		sg_log("memset of %zu bytes faulted", c.n);
		sg_async_error(cudaErrorIllegalAddress, 1);
	}
	end = t0 + (double)c.n / sg_cfg.bw;
	expect_next(s, op, end);
	sg_sleep_until(end);
	return end;
}

static double host_end(double t0)
{
	double now = sg_dev_now();

	return now > t0 ? now : t0;
}

double sg_exec_op(struct sg_stream *s, struct sg_op *op, double t0)
{
	switch (op->kind) {
	case SG_OP_KERNEL:
		return exec_kernel(s, op, t0);
	case SG_OP_COPY:
		return exec_copy(s, op, t0);
	case SG_OP_MEMSET:
		return exec_memset(s, op, t0);
	case SG_OP_RECORD:
		sg_event_complete(op->u.rec.ev, op->u.rec.gen, t0);
		expect_next(s, op, t0);
		return t0;
	case SG_OP_WAIT:
		expect_next(s, op, t0);
		return t0;
	case SG_OP_HOST:
		op->u.host.fn(op->u.host.data);
		return host_end(t0);
	case SG_OP_CALLBACK:
		op->u.cb.cb(op->u.cb.handle, sg_sticky(), op->u.cb.data);
		return host_end(t0);
	case SG_OP_FREE:
		sg_arena_free(op->u.free.ptr);
		expect_next(s, op, t0);
		return t0;
	}
	(void)s;
	return t0;
}
