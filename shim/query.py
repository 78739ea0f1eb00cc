"""Query boundaries for Python services, the same API as shim/include/colocate.h.

    from shim.query import query

    with query(request_id, batch_size):
        out = model(batch)          # GPU work of the query
        result = out.cpu()          # the result is on the host

Under `colocate run` the preloaded libcolocate.so exports
colocate_query_begin_v1 / colocate_query_end_v1; they are found here with
ctypes in the process's global namespace, once.  Without the shim every call
is a no-op returning False, so a service can call them unconditionally.
The first call tells the shim that the app marks its queries, which turns
its inference from copies off.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_lock = threading.Lock()
_api: tuple[Any, Any] | None = None
_looked_up = False
_U64 = (1 << 64) - 1


def _lookup() -> tuple[Any, Any] | None:
    """(begin, end) from libcolocate.so, or None when it is not loaded."""
    global _api, _looked_up
    with _lock:
        if not _looked_up:
            begin: Any = None
            end: Any = None
            try:
                lib = ctypes.CDLL(None)
                begin, end = lib.colocate_query_begin_v1, lib.colocate_query_end_v1
            except (OSError, AttributeError):
                begin = end = None
            if begin is not None:
                begin.argtypes, begin.restype = [ctypes.c_uint64, ctypes.c_uint64], ctypes.c_int
                end.argtypes, end.restype = [ctypes.c_uint64], ctypes.c_int
                _api = (begin, end)
            _looked_up = True
    return _api


def _u64(name: str, v: int) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= _U64:
        raise ValueError(f"{name} must be an integer in 0..2**64-1, got {v!r}")
    return v


def active() -> bool:
    """True when running under the colocate shim."""
    return _lookup() is not None


def query_begin(id: int, size: int = 0) -> bool:
    """A query with this id (unique among those in flight) and input size
    starts now.  True when the shim recorded it."""
    id, size = _u64("id", id), _u64("size", size)   # checked with or without the shim
    api = _lookup()
    return api is not None and api[0](id, size) == 0


def query_end(id: int) -> bool:
    """The query with this id is complete (its result is on the host)."""
    id = _u64("id", id)
    api = _lookup()
    return api is not None and api[1](id) == 0


@contextmanager
def query(id: int, size: int = 0) -> Iterator[None]:
    """Bracket a block as one query; it ends even when the block raises."""
    query_begin(id, size)
    try:
        yield
    finally:
        query_end(id)
