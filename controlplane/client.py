"""Talking to a controller from outside: one request and its reply, whether
one runs (its pid file and its lock), starting one in the background and
waiting for it to go.  What `colocate` subcommands, the demo, the benchmarks
and the tests use; the controller itself is controlplane/daemon.py.
"""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import zmq

from controlplane import protocol
from shim.rundir import ColocateError, RunDir


class NoController(ColocateError):
    pass


# --- processes ---------------------------------------------------------------

def proc_start(pid: int) -> int | None:
    """Start time (clock ticks since boot) of a running pid; None if it is gone
    or a zombie.  Compared on each check, it guards against pid reuse."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    except OverflowError:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return 0                     # no /proc: trust kill(pid, 0)
    fields = stat[stat.rfind(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def read_pid(rd: RunDir) -> int | None:
    try:
        return int(rd.pidfile.read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


# --- client side ------------------------------------------------------------

def request(rd: RunDir, type: str, timeout: float = 1.0, **fields: Any) -> dict:
    """Send one request to the controller in rd and return its reply.
    Raises NoController when none answers, ColocateError on an error reply."""
    if not rd.sock.exists():
        raise NoController(f"no controller is running in {rd.path} (start one: colocate serve --detach)")
    ctx: zmq.Context = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    try:
        s.connect(rd.endpoint)
        s.send_multipart([b"", protocol.encode(protocol.message(type, **fields))])
        if not s.poll(int(timeout * 1000)):
            raise NoController(f"no controller answers on {rd.sock} (waited {timeout:g} s)")
        reply = protocol.decode(s.recv_multipart()[-1])
    finally:
        s.close()
    if reply.get("type") == "error":
        raise ColocateError(f"controller refused {type}: {reply.get('error')}")
    return reply


def ping(rd: RunDir, timeout: float = 1.0) -> dict | None:
    try:
        return request(rd, "ping", timeout)
    except ColocateError:
        return None


# --- controlling a controller from outside ----------------------------------

def running_pid(rd: RunDir) -> int | None:
    """pid in serve.pid, but only while a controller holds its lock (a stale
    file's pid may belong to an unrelated process by now)."""
    try:
        fd = os.open(rd.pidfile, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None                                     # nobody holds it: stale
    except BlockingIOError:
        return read_pid(rd)
    finally:
        os.close(fd)


def wait_gone(pid: int, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while proc_start(pid) is not None:
        if time.monotonic() > end:
            return False
        time.sleep(0.05)
    return True


def log_tail(rd: RunDir, n: int = 20) -> str:
    try:
        return "\n".join(rd.log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


def start_background(rd: RunDir, policy: str, device: str, log_level: str = "info",
                     timeout: float = 10.0, new_session: bool = True,
                     pool: str | None = None,
                     metrics_port: int | None = None,
                     solo: Path | str | None = None,
                     env: dict[str, str] | None = None,
                     route: str = "pool") -> tuple[subprocess.Popen, dict]:
    """Start `colocate serve` as a background process and wait until it answers
    ping.  Returns (process, pong); ColocateError with the log tail otherwise.
    env: its environment (default this process's; its pool workers inherit it)."""
    cmd = [sys.executable, "-m", "controlplane.cli", "serve", "--runtime-dir", str(rd.path),
           "--policy", policy, "--device", device, "--log-level", log_level, "--no-log-stderr",
           *(["--pool", pool] if pool is not None else []),
           *(["--metrics-port", str(metrics_port)] if metrics_port is not None else []),
           *(["--solo", str(solo)] if solo is not None else []),
           "--route", route]
    with open(rd.log, "ab") as out:                     # early errors land in the log too
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=new_session, close_fds=True, env=env)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            break
        pong = ping(rd, timeout=0.2) if rd.sock.exists() else None
        if pong and pong["controller_pid"] == proc.pid:
            return proc, pong
        time.sleep(0.05)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        why = f"did not answer within {timeout:g} s"
    else:
        why = f"exited with code {proc.returncode}"
    raise ColocateError(f"controller {why}; last lines of {rd.log}:\n{log_tail(rd)}")
