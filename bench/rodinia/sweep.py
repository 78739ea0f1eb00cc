#!/usr/bin/env python3
"""Sweep the SM quota for every built Rodinia app on simgpu, solo.

Runs each app in bench/rodinia/NAME that has a built bench/bin/NAME on the
simulated device (shim/lib/simgpu) at CUDA_MPS_ACTIVE_THREAD_PERCENTAGE =
10, 20, ..., 100, and prints, per app and quota, the modelled kernel time
(the sum over the app's kernels of SIMGPU_REPORT's modelled_us, launch
overhead included) and its ratio to the time at 100 %, next to the app's
C-Laius class.  A compute-intensive app keeps getting faster up to 100 %;
a memory-intensive one flattens once its SMs saturate the device's memory
bandwidth (the "knee": the lowest quota within 5 % of the 100 % time).

Modelled time does not depend on the machine running the sweep: simgpu runs
with SIMGPU_TIMESCALE=0 (never sleeps) and its device model is
deterministic, so one run per quota is the figure (no medians needed); the
wall time is the host twins' CPU time.  Inputs: each app's defaults
(Rodinia's usual inputs), except where SWEEP_ARGS gives a smaller one that
still fills the device (myocyte: 0.05 ms instead of 100 ms of simulated
time); --args overrides either.

Examples:
  .venv/bin/python bench/rodinia/sweep.py
  .venv/bin/python bench/rodinia/sweep.py --apps lud,lavamd --quotas 10,30,100
  .venv/bin/python bench/rodinia/sweep.py --args "lavamd=--boxes 12 --par 32" --png sweep.png
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RODINIA = ROOT / "bench" / "rodinia"
BIN = ROOT / "bench" / "bin"
SIMGPU_LIB = ROOT / "shim" / "lib" / "simgpu"

# C-Laius's classes of the Rodinia apps (compute- or memory-intensive)
CLASSES = {
    "hotspot": "compute", "lud": "compute", "myocyte": "compute",
    "bfs": "memory", "btree": "memory", "nw": "memory", "pathfinder": "memory",
    "lavamd": "memory",
}
# inputs that fill the simulated device but keep the twins' CPU time short
SWEEP_ARGS = {
    "myocyte": "--cells 270336 --time 0.05 --launch-ms 0.01",
}
KNEE_TOL = 1.05


def built_apps() -> list[str]:
    """Every bench/rodinia/NAME with a built bench/bin/NAME."""
    return sorted(d.name for d in RODINIA.iterdir()
                  if d.is_dir() and (BIN / d.name).is_file() and os.access(BIN / d.name, os.X_OK))


def sim_env(simdir: str, report: Path, quota: int, launch_us: float | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SIMGPU_", "COLOCATE_"))
           and k not in ("LD_PRELOAD", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [str(SIMGPU_LIB)] + [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    env.update(SIMGPU_DIR=simdir, SIMGPU_TIMESCALE="0", SIMGPU_REPORT=str(report),
               CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(quota))
    if launch_us is not None:
        env["SIMGPU_LAUNCH_US"] = repr(launch_us)
    return env


def run_once(app: str, args: list[str], quota: int, launch_us: float | None,
             timeout: float) -> tuple[float, bool, float]:
    """(modelled kernel time in ms, every kernel had a twin, wall seconds) of one solo run."""
    simdir = tempfile.mkdtemp(prefix="simgpu-sweep-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    try:
        report = Path(simdir) / "report.jsonl"
        t0 = time.monotonic()
        res = subprocess.run([str(BIN / app), *args], env=sim_env(simdir, report, quota, launch_us),
                             capture_output=True, text=True, timeout=timeout)
        wall = time.monotonic() - t0
        if res.returncode != 0:
            raise RuntimeError(f"{app} {' '.join(args)} at {quota} % exited {res.returncode}:\n"
                               f"{res.stdout[-2000:]}{res.stderr[-2000:]}")
        rows = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
        if not rows:
            raise RuntimeError(f"{app}: simgpu reported no kernels (is {SIMGPU_LIB} built?)")
        return sum(r["modelled_us"] for r in rows) / 1e3, all(r["twin"] for r in rows), wall
    finally:
        shutil.rmtree(simdir, ignore_errors=True)


def knee(times: dict[int, float]) -> int:
    """Lowest quota whose time is within KNEE_TOL of the time at the highest quota."""
    top = times[max(times)]
    return min(q for q, t in times.items() if t <= KNEE_TOL * top)


def print_table(results: dict[str, dict[int, float]], notes: dict[str, str], quotas: list[int]) -> None:
    head = f"{'app':<11} {'class':<8} {'':<6}" + "".join(f"{q:>8}%" for q in quotas) + f"{'knee':>7}"
    print(head)
    print("-" * len(head))
    for app, times in results.items():
        top = times[max(quotas)]
        cls = CLASSES.get(app, "?")
        print(f"{app:<11} {cls:<8} {'ms':<6}" + "".join(f"{times[q]:>9.3f}" for q in quotas)
              + f"{knee(times):>6}%")
        print(f"{'':<11} {'':<8} {'ratio':<6}" + "".join(f"{times[q] / top:>9.2f}" for q in quotas))
        if notes.get(app):
            print(f"{'':<11} {notes[app]}")


def plot(results: dict[str, dict[int, float]], quotas: list[int], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for app, times in results.items():
        cls = CLASSES.get(app, "?")
        ax.plot(quotas, [times[q] / times[max(quotas)] for q in quotas], marker="o",
                linestyle="-" if cls == "compute" else "--", label=f"{app} ({cls})")
    ax.set_xlabel("SM quota (%)")
    ax.set_ylabel(f"modelled kernel time / time at {max(quotas)} %")
    ax.set_yscale("log")
    ax.set_title("Rodinia apps on simgpu, solo: solid compute-, dashed memory-intensive")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--apps", help="comma-separated apps (default: every built one)")
    p.add_argument("--quotas", default="10,20,30,40,50,60,70,80,90,100",
                   help="comma-separated SM quotas in %% (default 10..100 by 10)")
    p.add_argument("--args", action="append", default=[], metavar="APP=ARGS",
                   help="arguments for APP instead of its sweep input (repeatable)")
    p.add_argument("--launch-us", type=float, default=None,
                   help="SIMGPU_LAUNCH_US, the fixed cost of a launch (default simgpu's, 3)")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run (default 600)")
    p.add_argument("--png", metavar="FILE", help="also plot time/time(100 %%) per app to FILE")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    apps = built_apps()
    if opts.apps:
        want = [a.strip() for a in opts.apps.split(",") if a.strip()]
        missing = [a for a in want if a not in apps]
        if missing:
            print(f"not built or not a Rodinia app: {', '.join(missing)} (built: {', '.join(apps)})",
                  file=sys.stderr)
            return 2
        apps = want
    if not apps:
        print("no Rodinia app is built: run `make build`", file=sys.stderr)
        return 2
    quotas = sorted({int(q) for q in opts.quotas.split(",")})
    if not quotas or not all(1 <= q <= 100 for q in quotas):
        print("--quotas must be integers in 1..100", file=sys.stderr)
        return 2
    app_args = dict(SWEEP_ARGS)
    for item in opts.args:
        name, sep, rest = item.partition("=")
        if not sep:
            print(f"--args wants APP=ARGS, not {item!r}", file=sys.stderr)
            return 2
        app_args[name] = rest

    results: dict[str, dict[int, float]] = {}
    notes: dict[str, str] = {}
    for app in apps:
        args = shlex.split(app_args.get(app, ""))
        times, twins, wall = {}, True, 0.0
        for q in quotas:
            times[q], ok, w = run_once(app, args, q, opts.launch_us, opts.timeout)
            twins, wall = twins and ok, wall + w
        results[app] = times
        notes[app] = (f"args: {' '.join(args) or '(defaults)'}; wall {wall:.1f} s for {len(quotas)} runs"
                      + ("" if twins else "; SOME KERNELS HAD NO TWIN"))
        print(f"# {app}: done ({wall:.1f} s)", file=sys.stderr, flush=True)
    print_table(results, notes, quotas)
    if opts.png:
        plot(results, quotas, opts.png)
        print(f"plot written to {opts.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
