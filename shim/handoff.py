"""Pipeline hand-off of device buffers between processes: Camelot's global
memory-based communication (§VI-B, Fig. 10) with reference counts.

A stage exports a device buffer as a handle (256 bytes, one ZeroMQ frame),
the next stage opens it and reads the same device memory without a copy;
the buffer is freed when the exporter and every importer have released it,
or died.  An importer that cannot map the buffer (another GPU, or it asks
for host memory) gets a copy, counted in `Importer.stats()["copies"]`.

    # stage 1                                   # stage 2
    ex = handoff.Exporter()
    buf = ex.alloc(n)                           view = handoff.open_handle(frame)
    ... kernels write buf.ptr ...               ... kernels read view.ptr ...
    sock.send(ex.export(buf)); ex.drop(buf)     view.release()

export() pays one reference in advance for the consumer (consumers=1): the
handle in flight keeps the buffer, so dropping it right after sending is
safe; the consumer's open takes that reference over.  One nobody claims is
dropped after the exporter's pre-paid timeout (30 s; Exporter(...,
prepaid_timeout_s=...)) or by Exporter.revoke().  An importer keeps a
buffer's mapping after release (the next handle of it opens without
mapping again); that holds the buffer too, until the importer's next call
after the exporter dropped it (or Importer.trim()).

This is a thin cffi (ABI mode) layer over shim/lib/libcolocate_handoff.so
(C API: shim/include/colocate_handoff.h, which documents the protocol and
what an importer must do when its exporter dies).  NumPy views
(`Buffer.numpy()`, `View.numpy()`) exist where the CPU can read the memory:
simgpu's device memory, which is host memory at the same address in every
process of the device, and host copies.  With CuPy importable, `.cupy()`
gives a CuPy array of the memory and `export()` accepts CuPy arrays.
"""
from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np
from cffi import FFI

from shim import paths

ABI = 1
HANDLE_BYTES = 256

_CDEF = """
struct colocate_handoff_handle {
    uint32_t magic; uint16_t version; uint16_t kind; uint32_t pid; uint32_t uid;
    uint64_t id; uint64_t gen; uint64_t size; int32_t device; uint32_t reserved;
    uint8_t uuid[16]; uint8_t ipc[64]; char path[108]; uint8_t pad[12]; uint64_t checksum;
};
struct colocate_handoff_view { void *ptr; uint64_t size; int32_t device; uint32_t how; uint64_t token; };
struct colocate_handoff_exporter_stats {
    uint64_t live_buffers, held_refs, connections, exports, acquires, releases,
             refs_dropped_dead, frees, copies_served, copy_bytes;
};
struct colocate_handoff_importer_stats {
    uint64_t open_views, connections, maps, copies, copy_bytes, gone;
};
struct colocate_handoff_importer_cache_stats {
    uint64_t cached, map_calls, unmaps, hits, fast_acquires, fast_releases, slow_acquires;
};
struct colocate_handoff_exporter_hold_stats {
    uint64_t prepaid, prepaid_issued, prepaid_claimed, prepaid_expired, prepaid_revoked, mapped,
             frees_after_unmap, last_free_ns, prepaid_timeout_ms;
};
struct colocate_handoff_exporter;
struct colocate_handoff_importer;
int colocate_handoff_abi(void);
const char *colocate_handoff_last_error(void);
int colocate_handoff_exporter_new(const char *dir, struct colocate_handoff_exporter **out);
int colocate_handoff_exporter_free(struct colocate_handoff_exporter *ex, int wait_ms);
const char *colocate_handoff_exporter_path(const struct colocate_handoff_exporter *ex);
int colocate_handoff_exporter_stats(struct colocate_handoff_exporter *ex,
                                    struct colocate_handoff_exporter_stats *st);
int colocate_handoff_alloc(struct colocate_handoff_exporter *ex, uint64_t size, unsigned flags, void **ptr);
int colocate_handoff_export(struct colocate_handoff_exporter *ex, void *ptr, uint64_t size,
                            void (*free_fn)(void *arg, void *ptr), void *free_arg,
                            struct colocate_handoff_handle *out);
int colocate_handoff_export_ex(struct colocate_handoff_exporter *ex, void *ptr, uint64_t size,
                               void (*free_fn)(void *arg, void *ptr), void *free_arg,
                               uint32_t consumers, struct colocate_handoff_handle *out);
int colocate_handoff_revoke(struct colocate_handoff_exporter *ex, void *ptr);
int colocate_handoff_exporter_set_prepaid_timeout(struct colocate_handoff_exporter *ex, int ms);
int colocate_handoff_exporter_hold_stats(struct colocate_handoff_exporter *ex,
                                         struct colocate_handoff_exporter_hold_stats *st);
int colocate_handoff_drop(struct colocate_handoff_exporter *ex, void *ptr);
int colocate_handoff_refs(struct colocate_handoff_exporter *ex, void *ptr, uint64_t *refs);
int colocate_handoff_importer_new(struct colocate_handoff_importer **out);
int colocate_handoff_importer_free(struct colocate_handoff_importer *im);
int colocate_handoff_open(struct colocate_handoff_importer *im, const void *bytes, size_t len,
                          uint64_t expect_size, unsigned flags, struct colocate_handoff_view *out);
int colocate_handoff_close(struct colocate_handoff_importer *im, struct colocate_handoff_view *v);
int colocate_handoff_view_alive(struct colocate_handoff_importer *im, const struct colocate_handoff_view *v);
int colocate_handoff_importer_stats(struct colocate_handoff_importer *im,
                                    struct colocate_handoff_importer_stats *st);
int colocate_handoff_importer_cache_stats(struct colocate_handoff_importer *im,
                                          struct colocate_handoff_importer_cache_stats *st);
int colocate_handoff_importer_trim(struct colocate_handoff_importer *im, int all);
int colocate_handoff_parse(const void *bytes, size_t len, struct colocate_handoff_handle *out);
int colocate_handoff_remote_refs(const void *bytes, size_t len, uint64_t *refs);
int colocate_handoff_host_addressable(const void *ptr);
"""

# the header's codes (tests/test_handoff.py checks both lists against it)
ERRORS = {-1: "E_INVAL", -2: "E_TRUNCATED", -3: "E_FORGED", -4: "E_STALE", -5: "E_SIZE", -6: "E_PERM",
          -7: "E_CUDA", -8: "E_SYS", -9: "E_PROTO", -10: "E_GONE", -11: "E_NOMEM", -12: "E_UNSUPPORTED",
          -13: "E_TIMEOUT"}
E_GONE = -10
ALLOC_VMM = 1
OPEN_COPY, OPEN_HOST = 1, 2
HOW = {1: "mapped", 2: "same-process", 3: "copy-device", 4: "copy-host"}

_ffi = FFI()
_ffi.cdef(_CDEF)
_lib: Any = None
_lock = threading.Lock()


class HandoffError(RuntimeError):
    """A hand-off failed: `code` is the C status (COLOCATE_HANDOFF_E_*),
    `name` its name, the message one line."""

    def __init__(self, code: int, message: str):
        self.code = code
        self.name = ERRORS.get(code, f"E_{code}")
        super().__init__(f"{message} [{self.name}]")


def lib() -> Any:
    """The loaded libcolocate_handoff.so (checked to speak our ABI)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = paths.LIB_DIR / "libcolocate_handoff.so"
            if not path.exists():
                raise HandoffError(-1, f"{path} missing: run `make build`")
            loaded = _ffi.dlopen(str(path))
            if loaded.colocate_handoff_abi() != ABI:
                raise HandoffError(-1, f"{path} speaks ABI {loaded.colocate_handoff_abi()}, "
                                       f"this module {ABI}: rebuild")
            _lib = loaded
    return _lib


def _check(rc: int) -> int:
    if rc < 0:
        msg = _ffi.string(lib().colocate_handoff_last_error()).decode(errors="replace")
        raise HandoffError(rc, msg.replace("\n", " "))
    return rc


def _consumers(n: int) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= 0xFFFFFFFF:
        raise HandoffError(-1, f"consumers: {n!r} (a count, 0 or more)")
    return n


def _stats(st: Any) -> dict[str, int]:
    return {name: int(getattr(st, name)) for name, _ in _ffi.typeof(st).item.fields}


class _Owner:
    """What NumPy arrays of our memory hold on to (their base): while any
    is alive, the memory must not be released (a read would fault)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__array_interface__ = {"data": (ptr, False), "shape": (nbytes,), "typestr": "|u1",
                                    "version": 3}


def _as_numpy(owner: _Owner, dtype: Any, shape: Any) -> np.ndarray:
    raw = np.asarray(owner)
    dt = np.dtype(dtype)
    n = raw.nbytes // dt.itemsize
    arr = raw[: n * dt.itemsize].view(dt)
    return arr.reshape(shape) if shape is not None else arr


def _numpy_in_use(owner: _Owner | None) -> int:
    # the one the Buffer/View keeps, this parameter and getrefcount's
    # argument: anything above is an array (or a view of one)
    return 0 if owner is None else sys.getrefcount(owner) - 3


def _cupy_of(ptr: int, nbytes: int, keep: Any, dtype: Any, shape: Any) -> Any:
    import cupy  # optional: only where the caller has it
    mem = cupy.cuda.UnownedMemory(ptr, nbytes, keep)
    dt = np.dtype(dtype)
    return cupy.ndarray(shape if shape is not None else (nbytes // dt.itemsize,), dt,
                        cupy.cuda.MemoryPointer(mem, 0))


class Buffer:
    """Device memory owned by an Exporter (Exporter.alloc): freed once the
    exporter dropped it and every importer released it."""

    def __init__(self, exporter: Exporter, ptr: int, size: int):
        self.exporter = exporter
        self.ptr = ptr
        self.size = size
        self._owner: _Owner | None = None

    def numpy(self, dtype: Any = np.uint8, shape: Any = None) -> np.ndarray:
        """A NumPy view (simgpu only: a GPU's memory is not host memory)."""
        if not lib().colocate_handoff_host_addressable(_ffi.cast("void *", self.ptr)):
            raise HandoffError(-12, "device memory is not host-addressable here: use .cupy()")
        if self._owner is None:
            self._owner = _Owner(self.ptr, self.size)
        return _as_numpy(self._owner, dtype, shape)

    def cupy(self, dtype: Any = np.uint8, shape: Any = None) -> Any:
        """A CuPy array of the buffer (needs cupy)."""
        return _cupy_of(self.ptr, self.size, self, dtype, shape)

    def handle(self) -> bytes:
        """export(self): the handle to send to the next stage."""
        return self.exporter.export(self)

    def drop(self) -> None:
        self.exporter.drop(self)


class Exporter:
    """The stage that owns buffers and answers importers (Camelot Fig. 10,
    M1): a service thread on a Unix socket in a private runtime dir."""

    def __init__(self, runtime_dir: str | None = None, prepaid_timeout_s: float | None = None):
        out = _ffi.new("struct colocate_handoff_exporter **")
        _check(lib().colocate_handoff_exporter_new(runtime_dir.encode() if runtime_dir else _ffi.NULL, out))
        self._ex = out[0]
        if prepaid_timeout_s is not None:
            self.set_prepaid_timeout(prepaid_timeout_s)
        self._bufs: dict[int, Buffer] = {}
        self.export_copies = 0              # CuPy arrays copied into a buffer of ours to export them
        self._callbacks: dict[int, Any] = {}   # export_pointer's on_free, alive until called

    @property
    def path(self) -> str:
        """The exporter's socket."""
        return _ffi.string(lib().colocate_handoff_exporter_path(self._live())).decode()

    def _live(self) -> Any:
        if self._ex is None:
            raise HandoffError(-1, "exporter is closed")
        return self._ex

    def alloc(self, nbytes: int, vmm: bool = False) -> Buffer:
        """nbytes of device memory of the current device, owned here; vmm:
        cuMemCreate memory shared by fd instead of cudaMalloc + cudaIpc."""
        p = _ffi.new("void **")
        _check(lib().colocate_handoff_alloc(self._live(), nbytes, ALLOC_VMM if vmm else 0, p))
        buf = Buffer(self, int(_ffi.cast("uintptr_t", p[0])), nbytes)
        self._bufs[buf.ptr] = buf
        return buf

    def _buffer_of(self, obj: Any) -> Buffer:
        if isinstance(obj, Buffer):
            return obj
        ptr = None
        if hasattr(obj, "__cuda_array_interface__"):
            ptr = obj.__cuda_array_interface__["data"][0]
        elif isinstance(obj, np.ndarray):
            ptr = obj.__array_interface__["data"][0]
        if ptr is not None and ptr in self._bufs:
            return self._bufs[ptr]
        if ptr is not None and hasattr(obj, "__cuda_array_interface__"):
            return self._copy_in(obj)
        raise HandoffError(-1, f"cannot export {type(obj).__name__}: give a Buffer of this exporter, "
                               "an array over one, or a CuPy array")

    def _copy_in(self, arr: Any) -> Buffer:
        # A CuPy array usually lives inside a pool chunk, not at the start
        # of its own cudaMalloc allocation, which is what cudaIpc shares:
        # copy it (device to device) into a buffer of ours, counted.
        import cupy
        buf = self.alloc(int(arr.nbytes))
        cupy.cuda.runtime.memcpy(buf.ptr, cupy.ascontiguousarray(arr).data.ptr, int(arr.nbytes), 3)
        self.export_copies += 1
        return buf

    def export(self, obj: Any, consumers: int = 1) -> bytes:
        """The handle (bytes, one ZeroMQ frame) of a Buffer, a NumPy/CuPy
        array over one, or a CuPy array (copied into a Buffer first).

        consumers: references paid in advance, one per stage that will open
        this handle (a pipeline hands each output to one next stage: 1), so
        that drop() right after sending cannot free the buffer before the
        consumer opens it; each open takes one over, and those nobody claims
        go after the pre-paid timeout or with revoke().  0: none (the
        handle is only good while this exporter or an importer holds the
        buffer, as colocate_handoff_export)."""
        buf = self._buffer_of(obj)
        h = _ffi.new("struct colocate_handoff_handle *")
        _check(lib().colocate_handoff_export_ex(self._live(), _ffi.cast("void *", buf.ptr), 0, _ffi.NULL,
                                                _ffi.NULL, _consumers(consumers), h))
        return bytes(_ffi.buffer(h))

    def export_pointer(self, ptr: int, nbytes: int, on_free: Any = None, consumers: int = 1) -> bytes:
        """The handle of device memory allocated elsewhere (the start of a
        cudaMalloc allocation).  It becomes ours: cudaFree'd when the last
        reference goes, or on_free(ptr) is called instead (from the
        exporter's thread).  consumers: as export()."""
        h = _ffi.new("struct colocate_handoff_handle *")
        cb: Any = _ffi.NULL
        if on_free is not None:
            def _free(arg: Any, p: Any) -> None:
                try:
                    on_free(int(_ffi.cast("uintptr_t", p)))
                finally:
                    self._callbacks.pop(ptr, None)
            cb = _ffi.callback("void(void *, void *)", _free)
            self._callbacks[ptr] = cb
        _check(lib().colocate_handoff_export_ex(self._live(), _ffi.cast("void *", ptr), nbytes, cb, _ffi.NULL,
                                                _consumers(consumers), h))
        return bytes(_ffi.buffer(h))

    def revoke(self, obj: Any) -> int:
        """Drop the buffer's pre-paid references nobody claimed (its consumer
        will not open it): how many.  Freed now if nothing else holds it."""
        ptr = obj if isinstance(obj, int) else self._buffer_of(obj).ptr
        return _check(lib().colocate_handoff_revoke(self._live(), _ffi.cast("void *", ptr)))

    def set_prepaid_timeout(self, seconds: float) -> None:
        """Unclaimed pre-paid references go this long after their buffer's
        latest export (30 s until set)."""
        _check(lib().colocate_handoff_exporter_set_prepaid_timeout(self._live(), max(1, int(seconds * 1000))))

    def hold_stats(self) -> dict[str, int]:
        """prepaid (pre-paid references not claimed yet), prepaid_issued,
        prepaid_claimed, prepaid_expired, prepaid_revoked, mapped
        (importers' kept mappings, each holding its buffer),
        frees_after_unmap, last_free_ns (CLOCK_MONOTONIC, as
        time.monotonic_ns()), prepaid_timeout_ms."""
        st = _ffi.new("struct colocate_handoff_exporter_hold_stats *")
        _check(lib().colocate_handoff_exporter_hold_stats(self._live(), st))
        return _stats(st)

    def drop(self, obj: Any) -> None:
        """Drop the exporter's own reference: freed now, or when the last
        importer releases it."""
        if isinstance(obj, int):
            ptr = obj
        else:
            buf = self._buffer_of(obj)
            if _numpy_in_use(buf._owner):
                raise HandoffError(-1, "drop: NumPy arrays of this buffer are still alive; delete them first")
            ptr = buf.ptr
        _check(lib().colocate_handoff_drop(self._live(), _ffi.cast("void *", ptr)))
        self._bufs.pop(ptr, None)

    def refs(self, obj: Any) -> int:
        """Importers' references to the buffer now (their open views: not
        pre-paid references nor kept mappings, see hold_stats())."""
        ptr = obj if isinstance(obj, int) else self._buffer_of(obj).ptr
        n = _ffi.new("uint64_t *")
        _check(lib().colocate_handoff_refs(self._live(), _ffi.cast("void *", ptr), n))
        return int(n[0])

    def stats(self) -> dict[str, int]:
        """live_buffers, held_refs, connections, exports, acquires, releases,
        refs_dropped_dead, frees, copies_served, copy_bytes."""
        st = _ffi.new("struct colocate_handoff_exporter_stats *")
        _check(lib().colocate_handoff_exporter_stats(self._live(), st))
        return _stats(st)

    def close(self, wait_s: float = 0.0) -> None:
        """Stop serving: wait up to wait_s for importers to release, then
        cut them off and free every buffer."""
        if self._ex is not None:
            ex, self._ex = self._ex, None
            self._bufs.clear()
            _check(lib().colocate_handoff_exporter_free(ex, int(wait_s * 1000)))

    def __enter__(self) -> Exporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class View:
    """An opened handle: the exporter's memory mapped here (how="mapped"),
    or a copy ("copy-device", "copy-host").  Release it when done."""

    def __init__(self, importer: Importer, cview: Any):
        self._imp = importer
        self._v = cview
        self.ptr = int(_ffi.cast("uintptr_t", cview.ptr))
        self.size = int(cview.size)
        self.device = int(cview.device)
        self.how = HOW.get(int(cview.how), str(int(cview.how)))
        self._owner: _Owner | None = None

    @property
    def copied(self) -> bool:
        return self.how.startswith("copy")

    def numpy(self, dtype: Any = np.uint8, shape: Any = None) -> np.ndarray:
        """A NumPy view of the memory (a host copy, or simgpu's device memory)."""
        if self._v is None:
            raise HandoffError(-4, "view released")
        if self.how != "copy-host" and not lib().colocate_handoff_host_addressable(self._v.ptr):
            raise HandoffError(-12, "device memory is not host-addressable here: use .cupy() or open "
                                    "with host=True")
        if self._owner is None:
            self._owner = _Owner(self.ptr, self.size)
        return _as_numpy(self._owner, dtype, shape)

    def cupy(self, dtype: Any = np.uint8, shape: Any = None) -> Any:
        """A CuPy array of the memory (needs cupy; device views only)."""
        return _cupy_of(self.ptr, self.size, self, dtype, shape)

    def alive(self) -> bool:
        """False once the exporter is gone (the data stays readable until
        release; nobody writes it any more)."""
        if self._v is None:
            return False
        return _check(lib().colocate_handoff_view_alive(self._imp._live(), self._v)) == 1

    def release(self) -> bool:
        """Give the reference back (unmapping it here).  True, or False when
        the exporter had gone (released all the same)."""
        if self._v is None:
            raise HandoffError(-4, "view already released")
        if _numpy_in_use(self._owner):
            raise HandoffError(-1, "release: NumPy arrays of this view are still alive; delete them first")
        v, self._v = self._v, None
        rc = lib().colocate_handoff_close(self._imp._live(), v)
        if rc == E_GONE:
            return False
        _check(rc)
        return True

    def __enter__(self) -> View:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._v is not None:
            self.release()


class Importer:
    """A stage that opens handles (Camelot Fig. 10, M2): one connection per
    exporter while it holds views of that exporter's buffers."""

    def __init__(self) -> None:
        out = _ffi.new("struct colocate_handoff_importer **")
        _check(lib().colocate_handoff_importer_new(out))
        self._im = out[0]

    def _live(self) -> Any:
        if self._im is None:
            raise HandoffError(-1, "importer is closed")
        return self._im

    def open(self, data: bytes, *, expect_size: int = 0, copy: bool = False, host: bool = False) -> View:
        """Open a handle: mapped without a copy where it can be, else (or
        with copy=True) a device copy, or a host copy with host=True."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise HandoffError(-1, f"a handle is bytes, not {type(data).__name__}")
        raw = bytes(data)
        v = _ffi.new("struct colocate_handoff_view *")
        flags = (OPEN_COPY if copy else 0) | (OPEN_HOST if host else 0)
        _check(lib().colocate_handoff_open(self._live(), raw, len(raw), expect_size, flags, v))
        return View(self, v)

    def stats(self) -> dict[str, int]:
        """open_views, connections, maps, copies, copy_bytes, gone."""
        st = _ffi.new("struct colocate_handoff_importer_stats *")
        _check(lib().colocate_handoff_importer_stats(self._live(), st))
        return _stats(st)

    def cache_stats(self) -> dict[str, int]:
        """cached, map_calls, unmaps, hits (kept mappings: a buffer handed
        over again is not mapped again), fast_acquires, fast_releases
        (references without a round trip to the exporter), slow_acquires."""
        st = _ffi.new("struct colocate_handoff_importer_cache_stats *")
        _check(lib().colocate_handoff_importer_cache_stats(self._live(), st))
        return _stats(st)

    def trim(self, all: bool = False) -> int:  # noqa: A002 -- the C API's name
        """Unmap kept mappings no view uses whose buffer its exporter dropped
        (all=True: every one), so the exporter can free them now rather than
        at this importer's next open or release.  How many."""
        return _check(lib().colocate_handoff_importer_trim(self._live(), 1 if all else 0))

    def close(self) -> None:
        """Release every view still open and disconnect."""
        if self._im is not None:
            im, self._im = self._im, None
            _check(lib().colocate_handoff_importer_free(im))


def parse(data: bytes) -> dict[str, Any]:
    """The fields of a handle, checked (length, magic, version, checksum,
    uid) without contacting its exporter."""
    h = _ffi.new("struct colocate_handoff_handle *")
    raw = bytes(data)
    _check(lib().colocate_handoff_parse(raw, len(raw), h))
    return {"kind": {1: "ipc", 2: "fd"}.get(h.kind, h.kind), "pid": h.pid, "uid": h.uid, "id": h.id,
            "gen": h.gen, "size": h.size, "device": h.device, "path": _ffi.string(h.path).decode()}


def remote_refs(data: bytes) -> int:
    """Importer references the handle's exporter counts for that buffer."""
    n = _ffi.new("uint64_t *")
    raw = bytes(data)
    _check(lib().colocate_handoff_remote_refs(raw, len(raw), n))
    return int(n[0])


_default_exporter: Exporter | None = None
_default_importer: Importer | None = None


def default_exporter() -> Exporter:
    """The process's exporter for export()/release() (made at first use)."""
    global _default_exporter
    if _default_exporter is None:
        _default_exporter = Exporter()
    return _default_exporter


def default_importer() -> Importer:
    """The process's importer for open_handle()."""
    global _default_importer
    if _default_importer is None:
        _default_importer = Importer()
    return _default_importer


def export(array: Any, consumers: int = 1) -> bytes:
    """Camelot Fig. 10, sender side: the handle of a buffer (see Exporter.export)."""
    return default_exporter().export(array, consumers=consumers)


def open_handle(data: bytes, *, expect_size: int = 0, copy: bool = False, host: bool = False) -> View:
    """Camelot Fig. 10, receiver side: open a handle (see Importer.open)."""
    return default_importer().open(data, expect_size=expect_size, copy=copy, host=host)


def release(obj: Any) -> bool | None:
    """Release a View (importer side, returns View.release()'s answer), or
    drop the default exporter's reference to a buffer (exporter side)."""
    if isinstance(obj, View):
        return obj.release()
    default_exporter().drop(obj)
    return None
