/*
 * simgpu_impl.h - the internal interfaces between the files of simgpu, the
 * CPU test device that stands in for libcudart.so.13.
 *
 * One file, one job:
 *   config.c    device parameters from the environment, device time
 *   errors.c    last-error tracking, error names and strings
 *   hset.c      small pointer sets that validate user handles
 *   arena.c     device memory: the shared arena, its allocator, peers
 *   fault.c     SIGSEGV/SIGBUS: map peers on demand, contain twin faults
 *   memory.c    cudaMalloc and friends, pinned host memory, attributes
 *   ipc.c       cudaIpc* memory handles
 *   copy.c      cudaMemcpy / cudaMemset / symbol copies
 *   stream.c    streams: queues, executor threads, ordering, waits
 *   exec.c      what a queued operation does and how long it takes
 *   event.c     events
 *   engine.c    the device model's engine: block dispatch, co-residence,
 *               DRAM queueing, time slices, PCIe (simgpu_model.h)
 *   model.c     the live device: the engine's state shared by processes
 *   fatbin.c    kernel parameter layouts read from the embedded cubin
 *   kernels.c   registration, kernel table, twins, statistics, report
 *   library.c   cudaLibrary*: kernels of a fat binary loaded at run time
 *   launch.c    kernel launch entry points
 *   device.c    device properties, attributes, versions, odds and ends
 *   array.c     CUDA arrays, 2D/3D array and pitched copies, cudaMemset2D/3D
 *   texture.c   texture and surface objects; the twins' sampling API
 *   capture.c   stream capture: work recorded as graph nodes (graph.h)
 *   graph.c     CUDA graphs and their nodes
 *   graphexec.c executable graphs: instantiation, update, cudaGraphLaunch
 *   vmm.c       the driver's VMM calls (cuMemCreate, cuMemMap, ...) emulated,
 *               handed out by cudaGetDriverEntryPoint[ByVersion]
 *   mempool.c   memory pools: cudaMemPool*, cudaMallocAsync's pool, reuse
 *   hints.c     managed-memory advice and prefetch, stream attributes
 *   drvglue.c   private simgpu_drv_* entry points for simgpu's libcuda.so.1
 *               (shim/simgpu/driver/: the driver API over this device)
 *
 * Everything the application may call is marked SG_API (simgpu_model.h);
 * the library is built with -fvisibility=hidden so nothing else leaks out.
 *
 * Beyond the CUDA runtime API, simgpu exports (find them with dlsym; a
 * real libcudart does not have them):
 *   int   simgpu_kernel_has_twin(const char *mangled)  1 / 0 / -1 unknown
 *   void *simgpu_kernel_by_name(const char *mangled)   cudaKernel_t by name
 *   void *simgpu_kernel_define(name, n, sizes)          the same, with a layout
 *   int   simgpu_map_peer(const void *devptr)          map a peer's arena
 *   int   simgpu_quota_pct(void)                       the MPS-style SM quota
 * and writes $SIMGPU_REPORT at exit (kernels.c).  Environment: config.c.
 */
#ifndef SIMGPU_IMPL_H
#define SIMGPU_IMPL_H

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "simgpu_model.h"
#include "simgpu_twin.h"

#define SG_LIKELY(x) __builtin_expect(!!(x), 1)
#define SG_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ------------------------------------------------------------------ config.c */

struct sg_config {
	int    sms;              /* SIMGPU_SMS                                  */
	double mem_bytes;        /* SIMGPU_MEM_GIB, in bytes                    */
	double bw;               /* SIMGPU_BW_GBS, bytes/s                      */
	double sm_flops;         /* SIMGPU_SM_GFLOPS, flop/s of one SM          */
	double sm_bw;            /* SIMGPU_SM_BW_GBS, bytes/s one SM can pull   */
	double launch_s;         /* SIMGPU_LAUNCH_US, seconds                   */
	double wake_margin_s;    /* SIMGPU_WAKE_MARGIN_US, seconds              */
	double wait_s;           /* SIMGPU_WAIT_US, device seconds (model.c)    */
	double timescale;        /* SIMGPU_TIMESCALE: wall s per device s       */
	double flops_per_thread; /* SIMGPU_DEFAULT_FLOPS_PER_THREAD             */
	double bytes_per_thread; /* SIMGPU_DEFAULT_BYTES_PER_THREAD             */
	double quota_pct;        /* CUDA_MPS_ACTIVE_THREAD_PERCENTAGE           */
	int    quota_sms;        /* SMs the quota allows (en_quota_sms)         */
	int    debug;            /* SIMGPU_DEBUG                                */
	int    sync;             /* SIMGPU_SYNC: run all work at enqueue        */
	int    timing_only;      /* SIMGPU_TIMING_ONLY: skip twins, keep time   */
	char   name[256];        /* SIMGPU_NAME                                 */
	char   dir[512];         /* SIMGPU_DIR                                  */
	struct simgpu_model_params mp;   /* the device model's (model.c)       */
};

extern struct sg_config sg_cfg;
extern atomic_int sg_ready;

void sg_init_slow(void);

/* Every entry point calls this first: one load on the fast path. */
static inline void sg_init(void)
{
	if (SG_UNLIKELY(!atomic_load_explicit(&sg_ready, memory_order_acquire)))
		sg_init_slow();
}

/*
 * A thread put to sleep wakes late by the host's wake-up latency: a few us
 * on an idle machine, tens in a virtual machine or beside busy threads
 * (bench/bin/hostwake: 10-50 us on the 2-vCPU dev guest, up to 90 with a
 * third thread spinning).  Waits for a modelled time therefore sleep until
 * sg_cfg.wake_margin_s (SIMGPU_WAKE_MARGIN_US, default 60) before it and
 * poll the rest, so that the host sees the device finish when the model
 * says, as a GPU's spinning cudaDeviceSynchronize does.
 *
 * Each turn of those polls gives the CPU to any thread that wants it: on a
 * small machine the device model's own threads (stream threads, other
 * simgpu processes, the controller, the pool's workers) need the CPUs the
 * pollers would spin on; CUDA's cudaDeviceScheduleYield does the same.  On
 * an idle CPU sched_yield returns at once.
 */
static inline void sg_poll_yield(void)
{
	sched_yield();
}

static inline void sg_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#else
	__asm__ __volatile__("" ::: "memory");
#endif
}

/*
 * The SMs a kernel may use: the process's MPS quota, and within it the
 * partition of the green context its stream belongs to (green_sms, 0 for
 * none).  cuda.h says that under an MPS active-thread percentage a green
 * context's kernels may be scaled up to the client's SMs; simgpu takes the
 * smaller of the two until a GPU run says which.
 */
static inline int sg_cap_sms(unsigned green_sms)
{
	if (green_sms > 0 && green_sms < (unsigned)sg_cfg.quota_sms)
		return (int)green_sms;
	return sg_cfg.quota_sms;
}

double sg_mono(void);                 /* CLOCK_MONOTONIC, seconds          */
void   sg_set_epoch(double mono);     /* device time 0, shared per device  */
double sg_dev_now(void);              /* device seconds; 0 if timescale 0  */
double sg_wall_of(double dev_t);      /* CLOCK_MONOTONIC s of a device t   */
double sg_dev_clock(double dev_t);    /* the device clock's reading, s     */
void   sg_sleep_until(double dev_t);  /* no-op when timescale is 0         */
void   sg_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ------------------------------------------------------------------ errors.c */

cudaError_t sg_err(cudaError_t e);          /* record as last error       */
void        sg_async_error(cudaError_t e, int sticky);
cudaError_t sg_sticky(void);                /* sticky error or success    */
cudaError_t sg_sync_status(void);           /* for sync calls: pending    */
void        sg_errors_reset(void);

/* ------------------------------------------------------------------ hset.c */

struct sg_hset {
	pthread_rwlock_t lock;
	const void     **tab;
	size_t           cap, used;   /* used counts tombstones too */
};
#define SG_HSET_INIT { PTHREAD_RWLOCK_INITIALIZER, NULL, 0, 0 }

int  sg_hset_add(struct sg_hset *h, const void *p);   /* 0 or -1 (ENOMEM) */
void sg_hset_del(struct sg_hset *h, const void *p);
int  sg_hset_has(struct sg_hset *h, const void *p);

/* ------------------------------------------------------------------ arena.c */

/* Overridable at build time only for sanitizer builds, whose shadow memory
 * covers the default region; every process of a device must agree. */
#ifndef SG_ARENA_BASE
#define SG_ARENA_BASE  0x200000000000ULL     /* 32 TiB                     */
#endif
#ifndef SG_SLOT_SPAN
#define SG_SLOT_SPAN   (128ULL << 30)        /* address range per process  */
#endif
#ifndef SG_MAX_SLOTS
#define SG_MAX_SLOTS   128
#endif
#define SG_ARENA_END   (SG_ARENA_BASE + SG_MAX_SLOTS * SG_SLOT_SPAN)
#define SG_ALIGN       256

enum sg_mem_kind { SG_MEM_DEVICE = 1, SG_MEM_MANAGED = 2 };

static inline int sg_in_region(const void *p)
{
	uintptr_t a = (uintptr_t)p;
	return a >= SG_ARENA_BASE && a < SG_ARENA_END;
}

void sg_arena_init(void);
cudaError_t sg_arena_alloc(size_t n, int kind, void **out);
cudaError_t sg_arena_free(void *p);
int  sg_arena_find(const void *p, void **base, size_t *size, int *kind);
int  sg_dev_range_ok(const void *p, size_t n);
void sg_arena_mem_info(size_t *free_b, size_t *total_b);
void sg_arena_free_all(void);
int  sg_arena_own_slot(void);
int  sg_arena_slot_owner(int slot, int32_t *pid, uint32_t *gen);
int  sg_arena_fault_map(const void *addr);   /* async-signal-safe */
int  simgpu_map_peer(const void *devptr);

/* ------------------------------------------------------------------ vmm.c */

/* Memory mapped with the emulated cuMemMap: device memory too. */
int sg_vmm_find(const void *p, void **base, size_t *size);
int sg_vmm_range_ok(const void *p, size_t n);

/* Any device memory: the arena's region, or a VMM mapping. */
static inline int sg_is_dev(const void *p)
{
	return sg_in_region(p) || sg_vmm_find(p, NULL, NULL);
}

/* ------------------------------------------------------------------ fault.c */

void sg_fault_install(void);
int  sg_protected_call(void (*fn)(void *), void *arg);   /* -1: it faulted */

/* ------------------------------------------------------------------ memory.c */

int sg_is_pinned(const void *p, size_t n);

/* ------------------------------------------------------------------ stream.c */

enum sg_op_kind {
	SG_OP_KERNEL = 1, SG_OP_COPY, SG_OP_MEMSET, SG_OP_RECORD, SG_OP_WAIT,
	SG_OP_HOST, SG_OP_CALLBACK, SG_OP_FREE
};

enum sg_dir { SG_H2H, SG_H2D, SG_D2H, SG_D2D };

struct sg_stream;
struct sg_event;
struct sg_kernel;

struct sg_dep {
	struct sg_stream *s;
	uint64_t          seq;    /* wait until s has completed seq ops */
};

struct sg_op {
	_Atomic(struct sg_op *) next;   /* queue link */
	int            kind;
	int            ndeps;
	double         enq_t;           /* device time at enqueue */
	uint64_t       wait;            /* the device's wait for it (model.c) */
	struct sg_dep *deps;            /* dep_buf or heap */
	struct sg_dep  dep_buf[2];
	atomic_int    *consumed;        /* launcher waits: arguments borrowed */
	union {
		struct {
			struct sg_kernel *k;
			simgpu_launch     l;
			uint64_t          seq;   /* this process's launch number */
			unsigned          sms;   /* green context's SMs, 0 none  */
		} kern;
		struct {
			void       *dst;
			const void *src;
			size_t      n;
			int         dir;
			void       *owned;      /* snapshot of pageable source */
		} copy;
		struct {
			void  *dst;
			int    val;
			size_t n;
		} set;
		struct {
			struct sg_event *ev;
			uint64_t         gen;
		} rec;
		struct {
			cudaHostFn_t fn;
			void        *data;
		} host;
		struct {
			cudaStreamCallback_t cb;
			void                *data;
			cudaStream_t         handle;
		} cb;
		struct {
			void *ptr;
		} free;
	} u;
	/* kernel argument pointers and values follow */
};

struct sg_op *sg_op_new(int kind, size_t extra);
void          sg_op_free(struct sg_op *op);
int           sg_op_add_dep(struct sg_op *op, struct sg_stream *s, uint64_t seq);

struct sg_stream *sg_stream_resolve(cudaStream_t h, int ptsz);
struct sg_stream *sg_stream_legacy(void);
uint64_t sg_enqueue(struct sg_stream *s, struct sg_op *op);
void     sg_stream_wait(struct sg_stream *s, uint64_t seq);
void     sg_stream_drain(struct sg_stream *s);
double   sg_stream_time_of(struct sg_stream *s, uint64_t seq);
cudaStream_t sg_stream_handle(struct sg_stream *s);
void     sg_sync_all(void);
int      sg_stream_kernel_follows(struct sg_stream *s, struct sg_op *op);
struct sg_op *sg_stream_next_start(struct sg_stream *s, struct sg_op *op, double *lead);
/* green contexts (the driver's): a user stream's SM limit and owner */
int      sg_stream_set_green(struct sg_stream *s, void *green, unsigned sms);
unsigned sg_stream_sms(const struct sg_stream *s);
void    *sg_stream_green(const struct sg_stream *s);

/* ------------------------------------------------------------------ exec.c */

double sg_exec_op(struct sg_stream *s, struct sg_op *op, double t0);
void   sg_futex_wake(atomic_int *addr);

/* ------------------------------------------------------------------ event.c */

void sg_event_complete(struct sg_event *ev, uint64_t gen, double t);

/* ------------------------------------------------------------------ model.c */

/* A task for the device model (engine.c through model.c). */
struct sg_work {
	struct simgpu_model_task t;   /* shape, work, quota, kind            */
	int      follow;              /* a kernel of its stream is queued    */
	uint64_t wait;                /* the device's wait for it (op->wait) */
	struct sg_stream *s;          /* with waits on, its stream and op: is */
	struct sg_op     *op;         /* work queued behind it? (model.c)    */
	double   start;               /* out: its first block dispatched     */
	uint64_t id;                  /* out: the model's id (device trace)  */
};

void   sg_model_open(void);
double sg_model_solo(const struct sg_work *w);       /* seconds alone    */
double sg_model_run(struct sg_work *w, double t_start);
uint64_t sg_model_expect(double t);                  /* en_expect        */
int    sg_model_waits(void);          /* the device waits for queued work */
double sg_model_sms(const struct sg_work *w);        /* SMs it can span  */

/* ------------------------------------------------------------------ fatbin.c */

struct sg_fatbin;

struct sg_params {
	int       n;        /* number of parameters, -1 when unknown */
	uint32_t  total;    /* bytes of the parameter buffer         */
	uint32_t *off;      /* n offsets                             */
	uint32_t *size;     /* n sizes                               */
};

struct sg_fatbin *sg_fatbin_open(const void *wrapper);
int sg_fatbin_params(struct sg_fatbin *fb, const char *name, struct sg_params *p);
int sg_fatbin_var_init(struct sg_fatbin *fb, const char *name, void *dst, size_t n);
/* registers per thread and static shared memory of a kernel, 0 unknown */
int sg_fatbin_resources(struct sg_fatbin *fb, const char *name, double reserved, double *regs,
			double *smem);
/* A raw image (0xBA55ED50 header first), parsed now; NULL when damaged
 * (or out of memory).  *size: its bytes.  Close it when done: nothing of
 * it points into the image afterwards. */
struct sg_fatbin *sg_fatbin_image(const void *image, uint64_t *size);
int  sg_fatbin_nimages(const struct sg_fatbin *fb);     /* ELF images read */
int  sg_fatbin_each_kernel(struct sg_fatbin *fb,
			   int (*fn)(const char *name, struct sg_params *p, void *arg), void *arg);
void sg_fatbin_close(struct sg_fatbin *fb);

/* ------------------------------------------------------------------ kernels.c */

struct sg_kernel {
	const void       *stub;       /* host stub: the function's address   */
	char             *name;       /* mangled device name                 */
	struct sg_module *mod;
	struct sg_library *lib;       /* cudaLibraryLoadData's, or NULL      */
	atomic_int        resolved;   /* twin, cost and layout looked up     */
	struct sg_params  params;
	simgpu_twin_fn    twin;
	simgpu_cost_fn    cost;
	double            regs;         /* per thread, from the cubin; 0: unknown */
	double            smem_static;  /* bytes per block, from the cubin        */
	atomic_ullong     launches;
	atomic_ullong     modelled_ns;
	struct sg_kernel *all_next;
	_Atomic(struct sg_kernel *) by_stub_next;
	_Atomic(struct sg_kernel *) by_self_next;
};

struct sg_kernel *sg_kernel_by_stub(const void *stub);
struct sg_kernel *sg_kernel_by_handle(const void *h);   /* stub or cudaKernel_t */
/* A kernel of a library: a record of its own (never freed), found by its
 * handle; p's arrays become the kernel's.  NULL when out of memory. */
struct sg_kernel *sg_kernel_of_library(struct sg_library *lib, const char *name,
				       const struct sg_params *p);
void sg_kernel_resolve(struct sg_kernel *k);
cudaError_t sg_symbol(const void *sym, void **dev, size_t *size);
/* $SIMGPU_LAUNCH_LOG: one JSON line per kernel run (exec.c) */
uint64_t sg_launch_seq(void);
void sg_kernels_reset(void);

/* ------------------------------------------------------------------ library.c */

/* cudaLibrary_t: the kernels of one loaded image.  Never freed: its kernel
 * records are reachable without a lock; an unloaded one's handles fail. */
struct sg_library {
	unsigned           n;
	struct sg_kernel **k;
	atomic_int         unloaded;
};

/* ------------------------------------------------------------------ mempool.c */

/* cudaMallocAsync (pool NULL: the current pool), cudaMallocFromPoolAsync */
cudaError_t sg_pool_malloc(void **devPtr, size_t size, cudaMemPool_t pool, struct sg_stream *s);
/* cudaFreeAsync: 0 not pool memory; 1 done, *err the result */
int  sg_pool_free_async(void *p, struct sg_stream *s, cudaError_t *err);
/* cudaFree: 0 not pool memory; 1 off the pool's books; -1 freed already */
int  sg_pool_forget(void *p);
void sg_pools_reset(void);              /* for cudaDeviceReset */

/* ------------------------------------------------------------------ hints.c */

void sg_hints_forget(const void *p);    /* cudaFree of managed memory */
void sg_hints_reset(void);              /* for cudaDeviceReset */
void sg_stream_attr_forget(struct sg_stream *s);   /* for cudaStreamDestroy */

/* ------------------------------------------------------------------ texture.c */

/* For cudaDeviceReset, before the arena is freed: destroys every texture
 * and surface object and frees every CUDA array (array.c). */
void sg_textures_reset(void);

#endif
