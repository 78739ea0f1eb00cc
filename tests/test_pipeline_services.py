"""Table I's services live (§III-A): `colocate pipeline run` with stages that
are Tonic networks of cuDNN / cuBLAS layers (bench/camelot/tonic_stage.cu,
bench/camelot/stage_worker.py's NetStage), on simgpu.

Each stage is checked against the CPU reference forward pass (ref.c), and a
two-stage service run live - queries batched, buffers handed between stage
processes by handle or through the host - must give every query the bytes
the same stages give it in one process, one query at a time
(bench/camelot/chain.py): so a stage that adapts, computes or hands on the
wrong bytes, or whose result depends on its batch, fails here."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import PY, ROOT, clean_env, colocate, ensure_simgpu

from controlplane import pipeline as pl

SCALE = 0.01
SERVICE = ["semantic-understanding", "image-generation"]        # text-to-img
SPEC = f"""
name = "t-text-to-img"
qos_ms = 3000
batch = 3
scale = {SCALE}

[[stage]]
kind = "{SERVICE[0]}"
instances = 1
quota = 40

[[stage]]
kind = "{SERVICE[1]}"
instances = 2
quota = 30
"""
TWINS = ":".join(str(p) for p in (*pl.TONIC_TWINS, pl.STAGE_TWINS))


@pytest.fixture(scope="module")
def place():
    ensure_simgpu()
    libs = [pl.STAGE_LIB, pl.STAGE_TWINS, pl.TONIC_LIB, *pl.TONIC_TWINS]
    r = subprocess.run(["make", "-s", *map(str, libs)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, f"building the stage libraries failed:\n{r.stderr[-3000:]}"
    rd = Path(tempfile.mkdtemp(prefix="pls-", dir="/tmp"))
    dev = tempfile.mkdtemp(prefix="simgpu-pls-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    env = clean_env(COLOCATE_RUNTIME_DIR=str(rd), SIMGPU_DIR=dev, SIMGPU_TIMESCALE="0")
    yield rd, env
    shutil.rmtree(rd, ignore_errors=True)
    shutil.rmtree(dev, ignore_errors=True)


def chain(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """bench/camelot/chain.py on simgpu, under the shim as an app."""
    return colocate("run", "--device", "sim", "--", "env", f"SIMGPU_TWINS={TWINS}", PY,
                    str(ROOT / "bench" / "camelot" / "chain.py"), *args, env=env, timeout=600)


def test_every_table1_stage_matches_the_cpu_reference(place):
    """All eight stages of the four services, a batch of 2 queries each (one
    pass of two images, or two sentences), against ref.c."""
    _, env = place
    r = chain(env, "--kinds", ",".join(pl.suite().NETS), "--scale", "0.004", "--queries", "2", "--check")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(res) == set(pl.suite().NETS)
    for kind, v in res.items():
        assert v["bad"] == 0 and v["n"] > 0 and v["distinct"] == 2, (kind, v)


@pytest.mark.parametrize("service", ["img-to-img", "img-to-text", "text-to-text"])
def test_every_service_gives_each_query_its_own_result(place, service):
    """Through both stages, one process: a stage whose output no longer
    depends on its input (a predecessor's softmax, say, vanishing under the
    next network's first biases) would give every query the same bytes."""
    _, env = place
    kinds = [st.name for st in pl.suite().SERVICES[service]]
    r = chain(env, "--kinds", ",".join(kinds), "--scale", "0.004", "--queries", "3")
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(set(json.loads(r.stdout.strip().splitlines()[-1]))) == 3


@pytest.fixture(scope="module")
def reports(place, tmp_path_factory) -> dict[str, dict]:
    rd, env = place
    spec = tmp_path_factory.mktemp("spec") / "text-to-img.toml"
    spec.write_text(SPEC)
    out = {}
    for mode in ("handle", "copy"):
        f = tmp_path_factory.mktemp(mode) / "report.json"
        r = colocate("pipeline", "run", str(spec), "--device", "sim", "--queries", "12", "--rate", "40",
                     "--json", str(f), *(["--copy"] if mode == "copy" else []), env=env, timeout=300)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        out[mode] = json.loads(f.read_text())
    return out


def test_a_service_live_gives_each_query_its_own_bytes_with_handles_and_copies(place, reports):
    _, env = place
    r = chain(env, "--kinds", ",".join(SERVICE), "--scale", str(SCALE), "--queries", "12")
    assert r.returncode == 0, r.stderr[-2000:]
    want = json.loads(r.stdout.strip().splitlines()[-1])
    h, c = reports["handle"], reports["copy"]
    assert h["checksums"] == c["checksums"] == want
    assert len(set(want)) == 12
    hop = h["hops"][0]
    assert hop["handoffs"] > 0 and hop["copies"] == 0          # one device: handles, no copies
    assert c["hops"][0]["handoffs"] == 0
    assert max(s["mean_batch"] for s in h["stages"]) > 1       # batching happened: bytes must not depend on it


def test_artifact_and_table1_stages_do_not_mix(place, tmp_path):
    _, env = place
    spec = tmp_path / "mixed.toml"
    spec.write_text(SPEC.replace(f'kind = "{SERVICE[1]}"', 'kind = "c1"'))
    r = colocate("pipeline", "run", str(spec), "--device", "sim", "--queries", "2", env=env)
    assert r.returncode == 2 and "do not mix" in r.stderr, r.stderr
