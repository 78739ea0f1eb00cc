/*
 * ledger.h - one application's own record, in shared memory: its kernel
 * table, its query and task counts, and whether it exited.
 *
 * Why it exists: messages to the controller are one-way and never block the
 * app, so under load they are dropped.  What must not be lost - the exit,
 * the final kernel table, how many queries ended - is therefore not sent
 * but kept here, where the controller reads it whenever it likes: while the
 * app runs, after it returned from main, and after it was SIGKILLed (the
 * file outlives the process).  Messages stay for what a policy reacts to
 * (query boundaries, completed tasks); their loss costs a reaction, never a
 * count.
 *
 * One file per registration, $COLOCATE_RUNTIME_DIR/apps/<slot>-<pid>.ledger,
 * created and sized by the controller before it answers "register", mapped
 * MAP_SHARED by the shim after the answer, unlinked by the controller once
 * it has taken the final record.  The file is sparse: only the pages the
 * app touches cost memory (a few KiB for a typical program).
 *
 * One writer, the application:
 *   - kernel entries are appended under the shim's kernel-table lock and
 *     published by a release store of nkernels (entries below it are whole);
 *   - counters are relaxed atomic adds or stores;
 *   - state goes LG_LIVE at attach and LG_EXITED when the exit handler has
 *     written the last counts (nothing is counted into the ledger after).
 * Readers (the controller) load nkernels with acquire, the rest relaxed.
 *
 * Versioning: magic, LG_VERSION and the sizes in the header; a reader that
 * finds anything else refuses the file (EPROTO).
 */
#ifndef COLOCATE_LEDGER_H
#define COLOCATE_LEDGER_H

#include <stdint.h>

#define LG_MAGIC       0x5245474445444c43ULL /* "CLDEDGER" little-endian */
#define LG_VERSION     1u
#define LG_MAX_KERNELS 32768u                /* the shim's MAX_KERNELS  */
/* Mangled names, NUL-ended: written for every registered kernel (so its
 * counter is in the ledger from its first launch on, without a check on
 * the launch path); libtorch-sized programs register ~30 000 kernels of
 * ~200 bytes.  The file is sparse: only names written cost memory. */
#define LG_NAMES_BYTES (64u << 20)

/* states (lg_header.state) */
#define LG_NEW     0u   /* created by the controller, not attached yet */
#define LG_LIVE    1u   /* the app mapped it and counts into it        */
#define LG_EXITED  2u   /* the app's exit handler finished its counts  */

/* query rules (lg_header.q_rule), as controlplane/protocol.py names them */
#define LG_RULE_NONE     0u
#define LG_RULE_INFERRED 1u
#define LG_RULE_API      2u

/*
 * Query latency histogram: log-linear buckets over nanoseconds, 32 per
 * power of two (a bucket is at most 1/32 ~ 3 % of its value wide), like
 * HdrHistogram's.  Values below 32 ns have a bucket each; values past
 * 2^45 ns (~9.8 h) share the last bucket.
 */
#define LG_HSUB_BITS 5u
#define LG_HSUB      (1u << LG_HSUB_BITS)
#define LG_HMAX_EXP  45u
#define LG_HBUCKETS  (LG_HSUB + (LG_HMAX_EXP - LG_HSUB_BITS) * LG_HSUB)

struct lg_kernel {
	uint64_t launches;      /* successful launches (graph nodes included) */
	uint32_t name_off;      /* into the names area                        */
	uint32_t name_len;      /* without the NUL                            */
	int32_t  twin;          /* simgpu: 1 has a host twin, 0 not; -1 unknown */
	uint32_t pad;
};

struct lg_header {
	/* written once by the controller */
	uint64_t magic;
	uint32_t version;
	uint32_t header_size;    /* sizeof(struct lg_header)                  */
	uint32_t kernel_size;    /* sizeof(struct lg_kernel)                  */
	uint32_t max_kernels;
	uint32_t names_cap;
	uint32_t pid;            /* the registered process                    */
	uint32_t slot;
	uint32_t pad0;
	uint64_t kernels_off;    /* byte offsets in the file                  */
	uint64_t names_off;
	uint64_t created_ns;     /* CLOCK_REALTIME                            */

	/* written by the application */
	uint32_t state;          /* LG_*                                      */
	uint32_t attached_pid;   /* the process that mapped it (== pid)       */
	uint64_t exit_ns;        /* CLOCK_REALTIME when state became EXITED   */
	uint64_t nkernels;       /* entries in use (release/acquire)          */
	uint64_t names_used;     /* bytes of the names area in use            */
	uint64_t kernels_lost;   /* kernels not recorded: table or names full */

	uint32_t q_rule;         /* LG_RULE_* the counts below are of         */
	uint32_t pad1;
	uint64_t q_begun;        /* queries begun                             */
	uint64_t q_ended;        /* queries ended (matched to a begin)        */
	uint64_t q_violations;   /* of those, later than COLOCATE_QOS_MS      */
	uint64_t q_lat_sum_ns;   /* sum of their latencies                    */
	uint64_t q_lat_max_ns;

	uint64_t msgs_dropped;   /* one-way messages the socket refused       */
	uint64_t tasks_fed;      /* tasks the feed took (sent + dropped)      */
	uint64_t tasks_sent;     /* in messages the socket accepted           */
	uint64_t tasks_dropped;

	uint64_t q_hist[LG_HBUCKETS];
};

/* The bucket of a latency v (ns), and the lowest value of bucket i. */
static inline uint32_t lg_bucket(uint64_t v)
{
	uint32_t e;

	if (v < LG_HSUB)
		return (uint32_t)v;
	if (v >> LG_HMAX_EXP)
		return LG_HBUCKETS - 1;
	e = 63u - (uint32_t)__builtin_clzll(v);          /* >= LG_HSUB_BITS */
	return LG_HSUB + (e - LG_HSUB_BITS) * LG_HSUB +
	       (uint32_t)((v >> (e - LG_HSUB_BITS)) - LG_HSUB);
}

static inline uint64_t lg_bucket_low(uint32_t i)
{
	uint32_t e;

	if (i < LG_HSUB)
		return i;
	e = (i - LG_HSUB) / LG_HSUB + LG_HSUB_BITS;
	return (uint64_t)(LG_HSUB + (i - LG_HSUB) % LG_HSUB) << (e - LG_HSUB_BITS);
}

/* The file's size (sparse; the controller ftruncates it to this). */
uint64_t lg_size(void);
/*
 * Map the ledger at path.  create != 0 (controller): make it (replacing any
 * old file), size it, write the header for pid and slot.  create == 0
 * (application): map an existing one and check magic, version and sizes,
 * and that it was made for pid.  Returns the mapping, or NULL with errno
 * set (EPROTO: not a ledger of this version, or not pid's).
 */
struct lg_header *lg_open(const char *path, int create, uint32_t pid, uint32_t slot);
void lg_close(struct lg_header *lg);
/* Entry i (below nkernels) and its name (NUL-ended, inside the file). */
struct lg_kernel *lg_kernel_at(struct lg_header *lg, uint32_t i);
const char *lg_name_at(struct lg_header *lg, uint32_t off, uint32_t len);

#endif
