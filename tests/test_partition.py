"""The route kind "partition" (shim/shim_part.c): an app's kernels run on an SM
partition -- a green context of about its quota's share of the SMs -- inside
the app itself, on simgpu's green contexts (shim/simgpu/driver/green.c).

The shim's side runs under processpool.rig's stand-in controller, which lets a
test write routes (CB_ROUTE_PART | pct) into the app's slot while it runs;
simgpu's launch log (SIMGPU_LAUNCH_LOG) says how many SMs each kernel was
allowed (quota_sms).  The controller's side (`serve --route partition`,
set-quota, the records, `colocate quotas`) runs under a real `colocate serve`.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Controller, clean_env, new_rundir, wait_until
from test_forwarding import HOT, result_of

from processpool.rig import Rig
from shim import paths
from shim.ctlblock import ROUTE_PART, part_sms, part_span_sms

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "bench" / "bin"

pytestmark = pytest.mark.skipif(
    not all((BIN / p).exists() for p in ("hotspot", "streams2", "graphs"))
    or not (paths.SIMGPU_DIR / "libcuda.so.1").exists(),
    reason="bench programs or simgpu's libcuda not built (make build)")

# streams2: kernels long enough (x2000 model time) that a missing order shows
S2 = ["--repeat", "8", "--rounds", "256"]
SWITCHING = [ROUTE_PART | 10, ROUTE_PART | 50, 0, ROUTE_PART | 90]


def part(pct: int) -> int:
    return ROUTE_PART | pct


@pytest.fixture
def rig():
    r = Rig(timescale="2000")
    yield r
    r.close()


def run_logged(rig: Rig, tmp_path: Path, prog: str, *args: str, routes=None,
               **env: str) -> tuple[str, dict, list[int]]:
    """Run prog; its stdout, final counters and each kernel's SM cap in order."""
    log = tmp_path / f"launches-{len(list(tmp_path.iterdir()))}.jsonl"
    out, err, c = rig.run(prog, *args, routes=routes, SIMGPU_LAUNCH_LOG=str(log), **env)
    assert "ran locally" not in err and "unavailable" not in err and "cannot make" not in err, err
    rows = sorted((json.loads(ln) for ln in log.read_text().splitlines()), key=lambda r: r["seq"])
    return out, c, [r["quota_sms"] for r in rows]


CB_HOLD = 0xFFFFFFFF


def rig_run_flipping(rig: Rig, tmp_path: Path, args, routes: list[int]) -> tuple[str, dict, list[int]]:
    """run_logged with the route cycling every 3 ms."""
    log = tmp_path / f"flip-{len(list(tmp_path.iterdir()))}.jsonl"
    out, err, c = rig.run("streams2", *args, routes=routes, period=0.003, SIMGPU_LAUNCH_LOG=str(log))
    rows = sorted((json.loads(ln) for ln in log.read_text().splitlines()), key=lambda r: r["seq"])
    return out, c, [r["quota_sms"] for r in rows]


def result_lines(out: str, *keys: str) -> dict[str, str]:
    got = {}
    for key in keys:
        m = re.search(rf"^{key} (.*)$", out, re.M)
        assert m, f"no {key} line in:\n{out}"
        got[key] = m.group(1)
    return got


def test_hotspot_identical_local_on_a_partition_and_switched(rig, tmp_path):
    out, local, sms = run_logged(rig, tmp_path, "hotspot", *HOT)     # HOT: a copy every 6 launches
    want = result_of(out)
    assert set(sms) == {132} and local["launches"] == 300

    # 25 % of 132 SMs = 33, rounded to sm_90's 8-SM partitions: 32
    out, c, sms = run_logged(rig, tmp_path, "hotspot", *HOT, routes=part(25))
    assert result_of(out) == want
    assert set(sms) == {32} and c["launches"] == 300 and c["forwarded"] == 0

    # switched among 16, 64, all and 120 SMs every 30 ms while it runs
    out, c, sms = run_logged(rig, tmp_path, "hotspot", *HOT, routes=SWITCHING)
    assert result_of(out) == want
    assert c["launches"] == 300 and len(sms) == 300
    assert {16, 64, 120, 132} <= set(sms) <= {16, 64, 120, 132}, sorted(set(sms))


def test_two_streams_and_the_legacy_stream_keep_their_order(rig, tmp_path):
    """streams2: a copy after a kernel on its stream, an event one stream
    waits for, the legacy stream's implicit order with a blocking stream --
    each checked by the program (it fails at the first wrong element when an
    order is missing: removing the shim's fence before a local operation, or
    its wait before a launch, makes it fail)."""
    out, _, sms = run_logged(rig, tmp_path, "streams2", *S2)
    want = result_lines(out, "CHECK", "STATS")
    assert set(sms) == {132}
    out, c, sms = run_logged(rig, tmp_path, "streams2", *S2, routes=part(25))
    assert result_lines(out, "CHECK", "STATS") == want and c["launches"] == 32
    assert set(sms) == {32}
    out, c, sms = run_logged(rig, tmp_path, "streams2", *S2, routes=SWITCHING)
    assert result_lines(out, "CHECK", "STATS") == want and c["launches"] == 32
    assert len(set(sms)) >= 2 and set(sms) <= {16, 64, 120, 132}, sorted(set(sms))
    # the host pauses 1 ms before every kernel (route changes every 3 ms land
    # between an operation and the kernel after it), and each repeat first
    # queues a long kernel on A, so A's work starts late: a kernel elsewhere
    # that misses its order with A runs before it and reads stale data
    slow = ("--repeat", "6", "--rounds", "16", "--pause-us", "1000", "--lead-rounds", "256")
    out, _, _ = run_logged(rig, tmp_path, "streams2", *slow)
    want = result_lines(out, "CHECK", "STATS")
    out, _, sms = rig_run_flipping(rig, tmp_path, slow, [part(25), 0, part(50) | 30 << 8, CB_HOLD])
    assert result_lines(out, "CHECK", "STATS") == want


def test_orders_kept_across_route_changes_at_exact_points(rig):
    """streams2 --steps stops at fixed points for the test to change the
    route there: a kernel after an event record, moved to another partition,
    still follows the kernel before it (which waits behind a long one on
    the first partition), also when it moves to a partition it used before;
    a kernel back on a partition after a local period follows what the app
    queued on its stream meanwhile.  (Without the shim's fixes for these
    two, found by review, the program fails at step e and at step g.)"""
    env = {**rig.env, "LD_PRELOAD": str(paths.LIBCOLOCATE)}
    p = subprocess.Popen([str(BIN / "streams2"), "--steps", "--rounds", "16", "--lead-rounds", "256"],
                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    routes = {"a": part(25), "b": part(25) | 50 << 8, "c": part(25), "d": 0, "e": part(25),
              "f": part(25) | 50 << 8, "g": part(25)}
    try:
        slot, seen = None, []
        for line in p.stdout:
            if line.startswith("STEP "):
                name = line.split()[1]
                if slot is None:
                    slot = rig.slot_of(p)
                rig.cb.set_route(slot, routes[name], 25)
                seen.append(name)
                p.stdin.write("\n")
                p.stdin.flush()
            elif line.startswith(("PASS", "FAIL")):
                break
        out = line
        p.stdin.close()
        err = p.stderr.read()
        assert p.wait(timeout=60) == 0 and out.startswith("PASS"), out + err
        assert seen == list("abcdefg")
        assert rig.cb.control(slot)["part_local"] == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.parametrize("pct,sms", [(3, 8), (10, 16), (50, 64), (75, 96), (99, 132)])
def test_quota_rounds_to_the_partition_size_and_is_published(rig, tmp_path, pct, sms):
    out, c, caps = run_logged(rig, tmp_path, "streams2", "--repeat", "1", "--rounds", "1", routes=part(pct))
    assert "PASS streams2" in out and set(caps) == {sms}
    k = rig.cb.control(rig.last_slot)
    assert (k["part_sms"], k["part_total"], k["part_local"]) == (sms, 132, 0)
    assert part_sms(pct, 132, 8) == sms           # the simulator's rounding is the shim's


def test_an_mps_thread_percentage_would_cap_partitions_so_it_goes(rig, tmp_path):
    """Registered under route kind partition, the shim drops the app's
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE before its context exists: 20 % (26
    SMs) would otherwise cap the 64-SM partition."""
    log = tmp_path / "launches.jsonl"
    out, err, _ = rig.run("streams2", "--repeat", "1", "--rounds", "1", routes=part(50),
                          SIMGPU_LAUNCH_LOG=str(log), CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="20")
    assert "dropping CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20" in err, err
    rows = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert {r["quota_sms"] for r in rows} == {64} and {r["quota"] for r in rows} == {100}


@pytest.mark.parametrize("start,pct,first,sms", [(0, 30, 0, 40), (30, 70, 40, 92), (50, 50, 64, 68),
                                                 (90, 20, 104, 28)])
def test_a_span_of_the_device_is_its_own_groups(rig, tmp_path, start, pct, first, sms):
    """CB_ROUTE_PART | start << 8 | pct: groups of 8 SMs from start % on
    (past 100 %: the last pct %), published as part_first / part_sms."""
    out, _, caps = run_logged(rig, tmp_path, "streams2", "--repeat", "1", "--rounds", "1",
                              routes=part(pct) | start << 8)
    assert "PASS streams2" in out and set(caps) == {sms}
    k = rig.cb.control(rig.last_slot)
    assert (k["part_first"], k["part_sms"]) == (first, sms) == part_span_sms(start, pct, 132, 8)


@pytest.mark.parametrize("start,pct", [(0, 99), (50, 50), (0, 50)])
def test_a_device_whose_split_leaves_a_few_sms(rig, tmp_path, start, pct):
    """130 SMs: simgpu makes 16 groups of 8 and leaves 2 (132 SMs leave 12,
    as an H200 did, and those are the 16th group).  A span to the last
    group takes the 2 as well, as part_span_sms and `colocate quotas` say."""
    out, _, caps = run_logged(rig, tmp_path, "streams2", "--repeat", "1", "--rounds", "1",
                              routes=part(pct) | start << 8, SIMGPU_SMS="130",
                              SIMGPU_DIR=str(tmp_path / "sim130"))
    assert "PASS streams2" in out
    k = rig.cb.control(rig.last_slot)
    want = part_span_sms(start, pct, 130, 8)
    assert (k["part_first"], k["part_sms"]) == want and k["part_total"] == 130
    assert set(caps) == {want[1]}, caps


def test_graph_launches_stay_on_all_sms_and_are_counted(rig, tmp_path):
    out, c, sms = run_logged(rig, tmp_path, "graphs", "--launches", "4", routes=part(50))
    assert "PASS graphs" in out, out
    k = rig.cb.control(rig.last_slot)
    assert k["part_local"] == 4 + 3               # the captured graph 4 times, the built one 3
    assert set(sms) == {64, 132} and sms.count(64) == 1   # iota on the partition; graph nodes on all


@pytest.mark.skipif(not (BIN / "test-drvapi.fatbin").exists(), reason="test-drvapi's fat binary not built")
def test_driver_api_launches_go_to_the_partition(rig, tmp_path):
    """tests/progs/drvapi.c: cuLaunchKernel through cuGetProcAddress (default
    and per-thread stream) and dlsym with a CUfunction of cuModuleLoad, and
    cuLaunchKernelEx with a CUkernel's function -- all on the partition."""
    log = tmp_path / "launches.jsonl"
    out, err, c = rig.run("test-drvapi", routes=part(25), SIMGPU_LAUNCH_LOG=str(log),
                          SIMGPU_TWINS=str(BIN / "test-drvapi.twins.so"))
    assert "DRVAPI launches=13 allocs=1 PASS" in out, out + err
    caps = [json.loads(ln)["quota_sms"] for ln in log.read_text().splitlines()]
    assert caps == [32] * 13 and c["launches"] == 13
    assert rig.cb.control(rig.last_slot)["part_local"] == 0


@pytest.mark.skipif(not (BIN / "tonic-service").exists(), reason="tonic-service not built")
def test_cudnn_and_cublas_kernels_go_to_the_partition(rig, tmp_path):
    """A Tonic service's convolutions and GEMMs (simgpu's libcudnn and
    libcublas launch them) run on the partition, with the same output."""
    args = ("--net", "dig", "--check", "--size", "4")
    sums = []
    for routes, want in ((None, {132}), (part(25), {32})):
        out, c, caps = run_logged(rig, tmp_path, "tonic-service", *args, routes=routes)
        assert "PASS tonic-dig" in out and set(caps) == want and len(caps) == c["launches"] > 0
        sums.append(re.search(r"checksum=(\w+)", out).group(1))
    assert sums[0] == sums[1]


# ---------------------------------------------------------------- the controller


@pytest.fixture(scope="module")
def pctl():
    d = new_rundir()
    ctl = Controller(d, "--route", "partition")
    yield ctl
    ctl.stop()


def colocate(*args: str, rundir: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controlplane.cli", *args, "--runtime-dir", str(rundir)],
                          cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=timeout)


def record(ctl: Controller, name: str) -> dict | None:
    return next((a for a in ctl.call("list")["apps"] if a["name"] == name), None)


def test_set_quota_gives_a_partition_and_quotas_shows_its_sms(pctl):
    """A real app under `colocate run`: set-quota moves it onto a 64-SM
    partition while it runs (its shim says so in the slot), then back."""
    app = subprocess.Popen([sys.executable, "-m", "controlplane.cli", "run", "--runtime-dir",
                            str(pctl.rundir), "--device", "sim", "--name", "s2", "--class", "batch", "--",
                            str(BIN / "streams2"), "--repeat", "400", "--rounds", "64"],
                           cwd=ROOT, env=clean_env(SIMGPU_TIMESCALE="200"), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: record(pctl, "s2"), timeout=30, what="s2 to register")
        r = colocate("set-quota", "s2", "50", rundir=pctl.rundir)
        assert r.returncode == 0 and "partition" in r.stderr, r.stderr
        rec = wait_until(lambda: (a := record(pctl, "s2")) and (a.get("partition") or {}).get("sms") and a,
                         timeout=30, what="the shim to make its partition")
        assert rec["route"] == part(50) and rec["quota_pct"] == 50 and rec["worker"] is None
        assert rec["partition"] == {"sms": 64, "first": 0, "total": 132, "local": 0}
        q = colocate("quotas", rundir=pctl.rundir)
        assert "partition 64/132 SMs (0-63)" in q.stdout, q.stdout
        assert pctl.call("set_quota", name="s2", quota_pct=100)["route"] == 0
        out, err = app.communicate(timeout=120)
        assert app.returncode == 0 and "PASS streams2" in out, out + err
    finally:
        if app.poll() is None:
            app.kill()
            app.communicate()


def register(ctl: Controller, pid: int, name: str, cls: str) -> int:
    r = ctl.call("register", pid=pid, name=name, **{"class": cls}, device="sim",
                 **({"qos_ms": 50.0} if cls == "qos" else {}))
    assert r["type"] == "registered" and r["partitions"] is True, r
    return r["slot"]


def test_apps_on_partitions_get_disjoint_spans(pctl, sleeper):
    """QoS apps first, then batch apps, in slot order: consecutive spans of
    the device (start << 8 in the route), moved when a quota before them
    changes; past 100 % the span is the device's last share."""
    b1 = register(pctl, sleeper().pid, "span-b1", "batch")
    svc = register(pctl, sleeper().pid, "span-svc", "qos")
    b2 = register(pctl, sleeper().pid, "span-b2", "batch")

    def routes() -> dict[int, int]:
        return {a["slot"]: a["route"] for a in pctl.call("list")["apps"] if a["name"].startswith("span-")}
    for name, q in (("span-b1", 40), ("span-svc", 30), ("span-b2", 20)):
        assert pctl.call("set_quota", name=name, quota_pct=q)["type"] == "ok"
    assert routes() == {svc: part(30), b1: part(40) | 30 << 8, b2: part(20) | 70 << 8}
    # the service grows: both batch spans move up; b2's would pass 100 %
    r = pctl.call("set_quota", name="span-svc", quota_pct=50)
    assert r["routes"] == [part(50)]
    assert routes() == {svc: part(50), b1: part(40) | 50 << 8, b2: part(20) | 90 << 8}
    # 100 %: all SMs, no span; the others close up
    pctl.call("set_quota", name="span-svc", quota_pct=100)
    assert routes() == {svc: 0, b1: part(40), b2: part(20) | 40 << 8}
    for name in ("span-b1", "span-svc", "span-b2"):
        pctl.call("set_quota", name=name, quota_pct=100)


def test_route_auto_takes_partitions_where_the_driver_has_green_contexts(rundir):
    """simgpu's driver has them: auto means partition (no pool; the registered
    reply says so); a bad kind is refused before anything starts."""
    ctl = Controller(rundir, "--route", "auto")
    try:
        assert "partition" in ctl.call("pool")["note"]
        r = ctl.call("register", pid=os.getpid(), name="auto-app", **{"class": "batch"}, device="sim")
        assert r["type"] == "registered" and r["partitions"] is True
    finally:
        ctl.stop()
    bad = colocate("serve", "--route", "workers", rundir=rundir)
    assert bad.returncode == 2 and "--route" in bad.stderr


def test_partition_route_needs_no_pool(pctl):
    r = pctl.call("pool")
    assert r["workers"] == [] and "partition" in (r.get("note") or ""), r


def test_partitions_bench_on_cuda_without_a_driver_says_so():
    """bench/partitions.py --device cuda (the GPU figures of this route) on
    a machine without an NVIDIA driver: exit 2 and why, no traceback."""
    from shim import launcher
    if launcher.cuda_usable():
        pytest.skip("an NVIDIA driver answers here")
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "partitions.py"), "--device", "cuda"], cwd=ROOT,
                       env=clean_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "no NVIDIA driver" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_switch_benches_time_no_route_write_made_before_the_app_ran():
    """bench/forwarding.py and bench/partitions.py time each route write to
    the first kernel after it.  A write made before the probe's first
    launch timed the app's start-up (100-200 ms on an H100: the p99 of
    every switch run); the first write is the initial route."""
    from bench.forwarding import timed_flips
    recs = [(0, 1_000, 1_500, 1_200, 7), (1, 2_000, 2_500, 2_200, 7)]
    flips = [(0, 1, 10), (400, 2, 500), (1_100, 1, 1_150), (1_900, 2, 1_950)]
    assert timed_flips(flips, recs) == [(1_100, 1, 1_150), (1_900, 2, 1_950)]
    assert timed_flips(flips, []) == flips[1:]


def test_start_bracket_holds_a_kernel_start_the_host_clock_cannot_see():
    """bench/partitions.py bounds when a GPU kernel started, in the host's
    clock, from its %globaltimer and the offset every record bounds
    (launch call begun <= start <= seen done).  Made-up records with a device
    clock 5 s off the host's and drifting 10 ppm: each bracket holds the true
    start and is as tight as the quickest launch + sync near it; a clock that
    jumps is not bracketed."""
    from bench.partitions import start_bracket
    off, recs, true = 5_000_000_000, [], []
    for i in range(2000):
        t_launch = 1_000_000 + i * 20_000                    # an iteration every 20 us
        start = t_launch + 4_000 + (i % 7) * 300              # launch -> start: 4.0 .. 5.8 us
        done = start + 2_000 + (i % 5) * 400                  # start -> seen done: 2.0 .. 3.6 us
        g = start - off + start // 100_000                    # device time, +10 ppm
        recs.append((i, t_launch, done, g, 0))
        true.append(start)
    for i in (0, 700, 1999):
        lo, hi = start_bracket(recs, i)
        assert lo <= true[i] <= hi, (i, lo - true[i], hi - true[i])
        assert hi - lo <= 6_000          # the quickest launch (4.0 us) + sync (2.0 us), within the drift
    jumped = recs[:1000] + [(i, t, d, g + 50_000, w) for i, t, d, g, w in recs[1000:]]
    assert start_bracket(jumped, 999) is None
    # a clock 100 ppm fast, a record every ms for 2 s: intersected over the
    # whole run the offsets (200 us apart) cross, over 20 ms windows (4 us)
    # the bounds hold the start
    drift = []
    for i in range(2000):
        t_launch = 1_000_000 + i * 1_000_000
        start = t_launch + 4_000
        drift.append((i, t_launch, start + 2_000, start - off + start // 10_000, 0))
    assert start_bracket(drift, 1000, window_ns=10**12) is None
    lo, hi = start_bracket(drift, 1000)
    assert lo <= drift[1000][1] + 4_000 <= hi, (lo, hi)


def test_fwdprobe_seconds_ends_a_long_run_on_time(rig):
    """--seconds stops the probe whatever --n leaves room for: the switch
    benches size their runs in time (back to back an iteration on simgpu
    at timescale 0 is ~1.5 us, on an H100 ~12 us)."""
    import time
    t0 = time.monotonic()
    out, _, _ = rig.run("fwdprobe", "--n", "1000000", "--interval-us", "100", "--seconds", "1", "--dump",
                        **rig.fast)
    took = time.monotonic() - t0
    n = int(re.search(r"^FWDPROBE n=(\d+) ", out, re.M).group(1))
    recs = [ln for ln in out.splitlines() if ln.startswith("I ")]
    # ~100 us an iteration here (the pause and its overshoot): thousands, not a million
    assert 1000 < n < 1000000 and len(recs) == n and f"PASS fwdprobe n={n}" in out, out[-500:]
    assert 1.0 <= took < 10.0, took


@pytest.mark.skipif(not (BIN / "hostwake").exists(), reason="hostwake not built")
def test_hostwake_times_wake_ups_after_the_idle_it_was_asked_for():
    """bench/micro/hostwake (bench/partitions.py prints it beside simgpu's
    switch figures): each of N wake-ups follows U us of sleep, so the run
    lasts at least N x U, and the sleep is not in the figure (a wake-up is
    far under the 5 ms pause); --other-cpu wakes on another CPU every time;
    a value out of range is refused with exit 2."""
    import time
    pattern = (r"HOSTWAKE n=40 idle_us=5000 p10_us=(\S+) p50_us=(\S+) p90_us=(\S+) p99_us=(\S+) "
               r"same_cpu=(\S+)\n")
    t0 = time.monotonic()
    r = subprocess.run([str(BIN / "hostwake"), "--n", "40", "--idle-us", "5000"], capture_output=True,
                       text=True, timeout=30)
    took = time.monotonic() - t0
    m = re.fullmatch(pattern, r.stdout)
    assert r.returncode == 0 and m, (r.returncode, r.stdout, r.stderr)
    q = [float(x) for x in m.groups()]
    assert 0 < q[0] <= q[1] <= q[2] <= q[3] and q[1] < 5000 and 0 <= q[4] <= 1, q
    assert took >= 40 * 0.005, took
    if len(os.sched_getaffinity(0)) >= 2:
        r = subprocess.run([str(BIN / "hostwake"), "--n", "40", "--idle-us", "5000", "--other-cpu"],
                           capture_output=True, text=True, timeout=30)
        m = re.fullmatch(pattern, r.stdout)
        assert r.returncode == 0 and m and float(m.group(5)) == 0.0, (r.stdout, r.stderr)
    bad = subprocess.run([str(BIN / "hostwake"), "--n", "3"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "10..10000000" in bad.stderr, bad.stderr
