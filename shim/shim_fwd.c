/*
 * shim_fwd.c - forwarding an application's kernel launches to a process-pool
 * worker, and switching routes without losing, duplicating or reordering
 * work.
 *
 * The controller writes a route (0: local, N: worker N) and bumps
 * route_epoch in the app's control-block slot.  A launch notices a new
 * epoch (shim_fwd_check: one relaxed load of the slot) and comes here,
 * where the switch happens at that launch boundary:
 *
 *   local -> N   the app's local work is synchronised first (work queued
 *                before the switch must finish before the worker runs what
 *                follows), then connect and HELLO (or reuse a kept
 *                connection to N)
 *   N -> M, 0    every launch forwarded to N is waited for; the connection
 *                is kept for a return
 *
 * While routed, a launch is encoded (fwd_proto.h), kept in a window of at
 * most FWD_WINDOW launches not known to be complete, and sent without
 * waiting for anything.  Completions come through the connection's page.
 * Copies, memsets, event records and syncs stay local, after a fence: a
 * wait for exactly the forwarded launches they must follow, by the CUDA
 * default-stream rules.  A local operation queued while routed marks its
 * stream, and the next launch forwarded on that stream first synchronises
 * it locally.  Kernels that cannot be forwarded (no argument layout from
 * cudaFuncGetParamInfo, too many streams, graphs, a module that cannot be
 * shipped) run locally in the same way, in order.
 *
 * Kernels travel as code the first time one of a module is forwarded on a
 * connection: the module's fat binary (captured at registration, written
 * once per process to a file in the runtime dir) goes as a MODULE frame,
 * then the kernel's DEFINE names it, so a worker can load it with
 * cudaLibraryLoadData and take the kernel with cudaLibraryGetKernel, as a
 * GPU needs.  Kernels registered without a module (simgpu's CPU libraries)
 * are DEFINEd by name, which only simgpu workers can serve.
 *
 * A connection left by a route change is drained and kept (the last
 * FWD_KEEP of them): going back to that worker then costs no connect, no
 * HELLO and no new worker streams, only the drain that ordering needs.
 *
 * A kernel the worker cannot run (its module refused, not in it, another
 * layout, no twin) costs that kernel only: the DEFINE's verdict is waited
 * for once per kernel per connection, and a refused kernel then runs
 * locally, in order, as kernels without a layout do; the connection and
 * the other kernels' launches stay with the worker.
 *
 * When the worker dies, hangs or refuses a malformed frame, every launch of
 * the window that did not complete (the page says exactly which) is
 * replayed locally, in order, and the app runs locally until the route
 * changes.  A launch that cannot be replayed, or that failed in the
 * worker, is reported by the next launch, copy, memset or sync (never
 * silently dropped).
 */
#define _GNU_SOURCE
#include "shim_fwd.h"
#include "shim_part.h"
#include "shim_vmm.h"
#include "shim_trace.h"

#include <cuda_runtime_api.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FWD_WINDOW   4096u      /* launches in flight, like a GPU's queue  */

/* The most launches this app may have in flight while routed: FWD_WINDOW
 * unless the controller says less at registration ("fwd_window").  A batch
 * app whose quota the policy changes, or holds, every few milliseconds is
 * given a small one: its launches then wait in the app (the ready pool)
 * instead of in a worker's queue, where a new quota or a hold would reach
 * them only after thousands of already-queued kernels. */
static uint32_t window_cap = FWD_WINDOW;

void shim_fwd_set_window(uint32_t n)
{
	__atomic_store_n(&window_cap, n < 1 ? 1 : n > FWD_WINDOW ? FWD_WINDOW : n,
			 __ATOMIC_RELAXED);
}
#define FWD_KEEP     3u         /* drained connections kept for a return   */
#define POLL_EVERY   64u        /* launches between looks at the socket    */
#define CHECK_EVERY  50000000ull /* ns between liveness checks when busy   */

uint64_t shim_fwd_epoch;
int shim_fwd_busy;

struct fkernel {
	int ok;                         /* 1 forwardable                        */
	const char *name;               /* mangled device name, for logs        */
	uint32_t kid;
	uint32_t mid;                   /* its module, or FWD_NO_MODULE         */
	uint16_t nparams;
	uint32_t argbytes;
	struct fwd_param *params;
	unsigned char *define;          /* the DEFINE frame                     */
	size_t define_len;
	uint32_t refused_by;            /* the last worker whose refusal of it
	                                   was logged (once per worker)         */
	uint32_t gen;                   /* shim_kernel.gen it was built from    */
};

struct wentry {                     /* a forwarded launch, until completed  */
	uint64_t seq;
	uint32_t sidx;
	int entry;                      /* enum shim_entry                      */
	int coop;
	int counted;                    /* counted in shim_ctr->forwarded       */
	const void *key;
	struct fkernel *k;
	unsigned char *frame;
	size_t len;
};

static struct {
	pthread_mutex_t mu;
	int acted;                      /* epoch below has been acted on        */
	uint64_t epoch;
	struct fconn *conn;             /* non-NULL: launches are forwarded     */
	struct fconn *kept[FWD_KEEP];   /* drained, idle, most recent first     */
	uint64_t seq;
	int err;                        /* cudaError_t for the app's next call  */
	struct fstream streams[FWD_MAX_STREAMS];
	uint32_t nstreams, last_stream;
	int any_pending;                /* some stream has local_pending        */
	int unknown_pending;            /* local work on a stream not tabled    */
	struct wentry window[FWD_WINDOW];   /* launches sent, not yet completed */
	uint64_t head, tail;
	uint32_t nkernels;
	uint64_t nsent;
	uint32_t refused_worker;        /* the last worker we could not reach   */
	uint64_t local_runs;            /* launches run locally while routed    */
	int unshared_said;              /* logged why a VMM app stays local      */
	uint64_t voids_seen;            /* shim_vmm_voids when last looked at    */
} fwd = { .mu = PTHREAD_MUTEX_INITIALIZER };

static struct fkernel not_forwardable = { .ok = 0 };

_Static_assert(SHIM_MAX_MODULES == FWD_MAX_MODULES,
	       "a module id is its index in the shim's table");

/*
 * Modules, once per process: the image in its file in the runtime dir and
 * the MODULE frame that names it (the same on every connection).  A module
 * that cannot be shipped (its file cannot be written, or it was
 * unregistered) leaves its kernels local, as kernels without a layout are.
 * Under fwd.mu.
 */
static struct {
	int state;                      /* 0 not yet, 1 shippable, -1 not       */
	unsigned char *frame;
	size_t len;
} fmods[FWD_MAX_MODULES];
static __thread uint64_t thread_key;
/* This thread holds fwd.mu: a hook reached from inside the real runtime
 * (a runtime calling its own exported entry points) must not take it again. */
static __thread int holding;

int fwd_lock(void)
{
	if (holding)
		return -1;
	pthread_mutex_lock(&fwd.mu);
	holding = 1;
	return 0;
}

void fwd_unlock(void)
{
	holding = 0;
	pthread_mutex_unlock(&fwd.mu);
}


/* ---------------------------------------------------------------- real calls */

typedef cudaError_t (*launch_fn)(const void *, dim3, dim3, void **, size_t, cudaStream_t);

#define REAL_FN(var, name)                                                 \
	static void *var;                                                  \
	if (!var)                                                          \
		var = shim_real_rt(name)

static cudaError_t real_device_sync(void)
{
	REAL_FN(f, "cudaDeviceSynchronize");
	return f ? IN_RUNTIME(((cudaError_t (*)(void))f)()) : cudaErrorSharedObjectSymbolNotFound;
}

static cudaError_t real_stream_sync(void *s)
{
	REAL_FN(f, "cudaStreamSynchronize");
	return f ? IN_RUNTIME(((cudaError_t (*)(cudaStream_t))f)(s)) : cudaErrorSharedObjectSymbolNotFound;
}

static void real_clear_error(void)
{
	REAL_FN(f, "cudaGetLastError");
	if (f)
		((cudaError_t (*)(void))f)();
}

static cudaError_t real_peek_error(void)
{
	REAL_FN(f, "cudaPeekAtLastError");
	return f ? ((cudaError_t (*)(void))f)() : cudaSuccess;
}

/* The non-ptsz entry point to replay a launch with, from any thread. */
static launch_fn replay_fn(int entry, int coop)
{
	static void *nvcc, *plain, *coopf;

	if (entry == SHIM_E_NVCC)
		return (launch_fn)(nvcc ? nvcc : (nvcc = shim_real_rt("__cudaLaunchKernel")));
	if (coop || entry == SHIM_E_COOP)
		return (launch_fn)(coopf ? coopf : (coopf = shim_real_rt("cudaLaunchCooperativeKernel")));
	return (launch_fn)(plain ? plain : (plain = shim_real_rt("cudaLaunchKernel")));
}

static dim3 mkdim(const uint32_t v[3])
{
	dim3 d;

	d.x = v[0], d.y = v[1], d.z = v[2];
	return d;
}

/* ---------------------------------------------------------------- state */

/* The fast path's view of the state; fwd.mu held.  A hold sends every launch
 * here (to wait) but leaves copies and syncs alone (nothing to fence). */
void fwd_publish(void)
{
	int routed = fwd.conn != NULL || fwd.err != 0 || part_on();

	__atomic_store_n(&shim_fwd_busy, routed, __ATOMIC_RELAXED);
	__atomic_store_n(&shim_fwd_epoch, routed || fwd_held() ? ~0ull : fwd.epoch, __ATOMIC_RELEASE);
}

static int take_error(void)
{
	int e = fwd.err;

	fwd.err = 0;
	fwd_publish();
	return e;
}

static void note_failed(struct fconn *c)
{
	uint64_t seq = __atomic_load_n(&c->page->failed_seq, __ATOMIC_ACQUIRE);

	if (seq && !c->failed_reported) {
		c->failed_reported = 1;
		if (!fwd.err)
			fwd.err = c->page->failed_code ? c->page->failed_code : cudaErrorLaunchFailure;
		shim_log("worker %u could not run launch %llu (cudaError_t %d); reporting it "
			 "to the app", c->worker, (unsigned long long)seq, c->page->failed_code);
	}
}

/* ---------------------------------------------------------------- streams */

struct fstream *fwd_stream(void *s, int ptsz)
{
	uintptr_t v = (uintptr_t)s;
	uint64_t key;
	uint8_t kind;
	void *handle = s;
	uint32_t i;

	if (v == 0 ? !ptsz : s == cudaStreamLegacy) {
		key = 1, kind = FWD_SK_LEGACY, handle = cudaStreamLegacy;
	} else if (v == 0 || s == cudaStreamPerThread) {
		/* a thread's own default stream: its key must differ per thread
		 * and never equal a stream pointer (8-aligned) */
		if (!thread_key)
			thread_key = ((uint64_t)syscall(SYS_gettid) << 3) | 2;
		key = thread_key, kind = FWD_SK_PERTHREAD, handle = cudaStreamPerThread;
	} else {
		key = v, kind = 0xff;
	}
	if (fwd.last_stream < fwd.nstreams && fwd.streams[fwd.last_stream].key == key)
		return &fwd.streams[fwd.last_stream];
	for (i = 0; i < fwd.nstreams; i++)
		if (fwd.streams[i].key == key)
			return &fwd.streams[fwd.last_stream = i];
	if (fwd.nstreams >= FWD_MAX_STREAMS)
		return NULL;
	if (kind == 0xff) {
		/* flags once per stream; a destroyed stream's handle reused by a
		 * new stream keeps the old kind (streams are not hooked) */
		REAL_FN(get_flags, "cudaStreamGetFlags");
		unsigned flags = 0;

		if (!get_flags ||
		    IN_RUNTIME(((cudaError_t (*)(cudaStream_t, unsigned *))get_flags)(s, &flags)) !=
			    cudaSuccess)
			return NULL;  /* the local launch reports the bad handle */
		kind = (flags & cudaStreamNonBlocking) ? FWD_SK_NONBLOCKING : FWD_SK_BLOCKING;
	}
	i = fwd.nstreams++;
	fwd.streams[i] = (struct fstream){ .key = key, .handle = handle, .kind = kind };
	return &fwd.streams[fwd.last_stream = i];
}

struct fstream *fwd_streams(uint32_t *n)
{
	*n = fwd.nstreams;
	return fwd.streams;
}

static struct fstream *legacy_stream(void)
{
	uint32_t i;

	for (i = 0; i < fwd.nstreams; i++)
		if (fwd.streams[i].kind == FWD_SK_LEGACY)
			return &fwd.streams[i];
	return NULL;
}

static int blocking(uint8_t kind)
{
	return kind == FWD_SK_BLOCKING || kind == FWD_SK_PERTHREAD;
}

int fwd_streams_tied(uint8_t a, uint8_t b)
{
	return (a == FWD_SK_LEGACY && blocking(b)) || (blocking(a) && b == FWD_SK_LEGACY);
}

/*
 * What a local operation on st must wait for (st NULL: everything):
 * its own forwarded launches; on the legacy stream also every blocking
 * stream's; on a blocking stream also the legacy stream's.
 */
static int fence_set(struct fstream *st, struct fwait *w)
{
	uint32_t i;
	int n = 0;

	for (i = 0; i < fwd.nstreams; i++) {
		struct fstream *o = &fwd.streams[i];

		if (!o->last_seq || fconn_done(fwd.conn, i, o->last_seq))
			continue;
		if (!st || o == st || fwd_streams_tied(st->kind, o->kind))
			w[n++] = (struct fwait){ i, o->last_seq };
	}
	return n;
}

/* Before a launch is forwarded on st: local work it must follow is done. */
static void settle_local(struct fstream *st)
{
	struct fstream *lg;
	uint32_t i;

	if (fwd.unknown_pending || (st->kind == FWD_SK_LEGACY && fwd.any_pending)) {
		real_device_sync();
		for (i = 0; i < fwd.nstreams; i++)
			fwd.streams[i].local_pending = 0;
		fwd.any_pending = fwd.unknown_pending = 0;
		return;
	}
	if (st->local_pending) {
		real_stream_sync(st->handle);
		st->local_pending = 0;
	}
	if (blocking(st->kind) && (lg = legacy_stream()) && lg->local_pending) {
		real_stream_sync(lg->handle);
		lg->local_pending = 0;
	}
}

static void mark_local(void *s, int ptsz)
{
	struct fstream *st = fwd_stream(s, ptsz);

	if (st)
		st->local_pending = 1;
	else
		fwd.unknown_pending = 1;
	fwd.any_pending = 1;
}

/* ---------------------------------------------------------------- kernels */

static struct fkernel *kernel_info(const void *key)
{
	static int warned_probe;
	struct shim_kernel *sk = shim_kernel_find(key);
	struct fwd_param params[FWD_MAX_PARAMS];
	struct fwd_define m;
	struct fkernel *k;
	size_t nlen, o;
	uint32_t n = 0, total = 0, gen;
	const char *name;
	int mid;
	REAL_FN(param_info, "cudaFuncGetParamInfo");

	if (!sk)
		sk = shim_kernel_learn(key);
	if (!sk || !sk->name || !strcmp(sk->name, "?"))
		return &not_forwardable;
	gen = __atomic_load_n(&sk->gen, __ATOMIC_ACQUIRE);
	/* a stale view (the key registered again under another module or
	 * name) is left as is, never freed: its kid is not reused, so every
	 * connection's defined[] and shipped[] stay right, and the next DEFINE
	 * is built anew */
	if (sk->fwd && ((struct fkernel *)sk->fwd)->gen == gen)
		return sk->fwd;
	name = __atomic_load_n(&sk->name, __ATOMIC_ACQUIRE);
	if (!param_info) {
		if (!warned_probe++)
			shim_log("the CUDA runtime has no cudaFuncGetParamInfo (CUDA < 12.4): "
				 "kernels run locally");
		return &not_forwardable;
	}
	/* the probe ends in an error the app must not see from
	 * cudaGetLastError; with one of its own pending, try another time */
	if (real_peek_error() != cudaSuccess)
		return NULL;
	while (n < FWD_MAX_PARAMS) {
		size_t off, size;

		if (((cudaError_t (*)(const void *, size_t, size_t *, size_t *))param_info)(
			    key, n, &off, &size) != cudaSuccess)
			break;
		if (off > FWD_MAX_ARGBYTES || size == 0 || size > FWD_MAX_ARGBYTES ||
		    off + size > FWD_MAX_ARGBYTES) {
			n = FWD_MAX_PARAMS + 1;
			break;
		}
		params[n].offset = (uint32_t)off;
		params[n].size = (uint32_t)size;
		if (off + size > total)
			total = (uint32_t)(off + size);
		n++;
	}
	real_clear_error();
	nlen = strlen(name);
	k = calloc(1, sizeof(*k));
	if (!k)
		return NULL;
	k->name = name;                 /* the names table is never freed */
	k->gen = gen;
	if (n == 0 || n > FWD_MAX_PARAMS || nlen > FWD_MAX_STR || fwd.nkernels >= FWD_MAX_KERNELS) {
		shim_log("kernel %s runs locally even when routed to a worker: %s", name,
			 n == 0 ? "its parameter layout is unknown (or it has none)"
				: fwd.nkernels >= FWD_MAX_KERNELS ? "too many kernels"
								 : "parameters beyond the protocol's limits");
		sk->fwd = k;            /* ok = 0: not forwardable, said once */
		return k;
	}
	k->params = malloc(n * sizeof(*params));
	k->define_len = sizeof(m) + n * sizeof(*params) + nlen;
	k->define = malloc(k->define_len);
	if (!k->params || !k->define) {
		free(k->params);
		free(k->define);
		free(k);
		return NULL;
	}
	memcpy(k->params, params, n * sizeof(*params));
	k->nparams = (uint16_t)n;
	k->argbytes = total;
	k->kid = fwd.nkernels++;
	mid = __atomic_load_n(&sk->module, __ATOMIC_ACQUIRE);
	k->mid = mid >= 0 && mid < (int)FWD_MAX_MODULES ? (uint32_t)mid : FWD_NO_MODULE;
	memset(&m, 0, sizeof(m));
	fwd_hdr_init(&m.h, FWD_T_DEFINE, 0, k->define_len);
	m.kid = k->kid;
	m.nparams = (uint16_t)n;
	m.name_len = (uint16_t)nlen;
	m.argbytes = total;
	m.mid = k->mid;
	memcpy(k->define, &m, sizeof(m));
	o = sizeof(m);
	memcpy(k->define + o, params, n * sizeof(*params));
	o += n * sizeof(*params);
	memcpy(k->define + o, name, nlen);
	k->ok = 1;
	sk->fwd = k;
	return k;
}

/*
 * Module mid ready to ship: its file written (once per process) and its
 * MODULE frame built.  0, or -1 (said once): its kernels then run locally.
 * The first time costs a hash of the image and maybe a file write, under
 * fwd.mu: once per module per process.
 */
static int module_ready(uint32_t mid, const char *kname)
{
	char path[PATH_MAX], why[PATH_MAX + 128];
	struct fwd_module m;
	const void *image;
	uint64_t size, hash;
	size_t plen;

	if (fmods[mid].state)
		return fmods[mid].state > 0 ? 0 : -1;
	fmods[mid].state = -1;
	if (shim_module_image((int)mid, &image, &size) < 0) {
		shim_log("kernels of module %u (%s, ...) run locally even when routed: its fat "
			 "binary was unregistered", mid, kname);
		return -1;
	}
	if (fconn_module_file(image, size, &hash, path, sizeof(path), why, sizeof(why)) < 0) {
		shim_log("kernels of module %u (%s, ...) run locally even when routed: %s", mid,
			 kname, why);
		return -1;
	}
	plen = strlen(path);
	fmods[mid].len = sizeof(m) + plen;
	fmods[mid].frame = malloc(fmods[mid].len);
	if (!fmods[mid].frame) {
		fmods[mid].state = 0;          /* try again later */
		return -1;
	}
	memset(&m, 0, sizeof(m));
	/* registration is over by the first launch: has_vars is final */
	fwd_hdr_init(&m.h, FWD_T_MODULE, shim_module_has_vars((int)mid) ? FWD_MF_VARS : 0,
		     fmods[mid].len);
	m.mid = mid;
	m.size = size;
	m.hash = hash;
	m.path_len = (uint16_t)plen;
	memcpy(fmods[mid].frame, &m, sizeof(m));
	memcpy(fmods[mid].frame + sizeof(m), path, plen);
	fmods[mid].state = 1;
	return 0;
}

static int shipped(const struct fconn *c, uint32_t mid)
{
	return mid == FWD_NO_MODULE || (c->shipped[mid / 64] & (1ull << (mid % 64)));
}

/* ---------------------------------------------------------------- losing a worker */

static void wentry_free(struct wentry *e)
{
	free(e->frame);
	e->frame = NULL;
}

/* Retire completed launches from the window's tail. */
static void reap(void)
{
	while (fwd.tail < fwd.head) {
		struct wentry *e = &fwd.window[fwd.tail % FWD_WINDOW];

		if (!fconn_done(fwd.conn, e->sidx, e->seq))
			break;
		wentry_free(e);
		fwd.tail++;
	}
}

/* COLOCATE_REPLAY_IN_DOUBT=1: the user vouches that the app's kernels
 * can run twice (none reads what it writes), so a launch that may have run
 * in part in the dead worker is replayed instead of reported. */
static int replay_in_doubt(void)
{
	static int v = -1;

	if (v < 0) {
		const char *e = getenv("COLOCATE_REPLAY_IN_DOUBT");

		v = e && *e && strcmp(e, "0") != 0;
	}
	return v;
}

/*
 * The worker is gone (or refused a malformed frame): replay locally, in
 * order, every launch of the window it did not complete, then run locally
 * until the route changes.  fwd.mu held.
 *
 * Exactly once: on each stream, the launches past done[] form a run in
 * stream order.  All but the first of them certainly never started (the
 * stream had not finished the first), and so did the first when it was
 * never handed to CUDA (past submitted[]): those are replayed.  The first,
 * when handed to CUDA, may have run in part - an in-place kernel replayed
 * would apply twice - so it is not run again but reported to the app as a
 * launch failure (unless COLOCATE_REPLAY_IN_DOUBT=1).
 */
static void lose_worker(const char *why)
{
	struct fconn *c = fwd.conn;
	uint64_t i, unfinished = 0, failed = 0, doubt = 0;
	uint8_t seen[FWD_MAX_STREAMS] = { 0 };
	const char *doubt_name = NULL;

	note_failed(c);
	for (i = fwd.tail; i < fwd.head; i++) {
		struct wentry *e = &fwd.window[i % FWD_WINDOW];
		void *argv[FWD_MAX_PARAMS];
		struct fwd_launch m;
		launch_fn fn;
		uint32_t j;
		int first;

		if (fconn_done(c, e->sidx, e->seq)) {
			wentry_free(e);
			continue;
		}
		unfinished++;
		first = !seen[e->sidx];
		seen[e->sidx] = 1;
		if (first && e->counted &&
		    __atomic_load_n(&c->page->submitted[e->sidx], __ATOMIC_ACQUIRE) >= e->seq &&
		    !replay_in_doubt()) {
			doubt++;
			if (!doubt_name)
				doubt_name = e->k->name;
			wentry_free(e);
			continue;          /* counted as launched and forwarded */
		}
		memcpy(&m, e->frame, sizeof(m));
		for (j = 0; j < e->k->nparams; j++)
			argv[j] = e->frame + sizeof(m) + e->k->params[j].offset;
		fn = replay_fn(e->entry, e->coop);
		/* per-thread default streams belong to their threads: replay their
		 * work on the legacy stream, which orders with all of them */
		if (!fn || IN_RUNTIME(fn(e->key, mkdim(m.grid), mkdim(m.block), argv, m.shmem,
				    fwd.streams[e->sidx].kind == FWD_SK_PERTHREAD
					    ? cudaStreamLegacy
					    : fwd.streams[e->sidx].handle)) != cudaSuccess)
			failed++;
		else if (!e->counted)
			shim_count_launch(e->key);   /* it never reached the worker */
		if (e->counted)
			__atomic_fetch_sub(&shim_ctr->forwarded, 1, __ATOMIC_RELAXED);
		wentry_free(e);
	}
	fwd.tail = fwd.head;
	if ((failed || doubt) && !fwd.err)
		fwd.err = cudaErrorLaunchFailure;
	shim_log("worker %u (pid %u) lost: %s; replayed %llu unfinished launch%s locally%s%s; "
		 "running locally until the route changes", c->worker, c->worker_pid, why,
		 (unsigned long long)(unfinished - doubt), unfinished - doubt == 1 ? "" : "es",
		 failed ? ", failed: " : "", failed ? "reported to the app" : "");
	if (doubt)
		shim_log("%llu launch%s (%s%s) may have run in part in the dead worker and %s not run "
			 "again: reported to the app as a launch failure (COLOCATE_REPLAY_IN_DOUBT=1 "
			 "replays them, for kernels that can run twice)",
			 (unsigned long long)doubt, doubt == 1 ? "" : "es",
			 doubt_name ? doubt_name : "?", doubt > 1 ? ", ..." : "",
			 doubt == 1 ? "was" : "were");
	fwd.conn = NULL;
	fconn_close(c, 0);
	fwd_publish();
}

/* Wait for everything forwarded to complete; 0, or -1 when the worker was
 * lost (and its work replayed).  fwd.mu held. */
static int drain(void)
{
	struct fwait w[FWD_MAX_STREAMS];
	char why[256];
	int n = fence_set(NULL, w);

	if (n && fconn_wait(fwd.conn, w, n, why, sizeof(why)) < 0) {
		lose_worker(why);
		return -1;
	}
	note_failed(fwd.conn);
	reap();
	return 0;
}

/* ---------------------------------------------------------------- routes */

/* Keep a drained connection for a later return; the oldest kept one goes. */
static void keep(struct fconn *c)
{
	struct fconn *old = fwd.kept[FWD_KEEP - 1];

	memmove(&fwd.kept[1], &fwd.kept[0], (FWD_KEEP - 1) * sizeof(fwd.kept[0]));
	fwd.kept[0] = c;
	if (old)
		fconn_close(old, 1);
}

/* A kept connection to worker `route` that is still sound, or NULL. */
static struct fconn *unkeep(uint32_t route)
{
	char why[256];
	unsigned i;

	for (i = 0; i < FWD_KEEP; i++) {
		struct fconn *c = fwd.kept[i];

		if (!c || c->worker != route)
			continue;
		memmove(&fwd.kept[i], &fwd.kept[i + 1], (FWD_KEEP - 1 - i) * sizeof(fwd.kept[0]));
		fwd.kept[FWD_KEEP - 1] = NULL;
		/* nothing of ours is outstanding there: a lost one just goes.
		 * The quick test (no /proc read, no socket poll: 60 us of a
		 * switch's 120 us measured) suffices here: a worker that dies
		 * unnoticed is caught by the next wait's full test, and what we
		 * sent it is replayed. */
		if (fconn_lost_quick(c, why, sizeof(why))) {
			fconn_close(c, 0);
			return NULL;
		}
		return c;
	}
	return NULL;
}

static void leave_worker(void)
{
	struct fconn *c = fwd.conn;

	if (drain() < 0)
		return;
	fwd.conn = NULL;
	keep(c);
}

static void join_worker(uint32_t route)
{
	char why[512];
	struct fconn *c;
	uint32_t i;

	/* COLOCATE_MEM=vmm with memory a worker cannot see: when in doubt,
	 * run natively (said once) */
	if (shim_vmm_unshared()) {
		if (!fwd.unshared_said)
			shim_log("not forwarding to worker %u: %s; running locally", route,
				 shim_vmm_unshared());
		fwd.unshared_said = 1;
		return;
	}
	/* local work queued before the switch finishes before the worker
	 * runs anything that follows it */
	real_device_sync();
	c = unkeep(route);
	if (!c)
		c = fconn_open(route, why, sizeof(why));
	if (!c) {
		/* said once per worker, not at every route change to it */
		if (fwd.refused_worker != route)
			shim_log("cannot forward to worker %u: %s; running locally", route, why);
		fwd.refused_worker = route;
		return;
	}
	if (fwd.refused_worker == route)
		fwd.refused_worker = 0;
	for (i = 0; i < fwd.nstreams; i++) {
		fwd.streams[i].last_seq = 0;
		fwd.streams[i].local_pending = 0;
	}
	fwd.any_pending = fwd.unknown_pending = 0;
	fwd.head = fwd.tail = 0;
	fwd.nsent = 0;
	fwd.conn = c;
}

/*
 * A MAP or UNMAP to our worker was not acked (shim_vmm.c voided the
 * connection): the worker may lack memory of ours, or still map a range we
 * freed and may reuse.  Leave it before the next launch: drain (a stalled
 * worker is lost at the wait's liveness test, its work replayed), close
 * the connection (never kept: its memory view is void) and run locally
 * until the route changes; a new connection maps everything afresh.
 * fwd.mu held.
 */
static void leave_void(void)
{
	struct fconn *c = fwd.conn;
	uint32_t w = c->worker;

	if (drain() == 0) {
		fwd.conn = NULL;
		fconn_close(c, 1);
		shim_log("leaving worker %u: it did not map or unmap some of the app's memory; "
			 "running locally until the route changes", w);
	}
	fwd_publish();
}

/* Act on a new route epoch, at a launch boundary; a hold waits here (and
 * acts on the route that ends it).  fwd.mu held. */
static void follow_route(void)
{
	uint64_t v = __atomic_load_n(&shim_vmm_voids, __ATOMIC_RELAXED);

	/* one relaxed load per launch: the voiding thread bumped it before
	 * its cudaMalloc/cudaFree returned, which precedes any launch that
	 * uses that memory */
	if (__builtin_expect(v != fwd.voids_seen, 0)) {
		fwd.voids_seen = v;
		if (fwd.conn && fwd.conn->memfd >= 0 && !shim_vmm_conn_ok(fwd.conn->memfd))
			leave_void();
	}
	/* memory the worker cannot see appeared while routed (e.g. a
	 * cudaMallocManaged): leave, as at a route change, and stay local */
	if (fwd.conn && shim_vmm_unshared()) {
		uint32_t w = fwd.conn->worker;

		leave_worker();
		if (!fwd.conn) {
			shim_log("leaving worker %u: %s; running locally", w, shim_vmm_unshared());
			fwd.unshared_said = 1;
		}
		fwd_publish();
	}
	for (;;) {
		uint64_t e = __atomic_load_n(&shim_ctl->route_epoch, __ATOMIC_ACQUIRE);
		uint32_t route;

		if (!fwd.acted || e != fwd.epoch) {
			route = __atomic_load_n(&shim_ctl->route, __ATOMIC_RELAXED);
			fwd.acted = 1;
			fwd.epoch = e;
			fwd_hold_end();
			if (fwd.conn && fwd.conn->worker == route) {
				fwd_publish();         /* the quota changed, not the worker */
				return;
			}
			if (fwd.conn)
				leave_worker();    /* drained first, as for any change */
			if (CB_ROUTE_IS_PART(route)) {
				/* an SM partition in the app (shim_part.c) */
				if (fwd.conn ||
				    part_enter(CB_ROUTE_START(route), CB_ROUTE_PCT(route)) < 0)
					part_leave();
			} else {
				part_leave();      /* streams wait on the device */
				if (route == CB_ROUTE_HOLD)
					fwd_hold_begin(e);
				else if (route != CB_ROUTE_LOCAL)
					join_worker(route);
			}
			fwd_publish();
		}
		if (!fwd_held() || fwd_hold_wait(e) == 0)
			return;
	}
}

int shim_fwd_follow(void)
{
	int routed;

	if (fwd_lock() < 0)
		return shim_fwd_check();
	follow_route();
	routed = fwd.conn != NULL || fwd.err != 0 || part_on();
	fwd_unlock();
	return routed;
}

/* ---------------------------------------------------------------- launches */

/* A launch that stays local while routed: after the forwarded work it
 * follows, and before the forwarded work that follows it. */
static int ordered_local(const struct shim_launch *l)
{
	struct fwait w[FWD_MAX_STREAMS];
	struct fstream *st = fwd_stream(l->stream, l->ptsz);
	char lost[256];
	int n, r;

	n = fence_set(st, w);
	if (n && fconn_wait(fwd.conn, w, n, lost, sizeof(lost)) < 0)
		lose_worker(lost);
	r = shim_launch_local(l);
	fwd.local_runs++;
	if (fwd.conn)
		mark_local(l->stream, l->ptsz);
	return r;
}

/* Make room in the window.  0, or -1 when the worker was lost. */
static int window_room(void)
{
	char why[256];

	reap();
	while (fwd.head - fwd.tail >= __atomic_load_n(&window_cap, __ATOMIC_RELAXED)) {
		struct wentry *e = &fwd.window[fwd.tail % FWD_WINDOW];
		struct fwait w = { e->sidx, e->seq };

		if (fconn_wait(fwd.conn, &w, 1, why, sizeof(why)) < 0) {
			lose_worker(why);
			return -1;
		}
		reap();
	}
	return 0;
}

/*
 * Kernel k on this connection: its MODULE (once per module), its DEFINE,
 * and the worker's verdict, waited for (fwd_proto.h "Refusals").  0 taken,
 * 1 refused: k runs locally, in order, while this connection lives (kept
 * connections keep it: a return to the worker does not ask again); -1 the
 * worker was lost (what it had is replayed).  Once per kernel per
 * connection, so the round trip is paid once, not per launch.  fwd.mu held.
 */
static int define_kernel(struct fkernel *k)
{
	struct fconn *c = fwd.conn;
	char why[256];

	if (!shipped(c, k->mid)) {
		if (fconn_send(c, fmods[k->mid].frame, fmods[k->mid].len) < 0)
			goto unsent;
		c->shipped[k->mid / 64] |= 1ull << (k->mid % 64);
	}
	if (fconn_send(c, k->define, k->define_len) < 0)
		goto unsent;
	c->defined[k->kid / 64] |= 1ull << (k->kid % 64);
	c->ndefines++;
	if (fconn_wait_defines(c, why, sizeof(why)) < 0) {
		lose_worker(why);
		return -1;
	}
	if (!fconn_refused(c, k->kid))
		return 0;
	c->refused[k->kid / 64] |= 1ull << (k->kid % 64);
	if (k->refused_by != c->worker) {
		k->refused_by = c->worker;
		shim_log("kernel %s runs locally while routed to worker %u: the worker cannot "
			 "run it (see the worker's log)", k->name, c->worker);
	}
	return 1;
unsent:
	lose_worker("cannot send to the worker");
	return -1;
}

static int forward(const struct shim_launch *l)
{
	const cudaLaunchConfig_t *cfg = l->config;
	uint32_t grid[3], block[3];
	size_t shmem = l->shmem;
	void *stream = l->stream;
	struct fwd_launch m;
	struct fkernel *k;
	struct fstream *st;
	struct wentry *e;
	int coop = l->entry == SHIM_E_COOP;
	char why[256];
	unsigned i;

	if (l->entry == SHIM_E_GRAPH)
		return ordered_local(l);
	memcpy(grid, l->grid, sizeof(grid));
	memcpy(block, l->block, sizeof(block));
	if (l->entry == SHIM_E_EXC) {
		if (!cfg || (cfg->numAttrs && !cfg->attrs))
			return ordered_local(l);
		for (i = 0; i < cfg->numAttrs; i++) {
			if (cfg->attrs[i].id != cudaLaunchAttributeCooperative)
				return ordered_local(l);
			coop |= cfg->attrs[i].val.cooperative != 0;
		}
		grid[0] = cfg->gridDim.x, grid[1] = cfg->gridDim.y, grid[2] = cfg->gridDim.z;
		block[0] = cfg->blockDim.x, block[1] = cfg->blockDim.y, block[2] = cfg->blockDim.z;
		shmem = cfg->dynamicSmemBytes;
		stream = cfg->stream;
	}
	k = kernel_info(l->key);
	if (!k || !k->ok || (k->nparams && !l->args) || shmem > UINT32_MAX)
		return ordered_local(l);
	st = fwd_stream(stream, l->ptsz);
	if (!st)
		return ordered_local(l);
	for (i = 0; i < k->nparams; i++)
		if (!l->args[i])
			return ordered_local(l);   /* the runtime says why */
	if (!shipped(fwd.conn, k->mid) && module_ready(k->mid, k->name) < 0)
		return ordered_local(l);
	if (!(fwd.conn->defined[k->kid / 64] & (1ull << (k->kid % 64))) && define_kernel(k) < 0)
		return shim_launch_local(l);       /* after the replay, in order */
	if (fwd.conn->refused[k->kid / 64] & (1ull << (k->kid % 64)))
		return ordered_local(l);
	settle_local(st);
	if (window_room() < 0)
		return shim_launch_local(l);

	e = &fwd.window[fwd.head % FWD_WINDOW];
	memset(e, 0, sizeof(*e));
	e->len = sizeof(m) + k->argbytes;
	e->frame = malloc(e->len);
	if (!e->frame)
		return ordered_local(l);
	memset(&m, 0, sizeof(m));
	fwd_hdr_init(&m.h, FWD_T_LAUNCH,
		     (coop ? FWD_LF_COOP : 0) | (fwd_span_timed() ? FWD_LF_TIMED : 0), e->len);
	m.seq = ++fwd.seq;
	m.kid = k->kid;
	m.sidx = (uint16_t)(st - fwd.streams);
	m.skind = st->kind;
	memcpy(m.grid, grid, sizeof(grid));
	memcpy(m.block, block, sizeof(block));
	m.shmem = (uint32_t)shmem;
	m.argbytes = k->argbytes;
	memcpy(e->frame, &m, sizeof(m));
	memset(e->frame + sizeof(m), 0, k->argbytes);   /* padding between args */
	for (i = 0; i < k->nparams; i++)
		memcpy(e->frame + sizeof(m) + k->params[i].offset, l->args[i], k->params[i].size);
	e->seq = m.seq;
	e->sidx = m.sidx;
	e->entry = l->entry;
	e->coop = coop;
	e->key = l->key;
	e->k = k;
	fwd.head++;                       /* in the window before it is sent */

	if (fconn_send(fwd.conn, e->frame, e->len) < 0) {
		lose_worker("cannot send to the worker");   /* replays this one */
		return fwd.err ? take_error() : cudaSuccess;
	}
	st->last_seq = m.seq;
	e->counted = 1;
	shim_count_launch(l->key);
	shim_add(&shim_ctr->forwarded, 1);
	if (fwd_span_timed())
		fwd_span_add(fwd.conn, m.seq, m.sidx);

	if (++fwd.nsent % POLL_EVERY == 0) {
		note_failed(fwd.conn);
		if (shim_now_ns() - fwd.conn->last_check_ns >= CHECK_EVERY &&
		    fconn_lost(fwd.conn, why, sizeof(why)))
			lose_worker(why);
		else
			fconn_poll(fwd.conn);
		if (fwd.conn && __atomic_load_n(&fwd.conn->lost, __ATOMIC_ACQUIRE))
			lose_worker(fwd.conn->lost_why);
		fwd_publish();
	}
	return cudaSuccess;
}

static int fwd_launch(const struct shim_launch *l)
{
	int r;

	if (fwd_lock() < 0)
		return shim_launch_local(l);
	follow_route();
	if (fwd.err) {
		r = take_error();
	} else if (!fwd.conn && part_on()) {
		r = part_launch(l);
	} else if (!fwd.conn) {
		fwd_unlock();
		return shim_launch_local(l);
	} else {
		r = forward(l);
	}
	fwd_unlock();
	return r;
}

int shim_fwd_launch(const struct shim_launch *l)
{
	uint32_t n = fwd_span_count();
	int r = fwd_launch(l);

	/* inside a timed task, a launch that was not forwarded and timed
	 * (it ran here, or was replayed here) leaves the task untimed */
	fwd_span_local(n);
	return r;
}

/* ---------------------------------------------------------------- driver launches */

void *shim_fwd_drv_begin(void *stream, int ptsz, int *eager)
{
	void *shadow = NULL;

	if (fwd_lock() < 0)
		return NULL;
	follow_route();
	if (!fwd.conn && !fwd.err && part_on())
		shadow = part_drv_begin(stream, ptsz, eager);
	if (!shadow)
		fwd_unlock();
	return shadow;          /* fwd.mu held until shim_fwd_drv_end */
}

void shim_fwd_drv_end(void *stream, int ptsz, int eager, int code)
{
	part_drv_end(stream, ptsz, eager, code);
	fwd_unlock();
}

void shim_fwd_drv_all_sms(void)
{
	if (fwd_lock() < 0)
		return;
	if (part_on())
		part_all_sms();
	fwd_unlock();
}

/* ---------------------------------------------------------------- local operations */

int shim_fwd_fence(void *stream, int ptsz, int scope)
{
	struct fwait w[FWD_MAX_STREAMS];
	struct fconn *c;
	char why[256];
	int n, r;

	if (fwd_lock() < 0)
		return 0;
	if (fwd.err || !fwd.conn) {
		if (part_on())
			part_fence(stream, ptsz, scope);   /* on the device */
		r = take_error();
		fwd_unlock();
		return r;
	}
	n = fence_set(scope == SHIM_FENCE_ALL ? NULL : fwd_stream(stream, ptsz), w);
	c = fwd.conn;
	fconn_get(c);
	fwd_unlock();

	/* wait without the lock: other threads keep launching meanwhile */
	r = n ? fconn_wait(c, w, n, why, sizeof(why)) : 0;

	fwd_lock();
	if (fwd.conn == c) {
		if (r < 0)
			lose_worker(why);
		else {
			note_failed(c);
			reap();
		}
	}
	fconn_put(c);
	r = take_error();
	fwd_unlock();
	return r;
}

void shim_fwd_synced(void)
{
	if (fwd_lock() < 0)
		return;
	if (!fwd.conn && part_on())
		part_synced();
	fwd_unlock();
}

void shim_fwd_local_done(void *stream, int ptsz)
{
	if (fwd_lock() < 0)
		return;
	if (fwd.conn)
		mark_local(stream, ptsz);
	else if (part_on())
		part_local_done(stream, ptsz);
	fwd_unlock();
}

int shim_fwd_pending(void *stream, int ptsz)
{
	struct fwait w[FWD_MAX_STREAMS];
	int n = 0;

	if (fwd_lock() < 0)
		return 0;
	if (fwd.conn)
		n = fence_set(fwd_stream(stream, ptsz), w);
	else if (part_on())
		part_fence(stream, ptsz, SHIM_FENCE_STREAM);   /* the query sees it */
	fwd_unlock();
	return n > 0;
}

void shim_fwd_exit(void)
{
	if (fwd_lock() < 0)
		return;
	if (fwd.conn) {
		struct fwait w[FWD_MAX_STREAMS];
		struct fconn *c = fwd.conn;
		char why[256];
		int n = fence_set(NULL, w);

		/* work the app did not wait for is unobservable after exit;
		 * finish it on the worker anyway, but do not replay it */
		if (n && fconn_wait(c, w, n, why, sizeof(why)) < 0)
			shim_log("worker %u lost at exit: %s", c->worker, why);
		fwd.conn = NULL;
		fconn_close(c, 1);
	}
	for (unsigned i = 0; i < FWD_KEEP; i++) {
		if (fwd.kept[i])
			fconn_close(fwd.kept[i], 1);
		fwd.kept[i] = NULL;
	}
	if (fwd.local_runs)
		shim_log("%llu launch%s ran locally while routed to a worker (see above why)",
			 (unsigned long long)fwd.local_runs, fwd.local_runs == 1 ? "" : "es");
	fwd_publish();
	fwd_unlock();
}

void shim_fwd_forget(void)
{
	uint64_t i;

	/* the child shares no worker connection, slot or window with its
	 * parent; libzmq's threads are gone: drop everything, touch nothing */
	for (i = fwd.tail; i < fwd.head; i++)
		free(fwd.window[i % FWD_WINDOW].frame);
	memset(fwd.window, 0, sizeof(fwd.window));
	fwd.head = fwd.tail = 0;
	fwd.conn = NULL;
	memset(fwd.kept, 0, sizeof(fwd.kept));     /* leaked: they are the parent's */
	fwd.acted = 0;
	fwd.epoch = 0;
	fwd.err = 0;
	fwd.nstreams = fwd.last_stream = 0;
	fwd.any_pending = fwd.unknown_pending = 0;
	fwd.refused_worker = 0;
	fwd.local_runs = 0;
	fwd_hold_forget();
	fwd.unshared_said = 0;
	thread_key = 0;
	holding = 0;
	fwd_span_forget();
	part_forget();
	pthread_mutex_init(&fwd.mu, NULL);
	fconn_forget();
	__atomic_store_n(&shim_fwd_busy, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&shim_fwd_epoch, 0, __ATOMIC_RELEASE);
}
