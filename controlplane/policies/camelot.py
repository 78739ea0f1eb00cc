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
    C-P   per GPU: sum of pcie(p_i) over the instances placed there <= PCIe
          (ours, not printed; pcie_cap=False drops it - see below)

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

Search (§VII-C): simulated annealing over V = [N_1..N_n, p_1..p_n] in
which the instance counts follow the quotas, deterministic for a seed
(random.Random(seed)), DEFAULT_ITERS iterations:
  - the chain's state is the quota levels (multiples of granularity); its
    N is the best for them: Eq. 1, the least N_i carrying the greatest
    min_i N_i f(p_i) that the global sums of C-1..C-4 allow (closed-form
    bounds, then a few one-instance steps: _Problem.fill), lowered along
    N(t) = ceil(t / f(p_i)) until Fig. 13 places it (galloping binary
    search); Eq. 3, the least N_i with N_i f(p_i) >= the load.  Each quota
    vector is evaluated once (cached).  Searching N by single steps as well
    (the paper's moves on N_i) needed about 2x the iterations for the same
    quality and wandered through states that are worse only for lack of an
    instance;
  - moves: half of them change one p_i by one granularity step (the paper's
    move); a quarter move one step from stage j to stage i (about the same
    SMs); a quarter set p_i to the level next to N_i p_i / (N_i +- 1) (a
    split or merge that keeps the stage's SMs: from 1 x 60 % to 2 x 30 %);
  - acceptance of a worse state: exp(delta / T), T cooling geometrically from
    T0 = 0.3 to T1 = 0.01 over the iterations; the energy is relative to the
    best valid value met so far (temperatures are fractions of it): Eq. 1,
    throughput less EPS_RES of the resources used; Eq. 3, -sum N_i p_i;
  - the paper rejects an invalid V'; we let the chain cross invalid states
    (QoS missed, or not even one instance per stage fits) at a penalty
    lam * (0.05 + relative excess over the violated constraints), lam
    growing from 1 to 20 over the run.  Only valid states (every constraint
    and the placement of Fig. 13 succeeding) become the result: the best is
    kept (Eq. 1: max throughput, then fewest sum N_i p_i, then lowest
    latency; Eq. 3: fewest sum N_i p_i, then throughput, then latency), then
    polished by steepest ascent over its neighbours' quotas (one step of
    one p_i, or one step from one stage to another) until none is better;
  - Eq. 1's chain starts from the better of the greedy quotas (one step at a
    time to the stage that cuts the most latency per percent, until QoS
    holds) and Laius's split (below), and Laius's own allocation competes
    for the result, so Camelot never ends below that baseline when it is
    valid under Camelot's constraints.  Eq. 3's starts from the quotas of
    the first state carrying the load that Eq. 1's search meets.
On random 2-3 stage, 1-2 GPU instances (granularity 10, 102 instances x 2
seeds) the result is the exhaustive optimum in 203 of 204 runs at 800
iterations (0.993 of it in the other); the earlier search over N and p with
single steps: 196 of 204 at 1 500 iterations (worst 0.898).

Exact search (method "exact"; "auto", the default, uses it when there are
at most EXACT_STATES quota vectors - a 3-stage pipeline at 5 % steps has
8 000 - and the annealing above beyond): the annealing's state space is the
quota vectors, N following them, and for the paper's 2-3 stage pipelines it
is small enough to bound as a whole.  _Problem.grid computes, with NumPy,
for every quota vector at once, whether it can be valid at all (latency,
one instance per stage within the global sums) and Eq. 1's throughput of
fill() (the global sums with integer N; the placement aside, so an upper
bound of the state's value); the vectors are then evaluated exactly
(fill_placed, every check, Fig. 13) in decreasing order of that bound until
the next bound is below the best throughput found: branch and bound.  Eq. 3
the same in increasing order of resources (exact: N is least()).  The
result is the optimum the annealing searches for (it can only be better:
on the random instances of tests/test_camelot_alloc.py it equals the
exhaustive search over N and p), in 1-6 ms instead of 6-28 ms on 1-2 GPUs
(bench/camelot_solve.py).  The bounds ignore the per-GPU packing: where it
binds hard (many GPUs, large instances) many vectors reach their turn and
fail to place, so "auto" evaluates at most EXACT_EVALS of them and then
anneals from the best found (a case an independent review found: 1.9 s
exact, 0.13-0.2 s annealing, 0.29 s now); method="exact" has no such cap and
refuses more than EXACT_MAX vectors.  §VII-C's annealing stays for larger
spaces and is what method="sa" runs.

Camelot-NC (§VIII-D) is bandwidth_cap=False: the same search without C-3.

C-P, the PCIe constraint, is our addition (pcie_cap=True by default;
pcie_cap=False is Eq. 1 as printed).  §VI-A / Fig. 9 measure the copy
time growing once more than three PCIe-intensive instances share a GPU and
explain it as this very sum: "if a GPU hosts more than floor(12160 / 3150)
= 3 PCIe-intensive microservice instances, the microservices contend for
the limited PCIe bandwidth" (12.16 GB/s effective link, 3.15 GB/s per
memcpy); §VII-D / Fig. 13 list PCIe bandwidth among a GPU's resource
dimensions, and §VIII-B says Camelot "schedules microservice instances
considering the runtime shared resource contention (global memory
bandwidth, and PCIe bandwidth)" - yet Eq. 1 has no PCIe term, so without it
the search stacks instances of a copy-bound stage on a GPU, each predicted
at its solo (whole-link) rate, and they share one link.  A stage may offer
pcie_gbs(pct, batch), its host<->device traffic rate while it runs (an
OPTIONAL StageModel method, read with getattr; a stage without it moves 0
GB/s); GPUSpec.pcie_gbs is the link's effective rate (0: not modelled, no
check).  Checked like C-3: globally in the search's sums and per GPU in the
placement of Fig. 13.  One instance's rate is clamped to the link's (one
copy can use all of it, not more: a prediction above it is an error of the
predictor, not a reason to refuse the stage).  Camelot-NC keeps C-P.  EA and
Laius are not PCIe-aware, as they are not bandwidth-aware.

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

import numpy as np

from controlplane.policies.camelot_place import Placement, fits, pack, place
from controlplane.policies.camelot_place import stage_pcie_gbs as _pcie

__all__ = ["ALLOCATORS", "Allocation", "GPUSpec", "StageModel", "ToyStage", "allocate", "brute_force_peak",
           "even_allocation", "gpu_preset", "laius_allocation", "laius_min", "min_gpus", "place", "solve_min",
           "solve_peak", "throughput"]

_TOL = 1e-9
T0, T1 = 0.3, 1e-2            # SA temperature, start and end (fractions of the best value)
LAM0, LAM1 = 1.0, 20.0        # penalty weight on an invalid state, start and end
PEN0 = 0.05                   # an invalid state's least penalty (times lam)
TRADE = 0.25                  # share of the moves that trade one quota step between stages
SPLIT = 0.25                  # share of the moves that split / merge a stage's instances
POLISH_ROUNDS = 20            # steepest-ascent rounds on the best state, at most
EPS_RES = 0.01                # Eq. 1's energy prefers fewer resources at equal throughput
DEFAULT_ITERS = 800
FILL_STEPS = 64               # _Problem.grid's steps down to fill's throughput, at most
EXACT_STATES = 20_000         # method "auto": enumerate the quota vectors when there are at most this many
EXACT_EVALS = 400             # ... and evaluate at most this many with the placement, else anneal from there
EXACT_MAX = 2_000_000         # method "exact": refuse more vectors than this (its arrays grow with them)
METHODS = ("auto", "exact", "sa")
DEFAULT_MAX_GPUS = 16


class StageModel(Protocol):
    """One microservice stage's predicted performance (§VII-A, Table II)."""
    name: str

    def duration_s(self, pct: int, batch: int) -> float: ...      # one batch at pct % of the SMs

    def bandwidth_gbs(self, pct: int, batch: int) -> float: ...   # b(p): global-memory GB/s while running

    def mem_gb(self, batch: int) -> float: ...                    # M(i, s): one instance's footprint

    def gflop(self, batch: int) -> float: ...                     # C(i, s): work of one batch

    # Optional (not part of the Protocol; read with getattr, absent = 0):
    #   def pcie_gbs(self, pct: int, batch: int) -> float   # host<->device GB/s while running (C-P)


@dataclass(frozen=True)
class GPUSpec:
    """Table II's per-GPU constants: R (pct), I (mps_clients), BW, F, G."""
    name: str = "2080Ti"
    pct: int = 100                   # R, in percent
    mps_clients: int = 48            # I
    bandwidth_gbs: float = 616.0     # BW
    mem_gb: float = 11.0             # F
    gflops: float = 13450.0          # G
    pcie_gbs: float = 0.0            # effective host<->device GB/s of the GPU's link; 0: not modelled (no C-P)

    def __post_init__(self) -> None:
        if self.pct < 1 or self.mps_clients < 1:
            raise ValueError(f"GPUSpec {self.name}: pct and mps_clients must be >= 1")
        if not (self.bandwidth_gbs > 0 and self.mem_gb > 0 and self.gflops > 0):
            raise ValueError(f"GPUSpec {self.name}: bandwidth_gbs, mem_gb and gflops must be > 0")
        if not (self.pcie_gbs >= 0 and math.isfinite(self.pcie_gbs)):
            raise ValueError(f"GPUSpec {self.name}: pcie_gbs must be a finite number >= 0 (0: not modelled)")


_PRESETS: dict[str, GPUSpec] = {
    # RTX 2080 Ti: 616 GB/s (Camelot §VIII-A, from its ref. [55]); 11 GB GDDR6 and
    # 13.45 TFLOPS FP32 at the reference boost clock (NVIDIA's Turing specs).
    # PCIe (all presets: C-P, our addition): 2080Ti and V100 systems are PCIe 3.0 x16,
    # 12.16 GB/s effective as Camelot §VI-A cites; H100 SXM5 is PCIe 5.0 x16, 54.8 GB/s
    # measured pinned H2D (bench/RESULTS.md, shim/simgpu/config.c's default).
    "2080ti": GPUSpec("2080Ti", 100, 48, 616.0, 11.0, 13450.0, 12.16),
    # V100 of the DGX-2: 897 GB/s (Camelot §VIII-A); 32 GB HBM2 (DGX-2 datasheet: 16 x V100
    # 32 GB); 15.7 TFLOPS FP32 (V100 SXM2 datasheet; the DGX-2's SXM3 parts clock a bit higher).
    "v100": GPUSpec("V100", 100, 48, 897.0, 32.0, 15700.0, 12.16),
    # H100 SXM5 80 GB: 3.35 TB/s, 80 GB HBM3, 67 TFLOPS FP32 (NVIDIA H100 datasheet).
    "h100": GPUSpec("H100", 100, 48, 3350.0, 80.0, 67000.0, 54.8),
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
    model_gb + act_gb_per_item * s, work = gflop_per_item * s, PCIe traffic
    (the optional pcie_gbs) = pcie_gb_per_item * s / duration."""
    name: str
    ms_per_item: float = 1.0
    fixed_ms: float = 1.0
    knee: int = 100
    gb_per_item: float = 0.1
    model_gb: float = 1.0
    act_gb_per_item: float = 0.05
    gflop_per_item: float = 5.0
    pcie_gb_per_item: float = 0.0

    def duration_s(self, pct: int, batch: int) -> float:
        return (self.fixed_ms + self.ms_per_item * batch * self.knee / min(pct, self.knee)) / 1000.0

    def bandwidth_gbs(self, pct: int, batch: int) -> float:
        return self.gb_per_item * batch / self.duration_s(pct, batch)

    def mem_gb(self, batch: int) -> float:
        return self.model_gb + self.act_gb_per_item * batch

    def gflop(self, batch: int) -> float:
        return self.gflop_per_item * batch

    def pcie_gbs(self, pct: int, batch: int) -> float:
        return self.pcie_gb_per_item * batch / self.duration_s(pct, batch)


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


Checked = tuple[float, str, list[float], int, float]   # violation, code, N_i f(p_i), resources, latency


class _Problem:
    """The stages' predictions per allowed quota, and the constraint checks of
    Eq. 1 / Eq. 3 on a state (N, level indices)."""

    def __init__(self, stages: Sequence[StageModel], gpu: GPUSpec, n_gpus: int, batch: int,
                 qos_s: float, bandwidth_cap: bool, granularity: int, pcie_cap: bool = True,
                 affinity: bool = False):
        self.stages, self.gpu, self.C, self.s = stages, gpu, n_gpus, batch
        self.aff = affinity                                        # camelot_place's affinity (ours)
        self.qos, self.cap, self.g = float(qos_s), bandwidth_cap, granularity
        self.pcap = bool(pcie_cap) and gpu.pcie_gbs > 0          # C-P checked (ours)
        self.levels: list[list[int]] = []
        self.dur: list[list[float]] = []
        self.f: list[list[float]] = []
        self.bw: list[list[float]] = []
        self.pc: list[list[float]] = []           # PCIe GB/s per instance, clamped to the link (C-P)
        self.mem = [float(st.mem_gb(batch)) for st in stages]
        self.why = ""
        for st in stages:
            lv, du, ff, bb, pp = [], [], [], [], []
            for p in range(granularity, gpu.pct + 1, granularity):
                d = float(st.duration_s(p, batch))
                b = float(st.bandwidth_gbs(p, batch))
                if not _ok(d) or (bandwidth_cap and b > gpu.bandwidth_gbs + _TOL):
                    continue
                lv.append(p)
                du.append(d)
                ff.append(batch / d)
                bb.append(max(b, 0.0) if math.isfinite(b) else math.inf)
                pp.append(min(_pcie(st, p, batch), gpu.pcie_gbs) if self.pcap else 0.0)
            self.pc.append(pp)
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
        # the global sums of C-1..C-4 (C-3 when capped) and C-P (when checked): per
        # instance of stage i at level k, and limits
        self.coef: list[list[tuple[float, ...]]] = [
            [(float(p), 1.0, m) + ((b,) if bandwidth_cap else ()) + ((c,) if self.pcap else ())
             for p, b, c in zip(lv, bb, pp)]
            for lv, bb, pp, m in zip(self.levels, self.bw, self.pc, self.mem)]
        self.lims: tuple[float, ...] = (float(n_gpus * gpu.pct), float(n_gpus * gpu.mps_clients),
                                        n_gpus * gpu.mem_gb + _TOL)
        if bandwidth_cap:
            self.lims += (n_gpus * gpu.bandwidth_gbs + _TOL,)
        if self.pcap:
            self.lims += (n_gpus * gpu.pcie_gbs + _TOL,)
        # N_i at level k is at most nmax_i and what C GPUs take of stage i alone (placement's bound)
        self.cap_n = [[min(self.nmax[i], n_gpus * self._per_gpu(p, self.mem[i], b, c))
                       for p, b, c in zip(lv, bb, pp)]
                      for i, (lv, bb, pp) in enumerate(zip(self.levels, self.bw, self.pc))]

    def _per_gpu(self, pct: int, mem: float, bw: float, pcie: float = 0.0) -> int:
        """How many instances of (pct, mem, bw, pcie) one GPU takes."""
        gpu, k = self.gpu, min(self.gpu.mps_clients, self.gpu.pct // pct)
        if mem > 0:
            k = min(k, int((gpu.mem_gb + _TOL) // mem))
        if self.cap and bw > 0:
            k = min(k, int((gpu.bandwidth_gbs + _TOL) // bw))
        if self.pcap and pcie > 0:
            k = min(k, int((gpu.pcie_gbs + _TOL) // pcie))
        return max(k, 1)

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

    def qos_excess(self, lat: float) -> float:
        """C-5's relative excess of latency lat over QoS (0 within it), as check() counts it."""
        if lat <= self.qos * (1 + _TOL):
            return 0.0
        return lat / self.qos - 1 if self.qos > 0 else 1.0

    def check(self, n: Sequence[int], lv: Sequence[int]) -> Checked:
        """(violation, code, stage throughputs N_i f(p_i), resources, latency) of state (n, lv):
        violation 0 when every constraint of Eq. 1 holds and Fig. 13 places it;
        else the summed relative excess (placement failure: 0.05); code names
        the first violated constraint (explain() puts it in words)."""
        gpu, C = self.gpu, self.C
        lat = mem = bw = pc = 0.0
        res = cl = 0
        xs, pcts, bws, pcs = [], [], [], []
        for i, m in enumerate(n):
            k = lv[i]
            p, b, c = self.levels[i][k], self.bw[i][k], self.pc[i][k]
            lat += self.dur[i][k]
            xs.append(m * self.f[i][k])
            pcts.append(p)
            bws.append(b)
            pcs.append(c)
            res += m * p
            cl += m
            mem += m * self.mem[i]
            bw += m * b
            pc += m * c
        viol = self.qos_excess(lat)
        why = "C-5" if viol else ""
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
        if self.pcap and pc > C * gpu.pcie_gbs + _TOL:
            viol += pc / (C * gpu.pcie_gbs) - 1
            why = why or "C-P"
        if viol == 0 and C > 1 and not fits(n, pcts, self.mem, bws, gpu, C, self.cap,
                                            pcs, self.pcap, self.aff):   # 1 GPU: as above
            viol, why = PEN0, "place"
        return viol, why, xs, res, lat

    def explain(self, n: Sequence[int], lv: Sequence[int]) -> str:
        """The first violated constraint of state (n, lv), in words ("" if none)."""
        gpu, C = self.gpu, self.C
        viol, code, xs, res, lat = self.check(n, lv)
        mem = sum(m * x for m, x in zip(n, self.mem))
        bw = sum(m * self.bw[i][lv[i]] for i, m in enumerate(n))
        pc = sum(m * self.pc[i][lv[i]] for i, m in enumerate(n))
        return {
            "": "",
            "C-5": f"QoS (C-5): latency {lat * 1e3:.4g} ms > {self.qos * 1e3:.4g} ms",
            "C-1": f"SMs (C-1): {res} % > C * R = {C * gpu.pct} %",
            "C-2": f"MPS clients (C-2): {sum(n)} > C * I = {C * gpu.mps_clients}",
            "C-4": f"memory (C-4): {mem:.3g} GB > C * F = {C * gpu.mem_gb:g} GB",
            "C-3": f"bandwidth (C-3): {bw:.4g} GB/s > C * BW = {C * gpu.bandwidth_gbs:g} GB/s",
            "C-P": f"PCIe (C-P, ours): {pc:.4g} GB/s > C * PCIe = {C * gpu.pcie_gbs:g} GB/s",
            "place": "placement (Fig. 13): the instances do not fit the GPUs one by one (R, F, BW, PCIe, I per GPU)",
        }[code]

    def start(self) -> list[int]:
        """The greedy start's quota levels: every stage at its least quota, then,
        while the latency is over QoS, one step up for the stage whose step cuts
        the most latency per percent."""
        k = len(self.stages)
        lv = [0] * k
        while self.latency(lv) > self.qos * (1 + _TOL):
            gain = [((self.dur[i][lv[i]] - self.dur[i][lv[i] + 1])
                     / (self.levels[i][lv[i] + 1] - self.levels[i][lv[i]]), -i)
                    for i in range(k) if lv[i] + 1 < len(self.levels[i])]
            if not gain:
                break
            lv[-max(gain)[1]] += 1
        return lv

    def counts(self, lv: Sequence[int], t: float) -> list[int]:
        """N(t) = ceil(t / f(p_i)): the least instance counts carrying t at levels lv."""
        return [max(1, math.ceil(t / self.f[i][k] - 1e-9)) for i, k in enumerate(lv)]

    def last(self, lv: Sequence[int], ts: list[float], ok: Callable[[list[int]], bool],
             gallop: bool = False) -> list[int]:
        """N(t) for the last t of the sorted ts with ok(N(t)) (ok falls as t
        grows), by binary search - after probing 1, 2, 4, ... steps down from
        the top when gallop (the answer is usually near it); one instance per
        stage when none is ok."""
        best, lo, hi = [1] * len(lv), 0, len(ts)          # the answer's index is in [lo - 1, hi)
        step = 1
        while gallop and step <= hi - lo:
            ns = self.counts(lv, ts[hi - step])
            if ok(ns):
                best, lo = ns, hi - step + 1
                break
            hi, step = hi - step, 2 * step
        while lo < hi:
            mid = (lo + hi) // 2
            ns = self.counts(lv, ts[mid])
            if ok(ns):
                best, lo = ns, mid + 1
            else:
                hi = mid
        return best

    def fill(self, lv: Sequence[int]) -> list[int]:
        """Eq. 1's instance counts at quota levels lv: N(t) = ceil(t / f(p_i))
        for the greatest t at which they fit the global sums of C-1..C-4 and
        N_i <= nmax_i (QoS and the placement aside): the most throughput with
        the fewest instances.  From N(lo), lo the continuous optimum less one
        instance per stage (closed form, surely fits), the bottleneck stage
        gets one more instance while that fits (a few steps; exact, as the
        sums grow with every N_i), then the others drop what it does not
        need.  One instance per stage when even that does not fit."""
        n, lims = len(lv), self.lims
        nmax = [self.cap_n[i][k] for i, k in enumerate(lv)]
        f = [self.f[i][k] for i, k in enumerate(lv)]
        a = [self.coef[i][k] for i, k in enumerate(lv)]
        lo = min(nmax[i] * f[i] for i in range(n))
        for r, lim in enumerate(lims):
            w = sum(a[i][r] / f[i] for i in range(n))
            if w > 0:
                lo = min(lo, (lim - sum(x[r] for x in a)) / w)
        ns = self.counts(lv, lo) if lo > 0 else [1] * n
        used = [sum(x[r] * m for x, m in zip(a, ns)) for r in range(len(lims))]
        if any(u > lim for u, lim in zip(used, lims)):
            return [1] * n
        while True:
            i = min(range(n), key=lambda j: ns[j] * f[j])
            ai = a[i]
            if ns[i] >= nmax[i] or any(u + x > lim for u, x, lim in zip(used, ai, lims)):
                break
            ns[i] += 1
            used = [u + x for u, x in zip(used, ai)]
        thr = min(m * x for m, x in zip(ns, f))
        return [max(1, math.ceil(thr / x - 1e-9)) if (m - 1) * x >= thr else m for m, x in zip(ns, f)]

    def fill_placed(self, lv: Sequence[int]) -> tuple[list[int], Checked | None]:
        """fill(lv), or, when Fig. 13 cannot place that, N(t) for the greatest
        t below it that passes every check (galloping binary search on t).
        On one GPU the global sums are the placement.  Also check(N, lv)
        when it was made here (None when not: the caller checks)."""
        ns = self.fill(lv)
        if self.C == 1:
            return ns, None
        chk = self.check(ns, lv)
        if chk[1] != "place":
            return ns, chk
        f = [self.f[i][k] for i, k in enumerate(lv)]
        thr = min(m * x for m, x in zip(ns, f))
        ts = sorted({k * x for x, m in zip(f, ns) for k in range(1, m + 1) if k * x < thr})
        return self.last(lv, ts, lambda m: self.check(m, lv)[0] == 0, gallop=True), None

    def ceiling(self, lv: Sequence[int]) -> tuple[float, float, int]:
        """Without filling or placing: (an upper bound of Eq. 1's throughput
        at levels lv, a lower bound of the violation, a lower bound of the
        resources).  With one instance per stage within the global sums,
        fill's N carries t only if sum_i a_ir N_i <= lim_r for every sum r
        while N_i >= t / f_i, so t <= lim_r / sum_i (a_ir / f_i); and N_i <=
        cap_n.  Without: fill gives one instance per stage (throughput
        min_i f_i), invalid.  The latency (C-5) is exact."""
        f = [self.f[i][k] for i, k in enumerate(lv)]
        a = [self.coef[i][k] for i, k in enumerate(lv)]
        viol = self.qos_excess(self.latency(lv))
        res = sum(self.levels[i][k] for i, k in enumerate(lv))
        ones = [sum(x[r] for x in a) for r in range(len(self.lims))]
        if any(u > lim for u, lim in zip(ones, self.lims)):     # fill gives one instance each: its violation
            return min(f), self.check([1] * len(lv), lv)[0], res
        t = min(self.cap_n[i][k] * f[i] for i, k in enumerate(lv))
        for r, lim in enumerate(self.lims):
            w = sum(x[r] / y for x, y in zip(a, f))
            if w > 0:
                t = min(t, lim / w)
        return t * (1 + 1e-9), viol, res          # (slack for rounding in the sums)

    def states(self) -> int:
        """How many quota-level vectors there are (the search space of V's p part)."""
        return math.prod(len(x) for x in self.levels)

    def _tables(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """Per stage, by level: f, cap_n, coef (L x R) and duration, as arrays (once)."""
        if not hasattr(self, "_tab"):
            self._tab = [(np.asarray(self.f[i]), np.asarray(self.cap_n[i], dtype=float),
                          np.asarray(self.coef[i]).reshape(len(self.levels[i]), len(self.lims)),
                          np.asarray(self.dur[i])) for i in range(len(self.stages))]
        return self._tab

    def grid(self, floor: float = 0.0, fill: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """The quota-level vectors that may be valid (latency within QoS, one
        instance per stage within the global sums; k x n), with the
        throughput of fill() at each when fill (else the continuous ceiling
        of ceiling()), all at once; when floor > 0, only those whose ceiling
        is at least floor.  fill's throughput is the greatest t in {k f_i}
        with N(t) = ceil(t / f_i) <= cap_n within the global sums: from
        ceiling()'s t, rounded down to that set, each step goes to the next
        t below (max_i (N_i(t) - 1) f_i) on the vectors where N(t) does not
        fit yet (-inf when even one instance per stage... cannot).  After
        FILL_STEPS steps the vectors still unresolved keep their (larger) t:
        an upper bound either way."""
        n, tab, lims = len(self.stages), self._tables(), np.asarray(self.lims)
        shape = tuple(len(x) for x in self.levels)

        def outer(vals: list[np.ndarray], op: np.ufunc = np.add) -> np.ndarray:   # over the whole grid
            tot = vals[0].reshape([-1] + [1] * (n - 1))
            for i in range(1, n):
                tot = op(tot, vals[i].reshape([-1 if j == i else 1 for j in range(n)]))
            return np.broadcast_to(tot, shape).ravel()

        # the bound is separable: sums and a min of per-stage terms, on the whole grid at once
        live = outer([d for *_, d in tab]) <= self.qos * (1 + _TOL)
        t = outer([cap * f for f, cap, _, _ in tab], np.minimum)
        for r, lim in enumerate(self.lims):
            live &= outer([c[:, r] for _, _, c, _ in tab]) <= lim
            w = outer([c[:, r] / f for f, _, c, _ in tab])
            with np.errstate(divide="ignore"):
                t = np.minimum(t, np.where(w > 0, lim / np.where(w > 0, w, 1.0), np.inf))
        t = t * (1 + 1e-9)
        rows = np.flatnonzero(live & (t >= floor))
        idx = np.stack(np.unravel_index(rows, shape), axis=1)
        t = t[rows]
        if not fill:
            return idx, t
        f = np.stack([tab[i][0][idx[:, i]] for i in range(n)], axis=1)
        cap = np.stack([tab[i][1][idx[:, i]] for i in range(n)], axis=1)
        a = np.stack([tab[i][2][idx[:, i]] for i in range(n)], axis=1)        # k x n x R
        out = np.full(len(idx), -np.inf)
        at = np.arange(len(idx))
        t = np.max(np.floor(t[:, None] / f * (1 + 1e-12)) * f, axis=1)     # the set's largest <= t
        for _ in range(FILL_STEPS):
            ns = np.maximum(1.0, np.ceil(t[:, None] / f - 1e-9))
            fits = np.all(ns <= cap, axis=1) & np.all((ns[:, :, None] * a).sum(axis=1) <= lims, axis=1)
            out[at[fits]] = t[fits]
            at, t, f, cap, a, ns = at[~fits], t[~fits], f[~fits], cap[~fits], a[~fits], ns[~fits]
            if not len(at):
                break
            t = np.max((ns - 1) * f, axis=1)
            low = t <= 0                     # not even one instance each: fill gives ones, invalid
            at, t, f, cap, a = at[~low], t[~low], f[~low], cap[~low], a[~low]
        out[at] = t
        return idx, out

    def least(self, lv: Sequence[int], load: float) -> list[int]:
        """Eq. 3's instance counts at quota levels lv: the least N_i with
        N_i f(p_i) >= load (at most nmax_i)."""
        return [min(self.nmax[i], max(1, math.ceil(load * (1 - _TOL) / self.f[i][k]))) for i, k in enumerate(lv)]
    def upper(self) -> float:
        """An upper bound of the objective: every stage alone with its most instances."""
        return min(max(nm * x for x in ff) for nm, ff in zip(self.nmax, self.f))

    def allocation(self, n: Sequence[int], lv: Sequence[int], why: str = "") -> Allocation:
        """The Allocation of a valid state (placed by Fig. 13)."""
        pcts = [self.levels[i][lv[i]] for i in range(len(n))]
        bws = [self.bw[i][lv[i]] for i in range(len(n))]
        pcs = [self.pc[i][lv[i]] for i in range(len(n))]
        pl = pack(list(n), pcts, self.mem, bws, self.gpu, self.C, self.cap, pcs, self.pcap, self.aff)
        assert pl is not None, "a valid state is placed"
        return Allocation(tuple(n), tuple(pcts), self.s, throughput(self.stages, n, pcts, self.s),
                          self.latency(lv), sum(1 for g in pl if g), sum(a * b for a, b in zip(n, pcts)),
                          pl, True, why)

    def infeasible(self, why: str) -> Allocation:
        return Allocation((), (), self.s, 0.0, math.inf, 0, 0, (), False, why)


# --- simulated annealing (§VII-C) ------------------------------------------------------------

Key = tuple[float, float, float]
Eval = tuple[float, int, float, "Key | None", list[int], str]   # obj, resources, violation, key, N, code


class _Chain:
    """One search's states: quota levels -> their N and ranking (cached), and
    the best valid V = N + levels met so far."""

    def __init__(self, pb: _Problem, load: float | None):
        self.pb, self.load, self.peak = pb, load, load is None
        self.cache: dict[tuple[int, ...], Eval] = {}
        self.scale = float(pb.C * pb.gpu.pct)
        self.best: list[int] | None = None
        self.best_key: Key | None = None
        self.last_bad: list[int] | None = None

    def visit(self, lv: tuple[int, ...]) -> Eval:
        """The state at quota levels lv (evaluated once); keeps the best."""
        h = self.cache.get(lv)
        if h is None:
            h = self.cache[lv] = self._eval(lv)
            self.offer(h, h[4] + list(lv))
        return h

    def offer(self, h: Eval, v: list[int]) -> None:
        if h[3] is None:
            self.last_bad = v
        elif self.best_key is None or h[3] > self.best_key:
            self.best, self.best_key = v, h[3]

    def _eval(self, lv: Sequence[int], ns: list[int] | None = None) -> Eval:
        """The state at levels lv with counts ns (default: N following lv):
        (objective, resources, violation, ranking key when valid, N, code)."""
        pb, load, chk = self.pb, self.load, None
        if ns is None:
            ns, chk = pb.fill_placed(lv) if load is None else (pb.least(lv, load), None)
        viol, why, xs, res, lat = chk or pb.check(ns, lv)
        thr = min(xs)
        if load is not None and thr < load * (1 - _TOL):
            viol += 1.0 - thr / load
            why = why or "load"
        if load is None:
            return thr, res, viol, None if viol else (thr, -res, -lat), ns, why
        return -float(res), res, viol, None if viol else (-res, thr, -lat), ns, why

    def hopeless(self, lv: tuple[int, ...], floor: float, norm: float, lam: float) -> bool:
        """Whether the unvisited state lv surely has energy < floor and surely
        is not a new best, from bounds alone (_Problem.ceiling; Eq. 3's
        counts and resources are exact and cheap): then the walk rejects it
        and the best stays, as if it had been evaluated, so skipping it
        changes nothing but the time.  Never before a valid state was met."""
        if self.best_key is None or lv in self.cache:
            return False
        pb = self.pb
        if self.load is None:
            thr, viol, res = pb.ceiling(lv)
            e = thr / norm - EPS_RES * res / self.scale
            obj = thr
        else:
            ns = pb.least(lv, self.load)
            res = sum(m * pb.levels[i][k] for i, (m, k) in enumerate(zip(ns, lv)))
            viol = pb.qos_excess(pb.latency(lv))
            e = obj = -float(res)
            e /= norm
        if viol > 0:
            e -= lam * (PEN0 + viol)
        best = self.best_key[0]
        return e < floor and (viol > 0 or obj < best - 1e-9 * abs(best) - 1e-12)

    def energy(self, h: Eval, norm: float, lam: float) -> float:
        """Higher is better: the objective relative to the best value, less
        EPS_RES of the resources (Eq. 1), less lam * (PEN0 + violation)."""
        e = h[0] / norm - EPS_RES * h[1] / self.scale if self.peak else h[0] / norm
        return e - lam * (PEN0 + h[2]) if h[2] else e

    def carries(self, load: float | None) -> bool:
        return load is not None and self.best_key is not None and self.best_key[0] >= load * (1 - _TOL)


def _anneal(pb: _Problem, seed: int, iters: int, load: float | None = None,
            starts: Sequence[Sequence[int]] = (), extra: Sequence[int] | None = None,
            enough: float | None = None) -> tuple[list[int] | None, str]:
    """SA over the quota levels, N following them (module docstring).  load
    None: Eq. 1; else Eq. 3 at that load.  The chain starts from the best of
    `starts` (default pb.start()); `extra`, a V, competes for the result;
    `enough` (Eq. 1): stop at the first valid state carrying that load.
    Returns the best valid V = N + levels (None if none was met) and, in
    words, why the last invalid state met was invalid."""
    ch = _Chain(pb, load)
    n, rng = len(pb.stages), random.Random(seed)
    top = [len(x) - 1 for x in pb.levels]
    if extra is not None:
        ch.offer(ch._eval(extra[n:], list(extra[:n])), list(extra))
    cands = [tuple(s) for s in starts] or [tuple(pb.start())]
    hs = [ch.visit(lv) for lv in cands]
    h_cur, cur = max(zip(hs, cands), key=lambda hc: (hc[0][3] is not None, hc[0][3] or ()))
    dims = [i for i in range(n) if top[i] > 0]
    if dims and not ch.carries(enough):
        cur = _walk(ch, cur, h_cur, rng, iters, dims, top, enough)
        if not ch.carries(enough):
            _polish(ch, n, top)
    return ch.best, _explain(pb, ch.last_bad, load)


def _exact(pb: _Problem, load: float | None = None, extra: Sequence[int] | None = None,
           budget: int | None = None) -> tuple[list[int] | None, str, bool]:
    """The best valid V over every quota-level vector, N following the quotas
    as in the annealing (fill_placed for Eq. 1, least for Eq. 3): branch and
    bound.  Eq. 1: the vectors in decreasing order of their throughput
    ceiling (_Problem.grid), evaluated until the next ceiling is below the
    best throughput found.  Eq. 3: in increasing order of their resources
    sum_i N_i p_i (exact and cheap: N is least(lv, load)), until the next
    needs more than the best.  Vectors that cannot be valid (latency over
    QoS, one instance per stage over a global sum, the load not carried with
    the most instances) are never evaluated.  Same result as the annealing
    would reach with unlimited iterations; deterministic.  The bounds ignore
    the per-GPU packing of Fig. 13: where it binds hard (many GPUs, large
    instances) many vectors can reach their bound's turn and fail to place,
    so `budget` caps the evaluations; the third value says whether the
    search finished (else the best so far: the caller anneals from it)."""
    ch, n = _Chain(pb, load), len(pb.stages)

    def go(j: int) -> bool:               # evaluate vector j; False once the budget is spent
        if budget is not None and len(ch.cache) >= budget:
            return False
        ch.visit(tuple(int(x) for x in idx[j]))
        return True

    if extra is not None:
        ch.offer(ch._eval(extra[n:], list(extra[:n])), list(extra))
    if load is None:
        idx, ceil = pb.grid(ch.best_key[0] * (1 - 1e-9) if ch.best_key else 0.0)
        for j in np.argsort(-ceil, kind="stable"):
            c = float(ceil[j])
            if c == -np.inf or (ch.best_key is not None and c < ch.best_key[0] * (1 - 1e-9)):
                break
            if not go(j):
                return ch.best, _explain(pb, ch.last_bad, load), False
    else:
        idx, _ = pb.grid(fill=False)
        tab = pb._tables()
        f = np.stack([tab[i][0][idx[:, i]] for i in range(n)], axis=1)
        a = np.stack([tab[i][2][idx[:, i]] for i in range(n)], axis=1)        # k x n x R
        ns = np.minimum(np.maximum(1, np.ceil(load * (1 - _TOL) / f)), np.asarray(pb.nmax))
        res = (ns * np.stack([np.asarray(pb.levels[i])[idx[:, i]] for i in range(n)], axis=1)).sum(axis=1)
        ok = ((ns * f).min(axis=1) >= load * (1 - _TOL)) & \
            np.all((ns[:, :, None] * a).sum(axis=1) <= np.asarray(pb.lims), axis=1)
        for j in np.argsort(np.where(ok, res, np.inf), kind="stable"):
            if not ok[j] or (ch.best_key is not None and -res[j] < ch.best_key[0]):
                break
            if not go(j):
                return ch.best, _explain(pb, ch.last_bad, load), False
    if ch.best is None and ch.last_bad is None:
        ch.visit(tuple(pb.start()))          # for the words of why none is valid
    return ch.best, _explain(pb, ch.last_bad, load), True


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"camelot: method must be one of {', '.join(METHODS)}, got {method!r}")


def _method(method: str, pb: _Problem) -> tuple[str, int | None]:
    """("exact" or "sa", the exact search's evaluation budget): "auto" is
    exact with EXACT_EVALS evaluations where there are at most EXACT_STATES
    quota vectors, else the annealing; "exact" has no budget, up to EXACT_MAX."""
    if method == "auto":
        return ("exact", EXACT_EVALS) if pb.states() <= EXACT_STATES else ("sa", None)
    if method == "exact" and pb.states() > EXACT_MAX:
        raise ValueError(f"camelot: method exact over {pb.states()} quota vectors (more than {EXACT_MAX}): "
                         f"use a coarser granularity, or method sa or auto")
    return method, None


def _walk(ch: _Chain, cur: tuple[int, ...], h_cur: Eval, rng: random.Random, iters: int,
          dims: list[int], top: list[int], enough: float | None) -> tuple[int, ...]:
    """The annealing proper: iters moves, Metropolis acceptance, T and lam
    geometric from (T0, LAM0) to (T1, LAM1); the energy is relative to the
    best valid value met so far."""
    steps = max(iters, 1)
    t_mul, l_mul = (T1 / T0) ** (1.0 / steps), (LAM1 / LAM0) ** (1.0 / steps)
    temp, lam = T0, LAM0
    norm = max(abs(ch.best_key[0] if ch.best_key else h_cur[0]), 1e-12)
    rnd, exp, energy, visit = rng.random, math.exp, ch.energy, ch.visit
    n = len(top)
    for _ in range(iters):
        temp *= t_mul
        lam *= l_mul
        r = rnd()
        if r < TRADE:
            cand = _trade(cur, n, top, rnd)
        elif r < TRADE + SPLIT:
            cand = _split(ch, cur, h_cur[4], rnd)
        else:
            cand = _axis(cur, dims, top, rnd)
        if cand is None:
            continue
        u, e_cur = rnd(), energy(h_cur, norm, lam)
        # rejected whatever it is (e < e_cur + temp ln u) and not a new best: skip its evaluation
        if u > 0 and ch.hopeless(cand, e_cur + temp * math.log(u) - 1e-12, norm, lam):
            continue
        key = ch.best_key
        h = visit(cand)
        if ch.best_key is not key:                   # a new best: the energy's scale follows it
            if ch.carries(enough):
                break
            norm = max(abs(h[0]), 1e-12)
            e_cur = energy(h_cur, norm, lam)
        e = energy(h, norm, lam)
        if e >= e_cur or u < exp((e - e_cur) / temp):
            h_cur, cur = h, cand
    return cur


def _polish(ch: _Chain, n: int, top: list[int]) -> None:
    """Steepest ascent from the best state over its neighbours' quota levels
    (every move of _axis and _trade) until none is better."""
    for _ in range(POLISH_ROUNDS):
        if ch.best is None:
            return
        key = ch.best_key
        for lv in _neighbours(tuple(ch.best[n:]), top):
            if not ch.hopeless(lv, math.inf, 1.0, 0.0):
                ch.visit(lv)
        if ch.best_key is key:
            return


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


def _axis(cur: tuple[int, ...], dims: list[int], top: list[int], rnd: Callable[[], float]) -> tuple[int, ...]:
    """One stage's quota one granularity step up or down (§VII-C's move on p_i)."""
    r = int(rnd() * 2 * len(dims))
    j = dims[r >> 1]
    v = cur[j] + (1 if r & 1 else -1)
    if v < 0 or v > top[j]:
        v = 2 * cur[j] - v
    return cur[:j] + (v,) + cur[j + 1:]


def _split(ch: _Chain, cur: tuple[int, ...], ns: Sequence[int], rnd: Callable[[], float]) -> tuple[int, ...] | None:
    """Stage i's quota to the level just below or above N_i p_i / (N_i +- 1):
    the quota at which one instance more (a split) or less (a merge) keeps
    the stage's SMs; None when that is the current level."""
    i = int(rnd() * len(cur))
    m = ns[i] + (1 if rnd() < 0.5 else -1)
    if m < 1:
        return None
    lv = ch.pb.levels[i]
    k = bisect.bisect_left(lv, ns[i] * lv[cur[i]] / m)
    if rnd() < 0.5 or k == len(lv):
        k = max(k - 1, 0) if k == len(lv) or lv[k] != ns[i] * lv[cur[i]] / m else k
    if k == cur[i]:
        return None
    return cur[:i] + (k,) + cur[i + 1:]


def _trade(cur: tuple[int, ...], n: int, top: list[int], rnd: Callable[[], float]) -> tuple[int, ...] | None:
    """One quota step from stage j to stage i (about the same SMs); None when
    it leaves the levels."""
    i, j = int(rnd() * n), int(rnd() * n)
    if j == i or cur[i] >= top[i] or cur[j] <= 0:
        return None
    out = list(cur)
    out[i] += 1
    out[j] -= 1
    return tuple(out)


def _neighbours(lv: tuple[int, ...], top: list[int]) -> list[tuple[int, ...]]:
    """Every quota-level vector one move of _axis or _trade away from lv."""
    n, out = len(lv), []
    for j in range(n):
        for d in (-1, 1):
            if 0 <= lv[j] + d <= top[j]:
                out.append(lv[:j] + (lv[j] + d,) + lv[j + 1:])
        for i in range(n):
            if i != j and lv[i] < top[i] and lv[j] > 0:
                c = list(lv)
                c[i] += 1
                c[j] -= 1
                out.append(tuple(c))
    return out


def _laius_v(pb: _Problem) -> list[int] | None:
    """Laius's allocation (every GPU: one instance per stage at its balanced
    split) as a V, when its quotas are levels here."""
    la = laius_allocation(pb.stages, pb.gpu, pb.C, pb.s, pb.qos, granularity=pb.g, bandwidth_cap=pb.cap)
    if not la.feasible or any(q not in lv for q, lv in zip(la.quotas, pb.levels)):
        return None
    return list(la.instances) + [lv.index(q) for q, lv in zip(la.quotas, pb.levels)]


def _norm_iters(iters: int) -> int:
    if not isinstance(iters, int) or iters < 0:
        raise ValueError(f"camelot: iters must be an integer >= 0, got {iters!r}")
    return iters


def solve_peak(stages: Sequence[StageModel], gpu: GPUSpec, n_gpus: int, batch: int, qos_s: float, *,
               seed: int = 0, bandwidth_cap: bool = True, granularity: int = 5,
               iters: int = DEFAULT_ITERS, pcie_cap: bool = True, method: str = "auto",
               affinity: bool = False) -> Allocation:
    """Eq. 1: the N_i and p_i that maximise min_i N_i f(p_i) on n_gpus GPUs
    under C-1..C-5 (C-3, C-4 per GPU on the Fig. 13 placement), by simulated
    annealing (§VII-C; see the module docstring) - method "sa" - or by
    branch and bound over every quota vector (_exact) - method "exact", the
    optimum the annealing looks for, in less time when there are few
    vectors; "auto" (default): exact up to EXACT_STATES vectors (3 stages at
    5 % steps: 8 000), else the annealing.  affinity=True (ours) places the
    result with the fewest cross-GPU hops (camelot_place.counts_on) instead
    of Fig. 13's best fit; the search is the same.  bandwidth_cap=False is
    Camelot-NC (§VIII-D); pcie_cap=False drops our PCIe constraint C-P (Eq. 1
    as printed).  Infeasible: feasible=False and why."""
    _check_args(stages, gpu, batch, qos_s, n_gpus, granularity)
    _check_method(method)
    _norm_iters(iters)
    pb = _Problem(stages, gpu, n_gpus, batch, qos_s, bandwidth_cap, granularity, pcie_cap, affinity)
    if pb.why:
        return pb.infeasible(pb.why)
    la = _laius_v(pb)
    how, budget = _method(method, pb)
    if how == "exact":
        best, why, done = _exact(pb, extra=la, budget=budget)
        if done:
            if best is None:
                return pb.infeasible(f"no valid allocation; for example: {why}")
            return pb.allocation(best[:len(stages)], best[len(stages):])
        la = best or la                  # over budget: anneal, from the best found too
    starts = [pb.start()] + ([la[len(stages):]] if la else [])
    best, why = _anneal(pb, seed, _norm_iters(iters), starts=starts, extra=la)
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
              max_gpus: int = DEFAULT_MAX_GPUS, iters: int = DEFAULT_ITERS, pcie_cap: bool = True,
              method: str = "auto", affinity: bool = False) -> Allocation:
    """Eq. 2, then Eq. 3: on y = min_gpus(...) GPUs (then y + 1, ... up to
    max_gpus while Eq. 1's search there finds no state carrying the load),
    the allocation with the least sum_i N_i p_i that carries load_qps
    (min_i N_i f(p_i) >= load_qps) under C-1..C-4 of Eq. 3, by simulated
    annealing started from the quotas of the first state Eq. 1's search
    met that carries the load (it stops there).  pcie_cap, affinity and method as
    solve_peak (method "exact": branch and bound over the quota vectors in
    increasing order of resources, no Eq. 1 search first)."""
    _check_args(stages, gpu, batch, qos_s, 1, granularity)
    _check_method(method)
    _norm_iters(iters)
    if not (isinstance(load_qps, (int, float)) and load_qps > 0 and math.isfinite(load_qps)):
        raise ValueError(f"solve_min: load_qps must be a finite number > 0, got {load_qps!r}")
    if not isinstance(max_gpus, int) or max_gpus < 1:
        raise ValueError(f"solve_min: max_gpus must be an integer >= 1, got {max_gpus!r}")
    y = min_gpus(stages, gpu, batch, load_qps)
    why = f"Eq. 2 needs {y} GPUs > max_gpus = {max_gpus}"
    n = len(stages)
    for c in range(y, max_gpus + 1):
        pb = _Problem(stages, gpu, c, batch, qos_s, bandwidth_cap, granularity, pcie_cap, affinity)
        if pb.why:
            return pb.infeasible(pb.why)
        if pb.upper() < load_qps:
            why = f"load {load_qps:g} qps is above what {c} GPU(s) can carry (upper bound {pb.upper():.4g} qps)"
            continue
        how, budget = _method(method, pb)
        if how == "exact":
            best, last, done = _exact(pb, load=float(load_qps), budget=budget)
            if best is not None and done:
                return pb.allocation(best[:n], best[n:])
            if done:
                why = f"load {load_qps:g} qps: no valid allocation on {c} GPU(s) carries it ({last})"
                continue
            if best is not None:          # over budget: anneal Eq. 3 from the best found
                best, last = _anneal(pb, seed, _norm_iters(iters), load=float(load_qps), starts=[best[n:]])
                assert best is not None
                return pb.allocation(best[:n], best[n:])
        peak, last = _anneal(pb, seed, _norm_iters(iters), enough=float(load_qps))   # can c GPUs carry it?
        if peak is None or min(peak[i] * pb.f[i][peak[n + i]] for i in range(n)) < load_qps * (1 - _TOL):
            why = f"load {load_qps:g} qps is above the peak Eq. 1 finds on {c} GPU(s)"
            why += f" ({last})" if peak is None else ""
            continue
        best, last = _anneal(pb, seed, _norm_iters(iters), load=float(load_qps), starts=[peak[n:]])
        if best is not None:
            return pb.allocation(best[:n], best[n:])
    return Allocation((), (), batch, 0.0, math.inf, 0, 0, (), False, why)


# --- exhaustive search, for tests ----------------------------------------------------------

def brute_force_peak(stages: Sequence[StageModel], gpu: GPUSpec, n_gpus: int, batch: int, qos_s: float, *,
                     bandwidth_cap: bool = True, granularity: int = 5,
                     max_instances: int | None = None, pcie_cap: bool = True) -> Allocation:
    """Eq. 1 exhaustively: every V with N_i <= the bound the constraints
    imply (or max_instances), the same validity test as solve_peak (the
    constraints, then Fig. 13's placement) and the same ranking.  For tests
    on small instances (pcie_cap: C-P, as solve_peak)."""
    _check_args(stages, gpu, batch, qos_s, n_gpus, granularity)
    pb = _Problem(stages, gpu, n_gpus, batch, qos_s, bandwidth_cap, granularity, pcie_cap)
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
            if best is not None and min(lo, f[i][k]) < best[0]:
                continue                    # cannot reach the best's min_i f(p_i) any more
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


def _camelot_aff(stages: Sequence[StageModel], gpu: GPUSpec, n_gpus: int, batch: int, qos_s: float,
                 **kw: object) -> Allocation:
    return solve_peak(stages, gpu, n_gpus, batch, qos_s, affinity=True, **kw)  # type: ignore[arg-type]


ALLOCATORS: dict[str, Allocator] = {
    "camelot": solve_peak,            # Eq. 1 with the bandwidth cap
    "camelot-nc": _camelot_nc,        # Eq. 1 without C-3 (§VIII-D); C-P kept
    "camelot-aff": _camelot_aff,      # Eq. 1, placed for the fewest cross-GPU hops (ours)
    "ea": even_allocation,            # §VIII-A
    "laius": laius_allocation,        # §VIII-A, Laius per GPU
}


def allocate(name: str, stages: Sequence[StageModel], gpu: GPUSpec, n_gpus: int, batch: int, qos_s: float,
             **kw: object) -> Allocation:
    """The peak-load allocation of allocator `name` (ALLOCATORS) on n_gpus GPUs."""
    if name not in ALLOCATORS:
        raise ValueError(f"unknown allocator {name!r} (known: {', '.join(sorted(ALLOCATORS))})")
    return ALLOCATORS[name](stages, gpu, n_gpus, batch, qos_s, **kw)
