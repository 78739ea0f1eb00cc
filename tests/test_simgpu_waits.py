"""simgpu's device waits for a stream's queued work (shim/simgpu/model.c):
modelled time must not depend on when an executor thread gets to a kernel.
launchloop's twin sleeps (LAUNCHLOOP_TWIN_MS) while a second process's
kernels keep the device's events coming, at timescale 1000."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ROOT, simgpu_env

BIN = ROOT / "bench" / "bin"
pytestmark = pytest.mark.skipif(not (BIN / "launchloop").exists(), reason="bench programs not built")


def late_starts(simdir: str, tmp: Path, **extra: str) -> list[float]:
    """wait_us of each of a slow-twin launchloop's kernels (from the join its
    stream gave it to its first block: late joins; the device is otherwise
    nearly empty, so nothing else delays a one-block kernel)."""
    def env(log: Path, **more: str) -> dict[str, str]:
        return simgpu_env(simdir, SIMGPU_TIMESCALE="1000", SIMGPU_LAUNCH_LOG=str(log), **extra, **more)

    busy = subprocess.Popen([str(BIN / "launchloop"), "--launches", "600", "--warmup", "0"],
                            env=env(tmp / "busy.jsonl"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        time.sleep(0.2)         # its kernels are coming: events every ~3 ms of wall time
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
    return [r["wait_us"] for r in sorted(rows, key=lambda r: r["seq"])]


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
