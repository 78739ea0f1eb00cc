"""One instance of a Camelot stage, live: an artifact stage (§III-B: c1-c3,
m1-m3, p1-p3) or a stage of the four services of Table I (§III-A:
face-recognition, image-enhancement, ...), the process `colocate pipeline
run` (controlplane/pipeline.py) starts under the shim, one per instance, and
drives over ZeroMQ.

Table I stages run a Tonic network (bench/tonic: cuDNN and cuBLAS layers)
through bench/bin/libcamelot-tonic.so (tonic_stage.cu): suite.NETS names the
network and the units (images or words) of a query; --scale sets its width
(channels and hidden units x sqrt(scale): about scale x its FLOPs); its
input is the previous stage's output, whatever its size (--in-n 0: taken
from each batch), adapted to the network's input units.

    python bench/camelot/stage_worker.py --kind c2 --name c2.0 --endpoint ipc://... \
        --in-n 125000 --batch-max 4 --scale 0.01 --parent PID

Its work per query is bench/camelot/suite.py's (ARTIFACT), run by the
kernels of bench/bin/libcamelot-stage.so (stage.cu) -- the same stages the
simulator (pipesim.py) models -- with the arithmetic and the streamed and
copied bytes multiplied by --scale (simgpu's twins run ~1-3 GFLOP/s on the
CPU).  What a stage hands on (out_mb per query) is not scaled.

Protocol (a DEALER socket, identity = --name; each message is frames
[JSON header, payload]):
  -> {"op": "ready", "name", "pid", "kind", "in_n", "out_n", "iters", "ws_n", "aux_n"}
  <- {"op": "run", "batch": id, "queries": [qid...], "in": "bytes"|"handle",
      "out": "handle"|"host", "crc": bool}, payload: the input (bytes of
      batch x in_n floats, or a shim.handoff handle: Camelot Fig. 10)
  -> {"op": "done", "batch", "in_s", "work_s", "out_s", "in_how", "sent_at",
      "recv_at", "crcs"?}, payload: a handle of the output (kept until
      "drop"), the output's bytes (host), or empty (crc: the last stage
      sends each query's CRC-32 instead)
  <- {"op": "drop", "batch": id}: the next stage is done with that output
  <- {"op": "stop"}
  -> {"op": "error", "batch", "error": one line}, then exit 1
The worker ignores SIGINT (the runner stops it) and exits when its parent dies.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import sys
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zmq

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
for _p in (str(ROOT), str(ROOT / "bench")):
    if _p not in sys.path:
        sys.path.insert(0, _p)
from camelot.suite import ARTIFACT, GB, MB, NETS, net_width  # noqa: E402

LIB = ROOT / "bench" / "bin" / "libcamelot-stage.so"
TWINS = ROOT / "bench" / "bin" / "libcamelot-stage.twins.so"
TONIC_LIB = ROOT / "bench" / "bin" / "libcamelot-tonic.so"
ABI = 1
TONIC_ABI = 1
F32 = 4
KINDS = tuple(ARTIFACT) + tuple(NETS)


@dataclass(frozen=True)
class Work:
    """A stage's kernels' sizes for one query (floats), from suite.ARTIFACT."""
    kind: str
    in_n: int          # input elements per query (the previous stage's out_n)
    out_n: int         # output elements per query: out_mb, unscaled
    iters: int = 0     # c: multiply-adds per output element (2 flops each)
    ws_n: int = 0      # m: workspace streamed out and back in (act_mb = 8 bytes per element)
    aux_n: int = 0     # p: copied host-to-device per query (h2d_mb)

    @property
    def family(self) -> str:
        return self.kind[0]


def stage_work(kind: str, scale: float, in_n: int) -> Work:
    """Kernel sizes of artifact stage `kind` (§III-B) at `scale` of the
    suite's work per query: c's gflop, m's act_mb, p's h2d_mb."""
    if kind not in ARTIFACT:
        raise ValueError(f"unknown stage kind {kind!r} (one of {', '.join(ARTIFACT)})")
    st = ARTIFACT[kind]
    la = st.layers[0]
    out_n = max(1, round(st.out_mb * MB / F32))
    if kind[0] == "c":
        return Work(kind, in_n, out_n, iters=max(1, round(la.gflop * scale * GB / (2 * out_n))))
    if kind[0] == "m":
        return Work(kind, in_n, out_n, ws_n=max(1, round(la.act_mb * scale * MB / (2 * F32))))
    return Work(kind, in_n, out_n, aux_n=max(1, round(la.h2d_mb * scale * MB / F32)))


def aux_pattern(n: int) -> np.ndarray:
    """What a PCIe stage copies host-to-device for each query: n floats in [0, 1)."""
    i = np.arange(n, dtype=np.uint32)
    return (((i * np.uint32(2654435761)) >> 16) & 0xFF).astype(np.float32) / np.float32(256)


class StageError(RuntimeError):
    pass


def load_tonic(path: Path = TONIC_LIB) -> Any:
    """libcamelot-tonic.so, with its functions' C types."""
    if not path.exists():
        raise StageError(f"{path} is not built: run `make build`")
    lib = ctypes.CDLL(str(path))
    if lib.camelot_tonic_abi() != TONIC_ABI:
        raise StageError(f"{path} speaks ABI {lib.camelot_tonic_abi()}, this worker {TONIC_ABI}: rebuild")
    vp, ll, i, cp, sz = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t
    lib.camelot_tonic_open.restype = vp
    lib.camelot_tonic_open.argtypes = [cp, ctypes.c_double, i, i, i, ctypes.c_ulonglong, cp, sz]
    lib.camelot_tonic_close.argtypes = lib.camelot_tonic_out_n.argtypes = [vp]
    lib.camelot_tonic_in_units.argtypes = [vp]
    lib.camelot_tonic_out_n.restype = lib.camelot_tonic_in_units.restype = ll
    lib.camelot_tonic_run.argtypes = [vp, vp, ll, i, vp, ctypes.POINTER(ctypes.c_double), cp, sz]
    lib.camelot_tonic_reference.argtypes = [vp, vp, ll, i, vp, cp, sz]
    return lib


def load_lib(path: Path = LIB) -> Any:
    """libcamelot-stage.so, with its functions' C types."""
    if not path.exists():
        raise StageError(f"{path} is not built: run `make build`")
    lib = ctypes.CDLL(str(path))
    if lib.camelot_stage_abi() != ABI:
        raise StageError(f"{path} speaks ABI {lib.camelot_stage_abi()}, this worker {ABI}: rebuild")
    vp, ll, i, sz = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_size_t
    lib.camelot_strerror.restype = ctypes.c_char_p
    lib.camelot_malloc.argtypes = [ctypes.POINTER(vp), sz]
    lib.camelot_free.argtypes = [vp]
    lib.camelot_h2d.argtypes = lib.camelot_d2h.argtypes = [vp, vp, sz]
    lib.camelot_run_fma.argtypes = [vp, ll, vp, ll, i, i]
    lib.camelot_run_stream.argtypes = [vp, ll, vp, ll, vp, ll, i]
    lib.camelot_run_pcie.argtypes = [vp, ll, vp, vp, ll, vp, ll, i]
    return lib


class Stage:
    """The device side of one instance: its buffers and its batches."""

    def __init__(self, lib: Any, work: Work, batch_max: int):
        self.lib, self.w, self.batch_max = lib, work, batch_max
        self.in_dev = self._malloc(batch_max * work.in_n * F32)       # input received as bytes
        self.out_dev = self._malloc(batch_max * work.out_n * F32)     # output sent as bytes
        self.host = np.empty(batch_max * work.out_n, np.float32)
        self.ws = self._malloc(batch_max * work.ws_n * F32) if work.ws_n else None
        self.aux_dev = self._malloc(batch_max * work.aux_n * F32) if work.aux_n else None
        # p_i's per-query host data: the same for every query, so results do not depend on batching
        self.aux_host = np.tile(aux_pattern(work.aux_n), batch_max) if work.aux_n else None
        self.exporter: Any = None
        self.importer: Any = None
        self.exported: dict[int, Any] = {}     # batch -> Buffer, until "drop"
        self.spare: dict[int, list[Any]] = {}  # bytes -> dropped Buffers no importer holds

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise StageError(f"{what}: {self.lib.camelot_strerror(rc).decode()} (cudaError {rc})")

    def _malloc(self, n: int) -> int:
        p = ctypes.c_void_p()
        self._check(self.lib.camelot_malloc(ctypes.byref(p), max(n, F32)), f"cudaMalloc({n})")
        return int(p.value or 0)

    def warm_up(self, handles: bool) -> None:
        """Pay the one-time costs before the first query: the kernels' first
        launch (simgpu resolves their twins), and with handles the hand-off
        library's CUDA set-up (an allocation)."""
        if handles:
            self.handoff()
            self.exporter.drop(self.exporter.alloc(F32))
        self.lib.camelot_h2d(self.in_dev, bytes(self.w.in_n * F32), self.w.in_n * F32)
        self._kernels(self.in_dev, self.out_dev, 1)

    def handoff(self) -> Any:
        from shim import handoff
        if self.exporter is None:
            self.exporter, self.importer = handoff.Exporter(), handoff.Importer()
        return handoff

    # --- one batch ------------------------------------------------------------

    def run(self, msg: dict, payload: bytes) -> tuple[dict, bytes]:
        """Run a batch: input in, kernels, output out; (reply header, payload)."""
        b = len(msg["queries"])
        if not 1 <= b <= self.batch_max:
            raise StageError(f"batch of {b} queries (1..{self.batch_max})")
        t0 = time.perf_counter()
        in_ptr, view, how = self._input(msg["in"], payload, b)
        try:
            t1 = time.perf_counter()
            out_ptr, buf = self._out_buffer(msg["out"], b)
            t_alloc = time.perf_counter() - t1
            self._kernels(in_ptr, out_ptr, b)
            t2 = time.perf_counter()
        finally:
            if view is not None:            # the producer's buffer goes back whatever happened
                view.release()
        t3 = time.perf_counter()
        hdr, data = self._output(msg, b, out_ptr, buf)
        t4 = time.perf_counter()
        hdr.update(op="done", batch=msg["batch"], in_s=(t1 - t0) + (t3 - t2), work_s=t2 - t1 - t_alloc,
                   out_s=(t4 - t3) + t_alloc, in_how=how, sent_at=time.time())
        return hdr, data

    def _input(self, kind: str, payload: bytes, b: int) -> tuple[int, Any, str]:
        n = b * self.w.in_n * F32
        if kind == "handle":
            view = self.handoff().open_handle(payload, expect_size=n)
            return view.ptr, view, view.how
        if len(payload) != n:
            raise StageError(f"input of {len(payload)} bytes, expected {n}")
        self._check(self.lib.camelot_h2d(self.in_dev, payload, n), "cudaMemcpy H2D (input)")
        return self.in_dev, None, "host"

    def _out_buffer(self, kind: str, b: int) -> tuple[int, Any]:
        if kind != "handle":
            return self.out_dev, None
        n = b * self.w.out_n * F32
        self.handoff()
        spare = self.spare.get(n)
        buf = spare.pop() if spare else self.exporter.alloc(n)
        return buf.ptr, buf

    def _kernels(self, in_ptr: int, out_ptr: int, b: int) -> None:
        w, lib = self.w, self.lib
        if w.family == "c":
            rc = lib.camelot_run_fma(in_ptr, w.in_n, out_ptr, w.out_n, b, w.iters)
        elif w.family == "m":
            rc = lib.camelot_run_stream(in_ptr, w.in_n, self.ws, w.ws_n, out_ptr, w.out_n, b)
        else:
            assert self.aux_host is not None
            rc = lib.camelot_run_pcie(in_ptr, w.in_n, self.aux_dev, self.aux_host.ctypes.data, w.aux_n,
                                      out_ptr, w.out_n, b)
        self._check(rc, f"{w.kind} kernels")
        self._check(lib.camelot_sync(), f"{w.kind} kernels (sync)")

    def _output(self, msg: dict, b: int, out_ptr: int, buf: Any) -> tuple[dict, bytes]:
        if buf is not None:                              # Camelot Fig. 10: pass the handle
            self.exported[msg["batch"]] = buf
            return {}, buf.handle()
        n = b * self.w.out_n
        self._check(self.lib.camelot_d2h(self.host.ctypes.data, out_ptr, n * F32), "cudaMemcpy D2H (output)")
        out = self.host[:n]
        if msg.get("crc"):
            m = self.w.out_n
            return {"crcs": [zlib.crc32(out[q * m:(q + 1) * m]) for q in range(b)]}, b""
        return {}, out.tobytes()

    def drop(self, batch: int) -> None:
        """The next stage is done with this batch's output: reuse the buffer
        once no importer holds it, else let its last importer free it."""
        buf = self.exported.pop(batch, None)
        if buf is None:
            return
        if self.exporter.refs(buf) == 0:
            self.spare.setdefault(buf.size, []).append(buf)
        else:
            self.exporter.drop(buf)

    def close(self) -> None:
        if self.importer is not None:
            self.importer.close()
        if self.exporter is not None:
            self.exporter.close(wait_s=0.2)


class NetStage(Stage):
    """A Table I stage: a Tonic network between the instance's buffers.  Its
    input size per query is the producer's (--in-n 0: from each batch)."""

    def __init__(self, lib: Any, tlib: Any, kind: str, scale: float, in_n: int, batch_max: int, seed: int = 1):
        net, units = NETS[kind]
        err = ctypes.create_string_buffer(512)
        self.tlib, self.net = tlib, net
        self.h = tlib.camelot_tonic_open(net.encode(), net_width(scale), 0, units, batch_max, seed, err, len(err))
        if not self.h:
            raise StageError(f"{kind} (net {net}): {err.value.decode(errors='replace')}")
        self.cur_in_n = max(in_n, 1)
        try:
            super().__init__(lib, Work(kind, in_n, int(tlib.camelot_tonic_out_n(self.h))), batch_max)
        except BaseException:
            tlib.camelot_tonic_close(self.h)
            raise
        self.in_cap = max(batch_max * in_n * F32, F32)          # what Stage allocated for in_dev

    def _input(self, kind: str, payload: bytes, b: int) -> tuple[int, Any, str]:
        if kind == "handle":
            view = self.handoff().open_handle(payload, expect_size=b * self.w.in_n * F32 if self.w.in_n else 0)
            n, ptr, how = view.size, view.ptr, view.how
        else:
            if self.w.in_n and len(payload) != b * self.w.in_n * F32:
                raise StageError(f"input of {len(payload)} bytes, expected {b * self.w.in_n * F32}")
            n, view, how = len(payload), None, "host"
            if n > self.in_cap:
                self._check(self.lib.camelot_free(self.in_dev), "cudaFree (input)")
                self.in_dev, self.in_cap = self._malloc(n), n
            self._check(self.lib.camelot_h2d(self.in_dev, payload, n), "cudaMemcpy H2D (input)")
            ptr = self.in_dev
        if n == 0 or n % (b * F32):
            if view is not None:
                view.release()
            raise StageError(f"input of {n} bytes is not {b} queries of floats")
        self.cur_in_n = n // (b * F32)
        return ptr, view, how

    def _kernels(self, in_ptr: int, out_ptr: int, b: int) -> None:
        err, dev_s = ctypes.create_string_buffer(512), ctypes.c_double()
        if self.tlib.camelot_tonic_run(self.h, in_ptr, self.cur_in_n, b, out_ptr, ctypes.byref(dev_s), err, len(err)):
            raise StageError(f"{self.w.kind} (net {self.net}): {err.value.decode(errors='replace')}")

    def run_host(self, x: np.ndarray, b: int) -> np.ndarray:
        """b queries' floats in, through the network, their outputs back (host
        arrays, one process: bench/camelot/chain.py's reference runs)."""
        ptr, _, _ = self._input("bytes", np.ascontiguousarray(x, dtype=np.float32).tobytes(), b)
        self._kernels(ptr, self.out_dev, b)
        y = np.empty(b * self.w.out_n, np.float32)
        self._check(self.lib.camelot_d2h(y.ctypes.data, self.out_dev, y.nbytes), "cudaMemcpy D2H (output)")
        return y

    def close(self) -> None:
        super().close()
        self.tlib.camelot_tonic_close(self.h)


# --- the process -------------------------------------------------------------

def die_with_parent(parent: int) -> None:
    """PR_SET_PDEATHSIG: SIGTERM when the runner dies (and check it has not already)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if parent and os.getppid() != parent:
        sys.exit(1)


def serve(sock: Any, stage: Stage, parent: int) -> int:
    """Answer the runner until "stop" (0), a failed batch (1) or an orphaning (1)."""
    while True:
        if not sock.poll(1000):
            if parent and os.getppid() != parent:
                return 1
            continue
        frames = sock.recv_multipart()
        recv_at = time.time()
        msg = json.loads(frames[0])
        if msg["op"] == "stop":
            return 0
        if msg["op"] == "drop":
            stage.drop(msg["batch"])
            continue
        try:
            hdr, data = stage.run(msg, frames[1] if len(frames) > 1 else b"")
        except Exception as e:  # noqa: BLE001 -- any failure is the batch's, reported as one line
            err = f"{type(e).__name__}: {e}".replace("\n", " ")
            sock.send_multipart([json.dumps({"op": "error", "batch": msg.get("batch"), "error": err}).encode()])
            print(f"stage_worker: batch {msg.get('batch')}: {err}", file=sys.stderr, flush=True)
            return 1
        hdr["recv_at"] = recv_at
        sock.send_multipart([json.dumps(hdr).encode(), data])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", required=True, choices=KINDS)
    ap.add_argument("--name", required=True)
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--in-n", type=int, required=True)
    ap.add_argument("--batch-max", type=int, required=True)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--parent", type=int, default=0)
    ap.add_argument("--handles", action="store_true", help="warm up the hand-off library at start")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    die_with_parent(args.parent)
    if args.kind in NETS:
        stage: Stage = NetStage(load_lib(), load_tonic(), args.kind, args.scale, args.in_n, args.batch_max)
    else:
        stage = Stage(load_lib(), stage_work(args.kind, args.scale, args.in_n), args.batch_max)
    stage.warm_up(args.handles)
    work = stage.w
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 1000)
    sock.setsockopt(zmq.IDENTITY, args.name.encode())
    sock.connect(args.endpoint)
    sock.send_multipart([json.dumps({"op": "ready", "name": args.name, "pid": os.getpid(),
                                     **asdict(work)}).encode()])
    try:
        return serve(sock, stage, args.parent)
    finally:
        stage.close()
        sock.close()
        ctx.term()


if __name__ == "__main__":
    sys.exit(main())
