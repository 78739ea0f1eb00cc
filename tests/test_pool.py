"""The process pool: spec, workers' lifecycle (tests/fake_worker.py stands in for
shim/lib/colocate-worker), the controller's pool / set_quota messages and the
MPS control daemon's commands (a fake nvidia-cuda-mps-control on PATH)."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PY, ROOT, Controller, clean_env, colocate, new_rundir, wait_for

from controlplane import protocol
from controlplane.policies.base import Decision, Policy, make_policy, register_policy
from processpool import DEFAULT_SPEC, MAX_WORKERS, Mps, MpsError, Pool, PoolError, SpecError, parse_spec, worker_env
from processpool import pool as pool_mod
from shim import paths
from shim.ctlblock import ControlBlock

FAKE = [PY, str(ROOT / "tests" / "fake_worker.py")]
FAKE_CMD = " ".join(map(shlex.quote, FAKE))
WORKER_KEYS = {"id", "quota_pct", "pid", "state", "forwarded", "apps"}


# --- the spec ---------------------------------------------------------------------

def test_parse_spec():
    assert parse_spec("10:4,20:4") == [(10, 4), (20, 4)]
    assert parse_spec(" 5 : 1 , 100:0 ") == [(5, 1), (100, 0)]
    assert parse_spec(None) == parse_spec("default") == [(q, 2) for q in range(10, 101, 10)]
    assert DEFAULT_SPEC == "10:2,20:2,30:2,40:2,50:2,60:2,70:2,80:2,90:2,100:2"
    assert parse_spec("none") is parse_spec("NONE") is None
    assert parse_spec("1:48") == [(1, 48)] and MAX_WORKERS == 48


BAD_SPECS = {
    "empty": ("", "empty pool spec"),
    "no count": ("10", "bad pool entry '10'"),
    "words": ("ten:2", "bad pool entry"),
    "negative": ("10:-1", "bad pool entry"),
    "quota 0": ("0:2", "quota must be 1..100"),
    "quota 101": ("101:1", "quota must be 1..100"),
    "count 49": ("10:49", "count must be 0..48"),
    "total 49": ("10:24,20:25", "at most 48"),
    "twice": ("10:1,10:2", "appears twice"),
    "trailing comma": ("10:1,", "bad pool entry ''"),
}


@pytest.mark.parametrize("spec,msg", BAD_SPECS.values(), ids=BAD_SPECS.keys())
def test_bad_specs(spec, msg):
    with pytest.raises(SpecError, match=msg) as e:
        parse_spec(spec)
    assert e.value.code == 2 and "\n" not in str(e.value)


def test_serve_refuses_bad_spec(rundir):
    for extra in ([], ["--detach"]):
        r = colocate("serve", "--runtime-dir", rundir, "--device", "sim", "--pool", "10:2,200:1", *extra)
        assert r.returncode == 2 and "quota must be 1..100" in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert "QUOTA:COUNT" in colocate("serve", "--help").stdout


# --- the pool as a library ---------------------------------------------------------

@pytest.fixture
def pools(rundir):
    """Factory of Pools on the fake worker in a private runtime dir; all stopped afterwards."""
    made = []

    def make(spec: str, env: dict | None = None, **kw) -> Pool:
        p = Pool(rundir, kw.pop("device", "sim"), parse_spec(spec), cmd=FAKE, env=clean_env(**(env or {})), **kw)
        made.append(p)
        return p
    yield make
    for p in made:
        p.stop()


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_pool_starts_workers(pools, rundir):
    p = pools("10:2,40:1,100:1", env={"SIMGPU_TIMESCALE": "7"})
    p.start()
    assert p.wait_ready(10)
    rows = p.stats()
    assert [(r["id"], r["quota_pct"], r["state"]) for r in rows] == [
        (1, 10, "ready"), (2, 10, "ready"), (3, 40, "ready"), (4, 100, "ready")]
    # fake_worker.py also answers "modules" (passed on) and a bad "module_loads" (dropped)
    assert all(set(r) == WORKER_KEYS | {"modules"} and alive(r["pid"]) for r in rows)
    assert all((rundir / f"worker-{i}.sock").exists() and (rundir / f"worker-{i}.log").exists()
               for i in range(1, 5))
    env = json.loads((rundir / "worker-3.env").read_text())
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(paths.SIMGPU_DIR)
    assert env["SIMGPU_DIR"] == str(rundir / "simgpu") and env["SIMGPU_TIMESCALE"] == "7"
    assert "libzmq" in env["COLOCATE_LIBZMQ"]
    assert "libcolocate" not in env.get("LD_PRELOAD", "") and "COLOCATE_APP_NAME" not in env
    assert p.pick(10) == 1 and p.pick(10, {1: 2, 2: 1}) == 2 and p.pick(40) == 3 and p.pick(30) is None
    assert "no worker at 30%" in p.why_none(30) and "10%, 40%, 100%" in p.why_none(30)
    pids = [r["pid"] for r in rows]
    p.stop()
    assert not any(alive(pid) for pid in pids)
    assert not list(rundir.glob("worker-*.sock")) and not list(rundir.glob("worker-*.pid"))
    assert {w.state for w in p.workers()} == {"dead"}


def test_worker_env_on_cuda(rundir):
    env = worker_env(rundir, "cuda", 30, {"CUDA_MPS_PIPE_DIRECTORY": "/p", "CUDA_MPS_LOG_DIRECTORY": "/l"},
                     base={"PATH": "/bin", "LD_PRELOAD": f"/x/libfoo.so:{paths.LIBCOLOCATE}"})
    assert (env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], env["CUDA_MPS_PIPE_DIRECTORY"],
            env["CUDA_MPS_LOG_DIRECTORY"], env["LD_PRELOAD"]) == ("30", "/p", "/l", "/x/libfoo.so")
    assert "SIMGPU_DIR" not in env and str(paths.SIMGPU_DIR) not in env.get("LD_LIBRARY_PATH", "")


def test_dead_worker_restarts_with_new_id(pools):
    p = pools("40:2", backoff=0.05)
    p.start()
    assert p.wait_ready(10)
    victim = p.worker(1)
    os.kill(victim.pid, signal.SIGKILL)
    gone = wait_for(lambda: p.check(), 5)
    assert gone == [1] and victim.state == "dead" and "SIGKILL" in victim.exit_reason
    assert p.wait_ready(10)
    assert sorted(w.id for w in p.workers()) == [2, 3] and p.worker(3).quota_pct == 40
    assert not p.is_ready(1) and p.is_ready(3)


def test_worker_that_always_dies_fails_without_storm(pools, rundir):
    p = pools("10:1,20:1", env={"FAKE_WORKER_DIE": "20"}, backoff=0.05, max_restarts=3)
    p.start()
    t0 = time.monotonic()
    wait_for(lambda: p.check() is not None and p.positions[1].worker.state == "failed", 15)
    w = p.positions[1].worker
    assert w.state == "failed" and "exited with code 3" in w.exit_reason
    assert p.next_id - 1 == 1 + 4                 # worker 1, then 20 %: first try + 3 restarts
    time.sleep(0.3)
    p.check()
    assert p.next_id - 1 == 5 and p.positions[0].worker.state == "ready"
    assert time.monotonic() - t0 < 10
    assert "dying at once" in (rundir / f"worker-{w.id}.log").read_text()


def test_worker_not_ready_in_time_is_killed(pools):
    p = pools("10:1", env={"FAKE_WORKER_HANG": "10"}, ready_timeout=0.5, backoff=5)
    p.start()
    w = p.worker(1)
    wait_for(lambda: p.check() == [1], 5)
    assert w.state == "dead" and "not ready within 0.5 s" in w.exit_reason and not alive(w.pid)


def test_unresponsive_worker(pools):
    p = pools("10:1,20:1", env={"FAKE_WORKER_MUTE": "20"}, stats_timeout=0.2)
    p.start()
    assert p.wait_ready(10)
    assert [r["state"] for r in p.stats()] == ["ready", "unresponsive"]


def test_stop_kills_stragglers(pools):
    p = pools("10:1", env={"FAKE_WORKER_IGNORE_TERM": "10"}, stop_timeout=0.5)
    p.start()
    assert p.wait_ready(10)
    pid = p.worker(1).pid
    t0 = time.monotonic()
    p.stop()
    assert not alive(pid) and time.monotonic() - t0 < 3


def test_missing_worker_executable(rundir):
    p = Pool(rundir, "sim", parse_spec("10:1"), cmd=[str(rundir / "no-such-worker")])
    with pytest.raises(PoolError, match="no-such-worker is not built; run `make build`"):
        p.start()


def test_worker_command_override(monkeypatch):
    monkeypatch.delenv("COLOCATE_WORKER_CMD", raising=False)
    assert pool_mod.worker_cmd() == [str(paths.LIB_DIR / "colocate-worker")]
    monkeypatch.setenv("COLOCATE_WORKER_CMD", "python3 '/a b/w.py'")
    assert pool_mod.worker_cmd() == ["python3", "/a b/w.py"]
    assert pool_mod.worker_cmd(["x"]) == ["x"] and pool_mod.worker_cmd("y -v") == ["y", "-v"]


# --- the controller with a pool ---------------------------------------------------

class PoolController(Controller):
    """conftest's `colocate serve` subprocess, with the fake worker and extra env."""

    def __init__(self, rundir: Path, *args: str, env: dict | None = None):
        self.rundir = rundir
        self.log = open(rundir / "test-serve.out", "wb")
        self.proc = subprocess.Popen([PY, "-m", "controlplane.cli", "serve", "--runtime-dir", str(rundir),
                                      "--device", "sim", *args], cwd=ROOT,
                                     env=clean_env(COLOCATE_WORKER_CMD=FAKE_CMD, **(env or {})),
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.wait_ready()

    def pool(self) -> list[dict]:
        r = self.call("pool")
        assert r["type"] == "pool", r
        return r["workers"]

    def wait_pool(self, pred, timeout: float = 10.0):
        return wait_for(lambda: pred(self.pool()), timeout)


@pytest.fixture(scope="module")
def pctl():
    d = new_rundir()
    ctl = PoolController(d, "--pool", "10:1,40:2,100:1,30:1", env={"FAKE_WORKER_DIE": "30"})
    yield ctl
    ctl.stop()
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def pcb(pctl):
    with ControlBlock(pctl.rundir / "ctlblock") as block:
        yield block


def ready_at(workers: list[dict], q: int) -> list[dict]:
    return [w for w in workers if w["quota_pct"] == q and w["state"] == "ready"]


def register(ctl, pid: int, name: str, **fields) -> dict:
    r = ctl.call("register", pid=pid, name=name, **{"class": "batch"}, device="sim", **fields)
    assert r["type"] == "registered", r
    return r


def test_pool_cli_lists_workers(pctl):
    assert pctl.wait_pool(lambda ws: len(ready_at(ws, 40)) == 2 and ready_at(ws, 10) and ready_at(ws, 100))
    r = colocate("pool", "--json", "--runtime-dir", pctl.rundir)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert len(rows) == 5 and all(WORKER_KEYS <= set(w) for w in rows)
    assert sorted(w["quota_pct"] for w in rows) == [10, 30, 40, 40, 100]
    assert all(isinstance(w["pid"], int) for w in rows if w["state"] == "ready")
    # optional worker counters pass through when well typed, and only then
    answered = [w for w in rows if "modules" in w]
    assert answered and all(w["modules"] == w["forwarded"] + 1 for w in answered)
    assert not any("module_loads" in w for w in rows)
    t = colocate("pool", "--runtime-dir", pctl.rundir)
    assert t.returncode == 0 and "quota %" in t.stdout and "ready" in t.stdout
    raw = pctl.call("pool")
    protocol.validate(raw, protocol.REPLIES)
    assert raw["spec"] == "10:1,40:2,100:1,30:1"


def test_set_quota_routes_to_a_worker(pctl, pcb, sleeper):
    assert pctl.wait_pool(lambda ws: len(ready_at(ws, 40)) == 2)
    p = sleeper()
    slot = register(pctl, p.pid, "fwd-app")["slot"]
    before = pcb.control(slot)
    assert (before["route"], before["quota_pct"]) == (0, 100)
    r = colocate("set-quota", "fwd-app", "40", "--runtime-dir", pctl.rundir)
    assert r.returncode == 0, r.stderr
    k = pcb.control(slot)
    forties = {w["id"] for w in ready_at(pctl.pool(), 40)}
    assert k["route"] in forties and k["quota_pct"] == 40 and k["route_epoch"] > before["route_epoch"]
    assert f"worker {k['route']} (40%)" in r.stderr
    rec = next(a for a in pctl.call("list")["apps"] if a["pid"] == p.pid)
    assert (rec["route"], rec["quota_pct"], rec["worker"]) == (k["route"], 40, {"id": k["route"], "quota_pct": 40})
    q = colocate("quotas", "--runtime-dir", pctl.rundir)
    assert f"worker {k['route']} (40%)" in q.stdout
    # the same quota again: it stays where it is (no flapping, no epoch bump)
    epoch = k["route_epoch"]
    assert pctl.call("set_quota", name="fwd-app", quota_pct=40) == {
        "v": 1, "type": "ok", "slot": slot, "route": k["route"], "slots": [slot], "routes": [k["route"]]}
    assert pcb.control(slot)["route_epoch"] == epoch
    # a second app at 40 % goes to the other, less loaded, 40 % worker
    p2 = sleeper()
    slot2 = register(pctl, p2.pid, "fwd-app2")["slot"]
    r2 = pctl.call("set_quota", name="fwd-app2", quota_pct=40)
    assert r2["slot"] == slot2 and r2["route"] in forties - {k["route"]}
    assert {w["id"]: w["routed"] for w in pctl.pool()}[r2["route"]] == 1
    # 100 %: to the 100 % worker; 10 %: to the 10 % worker
    assert pctl.call("set_quota", name="fwd-app2", quota_pct=100)["route"] == ready_at(pctl.pool(), 100)[0]["id"]
    assert pctl.call("set_quota", name="fwd-app2", quota_pct=10)["route"] == ready_at(pctl.pool(), 10)[0]["id"]


def test_set_quota_errors(pctl, sleeper):
    register(pctl, sleeper().pid, "errs")
    for args, code, msg in (
            (["nobody", "40"], 1, "no live app named 'nobody'"),
            (["errs", "50"], 1, "no worker at 50%"),
            (["errs", "0"], 2, "1..100"),
            (["errs", "101"], 2, "1..100")):
        r = colocate("set-quota", *args, "--runtime-dir", pctl.rundir)
        assert r.returncode == code and msg in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1
    bad = pctl.call("set_quota", name="errs", quota_pct=0)
    assert bad["type"] == "error" and bad["in_reply_to"] == "set_quota"


def test_killed_worker_unroutes_its_apps(pctl, pcb, sleeper):
    assert pctl.wait_pool(lambda ws: len(ready_at(ws, 40)) == 2)
    p = sleeper()
    slot = register(pctl, p.pid, "victim-app", quota_pct=60)["slot"]
    wid = pctl.call("set_quota", name="victim-app", quota_pct=40)["route"]
    assert pcb.control(slot)["route"] == wid
    epoch = pcb.control(slot)["route_epoch"]
    w = next(w for w in pctl.pool() if w["id"] == wid)
    os.kill(w["pid"], signal.SIGKILL)
    assert wait_for(lambda: pcb.control(slot)["route"] == 0, 5), "app still routed to the dead worker"
    k = pcb.control(slot)
    assert k["quota_pct"] == 60 and k["route_epoch"] > epoch         # back to local at its request
    workers = pctl.wait_pool(lambda ws: len(ready_at(ws, 40)) == 2 and ws)
    ids = {x["id"] for x in workers}
    assert wid not in ids and max(ids) > wid                           # replaced under a new id
    log = (pctl.rundir / "serve.log").read_text()
    assert f"worker {wid} died; route local" in log and f"worker {wid} (quota 40%, ready) was killed by SIGKILL" in log


def test_always_dying_worker_ends_failed(pctl):
    ws = pctl.wait_pool(lambda ws: [w for w in ws if w["quota_pct"] == 30 and w["state"] == "failed"], 15)
    assert ws, pctl.pool()
    failed = ws[0]
    assert failed["id"] <= 20                                           # a few tries, no storm
    assert "not restarting it" in (pctl.rundir / "serve.log").read_text()
    r = pctl.call("set_quota", name="nobody-needed", quota_pct=30)
    assert r["type"] == "error"


def test_serve_pool_none(rundir, sleeper):
    ctl = PoolController(rundir, "--pool", "none")
    try:
        assert ctl.pool() == [] and ctl.call("pool")["spec"] == "none"
        r = colocate("pool", "--json", "--runtime-dir", rundir)
        assert r.returncode == 0 and json.loads(r.stdout) == []
        assert "disabled" in colocate("pool", "--runtime-dir", rundir).stderr
        register(ctl, sleeper().pid, "solo")
        bad = ctl.call("set_quota", name="solo", quota_pct=40)
        assert bad["type"] == "error" and "no process pool" in bad["error"]
        assert ctl.call("set_quota", name="solo", quota_pct=100)["route"] == 0
        assert not list(rundir.glob("worker-*"))
    finally:
        ctl.stop()


def test_explicit_pool_with_missing_worker_fails(rundir):
    env = clean_env(COLOCATE_WORKER_CMD=str(rundir / "nope"))
    r = colocate("serve", "--runtime-dir", rundir, "--device", "sim", "--pool", "10:1", env=env)
    assert r.returncode == 1 and "cannot start the process pool" in r.stderr and "not built" in r.stderr
    assert "Traceback" not in r.stderr and not (rundir / "ctl.sock").exists()


# --- policies decide routes through the same rule ---------------------------------

@register_policy("test-pool-40")
class Forty(Policy):
    def on_register(self, app):
        return [Decision(app.slot, 40 if app.name != "odd" else 30, None)]


def test_policy_route_none_picks_a_worker(rundir, sleeper):
    from controlplane.daemon import Controller as Ctl
    from shim.rundir import ensure
    pool = Pool(rundir, "sim", parse_spec("40:2"), cmd=FAKE, env=clean_env())
    ctl = Ctl(ensure(rundir), make_policy("test-pool-40"), "sim", pool=pool)
    try:
        pool.start()
        assert pool.wait_ready(10)

        def reg(name):
            return ctl.handle([b"", json.dumps({"v": 1, "type": "register", "pid": sleeper().pid,
                                                "name": name, "class": "batch"}).encode()])
        a, b, odd = reg("a"), reg("b"), reg("odd")
        assert {a["route"], b["route"]} == {1, 2} and a["quota_pct"] == 40
        assert (odd["route"], odd["quota_pct"]) == (0, 30)      # no 30 % worker: local, with a warning
        ctl.apply([Decision(a["slot"], 40, None)])               # sticky
        assert ctl.apps[a["slot"]].route == a["route"]
        ctl.apply([Decision(a["slot"], 40, 99)])                 # not a worker of this pool: local
        assert ctl.apps[a["slot"]].route == 0
    finally:
        ctl.close()                                              # stops the pool too
    assert all(w.state == "dead" for w in pool.workers())


# --- MPS (device cuda): a fake nvidia-cuda-mps-control on PATH --------------------

FAKE_MPS = r"""#!/bin/sh
# records each call; "-d" starts a "daemon" (creates the control pipe), stdin
# commands get_server_list / quit act on it
echo "args=$* pipe=$CUDA_MPS_PIPE_DIRECTORY log=$CUDA_MPS_LOG_DIRECTORY" >> "$FAKE_MPS_RECORD"
if [ "$1" = "-d" ]; then
    [ -n "$FAKE_MPS_FAIL" ] && { echo "An instance of this daemon is already running" >&2; exit 1; }
    mkfifo "$CUDA_MPS_PIPE_DIRECTORY/control" && exit 0
fi
read cmd
echo "stdin=$cmd" >> "$FAKE_MPS_RECORD"
[ -p "$CUDA_MPS_PIPE_DIRECTORY/control" ] || { echo "Cannot find MPS control daemon process"; exit 1; }
case "$cmd" in
    quit) rm -f "$CUDA_MPS_PIPE_DIRECTORY/control" ;;
    get_server_list) ;;
esac
exit 0
"""


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "nvidia-cuda-mps-control"
    exe.write_text(FAKE_MPS)
    exe.chmod(0o755)
    record = tmp_path / "record"
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_RECORD", str(record))
    for var in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "FAKE_MPS_FAIL"):
        monkeypatch.delenv(var, raising=False)
    return exe, record


def test_mps_missing_binary(rundir, monkeypatch):
    monkeypatch.setenv("PATH", str(rundir))                  # nothing there
    with pytest.raises(MpsError, match="nvidia-cuda-mps-control not found on PATH.*--pool none"):
        Mps(rundir).ensure()
    p = Pool(rundir, "cuda", parse_spec("10:1"), cmd=FAKE)
    with pytest.raises(MpsError, match="not found"):
        p.start()


def test_mps_commands(rundir, fake_mps):
    exe, record = fake_mps
    m = Mps(rundir, env=dict(os.environ))
    assert m.start_cmd() == [str(exe), "-d"] and m.control_cmd() == [str(exe)]
    assert m.env() == {"CUDA_MPS_PIPE_DIRECTORY": str(rundir / "mps" / "pipe"),
                       "CUDA_MPS_LOG_DIRECTORY": str(rundir / "mps" / "log")}
    assert "started the MPS control daemon" in m.ensure() and m.started
    assert (rundir / "mps" / "pipe" / "control").exists()
    calls = record.read_text()
    assert f"args=-d pipe={rundir}/mps/pipe log={rundir}/mps/log" in calls and "stdin=get_server_list" in calls
    # a second user of the same dirs finds it running and leaves it alone
    other = Mps(rundir, env=dict(os.environ))
    assert "using the running MPS control daemon" in other.ensure() and not other.started
    other.stop()
    assert (rundir / "mps" / "pipe" / "control").exists()
    m.stop()
    assert "stdin=quit" in record.read_text() and not (rundir / "mps" / "pipe" / "control").exists()


def test_mps_start_failure_is_clear(rundir, fake_mps, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    with pytest.raises(MpsError, match="failed with code 1: An instance of this daemon is already running"):
        Mps(rundir).ensure()


def test_pool_on_cuda_starts_and_stops_mps(rundir, fake_mps):
    _, record = fake_mps
    p = Pool(rundir, "cuda", parse_spec("20:1"), cmd=FAKE, env=clean_env(PATH=os.environ["PATH"],
                                                                     FAKE_MPS_RECORD=str(record)))
    try:
        p.start()
        assert p.wait_ready(10)
        env = json.loads((rundir / "worker-1.env").read_text())
        assert (env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"]) == (
            str(rundir / "mps" / "pipe"), "20")
        assert "SIMGPU_DIR" not in env
    finally:
        p.stop()
    assert "stdin=quit" in record.read_text()


# --- the real worker, when it is built ---------------------------------------------

@pytest.mark.skipif(not pool_mod.WORKER_EXE.exists(),
                    reason=f"{pool_mod.WORKER_EXE} is not built yet (processpool/worker/)")
def test_real_worker_smoke(rundir):
    p = Pool(rundir, "sim", parse_spec("25:1,100:1"), cmd=[str(pool_mod.WORKER_EXE)], env=clean_env())
    try:
        p.start()
        assert p.wait_ready(15), [(w.id, w.state, w.exit_reason) for w in p.workers()] + [
            (rundir / f"worker-{i}.log").read_text(errors="replace") for i in (1, 2)]
        rows = p.stats(timeout=2.0)
        assert [(r["id"], r["quota_pct"], r["state"]) for r in rows] == [(1, 25, "ready"), (2, 100, "ready")]
        assert all(isinstance(r["forwarded"], int) and isinstance(r["apps"], int) for r in rows)
        assert (rundir / "worker-1.pid").read_text().strip() == str(rows[0]["pid"])
    finally:
        p.stop()
    assert all(w.proc.returncode == 0 for w in p.workers()), [w.proc.returncode for w in p.workers()]
