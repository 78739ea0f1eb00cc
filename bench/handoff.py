"""Camelot Fig. 11, live on simgpu: handing a device buffer to the next
pipeline stage by handle (shim/handoff.py) against the copy it replaces.

    python bench/handoff.py [--sizes 2,4096,...] [--timescale 1] [--seconds 0.5] [--json] [--slow]

Two stage processes on one simulated device, connected by a ZeroMQ PAIR
socket (ipc://), as pipeline stages would be.  For each size, per buffer,
timed in the sending stage from before the first call to the receiver's
acknowledgement, each path in its own back-to-back phase (as a stage hands
over batch after batch):

  ping       a bare ZeroMQ round trip of a handle-sized frame: the
             transport's share of everything below.
  hand-off   export(buf) -> handle frame -> open_handle (mapped, no copy)
             -> release -> ack.  The buffer stays the sender's and is
             handed over again and again (a stage's output buffer reused
             from batch to batch: the common case).
  fresh      the same with a new buffer per hand-off, dropped by the
             sender after the ack; freed once the receiver no longer maps
             it (its next open unmaps it), by the sender's next alloc or
             its exporter's thread: never under the receiver's mapping.
Every export pays one reference in advance for the receiver (export()'s
consumers=1), which its open takes over.
  copy       cudaMemcpy D2H into a host array -> the bytes as a frame ->
             cudaMemcpy H2D into the receiver's device buffer -> ack
             (Fig. 8a's main-memory path).

Medians (and p90); also each path's own cost without the ZeroMQ transport
(export + open + release, + drop for fresh buffers, against D2H + H2D,
timed inside the stages).  The receiver checks the data (CRC) of the first
hand-off and copy.  simgpu's copies take their modelled PCIe time at
--timescale 1 (the default: "live"); 0 leaves only the host memcpy.
--slow runs the importer with COLOCATE_HANDOFF_SLOW=1 (a round trip to the
exporter per open, a mapping per open: the protocol before the fast path).
The issue's target: a hand-off <= 100 us.

On a small, shared machine a process that slept (simgpu's modelled copy
time is a sleep) runs its next microseconds on cold caches: interleaving
the paths iteration by iteration made every hand-off pay for the copy
before it, growing with the copy's size; the phases are separate for that.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DEFAULT_SIZES = [2, 256, 4096, 20480, 65536, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
D2H, H2D = 2, 1


def _cudart() -> ctypes.CDLL:
    rt = ctypes.CDLL("libcudart.so.13")          # simgpu's, through LD_LIBRARY_PATH
    rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    rt.cudaFree.argtypes = [ctypes.c_void_p]
    return rt


def _iters(size: int, seconds: float) -> int:
    # enough for a median, bounded in time for the big copies
    return max(15, min(400, int(seconds / max(size / 2e9, 20e-6))))


def _copy(rt: Any, dst: int, src: int, size: int, kind: int) -> None:
    if rt.cudaMemcpy(dst, src, size, kind) != 0:
        raise RuntimeError(f"cudaMemcpy of {size} bytes (kind {kind}) failed")


def _device_crc(rt: Any, ptr: int, size: int) -> int:
    """CRC-32 of device memory, read back with cudaMemcpy (simgpu or GPU)."""
    import numpy as np
    host = np.empty(size, np.uint8)
    _copy(rt, host.ctypes.data, ptr, size, D2H)
    return zlib.crc32(host)


def sender(addr: str, rundir: str, sizes: list[int], seconds: float) -> None:
    import numpy as np
    import zmq

    from shim import handoff as H
    rt = _cudart()
    sock = zmq.Context.instance().socket(zmq.PAIR)
    sock.setsockopt(zmq.RCVTIMEO, PEER_TIMEOUT_MS)     # a dead receiver ends this stage, not hangs it
    sock.connect(addr)
    ex = H.Exporter(rundir)
    frame = bytes(H.HANDLE_BYTES)
    out = []
    for size in sizes:
        buf = ex.alloc(size)
        # filled and checked through cudaMemcpy: on a GPU the buffer is not
        # host memory (Buffer.numpy is simgpu's only)
        host = np.arange(size, dtype=np.uint64).astype(np.uint8)
        crc = zlib.crc32(host)
        _copy(rt, buf.ptr, host.ctypes.data, size, H2D)
        n = _iters(size, seconds)
        nf = max(15, n // 2)
        sock.send_json({"size": size, "n": n, "nf": nf, "crc": crc})
        ping, hand, fresh, copy, exp_s, expf_s, d2h_s = [], [], [], [], [], [], []
        for _ in range(n):                      # the transport alone
            t0 = time.perf_counter()
            sock.send(frame, copy=False)
            sock.recv()
            ping.append(time.perf_counter() - t0)
        for _ in range(n):                      # the stage's buffer, handed over batch after batch
            t0 = time.perf_counter()
            h = ex.export(buf)
            te = time.perf_counter()
            sock.send(h, copy=False)
            sock.recv()
            hand.append(time.perf_counter() - t0)
            exp_s.append(te - t0)
        for _ in range(nf):                     # a new buffer per hand-off
            b = ex.alloc(size)
            t0 = time.perf_counter()
            h = ex.export(b)
            te = time.perf_counter()
            sock.send(h, copy=False)
            sock.recv()
            ts = time.perf_counter()
            ex.drop(b)                          # after the ack; freed once the receiver unmaps it
            fresh.append(time.perf_counter() - t0)
            expf_s.append((te - t0) + (time.perf_counter() - ts))
        for _ in range(n):                      # the copy it replaces
            t1 = time.perf_counter()
            _copy(rt, host.ctypes.data, buf.ptr, size, D2H)
            td = time.perf_counter()
            sock.send(host, copy=False)
            sock.recv()
            copy.append(time.perf_counter() - t1)
            d2h_s.append(td - t1)
        checks = sock.recv_json()
        ex.drop(buf)
        # the mechanism's own cost, transport left out: export + open + release
        # against D2H + H2D, iteration by iteration
        own_h = [a + b for a, b in zip(exp_s, checks.pop("open_release_s"))]
        own_f = [a + b for a, b in zip(expf_s, checks.pop("fresh_open_release_s"))]
        own_c = [a + b for a, b in zip(d2h_s, checks.pop("h2d_s"))]
        out.append({"size": size, "n": n, "ping_s": ping, "handoff_s": hand, "fresh_s": fresh, "copy_s": copy,
                    "handoff_own_s": own_h, "fresh_own_s": own_f, "copy_own_s": own_c, **checks})
    sock.send_json({"size": 0})
    sock.recv()                                 # the receiver closed its importer: nothing mapped
    end = time.monotonic() + 2
    while ex.stats()["live_buffers"] and time.monotonic() < end:
        time.sleep(0.01)                        # the exporter's thread frees what it held
    stats = ex.stats()
    ex.close()
    print(json.dumps({"rows": out, "exporter": stats}))


def receiver(addr: str) -> None:
    import numpy as np
    import zmq

    from shim import handoff as H
    rt = _cudart()
    sock = zmq.Context.instance().socket(zmq.PAIR)
    sock.setsockopt(zmq.RCVTIMEO, PEER_TIMEOUT_MS)
    sock.bind(addr)
    imp = H.Importer()
    while True:
        hdr = sock.recv_json()
        size = hdr["size"]
        if not size:
            break
        dev = ctypes.c_void_p()
        if rt.cudaMalloc(ctypes.byref(dev), size) != 0:
            raise RuntimeError(f"cudaMalloc of {size} bytes failed")
        ok_h = ok_f = ok_c = True
        orl, orlf, h2d = [], [], []
        for _ in range(hdr["n"]):
            sock.recv()
            sock.send(b"")
        for i in range(hdr["n"]):
            h = sock.recv(copy=False).bytes
            t0 = time.perf_counter()
            v = imp.open(h, expect_size=size)
            if i == 0:
                ok_h = _device_crc(rt, v.ptr, size) == hdr["crc"] and v.how == "mapped"
            v.release()
            orl.append(time.perf_counter() - t0)
            sock.send(b"")
        for _ in range(hdr["nf"]):
            h = sock.recv(copy=False).bytes
            t0 = time.perf_counter()
            v = imp.open(h, expect_size=size)
            ok_f = ok_f and v.how == "mapped"
            v.release()
            orlf.append(time.perf_counter() - t0)
            sock.send(b"")
        for i in range(hdr["n"]):
            src = np.frombuffer(sock.recv(copy=False).buffer, np.uint8)
            t0 = time.perf_counter()
            _copy(rt, dev.value, src.ctypes.data, size, H2D)
            h2d.append(time.perf_counter() - t0)
            if i == 0:
                ok_c = _device_crc(rt, dev.value, size) == hdr["crc"]
            sock.send(b"")
        rt.cudaFree(dev)
        sock.send_json({"handoff_ok": ok_h and ok_f, "copy_ok": ok_c, "open_release_s": orl,
                        "fresh_open_release_s": orlf, "h2d_s": h2d})
    st = imp.stats()
    try:
        cst = imp.cache_stats()
    except AttributeError:                      # a library without the fast path
        cst = {}
    imp.close()                                 # unmaps what it kept: the sender may free it
    sock.send(b"")
    print(json.dumps({"importer": st, "importer_cache": cst}))


PEER_TIMEOUT_MS = 60_000    # a stage waiting longer on the other has lost it


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def human(n: int) -> str:
    for unit, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k} {unit}"
    return f"{n} B"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)))
    ap.add_argument("--quick", action="store_true", help="three sizes (2 B, 64 KiB, 4 MiB), 0.2 s each")
    ap.add_argument("--out", type=Path, help="also write rows.json and table.md there (colocate experiment)")
    ap.add_argument("--timescale", default="1", help="SIMGPU_TIMESCALE (1: modelled PCIe time, live)")
    ap.add_argument("--device", choices=("sim", "cuda"), default="sim",
                    help="sim (default): simgpu; cuda: the real GPU's driver (no simgpu libraries)")
    ap.add_argument("--seconds", type=float, default=0.5, help="rough time budget per size and path")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--slow", action="store_true",
                    help="COLOCATE_HANDOFF_SLOW=1: no fast path nor kept mappings (the protocol before them)")
    ap.add_argument("--stage", choices=["sender", "receiver"], help=argparse.SUPPRESS)
    ap.add_argument("--addr", help=argparse.SUPPRESS)
    ap.add_argument("--rundir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.seconds = "2,65536,4194304", min(args.seconds, 0.2)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes {args.sizes!r}: comma-separated byte counts")
    if not sizes or min(sizes) < 1:
        ap.error("--sizes: each size at least 1 byte")
    if args.stage == "sender":
        sender(args.addr, args.rundir, sizes, args.seconds)
        return 0
    if args.stage == "receiver":
        receiver(args.addr)
        return 0

    from shim import launcher, paths
    from shim.build import build_native
    if args.device == "cuda" and not launcher.cuda_usable():
        print("handoff: --device cuda: no NVIDIA driver answers here (use --device sim)", file=sys.stderr)
        return 2
    build_native()
    simdir = tempfile.mkdtemp(prefix="simgpu-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    rundir = tempfile.mkdtemp(prefix="hfb-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLOCATE_", "SIMGPU_")) and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = str(ROOT)
    if args.device == "sim":
        env.update(SIMGPU_DIR=simdir, SIMGPU_TIMESCALE=args.timescale,
                   LD_LIBRARY_PATH=os.pathsep.join([str(paths.SIMGPU_DIR)] + [p for p in env.get(
                       "LD_LIBRARY_PATH", "").split(os.pathsep) if p]))
    if args.slow:
        env["COLOCATE_HANDOFF_SLOW"] = "1"
    addr = f"ipc://{rundir}/pipe.sock"
    me = [sys.executable, __file__, "--sizes", args.sizes, "--seconds", str(args.seconds), "--addr", addr]
    try:
        rx = subprocess.Popen(me + ["--stage", "receiver"], env=env, stdout=subprocess.PIPE, text=True)
        tx = subprocess.run(me + ["--stage", "sender", "--rundir", rundir], env=env, stdout=subprocess.PIPE,
                            text=True, timeout=1800)
        rx_out, _ = rx.communicate(timeout=60)
    finally:
        shutil.rmtree(simdir, ignore_errors=True)
        shutil.rmtree(rundir, ignore_errors=True)
    if tx.returncode or rx.returncode:
        print(f"a stage failed (sender {tx.returncode}, receiver {rx.returncode})", file=sys.stderr)
        return 1
    res = json.loads(tx.stdout.strip().splitlines()[-1])
    rx_res = json.loads(rx_out.strip().splitlines()[-1])
    res["importer"], res["importer_cache"] = rx_res["importer"], rx_res.get("importer_cache", {})
    rows = []
    for r in res["rows"]:
        q = {k: quantile(r[f"{k}_s"], 0.5) * 1e6 for k in ("ping", "handoff", "fresh", "copy")}
        rows.append({"size": r["size"], "n": r["n"],
                     "ping_us_p50": q["ping"],
                     "handoff_us_p50": q["handoff"],
                     "handoff_us_p90": quantile(r["handoff_s"], 0.9) * 1e6,
                     "handoff_own_us_p50": quantile(r["handoff_own_s"], 0.5) * 1e6,
                     "handoff_share_us_p50": q["handoff"] - q["ping"],
                     "fresh_us_p50": q["fresh"],
                     "fresh_us_p90": quantile(r["fresh_s"], 0.9) * 1e6,
                     "fresh_own_us_p50": quantile(r["fresh_own_s"], 0.5) * 1e6,
                     "copy_us_p50": q["copy"],
                     "copy_us_p90": quantile(r["copy_s"], 0.9) * 1e6,
                     "copy_own_us_p50": quantile(r["copy_own_s"], 0.5) * 1e6,
                     "data_ok": bool(r["handoff_ok"] and r["copy_ok"])})
    meta = {"timescale": args.timescale, "slow": args.slow}
    if args.json:
        print(json.dumps({**meta, "rows": rows, "exporter": res["exporter"], "importer": res["importer"],
                          "importer_cache": res["importer_cache"]}, indent=1))
        return 0
    lines = []
    notes = ([f"SIMGPU_TIMESCALE={args.timescale}"] if args.device == "sim" else []) + \
        (["COLOCATE_HANDOFF_SLOW=1"] if args.slow else [])
    where = ("simgpu" if args.device == "sim" else "the GPU") + (f" ({', '.join(notes)})" if notes else "")
    lines.append(f"Camelot Fig. 11 on {where}: per buffer, medians (p90), us")
    lines.append("  ping:      a bare ZeroMQ round trip of a handle-sized frame (the transport's share)")
    lines.append("  hand-off:  export + send + open + release + ack, the stage's buffer reused batch after batch;"
                 " own: export + open + release")
    lines.append("  fresh:     the same with a new buffer per hand-off, dropped after the ack (freed once unmapped);"
                 " own: export + drop + open + release")
    lines.append("  copy:      D2H + send + H2D + ack; own: D2H + H2D")
    lines.append(f"{'size':>9} {'n':>4} {'ping':>7} {'hand-off':>17} {'own':>6} {'-ping':>6} {'fresh':>17} {'own':>6}"
                 f" {'copy':>19} {'own':>9} {'copy/hand-off':>13} {'data':>5}")
    for r in rows:
        lines.append(f"{human(r['size']):>9} {r['n']:>4} {r['ping_us_p50']:>7.1f}"
                     f" {r['handoff_us_p50']:>7.1f} ({r['handoff_us_p90']:>7.1f}) {r['handoff_own_us_p50']:>6.1f}"
                     f" {r['handoff_share_us_p50']:>6.1f}"
                     f" {r['fresh_us_p50']:>7.1f} ({r['fresh_us_p90']:>7.1f}) {r['fresh_own_us_p50']:>6.1f}"
                     f" {r['copy_us_p50']:>9.1f} ({r['copy_us_p90']:>7.1f}) {r['copy_own_us_p50']:>9.1f}"
                     f" {r['copy_us_p50'] / r['handoff_us_p50']:>12.2f}x {'ok' if r['data_ok'] else 'BAD':>5}")
    worst = max(r["handoff_us_p50"] for r in rows)
    worst_own = max(r["handoff_own_us_p50"] for r in rows)
    worst_fresh = max(r["fresh_us_p50"] for r in rows)
    cst = res["importer_cache"]
    lines.append(f"hand-off median <= 100 us at every size: end to end {'yes' if worst <= 100 else 'no'} (worst "
                 f"{worst:.1f} us; fresh buffers: worst {worst_fresh:.1f} us), own cost "
                 f"{'yes' if worst_own <= 100 else 'no'} (worst {worst_own:.1f} us)")
    lines.append(f"importer: {res['importer']['maps']} mapped, {res['importer']['copies']} copied"
                 + (f"; {cst['map_calls']} mappings made, {cst['hits']} kept ones reused, {cst['fast_acquires']} "
                    f"references without a round trip, {cst['slow_acquires']} with" if cst else "")
                 + f"; exporter live buffers at the end: {res['exporter']['live_buffers']}")
    print("\n".join(lines))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        dev = "simgpu, live" if args.device == "sim" else "GPU"
        (args.out / "table.md").write_text(f"# camelot-comm ({dev})\n\n```\n" + "\n".join(lines) + "\n```\n")
        (args.out / "rows.json").write_text(json.dumps({"meta": {"experiment": "camelot-comm",
                                                                  "timescale": args.timescale,
                                                                  "slow": args.slow,
                                                                  "device": "simgpu (live)" if args.device == "sim"
                                                                  else "cuda"},
                                                         "rows": rows, "exporter": res["exporter"],
                                                         "importer": res["importer"],
                                                         "importer_cache": res["importer_cache"]}, indent=1))
    return 0 if all(r["data_ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
