"""The Tonic services (bench/tonic) on simgpu: every network's GPU path against
its CPU reference, the wire protocol, the load client's checksums, and query
marking under `colocate run`.  Small widths/resolutions keep the CPU twins fast."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import TONIC_SMALL, stop, wait_until

from shim import paths

ROOT = Path(__file__).resolve().parents[1]
SERVICE = ROOT / "bench" / "bin" / "tonic-service"
CLIENT = ROOT / "bench" / "tonic" / "client.py"
COLOCATE = [sys.executable, "-m", "controlplane.cli"]

pytestmark = pytest.mark.skipif(
    not SERVICE.exists() or not (paths.SIMGPU_DIR / "libcudnn.so.9").exists(),
    reason="tonic-service or simgpu's libcudnn not built (make build)")

SMALL = TONIC_SMALL
REQ = struct.Struct("<IIQII")
REP = struct.Struct("<IiQQQQIIII")


@pytest.fixture()
def simenv(tmp_path):
    """simgpu's libraries, a private device, no sleeping for modelled time."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SIMGPU_", "COLOCATE_")) and k not in
           ("LD_PRELOAD", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}
    env.update(LD_LIBRARY_PATH=str(paths.SIMGPU_DIR), SIMGPU_DIR=str(tmp_path / "dev"),
               SIMGPU_TIMESCALE="0")
    return env


@pytest.fixture()
def sockdir():
    d = Path(tempfile.mkdtemp(prefix="tt-", dir="/tmp"))     # short: sun_path is 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def check(net: str, size: int, env: dict, exe: Path = SERVICE) -> tuple[subprocess.CompletedProcess, dict]:
    res = subprocess.run([str(exe), "--net", net, "--check", "--size", str(size), *SMALL[net]],
                         capture_output=True, text=True, env=env, timeout=60)
    m = re.search(r"^CHECK (.*)$", res.stdout, re.M)
    fields = dict(kv.split("=") for kv in m.group(1).split()) if m else {}
    return res, fields


@pytest.mark.parametrize("net,size", [("dig", 3), ("imc", 2), ("face", 1), ("pos", 9), ("chk", 9),
                                      ("ner", 9)])
def test_check_matches_the_cpu_reference(net, size, simenv):
    res, f = check(net, size, simenv)
    assert res.returncode == 0 and f"PASS tonic-{net}" in res.stdout, res.stdout + res.stderr
    out_per = {"dig": 10, "imc": 1000, "face": 4030, "pos": 45, "chk": 42, "ner": 17}[net]
    assert int(f["out"]) == size * out_per
    # simgpu computes in FP32 like the reference's inputs: far inside the tolerance
    assert float(f["max_rel_err"]) < 1e-4
    assert float(f["device_ms"]) > 0


def test_check_fails_when_a_kernel_does_nothing(simenv, tmp_path):
    """The service copied away from its twins: simgpu times tonic_embed and
    tonic_window_sum but cannot run them, and --check must notice."""
    lone = tmp_path / "tonic-service"
    shutil.copy(SERVICE, lone)
    res, _ = check("pos", 5, simenv, lone)
    assert res.returncode == 1 and "FAIL tonic-pos" in res.stdout, res.stdout + res.stderr


def start(net: str, sock: Path, env: dict, *extra: str, wrap: list[str] | None = None) -> subprocess.Popen:
    proc = subprocess.Popen([*(wrap or []), str(SERVICE), "--net", net, "--socket", str(sock),
                             *SMALL[net], *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=ROOT)
    line = proc.stdout.readline()
    assert line.startswith("READY "), line + proc.stdout.read()
    return proc


def request(s: socket.socket, kind: int, qid: int, size: int, payload: bytes = b"") -> tuple:
    """One request; () when the service closed the connection."""
    buf = b""
    try:
        s.sendall(REQ.pack(0x31514E54, kind, qid, size, len(payload)) + payload)
        while len(buf) < REP.size:
            chunk = s.recv(REP.size - len(buf))
            if not chunk:
                return ()
            buf += chunk
    except OSError:
        return ()
    return REP.unpack(buf)


def mix(x: int) -> int:
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def synthetic_pixels(n: int, seed: int = 1) -> bytes:
    """bench/tonic/plan.c's net_input_fill for image nets, in Python."""
    key = mix(seed ^ mix(0x696E707574))
    return struct.pack(f"<{n}f", *((mix((key + i * 0x9E3779B97F4A7C15) & ((1 << 64) - 1)) >> 40)
                                   / 16777216.0 for i in range(n)))


def test_protocol_info_payload_and_bad_requests(simenv, sockdir):
    sock = sockdir / "dig.sock"
    proc = start("dig", sock, simenv, "--max-size", "4")
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(sock))
        magic, status, _, _, _, _, _, unit, max_size, kind = request(s, 1, 7, 0)
        assert (magic, status, unit, max_size, kind) == (0x31524E54, 0, 28 * 28 * 4, 4, 0)
        # synthetic input vs the same pixels sent as bytes: same output
        synth = request(s, 0, 8, 2)
        sent = request(s, 0, 9, 2, synthetic_pixels(2 * 28 * 28))
        assert synth[1] == sent[1] == 0 and (synth[2], sent[2]) == (8, 9)
        assert synth[3] == sent[3] and synth[6] == 20          # checksum, out_floats
        assert synth[4] > 0 and synth[5] > 0                     # server_ns, device_ns
        other = request(s, 0, 10, 2, bytes(2 * 28 * 28 * 4))     # black images
        assert other[1] == 0 and other[3] != synth[3]
        # too large: refused, and the connection is closed
        assert request(s, 0, 11, 5)[1] == 1
        assert request(s, 0, 12, 1) == ()
        s.close()
        s = socket.socket(socket.AF_UNIX)                         # the service lives on
        s.connect(str(sock))
        assert request(s, 0, 13, 1)[1] == 0
        s.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0
    m = re.search(r"^SUMMARY net=dig queries=(\d+) errors=(\d+)", out, re.M)
    assert m and m.groups() == ("4", "1"), out


@pytest.mark.parametrize("net,sizes", [("dig", [1, 3]), ("ner", [4, 11])])
def test_client_load_every_query_answered_with_the_checked_checksum(net, sizes, simenv, sockdir):
    expect = {}
    for n in sizes:
        res, f = check(net, n, simenv)
        assert res.returncode == 0, res.stdout
        expect[n] = f["checksum"]
    out = sockdir / "r.json"
    cmd = [sys.executable, str(CLIENT), "--serve", net, "--serve-args", " ".join(SMALL[net]),
           "--device", "sim", "--rate", "150", "--arrivals", "poisson", "--queries", "40",
           "--sizes", ",".join(map(str, sizes)), "--seed", "3", "--qos-ms", "1000",
           "--expect", ",".join(f"{n}={c}" for n, c in expect.items()), "--out", str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=simenv, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(out.read_text())
    qs = doc["queries"]
    assert len(qs) == 40 and doc["summary"]["answered"] == 40
    assert all(q["status"] == 0 and q["checksum"] == expect[q["size"]] for q in qs)
    assert {q["size"] for q in qs} == set(sizes)               # seeded mix of sizes
    assert all(q["latency_ms"] >= q["server_ms"] > 0 and q["device_ms"] > 0 for q in qs)
    assert doc["summary"]["checksum_mismatches"] == 0
    assert doc["service_summary"].startswith(f"SUMMARY net={net} queries=40 errors=0")
    assert "p99" in res.stdout and "qps" in res.stdout


def test_client_counts_wrong_checksums(simenv):
    res = subprocess.run([sys.executable, str(CLIENT), "--serve", "dig", "--device", "sim", "--rate", "0",
                          "--queries", "3", "--expect", "1=0123456789abcdef"],
                         capture_output=True, text=True, env=simenv, timeout=60, cwd=ROOT)
    assert res.returncode == 1 and "mismatches 3" in res.stdout, res.stdout + res.stderr


def colocate(rundir: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*COLOCATE, args[0], "--runtime-dir", str(rundir), *args[1:]],
                          capture_output=True, text=True, timeout=60, cwd=ROOT, env=env)


def launches_per_query(net: str, env: dict, sockdir: Path) -> int:
    """Kernels one query launches, from simgpu's own per-kernel report."""
    report = sockdir / "report.jsonl"
    proc = start(net, sockdir / "solo.sock", {**env, "SIMGPU_REPORT": str(report)}, "--queries", "1")
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(sockdir / "solo.sock"))
    assert request(s, 0, 1, 2)[1] == 0
    s.close()
    proc.communicate(timeout=30)
    return sum(json.loads(ln)["launches"] for ln in report.read_text().splitlines())


def test_queries_are_marked_under_colocate(simenv, sockdir):
    """Under `colocate run` every query's begin/end reaches the controller
    (colocate.h's API), and every library kernel is counted."""
    per_query = launches_per_query("dig", simenv, sockdir)
    assert per_query >= 10                  # conv, bias, pooling, gemm, relu, softmax
    rundir = Path(tempfile.mkdtemp(prefix="tc-", dir="/tmp"))
    ctl = subprocess.Popen([*COLOCATE, "serve", "--runtime-dir", str(rundir), "--device", "sim",
                            "--pool", "none"], cwd=ROOT, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env=simenv)
    try:
        wait_until(lambda: colocate(rundir, "ping", env=simenv).returncode == 0, what="controller",
                   timeout=20.0, step=0.1)
        wrap = [*COLOCATE, "run", "--runtime-dir", str(rundir), "--device", "sim", "--name", "t-dig",
                "--class", "qos", "--qos-ms", "50", "--"]
        proc = start("dig", sockdir / "dig.sock", simenv, "--queries", "6", wrap=wrap)
        res = subprocess.run([sys.executable, str(CLIENT), "--socket", str(sockdir / "dig.sock"),
                              "--rate", "0", "--queries", "6", "--sizes", "2"],
                             capture_output=True, text=True, env=simenv, timeout=60, cwd=ROOT)
        assert res.returncode == 0, res.stdout + res.stderr
        out = proc.communicate(timeout=30)[0]
        assert proc.returncode == 0 and "SUMMARY net=dig queries=6 errors=0" in out, out

        def final() -> dict | None:
            apps = json.loads(colocate(rundir, "quotas", "--json", "--all", env=simenv).stdout)
            recs = [a for a in apps if a["name"] == "t-dig" and a["state"] == "exited"]
            return recs[0] if recs else None
        rec = wait_until(final, what="the service's final record", timeout=20.0, step=0.1)
        assert rec["class"] == "qos" and rec["launches"] == 6 * per_query
        q = wait_until(lambda: (r := final()) and r["queries"]["done"] == 6 and r["queries"],
                       what="6 queries done", timeout=20.0, step=0.1)
        assert q["rule"] == "api" and q["in_flight"] == 0 and q["p50_ms"] > 0
    finally:
        stop(ctl)
        shutil.rmtree(rundir, ignore_errors=True)
