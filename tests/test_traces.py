"""Task traces for the trace-driven simulator (predictors/traces.py, `colocate traces`):
recorded on simgpu timing-only, checked against simgpu's launch log."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from predictors import profile as P
from predictors import traces as T
from shim import paths

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "bench" / "bin"

pytestmark = pytest.mark.skipif(
    not (BIN / "tonic-service").exists() or not (BIN / "hotspot").exists()
    or not paths.SIMGPU_CUDART.exists() or not paths.LIBCOLOCATE.exists(),
    reason="bench programs, shim or simgpu not built (make build)")

HOT_ARGS = "--size 64 --iters 4 --pyramid 1"     # 4 kernels per iteration


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("COLOCATE_", "SIMGPU_", "CUDA_MPS"))}


@pytest.fixture(autouse=True)
def _no_device_settings(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("COLOCATE_", "SIMGPU_", "CUDA_MPS")):
            monkeypatch.delenv(k)


@pytest.fixture(scope="module")
def hot(tmp_path_factory) -> tuple[T.Trace, Path, Path]:
    tmp = tmp_path_factory.mktemp("hot")
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(clean_env())
    try:
        tr = T.record("hotspot", tmp / "hotspot.jsonl", args=HOT_ARGS, raw=tmp / "raw")
    finally:
        os.environ.clear()
        os.environ.update(old)
    return tr, tmp / "hotspot.jsonl", tmp / "raw"


@pytest.fixture(scope="module")
def svc(tmp_path_factory) -> tuple[T.Trace, Path, Path]:
    tmp = tmp_path_factory.mktemp("svc")
    old = dict(os.environ)
    os.environ.clear()
    os.environ.update(clean_env())
    try:
        tr = T.record("tonic:pos", tmp / "pos.jsonl", sizes=[8, 8], service_args="--width 0.5",
                      raw=tmp / "raw")
    finally:
        os.environ.clear()
        os.environ.update(old)
    return tr, tmp / "pos.jsonl", tmp / "raw"


def kernel_keys(tasks) -> list[tuple]:
    return [(t.name, list(t.grid), list(t.block), t.flops, t.bytes) for t in tasks
            if t.kind == "kernel"]


def log_keys(path: Path) -> list[tuple]:
    rows = sorted(P.read_jsonl(path), key=lambda r: int(r["seq"]))
    return [(r["name"], r["grid"], r["block"], float(r["flops"]), float(r["bytes"])) for r in rows]


def is_slice(part: list, whole: list) -> bool:
    return any(whole[i:i + len(part)] == part for i in range(len(whole) - len(part) + 1))


def test_batch_iteration_matches_launch_log(hot):
    tr, _, raw = hot
    assert tr.cls == "batch" and tr.iteration() is tr.tasks
    mine = kernel_keys(tr.tasks)
    assert len(mine) == 4
    one, two = log_keys(raw / "r1" / "launch.jsonl"), log_keys(raw / "r2" / "launch.jsonl")
    # one iteration more in the 2-run log: exactly the trace's kernels, in order
    assert len(two) - len(one) == len(mine)
    assert is_slice(mine, two)
    assert all(t.regs > 0 and t.smem > 0 for t in tr.tasks if t.kind == "kernel")


def test_batch_copies_gaps_and_syncs(hot):
    tr, _, _ = hot
    kinds = [t.kind for t in tr.tasks]
    # per run: a blocking H2D of the temperatures, a memset, the kernels
    assert kinds == ["h2d", "memset"] + ["kernel"] * 4
    assert tr.tasks[0].bytes == tr.tasks[1].bytes == 64 * 64 * 4
    assert all(t.gap_us >= 0 for t in tr.tasks)
    # the memset follows a blocking copy; the kernels follow async calls,
    # and the loop's H2D follows the previous run's kernels with no wait
    assert [t.sync for t in tr.tasks] == [False, True, False, False, False, False]
    assert {t.stream for t in tr.tasks} == {0} and all(t.query is None for t in tr.tasks)


def test_service_queries(svc):
    tr, _, raw = svc
    assert tr.cls == "qos" and tr.sizes() == [8]
    a, b = tr.query_tasks(8)
    assert a and [t.key() for t in a] == [t.key() for t in b]
    assert {t.query for t in a} == {tr.queries[0].id}
    assert a[0].kind == "h2d" and a[-1].kind == "d2h"
    assert a[0].sync                         # the previous query ended with a wait
    assert all(t.gap_us >= 0 for t in tr.tasks) and all(q.tail_us >= 0 for q in tr.queries)
    assert is_slice(kernel_keys(a), log_keys(raw / "launch.jsonl"))
    assert [(q.first, q.last) for q in tr.queries] == [(0, len(a) - 1),
                                                        (len(a), len(a) + len(b) - 1)]
    with pytest.raises(T.TraceError, match="service"):
        tr.iteration()


def test_load_round_trips(hot, svc):
    for tr, path, _ in (hot, svc):
        back = T.load(path)
        assert back == tr
        head = json.loads(path.read_text().splitlines()[0])
        assert set(head) >= {"kind", "version", "name", "cls", "cmd", "device", "recorded"}
        assert head["device"]["SIMGPU_TIMING_ONLY"] == "1"


def test_bad_input(tmp_path):
    with pytest.raises(T.TraceError, match="unknown program 'nosuchapp'"):
        T.record_all(["nosuchapp"], tmp_path)
    with pytest.raises(T.TraceError, match="unknown Tonic net 'xyz'"):
        T.record_all(["tonic:xyz"], tmp_path)
    with pytest.raises(T.TraceError, match="cannot read"):
        T.load(tmp_path / "missing.jsonl")
    bad = tmp_path / "v2.jsonl"
    bad.write_text(json.dumps({"kind": "header", "version": 2}) + "\n")
    with pytest.raises(T.TraceError, match="version 2"):
        T.load(bad)
    bad.write_text('{"kind": "kernel"}\n')
    with pytest.raises(T.TraceError, match="no header"):
        T.load(bad)
    bad.write_text(json.dumps({"kind": "header", "version": 1}) + '\n{"kind": "h2d"}\n')
    with pytest.raises(T.TraceError, match="bad h2d line"):
        T.load(bad)


def test_cli(tmp_path):
    env = clean_env()
    env["COLOCATE_DATA_DIR"] = str(tmp_path / "data")
    cmd = [sys.executable, "-m", "controlplane.cli", "traces"]
    res = subprocess.run(cmd + ["lavamd", "--args", "--boxes 2 --par 10"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    files = list((tmp_path / "data" / "traces").glob("*/lavamd@*.jsonl"))
    assert len(files) == 1 and T.load(files[0]).tasks
    assert "lavamd: " in res.stderr and "one iteration" in res.stderr
    again = subprocess.run(cmd + ["lavamd", "--args", "--boxes 2 --par 10"], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "--force" in again.stderr
    bad = subprocess.run(cmd + ["hotspot", "nosuchapp"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown program 'nosuchapp'" in bad.stderr
