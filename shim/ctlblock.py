"""Python view of the shared control block (layout in ctlblock.h).

    cb = ControlBlock.create(path)        # controller: fresh, zeroed block
    slot = cb.claim(pid)
    cb.set_route(slot, route=0, quota_pct=40)
    cb.counters(slot)["launches"]
    cb.release(slot)

All reads go through the C helpers' relaxed atomic loads, so a reader never
sees half of a 64-bit value an application is writing.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path

from shim._proto import ffi, lib

NSLOTS: int = lib.CB_MAX_SLOTS
FREE, LIVE, EXITED = lib.CB_SLOT_FREE, lib.CB_SLOT_LIVE, lib.CB_SLOT_EXITED
ROUTE_LOCAL: int = lib.CB_ROUTE_LOCAL
# CB_ROUTE_HOLD (ctlblock.h): the app's next kernel launch waits until the
# route changes again.
ROUTE_HOLD: int = lib.CB_ROUTE_HOLD
COUNTERS = ("launches", "forwarded", "h2d_bytes", "d2h_bytes", "allocs_live",
            "alloc_bytes_live", "syncs", "last_sync_ns")
SIGNED = {"allocs_live", "alloc_bytes_live"}
CONTROL32 = ("state", "pid", "route", "quota_pct",
             "part_sms", "part_total", "part_local", "part_first")     # part_*: in the control line, written by the app
# CB_ROUTE_PART | pct: the app runs its launches on an SM partition of about
# pct % of the device (green contexts, shim_part.c).
ROUTE_PART: int = lib.CB_ROUTE_PART


def is_partition(route: int) -> bool:
    """CB_ROUTE_PART | pct: an SM partition inside the app."""
    return route & 0xFFFF0000 == ROUTE_PART


def part_sms(pct: int, total: int, gran: int) -> int:
    """SMs of the partition for pct % of `total` SMs in multiples of `gran`
    (cb_part_sms in ctlblock.h: the shim's rounding)."""
    if not 1 <= pct <= 100 or total < 1 or gran < 1:
        raise ValueError(f"part_sms({pct}, {total}, {gran}): want pct 1..100, total and gran >= 1")
    return int(lib.cb_part_sms(pct, total, gran))


def part_span_sms(start: int, pct: int, total: int, gran: int) -> tuple[int, int]:
    """(first SM, SMs) of the partition spanning start % to start + pct % of
    `total` SMs in groups of `gran` (cb_part_span_sms in ctlblock.h: a span
    that ends at the last group has the SMs no group took too, as the
    shim's partition in shim_part.c)."""
    if not 1 <= pct <= 100 or not 0 <= start <= 255 or total < 1 or gran < 1:
        raise ValueError(f"part_span_sms({start}, {pct}, {total}, {gran}): bad arguments")
    first, sms = ffi.new("unsigned *"), ffi.new("unsigned *")
    lib.cb_part_span_sms(start, pct, total, gran, first, sms)
    return first[0], sms[0]


def part_starts(apps: list[tuple[bool, int, int]]) -> dict[int, int]:
    """Where each app's span starts, in % of the device: (is_qos, slot, pct)
    of the apps on partitions -> slot: start.  QoS apps first, then batch
    apps, each in slot order, one after another (the controller's placement:
    disjoint SMs while the quotas sum to 100 % or less, but for a small span
    that rounds onto the last group a larger span reaches: README)."""
    out, start = {}, 0
    for _, slot, pct in sorted(apps, key=lambda a: (not a[0], a[1])):
        out[slot] = min(start, 99)
        start += pct
    return out


def is_worker(route: int) -> bool:
    """A process-pool worker's id (not local, held or a partition)."""
    return route not in (ROUTE_LOCAL, ROUTE_HOLD) and not is_partition(route)


CONTROL64 = ("route_epoch", "d2d_bytes", "registered_ns",
             "held_ns")                # held_ns: in the control line, written by the app


def stop_flag():
    """A flag ControlBlock.flip_routes polls: set it with flag[0] = 1."""
    return ffi.new("int *")


class ControlBlockFull(RuntimeError):
    pass


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


class ControlBlock:
    """One mapping of the control block file."""

    def __init__(self, path: str | os.PathLike, create: bool = False):
        self.path = Path(path)
        cb = lib.cb_open(os.fsencode(self.path), int(create))
        if cb == ffi.NULL:
            err = ffi.errno
            why = "not a control block of this version" if err == errno.EPROTO else os.strerror(err)
            raise OSError(err, f"cannot {'create' if create else 'open'} control block: {why}", str(path))
        self._cb = cb

    @classmethod
    def create(cls, path: str | os.PathLike) -> "ControlBlock":
        return cls(path, create=True)

    def close(self) -> None:
        if self._cb is not None:
            lib.cb_close(self._cb)
            self._cb = None

    def __enter__(self) -> "ControlBlock":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _block(self):
        if self._cb is None:
            raise ValueError("control block is closed")
        return self._cb

    def _slot(self, slot: int):
        if not 0 <= slot < NSLOTS:
            raise IndexError(f"slot {slot} out of range 0..{NSLOTS - 1}")
        return self._block().slots[slot]

    # --- controller side
    def claim(self, pid: int) -> int:
        slot = lib.cb_claim_slot(self._block(), pid)
        if slot < 0:
            raise ControlBlockFull(f"control block full ({NSLOTS} apps)")
        return slot

    def release(self, slot: int) -> None:
        self._slot(slot)
        lib.cb_release_slot(self._cb, slot)

    def set_route(self, slot: int, route: int, quota_pct: int) -> int:
        """Publish (route, quota_pct) under a new route epoch.  Returns
        time.monotonic_ns() just after the publishing store, read in C: what
        a benchmark times a route change from."""
        self._slot(slot)
        return int(lib.cb_set_route(self._cb, slot, route, quota_pct))

    def flip_routes(self, slot: int, routes: list[int], quota_pct: int, period_s: float,
                    stop, max_writes: int) -> list[tuple[int, int, int]]:
        """A benchmark's flipper: publish routes[k % len(routes)], each write
        period_s after the last began, until stop[0] (from stop_flag()) is
        set (seen within a period) or max_writes are made, in C with the GIL
        released (cb_flip_routes: after a write it only goes back to sleep).
        Returns (monotonic ns before, route, ns just after the publishing
        store) per write."""
        self._slot(slot)
        if not routes or period_s <= 0 or not 0 < max_writes <= 1 << 30:
            raise ValueError("flip_routes needs routes, a period > 0 and 0 < max_writes <= 2**30")
        rs = ffi.new("uint32_t[]", routes)
        stamps = ffi.new("uint64_t[]", 2 * max_writes)
        n = lib.cb_flip_routes(self._cb, slot, rs, len(routes), quota_pct, int(period_s * 1e9),
                               stop, stamps, max_writes)
        if n < 0:
            raise OSError("cb_flip_routes refused its arguments or found no monotonic clock")
        return [(stamps[2 * k], routes[k % len(routes)], stamps[2 * k + 1]) for k in range(n)]

    # --- readers
    def counters(self, slot: int) -> dict[str, int]:
        c = self._slot(slot).c
        out = {}
        for name in COUNTERS:
            v = lib.cb_load64(ffi.cast("uint64_t *", ffi.addressof(c, name)))
            out[name] = _signed(v) if name in SIGNED else v
        return out

    def control(self, slot: int) -> dict[str, int]:
        k = self._slot(slot).k
        out = {n: lib.cb_load32(ffi.addressof(k, n)) for n in CONTROL32}
        out.update({n: lib.cb_load64(ffi.addressof(k, n)) for n in CONTROL64})
        return out

    def held(self, slot: int) -> bool:
        """Whether the controller holds the slot's kernel launches."""
        return self.control(slot)["route"] == ROUTE_HOLD

    def header(self) -> dict[str, int]:
        h = self._block().hdr
        return {n: getattr(h, n) for n in ("magic", "version", "nslots", "slot_size",
                                           "controller_pid", "generation", "created_ns")}

    # --- application side (tests and simulators play the shim with this)
    def write_held_ns(self, slot: int, value: int) -> None:
        ffi.addressof(self._slot(slot).k, "held_ns")[0] = value

    def write_counters(self, slot: int, **values: int) -> None:
        c = self._slot(slot).c
        for name, v in values.items():
            if name not in COUNTERS:
                raise KeyError(f"unknown counter {name!r} (known: {', '.join(COUNTERS)})")
            setattr(c, name, v)
