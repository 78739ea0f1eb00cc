"""simgpu's memory pools, managed-memory hints and stream attributes
(shim/simgpu/mempool.c, hints.c).

bench/progs/pools is plain CUDA that checks what holds on any GPU (bounds
where the driver has freedom) and prints its figures as JSON; here it runs
on simgpu, whose figures are exact: a pool allocation is one arena block of
the size asked for (rounded to 256 bytes), reserved memory is what the pool
holds in the arena, and cudaMemGetInfo sees it.  EDGE_CU adds what only
simgpu should be asked: double frees, a pool's maxSize, a full device, page
rounding of advised ranges, garbage handles.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ensure_simgpu, simgpu_env

ROOT = Path(__file__).resolve().parent.parent
SIMGPU_LIB = ROOT / "shim" / "lib" / "simgpu"
NVCC = shutil.which("nvcc")
PROG = ROOT / "bench" / "progs" / "pools"

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA 13 toolkit) not installed")

MIB = 1 << 20
INVALID_VALUE, INVALID_DEVICE, MEMORY_ALLOCATION, INVALID_HANDLE = 1, 101, 2, 400
CPU, INVALID_ID = -1, -2           # cudaCpuDeviceId, cudaInvalidDeviceId

EDGE_CU = r'''// simgpu-only edge cases of pools and hints (tests/test_simgpu_pools.py).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdint.h>
#include <cuda_runtime.h>

#define MIB (1u << 20)
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("FAIL %d %s -> %s\n", __LINE__, #x, cudaGetErrorName(e_)); exit(1); } } while (0)
#define EXPECT(c) do { if (!(c)) { printf("FAIL %d %s\n", __LINE__, #c); exit(1); } } while (0)
#define ERR(x, want) do { cudaError_t e_ = (x); cudaGetLastError(); if (e_ != (want)) { printf("FAIL %d %s -> %s\n", __LINE__, #x, cudaGetErrorName(e_)); exit(1); } } while (0)

__managed__ int mvar[2048];

static uint64_t attr(cudaMemPool_t p, cudaMemPoolAttr a) { uint64_t v; CK(cudaMemPoolGetAttribute(p, a, &v)); return v; }
static void set(cudaMemPool_t p, cudaMemPoolAttr a, uint64_t v) { CK(cudaMemPoolSetAttribute(p, a, &v)); }
static int last(const void *p, size_t n) { int v; CK(cudaMemRangeGetAttribute(&v, 4, cudaMemRangeAttributeLastPrefetchLocation, p, n)); return v; }

static cudaMemPool_t new_pool(size_t max)
{
	cudaMemPoolProps pr; memset(&pr, 0, sizeof(pr));
	pr.allocType = cudaMemAllocationTypePinned;
	pr.location.type = cudaMemLocationTypeDevice;
	pr.maxSize = max;
	cudaMemPool_t p; CK(cudaMemPoolCreate(&p, &pr));
	return p;
}

int main()
{
	cudaStream_t s; CK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, -3));
	cudaMemPool_t def; CK(cudaDeviceGetDefaultMemPool(&def, 0));
	void *p, *q, *r;

	/* the default pool, threshold 0: nothing kept after the sync */
	CK(cudaMallocAsync(&p, MIB + 1, s));
	EXPECT(attr(def, cudaMemPoolAttrUsedMemCurrent) == MIB + 256);
	CK(cudaFreeAsync(p, s));
	CK(cudaStreamSynchronize(s));
	EXPECT(attr(def, cudaMemPoolAttrReservedMemCurrent) == 0 && attr(def, cudaMemPoolAttrUsedMemHigh) == MIB + 256);

	/* freed twice, asynchronously or not */
	CK(cudaMallocAsync(&p, MIB, s));
	CK(cudaFreeAsync(p, s));
	ERR(cudaFreeAsync(p, s), cudaErrorInvalidValue);
	CK(cudaStreamSynchronize(s));
	ERR(cudaFree(p), cudaErrorInvalidValue);
	/* reused by its own stream before its free is reached, then freed by cudaFree */
	set(def, cudaMemPoolAttrReleaseThreshold, UINT64_MAX);
	CK(cudaMallocAsync(&p, MIB, s));
	CK(cudaFreeAsync(p, s));
	CK(cudaMallocAsync(&q, MIB, s));
	CK(cudaStreamSynchronize(s));
	EXPECT(attr(def, cudaMemPoolAttrUsedMemCurrent) == MIB);
	CK(cudaFree(q));
	/* its bytes stay in the pool's used figure, as on an H200 */
	EXPECT(attr(def, cudaMemPoolAttrUsedMemCurrent) == MIB);
	CK(cudaMemPoolTrimTo(def, 0));
	EXPECT(attr(def, cudaMemPoolAttrReservedMemCurrent) == 0);
	set(def, cudaMemPoolAttrReleaseThreshold, 0);

	/* maxSize bounds what a pool reserves; its own cache still serves */
	cudaMemPool_t small = new_pool(2 * MIB);
	set(small, cudaMemPoolAttrReleaseThreshold, UINT64_MAX);
	CK(cudaMallocFromPoolAsync(&p, MIB, small, s));
	CK(cudaMallocFromPoolAsync(&q, MIB, small, s));
	ERR(cudaMallocFromPoolAsync(&r, MIB, small, s), cudaErrorMemoryAllocation);
	EXPECT(r == NULL);
	CK(cudaFreeAsync(q, s));
	CK(cudaStreamSynchronize(s));
	CK(cudaMallocFromPoolAsync(&r, MIB, small, s));
	EXPECT(r == q && attr(small, cudaMemPoolAttrReservedMemCurrent) == 2 * MIB);
	/* destroyed with memory out: what is freed later goes back at once */
	CK(cudaMemPoolDestroy(small));
	CK(cudaFreeAsync(p, s));
	CK(cudaFreeAsync(r, s));
	CK(cudaStreamSynchronize(s));
	size_t fr, tot; CK(cudaMemGetInfo(&fr, &tot));
	EXPECT(fr == tot);

	/* a full device (SIMGPU_MEM_GIB=0.0625: 64 MiB): a pool gives its cache back to grow */
	cudaMemPool_t big = new_pool(0);
	set(big, cudaMemPoolAttrReleaseThreshold, UINT64_MAX);
	CK(cudaMallocFromPoolAsync(&p, 40 * MIB, big, s));
	CK(cudaFreeAsync(p, s));
	CK(cudaStreamSynchronize(s));
	EXPECT(attr(big, cudaMemPoolAttrReservedMemCurrent) == 40 * MIB);
	ERR(cudaMalloc(&q, 40 * MIB), cudaErrorMemoryAllocation);   /* the pool holds it */
	CK(cudaMallocFromPoolAsync(&q, 48 * MIB, big, s));
	EXPECT(attr(big, cudaMemPoolAttrReservedMemCurrent) == 48 * MIB);
	ERR(cudaMallocFromPoolAsync(&r, 48 * MIB, big, s), cudaErrorMemoryAllocation);
	CK(cudaFreeAsync(q, s));
	CK(cudaStreamSynchronize(s));
	CK(cudaMemPoolDestroy(big));
	CK(cudaMemGetInfo(&fr, &tot));
	EXPECT(fr == tot);

	/* pool creation and location checks */
	cudaMemPoolProps pr; memset(&pr, 0, sizeof(pr));
	pr.allocType = cudaMemAllocationTypePinned;
	pr.location.type = cudaMemLocationTypeDevice;
	pr.location.id = 3;
	ERR(cudaMemPoolCreate(&small, &pr), cudaErrorInvalidDevice);
	pr.location.id = 0; pr.allocType = cudaMemAllocationTypeInvalid;
	ERR(cudaMemPoolCreate(&small, &pr), cudaErrorInvalidValue);
	ERR(cudaMemPoolCreate(NULL, &pr), cudaErrorInvalidValue);
	ERR(cudaDeviceGetDefaultMemPool(&small, 1), cudaErrorInvalidDevice);
	ERR(cudaDeviceSetMemPool(0, (cudaMemPool_t)&pr), cudaErrorInvalidValue);
	cudaMemAccessDesc ad; memset(&ad, 0, sizeof(ad));
	ad.location.type = cudaMemLocationTypeDevice; ad.location.id = 1; ad.flags = cudaMemAccessFlagsProtReadWrite;
	ERR(cudaMemPoolSetAccess(def, &ad, 1), cudaErrorInvalidDevice);
	ERR(cudaMemPoolSetAttribute(def, cudaMemPoolAttrReleaseThreshold, NULL), cudaErrorInvalidValue);

	/* advice and prefetch of ranges that are not page-aligned: whole pages count */
	char *m; CK(cudaMallocManaged((void **)&m, 10000, cudaMemAttachGlobal));
	cudaMemLocation dev = { cudaMemLocationTypeDevice, 0 }, host = { cudaMemLocationTypeHost, 0 };
	CK(cudaMemPrefetchAsync(m + 100, 100, dev, 0, s));
	EXPECT(last(m, 50) == 0 && last(m + 4000, 96) == 0);
	EXPECT(last(m + 5000, 1000) == -2 && last(m, 10000) == -2);
	CK(cudaMemPrefetchAsync(m, 10000, host, 0, s));
	EXPECT(last(m, 10000) == cudaCpuDeviceId);
	ERR(cudaMemPrefetchAsync(m, 10001 + 256, dev, 0, s), cudaErrorInvalidValue);
	ERR(cudaMemPrefetchAsync(m, 0, dev, 0, s), cudaErrorInvalidValue);
	ERR(cudaMemPrefetchAsync(m, 100, dev, 1, s), cudaErrorInvalidValue);
	ERR(cudaMemPrefetchAsync(m, 100, dev, 0, (cudaStream_t)&pr), cudaErrorInvalidResourceHandle);
	ERR(cudaMemPrefetchAsync((void *)&pr, 100, dev, 0, s), cudaErrorInvalidValue);
	cudaMemLocation numa = { cudaMemLocationTypeHostNuma, 0 };
	ERR(cudaMemAdvise(m, 100, cudaMemAdviseSetAccessedBy, numa), cudaErrorInvalidValue);
	cudaMemLocation nowhere = { cudaMemLocationTypeInvalid, 0 };
	ERR(cudaMemAdvise(m, 100, cudaMemAdviseSetPreferredLocation, nowhere), cudaErrorInvalidValue);
	CK(cudaMemAdvise(m, 100, cudaMemAdviseSetPreferredLocation, numa));
	int t; CK(cudaMemRangeGetAttribute(&t, 4, cudaMemRangeAttributePreferredLocationType, m, 100));
	EXPECT(t == cudaMemLocationTypeHostNuma);
	/* the prefetch keeps its place in the stream */
	cudaEvent_t ev; CK(cudaEventCreate(&ev));
	CK(cudaMemPrefetchAsync(m, 10000, dev, 0, s));
	CK(cudaEventRecord(ev, s));
	CK(cudaEventSynchronize(ev));
	/* attach: the whole allocation only, never singly to the NULL stream */
	ERR(cudaStreamAttachMemAsync(s, m, 5000, cudaMemAttachSingle), cudaErrorInvalidValue);
	ERR(cudaStreamAttachMemAsync(s, m + 256, 0, cudaMemAttachSingle), cudaSuccess);
	ERR(cudaStreamAttachMemAsync(0, m, 0, cudaMemAttachSingle), cudaErrorInvalidValue);
	ERR(cudaStreamAttachMemAsync(s, m, 10000, 8), cudaErrorInvalidValue);
	CK(cudaStreamAttachMemAsync(s, m, 10000, cudaMemAttachHost));
	/* advice goes with the memory: a new allocation starts clean */
	CK(cudaMemAdvise(m, 10000, cudaMemAdviseSetReadMostly, dev));
	CK(cudaFree(m));
	CK(cudaMallocManaged((void **)&m, 10000, cudaMemAttachGlobal));
	CK(cudaMemRangeGetAttribute(&t, 4, cudaMemRangeAttributeReadMostly, m, 10000));
	EXPECT(t == 0 && last(m, 10000) == -2);
	CK(cudaFree(m));
	/* __managed__ variables are managed memory too */
	CK(cudaMemAdvise(mvar, sizeof(mvar), cudaMemAdviseSetReadMostly, dev));
	CK(cudaMemRangeGetAttribute(&t, 4, cudaMemRangeAttributeReadMostly, mvar, sizeof(mvar)));
	EXPECT(t == 1);

	/* stream attributes: a priority never set is the creation one */
	cudaStreamAttrValue v; memset(&v, 0, sizeof(v));
	CK(cudaStreamGetAttribute(s, cudaStreamAttributePriority, &v));
	EXPECT(v.priority == -3);
	CK(cudaStreamGetAttribute(s, cudaStreamAttributeSynchronizationPolicy, &v));
	EXPECT(v.syncPolicy == cudaSyncPolicyAuto);
	v.syncPolicy = (cudaSynchronizationPolicy)9;
	ERR(cudaStreamSetAttribute(s, cudaStreamAttributeSynchronizationPolicy, &v), cudaErrorInvalidValue);
	memset(&v, 0, sizeof(v));
	v.accessPolicyWindow.num_bytes = 1; v.accessPolicyWindow.missProp = cudaAccessPropertyPersisting;
	ERR(cudaStreamSetAttribute(s, cudaStreamAttributeAccessPolicyWindow, &v), cudaErrorInvalidValue);
	ERR(cudaStreamGetAttribute(s, cudaStreamAttributePriority, NULL), cudaErrorInvalidValue);
	ERR(cudaStreamCopyAttributes(s, (cudaStream_t)&pr), cudaErrorInvalidResourceHandle);
	v.priority = -1;
	CK(cudaStreamSetAttribute(cudaStreamPerThread, cudaStreamAttributePriority, &v));
	CK(cudaStreamGetAttribute(cudaStreamPerThread, cudaStreamAttributePriority, &v));
	EXPECT(v.priority == -1);

	CK(cudaStreamSynchronize(s));
	CK(cudaGetLastError());
	printf("EDGE PASS\n");
	return 0;
}
'''


@pytest.fixture(scope="module")
def bins(tmp_path_factory) -> Path:
    """pools (legacy default stream), poolsp (per-thread: the _ptsz entry points), edge."""
    ensure_simgpu()
    d = tmp_path_factory.mktemp("simgpu-pools")
    (d / "edge.cu").write_text(EDGE_CU)
    inc = ["-I", str(ROOT / "shim" / "simgpu"), "-I", str(ROOT / "bench" / "common")]
    main = str(PROG / "main.cu")
    jobs = [
        [NVCC, "-cudart", "shared", *inc, "-o", "pools", main],
        [NVCC, "-cudart", "shared", "--default-stream", "per-thread", *inc, "-o", "poolsp", main],
        [NVCC, "-cudart", "shared", "-o", "edge", "edge.cu"],
        ["cc", "-O2", "-shared", "-fPIC", "-Wall", *inc, "-o", "pools.twins.so", str(PROG / "twins.c")],
    ]
    running = [(cmd, subprocess.Popen(cmd, cwd=d, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
               for cmd in jobs]
    for cmd, p in running:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, f"{' '.join(cmd)} failed:\n{out}"
    # "<exe>.twins.so" next to the executable is where simgpu looks
    shutil.copy(d / "pools.twins.so", d / "poolsp.twins.so")
    return d


@pytest.fixture
def env(simdir):
    """A private simulated device."""
    return simgpu_env(simdir, SIMGPU_TIMESCALE=0.05)


def run_json(prog: Path, *args, env: dict[str, str]) -> dict:
    r = subprocess.run([str(prog), *args], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{prog.name} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def check_figures(j: dict) -> None:
    assert j["mismatches"] == []
    p = j["pools"]
    # one 1 MiB block served the whole alloc/free loop; 4 live blocks are
    # 4 MiB used, reserved and gone from cudaMemGetInfo
    assert (p["loop_used"], p["loop_reserved"], p["loop_used_high"]) == (0, MIB, MIB)
    assert (p["live_used"], p["live_reserved"], p["live_meminfo_drop"]) == (4 * MIB,) * 3
    assert p["freed_reserved"] == 4 * MIB
    assert p["cross_stream_reserved"] == 4 * MIB          # reused, not grown
    assert (p["trim1"], p["trim0"]) == (MIB, 0)
    # cudaFree of a 1 MiB pool block leaves it in the pool's used figure, so
    # the reset watermark is 1 MiB too (both as an H200 did, bench/RESULTS.md;
    # the GPU reserves in 32 MiB chunks where simgpu reserves blocks)
    assert (p["used_after_free"], p["used_after_devsync"], p["used_high_reset"]) == (MIB,) * 3
    assert (p["pool2_used"], p["pool2_after_sync"]) == (3 * MIB, 0)
    assert p["kernel_ok"] is True
    m = j["managed"]
    assert (m["read_mostly"], m["pref_lo"], m["pref_hi"], m["pref_all"], m["pref_type"]) == (1, 0, CPU, INVALID_ID, 1)
    assert (m["last_lo"], m["last_hi"], m["last_all"], m["last_type_hi"]) == (0, CPU, INVALID_ID, 2)
    assert m["read_mostly_after"] == [0, 1, 0]
    assert m["kernel_ok"] is True and m["attach_ok"] is True
    s = j["streams"]
    assert s == {"apw_ok": True, "sync_policy": 2, "priority": -5, "greatest": -5,
                 "copied_apw": True, "copied_sync": 2}


def test_pools_program_figures_and_errors(bins, env):
    j = run_json(bins / "pools", "--bad-handles", env=env)
    check_figures(j)
    e = j["errors"]
    for k in ("bad_attr", "read_only", "high_nonzero", "destroy_default", "prefetch_device_mem",
              "prefetch_past_end", "bad_advice", "bad_size", "launch_only_attr", "hit_ratio",
              "garbage_pool", "destroyed_pool", "garbage_malloc"):
        assert e[k] == INVALID_VALUE, k
    assert e["no_such_device"] == INVALID_DEVICE
    assert e["garbage_stream"] == INVALID_HANDLE


def test_per_thread_default_stream_build(bins, env):
    imports = subprocess.run(["nm", "-D", "--undefined-only", str(bins / "poolsp")],
                             capture_output=True, text=True).stdout
    for name in ("cudaMallocFromPoolAsync_ptsz", "cudaMemPrefetchAsync_ptsz",
                 "cudaStreamAttachMemAsync_ptsz", "cudaStreamSetAttribute_ptsz",
                 "cudaStreamGetAttribute_ptsz", "cudaStreamCopyAttributes_ptsz"):
        assert name in imports
    check_figures(run_json(bins / "poolsp", env=env))


def test_synchronous_mode_same_figures(bins, env):
    # SIMGPU_SYNC runs every queued operation at once, frees included
    check_figures(run_json(bins / "pools", "--iters", "16", env={**env, "SIMGPU_SYNC": "1"}))


def test_edge_cases(bins, env):
    r = subprocess.run([str(bins / "edge")], env={**env, "SIMGPU_MEM_GIB": "0.0625"},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "EDGE PASS" in r.stdout, r.stdout + r.stderr
