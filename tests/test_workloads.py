"""Every bench workload under the shim on simgpu, traced: the eight Rodinia
batch apps and the six Tonic services pass their own checks under
`colocate trace`, and every task they ran is in the trace with what the
predictors need (kernels: grid/block/device time; cuDNN/cuBLAS calls: their
parameters and the kernels they launched)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import RODINIA_SMALL, TONIC_SMALL, stats_of

from shim import paths

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "bench" / "bin"

RODINIA, TONIC = RODINIA_SMALL, TONIC_SMALL
# what a predictor keys on, per library entry point (C-Laius Table 1)
LIB_KEYS = {
    "cudnnConvolutionForward": {"n", "c", "h", "w", "k", "r", "s", "pad_h", "stride_h", "out_h"},
    "cudnnActivationForward": {"n", "c", "h", "w"},
    "cudnnPoolingForward": {"n", "c", "h", "w"},
    "cudnnSoftmaxForward": {"n", "c"},
    "cudnnAddTensor": {"n", "c", "h", "w"},
    "cublasSgemm_v2": {"m", "n", "k", "transa", "transb"},
    "cublasGemmEx": {"m", "n", "k", "transa", "transb"},
    "cublasSgemmStridedBatched": {"m", "n", "k", "batch"},
}

pytestmark = pytest.mark.skipif(
    not (BIN / "tonic-service").exists() or not paths.SIMGPU_CUDART.exists(),
    reason="bench programs or simgpu not built (make build)")


def trace(name: str, cmd: list[str], tmp: Path) -> tuple[str, list[dict]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLOCATE_", "SIMGPU_", "CUDA_MPS"))}
    env.update(COLOCATE_RUNTIME_DIR=str(tmp / "run"), SIMGPU_DIR=str(tmp / "sim"),
               SIMGPU_TIMESCALE="0")
    out = tmp / "trace.jsonl"
    res = subprocess.run([sys.executable, "-m", "controlplane.cli", "trace", name, "--device", "sim",
                          "--out", str(out), "--", *cmd], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout, [json.loads(ln) for ln in out.read_text().splitlines()]


@pytest.mark.parametrize("app", sorted(RODINIA))
def test_rodinia_app_traced(app, tmp_path):
    out, recs = trace(app, [str(BIN / app), *RODINIA[app], "--check"], tmp_path)
    assert f"PASS {app}" in out
    kernels = [r for r in recs if r["kind"] == "kernel"]
    # one task per launch the program made, each named and shaped
    assert len(kernels) == stats_of(out)["launches"] > 0
    for r in kernels:
        assert r["name"].startswith("_Z"), r
        assert all(v >= 1 for v in r["grid"] + r["block"]), r
        assert r["dur_us"] is not None and r["dur_us"] > 0, r
        assert r["quota"] == 100 and r["route"] == "local"
    assert not [r for r in recs if r["kind"] == "library"]


@pytest.mark.parametrize("net", sorted(TONIC))
def test_tonic_service_traced(net, tmp_path):
    out, recs = trace(net, [str(BIN / "tonic-service"), "--net", net, "--check", "--size", "2",
                            *TONIC[net]], tmp_path)
    assert f"PASS tonic-{net}" in out
    libs = [r for r in recs if r["kind"] == "library"]
    assert libs, "no cuDNN/cuBLAS task recorded"
    for r in libs:
        want = LIB_KEYS.get(r["name"])
        assert want is not None, f"unexpected library task {r['name']}"
        assert want <= set(r["params"]), (r["name"], r["params"])
        assert r["rc"] == 0 and r["kernels"] >= 1 and r["dur_us"] > 0, r
    # the kernels inside library calls are not tasks of their own; the
    # service's own kernels (embedding lookups, window sums) are
    assert all(not r["name"].startswith("sgpu_") for r in recs if r["kind"] == "kernel")
    # one query, begun and ended, every task inside it
    begins = [r for r in recs if r["kind"] == "query_begin"]
    ends = [r for r in recs if r["kind"] == "query_end"]
    assert len(begins) == len(ends) == 1 and ends[0]["latency_us"] > 0
    tasks = [r for r in recs if r["kind"] in ("kernel", "library")]
    assert all(r["query"] == begins[0]["id"] for r in tasks)


def test_tonic_image_nets_use_convolutions_and_gemms(tmp_path):
    """The image nets are CNNs (conv, bias, activation, pooling, softmax, FC)."""
    _, recs = trace("imc", [str(BIN / "tonic-service"), "--net", "imc", "--check", "--size", "2",
                            *TONIC["imc"]], tmp_path)
    names = {r["name"] for r in recs if r["kind"] == "library"}
    assert {"cudnnConvolutionForward", "cudnnActivationForward", "cudnnPoolingForward",
            "cudnnSoftmaxForward", "cudnnAddTensor"} <= names
    assert names & {"cublasSgemm_v2", "cublasGemmEx"}
