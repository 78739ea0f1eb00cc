"""Compiled inference: trained trees, forests and MLPs without scikit-learn's
per-call overhead.

compile_estimator() flattens a fitted model into numpy arrays and hands them
to the C evaluator (predictors._cinfer, see infer.h); each predict is then one
cffi call.  Trees and forests give scikit-learn's outputs bit for bit; the MLP
within rounding (1e-6 relative is tested, ~1e-15 is typical).

When the C module has not been built, the same arrays are evaluated with
numpy, with the same results (slower); a log line says so once.
"""
from __future__ import annotations

import logging
from typing import Any

import numpy as np

log = logging.getLogger("predictors")

try:
    from predictors._cinfer import ffi as _ffi
    from predictors._cinfer import lib as _lib
    C_ERROR = ""
except ImportError as e:          # not built: numpy fallback
    _ffi = _lib = None
    C_ERROR = str(e)

_warned = False

F64 = np.dtype(np.float64)
NODE = np.dtype([("v", "<f8"), ("left", "<i4"), ("right", "<i4"), ("feat", "<i4"),
                 ("nan_left", "<i4")])
ACT = {"identity": 0, "relu": 1, "tanh": 2, "logistic": 3, "exp": 4}
MAX_WIDTH = 256            # PR_MLP_MAX_WIDTH: numeric inputs and hidden units
# what state() writes: a saved model whose state has another version is
# compiled again from its estimator (train.load)
STATE_VERSION = 1


class NotCompilable(Exception):
    pass


def c_available() -> bool:
    return _lib is not None


def _use_c(force_numpy: bool) -> bool:
    global _warned
    if force_numpy:
        return False
    if _lib is None and not _warned:
        log.warning("predictors: C evaluator predictors._cinfer not built (%s); using the numpy "
                    "implementation (same results, slower). Build it: python -m predictors.build",
                    C_ERROR)
        _warned = True
    return _lib is not None


def _rows(X: Any, nfeat: int) -> np.ndarray:
    X = np.ascontiguousarray(X, dtype=F64)
    if X.ndim == 1:
        X = X.reshape(1, -1)
    if X.ndim != 2 or X.shape[1] != nfeat:
        raise ValueError(f"expected rows of {nfeat} features, got shape {X.shape}")
    return X


class _Compiled:
    """What both evaluators share: predict (batch) and predict_one (a row)."""
    nfeat: int
    backend: str
    _one_c: Any
    _batch_c: Any
    _p: Any

    def predict(self, X: Any) -> np.ndarray:
        """Rows (n, nfeat) -> n predictions (float64)."""
        X = _rows(X, self.nfeat)
        out = np.empty(X.shape[0], dtype=F64)
        if self._p is None:
            out[:] = self._numpy(X)
        else:
            self._batch_c(self._p, _ffi.from_buffer("double[]", X), X.shape[0], self.nfeat,
                          _ffi.from_buffer("double[]", out))
        return out

    def predict_one(self, x: np.ndarray) -> float:
        """One row: a C-contiguous float64 vector of nfeat features is passed
        straight through; anything else is converted first."""
        if x.dtype is not F64 or x.size != self.nfeat or not x.flags.c_contiguous:
            x = _rows(x, self.nfeat)[0]
        if self._p is None:
            return float(self._numpy(x.reshape(1, -1))[0])
        return self._one_c(self._p, _ffi.from_buffer("double[]", x))

    def _numpy(self, X: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        """Plain arrays and numbers: from_state() makes the same evaluator."""
        raise NotImplementedError


class CompiledForest(_Compiled):
    """One tree (average=False) or a forest's mean, as flattened nodes."""

    def __init__(self, nodes: np.ndarray, roots: np.ndarray, average: bool, nfeat: int,
                 force_numpy: bool = False):
        self.nodes = np.ascontiguousarray(nodes, dtype=NODE)
        self.roots = np.ascontiguousarray(roots, dtype=np.int32)
        self.average = bool(average)
        self.nfeat = int(nfeat)
        if int(self.nodes["feat"].max(initial=0)) >= self.nfeat:
            raise NotCompilable("a node reads a feature past the row")
        self._p = None
        if _use_c(force_numpy):
            f = _ffi.new("struct pr_forest *")
            f.nodes = _ffi.cast("const struct pr_node *", _ffi.from_buffer(self.nodes))
            f.roots = _ffi.cast("const int32_t *", _ffi.from_buffer(self.roots))
            f.ntrees = len(self.roots)
            f.average = int(self.average)
            self._p, self._one_c, self._batch_c = f, _lib.pr_forest_one, _lib.pr_forest_batch
        self.backend = "c" if self._p is not None else "numpy"

    @classmethod
    def from_trees(cls, trees: list[Any], average: bool, nfeat: int,
                   force_numpy: bool = False) -> "CompiledForest":
        """From scikit-learn's fitted Tree objects (est.tree_)."""
        parts, roots, base = [], [], 0
        for t in trees:
            n = t.node_count
            if t.n_outputs != 1 or t.value.shape[1] != 1:
                raise NotCompilable("only single-output regression trees")
            nd = np.zeros(n, dtype=NODE)
            left = t.children_left.astype(np.int64)
            leafm = left < 0
            nd["v"] = np.where(leafm, t.value[:, 0, 0], t.threshold)
            nd["left"] = np.where(leafm, -1, left + base)
            nd["right"] = np.where(leafm, -1, t.children_right + base)
            nd["feat"] = np.where(leafm, 0, t.feature)
            nal = getattr(t, "missing_go_to_left", None)
            nd["nan_left"] = 0 if nal is None else np.asarray(nal, dtype=np.int32)
            parts.append(nd)
            roots.append(base)
            base += n
        return cls(np.concatenate(parts), np.asarray(roots, dtype=np.int32), average, nfeat, force_numpy)

    def state(self) -> dict[str, Any]:
        return {"type": "forest", "version": STATE_VERSION, "nodes": self.nodes, "roots": self.roots,
                "average": self.average, "nfeat": self.nfeat}

    def _numpy(self, X: np.ndarray) -> np.ndarray:
        Xf = X.astype(np.float32)                       # as sklearn does
        v, left, right = self.nodes["v"], self.nodes["left"], self.nodes["right"]
        feat, nanl = self.nodes["feat"], self.nodes["nan_left"]
        acc = np.zeros(X.shape[0], dtype=F64)
        for root in self.roots:
            node = np.full(X.shape[0], root, dtype=np.int64)
            while True:
                live = np.flatnonzero(left[node] >= 0)
                if live.size == 0:
                    break
                nd = node[live]
                x = Xf[live, feat[nd]].astype(F64)
                go_left = np.where(np.isnan(x), nanl[nd] != 0, x <= v[nd])
                node[live] = np.where(go_left, left[nd], right[nd])
            if not self.average:
                return v[node].copy()
            acc += v[node]
        acc /= len(self.roots)
        return acc


class CompiledMLP(_Compiled):
    """Prep -> MLPRegressor -> LogStd inverse, as arrays."""

    def __init__(self, st: dict[str, Any], force_numpy: bool = False):
        """st: what state() or from_sklearn() give."""
        self.nfeat = int(st["nfeat"])
        self.num_col = np.ascontiguousarray(st["num_col"], dtype=np.int32)
        self.num_log = np.ascontiguousarray(st["num_log"], dtype=np.int32)
        self.mean = np.ascontiguousarray(st["mean"], dtype=F64)
        self.scale = np.ascontiguousarray(st["scale"], dtype=F64)
        self.cat_col = np.ascontiguousarray(st["cat_col"], dtype=np.int32)
        self.cat_size = np.ascontiguousarray(st["cat_size"], dtype=np.int32)
        self.coefs = [np.ascontiguousarray(c, dtype=F64) for c in st["coefs"]]
        self.intercepts = [np.ascontiguousarray(b, dtype=F64) for b in st["intercepts"]]
        widths = [self.coefs[0].shape[0]] + [c.shape[1] for c in self.coefs]
        if widths[0] != len(self.num_col) + int(self.cat_size.sum()) or widths[-1] != 1:
            raise NotCompilable(f"layer widths {widths} do not fit the scaling")
        if max(widths[1:] + [len(self.num_col)]) > MAX_WIDTH:
            raise NotCompilable(f"more than {MAX_WIDTH} numeric inputs or units in a layer")
        if st["act"] not in ACT or st["out_act"] not in ("identity", "exp"):
            raise NotCompilable(f"activation {st['act']}/{st['out_act']}")
        self.width = np.asarray(widths, dtype=np.int32)
        self.w = np.concatenate([c.ravel() for c in self.coefs])
        self.b = np.concatenate(self.intercepts)
        self.act, self.out_act = st["act"], st["out_act"]
        self.ylog = bool(st["ylog"])
        self.ymean, self.yscale = float(st["ymean"]), float(st["yscale"])
        self._p = None
        if _use_c(force_numpy):
            m = _ffi.new("struct pr_mlp *")
            keep = []

            def ptr(ctype: str, a: np.ndarray) -> Any:
                buf = _ffi.from_buffer(a)
                keep.append(buf)
                return _ffi.cast(ctype, buf)
            m.nnum = len(self.num_col)
            m.num_col = ptr("const int32_t *", self.num_col)
            m.num_log = ptr("const int32_t *", self.num_log)
            m.mean = ptr("const double *", self.mean)
            self.inv_scale = 1.0 / self.scale
            m.inv_scale = ptr("const double *", self.inv_scale)
            m.ncat = len(self.cat_col)
            m.cat_col = ptr("const int32_t *", self.cat_col)
            m.cat_size = ptr("const int32_t *", self.cat_size)
            m.nlayers = len(self.coefs)
            m.width = ptr("const int32_t *", self.width)
            m.w = ptr("const double *", self.w)
            m.b = ptr("const double *", self.b)
            m.act, m.out_act = ACT[self.act], ACT[self.out_act]
            m.ylog, m.ymean, m.yscale = int(self.ylog), self.ymean, self.yscale
            self._keep = keep
            self._p, self._one_c, self._batch_c = m, _lib.pr_mlp_one, _lib.pr_mlp_batch
        self.backend = "c" if self._p is not None else "numpy"

    @classmethod
    def from_sklearn(cls, mlp: Any, prep: Any | None, ytrans: Any | None, nfeat: int,
                     force_numpy: bool = False) -> "CompiledMLP":
        """From a fitted MLPRegressor, its Prep (or none) and LogStd (or none)."""
        if getattr(mlp, "n_outputs_", 1) != 1:
            raise NotCompilable("only single-output MLPs")
        st: dict[str, Any] = {"nfeat": nfeat, "act": mlp.activation, "out_act": mlp.out_activation_,
                              "coefs": list(mlp.coefs_), "intercepts": list(mlp.intercepts_),
                              "ylog": ytrans is not None,
                              "ymean": float(ytrans.mean_) if ytrans is not None else 0.0,
                              "yscale": float(ytrans.scale_) if ytrans is not None else 1.0}
        if prep is not None:
            st.update(num_col=prep.num_cols_, num_log=prep.log_, mean=prep.mean_, scale=prep.scale_,
                      cat_col=list(prep.cat_cols), cat_size=list(prep.cat_sizes))
        else:
            st.update(num_col=np.arange(nfeat), num_log=np.zeros(nfeat), mean=np.zeros(nfeat),
                      scale=np.ones(nfeat), cat_col=np.zeros(0), cat_size=np.zeros(0))
        return cls(st, force_numpy)

    def state(self) -> dict[str, Any]:
        return {"type": "mlp", "version": STATE_VERSION, "nfeat": self.nfeat, "num_col": self.num_col,
                "num_log": self.num_log, "mean": self.mean, "scale": self.scale, "cat_col": self.cat_col,
                "cat_size": self.cat_size, "coefs": self.coefs, "intercepts": self.intercepts,
                "act": self.act, "out_act": self.out_act, "ylog": self.ylog, "ymean": self.ymean,
                "yscale": self.yscale}

    def _numpy(self, X: np.ndarray) -> np.ndarray:
        x = X[:, self.num_col]
        x = np.where(self.num_log[None, :] != 0, np.sign(x) * np.log1p(np.abs(x)), x)
        parts = [(x - self.mean) / self.scale]
        for col, size in zip(self.cat_col, self.cat_size):
            parts.append((X[:, col][:, None] == np.arange(size)[None, :]).astype(F64))
        a = np.hstack(parts)
        for i, (w, b) in enumerate(zip(self.coefs, self.intercepts)):
            a = a @ w + b
            act = self.act if i + 1 < len(self.coefs) else self.out_act
            if act == "relu":
                a = np.maximum(a, 0.0)
            elif act == "tanh":
                a = np.tanh(a)
            elif act == "logistic":
                a = 1.0 / (1.0 + np.exp(-a))
            elif act == "exp":
                a = np.exp(a)
        z = a[:, 0]
        return np.exp(z * self.yscale + self.ymean) if self.ylog else z


def compile_estimator(est: Any, force_numpy: bool = False) -> _Compiled:
    """A compiled evaluator for a fitted DecisionTreeRegressor, a forest of
    them, or an MLPRegressor (bare, in a Pipeline after Prep, and/or inside a
    TransformedTargetRegressor with LogStd)."""
    from sklearn.compose import TransformedTargetRegressor
    from sklearn.ensemble import ExtraTreesRegressor, RandomForestRegressor
    from sklearn.neural_network import MLPRegressor
    from sklearn.pipeline import Pipeline
    from sklearn.tree import DecisionTreeRegressor

    from predictors.prep import LogStd, Prep

    if isinstance(est, DecisionTreeRegressor):
        return CompiledForest.from_trees([est.tree_], False, est.n_features_in_, force_numpy)
    if isinstance(est, (RandomForestRegressor, ExtraTreesRegressor)):
        if est.n_jobs not in (None, 1):
            log.warning("predictors: forest fitted with n_jobs=%s: scikit-learn sums its trees "
                        "in thread order, so its predict may differ in the last bit", est.n_jobs)
        return CompiledForest.from_trees([e.tree_ for e in est.estimators_], True, est.n_features_in_,
                                         force_numpy)
    ytrans = None
    if isinstance(est, TransformedTargetRegressor):
        if est.func is not None or not isinstance(est.transformer_, LogStd):
            raise NotCompilable("a target transform other than LogStd")
        ytrans, est = est.transformer_, est.regressor_
    prep = None
    if isinstance(est, Pipeline):
        steps = [s for _, s in est.steps if s is not None and s != "passthrough"]
        if len(steps) == 2 and isinstance(steps[0], Prep):
            prep, est = steps[0], steps[1]
        elif len(steps) == 1:
            est = steps[0]
        else:
            raise NotCompilable(f"pipeline {[type(s).__name__ for s in steps]}")
    if isinstance(est, MLPRegressor):
        nfeat = prep.n_features_in_ if prep is not None else est.n_features_in_
        return CompiledMLP.from_sklearn(est, prep, ytrans, nfeat, force_numpy)
    raise NotCompilable(f"no compiled evaluator for {type(est).__name__}")


def from_state(st: dict[str, Any], force_numpy: bool = False) -> _Compiled:
    """The evaluator that state() described: what a saved model keeps, so that
    loading one needs no scikit-learn (whose import takes about 2 s)."""
    if st.get("version") != STATE_VERSION:
        raise NotCompilable(f"compiled state of version {st.get('version')!r}, this build writes {STATE_VERSION}")
    if st.get("type") == "forest":
        return CompiledForest(st["nodes"], st["roots"], st["average"], st["nfeat"], force_numpy)
    if st.get("type") == "mlp":
        return CompiledMLP(st, force_numpy)
    raise NotCompilable(f"unknown compiled state {st.get('type')!r}")
