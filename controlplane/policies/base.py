"""The policy interface: one class, many policies.

A policy sees application events and returns Decisions (quota and route per
slot); the controller writes them into the control block.  The same objects
drive the live controller and the discrete-event simulator, so a policy never
does I/O of its own.

    @register_policy("mine")
    class Mine(Policy):
        def on_register(self, app):
            return [Decision(app.slot, quota_pct=50)]
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class AppInfo:
    slot: int
    pid: int
    name: str
    cls: str                              # "qos" | "batch"
    qos_ms: float | None = None
    requested_quota_pct: int | None = None
    device: str = "unknown"               # "sim" | "cuda" | "unknown"


@dataclass(frozen=True)
class Decision:
    slot: int
    quota_pct: int                        # SM share, 1..100
    route: int | None = 0                 # 0 = local, N = process-pool worker N,
                                          # None = the controller picks a ready worker of
                                          # exactly quota_pct (100 % without one: local)
    hold: bool = False                    # True: the app's next kernel launch waits (the
                                          # batch task stays in the ready pool) until a
                                          # later Decision for the slot has hold=False


@dataclass(frozen=True)
class QueryEvent:
    """A query boundary: what on_query_begin and on_query_end receive."""
    id: int                               # the query's id (the app's own with the API, else counted)
    size: float = 0                       # its input: the app's unit (API) or bytes copied in (inferred)
    t_us: float | None = None             # when, on the shim's monotonic clock; None: unknown
    rule: str = "api"                     # how it was found: "api" (marked) or "inferred" (copies)
    tasks: tuple[Mapping[str, Any], ...] | None = None
                                          # the predictors task rows the query will run, when the
                                          # caller knows them (a simulator's plan); None: the policy
                                          # guesses from what it saw
    qos_ms: float | None = None           # a latency target for this query alone; None: the app's
    queued_us: float | None = None        # how long it waited between its arrival and t_us (on_query_begin),
                                          # when the caller knows (the simulator does; live apps do not
                                          # report it yet); None: unknown, taken as 0

    def target_left_ms(self, target_ms: float) -> float:
        """What is left of a latency target once the query begins: less the
        wait it already spent in the queue (queued_us), when known."""
        return target_ms - (self.queued_us or 0.0) / 1000.0


@dataclass(frozen=True)
class TaskDone:
    """A completed task from the app's feed: what on_task_done receives."""
    features: Mapping[str, Any] | None    # a predictors task row (schema.task_row, with "occurrence")
    duration_us: float | None = None      # its device time
    quota_pct: int | None = None          # the SM quota it ran at; None: unknown
    query: int | None = None              # the id of the query it belongs to (QoS apps), else None
    count: int = 1                        # how many tasks of its name it stands for (batch apps:
                                          # the ones in between were not passed on)
    total_us: float | None = None         # their device time together; None: duration_us


class Policy:
    """Base policy: every hook decides nothing."""
    name = "base"

    def __init__(self, **opts):
        self.opts = opts

    def on_register(self, app: AppInfo) -> list[Decision]:
        return []

    def on_exit(self, app: AppInfo) -> list[Decision]:
        return []

    def on_query_begin(self, app: AppInfo, info: QueryEvent) -> list[Decision]:
        return []

    def on_query_end(self, app: AppInfo, info: QueryEvent) -> list[Decision]:
        return []

    def on_task_done(self, app: AppInfo, task: TaskDone) -> list[Decision]:
        """A task of the app completed (sent only when the controller asks the
        shim for task feedback; see wants_tasks).  A batch app's tasks come
        at most every few ms per kernel name (count > 1: the ones in between
        were not passed on); a QoS app's come one by one (count 1), possibly
        after the query's end."""
        return []

    def fwd_window(self, app: AppInfo) -> int | None:
        """At most this many of the app's routed launches in flight (1..4096);
        None: the shim's default, 4096.  A policy that changes or holds a
        batch app's quota often keeps its launches in the app (small window),
        so that a decision reaches its next launch, not the 4097th."""
        return None

    def wants_tasks(self, app: AppInfo) -> bool:
        """Whether the app's shim should report completed tasks (on_task_done).
        It costs two events per task (in the app, or in the worker for a
        forwarded one), so only policies that use it say yes."""
        return False

    def on_tick(self, now_s: float) -> list[Decision]:
        return []


_REGISTRY: dict[str, type[Policy]] = {}


def register_policy(name: str) -> Callable[[type[Policy]], type[Policy]]:
    def deco(cls: type[Policy]) -> type[Policy]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"policy {name!r} registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls
    return deco


def _load_all() -> None:
    """Import every module of this package once, so that each registers itself."""
    for m in pkgutil.iter_modules([str(Path(__file__).parent)]):
        importlib.import_module(f"{__package__}.{m.name}")


def policy_names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def make_policy(name: str, **opts) -> Policy:
    _load_all()
    if name not in _REGISTRY:
        raise ValueError(f"unknown policy {name!r} (known: {', '.join(sorted(_REGISTRY))})")
    return _REGISTRY[name](**opts)


def _value(text: str) -> bool | int | float | str:
    low = text.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse_policy_spec(spec: str) -> tuple[str, dict]:
    """ "NAME[,key=value,...]" -> (NAME, options); values become bool, int,
    float or str.  E.g. "claius,bandwidth_cap=false,models=/data/models"."""
    name, *items = [p.strip() for p in spec.split(",")]
    opts: dict = {}
    for item in items:
        key, eq, val = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"policy option {item!r} is not key=value (in {spec!r})")
        opts[key.strip().replace("-", "_")] = _value(val.strip())
    return name, opts


def make_policy_spec(spec: str) -> Policy:
    """A policy from "NAME[,key=value,...]"; ValueError/TypeError on a bad spec."""
    name, opts = parse_policy_spec(spec)
    return make_policy(name, **opts)
