"""Camelot's deployment of microservice instances across GPUs (Fig. 13, §VII-D).

Given the instance counts N_i and the per-instance SM quotas p_i that the
search of Eq. 1 / Eq. 3 chose, deploy the instances on n_gpus GPUs:

  - stages are placed one after the other, the largest instances first
    (their dominant share of a GPU: SMs, memory, bandwidth or, when checked,
    PCIe; then memory, then stage index: first-fit decreasing);
  - for each instance, the GPUs that can still take it (SM percent R, memory
    F, bandwidth BW when capped, PCIe when checked, MPS clients I) are sorted
    by what they have left, least first: remaining memory, then remaining
    SMs, then remaining bandwidth, then remaining PCIe, then remaining
    clients, then GPU index.  "GPUs with fewer
    resources have higher priority ... Camelot avoids excessive
    fragmentation";
  - the instance goes to the first of them.  The GPU that took the previous
    instance of the same stage has even less left, so it stays first while
    it fits: same-stage instances end up together ("deploying instances of
    the same stage on the same GPU as much as possible"), which this module
    does in one step (as many as fit, then the next GPU).

When this best fit fails, the spread layout (every stage's instances as
evenly as possible over the GPUs, the most room first: the layout EA and
Laius use) is tried before the allocation is declared unplaceable, so that
a layout the baselines can use is never refused to Camelot.

Affinity (ours, affinity=True): Fig. 13 keeps a stage's instances together,
so on several GPUs a query's result usually goes to the next stage on
another GPU, where a handle does not work and the hand-off is a copy (§VI-B;
our simulator shows it costing most of Camelot's loss to Laius on 16 GPUs,
bench/RESULTS.md).  With affinity the layout is chosen among three - the best
fit above, the spread layout below, and the aligned layout (every GPU g gets
floor(N_i / C) instances of each stage, and GPUs 0..r_i-1 one more, so
stages with fewer instances than GPUs share the same first GPUs) - as the
one with the fewest expected cross-GPU hops per query (crossing()), ties
in that order.  Which layouts fit does not change with it: the search's
constraints are the same.

PCIe (our constraint C-P, see camelot.py): the instances' host<->device
rates on a GPU add up to at most GPUSpec.pcie_gbs, when pcie_cap and the GPU
models it (pcie_gbs > 0); pcs None counts every instance as 0.

Memory is counted per instance: the model sharing between same-stage
instances that §VII-D mentions is not credited (conservative; M(i, s) is a
per-instance footprint in Table II).

pack() works on plain numbers (the search calls it in its inner loop);
place() is the public form on StageModels.  Both return None when some
instance fits no GPU: the allocation is then infeasible.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from controlplane.policies.camelot import GPUSpec, StageModel

Placement = tuple[tuple[tuple[int, int], ...], ...]   # per GPU: (stage index, pct) per instance

_TOL = 1e-9


def stage_pcie_gbs(stage: StageModel, pct: int, batch: int) -> float:
    """A stage's PCIe traffic rate at (pct, batch): the optional
    stage.pcie_gbs when it has one (NaN: inf, negative: 0), else 0."""
    fn = getattr(stage, "pcie_gbs", None)
    if fn is None:
        return 0.0
    x = float(fn(pct, batch))
    return math.inf if math.isnan(x) else max(x, 0.0)


def _fit_count(left: list[float], pct: int, mem: float, bw: float, cap_bw: bool,
               pc: float = 0.0, cap_pc: bool = False) -> int:
    """How many instances of (pct, mem, bw, pc) a GPU with left = [pct, mem,
    bw, clients, pcie] still takes."""
    k = int(left[3])
    k = min(k, int(left[0] // pct))
    if mem > 0:
        k = min(k, int((left[1] + _TOL) // mem))
    if cap_bw and bw > 0:
        k = min(k, int((left[2] + _TOL) // bw))
    if cap_pc and pc > 0:
        k = min(k, int((left[4] + _TOL) // pc))
    return max(k, 0)


def _left(gpu: GPUSpec, n_gpus: int) -> list[list[float]]:
    """Every GPU's resources, all free: [pct, mem, bw, clients, pcie]."""
    return [[float(gpu.pct), float(gpu.mem_gb), float(gpu.bandwidth_gbs), float(gpu.mps_clients),
             float(gpu.pcie_gbs)] for _ in range(n_gpus)]


def _pcs(pcs: Sequence[float] | None, n: int) -> list[float]:
    return [0.0] * n if pcs is None else [float(x) for x in pcs]


def counts_on(counts: Sequence[int], pcts: Sequence[int], mems: Sequence[float], bws: Sequence[float],
              gpu: GPUSpec, n_gpus: int, bandwidth_cap: bool = True,
              pcs: Sequence[float] | None = None, pcie_cap: bool = True,
              affinity: bool = False) -> list[list[int]] | None:
    """Fig. 13 on numbers: how many instances of each stage each GPU gets
    (on[g][i]), or None.  Best fit first (see the module docstring); when it
    fails, the spread layout (each stage's instances as evenly as possible
    over the GPUs, the one EA and Laius use) is tried before giving up.
    affinity: of the layouts that fit (best fit, spread, aligned), the one
    with the fewest expected cross-GPU hops (crossing()).  pcs: each stage's
    PCIe GB/s per instance (None: 0), checked against gpu.pcie_gbs when
    pcie_cap and gpu.pcie_gbs > 0."""
    pc = _pcs(pcs, len(counts))
    cap_pc = bool(pcie_cap) and gpu.pcie_gbs > 0
    on = _best_fit(counts, pcts, mems, bws, gpu, n_gpus, bandwidth_cap, pc, cap_pc)
    if n_gpus == 1 or (on is not None and (not affinity or crossing(on, counts) == 0.0)):
        return on
    spread = _even(counts, pcts, mems, bws, gpu, n_gpus, bandwidth_cap, pc, cap_pc)
    if not affinity:
        return spread
    aligned = _even(counts, pcts, mems, bws, gpu, n_gpus, bandwidth_cap, pc, cap_pc, aligned=True)
    layouts = [x for x in (on, spread, aligned) if x is not None]      # min: the first of equals
    return min(layouts, key=lambda x: crossing(x, counts), default=None)


def fits(counts: Sequence[int], pcts: Sequence[int], mems: Sequence[float], bws: Sequence[float],
         gpu: GPUSpec, n_gpus: int, bandwidth_cap: bool = True,
         pcs: Sequence[float] | None = None, pcie_cap: bool = True, affinity: bool = False) -> bool:
    """Whether counts_on places them (without choosing among the layouts)."""
    if counts_on(counts, pcts, mems, bws, gpu, n_gpus, bandwidth_cap, pcs, pcie_cap) is not None:
        return True
    cap_pc = bool(pcie_cap) and gpu.pcie_gbs > 0
    return affinity and n_gpus > 1 and _even(counts, pcts, mems, bws, gpu, n_gpus, bandwidth_cap,
                                             _pcs(pcs, len(counts)), cap_pc, aligned=True) is not None


def crossing(on: Sequence[Sequence[int]], counts: Sequence[int]) -> float:
    """Expected cross-GPU hops of a query through the pipeline when every
    stage's work spreads over its instances evenly and a result goes to an
    instance of the next stage on its own GPU whenever the shares allow:
    sum over consecutive stages i, i+1 of 1 - sum_g min(on[g][i] / N_i,
    on[g][i+1] / N_{i+1}) (the share of stage i's output that the next
    stage's share on the same GPU cannot take)."""
    hops = 0.0
    for i in range(len(counts) - 1):
        a, b = counts[i], counts[i + 1]
        if a > 0 and b > 0:
            hops += 1.0 - sum(min(g[i] / a, g[i + 1] / b) for g in on)
    return max(hops, 0.0)


def _order(counts: Sequence[int], pcts: Sequence[int], mems: Sequence[float], bws: Sequence[float],
           gpu: GPUSpec, pcs: Sequence[float] | None = None, cap_pc: bool = False) -> list[int]:
    """Stages, largest instances first: by dominant share of a GPU (SMs,
    memory, bandwidth or, when checked, PCIe), then memory, then index
    (first-fit decreasing)."""
    def dom(i: int) -> float:
        d = max(pcts[i] / gpu.pct, mems[i] / gpu.mem_gb, bws[i] / gpu.bandwidth_gbs)
        if cap_pc and pcs is not None and gpu.pcie_gbs > 0:
            d = max(d, pcs[i] / gpu.pcie_gbs)
        return d
    return sorted((i for i in range(len(counts)) if counts[i] > 0), key=lambda i: (-dom(i), -mems[i], i))


def _best_fit(counts: Sequence[int], pcts: Sequence[int], mems: Sequence[float], bws: Sequence[float],
              gpu: GPUSpec, n_gpus: int, cap_bw: bool, pcs: Sequence[float] | None = None,
              cap_pc: bool = False) -> list[list[int]] | None:
    """Best fit, decreasing.  A GPU holding an instance has strictly less left
    than an empty one (less memory, or as much and fewer SMs), so it ranks
    first when it fits, and the empty GPUs, alike, are taken in index order:
    the GPUs in use are always 0..used-1 and only GPU `used` among the empty
    ones needs a look (the same choice as scanning them all)."""
    left = _left(gpu, n_gpus)
    pc = _pcs(pcs, len(counts))
    on = [[0] * len(counts) for _ in range(n_gpus)]
    used = 0            # GPUs 0..used-1 hold instances, the rest are empty (see below)
    for i in _order(counts, pcts, mems, bws, gpu, pc, cap_pc):
        need, p, m, b, c = counts[i], pcts[i], mems[i], bws[i], pc[i]
        while need > 0:
            best, best_key = -1, None
            for g in range(min(used + 1, n_gpus)):   # the empty GPUs rank alike: the first stands for all
                lg = left[g]
                if lg[3] < 1 or lg[0] < p or (m > 0 and lg[1] + _TOL < m) or (cap_bw and b > 0 and lg[2] + _TOL < b):
                    continue                          # not even one more instance fits
                if cap_pc and c > 0 and lg[4] + _TOL < c:
                    continue
                key = (lg[1], lg[0], lg[2], lg[4], lg[3])
                if best_key is None or key < best_key:
                    best, best_key = g, key
            if best < 0:
                return None
            k = min(_fit_count(left[best], p, m, b, cap_bw, c, cap_pc), need)
            used = max(used, best + 1)
            _take(left[best], k, p, m, b, c)
            on[best][i] += k
            need -= k
    return on


def _even(counts: Sequence[int], pcts: Sequence[int], mems: Sequence[float], bws: Sequence[float],
          gpu: GPUSpec, n_gpus: int, cap_bw: bool, pcs: Sequence[float] | None = None,
          cap_pc: bool = False, aligned: bool = False) -> list[list[int]] | None:
    """Every stage's instances split as evenly as possible over the GPUs,
    N_i // C each and one more on N_i % C of them: the GPUs with the most
    room left (spread, the layout of EA and Laius), or GPUs 0..N_i % C - 1
    for every stage (aligned: stages share their first GPUs).  None when a
    GPU cannot take its share."""
    left = _left(gpu, n_gpus)
    pc = _pcs(pcs, len(counts))
    on = [[0] * len(counts) for _ in range(n_gpus)]
    for i in _order(counts, pcts, mems, bws, gpu, pc, cap_pc):
        q, r = divmod(counts[i], n_gpus)
        gs = range(n_gpus) if aligned else sorted(range(n_gpus), key=lambda g: (-left[g][1], -left[g][0], g))
        for rank, g in enumerate(gs):
            k = q + (1 if rank < r else 0)
            if k and _fit_count(left[g], pcts[i], mems[i], bws[i], cap_bw, pc[i], cap_pc) < k:
                return None
            _take(left[g], k, pcts[i], mems[i], bws[i], pc[i])
            on[g][i] += k
    return on


def _take(lg: list[float], k: int, pct: int, mem: float, bw: float, pc: float = 0.0) -> None:
    lg[0] -= k * pct
    lg[1] -= k * mem
    lg[2] -= k * bw
    lg[3] -= k
    lg[4] -= k * pc


def pack(counts: Sequence[int], pcts: Sequence[int], mems: Sequence[float], bws: Sequence[float],
         gpu: GPUSpec, n_gpus: int, bandwidth_cap: bool = True,
         pcs: Sequence[float] | None = None, pcie_cap: bool = True, affinity: bool = False) -> Placement | None:
    """Fig. 13 on numbers: counts[i] instances of stage i, each taking pcts[i]
    percent of the SMs, mems[i] GB, bws[i] GB/s and pcs[i] GB/s of PCIe (None:
    0), onto n_gpus GPUs of `gpu`.  Returns, per GPU, the (stage, pct) of each
    instance placed there (stage order), or None when one does not fit.
    affinity: as counts_on."""
    on = counts_on(counts, pcts, mems, bws, gpu, n_gpus, bandwidth_cap, pcs, pcie_cap, affinity)
    if on is None:
        return None
    return tuple(tuple((i, pcts[i]) for i in range(len(counts)) for _ in range(on[g][i]))
                 for g in range(n_gpus))


def place(instances: Sequence[int], quotas: Sequence[int], stages: Sequence[StageModel], gpu: GPUSpec,
          n_gpus: int, batch: int, *, bandwidth_cap: bool = True, pcie_cap: bool = True,
          affinity: bool = False) -> Placement | None:
    """Fig. 13 / §VII-D: deploy instances[i] instances of stage i at quotas[i]
    percent each on n_gpus GPUs (footprint M(i, s) = stage.mem_gb(batch),
    bandwidth b(p) = stage.bandwidth_gbs(p, batch); bandwidth_cap=False
    ignores BW, as Camelot-NC; PCIe = the optional stage.pcie_gbs(p, batch),
    clamped to the link, against gpu.pcie_gbs unless pcie_cap=False;
    affinity: the layout with the fewest cross-GPU hops, see counts_on).
    None when some instance fits no GPU (over R, F, BW, PCIe or I there)."""
    if len(instances) != len(stages) or len(quotas) != len(stages):
        raise ValueError(f"place: {len(stages)} stages but {len(instances)} instance counts "
                         f"and {len(quotas)} quotas")
    if n_gpus < 1:
        raise ValueError(f"place: n_gpus must be >= 1, got {n_gpus}")
    if batch < 1:
        raise ValueError(f"place: batch must be >= 1, got {batch}")
    for n, p in zip(instances, quotas):
        if n < 0 or not 1 <= p <= gpu.pct:
            raise ValueError(f"place: instance counts must be >= 0 and quotas in 1..{gpu.pct}, "
                             f"got {n} x {p} %")
    mems = [float(s.mem_gb(batch)) for s in stages]
    bws = [float(s.bandwidth_gbs(p, batch)) if n else 0.0 for s, n, p in zip(stages, instances, quotas)]
    pcs = [min(stage_pcie_gbs(s, p, batch), gpu.pcie_gbs) if n and gpu.pcie_gbs > 0 else 0.0
           for s, n, p in zip(stages, instances, quotas)]
    return pack(list(instances), list(quotas), mems, bws, gpu, n_gpus, bandwidth_cap, pcs, pcie_cap, affinity)
