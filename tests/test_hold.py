"""The hold route: a Decision with hold=True writes CB_ROUTE_HOLD, and the
app's next kernel launch waits (copies and syncs do not) until a later
route releases it; the controller gone or COLOCATE_HOLD_MAX_MS ends a hold
too, and the app runs locally."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import PY, ROOT, Client, wait_for
from test_feed import BIN, app_env, launches

from controlplane.policies.base import AppInfo, Decision, Policy, register_policy

pytestmark = pytest.mark.skipif(not (BIN / "launchloop").exists(), reason="bench programs not built")


@register_policy("test-hold")
class Hold(Policy):
    """Holds every app at registration; releases them (local, 30 %) once the
    file named by the option `release` exists."""

    def __init__(self, **opts):
        super().__init__(**opts)
        self.held: dict[int, AppInfo] = {}

    def on_register(self, app: AppInfo) -> list[Decision]:
        self.held[app.slot] = app
        return [Decision(app.slot, 30, 0, hold=True)]

    def on_exit(self, app: AppInfo) -> list[Decision]:
        self.held.pop(app.slot, None)
        return []

    def on_tick(self, now_s: float) -> list[Decision]:
        if self.held and os.path.exists(self.opts["release"]):
            out = [Decision(s, 30, 0) for s in self.held]
            self.held.clear()
            return out
        return []


SERVE = """
import sys
sys.path.insert(0, {tests!r})
import test_hold  # registers the policy
from controlplane.daemon import serve
from shim.rundir import ensure
serve(ensure({rd!r}), {policy!r}, "sim", pool_spec="none")
"""


class Served:
    """`colocate serve` with the test policy, in a process of its own."""

    def __init__(self, rundir: Path, release: Path):
        code = SERVE.format(tests=str(ROOT / "tests"), rd=str(rundir), policy=f"test-hold,release={release}")
        self.out = open(rundir / "serve.out", "wb")
        self.proc = subprocess.Popen([PY, "-c", code], cwd=ROOT, stdout=self.out, stderr=subprocess.STDOUT)
        self.rundir = rundir
        assert wait_for(lambda: (rundir / "ctl.sock").exists(), timeout=15), self.log()

    def log(self) -> str:
        return (self.rundir / "serve.out").read_text(errors="replace")

    def apps(self) -> list[dict]:
        c = Client(self.rundir)
        try:
            return c.call("list", all=True)["apps"]
        finally:
            c.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.out.close()


def start_app(rundir: Path, tmp: Path, n: int, **extra: str) -> subprocess.Popen:
    env = app_env(rundir, tmp, COLOCATE_APP_NAME="loop", **extra)
    return subprocess.Popen([str(BIN / "launchloop"), "--launches", str(n), "--warmup", "0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def cpu_ticks(pid: int) -> int:
    f = Path(f"/proc/{pid}/stat").read_text()
    rest = f[f.rfind(")") + 2:].split()
    return int(rest[11]) + int(rest[12])


def live(s: Served) -> dict | None:
    return next((a for a in s.apps() if a["name"] == "loop" and a["state"] == "live"), None)


def test_held_app_makes_no_launches_until_released(rundir, tmp_path):
    release = tmp_path / "release"
    s = Served(rundir, release)
    app = None
    try:
        app = start_app(rundir, tmp_path, 500)
        rec = wait_for(lambda: live(s), timeout=10)
        assert rec is not None and rec["held"] is True and rec["quota_pct"] == 30, s.apps()
        t0 = cpu_ticks(app.pid)
        time.sleep(0.6)
        rec = live(s)
        assert app.poll() is None and rec["launches"] == 0 and rec["held"] is True
        assert rec["held_ms"] > 0                          # kept current while it lasts
        assert cpu_ticks(app.pid) - t0 <= 20               # waits sleeping, not spinning
        release.touch()
        out, err = app.communicate(timeout=30)
        assert app.returncode == 0 and "PASS" in out, out + err
        assert launches(out) == 500
        rec = wait_for(lambda: next((a for a in s.apps() if a["name"] == "loop"), None))
        assert rec["held"] is False and rec["launches"] == 500 and rec["held_ms"] >= 500
        assert "held for" not in err                       # released, not given up
    finally:
        if app is not None and app.poll() is None:
            app.kill()
        s.stop()


def test_killing_the_controller_while_held_lets_the_app_finish(rundir, tmp_path):
    s = Served(rundir, tmp_path / "never")
    app = None
    try:
        app = start_app(rundir, tmp_path, 300)
        assert wait_for(lambda: (live(s) or {}).get("held"), timeout=10), s.apps()
        time.sleep(0.2)
        assert app.poll() is None
        s.proc.send_signal(signal.SIGKILL)
        s.proc.wait(10)
        out, err = app.communicate(timeout=30)
        assert app.returncode == 0 and "PASS" in out, out + err
        assert launches(out) == 300
        assert "the controller is gone" in err, err
    finally:
        if app is not None and app.poll() is None:
            app.kill()
        s.stop()


def test_hold_max_ms_bounds_a_hold_with_a_log_line(rundir, tmp_path):
    s = Served(rundir, tmp_path / "never")
    app = None
    try:
        t0 = time.monotonic()
        app = start_app(rundir, tmp_path, 200, COLOCATE_HOLD_MAX_MS="400")
        out, err = app.communicate(timeout=30)
        waited = time.monotonic() - t0
        assert app.returncode == 0 and "PASS" in out, out + err
        assert launches(out) == 200 and waited >= 0.4
        assert err.count("COLOCATE_HOLD_MAX_MS") == 1, err   # said once
        rec = wait_for(lambda: next((a for a in s.apps() if a["name"] == "loop"), None))
        assert rec["held_ms"] >= 400 and rec["launches"] == 200
    finally:
        if app is not None and app.poll() is None:
            app.kill()
        s.stop()
