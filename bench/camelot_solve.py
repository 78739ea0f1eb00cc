"""Camelot allocator solve time (§VIII-G says 5 ms): median and p99 over seeds
of solve_peak (Eq. 1) and solve_min (Eq. 2 + 3, at 30 % of the SA's peak,
the paper's low load) for 2- and 3-stage ToyStage pipelines on 1 and 2 RTX
2080 Ti and on 16 V100 (DGX-2), granularity 5 %, for each search method in
the same run: "sa" (§VII-C's simulated annealing) and "exact" (branch and
bound over the quota vectors, what "auto" picks for these).  The same
pipeline is used for every seed of a configuration (the seed varies the
annealing; the exact search does not use it).

    .venv/bin/python bench/camelot_solve.py [--seeds 50] [--iters N] [--clock wall|cpu]

--clock cpu times with time.process_time (this process's CPU time), steadier
than the wall clock on a shared machine.

Also prints, per configuration, the peak throughput each method finds and
the resources of its low-load allocation (seed 0), next to Camelot-NC, EA and
Laius, as a check of the search.
"""
from __future__ import annotations

import argparse
import statistics
import time

from controlplane.policies.camelot import (
    DEFAULT_ITERS,
    ToyStage,
    even_allocation,
    gpu_preset,
    laius_allocation,
    solve_min,
    solve_peak,
)

BATCH = 8


def pipeline(n: int) -> list[ToyStage]:
    """A compute-bound, a memory-bound and a light stage (the first n)."""
    return [ToyStage("compute", ms_per_item=1.0, fixed_ms=1.0, knee=60, gb_per_item=0.05, model_gb=2.0),
            ToyStage("memory", ms_per_item=2.0, fixed_ms=0.5, knee=80, gb_per_item=0.5, model_gb=1.5),
            ToyStage("light", ms_per_item=0.3, fixed_ms=2.0, knee=40, gb_per_item=0.1, model_gb=3.0)][:n]


def qos(stages: list[ToyStage]) -> float:
    """Three times the latency of every stage at its fastest quota."""
    return 3.0 * sum(min(s.duration_s(p, BATCH) for p in range(5, 101, 5)) for s in stages)


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--iters", type=int, default=DEFAULT_ITERS)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    a = ap.parse_args()
    clock = time.perf_counter if a.clock == "wall" else time.process_time
    print(f"{'pipeline':>8} {'gpus':>9} {'method':>6} {'peak p50':>9} {'p99':>8} {'min p50':>9} {'p99':>8}   "
          f"{'peak qps':>8} {'min res%':>8}   {'nc':>6} {'ea':>6} {'laius':>6}  (ms)")
    for n in (2, 3):
        st = pipeline(n)
        q = qos(st)
        for gname, c in (("2080ti", 1), ("2080ti", 2), ("v100", 16)):
            gpu = gpu_preset(gname)
            load = 0.3 * solve_peak(st, gpu, c, BATCH, q, iters=a.iters, method="sa").throughput_qps
            nc = solve_peak(st, gpu, c, BATCH, q, bandwidth_cap=False, iters=a.iters)
            ea, la = even_allocation(st, gpu, c, BATCH, q), laius_allocation(st, gpu, c, BATCH, q)
            for method in ("sa", "exact"):
                tp, tm = [], []
                peak = low = None
                for seed in range(a.seeds):
                    t = clock()
                    r = solve_peak(st, gpu, c, BATCH, q, seed=seed, iters=a.iters, method=method)
                    tp.append(clock() - t)
                    t = clock()
                    m = solve_min(st, gpu, load, BATCH, q, seed=seed, iters=a.iters, max_gpus=c, method=method)
                    tm.append(clock() - t)
                    peak, low = peak or r, low or m
                assert peak is not None and low is not None
                print(f"{n:>6}st {c:>3} {gname:>5} {method:>6} {statistics.median(tp) * 1e3:9.2f} "
                      f"{pct(tp, 0.99) * 1e3:8.2f} {statistics.median(tm) * 1e3:9.2f} {pct(tm, 0.99) * 1e3:8.2f}   "
                      f"{peak.throughput_qps:8.0f} {low.resources_pct:8d}   {nc.throughput_qps:6.0f} "
                      f"{ea.throughput_qps:6.0f} {la.throughput_qps:6.0f}")


if __name__ == "__main__":
    main()
