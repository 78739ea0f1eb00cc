"""Calibration of simgpu's device model against a real GPU.

Three commands:

    python3 bench/calibrate.py run [--out FILE] [--quotas 10,20,...,100] [--quick] [...]
    python3 bench/calibrate.py fit FILE [--params k1,k2,...] [--json OUT]
    python3 bench/calibrate.py sim --out FILE [the plan options of run]

`run` measures on a GPU (H100/H200, CUDA 13 driver with MPS; bench/gpu_session.sh
step `calib` runs it, then `fit`); `fit` fits the model's parameters
(shim/simgpu/simgpu_model.h) to what was measured, and prints the model's error
per case before and after; `sim` makes data in the same format on simgpu, the
CPU model itself (bench/calib/sample.jsonl came from it; the tests fit it).
The default plan (all ten quotas) starts about 150 groups of probes, a few
minutes on a GPU (not yet timed on one); --quick runs quotas 30,70,100.

`sim` runs the same plan (quotas 30,70,100 unless --quotas) through
gpu-calib_probe --allow-sim on simgpu (needs `make build`): a private device
($SIMGPU_DIR in a temporary dir) at --timescale 1, cost twins of the probe's
kernels built here with cc (SIMGPU_TIMING_ONLY=1), SIMGPU_MPS=1 where `run`
uses MPS and 0 where not, the slice by the events method (simgpu has no
%globaltimer), the copies on a device of their own at timescale 50 (simgpu
copies for real, on the CPU).  SIMGPU_* settings in the environment reach the
probes' device, and the parameters it ran with go to the first line.  To
renew the sample: python3 bench/calibrate.py sim --out bench/calib/sample.jsonl

What `run` measures, each figure by bench/bin/gpu-calib_probe (its header is
the probe's design), each process its own MPS client at its own
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, in this order (the cheap, decisive cases
first, so that a run cut short by --budget-s still fits something):

 1. slice   without MPS (an empty CUDA_MPS_PIPE_DIRECTORY): two slice probes
            at once; the median run between gaps in one process is the time
            slice, the gap is the other's slice plus two switches:
            switch = (gap_A - run_B) / 2.
 2.         the MPS control daemon is started (processpool/mps.py, in a
            private runtime dir, as bench/gpu_pool.py does).
 3. shapes  each kernel kind alone at 100 % calibrates its work to
            --target-ms per launch; its grid and work are then fixed.
 4. pcie    1, 2 and 4 processes copying pinned memory at once, each
            direction (--copies): GB/s of each copy.
 5. solo    each victim kind (compute, memory) alone at each --quotas value.
 6. pair    each victim at quota q with a co-runner process of each kind
            (compute, memory, fewblock) at 100 - q (no oversubscription) and
            at 100 (oversubscribed): the victim's median launch time with
            the co-runner, over its time alone at q.  The co-runner starts
            first and launches back to back until the victim is done (then
            SIGTERM); the case is kept only if its timed section covered the
            victim's (t_start / t_end of both probes).
 7.         the daemon is stopped (also on errors and Ctrl-C).

Every case is one JSON line in --out, written as soon as it is measured:

    {"case": "pair/compute+memory/q30/co70", "kind": "pair",
     "tasks": [{"role": "victim", "label": "compute", "kind": "kernel",
                "blocks": 2112, "threads": 256, "regs": 32, "smem": 0,
                "flops": ..., "bytes": ..., "quota_pct": 30, "ctx": 0}, {...}],
     "measured": {"victim_alone_us": ..., "victim_with_us": ...},
     "sms": 132, "mps": true, "device": "...", "driver": "...", "source": "..."}

kind "solo" has measured {"alone_us"}, "slice" {"slice_us", "switch_us"},
"pcie" {"gbs_per_copy"} (tasks: one copy per process, "kind": "h2d"/"d2h",
"bytes").  A line with "error" (a case that could not be measured) and the
first line, {"meta": {...}} (the plan, the device, and for `sim` the model
parameters it ran with), are not fitted.

How `fit` predicts each case with the model (simgpu_model_simulate through
ctypes, from shim/lib/simgpu/libcudart.so.13; each case under its own MPS
mode and the SM count its probes saw; a task's quota_sms is
quota_pct / 100 * sms in whole TPCs, as the GPUs gave it):

  solo   the victim alone: end - arrive of one launch (compared in absolute
         time: sm_flops, sm_bw and bw are absolute rates).
  pair   the slowdown, time with / time alone (the probes' mean launch
         times; their medians in data without means).  Time with: both
         processes' launches as two chains, each launch arriving when its
         predecessor in the same process ends (a stream serialises them),
         the co-runner's first launch ahead of the victim's; the mean of
         the victim's launches after its first (which starts in step with
         the co-runner, unlike the measured ones), VICTIM_LAUNCHES in all;
         the co-runner's chain goes on until the victim's last launch ends.
  slice  slice_s and switch_s themselves (the two processes' alternation
         is what the probe measures, and what the model is told to do).
  pcie   N copies of the measured size arriving together in N contexts:
         the mean GB/s of one.

The residual of a case is log(model / measured); parameters are fitted on
log scale (rates, times) or linearly (sat_warps, l1_gamma, bw_sharp, bw_beta, bw_share)
within bounds, by scipy.optimize.least_squares (soft-L1 loss: one bad case
does not drag the rest), or by a coordinate search without scipy.
Parameters that touch disjoint cases (the kernel parameters, slice_s and
switch_s, the PCIe rates) are fitted separately.  The table gives, per
case, measured, the model with its default parameters (the compiled-in
preset, $SIMGPU_PRESET, the SIMGPU_* environment: simgpu_model_params_get
in this process; $CALIBRATE_SIMGPU_LIB or --lib names another build of
simgpu) and with the fitted ones, and the relative errors
|model / measured - 1|; then the median error before and after, and the
fitted values as SIMGPU_*=value lines for a preset file.

Exit codes: run: 0 every case measured, 1 some failed (the file says which),
2 no NVIDIA driver (nothing measured); fit: 0, 1 nothing usable in FILE, 2 the
model library lacks simgpu_model_simulate (rebuild: python -m shim.build);
sim: 0, 1 some case failed.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
BENCH = REPO / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import gpu_pool  # noqa: E402  (probe output, environments, driver, MPS: shared with the pool checks)

PROBE = BENCH / "bin" / "gpu-calib_probe"
# simgpu's runtime: the model `fit` loads and the device `sim` measures
# ($CALIBRATE_SIMGPU_LIB: another build of it)
SIMGPU_LIB = Path(os.environ.get("CALIBRATE_SIMGPU_LIB") or REPO / "shim" / "lib" / "simgpu" / "libcudart.so.13")
SIMGPU_INC = REPO / "shim" / "simgpu"
PCT_ENV = gpu_pool.PCT_ENV
NO_DRIVER = gpu_pool.NO_DRIVER

KERNEL_KINDS = ("compute", "memory", "fewblock")
DEFAULT_QUOTAS = "10,20,30,40,50,60,70,80,90,100"
QUICK_QUOTAS = "30,70,100"
DEFAULT_FIT = "sm_flops,sm_bw,sat_warps,l1_gamma,bw_sharp,bw_beta,bw_share,slice_s,switch_s,pcie_h2d,pcie_d2h"
VICTIM_LAUNCHES = 7          # launches of the victim's chain in a predicted pair (the
                             # mean of all but the first is its time with the co-runner)
MAX_CHAIN = 400              # co-runner launches in one predicted pair, at most
CORUNNER_MAX_S = 120.0       # a co-runner's --duration: SIGTERM ends it sooner
SWITCH_FLOOR_US = 0.1        # a measured switch this short or shorter is noise


# ---------------------------------------------------------------- the model, through ctypes

class ModelParams(ctypes.Structure):
    """struct simgpu_model_params (simgpu_model.h), field for field."""
    _fields_ = [("abi", ctypes.c_uint32), ("mech", ctypes.c_uint32), ("mps", ctypes.c_uint32),
                ("pad", ctypes.c_uint32)] + [(n, ctypes.c_double) for n in (
                    "sms", "bw", "sm_flops", "sm_bw", "sm_threads", "sm_blocks", "sm_regs",
                    "sm_smem", "block_smem", "regs_default", "sat_warps", "l1_gamma", "bw_sharp",
                    "bw_beta", "bw_share", "slice_s", "switch_s", "pcie_h2d", "pcie_d2h")]


class ModelTask(ctypes.Structure):
    """struct simgpu_model_task (simgpu_model.h), field for field."""
    _fields_ = [(n, ctypes.c_double) for n in (
        "arrive", "blocks", "threads", "regs", "smem", "flops", "bytes", "quota_sms")] + [
        ("ctx", ctypes.c_int32), ("kind", ctypes.c_int32),
        ("start", ctypes.c_double), ("end", ctypes.c_double)]


MODEL_ABI = 2
TASK_KINDS = {"kernel": 0, "h2d": 1, "d2h": 2}
PARAM_FIELDS = [n for n, _ in ModelParams._fields_[4:]]


@dataclass(frozen=True)
class Spec:
    """How a parameter is named in a preset, its unit there, and how it is fitted."""
    env: str
    unit: float                  # preset value = field value / unit
    lo: float
    hi: float
    log: bool                    # fitted on log scale (rates, times) or linearly
    affects: tuple[str, ...]     # case kinds (case_key) whose prediction depends on it


KERNEL_CASES = ("solo", "pair")
SPECS: dict[str, Spec] = {
    "sm_flops": Spec("SIMGPU_SM_GFLOPS", 1e9, 1e9, 1e13, True, KERNEL_CASES),
    "sm_bw": Spec("SIMGPU_SM_BW_GBS", 1e9, 1e8, 1e12, True, KERNEL_CASES),
    "bw": Spec("SIMGPU_BW_GBS", 1e9, 1e10, 1e13, True, KERNEL_CASES),
    "sat_warps": Spec("SIMGPU_SAT_WARPS", 1, 0, 64, False, KERNEL_CASES),
    "l1_gamma": Spec("SIMGPU_L1_GAMMA", 1, 0, 4, False, KERNEL_CASES),
    "bw_sharp": Spec("SIMGPU_BW_SHARPNESS", 1, 0.5, 20, False, KERNEL_CASES),
    "bw_beta": Spec("SIMGPU_BW_BETA", 1, 0, 20, False, KERNEL_CASES),
    "bw_share": Spec("SIMGPU_BW_SHARE", 1, 0.05, 4, False, KERNEL_CASES),
    "slice_s": Spec("SIMGPU_TIMESLICE_US", 1e-6, 1e-5, 1.0, True, ("slice",)),
    "switch_s": Spec("SIMGPU_CTX_SWITCH_US", 1e-6, 1e-7, 0.1, True, ("slice",)),
    "pcie_h2d": Spec("SIMGPU_PCIE_H2D_GBS", 1e9, 1e8, 1e12, True, ("pcie:h2d",)),
    "pcie_d2h": Spec("SIMGPU_PCIE_D2H_GBS", 1e9, 1e8, 1e12, True, ("pcie:d2h",)),
}
# the rest, named for the preset lines of a parameter dump (not fitted)
ENV_NAMES = {"sms": ("SIMGPU_SMS", 1), "sm_threads": ("SIMGPU_SM_THREADS", 1),
             "sm_blocks": ("SIMGPU_SM_BLOCKS", 1), "sm_regs": ("SIMGPU_SM_REGS", 1),
             "sm_smem": ("SIMGPU_SM_SMEM_KIB", 1024), "block_smem": ("SIMGPU_BLOCK_SMEM_RESERVED", 1),
             "regs_default": ("SIMGPU_REGS_DEFAULT", 1),
             **{k: (s.env, s.unit) for k, s in SPECS.items()}}


class ModelError(RuntimeError):
    pass


class Model:
    """simgpu's offline entry points (simgpu_model_params_get / _simulate).

    The library is simgpu's libcudart.so.13, loaded RTLD_LOCAL so that none
    of its CUDA symbols can stand in for another library's; these two calls
    need no device (no context, no shared state)."""

    def __init__(self, path: Path | str = SIMGPU_LIB):
        self.path = Path(path)
        if not self.path.exists():
            raise ModelError(f"{self.path} not found: build simgpu first (`make build`, or "
                             f"`python -m shim.build`)")
        try:
            self.lib = ctypes.CDLL(str(self.path), mode=os.RTLD_LOCAL)
        except OSError as e:
            raise ModelError(f"cannot load {self.path}: {e}") from None
        try:
            self._get = self.lib.simgpu_model_params_get
            self._sim = self.lib.simgpu_model_simulate
        except AttributeError:
            raise ModelError(f"{self.path} has no simgpu_model_simulate / simgpu_model_params_get: "
                             f"an older simgpu; rebuild it (python -m shim.build)") from None
        self._get.argtypes = [ctypes.POINTER(ModelParams)]
        self._get.restype = ctypes.c_int
        self._sim.argtypes = [ctypes.POINTER(ModelParams), ctypes.c_int, ctypes.POINTER(ModelTask)]
        self._sim.restype = ctypes.c_int
        self.calls = 0

    def defaults(self) -> ModelParams:
        p = ModelParams()
        if self._get(ctypes.byref(p)) != 0:
            raise ModelError("simgpu_model_params_get failed")
        if p.abi != MODEL_ABI:
            raise ModelError(f"model ABI {p.abi}, this script knows {MODEL_ABI}: update ModelParams")
        return p

    def simulate(self, p: ModelParams, tasks: list[ModelTask]) -> list[ModelTask]:
        arr = (ModelTask * len(tasks))(*tasks)
        self.calls += 1
        if self._sim(ctypes.byref(p), len(tasks), arr) != 0:
            raise ModelError("simgpu_model_simulate refused the tasks (a bad parameter or task)")
        return list(arr)


def params_copy(p: ModelParams, **change: float) -> ModelParams:
    q = ModelParams()
    ctypes.pointer(q)[0] = p
    for k, v in change.items():
        setattr(q, k, v)
    return q


def params_dict(p: ModelParams) -> dict[str, float]:
    return {n: getattr(p, n) for n, _ in ModelParams._fields_ if n != "pad"}


def preset_lines(p: ModelParams, names: Iterable[str]) -> list[str]:
    """SIMGPU_*=value lines (preset units) for the named fields."""
    out = []
    for n in names:
        env, unit = ENV_NAMES[n]
        out.append(f"{env}={getattr(p, n) / unit:.6g}")
    return out


# ---------------------------------------------------------------- predicting a case

def quota_sms(pct: float, sms: float) -> float:
    """The SMs an MPS percentage allows, as the live device counts them
    (whole TPCs: shim/devmodel.py quota_sms)."""
    from shim.devmodel import quota_sms as whole_tpcs
    return float(whole_tpcs(pct, int(sms)))


def make_task(t: dict[str, Any], p: ModelParams, arrive: float = 0.0, ctx: int | None = None) -> ModelTask:
    kind = t.get("kind", "kernel")
    kind = TASK_KINDS[kind] if isinstance(kind, str) else int(kind)
    m = ModelTask()
    m.arrive = arrive
    m.kind = kind
    m.ctx = int(t.get("ctx", 0) if ctx is None else ctx)
    m.bytes = float(t.get("bytes") or 0)
    if kind == 0:
        m.blocks = float(t["blocks"])
        m.threads = float(t["threads"])
        m.regs = float(t.get("regs") or 0)
        m.smem = float(t.get("smem") or 0)
        m.flops = float(t.get("flops") or 0)
        m.quota_sms = quota_sms(float(t.get("quota_pct", 100)), p.sms)
    else:
        m.blocks = m.threads = 1.0
        m.quota_sms = p.sms
    return m


class Predictor:
    """The model's value for each measured quantity of a case, at given params.

    Solo times are memoised per parameter set (pairs share their victim's)."""

    def __init__(self, model: Model):
        self.model = model
        self._solo: dict[tuple, float] = {}
        self._key: tuple | None = None

    def _fresh(self, p: ModelParams) -> None:
        key = tuple(params_dict(p).values())
        if key != self._key:
            self._key, self._solo = key, {}

    def solo(self, p: ModelParams, t: dict[str, Any]) -> float:
        """Seconds of one launch alone on the device."""
        self._fresh(p)
        key = tuple(sorted((k, v) for k, v in t.items() if isinstance(v, (int, float, str))))
        if key not in self._solo:
            r = self.model.simulate(p, [make_task(t, p, 0.0, 0)])[0]
            self._solo[key] = r.end - r.arrive
        return self._solo[key]

    def with_corunner(self, p: ModelParams, victim: dict[str, Any], co: dict[str, Any]) -> float:
        """Mean seconds of the victim's launches after its first, each arriving
        when its predecessor ends, while the co-runner's launches do the same."""
        # owner 0: the co-runner (first in arrival order at 0: it started
        # first), 1: the victim.  Each step adds the next launch of the chain
        # whose last launch ends first, at that end: what ends before it is
        # final, as the model is causal.
        tasks = [make_task(co, p, 0.0, 1), make_task(victim, p, 0.0, 0)]
        owner = [0, 1]
        n_victim = 1
        for _ in range(MAX_CHAIN + VICTIM_LAUNCHES):
            res = self.model.simulate(p, tasks)
            last = {}
            for i, r in enumerate(res):
                last[owner[i]] = r            # in order: the last one of each chain
            v_end, c_end = last[1].end, last[0].end
            if not (math.isfinite(v_end) and math.isfinite(c_end)):
                raise ModelError("a task never finished in the model")
            if n_victim < VICTIM_LAUNCHES and v_end <= c_end:
                nxt, who = make_task(victim, p, v_end, 0), 1
                n_victim += 1
            elif c_end < v_end or n_victim < VICTIM_LAUNCHES:
                nxt, who = make_task(co, p, c_end, 1), 0
            else:
                vs = [r for i, r in enumerate(res) if owner[i] == 1][1:]
                return sum(r.end - r.arrive for r in vs) / len(vs)
            tasks = [*res, nxt]
            for r in tasks:
                r.start = r.end = 0.0
            owner.append(who)
        raise ModelError(f"the co-runner's chain passed {MAX_CHAIN} launches before the victim's end")

    def pcie(self, p: ModelParams, copies: list[dict[str, Any]]) -> float:
        """Mean GB/s of one of N copies started together."""
        res = self.model.simulate(p, [make_task(c, p, 0.0, i) for i, c in enumerate(copies)])
        rates = [float(c["bytes"]) / (r.end - r.start) / 1e9 for c, r in zip(copies, res)]
        return sum(rates) / len(rates)

    def predict(self, p: ModelParams, case: dict[str, Any]) -> dict[str, float]:
        """{quantity: model value} for the quantities measured(case) has."""
        kind, tasks = case["kind"], case["tasks"]
        p = case_params(p, case)
        if kind == "solo":
            return {"alone_us": self.solo(p, tasks[0]) * 1e6}
        if kind == "pair":
            v, co = tasks[0], tasks[1]
            return {"slowdown": self.with_corunner(p, v, co) / self.solo(p, v)}
        if kind == "slice":
            return {"slice_us": p.slice_s * 1e6, "switch_us": p.switch_s * 1e6}
        if kind == "pcie":
            return {"gbs_per_copy": self.pcie(p, tasks)}
        raise ValueError(f"unknown case kind {kind!r}")


def case_params(p: ModelParams, case: dict[str, Any]) -> ModelParams:
    """The parameters a case runs under: its MPS mode and SM count."""
    mps = 1 if case.get("mps", case["kind"] != "slice") else 0
    sms = case.get("sms") or p.sms
    if p.mps == mps and p.sms == sms:
        return p
    return params_copy(p, mps=mps, sms=float(sms))


def case_key(case: dict[str, Any]) -> str:
    """The case's kind, and for copies their direction: what a parameter affects."""
    if case.get("kind") == "pcie":
        return f"pcie:{case['tasks'][0].get('kind', 'h2d')}"
    return str(case.get("kind"))


def measured(case: dict[str, Any]) -> dict[str, float]:
    """{quantity: measured value} of a case (the figures the model predicts)."""
    m = case.get("measured") or {}
    kind = case.get("kind")
    if kind == "solo":
        out = {"alone_us": m.get("alone_us")}
    elif kind == "pair":
        # the means where the probe gave them: next to a co-runner a victim's
        # launch times can be bimodal (in step with the co-runner's launches
        # or not), and a median then picks one of the modes
        a, w = m.get("victim_alone_mean_us"), m.get("victim_with_mean_us")
        if not (a and w):
            a, w = m.get("victim_alone_us"), m.get("victim_with_us")
        out = {"slowdown": w / a if a and w else None}
    elif kind == "slice":
        out = {"slice_us": m.get("slice_us"), "switch_us": m.get("switch_us")}
    elif kind == "pcie":
        out = {"gbs_per_copy": m.get("gbs_per_copy")}
    else:
        return {}
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float)) and v > 0}


# ---------------------------------------------------------------- loading cases

def bad_task(case: dict[str, Any]) -> str | None:
    """What a case's tasks lack for the model, or None."""
    if case["kind"] == "slice":
        return None                      # predicted from the parameters alone
    for t in case["tasks"]:
        if not isinstance(t, dict):
            return "a task is not an object"
        kind = t.get("kind", "kernel")
        if kind not in TASK_KINDS and kind not in TASK_KINDS.values():
            return f"task kind {kind!r} (kernel, h2d, d2h)"
        need = ("blocks", "threads") if kind in ("kernel", 0) else ("bytes",)
        for k in need:
            if not isinstance(t.get(k), (int, float)) or t[k] <= 0:
                return f"a {kind} task without {k}"
    return None


def load_cases(path: Path) -> tuple[list[dict[str, Any]], list[str], dict[str, Any]]:
    """(usable cases, notes on the lines left out, the meta object or {})."""
    cases, notes, meta = [], [], {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            notes.append(f"{path.name}:{n}: not JSON ({e})")
            continue
        if not isinstance(obj, dict):
            notes.append(f"{path.name}:{n}: not a JSON object")
        elif "meta" in obj:
            meta = obj["meta"]
        elif obj.get("error"):
            notes.append(f"{obj.get('case', f'line {n}')}: not measured ({obj['error']})")
        elif obj.get("kind") not in ("solo", "pair", "slice", "pcie") or not obj.get("tasks"):
            notes.append(f"{obj.get('case', f'line {n}')}: unknown kind or no tasks")
        elif obj.get("kind") == "pair" and len(obj["tasks"]) < 2:
            notes.append(f"{obj['case']}: a pair needs a victim and a co-runner")
        elif bad_task(obj):
            notes.append(f"{obj.get('case', f'line {n}')}: {bad_task(obj)}")
        elif obj.get("measured", {}).get("overlap") is False:
            notes.append(f"{obj['case']}: the co-runner did not cover the victim's timed section")
        elif not measured(obj):
            notes.append(f"{obj.get('case', f'line {n}')}: no measured figure")
        else:
            cases.append(obj)
    return cases, notes, meta


# ---------------------------------------------------------------- fitting

def rel_err(model: float | None, meas: float) -> float | None:
    return None if model is None or not math.isfinite(model) else abs(model / meas - 1.0)


def median(xs: list[float]) -> float | None:
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = len(xs) // 2
    return xs[k] if len(xs) % 2 else (xs[k - 1] + xs[k]) / 2


@dataclass
class Fit:
    defaults: ModelParams
    fitted: ModelParams
    names: list[str]                       # parameters fitted
    unfitted: dict[str, str]               # asked for but not fitted: why
    rows: list[dict[str, Any]]
    groups: list[dict[str, Any]] = field(default_factory=list)

    @property
    def median_default(self) -> float | None:
        return median([r["err_default"] for r in self.rows])

    @property
    def median_fitted(self) -> float | None:
        return median([r["err_fitted"] for r in self.rows])


def parse_params(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in SPECS]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown parameter(s) {', '.join(bad) or '(none given)'}: choose from {', '.join(SPECS)}")
    return list(dict.fromkeys(names))


def to_x(name: str, v: float, base: float) -> float:
    s = SPECS[name]
    v = min(max(v, s.lo), s.hi)
    return math.log(v / base) if s.log else (v - s.lo) / (s.hi - s.lo)


def from_x(name: str, x: float, base: float) -> float:
    s = SPECS[name]
    v = base * math.exp(x) if s.log else s.lo + x * (s.hi - s.lo)
    return min(max(v, s.lo), s.hi)


def groups_of(names: list[str]) -> list[list[str]]:
    """Parameters split into groups whose case kinds do not overlap."""
    groups: list[tuple[set[str], list[str]]] = []
    for n in names:
        kinds = set(SPECS[n].affects)
        hit = [g for g in groups if g[0] & kinds]
        merged = (kinds.union(*(g[0] for g in hit)), [x for g in hit for x in g[1]] + [n])
        groups = [g for g in groups if g not in hit] + [merged]
    return [g[1] for g in groups]


class Objective:
    """Residuals log(model / measured) of the cases a group of parameters touches."""

    def __init__(self, pred: Predictor, base: ModelParams, names: list[str], cases: list[dict]):
        self.pred, self.base, self.names, self.cases = pred, base, names, cases
        self.base_vals = [getattr(base, n) if getattr(base, n) > 0 else SPECS[n].lo or 1.0
                          for n in names]
        self.nfev = 0

    def params(self, x: list[float]) -> ModelParams:
        return params_copy(self.base, **{n: from_x(n, xi, b)
                                         for n, xi, b in zip(self.names, x, self.base_vals)})

    def x0(self) -> list[float]:
        out = []
        for n, b in zip(self.names, self.base_vals):
            s = SPECS[n]
            x = to_x(n, getattr(self.base, n), b)
            lo, hi = to_x(n, s.lo, b), to_x(n, s.hi, b)
            eps = 1e-6 * (hi - lo)
            out.append(min(max(x, lo + eps), hi - eps))
        return out

    def bounds(self) -> tuple[list[float], list[float]]:
        return ([to_x(n, SPECS[n].lo, b) for n, b in zip(self.names, self.base_vals)],
                [to_x(n, SPECS[n].hi, b) for n, b in zip(self.names, self.base_vals)])

    def residuals(self, x: list[float]) -> list[float]:
        self.nfev += 1
        p = self.params(list(x))
        out = []
        for c in self.cases:
            meas = measured(c)
            try:
                got = self.pred.predict(p, c)
            except ModelError:
                got = {}
            for q, m in meas.items():
                v = got.get(q)
                out.append(math.log(v / m) if v and v > 0 and math.isfinite(v) else 5.0)
        return out


def soft_l1(res: list[float], f: float) -> float:
    return sum(2 * f * f * (math.sqrt(1 + (r / f) ** 2) - 1) for r in res)


def coordinate_search(obj: Objective, max_nfev: int, f_scale: float) -> list[float]:
    """Without scipy: per parameter, try a step up and down; halve the steps
    when nothing improves."""
    x = obj.x0()
    lo, hi = obj.bounds()
    best = soft_l1(obj.residuals(x), f_scale)
    step = [0.5 if SPECS[n].log else 0.25 for n in obj.names]
    while obj.nfev < max_nfev and max(step) > 1e-3:
        improved = False
        for i in range(len(x)):
            for d in (step[i], -step[i]):
                y = list(x)
                y[i] = min(max(y[i] + d, lo[i]), hi[i])
                if y[i] == x[i]:
                    continue
                v = soft_l1(obj.residuals(y), f_scale)
                if v < best:
                    x, best, improved = y, v, True
                    break
        if not improved:
            step = [s / 2 for s in step]
    return x


def fit_cases(model: Model, cases: list[dict[str, Any]], names: list[str],
              base: ModelParams | None = None, max_nfev: int = 200, f_scale: float = 0.1,
              use_scipy: bool = True, log: Callable[[str], None] = lambda s: None) -> Fit:
    """Fit `names` to the cases; rows carry every case's errors before and after."""
    pred = Predictor(model)
    base = base if base is not None else model.defaults()
    fitted = params_copy(base)
    unfitted: dict[str, str] = {}
    groups = []
    try:
        from scipy.optimize import least_squares
    except ImportError:
        least_squares = None
    for group in groups_of(names):
        kinds = set().union(*(SPECS[n].affects for n in group))
        sub = [c for c in cases if case_key(c) in kinds]
        if not sub:
            for n in group:
                unfitted[n] = f"no {'/'.join(sorted(kinds))} case in the data"
            continue
        obj = Objective(pred, fitted, group, sub)
        t0 = time.monotonic()
        if least_squares is not None and use_scipy:
            lo, hi = obj.bounds()
            r = least_squares(obj.residuals, obj.x0(), bounds=(lo, hi), loss="soft_l1",
                              f_scale=f_scale, diff_step=1e-3, max_nfev=max_nfev, x_scale=1.0)
            x, how = list(r.x), f"least_squares ({r.message.rstrip('.')})"
        else:
            x, how = coordinate_search(obj, max_nfev, f_scale), "coordinate search"
        p = obj.params(x)
        for n in group:
            setattr(fitted, n, getattr(p, n))
        groups.append({"params": group, "cases": len(sub), "nfev": obj.nfev, "method": how,
                       "seconds": round(time.monotonic() - t0, 2)})
        log(f"fitted {', '.join(group)} to {len(sub)} cases: {obj.nfev} evaluations, "
            f"{time.monotonic() - t0:.1f} s, {how}")
    rows = []
    for c in cases:
        meas = measured(c)
        d = safe_predict(pred, base, c)
        f = safe_predict(pred, fitted, c)
        for q, m in meas.items():
            rows.append({"case": c.get("case", "?"), "kind": c["kind"], "quantity": q, "measured": m,
                         "default": d.get(q), "fitted": f.get(q),
                         "err_default": rel_err(d.get(q), m), "err_fitted": rel_err(f.get(q), m),
                         "source": c.get("source")})
    return Fit(base, fitted, [n for n in names if n not in unfitted], unfitted, rows, groups)


def safe_predict(pred: Predictor, p: ModelParams, c: dict[str, Any]) -> dict[str, float]:
    try:
        return pred.predict(p, c)
    except ModelError:
        return {}


# ---------------------------------------------------------------- fit output

def _g(v: Any, fmt: str = "{:.4g}") -> str:
    return "-" if v is None else fmt.format(v)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f} %"


UNITS = {"alone_us": "µs", "slowdown": "x", "slice_us": "µs", "switch_us": "µs", "gbs_per_copy": "GB/s"}


def print_fit(fit: Fit, notes: list[str], meta: dict[str, Any]) -> None:
    head = ["case", "quantity", "measured", "model (default)", "err", "model (fitted)", "err"]
    rows = [[r["case"], f"{r['quantity']} ({UNITS.get(r['quantity'], '')})", _g(r["measured"]),
             _g(r["default"]), _pct(r["err_default"]), _g(r["fitted"]), _pct(r["err_fitted"])]
            for r in fit.rows]
    by_kind = {}
    for r in fit.rows:
        by_kind.setdefault(r["kind"], []).append(r)
    summary = [[k, str(len(rs)), _pct(median([r["err_default"] for r in rs])),
                _pct(median([r["err_fitted"] for r in rs]))] for k, rs in sorted(by_kind.items())]
    summary.append(["all", str(len(fit.rows)), _pct(fit.median_default), _pct(fit.median_fitted)])
    ptab = [[n, SPECS[n].env, _g(getattr(fit.defaults, n) / SPECS[n].unit),
             _g(getattr(fit.fitted, n) / SPECS[n].unit)] for n in fit.names]
    gpu_pool.show_tables([("model versus measured", head, rows),
                          ("median relative error", ["kind", "figures", "default", "fitted"], summary),
                          ("parameters (preset units)", ["field", "preset key", "default", "fitted"], ptab)],
                         width=160)
    for n, why in fit.unfitted.items():
        print(f"not fitted: {n}: {why}")
    for n in notes:
        print(f"left out: {n}")
    print(f"median error: {_pct(fit.median_default)} with the default parameters, "
          f"{_pct(fit.median_fitted)} fitted ({len(fit.rows)} figures)")
    if fit.names:
        print("# fitted parameters, for a preset file (SIMGPU_PRESET):")
        for line in preset_lines(fit.fitted, fit.names):
            print(line)


def fit_json(fit: Fit, notes: list[str], meta: dict[str, Any], path: Path) -> dict[str, Any]:
    return {"tool": "bench/calibrate.py fit", "data": str(path), "meta": meta,
            "params": fit.names, "unfitted": fit.unfitted, "groups": fit.groups,
            "defaults": params_dict(fit.defaults), "fitted": params_dict(fit.fitted),
            "preset": preset_lines(fit.fitted, fit.names),
            "median_err_default": fit.median_default, "median_err_fitted": fit.median_fitted,
            "rows": fit.rows, "left_out": notes}


def cmd_fit(args: argparse.Namespace) -> int:
    try:
        model = Model(args.lib)
        base = model.defaults()
    except ModelError as e:
        print(f"calibrate: {e}", file=sys.stderr)
        return 2
    if not args.data.exists():
        print(f"calibrate: {args.data} not found", file=sys.stderr)
        return 1
    cases, notes, meta = load_cases(args.data)
    devices = sorted({str(c.get("device")) for c in cases})
    if len(devices) > 1:
        notes.append(f"cases from {len(devices)} devices in one fit: {', '.join(devices)}")
    print(f"{args.data}: {len(cases)} cases ({len(notes)} lines left out); "
          f"device {', '.join(devices) or '-'}")
    if not cases:
        for n in notes:
            print(f"left out: {n}")
        print("nothing to fit")
        if args.json:
            gpu_pool.write_json(args.json, {"tool": "bench/calibrate.py fit", "data": str(args.data),
                                            "meta": meta, "rows": [], "left_out": notes})
        return 1
    fit = fit_cases(model, cases, args.params, base, max_nfev=args.max_nfev,
                    use_scipy=not args.no_scipy, log=print)
    print_fit(fit, notes, meta)
    if args.json:
        gpu_pool.write_json(args.json, fit_json(fit, notes, meta, args.data))
        print(f"wrote {args.json}")
    return 0


# ---------------------------------------------------------------- measuring (run, sim)

@dataclass
class Plan:
    quotas: list[int]
    victims: list[str]
    corunners: list[str]
    oversub: list[bool]
    copies: list[int]
    dirs: list[str]
    slice: bool = True
    slice_method: str = "timer"
    slice_s: float = 1.0
    target_ms: float = 5.0
    launches: int = 20
    warmup: int = 2
    mem_mb: int = 512
    copy_mb: int = 64
    copy_s: float = 1.0
    tick_us: float = 100.0
    lead_s: float = 3.0              # start-at this far ahead until setup times are known
    per_run_s: float = 90.0
    budget_s: float = 540.0


@dataclass
class Proc:
    cmd: list[str]
    env: dict[str, str]
    background: bool = False         # a co-runner: SIGTERM once the others are done
    spawned: float = 0.0             # CLOCK_REALTIME at spawn
    rc: int | None = None
    result: dict[str, Any] | None = None
    stderr_tail: str = ""
    error: str | None = None


def run_together(procs: list[Proc], timeout: float) -> list[Proc]:
    """Start every process (each its own session), wait for the foreground
    ones, then SIGTERM the background ones and wait for their reports; on
    timeout kill every group that is left, by its id."""
    live: list[tuple[Proc, subprocess.Popen, Any, Any]] = []
    deadline = time.monotonic() + timeout
    try:
        for pr in procs:
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            pr.spawned = time.time()
            try:
                p = subprocess.Popen(pr.cmd, env=pr.env, stdout=out, stderr=err, text=True,
                                     start_new_session=True)
            except OSError as e:
                pr.error = f"cannot start: {e}"
                out.close()
                err.close()
                continue
            live.append((pr, p, out, err))
        fg = [x for x in live if not x[0].background]
        while any(x[1].poll() is None for x in fg) and time.monotonic() < deadline:
            time.sleep(0.02)
        for pr, p, _, _ in live:
            if pr.background and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        while any(x[1].poll() is None for x in live) and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        for pr, p, out, err in live:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
                pr.error = f"killed after {timeout:.0f} s"
            pr.rc = p.returncode
            out.seek(0)
            err.seek(0)
            pr.result = gpu_pool.parse_probe_output(out.read())
            pr.stderr_tail = "\n".join(err.read().splitlines()[-8:])
            out.close()
            err.close()
            if pr.result is None and pr.error is None:
                pr.error = f"no JSON line from the probe (exit {pr.rc})"
            elif pr.error is None and pr.rc != 0:
                pr.error = (pr.result or {}).get("error") or f"exit {pr.rc}"
    return procs


RUN_KEYS = ("quota_env", "mps_enabled", "sm_count", "blocks", "threads", "regs", "smem", "iters",
            "launches", "median_us", "mean_us", "p10_us", "p90_us", "min_us", "max_us", "busy", "gbs",
            "gbs_span", "tick_us", "tick_ref_us", "samples", "sample_ns", "gaps", "run_us", "gap_us",
            "run_p10_us", "run_p90_us", "gap_p10_us", "gap_p90_us", "start_at", "late_s", "t_start",
            "t_end", "stopped", "error")


def run_summary(pr: Proc) -> dict[str, Any]:
    """What a case keeps of one probe run: its arguments and the figures that
    explain the case (the whole line is in the probe's header)."""
    r = pr.result or {}
    return {"args": pr.cmd[1:], "rc": pr.rc, **{k: r[k] for k in RUN_KEYS if r.get(k) is not None}}


class Session:
    """One measuring session: the environment of each probe, the time budget,
    the output file (one case per line, flushed as measured)."""

    def __init__(self, plan: Plan, probe: Path, base_env: dict[str, str], no_mps_dir: str,
                 out: Path | None, source: str, log: Callable[[str], None],
                 mps_env: Callable[[bool], dict[str, str] | None], device_env: dict[str, str] | None = None,
                 extra_args: tuple[str, ...] = (), step_env: dict[str, dict[str, str]] | None = None):
        self.plan, self.probe, self.base_env, self.no_mps = plan, probe, base_env, no_mps_dir
        self.extra_args, self.step_env = extra_args, step_env or {}
        self.out, self.source, self.log, self.mps_env_of = out, source, log, mps_env
        self.device_env = device_env or {}
        self.end = time.monotonic() + plan.budget_s
        self.lead = plan.lead_s
        self.setup_max = 0.0
        self.failed: list[str] = []
        self.cases: list[dict[str, Any]] = []
        self.shapes: dict[str, dict[str, Any]] = {}
        self.solo: dict[tuple[str, int], dict[str, Any]] = {}
        self.device: str | None = None
        self.driver: str | None = None
        self.sms: int | None = None
        self._fh = open(out, "a") if out else None

    def close(self) -> None:
        if self._fh:
            self._fh.close()
            self._fh = None

    def write(self, obj: dict[str, Any]) -> None:
        if self._fh:
            self._fh.write(json.dumps(obj, separators=(", ", ": ")) + "\n")
            self._fh.flush()

    def env(self, pct: int | None, mps: bool, step: str = "kernel") -> dict[str, str]:
        e = gpu_pool.probe_env(self.base_env, pct, self.mps_env_of(mps), None if mps else self.no_mps)
        e.update(self.device_env)
        e.update(self.step_env.get(step, {}))
        return e

    def cmd(self, kind: str, *args: Any) -> list[str]:
        return [str(self.probe), "--kind", kind, *self.extra_args, *(str(a) for a in args)]

    def time_left(self) -> float | None:
        left = self.end - time.monotonic()
        return None if left < 10 else min(self.plan.per_run_s, left)

    def start_at(self) -> float:
        return time.time() + self.lead

    def note_setup(self, procs: list[Proc]) -> None:
        """Learn how long a probe needs before its timed section (from runs
        without --start-at), and lengthen the lead if one was late."""
        for pr in procs:
            r = pr.result or {}
            if "--start-at" not in pr.cmd and r.get("t_start"):
                self.setup_max = max(self.setup_max, r["t_start"] - pr.spawned)
                self.lead = min(5.0, max(0.3, 1.5 * self.setup_max + 0.2))
            if (r.get("late_s") or 0) > 0:
                self.lead = min(10.0, self.lead * 1.5 + 0.2)

    def go(self, name: str, procs: list[Proc]) -> list[Proc] | None:
        t = self.time_left()
        if t is None:
            self.record_error(name, "skipped: time budget spent")
            return None
        run_together(procs, t)
        self.note_setup(procs)
        for pr in procs:
            if pr.result:
                self.device = self.device or pr.result.get("device")
                self.sms = self.sms or pr.result.get("sm_count")
                if pr.result.get("driver_version"):
                    self.driver = self.driver or f"CUDA {pr.result['driver_version']}"
        return procs

    def record_error(self, name: str, why: str, procs: list[Proc] | None = None) -> None:
        self.failed.append(f"{name}: {why}")
        obj = {"case": name, "error": why}
        if procs:
            obj["runs"] = [{"cmd": p.cmd[1:], "rc": p.rc, "error": p.error, "stderr_tail": p.stderr_tail,
                            "result": p.result} for p in procs]
        self.write(obj)
        self.log(f"  {name}: {why}")

    def record(self, case: dict[str, Any], procs: list[Proc]) -> None:
        case.update({"sms": self.sms, "device": self.device, "driver": self.driver, "source": self.source,
                     "runs": [run_summary(p) for p in procs]})
        self.cases.append(case)
        self.write(case)
        m = measured(case)
        self.log(f"  {case['case']}: " + ", ".join(f"{k} {v:.4g}" for k, v in m.items()))

    # --- the steps

    def kernel_args(self, kind: str) -> list[Any]:
        s = self.shapes[kind]
        args = ["--blocks", s["blocks"], "--iters", s["iters"], "--threads", s["threads"]]
        if kind == "memory":
            args += ["--mb", self.plan.mem_mb]
        return args

    def calibrate_shapes(self) -> None:
        pl = self.plan
        for kind in dict.fromkeys([*pl.victims, *pl.corunners]):
            extra = ["--mb", pl.mem_mb] if kind == "memory" else []
            procs = self.go(f"shape/{kind}", [Proc(self.cmd(kind, "--target-ms", pl.target_ms,
                                                             "--launches", 5, "--warmup", 1, *extra),
                                                    self.env(100, True))])
            if procs is None:
                continue
            r = procs[0].result or {}
            if procs[0].rc != 0 or not r.get("blocks") or not r.get("iters"):
                self.record_error(f"shape/{kind}", procs[0].error or "no shape reported", procs)
                continue
            self.shapes[kind] = {k: r[k] for k in ("blocks", "threads", "iters", "regs", "smem",
                                                   "flops", "bytes", "median_us")}
            self.sms = self.sms or r.get("sm_count")
            self.log(f"  shape/{kind}: {r['blocks']} blocks x {r['threads']}, {r['regs']} regs, "
                     f"iters {r['iters']}: {r['median_us']:.0f} µs at 100 %")

    def task(self, kind: str, pct: int, ctx: int, role: str, r: dict[str, Any] | None = None) -> dict:
        s = r or self.shapes[kind]
        return {"role": role, "label": kind, "kind": "kernel", "blocks": s["blocks"],
                "threads": s["threads"], "regs": s["regs"], "smem": s["smem"], "flops": s["flops"],
                "bytes": s["bytes"], "quota_pct": pct, "ctx": ctx}

    def measure_solo(self) -> None:
        pl = self.plan
        for v in pl.victims:
            if v not in self.shapes:
                continue
            for q in pl.quotas:
                name = f"solo/{v}/q{q}"
                procs = self.go(name, [Proc(self.cmd(v, *self.kernel_args(v), "--launches", pl.launches,
                                                     "--warmup", pl.warmup), self.env(q, True))])
                if procs is None:
                    continue
                r = procs[0].result or {}
                if procs[0].rc != 0 or not r.get("median_us"):
                    self.record_error(name, procs[0].error or "no time", procs)
                    continue
                self.solo[(v, q)] = r
                self.record({"case": name, "kind": "solo", "mps": True,
                             "tasks": [self.task(v, q, 0, "victim", r)],
                             "measured": {"alone_us": r["median_us"], "mean_us": r.get("mean_us"),
                                          "p10_us": r.get("p10_us"),
                                          "p90_us": r.get("p90_us")}}, procs)

    def measure_pairs(self) -> None:
        pl = self.plan
        for v in pl.victims:
            for c in pl.corunners:
                for over in pl.oversub:
                    for q in pl.quotas:
                        co = 100 if over else 100 - q
                        if co < 1 or v not in self.shapes or c not in self.shapes:
                            continue
                        self.one_pair(v, c, q, co)

    def one_pair(self, v: str, c: str, q: int, co: int) -> None:
        pl = self.plan
        name = f"pair/{v}+{c}/q{q}/co{co}"
        alone = self.solo.get((v, q))
        if alone is None:
            self.record_error(name, f"no solo time of {v} at {q} %")
            return
        t = self.start_at()
        head = max(0.05, 3 * self.shapes[c]["median_us"] * 1e-6)    # the co-runner is in full swing
        procs = self.go(name, [
            Proc(self.cmd(c, *self.kernel_args(c), "--duration", CORUNNER_MAX_S, "--warmup", pl.warmup,
                          "--start-at", f"{t:.6f}"), self.env(co, True), background=True),
            Proc(self.cmd(v, *self.kernel_args(v), "--launches", pl.launches, "--warmup", pl.warmup,
                          "--start-at", f"{t + head:.6f}"), self.env(q, True))])
        if procs is None:
            return
        cr, vr = (p.result or {} for p in procs)
        if procs[1].rc != 0 or not vr.get("median_us") or not cr.get("t_start"):
            self.record_error(name, procs[1].error or procs[0].error or "no time", procs)
            return
        overlap = bool(cr["t_start"] <= vr["t_start"] and (cr.get("t_end") or 0) >= vr["t_end"])
        self.record({"case": name, "kind": "pair", "mps": True,
                     "tasks": [self.task(v, q, 0, "victim", vr), self.task(c, co, 1, "corunner", cr)],
                     "measured": {"victim_alone_us": alone["median_us"], "victim_with_us": vr["median_us"],
                                  "victim_alone_mean_us": alone.get("mean_us"),
                                  "victim_with_mean_us": vr.get("mean_us"),
                                  "victim_with_p10_us": vr.get("p10_us"),
                                  "victim_with_p90_us": vr.get("p90_us"),
                                  "corunner_with_us": cr.get("median_us"),
                                  "corunner_alone_100_us": self.shapes[c]["median_us"],
                                  "overlap": overlap}}, procs)

    def measure_pcie(self) -> None:
        pl = self.plan
        for d in pl.dirs:
            for n in pl.copies:
                name = f"pcie/{d}/x{n}"
                t = self.start_at()
                procs = self.go(name, [Proc(self.cmd("copy", "--dir", d, "--mb", pl.copy_mb,
                                                     "--duration", pl.copy_s, "--warmup", 1,
                                                     "--start-at", f"{t:.6f}"), self.env(100, True, "pcie"))
                                       for _ in range(n)])
                if procs is None:
                    continue
                rs = [p.result or {} for p in procs]
                if any(p.rc != 0 or not r.get("gbs") for p, r in zip(procs, rs)):
                    self.record_error(name, next(p.error for p in procs if p.error) or "no rate", procs)
                    continue
                overlap = max(r["t_start"] for r in rs) < min(r["t_end"] for r in rs)
                self.record({"case": name, "kind": "pcie", "mps": True,
                             "tasks": [{"role": "copy", "kind": d, "bytes": rs[0]["bytes"], "ctx": i}
                                       for i in range(n)],
                             "measured": {"gbs_per_copy": sum(r["gbs"] for r in rs) / n,
                                          "gbs_each": [r["gbs"] for r in rs],
                                          "gbs_span_each": [r.get("gbs_span") for r in rs],
                                          "overlap": overlap}}, procs)

    def measure_slice(self) -> None:
        pl = self.plan
        name = "slice/x2"
        args: list[Any] = ["--duration", pl.slice_s, "--method", pl.slice_method]
        if pl.slice_method == "events":
            # the ticks' work from one probe alone: calibrated next to the
            # other context, a tick would take its time slice for its own time
            procs = self.go("slice/ticks", [Proc(self.cmd("slice", "--duration", 0.05, "--method", "events",
                                                           "--tick-us", pl.tick_us),
                                                  self.env(None, False, "slice"))])
            r = (procs[0].result or {}) if procs else {}
            if not r.get("iters"):
                self.record_error(name, "calibrating the ticks failed: "
                                  + str(procs[0].error if procs else "no time left"), procs)
                return
            args += ["--iters", r["iters"], "--tick-ref-us", r.get("tick_us") or pl.tick_us]
        t = self.start_at()
        args += ["--start-at", f"{t:.6f}"]
        procs = self.go(name, [Proc(self.cmd("slice", *args), self.env(None, False, "slice"))
                               for _ in range(2)])
        if procs is None:
            return
        a, b = (p.result or {} for p in procs)
        if any(p.rc != 0 for p in procs):
            self.record_error(name, next(p.error for p in procs if p.error) or "failed", procs)
            return
        if not (a.get("run_us") and b.get("run_us") and a.get("gap_us") and b.get("gap_us")):
            self.record_error(name, f"the two contexts never alternated (gaps {a.get('gaps')}, "
                                    f"{b.get('gaps')}): no time slicing seen", procs)
            return
        sw = ((a["gap_us"] - b["run_us"]) / 2 + (b["gap_us"] - a["run_us"]) / 2) / 2
        self.record({"case": name, "kind": "slice", "mps": False,
                     "tasks": [{"role": "slice", "kind": "kernel", "blocks": r.get("blocks") or 1,
                                "threads": r.get("threads") or 32, "regs": r.get("regs") or 0,
                                "smem": r.get("smem") or 0, "flops": r.get("flops") or 0,
                                "bytes": r.get("bytes") or 0, "quota_pct": 100, "ctx": i}
                               for i, r in enumerate((a, b))],
                     "measured": {"slice_us": (a["run_us"] + b["run_us"]) / 2,
                                  "switch_us": max(sw, SWITCH_FLOOR_US), "switch_raw_us": sw,
                                  "run_us": [a["run_us"], b["run_us"]], "gap_us": [a["gap_us"], b["gap_us"]],
                                  "gaps": [a.get("gaps"), b.get("gaps")], "method": pl.slice_method}},
                    procs)


def measure(sess: Session, mps_start: Callable[[], str | None], mps_stop: Callable[[], None]) -> None:
    """The whole plan, in the order of the docstring; MPS is stopped whatever happens."""
    pl = sess.plan
    if pl.slice:
        sess.log("time slicing without MPS")
        sess.measure_slice()
    why = mps_start()
    if why:
        sess.failed.append(f"MPS: {why}")
        sess.log(f"MPS unavailable: {why}; the MPS cases are skipped")
        return
    try:
        sess.log("kernel shapes at 100 %")
        sess.calibrate_shapes()
        if pl.copies:
            sess.log("PCIe: concurrent copies")
            sess.measure_pcie()
        sess.log("victims alone")
        sess.measure_solo()
        sess.log("victim with a co-runner")
        sess.measure_pairs()
    finally:
        mps_stop()


# ---------------------------------------------------------------- simgpu (sim)

TWINS_C = r"""
/* Cost twins of gpu-calib_probe's kernels for simgpu (bench/calibrate.py sim;
 * the tests): the work each launch does, as the probe counts it.  The twins
 * themselves do nothing (SIMGPU_TIMING_ONLY=1 skips them anyway). */
#include <stdint.h>
#include "simgpu_twin.h"
#define API __attribute__((visibility("default")))

static double threads(const simgpu_launch *l)
{
	return (double)l->grid.x * l->grid.y * l->grid.z * l->block.x * l->block.y * l->block.z;
}

/* calib_fma(float *out, long long iters, int smem_words) */
API void simgpu_twin__Z9calib_fmaPfxi(const simgpu_launch *l) { (void)l; }
API void simgpu_cost__Z9calib_fmaPfxi(const simgpu_launch *l, double *flops, double *bytes)
{
	*flops = 16.0 * (double)SIMGPU_ARG(l, 1, long long) * threads(l);
	*bytes = 4.0 * threads(l);
}

/* calib_stream(float4 *a, float4 *b, uint64_t n4, long long passes, int smem_words) */
API void simgpu_twin__Z12calib_streamP6float4S0_mxi(const simgpu_launch *l) { (void)l; }
API void simgpu_cost__Z12calib_streamP6float4S0_mxi(const simgpu_launch *l, double *flops,
						    double *bytes)
{
	double n4 = (double)SIMGPU_ARG(l, 2, uint64_t), k = (double)SIMGPU_ARG(l, 3, long long);

	*flops = 8.0 * n4 * k;
	*bytes = 32.0 * n4 * k;
}

/* calib_fill(float *x, uint64_t n) */
API void simgpu_twin__Z10calib_fillPfm(const simgpu_launch *l) { (void)l; }
API void simgpu_cost__Z10calib_fillPfm(const simgpu_launch *l, double *flops, double *bytes)
{
	*flops = 0;
	*bytes = 4.0 * (double)SIMGPU_ARG(l, 1, uint64_t);
}
"""


# Copies on simgpu really copy, on the CPU, at a few GB/s: at timescale 1 the
# model's 50 GB/s copies would leave each copy process idle most of the time
# (never overlapping the others').  The PCIe step runs on a device of its own,
# 50 wall seconds to the device second.
PCIE_TIMESCALE = 50.0


def build_twins(dest: Path) -> Path:
    """The probe's cost twins as a shared object in dest (cc, no make rule)."""
    src, so = dest / "calib_twins.c", dest / "calib_twins.so"
    src.write_text(TWINS_C)
    cc = os.environ.get("CC", "cc")
    r = subprocess.run([cc, "-O2", "-Wall", "-fPIC", "-shared", f"-I{SIMGPU_INC}", "-o", str(so), str(src)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"building the probe's twins failed: {r.stderr.strip()[:400]}")
    return so


def sim_env(workdir: Path, twins: Path, timescale: float, dev: str = "dev") -> dict[str, str]:
    """What every probe on simgpu gets: the library, a private device, the twins."""
    return {"LD_LIBRARY_PATH": str(SIMGPU_LIB.parent), "SIMGPU_DIR": str(workdir / dev),
            "SIMGPU_TWINS": str(twins), "SIMGPU_TIMING_ONLY": "1", "SIMGPU_TIMESCALE": f"{timescale:g}"}


# ---------------------------------------------------------------- run / sim commands

def parse_quota_list(text: str) -> list[int]:
    try:
        qs = sorted({int(x) for x in text.split(",") if x.strip()}, reverse=True)
    except ValueError:
        qs = []
    if not qs or any(not 1 <= q <= 100 for q in qs):
        raise argparse.ArgumentTypeError(f"bad quota list {text!r}: integers 1..100, comma-separated")
    return qs


def parse_kinds(text: str) -> list[str]:
    ks = [k.strip() for k in text.split(",") if k.strip()]
    if not ks or any(k not in KERNEL_KINDS for k in ks):
        raise argparse.ArgumentTypeError(f"bad kinds {text!r}: from {', '.join(KERNEL_KINDS)}")
    return list(dict.fromkeys(ks))


def parse_counts(text: str) -> list[int]:
    try:
        ns = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        ns = [0]
    if any(not 1 <= n <= 16 for n in ns):
        raise argparse.ArgumentTypeError(f"bad process counts {text!r}: 1..16, comma-separated")
    return ns


def parse_dirs(text: str) -> list[str]:
    ds = [d.strip() for d in text.split(",") if d.strip()]
    if not ds or any(d not in ("h2d", "d2h") for d in ds):
        raise argparse.ArgumentTypeError(f"bad directions {text!r}: h2d, d2h or both")
    return list(dict.fromkeys(ds))


def plan_of(args: argparse.Namespace, sim: bool) -> Plan:
    quotas = args.quotas or parse_quota_list(QUICK_QUOTAS if args.quick or sim else DEFAULT_QUOTAS)
    oversub = [False, True]
    if args.oversub == "no":
        oversub = [False]
    elif args.oversub == "only":
        oversub = [True]
    pl = Plan(quotas=quotas, victims=args.victims, corunners=args.corunners, oversub=oversub,
              copies=args.copies, dirs=args.dirs,
              slice=not args.no_slice, slice_s=args.slice_s, target_ms=args.target_ms,
              launches=args.launches, warmup=args.warmup, per_run_s=args.per_run_s, budget_s=args.budget_s)
    if args.quick:
        pl.launches = min(pl.launches, 10)
        pl.slice_s = min(pl.slice_s, 0.5)
        pl.copy_s = 0.5
    if sim:
        # the model times what the probe reports: small buffers do, and ticks
        # that the executors can follow
        pl.slice_method = "events"
        pl.mem_mb = 64
        pl.copy_mb = 16
        pl.copy_s = min(pl.copy_s, 0.3)
        pl.slice_s = min(pl.slice_s, 0.3)
        pl.tick_us = 200.0
        pl.lead_s = 0.5
    return pl


def header(kind: str, plan: Plan, argv: list[str], **extra: Any) -> dict[str, Any]:
    return {"meta": {"tool": f"bench/calibrate.py {kind}", "host": socket.gethostname(),
                     "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": argv,
                     "plan": {k: v for k, v in vars(plan).items()}, **extra}}


def finish(sess: Session, out: Path | None, t0: float) -> int:
    sess.close()
    print(f"{len(sess.cases)} cases measured in {time.monotonic() - t0:.0f} s"
          + (f", {len(sess.failed)} failed:\n  " + "\n  ".join(sess.failed) if sess.failed else ""))
    if out:
        print(f"wrote {out}")
    return 1 if sess.failed or not sess.cases else 0


def cmd_run(args: argparse.Namespace, driver: Callable = gpu_pool.detect_driver,
            mps_factory: Callable[[Path], Any] | None = None) -> int:
    info, why = driver()
    if info is None:
        print(f"{NO_DRIVER} ({'; '.join(why)}): the calibration needs a GPU; "
              f"`calibrate.py sim` measures simgpu instead")
        return 2
    if not PROBE.exists():
        print(f"missing {PROBE}: build it first with `make {PROBE.relative_to(REPO)}` (or `make build`)")
        return 1
    os.environ["PATH"] = gpu_pool.with_driver_bins(os.environ.get("PATH", ""))
    libdir = gpu_pool.cudart_dir()
    if libdir:
        old = os.environ.get("LD_LIBRARY_PATH")
        os.environ["LD_LIBRARY_PATH"] = libdir + (os.pathsep + old if old else "")
    plan = plan_of(args, sim=False)
    rundir = Path(tempfile.mkdtemp(prefix="cgpu-calib-", dir="/tmp"))
    no_mps = rundir / "no-mps"
    no_mps.mkdir()
    if mps_factory is None:
        Mps, _ = gpu_pool.load_mps()
        base = {k: v for k, v in os.environ.items() if k != PCT_ENV}
        mps_factory = lambda d: Mps(d, env=base)      # noqa: E731
    mps = mps_factory(rundir)
    state: dict[str, Any] = {}

    def start() -> str | None:
        try:
            state["status"] = mps.ensure()
            print(state["status"], flush=True)
            state["env"] = mps.env()
            return None
        except Exception as e:            # MpsError: no daemon binary, start failed, ...
            return str(e)

    def stop() -> None:
        mps.stop()

    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(header("run", plan, sys.argv[1:], driver=info)) + "\n")
    t0 = time.monotonic()
    sess = Session(plan, PROBE, {k: v for k, v in os.environ.items() if k != PCT_ENV}, str(no_mps), args.out,
                   f"measured: bench/calibrate.py run on {info.get('gpus', [{}])[0].get('name', 'a GPU')}",
                   lambda s: print(f"[{time.monotonic() - t0:6.1f} s] {s}", flush=True),
                   lambda on: state.get("env") if on else None)
    sess.driver = info.get("driver")       # the NVIDIA driver's version (the probes know the CUDA one)
    try:
        measure(sess, start, stop)
    except KeyboardInterrupt:
        sess.failed.append("interrupted")
        print("interrupted: the file has what was measured")
    finally:
        shutil.rmtree(rundir, ignore_errors=True)
    return finish(sess, args.out, t0)


def cmd_sim(args: argparse.Namespace) -> int:
    if not PROBE.exists():
        print(f"missing {PROBE}: `make {PROBE.relative_to(REPO)}` (or `make build`)")
        return 1
    if not SIMGPU_LIB.exists():
        print(f"missing {SIMGPU_LIB}: `make build` (or python -m shim.build)")
        return 1
    plan = plan_of(args, sim=True)
    work = Path(tempfile.mkdtemp(prefix="cgpu-calib-sim-", dir="/tmp"))
    try:
        twins = build_twins(work)
        dev_env = sim_env(work, twins, args.timescale)
        base = {k: v for k, v in os.environ.items()
                if k != PCT_ENV and k != "LD_PRELOAD" and not k.startswith("SIMGPU_")}
        # the parameters the probes' device runs with: the same settings here
        keep = {k: v for k, v in os.environ.items() if k.startswith("SIMGPU_")}
        base.update(keep)
        params = None
        try:
            params = params_dict(Model().defaults())
        except ModelError as e:
            print(f"note: {e}")
        (work / "no-mps").mkdir()
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(header("sim", plan, sys.argv[1:], params=params,
                                                  timescale=args.timescale)) + "\n")
        t0 = time.monotonic()
        sess = Session(plan, PROBE, base, str(work / "no-mps"), args.out,
                       "simgpu: bench/calibrate.py sim (the model, measured through gpu-calib_probe --allow-sim)",
                       lambda s: print(f"[{time.monotonic() - t0:6.1f} s] {s}", flush=True),
                       lambda on: {"SIMGPU_MPS": "1" if on else "0"}, dev_env, ("--allow-sim",),
                       {"pcie": sim_env(work, twins, PCIE_TIMESCALE, "dev-pcie"),
                        "slice": sim_env(work, twins, args.timescale, "dev-slice")})
        sess.driver = "simgpu"
        try:
            measure(sess, lambda: None, lambda: None)
        except KeyboardInterrupt:
            sess.failed.append("interrupted")
        return finish(sess, args.out, t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def add_plan_options(ap: argparse.ArgumentParser, sim: bool) -> None:
    if sim:
        ap.add_argument("--out", type=Path, required=True, help="write the cases here (JSON lines)")
    else:
        ap.add_argument("--out", type=Path, default=BENCH / "out" / "calib.jsonl",
                        help="write the cases here (JSON lines; default bench/out/calib.jsonl)")
    ap.add_argument("--quotas", type=parse_quota_list,
                    help=f"the victim's MPS percentages (default {QUICK_QUOTAS if sim else DEFAULT_QUOTAS}; "
                         f"--quick: {QUICK_QUOTAS})")
    ap.add_argument("--quick", action="store_true",
                    help=f"a short plan: quotas {QUICK_QUOTAS}, 10 launches, half-second copies and slices")
    ap.add_argument("--victims", type=parse_kinds, default=["compute", "memory"],
                    help="victim kernel kinds (default compute,memory)")
    ap.add_argument("--corunners", type=parse_kinds, default=list(KERNEL_KINDS),
                    help="co-runner kernel kinds (default compute,memory,fewblock)")
    ap.add_argument("--oversub", choices=("both", "no", "only"), default="both",
                    help="co-runner at 100 - q (no), at 100 (only), or both (default)")
    ap.add_argument("--copies", type=parse_counts, default=[1, 2, 4],
                    help="processes copying at once (default 1,2,4; '' for none)")
    ap.add_argument("--dirs", type=parse_dirs, default=["h2d", "d2h"], help="copy directions (default h2d,d2h)")
    ap.add_argument("--no-slice", action="store_true", help="skip the time-slice case")
    ap.add_argument("--slice-s", type=float, default=1.0, help="seconds of each slice probe (default 1)")
    ap.add_argument("--target-ms", type=float, default=2.0 if sim else 5.0,
                    help="one launch of each kernel at 100 %% takes about this long")
    ap.add_argument("--launches", type=int, default=10 if sim else 20, help="timed launches of a victim")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up launches")
    ap.add_argument("--per-run-s", type=float, default=90.0, help="kill a group of probes after this long")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="start nothing after this many seconds (default 540: fits a 10-minute command)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bench/calibrate.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="measure the calibration cases on a GPU")
    add_plan_options(r, sim=False)
    f = sub.add_parser("fit", help="fit the model's parameters to measured cases")
    f.add_argument("data", type=Path, help="cases (JSON lines) from run, sim or published sources")
    f.add_argument("--params", type=parse_params, default=parse_params(DEFAULT_FIT),
                   help=f"parameters to fit (default {DEFAULT_FIT}; also: bw)")
    f.add_argument("--json", type=Path, help="write the table, errors and fitted parameters here")
    f.add_argument("--max-nfev", type=int, default=200, help="model evaluations per parameter group")
    f.add_argument("--no-scipy", action="store_true", help="coordinate search even where scipy is")
    f.add_argument("--lib", type=Path, default=SIMGPU_LIB, help="the simgpu library with the model")
    s = sub.add_parser("sim", help="measure the cases on simgpu (the model itself)")
    add_plan_options(s, sim=True)
    s.add_argument("--timescale", type=float, default=1.0,
                   help="SIMGPU_TIMESCALE of the probes (wall s per device s; default 1)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "fit":
        return cmd_fit(args)
    if args.command == "sim":
        return cmd_sim(args)
    return cmd_run(args)


def _term(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt        # SIGTERM: unwind, stop MPS, keep what was written


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _term)
    sys.exit(main())
