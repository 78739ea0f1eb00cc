"""Build step of the compiled predictors: the cffi module predictors._cinfer
(forest.c, mlp.c; see infer.h).

setup.py hands `ffibuilder` to cffi (cffi_modules); `python -m
predictors.build` builds it in place, next to the package, when a source is
newer than the module.  Without it, predictors.compiled falls back to numpy
(same results, slower) and says so.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
SOURCES = ("forest.c", "mlp.c")
HEADERS = ("infer.h",)

CDEF = """
struct pr_node { double v; int32_t left; int32_t right; int32_t feat; int32_t nan_left; };
struct pr_forest { const struct pr_node *nodes; const int32_t *roots; int32_t ntrees;
                   int32_t average; };
double pr_forest_one(const struct pr_forest *f, const double *x);
void pr_forest_batch(const struct pr_forest *f, const double *X, int64_t nrows, int64_t stride,
                     double *out);
#define PR_IDENTITY 0
#define PR_RELU 1
#define PR_TANH 2
#define PR_LOGISTIC 3
#define PR_EXP 4
#define PR_MLP_MAX_WIDTH 256
struct pr_mlp { int32_t nnum; const int32_t *num_col; const int32_t *num_log;
                const double *mean; const double *inv_scale;
                int32_t ncat; const int32_t *cat_col; const int32_t *cat_size;
                int32_t nlayers; const int32_t *width; const double *w; const double *b;
                int32_t act; int32_t out_act; int32_t ylog; double ymean; double yscale; };
double pr_mlp_one(const struct pr_mlp *m, const double *x);
void pr_mlp_batch(const struct pr_mlp *m, const double *X, int64_t nrows, int64_t stride,
                  double *out);
"""


def make_ffi(base: Path) -> FFI:
    """The cffi builder, with paths under base (relative for setuptools,
    absolute for an in-place build)."""
    ffi = FFI()
    ffi.cdef(CDEF)
    ffi.set_source("predictors._cinfer", '#include "infer.h"',
                   sources=[str(base / s) for s in SOURCES], include_dirs=[str(base)],
                   # -O3 vectorises the MLP's inner loop; no -ffast-math anywhere:
                   # the trees must round exactly as scikit-learn does
                   extra_compile_args=["-O3", "-std=gnu11", "-Wall", "-fno-fast-math"],
                   libraries=["m"])
    return ffi


ffibuilder = make_ffi(Path(os.path.relpath(HERE)))


def build_inplace(force: bool = False) -> Path:
    """Compile predictors/_cinfer*.so when missing or older than its sources."""
    from shim.build import cffi_inplace  # not at the top: setup.py runs this file alone
    return cffi_inplace(make_ffi, HERE, "_cinfer", [HERE / s for s in SOURCES + HEADERS] + [Path(__file__)], force)


if __name__ == "__main__":
    build_inplace(force="--force" in sys.argv)
