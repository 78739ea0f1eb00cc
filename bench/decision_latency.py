"""C-Laius decision latency: p50/p99 of
  (a) query arrival -> quota chosen (CLaius.on_query_begin: Eq. 3, QoS sharing,
      the knapsack for the batch apps, the Decisions), and
  (b) the knapsack solve alone (Eq. 4/5),
for 8 batch apps x 10 quota units on random instances, C search vs Python,
against the issue's target of 100 us at p99.  (a) is measured on the policy's
fast path (cached plan predictions, stacked batch curves) and, with the C
search, also on its reference path (fast=False), which decides alike.

    .venv/bin/python bench/decision_latency.py [--n 2000] [--apps 8] [--units 10]

Predictions come from precomputed arrays (what a compiled predictor hands
back in about a microsecond per question), so (a) measures the policy, not
the models.  The bandwidth cap is set to bind on about half the instances.
"""
from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np

from controlplane.policies import AppInfo, QueryEvent, TaskDone, make_policy
from controlplane.policies import claius as C

TARGET_US = 100.0


def instance(rng: np.random.Generator, apps: int, units: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Concave-ish IPC and rising bandwidth per unit count; the cap at 40..100 %
    of the unconstrained optimum's bandwidth."""
    v = np.zeros((apps, units + 1))
    b = np.zeros((apps, units + 1))
    v[:, 1:] = np.cumsum(rng.random((apps, units)) * np.linspace(1.0, 0.2, units), axis=1)
    b[:, 1:] = np.cumsum(rng.random((apps, units)) * 200.0, axis=1)
    free = C.knapsack_py(v, b, 0.0, use_cap=False)
    cap = free.bw * rng.uniform(0.4, 1.0)
    return v, b, float(cap)


def pct(xs: list[float]) -> tuple[float, float]:
    a = np.asarray(xs) * 1e6
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def row(label: str, xs: list[float]) -> None:
    p50, p99 = pct(xs)
    verdict = "meets" if p99 <= TARGET_US else "MISSES"
    print(f"{label:<44} p50 {p50:9.1f} us   p99 {p99:9.1f} us   ({verdict} {TARGET_US:.0f} us p99)")


def bench_knapsack(n: int, apps: int, units: int, solve: Callable[..., Any], seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        v, b, cap = instance(rng, apps, units)
        t0 = time.perf_counter()
        solve(v, b, cap, True)
        out.append(time.perf_counter() - t0)
    return out


class ArrayPredictor:
    """Precomputed curves: the QoS query at 1/q, tasks likewise; batch apps'
    IPC and bandwidth are set per iteration by the bench."""

    def __init__(self, quotas: np.ndarray):
        self.curve = 400.0 / quotas
        self.tcurve = 40.0 / quotas
        self.zero = np.zeros(len(quotas))

    def query_ms(self, app: str, size: float, quotas: np.ndarray) -> np.ndarray:
        return self.curve * size

    def pcie_ms(self, app: str, size: float, quotas: np.ndarray) -> np.ndarray:
        return self.zero + 0.5

    def task_ms(self, app: str, task: Any, quotas: np.ndarray) -> np.ndarray:
        return self.tcurve

    def task_bw(self, app: str, task: Any, quotas: np.ndarray) -> np.ndarray:
        return self.zero + 300.0

    def task_ipc(self, app: str, task: Any, quotas: np.ndarray) -> np.ndarray:
        return self.zero + 1.0


def bench_policy(n: int, apps: int, units: int, use_c: bool, seed: int,
                 fast: bool = True) -> list[float]:
    g = 100 // units
    quotas = np.arange(1, units + 1, dtype=np.float64) * g
    pol = make_policy("claius", predictor=ArrayPredictor(quotas), granularity=g, use_c=use_c,
                      device_bw_gbs=2000.0, fast=fast)
    svc = AppInfo(0, 1000, "svc", "qos", qos_ms=10.0)
    pol.on_register(svc)
    batch = [AppInfo(i + 1, 1001 + i, f"b{i}", "batch") for i in range(apps)]
    for b in batch:
        pol.on_register(b)
        pol.on_task_done(b, TaskDone(features={"task": b.name}))
    tasks = [{"task": f"k{i}"} for i in range(10)]
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        v, bw, _ = instance(rng, apps, units)
        for j, b in enumerate(batch):          # new ready tasks: new predictions, as
            pol.set_batch_curves(b.slot, v[j], bw[j])   # on_task_done sets them
        size = float(rng.uniform(0.5, 2.0))    # Eq. 3 lands on 30..90 %
        info = QueryEvent(id=i, size=size, t_us=i * 1000, tasks=tuple(tasks))
        t0 = time.perf_counter()
        pol.on_query_begin(svc, info)
        out.append(time.perf_counter() - t0)
        pol.on_query_end(svc, QueryEvent(id=i))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="instances per measurement")
    ap.add_argument("--apps", type=int, default=8)
    ap.add_argument("--units", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(f"C-Laius decision latency: {a.apps} batch apps x {a.units} units, {a.n} random "
          f"instances each, bandwidth cap on; C search {'built' if C.knapsack_c_available() else 'NOT built'}")
    for use_c in ([True] if C.knapsack_c_available() else []) + [False]:
        name = "C" if use_c else "Python"
        solve = C.knapsack_c if use_c else C.knapsack_py
        bench_knapsack(min(a.n, 100), a.apps, a.units, solve, a.seed + 99)        # warm up
        row(f"(b) knapsack solve, {name}", bench_knapsack(a.n, a.apps, a.units, solve, a.seed))
        bench_policy(min(a.n, 100), a.apps, a.units, use_c, a.seed + 99)
        row(f"(a) query arrival -> quota chosen, {name}",
            bench_policy(a.n, a.apps, a.units, use_c, a.seed))
        if use_c:
            bench_policy(min(a.n, 100), a.apps, a.units, use_c, a.seed + 99, fast=False)
            row("(a) the same, reference path (fast=False)",
                bench_policy(a.n, a.apps, a.units, use_c, a.seed, fast=False))


if __name__ == "__main__":
    main()
