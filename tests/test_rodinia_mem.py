"""The memory-intensive Rodinia batch apps (bfs, btree, pathfinder, nw) on
simgpu: their results match their CPU references through the host twins,
the shim counts what they say they did, and simgpu's device model sees them
as memory-bound.

Classification thresholds, for the device pinned in conftest.PINNED_DEVICE (132 SMs,
500 GFLOP/s, 3350 GB/s, and simgpu's DRAM model of 2026-11-28: 101.3 GB/s
pulled per SM, DRAM delivering at most 84.8 % of its peak), with the launch
overhead set to 0 because it is the same at every quota and only pulls every
ratio towards 1:

  * a compute-bound kernel that fills the device takes 132 / 26 = 5.08x
    longer at quota 20 % (26 SMs) than at 100 %;
  * a memory-bound one gets 2026 GB/s at 20 %, 2688 at 50 % and 2808 at
    100 % (simgpu_model.h, bwq): 1.39x and 1.04x (the H100 gave 1.43x and
    1.04x, bench/calib/h100-2026-11-27.jsonl).

A compute-bound kernel whose grid fills only S < 132 SMs gives S / 26
instead, and is flat past S SMs too, so "flat" alone does not tell the
two apart; the ceiling does.  The thresholds:

  * every app: t(20)/t(100) < 2.5 (clearly below 5) and t(50)/t(100) <
    1.05 (DRAM nearly saturated from half the SMs up);
  * apps whose wide input fills at least 47 SMs (bfs, btree, pathfinder):
    1.3 < t(20)/t(100) < 1.8 - about the 1.39 of a memory-bound kernel
    (a compute-bound grid of 47+ SMs gives 1.8 or more), and clearly more
    than 1: with few SMs the quota still matters, so their cost
    functions hand the model real bytes;
  * nw: t(20)/t(100) < 1.05.  A diagonal of N/16 blocks of 16 threads fits
    on N/512 SMs of the model, so nw's time does not depend on the quota.

The classification runs make simgpu's default work (for a kernel without a
cost function) compute-bound, so only the apps' own cost functions pass
(nw would pass either way; that its kernels have cost functions is checked
with simgpu's debug log).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import RODINIA_SMALL, pinned_sim_env

from shim import paths

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "bench" / "bin"
COLOCATE = [sys.executable, "-m", "controlplane.cli"]


@dataclass(frozen=True)
class App:
    small: tuple[str, ...]      # runs in a fraction of a second, --check exact
    wide: tuple[str, ...]       # grids that fill more than 26 SMs of the model
    kernels: frozenset[str]     # mangled names of all its kernels
    fills_device: bool          # its wide input fills >= 47 SMs at quota 100


APPS = {
    "bfs": App(tuple(RODINIA_SMALL["bfs"]), ("--size", "200000"),
               frozenset({"_Z10bfs_expandPK4NodePKiPbS4_PKbPii", "_Z10bfs_updatePbS_S_S_i"}),
               True),
    "btree": App(tuple(RODINIA_SMALL["btree"]),
                 ("--size", "100000", "--queries", "2000", "--ranges", "2000"),
                 frozenset({"_Z5findKiPK5knodeiPKiS3_Pi", "_Z10findRangeKiPK5knodeiPKiS3_PiS4_"}),
                 True),
    "pathfinder": App(tuple(RODINIA_SMALL["pathfinder"]),
                      ("--cols", "100000", "--rows", "41", "--pyramid", "20"),
                      frozenset({"_Z14dynproc_kerneliPKiS0_Piiii"}), True),
    "nw": App(tuple(RODINIA_SMALL["nw"]), ("--size", "512"),
              frozenset({"_Z8nw_upperPKiPiiii", "_Z8nw_lowerPKiPiiiii"}), False),
}

pytestmark = pytest.mark.skipif(
    not all((BIN / n).exists() and (BIN / f"{n}.twins.so").exists() for n in APPS)
    or not paths.SIMGPU_CUDART.exists(),
    reason="Rodinia apps or simgpu not built (make build)")



def run_app(exe: Path, args: tuple[str, ...], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=60)


def fields(output: str, tag: str) -> dict[str, str]:
    """key=value pairs of the line that starts with tag."""
    m = re.search(rf"^{tag} (.*)$", output, re.M)
    assert m, f"no {tag} line in:\n{output}"
    return dict(kv.split("=", 1) for kv in m.group(1).split() if "=" in kv)


def stats_of(output: str) -> dict[str, int]:
    return {k: int(v) for k, v in fields(output, "STATS").items()}


def report(tmp: Path) -> list[dict]:
    return [json.loads(ln) for ln in (tmp / "report.jsonl").read_text().splitlines() if ln]


@pytest.mark.parametrize("name", APPS)
def test_small_input_checks_through_the_twins(name, tmp_path):
    app = APPS[name]
    res = run_app(BIN / name, (*app.small, "--repeat", "2", "--check"),
                  pinned_sim_env(tmp_path, SIMGPU_DEBUG="1"))
    assert res.returncode == 0 and f"PASS {name}" in res.stdout, res.stdout + res.stderr
    for k in app.kernels:       # simgpu's debug log names what it found for each kernel
        assert re.search(rf"{k}: twin yes, cost yes", res.stderr), res.stderr
    stats = stats_of(res.stdout)
    tp = fields(res.stdout, f"THROUGHPUT {name}")
    assert int(tp["iters"]) == 2 and float(tp["seconds"]) > 0
    rows = report(tmp_path)
    assert {r["name"] for r in rows} == app.kernels
    assert all(r["twin"] is True for r in rows), rows
    assert sum(r["launches"] for r in rows) == stats["launches"] > 0
    # a repeat redoes the whole computation: launches and results read back
    (tmp_path / "once").mkdir()
    once = stats_of(run_app(BIN / name, app.small, pinned_sim_env(tmp_path / "once")).stdout)
    assert stats["launches"] == 2 * once["launches"] and stats["d2h_bytes"] == 2 * once["d2h_bytes"]
    assert once["h2d_bytes"] < stats["h2d_bytes"] < 2 * once["h2d_bytes"]   # inputs uploaded once


@pytest.mark.parametrize("name", APPS)
def test_the_check_fails_when_kernels_do_nothing(name, tmp_path):
    """Copied away from its twins the kernels are timed no-ops: --check must notice."""
    lone = tmp_path / name
    shutil.copy(BIN / name, lone)
    res = run_app(lone, (*APPS[name].small, "--check"), pinned_sim_env(tmp_path))
    assert res.returncode != 0 and f"FAIL {name}" in res.stdout, res.stdout + res.stderr
    assert all(r["twin"] is False for r in report(tmp_path))


@pytest.mark.parametrize("name", APPS)
def test_duration_keeps_rerunning_the_whole_computation(name, tmp_path):
    res = run_app(BIN / name, (*APPS[name].small, "--duration", "0.2"), pinned_sim_env(tmp_path))
    assert res.returncode == 0, res.stdout + res.stderr
    tp = fields(res.stdout, f"THROUGHPUT {name}")
    iters, seconds = int(tp["iters"]), float(tp["seconds"])
    assert iters >= 2 and seconds >= 0.2
    assert float(tp["iters_per_s"]) == pytest.approx(iters / seconds, rel=0.01)
    launches = stats_of(res.stdout)["launches"]
    assert launches % iters == 0 and launches >= iters


def modelled_us(name: str, quota: int, tmp: Path) -> float:
    """Kernel time the model gives the app's wide input at an SM quota."""
    d = tmp / f"q{quota}"
    d.mkdir()
    # a kernel without a cost function would get simgpu's default work, here
    # made compute-bound: only the apps' own cost functions can pass the test
    env = pinned_sim_env(d, SIMGPU_LAUNCH_US="0", CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(quota),
                  SIMGPU_DEFAULT_FLOPS_PER_THREAD="1000", SIMGPU_DEFAULT_BYTES_PER_THREAD="0")
    res = run_app(BIN / name, APPS[name].wide, env)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = report(d)
    assert {r["name"] for r in rows} == APPS[name].kernels and all(r["twin"] for r in rows)
    return sum(r["modelled_us"] for r in rows)


@pytest.mark.parametrize("name", APPS)
def test_memory_bound_in_the_device_model(name, tmp_path):
    t20, t50, t100 = (modelled_us(name, q, tmp_path) for q in (20, 50, 100))
    assert t100 > 0
    assert t20 / t100 < 2.5, (t20, t100)          # a compute-bound app gives ~5.08
    assert t50 / t100 < 1.05, (t50, t100)         # DRAM nearly saturated from 66 SMs
    if APPS[name].fills_device:
        assert 1.3 < t20 / t100 < 1.8, (t20, t100)  # 1.39: the SMs' pull, then DRAM's limit
    else:
        assert t20 / t100 < 1.05, (t20, t100)


# ---------------------------------------------------------------- under the shim

def colocate(*args: str, rundir: Path, env: dict[str, str] | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([*COLOCATE, args[0], "--runtime-dir", str(rundir), *args[1:]],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


def final_record(rundir: Path, name: str, timeout: float = 15) -> dict:
    end = time.monotonic() + timeout
    while True:
        res = colocate("quotas", "--json", "--all", rundir=rundir)
        recs = [a for a in json.loads(res.stdout or "[]") if a["name"] == name]
        if recs and recs[0]["state"] == "exited":
            return recs[0]
        assert time.monotonic() < end, f"no final record for {name}: {recs}"
        time.sleep(0.1)


@pytest.mark.parametrize("name", APPS)
def test_shim_counts_what_the_app_says_it_did(controller, name):
    """`controller` is conftest's module-wide `colocate serve --device sim`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COLOCATE_", "SIMGPU_", "CUDA_MPS_")) and k != "LD_PRELOAD"}
    env["SIMGPU_TIMESCALE"] = "0"
    res = colocate("run", "--device", "sim", "--name", f"mem-{name}", "--class", "batch", "--",
                   str(BIN / name), *APPS[name].small, "--repeat", "2", "--check",
                   rundir=controller.rundir, env=env)
    assert res.returncode == 0 and f"PASS {name}" in res.stdout, res.stdout + res.stderr
    want = stats_of(res.stdout)
    rec = final_record(controller.rundir, f"mem-{name}")
    assert rec["class"] == "batch"
    assert (rec["launches"], rec["h2d_bytes"], rec["d2h_bytes"]) == \
        (want["launches"], want["h2d_bytes"], want["d2h_bytes"])
    assert {k["name"] for k in rec["kernels"]} == APPS[name].kernels
    assert all(k["twin"] is True for k in rec["kernels"])
    assert sum(k["launches"] for k in rec["kernels"]) == want["launches"]


# ---------------------------------------------------------------- forwarded to a worker

@pytest.fixture(scope="module")
def rig():
    """A stand-in controller and one process-pool worker at 20 % (bench/forwarding.py)."""
    from processpool.rig import WORKER, Rig
    if not WORKER.exists():
        pytest.skip("colocate-worker not built")
    r = Rig()
    try:
        r.start_worker(1, 20)
        yield r
    finally:
        r.close()


@pytest.mark.parametrize("name", APPS)
def test_forwarded_run_gives_the_same_bits(rig, name):
    """Every launch run by the worker, through the same twins: identical
    results (CHECK hash) and counters to a local run."""
    args = (*APPS[name].small, "--repeat", "2", "--check")
    out, err, local = rig.run(name, *args, **rig.fast)
    fout, ferr, fwd = rig.run(name, *args, routes=1)
    assert f"PASS {name}" in fout, fout + ferr
    assert fields(fout, "CHECK") == fields(out, "CHECK")
    assert stats_of(fout) == stats_of(out)
    assert local["forwarded"] == 0
    assert fwd["forwarded"] == fwd["launches"] == stats_of(out)["launches"]
