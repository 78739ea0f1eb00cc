"""The tests' one client of the forwarding protocol (shim/proto/fwd_proto.h).

Constants, sizes and offsets come from the header itself through cffi
(shim._proto, whose cdef build.py generates from the header), and frames are
packed into the header's own structs: a field moved in C moves here too.

    app = RingApp(rig, wid)                       # HELLO with a page and a ring
    app.write(define(0, b"_Z3fooPf", [(0, 8)], 8))
    app.write(launch(1, 0, args))
    app.settle(); app.page("executed")
    app.close()                                   # BYE
"""
from __future__ import annotations

import ctypes
import mmap
import os
import time
from typing import Any

import zmq

from processpool.rig import Rig
from shim._proto import ffi, lib

MAGIC, VERSION = lib.FWD_MAGIC, lib.FWD_VERSION
T_HELLO, T_HELLO_REPLY, T_DEFINE = lib.FWD_T_HELLO, lib.FWD_T_HELLO_REPLY, lib.FWD_T_DEFINE
T_LAUNCH, T_BYE, T_ERROR, T_MODULE = lib.FWD_T_LAUNCH, lib.FWD_T_BYE, lib.FWD_T_ERROR, lib.FWD_T_MODULE
HF_RING, LF_TIMED = lib.FWD_HF_RING, lib.FWD_LF_TIMED
NO_MODULE, MAX_MODULES = lib.FWD_NO_MODULE, lib.FWD_MAX_MODULES
RING = 1 << 16                                  # a small ring: wraps often

LIBC = ctypes.CDLL(None, use_errno=True)
SYS_FUTEX = 202 if os.uname().machine == "x86_64" else 98
FUTEX_WAKE = 1


def page_off(field: str) -> int:
    """Offset of a field of struct fwd_page."""
    return ffi.offsetof("struct fwd_page", field)


def _frame(kind: str, type_: int, tail: bytes = b"", flags: int = 0, version: int = VERSION,
           skew: int = 0, **fields: Any) -> bytes:
    """A struct fwd_<kind> with fields set, its header filled in (length
    off by skew), then tail."""
    p = ffi.new(f"struct fwd_{kind} *")
    for k, v in fields.items():
        setattr(p, k, v)
    p.h.magic, p.h.version, p.h.type, p.h.flags = MAGIC, version, type_, flags
    p.h.len = max(0, ffi.sizeof(p[0]) + len(tail) + skew)
    return bytes(ffi.buffer(p)) + tail


def hdr(type_: int, length: int, flags: int = 0, version: int = VERSION) -> bytes:
    """A bare header claiming length bytes (what fuzzing puts bodies behind)."""
    p = ffi.new("struct fwd_hdr *", {"magic": MAGIC, "version": version, "type": type_,
                                      "flags": flags, "len": length})
    return bytes(ffi.buffer(p))


def hello(wid: int, page: bytes, name: bytes, twins: bytes = b"", device: bytes = b"",
          flags: int = HF_RING, pid: int | None = None) -> bytes:
    return _frame("hello", T_HELLO, page + twins + device + name, flags=flags,
                  pid=os.getpid() if pid is None else pid, worker_id=wid, page_len=len(page),
                  twins_len=len(twins), device_len=len(device), name_len=len(name))


def hello_reply(data: bytes) -> Any:
    """The struct fwd_hello_reply of a worker's answer (status, worker_id, ...)."""
    assert len(data) >= ffi.sizeof("struct fwd_hello_reply"), data
    return ffi.from_buffer("struct fwd_hello_reply *", data)


def hello_reply_msg(data: bytes) -> str:
    n = ffi.sizeof("struct fwd_hello_reply")
    return data[n:n + hello_reply(data).msg_len].decode(errors="replace")


def define(kid: int, name: bytes, params: list[tuple[int, int]], argbytes: int,
           mid: int = NO_MODULE) -> bytes:
    ps = ffi.new("struct fwd_param[]", [{"offset": o, "size": n} for o, n in params]) if params else b""
    tail = (bytes(ffi.buffer(ps)) if params else b"") + name
    return _frame("define", T_DEFINE, tail, kid=kid, nparams=len(params), name_len=len(name),
                  argbytes=argbytes, mid=mid)


def module(mid: int, size: int, hash_: int, path: bytes, skew: int = 0) -> bytes:
    return _frame("module", T_MODULE, path, skew=skew, mid=mid, size=size, hash=hash_,
                  path_len=len(path))


def launch(seq: int, kid: int, args: bytes, sidx: int = 0, flags: int = 0,
           grid: tuple[int, int, int] = (1, 1, 1), block: tuple[int, int, int] = (32, 1, 1)) -> bytes:
    return _frame("launch", T_LAUNCH, args, flags=flags, seq=seq, kid=kid, sidx=sidx,
                  grid=list(grid), block=list(block), shmem=0, argbytes=len(args))


def image_hash(data: bytes) -> int:
    """fwd_image_hash64: the hash a module file is named and checked by."""
    return lib.fwd_image_hash64(data, len(data))


class RingApp:
    """Plays the shim's side of one connection: a page with a launch ring,
    HELLO on a DEALER, frames written into the ring."""

    def __init__(self, r: Rig, wid: int, name: str = "ringtest", twins: str = "", pid: int | None = None):
        self.r, self.path = r, r.dir / f"page-{os.urandom(4).hex()}"
        size = lib.FWD_RING_OFF + RING
        with open(self.path, "wb") as f:
            f.truncate(size)
        fd = os.open(self.path, os.O_RDWR)
        self.mm = mmap.mmap(fd, size)
        os.close(fd)
        pg = ffi.from_buffer("struct fwd_page *", self.mm)
        pg.magic, pg.version, pg.ring_size = lib.FWD_PAGE_MAGIC, lib.FWD_PAGE_VERSION, RING
        ffi.release(pg)
        self.head = 0
        self.sock = r.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"ipc://{r.dir}/worker-{wid}.sock")
        dev = os.path.realpath(r.env["SIMGPU_DIR"]).encode()     # the same simulated device
        self.sock.send(hello(wid, str(self.path).encode(), name.encode(), twins.encode(), dev, pid=pid))
        reply = self.sock.recv() if self.sock.poll(3000) else b""
        ok = (len(reply) >= ffi.sizeof("struct fwd_hello_reply") and reply[2] == T_HELLO_REPLY
              and reply[3] & HF_RING and hello_reply(reply).status == lib.FWD_S_OK)
        if not ok:
            self.sock.close()
            self.mm.close()
            raise AssertionError(f"HELLO refused: {reply!r}")

    def u64(self, off: int) -> int:
        return int.from_bytes(self.mm[off:off + 8], "little")

    def page(self, field: str) -> int:
        """A 64-bit field of the page (executed, defines_done, ring_tail, ...)."""
        return self.u64(page_off(field))

    def u32(self, field: str) -> int:
        off = page_off(field)
        return int.from_bytes(self.mm[off:off + 4], "little")

    def write(self, frame: bytes) -> None:
        """Into the ring, then wake the launcher as the shim does: bump
        ring_wake and FUTEX_WAKE it."""
        off = self.head % RING
        first = min(len(frame), RING - off)
        base = lib.FWD_RING_OFF
        self.mm[base + off:base + off + first] = frame[:first]
        self.mm[base:base + len(frame) - first] = frame[first:]
        self.head += len(frame)
        self.mm[page_off("ring_head"):page_off("ring_head") + 8] = self.head.to_bytes(8, "little")
        wake = page_off("ring_wake")
        self.mm[wake:wake + 4] = ((self.u32("ring_wake") + 1) & 0xffffffff).to_bytes(4, "little")
        word = ctypes.c_uint32.from_buffer(self.mm, wake)
        LIBC.syscall(SYS_FUTEX, ctypes.byref(word), FUTEX_WAKE, 1, None, None, 0)
        del word

    def refused(self) -> int:
        """The page's refused_code: non-zero once the worker refused the ring."""
        return int.from_bytes(self.mm[page_off("refused_code"):page_off("refused_code") + 4],
                              "little", signed=True)

    def refused_kernel(self, kid: int) -> bool:
        """The worker refused kernel kid's DEFINE (refused_kid[])."""
        return bool(self.u64(page_off("refused_kid") + 8 * (kid // 64)) >> (kid % 64) & 1)

    def settle(self, timeout: float = 3.0) -> None:
        """Until the worker took every frame written (or refused the ring)."""
        end = time.monotonic() + timeout
        while self.page("ring_tail") != self.head and not self.refused():
            assert time.monotonic() < end, "worker did not take the ring's frames"
            time.sleep(0.002)

    def idle(self) -> bool:
        """The launcher ran every frame and sleeps on the empty ring (its tail
        is stored before a frame runs, ring_sleeping only once it found the
        ring empty: read the tail first)."""
        return self.page("ring_tail") == self.head and bool(self.u32("ring_sleeping"))

    def verdicts(self, n: int, timeout: float = 5.0) -> None:
        """Until the worker has judged n DEFINEs on this connection."""
        end = time.monotonic() + timeout
        while self.page("defines_done") < n:
            assert time.monotonic() < end, f"{self.page('defines_done')} of {n} verdicts"
            time.sleep(0.002)
        assert self.page("defines_done") == n

    def close(self) -> None:
        self.sock.send(hdr(T_BYE, ffi.sizeof("struct fwd_hdr")))
        self.sock.close()
        self.mm.close()
        self.path.unlink()
