/*
 * fault.c - SIGSEGV and SIGBUS.
 *
 * Two jobs:
 *  1. A touch of another process's device memory that is not mapped here
 *     yet (a pointer received through IPC, a forwarded kernel's argument)
 *     maps that process's arena at the same address and resumes.  Twins
 *     and copies thus dereference any device pointer of the device.
 *  2. A genuine fault inside a twin or an executor copy is contained: the
 *     executor jumps back and reports cudaErrorIllegalAddress, as a GPU
 *     would, instead of killing the process.
 * Anything else goes to the handler that was installed before ours, or to
 * the default action.
 *
 * The handler runs with SA_NODEFER so that siglongjmp out of it needs no
 * signal-mask system call on the (per-kernel) protected path.
 */
#include <setjmp.h>
#include <signal.h>
#include <string.h>

#include "simgpu_impl.h"

static struct sigaction old_segv, old_bus;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static __thread sigjmp_buf *volatile guard;

static void chain(int sig, siginfo_t *si, void *ctx)
{
	struct sigaction *old = sig == SIGSEGV ? &old_segv : &old_bus;

	if ((old->sa_flags & SA_SIGINFO) && old->sa_sigaction) {
		old->sa_sigaction(sig, si, ctx);
		return;
	}
	if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN && old->sa_handler) {
		old->sa_handler(sig);
		return;
	}
	/* Default action: restore it and return; the access faults again. */
	signal(sig, SIG_DFL);
}

static void on_fault(int sig, siginfo_t *si, void *ctx)
{
	sigjmp_buf *jb;

	if (si && sg_in_region(si->si_addr) && sg_arena_fault_map(si->si_addr) == 0)
		return;
	jb = guard;
	if (jb) {
		guard = NULL;
		siglongjmp(*jb, 1);
	}
	chain(sig, si, ctx);
}

static void install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_fault;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGSEGV, &sa, &old_segv);
	sigaction(SIGBUS, &sa, &old_bus);
}

void sg_fault_install(void)
{
	pthread_once(&install_once, install);
}

int sg_protected_call(void (*fn)(void *), void *arg)
{
	sigjmp_buf jb;

	sg_fault_install();
	if (sigsetjmp(jb, 0)) {
		guard = NULL;
		return -1;
	}
	guard = &jb;
	fn(arg);
	guard = NULL;
	return 0;
}
