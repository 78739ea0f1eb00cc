"""Start an application under the shim (what `colocate run` and the demo do).

    spec = AppSpec(["./vecadd", "--repeat", "50"], cls="qos", qos_ms=50)
    check(spec)                                   # UsageError on bad arguments
    proc = spawn(spec, rundir.ensure(), device="sim")
    code = exit_code(proc.wait())
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shim import paths
from shim.rundir import ColocateError, RunDir, subdir

CLASSES = ("qos", "batch")
DEVICES = ("auto", "sim", "cuda")


class UsageError(ColocateError):
    def __init__(self, message: str, code: int = 2):
        super().__init__(message, code)


@dataclass
class AppSpec:
    cmd: list[str]
    name: str | None = None
    cls: str = "batch"
    qos_ms: float | None = None
    quota_pct: int | None = None


def resolve_exe(cmd0: str) -> str:
    """CMD as found on PATH (or as a path); UsageError 127/126 otherwise."""
    if "/" in cmd0:
        p = Path(cmd0)
        if not p.exists():
            raise UsageError(f"{cmd0}: no such file", 127)
        if p.is_dir() or not os.access(p, os.X_OK):
            raise UsageError(f"{cmd0}: not executable", 126)
        return cmd0
    found = shutil.which(cmd0)
    if found is None:
        raise UsageError(f"{cmd0}: command not found", 127)
    return found


def check(spec: AppSpec) -> str:
    """Refuse bad arguments with a one-line UsageError; return CMD's path."""
    if not spec.cmd:
        raise UsageError("missing command: colocate run [OPTIONS] -- CMD [ARGS...]")
    if spec.cls not in CLASSES:
        raise UsageError(f"unknown class {spec.cls!r} (use qos or batch)")
    if spec.qos_ms is not None and spec.cls != "qos":
        raise UsageError("--qos-ms applies to --class qos only")
    if spec.qos_ms is not None and not spec.qos_ms > 0:
        raise UsageError(f"--qos-ms must be > 0 (got {spec.qos_ms:g})")
    if spec.quota_pct is not None and not 1 <= spec.quota_pct <= 100:
        raise UsageError(f"--quota must be 1..100 (got {spec.quota_pct})")
    if not paths.LIBCOLOCATE.exists():
        raise UsageError(f"shim library {paths.LIBCOLOCATE} is not built; run `make build`")
    return resolve_exe(spec.cmd[0])


# --- device and libraries ---------------------------------------------------

def cuda_usable() -> bool:
    """A real NVIDIA driver answers: NVML initialises, or libcuda's cuInit(0) == 0
    -- and that libcuda is not simgpu's (it exports simgpu_driver_abi), which
    a LD_LIBRARY_PATH with shim/lib/simgpu on it would find first."""
    try:
        import pynvml
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        pass
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        if hasattr(lib, "simgpu_driver_abi"):
            return False
        return lib.cuInit(0) == 0
    except (OSError, AttributeError):
        return False


def detect_device(device: str = "auto") -> str:
    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r} (use auto, sim or cuda)")
    if device != "auto":
        return device
    return "cuda" if cuda_usable() else "sim"


def libzmq_path() -> str | None:
    """The libzmq that pyzmq uses, for the shim to dlopen (no system package needed)."""
    import zmq
    libs = Path(zmq.__file__).resolve().parent.parent / "pyzmq.libs"
    bundled = sorted(libs.glob("libzmq*.so*"))
    if bundled:
        return str(bundled[0])
    import zmq.backend  # noqa: F401  (loads the backend, and with it libzmq)
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split()[-1]
            if "/libzmq" in path and ".so" in path:
                return path
    except OSError:
        pass
    return None


def _num(v: float | int) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def _prepend(var: str, value: str, env: dict[str, str]) -> str:
    """value first in a path list, once (nested `colocate run`s do not stack)."""
    rest = [p for p in env.get(var, "").replace(" ", ":").split(":") if p and p != value]
    return ":".join([value, *rest])


def app_env(spec: AppSpec, rd: RunDir, device: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the application runs in."""
    env = dict(os.environ if base is None else base)
    env["LD_PRELOAD"] = _prepend("LD_PRELOAD", str(paths.LIBCOLOCATE), env)
    env["COLOCATE_RUNTIME_DIR"] = str(rd.path)
    env["COLOCATE_APP_NAME"] = spec.name or os.path.basename(spec.cmd[0])
    env["COLOCATE_APP_CLASS"] = spec.cls
    env["COLOCATE_DEVICE"] = device
    for var, val in (("COLOCATE_QOS_MS", spec.qos_ms), ("COLOCATE_QUOTA_PCT", spec.quota_pct)):
        env.pop(var, None)
        if val is not None:
            env[var] = _num(val)
    zmq_lib = libzmq_path()
    if zmq_lib:
        env["COLOCATE_LIBZMQ"] = zmq_lib
    if device == "sim":
        env["LD_LIBRARY_PATH"] = _prepend("LD_LIBRARY_PATH", str(paths.SIMGPU_DIR), env)
        sim = subdir(rd.path, "simgpu")
        env.setdefault("SIMGPU_DIR", str(sim))
        env.setdefault("SIMGPU_REPORT", str(sim / "report.jsonl"))
    return env


# --- running ----------------------------------------------------------------

def spawn(spec: AppSpec, rd: RunDir, device: str, **popen: Any) -> subprocess.Popen:
    """check() and start the application; popen kwargs go to subprocess.Popen."""
    exe = check(spec)
    env = app_env(spec, rd, device, popen.pop("env", None))
    return subprocess.Popen(spec.cmd, executable=exe, env=env, **popen)


def exit_code(returncode: int) -> int:
    """Shell convention: 128 + signal number for a child killed by a signal."""
    return 128 - returncode if returncode < 0 else returncode


def run(spec: AppSpec, rd: RunDir, device: str) -> int:
    """Run in the foreground, forwarding SIGINT/SIGTERM/SIGHUP; return the exit code."""
    procs: list[subprocess.Popen] = []
    early: list[int] = []

    def relay(sig: int, _frame: Any) -> None:
        # The child can run (and print) before Popen returns in the parent:
        # a signal then finds no child yet and is kept for it, not dropped.
        if not procs:
            early.append(sig)
        for p in procs:
            p.send_signal(sig)
    old = {s: signal.signal(s, relay) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        procs.append(spawn(spec, rd, device))
        for sig in early:
            procs[0].send_signal(sig)
        return exit_code(procs[0].wait())
    finally:
        for s, h in old.items():
            signal.signal(s, h)
