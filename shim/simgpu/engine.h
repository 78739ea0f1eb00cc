/*
 * engine.h - the device model's engine: the tasks (kernels and copies) on
 * one device and how they advance through device time.  Pure: no locks, no
 * clocks, no processes; the live device (model.c) keeps one engine state in
 * shared memory under its lock, simgpu_model_simulate() a private one.
 *
 * A kernel's bookkeeping is O(running tasks) per event, never O(blocks):
 * blocks are counted, not simulated.  Blocks dispatched together form a
 * cohort (they start and retire together: same work, same SMs' share); a
 * kernel that refills its own SMs wave after wave, with nothing older
 * waiting, keeps one cohort whose remaining work spans all those waves
 * ("folded"), and is unfolded at the next event that may change anything.
 */
#ifndef SIMGPU_ENGINE_H
#define SIMGPU_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "simgpu_model.h"

#define EN_COHORTS 4
#define EN_CTXS    64     /* contexts remembered for round robin */
#define EN_WAITS   64     /* queued work the device may wait for at once */

enum { EN_FREE = 0, EN_RUN = 1, EN_DONE = 2 };

struct en_cohort {
	double n;      /* blocks resident                                     */
	double rem;    /* block-works left: (0, 1] one wave, more when folded */
};

struct en_task {
	uint32_t state;          /* EN_FREE, EN_RUN, EN_DONE                  */
	int32_t  ctx;            /* context: a process                        */
	uint32_t kind;           /* enum simgpu_task_kind                     */
	uint32_t ncoh;
	uint64_t id;             /* unique per engine state                   */
	uint64_t seq;            /* arrival order                             */
	/* shape, fixed at admission */
	double   blocks, per_sm, quota, warps_b;
	double   flops_b, bytes_b;     /* per block; a copy: one block        */
	double   c_int, m_int;         /* compute / memory intensity, (0, 1]  */
	/* state */
	double   undisp;               /* blocks not dispatched yet           */
	struct en_cohort coh[EN_COHORTS];
	double   rate;                 /* block-works per device second       */
	double   t_start, t_end;
	double   t_seg;                /* executing since (trace), -1: not    */
	uint32_t follow;               /* its stream has a kernel queued: its
	                                  context stays for hold_s after it    */
	uint32_t queued;               /* the live device knows its stream's
	                                  next modelled work is queued, due
	                                  lead after its end: a wait (waits)   */
	double   lead;
	/* scratch of en_rates */
	double   sms, excl, u;
	int      held;                 /* 1: its client is limited below the
	                                  device and keeps a share, whose SMs
	                                  are its own (dispatch sets it)       */
};

struct en_state {
	struct simgpu_model_params p;
	uint32_t cap;            /* entries in t[]                            */
	uint32_t hi;             /* entries at or past hi are free            */
	uint64_t next_id, next_seq;
	uint64_t events;         /* events handled: the model's cost          */
	double   t_ref;          /* device time the tasks' state refers to    */
	/* time slicing (no MPS) */
	uint32_t has_active;     /* a context has had the device              */
	uint32_t switching;      /* to next_ctx, until switch_end             */
	int32_t  active_ctx;
	int32_t  next_ctx;
	double   slice_end, switch_end;
	double   hold_s;         /* how long a context whose next kernel is
	                            queued keeps the device idle (model.c:
	                            the executor's wake-up, in device time)  */
	double   hold_until;
	uint32_t stalled;        /* en_advance hit its event guard            */
	/* A stream's queued work joins only when its executor brings it, which
	 * on a loaded host (or after a slow twin) comes after other processes'
	 * events have been handled.  So when a task with `queued` ends, no event
	 * past its successor's start is handled until that work joins (en_keep)
	 * or the live device stops waiting for it (en_stamp, en_lapse). */
	struct {
		uint64_t after;  /* the finished task's id (or en_expect's)  */
		int32_t  ctx;
		double   t;      /* its successor's start                  */
		double   until;  /* given up after (en_stamp; INFINITY: not
		                    stamped yet)                            */
	} waits[EN_WAITS];
	uint32_t nwaits;
	uint64_t kept, lapsed;   /* waits ended by the work, given up        */
	struct {
		int32_t ctx;
		uint32_t used;
		double  t;       /* it last got the device                    */
	} turns[EN_CTXS];
	struct en_task t[];
};

/* A finished stretch of a kernel's execution, for the device trace. */
typedef void (*en_seg_fn)(void *arg, const struct en_task *t, double t0, double t1);

void   en_init(struct en_state *st, const struct simgpu_model_params *p, uint32_t cap);
size_t en_size(uint32_t cap);
/* Admit a task at device time t (no earlier than the last event: advance
 * to t first); its index, or -1 when the table is full. */
int    en_add(struct en_state *st, const struct simgpu_model_task *d, int32_t ctx, double t,
	      en_seg_fn seg, void *arg);
/* Handle every event up to device time now (state stays at the last one:
 * a task may still join between it and now). */
void   en_advance(struct en_state *st, double now, en_seg_fn seg, void *arg);
/* Earliest pending event (INFINITY when none). */
double en_next_event(const struct en_state *st);
/* Device time past which no event may be handled yet: the earliest wait's
 * but that of the kernel queued after task `mine` (0: none), which is
 * about to join (INFINITY when none). */
double en_barrier(const struct en_state *st, uint64_t mine);
/* A wait for a task due at t that no task's end announces (the host
 * enqueued it on an idle stream, or it follows work the device does not
 * model): its token for en_due/en_keep, 0 when t is past or no room. */
uint64_t en_expect(struct en_state *st, int32_t ctx, double t);
/* The work queued after task `after` is here: it starts at t, later than
 * its wait said when it was enqueued late (the wait moves there: 1, which
 * may let others join); */
int    en_due(struct en_state *st, uint64_t after, double t);
/* ... and joins: its wait, if any, ends (1). */
int    en_keep(struct en_state *st, uint64_t after);
/* Deadlines for the waits that have none: window past their start, or
 * past now if that is later (a wait made while events were caught up). */
void   en_stamp(struct en_state *st, double now, double window);
/* Give up the waits whose deadline is before now, or all of context ctx's
 * (ctx != 0: it exited); how many. */
uint32_t en_lapse(struct en_state *st, double now, int32_t ctx);
/* Drop task i (its process died, or it was collected): frees capacity. */
void   en_drop(struct en_state *st, int i, en_seg_fn seg, void *arg);
/* SMs a kernel's whole grid spans at its quota (blocks breadth-first; the
 * fluid model: packed by threads). */
double en_span_sms(const struct simgpu_model_params *p, const struct simgpu_model_task *d);
/* A kernel alone on the device: seconds from arrival to its last block. */
double en_solo(const struct simgpu_model_params *p, const struct simgpu_model_task *d);
/* SMs an MPS active-thread percentage gives a client on a device of sms
 * SMs: whole TPCs, rounded down, at least one; every SM at 100 %.  The live
 * device (config.c) and the simulator (shim/devmodel.py) both ask here. */
int    en_quota_sms(double pct, int sms);
/* Occupancy: blocks of this shape one SM holds, at least 1. */
double en_blocks_per_sm(const struct simgpu_model_params *p, double threads, double regs,
			double smem);

#endif
