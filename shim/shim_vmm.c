/*
 * shim_vmm.c - app device memory shared with pool workers at the same
 * address (COLOCATE_MEM=vmm; see shim_vmm.h for why it is opt-in).
 *
 * A forwarded kernel dereferences the app's device pointers inside a
 * worker process.  Legacy IPC handles map elsewhere, so the shim allocates
 * with the driver's VMM calls instead, taken from the runtime with
 * cudaGetDriverEntryPointByVersion (simgpu emulates them):
 *
 *   start    claim slot S of the colocate region (fwd_proto.h: 256 slots of
 *            64 GiB at FWD_MEM_BASE): the control-block slot index when
 *            registered, else pid hash (logged: two unregistered apps may
 *            collide, and a worker then refuses the second's overlapping MAPs: it
 *            is not forwarded there).
 *            Reserve the slot's span with its address as the hint and
 *            check ptr == hint; if not, say why and stay native.
 *   malloc   cuMemCreate (POSIX fd handle, size rounded to granularity),
 *            cuMemMap at the first free offset of the span (first fit over
 *            a sorted table), cuMemSetAccess; then MAP to every open worker
 *            connection, synchronously, before returning.
 *   free     UNMAP to every connection (the caller fenced forwarded work),
 *            cuMemUnmap, cuMemRelease.
 *   attach   after a HELLO with FWD_HF_VMM: connect to the worker's mem
 *            socket and MAP every live allocation (fd by SCM_RIGHTS).
 *
 * Any failure of the VMM path falls back to the real allocator for that
 * allocation; the app is then "not all shared" and is not forwarded (when
 * in doubt, run natively), as is an app that uses an allocator we do not
 * convert (cudaMallocManaged, cudaMallocAsync).  cuMemAlloc_v2 from outside
 * the runtime hooks (a static cudart, cuBLAS/cuDNN in it) is converted
 * (hook_drv.c); a static runtime's entry points come from libcuda.
 *
 * Frees: anything inside the span goes to shim_vmm_free (cudaFree,
 * cudaFreeAsync, cuMemFree_v2); an address that is not the start of a
 * live allocation is cudaErrorInvalidValue and never reaches the real free.
 * A MAP or UNMAP not acked voids that connection and bumps shim_vmm_voids,
 * which forwarding checks at every launch (it leaves the worker).  A forked
 * child turns vmm off (shim_vmm_forget).
 *
 * One mutex covers the table and the connections; it is never held while
 * taking the forwarding lock (the forwarding code calls in here holding
 * its own), so there is no lock-order cycle.
 */
#define _GNU_SOURCE
#include "shim_vmm.h"
#include "shim.h"
#include "fwd_proto.h"
#include "vmm_drv.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_CONNS 8                 /* the route's + kept ones (FWD_KEEP) */

struct valloc {
	uint64_t off, size;             /* in the span; size rounded        */
	CUmemGenericAllocationHandle h;
};

struct vconn {
	int fd;                         /* -1: free                          */
	int ok;
	uint32_t worker;
};

static struct {
	__typeof__(&cuMemGetAllocationGranularity) gran;
	__typeof__(&cuMemCreate) create;
	__typeof__(&cuMemRelease) release;
	__typeof__(&cuMemAddressReserve) reserve;
	__typeof__(&cuMemAddressFree) addr_free;
	__typeof__(&cuMemMap) map;
	__typeof__(&cuMemUnmap) unmap;
	__typeof__(&cuMemSetAccess) access;
	__typeof__(&cuMemExportToShareableHandle) export_;
} D;

static pthread_mutex_t vm_mu = PTHREAD_MUTEX_INITIALIZER;
/* 0 not set up, 1 on, -1 off: stored once (release), after base and
 * granularity, so that a lock-free reader that sees 1 sees them too; a
 * reader that sees 0 takes vm_mu and so waits for a set-up in progress */
static int state;
static uint64_t base, granularity;
static struct valloc *tab;
static size_t ntab, captab;
static struct vconn conns[MAX_CONNS] = { [0 ... MAX_CONNS - 1] = { -1, 0, 0 } };
static char unshared[160];          /* why not all shared ...           */
uint64_t shim_vmm_voids;            /* connections voided so far (atomic) */
static int unshared_set;            /* ... once this is 1 (release)      */

/* ---------------------------------------------------------------- set-up */

static int want_vmm(void)
{
	const char *m = getenv("COLOCATE_MEM");

	if (!m || !*m || !strcmp(m, "native"))
		return 0;
	if (!strcmp(m, "vmm"))
		return 1;
	shim_log("COLOCATE_MEM=%s is neither native nor vmm: native", m);
	return 0;
}

static int load_driver(char *why, size_t whylen)
{
	static const struct vmm_sym syms[] = {
#define S(n, f) { #n, offsetof(__typeof__(D), f) }
		S(cuMemGetAllocationGranularity, gran), S(cuMemCreate, create),
		S(cuMemRelease, release), S(cuMemAddressReserve, reserve),
		S(cuMemAddressFree, addr_free), S(cuMemMap, map), S(cuMemUnmap, unmap),
		S(cuMemSetAccess, access), S(cuMemExportToShareableHandle, export_),
#undef S
	};
	/* not shim_real_rt: a static runtime having none is no error here */
	static const char *const rt[] = { "libcudart.so.13", "libcudart.so", NULL };
	vmm_entry_fn get = (vmm_entry_fn)shim_real_in(rt, "libcudart", ".so.13",
						      "cudaGetDriverEntryPointByVersion");
	size_t i;
	int r;

	if (!get) {
		/* a statically linked runtime: libcuda exports these names
		 * unversioned */
		for (i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
			void *fn = shim_real_drv(syms[i].name);

			if (!fn) {
				snprintf(why, whylen, "neither the runtime's "
					 "cudaGetDriverEntryPointByVersion nor the driver's %s",
					 syms[i].name);
				return -1;
			}
			memcpy((char *)&D + syms[i].off, &fn, sizeof(fn));
		}
		return 0;
	}
	shim_in_runtime++;
	r = vmm_entry_points(get, syms, sizeof(syms) / sizeof(syms[0]), &D, why, whylen);
	shim_in_runtime--;
	return r;
}

static int cur_device(void)
{
	static __typeof__(&cudaGetDevice) get;
	static int looked;              /* once: a static runtime has none */
	int d = 0;

	if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
		static const char *const rt[] = { "libcudart.so.13", "libcudart.so", NULL };

		get = (__typeof__(get))shim_real_in(rt, "libcudart", ".so.13", "cudaGetDevice");
		__atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
	}
	if (get) {
		shim_in_runtime++;
		if (get(&d) != cudaSuccess)
			d = 0;
		shim_in_runtime--;
	}
	return d;
}

/* The state to publish: 1 with base and granularity set, or -1.  vm_mu
 * held; `state` is not touched here (see its comment). */
/*
 * The runtime's context, before the first VMM call: set-up usually runs at
 * the app's first cudaMalloc, before anything made one, and the VMM calls
 * are driver calls (the driver's VMM sample makes a context first too).
 * cudaFree(NULL) is how the runtime is asked for it; a statically linked
 * runtime has none to ask, and its own context already exists by the time
 * it allocates.
 */
static void primary_context(void)
{
	static const char *const rt[] = { "libcudart.so.13", "libcudart.so", NULL };
	__typeof__(&cudaFree) fr = (__typeof__(fr))shim_real_in(rt, "libcudart", ".so.13",
								"cudaFree");

	if (!fr)
		return;
	shim_in_runtime++;
	if (fr(NULL) != cudaSuccess)
		shim_log("COLOCATE_MEM=vmm: cudaFree(NULL) could not make the context; the VMM "
			 "calls will say what is wrong");
	shim_in_runtime--;
}

static int setup(void)
{
	CUmemAllocationProp prop;
	CUdeviceptr got = 0;
	char why[200];
	int slot = shim_ctl_slot();
	uint64_t hint;
	size_t g = 0;
	CUresult r;

	if (!want_vmm())
		return -1;
	if (load_driver(why, sizeof(why)) < 0) {
		shim_log("COLOCATE_MEM=vmm: %s; device memory stays native", why);
		return -1;
	}
	primary_context();
	vmm_alloc_prop(&prop, cur_device());
	r = D.gran(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
	if (r != CUDA_SUCCESS || !g || g % FWD_MEM_ALIGN || FWD_MEM_SLOT_SPAN % g) {
		shim_log("COLOCATE_MEM=vmm: allocation granularity %zu (CUresult %d) does not fit "
			 "the colocate region; device memory stays native", g, (int)r);
		return -1;
	}
	if (slot < 0 || (uint32_t)slot >= FWD_MEM_SLOTS) {
		slot = (int)(((uint32_t)getpid() * 2654435761u) % FWD_MEM_SLOTS);
		shim_log("COLOCATE_MEM=vmm: not registered with a controller: memory slot %d by "
			 "pid hash (another app may share it; a worker then refuses the overlap)", slot);
	}
	hint = FWD_MEM_BASE + (uint64_t)slot * FWD_MEM_SLOT_SPAN;
	r = D.reserve(&got, FWD_MEM_SLOT_SPAN, g, hint, 0);
	if (r != CUDA_SUCCESS) {
		shim_log("COLOCATE_MEM=vmm: cannot reserve slot %d at 0x%llx (CUresult %d); device "
			 "memory stays native", slot, (unsigned long long)hint, (int)r);
		return -1;
	}
	if (got != hint) {
		/* the address is only a hint: someone holds that range here */
		shim_log("COLOCATE_MEM=vmm: slot %d reserved at 0x%llx, not at its address 0x%llx "
			 "(range in use in this process); device memory stays native", slot,
			 (unsigned long long)got, (unsigned long long)hint);
		D.addr_free(got, FWD_MEM_SLOT_SPAN);
		return -1;
	}
	base = hint;
	granularity = g;
	shim_log("COLOCATE_MEM=vmm: device memory shared from slot %d at 0x%llx", slot,
		 (unsigned long long)base);
	return 1;
}

int shim_vmm_on(void)
{
	int s = __atomic_load_n(&state, __ATOMIC_ACQUIRE);

	if (__builtin_expect(s != 0, 1))
		return s > 0;
	pthread_mutex_lock(&vm_mu);
	s = state;
	if (!s) {
		s = setup();
		__atomic_store_n(&state, s, __ATOMIC_RELEASE);
	}
	pthread_mutex_unlock(&vm_mu);
	return s > 0;
}

int shim_vmm_in_span(const void *p)
{
	uint64_t a = (uint64_t)(uintptr_t)p;

	/* base is set before state is published (release) */
	return __atomic_load_n(&state, __ATOMIC_ACQUIRE) > 0 && a >= base &&
	       a - base < FWD_MEM_SLOT_SPAN;
}

/* ---------------------------------------------------------------- messages */

static int send_msg(int fd, const struct fwd_mem_msg *m, int pass_fd)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { (void *)m, sizeof(*m) };
	struct msghdr mh = { 0 };
	ssize_t n;

	mh.msg_iov = &iov;
	mh.msg_iovlen = 1;
	if (pass_fd >= 0) {
		struct cmsghdr *c;

		memset(cbuf, 0, sizeof(cbuf));
		mh.msg_control = cbuf;
		mh.msg_controllen = sizeof(cbuf);
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
	}
	do
		n = sendmsg(fd, &mh, MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n == (ssize_t)sizeof(*m))
		return 0;
	if (n >= 0)
		errno = EPROTO;      /* a stream socket took part: give up on it */
	return -1;
}

static int recv_ack(int fd, struct fwd_mem_msg *a)
{
	size_t got = 0;

	while (got < sizeof(*a)) {
		ssize_t n = recv(fd, (char *)a + got, sizeof(*a) - got, 0);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			if (n == 0)
				errno = ECONNRESET;
			return -1;
		}
		got += (size_t)n;
	}
	if (a->magic != FWD_MEM_MAGIC || a->version != FWD_MEM_VERSION || a->len != sizeof(*a) ||
	    a->op != FWD_MEM_ACK) {
		errno = EPROTO;
		return -1;
	}
	return 0;
}

/* One request, one ACK: 0 (and the worker's address), or -1 with why. */
static int request(int fd, int op, const struct valloc *v, uint64_t *waddr, char *why,
		   size_t whylen)
{
	struct fwd_mem_msg m, a;
	int efd = -1, rc;

	memset(&m, 0, sizeof(m));
	m.magic = FWD_MEM_MAGIC;
	m.version = FWD_MEM_VERSION;
	m.op = (uint16_t)op;
	m.len = sizeof(m);
	m.pid = (uint32_t)getpid();
	m.addr = base + v->off;
	m.size = v->size;
	if (op == FWD_MEM_MAP) {
		CUresult r = D.export_(&efd, v->h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);

		if (r != CUDA_SUCCESS) {
			snprintf(why, whylen, "cuMemExportToShareableHandle: CUresult %d", (int)r);
			return -1;
		}
	}
	rc = send_msg(fd, &m, efd);
	if (efd >= 0)
		close(efd);           /* the worker has its own copy now */
	if (rc < 0 || recv_ack(fd, &a) < 0) {
		snprintf(why, whylen, "mem socket: %s", strerror(errno));
		return -1;
	}
	if (a.status != FWD_MEM_S_OK || a.addr != m.addr) {
		snprintf(why, whylen, "worker refused %s of 0x%llx (status %u; see its log)",
			 op == FWD_MEM_MAP ? "MAP" : "UNMAP", (unsigned long long)m.addr, a.status);
		return -1;
	}
	if (waddr)
		*waddr = a.waddr;
	return 0;
}

/* To every open connection; a connection that fails is void.  vm_mu held. */
static void broadcast(int op, const struct valloc *v)
{
	char why[200];
	int i;

	for (i = 0; i < MAX_CONNS; i++) {
		if (conns[i].fd < 0 || !conns[i].ok)
			continue;
		if (request(conns[i].fd, op, v, NULL, why, sizeof(why)) < 0) {
			conns[i].ok = 0;
			/* before the caller returns: the app's next launch (it
			 * may use this memory) sees it and leaves that worker */
			__atomic_fetch_add(&shim_vmm_voids, 1, __ATOMIC_RELEASE);
			shim_log("worker %u: %s; its connection is void (launches replay locally)",
				 conns[i].worker, why);
		}
	}
}

/* ---------------------------------------------------------------- allocations */

/* First free offset for n bytes (tab sorted by offset); vm_mu held. */
static int place(uint64_t n, uint64_t *off, size_t *at)
{
	uint64_t o = 0;
	size_t i;

	for (i = 0; i < ntab; i++) {
		if (tab[i].off - o >= n)
			break;
		o = tab[i].off + tab[i].size;
	}
	if (o + n > FWD_MEM_SLOT_SPAN || o + n < o)
		return -1;
	*off = o;
	*at = i;
	return 0;
}

static long find(const void *p)
{
	uint64_t a = (uint64_t)(uintptr_t)p;
	size_t lo = 0, hi = ntab;

	if (a < base || a >= base + FWD_MEM_SLOT_SPAN)
		return -1;
	a -= base;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (tab[mid].off < a)
			lo = mid + 1;
		else if (tab[mid].off > a)
			hi = mid;
		else
			return (long)mid;
	}
	return -1;
}

int shim_vmm_malloc(void **p, size_t n)
{
	CUmemAllocationProp prop;
	CUmemAccessDesc acc;
	struct valloc v;
	size_t at;
	CUresult r;
	int dev = cur_device();

	if (!shim_vmm_on() || !p)
		return -1;
	if (n == 0 || n > FWD_MEM_SLOT_SPAN)
		return -1;
	pthread_mutex_lock(&vm_mu);
	if (!captab || ntab == captab) {
		size_t nc = captab ? captab * 2 : 64;
		struct valloc *nt = realloc(tab, nc * sizeof(*nt));

		if (!nt)
			goto fail;
		tab = nt;
		captab = nc;
	}
	memset(&v, 0, sizeof(v));
	v.size = (n + granularity - 1) / granularity * granularity;
	if (place(v.size, &v.off, &at) < 0) {
		shim_log("COLOCATE_MEM=vmm: the 64 GiB slot is full; a native allocation");
		goto fail;
	}
	vmm_alloc_prop(&prop, dev);
	r = D.create(&v.h, v.size, &prop, 0);
	if (r != CUDA_SUCCESS) {
		shim_log("COLOCATE_MEM=vmm: cuMemCreate(%llu): CUresult %d; a native allocation",
			 (unsigned long long)v.size, (int)r);
		goto fail;
	}
	r = D.map(base + v.off, v.size, 0, v.h, 0);
	if (r != CUDA_SUCCESS) {
		shim_log("COLOCATE_MEM=vmm: cuMemMap: CUresult %d; a native allocation", (int)r);
		D.release(v.h);
		goto fail;
	}
	vmm_rw_access(&acc, dev);
	r = D.access(base + v.off, v.size, &acc, 1);
	if (r != CUDA_SUCCESS) {
		shim_log("COLOCATE_MEM=vmm: cuMemSetAccess: CUresult %d; a native allocation", (int)r);
		D.unmap(base + v.off, v.size);
		D.release(v.h);
		goto fail;
	}
	memmove(&tab[at + 1], &tab[at], (ntab - at) * sizeof(*tab));
	tab[at] = v;
	ntab++;
	broadcast(FWD_MEM_MAP, &v);
	pthread_mutex_unlock(&vm_mu);
	*p = (void *)(uintptr_t)(base + v.off);
	return 0;
fail:
	pthread_mutex_unlock(&vm_mu);
	return -1;
}

int shim_vmm_owns(const void *p)
{
	long i;

	if (__atomic_load_n(&state, __ATOMIC_ACQUIRE) <= 0)
		return 0;
	pthread_mutex_lock(&vm_mu);
	i = find(p);
	pthread_mutex_unlock(&vm_mu);
	return i >= 0;
}

/* cudaFree synchronises the device; a local kernel still queued must not
 * find the memory unmapped under it (forwarded work: the caller fenced). */
static void device_sync(void)
{
	static const char *const rt[] = { "libcudart.so.13", "libcudart.so", NULL };
	static __typeof__(&cudaDeviceSynchronize) sync_;
	static __typeof__(&cuCtxSynchronize) dsync;   /* a static runtime */
	static int looked;

	if (!__atomic_load_n(&looked, __ATOMIC_ACQUIRE)) {
		sync_ = (__typeof__(sync_))shim_real_in(rt, "libcudart", ".so.13",
							"cudaDeviceSynchronize");
		if (!sync_)
			dsync = (__typeof__(dsync))shim_real_drv("cuCtxSynchronize");
		__atomic_store_n(&looked, 1, __ATOMIC_RELEASE);
	}
	shim_in_runtime++;
	if (sync_)
		sync_();
	else if (dsync)
		dsync();
	shim_in_runtime--;
}

int shim_vmm_free(void *p)
{
	struct valloc v;
	CUresult r;
	long i;

	device_sync();
	pthread_mutex_lock(&vm_mu);
	i = find(p);
	if (i < 0) {
		pthread_mutex_unlock(&vm_mu);
		return cudaErrorInvalidValue;
	}
	v = tab[i];
	memmove(&tab[i], &tab[i + 1], (ntab - (size_t)i - 1) * sizeof(*tab));
	ntab--;
	/* workers first: nothing of theirs may point at it once it is gone */
	broadcast(FWD_MEM_UNMAP, &v);
	r = D.unmap(base + v.off, v.size);
	if (r == CUDA_SUCCESS)
		r = D.release(v.h);
	pthread_mutex_unlock(&vm_mu);
	if (r != CUDA_SUCCESS) {
		shim_log("COLOCATE_MEM=vmm: freeing %p: CUresult %d", p, (int)r);
		return cudaErrorInvalidValue;
	}
	return cudaSuccess;
}

void shim_vmm_note_native(const char *what)
{
	if (!shim_vmm_on())
		return;
	pthread_mutex_lock(&vm_mu);
	if (!unshared_set) {
		snprintf(unshared, sizeof(unshared), "%s made device memory that is not shared "
			 "with workers", what ? what : "a native allocation (fallback or cuMemAlloc)");
		__atomic_store_n(&unshared_set, 1, __ATOMIC_RELEASE);
		shim_log("COLOCATE_MEM=vmm: %s: this app runs natively from now on", unshared);
	}
	pthread_mutex_unlock(&vm_mu);
}

/* Lock-free: forwarding asks at every routed launch.  The text is
 * written once, before the flag. */
const char *shim_vmm_unshared(void)
{
	return __atomic_load_n(&unshared_set, __ATOMIC_ACQUIRE) ? unshared : NULL;
}

/* ---------------------------------------------------------------- connections */

static int mem_connect(uint32_t worker, char *why, size_t whylen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct timeval tv = { 2, 0 };
	int fd;

	if ((size_t)snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/worker-%u.mem.sock",
			     shim_runtime_dir(), worker) >= sizeof(sa.sun_path)) {
		snprintf(why, whylen, "mem socket path too long");
		return -1;
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(why, whylen, "socket: %s", strerror(errno));
		return -1;
	}
	/* a hung worker must not hang the app's cudaMalloc */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		snprintf(why, whylen, "connect %s: %s", sa.sun_path, strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

int shim_vmm_attach(uint32_t worker, char *why, size_t whylen)
{
	char sub[200];
	size_t i;
	int fd, slot;

	if (!shim_vmm_on()) {
		snprintf(why, whylen, "COLOCATE_MEM=vmm is not on");
		return -1;
	}
	fd = mem_connect(worker, why, whylen);
	if (fd < 0)
		return -1;
	pthread_mutex_lock(&vm_mu);
	for (slot = 0; slot < MAX_CONNS && conns[slot].fd >= 0; slot++)
		;
	if (slot == MAX_CONNS) {
		snprintf(why, whylen, "too many worker connections");
		goto fail;
	}
	for (i = 0; i < ntab; i++) {
		if (request(fd, FWD_MEM_MAP, &tab[i], NULL, sub, sizeof(sub)) < 0) {
			snprintf(why, whylen, "%s", sub);
			goto fail;
		}
	}
	conns[slot].fd = fd;
	conns[slot].ok = 1;
	conns[slot].worker = worker;
	pthread_mutex_unlock(&vm_mu);
	return fd;
fail:
	pthread_mutex_unlock(&vm_mu);
	close(fd);
	return -1;
}

void shim_vmm_detach(int fd)
{
	int i;

	if (fd < 0)
		return;
	pthread_mutex_lock(&vm_mu);
	for (i = 0; i < MAX_CONNS; i++)
		if (conns[i].fd == fd)
			conns[i].fd = -1;
	pthread_mutex_unlock(&vm_mu);
	close(fd);      /* the worker unmaps once our launches there are done */
}

int shim_vmm_conn_ok(int fd)
{
	int i, ok = 0;

	pthread_mutex_lock(&vm_mu);
	for (i = 0; i < MAX_CONNS; i++)
		if (conns[i].fd == fd)
			ok = conns[i].ok;
	pthread_mutex_unlock(&vm_mu);
	return ok;
}

/*
 * A forked child: the span, its mappings and the worker connections are the
 * parent's (the child must neither free nor share them), so vmm is off here
 * from now on and the child's allocations are native.  The table goes; the
 * handles in it are the parent's to release.
 */
void shim_vmm_forget(void)
{
	int i, was = __atomic_load_n(&state, __ATOMIC_RELAXED);

	pthread_mutex_init(&vm_mu, NULL);
	for (i = 0; i < MAX_CONNS; i++) {
		if (conns[i].fd >= 0)
			close(conns[i].fd);   /* the parent's stays open */
		conns[i].fd = -1;
		conns[i].ok = 0;
	}
	free(tab);
	tab = NULL;
	ntab = captab = 0;
	__atomic_store_n(&unshared_set, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&state, -1, __ATOMIC_RELEASE);
	if (was > 0)
		shim_log("COLOCATE_MEM=vmm: a forked child does not share the parent's device "
			 "memory with workers; its own allocations are native");
}
