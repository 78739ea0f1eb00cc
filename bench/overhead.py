"""Interception overhead: launchloop with and without libcolocate.so.

    python bench/overhead.py [--launches N] [--reps K] [--json] [--real-gpu]

Runs bench/bin/launchloop K times without and K times with
``LD_PRELOAD=shim/lib/libcolocate.so``, alternating (without, with, without,
with, ...), and reports the median launches/s of each, their ratio
(with / without) and the time the shim adds per launch.

By default the program runs on simgpu (``LD_LIBRARY_PATH=shim/lib/simgpu``,
``SIMGPU_TIMESCALE=0`` so kernels take no simulated time, a fresh
``SIMGPU_DIR`` per run).  The shim gets ``COLOCATE_QUIET=1`` and an empty
``COLOCATE_RUNTIME_DIR``, so it finds no controller and measures its native
fast path.  ``--real-gpu`` leaves the real libcudart in place (GPU machines).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from shim.paths import LIBCOLOCATE, SIMGPU_CUDART, SIMGPU_DIR  # noqa: E402

LAUNCHLOOP = REPO / "bench" / "bin" / "launchloop"
_LINE = re.compile(r"^LAUNCHLOOP (.*)$", re.M)


class RunError(RuntimeError):
    pass


def missing_files(real_gpu: bool) -> list[Path]:
    need = [LAUNCHLOOP, LIBCOLOCATE]
    if not real_gpu:
        need.append(SIMGPU_CUDART)
    return [p for p in need if not p.exists()]


def _env(with_shim: bool, real_gpu: bool, simgpu_dir: str, runtime_dir: str) -> dict:
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if not real_gpu:
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = str(SIMGPU_DIR) + (":" + old if old else "")
        env["SIMGPU_TIMESCALE"] = "0"
        env["SIMGPU_DIR"] = simgpu_dir
    env["COLOCATE_QUIET"] = "1"
    env["COLOCATE_RUNTIME_DIR"] = runtime_dir
    if with_shim:
        env["LD_PRELOAD"] = str(LIBCOLOCATE)
    return env


def parse_launchloop(out: str) -> dict:
    """The key=value pairs of the LAUNCHLOOP line, as floats."""
    m = _LINE.search(out)
    if not m:
        raise RunError("no LAUNCHLOOP line in the output")
    vals = {}
    for item in m.group(1).split():
        k, _, v = item.partition("=")
        try:
            vals[k] = float(v)
        except ValueError:
            pass
    for k in ("launches", "issue_s", "total_s", "launches_per_s"):
        if k not in vals:
            raise RunError(f"LAUNCHLOOP line lacks {k}: {m.group(0)!r}")
    return vals


def run_once(launches: int, with_shim: bool, real_gpu: bool, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="simgpu-") as sdir, \
            tempfile.TemporaryDirectory(prefix="colocate-rt-") as rdir:
        cmd = [str(LAUNCHLOOP), "--launches", str(launches)]
        try:
            p = subprocess.run(cmd, env=_env(with_shim, real_gpu, sdir, rdir), cwd=REPO,
                               capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RunError(f"{' '.join(cmd)} timed out after {timeout:.0f} s "
                           f"({'with' if with_shim else 'without'} shim)") from None
    tail = (p.stdout + p.stderr)[-2000:]
    if p.returncode != 0 or not re.search(r"^PASS launchloop\b", p.stdout, re.M):
        raise RunError(f"launchloop {'with' if with_shim else 'without'} shim exited "
                       f"{p.returncode}:\n{tail}")
    try:
        return parse_launchloop(p.stdout)
    except RunError as e:
        raise RunError(f"{e}\n{tail}") from None


def summarize(without: list[dict], with_: list[dict]) -> dict:
    def side(runs: list[dict]) -> dict:
        lps = [r["launches_per_s"] for r in runs]
        issue_ns = [r["issue_s"] * 1e9 / r["launches"] for r in runs]
        med = statistics.median(lps)
        return {
            "launches_per_s": lps,
            "median_launches_per_s": med,
            "min_launches_per_s": min(lps),
            "max_launches_per_s": max(lps),
            "ns_per_launch": 1e9 / med if med > 0 else float("inf"),
            "median_issue_ns_per_launch": statistics.median(issue_ns),
        }

    a, b = side(without), side(with_)
    ratio = b["median_launches_per_s"] / a["median_launches_per_s"] \
        if a["median_launches_per_s"] > 0 else float("nan")
    return {
        "without": a,
        "with": b,
        "ratio": ratio,
        "added_ns_per_launch": b["ns_per_launch"] - a["ns_per_launch"],
        "added_issue_ns_per_launch": b["median_issue_ns_per_launch"]
        - a["median_issue_ns_per_launch"],
    }


def print_table(res: dict) -> None:
    def m(x: float) -> str:
        return f"{x / 1e6:,.3f} M"

    w, s = res["without"], res["with"]
    rows = [
        ("median launches/s", m(w["median_launches_per_s"]), m(s["median_launches_per_s"])),
        ("min .. max launches/s",
         f"{w['min_launches_per_s'] / 1e6:,.3f} .. {m(w['max_launches_per_s'])}",
         f"{s['min_launches_per_s'] / 1e6:,.3f} .. {m(s['max_launches_per_s'])}"),
        ("ns/launch (total)", f"{w['ns_per_launch']:.1f}", f"{s['ns_per_launch']:.1f}"),
        ("ns/launch (issue loop)", f"{w['median_issue_ns_per_launch']:.1f}",
         f"{s['median_issue_ns_per_launch']:.1f}"),
    ]
    title = f"launchloop on {res['device']}, {res['launches']} launches, {res['reps']} runs/side"
    footer = (f"with/without = {res['ratio']:.3f}, +{res['added_ns_per_launch']:.1f} ns/launch "
              f"(issue loop +{res['added_issue_ns_per_launch']:.1f} ns)")
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print(title)
        print(f"{'':28s} {'without shim':>24s} {'with shim':>24s}")
        for r in rows:
            print(f"{r[0]:28s} {r[1]:>24s} {r[2]:>24s}")
        print(footer)
        return
    t = Table(title=title, caption=footer)
    t.add_column("")
    t.add_column("without shim", justify="right")
    t.add_column("with libcolocate.so", justify="right")
    for r in rows:
        t.add_row(*r)
    Console().print(t)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=200000)
    ap.add_argument("--reps", type=int, default=7, help="runs per side (default 7)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--real-gpu", action="store_true",
                    help="use the real libcudart and GPU instead of simgpu")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    args = ap.parse_args(argv)
    if args.launches < 1 or args.reps < 1:
        ap.error("--launches and --reps must be >= 1")

    missing = missing_files(args.real_gpu)
    if missing:
        msg = "missing: " + ", ".join(str(p.relative_to(REPO)) if p.is_relative_to(REPO)
                                      else str(p) for p in missing) + " -- run `make build`"
        if args.json:
            print(json.dumps({"error": msg}))
        print(msg, file=sys.stderr)
        return 2

    without: list[dict] = []
    with_: list[dict] = []
    try:
        for _ in range(args.reps):
            without.append(run_once(args.launches, False, args.real_gpu, args.timeout))
            with_.append(run_once(args.launches, True, args.real_gpu, args.timeout))
    except RunError as e:
        if args.json:
            print(json.dumps({"error": str(e)}))
        print(f"overhead: {e}", file=sys.stderr)
        return 1

    res = summarize(without, with_)
    res.update(launches=args.launches, reps=args.reps,
               device="real GPU" if args.real_gpu else "simgpu")
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
