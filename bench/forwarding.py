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
              worker over its mem socket); not a target of issue 3, a cost
Rig is also what tests/test_forwarding.py uses.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import zmq  # noqa: E402

from controlplane.launcher import cuda_usable as driver_present  # noqa: E402
from controlplane.launcher import libzmq_path  # noqa: E402
from processpool.mps import Mps  # noqa: E402
from shim import paths  # noqa: E402
from shim.ctlblock import ControlBlock  # noqa: E402

BIN = REPO / "bench" / "bin"
WORKER = paths.LIB_DIR / "colocate-worker"


class Rig:
    """A runtime dir with a control block, a stand-in controller and workers."""

    def __init__(self, timescale: str = "0", device: str = "sim"):
        self.dir = Path(tempfile.mkdtemp(prefix="cf-", dir="/tmp"))   # short: ipc paths
        self.device = device
        self.mps: Mps | None = None
        self.cb = ControlBlock.create(self.dir / "ctlblock")
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("COLOCATE_", "SIMGPU_", "CUDA_MPS_")) and k != "LD_PRELOAD"}
        self.env.update(COLOCATE_LIBZMQ=libzmq_path() or "", COLOCATE_RUNTIME_DIR=str(self.dir))
        self.worker_env: dict[str, str] = {}
        if device == "cuda":
            # workers are MPS clients, apps are not (as under `colocate
            # run`); a GPU worker takes only apps whose memory is VMM-shared
            self.mps = Mps(self.dir)
            print(f"forwarding: {self.mps.ensure()}", file=sys.stderr)
            self.worker_env = self.mps.env()
            self.env.update(COLOCATE_MEM="vmm")
            self.fast: dict[str, str] = {}
        else:
            self.env.update(LD_LIBRARY_PATH=str(paths.SIMGPU_DIR), SIMGPU_DIR=str(self.dir / "sim"),
                            SIMGPU_TIMESCALE=timescale)
            # a local run on a full-speed device of its own
            self.fast = {"SIMGPU_TIMESCALE": "0", "SIMGPU_DIR": str(self.dir / "sim-fast")}
        self.slots: dict[int, int] = {}
        # the route the next app to register gets before its registration is
        # answered, so that even its first launch follows it (run(routes=N))
        self.route_at_register: int | None = None
        self.route_every: int | None = None        # the same for every app, until reset
        self.workers: dict[int, subprocess.Popen] = {}
        self.ctx = zmq.Context()
        self._stop = threading.Event()
        self._router = self.ctx.socket(zmq.ROUTER)
        self._router.bind(f"ipc://{self.dir}/ctl.sock")
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._router.poll(20):
                continue
            frames = self._router.recv_multipart()
            msg = json.loads(frames[-1])
            if msg.get("type") == "register":
                slot = self.cb.claim(msg["pid"])
                route, self.route_at_register = self.route_at_register, None
                route = self.route_every if route is None else route
                if route is not None:
                    self.cb.set_route(slot, route, 50)
                self.slots[msg["pid"]] = slot
                reply = {"v": 1, "type": "registered", "slot": slot, "quota_pct": 100,
                         "route": 0, "controller_pid": os.getpid()}
            else:
                reply = {"v": 1, "type": "ok"}
            self._router.send_multipart([frames[0], b"", json.dumps(reply).encode()])

    def start_worker(self, wid: int, quota: int) -> subprocess.Popen:
        env = {**self.env, **self.worker_env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(quota)}
        p = subprocess.Popen([str(WORKER), "--id", str(wid), "--quota", str(quota),
                              "--runtime-dir", str(self.dir)], env=env, stdout=subprocess.PIPE,
                             stderr=open(self.dir / f"worker-{wid}.err", "wb"))
        if not select.select([p.stdout], [], [], 10)[0]:
            p.kill()
            raise RuntimeError(f"worker {wid} did not start: {self.worker_log(wid)}")
        line = p.stdout.readline().decode()
        if line != f"READY worker {wid} quota {quota} pid {p.pid}\n":
            raise RuntimeError(f"worker {wid}: unexpected first line {line!r}")
        self.workers[wid] = p
        return p

    def worker_log(self, wid: int) -> str:
        return (self.dir / f"worker-{wid}.err").read_text(errors="replace")

    def request(self, wid: int, *frames: bytes, timeout: float = 3.0) -> list[bytes]:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"ipc://{self.dir}/worker-{wid}.sock")
        try:
            s.send_multipart(list(frames))
            if not s.poll(int(timeout * 1000)):
                raise TimeoutError(f"worker {wid} did not answer")
            return s.recv_multipart()
        finally:
            s.close()

    def stats(self, wid: int) -> dict:
        return json.loads(self.request(wid, b"", b'{"v":1,"type":"stats"}')[-1])

    def app(self, prog: str, *args: str, **env: str) -> subprocess.Popen:
        return subprocess.Popen([str(BIN / prog), *args],
                                env={**self.env, "LD_PRELOAD": str(paths.LIBCOLOCATE), **env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def slot_of(self, proc: subprocess.Popen, timeout: float = 5.0) -> int:
        end = time.monotonic() + timeout
        while proc.pid not in self.slots:
            if time.monotonic() > end or proc.poll() is not None:
                raise RuntimeError("app did not register")
            time.sleep(0.0005)
        return self.slots[proc.pid]

    def run(self, prog: str, *args: str, routes=None, period: float = 0.03, timeout: float = 120,
            flips: list | None = None, **env: str) -> tuple[str, str, dict]:
        """Run an app to its end.  routes: None (local), a worker id (set
        before its registration is answered, so before its first launch; one
        app at a time), or a list cycled every
        `period` s while it runs; flips, if given, collects (monotonic ns,
        route) of each change.  Returns stdout, stderr, final counters."""
        if isinstance(routes, int):
            self.route_at_register = routes
        p = self.app(prog, *args, **env)
        slot = self.slot_of(p)
        if routes and not isinstance(routes, int):
            def flip():
                k = 0
                while p.poll() is None:
                    r = routes[k % len(routes)]
                    t = time.monotonic_ns()
                    self.cb.set_route(slot, r, 50)
                    if flips is not None:
                        flips.append((t, r))
                    k += 1
                    time.sleep(period)
            threading.Thread(target=flip, daemon=True).start()
        out, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"{prog} exited {p.returncode}:\n{out}\n{err}")
        return out, err, self.cb.counters(slot)

    def close(self) -> None:
        for p in self.workers.values():
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()
        self._stop.set()
        self._thread.join()
        self._router.close(0)
        self.ctx.destroy(linger=0)     # never hang on a socket a failed test left open
        self.cb.close()
        if self.mps:
            self.mps.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


# ---------------------------------------------------------------- measurements

def _kv(line_re: str, out: str) -> dict[str, float]:
    m = re.search(line_re, out, re.M)
    if not m:
        raise RuntimeError(f"no {line_re} in:\n{out}")
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


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
    flips: list[tuple[int, int]] = []
    n = int(flips_wanted * period * 1e6 / (interval_us + 60)) + 200
    out, _, c = rig.run("fwdprobe", "--n", str(n), "--interval-us", str(interval_us), "--dump",
                        routes=[1, 2], period=period, flips=flips)
    recs = [tuple(map(int, ln.split()[1:])) for ln in out.splitlines() if ln.startswith("I ")]
    total, boundary = [], []
    for t_set, route in flips[1:]:                      # the first one is the initial route
        for _, t_launch, _t_done, t_exec, who in recs:
            if who == pids[route] and t_exec >= t_set:
                total.append((t_exec - t_set) / 1e3)
                boundary.append((t_exec - max(t_launch, t_set)) / 1e3)
                break
    out, _, _ = rig.run("fwdprobe", "--n", "2000", "--interval-us", str(interval_us), "--dump")
    local = [(t_exec - t_launch) / 1e3 for _, t_launch, _d, t_exec, _w in
             (tuple(map(int, ln.split()[1:])) for ln in out.splitlines() if ln.startswith("I "))]

    def q(v: list[float], p: float) -> float:
        v = sorted(v)
        return v[min(len(v) - 1, int(p * len(v)))] if v else float("nan")
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


# issue 3's targets on simgpu on the 2-core development machines
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
    t = Table(title=f"issue 3 targets ({device}; the targets are for simgpu on the 2-core machines)")
    for col in ("figure", "measured", "target", ""):
        t.add_column(col, justify="left" if col == "figure" else "right")
    for name, v, tgt, unit, ok in rows:
        cmp = "<=" if unit == "us" else ">="
        t.add_row(name, f"{v:,.1f} {unit}", f"{cmp} {tgt:,.0f} {unit}",
                  "met" if ok(v, tgt) else "[bold red]missed[/]")
    Console().print(t)


if __name__ == "__main__":
    sys.exit(main())
