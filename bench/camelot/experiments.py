"""Camelot's experiments (§VIII) on the pipeline simulator: each policy's
allocation (controlplane/policies/camelot.py) run through pipesim.py on
simgpu's device model, rescaled to the paper's GPUs (suite.DEVICES).

  camelot-peak      Fig. 14/15: peak load meeting the p99 target, EA vs
                    Laius vs Camelot, per service and batch size, 2 GPUs
  camelot-lowload   Fig. 16: resources at 30 % of Camelot's peak, Laius vs
                    Camelot, normalised to one GPU per stage, and their p99
  camelot-loads     Fig. 17: Camelot's resources at four loads, and the p99
                    of Camelot and Camelot-NC (no bandwidth constraint)
  camelot-artifact  Fig. 18/20: the 27 artifact pipelines' peak loads
  camelot-multigpu  Fig. 19: peak loads on 2 and 16 GPUs (DGX-2-like, V100)
  camelot-predictors Fig. 12: DT / LR / RF errors of the per-stage models

Policies: ea, laius (§VIII-A), camelot (Eq. 1, Fig. 13's placement) and
camelot-aff, ours: the same allocation placed for the fewest cross-GPU hops
(controlplane/policies/camelot_place.py, affinity), since a hand-off to
another GPU is a copy; camelot-nc (§VIII-D) in camelot-loads.

How a policy is judged: its allocator sees the stages through the DT
predictors trained on solo profiles (predictors/stages.py), as the paper's
runtime does; the simulator runs the ground truth (the device model, with
contention); the peak load is the highest Poisson load whose p99 meets the
target, by bisection.  Camelot passes handles between stages on one GPU,
EA and Laius copy through the host (§VIII: "the benchmarks suffer from the
long communication overhead without the global memory-based communication
in EA and Laius").

QoS target of a service: QOS_X times its latency alone (every stage at
100 % on its own GPU, copies included) at the largest batch of the run.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from camelot import pipesim
from camelot.suite import ARTIFACT_PIPELINES, SERVICES, DevStage, Stage, device_mem_gb, device_params, pipeline

from controlplane.policies import camelot as alloc
from predictors.stages import StagePredictor, profile_stage

QOS_X = 2.0
UTILIZATION = 0.8       # Eq. 3 / Laius at a load: provision for load / this (both policies alike)
BATCHES = (8, 16, 32)
POLICIES = ("ea", "laius", "camelot", "camelot-aff")
COMM = {"ea": "copy", "laius": "copy", "camelot": "handle", "camelot-nc": "handle", "camelot-aff": "handle"}
PAPER = {  # the paper's headline figures, for the side-by-side table
    "camelot-peak": "Camelot +12..73.9 % over EA, +10..64.5 % over Laius (Fig. 14)",
    "camelot-lowload": "resources vs one GPU per stage: Camelot -46.5 %, Laius -20.2 %; Camelot -35 % vs "
                       "Laius, and Laius slightly late for 3 of 4 services (Fig. 16)",
    "camelot-loads": "Camelot-NC misses the target in 10/16 cases, up to 1.55x (Fig. 17)",
    "camelot-artifact": "Camelot +44.91 % over EA, +39.72 % over Laius on average (Fig. 18)",
    "camelot-multigpu": "Camelot +50.1 % over EA on average on a DGX-2 (Fig. 19)",
    "camelot-predictors": "DT and RF accurate, LR worse; DT chosen, < 1 ms per prediction (Fig. 12, §VII-A)",
}


@dataclass
class Setup:
    """What every run of an experiment shares."""
    device: str
    gpus: int
    seed: int
    queries: int
    quick: bool

    @property
    def params(self) -> Any:
        return device_params(self.device)

    def spec(self) -> alloc.GPUSpec:
        p = self.params
        return alloc.GPUSpec(name=self.device, pct=100, mps_clients=48, bandwidth_gbs=p.bw / 1e9,
                             mem_gb=device_mem_gb(self.device), gflops=p.sms * p.sm_flops / 1e9,
                             pcie_gbs=p.pcie_h2d / 1e9)


_models: dict[tuple[str, str], Any] = {}


def predicted(stages: Sequence[Stage], setup: Setup) -> list[Any]:
    """The stages as the allocators see them: DT on the solo profile."""
    out = []
    for st in stages:
        key = (setup.device, st.name)
        if key not in _models:
            _models[key] = StagePredictor("dt", setup.seed).fit(profile_stage(DevStage(st, setup.params)))
        out.append(_models[key].as_stage())
    return out


def qos_s(stages: Sequence[Stage], setup: Setup, batch: int) -> float:
    """QOS_X x the service's latency alone at `batch`: each stage at 100 %,
    the copies in and out included."""
    truth = [DevStage(s, setup.params) for s in stages]
    pcie = setup.params.pcie_h2d
    copies = sum(s.out_mb for s in stages) * 1e6 * batch / pcie * 2 + 0.6e6 * batch / pcie
    return QOS_X * (sum(t.duration_s(100, batch) for t in truth) + copies)


def allocate(policy: str, stages: Sequence[Stage], setup: Setup, batch: int, qos: float,
             load_qps: float | None = None) -> Any:
    """A policy's Allocation: at peak (load None, Eq. 1) or for a load (Eq. 2-3).
    Every allocator plans for the target less the batching headroom that
    the runtime keeps back (pipesim.HEADROOM), since queries are issued by
    arrival + (1 - HEADROOM) x target - the predicted rest; and for a load,
    for load / UTILIZATION: Eq. 3 asks only that the stages carry the load,
    which a queue at 100 % utilisation does not do within any target."""
    pred = predicted(stages, setup)
    spec = setup.spec()
    qos = qos * (1 - pipesim.HEADROOM)    # the share the runtime's batching keeps back (pipesim)
    if load_qps is not None:
        load_qps = load_qps / UTILIZATION
    if policy in ("camelot", "camelot-nc", "camelot-aff"):
        cap, aff = policy != "camelot-nc", policy == "camelot-aff"
        if load_qps is None:
            return alloc.solve_peak(pred, spec, setup.gpus, batch, qos, seed=setup.seed, bandwidth_cap=cap,
                                    affinity=aff)
        return alloc.solve_min(pred, spec, load_qps, batch, qos, seed=setup.seed, bandwidth_cap=cap,
                               max_gpus=setup.gpus, affinity=aff)
    if policy == "ea":
        return alloc.even_allocation(pred, spec, setup.gpus, batch, qos)
    if policy == "laius":
        if load_qps is None:
            return alloc.laius_allocation(pred, spec, setup.gpus, batch, qos)
        return alloc.laius_min(pred, spec, load_qps, batch, qos, max_gpus=setup.gpus)
    raise ValueError(f"unknown policy {policy!r}: {', '.join(COMM)}")


def describe(a: Any) -> str:
    return " ".join(f"{n}x{p}%" for n, p in zip(a.instances, a.quotas)) + f" on {a.gpus} GPU(s)"


def peak_row(name: str, stages: Sequence[Stage], setup: Setup, batch: int, policies: Sequence[str]) -> dict:
    """Each policy's peak load for one service at one batch size."""
    qos = qos_s(stages, setup, max(BATCHES))
    allocs = {p: allocate(p, stages, setup, batch, qos) for p in policies}
    hi = 2.0 * max((a.throughput_qps for a in allocs.values() if a.feasible), default=1.0)
    row: dict[str, Any] = {"service": name, "batch": batch, "qos_ms": qos * 1e3, "gpus": setup.gpus}
    for p, a in allocs.items():
        if not a.feasible:
            row[p] = {"peak_qps": 0.0, "alloc": f"infeasible: {a.why}", "predicted_qps": 0.0}
            continue
        dep = pipesim.deployment_of(a.placement)
        peak, res = pipesim.peak_load(stages, dep, setup.params, batch, qos, COMM[p], hi, setup.queries,
                                      setup.seed, service=name)
        row[p] = {"peak_qps": peak, "alloc": describe(a), "predicted_qps": a.throughput_qps,
                  "capped": peak >= 0.999 * pipesim.measurable_qps(qos),
                  "p99_norm": (res.p99_s / qos) if res else None,
                  "handoffs": res.handoffs if res else 0, "copies": res.copies if res else 0,
                  "instances": list(a.instances), "quotas": list(a.quotas), "resources_pct": a.resources_pct}
    for pol, pre in (("camelot", ""), ("camelot-aff", "aff_")):
        for base in ("ea", "laius"):
            if base in row and pol in row and row[base]["peak_qps"] > 0 and not (
                    row[base]["capped"] or row[pol]["capped"]):
                row[f"{pre}gain_vs_{base}"] = row[pol]["peak_qps"] / row[base]["peak_qps"] - 1
    return row


def lowload_row(name: str, stages: Sequence[Stage], setup: Setup, batch: int, frac: float,
                policies: Sequence[str], peak_qps: float) -> dict:
    """Resources and p99 of each policy's least allocation for frac x peak."""
    qos = qos_s(stages, setup, max(BATCHES))
    load = frac * peak_qps
    row: dict[str, Any] = {"service": name, "batch": batch, "load_frac": frac, "load_qps": load,
                           "qos_ms": qos * 1e3}
    for p in policies:
        a = allocate(p, stages, setup, batch, qos, load_qps=load)
        if not a.feasible or load <= 0:
            row[p] = {"resources_norm": None, "p99_norm": None, "alloc": f"infeasible: {a.why}"}
            continue
        res = pipesim.simulate(stages, pipesim.deployment_of(a.placement), setup.params, batch, qos, load,
                               COMM[p], setup.queries, setup.seed, service=name)
        row[p] = {"resources_norm": a.resources_pct / (100.0 * len(stages)), "p99_norm": res.p99_s / qos,
                  "alloc": describe(a), "resources_pct": a.resources_pct}
    if "camelot" in row and "laius" in row and row["laius"].get("resources_norm"):
        row["saving_vs_laius"] = 1 - row["camelot"]["resources_norm"] / row["laius"]["resources_norm"]
    return row


def _bar(progress: bool, total: int, label: str):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    cols = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    bar = Progress(*cols, disable=not progress, transient=True)
    return bar, bar.add_task(label, total=total)


def run(name: str, services: Sequence[str] | None, policies: Sequence[str] | None, setup: Setup,
        batches: Sequence[int], progress: bool, log: Callable[[str], None]) -> list[dict]:
    """The rows of one experiment."""
    if name == "camelot-artifact":
        svcs = list(services) if services else (["p1+c1+m1", "p3+c3+m3"] if setup.quick
                                                else list(ARTIFACT_PIPELINES))
    else:
        svcs = list(services) if services else (["img-to-text"] if setup.quick else list(SERVICES))
    for s in svcs:
        pipeline(s)                       # unknown names fail before any work
    pols = list(policies) if policies else list(POLICIES)
    rows: list[dict] = []
    if name == "camelot-predictors":
        return predictor_rows(setup, svcs if services or setup.quick else list(SERVICES) + ["p1+c1+m1", "p2+c2+m2",
                                                                                              "p3+c3+m3"])
    if name in ("camelot-peak", "camelot-artifact", "camelot-multigpu"):
        gpu_sets = [setup.gpus] if name != "camelot-multigpu" else ([2] if setup.quick else [2, 16])
        jobs = [(s, b, g) for g in gpu_sets for s in svcs for b in batches]
        bar, job = _bar(progress, len(jobs), name)
        with bar:
            for s, b, g in jobs:
                bar.update(job, description=f"{s} batch {b} on {g} GPU(s)")
                st = Setup(setup.device if name != "camelot-multigpu" or g <= 2 else "v100", g, setup.seed,
                           setup.queries, setup.quick)
                rows.append(peak_row(s, pipeline(s), st, b, pols))
                bar.advance(job)
        return rows
    fracs = [0.3] if name == "camelot-lowload" else ([0.2, 0.6] if setup.quick else [0.2, 0.4, 0.6, 0.8])
    lpols = ["laius", "camelot"] if name == "camelot-lowload" else ["camelot", "camelot-nc"]
    if policies:
        lpols = pols
    jobs2 = [(s, b) for s in svcs for b in batches]
    bar, job = _bar(progress, len(jobs2), name)
    with bar:
        for s, b in jobs2:
            bar.update(job, description=f"{s} batch {b}")
            peak = peak_row(s, pipeline(s), setup, b, ["camelot"])["camelot"]["peak_qps"]
            for f in fracs:
                rows.append(lowload_row(s, pipeline(s), setup, b, f, lpols, peak))
            bar.advance(job)
    return rows


def predictor_rows(setup: Setup, names: Sequence[str]) -> list[dict]:
    """Fig. 12: each stage's DT / LR / RF errors on the held-out 30 % of its
    solo profile, and the time of one DT prediction (§VII-A: < 1 ms)."""
    from predictors.stages import StagePredictor, compare, profile_stage
    rows = []
    for name in names:
        for st in pipeline(name):
            samples = profile_stage(DevStage(st, setup.params))
            row: dict[str, Any] = {"service": name, "stage": st.name, "samples": len(samples.X)}
            for kind, errs in compare(samples, seed=setup.seed).items():
                row.update({f"{kind}_{t}": v for t, v in errs.items()})
            m = StagePredictor("dt", setup.seed).fit(samples)
            t0 = time.perf_counter()
            for k in range(200):
                m.predict("duration_s", [[8, 5 + k % 19 * 5]])
            row["dt_predict_ms"] = (time.perf_counter() - t0) / 200 * 1e3
            rows.append(row)
    return rows


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:+.1f} %"


def _n(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def table(name: str, rows: list[dict], pols: Sequence[str]) -> str:
    """The experiment's table (markdown), with the paper's figure beside it."""
    md = [f"# {name}", "", f"Paper: {PAPER.get(name, '')}", ""]
    if name == "camelot-predictors":
        ts = ("duration_s", "bandwidth_gbs", "throughput_qps")
        md += ["| service | stage | " + " | ".join(f"{k.upper()} {t.split('_')[0]}" for k in ("dt", "lr", "rf")
                                                  for t in ts) + " | DT predict ms |",
               "|---|---|" + "---|" * 10]
        for r in rows:
            md.append(f"| {r['service']} | {r['stage']} | " + " | ".join(f"{100 * r[f'{k}_{t}']:.1f} %"
                                                                      for k in ("dt", "lr", "rf") for t in ts)
                      + f" | {r['dt_predict_ms']:.3f} |")
        for k in ("dt", "lr", "rf"):
            md.append(f"\n{k.upper()}: mean error " + ", ".join(
                f"{t.split('_')[0]} {100 * sum(r[f'{k}_{t}'] for r in rows) / len(rows):.1f} %" for t in ts))
        return "\n".join(md) + "\n"
    if name in ("camelot-peak", "camelot-artifact", "camelot-multigpu"):
        md += ["| service | batch | GPUs | QoS ms | " + " | ".join(f"{p} peak qps" for p in pols)
               + " | vs EA | vs Laius | camelot p99/QoS | camelot allocation |",
               "|---|---|---|---|" + "---|" * len(pols) + "---|---|---|---|"]
        for r in rows:
            md.append(f"| {r['service']} | {r['batch']} | {r['gpus']} | {r['qos_ms']:.1f} | "
                      + " | ".join(f"{r[p]['peak_qps']:.1f}" + ("+" if r[p].get("capped") else "") for p in pols)
                      + f" | {_pct(r.get('gain_vs_ea'))} | {_pct(r.get('gain_vs_laius'))} | "
                      f"{_n(r.get('camelot', {}).get('p99_norm'))} | {r.get('camelot', {}).get('alloc', '-')} |")
        if any(r[p].get("capped") for r in rows for p in pols):
            md.append("\n+: at the highest load a run of the simulator can judge (its arrivals must span "
                      f"{pipesim.WINDOW_QOS:g} targets in {pipesim.MAX_QUERIES} queries); left out of the means")
        for who, pre in (("Camelot", ""), ("Camelot-aff (ours: placed for the fewest cross-GPU hops)", "aff_")):
            for b in ("ea", "laius"):
                g = [r[f"{pre}gain_vs_{b}"] for r in rows if f"{pre}gain_vs_{b}" in r]
                if g:
                    md.append(f"\n{who} vs {b}: mean {_pct(sum(g) / len(g))}, min {_pct(min(g))}, "
                              f"max {_pct(max(g))} over {len(g)} cases")
        return "\n".join(md) + "\n"
    lp = [p for p in rows[0] if isinstance(rows[0][p], dict)] if rows else []
    md += ["| service | batch | load | qps | " + " | ".join(f"{p} resources | {p} p99/QoS" for p in lp) + " |",
           "|---|---|---|---|" + "---|---|" * len(lp)]
    for r in rows:
        md.append(f"| {r['service']} | {r['batch']} | {r['load_frac']:.0%} | {r['load_qps']:.1f} | "
                  + " | ".join(f"{_n(r[p]['resources_norm'], '{:.0%}')} | {_n(r[p]['p99_norm'])}" for p in lp)
                  + " |")
    sav = [r["saving_vs_laius"] for r in rows if "saving_vs_laius" in r]
    if sav:
        md.append(f"\nCamelot's resources vs Laius: mean {_pct(-sum(sav) / len(sav))}")
    for p in lp:
        late = [r for r in rows if (r[p].get("p99_norm") or 0) > 1]
        md.append(f"{p}: {len(late)}/{len(rows)} cases over the target")
    return "\n".join(md) + "\n"


def plot(path: Path, name: str, rows: list[dict], pols: Sequence[str]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"{r['service']}\nb{r['batch']}" + (f" {r['load_frac']:.0%}" if "load_frac" in r else "")
              for r in rows]
    fig, ax = plt.subplots(figsize=(max(6, len(rows) * 0.6 + 2), 4))
    peak = "load_frac" not in (rows[0] if rows else {})
    series = pols if peak else [p for p in rows[0] if isinstance(rows[0][p], dict)]
    w = 0.8 / max(1, len(series))
    base = "laius" if peak and "laius" in series else None     # services differ by 100x: normalise
    for k, p in enumerate(series):
        vals = [(r[p]["peak_qps"] / r[base]["peak_qps"] if base and r[base]["peak_qps"] > 0 else 0.0)
                if peak else (r[p]["resources_norm"] or 0) for r in rows]
        ax.bar([i + k * w for i in range(len(rows))], vals, w, label=p)
    ax.set_xticks([i + w * (len(series) - 1) / 2 for i in range(len(rows))], labels, fontsize=7, rotation=45)
    ax.set_ylabel(f"peak load / {base}'s" if base else "peak load (queries/s)" if peak
                  else "resources (x one GPU per stage)")
    ax.set_title(f"{name} (simulated, simgpu's device model)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(name: str, services: Sequence[str] | None, policies: Sequence[str] | None, out: Path, quick: bool,
         device: str, gpus: int | None, seed: int, batches: Sequence[int] | None, progress: bool,
         json_path: Path | None, log: Callable[[str], None]) -> int:
    setup = Setup(device, gpus or 2, seed, 400 if quick else 1500, quick)
    bs = list(batches) if batches else ([8] if quick else list(BATCHES if name != "camelot-artifact" else (8,)))
    t0 = time.monotonic()
    rows = run(name, services, policies, setup, bs, progress, log)
    wall = time.monotonic() - t0
    pols = list(policies) if policies else list(POLICIES)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"experiment": name, "device": f"{device} (simgpu's device model, spec-scaled)", "gpus": setup.gpus,
            "seed": seed, "queries": setup.queries, "batches": bs, "wall_s": wall, "qos_x": QOS_X,
            "paper": PAPER.get(name)}
    doc = {"meta": meta, "rows": rows}
    (out / "rows.json").write_text(json.dumps(doc, indent=1, default=_json))
    if json_path:
        json_path.write_text(json.dumps(doc, indent=1, default=_json))
    md = table(name, rows, pols)
    (out / "table.md").write_text(md)
    if name != "camelot-predictors":
        plot(out / "plot.png", name, rows, pols)
    print(md)
    print(f"{len(rows)} rows in {wall:.1f} s wall; outputs in {out}")
    return 0


def _json(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return float(o)
