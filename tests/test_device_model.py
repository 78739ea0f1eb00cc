"""simgpu's device model (shim/simgpu/engine.c, simgpu_model.h): one test per
mechanism, each on small CUDA programs built here and run as processes on
one simulated device, each shown to fail with its mechanism switched off
(SIMGPU_MODEL_OFF); the fluid model kept as it was; the preset file equal to
the compiled-in defaults; and the engine's cost per kernel independent of
its number of blocks.

Times come from the model itself (SIMGPU_LAUNCH_LOG, SIMGPU_DEVICE_TRACE,
cudaEvent timings: modelled device time), so they do not depend on how
busy this machine is, as long as the processes meant to overlap do.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# modelled times at a timescale > 0: processes that must overlap in wall
# time (they start together at AT), or a host that must keep up with its
# device; run alone (`make test` runs serial tests after the parallel
# rest), where the other tests' load cannot move them
CO_RUN = pytest.mark.serial
SIMGPU = ROOT / "shim" / "lib" / "simgpu" / "libcudart.so.13"
NVCC = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"

MECH_CU = r'''// mech: kernels or copies of a given shape and cost, timed by events.
//   mech kernel FLOPS BYTES BLOCKS THREADS SMEM REPS STREAMS [AT [DELAY_MS]]
//   mech copy h2d|d2h MIB REPS [AT]
// AT: CLOCK_REALTIME second to start at (processes start together);
// DELAY_MS: then sleep that long first.  Prints MEDIAN_MS of the
// operations (each between two events on its own stream).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <time.h>
#include <vector>
#include <cuda_runtime.h>

__global__ void work_k(double flops, double bytes) { extern __shared__ char s[]; (void)s; }

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("FAIL %s -> %s\n", #x, cudaGetErrorName(e_)); return 1; } } while (0)

static void wait_until(double at)
{
	for (;;) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		double now = ts.tv_sec + ts.tv_nsec * 1e-9;
		if (now >= at) return;
		struct timespec d = { 0, (long)((at - now) * 1e9) };
		nanosleep(&d, NULL);
	}
}

int main(int argc, char **argv)
{
	if (argc < 3) { printf("usage: see mech.cu\n"); return 2; }
	int copy = !strcmp(argv[1], "copy");
	int reps, nstr = 1;
	double at = 0, delay = 0;
	if (copy) { reps = atoi(argv[4]); if (argc > 5) at = atof(argv[5]); }
	else { reps = atoi(argv[7]); nstr = atoi(argv[8]); if (argc > 9) at = atof(argv[9]); if (argc > 10) delay = atof(argv[10]); }
	std::vector<cudaStream_t> st(nstr);
	std::vector<cudaEvent_t> ev(2 * reps * nstr);
	for (auto &s : st) CK(cudaStreamCreate(&s));
	for (auto &e : ev) CK(cudaEventCreate(&e));
	size_t nb = copy ? (size_t)(atof(argv[3]) * 1048576) : 0;
	void *host = NULL, *dev = NULL;
	if (copy) { CK(cudaMallocHost(&host, nb)); CK(cudaMalloc(&dev, nb)); }
	work_k<<<1, 32>>>(0, 0);                       /* warm up: executor, twins */
	CK(cudaDeviceSynchronize());
	if (at > 0) wait_until(at);
	if (delay > 0) { struct timespec d = { (time_t)(delay / 1000), (long)(((long long)(delay * 1e6)) % 1000000000LL) }; nanosleep(&d, NULL); }
	for (int i = 0; i < reps; i++)
		for (int j = 0; j < nstr; j++) {
			cudaEvent_t *e = &ev[2 * (i * nstr + j)];
			CK(cudaEventRecord(e[0], st[j]));
			if (!copy)
				work_k<<<atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), st[j]>>>(atof(argv[2]), atof(argv[3]));
			else if (!strcmp(argv[2], "h2d"))
				CK(cudaMemcpyAsync(dev, host, nb, cudaMemcpyHostToDevice, st[j]));
			else
				CK(cudaMemcpyAsync(host, dev, nb, cudaMemcpyDeviceToHost, st[j]));
			CK(cudaEventRecord(e[1], st[j]));
		}
	CK(cudaDeviceSynchronize());
	std::vector<float> ms;
	for (size_t i = 0; i < ev.size(); i += 2) { float m; CK(cudaEventElapsedTime(&m, ev[i], ev[i + 1])); ms.push_back(m); }
	std::sort(ms.begin(), ms.end());
	printf("MEDIAN_MS %.4f MIN_MS %.4f MAX_MS %.4f\n", ms[ms.size() / 2], ms[0], ms.back());
	return 0;
}
'''

MECH_TWINS = r'''#include "simgpu_twin.h"
void simgpu_twin__Z6work_kdd(const simgpu_launch *l) { (void)l; }
void simgpu_cost__Z6work_kdd(const simgpu_launch *l, double *flops, double *bytes)
{ *flops = SIMGPU_ARG(l, 0, double); *bytes = SIMGPU_ARG(l, 1, double); }
'''

SM_FLOPS, BW, SMS = 500e9, 3350e9, 132
SM_BW, BW_SHARP, BW_BETA, BW_SHARE = 101.3e9, 2.32, 0.179, 0.83     # config.c's DRAM defaults


def dram_stretch(rho: float, sharp: float = BW_SHARP, beta: float = BW_BETA) -> float:
    """simgpu_model.h (bwq): how much longer memory time gets when the SMs
    pull rho x BW, the soft minimum of the pull and BW / (1 + beta)."""
    return (1 + (rho * (1 + beta)) ** sharp) ** (1 / sharp)




@pytest.fixture
def dev():
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    d = tempfile.mkdtemp(prefix="simgpu-model-", dir=base)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def env_for(dev: Path, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SIMGPU_", "COLOCATE_")) and k not in ("LD_PRELOAD", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}
    env["LD_LIBRARY_PATH"] = str(SIMGPU.parent)
    env.update(SIMGPU_DIR=str(dev / "sim"), SIMGPU_TIMESCALE="1", SIMGPU_LAUNCH_LOG=str(dev / "launch.jsonl"),
               SIMGPU_DEVICE_TRACE=str(dev / "trace.jsonl"))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start(mech: Path, env: dict[str, str], *args) -> subprocess.Popen:
    return subprocess.Popen([str(mech), *map(str, args)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(ps: list[subprocess.Popen]) -> list[float]:
    out = []
    for p in ps:
        o, e = p.communicate(timeout=120)
        assert p.returncode == 0, o + e
        out.append(float(o.split("MEDIAN_MS ")[1].split()[0]))
    return out


def records(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()] if path.exists() else []


def work_launches(dev: Path) -> list[dict]:
    return [r for r in records(dev / "launch.jsonl") if r["grid"] != [1, 1, 1] or r["flops"] > 0]


# ------------------------------------------------------------ 1. block dispatch

def hol_wait(mech: Path, dev: Path, wave_ms: float, **extra) -> tuple[dict, dict]:
    """A batch kernel of 4 full waves (132 SMs x 8 blocks of 256 threads),
    each block busy wave_ms; a QoS kernel of 8 blocks arrives ~30 ms later."""
    env = env_for(dev, **extra)
    flops = 4 * SMS * SM_FLOPS * wave_ms / 1e3
    at = time.time() + 0.5
    ps = [start(mech, env, "kernel", flops, 0, 4 * SMS * 8, 256, 0, 1, 1, at),
          start(mech, env, "kernel", 8 * 256 * 64, 0, 8, 256, 0, 1, 1, at, 30)]
    finish(ps)
    big, small = sorted(work_launches(dev), key=lambda r: -r["grid"][0])
    (dev / "launch.jsonl").unlink()
    return big, small


@CO_RUN
def test_blocks_few_block_kernel_waits_for_co_runner_blocks_to_retire(mech, dev):
    runs = {w: hol_wait(mech, dev, w) for w in (40.0, 80.0)}
    for w, (big, small) in runs.items():
        big_end = big["start_us"] + big["dur_us"]
        small_start = small["start_us"] + small["wait_us"]
        # left-over dispatch: its first block lands when the batch's last ones retire
        assert small_start == pytest.approx(big_end, abs=1.0), (w, big, small)
        assert small["wait_us"] > 0.5 * (4 * w * 1e3 - 30e3 - 20e3), (w, small)
    # and the delay scales with the co-runner's block duration
    w1, w2 = (runs[w][1]["wait_us"] for w in (40.0, 80.0))
    assert w2 > 1.6 * w1, (w1, w2)
    # without block dispatch (fluid SM shares) it starts at once
    big, small = hol_wait(mech, dev, 40.0, SIMGPU_MODEL_OFF="blocks")
    assert small["wait_us"] < 1.0, small


@CO_RUN
def test_blocks_small_kernel_leaves_its_sms_to_others(mech, dev):
    """8 blocks hold 8 SMs' worth of slots at most: a full-device kernel that
    arrives behind it starts at once and runs on the rest."""
    env = env_for(dev)
    at = time.time() + 0.5
    finish([start(mech, env, "kernel", 8 * SM_FLOPS * 0.2, 0, 8, 512, 0, 1, 1, at),
            start(mech, env, "kernel", SMS * SM_FLOPS * 0.05, 0, SMS * 4, 512, 0, 1, 1, at, 30)])
    small, big = sorted(work_launches(dev), key=lambda r: r["grid"][0])
    assert big["wait_us"] < 1.0 and big["start_us"] < small["start_us"] + small["dur_us"]


@CO_RUN
def test_blocks_too_few_warps_run_below_peak(mech, dev):
    """One block of 1 warp cannot hide latency: sat_warps (16) / 1 slower
    than a block of 16 warps doing the same work on one SM."""
    env = env_for(dev, SIMGPU_TIMESCALE="0.05")
    t32 = finish([start(mech, env, "kernel", SM_FLOPS * 0.01, 0, 1, 32, 0, 3, 1)])[0]
    t512 = finish([start(mech, env, "kernel", SM_FLOPS * 0.01, 0, 1, 512, 0, 3, 1)])[0]
    assert t512 == pytest.approx(10.0, rel=0.01)
    assert t32 / t512 == pytest.approx(16.0, rel=0.02)


# ------------------------------------------------------------ 2. co-residence

def pair_ms(mech: Path, dev: Path, flops: float, nbytes: float, **extra) -> tuple[float, list[float]]:
    """A kernel of 132 blocks x 512 threads (one block per SM, 1/4 of its
    threads) alone, then two processes of it at once at 100 % each."""
    env = env_for(dev, **extra)
    args = ("kernel", flops, nbytes, SMS, 512, 0, 40, 1)
    alone = finish([start(mech, env, *args)])[0]
    at = time.time() + 0.5
    return alone, finish([start(mech, env, *args, at), start(mech, env, *args, at)])


@CO_RUN
def test_cores_co_resident_kernels_slow_each_other_below_the_bandwidth_peak(mech, dev):
    flops = SMS * SM_FLOPS * 5e-3                     # 5 ms alone, compute-bound
    nbytes = 0.2 * BW * 5e-3                          # 20 % of the peak over that time
    alone, both = pair_ms(mech, dev, flops, nbytes)
    assert alone == pytest.approx(5.0, rel=0.02)
    # they share every SM's issue slots: about half speed, though 2 x 20 % < peak
    assert min(both) > 1.6 * alone, (alone, both)
    alone, both = pair_ms(mech, dev, flops, nbytes, SIMGPU_MODEL_OFF="cores")
    assert max(both) < 1.1 * alone, (alone, both)


# ------------------------------------------------------------ 3. DRAM queueing

def load_slowdown(mech: Path, dev: Path, n: int, **extra) -> float:
    """Two streams of one process each run a memory-bound kernel on n SMs
    (the process's MPS share): its time over what its SMs pull with DRAM
    idle (5 ms)."""
    pct = 100.0 * n / SMS * 2 + 0.01                 # both kernels' blocks fit side by side
    env = env_for(dev, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=f"{pct / 2:.4f}", SIMGPU_TIMESCALE="0.2", **extra)
    nbytes = n * SM_BW * 5e-3                         # 5 ms per kernel without queueing
    ms = finish([start(mech, env, "kernel", 0, nbytes, n * 8, 256, 0, 6, 2)])[0]
    return ms / 5.0


@CO_RUN
def test_bwq_memory_time_stretches_smoothly_to_dram_s_limit(mech, dev):
    """Two kernels pulling rho x BW together take dram_stretch(rho) longer:
    a little at low load, DRAM's limit, BW / (1 + beta), past it (the soft
    minimum fitted to an H100's memory-bound kernel on 12..132 SMs).  Without
    bwq: nothing below the peak, rho past it (the fluid model's scale)."""
    sms = (4, 16, 34)                                 # whole TPCs a kernel
    got = {n: load_slowdown(mech, dev, n) for n in sms}
    for n in sms:
        rho = 2 * n * SM_BW / BW
        assert got[n] == pytest.approx(dram_stretch(rho), rel=0.01), (n, rho, got)
    assert 1.01 < got[4] < 1.05 and 1.3 < got[16] < got[34], got   # smooth, not a knee
    lin = {n: load_slowdown(mech, dev, n, SIMGPU_MODEL_OFF="bwq") for n in (4, 34)}
    assert lin[4] == pytest.approx(1.0, rel=0.01), lin
    assert lin[34] == pytest.approx(2 * 34 * SM_BW / BW, rel=0.01), lin


def test_dram_shared_by_pull_to_the_power_bw_share():
    """Two memory-bound kernels in two MPS clients, on 26 and 104 SMs: they
    get DRAM's delivery for their summed pull, split by pull^bw_share, so the
    small one's share is above its 20 % of the SMs (0.83: the H100's and the
    H200's memory-bound pairs), and at bw_share = 1 it is just that."""
    if not SIMGPU.exists():
        pytest.skip("simgpu not built")
    small, big = 26, 104
    pull = (small + big) * SM_BW
    total = pull / dram_stretch(pull / BW)
    got = {}
    for share in (BW_SHARE, 1.0):
        p = defaults(mps=1, bw_share=share)
        nbytes = small * 8 * 1e6
        res = simulate(p, [kernel(blocks=small * 8, flops=0, bytes=nbytes, quota_sms=small, ctx=1),
                           kernel(blocks=big * 80, flops=0, bytes=big * 80 * 1e7, quota_sms=big, ctx=2)])
        got[share] = nbytes / (res[0][1] - res[0][0]) / total
        want = small ** share / (small ** share + big ** share)
        assert got[share] == pytest.approx(want, rel=0.01), (share, got, want)
    assert got[1.0] == pytest.approx(small / (small + big), rel=0.01)
    assert got[BW_SHARE] > 1.15 * got[1.0], got


def test_dram_never_delivers_more_than_its_limit_and_flops_never_speed_up():
    """A kernel on all 132 SMs moving fixed bytes, its flops per byte from 0
    to 30 (memory-bound to compute-bound): its bytes per second never pass
    DRAM's limit, BW / (1 + beta), and more flops never make it faster --
    alone, and beside a memory-bound co-runner whose share it takes.  (A
    kernel whose compute outlasted its loads once kept its whole pull:
    5900 GB/s at 11 flops a byte.)"""
    if not SIMGPU.exists():
        pytest.skip("simgpu not built")
    p = defaults()
    limit = BW / (1 + BW_BETA)
    blocks, nbytes = 132 * 8 * 20, 132 * 8 * 20 * 4e5
    prev = prev_pair = 0.0
    for fb in [0.5 * i for i in range(61)]:
        k = kernel(blocks=blocks, flops=fb * nbytes, bytes=nbytes)
        (t0, t1), = simulate(p, [k])
        assert nbytes / (t1 - t0) <= limit * 1.001, (fb, nbytes / (t1 - t0) / 1e9)
        assert t1 - t0 >= prev * (1 - 1e-9), (fb, t1 - t0, prev)
        prev = t1 - t0
        other = kernel(blocks=blocks, flops=0, bytes=nbytes, ctx=2, quota_sms=66)
        (a0, a1), (b0, b1) = simulate(p, [dict(k, quota_sms=66), other])
        assert a1 - a0 >= prev_pair * (1 - 1e-9), (fb, a1 - a0, prev_pair)
        prev_pair = a1 - a0
        both = min(a1, b1) - max(a0, b0)                # while both run, DRAM is shared
        assert both > 0 and 2 * nbytes / max(a1 - a0, b1 - b0) <= limit * 1.001, (fb, a1 - a0, b1 - b0)
    assert prev > 1.2 * nbytes / limit                # the sweep reached compute-bound
    # at 30 flops a byte on 66 SMs the kernel needs 1.1 TB/s: its compute
    # hides DRAM's latency beside the memory-bound co-runner, which it slows
    # only by what it takes (a model charging it its SMs' whole pull would
    # halve DRAM between them: 1404 GB/s each)
    k = kernel(blocks=blocks, flops=30 * nbytes, bytes=nbytes, quota_sms=66)
    (s0, s1), = simulate(p, [k])
    (a0, a1), (b0, b1) = simulate(p, [k, kernel(blocks=blocks, flops=0, bytes=nbytes, ctx=2, quota_sms=66)])
    assert a1 - a0 == pytest.approx(s1 - s0, rel=1e-3), (a1 - a0, s1 - s0)
    assert b1 < a1 and nbytes / (b1 - b0) > 1.1 * 1404e9, nbytes / (b1 - b0) / 1e9


# ------------------------------------------------------------ 4. time slicing

def sliced(mech: Path, dev: Path, **extra) -> list[dict]:
    # 4x slower than real time: a host late with its next launch (which
    # ends a context's hold of the device early) needs 4x the hiccup
    env = env_for(dev, **{"SIMGPU_MPS": "0", "SIMGPU_TIMESLICE_US": "2000", "SIMGPU_CTX_SWITCH_US": "300",
                          "SIMGPU_TIMESCALE": "4", **extra})
    at = time.time() + 0.5
    # each process: 12 kernels of 1.5 ms on 66 SMs; together they would fit
    args = ("kernel", 66 * SM_FLOPS * 1.5e-3, 0, 66 * 8, 256, 0, 12, 1, at)
    finish([start(mech, env, *args), start(mech, env, *args)])
    segs = records(dev / "trace.jsonl")
    (dev / "trace.jsonl").unlink()
    return sorted(segs, key=lambda s: s["t0_us"])


@CO_RUN
def test_slice_without_mps_processes_never_overlap_and_switches_cost(mech, dev):
    segs = sliced(mech, dev)
    assert len({s["pid"] for s in segs}) == 2
    for a, b in zip(segs, segs[1:]):
        if a["pid"] != b["pid"]:
            assert b["t0_us"] >= a["t1_us"] - 1e-3, (a, b)      # never overlap
    gaps = [b["t0_us"] - a["t1_us"] for a, b in zip(segs, segs[1:]) if a["pid"] != b["pid"]]
    assert len(gaps) >= 3
    # every switch costs the switch, no more: not even after a context's
    # last kernel, which no queued kernel follows.  (A switch can look
    # longer when the host was late with the next launch - the processes
    # run in wall time on a loaded 2-core machine - but never shorter.)
    assert all(g >= 295.0 for g in gaps), gaps
    assert sum(g == pytest.approx(300.0, abs=5.0) for g in gaps) >= 0.75 * len(gaps), gaps
    # a context whose next kernel is queued keeps the device for its slice
    # (2 ms: a kernel and part of the next, preempted), not one kernel
    runs, cur = [], [segs[0]]
    for a, b in zip(segs, segs[1:]):
        if b["pid"] == a["pid"] and b["t0_us"] - a["t1_us"] < 50:
            cur.append(b)
        else:
            runs.append(cur[-1]["t1_us"] - cur[0]["t0_us"])
            cur = [b]
    assert statistics.median(runs[:-2]) == pytest.approx(2000.0, rel=0.05), runs
    # with MPS the two processes' kernels run side by side
    env_segs = sliced(mech, dev, SIMGPU_MPS="1")
    overlap = any(a["pid"] != b["pid"] and b["t0_us"] < a["t1_us"] - 100
                  for a, b in zip(env_segs, env_segs[1:]))
    assert overlap


# ------------------------------------------------------------ 5. PCIe

def copy_ms(mech: Path, dev: Path, n: int, **extra) -> list[float]:
    """n processes each copying 8 MiB 20 times at once over a 1 GB/s link
    (slow, so that modelled time, not the CPU's memcpy, sets the pace)."""
    env = env_for(dev, SIMGPU_PCIE_H2D_GBS="1", **extra)
    at = time.time() + 0.8
    return finish([start(mech, env, "copy", "h2d", 8, 20, at) for _ in range(n)])


@CO_RUN
def test_pcie_processes_copying_at_once_share_it(mech, dev):
    alone = copy_ms(mech, dev, 1)[0]
    assert alone == pytest.approx(8 * 1048576 / 1e9 * 1e3, rel=0.02)
    both = copy_ms(mech, dev, 2)
    assert min(both) > 1.7 * alone, (alone, both)
    free = copy_ms(mech, dev, 2, SIMGPU_MODEL_OFF="pcie")
    assert max(free) < 1.1 * alone, (alone, free)


# ------------------------------------------------------------ the model as a library

class Params(ctypes.Structure):
    _fields_ = ([(n, ctypes.c_uint32) for n in ("abi", "mech", "mps", "pad")] +
                [(n, ctypes.c_double) for n in (
                    "sms bw sm_flops sm_bw sm_threads sm_blocks sm_regs sm_smem block_smem regs_default "
                    "sat_warps l1_gamma bw_sharp bw_beta bw_share slice_s switch_s pcie_h2d pcie_d2h").split()])


class Task(ctypes.Structure):
    _fields_ = ([(n, ctypes.c_double) for n in "arrive blocks threads regs smem flops bytes quota_sms".split()] +
                [("ctx", ctypes.c_int32), ("kind", ctypes.c_int32), ("start", ctypes.c_double),
                 ("end", ctypes.c_double)])


def model_params(env: dict[str, str]) -> dict:
    code = ("import ctypes,json,sys; sys.path.insert(0, %r); from test_device_model import Params; "
            "L=ctypes.CDLL(%r); p=Params(); L.simgpu_model_params_get(ctypes.byref(p)); "
            "print(json.dumps({f: getattr(p, f) for f, _ in Params._fields_}))") % (str(Path(__file__).parent), str(SIMGPU))
    r = subprocess.run([os.sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_preset_file_is_the_compiled_in_default(dev):
    """shim/simgpu/presets/h100.env documents the defaults: loading it must
    change nothing, and a preset file's value is overridden by the environment."""
    if not SIMGPU.exists():
        pytest.skip("simgpu not built")
    env = env_for(dev)
    base = model_params(env)
    preset = ROOT / "shim" / "simgpu" / "presets" / "h100.env"
    assert model_params({**env, "SIMGPU_PRESET": str(preset)}) == base
    custom = dev / "p.env"
    custom.write_text("# a slower device\nSIMGPU_SAT_WARPS=24   # warps\nSIMGPU_BW_SHARPNESS = 1.5\n")
    got = model_params({**env, "SIMGPU_PRESET": str(custom), "SIMGPU_BW_SHARPNESS": "4"})
    assert got["sat_warps"] == 24 and got["bw_sharp"] == 4
    assert model_params({**env, "SIMGPU_MODEL": "fluid"})["mech"] == 0
    assert model_params({**env, "SIMGPU_MODEL_OFF": "cores,pcie"})["mech"] == 0x1f & ~0x2 & ~0x10


def test_fluid_model_keeps_its_rates_under_a_preset(dev):
    """One SM's pull is the SM's (101.3 GB/s whatever the device's size;
    the H200's preset sets its own); the fluid model keeps its 3 BW / SMS
    and 25 GB/s PCIe under a preset that sets them (the H200's), and the
    environment overrides either model."""
    if not SIMGPU.exists():
        pytest.skip("simgpu not built")
    env = env_for(dev)
    assert model_params(env)["sm_bw"] == pytest.approx(101.3e9)
    assert model_params({**env, "SIMGPU_SMS": "4", "SIMGPU_BW_GBS": "400"})["sm_bw"] == pytest.approx(101.3e9)
    h200 = str(ROOT / "shim" / "simgpu" / "presets" / "h200.env")
    got = model_params({**env, "SIMGPU_PRESET": h200})
    assert got["sm_bw"] == pytest.approx(95.9e9) and got["pcie_h2d"] == pytest.approx(55.2e9)
    fluid = {**env, "SIMGPU_PRESET": h200, "SIMGPU_MODEL": "fluid"}
    got = model_params(fluid)
    assert got["sm_bw"] == pytest.approx(3 * 4800e9 / 132)
    assert got["pcie_h2d"] == got["pcie_d2h"] == pytest.approx(25e9)
    got = model_params({**fluid, "SIMGPU_SM_BW_GBS": "50", "SIMGPU_PCIE_D2H_GBS": "12"})
    assert got["sm_bw"] == pytest.approx(50e9) and got["pcie_d2h"] == pytest.approx(12e9)


def simulate(p: Params, tasks: list[dict]) -> list[tuple[float, float]]:
    lib = ctypes.CDLL(str(SIMGPU))
    arr = (Task * len(tasks))(*[Task(**t) for t in tasks])
    assert lib.simgpu_model_simulate(ctypes.byref(p), len(tasks), arr) == 0
    return [(t.start, t.end) for t in arr]


def defaults(**over) -> Params:
    lib = ctypes.CDLL(str(SIMGPU))
    p = Params()
    lib.simgpu_model_params_get(ctypes.byref(p))
    for k, v in over.items():
        setattr(p, k, v)
    return p


def kernel(**kw) -> dict:
    d = dict(arrive=0.0, blocks=1056, threads=256, regs=0, smem=0, flops=1e9, bytes=0, quota_sms=132, ctx=1, kind=0)
    d.update(kw)
    return d


def test_engine_cost_does_not_grow_with_blocks():
    """Waves that a kernel refills alone are folded: a grid of 10^9 blocks
    beside a co-runner costs the engine about what 10^4 blocks do."""
    if not SIMGPU.exists():
        pytest.skip("simgpu not built")
    p = defaults()

    def cost(blocks: float) -> float:
        ks = [kernel(blocks=blocks, flops=blocks * 1e5, bytes=blocks * 1e3),
              kernel(arrive=1e-4, blocks=blocks / 10, flops=blocks * 1e4, quota_sms=40, ctx=2)]
        t0 = time.perf_counter()
        for _ in range(20):
            simulate(p, ks)
        return time.perf_counter() - t0

    small, big = cost(1e4), cost(1e9)
    assert big < 5 * small + 0.05, (small, big)


def test_mps_limited_client_keeps_its_share_when_limits_oversubscribe():
    """A client limited to 50 % beside one at 100 % (limits past the device):
    the SMs are split evenly and the limited one's blocks take its half as
    the other's retire, whatever came first, so it runs as fast as alone at
    50 % -- as an H100 and an H200 did (1.00x and 1.03x, bench/calib/); with
    left-over dispatch across clients it waited for the whole co-runner
    kernel first.  Two clients at 100 % keep left-over dispatch."""
    if not SIMGPU.exists():
        pytest.skip("simgpu not built")
    p = defaults()
    big = dict(blocks=132 * 8 * 4, threads=256, flops=132 * 8 * 4 * 1e6)
    solo = simulate(p, [kernel(**big, quota_sms=66, ctx=2)])[0]
    alone_half = solo[1] - solo[0]
    co, victim = simulate(p, [kernel(**big, quota_sms=132, ctx=1), kernel(**big, quota_sms=66, ctx=2)])
    assert victim[0] <= co[0] + 1.01 * alone_half / 8, (victim, co)     # after the co-runner's first wave
    # as fast as alone at 50 %, but for the co-runner's last wave: its
    # demand then fits the device, the shares end, and its blocks are
    # counted over every SM (co-residence is counted, not placed)
    assert victim[1] - victim[0] == pytest.approx(alone_half, rel=0.05), (victim, alone_half)
    # both unlimited: the later one waits behind the earlier one's blocks
    co, late = simulate(p, [kernel(**big, quota_sms=132, ctx=1), kernel(**big, quota_sms=132, ctx=2)])
    assert late[0] >= co[1] - 1.01 * (co[1] - co[0]) / 4, (late, co)


def test_more_limited_clients_than_sms_all_finish():
    """Three clients limited to 1 SM on a 2-SM device: shares are whole SMs,
    so one waits for the others' kernels and then runs (a share of 2/3 SM
    each once reserved room no block could fill, and nothing ever ran)."""
    if not SIMGPU.exists():
        pytest.skip("simgpu not built")
    ks = [kernel(blocks=4, threads=1024, regs=64, flops=4e6, quota_sms=1, ctx=c) for c in (1, 2, 3)]
    res = simulate(defaults(mps=1, sms=2), ks)
    assert all(math.isfinite(e) and e > 0 for _, e in res), res
    assert sorted(e for _, e in res) == pytest.approx([8e-6, 8e-6, 1.6e-5]), res


def test_folded_waves_give_the_same_times_as_wave_by_wave():
    """Folding (a kernel's waves as one cohort's work) is exact: random
    mixes of kernels, with and without MPS, on small devices where waves,
    caps and left-over room interact, give the same start and end times as
    the engine handling every wave as an event (SIMGPU_M_NOFOLD)."""
    import random
    rng = random.Random(7)
    worst = 0.0
    for _ in range(300):
        mps = rng.random() < 0.7
        base = dict(mps=1 if mps else 0, sms=rng.choice([2, 4, 8, 132]))
        ts = []
        for _ in range(rng.randint(2, 4)):
            b = rng.randint(1, 400)
            t = kernel(arrive=rng.random() * 2e-5, blocks=b, threads=rng.choice([32, 64, 256, 1024]),
                       smem=rng.choice([0, 0, 40000]), flops=b * rng.choice([0, 1e4, 1e5, 1e6]),
                       bytes=b * rng.choice([0, 1e3, 1e5]), quota_sms=rng.choice([1, 2, 3, 8, 132]),
                       ctx=rng.randint(1, 3))
            if t["flops"] == 0 and t["bytes"] == 0:
                t["flops"] = 1e5 * b
            ts.append(t)
        a = simulate(defaults(**base), ts)
        b = simulate(defaults(**base, mech=0x1f | 0x100), ts)
        for (s1, e1), (s2, e2) in zip(a, b):
            worst = max(worst, abs(s1 - s2) / max(e2, 1e-12), abs(e1 - e2) / max(e2, 1e-12))
    assert worst < 1e-9, worst


def test_fluid_model_is_the_model_before():
    """SIMGPU_MODEL=fluid (no mechanism): a kernel's time is
    max(flops / (s sm_flops), bytes / min(s sm_bw, bw)) on s SMs (packed by
    threads), shares proportional when SM demands pass the device."""
    p = defaults(mech=0)
    (s, e), = simulate(p, [kernel(blocks=100, threads=256, flops=1e9)])   # ceil(100 / 8) = 13 SMs
    assert e == pytest.approx(1e9 / (13 * SM_FLOPS), rel=1e-9)
    (s, e), = simulate(p, [kernel(blocks=1056, flops=0, bytes=1e9)])
    assert e == pytest.approx(1e9 / BW, rel=1e-9)
    # two full-device compute kernels: half the SMs each, at once
    r = simulate(p, [kernel(), kernel(ctx=2)])
    assert r[1][0] == 0 and r[0][1] == pytest.approx(2e9 / (SMS * SM_FLOPS) / 2 * 2, rel=1e-9)


def test_simulate_rejects_bad_input():
    if not SIMGPU.exists():
        pytest.skip("simgpu not built")
    lib = ctypes.CDLL(str(SIMGPU))
    p = defaults()
    bad = (Task * 1)(Task(**kernel(flops=float("nan"))))
    assert lib.simgpu_model_simulate(ctypes.byref(p), 1, bad) == -1
    p.abi = 99
    assert lib.simgpu_model_simulate(ctypes.byref(p), 0, None) == -1
    p = defaults(slice_s=0.0, mps=0)          # contexts would switch forever
    two = (Task * 2)(Task(**kernel()), Task(**kernel(ctx=2)))
    assert lib.simgpu_model_simulate(ctypes.byref(p), 2, two) == -1


# ------------------------------------------------------------ occupancy from the cubin

OCC_CU = r'''// occ: a kernel with 48 KiB of static shared memory and one without, same work
#include <cstdio>
#include <cuda_runtime.h>

__global__ void k_smem(double flops, float *out)
{
	__shared__ float s[12288];
	s[threadIdx.x] = threadIdx.x;
	__syncthreads();
	out[blockIdx.x] = s[(threadIdx.x + 1) % blockDim.x];
}
__global__ void k_plain(double flops, float *out) { out[blockIdx.x] = flops; }

int main()
{
	cudaFuncAttributes a;
	int n;
	float *out;
	cudaEvent_t e[3];
	cudaMalloc(&out, 1 << 20);
	for (auto &x : e) cudaEventCreate(&x);
	if (cudaFuncGetAttributes(&a, k_smem) != cudaSuccess) return 1;
	cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_smem, 64, 0);
	printf("smem regs=%d shared=%zu occ64=%d\n", a.numRegs, a.sharedSizeBytes, n);
	cudaFuncGetAttributes(&a, k_plain);
	cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, k_plain, 64, 0);
	printf("plain regs=%d shared=%zu occ64=%d\n", a.numRegs, a.sharedSizeBytes, n);
	k_smem<<<1, 64>>>(0, out);            /* warm up: first launches resolve */
	k_plain<<<1, 64>>>(0, out);
	cudaDeviceSynchronize();
	/* the device busy for 48 ms first, so that what follows is queued
	 * before it may start: a host late with a launch (a loaded machine, at
	 * timescale 0.05 33 us of wall time is 0.67 ms of device time) would
	 * otherwise start a kernel late and count the gap in its time */
	k_plain<<<132 * 16, 64>>>(132 * 16 * 500e9 * 3e-3, out);
	/* 132 x 16 blocks of 64 threads, 1 ms of one SM's flops each */
	cudaEventRecord(e[0]);
	k_smem<<<132 * 16, 64>>>(132 * 16 * 500e9 * 1e-3, out);
	cudaEventRecord(e[1]);
	k_plain<<<132 * 16, 64>>>(132 * 16 * 500e9 * 1e-3, out);
	cudaEventRecord(e[2]);
	cudaEventSynchronize(e[2]);
	float t1, t2;
	cudaEventElapsedTime(&t1, e[0], e[1]);
	cudaEventElapsedTime(&t2, e[1], e[2]);
	printf("ms smem=%.4f plain=%.4f\n", t1, t2);
	return 0;
}
'''

OCC_TWINS = r'''#include "simgpu_twin.h"
void simgpu_twin__Z6k_smemdPf(const simgpu_launch *l) { (void)l; }
void simgpu_cost__Z6k_smemdPf(const simgpu_launch *l, double *f, double *b) { *f = SIMGPU_ARG(l, 0, double); *b = 0; }
void simgpu_twin__Z7k_plaindPf(const simgpu_launch *l) { (void)l; }
void simgpu_cost__Z7k_plaindPf(const simgpu_launch *l, double *f, double *b) { *f = SIMGPU_ARG(l, 0, double); *b = 0; }
'''


@CO_RUN
def test_blocks_occupancy_comes_from_the_cubin(dev, tmp_path):
    """Registers and static shared memory per block are read from the
    kernel's cubin, as ptxas reports them; cudaFuncGetAttributes and the
    occupancy calculator answer from them, and the model uses them: 48 KiB
    per block leaves 4 blocks of 2 warps on an SM, too few warps to reach its
    peak (16), so the same work (16 blocks per SM) takes twice as long as
    without (16 blocks of 2 warps at once)."""
    if not SIMGPU.exists():
        pytest.skip("simgpu not built")
    (tmp_path / "occ.cu").write_text(OCC_CU)
    (tmp_path / "twins.c").write_text(OCC_TWINS)
    r = subprocess.run([NVCC, "-cudart", "shared", "-arch", "sm_90", "--resource-usage", "-o", "occ", "occ.cu"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    import re
    ptxas = {m.group(1): (int(m.group(2)), int(m.group(3) or 0)) for m in re.finditer(
        r"Function properties for (\w+)[\s\S]*?Used (\d+) registers(?:.*?(\d+) bytes smem)?", r.stdout + r.stderr)}
    r = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-I", str(ROOT / "shim" / "simgpu"), "-o", "occ.twins.so",
                        "twins.c"], cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(tmp_path / "occ")], env=env_for(dev, SIMGPU_TIMESCALE="0.05"),
                         capture_output=True, text=True, timeout=60).stdout
    got = {m.group(1): (int(m.group(2)), int(m.group(3)), int(m.group(4))) for m in re.finditer(
        r"(smem|plain) regs=(\d+) shared=(\d+) occ64=(\d+)", out)}
    assert got["smem"][1] == 48 * 1024 and got["plain"][1] == 0, out
    assert got["smem"][0] == ptxas["_Z6k_smemdPf"][0] and got["plain"][0] == ptxas["_Z7k_plaindPf"][0], (out, ptxas)
    assert got["smem"][2] == 4 and got["plain"][2] == 32, out   # 228 KiB / (48 + 1) KiB; 32 blocks
    ms = dict(re.findall(r"(smem|plain)=([0-9.]+)", out.split("ms ")[1]))
    assert float(ms["plain"]) == pytest.approx(16.0, rel=0.01)
    assert float(ms["smem"]) / float(ms["plain"]) == pytest.approx(2.0, rel=0.02), out
