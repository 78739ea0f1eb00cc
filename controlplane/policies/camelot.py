"""camelot: Camelot's GPU allocation for microservice pipelines (Zhang et al.,
"Camelot", §VII) and the two baselines of its §VIII (EA, Laius-per-GPU).

A user-facing service is a pipeline of n stages; every query goes through one
instance of each.  Stage i runs N_i instances (MPS clients), each at p_i
percent of one GPU's SMs.  Its predicted performance (§VII-A) is a
StageModel: duration of a batch at pct % of the SMs, bandwidth b(p) while it
runs, memory footprint M(i, s) of one instance, work C(i, s) of one batch.

Eq. 1 (maximise the peak load, solve_peak), as implemented:

    max   min_i N_i * f(p_i),         f(p) = s / duration(p, s)
    C-1   sum_i N_i * p_i <= C * R,   p_i in {g, 2g, ...} <= R  (per GPU: <= R)
    C-2   sum_i N_i <= C * I,         1 <= N_i                  (per GPU: <= I)
    C-3   per GPU: sum of b(p_i) over the instances placed there <= BW
    C-4   per GPU: sum of M(i, s) over the instances placed there <= F
    C-5   sum_i duration(p_i, s) <= QoS

Our readings of the printed equation:
  - C-5 is printed with g(p_i) and Table II calls g the bandwidth; the text
    says "the total time required ... should be smaller than the QoS target",
    so C-5 is the sum of the stage durations (a query's latency through the
    pipeline, queueing aside) and b(p) is the bandwidth.
  - C-3 and C-4 are printed as global sums against one GPU's BW and F; the
    text says "on a GPU", and bandwidth and memory are physically per GPU, so
    both are checked per GPU, on the placement of Fig. 13 (camelot_place).
    C-1 and C-2 are checked both globally and per GPU (placement).
  - N_i >= 1 (the paper allows 0, which makes the objective 0).
  - Quotas are multiples of `granularity` percent (5 by default), 1..R.

Eq. 2 (min_gpus): y = ceil(max(sum_i C(i,s) / G, sum_i M(i,s) / F)), at least
1.  As printed the first term is a time (GFLOP over GFLOP/s); we read C(i, s)
as the work the load demands per second, i.e. (load / s) * gflop(s), so that
y is a GPU count.  G is a peak rate, so y is a lower bound: solve_min tries
y GPUs, then y + 1, ..., up to max_gpus.

Eq. 3 (solve_min): on those y GPUs, minimise sum_i N_i * p_i subject to C-2..C-5
above (its C-1..C-4; its C-1 is printed for one GPU, we use the per-GPU
limit I on each of the y GPUs) and to carrying the load: min_i N_i f(p_i) >=
load_qps (implicit in the paper: the policy serves "the low load").

Search (§VII-C): simulated annealing over V = [N_1..N_n, p_1..p_n],
deterministic for a seed (random.Random(seed)), DEFAULT_ITERS iterations:
  - moves: 70 % of them change one coordinate of V by one step (N_i by 1,
    p_i by one granularity step), as the paper describes; 30 % move along a
    direction that keeps the resources about the same - a split or merge
    (N_i +- 1 with p_i rescaled to keep N_i p_i) or one SM step from one
    stage to another.  With one-coordinate moves only, a full GPU trades
    SMs between stages through states that are worse or invalid, and the
    chain needed ~10x the iterations to match the exhaustive optimum on
    random 2-3 stage, 1-2 GPU instances (we measured, one-coordinate moves
    only: 0/52 runs below the optimum at 20 000 iterations, 11/78 at 1 500;
    with these moves, the polish and the start below: 1/78 at 1 500, that
    one at 0.96 of the optimum);
  - acceptance of a worse state: exp(delta / T), T cooling geometrically from
    T0 = 0.3 to T1 = 0.01 over the iterations; the energy is relative to the
    best valid value met so far (temperatures are fractions of it).  Eq. 1's
    energy is a soft minimum of the stages' N_i f(p_i) (so raising one of two
    tied stages counts) less EPS_RES of the resources used;
  - the paper rejects an invalid V'; we let the chain cross invalid states
    at a penalty lam * (0.05 + relative excess over the violated
    constraints), lam growing from 1 to 20 over the run.  Only valid states
    (every constraint and the placement of Fig. 13 succeeding) become the
    result: the best is kept (Eq. 1: max throughput, then fewest
    sum N_i p_i, then lowest latency; Eq. 3: fewest sum N_i p_i, then
    throughput, then latency), then polished by steepest ascent over its
    neighbours (all moves above) until none is better;
  - the chain starts from one instance per stage at the least quotas that
    meet QoS (raising, step by step, the stage that cuts the most latency
    per percent) or, for Eq. 1, from Laius's allocation (below) when that
    is valid and better; evaluations are cached per state.

Camelot-NC (§VIII-D) is bandwidth_cap=False: the same search without C-3.

Baselines (§VIII-A):
  - EA, even_allocation: "EA evenly allocates all the GPU resources to the
    microservices".  We read it per GPU: every GPU runs one instance of each
    stage at floor(R / n) percent (all of it, up to rounding), so each stage
    gets an even share of all the SMs, and communicating stages share a GPU.
  - Laius, laius_allocation: "we schedule the microservices of a benchmark on
    a single GPU with Laius ... aggregating the throughputs on all the GPUs"
    and "we already optimize Laius to balance the throughputs": every GPU
    runs the whole pipeline, one instance per stage, at the split (multiples
    of granularity, sum <= R) that maximises min_i f(p_i) under QoS and the
    GPU's memory (exhaustive; ties: fewest SMs).  Total = C times that.
  Neither manages bandwidth (the paper: they do not optimise inter-service
  contention): bandwidth_cap=False by default; pass True to check C-3.

Registration: the controller's Policy (base.py) decides per query and per
task; a pipeline allocator answers one question - which instances at which
quotas on which GPUs - before any query runs, so it is not a Policy and is
not put in that registry (a Policy wrapping it would decide nothing per
query).  Experiments pick allocators by name from ALLOCATORS below.
Infeasible inputs return Allocation(feasible=False, why=...) with
throughput 0; bad arguments raise ValueError.
"""
from __future__ import annotations

import bisect
import itertools
import math
import random
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from controlplane.policies.camelot_place import Placement, counts_on, pack, place

__all__ = ["ALLOCATORS", "Allocation", "GPUSpec", "StageModel", "ToyStage", "allocate", "brute_force_peak",
           "even_allocation", "gpu_preset", "laius_allocation", "laius_min", "min_gpus", "place", "solve_min",
           "solve_peak", "throughput"]

_TOL = 1e-9
T0, T1 = 0.3, 1e-2            # SA temperature, start and end (fractions of the best value)
LAM0, LAM1 = 1.0, 20.0        # penalty weight on an invalid state, start and end
PEN0 = 0.05                   # an invalid state's least penalty (times lam)
SOFT_K = 10.0                 # Eq. 1's energy: soft minimum of N_i f(p_i), this sharp
TRADE = 0.3                   # share of the moves that split / merge / trade SMs
POLISH_ROUNDS = 20            # steepest-ascent rounds on the best state, at most
EPS_RES = 0.01                # Eq. 1's energy prefers fewer resources at equal throughput
DEFAULT_ITERS = 1500
DEFAULT_MAX_GPUS = 16


class StageModel(Protocol):
    """One microservice stage's predicted performance (§VII-A, Table II)."""
    name: str

    def duration_s(self, pct: int, batch: int) -> float: ...      # one batch at pct % of the SMs

    def bandwidth_gbs(self, pct: int, batch: int) -> float: ...   # b(p): global-memory GB/s while running

    def mem_gb(self, batch: int) -> float: ...                    # M(i, s): one instance's footprint

    def gflop(self, batch: int) -> float: ...                     # C(i, s): work of one batch


@dataclass(frozen=True)
class GPUSpec:
    """Table II's per-GPU constants: R (pct), I (mps_clients), BW, F, G."""
    name: str = "2080Ti"
    pct: int = 100                   # R, in percent
    mps_clients: int = 48            # I
    bandwidth_gbs: float = 616.0     # BW
    mem_gb: float = 11.0             # F
    gflops: float = 13450.0          # G

    def __post_init__(self) -> None:
        if self.pct < 1 or self.mps_clients < 1:
            raise ValueError(f"GPUSpec {self.name}: pct and mps_clients must be >= 1")
        if not (self.bandwidth_gbs > 0 and self.mem_gb > 0 and self.gflops > 0):
            raise ValueError(f"GPUSpec {self.name}: bandwidth_gbs, mem_gb and gflops must be > 0")


_PRESETS: dict[str, GPUSpec] = {
    # RTX 2080 Ti: 616 GB/s (Camelot §VIII-A, from its ref. [55]); 11 GB GDDR6 and
    # 13.45 TFLOPS FP32 at the reference boost clock (NVIDIA's Turing specs).
    "2080ti": GPUSpec("2080Ti", 100, 48, 616.0, 11.0, 13450.0),
    # V100 of the DGX-2: 897 GB/s (Camelot §VIII-A); 32 GB HBM2 (DGX-2 datasheet: 16 x V100
    # 32 GB); 15.7 TFLOPS FP32 (V100 SXM2 datasheet; the DGX-2's SXM3 parts clock a bit higher).
    "v100": GPUSpec("V100", 100, 48, 897.0, 32.0, 15700.0),
    # H100 SXM5 80 GB: 3.35 TB/s, 80 GB HBM3, 67 TFLOPS FP32 (NVIDIA H100 datasheet).
    "h100": GPUSpec("H100", 100, 48, 3350.0, 80.0, 67000.0),
}
# I = 48: "Volta MPS server supports 48 client CUDA contexts per-device" (NVIDIA MPS
# docs, CUDA <= 13.0; later releases raise it to 60 - pass mps_clients=60 for those).


def gpu_preset(name: str) -> GPUSpec:
    """A named GPUSpec: "2080ti", "v100" (DGX-2) or "h100" (sources in comments)."""
    key = name.lower().replace(" ", "").replace("-", "").replace("rtx", "")
    if key not in _PRESETS:
        raise ValueError(f"unknown GPU preset {name!r} (known: {', '.join(sorted(_PRESETS))})")
    return _PRESETS[key]


@dataclass(frozen=True)
class Allocation:
    """A pipeline's allocation: N_i instances of stage i at p_i percent each."""
    instances: tuple[int, ...]       # N_i per stage
    quotas: tuple[int, ...]          # p_i per stage, percent of one GPU
    batch: int
    throughput_qps: float            # min_i N_i * f(p_i); 0 when infeasible
    latency_s: float                 # sum_i duration_s(p_i, batch) (C-5 of Eq. 1 / C-4 of Eq. 3)
    gpus: int                        # GPUs used (holding at least one instance)
    resources_pct: int               # sum_i N_i * p_i
    placement: Placement             # per GPU: (stage index, pct) of each instance placed there
    feasible: bool
    why: str = ""                    # when infeasible: which constraint


@dataclass(frozen=True)
class ToyStage:
    """A simple StageModel for tests and experiments: the batch's work
    parallelises linearly up to `knee` percent of the SMs and no further,
    after a fixed per-batch overhead:
        duration(p, s) = fixed_ms + ms_per_item * s * knee / min(p, knee)   [ms]
    bandwidth = gb_per_item * s / duration (its bytes over its time), memory =
    model_gb + act_gb_per_item * s, work = gflop_per_item * s."""
    name: str
    ms_per_item: float = 1.0
    fixed_ms: float = 1.0
    knee: int = 100
    gb_per_item: float = 0.1
    model_gb: float = 1.0
    act_gb_per_item: float = 0.05
    gflop_per_item: float = 5.0

    def duration_s(self, pct: int, batch: int) -> float:
        return (self.fixed_ms + self.ms_per_item * batch * self.knee / min(pct, self.knee)) / 1000.0

    def bandwidth_gbs(self, pct: int, batch: int) -> float:
        return self.gb_per_item * batch / self.duration_s(pct, batch)

    def mem_gb(self, batch: int) -> float:
        return self.model_gb + self.act_gb_per_item * batch

    def gflop(self, batch: int) -> float:
        return self.gflop_per_item * batch


# --- arguments and precomputed tables ----------------------------------------------------

def _check_args(stages: Sequence[StageModel], gpu: GPUSpec, batch: int, qos_s: float,
                n_gpus: int = 1, granularity: int = 1) -> None:
    if not stages:
        raise ValueError("camelot: the pipeline has no stages")
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"camelot: batch must be an integer >= 1, got {batch!r}")
    if not isinstance(n_gpus, int) or n_gpus < 1:
        raise ValueError(f"camelot: n_gpus must be an integer >= 1, got {n_gpus!r}")
    if not (isinstance(qos_s, (int, float)) and qos_s >= 0 and not math.isnan(qos_s)):
        raise ValueError(f"camelot: qos_s must be a number >= 0 (seconds), got {qos_s!r}")
    if not isinstance(granularity, int) or not 1 <= granularity <= gpu.pct:
        raise ValueError(f"camelot: granularity must be an integer in 1..{gpu.pct}, got {granularity!r}")


def _ok(x: float) -> bool:
    return math.isfinite(x) and x > 0


def _rate(stage: StageModel, pct: int, batch: int) -> float:
    """f(p) = s / duration(p, s): queries per second of one instance (0 when it cannot run)."""
    d = stage.duration_s(pct, batch)
    return batch / d if _ok(d) else 0.0


def throughput(stages: Sequence[StageModel], instances: Sequence[int], quotas: Sequence[int],
               batch: int) -> float:
    """Eq. 1's objective: min_i N_i * f(p_i), f(p) = batch / duration_s(p, batch)."""
    if not (len(stages) == len(instances) == len(quotas)) or not stages:
        raise ValueError(f"throughput: {len(stages)} stages, {len(instances)} counts, {len(quotas)} quotas")
    if batch < 1:
        raise ValueError(f"throughput: batch must be >= 1, got {batch}")
    return min(n * _rate(s, p, batch) for s, n, p in zip(stages, instances, quotas))


class _Problem:
    """The stages' predictions per allowed quota, and the constraint checks of
    Eq. 1 / Eq. 3 on a state (N, level indices)."""

    def __init__(self, stages: Sequence[StageModel], gpu: GPUSpec, n_gpus: int, batch: int,
                 qos_s: float, bandwidth_cap: bool, granularity: int):
        self.stages, self.gpu, self.C, self.s = stages, gpu, n_gpus, batch
        self.qos, self.cap, self.g = float(qos_s), bandwidth_cap, granularity
        self.levels: list[list[int]] = []
        self.dur: list[list[float]] = []
        self.f: list[list[float]] = []
        self.bw: list[list[float]] = []
        self.mem = [float(st.mem_gb(batch)) for st in stages]
        self.why = ""
        for st in stages:
            lv, du, ff, bb = [], [], [], []
            for p in range(granularity, gpu.pct + 1, granularity):
                d = float(st.duration_s(p, batch))
                b = float(st.bandwidth_gbs(p, batch))
                if not _ok(d) or (bandwidth_cap and b > gpu.bandwidth_gbs + _TOL):
                    continue
                lv.append(p)
                du.append(d)
                ff.append(batch / d)
                bb.append(max(b, 0.0) if math.isfinite(b) else math.inf)
            self.levels.append(lv)
            self.dur.append(du)
            self.f.append(ff)
            self.bw.append(bb)
        self.why = self._preflight()
        n = len(stages)
        self.nmax = [1] * n
        if not self.why:
            for i in range(n):
                by_mem = int((gpu.mem_gb + _TOL) // self.mem[i]) if self.mem[i] > 0 else gpu.mps_clients
                per_gpu = min(gpu.mps_clients, gpu.pct // self.levels[i][0], by_mem)
                self.nmax[i] = max(1, min(per_gpu * n_gpus, n_gpus * gpu.mps_clients - (n - 1)))

    def _preflight(self) -> str:
        """Why no state can be valid ("" when some may be)."""
        gpu, C = self.gpu, self.C
        for st, m, lv in zip(self.stages, self.mem, self.levels):
            if m > gpu.mem_gb + _TOL:
                return (f"memory (Eq. 1 C-4): one instance of stage {st.name!r} needs {m:.3g} GB "
                        f"> F = {gpu.mem_gb:g} GB")
            if not lv:
                what = f" within BW = {gpu.bandwidth_gbs:g} GB/s (Eq. 1 C-3)" if self.cap else ""
                return f"stage {st.name!r} cannot run at any quota{what}"
        fastest = sum(min(d) for d in self.dur)
        if fastest > self.qos * (1 + _TOL):
            return (f"QoS (Eq. 1 C-5): {self.qos * 1e3:.4g} ms is below the fastest possible latency "
                    f"{fastest * 1e3:.4g} ms (every stage at its fastest quota"
                    f"{' within BW' if self.cap else ''})")
        if len(self.stages) > C * gpu.mps_clients:
            return f"MPS clients (Eq. 1 C-2): {len(self.stages)} stages > C * I = {C * gpu.mps_clients}"
        if sum(lv[0] for lv in self.levels) > C * gpu.pct:
            return f"SMs (Eq. 1 C-1): one instance per stage at the least quota exceeds C * R = {C * gpu.pct} %"
        if sum(self.mem) > C * gpu.mem_gb + _TOL:
            return f"memory (Eq. 1 C-4): one instance per stage needs {sum(self.mem):.3g} GB > C * F"
        return ""

    def latency(self, lv: Sequence[int]) -> float:
        return sum(d[k] for d, k in zip(self.dur, lv))

    def check(self, n: Sequence[int], lv: Sequence[int]) -> tuple[float, str, list[float], int, float]:
        """(violation, code, stage throughputs N_i f(p_i), resources, latency) of state (n, lv):
        violation 0 when every constraint of Eq. 1 holds and Fig. 13 places it;
        else the summed relative excess (placement failure: 0.05); code names
        the first violated constraint (explain() puts it in words)."""
        gpu, C = self.gpu, self.C
        lat = mem = bw = 0.0
        res = cl = 0
        xs, pcts, bws = [], [], []
        for i, m in enumerate(n):
            k = lv[i]
            p, b = self.levels[i][k], self.bw[i][k]
            lat += self.dur[i][k]
            xs.append(m * self.f[i][k])
            pcts.append(p)
            bws.append(b)
            res += m * p
            cl += m
            mem += m * self.mem[i]
            bw += m * b
        viol, why = 0.0, ""
        if lat > self.qos * (1 + _TOL):
            viol += lat / self.qos - 1 if self.qos > 0 else 1.0
            why = "C-5"
        if res > C * gpu.pct:
            viol += res / (C * gpu.pct) - 1
            why = why or "C-1"
        if cl > C * gpu.mps_clients:
            viol += cl / (C * gpu.mps_clients) - 1
            why = why or "C-2"
        if mem > C * gpu.mem_gb + _TOL:
            viol += mem / (C * gpu.mem_gb) - 1
            why = why or "C-4"
        if self.cap and bw > C * gpu.bandwidth_gbs + _TOL:
            viol += bw / (C * gpu.bandwidth_gbs) - 1
            why = why or "C-3"
        if viol == 0 and C > 1 and counts_on(n, pcts, self.mem, bws, gpu, C, self.cap) is None:   # 1 GPU: as above
            viol, why = PEN0, "place"
        return viol, why, xs, res, lat

    def explain(self, n: Sequence[int], lv: Sequence[int]) -> str:
        """The first violated constraint of state (n, lv), in words ("" if none)."""
        gpu, C = self.gpu, self.C
        viol, code, xs, res, lat = self.check(n, lv)
        mem = sum(m * x for m, x in zip(n, self.mem))
        bw = sum(m * self.bw[i][lv[i]] for i, m in enumerate(n))
        return {
            "": "",
            "C-5": f"QoS (C-5): latency {lat * 1e3:.4g} ms > {self.qos * 1e3:.4g} ms",
            "C-1": f"SMs (C-1): {res} % > C * R = {C * gpu.pct} %",
            "C-2": f"MPS clients (C-2): {sum(n)} > C * I = {C * gpu.mps_clients}",
            "C-4": f"memory (C-4): {mem:.3g} GB > C * F = {C * gpu.mem_gb:g} GB",
            "C-3": f"bandwidth (C-3): {bw:.4g} GB/s > C * BW = {C * gpu.bandwidth_gbs:g} GB/s",
            "place": "placement (Fig. 13): the instances do not fit the GPUs one by one (R, F, BW, I per GPU)",
        }[code]

    def start(self) -> list[int]:
        """The chain's start: one instance per stage, every stage at its least
        quota, then, while the latency is over QoS, one step up for the stage
        whose step cuts the most latency per percent (a valid state when one
        instance per stage fits; else the state reached)."""
        k = len(self.stages)
        ns, lv = [1] * k, [0] * k
        while self.latency(lv) > self.qos * (1 + _TOL):
            gain = [((self.dur[i][lv[i]] - self.dur[i][lv[i] + 1])
                     / (self.levels[i][lv[i] + 1] - self.levels[i][lv[i]]), -i)
                    for i in range(k) if lv[i] + 1 < len(self.levels[i])]
            if not gain:
                break
            lv[-max(gain)[1]] += 1
        return ns + lv

    def upper(self) -> float:
        """An upper bound of the objective: every stage alone with its most instances."""
        return min(max(nm * x for x in ff) for nm, ff in zip(self.nmax, self.f))

    def allocation(self, n: Sequence[int], lv: Sequence[int], why: str = "") -> Allocation:
        """The Allocation of a valid state (placed by Fig. 13)."""
        pcts = [self.levels[i][lv[i]] for i in range(len(n))]
        bws = [self.bw[i][lv[i]] for i in range(len(n))]
        pl = pack(list(n), pcts, self.mem, bws, self.gpu, self.C, self.cap)
        assert pl is not None, "a valid state is placed"
        return Allocation(tuple(n), tuple(pcts), self.s, throughput(self.stages, n, pcts, self.s),
                          self.latency(lv), sum(1 for g in pl if g), sum(a * b for a, b in zip(n, pcts)),
                          pl, True, why)

    def infeasible(self, why: str) -> Allocation:
        return Allocation((), (), self.s, 0.0, math.inf, 0, 0, (), False, why)


# --- simulated annealing (§VII-C) ------------------------------------------------------------

Key = tuple[float, float, float]


def _anneal(pb: _Problem, seed: int, iters: int, load: float | None = None,
            start: list[int] | None = None) -> tuple[list[int] | None, str]:
    """SA over V = [N_1..N_n, level_1..level_n] (§VII-C).  load None: Eq. 1,
    maximise min_i N_i f(p_i) (the energy uses a soft minimum, so that raising
    one of two tied stages counts, less EPS_RES per resource used); else Eq. 3,
    minimise sum_i N_i p_i with min_i N_i f(p_i) >= load as one more
    constraint.  The energy is relative to the best valid value met so far,
    so temperatures are fractions of it.  Returns the best valid state (None
    if none was met) and the last invalid state's reason."""
    rng = random.Random(seed)
    n = len(pb.stages)
    hi = pb.nmax + [len(lv) - 1 for lv in pb.levels]
    lo = [1] * n + [0] * n
    scale = float(pb.C * pb.gpu.pct)
    peak = load is None
    cache: dict[tuple[int, ...], tuple[float, int, float, Key | None, str]] = {}

    def look(v: list[int]) -> tuple[float, int, float, Key | None, str]:
        viol, why, xs, res, lat = pb.check(v[:n], v[n:])
        thr = min(xs)
        if not peak and thr < load * (1 - _TOL):   # type: ignore[operator]
            viol += 1.0 - thr / load                # type: ignore[operator]
            why = why or "load"
        if peak:
            obj = thr
            if SOFT_K > 0:
                obj -= math.log(sum(math.exp(-SOFT_K * (x - thr) / thr) for x in xs)) * thr / SOFT_K if thr > 0 else 0
            k: Key = (thr, -res, -lat)
        else:
            obj, k = -float(res), (-res, thr, -lat)
        hit = cache[tuple(v)] = (obj, res, viol, None if viol else k, why)
        return hit

    def energy(h: tuple[float, int, float, Key | None, str], norm: float, lam: float) -> float:
        e = h[0] / norm - EPS_RES * h[1] / scale if peak else h[0] / norm
        return e - lam * (PEN0 + h[2]) if h[2] else e

    cur = list(start) if start is not None else pb.start()
    h_cur = look(cur)
    last_bad = cur if h_cur[2] else None
    best, best_key = (list(cur), h_cur[3]) if h_cur[3] is not None else (None, None)
    norm = max(abs(h_cur[0]), 1e-12)
    dims = [j for j in range(2 * n) if hi[j] > lo[j]]
    if not dims:
        return best, _explain(pb, last_bad, load)
    steps = max(iters, 1)
    temp, t_mul = T0 / (T1 / T0) ** (1.0 / steps), (T1 / T0) ** (1.0 / steps)
    lam, l_mul = LAM0 / (LAM1 / LAM0) ** (1.0 / steps), (LAM1 / LAM0) ** (1.0 / steps)
    rnd, exp = rng.random, math.exp
    for _ in range(iters):
        temp *= t_mul
        lam *= l_mul
        cand = _trade(cur, pb, hi, rnd) if rnd() < TRADE else _axis(cur, dims, lo, hi, rnd)
        if cand is None:
            continue
        h = cache.get(tuple(cand)) or look(cand)
        if h[2]:
            last_bad = cand
        elif best_key is None or h[3] > best_key:   # type: ignore[operator]
            best, best_key = cand, h[3]
            norm = max(abs(h[0]), 1e-12)
        e, e_cur = energy(h, norm, lam), energy(h_cur, norm, lam)
        if e >= e_cur or rnd() < exp((e - e_cur) / temp):
            h_cur, cur = h, cand
    if best is not None:       # polish: steepest ascent over every neighbour of the best
        for _ in range(POLISH_ROUNDS):
            moved = False
            for cand in _neighbours(best, pb, lo, hi):
                h = cache.get(tuple(cand)) or look(cand)
                if not h[2] and h[3] > best_key:       # type: ignore[operator]
                    best, best_key, moved = cand, h[3], True
            if not moved:
                break
    return best, _explain(pb, last_bad, load)


def _explain(pb: _Problem, v: list[int] | None, load: float | None) -> str:
    """In words, why state v is invalid."""
    if v is None:
        return "no invalid state met"
    n = len(pb.stages)
    why = pb.explain(v[:n], v[n:])
    if not why and load is not None:
        thr = min(v[i] * pb.f[i][v[n + i]] for i in range(n))
        why = f"load (Eq. 3): {thr:.4g} qps < {load:g} qps"
    return why


def _axis(cur: list[int], dims: list[int], lo: list[int], hi: list[int],
          rnd: Callable[[], float]) -> list[int]:
    """One coordinate of V one step up or down (§VII-C)."""
    cand = cur[:]
    r = int(rnd() * 2 * len(dims))
    j = dims[r >> 1]
    v = cand[j] + (1 if r & 1 else -1)
    if v < lo[j] or v > hi[j]:
        v = 2 * cand[j] - v
    cand[j] = v
    return cand


def _split(cur: list[int], pb: _Problem, i: int, m: int, up: bool) -> list[int] | None:
    """Stage i at m instances, each at the level just below (up=False) or above
    the quota that keeps N_i p_i as it is: a split or a merge."""
    n = len(pb.stages)
    if not 1 <= m <= pb.nmax[i] or m == cur[i]:
        return None
    lv = pb.levels[i]
    want = cur[i] * lv[cur[n + i]] / m
    k = bisect.bisect_left(lv, want)
    if not up or k == len(lv):
        k = max(k - (0 if k < len(lv) and lv[k] == want else 1), 0)
    cand = cur[:]
    cand[i], cand[n + i] = m, k
    return cand


def _trade(cur: list[int], pb: _Problem, hi: list[int], rnd: Callable[[], float]) -> list[int] | None:
    """A move along a direction that keeps the resources about the same: a
    split / merge of stage i's instances, or one SM step from stage j to i."""
    n = len(pb.stages)
    i = int(rnd() * n)
    if rnd() < 0.5:
        return _split(cur, pb, i, cur[i] + (1 if rnd() < 0.5 else -1), rnd() < 0.5)
    j = int(rnd() * n)
    if j == i or cur[n + i] >= hi[n + i] or cur[n + j] <= 0:
        return None
    cand = cur[:]
    cand[n + i] += 1
    cand[n + j] -= 1
    return cand


def _neighbours(v: list[int], pb: _Problem, lo: list[int], hi: list[int]) -> list[list[int]]:
    """Every state one move of _axis or _trade away from v."""
    n, out = len(pb.stages), []
    for j in range(2 * n):
        for d in (-1, 1):
            if lo[j] <= v[j] + d <= hi[j]:
                c = v[:]
                c[j] += d
                out.append(c)
    for i in range(n):
        for m in (v[i] - 1, v[i] + 1):
            for up in (False, True):
                c2 = _split(v, pb, i, m, up)
                if c2 is not None:
                    out.append(c2)
        for j in range(n):
            if j != i and v[n + i] < hi[n + i] and v[n + j] > 0:
                c = v[:]
                c[n + i] += 1
                c[n + j] -= 1
                out.append(c)
    return out


def _start(pb: _Problem) -> list[int]:
    """Eq. 1's start: the greedy one (_Problem.start) or, when it is valid
    here and better, Laius's per-GPU balanced split with N_i = C - so that
    Camelot never ends below that baseline's allocation when it is valid
    under Camelot's constraints."""
    n, st = len(pb.stages), pb.start()
    la = laius_allocation(pb.stages, pb.gpu, pb.C, pb.s, pb.qos, granularity=pb.g, bandwidth_cap=pb.cap)
    if not la.feasible or any(q not in lv for q, lv in zip(la.quotas, pb.levels)):
        return st
    v = list(la.instances) + [lv.index(q) for q, lv in zip(la.quotas, pb.levels)]
    a, b = pb.check(st[:n], st[n:]), pb.check(v[:n], v[n:])
    if b[0] == 0 and (a[0] > 0 or min(b[2]) > min(a[2])):
        return v
    return st


def _norm_iters(iters: int) -> int:
    if not isinstance(iters, int) or iters < 0:
        raise ValueError(f"camelot: iters must be an integer >= 0, got {iters!r}")
    return iters


def solve_peak(stages: Sequence[StageModel], gpu: GPUSpec, n_gpus: int, batch: int, qos_s: float, *,
               seed: int = 0, bandwidth_cap: bool = True, granularity: int = 5,
               iters: int = DEFAULT_ITERS) -> Allocation:
    """Eq. 1: the N_i and p_i that maximise min_i N_i f(p_i) on n_gpus GPUs
    under C-1..C-5 (C-3, C-4 per GPU on the Fig. 13 placement), by simulated
    annealing (§VII-C; see the module docstring).  bandwidth_cap=False is
    Camelot-NC (§VIII-D).  Infeasible: feasible=False and why."""
    _check_args(stages, gpu, batch, qos_s, n_gpus, granularity)
    pb = _Problem(stages, gpu, n_gpus, batch, qos_s, bandwidth_cap, granularity)
    if pb.why:
        return pb.infeasible(pb.why)
    best, why = _anneal(pb, seed, _norm_iters(iters), start=_start(pb))
    if best is None:
        return pb.infeasible(f"no valid allocation found in {iters} SA iterations; last violated: {why}")
    return pb.allocation(best[:len(stages)], best[len(stages):])


def min_gpus(stages: Sequence[StageModel], gpu: GPUSpec, batch: int, load_qps: float) -> int:
    """Eq. 2: y = ceil(max((load / s) * sum_i C(i, s) / G, sum_i M(i, s) / F)),
    at least 1 (C(i, s) = gflop(s) of one batch; load / s batches a second)."""
    _check_args(stages, gpu, batch, 0.0)
    if not (isinstance(load_qps, (int, float)) and load_qps >= 0 and math.isfinite(load_qps)):
        raise ValueError(f"min_gpus: load_qps must be a finite number >= 0, got {load_qps!r}")
    compute = load_qps / batch * sum(st.gflop(batch) for st in stages) / gpu.gflops
    memory = sum(st.mem_gb(batch) for st in stages) / gpu.mem_gb
    return max(1, math.ceil(max(compute, memory) - _TOL))


def solve_min(stages: Sequence[StageModel], gpu: GPUSpec, load_qps: float, batch: int, qos_s: float, *,
              seed: int = 0, bandwidth_cap: bool = True, granularity: int = 5,
              max_gpus: int = DEFAULT_MAX_GPUS, iters: int = DEFAULT_ITERS) -> Allocation:
    """Eq. 2, then Eq. 3: on y = min_gpus(...) GPUs (then y + 1, ... up to
    max_gpus while Eq. 1's peak there is below the load), the allocation with
    the least sum_i N_i p_i that carries load_qps (min_i N_i f(p_i) >=
    load_qps) under C-1..C-4 of Eq. 3, by simulated annealing started from
    Eq. 1's peak allocation on those GPUs (which carries the load)."""
    _check_args(stages, gpu, batch, qos_s, 1, granularity)
    if not (isinstance(load_qps, (int, float)) and load_qps > 0 and math.isfinite(load_qps)):
        raise ValueError(f"solve_min: load_qps must be a finite number > 0, got {load_qps!r}")
    if not isinstance(max_gpus, int) or max_gpus < 1:
        raise ValueError(f"solve_min: max_gpus must be an integer >= 1, got {max_gpus!r}")
    y = min_gpus(stages, gpu, batch, load_qps)
    why = f"Eq. 2 needs {y} GPUs > max_gpus = {max_gpus}"
    n = len(stages)
    for c in range(y, max_gpus + 1):
        pb = _Problem(stages, gpu, c, batch, qos_s, bandwidth_cap, granularity)
        if pb.why:
            return pb.infeasible(pb.why)
        if pb.upper() < load_qps:
            why = f"load {load_qps:g} qps is above what {c} GPU(s) can carry (upper bound {pb.upper():.4g} qps)"
            continue
        peak, last = _anneal(pb, seed, _norm_iters(iters))      # Eq. 1 on c GPUs: can they carry it?
        if peak is None or min(peak[i] * pb.f[i][peak[n + i]] for i in range(n)) < load_qps * (1 - _TOL):
            why = f"load {load_qps:g} qps is above the peak Eq. 1 finds on {c} GPU(s)"
            why += f" ({last})" if peak is None else ""
            continue
        best, last = _anneal(pb, seed, _norm_iters(iters), load=float(load_qps), start=peak)
        if best is not None:
            return pb.allocation(best[:n], best[n:])
    return Allocation((), (), batch, 0.0, math.inf, 0, 0, (), False, why)


# --- exhaustive search, for tests ----------------------------------------------------------

def brute_force_peak(stages: Sequence[StageModel], gpu: GPUSpec, n_gpus: int, batch: int, qos_s: float, *,
                     bandwidth_cap: bool = True, granularity: int = 5,
                     max_instances: int | None = None) -> Allocation:
    """Eq. 1 exhaustively: every V with N_i <= the bound the constraints
    imply (or max_instances), the same validity test as solve_peak (the
    constraints, then Fig. 13's placement) and the same ranking.  For tests
    on small instances."""
    _check_args(stages, gpu, batch, qos_s, n_gpus, granularity)
    pb = _Problem(stages, gpu, n_gpus, batch, qos_s, bandwidth_cap, granularity)
    if pb.why:
        return pb.infeasible(pb.why)
    n = len(stages)
    nmax = [min(m, max_instances) if max_instances else m for m in pb.nmax]
    best: list[int] | None = None
    best_key: Key | None = None
    for lv in itertools.product(*[range(len(x)) for x in pb.levels]):
        if pb.latency(lv) > qos_s * (1 + _TOL):
            continue
        pcts = [pb.levels[i][lv[i]] for i in range(n)]
        for ns in itertools.product(*[range(1, m + 1) for m in nmax]):
            thr = min(ns[i] * pb.f[i][lv[i]] for i in range(n))
            if best_key is not None and thr < best_key[0]:
                continue
            if sum(a * b for a, b in zip(ns, pcts)) > n_gpus * gpu.pct:   # C-1: cheap, before check()
                continue
            viol, _, xs, res, lat = pb.check(ns, lv)
            thr = min(xs)
            k = (thr, -res, -lat)
            if not viol and (best_key is None or k > best_key):
                best, best_key = list(ns) + list(lv), k
    if best is None:
        return pb.infeasible("no valid allocation exists (exhaustive)")
    return pb.allocation(best[:n], best[n:])


# --- baselines (§VIII-A) -------------------------------------------------------------------------

def _per_gpu(stages: Sequence[StageModel], gpu: GPUSpec, n_gpus: int, batch: int, qos_s: float,
             pcts: Sequence[int], bandwidth_cap: bool, who: str) -> Allocation:
    """Every GPU runs one instance of each stage at pcts: the Allocation, or why not."""
    n = len(stages)
    lat = sum(st.duration_s(p, batch) for st, p in zip(stages, pcts))
    inst = tuple([n_gpus] * n)
    pl: Placement = tuple(tuple((i, p) for i, p in enumerate(pcts)) for _ in range(n_gpus))
    res = n_gpus * sum(pcts)
    mem = sum(st.mem_gb(batch) for st in stages)
    bw = sum(st.bandwidth_gbs(p, batch) for st, p in zip(stages, pcts))
    why = ""
    if not math.isfinite(lat) or lat > qos_s * (1 + _TOL):
        why = f"{who}: QoS (C-5): latency {lat * 1e3:.4g} ms > {qos_s * 1e3:.4g} ms"
    elif mem > gpu.mem_gb + _TOL:
        why = f"{who}: memory (C-4): one instance per stage needs {mem:.3g} GB > F = {gpu.mem_gb:g} GB"
    elif n > gpu.mps_clients:
        why = f"{who}: MPS clients (C-2): {n} stages > I = {gpu.mps_clients}"
    elif bandwidth_cap and bw > gpu.bandwidth_gbs + _TOL:
        why = f"{who}: bandwidth (C-3): {bw:.4g} GB/s > BW = {gpu.bandwidth_gbs:g} GB/s"
    thr = 0.0 if why else throughput(stages, inst, pcts, batch)
    return Allocation(inst, tuple(pcts), batch, thr, lat, n_gpus, res, pl, not why, why)


def even_allocation(stages: Sequence[StageModel], gpu: GPUSpec, n_gpus: int, batch: int, qos_s: float, *,
                    bandwidth_cap: bool = False) -> Allocation:
    """EA (§VIII-A): every GPU runs one instance of each of the n stages at
    floor(R / n) percent - all the SMs, evenly.  Not bandwidth-aware
    (bandwidth_cap=True also checks C-3)."""
    _check_args(stages, gpu, batch, qos_s, n_gpus)
    p = gpu.pct // len(stages)
    if p < 1:
        return Allocation((), (), batch, 0.0, math.inf, 0, 0, (), False,
                          f"EA: {len(stages)} stages cannot share R = {gpu.pct} %")
    return _per_gpu(stages, gpu, n_gpus, batch, qos_s, [p] * len(stages), bandwidth_cap, "EA")


def laius_allocation(stages: Sequence[StageModel], gpu: GPUSpec, n_gpus: int, batch: int, qos_s: float, *,
                     granularity: int = 5, bandwidth_cap: bool = False) -> Allocation:
    """Laius-per-GPU (§VIII-A): every GPU runs the whole pipeline, one instance
    per stage, at the split p (multiples of granularity, sum <= R) that
    maximises min_i f(p_i) under QoS (C-5), memory and clients of the GPU
    (ties: fewest SMs); total throughput = n_gpus times one GPU's.  No
    instance counts, no placement across GPUs; not bandwidth-aware unless
    bandwidth_cap=True."""
    _check_args(stages, gpu, batch, qos_s, n_gpus, granularity)
    levels = list(range(granularity, gpu.pct + 1, granularity))
    f = [[_rate(st, p, batch) for p in levels] for st in stages]
    d = [[st.duration_s(p, batch) if _ok(st.duration_s(p, batch)) else math.inf for p in levels] for st in stages]
    bw = [[st.bandwidth_gbs(p, batch) for p in levels] for st in stages]
    best: tuple[float, int] | None = None
    pick: list[int] = []

    def walk(i: int, used: int, lat: float, band: float, lo: float, chosen: list[int]) -> None:
        nonlocal best, pick
        if i == len(stages):
            rank = (lo, -used)
            if best is None or rank > best:
                best, pick = rank, list(chosen)
            return
        for k, p in enumerate(levels):
            if used + p + granularity * (len(stages) - i - 1) > gpu.pct:
                break
            lt, bd = lat + d[i][k], band + bw[i][k]
            if lt > qos_s * (1 + _TOL) or (bandwidth_cap and bd > gpu.bandwidth_gbs + _TOL):
                continue
            walk(i + 1, used + p, lt, bd, min(lo, f[i][k]), chosen + [k])

    walk(0, 0, 0.0, 0.0, math.inf, [])
    if best is None:
        cap = f" and BW = {gpu.bandwidth_gbs:g} GB/s (C-3)" if bandwidth_cap else ""
        return Allocation((), (), batch, 0.0, math.inf, 0, 0, (), False,
                          f"Laius: no split of one GPU's {gpu.pct} % meets QoS = {qos_s * 1e3:.4g} ms (C-5){cap}")
    return _per_gpu(stages, gpu, n_gpus, batch, qos_s, [levels[k] for k in pick], bandwidth_cap, "Laius")


def laius_min(stages: Sequence[StageModel], gpu: GPUSpec, load_qps: float, batch: int, qos_s: float, *,
              granularity: int = 5, max_gpus: int = DEFAULT_MAX_GPUS) -> Allocation:
    """Laius at low load (§VIII-B's baseline for Fig. 16): the whole pipeline
    on each of k GPUs, one instance per stage ("it ... does not adjust the
    number of instances for each microservice stage"), each stage at the
    least quota carrying its share load/k (C-Laius's just-enough quota, its
    Eq. 3, per stage); then, while the summed durations miss QoS, one more
    granularity step to the stage whose duration drops most for it.  The
    least k (1..max_gpus) that fits one GPU.  Not bandwidth-aware."""
    _check_args(stages, gpu, batch, qos_s, 1, granularity)
    if not (load_qps > 0 and math.isfinite(load_qps)):
        raise ValueError(f"camelot: load_qps must be a number > 0, got {load_qps!r}")
    levels = list(range(granularity, gpu.pct + 1, granularity))
    why = "no GPU count up to max_gpus carries the load"
    for k in range(1, max_gpus + 1):
        per = load_qps / k
        pick = [next((j for j, p in enumerate(levels) if _rate(st, p, batch) >= per), None) for st in stages]
        if any(j is None for j in pick):
            continue
        idx = [int(j) for j in pick if j is not None]

        def lat() -> float:
            return sum(st.duration_s(levels[j], batch) for st, j in zip(stages, idx))
        while lat() > qos_s * (1 + _TOL):
            gains = [(st.duration_s(levels[j], batch) - st.duration_s(levels[j + 1], batch), i)
                     for i, (st, j) in enumerate(zip(stages, idx)) if j + 1 < len(levels)]
            if not gains:
                break
            idx[max(gains)[1]] += 1
        pcts = [levels[j] for j in idx]
        if lat() > qos_s * (1 + _TOL):
            why = f"Laius: no quotas meet QoS = {qos_s * 1e3:.4g} ms (C-5)"
            continue
        if sum(pcts) > gpu.pct:
            why = f"Laius: the pipeline's just-enough quotas {pcts} exceed one GPU"
            continue
        a = _per_gpu(stages, gpu, k, batch, qos_s, pcts, False, "Laius")
        if a.feasible:
            return a
        why = a.why
    return Allocation((), (), batch, 0.0, math.inf, 0, 0, (), False, f"{why} (load {load_qps:.4g} qps)")


# --- the allocators by name ----------------------------------------------------------------

Allocator = Callable[..., Allocation]


def _camelot_nc(stages: Sequence[StageModel], gpu: GPUSpec, n_gpus: int, batch: int, qos_s: float,
                **kw: object) -> Allocation:
    return solve_peak(stages, gpu, n_gpus, batch, qos_s, bandwidth_cap=False, **kw)  # type: ignore[arg-type]


ALLOCATORS: dict[str, Allocator] = {
    "camelot": solve_peak,            # Eq. 1 with the bandwidth cap
    "camelot-nc": _camelot_nc,        # Eq. 1 without C-3 (§VIII-D)
    "ea": even_allocation,            # §VIII-A
    "laius": laius_allocation,        # §VIII-A, Laius per GPU
}


def allocate(name: str, stages: Sequence[StageModel], gpu: GPUSpec, n_gpus: int, batch: int, qos_s: float,
             **kw: object) -> Allocation:
    """The peak-load allocation of allocator `name` (ALLOCATORS) on n_gpus GPUs."""
    if name not in ALLOCATORS:
        raise ValueError(f"unknown allocator {name!r} (known: {', '.join(sorted(ALLOCATORS))})")
    return ALLOCATORS[name](stages, gpu, n_gpus, batch, qos_s, **kw)
