"""Rodinia batch apps lud, myocyte and lavamd (bench/rodinia/) on simgpu.

For each app: a small input passes its own `--check` against the CPU
reference, and fails it when the kernels do not run; every kernel ran
through its host twin; under the shim the controller's counters equal the
program's STATS line; and the device model shows C-Laius's class.

The class test compares the modelled time of the app's main kernel
(SIMGPU_REPORT modelled_us, SIMGPU_TIMESCALE=0) at SM quotas 20 and 100 %.
On the default simgpu device (132 SMs of 500 GFLOP/s, 3350 GB/s, one SM
pulling 101.3 GB/s with DRAM idle, simgpu_model.h bwq) a quota of 20 % is
26 SMs, so
  - a compute-bound kernel that fills the device runs 132 / 26 = 5.08x
    longer at 20 % than at 100 %: we require >= 4.0 (LUD's last
    factorization steps have grids too small to fill 132 SMs; measured
    4.8 for lud, 5.1 for myocyte);
  - a bandwidth-bound kernel gets 2026 GB/s at 20 % and 2808 at 100 %:
    1.39x (an H100 gave 1.43x): we require <= 2.0.  And to show that this
    is DRAM's limit, not a grid too small to use more SMs, it must still
    scale with few SMs: t(10 %) / t(20 %) >= 1.6 (1149 against 2026 GB/s
    on 12 and 26 SMs, 1.76x; the H100 gave 1.72x; a grid-bound kernel 1).
The fixed launch cost (SIMGPU_LAUNCH_US, the same at every quota) is set to
0 here so that the ratios measure the kernels' work at test-sized inputs.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import RODINIA_SMALL, ROOT, clean_env, colocate, simgpu_env, stats_of, wait_for

from shim import paths

BIN = ROOT / "bench" / "bin"
APPS = ("lud", "myocyte", "lavamd")

# small inputs for --check and the shim run (well under a second each)
SMALL = {app: RODINIA_SMALL[app] for app in APPS}
KERNELS = {
    "lud": {"_Z12lud_diagonalPfii", "_Z13lud_perimeterPfii", "_Z12lud_internalPfii"},
    "myocyte": {"_Z14myocyte_kernelPdPKdixiid"},
    "lavamd": {"_Z13lavamd_kernelPKiS0_PKdS2_Pdidi"},
}
# class test: C-Laius's class, the kernel carrying the work, an input that
# fills the device (myocyte: 132 SMs x 2048 threads; lavamd: 1728 boxes of
# 32 threads = 54 SMs, whose pull passes DRAM's limit) but takes < 1 s of
# CPU in the twins
MODEL = {
    "lud": ("compute", "_Z12lud_internalPfii", ["--size", "2048"]),
    "myocyte": ("compute", "_Z14myocyte_kernelPdPKdixiid",
                ["--cells", "270336", "--time", "0.02", "--dt", "0.01"]),
    "lavamd": ("memory", "_Z13lavamd_kernelPKiS0_PKdS2_Pdidi", ["--boxes", "12", "--par", "32"]),
}

pytestmark = pytest.mark.skipif(
    not all((BIN / a).exists() and (BIN / f"{a}.twins.so").exists() for a in APPS)
    or not paths.SIMGPU_CUDART.exists(),
    reason="Rodinia apps or simgpu not built (make build)")





def run(prog: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(prog), *args], env=env, capture_output=True, text=True, timeout=120)


def report(path: Path) -> dict[str, dict]:
    return {r["name"]: r for r in map(json.loads, path.read_text().splitlines())}


@pytest.mark.parametrize("app,extra", [pytest.param(a, [], id=a) for a in APPS]
                         + [pytest.param("lavamd", ["--accum", "reg"], id="lavamd-reg")])
def test_small_input_passes_check_through_twins(app, extra, simdir, tmp_path):
    rep = tmp_path / "report.jsonl"
    res = run(BIN / app, [*SMALL[app], *extra, "--check"], simgpu_env(simdir, SIMGPU_REPORT=rep))
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"PASS {app}" in res.stdout
    assert re.search(rf"^THROUGHPUT {app} iters_per_s=[0-9.]+ iters=1 seconds=[0-9.]+$",
                     res.stdout, re.M), res.stdout
    rows = report(rep)
    assert set(rows) == KERNELS[app]
    assert all(r["twin"] is True and r["modelled_us"] > 0 for r in rows.values())
    assert sum(r["launches"] for r in rows.values()) == stats_of(res.stdout)["launches"]


@pytest.mark.parametrize("app", APPS)
def test_check_fails_when_kernels_do_not_compute(app, simdir, tmp_path):
    # a copy without <exe>.twins.so beside it: simgpu times its kernels but
    # they do nothing, so the result is wrong and --check must say so
    lone = tmp_path / app
    shutil.copy(BIN / app, lone)
    res = run(lone, [*SMALL[app], "--check"], simgpu_env(simdir))
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"FAIL {app}" in res.stdout and f"PASS {app}" not in res.stdout


def test_repeat_and_duration(simdir):
    res = run(BIN / "lud", ["--size", "64", "--repeat", "3"], simgpu_env(simdir))
    assert res.returncode == 0 and "iters=3 " in res.stdout, res.stdout + res.stderr
    assert stats_of(res.stdout) == {"launches": 3 * 10, "h2d_bytes": 3 * 64 * 64 * 4,
                                    "d2h_bytes": 64 * 64 * 4}
    # --duration keeps running whole computations until the time has passed
    res = run(BIN / "lavamd", ["--boxes", "2", "--par", "8", "--duration", "0.3"], simgpu_env(simdir))
    assert res.returncode == 0, res.stdout + res.stderr
    m = re.search(r"^THROUGHPUT lavamd iters_per_s=([0-9.]+) iters=(\d+) seconds=([0-9.]+)$",
                  res.stdout, re.M)
    assert m and int(m.group(2)) > 1 and float(m.group(3)) >= 0.3, res.stdout
    assert stats_of(res.stdout)["launches"] == int(m.group(2))


@pytest.mark.parametrize("app", APPS)
def test_shim_counts_what_the_program_did(app, controller, simdir):
    name = f"rod-{app}"
    res = colocate("run", "--runtime-dir", controller.rundir, "--device", "sim", "--name", name,
                   "--class", "batch", "--", BIN / app, *SMALL[app],
                   env=clean_env(SIMGPU_DIR=simdir, SIMGPU_TIMESCALE="0"), timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    want = stats_of(res.stdout)

    def final():
        out = colocate("quotas", "--runtime-dir", controller.rundir, "--json", "--all").stdout
        recs = [a for a in json.loads(out) if a["name"] == name and a["state"] == "exited"]
        return recs[0] if recs else None
    rec = wait_for(final, timeout=10)
    assert rec, f"no final record for {name}"
    assert (rec["launches"], rec["h2d_bytes"], rec["d2h_bytes"]) == \
        (want["launches"], want["h2d_bytes"], want["d2h_bytes"])
    assert {k["name"] for k in rec["kernels"]} == KERNELS[app]
    assert all(k["twin"] is True for k in rec["kernels"])


def modelled_us(app: str, quota: int, simdir: str, tmp: Path) -> float:
    _, kernel, args = MODEL[app]
    rep = tmp / f"{app}-{quota}.jsonl"
    res = run(BIN / app, args, simgpu_env(simdir, SIMGPU_REPORT=rep, SIMGPU_LAUNCH_US=0,
                                       CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=quota))
    assert res.returncode == 0, res.stdout + res.stderr
    row = report(rep)[kernel]
    assert row["twin"] is True
    return row["modelled_us"]


@pytest.mark.parametrize("app", APPS)
def test_device_model_shows_the_class(app, simdir, tmp_path):
    cls = MODEL[app][0]
    t20, t100 = (modelled_us(app, q, simdir, tmp_path) for q in (20, 100))
    ratio = t20 / t100
    if cls == "compute":
        assert ratio >= 4.0, f"{app}: t(20%)/t(100%) = {ratio:.2f}, want >= 4 (compute-bound)"
    else:
        assert ratio <= 2.0, f"{app}: t(20%)/t(100%) = {ratio:.2f}, want <= 2 (DRAM's limit)"
        t10 = modelled_us(app, 10, simdir, tmp_path)
        assert t10 / t20 >= 1.6, f"{app}: t(10%)/t(20%) = {t10 / t20:.2f}: no scaling with few SMs"


def test_lavamd_cost_is_its_per_pair_traffic(simdir, tmp_path):
    # --accum global reads and writes a particle's 4 double sums per pair:
    # at 100 % the kernel takes that traffic's time at what DRAM delivers to
    # 132 SMs' pull, 3350 / 1.179 GB/s softened (2808 GB/s, conftest's
    # PINNED_DEVICE), plus ~2 % for staging the boxes; a B^3 grid has
    # (3B - 2)^3 (home, neighbour) box pairs of P^2 particle pairs each
    b, p = 12, 32
    x = 132 * 101.3 / 3350 * 1.179
    delivered = 132 * 101.3e9 / (x * (1 + x ** -2.32) ** (1 / 2.32))
    floor_us = (3 * b - 2) ** 3 * p * p * 64 / delivered * 1e6
    t100 = modelled_us("lavamd", 100, simdir, tmp_path)
    assert 1.0 <= t100 / floor_us <= 1.1, (t100, floor_us)


def test_sweep_tabulates_time_and_ratio_per_quota(tmp_path):
    png = tmp_path / "sweep.png"
    res = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "rodinia" / "sweep.py"), "--apps", "lud,lavamd",
         "--quotas", "20,100", "--args", "lavamd=--boxes 12 --par 32", "--launch-us", "0",
         "--png", str(png)],
        env=clean_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    got = {}
    for i, line in enumerate(lines):
        words = line.split()
        if words[:1] in (["lud"], ["lavamd"]):
            ratio = lines[i + 1].split()         # "ratio <t20/t100> 1.00"
            assert ratio[0] == "ratio" and ratio[2] == "1.00", res.stdout
            got[words[0]] = (words[1], float(ratio[1]))
    # the whole app: lud's diagonal and perimeter kernels do not scale (and
    # their few blocks have too few warps to fill an SM)
    assert got["lud"][0] == "compute" and got["lud"][1] > 2.2, res.stdout
    assert got["lavamd"][0] == "memory" and got["lavamd"][1] < 2.0, res.stdout
    assert png.stat().st_size > 1000
