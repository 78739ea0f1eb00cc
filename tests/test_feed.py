"""Live task feedback: the controller asks an app's shim for its completed
tasks ("feed": true in the reply to register), the shim's feed thread sends
them as "tasks" messages, and the policy hears each one in on_task_done with
its predictors task row, device time, quota and query."""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import ROOT, clean_env, wait_for

from controlplane.daemon import Controller as Ctl
from controlplane.policies.base import AppInfo, Decision, Policy, TaskDone, make_policy_spec, register_policy
from shim import paths
from shim.launcher import libzmq_path
from shim.rundir import ensure

BIN = ROOT / "bench" / "bin"

pytestmark = pytest.mark.skipif(
    not (BIN / "querydemo").exists() or not paths.SIMGPU_CUDART.exists() or not paths.LIBCOLOCATE.exists(),
    reason="bench programs or simgpu not built (make build)")


@register_policy("test-feed")
class Feed(Policy):
    """Wants every app's tasks and records each on_task_done call."""
    calls: list = []

    def wants_tasks(self, app: AppInfo) -> bool:
        return True

    def on_task_done(self, app: AppInfo, task: TaskDone) -> list[Decision]:
        Feed.calls.append((app.name, dataclasses.asdict(task)))   # the assertions read fields by key
        return []


@register_policy("test-no-feed")
class NoFeed(Feed):
    def wants_tasks(self, app: AppInfo) -> bool:
        return False


class Running:
    """An in-process controller (this process's policies) on its own thread."""

    def __init__(self, rundir: Path, policy: str):
        self.ctl = Ctl(ensure(rundir), make_policy_spec(policy), "sim")
        self.thread = threading.Thread(target=self.ctl.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.ctl.stopping = True
        self.thread.join(10)


def app_env(rundir: Path, tmp: Path, **extra: str) -> dict[str, str]:
    """As `colocate run` sets it up (launcher.app_env), on a private simgpu.
    Registration may wait 10 s, not the shim's default 1 s: on two cores
    under the parallel suite a controller once took longer than 1 s to answer,
    the app ran natively (as it should) and the test never saw it."""
    env = clean_env(LD_PRELOAD=str(paths.LIBCOLOCATE), LD_LIBRARY_PATH=str(paths.SIMGPU_DIR),
                    SIMGPU_DIR=str(tmp / "sim"), SIMGPU_TIMESCALE="0",
                    COLOCATE_RUNTIME_DIR=str(rundir), COLOCATE_CONNECT_TIMEOUT_MS="10000")
    env.update(extra)
    lib = libzmq_path()
    if lib:
        env["COLOCATE_LIBZMQ"] = lib
    return env


def run(cmd: list, env: dict[str, str]) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
    return r


def launches(out: str) -> int:
    return int(re.search(r"STATS .*\blaunches=(\d+)", out).group(1))


def trace_tasks(path: Path) -> list[dict]:
    recs = [json.loads(ln) for ln in path.read_text().splitlines()]
    return [r for r in recs if r["kind"] in ("kernel", "library")]


def test_every_task_reaches_the_policy_with_the_traces_times(rundir, tmp_path):
    """querydemo (QoS, 4 queries x 3 kernels) with the trace file on as well:
    the policy hears each task once, in order, with the trace's duration,
    quota and query id, and a task row whose occurrence counts per query."""
    Feed.calls = []
    c = Running(rundir, "test-feed")
    try:
        trace = tmp_path / "t.jsonl"
        r = run([BIN / "querydemo", "--queries", "4", "--kernels", "3"],
                app_env(rundir, tmp_path, COLOCATE_TRACE=str(trace), COLOCATE_APP_NAME="qd",
                        COLOCATE_APP_CLASS="qos", COLOCATE_QOS_MS="50"))
        n = launches(r.stdout)
        assert wait_for(lambda: len(Feed.calls) >= n, timeout=5), (len(Feed.calls), n)
        rec = wait_for(lambda: next((h for h in c.ctl.history if h["name"] == "qd"), None))
    finally:
        c.stop()
    want = trace_tasks(trace)
    assert n == len(want) == len(Feed.calls) == 12
    assert rec["feed"] == {"tasks": 12, "untimed": 0, "dropped": 0, "bad": 0, "fed": 12}
    for (name, got), t in zip(Feed.calls, want):
        assert name == "qd"
        f = got["features"]
        assert f["task"] == t["name"] and got["query"] == t["query"] is not None
        assert got["duration_us"] == pytest.approx(t["dur_us"], abs=1e-3) and got["duration_us"] > 0
        assert got["quota_pct"] == t["quota"] == f["quota"] == 100
        assert (f["grid_x"], f["block_x"]) == (t["grid"][0], t["block"][0])
    assert len({g["query"] for _, g in Feed.calls}) == 4
    # occurrence: how many tasks of that name came before it in its query
    seen: dict = {}
    for _, g in Feed.calls:
        k = (g["query"], g["features"]["task"])
        assert g["features"]["occurrence"] == seen.get(k, 0)
        seen[k] = seen.get(k, 0) + 1
    # the query size came from query_begin (api rule: the app's unit)
    assert {g["features"]["input_bytes"] for _, g in Feed.calls} == {4096.0}


@pytest.fixture
def every_batch_task(monkeypatch):
    """The controller passes a batch app's same-named tasks to the policy
    at most every BATCH_TASK_EVERY_S; these tests count every task."""
    import controlplane.daemon as daemon
    monkeypatch.setattr(daemon, "BATCH_TASK_EVERY_S", 0.0)


def test_a_policy_without_feed_gets_nothing_and_the_app_makes_no_events(rundir, tmp_path,
                                                                        every_batch_task):
    """wants_tasks False: no "tasks" message, no on_task_done, and the app
    takes no task records: it creates no event (counted by a preloaded
    wrapper of cudaEventCreate*).  The same controller switched to a policy
    that wants tasks: events and calls."""
    from test_tasks import EVCOUNT_C
    src, lib, count = tmp_path / "evcount.c", tmp_path / "libevcount.so", tmp_path / "count"
    src.write_text(EVCOUNT_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib, src, "-ldl"], check=True)
    Feed.calls = []
    c = Running(rundir, "test-no-feed")
    try:
        env = app_env(rundir, tmp_path, COLOCATE_APP_NAME="quiet", EVCOUNT_OUT=str(count))
        env["LD_PRELOAD"] = f"{paths.LIBCOLOCATE}:{lib}"
        run([BIN / "launchloop", "--launches", "20", "--warmup", "0"], env)
        rec = wait_for(lambda: next((h for h in c.ctl.history if h["name"] == "quiet"), None))
        assert rec is not None and rec["feed"] is None and Feed.calls == []
        assert int(count.read_text()) == 0
        c.ctl.policy = make_policy_spec("test-feed")
        env["COLOCATE_APP_NAME"] = "fed"
        run([BIN / "launchloop", "--launches", "20", "--warmup", "0"], env)
        assert wait_for(lambda: len(Feed.calls) >= 20, timeout=5)
        assert int(count.read_text()) >= 3
    finally:
        c.stop()


def test_batch_occurrences_count_over_the_run(rundir, tmp_path, every_batch_task):
    """A batch app: occurrences 0..n-1 per name over the whole run."""
    Feed.calls = []
    c = Running(rundir, "test-feed")
    try:
        r = run([BIN / "launchloop", "--launches", "50", "--warmup", "0"],
                app_env(rundir, tmp_path, COLOCATE_APP_NAME="loop"))
        n = launches(r.stdout)
        assert wait_for(lambda: len(Feed.calls) >= n, timeout=5), (len(Feed.calls), n)
    finally:
        c.stop()
    assert len(Feed.calls) == n >= 50
    # (the shim may infer queries from its copies: a batch app's occurrences
    # count over the run all the same)
    assert all(g["duration_us"] > 0 and g["quota_pct"] == 100 for _, g in Feed.calls)
    by_name: dict = {}
    for _, g in Feed.calls:
        by_name.setdefault(g["features"]["task"], []).append(g["features"]["occurrence"])
    assert all(v == list(range(len(v))) for v in by_name.values())


def test_malformed_tasks_are_rejected_and_the_controller_keeps_serving(rundir, sleeper):
    Feed.calls = []
    ctl = Ctl(ensure(rundir), make_policy_spec("test-feed"), "sim")
    try:
        pid = sleeper().pid

        def send(raw: bytes):
            return ctl.handle([b"", raw])
        reg = send(json.dumps({"v": 1, "type": "register", "pid": pid, "name": "s",
                               "class": "batch"}).encode())
        assert reg["type"] == "registered" and reg["feed"] is True
        good = {"n": 0, "kind": "kernel", "name": "k", "grid": [2, 1, 1], "block": [64, 1, 1],
                "shmem": 0, "stream": "0x0", "host_us": 1.0, "start_us": 0.0, "dur_us": 5.5,
                "quota": 100, "route": "local", "worker": None, "query": None}
        for bad in (b"{not json", json.dumps({"v": 1, "type": "tasks", "pid": pid}).encode(),
                    json.dumps({"v": 1, "type": "tasks", "pid": pid, "slot": reg["slot"],
                                "tasks": [{**good, "dur_us": "x"}]}).encode()):
            r = send(bad)
            assert r["type"] == "error"
        assert ctl.bad_tasks == 2               # the unparseable one has no type
        # a record the schema lets through but that is no task row: counted, skipped
        assert send(json.dumps({"v": 1, "type": "tasks", "pid": pid, "slot": reg["slot"],
                                "tasks": [{**good, "grid": [1, 2]}, good]}).encode()) is None
        assert len(Feed.calls) == 1 and Feed.calls[0][1]["duration_us"] == 5.5
        rec = send(b'{"v":1,"type":"list"}')["apps"][0]
        assert rec["feed"] == {"tasks": 2, "untimed": 0, "dropped": 0, "bad": 1}
        assert send(b'{"v":1,"type":"ping"}')["type"] == "pong"
    finally:
        ctl.close()


@register_policy("test-feed-routed")
class FeedRouted(Feed):
    """Wants every app's tasks and routes each app to a pool worker at 100 %."""

    def on_register(self, app: AppInfo) -> list[Decision]:
        return [Decision(app.slot, 100, None)]


def test_forwarded_tasks_carry_the_workers_device_times(rundir, tmp_path):
    """Routed to a pool worker, the app records no events of its own: the
    worker times each launch (FWD_LF_TIMED) and the task reaches the policy
    with that duration, equal to the same task's duration run locally (the
    model is deterministic at SIMGPU_TIMESCALE=0: same kernel, same 100 %
    quota, nothing else on the device), and the exit record counts no
    untimed task."""
    from processpool import Pool, parse_spec
    sim = {"SIMGPU_DIR": str(tmp_path / "sim"), "SIMGPU_TIMESCALE": "0"}
    cmd = [BIN / "querydemo", "--queries", "4", "--kernels", "3"]
    local = tmp_path / "local.jsonl"
    run(cmd, app_env(tmp_path / "no-controller", tmp_path, COLOCATE_TRACE=str(local)))
    Feed.calls = []
    pool = Pool(rundir, "sim", parse_spec("100:1"), env=clean_env(**sim))
    c = Running(rundir, "test-feed-routed")
    c.ctl.pool = pool
    try:
        pool.start()
        assert pool.wait_ready(15)
        trace = tmp_path / "fwd.jsonl"
        r = run(cmd, app_env(rundir, tmp_path, COLOCATE_TRACE=str(trace), COLOCATE_APP_NAME="qd",
                             COLOCATE_APP_CLASS="qos", COLOCATE_QOS_MS="50"))
        n = launches(r.stdout)
        assert wait_for(lambda: len(Feed.calls) >= n, timeout=5), (len(Feed.calls), n)
        rec = wait_for(lambda: next((h for h in c.ctl.history if h["name"] == "qd"), None))
    finally:
        c.stop()
        pool.stop()
    got, want = trace_tasks(trace), trace_tasks(local)
    assert n == len(got) == len(want) == len(Feed.calls) == 12
    assert rec["forwarded"] == 12
    assert rec["feed"] == {"tasks": 12, "untimed": 0, "dropped": 0, "bad": 0, "fed": 12}
    assert all(t["route"] == "worker" and t["worker"] is not None for t in got)
    assert all(t["route"] == "local" for t in want)
    starts = [t["start_us"] for t in got]
    assert starts[0] == 0 and starts == sorted(starts)       # one stream: in order
    for (_, fed), g, w in zip(Feed.calls, got, want):
        assert g["name"] == w["name"] == fed["features"]["task"]
        assert fed["duration_us"] == pytest.approx(g["dur_us"], abs=1e-3)
        # the worker's and the app's event times of the same modelled kernel
        assert g["dur_us"] > 0 and g["dur_us"] == pytest.approx(w["dur_us"], rel=1e-3)
