"""Camelot's microservice pipelines, live: `colocate pipeline run SPEC`.

Each stage instance is a process (bench/camelot/stage_worker.py) started
under the shim as a QoS app with its SM quota (shim/launcher.py; on simgpu
the quota also goes through CUDA_MPS_ACTIVE_THREAD_PERCENTAGE).  This runner
is Camelot's front end (§V-B, Fig. 7):

  1. queries arrive (Poisson at --rate, seeded) into a wait queue;
  2. a batch is issued when `batch` queries wait, or when the oldest would
     miss the QoS target were it held longer: now >= arrival + (1 - HEADROOM)
     * target - the predicted time of the pipeline (the sum of each stage's
     recent batch time; unknown before a stage's first batch: issue at once);
  3-5. the allocation (instances, quotas, devices) is the SPEC's: this runs
     what a policy decided (controlplane/policies/camelot.py decides it).
Stages are either the artifact stages of §III-B (our own kernels) or the
stages of Table I's four services (§III-A), each a Tonic network of cuDNN
and cuBLAS layers (bench/camelot/stage_worker.py, suite.NETS); the two do
not mix in one pipeline.  A batch goes through the stages as one unit.  At each stage it waits for a
free instance, preferring one on the device of the instance that produced
its input, and the output is handed to the next stage as a device-buffer
handle (§VI-B, Fig. 10: shim/handoff.py) or, with --copy, through the host
(Fig. 8a: device-to-host, bytes, host-to-device).  The first stage receives
each query's input as bytes and the last copies its result to the host,
in both modes; the last stage returns each query's CRC-32.

SPEC (TOML):
    name = "p1-c2-m1"
    qos_ms = 300              # end-to-end target
    batch = 4                 # queries per batch (the most)
    scale = 0.01              # optional: work per query, x suite.ARTIFACT
    [[stage]]
    kind = "p1"               # c1..c3, m1..m3, p1..p3 (bench/camelot/suite.py), or a stage
                              # of Table I's services (suite.NETS: face-recognition, ...)
    instances = 1
    quota = 30                # SM %, 1..100
    devices = [0]             # optional: instance i on devices[i % len]

While it runs, the runner keeps DIR/pipelines/<name>-<pid>.json up to date
(each second) for `colocate pipeline ls`.
"""
from __future__ import annotations

import collections
import functools
import importlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import time
import tomllib
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from shim import launcher
from shim.rundir import ColocateError, RunDir, subdir

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "bench" / "camelot" / "stage_worker.py"
STAGE_LIB = ROOT / "bench" / "bin" / "libcamelot-stage.so"
STAGE_TWINS = ROOT / "bench" / "bin" / "libcamelot-stage.twins.so"
TONIC_LIB = ROOT / "bench" / "bin" / "libcamelot-tonic.so"
TONIC_TWINS = (ROOT / "bench" / "bin" / "libcamelot-tonic.twins.so", ROOT / "bench" / "bin" / "tonic-service.twins.so")
HEADROOM = 0.1          # step 2: issue by arrival + (1 - HEADROOM) * target - predicted time
EWMA = 0.3              # weight of a stage's newest batch time in its prediction
STATE_EVERY_S = 1.0
SCALE = {"sim": 0.01, "cuda": 1.0}
F32 = 4


class SpecError(ColocateError):
    """A bad SPEC: one line, exit 2."""

    def __init__(self, message: str):
        super().__init__(message, 2)


class StageFailed(ColocateError):
    """A stage instance died, failed a batch or stopped answering."""


# --- the SPEC ----------------------------------------------------------------

@dataclass(frozen=True)
class StageSpec:
    kind: str
    instances: int
    quota: int
    devices: tuple[int, ...] = (0,)


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    qos_ms: float
    batch: int
    stages: tuple[StageSpec, ...]
    scale: float | None = None
    path: str = ""


def suite() -> Any:
    """bench/camelot/suite.py (the stages' work, shared with the simulator)."""
    bench = str(ROOT / "bench")
    if not (ROOT / "bench" / "camelot" / "suite.py").exists():
        raise ColocateError(f"{ROOT / 'bench' / 'camelot'} is missing: pipelines run from a source checkout")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    return importlib.import_module("camelot.suite")


def _field(d: dict, key: str, types: tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise SpecError(f"{where}: missing field {key!r}")
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, types):
        want = " or ".join(t.__name__ for t in types)
        raise SpecError(f"{where}: {key} must be {want} (got {v!r})")
    return v


def _unknown(d: dict, allowed: set[str], where: str) -> None:
    extra = sorted(set(d) - allowed)
    if extra:
        raise SpecError(f"{where}: unknown field(s) {', '.join(map(repr, extra))} "
                        f"(known: {', '.join(sorted(allowed))})")


def parse_stage(d: Any, i: int, where: str) -> StageSpec:
    """One [[stage]] table, checked."""
    kinds = {**suite().ARTIFACT, **suite().NETS}
    at = f"{where}: stage {i + 1}"
    if not isinstance(d, dict):
        raise SpecError(f"{at}: must be a table ([[stage]])")
    _unknown(d, {"kind", "instances", "quota", "devices"}, at)
    kind = _field(d, "kind", (str,), at)
    if kind not in kinds:
        raise SpecError(f"{at}: unknown kind {kind!r} (one of {', '.join(kinds)})")
    n = _field(d, "instances", (int,), f"{at} ({kind})")
    if n < 1:
        raise SpecError(f"{at} ({kind}): instances must be >= 1 (got {n})")
    quota = _field(d, "quota", (int,), f"{at} ({kind})")
    if not 1 <= quota <= 100:
        raise SpecError(f"{at} ({kind}): quota must be 1..100 (got {quota})")
    devices = d.get("devices", [0])
    if (not isinstance(devices, list) or not devices
            or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in devices)):
        raise SpecError(f"{at} ({kind}): devices must be a non-empty list of device numbers >= 0")
    return StageSpec(kind, n, quota, tuple(devices))


def parse_spec(d: dict, where: str = "SPEC") -> PipelineSpec:
    """A SPEC's tables, checked: SpecError (one line) on the first problem."""
    _unknown(d, {"name", "qos_ms", "batch", "scale", "stage"}, where)
    name = _field(d, "name", (str,), where)
    if not name or not all(c.isalnum() or c in "-_." for c in name):
        raise SpecError(f"{where}: name must be letters, digits, '-', '_' or '.' (got {name!r})")
    qos = float(_field(d, "qos_ms", (int, float), where))
    if not qos > 0:
        raise SpecError(f"{where}: qos_ms must be > 0 (got {qos:g})")
    batch = _field(d, "batch", (int,), where)
    if batch < 1:
        raise SpecError(f"{where}: batch must be >= 1 (got {batch})")
    scale = d.get("scale")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0):
        raise SpecError(f"{where}: scale must be a number > 0 (got {scale!r})")
    stages = _field(d, "stage", (list,), where)
    if not stages:
        raise SpecError(f"{where}: no [[stage]] tables")
    parsed = tuple(parse_stage(s, i, where) for i, s in enumerate(stages))
    nets = [st.kind in suite().NETS for st in parsed]
    if any(nets) and not all(nets):
        raise SpecError(f"{where}: artifact stages ({', '.join(suite().ARTIFACT)}) and Table I stages "
                        f"({', '.join(suite().NETS)}) do not mix in one pipeline")
    return PipelineSpec(name, qos, batch, parsed, None if scale is None else float(scale))


def load_spec(path: Path) -> PipelineSpec:
    """Read and check a SPEC file."""
    try:
        d = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except OSError as e:
        raise SpecError(f"{path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: not valid TOML: {e}") from None
    spec = parse_spec(d, str(path))
    return PipelineSpec(spec.name, spec.qos_ms, spec.batch, spec.stages, spec.scale, str(path))


# --- queries -------------------------------------------------------------------

def arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Poisson arrival offsets (s) of n queries at rate per second (step 1)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


@functools.lru_cache(maxsize=4)
def _input_base(n: int) -> np.ndarray:
    """2n floats in [-0.5, 0.5): a pattern of period 2**24, twice."""
    i = np.arange(n, dtype=np.uint32)
    x = (((i * np.uint32(2654435761)) >> 8) & 0xFFFF).astype(np.float32) / np.float32(65536) - np.float32(0.5)
    return np.concatenate([x, x])


def query_input(qid: int, n: int) -> np.ndarray:
    """Query qid's input: n floats in [-0.5, 0.5), a function of qid alone (a
    rotation of one pattern: a view, so that issuing a batch costs one copy)."""
    off = qid * 977 % n
    return _input_base(n)[off:off + n]


def summary_ms(values: list[float]) -> dict[str, float | None]:
    """p50 / p99 / mean of seconds, in ms."""
    if not values:
        return {"p50": None, "p99": None, "mean": None}
    a = np.asarray(values) * 1e3
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)), "mean": float(a.mean())}


# --- processes -------------------------------------------------------------

@dataclass(eq=False)
class Instance:
    """A stage instance: its process, and the batch it is running (None: free)."""
    name: str
    stage: int
    kind: str
    quota: int
    device: int
    proc: subprocess.Popen
    log: Path
    info: dict = field(default_factory=dict)
    busy: Batch | None = None
    since: float = 0.0
    last_free: float = 0.0
    batches: int = 0

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass(eq=False)
class Batch:
    """Queries issued together (§V-B step 2), going through the stages as one unit."""
    id: int
    qids: list[int]
    stage: int = 0
    payload: Any = b""           # its input: query data (array), or the producer's frame (handle or bytes)
    producer: Instance | None = None
    ready_at: float = 0.0        # monotonic: waiting for an instance of `stage` since
    dispatched: float = 0.0
    wall_out: float = 0.0        # the producer's reply: its sent_at, our receipt (wall clock)
    wall_in: float = 0.0
    prev_out_s: float = 0.0      # the producer's output step (export / D2H)
    wall_sent: float = 0.0       # when we sent it on to the consumer


def proc_start(pid: int) -> str | None:
    """A process's start time (field 22 of /proc/PID/stat): with the pid, an identity."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def log_tail(path: Path, n: int = 300) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1][-n:] if lines else ""


def how_ended(rc: int) -> str:
    return f"killed by signal {-rc}" if rc < 0 else f"exit code {rc}"


@dataclass
class Options:
    """`colocate pipeline run`'s options."""
    copy: bool = False
    rate: float = 20.0
    queries: int = 100
    scale: float | None = None
    seed: int = 1
    ready_timeout_s: float = 120.0
    stage_timeout_s: float = 60.0


class Pipeline:
    """One live pipeline: its stage processes, the queries, the statistics."""

    def __init__(self, spec: PipelineSpec, rd: RunDir, device: str, opts: Options):
        self.spec, self.rd, self.device, self.opts = spec, rd, device, opts
        self.scale = opts.scale or spec.scale or SCALE.get(device, 1.0)
        self.insts: list[Instance] = []
        self.by_name: dict[str, Instance] = {}
        self.sock: Any = None
        self.ctx: Any = None
        self.pid_start = proc_start(os.getpid())
        base = subdir(rd.path, "pipelines")
        self.state_file = base / f"{spec.name}-{os.getpid()}.json"
        self.logs = base / f"{spec.name}-{os.getpid()}.logs"
        self.endpoint = f"ipc://{base}/{os.getpid()}.sock"
        self.started = time.time()
        self.failed = False
        self._reset_stats()

    def _reset_stats(self) -> None:
        n = len(self.spec.stages)
        self.waiting: collections.deque[int] = collections.deque()
        self.pending: list[collections.deque[Batch]] = [collections.deque() for _ in range(n)]
        self.arrival: dict[int, float] = {}
        self.latency: dict[int, float] = {}
        self.crcs: dict[int, int] = {}
        self.est: list[float | None] = [None] * n
        self.st: list[dict[str, list[float]]] = [collections.defaultdict(list) for _ in range(n)]
        self.hops: list[dict[str, list]] = [collections.defaultdict(list) for _ in range(max(n - 1, 0))]
        self.batch_ids = 0
        self.first_done = self.last_done = 0.0

    # --- start / stop --------------------------------------------------------

    @property
    def nets(self) -> bool:
        """Table I stages (Tonic networks), not artifact stages."""
        return self.spec.stages[0].kind in suite().NETS

    def check_built(self) -> None:
        for p in (WORKER, STAGE_LIB, STAGE_TWINS) + ((TONIC_LIB,) + TONIC_TWINS if self.nets else ()):
            if not p.exists():
                raise ColocateError(f"{p} is missing: run `make build` in a source checkout of colocate")

    def in_n(self, stage: int) -> int:
        """Floats per query a stage receives: the service input, or the previous
        stage's output (an artifact's out_mb; a network's out_n from its ready
        message, 0 before: the worker takes it from each batch)."""
        s = suite()
        kinds = [st.kind for st in self.spec.stages]
        if stage == 0:
            return max(1, round(s.first_input_mb(kinds[0]) * s.MB / F32))
        if self.nets:
            return next((int(i.info["out_n"]) for i in self.insts if i.stage == stage - 1 and i.info), 0)
        return max(1, round(s.ARTIFACT[kinds[stage - 1]].out_mb * s.MB / F32))

    def env_for(self, st: StageSpec, device: int) -> dict[str, str]:
        """An instance's environment on top of launcher.app_env's."""
        env = dict(os.environ, COLOCATE_QUIET="1", PYTHONUNBUFFERED="1",
                   CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(st.quota))
        if self.device == "sim":
            ours = [STAGE_TWINS] + (list(TONIC_TWINS) if self.nets else [])
            twins = [str(p) for p in ours] + [p for p in env.get("SIMGPU_TWINS", "").split(":") if p]
            env["SIMGPU_TWINS"] = ":".join(dict.fromkeys(twins))
            base = env.get("SIMGPU_DIR") or str(self.rd.simgpu)
            if device:
                Path(f"{base}-{device}").mkdir(mode=0o700, exist_ok=True)
            env["SIMGPU_DIR"] = f"{base}-{device}" if device else base
        else:
            env["CUDA_VISIBLE_DEVICES"] = str(device)
        return env

    def start(self) -> None:
        """Start every instance under the shim and wait until each says ready."""
        import zmq
        self.check_built()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.endpoint)
        self.logs.mkdir(mode=0o700, exist_ok=True)
        for s, st in enumerate(self.spec.stages):
            for i in range(st.instances):
                self._spawn(s, st, i)
        self._wait_ready()
        self.write_state()

    def _spawn(self, s: int, st: StageSpec, i: int) -> None:
        name = f"{st.kind}.{i}" if sum(x.kind == st.kind for x in self.spec.stages) == 1 else f"{st.kind}.{s}.{i}"
        device = st.devices[i % len(st.devices)]
        cmd = [sys.executable, str(WORKER), "--kind", st.kind, "--name", name, "--endpoint", self.endpoint,
               "--in-n", str(self.in_n(s)), "--batch-max", str(self.spec.batch), "--scale", repr(self.scale),
               "--parent", str(os.getpid())] + ([] if self.opts.copy else ["--handles"])
        app = launcher.AppSpec(cmd, name=f"{self.spec.name}.{name}", cls="qos", qos_ms=self.spec.qos_ms,
                               quota_pct=st.quota)
        log = self.logs / f"{name}.log"
        with open(log, "wb") as f:
            proc = launcher.spawn(app, self.rd, self.device, env=self.env_for(st, device), stdin=subprocess.DEVNULL,
                                  stdout=f, stderr=subprocess.STDOUT)
        inst = Instance(name, s, st.kind, st.quota, device, proc, log)
        self.insts.append(inst)
        self.by_name[name] = inst

    def _wait_ready(self) -> None:
        end = time.monotonic() + self.opts.ready_timeout_s
        while any(not i.info for i in self.insts):
            self.check_health(time.monotonic())
            if time.monotonic() > end:
                late = ", ".join(i.name for i in self.insts if not i.info)
                raise StageFailed(f"stage instance(s) {late} not ready within {self.opts.ready_timeout_s:g} s")
            if self.sock.poll(100):
                ident, hdr, _ = self._recv()
                inst = self.by_name.get(ident)
                if inst is not None and hdr.get("op") == "ready":
                    inst.info = hdr
                elif hdr.get("op") == "error":
                    self._failed_batch(ident, hdr)

    def stop(self) -> None:
        """Stop every instance: "stop", then SIGTERM, then SIGKILL; never leaves one behind."""
        for inst in self.insts:
            if inst.alive():
                self._send(inst, {"op": "stop"})
        self._wait_all(3.0)
        for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
            for inst in self.insts:
                if inst.alive():
                    inst.proc.send_signal(sig)
            self._wait_all(wait)
        if self.sock is not None:
            self.sock.close(0)
            self.ctx.term()
            self.sock = None
        Path(self.endpoint[len("ipc://"):]).unlink(missing_ok=True)
        self.state_file.unlink(missing_ok=True)
        if not self.failed:
            for p in self.logs.glob("*.log"):
                p.unlink(missing_ok=True)
            try:
                self.logs.rmdir()
            except OSError:
                pass

    def _wait_all(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        for inst in self.insts:
            try:
                inst.proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass

    # --- messages ----------------------------------------------------------------

    def _send(self, inst: Instance, hdr: dict, payload: Any = None) -> None:
        import zmq
        frames = [inst.name.encode(), json.dumps(hdr).encode()] + ([payload] if payload is not None else [])
        try:
            self.sock.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass                        # a dead peer: check_health says so

    def _recv(self) -> tuple[str, dict, Any]:
        """(instance name, header, payload): the payload a zmq.Frame, forwarded as it is."""
        frames = self.sock.recv_multipart(copy=False)
        return frames[0].bytes.decode(), json.loads(frames[1].bytes), frames[2] if len(frames) > 2 else b""

    def _failed_batch(self, ident: str, hdr: dict) -> None:
        inst = self.by_name.get(ident)
        pid = f" (pid {inst.proc.pid})" if inst else ""
        raise StageFailed(f"stage instance {ident}{pid} failed batch {hdr.get('batch')}: {hdr.get('error')}")

    def check_health(self, now: float) -> None:
        """A dead instance, or one sitting on a batch too long, fails the run."""
        for inst in self.insts:
            rc = inst.proc.poll()
            if rc is not None:
                tail = log_tail(inst.log)
                raise StageFailed(f"stage instance {inst.name} (pid {inst.proc.pid}) died: {how_ended(rc)}"
                                  + (f"; its last words: {tail}" if tail else ""))
            if inst.busy is not None and now - inst.since > self.opts.stage_timeout_s:
                raise StageFailed(f"stage instance {inst.name} (pid {inst.proc.pid}) has not answered batch "
                                  f"{inst.busy.id} in {self.opts.stage_timeout_s:g} s")

    # --- the query loop (§V-B) -------------------------------------------------------

    def run(self) -> dict:
        """Send the queries through, return the report (see report())."""
        n = self.opts.queries
        offs = arrivals(n, self.opts.rate, self.opts.seed)
        t0 = time.monotonic() + 0.05
        nxt, last_state = 0, 0.0
        self.t0 = t0
        while len(self.latency) < n:
            now = time.monotonic()
            while nxt < n and t0 + offs[nxt] <= now:
                self.arrival[nxt] = t0 + offs[nxt]
                self.waiting.append(nxt)
                nxt += 1
            self.issue(now, last=nxt >= n)
            self.dispatch(now)
            self.check_health(now)
            if now - last_state >= STATE_EVERY_S:
                self.write_state()
                last_state = now
            wake = min(([t0 + offs[nxt]] if nxt < n else []) + [now + 0.05])
            if self.waiting:
                wake = min(wake, self.deadline(self.waiting[0]))
            if self.sock.poll(max(0, int((wake - time.monotonic()) * 1000))):
                while self.sock.poll(0):
                    self.on_message(*self._recv())
        return self.report()

    def predicted_s(self) -> float:
        """The pipeline's predicted time for a batch (step 2): inf until each stage has one."""
        return math.inf if any(e is None for e in self.est) else sum(e for e in self.est if e is not None)

    def deadline(self, qid: int) -> float:
        """When query qid must be issued: its arrival + (1 - HEADROOM) target - predicted time."""
        return self.arrival[qid] + (1 - HEADROOM) * self.spec.qos_ms / 1e3 - self.predicted_s()

    def issue(self, now: float, last: bool = False) -> None:
        """Step 2: batch the waiting queries when `batch` wait or the oldest cannot wait;
        `last`: every query of the run has arrived, so none will wait for batch-mates
        that cannot come (on an H200 the run's last batch waited until its deadline,
        which made every run's p99 about 0.9 x QoS)."""
        b = self.spec.batch
        while self.waiting and (len(self.waiting) >= b or last or now >= self.deadline(self.waiting[0])):
            qids = [self.waiting.popleft() for _ in range(min(b, len(self.waiting)))]
            n = self.in_n(0)
            data = np.concatenate([query_input(q, n) for q in qids])
            self.batch_ids += 1
            self.pending[0].append(Batch(self.batch_ids, qids, payload=data, ready_at=now))

    def pick(self, stage: int, producer: Instance | None) -> Instance | None:
        """A free instance of stage: on the producer's device if one is free, else any; the longest idle."""
        free = [i for i in self.insts if i.stage == stage and i.busy is None]
        if not free:
            return None
        dev = producer.device if producer else None
        return min(free, key=lambda i: (i.device != dev, i.last_free))

    def dispatch(self, now: float) -> None:
        last = len(self.spec.stages) - 1
        for s, queue in enumerate(self.pending):
            while queue:
                inst = self.pick(s, queue[0].producer)
                if inst is None:
                    break
                bt = queue.popleft()
                handles = not self.opts.copy
                hdr = {"op": "run", "batch": bt.id, "queries": bt.qids,
                       "in": "handle" if s > 0 and handles else "bytes",
                       "out": "handle" if s < last and handles else "host", "crc": s == last}
                inst.busy, inst.since, bt.dispatched, bt.wall_sent = bt, now, now, time.time()
                self.st[s]["wait"].append(now - bt.ready_at)
                self._send(inst, hdr, bt.payload)

    def on_message(self, ident: str, hdr: dict, payload: Any) -> None:
        """A stage's reply: record it, free the instance, pass the batch on (or finish it)."""
        if hdr.get("op") == "error":
            self._failed_batch(ident, hdr)
        inst = self.by_name.get(ident)
        if hdr.get("op") != "done" or inst is None or inst.busy is None or inst.busy.id != hdr.get("batch"):
            return
        now, bt = time.monotonic(), inst.busy
        inst.busy, inst.last_free, inst.batches = None, now, inst.batches + 1
        self.record_stage(inst, bt, hdr, now)
        if bt.producer is not None and not self.opts.copy:
            self._send(bt.producer, {"op": "drop", "batch": bt.id})
        if inst.stage == len(self.spec.stages) - 1:
            self.finish(bt, hdr, now)
            return
        bt.stage, bt.payload, bt.producer, bt.ready_at = inst.stage + 1, payload, inst, now
        bt.wall_out, bt.wall_in, bt.prev_out_s = hdr["sent_at"], time.time(), hdr["out_s"]
        self.pending[bt.stage].append(bt)

    def record_stage(self, inst: Instance, bt: Batch, hdr: dict, now: float) -> None:
        s = inst.stage
        service = now - bt.dispatched
        st = self.st[s]
        st["service"].append(service)
        st["latency"].append(now - bt.ready_at)
        st["size"].append(len(bt.qids))
        for k in ("in_s", "work_s", "out_s"):
            st[k].append(hdr[k])
        prev = self.est[s]
        self.est[s] = service if prev is None else (1 - EWMA) * prev + EWMA * service
        if s > 0:       # the hop from the producer: its output step, the transport both ways, our input step
            hop = self.hops[s - 1]
            transport = max(0.0, bt.wall_in - bt.wall_out) + max(0.0, hdr["recv_at"] - bt.wall_sent)
            hop["total"].append(bt.prev_out_s + transport + hdr["in_s"])
            hop["producer"].append(bt.prev_out_s)
            hop["transport"].append(transport)
            hop["consumer"].append(hdr["in_s"])
            hop["how"].append(hdr["in_how"])
            hop["bytes"].append(len(bt.qids) * self.in_n(s) * F32)

    def finish(self, bt: Batch, hdr: dict, now: float) -> None:
        crcs = hdr.get("crcs") or []
        if len(crcs) != len(bt.qids):
            raise StageFailed(f"the last stage returned {len(crcs)} checksums for {len(bt.qids)} queries")
        for q, c in zip(bt.qids, crcs):
            self.crcs[q] = int(c)
            self.latency[q] = now - self.arrival[q]
        self.first_done = self.first_done or now
        self.last_done = now

    # --- what it reports ------------------------------------------------------------

    def stage_report(self, s: int) -> dict:
        st, spec = self.st[s], self.spec.stages[s]
        med = {k: (float(np.median(st[k])) * 1e3 if st[k] else None) for k in ("in_s", "work_s", "out_s")}
        return {"stage": s + 1, "kind": spec.kind, "instances": spec.instances, "quota": spec.quota,
                "devices": sorted({i.device for i in self.insts if i.stage == s}),
                "batches": len(st["service"]), "mean_batch": float(np.mean(st["size"])) if st["size"] else None,
                "wait_ms": summary_ms(st["wait"]), "service_ms": summary_ms(st["service"]),
                "latency_ms": summary_ms(st["latency"]),
                "in_ms": med["in_s"], "work_ms": med["work_s"], "out_ms": med["out_s"]}

    def hop_report(self, h: int) -> dict:
        hop = self.hops[h]
        how = collections.Counter(hop["how"])
        return {"from": self.spec.stages[h].kind, "to": self.spec.stages[h + 1].kind,
                "buffers": len(hop["total"]), "handoffs": how["mapped"] + how["same-process"],
                "copies": sum(v for k, v in how.items() if k not in ("mapped", "same-process")),
                "bytes_mean": float(np.mean(hop["bytes"])) if hop["bytes"] else None,
                "ms": summary_ms(hop["total"]),
                "parts_ms_p50": {k: (float(np.median(hop[k])) * 1e3 if hop[k] else None)
                                 for k in ("producer", "transport", "consumer")}}

    def report(self) -> dict:
        """Everything measured, JSON-ready: e2e and per-stage latency, throughput,
        each hop's buffers (hand-offs vs copies, time per buffer), checksums."""
        n = len(self.latency)
        lat = [self.latency[q] for q in sorted(self.latency)]
        span = self.last_done - self.t0 if n else 0.0
        hops = [self.hop_report(h) for h in range(len(self.hops))]
        checks = [self.crcs[q] for q in sorted(self.crcs)]
        return {"pipeline": self.spec.name, "spec": self.spec.path, "mode": "copy" if self.opts.copy else "handle",
                "device": self.device, "scale": self.scale, "batch": self.spec.batch, "qos_ms": self.spec.qos_ms,
                "rate_qps": self.opts.rate, "queries": n,
                "e2e_ms": {**summary_ms(lat), "violations": sum(x * 1e3 > self.spec.qos_ms for x in lat)},
                "throughput_qps": n / span if span > 0 else None,
                "stages": [self.stage_report(s) for s in range(len(self.spec.stages))],
                "hops": hops, "handoffs": sum(h["handoffs"] for h in hops), "copies": sum(h["copies"] for h in hops),
                "checksums": checks, "digest": zlib.crc32(np.asarray(checks, np.uint32).tobytes())}

    def write_state(self) -> None:
        """DIR/pipelines/<name>-<pid>.json for `colocate pipeline ls` (atomically)."""
        lat = list(self.latency.values())
        ms = summary_ms(lat)
        state = {"name": self.spec.name, "spec": self.spec.path, "pid": os.getpid(), "pid_start": self.pid_start,
                 "mode": "copy" if self.opts.copy else "handle", "device": self.device, "started": self.started,
                 "updated": time.time(), "queries_total": self.opts.queries, "queries_done": len(lat),
                 "p50_ms": ms["p50"], "p99_ms": ms["p99"],
                 "qos_ms": self.spec.qos_ms,
                 "stages": [{"kind": st.kind, "quota": st.quota,
                             "instances": [{"name": i.name, "pid": i.proc.pid, "device": i.device,
                                            "alive": i.alive(), "batches": i.batches}
                                           for i in self.insts if i.stage == s]}
                            for s, st in enumerate(self.spec.stages)]}
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.state_file)


class _Interrupted(Exception):
    pass


def run(spec: PipelineSpec, rd: RunDir, device: str, opts: Options) -> dict:
    """Start the pipeline, send opts.queries through, stop it; the report.
    Ctrl-C / SIGTERM stop every stage (ColocateError 130 / 143); a failed
    stage stops the others (StageFailed, exit 1)."""
    if not opts.rate > 0:
        raise ColocateError(f"--rate must be > 0 (got {opts.rate:g})", 2)
    if opts.queries < 1:
        raise ColocateError(f"--queries must be >= 1 (got {opts.queries})", 2)
    pipe = Pipeline(spec, rd, device, opts)

    def on_term(sig: int, _frame: Any) -> None:
        raise _Interrupted(sig)
    old = signal.signal(signal.SIGTERM, on_term)
    try:
        pipe.start()
        return pipe.run()
    except (KeyboardInterrupt, _Interrupted) as e:
        sig = e.args[0] if isinstance(e, _Interrupted) else signal.SIGINT
        raise ColocateError(f"interrupted: stopped the pipeline's {len(pipe.insts)} stage process(es)",
                            128 + sig) from None
    except StageFailed as e:
        pipe.failed = True
        raise StageFailed(f"{e}; stopped the other stages (logs: {pipe.logs})") from None
    finally:
        signal.signal(signal.SIGTERM, old)
        pipe.stop()


# --- `colocate pipeline ls` ------------------------------------------------------

def running(rd: RunDir) -> Iterator[dict]:
    """The live pipelines' states; the files of runners that are gone are removed."""
    d = rd.path / "pipelines"
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            state = json.loads(f.read_text())
            pid = int(state["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            state, pid = None, 0
        if state is None or proc_start(pid) is None or proc_start(pid) != state.get("pid_start"):
            f.unlink(missing_ok=True)           # and the socket of a runner that was killed
            if pid:
                (d / f"{pid}.sock").unlink(missing_ok=True)
            continue
        yield state
