"""The process pool: worker processes at fixed SM quotas that run forwarded launches.

    pool = Pool(rundir, "sim", parse_spec("10:2,40:2,100:1"))
    pool.start()                 # spawn every worker (returns at once)
    pool.wait_ready(10)          # optional: until all are ready (the controller just ticks)
    dead = pool.check()          # each tick: READY lines, deaths, restarts; ids of workers gone
    wid = pool.pick(40)          # a ready worker at exactly 40 %, least loaded
    pool.stats()                 # [{"id", "quota_pct", "pid", "state", "forwarded", "apps", ...}]
    pool.stop()                  # SIGTERM, wait, SIGKILL stragglers, stop MPS if we started it

Worker contract (shim/lib/colocate-worker, sources in processpool/worker/):

    colocate-worker --id N --quota Q --runtime-dir DIR
    env: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=Q, COLOCATE_LIBZMQ; on sim LD_LIBRARY_PATH
         (simgpu first), SIMGPU_DIR and the caller's SIMGPU_*; on cuda CUDA_MPS_PIPE_DIRECTORY
         and CUDA_MPS_LOG_DIRECTORY
    prints "READY worker N quota Q pid P" once ready, serves ZeroMQ ROUTER ipc://DIR/worker-N.sock,
    writes DIR/worker-N.pid, answers {"v":1,"type":"stats"}, exits cleanly on SIGTERM.

A worker id is never reused in a pool's lifetime: a restarted worker gets a
new one, so an app's route (a worker id in its control-block slot) never
silently points at another process.  Each worker's stderr (and anything it
prints after READY) goes to DIR/worker-N.log.  $COLOCATE_WORKER_CMD (a
shell-quoted command) replaces the worker executable, for tests.
"""
from __future__ import annotations

import collections
import ctypes
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import zmq

from processpool.mps import Mps
from shim import launcher, paths
from shim.rundir import ColocateError, RunDir

log = logging.getLogger("colocate.pool")

WORKER_EXE = paths.LIB_DIR / "colocate-worker"
WORKER_CMD_ENV = "COLOCATE_WORKER_CMD"
MAX_WORKERS = 48                 # MPS clients per device up to CUDA 13.0 (error 808 beyond)
DEFAULT_SPEC = ",".join(f"{q}:2" for q in range(10, 101, 10))
SPEC_HELP = ("Process pool: QUOTA:COUNT pairs separated by commas, e.g. 10:4,50:2,100:1 "
             "(QUOTA = SM share in percent 1..100, COUNT workers at that quota; at most "
             f"{MAX_WORKERS} workers in all, the MPS client limit per device), "
             "or none for no pool. Default: 2 workers at each of 10, 20, ..., 100 % "
             "(10:2,20:2,...,100:2).")
STATES = ("starting", "ready", "dead", "failed")
# counters a worker's stats may carry beyond forwarded/apps, passed on as they are
OPTIONAL_STATS = ("modules", "module_loads", "refused_kernels", "translated")
READY_RE = re.compile(rb"^READY worker (\d+) quota (\d+) pid (\d+)\s*$")
_SUN_PATH_MAX = 107


class PoolError(ColocateError):
    pass


class SpecError(PoolError):
    def __init__(self, message: str):
        super().__init__(message, code=2)


# --- the spec -----------------------------------------------------------------

def parse_spec(spec: str | None) -> list[tuple[int, int]] | None:
    """"10:4,20:4" -> [(10, 4), (20, 4)]; None or "default" -> the default pool;
    "none" -> None (no pool).  SpecError (one line) for anything else."""
    if spec is None or spec.strip().lower() == "default":
        spec = DEFAULT_SPEC
    text = spec.strip()
    if text.lower() == "none":
        return None
    hint = "expected QUOTA:COUNT[,QUOTA:COUNT...], e.g. 10:4,50:2,100:1, or none"
    if not text:
        raise SpecError(f"empty pool spec; {hint}")
    out: list[tuple[int, int]] = []
    seen: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        m = re.fullmatch(r"(\d+)\s*:\s*(\d+)", item)
        if not m:
            raise SpecError(f"bad pool entry {item!r} in {spec!r}; {hint}")
        q, n = int(m.group(1)), int(m.group(2))
        if not 1 <= q <= 100:
            raise SpecError(f"bad pool entry {item!r}: quota must be 1..100 (percent of the SMs)")
        if n > MAX_WORKERS:
            raise SpecError(f"bad pool entry {item!r}: count must be 0..{MAX_WORKERS}")
        if q in seen:
            raise SpecError(f"quota {q} appears twice in pool spec {spec!r}")
        seen.add(q)
        out.append((q, n))
    total = sum(n for _, n in out)
    if total > MAX_WORKERS:
        raise SpecError(f"pool spec {spec!r} asks for {total} workers; MPS allows at most "
                        f"{MAX_WORKERS} clients per device")
    return out


def format_spec(entries: list[tuple[int, int]] | None) -> str:
    return "none" if entries is None else ",".join(f"{q}:{n}" for q, n in entries)


def worker_cmd(override: list[str] | str | None = None) -> list[str]:
    """The worker command without its arguments: override, $COLOCATE_WORKER_CMD, or the executable."""
    if override is None:
        override = os.environ.get(WORKER_CMD_ENV) or None
    if isinstance(override, str):
        override = shlex.split(override)
    if override:
        return list(override)
    return [str(WORKER_EXE)]


def check_worker_cmd(cmd: list[str]) -> None:
    exe = cmd[0]
    if "/" in exe:
        p = Path(exe)
        if not p.exists():
            raise PoolError(f"worker executable {exe} is not built; run `make build` "
                            f"(or start the controller with --pool none)")
        if not os.access(p, os.X_OK) or p.is_dir():
            raise PoolError(f"worker executable {exe} is not executable")


# --- environment ----------------------------------------------------------------

APP_ONLY = ("COLOCATE_APP_NAME", "COLOCATE_APP_CLASS", "COLOCATE_QOS_MS", "COLOCATE_QUOTA_PCT")


def worker_env(runtime_dir: Path, device: str, quota: int, mps_env: Mapping[str, str] | None = None,
               base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of one worker: what an app gets from launcher.app_env
    (libzmq, simgpu library path and dir) minus the shim and the app's identity,
    plus its MPS quota (and the MPS dirs on cuda)."""
    env = launcher.app_env(launcher.AppSpec(["colocate-worker"]), RunDir(Path(runtime_dir)), device,
                           dict(os.environ if base is None else base))
    pre = [p for p in env.get("LD_PRELOAD", "").replace(" ", ":").split(":")
           if p and Path(p).name != paths.LIBCOLOCATE.name]
    if pre:                                   # a worker is no app: never preload the shim into it
        env["LD_PRELOAD"] = ":".join(pre)
    else:
        env.pop("LD_PRELOAD", None)
    for k in APP_ONLY:
        env.pop(k, None)
    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(quota)
    if device == "cuda" and mps_env:
        env.update(mps_env)
    return env


def _pdeathsig() -> None:
    """In the child before exec: SIGTERM when the controller dies (no orphan workers)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)     # PR_SET_PDEATHSIG
    except Exception:
        pass


# --- workers ----------------------------------------------------------------------

@dataclass
class Worker:
    id: int
    quota_pct: int
    position: int                             # index in the pool's layout (restarts keep it)
    proc: subprocess.Popen | None = None
    pid: int | None = None
    state: str = "starting"
    started_at: float = 0.0
    ready_at: float | None = None
    exit_reason: str = ""
    buf: bytes = b""
    log_file: Any = None
    forwarded: int = 0
    apps: int = 0
    extra: dict = field(default_factory=dict)  # OPTIONAL_STATS its last answer carried
    responsive: bool = True

    def row(self) -> dict:
        return {"id": self.id, "quota_pct": self.quota_pct, "pid": self.pid, "state": self.state,
                "forwarded": self.forwarded, "apps": self.apps, **self.extra}


@dataclass
class Position:
    """One place in the pool's layout: the worker holding it now and its deaths."""
    quota_pct: int
    worker: Worker | None = None
    deaths: collections.deque = field(default_factory=lambda: collections.deque(maxlen=64))
    restarts: int = 0
    retry_at: float | None = None


class Pool:
    def __init__(self, runtime_dir: str | os.PathLike, device: str, entries: list[tuple[int, int]],
                 cmd: list[str] | str | None = None, ready_timeout: float = 15.0,
                 max_restarts: int = 3, restart_window: float = 60.0, backoff: float = 0.5,
                 stop_timeout: float = 5.0, stats_timeout: float = 0.25,
                 ctx: zmq.Context | None = None, env: Mapping[str, str] | None = None):
        self.dir = Path(runtime_dir)
        self.device = device
        self.entries = list(entries)
        self.cmd = worker_cmd(cmd)
        self.ready_timeout, self.stop_timeout, self.stats_timeout = ready_timeout, stop_timeout, stats_timeout
        self.max_restarts, self.restart_window, self.backoff = max_restarts, restart_window, backoff
        self.ctx = ctx or zmq.Context.instance()
        self.base_env = dict(os.environ if env is None else env)
        self.positions = [Position(q) for q, n in self.entries for _ in range(n)]
        self.next_id = 1
        self.by_id: dict[int, Worker] = {}       # every worker this pool started, by id
        self.mps: Mps | None = None
        self.started = False
        self.stopping_now = False
        longest = self.endpoint_path(10 ** 6)
        if len(str(longest).encode()) > _SUN_PATH_MAX:
            raise PoolError(f"runtime dir path too long for worker sockets ({longest}); "
                            f"use a shorter --runtime-dir")

    @property
    def spec(self) -> str:
        return format_spec(self.entries)

    # --- paths
    def endpoint_path(self, wid: int) -> Path:
        return self.dir / f"worker-{wid}.sock"

    def endpoint(self, wid: int) -> str:
        return f"ipc://{self.endpoint_path(wid)}"

    def pidfile(self, wid: int) -> Path:
        return self.dir / f"worker-{wid}.pid"

    def logfile(self, wid: int) -> Path:
        return self.dir / f"worker-{wid}.log"

    # --- lifecycle
    def start(self) -> None:
        """Start MPS (cuda) and spawn every worker; returns without waiting for READY."""
        check_worker_cmd(self.cmd)
        if self.device == "cuda" and self.positions:
            self.mps = Mps(self.dir, self.base_env)
            self.mps.ensure()
        for stale in list(self.dir.glob("worker-*.sock")) + list(self.dir.glob("worker-*.pid")):
            stale.unlink(missing_ok=True)       # a previous controller's; ids restart at 1
        self.started = True
        log.info("process pool %s on %s: %d worker(s), command %s", self.spec, self.device,
                 len(self.positions), " ".join(map(shlex.quote, self.cmd)))
        now = time.monotonic()
        for pos in self.positions:
            self._spawn(pos, now)

    def _spawn(self, pos: Position, now: float) -> Worker:
        wid = self.next_id
        self.next_id += 1
        w = Worker(wid, pos.quota_pct, self.positions.index(pos), started_at=now)
        pos.worker, pos.retry_at = w, None
        self.by_id[wid] = w
        argv = [*self.cmd, "--id", str(wid), "--quota", str(pos.quota_pct), "--runtime-dir", str(self.dir)]
        env = worker_env(self.dir, self.device, pos.quota_pct, self.mps.env() if self.mps else None,
                         self.base_env)
        try:
            w.log_file = open(self.logfile(wid), "wb", buffering=0)
            w.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=w.log_file, env=env, close_fds=True, bufsize=0,
                                      start_new_session=True, preexec_fn=_pdeathsig)
        except OSError as e:
            self._died(w, now, f"cannot start {argv[0]}: {e.strerror or e}")
            return w
        w.pid = w.proc.pid
        assert w.proc.stdout is not None                 # stdout=PIPE
        os.set_blocking(w.proc.stdout.fileno(), False)
        log.info("worker %d (quota %d%%) starting: pid %d", wid, pos.quota_pct, w.pid)
        return w

    def _read(self, w: Worker) -> bool:
        """Drain the worker's stdout; handle READY; lines after it go to its log.
        Returns False at end of file."""
        if w.proc is None or w.proc.stdout is None:
            return False
        fd = w.proc.stdout.fileno()
        eof = False
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            except OSError:
                eof = True
                break
            if not chunk:
                eof = True
                break
            w.buf += chunk
        while b"\n" in w.buf:
            line, w.buf = w.buf.split(b"\n", 1)
            self._line(w, line)
        if len(w.buf) > 65536:                  # no newline in 64 KiB: not our protocol
            self._line(w, w.buf)
            w.buf = b""
        return not eof

    def _line(self, w: Worker, line: bytes) -> None:
        m = READY_RE.match(line) if w.state == "starting" else None
        if m is None:
            try:
                w.log_file.write(b"[stdout] " + line + b"\n")
            except (OSError, ValueError, AttributeError):
                pass
            return
        wid, q, pid = map(int, m.groups())
        if (wid, q) != (w.id, w.quota_pct):
            log.error("worker %d (quota %d%%) announced itself as worker %d quota %d; killing it",
                      w.id, w.quota_pct, wid, q)
            self._kill(w)
            return
        w.state, w.pid, w.ready_at = "ready", pid, time.monotonic()
        log.info("worker %d (quota %d%%) ready: pid %d, %s (%.2f s)", w.id, w.quota_pct, pid,
                 self.endpoint(w.id), w.ready_at - w.started_at)

    def _kill(self, w: Worker) -> None:
        if w.proc is not None and w.proc.poll() is None:
            try:
                w.proc.kill()
            except ProcessLookupError:
                pass

    def _close(self, w: Worker) -> None:
        if w.proc is not None and w.proc.stdout is not None:
            w.proc.stdout.close()
        if w.log_file is not None:
            w.log_file.close()
            w.log_file = None
        self.endpoint_path(w.id).unlink(missing_ok=True)
        self.pidfile(w.id).unlink(missing_ok=True)

    def _died(self, w: Worker, now: float, why: str) -> None:
        """Mark w dead, clean its files, and schedule a restart of its position
        (or mark it failed when it keeps dying)."""
        was = w.state
        w.state, w.exit_reason = "dead", why
        self._close(w)
        pos = self.positions[w.position]
        pos.deaths.append(now)
        recent = [t for t in pos.deaths if now - t <= self.restart_window]
        if self.stopping_now or not self.started:
            return
        if len(recent) > self.max_restarts:
            w.state = "failed"
            log.error("worker %d (quota %d%%) %s; it died %d times in %g s: not restarting it "
                      "(see %s)", w.id, w.quota_pct, why, len(recent), self.restart_window, self.logfile(w.id))
            return
        delay = self.backoff * 2 ** (len(recent) - 1)
        pos.retry_at = now + delay
        log.warning("worker %d (quota %d%%, %s) %s; restarting it with a new id in %.1f s (log %s)",
                    w.id, w.quota_pct, was, why, delay, self.logfile(w.id))

    def check(self, now: float | None = None) -> list[int]:
        """One tick: READY lines, exits, READY timeouts, due restarts.
        Returns the ids of the workers that died in this call (apps routed to
        them must go back to route 0)."""
        if not self.started:
            return []
        now = time.monotonic() if now is None else now
        gone: list[int] = []
        for pos in self.positions:
            w = pos.worker
            if w is None:
                continue
            if w.state in ("starting", "ready"):
                self._read(w)
                code = w.proc.poll() if w.proc is not None else None
                if code is not None:
                    self._read(w)                # a READY printed just before dying still counts
                    why = (f"exited with code {code}" if code >= 0
                           else f"was killed by {signal.Signals(-code).name}")
                    gone.append(w.id)
                    self._died(w, now, why)
                elif w.state == "starting" and now - w.started_at > self.ready_timeout:
                    self._kill(w)
                    if w.proc is not None:
                        w.proc.wait()
                    gone.append(w.id)
                    self._died(w, now, f"was not ready within {self.ready_timeout:g} s")
            if w.state == "dead" and pos.retry_at is not None and now >= pos.retry_at:
                pos.restarts += 1
                self._spawn(pos, now)
        return gone

    def wait_ready(self, timeout: float = 10.0) -> bool:
        """Check until no worker is starting (or timeout); True when all are ready."""
        end = time.monotonic() + timeout
        while True:
            self.check()
            states = [p.worker.state for p in self.positions if p.worker]
            if "starting" not in states and all(p.retry_at is None for p in self.positions):
                return all(s == "ready" for s in states)
            if time.monotonic() > end:
                return False
            time.sleep(0.02)

    def stop(self) -> None:
        """SIGTERM every worker, wait, SIGKILL stragglers, then quit MPS if we started it."""
        self.stopping_now = True
        live = [(p.worker, p.worker.proc) for p in self.positions
                if p.worker and p.worker.proc is not None and p.worker.proc.poll() is None]
        for _, proc in live:
            try:
                proc.terminate()
            except ProcessLookupError:
                pass
        end = time.monotonic() + self.stop_timeout
        for w, proc in live:
            try:
                proc.wait(max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %d (pid %d) ignored SIGTERM for %g s; killing it", w.id, proc.pid,
                            self.stop_timeout)
                proc.kill()
                proc.wait()
        for p in self.positions:
            wp = p.worker
            if wp is None:
                continue
            if wp.proc is not None:
                wp.proc.poll()
            if wp.state in ("starting", "ready"):
                wp.state = "dead"
                wp.exit_reason = "stopped"
            self._close(wp)
            p.retry_at = None
        if live:
            log.info("process pool stopped (%d worker(s))", len(live))
        if self.mps is not None:
            self.mps.stop()
        self.started = False

    # --- queries
    def workers(self) -> list[Worker]:
        return [p.worker for p in self.positions if p.worker is not None]

    def worker(self, wid: int) -> Worker | None:
        return self.by_id.get(wid)

    def is_ready(self, wid: int) -> bool:
        w = self.by_id.get(wid)
        return w is not None and w.state == "ready"

    def quota_of(self, wid: int) -> int | None:
        w = self.by_id.get(wid)
        return w.quota_pct if w else None

    def quotas(self) -> list[int]:
        return sorted({q for q, n in self.entries if n > 0})

    def pick(self, quota_pct: int, load: Mapping[int, int] | None = None) -> int | None:
        """A ready worker at exactly quota_pct, the one with the fewest routed
        apps (load: worker id -> apps; default: what the workers last reported)."""
        ready = [w for w in self.workers() if w.state == "ready" and w.quota_pct == quota_pct]
        if not ready:
            return None
        key = (lambda w: (load.get(w.id, 0), w.id)) if load is not None else (lambda w: (w.apps, w.id))
        return min(ready, key=key).id

    def why_none(self, quota_pct: int) -> str:
        """Why pick(quota_pct) found nothing, in words."""
        at = [w for w in self.workers() if w.quota_pct == quota_pct]
        if not at:
            return (f"the pool has no worker at {quota_pct}% (quotas: "
                    f"{', '.join(f'{q}%' for q in self.quotas()) or 'none'})")
        states = collections.Counter(w.state for w in at)
        return (f"no ready worker at {quota_pct}% ("
                + ", ".join(f"{n} {s}" for s, n in sorted(states.items())) + ")")

    def stats(self, timeout: float | None = None) -> list[dict]:
        """Ask every ready worker for its stats (all at once, one shared
        deadline).  One row per worker position; a ready worker that does not
        answer in time is reported with state "unresponsive"."""
        timeout = self.stats_timeout if timeout is None else timeout
        socks: dict[zmq.Socket, Worker] = {}
        poller = zmq.Poller()
        for w in self.workers():
            if w.state != "ready":
                continue
            s = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.MAXMSGSIZE, 1 << 20)
            s.connect(self.endpoint(w.id))
            s.send_multipart([b"", b'{"v":1,"type":"stats"}'], zmq.NOBLOCK)
            socks[s] = w
            poller.register(s, zmq.POLLIN)
        answered: set[int] = set()
        end = time.monotonic() + timeout
        try:
            while len(answered) < len(socks):
                left = end - time.monotonic()
                if left <= 0:
                    break
                for s, _ in poller.poll(int(left * 1000) + 1):
                    w = socks[s]
                    try:
                        frames = s.recv_multipart(zmq.NOBLOCK)
                    except zmq.ZMQError:
                        continue
                    poller.unregister(s)
                    answered.add(w.id)
                    self._take_stats(w, frames)
        finally:
            for s in socks:
                s.close()
        rows = []
        for w in self.workers():
            if w.state == "ready":
                w.responsive = w.id in answered
            row = w.row()
            if w.state == "ready" and not w.responsive:
                row["state"] = "unresponsive"
            rows.append(row)
        return rows

    def _take_stats(self, w: Worker, frames: list[bytes]) -> None:
        try:
            if len(frames) != 2 or frames[0] != b"":
                raise ValueError(f"{len(frames)} frame(s)")
            m = json.loads(frames[1])
            if not isinstance(m, dict) or m.get("type") != "stats" or m.get("id") != w.id:
                raise ValueError(f"unexpected answer {frames[1][:200]!r}")
            for k in ("forwarded", "apps"):
                if isinstance(m.get(k), int) and not isinstance(m.get(k), bool):
                    setattr(w, k, m[k])
            w.extra = {k: m[k] for k in OPTIONAL_STATS
                       if isinstance(m.get(k), int) and not isinstance(m.get(k), bool)}
        except ValueError as e:
            log.warning("worker %d: bad stats answer: %s", w.id, e)
