/*
 * shim_feed.c - the task feed: completed tasks to the controller, live.
 *
 * On when the controller's reply to "register" says "feed": true (the
 * policy wants on_task_done).  Records are taken and timed exactly as for
 * the file; a feed thread, started at the first record, resolves what has
 * completed every FEED_POLL_NS (a non-blocking event query: never a wait)
 * and sends it as one "tasks" message over the controller socket
 * (shim_ctl_send: one-way, never blocking).  One message per poll, at most
 * FEED_BYTES of tasks: a fuller batch leaves the rest queued for the next,
 * unless the queue of records is full (the app outruns the thread): the app
 * thread then sends the full batch itself.
 *
 * Nothing queues without bound: a message the socket refuses is dropped
 * and its tasks counted (the next message says how many in "dropped");
 * the controller gone (its pid, checked every FEED_ALIVE_NS), the feed
 * turns itself off.  At exit the thread stops first and what completes
 * within the trace's wait goes out from the exiting thread.  A forked
 * child has no thread and no feed until it registers itself.
 *
 * Event calls here run on the feed thread, whose last error is its own:
 * the app's cudaGetLastError never sees them (shim_trace_events.c keeps it tidy too).
 *
 * Locking: the batch and the counts are under trace_mu (shim_trace_int.h),
 * which the thread takes for each poll and holds while it sends (a send
 * never blocks); feed_live and feed_stop are also read without it
 * (atomics), where exit may come on a thread that holds it.
 */
#define _GNU_SOURCE
#include "shim_trace_int.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define FEED_BYTES    (60 * 1024)   /* tasks per message: schema.MAX_BYTES is 64 KiB */
#define FEED_MSG_ROOM (FEED_BYTES + 256)
#define FEED_POLL_NS  500000L       /* 0.5 ms                                  */
#define FEED_ALIVE_NS 100000000ull  /* controller liveness, every 100 ms       */

static char *feed_buf;              /* "{task},{task}..."                      */
static size_t feed_len;
static unsigned feed_n;             /* tasks in feed_buf                       */
static uint64_t feed_seq;           /* tasks fed or dropped so far: "n"        */
static uint64_t feed_dropped, feed_sent, feed_msgs;
static pthread_t feed_tid;
static int feed_live;               /* the thread runs                         */
static int feed_stop;               /* asks it to return (atomic)              */
static int feed_dev = -1;           /* the app thread's device, for the thread */
static void *feed_ctx;              /* and its driver context                  */
static int tried;                   /* to start the thread (once a process)    */

int shim_trace_feed_count(uint64_t *sent, uint64_t *dropped_out, uint64_t *msgs)
{
	pthread_mutex_lock(&trace_mu);
	*sent = feed_sent;
	*dropped_out = feed_dropped;
	*msgs = feed_msgs;
	pthread_mutex_unlock(&trace_mu);
	return feed_live;
}

void shim_trace_feed_on(void)
{
	__atomic_or_fetch(&shim_trace_flag.on, TRACE_ON_FEED, __ATOMIC_RELEASE);
}

/* Off for good in this process (the controller is gone); trace_mu held or not. */
static void feed_off(const char *why)
{
	if (__atomic_fetch_and(&shim_trace_flag.on, ~TRACE_ON_FEED, __ATOMIC_ACQ_REL) & TRACE_ON_FEED)
		shim_log("feed: %s; task feedback off (%llu task(s) sent, %llu dropped)", why,
			 (unsigned long long)feed_sent, (unsigned long long)feed_dropped);
}

/* Fork child: the parent's thread, batch and counts are not ours. */
void trace_feed_forget(void)
{
	__atomic_and_fetch(&shim_trace_flag.on, ~TRACE_ON_FEED, __ATOMIC_RELEASE);
	feed_len = feed_n = 0;
	feed_seq = feed_dropped = feed_sent = feed_msgs = 0;
	feed_live = 0;
	feed_stop = 0;
	tried = 0;
}

/* Under trace_mu.  The batch as one message into dst (cap FEED_MSG_ROOM); the
 * batch is emptied.  Returns the tasks in it (0: nothing to send). */
static unsigned feed_take_locked(char *dst, size_t cap)
{
	unsigned n = feed_n;
	int w;

	if (!n)
		return 0;
	w = snprintf(dst, cap, "{\"v\":1,\"type\":\"tasks\",\"pid\":%d,\"slot\":%d,\"dropped\":%llu,"
		     "\"tasks\":[%.*s]}", trace_pid, shim_ctl_slot(),
		     (unsigned long long)feed_dropped, (int)feed_len, feed_buf);
	feed_len = feed_n = 0;
	if (w < 0 || (size_t)w >= cap) {
		feed_dropped += n;   /* cannot happen: the batch is bounded */
		shim_ledger_feed(feed_seq, feed_sent, feed_dropped);
		return 0;
	}
	return n;
}

/* After a send of n tasks (rc from shim_ctl_send).  Under trace_mu. */
static void feed_sent_locked(unsigned n, int rc)
{
	if (rc == 0) {
		feed_sent += n;
		feed_msgs++;
	} else {
		feed_dropped += n;
	}
	shim_ledger_feed(feed_seq, feed_sent, feed_dropped);
}

/* Under trace_mu, from a thread that may send (exit, or no feed thread). */
static void feed_flush_locked(void)
{
	static char msg[FEED_MSG_ROOM];
	unsigned n = feed_take_locked(msg, sizeof(msg));

	if (n)
		feed_sent_locked(n, shim_ctl_send(msg));
}

/* Under trace_mu: one resolved task into the batch.  1 done (queued, sent
 * or dropped and counted), 0 the batch is full and the thread sends it soon:
 * leave the record queued (unless force). */
int trace_feed_put_locked(const struct shim_trace_rec *r, int timed, int64_t start_ns,
			  int64_t dur_ns, int force)
{
	int tries;

	if (!feed_buf && !(feed_buf = malloc(FEED_BYTES))) {
		feed_dropped++;
		feed_seq++;
		shim_ledger_feed(feed_seq, feed_sent, feed_dropped);
		return 1;
	}
	for (tries = 0; tries < 2; tries++) {
		if (trace_json_feed_task(feed_buf, &feed_len, FEED_BYTES, feed_seq, r, timed, start_ns,
					 dur_ns) == 0) {
			feed_n++;
			feed_seq++;
			return 1;
		}
		if (!feed_n)
			break;          /* one task larger than a message: never */
		if (feed_live && !force)
			return 0;
		/* no thread (exit), or the app outruns it (the queue is full):
		 * this thread sends the batch, in order, under trace_mu */
		feed_flush_locked();
	}
	feed_dropped++;
	feed_seq++;
	shim_ledger_feed(feed_seq, feed_sent, feed_dropped);
	return 1;
}

static void *feed_main(void *arg)
{
	struct timespec nap = { 0, FEED_POLL_NS };
	char *msg = malloc(FEED_MSG_ROOM);
	uint64_t last_alive = shim_now_ns();
	unsigned n;
	int rc;

	(void)arg;
	if (!msg)
		goto out;
	/* the device (runtime) and context (driver) the app's records live on:
	 * a thread starts on device 0 with no context */
	trace_ev_go_to(feed_dev, feed_ctx);
	while (!__atomic_load_n(&feed_stop, __ATOMIC_ACQUIRE)) {
		nanosleep(&nap, NULL);
		pthread_mutex_lock(&trace_mu);
		/* stop asked while it waited for trace_mu: exit may be tearing
		 * the context down, so no CUDA call from here on */
		if (!trace_feed_on() || getpid() != trace_pid ||
		    __atomic_load_n(&feed_stop, __ATOMIC_ACQUIRE)) {
			pthread_mutex_unlock(&trace_mu);
			break;
		}
		trace_drain_locked();
		/* sent under trace_mu (shim_ctl_send never blocks): an app thread
		 * that must send a full batch itself cannot overtake this one */
		n = feed_take_locked(msg, FEED_MSG_ROOM);
		rc = n ? shim_ctl_send(msg) : 0;
		if (n)
			feed_sent_locked(n, rc);
		pthread_mutex_unlock(&trace_mu);
		if (rc < 0 || shim_now_ns() - last_alive >= FEED_ALIVE_NS) {
			last_alive = shim_now_ns();
			if (!shim_ctl_alive()) {
				feed_off("the controller is gone");
				break;
			}
		}
	}
out:
	free(msg);
	pthread_mutex_lock(&trace_mu);
	__atomic_store_n(&feed_live, 0, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&trace_mu);
	return NULL;
}

/* Under trace_mu, on an app thread that just queued a record: the thread,
 * once. */
void trace_feed_start_locked(void)
{
	pthread_attr_t at;
	sigset_t all, old;

	if (feed_live || tried || getpid() != trace_pid)
		return;
	tried = 1;
	trace_ev_where(&feed_dev, &feed_ctx);
	/* the app's signals are the app's threads' business */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&at);
	pthread_attr_setstacksize(&at, 256 * 1024);
	feed_stop = 0;
	if (pthread_create(&feed_tid, &at, feed_main, NULL) == 0)
		__atomic_store_n(&feed_live, 1, __ATOMIC_RELEASE);
	else
		shim_log("feed: cannot start its thread; tasks are sent at syncs and exit only");
	pthread_attr_destroy(&at);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* At exit, before trace_mu: the thread returns (bounded: it may be waiting
 * for trace_mu held by the very thread that exits). */
void trace_feed_stop(void)
{
	struct timespec ts;
	int live;

	/* no trace_mu here: exit may come on a thread that holds it */
	live = __atomic_load_n(&feed_live, __ATOMIC_ACQUIRE) && getpid() == trace_pid;
	if (!live)
		return;
	__atomic_store_n(&feed_stop, 1, __ATOMIC_RELEASE);
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += 300000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	if (pthread_timedjoin_np(feed_tid, NULL, &ts) != 0)
		shim_log("feed: its thread did not stop at exit");
}

/* Under trace_mu, at exit after settling: the last batch. */
void trace_feed_exit_locked(void)
{
	if (feed_live)
		return;         /* still running (did not stop): it sends it */
	if (trace_feed_on())
		feed_flush_locked();
}

