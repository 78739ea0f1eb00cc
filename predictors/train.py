"""Train, save and load predictors: one model per (kind, target, model type).

Model types (C-Laius compares the first four, Abacus uses the last):
  dt   DecisionTreeRegressor, raw features and target (compiled, bit-exact)
  rf   RandomForestRegressor of 24 trees, same                (compiled, bit-exact)
  knn  5 nearest neighbours by distance, on scaled features   (scikit-learn only)
  lr   linear regression of log target on scaled features    (scikit-learn only)
  mlp  MLPRegressor, 3 hidden layers of 32 (ReLU) on scaled features, log
       target (compiled, within 1e-6 relative)
Scaled: see prep.py.  The samples are split 80/20 (seeded) by sample, as
C-Laius does, or by configuration (every repetition of a configuration on
the same side: the key up to '#'); k-fold CV runs on the 80 %.

A saved model (joblib) holds the estimator (pickled apart: loading a model
for prediction needs no scikit-learn) and the compiled evaluator's arrays
(compiled.py), the schema it was trained on
(version and fingerprint, checked at load), the vocabulary of categorical
features, metadata (library versions, date, device, sample counts and
sources, holdout and CV MAPE) and the holdout rows, so that `report` needs
nothing else.
"""
from __future__ import annotations

import datetime as _dt
import platform
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from predictors import schema as S
from predictors.store import SampleSet

MODELS = ("dt", "knn", "lr", "rf", "mlp")
COMPILABLE = ("dt", "rf", "mlp")
MODEL_FORMAT = 2          # 2: the estimator pickled apart, the compiled evaluator's arrays beside it
RF_TREES = 24


class ModelError(Exception):
    pass


def estimator(model: str, k: S.Kind, vocab: S.Vocab, seed: int = 0, quick: bool = False) -> Any:
    """An unfitted scikit-learn estimator for a model type.  quick: fewer
    MLP epochs and trees (tests)."""
    from sklearn.compose import TransformedTargetRegressor
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.linear_model import LinearRegression
    from sklearn.neighbors import KNeighborsRegressor
    from sklearn.neural_network import MLPRegressor
    from sklearn.pipeline import Pipeline
    from sklearn.tree import DecisionTreeRegressor

    from predictors.prep import LogStd, Prep

    if model == "dt":
        return DecisionTreeRegressor(random_state=seed)
    if model == "rf":
        # n_jobs=None: scikit-learn then sums the trees in order, which the
        # compiled forest reproduces bit for bit (threads would not)
        return RandomForestRegressor(n_estimators=8 if quick else RF_TREES, random_state=seed,
                                     n_jobs=None)
    cats = k.categorical
    prep = Prep(cat_cols=cats, cat_sizes=[vocab.size(k.features[c].name) for c in cats],
                lin_cols=k.linear)
    if model == "knn":
        reg = KNeighborsRegressor(n_neighbors=5, weights="distance")
    elif model == "lr":
        reg = LinearRegression()
    elif model == "mlp":
        reg = MLPRegressor(hidden_layer_sizes=(32, 32, 32), activation="relu",
                           max_iter=60 if quick else 1000, early_stopping=not quick,
                           n_iter_no_change=30, random_state=seed)
    else:
        raise ModelError(f"unknown model type {model!r} (one of {', '.join(MODELS)})")
    return TransformedTargetRegressor(regressor=Pipeline([("prep", prep), (model, reg)]),
                                      transformer=LogStd(), check_inverse=False)


def ape(y: np.ndarray, pred: np.ndarray) -> np.ndarray:
    """Absolute percentage errors, |pred - actual| / actual x 100."""
    return np.abs(pred - y) / y * 100.0


def mape(y: np.ndarray, pred: np.ndarray) -> float:
    """C-Laius Eq. 2: the mean of |pred - actual| / actual, in percent."""
    return float(np.mean(ape(y, pred)))


def config_of(key: str) -> str:
    """The configuration a sample measured: its key up to the last '#'."""
    return key.rsplit("#", 1)[0]


def split(keys: Sequence[str], seed: int, test: float = 0.2,
          by: str = "sample") -> tuple[np.ndarray, np.ndarray]:
    """Indices of the training and holdout samples."""
    rng = np.random.default_rng(seed)
    n = len(keys)
    if by == "sample":
        idx = rng.permutation(n)
        nt = n - int(round(n * test))
        return np.sort(idx[:nt]), np.sort(idx[nt:])
    if by != "config":
        raise ModelError(f"split by 'sample' or 'config', not {by!r}")
    cfgs = sorted({config_of(k) for k in keys})
    order = rng.permutation(len(cfgs))
    held = {cfgs[i] for i in order[:int(round(len(cfgs) * test))]}
    mask = np.array([config_of(k) in held for k in keys])
    return np.flatnonzero(~mask), np.flatnonzero(mask)


def _folds(keys: Sequence[str], k: int, seed: int, by: str) -> list[np.ndarray]:
    rng = np.random.default_rng(seed + 1)
    if by == "config":
        cfgs = sorted({config_of(x) for x in keys})
        fold_of = {c: i % k for i, c in enumerate(rng.permutation(cfgs))}
        lab = np.array([fold_of[config_of(x)] for x in keys])
    else:
        lab = rng.permutation(len(keys)) % k
    return [np.flatnonzero(lab == f) for f in range(k)]


@dataclass
class TrainedModel:
    kind: S.Kind
    target: str
    model: str
    estimator: Any                              # fitted, or its pickle until sk() is asked
    vocab: S.Vocab
    meta: dict[str, Any]
    holdout: dict[str, Any]                     # X, y, keys
    _compiled: Any = field(default=None, repr=False)

    @property
    def name(self) -> str:
        return f"{self.kind.name}.{self.target}.{self.model}"

    def encode(self, rows: Sequence[Mapping[str, Any]]) -> np.ndarray:
        return S.encode(self.kind, rows, self.vocab)

    def sk(self) -> Any:
        """The fitted scikit-learn estimator.  A loaded model keeps it pickled
        until asked: unpickling imports scikit-learn (about 2 s), which a
        controller predicting through the compiled evaluator never needs."""
        if isinstance(self.estimator, bytes):
            import pickle
            self.estimator = pickle.loads(self.estimator)
        return self.estimator

    def sk_predict(self, X: np.ndarray) -> np.ndarray:
        """scikit-learn's own predict (the reference)."""
        return np.asarray(self.sk().predict(X), dtype=np.float64).reshape(-1)

    def compiled(self) -> Any:
        """The compiled evaluator, or None for model types without one."""
        if self._compiled is None and self.model in COMPILABLE:
            from predictors.compiled import compile_estimator
            self._compiled = compile_estimator(self.sk())
        return self._compiled

    def predict(self, X: np.ndarray) -> np.ndarray:
        c = self.compiled()
        return c.predict(X) if c is not None else self.sk_predict(X)

    def predict_quotas(self, row: Mapping[str, Any] | np.ndarray,
                       quotas: Sequence[float] | np.ndarray) -> np.ndarray:
        """The target at each quota (percent) for one task or query: one
        batched evaluation, the question a controller asks ("at 10..100 %?").
        row: a feature dict (its quota, if any, is ignored) or a row already
        encoded with encode(), which skips the per-call dict work."""
        qc = self.kind.quota_column
        if qc is None:
            raise ModelError(f"{self.kind.name} samples have no quota")
        if isinstance(row, np.ndarray):
            x = row.reshape(-1)
        else:
            x = self.encode([{**row, "quota": 100}])[0]
        X = np.empty((len(quotas), x.size), dtype=np.float64)
        X[:] = x
        X[:, qc] = quotas
        return self.predict(X)


def fit(ss: SampleSet, target: str, model: str, seed: int = 0, cv: int = 5,
        split_by: str = "sample", quick: bool = False) -> TrainedModel:
    """Train one model on a kind's samples; CV on the training part, MAPE on the holdout."""
    from sklearn import __version__ as skv
    from sklearn.base import clone

    k = ss.kind
    k.target(target)
    y_all = ss.y(target)
    ok = np.isfinite(y_all) & (y_all > 0)         # MAPE and the log target need actual > 0
    keep = np.flatnonzero(ok)
    if len(keep) < 10:
        raise ModelError(f"{k.name}.{target}: {len(keep)} usable samples, need at least 10")
    keys = [ss.keys[i] for i in keep]
    rows = [ss.rows[i] for i in keep]
    vocab = S.Vocab.fit(k, rows)
    X = S.encode(k, rows, vocab)
    y = y_all[keep]
    tr, te = split(keys, seed, by=split_by)
    if len(te) == 0 or len(tr) < 5:
        raise ModelError(f"{k.name}.{target}: too few samples to hold 20 % out ({len(keys)})")

    cv_mapes: list[float] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=UserWarning)      # sklearn ConvergenceWarning is one
        if cv >= 2:
            folds = _folds([keys[i] for i in tr], cv, seed, split_by)
            for f in folds:
                if len(f) == 0 or len(f) == len(tr):
                    continue
                rest = np.setdiff1d(np.arange(len(tr)), f)
                e = clone(estimator(model, k, vocab, seed, quick)).fit(X[tr[rest]], y[tr[rest]])
                cv_mapes.append(mape(y[tr[f]], np.asarray(e.predict(X[tr[f]])).reshape(-1)))
        est = estimator(model, k, vocab, seed, quick)
        t0 = time.perf_counter()
        est.fit(X[tr], y[tr])
        fit_s = time.perf_counter() - t0
    pred = np.asarray(est.predict(X[te]), dtype=np.float64).reshape(-1)
    sources: dict[str, int] = {}
    for i in keep:
        sources[ss.sources[i]] = sources.get(ss.sources[i], 0) + 1
    meta = {
        "format": MODEL_FORMAT, "kind": k.name, "target": target, "model": model,
        "schema_version": k.version, "schema_fingerprint": k.fingerprint(),
        "device": ss.device, "sources": sources,
        "sklearn": skv, "numpy": np.__version__, "python": platform.python_version(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "seed": seed, "split": split_by, "quick": quick,
        "n_samples": int(len(y_all)), "n_dropped": int(len(y_all) - len(keep)),
        "n_train": int(len(tr)), "n_holdout": int(len(te)),
        "holdout_mape": mape(y[te], pred), "cv_folds": cv if cv >= 2 else 0,
        "cv_mape": cv_mapes,
        "cv_mape_mean": float(np.mean(cv_mapes)) if cv_mapes else None,
        "cv_mape_std": float(np.std(cv_mapes)) if cv_mapes else None,
        "fit_s": fit_s, "params": repr(est),
    }
    holdout = {"X": X[te], "y": y[te], "keys": [keys[i] for i in te]}
    return TrainedModel(k, target, model, est, vocab, meta, holdout)


def model_path(out: Path | str, kind: str, target: str, model: str) -> Path:
    return Path(out) / f"{kind}.{target}.{model}.joblib"


def save(tm: TrainedModel, out: Path | str) -> Path:
    import pickle

    import joblib
    p = model_path(out, tm.kind.name, tm.target, tm.model)
    p.parent.mkdir(parents=True, exist_ok=True)
    est = tm.estimator if isinstance(tm.estimator, bytes) else pickle.dumps(tm.estimator, protocol=5)
    c = tm.compiled()
    blob = {"format": MODEL_FORMAT, "schema": tm.kind.to_dict(), "target": tm.target,
            "model": tm.model, "estimator": est, "compiled": c.state() if c is not None else None,
            "vocab": tm.vocab.to_dict(), "meta": {**tm.meta, "format": MODEL_FORMAT}, "holdout": tm.holdout}
    tmp = p.with_suffix(".tmp")
    joblib.dump(blob, tmp)
    tmp.replace(p)
    return p


def load(path: Path | str) -> TrainedModel:
    """Load a saved model; refuse one trained on another schema than this build's."""
    import joblib
    blob = joblib.load(path)
    # format 1 (the estimator itself in the blob) still loads, with scikit-learn's import
    if not isinstance(blob, dict) or blob.get("format") not in (1, MODEL_FORMAT):
        raise ModelError(f"{path}: not a predictor model of format {MODEL_FORMAT}")
    k = S.Kind.from_dict(blob["schema"])
    cur = S.kind(k.name)
    if k.version != cur.version or k.fingerprint() != cur.fingerprint():
        raise ModelError(f"{path}: trained on {k.name} schema v{k.version} ({k.fingerprint()}), "
                         f"this build has v{cur.version} ({cur.fingerprint()}): train it again")
    tm = TrainedModel(cur, blob["target"], blob["model"], blob["estimator"],
                      S.Vocab(blob["vocab"]), blob["meta"], blob["holdout"])
    if blob.get("compiled") is not None:
        from predictors.compiled import NotCompilable, from_state
        try:
            tm._compiled = from_state(blob["compiled"])
        except NotCompilable:
            pass                # saved by another build: compiled() makes it again from the estimator
    return tm


def load_dir(d: Path | str) -> list[TrainedModel]:
    """Every model saved in a directory, by kind, target and model type."""
    paths = sorted(Path(d).glob("*.joblib"))
    return [load(p) for p in paths]
