"""The real-GPU checks of the process pool in one command: is an MPS SM quota real, and
does VMM memory map at the same address in another MPS client?

On the GPU machine (H100/H200, CUDA 13 driver with MPS, nvcc), from the
repository root:

    make bench/bin/gpu-quota_probe bench/bin/gpu-vmm_probe && \\
        PYTHONUNBUFFERED=1 python3 bench/gpu_pool.py --out bench/out/gpu_pool.json

(`make build` builds the two probes with everything else; on a machine with
no network, such as the lent GPU machines whose `make build` cannot fetch
the .venv's packages, the two targets above need only nvcc.  Any python3 of
3.10 or later does: the script needs the standard library only; it draws
its table with rich and asks pynvml about the driver when they are
installed.)  The default plan runs 25 probes (about 30 processes, each
creating a CUDA context), expected to take one to two minutes (not yet
timed on a GPU); it starts no run after --budget-s (420 s) and kills a
probe after --per-run-s (90 s), so it fits one 10-minute command with
room for the build.  Exit 0: every run finished; 1: something
failed (the table and the JSON say what); 2: no NVIDIA driver, nothing
measured.

What it does, in this order:

 1. Without MPS (CUDA_MPS_PIPE_DIRECTORY points at an empty directory, so no
    daemon answers): gpu-quota_probe at 100 % calibrates the compute kernel
    (--target-ms per launch) and fixes its iteration count and grid for every
    later run; the same at CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10 is the
    control (without MPS the variable must change nothing); gpu-vmm_probe
    100/100.
 2. Starts the MPS control daemon through processpool/mps.py under a private
    runtime directory (or uses one that already answers, and says which).
 3. gpu-vmm_probe for each --pairs PARENT/CHILD percentage pair, then once
    with the parent outside MPS and the child a 50 % MPS client ("app->worker":
    how an app under `colocate run` shares memory with a pool worker).
 4. gpu-quota_probe at each --quotas value, each its own MPS client, from
    100 down; then the memory-bound variant likewise (unless --no-mem).
 5. Stops the daemon if it started it (also on errors and Ctrl-C), prints
    the tables and writes everything to --out.

What the figures mean:

  median_ms      median time of one launch of the same kernel (same grid,
                 same work) between two CUDA events, over --reps launches
  x t(100)       median_ms / median_ms at 100 % in the same mode: 10.0 at
                 10 % means the kernel ran ten times longer, i.e. it got a
                 tenth of the SMs
  ideal          100 / quota: what a compute-bound kernel that fills the
                 GPU several times over should show if the quota is exact
  effective %    100 / (x t(100)): the share of the SMs it behaved as having
  SMs seen       the multiprocessor count the client's device attribute
                 reports; exec-aff SMs the SM count of cuCtxGetExecAffinity
                 (both may or may not follow the quota: recorded, not
                 assumed)
  same address   the child's cuMemAddressReserve, given the parent's address
                 as hint, returned exactly it
  data ok        the parent read back exactly what the child's kernels wrote
                 through the imported mapping (3x + 1, then + 7)
  arena          both processes reserved 64 GiB at the fixed hint
                 0x600000000000 at start and got it; arena data ok: the
                 child's second kernel wrote through its arena mapping and
                 the parent saw it through both of its mappings
  setup µs       the child's cuMemImportFromShareableHandle + cuMemMap +
                 cuMemSetAccess, first time and median of --vmm-reps repeats
                 (C-Laius paid 3.2 ms of IPC set-up per switch)

The JSON file holds every probe's own JSON line (see bench/gpu/*.cu for each
field), its exit code, command, environment percentage and stderr tail, the
driver facts, the MPS daemon used, the curves and the verdicts.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

BIN = REPO / "bench" / "bin"
QUOTA_PROBE = BIN / "gpu-quota_probe"
VMM_PROBE = BIN / "gpu-vmm_probe"
PCT_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PIPE_ENV, LOG_ENV = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"
NO_DRIVER = "no NVIDIA driver: nothing measured"
DEFAULT_QUOTAS = "10,20,30,40,50,60,70,80,90,100"
DEFAULT_PAIRS = "100/100,30/70,10/100"
MIN_RUN_S = 15.0                   # no run is started with less budget left
# where driver utilities (nvidia-cuda-mps-control) live when not on $PATH, as in
# containers and VMs that mount the host's driver
DRIVER_BIN_DIRS = ("/usr/local/nvidia/bin", "/usr/lib/nvidia/bin", "/opt/nvidia/bin")

Runner = Callable[[list[str], dict[str, str], float], "ProbeRun"]


# ---------------------------------------------------------------- pure parts

def parse_probe_output(stdout: str) -> dict[str, Any] | None:
    """The probe's JSON line (the last line that is a JSON object with "probe")."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict) and "probe" in obj:
            return obj
    return None


def parse_quotas(text: str) -> list[int]:
    """'10,20,100' -> [100, 20, 10] (100 first: it is every curve's base)."""
    try:
        qs = sorted({int(x) for x in text.split(",") if x.strip()}, reverse=True)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad quota list {text!r}: integers 1..100, comma-separated") from None
    if not qs or any(not 1 <= q <= 100 for q in qs):
        raise argparse.ArgumentTypeError(f"bad quota list {text!r}: integers 1..100, comma-separated")
    if 100 not in qs:
        qs.insert(0, 100)
    return qs


def parse_pairs(text: str) -> list[tuple[int, int]]:
    """'100/100,30/70' -> [(100, 100), (30, 70)] (parent %, child %)."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        try:
            p, c = (int(v) for v in item.split("/"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad pair {item!r}: PARENT/CHILD percentages, e.g. 30/70") from None
        if not (1 <= p <= 100 and 1 <= c <= 100):
            raise argparse.ArgumentTypeError(f"bad pair {item!r}: percentages are 1..100")
        out.append((p, c))
    if not out:
        raise argparse.ArgumentTypeError("no percentage pair given")
    return out


def quota_curve(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run: time relative to the 100 % run of the same mode (MPS or not) and kind.

    rows: {"quota", "mps", "kind", "result": probe JSON or None}.  Rows without a
    median, or whose group lacks a 100 % median, get None for the ratios."""
    base: dict[tuple[bool, str], float] = {}
    for r in rows:
        med = (r.get("result") or {}).get("median_ms")
        if r["quota"] == 100 and med:
            base.setdefault((r["mps"], r["kind"]), med)
    out = []
    for r in rows:
        res = r.get("result") or {}
        med, b = res.get("median_ms"), base.get((r["mps"], r["kind"]))
        rel = med / b if med and b else None
        out.append({"quota": r["quota"], "mps": r["mps"], "kind": r["kind"], "median_ms": med,
                    "p10_ms": res.get("p10_ms"), "p90_ms": res.get("p90_ms"),
                    "sm_count": res.get("sm_count"), "exec_affinity_sm": res.get("exec_affinity_sm"),
                    "mps_enabled": res.get("mps_enabled"), "gbps": res.get("gbps"),
                    "check_ok": res.get("check_ok"), "rel": rel, "ideal": 100.0 / r["quota"],
                    "effective_pct": 100.0 / rel if rel else None,
                    "error": res.get("error") or r.get("error")})
    return out


def quota_verdict(curve: list[dict[str, Any]], kind: str = "compute") -> str:
    """One sentence: is the quota real, judged at the smallest quota measured under MPS."""
    mps = [c for c in curve if c["mps"] and c["kind"] == kind and c["rel"]]
    low = min((c for c in mps if c["quota"] < 100), key=lambda c: c["quota"], default=None)
    if low is None:
        return "no verdict: no MPS run below 100 % was timed against a 100 % run"
    if any(c["mps_enabled"] is False for c in mps):
        return "no verdict: a client reported CU_DEVICE_ATTRIBUTE_MPS_ENABLED = 0 (not under MPS)"
    q, rel, ideal = low["quota"], low["rel"], low["ideal"]
    facts = f"at {q} % the kernel took {rel:.2f}x its 100 % time (ideal {ideal:.2f}x)"
    if rel >= 0.5 * ideal and rel > 1.5:
        verdict = f"quota is real: {facts}"
    elif rel < 1.2:
        verdict = f"quota NOT enforced: {facts}"
    else:
        verdict = f"quota partly enforced: {facts}"
    ctl = [c for c in curve if not c["mps"] and c["kind"] == kind and c["quota"] < 100 and c["rel"]]
    if ctl:
        verdict += f"; without MPS {ctl[0]['quota']} % took {ctl[0]['rel']:.2f}x (expected 1)"
    return verdict


def vmm_verdict(runs: list[dict[str, Any]]) -> str:
    """One sentence over the MPS pairs: same address, data, arena."""
    mps = [r for r in runs if r["mps"] and r.get("result")]
    done = [r["result"] for r in mps if r["result"].get("same_address") is not None]
    if not done:
        return "no verdict: no vmm_probe run under MPS got as far as the child's reservation"
    same = sum(1 for d in done if d["same_address"])
    data = sum(1 for d in done if d.get("data_ok"))
    arena = sum(1 for d in done if d.get("arena_same_address"))
    setups = sorted(d["setup_us_median"] for d in done if d.get("setup_us_median") is not None)
    text = (f"same address in {same}/{len(done)} MPS pairs, data ok in {data}/{len(done)}, "
            f"pre-agreed arena granted to both in {arena}/{len(done)}")
    if setups:
        text += f"; import+map+access median {setups[len(setups) // 2]:.0f} µs"
    return text


def probe_env(base: dict[str, str], pct: int | None, mps_env: dict[str, str] | None,
              no_mps_dir: str | None) -> dict[str, str]:
    """A probe's environment: ours without any inherited percentage, plus its own
    percentage and either the MPS daemon's directories or an empty pipe dir."""
    env = {k: v for k, v in base.items() if k != PCT_ENV}
    if pct is not None:
        env[PCT_ENV] = str(pct)
    if mps_env:
        env.update(mps_env)
    elif no_mps_dir:
        env[PIPE_ENV] = no_mps_dir           # nothing listens there: the client runs without MPS
        env[LOG_ENV] = no_mps_dir
    return env


def quota_cmd(reps: int, warmup: int, fixed: dict[str, int] | None, target_ms: int,
              mem: bool = False, mb: int = 512) -> list[str]:
    cmd = [str(QUOTA_PROBE), "--n", str(reps), "--warmup", str(warmup)]
    if mem:
        cmd += ["--mem", "--mb", str(mb)]
    if fixed:
        if "iters" in fixed and not mem:
            cmd += ["--iters", str(fixed["iters"])]
        if "grid" in fixed:
            cmd += ["--grid", str(fixed["grid"])]
    elif not mem:
        cmd += ["--target-ms", str(target_ms)]
    return cmd


def vmm_cmd(child_pct: int, reps: int, mb: int, child_pipe: str | None = None) -> list[str]:
    """child_pipe: the child's own MPS pipe dir (the parent stays outside MPS)."""
    return [str(VMM_PROBE), "--child-pct", str(child_pct), "--reps", str(reps), "--mb", str(mb),
            *(["--child-mps-pipe", child_pipe] if child_pipe else [])]


# ---------------------------------------------------------------- running

@dataclass
class ProbeRun:
    cmd: list[str]
    rc: int | None                       # None: never started (budget spent, exec failed)
    wall_s: float = 0.0
    result: dict[str, Any] | None = None
    stderr_tail: str = ""
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"cmd": self.cmd, "rc": self.rc, "wall_s": round(self.wall_s, 3),
                "result": self.result, "stderr_tail": self.stderr_tail, "error": self.error}


def run_probe(cmd: list[str], env: dict[str, str], timeout: float) -> ProbeRun:
    """Run one probe in its own process group (vmm_probe has a child of its own:
    on timeout the whole group is killed, by its id)."""
    t0 = time.monotonic()
    try:
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)
    except OSError as e:
        return ProbeRun(cmd, None, error=f"cannot start: {e}")
    try:
        out, err = p.communicate(timeout=timeout)
        error = None
    except BaseException as e:          # timeout, Ctrl-C: never leave the group running
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
        error = f"killed after {timeout:.0f} s"
    res = parse_probe_output(out)
    if res is None and error is None:
        error = f"no JSON line from the probe (exit {p.returncode})"
    return ProbeRun(cmd, p.returncode, time.monotonic() - t0, res,
                    "\n".join(err.splitlines()[-8:]), error)


class Budget:
    def __init__(self, seconds: float, per_run: float):
        self.end = time.monotonic() + seconds
        self.per_run = per_run

    def left(self) -> float:
        return self.end - time.monotonic()

    def timeout(self) -> float | None:
        """Seconds the next run may take, or None: do not start it."""
        left = self.left()
        return None if left < MIN_RUN_S else min(self.per_run, left)


def detect_driver() -> tuple[dict[str, Any] | None, list[str]]:
    """The driver and GPUs, from pynvml or nvidia-smi; (None, why) without a driver."""
    why = []
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            drv = pynvml.nvmlSystemGetDriverVersion()
            gpus = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                gpus.append({"name": _s(pynvml.nvmlDeviceGetName(h)),
                             "compute_mode": pynvml.nvmlDeviceGetComputeMode(h)})
            return {"source": "pynvml", "driver": _s(drv), "gpus": gpus}, why
        finally:
            pynvml.nvmlShutdown()
    except ImportError:
        why.append("pynvml not installed")
    except Exception as e:              # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        why.append(f"pynvml: {e}")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        why.append("nvidia-smi not on PATH")
        return None, why
    try:
        r = subprocess.run([smi, "--query-gpu=name,driver_version,compute_mode",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        why.append(f"nvidia-smi: {e}")
        return None, why
    if r.returncode != 0 or not r.stdout.strip():
        why.append(f"nvidia-smi exit {r.returncode}: {(r.stderr or r.stdout).strip()[:200]}")
        return None, why
    gpus = [dict(zip(("name", "driver", "compute_mode"), (f.strip() for f in line.split(","))))
            for line in r.stdout.strip().splitlines()]
    return {"source": "nvidia-smi", "driver": gpus[0].get("driver"), "gpus": gpus}, why


def with_driver_bins(path: str, dirs: tuple[str, ...] = DRIVER_BIN_DIRS) -> str:
    """$PATH plus the driver's bin dirs that exist and are not on it yet."""
    parts = path.split(os.pathsep) if path else []
    extra = [d for d in dirs if d not in parts and Path(d, "nvidia-cuda-mps-control").exists()]
    return os.pathsep.join(parts + extra)


def cudart_dir(candidates: tuple[str, ...] | None = None) -> str | None:
    """A directory to add to LD_LIBRARY_PATH so that the probes (built with
    -cudart shared) find libcudart.so.13, or None when the loader finds it as is."""
    try:
        ctypes.CDLL("libcudart.so.13")
        return None
    except OSError:
        pass
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for d in candidates or (f"{home}/lib64", f"{home}/lib", f"{home}/targets/x86_64-linux/lib",
                            "/usr/local/cuda/lib64", "/usr/local/cuda/lib"):
        if Path(d, "libcudart.so.13").exists():
            return d
    return None


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def load_mps() -> tuple[type, type]:
    """processpool.mps's Mps and MpsError.  When the package cannot be imported
    (its __init__ pulls in pyzmq, which a GPU machine's python3 may lack), the
    module is loaded from its file: it needs only the standard library."""
    try:
        from processpool.mps import Mps, MpsError
        return Mps, MpsError
    except ImportError:
        spec = importlib.util.spec_from_file_location("colocate_mps", REPO / "processpool" / "mps.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.Mps, mod.MpsError


# ---------------------------------------------------------------- the plan

@dataclass
class Plan:
    quotas: list[int]
    pairs: list[tuple[int, int]]
    reps: int = 30
    warmup: int = 3
    target_ms: int = 5
    mem: bool = True
    mem_mb: int = 512
    vmm_reps: int = 20
    vmm_mb: int = 64
    per_run_s: float = 90.0
    budget_s: float = 420.0


@dataclass
class Results:
    data: dict[str, Any] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)

    def add_run(self, section: str, run: ProbeRun, **facts: Any) -> None:
        self.data.setdefault(section, []).append({**facts, **run.as_dict()})
        res = run.result or {}
        if run.rc != 0:
            what = run.error or res.get("error") or res.get("child_error") or f"exit {run.rc}"
            self.failed.append(f"{section} {facts}: {what}")
        elif res.get("data_ok") is False:
            # a verdict (exit 0), but memory shared this way is not safe to use
            self.failed.append(f"{section} {facts}: data mismatch ({res.get('mismatches')} words)")


def _fixed_from(run: ProbeRun) -> dict[str, int] | None:
    """Iterations and grid of a successful calibration run."""
    res = run.result or {}
    if run.rc == 0 and res.get("grid"):
        fixed = {"grid": int(res["grid"])}
        if res.get("iters"):
            fixed["iters"] = int(res["iters"])
        return fixed
    return None


def _timed(budget: Budget, res: Results, section: str, runner: Runner, cmd: list[str],
           env: dict[str, str], **facts: Any) -> ProbeRun:
    t = budget.timeout()
    run = ProbeRun(cmd, None, error="skipped: time budget spent") if t is None else runner(cmd, env, t)
    res.add_run(section, run, **facts)
    r = run.result or {}
    what = (f"median {r['median_ms']:.3f} ms" if r.get("median_ms") else
            f"{r['verdict']}" if r.get("verdict") else "")
    err = run.error or r.get("error") or r.get("child_error")
    print(f"  {section} {facts}: exit {run.rc} {what}{'; ' + err if err else ''}", flush=True)
    return run


def measure(plan: Plan, res: Results, runner: Runner, mps_factory: Callable[[], Any],
            base_env: dict[str, str], no_mps_dir: str, log: Callable[[str], None]) -> None:
    """Every run of the plan; stops the MPS daemon it started whatever happens."""
    budget = Budget(plan.budget_s, plan.per_run_s)
    fixed: dict[str, int] | None = None
    fixed_mem: dict[str, int] | None = None

    log("without MPS: calibration at 100 %, control at 10 %, vmm 100/100")
    for q in (100, 10):
        env = probe_env(base_env, q, None, no_mps_dir)
        run = _timed(budget, res, "quota_no_mps", runner,
                     quota_cmd(plan.reps, plan.warmup, fixed, plan.target_ms), env,
                     quota=q, mps=False, kind="compute")
        fixed = fixed or _fixed_from(run)
    res.data["calibration"] = fixed
    _timed(budget, res, "vmm", runner, vmm_cmd(100, plan.vmm_reps, plan.vmm_mb),
           probe_env(base_env, 100, None, no_mps_dir), parent_pct=100, child_pct=100, mps=False)

    mps = mps_factory()
    try:
        try:
            res.data["mps"] = {"status": mps.ensure(), "pipe_dir": str(mps.pipe_dir),
                               "log_dir": str(mps.log_dir), "started_by_us": bool(mps.started)}
        except Exception as e:          # MpsError: no daemon binary, start failed, ...
            res.data["mps"] = {"error": str(e)}
            res.failed.append(f"MPS: {e}")
            log(f"MPS unavailable: {e}; the MPS runs are skipped")
            return
        log(res.data["mps"]["status"])
        mps_env = mps.env()
        for p, c in plan.pairs:
            _timed(budget, res, "vmm", runner, vmm_cmd(c, plan.vmm_reps, plan.vmm_mb),
                   probe_env(base_env, p, mps_env, None), parent_pct=p, child_pct=c, mps=True)
        # what colocate does: an app outside MPS hands its memory to a pool
        # worker inside it (mps "app->worker")
        _timed(budget, res, "vmm", runner,
               vmm_cmd(50, plan.vmm_reps, plan.vmm_mb, mps_env.get(PIPE_ENV)),
               probe_env(base_env, 100, None, no_mps_dir), parent_pct=100, child_pct=50,
               mps="app->worker")
        for q in plan.quotas:
            run = _timed(budget, res, "quota", runner,
                         quota_cmd(plan.reps, plan.warmup, fixed, plan.target_ms),
                         probe_env(base_env, q, mps_env, None), quota=q, mps=True, kind="compute")
            fixed = fixed or _fixed_from(run)
        if plan.mem:
            for q in plan.quotas:
                run = _timed(budget, res, "quota_mem", runner,
                             quota_cmd(plan.reps, plan.warmup, fixed_mem, plan.target_ms, True,
                                       plan.mem_mb),
                             probe_env(base_env, q, mps_env, None), quota=q, mps=True, kind="memory")
                fixed_mem = fixed_mem or _fixed_from(run)
    finally:
        if getattr(mps, "started", False):
            res.data.setdefault("mps", {})["log_tail"] = _mps_logs(mps)
        mps.stop()
        log("MPS daemon stopped" if res.data.get("mps", {}).get("started_by_us") else
            "MPS daemon left as found")


def _mps_logs(mps: Any) -> dict[str, str]:
    out = {}
    for name in ("control.log", "server.log"):
        try:
            lines = (Path(mps.log_dir) / name).read_text(errors="replace").splitlines()
            out[name] = "\n".join(lines[-15:])
        except OSError:
            pass
    return out


def summarise(res: Results) -> None:
    rows = [r for sec in ("quota_no_mps", "quota", "quota_mem") for r in res.data.get(sec, [])]
    curve = quota_curve(rows)
    res.data["curve"] = curve
    res.data["verdicts"] = {"quota": quota_verdict(curve, "compute"),
                            "quota_memory": quota_verdict(curve, "memory"),
                            "vmm": vmm_verdict(res.data.get("vmm", []))}


# ---------------------------------------------------------------- output

def _f(v: Any, fmt: str = "{:.3f}") -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    return fmt.format(v) if isinstance(v, (int, float)) else str(v)


def table_rows(res: Results) -> tuple[list[list[str]], list[list[str]]]:
    """Rows of the quota table and of the vmm table, as strings."""
    q = []
    for c in res.data.get("curve", []):
        q.append([c["kind"], "yes" if c["mps"] else "no", str(c["quota"]), _f(c["sm_count"], "{}"),
                  _f(c["exec_affinity_sm"], "{}"), _f(c["median_ms"]), _f(c["p10_ms"]), _f(c["p90_ms"]),
                  _f(c["rel"], "{:.2f}"), _f(c["ideal"], "{:.2f}"), _f(c["effective_pct"], "{:.0f}"),
                  _f(c["gbps"], "{:.0f}"), _f(c["check_ok"]), (c["error"] or "")[:60]])
    v = []
    for r in res.data.get("vmm", []):
        d = r.get("result") or {}
        v.append([f"{r['parent_pct']}/{r['child_pct']}",
                  r["mps"] if isinstance(r["mps"], str) else "yes" if r["mps"] else "no",
                  f"{_f(d.get('mps_enabled'))}/{_f(d.get('child_mps_enabled'))}",
                  _f(d.get("same_address")), _f(d.get("data_ok")), _f(d.get("arena_same_address")),
                  _f(d.get("arena_data_ok")), _f(d.get("setup_us_first"), "{:.0f}"),
                  _f(d.get("setup_us_median"), "{:.0f}"), str(r.get("rc")),
                  (d.get("error") or d.get("child_error") or r.get("error") or "")[:60]])
    return q, v


Q_HEAD = ["kind", "MPS", "quota %", "SMs seen", "exec-aff SMs", "median ms", "p10", "p90",
          "x t(100)", "ideal", "effective %", "GB/s", "check", "error"]
V_HEAD = ["parent/child %", "MPS", "MPS on (p/c)", "same address", "data ok", "arena same",
          "arena data ok", "setup µs first", "setup µs median", "rc", "error"]


def print_tables(res: Results) -> None:
    q, v = table_rows(res)
    show_tables([("MPS quota curve (time relative to 100 %)", Q_HEAD, q),
                 ("VMM same-address mapping between processes", V_HEAD, v)], width=200)
    logs = res.data.get("mps", {}).get("log_tail") or {}
    if logs and res.failed:
        for name, text in logs.items():
            print(f"--- last lines of the MPS {name}\n{text}")
    for k, text in res.data.get("verdicts", {}).items():
        print(f"{k}: {text}")


def show_tables(tables: list[tuple[str, list[str], list[list[str]]]], width: int) -> None:
    """(title, header, rows) tables: with rich where it is installed (the GPU
    image may lack it), else as plain ' | '-separated lines."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for title, head, rows in tables:
            print(f"\n{title}\n" + " | ".join(head))
            for row in rows:
                print(" | ".join(row))
        return
    con = Console(width=width)
    for title, head, rows in tables:
        t = Table(title=title)
        for h in head:
            t.add_column(h, overflow="fold")
        for row in rows:
            t.add_row(*row)
        con.print(t)


def write_json(path: Path | None, data: dict[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(path)


# ---------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="bench/gpu_pool.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, help="write every result to this JSON file")
    ap.add_argument("--quotas", type=parse_quotas, default=parse_quotas(DEFAULT_QUOTAS),
                    help=f"MPS percentages for the quota curve (default {DEFAULT_QUOTAS}; 100 is added)")
    ap.add_argument("--pairs", type=parse_pairs, default=parse_pairs(DEFAULT_PAIRS),
                    help=f"PARENT/CHILD percentages for gpu-vmm_probe under MPS (default {DEFAULT_PAIRS})")
    ap.add_argument("--reps", type=int, default=30, help="timed launches per quota (default 30)")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up launches per quota (default 3)")
    ap.add_argument("--target-ms", type=int, default=5,
                    help="calibrate the compute kernel to this many ms per launch at 100 %% (default 5)")
    ap.add_argument("--no-mem", action="store_true", help="skip the memory-bound curve")
    ap.add_argument("--mem-mb", type=int, default=512, help="MiB per buffer of the memory-bound kernel")
    ap.add_argument("--vmm-reps", type=int, default=20, help="timed re-imports in the vmm child (default 20)")
    ap.add_argument("--vmm-mb", type=int, default=64, help="MiB shared by gpu-vmm_probe (default 64)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="start no run after this many seconds (default 420: fits a 10-minute command)")
    ap.add_argument("--per-run-s", type=float, default=90.0, help="kill a probe after this long (default 90)")
    ap.add_argument("--runtime-dir", type=Path,
                    help="where the MPS daemon's pipe and log dirs go (default: a new private dir in /tmp)")
    return ap


def main(argv: list[str] | None = None, runner: Runner = run_probe,
         driver: Callable[[], tuple[dict[str, Any] | None, list[str]]] = detect_driver,
         mps_factory: Callable[[Path], Any] | None = None) -> int:
    args = build_parser().parse_args(argv)
    res = Results({"tool": "bench/gpu_pool.py", "host": socket.gethostname(),
                   "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": sys.argv[1:] if argv is None else argv})
    info, why = driver()
    if info is None:
        print(f"{NO_DRIVER} ({'; '.join(why)})")
        res.data["verdicts"] = {"all": NO_DRIVER, "why": why}
        write_json(args.out, res.data)
        return 2
    res.data["driver"] = info
    os.environ["PATH"] = with_driver_bins(os.environ.get("PATH", ""))
    libdir = cudart_dir()
    if libdir:                      # the loader would not find it: the probes could not start
        old = os.environ.get("LD_LIBRARY_PATH")
        os.environ["LD_LIBRARY_PATH"] = libdir + (os.pathsep + old if old else "")
        res.data["ld_library_path_added"] = libdir
    missing = [str(p) for p in (QUOTA_PROBE, VMM_PROBE) if not p.exists()]
    if missing and runner is run_probe:
        print(f"missing {', '.join(missing)}: build them first with "
              f"`make bench/bin/gpu-quota_probe bench/bin/gpu-vmm_probe` (or `make build`)")
        return 1
    plan = Plan(args.quotas, args.pairs, args.reps, args.warmup, args.target_ms, not args.no_mem,
                args.mem_mb, args.vmm_reps, args.vmm_mb, args.per_run_s, args.budget_s)
    res.data["plan"] = {k: v for k, v in vars(plan).items()}
    rundir = args.runtime_dir or Path(tempfile.mkdtemp(prefix="cgpu-", dir="/tmp"))
    no_mps = rundir / "no-mps"
    no_mps.mkdir(parents=True, exist_ok=True)
    if mps_factory is None:
        Mps, _ = load_mps()
        base = {k: v for k, v in os.environ.items() if k != PCT_ENV}
        mps_factory = lambda d: Mps(d, env=base)       # noqa: E731
    base_env = dict(os.environ)
    t0 = time.monotonic()
    try:
        measure(plan, res, runner, lambda: mps_factory(rundir), base_env, str(no_mps),
                lambda s: print(f"[{time.monotonic() - t0:6.1f} s] {s}", flush=True))
    except KeyboardInterrupt:
        res.failed.append("interrupted")
        print("interrupted: writing what was measured")
    finally:
        if args.runtime_dir is None:        # ours, and the daemon in it is stopped
            shutil.rmtree(rundir, ignore_errors=True)
        res.data["elapsed_s"] = round(time.monotonic() - t0, 1)
        summarise(res)
        res.data["failed"] = res.failed
        write_json(args.out, res.data)
    print_tables(res)
    if res.failed:
        print("failed:\n  " + "\n  ".join(res.failed))
    if args.out:
        print(f"wrote {args.out}")
    return 1 if res.failed else 0


def _term(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt        # SIGTERM: unwind, stop MPS, write what we have


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _term)
    sys.exit(main())
