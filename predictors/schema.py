"""What the predictors learn from: three sample kinds, their features and targets.

task   one kernel launch or one library call (C-Laius, Table 1): what it is,
       its input size, launch geometry, shared memory and SM quota; a library
       task (cudnnConvolutionForward, cublasSgemm, ...) adds the parameters its
       hook recorded, in the hook's order, in the slots p0..p23.
query  one request of a QoS service: its input size and batch at an SM quota
       -> end-to-end duration and time spent copying over PCIe.
group  an Abacus operator group: which services run together (the bitmap,
       one bit per service slot) and, for each, the operators [start, end) it
       issues, its batch size and sequence length -> the group's latency.
       Not in Abacus: each member's solo time, the device time of its range
       alone (schema 3; see GROUP).

A schema is versioned: a model trained on version v refuses rows of another
version, and a store refuses to mix versions.  Categorical features (a task's
or a service's name) are stored as strings and encoded as integer codes by a
vocabulary saved with each model.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

SCHEMA_VERSION = 3      # 2: task feature `occurrence`; 3: 24 parameter slots,
                        # group feature solo_S
# Library-task parameter slots p0..p23: as many as a hook can record
# (SHIM_TASK_MAX_PARAMS in shim/shim_task.h; cudnnConvolutionForward records
# 20, cublasGemmEx 16), so no recorded parameter is dropped.
NPARAMS = 24
GROUP_SLOTS = 8         # services one group sample can describe


@dataclass(frozen=True)
class Feature:
    name: str
    doc: str
    categorical: bool = False   # a name, encoded by the model's vocabulary
    # how the scaled models (MLP, KNN, LR) see it: "log" for sizes and counts
    # whose effect is multiplicative, "linear" for bits and positions
    scale: str = "log"


@dataclass(frozen=True)
class Target:
    name: str
    unit: str
    doc: str


@dataclass(frozen=True)
class Kind:
    name: str
    version: int
    doc: str
    features: tuple[Feature, ...]
    targets: tuple[Target, ...]

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.features]

    @property
    def target_names(self) -> list[str]:
        return [t.name for t in self.targets]

    @property
    def categorical(self) -> list[int]:
        """Column indices of the categorical features."""
        return [i for i, f in enumerate(self.features) if f.categorical]

    def column(self, name: str) -> int:
        for i, f in enumerate(self.features):
            if f.name == name:
                return i
        raise KeyError(f"{self.name} has no feature {name!r}")

    def target(self, name: str) -> Target:
        for t in self.targets:
            if t.name == name:
                return t
        raise KeyError(f"{self.name} has no target {name!r} (has {', '.join(self.target_names)})")

    @property
    def linear(self) -> list[int]:
        """Column indices of the numeric features scaled linearly."""
        return [i for i, f in enumerate(self.features) if not f.categorical and f.scale == "linear"]

    @property
    def quota_column(self) -> int | None:
        """Where the SM quota (percent) sits, or None for kinds without one."""
        return self.feature_names.index("quota") if "quota" in self.feature_names else None

    def fingerprint(self) -> str:
        """Changes whenever a feature or target is added, renamed or reordered."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version, "doc": self.doc,
                "features": [{"name": f.name, "doc": f.doc, "categorical": f.categorical,
                              "scale": f.scale} for f in self.features],
                "targets": [{"name": t.name, "unit": t.unit, "doc": t.doc} for t in self.targets]}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Kind":
        return Kind(name=d["name"], version=int(d["version"]), doc=d["doc"],
                    features=tuple(Feature(f["name"], f["doc"], bool(f["categorical"]),
                                           f.get("scale", "log")) for f in d["features"]),
                    targets=tuple(Target(t["name"], t["unit"], t["doc"]) for t in d["targets"]))


def _f(name: str, doc: str, categorical: bool = False, scale: str = "log") -> Feature:
    return Feature(name, doc, categorical, scale)


TASK = Kind(
    name="task", version=SCHEMA_VERSION,
    doc="One kernel launch or library call at an SM quota (C-Laius Table 1).",
    features=(
        _f("task", "kernel (mangled name) or library entry point, e.g. cudnnConvolutionForward", True),
        _f("input_bytes", "bytes of input the task reads (its input data size)"),
        _f("grid_x", "grid dimension x (0 for a library task)"),
        _f("grid_y", "grid dimension y"),
        _f("grid_z", "grid dimension z"),
        _f("block_x", "block dimension x (0 for a library task)"),
        _f("block_y", "block dimension y"),
        _f("block_z", "block dimension z"),
        _f("shmem", "dynamic shared memory per block, bytes"),
        _f("quota", "SM quota, percent of the device's SMs (1..100)"),
        # not in C-Laius Table 1: repeated launches of one kernel with one
        # shape can do different work (a BFS level, a solver step); which one
        # it is tells them apart, and the runtime knows it too
        _f("occurrence", "tasks of the same name before it in its query (or run, for batch "
                         "apps): a BFS level, a network's n-th convolution", scale="linear"),
        *(_f(f"p{i}", f"library parameter {i} in the hook's order (0 for kernels)")
          for i in range(NPARAMS)),
    ),
    targets=(
        Target("duration_us", "us", "task duration on the device"),
        Target("bandwidth_gbs", "GB/s", "global-memory bandwidth the task used"),
        Target("ipc", "inst/cycle", "instructions per cycle per active SM"),
    ),
)

QUERY = Kind(
    name="query", version=SCHEMA_VERSION,
    doc="One request of a QoS service at an SM quota, input to result on the host.",
    features=(
        _f("service", "the service's name", True),
        _f("input_bytes", "bytes of the query's input"),
        _f("batch", "items in the query (1 when the service does not batch)"),
        _f("quota", "SM quota, percent of the device's SMs (1..100)"),
    ),
    targets=(
        Target("duration_us", "us", "end-to-end query duration"),
        Target("pcie_us", "us", "time spent in host<->device copies"),
    ),
)

GROUP = Kind(
    name="group", version=SCHEMA_VERSION,
    doc="An Abacus operator group: services issued together, each a range of its operators.",
    features=tuple(
        [_f(f"in_{s}", f"bit {s} of the service bitmap: slot {s}'s service is in the group",
            scale="linear") for s in range(GROUP_SLOTS)]
        + [f for s in range(GROUP_SLOTS) for f in (
            _f(f"start_{s}", f"slot {s}: first operator of the group (index into its model)",
               scale="linear"),
            _f(f"end_{s}", f"slot {s}: one past the last operator", scale="linear"),
            # end - start, given on its own: latency grows with the operators issued
            _f(f"ops_{s}", f"slot {s}: operators issued (end - start)"),
            _f(f"batch_{s}", f"slot {s}: batch size"),
            _f(f"seq_{s}", f"slot {s}: sequence length (0 when the model has none)"),
            # not an Abacus feature: our operators differ in cost by 20x (a
            # 3 us bias next to a 50 us convolution), so latency is a step
            # function of start and end that an MLP learns from positions
            # only with far more samples than we can take; the solo time
            # carries the step, the MLP learns the overlap and contention.
            # A runtime has it from the service's per-operator solo table
            # (what the sampler measures) or from the task predictors.
            _f(f"solo_{s}", f"slot {s}: device time of its range alone at the same quota, us "
                            f"(sum of the service's per-operator solo times)"))]),
    targets=(Target("latency_us", "us", "time from the group's issue to its last operator's end"),),
)

KINDS: dict[str, Kind] = {k.name: k for k in (TASK, QUERY, GROUP)}


def kind(name: str) -> Kind:
    try:
        return KINDS[name]
    except KeyError:
        raise KeyError(f"unknown sample kind {name!r} (one of {', '.join(KINDS)})") from None


def task_row(task: str, input_bytes: float, grid: Sequence[int] = (0, 0, 0),
             block: Sequence[int] = (0, 0, 0), shmem: float = 0, quota: float = 100,
             params: Sequence[tuple[str, float]] = (), occurrence: int = 0) -> dict[str, Any]:
    """A task's feature dict; a library task's params fill p0.. in order."""
    if len(params) > NPARAMS:
        raise ValueError(f"a task has at most {NPARAMS} parameters, got {len(params)}")
    row: dict[str, Any] = {"task": task, "input_bytes": float(input_bytes),
                           "grid_x": grid[0], "grid_y": grid[1], "grid_z": grid[2],
                           "block_x": block[0], "block_y": block[1], "block_z": block[2],
                           "shmem": shmem, "quota": quota, "occurrence": occurrence}
    for i in range(NPARAMS):
        row[f"p{i}"] = float(params[i][1]) if i < len(params) else 0.0
    return row


def group_row(members: Mapping[int, Sequence[float]]) -> dict[str, Any]:
    """A group's feature dict from {slot: (start, end, batch, seq[, solo_us])};
    absent slots are all zero and their bitmap bit is clear."""
    row: dict[str, Any] = {}
    for s in range(GROUP_SLOTS):
        solo = 0.0
        if s in members:
            m = members[s]
            if len(m) not in (4, 5):
                raise ValueError(f"slot {s}: (start, end, batch, seq[, solo_us]), got {m!r}")
            start, end, batch, seq = (int(x) for x in m[:4])
            solo = float(m[4]) if len(m) == 5 else 0.0
            if not 0 <= start < end:
                raise ValueError(f"slot {s}: operator range [{start}, {end}) is empty")
        else:
            start = end = batch = seq = 0
        row.update({f"in_{s}": int(s in members), f"start_{s}": start, f"end_{s}": end,
                    f"ops_{s}": end - start, f"batch_{s}": batch, f"seq_{s}": seq,
                    f"solo_{s}": solo})
    return row


class Vocab:
    """Codes of the categorical features' values: sorted, so training the same
    data twice gives the same codes."""

    def __init__(self, values: Mapping[str, Sequence[str]]):
        self.values = {col: list(v) for col, v in values.items()}
        self._code = {col: {name: i for i, name in enumerate(v)} for col, v in self.values.items()}

    @staticmethod
    def fit(k: Kind, rows: Iterable[Mapping[str, Any]]) -> "Vocab":
        cols = [f.name for f in k.features if f.categorical]
        seen: dict[str, set[str]] = {c: set() for c in cols}
        for r in rows:
            for c in cols:
                seen[c].add(str(r[c]))
        return Vocab({c: sorted(v) for c, v in seen.items()})

    def code(self, col: str, name: str) -> int:
        try:
            return self._code[col][name]
        except KeyError:
            raise KeyError(f"{col} {name!r} was not in the training data") from None

    def size(self, col: str) -> int:
        return len(self.values[col])

    def to_dict(self) -> dict[str, list[str]]:
        return {c: list(v) for c, v in self.values.items()}


def encode(k: Kind, rows: Sequence[Mapping[str, Any]], vocab: Vocab) -> np.ndarray:
    """Feature dicts -> a float64 matrix in schema order (names -> codes)."""
    X = np.empty((len(rows), len(k.features)), dtype=np.float64)
    for i, r in enumerate(rows):
        for j, f in enumerate(k.features):
            if f.name not in r:
                raise KeyError(f"{k.name} row lacks feature {f.name!r}")
            X[i, j] = vocab.code(f.name, str(r[f.name])) if f.categorical else float(r[f.name])
    return X


def check_rows(k: Kind, rows: Iterable[Mapping[str, Any]]) -> None:
    """Raise if a feature dict lacks a feature or has one the schema does not know."""
    names = set(k.feature_names)
    for r in rows:
        missing, extra = names - set(r), set(r) - names
        if missing or extra:
            raise ValueError(f"{k.name} row: missing {sorted(missing)}, unknown {sorted(extra)}")


def describe(k: Kind) -> list[tuple[str, str, str]]:
    """(name, type, doc) lines, features then targets: what `schema` prints."""
    lines = [(f.name, "feature, categorical" if f.categorical else f"feature, {f.scale}", f.doc)
             for f in k.features]
    lines += [(t.name, f"target [{t.unit}]", t.doc) for t in k.targets]
    return lines
