"""Operator-group samples for Abacus (`colocate profile --groups N tonic:NET ...`).

Instance-based sampling, as Abacus trains its latency MLP: 2..8 Tonic
services run at once, each its own process, all on one simulated device
(one SIMGPU_DIR, so their kernels contend in simgpu's model), each at the
same SM quota (100 % unless --quotas names one).  Then, per sample:

  1. draw a group: k services (k in --group-size, default 2-4), and for each
     a batch size (its --inputs) and an operator range start < end within
     the n_ops its INFO reply gives;
  2. issue the ranges at the same moment: one thread per service
     connection, released together by a barrier, each sending one
     TONIC_INFER_RANGE request (bench/tonic/proto.h);
  3. latency = max over members of (start_i + device_i) - min over members
     of start_i, in device time.

Why that latency.  An operator group starts when its first member starts
on the device and ends when its last one finishes (Abacus).  CUDA events
belong to one process, so the members' device end times cannot be compared
directly; each reply therefore carries device_ns (its range's device time,
from two events around it) and start_ns (the service's CLOCK_MONOTONIC
when it recorded the first event: one clock for all processes of a host).
A member's range runs on the device from start_i to start_i + device_i, so
the group spans max(start_i + device_i) - min(start_i).  On simgpu one
device second lasts `timescale` wall seconds, so the host-clock offsets
start_i - min(start) are divided by it to be device time.  The client's own
delay before the first request is not part of the group.  On a GPU
(timescale 1) the first event is recorded when the host issues it, which
is when the idle stream starts it: the same formula holds, up to the
launch latency.

Contention is modelled by simgpu only while it keeps time (timescale > 0).
A kernel's CPU twin runs when its predecessor ends, so a stream's next
kernel reaches the device model late by the twin's CPU time (milliseconds:
microseconds of device time at timescale 1000); other services' events
handled meanwhile used to push it later, so that co-run slowdowns depended
on the host's speed and load (dig 16 + face 2: +4 % idle, +10-18 % beside
two busy loops, none of it contention).  simgpu's device now waits for a
stream's queued kernel (shim/simgpu/model.c), at timescale 1000 for up to
10 s of wall time (SIMGPU_WAIT_US's default, which passes through), so no
twin on a loaded host outlasts it.

Solo times (a feature Abacus does not have; schema.GROUP says why): once
the services are up, every operator of every service is run alone at every
size to draw (solo_table), and a member's solo_S is the sum of its range's
entries.  simgpu runs a stream's operators back to back, so the sum is
within ~1 % of the range run alone.

Slots: each net has a fixed slot of the group bitmap (SLOTS), so that the
bitmap means the same services in every sample of a store; one instance
per net.  A word net's query is one sentence: batch 1, sequence length =
its size in words; an image net's size is its batch, sequence length 0.

Keys: "groups|<services>|q<quota>|ts<timescale>|s<seed>|<i>"; sample i is
drawn from its own generator seeded by (seed, i), so a rerun skips the
indices already stored and draws the same groups for the others.
"""
from __future__ import annotations

import os
import random
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from predictors import profile as P
from predictors import schema as S

SLOTS: dict[str, int] = {"face": 0, "dig": 1, "imc": 2, "pos": 3, "chk": 4, "ner": 5}
WORD_NETS = ("pos", "chk", "ner")
TIMESCALE = 1000.0
QUERY_ID0 = 2_000_001
FLUSH = 25                      # samples appended to the store at a time


@dataclass
class Service:
    """One running service process and the connection to it."""
    target: P.Target
    slot: int
    sizes: list[int]
    proc: Any = None
    sock: socket.socket | None = None
    n_ops: int = 0
    solo: dict[int, list[float]] = field(default_factory=dict)   # size -> us per operator

    def solo_us(self, size: int, start: int, end: int) -> float:
        """Device time of operators [start, end) alone (solo_table)."""
        return float(sum(self.solo[size][start:end]))


@dataclass
class Member:
    """One service's part of a group: operators [start, end) for `size`."""
    svc: int                    # index into the service list
    start: int
    end: int
    size: int


@dataclass
class Result:
    latency_us: float
    device_us: list[float]      # per member, in member order
    offset_us: list[float]      # start_i - min(start), device time


@dataclass
class Summary:
    added: int = 0
    skipped: int = 0
    failed: int = 0
    elapsed_s: float = 0.0
    members: dict[int, int] = field(default_factory=dict)   # group size -> samples


def check_targets(targets: Sequence[P.Target]) -> None:
    """Group sampling co-runs Tonic services, one per net, 2..8 of them."""
    bad = [t.label for t in targets if t.kind != "tonic"]
    if bad:
        raise P.ProfileError(f"--groups samples Tonic services only (tonic:NET), not {bad[0]!r}")
    nets = [t.net for t in targets]
    if len(set(nets)) != len(nets):
        raise P.ProfileError("--groups: each net at most once (a net has one slot of the bitmap)")
    if not 2 <= len(nets) <= S.GROUP_SLOTS:
        raise P.ProfileError(f"--groups needs 2..{S.GROUP_SLOTS} services, got {len(nets)}")


def parse_group_size(spec: str, n: int) -> tuple[int, int]:
    """"2-4" or "3" -> (lo, hi), clipped to the services there are."""
    lo_s, _, hi_s = spec.partition("-")
    try:
        lo, hi = int(lo_s), int(hi_s or lo_s)
    except ValueError:
        raise P.ProfileError(f"--group-size {spec!r}: K or LO-HI") from None
    if not 1 <= lo <= hi:
        raise P.ProfileError(f"--group-size {spec!r}: need 1 <= LO <= HI")
    if lo > n:
        raise P.ProfileError(f"--group-size {spec!r}: only {n} services")
    return lo, min(hi, n)


def config_label(targets: Sequence[P.Target], quota: int, timescale: float) -> str:
    return f"{'+'.join(t.label for t in targets)}|q{quota}|ts{timescale:g}"


def batch_seq(net: str, size: int) -> tuple[int, int]:
    """(batch, sequence length) of a query of `size` to `net`."""
    return (1, size) if net in WORD_NETS else (size, 0)


def draw(rng: random.Random, services: Sequence[Service], lo: int, hi: int) -> list[Member]:
    """A random group: k services, each a random non-empty range and size."""
    k = rng.randint(lo, hi)
    out = []
    for i in sorted(rng.sample(range(len(services)), k)):
        sv = services[i]
        start = rng.randrange(sv.n_ops)
        end = rng.randint(start + 1, sv.n_ops)
        out.append(Member(i, start, end, rng.choice(sv.sizes)))
    return out


def group_env(tmp: Path, quota: int, timescale: float,
              base: dict[str, str] | None = None) -> dict[str, str]:
    """The services' shared environment: simgpu, one device, the quota.
    No shim: the latency comes from the device model, and nothing needs a
    trace; simgpu's model knobs (SIMGPU_SMS, ...) pass through."""
    src = dict(os.environ if base is None else base)
    env = {k: v for k, v in src.items()
           if not k.startswith("COLOCATE_") and k not in (
               "LD_PRELOAD", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "SIMGPU_DIR",
               "SIMGPU_REPORT", "SIMGPU_LAUNCH_LOG", "SIMGPU_TIMESCALE")}
    env.update(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(quota), SIMGPU_TIMESCALE=f"{timescale:g}",
               SIMGPU_DIR=str(tmp / "dev"))
    return env


def start(targets: Sequence[P.Target], tmp: Path, quota: int, timescale: float,
          timeout: float = 120.0) -> list[Service]:
    """Start one service process per target on one simulated device; on a
    failure the ones already started are stopped."""
    cl = P._client()
    env = group_env(tmp, quota, timescale)
    out: list[Service] = []
    try:
        for i, t in enumerate(targets):
            sizes = [int(s) for s in t.inputs]
            sv = Service(t, SLOTS[t.net], sizes)
            path = str(tmp / f"{i}.sock")
            args = [*t.cmd[3:], "--max-size", str(max(sizes))]
            try:
                sv.proc = cl.start_service(t.net, path, args, [], "sim", t.cmd[0], env, timeout)
            except (RuntimeError, OSError) as e:
                raise P.RunFailed(f"{t.label} did not start\n{P.tail_of(str(e))}") from None
            out.append(sv)
            sv.sock = cl.connect(path)
            sv.sock.settimeout(timeout)
            sv.n_ops = cl.info(sv.sock).n_ops
            if sv.n_ops < 1:
                raise P.RunFailed(f"{t.label} reports no operators: a service without "
                                  f"TONIC_INFER_RANGE (rebuild with `make build`)")
    except BaseException:
        stop(out)
        raise
    return out


def stop(services: Sequence[Service]) -> str:
    """Close the connections and stop the processes; their output, joined."""
    cl = P._client()
    outs = []
    for sv in services:
        if sv.sock is not None:
            sv.sock.close()
            sv.sock = None
        if sv.proc is not None:
            outs.append(cl.stop_service(sv.proc))
            sv.proc = None
    return "".join(outs)


def issue(services: Sequence[Service], members: Sequence[Member], qid: int,
          timescale: float) -> Result:
    """Issue the members' ranges together (one thread each, a barrier) and
    time the group (module doc).  Raises RunFailed when a member fails."""
    cl = P._client()
    replies: list[Any] = [None] * len(members)
    errors: list[str] = []
    bar = threading.Barrier(len(members))

    def one(j: int, m: Member) -> None:
        sock = services[m.svc].sock
        assert sock is not None
        req = cl.range_request(qid + j, m.size, m.start, m.end)
        try:
            bar.wait()
            sock.sendall(req)
            status, rid, start_ns, _sns, dns, n_ops, *_ = cl.read_reply(sock)
        except (OSError, ConnectionError, threading.BrokenBarrierError) as e:
            errors.append(f"{services[m.svc].target.label}: {type(e).__name__}: {e}")
            bar.abort()
            return
        if status != cl.OK or rid != qid + j or n_ops != m.end - m.start:
            errors.append(f"{services[m.svc].target.label} [{m.start}, {m.end}) size {m.size}: "
                          f"status {cl.STATUS.get(status, status)}")
            return
        replies[j] = (start_ns, dns)

    threads = [threading.Thread(target=one, args=(j, m), daemon=True)
               for j, m in enumerate(members)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise P.RunFailed("; ".join(errors))
    scale = timescale if timescale > 0 else 1.0
    t0 = min(r[0] for r in replies)
    offs = [(r[0] - t0) / scale / 1e3 for r in replies]
    devs = [r[1] / 1e3 for r in replies]
    lat = max(o + d for o, d in zip(offs, devs))
    return Result(lat, devs, offs)


def solo_table(services: Sequence[Service], timescale: float, qid: int = 1) -> None:
    """Each service's operators alone, one at a time, at each of its sizes
    (the device is otherwise idle): Service.solo."""
    for i, sv in enumerate(services):
        for size in sv.sizes:
            sv.solo[size] = [issue(services, [Member(i, k, k + 1, size)], qid,
                                   timescale).device_us[0] for k in range(sv.n_ops)]


def sample(services: Sequence[Service], members: Sequence[Member], res: Result,
           key: str) -> dict[str, Any]:
    """A GROUP row of what was issued and how long it took."""
    row = {}
    for m in members:
        sv = services[m.svc]
        batch, seq = batch_seq(sv.target.net, m.size)
        row[sv.slot] = (m.start, m.end, batch, seq, sv.solo_us(m.size, m.start, m.end))
    return {"key": key, "src": P.SRC, "f": S.group_row(row), "t": {"latency_us": res.latency_us}}


def sample_groups(targets: Sequence[P.Target], n: int, store: Any, quota: int = 100,
                  timescale: float = TIMESCALE, group_size: str = "2-4", seed: int = 0,
                  timeout: float = 300.0, progress: bool = True,
                  log: Callable[[str], None] = print) -> Summary:
    """Make the store hold samples 0..n-1 of this configuration (module
    doc); returns what was done.  Samples are appended FLUSH at a time, so
    a run that stops keeps what it measured."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    check_targets(targets)
    if not timescale > 0:
        raise P.ProfileError("--timescale must be > 0: simgpu models contention only while "
                             "it keeps time")
    lo, hi = parse_group_size(group_size, len(targets))
    prefix = f"groups|{config_label(targets, quota, timescale)}|s{seed}|"
    have = store.keys("group")
    todo = [i for i in range(n) if prefix + str(i) not in have]
    summ = Summary(skipped=n - len(todo))
    if not todo:
        return summ
    t0 = time.monotonic()
    pending: list[dict[str, Any]] = []
    cols = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn())
    with tempfile.TemporaryDirectory(prefix="colocate-groups-") as d, \
            Progress(*cols, disable=not progress, transient=False) as bar:
        job = bar.add_task("groups", total=len(todo))
        services = start(targets, Path(d), quota, timescale, timeout)
        err = ""
        try:
            bar.update(job, description="solo operators")
            try:
                solo_table(services, timescale)
            except P.RunFailed as e:
                summ.failed += 1
                err = str(e)
                todo = []
            bar.update(job, description="groups")
            for i in todo:
                rng = random.Random(f"{seed}:{i}")
                members = draw(rng, services, lo, hi)
                try:
                    res = issue(services, members, QUERY_ID0 + 8 * i, timescale)
                except P.RunFailed as e:
                    summ.failed += 1
                    err = str(e)
                    break
                pending.append(sample(services, members, res, prefix + str(i)))
                summ.members[len(members)] = summ.members.get(len(members), 0) + 1
                if len(pending) >= FLUSH:
                    summ.added += store.append("group", pending, src=P.SRC)
                    pending = []
                bar.advance(job)
        finally:
            if pending:
                summ.added += store.append("group", pending, src=P.SRC)
            out = stop(services)
    summ.elapsed_s = time.monotonic() - t0
    if err:
        log(f"FAILED after {summ.added} samples: {err}\n{P.tail_of(out)}")
    return summ

