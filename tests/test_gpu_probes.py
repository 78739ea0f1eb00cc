"""The real-GPU probes of the process pool (bench/gpu/*.cu) and their driver script
bench/gpu_pool.py, checked without a GPU.

* With no driver (NVIDIA's libcudart, no libcuda.so.1) and on simgpu, each
  probe exits 2 with one JSON line that names the reason, never by a signal.
* Under the pretend driver bench/gpu/testdrv/fakedrv.c on simgpu (VMM calls on
  memfds, kernels through testdrv/twins.c), everything around the driver runs
  for real: fork + exec of vmm_probe's child at its own percentage, the fd
  passed by SCM_RIGHTS, the hint and arena logic, the check of the data,
  partial reports when the child fails or dies, the quota probe's
  calibration, percentiles and result check.
* gpu_pool.py: no driver -> exit 2 and its message; its pure functions on
  inputs built here; its whole plan against the real probes on simgpu with a
  pretend MPS daemon, and with a runner that fails, is interrupted or runs
  out of budget (the daemon is stopped in every case).

What none of this shows: how a real driver and MPS behave.  That is what the
probes are for, on a GPU (bench/gpu_pool.py's docstring has the command).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import clean_env, driver_present, run_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_pool  # noqa: E402

BIN = ROOT / "bench" / "bin"
QUOTA, VMM = BIN / "gpu-quota_probe", BIN / "gpu-vmm_probe"
TESTDRV = ROOT / "bench" / "gpu" / "testdrv"
SIMGPU_LIB = ROOT / "shim" / "lib" / "simgpu"
CUDA_INC = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"


HAVE_DRIVER = driver_present()
built = pytest.mark.skipif(not (QUOTA.exists() and VMM.exists()),
                           reason="GPU probes not built (make build)")


run = run_json


@pytest.fixture(scope="module")
def testdrv(tmp_path_factory) -> dict[str, Path]:
    """The pretend driver and the probes' twins, built for this module."""
    d = tmp_path_factory.mktemp("testdrv")
    out = {"fakedrv": d / "fakedrv.so", "twins": d / "twins.so"}
    for src, dst, flags in ((TESTDRV / "fakedrv.c", out["fakedrv"], [f"-I{CUDA_INC}", "-ldl"]),
                            (TESTDRV / "twins.c", out["twins"], [f"-I{ROOT / 'shim' / 'simgpu'}", "-lm"])):
        subprocess.run(["cc", "-O2", "-Wall", "-fPIC", "-shared", "-o", str(dst), str(src), *flags],
                       check=True, capture_output=True, text=True)
    return out


def sim_env(tmp_path: Path, testdrv: dict[str, Path] | None = None, **extra: str) -> dict[str, str]:
    """simgpu with a private SIMGPU_DIR; with testdrv, the pretend driver preloaded."""
    env = clean_env(LD_LIBRARY_PATH=str(SIMGPU_LIB), SIMGPU_DIR=str(tmp_path / "sim"),
                    SIMGPU_TIMESCALE="0")
    env.pop("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", None)
    if testdrv:
        env.update(LD_PRELOAD=str(testdrv["fakedrv"]), SIMGPU_TWINS=str(testdrv["twins"]))
    env.update(extra)
    return env


# ---------------------------------------------------------------- the binaries

def test_probes_are_built():
    for exe in (QUOTA, VMM):
        assert exe.exists() and os.access(exe, os.X_OK), f"{exe} missing: run `make build`"


@built
@pytest.mark.skipif(HAVE_DRIVER, reason="a CUDA driver is installed here")
@pytest.mark.parametrize("exe", [QUOTA, VMM], ids=["quota", "vmm"])
def test_no_driver_exit_2(exe):
    env = clean_env()
    env.pop("LD_LIBRARY_PATH", None)          # NVIDIA's libcudart, and no libcuda.so.1
    lib = CUDA_INC.parent / "lib64"
    if (lib / "libcudart.so.13").exists():    # found even where ld.so.cache lacks it
        env["LD_LIBRARY_PATH"] = str(lib)
    rc, line, _ = run([str(exe)], env)
    assert rc == 2
    assert line["probe"] in ("quota", "vmm") and "no NVIDIA driver" in line["error"]
    assert line["driver_version"] == 0


@built
@pytest.mark.parametrize("exe", [QUOTA, VMM], ids=["quota", "vmm"])
def test_simgpu_exit_2(exe, tmp_path):
    rc, line, _ = run([str(exe)], sim_env(tmp_path))
    assert rc == 2, "simgpu has no driver entry points: nothing to measure"
    assert line["error"].startswith("simgpu")
    assert line.get("median_ms") is None and line.get("same_address") is None


@built
def test_bad_argument_still_one_json_line(tmp_path):
    rc, line, err = run([str(QUOTA), "--n", "0"], sim_env(tmp_path))
    assert rc == 1 and line == {"probe": "quota", "error": "bad argument --n"}
    assert "usage" in err


# ---------------------------------------------------------------- vmm_probe, pretend driver

def vmm(tmp_path: Path, testdrv, *args: str, **env: str) -> tuple[int, dict[str, Any], str]:
    e = sim_env(tmp_path, testdrv, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="100", **env)
    return run([str(VMM), "--child-pct", "30", "--mb", "4", "--reps", "3", *args], e)


@built
def test_vmm_same_address_and_arena(tmp_path, testdrv):
    rc, d, _ = vmm(tmp_path, testdrv)
    assert rc == 0, d
    assert d["verdict"] == "same address" and d["same_address"] is True and d["got"] == d["hint"]
    assert d["data_ok"] is True and d["mismatches"] == 0
    assert d["arena_same_address"] is True and d["arena_got"] == d["child_arena_got"] == "0x600000000000"
    assert d["arena_data_ok"] is True and d["second_kernel_via"] == "arena"
    assert (d["parent_pct"], d["child_pct"]) == ("100", "30")     # the child's own percentage
    assert d["setup_reps"] == 3 and d["setup_us_first"] > 0 and d["setup_us_median"] > 0
    assert d["child_status"] == "exited 0" and d["child_stage"] == "kernel 2"
    assert d["error"] is None and d["child_error"] is None and d["device"] == "fakedrv on simgpu"


@built
def test_vmm_different_address_is_a_verdict(tmp_path, testdrv):
    rc, d, _ = vmm(tmp_path, testdrv, FAKEDRV_NO_HINT="1")
    assert rc == 0, d
    assert d["verdict"] == "different address" and d["same_address"] is False
    assert d["got"] != d["hint"]
    assert d["data_ok"] is True, "the child's mapping elsewhere still shares the memory"
    assert d["arena_same_address"] is False and d["second_kernel_via"] == "hint range"


@built
def test_vmm_child_call_fails(tmp_path, testdrv):
    rc, d, err = vmm(tmp_path, testdrv, FAKEDRV_FAIL="child:cuMemImportFromShareableHandle")
    assert rc == 1
    assert d["child_error"].startswith("cuMemImportFromShareableHandle: CUDA_ERROR_NOT_SUPPORTED")
    assert d["same_address"] is True, "what the child learnt before the failure is kept"
    assert d["data_ok"] is None and d["child_status"] == "exited 1"
    assert "cuMemImportFromShareableHandle failed" in err


@built
def test_vmm_child_killed(tmp_path, testdrv):
    rc, d, _ = vmm(tmp_path, testdrv, FAKEDRV_CRASH="child:cuMemImportFromShareableHandle")
    assert rc == 1
    assert "signal 11" in d["child_status"]
    assert d["error"].startswith("child report") and '"reserved"' in d["error"]
    assert d["same_address"] is True and d["verdict"] == "same address"


@built
def test_vmm_child_killed_after_its_kernel(tmp_path, testdrv):
    rc, d, _ = vmm(tmp_path, testdrv, FAKEDRV_CRASH="child:cuMemUnmap")
    assert rc == 1 and "signal 11" in d["child_status"]
    assert d["child_kernels"] == 1 and d["data_ok"] is True, "the first kernel's work is checked"


@built
def test_vmm_parent_call_fails(tmp_path, testdrv):
    rc, d, _ = vmm(tmp_path, testdrv, FAKEDRV_FAIL="cuMemCreate")
    assert rc == 1
    assert d["error_call"] == "cuMemCreate" and "CUDA_ERROR_NOT_SUPPORTED" in d["error"]
    assert d["verdict"] == "no verdict" and d["child_status"] is None


# ---------------------------------------------------------------- quota_probe, pretend driver

@built
def test_quota_fixed_work(tmp_path, testdrv):
    env = sim_env(tmp_path, testdrv, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="40")
    rc, d, _ = run([str(QUOTA), "--grid", "16", "--iters", "8", "--n", "7", "--warmup", "1"], env)
    assert rc == 0, d
    assert (d["quota_env"], d["grid"], d["iters"], d["n"], d["calibrated"]) == ("40", 16, 8, 7, False)
    assert 0 < d["p10_ms"] <= d["median_ms"] <= d["p90_ms"]
    assert d["check_ok"] is True and d["gflops"] > 0 and d["mps_enabled"] is False


@built
def test_quota_calibrates_and_sizes_grid(tmp_path, testdrv):
    # a slow pretend device: 2 SMs at 10 MFLOP/s each, so K stays small
    env = sim_env(tmp_path, testdrv, SIMGPU_SMS="2", SIMGPU_SM_GFLOPS="0.01")
    rc, d, _ = run([str(QUOTA), "--n", "3", "--target-ms", "50"], env)
    assert rc == 0, d
    assert d["calibrated"] is True and d["iters"] >= 1
    assert d["grid"] == d["sm_count"] * d["blocks_per_sm"] * 4 == 2 * d["blocks_per_sm"] * 4


@built
def test_quota_memory_variant(tmp_path, testdrv):
    rc, d, _ = run([str(QUOTA), "--mem", "--mb", "2", "--n", "3", "--grid", "8"], sim_env(tmp_path, testdrv))
    assert rc == 0, d
    assert d["kind"] == "memory" and d["mb"] == 2 and d["gbps"] > 0 and d["check_ok"] is True


@built
def test_quota_check_catches_unwritten_output(tmp_path, testdrv):
    # timing only: no twin runs, the poisoned output stays as it was
    env = sim_env(tmp_path, testdrv, SIMGPU_TIMING_ONLY="1")
    rc, d, _ = run([str(QUOTA), "--grid", "4", "--iters", "2", "--n", "2"], env)
    assert rc == 1 and d["check_ok"] is False and d["error_call"] == "check"
    assert d["median_ms"] is not None, "the times are still reported"


# ---------------------------------------------------------------- gpu_pool.py: pure parts

def test_parse_probe_output_takes_the_json_line():
    out = 'noise\n{"not": "a probe"}\n{"probe": "quota", "median_ms": 1.5}\ntrailing\n'
    assert gpu_pool.parse_probe_output(out) == {"probe": "quota", "median_ms": 1.5}
    assert gpu_pool.parse_probe_output("Segmentation fault\n{broken") is None


def test_parse_quotas_and_pairs():
    assert gpu_pool.parse_quotas("10, 50,30") == [100, 50, 30, 10]
    assert gpu_pool.parse_quotas("100,20") == [100, 20]
    for bad in ("0,50", "101", "a", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            gpu_pool.parse_quotas(bad)
    assert gpu_pool.parse_pairs("100/100, 30/70") == [(100, 100), (30, 70)]
    for bad in ("30", "30/0", "x/y", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            gpu_pool.parse_pairs(bad)


def _row(q: int, ms: float | None, mps: bool = True, kind: str = "compute", **res: Any) -> dict:
    return {"quota": q, "mps": mps, "kind": kind,
            "result": None if ms is None else {"median_ms": ms, "mps_enabled": mps, **res}}


def test_quota_curve_relative_to_own_100():
    rows = [_row(100, 2.0), _row(50, 4.2), _row(10, 19.0), _row(100, 2.1, mps=False),
            _row(10, 2.0, mps=False), _row(100, 1.0, kind="memory"), _row(10, 3.0, kind="memory"),
            _row(20, None)]
    c = {(r["quota"], r["mps"], r["kind"]): r for r in gpu_pool.quota_curve(rows)}
    assert c[(50, True, "compute")]["rel"] == pytest.approx(2.1)
    assert c[(10, True, "compute")]["effective_pct"] == pytest.approx(100 * 2.0 / 19.0)
    assert c[(10, True, "compute")]["ideal"] == 10
    assert c[(10, False, "compute")]["rel"] == pytest.approx(2.0 / 2.1), "no-MPS rows use the no-MPS 100"
    assert c[(10, True, "memory")]["rel"] == 3.0, "each kind has its own base"
    assert c[(20, True, "compute")]["rel"] is None


def test_quota_curve_without_base():
    assert all(r["rel"] is None for r in gpu_pool.quota_curve([_row(50, 4.0), _row(100, None)]))


def test_quota_verdicts():
    v = gpu_pool.quota_verdict
    real = gpu_pool.quota_curve([_row(100, 2.0), _row(10, 18.0), _row(100, 2.0, mps=False),
                                 _row(10, 2.02, mps=False)])
    assert v(real).startswith("quota is real: at 10 % the kernel took 9.00x")
    assert "without MPS 10 % took 1.01x" in v(real)
    assert v(gpu_pool.quota_curve([_row(100, 2.0), _row(10, 2.1)])).startswith("quota NOT enforced")
    assert v(gpu_pool.quota_curve([_row(100, 2.0), _row(10, 5.0)])).startswith("quota partly enforced")
    assert v(gpu_pool.quota_curve([_row(100, 2.0)])).startswith("no verdict")
    off = [_row(100, 2.0), _row(10, 20.0)]
    off[1]["result"]["mps_enabled"] = False
    assert "MPS_ENABLED = 0" in v(gpu_pool.quota_curve(off))


def test_vmm_verdict_counts_mps_pairs_only():
    def r(mps: bool, **d: Any) -> dict:
        return {"mps": mps, "result": d}
    runs = [r(False, same_address=False, data_ok=True),
            r(True, same_address=True, data_ok=True, arena_same_address=True, setup_us_median=40.0),
            r(True, same_address=False, data_ok=True, arena_same_address=False, setup_us_median=60.0),
            r(True, same_address=None, error="cuMemCreate: ...")]
    text = gpu_pool.vmm_verdict(runs)
    assert text.startswith("same address in 1/2 MPS pairs, data ok in 2/2, "
                           "pre-agreed arena granted to both in 1/2")
    assert "median 60 µs" in text
    assert gpu_pool.vmm_verdict([r(True, same_address=None)]).startswith("no verdict")


def test_probe_env():
    base = {"PATH": "/bin", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "7"}
    e = gpu_pool.probe_env(base, 30, {"CUDA_MPS_PIPE_DIRECTORY": "/r/mps/pipe"}, "/r/no-mps")
    assert e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30" and e["CUDA_MPS_PIPE_DIRECTORY"] == "/r/mps/pipe"
    e = gpu_pool.probe_env(base, None, None, "/r/no-mps")
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in e, "an inherited percentage never leaks in"
    assert e["CUDA_MPS_PIPE_DIRECTORY"] == "/r/no-mps"


def test_quota_cmd_fixes_the_work_after_calibration():
    cal = gpu_pool.quota_cmd(30, 3, None, 5)
    assert "--target-ms" in cal and "--iters" not in cal
    fixed = gpu_pool.quota_cmd(30, 3, {"iters": 900, "grid": 4224}, 5)
    assert fixed[fixed.index("--iters") + 1] == "900" and fixed[fixed.index("--grid") + 1] == "4224"
    mem = gpu_pool.quota_cmd(30, 3, {"grid": 64}, 5, mem=True, mb=256)
    assert "--mem" in mem and "--iters" not in mem and mem[mem.index("--mb") + 1] == "256"


def test_with_driver_bins(tmp_path):
    (tmp_path / "nvidia-cuda-mps-control").write_text("")
    missing = str(tmp_path / "nope")
    assert gpu_pool.with_driver_bins("/bin", (str(tmp_path), missing)) == f"/bin:{tmp_path}"
    assert gpu_pool.with_driver_bins(f"/bin:{tmp_path}", (str(tmp_path),)) == f"/bin:{tmp_path}"


# ---------------------------------------------------------------- gpu_pool.py: the plan

@pytest.mark.skipif(HAVE_DRIVER, reason="a CUDA driver is installed here")
def test_gpu_pool_no_driver(tmp_path):
    env = clean_env()
    env["PATH"] = "/usr/bin:/bin"               # no nvidia-smi
    out = tmp_path / "r.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_pool.py"), "--out", str(out)],
                       env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "no NVIDIA driver: nothing measured" in p.stdout
    assert json.loads(out.read_text())["verdicts"]["all"] == "no NVIDIA driver: nothing measured"


class FakeMps:
    """Stands in for processpool.mps.Mps; its env marks clients as under MPS
    for the pretend driver (FAKEDRV_MPS)."""

    def __init__(self, rundir: Path, fail: bool = False):
        self.pipe_dir, self.log_dir = rundir / "mps" / "pipe", rundir / "mps" / "log"
        self.started = self.stopped = False
        self.fail = fail

    def ensure(self) -> str:
        if self.fail:
            raise RuntimeError("nvidia-cuda-mps-control not found on PATH")
        self.started = True
        return "started a pretend daemon"

    def env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "FAKEDRV_MPS": "1"}

    def stop(self) -> None:
        self.stopped = True


def _pool(tmp_path: Path, args: list[str], runner=None, mps_fail: bool = False):
    made: list[FakeMps] = []

    def factory(d: Path) -> FakeMps:
        made.append(FakeMps(d, mps_fail))
        return made[-1]
    out = tmp_path / "pool.json"
    kw = {"runner": runner} if runner else {}
    rc = gpu_pool.main(["--out", str(out), "--runtime-dir", str(tmp_path / "rt"), *args],
                       driver=lambda: ({"source": "test"}, []), mps_factory=factory, **kw)
    return rc, json.loads(out.read_text()), made[0] if made else None


@built
def test_gpu_pool_whole_plan_on_simgpu(tmp_path, testdrv, monkeypatch, capsys):
    # 4 SMs: two TPCs, so that 50 % is half the device (MPS gives whole TPCs)
    for k, v in sim_env(tmp_path, testdrv, SIMGPU_SMS="4", SIMGPU_SM_GFLOPS="0.01").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "55")     # must not leak into runs
    rc, data, mps = _pool(tmp_path, ["--quotas", "50", "--pairs", "30/70", "--reps", "3",
                                     "--mem-mb", "2", "--vmm-mb", "2", "--vmm-reps", "2"])
    assert rc == 0, data["failed"]
    assert mps.started and mps.stopped
    nomps, q, mem, vmm_runs = data["quota_no_mps"], data["quota"], data["quota_mem"], data["vmm"]
    assert [r["quota"] for r in nomps] == [100, 10] and [r["quota"] for r in q] == [100, 50]
    assert all(r["result"]["mps_enabled"] is False for r in nomps)
    assert all(r["result"]["mps_enabled"] is True for r in q + mem)
    assert [r["result"]["quota_env"] for r in nomps + q] == ["100", "10", "100", "50"]
    # one calibration, then the same work everywhere
    assert nomps[0]["result"]["calibrated"] is True
    assert {(r["result"]["iters"], r["result"]["grid"]) for r in nomps + q} == \
        {(data["calibration"]["iters"], data["calibration"]["grid"])}
    assert [(r["parent_pct"], r["child_pct"], r["mps"]) for r in vmm_runs] == [
        (100, 100, False), (30, 70, True), (100, 50, "app->worker")]
    # the app outside MPS (our empty pipe dir), the worker inside (the daemon's)
    aw = vmm_runs[2]
    assert aw["cmd"][aw["cmd"].index("--child-mps-pipe") + 1] == str(mps.pipe_dir), aw["cmd"]
    assert aw["result"]["child_pct"] == "50" and aw["result"]["mps_enabled"] is False
    assert vmm_runs[1]["result"]["child_pct"] == "70" and vmm_runs[1]["result"]["parent_pct"] == "30"
    assert all(r["result"]["same_address"] is True for r in vmm_runs)
    assert data["verdicts"]["vmm"].startswith("same address in 2/2 MPS pairs")
    curve = {(c["quota"], c["mps"], c["kind"]): c for c in data["curve"]}
    assert curve[(100, True, "compute")]["rel"] == 1.0 and curve[(50, True, "compute")]["rel"] > 1
    assert "x t(100)" in capsys.readouterr().out


def test_gpu_pool_interrupted_still_stops_mps(tmp_path):
    calls = []

    def runner(cmd, env, timeout):
        calls.append(env)
        if env.get("FAKEDRV_MPS"):
            raise KeyboardInterrupt
        return gpu_pool.ProbeRun(cmd, 0, 0.1, {"probe": "quota", "median_ms": 1.0, "grid": 8, "iters": 4})
    rc, data, mps = _pool(tmp_path, ["--quotas", "50"], runner)
    assert rc == 1 and mps.stopped and "interrupted" in data["failed"]
    assert len(data["quota_no_mps"]) == 2 and len(data["vmm"]) == 1, "no-MPS runs kept"


def test_gpu_pool_without_mps_daemon(tmp_path):
    def runner(cmd, env, timeout):
        return gpu_pool.ProbeRun(cmd, 0, 0.1, {"probe": "x", "median_ms": 1.0, "grid": 8, "iters": 4})
    rc, data, mps = _pool(tmp_path, ["--quotas", "50"], runner, mps_fail=True)
    assert rc == 1 and "not found on PATH" in data["mps"]["error"]
    assert any(f.startswith("MPS:") for f in data["failed"])
    assert "quota" not in data and len(data["quota_no_mps"]) == 2


def test_gpu_pool_budget_spent(tmp_path):
    def runner(cmd, env, timeout):
        raise AssertionError("no run may start without budget")
    rc, data, mps = _pool(tmp_path, ["--budget-s", "0", "--quotas", "50", "--no-mem"], runner)
    assert rc == 1 and mps.stopped
    runs = data["quota_no_mps"] + data["quota"] + data["vmm"]
    assert runs and all(r["error"] == "skipped: time budget spent" and r["rc"] is None for r in runs)


def test_gpu_pool_flags_wrong_data(tmp_path):
    def runner(cmd, env, timeout):
        if "gpu-vmm_probe" in cmd[0]:
            return gpu_pool.ProbeRun(cmd, 0, 0.1, {"probe": "vmm", "same_address": True,
                                                   "data_ok": False, "mismatches": 12})
        return gpu_pool.ProbeRun(cmd, 0, 0.1, {"probe": "quota", "median_ms": 1.0, "grid": 8, "iters": 4})
    rc, data, _ = _pool(tmp_path, ["--quotas", "50", "--no-mem", "--pairs", "30/70"], runner)
    assert rc == 1 and any("data mismatch (12 words)" in f for f in data["failed"])
    assert data["verdicts"]["vmm"].startswith("same address in 2/2 MPS pairs, data ok in 0/2")
