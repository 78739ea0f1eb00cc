"""The controller daemon, driven over protocol v1 by a DEALER playing the shim."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time

import pytest
from conftest import Client, Controller, colocate, new_rundir, wait_for
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from controlplane import protocol
from controlplane.policies.base import AppInfo, Decision, Policy, make_policy, policy_names, register_policy
from shim.ctlblock import FREE, LIVE, ControlBlock


@pytest.fixture(scope="module")
def cb(controller):
    with ControlBlock(controller.rundir / "ctlblock") as block:
        yield block


def register(ctl, pid: int, name: str = "app", cls: str = "batch", **fields) -> dict:
    r = ctl.call("register", pid=pid, name=name, **{"class": cls}, device="sim", exe="/bin/sleep", **fields)
    assert r["type"] == "registered", r
    return r


def records(ctl, all: bool = True) -> dict[int, dict]:
    r = ctl.call("list", all=all)
    assert r["type"] == "apps", r
    return {a["pid"]: a for a in r["apps"]}


def test_ping(controller):
    r = controller.call("ping")
    assert r == {"v": 1, "type": "pong", "controller_pid": controller.proc.pid, "policy": "static",
                 "device": "sim", "version": r["version"], "apps": r["apps"]}


def test_register_and_counters(controller, cb, sleeper):
    p = sleeper()
    r = register(controller, p.pid, "svc", "qos", qos_ms=50, quota_pct=30)
    assert r["quota_pct"] == 30 and r["route"] == 0 and r["controller_pid"] == controller.proc.pid
    slot = r["slot"]
    k = cb.control(slot)
    assert (k["state"], k["pid"], k["quota_pct"], k["route"]) == (LIVE, p.pid, 30, 0)
    assert k["route_epoch"] >= 1                      # the decision was published
    cb.write_counters(slot, launches=12345, forwarded=67, h2d_bytes=2**40 + 1, d2h_bytes=2**63 + 5)
    rec = records(controller, all=False)[p.pid]
    assert {k: rec[k] for k in ("name", "class", "quota_pct", "route", "launches", "forwarded",
                                "h2d_bytes", "d2h_bytes", "qos_ms", "state", "slot")} == {
        "name": "svc", "class": "qos", "quota_pct": 30, "route": 0, "launches": 12345, "forwarded": 67,
        "h2d_bytes": 2**40 + 1, "d2h_bytes": 2**63 + 5, "qos_ms": 50, "state": "live", "slot": slot}
    assert set(rec) == set(protocol.RECORD)
    assert register(controller, p.pid, "svc", "qos")["slot"] == slot     # same live pid: same slot


def test_static_policy_default_quota(controller, cb, sleeper):
    p = sleeper()
    r = register(controller, p.pid)
    assert r["quota_pct"] == 100 and cb.control(r["slot"])["quota_pct"] == 100


def test_dead_app_is_collected(controller, cb, sleeper):
    p = sleeper()
    slot = register(controller, p.pid, "doomed")["slot"]
    cb.write_counters(slot, launches=7, h2d_bytes=4096)
    p.kill()                                          # a zombie until reaped: must count as dead
    rec = wait_for(lambda: records(controller).get(p.pid, {}).get("state") == "exited"
                   and records(controller)[p.pid])
    assert rec, "liveness check did not collect the dead app"
    assert (rec["launches"], rec["h2d_bytes"], rec["exited_at"] is not None) == (7, 4096, True)
    assert p.pid not in records(controller, all=False)
    assert cb.control(slot)["state"] == FREE
    hist = [json.loads(ln) for ln in (controller.rundir / "history.jsonl").read_text().splitlines()]
    assert any(h["pid"] == p.pid and h["launches"] == 7 for h in hist)


def test_exit_message(controller, cb, sleeper):
    p = sleeper()
    slot = register(controller, p.pid, "leaver")["slot"]
    cb.write_counters(slot, launches=3, d2h_bytes=10)
    bad = controller.call("exit", pid=p.pid + 100000, slot=slot)
    assert bad["type"] == "error" and bad["in_reply_to"] == "exit"
    kernels = [{"name": "_Z6vecaddPfS_S_i", "launches": 3, "twin": False}]
    assert controller.call("exit", pid=p.pid, slot=slot, kernels=kernels) == {"v": 1, "type": "ok"}
    rec = records(controller)[p.pid]
    assert (rec["state"], rec["launches"], rec["d2h_bytes"], rec["kernels"]) == ("exited", 3, 10, kernels)
    # the slot stays the exiting process's while it lives (a stray counter
    # add of its last threads must not land in the next app's slot) ...
    assert cb.control(slot)["state"] != FREE
    p.kill()
    p.wait()
    # ... and is freed once it is gone
    assert wait_for(lambda: cb.control(slot)["state"] == FREE, timeout=3)


def test_register_refuses_dead_pid(controller, sleeper):
    p = sleeper()
    p.kill()
    p.wait()
    r = controller.call("register", pid=p.pid, name="ghost", **{"class": "batch"})
    assert r["type"] == "error" and "not running" in r["error"] and r["in_reply_to"] == "register"


HUGE = json.dumps({"v": 1, "type": "ping", "pad": "x" * (70 * 1024)}).encode()
MALFORMED = {
    "not json": [b"", b"hello"],
    "not utf8": [b"", b"\xff\xfe{}"],
    "not an object": [b"", b"[1, 2]"],
    "NaN": [b"", b'{"v":1,"type":"register","pid":1,"name":"a","class":"qos","qos_ms":NaN}'],
    "no v": [b"", b'{"type":"ping"}'],
    "wrong v": [b"", b'{"v":2,"type":"ping"}'],
    "bool v": [b"", b'{"v":true,"type":"ping"}'],
    "no type": [b"", b'{"v":1}'],
    "unknown type": [b"", b'{"v":1,"type":"launch_missiles"}'],
    "reply type": [b"", b'{"v":1,"type":"pong"}'],
    "missing field": [b"", b'{"v":1,"type":"register","name":"a","class":"qos"}'],
    "ill-typed field": [b"", b'{"v":1,"type":"register","pid":"12","name":"a","class":"qos"}'],
    "bad class": [b"", b'{"v":1,"type":"register","pid":12,"name":"a","class":"gold"}'],
    "quota range": [b"", b'{"v":1,"type":"register","pid":12,"name":"a","class":"qos","quota_pct":0}'],
    "bad kernels": [b"", b'{"v":1,"type":"exit","pid":12,"slot":0,"kernels":[{"name":1}]}'],
    "list all str": [b"", b'{"v":1,"type":"list","all":"yes"}'],
    "one frame": [b'{"v":1,"type":"ping"}'],
    "three frames": [b"", b'{"v":1,"type":"ping"}', b"extra"],
    "non-empty delimiter": [b"x", b'{"v":1,"type":"ping"}'],
    "empty payload": [b"", b""],
    "huge": [b"", HUGE],
    "deep nesting": [b"", b"[" * 60000],
}


@pytest.mark.parametrize("frames", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_gets_error(controller, frames):
    c = controller.client()
    try:
        c.send(*frames)
        r = c.recv()
        assert r["v"] == 1 and r["type"] == "error" and r["error"], r
        assert "Traceback" not in r["error"]
        assert c.call("ping")["type"] == "pong"
    finally:
        c.close()


def test_oversized_beyond_zmq_limit_drops_only_that_peer(controller):
    c = controller.client()
    try:
        c.send(b"", b"x" * (2 << 20))                 # over MAXMSGSIZE: zmq hangs up on this peer
        assert not c.sock.poll(300)
    finally:
        c.close()
    assert controller.call("ping")["type"] == "pong"


def test_error_names_the_request(controller):
    r = controller.call("register", pid="x", name="a", **{"class": "qos"})
    assert r["in_reply_to"] == "register" and "pid" in r["error"]
    assert controller.call("bogus")["in_reply_to"] is None


json_value = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                          max_leaves=8)
fields = st.sampled_from(["v", "type", "pid", "name", "class", "slot", "kernels", "all", "quota_pct", "qos_ms"])
types = st.sampled_from(["ping", "list", "register", "exit", "stop", "pong", "", "x" * 300])
message = st.dictionaries(fields, json_value, max_size=6).flatmap(
    lambda d: st.builds(lambda v, t: {**d, "v": v, "type": t}, st.sampled_from([1, 1, 2, "1", None]), types))


def _harmless(frames: list[bytes]) -> bool:
    """Skip the rare generated request that is valid and would change state."""
    try:
        msg = protocol.parse(frames[1]) if len(frames) == 2 and frames[0] == b"" else None
    except protocol.SchemaError:
        return True
    return msg is None or msg["type"] in ("ping", "list")


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(
    st.lists(st.binary(max_size=300), min_size=1, max_size=5),
    message.map(lambda m: [b"", json.dumps(m).encode()]),
    st.builds(lambda pre, m, post: pre + [json.dumps(m).encode()] + post,
              st.lists(st.binary(max_size=4), max_size=2), message, st.lists(st.binary(max_size=4), max_size=2)),
))
def test_fuzz_frames(controller, frames):
    assume(_harmless(frames))
    c = controller.client()
    try:
        c.send(*frames)
        r = c.recv()
        assert r["v"] == 1 and r["type"] in ("error", "pong", "apps"), r
        assert c.call("ping")["type"] == "pong"
    finally:
        c.close()


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.binary(min_size=1, max_size=2000))
def test_fuzz_raw_socket_bytes(controller, data):
    """Garbage below ZeroMQ's framing (not even a ZMTP greeting)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(str(controller.rundir / "ctl.sock"))
        s.sendall(data)
    except OSError:
        pass                                          # the daemon may hang up first: fine
    finally:
        s.close()
    assert controller.call("ping")["type"] == "pong"


# --- lifecycle: each test has its own controller ------------------------------

@pytest.fixture
def own():
    d = new_rundir()
    ctl = Controller(d)
    yield ctl
    ctl.stop()
    shutil.rmtree(d, ignore_errors=True)


def test_stop_message_shuts_down_cleanly(own):
    (own.rundir / "modules").mkdir(mode=0o700)        # as the apps' shims leave it
    (own.rundir / "modules" / "0123456789abcdef-100.fatbin").write_bytes(b"\0" * 100)
    assert own.call("stop") == {"v": 1, "type": "ok"}
    assert own.proc.wait(10) == 0
    assert not (own.rundir / "ctl.sock").exists() and not (own.rundir / "serve.pid").exists()
    assert not (own.rundir / "modules").exists()      # no worker is left to read them
    assert (own.rundir / "ctlblock").exists()         # running apps keep their mapping


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_shut_down_cleanly(own, sig):
    assert (own.rundir / "serve.pid").read_text().strip() == str(own.proc.pid)
    own.proc.send_signal(sig)
    assert own.proc.wait(10) == 0
    assert not (own.rundir / "ctl.sock").exists() and not (own.rundir / "serve.pid").exists()


def test_stop_command(own):
    r = colocate("stop", "--runtime-dir", own.rundir)
    assert r.returncode == 0, r.stderr
    assert own.proc.wait(10) == 0
    assert not (own.rundir / "ctl.sock").exists()
    r = colocate("stop", "--runtime-dir", own.rundir)
    assert r.returncode == 1 and "no controller" in r.stderr and "Traceback" not in r.stderr


def test_serve_refuses_to_start_twice(controller):
    for extra in ([], ["--detach"]):
        r = colocate("serve", "--runtime-dir", controller.rundir, "--device", "sim", *extra, timeout=20)
        assert r.returncode == 1 and "already" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert controller.call("ping")["type"] == "pong"


def test_serve_replaces_stale_socket(rundir):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(rundir / "ctl.sock"))                  # a socket file nobody serves
    s.close()
    (rundir / "serve.pid").write_text("999999\n")     # and a stale pid file
    ctl = Controller(rundir)
    try:
        assert ctl.call("ping")["controller_pid"] == ctl.proc.pid
    finally:
        ctl.stop()


def test_serve_detach_and_stop(rundir):
    r = colocate("serve", "--detach", "--runtime-dir", rundir, "--device", "sim")
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout.strip())
    try:
        c = Client(rundir)
        assert c.call("ping")["controller_pid"] == pid
        c.close()
        assert colocate("stop", "--runtime-dir", rundir).returncode == 0
        assert wait_for(lambda: not os.path.exists(f"/proc/{pid}"), 10)
    finally:
        if os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGKILL)


def test_serve_detach_failure_shows_the_log(rundir):
    (rundir / "ctlblock").mkdir()                     # the control block cannot be created
    r = colocate("serve", "--detach", "--runtime-dir", rundir, "--device", "sim")
    assert r.returncode == 1 and "exited with code 1" in r.stderr and "cannot start the controller" in r.stderr
    assert "Traceback" not in r.stderr


def test_serve_unknown_policy(rundir):
    for extra in ([], ["--detach"]):
        r = colocate("serve", "--runtime-dir", rundir, "--policy", "nope", *extra)
        assert r.returncode == 2 and "unknown policy 'nope'" in r.stderr and "Traceback" not in r.stderr


# --- policy interface ---------------------------------------------------------

def test_policy_registry():
    assert "static" in policy_names()
    app = AppInfo(slot=3, pid=1, name="a", cls="qos", qos_ms=5.0, requested_quota_pct=25)
    assert make_policy("static").on_register(app) == [Decision(3, 25, 0)]
    assert make_policy("static").on_tick(1.0) == []

    @register_policy("test-half")
    class Half(Policy):
        def on_register(self, app):
            return [Decision(app.slot, self.opts.get("pct", 50))]
    assert make_policy("test-half", pct=40).on_register(app) == [Decision(3, 40, 0)]
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("nope")


# --- in-process: the Controller object without a socket client -----------------

@register_policy("test-broken")
class Broken(Policy):
    def on_register(self, app):
        raise RuntimeError("policy bug")

    def on_tick(self, now_s):
        return [Decision(999, 50)]                    # a slot nobody has


@register_policy("test-greedy")
class Greedy(Policy):
    def on_register(self, app):
        return [Decision(app.slot, 0, 2)]             # quota out of range: clamped to 1


def _in_process(rundir, policy: str):
    from controlplane.daemon import Controller
    from shim.rundir import ensure
    return Controller(ensure(rundir), make_policy(policy), "sim")


def _frames(**m) -> list[bytes]:
    return [b"", json.dumps({"v": 1, **m}).encode()]


def test_failing_policy_does_not_break_registration(rundir, sleeper):
    ctl = _in_process(rundir, "test-broken")
    try:
        p = sleeper()
        r = ctl.handle(_frames(type="register", pid=p.pid, name="a", **{"class": "batch"}))
        assert (r["type"], r["quota_pct"], r["route"]) == ("registered", 100, 0)
        ctl.tick(0.0)                                 # bad decision: logged, ignored
        assert ctl.handle(_frames(type="list", all=False))["apps"][0]["quota_pct"] == 100
    finally:
        ctl.close()
    assert not (rundir / "ctl.sock").exists()


def test_decisions_are_clamped(rundir, sleeper):
    ctl = _in_process(rundir, "test-greedy")
    try:
        r = ctl.handle(_frames(type="register", pid=sleeper().pid, name="a", **{"class": "qos"}))
        assert (r["quota_pct"], r["route"]) == (1, 2)
        k = ctl.cb.control(r["slot"])
        assert (k["quota_pct"], k["route"], k["route_epoch"]) == (1, 2, 1)
    finally:
        ctl.close()


def test_control_block_wrapper(tmp_path):
    from shim.ctlblock import NSLOTS, ControlBlockFull
    with ControlBlock.create(tmp_path / "cb") as cb:
        assert cb.header()["controller_pid"] == os.getpid() and cb.header()["nslots"] == NSLOTS
        slots = [cb.claim(1000 + i) for i in range(NSLOTS)]
        assert slots == list(range(NSLOTS))
        with pytest.raises(ControlBlockFull):
            cb.claim(1)
        cb.release(5)
        assert cb.control(5)["state"] == FREE and cb.claim(77) == 5
        cb.write_counters(5, allocs_live=-2, launches=2**64 - 1)
        assert cb.counters(5)["allocs_live"] == -2 and cb.counters(5)["launches"] == 2**64 - 1
        with pytest.raises(IndexError):
            cb.control(NSLOTS)
        with pytest.raises(KeyError):
            cb.write_counters(0, nonsense=1)
        with ControlBlock(tmp_path / "cb") as other:       # a second mapping sees the same memory
            assert other.counters(5)["allocs_live"] == -2
    (tmp_path / "bad").write_bytes(b"\0" * 100)
    with pytest.raises(OSError, match="not a control block"):
        ControlBlock(tmp_path / "bad")


def test_route_writes_are_stamped_when_published_and_the_flipper_cycles_and_stops(tmp_path):
    """set_route returns the clock just after the epoch's store (what the
    switch benchmarks time from); flip_routes cycles its routes, one epoch
    per write, on its period, and ends when its stop flag is set."""
    import threading

    from shim.ctlblock import stop_flag
    with ControlBlock.create(tmp_path / "cb") as cb:
        s = cb.claim(1)
        t0 = time.monotonic_ns()
        t1 = cb.set_route(s, 2, 40)
        assert t0 <= t1 <= time.monotonic_ns()
        assert (cb.control(s)["route"], cb.control(s)["quota_pct"], cb.control(s)["route_epoch"]) == (2, 40, 1)
        made = cb.flip_routes(s, [3, 4], 25, 0.001, stop_flag(), 5)      # 5 writes, then it returns
        assert [r for _b, r, _e in made] == [3, 4, 3, 4, 3]
        assert all(b <= e for b, _r, e in made) and cb.control(s)["route_epoch"] == 6
        # each write a period after the last began, never sooner (no burst after a stall)
        assert all(b2 - b1 >= 1_000_000 for (b1, _, _), (b2, _, _) in zip(made, made[1:]))
        assert (cb.control(s)["route"], cb.control(s)["quota_pct"]) == (3, 25)
        stop, out = stop_flag(), []
        th = threading.Thread(target=lambda: out.extend(cb.flip_routes(s, [5], 25, 0.002, stop, 10**6)))
        th.start()
        assert wait_for(lambda: cb.control(s)["route_epoch"] > 6, timeout=10)   # it runs, GIL released
        stop[0] = 1
        th.join(5)
        assert not th.is_alive() and 1 <= len(out) < 10**6
        assert cb.control(s)["route_epoch"] == 6 + len(out)
        with pytest.raises(ValueError):
            cb.flip_routes(s, [], 25, 0.001, stop_flag(), 5)
        with pytest.raises(ValueError):
            cb.flip_routes(s, [1], 25, 0.001, stop_flag(), 2**31)   # refused before its buffer is made


@pytest.mark.serial      # modelled or wall time that other tests' load would move
def test_batch_throughput_normalised_to_solo(tmp_path, sleeper):
    """serve --solo: a batch app's launch rate over the recent window while
    live and over its run once exited, divided by its solo rate; QoS apps none."""
    solo = tmp_path / "solo.json"
    solo.write_text(json.dumps({"grinder": 1000.0}))
    d = new_rundir()
    ctl = Controller(d, "--solo", str(solo))
    try:
        with ControlBlock(d / "ctlblock") as block:
            p, q = sleeper(), sleeper()
            slot = register(ctl, p.pid, "grinder")["slot"]
            register(ctl, q.pid, "svc", "qos", qos_ms=5)
            t0 = time.monotonic()
            n = 0
            while time.monotonic() - t0 < 0.6:    # ~500 launches/s for a few ticks
                n += 25
                block.write_counters(slot, launches=n)
                time.sleep(0.05)
            rec = records(ctl, all=False)
            t = rec[p.pid]["throughput"]
            assert rec[q.pid]["throughput"] is None
            assert t["solo_launches_per_s"] == 1000.0
            assert 250 < t["launches_per_s"] < 1000, t
            assert t["normalised"] == pytest.approx(t["launches_per_s"] / 1000.0)
            ctl.call("exit", pid=p.pid, slot=slot)
            fin = records(ctl)[p.pid]
            span = fin["exited_at"] - fin["registered_at"]
            assert fin["throughput"]["launches_per_s"] == pytest.approx(n / span)
    finally:
        ctl.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_bad_solo_file_is_refused(tmp_path):
    bad = tmp_path / "solo.json"
    bad.write_text('{"x": "fast"}')
    r = colocate("serve", "--runtime-dir", str(tmp_path / "rd"), "--solo", str(bad))
    assert r.returncode == 2 and "launches per second" in r.stderr


def test_batch_tasks_reach_the_policy_at_a_bounded_rate():
    from controlplane.daemon import BATCH_TASK_EVERY_S, App
    from controlplane.daemon import Controller as Ctl
    batch = App(AppInfo(1, 1, "b", "batch"), 0, "/bin/true", 0.0)
    qos = App(AppInfo(2, 2, "q", "qos", 5.0), 0, "/bin/true", 0.0)
    assert Ctl.batch_task_due(batch, "k1")
    assert not Ctl.batch_task_due(batch, "k1")           # same kernel, too soon
    assert Ctl.batch_task_due(batch, "k2")               # another kernel: at once
    time.sleep(BATCH_TASK_EVERY_S * 1.5)
    assert Ctl.batch_task_due(batch, "k2")
    assert all(Ctl.batch_task_due(qos, "k1") for _ in range(3))


@register_policy("test-window")
class Window(Policy):
    def fwd_window(self, app: AppInfo) -> int | None:
        return 3 if app.cls == "batch" else None


def test_register_reply_carries_the_policys_forwarding_window(tmp_path, sleeper):
    from controlplane.daemon import Controller as Ctl
    from shim.rundir import ensure
    ctl = Ctl(ensure(tmp_path / "rd"), make_policy("test-window"), "sim")
    try:
        def reg(cls: str) -> dict:
            m = {"v": 1, "type": "register", "pid": sleeper().pid, "name": cls, "class": cls}
            return ctl.handle([b"", json.dumps(m).encode()])
        assert reg("batch")["fwd_window"] == 3
        assert "fwd_window" not in reg("qos")
    finally:
        ctl.close()


def test_exit_queued_behind_a_zombie_is_still_taken(tmp_path, sleeper):
    """An app says exit and becomes a zombie at once: a tick that finds it
    gone before its exit was read waits one more tick, so the exit (with its
    kernel list) is taken instead of being refused as unregistered."""
    from controlplane.daemon import Controller as Ctl
    from shim.rundir import ensure
    ctl = Ctl(ensure(tmp_path / "rd"), make_policy("static"), "sim")
    try:
        def call(**m) -> dict:
            return ctl.handle([b"", json.dumps({"v": 1, **m}).encode()])
        late, dead = sleeper(), sleeper()
        s1 = call(type="register", pid=late.pid, name="late", **{"class": "batch"})["slot"]
        call(type="register", pid=dead.pid, name="dead", **{"class": "batch"})
        for p in (late, dead):
            p.kill()
            p.wait()
        now = time.monotonic()
        ctl.tick(now)                                  # both found gone: not collected yet
        assert {a.info.name for a in ctl.apps.values()} == {"late", "dead"}
        kernels = [{"name": "_Z1kv", "launches": 3, "twin": True}]
        assert call(type="exit", pid=late.pid, slot=s1, kernels=kernels)["type"] == "ok"
        ctl.tick(now + 0.1)                            # the silent one is collected now
        recs = {r["name"]: r for r in call(type="list", all=True)["apps"]}
        assert recs["late"]["kernels"] == kernels and recs["dead"]["state"] == "exited"
        assert not ctl.apps
    finally:
        ctl.close()
