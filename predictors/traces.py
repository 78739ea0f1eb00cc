"""Task traces of real programs, for a trace-driven simulator (`colocate traces`).

A trace is what one program asks of the device, in issue order, with the
host time between the requests, so that a discrete-event simulator can
replay the program on its own device model in virtual time.  It is recorded
once on simgpu, timing-only (SIMGPU_TIMING_ONLY=1: no host twins, so fast;
SIMGPU_TIMESCALE=0: modelled time is not slept), under the shim with

    COLOCATE_TRACE + COLOCATE_TRACE_OPS=1   one line per kernel or library
                                           task, copy, memset and sync, with
                                           the host time it was called at
    SIMGPU_LAUNCH_LOG                      one line per kernel: the model's
                                           flops, bytes, registers, smem

joined per process in order (a library task takes its next `kernels` lines
and becomes that many kernel tasks).

The format (JSON lines, version 1).  The first line is the header:

    {"kind":"header","version":1,"name","cls":"batch"|"qos","cmd":[...],
     "device":{SIMGPU_* settings of the recording},"recorded":ISO time,
     "iterations":R (batch: the runs the iteration was found in),
     "sizes":[...] (qos: the query sizes, in order)}

then one line per device task, in issue order:

    {"kind":"kernel"|"h2d"|"d2h"|"d2d"|"memset","name","grid":[x,y,z],
     "block":[x,y,z],"regs" (per thread, 0 unknown),"smem" (bytes per block),
     "flops","bytes","gap_us","sync","stream","query"}

    gap_us  host time from the previous task's issue to this one's, less
            the time the host spent blocked in between (syncs, blocking
            copies): the app's own host work.  A query's first task counts
            from the query's begin.
    sync    the host waited for the device before issuing it (a device,
            stream or event sync, or a blocking copy, since the previous
            task): a replayer holds it until the device has drained.
    stream  a small int per stream, 0 the default stream, in order of use.
    query   the query id (services), else null.

Copies and memsets have name = the API, grid/block [0,0,0], flops 0 and
bytes = the bytes moved.  Services add one line per recorded query, before
its tasks:

    {"kind":"query","id","size","tasks":[first,last] (task indexes,
     inclusive, counting task lines from 0),"tail_us" (host time from its
     last task's issue, less blocking, to the query's end)}

A batch app's trace is ONE iteration of its work (one of its --repeat
runs: found by recording 1 and 2 runs and taking the second run of the
two, so its first task's gap and sync are those of a loop); a replayer
loops it, throughput = iterations/s.  A service's trace is one query per
recorded size, each after a warm-up query of the same size.

Caveat: timing-only runs compute no results, so control flow that depends
on them is not the real one (bfs stops after its first level); the
co-location experiment (bench/colocation.py) runs the apps that way too.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

from predictors import profile as P

VERSION = 1
TASK_KINDS = ("kernel", "h2d", "d2h", "d2d", "memset")
# per-recording knobs: not device settings
PRIVATE = ("SIMGPU_DIR", "SIMGPU_LAUNCH_LOG", "SIMGPU_REPORT", "SIMGPU_TIMESCALE",
           "SIMGPU_TIMING_ONLY", "SIMGPU_DEVICE_TRACE")
QUERY_ID0 = P.QUERY_ID0


class TraceError(Exception):
    """A usage problem or a recording that failed; the message says which."""


@dataclass
class Task:
    """One device task, as a trace line has it (the module's docstring)."""
    kind: str
    name: str
    grid: list[int]
    block: list[int]
    regs: float
    smem: float
    flops: float
    bytes: float
    gap_us: float
    sync: bool
    stream: int
    query: int | None = None

    def key(self) -> tuple:
        """What makes two tasks the same request (host times aside)."""
        return (self.kind, self.name, tuple(self.grid), tuple(self.block), self.flops, self.bytes)


@dataclass
class Query:
    """A recorded query: its tasks are Trace.tasks[first:last + 1]."""
    id: int
    size: int
    first: int
    last: int
    tail_us: float = 0.0


@dataclass
class Trace:
    """A loaded or just recorded trace: the header's fields, the tasks in
    issue order, a service's queries."""
    name: str
    cls: str
    cmd: list[str]
    device: dict[str, str]
    recorded: str
    tasks: list[Task]
    queries: list[Query] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)    # other header keys

    def iteration(self) -> list[Task]:
        """A batch app's loop body: the whole trace."""
        if self.cls != "batch":
            raise TraceError(f"{self.name} is a service: take query_tasks(size)")
        return self.tasks

    def query_tasks(self, size: int | None = None) -> list[list[Task]]:
        """Each recorded query's tasks (of one size, if given)."""
        return [self.tasks[q.first:q.last + 1] for q in self.queries
                if size is None or q.size == size]

    def sizes(self) -> list[int]:
        return sorted({q.size for q in self.queries})


# --- the raw trace -> tasks ---------------------------------------------------------

@dataclass
class _Raw:
    """A trace line on its way to a Task: its host call time and blocking."""
    task: Task
    host_us: float
    blocked_us: float           # host time blocked in it (a blocking copy) and in
                                # the syncs after it


def _dim(v: Any) -> list[int]:
    return [int(x) for x in v] if isinstance(v, list) and len(v) == 3 else [0, 0, 0]


def _streams() -> Callable[[Any], int]:
    """Stream handles to small ints: the default stream 0, others in order of use."""
    seen: dict[str, int] = {}

    def num(h: Any) -> int:
        h = str(h or "0x0")
        if h in ("0x0", "0x1", "0x2"):       # legacy and per-thread default streams
            return 0
        return seen.setdefault(h, len(seen) + 1)
    return num


def tasks_of(trace: list[dict[str, Any]], launches: list[dict[str, Any]]
             ) -> tuple[list[Task], list[tuple[float, float]], list[dict[str, Any]]]:
    """The device tasks of one process's trace, in issue order, with gap and
    sync; each task's (host call time, host time blocked in it); the
    query boundary lines."""
    pids = {int(r["pid"]) for r in trace if r.get("kind") in ("kernel", "library")}
    if len(pids) > 1:
        raise TraceError(f"{len(pids)} processes issued tasks: a trace is of one")
    logs = sorted((ln for ln in launches if not pids or int(ln["pid"]) in pids),
                  key=lambda ln: int(ln["seq"]))
    stream = _streams()
    raws: list[_Raw] = []
    marks: list[dict[str, Any]] = []
    li = 0
    pending_sync = False
    for r in sorted(trace, key=lambda r: int(r["seq"])):
        k = r.get("kind")
        if k in ("query_begin", "query_end"):
            marks.append(r)
            continue
        if k == "sync":
            pending_sync = True
            if raws:                    # the host was blocked after the last task
                raws[-1].blocked_us += float(r.get("wait_us") or 0)
            continue
        new: list[Task] = []
        q = r.get("query")
        if k in ("kernel", "library"):
            n = 1 if k == "kernel" else int(r.get("kernels") or 0)
            mine = logs[li:li + n]
            if len(mine) < n:
                raise TraceError(f"task {r.get('name')} (seq {r['seq']}) has no launch-log "
                                 f"line left ({len(logs)} in all)")
            if k == "kernel" and mine[0].get("name") != r.get("name"):
                raise TraceError(f"trace task {r.get('name')} (seq {r['seq']}) met launch-log "
                                 f"kernel {mine[0].get('name')} (seq {mine[0].get('seq')})")
            li += n
            for m in mine:
                new.append(Task("kernel", str(m["name"]), _dim(m.get("grid")), _dim(m.get("block")),
                                float(m.get("regs") or 0), float(m.get("smem") or 0),
                                float(m["flops"]), float(m["bytes"]), 0.0, False,
                                stream(r.get("stream")), q))
        elif k in ("copy", "memset"):
            kind = "memset" if k == "memset" else str(r.get("dir"))
            if kind not in TASK_KINDS:
                continue
            new.append(Task(kind, str(r.get("api")), [0, 0, 0], [0, 0, 0], 0.0, 0.0, 0.0,
                            float(r.get("bytes") or 0), 0.0, False, stream(r.get("stream")), q))
        else:
            continue
        if not new:
            continue
        new[0].sync = pending_sync
        host = float(r["host_us"])
        if raws:
            prev = raws[-1]
            new[0].gap_us = round(max(0.0, host - prev.host_us - prev.blocked_us), 3)
        copy_blocks = k == "copy" and bool(r.get("blocking"))
        raws.append(_Raw(new[0], host, float(r.get("wait_us") or 0) if copy_blocks else 0.0))
        raws.extend(_Raw(t, host, 0.0) for t in new[1:])
        pending_sync = copy_blocks
    if li != len(logs):
        raise TraceError(f"{len(logs) - li} launch-log kernel(s) without a trace task")
    return [x.task for x in raws], [(x.host_us, x.blocked_us) for x in raws], marks


# --- recording ------------------------------------------------------------------

def device_settings(env: dict[str, str] | None = None) -> dict[str, str]:
    """simgpu's device settings from the environment (what defines the device)."""
    e = os.environ if env is None else env
    return {k: v for k, v in sorted(e.items()) if k.startswith("SIMGPU_") and k not in PRIVATE}


def _env(name: str, tmp: Path, twins: bool = False) -> dict[str, str]:
    """profile's run environment, at 100 %, with op lines; timing-only
    unless twins (then results, and control flow that depends on them, are
    real, at the twins' CPU cost)."""
    env = P.run_env(name, 100, tmp)
    env.update(SIMGPU_TIMING_ONLY="0" if twins else "1", SIMGPU_TIMESCALE="0",
               COLOCATE_TRACE_OPS="1")
    env.pop("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", None)
    return env


def _run_batch(cmd: list[str], repeat: int, tmp: Path, timeout: float, twins: bool
               ) -> list[Task]:
    """One run of a batch program with --repeat R: its tasks."""
    tmp.mkdir(parents=True, exist_ok=True)
    full = cmd + ["--repeat", str(repeat)]
    try:
        res = subprocess.run(full, env=_env(Path(cmd[0]).name, tmp, twins), capture_output=True,
                             text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise TraceError(f"{shlex.join(full)}: timed out after {timeout:g} s") from None
    except OSError as e:
        raise TraceError(f"cannot start {cmd[0]}: {e.strerror}") from None
    # timing-only computes no results: a program's own check may fail, the
    # work was still issued (it printed its THROUGHPUT line)
    if res.returncode != 0 and "THROUGHPUT " not in res.stdout:
        raise TraceError(f"{shlex.join(full)}: exit code {res.returncode}\n"
                         f"{P.tail_of(res.stderr + res.stdout)}")
    tasks, _, _ = tasks_of(P.read_jsonl(tmp / "trace.jsonl"), P.read_jsonl(tmp / "launch.jsonl"))
    if not tasks:
        raise TraceError(f"{shlex.join(full)}: no task in the trace\n"
                         f"{P.tail_of(res.stderr + res.stdout)}")
    for t in tasks:
        t.query = None                  # a batch app's inferred queries mean nothing here
    return tasks


def iteration_of(one: list[Task], two: list[Task]) -> list[Task]:
    """The loop body from runs of 1 and 2 iterations (prologue P, body I,
    epilogue E: P I E and P I I E): the second body of `two`, where the
    earliest split point makes both runs agree."""
    n = len(two) - len(one)
    if n <= 0:
        raise TraceError(f"2 runs issued {len(two)} tasks, 1 run {len(one)}: no iteration")
    a = [t.key() for t in one]
    b = [t.key() for t in two]
    for k in range(len(one) + 1):
        if a[:k] == b[:k] and a[k:] == b[k + n:] and b[k:k + n] == b[k + n:k + 2 * n]:
            return two[k + n:k + 2 * n]
    raise TraceError("the runs of 1 and 2 iterations differ beyond one repeated body "
                     "(data-dependent work?)")


def _header(name: str, cls: str, cmd: list[str], env: dict[str, str], twins: bool,
            **extra: Any) -> dict[str, Any]:
    dev = device_settings(env)
    dev.update(SIMGPU_TIMING_ONLY="0" if twins else "1", SIMGPU_TIMESCALE="0")
    return {"kind": "header", "version": VERSION, "name": name, "cls": cls, "cmd": cmd,
            "device": dev, "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **extra}


def _workdir(raw: Path | None) -> Any:
    """Where the runs' raw trace and launch log go: raw (kept), else a
    temporary directory."""
    if raw is None:
        return tempfile.TemporaryDirectory(prefix="colocate-traces-")
    raw.mkdir(parents=True, exist_ok=True)
    return contextlib.nullcontext(str(raw))


def record_batch(name: str, cmd: list[str], out: Path, timeout: float = 120.0,
                 twins: bool = False, raw: Path | None = None) -> Trace:
    """A batch program's one-iteration trace (cmd: program and arguments,
    without --repeat), written to out; raw keeps the runs' files (r1/, r2/)."""
    with _workdir(raw) as d:
        one = _run_batch(cmd, 1, Path(d) / "r1", timeout, twins)
        two = _run_batch(cmd, 2, Path(d) / "r2", timeout, twins)
    tr = Trace(name, "batch", cmd, {}, "", iteration_of(one, two))
    h = _header(name, "batch", cmd, dict(os.environ), twins, iterations=2)
    _fill(tr, h)
    write(tr, out)
    return tr


def record_service(net: str, args: str, sizes: Sequence[int], out: Path, name: str | None = None,
                   timeout: float = 120.0, warmup: bool = True, twins: bool = False,
                   raw: Path | None = None) -> Trace:
    """A Tonic service's trace: one query per size (after a warm-up query
    of that size), written to out; raw keeps the run's files."""
    exe = P.BIN / "tonic-service"
    cmd = [str(exe), "--net", net, *shlex.split(args), "--max-size", str(max(sizes))]
    warms = (True, False) if warmup else (False,)
    plan = [(int(size), warm) for size in sizes for warm in warms]
    queries = [(QUERY_ID0 + n, size) for n, (size, _) in enumerate(plan)]
    kept = [q for q, (_, warm) in zip(queries, plan) if not warm]      # (query id, size)
    with _workdir(raw) as d:
        tmp = Path(d)
        env = _env("tonic-service", tmp, twins)
        try:
            P.serve_queries(net, str(exe), cmd[3:], env, "sim", str(tmp / "s.sock"), queries, timeout)
        except P.RunFailed as e:
            raise TraceError(f"tonic:{net}: {e}") from None
        tasks, hosts, marks = tasks_of(P.read_jsonl(tmp / "trace.jsonl"),
                                       P.read_jsonl(tmp / "launch.jsonl"))
    tr = Trace(name or f"tonic:{net}", "qos", cmd, {}, "", [])
    tr.tasks, tr.queries = _queries(tasks, hosts, marks, kept)
    _fill(tr, _header(tr.name, "qos", cmd, env, twins, sizes=[int(x) for x in sizes]))
    write(tr, out)
    return tr


def _queries(tasks: list[Task], hosts: list[tuple[float, float]], marks: list[dict[str, Any]],
             kept: list[tuple[int, int]]) -> tuple[list[Task], list[Query]]:
    """The kept queries' tasks, renumbered; a query's first gap counts from
    its begin, its tail from its last task to its end."""
    begin = {int(r["id"]): float(r["host_us"]) for r in marks if r["kind"] == "query_begin"}
    end = {int(r["id"]): float(r["host_us"]) for r in marks if r["kind"] == "query_end"}
    out: list[Task] = []
    qs: list[Query] = []
    for qid, size in kept:
        idx = [i for i, t in enumerate(tasks) if t.query == qid]
        if not idx:
            raise TraceError(f"query {qid} (size {size}) has no task in the trace")
        mine = [Task(**asdict(tasks[i])) for i in idx]
        if qid in begin and hosts[idx[0]][0] >= begin[qid]:
            mine[0].gap_us = round(hosts[idx[0]][0] - begin[qid], 3)
        last_host, last_blocked = hosts[idx[-1]]
        tail = round(max(0.0, end[qid] - last_host - last_blocked), 3) if qid in end else 0.0
        qs.append(Query(qid, size, len(out), len(out) + len(mine) - 1, tail))
        out.extend(mine)
    return out, qs


def _fill(tr: Trace, h: dict[str, Any]) -> None:
    tr.cmd, tr.device, tr.recorded = list(h["cmd"]), dict(h["device"]), str(h["recorded"])
    tr.extra = {k: v for k, v in h.items()
                if k not in ("kind", "version", "name", "cls", "cmd", "device", "recorded")}


# --- the file --------------------------------------------------------------------

def write(tr: Trace, out: Path) -> None:
    """The trace as JSON lines, written whole (a temporary file renamed)."""
    head = {"kind": "header", "version": VERSION, "name": tr.name, "cls": tr.cls, "cmd": tr.cmd,
            "device": tr.device, "recorded": tr.recorded, **tr.extra}
    starts = {q.first: q for q in tr.queries}
    lines = [json.dumps(head)]
    for i, t in enumerate(tr.tasks):
        q = starts.get(i)
        if q is not None:
            lines.append(json.dumps({"kind": "query", "id": q.id, "size": q.size,
                                     "tasks": [q.first, q.last], "tail_us": q.tail_us}))
        lines.append(json.dumps(asdict(t)))
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(out)


def load(path: Path | str) -> Trace:
    """A trace file; TraceError on anything that is not a version-1 trace."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise TraceError(f"cannot read {p}: {e.strerror}") from None
    rows: list[dict[str, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            raise TraceError(f"{p}:{n}: not JSON") from None
        if not isinstance(obj, dict):
            raise TraceError(f"{p}:{n}: not a JSON object")
        rows.append(obj)
    if not rows or rows[0].get("kind") != "header":
        raise TraceError(f"{p}: no header line (not a task trace)")
    h = rows[0]
    if h.get("version") != VERSION:
        raise TraceError(f"{p}: trace version {h.get('version')!r}, this reads {VERSION}")
    names = {f for f in Task.__dataclass_fields__}
    tasks: list[Task] = []
    queries: list[Query] = []
    for n, r in enumerate(rows[1:], 2):
        k = r.get("kind")
        try:
            if k == "query":
                first, last = r["tasks"]
                queries.append(Query(int(r["id"]), int(r["size"]), int(first), int(last),
                                     float(r.get("tail_us") or 0)))
            elif k in TASK_KINDS:
                tasks.append(Task(**{f: r[f] for f in names}))
            else:
                raise TraceError(f"{p}:{n}: unknown line kind {k!r}")
        except (KeyError, TypeError, ValueError) as e:
            raise TraceError(f"{p}:{n}: bad {k} line ({type(e).__name__}: {e})") from None
    for q in queries:
        if not 0 <= q.first <= q.last < len(tasks):
            raise TraceError(f"{p}: query {q.id}'s tasks {q.first}..{q.last} are not in the trace")
    tr = Trace(str(h.get("name")), str(h.get("cls")), list(h.get("cmd") or []), {}, "", tasks,
               queries)
    _fill(tr, h)
    return tr


# --- the library ----------------------------------------------------------------

def default_dir(env: dict[str, str] | None = None) -> Path:
    """<data dir>/traces/<device key>: the data dir as the sample store picks it
    ($COLOCATE_DATA_DIR, else $XDG_DATA_HOME/colocate, else ~/.local/share/colocate),
    one directory per device settings so that experiments reuse traces."""
    from predictors.store import default_root
    dev = device_settings(env)
    key = hashlib.sha1(json.dumps(dev, sort_keys=True).encode()).hexdigest()[:10]
    return default_root().parent / "traces" / f"{P.device_name(env)}-{key}"


def file_name(name: str, args: str = "", twins: bool = False, sizes: Sequence[int] = ()) -> str:
    """NAME[@args][+s1-2-3][+twins].jsonl, the arguments made file-safe:
    recordings that differ get files of their own."""
    slug = "".join(c if c.isalnum() or c in ".-" else "_" for c in args.strip())
    base = name.replace(":", "-") + (f"@{slug}" if slug else "")
    base += f"+s{'-'.join(map(str, sizes))}" if sizes else ""
    return base + ("+twins" if twins else "") + ".jsonl"


@dataclass
class Done:
    name: str
    path: Path
    seconds: float
    tasks: int
    skipped: bool = False
    error: str = ""


def record(target: str, out: Path, args: str = "", sizes: Sequence[int] = (),
           service_args: str = "", timeout: float = 120.0, twins: bool = False,
           raw: Path | None = None) -> Trace:
    """Record one program: a Rodinia app by name (args: its arguments, default
    the program's own defaults, as the co-location experiment runs it), a
    Tonic service "tonic:NET" (sizes: query sizes, default profile's ladder;
    service_args: tonic-service options), or a command (a path or a name on
    PATH, args its arguments).  twins: run the host twins (real results and
    control flow, slower); raw: keep the runs' trace and launch log there."""
    try:
        P.check_built(shim=True, sim=True)
    except P.ProfileError as e:
        raise TraceError(str(e)) from None
    if target.startswith("tonic:"):
        net = target[6:]
        if net not in P.TONIC:
            raise TraceError(f"unknown Tonic net {net!r} (one of {', '.join(P.TONIC)})")
        if not (P.BIN / "tonic-service").exists():
            raise TraceError(f"{P.BIN / 'tonic-service'} is missing: run `make build`")
        szs = [int(s) for s in (sizes or P.TONIC[net][0])]
        if any(s < 1 for s in szs):
            raise TraceError(f"{target}: query sizes must be positive")
        return record_service(net, service_args, szs, out, timeout=timeout, twins=twins, raw=raw)
    return record_batch(target, _batch_cmd(target) + shlex.split(args), out, timeout, twins, raw)


def _batch_cmd(target: str) -> list[str]:
    if target in P.RODINIA:
        exe = P.BIN / target
        if not exe.exists():
            raise TraceError(f"{exe} is missing: run `make build`")
        return [str(exe)]
    import shutil
    found = target if "/" in target else shutil.which(target)
    if found is None or not os.access(found, os.X_OK) or os.path.isdir(found):
        raise TraceError(f"unknown program {target!r}: not a Rodinia app ({', '.join(P.RODINIA)}), "
                         f"not tonic:NET ({', '.join(P.TONIC)}), not an executable")
    return [str(Path(found).absolute())]


def record_all(names: Sequence[str], dir: Path | None = None, sizes: Sequence[int] = (),
               args: str = "", service_args: str = "", force: bool = False, twins: bool = False,
               log: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> list[Done]:
    """Record each program into dir (default_dir()) unless its trace is there
    (force: again).  Unknown names and a missing build raise TraceError
    before anything runs; a recording that fails is logged, its Done has
    the error, and the others go on."""
    d = dir or default_dir()
    try:
        P.check_built(shim=True, sim=True)
    except P.ProfileError as e:
        raise TraceError(str(e)) from None
    for n in names:                       # every name checked before the first run
        if n.startswith("tonic:"):
            if n[6:] not in P.TONIC:
                raise TraceError(f"unknown Tonic net {n[6:]!r} (one of {', '.join(P.TONIC)})")
        else:
            _batch_cmd(n)
    done: list[Done] = []
    for n in names:
        svc = n.startswith("tonic:")
        path = d / file_name(n, service_args if svc else args, twins, sizes if svc else ())
        if path.exists() and not force:
            done.append(Done(n, path, 0.0, len(load(path).tasks), skipped=True))
            log(f"{n}: have {path} (--force records it again)")
            continue
        t0 = time.monotonic()
        try:
            tr = record(n, path, args=args, sizes=sizes, service_args=service_args, twins=twins)
        except TraceError as e:
            done.append(Done(n, path, time.monotonic() - t0, 0, error=str(e)))
            log(f"{n}: FAILED: {e}")
            continue
        done.append(Done(n, path, time.monotonic() - t0, len(tr.tasks)))
        what = (f"{len(tr.queries)} query(ies), sizes {','.join(map(str, tr.sizes()))}"
                if tr.cls == "qos" else "one iteration")
        log(f"{n}: {len(tr.tasks)} task(s), {what}, {done[-1].seconds:.2f} s -> {path}")
    return done
