"""Shared fixtures: a private runtime dir, a `colocate serve` subprocess, a
DEALER client that talks protocol v1, and a helper to run the CLI."""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import zmq

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without colocate/simgpu settings that would leak into a test."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COLOCATE_", "SIMGPU_")) and k not in ("LD_PRELOAD",)}
    env.update(extra)
    return env


def driver_present() -> bool:
    """Whether an NVIDIA driver library loads here (the GPU probes' tests)."""
    try:
        return not hasattr(ctypes.CDLL("libcuda.so.1"), "simgpu_driver_abi")   # simgpu's is no driver
    except OSError:
        return False


def run_json(cmd: list[str], env: dict[str, str], timeout: float = 60) -> tuple[int, dict, str]:
    """A GPU probe's exit code, its one JSON line (asserted to be there and
    alone) and its stderr."""
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, f"want one JSON line, got {p.stdout!r} (stderr {p.stderr!r})"
    return p.returncode, json.loads(lines[0]), p.stderr


def colocate(*args: str, env: dict[str, str] | None = None, timeout: float = 30,
             **kw) -> subprocess.CompletedProcess:
    """Run the CLI as a user would (a fresh interpreter), capturing its output."""
    return subprocess.run([PY, "-m", "controlplane.cli", *map(str, args)], cwd=ROOT,
                          env=env or clean_env(), capture_output=True, text=True, timeout=timeout, **kw)


def simgpu_env(simdir: str | os.PathLike, **extra: object) -> dict[str, str]:
    """A clean environment for a program on simgpu: its libraries first on
    LD_LIBRARY_PATH, a private SIMGPU_DIR, no modelled time (timescale 0),
    no MPS percentage from the caller's environment; extra on top."""
    from shim import paths
    env = clean_env(SIMGPU_DIR=str(simdir), SIMGPU_TIMESCALE="0")
    env.pop("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", None)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [str(paths.SIMGPU_DIR)] + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.fixture
def simdir():
    """A private simulated device for one test (its own arena and model),
    in /dev/shm where it can be."""
    base = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    d = tempfile.mkdtemp(prefix="simgpu-", dir=base)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def mech(tmp_path_factory) -> Path:
    """test_device_model's CUDA program (kernels of a given shape and cost,
    MECH_CU and its twins), built once per module."""
    from test_device_model import MECH_CU, MECH_TWINS, NVCC

    from shim import paths
    if not paths.SIMGPU_CUDART.exists():
        pytest.skip("simgpu not built (make build)")
    d = tmp_path_factory.mktemp("mech")
    (d / "mech.cu").write_text(MECH_CU)
    (d / "twins.c").write_text(MECH_TWINS)
    for cmd in ([NVCC, "-cudart", "shared", "-o", "mech", "mech.cu"],
                ["cc", "-O2", "-shared", "-fPIC", "-I", str(ROOT / "shim" / "simgpu"), "-o",
                 "mech.twins.so", "twins.c"]):
        r = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    return d / "mech"


def ensure_simgpu() -> None:
    """Build the native libraries when simgpu's is missing or older than its
    sources (tests that compile their own CUDA programs link against it)."""
    from shim import paths
    lib = paths.SIMGPU_CUDART
    srcs = list((ROOT / "shim" / "simgpu").glob("*.[ch]"))
    if lib.exists() and all(s.stat().st_mtime <= lib.stat().st_mtime for s in srcs):
        return
    r = subprocess.run([PY, "-m", "shim.build"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0 or not lib.exists():
        pytest.fail(f"building the shim libraries failed:\n{r.stderr[-4000:]}")


def stop(proc: subprocess.Popen, timeout: float = 10) -> None:
    """SIGTERM a process we started and reap it; SIGKILL if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stats_of(output: str) -> dict[str, int]:
    """The key=value integers of a program's `STATS ...` line (every bench
    program prints one: its own launches and bytes)."""
    m = re.search(r"^STATS (.*)$", output, re.M)
    assert m, f"no STATS line in:\n{output}"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}


def new_rundir() -> Path:
    # short: ipc socket paths are limited to 107 bytes
    return Path(tempfile.mkdtemp(prefix="colo-", dir="/tmp"))


@pytest.fixture
def rundir():
    d = new_rundir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Client:
    """A DEALER playing the shim (or an admin client)."""

    def __init__(self, rundir: Path):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"ipc://{rundir}/ctl.sock")

    def send(self, *frames: bytes) -> None:
        self.sock.send_multipart(list(frames))

    def recv(self, timeout: float = 3.0) -> dict:
        assert self.sock.poll(int(timeout * 1000)), "controller did not answer"
        frames = self.sock.recv_multipart()
        assert len(frames) == 2 and frames[0] == b"", frames
        return json.loads(frames[1])

    def call(self, type: str, **fields) -> dict:
        self.send(b"", json.dumps({"v": 1, "type": type, **fields}).encode())
        return self.recv()

    def close(self) -> None:
        self.sock.close()


class Controller:
    """A `colocate serve` subprocess on its own runtime dir."""

    def __init__(self, rundir: Path, *args: str):
        self.rundir = rundir
        self.log = open(rundir / "test-serve.out", "wb")
        self.proc = subprocess.Popen([PY, "-m", "controlplane.cli", "serve", "--runtime-dir", str(rundir),
                                      "--device", "sim",
                                      # no worker pool unless a test asks: 20 workers per
                                      # controller would dominate the suite's time
                                      *([] if "--pool" in args else ["--pool", "none"]), *args],
                                     cwd=ROOT, env=clean_env(),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_ready()

    def wait_ready(self, timeout: float = 15.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.proc.poll() is None, f"serve exited: {self.output()}"
            if (self.rundir / "ctl.sock").exists():
                c = self.client()
                try:
                    c.send(b"", b'{"v":1,"type":"ping"}')
                    if c.sock.poll(200):
                        return
                finally:
                    c.close()
            time.sleep(0.05)
        raise AssertionError(f"controller not ready: {self.output()}")

    def output(self) -> str:
        return (self.rundir / "test-serve.out").read_text(errors="replace")

    def client(self) -> Client:
        return Client(self.rundir)

    def call(self, type: str, **fields) -> dict:
        c = self.client()
        try:
            return c.call(type, **fields)
        finally:
            c.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="module")
def controller():
    d = new_rundir()
    ctl = Controller(d)
    yield ctl
    ctl.stop()
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def sleeper():
    """Factory of `sleep` processes standing in for applications; all killed afterwards."""
    procs = []

    def start(seconds: int = 60) -> subprocess.Popen:
        p = subprocess.Popen(["sleep", str(seconds)])
        procs.append(p)
        return p
    yield start
    for p in procs:
        p.kill()
        p.wait()


def wait_for(pred, timeout: float = 3.0, step: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


# Small inputs of every bench workload, well under a second each on simgpu;
# their own test files and tests/test_workloads.py run them.
RODINIA_SMALL = {
    "hotspot": ["--size", "64", "--iters", "4"],
    "bfs": ["--size", "5000"],
    "btree": ["--size", "20000", "--queries", "300", "--ranges", "200"],
    "pathfinder": ["--cols", "3000", "--rows", "50", "--pyramid", "10"],
    "nw": ["--size", "128"],
    "lud": ["--size", "256"],
    "myocyte": ["--cells", "500", "--time", "15", "--launch-ms", "2"],
    "lavamd": ["--boxes", "3", "--par", "20"],
}
# small but complete Tonic shapes: every layer kind, all six nets (full shapes
# are the default; see bench/tonic/net.h)
TONIC_SMALL = {
    "dig": [],
    "imc": ["--width", "0.25", "--res", "67"],
    "face": ["--width", "0.25", "--res", "76"],
    "pos": ["--width", "0.5"],
    "chk": ["--width", "0.5"],
    "ner": ["--width", "0.5"],
}


# the simulated device the classification tests pin: simgpu's defaults,
# spelled out so that a change of default does not move their thresholds
PINNED_DEVICE = {"SIMGPU_SMS": "132", "SIMGPU_SM_GFLOPS": "500", "SIMGPU_BW_GBS": "3350",
                 "SIMGPU_SM_BW_GBS": "101.3", "SIMGPU_BW_SHARPNESS": "2.32", "SIMGPU_BW_BETA": "0.179",
                 "SIMGPU_BW_SHARE": "0.83"}


def pinned_sim_env(tmp: Path, **extra: str) -> dict[str, str]:
    """A private simulated device (PINNED_DEVICE) that does not sleep for
    modelled time and reports its kernels to tmp/report.jsonl; no shim."""
    from shim import paths
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COLOCATE_", "SIMGPU_", "CUDA_MPS_")) and k != "LD_PRELOAD"}
    env.update(PINNED_DEVICE)
    env.update({"LD_LIBRARY_PATH": str(paths.SIMGPU_DIR), "SIMGPU_DIR": str(tmp / "dev"),
                "SIMGPU_TIMESCALE": "0", "SIMGPU_REPORT": str(tmp / "report.jsonl")})
    env.update(extra)
    return env


def wait_until(pred, timeout: float = 10.0, what: str = "condition", step: float = 0.05):
    """wait_for, failing the test with what it waited for when pred stays falsy."""
    got = wait_for(pred, timeout, step)
    if not got:
        raise AssertionError(f"timed out waiting for {what}")
    return got
