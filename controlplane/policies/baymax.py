"""baymax: time sharing at 100 % with QoS-headroom admission of batch tasks.

The paper (Chen et al., Baymax, ASPLOS'16), as the issue summarises it:
every application runs on the whole GPU, kernels are time-shared; Baymax
predicts the duration of each task, reserves time for the QoS queries, and
issues a batch task only if it fits the QoS query's headroom, else blocks it.

Our rule, with every app at quota 100 and local (route 0): each app is a
context of its own, as on the paper's GPU without MPS, so the device
time-slices them.  (Routing them to a 100 % pool worker would make them one
context whose kernels run side by side: MPS at 100 %, not Baymax.)
The batch apps time-share the device among themselves too: one at a time,
for time_slice_ms each in slot order (default 20; 0 lets them all run at
once, which is MPS at 100 %, not time sharing); the others are held.  The
one whose slice it is runs under the headroom rule:

    while a QoS query Q is in flight, batch app b may issue its next task iff
        spent(Q) + remaining(Q) + sum of next(b') for the batch apps already
        released, b' before b in slot order, + next(b)  <=  T_tgt(Q) - T_pcie(Q)
    for every query in flight; otherwise b is held (Decision(hold=True))
    until the query ends or the inequality holds again.  With no query in
    flight the batch app whose slice it is runs.

  remaining(Q)  predicted time of Q's tasks still to run at 100 %: the sum
                of task_ms(task, 100) over its plan (the query's "tasks", else
                the previous query's tasks) minus those done; without a plan,
                query_ms(size, 100) less the predicted time of what is done
                (its measured time, as the plan is unknown).
  T_pcie(Q)     pcie_ms(size, 100); 0 without a predictor.
  spent(Q)      device time already charged to Q on the time-shared GPU:
                the measured durations of the tasks completed since Q began,
                Q's own and the batch apps' (they run serially with Q's).
  next(b)       predicted duration at 100 % of b's next task, taken to be
                like its last completed one (on_task_done's features); the
                measured duration when there is no predictor or it does not
                know the task.  A batch app with no task seen yet counts as
                too long: it waits while a query is in flight.

Without a predictor a query's device time is the last query's measured
total (sum of its task durations); the first query, unknown, holds every
batch app while it runs.  The check runs at every event (query begin/end,
each completed task), so a released app may issue a few tasks before the
next event holds it: admission per event, not per launch.

A query that waited before it began (QueryEvent.queued_us, when the caller
knows it) has that much less of its target left: T_tgt(Q) above is the
target less its wait (queue=false: the whole target, as the paper states it).

Options: predictor (a Predictor, as claius) or models (a directory of saved
models), time_slice_ms, clock (seconds; tests and the simulator pass
theirs), queue; device time units are ms.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from controlplane.policies.base import AppInfo, Decision, Policy, QueryEvent, TaskDone, register_policy
from controlplane.policies.predict import ModelPredictor, Predictor, Row

log = logging.getLogger("colocate.baymax")

Q100 = np.array([100.0])
BATCH_WINDOW = 1           # a batch task is issued when the previous one is done (per-task admission)


@dataclass
class Query:
    id: int
    target_ms: float
    pcie_ms: float
    plan_ms: list[float] | None            # predicted ms at 100 % per planned task
    total_ms: float                        # predicted device time at 100 % (no plan)
    done: int = 0                          # own tasks completed
    own_ms: float = 0.0                    # their measured time
    spent_ms: float = 0.0                  # all device time charged since it began

    def remaining_ms(self) -> float:
        if self.plan_ms is not None:
            return float(sum(self.plan_ms[self.done:]))
        return max(0.0, self.total_ms - self.own_ms)


@dataclass
class Service:
    info: AppInfo
    query: Query | None = None
    last_plan: list[Row] = field(default_factory=list)
    seen: list[Row] = field(default_factory=list)
    last_total_ms: float | None = None     # measured, for the no-predictor case


@dataclass
class Batch:
    info: AppInfo
    next_ms: float | None = None           # predicted duration of its next task


@register_policy("baymax")
class Baymax(Policy):
    def __init__(self, predictor: Predictor | None = None, models: str | Path | None = None,
                 time_slice_ms: float = 20.0, clock: Callable[[], float] = time.monotonic,
                 queue: bool = True, **opts: Any):
        super().__init__(**opts)           # granularity etc.: irrelevant, all run at 100 %
        self.queue = bool(queue)
        if predictor is None and models is not None:
            predictor = ModelPredictor.from_dir(models)
        self.pred = predictor
        if time_slice_ms < 0:
            raise ValueError(f"time_slice_ms must be >= 0, got {time_slice_ms}")
        self.slice_s, self.clock = float(time_slice_ms) / 1000.0, clock
        self.turn: int | None = None       # the batch app whose time slice it is
        self.turn_t = 0.0
        self.qos: dict[int, Service] = {}
        self.batch: dict[int, Batch] = {}
        self.held: dict[int, bool] = {}    # slot -> hold last sent

    def wants_tasks(self, app: AppInfo) -> bool:
        return True                        # QoS progress and batch task lengths

    def fwd_window(self, app: AppInfo) -> int | None:
        """Baymax issues a batch task only when it fits: the app's launches
        wait in the app, not by the thousand in a worker's queue."""
        return BATCH_WINDOW if app.cls == "batch" else None

    # --- predictions ---------------------------------------------------------
    def _task_ms(self, app: AppInfo, feats: Row | None) -> float | None:
        if self.pred is None or feats is None:
            return None
        try:
            return float(self.pred.task_ms(app.name, feats, Q100)[0])
        except (KeyError, ValueError) as e:
            log.debug("baymax: no task prediction for %s (%s)", app.name, e)
            return None

    def _query(self, s: Service, info: QueryEvent) -> Query:
        target = info.qos_ms or s.info.qos_ms
        size = float(info.size or 0)
        plan = list(info.tasks or s.last_plan)
        qid = int(info.id)
        if target is None:
            target = math.inf
        elif self.queue:
            target = info.target_left_ms(target)
        pcie, total, plan_ms = 0.0, math.inf, None
        if self.pred is not None:
            try:
                total = float(self.pred.query_ms(s.info.name, size, Q100)[0])
                pcie = float(self.pred.pcie_ms(s.info.name, size, Q100)[0])
            except (KeyError, ValueError) as e:
                log.warning("baymax: no query prediction for %s (%s)", s.info.name, e)
            if plan:
                ms = [self._task_ms(s.info, t) for t in plan]
                known = [m for m in ms if m is not None]
                if len(known) == len(ms):
                    plan_ms = known
        elif s.last_total_ms is not None:
            total = s.last_total_ms
        return Query(qid, float(target), pcie, plan_ms, total)

    # --- the rule --------------------------------------------------------------
    def _rotate(self) -> None:
        """Time sharing between the batch apps: one at a time, each for
        time_slice_ms, in slot order (0: no slices, all at once)."""
        if not self.slice_s or not self.batch:
            self.turn = None
            return
        now = self.clock()
        if self.turn in self.batch and now - self.turn_t < self.slice_s:
            return
        order = sorted(self.batch)
        nxt = [s for s in order if self.turn is None or s > self.turn]
        self.turn, self.turn_t = (nxt or order)[0], now

    def _holds(self) -> dict[int, bool]:
        live = [s.query for s in self.qos.values() if s.query is not None]
        out: dict[int, bool] = {}
        used = 0.0                         # released batch tasks, ms
        self._rotate()
        for slot in sorted(self.batch):
            b = self.batch[slot]
            if self.turn is not None and slot != self.turn:
                out[slot] = True           # not its time slice
                continue
            if not live:
                out[slot] = False
                continue
            nxt = b.next_ms
            fits = nxt is not None and all(
                q.spent_ms + q.remaining_ms() + used + nxt <= q.target_ms - q.pcie_ms for q in live)
            out[slot] = not fits
            if nxt is not None and fits:
                used += nxt
        return out

    def _decide(self) -> list[Decision]:
        want = {slot: False for slot in self.qos}
        want.update(self._holds())
        out = []
        for slot, hold in sorted(want.items()):
            if self.held.get(slot) != hold:
                self.held[slot] = hold
                out.append(Decision(slot, 100, 0, hold))
        if out and log.isEnabledFor(logging.INFO):
            for s in self.qos.values():
                q = s.query
                if q is not None:
                    log.info("baymax: %s query %d: spent %.3f ms + remaining %.3f ms of %.3f ms "
                             "(target - PCIe); held: %s", s.info.name, q.id, q.spent_ms,
                             q.remaining_ms(), q.target_ms - q.pcie_ms,
                             ", ".join(self.batch[d.slot].info.name for d in out
                                       if d.hold and d.slot in self.batch) or "none")
        return out

    # --- hooks -------------------------------------------------------------------
    def on_register(self, app: AppInfo) -> list[Decision]:
        if app.cls == "qos":
            self.qos[app.slot] = Service(app)
        else:
            self.batch[app.slot] = Batch(app)
        return self._decide()

    def on_exit(self, app: AppInfo) -> list[Decision]:
        self.qos.pop(app.slot, None)
        self.batch.pop(app.slot, None)
        self.held.pop(app.slot, None)
        return self._decide()

    def on_query_begin(self, app: AppInfo, info: QueryEvent) -> list[Decision]:
        s = self.qos.get(app.slot)
        if s is None:
            return []
        s.seen = []
        s.query = self._query(s, info)
        return self._decide()

    def on_query_end(self, app: AppInfo, info: QueryEvent) -> list[Decision]:
        s = self.qos.get(app.slot)
        if s is None or s.query is None:
            return []
        if s.seen:
            s.last_plan = s.seen
        if s.query.done:
            s.last_total_ms = s.query.own_ms
        s.seen = []
        s.query = None
        return self._decide()

    def on_task_done(self, app: AppInfo, task: TaskDone) -> list[Decision]:
        dur_ms = float(task.duration_us or 0.0) / 1000.0
        # a batch report may stand for several tasks (the controller passes
        # on one per kernel every few ms): all their time was device time
        total_ms = float(task.total_us or task.duration_us or 0.0) / 1000.0
        feats = task.features
        s = self.qos.get(app.slot)
        if s is not None:
            tq = task.query
            if s.query is None or (tq is not None and tq != s.query.id):
                return []                  # late: its query has ended
            if feats is not None:
                s.seen.append(feats)
            s.query.done += 1
            s.query.own_ms += dur_ms
        else:
            b = self.batch.get(app.slot)
            if b is None:
                return []
            pred = self._task_ms(app, feats)
            b.next_ms = pred if pred is not None else dur_ms
        for other in self.qos.values():     # the device time it took, on a time-shared GPU
            if other.query is not None:
                other.query.spent_ms += total_ms if s is None else dur_ms
        return self._decide()

    def on_tick(self, now_s: float) -> list[Decision]:
        return self._decide()               # a slice may have ended with no task to say so
