"""`colocate pipeline plan SPEC` (controlplane/pipeline_plan.py): Camelot's
workflow for a live pipeline of Table I stages - `colocate profile` of each
stage's network alone (simgpu's model), per-stage models from the store
(predictors.stages.store_samples), the allocator, a SPEC that runs."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, clean_env, colocate, ensure_simgpu

from controlplane import pipeline as pl
from predictors.stages import StagePredictor, store_samples
from predictors.store import Store

SPEC = """
name = "t-plan"
qos_ms = 2000
batch = 4

[[stage]]
kind = "semantic-understanding"
instances = 1
quota = 100

[[stage]]
kind = "image-generation"
instances = 1
quota = 100
"""
QUOTAS = "25,50,100"


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    ensure_simgpu()
    libs = [pl.STAGE_LIB, pl.STAGE_TWINS, pl.TONIC_LIB, *pl.TONIC_TWINS, ROOT / "bench" / "bin" / "tonic-service"]
    r = subprocess.run(["make", "-s", *map(str, libs)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    rd = Path(tempfile.mkdtemp(prefix="plp-", dir="/tmp"))
    dev = tempfile.mkdtemp(prefix="simgpu-plp-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    d = tmp_path_factory.mktemp("plan")
    spec = d / "spec.toml"
    spec.write_text(SPEC)
    env = clean_env(COLOCATE_RUNTIME_DIR=str(rd), SIMGPU_DIR=dev, SIMGPU_TIMESCALE="0")
    yield {"rd": rd, "env": env, "spec": spec, "store": d / "store", "dir": d}
    shutil.rmtree(rd, ignore_errors=True)
    shutil.rmtree(dev, ignore_errors=True)


def plan(place, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return colocate("pipeline", "plan", str(place["spec"]), "--device", "sim", "--store", str(place["store"]),
                    "--quotas", QUOTAS, *args, env=place["env"], timeout=timeout)


@pytest.fixture(scope="module")
def planned(place):
    out = place["dir"] / "planned.toml"
    r = plan(place, "--load", "20", "--json", "--write", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return json.loads(r.stdout), out


def test_plan_profiles_each_stage_and_writes_a_spec_that_runs(place, planned):
    doc, path = planned
    spec = tomllib.loads(path.read_text())
    assert [s["kind"] for s in spec["stage"]] == ["semantic-understanding", "image-generation"]
    for s, d in zip(spec["stage"], doc["stages"]):
        assert s["instances"] == d["instances"] >= 1 and s["quota"] == d["quota"]
        assert s["quota"] % 25 == 0                  # only quotas in steps of the profiled ones
        assert len(s["devices"]) == s["instances"] and set(s["devices"]) == {0}
        assert d["profile"].startswith("tonic:") and "--width 0.1" in d["profile"]
    assert doc["predicted_qps"] >= 20 and doc["latency_ms"] <= doc["planned_for_ms"]
    assert doc["planned_for_ms"] == pytest.approx(2000 * (1 - pl.HEADROOM))
    r = colocate("pipeline", "run", str(path), "--device", "sim", "--queries", "6", "--rate", "20",
                 env=place["env"], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_plan_resumes_the_profile_and_peak_uses_more(place, planned):
    doc, _ = planned
    before = {p.name: p.stat().st_size for p in place["store"].rglob("*.jsonl")}
    r = plan(place, "--json")                        # peak: Eq. 1 on the same samples
    assert r.returncode == 0, r.stderr[-2000:]
    assert {p.name: p.stat().st_size for p in place["store"].rglob("*.jsonl")} == before   # nothing re-run
    peak = json.loads(r.stdout)
    assert peak["predicted_qps"] > doc["predicted_qps"]
    assert peak["resources_pct"] > doc["resources_pct"]


def test_store_samples_scale_word_stages_by_the_batch(place, planned):
    """A word net runs each query's sentence alone: batch b takes b times
    one sentence; an image net is profiled at each batch."""
    st = Store(place["store"], "simgpu")
    sem = store_samples(st, "tonic:sem --width 0.1", 30, True, lambda b: 1.0, lambda b: 1.0, batches=(1, 2, 4))
    d = {(int(b), int(p)): x for (b, p), x in zip(sem.X, sem.y["duration_s"])}
    for q in (25, 50, 100):
        assert d[4, q] == pytest.approx(4 * d[1, q]) and d[1, q] > 0
    gan = store_samples(st, "tonic:gan --width 0.1", 1, False, lambda b: 1.0, lambda b: 1.0)
    assert sorted({int(b) for b in gan.X[:, 0]}) == [1, 2, 4]
    assert np.all(gan.y["bandwidth_gbs"] > 0)
    m = StagePredictor("dt").fit(gan).as_stage()
    assert m.duration_s(25, 4) >= m.duration_s(100, 4) > 0   # fewer SMs: no faster
    with pytest.raises(ValueError, match="colocate profile tonic:vgg"):
        store_samples(st, "tonic:vgg --width 0.1", 1, False, lambda b: 1.0, lambda b: 1.0)


def test_plan_refuses_what_it_cannot_plan(place, tmp_path):
    art = tmp_path / "art.toml"
    art.write_text((ROOT / "bench" / "camelot" / "specs" / "p1-c2-m1.toml").read_text())
    r = colocate("pipeline", "plan", str(art), "--device", "sim", "--store", str(place["store"]), env=place["env"])
    assert r.returncode == 2 and "plan profiles Table I stages" in r.stderr, r.stderr
    r = plan(place, "--allocator", "nope")
    assert r.returncode == 2 and "unknown allocator 'nope'" in r.stderr, r.stderr
    r = plan(place, "--allocator", "ea", "--load", "5")
    assert r.returncode == 2 and "no low-load form" in r.stderr, r.stderr
    r = plan(place, "--quotas", "0,50")
    assert r.returncode == 2 and "--quotas must be in 1..100" in r.stderr, r.stderr
