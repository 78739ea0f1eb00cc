"""Protocol v1 between applications (libcolocate.so), admin clients and the
controller, as data.

Transport: ZeroMQ ROUTER at ipc://RUNDIR/ctl.sock; clients are DEALER (or REQ)
sockets sending [b"", json]; replies are [b"", json].  Every message is a JSON
object with "v": 1 and "type".  To add a message type: one entry in REQUESTS
(and its reply in REPLIES), one `on_<type>` method in daemon.Controller.
`colocate schema` prints these tables.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

PROTOCOL = 1
# Additive changes (new message types, new optional fields) keep "v": 1 so
# that older shims keep working, and bump REVISION: 2 = "tasks" (task
# feedback), "feed" in "registered", held apps (route CB_ROUTE_HOLD);
# 3 = "revision" and "fwd_window" in "registered", "throughput" in records;
# 4 = "modules", "module_loads", "refused_kernels", "translated" in pool workers;
# 5 = "partition" in records and "partitions" in "registered" (route kind
#     partition: CB_ROUTE_PART | pct).
REVISION = 5
MAX_BYTES = 64 * 1024


class SchemaError(ValueError):
    """A message that does not follow the protocol; str() is the human text."""


@dataclass(frozen=True)
class Field:
    """One field: JSON type, required?, nullable?, allowed values/range."""
    type: str                                  # int | number | str | bool | list | object
    required: bool = True
    null: bool = False
    choices: tuple = ()
    min: float | None = None
    max: float | None = None
    positive: bool = False                     # number must be > 0
    items: dict[str, "Field"] | None = None        # schema of the objects in a list
    of: str = "object"                         # name of those objects
    default: Any = None
    doc: str = ""

    def describe(self) -> str:
        t = f"list[{self.of}]" if self.items is not None else self.type
        if self.choices:
            t = "|".join(json.dumps(c) for c in self.choices)
        return t + ("|null" if self.null else "")

    def bounds(self) -> str:
        """The allowed range in words ("1..100", "> 0, <= 86400000"), or ""."""
        if self.min is not None and self.max is not None:
            return f"{self.min}..{self.max}"
        parts = ["> 0"] if self.positive else []
        parts += [f">= {self.min}"] if self.min is not None else []
        parts += [f"<= {self.max}"] if self.max is not None else []
        return ", ".join(parts)


KERNEL = {
    "name": Field("str", doc="mangled kernel name"),
    "launches": Field("int", min=0),
    "twin": Field("bool", required=False, null=True, doc="simgpu ran it with a host twin"),
}

QUERIES = {
    "rule": Field("str", null=True, choices=("api", "inferred"),
              doc="how the shim finds queries: marked by the app (api) or inferred from copies"),
    "done": Field("int", doc="queries completed (under the current rule)"),
    "in_flight": Field("int", doc="begun, not ended"),
    "p50_ms": Field("number", null=True, doc="median latency over the recent window"),
    "p99_ms": Field("number", null=True, doc="99th percentile latency over the recent window"),
    "window": Field("int", doc="latencies in that window (the most recent ones)"),
    "unmatched": Field("int", doc="ends without a begin, and begins given up"),
    "violations": Field("int", doc="queries that ended later than the app's QoS target (qos_ms)"),
    "begun": Field("int", required=False, null=True,
               doc="queries begun, from the app's ledger (exact; null without one)"),
    "messages": Field("int", required=False, null=True,
                  doc="query ends that arrived as messages (done counts them all, from the ledger)"),
    "run": Field("object", required=False, null=True,
             doc="latency over the whole run from the ledger's histogram (±1.6 %): "
                 "p50_ms, p99_ms, mean_ms, max_ms"),
}

TASK = {
    "n": Field("int", min=0, doc="the app's task number (tasks fed or dropped before it)"),
    "kind": Field("str", choices=("kernel", "library")),
    "name": Field("str", doc="mangled kernel name, or the library entry point"),
    "grid": Field("list", null=True, doc="[x, y, z]; null for graphs and library tasks"),
    "block": Field("list", null=True),
    "shmem": Field("int", null=True, min=0),
    "stream": Field("str", required=False, default="0x0"),
    "host_us": Field("number", required=False, null=True, doc="CLOCK_MONOTONIC at issue"),
    "start_us": Field("number", null=True, doc="device start (us from the app's first task)"),
    "dur_us": Field("number", null=True, min=0,
                doc="device duration (the worker's, for a forwarded task); null: not timed"),
    "quota": Field("int", min=1, max=100, doc="the SM quota it ran at"),
    "route": Field("str", required=False, choices=("local", "worker"), default="local"),
    "worker": Field("int", required=False, null=True),
    "query": Field("int", null=True, min=0, max=2**64 - 1, doc="the query open when it was issued"),
    "params": Field("object", required=False, null=True, doc="library task: its parameters"),
    "kernels": Field("int", required=False, null=True, doc="library task: kernels it launched"),
    "rc": Field("int", required=False, null=True, doc="library task: its status"),
}

FEED = {
    "tasks": Field("int", doc="tasks received"),
    "untimed": Field("int", doc="of those, without a device time (not passed to the policy)"),
    "dropped": Field("int", doc="tasks the shim could not send (it says how many)"),
    "bad": Field("int", doc="task records refused as malformed"),
    "fed": Field("int", required=False, null=True, doc="tasks the shim took (its ledger; exact)"),
}

THROUGHPUT = {
    "launches_per_s": Field("number", null=True, doc="over the last 5 s while live; over the run once exited"),
    "solo_launches_per_s": Field("number", null=True, doc="alone at 100 % (serve --solo); null: unknown"),
    "normalised": Field("number", null=True, doc="launches_per_s / solo_launches_per_s"),
}

RECORD = {
    "name": Field("str"), "pid": Field("int"), "class": Field("str", choices=("qos", "batch")),
    "quota_pct": Field("int"), "route": Field("int", doc="0 = local, N = worker N, "
                                                          "0x80000000|start<<8|pct = an SM partition"),
    "launches": Field("int"), "forwarded": Field("int"), "h2d_bytes": Field("int"), "d2h_bytes": Field("int"),
    "qos_ms": Field("number", null=True), "state": Field("str", choices=("live", "exited")),
    "slot": Field("int"), "kernels": Field("list", items=KERNEL, of="kernel"),
    "registered_at": Field("number", doc="unix time"), "exited_at": Field("number", null=True),
    "worker": Field("object", null=True, doc="route's pool worker {id, quota_pct}; null = local"),
    "queries": Field("object", required=False, null=True, doc="query statistics (object queries)"),
    "held": Field("bool", required=False, default=False,
              doc="the policy holds its kernel launches (route CB_ROUTE_HOLD)"),
    "held_ms": Field("number", required=False, default=0.0, doc="time its launches waited on holds"),
    "partition": Field("object", required=False, null=True,
                   doc="route kind partition: {sms, first, total, local}: the SMs its partition has "
                       "(0: none could be made), its first SM, the device's, launches run on all SMs "
                       "meanwhile"),
    "feed": Field("object", required=False, null=True,
              doc="task feedback (object feed); null when the policy does not want it"),
    "throughput": Field("object", required=False, null=True,
                    doc="batch apps: object throughput; null for QoS apps"),
    "end": Field("str", required=False, null=True, choices=("exited", "killed", "vanished"),
             doc="exited apps: exited normally (its ledger or exit message says so), killed "
                 "(gone without its exit handler running: a signal such as SIGKILL, _exit, an exec; "
                 "records from its ledger), vanished (gone, no ledger: kernels unknown)"),
}

WORKER = {
    "id": Field("int", doc="worker id (never reused; a restarted worker gets a new one)"),
    "quota_pct": Field("int", doc="its CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
    "pid": Field("int", null=True),
    "state": Field("str", choices=("starting", "ready", "unresponsive", "dead", "failed"),
               doc="unresponsive: ready but did not answer stats in time; failed: kept dying, not restarted"),
    "forwarded": Field("int", doc="tasks it ran (last answer)"),
    "apps": Field("int", doc="apps connected to it (last answer)"),
    "routed": Field("int", required=False, doc="live apps the controller routes to it"),
    "modules": Field("int", required=False, doc="apps' fat binaries it holds loaded (last answer)"),
    "module_loads": Field("int", required=False, doc="fat binaries it loaded since it started (last answer)"),
    "refused_kernels": Field("int", required=False,
                         doc="kernels it could not serve; they ran in their apps (last answer)"),
    "translated": Field("int", required=False,
                    doc="launches whose pointer arguments it moved: app memory it could not map "
                        "at the app's address (last answer)"),
}

REQUESTS: dict[str, dict[str, Field]] = {
    "register": {
        "pid": Field("int", min=1, max=2**31 - 1),
        "name": Field("str"),
        "class": Field("str", choices=("qos", "batch")),
        "qos_ms": Field("number", required=False, null=True, positive=True, max=86_400_000,
                    doc="latency target"),
        "quota_pct": Field("int", required=False, null=True, min=1, max=100, doc="requested SM share"),
        "device": Field("str", required=False, choices=("sim", "cuda", "unknown"), default="unknown"),
        "exe": Field("str", required=False, default=""),
    },
    "exit": {
        "pid": Field("int", min=1, max=2**31 - 1),
        "slot": Field("int", min=0, max=2**31 - 1),
        "kernels": Field("list", required=False, items=KERNEL, of="kernel", default=[]),
    },
    "ping": {},
    "list": {"all": Field("bool", required=False, default=False, doc="include exited apps")},
    "stop": {},
    "pool": {},
    # query boundaries, sent by the shim (shim/shim_query.c) without waiting for the reply
    "query_begin": {
        "pid": Field("int", min=1, max=2**31 - 1),
        "id": Field("int", min=0, max=2**64 - 1, doc="the app's query id (unique among its queries in flight)"),
        "size": Field("int", required=False, default=0, min=0, max=2**64 - 1,
                  doc="input size: the app's unit (api) or bytes copied to the device (inferred)"),
        "rule": Field("str", required=False, choices=("api", "inferred"), default="api"),
        "t_us": Field("int", required=False, null=True, min=0, max=2**63 - 1,
                  doc="the app's CLOCK_MONOTONIC in us; null: the controller's arrival time"),
    },
    "query_end": {
        "pid": Field("int", min=1, max=2**31 - 1),
        "id": Field("int", min=0, max=2**64 - 1),
        "size": Field("int", required=False, default=0, min=0, max=2**64 - 1),
        "rule": Field("str", required=False, choices=("api", "inferred"), default="api"),
        "t_us": Field("int", required=False, null=True, min=0, max=2**63 - 1),
    },
    # completed tasks, sent by the shim's feed thread (shim/shim_trace.c) when
    # "registered" said "feed": true; one-way: no reply (an error reply when malformed)
    "tasks": {
        "pid": Field("int", min=1, max=2**31 - 1),
        "slot": Field("int", min=-1, max=2**31 - 1),
        "dropped": Field("int", required=False, default=0, min=0, max=2**64 - 1,
                     doc="tasks the shim dropped so far (socket full)"),
        "tasks": Field("list", items=TASK, of="task"),
    },
    "set_quota": {
        "name": Field("str", doc="app name; every live app of that name"),
        "quota_pct": Field("int", min=1, max=100, doc="route to a ready pool worker of exactly this quota "
                                                    "(100 without a 100 % worker: local)"),
    },
}

REPLIES: dict[str, dict[str, Field]] = {
    "registered": {"slot": Field("int"), "quota_pct": Field("int"), "route": Field("int"),
                   "controller_pid": Field("int"),
                   "feed": Field("bool", required=False, default=False,
                             doc="send completed tasks (message tasks); absent: no"),
                   "revision": Field("int", required=False, doc="the controller's schema REVISION"),
                   "fwd_window": Field("int", required=False, min=1, max=4096,
                                   doc="at most this many routed launches in flight; absent: 4096"),
                   "partitions": Field("bool", required=False, default=False,
                                   doc="route kind partition: quotas are SM partitions in the app "
                                       "(the shim drops CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)")},
    "ok": {"slot": Field("int", required=False, doc="set_quota: the (first) app's slot"),
           "route": Field("int", required=False, doc="set_quota: its new route"),
           "slots": Field("list", required=False, doc="set_quota: every app's slot"),
           "routes": Field("list", required=False, doc="set_quota: their routes")},
    "pong": {"controller_pid": Field("int"), "policy": Field("str"), "device": Field("str"),
             "version": Field("str"), "apps": Field("int", doc="live apps")},
    "apps": {"apps": Field("list", items=RECORD, of="record")},
    "pool": {"workers": Field("list", items=WORKER, of="worker"),
             "spec": Field("str", doc="QUOTA:COUNT,... or none"),
             "note": Field("str", required=False, doc="why there is no pool, when there is none")},
    "error": {"error": Field("str"), "in_reply_to": Field("str", null=True)},
}

REPLY_TO = {"register": "registered", "exit": "ok", "ping": "pong", "list": "apps", "stop": "ok",
            "pool": "pool", "set_quota": "ok", "query_begin": "ok", "query_end": "ok",
            "tasks": None}


_PY: dict[str, type | tuple[type, ...]] = {"int": int, "number": (int, float), "str": str, "bool": bool,
                                           "list": list, "object": dict}


def _jtype(v: Any) -> str:
    return {bool: "bool", int: "int", float: "number", str: "str", list: "list",
            dict: "object", type(None): "null"}.get(type(v), type(v).__name__)


def _check(path: str, name: str, f: Field, v: Any) -> Any:
    where = f"{path}: field {name!r}"
    if v is None:
        if f.null:
            return None
        raise SchemaError(f"{where} must not be null")
    ok = isinstance(v, _PY[f.type]) and not (isinstance(v, bool) and f.type != "bool")
    if not ok:
        raise SchemaError(f"{where} must be {f.describe()}, got {_jtype(v)}")
    if f.choices and v not in f.choices:
        raise SchemaError(f"{where} must be one of {', '.join(map(str, f.choices))}, got {v!r}")
    if isinstance(v, float) and not math.isfinite(v):
        raise SchemaError(f"{where} must be finite")
    if (f.positive and v <= 0 or f.min is not None and v < f.min
            or f.max is not None and v > f.max):
        raise SchemaError(f"{where} must be {f.bounds()}, got {v}")
    if f.items is not None:
        return [_fields(f"{path}.{name}[{i}]", f.items, x) for i, x in enumerate(v)]
    return v


def _fields(where: str, spec: dict[str, Field], obj: Any) -> dict:
    if not isinstance(obj, dict):
        raise SchemaError(f"{where} must be an object, got {_jtype(obj)}")
    out = dict(obj)
    for name, f in spec.items():
        if name not in obj:
            if f.required:
                raise SchemaError(f"{where}: missing field {name!r}")
            out[name] = f.default.copy() if isinstance(f.default, list) else f.default
        else:
            out[name] = _check(where, name, f, obj[name])
    return out


def validate(msg: Any, table: dict[str, dict[str, Field]] = REQUESTS) -> dict:
    """Check a decoded message; return it with defaults filled in, or raise
    SchemaError.  Unknown extra fields are kept (newer senders may add some)."""
    if not isinstance(msg, dict):
        raise SchemaError(f"a message must be a JSON object, got {_jtype(msg)}")
    v = msg.get("v")
    if "v" not in msg:
        raise SchemaError(f"missing field 'v' (protocol version; this controller speaks v{PROTOCOL})")
    if type(v) is not int or v != PROTOCOL:
        raise SchemaError(f"unsupported protocol version {v!r} (this controller speaks v{PROTOCOL})")
    t = msg.get("type")
    if not isinstance(t, str):
        raise SchemaError("missing field 'type'" if t is None else f"field 'type' must be str, got {_jtype(t)}")
    if t not in table:
        raise SchemaError(f"unknown message type {t!r} (known: {', '.join(table)})")
    return _fields(t, table[t], msg)


def _reject_constant(name: str) -> Any:
    raise SchemaError(f"not valid JSON: {name} is not allowed")


def decode(data: bytes) -> Any:
    """bytes -> JSON value, refusing oversized, non-UTF-8 and non-JSON input."""
    if len(data) > MAX_BYTES:
        raise SchemaError(f"message too large ({len(data)} bytes > {MAX_BYTES})")
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise SchemaError("message is not UTF-8") from None
    except json.JSONDecodeError as e:
        raise SchemaError(f"not valid JSON: {e.msg} at position {e.pos}") from None
    except RecursionError:
        raise SchemaError("not valid JSON: nested too deeply") from None


def parse(data: bytes) -> dict:
    return validate(decode(data))


def message(type: str, **fields: Any) -> dict:
    return {"v": PROTOCOL, "type": type, **fields}


def encode(msg: dict) -> bytes:
    return json.dumps(msg, separators=(",", ":")).encode()


def error(text: str, in_reply_to: str | None = None) -> dict:
    return message("error", error=text, in_reply_to=in_reply_to)


def as_json() -> dict:
    """The whole schema as plain JSON data (what `colocate schema --json` prints)."""
    def fields(spec: dict[str, Field]) -> dict:
        out = {}
        for n, f in spec.items():
            d = {"type": f.describe(), "required": f.required}
            if f.bounds():
                d["range"] = f.bounds()
            if not f.required and f.default is not None:
                d["default"] = f.default
            if f.doc:
                d["doc"] = f.doc
            out[n] = d
        return out
    return {
        "version": PROTOCOL, "revision": REVISION, "max_bytes": MAX_BYTES,
        "envelope": {"v": {"type": "int", "required": True, "value": PROTOCOL},
                     "type": {"type": "str", "required": True}},
        "requests": {t: {"reply": REPLY_TO.get(t), "fields": fields(s)} for t, s in REQUESTS.items()},
        "replies": {t: {"fields": fields(s)} for t, s in REPLIES.items()},
        "objects": {"kernel": fields(KERNEL), "record": fields(RECORD), "worker": fields(WORKER),
                    "queries": fields(QUERIES), "task": fields(TASK), "feed": fields(FEED)},
    }
