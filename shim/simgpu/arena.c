/*
 * arena.c - device memory: one address space shared by every process of a
 * simulated device.
 *
 * Real GPUs give all processes of a device one unified virtual address
 * space for device memory; forwarding kernels to a worker process, IPC
 * handles and zero-copy sharing all rely on a device pointer meaning the
 * same thing everywhere.  simgpu reproduces that with files:
 *
 *   $SIMGPU_DIR/slots      table of SG_MAX_SLOTS process slots (pid, start
 *                          time, generation, bytes in use), updated under
 *                          flock, read without it
 *   $SIMGPU_DIR/arena-<i>  backing file of slot i's device memory
 *
 * Every process reserves the whole simgpu region [SG_ARENA_BASE,
 * SG_ARENA_END) PROT_NONE at first use.  Slot i owns the SG_SLOT_SPAN bytes
 * at SG_ARENA_BASE + i * SG_SLOT_SPAN; its owner grows arena-<i> with
 * ftruncate and maps it MAP_SHARED|MAP_FIXED over its reservation.  Any
 * other process maps the same file at the same address (simgpu_map_peer,
 * or on demand from the SIGSEGV handler in fault.c), so pointers are
 * valid in every process without translation.
 *
 * Slots of dead processes are reclaimed (and their files removed) when a
 * process claims a slot; a process removes its own file at exit.  A peer
 * that still has a dead process's memory mapped keeps its data readable,
 * as an IPC mapping outlives nothing in CUDA but costs nothing here.
 *
 * The allocator is first-fit over a sorted array of blocks covering
 * [0, top) of the own arena, 256-byte aligned, coalescing on free.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "simgpu_impl.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define SLOTS_MAGIC   0x73696d67736c6f74ULL   /* "simgslot" */
#define SLOTS_VERSION 1
#define GROW_STEP     (64ULL << 20)
#define REGION_LEN    (SG_ARENA_END - SG_ARENA_BASE)

struct slot {
	atomic_int  pid;      /* 0: free */
	atomic_uint gen;      /* bumped at every claim: detects reuse */
	atomic_ullong used;   /* bytes allocated, for cudaMemGetInfo */
	uint64_t    start;    /* owner's start time (clock ticks since boot) */
};

struct slots {
	uint64_t    magic;
	uint32_t    version;
	uint32_t    nslots;
	struct slot s[SG_MAX_SLOTS];
};

struct blk {
	uint64_t off, size;
	int      used, kind;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;  /* all below */
static volatile sig_atomic_t region_ok;  /* region reserved, table open */
static int region_tried;
static struct slots *tab;
static int tab_fd = -1;
static int own = -1;
static int own_fd = -1;
static int own_pid;
static uint64_t own_mapped;
static char dirbuf[512];                 /* for the signal-safe path */
static atomic_ullong peer_size[SG_MAX_SLOTS];
static atomic_uint peer_gen[SG_MAX_SLOTS];

static struct blk *blk;
static size_t nblk, capblk;
static uint64_t top;

static inline char *slot_base(int i)
{
	return (char *)(uintptr_t)(SG_ARENA_BASE + (uint64_t)i * SG_SLOT_SPAN);
}

static inline int slot_of(const void *p)
{
	return (int)(((uintptr_t)p - SG_ARENA_BASE) / SG_SLOT_SPAN);
}

static inline int own_valid(void)
{
	return own >= 0 && own_pid == getpid();
}

/* "<dir>/arena-<i>" without stdio: the fault handler needs it too. */
static void arena_path(char *buf, size_t n, int i)
{
	static const char mid[] = "/arena-";
	char digits[12];
	size_t len = 0, k, nd = 0;

	for (k = 0; dirbuf[k] && len + 1 < n; k++)
		buf[len++] = dirbuf[k];
	for (k = 0; mid[k] && len + 1 < n; k++)
		buf[len++] = mid[k];
	do {
		digits[nd++] = (char)('0' + i % 10);
		i /= 10;
	} while (i && nd < sizeof(digits));
	while (nd && len + 1 < n)
		buf[len++] = digits[--nd];
	buf[len] = 0;
}

/* Start time of a process (field 22 of /proc/pid/stat), 0 if unknown. */
static uint64_t proc_start(int pid)
{
	char path[64], buf[1024], *p;
	unsigned long long v = 0;
	ssize_t n;
	int fd, field;

	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	p = strrchr(buf, ')');
	if (!p)
		return 0;
	/* after ')' comes field 3; walk to field 22 */
	for (field = 2; field < 22 && p; field++) {
		p = strchr(p + 1, ' ');
	}
	if (p && sscanf(p + 1, "%llu", &v) == 1)
		return v;
	return 0;
}

static int pid_alive(int pid, uint64_t start)
{
	uint64_t now;

	if (pid <= 0)
		return 0;
	if (kill(pid, 0) < 0 && errno == ESRCH)
		return 0;
	now = proc_start(pid);
	if (start && now && now != start)
		return 0;    /* the pid was reused by another process */
	return 1;
}

static int open_table(void)
{
	char path[600];
	struct stat st;
	struct slots *t;
	int fd;

	snprintf(path, sizeof(path), "%s/slots", sg_cfg.dir);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) {
		sg_log("cannot open %s: %s", path, strerror(errno));
		return -1;
	}
	if (flock(fd, LOCK_EX) < 0 || fstat(fd, &st) < 0)
		goto fail;
	if ((size_t)st.st_size < sizeof(struct slots) &&
	    ftruncate(fd, sizeof(struct slots)) < 0)
		goto fail;
	t = mmap(NULL, sizeof(struct slots), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (t == MAP_FAILED)
		goto fail;
	if (t->magic != SLOTS_MAGIC || t->version != SLOTS_VERSION ||
	    t->nslots != SG_MAX_SLOTS) {
		memset(t, 0, sizeof(*t));
		t->version = SLOTS_VERSION;
		t->nslots = SG_MAX_SLOTS;
		t->magic = SLOTS_MAGIC;
	}
	flock(fd, LOCK_UN);
	tab = t;
	tab_fd = fd;
	return 0;
fail:
	sg_log("cannot use %s: %s", path, strerror(errno));
	close(fd);
	return -1;
}

/* Another thread may have held mu when the process forked. */
static void after_fork_child(void)
{
	pthread_mutex_init(&mu, NULL);
}

/* Reserve the region and open the slot table; mu held. */
static int region_init_locked(void)
{
	void *want = (void *)(uintptr_t)SG_ARENA_BASE, *p;

	if (region_tried)
		return region_ok ? 0 : -1;
	region_tried = 1;
	snprintf(dirbuf, sizeof(dirbuf), "%s", sg_cfg.dir);
	p = mmap(want, REGION_LEN, PROT_NONE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
	if (p != want) {
		if (p != MAP_FAILED)
			munmap(p, REGION_LEN);
		sg_log("cannot reserve the device region at %p: %s", want, strerror(errno));
		return -1;
	}
	if (open_table() < 0) {
		munmap(want, REGION_LEN);
		return -1;
	}
	region_ok = 1;
	sg_fault_install();
	pthread_atfork(NULL, NULL, after_fork_child);
	return 0;
}

/* Claim a slot for this process and create its arena file; mu held. */
static int claim_locked(void)
{
	char path[600];
	int i, fd, pid = getpid();

	if (own_valid())
		return 0;
	if (own >= 0) {
		/* A forked child: the parent's arena becomes a peer mapping. */
		atomic_store(&peer_size[own], own_mapped);
		atomic_store(&peer_gen[own], atomic_load(&tab->s[own].gen));
		own = -1;
		if (own_fd >= 0)
			close(own_fd);
		own_fd = -1;
		own_mapped = 0;
		nblk = 0;
		top = 0;
	}
	if (region_init_locked() < 0)
		return -1;
	if (flock(tab_fd, LOCK_EX) < 0)
		return -1;
	for (i = 0; i < SG_MAX_SLOTS; i++) {
		struct slot *s = &tab->s[i];
		int p = atomic_load(&s->pid);

		if (p && p != pid && !pid_alive(p, s->start)) {
			arena_path(path, sizeof(path), i);
			unlink(path);
			atomic_store(&s->used, 0);
			atomic_store(&s->pid, 0);
			sg_log("reclaimed slot %d of dead pid %d", i, p);
		}
	}
	for (i = 0; i < SG_MAX_SLOTS; i++)
		if (atomic_load(&tab->s[i].pid) == 0)
			break;
	if (i == SG_MAX_SLOTS) {
		flock(tab_fd, LOCK_UN);
		sg_log("all %d device slots are taken", SG_MAX_SLOTS);
		return -1;
	}
	tab->s[i].start = proc_start(pid);
	atomic_store(&tab->s[i].used, 0);
	atomic_fetch_add(&tab->s[i].gen, 1);
	atomic_store(&tab->s[i].pid, pid);
	flock(tab_fd, LOCK_UN);

	arena_path(path, sizeof(path), i);
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		sg_log("cannot create %s: %s", path, strerror(errno));
		atomic_store(&tab->s[i].pid, 0);
		return -1;
	}
	/* Our own span may hold a stale peer mapping of the slot's last owner. */
	if (atomic_load(&peer_size[i])) {
		mmap(slot_base(i), SG_SLOT_SPAN, PROT_NONE,
		     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
		atomic_store(&peer_size[i], 0);
	}
	own = i;
	own_fd = fd;
	own_pid = pid;
	own_mapped = 0;
	sg_log("device memory slot %d at %p", i, (void *)slot_base(i));
	return 0;
}

/* Map the own arena up to `need` bytes; mu held. */
static int ensure_mapped(uint64_t need)
{
	uint64_t nsz;
	struct statvfs vfs;
	char *want;

	if (need <= own_mapped)
		return 0;
	if (need > SG_SLOT_SPAN)
		return -1;
	nsz = (need + GROW_STEP - 1) / GROW_STEP * GROW_STEP;
	if (nsz > SG_SLOT_SPAN)
		nsz = SG_SLOT_SPAN;
	/* Pages of a sparse file on a full tmpfs raise SIGBUS when touched:
	 * refuse growth the file system cannot hold instead. */
	if (fstatvfs(own_fd, &vfs) == 0 &&
	    (double)vfs.f_bavail * (double)vfs.f_bsize < (double)(need - own_mapped)) {
		sg_log("no room for %llu more bytes in %s", (unsigned long long)(need - own_mapped),
		       sg_cfg.dir);
		return -1;
	}
	if (ftruncate(own_fd, (off_t)nsz) < 0)
		return -1;
	want = slot_base(own) + own_mapped;
	if (mmap(want, nsz - own_mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
		 own_fd, (off_t)own_mapped) != want)
		return -1;
	own_mapped = nsz;
	return 0;
}

static int blk_insert(size_t i, struct blk b)
{
	if (nblk == capblk) {
		size_t nc = capblk ? capblk * 2 : 64;
		struct blk *nb = realloc(blk, nc * sizeof(*nb));

		if (!nb)
			return -1;
		blk = nb;
		capblk = nc;
	}
	memmove(&blk[i + 1], &blk[i], (nblk - i) * sizeof(*blk));
	blk[i] = b;
	nblk++;
	return 0;
}

static void blk_remove(size_t i)
{
	memmove(&blk[i], &blk[i + 1], (nblk - i - 1) * sizeof(*blk));
	nblk--;
}

/* Index of the block containing offset o, or -1. */
static long blk_find(uint64_t o)
{
	size_t lo = 0, hi = nblk;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (blk[mid].off + blk[mid].size <= o)
			lo = mid + 1;
		else if (blk[mid].off > o)
			hi = mid;
		else
			return (long)mid;
	}
	return -1;
}

static uint64_t device_used(void)
{
	uint64_t sum = 0;
	int i;

	for (i = 0; i < SG_MAX_SLOTS; i++)
		if (atomic_load_explicit(&tab->s[i].pid, memory_order_relaxed))
			sum += atomic_load_explicit(&tab->s[i].used, memory_order_relaxed);
	return sum;
}

cudaError_t sg_arena_alloc(size_t n, int kind, void **out)
{
	uint64_t need = ((uint64_t)(n ? n : 1) + SG_ALIGN - 1) / SG_ALIGN * SG_ALIGN;
	cudaError_t rc = cudaErrorMemoryAllocation;
	size_t i;

	if (n > SG_SLOT_SPAN)
		return cudaErrorMemoryAllocation;
	sg_init();     /* before mu: initialisation takes mu itself */
	pthread_mutex_lock(&mu);
	if (claim_locked() < 0)
		goto out;
	if ((double)(device_used() + need) > sg_cfg.mem_bytes)
		goto out;
	for (i = 0; i < nblk; i++) {
		if (blk[i].used || blk[i].size < need)
			continue;
		if (blk[i].size > need) {
			struct blk rest = { blk[i].off + need, blk[i].size - need, 0, 0 };

			if (blk_insert(i + 1, rest) < 0)
				goto out;
			blk[i].size = need;
		}
		goto found;
	}
	/* Nothing fits: extend at the top (the trailing free block, if any). */
	if (nblk && !blk[nblk - 1].used) {
		uint64_t grow = need - blk[nblk - 1].size;

		if (ensure_mapped(top + grow) < 0)
			goto out;
		top += grow;
		blk[nblk - 1].size = need;
		i = nblk - 1;
	} else {
		struct blk b = { top, need, 0, 0 };

		if (ensure_mapped(top + need) < 0 || blk_insert(nblk, b) < 0)
			goto out;
		top += need;
		i = nblk - 1;
	}
found:
	blk[i].used = 1;
	blk[i].kind = kind;
	atomic_fetch_add(&tab->s[own].used, need);
	*out = slot_base(own) + blk[i].off;
	rc = cudaSuccess;
out:
	pthread_mutex_unlock(&mu);
	return rc;
}

/* Give the pages of a large freed block back to the file system. */
static void punch(uint64_t off, uint64_t size)
{
	uint64_t pg = 4096, a = (off + pg - 1) / pg * pg, b = (off + size) / pg * pg;

	if (b > a && b - a >= (1ULL << 20))
		madvise(slot_base(own) + a, b - a, MADV_REMOVE);
}

cudaError_t sg_arena_free(void *p)
{
	uint64_t o;
	long i;

	if (!sg_in_region(p))
		return cudaErrorInvalidValue;
	pthread_mutex_lock(&mu);
	if (!own_valid() || slot_of(p) != own)
		goto bad;
	o = (uint64_t)((char *)p - slot_base(own));
	i = blk_find(o);
	if (i < 0 || !blk[i].used || blk[i].off != o)
		goto bad;
	blk[i].used = 0;
	atomic_fetch_sub(&tab->s[own].used, blk[i].size);
	punch(blk[i].off, blk[i].size);
	if ((size_t)i + 1 < nblk && !blk[i + 1].used) {
		blk[i].size += blk[i + 1].size;
		blk_remove((size_t)i + 1);
	}
	if (i > 0 && !blk[i - 1].used) {
		blk[i - 1].size += blk[i].size;
		blk_remove((size_t)i);
	}
	pthread_mutex_unlock(&mu);
	return cudaSuccess;
bad:
	pthread_mutex_unlock(&mu);
	return cudaErrorInvalidValue;
}

void sg_arena_free_all(void)
{
	pthread_mutex_lock(&mu);
	if (own_valid() && nblk) {
		blk[0].off = 0;
		blk[0].size = top;
		blk[0].used = 0;
		nblk = 1;
		atomic_store(&tab->s[own].used, 0);
		punch(0, top);
	}
	pthread_mutex_unlock(&mu);
}

int sg_arena_find(const void *p, void **base, size_t *size, int *kind)
{
	long i;
	int found = 0;

	if (!sg_in_region(p))
		return 0;
	pthread_mutex_lock(&mu);
	if (own_valid() && slot_of(p) == own) {
		i = blk_find((uint64_t)((const char *)p - slot_base(own)));
		if (i >= 0 && blk[i].used) {
			if (base)
				*base = slot_base(own) + blk[i].off;
			if (size)
				*size = blk[i].size;
			if (kind)
				*kind = blk[i].kind;
			found = 1;
		}
	}
	pthread_mutex_unlock(&mu);
	return found;
}

int sg_dev_range_ok(const void *p, size_t n)
{
	uint64_t off;
	int slot, ok;
	long i;

	if (!sg_in_region(p))
		return sg_vmm_range_ok(p, n);
	if (n > SG_SLOT_SPAN)
		return 0;
	slot = slot_of(p);
	off = (uint64_t)((const char *)p - slot_base(slot));
	if (n == 0)
		n = 1;
	pthread_mutex_lock(&mu);
	if (own_valid() && slot == own) {
		i = blk_find(off);
		ok = i >= 0 && blk[i].used && off + n <= blk[i].off + blk[i].size;
		pthread_mutex_unlock(&mu);
		return ok;
	}
	pthread_mutex_unlock(&mu);
	if (simgpu_map_peer(p) < 0)
		return 0;
	return off + n <= atomic_load(&peer_size[slot]);
}

void sg_arena_mem_info(size_t *free_b, size_t *total_b)
{
	uint64_t used = 0;

	sg_init();
	pthread_mutex_lock(&mu);
	if (region_init_locked() == 0)
		used = device_used();
	pthread_mutex_unlock(&mu);
	*total_b = (size_t)sg_cfg.mem_bytes;
	*free_b = used >= *total_b ? 0 : *total_b - (size_t)used;
}

int sg_arena_own_slot(void)
{
	int s;

	pthread_mutex_lock(&mu);
	s = own_valid() ? own : -1;
	pthread_mutex_unlock(&mu);
	return s;
}

int sg_arena_slot_owner(int slot, int32_t *pid, uint32_t *gen)
{
	if (slot < 0 || slot >= SG_MAX_SLOTS)
		return -1;
	sg_init();
	pthread_mutex_lock(&mu);
	region_init_locked();
	pthread_mutex_unlock(&mu);
	if (!region_ok)
		return -1;
	*pid = atomic_load(&tab->s[slot].pid);
	*gen = atomic_load(&tab->s[slot].gen);
	return 0;
}

/*
 * Map slot `slot`'s arena file over its span.  Only system calls and
 * atomics: the fault handler calls this.  Concurrent callers map the same
 * file at the same place, which is harmless.
 */
static int map_slot(int slot, uint64_t off)
{
	char path[600];
	struct stat st;
	unsigned gen = atomic_load(&tab->s[slot].gen);
	int fd;

	if (!atomic_load(&tab->s[slot].pid))
		/* owner gone: what we mapped before stays valid, nothing more */
		return off < atomic_load(&peer_size[slot]) ? 0 : -1;
	if (gen == atomic_load(&peer_gen[slot]) && off < atomic_load(&peer_size[slot]))
		return 0;
	if (gen != atomic_load(&peer_gen[slot]) && atomic_load(&peer_size[slot])) {
		/* the slot changed hands: drop the last owner's memory */
		mmap(slot_base(slot), SG_SLOT_SPAN, PROT_NONE,
		     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
		atomic_store(&peer_size[slot], 0);
	}
	arena_path(path, sizeof(path), slot);
	fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return -1;
	if (fstat(fd, &st) < 0 || st.st_size <= 0 || (uint64_t)st.st_size > SG_SLOT_SPAN) {
		close(fd);
		return -1;
	}
	if (mmap(slot_base(slot), (size_t)st.st_size, PROT_READ | PROT_WRITE,
		 MAP_SHARED | MAP_FIXED, fd, 0) != slot_base(slot)) {
		close(fd);
		return -1;
	}
	close(fd);
	atomic_store(&peer_gen[slot], gen);
	atomic_store(&peer_size[slot], (uint64_t)st.st_size);
	return off < (uint64_t)st.st_size ? 0 : -1;
}

/*
 * simgpu_map_peer - make the device memory at devptr, owned by another
 * process of this simulated device, addressable in this process at the
 * same address.  Returns 0 when devptr is now mapped (or is our own),
 * -1 when it is not device memory or its owner's arena cannot be mapped.
 */
SG_API int simgpu_map_peer(const void *devptr)
{
	int slot;

	if (!sg_in_region(devptr))
		return -1;
	if (!region_ok) {
		sg_init();
		pthread_mutex_lock(&mu);
		region_init_locked();
		pthread_mutex_unlock(&mu);
		if (!region_ok)
			return -1;
	}
	slot = slot_of(devptr);
	if (own_valid() && slot == own)
		return (uint64_t)((const char *)devptr - slot_base(own)) < own_mapped ? 0 : -1;
	return map_slot(slot, (uint64_t)((const char *)devptr - slot_base(slot)));
}

/* At start-up: with the region reserved, a touch of any peer's memory can
 * be mapped on demand from the fault handler. */
void sg_arena_init(void)
{
	pthread_mutex_lock(&mu);
	region_init_locked();
	pthread_mutex_unlock(&mu);
}

int sg_arena_fault_map(const void *addr)
{
	int slot;

	if (!region_ok || !sg_in_region(addr))
		return -1;
	slot = slot_of(addr);
	if (own >= 0 && own_pid == getpid() && slot == own)
		return -1;    /* our own memory: a real fault */
	return map_slot(slot, (uint64_t)((const char *)addr - slot_base(slot)));
}

__attribute__((destructor)) static void arena_exit(void)
{
	char path[600];

	if (!own_valid())
		return;
	arena_path(path, sizeof(path), own);
	unlink(path);
	if (tab && flock(tab_fd, LOCK_EX) == 0) {
		if (atomic_load(&tab->s[own].pid) == own_pid) {
			atomic_store(&tab->s[own].used, 0);
			atomic_store(&tab->s[own].pid, 0);
		}
		flock(tab_fd, LOCK_UN);
	}
}
