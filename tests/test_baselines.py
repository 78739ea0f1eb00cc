"""Policy specs, the MPS baselines, and query boundaries reaching the policy."""
from __future__ import annotations

import json

import pytest
from conftest import PY, ROOT, clean_env, colocate

from controlplane.daemon import Controller as Ctl
from controlplane.policies import (
    AppInfo,
    Decision,
    Policy,
    QueryEvent,
    TaskDone,
    make_policy,
    make_policy_spec,
    parse_policy_spec,
    register_policy,
)
from processpool import Pool, parse_spec
from shim.rundir import ensure

FAKE = [PY, str(ROOT / "tests" / "fake_worker.py")]


def app(slot: int, cls: str = "batch") -> AppInfo:
    return AppInfo(slot, 1000 + slot, f"a{slot}", cls, 10.0 if cls == "qos" else None)


def test_policy_spec_parsing():
    assert parse_policy_spec("claius") == ("claius", {})
    assert parse_policy_spec("claius,bandwidth_cap=false,granularity=20,models=/m,th=0.85") == \
        ("claius", {"bandwidth_cap": False, "granularity": 20, "models": "/m", "th": 0.85})
    for bad in ("claius,nokey", "claius,=3"):
        with pytest.raises(ValueError):
            parse_policy_spec(bad)
    p = make_policy_spec("claius-nb")
    assert p.bandwidth_cap is False and p.compensation is True
    p = make_policy_spec("claius-nc,granularity=20")
    assert p.compensation is False and p.g == 20


def test_serve_refuses_a_bad_policy_spec(rundir):
    r = colocate("serve", "--runtime-dir", rundir, "--device", "sim", "--pool", "none",
                 "--policy", "mps-even,granularity=7", "--detach")
    assert r.returncode == 2 and "granularity must divide 100" in r.stderr
    r = colocate("serve", "--runtime-dir", rundir, "--device", "sim", "--pool", "none",
                 "--policy", "nosuch", "--detach")
    assert r.returncode == 2 and "unknown policy 'nosuch'" in r.stderr


def test_mps_even_gives_each_of_n_apps_200_over_n():
    p = make_policy_spec("mps-even")
    assert p.on_register(app(0)) == [Decision(0, 100, 0)]
    assert p.on_register(app(1)) == [Decision(1, 100, 0)]      # 2 apps: 100 % each (caps)
    got = p.on_register(app(2))                                # 3 apps: 66 % -> 60 %
    assert got == [Decision(s, 60, None) for s in (0, 1, 2)]
    assert p.on_register(app(3)) == [Decision(s, 50, None) for s in range(4)]
    assert p.on_exit(app(3)) == [Decision(s, 60, None) for s in range(3)]


def test_mps_even_total_100_is_claius_papers_even_split():
    p = make_policy_spec("mps-even,total=100")
    assert p.on_register(app(0)) == [Decision(0, 100, 0)]
    assert p.on_register(app(1)) == [Decision(0, 50, None), Decision(1, 50, None)]
    with pytest.raises(ValueError, match="total"):
        make_policy_spec("mps-even,total=0")


def test_mps_priority_gives_qos_100_and_batch_the_rest_evenly():
    p = make_policy_spec("mps-priority")
    assert p.on_register(app(0, "qos")) == [Decision(0, 100, 0)]
    assert p.on_register(app(1)) == [Decision(1, 100, 0)]
    assert p.on_register(app(2)) == [Decision(1, 50, None), Decision(2, 50, None)]
    got = p.on_register(app(3))
    assert got == [Decision(1, 30, None), Decision(2, 30, None), Decision(3, 30, None)]   # 33 -> 30
    assert p.on_exit(app(1)) == [Decision(2, 50, None), Decision(3, 50, None)]


def test_mps_even_routes_apps_to_pool_workers(rundir, sleeper):
    """Through the controller: the shares land on pool workers of that quota."""
    pool = Pool(rundir, "sim", parse_spec("60:3"), cmd=FAKE, env=clean_env())
    ctl = Ctl(ensure(rundir), make_policy_spec("mps-even"), "sim", pool=pool)
    try:
        pool.start()
        assert pool.wait_ready(10)
        regs = [ctl.handle([b"", json.dumps({"v": 1, "type": "register", "pid": sleeper().pid,
                                              "name": n, "class": "batch"}).encode()]) for n in "abc"]
        assert all(r["type"] == "registered" for r in regs)
        routes = {s: (a.quota_pct, a.route) for s, a in ctl.apps.items()}
        assert sorted(q for q, _ in routes.values()) == [60, 60, 60]
        assert sorted(r for _, r in routes.values()) == [1, 2, 3]     # one worker each, least loaded
    finally:
        ctl.close()


@register_policy("test-records-queries")
class Recorder(Policy):
    """Records the query hooks the controller calls."""
    calls: list = []

    def on_query_begin(self, app: AppInfo, info: QueryEvent) -> list[Decision]:
        Recorder.calls.append(("begin", app.name, info.id, info.size, info.rule))
        return [Decision(app.slot, 40, 0)]

    def on_query_end(self, app: AppInfo, info: QueryEvent) -> list[Decision]:
        Recorder.calls.append(("end", app.name, info.id, info.rule))
        return []


def test_query_boundaries_reach_the_policy(rundir, sleeper):
    Recorder.calls = []
    ctl = Ctl(ensure(rundir), make_policy_spec("test-records-queries"), "sim")
    try:
        pid = sleeper().pid

        def send(**m):
            return ctl.handle([b"", json.dumps({"v": 1, **m}).encode()])
        r = send(type="register", pid=pid, name="svc", **{"class": "qos", "qos_ms": 10})
        assert r["type"] == "registered"
        send(type="query_begin", pid=pid, id=7, size=32, rule="inferred", t_us=1000)
        send(type="query_end", pid=pid, id=7, size=32, rule="inferred", t_us=3000)
        send(type="query_begin", pid=pid, id=8, size=4, rule="api", t_us=4000)
        # once the app marks queries itself, late inferred boundaries are not the policy's
        send(type="query_end", pid=pid, id=7, size=0, rule="inferred", t_us=4100)
        send(type="query_end", pid=pid, id=8, size=4, rule="api", t_us=5000)
        assert Recorder.calls == [("begin", "svc", 7, 32, "inferred"), ("end", "svc", 7, "inferred"),
                                  ("begin", "svc", 8, 4, "api"), ("end", "svc", 8, "api")]
        assert ctl.apps[r["slot"]].quota_pct == 40          # the policy's decision was applied
    finally:
        ctl.close()


# --- baymax: time sharing with QoS headroom (hand cases, in process) -------------------

def baymax_predictor():
    from controlplane.policies.predict import TablePredictor
    lengths = {"long": 6.0, "short": 2.0}
    return TablePredictor(query={"svc": lambda s, q: 4.0 * s}, pcie={"svc": lambda s, q: 1.0},
                          task={"svc": lambda f, q: 1.0,
                                "b1": lambda f, q: lengths[f["task"]],
                                "b2": lambda f, q: lengths[f["task"]]})


BSVC = AppInfo(0, 100, "svc", "qos", qos_ms=10.0)          # headroom 10 - 1 = 9 ms
BB1 = AppInfo(1, 101, "b1", "batch")
BB2 = AppInfo(2, 102, "b2", "batch")
PLAN = [{"task": f"k{i}"} for i in range(4)]               # 4 x 1 ms at 100 %


def test_baymax_holds_a_batch_task_that_does_not_fit_and_releases_when_it_does():
    p = make_policy_spec("baymax")
    p.pred = baymax_predictor()
    assert p.wants_tasks(BB1) and p.wants_tasks(BSVC)
    assert p.on_register(BB1) == [Decision(1, 100, 0)]
    assert p.on_task_done(BB1, TaskDone(features={"task": "long"}, duration_us=100)) == []
    assert p.batch[1].next_ms == 6.0                     # predicted, not the measured 0.1
    assert p.on_register(BSVC) == [Decision(0, 100, 0)]
    # 0 spent + 4 remaining + 6 > 9: hold
    d = p.on_query_begin(BSVC, QueryEvent(id=1, size=1, tasks=tuple(PLAN)))
    assert d == [Decision(1, 100, 0, hold=True)]
    # 1 spent + 3 remaining + 6 = 10 > 9: still held
    assert p.on_task_done(BSVC, TaskDone(features=PLAN[0], duration_us=1000, query=1)) == []
    assert p.on_task_done(BSVC, TaskDone(features=PLAN[1], duration_us=500, query=1)) == []
    # faster than predicted: 1.7 spent + 1 remaining + 6 = 8.7 <= 9: released
    d = p.on_task_done(BSVC, TaskDone(features=PLAN[2], duration_us=200, query=1))
    assert d == [Decision(1, 100, 0)]
    # the released batch task's time is charged to the query: 1.7 + 6 + 1 + 6 > 9
    assert p.on_task_done(BB1, TaskDone(features={"task": "long"}, duration_us=6000)) == \
        [Decision(1, 100, 0, hold=True)]
    assert p.on_query_end(BSVC, QueryEvent(id=1)) == [Decision(1, 100, 0)]      # released at the end


def test_baymax_takes_a_querys_wait_off_its_headroom():
    # 4 remaining + 2 (short) <= 9 fits; after a 4 ms wait, 4 + 2 > 10 - 4 - 1: held
    for queue, held in ((True, True), (False, False)):
        p = make_policy("baymax", time_slice_ms=0, queue=queue)
        p.pred = baymax_predictor()
        p.on_register(BSVC)
        p.on_register(BB1)
        p.on_task_done(BB1, TaskDone(features={"task": "short"}, duration_us=1))
        d = p.on_query_begin(BSVC, QueryEvent(id=1, size=1, tasks=tuple(PLAN), queued_us=4000))
        assert d == ([Decision(1, 100, 0, hold=True)] if held else [])


def test_baymax_releases_at_query_end_and_packs_the_headroom_in_slot_order():
    p = make_policy_spec("baymax,time_slice_ms=0")          # the batch apps at once
    p.pred = baymax_predictor()
    for a in (BSVC, BB1, BB2):
        p.on_register(a)
    p.on_task_done(BB1, TaskDone(features={"task": "short"}, duration_us=1))
    p.on_task_done(BB2, TaskDone(features={"task": "long"}, duration_us=1))
    # 4 + 2 (b1) fits; 4 + 2 + 6 (b2) does not
    assert p.on_query_begin(BSVC, QueryEvent(id=1, size=1, tasks=tuple(PLAN))) == \
        [Decision(2, 100, 0, hold=True)]
    assert p.on_query_end(BSVC, QueryEvent(id=1)) == [Decision(2, 100, 0)]
    # the next query's plan is the tasks seen (none here: the query's own 4 ms)
    p.on_task_done(BB2, TaskDone(features={"task": "short"}, duration_us=1))
    assert p.on_query_begin(BSVC, QueryEvent(id=2, size=1)) == []     # 4 + 2 + 2 <= 9
    assert p.on_query_end(BSVC, QueryEvent(id=2)) == []
    # a bigger query: 6 + 2 (b1) <= 9, 6 + 2 + 2 (b2) > 9
    assert p.on_query_begin(BSVC, QueryEvent(id=3, size=1.5)) == [Decision(2, 100, 0, hold=True)]


def test_baymax_unknown_batch_task_waits_during_a_query():
    p = make_policy_spec("baymax")
    p.pred = baymax_predictor()
    p.on_register(BSVC)
    assert p.on_register(BB1) == [Decision(1, 100, 0)]
    assert p.on_query_begin(BSVC, QueryEvent(id=1, size=1)) == [Decision(1, 100, 0, hold=True)]


def test_baymax_holds_nothing_without_qos_apps():
    p = make_policy_spec("baymax,time_slice_ms=0")
    p.pred = baymax_predictor()
    got = p.on_register(BB1) + p.on_register(BB2)
    for f in ("long", "short", "long"):
        got += p.on_task_done(BB1, TaskDone(features={"task": f}, duration_us=9e6))
    got += p.on_exit(BB2)
    assert got == [Decision(1, 100, 0), Decision(2, 100, 0)]
    assert not any(p.held.values())


def test_baymax_batch_apps_take_turns_in_time_slices():
    now = [0.0]
    p = make_policy("baymax", time_slice_ms=20, clock=lambda: now[0])
    p.pred = baymax_predictor()
    assert p.on_register(BB1) == [Decision(1, 100, 0)]             # alone: its turn
    assert p.on_register(BB2) == [Decision(2, 100, 0, hold=True)]  # waits for its slice
    now[0] = 0.019
    assert p.on_tick(now[0]) == []
    now[0] = 0.021                                                     # b1's slice is over
    assert p.on_tick(now[0]) == [Decision(1, 100, 0, hold=True), Decision(2, 100, 0)]
    now[0] = 0.042
    assert p.on_task_done(BB2, TaskDone(features={"task": "short"}, duration_us=1)) == \
        [Decision(1, 100, 0), Decision(2, 100, 0, hold=True)]      # round robin
    assert p.on_exit(BB1) == [Decision(2, 100, 0)]                  # the one left runs
    with pytest.raises(ValueError):
        make_policy("baymax", time_slice_ms=-1)


def test_baymax_without_predictor_uses_measured_times():
    p = make_policy_spec("baymax")
    for a in (BSVC, BB1):
        p.on_register(a)
    p.on_task_done(BB1, TaskDone(features={"task": "x"}, duration_us=2000))     # measured 2 ms
    # the first query is unknown: the batch app waits until it ends
    assert p.on_query_begin(BSVC, QueryEvent(id=1, size=1)) == [Decision(1, 100, 0, hold=True)]
    p.on_task_done(BSVC, TaskDone(features=None, duration_us=3000, query=1))
    assert p.on_query_end(BSVC, QueryEvent(id=1)) == [Decision(1, 100, 0)]
    # now it took 3 ms: 3 + 2 <= 10 (no PCIe figure without a predictor)
    assert p.on_query_begin(BSVC, QueryEvent(id=2, size=1)) == []
    # 8 ms charged to the query + 3 remaining + the next 8 ms > 10
    p.on_task_done(BB1, TaskDone(features={"task": "x"}, duration_us=8000))
    assert p.held[1] is True
