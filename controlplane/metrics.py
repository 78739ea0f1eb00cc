"""The controller's state in Prometheus' text format.

Two ways out, same metrics: `colocate metrics` (asks the running controller
for its apps and prints the exposition), and `colocate serve --metrics-port N`
(an HTTP endpoint served by prometheus-client from a thread of the
controller, reading a snapshot the main loop refreshes every tick: the HTTP
thread never touches the live state).

Per live app (labels app, pid, class):
  colocate_app_quota_percent            SM quota it runs at
  colocate_app_routed_to_worker         1 when its launches go to a pool worker
  colocate_app_launches_total           kernel launches
  colocate_app_forwarded_total          launches run by a pool worker
  colocate_app_copy_bytes_total         bytes copied, label direction=h2d|d2h
  colocate_app_qos_target_ms            its latency target (QoS apps)
  colocate_app_queries_total            queries ended
  colocate_app_queries_in_flight        queries begun, not ended
  colocate_app_qos_violations_total     queries that ended after the target
  colocate_app_query_latency_ms         recent latency, label quantile=0.5|0.99
  colocate_app_held                     1 while the policy holds its launches
  colocate_app_held_seconds_total       time its launches waited on holds
  colocate_app_launches_per_second      batch apps: launch rate over the last 5 s
  colocate_app_throughput_normalised    batch apps: that rate / its solo rate (serve --solo)
and colocate_apps (live apps).
"""
from __future__ import annotations

from typing import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

LABELS = ["app", "pid", "class"]


def families(apps: Iterable[dict]) -> list[Metric]:
    """The metric families for a list of app records (as `colocate quotas --json` gives)."""
    apps = list(apps)
    g = {name: GaugeMetricFamily(f"colocate_app_{name}", doc, labels=LABELS) for name, doc in (
        ("quota_percent", "SM quota the app runs at, percent"),
        ("routed_to_worker", "1 when the app's launches run in a process-pool worker"),
        ("qos_target_ms", "the app's latency target, ms (QoS apps)"),
        ("queries_in_flight", "queries begun and not ended"),
        ("held", "1 while the policy holds the app's kernel launches"),
        ("launches_per_second", "batch apps: kernel launches per second over the last 5 s"),
        ("throughput_normalised", "batch apps: launch rate divided by its solo rate at 100 %"))}
    c = {name: CounterMetricFamily(f"colocate_app_{name}", doc, labels=LABELS) for name, doc in (
        ("launches", "kernel launches"),
        ("forwarded", "kernel launches run by a process-pool worker"),
        ("queries", "queries ended"),
        ("qos_violations", "queries that ended after the app's latency target"),
        ("held_seconds", "seconds the app's launches waited on holds"))}
        # CounterMetricFamily appends _total to these names
    copies = CounterMetricFamily("colocate_app_copy_bytes", "bytes copied between host and device",
                                 labels=LABELS + ["direction"])
    latency = GaugeMetricFamily("colocate_app_query_latency_ms", "recent query latency, ms",
                                labels=LABELS + ["quantile"])
    for a in apps:
        lab = [a["name"], str(a["pid"]), a["class"]]
        q = a.get("queries") or {}
        g["quota_percent"].add_metric(lab, a["quota_pct"])
        g["routed_to_worker"].add_metric(lab, 1 if a.get("route") else 0)
        if a.get("qos_ms") is not None:
            g["qos_target_ms"].add_metric(lab, a["qos_ms"])
        g["queries_in_flight"].add_metric(lab, q.get("in_flight", 0))
        c["launches"].add_metric(lab, a["launches"])
        c["forwarded"].add_metric(lab, a["forwarded"])
        c["queries"].add_metric(lab, q.get("done", 0))
        c["qos_violations"].add_metric(lab, q.get("violations", 0))
        g["held"].add_metric(lab, 1 if a.get("held") else 0)
        c["held_seconds"].add_metric(lab, (a.get("held_ms") or 0.0) / 1000)
        t = a.get("throughput") or {}
        if t.get("launches_per_s") is not None:
            g["launches_per_second"].add_metric(lab, t["launches_per_s"])
        if t.get("normalised") is not None:
            g["throughput_normalised"].add_metric(lab, t["normalised"])
        copies.add_metric(lab + ["h2d"], a["h2d_bytes"])
        copies.add_metric(lab + ["d2h"], a["d2h_bytes"])
        for quantile, key in (("0.5", "p50_ms"), ("0.99", "p99_ms")):
            if q.get(key) is not None:
                latency.add_metric(lab + [quantile], q[key])
    total = GaugeMetricFamily("colocate_apps", "live apps registered with the controller")
    total.add_metric([], len(apps))
    return [total, *g.values(), *c.values(), copies, latency]


class Snapshot(Collector):
    """A collector over the latest app records the controller published."""

    def __init__(self) -> None:
        self.apps: list[dict] = []

    def publish(self, apps: list[dict]) -> None:
        self.apps = apps                                # one reference swap: no lock needed

    def collect(self) -> Iterator[Metric]:
        yield from families(self.apps)


def exposition(apps: Iterable[dict]) -> str:
    """Prometheus text format for these app records."""
    from prometheus_client import generate_latest

    snap = Snapshot()
    snap.publish(list(apps))
    reg = CollectorRegistry(auto_describe=False)
    reg.register(snap)
    return generate_latest(reg).decode()


def serve_http(port: int, snap: Snapshot, addr: str = "127.0.0.1") -> None:
    """Start the HTTP endpoint (a daemon thread); OSError when the port is taken."""
    from prometheus_client import start_http_server

    reg = CollectorRegistry(auto_describe=False)
    reg.register(snap)
    start_http_server(port, addr=addr, registry=reg)
