"""End to end on simgpu: a controller, unmodified CUDA programs under
`colocate run`, and the counters `colocate quotas --json` reports for them."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import stats_of, stop, wait_until

from shim import paths

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "bench" / "bin"
COLOCATE = [sys.executable, "-m", "controlplane.cli"]
# simgpu's modelled time stretched 1000x: a 64x64 hotspot step then takes
# ~3.5 ms, so an app is still running while the test looks at it.
SLOW_DEVICE = {**os.environ, "SIMGPU_TIMESCALE": "1000"}

pytestmark = pytest.mark.skipif(not (BIN / "vecadd").exists() or not paths.SIMGPU_CUDART.exists(),
                                reason="bench programs or simgpu not built (make build)")


def colocate(*args: str, rundir: Path, check: bool = True, env: dict | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess:
    res = subprocess.run([*COLOCATE, *args[:1], "--runtime-dir", str(rundir), *args[1:]],
                         capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                         env={**os.environ, **(env or {})})
    if check and res.returncode != 0:
        raise AssertionError(f"colocate {' '.join(args)} -> {res.returncode}\n{res.stdout}\n{res.stderr}")
    return res


@pytest.fixture()
def rundir():
    # short path: unix socket names are limited to 107 bytes
    d = Path(tempfile.mkdtemp(prefix="cl-e2e-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture()
def controller(rundir):
    proc = subprocess.Popen([*COLOCATE, "serve", "--runtime-dir", str(rundir), "--device", "sim",
                             "--pool", "none"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: colocate("ping", rundir=rundir, check=False).returncode == 0,
               what="controller to answer ping")
    yield proc
    stop(proc)


def app_record(rundir: Path, name: str) -> dict:
    apps = json.loads(colocate("quotas", "--json", "--all", rundir=rundir).stdout)
    recs = [a for a in apps if a["name"] == name]
    assert len(recs) == 1, apps
    return recs[0]


@pytest.mark.parametrize("prog,args,cls", [
    ("vecadd", ["--repeat", "3"], "qos"),
    ("vecadd", ["--repeat", "2", "--stream"], "batch"),
    ("vecadd", ["--repeat", "2", "--symbol"], "batch"),    # copies to/from a __device__
    ("hotspot", ["--size", "64", "--iters", "7"], "batch"),
])
def test_counters_match_what_the_program_did(controller, rundir, prog, args, cls):
    extra = ["--qos-ms", "50"] if cls == "qos" else []
    res = colocate("run", "--device", "sim", "--name", f"t-{prog}", "--class", cls, *extra, "--",
                   str(BIN / prog), *args, rundir=rundir, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"PASS {prog}" in res.stdout
    want = stats_of(res.stdout)
    rec = wait_until(lambda: (r := app_record(rundir, f"t-{prog}"))["state"] == "exited" and r,
                     what="final record")
    assert rec["class"] == cls
    assert rec["launches"] == want["launches"]
    assert rec["h2d_bytes"] == want["h2d_bytes"]
    assert rec["d2h_bytes"] == want["d2h_bytes"]
    assert rec["forwarded"] == 0
    # every launch was attributed to a named kernel with a host twin
    assert sum(k["launches"] for k in rec["kernels"]) == want["launches"]
    assert all(k["name"].startswith("_Z") and k["twin"] is True for k in rec["kernels"])


def test_live_app_is_listed_with_its_target(controller, rundir):
    proc = subprocess.Popen([*COLOCATE, "run", "--runtime-dir", str(rundir), "--device", "sim",
                             "--name", "live-hot", "--class", "qos", "--qos-ms", "25", "--",
                             str(BIN / "hotspot"), "--size", "64", "--iters", "5", "--repeat", "2000"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=SLOW_DEVICE)
    try:
        rec = wait_until(lambda: [a for a in json.loads(colocate("quotas", "--json", rundir=rundir).stdout)
                                  if a["name"] == "live-hot" and a["launches"] > 0],
                         what="live app with launches")[0]
        assert set(rec) >= {"name", "pid", "class", "quota_pct", "route", "launches", "forwarded",
                            "h2d_bytes", "d2h_bytes", "qos_ms"}
        assert rec["qos_ms"] == 25 and rec["class"] == "qos" and rec["quota_pct"] == 100
    finally:
        proc.kill()
        proc.wait()


def test_app_survives_a_controller_killed_mid_run(controller, rundir):
    proc = subprocess.Popen([*COLOCATE, "run", "--runtime-dir", str(rundir), "--device", "sim",
                             "--name", "orphan", "--", str(BIN / "hotspot"), "--size", "64",
                             "--iters", "5", "--repeat", "300"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=SLOW_DEVICE)
    wait_until(lambda: any(a["name"] == "orphan" and a["launches"] > 0
                 for a in json.loads(colocate("quotas", "--json", rundir=rundir).stdout)),
               what="app registered and launching")
    controller.kill()
    controller.wait()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert "PASS hotspot" in out


def test_without_controller_the_app_runs_natively_and_says_so_once(rundir):
    res = colocate("run", "--device", "sim", "--", str(BIN / "vecadd"), rundir=rundir, check=False)
    assert res.returncode == 0 and "PASS vecadd" in res.stdout
    lines = [ln for ln in res.stderr.splitlines() if "running natively" in ln]
    assert len(lines) == 1, res.stderr
    quiet = colocate("run", "--device", "sim", "--", str(BIN / "vecadd"), rundir=rundir,
                     check=False, env={"COLOCATE_QUIET": "1"})
    assert quiet.returncode == 0 and "running natively" not in quiet.stderr


def test_exit_code_of_a_failing_program_passes_through(controller, rundir):
    res = colocate("run", "--device", "sim", "--", str(BIN / "vecadd"), "--n", "-5",
                   rundir=rundir, check=False)
    assert res.returncode != 0


@pytest.mark.skipif(not (BIN / "test-drvapi.fatbin").exists()
                    or not (paths.SIMGPU_DIR / "libcuda.so.1").exists(),
                    reason="driver-API test program, its fat binary or simgpu's libcuda not built")
def test_driver_api_launches_are_counted(controller, rundir):
    """Launches through cuGetProcAddress (default and per-thread stream) and
    through dlsym(handle, "cuLaunchKernel"), as cudart and CuPy do, on
    simgpu's libcuda.so.1 (--device sim puts its folder on LD_LIBRARY_PATH)."""
    res = colocate("run", "--device", "sim", "--name", "drv", "--", str(BIN / "test-drvapi"),
                   "6", "4", "5", rundir=rundir, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    m = re.search(r"DRVAPI launches=(\d+) allocs=(\d+) PASS", res.stdout)
    assert m, res.stdout
    rec = wait_until(lambda: (r := app_record(rundir, "drv"))["state"] == "exited" and r,
                     what="final record")
    assert rec["launches"] == int(m.group(1)) >= 15
    # the module's and the library's add_one are two functions of one name
    assert sum(k["launches"] for k in rec["kernels"] if k["name"] == "add_one") == rec["launches"]


def test_kernels_without_a_host_twin_are_reported(controller, rundir, tmp_path):
    """vecadd copied away from its vecadd.twins.so: simgpu times the kernel
    but cannot compute it; the program's check fails and `colocate kernels
    --no-twin` names the kernel."""
    lone = tmp_path / "vecadd"
    shutil.copy(BIN / "vecadd", lone)
    res = colocate("run", "--device", "sim", "--name", "lone", "--", str(lone), rundir=rundir,
                   check=False)
    assert res.returncode != 0 and "FAIL vecadd" in res.stdout
    wait_until(lambda: app_record(rundir, "lone")["state"] == "exited", what="final record")
    rows = json.loads(colocate("kernels", "lone", "--json", "--no-twin", rundir=rundir).stdout)
    assert [(r["name"], r["twin"], r["launches"]) for r in rows] == [("_Z6vecaddPKfS0_Pfi", False, 1)]
    # the same kernel with its twin is not listed
    colocate("run", "--device", "sim", "--name", "paired", "--", str(BIN / "vecadd"), rundir=rundir)
    wait_until(lambda: app_record(rundir, "paired")["state"] == "exited", what="final record")
    assert json.loads(colocate("kernels", "paired", "--json", "--no-twin", rundir=rundir).stdout) == []


def test_a_stale_controller_socket_is_recognised_without_waiting(rundir):
    """A crashed controller leaves ctl.sock behind: the shim probes it with
    connect(2) and runs natively at once instead of waiting for a reply."""
    import socket
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(rundir / "ctl.sock"))
    s.close()                                   # the file stays, nobody listens
    res = colocate("run", "--device", "sim", "--", str(BIN / "vecadd"), rundir=rundir, check=False)
    assert res.returncode == 0 and "PASS vecadd" in res.stdout
    assert "stale" in res.stderr and "running natively" in res.stderr, res.stderr


NESTED_ALLOCS = r"""
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <unistd.h>
int main(void) {
    void *a, *b, *c; size_t pitch;
    if (cudaMallocPitch(&a, &pitch, 1000, 10) || cudaMallocAsync(&b, 4096, 0) ||
        cudaMalloc(&c, 4096) || cudaFree(a) || cudaFree(b) || cudaFree(c)) return 1;
    printf("FREED\n"); fflush(stdout);
    sleep(30);                       /* the test reads our slot, then kills us */
    return 0;
}
"""


def test_allocations_are_counted_once_when_the_runtime_calls_itself(controller, rundir, tmp_path):
    """simgpu implements cudaMallocPitch and cudaMallocAsync with its own
    exported cudaMalloc, which lands in our hook again: only the outermost
    hook may count, so after freeing everything nothing is live."""
    from shim.ctlblock import ControlBlock
    src = tmp_path / "allocs.c"
    src.write_text(NESTED_ALLOCS)
    exe = tmp_path / "allocs"
    subprocess.run(["cc", "-o", exe, src, f"-I{paths.SHIM_DIR.parent}", "-I/usr/local/cuda/include",
                    f"-L{paths.SIMGPU_DIR}", "-lcudart"], check=True)
    proc = subprocess.Popen([*COLOCATE, "run", "--runtime-dir", str(rundir), "--device", "sim",
                             "--name", "allocs", "--", str(exe)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "FREED"
        rec = wait_until(lambda: [a for a in json.loads(colocate("quotas", "--json", rundir=rundir).stdout)
                                  if a["name"] == "allocs"], what="live record")[0]
        cb = ControlBlock(rundir / "ctlblock")
        slot = next(i for i in range(256) if cb.control(i)["pid"] == rec["pid"]
                    and cb.control(i)["state"] == 1)
        c = cb.counters(slot)
        assert (c["allocs_live"], c["alloc_bytes_live"]) == (0, 0), c
    finally:
        proc.kill()
        proc.wait()
