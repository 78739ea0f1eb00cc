"""The shim's task layer on simgpu: one trace record per task (kernel launch,
or library call with the kernels it launched), device times from events,
query boundaries from the API and from inference, and what the controller
makes of them (`colocate quotas`)."""
from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import PY, ROOT, Controller, clean_env, colocate, new_rundir, stats_of, wait_for

from controlplane.cli import TRACE_COLUMNS
from shim import paths, query

BIN = ROOT / "bench" / "bin"
DNNCHECK = paths.LIB_DIR / "dnncheck"

pytestmark = pytest.mark.skipif(
    not (BIN / "querydemo").exists() or not paths.SIMGPU_CUDART.exists() or not paths.LIBCOLOCATE.exists(),
    reason="bench programs or simgpu not built (make build)")


def sim_env(tmp: Path, trace: Path | None = None, **extra: str) -> dict[str, str]:
    """A program under the shim on a private simgpu, with no controller."""
    env = clean_env(LD_PRELOAD=str(paths.LIBCOLOCATE), LD_LIBRARY_PATH=str(paths.SIMGPU_DIR),
                    SIMGPU_DIR=str(tmp / "sim"), SIMGPU_TIMESCALE="0",
                    COLOCATE_RUNTIME_DIR=str(tmp / "rd"), **extra)
    if trace is not None:
        env["COLOCATE_TRACE"] = str(trace)
    return env


def run(cmd: list, env: dict[str, str]) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
    return r


def records(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def tasks(recs: list[dict], kind: str = "kernel") -> list[dict]:
    return [r for r in recs if r["kind"] == kind]


# --- kernel tasks -------------------------------------------------------------

def test_one_record_per_launch_with_its_shape_and_device_time(tmp_path):
    trace = tmp_path / "t.jsonl"
    r = run([BIN / "vecadd", "--n", "5000", "--repeat", "7", "--block", "128"], sim_env(tmp_path, trace))
    recs = records(trace)
    ks = tasks(recs)
    assert len(ks) == stats_of(r.stdout)["launches"] == 7
    assert {r["kind"] for r in recs} <= {"kernel", "query_begin", "query_end"}
    for k in ks:
        assert k["name"] == "_Z6vecaddPKfS0_Pfi" and k["app"] == "vecadd"
        assert (k["grid"], k["block"], k["shmem"]) == ([40, 1, 1], [128, 1, 1], 0)
        assert k["dur_us"] > 0 and k["start_us"] >= 0
        assert (k["quota"], k["route"], k["worker"], k["stream"]) == (100, "local", None, "0x0")
    # one stream: modelled back to back, in issue order
    starts = [k["start_us"] for k in ks]
    assert starts == sorted(starts) and starts[0] == 0
    assert len({r["seq"] for r in recs}) == len(recs) and len({r["pid"] for r in recs}) == 1


def test_hotspot_grid_block_and_duration_scale_with_the_work(tmp_path):
    small, big = tmp_path / "s.jsonl", tmp_path / "b.jsonl"
    run([BIN / "hotspot", "--size", "80", "--iters", "6", "--pyramid", "1"], sim_env(tmp_path, small))
    run([BIN / "hotspot", "--size", "320", "--iters", "2", "--pyramid", "1"], sim_env(tmp_path, big))
    ks, kb = tasks(records(small)), tasks(records(big))
    assert len(ks) == 6 and len(kb) == 2
    assert all(k["grid"] == [5, 5, 1] and k["block"] == [16, 16, 1] for k in ks)
    assert all(k["grid"] == [20, 20, 1] for k in kb)
    assert all(k["name"] == "_Z12hotspot_stepPKfS0_Pfiifffff" for k in ks + kb)
    # 16x the cells: the device model must say it takes longer
    assert min(k["dur_us"] for k in kb) > max(k["dur_us"] for k in ks) > 0


def test_stream_and_quota_from_mps_percentage(tmp_path):
    trace = tmp_path / "t.jsonl"
    run([BIN / "vecadd", "--n", "2000", "--stream", "--repeat", "3"],
        sim_env(tmp_path, trace, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="30"))
    ks = tasks(records(trace))
    assert len(ks) == 3
    assert all(k["stream"] != "0x0" and k["quota"] == 30 and k["dur_us"] > 0 for k in ks)
    assert len({k["stream"] for k in ks}) == 1


EVCOUNT_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
/* counts the events the process creates (the shim's included), then
 * forwards to the real runtime */
static int created;
static void report(void)
{
	FILE *f = fopen(getenv("EVCOUNT_OUT"), "w");
	if (f) { fprintf(f, "%d\n", created); fclose(f); }
}
__attribute__((constructor)) static void init(void) { atexit(report); }
int cudaEventCreateWithFlags(void **e, unsigned flags)
{
	int (*real)(void **, unsigned) = (int (*)(void **, unsigned))dlsym(RTLD_NEXT, "cudaEventCreateWithFlags");
	__atomic_fetch_add(&created, 1, __ATOMIC_RELAXED);
	return real(e, flags);
}
int cudaEventCreate(void **e)
{
	int (*real)(void **) = (int (*)(void **))dlsym(RTLD_NEXT, "cudaEventCreate");
	__atomic_fetch_add(&created, 1, __ATOMIC_RELAXED);
	return real(e);
}
"""


def test_trace_off_writes_nothing_and_creates_no_event(tmp_path):
    src, lib, count = tmp_path / "evcount.c", tmp_path / "libevcount.so", tmp_path / "count"
    src.write_text(EVCOUNT_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib, src, "-ldl"], check=True)
    preload = f"{paths.LIBCOLOCATE}:{lib}"      # the shim's lookups of the real API find the counter
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = sim_env(tmp_path, None, EVCOUNT_OUT=str(count))
    env["LD_PRELOAD"] = preload
    r = subprocess.run([BIN / "vecadd", "--n", "1000", "--repeat", "5"], env=env, cwd=cwd,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert int(count.read_text()) == 0 and list(cwd.iterdir()) == []
    # the same run traced: the counter does see the shim's events
    env["COLOCATE_TRACE"] = str(tmp_path / "t.jsonl")
    r = subprocess.run([BIN / "vecadd", "--n", "1000", "--repeat", "5"], env=env, cwd=cwd,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert int(count.read_text()) >= 3 and len(tasks(records(tmp_path / "t.jsonl"))) == 5


def test_unwritable_trace_never_breaks_the_app(tmp_path):
    r = run([BIN / "vecadd", "--n", "1000", "--repeat", "3"],
            sim_env(tmp_path, tmp_path / "no" / "such" / "dir" / "t.jsonl"))
    assert "tracing off" in r.stderr


def test_driver_launches_are_tasks_too(tmp_path):
    """Programs with static cudart reach only the driver hooks: on simgpu's
    libcuda.so.1 the tasks are timed with the driver's events."""
    drvapi = BIN / "test-drvapi"
    if not (BIN / "test-drvapi.fatbin").exists() or not (paths.SIMGPU_DIR / "libcuda.so.1").exists():
        pytest.skip("bench/bin/test-drvapi, its fat binary or simgpu's libcuda not built")
    trace = tmp_path / "t.jsonl"
    env = sim_env(tmp_path, trace)
    r = subprocess.run([drvapi, "2", "1", "1"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
    ks = tasks(records(trace))
    n = int(re.search(r"DRVAPI launches=(\d+)", r.stdout).group(1))
    assert len(ks) == n == 5
    assert all(k["name"] == "add_one" and k["block"] == [256, 1, 1] for k in ks)
    assert all(k["start_us"] is not None and k["dur_us"] is not None and k["dur_us"] >= 0 for k in ks)
    assert "no event API" not in r.stderr


# --- library tasks --------------------------------------------------------------

def test_library_tasks_own_the_kernels_they_launch(tmp_path):
    hooks = (ROOT / "shim" / "hook_lib.c").exists()
    if not DNNCHECK.exists() or not hooks:
        pytest.skip("library hooks (shim/hook_lib.c) or simgpu's cuDNN/cuBLAS (shim/lib/dnncheck) not built")
    trace = tmp_path / "t.jsonl"
    r = run([DNNCHECK, "2"], sim_env(tmp_path, trace))
    st = stats_of(r.stdout)
    recs = records(trace)
    libs = tasks(recs, "library")
    assert len(libs) == st["calls"] > 0
    assert tasks(recs) == []                                        # no kernel is a task of its own
    assert sum(t["kernels"] for t in libs) == st["launches"]
    assert {t["name"] for t in libs} >= {"cudnnConvolutionForward", "cublasSgemm_v2"}
    for t in libs:
        assert t["rc"] == 0 and t["kernels"] >= 1 and t["dur_us"] > 0
        assert t["grid"] is None and isinstance(t["params"], dict) and t["params"]
    conv = next(t for t in libs if t["name"] == "cudnnConvolutionForward")
    assert {"n", "c", "h", "w", "k"} <= set(conv["params"])


# --- queries --------------------------------------------------------------------

@pytest.mark.parametrize("args,rule", [([], "api"), (["--no-api"], "inferred"),
                                       (["--no-api", "--async"], "inferred")])
def test_queries_in_the_trace(tmp_path, args, rule):
    trace = tmp_path / "t.jsonl"
    run([BIN / "querydemo", "--queries", "4", "--kernels", "3", *args], sim_env(tmp_path, trace))
    recs = records(trace)
    begins, ends = tasks(recs, "query_begin"), tasks(recs, "query_end")
    assert [b["id"] for b in begins] == [e["id"] for e in ends] == [1, 2, 3, 4]
    assert {b["rule"] for b in begins + ends} == {rule}
    assert all(e["latency_us"] >= 0 for e in ends)
    # every kernel belongs to the query it ran in: 3 per query
    ks = tasks(recs)
    assert [k["query"] for k in ks] == [q for q in (1, 2, 3, 4) for _ in range(3)]
    if rule == "api":
        assert {b["size"] for b in begins} == {4096}               # the app's own unit
    else:
        assert {e["size"] for e in ends} == {4096 * 4}             # bytes copied in


def quotas(ctl) -> list[dict]:
    r = colocate("quotas", "--json", "--all", "--runtime-dir", ctl.rundir)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("args,rule,n", [([], "api", 5), (["--no-api"], "inferred", 4),
                                         (["--no-api", "--async"], "inferred", 3)])
def test_controller_counts_the_queries(controller, tmp_path, args, rule, n):
    # inference runs only where something reads it: a QoS app (or a trace)
    name = f"qd-{rule}-{len(args)}"
    r = colocate("run", "--runtime-dir", controller.rundir, "--device", "sim", "--name", name,
                 "--class", "qos", "--", BIN / "querydemo", "--queries", n, *args,
                 env=clean_env(SIMGPU_TIMESCALE="0", SIMGPU_DIR=str(tmp_path)))
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr

    def got():
        q = next((a["queries"] for a in quotas(controller) if a["name"] == name), None)
        return q if q and q["done"] == n else None
    q = wait_for(got, timeout=5)
    assert q is not None, quotas(controller)
    assert (q["rule"], q["done"], q["in_flight"], q["unmatched"], q["window"]) == (rule, n, 0, 0, n)
    assert 0 <= q["p50_ms"] <= q["p99_ms"]
    # the ledger's exact counts agree with the messages, and its run-long
    # percentiles with the window's (the same n queries; buckets ~3 % wide)
    assert (q["begun"], q["messages"]) == (n, n)
    assert q["run"]["p99_ms"] == pytest.approx(q["p99_ms"], rel=0.04, abs=0.002)
    table = colocate("quotas", "--all", "--runtime-dir", controller.rundir).stdout
    assert re.search(rf"{name}\b.*\b{n}\b.*ms\s+{rule}\b", table), table


def test_routed_launches_are_traced_as_worker_tasks(tmp_path):
    """Moved to a 50 % pool worker mid-run: the launches after the move are
    tasks with route "worker" and quota 50, with device times the worker
    measured (they ran there, not on this process's streams)."""
    if not (paths.LIB_DIR / "colocate-worker").exists():
        pytest.skip("colocate-worker not built")
    rd = new_rundir()
    ctl = Controller(rd, "--pool", "50:1")
    try:
        trace = tmp_path / "t.jsonl"
        # the app's simgpu device must be the pool's: the runtime dir's default
        env = clean_env(SIMGPU_TIMESCALE="2000", PYTHONPATH=str(ROOT))
        app = subprocess.Popen([PY, "-m", "controlplane.cli", "run", "--runtime-dir", str(rd), "--device", "sim",
                                "--name", "moved", "--trace", str(trace), "--", str(BIN / "querydemo"),
                                "--queries", "30", "--n", "65536"],
                               env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert wait_for(lambda: any(a["name"] == "moved" and a["launches"] >= 4
                                    for a in ctl.call("list")["apps"]), timeout=20)
        assert ctl.call("set_quota", name="moved", quota_pct=50)["type"] == "ok"
        out, err = app.communicate(timeout=60)
        assert app.returncode == 0 and "PASS" in out, out + err
    finally:
        ctl.stop()
        shutil.rmtree(rd, ignore_errors=True)
    ks = tasks(records(trace))
    assert len(ks) == stats_of(out)["launches"] == 60
    routes = [k["route"] for k in ks]
    moved = routes.index("worker")
    assert 4 <= moved < 60 and set(routes[moved:]) == {"worker"}
    assert all(k["dur_us"] > 0 and k["worker"] is None for k in ks[:moved])
    assert all(k["quota"] == 100 for k in ks[:moved - 1])   # the last may see the new quota first
    assert all(k["quota"] == 50 and k["dur_us"] > 0 and k["worker"] >= 1 for k in ks[moved:])


def test_malformed_query_messages_are_rejected(controller, sleeper):
    p = sleeper()
    assert controller.call("register", pid=p.pid, name="qmsg", **{"class": "qos"})["type"] == "registered"
    bad = [
        ("query_begin", {"pid": p.pid}),                            # no id
        ("query_begin", {"pid": p.pid, "id": -1}),
        ("query_begin", {"pid": p.pid, "id": "7"}),
        ("query_begin", {"pid": p.pid, "id": 1, "rule": "guess"}),
        ("query_begin", {"pid": p.pid, "id": 1, "size": -5}),
        ("query_end", {"pid": p.pid, "id": 2**64}),
        ("query_end", {"pid": p.pid, "id": 1, "t_us": 1.5}),
        ("query_end", {"id": 1}),                                   # no pid
        ("query_begin", {"pid": 999_999_9, "id": 1}),               # not a registered app
    ]
    for t, fields in bad:
        r = controller.call(t, **fields)
        assert r["type"] == "error" and r["in_reply_to"] == t and r["error"], (fields, r)
        assert "Traceback" not in r["error"]
    assert controller.call("query_begin", pid=p.pid, id=2**64 - 1, size=3, t_us=1000)["type"] == "ok"
    assert controller.call("query_end", pid=p.pid, id=2**64 - 1, t_us=3500)["type"] == "ok"
    assert controller.call("query_end", pid=p.pid, id=5, t_us=4000)["type"] == "ok"   # no begin
    rec = next(a for a in controller.call("list")["apps"] if a["pid"] == p.pid)
    assert rec["queries"] == {"rule": "api", "done": 1, "in_flight": 0, "p50_ms": 2.5, "p99_ms": 2.5,
                              "window": 1, "unmatched": 1, "violations": 0}


def test_api_supersedes_inference(controller, sleeper):
    p = sleeper()
    controller.call("register", pid=p.pid, name="qswitch", **{"class": "batch"})
    for i in (1, 2):
        controller.call("query_begin", pid=p.pid, id=i, rule="inferred", t_us=0)
        controller.call("query_end", pid=p.pid, id=i, rule="inferred", t_us=10)
    controller.call("query_begin", pid=p.pid, id=3, rule="inferred", t_us=20)
    controller.call("query_begin", pid=p.pid, id=100, t_us=30)           # the app starts marking
    controller.call("query_end", pid=p.pid, id=3, rule="inferred", t_us=40)   # late: ignored
    rec = next(a for a in controller.call("list")["apps"] if a["pid"] == p.pid)
    assert (rec["queries"]["rule"], rec["queries"]["done"], rec["queries"]["in_flight"]) == ("api", 0, 1)


def test_python_module_without_and_with_the_shim(tmp_path):
    assert not query.active()
    assert query.query_begin(1, 2) is False and query.query_end(1) is False
    with query.query(3):
        pass
    with pytest.raises(ValueError):
        query.query_begin(-1)
    trace = tmp_path / "t.jsonl"
    code = "from shim import query\nassert query.active()\nwith query.query(42, 7): pass\n"
    env = sim_env(tmp_path, trace)
    r = subprocess.run([PY, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    recs = records(trace)
    assert [(x["kind"], x["id"], x["rule"]) for x in recs] == [("query_begin", 42, "api"), ("query_end", 42, "api")]
    assert recs[0]["size"] == 7 and recs[1]["latency_us"] >= 0


# --- the CLI ------------------------------------------------------------------------

def test_colocate_trace_csv_and_jsonl(tmp_path):
    out = tmp_path / "v.csv"
    env = clean_env(SIMGPU_TIMESCALE="0", SIMGPU_DIR=str(tmp_path / "sim"))
    r = colocate("trace", "vt", "--out", out, "--format", "csv", "--device", "sim", "--runtime-dir", tmp_path / "rd",
                 "--", BIN / "vecadd", "--n", "1000", "--repeat", "3", env=env)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
    assert f"3 task(s) (3 kernel, 0 library), 1 query(ies) ended -> {out}" in r.stderr
    with open(out, newline="") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == TRACE_COLUMNS
    ks = [x for x in rows if x["kind"] == "kernel"]
    assert len(ks) == 3 and all((x["app"], x["grid_x"], x["block_x"]) == ("vt", "4", "256") for x in ks)
    assert all(float(x["dur_us"]) > 0 for x in ks) and not list(tmp_path.glob("*.part"))

    # default output: NAME.trace.jsonl in the current directory
    r = subprocess.run([PY, "-m", "controlplane.cli", "trace", "vt2", "--device", "sim", "--runtime-dir",
                        str(tmp_path / "rd"), "--", str(BIN / "hotspot"), "--size", "32", "--iters", "2", "--pyramid", "1"],
                       env={**env, "PYTHONPATH": str(ROOT)}, cwd=tmp_path, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(tasks(records(tmp_path / "vt2.trace.jsonl"))) == 2


def test_colocate_trace_passes_the_exit_code(tmp_path):
    r = colocate("trace", "bad", "--out", tmp_path / "b.jsonl", "--device", "sim", "--runtime-dir",
                 tmp_path / "rd", "--", BIN / "vecadd", "--no-such-option")
    assert r.returncode == 1 and "FAIL vecadd" in r.stdout
    assert "0 task(s)" in r.stderr


def test_run_trace_option(tmp_path):
    out = tmp_path / "r.jsonl"
    r = colocate("run", "--trace", out, "--device", "sim", "--runtime-dir", tmp_path / "rd", "--",
                 BIN / "querydemo", "--queries", "2", env=clean_env(SIMGPU_TIMESCALE="0",
                                                                   SIMGPU_DIR=str(tmp_path / "sim")))
    assert r.returncode == 0, r.stderr
    assert len(tasks(records(out))) == 4
