"""C-Laius policy core: each equation against hand-computed cases, the
knapsack against brute force (C and Python), and the hooks on a scripted run."""
from __future__ import annotations

import itertools
import logging
import math

import numpy as np
import pytest

from controlplane.policies import AppInfo, Decision, QueryEvent, TaskDone, make_policy
from controlplane.policies import claius as C
from controlplane.policies import knapsack as K

Q = np.arange(10, 101, 10, dtype=np.float64)

needs_c = pytest.mark.skipif(not C.knapsack_c_available(),
                             reason="controlplane.policies._knapsack not built")


# --- Eq. 3 ---------------------------------------------------------------------

def test_eq3_smallest_feasible_quota():
    t = 100.0 / Q                          # 10, 5, 3.33, 2.5, ...
    assert C.eq3_quota(t, Q, target_ms=4.0, pcie_ms=0.5) == 30      # 3.33 <= 3.5, 5 > 3.5
    assert C.eq3_quota(t, Q, target_ms=5.5, pcie_ms=0.5) == 20      # equality counts
    assert C.eq3_quota(t, Q, target_ms=11.0) == 10
    assert C.eq3_quota(t, Q, target_ms=1.0, pcie_ms=0.5) is None    # 1.0 at 100 % > 0.5


def test_eq3_none_feasible_runs_at_100_and_logs(caplog):
    p = C.TablePredictor(query={"svc": lambda s, q: 100.0 / q}, pcie={"svc": lambda s, q: 0.5})
    pol = make_policy("claius", predictor=p)
    svc = AppInfo(0, 100, "svc", "qos", qos_ms=1.0)
    pol.on_register(svc)
    with caplog.at_level(logging.WARNING, logger="colocate.claius"):
        d = pol.on_query_begin(svc, QueryEvent(id=7, size=1, t_us=0))
    assert pol.qos[0].query.quota == 100
    assert "no quota meets" in caplog.text and "svc query 7" in caplog.text
    assert d == [] or d == [Decision(0, 100, None)]             # already 100 since register


# --- Eq. 4/5: the knapsack -----------------------------------------------------------

def brute(value: np.ndarray, bw: np.ndarray, cap: float, use_cap: bool) -> float | None:
    n, u = value.shape[0], value.shape[1] - 1
    best = None
    for ks in itertools.product(range(u + 1), repeat=n):
        if sum(ks) > u:
            continue
        if use_cap and sum(bw[i, k] for i, k in enumerate(ks)) > cap:
            continue
        v = sum(value[i, k] for i, k in enumerate(ks))
        best = v if best is None else max(best, v)
    return best


def random_instance(rng: np.random.Generator, n: int, u: int) -> tuple[np.ndarray, np.ndarray]:
    """Values and bandwidths per unit count, 0 at k = 0; not always monotone."""
    v = np.zeros((n, u + 1))
    b = np.zeros((n, u + 1))
    v[:, 1:] = np.round(rng.random((n, u)) * 10, 1)            # ties happen
    b[:, 1:] = np.cumsum(rng.random((n, u)) * 100, axis=1)
    return v, b


@pytest.mark.parametrize("use_cap", [False, True])
def test_knapsack_optimal_vs_brute_force(use_cap):
    rng = np.random.default_rng(6)
    for _ in range(300):
        n, u = int(rng.integers(1, 5)), int(rng.integers(0, 6))
        v, b = random_instance(rng, n, u)
        cap = float(rng.random() * b.sum(axis=1).max() / 2)
        ref = brute(v, b, cap, use_cap)
        got = C.knapsack_py(v, b, cap, use_cap)
        chosen_v = sum(v[i, k] for i, k in enumerate(got.choice))
        chosen_b = sum(b[i, k] for i, k in enumerate(got.choice))
        assert sum(got.choice) <= u
        assert math.isclose(got.value, chosen_v, abs_tol=1e-9)
        assert math.isclose(got.bw, chosen_b, abs_tol=1e-9)
        if ref is None:                    # even all-zero breaks the cap: impossible here
            pytest.fail("brute force found nothing")
        assert got.status == 0
        assert math.isclose(got.value, ref, abs_tol=1e-9), (v, b, cap, got, ref)
        if use_cap:
            assert got.bw <= cap               # the cap is respected


@needs_c
@pytest.mark.parametrize("use_cap", [False, True])
def test_knapsack_c_and_python_agree(use_cap):
    rng = np.random.default_rng(11)
    for _ in range(200):
        n, u = int(rng.integers(1, 9)), int(rng.integers(0, 11))
        v, b = random_instance(rng, n, u)
        cap = float(rng.random() * b[:, -1].sum() / 2)
        py = C.knapsack_py(v, b, cap, use_cap)
        c = C.knapsack_c(v, b, cap, use_cap)
        assert (c.choice, c.value, c.bw, c.status, c.nodes) == \
               (py.choice, py.value, py.bw, py.status, py.nodes)
        if use_cap:
            assert c.bw <= cap


@needs_c
def test_knapsack_c_vs_brute_force_8_apps():
    rng = np.random.default_rng(3)
    for _ in range(20):
        v, b = random_instance(rng, 5, 6)
        cap = float(b[:, -1].sum() / 3)
        got = C.knapsack_c(v, b, cap, True)
        assert math.isclose(got.value, brute(v, b, cap, True), abs_tol=1e-9)


def test_knapsack_takes_next_best_when_best_breaks_cap():
    v = np.array([[0, 3, 10], [0, 3, 4]], dtype=float)
    b = np.array([[0, 100, 1000], [0, 100, 200]], dtype=float)
    for solve in [C.knapsack_py] + ([C.knapsack_c] if C.knapsack_c_available() else []):
        assert solve(v, b, 500, use_cap=False).choice == [2, 0]     # 10 at 1000 GB/s
        p = solve(v, b, 500, use_cap=True)
        assert p.choice == [1, 1] and p.value == 6 and p.bw == 200
        p = solve(v, b, 50, use_cap=True)                            # only waiting fits
        assert p.choice == [0, 0] and p.status == 0
        p = solve(v, b, -1, use_cap=True)                            # QoS alone is over
        assert p.choice == [0, 0] and p.status == 2


def test_knapsack_falls_back_to_python_and_logs(monkeypatch, caplog):
    monkeypatch.setattr(K, "_lib", None)
    monkeypatch.setattr(K, "_ks_warned", False)
    v = np.array([[0, 1, 2]], dtype=float)
    with caplog.at_level(logging.WARNING, logger="colocate.claius"):
        p = C.knapsack(v, v, 10, True)
    assert p.choice == [2] and "Python search" in caplog.text


# --- Eq. 6 and lag --------------------------------------------------------------------

def test_eq6_minimal_quota_hand_case():
    rem = 200.0 / Q                        # two tasks of 100/q ms left
    assert C.eq6_quota(6.0, rem, Q, target_ms=10.0, pcie_ms=1.0) == 70    # 6 + 2.86 <= 9
    assert C.eq6_quota(8.5, rem, Q, target_ms=10.0, pcie_ms=1.0) is None  # 8.5 + 2 > 9
    assert C.lag_ms([2.0, 4.0], [2.0, 2.0]) == 2.0


def test_eq6_is_minimal_on_random_cases():
    rng = np.random.default_rng(2)
    for _ in range(200):
        rem = np.sort(rng.random(10) * 10)[::-1]                   # falls with the quota
        spent, tgt = rng.random() * 5, rng.random() * 15
        q = C.eq6_quota(spent, rem, Q, tgt)
        ok = spent + rem <= tgt
        if q is None:
            assert not ok.any()
        else:
            i = int(q / 10) - 1
            assert ok[i] and not ok[:i].any()


# --- Eq. 7, Eq. 8, slope, sharing ---------------------------------------------------

def test_eq7_priority_classes():
    assert C.eq7_priority(12.0, 10.0) == 1          # will miss
    assert C.eq7_priority(9.5, 10.0) == 2           # 0.5 ms slack < 10 % of 10
    assert C.eq7_priority(5.0, 10.0) == 3           # plenty of slack
    assert C.eq7_priority(9.5, 10.0, slack_frac=0.01) == 3


def test_eq8_ratio_against_th():
    assert C.eq8_choose([("x", 10, 8), ("y", 10, 9.5)], 0.9) == "x"       # A 0.8 vs 0.95
    assert C.eq8_choose([("x", 10, 9.5), ("y", 10, 9.2)], 0.9) is None     # both above TH
    assert C.eq8_choose([("x", 10, 9.5), ("y", 10, 9.2)], 0.95) == "y"
    assert C.eq8_choose([("x", 0, 0)], 0.9) is None


def test_slope():
    t = 600.0 / Q
    assert C.curve_slope(t, 5) == pytest.approx(600 / 50 - 600 / 60)
    assert C.curve_slope(t, 0) == pytest.approx(60 - 30)


def test_share_units_by_slope():
    a = C.Claim("a", 6, cls=3, slope=2.0)
    b = C.Claim("b", 6, cls=3, slope=1.0)
    assert C.share_units([a, b], 10) == {"a": 6, "b": 4}
    assert C.share_units([C.Claim("a", 6, 3, 0.5), b], 10) == {"a": 4, "b": 6}
    assert C.share_units([C.Claim("a", 3), C.Claim("b", 4)], 10) == {"a": 3, "b": 4}


def test_share_units_class_1_first_and_eq8():
    x = C.Claim("x", 5, cls=1, slope=0.1, remaining=lambda u: 10.0 / u)      # A 0.5, 0.67 ..
    y = C.Claim("y", 5, cls=1, slope=9.0, remaining=lambda u: 10.0 - 0.5 * u)  # A ~0.95
    assert C.share_units([x, y], 6, th=0.9) == {"x": 5, "y": 1}
    # flat curves everywhere: Eq. 8 passes nobody, so the steeper slope gets it
    flat = C.Claim("x", 5, cls=1, slope=0.1, remaining=lambda u: 10.0 - 0.1 * u)
    assert C.share_units([flat, y], 6, th=0.9) == {"x": 1, "y": 5}
    z = C.Claim("z", 4, cls=3, slope=100.0)
    w = C.Claim("w", 8, cls=1, slope=0.0, remaining=lambda u: 10.0 / u)
    assert C.share_units([z, w], 10) == {"w": 8, "z": 2}


# --- the policy on a scripted run ---------------------------------------------------

def scripted_predictor(qos_bw: float = 0.0) -> C.TablePredictor:
    task = {"svc": lambda f, q: 100.0 / q,                 # each of 4 tasks: 2 ms at 50 %
            "b1": lambda f, q: 1.0, "b2": lambda f, q: 1.0}   # batch: equal weights
    return C.TablePredictor(
        query={"svc": lambda s, q: 400.0 / q}, pcie={"svc": lambda s, q: 1.0},
        task=task,
        bw={"svc": lambda f, q: qos_bw, "b1": lambda f, q: 10.0 * q, "b2": lambda f, q: 5.0 * q},
        ipc={"b1": lambda f, q: q / 10.0, "b2": lambda f, q: 2.0 * math.sqrt(q / 10.0)})


SVC = AppInfo(0, 100, "svc", "qos", qos_ms=10.0)
B1 = AppInfo(1, 101, "b1", "batch")
B2 = AppInfo(2, 102, "b2", "batch")
TASKS = [{"task": f"k{i}", "input_bytes": 1.0} for i in range(4)]


def start(**opts) -> C.CLaius:
    # the hand values below are IPC sums: the objective as printed
    pol = make_policy("claius", predictor=scripted_predictor(), **{"objective": "ipc", **opts})
    assert pol.on_register(B1) == [Decision(1, 10, None)]           # unseen: one unit to run
    assert pol.on_task_done(B1, TaskDone(features={"task": "b1k"})) == [Decision(1, 100, None)]
    # b2 unseen: one unit, b1 the other 9
    assert pol.on_register(B2) == [Decision(1, 90, None), Decision(2, 10, None)]
    assert pol.on_task_done(B2, TaskDone(features={"task": "b2k"})) == []   # b1 9 + b2 1: IPC 11
    assert pol.last_packing.choice == [9, 1]
    assert pol.on_register(SVC) == [Decision(0, 100, None)]
    return pol


def test_policy_scripted_run_with_lag_and_rollback(caplog):
    pol = start()
    # Eq. 3: 400/q <= 10 - 1 -> 50 %; the knapsack over 5 units: b1 4 + b2 1 (IPC 6)
    d = pol.on_query_begin(SVC, QueryEvent(id=1, size=1, t_us=0, tasks=tuple(TASKS)))
    assert d == [Decision(0, 50, None), Decision(1, 40, None)]
    assert pol.on_task_done(SVC, TaskDone(features=TASKS[0], duration_us=2000)) == []   # on time
    with caplog.at_level(logging.INFO, logger="colocate.claius"):
        d = pol.on_task_done(SVC, TaskDone(features=TASKS[1], duration_us=4000))
    # lag 2 ms; Eq. 6: 6 + 200/q <= 9 -> 70 %; batch gets 3 units: b1 2 + b2 1
    assert d == [Decision(0, 70, None), Decision(1, 20, None)]
    assert "lags 2.000 ms" in caplog.text and "50% -> 70%" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="colocate.claius"):
        d = pol.on_task_done(SVC, TaskDone(features=TASKS[2], duration_us=300))
    # 6.3 ms spent + 2 ms for the last task at 50 % <= 9: roll back
    assert d == [Decision(0, 50, None), Decision(1, 40, None)]
    assert "rollback 70% -> 50%" in caplog.text
    assert pol.on_task_done(SVC, TaskDone(features=TASKS[3], duration_us=2000)) == []
    # query over: the batch apps get the whole device again; the next query
    # reuses this query's tasks as its plan
    assert pol.on_query_end(SVC, QueryEvent(id=1)) == [Decision(1, 90, None)]
    d = pol.on_query_begin(SVC, QueryEvent(id=2, size=1, t_us=10_000))
    assert d == [Decision(1, 40, None)] and pol.qos[0].query.plan == TASKS


def test_a_querys_wait_comes_off_its_target():
    # waited 2 ms: Eq. 3 with 10 - 2 - 1 = 7 ms: 400/q <= 7 -> 60 %, not 50 %
    pol = start()
    d = pol.on_query_begin(SVC, QueryEvent(id=1, size=1, t_us=0, tasks=tuple(TASKS), queued_us=2000))
    assert d[0] == Decision(0, 60, None) and pol.qos[0].query.target_ms == 8.0
    # queue=false: the paper's Eq. 3 with the whole target
    pol = start(queue=False)
    d = pol.on_query_begin(SVC, QueryEvent(id=1, size=1, t_us=0, tasks=tuple(TASKS), queued_us=2000))
    assert d[0] == Decision(0, 50, None)


def test_a_batch_app_the_predictor_knows_whole_is_planned_before_its_first_task():
    class Whole(C.TablePredictor):
        def whole_app(self, app: str) -> bool:
            return app == "b1"
    base = scripted_predictor()
    task = {**base.task, "b1": lambda f, q: 100.0 / q}            # scales with its SMs
    pred = Whole(query=base.query, pcie=base.pcie, task=task, bw=base.bw, ipc=base.ipc)
    pol = make_policy("claius", predictor=pred)
    assert pol.on_register(B1) == [Decision(1, 100, None)]      # planned: the whole device
    assert pol.on_register(B2) == [Decision(1, 90, None), Decision(2, 10, None)]   # unseen: one unit
    # without whole_app: one unit until a task ends
    assert make_policy("claius", predictor=scripted_predictor()).on_register(B1) == [Decision(1, 10, None)]


def test_policy_no_compensation_ablation():
    pol = start(compensation=False)
    pol.on_query_begin(SVC, QueryEvent(id=1, size=1, t_us=0, tasks=tuple(TASKS)))
    pol.on_task_done(SVC, TaskDone(features=TASKS[0], duration_us=2000))
    assert pol.on_task_done(SVC, TaskDone(features=TASKS[1], duration_us=4000)) == []
    assert pol.sent[0] == 50


def test_policy_bandwidth_cap_and_nb_ablation():
    # device 600 GB/s, the query's tasks pull 200: batch may use 400.
    # b1 at k units pulls 100k, b2 50k: unconstrained b1 4 + b2 1 (IPC 6, 450 GB/s)
    # breaks it; next best b1 3 + b2 2 (IPC 5.83, 400 GB/s)
    for cap, want in ((True, {1: 30, 2: 20}), (False, {1: 40, 2: 10})):
        pol = make_policy("claius", predictor=scripted_predictor(qos_bw=200.0),
                          device_bw_gbs=600.0, bandwidth_cap=cap, objective="ipc")
        for a in (B1, B2):
            pol.on_register(a)
            pol.on_task_done(a, TaskDone(features={"task": a.name}))
        pol.on_register(SVC)
        pol.on_query_begin(SVC, QueryEvent(id=1, size=1, t_us=0, tasks=tuple(TASKS)))
        assert {s: pol.sent[s] for s in (1, 2)} == want
        if cap:
            assert pol.last_packing.bw + 200.0 <= 600.0


def test_bandwidth_cap_binds_only_while_a_query_is_in_flight():
    """Between queries there is nothing to protect: the batch apps are packed
    without the cap (cap_idle=False, the default), with it when asked."""
    for cap_idle, want in ((False, {1: 90, 2: 10}), (True, {1: 40, 2: 40})):   # 1000 vs 600 GB/s
        pol = make_policy("claius", predictor=scripted_predictor(), device_bw_gbs=600.0,
                          objective="ipc", hysteresis=0, cap_idle=cap_idle)
        for a in (B1, B2):
            pol.on_register(a)
            pol.on_task_done(a, TaskDone(features={"task": a.name}))
        assert {s: pol.sent[s] for s in (1, 2)} == want, cap_idle
        if cap_idle:
            assert pol.last_packing.bw <= 600.0


def test_batch_apps_get_a_small_forwarding_window():
    pol = make_policy("claius", predictor=scripted_predictor())
    assert pol.fwd_window(B1) == C.BATCH_WINDOW and pol.fwd_window(SVC) is None


def test_policy_two_qos_services_share_by_slope():
    p = C.TablePredictor(query={"a": lambda s, q: 600.0 / q, "b": lambda s, q: 12.0 - q / 10.0},
                         task={}, bw={}, ipc={})
    pol = make_policy("claius", predictor=p)
    a = AppInfo(0, 10, "a", "qos", qos_ms=10.5)      # Eq. 3: 60 %, slope 2 ms per step
    b = AppInfo(3, 13, "b", "qos", qos_ms=6.05)      # Eq. 3: 60 %, slope 1 ms per step
    pol.on_register(a)
    pol.on_register(b)
    assert pol.on_query_begin(b, QueryEvent(id=1, size=1)) == [Decision(3, 60, None)]
    d = pol.on_query_begin(a, QueryEvent(id=1, size=1))
    assert sorted(d, key=lambda x: x.slot) == [Decision(0, 60, None), Decision(3, 40, None)]
    assert pol.on_query_end(a, QueryEvent(id=1)) == [Decision(3, 60, None)]


def test_policy_without_predictor_is_static_like():
    pol = make_policy("claius")
    assert pol.on_register(SVC) == [Decision(0, 100, None)]
    pol.on_query_begin(SVC, QueryEvent(id=1, size=1))
    assert pol.on_register(B1) == [Decision(1, 10, None)]   # QoS holds 100 %: b1 a unit
    assert pol.sent[1] == 10


def test_granularity_option():
    pol = make_policy("claius", predictor=scripted_predictor(), granularity=20)
    assert list(pol.quotas) == [20, 40, 60, 80, 100]
    pol.on_register(SVC)
    pol.on_query_begin(SVC, QueryEvent(id=1, size=1, tasks=tuple(TASKS)))
    assert pol.sent[0] == 60                           # 400/q <= 9 -> 44.4 -> next step 60
    with pytest.raises(ValueError):
        make_policy("claius", granularity=30)


# --- holds, task feedback -------------------------------------------------------------

def test_batch_app_given_no_units_is_held_then_released():
    pol = start()
    # Eq. 3: 400/q <= 5 - 1 only at 100 %: no unit left for the batch apps
    d = pol.on_query_begin(SVC, QueryEvent(id=1, size=1, t_us=0, tasks=tuple(TASKS), qos_ms=5.0))
    # held at the quota each had (90 / 10), so that holding moves nothing
    assert d == [Decision(1, 90, None, hold=True), Decision(2, 10, None, hold=True)]
    assert pol.held == {0: False, 1: True, 2: True}
    # a new ready task of a held app changes nothing while no unit is free
    assert pol.on_task_done(B2, TaskDone(features={"task": "b2-other"})) == []
    d = pol.on_query_end(SVC, QueryEvent(id=1))
    assert d == [Decision(1, 90, None), Decision(2, 10, None)]          # released
    assert not any(x.hold for x in d)


def test_normalised_objective_does_not_starve_a_memory_bound_app():
    """b1's IPC (compute-bound, grows with q) outweighs b2's at any split, so
    the printed objective gives b2 nothing; normalised to each app's own
    speed at 100 %, b2's first units are worth more than b1's last ones."""
    p = C.TablePredictor(task={"b1": lambda f, q: 1000.0 / q,               # scales linearly
                               "b2": lambda f, q: 10.0 / min(q, 30.0)},    # saturates at 30 %
                         bw={"b1": lambda f, q: 0.0, "b2": lambda f, q: 0.0},
                         ipc={"b1": lambda f, q: q / 10.0, "b2": lambda f, q: 0.05 * min(q, 30.0)})
    got = {}
    for obj in ("ipc", "normalised"):
        pol = make_policy("claius", predictor=p, objective=obj, hysteresis=0)
        for a in (B1, B2):
            pol.on_register(a)
            pol.on_task_done(a, TaskDone(features={"task": a.name}))
        got[obj] = (pol.last_packing.choice, pol.held)
    assert got["ipc"][0] == [10, 0] and got["ipc"][1][2] is True
    assert got["normalised"][0] == [7, 3]          # b2 at its 30 % knee, b1 the rest
    assert not any(got["normalised"][1].values())
    with pytest.raises(ValueError):
        make_policy("claius", objective="fastest")


def test_batch_curves_are_time_weighted_over_recent_tasks():
    """lud-like: a one-block step (0.1 ms at any quota) between grid-wide
    updates (1 ms at 100 %, scaling).  Judged by its last task alone the app
    would flip between "1 unit is enough" and "all units"; over its recent
    tasks it is the update's speed, diluted by the step."""
    p = C.TablePredictor(task={"lud": lambda f, q: 0.1 if f["task"] == "diag" else 100.0 / q},
                         bw={"lud": lambda f, q: 0.0}, ipc={})
    pol = make_policy("claius", predictor=p)
    app = AppInfo(1, 101, "lud", "batch")
    pol.on_register(app)
    pol.on_task_done(app, TaskDone(features={"task": "diag"}))
    assert pol.batch[1].ipc[1:] == pytest.approx(np.ones(10))     # alone: flat
    pol.on_task_done(app, TaskDone(features={"task": "internal"}))
    t = np.array([0.1 + 100.0 / q for q in range(10, 101, 10)])
    assert pol.batch[1].ipc[1:] == pytest.approx(t[-1] / t)
    d = pol.on_task_done(app, TaskDone(features={"task": "diag", "n": 2}))
    t2 = t + 0.1
    assert pol.batch[1].ipc[1:] == pytest.approx(t2[-1] / t2)
    assert d == []                                  # moved < 2 %: nothing decided again


def test_hysteresis_keeps_a_packing_that_is_nearly_as_good():
    """b1 and b2 identical and linear: any split of the units is worth the
    same, so once placed they stay put as their curves wobble, until the
    current split is worth 5 % less than the best."""
    speed = {"b1": 1.0, "b2": 1.0}
    p = C.TablePredictor(task={"b1": lambda f, q: speed["b1"] * 100.0 / q,
                               "b2": lambda f, q: speed["b2"] * 100.0 / q},
                         bw={"b1": lambda f, q: 0.0, "b2": lambda f, q: 0.0}, ipc={})
    pol = make_policy("claius", predictor=p)
    for a in (B1, B2):
        pol.on_register(a)
        pol.on_task_done(a, TaskDone(features={"task": a.name, "n": 0}))
    placed = dict(pol.sent)
    # b2's tasks get 3 % faster at 10 % only: a new best exists, not 5 % better
    speed["b2"] = 1.0
    p.task["b2"] = lambda f, q: (97.0 if q == 10 else 100.0) / q
    for i in range(1, 20):
        pol.on_task_done(B2, TaskDone(features={"task": "b2", "n": i}))
    assert pol.sent == placed
    assert sum(pol.sent.values()) == 100


def test_late_tasks_complete_their_own_querys_plan_only():
    """The feed lags the query boundaries: a task of query 1 that arrives
    after it ended joins the next query's plan, and one arriving during
    query 2 is not counted as query 2's progress."""
    pol = make_policy("claius", predictor=scripted_predictor())
    pol.on_register(SVC)
    pol.on_query_begin(SVC, QueryEvent(id=1, size=1, t_us=0))
    pol.on_task_done(SVC, TaskDone(features=TASKS[0], duration_us=1000, query=1))
    pol.on_query_end(SVC, QueryEvent(id=1, t_us=5000))
    for t in TASKS[1:3]:                                    # late, query 1's
        assert pol.on_task_done(SVC, TaskDone(features=t, duration_us=1000, query=1)) == []
    assert pol.qos[0].last_plan == TASKS[:3]
    pol.on_query_begin(SVC, QueryEvent(id=2, size=1, t_us=10000))
    assert pol.qos[0].query.plan == TASKS[:3]
    pol.on_task_done(SVC, TaskDone(features=TASKS[3], duration_us=1000, query=1))
    assert pol.qos[0].query.measured == []
    pol.on_task_done(SVC, TaskDone(features=TASKS[0], duration_us=1000, query=2))
    assert pol.qos[0].query.measured == [1.0]


def test_emit_sends_a_hold_change_even_at_the_same_quota():
    pol = make_policy("claius")
    assert pol._emit({5: (30, False)}) == [Decision(5, 30, None)]
    assert pol._emit({5: (30, False)}) == []
    assert pol._emit({5: (30, True)}) == [Decision(5, 30, None, hold=True)]
    assert pol._emit({5: (30, False)}) == [Decision(5, 30, None)]


def test_wants_tasks_with_a_predictor_only():
    pol = make_policy("claius", predictor=scripted_predictor())
    assert pol.wants_tasks(SVC) and pol.wants_tasks(B1)
    bare = make_policy("claius")
    assert not bare.wants_tasks(SVC) and not bare.wants_tasks(B1)


# --- the fast path decides exactly what the reference path decides --------------------

def random_predictor(rng: np.random.Generator, apps: list[str], tasks: list[str]) -> C.TablePredictor:
    """Lookup tables per (app, task) and quota; rounded so that ties happen."""
    def table(lo: float, hi: float, rising: bool) -> dict:
        out = {}
        for a in apps:
            for t in tasks:
                v = np.round(rng.uniform(lo, hi, 10), 1)
                out[a, t] = np.sort(v) if rising else np.sort(v)[::-1]
        return out
    tms, tbw, tipc = table(0.2, 3.0, False), table(10, 900, True), table(0.1, 5.0, True)
    qk = {a: rng.uniform(100, 600) for a in apps}

    def look(t: dict, a: str):
        return lambda f, q: float(t[a, f["task"]][int(q) // 10 - 1])
    return C.TablePredictor(
        query={a: (lambda k: lambda s, q: k * s / q)(qk[a]) for a in apps},
        pcie={a: lambda s, q: 0.5 for a in apps},
        task={a: look(tms, a) for a in apps}, bw={a: look(tbw, a) for a in apps},
        ipc={a: look(tipc, a) for a in apps})


def test_fast_path_decides_like_the_reference_on_random_runs():
    rng = np.random.default_rng(66)
    tasks = [f"k{i}" for i in range(4)]
    for run in range(40):
        nq, nb = int(rng.integers(1, 3)), int(rng.integers(1, 6))
        apps = [AppInfo(i, 100 + i, f"q{i}", "qos", qos_ms=float(rng.uniform(5, 40)))
                for i in range(nq)]
        apps += [AppInfo(nq + i, 200 + i, f"b{i}", "batch") for i in range(nb)]
        pred = random_predictor(rng, [a.name for a in apps], tasks)
        opts = dict(predictor=pred, device_bw_gbs=float(rng.uniform(500, 3000)),
                    bandwidth_cap=bool(rng.random() < 0.8), compensation=bool(rng.random() < 0.8))
        pols = [make_policy("claius", fast=True, **opts), make_policy("claius", fast=False, **opts)]
        live: set[int] = set()
        qid = {a.slot: 0 for a in apps}
        in_q: dict[int, list] = {}
        for step in range(80):
            a = apps[int(rng.integers(len(apps)))]
            r = rng.random()
            if a.slot not in live:
                ev = ("on_register", a)
                live.add(a.slot)
            elif r < 0.04:
                ev = ("on_exit", a)
                live.discard(a.slot)
                in_q.pop(a.slot, None)
            elif a.cls == "batch":
                ev = ("on_task_done", a, TaskDone(features={"task": tasks[int(rng.integers(4))]},
                                                  duration_us=1000.0))
            elif a.slot not in in_q:
                qid[a.slot] += 1
                plan = None if rng.random() < 0.4 else \
                    [{"task": tasks[int(rng.integers(4))]} for _ in range(int(rng.integers(1, 6)))]
                in_q[a.slot] = plan or []
                info = QueryEvent(id=qid[a.slot], size=float(rng.uniform(0.5, 2.0)), t_us=step,
                                  tasks=None if plan is None else tuple(plan))
                ev = ("on_query_begin", a, info)
            elif r < 0.25:
                in_q.pop(a.slot)
                ev = ("on_query_end", a, QueryEvent(id=qid[a.slot]))
            else:
                ev = ("on_task_done", a, TaskDone(features={"task": tasks[int(rng.integers(4))]},
                                                  duration_us=float(rng.uniform(100, 4000))))
            got = [getattr(p, ev[0])(*ev[1:]) for p in pols]
            assert got[0] == got[1], (run, step, ev)
            assert pols[0].sent == pols[1].sent and pols[0].held == pols[1].held


def test_model_predictor_scales_ipc_by_the_sms_a_quota_gives():
    """The task model's IPC is per active SM; a quota delivers it on the SMs
    MPS gives (whole TPCs: 12 at 10 %, 52 at 40 %), not floor(q x 132)
    (13 and 52).  The query's device time is its duration less its copies."""
    from controlplane.policies.predict import ModelPredictor

    class Const:
        def __init__(self, v: float):
            self.v = v

        def predict_quotas(self, row, quotas):
            return np.full(len(quotas), self.v)

    p = ModelPredictor(Const(5000.0), Const(1500.0), Const(2000.0), Const(80.0), Const(0.5), n_sms=132)
    q = np.array([10.0, 40.0, 45.0, 100.0])
    assert p.task_ipc("a", {}, q).tolist() == [6.0, 26.0, 29.0, 66.0]
    assert p.query_ms("a", 1.0, q).tolist() == [3.5] * 4 and p.pcie_ms("a", 1.0, q).tolist() == [1.5] * 4
    assert p.task_ms("a", {}, q).tolist() == [2.0] * 4 and p.task_bw("a", {}, q).tolist() == [80.0] * 4
