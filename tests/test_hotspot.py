"""bench/rodinia/hotspot on simgpu: the pyramid (temporal blocking) kernel
gives the plain step-by-step result bit for bit for every pyramid height,
--duration reruns the whole computation and prints THROUGHPUT, the cost
function counts what the kernel does, and the device model sees the default
input as compute-bound (C-Laius's class for hotspot).

Classification, for the device pinned in conftest.PINNED_DEVICE (132 SMs at 500 GFLOP/s,
3350 GB/s; launch overhead 0; see tests/test_rodinia_mem.py): a memory-bound
kernel takes 1.39x longer at quota 20 % than at 100 % (2026 against 2808
GB/s), a compute-bound one that fills the device 5.08x.  A kernel of F
operations and B bytes is compute-bound at 20 % when F/B > 13 000 / 2026 =
6.4, memory-bound at 100 % while F/B < 66 000 / 2808 = 23.5, and between the
two gives t(20)/t(100) = (F/B) * 2808 / 13 000: 2.1 needs F/B >= 9.7 and a
grid of at least 2.1 * 26 = 55 SMs.  The default input (512 x 512, pyramid
2) has F/B = 10.3 (2.2x) and 1849 blocks.
"""
from __future__ import annotations

import ctypes
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import pinned_sim_env

from shim import paths

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "bench" / "bin"
EXE, TWINS = BIN / "hotspot", BIN / "hotspot.twins.so"
STEP = "_Z12hotspot_stepPKfS0_Pfiifffff"
PYRAMID = "_Z15hotspot_pyramidPKfS0_Pfiiifffff"
BLOCK = 16

pytestmark = pytest.mark.skipif(
    not EXE.exists() or not TWINS.exists() or not paths.SIMGPU_CUDART.exists(),
    reason="hotspot or simgpu not built (make build)")



def run(tmp: Path, *args: str, exe: Path = EXE, **extra: str) -> subprocess.CompletedProcess:
    tmp.mkdir(parents=True, exist_ok=True)
    return subprocess.run([str(exe), *args], env=pinned_sim_env(tmp, **extra), capture_output=True,
                          text=True, timeout=60)


def fields(output: str, tag: str) -> dict[str, str]:
    """key=value pairs of the line that starts with tag."""
    m = re.search(rf"^{tag} (.*)$", output, re.M)
    assert m, f"no {tag} line in:\n{output}"
    return dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv)


def report(tmp: Path) -> dict[str, dict]:
    rows = [json.loads(ln) for ln in (tmp / "report.jsonl").read_text().splitlines() if ln]
    return {r["name"]: r for r in rows}


# odd size: partial blocks on both edges; 7 steps: P=2 and P=3 end with a
# shorter launch (2+2+2+1, 3+3+1)
SMALL = ("--size", "45", "--iters", "7")


def test_every_pyramid_height_gives_the_plain_steps_bits(tmp_path):
    hashes = {}
    for p in (1, 2, 3, 7):
        d = tmp_path / f"p{p}"
        res = run(d, *SMALL, "--pyramid", str(p), "--check", SIMGPU_DEBUG="1")
        out = res.stdout
        assert res.returncode == 0 and "PASS hotspot" in out, out + res.stderr
        assert fields(out, "HOTSPOT")["max_err"] == "0"          # exact, not within 1e-3
        hashes[p] = fields(out, "CHECK")["fnv1a64"]
        launches = int(fields(out, "STATS")["launches"])
        assert launches == math.ceil(7 / p)                       # the last one does the rest
        kernel = STEP if p == 1 else PYRAMID
        assert re.search(rf"{kernel}: twin yes, cost yes", res.stderr), res.stderr
        rows = report(d)
        assert set(rows) == {kernel}
        assert rows[kernel]["launches"] == launches and rows[kernel]["twin"] is True
    assert len(set(hashes.values())) == 1, hashes
    # the default is Rodinia's pyramid height 2
    res = run(tmp_path / "default", *SMALL, "--check")
    assert fields(res.stdout, "CHECK")["fnv1a64"] == hashes[1]
    assert fields(res.stdout, "STATS")["launches"] == "4"
    assert fields(res.stdout, "HOTSPOT")["pyramid"] == "2"


def test_the_check_fails_when_the_pyramid_does_nothing(tmp_path):
    """Copied away from its twins the kernel is a timed no-op: the check must say so."""
    lone = tmp_path / "hotspot"
    shutil.copy(EXE, lone)
    res = run(tmp_path, *SMALL, "--pyramid", "3", "--check", exe=lone)
    assert res.returncode != 0 and "FAIL hotspot" in res.stdout, res.stdout + res.stderr
    assert report(tmp_path)[PYRAMID]["twin"] is False


def test_repeat_reruns_everything_and_prints_throughput(tmp_path):
    res = run(tmp_path, "--size", "40", "--iters", "5", "--repeat", "3", "--check")
    assert res.returncode == 0 and "PASS hotspot" in res.stdout, res.stdout + res.stderr
    grid = 40 * 40 * 4
    assert {k: int(v) for k, v in fields(res.stdout, "STATS").items()} == \
        {"launches": 3 * 3, "h2d_bytes": grid + 3 * grid, "d2h_bytes": grid}
    tp = fields(res.stdout, "THROUGHPUT hotspot")
    assert int(tp["iters"]) == 3 and float(tp["seconds"]) > 0


def test_duration_keeps_rerunning_the_whole_computation(tmp_path):
    res = run(tmp_path, "--size", "32", "--iters", "4", "--duration", "0.2", "--check")
    assert res.returncode == 0 and "PASS hotspot" in res.stdout, res.stdout + res.stderr
    tp = fields(res.stdout, "THROUGHPUT hotspot")
    runs, seconds = int(tp["iters"]), float(tp["seconds"])
    assert runs >= 2 and seconds >= 0.2
    assert float(tp["iters_per_s"]) == pytest.approx(runs / seconds, rel=0.01)
    assert int(fields(res.stdout, "STATS")["launches"]) == 2 * runs
    # every run starts again from the initial temperatures: same result as one run
    once = run(tmp_path / "once", "--size", "32", "--iters", "4", "--check")
    assert fields(res.stdout, "CHECK") == fields(once.stdout, "CHECK")


def test_bad_options_are_refused(tmp_path):
    for args in (("--pyramid", "0"), ("--pyramid", "8"), ("--duration", "-1"),
                 ("--duration", "x")):
        res = run(tmp_path, *args)
        assert res.returncode != 0 and "FAIL hotspot bad value" in res.stdout, (args, res.stdout)


# ---------------------------------------------------------------- the cost function

class Dim3(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class Launch(ctypes.Structure):
    _fields_ = [("grid", Dim3), ("block", Dim3), ("shmem", ctypes.c_size_t),
                ("args", ctypes.POINTER(ctypes.c_void_p))]


def twin_cost(rows: int, cols: int, steps: int) -> tuple[float, float]:
    """(operations, bytes) the twins' cost function gives main.cu's launch."""
    out = BLOCK - 2 * steps
    vals = [ctypes.c_void_p(0)] * 3 + [ctypes.c_int(rows), ctypes.c_int(cols),
                                       ctypes.c_int(steps)] + [ctypes.c_float(1.0)] * 5
    args = (ctypes.c_void_p * len(vals))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p)
                                           for v in vals])
    launch = Launch(Dim3(-(-cols // out), -(-rows // out), 1), Dim3(BLOCK, BLOCK, 1), 0, args)
    ops, nbytes = ctypes.c_double(), ctypes.c_double()
    fn = getattr(ctypes.CDLL(str(TWINS)), f"simgpu_cost_{PYRAMID}")
    fn(ctypes.byref(launch), ctypes.byref(ops), ctypes.byref(nbytes))
    return ops.value, nbytes.value


def counted(rows: int, cols: int, steps: int) -> tuple[int, int]:
    """The same, thread by thread, from the rules stated in twins.c."""
    out = BLOCK - 2 * steps
    ops = nbytes = 0
    for by in range(-(-rows // out)):
        for bx in range(-(-cols // out)):
            for ty in range(BLOCK):
                for tx in range(BLOCK):
                    gy, gx = by * out - steps + ty, bx * out - steps + tx
                    ops += 45 + 12 * steps              # every thread
                    if not (0 <= gy < rows and 0 <= gx < cols):
                        continue
                    ops += 7
                    nbytes += 4                         # its tile cell
                    for k in range(steps):
                        if k < ty < BLOCK - 1 - k and k < tx < BLOCK - 1 - k:
                            ops += 14
                            nbytes += 4 * (k == 0)      # its power, once
                    if steps <= ty < BLOCK - steps and steps <= tx < BLOCK - steps:
                        nbytes += 4                     # written back
    return ops, nbytes


@pytest.mark.parametrize("rows,cols,steps", [(45, 45, 2), (30, 61, 3), (16, 16, 1), (20, 9, 7)])
def test_cost_counts_every_cell_the_pyramid_loads_computes_and_stores(rows, cols, steps):
    assert twin_cost(rows, cols, steps) == counted(rows, cols, steps)


def test_cost_of_the_default_launch():
    """512 x 512, 2 steps, 43 x 43 blocks: about 256 tile + 196 power + 144
    stored floats per 144 cells written, where two plain steps move
    2 x (324 / 256 + 2) per cell; about 85 operations per cell and step."""
    ops, nbytes = twin_cost(512, 512, 2)
    cells = 512 * 512
    assert nbytes / cells == pytest.approx(4 * (256 + 196 + 144) / 144, rel=0.02)
    assert ops / (2 * cells) == pytest.approx(85, rel=0.02)
    assert ops / nbytes == pytest.approx(10.3, abs=0.1)


# ---------------------------------------------------------------- the device model

def modelled_us(tmp: Path, quota: int, *args: str) -> dict[str, float]:
    """Modelled kernel time per kernel of one run at an SM quota."""
    d = tmp / f"q{quota}"
    # a kernel without a cost function would get simgpu's default work, here
    # made memory-bound: only hotspot's own cost function can pass
    res = run(d, *args, SIMGPU_LAUNCH_US="0", CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(quota),
              SIMGPU_DEFAULT_FLOPS_PER_THREAD="0", SIMGPU_DEFAULT_BYTES_PER_THREAD="1000")
    assert res.returncode == 0 and "PASS hotspot" in res.stdout, res.stdout + res.stderr
    rows = report(d)
    assert all(r["twin"] for r in rows.values())
    return {name: r["modelled_us"] for name, r in rows.items()}


def test_compute_bound_at_the_default_input(tmp_path):
    t20, t100 = (modelled_us(tmp_path, q) for q in (20, 100))
    assert set(t20) == set(t100) == {PYRAMID}
    assert t100[PYRAMID] > 0
    # memory-bound: 1.39; compute-bound at 20 % and not at 100 %: 2.2 (the
    # module docstring; 2.23 with DRAM's soft limit); all-compute would be 5.08
    assert 2.1 <= t20[PYRAMID] / t100[PYRAMID] <= 2.5, (t20, t100)


def test_without_the_pyramid_it_is_memory_bound(tmp_path):
    """P = 1 (the plain step kernel) is what the pyramid changes: 1.39x."""
    t20, t100 = (modelled_us(tmp_path, q, "--pyramid", "1") for q in (20, 100))
    assert set(t20) == {STEP}
    assert 1.3 < t20[STEP] / t100[STEP] < 1.8, (t20, t100)


# ---------------------------------------------------------------- forwarded to a worker

def test_forwarded_pyramid_gives_the_same_bits():
    """Every pyramid launch (the shorter last one included) run by a
    process-pool worker at 20 %, through the same twins: the result and the
    counters of a local run."""
    from processpool.rig import WORKER, Rig
    if not WORKER.exists():
        pytest.skip("colocate-worker not built")
    rig = Rig()
    try:
        rig.start_worker(1, 20)
        args = ("--size", "45", "--iters", "7", "--pyramid", "3", "--repeat", "3", "--check")
        out, _, local = rig.run("hotspot", *args, **rig.fast)
        fout, ferr, fwd = rig.run("hotspot", *args, routes=1)
    finally:
        rig.close()
    assert "PASS hotspot" in fout, fout + ferr
    assert fields(fout, "CHECK") == fields(out, "CHECK")
    assert fields(fout, "STATS") == fields(out, "STATS")
    assert local["forwarded"] == 0
    assert fwd["forwarded"] == fwd["launches"] == 3 * 3
