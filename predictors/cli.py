"""Predictors of task, query and group durations per SM quota: sample schema,
synthetic samples, training and the accuracy/latency report.

Samples live in a store per device (<store>/<device>/<kind>.jsonl; the
profiler writes them, `synth` writes clearly labelled synthetic ones);
`train` fits models on them and saves them into a models directory; `report`
measures the saved models (holdout MAPE, error percentiles, latency of
scikit-learn's predict vs the compiled evaluator) and draws the figures.
"""
from __future__ import annotations

import json
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)


class KindArg(str, Enum):
    query = "query"
    task = "task"
    group = "group"
    all = "all"


class ModelArg(str, Enum):
    dt = "dt"
    knn = "knn"
    lr = "lr"
    rf = "rf"
    mlp = "mlp"
    all = "all"


class SplitArg(str, Enum):
    sample = "sample"
    config = "config"


STORE_HELP = ("Sample store root (default $COLOCATE_DATA_DIR/profiles, else "
              "$XDG_DATA_HOME/colocate/profiles, else ~/.local/share/colocate/profiles).")
MODELS_HELP = "Models directory (default: <store>/../models/<device>)."
DEVICE_HELP = "Device whose samples to use (a store keeps one directory per device)."


def _kinds(k: KindArg) -> list[str]:
    return ["query", "task", "group"] if k == KindArg.all else [k.value]


def _store_root(store: Optional[Path]) -> Path:
    from predictors.store import default_root
    return store if store is not None else default_root()


def _models_dir(store: Optional[Path], models: Optional[Path], device: str) -> Path:
    from predictors.store import slug
    return models if models is not None else _store_root(store).parent / "models" / slug(device)


def _fail(msg: str) -> None:
    print(f"colocate: {msg}", file=sys.stderr)
    raise typer.Exit(2)


@app.command()
def schema(kind: KindArg = typer.Option(KindArg.all, help="Which sample kind."),
           as_json: bool = typer.Option(False, "--json", help="Print it as JSON.")) -> None:
    """Print the sample schema: each kind's features and targets, with its version."""
    from rich.console import Console
    from rich.table import Table

    from predictors import schema as S
    ks = [S.kind(n) for n in _kinds(kind)]
    if as_json:
        print(json.dumps([{**k.to_dict(), "fingerprint": k.fingerprint()} for k in ks], indent=1))
        return
    con = Console(width=None if sys.stdout.isatty() else 160)
    for k in ks:
        t = Table(title=f"{k.name} (schema v{k.version}, {k.fingerprint()}): {k.doc}",
                  title_justify="left")
        for c in ("name", "type", "meaning"):
            t.add_column(c)
        for line in S.describe(k):
            t.add_row(*line)
        con.print(t)


@app.command()
def synth(kind: KindArg = typer.Option(KindArg.all, help="Which sample kind."),
          n: int = typer.Option(0, help="Samples per kind (default: task 20000, query 3000, "
                                "group 40000; task and query stop earlier when every "
                                "configuration has its repetitions)."),
          store: Optional[Path] = typer.Option(None, help=STORE_HELP, metavar="DIR"),
          device: str = typer.Option("simgpu", help=DEVICE_HELP),
          seed: int = typer.Option(0, help="Random seed."),
          noise: float = typer.Option(0.02, help="Log-normal noise per target (0.02 = 2 %).")) -> None:
    """Write SYNTHETIC samples from simgpu's device-model equations into the store.

    They are labelled src=synthetic, and the report says so; they stand in
    until real profiles exist.  Keys are deterministic per seed, so running
    it twice adds nothing."""
    from predictors import synth as syn
    from predictors.store import Store, StoreError
    defaults = {"task": 20000, "query": 3000, "group": 40000}
    st = Store(_store_root(store), device)
    for k in _kinds(kind):
        samples = syn.generate(k, n or defaults[k], seed=seed, noise=noise)
        try:
            added = st.append(k, samples, src=syn.SOURCE)
        except StoreError as e:
            _fail(str(e))
        print(f"{k}: {added} new synthetic samples ({len(samples) - added} already there) "
              f"-> {st.path(k)}")


@app.command()
def train(kind: KindArg = typer.Option(KindArg.all, help="Which sample kind."),
          model: ModelArg = typer.Option(ModelArg.all, help="dt: decision tree, rf: random forest, "
                                         "knn: 5 nearest neighbours, lr: linear regression, "
                                         "mlp: 3x32 ReLU MLP (as Abacus)."),
          target: Optional[str] = typer.Option(None, help="Only this target (default: all of the kind's)."),
          store: Optional[Path] = typer.Option(None, help=STORE_HELP, metavar="DIR"),
          device: str = typer.Option("simgpu", help=DEVICE_HELP),
          models: Optional[Path] = typer.Option(None, "--out", help=MODELS_HELP, metavar="DIR"),
          seed: int = typer.Option(0, help="Seed of the 80/20 split, the folds and the models."),
          cv: int = typer.Option(5, help="Folds of cross-validation on the 80 % (0: none)."),
          split: SplitArg = typer.Option(SplitArg.sample, help="Hold out samples (as C-Laius) or "
                                         "whole configurations (all repetitions of one)."),
          quick: bool = typer.Option(False, help="Few MLP epochs and trees (smoke tests)."),
          ) -> None:
    """Train predictors on a device's samples and save them.

    One model per kind, target and model type: 80/20 split (seeded), k-fold
    CV on the 80 %, saved with its feature schema, vocabulary, metadata
    (library versions, date, sample counts and sources, holdout and CV MAPE)
    and holdout rows."""
    from predictors import schema as S
    from predictors import train as T
    from predictors.store import Store, StoreError
    st = Store(_store_root(store), device)
    out = _models_dir(store, models, device)
    mods = list(T.MODELS) if model == ModelArg.all else [model.value]
    for k in _kinds(kind):
        try:
            ss = st.load(k)
        except StoreError as e:
            if kind == KindArg.all:
                print(f"{k}: skipped ({e})", file=sys.stderr)
                continue
            _fail(f"{e}; profile the device or run `colocate predictors synth`")
        targets = S.kind(k).target_names
        if target is not None:
            if target not in targets:
                if kind == KindArg.all:
                    continue
                _fail(f"{k} has no target {target!r} (has {', '.join(targets)})")
            targets = [target]
        srcs = ", ".join(f"{n} {s}" for s, n in sorted(ss.source_counts.items()))
        print(f"{k}: {len(ss)} samples ({srcs}) of {ss.device}" +
              (f", {ss.torn} torn lines skipped" if ss.torn else ""))
        for t in targets:
            y = ss.y(t)
            if target is None and not ((y == y) & (y > 0)).any():
                # e.g. bandwidth/IPC of a trace-only GPU profile: nothing to learn
                print(f"  {k}.{t}: skipped (no sample carries this target)")
                continue
            for m in mods:
                try:
                    tm = T.fit(ss, t, m, seed=seed, cv=cv, split_by=split.value, quick=quick)
                except T.ModelError as e:
                    _fail(str(e))
                p = T.save(tm, out)
                cvs = (f", CV {tm.meta['cv_mape_mean']:.2f} +- {tm.meta['cv_mape_std']:.2f} %"
                       if tm.meta["cv_mape_mean"] is not None else "")
                print(f"  {tm.name:28} holdout MAPE {tm.meta['holdout_mape']:6.2f} %{cvs}"
                      f"  ({tm.meta['fit_s']:.1f} s) -> {p}")


@app.command(context_settings={"allow_interspersed_args": True})
def profile(targets: Optional[list[str]] = typer.Argument(
                None, metavar="APP|tonic:NET... [-- CMD [ARGS]]",
                help="Rodinia apps (hotspot bfs btree pathfinder nw lud myocyte lavamd), Tonic "
                     "services (tonic:dig, tonic:pos, ...), and/or one command after --."),
            quotas: str = typer.Option("10,20,30,40,50,60,70,80,90,100", metavar="LIST",
                                       help="SM quotas in percent, comma-separated."),
            inputs: Optional[list[str]] = typer.Option(
                None, metavar="[TARGET=]A;B;...",
                help="Inputs, ';'-separated: argument sets for apps and commands "
                     "(\"--size 64;--size 128\"), query sizes for services (\"1;4;16\"). "
                     "TARGET= gives one target's; repeatable.  Default: a built-in ladder per app/net."),
            reps: int = typer.Option(3, help="Repetitions of each input at each quota."),
            service_args: Optional[str] = typer.Option(
                None, metavar="ARGS", help="tonic-service options for every net (default per net, "
                "e.g. '--width 0.5' for the word nets; '' for full size)."),
            name: Optional[str] = typer.Option(None, help="Target name of the command after -- "
                                               "(default: its basename)."),
            out: Optional[Path] = typer.Option(None, "--out", help=STORE_HELP, metavar="DIR"),
            timeout: float = typer.Option(300.0, help="Seconds one run (one service process) may take."),
            progress: bool = typer.Option(True, help="Show a progress bar."),
            groups: int = typer.Option(0, "--groups", metavar="N",
                                       help="Abacus operator groups instead: co-run the tonic:NET "
                                       "services on one simulated device and store N group "
                                       "samples (resumable; --inputs are the sizes to draw)."),
            group_size: str = typer.Option("2-4", metavar="K|LO-HI",
                                           help="With --groups: services per group."),
            timescale: float = typer.Option(1000.0, help="With --groups: SIMGPU_TIMESCALE (wall "
                                            "s per device s; contention is modelled only > 0)."),
            seed: int = typer.Option(0, help="With --groups: seed of the random groups.")) -> None:
    """Profile apps and services solo on simgpu at each SM quota into the sample store.

    Every input x quota x repetition runs alone under the shim
    (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=q, SIMGPU_TIMESCALE=0, a private
    device), traced; each task becomes a task sample (C-Laius Table 1
    features; duration, bandwidth and IPC from simgpu's model), each
    service query a query sample (device time, PCIe time).  Resumable:
    configurations already in the store are skipped.  The device is
    "simgpu" ($SIMGPU_NAME).  Exit 1 when a run failed, 2 on bad usage.

    With an NVIDIA driver present the runs go to the GPU: durations from
    the trace's device events; quotas < 100 under MPS (found or started,
    stopped after; without MPS only --quotas 100 is accepted, anything else
    exits 1); bandwidth and IPC from a second run under ncu when ncu is on
    PATH or $COLOCATE_NCU, else absent.  The device is the GPU's name.

    --groups N samples Abacus operator groups instead (predictors/groups.py):
    the services run at once on one simulated device (at 100 %, or the one
    quota --quotas names), random groups of them issue random operator
    ranges together, and each group's latency becomes a group sample."""
    from predictors import profile as P
    from predictors import profile_gpu
    from predictors.store import StoreError
    try:
        qs = P.parse_quotas(quotas)
    except ValueError as e:
        _fail(str(e))
    if reps < 1:
        _fail("--reps must be >= 1")
    on_gpu = profile_gpu.gpu_present()
    if on_gpu and groups:
        _fail("--groups co-runs services on one simulated device: run it on simgpu "
              "(a machine without an NVIDIA driver)")
    try:
        tgts = P.resolve(targets or [], inputs or [], service_args, name)
        P.check_built(shim=not groups, sim=not on_gpu)
    except P.ProfileError as e:
        _fail(str(e))
    st = profile_gpu.profile_store(out)
    dev = st.device
    if groups:
        _profile_groups(tgts, qs, quotas, st, groups, group_size, timescale, seed, timeout,
                        progress)
        return
    t0 = time.monotonic()
    try:
        summ = profile_gpu.profile_here(tgts, qs, reps, st, timeout, progress,
                                        note=lambda gpu: _gpu_note(dev, gpu))
    except profile_gpu.GpuUnavailable as e:
        print(f"colocate: {e}", file=sys.stderr)
        raise typer.Exit(1) from None
    except (P.ProfileError, StoreError) as e:
        _fail(str(e))
    print(f"profile of {', '.join(t.label for t in tgts)} on {dev}: "
          f"{summ.configs} configuration(s) run, {summ.skipped} already stored, "
          f"{summ.failed} failed, in {time.monotonic() - t0:.1f} s")
    print(f"  added {summ.added['task']} task and {summ.added['query']} query samples "
          f"-> {st.dir}" + (f" ({summ.dropped} task(s) without a device time dropped)"
                            if summ.dropped else ""))
    if summ.failed:
        raise typer.Exit(1)


def _gpu_note(device: str, gpu) -> None:
    """What `profile` on a real GPU has: MPS for quotas < 100, ncu's counters or durations only."""
    print(f"colocate: GPU {device}: {gpu.note}; "
          + (f"counters from {gpu.ncu}" if gpu.ncu else
             "no ncu (PATH or $COLOCATE_NCU): durations only, no bandwidth/IPC")
          + f"; samples labelled {gpu.src()}", file=sys.stderr)


def _profile_groups(tgts: list, qs: list[int], quotas: str, st, n: int, group_size: str,
                    timescale: float, seed: int, timeout: float, progress: bool) -> None:
    """`profile --groups N`: the quota is 100 unless --quotas names one."""
    from predictors import groups as G
    from predictors import profile as P
    from predictors.store import StoreError
    default = "10,20,30,40,50,60,70,80,90,100"
    if quotas != default and len(qs) != 1:
        _fail("--groups runs every service at one quota: give --quotas Q (default 100)")
    quota = qs[0] if quotas != default else 100
    if n < 0:
        _fail("--groups must be >= 0")
    try:
        summ = G.sample_groups(tgts, n, st, quota=quota, timescale=timescale,
                               group_size=group_size, seed=seed, timeout=timeout,
                               progress=progress,
                               log=lambda m: print(m, file=sys.stderr))
    except P.ProfileError as e:
        _fail(str(e))
    except (P.RunFailed, StoreError) as e:
        print(f"colocate: {e}", file=sys.stderr)
        raise typer.Exit(1) from None
    per = (f", {summ.elapsed_s / max(summ.added, 1) * 100:.1f} s per 100"
           if summ.added else "")
    sizes = ", ".join(f"{k}: {v}" for k, v in sorted(summ.members.items()))
    print(f"groups of {', '.join(t.label for t in tgts)} on {st.device} (quota {quota} %, "
          f"timescale {timescale:g}): {summ.added} sample(s) added, {summ.skipped} already "
          f"stored, {summ.failed} failed, in {summ.elapsed_s:.1f} s{per}")
    if sizes:
        print(f"  members per group: {sizes} -> {st.path('group')}")
    if summ.failed:
        raise typer.Exit(1)



@app.command()
def traces(names: list[str] = typer.Argument(
               ..., metavar="APP|tonic:NET|PROGRAM...",
               help="Rodinia apps (hotspot bfs btree pathfinder nw lud myocyte lavamd), Tonic "
                    "services (tonic:dig, tonic:imc, tonic:face, tonic:pos, tonic:chk, tonic:ner) "
                    "or programs (a path, or a name on PATH) that take --repeat N."),
           out: Optional[Path] = typer.Option(
               None, "--out", metavar="DIR",
               help="Trace directory (default: <data dir>/traces/<device>-<settings hash>, the "
                    "data dir as for `colocate profile`: $COLOCATE_DATA_DIR, else "
                    "$XDG_DATA_HOME/colocate, else ~/.local/share/colocate)."),
           sizes: Optional[str] = typer.Option(
               None, metavar="LIST", help="Services: query sizes, comma-separated (default per "
                                          "net, as `colocate profile`'s ladder)."),
           args: str = typer.Option("", metavar="ARGS", help="Apps and programs: their arguments "
                                    "(default none: the program's defaults, as the co-location "
                                    "experiment runs it)."),
           service_args: str = typer.Option("", metavar="ARGS", help="Services: tonic-service "
                                            "options (default none: the full nets)."),
           force: bool = typer.Option(False, "--force", help="Record again traces already there."),
           twins: bool = typer.Option(False, "--twins", help="Run simgpu's host twins (real "
                                      "results, and control flow that depends on them, as bfs's "
                                      "levels; slower).  Default: timing-only, as the co-location "
                                      "experiment runs.")
           ) -> None:
    """Record task traces of programs on simgpu, for a trace-driven simulator.

    Each program runs under the shim on a private simgpu device, timing-only
    (no host twins: seconds, not minutes), and its device tasks (kernels,
    copies, memsets) are written in issue order with their model figures
    (grid, block, registers, shared memory, flops, bytes), the host time
    before each (gap_us), whether the host waited for the device before it
    (sync) and its stream: one JSON line each after a header.  A batch app's
    trace is one iteration of its loop; a service's is one query per size.
    The format: predictors/traces.py.  One file per program, NAME.jsonl (or
    NAME@ARGS.jsonl), reused unless --force.  simgpu's settings come from the
    environment (SIMGPU_*) and key the default directory.  Exit 1 when a
    recording failed, 2 on bad usage or a missing build."""
    from predictors import traces as T
    szs: list[int] = []
    if sizes:
        try:
            szs = [int(x) for x in sizes.split(",") if x.strip()]
        except ValueError:
            _fail(f"--sizes {sizes!r}: comma-separated positive integers")
        if not szs or min(szs) < 1:
            _fail(f"--sizes {sizes!r}: comma-separated positive integers")
    try:
        done = T.record_all(names, out, sizes=szs, args=args, service_args=service_args,
                            force=force, twins=twins)
    except T.TraceError as e:
        _fail(str(e))
    failed = [d.name for d in done if d.error]
    if failed:
        print(f"colocate: {len(failed)} recording(s) failed: {', '.join(failed)}", file=sys.stderr)
        raise typer.Exit(1)

@app.command()
def report(models: Optional[Path] = typer.Option(None, help=MODELS_HELP, metavar="DIR"),
           store: Optional[Path] = typer.Option(None, help=STORE_HELP, metavar="DIR"),
           device: str = typer.Option("simgpu", help=DEVICE_HELP),
           out: Path = typer.Option(Path("predictors-report"), help="Where results.json, report.md "
                                    "and the PNGs go."),
           reps: int = typer.Option(200, help="Timed scikit-learn calls per latency figure "
                                    "(the compiled evaluator gets 10x as many)."),
           plots: bool = typer.Option(True, help="Draw the PNG figures."),
           timing: bool = typer.Option(True, help="Measure prediction latency.")) -> None:
    """Measure the saved models: accuracy, agreement and prediction latency.

    Per model: holdout MAPE (C-Laius Eq. 2), error p50/p90/p99, compiled vs
    scikit-learn agreement (bitwise for trees), and the latency of one row
    and of 64 rows (median, p99) for scikit-learn's predict and the compiled
    evaluator, measured in the same run.  Writes results.json, report.md and
    PNG figures (predicted vs measured, error CDFs, MAPE and latency bars)."""
    from rich.console import Console

    from predictors import report as R
    from predictors import train as T
    d = _models_dir(store, models, device)
    try:
        tms = T.load_dir(d)
    except T.ModelError as e:
        _fail(str(e))
    if not tms:
        _fail(f"no models in {d}: run `colocate train` first")
    rows = R.run(tms, out, reps=reps, plots=plots, timing=timing)
    Console(width=None if sys.stdout.isatty() else 250).print(R.rich_table(rows))
    print(f"wrote {out}/results.json, report.md" + (" and PNG figures" if plots else ""))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
