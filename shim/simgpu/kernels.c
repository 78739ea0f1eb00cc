/*
 * kernels.c - what nvcc's generated code registers, and what we know about
 * each kernel: its mangled name, parameter layout, host twin, cost model
 * and launch statistics.
 *
 * nvcc 13 registers each translation unit's fat binary from a static
 * constructor (__cudaRegisterFatBinary, __cudaRegisterFunction per kernel,
 * __cudaRegisterVar per __device__ variable, __cudaRegisterFatBinaryEnd),
 * then launches through __cudaGetKernel + __cudaLaunchKernel.  Kernels
 * are looked up by host stub address (and cudaKernel_t handles, which are
 * our kernel records) in two lock-free hash chains; records are never
 * freed, so a lookup can race with a registration but never with a free.
 *
 * Twins and costs (see simgpu_twin.h) are looked up once, at a kernel's
 * first launch: $SIMGPU_TWINS, then "<executable>.twins.so", then the
 * global namespace.
 *
 * SIMGPU_IGNORE_CUBIN=1 makes every parameter layout unknown, to test the
 * path where a launch lends its arguments until the executor consumed them.
 *
 * Exported extras:
 *   int simgpu_kernel_has_twin(const char *mangled)
 *       1 the kernel has a twin, 0 it runs as a timed no-op,
 *       -1 no kernel of that name is registered.
 *   void *simgpu_kernel_by_name(const char *mangled)
 *       a cudaKernel_t for a kernel known only by name (see below).
 *   void *simgpu_kernel_define(const char *mangled, int n, const unsigned *sizes)
 *   void *simgpu_kernel_define_layout(mangled, n, offsets, sizes)
 *       the same, with a parameter layout, so launches need not wait.
 *   Kernels of libraries (library.c) are records here too, found by
 *   handle and listed by name (twins, report), never by simgpu_kernel_by_name.
 *   At exit, if $SIMGPU_REPORT names a file, one JSON line per launched
 *   kernel is appended to it:
 *       {"pid":N,"name":"<mangled>","launches":N,"twin":true|false,
 *        "modelled_us":X}
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "simgpu_impl.h"

#define NBUCKET    1024
#define FATBIN_WRAPPER_MAGIC 0x466243b1

struct sg_module {
	const void       *wrapper;
	struct sg_fatbin *fb;
	struct sg_module *next;
};

struct sg_var {
	const void       *host;      /* host shadow: the symbol's address */
	char             *name;
	size_t            size;
	struct sg_module *mod;
	void            **managed;   /* __managed__: where the pointer goes */
	void             *dev;       /* allocated on first use */
	struct sg_var    *next;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;   /* registration */
static struct sg_module *modules;
static struct sg_kernel *all_kernels;
static _Atomic(struct sg_kernel *) by_stub[NBUCKET];
static _Atomic(struct sg_kernel *) by_self[NBUCKET];
static struct sg_var *vars;

static size_t bucket(const void *p)
{
	uint64_t x = (uint64_t)(uintptr_t)p;

	x ^= x >> 29;
	x *= 0xbf58476d1ce4e5b9ULL;
	x ^= x >> 32;
	return (size_t)x % NBUCKET;
}

/* ---------------------------------------------------------------- lookup */

struct sg_kernel *sg_kernel_by_stub(const void *stub)
{
	struct sg_kernel *k;

	for (k = atomic_load_explicit(&by_stub[bucket(stub)], memory_order_acquire); k;
	     k = atomic_load_explicit(&k->by_stub_next, memory_order_acquire))
		if (k->stub == stub)
			return k;
	return NULL;
}

struct sg_kernel *sg_kernel_by_handle(const void *h)
{
	struct sg_kernel *k;

	if (!h)
		return NULL;
	k = sg_kernel_by_stub(h);
	if (k)
		return k;
	for (k = atomic_load_explicit(&by_self[bucket(h)], memory_order_acquire); k;
	     k = atomic_load_explicit(&k->by_self_next, memory_order_acquire))
		if ((const void *)k == h)
			/* a kernel of an unloaded library is no kernel any more */
			return k->lib && atomic_load_explicit(&k->lib->unloaded, memory_order_acquire)
				       ? NULL
				       : k;
	return NULL;
}

/* Link a new record into the name list and the handle hash; mu held. */
static void link_self(struct sg_kernel *k)
{
	size_t b = bucket(k);

	k->all_next = all_kernels;
	all_kernels = k;
	atomic_store(&k->by_self_next, atomic_load(&by_self[b]));
	atomic_store_explicit(&by_self[b], k, memory_order_release);
}

struct sg_kernel *sg_kernel_of_library(struct sg_library *lib, const char *name,
				       const struct sg_params *p)
{
	struct sg_kernel *k = calloc(1, sizeof(*k));

	if (!k || !(k->name = strdup(name))) {
		free(k);
		return NULL;
	}
	k->lib = lib;
	k->params = *p;        /* n >= 0: the layout stands (sg_kernel_resolve) */
	pthread_mutex_lock(&mu);
	link_self(k);
	pthread_mutex_unlock(&mu);
	return k;
}

/* ---------------------------------------------------------------- twins */

#define MAX_TWIN_LIBS 32

static void *twin_libs[MAX_TWIN_LIBS];
static int ntwin_libs;
static pthread_once_t twin_once = PTHREAD_ONCE_INIT;

static void open_twin_lib(const char *path)
{
	void *h;

	if (ntwin_libs >= MAX_TWIN_LIBS)
		return;
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h)
		twin_libs[ntwin_libs++] = h;
	else
		sg_log("cannot load twins %s: %s", path, dlerror());
}

static void load_twin_libs(void)
{
	const char *env = getenv("SIMGPU_TWINS");
	char exe[PATH_MAX], path[PATH_MAX + 16];
	ssize_t n;

	if (env && *env) {
		char *copy = strdup(env), *save = NULL, *p;

		for (p = copy ? strtok_r(copy, ":", &save) : NULL; p; p = strtok_r(NULL, ":", &save))
			if (*p)
				open_twin_lib(p);
		free(copy);
	}
	n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n > 0) {
		exe[n] = 0;
		snprintf(path, sizeof(path), "%s.twins.so", exe);
		if (access(path, R_OK) == 0)
			open_twin_lib(path);
	}
}

static void *twin_sym(const char *prefix, const char *name)
{
	size_t lp = strlen(prefix), ln = strlen(name);
	char *sym = malloc(lp + ln + 1);
	void *f = NULL;
	int i;

	if (!sym)
		return NULL;
	memcpy(sym, prefix, lp);
	memcpy(sym + lp, name, ln + 1);
	for (i = 0; i < ntwin_libs && !f; i++)
		f = dlsym(twin_libs[i], sym);
	if (!f)
		f = dlsym(RTLD_DEFAULT, sym);
	free(sym);
	return f;
}

void sg_kernel_resolve(struct sg_kernel *k)
{
	static pthread_mutex_t rmu = PTHREAD_MUTEX_INITIALIZER;

	pthread_once(&twin_once, load_twin_libs);
	pthread_mutex_lock(&rmu);
	if (!atomic_load(&k->resolved)) {
		void *t = twin_sym(SIMGPU_TWIN_PREFIX, k->name);
		void *c = twin_sym(SIMGPU_COST_PREFIX, k->name);

		/* dlsym hands out object pointers; the ABI makes them functions */
		memcpy(&k->twin, &t, sizeof(t));
		memcpy(&k->cost, &c, sizeof(c));
		/* a layout given by simgpu_kernel_define stands; else the cubin's.
		 * SIMGPU_IGNORE_CUBIN=1 forces the borrowed-argument path (tests) */
		if (k->params.n >= 0 && !k->mod)
			;
		else if ((k->params.n = -1), k->mod && k->mod->fb && !getenv("SIMGPU_IGNORE_CUBIN"))
			sg_fatbin_params(k->mod->fb, k->name, &k->params);
		if (k->params.n < 0)
			sg_log("%s: parameter layout unknown, launches will wait for the executor",
			       k->name);
		/* what a block holds on an SM, for the device model's occupancy */
		if (k->mod && k->mod->fb)
			sg_fatbin_resources(k->mod->fb, k->name, sg_cfg.mp.block_smem, &k->regs,
					    &k->smem_static);
		sg_log("%s: twin %s, cost %s, %d params, %g regs, %g B shared", k->name,
		       k->twin ? "yes" : "no", k->cost ? "yes" : "no", k->params.n, k->regs,
		       k->smem_static);
		atomic_store_explicit(&k->resolved, 1, memory_order_release);
	}
	pthread_mutex_unlock(&rmu);
}

SG_API int simgpu_kernel_has_twin(const char *mangled)
{
	struct sg_kernel *k;

	if (!mangled)
		return -1;
	pthread_mutex_lock(&mu);
	for (k = all_kernels; k; k = k->all_next)
		if (strcmp(k->name, mangled) == 0)
			break;
	pthread_mutex_unlock(&mu);
	if (!k)
		return -1;
	if (!atomic_load_explicit(&k->resolved, memory_order_acquire))
		sg_kernel_resolve(k);
	return k->twin != NULL;
}

/*
 * simgpu_kernel_by_name - a kernel handle (a cudaKernel_t, usable with
 * cudaLaunchKernel and friends) for a mangled name, whether or not this
 * process registered it: how a process-pool worker launches a kernel that
 * was forwarded to it by name.  Its twin is found the usual way
 * ($SIMGPU_TWINS first); without a cubin its parameter layout is unknown,
 * so such launches lend their arguments until the twin has read them.
 * Kernels of loaded libraries are not found here (a library may be
 * unloaded; by name is a record of its own).  NULL only when out of memory.
 */
SG_API void *simgpu_kernel_by_name(const char *mangled)
{
	struct sg_kernel *k;

	if (!mangled || !*mangled)
		return NULL;
	pthread_mutex_lock(&mu);
	for (k = all_kernels; k; k = k->all_next)
		if (!k->lib && strcmp(k->name, mangled) == 0)
			goto out;
	k = calloc(1, sizeof(*k));
	if (!k || !(k->name = strdup(mangled))) {
		free(k);
		k = NULL;
		goto out;
	}
	k->params.n = -1;
	link_self(k);
out:
	pthread_mutex_unlock(&mu);
	return k;
}

/*
 * simgpu_kernel_define_layout - simgpu_kernel_by_name, with the parameter
 * layout given by the caller: n parameters, the i-th of sizes[i] bytes at
 * offsets[i] in the argument buffer.  With a layout a launch copies its
 * arguments and returns at once instead of lending them to the executor.
 * Used by the process-pool worker (the app's shim sends each kernel's
 * layout).  A kernel defined before keeps its layout; NULL when that
 * differs from this one, when out of memory, or when the layout is
 * unusable (a zero or oversized parameter, overlapping offsets).
 */
SG_API void *simgpu_kernel_define_layout(const char *mangled, int n, const unsigned *offsets,
					 const unsigned *sizes)
{
	struct sg_kernel *k;
	uint32_t *off, *size, total = 0;
	int i;

	if (n < 0 || n > 4096 || (n > 0 && (!sizes || !offsets)))
		return NULL;
	for (i = 0; i < n; i++)
		if (sizes[i] == 0 || sizes[i] > 4096 || offsets[i] > (1u << 20) ||
		    offsets[i] < total)
			return NULL;
		else
			total = offsets[i] + sizes[i];
	k = simgpu_kernel_by_name(mangled);
	if (!k)
		return NULL;
	pthread_mutex_lock(&mu);
	if (k->params.n >= 0) {
		/* defined before (or from a cubin): the same layout, or refuse */
		if (k->params.n != n)
			k = NULL;
		for (i = 0; k && i < n; i++)
			if (k->params.off[i] != offsets[i] || k->params.size[i] != sizes[i])
				k = NULL;
		goto out;
	}
	if (k->mod || atomic_load(&k->resolved))
		goto out;
	off = calloc((size_t)n + 1, sizeof(*off));
	size = calloc((size_t)n + 1, sizeof(*size));
	if (!off || !size) {
		free(off);
		free(size);
		k = NULL;
		goto out;
	}
	for (i = 0; i < n; i++) {
		off[i] = offsets[i];
		size[i] = sizes[i];
	}
	k->params.off = off;
	k->params.size = size;
	k->params.total = total;
	k->params.n = n;
out:
	pthread_mutex_unlock(&mu);
	return k;
}

/*
 * simgpu_kernel_define - the same with the layout nvcc uses for a list of
 * parameter sizes: each at the natural alignment of its size (min(size, 8)).
 * For simgpu's CPU cuDNN/cuBLAS, whose "kernels" have no cubin.
 */
SG_API void *simgpu_kernel_define(const char *mangled, int n, const unsigned *sizes)
{
	unsigned off[64], total = 0;
	int i;

	if (n < 0 || n > 64 || (n > 0 && !sizes))
		return NULL;
	for (i = 0; i < n; i++) {
		unsigned a = sizes[i] >= 8 ? 8 : (sizes[i] >= 4 ? 4 : (sizes[i] >= 2 ? 2 : 1));

		total = (total + a - 1) & ~(a - 1);
		off[i] = total;
		total += sizes[i];
	}
	return simgpu_kernel_define_layout(mangled, n, off, sizes);
}

/* ---------------------------------------------------------------- registration */

SG_API void **__cudaRegisterFatBinary(void *fatCubin)
{
	struct sg_module *m = calloc(1, sizeof(*m));

	/* The handle must be non-NULL and unique; our module record is both. */
	if (!m) {
		static void *dummy;
		return &dummy;
	}
	m->wrapper = fatCubin;
	if (fatCubin && *(const int *)fatCubin == FATBIN_WRAPPER_MAGIC)
		m->fb = sg_fatbin_open(fatCubin);
	pthread_mutex_lock(&mu);
	m->next = modules;
	modules = m;
	pthread_mutex_unlock(&mu);
	return (void **)m;
}

SG_API void __cudaRegisterFatBinaryEnd(void **fatCubinHandle)
{
	(void)fatCubinHandle;
}

SG_API void __cudaUnregisterFatBinary(void **fatCubinHandle)
{
	/* Kernels may still be queued at exit: keep everything. */
	(void)fatCubinHandle;
}

static int is_module(void **h)
{
	struct sg_module *m;

	for (m = modules; m; m = m->next)
		if ((void **)m == h)
			return 1;
	return 0;
}

SG_API void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
				   const char *deviceName, int thread_limit, uint3 *tid,
				   uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize)
{
	const char *name = deviceFun ? deviceFun : deviceName;
	struct sg_kernel *k;
	size_t b;

	(void)thread_limit, (void)tid, (void)bid, (void)bDim, (void)gDim, (void)wSize;
	if (!hostFun || !name)
		return;
	pthread_mutex_lock(&mu);
	if (sg_kernel_by_stub(hostFun)) {
		pthread_mutex_unlock(&mu);
		return;
	}
	k = calloc(1, sizeof(*k));
	if (!k || !(k->name = strdup(name))) {
		free(k);
		pthread_mutex_unlock(&mu);
		return;
	}
	k->stub = hostFun;
	k->mod = is_module(fatCubinHandle) ? (struct sg_module *)fatCubinHandle : NULL;
	k->params.n = -1;
	k->all_next = all_kernels;
	all_kernels = k;
	b = bucket(hostFun);
	atomic_store(&k->by_stub_next, atomic_load(&by_stub[b]));
	atomic_store_explicit(&by_stub[b], k, memory_order_release);
	b = bucket(k);
	atomic_store(&k->by_self_next, atomic_load(&by_self[b]));
	atomic_store_explicit(&by_self[b], k, memory_order_release);
	pthread_mutex_unlock(&mu);
}

static void add_var(void **handle, const void *host, void **managed, const char *name,
		    size_t size)
{
	struct sg_var *v;

	if (!host || !name || !size)
		return;
	v = calloc(1, sizeof(*v));
	if (!v || !(v->name = strdup(name))) {
		free(v);
		return;
	}
	v->host = host;
	v->size = size;
	v->managed = managed;
	pthread_mutex_lock(&mu);
	v->mod = is_module(handle) ? (struct sg_module *)handle : NULL;
	v->next = vars;
	vars = v;
	pthread_mutex_unlock(&mu);
}

SG_API void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
			      const char *deviceName, int ext, size_t size, int constant,
			      int global)
{
	(void)ext, (void)constant, (void)global;
	add_var(fatCubinHandle, hostVar, NULL, deviceAddress ? deviceAddress : deviceName, size);
}

SG_API void __cudaRegisterManagedVar(void **fatCubinHandle, void **hostVarPtrAddress,
				     char *deviceAddress, const char *deviceName, int ext,
				     size_t size, int constant, int global)
{
	(void)ext, (void)constant, (void)global;
	add_var(fatCubinHandle, hostVarPtrAddress, hostVarPtrAddress,
		deviceAddress ? deviceAddress : deviceName, size);
}

SG_API void __cudaRegisterHostVar(void **fatCubinHandle, const char *deviceName, char *hostVar,
				  size_t size)
{
	(void)fatCubinHandle, (void)deviceName, (void)hostVar, (void)size;
}

/* Device storage of a variable, created (with its initial value) on
 * first use; mu held. */
static cudaError_t var_storage(struct sg_var *v)
{
	cudaError_t e;

	if (v->dev)
		return cudaSuccess;
	e = sg_arena_alloc(v->size, v->managed ? SG_MEM_MANAGED : SG_MEM_DEVICE, &v->dev);
	if (e != cudaSuccess)
		return e;
	memset(v->dev, 0, v->size);
	if (!v->mod || !v->mod->fb || sg_fatbin_var_init(v->mod->fb, v->name, v->dev, v->size) < 0)
		if (!v->managed)
			memcpy(v->dev, v->host, v->size);   /* the host shadow */
	if (v->managed)
		*v->managed = v->dev;
	return cudaSuccess;
}

/* Managed variables get their storage when the program first touches one. */
SG_API char __cudaInitModule(void **fatCubinHandle)
{
	struct sg_var *v;
	char ok = 1;

	sg_init();
	pthread_mutex_lock(&mu);
	for (v = vars; v; v = v->next)
		if (v->managed && (struct sg_module *)fatCubinHandle == v->mod &&
		    var_storage(v) != cudaSuccess)
			ok = 0;
	pthread_mutex_unlock(&mu);
	return ok;
}

/* cudaDeviceReset freed all device memory: variables start over. */
void sg_kernels_reset(void)
{
	struct sg_var *v;

	pthread_mutex_lock(&mu);
	for (v = vars; v; v = v->next) {
		int had = v->dev != NULL;

		v->dev = NULL;
		if (v->managed && had && var_storage(v) != cudaSuccess)
			*v->managed = NULL;
	}
	pthread_mutex_unlock(&mu);
}

cudaError_t sg_symbol(const void *sym, void **dev, size_t *size)
{
	struct sg_var *v;
	cudaError_t e = cudaErrorInvalidSymbol;

	if (!sym)
		return e;
	sg_init();
	pthread_mutex_lock(&mu);
	for (v = vars; v; v = v->next)
		if (v->host == sym)
			break;
	if (v) {
		e = var_storage(v);
		if (e == cudaSuccess) {
			*dev = v->dev;
			*size = v->size;
		}
	}
	pthread_mutex_unlock(&mu);
	return e;
}

/* ---------------------------------------------------------------- report */

/* One JSON line, written with a single write() so that lines of processes
 * sharing the report file do not interleave. */
static void report_one(int fd, const struct sg_kernel *k, unsigned long long n)
{
	size_t cap = strlen(k->name) * 6 + 160, len;
	char *buf = malloc(cap), *p;
	const char *s;

	if (!buf)
		return;
	len = (size_t)snprintf(buf, cap, "{\"pid\":%d,\"name\":\"", (int)getpid());
	for (s = k->name; *s && len + 8 < cap; s++) {
		unsigned char c = (unsigned char)*s;

		p = buf + len;
		if (c == '"' || c == '\\')
			len += (size_t)snprintf(p, cap - len, "\\%c", c);
		else if (c < 0x20)
			len += (size_t)snprintf(p, cap - len, "\\u%04x", c);
		else
			buf[len++] = (char)c;
	}
	len += (size_t)snprintf(buf + len, cap - len,
				"\",\"launches\":%llu,\"twin\":%s,\"modelled_us\":%.3f}\n", n,
				k->twin ? "true" : "false",
				(double)atomic_load(&k->modelled_ns) / 1e3);
	if (len < cap && write(fd, buf, len) < 0)
		sg_log("cannot write the report: %m");
	free(buf);
}

__attribute__((destructor)) static void report(void)
{
	const char *path = getenv("SIMGPU_REPORT");
	struct sg_kernel *k;
	int fd, locked;

	if (!path || !*path)
		return;
	fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return;
	/* a thread may hold the lock at exit; the list is append-only */
	locked = pthread_mutex_trylock(&mu) == 0;
	for (k = all_kernels; k; k = k->all_next) {
		unsigned long long n = atomic_load(&k->launches);

		if (n)
			report_one(fd, k, n);
	}
	if (locked)
		pthread_mutex_unlock(&mu);
	close(fd);
}
