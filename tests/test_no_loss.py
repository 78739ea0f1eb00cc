"""Nothing lost under load (issue 13): four busy apps beside a controller that
is stopped on purpose (SIGSTOP) while they run and exit, and one app
SIGKILLed meanwhile.  Every app's exit, counters and kernel table must be
recorded once the controller runs again, and the query counts must equal
the apps' own: the ledger (shim/ledger.h) carries what the dropped messages
did not.  The apps must also finish while the controller is stopped: a
stalled controller never stalls an app.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, Controller, clean_env, colocate, new_rundir, wait_for

BIN = ROOT / "bench" / "bin"
QUERIES = 20000
AFFINE = "_Z6affinePKfPfiff"
# (name, querydemo flags): two services that mark their queries, two whose
# queries the shim infers (QoS apps: inference runs where a policy reads it)
APPS = [("svc-api", []), ("svc-api-async", ["--async"]),
        ("svc-inf", ["--no-api"]), ("svc-inf-async", ["--no-api", "--async"])]

pytestmark = pytest.mark.skipif(not (BIN / "querydemo").exists() or not (BIN / "launchloop").exists(),
                                reason="bench programs not built (make progs)")


def start(ctl: Controller, name: str, cls: str, argv: list, simdir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "controlplane.cli", "run", "--runtime-dir", str(ctl.rundir),
                             "--device", "sim", "--name", name, "--class", cls, "--", *map(str, argv)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(SIMGPU_TIMESCALE="0", SIMGPU_DIR=str(simdir)))


def stats(out: str) -> dict[str, int]:
    m = re.search(r"^STATS (.*)$", out, re.M)
    assert m, out
    return {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


def live_names(ctl: Controller) -> set[str]:
    return {a["name"] for a in ctl.call("list")["apps"]}


def test_four_busy_apps_a_stalled_controller_and_a_sigkill(tmp_path):
    ctl = Controller(new_rundir())
    procs: dict[str, subprocess.Popen] = {}
    try:
        # the victim first: a long launch loop, SIGKILLed while the controller is stopped
        procs["victim"] = start(ctl, "victim", "batch", [BIN / "launchloop", "--launches", 10**9],
                                tmp_path)
        for name, flags in APPS:
            procs[name] = start(ctl, name, "qos", [BIN / "querydemo", "--queries", QUERIES, "--n", 64,
                                                   *flags], tmp_path)
        everyone = {"victim", *(n for n, _ in APPS)}
        assert wait_for(lambda: live_names(ctl) == everyone, timeout=30), live_names(ctl)
        victim_pid = next(a["pid"] for a in ctl.call("list")["apps"] if a["name"] == "victim")

        os.kill(ctl.proc.pid, signal.SIGSTOP)
        try:
            stalled_at = time.monotonic()
            # the services finish while nobody reads their messages
            for name, _ in APPS:
                procs[name].wait(timeout=120)
            stalled_for = time.monotonic() - stalled_at
            os.kill(victim_pid, signal.SIGKILL)            # the app itself, not `colocate run`
        finally:
            os.kill(ctl.proc.pid, signal.SIGCONT)
        outs = {n: procs[n].communicate(timeout=30) for n, _ in APPS}
        procs["victim"].communicate(timeout=30)

        def history():
            recs = [a for a in ctl.call("list", all=True)["apps"] if a["state"] == "exited"]
            return recs if len(recs) == len(everyone) else None
        recs = wait_for(history, timeout=15)
        assert recs, ctl.call("list", all=True)
        by = {r["name"]: r for r in recs}

        dropped = 0
        for name, flags in APPS:
            out, err = outs[name]
            assert procs[name].returncode == 0 and "PASS" in out, out + err
            s, r = stats(out), by[name]
            assert r["end"] == "exited", r
            assert (r["launches"], r["h2d_bytes"], r["d2h_bytes"]) == (s["launches"], s["h2d_bytes"],
                                                                       s["d2h_bytes"])
            assert r["kernels"] == [{"name": AFFINE, "launches": s["launches"], "twin": True}], r
            q = r["queries"]
            assert q["rule"] == ("inferred" if "--no-api" in flags else "api"), q
            assert (q["begun"], q["done"]) == (QUERIES, QUERIES), q
            dropped += QUERIES - q["messages"]
        # the test did stress: messages were lost, and the ledger made up for them
        assert dropped > 0, "no query message was dropped: the controller was not stalled enough"

        v = by["victim"]
        assert v["end"] == "killed", v
        assert len(v["kernels"]) == 1 and v["kernels"][0]["launches"] == v["launches"] > 0, v
        # what an admin sees: the killed app's kernel table
        table = colocate("kernels", "victim", "--json", "--runtime-dir", ctl.rundir)
        assert table.returncode == 0 and "launchloop_tick" in table.stdout, \
            table.stdout + table.stderr
        print(f"stalled {stalled_for:.1f} s; {dropped} query messages dropped and made up by the ledgers")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        ctl.stop()
        shutil.rmtree(ctl.rundir, ignore_errors=True)
