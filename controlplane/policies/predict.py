"""What C-Laius (and the baselines that share its models) ask of the
predictors: a Predictor protocol, all quotas at once, and two adapters:
TablePredictor (fixed curves, for tests and benchmarks) and ModelPredictor
(trained models from predictors/).
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import numpy as np

Row = Mapping[str, Any]


# --- predictions ---------------------------------------------------------------

class Predictor(Protocol):
    """What C-Laius asks, always for all quotas (percent) at once."""

    def query_ms(self, app: str, input_size: float, quotas: np.ndarray) -> np.ndarray:
        """A query's device time (its tasks, without PCIe copies), ms."""
        ...

    def pcie_ms(self, app: str, input_size: float, quotas: np.ndarray) -> np.ndarray:
        """A query's host<->device copy time, ms."""
        ...

    def task_ms(self, app: str, task: Row, quotas: np.ndarray) -> np.ndarray:
        ...

    def task_bw(self, app: str, task: Row, quotas: np.ndarray) -> np.ndarray:
        """Memory bandwidth, GB/s."""
        ...

    def task_ipc(self, app: str, task: Row, quotas: np.ndarray) -> np.ndarray:
        """Device-level IPC at the quota: what the knapsack adds up."""
        ...

    # optional: whole_app(app) -> bool: a task row named after the app
    # (schema.task_row(app, 0)) stands for the app's whole run, so a policy
    # may plan for a batch app before any task of its has ended.  Absent
    # (trained models know kernels, not apps): False.


def knows_whole_app(pred: Any, app: str) -> bool:
    """Whether pred answers for app's whole run (the optional whole_app)."""
    f = getattr(pred, "whole_app", None)
    return bool(f(app)) if callable(f) else False


Fn = Callable[[Any, float], float]


class TablePredictor:
    """Predictions from plain functions, per app: query[app](size, quota),
    pcie[app](size, quota), task/bw/ipc[app](features, quota).  Missing
    pcie is 0; a missing entry otherwise raises KeyError, as an unknown
    service does for a trained model."""

    def __init__(self, query: Mapping[str, Fn] | None = None, pcie: Mapping[str, Fn] | None = None,
                 task: Mapping[str, Fn] | None = None, bw: Mapping[str, Fn] | None = None,
                 ipc: Mapping[str, Fn] | None = None):
        self.query, self.pcie = dict(query or {}), dict(pcie or {})
        self.task, self.bw, self.ipc = dict(task or {}), dict(bw or {}), dict(ipc or {})

    @staticmethod
    def _eval(f: Fn, x: Any, quotas: np.ndarray) -> np.ndarray:
        return np.array([f(x, float(q)) for q in quotas], dtype=np.float64)

    def query_ms(self, app: str, input_size: float, quotas: np.ndarray) -> np.ndarray:
        return self._eval(self.query[app], input_size, quotas)

    def pcie_ms(self, app: str, input_size: float, quotas: np.ndarray) -> np.ndarray:
        f = self.pcie.get(app)
        return np.zeros(len(quotas)) if f is None else self._eval(f, input_size, quotas)

    def task_ms(self, app: str, task: Row, quotas: np.ndarray) -> np.ndarray:
        return self._eval(self.task[app], task, quotas)

    def task_bw(self, app: str, task: Row, quotas: np.ndarray) -> np.ndarray:
        return self._eval(self.bw[app], task, quotas)

    def task_ipc(self, app: str, task: Row, quotas: np.ndarray) -> np.ndarray:
        return self._eval(self.ipc[app], task, quotas)


class ModelPredictor:
    """Saved predictors models (predictors.train), evaluated compiled, one
    batched call per question.  query.duration_us is end to end, so the
    device time is duration - pcie.  The task model's IPC is per active SM;
    the knapsack needs what a quota delivers, so task_ipc scales it by the
    SMs the quota gives on a device of n_sms: whole TPCs, as MPS gives them
    on an H100 and an H200 (shim.devmodel.quota_sms, the rule simgpu uses)."""

    def __init__(self, query_dur: Any, query_pcie: Any, task_dur: Any, task_bw: Any,
                 task_ipc: Any, n_sms: int = 132, batch: Callable[[float], int] = lambda s: 1):
        self.qd, self.qp = query_dur, query_pcie
        self.td, self.tb, self.ti = task_dur, task_bw, task_ipc
        self.n_sms, self.batch = n_sms, batch

    @staticmethod
    def from_dir(d: Path | str, model: str = "dt", n_sms: int = 132) -> "ModelPredictor":
        from predictors.train import load, model_path
        m = {(k, t): load(model_path(d, k, t, model)) for k, t in
             (("query", "duration_us"), ("query", "pcie_us"), ("task", "duration_us"),
              ("task", "bandwidth_gbs"), ("task", "ipc"))}
        return ModelPredictor(m["query", "duration_us"], m["query", "pcie_us"],
                              m["task", "duration_us"], m["task", "bandwidth_gbs"],
                              m["task", "ipc"], n_sms)

    def _qrow(self, app: str, size: float) -> dict[str, Any]:
        return {"service": app, "input_bytes": float(size), "batch": self.batch(size), "quota": 100}

    def query_ms(self, app: str, input_size: float, quotas: np.ndarray) -> np.ndarray:
        row = self._qrow(app, input_size)
        dur = self.qd.predict_quotas(row, quotas)
        pcie = self.qp.predict_quotas(row, quotas)
        return np.maximum(dur - pcie, 0.0) / 1000.0

    def pcie_ms(self, app: str, input_size: float, quotas: np.ndarray) -> np.ndarray:
        return self.qp.predict_quotas(self._qrow(app, input_size), quotas) / 1000.0

    def task_ms(self, app: str, task: Row, quotas: np.ndarray) -> np.ndarray:
        return self.td.predict_quotas(task, quotas) / 1000.0

    def task_bw(self, app: str, task: Row, quotas: np.ndarray) -> np.ndarray:
        return self.tb.predict_quotas(task, quotas)

    def task_ipc(self, app: str, task: Row, quotas: np.ndarray) -> np.ndarray:
        sms = np.array([_quota_sms(float(q), self.n_sms) for q in np.atleast_1d(np.asarray(quotas, np.float64))])
        return self.ti.predict_quotas(task, quotas) * sms


@lru_cache(maxsize=4096)
def _quota_sms(pct: float, n_sms: int) -> float:
    """SMs a quota gives (shim.devmodel.quota_sms), the quota clamped to
    (0, 100] (nothing still gets one TPC); NaN stays NaN."""
    from shim.devmodel import quota_sms
    if math.isnan(pct):
        return math.nan
    return float(quota_sms(min(max(pct, 1e-9), 100.0), n_sms))
