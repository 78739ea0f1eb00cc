"""Green contexts (CUDA 12.4+) on simgpu's libcuda.so.1 (shim/simgpu/driver/green.c).

tests/progs/green.c loads the driver as cudart does (dlopen, cuGetProcAddress_v2,
checked against dlsym) and prints one JSON line per mode:

- split: the device's SM resource and cuDevSmResourceSplitByCount for several
  minimum counts (sm_90: groups of a multiple of 8 SMs, at least 8; the rest
  in `remaining`);
- run: add_one on the primary context and on a 16-SM green context; the
  launch log (SIMGPU_LAUNCH_LOG, timescale 0: model time only) shows each
  kernel's SM cap and modelled duration; an event of the green stream orders
  a primary stream's kernel;
- bad: bad arguments, each an error code and never a crash.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ensure_simgpu, simgpu_env

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "bench" / "bin"
GREEN = BIN / "test-green"
FATBIN = BIN / "test-drvapi.fatbin"
TWINS = BIN / "test-drvapi.twins.so"
TARGETS = ["bench/bin/test-green", "bench/bin/test-drvapi.fatbin", "bench/bin/test-drvapi.twins.so"]

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_DEVICE = 101
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_INVALID_RESOURCE_TYPE = 914
CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION = 915


@pytest.fixture(scope="module")
def built() -> None:
    """simgpu's libraries and the program (the fat binary needs nvcc once)."""
    ensure_simgpu()
    if not shutil.which(os.environ.get("NVCC", "nvcc")) and not all((ROOT / t).exists() for t in TARGETS):
        pytest.skip("nvcc not installed: no fat binary for tests/progs/green.c")
    r = subprocess.run(["make", "-s", *TARGETS], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"make {' '.join(TARGETS)} failed:\n{r.stdout[-2000:]}{r.stderr[-4000:]}")


def green(simdir: str, *args: str, **env: object) -> dict:
    """Run tests/progs/green.c on simgpu; its one JSON line (exit code 0)."""
    e = simgpu_env(simdir, SIMGPU_TWINS=str(TWINS), **env)
    e.pop("LD_PRELOAD", None)
    p = subprocess.run([str(GREEN), *args], env=e, capture_output=True, text=True, timeout=60)
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    assert p.returncode == 0 and len(lines) == 1, f"rc {p.returncode}: {p.stdout!r} {p.stderr!r}"
    out = json.loads(lines[0])
    assert "fail" not in out, out
    return out


def test_device_resource_and_split_by_multiples_of_8(built, simdir):
    """Sizes rounded up to a multiple of 8 and a size past the device being
    the whole device (one group: as an H200 did), the whole device in groups
    of 8 making 15 and leaving 12 SMs (as the H200 and an H100 did,
    bench/RESULTS.md); other group counts are as many as fit.  The counts
    below are those an H100 made (`green_probe split`, "multi", 2026-11-27):
    minCount 9, 16 -> 8 x 16 + 4; 20, 24 -> 5 x 24 + 12; 32 -> 4 x 32 + 4;
    64 -> 2 x 64 + 4; 66 -> 72 + 60; 100 -> 104 + 28; 128 -> 128 + 4."""
    out = green(simdir, "split")
    assert out["device"] == {"sms": 132, "min": 8, "align": 8}
    by_min = {s["min"]: s for s in out["splits"]}
    # minCount -> group size -> groups made (64 asked)
    want = {0: (8, 15), 1: (8, 15), 8: (8, 15), 9: (16, 8), 16: (16, 8), 20: (24, 5), 24: (24, 5),
            32: (32, 4), 64: (64, 2), 66: (72, 1), 67: (72, 1), 100: (104, 1), 128: (128, 1), 132: (132, 1)}
    for m, (size, groups) in want.items():
        s = by_min[m]
        assert s["query_rc"] == 0 and s["would"] == groups, s
        # as many groups as fit, all the same size; the rest remains
        assert (s["rc"], s["groups"], s["size"], s["last"]) == (0, groups, size, size), s
        assert s["remaining"] == 132 - groups * size, s
        # one group asked: one made, everything else in `remaining`
        assert (s["one_rc"], s["one_groups"], s["one_size"], s["one_remaining"]) == \
            (0, 1, size, 132 - size), s


@pytest.fixture(scope="module")
def run_16(built, tmp_path_factory) -> tuple[dict, list[dict]]:
    """The `run` mode with a 16-SM green context: its JSON line and the
    launch log's six kernels, in launch order."""
    d = tmp_path_factory.mktemp("green")
    log = d / "launches.jsonl"
    out = green(str(d / "sim"), "run", str(FATBIN), "16", SIMGPU_LAUNCH_LOG=str(log))
    rows = sorted((json.loads(ln) for ln in log.read_text().splitlines()), key=lambda r: r["seq"])
    # the last two: the cooperative grids that fit (green, then primary)
    assert [r["name"] for r in rows] == ["add_one"] * 3 + ["scale2"] + ["add_one"] * 4
    return out, rows


def test_green_stream_kernel_capped_to_its_partition(run_16):
    out, rows = run_16
    assert out["green_sms"] == 16
    primary, on_green = rows[0], rows[1]
    assert primary["quota_sms"] == 132
    assert on_green["quota_sms"] == 16 and on_green["sms"] == 16
    # 1056 blocks of 256 threads: one wave on 132 SMs, several on 16
    assert on_green["dur_us"] > 1.5 * primary["dur_us"], (primary, on_green)


def test_cooperative_grid_must_fit_the_partition(run_16):
    """cuLaunchCooperativeKernel on a green stream: 8 blocks of 256 threads
    an SM on its 16 SMs fit, one block more is
    CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE (720); on the primary stream
    (all 132 SMs) the larger grid fits."""
    out, rows = run_16
    assert (out["coop_fits"], out["coop_over"], out["coop_primary"]) == (0, 720, 0), out
    assert [(r["grid"][0], r["quota_sms"]) for r in rows[6:]] == [(128, 16), (129, 132)]


def test_green_context_current_caps_the_null_stream(run_16):
    out, rows = run_16
    assert out["current_is_green"] and out["null_stream_green"]
    assert rows[4]["quota_sms"] == 16          # NULL stream, green context current
    assert rows[5]["quota_sms"] == 132         # NULL stream, primary current again


def test_green_stream_results_correct(run_16):
    out, _ = run_16
    # a: add_one on the primary and on the green NULL stream; b: on the green
    # stream and the primary NULL stream; c: add_one (green) then scale2
    assert (out["bad_a"], out["bad_b"], out["bad_c"]) == (-1, -1, -1), out


def test_stream_get_green_ctx(run_16):
    out, _ = run_16
    assert out["stream_green"] is True
    assert out["primary_stream_green"] is False


def test_primary_stream_waits_for_green_event(run_16):
    _, rows = run_16
    green_k, after = rows[2], rows[3]
    assert green_k["quota_sms"] == 16 and after["quota_sms"] == 132
    # scale2 on the primary stream starts (after its launch overhead) no
    # earlier than the green kernel whose event it waited for ended
    assert after["start_us"] >= green_k["start_us"] + green_k["dur_us"], (green_k, after)


def test_mps_quota_and_green_partition_take_the_smaller(built, tmp_path):
    log = tmp_path / "launches.jsonl"
    out = green(str(tmp_path / "sim"), "run", str(FATBIN), "64", SIMGPU_LAUNCH_LOG=str(log),
                CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="25")
    rows = sorted((json.loads(ln) for ln in log.read_text().splitlines()), key=lambda r: r["seq"])
    # 25 % of 132 SMs is 32 in whole TPCs: below the 64-SM partition, and
    # caps the primary too; so no cooperative grid of 8 x 64 blocks fits
    assert [r["quota_sms"] for r in rows] == [32] * 6
    assert (out["coop_fits"], out["coop_primary"]) == (720, 720), out
    log.unlink()
    green(str(tmp_path / "sim2"), "run", str(FATBIN), "16", SIMGPU_LAUNCH_LOG=str(log),
          CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="50")
    rows = sorted((json.loads(ln) for ln in log.read_text().splitlines()), key=lambda r: r["seq"])
    assert [r["quota_sms"] for r in rows] == [66, 16, 16, 66, 16, 66, 16, 66]


def test_bad_arguments_are_errors(built, simdir):
    rc = green(simdir, "bad")
    want = {
        "get_null": CUDA_ERROR_INVALID_VALUE,
        "get_type": CUDA_ERROR_INVALID_RESOURCE_TYPE,
        "get_device": CUDA_ERROR_INVALID_DEVICE,
        "split_nb_null": CUDA_ERROR_INVALID_VALUE,
        "split_input_null": CUDA_ERROR_INVALID_VALUE,
        "split_zero_groups": CUDA_ERROR_INVALID_VALUE,
        "split_too_many_sms": CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
        "split_rounds_past": 0,      # 129 rounds past 132: the whole device (the H200 gave 132 for 132)
        "split_flags": CUDA_ERROR_INVALID_VALUE,
        "split_type": CUDA_ERROR_INVALID_RESOURCE_TYPE,
        "split_untagged": CUDA_ERROR_INVALID_VALUE,
        "split_again": CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
        "desc_null": CUDA_ERROR_INVALID_VALUE,
        "desc_zero": CUDA_ERROR_INVALID_VALUE,
        "desc_mixed": CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION,
        "create_flags": CUDA_ERROR_INVALID_VALUE,
        "create_device": CUDA_ERROR_INVALID_DEVICE,
        "create_garbage_desc": CUDA_ERROR_INVALID_VALUE,
        "create_null_desc": CUDA_ERROR_INVALID_VALUE,
        "stream_blocking": CUDA_ERROR_INVALID_VALUE,
        "stream_null": CUDA_ERROR_INVALID_VALUE,
        "stream_dead": CUDA_ERROR_INVALID_CONTEXT,
        "stream_garbage": CUDA_ERROR_INVALID_CONTEXT,
        "destroy_dead": CUDA_ERROR_INVALID_CONTEXT,
        "destroy_null": CUDA_ERROR_INVALID_CONTEXT,
        "from_null": CUDA_ERROR_INVALID_VALUE,
        "from_dead": CUDA_ERROR_INVALID_CONTEXT,
        "ctx_destroy_green": CUDA_ERROR_INVALID_CONTEXT,
        "res_dead": CUDA_ERROR_INVALID_CONTEXT,
        "res_null": CUDA_ERROR_INVALID_VALUE,
        "ctx_res_garbage": CUDA_ERROR_INVALID_CONTEXT,
        "record_null_event": CUDA_ERROR_INVALID_HANDLE,
        "record_dead": CUDA_ERROR_INVALID_CONTEXT,
        "wait_null_event": CUDA_ERROR_INVALID_HANDLE,
        "stream_green_null": CUDA_ERROR_INVALID_VALUE,
        "stream_green_garbage": CUDA_ERROR_INVALID_HANDLE,
        "id_null": CUDA_ERROR_INVALID_VALUE,
        "id_dead": CUDA_ERROR_INVALID_CONTEXT,
        "destroy_ok": 0,
        "destroy_twice": CUDA_ERROR_INVALID_CONTEXT,
    }
    assert rc == want
