"""static-optimal: the best static SM split, found offline, per set of apps.

C-Laius's strongest static baseline: for the registered apps, every split of
100 % into granularity units (every app at least one unit) is considered;

  - a QoS app must get at least need = the smallest quota whose profiled (or
    predicted) query latency meets its target;
  - among the splits that respect every need, the one with the largest sum
    over batch apps of throughput normalised to quota 100,
        thr_b(q) = T_b(100) / T_b(q),
    T_b(q) being one run's summed task durations at quota q, wins.

The objective is a sum over apps, so the exhaustive search is a DP over
units (exact: it finds what enumerating every split finds, see the test),
with QoS apps at their need and the batch apps sharing the rest; units the
batch apps cannot use (their throughput does not rise) go to the QoS apps
as headroom, round robin by slot.  Ties keep the fewest units for batch.
No feasible split (a need cannot be met, or the needs leave fewer units
than batch apps): it says so and falls back to QoS apps 100 % each, batch
apps an even share of 100 % (as mps-priority).

The split is recomputed when the set of apps changes and is fixed for a
given set; each app is routed to a worker of its quota (route None).

Inputs, per app name:
  profiles=DIR  a profile store (`colocate profile`): DIR is a device's
                directory (<root>/<device>/ with task.jsonl, query.jsonl) or
                a root holding exactly one.  QoS latency at q: the largest,
                over the profiled inputs, of the mean end-to-end query
                duration over repetitions.  Batch T(q): the mean, over inputs,
                of the mean over repetitions of the run's summed task
                durations.  Quotas between profiled ones are interpolated
                linearly; below the smallest, a QoS app is taken as missing
                its target and a batch run as scaling with 1/q.
  predictor / models=DIR  as claius: latency = query_ms + pcie_ms at input
                size qos_size (1); T_b(q) = task_ms of a task named after the
                app (what a TablePredictor keyed by app answers; trained
                models know kernels, not apps: use profiles= with them).
Apps with no data: a batch app's throughput is taken as q / 100; a QoS
app's need as unknown (no feasible split).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from controlplane.policies.base import AppInfo, Decision, Policy, register_policy
from controlplane.policies.mps import round_share
from controlplane.policies.predict import ModelPredictor, Predictor

log = logging.getLogger("colocate.static_optimal")


# --- curves from a profile store ------------------------------------------------

def _key_parts(key: str) -> tuple[str, str, int, str] | None:
    """"target|input|q50|3#r1" or "target|input|q50#r1" -> (target, input, 50, "3#r1")."""
    body, _, rep = key.rpartition("#r")
    parts = body.split("|")
    if len(parts) >= 4 and parts[-2].startswith("q"):
        tgt, inp, qs, idx = "|".join(parts[:-3]), parts[-3], parts[-2], parts[-1]
    elif len(parts) >= 3 and parts[-1].startswith("q"):
        tgt, inp, qs, idx = "|".join(parts[:-2]), parts[-2], parts[-1], ""
    else:
        return None
    try:
        return tgt, inp, int(qs[1:]), f"{idx}#r{rep}"
    except ValueError:
        return None


def _mean_over_reps(vals: dict[tuple[str, str, int, str], float]) -> dict[str, dict[int, dict[str, float]]]:
    """(target, input, quota, rep) -> value  ==>  target -> quota -> input -> mean over reps."""
    acc: dict[tuple[str, int, str], list[float]] = {}
    for (tgt, inp, q, _rep), v in vals.items():
        acc.setdefault((tgt, q, inp), []).append(v)
    out: dict[str, dict[int, dict[str, float]]] = {}
    for (tgt, q, inp), vs in acc.items():
        out.setdefault(tgt, {}).setdefault(q, {})[inp] = float(np.mean(vs))
    return out


def load_profiles(d: Path | str) -> tuple[dict[str, dict[int, float]], dict[str, dict[int, float]]]:
    """(QoS latency ms per quota, batch run ms per quota), by target label."""
    from predictors.store import Store, StoreError
    d = Path(d)
    if not any((d / f"{k}.jsonl").exists() for k in ("task", "query")):
        subs = [p for p in d.iterdir() if p.is_dir()] if d.is_dir() else []
        if len(subs) != 1:
            raise ValueError(f"static-optimal: {d} is not a device's profile directory "
                             f"(task.jsonl/query.jsonl) nor a root holding exactly one")
        d = subs[0]
    st = Store(d.parent, d.name)
    qos: dict[str, dict[int, float]] = {}
    runs: dict[str, dict[int, float]] = {}
    try:
        qs = st.load("query")
    except StoreError:
        qs = None
    if qs is not None:
        vals = {}
        for key, y in zip(qs.keys, qs.y("duration_us")):
            kp = _key_parts(key)
            if kp is not None and not math.isnan(y):
                vals[kp] = y / 1000.0
        for tgt, per_q in _mean_over_reps(vals).items():
            qos[tgt] = {q: max(by_in.values()) for q, by_in in per_q.items()}
    try:
        ts = st.load("task")
    except StoreError:
        ts = None
    if ts is not None:
        sums: dict[tuple[str, str, int, str], float] = {}
        for key, y in zip(ts.keys, ts.y("duration_us")):
            kp = _key_parts(key)
            if kp is None or math.isnan(y):
                continue
            tgt, inp, q, idx_rep = kp
            run = (tgt, inp, q, idx_rep.rpartition("#r")[2])
            sums[run] = sums.get(run, 0.0) + y / 1000.0
        for tgt, per_q in _mean_over_reps(sums).items():
            runs[tgt] = {q: float(np.mean(list(by_in.values()))) for q, by_in in per_q.items()}
    return qos, runs


def match(name: str, table: dict[str, Any]) -> Any | None:
    """An app's entry: its exact label, else a label whose first word is the
    name, or is tonic:NAME."""
    if name in table:
        return table[name]
    for label, v in sorted(table.items()):
        first = label.split()[0] if label.split() else label
        if first == name or first == f"tonic:{name}" or first.partition(":")[2] == name:
            return v
    return None


def on_quotas(points: dict[int, float], quotas: np.ndarray, below: str) -> np.ndarray:
    """Profiled values at quotas: linear in between; below the smallest,
    "inf" (unknown: not met) or "scale" (value * qmin / q)."""
    qs = np.array(sorted(points), dtype=np.float64)
    vs = np.array([points[int(q)] for q in qs], dtype=np.float64)
    out = np.interp(quotas, qs, vs)
    lo = quotas < qs[0]
    out[lo] = math.inf if below == "inf" else vs[0] * qs[0] / quotas[lo]
    return out


# --- the split ---------------------------------------------------------------------

def need_units(latency_ms: np.ndarray | None, target_ms: float | None) -> int | None:
    """Units (1-based) of the smallest quota meeting the target; 1 without a
    target; None when no quota meets it or the latency is unknown."""
    if target_ms is None:
        return 1
    if latency_ms is None:
        return None
    ok = np.asarray(latency_ms) <= target_ms
    i = int(ok.argmax())
    return i + 1 if ok[i] else None


def best_batch(thr: Sequence[np.ndarray], free: int) -> tuple[list[int], float] | None:
    """Units per batch app (each >= 1, summed <= free) maximising sum thr_i[k_i - 1];
    the fewest units among equal sums.  None when free < number of apps."""
    n = len(thr)
    if n == 0:
        return [], 0.0
    if free < n:
        return None
    # f[i][u]: best of apps i.. with at most u units; pick[i][u]: units to app i
    f = [[-math.inf] * (free + 1) for _ in range(n + 1)]
    pick = [[0] * (free + 1) for _ in range(n)]
    f[n] = [0.0] * (free + 1)
    for i in range(n - 1, -1, -1):
        for u in range(free + 1):
            for k in range(1, u + 1):
                c = float(thr[i][k - 1]) + f[i + 1][u - k]
                if c > f[i][u]:
                    f[i][u], pick[i][u] = c, k
    u = min(range(free + 1), key=lambda x: (-f[0][x], x))   # best, fewest units
    best = f[0][u]
    out = []
    for i in range(n):
        k = pick[i][u]
        out.append(k)
        u -= k
    return out, best


@dataclass
class Split:
    units: dict[int, int]                  # slot -> units
    feasible: bool
    score: float                           # summed normalised batch throughput


@register_policy("static-optimal")
class StaticOptimal(Policy):
    def __init__(self, granularity: int = 10, predictor: Predictor | None = None,
                 models: str | Path | None = None, profiles: str | Path | None = None,
                 qos_size: float = 1.0, **opts: Any):
        super().__init__(**opts)
        if not 1 <= granularity <= 100 or 100 % granularity:
            raise ValueError(f"granularity must divide 100, got {granularity}")
        self.g = int(granularity)
        self.n = 100 // self.g
        self.quotas = np.arange(1, self.n + 1, dtype=np.float64) * self.g
        if predictor is None and models is not None:
            predictor = ModelPredictor.from_dir(models)
        self.pred = predictor
        self.qos_size = float(qos_size)
        self.prof_qos: dict[str, dict[int, float]] = {}
        self.prof_runs: dict[str, dict[int, float]] = {}
        if profiles is not None:
            self.prof_qos, self.prof_runs = load_profiles(profiles)
        if self.pred is None and profiles is None:
            log.warning("static-optimal: no profiles and no predictor: QoS needs are unknown")
        self.apps: dict[int, AppInfo] = {}
        self.curve: dict[int, np.ndarray | None] = {}   # latency (QoS) or thr (batch) per quota
        self.given: dict[int, int] = {}
        self.last: Split | None = None

    # --- curves ----------------------------------------------------------------
    def _latency(self, app: AppInfo) -> np.ndarray | None:
        pts = match(app.name, self.prof_qos)
        if pts:
            return on_quotas(pts, self.quotas, "inf")
        if self.pred is not None:
            try:
                return (np.asarray(self.pred.query_ms(app.name, self.qos_size, self.quotas)) +
                        np.asarray(self.pred.pcie_ms(app.name, self.qos_size, self.quotas)))
            except (KeyError, ValueError) as e:
                log.warning("static-optimal: no latency for %s (%s)", app.name, e)
        return None

    def _throughput(self, app: AppInfo) -> np.ndarray:
        t = None
        pts = match(app.name, self.prof_runs)
        if pts:
            t = on_quotas(pts, self.quotas, "scale")
        elif self.pred is not None:
            from predictors.schema import task_row
            try:
                t = np.asarray(self.pred.task_ms(app.name, task_row(app.name, 0.0), self.quotas),
                               dtype=np.float64)
            except (KeyError, ValueError) as e:
                log.warning("static-optimal: no run time for %s (%s)", app.name, e)
        if t is None or not np.all(t > 0):
            log.warning("static-optimal: %s: throughput taken as quota / 100", app.name)
            return self.quotas / 100.0
        return t[-1] / t

    # --- the split -----------------------------------------------------------------
    def split(self) -> Split:
        qos = sorted(s for s, a in self.apps.items() if a.cls == "qos")
        batch = sorted(s for s, a in self.apps.items() if a.cls != "qos")
        maybe = {s: need_units(self.curve[s], self.apps[s].qos_ms) for s in qos}
        needs = {s: v for s, v in maybe.items() if v is not None}
        curves = [c for c in (self.curve[s] for s in batch) if c is not None]   # all: _throughput
        res = None
        if len(needs) == len(maybe) and len(curves) == len(batch):
            free = self.n - sum(needs.values())
            res = best_batch(curves, free) if free >= 0 else None
        if res is None:
            units = {s: self.n for s in qos}
            units.update({s: round_share(100.0 / len(batch), self.g) // self.g for s in batch})
            return Split(units, False, 0.0)
        ks, score = res
        units = dict(needs)
        units.update(zip(batch, ks))
        left = self.n - sum(units.values())
        for i in range(left if qos else 0):         # spare units: QoS headroom
            units[qos[i % len(qos)]] += 1
        return Split(units, True, score)

    def _log(self, sp: Split) -> None:
        parts = []
        for s, u in sorted(sp.units.items()):
            a, c, q = self.apps[s], self.curve[s], u * self.g
            if a.cls == "qos":
                lat = "unknown" if c is None else f"{c[u - 1]:.3g} ms"
                parts.append(f"{a.name} {q}% (latency {lat}, target {a.qos_ms} ms)")
            else:
                assert c is not None                     # _throughput always has one
                parts.append(f"{a.name} {q}% (throughput {c[u - 1]:.3g} of solo)")
        if sp.feasible:
            log.info("static-optimal: split for %d apps: %s; batch throughput sum %.3g",
                     len(sp.units), ", ".join(parts), sp.score)
        else:
            log.warning("static-optimal: no feasible split (QoS targets cannot all be met "
                        "with a unit per batch app): QoS apps 100 %%, batch apps even: %s",
                        ", ".join(parts))

    def _decide(self) -> list[Decision]:
        sp = self.split()
        self.last = sp
        if self.apps:
            self._log(sp)
        out = []
        for s, u in sorted(sp.units.items()):
            q = u * self.g
            if self.given.get(s) != q:
                self.given[s] = q
                out.append(Decision(s, q, None))
        return out

    # --- hooks -----------------------------------------------------------------------
    def on_register(self, app: AppInfo) -> list[Decision]:
        self.apps[app.slot] = app
        self.curve[app.slot] = self._latency(app) if app.cls == "qos" else self._throughput(app)
        return self._decide()

    def on_exit(self, app: AppInfo) -> list[Decision]:
        self.apps.pop(app.slot, None)
        self.curve.pop(app.slot, None)
        self.given.pop(app.slot, None)
        return self._decide()
