"""bench/simulator.py in process: what a hold stops (the host's next launch,
not the launches it made before it, as the shim's hold), and the wait a
query spent in the queue reaching the policy."""
from __future__ import annotations

import sys

import pytest
from conftest import ROOT

from controlplane.policies.base import AppInfo, Decision, Policy, QueryEvent
from shim import paths

pytestmark = pytest.mark.skipif(not paths.SIMGPU_CUDART.exists(), reason="simgpu not built (make build)")

sys.path.insert(0, str(ROOT / "bench"))
from simulator import Arrivals, SimTask, Simulator, Workload  # noqa: E402

from shim.devmodel import Device, default_params  # noqa: E402

HOLD_AT, RELEASE_AT = 0.0205, 0.0605


class HoldBetween(Policy):
    """Holds slot 0 from HOLD_AT to RELEASE_AT (checked every tick)."""
    name = "hold-between"

    def __init__(self) -> None:
        super().__init__()
        self.held = False

    def on_tick(self, now_s: float) -> list[Decision]:
        want = HOLD_AT <= now_s < RELEASE_AT
        if want == self.held:
            return []
        self.held = want
        return [Decision(0, 100, 0, hold=want)]


def kernel_starts(sim: Simulator) -> list[float]:
    """Start times of every task the batch app ran, by wrapping _finish."""
    starts: list[float] = []
    orig = sim._finish

    def fin(a):
        if a.running is not None and a.running >= 0 and a.wl.cls == "batch":
            starts.append(sim.dev.times(a.running)[0])
        orig(a)
    sim._finish = fin  # type: ignore[method-assign]
    return starts


def run(gap_s: float, sync: bool, flops: float) -> list[float]:
    dev = Device(default_params(mps=True, slowdown=1000))
    k = SimTask("kernel", "k", grid=(264, 1, 1), block=(256, 1, 1), regs=32, flops=flops, bytes=1e5,
                gap_s=gap_s, sync=sync)
    sim = Simulator(HoldBetween(), dev, [Workload("b", "batch", iteration=[k] * 4)], horizon_s=0.1,
                    tick_s=0.001)
    starts = kernel_starts(sim)
    sim.run()
    return starts


def test_a_hold_stops_the_hosts_next_launch_not_those_it_made_before():
    # the host waits for each task (sync): nothing is ahead of it, so the hold
    # stops the very next task; it leaves the host when the hold ends
    starts = run(gap_s=0.0005, sync=True, flops=2e6)
    assert sum(s < HOLD_AT for s in starts) > 5
    assert not [s for s in starts if HOLD_AT + 0.002 < s < RELEASE_AT]
    after = [s for s in starts if s >= RELEASE_AT]
    assert after and after[0] == pytest.approx(RELEASE_AT + 0.0005, abs=1.5e-3)   # tick + gap
    # the host runs ahead of the device (a launch every 0.1 ms, kernels of
    # ~1 ms): what it launched before the hold is on the stream and runs
    # during it, back to back
    starts = run(gap_s=0.0001, sync=False, flops=2e8)
    dur = starts[1] - starts[0]
    assert dur > 5 * 0.0001
    during = [s for s in starts if HOLD_AT <= s < RELEASE_AT]
    assert len(during) >= int((RELEASE_AT - HOLD_AT) / dur) - 1
    assert all(b - a == pytest.approx(dur, rel=1e-6) for a, b in zip(during, during[1:]))


class Recorder(Policy):
    name = "recorder"

    def __init__(self) -> None:
        super().__init__()
        self.begins: list[QueryEvent] = []

    def on_query_begin(self, app: AppInfo, info: QueryEvent) -> list[Decision]:
        self.begins.append(info)
        return []


def test_a_querys_wait_in_the_queue_reaches_the_policy():
    dev = Device(default_params(mps=True, slowdown=1000))
    k = SimTask("kernel", "k", grid=(264, 1, 1), block=(256, 1, 1), regs=32, flops=4e8, bytes=1e5)
    pol = Recorder()
    # two queries 1 ms apart, each longer than that: the second one waits
    sim = Simulator(pol, dev, [Workload("s", "qos", queries={1: [k]}, qos_ms=100.0)],
                    Arrivals("replay", times=[0.010, 0.011]), horizon_s=0.5)
    res = sim.run()
    first, second = pol.begins
    lat = res.latencies_ms["s"]
    assert first.queued_us == 0.0
    # it began when the first ended: its wait is the first's latency less 1 ms
    assert second.queued_us == pytest.approx((lat[0] - 1.0) * 1e3, rel=1e-6) and second.queued_us > 0
    assert lat[1] == pytest.approx(lat[0] - 1.0 + lat[0], rel=1e-6)


class StaticAt(Policy):
    """Every app at one quota from registration on."""
    name = "static-at"

    def __init__(self, pct: int) -> None:
        super().__init__()
        self.pct = pct

    def on_register(self, info: AppInfo) -> list[Decision]:
        return [Decision(info.slot, self.pct, None)]


@pytest.mark.parametrize("pct", [10, 50])
def test_route_partition_gives_a_kernel_its_partitions_sms(pct):
    """As `serve --route partition` live: the quota becomes cb_part_sms's SM
    count (10 % of 132 -> 16, 50 % -> 64), not MPS's (13, 66); a compute-bound
    kernel's time follows the SMs (its grid fills every SM many times)."""
    from shim.ctlblock import part_sms
    from shim.devmodel import quota_sms

    def kernel_s(route: str) -> float:
        dev = Device(default_params(mps=True, slowdown=1000))
        k = SimTask("kernel", "k", grid=(132 * 64, 1, 1), block=(256, 1, 1), regs=32, flops=1e9, bytes=1e3)
        sim = Simulator(StaticAt(pct), dev, [Workload("b", "batch", iteration=[k])], horizon_s=60.0,
                        route=route)
        ends: list[float] = []
        orig = sim._finish

        def fin(a):
            if a.running is not None and a.running >= 0:
                t0, t1 = sim.dev.times(a.running)[:2]
                ends.append(t1 - t0)
            orig(a)
        sim._finish = fin  # type: ignore[method-assign]
        sim.run()
        return ends[0]

    want = part_sms(pct, 132, 8) / quota_sms(pct, 132)
    assert (part_sms(pct, 132, 8), quota_sms(pct, 132)) == {10: (16, 12), 50: (64, 66)}[pct]
    assert kernel_s("pool") / kernel_s("partition") == pytest.approx(want, rel=0.03)
    with pytest.raises(ValueError, match="route"):
        Simulator(StaticAt(pct), Device(default_params()), [Workload("b", "batch", iteration=[])],
                  route="worker")
