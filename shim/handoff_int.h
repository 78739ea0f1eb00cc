/*
 * handoff_int.h - what the files of libcolocate_handoff.so share: the
 * error helper, the CUDA calls it takes at run time, the wire messages of
 * the exporter's socket and the socket helpers.  Public API:
 * include/colocate_handoff.h.
 *
 *   handoff_util.c     errors, handles (encode, parse, checksum), runtime dir
 *   handoff_cuda.c     the CUDA runtime and driver VMM calls, found at run time
 *   handoff_msg.c      one message (and maybe one fd) over SOCK_SEQPACKET
 *   handoff_export.c   the exporter's buffer table and its API
 *   handoff_service.c  the exporter's service thread: connections, requests
 *   handoff_import.c   the importer: connections, views, copy fallback
 */
#ifndef COLOCATE_HANDOFF_INT_H
#define COLOCATE_HANDOFF_INT_H

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "include/colocate_handoff.h"

#define HF_API __attribute__((visibility("default")))

/* ---------------------------------------------------------------- errors */

/* Set the calling thread's message and return code. */
int hf_err(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---------------------------------------------------------------- handles */

uint64_t hf_checksum(const struct colocate_handoff_handle *h);
/* The private directory for exporter sockets (created 0700, checked
 * ours): OK or an error. */
int hf_runtime_dir(const char *want, char *out, size_t outlen);

/* ---------------------------------------------------------------- CUDA */

struct hf_rt {
	cudaError_t (*malloc_)(void **, size_t);
	cudaError_t (*free_)(void *);
	cudaError_t (*ipc_get)(cudaIpcMemHandle_t *, void *);
	cudaError_t (*ipc_open)(void **, cudaIpcMemHandle_t, unsigned int);
	cudaError_t (*ipc_close)(void *);
	cudaError_t (*memcpy_)(void *, const void *, size_t, enum cudaMemcpyKind);
	cudaError_t (*get_device)(int *);
	cudaError_t (*set_device)(int);
	cudaError_t (*props)(struct cudaDeviceProp *, int);
	const char *(*errstr)(cudaError_t);
	/* the driver's VMM calls (cudaGetDriverEntryPointByVersion); any may
	 * be NULL: the fd kind is then unavailable, with a message */
	__typeof__(&cuMemGetAllocationGranularity) gran;
	__typeof__(&cuMemCreate) create;
	__typeof__(&cuMemRelease) release;
	__typeof__(&cuMemAddressReserve) reserve;
	__typeof__(&cuMemAddressFree) addr_free;
	__typeof__(&cuMemMap) map;
	__typeof__(&cuMemUnmap) unmap;
	__typeof__(&cuMemSetAccess) access;
	__typeof__(&cuMemExportToShareableHandle) export_;
	__typeof__(&cuMemImportFromShareableHandle) import_;
	__typeof__(&cuMemRetainAllocationHandle) retain;   /* NULL on simgpu */
	/* the runtime's last error: an expected failure of ours (a probe)
	 * is cleared, so that the app's next cudaGetLastError() does not
	 * report it (either may be NULL) */
	cudaError_t (*get_last)(void);
	cudaError_t (*peek_last)(void);
	int vmm;                        /* every VMM call but retain is there */
	int simgpu;                     /* device memory is host memory      */
};

/* Before a call that may fail as expected (a probe): the runtime's
 * pending error, to pass to hf_quiet_end after it. */
cudaError_t hf_quiet_begin(void);
/* After it: clear the runtime's last error, unless one was pending
 * before (the app's: left as it was). */
void hf_quiet_end(cudaError_t before);
/* The runtime, resolved once: OK with *rt, or E_CUDA with a message. */
int hf_rt_get(const struct hf_rt **rt);
/* E_CUDA with "what: <CUDA's message>". */
int hf_cuda_err(const char *what, int err);
/* Current device and its UUID (zeros when the runtime cannot tell). */
int hf_cur_device(int *dev, uint8_t uuid[16]);
/* A VMM allocation of at least size bytes on dev, mapped read-write:
 * OK with *ptr, *alloc_size (rounded) and *h. */
int hf_vmm_alloc(int dev, uint64_t size, void **ptr, uint64_t *alloc_size,
		 CUmemGenericAllocationHandle *h);
/* Undo hf_vmm_alloc, or an import (hf_vmm_import). */
void hf_vmm_free(void *ptr, uint64_t alloc_size, CUmemGenericAllocationHandle h);
/* Map an exported fd (not consumed) of alloc_size bytes on dev. */
int hf_vmm_import(int fd, int dev, uint64_t alloc_size, void **ptr,
		  CUmemGenericAllocationHandle *h);

/* ---------------------------------------------------------------- wire */

#define HF_MSG_MAGIC   0x4d464843u      /* "CHFM" */
#define HF_MSG_VERSION 2              /* 2: claims and mapping holds */
#define HF_TIMEOUT_MS  5000             /* an importer waits this long for a reply */

enum hf_op {
	HF_ACQUIRE = 1,                 /* take a reference for this connection */
	HF_RELEASE = 2,                 /* give one back                        */
	HF_STAT    = 3,                 /* how many references                  */
	HF_COPY    = 4,                 /* a copy of the data in a memfd        */
	HF_REPLY   = 5,
	HF_HELLO   = 6,                 /* the shared tables (two fds): reply   */
	HF_RELEASE1 = 7,                /* RELEASE without a reply (one-way)    */
	HF_NOTIFY  = 8,                 /* one-way: recheck slot id (fast refs) */
};

/* request flags (hf_msg.kind of ACQUIRE and COPY) */
#define HF_Q_CLAIM 1u                   /* claim a pre-paid reference           */

/*
 * The fast path (no round trip): the exporter shares two tables.
 *   hf_shm_tab   one per exporter, read by importers: slot s's generation
 *                while it is exported AND the exporter holds its own
 *                reference (0 otherwise), and its size.
 *   hf_shm_conn  one per connection, written by its importer only: the
 *                references it took without asking (refs[s]), and counts.
 * An importer acquires by refs[s]++ and then reading tab[s].gen == its
 * handle's generation; the exporter's drop clears tab[s].gen and then
 * sums every connection's refs[s] (both sequentially consistent, so one of
 * the two sees the other).  A release is refs[s]--, then, if tab[s].gen
 * no longer shows the exporter's own reference, a one-way NOTIFY so the
 * exporter frees what nobody holds.  A connection that ends (the importer
 * died) loses its table, and with it its references: as the slow path's.
 *
 * Two more per-slot counts in the connection's table:
 *   maps[s]    1 while the importer keeps a mapping of slot s open (after
 *              its views closed): the exporter frees a buffer only when
 *              every count is 0, so never under an importer's mapping.
 *              Taken while the importer holds a reference, given back
 *              after the unmap (then a NOTIFY if the buffer was withdrawn,
 *              the same Dekker pair as refs).
 *   claims[s]  how many pre-paid references (colocate_handoff_export_ex)
 *              this connection claimed on the fast path: a monotonic
 *              counter, bumped while the importer holds a reference; the
 *              exporter settles the difference to what it saw before
 *              (hf_settle) against the buffer's pre-paid count, never
 *              below 0, so a connection cannot claim more than was paid.
 */
#define HF_SHM_SLOTS 1024               /* slots beyond: the slow path only */
#define HF_SHM_MAGIC 0x4d485348u        /* "HSHM" */

struct hf_shm_tab {
	uint32_t magic, nslots;
	uint64_t pad;
	struct { uint64_t gen, size; } s[HF_SHM_SLOTS];
};

struct hf_shm_conn {
	uint64_t acquires, releases;    /* fast ones, for the statistics */
	uint32_t refs[HF_SHM_SLOTS];
	uint32_t maps[HF_SHM_SLOTS];    /* kept mappings (holds)         */
	uint32_t claims[HF_SHM_SLOTS];  /* pre-paid references claimed   */
};

/* seq_cst: the Dekker pairs above need it */
#define HF_LOAD(p)     __atomic_load_n((p), __ATOMIC_SEQ_CST)
#define HF_STORE(p, v) __atomic_store_n((p), (v), __ATOMIC_SEQ_CST)
#define HF_ADD(p, v)   __atomic_add_fetch((p), (v), __ATOMIC_SEQ_CST)
#define HF_SUB(p, v)   __atomic_sub_fetch((p), (v), __ATOMIC_SEQ_CST)

struct hf_msg {
	uint32_t magic;
	uint16_t version;
	uint16_t op;
	uint64_t id, gen, size;         /* request: the handle's; reply: size   */
	int32_t  status;                /* reply: COLOCATE_HANDOFF_OK or E_*    */
	uint32_t kind;                  /* reply: the buffer's kind             */
	uint64_t refs;                  /* reply: importer references now       */
	uint64_t ptr;                   /* reply: exporter's pointer            */
	uint64_t alloc_size;            /* reply: fd kind: bytes to map         */
	char     text[168];             /* reply: the error message             */
};

/* Send m with pass_fd (-1: none) as one message: 0, or -1 with errno. */
int hf_send(int fd, const struct hf_msg *m, int pass_fd);
/* The same with nfds (<= 2) fds. */
int hf_sendv(int fd, const struct hf_msg *m, const int *fds, int nfds);
/* Receive one message with up to 2 fds (the rest closed): as hf_recv. */
ssize_t hf_recvv(int fd, struct hf_msg *m, int *got_fds, int maxfds);
/* A one-way message (no reply): OK, or E_GONE / E_TIMEOUT. */
int hf_post(int fd, const struct hf_msg *q);
/* Receive one message: its length (0 at EOF), or -1 with errno; *got_fd
 * is a received fd (close-on-exec) or -1.  got_fd NULL: any fd is closed. */
ssize_t hf_recv(int fd, struct hf_msg *m, int *got_fd);
/* A receive that returned n <= 0 as an error code (errno still its own):
 * E_TIMEOUT when it timed out, else E_GONE (closed, or the errno). */
int hf_recv_failed(ssize_t n);
/* A message to the exporter and its reply: OK with *r (and *got_fd), or
 * E_GONE / E_TIMEOUT / E_PROTO; a reply's own status is left to the caller. */
int hf_call(int fd, const struct hf_msg *q, struct hf_msg *r, int *got_fd);
/* Connect to an exporter's socket (timeouts set): fd, or an E_* code. */
int hf_connect(const char *path, uint32_t pid);
void hf_msg_init(struct hf_msg *m, int op);

/* ---------------------------------------------------------------- exporter */

struct hf_buf {
	int      used;                  /* slot in use                          */
	int      own;                   /* the exporter's own reference is held */
	int      exported;              /* a handle was made                    */
	int      kind;                  /* COLOCATE_HANDOFF_KIND_*              */
	int      how_free;              /* HF_FREE_*                            */
	int      device;
	void    *ptr;
	int      pinned;                /* exporter_free: a live importer maps it */
	int      held_by_map;           /* a free waited for an importer's unmap */
	uint64_t size, alloc_size, gen, refs;
	uint64_t prepaid;               /* pre-paid references not claimed yet  */
	int64_t  prepaid_deadline;      /* CLOCK_MONOTONIC ns: they expire then */
	cudaIpcMemHandle_t ipc;
	CUmemGenericAllocationHandle vh;        /* fd kind: exported from it */
	void   (*free_fn)(void *, void *);
	void    *free_arg;
};

enum { HF_FREE_CUDA = 1, HF_FREE_VMM = 2, HF_FREE_FN = 3, HF_FREE_RETAINED = 4 };

struct hf_conn {
	int       fd;
	struct hf_shm_conn *shm;        /* after HELLO: the importer's fast refs */
	uint32_t *held;                 /* buffer slots, one entry per reference */
	size_t    nheld, cap;
	uint32_t *claims_seen;          /* shm->claims[] as last settled         */
};

struct colocate_handoff_exporter {
	pthread_mutex_t mu;             /* everything below                      */
	pthread_cond_t  cv;             /* references changed                    */
	struct hf_buf  *bufs;
	size_t          nbufs, capbufs;
	struct hf_conn *conns;          /* the service thread's; counted here   */
	size_t          nconns, capconns;
	int             lfd;            /* listening socket                      */
	int             wake[2];        /* a byte here stops the service thread  */
	int             stopping;
	int             thread_on;
	pthread_t       thr;
	uint64_t        gen_next;
	uint32_t        uid, pid;
	char            path[COLOCATE_HANDOFF_PATH_MAX];
	struct hf_shm_tab *tab;         /* shared with importers (NULL: none)    */
	int             tab_fd;
	struct colocate_handoff_exporter_stats st;
	struct colocate_handoff_exporter_hold_stats hst;   /* prepaid, mapped: summed at read */
	uint64_t        prepaid_total;  /* sum of bufs[].prepaid                 */
	int64_t         prepaid_timeout_ns;
	int64_t         svc_deadline;   /* the service thread sleeps until then  */
	uint64_t        map_pending;    /* dropped buffers waiting for an unmap  */
	int64_t         svc_sleep_until; /* the service thread's poll ends then  */
};

/* Dropped buffers that waited for an importer's unmap are freed by the
 * exporter's next alloc, or by its service thread within this period. */
#define HF_REAP_MS 50

#define HF_NEVER INT64_MAX
int64_t hf_now_ns(void);                /* CLOCK_MONOTONIC */

/* Importers' references to slot s: the slow path's and the fast ones
 * of every connection.  mu held. */
uint64_t hf_total_refs(struct colocate_handoff_exporter *ex, uint32_t s);
/* Publish slot s in the shared table (exported, own reference held), or
 * withdraw it.  mu held. */
void hf_publish(struct colocate_handoff_exporter *ex, uint32_t s);
void hf_unpublish(struct colocate_handoff_exporter *ex, uint32_t s);

/* Start/stop the service thread (handoff_service.c). */
int  hf_service_start(struct colocate_handoff_exporter *ex);
void hf_service_stop(struct colocate_handoff_exporter *ex);
/* Kept mappings of slot s (every connection's).  mu held. */
uint64_t hf_total_maps(struct colocate_handoff_exporter *ex, uint32_t s);
/* Count the pre-paid references of slot s the connections claimed on the
 * fast path since last time.  mu held. */
void hf_settle(struct colocate_handoff_exporter *ex, uint32_t s);
/* Connection c claims one pre-paid reference of slot s (if any is left).
 * mu held. */
void hf_claim(struct colocate_handoff_exporter *ex, uint32_t s);
/* Free dropped buffers whose last kept mapping went (the lock taken and
 * released). */
void hf_reap(struct colocate_handoff_exporter *ex);
/* Drop pre-paid references past their deadline; free what nobody holds
 * then (the lock taken and released).  The next deadline (HF_NEVER: none). */
int64_t hf_expire(struct colocate_handoff_exporter *ex);
/* A buffer nobody references any more - no exporter's own reference, no
 * importer's, no pre-paid one, no kept mapping: taken out of the table
 * into *out (to be freed with hf_buf_free, without the lock).  1 if so.
 * mu held. */
int  hf_take_dead(struct colocate_handoff_exporter *ex, uint32_t slot, struct hf_buf *out);
/* Free the memory of a buffer taken out of the table.  No lock held. */
void hf_buf_free(const struct hf_buf *b);
/* The slot of (id, gen), or an E_* code with a message.  mu held. */
int  hf_lookup(struct colocate_handoff_exporter *ex, uint64_t id, uint64_t gen, uint64_t size);

#endif
