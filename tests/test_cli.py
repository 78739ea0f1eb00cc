"""The `colocate` command line: runtime dir, run, quotas, ping, schema, demo."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from conftest import PY, ROOT, clean_env, colocate, wait_for

from controlplane.cli import QUOTA_KEYS
from shim import launcher, paths
from shim import rundir as rundir_mod
from shim.ctlblock import ControlBlock
from shim.launcher import AppSpec, UsageError


def env_of(out: str) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in out.splitlines() if "=" in ln)


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in r.stderr, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    return lines[0]


# --- runtime dir --------------------------------------------------------------

def test_rundir_created_private(rundir):
    target = rundir / "a" / "b"
    rd = rundir_mod.ensure(target)
    assert rd.path == target and stat.S_IMODE(target.stat().st_mode) == 0o700
    assert rd.endpoint == f"ipc://{target}/ctl.sock"


def test_rundir_default(monkeypatch):
    monkeypatch.setenv("COLOCATE_RUNTIME_DIR", "/x/y")
    assert rundir_mod.default() == Path("/x/y")
    monkeypatch.delenv("COLOCATE_RUNTIME_DIR")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/7")
    assert rundir_mod.default() == Path("/run/user/7/colocate")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert rundir_mod.default() == Path(f"/tmp/colocate-{os.getuid()}")


def test_rundir_refuses_world_writable(rundir):
    os.chmod(rundir, 0o777)
    with pytest.raises(rundir_mod.RuntimeDirError, match="writable by others"):
        rundir_mod.ensure(rundir)
    for cmd in (["ping"], ["serve"], ["quotas"], ["run"]):
        r = colocate(*cmd, "--runtime-dir", rundir, *(["--", "true"] if cmd == ["run"] else []))
        assert r.returncode == 1 and "writable by others" in one_line_error(r), (cmd, r.stderr)


def test_rundir_refuses_other_owner(rundir, monkeypatch):
    monkeypatch.setattr(os, "getuid", lambda: os.stat(rundir).st_uid + 1)
    with pytest.raises(rundir_mod.RuntimeDirError, match="owned by uid"):
        rundir_mod.ensure(rundir)


def test_rundir_from_env(rundir):
    r = colocate("run", "--device", "sim", "--", "env", env=clean_env(COLOCATE_RUNTIME_DIR=str(rundir)))
    assert r.returncode == 0 and env_of(r.stdout)["COLOCATE_RUNTIME_DIR"] == str(rundir)


# --- run ----------------------------------------------------------------------

@pytest.mark.parametrize("script,code", [("exit 0", 0), ("exit 3", 3), ("kill -9 $$", 137), ("kill -TERM $$", 143)])
def test_run_exit_codes(rundir, script, code):
    assert colocate("run", "--runtime-dir", rundir, "--", "sh", "-c", script).returncode == code


def test_run_without_double_dash(rundir):
    r = colocate("run", "--runtime-dir", rundir, "sh", "-c", "exit 5")
    assert r.returncode == 5


def test_run_forwards_sigterm(rundir):
    p = subprocess.Popen([PY, "-m", "controlplane.cli", "run", "--runtime-dir", str(rundir), "--",
                          "sh", "-c", "echo ready; exec sleep 30"], cwd=ROOT, env=clean_env(),
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 128 + signal.SIGTERM
    finally:
        p.kill()
        p.wait()


def test_run_keeps_a_signal_that_comes_before_the_child_is_known(rundir, monkeypatch):
    """The child may run (and print) before Popen returns in the parent; a
    SIGTERM in that window must still reach it (CI once lost one here)."""
    real_spawn = launcher.spawn

    def spawn_then_signalled(spec, rd, device, **popen):
        proc = real_spawn(spec, rd, device, **popen)
        os.kill(os.getpid(), signal.SIGTERM)   # the relay runs here, before run() knows proc
        return proc
    monkeypatch.setattr(launcher, "spawn", spawn_then_signalled)
    spec = AppSpec(["sleep", "20"])
    t0 = time.monotonic()
    assert launcher.run(spec, rundir_mod.ensure(rundir), "simgpu") == 128 + signal.SIGTERM
    assert time.monotonic() - t0 < 10


BAD_ARGS = {
    "unknown class": (["--class", "gold"], "unknown class"),
    "qos-ms with batch": (["--class", "batch", "--qos-ms", "10"], "--class qos only"),
    "qos-ms zero": (["--class", "qos", "--qos-ms", "0"], "must be > 0"),
    "qos-ms negative": (["--class", "qos", "--qos-ms", "-5"], "must be > 0"),
    "quota zero": (["--quota", "0"], "1..100"),
    "quota 101": (["--quota", "101"], "1..100"),
}


@pytest.mark.parametrize("args,msg", BAD_ARGS.values(), ids=BAD_ARGS.keys())
def test_run_refuses_bad_arguments(rundir, args, msg):
    r = colocate("run", "--runtime-dir", rundir, *args, "--", "true")
    assert r.returncode == 2 and msg in one_line_error(r)


def test_run_refuses_missing_command(rundir):
    r = colocate("run", "--runtime-dir", rundir)
    assert r.returncode == 2 and "missing command" in one_line_error(r)


def test_run_command_not_found(rundir):
    r = colocate("run", "--runtime-dir", rundir, "--", "no-such-program-xyz")
    assert r.returncode == 127 and "no-such-program-xyz: command not found" in one_line_error(r)
    r = colocate("run", "--runtime-dir", rundir, "--", str(rundir))
    assert r.returncode == 126 and "not executable" in one_line_error(r)


def test_run_refuses_unbuilt_shim(monkeypatch, tmp_path):
    monkeypatch.setattr(paths, "LIBCOLOCATE", tmp_path / "libcolocate.so")
    with pytest.raises(UsageError, match="run `make build`") as e:
        launcher.check(AppSpec(["true"]))
    assert e.value.code == 2


def test_run_environment_sim(rundir):
    env = clean_env(LD_PRELOAD="/opt/other.so", LD_LIBRARY_PATH="/opt/lib")
    r = colocate("run", "--runtime-dir", rundir, "--name", "svc", "--class", "qos", "--qos-ms", "50",
                 "--quota", "40", "--device", "sim", "--", "env", env=env)
    assert r.returncode == 0, r.stderr
    e = env_of(r.stdout)
    assert e["LD_PRELOAD"] == f"{paths.LIBCOLOCATE}:/opt/other.so"
    assert e["LD_LIBRARY_PATH"] == f"{paths.SIMGPU_DIR}:/opt/lib"
    assert (e["COLOCATE_RUNTIME_DIR"], e["COLOCATE_APP_NAME"], e["COLOCATE_APP_CLASS"]) == (str(rundir), "svc", "qos")
    assert (e["COLOCATE_QOS_MS"], e["COLOCATE_QUOTA_PCT"], e["COLOCATE_DEVICE"]) == ("50", "40", "sim")
    assert e["SIMGPU_DIR"] == str(rundir / "simgpu")
    assert e["SIMGPU_REPORT"] == str(rundir / "simgpu" / "report.jsonl")
    assert stat.S_IMODE((rundir / "simgpu").stat().st_mode) == 0o700
    assert Path(e["COLOCATE_LIBZMQ"]).is_file() and "libzmq" in e["COLOCATE_LIBZMQ"]


def test_run_nested_does_not_stack(rundir):
    env = clean_env(LD_PRELOAD=f"{paths.LIBCOLOCATE} /opt/a.so", LD_LIBRARY_PATH=f"/x:{paths.SIMGPU_DIR}")
    e = env_of(colocate("run", "--runtime-dir", rundir, "--device", "sim", "--", "env", env=env).stdout)
    assert e["LD_PRELOAD"] == f"{paths.LIBCOLOCATE}:/opt/a.so"
    assert e["LD_LIBRARY_PATH"] == f"{paths.SIMGPU_DIR}:/x"


def test_run_environment_cuda_defaults(rundir):
    r = colocate("run", "--runtime-dir", rundir, "--device", "cuda", "--", "/usr/bin/env",
                 env=clean_env(SIMGPU_DIR="/mine"))
    assert r.returncode == 0, r.stderr
    e = env_of(r.stdout)
    assert e["LD_PRELOAD"] == str(paths.LIBCOLOCATE)
    assert (e["COLOCATE_APP_NAME"], e["COLOCATE_APP_CLASS"], e["COLOCATE_DEVICE"]) == ("env", "batch", "cuda")
    assert "COLOCATE_QOS_MS" not in e and "COLOCATE_QUOTA_PCT" not in e
    assert str(paths.SIMGPU_DIR) not in e.get("LD_LIBRARY_PATH", "")
    assert e["SIMGPU_DIR"] == "/mine"


def test_run_device_auto_follows_controller(controller):
    r = colocate("run", "--runtime-dir", controller.rundir, "--", "env")
    assert env_of(r.stdout)["COLOCATE_DEVICE"] == "sim"         # the fixture's controller runs sim


def test_device_auto(monkeypatch):
    monkeypatch.setattr(launcher, "cuda_usable", lambda: True)
    assert launcher.detect_device("auto") == "cuda" and launcher.detect_device("sim") == "sim"
    monkeypatch.setattr(launcher, "cuda_usable", lambda: False)
    assert launcher.detect_device("auto") == "sim" and launcher.detect_device("cuda") == "cuda"
    with pytest.raises(UsageError):
        launcher.detect_device("tpu")


# --- quotas / ping / schema ---------------------------------------------------

def test_quotas_json_keys(controller, sleeper):
    p = sleeper()
    reply = controller.call("register", pid=p.pid, name="qjson", **{"class": "qos"}, qos_ms=20, quota_pct=60)
    with ControlBlock(controller.rundir / "ctlblock") as cb:
        cb.write_counters(reply["slot"], launches=9, h2d_bytes=5 * 2**20)
    r = colocate("quotas", "--json", "--runtime-dir", controller.rundir)
    assert r.returncode == 0, r.stderr
    rows = {a["pid"]: a for a in json.loads(r.stdout)}
    assert all(set(a) == set(QUOTA_KEYS) for a in rows.values())
    assert {"name", "pid", "class", "quota_pct", "route", "launches", "forwarded", "h2d_bytes",
            "d2h_bytes", "qos_ms"} <= set(QUOTA_KEYS) <= {"name", "pid", "class", "quota_pct", "route", "launches",
                                                          "forwarded", "h2d_bytes", "d2h_bytes", "qos_ms",
                                                          "state", "kernels", "queries", "held",
                                                          "held_ms", "throughput", "feed", "end",
                                                          "partition"}
    a = rows[p.pid]
    assert (a["name"], a["class"], a["quota_pct"], a["route"], a["launches"], a["h2d_bytes"], a["qos_ms"]) == \
        ("qjson", "qos", 60, 0, 9, 5 * 2**20, 20)

    table = colocate("quotas", "--runtime-dir", controller.rundir)
    assert table.returncode == 0 and "qjson" in table.stdout and "5.0 MiB" in table.stdout and "20 ms" in table.stdout

    p.kill()
    wait_for(lambda: p.pid not in {a["pid"] for a in controller.call("list", all=False)["apps"]})
    live = json.loads(colocate("quotas", "--json", "--runtime-dir", controller.rundir).stdout)
    everything = json.loads(colocate("quotas", "--json", "--all", "--runtime-dir", controller.rundir).stdout)
    assert p.pid not in {a["pid"] for a in live}
    assert any(a["pid"] == p.pid and a["state"] == "exited" and a["launches"] == 9 for a in everything)


def test_quotas_watch_refreshes(controller):
    # a suite started in the background of a non-interactive shell inherits
    # SIGINT ignored, and so would the command: give it the default back
    p = subprocess.Popen([PY, "-m", "controlplane.cli", "quotas", "--watch", "--interval", "0.1",
                          "--runtime-dir", str(controller.rundir)], cwd=ROOT, env=clean_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(1.5)
        p.send_signal(signal.SIGINT)
        stdout, stderr = p.communicate(timeout=10)
        assert p.returncode == 0, stderr
        assert stdout.count("live app(s)") >= 2            # refreshed, at least once
    finally:
        p.kill()
        p.wait()


def test_no_controller_is_a_clear_error(rundir):
    for cmd in (["quotas"], ["quotas", "--json"], ["ping"]):
        r = colocate(*cmd, "--runtime-dir", rundir, timeout=10)
        assert r.returncode == 1 and "no controller" in one_line_error(r)
    (rundir / "ctl.sock").touch()                        # a socket file nobody answers on
    r = colocate("quotas", "--runtime-dir", rundir, timeout=10)
    assert r.returncode == 1 and "no controller answers" in one_line_error(r)


def test_ping_command(controller):
    r = colocate("ping", "--runtime-dir", controller.rundir)
    assert r.returncode == 0 and f"controller {controller.proc.pid}" in r.stdout and "policy static" in r.stdout


def test_schema_command():
    r = colocate("schema")
    assert r.returncode == 0 and "register" in r.stdout and "quota_pct" in r.stdout
    j = json.loads(colocate("schema", "--json").stdout)
    assert j["version"] == 1 and j["requests"]["register"]["reply"] == "registered"
    assert j["requests"]["register"]["fields"]["pid"]["required"] is True
    assert set(j["requests"]) >= {"register", "exit", "ping", "list", "stop"}


@pytest.mark.parametrize("cmd", ["", "serve", "stop", "run", "quotas", "ping", "schema", "demo"])
def test_help(cmd):
    r = colocate(*([cmd] if cmd else []), "--help")
    assert r.returncode == 0 and "Usage" in r.stdout


# --- demo with stand-in programs --------------------------------------------------

FAKE_APP = textwrap.dedent("""\
    import json, os, sys, zmq
    from shim.ctlblock import ControlBlock
    rd, pid = os.environ["COLOCATE_RUNTIME_DIR"], os.getpid()
    s = zmq.Context().socket(zmq.DEALER); s.connect(f"ipc://{rd}/ctl.sock")
    def call(**m):
        s.send_multipart([b"", json.dumps({"v": 1, **m}).encode()])
        assert s.poll(3000)
        return json.loads(s.recv_multipart()[1])
    r = call(type="register", pid=pid, name=os.environ["COLOCATE_APP_NAME"],
             **{"class": os.environ["COLOCATE_APP_CLASS"]}, device=os.environ["COLOCATE_DEVICE"])
    with ControlBlock(f"{rd}/ctlblock") as cb:
        cb.write_counters(r["slot"], launches=len(sys.argv), h2d_bytes=4096)
    call(type="exit", pid=pid, slot=r["slot"], kernels=[{"name": "k", "launches": 1, "twin": False}])
    print("PASS" if os.environ.get("FAKE_FAIL") != os.environ["COLOCATE_APP_NAME"] else "FAIL")
    """)


@pytest.fixture
def fake_bench(tmp_path):
    (tmp_path / "fake_app.py").write_text(FAKE_APP)
    for name in ("hotspot", "vecadd"):
        f = tmp_path / name
        # the stand-in is Python: keep the shim out of that interpreter
        f.write_text(f'#!/bin/sh\nunset LD_PRELOAD\ncd {ROOT}\nexec {PY} {tmp_path}/fake_app.py "$@"\n')
        f.chmod(0o755)
    return tmp_path


def test_demo_with_stand_ins(fake_bench):
    r = colocate("demo", "--device", "cuda", env=clean_env(COLOCATE_BENCH_BIN=str(fake_bench)), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "hotspot" in r.stdout and "vecadd" in r.stdout and r.stdout.count("PASS") == 2
    assert " 5 " in r.stdout and " 3 " in r.stdout     # launches = len(argv) from the exit records


def test_demo_reports_failure(fake_bench):
    r = colocate("demo", "--device", "cuda", env=clean_env(COLOCATE_BENCH_BIN=str(fake_bench), FAKE_FAIL="vecadd"),
                 timeout=60)
    assert r.returncode == 1 and "FAIL" in r.stdout, r.stdout + r.stderr


def test_demo_needs_build(tmp_path):
    r = colocate("demo", "--device", "cuda", env=clean_env(COLOCATE_BENCH_BIN=str(tmp_path)))
    assert r.returncode == 1 and "make build" in one_line_error(r)


def test_demo_on_simgpu_compares_claius_with_two_baselines_live(tmp_path):
    """`make demo`'s main job: the live co-location under claius, mps-priority
    and baymax, its table and figure (about a minute)."""
    r = colocate("demo", "--device", "sim", env=clean_env(COLOCATE_DEMO_OUT=str(tmp_path)), timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.split()[:1] in (["claius"], ["mps-priority"],
                                                                           ["baymax"])]
    assert [x[0] for x in rows] == ["claius", "mps-priority", "baymax"], r.stdout
    assert all(x[3].count("/") == 1 and int(x[3].split("/")[1]) > 20 for x in rows), r.stdout   # QoS viol. k/n
    j = json.loads((tmp_path / "demo.json").read_text())
    assert [x["policy"] for x in j["results"]] == ["claius", "mps-priority", "baymax"]
    assert all(0 < x["mean_norm"] < 1.5 and x["p99_ms"] > 0 for x in j["results"])
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"
