"""Interception overhead: launchloop with and without libcolocate.so.

    python bench/overhead.py [--launches N] [--reps K] [--json] [--real-gpu]
                             [--baseline-lib PATH]

Runs bench/bin/launchloop K times on each of three sides, interleaved:
  without   no shim
  with      LD_PRELOAD=shim/lib/libcolocate.so, no controller (the shim's
            native fallback: counting into a private line)
  registered  the same, registered with a running controller (counting into
            its slot of the shared control block: the production path)
and reports the median launches/s of each, the ratio to `without` and the
time the shim adds per launch.  --baseline-lib PATH adds a fourth side,
`baseline`: registered like the third, with another build of libcolocate.so
(e.g. the commit before a change: `git worktree add /tmp/base REF && (cd
/tmp/base && python -c 'from shim import build; build.build_native()')`,
then --baseline-lib /tmp/base/shim/lib/libcolocate.so), so a change to the
launch path is judged against its predecessor in the same run.

By default the program runs on simgpu (``LD_LIBRARY_PATH=shim/lib/simgpu``,
``SIMGPU_TIMESCALE=0`` so kernels take no simulated time, a fresh
``SIMGPU_DIR`` per run).  ``--real-gpu`` leaves the real libcudart in place
(GPU machines).
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
import time
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


def _env(with_shim: bool, real_gpu: bool, simgpu_dir: str, runtime_dir: str,
         lib: Path | None = None) -> dict:
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
        env["LD_PRELOAD"] = str(lib or LIBCOLOCATE)
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


def run_once(launches: int, with_shim: bool, real_gpu: bool, timeout: float,
             runtime_dir: str | None = None, lib: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="simgpu-") as sdir, \
            tempfile.TemporaryDirectory(prefix="colocate-rt-") as empty:
        rdir = runtime_dir or empty
        cmd = [str(LAUNCHLOOP), "--launches", str(launches)]
        try:
            p = subprocess.run(cmd, env=_env(with_shim, real_gpu, sdir, rdir, lib), cwd=REPO,
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


def summarize(runs: dict[str, list[dict]]) -> dict:
    """Per side its figures, plus ratio and added ns against `without`."""
    sides = {name: side(r) for name, r in runs.items()}
    base = sides["without"]
    for s in sides.values():
        s["ratio"] = s["median_launches_per_s"] / base["median_launches_per_s"]
        s["added_ns_per_launch"] = s["ns_per_launch"] - base["ns_per_launch"]
        s["added_issue_ns_per_launch"] = (s["median_issue_ns_per_launch"]
                                          - base["median_issue_ns_per_launch"])
    return {"sides": sides}


def print_table(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    sides = res["sides"]
    t = Table(title=f"launchloop on {res['device']}, {res['launches']} launches, "
                    f"{res['reps']} runs per side (medians)")
    t.add_column("")
    for name in sides:
        t.add_column(name, justify="right")
    rows = [
        ("launches/s", lambda s: f"{s['median_launches_per_s'] / 1e6:,.3f} M"),
        ("min .. max", lambda s: f"{s['min_launches_per_s'] / 1e6:,.2f} .. "
                                 f"{s['max_launches_per_s'] / 1e6:,.2f} M"),
        ("ns/launch (issue loop)", lambda s: f"{s['median_issue_ns_per_launch']:.1f}"),
        ("ratio to without", lambda s: f"{s['ratio']:.3f}"),
        ("added ns/launch (issue)", lambda s: f"{s['added_issue_ns_per_launch']:+.1f}"),
    ]
    for label, fmt in rows:
        t.add_row(label, *(fmt(s) for s in sides.values()))
    Console().print(t)


def start_controller(rdir: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "serve", "--runtime-dir",
                             rdir, "--device", "sim", "--pool", "none"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(200):
        if subprocess.run([sys.executable, "-m", "controlplane.cli", "ping", "--runtime-dir", rdir],
                          cwd=REPO, capture_output=True).returncode == 0:
            return proc
        time.sleep(0.05)
    proc.kill()
    raise RunError("controller did not start")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=1000000, help="launches per run (default 1000000)")
    ap.add_argument("--reps", type=int, default=7, help="runs per side (default 7)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    ap.add_argument("--real-gpu", action="store_true",
                    help="use the real libcudart and GPU instead of simgpu")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    ap.add_argument("--baseline-lib", type=Path, metavar="PATH",
                    help="another libcolocate.so, run registered as a fourth side (`baseline`)")
    args = ap.parse_args(argv)
    if args.baseline_lib is not None and not args.baseline_lib.is_file():
        ap.error(f"--baseline-lib {args.baseline_lib}: no such file")
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

    runs: dict[str, list[dict]] = {"without": [], "with": [], "registered": []}
    if args.baseline_lib is not None:
        runs["baseline"] = []
    rdir = tempfile.mkdtemp(prefix="cl-ovh-", dir="/tmp")
    ctl = None
    try:
        ctl = start_controller(rdir)
        for _ in range(args.reps):
            runs["without"].append(run_once(args.launches, False, args.real_gpu, args.timeout))
            runs["with"].append(run_once(args.launches, True, args.real_gpu, args.timeout))
            runs["registered"].append(run_once(args.launches, True, args.real_gpu, args.timeout,
                                               runtime_dir=rdir))
            if args.baseline_lib is not None:
                runs["baseline"].append(run_once(args.launches, True, args.real_gpu, args.timeout,
                                                 runtime_dir=rdir, lib=args.baseline_lib.resolve()))
    except RunError as e:
        if args.json:
            print(json.dumps({"error": str(e)}))
        print(f"overhead: {e}", file=sys.stderr)
        return 1
    finally:
        if ctl:
            ctl.terminate()
            ctl.wait()

    res = summarize(runs)
    res.update(launches=args.launches, reps=args.reps,
               device="real GPU" if args.real_gpu else "simgpu")
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
