#!/usr/bin/env python3
"""Solo latency of each Tonic service versus its SM quota.

For every service and every quota (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, read
once at start, so one service process per quota) it runs a fresh service
alone on a private simgpu device, sends closed-loop queries of one size and
records two figures per query:

  device  the service's own CUDA-event time from the H2D copy to the D2H copy.
          On simgpu this is modelled device time (SM quota, SMs a kernel's grid
          can fill, memory bandwidth, launch overhead), exact whatever the CPU
          speed: this is the curve.
  e2e     the client's end-to-end wall time.  On simgpu a kernel's wall time is
          max(CPU time of its twin, modelled time x SIMGPU_TIMESCALE); with the
          default timescale 0 nothing sleeps and e2e is the CPU twins' time,
          flat in the quota.  Twins compute at ~1-3 GFLOP/s against a modelled
          66 TFLOP/s, so modelled time would dominate only at timescales above
          ~1e5: too slow for the CNNs; try --timescale on dig and the word nets.

It prints both tables, the knee of each device curve (the smallest quota
within --knee-tol of the latency at the largest quota) and writes a PNG.

The default sizes and widths keep the CPU twins to about a second per query
(image nets batch several images so that their kernels have enough blocks
to need more than a few SMs; imc and face run at --width 0.25, their full
resolution); --full runs full Tonic widths (slow on simgpu).

  quota_curve.py                               # all six, quotas 10..100, PNG
  quota_curve.py --nets dig,imc --queries 5 --png /tmp/q.png
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import client  # noqa: E402  (bench/tonic/client.py, next to this file)

# per service: query size and service options for the curve (see the docstring)
SETTINGS: dict[str, tuple[int, list[str]]] = {
    "face": (8, ["--width", "0.25"]),
    "dig": (256, []),
    "imc": (64, ["--width", "0.125"]),
    "pos": (4096, []),
    "chk": (4096, []),
    "ner": (4096, []),
}
NETS = list(SETTINGS)


@dataclass
class Point:
    net: str
    quota: int
    size: int
    device_ms: float       # p50 of the queries' CUDA-event times
    e2e_ms: float          # p50 of the client's wall times
    queries: int


def service_env(quota: int, timescale: float, simdir: str) -> dict[str, str]:
    """A clean environment: a private simgpu device, this quota, no shim."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SIMGPU_", "COLOCATE_")) and k not in
           ("LD_PRELOAD", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}
    env.update(SIMGPU_DIR=simdir, SIMGPU_TIMESCALE=f"{timescale:g}",
               CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(quota))
    return env


def measure(net: str, quota: int, size: int, extra: list[str], args: argparse.Namespace) -> Point:
    """One fresh service at `quota`: a warm-up query, then args.queries measured ones."""
    tmp = tempfile.mkdtemp(prefix="tq-", dir="/tmp")
    sock = os.path.join(tmp, "s.sock")
    env = service_env(quota, args.timescale, os.path.join(tmp, "dev"))
    proc = client.start_service(net, sock, ["--max-size", str(size), *extra], [], args.device,
                                args.service, env)
    try:
        s = client.connect(sock)
        try:
            spec = client.LoadSpec(sizes=[size], queries=args.queries + 1)
            queries: list[client.Query] = []
            client.load(s, spec, random.Random(1), queries)
        finally:
            s.close()
    finally:
        out = client.stop_service(proc)
        shutil.rmtree(tmp, ignore_errors=True)
    done = [q for q in queries[1:] if q.status == 0]
    if len(done) != args.queries:
        raise RuntimeError(f"{net} at {quota}%: {len(done)} of {args.queries} answered\n{out}")
    return Point(net, quota, size, statistics.median(q.device_ms for q in done),
                 statistics.median(q.latency_ms for q in done), len(done))


def knee(points: list[Point], tol: float, key: str = "device_ms") -> int:
    """Smallest quota whose latency is within tol of the latency at the largest quota."""
    pts = sorted(points, key=lambda p: p.quota)
    best = getattr(pts[-1], key)
    return next(p.quota for p in pts if getattr(p, key) <= best * (1 + tol))


def table(points: list[Point], quotas: list[int], key: str, title: str, tol: float) -> str:
    head = f"{'net':5} {'size':>5} " + " ".join(f"{q:>8}%" for q in quotas) + "   knee"
    rows = [title, head]
    for net in dict.fromkeys(p.net for p in points):
        pts = {p.quota: p for p in points if p.net == net}
        cells = " ".join(f"{getattr(pts[q], key):9.3f}" for q in quotas)
        rows.append(f"{net:5} {pts[quotas[0]].size:>5} {cells}   {knee(list(pts.values()), tol, key):>3}%")
    return "\n".join(rows)


def plot(points: list[Point], quotas: list[int], path: str, tol: float, timescale: float) -> None:
    """Left: device time relative to the largest quota, knees starred.  Right:
    the client's e2e time likewise when a timescale makes it follow the model,
    else (timescale 0: e2e is CPU twin time) the absolute device times."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    right = ("e2e_ms", f"client end-to-end (wall, SIMGPU_TIMESCALE={timescale:g})", True) \
        if timescale > 0 else ("device_ms", "device time per query (modelled), ms", False)
    for ax, (key, what, norm) in zip(axes, [("device_ms", "device time (CUDA events, modelled)",
                                             True), right]):
        for net in dict.fromkeys(p.net for p in points):
            pts = sorted((p for p in points if p.net == net), key=lambda p: p.quota)
            base = getattr(pts[-1], key) if norm else 1.0
            ys = [getattr(p, key) / base for p in pts]
            line, = ax.plot([p.quota for p in pts], ys, marker="o", label=f"{net} (x{pts[0].size})")
            k = knee(pts, tol, key)
            ax.plot([k], [ys[[p.quota for p in pts].index(k)]], marker="*", markersize=16,
                    color=line.get_color())
        ax.set_xlabel("SM quota (%)")
        ax.set_ylabel(f"latency / latency at {quotas[-1]}%" if norm else "ms")
        if not norm:
            ax.set_yscale("log")
        ax.set_title(what)
        ax.set_xticks(quotas)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Tonic services, solo latency vs SM quota on simgpu "
                 f"(star: knee, within {tol:.0%} of {quotas[-1]}%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nets", default=",".join(NETS), help="comma-separated services")
    p.add_argument("--quotas", default="10,20,30,40,50,60,70,80,90,100", help="SM percentages")
    p.add_argument("--queries", type=int, default=3, help="measured queries per point (after a warm-up)")
    p.add_argument("--size", type=int, default=0, help="query size for every net (default: per net)")
    p.add_argument("--full", action="store_true", help="full Tonic widths (slow on simgpu)")
    p.add_argument("--timescale", type=float, default=0.0, help="SIMGPU_TIMESCALE of the services")
    p.add_argument("--knee-tol", type=float, default=0.10, help="knee: within this of the best")
    p.add_argument("--device", choices=["sim", "gpu"], default="sim",
                   help="gpu: NVIDIA's libraries; quotas need an MPS daemon running")
    p.add_argument("--service", default=str(client.SERVICE), help="the service binary")
    p.add_argument("--png", default="bench/out/tonic_quota_curve.png")
    p.add_argument("--json", default="", help="also write the points here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    nets = args.nets.split(",")
    quotas = sorted(int(q) for q in args.quotas.split(","))
    bad = [n for n in nets if n not in SETTINGS]
    if bad or not quotas or not all(1 <= q <= 100 for q in quotas) or args.queries < 1:
        parser().error(f"unknown net {bad[0]}" if bad else "quotas in 1..100, --queries >= 1")
    points: list[Point] = []
    t0 = time.monotonic()
    for net in nets:
        size, extra = SETTINGS[net]
        size = args.size or size
        extra = [] if args.full else extra
        for q in quotas:
            pt = measure(net, q, size, extra, args)
            points.append(pt)
            print(f"  {net:5} {q:3}%  device {pt.device_ms:9.3f} ms  e2e {pt.e2e_ms:9.3f} ms",
                  file=sys.stderr, flush=True)
    print(table(points, quotas, "device_ms", "device time per query, ms (CUDA events; modelled "
                                              "on simgpu), p50", args.knee_tol))
    print()
    print(table(points, quotas, "e2e_ms", f"end-to-end per query, ms (client wall clock, "
                                           f"SIMGPU_TIMESCALE={args.timescale:g}), p50",
                args.knee_tol))
    print(f"\n{len(points)} points in {time.monotonic() - t0:.0f} s; widths: "
          + ("full" if args.full else ", ".join(f"{n} {' '.join(SETTINGS[n][1]) or 'full'}" for n in nets)))
    if args.png:
        Path(args.png).parent.mkdir(parents=True, exist_ok=True)
        plot(points, quotas, args.png, args.knee_tol, args.timescale)
        print(f"wrote {args.png}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(p) for p in points], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
