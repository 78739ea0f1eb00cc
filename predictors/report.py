"""How good and how fast the trained predictors are.

Per model: MAPE on its holdout (C-Laius Eq. 2), percentiles of the absolute
percentage error, whether the compiled evaluator gives scikit-learn's outputs
(bit for bit for trees, max relative difference for the MLP), and the
prediction latency of one row and of a batch of 64 rows, median and p99,
for scikit-learn's predict and the compiled evaluator measured in the same
run.  Writes results.json, report.md and PNGs into the output directory:
scatter_<kind>.png (predicted vs measured, a panel per target and model, as
C-Laius Fig. 6-8 / Abacus Fig. 10), cdf_<kind>.png (error CDFs, as Camelot
Fig. 12), mape.png and latency.png (bars, as C-Laius Fig. 9).
"""
from __future__ import annotations

import gc
import json
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from predictors.train import MODELS, TrainedModel, ape

BATCH = 64


def _timeit(fn: Callable[[int], Any], reps: int, nvar: int) -> tuple[float, float]:
    """Median and p99 of one call, in microseconds (input i % nvar each call)."""
    for i in range(min(reps, 20)):            # warm caches and lazy paths
        fn(i % nvar)
    ts = np.empty(reps)
    pc = time.perf_counter_ns
    gc_on = gc.isenabled()
    gc.disable()
    try:
        for i in range(reps):
            t0 = pc()
            fn(i % nvar)
            ts[i] = pc() - t0
    finally:
        if gc_on:
            gc.enable()
    return float(np.median(ts) / 1e3), float(np.percentile(ts, 99) / 1e3)


def _batches(X: np.ndarray) -> list[np.ndarray]:
    """Batches of 64 holdout rows (cycled when the holdout is smaller)."""
    n = max(1, len(X) // BATCH)
    idx = np.arange(n * BATCH) % len(X)
    return [np.ascontiguousarray(X[idx[i * BATCH:(i + 1) * BATCH]]) for i in range(n)]


def latency(tm: TrainedModel, reps: int = 200, creps: int = 2000) -> dict[str, Any]:
    """Single-row and batch-64 latency of scikit-learn's predict and the
    compiled evaluator, in the same run, both with one BLAS/OpenMP thread
    (a controller decision is one thread; idle BLAS threads that spin only
    steal the core on a small machine)."""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(limits=1):
        return _latency(tm, reps, creps)


def _latency(tm: TrainedModel, reps: int, creps: int) -> dict[str, Any]:
    X = np.ascontiguousarray(tm.holdout["X"], dtype=np.float64)
    rows = [np.ascontiguousarray(X[i]) for i in range(min(len(X), 256))]
    rows2d = [r.reshape(1, -1) for r in rows]
    bats = _batches(X)
    est = tm.sk()
    r: dict[str, Any] = {}
    r["sk_one_med"], r["sk_one_p99"] = _timeit(lambda i: est.predict(rows2d[i]), reps, len(rows))
    r["sk_b64_med"], r["sk_b64_p99"] = _timeit(lambda i: est.predict(bats[i]), reps, len(bats))
    c = tm.compiled()
    if c is not None:
        r["backend"] = c.backend
        r["c_one_med"], r["c_one_p99"] = _timeit(lambda i: c.predict_one(rows[i]), creps, len(rows))
        r["c_b64_med"], r["c_b64_p99"] = _timeit(lambda i: c.predict(bats[i]), creps, len(bats))
    return r


def agreement(tm: TrainedModel) -> dict[str, Any]:
    """Compiled vs scikit-learn on the holdout: bitwise for trees, relative for the MLP."""
    c = tm.compiled()
    if c is None:
        return {}
    X = tm.holdout["X"]
    a, b = c.predict(X), tm.sk_predict(X)
    same = int(np.sum(a.view(np.int64) == b.view(np.int64)))
    rel = float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300))) if len(b) else 0.0
    return {"bitwise_equal": same, "n": int(len(b)), "max_rel": rel}


def evaluate(tm: TrainedModel, reps: int = 200, timing: bool = True) -> dict[str, Any]:
    """One row of the report."""
    y = np.asarray(tm.holdout["y"], dtype=np.float64)
    pred = tm.sk_predict(tm.holdout["X"])
    e = ape(y, pred)
    row: dict[str, Any] = {
        "name": tm.name, "kind": tm.kind.name, "target": tm.target, "model": tm.model,
        "unit": tm.kind.target(tm.target).unit,
        "n_train": tm.meta["n_train"], "n_holdout": len(y),
        "mape": float(e.mean()), "p50": float(np.percentile(e, 50)),
        "p90": float(np.percentile(e, 90)), "p99": float(np.percentile(e, 99)),
        "cv_mape_mean": tm.meta.get("cv_mape_mean"), "cv_mape_std": tm.meta.get("cv_mape_std"),
        "sources": tm.meta.get("sources", {}), "device": tm.meta.get("device"),
        "split": tm.meta.get("split"),
    }
    row.update(agreement(tm))
    if timing:
        row.update(latency(tm, reps))
    return row


def _order(tms: Sequence[TrainedModel]) -> list[TrainedModel]:
    kinds = {"query": 0, "task": 1, "group": 2}
    return sorted(tms, key=lambda t: (kinds.get(t.kind.name, 9), t.kind.target_names.index(t.target),
                                      MODELS.index(t.model) if t.model in MODELS else 99))


def run(tms: Sequence[TrainedModel], out: Path | str, reps: int = 200, plots: bool = True,
        timing: bool = True) -> list[dict[str, Any]]:
    """Evaluate every model, write results.json / report.md / PNGs into out."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ordered = _order(tms)
    rows = [evaluate(tm, reps, timing) for tm in ordered]
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    (out / "report.md").write_text(markdown(rows))
    if plots:
        plot(ordered, rows, out)
    return rows


def data_line(rows: Sequence[dict[str, Any]]) -> str:
    """Where the samples came from: the report must say when they are synthetic."""
    src: dict[str, int] = {}
    devs = sorted({str(r.get("device")) for r in rows})
    for r in rows:
        for s, n in r.get("sources", {}).items():
            src[s] = max(src.get(s, 0), n)
    parts = ", ".join(f"{s}" for s in sorted(src))
    note = (" - SYNTHETIC samples from simgpu's device-model equations (predictors/synth.py), "
            "not measurements" if "synthetic" in src else "")
    return f"data: {parts or 'unknown'} on {', '.join(devs)}{note}"


def table_rows(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    head = ["model", "n train/holdout", "MAPE %", "CV MAPE %", "APE p50/p90/p99 %",
            "compiled = sklearn", "sklearn 1 row us (p99)", "compiled 1 row us (p99)",
            "sklearn 64 rows us (p99)", "compiled 64 rows us (p99)", "speed-up 1 / 64"]
    body = []
    for r in rows:
        if "n" in r:
            eq = (f"{r['bitwise_equal']}/{r['n']} bitwise" if r["model"] in ("dt", "rf")
                  else f"max rel {r['max_rel']:.1e}")
        else:
            eq = "-"
        cv = (f"{r['cv_mape_mean']:.2f} +- {r['cv_mape_std']:.2f}"
              if r.get("cv_mape_mean") is not None else "-")

        def lat(p: str) -> str:
            return (f"{r[p + '_med']:.2f} ({r[p + '_p99']:.1f})" if p + "_med" in r else "-")
        sp = (f"{r['sk_one_med'] / r['c_one_med']:.0f}x / {r['sk_b64_med'] / r['c_b64_med']:.0f}x"
              if "c_one_med" in r else "-")
        body.append([r["name"], f"{r['n_train']}/{r['n_holdout']}", f"{r['mape']:.2f}", cv,
                     f"{r['p50']:.1f}/{r['p90']:.1f}/{r['p99']:.1f}", eq,
                     lat("sk_one"), lat("c_one"), lat("sk_b64"), lat("c_b64"), sp])
    return head, body


def backend_line(rows: Sequence[dict[str, Any]]) -> str:
    """Which compiled evaluator the latencies are of (C, or the numpy fallback)."""
    b = sorted({str(r["backend"]) for r in rows if "backend" in r})
    names = {"c": "C (predictors._cinfer)", "numpy": "numpy fallback (C module not built)"}
    return "compiled evaluator: " + (", ".join(names.get(x, x) for x in b) if b else "not timed")


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    head, body = table_rows(rows)
    lines = [data_line(rows), backend_line(rows), "", "| " + " | ".join(head) + " |",
             "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(b) + " |" for b in body]
    return "\n".join(lines) + "\n"


def rich_table(rows: Sequence[dict[str, Any]]) -> Any:
    from rich.table import Table
    head, body = table_rows(rows)
    t = Table(title="predictors: holdout error and prediction latency",
              caption=data_line(rows) + "; " + backend_line(rows))
    for h in head:
        t.add_column(h, justify="left" if h == "model" else "right")
    for b in body:
        t.add_row(*b)
    return t


def plot(tms: Sequence[TrainedModel], rows: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    """PNG figures; returns their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[Path] = []
    src = data_line(rows)
    by_kind: dict[str, dict[str, list[TrainedModel]]] = {}
    for tm in tms:
        by_kind.setdefault(tm.kind.name, {}).setdefault(tm.target, []).append(tm)

    def save(fig: Any, name: str, **margins: float) -> None:
        # fixed margins: tight_layout costs seconds per figure with log axes
        fig.text(0.5, 0.005, src, ha="center", fontsize=6)
        fig.subplots_adjust(**{"left": 0.08, "right": 0.98, "bottom": 0.14, "top": 0.88,
                               "wspace": 0.38, "hspace": 0.55, **margins})
        made.append(out / name)
        fig.savefig(made[-1], dpi=100)
        plt.close(fig)

    for kind, targets in by_kind.items():
        # predicted vs measured: a row per target, a column per model
        ncol = max(len(ms) for ms in targets.values())
        fig, axes = plt.subplots(len(targets), ncol, figsize=(3.0 * ncol, 2.9 * len(targets)),
                                 squeeze=False)
        for axrow, (target, ms) in zip(axes, targets.items()):
            unit = ms[0].kind.target(target).unit
            for ax, tm in zip(axrow, ms):
                y = tm.holdout["y"]
                p = tm.sk_predict(tm.holdout["X"])
                ax.scatter(y, p, s=3, alpha=0.4)
                lo, hi = float(min(y.min(), p.min())), float(max(y.max(), p.max()))
                ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
                if lo > 0 and hi / lo > 50:
                    ax.set_xscale("log")
                    ax.set_yscale("log")
                ax.set_title(f"{target} {tm.model}: MAPE {np.mean(ape(y, p)):.2f} %", fontsize=8)
                ax.set_xlabel(f"measured [{unit}]", fontsize=7)
                ax.set_ylabel(f"predicted [{unit}]", fontsize=7)
            for ax in axrow[len(ms):]:
                ax.set_visible(False)
        fig.suptitle(f"{kind}: predicted vs measured (holdout)", fontsize=10)
        h = 2.9 * len(targets)                  # inches: margins below in inches / h
        save(fig, f"scatter_{kind}.png", left=0.06, bottom=0.65 / h, top=1 - 0.6 / h)
        # CDF of the error, a panel per target
        fig, axes = plt.subplots(1, len(targets), figsize=(5.0 * len(targets), 3.6), squeeze=False)
        for ax, (target, ms) in zip(axes[0], targets.items()):
            for tm in ms:
                e = np.sort(ape(tm.holdout["y"], tm.sk_predict(tm.holdout["X"])))
                ax.plot(e, np.arange(1, len(e) + 1) / len(e), label=tm.model)
            ax.set_xscale("symlog", linthresh=1.0)
            ax.set_xlabel("absolute percentage error [%]")
            ax.set_ylabel("CDF")
            ax.set_title(f"{kind} {target}", fontsize=9)
            ax.axvline(5.0, color="grey", lw=0.6, ls=":")
            ax.legend(fontsize=7)
        fig.suptitle(f"{kind}: error CDF (holdout)", fontsize=10)
        save(fig, f"cdf_{kind}.png")

    # MAPE per model
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * len(rows)), 3.6))
    ax.bar(range(len(rows)), [r["mape"] for r in rows], color="tab:blue")
    ax.set_xticks(range(len(rows)), [r["name"] for r in rows], rotation=70, fontsize=6)
    ax.set_yscale("log")
    ax.axhline(5.0, color="grey", lw=0.6, ls=":")
    ax.set_ylabel("holdout MAPE [%]")
    ax.set_title("holdout MAPE per model", fontsize=10)
    save(fig, "mape.png", bottom=0.34, top=0.92)

    # latency bars: sklearn vs compiled, one row and 64 rows
    timed = [r for r in rows if "sk_one_med" in r]
    if timed:
        fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(timed)), 3.8))
        x = np.arange(len(timed))
        series = [("sk_one_med", "sklearn, 1 row"), ("c_one_med", "compiled, 1 row"),
                  ("sk_b64_med", "sklearn, 64 rows"), ("c_b64_med", "compiled, 64 rows")]
        for i, (key, label) in enumerate(series):
            ax.bar(x + (i - 1.5) * 0.2, [r.get(key, 0.0) or 0.0 for r in timed], 0.2, label=label)
        ax.set_xticks(x, [r["name"] for r in timed], rotation=70, fontsize=6)
        ax.set_yscale("log")
        ax.set_ylabel("median latency [us]")
        ax.axhline(5.0, color="grey", lw=0.6, ls=":")
        ax.axhline(50.0, color="grey", lw=0.6, ls="--")
        ax.legend(fontsize=7)
        ax.set_title("prediction latency, same run", fontsize=10)
        save(fig, "latency.png", bottom=0.34, top=0.92)
    return made
