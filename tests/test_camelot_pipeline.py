"""The Camelot suite on the device model, the pipeline simulator, the stage
predictors (Fig. 12) and the camelot-* experiments in --quick form."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, clean_env

from shim import paths

sys.path.insert(0, str(ROOT / "bench"))

pytestmark = pytest.mark.skipif(not paths.SIMGPU_CUDART.exists(), reason="simgpu not built (make build)")


@pytest.fixture(scope="module")
def dev():
    from camelot.suite import device_params
    return device_params("2080ti")


def test_suite_has_table1_services_and_27_artifact_pipelines():
    from camelot.suite import ARTIFACT_PIPELINES, SERVICES, pipeline
    assert set(SERVICES) == {"img-to-img", "img-to-text", "text-to-img", "text-to-text"}
    assert all(len(s) == 2 for s in SERVICES.values())
    assert len(set(ARTIFACT_PIPELINES)) == 27
    assert [s.name for s in pipeline("p3+c1+m2")] == ["p3", "c1", "m2"]
    with pytest.raises(KeyError, match="unknown pipeline"):
        pipeline("p4+c1")


def test_artifact_intensities_order_as_named(dev):
    """c_i does more flops, m_i moves more bytes, p_i copies more over PCIe
    than c_j/m_j/p_j for i > j (§VIII-E): time at a full GPU grows with i."""
    from camelot.suite import ARTIFACT, DevStage
    for kind in "cmp":
        t = [DevStage(ARTIFACT[f"{kind}{i}"], dev).duration_s(100, 8) for i in (1, 2, 3)]
        assert t[0] < t[1] < t[2], (kind, t)
    m3, c3 = DevStage(ARTIFACT["m3"], dev), DevStage(ARTIFACT["c3"], dev)
    assert m3.bandwidth_gbs(100, 8) > 0.5 * dev.bw / 1e9 > c3.bandwidth_gbs(100, 8)


def test_stage_scaling_with_quota_and_batch(dev):
    """Compute stages speed up with SMs; recurrent ones barely (latency-bound
    steps): the shapes Camelot's instance counts exploit (Fig. 3, 15)."""
    from camelot.suite import SERVICES, DevStage
    vgg, caption = (DevStage(s, dev) for s in SERVICES["img-to-text"])
    assert vgg.duration_s(20, 8) > 3 * vgg.duration_s(100, 8)
    assert caption.duration_s(20, 8) < 1.5 * caption.duration_s(100, 8)
    assert caption.duration_s(100, 1) <= caption.duration_s(100, 8)
    assert vgg.mem_gb(32) > vgg.mem_gb(1) and vgg.gflop(16) == pytest.approx(2 * vgg.gflop(8))


def sim(dev, deployment, load, comm="handle", seed=1, queries=300, batch=8, qos=0.05):
    from camelot import pipesim
    from camelot.suite import pipeline
    return pipesim.simulate(pipeline("p1+c1"), deployment, dev, batch, qos, load, comm, queries, seed)


def test_pipesim_deterministic_and_load_raises_latency(dev):
    from camelot.pipesim import Instance
    dep = [Instance(0, 0, 50), Instance(1, 0, 50)]
    a, b = sim(dev, dep, 400), sim(dev, dep, 400)
    assert np.array_equal(a.latencies_s, b.latencies_s)
    assert not np.array_equal(a.latencies_s, sim(dev, dep, 400, seed=2).latencies_s)
    low, high = sim(dev, dep, 100), sim(dev, dep, 20000)
    assert np.isfinite(low.latencies_s).all() and low.p99_s < 0.05
    assert high.p99_s > 0.05                     # far past what 2 instances carry
    over = sim(dev, dep, 20000, queries=3000)    # some never finish within the drain
    assert not np.isfinite(over.latencies_s).all() and over.p99_s == math.inf


def test_pipesim_handles_on_one_gpu_copies_across(dev):
    """Handle mode: no copy between stages on one GPU; a consumer on another
    GPU still copies (counted).  Copy mode always copies, and its copies
    take device time that handles do not."""
    from camelot.pipesim import Instance
    same = [Instance(0, 0, 50), Instance(1, 0, 50)]
    h, c = sim(dev, same, 200, "handle"), sim(dev, same, 200, "copy")
    assert h.copies == 0 and h.handoffs == h.batches // 2 > 0
    assert c.handoffs == 0 and c.copies == c.batches // 2
    assert sum(c.stage_busy_s) > sum(h.stage_busy_s)
    cross = sim(dev, [Instance(0, 0, 50), Instance(1, 1, 50)], 200, "handle")
    assert cross.handoffs == 0 and cross.cross_gpu == cross.copies > 0


def test_pipesim_two_instances_under_load_finish_every_batch(dev):
    """Two identical instances on one GPU kept busy: every query finishes and
    every batch is counted once (a lost or doubled op would leave a batch
    unfinished or run one twice)."""
    from camelot import pipesim
    from camelot.suite import pipeline
    dep = [pipesim.Instance(0, 0, 50), pipesim.Instance(0, 0, 50)]
    r = pipesim.simulate(pipeline("text-to-img")[:1], dep, dev, 8, 0.5, 2000, "handle", 400, 1)
    assert np.isfinite(r.latencies_s).all() and r.batches == 50


def test_pipesim_refuses_a_stage_without_instances(dev):
    from camelot.pipesim import Instance
    with pytest.raises(ValueError, match="no instance"):
        sim(dev, [Instance(0, 0, 50)], 100)


def test_peak_load_is_the_edge_of_the_target(dev):
    from camelot import pipesim
    from camelot.pipesim import Instance
    from camelot.suite import pipeline
    dep = [Instance(0, 0, 50), Instance(1, 0, 50)]
    peak, res = pipesim.peak_load(pipeline("p1+c1"), dep, dev, 8, 0.05, "handle", 20000, 300, 1)
    assert 0 < peak < 20000 and res.p99_s <= 0.05
    assert sim(dev, dep, peak * 1.3).p99_s > 0.05


def test_stage_predictors_fig12(dev):
    """DT (the paper's choice), LR and RF on a 70/30 split of the solo
    profile: each error is finite and DT fits its training rows exactly."""
    from camelot.suite import SERVICES, DevStage

    from predictors.stages import TARGETS, StagePredictor, compare, profile_stage
    s = profile_stage(DevStage(SERVICES["text-to-img"][1], dev), batches=(1, 4, 16), pcts=(10, 30, 50, 100))
    errs = compare(s)
    assert set(errs) == {"dt", "lr", "rf"} and all(set(e) == set(TARGETS) for e in errs.values())
    assert all(0 <= v < 1 for e in errs.values() for v in e.values())
    m = StagePredictor("dt").fit(s)
    assert np.allclose(m.predict("duration_s", s.X), s.y["duration_s"], rtol=1e-9)
    st = m.as_stage()
    assert st.duration_s(30, 4) == pytest.approx(DevStage(SERVICES["text-to-img"][1], dev).duration_s(30, 4))
    assert st.mem_gb(16) == pytest.approx(s.mem_gb[16])
    with pytest.raises(ValueError, match="model kind"):
        StagePredictor("svm")
    # the stage model predicts a batch's quotas in one call: each answer is the single prediction's
    rf = StagePredictor("rf").fit(s).as_stage()
    for pct, b in ((5, 1), (30, 4), (33, 4), (100, 16), (7, 9)):
        assert rf.bandwidth_gbs(pct, b) == float(rf.model.predict("bandwidth_gbs", [[b, pct]])[0])
        assert rf.duration_s(pct, b) == b / float(rf.model.predict("throughput_qps", [[b, pct]])[0])


def experiment(tmp_path, *args: str) -> dict:
    """`colocate experiment NAME --quick`, in this process (bench/experiments.py's
    main: the CLI's own code path after `colocate` hands over)."""
    import experiments
    assert experiments.main([*args, "--quick", "--out", str(tmp_path), "--no-progress"]) == 0
    return json.loads((tmp_path / "rows.json").read_text())


def test_peak_quick_through_the_cli(tmp_path):
    r = subprocess.run([sys.executable, "-m", "controlplane.cli", "experiment", "camelot-peak", "--quick",
                        "--out", str(tmp_path), "--no-progress"], cwd=ROOT, env=clean_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "camelot peak qps" in r.stdout and (tmp_path / "plot.png").read_bytes()[:4] == b"\x89PNG"
    check_peak_rows(json.loads((tmp_path / "rows.json").read_text()))


def check_peak_rows(j: dict) -> None:
    assert j["rows"]
    for r in j["rows"]:
        assert {"ea", "laius", "camelot"} <= set(r)
        assert all(r[p]["peak_qps"] > 0 for p in ("ea", "laius", "camelot"))
        if r["camelot"]["p99_norm"] is not None:
            assert r["camelot"]["p99_norm"] <= 1.0       # the peak meets the target by construction
        assert sum(r["camelot"]["instances"]) >= 2


@pytest.mark.parametrize("name", ["camelot-artifact", "camelot-multigpu"])
def test_peak_experiments_quick(tmp_path, name):
    j = experiment(tmp_path, name)
    check_peak_rows(j)
    assert (tmp_path / "table.md").read_text().startswith(f"# {name}")
    if name == "camelot-multigpu":
        assert {r["gpus"] for r in j["rows"]} == {2}


def test_predictors_experiment_quick(tmp_path):
    j = experiment(tmp_path, "camelot-predictors")
    assert [r["stage"] for r in j["rows"]] == ["image-features", "image-caption"]
    for r in j["rows"]:
        assert all(0 <= r[f"{k}_{t}"] < 1 for k in ("dt", "lr", "rf")
                   for t in ("duration_s", "bandwidth_gbs", "throughput_qps"))
        assert 0 < r["dt_predict_ms"] < 50


def test_comm_experiment_quick_live(tmp_path):
    """camelot-comm (Fig. 11): two stage processes on simgpu, the hand-off
    against the copy it replaces; the data checks out on both paths, and at
    4 MiB the handle beats D2H + H2D many times over."""
    j = experiment(tmp_path, "camelot-comm")
    rows = {r["size"]: r for r in j["rows"]}
    assert set(rows) == {2, 65536, 4194304} and all(r["data_ok"] for r in rows.values())
    big = rows[4194304]
    assert big["copy_us_p50"] > 3 * big["handoff_us_p50"]
    assert j["exporter"]["live_buffers"] == 0


@pytest.mark.parametrize("name,pols", [("camelot-lowload", {"laius", "camelot"}),
                                       ("camelot-loads", {"camelot", "camelot-nc"})])
def test_load_experiments_quick(tmp_path, name, pols):
    j = experiment(tmp_path, name)
    assert j["rows"]
    for r in j["rows"]:
        assert pols <= set(r) and 0 < r["load_qps"]
        assert all(r[p]["resources_norm"] is None or 0 < r[p]["resources_norm"] <= 1 for p in pols)
        assert not math.isnan(r["load_frac"])


@pytest.mark.parametrize("args,msg", [(["--pipelines", "img-to-cat"], "unknown pipeline"),
                                      (["--policies", "fifo"], "unknown policy"),
                                      (["--batches", "0"], "--batches")])
def test_camelot_experiment_refuses_bad_arguments(tmp_path, capsys, args, msg):
    import experiments
    with pytest.raises(SystemExit) as e:
        experiments.main(["camelot-peak", "--quick", *args, "--out", str(tmp_path)])
    assert e.value.code == 2 and msg in capsys.readouterr().err
