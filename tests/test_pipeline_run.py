"""`colocate pipeline run SPEC` (controlplane/pipeline.py, bench/camelot/stage_worker.py,
bench/camelot/stage.cu): Camelot's artifact stages live on simgpu, each instance
a process under the shim, outputs handed on by handle (§VI-B) or through the host
(--copy).  The results are checked against a NumPy model of the stages' kernels,
so a stage that computes or hands on the wrong bytes fails here."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from conftest import PY, ROOT, clean_env, colocate, ensure_simgpu, wait_until

from controlplane import pipeline as pl

sys.path.insert(0, str(ROOT / "bench"))
from camelot.stage_worker import aux_pattern, stage_work  # noqa: E402

SCALE = 0.01
SPEC = """
name = "t-p1-c2-m1"
qos_ms = 300
batch = 4

[[stage]]
kind = "p1"
instances = 1
quota = 20

[[stage]]
kind = "c2"
instances = 2
quota = 30

[[stage]]
kind = "m1"
instances = 1
quota = 20
"""
KINDS = ["p1", "c2", "m1"]


@pytest.fixture(scope="module")
def built() -> None:
    ensure_simgpu()
    libs = [pl.STAGE_LIB, pl.STAGE_TWINS]
    if not all(p.exists() for p in libs):
        r = subprocess.run(["make", "-s", *map(str, libs)], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, f"building the stage library failed:\n{r.stderr[-3000:]}"


@pytest.fixture(scope="module")
def place(built, tmp_path_factory):
    """A short runtime dir (socket paths), a private simulated device, the SPEC."""
    rd = Path(tempfile.mkdtemp(prefix="pl-", dir="/tmp"))
    dev = tempfile.mkdtemp(prefix="simgpu-pl-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    spec = tmp_path_factory.mktemp("spec") / "p1-c2-m1.toml"
    spec.write_text(SPEC)
    env = clean_env(COLOCATE_RUNTIME_DIR=str(rd), SIMGPU_DIR=dev, SIMGPU_TIMESCALE="0")
    yield rd, spec, env
    shutil.rmtree(rd, ignore_errors=True)
    shutil.rmtree(dev, ignore_errors=True)


def run_args(spec: Path, *extra: str, queries: int = 24, rate: float = 60) -> list[str]:
    return ["pipeline", "run", str(spec), "--device", "sim", "--scale", str(SCALE), "--queries", str(queries),
            "--rate", str(rate), *extra]


@pytest.fixture(scope="module")
def reports(place, tmp_path_factory) -> dict[str, dict]:
    """The same queries through the pipeline with handles and with --copy."""
    rd, spec, env = place
    out = {}
    for mode in ("handle", "copy"):
        f = tmp_path_factory.mktemp(mode) / "report.json"
        r = colocate(*run_args(spec, "--json", str(f), *(["--copy"] if mode == "copy" else [])), env=env,
                     timeout=90)
        assert r.returncode == 0, r.stderr
        out[mode] = json.loads(f.read_text())
        out[mode]["stdout"] = r.stdout
    return out


# --- a NumPy model of stage.cu's kernels (float32, rounded per operation) ---------

A, B, EIGHTH = np.float32(0.999), np.float32(0.0005), np.float32(0.125)


def _scan(x: np.ndarray, aux: np.ndarray, out_n: int) -> np.ndarray:
    j = np.arange(out_n)
    o = x[:, j % x.shape[1]] + aux[:, j % aux.shape[1]] * EIGHTH
    for i0 in range(out_n, aux.shape[1], out_n):
        n = min(out_n, aux.shape[1] - i0)
        o[:, :n] = o[:, :n] + aux[:, i0:i0 + n] * EIGHTH
    return o


def model_stage(kind: str, x: np.ndarray) -> np.ndarray:
    w = stage_work(kind, SCALE, x.shape[1])
    if kind[0] == "c":
        xi = x[:, np.arange(w.out_n) % x.shape[1]]
        v = xi.copy()
        for _ in range(w.iters):
            v = v * A + B
        return v + xi
    if kind[0] == "m":
        i = np.arange(w.ws_n)
        ws = x[:, i % x.shape[1]] * np.float32(0.5) + (i & 1023).astype(np.float32) * np.float32(1 / 1024)
        return _scan(x, ws, w.out_n)
    return _scan(x, np.tile(aux_pattern(w.aux_n), (x.shape[0], 1)), w.out_n)


def model_checksums(n: int) -> list[int]:
    in_n = stage_work(KINDS[0], SCALE, 1).out_n           # input_mb = out_mb = 0.5 MB for the artifacts
    x = np.stack([pl.query_input(q, in_n) for q in range(n)])
    for kind in KINDS:
        x = model_stage(kind, x).astype(np.float32)
    return [zlib.crc32(row.tobytes()) for row in x]


# --- results and hand-offs ------------------------------------------------------------


def test_handles_and_copies_give_the_same_right_results(reports):
    h, c = reports["handle"], reports["copy"]
    assert h["queries"] == c["queries"] == 24
    assert len(h["checksums"]) == 24
    assert h["checksums"] == c["checksums"]
    assert h["checksums"] == model_checksums(24)           # the bytes the kernels should produce
    assert len(set(h["checksums"])) == 24                  # every query its own result
    # the handle run handed every buffer between stages by handle; --copy by host copies
    batches = h["stages"][0]["batches"]
    assert h["handoffs"] == 2 * batches > 0 and h["copies"] == 0
    assert c["handoffs"] == 0 and c["copies"] == 2 * c["stages"][0]["batches"] > 0
    assert all(hop["handoffs"] == hop["buffers"] for hop in h["hops"])


def test_stats_are_present_and_sane(reports):
    for mode, rep in reports.items():
        e2e = rep["e2e_ms"]
        assert 0 < e2e["p50"] <= e2e["p99"] < 30_000, mode
        assert rep["throughput_qps"] > 0
        assert rep["mode"] == mode and rep["device"] == "sim" and rep["scale"] == SCALE
        sizes = []
        for st, kind in zip(rep["stages"], KINDS):
            assert st["kind"] == kind
            assert st["batches"] == rep["stages"][0]["batches"]     # a batch goes through every stage
            assert 1 <= st["mean_batch"] <= 4
            sizes.append(st["batches"] * st["mean_batch"])
            assert 0 < st["service_ms"]["p50"] <= st["service_ms"]["p99"]
            assert st["work_ms"] > 0 and st["in_ms"] >= 0 and st["out_ms"] >= 0
            assert st["wait_ms"]["p50"] >= 0
        assert sizes == pytest.approx([24] * 3)                     # every query once per stage
        for hop in rep["hops"]:
            assert hop["buffers"] == rep["stages"][0]["batches"]
            assert 0 < hop["ms"]["p50"] <= hop["ms"]["p99"]
            assert hop["bytes_mean"] >= 125_000 * 4                 # at least one query's 0.5 MB
        # the table: a row per stage, end to end, a row per hop
        for word in ("1 p1", "2 c2", "3 m1", "end to end", "p1 -> c2", "c2 -> m1"):
            assert word in rep["stdout"], (mode, word)
    # only the copies move the data through the host: the producer's D2H costs
    # more than an export of the same buffer
    prod = [reports[m]["hops"][0]["parts_ms_p50"]["producer"] for m in ("handle", "copy")]
    assert prod[0] < prod[1]


# --- bad SPECs ----------------------------------------------------------------------

BAD = {
    "unknown kind": ('kind = "c9"', "unknown kind 'c9'"),
    "zero instances": ("instances = 0", "instances must be >= 1"),
    "quota 0": ("quota = 0", "quota must be 1..100"),
    "quota 101": ("quota = 101", "quota must be 1..100"),
}


def _bad_spec(line: str) -> str:
    key = line.split("=")[0].strip()
    good = {"kind": 'kind = "c1"', "instances": "instances = 1", "quota": "quota = 10"}
    good[key] = line
    return 'name = "b"\nqos_ms = 100\nbatch = 2\n[[stage]]\n' + "\n".join(good.values()) + "\n"


@pytest.mark.parametrize("case", ["unknown kind", "quota 101"])
def test_a_bad_spec_exits_2_with_one_line(case, place, tmp_path):
    rd, _, env = place
    line, want = BAD[case]
    f = tmp_path / "bad.toml"
    f.write_text(_bad_spec(line))
    r = colocate("pipeline", "run", str(f), env=env)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and want in r.stderr and "Traceback" not in r.stderr
    assert not list(rd.glob("pipelines/*.json"))                # nothing started


@pytest.mark.parametrize("text, want", [
    (_bad_spec(BAD["zero instances"][0]), BAD["zero instances"][1]),
    (_bad_spec(BAD["quota 0"][0]), BAD["quota 0"][1]),
    ('name = "b"\nbatch = 2\n[[stage]]\nkind = "c1"\ninstances = 1\nquota = 5\n', "missing field 'qos_ms'"),
    ('name = "b"\nqos_ms = 100\nbatch = 2\n[[stage]]\nkind = "c1"\nquota = 5\n', "missing field 'instances'"),
    ('name = "b"\nqos_ms = 100\nbatch = 2\n', "missing field 'stage'"),
    ('name = "b"\nqos_ms = 100\nbatch = 2\nstage = []\n', "no [[stage]] tables"),
    ('name = "b"\nqos_ms = 100\nbatch = 0\n[[stage]]\nkind = "c1"\ninstances = 1\nquota = 5\n', "batch must be >= 1"),
    ('name = "b"\nqos_ms = 100\nbatch = 1\n[[stage]]\nkind = "c1"\ninstances = 1\nquota = 5\nqouta = 3\n',
     "unknown field(s) 'qouta'"),
    ('name = [', "not valid TOML"),
])
def test_spec_errors(text, want, tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(pl.SpecError) as e:
        pl.load_spec(f)
    assert want in str(e.value) and "\n" not in str(e.value) and e.value.code == 2


def test_a_good_spec_and_the_examples_parse():
    for f in sorted((ROOT / "bench" / "camelot" / "specs").glob("*.toml")):
        s = pl.load_spec(f)
        assert s.stages and all(1 <= st.quota <= 100 for st in s.stages), f
    s = pl.parse_spec(json.loads(json.dumps({"name": "x", "qos_ms": 50, "batch": 2, "stage": [
        {"kind": "p3", "instances": 3, "quota": 10, "devices": [0, 1]}]})))
    assert s.stages[0] == pl.StageSpec("p3", 3, 10, (0, 1))


# --- failures, Ctrl-C, `pipeline ls` ---------------------------------------------------

def start_runner(place, *extra: str, queries: int = 400) -> subprocess.Popen:
    rd, spec, env = place
    # a suite started in the background (a non-interactive shell's `cmd &`)
    # inherits SIGINT ignored, and so would the runner: give it the default back
    return subprocess.Popen([PY, "-m", "controlplane.cli", *run_args(spec, *extra, queries=queries, rate=20)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def ls_json(place) -> list[dict]:
    r = colocate("pipeline", "ls", "--json", env=place[2])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def state_of(place, runner: subprocess.Popen) -> dict | None:
    """The runner's state file once some queries are done."""
    for f in (place[0] / "pipelines").glob(f"*-{runner.pid}.json"):
        try:
            st = json.loads(f.read_text())
        except (OSError, ValueError):
            return None
        return st if st["queries_done"] >= 4 else None
    return None


def pids_of(state: dict) -> list[int]:
    return [i["pid"] for st in state["stages"] for i in st["instances"]]


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def finish(runner: subprocess.Popen, timeout: float = 30) -> tuple[int, str]:
    try:
        _, err = runner.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        runner.kill()
        runner.communicate()
        raise AssertionError("the runner hung") from None
    return runner.returncode, err


def test_a_killed_stage_fails_the_run_and_leaves_nothing_behind(place):
    runner = start_runner(place)
    try:
        state = wait_until(lambda: state_of(place, runner), 30, "the pipeline's first queries")
        victim = next(i for st in state["stages"] for i in st["instances"] if i["name"] == "c2.1")
        os.kill(victim["pid"], signal.SIGKILL)
        t = time.monotonic()
        rc, err = finish(runner)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert time.monotonic() - t < 15
    assert rc == 1
    lines = [ln for ln in err.splitlines() if ln.startswith("colocate: stage")]
    assert len(lines) == 1 and "c2.1" in lines[0] and "died: killed by signal 9" in lines[0], err
    assert "Traceback" not in err
    assert all(gone(p) for p in pids_of(state)), [p for p in pids_of(state) if not gone(p)]
    assert not list((place[0] / "pipelines").glob(f"*-{runner.pid}.json"))


def test_ctrl_c_stops_every_stage(place):
    runner = start_runner(place)
    try:
        state = wait_until(lambda: state_of(place, runner), 30, "the pipeline's first queries")
        runner.send_signal(signal.SIGINT)
        rc, err = finish(runner)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert rc == 130 and "interrupted: stopped the pipeline's 4 stage process(es)" in err, err
    assert all(gone(p) for p in pids_of(state))


def test_ls_shows_a_running_pipeline_and_forgets_it(place):
    rd = place[0]
    (rd / "pipelines").mkdir(exist_ok=True)
    stale = rd / "pipelines" / "old-999999.json"           # a runner that is long gone
    stale.write_text(json.dumps({"name": "old", "pid": 999999, "pid_start": "1", "stages": []}))
    runner = start_runner(place, queries=100000)           # runs until stopped below
    try:
        state = wait_until(lambda: state_of(place, runner), 30, "the pipeline's first queries")
        live = ls_json(place)
        assert [p["name"] for p in live] == ["t-p1-c2-m1"] and live[0]["pid"] == runner.pid
        assert not stale.exists()
        stages = live[0]["stages"]
        assert [(s["kind"], s["quota"], len(s["instances"])) for s in stages] == [("p1", 20, 1), ("c2", 30, 2),
                                                                                  ("m1", 20, 1)]
        assert sorted(pids_of(live[0])) == sorted(pids_of(state)) and not any(gone(p) for p in pids_of(state))
        assert 4 <= live[0]["queries_done"] and live[0]["p99_ms"] > 0
        table = colocate("pipeline", env=place[2])
        assert table.returncode == 0 and "t-p1-c2-m1" in table.stdout and "c2.1(" in table.stdout
        runner.send_signal(signal.SIGTERM)
        rc, err = finish(runner, 60)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert rc == 143, err
    assert ls_json(place) == []
    assert "0 running pipeline(s)" in colocate("pipeline", "ls", env=place[2]).stdout
    alone = colocate("pipeline", "--json", "--runtime-dir", str(rd), env=place[2])   # `pipeline` alone is ls
    assert alone.returncode == 0 and json.loads(alone.stdout) == []


# --- batching (§V-B step 2) and placement, without processes ---------------------------

def bare_pipeline(tmp_path: Path, batch: int = 4, qos_ms: float = 100) -> pl.Pipeline:
    spec = pl.PipelineSpec("u", qos_ms, batch, (pl.StageSpec("c1", 2, 50, (0, 1)), pl.StageSpec("m1", 2, 50, (0, 1))))
    from shim.rundir import RunDir
    return pl.Pipeline(spec, RunDir(tmp_path), "sim", pl.Options())


def test_a_batch_is_issued_when_full_or_when_its_oldest_query_cannot_wait(tmp_path):
    p = bare_pipeline(tmp_path)
    p.arrival = {q: 10.0 for q in range(6)}
    p.waiting.extend([0, 1])
    p.issue(10.0)                                   # no prediction yet: do not hold
    assert [b.qids for b in p.pending[0]] == [[0, 1]]
    p.pending[0].clear()
    p.est = [0.02, 0.03]                            # predicted 50 ms: issue by 10 + 0.09 - 0.05
    p.waiting.extend([2, 3])
    p.issue(10.039)
    assert not p.pending[0] and list(p.waiting) == [2, 3]
    p.issue(10.041)
    assert [b.qids for b in p.pending[0]] == [[2, 3]]
    p.waiting.extend([4, 5, 6, 7, 8])
    p.arrival.update({q: 10.04 for q in range(6, 9)})
    p.pending[0].clear()
    p.issue(10.0)                                   # 5 waiting, batch 4: one full batch at once
    assert [b.qids for b in p.pending[0]] == [[4, 5, 6, 7]] and list(p.waiting) == [8]
    assert p.pending[0][0].payload.size == 4 * p.in_n(0)


def test_the_runs_last_queries_do_not_wait_for_batch_mates_that_cannot_come(tmp_path):
    """Once every query of the run has arrived, a partial batch goes at once
    (before, the last batch of each run waited until its deadline: every
    run's p99 was about 0.9 x QoS, 1.7 s for Table I's services)."""
    p = bare_pipeline(tmp_path, qos_ms=2000)
    p.est = [0.02, 0.03]
    p.arrival = {q: 10.0 for q in range(2)}
    p.waiting.extend([0, 1])
    p.issue(10.001)                                 # more may come: hold for batch-mates
    assert not p.pending[0]
    p.issue(10.001, last=True)                      # none will
    assert [b.qids for b in p.pending[0]] == [[0, 1]] and not p.waiting


def test_a_batch_goes_to_a_free_instance_on_its_producers_device(tmp_path):
    p = bare_pipeline(tmp_path)
    mk = lambda name, stage, dev, last: pl.Instance(name, stage, "x", 50, dev, None, tmp_path, last_free=last)  # noqa: E731
    c0, c1, m0, m1 = mk("c1.0", 0, 0, 1.0), mk("c1.1", 0, 1, 2.0), mk("m1.0", 1, 0, 1.0), mk("m1.1", 1, 1, 2.0)
    p.insts = [c0, c1, m0, m1]
    assert p.pick(1, c1) is m1 and p.pick(1, c0) is m0
    m1.busy = pl.Batch(1, [0])
    assert p.pick(1, c1) is m0                      # none free there: any free one
    m0.busy = pl.Batch(2, [1])
    assert p.pick(1, c1) is None
    assert p.pick(0, None) is c0                    # the longest idle
