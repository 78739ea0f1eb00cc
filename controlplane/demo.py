"""`colocate demo`: co-location, live.

On simgpu (the default without a GPU) it is the main job: a Tonic service
with two Rodinia batch apps under claius and two baselines in turn
(bench/colocation.py: profiling timing-only, then 8 s per policy), its table
and a figure.  On a GPU, or with --basic: a batch job (hotspot) and a QoS
service (vecadd, 50 ms target) share the device under a controller with the
static policy, and what each got.

Everything runs in a private runtime dir, so the demo never touches a
controller the user already has.  Programs come from bench/bin (override with
$COLOCATE_BENCH_BIN); on the sim device simgpu's report says which kernels
ran without a host twin.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from controlplane import client
from controlplane.cli import human_bytes, out
from shim import launcher, paths
from shim.launcher import AppSpec
from shim.rundir import ColocateError, RunDir, ensure

ROOT = Path(__file__).resolve().parent.parent
APP_TIMEOUT_S = 600.0


def bench_bin() -> Path:
    return Path(os.environ.get("COLOCATE_BENCH_BIN") or ROOT / "bench" / "bin")


def demo_apps() -> list[AppSpec]:
    b = bench_bin()
    return [AppSpec([str(b / "hotspot"), "--iters", "200", "--size", "512"], "hotspot", "batch"),
            AppSpec([str(b / "vecadd"), "--repeat", "50"], "vecadd", "qos", qos_ms=50)]


def missing(device: str) -> list[Path]:
    need = [paths.LIBCOLOCATE] + ([paths.SIMGPU_CUDART] if device == "sim" else [])
    need += [Path(a.cmd[0]) for a in demo_apps()]
    return [p for p in need if not p.exists()]


@dataclass
class Outcome:
    spec: AppSpec
    pid: int
    code: int
    output: str
    wall_s: float
    record: dict | None = None

    @property
    def passed(self) -> bool:
        return self.code == 0 and any(ln.startswith("PASS") for ln in self.output.splitlines())


def _wait(spec: AppSpec, proc: subprocess.Popen, t0: float) -> Outcome:
    try:
        output, _ = proc.communicate(timeout=APP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        output += f"\n(killed after {APP_TIMEOUT_S:g} s)"
    return Outcome(spec, proc.pid, launcher.exit_code(proc.returncode), output, time.monotonic() - t0)


def run_apps(rd: RunDir, device: str, console: Console) -> list[Outcome]:
    """Start every demo app at once and wait for all of them."""
    started = []
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIMGPU_")}   # report stays in rd
    try:
        for spec in demo_apps():
            proc = launcher.spawn(spec, rd, device, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, errors="replace")
            started.append((spec, proc, time.monotonic()))
        names = " and ".join(f"{s.name} ({s.cls})" for s, _, _ in started)
        with console.status(f"running {names} on {device}..."), ThreadPoolExecutor(len(started)) as pool:
            return list(pool.map(lambda a: _wait(*a), started))
    finally:
        for _, proc, _ in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def final_records(rd: RunDir, pids: set[int], timeout: float = 3.0) -> dict[int, dict]:
    """The controller's final records for pids (exit message or liveness check)."""
    end, recs = time.monotonic() + timeout, {}
    while time.monotonic() < end:
        apps = client.request(rd, "list", all=True)["apps"]
        recs = {a["pid"]: a for a in apps if a["pid"] in pids and a["state"] == "exited"}
        if set(recs) == pids:
            break
        time.sleep(0.1)
    return recs


def no_twin_kernels(report: Path, outcomes: list[Outcome]) -> list[str]:
    """Kernels simgpu ran without a host twin: from the apps' exit records and
    from SIMGPU_REPORT (JSON lines with "kernel"/"name" and "twin")."""
    names = {k["name"] for o in outcomes if o.record for k in o.record["kernels"] if k.get("twin") is False}
    try:
        lines = report.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for ln in lines:
        try:
            obj = json.loads(ln)
        except ValueError:
            continue
        if isinstance(obj, dict):
            name, twin = obj.get("kernel") or obj.get("name"), obj.get("twin", obj.get("has_twin"))
            if isinstance(name, str) and twin is False:
                names.add(name)
    return sorted(names)


def table(outcomes: list[Outcome], device: str) -> Table:
    t = Table(title=f"colocate demo on {device} (policy static)", box=box.SIMPLE_HEAD)
    for c in ("app", "class", "quota %", "launches", "forwarded", "H2D", "D2H", "exit", "result", "wall"):
        t.add_column(c, justify="left" if c in ("app", "class", "result") else "right")
    for o in outcomes:
        r = o.record or {}
        num = lambda k: str(r[k]) if k in r else "?"            # noqa: E731
        byt = lambda k: human_bytes(r[k]) if k in r else "?"    # noqa: E731
        result = Text("PASS", style="bold green") if o.passed else Text("FAIL", style="bold red")
        t.add_row(o.spec.name, o.spec.cls + (f" {o.spec.qos_ms:g} ms" if o.spec.qos_ms else ""),
                  num("quota_pct"), num("launches"), num("forwarded"), byt("h2d_bytes"),
                  byt("d2h_bytes"), str(o.code), result, f"{o.wall_s:.2f} s")
    return t


COMPARISON = ["--policies", "claius,mps-priority,baymax", "--batch", "hotspot,lud", "--duration", "8",
              "--warmup", "10"]


def comparison(console: Console) -> int | None:
    """bench/colocation.py's co-location, short; None without a source checkout."""
    script = ROOT / "bench" / "colocation.py"
    if not script.exists():
        return None
    outdir = Path(os.environ.get("COLOCATE_DEMO_OUT") or ROOT / "bench" / "out")
    outdir.mkdir(parents=True, exist_ok=True)
    console.print("co-location on simgpu: Tonic pos (QoS 80 ms, 10 queries/s) with hotspot and lud, "
                  "under claius, mps-priority and baymax, 8 s each (bench/colocation.py; about a minute)",
                  markup=False, highlight=False)
    r = subprocess.run([sys.executable, str(script), *COMPARISON, "--png", str(outdir / "demo.png"),
                        "--json", str(outdir / "demo.json")], cwd=ROOT)
    if r.returncode == 0:
        console.print(f"figure: {outdir / 'demo.png'}; rows: {outdir / 'demo.json'}", markup=False,
                      highlight=False)
    return r.returncode


def main(device: str = "auto", keep: bool = False, console: Console | None = None, basic: bool = False) -> int:
    console = console or out
    device = launcher.detect_device(device)
    if device == "sim" and not basic:
        code = comparison(console)
        if code is not None:
            return code
    lost = missing(device)
    if lost:
        raise ColocateError("demo needs " + ", ".join(map(str, lost)) + "; run `make build`")
    rd = ensure(tempfile.mkdtemp(prefix="colocate-demo-"))
    ctl = None
    try:
        ctl, pong = client.start_background(rd, "static", device, new_session=False,
                                             pool="none")   # the static policy routes nothing
        console.print(f"controller {pong['controller_pid']} (policy static, device {device}) in {rd.path}",
                      markup=False, highlight=False)
        outcomes = run_apps(rd, device, console)
        recs = final_records(rd, {o.pid for o in outcomes})
        for o in outcomes:
            o.record = recs.get(o.pid)
        console.print(table(outcomes, device))
        if device == "sim":
            nt = no_twin_kernels(rd.simgpu / "report.jsonl", outcomes)
            console.print("kernels without a host twin (timed, not computed): " + ", ".join(nt) if nt
                          else "every kernel ran with its host twin", markup=False, highlight=False)
        for o in outcomes:
            if not o.passed:
                tail = "\n".join(o.output.splitlines()[-15:])
                console.print(f"--- {o.spec.name} (exit {o.code}), last lines:\n{tail}", markup=False)
        return 0 if all(o.passed for o in outcomes) else 1
    finally:
        if ctl is not None:
            try:
                client.request(rd, "stop")
            except ColocateError:
                ctl.terminate()
            try:
                ctl.wait(timeout=10)
            except subprocess.TimeoutExpired:
                ctl.kill()
                ctl.wait()
        if keep:
            console.print(f"kept {rd.path} (serve.log, history.jsonl)", markup=False, highlight=False)
        else:
            shutil.rmtree(rd.path, ignore_errors=True)
