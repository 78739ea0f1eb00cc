"""static-optimal: the split against brute force, the QoS constraint, the
infeasible fallback, and curves read from a profile store (all in process)."""
from __future__ import annotations

import itertools
import logging
import math

import numpy as np

from controlplane.policies import AppInfo, Decision, make_policy
from controlplane.policies import static_optimal as SO
from controlplane.policies.predict import TablePredictor
from predictors import schema as S
from predictors.store import Store

Q = np.arange(10, 101, 10, dtype=np.float64)


def table_pred(lat: dict, run: dict) -> TablePredictor:
    """lat[app][i]: QoS latency at quota (i+1)*10 (pcie 0); run[app][i]: batch run ms."""
    return TablePredictor(query={a: (lambda v: lambda s, q: float(v[int(q) // 10 - 1]))(v)
                                 for a, v in lat.items()},
                          task={a: (lambda v: lambda f, q: float(v[int(q) // 10 - 1]))(v)
                                for a, v in run.items()})


def brute(lat: dict, run: dict, targets: dict, names: list[str]) -> float | None:
    """Best summed normalised batch throughput over every split (each app >= 1 unit)."""
    best = None
    for ks in itertools.product(range(1, 11), repeat=len(names)):
        if sum(ks) > 10:
            continue
        if any(n in lat and lat[n][k - 1] > targets[n] for n, k in zip(names, ks)):
            continue
        v = sum(run[n][-1] / run[n][k - 1] for n, k in zip(names, ks) if n in run)
        best = v if best is None else max(best, v)
    return best


def test_split_is_the_brute_force_optimum_and_meets_qos():
    rng = np.random.default_rng(5)
    for _ in range(60):
        nq, nb = int(rng.integers(0, 3)), int(rng.integers(1, 4))
        lat = {f"q{i}": np.sort(np.round(rng.uniform(1, 30, 10), 1))[::-1] for i in range(nq)}
        # run times that fall with the quota, unevenly (some apps scale badly)
        run = {f"b{i}": np.round(np.cumsum(rng.uniform(0, 50, 10))[::-1] + rng.uniform(1, 200), 1)
               for i in range(nb)}
        targets = {n: float(rng.uniform(3, 30)) for n in lat}
        pol = make_policy("static-optimal", predictor=table_pred(lat, run))
        apps = [AppInfo(i, 100 + i, n, "qos", qos_ms=targets[n]) for i, n in enumerate(lat)]
        apps += [AppInfo(nq + i, 200 + i, n, "batch") for i, n in enumerate(run)]
        for a in apps:
            pol.on_register(a)
        ref = brute(lat, run, targets, [a.name for a in apps])
        sp = pol.last
        if ref is None:
            assert not sp.feasible
            continue
        assert sp.feasible and math.isclose(sp.score, ref, abs_tol=1e-9)
        assert sum(sp.units.values()) <= 10 and min(sp.units.values()) >= 1
        for a in apps:
            if a.cls == "qos":
                assert lat[a.name][sp.units[a.slot] - 1] <= a.qos_ms       # QoS constraint
        assert {s: pol.given[s] for s in sp.units} == {s: u * 10 for s, u in sp.units.items()}


def test_hand_case_qos_need_then_batch_by_throughput(caplog):
    lat = {"svc": 100.0 / Q}                        # 10 ms at 10 %, 2.5 at 40 %
    run = {"fast": 100.0 / Q,                       # scales: thr = q / 100
           "flat": 100.0 / np.minimum(Q, 20.0)}     # nothing past 20 %
    pol = make_policy("static-optimal", predictor=table_pred(lat, run))
    assert pol.on_register(AppInfo(0, 1, "svc", "qos", qos_ms=3.0)) == [Decision(0, 100, None)]
    # alone with svc: svc its need, 40 %; fast the other 60 %
    assert pol.on_register(AppInfo(1, 2, "fast", "batch")) == [Decision(0, 40, None),
                                                               Decision(1, 60, None)]
    with caplog.at_level(logging.INFO, logger="colocate.static_optimal"):
        d = pol.on_register(AppInfo(2, 3, "flat", "batch"))
    # svc needs 40 % (100/40 = 2.5 <= 3); flat is worth its full 1.0 at 20 %; fast the rest
    assert d == [Decision(1, 40, None), Decision(2, 20, None)]     # svc already had 40
    assert pol.given == {0: 40, 1: 40, 2: 20}
    assert "svc 40% (latency 2.5 ms, target 3.0 ms)" in caplog.text
    assert "batch throughput sum 1.4" in caplog.text
    # the set changes: recomputed
    assert pol.on_exit(AppInfo(2, 3, "flat", "batch")) == [Decision(1, 60, None)]


def test_no_feasible_split_says_so_and_falls_back(caplog):
    lat = {"svc": 100.0 / Q}
    pol = make_policy("static-optimal", predictor=table_pred(lat, {"b": 100.0 / Q}))
    with caplog.at_level(logging.WARNING, logger="colocate.static_optimal"):
        pol.on_register(AppInfo(0, 1, "svc", "qos", qos_ms=0.5))      # 1 ms at 100 %: never
        d = pol.on_register(AppInfo(1, 2, "b", "batch"))
        d2 = pol.on_register(AppInfo(2, 3, "b", "batch"))
    assert "no feasible split" in caplog.text
    assert d == [Decision(1, 100, None)]
    assert d2 == [Decision(1, 50, None), Decision(2, 50, None)] and pol.given[0] == 100


def test_curves_from_a_profile_store(tmp_path):
    st = Store(tmp_path, "sim-h100")
    qs, tasks = [], []
    for q in (20, 50, 100):
        for size in (1, 4):
            for r in range(2):
                qs.append({"key": f"tonic:dig --width 8|{size}|q{q}#r{r}",
                           "f": {"service": "tonic:dig --width 8", "input_bytes": size * 1e3,
                                 "batch": size, "quota": q},
                           "t": {"duration_us": size * 1000.0 * 100 / q + r * 10, "pcie_us": 5.0}})
        for i in range(3):                          # 3 tasks of 100/q ms: a 300/q ms run
            tasks.append({"key": f"hotspot|--size 64|q{q}|{i}#r0",
                          "f": S.task_row("k", 64, quota=q), "t": {"duration_us": 1e5 / q}})
    st.append("query", qs)
    st.append("task", tasks)
    lat, runs = SO.load_profiles(tmp_path)          # the root holding one device
    # the largest input's mean over repetitions: 4 ms * 100/q + 5 us
    got = SO.match("dig", lat)
    assert sorted(got) == [20, 50, 100]
    assert np.allclose([got[20], got[50], got[100]], [20.005, 8.005, 4.005])
    assert sorted(runs["hotspot"]) == [20, 50, 100]
    assert np.allclose([runs["hotspot"][q] for q in (20, 50, 100)], [15.0, 6.0, 3.0])
    pol = make_policy("static-optimal", profiles=str(tmp_path / "sim-h100"))
    pol.on_register(AppInfo(0, 1, "dig", "qos", qos_ms=10.0))
    pol.on_register(AppInfo(1, 2, "hotspot", "batch"))
    # dig: 10 % unknown (below the profile), 40 % interpolates to 12.0, 50 % 8.005
    assert pol.given == {0: 50, 1: 50}
    assert np.isinf(pol.curve[0][0])
    assert math.isclose(pol.curve[1][0], 3.0 / 30.0)    # 10 %: 15 ms * 20/10 = 30 ms
