"""Launch forwarding on simgpu: the worker executable (shim/lib/colocate-worker),
the shim's forwarding client, route switches, worker death, bad frames.

No controller is needed: a tiny stand-in answers the shim's "register" on
ctl.sock and claims a slot in a control block the test created, so the test
writes routes itself (ControlBlock.set_route) while the app runs.  Workers are
started with the pool's contract (`--id N --quota Q --runtime-dir DIR`).
"""
from __future__ import annotations

import json
import mmap
import os
import re
import signal
import struct
import subprocess
import time
from pathlib import Path

import fwdclient as fwd
import pytest
import zmq
from conftest import wait_until
from fwdclient import (
    HF_RING,
    LF_TIMED,
    MAGIC,
    T_BYE,
    T_ERROR,
    T_HELLO_REPLY,
    T_LAUNCH,
    VERSION,
    RingApp,
    define,
    hdr,
    launch,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from processpool.rig import Rig
from shim import paths
from shim._proto import ffi, lib

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "bench" / "bin"
WORKER = paths.LIB_DIR / "colocate-worker"

pytestmark = pytest.mark.skipif(
    not (BIN / "hotspot").exists() or not WORKER.exists() or not paths.SIMGPU_CUDART.exists(),
    reason="bench programs, simgpu or colocate-worker not built (make build)")

# wire constants of shim/proto/fwd_proto.h

# hotspot: launches spread over time (a copy, i.e. a fence, every 6 launches),
# so that route changes land between launches while it runs
HOT = ["--size", "64", "--iters", "6", "--repeat", "50", "--pyramid", "1", "--check"]


def result_of(out: str) -> dict[str, str]:
    """The lines that must be identical whatever the route."""
    got = {}
    for key in ("CHECK", "STATS"):
        m = re.search(rf"^{key} (.*)$", out, re.M)
        assert m, f"no {key} line in:\n{out}"
        got[key] = m.group(1)
    m = re.search(r"^HOTSPOT .*?(max_err=\S+ temp_min=\S+ temp_max=\S+)$", out, re.M)
    assert m, out
    got["HOTSPOT"] = m.group(1)
    assert re.search(r"^PASS hotspot", out, re.M), out
    return got


@pytest.fixture
def rig():
    r = Rig()
    yield r
    r.close()


@pytest.fixture
def slow_rig():
    # simgpu time stretched: a 64x64 hotspot step takes ~7 ms of wall time
    r = Rig(timescale="2000")
    yield r
    r.close()


# ---------------------------------------------------------------- the worker


def test_worker_contract(rig):
    p = rig.start_worker(7, 30)
    assert (rig.dir / "worker-7.pid").read_text().strip() == str(p.pid)
    assert (rig.dir / "worker-7.sock").exists()
    s = rig.stats(7)
    assert s == {**s, "v": 1, "type": "stats", "id": 7, "quota_pct": 30, "pid": p.pid,
                 "forwarded": 0, "apps": 0, "state": "ready"}
    p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0
    assert not (rig.dir / "worker-7.pid").exists() and not (rig.dir / "worker-7.sock").exists()


def test_worker_rejects_bad_command_lines(rig):
    for args in ([], ["--id", "0", "--quota", "5", "--runtime-dir", "/tmp"],
                 ["--id", "1", "--quota", "101", "--runtime-dir", "/tmp"],
                 ["--id", "1", "--quota", "5"], ["--bogus", "1"]):
        res = subprocess.run([str(WORKER), *args], env=rig.env, capture_output=True, timeout=10)
        assert res.returncode == 2, (args, res)
        assert b"usage" in res.stderr or b"colocate-worker" in res.stderr


# ---------------------------------------------------------------- same results on every route


def test_hotspot_identical_local_forwarded_and_switched(slow_rig):
    rig = slow_rig
    for wid, q in ((1, 10), (2, 40), (3, 100)):
        rig.start_worker(wid, q)
    # local (registered, route 0), on a device of its own at full speed
    out, _, local = rig.run("hotspot", *HOT, **rig.fast)
    want = result_of(out)
    assert local["launches"] == 300 and local["forwarded"] == 0

    # everything forwarded to one worker
    out, err, fwd = rig.run("hotspot", *HOT, routes=1)
    assert result_of(out) == want, err
    assert fwd["launches"] == 300 and fwd["forwarded"] == 300
    assert rig.stats(1)["forwarded"] == 300

    # switched between workers at 10/40/100 % and local every 30 ms (~2 s run)
    before = {w: rig.stats(w)["forwarded"] for w in (1, 2, 3)}
    out, err, sw = rig.run("hotspot", *HOT, routes=[1, 2, 3, 0])
    assert result_of(out) == want, err
    moved = {w: rig.stats(w)["forwarded"] - before[w] for w in (1, 2, 3)}
    assert sw["launches"] == 300
    assert 0 < sw["forwarded"] < 300, sw            # some ran locally too
    assert sw["forwarded"] == sum(moved.values()), (sw, moved)
    assert all(n > 0 for n in moved.values()), moved
    for w in (1, 2, 3):                             # every app said BYE (handled asynchronously)
        wait_until(lambda: rig.stats(w)["apps"] == 0, timeout=5.0, what=f"worker {w} to drop the app")
    assert "lost" not in err and "bad frame" not in rig.worker_log(1)


def test_library_kernels_forwarded_with_the_library_twins(rig):
    """cuDNN/cuBLAS kernels (simgpu's CPU libraries make them without
    __cudaRegisterFunction) are named through cudaFuncGetName and forwarded;
    the worker loads the libraries' twins from the app's HELLO."""
    if not (BIN / "tonic-service").exists():
        pytest.skip("tonic-service not built")
    rig.start_worker(1, 30)
    args = ("--net", "dig", "--check", "--size", "4")
    out_l, _, c_l = rig.run("tonic-service", *args)
    out_f, _, c_f = rig.run("tonic-service", *args, routes=1)
    assert "PASS tonic-dig" in out_f
    sums = [re.search(r"checksum=(\w+)", o).group(1) for o in (out_l, out_f)]
    assert sums[0] == sums[1]
    assert c_f["launches"] == c_l["launches"] == c_f["forwarded"] > 0


def test_two_apps_share_a_worker(rig):
    rig.start_worker(1, 50)
    # routed when each registers, before its first launch: a route written
    # after registration raced vecadd's 20 launches at timescale 0 and lost
    # once in a fresh-clone run (0 forwarded)
    rig.route_every = 1
    a = rig.app("hotspot", *HOT)
    b = rig.app("vecadd", "--repeat", "20", "--stream")
    (oa, ea), (ob, eb) = a.communicate(timeout=60), b.communicate(timeout=60)
    rig.route_every = None
    assert a.returncode == 0 and b.returncode == 0, oa + ea + ob + eb
    assert "PASS hotspot" in oa and "PASS vecadd" in ob
    ca, cb_ = rig.cb.counters(rig.slots[a.pid]), rig.cb.counters(rig.slots[b.pid])
    assert ca["forwarded"] > 0 and cb_["forwarded"] > 0
    assert rig.stats(1)["forwarded"] == ca["forwarded"] + cb_["forwarded"]


def test_stream_events_and_async_copies_forwarded(rig):
    """vecadd --stream: async copies, event records around the launches, a
    D2H copy and syncs on a user stream, all ordered with forwarded kernels."""
    rig.start_worker(1, 40)
    out, err, c = rig.run("vecadd", "--repeat", "25", "--stream", routes=1)
    assert "PASS vecadd" in out, out + err
    assert c["launches"] == 25 and c["forwarded"] == 25


# ---------------------------------------------------------------- falling back


def test_worker_killed_mid_run_replays_locally(slow_rig):
    """hotspot's kernel reads one buffer and writes another, so it may run
    twice: with COLOCATE_REPLAY_IN_DOUBT=1 even the launch that was running
    when the worker died is replayed, and the result is exact."""
    rig = slow_rig
    w = rig.start_worker(1, 10)
    # all launches queued at once: the app then waits in its last sync
    p = rig.app("hotspot", "--size", "64", "--iters", "300", "--pyramid", "1", "--check",
                COLOCATE_REPLAY_IN_DOUBT="1")
    rig.cb.set_route(rig.slot_of(p), 1, 10)
    time.sleep(0.6)
    w.kill()
    w.wait()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, out + err
    assert "PASS hotspot" in out
    m = re.search(r"worker 1 \(pid \d+\) lost: (.*); replayed (\d+) unfinished", err)
    assert m, err
    assert "may have run in part" not in err
    c = rig.cb.counters(rig.slots[p.pid])
    assert c["launches"] == 300 and 0 < c["forwarded"] < 300
    assert c["forwarded"] + int(m.group(2)) == 300
    # bit for bit the result of a local run
    out_local, _, _ = rig.run("hotspot", "--size", "64", "--iters", "300", "--pyramid", "1", "--check", **rig.fast)
    assert result_of(out) == result_of(out_local)


def test_worker_killed_mid_kernel_reports_the_launch_in_doubt(slow_rig):
    """By default a launch that may have run in part in the dead worker is
    not run again (an in-place kernel would apply twice): the app gets a
    launch failure at its next call, every other launch runs exactly once."""
    rig = slow_rig
    w = rig.start_worker(1, 10)
    p = rig.app("hotspot", "--size", "64", "--iters", "300", "--pyramid", "1", "--check")
    rig.cb.set_route(rig.slot_of(p), 1, 10)
    time.sleep(0.6)              # 3.5 ms kernels back to back: one is running
    w.kill()
    w.wait()
    out, err = p.communicate(timeout=60)
    assert p.returncode != 0 and "FAIL hotspot" in out, out + err
    assert re.search(r"unspecified launch failure|launch failure", out), out
    m = re.search(r"replayed (\d+) unfinished", err)
    d = re.search(r"(\d+) launch(?:es)? \((\S+?)(?:, \.\.\.)?\) may have run in part", err)
    assert m and d, err
    assert d.group(1) == "1" and d.group(2).startswith("_Z12hotspot_step"), err
    c = rig.cb.counters(rig.slots[p.pid])
    # forwarded (completed there, or lost in doubt) + replayed = every launch
    assert c["launches"] == 300
    assert c["forwarded"] + int(m.group(1)) == 300


def test_worker_stopped_mid_run_finishes_then_hands_back(slow_rig):
    """SIGTERM: the worker finishes what it has, tells the app, exits 0; the
    app carries on locally with the same result."""
    rig = slow_rig
    w = rig.start_worker(1, 40)
    p = rig.app("hotspot", "--size", "64", "--iters", "150", "--pyramid", "1", "--check")
    rig.cb.set_route(rig.slot_of(p), 1, 40)
    time.sleep(0.4)
    w.send_signal(signal.SIGTERM)
    assert w.wait(10) == 0
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, out + err
    out_local, _, _ = rig.run("hotspot", "--size", "64", "--iters", "150", "--pyramid", "1", "--check", **rig.fast)
    assert result_of(out) == result_of(out_local)
    assert "shutting down" in rig.worker_log(1)


def test_missing_worker_means_local(rig):
    out, err, c = rig.run("hotspot", *HOT, routes=9)
    assert "PASS hotspot" in out
    assert c["forwarded"] == 0 and c["launches"] == 300
    assert "cannot forward to worker 9" in err
    assert err.count("cannot forward") == 1          # said once per route change


def test_dead_worker_on_the_route_is_skipped_at_once(rig):
    """A route to a worker that was killed (stale socket and pid file): no
    HELLO timeout at each route change, one log line, the app runs locally."""
    rig.start_worker(1, 40)
    dead = rig.start_worker(2, 40)
    dead.kill()
    dead.wait()
    assert (rig.dir / "worker-2.sock").exists()        # SIGKILL leaves both behind
    out, err, c = rig.run("hotspot", *HOT, routes=[2, 1], period=0.002)
    assert "PASS hotspot" in out
    assert err.count("cannot forward to worker 2: worker 2 (pid") == 1, err
    assert "no answer to HELLO" not in err


def test_kernel_without_layout_runs_locally(rig):
    """Without a parameter layout (cudaFuncGetParamInfo fails), a kernel is
    not forwarded: it runs locally, in order, and the app says so once."""
    rig.start_worker(1, 40)
    out, err, c = rig.run("hotspot", *HOT, routes=1, SIMGPU_IGNORE_CUBIN="1")
    assert "PASS hotspot" in out, out + err
    assert c["forwarded"] == 0 and c["launches"] == 300
    assert err.count("runs locally even when routed") == 1


# ---------------------------------------------------------------- bad frames


def is_error_reply(reply: list[bytes]) -> bool:
    body = reply[-1]
    if body.startswith(b"{"):
        return json.loads(body)["type"] == "error"
    h = ffi.from_buffer("struct fwd_hdr *", body)
    return (h.magic, h.version, h.len) == (MAGIC, VERSION, len(body)) and h.type in (T_ERROR, T_HELLO_REPLY)


@pytest.fixture(scope="module")
def fuzz_worker():
    r = Rig()
    r.start_worker(5, 20)
    r.sock = r.ctx.socket(zmq.DEALER)
    r.sock.setsockopt(zmq.LINGER, 0)
    r.sock.connect(f"ipc://{r.dir}/worker-5.sock")
    yield r
    r.sock.close()
    r.close()


def send_recv(r, *frames: bytes) -> list[bytes]:
    r.sock.send_multipart(list(frames))
    assert r.sock.poll(3000), f"no answer to {frames!r}"
    return r.sock.recv_multipart()


def test_bad_frames_are_rejected_and_logged(fuzz_worker):
    r = fuzz_worker
    launch = fwd.launch(1, 0, b"", block=(1, 1, 1))          # a sound LAUNCH
    cases = [
        b"\x00random bytes",
        hdr(T_BYE, 8, version=9),                      # wrong version
        launch[:5],                                    # truncated header
        launch[:40],                                   # truncated body
        hdr(T_LAUNCH, len(launch) + 1) + launch[8:],   # length field lies
        launch,                                        # valid LAUNCH before HELLO
        hdr(77, 8),                                    # unknown type
        hdr(T_ERROR, 32) + bytes(24),                  # a type workers do not take
    ]
    for frame in cases:
        reply = send_recv(r, frame)
        assert len(reply) == 1 and is_error_reply(reply), (frame, reply)
    assert is_error_reply(send_recv(r, b"", b'{"v":1,"type":"nope"}'))
    assert is_error_reply(send_recv(r, b"one", b"two", b"three"))
    log = r.worker_log(5)
    assert log.count("bad frame from") >= len(cases), log
    assert r.stats(5)["state"] == "ready"


def test_hello_with_a_bad_page_is_refused(fuzz_worker):
    r = fuzz_worker
    page, name = b"/nonexistent/page", b"fuzz"
    reply = send_recv(r, fwd.hello(5, page, name))
    assert reply[0][2] == T_HELLO_REPLY and fwd.hello_reply(reply[0]).status != 0, reply
    reply = send_recv(r, fwd.hello(6, page, name, flags=0))
    assert fwd.hello_reply(reply[0]).status == lib.FWD_S_WRONG_WORKER


def is_stats_request(data: bytes) -> bool:
    try:
        return json.loads(data)["type"] == "stats"
    except (ValueError, TypeError, KeyError, IndexError):
        return False


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=300),
                 st.text(max_size=60).map(lambda t: ('{"type":' + t).encode())))
def test_fuzz_random_bytes(fuzz_worker, data):
    reply = send_recv(fuzz_worker, data)
    if reply[-1].startswith(b'{"v":1,"type":"stats"'):
        assert is_stats_request(data), data     # answered as stats only when it asked
    else:
        assert is_error_reply(reply), (data, reply)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 8), st.integers(0, 255), st.binary(max_size=200), st.integers(-3, 3))
def test_fuzz_framed_bodies(fuzz_worker, type_, flags, body, skew):
    """A sound header on random bodies, with the length right or off by a little."""
    frame = hdr(type_, max(0, 8 + len(body) + skew), flags=flags) + body
    reply = send_recv(fuzz_worker, frame)
    assert is_error_reply(reply), (frame, reply)


def test_worker_survives_the_fuzzing(fuzz_worker):
    r = fuzz_worker
    assert r.workers[5].poll() is None
    s = r.stats(5)
    assert s["state"] == "ready" and s["apps"] == 0 and s["bad_frames"] > 0


# ---------------------------------------------------------------- the launch ring


def test_hello_without_a_ring_is_refused(fuzz_worker):
    """The ring is the only way launches reach a worker: a HELLO that asks
    for none, or whose page holds none, is refused with a reason (a shim
    then runs locally, as on any refused route), and MODULE, DEFINE and
    LAUNCH frames on the socket are refused by type, even from an app the
    worker took."""
    r = fuzz_worker
    path = r.dir / f"page-{os.urandom(4).hex()}"
    dev = os.path.realpath(r.env["SIMGPU_DIR"]).encode()

    def hello(ring_size: int, flags: int) -> tuple[int, str]:
        with open(path, "wb") as f:
            f.truncate(lib.FWD_RING_OFF + fwd.RING)
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
            pg = ffi.from_buffer("struct fwd_page *", mm)
            pg.magic, pg.version, pg.ring_size = lib.FWD_PAGE_MAGIC, lib.FWD_PAGE_VERSION, ring_size
            ffi.release(pg)
        reply = send_recv(r, fwd.hello(5, str(path).encode(), b"noring", device=dev, flags=flags))[0]
        assert reply[2] == T_HELLO_REPLY and reply[3] & HF_RING == 0, reply
        return fwd.hello_reply(reply).status, fwd.hello_reply_msg(reply)

    try:
        status, msg = hello(fwd.RING, 0)
        assert status == lib.FWD_S_UNSUPPORTED and "only through the page's launch ring" in msg, msg
        status, msg = hello(0, HF_RING)
        assert status == lib.FWD_S_BAD_PAGE and "bad ring size 0" in msg, msg
    finally:
        path.unlink()
    assert r.stats(5)["apps"] == 0
    app = RingApp(r, 5, name="socketframes")
    try:
        for frame in (define(0, b"_Z6vecaddPKfS0_Pfi", [(0, 8)], 8), launch(1, 0, b"")):
            app.sock.send(frame)
            assert app.sock.poll(3000), "no ERROR"
            err = app.sock.recv()
            code = ffi.from_buffer("struct fwd_errmsg *", err).code
            assert err[2] == T_ERROR and code == lib.FWD_E_TYPE, err
        assert not app.refused() and app.page("executed") == 0
    finally:
        app.close()


def test_an_app_that_said_bye_and_died_is_not_taken_for_gone(fuzz_worker):
    """The shim sets the page's bye before its BYE frame, which a process
    exiting at once may take with it: the worker, finding the app's pid
    dead, closes it as at a BYE.  Without bye it says the app is gone and
    drops its queued launches, one tick after it found the pid dead."""
    r = fuzz_worker
    pids = []
    for _ in range(2):
        p = subprocess.Popen(["true"])
        p.wait()
        pids.append(p.pid)                  # dead: as an app that exited
    said = RingApp(r, 5, name="saidbye", pid=pids[0])
    quiet = RingApp(r, 5, name="quietexit", pid=pids[1])
    try:
        off = fwd.page_off("bye")
        said.mm[off:off + 4] = (1).to_bytes(4, "little")
        assert wait_until(lambda: r.stats(5)["apps"] == 0, 5), r.stats(5)
        log = r.worker_log(5)
        assert f"app quietexit (pid {pids[1]}) is gone" in log, log
        assert f"app saidbye (pid {pids[0]}) is gone" not in log, log
    finally:
        for a in (said, quiet):
            a.sock.close()
            a.mm.close()
            a.path.unlink()


def test_timed_launches_get_their_device_times_in_the_page(fuzz_worker):
    """FWD_LF_TIMED: the worker writes the launch's device start and
    duration into time slot seq % TIMES_N, then timed[sidx] = seq; an untimed
    launch gets no slot (and costs no event)."""
    r = fuzz_worker
    app = RingApp(r, 5, name="timed", twins=str(BIN / "vecadd.twins.so"))
    try:
        app.write(define(0, b"_Z6vecaddPKfS0_Pfi", [(0, 8), (8, 8), (16, 8), (24, 4)], 32))
        args = struct.pack("<QQQi4x", 0, 0, 0, 0)
        app.write(launch(1, 0, args))
        app.write(launch(2, 0, args, flags=LF_TIMED))
        app.write(launch(3, 0, args, flags=LF_TIMED))
        app.write(launch(4, 0, args, sidx=1, flags=LF_TIMED))
        app.settle()
        end = time.monotonic() + 3
        while app.page("timed") != 3 or app.u64(fwd.page_off("timed") + 8) != 4:
            assert time.monotonic() < end, "times did not reach the page"
            time.sleep(0.002)
        assert not app.refused()

        def slot(seq: int) -> tuple[int, int, int]:
            off = lib.FWD_PAGE_SIZE + (seq % lib.FWD_TIMES_N) * ffi.sizeof("struct fwd_time")
            t = ffi.from_buffer("struct fwd_time *", app.mm[off:off + ffi.sizeof("struct fwd_time")])
            return t.seq, t.start_ns, t.dur_ns
        assert slot(1) == (0, 0, 0)                     # untimed: never written
        (s2, t2, d2), (s3, t3, d3), (s4, _, _) = slot(2), slot(3), slot(4)
        assert (s2, s3, s4) == (2, 3, 4)
        assert d2 > 0 and d3 > 0                        # simgpu models a launch's cost
        assert t3 >= t2 + d2                            # stream order, one time axis
        # anchored to the host clock (CLOCK_MONOTONIC, ns); at timescale 0 the
        # device clock does not advance with it, so only a loose bound holds
        assert abs(t2 - time.monotonic_ns()) < 3600 * 10**9
    finally:
        app.close()
    assert r.stats(5)["state"] == "ready"


def test_ring_runs_launches_and_refuses_garbage(fuzz_worker):
    r = fuzz_worker
    before = r.stats(5)["forwarded"]
    app = RingApp(r, 5, twins=str(BIN / "vecadd.twins.so"))
    try:
        # vecadd's twin with n = 0 touches no memory
        app.write(define(0, b"_Z6vecaddPKfS0_Pfi", [(0, 8), (8, 8), (16, 8), (24, 4)], 32))
        for seq in (1, 2, 3):
            app.write(launch(seq, 0, struct.pack("<QQQi4x", 0, 0, 0, 0)))
        app.settle()
        end = time.monotonic() + 3
        while app.page("done") != 3:
            assert time.monotonic() < end, "launches did not complete"
            time.sleep(0.002)
        assert app.page("executed") == 3 and not app.refused()
        assert r.stats(5)["forwarded"] == before + 3
        app.write(launch(4, 7, b""))                    # kernel 7 was never defined
        app.settle()
        # settle sees the tail move before the frame runs: wait for the verdict
        assert wait_until(app.refused, 3, "the launch of kernel 7 refused", 0.002) == 4   # FWD_E_UNKNOWN_KERNEL
        assert "refusing its launch ring" in r.worker_log(5)
    finally:
        app.close()
    assert r.stats(5)["state"] == "ready"


def test_kernel_without_a_twin_is_refused_not_run_as_a_no_op(fuzz_worker):
    """On simgpu a kernel the worker has no host twin for would run as a timed
    no-op, silently dropping the app's work: the worker refuses it instead
    (the app then replays it locally, where its libraries have the twin)."""
    r = fuzz_worker
    app = RingApp(r, 5, name="notwin")
    try:
        app.write(define(0, b"_Z11ring_no_opPii", [(0, 8), (8, 4)], 16))
        app.write(launch(1, 0, struct.pack("<Qi4x", 0, 1)))
        app.settle()
        assert wait_until(app.refused, 3, "the launch refused", 0.002) != 0 and app.page("executed") == 0
        assert "no host twin for _Z11ring_no_opPii" in r.worker_log(5)
    finally:
        app.close()
    assert r.stats(5)["state"] == "ready"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(min_size=1, max_size=400), st.integers(0, 400), st.booleans())
def test_fuzz_ring_contents(fuzz_worker, junk, length, framed):
    """Whatever an app writes into its ring, the worker refuses it or takes
    it, and stays up."""
    app = RingApp(fuzz_worker, 5, name="ringfuzz")
    try:
        if framed:      # a sound header in front, with some length
            junk = hdr(junk[0] % 8, length) + junk
        app.write(junk)
        app.settle()
    finally:
        app.close()
    assert fuzz_worker.workers[5].poll() is None


def test_kernel_fault_takes_the_worker_down_cleanly(rig):
    """A forwarded kernel that faults breaks the worker's CUDA context (as on
    a GPU): the worker exits at once without reporting the kernel done, so
    the app replays it locally and gets the fault there, as natively."""
    w = rig.start_worker(5, 20)
    app = RingApp(rig, 5, twins=str(BIN / "hotspot.twins.so"))
    try:
        params = [(0, 8), (8, 8), (16, 8)] + [(24 + 4 * i, 4) for i in range(7)]
        app.write(define(0, b"_Z12hotspot_stepPKfS0_Pfiifffff", params, 52))
        bad = struct.pack("<QQQii5f", 0x10, 0x10, 0x10, 16, 16, 1, 1, 1, 1, 1)   # NULL-ish pointers
        app.write(launch(1, 0, bad))
        assert w.wait(10) == 70
        assert app.page("done") == 0                   # the faulted kernel is not "done"
    finally:
        app.mm.close()
        app.sock.close()
    assert "CUDA context broken (cudaErrorIllegalAddress" in rig.worker_log(5)
    assert not (rig.dir / "worker-5.sock").exists() and not (rig.dir / "worker-5.pid").exists()
