// vmm_probe: does VMM device memory map at the SAME virtual address in a
// second process, an MPS client at another SM percentage?  (Issue 3, part 1;
// bench/gpu_pool.py runs it for several percentage pairs, with and without
// MPS.)
//
//   gpu-vmm_probe [--child-pct Q] [--child-mps-pipe DIR] [--mb M] [--reps R] [--arena-hint ADDR]
//                 [--arena-gb G] [--timeout-s T]
//
// The process's own SM percentage is CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, as
// for every MPS client; --child-pct Q gives the child another one (default:
// the same environment), and --child-mps-pipe DIR its own MPS pipe
// directory (so that a parent outside MPS hands memory to an MPS client, as
// an app under `colocate run` does to a pool worker).  The production plan of docs/ARCHITECTURE.md, step by
// step:
//
//   parent  context; CU_DEVICE_ATTRIBUTE_MPS_ENABLED; reserve the arena
//           (below); cuMemCreate M MiB with POSIX-fd handles; reserve a VA
//           range, map, set access; fill it with a kernel; export the fd;
//           fork + exec itself as `--child` with its own percentage; send
//           the fd by SCM_RIGHTS over a socketpair (not inheritance: the fd
//           is close-on-exec) with the address and size.
//   child   context first; reserve the arena; receive; cuMemAddressReserve
//           with the parent's address as hint, and note whether ptr == hint;
//           import + map + set access (timed, µs: C-Laius paid 3.2 ms of IPC
//           set-up per switch); a kernel transforms the data (x = 3x + 1);
//           R times more: unmap + release, then import + map + access again
//           (timed: the steady cost); a second kernel adds 7, through the
//           arena mapping when both processes got the arena.  It reports
//           after every step, so a crash still leaves what it had learnt.
//   parent  checks every word (3 * pattern + 8) through its own mapping,
//           and through its arena mapping too (same memory, other address).
//
// The pre-agreed arena: each process reserves --arena-gb GiB (default 64)
// at one fixed hint right after creating its context, before anything else
// can take the range, and the line says whether each got it.  When both
// did, the parent maps the allocation at arena + 1 GiB and so does the
// child: then same-address sharing does not depend on luck.
//
// Output: ONE JSON line on stdout with every fact gathered, also when a
// call fails ("error" names the first failing call with its error name and
// string; the child's failure is "child_error", its last step "child_stage")
// and stderr has one line per failed call.  Exit 0: it ran to a verdict
// ("same address" or "different address"; data_ok false, the parent seeing
// other data than the child wrote, is a finding of that run too); 1: a call
// failed (the line holds what was learnt before); 2: no NVIDIA driver or
// device, or simgpu (nothing measured; the tests run it on simgpu under the
// pretend driver bench/gpu/testdrv/fakedrv.c).
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *NAME = "vmm_probe";

#include "drv.h"
#include "fdpass.h"
#include "jsonline.h"
#include "args.h"

#define PCT_ENV "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
#define PIPE_ENV "CUDA_MPS_PIPE_DIRECTORY"
#define MAGIC 0x766d6d70u        /* "vmmp": both messages start with it */
#define MAX_REPS 1000

/*
 * The arena hint.  x86-64 Linux gives a process 47 bits of address space
 * (up to 0x7fff_ffff_ffff) unless it asks mmap for more.  The kernel puts
 * shared libraries, thread stacks and big mallocs top-down from just under
 * the stack (0x7fxx_xxxx_xxxx), and a PIE executable with its brk heap near
 * 0x55xx-0x56xx_xxxx_xxxx.  0x6000_0000_0000 (96 TiB) lies between the two
 * with tens of TiB to spare on each side, is 1 TiB aligned (any allocation
 * granularity divides it), and is under 2^47, inside the 49-bit virtual
 * address space of the GPU's MMU that unified addressing needs.  The
 * driver's own allocations are elsewhere in the runs we know of; the line
 * reports where (`hint` is a driver-chosen VMM range, `cudamalloc_ptr` a
 * cudaMalloc) and whether anything in /proc/self/maps already overlapped
 * the arena before it was asked for, so a refused hint can be explained.
 */
#define DEFAULT_ARENA_HINT 0x600000000000ULL
#define DEFAULT_ARENA_GB 64
#define ARENA_OFF (1ULL << 30)   /* where the shared allocation goes inside */

struct opts {
	int child_fd;                    /* >= 0: we are the child */
	int child_pct;                   /* 0: the child inherits our environment */
	const char *child_pipe;          /* NULL: the child inherits our MPS pipe dir */
	long mb;
	int reps;
	unsigned long long arena_hint, arena_gb;
	int timeout_s;
};

/* parent -> child; the allocation's fd rides along as SCM_RIGHTS */
struct vmm_msg {
	uint32_t magic;
	uint32_t n;                      /* 32-bit words the kernels touch */
	uint64_t ptr, size, gran, arena_off;
	int32_t parent_arena_ok, reps;
};

/* child -> parent: everything the child learnt so far.  Sent after each
 * step (a child that dies in the next call still leaves its last report)
 * and a last time with final = 1. */
struct vmm_reply {
	uint32_t magic;
	int32_t final;
	char stage[16];                  /* the last step completed */
	int32_t mps_enabled, sm_count, exec_sm;
	int32_t arena_ok, arena_overlap, same_address, arena_mapped, kernels_done, reps_done;
	uint64_t arena_got, got;
	double ctx_ms, setup_us_first, setup_us_median, setup_us_min, teardown_us_median;
	char pct[16];
	char error_call[64];
	char error[400];
	int32_t error_code;
	char arena_error[400];
};

struct devinfo {
	CUdevice dev;
	int mps_enabled, sm_count, exec_sm, vmm, posix_fd;
	char name[128];
	double ctx_ms;
};

__host__ __device__ static inline uint32_t pattern(uint32_t i)
{
	return i * 2654435761u + 12345u;     /* never zeros: a missed write shows */
}

__global__ void vmm_fill(uint32_t *v, uint32_t n)
{
	uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n)
		v[i] = pattern(i);
}

__global__ void vmm_triple(uint32_t *v, uint32_t n)
{
	uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n)
		v[i] = v[i] * 3u + 1u;
}

__global__ void vmm_add7(uint32_t *v, uint32_t n)
{
	uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;

	if (i < n)
		v[i] += 7u;
}

static unsigned int nblocks(uint32_t n)
{
	return (n + 255u) / 256u;
}

/* 1: something in /proc/self/maps overlaps [start, start+len); 0: nothing; -1: unknown */
static int maps_overlap(unsigned long long start, unsigned long long len)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int hit = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long long a, b;

		if (sscanf(line, "%llx-%llx", &a, &b) == 2 && a < start + len && b > start)
			hit = 1;
	}
	fclose(f);
	return hit;
}

/* Context (the MPS percentage is read here), then what the device says. */
static int open_device(const struct drv *D, struct fail *F, struct devinfo *di)
{
	CUexecAffinityParam ea;
	double t0 = now_us();

	di->mps_enabled = di->sm_count = di->exec_sm = di->vmm = di->posix_fd = -1;
	if (RCK(cudaSetDevice(0)) || RCK(cudaFree(0)))
		return -1;
	di->ctx_ms = (now_us() - t0) / 1e3;
	if (DCK(DeviceGet, &di->dev, 0) ||
	    DCK(DeviceGetAttribute, &di->mps_enabled, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, di->dev) ||
	    DCK(DeviceGetAttribute, &di->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, di->dev) ||
	    DCK(DeviceGetAttribute, &di->vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
		di->dev) ||
	    DCK(DeviceGetAttribute, &di->posix_fd,
		CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, di->dev) ||
	    DCK(DeviceGetName, di->name, (int)sizeof(di->name), di->dev))
		return -1;
	/* the SM count an MPS client is held to, where the driver tells it;
	 * not every setup answers, and that is no failure */
	if (D->CtxGetExecAffinity(&ea, CU_EXEC_AFFINITY_TYPE_SM_COUNT) == CUDA_SUCCESS)
		di->exec_sm = (int)ea.param.smCount.val;
	if (di->vmm != 1 || di->posix_fd != 1) {
		fail_note(F, "cuDeviceGetAttribute", -1,
			  "device lacks VMM or POSIX-fd shareable handles (see vmm_supported, "
			  "posix_fd_supported)");
		return -1;
	}
	return 0;
}

static void alloc_prop(CUmemAllocationProp *p, CUdevice dev)
{
	memset(p, 0, sizeof(*p));
	p->type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
	p->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p->location.id = dev;
}

static int set_rw(const struct drv *D, struct fail *F, CUdeviceptr p, size_t size, CUdevice dev)
{
	CUmemAccessDesc a;

	memset(&a, 0, sizeof(a));
	a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	a.location.id = dev;
	a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
	return DCK(MemSetAccess, p, size, &a, 1);
}

/* The arena at the fixed hint.  Its failure is a fact of its own
 * (arena_error), not the failure of the probe.  A range granted elsewhere
 * is given back at once: 64 GiB placed by the driver could cover the very
 * address the child is about to ask for, and spoil the main question. */
static void arena_reserve(const struct drv *D, struct fail *F, unsigned long long hint,
			  unsigned long long size, CUdeviceptr *got, int *ok, int *overlap)
{
	*overlap = maps_overlap(hint, size);
	*got = 0;
	*ok = 0;
	if (DCK(MemAddressReserve, got, size, 0, (CUdeviceptr)hint, 0)) {
		*got = 0;
		return;
	}
	*ok = *got == hint;
	if (!*ok) {
		DCK(MemAddressFree, *got, size);
		/* *got stays: where the driver put it is worth reporting */
	}
}

/* ---------------------------------------------------------------- child */

static struct vmm_reply C;

/* Tell the parent how far we got (outside every timed region). */
static void progress(int sock, const char *stage)
{
	snprintf(C.stage, sizeof(C.stage), "%s", stage);
	if (send_msg(sock, &C, sizeof(C), -1))
		fprintf(stderr, "%s: child: cannot send a report: %s\n", NAME, strerror(errno));
}

static int run_child(const struct opts *o)
{
	struct drv Dv, *D = &Dv;
	struct fail Fv, FAv, *F = &Fv;
	struct devinfo di;
	struct vmm_msg msg;
	CUmemGenericAllocationHandle h = 0;
	CUdeviceptr arena = 0, cptr = 0;
	int have_h = 0, have_cptr = 0, mapped = 0, amapped = 0, fd = -1, r, rc;
	double t0, setup[MAX_REPS], down[MAX_REPS];
	uint32_t *via;
	char why[256];
	const char *pct = getenv(PCT_ENV);

	memset(&Dv, 0, sizeof(Dv));
	memset(&Fv, 0, sizeof(Fv));
	memset(&FAv, 0, sizeof(FAv));
	memset(&di, 0, sizeof(di));
	memset(&C, 0, sizeof(C));
	memset(&msg, 0, sizeof(msg));
	C.magic = MAGIC;
	C.mps_enabled = C.sm_count = C.exec_sm = C.arena_ok = C.arena_overlap = C.same_address = -1;
	C.ctx_ms = C.setup_us_first = C.setup_us_median = C.setup_us_min = C.teardown_us_median = NAN;
	snprintf(C.pct, sizeof(C.pct), "%s", pct ? pct : "");

	rc = gpu_absent(why, sizeof(why));
	if (rc) {
		fail_note(F, "child", rc, why);
		goto out;
	}
	if (drv_load(D, F) || open_device(D, F, &di))
		goto out;
	C.mps_enabled = di.mps_enabled;
	C.sm_count = di.sm_count;
	C.exec_sm = di.exec_sm;
	C.ctx_ms = di.ctx_ms;
	arena_reserve(D, &FAv, o->arena_hint, o->arena_gb << 30, &arena, &C.arena_ok,
		      &C.arena_overlap);
	C.arena_got = arena;
	snprintf(C.arena_error, sizeof(C.arena_error), "%s", FAv.msg);
	progress(o->child_fd, "context");

	r = recv_msg(o->child_fd, &msg, sizeof(msg), &fd, o->timeout_s * 1000);
	if (r || msg.magic != MAGIC || fd < 0) {
		fail_note(F, "recvmsg", r, r ? recv_why(r) : fd < 0 ? "no fd in the message"
								: "bad message");
		goto out;
	}
	if (msg.reps < 0 || msg.reps > MAX_REPS) {
		fail_note(F, "recvmsg", -1, "bad reps in the message");
		goto out;
	}
	/* the question of the probe: is the parent's address free here? */
	if (DCK(MemAddressReserve, &cptr, msg.size, msg.gran, (CUdeviceptr)msg.ptr, 0))
		goto out;
	have_cptr = 1;
	C.got = cptr;
	C.same_address = cptr == msg.ptr;
	progress(o->child_fd, "reserved");

	t0 = now_us();
	if (DCK(MemImportFromShareableHandle, &h, (void *)(uintptr_t)fd,
		CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
		goto out;
	have_h = 1;
	if (DCK(MemMap, cptr, msg.size, 0, h, 0))
		goto out;
	mapped = 1;
	if (set_rw(D, F, cptr, msg.size, di.dev))
		goto out;
	C.setup_us_first = now_us() - t0;
	progress(o->child_fd, "mapped");

	vmm_triple<<<nblocks(msg.n), 256>>>((uint32_t *)cptr, msg.n);
	if (RCK(cudaGetLastError()) || RCK(cudaDeviceSynchronize()))
		goto out;
	C.kernels_done = 1;
	progress(o->child_fd, "kernel 1");

	/* the steady cost: the first import may pay one-time set-up */
	for (int i = 0; i < msg.reps; i++) {
		t0 = now_us();
		if (DCK(MemUnmap, cptr, msg.size))
			goto out;
		mapped = 0;
		if (DCK(MemRelease, h))
			goto out;
		have_h = 0;
		down[i] = now_us() - t0;
		t0 = now_us();
		if (DCK(MemImportFromShareableHandle, &h, (void *)(uintptr_t)fd,
			CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
			goto out;
		have_h = 1;
		if (DCK(MemMap, cptr, msg.size, 0, h, 0))
			goto out;
		mapped = 1;
		if (set_rw(D, F, cptr, msg.size, di.dev))
			goto out;
		setup[i] = now_us() - t0;
		C.reps_done = i + 1;
	}
	if (C.reps_done > 0) {
		qsort(setup, C.reps_done, sizeof(double), cmp_double);
		qsort(down, C.reps_done, sizeof(double), cmp_double);
		C.setup_us_median = pct_sorted(setup, C.reps_done, 0.5);
		C.setup_us_min = setup[0];
		C.teardown_us_median = pct_sorted(down, C.reps_done, 0.5);
	}
	progress(o->child_fd, "remapped");

	/* second kernel: through the arena when both sides have it */
	via = (uint32_t *)cptr;
	if (msg.parent_arena_ok == 1 && C.arena_ok == 1) {
		if (DCK(MemMap, arena + msg.arena_off, msg.size, 0, h, 0))
			goto out;
		amapped = 1;
		if (set_rw(D, F, arena + msg.arena_off, msg.size, di.dev))
			goto out;
		C.arena_mapped = 1;
		via = (uint32_t *)(arena + msg.arena_off);
	}
	vmm_add7<<<nblocks(msg.n), 256>>>(via, msg.n);
	if (RCK(cudaGetLastError()) || RCK(cudaDeviceSynchronize()))
		goto out;
	C.kernels_done = 2;
	snprintf(C.stage, sizeof(C.stage), "kernel 2");
out:
	snprintf(C.error_call, sizeof(C.error_call), "%s", Fv.call);
	snprintf(C.error, sizeof(C.error), "%s", Fv.msg);
	C.error_code = Fv.code;
	C.final = 1;
	if (send_msg(o->child_fd, &C, sizeof(C), -1))
		fprintf(stderr, "%s: child: cannot send the reply: %s\n", NAME, strerror(errno));
	/* clean-up failures are printed (stderr) but the reply is gone */
	memset(&Fv, 0, sizeof(Fv));
	if (amapped)
		DCK(MemUnmap, arena + msg.arena_off, msg.size);
	if (mapped)
		DCK(MemUnmap, cptr, msg.size);
	if (have_h)
		DCK(MemRelease, h);
	if (have_cptr)
		DCK(MemAddressFree, cptr, msg.size);
	if (C.arena_ok == 1)
		DCK(MemAddressFree, arena, o->arena_gb << 30);
	if (fd >= 0)
		close(fd);
	return C.error_call[0] ? 1 : 0;
}

/* ---------------------------------------------------------------- parent */

/* Everything the parent reports; NaN / -1 / 0 mean "not known". */
static struct {
	struct fail F, FA, FC;
	struct devinfo di;
	const char *pct;
	char child_pct[16];
	int driver_version, runtime_version;
	size_t gran, size;
	uint32_t n;
	CUdeviceptr ptr, arena, cudamalloc_ptr;
	int arena_ok, arena_overlap, arena_mapped;
	struct vmm_reply rep;
	int have_reply;
	char child_status[96];
	long long mismatches, first_bad;
	int verified, data_ok, alias_ok;
	const struct opts *o;
} P;

static void describe_status(int st)
{
	if (WIFEXITED(st))
		snprintf(P.child_status, sizeof(P.child_status), "exited %d", WEXITSTATUS(st));
	else if (WIFSIGNALED(st))
		snprintf(P.child_status, sizeof(P.child_status), "killed by signal %d (%s)",
			 WTERMSIG(st), strsignal(WTERMSIG(st)));
	else
		snprintf(P.child_status, sizeof(P.child_status), "status 0x%x", st);
}

static int report(int absent_rc, const char *absent_why)
{
	struct jl j;
	const struct vmm_reply *c = P.have_reply ? &P.rep : NULL;
	int verdict = c && c->same_address >= 0;
	int rc;

	jl_begin(&j);
	jl_str(&j, "probe", "vmm");
	if (absent_rc == 2)
		jl_str(&j, "verdict", "no device");
	else
		jl_str(&j, "verdict", !verdict ? "no verdict"
				      : c->same_address ? "same address" : "different address");
	jl_bool(&j, "same_address", c ? c->same_address : -1);
	jl_bool(&j, "data_ok", P.verified ? P.data_ok : -1);
	jl_bool(&j, "arena_same_address",
		c && P.arena_ok >= 0 && c->arena_ok >= 0 ? (P.arena_ok == 1 && c->arena_ok == 1) : -1);
	jl_bool(&j, "arena_data_ok", P.verified && c->arena_mapped ? P.data_ok && P.alias_ok : -1);
	jl_num(&j, "setup_us_first", c ? c->setup_us_first : NAN);
	jl_num(&j, "setup_us_median", c ? c->setup_us_median : NAN);
	jl_num(&j, "setup_us_min", c ? c->setup_us_min : NAN);
	jl_num(&j, "teardown_us_median", c ? c->teardown_us_median : NAN);
	jl_int(&j, "setup_reps", c ? c->reps_done : 0);
	jl_str(&j, "parent_pct", P.pct);
	jl_str(&j, "child_pct", c ? c->pct : P.child_pct[0] ? P.child_pct : P.pct);
	jl_bool(&j, "mps_enabled", P.di.mps_enabled);
	jl_bool(&j, "child_mps_enabled", c ? c->mps_enabled : -1);
	jl_str(&j, "device", P.di.name[0] ? P.di.name : NULL);
	jl_int(&j, "driver_version", P.driver_version);
	jl_int(&j, "runtime_version", P.runtime_version);
	jl_count(&j, "sm_count", P.di.sm_count);
	jl_count(&j, "child_sm_count", c ? c->sm_count : -1);
	jl_count(&j, "exec_affinity_sm", P.di.exec_sm);
	jl_count(&j, "child_exec_affinity_sm", c ? c->exec_sm : -1);
	jl_bool(&j, "vmm_supported", P.di.vmm);
	jl_bool(&j, "posix_fd_supported", P.di.posix_fd);
	jl_count(&j, "granularity", P.gran ? (long long)P.gran : -1);
	jl_count(&j, "size", P.size ? (long long)P.size : -1);
	jl_hex(&j, "hint", P.ptr);
	jl_hex(&j, "got", c ? c->got : 0);
	jl_hex(&j, "cudamalloc_ptr", P.cudamalloc_ptr);
	jl_hex(&j, "arena_hint", P.o->arena_hint);
	jl_int(&j, "arena_size", (long long)(P.o->arena_gb << 30));
	jl_hex(&j, "arena_got", P.arena);
	jl_hex(&j, "child_arena_got", c ? c->arena_got : 0);
	jl_bool(&j, "arena_hint_overlaps_maps", P.arena_overlap);
	jl_bool(&j, "child_arena_hint_overlaps_maps", c ? c->arena_overlap : -1);
	jl_str(&j, "arena_error", P.FA.call[0] ? P.FA.msg : NULL);
	jl_str(&j, "child_arena_error", c && c->arena_error[0] ? c->arena_error : NULL);
	jl_str(&j, "child_stage", c ? c->stage : NULL);
	jl_count(&j, "child_kernels", c ? c->kernels_done : -1);
	jl_str(&j, "second_kernel_via", !c || c->kernels_done < 2 ? NULL
					: c->arena_mapped ? "arena" : "hint range");
	jl_count(&j, "mismatches", P.verified ? P.mismatches : -1);
	jl_count(&j, "first_bad_index", P.first_bad);
	jl_num(&j, "ctx_ms", P.di.ctx_ms > 0 ? P.di.ctx_ms : NAN);
	jl_num(&j, "child_ctx_ms", c ? c->ctx_ms : NAN);
	jl_str(&j, "fd_passing", "SCM_RIGHTS");
	jl_str(&j, "child_status", P.child_status[0] ? P.child_status : NULL);
	jl_str(&j, "error", absent_rc ? absent_why : P.F.call[0] ? P.F.msg : NULL);
	jl_str(&j, "error_call", absent_rc ? NULL : P.F.call[0] ? P.F.call : NULL);
	jl_str(&j, "child_error", c && c->error[0] ? c->error : NULL);
	jl_str(&j, "cleanup_errors", P.FC.call[0] ? P.FC.msg : NULL);
	jl_print(&j);

	if (absent_rc)
		return absent_rc;
	rc = P.F.call[0] || (c && c->error[0]) || !verdict ? 1 : 0;
	return rc;
}

/* The child's environment: ours, with its own SM percentage if asked. */
/* Our environment, with the child's own percentage and, when given, its
 * own MPS pipe directory (a parent outside MPS, a child inside: an app and
 * a pool worker). */
static char **child_env(int pct, char *buf, size_t n, const char *pipe, char *pbuf, size_t pn)
{
	extern char **environ;
	size_t k = 0, cnt = 0;
	char **env;

	while (environ[cnt])
		cnt++;
	env = (char **)calloc(cnt + 3, sizeof(char *));
	if (!env)
		return NULL;
	for (size_t i = 0; i < cnt; i++) {
		if (pct > 0 && !strncmp(environ[i], PCT_ENV "=", sizeof(PCT_ENV)))
			continue;
		if (pipe && !strncmp(environ[i], PIPE_ENV "=", sizeof(PIPE_ENV)))
			continue;
		env[k++] = environ[i];
	}
	if (pct > 0) {
		snprintf(buf, n, "%s=%d", PCT_ENV, pct);
		env[k++] = buf;
	}
	if (pipe) {
		snprintf(pbuf, pn, "%s=%s", PIPE_ENV, pipe);
		env[k++] = pbuf;
	}
	env[k] = NULL;
	return env;
}

static int run_parent(const struct opts *o)
{
	struct drv Dv, *D = &Dv;
	struct fail *F = &P.F;
	CUmemAllocationProp prop;
	CUmemGenericAllocationHandle h = 0;
	int have_h = 0, have_ptr = 0, mapped = 0, fd = -1, sv[2] = { -1, -1 }, r, st = 0;
	int reaped = 0;
	pid_t pid = -1;
	struct vmm_msg msg;
	char why[256], pctbuf[64], fdarg[16], hintarg[32], gbarg[32], toarg[16], pipebuf[4200];
	char **env = NULL;
	uint32_t *host = NULL, *alias = NULL;
	void *probe = NULL;
	int rc;

	P.o = o;
	P.pct = getenv(PCT_ENV);
	P.first_bad = -1;
	P.arena_ok = P.arena_overlap = -1;
	if (o->child_pct > 0)
		snprintf(P.child_pct, sizeof(P.child_pct), "%d", o->child_pct);
	P.di.mps_enabled = P.di.sm_count = P.di.exec_sm = P.di.vmm = P.di.posix_fd = -1;

	cudaDriverGetVersion(&P.driver_version);     /* 0 without a driver: reported */
	cudaRuntimeGetVersion(&P.runtime_version);
	rc = gpu_absent(why, sizeof(why));
	if (rc)
		return report(rc, why);
	if (drv_load(D, F) || open_device(D, F, &P.di))
		goto out;

	/* the arena first, before anything of ours can take the range */
	arena_reserve(D, &P.FA, o->arena_hint, o->arena_gb << 30, &P.arena, &P.arena_ok,
		      &P.arena_overlap);
	/* where plain cudaMalloc memory lands, for choosing arena hints */
	if (RCK(cudaMalloc(&probe, 2 << 20)))
		goto out;
	P.cudamalloc_ptr = (CUdeviceptr)probe;
	if (RCK(cudaFree(probe)))
		goto out;

	alloc_prop(&prop, P.di.dev);
	if (DCK(MemGetAllocationGranularity, &P.gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM))
		goto out;
	P.n = (uint32_t)((size_t)o->mb * (1u << 20) / 4);
	P.size = ((size_t)P.n * 4 + P.gran - 1) / P.gran * P.gran;
	if (DCK(MemCreate, &h, P.size, &prop, 0))
		goto out;
	have_h = 1;
	if (DCK(MemAddressReserve, &P.ptr, P.size, P.gran, 0, 0))
		goto out;
	have_ptr = 1;
	if (DCK(MemMap, P.ptr, P.size, 0, h, 0))
		goto out;
	mapped = 1;
	if (set_rw(D, F, P.ptr, P.size, P.di.dev))
		goto out;
	if (P.arena_ok == 1 && ARENA_OFF + P.size <= (o->arena_gb << 30)) {
		/* the same memory a second time, inside the arena */
		if (DCK(MemMap, P.arena + ARENA_OFF, P.size, 0, h, 0))
			goto out;
		P.arena_mapped = 1;
		if (set_rw(D, F, P.arena + ARENA_OFF, P.size, P.di.dev))
			goto out;
	}
	vmm_fill<<<nblocks(P.n), 256>>>((uint32_t *)P.ptr, P.n);
	if (RCK(cudaGetLastError()) || RCK(cudaDeviceSynchronize()))
		goto out;
	if (DCK(MemExportToShareableHandle, &fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0))
		goto out;
	/* the child must get it by SCM_RIGHTS, never by inheritance */
	if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
		fail_note(F, "fcntl", errno, strerror(errno));
		goto out;
	}

	if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) < 0) {
		fail_note(F, "socketpair", errno, strerror(errno));
		goto out;
	}
	if (fcntl(sv[0], F_SETFD, FD_CLOEXEC) < 0) {
		fail_note(F, "fcntl", errno, strerror(errno));
		goto out;
	}
	env = child_env(o->child_pct, pctbuf, sizeof(pctbuf), o->child_pipe, pipebuf,
			sizeof(pipebuf));
	if (!env) {
		fail_note(F, "calloc", ENOMEM, "no memory for the child's environment");
		goto out;
	}
	snprintf(fdarg, sizeof(fdarg), "%d", sv[1]);
	snprintf(hintarg, sizeof(hintarg), "0x%llx", o->arena_hint);
	snprintf(gbarg, sizeof(gbarg), "%llu", o->arena_gb);
	snprintf(toarg, sizeof(toarg), "%d", o->timeout_s);
	fflush(stdout);
	fflush(stderr);
	/* exec at once: a forked CUDA process must not touch CUDA */
	pid = fork();
	if (pid < 0) {
		fail_note(F, "fork", errno, strerror(errno));
		goto out;
	}
	if (pid == 0) {
		char *argv[] = { (char *)"gpu-vmm_probe", (char *)"--child", fdarg,
				 (char *)"--arena-hint", hintarg, (char *)"--arena-gb", gbarg,
				 (char *)"--timeout-s", toarg, NULL };
		static const char msg_fail[] = "vmm_probe: execve /proc/self/exe failed\n";

		execve("/proc/self/exe", argv, env);
		if (write(2, msg_fail, sizeof(msg_fail) - 1) < 0)
			_exit(127);
		_exit(127);
	}
	close(sv[1]);
	sv[1] = -1;

	memset(&msg, 0, sizeof(msg));
	msg.magic = MAGIC;
	msg.n = P.n;
	msg.ptr = P.ptr;
	msg.size = P.size;
	msg.gran = P.gran;
	msg.arena_off = ARENA_OFF;
	msg.parent_arena_ok = P.arena_mapped;     /* 1: at arena + ARENA_OFF here */
	msg.reps = o->reps;
	if (send_msg(sv[0], &msg, sizeof(msg), fd)) {
		fail_note(F, "sendmsg", errno, strerror(errno));
		goto out;
	}
	/* reports until the final one; keep the last that came */
	do {
		struct vmm_reply m;

		r = recv_msg(sv[0], &m, sizeof(m), NULL, (o->timeout_s + 30) * 1000);
		if (r == 0 && m.magic != MAGIC)
			r = -3;
		if (r == 0) {
			P.rep = m;
			P.have_reply = 1;
		}
	} while (r == 0 && !P.rep.final);
	if (r) {
		char what[160];

		snprintf(what, sizeof(what), "%s after stage \"%s\"", recv_why(r),
			 P.have_reply ? P.rep.stage : "none");
		fail_note(F, "child report", r, what);
		/* what it reported before is still checked and reported */
	}

	/* the child's kernels ran and synchronised before it replied */
	if (P.rep.kernels_done >= 1) {
		size_t bytes = (size_t)P.n * 4;
		uint32_t add = P.rep.kernels_done >= 2 ? 8u : 1u;

		host = (uint32_t *)malloc(bytes);
		if (!host) {
			fail_note(F, "malloc", ENOMEM, "no memory for the check");
			goto out;
		}
		/* cudaMemcpyDefault: unified addressing tells where the range
		 * lives (device memory here; host memory under the tests'
		 * pretend driver on simgpu) */
		if (RCK(cudaMemcpy(host, (void *)P.ptr, bytes, cudaMemcpyDefault)))
			goto out;
		for (uint32_t i = 0; i < P.n; i++)
			if (host[i] != pattern(i) * 3u + add) {
				if (P.first_bad < 0)
					P.first_bad = i;
				P.mismatches++;
			}
		P.verified = 1;
		P.data_ok = P.mismatches == 0;
		if (P.arena_mapped) {
			alias = (uint32_t *)malloc(bytes);
			if (!alias) {
				fail_note(F, "malloc", ENOMEM, "no memory for the check");
				goto out;
			}
			if (RCK(cudaMemcpy(alias, (void *)(P.arena + ARENA_OFF), bytes,
					   cudaMemcpyDefault)))
				goto out;
			P.alias_ok = memcmp(host, alias, bytes) == 0;
		}
	}
out:
	/* closing our end tells a child still waiting for the message to stop */
	for (int i = 0; i < 2; i++)
		if (sv[i] >= 0)
			close(sv[i]);
	if (pid > 0) {
		/* the child exits right after its reply; a stuck one is killed */
		for (int i = 0; i < 200; i++) {
			pid_t w = waitpid(pid, &st, WNOHANG);

			if (w == pid) {
				reaped = 1;
				break;
			}
			if (w < 0 && errno != EINTR)
				break;
			usleep(50000);
		}
		if (!reaped) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
		}
		describe_status(st);
		if (!reaped)
			strncat(P.child_status, " (killed after 10 s)",
				sizeof(P.child_status) - strlen(P.child_status) - 1);
	}
	F = &P.FC;      /* from here on, failures are clean-up failures */
	if (P.arena_mapped)
		DCK(MemUnmap, P.arena + ARENA_OFF, P.size);
	if (mapped)
		DCK(MemUnmap, P.ptr, P.size);
	if (have_ptr)
		DCK(MemAddressFree, P.ptr, P.size);
	if (have_h)
		DCK(MemRelease, h);
	if (P.arena_ok == 1)
		DCK(MemAddressFree, P.arena, o->arena_gb << 30);
	if (fd >= 0)
		close(fd);
	free(env);
	free(host);
	free(alias);
	return report(0, NULL);
}

static void usage(void)
{
	fprintf(stderr, "usage: gpu-vmm_probe [--child-pct Q] [--child-mps-pipe DIR] [--mb M] [--reps R] "
			"[--arena-hint ADDR] [--arena-gb G] [--timeout-s T]\n"
			"  one JSON line on stdout; exit 0 verdict, 1 a call failed, "
			"2 no device (or simgpu)\n");
}


int main(int argc, char **argv)
{
	struct opts o;
	unsigned long long v;

	memset(&o, 0, sizeof(o));
	o.child_fd = -1;
	o.mb = 64;
	o.reps = 20;
	o.arena_hint = DEFAULT_ARENA_HINT;
	o.arena_gb = DEFAULT_ARENA_GB;
	o.timeout_s = 60;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		int bad = 0;

		if (!strcmp(a, "--child"))
			bad = arg_ull(argc, argv, &i, 0, 1 << 20, &v), o.child_fd = (int)v;
		else if (!strcmp(a, "--child-pct"))
			bad = arg_ull(argc, argv, &i, 1, 100, &v), o.child_pct = (int)v;
		else if (!strcmp(a, "--child-mps-pipe") && i + 1 < argc && strlen(argv[i + 1]) < 4096)
			o.child_pipe = argv[++i];
		else if (!strcmp(a, "--mb"))
			bad = arg_ull(argc, argv, &i, 1, 4095, &v), o.mb = (long)v;
		else if (!strcmp(a, "--reps"))
			bad = arg_ull(argc, argv, &i, 0, MAX_REPS, &v), o.reps = (int)v;
		else if (!strcmp(a, "--arena-hint"))
			bad = arg_ull(argc, argv, &i, 1ULL << 30, (1ULL << 47) - 1, &v),
			o.arena_hint = v;
		else if (!strcmp(a, "--arena-gb"))
			bad = arg_ull(argc, argv, &i, 2, 4096, &v), o.arena_gb = v;
		else if (!strcmp(a, "--timeout-s"))
			bad = arg_ull(argc, argv, &i, 1, 3600, &v), o.timeout_s = (int)v;
		else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage();
			return 0;
		} else
			bad = 1;
		if (bad) {
			struct jl j;
			char why[160];

			snprintf(why, sizeof(why), "bad argument %s", a);
			fprintf(stderr, "%s: %s\n", NAME, why);
			usage();
			jl_begin(&j);
			jl_str(&j, "probe", "vmm");
			jl_str(&j, "error", why);
			jl_print(&j);
			return 1;
		}
	}
	signal(SIGPIPE, SIG_IGN);
	if (o.child_fd >= 0)
		return run_child(&o);
	return run_parent(&o);
}
