"""The knapsack of C-Laius (Eq. 4/5): batch apps' SM units maximising
their summed value under a memory-bandwidth cap, by branch and bound;
knapsack.c is the same search in C (built into _knapsack by build.py),
knapsack_py the reference the tests hold it to.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

log = logging.getLogger("colocate.claius")

try:
    from controlplane.policies._knapsack import ffi as _ffi
    from controlplane.policies._knapsack import lib as _lib
    KS_C_ERROR = ""
except ImportError as e:              # not built: the Python search below
    _ffi = _lib = None
    KS_C_ERROR = str(e)

KS_MAX_APPS = 64                      # knapsack.c's limits
KS_MAX_UNITS = 100
DEFAULT_MAX_NODES = 1_000_000


# --- the knapsack (Eq. 4/5) -------------------------------------------------------

@dataclass
class Packing:
    choice: list[int]                      # units per batch app
    value: float                           # summed predicted IPC
    bw: float                              # summed predicted bandwidth, GB/s
    status: int                            # 0 optimum, 1 node limit hit, 2 nothing meets the cap
    nodes: int


# Lagrange multipliers of the bandwidth cap, as multiples of (best uncapped
# value) / cap: the same list as knapsack.c's ks_lag_scale
KS_LAG_SCALE = (0.25, 0.5, 1.0, 2.0)


def _bounds(V: list[list[float]], nunits: int) -> list[list[float]]:
    """bound[i][u]: the best value apps i.. reach with u units, no cap (Eq. 5's DP)."""
    n = len(V)
    bound = [[0.0] * (nunits + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        nxt, row, out = bound[i + 1], V[i], bound[i]
        for u in range(nunits + 1):
            b = row[0] + nxt[u]
            for k in range(1, u + 1):
                c = row[k] + nxt[u - k]
                if c > b:
                    b = c
            out[u] = b
    return bound


def knapsack_py(value: np.ndarray, bw: np.ndarray, bw_cap: float, use_cap: bool = True,
                max_nodes: int = DEFAULT_MAX_NODES) -> Packing:
    """Eq. 4/5, the Python reference of knapsack.c, step for step: maximise
    sum_i IPC_i(k_i) s.t. sum_i k_i <= N units and (use_cap) sum_i BW_i(k_i)
    <= bw_cap, by branch and bound over apps with the unconstrained DP as
    bound, children best bound first (see knapsack.c for why that is the
    paper's best-first enumeration with rejection)."""
    value = np.asarray(value, dtype=np.float64)
    bwm = np.asarray(bw, dtype=np.float64)
    n, nunits = value.shape[0], value.shape[1] - 1 if value.ndim == 2 else 0
    if n == 0:
        return Packing([], 0.0, 0.0, 0, 0)
    V = [[float(x) for x in row] for row in value]
    bound = _bounds(V, nunits)
    BW = [[float(x) for x in row] for row in bwm]
    minbw = [0.0] * (n + 1)
    for i in range(n - 1, -1, -1):
        minbw[i] = minbw[i + 1] + min(BW[i])
    st: dict[str, Any] = {"best": 0.0, "bw": 0.0, "found": False, "choice": [0] * n, "nodes": 0}
    cur = [0] * n
    # Lagrangian bounds (see knapsack.c): the DP over value - lam * bandwidth
    lams: list[float] = []
    lbounds: list[list[list[float]]] = []
    if use_cap and bw_cap > 0 and bound[0][nunits] > 0:
        lams = [sc * (bound[0][nunits] / bw_cap) for sc in KS_LAG_SCALE]
        lbounds = [_bounds([[V[i][k] - lam * BW[i][k] for k in range(nunits + 1)]
                            for i in range(n)], nunits) for lam in lams]

    def lag(i: int, u: int, rest: float) -> float:
        best = lbounds[0][i][u] + lams[0] * rest
        for m in range(1, len(lams)):
            b = lbounds[m][i][u] + lams[m] * rest
            if b < best:
                best = b
        return best

    def dfs(i: int, left: int, val: float, used: float) -> None:
        if st["nodes"] >= max_nodes:
            st["nodes"] += 1
            return
        st["nodes"] += 1
        if i == n:
            if not st["found"] or val > st["best"]:
                st.update(found=True, best=val, bw=used, choice=list(cur))
            return
        nxt = bound[i + 1]
        scores = [(V[i][k] + nxt[left - k], k) for k in range(left + 1)]
        # best first; equal scores keep ascending k, as the C insertion sort does
        scores.sort(key=lambda s: -s[0])
        for sc, k in scores:
            if st["found"] and val + sc <= st["best"]:
                break
            nused = used + BW[i][k]
            if use_cap and nused + minbw[i + 1] > bw_cap:
                continue
            if lams and st["found"] and val + V[i][k] + lag(i + 1, left - k, bw_cap - nused) <= st["best"]:
                continue
            cur[i] = k
            dfs(i + 1, left - k, val + V[i][k], nused)
            if st["nodes"] >= max_nodes:
                return

    dfs(0, nunits, 0.0, 0.0)
    nodes = min(st["nodes"], max_nodes)
    limited = st["nodes"] >= max_nodes
    if not st["found"]:
        return Packing([0] * n, 0.0, 0.0, 1 if limited else 2, nodes)
    return Packing(st["choice"], st["best"], st["bw"], 1 if limited else 0, nodes)


def knapsack_c_available() -> bool:
    return _lib is not None


def knapsack_c(value: np.ndarray, bw: np.ndarray, bw_cap: float, use_cap: bool = True,
               max_nodes: int = DEFAULT_MAX_NODES) -> Packing:
    """Eq. 4/5 in C (knapsack.c): same search, same answers as knapsack_py."""
    if _lib is None:
        raise RuntimeError(f"controlplane.policies._knapsack is not built ({KS_C_ERROR})")
    value = np.ascontiguousarray(value, dtype=np.float64)
    bwm = np.ascontiguousarray(bw, dtype=np.float64)
    n = value.shape[0]
    if n == 0:
        return Packing([], 0.0, 0.0, 0, 0)
    if value.shape != bwm.shape:
        raise ValueError(f"value {value.shape} and bandwidth {bwm.shape} differ")
    choice = _ffi.new("int[]", n)
    out = _ffi.new("double[2]")
    nodes = _ffi.new("long *")
    rc = _lib.ks_solve(n, value.shape[1] - 1, _ffi.from_buffer("double[]", value),
                       _ffi.from_buffer("double[]", bwm), float(bw_cap), int(use_cap),
                       int(max_nodes), choice, out, out + 1, nodes)
    if rc < 0:
        raise ValueError(f"knapsack: bad instance ({n} apps x {value.shape[1] - 1} units; "
                         f"at most {KS_MAX_APPS} x {KS_MAX_UNITS})")
    return Packing(list(choice), out[0], out[1], rc, nodes[0])


_ks_warned = False


def knapsack(value: np.ndarray, bw: np.ndarray, bw_cap: float, use_cap: bool = True,
             max_nodes: int = DEFAULT_MAX_NODES) -> Packing:
    """The C search when built, else the Python one (logged once)."""
    global _ks_warned
    if _lib is not None and value.shape[0] <= KS_MAX_APPS and value.shape[1] - 1 <= KS_MAX_UNITS:
        return knapsack_c(value, bw, bw_cap, use_cap, max_nodes)
    if not _ks_warned:
        log.warning("claius: C knapsack not available (%s); using the Python search (same "
                    "results, slower). Build it: python -m controlplane.policies.build",
                    KS_C_ERROR or "instance too large")
        _ks_warned = True
    return knapsack_py(value, bw, bw_cap, use_cap, max_nodes)
