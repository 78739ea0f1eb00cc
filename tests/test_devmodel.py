"""shim.devmodel: simgpu's device-model engine (engine.c, compiled into
shim._devmodel) driven in virtual time.  It must be simgpu's model itself:

* the same start and end times as simgpu_model_simulate, the offline entry
  point compiled into simgpu's libcudart.so.13, on a grid of mixes (kernel
  shapes and quotas, copies, 1-4 contexts, MPS on and off, staggered
  arrivals, the fluid model);
* the same kernel times as the live device: a CUDA program run on simgpu
  at timescale 0 charges each kernel its time alone, and SIMGPU_LAUNCH_LOG
  prints it with everything the model knew of the kernel;
* the parameters of the devices bench/colocation.py runs;
* a full table is refused with an error, and the device stays usable.
"""
from __future__ import annotations

import json
import math
import random
import subprocess
import sys

import pytest
from cffi import FFI
from conftest import ROOT, clean_env, simgpu_env

from shim import devmodel as dm
from shim import paths
from shim._devmodel import ffi, lib

sys.path.insert(0, str(ROOT / "bench"))
import colocation  # noqa: E402

pytestmark = pytest.mark.skipif(not paths.SIMGPU_CUDART.exists(), reason="simgpu not built (make build)")

PARAM_FIELDS = [f for f, _ in ffi.typeof("struct simgpu_model_params").fields]
TASK_IN = ("arrive", "blocks", "threads", "regs", "smem", "flops", "bytes", "quota_sms", "ctx", "kind")


def cudart_simulate(p, tasks: list[dict]) -> list[tuple[float, float]]:
    """simgpu_model_simulate of libcudart.so.13 on the tasks."""
    abi = FFI()
    abi.cdef("int simgpu_model_simulate(const void *p, int n, void *t);")
    cudart = abi.dlopen(str(paths.SIMGPU_CUDART), abi.RTLD_NOW | abi.RTLD_LOCAL)
    arr = ffi.new("struct simgpu_model_task[]", len(tasks))
    for a, t in zip(arr, tasks):
        for k in TASK_IN:
            setattr(a, k, t[k])
    addr = [abi.cast("void *", ffi.cast("uintptr_t", x)) for x in (p, arr)]
    assert cudart.simgpu_model_simulate(addr[0], len(tasks), addr[1]) == 0
    return [(a.start, a.end) for a in arr]


def device_simulate(p, tasks: list[dict]) -> list[tuple[float, float]]:
    """The same through a Device: each task admitted at its arrival, in
    arrival order (ties in list order), then run until nothing is left."""
    dev = dm.Device(p, cap=4)
    order = sorted(range(len(tasks)), key=lambda i: tasks[i]["arrive"])
    slot = {}
    for i in order:
        t = tasks[i]
        slot[i] = dev.add(t["kind"], t["blocks"], t["threads"], t["regs"], t["smem"], t["flops"],
                          t["bytes"], t["quota_sms"], t["ctx"], t["arrive"])
    dev.advance(math.inf)
    assert all(dev.finished(slot[i]) for i in range(len(tasks)))
    return [dev.times(slot[i]) for i in range(len(tasks))]


def random_mix(rng: random.Random, sms: int) -> list[dict]:
    tasks = []
    for _ in range(rng.randint(1, 8)):
        arrive = rng.choice([0.0, rng.random() * 2e-4])
        ctx = rng.randint(1, 4)
        kind = rng.choice([dm.KERNEL] * 4 + [dm.H2D, dm.D2H])
        if kind != dm.KERNEL:
            tasks.append(dict(arrive=arrive, blocks=1, threads=1, regs=0, smem=0, flops=0,
                              bytes=rng.choice([4096, 1e6, 3e7]), quota_sms=sms, ctx=ctx, kind=kind))
            continue
        b = rng.choice([1, 7, 64, sms, 4 * sms + 3, 3000, 20000])
        tasks.append(dict(arrive=arrive, blocks=b, threads=rng.choice([32, 96, 256, 1024]),
                          regs=rng.choice([0, 32, 64, 128]), smem=rng.choice([0, 0, 16384, 40000]),
                          flops=b * rng.choice([0, 1e4, 1e6]), bytes=b * rng.choice([0, 1e3, 1e5]),
                          quota_sms=dm.quota_sms(rng.choice([100, 50, 30, 10, 1]), sms),
                          ctx=ctx, kind=kind))
    return tasks


def test_engine_gives_the_times_of_simgpu_model_simulate():
    """Exact equality, mix after mix: it is the same engine, driven the same way."""
    rng = random.Random(15)
    cases = 0
    for mps in (True, False):
        for mech in (lib.SIMGPU_M_ALL, lib.SIMGPU_M_ALL | lib.SIMGPU_M_NOFOLD, 0):
            for sms in (132, 8):
                p = dm.default_params(mps=mps)
                p.mech, p.sms = mech, sms
                for _ in range(25):
                    tasks = random_mix(rng, sms)
                    want = cudart_simulate(p, tasks)
                    got = device_simulate(p, tasks)
                    assert got == want, (mps, mech, sms, tasks)
                    cases += 1
    assert cases == 300


def test_advance_to_next_collects_what_finished():
    """The simulator's loop: step event by event, collecting finished tasks;
    the times are those of simgpu_model_simulate, and entries are reused."""
    p = dm.default_params(mps=False)
    tasks = [dict(arrive=0.0, blocks=2000, threads=256, regs=0, smem=0, flops=2e9, bytes=1e8,
                  quota_sms=132, ctx=1, kind=dm.KERNEL),
             dict(arrive=0.0, blocks=66, threads=128, regs=0, smem=0, flops=1e8, bytes=0,
                  quota_sms=66, ctx=2, kind=dm.KERNEL),
             dict(arrive=0.0, blocks=1, threads=1, regs=0, smem=0, flops=0, bytes=5e7,
                  quota_sms=132, ctx=2, kind=dm.H2D)]
    want = cudart_simulate(p, tasks)
    dev = dm.Device(p)
    slots = [dev.add(t["kind"], t["blocks"], t["threads"], t["regs"], t["smem"], t["flops"], t["bytes"],
                     t["quota_sms"], t["ctx"], 0.0) for t in tasks]
    got: dict[int, tuple[float, float]] = {}
    steps = 0
    while True:
        t, done = dev.advance_to_next()
        if math.isinf(t):
            break
        steps += 1
        for d in done:
            assert d.end == t
            got[slots.index(d.entry)] = (d.start, d.end)
    assert [got[i] for i in range(3)] == want
    assert steps == dev.events > 3, "time slices are events that finish nothing"
    assert dev.add(dm.KERNEL, 1, 32, 0, 0, 1e3, 0, 132, 1, dev.now) == 0, "entries are free again"


def test_a_queued_task_holds_the_device_until_it_joins():
    """The live device's waits (model.c): when a task whose stream has its
    next task queued ends, no event past that task's start is handled until
    it joins, so it starts exactly then however late its executor comes;
    without the wait, the device has moved on and the task starts late."""
    def run(lead: float | None) -> tuple[float, float]:
        dev = dm.Device(dm.default_params(mps=True))
        a = dev.add(dm.KERNEL, 66, 256, 0, 0, 5e8, 0, 66, 1, 0.0, lead=lead)
        b = dev.add(dm.KERNEL, 66, 256, 0, 0, 5e9, 0, 66, 2, 0.0)   # a co-runner, 10x as long
        a_end = dev.run_until_done(a)[1]
        due = a_end + 3e-6
        dev.advance(due + 1e-3)        # other executors come first: 1 ms of device time
        assert (dev.now <= due) == (lead is not None), (dev.now, due)
        if lead is not None:
            assert dev.barrier() == due and not dev.finished(b)
            with pytest.raises(ValueError, match="waits for a queued task"):
                dev.add(dm.KERNEL, 1, 32, 0, 0, 1e3, 0, 132, 2, due + 1e-6)
            dev.keep(dev.task_id(a))
            assert dev.barrier() == math.inf
        a2 = dev.add(dm.KERNEL, 66, 256, 0, 0, 5e8, 0, 66, 1, max(due, dev.now))
        return dev.run_until_done(a2)[0], due

    start, due = run(3e-6)
    assert start == due, "the queued task starts when its stream lets it"
    late, _ = run(None)
    assert late > due + 1e-4, "without the wait it started where the device had got to"


def test_a_wait_lapses_after_its_deadline_and_expect_gives_tokens_only_for_the_future():
    dev = dm.Device(dm.default_params(mps=True))
    dev.add(dm.KERNEL, 132, 256, 0, 0, 5e8, 0, 132, 1, 0.0)
    tok = dev.expect(7, 1e-6)
    assert tok > 0 and dev.barrier() == 1e-6 and dev.barrier(mine=tok) == math.inf
    dev.advance(1.0)
    assert dev.now <= 1e-6 < dev.next_event(), "held at the expected task's start"
    with pytest.raises(RuntimeError, match="waits for a queued task"):
        dev.advance_to_next()
    assert dev.lapse(1.0) == 0, "no deadline until stamped"
    dev.stamp(now=5e-6, window=2e-6)      # stamped late: the deadline counts from then
    assert dev.lapse(6.9e-6) == 0 and dev.lapse(7.1e-6) == 1
    dev.advance(1.0)
    assert dev.now > 1e-6 and dev.expect(7, dev.now / 2) == 0, "no wait in the past"
    a, b = dev.expect(7, 2.0), dev.expect(8, 3.0)
    assert dev.lapse(-math.inf, ctx=7) == 1 and dev.barrier() == 3.0, "a context's waits go"
    assert not dev.keep(a) and dev.keep(b) and not dev.keep(b)


def test_a_time_sliced_context_is_held_until_its_queued_kernel_starts():
    """Without MPS a context whose next kernel is queued keeps the device for
    hold_s; where the launch overhead (lead) is longer, past that kernel's
    known start, so another context does not take the device in between."""
    lead = 5e-6
    dev = dm.Device(dm.default_params(mps=False), hold_s=1e-6)
    a = dev.add(dm.KERNEL, 66, 256, 0, 0, 5e8, 0, 132, 1, 0.0, follow=True, lead=lead)
    dev.add(dm.KERNEL, 66, 256, 0, 0, 5e8, 0, 132, 2, 0.0)      # ctx 2 waits its turn
    a_end = dev.run_until_done(a)[1]
    assert dev.keep(dev.task_id(a))
    a2 = dev.add(dm.KERNEL, 66, 256, 0, 0, 5e8, 0, 132, 1, a_end + lead)
    assert dev.run_until_done(a2)[0] == pytest.approx(a_end + lead, abs=1e-12)


# ---------------------------------------------------------------- the live device

LIVE_CASES = [   # flops, bytes, blocks, threads, dynamic smem, MPS percentage
    (1e9, 0, 1056, 256, 0, 100),          # compute, several waves
    (0, 1e8, 264, 512, 0, 50),            # memory
    (1e7, 1e6, 8, 64, 0, 100),            # a few blocks: too few warps for the peak
    (5e8, 5e7, 5000, 1024, 0, 30),
    (1e8, 1e7, 700, 128, 40000, 70),      # shared memory limits residency
    (2e9, 1e8, 1056, 256, 0, 10),
    (1e6, 1e9, 100000, 32, 0, 1),         # one SM
    (3e8, 3e8, 333, 96, 16384, 45),
]


def test_kernel_times_are_the_live_devices(mech, simdir, tmp_path):
    """Each kernel of a real CUDA program on simgpu (timescale 0: each kernel
    charged its time alone), shaped from its launch-log line, takes what the
    log says it took (to the log's 1 ns), alone and run through a Device;
    the log's quota in SMs is quota_sms() of its percentage."""
    p = dm.default_params()
    seen = 0
    for n, (flops, nbytes, blocks, threads, smem, pct) in enumerate(LIVE_CASES):
        log = tmp_path / f"launch{n}.jsonl"
        env = simgpu_env(simdir, SIMGPU_LAUNCH_LOG=log, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=pct)
        r = subprocess.run([str(mech), "kernel", repr(flops), repr(nbytes), str(blocks), str(threads),
                            str(smem), "2", "1"], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        lines = [json.loads(ln) for ln in log.read_text().splitlines()]
        assert len(lines) == 3, lines           # the warm-up kernel, then two of the case
        assert lines[-1]["grid"][0] == blocks and lines[-1]["smem"] >= smem, lines[-1]
        for ln in lines:
            q = dm.quota_sms(ln["quota"], int(p.sms))
            assert q == ln["quota_sms"], ln
            shape = (dm.KERNEL, math.prod(ln["grid"]), math.prod(ln["block"]), ln["regs"], ln["smem"],
                     ln["flops"], ln["bytes"], q)
            alone = dm.solo(p, *shape)
            assert abs(alone * 1e6 - ln["dur_us"]) <= 5.0001e-4, (ln, alone * 1e6)
            dev = dm.Device(p)
            start, end = dev.run_until_done(dev.add(*shape, ctx=1, t=0.0))
            assert start == 0 and abs((end - start) * 1e6 - ln["dur_us"]) <= 5.0001e-4, (ln, end)
            seen += 1
    assert seen == 3 * len(LIVE_CASES)


# ---------------------------------------------------------------- parameters

def live_params(env: dict[str, str]) -> dict[str, float]:
    """simgpu_model_params_get in a process of its own with this environment."""
    code = ("import json; from cffi import FFI; from shim._devmodel import ffi; from shim import paths\n"
            "abi = FFI(); abi.cdef('int simgpu_model_params_get(void *p);')\n"
            "L = abi.dlopen(str(paths.SIMGPU_CUDART)); p = ffi.new('struct simgpu_model_params *')\n"
            "L.simgpu_model_params_get(abi.cast('void *', ffi.cast('uintptr_t', p)))\n"
            f"print(json.dumps({{f: getattr(p, f) for f in {PARAM_FIELDS!r}}}))")
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def as_dict(p) -> dict[str, float]:
    return {f: getattr(p, f) for f in PARAM_FIELDS}


@pytest.mark.parametrize("mps,slowdown", [(True, 1.0), (True, 1000.0), (False, 1000.0), (False, 7.0)])
def test_default_params_are_the_devices_colocation_runs(mps, slowdown, tmp_path):
    """default_params(mps, slowdown) is, field for field, what simgpu reads
    from the environment bench/colocation.py gives its processes."""
    env = colocation.device_env(colocation.Setup(slowdown=slowdown), tmp_path / "dev", mps=mps)
    assert as_dict(dm.default_params(mps=mps, slowdown=slowdown)) == live_params(env)


def test_default_params_ignore_this_processs_simgpu_settings():
    """The compiled-in preset, whatever SIMGPU_* this process runs with (and
    they are back in its environment afterwards)."""
    code = ("import json, os; from shim import devmodel as dm\n"
            "p = dm.default_params(); assert os.environ['SIMGPU_SM_GFLOPS'] == '1'\n"
            f"print(json.dumps({{f: getattr(p, f) for f in {PARAM_FIELDS!r}}}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env=clean_env(SIMGPU_SM_GFLOPS="1", SIMGPU_MPS="0", SIMGPU_PRESET="/nonexistent"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == live_params(clean_env()) == as_dict(dm.default_params())


def test_quota_sms_gives_whole_tpcs_as_the_gpus_did():
    """MPS percentages became these SM counts on an H100 and an H200 (each
    calibration run's cudaDevAttrMultiProcessorCount under MPS): the
    percentage's SMs rounded down to whole TPCs of 2.  quota_sms (and
    config.c, which the launch-log test above ties to it) must give them."""
    for name in ("h100-2026-11-27.jsonl", "h200-2026-11-27.jsonl"):
        seen = {}
        for ln in (ROOT / "bench" / "calib" / name).read_text().splitlines():
            for run in json.loads(ln).get("runs", []):
                if run.get("mps_enabled") and run.get("quota_env"):
                    seen[int(run["quota_env"])] = run["sm_count"]
        assert len(seen) == 10, (name, seen)
        assert {q: dm.quota_sms(q, 132) for q in seen} == seen, name
    assert [dm.quota_sms(x, 132) for x in (100, 45, 1, 0.1)] == [132, 58, 2, 2]
    assert dm.quota_sms(25, 10) == 2 and dm.quota_sms(100, 1) == 1
    assert dm.quota_sms(100, 131) == 131 and dm.quota_sms(50, 131) == 64
    with pytest.raises(ValueError):
        dm.quota_sms(0, 132)


# ---------------------------------------------------------------- a full table

def test_full_table_is_refused_and_the_device_stays_usable(monkeypatch):
    """The table grows from its first size; past MAX_TASKS entries in use
    (running, or finished and not collected) add() raises DeviceFull, and
    once entries are freed it admits again."""
    monkeypatch.setattr(dm, "MAX_TASKS", 300)
    dev = dm.Device(cap=4)
    slots = [dev.add(dm.KERNEL, 10, 256, 0, 0, 1e9, 0, 132, i % 3, 1e-6 * i) for i in range(300)]
    assert sorted(slots) == list(range(300)) and dev.cap == 300
    with pytest.raises(dm.DeviceFull, match="collect"):
        dev.add(dm.KERNEL, 10, 256, 0, 0, 1e9, 0, 132, 0, 1e-3)
    with pytest.raises(ValueError):
        dev.add(dm.KERNEL, 10, 256, 0, 0, math.nan, 0, 132, 0, 1e-3)
    with pytest.raises(ValueError, match="already"):
        dev.add(dm.KERNEL, 10, 256, 0, 0, 1e9, 0, 132, 0, 0.0)
    dev.run_until_done(slots[0])
    first = dev.collect()
    assert slots[0] in [d.entry for d in first] and dev.collect() == []
    assert dev.add(dm.KERNEL, 10, 256, 0, 0, 1e9, 0, 132, 0, dev.now) == min(d.entry for d in first)
    dev.advance(math.inf)
    assert len(first) + len(dev.collect()) == 301 and math.isinf(dev.next_event())


def test_a_table_of_max_tasks():
    """The real limit: MAX_TASKS tasks at once, then a clear refusal."""
    dev = dm.Device()
    for i in range(dm.MAX_TASKS):
        dev.add(dm.H2D, 1, 1, 0, 0, 0, 1e6, 1, i, 0.0)
    with pytest.raises(dm.DeviceFull):
        dev.add(dm.H2D, 1, 1, 0, 0, 0, 1e6, 1, 0, 0.0)
    t, done = dev.advance_to_next()
    assert len(done) == dm.MAX_TASKS and t == pytest.approx(dm.MAX_TASKS * 1e6 / 54.8e9)


def test_colocation_models_are_cached_per_build(tmp_path, monkeypatch):
    """bench/colocation.py caches the profiled models by Setup.key(): a new
    simgpu runtime (or a rebuilt program) must give a new key, or `make demo`
    replays models profiled on the old device (it did, once, after the MPS
    quota rule changed)."""
    lib = tmp_path / "libcudart.so.13"
    lib.write_bytes(b"one build")
    monkeypatch.setattr(colocation.paths, "SIMGPU_DIR", tmp_path)
    before = colocation.Setup().key()
    assert colocation.Setup().key() == before
    lib.write_bytes(b"another build")
    assert colocation.Setup().key() != before
    assert colocation.Setup(batch=["hotspot"]).key() != colocation.Setup(batch=["lud"]).key()
