"""SM partitions in the app (route kind partition, shim/shim_part.c) beside the
process pool (route kind pool, launch forwarding), measured in one run.

    python bench/partitions.py [--n N] [--flips F] [--json] [--device sim|cuda]

One stand-in controller (processpool/rig.py: routes are written straight into
the app's control-block slot), a 10 % and a 100 % pool worker, simgpu at
SIMGPU_TIMESCALE=0 (kernels take no modelled time: the figures are the
software path alone), on this machine's cores.

  issue    launchloop, 3000 launches back to back then one sync (median of
           5 runs): what a launch costs the app's thread -- local, on a
           64-SM partition, forwarded to the 100 % worker
  latency  fwdprobe: N x (launch; cudaDeviceSynchronize), median and p99 per
           iteration, the same three ways
  switch   fwdprobe back to back (--switch-interval-us, default 0; a pause
           adds the wait for the app's next launch to every figure) while
           the route flips every 50 ms, written by a C loop
           (ControlBlock.flip_routes) that stamps each write's end:
           partition  between 10 % (16 SMs) and 90 % (120 SMs); for each
                      flip, time from the control-block write to the first
                      probe kernel that ran at the new SM count (simgpu's
                      launch log says each kernel's SM cap; the probe's twin
                      says when it ran)
           pool       between the 10 % and the 100 % worker (bench/
                      forwarding.py's figure: the first kernel that ran in
                      the new worker)
           and from that iteration's launch call to the kernel.
           partition  again with simgpu in real time (SIMGPU_TIMESCALE=1),
                      where the probe's twin records its kernel's start on
                      simgpu's device clock (simgpu_globaltimer: the modelled
                      start, as %globaltimer on a GPU) instead of when its
                      stream thread ran it
  host     bench/bin/hostwake: how long this machine takes to run a thread
           that slept 50 ms, on the waker's CPU and on another.  simgpu runs
           each stream on a thread that sleeps when idle, so the first
           kernel on a partition not used since the last flip waits for one
           wake-up; a GPU starts it without one.  On the 2-vCPU dev guest
           (KVM) a wake onto the other vCPU takes ~50 us and one on the
           waker's ~10 us; in the switch runs the new stream thread waited
           ~35 us (perf sched), most of the partition switch figure there.

--device cuda (a GPU with green contexts; no MPS daemon, no pool): issue and
latency local and on a partition, and switch between two DISJOINT partitions
(10 % from SM 0 and 50 % from 50 %, to the last group): each partition's SM ids come from a
steady run on it (fwdprobe's kernel stores %smid), and a flip's first kernel
at the new quota is the first whose SM id is the new partition's; its time is
taken when the host saw it done (end of the sync), an upper bound of when it
started.  A tighter one: the probe kernel's %globaltimer plus the offset
between the GPU's clock and the host's, which every record bounds (its kernel
started after its launch call began and before the host saw it done;
start_bracket), so the start is known to within the quickest launch + sync
near it; on simgpu, where the start is known, the sim run checks that the
bounds hold it (bracket_check).

Targets (issue 16): a launch on a partition costs at most 1 us more than a
local one; a route change reaches the first kernel at the new quota in at most
20 us (median).  On a GPU the same path adds green-context streams and events
whose costs simgpu does not model; bench/gpu/green_probe.cu (switch) times
them on the device alone.
"""
from __future__ import annotations

import argparse
import bisect
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.forwarding import _kv, first_after, probe_records, switch_probe_args, switching  # noqa: E402
from bench.forwarding import quantile as q  # noqa: E402
from processpool.rig import BIN, WORKER, Rig  # noqa: E402
from shim import paths  # noqa: E402
from shim.ctlblock import ROUTE_PART  # noqa: E402

SIDES = {"local": None, "partition": ROUTE_PART | 50, "pool": 2}
GPU_SIDES = {"local": None, "partition": ROUTE_PART | 50}
TARGETS = {"added_issue_ns": 1000.0, "switch_us": 20.0}


def host_wake() -> dict:
    """This machine's wake-up of a thread asleep for 50 ms, as the stream
    thread of a partition not used since the last flip is at a switch
    (bench/micro/hostwake.c), p50 us: where the scheduler puts it (on this
    guest, the waker's CPU) and on another CPU (--other-cpu).  simgpu's
    first kernel on that partition waits for one; a GPU's does not."""
    res = {}
    for key, extra in (("same_cpu_us", []), ("other_cpu_us", ["--other-cpu"])):
        r = subprocess.run([str(BIN / "hostwake"), "--n", "100", "--idle-us", "50000", *extra],
                           capture_output=True, text=True)
        res[key] = _kv(r"^HOSTWAKE (.*)$", r.stdout)["p50_us"] if r.returncode == 0 else None
    return res


def issue(rig: Rig, reps: int = 5, sides: dict = SIDES) -> dict:
    res = {}
    for side, routes in sides.items():
        ns = [_kv(r"^LAUNCHLOOP (.*)$", rig.run("launchloop", "--launches", "3000", routes=routes)[0])
              ["issue_ns_per_launch"] for _ in range(reps)]
        res[side] = statistics.median(ns)
    return res


def latency(rig: Rig, n: int, sides: dict = SIDES) -> dict:
    res = {}
    for side, routes in sides.items():
        kv = _kv(r"^FWDPROBE (.*)$", rig.run("fwdprobe", "--n", str(n), routes=routes)[0])
        res[side] = {"p50_us": kv["lat_us_p50"], "p99_us": kv["lat_us_p99"]}
    return res


def start_bracket(recs: list[tuple[int, ...]], i: int, window_ns: int = 20_000_000,
                  step_ns: int = 0) -> tuple[int, int] | None:
    """When probe kernel i started, in the host's CLOCK_MONOTONIC ns, as
    (earliest, latest).  Its record holds the device's time (on a GPU
    %globaltimer, whose zero the host does not know) at the start; every
    record bounds the offset between the two clocks, since its kernel
    started after its launch call began and before the host saw it done:
    offset in [t_launch - g, t_done - g].  Intersected over the records
    within window_ns of record i (the clocks may drift apart over a run; 10
    ppm is 0.2 us in 20 ms), the bounds are as tight as the quickest launch
    and the quickest sync of the window.  It takes the device clock to count
    ns at the host's rate; step_ns is how coarsely it is updated (every us
    on some GPUs), which widens both bounds.  None where the bounds cross (a
    device clock that jumped)."""
    t = recs[i][1]
    lo, hi = -(1 << 62), 1 << 62
    for j in range(bisect.bisect_left(recs, t - window_ns, key=lambda r: r[1]), len(recs)):
        _, t_launch, t_done, g, _who = recs[j]
        if t_launch > t + window_ns:
            break
        lo, hi = max(lo, t_launch - g), min(hi, t_done - g)
    return (recs[i][3] + lo - step_ns, recs[i][3] + hi + step_ns) if lo <= hi else None


# %globaltimer's update step assumed on a GPU: 1 us, the coarsest reported
GPU_TIMER_STEP_NS = 1000


def started_us(recs: list[tuple[int, ...]], hits: list[tuple[int, int]], step_ns: int = GPU_TIMER_STEP_NS) -> dict:
    """Route write -> the first kernel at the new quota *started*, bounded
    (start_bracket), medians in us: the median of the latest bounds is an
    upper bound of the true median."""
    b = [(br[0] - t_set, br[1] - t_set) for t_set, i in hits if (br := start_bracket(recs, i, step_ns=step_ns))]
    return {"p50_latest": q([x[1] / 1e3 for x in b], 0.5), "p50_earliest": q([x[0] / 1e3 for x in b], 0.5),
            "bracketed": len(b), "of": len(hits)}


def bracket_check(recs: list[tuple[int, ...]], hits: list[tuple[int, int]]) -> dict:
    """start_bracket where the start is known (simgpu: the twin's record is
    the host's clock, at timescale 0 when it ran, at 1 the modelled start), on
    a device clock made up from it -- 5 s off and 20 ppm
    fast, as a GPU's might be -- so that the bounds must undo both: how many
    brackets hold the start, and their median width."""
    t0 = recs[0][1] if recs else 0
    dev = [(i, tl, td, x - 5_000_000_000 + (x - t0) // 50_000, w) for i, tl, td, x, w in recs]
    b = [(br, recs[i][3]) for _t, i in hits if (br := start_bracket(dev, i))]
    return {"hold": sum(lo <= x <= hi for (lo, hi), x in b), "of": len(hits),
            "width_us_p50": q([(hi - lo) / 1e3 for (lo, hi), _x in b], 0.5)}


def noop_control(rig: Rig, route: int, flips_wanted: int, period: float, interval_us: int, done: int = 3,
                 **env: str) -> dict:
    """The switch figures' control, in the same run: the route written again
    and again with the same partition (each write a new route epoch, which
    the shim acts on at the next launch, as for a real change), timed to the
    first kernel launched after the write.  What it measures is what any
    route write costs the probe here -- the wait for its next launch, the
    flipper waking for its write on a machine with few cores, the shim's route
    check -- and a real switch's figure less this one is what moving to
    another partition adds.  done: which probe record field is "the kernel"
    (3: when it ran, simgpu's twin; 2: when the host saw it done, a GPU);
    env: as the switch's run had it (simgpu's launch log costs each launch)."""
    flips: list[tuple[int, int, int]] = []
    recs = probe_records(rig.run("fwdprobe", *switch_probe_args(flips_wanted, period, interval_us),
                                 routes=[route, route], period=period, flips=flips, **env)[0])
    total, boundary, hits = first_after(flips, recs, lambda _r, _i, _rec: True, done, launched_after=True)
    return {"writes": len(total), "to_first_kernel_us": {"p50": q(total, 0.5), "p99": q(total, 0.99)},
            "launch_call_to_kernel_us": {"p50": q(boundary, 0.5), "p99": q(boundary, 0.99)},
            "to_first_kernel_started_us": started_us(recs, hits)}


def partition_switching(rig: Rig, flips_wanted: int, period: float = 0.05, interval_us: int = 50,
                        **env: str) -> dict:
    """fwdprobe launches one kernel per iteration, so its records and the
    launch log's rows (by seq) are the same kernels, in order.  env: for
    every run (device_clock_env: on simgpu's device clock)."""
    sms_of = {ROUTE_PART | 10: 16, ROUTE_PART | 90: 120}
    flips: list[tuple[int, int, int]] = []
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "launches.jsonl"
        out, _, _ = rig.run("fwdprobe", *switch_probe_args(flips_wanted, period, interval_us),
                            routes=list(sms_of), period=period, flips=flips, SIMGPU_LAUNCH_LOG=str(log), **env)
        rows = sorted((json.loads(ln) for ln in log.read_text().splitlines()), key=lambda r: r["seq"])
    recs = probe_records(out)
    if len(rows) != len(recs):
        raise RuntimeError(f"{len(recs)} probe records but {len(rows)} launch-log rows")
    def at_new(route: int, i: int, _rec: tuple[int, ...]) -> bool:
        return rows[i]["quota_sms"] == sms_of[route]

    total, boundary, hits = first_after(flips, recs, at_new)
    # timed as the control is: the first kernel *launched* after the write
    # (a launch begun just before it may see the change; the control cannot
    # tell which did)
    strict, _, _ = first_after(flips, recs, at_new, launched_after=True)
    with tempfile.TemporaryDirectory() as d:
        noop = noop_control(rig, ROUTE_PART | 10, flips_wanted, period, interval_us,
                            SIMGPU_LAUNCH_LOG=str(Path(d) / "launches.jsonl"), **env)
    steady = {}
    for side in ("local", "partition"):
        out, _, _ = rig.run("fwdprobe", "--n", "2000", "--interval-us", str(interval_us), "--dump",
                            routes=SIDES[side], **env)
        steady[side] = [(t_exec - t_launch) / 1e3 for _, t_launch, _d, t_exec, _w in probe_records(out)]
    write = [(t1 - t0) / 1e3 for t0, _r, t1 in flips[1:]]
    return {"flips": len(total), "iterations": len(recs), "interval_us": interval_us,
            "write_us_p50": q(write, 0.5),     # how well the flipper knows when the route changed
            "to_first_kernel_us": {"p50": q(total, 0.5), "p99": q(total, 0.99)},
            "launch_call_to_kernel_us": {"p50": q(boundary, 0.5), "p99": q(boundary, 0.99)},
            "as_control_us": {"p50": q(strict, 0.5), "p99": q(strict, 0.99)},
            # the GPU's bound of the start from the host's clocks, tried where
            # the start is known (simgpu's twin reads CLOCK_MONOTONIC)
            "bracket_check": bracket_check(recs, hits),
            "noop": noop,
            # the same probe without route changes: what a launch costs anyway
            "steady_launch_call_to_kernel_us": {k: {"p50": q(v, 0.5), "p99": q(v, 0.99)}
                                                for k, v in steady.items()}}


def device_clock_env(rig: Rig) -> dict[str, str]:
    """simgpu in real time (SIMGPU_TIMESCALE=1) on a device of its own: the
    probe's twin then records its kernel's modelled start on simgpu's device
    clock (simgpu_globaltimer, which at timescale 1 reads the host's
    CLOCK_MONOTONIC), as the kernel's %globaltimer does on a GPU, free of
    when simgpu's stream thread got to run it."""
    return {"SIMGPU_TIMESCALE": "1", "SIMGPU_DIR": str(rig.dir / "sim-clock")}


def gpu_switching(rig: Rig, flips_wanted: int, period: float = 0.05, interval_us: int = 50) -> dict:
    """Flips between two disjoint partitions on a GPU, told apart by the SM
    id each probe kernel stored (module docstring)."""
    a, b = ROUTE_PART | 0 << 8 | 10, ROUTE_PART | 50 << 8 | 50     # b: to the last group
    sms, steady = {}, {}
    for r in (a, b):
        recs = probe_records(rig.run("fwdprobe", "--n", "2000", "--interval-us", str(interval_us), "--dump",
                                     routes=r)[0])
        sms[r] = {who for *_, who in recs}
        steady[r] = [(t_done - t_launch) / 1e3 for _, t_launch, t_done, _x, _w in recs]
    if sms[a] & sms[b]:
        raise RuntimeError(f"the two partitions share SM ids {sorted(sms[a] & sms[b])}: not disjoint")
    flips: list[tuple[int, int, int]] = []
    recs = probe_records(rig.run("fwdprobe", *switch_probe_args(flips_wanted, period, interval_us),
                                 routes=[a, b], period=period, flips=flips)[0])
    def at_new(route: int, _i: int, rec: tuple[int, ...]) -> bool:
        return rec[4] not in sms[b if route == a else a]   # disjoint: not on the old one is on the new

    total, boundary, hits = first_after(flips, recs, at_new, done=2)
    strict, _, _ = first_after(flips, recs, at_new, done=2, launched_after=True)
    unknown = sum(1 for *_, who in recs if who not in sms[a] | sms[b])
    noop = noop_control(rig, a, flips_wanted, period, interval_us, done=2)
    both = [x for r in (a, b) for x in steady[r]]
    return {"flips": len(total), "iterations": len(recs), "interval_us": interval_us,
            "sms": {"a": len(sms[a]), "b": len(sms[b])},
            "write_us_p50": q([(t1 - t0) / 1e3 for t0, _r, t1 in flips[1:]], 0.5),
            "to_first_kernel_done_us": {"p50": q(total, 0.5), "p99": q(total, 0.99)},
            "as_control_us": {"p50": q(strict, 0.5), "p99": q(strict, 0.99)},   # launched after the write
            "to_first_kernel_started_us": started_us(recs, hits),
            "launch_call_to_done_us": {"p50": q(boundary, 0.5), "p99": q(boundary, 0.99)},
            "noop": noop,
            "steady_launch_call_to_done_us": {"p50": q(both, 0.5), "p99": q(both, 0.99)},
            "records_on_neither": unknown}


def main_gpu(a: argparse.Namespace) -> int:
    from shim import launcher
    if not launcher.cuda_usable():
        print("partitions: --device cuda: no NVIDIA driver answers here (use --device sim)", file=sys.stderr)
        return 2
    rig = Rig(device="cuda", workers=False)
    try:
        res = {"device": "cuda", "cpus": os.cpu_count(),
               "issue_ns_per_launch": issue(rig, sides=GPU_SIDES), "latency": latency(rig, a.n, GPU_SIDES),
               "switch": {"partition": gpu_switching(rig, a.flips, interval_us=a.switch_interval_us)}}
    finally:
        rig.close()
    print(json.dumps(res, indent=1))
    iss, sw = res["issue_ns_per_launch"], res["switch"]["partition"]
    no_total, no_call = (sw["noop"][k]["p50"] for k in ("to_first_kernel_us", "launch_call_to_kernel_us"))
    print(f"control, the same partition's route written again: first kernel after it seen done "
          f"{no_total:.1f} us, from its launch call {no_call:.1f} us (medians); a switch timed the same "
          f"way (first kernel launched after the write) adds {sw['as_control_us']['p50'] - no_total:+.1f} us",
          file=sys.stderr)
    st, no_st = sw["to_first_kernel_started_us"], sw["noop"]["to_first_kernel_started_us"]
    print(f"started (bounded from the host's clocks, {st['bracketed']} of {st['of']} flips): route change -> "
          f"first kernel on the new partition {st['p50_earliest']:.1f} .. {st['p50_latest']:.1f} us, the "
          f"control {no_st['p50_earliest']:.1f} .. {no_st['p50_latest']:.1f} us (medians of the bounds; "
          f"target <= {TARGETS['switch_us']:.0f} us: "
          f"{'met' if st['p50_latest'] <= TARGETS['switch_us'] else 'not shown'})", file=sys.stderr)
    print(f"added issue cost of a launch on a partition: {iss['partition'] - iss['local']:,.1f} ns; "
          f"route change -> first kernel on the new partition seen done by the host, median "
          f"{sw['to_first_kernel_done_us']['p50']:.1f} us (a steady launch + sync: "
          f"{sw['steady_launch_call_to_done_us']['p50']:.1f} us)", file=sys.stderr)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=5000, help="latency iterations (default 5000)")
    ap.add_argument("--flips", type=int, default=100, help="route changes to time per kind (default 100)")
    ap.add_argument("--switch-interval-us", type=int, default=0,
                    help="pause of the switch probe between launch+sync iterations, us (default 0: "
                         "back to back, so the app always has a launch coming and the figure is the "
                         "route's; a pause adds the wait for the app's next launch, half an iteration "
                         "on average, which no route can shorten; bench/forwarding.py pauses 50)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--device", choices=("sim", "cuda"), default="sim",
                    help="sim (default) or cuda: a GPU with green contexts, local and partitions only "
                         "(prints JSON)")
    a = ap.parse_args()
    needs = [BIN / "fwdprobe", BIN / "launchloop", paths.LIBCOLOCATE]
    if a.device == "sim":
        needs += [WORKER, paths.SIMGPU_DIR / "libcuda.so.1", BIN / "hostwake"]
    for need in needs:
        if not need.exists():
            print(f"missing {need}; run `make build`", file=sys.stderr)
            return 2
    if a.device == "cuda":
        return main_gpu(a)
    rig = Rig()
    try:
        rig.start_worker(1, 10)
        rig.start_worker(2, 100)
        res = {"device": "simgpu, SIMGPU_TIMESCALE=0", "cpus": os.cpu_count(),
               "issue_ns_per_launch": issue(rig), "latency": latency(rig, a.n),
               "switch": {"partition": partition_switching(rig, a.flips, interval_us=a.switch_interval_us),
                          "partition_device_clock": partition_switching(rig, a.flips,
                                                                        interval_us=a.switch_interval_us,
                                                                        **device_clock_env(rig)),
                          "pool": switching(rig, a.flips, interval_us=a.switch_interval_us)},
               "host_wake_p50": host_wake()}
    finally:
        rig.close()
    if a.json:
        print(json.dumps(res, indent=1))
        return 0
    report(res, a.n)
    return 0


def report(res: dict, n: int) -> None:
    from rich.console import Console
    from rich.table import Table

    iss, lat, sw = res["issue_ns_per_launch"], res["latency"], res["switch"]
    t = Table(title=f"partition vs pool ({res['device']}, {res['cpus']} CPUs)")
    for c in ("figure", "local", "partition", "pool (forwarded)"):
        t.add_column(c, justify="left" if c == "figure" else "right")
    t.add_row("issue ns per launch (launchloop 3000, median of 5)",
              *(f"{iss[s]:.0f}" for s in SIDES))
    t.add_row(f"launch + sync p50 / p99 us (fwdprobe n={n})",
              *(f"{lat[s]['p50_us']:.1f} / {lat[s]['p99_us']:.1f}" for s in SIDES))
    for what, key in (("route change -> first kernel at the new quota, p50 / p99 us", "to_first_kernel_us"),
                      ("  from that launch call, p50 / p99 us", "launch_call_to_kernel_us")):
        t.add_row(what, "-", *(f"{sw[k][key]['p50']:.1f} / {sw[k][key]['p99']:.1f}"
                               for k in ("partition", "pool")))
    no = sw["partition"]["noop"]
    t.add_row("  control: the same partition's route written again, to the first kernel after "
              "it, p50 / p99 us", "-", f"{no['to_first_kernel_us']['p50']:.1f} / "
              f"{no['to_first_kernel_us']['p99']:.1f}", "-")
    st = sw["partition"]["steady_launch_call_to_kernel_us"]
    t.add_row("  the same without route changes, p50 / p99 us",
              *(f"{st[k]['p50']:.1f} / {st[k]['p99']:.1f}" for k in ("local", "partition")),
              f"{sw['pool']['local_launch_call_to_kernel_us']['p50']:.1f} / "
              f"{sw['pool']['local_launch_call_to_kernel_us']['p99']:.1f} (local)")
    t.add_row("flips timed", "-", str(sw["partition"]["flips"]), str(sw["pool"]["flips"]))
    dc = sw["partition_device_clock"]
    t.add_section()
    for what, v in (("on simgpu's device clock (SIMGPU_TIMESCALE=1): route change -> first kernel at the "
                     "new quota started, p50 / p99 us", dc["to_first_kernel_us"]),
                    ("  from that launch call, p50 / p99 us", dc["launch_call_to_kernel_us"]),
                    ("  control: the same route written again, p50 / p99 us", dc["noop"]["to_first_kernel_us"]),
                    ("  its launch call -> kernel, p50 / p99 us", dc["noop"]["launch_call_to_kernel_us"])):
        t.add_row(what, "-", f"{v['p50']:.1f} / {v['p99']:.1f}", "-")
    t.add_row("  without route changes, launch call -> kernel, p50 / p99 us",
              *(f"{dc['steady_launch_call_to_kernel_us'][k]['p50']:.1f} / "
                f"{dc['steady_launch_call_to_kernel_us'][k]['p99']:.1f}" for k in ("local", "partition")), "-")
    Console().print(t)
    added = iss["partition"] - iss["local"]
    switch = sw["partition"]["to_first_kernel_us"]["p50"]
    own = sw["partition"]["launch_call_to_kernel_us"]["p50"] - st["partition"]["p50"]
    print(f"a switch of partition against rewriting the same route (control, same run), both timed "
          f"to the first kernel launched after the write: "
          f"{sw['partition']['as_control_us']['p50'] - no['to_first_kernel_us']['p50']:+.1f} us at the median")
    iv = sw["partition"]["interval_us"]
    cadence = f"the probe pauses {iv} us between iterations" if iv else "the probe launches back to back"
    print(f"a route change's own cost on a partition (its launch call -> kernel, less a steady "
          f"launch's, medians): {own:+.1f} us; the rest of the figure below is the wait for the "
          f"app's next launch ({cadence}) and simgpu's stream threads; the flipper's control-block write took "
          f"{sw['partition']['write_us_p50']:.1f} us (p50), timed from its end (stamped in C, "
          f"ControlBlock.flip_routes)")
    hw = res["host_wake_p50"]
    other = "-" if hw["other_cpu_us"] is None else f"{hw['other_cpu_us']:.1f}"
    print(f"this machine runs a thread that slept 50 ms {hw['same_cpu_us']:.1f} us after its wake-up on the "
          f"waker's CPU, {other} us on another (bench/bin/hostwake, p50): simgpu's first kernel on a "
          f"partition waits for its stream thread's wake-up, a GPU's for nothing of the kind")
    dc_own = dc["launch_call_to_kernel_us"]["p50"] - dc["steady_launch_call_to_kernel_us"]["partition"]["p50"]
    print(f"on the device clock, a switch against the control: "
          f"{dc['as_control_us']['p50'] - dc['noop']['to_first_kernel_us']['p50']:+.1f} us at the median; "
          f"its launch call -> kernel against a steady one: {dc_own:+.1f} us")
    for name, v, tgt, unit in (("added issue cost of a launch on a partition", added,
                                TARGETS["added_issue_ns"], "ns"),
                               ("route change -> first kernel on the new partition, median, when "
                                "simgpu's stream thread ran it (with that thread's wake-up, which a "
                                "GPU has not)", switch, TARGETS["switch_us"], "us"),
                               ("the same on simgpu's device clock (the kernel's modelled start, as "
                                "%globaltimer on a GPU: the figure the target is for)",
                                dc["to_first_kernel_us"]["p50"], TARGETS["switch_us"], "us")):
        print(f"{name}: {v:,.1f} {unit} (target <= {tgt:,.0f} {unit}: {'met' if v <= tgt else 'MISSED'})")


if __name__ == "__main__":
    sys.exit(main())
