"""Profiling on a real GPU: the GPU half of `colocate profile` (predictors/profile.py).

When an NVIDIA driver answers (gpu_present()) the same runs
are made without simgpu: durations are the trace's, i.e. CUDA event times
on the device.  A quota below 100 only means something under MPS, so the
MPS control daemon is found or started (processpool/mps.py, pipe and log
dirs under a private runtime dir) and stopped again if we started it.
Without MPS only quota 100 can be profiled: asking for another quota is an
error (GpuUnavailable, exit 1) rather than a warning, so that a profile never
silently lacks the quotas that were asked for.  When `ncu` is on PATH (or
$COLOCATE_NCU names it) each app configuration runs a second time under
`ncu --csv` with the metrics of NCU_METRICS; its per-kernel rows
(predictors/counters.py) join the first run's trace tasks in order, names
checked, a library task summing its kernels.  Samples carry their origin:
src "profile:gpu:ncu:mps" (or :trace-only, :no-mps).  Without ncu a sample
has duration only; training a target skips samples without it.  Services
(tonic:NET) are profiled trace-only on a GPU (ncu around a long-running
service is not done yet).  The store's device is the GPU's name.

"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from predictors import counters
from predictors import profile as P
from processpool import mps
from shim import launcher, rundir

# --- a real GPU ------------------------------------------------------------------
#
# Metric names: Nsight Compute's "Metrics Structure" (Profiling Guide,
# docs.nvidia.com/nsight-compute/ProfilingGuide) names counters
# unit__counter.rollup[.submetric]; the nvprof transition table maps nvprof's
# `ipc` to sm__inst_executed.avg.per_cycle_active and its DRAM throughputs to
# dram__bytes_{read,write}.sum.per_second, whose sum is dram__bytes.sum.per_second;
# gpu__time_duration.sum is the kernel's duration.  (Checked against those
# pages' text as far as our doc search reached; to be confirmed with
# `ncu --query-metrics` on the GPU machine.)
NCU_BW = "dram__bytes.sum.per_second"           # bytes/second after conversion
NCU_IPC = "sm__inst_executed.avg.per_cycle_active"
NCU_TIME = "gpu__time_duration.sum"             # seconds after conversion
NCU_METRICS = (NCU_BW, NCU_IPC, NCU_TIME)


class GpuUnavailable(P.ProfileError):
    """The GPU cannot be profiled as asked (MPS missing for quotas < 100)."""


@dataclass
class Gpu:
    """How runs are made on a real GPU."""
    ncu: str | None                 # ncu's path: counters; None: trace-only
    mps: bool                       # an MPS control daemon serves our clients
    mps_env: dict[str, str] = field(default_factory=dict)
    note: str = ""                  # what GpuSession found, for the user

    def src(self, counters: bool | None = None) -> str:
        c = bool(self.ncu) if counters is None else counters
        return f"profile:gpu:{'ncu' if c else 'trace-only'}:{'mps' if self.mps else 'no-mps'}"

    def env(self, name: str, quota: int, tmp: Path, base: dict[str, str] | None = None,
            trace: str = "trace.jsonl") -> dict[str, str]:
        """An app's environment on this GPU (gpu_env)."""
        return gpu_env(name, quota, tmp, self, base, trace)

    def run_app(self, t: P.Target, cmd: list[str], inp: str, quota: int, rep: int, tmp: Path,
                timeout: float) -> tuple[list[dict[str, Any]], int]:
        """One configuration of a batch program on this GPU (run_app_gpu)."""
        return run_app_gpu(t, cmd, inp, quota, rep, tmp, timeout, self)


def find_ncu(env: dict[str, str] | None = None) -> str | None:
    """$COLOCATE_NCU (must be executable), else ncu on PATH, else None."""
    e = os.environ if env is None else env
    given = e.get("COLOCATE_NCU")
    if given:
        exe = given if "/" in given else shutil.which(given, path=e.get("PATH"))
        if exe is None or not os.access(exe, os.X_OK):
            raise P.ProfileError(f"COLOCATE_NCU={given!r} is not an executable")
        return exe
    return shutil.which("ncu", path=e.get("PATH"))


def gpu_device_name(env: dict[str, str] | None = None) -> str:
    """The GPU's name (NVML, else nvidia-smi), so GPU and simgpu profiles
    never share a store directory; "cuda" when neither answers."""
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        finally:
            pynvml.nvmlShutdown()
        n = n.decode() if isinstance(n, bytes) else str(n)
        if n.strip():
            return n.strip()
    except Exception:
        pass
    e = dict(os.environ if env is None else env)
    smi = shutil.which("nvidia-smi", path=e.get("PATH"))
    if smi:
        try:
            r = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], env=e,
                               capture_output=True, text=True, timeout=20)
            first = r.stdout.strip().splitlines()[0].strip() if r.stdout.strip() else ""
            if r.returncode == 0 and first:
                return first
        except (OSError, subprocess.TimeoutExpired):
            pass
    return "cuda"


class GpuSession:
    """`with GpuSession(quotas) as gpu:` MPS found or started (and stopped
    on exit if ours), ncu found.  Raises GpuUnavailable when MPS cannot be
    had and a quota below 100 is asked for."""

    def __init__(self, quotas: Sequence[int], runtime_dir: Path | None = None,
                 env: dict[str, str] | None = None):
        self.quotas = list(quotas)
        self.env = dict(os.environ if env is None else env)
        self.runtime_dir = runtime_dir
        self._tmp: tempfile.TemporaryDirectory | None = None
        self.mps: Any = None

    def __enter__(self) -> Gpu:
        if self.runtime_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="colocate-gpuprof-")
            self.runtime_dir = Path(self._tmp.name)
        ncu = find_ncu(self.env)
        m = mps.Mps(self.runtime_dir, self.env)
        try:
            note = m.ensure()
        except mps.MpsError as e:
            if any(q != 100 for q in self.quotas):
                self._cleanup()
                raise GpuUnavailable(
                    f"MPS is not available ({e}); a quota below 100 % means nothing "
                    f"without it.  Profile with --quotas 100, or make "
                    f"nvidia-cuda-mps-control available") from None
            return Gpu(ncu, False, {}, f"no MPS ({e}): quota 100 only")
        self.mps = m
        return Gpu(ncu, True, m.env(), note)

    def __exit__(self, *exc: Any) -> None:
        if self.mps is not None:
            self.mps.stop()
            self.mps = None
        self._cleanup()

    def _cleanup(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None


def gpu_env(name: str, quota: int, tmp: Path, gpu: Gpu,
            base: dict[str, str] | None = None, trace: str = "trace.jsonl") -> dict[str, str]:
    """The app's environment on a real GPU: the shim without a controller,
    the quota, MPS's pipe/log dirs, a trace.  Nothing of simgpu is added."""
    src = dict(os.environ if base is None else base)
    clean = {k: v for k, v in src.items()
             if not k.startswith("COLOCATE_") and k not in (
                 "LD_PRELOAD", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}
    rd = rundir.ensure(tmp / "run")
    env = launcher.app_env(launcher.AppSpec([name], name), rd, "cuda", clean)
    env.update(gpu.mps_env)
    env.update(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(quota), COLOCATE_TRACE=str(tmp / trace),
               COLOCATE_QUIET="1")
    return env


def counter_targets(tasks: Sequence[P.Task], rows: Sequence[Any]) -> list[dict[str, float]]:
    """Bandwidth (GB/s) and IPC per task from ncu's kernel rows, joined in
    order per process (the k-th process of the trace by pid with the k-th
    of ncu's by pid: the second run's pids differ).  A kernel task takes the
    next row (same name, checked); a library task with kernels=k the next
    k rows: bandwidth = sum(bytes) / sum(time), IPC their time-weighted mean
    (per active cycle, as ncu's metric)."""
    by_pid: dict[int, list[Any]] = {}
    for r in rows:
        by_pid.setdefault(r.pid, []).append(r)
    tpids = sorted({int(t.rec["pid"]) for t in tasks})
    if len(tpids) != len(by_pid):
        raise P.RunFailed(f"ncu profiled kernels of {len(by_pid)} process(es), the trace has "
                        f"tasks of {len(tpids)}")
    pid_map = dict(zip(tpids, sorted(by_pid)))
    pos: dict[int, int] = {}
    out: list[dict[str, float]] = []
    for t in tasks:
        r = t.rec
        pid = pid_map[int(r["pid"])]
        mine_all = by_pid[pid]
        i = pos.get(pid, 0)
        n = 1 if r["kind"] == "kernel" else int(r.get("kernels") or 0)
        mine = mine_all[i:i + n]
        pos[pid] = i + n
        if len(mine) < n:
            raise P.RunFailed(f"task {r['name']} (seq {r['seq']}) has no ncu kernel row left "
                            f"({len(mine_all)} in all)")
        if r["kind"] == "kernel" and mine[0].name != r.get("name"):
            raise P.RunFailed(f"trace task {r['name']} (seq {r['seq']}) met ncu kernel "
                            f"{mine[0].name} (ID {mine[0].id}); was ncu run with "
                            f"--print-kernel-base mangled?")
        out.append(_sum_counters(mine))
    extra = {p: len(v) - pos.get(p, 0) for p, v in by_pid.items() if len(v) > pos.get(p, 0)}
    if extra:
        raise P.RunFailed(f"ncu profiled kernels the trace does not have: {extra} left over")
    return out


def _sum_counters(kernels: Sequence[Any]) -> dict[str, float]:
    """One task's figures from its kernels' rows; a figure any kernel lacks
    (n/a, or no time to weigh it by) is left out rather than guessed."""
    secs = [k.metrics.get(NCU_TIME) for k in kernels]
    if not kernels or any(s is None or not s > 0 for s in secs):
        return {}
    tot = sum(secs)
    tg: dict[str, float] = {}
    bws = [k.metrics.get(NCU_BW) for k in kernels]
    if all(b is not None for b in bws):
        tg["bandwidth_gbs"] = sum(b * s for b, s in zip(bws, secs)) / tot / 1e9
    ipcs = [k.metrics.get(NCU_IPC) for k in kernels]
    if all(v is not None for v in ipcs) and any(v > 0 for v in ipcs):
        tg["ipc"] = sum(v * s for v, s in zip(ipcs, secs)) / tot
    return tg


def ncu_cmd(ncu: str, csv_path: Path, cmd: Sequence[str]) -> list[str]:
    """ncu around cmd: CSV of our metrics into csv_path (--log-file keeps the
    program's own stdout out of it), mangled names as the trace has them,
    base units, clocks left as they are so rates match normal running."""
    return [ncu, "--csv", "--print-units", "base", "--print-kernel-base", "mangled",
            "--clock-control", "none", "--metrics", ",".join(NCU_METRICS),
            "--log-file", str(csv_path), *cmd]


def gpu_present() -> bool:
    """A real NVIDIA driver answers (then the profile would not be simgpu's)."""
    return launcher.cuda_usable()


def profile_store(root: Path | None = None) -> Any:
    """The sample store `colocate profile` writes on this machine: under root
    (default: the user's), in the directory of the GPU's name when a driver
    answers, else simgpu's."""
    from predictors.store import Store, default_root
    return Store(root if root is not None else default_root(),
                 gpu_device_name() if gpu_present() else P.device_name())


def profile_here(targets: Sequence[P.Target], quotas: Sequence[int], reps: int, store: Any,
                 timeout: float = 300.0, progress: bool = True,
                 note: Callable[[Gpu], None] = lambda gpu: None) -> P.Summary:
    """`colocate profile`'s runs on this machine: on the GPU when a driver
    answers (a GpuSession: MPS for quotas below 100, ncu's counters when
    found; note(gpu) hears which), else on simgpu.  Raises GpuUnavailable
    (MPS missing for a quota below 100) and ProfileError."""
    if not gpu_present():
        return P.profile(targets, quotas, reps, store, timeout=timeout, progress=progress)
    with GpuSession(list(quotas)) as gpu:
        note(gpu)
        return P.profile(targets, quotas, reps, store, timeout=timeout, progress=progress, gpu=gpu)


def run_app_gpu(t: P.Target, cmd: list[str], inp: str, quota: int, rep: int, tmp: Path,
                timeout: float, gpu: Gpu) -> tuple[list[dict[str, Any]], int]:
    """One configuration on a GPU: a traced run for durations, then (with
    ncu) a second one under ncu for bandwidth and IPC."""
    env = gpu_env(Path(cmd[0]).name, quota, tmp, gpu)
    res = P.run_cmd(cmd, env, timeout)
    h2d = P.stats_h2d(res.stdout)
    tasks = P.trace_tasks(P.read_jsonl(tmp / "trace.jsonl"))
    if not tasks:
        raise P.RunFailed(f"no task in the trace\n{P.tail_of(res.stderr + res.stdout)}")
    extra: list[dict[str, float]] = [{} for _ in tasks]
    if gpu.ncu:
        csv_path = tmp / "ncu.csv"
        nenv = gpu_env(Path(cmd[0]).name, quota, tmp, gpu, trace="trace-ncu.jsonl")
        nres = P.run_cmd(ncu_cmd(gpu.ncu, csv_path, cmd), nenv, timeout)
        text = csv_path.read_text(errors="replace") if csv_path.exists() else nres.stdout
        try:
            rows = counters.parse(text)
        except counters.CountersError as e:
            raise P.RunFailed(f"ncu output: {e}") from None
        extra = counter_targets(tasks, rows)
    out, dropped = [], 0
    for i, (tk, occ, ex) in enumerate(zip(tasks, P.occurrences(tasks), extra)):
        smp = P.task_sample(tk, f"{t.label}|{inp}|q{quota}|{i}#r{rep}", h2d or 0, quota, occ,
                          duration_only=True)
        if smp is None:
            dropped += 1
            continue
        smp["t"].update(ex)
        smp["src"] = gpu.src()
        out.append(smp)
    return out, dropped
