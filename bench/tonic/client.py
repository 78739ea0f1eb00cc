#!/usr/bin/env python3
"""Load client for the Tonic services (bench/bin/tonic-service).

Connects to a service's Unix socket (or starts one with --serve NAME), sends
queries at a Poisson or fixed rate (or closed loop with --rate 0), each of a
size drawn at random from --sizes, and measures every query's end-to-end
latency from its scheduled arrival time (so a client that falls behind
counts as queueing, not as a lower rate).  Prints p50/p99/mean latency,
throughput, QoS violations against --qos-ms, the service's own server and
device times, and checksum checks; --out writes all of it, per query, as
JSON.  The wire format is documented in bench/tonic/proto.h.

Examples:
  client.py --serve dig --device sim --rate 50 --queries 200 --sizes 1,2,4,8
  client.py --socket /tmp/imc.sock --arrivals fixed --rate 20 --duration 30 --qos-ms 50
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICE = ROOT / "bench" / "bin" / "tonic-service"
SIMGPU_LIBS = ROOT / "shim" / "lib" / "simgpu"

REQ = struct.Struct("<IIQII")           # magic, kind, id, size, nbytes
REP = struct.Struct("<IiQQQQIIII")      # magic, status, id, checksum, server_ns,
                                        # device_ns, out_floats, unit_bytes, max_size, input_kind
RANGE = struct.Struct("<II")            # TONIC_INFER_RANGE: start, end (after REQ)
REQ_MAGIC, REP_MAGIC = 0x31514E54, 0x31524E54
INFER, INFO, INFER_RANGE = 0, 1, 2
OK, EBADREQ, EDEVICE = 0, 1, 2
STATUS = {OK: "ok", EBADREQ: "bad request", EDEVICE: "device error"}


@dataclass
class Info:
    unit_bytes: int
    max_size: int
    input_kind: int          # 0 images (float32), 1 words (int32 ids)
    n_ops: int = 0           # operators of a forward pass (0: no range requests)


@dataclass
class RangeReply:
    """The answer to a TONIC_INFER_RANGE request (proto.h)."""
    status: int
    id: int
    start_ns: int            # service's CLOCK_MONOTONIC at the range's first event
    server_ns: int
    device_ns: int           # device time of the range (CUDA events)
    n_ops: int               # operators run: end - start


@dataclass
class LoadSpec:
    """What load to offer: rate 0 means closed loop (one query in flight)."""
    sizes: list[int]
    rate: float = 0.0
    arrivals: str = "poisson"    # or "fixed"
    queries: int = 0             # 0: run for `duration` seconds
    duration: float = 10.0
    send_input: bool = False

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "LoadSpec":
        return cls(sizes=[int(x) for x in a.sizes.split(",")], rate=a.rate, arrivals=a.arrivals,
                   queries=a.queries, duration=a.duration, send_input=a.send_input)


@dataclass
class Query:
    id: int
    size: int
    arrival_s: float         # scheduled, from the start of the run
    sent: bool = False
    sent_s: float = 0.0
    done_s: float = 0.0
    status: int = -1         # -1: no reply
    checksum: str = ""
    server_ms: float = 0.0
    device_ms: float = 0.0

    @property
    def latency_ms(self) -> float:
        return (self.done_s - self.arrival_s) * 1e3


@dataclass
class Summary:
    sent: int
    answered: int
    errors: int
    elapsed_s: float
    throughput_qps: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    server_p50_ms: float
    device_p50_ms: float
    device_p99_ms: float
    qos_ms: float | None
    qos_violations: int
    checksum_mismatches: int
    checksums_per_size: dict[int, int] = field(default_factory=dict)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (the service's SUMMARY line uses the same)."""
    if not values:
        return 0.0
    v = sorted(values)
    k = max(1, -(-len(v) * q // 100))
    return v[int(k) - 1]


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("service closed the connection")
        buf += chunk
    return bytes(buf)


def read_reply(sock: socket.socket) -> tuple[int, int, int, int, int, int, int, int, int]:
    magic, *rest = REP.unpack(recv_exact(sock, REP.size))
    if magic != REP_MAGIC:
        raise ConnectionError(f"bad reply magic {magic:#x}")
    return tuple(rest)  # type: ignore[return-value]


def connect(path: str, timeout: float = 10.0) -> socket.socket:
    end = time.monotonic() + timeout
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except OSError:
            s.close()
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def info(sock: socket.socket) -> Info:
    sock.sendall(REQ.pack(REQ_MAGIC, INFO, 0, 0, 0))
    status, _id, _ck, _sn, _dn, n_ops, unit, max_size, kind = read_reply(sock)
    if status != 0:
        raise ConnectionError(f"INFO refused: {STATUS.get(status, status)}")
    return Info(unit, max_size, kind, n_ops)


def range_request(qid: int, size: int, start: int, end: int) -> bytes:
    """The bytes of a TONIC_INFER_RANGE request: operators [start, end)."""
    return REQ.pack(REQ_MAGIC, INFER_RANGE, qid, size, 0) + RANGE.pack(start, end)


def infer_range(sock: socket.socket, qid: int, size: int, start: int, end: int) -> RangeReply:
    """Run operators [start, end) of the network for an input of `size`
    and wait for the reply (a refusal comes back as its status)."""
    sock.sendall(range_request(qid, size, start, end))
    status, rid, start_ns, sns, dns, n_ops, *_ = read_reply(sock)
    return RangeReply(status, rid, start_ns, sns, dns, n_ops)


def make_input(inf: Info, size: int, rng: random.Random) -> bytes:
    """Random input of `size` images (float32 in [0,1)) or words (int32 ids)."""
    n = size * inf.unit_bytes // 4
    if inf.input_kind == 0:
        return struct.pack(f"<{n}f", *(rng.random() for _ in range(n)))
    return struct.pack(f"<{n}i", *(rng.randrange(0, 1 << 31) for _ in range(n)))


def schedule(spec: LoadSpec, rng: random.Random) -> list[Query]:
    """Open loop: arrival times and sizes of every query of the run."""
    out: list[Query] = []
    t = 0.0 if spec.arrivals == "fixed" else rng.expovariate(spec.rate)
    while (len(out) < spec.queries) if spec.queries else (t < spec.duration):
        out.append(Query(id=len(out) + 1, size=rng.choice(spec.sizes), arrival_s=t))
        t += rng.expovariate(spec.rate) if spec.arrivals == "poisson" else 1.0 / spec.rate
    return out


def fill_reply(q: Query, rep: tuple, now: float) -> None:
    status, rid, ck, server_ns, device_ns, *_ = rep
    if rid != q.id:
        raise ConnectionError(f"reply for query {rid}, expected {q.id}")
    q.done_s, q.status, q.checksum = now, status, f"{ck:016x}"
    q.server_ms, q.device_ms = server_ns / 1e6, device_ns / 1e6


def run_closed(sock: socket.socket, queries: list[Query], inf: Info, spec: LoadSpec,
               rng: random.Random) -> float:
    """One query in flight: the next is sent when the previous is answered.
    Appends to `queries` until spec.queries are done or spec.duration is over."""
    t0 = time.monotonic()
    while (len(queries) < spec.queries) if spec.queries else (time.monotonic() - t0 < spec.duration):
        q = Query(id=len(queries) + 1, size=rng.choice(spec.sizes), arrival_s=0.0)
        payload = make_input(inf, q.size, rng) if spec.send_input else b""
        q.arrival_s = q.sent_s = time.monotonic() - t0
        q.sent = True
        queries.append(q)
        sock.sendall(REQ.pack(REQ_MAGIC, INFER, q.id, q.size, len(payload)) + payload)
        fill_reply(q, read_reply(sock), time.monotonic() - t0)
        if q.status != 0:
            break
    return time.monotonic() - t0


def run_open(sock: socket.socket, queries: list[Query], inf: Info, spec: LoadSpec,
             rng: random.Random) -> float:
    """Open loop: a sender thread keeps the schedule, this thread reads replies."""
    payloads = [make_input(inf, q.size, rng) if spec.send_input else b"" for q in queries]
    t0 = time.monotonic()
    failed: list[BaseException] = []

    def sender() -> None:
        try:
            for q, payload in zip(queries, payloads):
                delay = t0 + q.arrival_s - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                q.sent_s = time.monotonic() - t0
                q.sent = True
                sock.sendall(REQ.pack(REQ_MAGIC, INFER, q.id, q.size, len(payload)) + payload)
        except OSError as e:           # the service went away: the reader says why
            failed.append(e)

    th = threading.Thread(target=sender, daemon=True)
    th.start()
    try:
        for q in queries:
            fill_reply(q, read_reply(sock), time.monotonic() - t0)
            if q.status != 0:
                break
    except (ConnectionError, OSError) as e:
        failed.append(e)
    th.join(timeout=1.0)
    if failed:
        print(f"client: stopped early: {failed[0]}", file=sys.stderr)
    return time.monotonic() - t0


def load(sock: socket.socket, spec: LoadSpec, rng: random.Random,
         queries: list[Query]) -> float:
    """Offer `spec` on a connected socket; fills `queries`, returns the elapsed seconds."""
    inf = info(sock)
    big = [s for s in spec.sizes if not 1 <= s <= inf.max_size]
    if big:
        raise SystemExit(f"client: size {big[0]} is not in 1..{inf.max_size} (the service's max)")
    if spec.rate > 0:
        queries.extend(schedule(spec, rng))
        return run_open(sock, queries, inf, spec, rng)
    return run_closed(sock, queries, inf, spec, rng)


def parse_expect(text: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for item in filter(None, text.split(",")):
        size, _, ck = item.partition("=")
        out[int(size)] = ck.lower().removeprefix("0x").rjust(16, "0")
    return out


def summarize(queries: list[Query], elapsed: float, args: argparse.Namespace) -> Summary:
    done = [q for q in queries if q.status == 0]
    lat = [q.latency_ms for q in done]
    expect = parse_expect(args.expect)
    mism = sum(1 for q in done if q.size in expect and expect[q.size] != q.checksum)
    per_size: dict[int, set[str]] = {}
    if not args.send_input:
        for q in done:
            per_size.setdefault(q.size, set()).add(q.checksum)
    return Summary(
        sent=sum(1 for q in queries if q.sent),
        answered=len(done),
        errors=sum(1 for q in queries if q.status > 0),
        elapsed_s=elapsed,
        throughput_qps=len(done) / elapsed if elapsed > 0 else 0.0,
        p50_ms=percentile(lat, 50), p99_ms=percentile(lat, 99),
        mean_ms=sum(lat) / len(lat) if lat else 0.0,
        server_p50_ms=percentile([q.server_ms for q in done], 50),
        device_p50_ms=percentile([q.device_ms for q in done], 50),
        device_p99_ms=percentile([q.device_ms for q in done], 99),
        qos_ms=args.qos_ms,
        qos_violations=sum(1 for x in lat if args.qos_ms is not None and x > args.qos_ms),
        checksum_mismatches=mism,
        checksums_per_size={s: len(c) for s, c in sorted(per_size.items())},
    )


def service_env(device: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a service runs in: simgpu's libraries first for `sim`."""
    env = dict(os.environ if base is None else base)
    if device == "sim" or (device == "auto" and not Path("/dev/nvidiactl").exists()):
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            filter(None, [str(SIMGPU_LIBS), env.get("LD_LIBRARY_PATH", "")]))
    return env


def start_service(net: str, sock_path: str, extra: list[str], wrap: list[str], device: str,
                  binary: str | Path = SERVICE, env: dict[str, str] | None = None,
                  timeout: float = 120.0) -> subprocess.Popen:
    """Start `tonic-service --net NET --socket PATH ...` and wait for its READY line.
    `env` (default os.environ) gets simgpu's libraries per `device`."""
    cmd = [*wrap, str(binary), "--net", net, "--socket", sock_path, *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=service_env(device, env))
    assert proc.stdout is not None
    end = time.monotonic() + timeout
    lines: list[str] = []
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("READY "):
            return proc
    proc.kill()
    proc.wait()
    raise RuntimeError(f"service {net} did not start: {' '.join(cmd)}\n{''.join(lines)}")


def stop_service(proc: subprocess.Popen, timeout: float = 30.0) -> str:
    """SIGTERM the service; returns the rest of its output (SUMMARY line included)."""
    if proc.poll() is None:
        proc.terminate()
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""


def run(args: argparse.Namespace) -> tuple[Summary, list[Query], str]:
    """The whole run: start the service if asked, load it, stop it."""
    rng = random.Random(args.seed)
    spec = LoadSpec.from_args(args)
    queries: list[Query] = []
    proc = None
    tmpdir = None
    sock_path = args.socket
    if args.serve:
        if not sock_path:
            tmpdir = tempfile.mkdtemp(prefix="tonic-", dir="/tmp")
            sock_path = os.path.join(tmpdir, f"{args.serve}.sock")
        proc = start_service(args.serve, sock_path, shlex.split(args.serve_args),
                             shlex.split(args.wrap), args.device, args.service)
    service_out = ""
    try:
        sock = connect(sock_path)
        try:
            elapsed = load(sock, spec, rng, queries)
        finally:
            sock.close()
    finally:
        if proc is not None:
            service_out = stop_service(proc)
        if tmpdir:
            try:
                os.rmdir(tmpdir)
            except OSError:
                pass
    return summarize(queries, elapsed, args), queries, service_out


def print_summary(s: Summary, args: argparse.Namespace) -> None:
    mode = f"{args.arrivals} {args.rate:g} qps" if args.rate > 0 else "closed loop"
    print(f"tonic client: {mode}, sizes {args.sizes}")
    print(f"  queries   sent {s.sent}  answered {s.answered}  errors {s.errors}  "
          f"in {s.elapsed_s:.2f} s  ({s.throughput_qps:.1f} qps)")
    print(f"  latency   p50 {s.p50_ms:.3f} ms  p99 {s.p99_ms:.3f} ms  mean {s.mean_ms:.3f} ms")
    print(f"  service   server p50 {s.server_p50_ms:.3f} ms  device p50 {s.device_p50_ms:.3f} ms"
          f"  p99 {s.device_p99_ms:.3f} ms")
    if s.qos_ms is not None:
        pct = 100.0 * s.qos_violations / s.answered if s.answered else 0.0
        print(f"  qos       {s.qos_violations} of {s.answered} over {s.qos_ms:g} ms ({pct:.1f} %)")
    print(f"  checksums mismatches {s.checksum_mismatches}  distinct per size "
          f"{s.checksums_per_size or '-'}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--socket", help="the service's Unix socket (with --serve: default a temp path)")
    p.add_argument("--serve", metavar="NAME", help="start tonic-service --net NAME first "
                   "(face dig imc pos chk ner) and stop it at the end")
    p.add_argument("--service", default=str(SERVICE), metavar="PATH",
                   help="the service binary for --serve (default: %(default)s)")
    p.add_argument("--serve-args", default="", metavar="ARGS",
                   help="more service options, e.g. '--width 0.25 --res 67'")
    p.add_argument("--wrap", default="", metavar="CMD",
                   help="prefix of the service's command line, e.g. "
                        "'colocate run --class qos --qos-ms 50 --'")
    p.add_argument("--device", choices=["auto", "sim", "gpu"], default="auto",
                   help="with --serve: sim puts simgpu's libraries first on LD_LIBRARY_PATH; "
                        "auto does so when no NVIDIA driver is present")
    p.add_argument("--rate", type=float, default=10.0,
                   help="queries per second; 0 = closed loop (one query in flight)")
    p.add_argument("--arrivals", choices=["poisson", "fixed"], default="poisson")
    p.add_argument("--duration", type=float, default=10.0, help="seconds of load (without --queries)")
    p.add_argument("--queries", type=int, default=0, help="send exactly N queries")
    p.add_argument("--sizes", default="1",
                   help="comma-separated input sizes (images per batch or words per sentence), "
                        "one drawn at random per query")
    p.add_argument("--seed", type=int, default=1, help="seeds arrivals, sizes and inputs")
    p.add_argument("--send-input", action="store_true",
                   help="send random input bytes instead of asking for the synthetic input")
    p.add_argument("--qos-ms", type=float, default=None, help="latency target: count violations")
    p.add_argument("--expect", default="", metavar="SIZE=HEX,...",
                   help="expected checksum per size (from `tonic-service --check`)")
    p.add_argument("--out", help="write the summary and every query as JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.socket and not args.serve:
        parser().error("need --socket PATH or --serve NAME")
    if args.rate < 0 or args.duration <= 0 or args.queries < 0:
        parser().error("--rate >= 0, --duration > 0, --queries >= 0")
    if not all(x.strip().isdigit() and int(x) > 0 for x in args.sizes.split(",")):
        parser().error("--sizes: comma-separated positive integers")
    try:
        summary, queries, service_out = run(args)
    except (ConnectionError, OSError, RuntimeError) as e:
        print(f"client: {e}", file=sys.stderr)
        return 1
    print_summary(summary, args)
    for line in service_out.splitlines():
        if line.startswith("SUMMARY "):
            print(f"  {line}")
    if args.out:
        doc = {"config": vars(args), "summary": asdict(summary),
               "service_summary": next((ln for ln in service_out.splitlines()
                                        if ln.startswith("SUMMARY ")), None),
               "queries": [{**asdict(q), "latency_ms": q.latency_ms} for q in queries]}
        Path(args.out).write_text(json.dumps(doc, indent=1))
    ok = summary.answered == len(queries) and summary.checksum_mismatches == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
