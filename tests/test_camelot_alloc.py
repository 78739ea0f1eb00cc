"""Camelot's allocator (Eq. 1-3, Fig. 13) and the EA / Laius baselines, on
ToyStage pipelines: determinism, the search against brute force, every
constraint checked independently, Camelot-NC, Eq. 2, placement, infeasible
inputs and bad arguments.  Pure Python, no device."""
from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest

from controlplane.policies import camelot as CM
from controlplane.policies.camelot import (
    ALLOCATORS,
    Allocation,
    GPUSpec,
    ToyStage,
    allocate,
    brute_force_peak,
    even_allocation,
    gpu_preset,
    laius_allocation,
    min_gpus,
    place,
    solve_min,
    solve_peak,
    throughput,
)

GPU = gpu_preset("2080ti")


def rand_instance(r: random.Random) -> tuple[list[ToyStage], int, int, float]:
    """2-3 stages, 1-2 GPUs, QoS 1.05-3x the fastest possible latency (at granularity 10)."""
    n = r.choice([2, 3])
    st = [ToyStage(f"s{i}", ms_per_item=r.uniform(0.2, 3), fixed_ms=r.uniform(0.2, 3), knee=r.choice([30, 50, 70, 100]),
                   gb_per_item=r.uniform(0.05, 1.5), model_gb=r.uniform(1.5, 4), act_gb_per_item=r.uniform(0.01, 0.1))
          for i in range(n)]
    c, b = r.choice([1, 2]), r.choice([1, 4, 8, 16])
    fastest = sum(min(s.duration_s(p, b) for p in range(10, 101, 10)) for s in st)
    return st, c, b, fastest * r.uniform(1.05, 3)


def instances(k: int, seed: int = 7) -> list[tuple[list[ToyStage], int, int, float]]:
    r = random.Random(seed)
    return [rand_instance(r) for _ in range(k)]


def pipeline3() -> list[ToyStage]:
    return [ToyStage("a", ms_per_item=1.0, knee=60, model_gb=2.0),
            ToyStage("b", ms_per_item=2.0, knee=80, model_gb=1.5, gb_per_item=0.5),
            ToyStage("c", ms_per_item=0.5, knee=40, model_gb=3.0, gb_per_item=1.0)]


def assert_valid(a: Allocation, stages: list[ToyStage], gpu: GPUSpec, n_gpus: int, batch: int, qos_s: float,
                 granularity: int | None = 5, bandwidth: bool = True, pcie: bool = True) -> None:
    """Every constraint of Eq. 1 (and our C-P), recomputed here from the placement."""
    assert a.feasible and a.why == ""
    n = len(stages)
    assert len(a.instances) == len(a.quotas) == n and all(x >= 1 for x in a.instances)
    assert all(1 <= p <= gpu.pct for p in a.quotas)
    if granularity:
        assert all(p % granularity == 0 for p in a.quotas)
    assert len(a.placement) == n_gpus
    placed = [0] * n
    for on in a.placement:
        assert sum(p for _, p in on) <= gpu.pct                                          # C-1, per GPU
        assert len(on) <= gpu.mps_clients                                               # C-2, per GPU
        assert sum(stages[i].mem_gb(batch) for i, _ in on) <= gpu.mem_gb + 1e-9          # C-4, per GPU
        if bandwidth:
            assert sum(stages[i].bandwidth_gbs(p, batch) for i, p in on) <= gpu.bandwidth_gbs + 1e-9   # C-3
        if pcie and gpu.pcie_gbs > 0:
            assert pcie_on(on, stages, batch, gpu) <= gpu.pcie_gbs + 1e-9                         # C-P
        for i, p in on:
            assert p == a.quotas[i]
            placed[i] += 1
    assert tuple(placed) == a.instances
    assert sum(x * p for x, p in zip(a.instances, a.quotas)) == a.resources_pct <= n_gpus * gpu.pct
    lat = sum(s.duration_s(p, batch) for s, p in zip(stages, a.quotas))
    assert a.latency_s == pytest.approx(lat) and lat <= qos_s * (1 + 1e-9)              # C-5
    thr = min(x * batch / s.duration_s(p, batch) for s, x, p in zip(stages, a.instances, a.quotas))
    assert a.throughput_qps == pytest.approx(thr)
    assert a.gpus == sum(1 for on in a.placement if on)


def pcie_on(on, stages, batch: int, gpu: GPUSpec) -> float:
    """One GPU's PCIe load: its instances' rates, each at most the link's."""
    return sum(min(getattr(stages[i], "pcie_gbs", lambda p, b: 0.0)(p, batch), gpu.pcie_gbs) for i, p in on)


# --- the search ------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["sa", "exact"])
def test_deterministic_for_a_seed(method):
    st = pipeline3()
    for c in (1, 2):
        a = [solve_peak(st, GPU, c, 8, 0.2, seed=s, method=method) for s in (3, 3, 4)]
        assert a[0] == a[1]
        assert a[2].feasible
    m = [solve_min(st, GPU, 150.0, 8, 0.2, seed=5, method=method) for _ in range(2)]
    assert m[0] == m[1]


def test_sa_matches_brute_force():
    checked = 0
    for st, c, b, q in instances(14):
        bf = brute_force_peak(st, GPU, c, b, q, granularity=10)
        for seed in (0, 1):
            sa = solve_peak(st, GPU, c, b, q, seed=seed, granularity=10, method="sa")
            assert sa.feasible == bf.feasible, (sa.why, bf.why)
            if bf.feasible:
                assert sa.throughput_qps == pytest.approx(bf.throughput_qps, rel=1e-9), (sa, bf)
                checked += 1
    assert checked >= 16


def test_sa_near_brute_force_on_many_instances():
    """Over 40 random instances x 2 seeds at the default iterations: >= 0.99
    of the exhaustive optimum in at least 95 % of the runs, never below 0.9."""
    ratios = []
    for st, c, b, q in instances(40):
        bf = brute_force_peak(st, GPU, c, b, q, granularity=10)
        for seed in (0, 1):
            sa = solve_peak(st, GPU, c, b, q, seed=seed, granularity=10, method="sa")
            assert sa.feasible == bf.feasible
            if bf.feasible:
                ratios.append(sa.throughput_qps / bf.throughput_qps)
    assert len(ratios) >= 40
    assert sum(r >= 0.99 for r in ratios) >= 0.95 * len(ratios)
    assert min(ratios) >= 0.9


def test_the_search_matters():
    """Without iterations (the start and its polish only) some instance ends
    lower than brute force: test_sa_matches_brute_force tests the annealing."""
    worse = 0
    for st, c, b, q in instances(14):
        bf = brute_force_peak(st, GPU, c, b, q, granularity=10)
        if bf.feasible:
            a = solve_peak(st, GPU, c, b, q, granularity=10, iters=0, method="sa")
            worse += a.throughput_qps < bf.throughput_qps * (1 - 1e-9)
    assert worse >= 1


def test_exact_equals_brute_force_and_never_loses_to_sa():
    """The branch and bound over quota vectors reaches the exhaustive optimum
    over N and p on every random instance, and Eq. 3's least resources are
    never more than the annealing's at the same load."""
    checked = 0
    for st, c, b, q in instances(40):
        bf = brute_force_peak(st, GPU, c, b, q, granularity=10)
        ex = solve_peak(st, GPU, c, b, q, granularity=10, method="exact")
        assert ex.feasible == bf.feasible, (ex.why, bf.why)
        if not bf.feasible:
            continue
        checked += 1
        assert ex.throughput_qps == pytest.approx(bf.throughput_qps, rel=1e-9), (ex, bf)
        assert_valid(ex, st, GPU, c, b, q, granularity=10)
        load = 0.5 * bf.throughput_qps
        mx = solve_min(st, GPU, load, b, q, granularity=10, max_gpus=c, method="exact")
        ms = solve_min(st, GPU, load, b, q, granularity=10, max_gpus=c, method="sa")
        assert mx.feasible and mx.throughput_qps >= load * (1 - 1e-9)
        assert_valid(mx, st, GPU, len(mx.placement), b, q, granularity=10)
        assert (len(mx.placement), mx.resources_pct) <= (len(ms.placement), ms.resources_pct), (mx, ms)
    assert checked >= 20


def test_grid_gives_fills_throughput_for_every_quota_vector():
    """_Problem.grid's vectorised bound is fill()'s throughput exactly, and
    it drops only vectors at which no N is valid (QoS, or one instance per
    stage over a global sum)."""
    for st, c, b, q in instances(12, seed=3):
        for cap in (True, False):
            pb = CM._Problem(st, GPU, c, b, q, cap, 10)
            if pb.why:
                continue
            idx, thr = pb.grid()
            got = {tuple(int(x) for x in v): t for v, t in zip(idx, thr)}
            for lv in itertools.product(*[range(len(x)) for x in pb.levels]):
                ns = pb.fill(lv)
                viol, _, xs, _, _ = pb.check(ns, lv)
                if lv not in got:
                    assert viol > 0 and all(pb.check(m, lv)[0] > 0 for m in ([1] * len(lv), ns)), lv
                elif got[lv] == -math.inf:
                    assert viol > 0, lv
                else:
                    assert got[lv] == pytest.approx(min(xs), rel=1e-9), (lv, ns)


def test_sa_skips_only_states_it_would_reject(monkeypatch):
    """The annealing skips evaluating a state when bounds show it would be
    rejected and is no new best (_Chain.hopeless): the same results as
    evaluating every state, for Eq. 1 and Eq. 3."""
    runs = [(st, c, b, q, seed) for (st, c, b, q), seed in zip(instances(16, seed=5), itertools.cycle((0, 1)))]

    def solve_all() -> list[tuple[Allocation, Allocation | None]]:
        out = []
        for st, c, b, q, seed in runs:
            a = solve_peak(st, GPU, c, b, q, seed=seed, granularity=10, method="sa")
            m = solve_min(st, GPU, 0.4 * a.throughput_qps, b, q, seed=seed, granularity=10, max_gpus=c,
                          method="sa") if a.feasible else None
            out.append((a, m))
        return out

    skipped = []
    real = CM._Chain.hopeless
    monkeypatch.setattr(CM._Chain, "hopeless", lambda *a: skipped.append(real(*a)) or skipped[-1])
    with_skips = solve_all()
    monkeypatch.setattr(CM._Chain, "hopeless", lambda *a: False)
    assert sum(skipped) > 100                       # it does skip
    assert solve_all() == with_skips


def test_auto_anneals_from_the_exact_best_when_over_its_budget(monkeypatch):
    """Where Fig. 13's per-GPU packing binds, many vectors reach their bound's
    turn and fail to place: "auto" stops after EXACT_EVALS evaluations and
    anneals from the best found (a valid result, as good as the exact one here)."""
    st = pipeline3()
    full = solve_peak(st, GPU, 2, 8, 0.2, method="exact")
    monkeypatch.setattr(CM, "EXACT_EVALS", 1)
    a = solve_peak(st, GPU, 2, 8, 0.2)
    assert_valid(a, st, GPU, 2, 8, 0.2)
    assert a.throughput_qps >= 0.95 * full.throughput_qps
    m = solve_min(st, GPU, 150.0, 8, 0.2)
    assert m.feasible and m.throughput_qps >= 150.0
    assert_valid(m, st, GPU, len(m.placement), 8, 0.2)


def test_auto_is_exact_on_small_spaces_and_sa_on_large(monkeypatch):
    st = pipeline3()
    for c in (1, 2):
        assert solve_peak(st, GPU, c, 8, 0.2) == solve_peak(st, GPU, c, 8, 0.2, method="exact")
        assert solve_min(st, GPU, 150.0, 8, 0.2) == solve_min(st, GPU, 150.0, 8, 0.2, method="exact")
    monkeypatch.setattr(CM, "EXACT_STATES", 100)        # 3 stages x 20 levels = 8 000 > 100
    assert solve_peak(st, GPU, 2, 8, 0.2, seed=4) == solve_peak(st, GPU, 2, 8, 0.2, seed=4, method="sa")


def test_every_returned_allocation_meets_eq1():
    n = 0
    for st, c, b, q in instances(20, seed=11):
        for cap in (True, False):
            a = solve_peak(st, GPU, c, b, q, seed=2, bandwidth_cap=cap)
            if a.feasible:
                assert_valid(a, st, GPU, c, b, q, bandwidth=cap)
                n += 1
    assert n >= 15


def test_camelot_nc_can_exceed_bandwidth_camelot_cannot():
    # stage "m" is memory-bound: 200-900 GB/s per instance, the GPU's SMs cannot all work on it
    st = [ToyStage("m", ms_per_item=1.0, fixed_ms=0.1, knee=50, gb_per_item=1.0, model_gb=1.0),
          ToyStage("c", ms_per_item=0.5, fixed_ms=0.1, knee=100, gb_per_item=0.01, model_gb=1.0)]
    assert st[0].bandwidth_gbs(50, 1) > GPU.bandwidth_gbs / 2
    capped = solve_peak(st, GPU, 1, 1, 0.05)
    nc = solve_peak(st, GPU, 1, 1, 0.05, bandwidth_cap=False)
    assert_valid(capped, st, GPU, 1, 1, 0.05)
    assert_valid(nc, st, GPU, 1, 1, 0.05, bandwidth=False)

    def bw(a: Allocation) -> float:
        return sum(st[i].bandwidth_gbs(p, 1) for i, p in a.placement[0])
    assert bw(capped) <= GPU.bandwidth_gbs
    assert bw(nc) > GPU.bandwidth_gbs
    assert nc.throughput_qps > capped.throughput_qps
    assert ALLOCATORS["camelot-nc"](st, GPU, 1, 1, 0.05) == nc


def test_camelot_at_least_the_baselines():
    st = pipeline3()
    for c in (1, 2):
        nc = solve_peak(st, GPU, c, 8, 0.2, bandwidth_cap=False)
        ea, la = even_allocation(st, GPU, c, 8, 0.2), laius_allocation(st, GPU, c, 8, 0.2)
        assert ea.feasible and la.feasible
        assert nc.throughput_qps >= la.throughput_qps >= ea.throughput_qps
        cam = solve_peak(st, GPU, c, 8, 0.2)
        la_c = laius_allocation(st, GPU, c, 8, 0.2, bandwidth_cap=True)
        assert cam.throughput_qps >= la_c.throughput_qps > 0


# --- Eq. 2 and Eq. 3 -----------------------------------------------------------------------

def test_min_gpus_follows_eq2():
    st = [ToyStage("a", gflop_per_item=100.0, model_gb=2.0, act_gb_per_item=0.0),
          ToyStage("b", gflop_per_item=300.0, model_gb=3.0, act_gb_per_item=0.0)]
    g = GPUSpec(gflops=1000.0, mem_gb=4.0)
    # compute: load / s * sum C(i, s) / G = 10 / 2 * (200 + 600) / 1000 = 4; memory: 5 / 4 -> 4
    assert min_gpus(st, g, 2, 10.0) == 4
    assert min_gpus(st, g, 2, 10.5) == 5            # ceil(4.2)
    assert min_gpus(st, g, 2, 0.0) == 2             # memory: ceil(1.25)
    assert min_gpus(st, GPUSpec(gflops=1e9, mem_gb=100.0), 2, 1.0) == 1   # at least 1


def test_solve_min_carries_the_load_with_less_than_ea():
    st = pipeline3()
    for c in (1, 2):
        ea = even_allocation(st, GPU, c, 8, 0.2)
        load = 0.9 * ea.throughput_qps
        m = solve_min(st, GPU, load, 8, 0.2)
        assert m.feasible and m.throughput_qps >= load
        assert m.resources_pct < ea.resources_pct
        assert_valid(m, st, GPU, len(m.placement), 8, 0.2)
        assert len(m.placement) >= min_gpus(st, GPU, 8, load)
        peak = solve_peak(st, GPU, len(m.placement), 8, 0.2)
        assert m.resources_pct <= peak.resources_pct


def test_solve_min_uses_more_gpus_when_needed():
    st = pipeline3()
    one = solve_peak(st, GPU, 1, 8, 0.2)
    m = solve_min(st, GPU, one.throughput_qps * 1.5, 8, 0.2)
    assert m.feasible and len(m.placement) >= 2 and m.throughput_qps >= one.throughput_qps * 1.5
    big = solve_min(st, GPU, 1e7, 8, 0.2, max_gpus=3)
    assert not big.feasible and "max_gpus" in big.why


def test_laius_min_just_enough_per_stage_one_instance_each():
    """Laius at low load: one instance per stage per GPU, each the least
    quota that carries the GPU's share, raised only as QoS needs; more load
    takes more SMs or GPUs, and Camelot's least allocation needs no more."""
    st = pipeline3()
    peak = laius_allocation(st, GPU, 1, 8, 0.2).throughput_qps
    low = CM.laius_min(st, GPU, 0.3 * peak, 8, 0.2)
    assert low.feasible and low.instances == (1, 1, 1) and low.throughput_qps >= 0.3 * peak
    for i, s in enumerate(st):      # just enough: one step less carries too little or misses QoS
        p = low.quotas[i]
        slower = low.latency_s - s.duration_s(p, 8) + s.duration_s(p - 5, 8) if p > 5 else 0.0
        assert p == 5 or 8 / s.duration_s(p - 5, 8) < 0.3 * peak or slower > 0.2
    high = CM.laius_min(st, GPU, 0.9 * peak, 8, 0.2)
    assert high.resources_pct > low.resources_pct
    two = CM.laius_min(st, GPU, 1.5 * peak, 8, 0.2)
    assert two.feasible and len(two.placement) == 2 and two.instances == (2, 2, 2)
    cam = solve_min(st, GPU, 0.3 * peak, 8, 0.2)
    assert cam.resources_pct <= low.resources_pct
    assert not CM.laius_min(st, GPU, 1e7, 8, 0.2, max_gpus=2).feasible
    with pytest.raises(ValueError, match="load_qps"):
        CM.laius_min(st, GPU, 0, 8, 0.2)


# --- placement (Fig. 13) ---------------------------------------------------------------------

def test_place_refuses_overfull_gpus():
    st = [ToyStage("a", model_gb=1.0, gb_per_item=0.01), ToyStage("b", model_gb=1.0, gb_per_item=0.01)]
    assert place([2, 1], [50, 50], st, GPU, 1, 1) is None                 # 150 % of the SMs
    assert place([1, 1], [50, 50], st, GPU, 1, 1) is not None
    fat = [ToyStage("a", model_gb=6.0, act_gb_per_item=0.0), ToyStage("b", model_gb=6.0, act_gb_per_item=0.0)]
    assert place([1, 1], [10, 10], fat, GPU, 1, 1) is None                # 12 GB > 11 GB
    assert place([1, 1], [10, 10], fat, GPU, 2, 1) is not None
    few = GPUSpec(mps_clients=3)
    assert place([2, 2], [10, 10], st, few, 1, 1) is None                  # 4 clients > I = 3
    hot = [ToyStage("h", ms_per_item=1.0, fixed_ms=0.0, gb_per_item=1.0, knee=100)]
    assert place([2], [50], hot, GPU, 1, 1) is None                        # 2 x 500 GB/s > 616
    assert place([2], [50], hot, GPU, 1, 1, bandwidth_cap=False) is not None


def test_place_keeps_same_stage_instances_together():
    st = [ToyStage("a", model_gb=1.0, gb_per_item=0.01), ToyStage("b", model_gb=1.0, gb_per_item=0.01)]
    pl = place([2, 2], [50, 50], st, GPU, 2, 1)
    assert pl is not None
    assert sorted(sorted({i for i, _ in on}) for on in pl) == [[0], [1]]
    # 4 x 20 % of a, 2 x 30 % of b on 3 GPUs: b's two together, a's on at most two
    # GPUs (best fit tops up the fullest GPU first), the third GPU left empty
    pl = place([4, 2], [20, 30], st, GPU, 3, 1)
    assert pl is not None
    assert sum(1 for on in pl if any(i == 1 for i, _ in on)) == 1
    assert sum(1 for on in pl if any(i == 0 for i, _ in on)) == 2
    assert sorted(len(on) for on in pl)[0] == 0


def test_crossing_counts_the_hops_the_shares_force():
    from controlplane.policies.camelot_place import crossing
    assert crossing([[2, 2], [0, 0]], [2, 2]) == 0.0                 # one GPU holds both stages
    assert crossing([[2, 0], [0, 2]], [2, 2]) == 1.0                 # every result crosses
    assert crossing([[2, 1], [0, 1]], [2, 2]) == pytest.approx(0.5)  # a: all on 0; b: half there
    assert crossing([[1, 1, 0], [1, 0, 1]], [2, 1, 1]) == pytest.approx(0.5 + 1.0)


def test_affinity_places_consecutive_stages_together():
    """Fig. 13 keeps a stage's instances together (a on GPU 0, b on GPU 1:
    every hand-off crosses); with affinity each GPU holds half of each."""
    from controlplane.policies.camelot_place import crossing
    st = [ToyStage("a", model_gb=1.0, gb_per_item=0.01), ToyStage("b", model_gb=1.0, gb_per_item=0.01)]
    counts = lambda pl: [[sum(1 for i, _ in on if i == k) for k in range(2)] for on in pl]  # noqa: E731
    plain = place([2, 2], [50, 50], st, GPU, 2, 1)
    aff = place([2, 2], [50, 50], st, GPU, 2, 1, affinity=True)
    assert plain is not None and aff is not None
    assert crossing(counts(plain), [2, 2]) == 1.0 and counts(aff) == [[1, 1], [1, 1]]
    # 3 of a and 5 of b at 10 % on 4 GPUs: aligned puts them on the same first GPUs
    aff = place([3, 5], [10, 10], st, GPU, 4, 1, affinity=True)
    assert aff is not None and crossing(counts(aff), [3, 5]) <= crossing(counts(place([3, 5], [10, 10], st, GPU, 4, 1)), [3, 5])
    # one GPU, or a layout without crossings: the same as Fig. 13
    assert place([2, 1], [30, 30], st, GPU, 1, 1, affinity=True) == place([2, 1], [30, 30], st, GPU, 1, 1)


def test_affinity_search_is_the_same_and_never_refuses_what_fig13_places():
    from controlplane.policies.camelot_place import crossing
    for st, c, b, q in instances(24, seed=13):
        c = c + 1                                       # 2-3 GPUs
        a = solve_peak(st, GPU, c, b, q, granularity=10)
        f = solve_peak(st, GPU, c, b, q, granularity=10, affinity=True)
        assert f.feasible >= a.feasible
        if not a.feasible:
            continue
        assert f.throughput_qps >= a.throughput_qps * (1 - 1e-9)
        assert_valid(f, st, GPU, c, b, q, granularity=10)
        if (f.instances, f.quotas) == (a.instances, a.quotas):
            on = lambda x: [[sum(1 for i, _ in g if i == k) for k in range(len(st))] for g in x.placement]  # noqa: E731
            assert crossing(on(f), f.instances) <= crossing(on(a), a.instances) + 1e-12


def test_place_fills_the_fullest_gpu_first():
    st = [ToyStage("a", model_gb=4.0, act_gb_per_item=0.0, gb_per_item=0.01),
          ToyStage("b", model_gb=1.0, act_gb_per_item=0.0, gb_per_item=0.01)]
    pl = place([2, 1], [40, 10], st, GPU, 2, 1)
    assert pl is not None
    # both a on one GPU (8 GB, 80 %); b then goes to the GPU with less memory left
    assert sorted(pl, key=len, reverse=True)[0] == ((0, 40), (0, 40), (1, 10))


# --- the baselines ---------------------------------------------------------------------------

def test_even_allocation_is_an_even_split_per_gpu():
    st = pipeline3()
    a = even_allocation(st, GPU, 2, 8, 0.2)
    assert a.instances == (2, 2, 2) and a.quotas == (33, 33, 33) and a.resources_pct == 198
    assert a.placement == (((0, 33), (1, 33), (2, 33)),) * 2
    assert a.throughput_qps == pytest.approx(throughput(st, (2, 2, 2), (33, 33, 33), 8))
    assert not even_allocation(st, GPU, 2, 8, 0.001).feasible


def test_laius_balances_one_gpu_and_multiplies():
    st = pipeline3()
    one, two = laius_allocation(st, GPU, 1, 8, 0.2), laius_allocation(st, GPU, 2, 8, 0.2)
    assert two.throughput_qps == pytest.approx(2 * one.throughput_qps)
    assert two.quotas == one.quotas and two.instances == (2, 2, 2)
    best = 0.0
    for ps in itertools.product(range(5, 101, 5), repeat=3):
        if sum(ps) <= 100 and sum(s.duration_s(p, 8) for s, p in zip(st, ps)) <= 0.2:
            best = max(best, throughput(st, (1, 1, 1), ps, 8))
    assert one.throughput_qps == pytest.approx(best)


# --- infeasible inputs, bad arguments ------------------------------------------------------

def test_infeasible_inputs_say_why():
    st = pipeline3()
    fastest = sum(min(s.duration_s(p, 8) for p in range(5, 101, 5)) for s in st)
    for a in (solve_peak(st, GPU, 2, 8, fastest * 0.9), solve_min(st, GPU, 10.0, 8, fastest * 0.9),
              brute_force_peak(st, GPU, 1, 8, fastest * 0.9)):
        assert not a.feasible and "QoS" in a.why and a.throughput_qps == 0.0
    for a in (even_allocation(st, GPU, 2, 8, fastest * 0.9), laius_allocation(st, GPU, 2, 8, fastest * 0.9)):
        assert not a.feasible and "QoS" in a.why and a.throughput_qps == 0.0
    fat = st + [ToyStage("fat", model_gb=12.0)]
    for a in (solve_peak(fat, GPU, 2, 8, 1.0), solve_min(fat, GPU, 10.0, 8, 1.0)):
        assert not a.feasible and "memory" in a.why and "'fat'" in a.why
    assert "memory" in even_allocation(fat, GPU, 2, 8, 1.0).why
    assert "memory" in laius_allocation(fat, GPU, 2, 8, 1.0).why


@pytest.mark.parametrize("call, msg", [
    (lambda st: solve_peak(st, GPU, 1, 0, 0.1), "batch"),
    (lambda st: solve_peak(st, GPU, 0, 8, 0.1), "n_gpus"),
    (lambda st: solve_peak(st, GPU, 1, 8, -0.1), "qos_s"),
    (lambda st: solve_peak(st, GPU, 1, 8, math.nan), "qos_s"),
    (lambda st: solve_peak(st, GPU, 1, 8, 0.1, granularity=0), "granularity"),
    (lambda st: solve_peak([], GPU, 1, 8, 0.1), "no stages"),
    (lambda st: solve_min(st, GPU, -1.0, 8, 0.1), "load_qps"),
    (lambda st: solve_peak(st, GPU, 1, 8, 0.1, method="milp"), "method"),
    (lambda st: solve_min(st, GPU, 10.0, 8, 0.1, method="SA"), "method"),
    (lambda st: solve_peak(st, GPU, 1, 8, 0.1, iters=-1, method="exact"), "iters"),
    (lambda st: solve_peak(st + [ToyStage("d")], GPU, 1, 8, 1.0, granularity=1, method="exact"),
     r"method exact over \d+ quota vectors \(more than"),
    (lambda st: solve_min(st, GPU, 10.0, 0, 0.1), "batch"),
    (lambda st: even_allocation(st, GPU, 0, 8, 0.1), "n_gpus"),
    (lambda st: laius_allocation(st, GPU, 1, 8, -1.0), "qos_s"),
    (lambda st: brute_force_peak(st, GPU, 1, 0, 0.1), "batch"),
    (lambda st: min_gpus(st, GPU, 0, 1.0), "batch"),
    (lambda st: place([1, 1, 1], [10, 10, 10], st, GPU, 0, 8), "n_gpus"),
    (lambda st: gpu_preset("tpu"), "unknown GPU"),
    (lambda st: allocate("nope", st, GPU, 1, 8, 0.1), "unknown allocator"),
    (lambda st: GPUSpec(mem_gb=0.0), "mem_gb"),
])
def test_bad_arguments_raise(call, msg):
    with pytest.raises(ValueError, match=msg):
        call(pipeline3())


# --- names and presets -------------------------------------------------------------------------

def test_allocators_by_name():
    assert set(ALLOCATORS) == {"camelot", "camelot-nc", "camelot-aff", "ea", "laius"}
    st = pipeline3()
    assert allocate("camelot", st, GPU, 1, 8, 0.2, seed=1) == solve_peak(st, GPU, 1, 8, 0.2, seed=1)
    assert allocate("ea", st, GPU, 1, 8, 0.2) == even_allocation(st, GPU, 1, 8, 0.2)
    assert allocate("laius", st, GPU, 1, 8, 0.2) == laius_allocation(st, GPU, 1, 8, 0.2)


def test_presets():
    assert dataclasses.replace(gpu_preset("2080Ti"), pcie_gbs=0.0) == GPUSpec()
    assert gpu_preset("2080Ti").pcie_gbs == gpu_preset("v100").pcie_gbs == 12.16    # PCIe 3.0 x16, §VI-A
    assert gpu_preset("h100").pcie_gbs > 50.0                                     # PCIe 5.0 x16
    assert GPUSpec().pcie_gbs == 0.0                                              # not modelled by default
    v = gpu_preset("V100")
    assert (v.bandwidth_gbs, v.mem_gb, v.mps_clients) == (897.0, 32.0, 48)
    assert gpu_preset("h100").mem_gb == 80.0
    assert CM.DEFAULT_ITERS > 0


# --- PCIe (C-P, our addition) ---------------------------------------------------------------

def pcie_pipeline() -> list[ToyStage]:
    """'p' is copy-bound: 4.1 ms a query at >= 10 % of the SMs, of which it
    copies 40 MB (9.8 GB/s while it runs: one instance takes most of a
    12.16 GB/s link); 'c' is compute-bound, faster, and copies nothing."""
    return [ToyStage("p", ms_per_item=0.1, fixed_ms=4.0, knee=10, gb_per_item=0.001, model_gb=0.2,
                     act_gb_per_item=0.0, pcie_gb_per_item=0.04),
            ToyStage("c", ms_per_item=0.5, fixed_ms=0.1, knee=100, gb_per_item=0.01, model_gb=0.5)]


def test_pcie_cap_keeps_each_gpu_within_its_link():
    st = pcie_pipeline()
    assert 9 < st[0].pcie_gbs(10, 1) < GPU.pcie_gbs < 2 * st[0].pcie_gbs(10, 1)
    for c in (1, 2):
        free = solve_peak(st, GPU, c, 1, 0.05, pcie_cap=False)
        capped = solve_peak(st, GPU, c, 1, 0.05)
        assert_valid(free, st, GPU, c, 1, 0.05, pcie=False)
        assert_valid(capped, st, GPU, c, 1, 0.05)             # per GPU, from the placement
        assert max(pcie_on(on, st, 1, GPU) for on in free.placement) > GPU.pcie_gbs   # over-subscribed
        assert all(pcie_on(on, st, 1, GPU) <= GPU.pcie_gbs + 1e-9 for on in capped.placement)
        assert capped.instances[0] <= c                        # one copy-bound instance per link
        assert free.throughput_qps > capped.throughput_qps > 0
        m = solve_min(st, GPU, 0.9 * capped.throughput_qps, 1, 0.05, max_gpus=c)
        assert_valid(m, st, GPU, len(m.placement), 1, 0.05)
        bf = brute_force_peak(st, GPU, c, 1, 0.05, granularity=10, max_instances=8)
        sa = solve_peak(st, GPU, c, 1, 0.05, granularity=10)
        assert_valid(bf, st, GPU, c, 1, 0.05, granularity=10)
        assert sa.throughput_qps == pytest.approx(bf.throughput_qps, rel=1e-9)
    # Camelot-NC drops C-3 only
    nc = ALLOCATORS["camelot-nc"](st, GPU, 2, 1, 0.05)
    assert all(pcie_on(on, st, 1, GPU) <= GPU.pcie_gbs + 1e-9 for on in nc.placement)


def test_pcie_cap_off_or_unmodelled_is_the_printed_eq1():
    """pcie_cap=False (or a GPU with pcie_gbs = 0) gives what the search gave
    before C-P: the same allocation as for stages without PCIe traffic."""
    no_link = dataclasses.replace(GPU, pcie_gbs=0.0)
    for st, c, b, q in instances(8, seed=3):
        hot = [dataclasses.replace(s, pcie_gb_per_item=0.02) for s in st]
        old = solve_peak(st, GPU, c, b, q, granularity=10)
        assert solve_peak(hot, GPU, c, b, q, granularity=10, pcie_cap=False) == old
        assert solve_peak(hot, no_link, c, b, q, granularity=10) == old
        assert brute_force_peak(hot, GPU, c, b, q, granularity=10, pcie_cap=False) == \
            brute_force_peak(st, GPU, c, b, q, granularity=10)
    st = pcie_pipeline()
    bare = [dataclasses.replace(s, pcie_gb_per_item=0.0) for s in st]
    assert solve_min(st, GPU, 500.0, 1, 0.05, pcie_cap=False) == solve_min(bare, GPU, 500.0, 1, 0.05)


class Bare:
    """A StageModel with the four required methods only (no pcie_gbs)."""

    def __init__(self, s: ToyStage):
        self.s, self.name = s, s.name

    def duration_s(self, pct: int, batch: int) -> float:
        return self.s.duration_s(pct, batch)

    def bandwidth_gbs(self, pct: int, batch: int) -> float:
        return self.s.bandwidth_gbs(pct, batch)

    def mem_gb(self, batch: int) -> float:
        return self.s.mem_gb(batch)

    def gflop(self, batch: int) -> float:
        return self.s.gflop(batch)


def test_stages_without_pcie_still_work():
    st = pipeline3()
    bare = [Bare(s) for s in st]
    assert solve_peak(bare, GPU, 2, 8, 0.2) == solve_peak(st, GPU, 2, 8, 0.2)
    assert solve_min(bare, GPU, 300.0, 8, 0.2) == solve_min(st, GPU, 300.0, 8, 0.2)
    assert brute_force_peak(bare, GPU, 1, 8, 0.2, granularity=20) == brute_force_peak(st, GPU, 1, 8, 0.2, granularity=20)
    assert even_allocation(bare, GPU, 2, 8, 0.2) == even_allocation(st, GPU, 2, 8, 0.2)
    assert laius_allocation(bare, GPU, 2, 8, 0.2) == laius_allocation(st, GPU, 2, 8, 0.2)
    assert CM.laius_min(bare, GPU, 300.0, 8, 0.2) == CM.laius_min(st, GPU, 300.0, 8, 0.2)
    a = solve_peak(st, GPU, 2, 8, 0.2)
    assert place(a.instances, a.quotas, bare, GPU, 2, 8) == a.placement


def test_baselines_ignore_pcie():
    st = pcie_pipeline()
    bare = [dataclasses.replace(s, pcie_gb_per_item=0.0) for s in st]
    for c in (1, 2):
        assert even_allocation(st, GPU, c, 1, 0.05) == even_allocation(bare, GPU, c, 1, 0.05)
        assert laius_allocation(st, GPU, c, 1, 0.05) == laius_allocation(bare, GPU, c, 1, 0.05)
    assert CM.laius_min(st, GPU, 500.0, 1, 0.05) == CM.laius_min(bare, GPU, 500.0, 1, 0.05)


def test_place_refuses_a_gpu_over_its_pcie():
    st = pcie_pipeline()
    assert place([1, 1], [10, 50], st, GPU, 1, 1) is not None
    assert place([2, 1], [10, 50], st, GPU, 1, 1) is None                 # 2 x 9.8 GB/s > 12.16
    assert place([2, 1], [10, 50], st, GPU, 1, 1, pcie_cap=False) is not None
    assert place([2, 1], [10, 50], st, dataclasses.replace(GPU, pcie_gbs=0.0), 1, 1) is not None
    pl = place([2, 1], [10, 50], st, GPU, 2, 1)                             # one per GPU
    assert pl is not None and all(sum(1 for i, _ in on if i == 0) == 1 for on in pl)
    # an instance predicted above the link counts as the whole link (one per GPU), not as unplaceable
    over = [ToyStage("o", ms_per_item=0.1, fixed_ms=0.1, pcie_gb_per_item=0.1)]
    assert over[0].pcie_gbs(50, 1) > GPU.pcie_gbs
    assert place([1], [50], over, GPU, 1, 1) is not None
    assert place([2], [40], over, GPU, 1, 1) is None
    with pytest.raises(ValueError, match="pcie_gbs"):
        GPUSpec(pcie_gbs=-1.0)
