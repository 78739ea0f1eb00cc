"""claius: C-Laius (Zhang et al., IEEE TC 2021; Laius, ICS'19) as a policy.

QoS queries get the just-enough SM quota (Eq. 3); batch apps share the rest
through a knapsack over quota units that maximises predicted IPC under the
device's memory bandwidth (Eq. 4/5); a query that lags gets a bigger quota
for its remaining tasks (Eq. 6) and goes back when the lag is gone; several
QoS services share by the slope of their latency curves, runtime priority
classes (Eq. 7) and the ratio test of Eq. 8.

The papers are not available here: each equation below is written as we
read the issue's summary of it, and its docstring says that reading.

Everything here is pure: predictions come from an injected Predictor (a
table for tests, ModelPredictor for trained models), time comes from the
events, and the only output is Decisions and log lines.

What the hooks read (base.QueryEvent and base.TaskDone):
  on_query_begin  info: id, size (input size), t_us; qos_ms (overrides the
                  app's), tasks (feature dicts of the query's tasks, in
                  order; None: the previous query's tasks are the plan)
  on_task_done    task: features (a predictors task row), duration_us
                  (measured), quota_pct (it ran at), query (id), count
                  (tasks it stands for).  QoS tasks advance their
                  query's progress (a late one, of an ended query, completes
                  that query's plan); batch tasks join the app's recent tasks,
                  which its knapsack curves are time-weighted over.
  on_query_end    info: id, t_us (its latency teaches Eq. 3 the host time)
Decisions are Decision(slot, quota_pct, route=None): the controller picks a
worker of that quota; a batch app the knapsack leaves out gets hold=True (its
next launch waits) at the quota it had, and hold=False when it gets units.

A query's wait before it began (QueryEvent.queued_us, when the caller knows
it: the simulator does) is taken off its target before Eq. 3 and Eq. 6, as
Abacus's headroom (its Eq. 2) takes off T_queue: under Poisson arrivals a
query that Eq. 3 stretches to the whole target makes the next one, queued
behind it, miss.  queue=false: Eq. 3 and 6 with the whole target, as the
paper writes them.

The decision path (query arrival -> quotas) has a fast mode, on by default:
a QoS plan's predictions, remaining sums and bandwidth are cached while
the next query runs the same tasks, the batch curves are kept stacked for the
knapsack (updated by set_batch_curves when a batch task's predictions change),
and Decisions, being frozen, are reused.  fast=False is the reference path;
tests check that both decide alike.
"""
from __future__ import annotations

import collections
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence, cast

import numpy as np

from controlplane.policies.base import AppInfo, Decision, Policy, QueryEvent, TaskDone, register_policy
from controlplane.policies.knapsack import (  # noqa: F401  (knapsack_c*, Packing: part of its API)
    DEFAULT_MAX_NODES,
    KS_MAX_APPS,
    KS_MAX_UNITS,
    Packing,
    knapsack,
    knapsack_c,
    knapsack_c_available,
    knapsack_py,
)
from controlplane.policies.predict import ModelPredictor, Predictor, Row, TablePredictor, knows_whole_app  # noqa: F401

log = logging.getLogger("colocate.claius")

RECENT_TASKS = 16          # a batch app's recent tasks its knapsack curves average over
CURVE_RTOL = 0.02          # curves that moved less than this do not trigger a new decision
BATCH_WINDOW = 1           # a batch task is issued when the previous one is done: the ready pool
HOST_WINDOW = 32           # the app's last queries the learnt host time comes from
HOST_PCT = 95              # ... their 95th percentile: QoS is a tail target



# --- the equations, one function each ------------------------------------------

def eq3_quota(t_pred_ms: np.ndarray, quotas: np.ndarray, target_ms: float,
              pcie_ms: np.ndarray | float = 0.0) -> int | None:
    """Eq. 3, as we read it: the query runs at
         q* = min { q : T_p(q) <= T_tgt - T_pcie(q) }
    where T_p(q) is its predicted device time at quota q and T_pcie its
    copy time.  Returns None when no quota qualifies (the caller uses 100 %)."""
    ok = np.asarray(t_pred_ms) <= target_ms - np.asarray(pcie_ms)
    i = int(ok.argmax())                   # the first True (0 when none: checked)
    return int(quotas[i]) if ok[i] else None


def eq6_quota(spent_ms: float, remaining_ms: np.ndarray, quotas: np.ndarray, target_ms: float,
              pcie_ms: float = 0.0) -> int | None:
    """Eq. 6, as we read it: after some tasks of a query finished, taking
    spent_ms of measured device time, the remaining tasks R move to
         q' = min { q : spent + sum_{j in R} T_j(q) <= T_tgt - T_pcie }
    remaining_ms[i] is sum_{j in R} T_j(quotas[i]).  None when no quota
    qualifies (the caller uses 100 %)."""
    ok = spent_ms + np.asarray(remaining_ms) <= target_ms - pcie_ms
    i = int(ok.argmax())
    return int(quotas[i]) if ok[i] else None


def lag_ms(measured_ms: Sequence[float], predicted_ms: Sequence[float]) -> float:
    """The progress check before Eq. 6: how far the completed tasks ran
    behind their predictions, sum(measured) - sum(predicted at the quota each
    ran at).  > 0: the query lags."""
    return float(sum(measured_ms) - sum(predicted_ms))


def eq7_priority(t_predict_ms: float, t_rest_ms: float, slack_frac: float = 0.1) -> int:
    """Eq. 7, as we read it: T = t_predict - t_rest, where t_predict is the
    predicted time of the query's remaining tasks at its current quota and
    t_rest the time left before its target.  Priority 1 (urgent): T > 0, it
    will miss at this quota; 2: it makes it with less than slack_frac of
    t_rest to spare; 3: it has slack to give."""
    t = t_predict_ms - t_rest_ms
    if t > 0:
        return 1
    if -t < slack_frac * max(t_rest_ms, 0.0):
        return 2
    return 3


def eq8_choose(cands: Sequence[tuple[Any, float, float]], th: float = 0.9) -> Any | None:
    """Eq. 8, as we read it: for each candidate increment (key, T now, T
    with the increment), A = T_with / T_now; the increment worth giving is
    the one with the smallest A, provided A <= TH (it buys at least 1 - TH
    of the remaining time).  None when every A > TH."""
    best, best_a = None, math.inf
    for key, t_now, t_with in cands:
        a = t_with / t_now if t_now > 0 else math.inf
        if a <= th and a < best_a:
            best, best_a = key, a
    return best


def curve_slope(t_ms: np.ndarray, i: int) -> float:
    """The slope of a predicted latency curve at quota index i, ms per quota
    step: how much one step less would cost (left difference; at the first
    quota, the step above).  C-Laius gives the steeper service priority."""
    t = np.asarray(t_ms, dtype=np.float64)
    if t.size < 2:
        return 0.0
    if i > 0:
        return float(t[i - 1] - t[i])
    return float(t[0] - t[1])


@dataclass
class Claim:
    """One QoS service's claim on quota units, for share_units."""
    key: Any
    need: int                              # units it asks for (Eq. 3 / Eq. 6 / rollback)
    cls: int = 2                           # Eq. 7 priority class
    slope: float = 0.0                     # curve_slope at its need
    remaining: Callable[[int], float] | None = None   # predicted remaining ms at u units


def share_units(claims: Sequence[Claim], total: int, th: float = 0.9) -> dict[Any, int]:
    """Several QoS services asking for more units than there are: everyone
    gets what it asks when it fits.  Otherwise each gets one unit, then the
    rest goes by class (Eq. 7: 1 before 2 before 3): within class 1 unit by
    unit to the best Eq. 8 candidate (by slope when none passes TH); within
    classes 2 and 3 whole needs, steepest slope first."""
    if sum(c.need for c in claims) <= total:
        return {c.key: c.need for c in claims}
    order = sorted(claims, key=lambda c: (c.cls, -c.slope))
    grant = {c.key: min(1, c.need) for c in claims}
    left = total - sum(grant.values())
    for cls in (1, 2, 3):
        group = [c for c in order if c.cls == cls]
        if cls == 1:
            while left > 0:
                want = [c for c in group if grant[c.key] < c.need]
                if not want:
                    break
                cands = [(c.key, c.remaining(grant[c.key]), c.remaining(grant[c.key] + 1))
                         for c in want if c.remaining is not None]
                pick = eq8_choose(cands, th)
                if pick is None:
                    pick = want[0].key
                grant[pick] += 1
                left -= 1
        else:
            for c in group:
                give = max(0, min(c.need - grant[c.key], left))
                grant[c.key] += give
                left -= give
    return grant


# --- per-app state -------------------------------------------------------------------

@dataclass
class QueryState:
    id: int
    arrival_us: float
    target_ms: float                       # T_tgt
    pcie_ms: float                         # T_pcie at the default quota, with the learnt host time
    default_q: int                         # Eq. 3's quota
    curve: np.ndarray                      # predicted device time per quota (Eq. 3's T_p)
    quota: int                             # the quota its tasks run at now
    plan: list[Row]                        # the tasks it will run, in order
    pred: np.ndarray | None = None         # plan x quotas, predicted ms (lazy)
    measured: list[float] = field(default_factory=list)
    predicted: list[float] = field(default_factory=list)   # of done tasks, at their quota
    compensated: bool = False
    cache: "PlanCache | None" = None       # fast path: predictions of this plan
    host_ms: float = 0.0                   # the learnt host time pcie_ms includes


@dataclass
class PlanCache:
    """Fast path: what a QoS plan predicts, kept while the next query runs the
    same tasks (the usual case: a query's plan is the previous query's tasks).
    Each entry is computed by the same expression as the reference path, so
    the numbers are the same bits."""
    plan: list[Row]
    pred: np.ndarray | None = None         # plan x quotas, ms
    rem: dict[int, np.ndarray] = field(default_factory=dict)   # done -> pred[done:].sum(0)
    bw: np.ndarray | None = None           # peak GB/s per quota


@dataclass
class QosApp:
    info: AppInfo
    query: QueryState | None = None
    last_plan: list[Row] = field(default_factory=list)
    seen: list[Row] = field(default_factory=list)          # tasks of the current query
    bw_cache: tuple[list[Row], np.ndarray] | None = None   # (plan, peak GB/s per quota)
    pcache: PlanCache | None = None                        # fast path
    host_ms: float = 0.0                   # learnt: a query's time beyond its predicted device time
    extras: collections.deque = field(default_factory=lambda: collections.deque(maxlen=HOST_WINDOW))
    last_qid: int | None = None            # the query that ended last (its late tasks)
    late_restarts: bool = False            # its first late task starts last_plan afresh


@dataclass
class BatchApp:
    info: AppInfo
    task: Row | None = None                # its last seen task
    ipc: np.ndarray | None = None          # knapsack value per unit count 0..N
    bw: np.ndarray | None = None
    # predicted (ms, GB/s, IPC or None) per quota of its recent tasks: what it
    # will run next is taken to be like what it ran lately, time-weighted
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=RECENT_TASKS))


@dataclass
class BatchMats:
    """Fast path: the batch apps' IPC and bandwidth curves stacked for the
    knapsack, and their slices per free unit count.  refs holds the arrays
    they were stacked from: a curve replaced behind our back (not through
    set_batch_curves) is seen by identity and the stack is rebuilt."""
    slots: tuple[int, ...]
    refs: list[tuple[np.ndarray, np.ndarray]]
    V: np.ndarray                          # apps x (N + 1)
    B: np.ndarray
    cut: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)


@register_policy("claius")
class CLaius(Policy):
    """Options: granularity (percent per unit, 10), bandwidth_cap (True;
    False = C-Laius-NB), compensation (True; False = C-Laius-NC),
    device_bw_gbs (3350), th (Eq. 8, 0.9), slack_frac (Eq. 7, 0.1),
    predictor (a Predictor) or models (a directory of saved models),
    use_c (True), max_nodes (knapsack search limit), fast (True: cached
    predictions and stacked curves on the decision path; False: the
    reference path, recomputing everything; both decide alike),
    objective (what Eq. 5 maximises over the batch apps: "normalised",
    the default, sums each app's predicted throughput relative to running
    alone at 100 % - IPC x SMs, i.e. T(100)/T(q) of its next task; "ipc"
    sums the predicted IPC as printed, which lets a compute-bound app's
    larger IPC starve a memory-bound one for good, and, with IPC per SM
    as our profiles measure it, does not even grow with the quota),
    learn_host (True: Eq. 3's T_pcie also counts the part of a query that
    is not its predicted device time - host work between kernels, launch
    and forwarding latency, interference - learnt from the latencies of the
    app's past queries (95th percentile over the last 32 of latency - T_p(q)
    - T_pcie(q) at the quota each got); the profiles' query times are device
    time only),
    qos_bw ("mean": a query's bandwidth in Eq. 4 is its tasks' time-weighted
    mean at its quota; "peak": their maximum), hysteresis (0.05: a new
    packing replaces the batch apps' current one only when its value is
    that much higher - each change moves apps between workers), cap_idle
    (False: the bandwidth cap of Eq. 4 binds only while a QoS query is in
    flight - it is there to protect queries, and between them a fluid
    memory system shares bandwidth without losing any; True: always).

    A batch app the knapsack gives 0 units is held: Decision(hold=True) at
    the quota it last had (so that holding moves nothing), released with
    its new quota when it gets units again."""

    def __init__(self, granularity: int = 10, bandwidth_cap: bool = True,
                 compensation: bool = True, device_bw_gbs: float = 3350.0, th: float = 0.9,
                 slack_frac: float = 0.1, predictor: Predictor | None = None,
                 models: str | Path | None = None, use_c: bool = True,
                 max_nodes: int = DEFAULT_MAX_NODES, fast: bool = True,
                 objective: str = "normalised", learn_host: bool = True, qos_bw: str = "mean",
                 hysteresis: float = 0.05, cap_idle: bool = False, queue: bool = True, **opts: Any):
        super().__init__(**opts)
        self.queue = bool(queue)
        self.cap_idle = bool(cap_idle)
        if qos_bw not in ("mean", "peak"):
            raise ValueError(f"qos_bw must be mean or peak, got {qos_bw!r}")
        self.qos_bw_mode, self.hysteresis = qos_bw, float(hysteresis)
        self.learn_host = bool(learn_host)
        if objective not in ("normalised", "ipc"):
            raise ValueError(f"objective must be normalised or ipc, got {objective!r}")
        self.objective = objective
        if not 1 <= granularity <= 100 or 100 % granularity:
            raise ValueError(f"granularity must divide 100, got {granularity}")
        self.g = int(granularity)
        self.n = 100 // self.g
        self.quotas = np.arange(1, self.n + 1, dtype=np.float64) * self.g
        self.bandwidth_cap, self.compensation = bool(bandwidth_cap), bool(compensation)
        self.device_bw, self.th, self.slack_frac = float(device_bw_gbs), float(th), float(slack_frac)
        self.use_c, self.max_nodes, self.fast = bool(use_c), int(max_nodes), bool(fast)
        if predictor is None and models is not None:
            predictor = ModelPredictor.from_dir(models)
        self.pred = predictor
        if self.pred is None:
            log.warning("claius: no predictor given: QoS queries run at 100 %, batch apps share "
                        "the device equally")
        self.qos: dict[int, QosApp] = {}
        self.batch: dict[int, BatchApp] = {}
        self.sent: dict[int, int] = {}          # slot -> quota last decided
        self.held: dict[int, bool] = {}         # slot -> hold last decided
        self.last_packing: Packing | None = None
        self._bm: BatchMats | None = None       # fast path
        self._dcache: dict[tuple[int, int, bool], Decision] = {}

    # --- helpers -------------------------------------------------------------
    def _units(self, q: int) -> int:
        return max(1, min(self.n, int(math.ceil(q / self.g))))

    def _qidx(self, q: int) -> int:
        return self._units(q) - 1

    def _emit(self, want: dict[int, tuple[int, bool]]) -> list[Decision]:
        """Decisions for the slots whose quota or hold changed."""
        out = []
        for slot, (q, hold) in sorted(want.items()):
            if self.sent.get(slot) != q or self.held.get(slot, False) != hold:
                self.sent[slot] = q
                self.held[slot] = hold
                if self.fast:               # Decisions are frozen: one object per value
                    d = self._dcache.get((slot, q, hold))
                    if d is None:
                        d = self._dcache[slot, q, hold] = Decision(slot, q, None, hold)
                    out.append(d)
                else:
                    out.append(Decision(slot, q, None, hold))
        return out

    def _plan_pred(self, a: QosApp) -> np.ndarray:
        """plan x quotas predicted task times of the current query (once per
        query; on the fast path once per plan)."""
        q = a.query
        assert q is not None
        if q.pred is None:
            pc = q.cache
            if pc is not None and pc.pred is not None:
                q.pred = pc.pred
                return q.pred
            assert self.pred is not None          # a plan is predicted only with a predictor
            rows = [self.pred.task_ms(a.info.name, t, self.quotas) for t in q.plan]
            q.pred = np.array(rows, dtype=np.float64).reshape(len(q.plan), self.n)
            if pc is not None:
                pc.pred = q.pred
        return q.pred

    def _rem_sum(self, a: QosApp, done: int) -> np.ndarray:
        """Predicted time of the plan's tasks from index done on, per quota."""
        assert a.query is not None
        pc = a.query.cache
        if pc is None:
            return self._plan_pred(a)[done:].sum(axis=0)
        r = pc.rem.get(done)
        if r is None:
            r = pc.rem[done] = self._plan_pred(a)[done:].sum(axis=0)
        return r

    def _plan_bw(self, a: QosApp) -> np.ndarray:
        """The query's bandwidth per quota: its tasks' peak (qos_bw="peak"), or
        their time-weighted mean (the default: the bytes it moves over the
        time it runs; a peak held for the whole query idles the batch apps
        through every query of a service with one memory-bound layer)."""
        assert self.pred is not None and a.query is not None
        m = np.array([self.pred.task_bw(a.info.name, t, self.quotas) for t in a.query.plan])
        if self.qos_bw_mode == "peak":
            return m.max(axis=0)
        t = np.maximum(self._plan_pred(a), 1e-12)
        return (m * t).sum(axis=0) / t.sum(axis=0)

    def _qos_bw(self, a: QosApp, quota: int) -> float:
        """Predicted bandwidth of the query's tasks at its quota (_plan_bw; 0 without a plan)."""
        if a.query is None or not a.query.plan or self.pred is None:
            return 0.0
        pc = a.query.cache
        if pc is not None:
            if pc.bw is None:
                try:
                    pc.bw = self._plan_bw(a)
                except (KeyError, ValueError) as e:
                    log.warning("claius: no bandwidth prediction for %s (%s): counting 0",
                                a.info.name, e)
                    pc.bw = np.zeros(self.n)
            return float(pc.bw[self._qidx(quota)])
        # keyed by the plan object itself (held, so its id cannot be reused)
        plan = a.query.plan
        if a.bw_cache is None or a.bw_cache[0] is not plan:
            try:
                a.bw_cache = (plan, self._plan_bw(a))
            except (KeyError, ValueError) as e:
                log.warning("claius: no bandwidth prediction for %s (%s): counting 0", a.info.name, e)
                a.bw_cache = (plan, np.zeros(self.n))
        return float(a.bw_cache[1][self._qidx(quota)])

    def _batch_preds(self, b: BatchApp, count: int = 1) -> bool:
        """Add b's last task to its recent ones and derive its knapsack curves
        from them; False when they moved by less than CURVE_RTOL (nothing to
        decide again).  A batch app issues tasks of several shapes in turn
        (lud: a one-block diagonal step, then a grid-wide update), so its
        next task is not its last one: the curves are time-weighted over
        the recent tasks, i.e. the app's speed (and bandwidth) at each quota.
        count: how many tasks like this one ran (the controller passes on one
        per kernel name every few ms and says how many it stands for)."""
        name = b.info.name
        assert self.pred is not None and b.task is not None   # on_task_done checked both
        try:
            t = np.asarray(self.pred.task_ms(name, b.task, self.quotas), dtype=np.float64)
            bw = np.asarray(self.pred.task_bw(name, b.task, self.quotas), dtype=np.float64)
            ipc = (np.asarray(self.pred.task_ipc(name, b.task, self.quotas), dtype=np.float64)
                   if self.objective == "ipc" else None)
        except (KeyError, ValueError) as e:
            log.warning("claius: no prediction for batch app %s (%s)", name, e)
            b.ipc = b.bw = None
            b.recent.clear()
            self._bm = None
            return True
        b.recent.append((np.maximum(t, 1e-12) * max(1, int(count)), bw, ipc))
        ts = np.array([r[0] for r in b.recent])     # device time of those tasks, per quota
        total = ts.sum(axis=0)
        if self.objective == "ipc":     # time-weighted IPC
            val = (np.array([r[2] for r in b.recent]) * ts).sum(axis=0) / total
        else:                           # T(100)/T(q): the app's speed relative to 100 %
            val = total[-1] / total
        bwv = (np.array([r[1] for r in b.recent]) * ts).sum(axis=0) / total
        val, bwv = np.concatenate(([0.0], val)), np.concatenate(([0.0], bwv))
        if (b.ipc is not None and b.bw is not None and len(b.ipc) == len(val)
                and np.allclose(val, b.ipc, rtol=CURVE_RTOL) and np.allclose(bwv, b.bw, rtol=CURVE_RTOL)):
            return False
        self.set_batch_curves(b.info.slot, val, bwv)
        return True

    def set_batch_curves(self, slot: int, ipc: np.ndarray, bw: np.ndarray) -> None:
        """A batch app's next task: its predicted IPC and bandwidth per unit
        count 0..N (index 0: not running, 0).  On the fast path the stacked
        knapsack input is updated here, on the task path, not at the next
        query's arrival."""
        b = self.batch[slot]
        b.ipc = np.asarray(ipc, dtype=np.float64)
        b.bw = np.asarray(bw, dtype=np.float64)
        bm = self._bm
        if bm is None or slot not in bm.slots or len(b.ipc) != self.n + 1 or len(b.bw) != self.n + 1:
            self._bm = None
            return
        j = bm.slots.index(slot)
        bm.V[j] = b.ipc
        bm.B[j] = b.bw
        bm.refs[j] = (b.ipc, b.bw)
        bm.cut.clear()

    def _stacked(self, known: list[BatchApp], free: int) -> tuple[np.ndarray, np.ndarray]:
        """The knapsack input over free units: the reference stacks the
        curves each time; the fast path keeps the stack and its slices."""
        # "known": every one has its curves
        ipcs = [cast(np.ndarray, b.ipc) for b in known]
        bws = [cast(np.ndarray, b.bw) for b in known]
        if not self.fast:
            return (np.stack([v[:free + 1] for v in ipcs]), np.stack([w[:free + 1] for w in bws]))
        bm = self._bm
        if bm is None or len(bm.refs) != len(known) or any(
                r[0] is not v or r[1] is not w for r, v, w in zip(bm.refs, ipcs, bws)):
            if any(len(v) != self.n + 1 or len(w) != self.n + 1 for v, w in zip(ipcs, bws)):
                self._bm = None
                return (np.stack([v[:free + 1] for v in ipcs]), np.stack([w[:free + 1] for w in bws]))
            bm = self._bm = BatchMats(tuple(b.info.slot for b in known), list(zip(ipcs, bws)),
                                      np.stack(ipcs), np.stack(bws))
        c = bm.cut.get(free)
        if c is None:
            c = bm.cut[free] = (np.ascontiguousarray(bm.V[:, :free + 1]),
                                np.ascontiguousarray(bm.B[:, :free + 1]))
        return c

    # --- QoS sharing (Eq. 7/8, slope) ---------------------------------------------
    def _remaining(self, a: QosApp) -> np.ndarray:
        """Predicted time of the query's tasks still to run, per quota: from
        its plan when it has one, else the whole query's curve."""
        q = a.query
        assert q is not None
        if q.plan:
            return self._rem_sum(a, len(q.measured))
        return q.curve

    def _qos_grants(self) -> dict[int, int]:
        """Units per QoS app with a query in flight."""
        live = [a for a in self.qos.values() if a.query is not None]
        claims = []
        for a in live:
            q = a.query
            assert q is not None
            need = self._units(q.quota)
            cls, slope, fn = 2, 0.0, None
            if self.pred is not None and not math.isinf(q.target_ms):
                rem = self._remaining(a)
                t_rest = q.target_ms - q.pcie_ms - sum(q.measured)
                cls = eq7_priority(float(rem[need - 1]), t_rest, self.slack_frac)
                slope = curve_slope(rem, need - 1)
                fn = (lambda r: lambda u: float(r[max(1, min(self.n, u)) - 1]))(rem)
            claims.append(Claim(a.info.slot, need, cls, slope, fn))
        grants = share_units(claims, self.n, self.th)
        if sum(c.need for c in claims) > self.n and log.isEnabledFor(logging.INFO):
            log.info("claius: QoS asks %d%% in all; shared by priority: %s",
                     sum(c.need for c in claims) * self.g,
                     ", ".join(f"slot {c.key} class {c.cls} slope {c.slope:.3g} ms "
                               f"{c.need * self.g}%->{grants[c.key] * self.g}%" for c in claims))
        return grants

    # --- batch packing -----------------------------------------------------------
    def _pack(self, free_units: int, qos_bw: float, use_cap: bool) -> dict[int, tuple[int, bool]]:
        """(quota, hold) per batch app: the knapsack over the free units; apps
        without predictions get one unit each first, to run and be seen; an
        app the knapsack gives nothing waits, held at the quota it had."""
        out: dict[int, tuple[int, bool]] = {}
        apps = sorted(self.batch.values(), key=lambda b: b.info.slot)
        if not apps:
            return out
        if self.pred is None:
            share = max(self.g, (free_units // len(apps)) * self.g)
            return {b.info.slot: (share, False) for b in apps}
        known = [b for b in apps if b.ipc is not None]
        for b in apps:
            if b.ipc is None:
                out[b.info.slot] = (self.g, False)
                free_units -= 1
        free_units = max(0, free_units)
        if known:
            val, bw = self._stacked(known, free_units)
            cap = self.device_bw - qos_bw
            if self.use_c:
                p = knapsack(val, bw, cap, use_cap, self.max_nodes)
            else:
                p = knapsack_py(val, bw, cap, use_cap, self.max_nodes)
            self.last_packing = p
            choice = self._keep_current(known, p, val, bw, cap, free_units, use_cap)
            if p.status == 2:
                log.warning("claius: QoS bandwidth %.0f GB/s leaves no room under %.0f GB/s: "
                            "batch apps wait", qos_bw, self.device_bw)
            elif p.status == 1:
                log.warning("claius: knapsack stopped at %d nodes: best packing so far", p.nodes)
            for b, k in zip(known, choice):
                # k = 0: the app's next task waits in the ready pool
                out[b.info.slot] = (k * self.g, False) if k > 0 else \
                    (self.sent.get(b.info.slot, self.g), True)
        return out

    def _keep_current(self, known: list[BatchApp], p: Packing, val: np.ndarray, bw: np.ndarray,
                      cap: float, free_units: int, use_cap: bool) -> list[int]:
        """The batch apps' current units when they still fit (units, and the
        bandwidth cap) and are worth at least (1 - hysteresis) of the new
        packing's value; else the new packing."""
        cur = [0 if self.held.get(b.info.slot, False) or b.info.slot not in self.sent
               else self._units(self.sent[b.info.slot]) for b in known]
        if cur == list(p.choice) or sum(cur) > free_units or self.hysteresis <= 0:
            return list(p.choice)
        rows = range(len(known))
        if use_cap and sum(bw[i, cur[i]] for i in rows) > cap + 1e-9:
            return list(p.choice)
        if sum(val[i, cur[i]] for i in rows) >= (1 - self.hysteresis) * p.value:
            return cur
        return list(p.choice)

    def _decide(self) -> list[Decision]:
        """The whole allocation: QoS grants, then the knapsack over what is left."""
        grants = self._qos_grants()
        want: dict[int, tuple[int, bool]] = {}
        qos_bw = 0.0
        for slot, u in grants.items():
            a = self.qos[slot]
            want[slot] = (u * self.g, False)
            qos_bw += self._qos_bw(a, u * self.g)
        free = self.n - sum(grants.values())
        # the cap protects QoS queries from the batch apps' memory traffic:
        # with none in flight there is nothing to protect (cap_idle=False)
        use_cap = self.bandwidth_cap and (bool(grants) or self.cap_idle)
        want.update(self._pack(free, qos_bw if self.bandwidth_cap else 0.0, use_cap))
        return self._emit(want)

    # --- hooks ---------------------------------------------------------------------
    def wants_tasks(self, app: AppInfo) -> bool:
        """QoS tasks drive lag compensation and the next query's plan; a
        batch app's task gives the knapsack its next predictions.  Without a
        predictor none of it changes a decision."""
        return self.pred is not None

    def fwd_window(self, app: AppInfo) -> int | None:
        """Batch tasks wait in the ready pool (the app), not in a worker's
        queue: a new packing or a hold reaches the next task at once."""
        return BATCH_WINDOW if app.cls == "batch" else None

    def on_register(self, app: AppInfo) -> list[Decision]:
        if app.cls == "qos":
            self.qos[app.slot] = QosApp(app)
            return self._emit({app.slot: (100, False)})
        b = self.batch[app.slot] = BatchApp(app)
        self._prior(b)
        return self._decide()

    def _prior(self, b: BatchApp) -> None:
        """A batch app's curves before its first task ends: from a task named
        after the app (its profiled run as a whole, as static-optimal reads
        it), when the predictor knows one.  Without it the app gets one unit
        until a task of its ends, which starves an app whose tasks outlast
        the run at one unit (myocyte: 6.5 s per kernel at 100 % on the
        x1000 device)."""
        if self.pred is None or not knows_whole_app(self.pred, b.info.name):
            return                          # trained models know kernels, not apps
        from predictors.schema import task_row
        b.task = task_row(b.info.name, 0.0)
        self._batch_preds(b)

    def on_exit(self, app: AppInfo) -> list[Decision]:
        self.qos.pop(app.slot, None)
        self.batch.pop(app.slot, None)
        self.sent.pop(app.slot, None)
        self.held.pop(app.slot, None)
        self._bm = None
        return self._decide()

    def on_query_begin(self, app: AppInfo, info: QueryEvent) -> list[Decision]:
        a = self.qos.get(app.slot)
        if a is None:
            return []
        target = info.qos_ms or app.qos_ms
        if target is not None and self.queue:
            target = info.target_left_ms(target)
        size = float(info.size or 0)
        plan = list(info.tasks or a.last_plan)
        cache = None
        if self.fast:
            if a.pcache is None or a.pcache.plan != plan:
                a.pcache = PlanCache(plan)
            cache = a.pcache
            plan = cache.plan
        a.seen = []
        q0, pcie, curve = 100, 0.0, np.zeros(self.n)
        if target is None:
            log.info("claius: %s has no latency target: its query runs at 100 %%", app.name)
            target = math.inf
        elif self.pred is not None:
            try:
                t = self.pred.query_ms(app.name, size, self.quotas)
                pc = self.pred.pcie_ms(app.name, size, self.quotas)
            except (KeyError, ValueError) as e:
                log.warning("claius: no query prediction for %s (%s): 100 %%", app.name, e)
            else:
                pc = np.asarray(pc, dtype=np.float64) + a.host_ms
                q = eq3_quota(t, self.quotas, target, pc)
                if q is None:
                    log.warning("claius: %s query %s (size %g): no quota meets %.3g ms "
                                "(%.3g ms + %.3g ms PCIe and host at 100 %%): 100 %%", app.name,
                                info.id, size, target, t[-1], pc[-1])
                    q = 100
                q0, pcie, curve = q, float(pc[self._qidx(q)]), np.asarray(t, dtype=np.float64)
        a.query = QueryState(int(info.id), float(info.t_us or 0.0), float(target),
                             pcie, q0, curve, q0, plan, cache=cache,
                             host_ms=a.host_ms if curve.any() else 0.0)
        return self._decide()

    def on_task_done(self, app: AppInfo, task: TaskDone) -> list[Decision]:
        b = self.batch.get(app.slot)
        if b is not None:
            feats = task.features
            if feats is None or self.pred is None:
                return []
            b.task = feats
            if not self._batch_preds(b, int(task.count or 1)):
                return []
            return self._decide()
        a = self.qos.get(app.slot)
        if a is None:
            return []
        tq = task.query
        if a.query is None or (tq is not None and tq != a.query.id):
            # a task reported after its query ended (the feed lags the query
            # boundaries): it completes that query's plan, and no other's
            if tq is not None and tq == a.last_qid and task.features is not None:
                base = [] if a.late_restarts else a.last_plan
                a.last_plan, a.late_restarts = base + [task.features], False
            return []
        q = a.query
        assert q is not None
        if task.features is not None:
            a.seen.append(task.features)
        i = len(q.measured)
        q.measured.append(float(task.duration_us or 0.0) / 1000.0)
        if self.pred is None or not q.plan or i >= len(q.plan) or math.isinf(q.target_ms):
            return []
        pred = self._plan_pred(a)
        ran_at = int(task.quota_pct or self.sent.get(app.slot, q.quota))   # the quota it ran at
        q.predicted.append(float(pred[i, self._qidx(ran_at)]))
        if not self.compensation:
            return []
        return self._compensate(a)

    def _compensate(self, a: QosApp) -> list[Decision]:
        """Lag compensation after a task: Eq. 6 when behind, rollback to Eq. 3's
        quota once that quota is enough again."""
        q = a.query
        assert q is not None
        done = len(q.measured)
        rem = self._rem_sum(a, done)
        spent = sum(q.measured)
        lag = lag_ms(q.measured, q.predicted)
        name = a.info.name
        budget = q.target_ms - q.pcie_ms
        if q.compensated:
            if spent + rem[self._qidx(q.default_q)] <= budget:
                log.info("claius: %s query %d back on schedule after %d/%d tasks (spent %.3f ms, "
                         "remaining %.3f ms at %d%%, budget %.3f ms): rollback %d%% -> %d%%",
                         name, q.id, done, len(q.plan), spent, rem[self._qidx(q.default_q)],
                         q.default_q, budget, q.quota, q.default_q)
                q.quota, q.compensated = q.default_q, False
                return self._decide()
        if lag <= 0:
            return []
        new = eq6_quota(spent, rem, self.quotas, q.target_ms, q.pcie_ms)
        if new is None:
            log.warning("claius: %s query %d lags %.3f ms and no quota catches up "
                        "(remaining %.3f ms at 100 %%, %.3f ms left): 100 %%",
                        name, q.id, lag, rem[-1], budget - spent)
            new = 100
        if new <= q.quota:
            return []
        log.info("claius: %s query %d lags %.3f ms after %d/%d tasks (measured %.3f ms, "
                 "predicted %.3f ms): %d%% -> %d%% (remaining %.3f ms there, %.3f ms left)",
                 name, q.id, lag, done, len(q.plan), spent, sum(q.predicted), q.quota, new,
                 rem[self._qidx(new)], budget - spent)
        q.quota, q.compensated = new, True
        return self._decide()

    def on_query_end(self, app: AppInfo, info: QueryEvent) -> list[Decision]:
        a = self.qos.get(app.slot)
        if a is None or a.query is None:
            return []
        if a.seen:
            a.last_plan = a.seen            # the next query's plan: this query's tasks
        a.late_restarts = not a.seen        # its tasks are all late: they replace the plan
        a.seen = []
        q, a.query = a.query, None
        a.last_qid = q.id
        end_us = info.t_us
        if self.learn_host and end_us is not None and q.arrival_us and not math.isinf(q.target_ms) \
                and q.curve.any():
            lat = (float(end_us) - q.arrival_us) / 1000.0
            # at Eq. 3's quota: a compensated query ran partly faster, which
            # can only understate the host time, never feed it back upwards
            a.extras.append(max(0.0, lat - float(q.curve[self._qidx(q.default_q)])
                                - (q.pcie_ms - q.host_ms)))
            a.host_ms = float(np.percentile(a.extras, HOST_PCT))
        return self._decide()


@register_policy("claius-nb")
class CLaiusNB(CLaius):
    """C-Laius-NB: the knapsack without the memory-bandwidth cap (ablation)."""

    def __init__(self, **opts: Any):
        super().__init__(**{**opts, "bandwidth_cap": False})


@register_policy("claius-nc")
class CLaiusNC(CLaius):
    """C-Laius-NC: no progress-aware lag compensation (ablation)."""

    def __init__(self, **opts: Any):
        super().__init__(**{**opts, "compensation": False})
