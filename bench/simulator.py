"""The co-location simulator: apps replayed from task traces on simgpu's own
device-model engine, in virtual time, under the very Policy objects the live
controller runs.

    dev = Device(default_params(mps=True, slowdown=1000))
    sim = Simulator(make_policy("claius", predictor=EnginePredictor(dev.params, wls)),
                    dev, [service, batch1], Arrivals("poisson", rate=10, seed=1), horizon_s=30)
    res = sim.run()          # p99, violations, batch iterations/s, events

What is modelled, and how it maps onto a live run under the shim:
  device      shim/devmodel.Device: engine.c, the code simgpu's live device
              runs (through cffi), so the two cannot drift.  A task is
              admitted with the SMs its app's quota allows at that moment
              (MPS: a process's percentage applies to the kernels it launches;
              a route change reaches the next launch).
  batch app   one stream (the traces' stream numbers are not kept apart:
              tasks run in issue order), its iteration's tasks looped: a task is issued
              gap_us after the previous issue (after the previous task's end
              when the trace says the host synchronised), and reaches the
              device no earlier than its predecessor's end (stream order).
              Throughput: iterations per simulated second.
  service     queries arrive by a seeded process (fixed, Poisson, diurnal,
              replayed times) into a FIFO; one query at a time, its tasks as
              recorded for its size.  Latency: end of its last task minus its
              arrival (the client's view, queueing included; the host work
              after its last task, the trace's tail_us, is not added).
  other ops   device-to-device copies and memsets take bytes / bandwidth
              beside the engine, as the live simgpu charges them.
  policy      on_register at t=0; on_query_begin when a query starts (with
              its task rows: the simulator knows the plan); on_task_done for
              every QoS task and, for batch apps, per kernel name at most
              every FEED_S (count > 1, as the shim's feed); on_query_end;
              on_tick every tick_s.  Decisions apply at once (a route change
              costs ~0.2 ms live, bench/RESULTS.md: not modelled).  Baymax's
              clock is the simulation's.

Deterministic for a seed: the only randomness is the arrival process.
"""
from __future__ import annotations

import collections
import heapq
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from controlplane.policies.base import AppInfo, Decision, Policy, QueryEvent, TaskDone
from predictors.profile import CLOCK_HZ, WARP  # the profile's IPC: its cycles and flops per instruction
from predictors.schema import task_row
from shim.ctlblock import part_span_sms, part_starts
from shim.devmodel import D2H, H2D, KERNEL, Device, quota_sms, solo

FEED_S = 0.005              # a batch app's task feed: per kernel name at most this often
COPY_KINDS = ("h2d", "d2h")
ENGINE_KIND = {"kernel": KERNEL, "h2d": H2D, "d2h": D2H}
HOLD_S = 2e-3               # without MPS, a context with its next kernel queued keeps the
                            # device this long (model.c: the executor's 2 ms wake-up)


# --- workloads ------------------------------------------------------------------

@dataclass(frozen=True)
class SimTask:
    """One device task of a trace: a kernel or a copy."""
    kind: str                       # "kernel" | "h2d" | "d2h" | "d2d" | "memset"
    name: str
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    regs: float = 0.0
    smem: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    gap_s: float = 0.0              # host time since the previous task's issue
    sync: bool = False              # the host waited for the device before issuing it

    @property
    def blocks(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass
class Workload:
    """An app as the simulator replays it."""
    name: str
    cls: str                                    # "batch" | "qos"
    iteration: list[SimTask] = field(default_factory=list)           # batch
    queries: dict[int, list[SimTask]] = field(default_factory=dict)  # qos: size -> tasks
    qos_ms: float | None = None
    input_bytes: float = 0.0

    def tasks_of(self, size: int | None = None) -> list[SimTask]:
        return self.iteration if self.cls == "batch" else self.queries[int(size or 0)]


def local_s(t: SimTask, params: Any) -> float:
    """A device-to-device copy or a memset: bytes at the device's bandwidth,
    as the live simgpu charges them (exec.c), outside the engine (they do
    not compete with kernels there either)."""
    return t.bytes / params.bw if params.bw > 0 else 0.0


# --- arrivals -------------------------------------------------------------------

class Arrivals:
    """Query arrival times of one service: fixed (every 1/rate s), poisson,
    diurnal (Poisson whose rate swings by `amp` over `period_s`, by
    thinning) or replay (the given times).  Seeded: the same seed, the same
    times."""

    def __init__(self, kind: str = "poisson", rate: float = 10.0, seed: int = 1,
                 amp: float = 0.5, period_s: float = 60.0, times: Sequence[float] = ()):
        if kind not in ("fixed", "poisson", "diurnal", "replay"):
            raise ValueError(f"unknown arrival process {kind!r} (fixed, poisson, diurnal, replay)")
        if kind != "replay" and not rate > 0:
            raise ValueError(f"arrival rate must be > 0, got {rate}")
        self.kind, self.rate, self.seed = kind, float(rate), int(seed)
        self.amp, self.period_s, self.times = float(amp), float(period_s), list(times)

    def until(self, horizon_s: float) -> Iterator[float]:
        rng = random.Random(self.seed)
        if self.kind == "replay":
            yield from (t for t in sorted(self.times) if t < horizon_s)
            return
        t = 0.0
        peak = self.rate * (1 + self.amp)
        while True:
            if self.kind == "fixed":
                t += 1.0 / self.rate
            elif self.kind == "poisson":
                t += rng.expovariate(self.rate)
            else:
                t += rng.expovariate(peak)
                want = self.rate * (1 + self.amp * math.sin(2 * math.pi * t / self.period_s))
                if rng.random() * peak > want:
                    continue
            if t >= horizon_s:
                return
            yield t


# --- the predictor the policies get ---------------------------------------------

class EnginePredictor:
    """The Predictor protocol (controlplane/policies/predict.py) answered by
    the device model itself: a task's time at quota q is the engine's time
    for it alone at q's SMs.  What a timing-only profile of the same task
    on simgpu measures, without running the program (it is the model's own
    answer, so these predictions are exact for a task alone and blind to
    co-runners, as the paper's per-task models are).  Rows carry "_sim":
    (app, index) into the workloads' tasks; a row named after a batch app
    stands for its whole iteration (static-optimal asks so)."""

    def __init__(self, params: Any, workloads: Sequence[Workload], whole_apps: bool = True):
        self.params = params
        self.wl = {w.name: w for w in workloads}
        self.whole_apps = bool(whole_apps)     # False: as trained kernel models (live)
        self._cache: dict[tuple[str, Any, int], tuple[float, float, float]] = {}

    def whole_app(self, app: str) -> bool:
        """A row named after a batch app is its whole iteration (Predictor's
        optional whole_app)."""
        return self.whole_apps and app in self.wl and self.wl[app].cls == "batch"

    def _solo(self, t: SimTask, q: float) -> float:
        if t.kind not in ENGINE_KIND:
            return local_s(t, self.params)
        sms = quota_sms(q, int(self.params.sms)) if t.kind == "kernel" else 1
        return solo(self.params, ENGINE_KIND[t.kind], t.blocks, t.threads, t.regs, t.smem, t.flops,
                    t.bytes, sms)

    def _task(self, app: str, row: Mapping[str, Any]) -> list[SimTask]:
        ref = row.get("_sim")
        if ref is not None:
            size, i = ref
            return [self.wl[app].tasks_of(size)[i]]
        if row.get("task") == app and app in self.wl:
            return self.wl[app].iteration
        raise KeyError(f"no task {row.get('task')!r} of {app!r} in the simulation")

    def _figures(self, app: str, tasks: Sequence[SimTask], key: Any, q: float) -> tuple[float, float, float]:
        k = (app, key, int(q))
        if k not in self._cache:
            dur = sum(self._solo(t, q) for t in tasks)
            byt = sum(t.bytes for t in tasks)
            ipc = sum(t.flops for t in tasks) / WARP / (dur * CLOCK_HZ) if dur > 0 else 0.0
            self._cache[k] = (dur, byt / dur / 1e9 if dur > 0 else 0.0, ipc)
        return self._cache[k]

    def _each(self, app: str, row: Mapping[str, Any], quotas: np.ndarray, j: int) -> np.ndarray:
        tasks = self._task(app, row)
        key = row.get("_sim") or ("iteration",)
        return np.array([self._figures(app, tasks, key, float(q))[j] for q in quotas])

    def task_ms(self, app: str, task: Mapping[str, Any], quotas: np.ndarray) -> np.ndarray:
        return self._each(app, task, quotas, 0) * 1e3

    def task_bw(self, app: str, task: Mapping[str, Any], quotas: np.ndarray) -> np.ndarray:
        return self._each(app, task, quotas, 1)

    def task_ipc(self, app: str, task: Mapping[str, Any], quotas: np.ndarray) -> np.ndarray:
        return self._each(app, task, quotas, 2)

    def _query(self, app: str, size: float, quotas: np.ndarray, copies: bool) -> np.ndarray:
        w = self.wl[app]
        sz = int(size) if int(size) in w.queries else min(w.queries, key=lambda s: abs(s - size))
        tasks = [t for t in w.queries[sz] if (t.kind in COPY_KINDS) == copies]
        return np.array([self._figures(app, tasks, ("query", sz, copies), float(q))[0]
                         for q in quotas]) * 1e3

    def query_ms(self, app: str, input_size: float, quotas: np.ndarray) -> np.ndarray:
        return self._query(app, input_size, quotas, copies=False)

    def pcie_ms(self, app: str, input_size: float, quotas: np.ndarray) -> np.ndarray:
        return self._query(app, input_size, quotas, copies=True)


# --- the simulation -------------------------------------------------------------

@dataclass
class AppState:
    info: AppInfo
    wl: Workload
    ctx: int
    quota: int = 100
    held: bool = False
    tasks: list[SimTask] = field(default_factory=list)    # what runs now (iteration, query)
    pos: int = 0                         # next task to issue
    issue_t: float = 0.0                 # host time of the last issue
    next_issue: float = 0.0              # host time of the next task's issue (planned)
    held_at: float = -1.0                # when the last hold began
    released_at: float = -1.0            # ... and ended
    prev_end: float = 0.0                # device end of the last task
    running: int | None = None           # engine entry of the task on the device (-1: local)
    local_end: float = 0.0               # when a task beside the engine ends
    run_quota: int = 100
    admit_at: float | None = None        # an admission is scheduled
    iterations: float = 0.0
    tasks_done: int = 0
    fed: dict[str, float] = field(default_factory=dict)   # name -> last feed time
    unfed: dict[str, tuple[int, float]] = field(default_factory=dict)
    # qos
    queue: collections.deque = field(default_factory=collections.deque)  # (id, arrival, size), FIFO
    query: tuple[int, float, int] | None = None
    latencies: list[float] = field(default_factory=list)
    quota_trace: list[tuple[float, int]] = field(default_factory=list)


@dataclass
class SimResult:
    policy: str
    horizon_s: float
    latencies_ms: dict[str, list[float]]
    qos_ms: dict[str, float]
    iterations_per_s: dict[str, float]
    events: int
    wall_s: float
    quota_trace: dict[str, list[tuple[float, int]]]

    def p99_ms(self, app: str, warmup: int = 0) -> float | None:
        lat = self.latencies_ms[app][warmup:]
        return float(np.percentile(lat, 99)) if lat else None

    def violated(self, app: str, warmup: int = 0) -> bool:
        p = self.p99_ms(app, warmup)
        return p is None or p > self.qos_ms[app]


# SMs per partition on the simulated device: sm_90's (simgpu's green contexts
# give the H100 preset's 132 SMs out in multiples of 8, shim/simgpu/driver/green.c)
PARTITION_GRAN = 8


class Simulator:
    """One co-location run in virtual time; see the module docstring."""

    def __init__(self, policy: Policy, device: Device, workloads: Sequence[Workload],
                 arrivals: Arrivals | Mapping[str, Arrivals] | None = None, horizon_s: float = 30.0,
                 tick_s: float = 0.01, sizes: Mapping[str, Sequence[int]] | None = None, seed: int = 1,
                 report_queue: bool = True, route: str = "pool"):
        """route: how a quota becomes SMs on the device, as `serve --route`:
        "pool" (an MPS percentage: quota_sms) or "partition" (an SM partition
        inside the app: its span where the controller places it, in groups
        of PARTITION_GRAN SMs, cb_part_span; all SMs at 100 %).  The policies' predictions are untouched, as live."""
        if not workloads:
            raise ValueError("nothing to simulate: no workloads")
        if route not in ("pool", "partition"):
            raise ValueError(f"route must be pool or partition, not {route!r}")
        self.route = route
        self.policy, self.dev, self.horizon = policy, device, float(horizon_s)
        self.tick_s, self.now, self.seed = float(tick_s), 0.0, int(seed)
        self.report_queue = bool(report_queue)     # False: as live apps (queued_us None)
        self.apps: list[AppState] = []
        for i, w in enumerate(workloads):
            info = AppInfo(slot=i, pid=10_000 + i, name=w.name, cls=w.cls, qos_ms=w.qos_ms, device="sim")
            self.apps.append(AppState(info, w, ctx=i))
        self._heap: list[tuple[float, int, str, int, int]] = []
        self._seq = 0
        self._rng = random.Random(seed)
        arr = arrivals if isinstance(arrivals, Mapping) else {
            a.wl.name: arrivals or Arrivals(seed=seed) for a in self.apps if a.wl.cls == "qos"}
        self._arrivals: dict[int, tuple[int, float, int]] = {}
        qid = 1
        for a in self.apps:
            if a.wl.cls != "qos":
                continue
            pick = list((sizes or {}).get(a.wl.name) or sorted(a.wl.queries))
            for t in arr[a.wl.name].until(self.horizon):
                self._arrivals[qid] = (qid, t, pick[self._rng.randrange(len(pick))])
                self._push(t, "arrive", a.info.slot, qid)
                qid += 1

    # --- the event queue ---
    def _push(self, t: float, kind: str, slot: int, arg: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, slot, arg))

    # --- policy plumbing ---
    def _apply(self, decisions: Sequence[Decision]) -> None:
        for d in decisions:
            a = self.apps[d.slot]
            a.quota = max(1, min(100, int(d.quota_pct)))
            a.quota_trace.append((self.now, a.quota))
            was = a.held
            a.held = bool(d.hold)
            if a.held and not was:
                a.held_at = self.now
            if was and not a.held:
                a.released_at = self.now
                self._schedule(a)

    def _row(self, a: AppState, size: int | None, i: int, t: SimTask, occurrence: int = 0) -> dict[str, Any]:
        row = task_row(t.name, a.wl.input_bytes, t.grid, t.block, t.smem, a.quota, occurrence=occurrence)
        row["_sim"] = (size, i)
        return row

    # --- issuing tasks ---
    def _sms(self, a: AppState) -> int:
        """The SMs a kernel of app a may use (see route): its quota's span
        where the controller would place it (part_starts), as the shim
        rounds it."""
        sms = int(self.dev.params.sms)
        if self.route != "partition":
            return quota_sms(a.quota, sms)
        if a.quota >= 100:
            return sms
        # a held app's tasks issued before the hold still run (on its last span)
        on = [(b.info.cls == "qos", b.info.slot, b.quota) for b in self.apps
              if b.quota < 100 and (not b.held or b is a)]
        return part_span_sms(part_starts(on)[a.info.slot], a.quota, sms, PARTITION_GRAN)[1]

    def _issue(self, a: AppState) -> float:
        """Host time of a's next launch.  A hold stops the host in its launch
        call (the shim's hold), not the launches it made before: a task
        issued before the hold began still reaches the device, one issued
        during it leaves the host when the hold ends."""
        t = a.tasks[a.pos]
        issue = (a.prev_end if t.sync else a.issue_t) + t.gap_s
        if a.wl.cls == "batch" and not a.held and a.held_at < issue < a.released_at:
            issue = a.released_at
        return issue

    def _blocked(self, a: AppState, issue: float) -> bool:
        return a.held and a.wl.cls == "batch" and issue > a.held_at

    def _schedule(self, a: AppState) -> None:
        """Plan the admission of a's next task (none while held, running or idle)."""
        if a.running is not None or a.admit_at is not None or a.pos >= len(a.tasks):
            return
        issue = self._issue(a)
        if self._blocked(a, issue):
            return
        a.next_issue = issue
        a.admit_at = max(issue, a.prev_end, self.now)
        self._push(a.admit_at, "admit", a.info.slot)

    def _admit(self, a: AppState) -> None:
        a.admit_at = None
        if self._blocked(a, a.next_issue):    # the hold came before the host issued it
            return
        a.issue_t = a.next_issue
        t = a.tasks[a.pos]
        a.run_quota = a.quota
        if t.kind not in ENGINE_KIND:             # runs beside the engine: a fixed delay
            a.running, a.local_end = -1, self.now + local_s(t, self.dev.params)
            self._push(a.local_end, "local", a.info.slot)
            return
        sms = self._sms(a) if t.kind == "kernel" else 1
        follow = a.wl.cls == "batch" or a.pos + 1 < len(a.tasks)
        a.running = self.dev.add(ENGINE_KIND[t.kind], t.blocks, t.threads, t.regs, t.smem, t.flops,
                                 t.bytes, sms, a.ctx, self.now, follow=follow)

    def _finish(self, a: AppState) -> None:
        i = a.running
        assert i is not None
        if i < 0:
            start = end = a.local_end
        else:
            start, end = self.dev.times(i)
            self.dev.drop(i)
        a.running, a.prev_end = None, end
        t, idx = a.tasks[a.pos], a.pos
        a.pos += 1
        a.tasks_done += 1
        dur_us = (end - start) * 1e6
        if a.wl.cls == "batch":
            a.iterations += 1.0 / max(1, len(a.tasks))
            self._feed_batch(a, idx, t, dur_us)
            if a.pos >= len(a.tasks):
                a.pos = 0
        else:
            q = a.query
            assert q is not None
            if self.policy.wants_tasks(a.info):
                self._apply(self.policy.on_task_done(a.info, TaskDone(
                    self._row(a, q[2], idx, t), dur_us, a.run_quota, query=q[0])))
            if a.pos >= len(a.tasks):
                self._end_query(a)
                return
        self._schedule(a)

    def _feed_batch(self, a: AppState, idx: int, t: SimTask, dur_us: float) -> None:
        if not self.policy.wants_tasks(a.info):
            return
        n, tot = a.unfed.get(t.name, (0, 0.0))
        n, tot = n + 1, tot + dur_us
        if self.now - a.fed.get(t.name, -1.0) < FEED_S:
            a.unfed[t.name] = (n, tot)
            return
        a.fed[t.name] = self.now
        a.unfed.pop(t.name, None)
        self._apply(self.policy.on_task_done(a.info, TaskDone(
            self._row(a, None, idx, t), dur_us, a.run_quota, count=n, total_us=tot)))

    # --- queries ---
    def _start_query(self, a: AppState) -> None:
        qid, arrival, size = a.queue.popleft()
        a.query, a.tasks, a.pos = (qid, arrival, size), a.wl.queries[size], 0
        a.issue_t = a.prev_end = self.now
        rows = tuple(self._row(a, size, i, t) for i, t in enumerate(a.tasks))
        self._apply(self.policy.on_query_begin(a.info, QueryEvent(
            qid, size, t_us=self.now * 1e6, rule="api", tasks=rows,
            queued_us=(self.now - arrival) * 1e6 if self.report_queue else None)))
        self._schedule(a)

    def _end_query(self, a: AppState) -> None:
        q = a.query
        assert q is not None
        a.latencies.append((self.now - q[1]) * 1e3)
        a.query, a.tasks = None, []
        self._apply(self.policy.on_query_end(a.info, QueryEvent(q[0], q[2], t_us=self.now * 1e6)))
        if a.queue:
            self._start_query(a)

    # --- the loop ---
    def run(self) -> SimResult:
        w0 = time.perf_counter()
        for a in self.apps:
            self._apply(self.policy.on_register(a.info))
        for a in self.apps:
            if a.wl.cls == "batch":
                a.tasks = a.wl.iteration
                self._schedule(a)
        self._push(self.tick_s, "tick", -1)
        while True:
            t_heap = self._heap[0][0] if self._heap else math.inf
            t_dev = self.dev.next_event()
            t = min(t_heap, t_dev)
            if t >= self.horizon or t == math.inf:
                break
            self.dev.advance(t)
            self.now = t
            done = [a for a in self.apps if a.running is not None and a.running >= 0
                    and self.dev.finished(a.running)]
            for a in sorted(done, key=lambda a: (self.dev.times(a.running)[1], a.info.slot)):  # type: ignore[arg-type]
                self._finish(a)
            while self._heap and self._heap[0][0] <= t:
                _, _, kind, slot, arg = heapq.heappop(self._heap)
                if kind == "tick":
                    self._apply(self.policy.on_tick(t))
                    self._push(t + self.tick_s, "tick", -1)
                elif kind == "admit":
                    self._admit(self.apps[slot])
                elif kind == "local":
                    self._finish(self.apps[slot])
                elif kind == "arrive":
                    a = self.apps[slot]
                    a.queue.append(self._arrivals.pop(arg))
                    if a.query is None:
                        self._start_query(a)
        return SimResult(
            policy=getattr(self.policy, "name", type(self.policy).__name__), horizon_s=self.horizon,
            latencies_ms={a.wl.name: a.latencies for a in self.apps if a.wl.cls == "qos"},
            qos_ms={a.wl.name: float(a.wl.qos_ms or math.inf) for a in self.apps if a.wl.cls == "qos"},
            iterations_per_s={a.wl.name: a.iterations / self.horizon for a in self.apps if a.wl.cls == "batch"},
            events=self.dev.events, wall_s=time.perf_counter() - w0,
            quota_trace={a.wl.name: a.quota_trace for a in self.apps})
