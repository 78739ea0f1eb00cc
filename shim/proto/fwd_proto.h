/*
 * fwd_proto.h - the launch-forwarding protocol between libcolocate.so (the
 * shim inside an application) and colocate-worker (a process-pool worker
 * running at a fixed SM quota).  Shared by both sides; nothing else.
 *
 * Transport: one ZeroMQ DEALER per (application, worker) connected to the
 * worker's ROUTER at ipc://<runtime dir>/worker-<N>.sock carries HELLO,
 * HELLO_REPLY, BYE and ERROR; MODULE, DEFINE and LAUNCH travel only in the
 * connection's launch ring in shared memory (below), and a worker answers
 * one on its socket with ERROR TYPE.  Every binary message is ONE zmq frame
 * (no empty delimiter in front; a delimiter is tolerated and then echoed
 * back).  JSON requests use the REQ-style envelope [b"", json] and are
 * answered the same way (worker stats).
 *
 * Frame schema (all integers little-endian, fixed offsets, no padding that
 * is not spelled out; decoders check every length before reading):
 *
 *   header (8 bytes, every frame)
 *     u8  magic    FWD_MAGIC (0xC0: never '{', so JSON and binary differ
 *                  in their first byte)
 *     u8  version  FWD_VERSION; another version is rejected with an ERROR
 *     u8  type     FWD_T_*
 *     u8  flags    per type (HELLO, HELLO_REPLY: FWD_HF_*; LAUNCH:
 *                  FWD_LF_*), else 0
 *     u32 len      length of the whole frame; on the socket it must equal
 *                  the zmq frame's size
 *
 *   HELLO        shim -> worker, first frame of a connection
 *     flags: FWD_HF_RING = launches come through the page's ring (required:
 *            a HELLO without it is answered UNSUPPORTED, and a page whose
 *            ring_size is not a power of two in FWD_RING_MIN..FWD_RING_MAX
 *            BAD_PAGE);
 *            FWD_HF_VMM = the app's memory is VMM-shared: the shim opens the
 *            worker's mem socket after the reply (see "mem socket" below)
 *     u32 pid        the application's pid (the worker drops the app when
 *                    it dies)
 *     u32 worker_id  the route the shim followed; a worker answers
 *                    FWD_S_WRONG_WORKER when it is not its id
 *     u16 page_len, twins_len, device_len, name_len; u32 pad
 *     page path   completion page the worker maps (see struct fwd_page)
 *     twins       colon-separated host-twin libraries (simgpu only)
 *     device      device identity: $SIMGPU_DIR on simgpu, "" on a GPU; a
 *                 worker on another simulated device refuses (pointers
 *                 would mean nothing there)
 *     name        application name, for logs
 *   HELLO_REPLY  worker -> shim
 *     u32 status     FWD_S_*: OK, UNSUPPORTED (no FWD_HF_RING; a real GPU and
 *                    no FWD_HF_VMM: the app's device memory is not shared
 *                    with workers; or FWD_HF_VMM and this worker cannot map
 *                    it), WRONG_WORKER,
 *                    BAD_PAGE, ...
 *     u32 worker_id, quota_pct, pid
 *     u16 msg_len; u16 pad; msg (why, for the shim's log line)
 *     flags: FWD_HF_RING echoed when the worker takes the ring;
 *                    FWD_HF_VMM echoed when it maps the app's memory from the
 *                    mem socket (a shim that asked and gets no echo leaves)
 *   MODULE       shim -> worker, once per module per connection, before
 *                the first DEFINE of a kernel of that module
 *     flags: FWD_MF_VARS = the module has device variables (see there)
 *     u32 mid        the shim's module id (< FWD_MAX_MODULES): one fat
 *                    binary the app registered (__cudaRegisterFatBinary)
 *     u32 pad
 *     u64 size       bytes of the image (fatbin header + payload,
 *                    1..FWD_MAX_MODULE_BYTES)
 *     u64 hash       fwd_image_hash64() of those bytes
 *     u16 path_len; u16 pad2; u32 pad3
 *     path           the file holding the image, written by the shim as
 *                    <runtime dir>/modules/<hash %016x>-<size>.fatbin
 *                    (mode 0600, in a 0700 folder; apps of one binary
 *                    share it).  The worker opens it O_NOFOLLOW, takes it
 *                    only if it is a regular file of its user (or root)
 *                    writable by neither its group nor others (the shim
 *                    reuses a file only on the same terms), of exactly
 *                    `size` bytes,
 *                    starting with the fatbin magic, whose hash is `hash`;
 *                    then loads it with cudaLibraryLoadData.  Libraries
 *                    are cached by (hash, size) for the worker's life: a
 *                    second app of the same binary loads nothing.  A file
 *                    refused is a soft refusal (see "Refusals"); a path
 *                    holding a NUL byte is malformed.
 *   DEFINE       shim -> worker, once per kernel per connection, before
 *                the kernel's first LAUNCH
 *     u32 kid        the shim's kernel id (< FWD_MAX_KERNELS)
 *     u16 nparams    (<= FWD_MAX_PARAMS)
 *     u16 name_len
 *     u32 argbytes   size of the argument buffer a LAUNCH carries
 *     u32 mid        the MODULE holding the kernel: the worker takes it
 *                    with cudaLibraryGetKernel and refuses the DEFINE when
 *                    cudaFuncGetParamInfo gives another layout, or when
 *                    cudaFuncGetAttributes fails on it (which also loads a
 *                    lazily-loaded kernel now, not at its first launch).
 *                    FWD_NO_MODULE: no module was captured (e.g. simgpu's
 *                    CPU library kernels); the worker finds the kernel by
 *                    name, which only simgpu can (else it refuses)
 *     nparams x {u32 offset, u32 size}  (offset + size <= argbytes)
 *     name           mangled device name
 *   LAUNCH       shim -> worker, no reply
 *     u64 seq        per-application launch number, strictly increasing
 *     u32 kid
 *     u16 sidx       stream index (< FWD_MAX_STREAMS), fixed per stream
 *     u8  skind      FWD_SK_*: which default-stream rules the stream obeys
 *     u8  pad
 *     u32 grid[3], block[3], shmem
 *     u32 argbytes   must equal the DEFINE's
 *     argument bytes, laid out at the DEFINE's offsets
 *     flags: FWD_LF_COOP = cooperative launch; FWD_LF_TIMED = the app
 *     wants the launch's device time (its trace or task feed is on): the
 *     worker brackets it with two events and writes the time into the
 *     page's time slots (below).  Untimed launches cost no event.
 *   BYE          shim -> worker: the app leaves; it has drained first
 *   ERROR        worker -> shim (and answer to any malformed frame); to a
 *                shim it means the connection lost work: it replays
 *                locally what did not complete.  FWD_E_CLOSING (seq 0)
 *                comes after a SIGTERM, once the worker has finished
 *                everything it had taken
 *     u32 code       FWD_E_*
 *     u32 pad
 *     u64 seq        the LAUNCH concerned, or 0
 *     u16 msg_len; u16 pad2; u32 pad3; msg
 *
 * The data path does not go through ZeroMQ.  The shim creates a file per
 * connection (struct fwd_page, FWD_TIMES_N time slots, then a ring of
 * ring_size bytes at FWD_RING_OFF), the worker
 * maps it at HELLO, and then:
 *
 *   launches   MODULE, DEFINE and LAUNCH frames, encoded exactly as above,
 *              are written into the ring (single producer: the shim, single
 *              consumer: the app's launcher thread in the worker), which
 *              copies each frame out before checking it.  The producer
 *              publishes ring_head, then wakes the consumer if it sleeps on
 *              ring_wake.  A malformed frame stops the ring for good
 *              and is reported in refused_seq/refused_code (a MODULE or
 *              DEFINE the worker cannot serve does not: see "Refusals").
 *   completions after each forwarded kernel a host function in the worker's
 *              stream stores the kernel's seq in done[sidx] and wakes futex
 *              waiters.  A sync in the app is a wait on memory, and after a
 *              worker dies the page tells exactly which launches completed:
 *              the host function sits between a kernel and the next one in
 *              stream order, so every launch past done[sidx] has not
 *              started, or is the one that was running; submitted[sidx]
 *              (stored before the launch call) tells which of the two.
 *   times      a TIMED launch's device start and duration go into
 *              times[seq % FWD_TIMES_N] (struct fwd_time, right after the
 *              page, before the ring), written by the app's launcher thread
 *              once the launch's end event has completed (a host function
 *              may make no CUDA call on a GPU, so the mark cannot), then
 *              timed[sidx] = seq.  So done[] may run ahead of timed[]; a
 *              slot that does not hold seq once timed[sidx] >= seq means
 *              "no time" (an event failed, or the slot was reused
 *              FWD_TIMES_N launches later).  A slot is a seqlock: seq is
 *              zeroed, the values written, then seq stored (release).
 *              start_ns is CLOCK_MONOTONIC-anchored: the host time at which
 *              the worker recorded its time-zero event for this app on an
 *              idle stream, plus the device time since that event.  Start
 *              times therefore compare across processes only as well as
 *              that anchor holds (simgpu at a timescale > 0: one device
 *              clock, exact up to the record's latency; a GPU: per-process
 *              event bases tied to the host clock within microseconds);
 *              durations are exact device times either way.
 *
 * The ring is the only launch transport: neither I/O thread of ZeroMQ nor
 * the worker's main thread sits between a launch and its kernel, so one
 * app's flood of launches cannot delay heartbeats, stats or other apps; a
 * full ring makes the shim wait (with its liveness checks), where a queue
 * with a high-water mark would drop.
 *
 * Refusals (page version 5): a MODULE or DEFINE the worker cannot serve -
 * a module file refused, a kernel missing from its library or with another
 * layout, a kernel that does not load (cudaFuncGetAttributes), no host twin
 * on simgpu, by name on a worker that cannot - is refused softly: it costs
 * that kernel, not the connection.  The worker logs why, records nothing
 * for the kernel, and publishes the verdict in the page: refused_kid[] gets
 * the DEFINE's kid set (cleared when accepted), then defines_done (DEFINE
 * frames processed on this connection) is bumped (release) and page futex
 * waiters are woken as for done[].  A MODULE refused softly makes every
 * DEFINE naming its mid refused softly.  The shim sends MODULE (when
 * needed) and DEFINE once per kernel per connection and waits, with its
 * usual liveness checks, until defines_done reaches the DEFINEs it sent;
 * a refused kid then runs locally, in order, for as long as that
 * connection lives (kept connections keep the verdict), and is never
 * LAUNCHed there: a LAUNCH of a kid not accepted is malformed.  Malformed
 * frames (lengths, ids, version, a NUL in a path or name, a kid defined
 * differently, a module id reused for another image) are hard refusals:
 * the ring stops (refused_code), and the shim replays locally what did not
 * complete.
 *
 * Compatibility: any change of a frame, of the page or of which frames
 * travel where bumps FWD_VERSION or FWD_PAGE_VERSION; both sides refuse the
 * other version (ERROR VERSION, HELLO_REPLY BAD_PAGE), and the app then
 * runs locally.
 */
#ifndef COLOCATE_FWD_PROTO_H
#define COLOCATE_FWD_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the forwarding protocol is little-endian and so is every host we run on"
#endif

#define FWD_MAGIC         0xC0u
#define FWD_VERSION       6u      /* 2: FWD_LF_TIMED, page times;
                                     3: MODULE, DEFINE.mid;
                                     4: MODULE.hash is fwd_image_hash64;
                                     5: FWD_MF_VARS;
                                     6: FWD_HF_RING required, MODULE,
                                        DEFINE and LAUNCH in the ring only */

#define FWD_MAX_STREAMS   64u      /* stream indexes per application       */
#define FWD_MAX_KERNELS   4096u    /* kernel ids per application           */
#define FWD_MAX_PARAMS    1024u    /* parameters of one kernel             */
#define FWD_MAX_ARGBYTES  32768u   /* CUDA 12.1+ limit is 32764 bytes      */
#define FWD_MAX_STR       4096u    /* any string in a frame                */
#define FWD_MAX_FRAME     (64u * 1024u)
#define FWD_MAX_MODULES   1024u    /* module ids per application           */
#define FWD_NO_MODULE     0xFFFFFFFFu  /* DEFINE.mid: find the kernel by name */
#define FWD_MAX_MODULE_BYTES (1ull << 30)  /* one fatbin image             */
#define FWD_FATBIN_MAGIC  0xBA55ED50u  /* {u32 magic; u16 version; u16 header
                                          size; u64 payload size}, payload */

enum fwd_type {
	FWD_T_HELLO = 1,
	FWD_T_HELLO_REPLY = 2,
	FWD_T_DEFINE = 3,
	FWD_T_LAUNCH = 4,
	FWD_T_BYE = 5,
	FWD_T_ERROR = 6,
	FWD_T_MODULE = 7,
};

/* LAUNCH flags */
#define FWD_LF_COOP 0x01u
#define FWD_LF_TIMED 0x02u       /* time it on the device (see "times")    */
/* MODULE flags */
#define FWD_MF_VARS 0x01u        /* the module registers __device__ or
                                    __constant__ variables: a worker's own
                                    copy of them would not hold the values
                                    the app gave them, so a worker that runs
                                    kernels as a GPU does refuses the module
                                    (softly); on simgpu twins never read them */

/* HELLO flags */
#define FWD_HF_RING 0x01u        /* MODULE/DEFINE/LAUNCH come through the
                                    page's ring: frames back to back from any
                                    byte offset, wrapping at the ring's end;
                                    required, and echoed by the worker       */
#define FWD_HF_VMM  0x02u        /* the app's memory is VMM-shared: expect it
                                    on the mem socket (below) before any
                                    launch that uses it.  Echoed in the
                                    HELLO_REPLY by a worker that takes it; a
                                    worker without by-name kernels on a GPU
                                    accepts an app only with it.  A flag, not
                                    a frame change: FWD_VERSION stayed 3   */

/* stream kinds: the default-stream rules of the app's stream */
enum fwd_skind {
	FWD_SK_LEGACY = 0,       /* the legacy NULL stream: waits for every
	                            blocking stream, and they wait for it     */
	FWD_SK_BLOCKING = 1,     /* created without cudaStreamNonBlocking     */
	FWD_SK_NONBLOCKING = 2,  /* cudaStreamNonBlocking: no implicit sync   */
	FWD_SK_PERTHREAD = 3,    /* a thread's per-thread default stream:
	                            blocking with respect to the legacy one   */
};

/* HELLO_REPLY status */
enum fwd_status {
	FWD_S_OK = 0,
	FWD_S_UNSUPPORTED = 1,   /* cannot run this app's kernels here (a GPU:
	                            its device memory is not VMM-shared)     */
	FWD_S_WRONG_WORKER = 2,
	FWD_S_BAD_PAGE = 3,
	FWD_S_OTHER_DEVICE = 4,
	FWD_S_FULL = 5,          /* too many applications                    */
	FWD_S_CLOSING = 6,       /* shutting down                            */
};

/* ERROR codes */
enum fwd_error {
	FWD_E_MALFORMED = 1,     /* bad magic, length, field                 */
	FWD_E_VERSION = 2,
	FWD_E_UNKNOWN_APP = 3,   /* frame from a connection without HELLO    */
	FWD_E_UNKNOWN_KERNEL = 4,/* LAUNCH of a kid not DEFINEd              */
	FWD_E_CLOSING = 5,       /* the worker is shutting down              */
	FWD_E_TYPE = 6,          /* a type this side does not accept         */
	FWD_E_JSON = 7,          /* unknown JSON request                     */
	FWD_E_MODULE = 8,        /* a module file, or a kernel in it, refused */
};

struct fwd_hdr {
	uint8_t  magic;
	uint8_t  version;
	uint8_t  type;
	uint8_t  flags;
	uint32_t len;
};

struct fwd_hello {
	struct fwd_hdr h;
	uint32_t pid;
	uint32_t worker_id;
	uint16_t page_len, twins_len, device_len, name_len;
	uint32_t pad;
	/* page, twins, device, name follow */
};

struct fwd_hello_reply {
	struct fwd_hdr h;
	uint32_t status;
	uint32_t worker_id;
	uint32_t quota_pct;
	uint32_t pid;
	uint16_t msg_len;
	uint16_t pad;
	/* msg follows */
};

struct fwd_param {
	uint32_t offset;
	uint32_t size;
};

struct fwd_define {
	struct fwd_hdr h;
	uint32_t kid;
	uint16_t nparams;
	uint16_t name_len;
	uint32_t argbytes;
	uint32_t mid;            /* FWD_NO_MODULE: by name */
	/* nparams x struct fwd_param, then name */
};

struct fwd_module {
	struct fwd_hdr h;
	uint32_t mid;
	uint32_t pad;
	uint64_t size;
	uint64_t hash;
	uint16_t path_len;
	uint16_t pad2;
	uint32_t pad3;
	/* path follows */
};

struct fwd_launch {
	struct fwd_hdr h;
	uint64_t seq;
	uint32_t kid;
	uint16_t sidx;
	uint8_t  skind;
	uint8_t  pad;
	uint32_t grid[3];
	uint32_t block[3];
	uint32_t shmem;
	uint32_t argbytes;
	/* argbytes of arguments follow */
};

struct fwd_errmsg {
	struct fwd_hdr h;
	uint32_t code;
	uint32_t pad;
	uint64_t seq;
	uint16_t msg_len;
	uint16_t pad2;
	uint32_t pad3;
	/* msg follows */
};

_Static_assert(sizeof(struct fwd_hdr) == 8, "header");
_Static_assert(sizeof(struct fwd_hello) == 28, "hello");
_Static_assert(sizeof(struct fwd_hello_reply) == 28, "hello reply");
_Static_assert(sizeof(struct fwd_define) == 24, "define");
_Static_assert(sizeof(struct fwd_module) == 40, "module");
_Static_assert(sizeof(struct fwd_launch) == 56, "launch");
_Static_assert(sizeof(struct fwd_errmsg) == 32, "error");

/*
 * The page: one per connection, created by the shim in the runtime dir (and
 * unlinked once the worker has mapped it), MAP_SHARED by both.  The shim
 * writes line 0 before HELLO and the producer line; the worker the rest.
 * Fields written while both run are accessed with atomics; producer and
 * consumer indexes live on lines of their own.
 */
#define FWD_PAGE_MAGIC   0x45474150445746ULL    /* "FWDPAGE" */
#define FWD_PAGE_VERSION 6u                     /* 4: timed[], time slots;
                                                   5: defines_done,
                                                   refused_kid[]: soft
                                                   refusals; 6: bye */
#define FWD_PAGE_SIZE    4096u                  /* the time slots start here */
#define FWD_TIMES_N      8192u                  /* time slots (2 x the shim's window) */
#define FWD_RING_MIN     (64u << 10)
#define FWD_RING_MAX     (64u << 20)

struct fwd_page {
	/* line 0: fixed at creation (shim), worker_pid at HELLO (worker) */
	uint64_t magic;
	uint32_t version;
	uint32_t ring_size;      /* bytes of ring after the time slots, a
	                            power of 2 in FWD_RING_MIN..FWD_RING_MAX   */
	uint32_t worker_pid;
	uint32_t pad0[11];
	/* line 1: completions and health (worker) */
	_Alignas(64) uint32_t wake;   /* futex: bumped after every done[] store */
	uint32_t waiters;        /* shim threads sleeping on wake              */
	uint64_t beat_ns;        /* worker's CLOCK_MONOTONIC, every ~100 ms    */
	uint64_t failed_seq;     /* first launch the worker could not run, 0   */
	int32_t  failed_code;    /* its cudaError_t                            */
	int32_t  refused_code;   /* FWD_E_* when the worker refused ring
	                            content: the connection is void            */
	uint64_t refused_seq;    /* the LAUNCH concerned, or 0                 */
	uint64_t executed;       /* launches completed for this connection     */
	uint64_t defines_done;   /* DEFINE frames processed (version 5): bumped
	                            after the kid's refused_kid bit is written */
	uint64_t pad1[1];
	/* line 2: ring producer (shim) */
	_Alignas(64) uint64_t ring_head;  /* bytes ever written               */
	uint32_t ring_wake;      /* futex: bumped to wake a sleeping consumer  */
	uint32_t bye;            /* set before the BYE frame is sent: an app
	                            found dead with it set left, even if the
	                            frame itself was lost at its exit          */
	uint32_t pad2[12];
	/* line 3: ring consumer (worker) */
	_Alignas(64) uint64_t ring_tail;  /* bytes ever consumed              */
	uint32_t ring_sleeping;  /* consumer sleeps (or is about to) on ring_wake */
	uint32_t pad3[13];
	/* per stream index: seq of the last completed launch (worker) */
	_Alignas(64) uint64_t done[FWD_MAX_STREAMS];
	/* per stream index: seq of the last launch handed to CUDA (worker,
	 * stored before the launch call).  After a worker dies, a launch past
	 * this has certainly not run; the first unfinished one at or below it
	 * may have run in part (see the shim's lose_worker). */
	_Alignas(64) uint64_t submitted[FWD_MAX_STREAMS];
	/* per stream index: seq of the last TIMED launch whose time slot has
	 * been written, or found unwritable (worker; see "times") */
	_Alignas(64) uint64_t timed[FWD_MAX_STREAMS];
	/* by kernel id: set when the worker refused the kid's DEFINE softly,
	 * cleared when it took it; valid up to defines_done (worker; see
	 * "Refusals") */
	_Alignas(64) uint64_t refused_kid[FWD_MAX_KERNELS / 64];
};

/* One timed launch (see "times" above).  All fields atomic. */
struct fwd_time {
	uint64_t seq;            /* 0 while being written                     */
	int64_t  start_ns;       /* CLOCK_MONOTONIC-anchored device start     */
	uint64_t dur_ns;         /* device duration                           */
	uint64_t pad;
};

#define FWD_TIMES_BYTES  ((size_t)FWD_TIMES_N * sizeof(struct fwd_time))
/* The ring follows the time slots; a page file is FWD_RING_OFF + ring_size
 * bytes (the slots are never touched unless launches are timed). */
#define FWD_RING_OFF     (FWD_PAGE_SIZE + FWD_TIMES_BYTES)

static inline struct fwd_time *fwd_times(struct fwd_page *pg)
{
	return (struct fwd_time *)((unsigned char *)pg + FWD_PAGE_SIZE);
}

_Static_assert(sizeof(struct fwd_time) == 32, "time slot");
_Static_assert(sizeof(struct fwd_page) <= FWD_PAGE_SIZE, "page fits");
/* fixed offsets: tests (and any other language) map the page too */
_Static_assert(offsetof(struct fwd_page, wake) == 64, "line 1");
_Static_assert(offsetof(struct fwd_page, submitted) == 768, "submitted");
_Static_assert(offsetof(struct fwd_page, refused_code) == 92, "refused_code");
_Static_assert(offsetof(struct fwd_page, refused_seq) == 96, "refused_seq");
_Static_assert(offsetof(struct fwd_page, ring_head) == 128, "line 2");
_Static_assert(offsetof(struct fwd_page, ring_tail) == 192, "line 3");
_Static_assert(offsetof(struct fwd_page, done) == 256, "done");
_Static_assert(offsetof(struct fwd_page, timed) == 1280, "timed");
_Static_assert(offsetof(struct fwd_page, defines_done) == 112, "defines_done");
_Static_assert(offsetof(struct fwd_page, refused_kid) == 1792, "refused_kid");
_Static_assert(offsetof(struct fwd_page, refused_kid) + FWD_MAX_KERNELS / 8 <= FWD_PAGE_SIZE,
	       "the kernel bitmap ends before the time slots");

/* ---------------------------------------------------------------- decoding */

/*
 * Check a frame's header against its zmq size.  Returns NULL when the
 * header is sound (and copies it to *h), else why not.  Both sides call
 * this first; type-specific checks follow in fwd_check_body().
 */
static inline const char *fwd_check_hdr(const void *buf, size_t n, struct fwd_hdr *h)
{
	if (n < sizeof(*h))
		return "shorter than a header";
	memcpy(h, buf, sizeof(*h));
	if (h->magic != FWD_MAGIC)
		return "bad magic";
	if (h->version != FWD_VERSION)
		return "unsupported version";
	if (h->len != n)
		return "length field does not match the frame";
	return NULL;
}

/* Minimum size of a frame of each type, without its variable part. */
static inline size_t fwd_fixed_size(unsigned type)
{
	switch (type) {
	case FWD_T_HELLO:       return sizeof(struct fwd_hello);
	case FWD_T_HELLO_REPLY: return sizeof(struct fwd_hello_reply);
	case FWD_T_DEFINE:      return sizeof(struct fwd_define);
	case FWD_T_LAUNCH:      return sizeof(struct fwd_launch);
	case FWD_T_BYE:         return sizeof(struct fwd_hdr);
	case FWD_T_ERROR:       return sizeof(struct fwd_errmsg);
	case FWD_T_MODULE:      return sizeof(struct fwd_module);
	default:                return 0;
	}
}

/*
 * Check the variable part of a frame whose header passed fwd_check_hdr:
 * every length field must add up to exactly the frame's size.  The caller
 * then memcpy's the fixed part into an aligned struct and reads the
 * variable part at the offsets this function validated.
 */
static inline const char *fwd_check_body(const void *buf, size_t n, unsigned type)
{
	size_t fixed = fwd_fixed_size(type), want;

	if (!fixed)
		return "unknown frame type";
	if (n < fixed)
		return "truncated";
	switch (type) {
	case FWD_T_HELLO: {
		struct fwd_hello m;

		memcpy(&m, buf, sizeof(m));
		if (m.page_len == 0 || m.page_len > FWD_MAX_STR || m.twins_len > FWD_MAX_STR ||
		    m.device_len > FWD_MAX_STR || m.name_len > FWD_MAX_STR)
			return "string too long (or no page)";
		want = fixed + (size_t)m.page_len + m.twins_len + m.device_len + m.name_len;
		break;
	}
	case FWD_T_HELLO_REPLY: {
		struct fwd_hello_reply m;

		memcpy(&m, buf, sizeof(m));
		want = fixed + m.msg_len;
		break;
	}
	case FWD_T_DEFINE: {
		struct fwd_define m;

		memcpy(&m, buf, sizeof(m));
		if (m.kid >= FWD_MAX_KERNELS)
			return "kernel id out of range";
		if (m.nparams > FWD_MAX_PARAMS || m.argbytes > FWD_MAX_ARGBYTES)
			return "too many parameters or argument bytes";
		if (m.name_len == 0 || m.name_len > FWD_MAX_STR)
			return "bad name length";
		if (m.mid >= FWD_MAX_MODULES && m.mid != FWD_NO_MODULE)
			return "module id out of range";
		want = fixed + (size_t)m.nparams * sizeof(struct fwd_param) + m.name_len;
		if (want == n) {
			const char *p = (const char *)buf + fixed;
			uint32_t i;

			/* the name is used as a C string */
			if (memchr(p + (size_t)m.nparams * sizeof(struct fwd_param), 0, m.name_len))
				return "NUL byte in the kernel name";

			for (i = 0; i < m.nparams; i++) {
				struct fwd_param q;

				memcpy(&q, p + i * sizeof(q), sizeof(q));
				if (q.size == 0 || (uint64_t)q.offset + q.size > m.argbytes)
					return "parameter outside the argument buffer";
			}
		}
		break;
	}
	case FWD_T_LAUNCH: {
		struct fwd_launch m;

		memcpy(&m, buf, sizeof(m));
		if (m.sidx >= FWD_MAX_STREAMS)
			return "stream index out of range";
		if (m.skind > FWD_SK_PERTHREAD)
			return "bad stream kind";
		if (m.kid >= FWD_MAX_KERNELS)
			return "kernel id out of range";
		if (m.argbytes > FWD_MAX_ARGBYTES)
			return "too many argument bytes";
		if (!m.seq)
			return "sequence number 0";
		want = fixed + m.argbytes;
		break;
	}
	case FWD_T_ERROR: {
		struct fwd_errmsg m;

		memcpy(&m, buf, sizeof(m));
		want = fixed + m.msg_len;
		break;
	}
	case FWD_T_MODULE: {
		struct fwd_module m;

		memcpy(&m, buf, sizeof(m));
		if (m.mid >= FWD_MAX_MODULES)
			return "module id out of range";
		if (m.size < 16 || m.size > FWD_MAX_MODULE_BYTES)
			return "bad module size";
		if (m.path_len == 0 || m.path_len > FWD_MAX_STR)
			return "bad path length";
		want = fixed + m.path_len;
		/* opened as a C string: a NUL would name another file */
		if (want == n && memchr((const char *)buf + fixed, 0, m.path_len))
			return "NUL byte in the module path";
		break;
	}
	default:
		want = fixed;
		break;
	}
	return want == n ? NULL : "lengths do not add up to the frame size";
}

/* ---------------------------------------------------------------- mem socket */

/*
 * Device memory shared with a worker at the same address (COLOCATE_MEM=vmm):
 * a unix STREAM socket <runtime dir>/worker-<N>.mem.sock (0600), one
 * connection per (app, worker) connection, opened by the shim right after a
 * HELLO with FWD_HF_VMM was accepted.  Synchronous: the shim sends one
 * message and waits for its ACK before the next (and before the app's
 * cudaMalloc/cudaFree returns).  Fixed-size little-endian messages with
 * their own version (the launch protocol's version does not cover them):
 *
 *   MAP    shim -> worker, with exactly one fd (SCM_RIGHTS, on the message's
 *          first byte): the allocation's cuMemExportToShareableHandle
 *          (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR).  The worker imports
 *          it, maps it at addr (inside its reservation of the colocate
 *          region) or, when it cannot, anywhere (its launcher then
 *          translates pointer arguments), sets access, and ACKs waddr.
 *   UNMAP  shim -> worker, no fd: the allocation at addr is freed (the app
 *          has fenced its forwarded work first).
 *   ACK    worker -> shim: status FWD_MEM_S_*, waddr (MAP: where it is
 *          mapped in the worker; 0 when status is not OK).
 *
 * The peer must run as the worker's uid and pid must be its pid
 * (SO_PEERCRED); addr, size nonzero and multiples of FWD_MEM_ALIGN; a MAP
 * lies inside the colocate region and overlaps no live mapping of any
 * connection; an UNMAP names a mapping of the same connection; len ==
 * sizeof(struct fwd_mem_msg).  A bad message is ACKed with
 * FWD_MEM_S_REFUSED (and logged); after a framing error (magic, version,
 * length) the worker closes the connection.  A connection belongs to the
 * newest app entry of its pid that has none (HELLO with FWD_HF_VMM); when
 * it closes (app gone, or its worker connection closed) that entry leaves
 * after its queued launches and the worker unmaps the connection's memory
 * once they are done (not when the pid goes: the app may come back at once
 * on a new connection and map the same addresses).
 *
 * The colocate region: FWD_MEM_SLOTS slots of FWD_MEM_SLOT_SPAN bytes at
 * FWD_MEM_BASE.  An app maps its memory in its slot (its control-block
 * slot index, else a slot by pid hash); a worker reserves the whole region.
 */
#define FWD_MEM_MAGIC     0x4d454d43u   /* "CMEM" */
#define FWD_MEM_VERSION   1u
/* 48 TiB: right above simgpu's arena [32, 48) TiB; not the brief's 80 TiB,
 * whose 16 TiB cover where x86-64 Linux maps PIE executables and their
 * heap (0x55..-0x56..), so the whole region could never be had there */
#define FWD_MEM_BASE      0x300000000000ull
#define FWD_MEM_SLOTS     256u
#define FWD_MEM_SLOT_SPAN (64ull << 30)
#define FWD_MEM_SIZE      ((uint64_t)FWD_MEM_SLOTS * FWD_MEM_SLOT_SPAN)
#define FWD_MEM_ALIGN     (2ull << 20)  /* a GPU's VMM granularity (checked) */

enum fwd_mem_op { FWD_MEM_MAP = 1, FWD_MEM_UNMAP = 2, FWD_MEM_ACK = 3 };

enum fwd_mem_status {
	FWD_MEM_S_OK = 0,
	FWD_MEM_S_REFUSED = 1,   /* a bad message (see the worker's log)     */
	FWD_MEM_S_FAILED = 2,    /* a driver call failed (see the log)       */
};

struct fwd_mem_msg {
	uint32_t magic;
	uint16_t version;
	uint16_t op;             /* enum fwd_mem_op                          */
	uint32_t len;            /* sizeof(struct fwd_mem_msg)               */
	uint32_t status;         /* ACK: FWD_MEM_S_*; else 0                 */
	uint32_t pid;            /* the app                                  */
	uint32_t pad;
	uint64_t addr;           /* the app's device address                 */
	uint64_t size;           /* bytes mapped there                       */
	uint64_t waddr;          /* ACK of MAP: the worker's address         */
};

_Static_assert(sizeof(struct fwd_mem_msg) == 48, "mem message");

/* NULL when m (nfds fds came with it) is a sound request, else why not. */
static inline const char *fwd_mem_check(const struct fwd_mem_msg *m, int nfds)
{
	if (m->magic != FWD_MEM_MAGIC)
		return "bad magic";
	if (m->version != FWD_MEM_VERSION)
		return "unsupported version";
	if (m->len != sizeof(*m))
		return "bad length";
	if (m->op != FWD_MEM_MAP && m->op != FWD_MEM_UNMAP)
		return "not a request";
	if (m->status || m->pad || m->waddr)
		return "nonzero reserved field";
	if (!m->addr || !m->size || m->addr % FWD_MEM_ALIGN || m->size % FWD_MEM_ALIGN ||
	    m->addr + m->size < m->addr)
		return "bad address or size";
	if (nfds != (m->op == FWD_MEM_MAP ? 1 : 0))
		return m->op == FWD_MEM_MAP ? "MAP without exactly one fd" : "UNMAP with an fd";
	return NULL;
}

/*
 * The hash that names a module image (its file, the worker's cache), both
 * sides.  Not a defence against a forger (any app may write the runtime
 * dir's files anyway); it catches a file damaged or replaced by another
 * image.  Word-wise, so that a 100 MB image costs milliseconds on the app's
 * first forwarded launch instead of FNV-1a's ~100 ms byte by byte: four
 * lanes take 8 little-endian bytes a step each (h ^= w; h *= K; h ^= h >> 32:
 * a bijection, so no word is lost, and the shift carries high bits down),
 * words past the last 32-byte block go to lane 0, then the 1..7 tail bytes
 * as one zero-padded word; the length and the lanes are mixed last (so a
 * tail of zero bytes still counts).  The lanes are independent, so the
 * multiplies overlap.  tests/test_modules.py computes it too (image_hash).
 */
#define FWD_HASH_SEED 0xcbf29ce484222325ull
#define FWD_HASH_K    0x9e3779b97f4a7c15ull

static inline uint64_t fwd_hash_step(uint64_t h, uint64_t w)
{
	h = (h ^ w) * FWD_HASH_K;
	return h ^ (h >> 32);
}

static inline uint64_t fwd_image_hash64(const void *p, size_t n)
{
	const unsigned char *b = p;
	uint64_t v[4] = { FWD_HASH_SEED, FWD_HASH_SEED + 1, FWD_HASH_SEED + 2, FWD_HASH_SEED + 3 };
	uint64_t w[4], h;
	size_t i = 0;

	for (; n - i >= 32; i += 32) {
		memcpy(w, b + i, 32);
		v[0] = fwd_hash_step(v[0], w[0]);
		v[1] = fwd_hash_step(v[1], w[1]);
		v[2] = fwd_hash_step(v[2], w[2]);
		v[3] = fwd_hash_step(v[3], w[3]);
	}
	for (; n - i >= 8; i += 8) {
		memcpy(w, b + i, 8);
		v[0] = fwd_hash_step(v[0], w[0]);
	}
	if (i < n) {
		w[0] = 0;
		memcpy(w, b + i, n - i);
		v[0] = fwd_hash_step(v[0], w[0]);
	}
	h = fwd_hash_step(FWD_HASH_SEED, (uint64_t)n);
	for (i = 0; i < 4; i++)
		h = fwd_hash_step(h, v[i]);
	return h;
}

static inline void fwd_hdr_init(struct fwd_hdr *h, unsigned type, unsigned flags, size_t len)
{
	h->magic = FWD_MAGIC;
	h->version = FWD_VERSION;
	h->type = (uint8_t)type;
	h->flags = (uint8_t)flags;
	h->len = (uint32_t)len;
}

#endif
