"""Solo-run profiling into the predictors' sample store (`colocate profile`).

(`colocate profile --groups N tonic:NET ...` co-runs services instead and
samples Abacus operator groups: predictors/groups.py.)

Each target runs alone on simgpu under the shim, once per input x SM quota x
repetition, with

    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=q   the quota (read once, as MPS does)
    SIMGPU_TIMESCALE=0                    modelled time is not slept
    SIMGPU_DIR=<private>                  a device of its own: nothing shares it
    COLOCATE_TRACE=<tmp>                  one line per task, device times
    SIMGPU_LAUNCH_LOG=<tmp>               one line per kernel: flops, bytes, SMs
    LD_PRELOAD=libcolocate.so             (no controller: the app runs natively)

Targets: a Rodinia app by name (bench/bin/NAME, an input is an argument
set), a Tonic service "tonic:NET" (one service process per quota, an input
is a query size, a repetition is one more query), or any command.

The join, per process: trace records in seq order; a kernel task takes the
next launch-log line (same name, checked), a library task with kernels=k
the next k lines (their flops and bytes summed).  Per task:

    duration_us    the trace's dur_us (two events on the task's stream)
    bandwidth_gbs  bytes / duration_us
    ipc            warp instructions per cycle per SM the kernels could
                   fill: (flops / 32) / sum(sms_i * dur_i * 1.755 GHz),
                   dur_i a kernel's run time after its launch overhead.
                   An ASSUMPTION: one warp instruction per 32 flops (one
                   FP op per thread), at the H100's boost clock; simgpu
                   knows no instruction counts.  At simgpu's peak
                   (500 GFLOP/s per SM) this reads 8.9, above a real SM's
                   4 issue slots, as an FMA counts two flops: compare IPCs
                   with each other, not with hardware limits.

A task's input_bytes is its run's H2D bytes (the STATS line of a bench
program; 0 for a command that prints none), or its query's input bytes
(query size x the service's bytes per item) for a service.

Per query (services): duration_us is the device time the service reports
(CUDA events from its H2D copy to its D2H copy); pcie_us is its H2D+D2H
bytes over simgpu's PCIe rate (SIMGPU_PCIE_GBS, default 25 GB/s).  Every
figure here comes from simgpu's device model: samples are labelled
src="profile:simgpu-model".

On a real GPU (`Gpu`, predictors/profile_gpu.py) the same runs are made
without simgpu; the GPU half calls into this module, never the reverse.

Keys: "<target>|<input>|q<quota>|<task index>#r<rep>" for tasks (the index
within the run, or within the query for services) and
"<target>|<input>|q<quota>#r<rep>" for queries, so that train's
--split config keeps the repetitions of one task together.  A run's samples
are appended in one go, tasks before its query: a configuration with a
stored sample (a query sample, for services) is complete and skipped on a
rerun.
"""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from predictors import schema as S
from shim import launcher, paths, rundir

if TYPE_CHECKING:
    from predictors.profile_gpu import Gpu

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "bench" / "bin"
SRC = "profile:simgpu-model"
CLOCK_HZ = 1.755e9              # the IPC's cycles (an H100's boost clock)
WARP = 32                       # flops per warp instruction (assumed)
QUOTAS = tuple(range(10, 101, 10))
QUERY_ID0 = 1_000_001           # our query ids: clear of ids the shim infers

# Built-in input ladders: small enough for simgpu's CPU twins (a run takes
# well under a second), large enough that grids grow with the input.
RODINIA: dict[str, list[str]] = {
    "hotspot": ["--size 64 --iters 4", "--size 128 --iters 4", "--size 256 --iters 4"],
    "bfs": ["--size 5000", "--size 20000", "--size 50000"],
    "btree": ["--size 20000 --queries 300 --ranges 200",
              "--size 50000 --queries 1000 --ranges 500"],
    "pathfinder": ["--cols 3000 --rows 50 --pyramid 10", "--cols 10000 --rows 50 --pyramid 10"],
    "nw": ["--size 128", "--size 256"],
    "lud": ["--size 256", "--size 512"],
    "myocyte": ["--cells 500 --time 15 --launch-ms 2", "--cells 2000 --time 15 --launch-ms 2"],
    "lavamd": ["--boxes 3 --par 20", "--boxes 4 --par 20"],
}
# per net: query sizes and the service options that keep its twins fast
TONIC: dict[str, tuple[list[str], str]] = {
    "dig": (["1", "4", "16"], ""),
    "imc": (["1", "2"], "--width 0.25 --res 67"),
    "face": (["1", "2"], "--width 0.25 --res 76"),
    "pos": (["8", "32", "128"], "--width 0.5"),
    "chk": (["8", "32", "128"], "--width 0.5"),
    "ner": (["8", "32", "128"], "--width 0.5"),
    # Camelot's Table I stages (bench/camelot/suite.py NETS), at the width a
    # live pipeline runs them on simgpu (scale 0.01: width 0.1)
    "fsr": (["1", "2", "4"], "--width 0.1"),
    "vgg": (["1", "2", "4"], "--width 0.1"),
    "cap": (["1", "2", "4"], "--width 0.1"),
    "sem": (["30"], "--width 0.1"),
    "gan": (["1", "2", "4"], "--width 0.1"),
    "bert": (["128"], "--width 0.1"),
    "nmt": (["30"], "--width 0.1"),
}
class ProfileError(Exception):
    """A usage problem: unknown target, missing build, no simgpu."""


class RunFailed(Exception):
    """One configuration failed; the message ends with its output's tail."""


@dataclass
class Target:
    label: str                  # key prefix and the query's service name
    kind: str                   # "app" (a batch program) or "tonic"
    cmd: list[str]              # program and fixed arguments
    inputs: list[str]           # argument sets (app) or query sizes (tonic)
    net: str = ""


@dataclass
class Summary:
    added: dict[str, int] = field(default_factory=lambda: {"task": 0, "query": 0})
    configs: int = 0
    skipped: int = 0
    failed: int = 0
    dropped: int = 0            # tasks without a device time (unresolved events)


# --- targets ------------------------------------------------------------------

def _parse_inputs(specs: Sequence[str], names: Sequence[str]) -> dict[str, list[str]]:
    """--inputs values: "a;b" for every target, or "TARGET=a;b" for one."""
    out: dict[str, list[str]] = {}
    for spec in specs:
        head, eq, rest = spec.partition("=")
        tgt = head if eq and head in names else "*"
        body = rest if tgt != "*" else spec
        items = [x.strip() for x in body.split(";") if x.strip()]
        if not items:
            raise ProfileError(f"--inputs {spec!r}: no input")
        out.setdefault(tgt, []).extend(items)
    return out


def resolve(names: Sequence[str], inputs: Sequence[str] = (), service_args: str | None = None,
            cmd_name: str | None = None, bin_dir: Path = BIN) -> list[Target]:
    """Targets from the command line.  Known names (Rodinia apps, tonic:NET)
    come first; the first word that is neither starts a command (what came
    after `--`), which must be an executable."""
    if not names:
        raise ProfileError("nothing to profile: name apps (hotspot, bfs, ...), tonic:NET, "
                           "or a command after --")
    targets: list[Target] = []
    labels: list[str] = []
    i = 0
    while i < len(names):
        n = names[i]
        if n in RODINIA or (n.startswith("tonic:") and n[6:] in TONIC):
            labels.append(n)
            i += 1
            continue
        if n.startswith("tonic:"):
            raise ProfileError(f"unknown Tonic net {n[6:]!r} (one of {', '.join(TONIC)})")
        found = n if "/" in n else shutil.which(n)
        if found is None or not os.access(found, os.X_OK) or os.path.isdir(found):
            raise ProfileError(f"unknown app {n!r}: not a Rodinia app ({', '.join(RODINIA)}), "
                               f"not tonic:NET ({', '.join(TONIC)}), not an executable")
        labels.append(cmd_name or os.path.basename(n))
        targets.append(Target(labels[-1], "app", [str(Path(found).absolute())] + list(names[i + 1:]),
                              [""]))
        break
    given = _parse_inputs(inputs, labels)
    if "*" in given and len(labels) > 1:
        raise ProfileError("--inputs without TARGET= applies to one target only; "
                           "write --inputs 'hotspot=--size 64;--size 128' per target")
    out: list[Target] = []
    for lab in labels:
        mine = given.get(lab) or given.get("*")
        if lab in RODINIA:
            exe = bin_dir / lab
            if not exe.exists():
                raise ProfileError(f"{exe} is missing: run `make build`")
            out.append(Target(lab, "app", [str(exe)], mine or RODINIA[lab]))
        elif lab.startswith("tonic:"):
            net = lab[6:]
            exe = bin_dir / "tonic-service"
            if not exe.exists():
                raise ProfileError(f"{exe} is missing: run `make build`")
            sizes, args = TONIC[net]
            args = args if service_args is None else service_args
            bad = [s for s in (mine or []) if not s.isdigit() or int(s) < 1]
            if bad:
                raise ProfileError(f"{lab}: inputs are query sizes (positive integers), "
                                   f"not {bad[0]!r}")
            label = lab + (f" {args}" if args else "")
            out.append(Target(label, "tonic", [str(exe), "--net", net, *shlex.split(args)],
                              mine or sizes, net))
    for t in targets:                       # the command, with its inputs if any
        t.inputs = given.get(t.label) or given.get("*") or [""]
        out.append(t)
    return out


# --- environment ----------------------------------------------------------------

def parse_quotas(text: str) -> list[int]:
    """--quotas: comma-separated SM percentages in 1..100 (sorted, once each);
    ValueError says what is wrong."""
    try:
        qs = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--quotas {text!r}: comma-separated integers") from None
    if not qs or not all(1 <= q <= 100 for q in qs):
        raise ValueError("--quotas must be in 1..100")
    return qs


def device_name(env: dict[str, str] | None = None) -> str:
    e = os.environ if env is None else env
    return e.get("SIMGPU_NAME") or "simgpu"


def pcie_rate(env: dict[str, str] | None = None) -> float:
    """Host<->device bytes per second, as simgpu's config.c reads it."""
    e = os.environ if env is None else env
    try:
        return float(e.get("SIMGPU_PCIE_GBS") or 25) * 1e9
    except ValueError:
        return 25e9


def check_built(shim: bool = True, sim: bool = True) -> None:
    """The shim (unless not needed: group sampling runs without it) and
    simgpu (unless on a real GPU)."""
    need = ((paths.LIBCOLOCATE,) if shim else ()) + ((paths.SIMGPU_CUDART,) if sim else ())
    missing = [str(p) for p in need if not p.exists()]
    if missing:
        raise ProfileError(f"{', '.join(missing)} missing: run `make build`")


def run_env(name: str, quota: int, tmp: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The app's environment: what `colocate run --device sim` builds, in a
    private runtime dir (so no controller answers), plus the profiling knobs.
    simgpu's model knobs (SIMGPU_SMS, ...) pass through: they define the device."""
    src = dict(os.environ if base is None else base)
    clean = {k: v for k, v in src.items()
             if not k.startswith("COLOCATE_") and k not in (
                 "LD_PRELOAD", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "SIMGPU_DIR",
                 "SIMGPU_REPORT", "SIMGPU_LAUNCH_LOG", "SIMGPU_TIMESCALE")}
    rd = rundir.ensure(tmp / "run")
    env = launcher.app_env(launcher.AppSpec([name], name), rd, "sim", clean)
    env.update(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(quota), SIMGPU_TIMESCALE="0",
               SIMGPU_DIR=str(tmp / "dev"), COLOCATE_TRACE=str(tmp / "trace.jsonl"),
               SIMGPU_LAUNCH_LOG=str(tmp / "launch.jsonl"), COLOCATE_QUIET="1")
    env.pop("SIMGPU_REPORT", None)
    return env


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """JSON objects of a file; a line torn by a crash is skipped."""
    out: list[dict[str, Any]] = []
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out.append(obj)
    return out


# --- the join -------------------------------------------------------------------

@dataclass
class Task:
    rec: dict[str, Any]         # the trace record
    flops: float
    bytes: float
    sm_us: float                # sum over its kernels of SMs x run time


def join(trace: Iterable[dict[str, Any]], launches: Iterable[dict[str, Any]]) -> list[Task]:
    """Trace tasks with their kernels' model figures, per process, in order."""
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for ln in launches:
        by_pid.setdefault(int(ln["pid"]), []).append(ln)
    for v in by_pid.values():
        v.sort(key=lambda ln: int(ln["seq"]))
    tasks = sorted((r for r in trace if r.get("kind") in ("kernel", "library")),
                   key=lambda r: (int(r["pid"]), int(r["seq"])))
    pos: dict[int, int] = {}
    out: list[Task] = []
    for r in tasks:
        pid = int(r["pid"])
        logs = by_pid.get(pid, [])
        i = pos.get(pid, 0)
        n = 1 if r["kind"] == "kernel" else int(r.get("kernels") or 0)
        mine = logs[i:i + n]
        if len(mine) < n:
            raise RunFailed(f"pid {pid}: task {r['name']} (seq {r['seq']}) has no launch-log "
                            f"line left ({len(logs)} in all)")
        if r["kind"] == "kernel" and mine[0].get("name") != r.get("name"):
            raise RunFailed(f"pid {pid}: trace task {r['name']} (seq {r['seq']}) met launch-log "
                            f"kernel {mine[0].get('name')} (seq {mine[0].get('seq')})")
        pos[pid] = i + n
        out.append(Task(r, sum(float(m["flops"]) for m in mine),
                        sum(float(m["bytes"]) for m in mine),
                        sum(float(m["sms"]) * float(m["dur_us"]) for m in mine)))
    return out


def trace_tasks(trace: Iterable[dict[str, Any]]) -> list[Task]:
    """The trace's tasks in (pid, seq) order, with no model figures."""
    recs = sorted((r for r in trace if r.get("kind") in ("kernel", "library")),
                  key=lambda r: (int(r["pid"]), int(r["seq"])))
    return [Task(r, 0.0, 0.0, 0.0) for r in recs]


def lib_params(name: str, params: dict[str, Any] | None) -> list[tuple[str, float]]:
    """A library task's parameters for the row's slots, in the hook's order:
    all of them (S.NPARAMS covers the most a hook records); a value that is
    not a number is skipped."""
    if not params:
        return []
    items = [(k, float(v)) for k, v in params.items() if isinstance(v, (int, float))]
    if len(items) > S.NPARAMS:
        raise RunFailed(f"{name} recorded {len(items)} parameters, the schema has "
                        f"{S.NPARAMS} slots")
    return items


def targets_of(t: Task) -> dict[str, float] | None:
    """duration, bandwidth and IPC of a task; None without a device time."""
    dur = t.rec.get("dur_us")
    if dur is None or not float(dur) > 0:
        return None
    out = {"duration_us": float(dur), "bandwidth_gbs": t.bytes / float(dur) / 1e3}
    if t.sm_us > 0 and t.flops > 0:
        out["ipc"] = (t.flops / WARP) / (t.sm_us * 1e-6 * CLOCK_HZ)
    return out


def occurrences(tasks: list[Task]) -> list[int]:
    """For each task, how many tasks of its name (and process) came before it."""
    seen: dict[tuple, int] = {}
    out = []
    for t in tasks:
        k = (t.rec.get("pid"), t.rec["name"])
        out.append(seen.get(k, 0))
        seen[k] = out[-1] + 1
    return out


def task_sample(t: Task, key: str, input_bytes: float, quota: int,
                occurrence: int = 0, duration_only: bool = False) -> dict[str, Any] | None:
    r = t.rec
    tg = targets_of(t)
    if tg is None:
        return None
    if duration_only:                   # a GPU run: no model figures; counters come later
        tg = {"duration_us": tg["duration_us"]}
    if r["kind"] == "kernel":
        f = S.task_row(r["name"], input_bytes, r.get("grid") or (0, 0, 0),
                       r.get("block") or (0, 0, 0), r.get("shmem") or 0, quota,
                       occurrence=occurrence)
    else:
        f = S.task_row(r["name"], input_bytes, quota=quota,
                       params=lib_params(r["name"], r.get("params")), occurrence=occurrence)
    return {"key": key, "src": SRC, "f": f, "t": tg}


# --- running ----------------------------------------------------------------------

def tail_of(text: str, n: int = 12) -> str:
    """The last n lines of a run's output, for an error message."""
    return "\n".join(text.strip().splitlines()[-n:])


def stats_h2d(stdout: str) -> int | None:
    """The H2D bytes of a bench program's STATS line."""
    m = re.search(r"^STATS .*\bh2d_bytes=(\d+)", stdout, re.M)
    return int(m.group(1)) if m else None


def run_app(t: Target, inp: str, quota: int, rep: int, tmp: Path,
            timeout: float, gpu: Gpu | None = None) -> tuple[list[dict[str, Any]], int]:
    """One run of a batch program: its task samples and the dropped count."""
    cmd = t.cmd + shlex.split(inp)
    if gpu is not None:
        return gpu.run_app(t, cmd, inp, quota, rep, tmp, timeout)
    res = run_cmd(cmd, run_env(Path(cmd[0]).name, quota, tmp), timeout)
    h2d = stats_h2d(res.stdout)
    tasks = join(read_jsonl(tmp / "trace.jsonl"), read_jsonl(tmp / "launch.jsonl"))
    if not tasks:
        raise RunFailed(f"no task in the trace\n{tail_of(res.stderr + res.stdout)}")
    out, dropped = [], 0
    for i, (tk, occ) in enumerate(zip(tasks, occurrences(tasks))):
        smp = task_sample(tk, f"{t.label}|{inp}|q{quota}|{i}#r{rep}", h2d or 0, quota, occ)
        if smp is None:
            dropped += 1
        else:
            out.append(smp)
    return out, dropped


def _client() -> ModuleType:
    """bench/tonic/client.py (the wire protocol of proto.h)."""
    path = ROOT / "bench" / "tonic" / "client.py"
    spec = importlib.util.spec_from_file_location("_tonic_client", path)
    if spec is None or spec.loader is None:
        raise ProfileError(f"cannot load {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("_tonic_client", mod)
    spec.loader.exec_module(mod)
    return mod


@dataclass
class Reply:
    id: int
    size: int
    in_bytes: int
    out_bytes: int
    device_us: float


def serve_queries(net: str, exe: str, args: Sequence[str], env: dict[str, str], device: str,
                  sock_path: str, queries: Sequence[tuple[int, int]], timeout: float,
                  done: Callable[[], None] = lambda: None, want_info: bool = False
                  ) -> tuple[Any, list[tuple], str]:
    """Start a tonic-service, send each (query id, size) closed-loop, stop it.
    Returns its INFO (want_info), every query's reply (client.read_reply's
    tuple, in order) and the service's output; RunFailed, ending with that
    output's tail, when it does not start or a query fails."""
    cl = _client()
    try:
        proc = cl.start_service(net, sock_path, list(args), [], device, exe, env, timeout)
    except (RuntimeError, OSError) as e:
        raise RunFailed(f"service did not start\n{tail_of(str(e))}") from None
    inf, replies, err = None, [], ""
    try:
        s = cl.connect(sock_path)
        s.settimeout(timeout)
        try:
            inf = cl.info(s) if want_info else None
            for qid, size in queries:
                s.sendall(cl.REQ.pack(cl.REQ_MAGIC, cl.INFER, qid, int(size), 0))
                r = cl.read_reply(s)
                if r[0] != 0 or r[1] != qid:
                    err = f"query {qid} (size {size}): status {cl.STATUS.get(r[0], r[0])}"
                    break
                replies.append(r)
                done()
        finally:
            s.close()
    except (ConnectionError, OSError, socket.timeout) as e:
        err = f"{type(e).__name__}: {e}"
    finally:
        out = cl.stop_service(proc)
    if err:
        raise RunFailed(f"{err}\n{tail_of(out)}")
    return inf, replies, out


def run_service(t: Target, quota: int, work: Sequence[tuple[str, int]], tmp: Path,
                timeout: float, done: Callable[[], None], gpu: Gpu | None = None
                ) -> tuple[list[dict], list[dict], int]:
    """One service process at `quota`; one closed-loop query per (size, rep)
    of `work`.  Returns task samples, query samples and the dropped count.
    On a GPU: trace durations only (no launch log, no ncu), PCIe time absent."""
    env = gpu.env("tonic-service", quota, tmp) if gpu else run_env("tonic-service", quota, tmp)
    src = gpu.src(counters=False) if gpu else SRC
    sizes = [int(s) for s, _ in work]
    cmd = [*t.cmd, "--max-size", str(max(sizes))]
    queries = [(QUERY_ID0 + n, int(size)) for n, (size, _rep) in enumerate(work)]
    inf, got, out = serve_queries(t.net, t.cmd[0], cmd[3:], env, "cuda" if gpu else "sim",
                                  str(tmp / "s.sock"), queries, timeout, done, want_info=True)
    replies = [Reply(qid, size, size * inf.unit_bytes, r[5] * 4, r[4] / 1e3)
               for (qid, size), r in zip(queries, got)]
    trace = read_jsonl(tmp / "trace.jsonl")
    tasks = trace_tasks(trace) if gpu else join(trace, read_jsonl(tmp / "launch.jsonl"))
    per_q: dict[int, list[Task]] = {}
    for tk in tasks:
        if tk.rec.get("query") is not None:
            per_q.setdefault(int(tk.rec["query"]), []).append(tk)
    pcie = pcie_rate(env)
    tsamples: list[dict] = []
    qsamples: list[dict] = []
    dropped = 0
    for (size, rep), r in zip(work, replies):
        mine = per_q.get(r.id, [])
        if not mine:
            raise RunFailed(f"query {r.id} (size {size}) has no task in the trace\n{tail_of(out)}")
        base = f"{t.label}|{size}|q{quota}"
        for i, (tk, occ) in enumerate(zip(mine, occurrences(mine))):
            smp = task_sample(tk, f"{base}|{i}#r{rep}", r.in_bytes, quota, occ,
                              duration_only=gpu is not None)
            if smp is None:
                dropped += 1
            else:
                smp["src"] = src
                tsamples.append(smp)
        qt = {"duration_us": r.device_us}
        if gpu is None:                 # simgpu's PCIe model; a GPU's is not measured here
            qt["pcie_us"] = (r.in_bytes + r.out_bytes) / pcie * 1e6
        qsamples.append({"key": f"{base}#r{rep}", "src": src,
                         "f": {"service": t.label, "input_bytes": float(r.in_bytes),
                               "batch": r.size, "quota": quota},
                         "t": qt})
    return tsamples, qsamples, dropped


# --- the whole profile ------------------------------------------------------------

def plan(targets: Sequence[Target], quotas: Sequence[int], reps: int
         ) -> list[tuple[Target, int, list[tuple[str, int]]]]:
    """Runs to make: (target, quota, [(input, rep), ...]); apps get one
    (input, rep) per run, a service one process per quota."""
    out = []
    for t in targets:
        for q in quotas:
            work = [(inp, r) for inp in t.inputs for r in range(reps)]
            if t.kind == "tonic":
                out.append((t, q, work))
            else:
                out.extend((t, q, [w]) for w in work)
    return out


def complete(t: Target, quota: int, inp: str, rep: int,
             have: dict[str, set[str]]) -> bool:
    """A configuration is done when one of its samples is stored (a run's
    samples are appended together, a service's query sample last)."""
    if t.kind == "tonic":
        return f"{t.label}|{inp}|q{quota}#r{rep}" in have["query"]
    pre, suf = f"{t.label}|{inp}|q{quota}|", f"#r{rep}"
    return any(k.startswith(pre) and k.endswith(suf) for k in have["task"])


def profile(targets: Sequence[Target], quotas: Sequence[int], reps: int, store: Any,
            timeout: float = 300.0, progress: bool = True,
            log: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
            gpu: Gpu | None = None) -> Summary:
    """Profile every configuration the store lacks; returns what was done.
    gpu: run on a real GPU (profile_gpu.GpuSession), else on simgpu."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    check_built(sim=gpu is None)
    summ = Summary()
    have = {k: store.keys(k) for k in ("task", "query")}
    runs = []
    for t, q, work in plan(targets, quotas, reps):
        todo = [w for w in work if not complete(t, q, w[0], w[1], have)]
        summ.skipped += len(work) - len(todo)
        if todo:
            runs.append((t, q, todo))
    total = sum(len(w) for _, _, w in runs)
    cols = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn())
    with Progress(*cols, disable=not progress, transient=False) as bar:
        job = bar.add_task("profiling", total=total)
        for t, q, work in runs:
            bar.update(job, description=f"{t.label} q{q}")
            before = bar.tasks[0].completed
            with tempfile.TemporaryDirectory(prefix="colocate-profile-") as d:
                tmp = Path(d)
                try:
                    if t.kind == "tonic":
                        ts, qs, dr = run_service(t, q, work, tmp, timeout,
                                                 lambda: bar.advance(job), gpu)
                    else:
                        ts, dr = run_app(t, work[0][0], q, work[0][1], tmp, timeout, gpu)
                        qs = []
                        bar.advance(job)
                except RunFailed as e:
                    summ.failed += len(work)
                    bar.console.print(f"[red]FAILED[/] {t.label} q{q} "
                                      f"{', '.join(f'{i}#r{r}' for i, r in work)}: {e}",
                                      markup=True, highlight=False)
                    bar.update(job, completed=before + len(work))
                    continue
            summ.configs += len(work)
            summ.dropped += dr
            summ.added["task"] += store.append("task", ts, src=SRC)
            if qs:
                summ.added["query"] += store.append("query", qs, src=SRC)
    return summ


def run_cmd(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run one configuration; RunFailed unless it exits 0.  Timing-only
    (SIMGPU_TIMING_ONLY=1: no host twins, so results are not computed) a
    program's own result check fails by design: its exit code 1 with a FAIL
    line is accepted then, as bench/colocation.py's solo runs accept it."""
    try:
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise RunFailed(f"timed out after {timeout:g} s\n{tail_of(str(e.stderr or ''))}") from None
    except OSError as e:
        raise RunFailed(f"cannot start {cmd[0]}: {e.strerror}") from None
    timing_only = env.get("SIMGPU_TIMING_ONLY") == "1" and res.returncode == 1 and \
        re.search(r"^FAIL ", res.stdout, re.M) is not None
    if res.returncode != 0 and not timing_only:
        raise RunFailed(f"{Path(cmd[0]).name}: exit code {res.returncode}\n"
                        f"{tail_of(res.stderr + res.stdout)}")
    return res
