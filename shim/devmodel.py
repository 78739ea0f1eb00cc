"""simgpu's device model in virtual time, for a trace-driven simulator.

The engine is shim/simgpu/engine.c itself, the code the live simgpu device
runs (model.c keeps one engine state in shared memory and advances it with
the wall clock), compiled into the cffi module shim._devmodel.  Here one
engine state is advanced by whoever drives it, so a simulated device and a
live one give the same times for the same tasks: there is no second model.

    dev = Device(default_params(mps=True, slowdown=1000))
    i = dev.add(KERNEL, blocks=264, threads=256, regs=0, smem=0, flops=1e9,
                bytes=1e6, quota_sms=quota_sms(50, 132), ctx=1, t=0.0)
    t, done = dev.advance_to_next()       # (device s, [Done(entry, start, end)])

A simulator loop admits each task at its arrival (add advances the device to
that time first) and otherwise steps from event to event: advance_to_next()
returns the tasks that finished, and frees their entries.
"""
from __future__ import annotations

import math
import os
import threading
from typing import Any, NamedTuple

from shim import paths
from shim._devmodel import ffi, lib

KERNEL: int = lib.SIMGPU_T_KERNEL
H2D: int = lib.SIMGPU_T_H2D
D2H: int = lib.SIMGPU_T_D2H
# simgpu_model_simulate's limit too: the engine keeps per-event scratch on
# the stack, in proportion to its table
MAX_TASKS = 16384

Params = Any        # cdata 'struct simgpu_model_params *'


class DeviceFull(RuntimeError):
    """The task table holds MAX_TASKS tasks that are running or finished but
    not collected: nothing more can be admitted until some are dropped."""


class Done(NamedTuple):
    entry: int       # the entry it had (now free: a later add may reuse it)
    start: float     # device s its first block was dispatched (copy: began)
    end: float       # device s its last block retired


# ---------------------------------------------------------------- parameters

_preset: Params = None
_preset_lock = threading.Lock()


def _compiled_in() -> Params:
    """The compiled-in preset, from simgpu's own config code
    (simgpu_model_params_get in libcudart.so.13: no device is started).  It
    reads the environment once per process, so SIMGPU_* settings (all but
    SIMGPU_DIR, which only names where a device would live) are hidden from
    it for that one call: the simulator's device is the preset, whatever
    this process's environment says."""
    global _preset
    with _preset_lock:
        if _preset is not None:
            return _preset
        if not paths.SIMGPU_CUDART.exists():
            raise FileNotFoundError(f"{paths.SIMGPU_CUDART} missing: run `make build`")
        from cffi import FFI
        abi = FFI()
        abi.cdef("int simgpu_model_params_get(void *p);")
        cudart = abi.dlopen(str(paths.SIMGPU_CUDART), abi.RTLD_NOW | abi.RTLD_LOCAL)
        hidden = {k: v for k, v in os.environ.items() if k.startswith("SIMGPU_") and k != "SIMGPU_DIR"}
        p = ffi.new("struct simgpu_model_params *")
        try:
            for k in hidden:
                del os.environ[k]
            rc = cudart.simgpu_model_params_get(abi.cast("void *", ffi.cast("uintptr_t", p)))
        finally:
            os.environ.update(hidden)
        if rc != 0 or p.abi != lib.SIMGPU_MODEL_ABI:
            raise RuntimeError(f"{paths.SIMGPU_CUDART}: model ABI {p.abi}, this module's "
                               f"{lib.SIMGPU_MODEL_ABI}: rebuild (`make build`)")
        _preset = p
        return p


def default_params(mps: bool = True, slowdown: float = 1.0) -> Params:
    """The compiled-in H100 preset, as the device of bench/colocation.py
    (device_env) sets it: slowdown divides SIMGPU_SM_GFLOPS, SIMGPU_BW_GBS
    and SIMGPU_SM_BW_GBS; mps=False time-slices contexts (SIMGPU_MPS=0).  A fresh
    struct the caller may change."""
    if not slowdown > 0 or not math.isfinite(slowdown):
        raise ValueError(f"slowdown {slowdown}: want a positive number")
    base = _compiled_in()
    p = ffi.new("struct simgpu_model_params *")
    p[0] = base[0]
    p.mps = 1 if mps else 0
    if slowdown != 1.0:
        # the same arithmetic as config.c on the settings device_env writes
        p.sm_flops = (base.sm_flops / 1e9 / slowdown) * 1e9
        p.bw = (base.bw / 1e9 / slowdown) * 1e9
        p.sm_bw = (base.sm_bw / 1e9 / slowdown) * 1e9
    return p


def quota_sms(pct: float, sms: int) -> int:
    """SMs a process's MPS percentage allows, as the live simgpu counts them
    and as an H100 and an H200 gave them (engine.c en_quota_sms, which
    config.c calls too): the percentage's SMs rounded down to whole TPCs, at
    least one TPC, every SM at 100 % (10 % of 132 is 12, 40 % is 52)."""
    if not 1e-9 <= pct <= 100:
        raise ValueError(f"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE {pct}: want (0, 100]")
    return int(lib.en_quota_sms(pct, sms))


def _fill(d: Any, kind: int, blocks: float, threads: float, regs: float, smem: float,
          flops: float, nbytes: float, quota: float) -> None:
    """A struct simgpu_model_task, checked as simgpu_model_simulate checks
    one (the engine itself trusts its caller)."""
    if kind not in (KERNEL, H2D, D2H):
        raise ValueError(f"task kind {kind}: want KERNEL, H2D or D2H")
    if not (math.isfinite(blocks) and math.isfinite(threads) and math.isfinite(regs)
            and math.isfinite(smem) and math.isfinite(quota) and math.isfinite(flops)
            and math.isfinite(nbytes) and flops >= 0 and nbytes >= 0):
        raise ValueError(f"task {(blocks, threads, regs, smem, flops, nbytes, quota)}: "
                         f"want finite numbers, flops and bytes >= 0")
    d.kind = kind
    d.blocks = blocks
    d.threads = threads
    d.regs = regs
    d.smem = smem
    d.flops = flops
    d.bytes = nbytes
    d.quota_sms = quota


def solo(params: Params, kind: int, blocks: float, threads: float, regs: float, smem: float,
         flops: float, bytes: float, quota_sms: float) -> float:
    """Seconds a task takes alone on the device (en_solo: what the live
    device charges each kernel at timescale 0)."""
    d = ffi.new("struct simgpu_model_task *")
    _fill(d, kind, blocks, threads, regs, smem, flops, bytes, quota_sms)
    return float(lib.en_solo(params, d))


# ---------------------------------------------------------------- the device

class Device:
    """One engine state: the tasks on one device, in device seconds.

    Entries are indices into the engine's table; a finished task keeps its
    entry (finished, times) until drop() or collect() frees it.  The table
    grows as needed up to MAX_TASKS entries in use."""

    def __init__(self, params: Params | None = None, cap: int = 64, hold_s: float = 0.0) -> None:
        """hold_s: without MPS, how long a context whose stream has its next
        kernel queued (add(..., follow=True)) keeps the device; the live
        device holds 2 ms of wall time (model.c), 2e-3 / timescale device s."""
        self.params: Params = ffi.new("struct simgpu_model_params *")
        self.params[0] = (params if params is not None else default_params())[0]
        cap = max(1, min(int(cap), MAX_TASKS))
        st = lib.dm_new(self.params, cap)
        if st == ffi.NULL:
            raise MemoryError(f"device model state for {cap} tasks")
        self._st = ffi.gc(st, lib.dm_free)
        self._st.hold_s = hold_s
        self._task = ffi.new("struct simgpu_model_task *")
        self._bufs(cap)

    def _bufs(self, cap: int) -> None:
        self._idx = ffi.new("int[]", cap)
        self._t0 = ffi.new("double[]", cap)
        self._t1 = ffi.new("double[]", cap)

    @property
    def cap(self) -> int:
        return int(self._st.cap)

    @property
    def now(self) -> float:
        """Device time of the last event or admission."""
        return float(self._st.t_ref)

    @property
    def events(self) -> int:
        """Events the engine has handled (its cost)."""
        return int(self._st.events)

    def _grow(self) -> None:
        cap = self.cap
        if cap >= MAX_TASKS:
            raise DeviceFull(f"device model: {cap} tasks running or finished and not collected "
                             f"(at most {MAX_TASKS}): collect() or drop() finished ones")
        new = min(MAX_TASKS, 2 * cap)
        st = lib.dm_grow(self._st, new)
        if st == ffi.NULL:
            raise MemoryError(f"device model state for {new} tasks")
        ffi.gc(self._st, None)          # realloc freed or kept it: st owns it now
        self._st = ffi.gc(st, lib.dm_free)
        self._bufs(new)

    def add(self, kind: int, blocks: float, threads: float, regs: float, smem: float, flops: float,
            bytes: float, quota_sms: float, ctx: int, t: float, follow: bool = False,
            lead: float | None = None) -> int:
        """Admit a task at device time t (the device is advanced to t first:
        tasks due before it finish first); its entry.  A kernel is blocks of
        threads, regs per thread (0: the preset's default), smem bytes per
        block, flops and bytes in all, on at most quota_sms SMs; a copy
        (H2D, D2H) is bytes alone.  ctx is its process (time slicing).
        lead: its stream's next task is already queued and starts lead after
        its end, so when it ends the device handles no event past that until
        keep(task_id(entry)) (the live device's waits, model.c)."""
        if not t >= self.now:
            raise ValueError(f"task at {t} s: the device is at {self.now} s already")
        if t > self.barrier():
            raise ValueError(f"task at {t} s: the device waits for a queued task due at "
                             f"{self.barrier()} s (keep() it first)")
        _fill(self._task, kind, blocks, threads, regs, smem, flops, bytes, quota_sms)
        self.advance(t)
        i = lib.en_add(self._st, self._task, ctx, t, ffi.NULL, ffi.NULL)
        while i < 0:
            self._grow()
            i = lib.en_add(self._st, self._task, ctx, t, ffi.NULL, ffi.NULL)
        e = lib.dm_task(self._st, i)
        e.follow = 1 if follow else 0
        e.queued = 0 if lead is None else 1
        e.lead = 0.0 if lead is None else lead
        return int(i)

    def task_id(self, i: int) -> int:
        """The engine's id of entry i's task (what keep() names)."""
        return int(self._entry(i).id)

    def barrier(self, mine: int = 0) -> float:
        """Device time past which no event is handled yet: the earliest wait
        for a queued task (but that of the task queued after task `mine`);
        inf when none."""
        return float(lib.en_barrier(self._st, mine))

    def expect(self, ctx: int, t: float) -> int:
        """A wait for a task due at t that no task's end announces; its token
        for keep(), 0 when t is past or the wait table is full."""
        return int(lib.en_expect(self._st, ctx, t))

    def keep(self, after: int) -> bool:
        """The task queued after task `after` (or expect()'s token) joins:
        its wait ends (whether there was one).  Then add() it."""
        return bool(lib.en_keep(self._st, after))

    def stamp(self, now: float, window: float) -> None:
        """Deadlines for the waits that have none: window after their start
        or after now, whichever is later (the live device does this after
        every advance, with $SIMGPU_WAIT_US)."""
        lib.en_stamp(self._st, now, window)

    def lapse(self, now: float, ctx: int = 0) -> int:
        """Give up the waits whose deadline (stamp()) is before now, or all
        of context ctx's (ctx != 0); how many."""
        return int(lib.en_lapse(self._st, now, ctx))

    def advance(self, t: float) -> None:
        """Handle every event up to device time t, or up to barrier() where a
        wait for a queued task holds the device (then it stops there)."""
        lib.en_advance(self._st, t, ffi.NULL, ffi.NULL)
        if self._st.stalled:
            raise RuntimeError("device model stopped at its event guard (a bug in engine.c, "
                               "or absurd parameters)")

    def next_event(self) -> float:
        """Device time of the next event; inf when nothing is pending."""
        return float(lib.en_next_event(self._st))

    def _entry(self, i: int) -> Any:
        if not 0 <= i < self.cap:
            raise IndexError(f"task entry {i} (table of {self.cap})")
        return lib.dm_task(self._st, i)

    def finished(self, i: int) -> bool:
        return bool(self._entry(i).state == lib.EN_DONE)

    def times(self, i: int) -> tuple[float, float]:
        """(start, end) in device s; start -1 until its first block is
        dispatched, end -1 until it finishes."""
        e = self._entry(i)
        return float(e.t_start), float(e.t_end)

    def drop(self, i: int) -> None:
        """Free entry i; a running task stops competing (its process died)."""
        self._entry(i)
        lib.en_drop(self._st, i, ffi.NULL, ffi.NULL)

    def collect(self) -> list[Done]:
        """The finished tasks, their entries freed."""
        n = lib.dm_collect(self._st, self._idx, self._t0, self._t1, self.cap)
        return [Done(self._idx[j], self._t0[j], self._t1[j]) for j in range(n)]

    def advance_to_next(self) -> tuple[float, list[Done]]:
        """Step to the next event: its time and the tasks that finished by
        then (collected); (inf, []) when nothing is pending.  An event may
        finish nothing (a time slice ends, a wave of blocks retires)."""
        t = self.next_event()
        if math.isinf(t):
            return t, self.collect()
        if t > self.barrier():
            raise RuntimeError(f"the next event, at {t} s, waits for a queued task due at "
                               f"{self.barrier()} s (keep() or lapse() it)")
        self.advance(t)
        return t, self.collect()

    def run_until_done(self, i: int) -> tuple[float, float]:
        """Advance event by event until task i finishes; its (start, end).
        Other tasks keep their entries."""
        while not self.finished(i):
            t = self.next_event()
            if math.isinf(t):
                raise RuntimeError(f"task {i} never finishes (no event pending)")
            if t > self.barrier():
                raise RuntimeError(f"task {i} waits for a queued task due at {self.barrier()} s "
                                   f"(keep() or lapse() it)")
            self.advance(t)
        return self.times(i)

    def solo(self, kind: int, blocks: float, threads: float, regs: float, smem: float, flops: float,
             bytes: float, quota_sms: float) -> float:
        """Seconds the task would take alone on this device."""
        _fill(self._task, kind, blocks, threads, regs, smem, flops, bytes, quota_sms)
        return float(lib.en_solo(self.params, self._task))
