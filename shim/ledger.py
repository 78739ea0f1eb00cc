"""Python view of an application's ledger (layout and rules in ledger.h).

    lg = Ledger.create(path, pid, slot)   # controller, before answering "register"
    lg.state()                            # "new" | "live" | "exited"
    lg.kernels()                          # [{"name", "launches", "twin"}], launched ones
    lg.queries()                          # exact counts and run-long percentiles
    lg.close(); path.unlink()

The application writes it (shim/shim_ledger.c); this side only creates and
reads.  Reads are relaxed atomic loads through the C helpers, so a reader
never sees half of a 64-bit value; nkernels is read with acquire before the
entries below it.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

from shim._proto import ffi, lib

STATES = {lib.LG_NEW: "new", lib.LG_LIVE: "live", lib.LG_EXITED: "exited"}
RULES = {0: None, 1: "inferred", 2: "api"}
HBUCKETS: int = lib.LG_HBUCKETS
_U64 = ("exit_ns", "names_used", "kernels_lost", "q_begun", "q_ended", "q_violations",
        "q_lat_sum_ns", "q_lat_max_ns", "msgs_dropped", "tasks_fed", "tasks_sent", "tasks_dropped")


def _load64(p) -> int:
    return lib.cb_load64(ffi.cast("uint64_t *", p))


class Ledger:
    """One mapping of a ledger file."""

    def __init__(self, path: str | os.PathLike, pid: int, slot: int, create: bool = False):
        self.path = Path(path)
        lg = lib.lg_open(os.fsencode(self.path), int(create), pid, slot)
        if lg == ffi.NULL:
            err = ffi.errno
            why = "not a ledger of this version for this pid" if err == errno.EPROTO else os.strerror(err)
            raise OSError(err, f"cannot {'create' if create else 'open'} ledger: {why}", str(path))
        self._lg = lg

    @classmethod
    def create(cls, path: str | os.PathLike, pid: int, slot: int) -> "Ledger":
        return cls(path, pid, slot, create=True)

    def close(self) -> None:
        if self._lg is not None:
            lib.lg_close(self._lg)
            self._lg = None

    def _h(self):
        if self._lg is None:
            raise ValueError("ledger is closed")
        return self._lg

    # --- readers
    def state(self) -> str:
        return STATES.get(lib.cb_load32(ffi.addressof(self._h(), "state")), "?")

    def attached(self) -> bool:
        """Whether the application mapped it (it then counts here)."""
        return self.state() != "new"

    def counters(self) -> dict[str, int]:
        h = self._h()
        out = {n: _load64(ffi.addressof(h, n)) for n in _U64}
        out["nkernels"] = _load64(ffi.addressof(h, "nkernels"))
        return out

    def kernels(self) -> list[dict]:
        """Launched kernels, one entry per name (a name re-registered under
        another handle may have two entries: their counts are summed), in
        first-seen order; twin: True/False on simgpu once the app exited,
        else None."""
        h = self._h()
        n = min(_load64(ffi.addressof(h, "nkernels")), lib.LG_MAX_KERNELS)
        merged: dict[str, dict] = {}
        for i in range(n):
            e = lib.lg_kernel_at(h, i)
            launches = _load64(ffi.addressof(e, "launches"))
            if not launches:
                continue
            p = lib.lg_name_at(h, e.name_off, e.name_len)
            name = ffi.string(p, e.name_len).decode("utf-8", "replace") if p != ffi.NULL else "?"
            twin = {1: True, 0: False}.get(e.twin)
            k = merged.setdefault(name, {"name": name, "launches": 0, "twin": twin})
            k["launches"] += launches
            if twin is not None:
                k["twin"] = twin
        return list(merged.values())

    def histogram(self) -> list[tuple[int, int]]:
        """[(bucket's lowest latency in ns, count)] of the non-empty buckets."""
        h = self._h()
        out = []
        for i in range(HBUCKETS):
            c = _load64(ffi.addressof(h.q_hist, i))
            if c:
                out.append((lib.lg_bucket_low(i), c))
        return out

    def queries(self) -> dict:
        """Exact query counts of the rule in force, and latency over the whole
        run from the histogram (each percentile is its bucket's midpoint:
        within ~1.6 % of the true value)."""
        h = self._h()
        c = self.counters()
        rule = RULES.get(lib.cb_load32(ffi.addressof(h, "q_rule")))
        hist = self.histogram()
        ended = sum(n for _, n in hist)
        out: dict[str, Any] = {"rule": rule, "begun": c["q_begun"], "ended": c["q_ended"],
               "violations": c["q_violations"], "mean_ms": None, "max_ms": None,
               "p50_ms": None, "p99_ms": None}
        if ended:
            out["mean_ms"] = c["q_lat_sum_ns"] / max(1, c["q_ended"]) / 1e6
            out["max_ms"] = c["q_lat_max_ns"] / 1e6
            out["p50_ms"] = _percentile(hist, ended, 50) / 1e6
            out["p99_ms"] = _percentile(hist, ended, 99) / 1e6
        return out

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _percentile(hist: list[tuple[int, int]], total: int, p: float) -> float:
    """Nearest-rank percentile over (low, count) buckets: the midpoint of the
    bucket that holds it."""
    rank = max(1, -(-total * p // 100))
    seen = 0
    for low, n in hist:
        seen += n
        if seen >= rank:
            width = 1 << (low.bit_length() - 1 - lib.LG_HSUB_BITS) if low >= lib.LG_HSUB else 1
            return low + (width - 1) / 2
    return float(hist[-1][0])
