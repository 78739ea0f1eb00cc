"""Scaling for the models that need it (MLP, KNN, LR); trees take raw features.

Prep: numeric features -> sign(x) * log1p(|x|), then standardised (sizes span
six orders of magnitude; a log makes "twice as big" the same step everywhere);
categorical codes -> one-hot columns after the numeric ones (an unknown code
gives all zeros).  LogStd: the target -> standardised log, so a model fitted
with squared error minimises relative error, which is what MAPE measures.

Both are plain sklearn transformers so that a Pipeline pickles with them, and
both are written down simply enough for compiled.py to redo them in C.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin


def slog(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


class Prep(BaseEstimator, TransformerMixin):
    def __init__(self, cat_cols: Sequence[int] = (), cat_sizes: Sequence[int] = (),
                 lin_cols: Sequence[int] = ()):
        self.cat_cols = cat_cols
        self.cat_sizes = cat_sizes
        self.lin_cols = lin_cols

    def fit(self, X: np.ndarray, y: np.ndarray | None = None) -> "Prep":
        X = np.asarray(X, dtype=np.float64)
        cats = set(self.cat_cols)
        self.num_cols_ = np.array([j for j in range(X.shape[1]) if j not in cats], dtype=np.int64)
        self.log_ = np.array([j not in set(self.lin_cols) for j in self.num_cols_], dtype=bool)
        z = self._scale(X)
        self.mean_ = z.mean(axis=0)
        sd = z.std(axis=0)
        self.scale_ = np.where(sd > 0, sd, 1.0)
        self.n_features_in_ = X.shape[1]
        return self

    def _scale(self, X: np.ndarray) -> np.ndarray:
        x = X[:, self.num_cols_]
        return np.where(self.log_[None, :], slog(x), x)

    def transform(self, X: np.ndarray) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        z = (self._scale(X) - self.mean_) / self.scale_
        parts = [z]
        for col, size in zip(self.cat_cols, self.cat_sizes):
            code = X[:, col]
            parts.append((code[:, None] == np.arange(size)[None, :]).astype(np.float64))
        return np.hstack(parts)


class LogStd(BaseEstimator, TransformerMixin):
    """y -> (log y - mean) / scale; targets must be positive."""

    def fit(self, y: np.ndarray, _: object = None) -> "LogStd":
        ly = np.log(np.asarray(y, dtype=np.float64))
        self.mean_ = float(ly.mean())
        sd = float(ly.std())
        self.scale_ = sd if sd > 0 else 1.0
        return self

    def transform(self, y: np.ndarray) -> np.ndarray:
        return (np.log(np.asarray(y, dtype=np.float64)) - self.mean_) / self.scale_

    def inverse_transform(self, z: np.ndarray) -> np.ndarray:
        return np.exp(np.asarray(z, dtype=np.float64) * self.scale_ + self.mean_)
