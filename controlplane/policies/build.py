"""Build step of the C-Laius knapsack: the cffi module
controlplane.policies._knapsack (knapsack.c).

setup.py hands `ffibuilder` to cffi (cffi_modules); `python -m
controlplane.policies.build` builds it in place, next to the package, when
knapsack.c is newer than the module.  Without it, claius.py falls back to
its Python reference search (same results, slower) and says so.

This module is imported by policies._load_all() like any other module of
the package: importing it only describes the build, it compiles nothing.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent
SOURCES = ("knapsack.c",)

CDEF = """
int ks_solve(int napps, int nunits, const double *value, const double *bw, double bw_cap,
             int use_cap, long max_nodes, int *choice, double *value_out, double *bw_out,
             long *nodes_out);
"""


def make_ffi(base: Path) -> FFI:
    """The cffi builder, with paths under base (relative for setuptools,
    absolute for an in-place build)."""
    ffi = FFI()
    ffi.cdef(CDEF)
    # no -ffast-math: the C and Python searches must add and compare alike
    ffi.set_source("controlplane.policies._knapsack", CDEF,
                   sources=[str(base / s) for s in SOURCES],
                   extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-fno-fast-math"])
    return ffi


ffibuilder = make_ffi(Path(os.path.relpath(HERE)))


def build_inplace(force: bool = False) -> Path:
    """Compile controlplane/policies/_knapsack*.so when missing or older than its sources."""
    from shim.build import cffi_inplace  # not at the top: setup.py runs this file alone
    return cffi_inplace(make_ffi, HERE, "_knapsack", [HERE / s for s in SOURCES] + [Path(__file__)], force)


if __name__ == "__main__":
    build_inplace(force="--force" in sys.argv)
