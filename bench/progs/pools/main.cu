// pools: stream-ordered memory pools, managed-memory hints and stream
// attributes, as an ordinary program uses them.
//
//   pools [--iters N] [--bad-handles]
//
//   pools     a created pool made the device's current one, a release
//             threshold, N (default 64) cudaMallocAsync / kernel /
//             cudaFreeAsync rounds on one stream, four live 1 MiB blocks
//             (used and reserved figures, cudaMemGetInfo), a kernel that
//             writes pool memory and whose result is checked, reuse from
//             another stream, high-watermark resets, cudaMemPoolTrimTo, a
//             second pool with threshold 0 used through
//             cudaMallocFromPoolAsync, pool access
//   managed   cudaMemAdvise (read-mostly, preferred location, accessed-by),
//             cudaMemPrefetchAsync to the device and the host, then
//             cudaMemRangeGetAttribute[s]; a kernel on the prefetched
//             memory; cudaStreamAttachMemAsync
//   streams   access policy window, synchronisation policy and priority
//             set and read back, cudaStreamCopyAttributes,
//             cudaCtxResetPersistingL2Cache
//   errors    the error codes of an unknown pool attribute, a read-only
//             attribute, a non-zero watermark reset, destroying the default
//             pool, prefetching cudaMalloc memory and past a managed
//             allocation, bad advice, a device that does not exist, a bad
//             query size, a launch-only attribute on a stream, a hit ratio
//             above 1
//   --bad-handles  also garbage and destroyed pool and stream handles
//             (what simgpu must survive; a real driver may crash on them)
//
// Prints one JSON line (figures, error codes, "mismatches") and exits 1 if a
// check failed.  Checks hold on a real GPU too: where CUDA leaves a figure
// to the driver (pool granularity) they are bounds; tests/test_simgpu_pools.py
// asserts simgpu's exact figures from the JSON.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char *NAME = "pools";

#include "progutil.h"

#define MIB (1u << 20)

static char mism[2048];
static int nmism;

// Note a failed check and go on: the JSON line lists them all.
#define EXPECT(c)                                                               \
	do {                                                                    \
		if (!(c)) {                                                     \
			size_t l_ = strlen(mism);                               \
			if (l_ + 100 < sizeof(mism))                            \
				snprintf(mism + l_, sizeof(mism) - l_, "%s\"%d: %.80s\"", \
					 nmism ? "," : "", __LINE__, #c);       \
			nmism++;                                                \
		}                                                               \
	} while (0)

__global__ void pools_fill(int *p, int n, int v)
{
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n)
		p[i] = v + i;
}

static unsigned long long pattr(cudaMemPool_t pool, cudaMemPoolAttr a)
{
	uint64_t v = 0;
	CK(cudaMemPoolGetAttribute(pool, a, &v));
	return (unsigned long long)v;
}

static void pset(cudaMemPool_t pool, cudaMemPoolAttr a, unsigned long long v64)
{
	uint64_t v = v64;
	CK(cudaMemPoolSetAttribute(pool, a, &v));
}

static size_t free_mem(void)
{
	size_t f, t;
	CK(cudaMemGetInfo(&f, &t));
	return f;
}

// Fill n ints on stream s and check them on the host.
static int fill_check(int *d, int n, int v, cudaStream_t s)
{
	int *h = (int *)malloc(n * sizeof(int)), ok = 1;
	if (!h)
		fail("host malloc%s%s", "", "");
	pools_fill<<<(n + 255) / 256, 256, 0, s>>>(d, n, v);
	CK(cudaGetLastError());
	CK(cudaMemcpyAsync(h, d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
	CK(cudaStreamSynchronize(s));
	for (int i = 0; i < n && ok; i++)
		ok = h[i] == v + i;
	free(h);
	return ok;
}

static char pools_json[1024];

static void pools(long long iters, cudaStream_t s, cudaStream_t s2)
{
	cudaMemPool_t def, cur, pool, pool2;
	CK(cudaDeviceGetDefaultMemPool(&def, 0));
	CK(cudaDeviceGetMemPool(&cur, 0));
	EXPECT(cur == def);

	cudaMemPoolProps props;
	memset(&props, 0, sizeof(props));
	props.allocType = cudaMemAllocationTypePinned;
	props.handleTypes = cudaMemHandleTypeNone;
	props.location.type = cudaMemLocationTypeDevice;
	props.location.id = 0;
	CK(cudaMemPoolCreate(&pool, &props));
	CK(cudaDeviceSetMemPool(0, pool));
	CK(cudaDeviceGetMemPool(&cur, 0));
	EXPECT(cur == pool);

	// keep everything: reserved memory outlives the frees
	pset(pool, cudaMemPoolAttrReleaseThreshold, UINT64_MAX);
	EXPECT(pattr(pool, cudaMemPoolAttrReleaseThreshold) == UINT64_MAX);
	int reuse = -1;
	CK(cudaMemPoolGetAttribute(pool, cudaMemPoolReuseAllowOpportunistic, &reuse));
	EXPECT(reuse == 1);
	size_t free0 = free_mem();

	// the classic loop: allocate, use, free, all in stream order
	const int n1 = MIB / sizeof(int);
	for (long long i = 0; i < iters; i++) {
		int *p;
		CK(cudaMallocAsync((void **)&p, MIB, s));
		pools_fill<<<(n1 + 255) / 256, 256, 0, s>>>(p, n1, (int)i);
		CK(cudaGetLastError());
		CK(cudaFreeAsync(p, s));
	}
	CK(cudaStreamSynchronize(s));
	unsigned long long loop_used = pattr(pool, cudaMemPoolAttrUsedMemCurrent);
	unsigned long long loop_reserved = pattr(pool, cudaMemPoolAttrReservedMemCurrent);
	unsigned long long loop_used_high = pattr(pool, cudaMemPoolAttrUsedMemHigh);
	EXPECT(loop_used == 0);
	EXPECT(loop_reserved >= MIB);
	EXPECT(loop_used_high >= MIB);

	// four live blocks: what is used, what is reserved, what the device lost
	int *b[4];
	for (int k = 0; k < 4; k++)
		CK(cudaMallocAsync((void **)&b[k], MIB, s));
	unsigned long long live_used = pattr(pool, cudaMemPoolAttrUsedMemCurrent);
	unsigned long long live_reserved = pattr(pool, cudaMemPoolAttrReservedMemCurrent);
	size_t live_drop = free0 - free_mem();
	EXPECT(live_used >= 4ull * MIB);
	EXPECT(live_reserved >= live_used);
	// a kernel writes pool memory; the host reads what it wrote
	int kernel_ok = 1;
	for (int k = 0; k < 4; k++)
		kernel_ok &= fill_check(b[k], n1, 1000 * (k + 1), s);
	EXPECT(kernel_ok);
	for (int k = 0; k < 4; k++)
		CK(cudaFreeAsync(b[k], s));
	CK(cudaStreamSynchronize(s));
	EXPECT(pattr(pool, cudaMemPoolAttrUsedMemCurrent) == 0);
	unsigned long long freed_reserved = pattr(pool, cudaMemPoolAttrReservedMemCurrent);
	EXPECT(freed_reserved >= 4ull * MIB);
	EXPECT(pattr(pool, cudaMemPoolAttrReservedMemHigh) >= freed_reserved);

	// a completed free is reused from another stream (opportunistic reuse)
	int *q;
	CK(cudaMallocAsync((void **)&q, MIB, s2));
	unsigned long long cross_reserved = pattr(pool, cudaMemPoolAttrReservedMemCurrent);
	EXPECT(fill_check(q, n1, 5, s2));
	CK(cudaFreeAsync(q, s2));
	CK(cudaStreamSynchronize(s2));

	// cudaFree of pool memory is allowed too, but its bytes stay in the
	// pool's used figure (an H200, CUDA 13.0: 1 MiB before and after, also
	// after a device sync; simgpu does the same)
	unsigned long long used_before_free, used_after_free, used_after_devsync;
	CK(cudaMallocAsync((void **)&q, MIB, s));
	CK(cudaStreamSynchronize(s));
	used_before_free = pattr(pool, cudaMemPoolAttrUsedMemCurrent);
	CK(cudaFree(q));
	used_after_free = pattr(pool, cudaMemPoolAttrUsedMemCurrent);
	EXPECT(used_before_free == MIB && used_after_free == used_before_free);
	CK(cudaDeviceSynchronize());
	used_after_devsync = pattr(pool, cudaMemPoolAttrUsedMemCurrent);
	EXPECT(used_after_devsync == used_after_free);

	// watermarks reset (to zero only: the value set) to the current figure
	pset(pool, cudaMemPoolAttrUsedMemHigh, 0);
	pset(pool, cudaMemPoolAttrReservedMemHigh, 0);
	unsigned long long used_high_reset = pattr(pool, cudaMemPoolAttrUsedMemHigh);
	EXPECT(used_high_reset == pattr(pool, cudaMemPoolAttrUsedMemCurrent));

	// trim: keep at least 1 MiB, then nothing
	CK(cudaMemPoolTrimTo(pool, MIB));
	unsigned long long trim1 = pattr(pool, cudaMemPoolAttrReservedMemCurrent);
	EXPECT(trim1 >= MIB);
	CK(cudaMemPoolTrimTo(pool, 0));
	unsigned long long trim0 = pattr(pool, cudaMemPoolAttrReservedMemCurrent);
	EXPECT(trim0 == 0);

	// a second pool, threshold 0 (the default), used explicitly
	CK(cudaMemPoolCreate(&pool2, &props));
	int *r;
	CK(cudaMallocFromPoolAsync((void **)&r, 3 * MIB, pool2, s));
	unsigned long long p2_used = pattr(pool2, cudaMemPoolAttrUsedMemCurrent);
	EXPECT(p2_used >= 3ull * MIB);
	EXPECT(pattr(pool, cudaMemPoolAttrUsedMemCurrent) == used_after_free);   // not the other pool's
	EXPECT(fill_check(r, 3 * n1, 9, s));
	CK(cudaFreeAsync(r, s));
	CK(cudaStreamSynchronize(s));
	unsigned long long p2_after_sync = pattr(pool2, cudaMemPoolAttrReservedMemCurrent);
	EXPECT(p2_after_sync == 0);      // above the threshold: given back at the sync

	// access: the pool's own device reads and writes it
	cudaMemAccessDesc acc;
	memset(&acc, 0, sizeof(acc));
	acc.location.type = cudaMemLocationTypeDevice;
	acc.location.id = 0;
	acc.flags = cudaMemAccessFlagsProtReadWrite;
	CK(cudaMemPoolSetAccess(pool, &acc, 1));
	cudaMemAccessFlags fl = cudaMemAccessFlagsProtNone;
	cudaMemLocation loc = acc.location;
	CK(cudaMemPoolGetAccess(&fl, pool, &loc));
	EXPECT(fl == cudaMemAccessFlagsProtReadWrite);

	// destroying the current pool makes the default one current again
	CK(cudaMemPoolDestroy(pool));
	CK(cudaDeviceGetMemPool(&cur, 0));
	EXPECT(cur == def);
	CK(cudaMemPoolDestroy(pool2));

	snprintf(pools_json, sizeof(pools_json),
		 "{\"iters\":%lld,\"loop_used\":%llu,\"loop_reserved\":%llu,\"loop_used_high\":%llu,"
		 "\"live_used\":%llu,\"live_reserved\":%llu,\"live_meminfo_drop\":%zu,"
		 "\"freed_reserved\":%llu,\"cross_stream_reserved\":%llu,\"used_high_reset\":%llu,"
		 "\"trim1\":%llu,\"trim0\":%llu,\"pool2_used\":%llu,\"pool2_after_sync\":%llu,"
		 "\"used_after_free\":%llu,\"used_after_devsync\":%llu,\"kernel_ok\":%s}",
		 iters, loop_used, loop_reserved, loop_used_high, live_used, live_reserved, live_drop,
		 freed_reserved, cross_reserved, used_high_reset, trim1, trim0, p2_used, p2_after_sync,
		 used_after_free, used_after_devsync, kernel_ok ? "true" : "false");
}

static int range_int(cudaMemRangeAttribute a, const void *p, size_t n)
{
	int v = 12345;
	CK(cudaMemRangeGetAttribute(&v, sizeof(v), a, p, n));
	return v;
}

static char managed_json[1024];

static void managed(cudaStream_t s)
{
	const size_t bytes = 2 * MIB, half = MIB;
	const int n = (int)(bytes / sizeof(int));
	int *m;
	CK(cudaMallocManaged((void **)&m, bytes, cudaMemAttachGlobal));
	cudaMemLocation dev = { cudaMemLocationTypeDevice, 0 };
	cudaMemLocation host = { cudaMemLocationTypeHost, 0 };

	CK(cudaMemAdvise(m, bytes, cudaMemAdviseSetReadMostly, dev));
	CK(cudaMemAdvise(m, half, cudaMemAdviseSetPreferredLocation, dev));
	CK(cudaMemAdvise((char *)m + half, half, cudaMemAdviseSetPreferredLocation, host));
	CK(cudaMemAdvise(m, bytes, cudaMemAdviseSetAccessedBy, host));
	CK(cudaMemPrefetchAsync(m, half, dev, 0, s));
	CK(cudaMemPrefetchAsync((char *)m + half, half, host, 0, s));

	int rm = range_int(cudaMemRangeAttributeReadMostly, m, bytes);
	int pref_lo = range_int(cudaMemRangeAttributePreferredLocation, m, half);
	int pref_hi = range_int(cudaMemRangeAttributePreferredLocation, (char *)m + half, half);
	int pref_all = range_int(cudaMemRangeAttributePreferredLocation, m, bytes);
	int pref_type = range_int(cudaMemRangeAttributePreferredLocationType, m, half);
	int pref_id = range_int(cudaMemRangeAttributePreferredLocationId, m, half);
	int last_lo = range_int(cudaMemRangeAttributeLastPrefetchLocation, m, half);
	int last_hi = range_int(cudaMemRangeAttributeLastPrefetchLocation, (char *)m + half, half);
	int last_all = range_int(cudaMemRangeAttributeLastPrefetchLocation, m, bytes);
	int last_type_hi = range_int(cudaMemRangeAttributeLastPrefetchLocationType,
				     (char *)m + half, half);
	int by[4];
	CK(cudaMemRangeGetAttribute(by, sizeof(by), cudaMemRangeAttributeAccessedBy, m, bytes));
	EXPECT(rm == 1);
	EXPECT(pref_lo == 0 && pref_hi == cudaCpuDeviceId && pref_all == cudaInvalidDeviceId);
	EXPECT(pref_type == cudaMemLocationTypeDevice && pref_id == 0);
	EXPECT(last_lo == 0 && last_hi == cudaCpuDeviceId && last_all == cudaInvalidDeviceId);
	EXPECT(last_type_hi == cudaMemLocationTypeHost);
	EXPECT(by[0] == cudaCpuDeviceId && by[1] == cudaInvalidDeviceId);

	// several at once
	int rm2 = -1, pl2 = -1;
	void *data[2] = { &rm2, &pl2 };
	size_t sizes[2] = { sizeof(int), sizeof(int) };
	cudaMemRangeAttribute attrs[2] = { cudaMemRangeAttributeReadMostly,
					   cudaMemRangeAttributePreferredLocation };
	CK(cudaMemRangeGetAttributes(data, sizes, attrs, 2, m, half));
	EXPECT(rm2 == 1 && pl2 == 0);

	// the kernel works on the prefetched memory, the host reads it back
	pools_fill<<<(n + 255) / 256, 256, 0, s>>>(m, n, 77);
	CK(cudaGetLastError());
	CK(cudaStreamSynchronize(s));
	int managed_ok = 1;
	for (int i = 0; i < n && managed_ok; i++)
		managed_ok = m[i] == 77 + i;
	EXPECT(managed_ok);

	// advice undone
	CK(cudaMemAdvise(m, half, cudaMemAdviseUnsetReadMostly, dev));
	CK(cudaMemAdvise(m, bytes, cudaMemAdviseUnsetAccessedBy, host));
	int rm_lo = range_int(cudaMemRangeAttributeReadMostly, m, half);
	int rm_all = range_int(cudaMemRangeAttributeReadMostly, m, bytes);
	int rm_hi = range_int(cudaMemRangeAttributeReadMostly, (char *)m + half, half);
	CK(cudaMemRangeGetAttribute(by, sizeof(by), cudaMemRangeAttributeAccessedBy, m, bytes));
	EXPECT(rm_lo == 0 && rm_all == 0 && rm_hi == 1);
	EXPECT(by[0] == cudaInvalidDeviceId);

	// stream association: to s alone, then the host touches it after s is done
	CK(cudaStreamAttachMemAsync(s, m, 0, cudaMemAttachSingle));
	pools_fill<<<(n + 255) / 256, 256, 0, s>>>(m, n, 3);
	CK(cudaGetLastError());
	CK(cudaStreamSynchronize(s));
	int attach_ok = m[n - 1] == 3 + n - 1;
	EXPECT(attach_ok);
	CK(cudaStreamAttachMemAsync(s, m, bytes, cudaMemAttachGlobal));
	CK(cudaStreamSynchronize(s));
	CK(cudaFree(m));

	snprintf(managed_json, sizeof(managed_json),
		 "{\"read_mostly\":%d,\"pref_lo\":%d,\"pref_hi\":%d,\"pref_all\":%d,\"pref_type\":%d,"
		 "\"last_lo\":%d,\"last_hi\":%d,\"last_all\":%d,\"last_type_hi\":%d,"
		 "\"read_mostly_after\":[%d,%d,%d],\"kernel_ok\":%s,\"attach_ok\":%s}",
		 rm, pref_lo, pref_hi, pref_all, pref_type, last_lo, last_hi, last_all, last_type_hi,
		 rm_lo, rm_hi, rm_all, managed_ok ? "true" : "false", attach_ok ? "true" : "false");
}

static char streams_json[512];

static void streams(cudaStream_t s, cudaStream_t s2, void *window)
{
	cudaStreamAttrValue v, w;
	memset(&v, 0, sizeof(v));
	v.accessPolicyWindow.base_ptr = window;
	v.accessPolicyWindow.num_bytes = MIB;
	v.accessPolicyWindow.hitRatio = 0.6f;
	v.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
	v.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
	CK(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &v));
	memset(&w, 0, sizeof(w));
	CK(cudaStreamGetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &w));
	int apw_ok = w.accessPolicyWindow.base_ptr == window && w.accessPolicyWindow.num_bytes == MIB &&
		     w.accessPolicyWindow.hitRatio == 0.6f &&
		     w.accessPolicyWindow.hitProp == cudaAccessPropertyPersisting &&
		     w.accessPolicyWindow.missProp == cudaAccessPropertyStreaming;
	EXPECT(apw_ok);

	memset(&v, 0, sizeof(v));
	v.syncPolicy = cudaSyncPolicySpin;
	CK(cudaStreamSetAttribute(s, cudaStreamAttributeSynchronizationPolicy, &v));
	CK(cudaStreamGetAttribute(s, cudaStreamAttributeSynchronizationPolicy, &w));
	int sync_policy = (int)w.syncPolicy;
	EXPECT(sync_policy == cudaSyncPolicySpin);

	int least, greatest;
	CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
	memset(&v, 0, sizeof(v));
	v.priority = greatest;
	CK(cudaStreamSetAttribute(s, cudaStreamAttributePriority, &v));
	CK(cudaStreamGetAttribute(s, cudaStreamAttributePriority, &w));
	int prio = w.priority;
	EXPECT(prio == greatest);

	// the whole set goes to s2
	CK(cudaStreamCopyAttributes(s2, s));
	memset(&w, 0, sizeof(w));
	CK(cudaStreamGetAttribute(s2, cudaStreamAttributeAccessPolicyWindow, &w));
	int copied_apw = w.accessPolicyWindow.base_ptr == window && w.accessPolicyWindow.num_bytes == MIB;
	CK(cudaStreamGetAttribute(s2, cudaStreamAttributeSynchronizationPolicy, &w));
	int copied_sync = (int)w.syncPolicy;
	EXPECT(copied_apw && copied_sync == cudaSyncPolicySpin);

	// the window off again, persisting lines back to normal
	memset(&v, 0, sizeof(v));
	v.accessPolicyWindow.num_bytes = 0;
	CK(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &v));
	CK(cudaStreamSetAttribute(s2, cudaStreamAttributeAccessPolicyWindow, &v));
	CK(cudaCtxResetPersistingL2Cache());

	snprintf(streams_json, sizeof(streams_json),
		 "{\"apw_ok\":%s,\"sync_policy\":%d,\"priority\":%d,\"greatest\":%d,"
		 "\"copied_apw\":%s,\"copied_sync\":%d}",
		 apw_ok ? "true" : "false", sync_policy, prio, greatest, copied_apw ? "true" : "false",
		 copied_sync);
}

static char errors_json[1024];

// The error a call returned; the last error is cleared after it.
static int code(cudaError_t e)
{
	cudaGetLastError();
	return (int)e;
}

static void errors(cudaStream_t s, int bad_handles)
{
	cudaMemPool_t def, pool;
	CK(cudaDeviceGetDefaultMemPool(&def, 0));
	uint64_t v = 1;
	int *d, *m;
	CK(cudaMalloc((void **)&d, MIB));
	CK(cudaMallocManaged((void **)&m, MIB, cudaMemAttachGlobal));
	cudaMemLocation dev = { cudaMemLocationTypeDevice, 0 };
	cudaMemLocation dev7 = { cudaMemLocationTypeDevice, 7 };
	int out;

	int bad_attr = code(cudaMemPoolGetAttribute(def, (cudaMemPoolAttr)99, &v));
	int read_only = code(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReservedMemCurrent, &v));
	int high_nonzero = code(cudaMemPoolSetAttribute(def, cudaMemPoolAttrUsedMemHigh, &v));
	int destroy_default = code(cudaMemPoolDestroy(def));
	int prefetch_device_mem = code(cudaMemPrefetchAsync(d, MIB, dev, 0, s));
	int prefetch_past_end = code(cudaMemPrefetchAsync(m, 2 * MIB, dev, 0, s));
	int bad_advice = code(cudaMemAdvise(m, MIB, (cudaMemoryAdvise)99, dev));
	int no_such_device = code(cudaMemPrefetchAsync(m, MIB, dev7, 0, s));
	int bad_size = code(cudaMemRangeGetAttribute(&out, 3, cudaMemRangeAttributeReadMostly, m, MIB));
	cudaStreamAttrValue av;
	memset(&av, 0, sizeof(av));
	av.cooperative = 1;
	int launch_only_attr = code(cudaStreamSetAttribute(s, cudaLaunchAttributeCooperative, &av));
	memset(&av, 0, sizeof(av));
	av.accessPolicyWindow.num_bytes = MIB;
	av.accessPolicyWindow.hitRatio = 2.0f;
	int hit_ratio = code(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &av));
	EXPECT(bad_attr == cudaErrorInvalidValue);
	EXPECT(read_only == cudaErrorInvalidValue);
	EXPECT(high_nonzero == cudaErrorInvalidValue);
	EXPECT(destroy_default == cudaErrorInvalidValue);
	EXPECT(prefetch_device_mem == cudaErrorInvalidValue);
	EXPECT(prefetch_past_end == cudaErrorInvalidValue);
	EXPECT(bad_advice == cudaErrorInvalidValue);
	EXPECT(no_such_device == cudaErrorInvalidDevice);
	EXPECT(bad_size == cudaErrorInvalidValue);
	EXPECT(launch_only_attr == cudaErrorInvalidValue);
	EXPECT(hit_ratio == cudaErrorInvalidValue);

	// handles a real driver may not survive: simgpu must
	int garbage_pool = -1, destroyed_pool = -1, garbage_malloc = -1, garbage_stream = -1;
	if (bad_handles) {
		static char junk[256];
		cudaMemPoolProps props;
		memset(&props, 0, sizeof(props));
		props.allocType = cudaMemAllocationTypePinned;
		props.location.type = cudaMemLocationTypeDevice;
		garbage_pool = code(cudaMemPoolGetAttribute((cudaMemPool_t)junk,
							   cudaMemPoolAttrUsedMemCurrent, &v));
		CK(cudaMemPoolCreate(&pool, &props));
		CK(cudaMemPoolDestroy(pool));
		destroyed_pool = code(cudaMemPoolTrimTo(pool, 0));
		void *p = NULL;
		garbage_malloc = code(cudaMallocFromPoolAsync(&p, MIB, (cudaMemPool_t)junk, s));
		garbage_stream = code(cudaStreamSetAttribute((cudaStream_t)junk,
							    cudaStreamAttributePriority, &av));
		EXPECT(garbage_pool == cudaErrorInvalidValue);
		EXPECT(destroyed_pool == cudaErrorInvalidValue);
		EXPECT(garbage_malloc == cudaErrorInvalidValue && p == NULL);
		EXPECT(garbage_stream == cudaErrorInvalidResourceHandle);
	}
	CK(cudaStreamSynchronize(s));
	CK(cudaGetLastError());      // nothing sticky was left behind
	CK(cudaFree(d));
	CK(cudaFree(m));

	snprintf(errors_json, sizeof(errors_json),
		 "{\"bad_attr\":%d,\"read_only\":%d,\"high_nonzero\":%d,\"destroy_default\":%d,"
		 "\"prefetch_device_mem\":%d,\"prefetch_past_end\":%d,\"bad_advice\":%d,"
		 "\"no_such_device\":%d,\"bad_size\":%d,\"launch_only_attr\":%d,\"hit_ratio\":%d,"
		 "\"garbage_pool\":%d,\"destroyed_pool\":%d,\"garbage_malloc\":%d,"
		 "\"garbage_stream\":%d}",
		 bad_attr, read_only, high_nonzero, destroy_default, prefetch_device_mem,
		 prefetch_past_end, bad_advice, no_such_device, bad_size, launch_only_attr, hit_ratio,
		 garbage_pool, destroyed_pool, garbage_malloc, garbage_stream);
}

int main(int argc, char **argv)
{
	long long iters = 64;
	int bad_handles = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--iters"))
			iters = arg_int(argc, argv, &i, 1, 1000000);
		else if (!strcmp(argv[i], "--bad-handles"))
			bad_handles = 1;
		else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
			printf("usage: pools [--iters N] [--bad-handles]\n");
			return 0;
		} else
			fail("unknown option %s%s", argv[i], "");
	}
	int supported = 0, managed_ok = 0;
	CK(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, 0));
	CK(cudaDeviceGetAttribute(&managed_ok, cudaDevAttrConcurrentManagedAccess, 0));
	if (!supported || !managed_ok)
		fail("device lacks memory pools or concurrent managed access%s%s", "", "");

	cudaStream_t s, s2;
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
	void *window;
	CK(cudaMalloc(&window, MIB));

	pools(iters, s, s2);
	managed(s);
	streams(s, s2, window);
	errors(s, bad_handles);

	CK(cudaFree(window));
	CK(cudaStreamDestroy(s));
	CK(cudaStreamDestroy(s2));
	printf("{\"prog\":\"pools\",\"pools\":%s,\"managed\":%s,\"streams\":%s,\"errors\":%s,"
	       "\"mismatches\":[%s]}\n",
	       pools_json, managed_json, streams_json, errors_json, mism);
	return nmism ? 1 : 0;
}
