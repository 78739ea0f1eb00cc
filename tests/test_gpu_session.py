"""bench/gpu_session.sh, the one-command GPU session, on simgpu: its vmmapp
step is the whole path a GPU user takes - `colocate serve` with a pool,
`colocate run` with COLOCATE_MEM=vmm, `colocate set-quota` to a worker - and
must give the local run's result with the kernels run by the worker."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench" / "gpu_session.sh"


def session(tmp_path: Path, *steps: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEV": "sim", "SECS": "3", "QUERIES": "40", "OUT": str(tmp_path)}
    env = {k: v for k, v in env.items() if not k.startswith(("COLOCATE_", "SIMGPU_"))}
    return subprocess.run(["bash", str(SCRIPT), *steps], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=240)


def test_vmm_app_forwarded_through_the_controller(tmp_path):
    r = session(tmp_path, "vmmapp")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^vmmapp rc=0 ", (tmp_path / "session.log").read_text(), re.M)
    log = (tmp_path / "vmmapp.log").read_text()
    local = re.search(r"^local: +(CHECK \S+)$", log, re.M)
    fwd = re.search(r"^forwarded: +(CHECK \S+)$", log, re.M)
    assert local and fwd and local.group(1) == fwd.group(1), log
    assert "COLOCATE_MEM=vmm: device memory shared from slot" in log
    assert re.search(r"^worker ran [1-9][0-9]* launches$", log, re.M), log
    workers = json.loads(log[log.index("[\n"):log.index("\n]\n") + 2])
    assert workers[0]["quota_pct"] == 50 and workers[0]["forwarded"] > 0, workers


def test_camelot_step_compares_handles_with_copies(tmp_path):
    """The camelot step: one pipeline with handles and with --copy (same
    checksums, hand-offs only in the first), then Fig. 11's benchmark, then
    Table I's stages and a service live."""
    r = session(tmp_path, "camelot")
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"^camelot rc=0 ", (tmp_path / "session.log").read_text(), re.M)
    log = (tmp_path / "camelot.log").read_text()
    assert re.search(r"^checksums equal over 40 queries; handle run: [1-9][0-9]* hand-offs, 0 copies", log, re.M), log
    h, c = (json.loads((tmp_path / f"pipeline_{m}.json").read_text()) for m in ("handle", "copy"))
    assert h["digest"] == c["digest"] and c["handoffs"] == 0 < c["copies"]
    assert json.loads((tmp_path / "handoff" / "rows.json").read_text())["rows"]
    # Table I's stages against ref.c, and a service live against one query at a time
    chk = json.loads((tmp_path / "tonic_check.json").read_text().strip().splitlines()[-1])
    assert len(chk) == 8 and all(v["bad"] == 0 for v in chk.values()), chk
    assert "text-to-img: handles vs copy equal, vs one query at a time equal over 40 queries" in log, log
    plan = json.loads((tmp_path / "plan.json").read_text())
    run = json.loads((tmp_path / "plan_run.json").read_text())
    assert plan["predicted_qps"] >= 20 and run["queries"] == 40
    assert [s["instances"] for s in run["stages"]] == [s["instances"] for s in plan["stages"]]


def test_unknown_step_is_refused(tmp_path):
    r = session(tmp_path, "nonsense")
    assert r.returncode == 2 and "unknown step nonsense" in r.stdout
