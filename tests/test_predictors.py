"""Predictors: schema, sample store, training, compiled inference
(bit-exact trees, MLP within 1e-6), the CLI end to end on a small synthetic
store, and synth's equations against simgpu itself (a tiny profile -> train
-> report on simgpu).  No timing assertions: speed figures come from
bench/predictors_bench.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from predictors import compiled as C
from predictors import schema as S
from predictors import synth
from predictors import train as T
from predictors.store import Store, StoreError

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)    # sklearn ConvergenceWarning
        yield


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.int64)


# ------------------------------------------------------------------ schema

def test_schema_round_trip_and_versions():
    for k in S.KINDS.values():
        d = json.loads(json.dumps(k.to_dict()))
        assert S.Kind.from_dict(d) == k
        assert S.Kind.from_dict(d).fingerprint() == k.fingerprint()
        assert k.version == S.SCHEMA_VERSION
        assert [n for n, _, _ in S.describe(k)] == k.feature_names + k.target_names
    assert S.TASK.quota_column == S.TASK.feature_names.index("quota")
    assert S.GROUP.quota_column is None
    # any change to a feature changes the fingerprint
    d = S.TASK.to_dict()
    d["features"][1]["name"] = "input_size"
    assert S.Kind.from_dict(d).fingerprint() != S.TASK.fingerprint()


def test_rows_and_encoding():
    row = S.task_row("cudnnConvolutionForward", 1e6, quota=30,
                     params=[("n", 8), ("c", 64), ("h", 56)])
    S.check_rows(S.TASK, [row])
    assert (row["p0"], row["p1"], row["p2"], row["p3"]) == (8.0, 64.0, 56.0, 0.0)
    with pytest.raises(ValueError):
        S.task_row("x", 1, params=[("p", 1)] * (S.NPARAMS + 1))
    with pytest.raises(ValueError):
        S.check_rows(S.TASK, [{**row, "bogus": 1}])
    g = S.group_row({2: (3, 9, 4, 0), 6: (0, 4, 1, 128)})
    S.check_rows(S.GROUP, [g])
    assert [g[f"in_{s}"] for s in range(S.GROUP_SLOTS)] == [0, 0, 1, 0, 0, 0, 1, 0]
    assert g["ops_2"] == 6 and g["seq_6"] == 128 and g["end_0"] == 0
    with pytest.raises(ValueError):
        S.group_row({0: (5, 5, 1, 0)})
    vocab = S.Vocab.fit(S.TASK, [row, {**row, "task": "_Z6vecaddPKfS0_Pfi"}])
    X = S.encode(S.TASK, [row], vocab)
    assert X.shape == (1, len(S.TASK.features))
    assert X[0, 0] == vocab.code("task", "cudnnConvolutionForward") == 1   # sorted names
    with pytest.raises(KeyError):
        S.encode(S.TASK, [{**row, "task": "never-seen"}], vocab)


# ------------------------------------------------------------------- store

def _sample(key: str, q: int = 50) -> dict:
    return {"key": key, "f": S.task_row("k", 1024, (4, 1, 1), (256, 1, 1), 0, q),
            "t": {"duration_us": 10.0 + q, "ipc": 1.5}}


def test_store_append_resume_load(tmp_path):
    st = Store(tmp_path, "NVIDIA H100 80GB HBM3")
    assert st.dir.name == "nvidia-h100-80gb-hbm3"
    assert st.append("task", [_sample("a#r0"), _sample("b#r0", 20)]) == 2
    # resuming: known keys are skipped, new ones appended
    assert st.keys("task") == {"a#r0", "b#r0"}
    assert st.append("task", [_sample("a#r0"), _sample("c#r0", 70)]) == 1
    with st.path("task").open("a") as fh:          # a line torn by a crash
        fh.write('{"key": "d#r0", "f": {"task"')
    assert st.append("task", [_sample("e#r0", 90)]) == 1      # after the torn line
    ss = st.load("task")
    assert ss.keys == ["a#r0", "b#r0", "c#r0", "e#r0"] and ss.torn == 1
    assert ss.device == "NVIDIA H100 80GB HBM3" and ss.source_counts == {"profile": 4}
    assert ss.y("duration_us").tolist() == [60.0, 30.0, 80.0, 100.0]
    assert np.isnan(ss.y("bandwidth_gbs")).all()            # a target not measured
    vocab = S.Vocab.fit(S.TASK, ss.rows)
    assert ss.X(vocab)[:, S.TASK.quota_column].tolist() == [50.0, 20.0, 70.0, 90.0]
    # a second Store object (another profiler) sees the same keys
    assert Store(tmp_path, st.device).keys("task") == {"a#r0", "b#r0", "c#r0", "e#r0"}
    hdr = st.header("task")
    assert hdr["schema_version"] == S.SCHEMA_VERSION and hdr["device"] == st.device
    with pytest.raises(ValueError):
        st.append("task", [{"key": "x", "f": {"task": "k"}, "t": {}}])
    with pytest.raises(ValueError):
        st.append("task", [{**_sample("x"), "t": {"latency_us": 1.0}}])
    assert st.append("query", []) == 0 and st.keys("query") == set()
    # a file written by another schema version is refused, not mixed
    lines = st.path("task").read_text().splitlines()
    h = json.loads(lines[0])
    h["schema_version"] = 0
    st.path("task").write_text("\n".join([json.dumps(h)] + lines[1:]) + "\n")
    with pytest.raises(StoreError):
        st.load("task")
    with pytest.raises(StoreError):
        st.append("task", [_sample("z")])
    with pytest.raises(StoreError):
        Store(tmp_path, "other").load("task")


# ---------------------------------------------------------------- training

@pytest.fixture(scope="module")
def task_store(tmp_path_factory) -> Store:
    st = Store(tmp_path_factory.mktemp("store"), "simgpu")
    st.append("task", synth.tasks(1200, seed=3), src=synth.SOURCE)
    return st


def test_train_save_load(task_store, tmp_path):
    ss = task_store.load("task")
    assert ss.source_counts == {"synthetic": len(ss)}
    tm = T.fit(ss, "duration_us", "dt", seed=1, cv=3)
    m = tm.meta
    assert m["n_train"] + m["n_holdout"] == len(ss) and m["n_holdout"] == round(0.2 * len(ss))
    assert len(m["cv_mape"]) == 3 and m["cv_folds"] == 3
    assert m["sources"] == {"synthetic": len(ss)} and m["device"] == "simgpu"
    assert m["schema_fingerprint"] == S.TASK.fingerprint() and m["sklearn"]
    # the holdout MAPE is C-Laius Eq. 2 on the stored holdout
    pred = tm.sk_predict(tm.holdout["X"])
    y = tm.holdout["y"]
    assert m["holdout_mape"] == pytest.approx(100 * np.mean(np.abs(pred - y) / y))
    assert m["holdout_mape"] < 10       # repeated configurations: near the 2 % noise
    p = T.save(tm, tmp_path)
    assert p.name == "task.duration_us.dt.joblib"
    back = T.load(p)
    assert back.meta == m and back.vocab.to_dict() == tm.vocab.to_dict()
    assert np.array_equal(_bits(back.sk_predict(tm.holdout["X"])), _bits(pred))
    # same seed, same split and same model
    again = T.fit(ss, "duration_us", "dt", seed=1, cv=0)
    assert again.holdout["keys"] == tm.holdout["keys"]
    assert np.array_equal(_bits(again.sk_predict(tm.holdout["X"])), _bits(pred))
    # a model saved under another schema is refused at load
    import joblib
    blob = joblib.load(p)
    blob["schema"]["features"][1]["name"] = "renamed"
    joblib.dump(blob, tmp_path / "bad.joblib")
    with pytest.raises(T.ModelError):
        T.load(tmp_path / "bad.joblib")


@pytest.mark.parametrize("model", ["dt", "rf", "mlp"])
def test_a_loaded_model_predicts_without_importing_sklearn(task_store, tmp_path, model):
    """A controller loading models pays no scikit-learn import (about 2 s): the
    saved compiled arrays predict, bit for bit as the fitted model's own
    evaluator; scikit-learn comes in only when the estimator is asked for."""
    tm = T.fit(task_store.load("task"), "duration_us", model, seed=1, cv=0)
    p = T.save(tm, tmp_path)
    X = tm.holdout["X"]
    code = (f"import sys, pickle, numpy as np; from predictors import train as T\n"
            f"tm = T.load({str(p)!r}); y = tm.predict(np.load({str(tmp_path / 'X.npy')!r}))\n"
            f"before = 'sklearn' in sys.modules; tm.sk()\n"
            f"print(before, 'sklearn' in sys.modules, y.tobytes().hex())")
    np.save(tmp_path / "X.npy", X)
    r = subprocess.run([PY, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    before, after, hexed = r.stdout.split()
    assert (before, after) == ("False", "True")
    assert bytes.fromhex(hexed) == tm.predict(X).tobytes()


def test_a_model_of_format_1_or_of_another_compiled_state_still_loads(task_store, tmp_path):
    import joblib
    tm = T.fit(task_store.load("task"), "duration_us", "dt", seed=1, cv=0)
    blob = {"format": 1, "schema": tm.kind.to_dict(), "target": tm.target, "model": tm.model,
            "estimator": tm.estimator, "vocab": tm.vocab.to_dict(), "meta": tm.meta, "holdout": tm.holdout}
    joblib.dump(blob, tmp_path / "old.joblib")
    back = T.load(tmp_path / "old.joblib")
    X = tm.holdout["X"]
    assert np.array_equal(back.predict(X), tm.predict(X)) and np.array_equal(back.sk_predict(X), tm.sk_predict(X))
    # compiled arrays another build wrote (another state version) are made again from the estimator
    p = T.save(back, tmp_path / "new")
    assert joblib.load(p)["meta"]["format"] == T.MODEL_FORMAT
    blob = joblib.load(p)
    blob["compiled"]["version"] = C.STATE_VERSION + 1
    blob["compiled"]["nodes"] = blob["compiled"]["nodes"][:1]      # and would predict wrong if used
    joblib.dump(blob, tmp_path / "other.joblib")
    other = T.load(tmp_path / "other.joblib")
    assert np.array_equal(other.predict(X), tm.predict(X))


def test_split_by_config_keeps_repetitions_together(task_store):
    keys = task_store.load("task").keys
    tr, te = T.split(keys, seed=0, by="config")
    assert len(tr) + len(te) == len(keys) and len(te) > 0
    held = {T.config_of(keys[i]) for i in te}
    assert not held & {T.config_of(keys[i]) for i in tr}


def test_predict_quotas(task_store):
    ss = task_store.load("task")
    tm = T.fit(ss, "duration_us", "dt", cv=0)
    row = dict(ss.rows[0])
    quotas = list(range(10, 101, 10))
    got = tm.predict_quotas(row, quotas)
    want = tm.sk_predict(tm.encode([{**row, "quota": q} for q in quotas]))
    assert got.shape == (10,) and np.array_equal(_bits(got), _bits(want))
    enc = tm.encode([row])[0]
    assert np.array_equal(_bits(tm.predict_quotas(enc, np.array(quotas, float))), _bits(want))
    g = T.TrainedModel(S.GROUP, "latency_us", "dt", None, S.Vocab({}), {}, {})
    with pytest.raises(T.ModelError):
        g.predict_quotas({}, quotas)


def test_all_model_types_fit(task_store):
    ss = task_store.load("task")
    for m in T.MODELS:
        tm = T.fit(ss, "ipc", m, cv=0, quick=True)
        assert np.isfinite(tm.meta["holdout_mape"])
        assert (tm.compiled() is not None) == (m in T.COMPILABLE)


# ------------------------------------------------------- compiled inference

def _tree_data(seed: int = 0, n: int = 3000, d: int = 7) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * 10 ** rng.uniform(-3, 6, size=d)
    X[:, 0] = rng.integers(0, 5, n)                 # ties and integer thresholds
    X[:, 1] = np.round(X[:, 1], 2)
    y = np.exp(X[:, 0] / 3) + np.sin(X[:, 2] / X[:, 2].std()) + 0.1 * rng.normal(size=n)
    return X, y


def _probe_rows(est, X: np.ndarray, seed: int = 1) -> np.ndarray:
    """Random rows plus rows whose feature sits exactly on, and one ulp
    either side (float64 and float32) of, every threshold, and NaNs."""
    rng = np.random.default_rng(seed)
    trees = [est.tree_] if hasattr(est, "tree_") else [e.tree_ for e in est.estimators_]
    rows = [X[rng.integers(0, len(X), 2000)]]
    for t in trees[:4]:
        inner = t.children_left >= 0
        for f, thr in zip(t.feature[inner], t.threshold[inner]):
            f32 = np.float32(thr)
            for v in (thr, np.nextafter(thr, -np.inf), np.nextafter(thr, np.inf), float(f32),
                      float(np.nextafter(f32, np.float32(-np.inf))),
                      float(np.nextafter(f32, np.float32(np.inf)))):
                r = X[rng.integers(0, len(X))].copy()
                r[f] = v
                rows.append(r[None, :])
    P = np.vstack(rows)
    P[::97, 3] = np.nan
    return P


@pytest.mark.parametrize("kind", ["dt", "rf"])
def test_compiled_trees_bitwise(kind):
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.tree import DecisionTreeRegressor
    X, y = _tree_data()
    est = (DecisionTreeRegressor(random_state=0) if kind == "dt" else
           RandomForestRegressor(n_estimators=6, random_state=0)).fit(X, y)
    P = _probe_rows(est, X)
    want = est.predict(P)
    c = C.compile_estimator(est)
    assert c.backend == ("c" if C.c_available() else "numpy")
    assert np.array_equal(_bits(c.predict(P)), _bits(want))
    one = np.array([c.predict_one(np.ascontiguousarray(r)) for r in P[:600]])
    assert np.array_equal(_bits(one), _bits(want[:600]))
    npy = C.compile_estimator(est, force_numpy=True)
    assert npy.backend == "numpy"
    assert np.array_equal(_bits(npy.predict(P)), _bits(want))
    with pytest.raises(ValueError):
        c.predict(P[:, :3])


@pytest.mark.parametrize("act", ["relu", "tanh", "logistic", "identity"])
def test_compiled_mlp_within_1e6(act):
    from sklearn.compose import TransformedTargetRegressor
    from sklearn.neural_network import MLPRegressor
    from sklearn.pipeline import Pipeline

    from predictors.prep import LogStd, Prep
    rng = np.random.default_rng(5)
    n = 800
    X = np.column_stack([rng.integers(0, 4, n),                   # a categorical code
                         10 ** rng.uniform(0, 7, n),              # a size (log-scaled)
                         rng.integers(0, 40, n),                  # a position (linear)
                         rng.normal(size=n) * 50])                # signed
    y = 5 + X[:, 1] ** 0.5 * (1 + X[:, 0]) + X[:, 2]
    est = TransformedTargetRegressor(
        regressor=Pipeline([("prep", Prep(cat_cols=[0], cat_sizes=[4], lin_cols=[2])),
                            ("mlp", MLPRegressor(hidden_layer_sizes=(32, 32, 32), activation=act,
                                                 max_iter=40, random_state=0))]),
        transformer=LogStd(), check_inverse=False).fit(X, y)
    P = np.vstack([X[:300], X[:50] * [0, 1, 1, 1] + [7, 0, 0, 0]])   # code 7: unknown
    want = est.predict(P)
    for force in (False, True):
        c = C.compile_estimator(est, force_numpy=force)
        got = c.predict(P)
        assert np.max(np.abs(got - want) / np.abs(want)) < 1e-6
        one = np.array([c.predict_one(np.ascontiguousarray(r)) for r in P[:40]])
        assert np.max(np.abs(one - want[:40]) / np.abs(want[:40])) < 1e-6
    # a bare MLPRegressor compiles too
    bare = MLPRegressor(hidden_layer_sizes=(8, 8), max_iter=20, random_state=0).fit(X[:, 1:] / 1e6, y)
    got = C.compile_estimator(bare).predict(X[:100, 1:] / 1e6)
    want = bare.predict(X[:100, 1:] / 1e6)
    assert np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-12)) < 1e-6


def test_not_compilable():
    from sklearn.neighbors import KNeighborsRegressor
    with pytest.raises(C.NotCompilable):
        C.compile_estimator(KNeighborsRegressor().fit(np.eye(3), np.ones(3)))


def test_numpy_fallback_logs_once(monkeypatch, caplog):
    from sklearn.tree import DecisionTreeRegressor
    X, y = _tree_data(n=300)
    est = DecisionTreeRegressor(random_state=0).fit(X, y)
    monkeypatch.setattr(C, "_lib", None)
    monkeypatch.setattr(C, "_warned", False)
    with caplog.at_level("WARNING", logger="predictors"):
        c = C.compile_estimator(est)
        C.compile_estimator(est)
    assert c.backend == "numpy"
    assert sum("numpy implementation" in r.message for r in caplog.records) == 1
    assert np.array_equal(_bits(c.predict(X)), _bits(est.predict(X)))


# ------------------------------------------------------------- CLI, e2e

def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLOCATE_", "SIMGPU_"))}
    r = subprocess.run([PY, "-m", "predictors.cli", *map(str, args)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_cli_schema_json():
    r = _cli("schema", "--json")
    kinds = {k["name"]: k for k in json.loads(r.stdout)}
    assert set(kinds) == {"task", "query", "group"}
    assert kinds["task"]["fingerprint"] == S.TASK.fingerprint()
    assert "quota" in [f["name"] for f in kinds["query"]["features"]]


def test_cli_synth_train_report(tmp_path):
    store, models, out = tmp_path / "profiles", tmp_path / "models", tmp_path / "report"
    r = _cli("synth", "--store", store, "--n", "500", "--seed", "2")
    assert "query: 500 new synthetic samples" in r.stdout
    r = _cli("synth", "--store", store, "--n", "500", "--seed", "2", "--kind", "task")
    assert "task: 0 new" in r.stdout                       # resumable: nothing twice
    r = _cli("train", "--store", store, "--out", models, "--quick", "--cv", "2")
    for k in S.KINDS.values():
        for t in k.target_names:
            for m in T.MODELS:
                assert (models / f"{k.name}.{t}.{m}.joblib").exists()
    assert "holdout MAPE" in r.stdout
    r = _cli("report", "--models", models, "--out", out, "--reps", "5")
    assert "MAPE" in r.stdout and "synthetic" in r.stdout.lower()
    rows = json.loads((out / "results.json").read_text())
    assert len(rows) == sum(len(k.target_names) for k in S.KINDS.values()) * len(T.MODELS)
    for row in rows:
        assert np.isfinite(row["mape"]) and row["p50"] <= row["p90"] <= row["p99"]
        assert row["sources"] == {"synthetic": 500}
        assert row["sk_one_med"] > 0 and row["sk_b64_med"] > 0
        if row["model"] in ("dt", "rf"):
            assert row["bitwise_equal"] == row["n"] == row["n_holdout"]
        if row["model"] == "mlp":
            assert row["max_rel"] < 1e-6
        if row["model"] in T.COMPILABLE:
            assert row["c_one_med"] > 0 and row["c_b64_med"] > 0
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert set(pngs) == {"latency.png", "mape.png", "scatter_task.png", "scatter_query.png",
                         "scatter_group.png", "cdf_task.png", "cdf_query.png", "cdf_group.png"}
    for p in out.glob("*.png"):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 5000
    md = (out / "report.md").read_text()
    assert "SYNTHETIC" in md
    assert ("compiled evaluator: C" if C.c_available() else "numpy fallback") in md


# --------------------------------------------------- synth vs simgpu itself

VECADD = ROOT / "bench" / "bin" / "vecadd"
SIMGPU_LIB = ROOT / "shim" / "lib" / "simgpu"


@pytest.mark.skipif(not VECADD.exists() or not (SIMGPU_LIB / "libcudart.so.13").exists(),
                    reason="make build first (vecadd, simgpu)")
def test_simgpu_profile_matches_synth_then_train_report(tmp_path):
    """Run vecadd on simgpu at several sizes, blocks and quotas (a tiny
    profiler, not `colocate profile`): simgpu's modelled duration per launch
    equals synth's equation, and those samples go through store -> train ->
    report like any profile."""
    dev = synth.Device()
    samples = []
    for n in (50_000, 1_000_000, 8_000_000):
        for block in (128, 512):
            for q in (10, 30, 100):
                rep = tmp_path / f"r{n}-{block}-{q}.jsonl"
                env = {"PATH": os.environ.get("PATH", ""), "LD_LIBRARY_PATH": str(SIMGPU_LIB),
                       "SIMGPU_DIR": str(tmp_path / "dev"), "SIMGPU_TIMESCALE": "0",
                       "SIMGPU_REPORT": str(rep), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(q),
                       "SIMGPU_MODEL": "fluid"}        # synth's equations are the fluid model's
                r = subprocess.run([str(VECADD), "--n", str(n), "--block", str(block),
                                    "--repeat", "2"], env=env, capture_output=True, text=True,
                                   timeout=60)
                assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
                (k,) = [json.loads(x) for x in rep.read_text().splitlines()]
                assert k["name"] == "_Z6vecaddPKfS0_Pfi" and k["twin"] and k["launches"] == 2
                got = k["modelled_us"] / 2
                grid = (-(-n // block), 1, 1)
                want = synth.kernel_us(dev, n, 12.0 * n, grid, (block, 1, 1), q)
                assert got == pytest.approx(want, rel=1e-4, abs=2e-3)
                row = S.task_row(k["name"], 8.0 * n, grid, (block, 1, 1), 0, q)
                for i in range(2):
                    samples.append({"key": f"vecadd|{n}|{block}|q{q}#r{i}", "f": row,
                                    "t": {"duration_us": got}})
    st = Store(tmp_path / "profiles", "simgpu")
    assert st.append("task", samples, src="simgpu") == len(samples)
    tm = T.fit(st.load("task"), "duration_us", "dt", cv=0)
    assert tm.meta["sources"] == {"simgpu": len(samples)}
    T.save(tm, tmp_path / "models")
    from predictors import report as R
    rows = R.run(T.load_dir(tmp_path / "models"), tmp_path / "rep", reps=3, plots=False)
    assert rows[0]["bitwise_equal"] == rows[0]["n"] and np.isfinite(rows[0]["mape"])
    assert "simgpu" in R.data_line(rows) and "SYNTHETIC" not in R.data_line(rows)
