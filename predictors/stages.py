"""Per-stage performance models of a microservice pipeline (Camelot §VII-A,
Fig. 12): a stage's duration, memory bandwidth and throughput from its batch
size and SM quota, learned from profiled samples; its FLOPs, memory
footprint and PCIe bytes per batch by linear regression on the batch (the
paper: "LR is able to precisely capture such linear relationship"); its PCIe
rate (the allocator's optional pcie_gbs) is those bytes over the predicted
duration.

    samples = profile_stage(truth, batches=BATCHES, pcts=PCTS)   # solo runs
    model = StagePredictor("dt").fit(samples)                     # the paper's choice
    stage = model.as_stage(truth.name)                            # a StageModel for the allocator
    errors = compare(samples)                                     # Fig. 12: DT / LR / RF

`truth` is anything with the StageModel methods (duration_s, bandwidth_gbs,
mem_gb, gflop; pcie_gbs when it has one, else 0 bytes): on simgpu, bench/camelot/suite.DevStage, whose numbers are
the device model's solo times, i.e. what profiling each (batch, quota) alone
measures (§VII-A: "queries are executed in solo-run mode").  The split is
70/30 by sample, seeded, as in the paper.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

import numpy as np
from sklearn.ensemble import RandomForestRegressor
from sklearn.linear_model import LinearRegression
from sklearn.tree import DecisionTreeRegressor

BATCHES = (1, 2, 4, 8, 16, 32, 64)
PCTS = tuple(range(5, 101, 5))
TARGETS = ("duration_s", "bandwidth_gbs", "throughput_qps")
KINDS = ("dt", "lr", "rf")


class Measured(Protocol):
    name: str

    def duration_s(self, pct: int, batch: int) -> float: ...
    def bandwidth_gbs(self, pct: int, batch: int) -> float: ...
    def mem_gb(self, batch: int) -> float: ...
    def gflop(self, batch: int) -> float: ...


@dataclass(frozen=True)
class Samples:
    """Profiled rows: features (batch, pct) and the measured targets."""
    name: str
    X: np.ndarray                 # (n, 2): batch, pct
    y: dict[str, np.ndarray]      # TARGETS -> (n,)
    mem_gb: dict[int, float]      # batch -> footprint
    gflop: dict[int, float]       # batch -> work
    pcie_gb: dict[int, float] = field(default_factory=dict)   # batch -> host<->device GB per batch (none: 0)


def profile_stage(truth: Measured, batches: Sequence[int] = BATCHES, pcts: Sequence[int] = PCTS) -> Samples:
    """Every (batch, quota) of the grid measured alone."""
    X = np.array([(b, p) for b in batches for p in pcts], dtype=float)
    dur = np.array([truth.duration_s(int(p), int(b)) for b, p in X])
    bw = np.array([truth.bandwidth_gbs(int(p), int(b)) for b, p in X])
    pcie = getattr(truth, "pcie_gbs", None)
    # bytes per batch: rate x duration (the copies do not depend on the quota; at the largest quota)
    pcie_gb = {} if pcie is None else {b: float(pcie(max(pcts), b)) * truth.duration_s(max(pcts), b)
                                       for b in batches}
    return Samples(truth.name, X, {"duration_s": dur, "bandwidth_gbs": bw, "throughput_qps": X[:, 0] / dur},
                   {b: truth.mem_gb(b) for b in batches}, {b: truth.gflop(b) for b in batches}, pcie_gb)


def store_samples(store: Any, label: str, units: int, words: bool, mem_gb: Callable[[int], float],
                  gflop: Callable[[int], float], batches: Sequence[int] = BATCHES, name: str = "") -> Samples:
    """A stage's Samples from `colocate profile`'s store (predictors/store.py):
    the query samples of Tonic service `label` (its profile label, e.g.
    "tonic:vgg --width 0.1"), one per (query size, quota, repetition); a
    query of the stage is `units` items (images; words of one sentence).

    duration_s   the query's device time (CUDA events around its H2D copy,
                 network and D2H copy), median over repetitions; an image net
                 profiled at size k x units is batch k; a word net runs each
                 query's sentence alone (stage_worker.NetStage), so batch b
                 takes b x the time of one sentence of `units` words;
    bandwidth    the bytes of the query's tasks (their task samples:
                 bandwidth x duration) over its device time;
    PCIe bytes   pcie_us at the profile's PCIe rate is not kept: the stage's
                 copies (to and from the host) are the query's input_bytes
                 and nothing else is known, so they are input_bytes per batch;
    mem_gb, gflop  not measured by the profile: the callables (the stage's
                 description, bench/camelot/suite.py).
    Raises ValueError when the store has no query of `label` at a usable size."""
    from collections import defaultdict
    q, t = store.load("query"), store.load("task")
    dur: dict[tuple[int, int], list[float]] = defaultdict(list)
    inb: dict[int, float] = {}
    for row, y in zip(q.rows, q.Y):
        if row["service"] != label:
            continue
        size, pct = int(row["batch"]), int(row["quota"])
        if words and size != units or not words and size % units:
            continue
        b = 1 if words else size // units
        dur[b, pct].append(float(y[q.kind.target_names.index("duration_us")]) * 1e-6)
        inb[b] = float(row["input_bytes"])
    if not dur:
        raise ValueError(f"no profiled query of {label!r} at {units if words else 'a multiple of ' + str(units)} "
                         f"items in the store: run `colocate profile {label.split()[0]}`")
    gb: dict[tuple[int, int], list[float]] = defaultdict(list)
    di, bi = t.kind.target_names.index("duration_us"), t.kind.target_names.index("bandwidth_gbs")
    per_run: dict[str, float] = defaultdict(float)
    for key, y in zip(t.keys, t.Y):
        if key.startswith(label + "|") and np.isfinite(y[bi]):
            head, rep = key.rsplit("#", 1)
            per_run[head.rsplit("|", 1)[0] + "#" + rep] += float(y[di]) * float(y[bi]) * 1e-6   # GB
    for run, g in per_run.items():
        _, sz, qq = run.split("#")[0].rsplit("|", 2)
        size_i, pct = int(sz), int(qq[1:])
        if words and size_i == units or not words and size_i % units == 0:
            gb[1 if words else size_i // units, pct].append(g)
    rows, d, bw = [], [], []
    for (b, pct), ds in sorted(dur.items()):
        for k in (list(batches) if words else [b]):
            scale = k if words else 1
            med = float(np.median(ds)) * scale
            rows.append((k, pct))
            d.append(med)
            bw.append(float(np.median(gb[b, pct])) * scale / med if gb.get((b, pct)) else 0.0)
    X = np.array(rows, dtype=float)
    dd = np.array(d)
    bb = np.maximum(np.array(bw), 1e-9)
    have = sorted({int(x) for x in X[:, 0]})
    pcie = {k: (inb[1] * k if words else inb.get(k, inb[min(inb)] * k / min(inb))) / 1e9 for k in have}
    return Samples(name or label, X, {"duration_s": dd, "bandwidth_gbs": bb, "throughput_qps": X[:, 0] / dd},
                   {k: mem_gb(k) for k in have}, {k: gflop(k) for k in have}, pcie)


def _estimator(kind: str, seed: int):
    if kind == "dt":
        return DecisionTreeRegressor(random_state=seed)
    if kind == "rf":
        return RandomForestRegressor(n_estimators=24, random_state=seed)
    if kind == "lr":
        return LinearRegression()
    raise ValueError(f"model kind {kind!r}: one of {', '.join(KINDS)}")


def _features(X: np.ndarray) -> np.ndarray:
    """log batch and log quota: work scales with the batch and inversely with
    the SMs, so both trees and the linear model see ratios as differences."""
    return np.log(X)


class StagePredictor:
    """One regressor per target on (log batch, log pct), log target; LR of
    footprint, work and PCIe bytes on the batch.  A scikit-learn-style estimator."""

    def __init__(self, kind: str = "dt", seed: int = 0) -> None:
        _estimator(kind, seed)
        self.kind, self.seed = kind, seed

    def fit(self, s: Samples, rows: np.ndarray | None = None) -> "StagePredictor":
        idx = np.arange(len(s.X)) if rows is None else rows
        self.name_ = s.name
        self.models_ = {t: _estimator(self.kind, self.seed).fit(_features(s.X[idx]), np.log(s.y[t][idx]))
                        for t in TARGETS}
        b = np.array(sorted(s.mem_gb), dtype=float).reshape(-1, 1)
        self.mem_ = LinearRegression().fit(b, [s.mem_gb[int(x)] for x in b[:, 0]])
        self.work_ = LinearRegression().fit(b, [s.gflop[int(x)] for x in b[:, 0]])
        pb = np.array(sorted(s.pcie_gb), dtype=float).reshape(-1, 1)
        self.pcie_ = LinearRegression().fit(pb, [s.pcie_gb[int(x)] for x in pb[:, 0]]) if len(pb) else None
        return self

    def predict(self, target: str, X: Any) -> np.ndarray:
        return np.exp(self.models_[target].predict(_features(np.asarray(X, dtype=float).reshape(-1, 2))))

    def as_stage(self) -> "PredictedStage":
        return PredictedStage(self)


@dataclass(frozen=True, eq=False)
class PredictedStage:
    """The allocator's StageModel from a fitted StagePredictor (memoised)."""
    model: StagePredictor
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.model.name_

    def _one(self, target: str, pct: int, batch: int) -> float:
        """One prediction; a miss predicts every quota 1..100 at this batch in
        one call (an allocator asks for all its quota levels: one call each
        took ~0.2 ms, 20+ ms per allocation)."""
        key = (target, pct, batch)
        if key not in self._cache:
            pcts = sorted(set(range(1, 101)) | {pct})
            ys = self.model.predict(target, [[batch, p] for p in pcts])
            self._cache.update({(target, p, batch): float(y) for p, y in zip(pcts, ys)})
        return self._cache[key]

    def duration_s(self, pct: int, batch: int) -> float:
        """batch / f(p): the throughput model's answer, which is f of Eq. 1
        itself and the more accurate of the two on held-out configurations
        (`colocate experiment camelot-predictors`: DT 1.8 % vs 11 %)."""
        return batch / self._one("throughput_qps", pct, batch)

    def bandwidth_gbs(self, pct: int, batch: int) -> float:
        return self._one("bandwidth_gbs", pct, batch)

    def mem_gb(self, batch: int) -> float:
        return float(self.model.mem_.predict([[batch]])[0])

    def gflop(self, batch: int) -> float:
        return float(self.model.work_.predict([[batch]])[0])

    def pcie_gbs(self, pct: int, batch: int) -> float:
        """PCIe rate while running: the LR's bytes per batch over the predicted
        duration (0 when the profile had no PCIe traffic)."""
        lr = getattr(self.model, "pcie_", None)
        if lr is None:
            return 0.0
        return max(float(lr.predict([[batch]])[0]), 0.0) / self.duration_s(pct, batch)


def split(n: int, seed: int = 0, test: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """70/30 by sample (§VII-A), seeded."""
    perm = np.random.default_rng(seed).permutation(n)
    k = int(round(n * test))
    return np.sort(perm[k:]), np.sort(perm[:k])


def compare(s: Samples, kinds: Sequence[str] = KINDS, seed: int = 0) -> dict[str, dict[str, float]]:
    """Fig. 12: mean absolute percentage error on the held-out 30 % per
    model kind and target."""
    train, test = split(len(s.X), seed)
    out: dict[str, dict[str, float]] = {}
    for kind in kinds:
        m = StagePredictor(kind, seed).fit(s, train)
        out[kind] = {t: float(np.mean(np.abs(m.predict(t, s.X[test]) - s.y[t][test]) / s.y[t][test]))
                     for t in TARGETS}
    return out
