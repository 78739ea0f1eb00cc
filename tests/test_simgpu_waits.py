"""simgpu's device waits for a stream's queued work (shim/simgpu/model.c):
modelled time must not depend on when an executor thread gets to a kernel.
launchloop's twin sleeps (LAUNCHLOOP_TWIN_MS) while a second process's
kernels keep the device's events coming, at timescale 1000."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, simgpu_env

BIN = ROOT / "bench" / "bin"
pytestmark = pytest.mark.skipif(not (BIN / "launchloop").exists(), reason="bench programs not built")


def late_starts(simdir: str, tmp: Path, timescale: str = "1000", **extra: str) -> list[float]:
    """wait_us of a slow-twin launchloop's kernels after the first (from the
    start its stream gave it to its first block: late joins; the device is
    otherwise nearly empty, so nothing else delays a one-block kernel).  The
    first is left out: its executor was asleep, and nothing covers its own
    wake-up (model.c)."""
    def env(log: Path, **more: str) -> dict[str, str]:
        return simgpu_env(simdir, SIMGPU_TIMESCALE=timescale, SIMGPU_LAUNCH_LOG=str(log), **extra, **more)

    n = "600" if timescale == "1000" else "400000"       # outlasts the slow app
    busy = subprocess.Popen([str(BIN / "launchloop"), "--launches", n, "--warmup", "0"],
                            env=env(tmp / "busy.jsonl"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # its kernels are coming (events every ~3 ms of wall time) once it logs
        deadline = time.monotonic() + 30
        while not (tmp / "busy.jsonl").exists() or (tmp / "busy.jsonl").stat().st_size == 0:
            assert time.monotonic() < deadline and busy.poll() is None, "the co-runner did not start"
            time.sleep(0.01)
        slow = subprocess.run([str(BIN / "launchloop"), "--launches", "12", "--warmup", "0"],
                              env=env(tmp / "slow.jsonl", LAUNCHLOOP_TWIN_MS="8"),
                              capture_output=True, text=True, timeout=120)
        assert slow.returncode == 0 and "PASS" in slow.stdout, slow.stdout + slow.stderr
        assert busy.poll() is None, "the co-runner ended before the slow app: make it longer"
    finally:
        busy.kill()
        busy.wait()
    rows = [json.loads(ln) for ln in (tmp / "slow.jsonl").read_text().splitlines()]
    assert len(rows) == 12
    return [r["wait_us"] for r in sorted(rows, key=lambda r: r["seq"])][1:]


def test_a_late_executor_does_not_make_its_kernels_late(simdir, tmp_path):
    """Each twin sleeps 8 ms (8 us of device time) after its kernel's
    predecessor ended; the co-runner's events keep coming meanwhile.  With
    waits (the default at timescale 1000) every kernel starts where its
    stream lets it; with SIMGPU_WAIT_US=0 some start microseconds late."""
    waited = late_starts(simdir, tmp_path)
    assert max(waited) < 0.01, waited
    (tmp_path / "off").mkdir()
    # a device of its own: the process that starts a device's time sets it
    off = late_starts(str(tmp_path / "off"), tmp_path / "off", SIMGPU_WAIT_US="0")
    assert max(off) > 1.0, f"no kernel came late without waits: the test shows nothing ({off})"


def test_waits_are_off_by_default_near_real_time(simdir, tmp_path):
    """At timescale 1 a wait would hold every other process, in wall time,
    for a late one (config.c): off, so the 8 ms twins make kernels late."""
    assert max(late_starts(simdir, tmp_path, timescale="1")) > 1000.0


def test_a_killed_process_does_not_hold_the_device(simdir, tmp_path):
    """A process killed while the device waits for its kernel (its twin
    sleeps 60 s) and not yet reaped by its parent (a zombie) holds no one:
    the other process's kernels go on within a second, not after the wait's
    10 s window."""
    mark = tmp_path / "sleeping"
    env = simgpu_env(simdir, SIMGPU_TIMESCALE="1000")
    held = subprocess.Popen([str(BIN / "launchloop"), "--launches", "2", "--warmup", "0"],
                            env={**env, "LAUNCHLOOP_TWIN_MS": "60000", "LAUNCHLOOP_TWIN_MARK": str(mark)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not mark.exists():        # its first twin sleeps: the device waits for it
            assert time.monotonic() < deadline and held.poll() is None, "the held app did not start"
            time.sleep(0.01)
        # 20 launches: 60 ms of wall time at timescale 1000, unless held
        other = subprocess.Popen([str(BIN / "launchloop"), "--launches", "20", "--warmup", "0"],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        assert other.poll() is None, "the other app was not held: the test shows nothing"
        os.kill(held.pid, signal.SIGKILL)            # not waited for: a zombie
        t0 = time.monotonic()
        out, err = other.communicate(timeout=30)
        took = time.monotonic() - t0
        assert other.returncode == 0 and "PASS" in out, out + err
        assert took < 5.0, f"held {took:.1f} s after the kill"
    finally:
        if held.poll() is None:
            held.kill()
        held.wait()
