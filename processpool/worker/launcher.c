/*
 * launcher.c - an app's launcher thread: runs its forwarded launches, in
 * the order its ring (ring.c) holds them, on worker streams that mirror
 * the app's streams.
 *
 * Streams: one non-blocking worker stream per app stream index, so apps
 * sharing this worker never wait for one another.  The app's default-stream
 * rules are rebuilt with events inside the app only: a launch on the
 * app's legacy stream first waits for every blocking stream that ran
 * something since, and a launch on a blocking stream waits for the legacy
 * stream's latest work (FWD_SK_*).
 *
 * Completions: after every launch a host function ("mark") in the same
 * stream stores the launch's seq in the app's page and wakes its waiters.
 * A timed launch (FWD_LF_TIMED) is also bracketed by two events, and its
 * mark wakes this thread to put its device time in the page (times.c).
 * A host function per launch costs little on simgpu; on a GPU,
 * cuStreamWriteValue64 into a host-registered page would do the same
 * without a host callback (not done yet: the GPU path, VMM-shared app
 * memory, is not validated on a GPU).
 *
 * Translation: an app whose memory this worker could not map at the app's
 * addresses (vmm.c) has every top-level 8-byte, 8-aligned argument that
 * points into one of its allocations moved to the worker's address before
 * the launch; a pointer stored in device memory cannot be, so such an app
 * is right only when its kernels take their pointers as arguments.
 *
 * simgpu blocks a launch whose argument layout it does not know (kernels
 * made by simgpu_kernel_by_name) until the kernel has read its arguments;
 * that is why launches are made here and not on the main thread.
 *
 * simgpu maps another process's device memory on first touch; but a worker
 * outlives apps, and an arena slot of a dead app is reused by the next
 * one, at the same addresses: a touch then hits the old mapping and faults
 * nothing.  So every argument word that may be a device pointer goes
 * through simgpu_map_peer() first, which remaps a slot that changed hands
 * (and costs two loads when nothing changed).
 */
#define _GNU_SOURCE
#include "worker.h"

#include <limits.h>
#include <linux/futex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>


/* A timed launch completed: its events can be read, which only the
 * launcher may do (a host function may not call CUDA).  Wake it if it
 * sleeps; seq_cst pairs with its store of ring_sleeping before it checks
 * w_times_due. */
static void wake_for_times(struct wapp *a)
{
	atomic_fetch_add_explicit(&a->tmarks, 1, memory_order_seq_cst);
	if (__atomic_load_n(&a->page->ring_sleeping, __ATOMIC_SEQ_CST))
		w_ring_kick(a);
}

static void CUDART_CB on_mark(void *arg)
{
	struct wstream *ws = arg;
	struct fwd_page *pg = ws->app->page;
	uint64_t t = atomic_load_explicit(&ws->mtail, memory_order_relaxed);
	uint64_t v = ws->marks[t & (W_MARKS - 1)];

	/* simgpu runs host functions even after a kernel faulted (a GPU would
	 * not run them): never report a faulted kernel as done.  A host
	 * function may not call CUDA on a GPU; on simgpu this one only reads. */
	if (wstate.on_simgpu) {
		cudaError_t e = cudaPeekAtLastError();

		if (w_sticky(e))
			w_die(e);
	}

	atomic_store_explicit(&ws->mtail, t + 1, memory_order_release);
	/* counted before done[] says so: an app that saw its launch done and
	 * asks for the stats finds it counted */
	if (!(v & W_MARK_FAILED)) {
		__atomic_fetch_add(&pg->executed, 1, __ATOMIC_RELAXED);
		atomic_fetch_add_explicit(&wstate.executed, 1, memory_order_relaxed);
	}
	/* seq_cst pairs with the waiter's increment of `waiters` */
	__atomic_store_n(&pg->done[ws->idx], v & W_MARK_SEQ, __ATOMIC_SEQ_CST);
	__atomic_fetch_add(&pg->wake, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&pg->waiters, __ATOMIC_SEQ_CST))
		syscall(SYS_futex, &pg->wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
	if (v & W_MARK_TIMED)
		wake_for_times(ws->app);
}

static void record_failure(struct wapp *a, uint64_t seq, cudaError_t e)
{
	/* one writer (this thread): the first failure is kept */
	if (__atomic_load_n(&a->page->failed_seq, __ATOMIC_RELAXED))
		return;
	a->page->failed_code = (int32_t)e;
	__atomic_store_n(&a->page->failed_seq, seq, __ATOMIC_RELEASE);
}

/* Queue the completion mark of the launch with value v (seq | failed). */
static void mark(struct wstream *ws, uint64_t v)
{
	if (ws->mhead - atomic_load_explicit(&ws->mtail, memory_order_acquire) >= W_MARKS)
		cudaStreamSynchronize(ws->s);   /* cannot happen with the shim's window */
	ws->marks[ws->mhead & (W_MARKS - 1)] = v;
	ws->mhead++;
	if (cudaLaunchHostFunc(ws->s, on_mark, ws) != cudaSuccess) {
		/* complete it by hand once everything before it is done */
		cudaGetLastError();
		cudaStreamSynchronize(ws->s);
		cudaGetLastError();
		on_mark(ws);
	}
}

static struct wstream *get_stream(struct wapp *a, unsigned idx, int kind)
{
	struct wstream *ws = a->streams[idx];

	if (ws)
		return ws;
	ws = calloc(1, sizeof(*ws));
	if (!ws)
		return NULL;
	if (cudaStreamCreateWithFlags(&ws->s, cudaStreamNonBlocking) != cudaSuccess) {
		cudaGetLastError();
		free(ws);
		return NULL;
	}
	if (cudaEventCreateWithFlags(&ws->ev, cudaEventDisableTiming) != cudaSuccess) {
		cudaGetLastError();
		cudaStreamDestroy(ws->s);
		free(ws);
		return NULL;
	}
	ws->kind = kind;
	ws->idx = (int)idx;
	ws->app = a;
	ws->seen_legacy = a->legacy_launches;
	a->streams[idx] = ws;
	return ws;
}

static int blocking(int kind)
{
	return kind == FWD_SK_BLOCKING || kind == FWD_SK_PERTHREAD;
}

/* s waits for everything queued so far on from. */
static void stream_after(struct wstream *s, struct wstream *from)
{
	if (cudaEventRecord(from->ev, from->s) != cudaSuccess ||
	    cudaStreamWaitEvent(s->s, from->ev, 0) != cudaSuccess) {
		/* no event: order the hard way, on this thread */
		cudaGetLastError();
		cudaStreamSynchronize(from->s);
		cudaGetLastError();
	}
}

/* The app's default-stream rules, before a launch on ws. */
static void order(struct wapp *a, struct wstream *ws)
{
	unsigned i;

	if (ws->kind == FWD_SK_LEGACY) {
		for (i = 0; i < FWD_MAX_STREAMS; i++) {
			struct wstream *o = a->streams[i];

			if (o && o != ws && blocking(o->kind) && o->dirty) {
				stream_after(ws, o);
				o->dirty = 0;
			}
		}
	} else if (blocking(ws->kind) && ws->seen_legacy != a->legacy_launches) {
		for (i = 0; i < FWD_MAX_STREAMS; i++) {
			struct wstream *l = a->streams[i];

			if (l && l->kind == FWD_SK_LEGACY)
				stream_after(ws, l);
		}
		ws->seen_legacy = a->legacy_launches;
	}
}

static void map_pointers(const unsigned char *args, uint32_t n)
{
	uint32_t o;

	for (o = 0; o + 8 <= n; o += 8) {
		uint64_t v;

		memcpy(&v, args + o, sizeof(v));
		/* user-space addresses only; simgpu ignores the rest quickly */
		if (v >= 0x10000 && v < (1ull << 47))
			wstate.map_peer((const void *)(uintptr_t)v);
	}
}

void w_launch(struct wapp *a, const struct fwd_launch *m, struct wkernel *k,
	      const unsigned char *args)
{
	void *argv[FWD_MAX_PARAMS];
	unsigned char moved[FWD_MAX_ARGBYTES];
	struct wstream *ws = get_stream(a, m->sidx, m->skind);
	int timed = (m->h.flags & FWD_LF_TIMED) != 0;
	cudaEvent_t ev[2];
	dim3 g, b;
	cudaError_t e;
	unsigned i;

	if (!ws) {
		/* nothing of this index is in flight: complete it as failed now
		 * (untimed: timed[] moves on without a slot) */
		record_failure(a, m->seq, cudaErrorMemoryAllocation);
		if (timed)
			__atomic_store_n(&a->page->timed[m->sidx], m->seq, __ATOMIC_RELEASE);
		__atomic_store_n(&a->page->done[m->sidx], m->seq, __ATOMIC_SEQ_CST);
		__atomic_fetch_add(&a->page->wake, 1, __ATOMIC_SEQ_CST);
		syscall(SYS_futex, &a->page->wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
		return;
	}
	order(a, ws);
	if (wstate.map_peer)
		map_pointers(args, m->argbytes);
	/* the app's memory is elsewhere here: its pointers are moved (the
	 * launch copies its arguments before returning) */
	if (a->vmm && atomic_load_explicit(&wstate.vmm_moved, memory_order_relaxed) &&
	    w_vmm_translate(a, args, m->argbytes, k, moved))
		args = moved;
	for (i = 0; i < k->nparams; i++)
		argv[i] = (void *)(args + k->params[i].offset);
	/* before the call: a launch past submitted[] has certainly not run */
	__atomic_store_n(&a->page->submitted[m->sidx], m->seq, __ATOMIC_RELEASE);
	g.x = m->grid[0], g.y = m->grid[1], g.z = m->grid[2];
	b.x = m->block[0], b.y = m->block[1], b.z = m->block[2];
	if (timed)
		w_time_begin(a, ws, ev);   /* after order(): the waits are not its time */
	if (!k->handle)
		e = cudaErrorInvalidDeviceFunction;
	else if (m->h.flags & FWD_LF_COOP)
		e = cudaLaunchCooperativeKernel(k->handle, g, b, argv, m->shmem, ws->s);
	else
		e = cudaLaunchKernel(k->handle, g, b, argv, m->shmem, ws->s);
	if (w_sticky(e))
		w_die(e);          /* no launch of anyone's can run here any more */
	if (e != cudaSuccess) {
		cudaGetLastError();
		record_failure(a, m->seq, e);
	}
	if (timed)
		w_time_end(a, ws, m->seq, ev, e == cudaSuccess);
	mark(ws, m->seq | (e != cudaSuccess ? W_MARK_FAILED : 0) | (timed ? W_MARK_TIMED : 0));
	if (ws->kind == FWD_SK_LEGACY)
		a->legacy_launches++;
	else if (blocking(ws->kind))
		ws->dirty = 1;
}

static uint64_t mono_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static int stopping(struct wapp *a)
{
	return __atomic_load_n(&a->stop, __ATOMIC_ACQUIRE);
}

static int ring_wake_up(struct wapp *a)
{
	return !w_ring_empty(a) || stopping(a) || w_times_due(a);
}

/* After a stop, what the ring holds then still runs (shutdown finishes
 * queued work); after an abandon (the app died), nothing more does. */
static void ring_loop(struct wapp *a)
{
	for (;;) {
		uint64_t t0;

		w_times_poll(a);
		if (w_ring_run(a) > 0)
			continue;
		if (stopping(a)) {
			while (!a->poisoned && w_ring_run(a) > 0)
				;
			break;
		}
		if (a->poisoned) {
			/* refused: wait for the app to notice and leave */
			w_ring_sleep(a, stopping);
			continue;
		}
		t0 = mono_ns();
		while (!ring_wake_up(a) && mono_ns() - t0 < wstate.spin_ns)
			;
		if (!ring_wake_up(a))
			w_ring_sleep(a, ring_wake_up);
	}
}

void *w_launcher(void *arg)
{
	struct wapp *a = arg;
	unsigned i;

	ring_loop(a);
	/* in-flight kernels and their marks finish before we go, and the
	 * times of the timed ones go to the page (unless the app is gone) */
	for (i = 0; i < FWD_MAX_STREAMS; i++)
		if (a->streams[i])
			cudaStreamSynchronize(a->streams[i]->s);
	if (!__atomic_load_n(&a->abandon, __ATOMIC_RELAXED))
		w_times_poll(a);
	w_times_free(a);
	for (i = 0; i < FWD_MAX_STREAMS; i++) {
		struct wstream *ws = a->streams[i];

		if (!ws)
			continue;
		cudaEventDestroy(ws->ev);
		cudaStreamDestroy(ws->s);
		cudaGetLastError();
		free(ws);
		a->streams[i] = NULL;
	}
	atomic_store(&a->finished, 1);
	return NULL;
}
