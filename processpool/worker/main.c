/*
 * main.c - colocate-worker start-up, the poll loop and shutdown.
 *
 * Signals: SIGTERM/SIGINT are blocked in every thread (the mask is set
 * before any thread exists, so libzmq's and the CUDA runtime's threads
 * inherit it) and read from a signalfd in the poll loop: shutdown then
 * happens on the main thread, between two messages, never inside one.
 *
 * Shutdown (SIGTERM): stop taking new apps and launches, let every launcher
 * finish what it has queued (bounded by COLOCATE_WORKER_DRAIN_MS, default
 * 3000), tell each app (ERROR CLOSING, so it falls back at once instead of
 * waiting for a heartbeat to stop), remove the socket and pid file, exit 0.
 */
#define _GNU_SOURCE
#include "worker.h"
#include "zmqdl.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct wglobal wstate;

static char sock_path[PATH_MAX], pid_path[PATH_MAX];

void w_log(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	colocate_vlog("colocate-worker", wstate.id, fmt, ap);
	va_end(ap);
}

uint64_t w_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Errors after which a CUDA context accepts no more work. */
int w_sticky(cudaError_t e)
{
	switch (e) {
	case cudaErrorIllegalAddress:
	case cudaErrorLaunchFailure:
	case cudaErrorLaunchTimeout:
	case cudaErrorHardwareStackError:
	case cudaErrorIllegalInstruction:
	case cudaErrorMisalignedAddress:
	case cudaErrorInvalidAddressSpace:
	case cudaErrorInvalidPc:
	case cudaErrorAssert:
	case cudaErrorECCUncorrectable:
		return 1;
	default:
		return 0;
	}
}

static void remove_files(void);

void w_die(cudaError_t e)
{
	w_log("CUDA context broken (%s, by a kernel run for an app); exiting: apps replay "
	      "what did not complete, the pool starts another worker", cudaGetErrorName(e));
	remove_files();
	_exit(70);
}

static void usage(void)
{
	fprintf(stderr, "usage: colocate-worker --id N --quota Q --runtime-dir DIR\n");
}

static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static int parse_args(int argc, char **argv)
{
	int i, have_id = 0, have_q = 0;

	for (i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage();
			exit(0);
		}
		if (!v) {
			fprintf(stderr, "colocate-worker: %s needs a value\n", a);
			return -1;
		}
		if (!strcmp(a, "--id")) {
			if (parse_u32(v, 1, 0x7fffffff, &wstate.id) < 0) {
				fprintf(stderr, "colocate-worker: bad --id %s (1..2^31-1)\n", v);
				return -1;
			}
			have_id = 1;
		} else if (!strcmp(a, "--quota")) {
			if (parse_u32(v, 1, 100, &wstate.quota) < 0) {
				fprintf(stderr, "colocate-worker: bad --quota %s (1..100)\n", v);
				return -1;
			}
			have_q = 1;
		} else if (!strcmp(a, "--runtime-dir")) {
			wstate.rundir = v;
		} else {
			fprintf(stderr, "colocate-worker: unknown option %s\n", a);
			return -1;
		}
		i++;
	}
	if (!have_id || !have_q || !wstate.rundir || !*wstate.rundir) {
		usage();
		return -1;
	}
	return 0;
}

/* The quota is the MPS variable (read at context creation); --quota is
 * what the pool meant.  Set it when absent, say so when they differ. */
static void quota_env(void)
{
	const char *v = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
	char buf[16];

	if (!v || !*v) {
		snprintf(buf, sizeof(buf), "%u", wstate.quota);
		setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", buf, 1);
	} else if (atof(v) != (double)wstate.quota) {
		w_log("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%s differs from --quota %u; the "
		      "variable is what the device applies", v, wstate.quota);
	}
}

static int write_pid_file(void)
{
	char tmp[PATH_MAX + 8], buf[32];
	int fd, n;

	snprintf(tmp, sizeof(tmp), "%s.tmp", pid_path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return -1;
	n = snprintf(buf, sizeof(buf), "%u\n", wstate.pid);
	if (write(fd, buf, (size_t)n) != n) {
		close(fd);
		unlink(tmp);
		return -1;
	}
	close(fd);
	/* rename: a reader sees the old file or the whole new one */
	return rename(tmp, pid_path);
}

/* Remove the pid file only while it is still ours. */
static void remove_files(void)
{
	char buf[32] = "";
	int fd = open(pid_path, O_RDONLY | O_CLOEXEC);

	if (fd >= 0) {
		ssize_t n = read(fd, buf, sizeof(buf) - 1);

		close(fd);
		buf[n > 0 ? n : 0] = 0;
		if ((uint32_t)strtoul(buf, NULL, 10) == wstate.pid)
			unlink(pid_path);
	}
	unlink(sock_path);
}

static int env_ms(const char *name, int dflt)
{
	const char *v = getenv(name);
	int ms = v && *v ? atoi(v) : dflt;

	return ms > 0 ? ms : dflt;
}

static void *open_router(void)
{
	char endpoint[PATH_MAX + 8];
	void *ctx, *s;
	int zero = 0, linger = 200;

	ctx = zmq.ctx_new();
	s = ctx ? zmq.socket(ctx, ZMQ_ROUTER) : NULL;
	if (!s) {
		w_log("zmq socket: %s", zmq.strerror(zmq.errno_()));
		return NULL;
	}
	/* a HWM would drop a HELLO, BYE or reply; what travels here is small
	 * and bounded (launches go through the apps' rings) */
	zmq.setsockopt(s, ZMQ_RCVHWM, &zero, sizeof(zero));
	zmq.setsockopt(s, ZMQ_SNDHWM, &zero, sizeof(zero));
	zmq.setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
	snprintf(endpoint, sizeof(endpoint), "ipc://%s", sock_path);
	if (zmq.bind(s, endpoint) < 0) {
		w_log("cannot bind %s: %s", endpoint, zmq.strerror(zmq.errno_()));
		zmq.close(s);
		return NULL;
	}
	return s;
}

static void device_identity(void)
{
	const char *d = getenv("SIMGPU_DIR");
	char *r;

	wstate.device[0] = 0;
	if (!d || !*d)
		return;
	r = realpath(d, NULL);
	snprintf(wstate.device, sizeof(wstate.device), "%s", r ? r : d);
	free(r);
}

int main(int argc, char **argv)
{
	struct zmqdl_pollitem items[2 + 1 + W_VMM_MAX_CONNS];
	sigset_t sigs;
	char why[512];
	const char *by_name;
	int sfd, drain_ms, clean;
	uint64_t last_tick = 0;
	cudaError_t e;

	if (parse_args(argc, argv) < 0)
		return 2;
	wstate.pid = (uint32_t)getpid();
	if (snprintf(sock_path, sizeof(sock_path), "%s/worker-%u.sock", wstate.rundir, wstate.id) >= 108) {
		/* sockaddr_un.sun_path is 108 bytes */
		w_log("runtime dir path too long for an ipc socket: %s", sock_path);
		return 1;
	}
	snprintf(pid_path, sizeof(pid_path), "%s/worker-%u.pid", wstate.rundir, wstate.id);

	/* before any thread exists: every thread inherits the blocked mask */
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigprocmask(SIG_BLOCK, &sigs, NULL);
	sfd = signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0) {
		w_log("signalfd: %m");
		return 1;
	}

	quota_env();
	device_identity();
	/* as the shim's waits: poll only when cores are to spare */
	wstate.spin_ns = getenv("COLOCATE_FWD_SPIN_US") && *getenv("COLOCATE_FWD_SPIN_US")
		? strtoull(getenv("COLOCATE_FWD_SPIN_US"), NULL, 10) * 1000ull
		: sysconf(_SC_NPROCESSORS_ONLN) > 4 ? 30000ull : 2000ull;
	if (zmqdl_load(dlsym, why, sizeof(why)) < 0) {
		w_log("%s; set COLOCATE_LIBZMQ", why);
		return 1;
	}
	/* the CUDA context (an MPS client on a GPU) exists before READY */
	e = cudaFree(NULL);
	if (e != cudaSuccess) {
		w_log("cannot create a CUDA context: %s", cudaGetErrorString(e));
		return 1;
	}
	*(void **)&wstate.kernel_by_name = dlsym(RTLD_DEFAULT, "simgpu_kernel_by_name");
	*(void **)&wstate.has_twin = dlsym(RTLD_DEFAULT, "simgpu_kernel_has_twin");
	/* with the layout, a launch copies its arguments and returns at once */
	*(void **)&wstate.kernel_define = dlsym(RTLD_DEFAULT, "simgpu_kernel_define_layout");
	*(void **)&wstate.map_peer = dlsym(RTLD_DEFAULT, "simgpu_map_peer");
	/* CUDA 12.4+: a DEFINE's layout is checked against its module's */
	*(void **)&wstate.param_info = dlsym(RTLD_DEFAULT, "cudaFuncGetParamInfo");
	wstate.on_simgpu = wstate.kernel_by_name != NULL;
	by_name = getenv("COLOCATE_WORKER_BY_NAME");
	wstate.has_by_name = wstate.on_simgpu && !(by_name && !strcmp(by_name, "0"));
	if (!wstate.on_simgpu)
		w_log("not simgpu: only apps whose memory is VMM-shared (COLOCATE_MEM=vmm) are "
		      "taken; others are told so and run locally");
	else if (!wstate.has_by_name)
		w_log("COLOCATE_WORKER_BY_NAME=0: kernels only from the apps' modules, as on a GPU");
	wstate.refuse_hook = getenv("COLOCATE_WORKER_REFUSE");
	if (wstate.refuse_hook && !*wstate.refuse_hook)
		wstate.refuse_hook = NULL;
	if (wstate.refuse_hook)
		w_log("COLOCATE_WORKER_REFUSE=%s (test hook): refusing kernels whose name holds it",
		      wstate.refuse_hook);

	wstate.sock = open_router();
	if (!wstate.sock)
		return 1;
	/* apps' VMM-shared memory (COLOCATE_MEM=vmm): the region, the mem
	 * socket.  Without them only apps whose memory is shared otherwise
	 * (simgpu's arena) are taken */
	w_vmm_init();
	if (write_pid_file() < 0) {
		w_log("cannot write %s: %m", pid_path);
		unlink(sock_path);
		w_vmm_close();
		return 1;
	}
	printf("READY worker %u quota %u pid %u\n", wstate.id, wstate.quota, wstate.pid);
	fflush(stdout);

	items[0] = (struct zmqdl_pollitem){ wstate.sock, 0, ZMQ_POLLIN, 0 };
	items[1] = (struct zmqdl_pollitem){ NULL, sfd, ZMQ_POLLIN, 0 };
	while (!wstate.closing) {
		uint64_t now;
		int nv = w_vmm_items(items + 2, 1 + W_VMM_MAX_CONNS);
		int n = zmq.poll(items, 2 + nv, 100);

		if (n < 0 && zmq.errno_() != EINTR) {
			w_log("zmq_poll: %s", zmq.strerror(zmq.errno_()));
			break;
		}
		if (n > 0 && (items[1].revents & ZMQ_POLLIN)) {
			struct signalfd_siginfo si;

			if (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
				w_log("signal %u: shutting down", si.ssi_signo);
			wstate.closing = 1;
		}
		if (n > 0)
			w_vmm_serve(items + 2, nv);
		w_frames_drain();
		now = w_now_ns();
		if (now - last_tick >= 100000000ull) {
			cudaError_t ce = cudaPeekAtLastError();

			/* a fault that no later launch or mark has reported yet */
			if (w_sticky(ce))
				w_die(ce);
			w_apps_tick(now);
			w_vmm_tick();
			last_tick = now;
		}
	}

	drain_ms = env_ms("COLOCATE_WORKER_DRAIN_MS", 3000);
	wstate.closing = 1;
	clean = w_apps_shutdown(w_now_ns() + (uint64_t)drain_ms * 1000000ull);
	w_vmm_tick();
	w_vmm_close();
	remove_files();
	zmq.close(wstate.sock);
	w_log("exiting: %llu kernels run for apps%s",
	      (unsigned long long)atomic_load(&wstate.executed),
	      clean ? "" : " (some launcher threads did not finish in time)");
	fflush(stdout);
	if (!clean)
		_exit(0);   /* destructors would race the stuck threads */
	return 0;
}
