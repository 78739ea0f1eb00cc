/*
 * colocate_handoff.h - hand a device buffer from one pipeline stage (a
 * process) to the next without a copy: Camelot's "global memory-based
 * communication" (§VI-B, Fig. 10), with reference counts and death
 * handling the paper leaves out.
 *
 *   stage 1 (exporter)                         stage 2 (importer)
 *   colocate_handoff_exporter_new(NULL, &ex);  colocate_handoff_importer_new(&im);
 *   colocate_handoff_alloc(ex, n, 0, &p);
 *   ... kernels write p ...
 *   colocate_handoff_export_ex(ex, p, n, NULL, NULL, 1, &h);
 *   send(&h, sizeof h)  --- ZeroMQ frame --->   colocate_handoff_open(im, buf, len, n, 0, &v);
 *   colocate_handoff_drop(ex, p);               ... kernels read v.ptr ...
 *                                               colocate_handoff_close(im, &v);
 *   (p is freed when the last reference goes: the exporter's own, the
 *   pre-paid one the handle carries - taken over by the importer's open -
 *   and the importer's)
 *
 * Pre-paid references: a handle in flight is not an importer's yet, so
 * dropping the buffer right after sending would free it before the
 * importer opens it.  colocate_handoff_export_ex(..., consumers, ...)
 * pays `consumers` references in advance; an importer's open of the
 * handle (its first view of that buffer on its connection, a copy
 * included) takes one over as its own.  Those nobody claims are dropped
 * when the buffer's latest export is older than the exporter's pre-paid
 * timeout (COLOCATE_HANDOFF_PREPAID_TIMEOUT_MS, 30 s, or
 * colocate_handoff_exporter_set_prepaid_timeout), or by
 * colocate_handoff_revoke: a consumer that dies before opening delays the
 * free, it does not leak.  Claims are counted: however often a handle is
 * opened or replayed, no more references are taken over than were paid
 * (an open past that takes an ordinary reference, while the buffer lives).
 * colocate_handoff_export (no pre-paid reference) is export_ex with 0.
 *
 * The exporter owns the buffer and answers importers on a Unix socket
 * (SOCK_SEQPACKET, in a private 0700 directory, same uid only).  Opening a
 * handle connects there and takes a reference for that connection, so the
 * reference goes away by itself when the importer dies (the kernel closes
 * its socket).  Memory is shared by legacy CUDA IPC (cudaIpcGetMemHandle)
 * or, for VMM memory that cudaIpc cannot export, by a POSIX fd passed with
 * SCM_RIGHTS and mapped with cuMemMap.  An importer that cannot map the
 * buffer (another GPU, or it asked for host memory) gets a copy instead,
 * counted in its statistics.
 *
 * A view's mapping is kept after close while the exporter keeps the buffer
 * (the next handle of it opens without mapping again).  A kept mapping
 * holds the buffer (a count of its own, apart from references: see
 * colocate_handoff_exporter_hold_stats): the exporter never frees memory
 * an importer still maps (cudaFree before the importer's
 * cudaIpcCloseMemHandle is undefined behaviour).  Once the exporter drops
 * the buffer, the importer unmaps it at its next colocate_handoff_open or
 * _close, at colocate_handoff_importer_trim, or when it is freed or dies;
 * only then is the buffer freed: at once where a message follows the
 * unmap (a view's release, a trim, the connection's end), else at the
 * exporter's next colocate_handoff_alloc or within 50 ms by its service
 * thread.  The lag: an importer that makes no call keeps a dropped buffer
 * allocated until it does (at most 64 kept mappings per importer; call
 * colocate_handoff_importer_trim when going idle).
 *
 * Exporter death: the importer's connection sees EOF.  A view already
 * open stays mapped (the driver keeps VMM memory alive until the importer
 * closes it; for legacy IPC memory the exporter's exit is the driver's
 * business), but nobody will write it any more and no
 * new handle of that exporter opens (COLOCATE_HANDOFF_E_GONE).  The
 * importer should finish with the data it has, then close the view
 * (colocate_handoff_close returns COLOCATE_HANDOFF_E_GONE as a notice; the
 * view is closed all the same).  colocate_handoff_view_alive() tells.
 *
 * Every function returns COLOCATE_HANDOFF_OK (0) or a negative
 * COLOCATE_HANDOFF_E_* code; colocate_handoff_last_error() is then a
 * one-line message of the calling thread.  Nothing here aborts or hangs:
 * a peer that does not answer within 5 s is an error.
 *
 * Threads: every call may be made from any thread.  fork: a child must
 * not use its parent's exporter or importer (their thread and sockets are
 * the parent's); it makes its own.
 *
 * Link with -lcolocate_handoff (shim/lib/libcolocate_handoff.so).  The
 * library finds the CUDA runtime at run time (libcudart.so.13 as
 * LD_LIBRARY_PATH resolves it: simgpu's or NVIDIA's), through the global
 * symbol scope, so that a preloaded libcolocate.so sees its calls.
 */
#ifndef COLOCATE_HANDOFF_H
#define COLOCATE_HANDOFF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COLOCATE_HANDOFF_ABI          1            /* colocate_handoff_abi()        */
#define COLOCATE_HANDOFF_MAGIC        0x46484c43u  /* "CLHF" little-endian          */
#define COLOCATE_HANDOFF_VERSION      1
#define COLOCATE_HANDOFF_HANDLE_BYTES 256          /* sizeof(struct colocate_handoff_handle) */
#define COLOCATE_HANDOFF_PATH_MAX     108          /* sun_path                      */
#define COLOCATE_HANDOFF_PREPAID_TIMEOUT_MS 30000  /* unclaimed pre-paid references go */

/* status codes */
#define COLOCATE_HANDOFF_OK          0
#define COLOCATE_HANDOFF_E_INVAL     (-1)   /* a bad argument                      */
#define COLOCATE_HANDOFF_E_TRUNCATED (-2)   /* handle bytes of the wrong length    */
#define COLOCATE_HANDOFF_E_FORGED    (-3)   /* not a handle: magic, version, checksum */
#define COLOCATE_HANDOFF_E_STALE     (-4)   /* buffer freed, or no such buffer     */
#define COLOCATE_HANDOFF_E_SIZE      (-5)   /* size differs from the exporter's or the expected one */
#define COLOCATE_HANDOFF_E_PERM      (-6)   /* another user's handle or socket     */
#define COLOCATE_HANDOFF_E_CUDA      (-7)   /* a CUDA call failed (message says which) */
#define COLOCATE_HANDOFF_E_SYS       (-8)   /* a system call failed                */
#define COLOCATE_HANDOFF_E_PROTO     (-9)   /* the peer spoke nonsense             */
#define COLOCATE_HANDOFF_E_GONE      (-10)  /* the exporter is dead or stopped     */
#define COLOCATE_HANDOFF_E_NOMEM     (-11)
#define COLOCATE_HANDOFF_E_UNSUPPORTED (-12) /* e.g. VMM memory without cuMemRetainAllocationHandle */
#define COLOCATE_HANDOFF_E_TIMEOUT   (-13)  /* the peer did not answer in time     */

/* how the buffer travels (handle.kind) */
#define COLOCATE_HANDOFF_KIND_IPC 1          /* legacy cudaIpcMemHandle_t in handle.ipc */
#define COLOCATE_HANDOFF_KIND_FD  2          /* VMM: POSIX fd over the socket       */

/* colocate_handoff_alloc flags */
#define COLOCATE_HANDOFF_ALLOC_VMM 1u        /* cuMemCreate memory (fd kind), not cudaMalloc */

/* colocate_handoff_open flags */
#define COLOCATE_HANDOFF_OPEN_COPY 1u        /* copy even if it could be mapped     */
#define COLOCATE_HANDOFF_OPEN_HOST 2u        /* a host copy (the importer has no GPU) */

/* view.how */
#define COLOCATE_HANDOFF_MAPPED      1       /* the exporter's memory, mapped here  */
#define COLOCATE_HANDOFF_SAME_PROCESS 2      /* the exporter's own pointer          */
#define COLOCATE_HANDOFF_COPY_DEVICE 3       /* a private device copy               */
#define COLOCATE_HANDOFF_COPY_HOST   4       /* a private host copy                 */

/*
 * The handle: plain bytes, one ZeroMQ frame.  Little-endian, as written by
 * the exporter (both ends run on one host).  checksum is FNV-1a 64 over
 * every other byte: it catches corruption and truncation early with a
 * clear message; the exporter's table (id, gen) is what decides validity.
 */
struct colocate_handoff_handle {
	uint32_t magic;              /* COLOCATE_HANDOFF_MAGIC                   */
	uint16_t version;            /* COLOCATE_HANDOFF_VERSION                 */
	uint16_t kind;               /* COLOCATE_HANDOFF_KIND_*                  */
	uint32_t pid;                /* exporter                                 */
	uint32_t uid;                /* exporter's effective uid                 */
	uint64_t id;                 /* buffer slot in the exporter              */
	uint64_t gen;                /* that slot's generation (unguessable)     */
	uint64_t size;               /* bytes the exporter handed off            */
	int32_t  device;             /* exporter's device ordinal                */
	uint32_t reserved;
	uint8_t  uuid[16];           /* exporter's device UUID                   */
	uint8_t  ipc[64];            /* cudaIpcMemHandle_t (KIND_IPC)            */
	char     path[COLOCATE_HANDOFF_PATH_MAX];   /* exporter's socket       */
	uint8_t  pad[12];            /* zero: no implicit padding to checksum    */
	uint64_t checksum;
};

/* An open handle in the importer. */
struct colocate_handoff_view {
	void    *ptr;                /* device pointer (host pointer for COPY_HOST) */
	uint64_t size;
	int32_t  device;
	uint32_t how;                /* COLOCATE_HANDOFF_MAPPED ...              */
	uint64_t token;              /* the importer's own reference to it       */
};

struct colocate_handoff_exporter_stats {
	uint64_t live_buffers;       /* not yet freed                            */
	uint64_t held_refs;          /* importers' references now                */
	uint64_t connections;        /* importers connected now                  */
	uint64_t exports, acquires, releases;
	uint64_t refs_dropped_dead;  /* references dropped because an importer went away */
	uint64_t frees;              /* buffers freed                            */
	uint64_t copies_served, copy_bytes;   /* copy fallback, exporter's side  */
};

/* Holds on the exporter's buffers besides references (colocate_handoff_exporter_hold_stats). */
struct colocate_handoff_exporter_hold_stats {
	uint64_t prepaid;            /* pre-paid references not claimed yet      */
	uint64_t prepaid_issued;     /* paid by colocate_handoff_export_ex       */
	uint64_t prepaid_claimed;    /* taken over by an importer's open          */
	uint64_t prepaid_expired;    /* dropped after the pre-paid timeout       */
	uint64_t prepaid_revoked;    /* dropped by colocate_handoff_revoke        */
	uint64_t mapped;             /* importers' kept mappings now (each holds its buffer) */
	uint64_t frees_after_unmap;  /* frees that waited for an importer to unmap */
	uint64_t last_free_ns;       /* CLOCK_MONOTONIC of the latest free (0: none) */
	uint64_t prepaid_timeout_ms;
};

struct colocate_handoff_importer_stats {
	uint64_t open_views;
	uint64_t connections;        /* open, idle ones (no views) included     */
	uint64_t maps;               /* views mapped without a copy              */
	uint64_t copies, copy_bytes; /* views that had to be copied              */
	uint64_t gone;               /* closes that found the exporter gone      */
};

/* The importer's fast path and kept mappings (colocate_handoff_open maps
 * a buffer once per exporter, buffer and generation, and takes and gives
 * back references in memory the exporter shares, without a round trip
 * while the exporter holds its own reference; COLOCATE_HANDOFF_SLOW=1 in
 * the environment turns both off). */
struct colocate_handoff_importer_cache_stats {
	uint64_t cached;             /* mappings kept now (in use or idle)       */
	uint64_t map_calls;          /* cudaIpcOpenMemHandle / cuMemMap made     */
	uint64_t unmaps;             /* kept mappings closed                     */
	uint64_t hits;               /* opens served by a kept mapping           */
	uint64_t fast_acquires;      /* references taken without a round trip    */
	uint64_t fast_releases;
	uint64_t slow_acquires;      /* ACQUIREs the exporter answered           */
};

struct colocate_handoff_exporter;
struct colocate_handoff_importer;

int colocate_handoff_abi(void);
const char *colocate_handoff_last_error(void);

/* dir: where the socket goes (created 0700); NULL: $COLOCATE_RUNTIME_DIR/handoff,
 * else $XDG_RUNTIME_DIR/colocate/handoff, else /tmp/colocate-$UID/handoff. */
int colocate_handoff_exporter_new(const char *dir, struct colocate_handoff_exporter **out);
/* Stop serving: wait up to wait_ms for importers to release, then close
 * their connections and free every buffer - except legacy IPC memory a
 * live importer still maps (an open view, or a kept mapping): freeing it
 * would be undefined behaviour, so it stays allocated until this process
 * exits (VMM memory is released: the driver keeps it for the mapping).
 * E_TIMEOUT when importers still held views after wait_ms. */
int colocate_handoff_exporter_free(struct colocate_handoff_exporter *ex, int wait_ms);
const char *colocate_handoff_exporter_path(const struct colocate_handoff_exporter *ex);
int colocate_handoff_exporter_stats(struct colocate_handoff_exporter *ex,
				    struct colocate_handoff_exporter_stats *st);

/* Device memory of the current device owned by ex (freed by it). */
int colocate_handoff_alloc(struct colocate_handoff_exporter *ex, uint64_t size, unsigned flags,
			   void **ptr);
/* The handle of ptr (the start of a device allocation of at least size
 * bytes).  ptr not from colocate_handoff_alloc: ownership passes to ex,
 * which frees it with cudaFree, or calls free_fn(free_arg, ptr) when
 * free_fn is set (from ex's service thread, no lock held).  Exporting it
 * again returns the same handle. */
int colocate_handoff_export(struct colocate_handoff_exporter *ex, void *ptr, uint64_t size,
			    void (*free_fn)(void *arg, void *ptr), void *free_arg,
			    struct colocate_handoff_handle *out);
/* colocate_handoff_export, paying `consumers` references in advance (see
 * "Pre-paid references" above): each is taken over by one importer's open
 * of the handle, or dropped after the pre-paid timeout or by revoke.
 * Each export adds its consumers (exporting a buffer again hands it again);
 * the timeout counts from the buffer's latest export. */
int colocate_handoff_export_ex(struct colocate_handoff_exporter *ex, void *ptr, uint64_t size,
			       void (*free_fn)(void *arg, void *ptr), void *free_arg,
			       uint32_t consumers, struct colocate_handoff_handle *out);
/* Drop ptr's pre-paid references nobody claimed (the consumer will not
 * open): how many (>= 0), or an E_* code.  ptr is freed if nothing else
 * holds it. */
int colocate_handoff_revoke(struct colocate_handoff_exporter *ex, void *ptr);
/* Pre-paid references expire ms (> 0) after their buffer's latest export;
 * COLOCATE_HANDOFF_PREPAID_TIMEOUT_MS until set. */
int colocate_handoff_exporter_set_prepaid_timeout(struct colocate_handoff_exporter *ex, int ms);
int colocate_handoff_exporter_hold_stats(struct colocate_handoff_exporter *ex,
					 struct colocate_handoff_exporter_hold_stats *st);
/* Drop the exporter's own reference: ptr is freed now, or when the last
 * importer releases it, its pre-paid references are claimed or expire,
 * and every importer's kept mapping of it is gone. */
int colocate_handoff_drop(struct colocate_handoff_exporter *ex, void *ptr);
/* Importers' references to ptr now (views: neither pre-paid references
 * nor kept mappings, see colocate_handoff_exporter_hold_stats). */
int colocate_handoff_refs(struct colocate_handoff_exporter *ex, void *ptr, uint64_t *refs);

int colocate_handoff_importer_new(struct colocate_handoff_importer **out);
/* Closes every view still open. */
int colocate_handoff_importer_free(struct colocate_handoff_importer *im);
/* Open the handle in bytes[0..len): expect_size 0 takes any size. */
int colocate_handoff_open(struct colocate_handoff_importer *im, const void *bytes, size_t len,
			  uint64_t expect_size, unsigned flags, struct colocate_handoff_view *out);
/* Release: OK, or E_GONE when the exporter had gone (closed all the same). */
int colocate_handoff_close(struct colocate_handoff_importer *im, struct colocate_handoff_view *v);
/* 1 while the view's exporter is alive, 0 once it is gone, < 0 on error. */
int colocate_handoff_view_alive(struct colocate_handoff_importer *im,
				const struct colocate_handoff_view *v);
int colocate_handoff_importer_stats(struct colocate_handoff_importer *im,
				    struct colocate_handoff_importer_stats *st);
int colocate_handoff_importer_cache_stats(struct colocate_handoff_importer *im,
					  struct colocate_handoff_importer_cache_stats *st);
/* Unmap kept mappings no view uses: those whose exporter dropped the
 * buffer (or went), or with all != 0 every one.  How many (>= 0). */
int colocate_handoff_importer_trim(struct colocate_handoff_importer *im, int all);

/* Check handle bytes without contacting anyone: OK with *out filled, or
 * E_TRUNCATED / E_FORGED / E_PERM. */
int colocate_handoff_parse(const void *bytes, size_t len, struct colocate_handoff_handle *out);
/* Ask the exporter how many importer references the handle's buffer has. */
int colocate_handoff_remote_refs(const void *bytes, size_t len, uint64_t *refs);
/* 1 when the CPU may read ptr directly (simgpu device memory, a host
 * copy), else 0: a NumPy view of a real GPU's memory would crash. */
int colocate_handoff_host_addressable(const void *ptr);

#ifdef __cplusplus
}
#endif

#endif
