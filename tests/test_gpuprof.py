"""`colocate profile` on a real GPU, tested without one: ncu's CSV parsed
(predictors/counters.py), and the GPU path's orchestration driven with fakes
(a driver said present, fake ncu / nvidia-smi / nvidia-cuda-mps-control on
PATH) on a simgpu program, whose trace works as on a GPU."""
from __future__ import annotations

import math
import os
import sys
import textwrap
from pathlib import Path

import pytest

from predictors import counters as C
from predictors import profile as P
from predictors import profile_gpu as PG
from predictors.store import Store
from shim import paths

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "bench" / "bin"
GPU_NAME = "NVIDIA H100 80GB HBM3"

# what `ncu --csv --metrics ...` prints (details page): ncu's own messages,
# the header, one line per kernel and metric; scaled units, thousands
# separators, a metric that is n/a
NCU_CSV = textwrap.dedent('''\
    ==PROF== Connected to process 4242 (/opt/app)
    ==PROF== Profiling "_Z4axpyPfS_f": 0%....50%....100% - 3 passes
    "ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
    "0","4242","app","127.0.0.1","_Z4axpyPfS_f","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes.sum.per_second","Tbyte/second","2.10"
    "0","4242","app","127.0.0.1","_Z4axpyPfS_f","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","12.50"
    "0","4242","app","127.0.0.1","_Z4axpyPfS_f","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","sm__inst_executed.avg.per_cycle_active","inst/cycle","0.41"
    "1","4242","app","127.0.0.1","_Z4gemmPKfS0_Pf","1","7","(16, 16, 1)","(64, 64, 1)","0","9.0","Command line profiler metrics","dram__bytes.sum.per_second","Gbyte/second","1,234.50"
    "1","4242","app","127.0.0.1","_Z4gemmPKfS0_Pf","1","7","(16, 16, 1)","(64, 64, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","1,500,000"
    "1","4242","app","127.0.0.1","_Z4gemmPKfS0_Pf","1","7","(16, 16, 1)","(64, 64, 1)","0","9.0","Command line profiler metrics","sm__inst_executed.avg.per_cycle_active","inst/cycle","3.20"
    "2","4242","app","127.0.0.1","_Z4axpyPfS_f","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","dram__bytes.sum.per_second","byte/second","900000000000"
    "2","4242","app","127.0.0.1","_Z4axpyPfS_f","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","msecond","0.02"
    "2","4242","app","127.0.0.1","_Z4axpyPfS_f","1","7","(256, 1, 1)","(4096, 1, 1)","0","9.0","Command line profiler metrics","sm__inst_executed.avg.per_cycle_active","inst/cycle","n/a"
    ==PROF== Disconnected from process 4242
    ''')


def test_parse_ncu_csv():
    rows = C.parse("app output before the report\n" + NCU_CSV)
    assert [(r.id, r.pid, r.name) for r in rows] == [
        (0, 4242, "_Z4axpyPfS_f"), (1, 4242, "_Z4gemmPKfS0_Pf"), (2, 4242, "_Z4axpyPfS_f")]
    a, g, b = (r.metrics for r in rows)
    assert a[PG.NCU_BW] == pytest.approx(2.1e12) and a[PG.NCU_TIME] == pytest.approx(12.5e-6)
    assert a[PG.NCU_IPC] == pytest.approx(0.41)
    assert g[PG.NCU_BW] == pytest.approx(1234.5e9)           # separator and Gbyte
    assert g[PG.NCU_TIME] == pytest.approx(1.5e-3)           # 1,500,000 ns
    assert b[PG.NCU_BW] == pytest.approx(9e11) and b[PG.NCU_TIME] == pytest.approx(2e-5)
    assert PG.NCU_IPC not in b                                # n/a: absent, not 0


def test_parse_rows_come_back_in_launch_order():
    lines = NCU_CSV.splitlines()
    head, body = lines[:3], lines[3:-1]
    rows = C.parse("\n".join(head + body[::-1]))
    assert [r.id for r in rows] == [0, 1, 2]


@pytest.mark.parametrize("bad, msg", [
    ("", "no ncu CSV header"),
    ("just some program output\n", "no ncu CSV header"),
    (NCU_CSV + 'garbage, not a row\n', "line 14: 2 fields, the header has 15"),
    (NCU_CSV.replace('"1","4242"', '"one","4242"', 1), "not integers"),
    (NCU_CSV.replace('"Tbyte/second"', '"Qbyte/second"'), "unknown unit 'Qbyte/second'"),
    (NCU_CSV.replace('"2.10"', '"fast"'), "'fast' is not a number"),
])
def test_parse_garbage_is_a_clear_error(bad, msg):
    with pytest.raises(C.CountersError, match=msg.replace("(", r"\(")):
        C.parse(bad)


def test_units():
    assert C.unit_factor("Gbyte/second") == 1e9 and C.unit_factor("byte/usecond") == 1e6
    assert C.unit_factor("inst/cycle") == 1 and C.unit_factor("msecond") == 1e-3
    assert C.unit_factor("%") == 1


def test_counter_join_sums_a_library_task():
    rows = C.parse(NCU_CSV)
    trace = [{"pid": 77, "seq": 0, "kind": "kernel", "name": "_Z4axpyPfS_f", "dur_us": 13.0},
             {"pid": 77, "seq": 1, "kind": "library", "name": "cublasSgemm_v2", "kernels": 2,
              "dur_us": 1600.0}]
    tg = PG.counter_targets(P.trace_tasks(trace), rows)
    assert tg[0] == pytest.approx({"bandwidth_gbs": 2100.0, "ipc": 0.41})
    # gemm 1.5 ms at 1234.5 GB/s plus axpy 20 us at 900 GB/s, over 1.52 ms;
    # the axpy's IPC is n/a, so the library task has none
    want = (1234.5e9 * 1.5e-3 + 9e11 * 2e-5) / 1.52e-3 / 1e9
    assert tg[1] == pytest.approx({"bandwidth_gbs": want})
    trace[0]["name"] = "_Z5otherv"
    with pytest.raises(P.RunFailed, match="met ncu kernel _Z4axpyPfS_f"):
        PG.counter_targets(P.trace_tasks(trace), rows)
    trace[0]["name"] = "_Z4axpyPfS_f"
    with pytest.raises(P.RunFailed, match="left over"):
        PG.counter_targets(P.trace_tasks(trace[:1]), rows)


# --- the GPU path with fakes -------------------------------------------------

needs_build = pytest.mark.skipif(
    not (BIN / "hotspot").exists() or not paths.SIMGPU_CUDART.exists()
    or not paths.LIBCOLOCATE.exists(), reason="hotspot, shim or simgpu not built (make build)")

FAKE_NCU = '''#!{py}
"""Fake ncu: run the program (traced by the shim), then write a CSV for the
kernels of that run's trace, with canned figures."""
import json, os, subprocess, sys
args = sys.argv[1:]
opts = {{}}
while args and args[0].startswith("--"):
    o = args.pop(0)
    opts[o] = True if o == "--csv" else args.pop(0)
assert opts.get("--print-kernel-base") == "mangled", opts
rc = subprocess.call(args)
recs = [json.loads(l) for l in open(os.environ["COLOCATE_TRACE"]) if l.strip()]
recs = sorted((r for r in recs if r.get("kind") == "kernel"), key=lambda r: r["seq"])
out = ["==PROF== Connected to process 1",
       '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
       '"Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit",'
       '"Metric Value"']
for i, r in enumerate(recs):
    for m, u, v in (("dram__bytes.sum.per_second", "Gbyte/second", "1,500.25"),
                    ("gpu__time_duration.sum", "usecond", "10.5"),
                    ("sm__inst_executed.avg.per_cycle_active", "inst/cycle", "2.5")):
        out.append(f'"{{i}}","{{r["pid"]}}","app","h","{{r["name"]}}","1","7","(16, 16, 1)",'
                   f'"(8, 8, 1)","0","9.0","Command line profiler metrics","{{m}}","{{u}}","{{v}}"')
open(opts["--log-file"], "w").write("\\n".join(out) + "\\n")
sys.exit(rc)
'''

# MPS control: -d "starts" (creates the control pipe), get_server_list answers
# while it exists, quit removes it; FAIL=1 makes -d fail
FAKE_MPS = '''#!/bin/sh
d="${CUDA_MPS_PIPE_DIRECTORY:?}"
if [ "$1" = "-d" ]; then
    [ -n "$FAKE_MPS_FAIL" ] && { echo "cannot start MPS: no device" >&2; exit 1; }
    mkdir -p "$d" && : > "$d/control" && echo started >> "$FAKE_MPS_LOG"; exit 0
fi
read cmd
[ -e "$d/control" ] || exit 1
case "$cmd" in
quit) rm -f "$d/control"; echo quit >> "$FAKE_MPS_LOG" ;;
esac
exit 0
'''


@pytest.fixture
def gpu(tmp_path, monkeypatch):
    """A 'GPU machine': a driver said present, no NVML, fake tools on PATH;
    the programs still run on simgpu (LD_LIBRARY_PATH, a private device)."""
    from shim import launcher
    bind = tmp_path / "bin"
    bind.mkdir()
    for name, text in (("nvidia-smi", f"#!/bin/sh\necho '{GPU_NAME}'\n"),
                       ("nvidia-cuda-mps-control", FAKE_MPS),
                       ("ncu", FAKE_NCU.format(py=sys.executable))):
        (bind / name).write_text(text)
        (bind / name).chmod(0o755)
    monkeypatch.setattr(launcher, "cuda_usable", lambda: True)
    monkeypatch.setitem(sys.modules, "pynvml", None)       # NVML "missing": nvidia-smi names it
    for k in list(os.environ):
        if k.startswith(("COLOCATE_", "SIMGPU_", "CUDA_MPS")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("PATH", f"{bind}:{os.environ['PATH']}")
    monkeypatch.setenv("COLOCATE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(paths.SIMGPU_DIR))
    monkeypatch.setenv("SIMGPU_DIR", str(tmp_path / "dev"))
    monkeypatch.setenv("SIMGPU_TIMESCALE", "0")
    monkeypatch.setenv("FAKE_MPS_LOG", str(tmp_path / "mps.log"))
    return tmp_path


def profile_cli(*args: str):
    from typer.testing import CliRunner

    from predictors.cli import app
    return CliRunner().invoke(app, ["profile", "hotspot", "--inputs", "--size 64 --iters 4",
                                    "--no-progress", *args])


def stored(tmp: Path, kind: str = "task"):
    return Store(tmp / "data" / "profiles", GPU_NAME).load(kind)


@needs_build
def test_gpu_profile_with_ncu_and_mps(gpu):
    res = profile_cli("--quotas", "50,100", "--reps", "1")
    assert res.exit_code == 0, res.output
    ss = stored(gpu)
    assert len(ss) == 2 * 2                             # 2 kernels x 2 quotas
    assert set(ss.sources) == {"profile:gpu:ncu:mps"}
    assert (ss.y("bandwidth_gbs") == 1500.25).all() and (ss.y("ipc") == 2.5).all()
    d = ss.y("duration_us")                             # from the trace, not ncu's 10.5 us
    assert (d > 0).all() and not (d == 10.5).any()
    assert {r["quota"] for r in ss.rows} == {50, 100}
    assert all(r["task"].startswith("_Z15hotspot") for r in ss.rows)
    # MPS was started for the run and stopped after it
    assert (gpu / "mps.log").read_text().split() == ["started", "quit"]
    assert not (gpu / "data" / "profiles" / "simgpu").exists()


@needs_build
def test_gpu_profile_without_ncu_is_trace_only_and_trains(gpu, monkeypatch):
    (gpu / "bin" / "ncu").unlink()
    monkeypatch.setenv("PATH", ":".join(p for p in os.environ["PATH"].split(":")
                                        if not (Path(p) / "ncu").exists()))
    res = profile_cli("--quotas", "20,40,60,80,100", "--reps", "2")
    assert res.exit_code == 0, res.output
    assert "no ncu" in res.output
    ss = stored(gpu)
    assert len(ss) == 2 * 5 * 2 and set(ss.sources) == {"profile:gpu:trace-only:mps"}
    assert (ss.y("duration_us") > 0).all()
    assert all(math.isnan(v) for v in ss.y("bandwidth_gbs"))
    assert all(math.isnan(v) for v in ss.y("ipc"))
    # training every target: duration is learnt, the absent targets are skipped
    from typer.testing import CliRunner

    from predictors.cli import app
    res = CliRunner().invoke(app, ["train", "--kind", "task", "--model", "dt", "--cv", "0",
                                   "--device", GPU_NAME])
    assert res.exit_code == 0, res.output
    assert "task.duration_us.dt" in res.output
    assert "task.bandwidth_gbs: skipped" in res.output and "task.ipc: skipped" in res.output


@needs_build
def test_gpu_profile_without_mps(gpu, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_FAIL", "1")
    res = profile_cli("--quotas", "50,100", "--reps", "1")
    assert res.exit_code == 1
    assert "MPS is not available" in res.output and "--quotas 100" in res.output
    assert not (gpu / "data" / "profiles").exists() or not any(
        (gpu / "data" / "profiles").rglob("*.jsonl"))
    res = profile_cli("--quotas", "100", "--reps", "1")  # quota 100 needs no MPS
    assert res.exit_code == 0, res.output
    ss = stored(gpu)
    assert len(ss) == 2 and set(ss.sources) == {"profile:gpu:ncu:no-mps"}
    assert (ss.y("ipc") == 2.5).all()


@needs_build
def test_groups_refused_on_a_gpu(gpu):
    res = profile_cli("--groups", "3")
    assert res.exit_code == 2 and "simgpu" in res.output
