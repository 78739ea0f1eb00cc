"""Prometheus metrics: `colocate metrics` and `serve --metrics-port`."""
from __future__ import annotations

import socket
import urllib.request

from conftest import Controller, colocate
from prometheus_client.parser import text_string_to_metric_families

from controlplane.metrics import exposition


def samples(text: str) -> dict[tuple, float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


APP = {"name": "svc", "pid": 42, "class": "qos", "quota_pct": 30, "route": 2, "launches": 9,
       "forwarded": 7, "h2d_bytes": 100, "d2h_bytes": 50, "qos_ms": 10.0,
       "queries": {"done": 5, "in_flight": 1, "violations": 2, "p50_ms": 4.5, "p99_ms": 12.0}}


def test_exposition_of_an_app_record():
    got = samples(exposition([APP]))
    lab = (("app", "svc"), ("class", "qos"), ("pid", "42"))
    assert got[("colocate_apps", ())] == 1
    assert got[("colocate_app_quota_percent", lab)] == 30
    assert got[("colocate_app_routed_to_worker", lab)] == 1
    assert got[("colocate_app_launches_total", lab)] == 9
    assert got[("colocate_app_forwarded_total", lab)] == 7
    assert got[("colocate_app_queries_total", lab)] == 5
    assert got[("colocate_app_qos_violations_total", lab)] == 2
    assert got[("colocate_app_query_latency_ms", tuple(sorted(lab + (("quantile", "0.99"),))))] == 12.0
    assert got[("colocate_app_copy_bytes_total", tuple(sorted(lab + (("direction", "h2d"),))))] == 100


def test_exposition_of_a_held_batch_app():
    rec = {**APP, "name": "b", "class": "batch", "qos_ms": None, "queries": None, "held": True,
           "held_ms": 2500.0, "throughput": {"launches_per_s": 300.0, "solo_launches_per_s": 1000.0,
                                             "normalised": 0.3}}
    got = samples(exposition([rec]))
    lab = (("app", "b"), ("class", "batch"), ("pid", "42"))
    assert got[("colocate_app_held", lab)] == 1
    assert got[("colocate_app_held_seconds_total", lab)] == 2.5
    assert got[("colocate_app_launches_per_second", lab)] == 300.0
    assert got[("colocate_app_throughput_normalised", lab)] == 0.3
    assert ("colocate_app_qos_target_ms", lab) not in got


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_cli_and_http_endpoint(rundir, sleeper):
    port = free_port()
    ctl = Controller(rundir, "--metrics-port", str(port))
    try:
        pid = sleeper().pid
        r = ctl.call("register", pid=pid, name="svc", **{"class": "qos"}, qos_ms=1.0, device="sim")
        assert r["type"] == "registered"
        for i, (t0, t1) in enumerate(((0, 500), (1000, 3000), (4000, 4200))):   # 0.5, 2.0, 0.2 ms
            ctl.call("query_begin", pid=pid, id=i, size=1, rule="api", t_us=t0)
            ctl.call("query_end", pid=pid, id=i, size=1, rule="api", t_us=t1)
        out = colocate("metrics", "--runtime-dir", rundir)
        assert out.returncode == 0, out.stderr
        lab = (("app", "svc"), ("class", "qos"), ("pid", str(pid)))
        got = samples(out.stdout)
        assert got[("colocate_app_queries_total", lab)] == 3
        assert got[("colocate_app_qos_violations_total", lab)] == 1          # the 2 ms one
        # the HTTP endpoint serves the same, refreshed every tick
        import time
        end = time.monotonic() + 5
        while True:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            http = samples(body)
            if http.get(("colocate_app_queries_total", lab)) == 3 or time.monotonic() > end:
                break
            time.sleep(0.1)
        assert http[("colocate_app_qos_violations_total", lab)] == 1
    finally:
        ctl.stop()
