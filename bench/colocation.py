"""The co-location experiment: one Tonic service and Rodinia batch apps share
one device under each policy in turn (C-Laius's end-to-end comparison).

    .venv/bin/python bench/colocation.py                       # claius vs the baselines
    .venv/bin/python bench/colocation.py --policies claius,mps-even --duration 6 --json out.json

For every policy, in the same run and on the same device settings:
  1. a fresh controller (`colocate serve --policy P --pool ...`);
  2. the batch apps under `colocate run --class batch`, each looping with --duration;
  3. the service under `colocate run --class qos --qos-ms T`, loaded by
     bench/tonic/client.py with Poisson arrivals;
  4. the service's p50/p99 end-to-end latency and QoS violations (client side),
     and each batch app's iterations/s normalised to its solo run at 100 %.
Policies that predict (claius, baymax, static-optimal) get models trained on
`colocate profile` samples of the same apps on the same device settings; they
are made once per settings and cached under --work.

The device model (shim/simgpu/simgpu_model.h): --model full (default: block
dispatch, co-residence, DRAM queueing, time slicing without MPS, shared PCIe)
or fluid (the model before them), --model-off to switch mechanisms off one by
one (bench/sensitivity.py does that for each).  Policies that assume a GPU
without MPS (baymax) run with SIMGPU_MPS=0: every process is a context of its
own, time-sliced.

simgpu settings (the default on a machine without a GPU): the device is made
--slowdown times slower (SM flop rate and memory bandwidth), so that a query
takes milliseconds of modelled time, and host twins are skipped
(SIMGPU_TIMING_ONLY=1: kernels take their modelled time, results are not
computed): on a 2-core machine the twins' CPU time would otherwise swamp the
modelled time and every policy would measure the CPU.  Timescale stays 1, so
modelled time is wall time and the controller's clock is the device's.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controlplane import client  # noqa: E402
from shim import paths  # noqa: E402
from shim.rundir import ColocateError, ensure  # noqa: E402

BIN = ROOT / "bench" / "bin"
CLIENT = ROOT / "bench" / "tonic" / "client.py"
COLOCATE = [sys.executable, "-m", "controlplane.cli"]
PREDICTING = ("claius", "claius-nb", "claius-nc", "baymax", "static-optimal")
NO_MPS = ("baymax",)                     # policies for a GPU without MPS: time-sliced device
MECHS = ("blocks", "cores", "bwq", "slice", "pcie")   # the full model's (SIMGPU_MODEL_OFF)
THROUGHPUT = re.compile(r"THROUGHPUT \S+ iters_per_s=([0-9.eE+-]+) iters=\d+ seconds=([0-9.eE+-]+)")
LAUNCHES = re.compile(r"STATS launches=(\d+)")


@dataclass
class Setup:
    service: str = "pos"
    service_args: str = "--max-size 4096"
    sizes: str = "4096"
    rate: float = 10.0                    # queries per second
    arrivals: str = "fixed"               # or poisson (queueing then dominates p99)
    qos_ms: float = 80.0
    batch: list[str] = field(default_factory=lambda: ["hotspot", "lud"])
    duration: float = 12.0                # seconds of load per policy
    slowdown: float = 1000.0
    pool: str = "10:1,20:1,30:1,40:1,50:1,60:1,70:1,80:1,90:1,100:1"
    profile_reps: int = 1
    seed: int = 1
    warmup: int = 20                      # first queries left out: cold start, and the
                                          # policies' online learning (claius's host time)
    model: str = "full"                   # simgpu's device model: full or fluid
    model_off: str = ""                   # mechanisms switched off (SIMGPU_MODEL_OFF)
    route: str = "pool"                   # serve --route: pool or partition (no workers)

    def key(self) -> str:
        """What the models depend on: the device settings and the programs,
        and the builds of both (simgpu's runtime, the service and batch
        binaries: a model profiled on an older simgpu is stale)."""
        d = {"service": self.service, "service_args": self.service_args, "sizes": self.sizes,
             "batch": self.batch, "slowdown": self.slowdown, "reps": self.profile_reps,
             "model": self.model, "off": self.model_off, "profile": "timing-only",
             "builds": builds([paths.SIMGPU_DIR / "libcudart.so.13", BIN / "tonic-service",
                               *(BIN / b for b in self.batch)])}
        return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def builds(files: list[Path]) -> dict[str, str]:
    """{name: sha1 of its bytes} of the files that exist."""
    return {f.name: hashlib.sha1(f.read_bytes()).hexdigest() for f in files if f.is_file()}


@dataclass
class Result:
    policy: str
    p50_ms: float | None
    p99_ms: float | None
    violations: int
    queries: int
    errors: int
    batch_ips: dict[str, float]
    batch_norm: dict[str, float]
    notes: list[str] = field(default_factory=list)

    @property
    def violation_pct(self) -> float:
        return 100.0 * self.violations / self.queries if self.queries else 0.0

    @property
    def mean_norm(self) -> float:
        v = list(self.batch_norm.values())
        return sum(v) / len(v) if v else 0.0


def device_env(s: Setup, simdir: Path, mps: bool = True) -> dict[str, str]:
    """The simulated device every process of one measurement shares."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SIMGPU_", "COLOCATE_")) and k != "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"}
    from shim.devmodel import default_params  # needs the build: not at import (--help)
    base = default_params()       # the compiled-in preset's rates, slowed down
    env.update(SIMGPU_DIR=str(simdir), SIMGPU_TIMING_ONLY="1", SIMGPU_TIMESCALE="1",
               SIMGPU_SM_GFLOPS=repr(base.sm_flops / 1e9 / s.slowdown),
               SIMGPU_BW_GBS=repr(base.bw / 1e9 / s.slowdown),
               SIMGPU_NAME=f"simgpu-slow{s.slowdown:g}-timing", COLOCATE_QUIET="1",
               SIMGPU_MODEL=s.model, SIMGPU_MODEL_OFF=s.model_off, SIMGPU_MPS="1" if mps else "0")
    if s.model != "fluid":      # one SM's pull slowed with the rest; fluid derives its own (config.c)
        env["SIMGPU_SM_BW_GBS"] = repr(base.sm_bw / 1e9 / s.slowdown)
    return env


def sliced(s: Setup) -> bool:
    """Whether the device time-slices processes without MPS (NO_MPS policies)."""
    return s.model == "full" and "slice" not in s.model_off.split(",")


def batch_cmd(name: str, seconds: float) -> list[str]:
    return [str(BIN / name), "--duration", f"{seconds:g}"]


def iters_per_s(text: str) -> float | None:
    m = THROUGHPUT.findall(text)
    return float(m[-1][0]) if m else None


def launches_per_s(text: str) -> float | None:
    t, n = THROUGHPUT.findall(text), LAUNCHES.findall(text)
    return int(n[-1]) / float(t[-1][1]) if t and n and float(t[-1][1]) > 0 else None


def solo(s: Setup, work: Path, log, seconds: float | None = None) -> tuple[dict[str, float], dict[str, float]]:
    """Each batch app alone at 100 %, natively on the same device settings,
    for `seconds` (default: a policy's duration): its iterations/s, and its
    launches/s (what the controller normalises to)."""
    out, rates = {}, {}
    secs = seconds or s.duration
    for name in s.batch:
        env = device_env(s, Path(tempfile.mkdtemp(prefix="dev-", dir=work)))
        env["LD_LIBRARY_PATH"] = str(ROOT / "shim" / "lib" / "simgpu")
        p = subprocess.run(batch_cmd(name, secs), env=env, capture_output=True, text=True,
                           timeout=secs * 10 + 60)
        ips = iters_per_s(p.stdout)
        if p.returncode not in (0, 1) or ips is None:     # 1: its self-check fails, timing only
            raise ColocateError(f"solo {name} failed (exit {p.returncode}):\n{p.stdout[-800:]}{p.stderr[-800:]}")
        out[name], rates[name] = ips, launches_per_s(p.stdout) or 0.0
        log(f"solo {name}: {ips:.3g} iters/s, {rates[name]:.0f} launches/s")
    return out, rates


def models(s: Setup, work: Path, log) -> Path:
    """Profile the service and the batch apps on this device, train decision
    trees; cached by Setup.key()."""
    root = work / f"models-{s.key()}"
    done = root / "models"
    if (done / ".complete").exists():
        log(f"models: cached in {done}")
        return done
    store = root / "store"
    # timing-only, as the measured runs: no host twins (modelled time does
    # not depend on them, and control flow that depends on results is then
    # the same as under the policies), so a program takes seconds, not minutes
    env = device_env(s, root / "dev")
    inputs = [f"tonic:{s.service}={s.sizes.replace(',', ';')}"]
    inputs += [f"{b}=--repeat 3" for b in s.batch]
    cmd = [*COLOCATE, "profile", f"tonic:{s.service}", *s.batch, "--reps", str(s.profile_reps),
           "--service-args", s.service_args, "--out", str(store), "--no-progress"]
    for i in inputs:
        cmd += ["--inputs", i]
    log("profiling: " + shlex.join(cmd[2:]))
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise ColocateError(f"profile failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    dev = env["SIMGPU_NAME"]
    for kind in ("query", "task"):
        cmd = [*COLOCATE, "train", "--kind", kind, "--model", "dt", "--store", str(store),
               "--device", dev, "--out", str(done), "--cv", "0"]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
        if p.returncode != 0:
            raise ColocateError(f"train failed ({p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    (done / ".complete").write_text(str(time.time()))
    log(f"models: profiled and trained in {time.monotonic() - t0:.0f} s -> {done}")
    return done


def service_key(model_dir: Path | None, s: Setup) -> str:
    """The service's name in the profile (its query samples' "service"): the
    live app must register under it for the predictors to know it."""
    if model_dir is not None:
        for f in sorted((model_dir.parent / "store").glob("*/query.jsonl")):
            for line in f.read_text().splitlines()[1:]:
                try:
                    return json.loads(line)["f"]["service"]
                except (ValueError, KeyError):
                    continue
    return s.service


def policy_spec(name: str, model_dir: Path | None, s: Setup) -> str:
    """NAME with its inputs: trained models, or for static-optimal the
    profile store itself (it enumerates profiled quotas); claius also gets
    the slowed device's bandwidth for its cap."""
    base = name.split(",")[0]
    if base not in PREDICTING or model_dir is None or "models=" in name or "profiles=" in name:
        return name
    if base == "static-optimal":
        return f"{name},profiles={model_dir.parent / 'store'}"
    bw = f",device_bw_gbs={3350.0 / s.slowdown:g}" if base.startswith("claius") else ""
    return f"{name},models={model_dir}{bw}"


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 10.0) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_policy(s: Setup, policy: str, model_dir: Path | None, solo_ips: dict[str, float],
               solo_rates: dict[str, float], work: Path, log, keep: bool = False) -> Result:
    """One measurement: controller, batch apps, service and its load."""
    rd = ensure(tempfile.mkdtemp(prefix="run-", dir=work))
    solo_file = rd.path / "solo.json"
    solo_file.write_text(json.dumps({k: v for k, v in solo_rates.items() if v > 0}))
    env = device_env(s, rd.path / "dev", mps=policy.split(",")[0] not in NO_MPS)
    env["COLOCATE_RUNTIME_DIR"] = str(rd.path)
    spec = policy_spec(policy, model_dir, s)
    # the controller's pool workers inherit the device from it
    ctl, _ = client.start_background(rd, spec, "sim", log_level="debug" if keep else "info",
                                     pool=s.pool if s.route == "pool" else None, timeout=30,
                                     solo=solo_file, env=env, route=s.route)
    batch: list[tuple[str, subprocess.Popen]] = []
    notes: list[str] = []
    try:
        if s.route == "pool":
            _wait_pool(rd, 30)
        run = [*COLOCATE, "run", "--runtime-dir", str(rd.path), "--device", "sim"]
        for name in s.batch:
            cmd = [*run, "--class", "batch", "--name", name, "--", *batch_cmd(name, s.duration + 2)]
            batch.append((name, subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                                 stderr=subprocess.STDOUT, text=True)))
        wrap = shlex.join([*run, "--class", "qos", "--qos-ms", f"{s.qos_ms:g}",
                            "--name", service_key(model_dir, s), "--"])
        out = rd.path / "client.json"
        cmd = [sys.executable, str(CLIENT), "--serve", s.service, "--serve-args", s.service_args,
               "--wrap", wrap, "--device", "sim", "--rate", f"{s.rate:g}", "--arrivals", s.arrivals,
               "--duration", f"{s.duration:g}",
               "--sizes", s.sizes, "--qos-ms", f"{s.qos_ms:g}", "--seed", str(s.seed), "--out", str(out)]
        cl = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=s.duration * 10 + 120)
        if cl.returncode != 0 or not out.exists():
            raise ColocateError(f"client failed under {policy} (exit {cl.returncode}):\n"
                                f"{cl.stdout[-1500:]}{cl.stderr[-1500:]}")
        doc = json.loads(out.read_text())
        summ = doc["summary"]
        lat = [q["latency_ms"] for q in doc["queries"][s.warmup:] if q.get("latency_ms") is not None]
        ips, norm = {}, {}
        for name, p in batch:
            text, _ = p.communicate(timeout=s.duration * 10 + 120)
            v = iters_per_s(text)
            if p.returncode not in (0, 1) or v is None:   # 1: self-check, timing only
                notes.append(f"{name} exited {p.returncode}: {text.strip().splitlines()[-1:] }")
                v = 0.0
            ips[name], norm[name] = v, v / solo_ips[name] if solo_ips.get(name) else 0.0
        return Result(policy, percentile(lat, 50), percentile(lat, 99),
                      sum(x > s.qos_ms for x in lat), len(lat), int(summ.get("errors") or 0),
                      ips, norm, notes)
    finally:
        for _, p in batch:
            stop(p, signal.SIGKILL)
        try:
            client.request(rd, "stop")
            ctl.wait(timeout=15)
        except (ColocateError, subprocess.TimeoutExpired):
            stop(ctl, signal.SIGKILL)
        if keep:
            log(f"kept {rd.path} (serve.log, history.jsonl)")
        else:
            shutil.rmtree(rd.path, ignore_errors=True)


def percentile(values: list[float], p: float) -> float | None:
    """Nearest rank, as the client and the controller compute theirs."""
    if not values:
        return None
    v = sorted(values)
    return v[max(0, -(-len(v) * p // 100) - 1)]


def _wait_pool(rd, timeout: float) -> None:
    """Until every pool worker is ready (the first queries should not wait for them)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ws = client.request(rd, "pool").get("workers", [])
        if ws and all(w.get("state") == "ready" for w in ws):
            return
        time.sleep(0.1)
    raise ColocateError(f"pool workers not ready within {timeout:g} s")


def table(results: list[Result], s: Setup) -> str:
    head = (f"{s.service} ({s.sizes}, {s.rate:g} q/s {s.arrivals}, QoS {s.qos_ms:g} ms) + "
            f"{', '.join(s.batch)}; simgpu x{s.slowdown:g} slower, timing only, model {s.model}"
            f"{' without ' + s.model_off if s.model_off else ''}; {s.duration:g} s each, "
            f"first {s.warmup} queries left out"
            f"{'; ' + '/'.join(NO_MPS) + ' time-sliced (no MPS)' if sliced(s) else ''}")
    cols = ["policy", "p50 ms", "p99 ms", "QoS viol.", *[f"{b} norm" for b in s.batch], "batch mean"]
    rows = [[r.policy, _f(r.p50_ms), _f(r.p99_ms), f"{r.violations}/{r.queries} ({r.violation_pct:.1f} %)",
             *[f"{r.batch_norm.get(b, 0):.2f}" for b in s.batch], f"{r.mean_norm:.2f}"] for r in results]
    w = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    line = lambda cells: "  ".join(c.rjust(w[i]) if i else c.ljust(w[i]) for i, c in enumerate(cells))  # noqa: E731
    return "\n".join([head, line(cols), line(["-" * x for x in w]), *map(line, rows)])


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def plot(results: list[Result], s: Setup, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    names = [r.policy for r in results]
    a.bar(names, [r.p99_ms or 0 for r in results], color="tab:blue")
    a.axhline(s.qos_ms, color="tab:red", ls="--", label=f"QoS target {s.qos_ms:g} ms")
    a.set_ylabel("service p99 latency (ms)")
    a.legend()
    b.bar(names, [r.mean_norm for r in results], color="tab:green")
    b.set_ylabel("batch throughput (norm. to solo)")
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(f"{s.service} + {', '.join(s.batch)} on simgpu (x{s.slowdown:g} slower)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Setup()
    p.add_argument("--policies", default="claius,mps-even,mps-priority,baymax,static-optimal",
                   help="comma-separated policy names, measured in this order (default: %(default)s)")
    p.add_argument("--policy", action="append", default=[], metavar="SPEC",
                   help="one more policy with options, e.g. 'claius,objective=ipc' (repeatable; "
                        "measured after --policies; --policies '' for these alone)")
    p.add_argument("--service", default=d.service, help="Tonic net (default: %(default)s)")
    p.add_argument("--service-args", default=d.service_args, help="tonic-service options")
    p.add_argument("--sizes", default=d.sizes, help="query sizes, comma-separated")
    p.add_argument("--rate", type=float, default=d.rate, help="queries per second")
    p.add_argument("--arrivals", choices=("fixed", "poisson"), default=d.arrivals,
                   help="fixed: evenly spaced, so p99 measures the scheduling; poisson: queueing too")
    p.add_argument("--qos-ms", type=float, default=d.qos_ms, help="the service's latency target")
    p.add_argument("--batch", default=",".join(d.batch), help="Rodinia apps (fixed control flow: "
                   "hotspot lud pathfinder nw lavamd myocyte; not bfs/btree in timing-only mode)")
    p.add_argument("--duration", type=float, default=d.duration, help="seconds of load per policy")
    p.add_argument("--solo-seconds", type=float, metavar="S",
                   help="seconds of each batch app's solo run (default: --duration); shorter makes the "
                        "normalised throughputs noisier, not the policies' order")
    p.add_argument("--warmup", type=int, default=d.warmup, help="first queries left out of the figures")
    p.add_argument("--slowdown", type=float, default=d.slowdown, help="simgpu slower by this factor")
    p.add_argument("--pool", default=d.pool, help="process pool (QUOTA:N,...)")
    p.add_argument("--route", choices=("pool", "partition"), default=d.route,
                   help="where a quota below 100 %% runs (colocate serve --route): a pool worker "
                        "(default) or an SM partition in the app (no pool started)")
    p.add_argument("--model", choices=("full", "fluid"), default=d.model,
                   help="simgpu's device model (full: block dispatch, co-residence, DRAM queueing, "
                        "time slices without MPS, shared PCIe; fluid: the model before them)")
    p.add_argument("--model-off", default=d.model_off, metavar="LIST",
                   help="mechanisms of the full model switched off: blocks,cores,bwq,slice,pcie")
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "colocate-colocation",
                   help="working dir; models are cached here")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--png", type=Path, help="write a p99 / throughput figure here")
    p.add_argument("--keep", action="store_true", help="keep each run's runtime dir (controller log)")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    s = Setup(a.service, a.service_args, a.sizes, a.rate, a.arrivals, a.qos_ms,
              [b for b in a.batch.split(",") if b], a.duration, a.slowdown, a.pool,
              warmup=a.warmup, model=a.model, model_off=a.model_off, route=a.route)
    if a.solo_seconds is not None and not a.solo_seconds > 0:
        print(f"colocation: --solo-seconds {a.solo_seconds:g}: want a positive number of seconds", file=sys.stderr)
        return 2
    bad = set(m for m in a.model_off.split(",") if m) - set(MECHS)
    if bad:
        print(f"colocation: --model-off: unknown {', '.join(sorted(bad))} "
              f"({', '.join(MECHS)})", file=sys.stderr)
        return 2
    for b in s.batch:
        if not (BIN / b).exists():
            print(f"colocation: {BIN / b} missing (run `make build`)", file=sys.stderr)
            return 2
    policies = [p for p in a.policies.split(",") if p] + a.policy
    log = (lambda m: None) if a.quiet else (lambda m: print(f"[colocation] {m}", file=sys.stderr, flush=True))  # noqa: E731
    a.work.mkdir(parents=True, exist_ok=True)
    try:
        model_dir = models(s, a.work, log) if any(p.split(",")[0] in PREDICTING for p in policies) else None
        solo_ips, solo_rates = solo(s, a.work, log, a.solo_seconds)
        results = []
        for pol in policies:
            log(f"policy {pol}: {s.duration:g} s")
            r = run_policy(s, pol, model_dir, solo_ips, solo_rates, a.work, log, a.keep)
            log(f"policy {pol}: p99 {_f(r.p99_ms)} ms, {r.violations}/{r.queries} late, "
                f"batch {r.mean_norm:.2f} of solo" + (f"; {'; '.join(r.notes)}" if r.notes else ""))
            results.append(r)
    except ColocateError as e:
        print(f"colocation: {e}", file=sys.stderr)
        return 1
    print(table(results, s))
    if a.json:
        a.json.write_text(json.dumps({"setup": asdict(s), "solo_ips": solo_ips,
                                      "results": [{**asdict(r), "violation_pct": r.violation_pct,
                                                   "mean_norm": r.mean_norm} for r in results]}, indent=1))
    if a.png:
        plot(results, s, a.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
