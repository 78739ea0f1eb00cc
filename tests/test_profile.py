"""`colocate predictors profile`: solo runs on simgpu into the sample store,
then train and report on what it stored (a small end-to-end on simgpu)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from predictors import profile as P
from predictors.store import Store
from shim import paths

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "bench" / "bin"

pytestmark = pytest.mark.skipif(
    not (BIN / "tonic-service").exists() or not (BIN / "hotspot").exists()
    or not paths.SIMGPU_CUDART.exists() or not paths.LIBCOLOCATE.exists(),
    reason="bench programs, shim or simgpu not built (make build)")

QUOTAS = "10,50,100"
HOT = ["--size 128 --iters 4", "--size 256 --iters 4"]     # compute-bound below half the device
DIG = ["1", "4"]


def cli(args: list[str], tmp: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COLOCATE_", "SIMGPU_", "CUDA_MPS"))}
    env["COLOCATE_DATA_DIR"] = str(tmp / "data")
    return subprocess.run([sys.executable, "-m", "predictors.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("profile")
    res = cli(["profile", "hotspot", "tonic:dig", "--quotas", QUOTAS, "--reps", "2",
               "--inputs", "hotspot=" + ";".join(HOT), "--inputs", "tonic:dig=" + ";".join(DIG),
               "--no-progress"], tmp)
    assert res.returncode == 0, res.stdout + res.stderr
    return tmp, res


def load(tmp: Path, kind: str):
    return Store(tmp / "data" / "profiles", "simgpu").load(kind)


def test_task_samples(profiled):
    tmp, _ = profiled
    ss = load(tmp, "task")
    assert set(ss.sources) == {P.SRC}
    hot = [i for i, k in enumerate(ss.keys) if k.startswith("hotspot|")]
    dig = [i for i, k in enumerate(ss.keys) if k.startswith("tonic:dig|")]
    # hotspot launches iters/pyramid = 2 kernels per run: 2 inputs x 3 quotas x 2 reps x 2
    assert len(hot) == 2 * 3 * 2 * 2
    # dig runs the same 12 library calls per query: 2 sizes x 3 quotas x 2 reps x 12
    assert len(dig) == 2 * 3 * 2 * 12
    assert len(ss) == len(hot) + len(dig)
    assert (ss.y("duration_us") > 0).all() and (ss.y("bandwidth_gbs") > 0).all()
    assert (ss.y("ipc") > 0).all()
    for i in hot:
        r = ss.rows[i]
        assert r["task"].startswith("_Z15hotspot") and r["block_x"] == 16 and r["grid_x"] > 1
        assert r["input_bytes"] in (2 * 128 * 128 * 4, 2 * 256 * 256 * 4)    # STATS h2d_bytes
        assert all(r[f"p{j}"] == 0 for j in range(10))
    for i in dig:
        r = ss.rows[i]
        assert r["task"].startswith(("cudnn", "cublas")) and r["grid_x"] == 0
        assert r["p0"] > 0, r                      # library tasks carry their parameters
        assert r["input_bytes"] == r["p0"] * 28 * 28 * 4 if r["task"] == "cudnnConvolutionForward" \
            else r["input_bytes"] > 0
    conv = [ss.rows[i] for i in dig if ss.rows[i]["task"] == "cudnnConvolutionForward"]
    assert {r["p0"] for r in conv} == {1, 4}        # n = the batch
    # repeated launches are told apart: hotspot's 2 launches per run, dig's 2 convolutions
    assert sorted({ss.rows[i]["occurrence"] for i in hot}) == [0, 1]
    assert sorted({r["occurrence"] for r in conv}) == [0, 1]


def test_compute_bound_kernel_is_faster_at_a_higher_quota(profiled):
    tmp, _ = profiled
    ss = load(tmp, "task")
    dur: dict[int, float] = {}
    for k, r, d in zip(ss.keys, ss.rows, ss.y("duration_us")):
        if k.startswith(f"hotspot|{HOT[1]}|") and k.endswith("|0#r0"):
            dur[r["quota"]] = d
    assert sorted(dur) == [10, 50, 100]
    # 10 % of the SMs: the stencil's blocks wait for SMs (a 3 us launch overhead included);
    # from 50 % on it is DRAM-bound: the same modelled time, within the trace's noise
    assert dur[10] > 1.3 * dur[50] and dur[50] >= 0.97 * dur[100] > 0


def test_query_samples(profiled):
    tmp, _ = profiled
    ss = load(tmp, "query")
    assert len(ss) == 2 * 3 * 2 and set(ss.sources) == {P.SRC}
    d, pcie = ss.y("duration_us"), ss.y("pcie_us")
    assert (d > 0).all() and (pcie > 0).all() and (pcie < d).all()
    for r, p in zip(ss.rows, pcie):
        assert r["service"] == "tonic:dig" and r["input_bytes"] == r["batch"] * 28 * 28 * 4
        # H2D input plus D2H scores (10 classes of float32) at simgpu's 25 GB/s
        assert p == pytest.approx((r["input_bytes"] + r["batch"] * 10 * 4) / 25e9 * 1e6)
    by = {(r["batch"], r["quota"]): v for r, v in zip(ss.rows, d)}
    assert by[(4, 10)] > by[(4, 100)] and by[(4, 100)] > by[(1, 100)]


def test_rerun_adds_nothing(profiled):
    tmp, _ = profiled
    before = {k: len(load(tmp, k)) for k in ("task", "query")}
    res = cli(["profile", "hotspot", "tonic:dig", "--quotas", QUOTAS, "--reps", "2",
               "--inputs", "hotspot=" + ";".join(HOT), "--inputs", "tonic:dig=" + ";".join(DIG),
               "--no-progress"], tmp)
    assert res.returncode == 0, res.stderr
    assert "0 configuration(s) run, 24 already stored" in res.stdout
    assert {k: len(load(tmp, k)) for k in ("task", "query")} == before


def test_train_and_report_on_the_profile(profiled):
    tmp, _ = profiled
    for kind in ("task", "query"):
        res = cli(["train", "--kind", kind, "--model", "dt", "--cv", "0"], tmp)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "holdout MAPE" in res.stdout
    out = tmp / "report"
    res = cli(["report", "--out", str(out), "--no-plots", "--no-timing"], tmp)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads((out / "results.json").read_text())
    assert {r["name"] for r in rows} == {"task.duration_us.dt", "task.bandwidth_gbs.dt",
                                         "task.ipc.dt", "query.duration_us.dt", "query.pcie_us.dt"}
    assert all(r["mape"] >= 0 for r in rows)
    assert P.SRC in (out / "report.md").read_text()


def test_failed_run_is_counted_and_exits_1(tmp_path):
    res = cli(["profile", "hotspot", "--inputs", "--size 64 --no-such-option", "--quotas", "50",
               "--reps", "1", "--no-progress"], tmp_path)
    assert res.returncode == 1
    assert "FAILED hotspot" in res.stdout + res.stderr and "1 failed" in res.stdout


def test_usage_errors(tmp_path):
    for args, msg in ((["nosuchapp"], "unknown app"), (["tonic:nope"], "unknown Tonic net"),
                      (["hotspot", "--quotas", "0,50"], "1..100"),
                      (["hotspot", "tonic:dig", "--inputs", "--size 64"], "one target only"),
                      (["tonic:dig", "--inputs", "big"], "query sizes")):
        res = cli(["profile", *args, "--no-progress"], tmp_path)
        assert res.returncode == 2 and msg in res.stderr, (args, res.stderr)


def test_join_checks_kernel_names():
    trace = [{"pid": 1, "seq": 0, "kind": "kernel", "name": "a", "dur_us": 4.0},
             {"pid": 1, "seq": 1, "kind": "library", "name": "cublasSgemm_v2", "kernels": 2,
              "dur_us": 10.0}]
    log = [{"pid": 1, "seq": s, "name": n, "flops": 64.0, "bytes": 100.0, "sms": 2, "dur_us": 1.0}
           for s, n in ((3, "g2"), (1, "a"), (2, "g1"))]
    tasks = P.join(trace, log)
    assert [t.bytes for t in tasks] == [100.0, 200.0] and tasks[1].sm_us == 4.0
    tg = P.targets_of(tasks[1])
    assert tg is not None and tg["bandwidth_gbs"] == pytest.approx(200 / 10e-6 / 1e9)
    assert tg["ipc"] == pytest.approx(128 / 32 / (4e-6 * 1.755e9))
    log[1]["name"] = "b"
    with pytest.raises(P.RunFailed, match="launch-log kernel b"):
        P.join(trace, log)
    log[1]["name"] = "a"
    with pytest.raises(P.RunFailed, match="no launch-log line"):
        P.join(trace, log[:2])
