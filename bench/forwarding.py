"""Launch forwarding: what a forwarded launch costs, how fast launches
stream to a worker, and how long a route change takes.

    python bench/forwarding.py [--device sim|cuda] [--n N] [--launches L] [--flips F] [--json]

--device cuda runs the same on the real GPU with the workers as MPS clients
and the apps' memory VMM-shared (COLOCATE_MEM=vmm), except the route-change
figure, whose probe times kernels through its simgpu twin; it has not been
run on a GPU yet.  What follows describes the default, simgpu.

Everything runs in a private runtime dir with a stand-in controller (it only
answers "register" and claims a control-block slot, so routes are written
directly, as the real controller would) and process-pool workers started
with the pool's contract.  simgpu runs at SIMGPU_TIMESCALE=0: kernels take
no modelled time, so the figures are the software path alone.

  latency     fwdprobe: N x (launch; cudaDeviceSynchronize), local and routed
              to a worker; per-iteration wall time, median and p99, and the
              difference (the added latency of a forwarded launch + sync)
  issue       launchloop with 3000 launches (fewer than the shim's window of
              4096 launches in flight): what a forwarded launch costs the
              app's thread, with no backpressure from the worker
  throughput  launchloop: L launches back to back then one sync, local and
              routed; launches/s over the whole run and issue ns per launch
              (the worker's pace once the window is full)
  switch      fwdprobe --interval-us 50 (--switch-interval-us) while the
              route flips between a 10 % and a 100 % worker every 50 ms; for
              each flip, time from the control-block write to the first probe
              kernel that ran in the new worker (the probe's twin records its
              pid and clock), and from that iteration's launch call to it;
              against the same probe run locally (launch call -> kernel)
  memory      mallocfree: one cudaMalloc + cudaFree pair of 1 MiB, median of
              5 runs of 300 pairs, with device memory native and shared with
              workers (COLOCATE_MEM=vmm), local and routed to a worker (vmm
              routed: each pair is two acknowledged messages with an fd to the
              worker over its mem socket); not a target, a cost
The rig (processpool/rig.py) is also what the forwarding tests drive.
"""
from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


from processpool.rig import BIN, WORKER, Rig  # noqa: E402
from shim import paths  # noqa: E402
from shim.launcher import cuda_usable as driver_present  # noqa: E402

# ---------------------------------------------------------------- measurements

def _kv(line_re: str, out: str) -> dict[str, float]:
    m = re.search(line_re, out, re.M)
    if not m:
        raise RuntimeError(f"no {line_re} in:\n{out}")
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


def probe_records(out: str) -> list[tuple[int, ...]]:
    """fwdprobe --dump's records: (i, t_launch_ns, t_done_ns, t_exec_ns, who)."""
    return [tuple(map(int, ln.split()[1:])) for ln in out.splitlines() if ln.startswith("I ")]


def timed_flips(flips: list[tuple[int, int, int]], recs: list[tuple[int, ...]]) -> list[tuple[int, int, int]]:
    """The route writes to time: not the first (the initial route), nor one
    made before the probe's first launch (it would time the app's start-up,
    its CUDA context made, not the route change: 100-200 ms on a GPU)."""
    start = recs[0][1] if recs else 0
    return [f for f in flips[1:] if f[2] >= start]


def first_after(flips: list[tuple[int, int, int]], recs: list[tuple[int, ...]], match, done: int = 3,
                launched_after: bool = False) -> tuple[list[float], list[float], list[tuple[int, int]]]:
    """For each timed route write (timed_flips), the first probe record i
    with match(route, i, rec) whose kernel is at or after the write's end
    (rec[done]: 3, when it ran, simgpu's twin; 2, when the host saw it done,
    a GPU) -- with launched_after, whose launch call also began after it --:
    write -> that kernel and its launch call -> that kernel, us, and the
    (t_set, i) pairs.  Timed from the end of the control-block write: the
    app cannot see a route before it."""
    total: list[float] = []
    boundary: list[float] = []
    hits: list[tuple[int, int]] = []
    for _t_begin, route, t_set in timed_flips(flips, recs):
        # the probe runs one iteration at a time: rec[done] grows with i
        for i in range(bisect.bisect_left(recs, t_set, key=lambda r: r[done]), len(recs)):
            rec = recs[i]
            if (not launched_after or rec[1] >= t_set) and match(route, i, rec):
                total.append((rec[done] - t_set) / 1e3)
                boundary.append((rec[done] - max(rec[1], t_set)) / 1e3)
                hits.append((t_set, i))
                break
    return total, boundary, hits


def switch_probe_args(flips_wanted: int, period: float, interval_us: int) -> list[str]:
    """fwdprobe's options for a run with flips_wanted route changes every
    period s: --seconds makes it long enough whatever an iteration costs (on
    simgpu back to back one is ~1.5 us, on an H100 ~12 us, with a 50 us pause
    ~110 us), --n is the room for records (capped: 2 M records are 32 MB
    on the device and a 100 MB dump; back to back on simgpu the cap ends a
    run after ~3 s, so fewer flips than asked are timed)."""
    seconds = math.ceil(flips_wanted * period) + 1
    n = min(2_000_000, int(seconds * 1e6 / max(interval_us, 1)) + 200)
    return ["--n", str(n), "--seconds", str(seconds), "--interval-us", str(interval_us), "--dump"]


def quantile(v: list[float], p: float) -> float:
    """Nearest rank (nan for none)."""
    v = sorted(v)
    return v[min(len(v) - 1, int(p * len(v)))] if v else float("nan")


def latency(rig: Rig, n: int) -> dict:
    res = {}
    for side, routes in (("local", None), ("forwarded", 2)):
        out, _, c = rig.run("fwdprobe", "--n", str(n), routes=routes)
        kv = _kv(r"^FWDPROBE (.*)$", out)
        res[side] = {"p50_us": kv["lat_us_p50"], "p99_us": kv["lat_us_p99"],
                     "mean_us": kv["lat_us_mean"], "forwarded": c["forwarded"]}
    res["added_p50_us"] = res["forwarded"]["p50_us"] - res["local"]["p50_us"]
    res["added_p99_us"] = res["forwarded"]["p99_us"] - res["local"]["p99_us"]
    return res


def issue(rig: Rig, reps: int = 5) -> dict:
    res = {}
    for side, routes in (("local", None), ("forwarded", 2)):
        ns = []
        for _ in range(reps):
            out, _, _ = rig.run("launchloop", "--launches", "3000", routes=routes)
            ns.append(_kv(r"^LAUNCHLOOP (.*)$", out)["issue_ns_per_launch"])
        res[side] = {"issue_ns_per_launch": statistics.median(ns)}
    return res


def throughput(rig: Rig, launches: int, reps: int = 3) -> dict:
    res = {}
    for side, routes in (("local", None), ("forwarded", 2)):
        runs = []
        for _ in range(reps):
            out, _, c = rig.run("launchloop", "--launches", str(launches), routes=routes)
            kv = _kv(r"^LAUNCHLOOP (.*)$", out)
            runs.append((kv["launches_per_s"], kv["issue_ns_per_launch"], c["forwarded"]))
        runs.sort()
        lps, issue, fwd = runs[len(runs) // 2]
        res[side] = {"launches_per_s": lps, "issue_ns_per_launch": issue, "forwarded": fwd}
    return res


def switching(rig: Rig, flips_wanted: int, period: float = 0.05, interval_us: int = 50) -> dict:
    """Route flips between the 10 % and 100 % workers under fwdprobe, which
    launches, syncs and sleeps interval_us.  A switch happens at the app's
    next launch, so the pause between launches is part of the first figure
    (about half an iteration on average) and none of the second.  The local
    baseline is the same probe unrouted: launch call -> kernel running."""
    pids = {w: p.pid for w, p in rig.workers.items()}
    flips: list[tuple[int, int, int]] = []
    out, _, c = rig.run("fwdprobe", *switch_probe_args(flips_wanted, period, interval_us),
                        routes=[1, 2], period=period, flips=flips)
    recs = probe_records(out)
    total, boundary, _ = first_after(flips, recs, lambda route, _i, rec: rec[4] == pids[route])
    out, _, _ = rig.run("fwdprobe", "--n", "2000", "--interval-us", str(interval_us), "--dump")
    local = [(t_exec - t_launch) / 1e3 for _, t_launch, _d, t_exec, _w in probe_records(out)]
    q = quantile
    return {"flips": len(total), "iterations": len(recs), "forwarded": c["forwarded"],
            "interval_us": interval_us,
            "to_first_kernel_us": {"p50": q(total, 0.5), "p99": q(total, 0.99),
                                   "mean": statistics.fmean(total) if total else float("nan")},
            "launch_call_to_kernel_us": {"p50": q(boundary, 0.5), "p99": q(boundary, 0.99)},
            "local_launch_call_to_kernel_us": {"p50": q(local, 0.5), "p99": q(local, 0.99)}}


def memory(rig: Rig, pairs: int = 300, reps: int = 5) -> dict:
    res = {}
    for mode in ("native", "vmm"):
        for side, routes in (("local", None), ("routed", 2)):
            us, fwd = [], 0
            for _ in range(reps):
                out, _, c = rig.run("mallocfree", "--n", str(pairs), routes=routes, COLOCATE_MEM=mode)
                us.append(_kv(r"^MALLOCFREE (.*)$", out)["us_per_pair"])
                fwd = c["forwarded"]
            res[f"{mode}_{side}"] = {"us_per_pair": statistics.median(us), "forwarded": fwd}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5000, help="latency iterations (default 5000)")
    ap.add_argument("--launches", type=int, default=200000, help="throughput launches (default 200000)")
    ap.add_argument("--flips", type=int, default=100, help="route changes to time (default 100)")
    ap.add_argument("--switch-interval-us", type=int, default=50,
                    help="pause of the switch probe between launch+sync iterations (default 50)")
    ap.add_argument("--device", choices=("sim", "cuda"), default="sim",
                    help="sim (default): simgpu at SIMGPU_TIMESCALE=0; cuda: the real GPU, workers "
                         "as MPS clients (a daemon is started under the rig's dir, or a running one "
                         "used), apps with COLOCATE_MEM=vmm; no switch figure there (its probe "
                         "times kernels through its simgpu twin)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.device == "cuda" and not driver_present():
        print("no NVIDIA driver: nothing measured (use --device sim)", file=sys.stderr)
        return 2
    for need in (WORKER, BIN / "fwdprobe", BIN / "launchloop", BIN / "mallocfree", paths.LIBCOLOCATE):
        if not need.exists():
            print(f"missing {need}; run `make build`", file=sys.stderr)
            return 2
    rig = Rig(device=a.device)
    try:
        rig.start_worker(1, 10)
        rig.start_worker(2, 100)
        res = {"device": "simgpu, SIMGPU_TIMESCALE=0" if a.device == "sim" else "cuda",
               "cpus": os.cpu_count(), "latency": latency(rig, a.n), "issue": issue(rig),
               "throughput": throughput(rig, a.launches),
               "switch": switching(rig, a.flips, interval_us=a.switch_interval_us)
               if a.device == "sim" else None,
               "memory": memory(rig)}
    finally:
        rig.close()
    # a routed side that ran locally (every HELLO refused, say) is no figure
    # of forwarding: say so rather than print it as one
    unforwarded = [name for name, side in (("latency", res["latency"]["forwarded"]),
                                           ("throughput", res["throughput"]["forwarded"]))
                   if side["forwarded"] == 0]
    if unforwarded:
        print(f"nothing was forwarded in the {' and '.join(unforwarded)} runs: no forwarding "
              "figures (see the workers' logs: rerun with a kept rig dir)", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    lat, iss, thr, sw = res["latency"], res["issue"], res["throughput"], res["switch"]
    print(f"launch + sync (fwdprobe, n={a.n}):   local p50 {lat['local']['p50_us']:.1f} us "
          f"p99 {lat['local']['p99_us']:.1f} us | forwarded p50 {lat['forwarded']['p50_us']:.1f} us "
          f"p99 {lat['forwarded']['p99_us']:.1f} us | added p50 {lat['added_p50_us']:+.1f} us "
          f"p99 {lat['added_p99_us']:+.1f} us")
    print(f"issue cost below the window (launchloop, 3000): local "
          f"{iss['local']['issue_ns_per_launch']:.0f} ns | forwarded "
          f"{iss['forwarded']['issue_ns_per_launch']:.0f} ns per launch")
    print(f"pipelined launches (launchloop, {a.launches}): local "
          f"{thr['local']['launches_per_s'] / 1e6:.3f} M/s ({thr['local']['issue_ns_per_launch']:.0f} ns issue) | "
          f"forwarded {thr['forwarded']['launches_per_s'] / 1e6:.3f} M/s "
          f"({thr['forwarded']['issue_ns_per_launch']:.0f} ns issue)")
    print(switch_line(sw))
    mem = res["memory"]
    print("cudaMalloc + cudaFree, 1 MiB (mallocfree, median of 5 x 300 pairs): " + " | ".join(
        f"{k.replace('_', ' ')} {v['us_per_pair']:.1f} us" for k, v in mem.items()))
    print_targets(lat, thr, sw, res["device"])
    return 0


def switch_line(sw: dict | None) -> str:
    if sw is None:
        return "route change -> first kernel in the new worker: not measured on cuda"
    return (f"route change -> first kernel in the new worker ({sw['flips']} flips, 10% <-> 100%, "
            f"probe pausing {sw['interval_us']} us): "
            f"p50 {sw['to_first_kernel_us']['p50']:.0f} us p99 {sw['to_first_kernel_us']['p99']:.0f} us; "
            f"from that launch call: p50 {sw['launch_call_to_kernel_us']['p50']:.0f} us "
            f"p99 {sw['launch_call_to_kernel_us']['p99']:.0f} us | local launch call -> kernel: "
            f"p50 {sw['local_launch_call_to_kernel_us']['p50']:.0f} us")


# the forwarding targets, on simgpu on the 2-core development machines
TARGETS = {"added_us": 20.0, "launches_per_s": 100_000.0, "switch_us": 200.0}


def print_targets(lat: dict, thr: dict, sw: dict | None, device: str) -> None:
    """The three figures next to their targets, each met or missed."""
    from rich.console import Console
    from rich.table import Table

    rows = [
        ("added latency of a forwarded launch, median", lat["added_p50_us"], TARGETS["added_us"],
         "us", lambda v, t: v <= t),
        ("forwarded launches/s, pipelined", thr["forwarded"]["launches_per_s"],
         TARGETS["launches_per_s"], "/s", lambda v, t: v >= t),
    ]
    if sw is not None:
        rows.append(("route change -> first launch at the new quota, median",
                     sw["to_first_kernel_us"]["p50"], TARGETS["switch_us"], "us", lambda v, t: v <= t))
    t = Table(title=f"forwarding targets ({device}; the targets are for simgpu on the 2-core machines)")
    for col in ("figure", "measured", "target", ""):
        t.add_column(col, justify="left" if col == "figure" else "right")
    for name, v, tgt, unit, ok in rows:
        cmp = "<=" if unit == "us" else ">="
        t.add_row(name, f"{v:,.1f} {unit}", f"{cmp} {tgt:,.0f} {unit}",
                  "met" if ok(v, tgt) else "[bold red]missed[/]")
    Console().print(t)


if __name__ == "__main__":
    sys.exit(main())
