"""C-Laius's experiments in the simulator (bench/simulator.py): `colocate
experiment NAME` runs this file.

    colocate experiment claius-pairs [--quick] [--out DIR] [--json FILE]
                        [--services pos,ner] [--batch hotspot,lud] [--policies claius,baymax]
                        [--rate 10] [--qos-ms 80] [--seed 1] [--horizon 30]
    colocate experiment claius-ablation | claius-granularity   (the same options)

Each writes rows.csv, rows.json, table.md and plot.png under --out
(default bench/out/NAME) and prints the headline figures, the simulated
seconds per wall second and the study's wall time.

Apps are replayed from `colocate trace` recordings (predictors/traces.py),
recorded once per device setting (timing-only: no host twins) and cached.

The device (as bench/colocation.py's live runs): simgpu's H100 preset made
--slowdown times slower (SM flop rate and bandwidth), MPS on, except for
baymax, which the paper runs on a GPU without MPS (§9.2: every app at
100 %), here time-sliced contexts.

QoS targets.  The paper (§9.1) defines the target as a p99 latency but
gives no values; Baymax and Prophet, whose setup it follows, set a
service's target as a multiple of its latency alone (Abacus, §8.1: 2x the
solo latency of the largest input).  Ours: QOS_FACTOR (1.5) times the
service's p99 alone at 100 % under the experiment's own arrivals (rate,
process, seed; --qos-base alone-p99, the default), unless --qos-ms says.
--qos-base solo takes 1.5x one query of its largest size alone instead:
with Poisson arrivals that target is missed by the service alone (its
queueing tail reaches 1.7-1.9x the solo latency for face, dig and imc at
10 q/s), so every policy fails it and the comparison says nothing.

Policies get the EnginePredictor: the device model's own solo time of each
task at each quota (what a timing-only profile measures).  Batch throughput
is normalised to the app alone at 100 % on the same device, simulated
for the same horizon.
"""
from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for p in (str(ROOT), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

from simulator import HOLD_S, Arrivals, EnginePredictor, SimResult, SimTask, Simulator, Workload  # noqa: E402

from controlplane.policies import make_policy, parse_policy_spec  # noqa: E402
from shim.devmodel import Device, default_params  # noqa: E402

SERVICES = ("face", "dig", "imc", "ner", "pos", "chk")
BATCH = ("bfs", "btree", "pathfinder", "nw", "hotspot", "lavamd", "myocyte", "lud")
PAIR_POLICIES = ("claius", "mps-even,total=100", "mps-priority", "baymax", "static-optimal")
NO_MPS = ("baymax",)
QOS_FACTOR = 1.5
SLOWDOWN = 1000.0
# validate-sim's live runs, s: at 12 s a p99 of ~100 queries is their
# slowest one or two, and one lagging query moved a live p99 by 30 %
# (bench/RESULTS.md, validate-sim at a 36 s horizon)
VALIDATE_S = 36.0
WARMUP = 5                   # first queries of a run left out of its p99


@dataclass
class Config:
    slowdown: float = SLOWDOWN
    rate: float = 10.0
    arrivals: str = "poisson"
    horizon_s: float = 30.0
    seed: int = 1
    qos_ms: float | None = None
    granularity: int = 10
    qos_factor: float = QOS_FACTOR
    qos_base: str = "alone-p99"        # or "solo": what qos_factor multiplies
    route: str = "pool"                # or "partition": quotas as SM partitions (serve --route)
    replay: list[float] = field(default_factory=list)   # arrivals "replay": the times, s


# --- workloads from traces ------------------------------------------------------

def _task(t: Any) -> SimTask:
    """A predictors.traces.Task as the simulator replays it."""
    return SimTask(kind=t.kind, name=t.name, grid=tuple(t.grid), block=tuple(t.block), regs=t.regs,
                   smem=t.smem, flops=t.flops, bytes=t.bytes, gap_s=max(0.0, t.gap_us) / 1e6, sync=t.sync)


def workloads(names: Sequence[str], cfg: Config, log: Callable[[str], None],
              service: tuple[list[int], str] | None = None) -> dict[str, Workload]:
    """Each named app as a Workload, from its trace in the trace library
    (recorded there first when missing: timing-only, seconds each).  A
    service runs its queries at the largest size of profile's ladder, with
    that ladder's service options (predictors/profile.py TONIC)."""
    from predictors import profile, traces
    lib = traces.default_dir()
    out = {}
    for n in names:
        svc = n in SERVICES
        sizes, args = (profile.TONIC[n][0][-1:], profile.TONIC[n][1]) if svc else ([], "")
        if svc and service is not None:
            sizes, args = [str(x) for x in service[0]], service[1]
        target = f"tonic:{n}" if svc else n
        done = traces.record_all([target], lib, sizes=[int(x) for x in sizes], service_args=args, log=log)
        if done[0].error:
            raise SystemExit(f"colocate experiment: recording {target} failed: {done[0].error}")
        tr = traces.load(done[0].path)
        if svc:
            qs = {sz: [_task(t) for t in tr.query_tasks(sz)[-1]] for sz in tr.sizes()}
            out[n] = Workload(n, "qos", queries=qs)
        else:
            out[n] = Workload(n, "batch", iteration=[_task(t) for t in tr.iteration()])
    return out


# --- one run --------------------------------------------------------------------

def device(cfg: Config, mps: bool = True) -> Device:
    return Device(default_params(mps=mps, slowdown=cfg.slowdown), hold_s=0.0 if mps else HOLD_S)


def policy(name: str, pred: EnginePredictor, dev: Device, sim_now: Callable[[], float],
           cfg: Config, qos_size: float) -> Any:
    base = name.split(",")[0]
    opts: dict[str, Any] = {}
    if base.startswith("claius"):
        opts = dict(predictor=pred, device_bw_gbs=dev.params.bw / 1e9, granularity=cfg.granularity)
    elif base == "baymax":
        opts = dict(predictor=pred, clock=sim_now)
    elif base == "static-optimal":
        opts = dict(predictor=pred, qos_size=qos_size, granularity=cfg.granularity)
    elif base.startswith("mps"):
        opts = dict(granularity=cfg.granularity)
    return make_policy(base, **{**opts, **parse_policy_spec(name)[1]})


def simulate(apps: Sequence[Workload], pol_name: str, cfg: Config, like_live: bool = False) -> SimResult:
    """One run.  like_live: the policies know what they know live (no whole-app
    predictions; validate-sim)."""
    dev = device(cfg, mps=pol_name.split(",")[0] not in NO_MPS)
    pred = EnginePredictor(dev.params, apps, whole_apps=not like_live)
    qos = [w for w in apps if w.cls == "qos"]
    qsize = max(qos[0].queries) if qos else 1
    holder: list[Simulator] = []
    pol = policy(pol_name, pred, dev, lambda: holder[0].now if holder else 0.0, cfg, qsize)
    arrivals = {w.name: Arrivals(cfg.arrivals, cfg.rate, cfg.seed + i, times=cfg.replay)
                for i, w in enumerate(qos)}
    sim = Simulator(pol, dev, apps, arrivals, horizon_s=cfg.horizon_s, seed=cfg.seed, report_queue=not like_live,
                    route=cfg.route)
    holder.append(sim)
    return sim.run()


def solo_latency_ms(svc: Workload, cfg: Config) -> float:
    """The service's largest query alone at 100 %: its QoS yardstick."""
    w = Workload(svc.name, "qos", queries={max(svc.queries): svc.queries[max(svc.queries)]})
    r = simulate([w], "static", Config(**{**cfg.__dict__, "rate": 1.0, "arrivals": "fixed",
                                          "horizon_s": 3.0}))
    return float(min(r.latencies_ms[svc.name]))


def solo_ips(batch: Workload, cfg: Config) -> float:
    return simulate([batch], "static", cfg).iterations_per_s[batch.name]


def alone_p99_ms(svc: Workload, cfg: Config) -> float:
    """The service alone at 100 % under the experiment's arrivals: its p99,
    queueing included (what no co-location can improve on)."""
    r = simulate([Workload(svc.name, "qos", queries=svc.queries)], "static", cfg)
    p99 = r.p99_ms(svc.name, WARMUP)
    return max(p99 if p99 is not None else 0.0, solo_latency_ms(svc, cfg))


def with_target(svc: Workload, cfg: Config) -> Workload:
    target = cfg.qos_ms or cfg.qos_factor * (
        alone_p99_ms(svc, cfg) if cfg.qos_base == "alone-p99" else solo_latency_ms(svc, cfg))
    return Workload(svc.name, "qos", queries=svc.queries, qos_ms=round(target, 3))


# --- experiments ----------------------------------------------------------------

@dataclass
class Study:
    """What every run of an experiment shares: the apps, their QoS targets
    and the batch apps' solo throughput."""
    wl: dict[str, Workload]
    targets: dict[str, Workload]
    solo: dict[str, float]


def study(svcs: Sequence[str], batch: Sequence[str], cfg: Config, log: Callable[[str], None]) -> Study:
    wl = workloads([*svcs, *batch], cfg, log)
    return Study(wl, {s: with_target(wl[s], cfg) for s in svcs}, {b: solo_ips(wl[b], cfg) for b in batch})


def run_set(st: Study, apps: Sequence[str], pol: str, cfg: Config) -> dict[str, Any]:
    """One co-location of apps under pol: per service p99 and its target,
    per batch app throughput normalised to solo."""
    r = simulate([st.targets[a] if a in st.targets else st.wl[a] for a in apps], pol, cfg)
    out: dict[str, Any] = {"policy": pol, "services": {}, "batch": {},
                           "sim_s_per_wall_s": r.horizon_s / r.wall_s if r.wall_s > 0 else None,
                           "events": r.events}
    for a in apps:
        if a in st.targets:
            p99, tgt = r.p99_ms(a, WARMUP), st.targets[a].qos_ms or math.inf
            out["services"][a] = {"qos_ms": tgt, "p99_ms": p99, "queries": len(r.latencies_ms[a]),
                                  "p99_norm": p99 / tgt if p99 is not None else None,
                                  "violated": r.violated(a, WARMUP)}
        else:
            out["batch"][a] = r.iterations_per_s[a] / st.solo[a] if st.solo[a] else 0.0
    return out


def runs(jobs: Sequence[tuple[Sequence[str], str]], st: Study, cfg: Config, progress: bool,
         label: str) -> list[dict[str, Any]]:
    """Every (apps, policy) job, with a progress bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    cols = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    out = []
    with Progress(*cols, disable=not progress, transient=True) as bar:
        job = bar.add_task(label, total=len(jobs))
        for apps, pol in jobs:
            bar.update(job, description=f"{'+'.join(apps)} {pol}")
            out.append(run_set(st, apps, pol, cfg))
            bar.advance(job)
    return out


def pair_row(svc: str, b: str, run: dict[str, Any]) -> dict[str, Any]:
    s = run["services"][svc]
    return {"service": svc, "batch": b, "policy": run["policy"], "qos_ms": s["qos_ms"], "p99_ms": s["p99_ms"],
            "p99_norm": s["p99_norm"], "violated": s["violated"], "queries": s["queries"],
            "throughput_norm": run["batch"][b], "sim_s_per_wall_s": run["sim_s_per_wall_s"],
            "events": run["events"]}


def pairs(svcs: Sequence[str], batch: Sequence[str], policies: Sequence[str], cfg: Config,
          log: Callable[[str], None], progress: bool = True) -> list[dict[str, Any]]:
    """Every service with every batch app, under every policy."""
    st = study(svcs, batch, cfg, log)
    jobs = [((s, b), p) for s in svcs for b in batch for p in policies]
    return [pair_row(apps[0], apps[1], r) for (apps, _), r in zip(jobs, runs(jobs, st, cfg, progress, "pairs"))]


def multiqos(svcs: Sequence[str], batch: Sequence[str], policies: Sequence[str], cfg: Config,
             log: Callable[[str], None], progress: bool = True, n: int = 15) -> list[dict[str, Any]]:
    """Two services and one batch app on one device (§9.5, Fig. 19-21): the
    first n service pairs, each with a batch app in turn."""
    st = study(svcs, batch, cfg, log)
    duos = [(a, b) for i, a in enumerate(svcs) for b in svcs[i + 1:]][:n]
    sets = [(a, b, batch[i % len(batch)]) for i, (a, b) in enumerate(duos)]
    jobs = [(apps, p) for apps in sets for p in policies]
    rows = []
    for (apps, _), r in zip(jobs, runs(jobs, st, cfg, progress, "multi-QoS")):
        s1, s2, b = apps
        rows.append({"service": s1, "service2": s2, "batch": b, "policy": r["policy"],
                     "qos_ms": r["services"][s1]["qos_ms"], "p99_ms": r["services"][s1]["p99_ms"],
                     "p99_norm": r["services"][s1]["p99_norm"],
                     "p99_norm2": r["services"][s2]["p99_norm"],
                     "violated": r["services"][s1]["violated"] or r["services"][s2]["violated"],
                     "queries": min(r["services"][s1]["queries"], r["services"][s2]["queries"]),
                     "throughput_norm": r["batch"][b], "sim_s_per_wall_s": r["sim_s_per_wall_s"],
                     "events": r["events"]})
    return rows


def validate(pairs_: Sequence[tuple[str, str]], policies: Sequence[str], cfg: Config,
             log: Callable[[str], None], duration: float, repeats: int = 1) -> list[dict[str, Any]]:
    """The same co-locations live on simgpu (bench/colocation.py: the programs
    under the shim, a controller, the Tonic load client) and in the
    simulator, on the same device (slowdown), service options, query size,
    fixed arrivals and warm-up: the gap in p99 and in batch throughput.

    Live figures are the medians of `repeats` runs (one live run of claius
    varies by more than the gaps measured).  Each service also runs alone,
    live and simulated: the difference of the two p99s is the harness's
    share of a live latency that no device model holds (the load client's
    socket, the controller and shim messages, host threads sharing two
    cores), measured with no co-runner and reported beside the raw gap
    (`p99_gap_net`: the simulated p99 plus that offset, against live)."""
    import statistics
    import tempfile

    import colocation as live
    work = Path(tempfile.mkdtemp(prefix="colocate-validate-"))

    def med(xs: list[float | None]) -> float | None:
        v = [x for x in xs if x is not None]
        return statistics.median(v) if v else None

    harness: dict[str, tuple[float | None, float, float | None]] = {}
    rows = []
    for svc, b in pairs_:
        st = live.Setup(service=svc, batch=[b], duration=duration, rate=cfg.rate, arrivals="fixed",
                        slowdown=cfg.slowdown, seed=cfg.seed, route=cfg.route)
        solo_live, rates = live.solo(st, work, log)
        # predicting policies live get models from a timing-only profile of
        # the same programs (seconds); in the simulator, the engine's own
        predicting = any(p.split(",")[0] in live.PREDICTING for p in policies)
        model_dir = live.models(st, work, log) if predicting else None
        wl = workloads([svc, b], cfg, log, service=([int(x) for x in st.sizes.split(",")], st.service_args))
        scfg = Config(**{**cfg.__dict__, "arrivals": "fixed", "horizon_s": duration})
        svc_wl = Workload(svc, "qos", queries=wl[svc].queries, qos_ms=st.qos_ms)
        if svc not in harness:
            alone = live.Setup(**{**st.__dict__, "batch": []})
            got = [live.run_policy(alone, "static", None, {}, {}, work, log) for _ in range(repeats)]
            live_alone = med([g.p99_ms for g in got])
            sim_alone = simulate([svc_wl], "static", scfg, like_live=True).p99_ms(svc, alone.warmup)
            harness[svc] = (live_alone, sim_alone, None if live_alone is None else live_alone - sim_alone)
            log(f"validate {svc} alone: p99 live {live_alone} ms, sim {sim_alone:.3f} ms")
        h = harness[svc][2]
        solo_sim = solo_ips(wl[b], scfg)
        for p in policies:
            got = [live.run_policy(st, p, model_dir, solo_live, rates, work, log) for _ in range(repeats)]
            live_p99 = med([g.p99_ms for g in got])
            live_thr = med([g.batch_norm.get(b) for g in got])
            r = simulate([svc_wl, wl[b]], p, scfg, like_live=True)
            sim_p99, sim_thr = r.p99_ms(svc, st.warmup), r.iterations_per_s[b] / solo_sim
            net = None if h is None else sim_p99 + h
            rows.append({"service": svc, "batch": b, "policy": p, "live_p99_ms": live_p99,
                         "live_p99_runs_ms": [g.p99_ms for g in got],
                         "sim_p99_ms": sim_p99, "p99_gap": _gap(sim_p99, live_p99),
                         "harness_ms": h, "sim_p99_net_ms": net, "p99_gap_net": _gap(net, live_p99),
                         "live_throughput_norm": live_thr, "sim_throughput_norm": sim_thr,
                         "throughput_gap": _gap(sim_thr, live_thr),
                         "live_queries": got[0].queries, "sim_queries": len(r.latencies_ms[svc])})
            log(f"validate {svc}+{b} {p}: p99 live {live_p99} ms {[g.p99_ms for g in got]}, sim "
                f"{sim_p99:.3f} ms (+ harness {h} ms); throughput live {live_thr}, sim {sim_thr:.3f}")
    return rows


def _gap(sim: float | None, live: float | None) -> float | None:
    """(sim - live) / live."""
    return (sim - live) / live if sim is not None and live else None


_ST: Study | None = None
_CFG: Config | None = None


def _init_worker(st: Study, cfg: Config) -> None:
    global _ST, _CFG
    _ST, _CFG = st, cfg


def _gpu(job: tuple[int, tuple[str, ...], str]) -> dict[str, Any]:
    g, apps, pol = job
    assert _ST is not None and _CFG is not None
    r = run_set(_ST, apps, pol, Config(**{**_CFG.__dict__, "seed": _CFG.seed + g}))
    (svc, s), = r["services"].items()
    return {"gpu": g, "service": svc, "batch": "+".join(r["batch"]), "policy": pol, "qos_ms": s["qos_ms"],
            "p99_ms": s["p99_ms"], "p99_norm": s["p99_norm"], "violated": s["violated"],
            "severe": s["p99_norm"] is None or s["p99_norm"] > 1.3, "queries": s["queries"],
            "throughput_norm": sum(r["batch"].values()) / len(r["batch"]),
            "sim_s_per_wall_s": r["sim_s_per_wall_s"], "events": r["events"]}


def datacenter(svcs: Sequence[str], batch: Sequence[str], policies: Sequence[str], cfg: Config,
               log: Callable[[str], None], progress: bool = True, per_service: int = 100,
               corunners: int = 3, address: str | None = None) -> list[dict[str, Any]]:
    """§9.6, Fig. 22: per_service GPUs for each service, each with corunners
    random batch apps (seeded), every GPU under every policy.  GPUs are
    independent: they run in parallel on a local Ray (or the cluster at
    address) when Ray is installed, else in a process pool."""
    import random as _random
    st = study(svcs, batch, cfg, log)
    rng = _random.Random(cfg.seed)
    gpus = [(svc, tuple(rng.sample(list(batch), min(corunners, len(batch)))))
            for svc in svcs for _ in range(per_service)]
    jobs = [(g, (svc, *bs), p) for g, (svc, bs) in enumerate(gpus) for p in policies]
    try:
        import ray  # type: ignore[import-not-found]
    except ImportError:
        ray = None
    if ray is not None:
        log(f"datacenter: {len(gpus)} GPUs x {len(policies)} policies on Ray ({address or 'local'})")
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        remote = ray.remote(lambda job, st_, cfg_: (_init_worker(st_, cfg_), _gpu(job))[1])
        st_ref, cfg_ref = ray.put(st), ray.put(cfg)
        return list(ray.get([remote.remote(j, st_ref, cfg_ref) for j in jobs]))
    import multiprocessing as mp
    import os
    n = max(1, os.cpu_count() or 1)
    log(f"datacenter: {len(gpus)} GPUs x {len(policies)} policies in {n} processes (Ray not installed)")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    out = []
    with mp.get_context("fork").Pool(n, _init_worker, (st, cfg)) as pool, \
            Progress(BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), disable=not progress,
                     transient=True) as bar:
        job = bar.add_task("GPUs", total=len(jobs))
        for row in pool.imap(_gpu, jobs, chunksize=4):
            out.append(row)
            bar.advance(job)
    return out


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per policy: violations, mean normalised throughput, mean p99 / target."""
    out = []
    for p in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == p]
        thr = [r["throughput_norm"] for r in mine]
        norm = [r["p99_norm"] for r in mine if r["p99_norm"] is not None]
        out.append({"policy": p, "pairs": len(mine), "violations": sum(r["violated"] for r in mine),
                    **({"severe": sum(r["severe"] for r in mine)} if "severe" in mine[0] else {}),
                    "throughput_norm": sum(thr) / len(thr) if thr else 0.0,
                    "p99_norm_mean": sum(norm) / len(norm) if norm else None,
                    "p99_norm_max": max(norm) if norm else None})
    return out


def write(out: Path, rows: list[dict[str, Any]], summ: list[dict[str, Any]], meta: dict[str, Any],
          title: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "rows.json").write_text(json.dumps({"meta": meta, "summary": summ, "rows": rows}, indent=1))
    with open(out / "rows.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    md = [f"# {title}", "", "| policy | pairs | QoS violations | batch throughput (norm.) | p99/target mean | max |",
          "|---|---|---|---|---|---|"]
    for s in summ:
        md.append(f"| {s['policy']} | {s['pairs']} | {s['violations']}/{s['pairs']} | "
                  f"{s['throughput_norm']:.3f} | {_f(s['p99_norm_mean'])} | {_f(s['p99_norm_max'])} |")
    (out / "table.md").write_text("\n".join(md) + "\n")
    plot(out / "plot.png", rows, title)


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def plot(path: Path, rows: list[dict[str, Any]], title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    pols = list(dict.fromkeys(r["policy"] for r in rows))
    if "gpu" in rows[0]:
        return plot_fleet(path, rows, pols, title, plt)
    pairs_ = list(dict.fromkeys(f"{r['service']}+{r['batch']}" for r in rows))
    fig, (a, b) = plt.subplots(2, 1, figsize=(max(6, len(pairs_) * 0.35 + 2), 6), sharex=True)
    width = 0.8 / max(1, len(pols))
    for i, p in enumerate(pols):
        by = {f"{r['service']}+{r['batch']}": r for r in rows if r["policy"] == p}
        xs = [j + i * width for j in range(len(pairs_))]
        a.bar(xs, [by[k]["p99_norm"] or 0 for k in pairs_], width, label=p)
        b.bar(xs, [by[k]["throughput_norm"] for k in pairs_], width, label=p)
    a.axhline(1.0, color="k", lw=0.8)
    if max((r["p99_norm"] or 0) for r in rows) > 20:     # a runaway queue would flatten the rest
        a.set_yscale("log")
    a.set_ylabel("p99 / QoS target")
    b.set_ylabel("batch throughput (norm. to solo)")
    b.set_xticks([j + 0.4 - width / 2 for j in range(len(pairs_))], pairs_, rotation=90, fontsize=7)
    a.legend(fontsize=7, ncol=len(pols))
    a.set_title(title + " (simulator on simgpu's model)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_fleet(path: Path, rows: list[dict[str, Any]], pols: list[str], title: str, plt: Any) -> None:
    """A fleet: the distribution of p99/target over GPUs, and mean utilization."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for p in pols:
        v = sorted(r["p99_norm"] for r in rows if r["policy"] == p and r["p99_norm"] is not None)
        a.plot(v, [(i + 1) / len(v) for i in range(len(v))], label=p)
    a.axvline(1.0, color="k", lw=0.8)
    a.set_xlabel("p99 / QoS target")
    a.set_ylabel("fraction of GPUs")
    a.legend()
    util = [sum(r["throughput_norm"] for r in rows if r["policy"] == p) /
            max(1, sum(1 for r in rows if r["policy"] == p)) for p in pols]
    b.bar(pols, util)
    b.set_ylabel("batch throughput (norm. to solo), mean")
    fig.suptitle(title + " (simulator on simgpu's model)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def quota_trace(out: Path, svc: str, batch: str, cfg: Config, log: Callable[[str], None]) -> dict[str, Any]:
    """Fig. 17: the quota claius gives one service's queries over time next
    to a batch app (imc + BFS in the paper), as decided in the simulation."""
    st = study([svc], [batch], cfg, log)
    r = simulate([st.targets[svc], st.wl[batch]], "claius", Config(**{**cfg.__dict__, "horizon_s": 3.0}))
    tr = r.quota_trace[svc]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.step([t * 1e3 for t, _ in tr], [q for _, q in tr], where="post")
    ax.set_xlabel("simulated time, ms")
    ax.set_ylabel(f"{svc} quota, %")
    ax.set_title(f"claius: {svc}'s quota next to {batch} (Fig. 17, simulator)")
    fig.tight_layout()
    fig.savefig(out / "quota_trace.png", dpi=110)
    plt.close(fig)
    changes = len(tr)
    return {"service": svc, "batch": batch, "quota_changes": changes,
            "quotas_used": sorted({q for _, q in tr}), "trace": tr[:400]}


def write_validation(out: Path, rows: list[dict[str, Any]], cfg: Config, wall: float) -> int:
    """validate-sim's outputs: the gaps per run, and a plot of sim against live."""
    out.mkdir(parents=True, exist_ok=True)
    gaps = [abs(r[k]) for r in rows for k in ("p99_gap", "throughput_gap") if r[k] is not None]
    net = [abs(r[k]) for r in rows for k in ("p99_gap_net", "throughput_gap") if r[k] is not None]
    meta = {"experiment": "validate-sim", "config": cfg.__dict__, "wall_s": wall,
            "max_abs_gap": max(gaps) if gaps else None,
            "max_abs_gap_net_of_harness": max(net) if net else None, "target": 0.10}
    (out / "rows.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    with open(out / "rows.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    md = ["# validate-sim: live simgpu vs the simulator", "",
          "Live: the median of the runs (each run's p99 in brackets). Net: the simulated p99 plus the "
          "service's harness offset (its live p99 alone less its simulated p99 alone).", "",
          "| pair | policy | p99 live ms | p99 sim ms | gap | + harness ms | net gap | throughput live "
          "| sim | gap |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        runs = ", ".join(_f(x) for x in r["live_p99_runs_ms"])
        md.append(f"| {r['service']}+{r['batch']} | {r['policy']} | {_f(r['live_p99_ms'])} [{runs}] | "
                  f"{_f(r['sim_p99_ms'])} | {_pct(r['p99_gap'])} | {_f(r['harness_ms'])} | "
                  f"{_pct(r['p99_gap_net'])} | {_f(r['live_throughput_norm'])} | "
                  f"{_f(r['sim_throughput_norm'])} | {_pct(r['throughput_gap'])} |")
    (out / "table.md").write_text("\n".join(md) + "\n")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 4))
    for ax, lk, sk, lab in ((a, "live_p99_ms", "sim_p99_ms", "p99 ms"),
                            (b, "live_throughput_norm", "sim_throughput_norm", "batch throughput (norm.)")):
        xs = [r[lk] for r in rows if r[lk] is not None and r[sk] is not None]
        ys = [r[sk] for r in rows if r[lk] is not None and r[sk] is not None]
        ax.scatter(xs, ys)
        hi = max(xs + ys + [1e-9])
        ax.plot([0, hi], [0, hi], "k--", lw=0.8)
        ax.set_xlabel(f"live simgpu: {lab}")
        ax.set_ylabel(f"simulator: {lab}")
    fig.tight_layout()
    fig.savefig(out / "plot.png", dpi=110)
    plt.close(fig)
    print((out / "table.md").read_text())
    print(f"{len(rows)} pairs x policies in {wall:.1f} s wall; largest gap {_pct(meta['max_abs_gap'])}, "
          f"net of the harness {_pct(meta['max_abs_gap_net_of_harness'])} (target 10 %); outputs in {out}")
    return 0


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:+.1f} %"


EXPERIMENTS = {
    "claius-pairs": ("48 Tonic x Rodinia pairs: claius vs MPS shares, baymax, static-optimal (Fig. 2, 15, 16)",
                     PAIR_POLICIES),
    "claius-ablation": ("C-Laius without its bandwidth cap (NB) and without lag compensation (NC) (Fig. 18)",
                        ("claius", "claius-nb", "claius-nc")),
    "claius-multiqos": ("15 pairs of Tonic services + one Rodinia app: claius vs static-optimal (Fig. 19-21)",
                        ("claius", "static-optimal")),
    "claius-datacenter": ("600 GPUs, 100 per Tonic service, 3 random Rodinia co-runners each (Fig. 22)",
                          ("claius", "baymax")),
    "validate-sim": ("a few pairs live on simgpu and in the simulator: the gap in p99 and throughput",
                     ("static", "mps-priority")),
    "claius-granularity": ("claius at quota units of 3 (as 4), 5, 10 and 20 % (§9.1)",
                           ("claius,granularity=4", "claius,granularity=5", "claius,granularity=10",
                            "claius,granularity=20")),
}
# Camelot's (bench/camelot/experiments.py): pipelines, not pairs
CAMELOT = {
    "camelot-peak": "Camelot vs EA and Laius: peak load meeting the p99 target, 4 services x batch sizes (Fig. 14)",
    "camelot-lowload": "resources at 30 % of peak load, Laius vs Camelot (Fig. 16)",
    "camelot-loads": "Camelot's resources at four loads; p99 of Camelot and Camelot-NC (Fig. 17)",
    "camelot-artifact": "the 27 artifact pipelines p_i+c_j+m_k: peak loads (Fig. 18)",
    "camelot-multigpu": "peak loads on 2 GPUs and on a 16-GPU DGX-2-like machine (Fig. 19)",
    "camelot-comm": "live on simgpu: handing a buffer over by handle vs copying it, by size (Fig. 11)",
    "camelot-predictors": "per-stage duration/bandwidth/throughput models: DT vs LR vs RF errors (Fig. 12)",
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="colocate experiment", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="experiments:\n" + "\n".join(f"  {k:20s} {v[0]}"
                                                                    for k, v in EXPERIMENTS.items())
                                 + "\n" + "\n".join(f"  {k:20s} {v}" for k, v in CAMELOT.items()))
    ap.add_argument("name", choices=sorted(EXPERIMENTS) + sorted(CAMELOT), metavar="NAME",
                    help="the experiment (below)")
    ap.add_argument("--quick", action="store_true", help="2 services x 2 batch apps, 6 s runs (what tests run)")
    ap.add_argument("--out", type=Path, help="output folder (default bench/out/NAME)")
    ap.add_argument("--json", type=Path, help="also write the rows there")
    ap.add_argument("--services", help=f"comma-separated Tonic services (default all: {','.join(SERVICES)})")
    ap.add_argument("--batch", help=f"comma-separated Rodinia apps (default all: {','.join(BATCH)})")
    ap.add_argument("--policies", help="comma-separated policy names (default: the experiment's; "
                                       "claius-granularity: ';'-separated specs)")
    ap.add_argument("--policy", action="append", default=[], metavar="SPEC",
                    help="one more policy with options, e.g. 'mps-even,total=100' (repeatable)")
    ap.add_argument("--rate", type=float, default=10.0, help="queries per second (default 10)")
    ap.add_argument("--arrivals", default="poisson", metavar="KIND",
                    help="fixed, poisson (default), diurnal (Poisson whose rate swings +-50 %% over 60 s), "
                         "or replay:FILE (arrival times in s, one per line, for every service)")
    ap.add_argument("--qos-ms", type=float,
                    help=f"QoS target for every service (default {QOS_FACTOR} x its p99 alone, see --qos-base)")
    ap.add_argument("--horizon", type=float,
                    help="simulated seconds per run (default 30; --quick 6); validate-sim: seconds of each live "
                         "and simulated run (default 36, so that a p99 at 10 q/s rests on ~340 queries; "
                         "--quick 4)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--slowdown", type=float, default=SLOWDOWN, help="device slowdown (default %(default)g)")
    ap.add_argument("--gpus", type=int, help="claius-datacenter: GPUs per service (default 100; --quick 2); "
                                             "camelot-*: GPUs (default 2)")
    ap.add_argument("--address", help="claius-datacenter: a Ray cluster's address (default: a local Ray)")
    ap.add_argument("--qos-factor", type=float, default=QOS_FACTOR,
                    help="QoS target = this x --qos-base (default %(default)g)")
    ap.add_argument("--qos-base", choices=("alone-p99", "solo"), default="alone-p99",
                    help="what --qos-factor multiplies: the service's p99 alone under the same arrivals "
                         "(default) or one query of its largest size alone (missed by the service alone "
                         "once queueing counts)")
    ap.add_argument("--route", choices=("pool", "partition"), default="pool",
                    help="how a quota becomes SMs, as `colocate serve --route`: pool (an MPS percentage, "
                         "default) or partition (an SM partition in the app: multiples of 8 SMs)")
    ap.add_argument("--repeats", type=int, default=1, metavar="N",
                    help="validate-sim: live runs per pair and policy, and of each service alone; the "
                         "median counts (default 1)")
    ap.add_argument("--device-model", choices=("2080ti", "v100", "h100"), default="2080ti",
                    help="camelot-*: the GPU the device model is rescaled to (default 2080ti, the paper's; "
                         "camelot-multigpu's 16-GPU case is always v100)")
    ap.add_argument("--pipelines", help="camelot-*: comma-separated services (img-to-img, img-to-text, "
                                        "text-to-img, text-to-text) or artifact pipelines like p1+c2+m3")
    ap.add_argument("--batches", help="camelot-*: comma-separated batch sizes (default 8,16,32; artifact 8)")
    ap.add_argument("--verbose", action="store_true", help="show the policies' log lines")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    if a.name in CAMELOT:
        return camelot_main(a, ap)
    title, default_pols = EXPERIMENTS[a.name]
    svcs = a.services.split(",") if a.services else (["pos", "ner"] if a.quick else list(SERVICES))
    batch = a.batch.split(",") if a.batch else (["hotspot", "bfs"] if a.quick else list(BATCH))
    pols = [p for p in a.policies.split(",") if p] if a.policies is not None else list(default_pols)
    if a.policies and a.name == "claius-granularity":
        pols = a.policies.split(";")
    # --policies is split on commas: an option there lost its policy
    opt = [p for p in pols if "=" in p] if a.policies and a.name != "claius-granularity" else []
    if opt:
        ap.error(f"--policies {a.policies!r}: {', '.join(opt)} is an option, not a policy; "
                 f"give a policy with options as --policy 'NAME,key=value' (e.g. --policy 'mps-even,total=100')")
    pols += a.policy
    if not pols:
        ap.error("no policy: --policies NAMES or --policy SPEC")
    from controlplane.policies.base import parse_policy_spec, policy_names
    known = policy_names()
    for spec in pols:
        try:
            name = parse_policy_spec(spec)[0]
        except ValueError as e:
            ap.error(str(e))
        if name not in known:
            ap.error(f"unknown policy {name!r} (in {spec!r}): one of {', '.join(known)}")
    bad = [s for s in svcs if s not in SERVICES] + [b for b in batch if b not in BATCH]
    if bad:
        ap.error(f"unknown app(s) {', '.join(bad)}: services {', '.join(SERVICES)}; batch {', '.join(BATCH)}")
    replay: list[float] = []
    if a.arrivals.startswith("replay:"):
        try:
            replay = [float(x) for x in Path(a.arrivals[7:]).read_text().split()]
        except (OSError, ValueError) as e:
            ap.error(f"--arrivals {a.arrivals}: {e}")
        a.arrivals = "replay"
    elif a.arrivals not in ("fixed", "poisson", "diurnal"):
        ap.error(f"--arrivals {a.arrivals!r}: fixed, poisson, diurnal or replay:FILE")
    cfg = Config(slowdown=a.slowdown, rate=a.rate, arrivals=a.arrivals, seed=a.seed, qos_ms=a.qos_ms, replay=replay,
                 horizon_s=a.horizon or (6.0 if a.quick else 30.0), qos_factor=a.qos_factor,
                 qos_base=a.qos_base, route=a.route)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.ERROR, format="%(name)s: %(message)s")
    out = a.out or ROOT / "bench" / "out" / a.name

    def log(m: str) -> None:
        print(m, file=sys.stderr)

    t0 = time.monotonic()
    if a.name == "claius-multiqos":
        rows = multiqos(svcs if a.services or not a.quick else ["pos", "ner", "chk"], batch, pols, cfg, log,
                        progress=not a.no_progress, n=3 if a.quick else 15)
    elif a.name == "claius-datacenter":
        rows = datacenter(svcs if a.services or not a.quick else list(SERVICES),
                          batch if a.batch else list(BATCH), pols, cfg, log,
                          progress=not a.no_progress, per_service=a.gpus or (2 if a.quick else 100),
                          address=a.address)
    elif a.name == "validate-sim":
        duos = list(zip(svcs, batch)) if a.services or a.batch else (
            [("pos", "hotspot")] if a.quick else [("pos", "hotspot"), ("pos", "lud"), ("ner", "hotspot")])
        rows = validate(duos, pols, cfg, log, duration=a.horizon or (4.0 if a.quick else VALIDATE_S),
                        repeats=a.repeats)
    else:
        rows = pairs(svcs, batch, pols, cfg, log, progress=not a.no_progress)
    wall = time.monotonic() - t0
    if a.name == "validate-sim":
        return write_validation(out, rows, cfg, wall)
    summ = summary(rows)
    speeds = [r["sim_s_per_wall_s"] for r in rows if r["sim_s_per_wall_s"]]
    meta = {"experiment": a.name, "config": cfg.__dict__, "services": svcs, "batch": batch,
            "policies": pols, "wall_s": wall, "device": "simulator on simgpu's engine (shim/devmodel.py)",
            "sim_s_per_wall_s_median": sorted(speeds)[len(speeds) // 2] if speeds else None}
    write(out, rows, summ, meta, f"{a.name}: {title}")
    if a.name == "claius-ablation":
        meta["fig17"] = quota_trace(out, "imc" if "imc" in svcs else svcs[0], "bfs" if "bfs" in batch else batch[0],
                                    cfg, log)
        (out / "rows.json").write_text(json.dumps({"meta": meta, "summary": summ, "rows": rows}, indent=1))
        log(f"Fig. 17: {meta['fig17']['quota_changes']} quota changes, quotas {meta['fig17']['quotas_used']}")
    if a.json:
        a.json.write_text(json.dumps({"meta": meta, "summary": summ, "rows": rows}, indent=1))
    print((out / "table.md").read_text())
    print(f"{len(rows)} runs in {wall:.1f} s wall; {meta['sim_s_per_wall_s_median'] or 0:.1f} simulated s "
          f"per wall s (median); outputs in {out}")
    return 0


def camelot_main(a: argparse.Namespace, ap: argparse.ArgumentParser) -> int:
    """camelot-*: the pipeline experiments (bench/camelot/experiments.py)."""
    out = a.out or ROOT / "bench" / "out" / a.name
    if a.name == "camelot-comm":
        import handoff
        return handoff.main((["--quick"] if a.quick else []) + ["--out", str(out)])
    from camelot import experiments as cx
    from camelot.suite import pipeline
    pipes = [p for p in (a.pipelines or "").split(",") if p] or None
    for p in pipes or []:
        try:
            pipeline(p)
        except KeyError as e:
            ap.error(str(e.args[0]))
    try:
        batches = [int(b) for b in a.batches.split(",")] if a.batches else None
    except ValueError:
        ap.error(f"--batches {a.batches!r}: comma-separated whole numbers")
    if batches and min(batches) < 1:
        ap.error("--batches: sizes must be >= 1")
    pols = [p for p in a.policies.split(",") if p] if a.policies else None
    bad = [p for p in pols or [] if p not in cx.COMM]
    if bad:
        ap.error(f"unknown policy {', '.join(bad)} for {a.name}: {', '.join(cx.COMM)}")
    if a.gpus is not None and a.gpus < 1:
        ap.error("--gpus: at least 1")
    return cx.main(a.name, pipes, pols, out, a.quick, a.device_model, a.gpus, a.seed, batches,
                   not a.no_progress, a.json, lambda m: print(m, file=sys.stderr))


if __name__ == "__main__":
    sys.exit(main())
