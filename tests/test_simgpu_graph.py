"""Stream capture and CUDA graphs on simgpu, and how the shim counts them.

bench/progs/graphs captures three kernels and two async copies (with a fork
into a second stream and a join back through events), launches the graph
100 times, builds a small graph by hand (launched 3 times), launches one
kernel directly, checks every result on the host, and tries calls a capture
forbids.  Here it runs on simgpu alone (results, node counts, CUDA's error
codes, the device model timing each replayed kernel) and under the shim with
a controller, whose record must count each kernel of each graph launch:
100 launches of each captured kernel, not 100 "graph launches", and nothing
for the launches a capture recorded without running them.

tests/graph/graphapi.c (plain C on simgpu's runtime, kernels defined by
name) checks the rest of the API, alone and under the shim, where the
shim's counts must equal what simgpu ran (child graphs, updates, graphs
launched into captures).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import clean_env, simgpu_env, stop, wait_until

from shim import paths

ROOT = Path(__file__).resolve().parents[1]
PROG = ROOT / "bench" / "bin" / "graphs"
COLOCATE = [sys.executable, "-m", "controlplane.cli"]

pytestmark = pytest.mark.skipif(not PROG.exists() or not paths.SIMGPU_CUDART.exists(),
                                reason="bench/bin/graphs or simgpu not built (make build)")

LAUNCHES = 100
CAPTURED = {"_Z3incPiPKii": LAUNCHES, "_Z5countPii": LAUNCHES,
            "_Z7combinePiPKiS1_ii": LAUNCHES}
BY_HAND = {"_Z5addtoPiPKii": 3, "_Z4bumpPii": 3}
DIRECT = {"_Z4iotaPii": 1}

# cudaError_t values (driver_types.h)
UNSUPPORTED, INVALIDATED, IMPLICIT = 900, 901, 906
# what the program's calls that a capture forbids return
ILLEGAL = {
    "legacy_begin": UNSUPPORTED,     # the legacy stream cannot capture
    "sync": UNSUPPORTED,             # cudaStreamSynchronize of a capturing stream
    "end_after_sync": INVALIDATED,
    "memcpy": 0,                     # synchronous copy D2H into pinned memory in global mode: legal
    "end_after_memcpy": 0,           # (an H200 and an H100 said so, bench/RESULTS.md), the capture valid
    "memcpy_pageable": 0,            # into pageable memory: legal too (the H100)
    "end_after_memcpy_pageable": 0,
    "relaxed_memcpy": 0,             # allowed once the thread is relaxed
    "implicit": IMPLICIT,            # legacy stream while a blocking stream captures
    "end_after_implicit": INVALIDATED,
}


def summary(out: str) -> dict:
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, out
    return json.loads(lines[0])


def test_graphs_replay_on_simgpu_with_cuda_errors_for_illegal_capture_calls(simdir, tmp_path):
    log = tmp_path / "launches.jsonl"
    r = subprocess.run([str(PROG), "--launches", str(LAUNCHES)], env=simgpu_env(simdir, SIMGPU_LAUNCH_LOG=str(log)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS graphs" in r.stdout            # the program checked every result
    s = summary(r.stdout)
    assert s["ok"] and s["graph_launches"] == LAUNCHES
    # event records and waits are edges of the capture, not nodes
    assert s["captured_nodes"] == 5 and s["captured_kernels"] == 3
    assert s["manual_nodes"] == 5
    assert s["capture_id"] > 0
    assert s["errors"] == ILLEGAL
    # every replayed kernel went through the device model, once per launch
    runs: dict[str, int] = {}
    for line in log.read_text().splitlines():
        rec = json.loads(line)
        assert rec["dur_us"] >= 0
        runs[rec["name"]] = runs.get(rec["name"], 0) + 1
    assert runs == {**CAPTURED, **BY_HAND, **DIRECT}


def test_graphs_repeatable_inline_and_in_small_sizes(simdir):
    # SIMGPU_SYNC runs every operation at enqueue: replays in the caller's thread
    r = subprocess.run([str(PROG), "--launches", "7", "--n", "1000"], env=simgpu_env(simdir, SIMGPU_SYNC="1"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert summary(r.stdout)["graph_launches"] == 7


@pytest.fixture(scope="module")
def graphapi(tmp_path_factory) -> Path:
    """tests/graph/graphapi.c built against simgpu's libcudart.so.13."""
    exe = tmp_path_factory.mktemp("graphapi") / "graphapi"
    lib = paths.SIMGPU_CUDART.parent
    cuda_inc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    subprocess.run(["cc", "-O1", "-Wall", "-Werror", "-I", str(cuda_inc), "-I", str(ROOT / "shim" / "simgpu"),
                    "-o", str(exe), str(ROOT / "tests" / "graph" / "graphapi.c"), "-L", str(lib),
                    "-l:libcudart.so.13", f"-Wl,-rpath,{lib}", "-rdynamic", "-ldl", "-lpthread"],
                   check=True, timeout=60)
    return exe


def test_capture_and_graph_api_details(simdir, graphapi):
    """tests/graph/graphapi.c: captured arguments, graphs launched into a
    capture, host and memset nodes, Unjoined / Unmatched / Isolation /
    WrongThread, external event nodes, roots, cycles, capture into a graph,
    the per-thread stream, a capturing stream destroyed, child graphs,
    cudaGraphExecUpdate and node parameters set on graphs and execs."""
    r = subprocess.run([str(graphapi)], env=simgpu_env(simdir), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("ok ") == 9 and "PASS graphapi" in r.stdout, r.stdout


# ---------------------------------------------------------------- under the shim

def colocate(*args: str, rundir: Path, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    res = subprocess.run([*COLOCATE, *args[:1], "--runtime-dir", str(rundir), *args[1:]],
                         capture_output=True, text=True, timeout=60, cwd=ROOT, env=clean_env(**env))
    if check and res.returncode != 0:
        raise AssertionError(f"colocate {' '.join(args)} -> {res.returncode}\n{res.stdout}\n{res.stderr}")
    return res


@pytest.fixture()
def controller():
    d = Path(tempfile.mkdtemp(prefix="cl-graph-", dir="/tmp"))     # short: socket paths
    proc = subprocess.Popen([*COLOCATE, "serve", "--runtime-dir", str(d), "--device", "sim", "--pool", "none"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=clean_env())
    try:
        wait_until(lambda: colocate("ping", rundir=d, check=False).returncode == 0,
                   what="controller to answer ping")
        yield d
    finally:
        stop(proc)
        shutil.rmtree(d, ignore_errors=True)


def final_record(rundir: Path, name: str) -> dict | None:
    apps = [a for a in json.loads(colocate("quotas", "--json", "--all", rundir=rundir).stdout)
            if a["name"] == name]
    return apps[0] if apps and apps[0]["state"] == "exited" else None


def test_shim_counts_each_kernel_of_each_graph_launch(controller):
    res = colocate("run", "--device", "sim", "--name", "t-graphs", "--class", "batch", "--",
                   str(PROG), "--launches", str(LAUNCHES), rundir=controller, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASS graphs" in res.stdout
    s = summary(res.stdout)
    assert s["errors"] == ILLEGAL        # the hooks change no error

    rec = wait_until(lambda: final_record(controller, "t-graphs"), what="the app's final record")
    per_kernel = {k["name"]: k["launches"] for k in rec["kernels"]}
    # 100 per captured kernel (its capture counted nothing), 3 per kernel of
    # the hand-built graph, the direct launch; the launches into failed
    # captures returned errors and count nothing
    assert per_kernel == {**CAPTURED, **BY_HAND, **DIRECT}
    assert rec["launches"] == 3 * LAUNCHES + 2 * 3 + 1 == sum(per_kernel.values())
    assert all(k["twin"] is True for k in rec["kernels"])
    # copies count when a graph launch runs them, not when captured or added:
    # the captured H2D and D2H copies 100 times, the hand-built graph's D2H
    # copy 3 times, and the program's six cudaMemcpy D2H that ran (the pinned one in global
    n_bytes = s["n"] * 4
    assert rec["h2d_bytes"] == LAUNCHES * n_bytes
    assert rec["d2h_bytes"] == (LAUNCHES + 3 + 6) * n_bytes     # mode too, and the pageable one
    assert rec["forwarded"] == 0


def test_shim_counts_what_simgpu_ran_through_child_graphs_and_captures(controller, graphapi, tmp_path):
    """graphapi under the shim: child graphs (walked recursively), graphs
    launched into captures, failed captures.  Whatever the paths, the
    shim's count per kernel is what simgpu really ran (its launch log)."""
    log = tmp_path / "launches.jsonl"
    res = colocate("run", "--device", "sim", "--name", "t-graphapi", "--class", "batch", "--",
                   str(graphapi), rundir=controller, check=False, SIMGPU_LAUNCH_LOG=str(log))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "PASS graphapi" in res.stdout
    ran: dict[str, int] = {}
    for line in log.read_text().splitlines():
        name = json.loads(line)["name"]
        ran[name] = ran.get(name, 0) + 1
    rec = wait_until(lambda: final_record(controller, "t-graphapi"), what="the app's final record")
    assert {k["name"]: k["launches"] for k in rec["kernels"]} == ran == {"t_add": rec["launches"]}
