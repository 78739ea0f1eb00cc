"""Which mechanism of simgpu's device model causes what: bench/colocation.py
run on the full model, with each mechanism switched off in turn, and on the
fluid model, side by side.

    .venv/bin/python bench/sensitivity.py                       # default pair, all variants
    .venv/bin/python bench/sensitivity.py --service chk --batch pathfinder,nw --variants full,fluid
    .venv/bin/python bench/sensitivity.py --json out.json --md out.md

Each variant is one `bench/colocation.py` run in its own interpreter (the
same policies, same load, its own models: predictors are profiled on the
device they will run on).  Prints a table of each policy's p99, QoS
violations and batch throughput (normalised to solo) per variant, and the
change against the full model.  A variant takes the time of one colocation
run: about (profiling + 15 s per policy).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from colocation import MECHS  # bench/ is this script's folder

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("full", *(f"-{m}" for m in MECHS), "fluid")


def variant_args(v: str) -> list[str]:
    """colocation.py options of one variant: full, fluid, or -MECH (full without it)."""
    if v == "full":
        return ["--model", "full"]
    if v == "fluid":
        return ["--model", "fluid"]
    if v.startswith("-") and v[1:] in MECHS:
        return ["--model", "full", "--model-off", v[1:]]
    raise ValueError(f"unknown variant {v!r} (full, fluid, " + ", ".join(f"-{m}" for m in MECHS) + ")")


def run_variant(v: str, passthrough: list[str], work: Path, log) -> dict:
    out = work / f"{v.lstrip('-') or 'full'}{'-off' if v.startswith('-') else ''}.json"
    cmd = [sys.executable, str(ROOT / "bench" / "colocation.py"), *variant_args(v), *passthrough,
           "--json", str(out), "--quiet"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0 or not out.exists():
        raise RuntimeError(f"variant {v}: colocation.py exited {p.returncode}:\n{p.stderr[-2000:]}")
    log(f"{v}: {time.monotonic() - t0:.0f} s")
    return json.loads(out.read_text())


def table(runs: dict[str, dict]) -> str:
    """Markdown: one row per variant x policy, with deltas against full."""
    full = {r["policy"]: r for r in runs.get("full", {}).get("results", [])}
    lines = ["| model | policy | p99 ms | QoS viol. | batch mean | Δp99 vs full | Δbatch vs full |",
             "|---|---|---|---|---|---|---|"]
    for v, doc in runs.items():
        for r in doc["results"]:
            f = full.get(r["policy"])
            dp = (f"{r['p99_ms'] - f['p99_ms']:+.1f}" if f and v != "full" and r["p99_ms"] is not None
                  and f["p99_ms"] is not None else "")
            db = f"{r['mean_norm'] - f['mean_norm']:+.2f}" if f and v != "full" else ""
            name = "full" if v == "full" else "fluid" if v == "fluid" else f"full without {v[1:]}"
            p99 = "-" if r["p99_ms"] is None else f"{r['p99_ms']:.1f}"
            lines.append(f"| {name} | {r['policy']} | {p99} | {r['violations']}/{r['queries']} | "
                         f"{r['mean_norm']:.2f} | {dp} | {db} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help="comma-separated: full, fluid, -MECH for full without MECH (default: %(default)s)")
    p.add_argument("--policies", default="claius,mps-even,mps-priority,baymax",
                   help="passed to colocation.py (default: %(default)s)")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "colocate-sensitivity",
                   help="working dir (models cached per variant)")
    p.add_argument("--json", type=Path, help="write every variant's results here")
    p.add_argument("--md", type=Path, help="write the table here (markdown)")
    p.add_argument("--quiet", action="store_true")
    a, rest = p.parse_known_args(argv)
    variants = [v for v in a.variants.split(",") if v]
    try:
        for v in variants:
            variant_args(v)
    except ValueError as e:
        print(f"sensitivity: {e}", file=sys.stderr)
        return 2
    log = (lambda m: None) if a.quiet else (lambda m: print(f"[sensitivity] {m}", file=sys.stderr, flush=True))  # noqa: E731
    a.work.mkdir(parents=True, exist_ok=True)
    passthrough = ["--policies", a.policies, "--work", str(a.work), *rest]
    runs: dict[str, dict] = {}
    try:
        for i, v in enumerate(variants, 1):
            log(f"variant {i}/{len(variants)}: {v}")
            runs[v] = run_variant(v, passthrough, a.work, log)
    except RuntimeError as e:
        print(f"sensitivity: {e}", file=sys.stderr)
        if not runs:
            return 1
    text = table(runs)
    print(text)
    if a.json:
        a.json.write_text(json.dumps(runs, indent=1))
    if a.md:
        a.md.write_text(text + "\n")
    return 0 if len(runs) == len(variants) else 1


if __name__ == "__main__":
    sys.exit(main())
