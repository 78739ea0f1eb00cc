/*
 * ctlblock.h - the shared-memory control block between the controller and
 * every application running under the shim.
 *
 * One file, $COLOCATE_RUNTIME_DIR/ctlblock, created by `colocate serve` and
 * mmap'ed MAP_SHARED by the controller (through the cffi module shim._proto,
 * built from ctlblock.c) and by libcolocate.so in each application.  The same
 * C source defines the layout for both sides, so they cannot drift apart.
 *
 * Each application owns one slot, assigned by the controller in its reply to
 * the "register" message.  A slot is two cache lines:
 *
 *   line 0 (counters)  written only by the application, read by the controller.
 *                      On its own line so that an application's per-launch
 *                      atomic increment never bounces a line another process
 *                      writes (a shared global atomic costs ~20x under
 *                      contention).
 *   line 1 (control)   written only by the controller (route, quota), read by
 *                      the application with relaxed atomic loads on the launch
 *                      path.  No lock and no syscall is ever taken there.
 *
 * Versioning: the header carries a magic and CB_VERSION; a reader that finds
 * another version refuses the block and the application runs natively.
 */
#ifndef COLOCATE_CTLBLOCK_H
#define COLOCATE_CTLBLOCK_H

#include <stdint.h>

#define CB_MAGIC     0x455441434f4c4f43ULL /* "COLOCATE" little-endian */
#define CB_VERSION   1u
#define CB_MAX_SLOTS 256u
#define CB_LINE      64u

/* slot states (control line, cb_slot.state) */
#define CB_SLOT_FREE   0u  /* unused                                      */
#define CB_SLOT_LIVE   1u  /* assigned to a live process                  */
#define CB_SLOT_EXITED 2u  /* process gone; controller collects the final */

/* route values (cb_slot.route): 0 = run locally (natively), otherwise the
 * id of a process-pool worker (the process-pool issue gives them meaning),
 * or CB_ROUTE_HOLD: the app's next kernel launch waits (the batch task stays
 * in the ready pool) until the route epoch changes again.  The shim first
 * leaves its worker as for any route change; copies, syncs and frees go on
 * as usual.  It stops waiting and runs locally until the next route change
 * when the controller is gone or after COLOCATE_HOLD_MAX_MS (default
 * 10000).  quota_pct keeps the quota a hold was decided at (for display).
 * Worker ids are small: CB_ROUTE_HOLD is never one. */
#define CB_ROUTE_LOCAL 0u
#define CB_ROUTE_HOLD  0xFFFFFFFFu
/* CB_ROUTE_PART | start << 8 | pct (pct 1..99, start 0..99): the app's
 * launches run in the app itself on an SM partition (a green context, CUDA
 * 12.5+, shim_part.c) of the device's partitions (groups of `gran` SMs)
 * from start % to start + pct % of its SMs (cb_part_span): apps given
 * consecutive spans by the controller get disjoint SMs.  The shim writes
 * what it got into part_first and part_sms.  No worker is involved. */
#define CB_ROUTE_PART  0x80000000u
#define CB_ROUTE_PCT(route) ((route) & 0xFFu)
#define CB_ROUTE_START(route) (((route) >> 8) & 0xFFu)
#define CB_ROUTE_IS_PART(route) (((route) & 0xFFFF0000u) == CB_ROUTE_PART)

/* The partition boundary at x % of a device of `total` SMs in groups of
 * `gran`: the nearest group edge, at most the last whole group. */
static inline unsigned cb_part_edge(unsigned x, unsigned total, unsigned gran)
{
	unsigned groups = total / gran;
	unsigned e = (unsigned)((2ull * x * total + 100ull * gran) / (200ull * gran));

	return e > groups ? groups : e;
}

/* The groups [*first, *first + *count) of the span from start % to
 * start + pct % (past 100 %: the last pct % of the device), at least one.
 * On an H100 (132 SMs, 8 per group, 16 groups): pct 10 -> 2 groups (16
 * SMs), 25 -> 4, 50 -> 8, 75 -> 12, 90 -> 15, 94..100 -> 16; the 16th group
 * is what the driver left (an H200 made 15 groups of 8 and left 12:
 * shim_part.c), so a span to the end has all the SMs; a 30 % service
 * at 0 and a 70 % batch app at 30 take groups 0-4 and 5-15. */
static inline void cb_part_span(unsigned start, unsigned pct, unsigned total, unsigned gran,
				unsigned *first, unsigned *count)
{
	unsigned groups, a, b;

	if (gran == 0)
		gran = 1;
	groups = total / gran ? total / gran : 1;
	if (start + pct > 100)
		start = pct >= 100 ? 0 : 100 - pct;
	a = cb_part_edge(start, total, gran);
	b = cb_part_edge(start + pct, total, gran);
	if (b <= a) {
		if (a >= groups)
			a = groups - 1;
		b = a + 1;
	}
	*first = a;
	*count = b - a;
}

/* That span in SMs: its first SM and how many, gran per group; a span to
 * the last group has the SMs left over too (shim_part.c takes them). */
static inline void cb_part_span_sms(unsigned start, unsigned pct, unsigned total, unsigned gran,
				    unsigned *first_sm, unsigned *sms)
{
	unsigned first, count;

	if (gran == 0)
		gran = 1;
	cb_part_span(start, pct, total, gran, &first, &count);
	*first_sm = first * gran;
	*sms = first + count >= total / gran ? total - first * gran : count * gran;
}

/* SMs of the partition for pct % from the device's first SM. */
static inline unsigned cb_part_sms(unsigned pct, unsigned total, unsigned gran)
{
	unsigned first_sm, sms;

	cb_part_span_sms(0, pct, total, gran, &first_sm, &sms);
	return sms;
}

struct cb_header {
	uint64_t magic;
	uint32_t version;
	uint32_t nslots;
	uint32_t slot_size;          /* sizeof(struct cb_slot), checked by readers */
	uint32_t controller_pid;
	uint64_t generation;         /* bumped by each `colocate serve` start      */
	uint64_t created_ns;         /* CLOCK_REALTIME, for `colocate quotas`      */
	uint8_t  pad[CB_LINE - 40];
};

struct cb_counters {             /* exactly one cache line */
	uint64_t launches;           /* kernel/graph launches issued               */
	uint64_t forwarded;          /* of those, forwarded to a pool worker       */
	uint64_t h2d_bytes;          /* host-to-device bytes copied                */
	uint64_t d2h_bytes;          /* device-to-host bytes copied                */
	int64_t  allocs_live;        /* device allocations not yet freed           */
	int64_t  alloc_bytes_live;   /* bytes in those allocations (when known)    */
	uint64_t syncs;              /* synchronisation calls                      */
	uint64_t last_sync_ns;       /* CLOCK_MONOTONIC of the last sync returning */
};

struct cb_control {              /* exactly one cache line */
	uint32_t state;              /* CB_SLOT_*                                  */
	uint32_t pid;
	uint32_t route;              /* CB_ROUTE_LOCAL or a worker id              */
	uint32_t quota_pct;          /* SM share the policy decided, 1..100        */
	uint64_t route_epoch;        /* bumped by the controller on each change    */
	uint64_t d2d_bytes;          /* device-to-device bytes (app-written; here  */
	                             /* because line 0 is full and it is rare)     */
	uint64_t registered_ns;      /* CLOCK_REALTIME at registration             */
	uint64_t held_ns;            /* time kernel launches waited on             */
	                             /* CB_ROUTE_HOLD (app-written, like d2d_bytes;*/
	                             /* added in the padding: layout unchanged)    */
	uint32_t part_sms;           /* app-written: SMs of the partition its      */
	                             /* launches run on now (0: none, all SMs)     */
	uint32_t part_total;         /* app-written: the device's SMs (with        */
	                             /* part_sms, the rounding of quota_pct)       */
	uint32_t part_local;         /* app-written: launches that ran on all SMs  */
	                             /* while partitioned (graphs, cooperative     */
	                             /* kernels, a partition that failed)          */
	uint32_t part_first;         /* app-written: its partition's first SM (in  */
	                             /* the driver's group order)                  */
};

struct cb_slot {
	struct cb_counters c __attribute__((aligned(CB_LINE)));
	struct cb_control  k __attribute__((aligned(CB_LINE)));
};

struct cb_block {
	struct cb_header hdr __attribute__((aligned(CB_LINE)));
	struct cb_slot   slots[CB_MAX_SLOTS];
};

_Static_assert(sizeof(struct cb_header) == CB_LINE, "header is one line");
_Static_assert(sizeof(struct cb_counters) == CB_LINE, "counters are one line");
_Static_assert(sizeof(struct cb_control) == CB_LINE, "control is one line");
_Static_assert(sizeof(struct cb_slot) == 2 * CB_LINE, "slot is two lines");

/*
 * Open (and with create != 0, create and initialise) the block at path.
 * Returns the mapping or NULL with errno set (EPROTO: bad magic/version/size).
 */
struct cb_block *cb_open(const char *path, int create);
void cb_close(struct cb_block *cb);
uint64_t cb_size(void);

/* Controller side helpers (also used by tests through cffi). */
int  cb_claim_slot(struct cb_block *cb, uint32_t pid);  /* -1 when full */
void cb_release_slot(struct cb_block *cb, uint32_t idx);
/* Returns CLOCK_MONOTONIC ns just after the route is published (0: bad
 * index or no clock). */
uint64_t cb_set_route(struct cb_block *cb, uint32_t idx, uint32_t route,
		      uint32_t quota_pct);
/* Benchmarks: publish routes[k % nroutes], each write period_ns after the
 * last one began, until *stop is set (seen within a period) or max writes
 * are made; stamps[2k], [2k + 1]: CLOCK_MONOTONIC ns before write k and just
 * after its publishing store.  Returns the writes made, -1 on bad arguments
 * or no clock. */
int cb_flip_routes(struct cb_block *cb, uint32_t idx, const uint32_t *routes,
		   uint32_t nroutes, uint32_t quota_pct, uint64_t period_ns,
		   const int *stop, uint64_t *stamps, uint32_t max);

/* Relaxed atomic readers, so that Python sees whole 64-bit values. */
uint64_t cb_load64(const uint64_t *p);
uint32_t cb_load32(const uint32_t *p);

#endif
