"""Table I stages in one process, one query at a time: the results a live
pipeline of the same stages must produce (`colocate pipeline run` batches
queries and hands buffers between processes; neither may change a query's
bytes).  Prints a JSON list of each query's CRC-32, the last stage's output
as the pipeline's last stage reports it.

    colocate run --device sim -- python bench/camelot/chain.py \\
        --kinds semantic-understanding,image-generation --scale 0.01 --queries 8

The query inputs are controlplane.pipeline.query_input's, sized as the
runner sizes them (the service's input, suite.SERVICE_INPUT_MB).

--check instead runs each stage alone on a batch of --queries queries and
compares its result with the CPU reference forward pass (bench/tonic/ref.c,
the same tolerance as `tonic-service --check`: |got - ref| <= 1e-6 + 1e-3
|ref|); prints {stage: {"max_abs", "bad", "n", "distinct"}} and exits 1 on
a mismatch.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import sys
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
for _p in (str(ROOT), str(ROOT / "bench")):
    if _p not in sys.path:
        sys.path.insert(0, _p)
from camelot.stage_worker import F32, NETS, NetStage, load_lib, load_tonic  # noqa: E402
from camelot.suite import MB, first_input_mb  # noqa: E402

from controlplane.pipeline import query_input  # noqa: E402


def first_in_n(kind: str) -> int:
    """Floats per query the runner sends the first stage (Pipeline.in_n(0))."""
    return max(1, round(first_input_mb(kind) * MB / F32))


def checksums(kinds: list[str], scale: float, queries: int) -> list[int]:
    lib, tlib = load_lib(), load_tonic()
    in_n = first_in_n(kinds[0])
    stages = [NetStage(lib, tlib, k, scale, in_n if i == 0 else 0, 1) for i, k in enumerate(kinds)]
    out = []
    for q in range(queries):
        x = query_input(q, in_n)
        for st in stages:
            x = st.run_host(x, 1)
        out.append(zlib.crc32(x.tobytes()))
    for st in stages:
        st.close()
    return out


def check(kinds: list[str], scale: float, queries: int) -> dict[str, dict]:
    lib, tlib = load_lib(), load_tonic()
    out = {}
    for k in kinds:
        in_n = first_in_n(k)
        st = NetStage(lib, tlib, k, scale, in_n, queries)
        x = np.concatenate([query_input(q, in_n) for q in range(queries)]).astype(np.float32)
        got = st.run_host(x, queries)
        ref = np.empty_like(got)
        err = ctypes.create_string_buffer(512)
        if tlib.camelot_tonic_reference(st.h, x.ctypes.data, in_n, queries, ref.ctypes.data, err, len(err)):
            raise RuntimeError(f"{k}: {err.value.decode(errors='replace')}")
        diff = np.abs(got.astype(np.float64) - ref)
        bad = int(np.count_nonzero(~(diff <= 1e-6 + 1e-3 * np.abs(ref))))
        rows = got.reshape(queries, -1)
        out[k] = {"max_abs": float(diff.max()), "bad": bad, "n": int(got.size),
                  "distinct": len({r.tobytes() for r in rows})}       # queries with results of their own
        st.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", required=True, help=f"comma-separated Table I stages ({', '.join(NETS)})")
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--queries", type=int, default=8)
    ap.add_argument("--check", action="store_true", help="each stage against the CPU reference instead")
    a = ap.parse_args(argv)
    kinds = a.kinds.split(",")
    bad = [k for k in kinds if k not in NETS]
    if bad:
        ap.error(f"unknown stage(s) {', '.join(bad)}: one of {', '.join(NETS)}")
    if a.check:
        res = check(kinds, a.scale, a.queries)
        print(json.dumps(res))
        return 1 if any(r["bad"] for r in res.values()) else 0
    print(json.dumps(checksums(kinds, a.scale, a.queries)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
