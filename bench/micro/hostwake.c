// hostwake: how long this machine takes to run a thread that was asleep,
// from the futex wake to the thread's first instruction.
//
//   hostwake [--n N] [--idle-us U] [--other-cpu]
//
// simgpu runs each stream on its own executor thread, which sleeps after
// 30 us without work (shim/simgpu/stream.c): the first kernel on a stream
// that has been idle -- on an SM partition not used since the last route
// change, the shadow stream's -- starts only once that thread runs.  On a
// GPU nothing wakes.  This is that wake-up alone, so that simgpu's
// switch figures (bench/partitions.py) can be read against it.
//
// N times: sleep U us (the sleeper goes idle for that long first: give it
// more than simgpu's 30 us spin, or the "wake" is a hand-off to a thread
// that has not gone to sleep yet), take
// the time, wake the sleeper (FUTEX_WAKE), then poll for its answer,
// keeping this CPU busy as an app that launches and synchronises does (the
// woken thread must run on another CPU, or preempt this one); the sleeper
// takes the time and answers.  Threads are not pinned, as simgpu's are not
// (the scheduler then usually runs the woken thread on the waker's CPU),
// unless --other-cpu: the waker on the first CPU it may use, the sleeper on
// the next, so that each wake crosses to another CPU that went idle.
//
// Prints `HOSTWAKE n=N idle_us=U p10_us=... p50_us=... p90_us=... p99_us=...
// same_cpu=F`, F the fraction of wakes whose thread ran on the waker's CPU
// (it then waited for the waker to be preempted; on another CPU it waited
// for that CPU, perhaps idle, to be woken).
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static atomic_int go, back;       /* futex words: 1 = posted */
static atomic_llong t_ran;
static atomic_int cpu_ran;

static long long now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void wait_for(atomic_int *w)
{
	while (!atomic_exchange(w, 0))
		syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
}

static void post(atomic_int *w)
{
	atomic_store(w, 1);
	syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static cpu_set_t allowed;         /* the process's CPUs, before any pinning */

static int pin_to(int nth)
{
	cpu_set_t one;
	int c, seen = 0;

	for (c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &allowed) && seen++ == nth) {
			CPU_ZERO(&one);
			CPU_SET(c, &one);
			return pthread_setaffinity_np(pthread_self(), sizeof(one), &one) ? -1 : 0;
		}
	return -1;                        /* fewer CPUs than that */
}

static int other_cpu;

static void *sleeper(void *arg)
{
	(void)arg;
	if (other_cpu && pin_to(1) != 0) {
		fprintf(stderr, "hostwake: --other-cpu needs two CPUs\n");
		exit(2);
	}
	for (;;) {
		wait_for(&go);
		atomic_store(&t_ran, now_ns());
		atomic_store(&cpu_ran, sched_getcpu());
		atomic_store(&back, 1);
	}
	return NULL;
}

static int cmp_ll(const void *a, const void *b)
{
	long long x = *(const long long *)a, y = *(const long long *)b;

	return x < y ? -1 : x > y;
}

static long arg_long(int argc, char **argv, int *i, long lo, long hi)
{
	char *end;
	long v;

	if (*i + 1 >= argc) {
		fprintf(stderr, "hostwake: %s needs a value\n", argv[*i]);
		exit(2);
	}
	v = strtol(argv[++*i], &end, 10);
	if (end == argv[*i] || *end || v < lo || v > hi) {
		fprintf(stderr, "hostwake: %s wants %ld..%ld, not %s\n", argv[*i - 1], lo, hi, argv[*i]);
		exit(2);
	}
	return v;
}

int main(int argc, char **argv)
{
	long n = 1000, idle_us = 50000, same = 0;
	long long *d;
	pthread_t t;
	int i;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--n"))
			n = arg_long(argc, argv, &i, 10, 10000000);
		else if (!strcmp(argv[i], "--idle-us"))
			idle_us = arg_long(argc, argv, &i, 0, 1000000);
		else if (!strcmp(argv[i], "--other-cpu"))
			other_cpu = 1;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: hostwake [--n N] [--idle-us U (50000)] [--other-cpu]\n");
			return 0;
		} else {
			fprintf(stderr, "hostwake: unknown option %s\nusage: hostwake [--n N] [--idle-us U]\n",
				argv[i]);
			return 2;
		}
	}
	d = malloc(n * sizeof(*d));
	if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
		fprintf(stderr, "hostwake: sched_getaffinity failed\n");
		return 1;
	}
	if (other_cpu && pin_to(0) != 0) {
		fprintf(stderr, "hostwake: --other-cpu needs two CPUs\n");
		return 2;
	}
	if (!d || pthread_create(&t, NULL, sleeper, NULL) != 0) {
		fprintf(stderr, "hostwake: no memory or no thread\n");
		return 1;
	}
	for (i = 0; i < n; i++) {
		struct timespec idle = { idle_us / 1000000, idle_us % 1000000 * 1000 };
		long long t0;

		if (idle_us)
			nanosleep(&idle, NULL);
		t0 = now_ns();
		post(&go);
		while (!atomic_exchange(&back, 0))
			;
		d[i] = atomic_load(&t_ran) - t0;
		same += atomic_load(&cpu_ran) == sched_getcpu();
	}
	qsort(d, n, sizeof(*d), cmp_ll);
	printf("HOSTWAKE n=%ld idle_us=%ld p10_us=%.2f p50_us=%.2f p90_us=%.2f p99_us=%.2f same_cpu=%.2f\n",
	       n, idle_us, d[n / 10] / 1e3, d[n / 2] / 1e3, d[n * 9 / 10] / 1e3, d[n * 99 / 100] / 1e3,
	       (double)same / n);
	return 0;
}
