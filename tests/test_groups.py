"""Abacus operator groups: operator ranges in the Tonic services
(TONIC_INFER_RANGE), the group sampler (`colocate profile --groups`), and
profile -> train -> report on group samples.  Small nets; simgpu keeps time
(SIMGPU_TIMESCALE 1000) where contention must be modelled."""
from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import TONIC_SMALL

from predictors import groups as G
from predictors import profile as P
from predictors import schema as S
from predictors.store import Store, StoreError
from shim import paths

ROOT = Path(__file__).resolve().parents[1]
SERVICE = ROOT / "bench" / "bin" / "tonic-service"

pytestmark = pytest.mark.skipif(
    not SERVICE.exists() or not (paths.SIMGPU_DIR / "libcudnn.so.9").exists(),
    reason="tonic-service or simgpu's libcudnn not built (make build)")

cl = P._client()


@pytest.fixture()
def tmp():
    d = Path(tempfile.mkdtemp(prefix="tg-", dir="/tmp"))     # short: sun_path is 108 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def target(net: str, sizes: list[str]) -> P.Target:
    return P.resolve([f"tonic:{net}"], [f"tonic:{net}=" + ";".join(sizes)],
                     " ".join(TONIC_SMALL[net]))[0]


def serve(net: str, tmp: Path, env: dict[str, str], max_size: int = 16):
    path = str(tmp / f"{net}.sock")
    proc = cl.start_service(net, path, [*TONIC_SMALL[net], "--max-size", str(max_size)], [],
                            "sim", SERVICE, env)
    return proc, path


# --- the range request ----------------------------------------------------------

@pytest.mark.skipif(not paths.LIBCOLOCATE.exists(), reason="libcolocate not built")
@pytest.mark.parametrize("net,size", [("dig", 2), ("pos", 9)])
def test_a_range_runs_exactly_its_operators(net, size, tmp):
    """Under the shim's trace, a range request's query holds exactly the
    tasks [start, end) of a full query's, in order."""
    env = P.run_env("tonic-service", 100, tmp)
    proc, path = serve(net, tmp, env)
    try:
        s = cl.connect(path)
        inf = cl.info(s)
        assert inf.n_ops > 4
        s.sendall(cl.REQ.pack(cl.REQ_MAGIC, cl.INFER, 100, size, 0))
        assert cl.read_reply(s)[0] == cl.OK
        n = inf.n_ops
        ranges = {101: (0, n), 102: (1, n - 1), 103: (n // 2, n // 2 + 1), 104: (0, 3)}
        for qid, (a, b) in ranges.items():
            r = cl.infer_range(s, qid, size, a, b)
            assert (r.status, r.id, r.n_ops) == (cl.OK, qid, b - a)
            assert r.device_ns > 0 and r.start_ns > 0
        s.close()
    finally:
        out = cl.stop_service(proc)
    assert "ranges=4" in out, out
    per_q: dict[int, list[str]] = {}
    for rec in P.read_jsonl(tmp / "trace.jsonl"):
        if rec.get("kind") in ("kernel", "library") and rec.get("query") is not None:
            per_q.setdefault(int(rec["query"]), []).append(rec["name"])
    full = per_q[100]
    assert len(full) == inf.n_ops            # one operator = one task
    for qid, (a, b) in ranges.items():
        assert per_q.get(qid) == full[a:b], (qid, a, b)


def test_bad_ranges_are_refused_and_the_service_keeps_serving(tmp):
    env = G.group_env(tmp, 100, 0)
    proc, path = serve("dig", tmp, env)
    try:
        s = cl.connect(path)
        n = cl.info(s).n_ops
        for qid, (a, b) in enumerate([(3, 3), (5, 2), (0, n + 1), (n, n + 1)], 1):
            r = cl.infer_range(s, qid, 2, a, b)
            assert (r.status, r.id) == (cl.EBADREQ, qid), (a, b)
        ok = cl.infer_range(s, 9, 2, 0, n)       # same connection: still in step
        assert ok.status == cl.OK and ok.n_ops == n and ok.device_ns > 0
        # a bad size is a bad header: refused, and that connection is closed
        s.sendall(cl.range_request(10, 99, 0, 1))
        assert cl.read_reply(s)[0] == cl.EBADREQ
        with pytest.raises(ConnectionError):
            cl.read_reply(s)
        s.close()
        s = cl.connect(path)                     # an old client: INFO and INFER as before
        assert cl.info(s).unit_bytes == 28 * 28 * 4
        s.sendall(cl.REQ.pack(cl.REQ_MAGIC, cl.INFER, 11, 2, 0))
        rep = cl.read_reply(s)
        assert rep[0] == cl.OK and rep[5] == 2 * 10   # out_floats of a full query
        s.close()
    finally:
        out = cl.stop_service(proc)
    assert "queries=2 errors=5" in out and "ranges=1" in out, out


# --- the sampler ---------------------------------------------------------------

def test_contending_services_take_longer_together(tmp):
    """Two services' full forward passes issued together on one simulated
    device: each outlasts its run alone (simgpu models the contention).
    Two face services at batch 16 fill the SMs together; smaller pairs (dig
    16 with face 2) fit side by side and are not slowed at all in the
    model: their old "slowdown" was the twins' CPU time (predictors.groups'
    module doc)."""
    tg = [target("face", ["16"]), target("face", ["16"])]
    svs = G.start(tg, tmp, 100, G.TIMESCALE)
    try:
        ms = [G.Member(i, 0, sv.n_ops, sv.sizes[0]) for i, sv in enumerate(svs)]
        solo = [G.issue(svs, [m], 10 + 10 * i, G.TIMESCALE) for i, m in enumerate(ms)]
        # issued together: on two loaded cores one member's first launch
        # once came 5 us (modelled) after the other's, and the overlap, so
        # the slowdown, shrank; such a sample is re-taken
        for _ in range(5):
            both = G.issue(svs, ms, 100, G.TIMESCALE)
            if max(both.offset_us) < 3.0:
                break
        assert max(both.offset_us) < 3.0, f"never issued together in 5 tries: {both}"
        G.solo_table(svs, G.TIMESCALE)
    finally:
        G.stop(svs)
    alone = [r.latency_us for r in solo]
    # the solo feature: a range's operators one at a time add up to the range
    for sv, a in zip(svs, alone):
        assert sv.solo_us(sv.sizes[0], 0, sv.n_ops) == pytest.approx(a, rel=0.03)
    assert all(r.offset_us == [0.0] for r in solo)
    assert alone[0] == pytest.approx(alone[1], rel=0.01), "one service, two processes"
    # both share the SMs: each is slowed by the other (7-12 % in 20 samples,
    # idle or beside two busy loops)
    assert both.latency_us > max(alone) * 1.04, (alone, both)
    assert all(d > a * 1.03 for d, a in zip(both.device_us, alone)), (alone, both)
    assert both.latency_us >= max(both.device_us)


def test_services_that_fit_side_by_side_are_not_slowed_whatever_the_host_does(tmp):
    """dig 16 and face 2 fit on the device together: in the model neither is
    slowed.  Before simgpu waited for a stream's queued kernels, the twins'
    CPU time pushed kernels late whenever the other service's events came
    first, so the pair seemed 4 % (idle) to 18 % (loaded host) slower."""
    tg = [target("dig", ["16"]), target("face", ["2"])]
    svs = G.start(tg, tmp, 100, G.TIMESCALE)
    try:
        ms = [G.Member(i, 0, sv.n_ops, sv.sizes[0]) for i, sv in enumerate(svs)]
        alone = [G.issue(svs, [m], 10 + 10 * i, G.TIMESCALE).latency_us for i, m in enumerate(ms)]
        tries = [G.issue(svs, ms, 100 + k, G.TIMESCALE) for k in range(6)]
    finally:
        G.stop(svs)
    both = [r for r in tries if max(r.offset_us) < 3.0]     # issued together (see above)
    assert both, f"never issued together in 6 tries: {tries}"
    # the median: a member issued a little late can still stretch one sample
    assert statistics.median(r.latency_us for r in both) < max(alone) * 1.02, (alone, both)


def test_sampler_rows_are_what_was_issued(tmp, monkeypatch):
    issued: dict[int, list[G.Member]] = {}
    real = G.issue

    def spy(services, members, qid, timescale):
        issued[qid] = list(members)
        return real(services, members, qid, timescale)

    monkeypatch.setattr(G, "issue", spy)
    tg = [target("dig", ["1", "4"]), target("pos", ["8", "16"]), target("ner", ["8"])]
    st = Store(tmp / "store", "simgpu")
    summ = G.sample_groups(tg, 8, st, group_size="2-3", seed=7, progress=False)
    assert (summ.added, summ.failed, summ.skipped) == (8, 0, 0)
    ss = st.load("group")
    assert set(ss.sources) == {P.SRC} and len(ss) == 8
    nets = [t.net for t in tg]
    for key, row, y in zip(ss.keys, ss.rows, ss.y("latency_us")):
        i = int(key.rsplit("|", 1)[1])
        members = issued[G.QUERY_ID0 + 8 * i]
        assert 2 <= len(members) <= 3 and y > 0
        bits = {G.SLOTS[nets[m.svc]] for m in members}
        assert {s for s in range(S.GROUP_SLOTS) if row[f"in_{s}"]} == bits
        for m in members:
            net = nets[m.svc]
            s = G.SLOTS[net]
            batch, seq = (1, m.size) if net in ("pos", "ner") else (m.size, 0)
            assert (row[f"start_{s}"], row[f"end_{s}"], row[f"ops_{s}"]) == \
                (m.start, m.end, m.end - m.start)
            assert (row[f"batch_{s}"], row[f"seq_{s}"]) == (batch, seq)
            assert row[f"solo_{s}"] >= 2.5 * (m.end - m.start)   # >= a launch per operator
            assert str(m.size) in tg[m.svc].inputs
        # a group lasts at least as long as its longest member would alone
        # (the per-operator sum runs a little high: each single operator
        # pays the host's gap between its event and its launch)
        assert y >= 0.93 * max(row[f"solo_{s}"] for s in bits)
    # resumable: the same configuration again adds only what is missing,
    # and draws sample i the same way whenever it is drawn
    issued.clear()
    more = G.sample_groups(tg, 10, st, group_size="2-3", seed=7, progress=False)
    assert (more.added, more.skipped) == (2, 8)
    assert sorted(q for q in issued if q >= G.QUERY_ID0) == [G.QUERY_ID0 + 8 * 8,
                                                             G.QUERY_ID0 + 8 * 9]
    svs = [G.Service(t, G.SLOTS[t.net], [int(x) for x in t.inputs], n_ops=n)
           for t, n in zip(tg, (12, 8, 8))]
    redrawn = G.draw(random.Random("7:9"), svs, 2, 3)
    assert [(m.svc, m.start, m.end, m.size) for m in redrawn] == \
        [(m.svc, m.start, m.end, m.size) for m in issued[G.QUERY_ID0 + 8 * 9]]


def test_sampler_refuses_what_it_cannot_sample(tmp):
    st = Store(tmp / "store", "simgpu")
    with pytest.raises(P.ProfileError, match="2..8 services"):
        G.sample_groups([target("dig", ["1"])], 1, st, progress=False)
    with pytest.raises(P.ProfileError, match="timescale"):
        G.sample_groups([target("dig", ["1"]), target("pos", ["8"])], 1, st, timescale=0,
                        progress=False)
    with pytest.raises(P.ProfileError, match="group-size"):
        G.parse_group_size("3-2", 4)


# --- schema 3: every recorded library parameter has a slot --------------------------

def test_every_parameter_a_hook_records_has_a_slot(tmp):
    # cudnnConvolutionForward's hook records 20 parameters (shim/hook_lib.c)
    names = ["n", "c", "h", "w", "dtype", "k", "r", "s", "pad_h", "pad_w", "stride_h",
             "stride_w", "dil_h", "dil_w", "groups", "out_h", "out_w", "algo", "workspace",
             "flops"]
    params = {k: float(i + 1) for i, k in enumerate(names)}
    got = P.lib_params("cudnnConvolutionForward", params)
    assert got == list(params.items())
    row = S.task_row("cudnnConvolutionForward", 1, params=got)
    assert [row[f"p{i}"] for i in range(20)] == [float(i + 1) for i in range(20)]
    assert S.NPARAMS >= 24 and S.SCHEMA_VERSION == 3
    # a store written by schema 2 is refused with a clear message
    st = Store(tmp / "store", "simgpu")
    st.dir.mkdir(parents=True)
    st.path("task").write_text(json.dumps({"store": 1, "kind": "task", "schema_version": 2,
                                           "schema_fingerprint": "0" * 16,
                                           "device": "simgpu"}) + "\n")
    with pytest.raises(StoreError, match="schema version 2.*move the file away"):
        st.load("task")


# --- end to end: profile --groups -> train -> report -----------------------------------

def test_profile_groups_train_report(tmp):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("COLOCATE_", "SIMGPU_", "CUDA_MPS"))}
    env["COLOCATE_DATA_DIR"] = str(tmp / "data")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "predictors.cli", *args], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)

    res = cli("profile", "--groups", "40", "tonic:dig", "tonic:pos", "--inputs",
              "tonic:dig=1;4", "--inputs", "tonic:pos=8;32", "--no-progress")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "40 sample(s) added" in res.stdout and "members per group: 2: 40" in res.stdout
    res = cli("profile", "--groups", "40", "tonic:dig", "tonic:pos", "--inputs",
              "tonic:dig=1;4", "--inputs", "tonic:pos=8;32", "--no-progress")
    assert "0 sample(s) added, 40 already stored" in res.stdout, res.stdout + res.stderr
    res = cli("profile", "--groups", "5", "tonic:dig", "tonic:pos", "--quotas", "10,20")
    assert res.returncode == 2 and "one quota" in res.stderr
    res = cli("train", "--kind", "group", "--model", "mlp", "--quick", "--cv", "0")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "40 samples (40 profile:simgpu-model)" in res.stdout
    res = cli("report", "--out", str(tmp / "rep"), "--no-plots", "--no-timing")
    assert res.returncode == 0, res.stdout + res.stderr
    rows = json.loads((tmp / "rep" / "results.json").read_text())
    grp = [r for r in rows if r["name"] == "group.latency_us.mlp"]
    assert len(grp) == 1 and grp[0]["n_holdout"] == 8, rows
    assert grp[0]["sources"] == {P.SRC: 40} and grp[0]["mape"] >= 0
