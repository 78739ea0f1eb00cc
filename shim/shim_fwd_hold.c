/*
 * shim_fwd_hold.c - holds: the controller's route CB_ROUTE_HOLD keeps this
 * app's launches waiting in the app (copies and syncs go on) until it
 * changes the route again, for at most COLOCATE_HOLD_MAX_MS, and gives up
 * at once when the controller is gone.  The time held is added to the
 * slot's held_ns while it lasts, so the controller can show it.
 *
 * Locking: everything here is under fwd.mu (fwd_lock, shim_fwd.c); a
 * waiting launch lets go of it between its looks at the route.
 */
#define _GNU_SOURCE
#include "shim_fwd.h"

#include <stdlib.h>
#include <time.h>

static struct {
	int on;                         /* a hold is in force                   */
	uint64_t epoch;                 /* the route epoch that said hold       */
	uint64_t since;                 /* when it began (ns)                   */
	uint64_t accounted;             /* up to when it is in held_ns (ns)     */
	int waiting;                    /* launches waiting on it               */
} hold;

/* COLOCATE_HOLD_MAX_MS: the longest one hold keeps launches waiting. */
static uint64_t hold_max_ns(void)
{
	static uint64_t v;

	if (!v) {
		const char *e = getenv("COLOCATE_HOLD_MAX_MS");
		long long ms = e && *e ? atoll(e) : 10000;

		v = (uint64_t)(ms > 0 ? ms : 10000) * 1000000ull;
	}
	return v;
}

/* Held time into the slot's held_ns up to now (the controller shows it
 * while the hold lasts).  fwd.mu held. */
static void hold_account(uint64_t now)
{
	if (hold.on && now > hold.accounted) {
		__atomic_fetch_add(&shim_ctl->held_ns, now - hold.accounted, __ATOMIC_RELAXED);
		hold.accounted = now;
	}
}

void fwd_hold_begin(uint64_t epoch)
{
	hold.on = 1;
	hold.epoch = epoch;
	hold.since = hold.accounted = shim_now_ns();
}

void fwd_hold_end(void)
{
	hold_account(shim_now_ns());
	hold.on = 0;
}

int fwd_held(void)
{
	return hold.on;
}

void fwd_hold_forget(void)
{
	hold.on = hold.waiting = 0;
}

#define HOLD_NAP_NS     1000000L      /* 1 ms between looks at the epoch     */
#define HOLD_ALIVE_NS   50000000ull   /* the controller's pid, every 50 ms   */

/*
 * The route says hold (epoch e): wait, without fwd.mu, until the controller
 * changes the route (1: act on it), or give up and run locally until the
 * next change (0): the controller is gone, or the hold lasted
 * COLOCATE_HOLD_MAX_MS.  Short sleeps: a held app costs ~no CPU, and other
 * threads' copies and syncs go on meanwhile (they fence nothing: the
 * worker, if any, was left before).  fwd.mu held on entry and on return.
 */
int fwd_hold_wait(uint64_t e)
{
	struct timespec nap = { 0, HOLD_NAP_NS };
	uint64_t last_alive = shim_now_ns(), now;
	const char *gave_up = NULL;
	int first = hold.waiting++ == 0;

	fwd_unlock();
	for (;;) {
		nanosleep(&nap, NULL);
		if (__atomic_load_n(&shim_ctl->route_epoch, __ATOMIC_ACQUIRE) != e)
			break;
		now = shim_now_ns();
		if (now - hold.since >= hold_max_ns()) {
			gave_up = "COLOCATE_HOLD_MAX_MS";
			break;
		}
		if (now - last_alive >= HOLD_ALIVE_NS) {
			last_alive = now;
			if (!shim_ctl_alive()) {
				gave_up = "the controller is gone";
				break;
			}
		}
		if (first && fwd_lock() == 0) {   /* keep held_ns current */
			if (hold.on && hold.epoch == e)
				hold_account(now);
			fwd_unlock();
		}
	}
	fwd_lock();
	hold.waiting--;
	if (gave_up && hold.on && hold.epoch == e) {
		/* the first to give up says it and releases the others */
		fwd_hold_end();
		shim_log("held for %.0f ms (%s): running locally until the route changes",
			 (shim_now_ns() - hold.since) / 1e6, gave_up);
		fwd_publish();
	}
	return gave_up == NULL;
}
