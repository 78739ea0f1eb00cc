"""The controller: one ZeroMQ ROUTER, one control block, one policy.

Applications (libcolocate.so) and admin clients (the CLI) are DEALER sockets
sending [b"", json]; every request gets exactly one reply [b"", json] (an
"error" message for anything malformed).  The loop also runs a ~100 ms tick:
a check of each app's ledger (shim/proto/ledger.h: exited, or killed and gone) and of
its pid, which collects apps whatever happened to their messages, then the
policy's on_tick.  Handlers are `on_<type>` methods; see protocol.py.

With a process pool (processpool.Pool, `serve --pool SPEC`), the tick also
checks the workers: apps routed to a worker that died go back to route 0
(local), and the pool restarts it under a new id.  Routes are decided in one
place, Controller.resolve(): a Decision whose route is None gets a ready
worker of exactly its quota (100 % without a 100 % worker: local).
"""
from __future__ import annotations

import collections
import fcntl
import json
import logging
import math
import os
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

from controlplane import metrics, protocol
from controlplane.client import ping, proc_start, read_pid
from controlplane.policies.base import AppInfo, Decision, Policy, QueryEvent, TaskDone, make_policy_spec
from predictors import schema
from predictors.profile import RunFailed, lib_params
from processpool import Pool, parse_spec
from shim.ctlblock import ROUTE_HOLD, ROUTE_PART, ControlBlock, ControlBlockFull, is_partition, is_worker, part_starts
from shim.ledger import Ledger
from shim.rundir import ColocateError, RunDir, version

log = logging.getLogger("colocate")
VERSION = version()
TICK_S = 0.1
HISTORY_MAX = 10_000
RECV_MAX = 16 * protocol.MAX_BYTES   # bigger ones make zmq drop the peer; 64 KiB..1 MiB get an error
QUERY_WINDOW = 1000                # latencies behind each app's p50/p99
QUERY_IN_FLIGHT_MAX = 4096         # begun, not ended: the oldest is given up beyond this
RECENT_EXITS = 64                  # exited apps whose late query boundaries still count
OCC_QUERIES = 64                   # recent queries whose task occurrences are kept per app
THROUGHPUT_WINDOW_S = 5.0         # a live batch app's throughput: launches over the last this long
BATCH_TASK_EVERY_S = 0.005         # a batch app's same-named tasks reach the policy at most this often
RELEASE_GRACE_S = 2.0              # an exited app's slot is freed when its pid is gone, or after this


class Reject(Exception):
    """A well-formed request the controller refuses; the text goes to the client."""


class NoWorker(Exception):
    """No pool worker can take a route; str() says why."""


# --- query statistics -------------------------------------------------------

def percentile(sorted_ms: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an ascending list; None when it is empty."""
    if not sorted_ms:
        return None
    return sorted_ms[max(0, math.ceil(p / 100 * len(sorted_ms)) - 1)]


@dataclass
class QueryStats:
    """One app's queries: how many ended, which are in flight, recent latencies.
    One rule at a time: the app's first API boundary discards what inference
    found (the shim stops inferring then), and inferred boundaries arriving
    after that are ignored."""
    rule: str | None = None
    done: int = 0
    unmatched: int = 0
    violations: int = 0                                 # ended later than the app's QoS target
    in_flight: dict[int, float] = field(default_factory=dict)          # id -> begin (us)
    window: collections.deque = field(default_factory=lambda: collections.deque(maxlen=QUERY_WINDOW))

    def _take(self, rule: str) -> bool:
        if rule == self.rule:
            return True
        if self.rule == "api":
            return False
        if self.rule is not None:                       # inferred -> api
            self.done, self.unmatched, self.violations = 0, 0, 0
            self.in_flight.clear()
            self.window.clear()
        self.rule = rule
        return True

    def begin(self, qid: int, t_us: float, rule: str) -> None:
        if not self._take(rule):
            return
        if qid not in self.in_flight and len(self.in_flight) >= QUERY_IN_FLIGHT_MAX:
            del self.in_flight[next(iter(self.in_flight))]
            self.unmatched += 1
        self.in_flight[qid] = t_us

    def end(self, qid: int, t_us: float, rule: str, qos_ms: float | None = None) -> None:
        if not self._take(rule):
            return
        t0 = self.in_flight.pop(qid, None)
        if t0 is None:
            self.unmatched += 1
            return
        self.done += 1
        ms = max(0.0, (t_us - t0) / 1000.0)
        self.window.append(ms)
        if qos_ms is not None and ms > qos_ms:
            self.violations += 1

    def summary(self) -> dict:
        lat = sorted(self.window)
        return {"rule": self.rule, "done": self.done, "in_flight": len(self.in_flight),
                "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99), "window": len(lat),
                "unmatched": self.unmatched, "violations": self.violations}


@dataclass
class App:
    info: AppInfo
    start: int | None
    exe: str
    registered_at: float
    quota_pct: int = 100
    route: int = 0
    kernels: list = field(default_factory=list)
    unplaced: tuple | None = None                       # last (quota, route) warned about
    queries: QueryStats = field(default_factory=QueryStats)
    final: dict | None = None                           # its history record, once exited
    held: bool = False                                  # route CB_ROUTE_HOLD written
    feed: dict | None = None                            # task feedback counts (protocol.FEED)
    # occurrence of each task name: per query (QoS apps; recent queries only) or per run
    occ: collections.OrderedDict = field(default_factory=collections.OrderedDict)
    query_size: collections.OrderedDict = field(default_factory=collections.OrderedDict)
    last_task: tuple[str, float] = ("", 0.0)           # batch: last task given to the policy, when
    fwd_window: int | None = None                       # routed launches in flight it may have
    dead_at: float | None = None                        # tick that first found the process gone
    skipped: dict = field(default_factory=dict)         # batch: name -> [tasks, us] not passed on
    launch_log: collections.deque = field(default_factory=lambda: collections.deque(maxlen=256))
                                                        # (monotonic s, launches) at ticks
    ledger: Ledger | None = None                        # its shared record, while live
    ledger_final: dict | None = None                    # what the ledger said at the end


class BadTask(ValueError):
    """A task record that cannot become a predictors task row."""


def _dims(v: Any, what: str) -> tuple[int, int, int]:
    if v is None:
        return (0, 0, 0)
    if (not isinstance(v, list) or len(v) != 3
            or not all(type(x) is int and 0 <= x < 2**32 for x in v)):
        raise BadTask(f"{what} must be [x, y, z] of non-negative ints, got {v!r}")
    return (v[0], v[1], v[2])


def merge_kernels(ledger: list[dict], message: list[dict]) -> list[dict]:
    """The ledger's kernel table plus the kernels only the exit message
    names (those the ledger had no room for), launches summed by name."""
    out = {k["name"]: dict(k) for k in ledger}
    for k in message:
        if k["name"] in out:
            continue                                    # the ledger's count is the exact one
        out[k["name"]] = dict(k)
    return list(out.values())


def task_features(t: dict, input_bytes: float, occurrence: int) -> dict:
    """A fed task record (protocol.TASK) -> the predictors task row, as
    predictors.profile.task_sample builds it from a trace record."""
    if t["kind"] == "kernel":
        return schema.task_row(t["name"], input_bytes, _dims(t["grid"], "grid"),
                                _dims(t["block"], "block"), t["shmem"] or 0, t["quota"],
                                occurrence=occurrence)
    params = t.get("params")
    if params is not None and not isinstance(params, dict):
        raise BadTask(f"params must be an object, got {type(params).__name__}")
    if params and not all(math.isfinite(float(v)) for v in params.values()
                          if isinstance(v, (int, float)) and not isinstance(v, bool)):
        raise BadTask("params must be finite numbers")
    try:
        lp = lib_params(t["name"], params)
    except RunFailed as e:                              # more parameters than the schema has
        raise BadTask(str(e)) from None
    return schema.task_row(t["name"], input_bytes, quota=t["quota"], params=lp, occurrence=occurrence)


# --- the controller ---------------------------------------------------------

ROUTE_KINDS = ("pool", "partition")


class Controller:
    def __init__(self, rd: RunDir, policy: Policy, device: str, pool: Pool | None = None,
                 pool_note: str = "", solo: dict[str, float] | None = None, route_kind: str = "pool"):
        """pool: started by the caller (after the socket is bound, see serve());
        None: no pool, and explicit routes in decisions are taken as they are.
        solo: launches per second of each batch app (by name) alone at 100 %,
        which its throughput is normalised to (serve --solo FILE).
        route_kind: where a quota below 100 % goes -- "pool" (a worker of that
        quota) or "partition" (an SM partition inside the app, ROUTE_PART)."""
        if route_kind not in ROUTE_KINDS:
            raise ValueError(f"route kind must be one of {', '.join(ROUTE_KINDS)}, not {route_kind!r}")
        self.route_kind = route_kind
        self.solo = dict(solo or {})
        self.metrics: metrics.Snapshot | None = None    # --metrics-port
        self.rd, self.policy, self.device = rd, policy, device
        self.pool, self.pool_note = pool, pool_note
        self.apps: dict[int, App] = {}                  # slot -> live app
        self.history: collections.deque = collections.deque(maxlen=HISTORY_MAX)
        self.recent: collections.OrderedDict[int, App] = collections.OrderedDict()   # pid -> exited app
        self.releasing: dict[int, tuple[App, float]] = {}   # slot -> (finished app, when), see release()
        self.stopping = False
        self.bad_tasks = 0                              # malformed "tasks" messages
        self.cb = ControlBlock.create(rd.ctlblock)
        shutil.rmtree(rd.apps, ignore_errors=True)      # ledgers of a previous controller's apps
        rd.apps.mkdir(mode=0o700, exist_ok=True)
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.MAXMSGSIZE, RECV_MAX)
        self.sock.setsockopt(zmq.LINGER, 500)           # let the last replies ("stop") out
        self.sock.bind(rd.endpoint)
        os.chmod(rd.sock, 0o600)

    def run(self) -> None:
        log.info("controller %d serving %s (policy %s, device %s, route kind %s)", os.getpid(),
                 self.rd.endpoint, self.policy.name, self.device, self.route_kind)
        next_tick = time.monotonic()
        try:
            while not self.stopping:
                wait_ms = max(0, int((next_tick - time.monotonic()) * 1000))
                if self.sock.poll(wait_ms, zmq.POLLIN):
                    self.drain()
                now = time.monotonic()
                if now >= next_tick:
                    self.tick(now)
                    next_tick = now + TICK_S
        finally:
            self.close()

    def close(self) -> None:
        if self.pool is not None:
            try:
                self.pool.stop()
            except Exception:
                log.exception("stopping the process pool failed")
        self.sock.close()
        self.ctx.term()
        self.rd.sock.unlink(missing_ok=True)
        # with the pool gone no worker will read them; they would pile up in
        # the runtime dir (often a tmpfs: memory), one per binary ever routed
        shutil.rmtree(self.rd.modules, ignore_errors=True)
        self.cb.close()                                 # the file stays: apps keep their mapping
        for app in self.apps.values():
            if app.ledger is not None:
                app.ledger.close()
        shutil.rmtree(self.rd.apps, ignore_errors=True)
        log.info("controller %d stopped", os.getpid())

    def drain(self, budget: int = 256, budget_s: float = 0.02) -> None:
        """Handle queued messages: at most `budget` of them and about
        `budget_s` seconds, so that a flood of task reports cannot keep the
        tick (liveness, pool, policy) waiting."""
        end = time.monotonic() + budget_s
        for _ in range(budget):
            if time.monotonic() > end:
                return
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            reply = self.handle(frames[1:])
            if reply is None:                           # one-way message ("tasks")
                continue
            try:
                self.sock.send_multipart([frames[0], b"", protocol.encode(reply)], zmq.NOBLOCK)
            except zmq.ZMQError as e:                   # peer gone or its queue full
                log.warning("reply dropped: %s", e)

    def handle(self, frames: list[bytes]) -> dict | None:
        """One request's frames (identity removed) -> its reply (None: a
        one-way message, answered only when malformed)."""
        t = None
        try:
            if len(frames) != 2 or frames[0] != b"":
                raise protocol.SchemaError(f"expected 2 frames [empty delimiter, JSON], got {len(frames)}"
                                         + ("" if len(frames) != 2 else " with a non-empty delimiter"))
            raw = protocol.decode(frames[1])
            t = raw.get("type") if isinstance(raw, dict) and isinstance(raw.get("type"), str) else None
            msg = protocol.validate(raw)
            return getattr(self, "on_" + msg["type"])(msg)
        except (protocol.SchemaError, Reject) as e:
            if t == "tasks":
                self.bad_tasks += 1
            log.warning("bad request (%s): %s; got %s", t, e, _preview(frames))
            return protocol.error(str(e), t if t in protocol.REQUESTS else None)
        except Exception as e:                          # a bug: say so, keep serving
            log.exception("internal error handling %s", t)
            return protocol.error(f"internal error: {e}", t if t in protocol.REQUESTS else None)

    def tick(self, now: float) -> None:
        for app in self.apps.values():
            if app.info.cls == "batch":
                app.launch_log.append((now, self.cb.counters(app.info.slot)["launches"]))
                while now - app.launch_log[0][0] > THROUGHPUT_WINDOW_S:
                    app.launch_log.popleft()
        if self.metrics is not None:                    # what the HTTP thread serves
            self.metrics.publish([self.record(a) for a in self.apps.values()])
        for app in list(self.apps.values()):
            try:
                self.check_app(app, now)
            except Exception:                           # a bug: say so, keep serving the others
                log.exception("checking app %s (pid %d) failed", app.info.name, app.info.pid)
        if self.releasing:
            self.release_due(now)
        if self.pool is not None:
            try:
                self.unroute(self.pool.check())
            except Exception:
                log.exception("process pool check failed")
        self.decide("on_tick", now)

    def check_app(self, app: App, now: float) -> None:
        """Collect an app that is done: its ledger says it exited (its exit
        message may be stuck behind a backlog, or dropped), or its process is
        gone (killed: the ledger still has its kernel table).  Without a
        ledger, the exit message has until the next tick to come."""
        lg = app.ledger
        if lg is not None and lg.state() == "exited":
            # kernels the ledger had no room for come in the exit message:
            # give it a tick
            if lg.counters()["kernels_lost"] and app.dead_at is None:
                app.dead_at = now
                return
            self.finish(app, [], "exited")
            return
        if proc_start(app.info.pid) == app.start:
            return
        if lg is not None and lg.attached():
            log.info("app %s (pid %d, slot %d) ended without exiting (killed?); records from its ledger",
                     app.info.name, app.info.pid, app.info.slot)
            self.finish(app, [], "killed")
            return
        if app.dead_at is None:
            app.dead_at = now
            return
        log.info("app %s (pid %d, slot %d) died without exit", app.info.name, app.info.pid,
                 app.info.slot)
        self.finish(app, [], "vanished")

    def open_ledger(self, slot: int, pid: int) -> Ledger | None:
        try:
            return Ledger.create(self.rd.ledger(slot, pid), pid, slot)
        except OSError as e:
            log.warning("slot %d (pid %d): no ledger (%s); its records come by message only", slot, pid, e)
            return None

    @staticmethod
    def ledger_part(app: App, part: str) -> dict | None:
        """The app's ledger's "queries" or "counters": as read at its end once
        it exited, live while it runs, None without a ledger it attached."""
        if app.ledger_final is not None:
            return app.ledger_final[part]
        if app.ledger is not None and app.ledger.attached():
            return getattr(app.ledger, part)()
        return None

    def queries(self, app: App) -> dict:
        """Query statistics: the exact counts from the ledger (what the app
        counted), the recent window and in-flight set from messages."""
        q = app.queries.summary()
        lq = self.ledger_part(app, "queries")
        if lq is None or lq["rule"] is None:
            return q
        q.update(rule=lq["rule"], messages=q["done"], done=lq["ended"], begun=lq["begun"],
                 violations=lq["violations"],
                 run={k: lq[k] for k in ("p50_ms", "p99_ms", "mean_ms", "max_ms")})
        return q

    def feed(self, app: App) -> dict | None:
        if app.feed is None:
            return None
        f = dict(app.feed)
        c = self.ledger_part(app, "counters")
        if c is not None:
            f["dropped"] = max(f["dropped"], c["tasks_dropped"])
            f["fed"] = c["tasks_fed"]
        return f

    def unroute(self, dead: list[int]) -> None:
        """Apps routed to workers that died go back to running locally (the
        shim replays what the worker had not acknowledged)."""
        if not dead:
            return
        for app in list(self.apps.values()):
            if app.route in dead:
                q = app.info.requested_quota_pct or 100
                log.warning("app %s (slot %d): worker %d died; route local at %d%%", app.info.name,
                            app.info.slot, app.route, q)
                self.set_route(app, q, 0)

    # --- policy decisions -> control block
    def decide(self, hook: str, *args: Any) -> None:
        """Call a policy hook and apply what it decides; a failing policy is
        logged and decides nothing (apps keep their current quota)."""
        try:
            self.apply(getattr(self.policy, hook)(*args))
        except Exception:
            log.exception("policy %s failed in %s", self.policy.name, hook)

    def apply(self, decisions: list[Decision]) -> None:
        for d in decisions or []:
            app = self.apps.get(d.slot)
            if app is None:
                log.warning("policy %s decided for slot %d, which has no live app", self.policy.name, d.slot)
                continue
            q = min(100, max(1, int(d.quota_pct)))
            if d.hold:
                self.hold(app, q)
                continue
            route = None if d.route is None else max(0, int(d.route))
            if (q, route) != (d.quota_pct, d.route):
                log.warning("policy %s: %s clamped to quota %d route %s", self.policy.name, d, q, route)
            try:
                route = self.resolve(app, q, route)
                app.unplaced = None
            except NoWorker as e:
                if app.unplaced != (q, d.route):       # once per decision, not every tick
                    log.warning("policy %s: slot %d (%s) at %d%%: %s; running it locally",
                                self.policy.name, d.slot, app.info.name, q, e)
                    app.unplaced = (q, d.route)
                route = 0
            self.set_route(app, q, route)
        self.place()

    def span_start(self, app: App, quota_pct: int) -> int:
        """Where app's span starts at quota_pct, the other apps on partitions
        where they are (place()'s rule): so its first route is already
        disjoint from theirs (apps after it move in place(), after)."""
        on = [(a.info.cls == "qos", a.info.slot, a.route & 0xFF) for a in self.apps.values()
              if a is not app and not a.held and is_partition(a.route)]
        return part_starts(on + [(app.info.cls == "qos", app.info.slot, quota_pct)])[app.info.slot]

    def place(self) -> None:
        """Route kind partition: the apps on partitions get consecutive spans
        of the device, QoS apps first, then batch apps, each in slot order
        (CB_ROUTE_PART | start << 8 | pct; cb_part_span in ctlblock.h turns a
        span into SM groups), so that their partitions share no SM while
        their quotas sum to 100 % or less (but for a small span rounded onto
        the last group a larger one reaches).  Past 100 % a span is the device's
        last pct % (overlapping).  An app whose start moves is routed again
        (its next launch changes partition)."""
        if self.route_kind != "partition":
            return
        on = [a for a in self.apps.values() if not a.held and is_partition(a.route)]
        starts = part_starts([(a.info.cls == "qos", a.info.slot, a.route & 0xFF) for a in on])
        for app in on:
            route = ROUTE_PART | starts[app.info.slot] << 8 | app.route & 0xFF
            if route != app.route:
                self.set_route(app, app.quota_pct, route)

    def resolve(self, app: App, quota_pct: int, route: int | None) -> int:
        """The route an app gets for (quota, route) -- the one place that rule lives:
        None -> a ready pool worker of exactly that quota (the app's current one if
        it qualifies, else the least loaded); with none at 100 %, local.  0 -> local.
        N -> worker N, which must be ready when this controller runs a pool.
        NoWorker when nothing fits.  With route kind "partition", None -> an SM
        partition of quota_pct % in the app itself (100 %: local)."""
        if route is None and self.route_kind == "partition":
            if quota_pct >= 100:
                return 0
            return ROUTE_PART | self.span_start(app, quota_pct) << 8 | quota_pct
        if route is None:
            if (self.pool is not None and self.pool.is_ready(app.route)
                    and self.pool.quota_of(app.route) == quota_pct):
                return app.route                       # sticky: no flapping between equals
            wid = self.pool.pick(quota_pct, self.load()) if self.pool is not None else None
            if wid is not None:
                return wid
            if quota_pct == 100:
                return 0
            if self.pool is None:
                raise NoWorker("there is no process pool" + (f" ({self.pool_note})" if self.pool_note else ""))
            raise NoWorker(self.pool.why_none(quota_pct))
        if route != 0 and self.pool is not None and not self.pool.is_ready(route):
            w = self.pool.worker(route)
            raise NoWorker(f"worker {route} is " + (w.state if w else "not in the pool"))
        return route

    def load(self) -> dict[int, int]:
        """worker id -> live apps routed to it."""
        return dict(collections.Counter(a.route for a in self.apps.values() if is_worker(a.route)))

    def set_route(self, app: App, quota_pct: int, route: int) -> None:
        """Write (quota, route); a held app is released by any route."""
        if (quota_pct, route) != (app.quota_pct, app.route) or app.held:
            self.cb.set_route(app.info.slot, route, quota_pct)
            if app.held:
                log.info("slot %d (%s): released, quota %d%% route %d", app.info.slot, app.info.name,
                         quota_pct, route)
            app.quota_pct, app.route, app.held = quota_pct, route, False
            log.debug("slot %d (%s): quota %d%% route %d", app.info.slot, app.info.name, quota_pct, route)

    def hold(self, app: App, quota_pct: int) -> None:
        """Route CB_ROUTE_HOLD: the app's next kernel launch waits (its shim
        leaves its worker first) until a later route releases it.  quota_pct
        is kept for display; the app counts as routed nowhere."""
        if app.held and app.quota_pct == quota_pct:
            return
        self.cb.set_route(app.info.slot, ROUTE_HOLD, quota_pct)
        if not app.held:
            log.info("slot %d (%s): held", app.info.slot, app.info.name)
        app.quota_pct, app.route, app.held = quota_pct, 0, True

    def worker_of(self, app: App) -> dict | None:
        if not is_worker(app.route):
            return None
        q = self.pool.quota_of(app.route) if self.pool is not None else None
        return {"id": app.route, "quota_pct": app.quota_pct if q is None else q}

    @staticmethod
    def partition_of(app: App, k: dict) -> dict | None:
        """An app on an SM partition: the SMs its shim made it (its span
        rounded to the device's partition size; 0 when it could not make
        one and runs on all SMs), the first of them, of how many, and
        launches that ran on all SMs meanwhile (graphs, cooperative
        kernels)."""
        if not is_partition(app.route):
            return None
        return {"sms": k["part_sms"], "first": k["part_first"], "total": k["part_total"],
                "local": k["part_local"]}

    # --- records
    def record(self, app: App, state: str = "live", exited_at: float | None = None) -> dict:
        c, k = self.cb.counters(app.info.slot), self.cb.control(app.info.slot)
        i = app.info
        return {"name": i.name, "pid": i.pid, "class": i.cls, "quota_pct": app.quota_pct,
                "route": app.route, "launches": c["launches"], "forwarded": c["forwarded"],
                "h2d_bytes": c["h2d_bytes"], "d2h_bytes": c["d2h_bytes"], "qos_ms": i.qos_ms,
                "state": state, "slot": i.slot, "kernels": app.kernels,
                "registered_at": app.registered_at, "exited_at": exited_at, "worker": self.worker_of(app),
                "queries": self.queries(app), "held": app.held,
                "held_ms": k["held_ns"] / 1e6, "partition": self.partition_of(app, k),
                "feed": self.feed(app),
                "throughput": self.throughput(app, c["launches"], exited_at), "end": None}

    def throughput(self, app: App, launches: int, exited_at: float | None) -> dict | None:
        """A batch app's launches per second (over the last THROUGHPUT_WINDOW_S
        while live; over its whole run once exited), and normalised to its
        solo rate when serve --solo gave one; None for QoS apps."""
        if app.info.cls != "batch":
            return None
        rate = None
        if exited_at is not None:
            span = exited_at - app.registered_at
            rate = launches / span if span > 0 else None
        elif len(app.launch_log) >= 2:
            (t0, n0), (t1, n1) = app.launch_log[0], app.launch_log[-1]
            rate = (n1 - n0) / (t1 - t0) if t1 > t0 else None
        solo = self.solo.get(app.info.name)
        return {"launches_per_s": rate, "solo_launches_per_s": solo,
                "normalised": rate / solo if rate is not None and solo else None}

    def finish(self, app: App, kernels: list[dict], end: str = "exited") -> dict:
        """Final record (counters read before the slot is freed), history, policy, release.
        The kernel table comes from the ledger when the app used one (exact,
        and there even after a SIGKILL), else from the exit message."""
        lg, app.ledger = app.ledger, None               # once: a failure below never repeats
        if lg is not None:
            try:
                if lg.attached():
                    kernels = merge_kernels(lg.kernels(), kernels)
                    app.ledger_final = {"queries": lg.queries(), "counters": lg.counters()}
                    lost = app.ledger_final["counters"]["kernels_lost"]
                    if lost:
                        log.warning("app %s (pid %d): %d kernel(s) not in its ledger (table full); "
                                    "their counts come from its exit message", app.info.name,
                                    app.info.pid, lost)
            except Exception:
                log.exception("reading the ledger of %s (pid %d) failed", app.info.name, app.info.pid)
            finally:
                lg.close()
                try:
                    self.rd.ledger(app.info.slot, app.info.pid).unlink(missing_ok=True)
                except OSError as e:
                    log.warning("cannot remove %s: %s", self.rd.ledger(app.info.slot, app.info.pid), e)
        app.kernels = kernels
        rec = self.record(app, "exited", time.time())
        rec["end"] = end
        del self.apps[app.info.slot]
        self.history.append(rec)
        app.final = rec
        self.recent[app.info.pid] = app                 # its last query boundaries may still come
        while len(self.recent) > RECENT_EXITS:
            self.recent.popitem(last=False)
        try:
            with open(self.rd.history, "a") as f:
                f.write(json.dumps(rec) + "\n")
        except OSError as e:
            log.error("cannot append to %s: %s", self.rd.history, e)
        self.release(app)
        self.decide("on_exit", app.info)
        log.info("app %s (pid %d) finished: %d launches", app.info.name, app.info.pid, rec["launches"])
        return rec

    def release(self, app: App, now: float | None = None) -> None:
        """Free a finished app's control-block slot once its process is gone,
        or RELEASE_GRACE_S after it said it exited: an exiting process may
        still have a thread that loaded the slot's counters before its exit
        handler moved them, and its last add must not land in the slot of
        the app that gets it next."""
        now = time.monotonic() if now is None else now
        self.releasing.setdefault(app.info.slot, (app, now))
        self.release_due(now)

    def release_due(self, now: float) -> None:
        for slot, (a, since) in list(self.releasing.items()):
            if proc_start(a.info.pid) != a.start or now - since >= RELEASE_GRACE_S:
                del self.releasing[slot]
                self.cb.release(slot)

    def by_pid(self, pid: int) -> App | None:
        return next((a for a in self.apps.values() if a.info.pid == pid), None)

    # --- handlers: one per request type ------------------------------------
    def on_register(self, m: dict) -> dict:
        pid = m["pid"]
        start = proc_start(pid)
        if start is None:
            raise Reject(f"pid {pid} is not running")
        app = self.by_pid(pid)
        if app is not None and app.start != start:      # old app died, pid reused
            self.finish(app, [], "killed" if app.ledger is not None and app.ledger.attached() else "vanished")
            app = None
        if app is None:
            try:
                slot = self.cb.claim(pid)
            except ControlBlockFull as e:
                raise Reject(str(e)) from None
            info = AppInfo(slot, pid, m["name"], m["class"], m["qos_ms"], m["quota_pct"], m["device"])
            app = App(info, start, m["exe"], self.cb.control(slot)["registered_ns"] / 1e9)
            app.ledger = self.open_ledger(slot, pid)    # before the reply: the shim maps it then
            self.apps[slot] = app
            if self.wants_tasks(info):
                app.feed = {"tasks": 0, "untimed": 0, "dropped": 0, "bad": 0}
            app.fwd_window = self.fwd_window(info)
            self.decide("on_register", info)
            log.info("registered %s (pid %d, %s, %s) in slot %d: quota %d%% route %d", info.name, pid,
                     info.cls, app.exe or "?", slot, app.quota_pct, app.route)
        extra: dict[str, Any] = {} if app.fwd_window is None else {"fwd_window": app.fwd_window}
        if self.route_kind == "partition":
            extra["partitions"] = True
        return protocol.message("registered", slot=app.info.slot, quota_pct=app.quota_pct,
                              route=app.route, controller_pid=os.getpid(), feed=app.feed is not None,
                              revision=protocol.REVISION, **extra)

    def fwd_window(self, info: AppInfo) -> int | None:
        try:
            n = self.policy.fwd_window(info)
        except Exception:
            log.exception("policy %s failed in fwd_window", self.policy.name)
            return None
        return None if n is None else max(1, min(4096, int(n)))

    def wants_tasks(self, info: AppInfo) -> bool:
        try:
            return bool(self.policy.wants_tasks(info))
        except Exception:
            log.exception("policy %s failed in wants_tasks", self.policy.name)
            return False

    def on_exit(self, m: dict) -> dict:
        app = self.apps.get(m["slot"])
        if app is None or app.info.pid != m["pid"]:
            done = self.recent.get(m["pid"])
            if done is not None and done.info.slot == m["slot"]:
                return protocol.message("ok")             # collected from its ledger already
            raise Reject(f"slot {m['slot']} is not registered to pid {m['pid']}")
        self.finish(app, m["kernels"])
        return protocol.message("ok")

    def on_ping(self, m: dict) -> dict:
        return protocol.message("pong", controller_pid=os.getpid(), policy=self.policy.name,
                              device=self.device, version=VERSION, apps=len(self.apps))

    def on_list(self, m: dict) -> dict:
        apps = [self.record(a) for a in sorted(self.apps.values(), key=lambda a: a.info.slot)]
        return protocol.message("apps", apps=apps + (list(self.history) if m["all"] else []))

    def on_pool(self, m: dict) -> dict:
        if self.pool is None:
            return protocol.message("pool", workers=[], spec="none", note=self.pool_note or "no process pool")
        rows = self.pool.stats()
        load = self.load()
        for r in rows:
            r["routed"] = load.get(r["id"], 0)
        return protocol.message("pool", workers=rows, spec=self.pool.spec, note=self.pool_note)

    def on_set_quota(self, m: dict) -> dict:
        name, q = m["name"], m["quota_pct"]
        apps = sorted((a for a in self.apps.values() if a.info.name == name), key=lambda a: a.info.slot)
        if not apps:
            raise Reject(f"no live app named {name!r}")
        try:
            routes = [(a, self.resolve(a, q, None)) for a in apps]
        except NoWorker as e:
            raise Reject(f"cannot give {name!r} {q}%: {e}") from None
        for a, route in routes:
            self.set_route(a, q, route)
        self.place()
        routes = [(a, a.route) for a in apps]
        for a, route in routes:
            log.info("set_quota: %s (slot %d) -> %d%% route %d", name, a.info.slot, q, route)
        return protocol.message("ok", slot=apps[0].info.slot, route=routes[0][1],
                              slots=[a.info.slot for a in apps], routes=[r for _, r in routes])

    def query_app(self, pid: int) -> App:
        """The live app of pid, else a recently exited one: boundaries travel on
        their own socket and may arrive after the app's exit message."""
        app = self.by_pid(pid) or self.recent.get(pid)
        if app is None:
            raise Reject(f"pid {pid} is not a registered app")
        return app

    def on_query(self, m: dict, begin: bool) -> dict:
        app = self.query_app(m["pid"])
        t_us = m["t_us"] if m["t_us"] is not None else time.monotonic() * 1e6
        q = app.queries
        was = q.rule
        if begin:
            q.begin(m["id"], t_us, m["rule"])
        else:
            q.end(m["id"], t_us, m["rule"], app.info.qos_ms)
        if q.rule != was:
            log.info("app %s (pid %d): queries %s", app.info.name, app.info.pid,
                     "marked by the app" if q.rule == "api" else "inferred from copies")
        if begin and q.rule == m["rule"]:
            app.query_size[m["id"]] = m["size"]
            while len(app.query_size) > OCC_QUERIES:
                app.query_size.popitem(last=False)
        if app.final is not None:
            app.final["queries"] = self.queries(app)
        elif q.rule == m["rule"]:
            # a live app's boundary, by the rule in force: the policy hears it
            info = QueryEvent(id=m["id"], size=m["size"], t_us=t_us, rule=m["rule"])
            self.decide("on_query_begin" if begin else "on_query_end", app.info, info)
        return protocol.message("ok")

    def on_query_begin(self, m: dict) -> dict:
        return self.on_query(m, True)

    def on_query_end(self, m: dict) -> dict:
        return self.on_query(m, False)

    def on_tasks(self, m: dict) -> None:
        """Completed tasks from an app's feed: each becomes a predictors task
        row with its occurrence (per query for QoS apps, per run for batch
        apps) and goes to policy.on_task_done.  One-way: no reply."""
        app = self.query_app(m["pid"])
        if app.final is None and m["slot"] != app.info.slot:
            raise Reject(f"pid {m['pid']} is not in slot {m['slot']}")
        if app.feed is None:
            app.feed = {"tasks": 0, "untimed": 0, "dropped": 0, "bad": 0}
        feed = app.feed
        feed["dropped"] = max(feed["dropped"], m["dropped"])
        for t in m["tasks"]:
            feed["tasks"] += 1
            qid = t["query"] if app.info.cls == "qos" else None
            seen = app.occ.setdefault(qid, {})
            if qid is not None:
                app.occ.move_to_end(qid)
                while len(app.occ) > OCC_QUERIES:
                    app.occ.popitem(last=False)
            occ = seen.get(t["name"], 0)
            seen[t["name"]] = occ + 1
            if qid is not None:
                inp = float(app.query_size.get(qid, 0))
            elif app.final is not None:
                inp = float(app.final["h2d_bytes"])
            else:
                inp = float(self.cb.counters(app.info.slot)["h2d_bytes"])
            try:
                row = task_features(t, inp, occ)
            except (BadTask, ValueError, TypeError, OverflowError) as e:
                feed["bad"] += 1
                log.warning("app %s (pid %d): bad task record %s: %s", app.info.name, app.info.pid,
                            t.get("n"), e)
                continue
            if t["dur_us"] is None:
                feed["untimed"] += 1
                continue
            if app.final is None:
                dur = float(t["dur_us"])
                if not self.batch_task_due(app, t["name"]):
                    acc = app.skipped.setdefault(t["name"], [0, 0.0])
                    acc[0] += 1
                    acc[1] += dur
                    continue
                n, us = app.skipped.pop(t["name"], (0, 0.0))
                self.decide("on_task_done", app.info,
                            TaskDone(features=row, duration_us=dur, quota_pct=t["quota"],
                                     query=t["query"], count=n + 1, total_us=us + dur))
        if app.final is not None:
            app.final["feed"] = self.feed(app)
        return None

    @staticmethod
    def batch_task_due(app: "App", name: str) -> bool:
        """Whether a batch app's completed task goes to the policy.  A batch
        app completes thousands of tasks a second and a policy only needs its
        current one (what it will run next), so one per BATCH_TASK_EVERY_S,
        and at once when the kernel changes.  QoS apps' tasks all go."""
        if app.info.cls != "batch":
            return True
        now = time.monotonic()
        if name == app.last_task[0] and now - app.last_task[1] < BATCH_TASK_EVERY_S:
            return False
        app.last_task = (name, now)
        return True

    def on_stop(self, m: dict) -> dict:
        log.info("stop requested")
        self.stopping = True
        return protocol.message("ok")


def _preview(frames: list[bytes], n: int = 120) -> str:
    return f"{len(frames)} frame(s) " + ", ".join(repr(f[:n]) + ("…" if len(f) > n else "") for f in frames[:4])


# --- serve ------------------------------------------------------------------

def lock_pidfile(rd: RunDir) -> int:
    """Hold an exclusive lock on serve.pid for the controller's lifetime and
    write our pid into it.  Refuses when another controller holds it."""
    while True:
        fd = os.open(rd.pidfile, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            pid = read_pid(rd)
            raise ColocateError(f"a controller is already running in {rd.path}"
                                + (f" (pid {pid})" if pid else "") + "; stop it with `colocate stop`") from None
        try:
            same = os.stat(rd.pidfile).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:                                        # not unlinked by a stopping controller
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)


def setup_logging(rd: RunDir, level: str, stderr: bool) -> None:
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(message)s")
    handlers: list[logging.Handler] = [logging.FileHandler(rd.log)]
    if stderr:
        handlers.append(logging.StreamHandler())
    for h in handlers:
        h.setFormatter(fmt)
        log.addHandler(h)
    log.setLevel(level.upper())


def policy(spec: str) -> Policy:
    """The policy of "NAME[,key=value,...]"; a bad name or option is a usage error."""
    try:
        return make_policy_spec(spec)
    except (ValueError, TypeError) as e:
        raise ColocateError(f"--policy {spec}: {e}", code=2) from None


def start_pool(rd: RunDir, device: str, spec: str | None) -> tuple[Pool | None, str]:
    """Start the process pool after the controller's socket is bound.  With the
    default spec (spec None) a pool that cannot start is logged and skipped;
    with an explicit one it is an error.  Returns (pool or None, note)."""
    entries = parse_spec(spec)
    if entries is None:
        return None, "disabled (--pool none)"
    pool = None
    try:
        pool = Pool(rd.path, device, entries)
        pool.start()
        return pool, ""
    except ColocateError as e:                          # PoolError, MpsError
        if pool is not None:
            pool.stop()
        if spec is not None:
            raise
        log.warning("no process pool: %s", e)
        return None, f"not started: {e}"


def load_solo(path: Path | str | None) -> dict[str, float]:
    """serve --solo FILE: {"app name": launches per second alone at 100 %, ...}."""
    if path is None:
        return {}
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ColocateError(f"--solo {path}: {e}", 2) from None
    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, (int, float))
                                          and not isinstance(v, bool) and v > 0 for k, v in d.items()):
        raise ColocateError(f"--solo {path}: want a JSON object of app name -> launches per second > 0", 2)
    return {k: float(v) for k, v in d.items()}


def green_contexts(device: str) -> str | None:
    """Why SM partitions (green contexts) cannot be used on `device`, or None
    when they can: simgpu's driver has them; a GPU's needs CUDA 12.5+
    (cuGreenCtxStreamCreate).  Each app's shim still checks its own device
    and runs on all SMs, saying why, when it cannot make a partition."""
    if device == "sim":
        return None
    import ctypes
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        return f"no CUDA driver ({e})"
    if not hasattr(cuda, "cuGreenCtxStreamCreate"):
        return "the CUDA driver has no green contexts (CUDA 12.5+ is needed)"
    return None


def route_kind(kind: str, device: str) -> str:
    """serve --route: "pool" or "partition" as asked; "auto": partition where
    the device has green contexts, else pool."""
    if kind not in ("auto", *ROUTE_KINDS):
        raise ColocateError(f"--route must be auto, pool or partition (got {kind!r})", 2)
    if kind != "auto":
        return kind
    why = green_contexts(device)
    if why:
        log.info("route kind pool: %s", why)
    return "pool" if why else "partition"


def serve(rd: RunDir, policy_name: str = "static", device: str = "sim", log_level: str = "info",
          log_stderr: bool = True, pool_spec: str | None = None,
          metrics_port: int | None = None, solo: Path | str | None = None,
          route: str = "pool") -> None:
    """Run a controller in the foreground until `stop`, SIGTERM or SIGINT.
    pool_spec: processpool spec ("10:2,50:2", "none"); None: the default pool,
    skipped with a warning when it cannot start -- and not started at all
    under route kind partition, which needs no worker.  metrics_port: serve
    Prometheus metrics over HTTP on 127.0.0.1:PORT.  route: "pool",
    "partition" or "auto" (serve --route)."""
    pol = policy(policy_name)
    parse_spec(pool_spec)                               # a bad spec: say so before anything
    solo_rates = load_solo(solo)
    fd = lock_pidfile(rd)
    try:
        live = ping(rd, timeout=0.5)
        if live:
            raise ColocateError(f"a controller (pid {live['controller_pid']}) already answers on "
                                f"{rd.sock}; stop it with `colocate stop`")
        rd.sock.unlink(missing_ok=True)                 # stale socket of a dead controller
        setup_logging(rd, log_level, log_stderr)
        kind = route_kind(route, device)
        try:
            ctl = Controller(rd, pol, device, solo=solo_rates, route_kind=kind)
        except (OSError, zmq.ZMQError) as e:
            raise ColocateError(f"cannot start the controller in {rd.path}: {e}") from None
        if metrics_port is not None:
            ctl.metrics = metrics.Snapshot()
            try:
                metrics.serve_http(metrics_port, ctl.metrics)
            except OSError as e:
                ctl.close()
                raise ColocateError(f"cannot serve metrics on port {metrics_port}: {e}") from None
            log.info("Prometheus metrics on http://127.0.0.1:%d/metrics", metrics_port)
        if kind == "partition" and pool_spec is None:
            pool_spec = "none"                          # SM partitions need no worker
        try:
            ctl.pool, ctl.pool_note = start_pool(rd, device, pool_spec)
            if kind == "partition" and ctl.pool is None:
                ctl.pool_note = "not started: route kind partition needs no worker"
        except ColocateError as e:
            log.error("cannot start the process pool: %s", e)
            ctl.close()
            raise ColocateError(f"cannot start the process pool: {e}", e.code) from None

        def on_signal(sig: int, _frame: Any) -> None:
            log.info("got %s, stopping", signal.Signals(sig).name)
            ctl.stopping = True
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        ctl.run()
    finally:
        if read_pid(rd) == os.getpid():
            rd.pidfile.unlink(missing_ok=True)
        os.close(fd)
