"""A microservice pipeline in virtual time on simgpu's device model: the
queries of one end-to-end service flow through its stages' instances, each
instance an MPS client with its SM quota on one GPU (§V-B, Fig. 13).

    res = simulate(stages, deployment, params, batch=8, qos_s=0.05, load_qps=400,
                   comm="handle", queries=2000, seed=1)
    res.p99_s, res.throughput_qps, res.copy_s, res.handoffs

What is modelled:
  arrivals   Poisson at load_qps (seeded), each query carrying the service's
             input; the first stage copies it host-to-device.
  batching   §V-B step 2: a stage issues a batch to a free instance when
             `batch` queries wait, or when its oldest query would miss the
             QoS target were it held longer: now >= arrival + qos - (the
             predicted time of the stages still ahead, this one included,
             at their quotas, solo).  Queries wait while no instance is free.
  instances  run their batch's device tasks in order on their GPU (one
             engine per GPU: shim/devmodel.Device, the engine simgpu runs),
             as context `instance id` with the SMs their quota allows; their
             contention (SMs, memory bandwidth, PCIe) is the engine's.
  hand-off   comm="copy": the producer copies its result device-to-host and
             the consumer host-to-device (Fig. 8a); comm="handle": a consumer
             on the producer's GPU opens a handle, a fixed host cost
             handoff_s (Fig. 8b, 10), and a consumer on another GPU still
             copies (counted in `cross_gpu`).  A consumer on the producer's
             GPU is preferred when one is free.
  results    the last stage copies its result to the host; a query's latency
             is that copy's end minus its arrival.  Queries unfinished at the
             end of the drain count as infinitely late.

Deterministic for a seed.
"""
from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from camelot.suite import MB, THREADS, Stage, batch_ops, input_mb

from shim.devmodel import D2H, H2D, Device, Params, quota_sms, solo

WINDOW_QOS = 10.0     # a run spans at least this many QoS targets of arrivals (run_length)
MAX_QUERIES = 12000   # per run; loads past measurable_qps() are not judged
HEADROOM = 0.1        # batching: a query is issued by arrival + (1 - HEADROOM) * qos - predicted rest
HANDOFF_S = 60e-6      # host cost of passing and opening a handle (bench/handoff.py measures ours)


@dataclass(frozen=True)
class Instance:
    stage: int
    gpu: int
    pct: int


def deployment_of(placement: Sequence[Sequence[tuple[int, int]]]) -> list[Instance]:
    """An allocator's placement (per GPU: (stage, pct) per instance) as instances."""
    return [Instance(s, g, p) for g, insts in enumerate(placement) for s, p in insts]


@dataclass
class Result:
    latencies_s: np.ndarray                 # per query, inf if unfinished
    horizon_s: float
    stage_busy_s: list[float]               # device time per stage, summed over instances
    copy_s: float = 0.0                     # device time of inter-stage copies
    handoffs: int = 0                       # handles passed (same GPU)
    copies: int = 0                         # inter-stage copies (copy mode, or cross GPU)
    cross_gpu: int = 0                      # of which: handle mode, consumer on another GPU
    batches: int = 0

    # nearest rank at or above (no interpolation): an unfinished query is an
    # infinite latency, and interpolating with it would give NaN
    @property
    def p99_s(self) -> float:
        return float(np.quantile(self.latencies_s, 0.99, method="higher")) if len(self.latencies_s) else math.inf

    @property
    def p50_s(self) -> float:
        return float(np.quantile(self.latencies_s, 0.5, method="higher")) if len(self.latencies_s) else math.inf

    @property
    def throughput_qps(self) -> float:
        done = np.isfinite(self.latencies_s).sum()
        return float(done / self.horizon_s) if self.horizon_s > 0 else 0.0


@dataclass
class _Batch:
    queries: list[int]
    stage: int
    src_gpu: int                             # where its input lies (-1: the host)


@dataclass
class _Inst:
    spec: Instance
    ctx: int
    sms: int
    busy: bool = False
    ops: list = field(default_factory=list)  # (kind, blocks, flops, bytes) still to run
    batch: _Batch | None = None


def simulate(stages: Sequence[Stage], deployment: Sequence[Instance], params: Params, batch: int,
             qos_s: float, load_qps: float, comm: str = "handle", queries: int = 2000, seed: int = 1,
             handoff_s: float = HANDOFF_S, service: str = "", drain_qos: float = 20.0,
             headroom: float = HEADROOM) -> Result:
    """One run of `queries` Poisson arrivals at load_qps through the deployment."""
    if comm not in ("handle", "copy"):
        raise ValueError(f"comm {comm!r}: handle or copy")
    if batch < 1 or qos_s <= 0 or load_qps <= 0 or queries < 1:
        raise ValueError(f"batch {batch}, qos {qos_s}, load {load_qps}, queries {queries}: want positive")
    n = len(stages)
    missing = sorted(set(range(n)) - {i.stage for i in deployment})
    if missing:
        raise ValueError(f"stage(s) {missing} have no instance")
    gpus = max(i.gpu for i in deployment) + 1
    devs = [Device(params, cap=256) for _ in range(gpus)]
    sms = int(params.sms)
    insts = [_Inst(d, k + 1, quota_sms(d.pct, sms)) for k, d in enumerate(deployment)]
    by_stage = [[x for x in insts if x.spec.stage == s] for s in range(n)]
    ops = [[(o.kind, o.blocks, o.flops, o.bytes) for o in batch_ops(st, batch)] for st in stages]
    in_mb = input_mb(service) if service else 0.5
    pred = [min(_solo_ops(params, _with_comm(ops[s], s, stages, batch, comm, in_mb), x.sms)
                for x in by_stage[s]) for s in range(n)]
    # predicted time from stage s on, and the share of the target kept as
    # headroom against contention the solo prediction does not see
    ahead = [sum(pred[s:]) + headroom * qos_s for s in range(n)]
    rng = random.Random(seed)
    arrival = np.empty(queries)
    t = 0.0
    for q in range(queries):
        t += rng.expovariate(load_qps)
        arrival[q] = t
    horizon = float(arrival[-1])
    done_at = np.full(queries, math.inf)
    waiting: list[list[tuple[int, int]]] = [[] for _ in range(n)]   # (query, gpu of its data)
    events: list[tuple[float, int, str, int]] = [(float(arrival[0]), 0, "arrive", 0)]
    seq = 1
    running: dict[tuple[int, int], _Inst] = {}                      # (gpu, entry) -> instance
    res = Result(done_at, horizon, [0.0] * n)
    busy_since: dict[int, float] = {}

    def push(at: float, kind: str, val: int) -> None:
        nonlocal seq
        heapq.heappush(events, (at, seq, kind, val))
        seq += 1

    def submit(x: _Inst, now: float) -> None:
        """Start x's next op, or finish its batch."""
        if x.ops:
            kind, blocks, flops, nbytes = x.ops.pop(0)
            dev = devs[x.spec.gpu]
            e = dev.add(kind, blocks, THREADS, 0, 0, flops, nbytes, x.sms, x.ctx, max(now, dev.now))
            running[(x.spec.gpu, e)] = x
            return
        b = x.batch
        res.stage_busy_s[b.stage] += now - busy_since.pop(x.ctx)
        x.busy, x.batch = False, None
        if b.stage == n - 1:
            for q in b.queries:
                done_at[q] = now
        else:
            waiting[b.stage + 1].extend((q, x.spec.gpu) for q in b.queries)
            if comm == "handle":
                push(now + handoff_s, "ready", b.stage + 1)
            else:
                try_issue(b.stage + 1, now)
        try_issue(b.stage, now)

    def try_issue(s: int, now: float) -> None:
        """Form batches for stage s while an instance is free and one is due."""
        while waiting[s]:
            free = [x for x in by_stage[s] if not x.busy]
            if not free:
                return
            oldest = waiting[s][0][0]
            due = arrival[oldest] + qos_s - ahead[s]
            if len(waiting[s]) < batch and now < due:
                push(due, "due", s)
                return
            src = waiting[s][0][1]
            x = next((y for y in free if y.spec.gpu == src), free[0])
            take, waiting[s] = waiting[s][:batch], waiting[s][batch:]
            start(x, _Batch([q for q, _ in take], s, src), now)

    def start(x: _Inst, b: _Batch, now: float) -> None:
        k = len(b.queries)
        x.busy, x.batch = True, b
        busy_since[x.ctx] = now
        res.batches += 1
        pre: list[tuple] = []
        if b.stage == 0:
            pre.append((H2D, 1, 0.0, in_mb * MB * k))
        else:
            out = stages[b.stage - 1].out_mb * MB * k
            if comm == "copy" or b.src_gpu != x.spec.gpu:
                # the producer's D2H is charged here, on this instance's clock
                # (it would otherwise hold the producer's slot as long)
                pre += [(D2H, 1, 0.0, out), (H2D, 1, 0.0, out)]
                res.copies += 1
                res.cross_gpu += comm == "handle"
            else:
                res.handoffs += 1
        post = [(D2H, 1, 0.0, stages[b.stage].out_mb * MB * k)] if b.stage == n - 1 else []
        body = ops[b.stage] if k == batch else [(o.kind, o.blocks, o.flops, o.bytes)
                                                  for o in batch_ops(stages[b.stage], k)]
        x.ops = pre + list(body) + post
        submit(x, now)

    end_by = horizon + drain_qos * qos_s
    while True:
        t_dev, g = min(((d.next_event(), i) for i, d in enumerate(devs)), default=(math.inf, -1))
        t_ev = events[0][0] if events else math.inf
        if min(t_dev, t_ev) > end_by or (math.isinf(t_dev) and math.isinf(t_ev)):
            break
        if t_dev <= t_ev:
            now, finished = devs[g].advance_to_next()
            # claim every finished entry before submitting anything: collect()
            # has freed them, so a submit may reuse one for a new task
            for x, end in [(running.pop((g, d.entry)), d.end) for d in finished]:
                submit(x, end)
            continue
        now, _, kind, val = heapq.heappop(events)
        if kind == "arrive":
            waiting[0].append((val, -1))
            if val + 1 < queries:
                push(float(arrival[val + 1]), "arrive", val + 1)
            try_issue(0, now)
        else:
            try_issue(val, now)
    lat = done_at - arrival
    res.latencies_s = lat
    return res


def _with_comm(ops: list, s: int, stages: Sequence[Stage], batch: int, comm: str, in_mb: float) -> list:
    """A stage's ops with the copies it makes at a full batch: the input
    (first stage), the inter-stage copy pair (copy mode) and the result."""
    pre = [(H2D, 1, 0.0, in_mb * MB * batch)] if s == 0 else (
        [(D2H, 1, 0.0, stages[s - 1].out_mb * MB * batch), (H2D, 1, 0.0, stages[s - 1].out_mb * MB * batch)]
        if comm == "copy" else [])
    post = [(D2H, 1, 0.0, stages[s].out_mb * MB * batch)] if s == len(stages) - 1 else []
    return pre + list(ops) + post


def _solo_ops(params: Params, ops: list, sms: int) -> float:
    return sum(solo(params, k, b, THREADS, 0, 0, f, by, sms) for k, b, f, by in ops)


def measurable_qps(qos_s: float, max_queries: int = MAX_QUERIES) -> float:
    """The highest load a run of max_queries can judge: its arrivals must span
    WINDOW_QOS targets (a steady state, not the first batches' transient)."""
    return max_queries / (WINDOW_QOS * qos_s)


def run_length(load_qps: float, qos_s: float, queries: int, max_queries: int = MAX_QUERIES) -> int:
    """Queries for a run at load_qps: at least `queries`, and enough to span
    WINDOW_QOS targets, at most max_queries."""
    return int(min(max_queries, max(queries, load_qps * WINDOW_QOS * qos_s)))


def peak_load(stages: Sequence[Stage], deployment: Sequence[Instance], params: Params, batch: int,
              qos_s: float, comm: str, hi_qps: float, queries: int = 1500, seed: int = 1,
              service: str = "", steps: int = 9) -> tuple[float, Result | None]:
    """The highest Poisson load whose p99 meets qos_s, by bisection below
    hi_qps (doubled up to 4 times while it still meets the target, never
    past measurable_qps), with that run's result; (0, None) when even a
    trickle misses."""
    def run(load: float, n: int | None = None) -> Result:
        return simulate(stages, deployment, params, batch, qos_s, load, comm,
                        n or run_length(load, qos_s, queries), seed, service=service)

    if run(max(hi_qps * 0.01, 1e-3), min(queries, 200)).p99_s > qos_s:
        return 0.0, None
    lo, best, hi = 0.0, None, min(hi_qps, measurable_qps(qos_s))
    cap = measurable_qps(qos_s)
    for _ in range(4):
        top = run(hi)
        if top.p99_s > qos_s:
            break
        lo, best = hi, top
        if hi >= cap:
            return lo, best           # as far as a run can judge: the caller flags it
        hi = min(2 * hi, cap)
    else:
        return lo, best
    for _ in range(steps):
        mid = (lo + hi) / 2
        r = run(mid)
        if r.p99_s <= qos_s:
            lo, best = mid, r
        else:
            hi = mid
    return lo, best
