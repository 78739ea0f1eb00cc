"""simgpu's libcuda.so.1 (shim/simgpu/driver): the CUDA driver API over the
device of simgpu's libcudart.so.13.

- tests/drv/drvcheck.c, a driver-API program (a fat binary from `nvcc
  -fatbin`, cuLaunchKernel and cuLaunchKernelEx, copies, memsets, streams,
  events), runs natively with its results checked, and under `colocate run`
  where the controller's counts must equal the program's own;
- tests/progs/drvapi.c talks to the driver the way cudart and CuPy do
  (dlopen, cuGetProcAddress, dlsym), which the driver-level hooks are
  tested with;
- the library itself, through ctypes in a child process (libcuda.so.1 finds
  simgpu's libcudart.so.13 through LD_LIBRARY_PATH, set at process start):
  cuGetProcAddress, bad input, runtime and driver sharing one device, and
  cudaGetDriverEntryPoint handing out the driver's functions.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from conftest import Controller, wait_until

from shim import paths

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "bench" / "bin"
DRIVER = paths.SIMGPU_DIR / "libcuda.so.1"
DRVCHECK = BIN / "drvcheck"
DRVAPI = BIN / "test-drvapi"
COLOCATE = [sys.executable, "-m", "controlplane.cli"]
TARGETS = ["bench/bin/drvcheck", "bench/bin/drvcheck.fatbin", "bench/bin/drvcheck.twins.so",
           "bench/bin/test-drvapi", "bench/bin/test-drvapi.fatbin", "bench/bin/test-drvapi.twins.so"]

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_INITIALIZED = 3
CUDA_ERROR_INVALID_IMAGE = 200
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_NOT_SUPPORTED = 801
SYMBOL_SUCCESS, SYMBOL_NOT_FOUND, VERSION_NOT_SUFFICIENT = 0, 1, 2
LEGACY, PER_THREAD = 1, 2


@pytest.fixture(scope="module")
def built() -> None:
    """The driver and the programs, built as `make build` does when stale
    (the fat binaries need nvcc)."""
    if not paths.SIMGPU_CUDART.exists() or not DRIVER.exists():
        r = subprocess.run([sys.executable, "-m", "shim.build"], cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0 or not DRIVER.exists():
            pytest.fail(f"building the shim libraries failed:\n{r.stderr[-4000:]}")
    if not shutil.which(os.environ.get("NVCC", "nvcc")) and not all((ROOT / t).exists() for t in TARGETS):
        pytest.skip("nvcc not installed: no fat binaries for the driver programs")
    r = subprocess.run(["make", "-s", *TARGETS], cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"make {' '.join(TARGETS)} failed:\n{r.stdout[-2000:]}{r.stderr[-4000:]}")


def sim_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "SIMGPU_TWINS") and not k.startswith("COLOCATE_")}
    env["LD_LIBRARY_PATH"] = str(paths.SIMGPU_DIR)
    env["SIMGPU_DIR"] = tempfile.mkdtemp(prefix="sgdrv-", dir="/tmp")
    env.update(extra)
    return env


def drvcheck_json(stdout: str) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    assert lines, stdout
    out = json.loads(lines[-1])
    assert out["drvcheck"] == "PASS", stdout
    return out


# --- the driver-API program, natively ------------------------------------------

def test_drvcheck_runs_on_simgpu(built):
    r = subprocess.run([DRVCHECK, "3", "5", "2"], env=sim_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    out = drvcheck_json(r.stdout)
    assert out["launches"] == {"saxpy": 3, "_Z5scalePffi": 5, "_Z7add_i32Piii": 2}
    n = 1000 * 4
    assert out["h2d_bytes"] == 2 * n + 4          # x, y, and `magic` by cuMemcpyHtoD_v2
    assert out["d2h_bytes"] == 4 * n + 8          # y, p, z twice, and `magic` twice
    assert out["d2d_bytes"] == n
    assert out["elapsed_ms"] >= 0
    assert "simgpu" in out["device"]


def test_drvcheck_kernels_run_as_twins_and_are_reported(built, tmp_path):
    """The driver's launches are the runtime's kernel records: simgpu's
    exit report lists them with their twins."""
    report = tmp_path / "report.jsonl"
    r = subprocess.run([DRVCHECK, "2", "1", "1"], env=sim_env(SIMGPU_REPORT=str(report)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [json.loads(ln) for ln in report.read_text().splitlines()]
    got = {row["name"]: (row["launches"], row["twin"]) for row in rows}
    assert got == {"saxpy": (2, True), "_Z5scalePffi": (1, True), "_Z7add_i32Piii": (1, True)}


# --- under the shim, with a controller ------------------------------------------

def colocate(*args: str, rundir: Path, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([*COLOCATE, *args[:1], "--runtime-dir", str(rundir), *args[1:]],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    if check and res.returncode != 0:
        raise AssertionError(f"colocate {' '.join(args)} -> {res.returncode}\n{res.stdout}\n{res.stderr}")
    return res


@pytest.fixture()
def controller(rundir):
    """`colocate serve` on the test's runtime dir (conftest's rundir), stopped after."""
    ctl = Controller(rundir)
    yield ctl
    ctl.stop()


def app_record(rundir: Path, name: str) -> dict:
    apps = json.loads(colocate("quotas", "--json", "--all", rundir=rundir).stdout)
    recs = [a for a in apps if a["name"] == name]
    assert len(recs) == 1, apps
    return recs[0]


def test_controller_counts_equal_the_programs_own(built, controller, rundir):
    """Launches per kernel (cuLaunchKernel, cuLaunchKernelEx, a packed
    argument buffer, the per-thread-stream pointer) and the copies' bytes
    (through cuGetProcAddress, as a static cudart copies) reach the
    controller exactly once each."""
    res = colocate("run", "--device", "sim", "--name", "drv", "--", str(DRVCHECK), "5", "3", "4",
                   rundir=rundir, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    own = drvcheck_json(res.stdout)
    rec = wait_until(lambda: (r := app_record(rundir, "drv"))["state"] == "exited" and r,
                     what="final record")
    assert {k["name"]: k["launches"] for k in rec["kernels"]} == own["launches"]
    assert rec["launches"] == sum(own["launches"].values()) == 12
    assert rec["h2d_bytes"] == own["h2d_bytes"]
    assert rec["d2h_bytes"] == own["d2h_bytes"]
    assert rec["forwarded"] == 0
    assert all(k["twin"] is True for k in rec["kernels"])


def test_drvcheck_on_vmm_memory_under_the_shim(built, tmp_path):
    """COLOCATE_MEM=vmm: the shim's cuMemAlloc hook hands out VMM memory
    made with the driver's own cuMemCreate/cuMemMap (libcudart's emulation,
    reached through cudaGetDriverEntryPointByVersion and this driver);
    copies, memsets and kernels treat it as device memory."""
    env = sim_env(LD_PRELOAD=str(paths.LIBCOLOCATE), COLOCATE_RUNTIME_DIR=str(tmp_path),
                  COLOCATE_MEM="vmm")
    r = subprocess.run([DRVCHECK, "2", "2", "2"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert drvcheck_json(r.stdout)["launches"]["saxpy"] == 2
    assert "device memory shared" in r.stderr, r.stderr


# --- tests/progs/drvapi.c: the driver as cudart and CuPy use it ------------------

def run_drvapi(*counts: int, preload: bool = False, **env: str) -> subprocess.CompletedProcess:
    e = sim_env(**env)
    if preload:
        e["LD_PRELOAD"] = str(paths.LIBCOLOCATE)
        e["COLOCATE_RUNTIME_DIR"] = e["SIMGPU_DIR"]
    return subprocess.run([str(DRVAPI), *map(str, counts)], env=e, capture_output=True, text=True,
                          timeout=60)


def test_drvapi_passes_on_the_simgpu_driver(built):
    r = run_drvapi()
    assert r.returncode == 0, r.stdout + r.stderr
    # 5 + 3 + 4 add_one launches plus the cuLaunchKernelEx one, all executed:
    # the program checks x[i] == i + launches
    assert re.fullmatch(r"DRVAPI launches=13 allocs=1 PASS", r.stdout.strip().splitlines()[-1]), r.stdout


def test_drvapi_launch_counts_from_argv(built, tmp_path):
    report = tmp_path / "report.jsonl"
    r = run_drvapi(2, 0, 7, SIMGPU_REPORT=str(report))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "DRVAPI launches=10 allocs=1 PASS" in r.stdout
    # two kernel records named add_one: the module's and the library's
    rows = [json.loads(ln) for ln in report.read_text().splitlines()]
    assert sorted(row["launches"] for row in rows if row["name"] == "add_one") == [1, 9]


def test_drvapi_under_the_shim_without_a_controller(built):
    """The hooks substitute themselves for cuGetProcAddress's answers and
    dlsym's, and the program still passes (the app runs natively)."""
    r = run_drvapi(1, 1, 1, preload=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "DRVAPI launches=4 allocs=1 PASS" in r.stdout


# --- the library through ctypes, in a child process ------------------------------

PRELUDE = """
import ctypes, json, os, sys
c_void_pp = ctypes.POINTER(ctypes.c_void_p)
cuda = ctypes.CDLL(os.environ["DRIVER"], mode=os.RTLD_LOCAL | os.RTLD_NOW)
gpa = cuda.cuGetProcAddress_v2
gpa.argtypes = [ctypes.c_char_p, c_void_pp, ctypes.c_int, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
def addr(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
def proc(name, version=13000, flags=0):
    fn, st = ctypes.c_void_p(), ctypes.c_int(-1)
    rc = gpa(name.encode(), ctypes.byref(fn), version, flags, ctypes.byref(st))
    return rc, fn.value, st.value
def context():
    assert cuda.cuInit(0) == 0
    ctx = ctypes.c_void_p()
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
out = {}
"""


def run_py(body: str, **env: str) -> dict:
    code = PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(out))\n"
    r = subprocess.run([sys.executable, "-c", code], env=sim_env(DRIVER=str(DRIVER), **env),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_proc_address_honours_flags_and_versions(built):
    out = run_py("""
        for name in ("cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch"):
            assert proc(name, flags=0) == (0, addr(cuda, name), 0), name
            assert proc(name, flags=2)[1] == addr(cuda, name + "_ptsz"), name
            assert proc(name, flags=1)[1] == addr(cuda, name), name
        assert proc("cuMemcpyHtoD", flags=2)[1] == addr(cuda, "cuMemcpyHtoD_v2_ptds")
        assert proc("cuMemcpyHtoDAsync", flags=2)[1] == addr(cuda, "cuMemcpyHtoDAsync_v2_ptsz")
        assert proc("cuMemAlloc", 3020)[1] == addr(cuda, "cuMemAlloc_v2")
        assert proc("cuCtxCreate", 12000)[1] == addr(cuda, "cuCtxCreate_v2")
        assert proc("cuCtxCreate", 13000)[1] == addr(cuda, "cuCtxCreate_v4")
        assert proc("cuGetProcAddress", 12000)[1] == addr(cuda, "cuGetProcAddress_v2")
        assert proc("cuGetProcAddress", 11030)[1] == addr(cuda, "cuGetProcAddress")
        assert proc("cuEventElapsedTime", 13000)[1] == addr(cuda, "cuEventElapsedTime_v2")
        out["too_old"] = proc("cuMemAlloc", 3000)
        out["unknown"] = proc("cuNoSuchFunction")
        out["bad_flags"] = proc("cuInit", flags=8)[0]
    """)
    assert out["too_old"] == [CUDA_ERROR_NOT_FOUND, None, VERSION_NOT_SUFFICIENT]
    assert out["unknown"] == [CUDA_ERROR_NOT_FOUND, None, SYMBOL_NOT_FOUND]
    assert out["bad_flags"] == CUDA_ERROR_INVALID_VALUE


def test_export_table_and_error_names(built):
    out = run_py("""
        table = ctypes.c_void_p(1)
        uuid = (ctypes.c_char * 16)()
        f = cuda.cuGetExportTable
        f.argtypes = [c_void_pp, ctypes.c_void_p]
        out["export"] = [f(ctypes.byref(table), uuid), table.value]
        out["export_null"] = f(ctypes.byref(table), None)
        s = ctypes.c_char_p()
        for fn in ("cuGetErrorName", "cuGetErrorString"):
            getattr(cuda, fn).argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        out["name"] = [cuda.cuGetErrorName(500, ctypes.byref(s)), s.value.decode()]
        out["text"] = [cuda.cuGetErrorString(1, ctypes.byref(s)), s.value.decode()]
        out["unknown"] = cuda.cuGetErrorName(123456, ctypes.byref(s))
    """)
    assert out["export"] == [CUDA_ERROR_NOT_SUPPORTED, None]
    assert out["export_null"] == CUDA_ERROR_INVALID_VALUE
    assert out["name"] == [0, "CUDA_ERROR_NOT_FOUND"]
    assert out["text"] == [0, "invalid argument"]
    assert out["unknown"] == CUDA_ERROR_INVALID_VALUE


def test_bad_input_is_an_error_never_a_crash(built):
    out = run_py("""
        ctx = ctypes.c_void_p()
        out["before_init"] = cuda.cuCtxGetCurrent(ctypes.byref(ctx))
        assert cuda.cuInit(0) == 0
        dp = ctypes.c_uint64()
        out["no_context"] = cuda.cuMemAlloc_v2(ctypes.byref(dp), 64)
        context()
        cuda.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        bogus = ctypes.create_string_buffer(64)
        out["bogus_function"] = cuda.cuLaunchKernel(ctypes.addressof(bogus), 1, 1, 1, 1, 1, 1, 0,
                                                    None, None, None)
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        out["not_an_image"] = cuda.cuModuleLoadData(ctypes.byref(mod), b"not a module" + bytes(64))
        out["ptx"] = cuda.cuModuleLoadData(ctypes.byref(mod), b"//\\n.version 8.0\\n.target sm_90\\n")
        out["bogus_module"] = cuda.cuModuleGetFunction(ctypes.byref(fn), ctypes.addressof(bogus), b"x")
        out["no_file"] = cuda.cuModuleLoad(ctypes.byref(mod), b"/no/such/file.fatbin")
        cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        out["free_bogus"] = cuda.cuMemFree_v2(0x1000)
        cuda.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
        out["copy_bogus"] = cuda.cuMemcpyHtoD_v2(0x1000, bogus, 16)
        out["alloc_zero"] = cuda.cuMemAlloc_v2(ctypes.byref(dp), 0)
        assert cuda.cuMemAlloc_v2(ctypes.byref(dp), 64) == 0
        cuda.cuMemsetD32_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t]
        out["memset_misaligned"] = cuda.cuMemsetD32_v2(dp.value + 1, 7, 4)
        out["memset_past_end"] = cuda.cuMemsetD32_v2(dp.value, 7, 1 << 20)
        cuda.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        out["bogus_stream"] = cuda.cuStreamSynchronize(ctypes.addressof(bogus))
        cuda.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        out["bogus_event"] = cuda.cuEventRecord(ctypes.addressof(bogus), None)
        cuda.cuCtxDestroy_v2.argtypes = [ctypes.c_void_p]
        out["bogus_ctx"] = cuda.cuCtxDestroy_v2(ctypes.addressof(bogus))
    """)
    assert out["before_init"] == CUDA_ERROR_NOT_INITIALIZED
    assert out["no_context"] == CUDA_ERROR_INVALID_CONTEXT
    assert out["bogus_function"] == CUDA_ERROR_INVALID_HANDLE
    assert out["not_an_image"] == CUDA_ERROR_INVALID_IMAGE
    assert out["ptx"] == CUDA_ERROR_JIT_COMPILER_NOT_FOUND
    assert out["bogus_module"] == CUDA_ERROR_INVALID_HANDLE
    assert out["no_file"] == 301                      # CUDA_ERROR_FILE_NOT_FOUND
    assert out["free_bogus"] == CUDA_ERROR_INVALID_VALUE
    assert out["copy_bogus"] == CUDA_ERROR_INVALID_VALUE
    assert out["alloc_zero"] == CUDA_ERROR_INVALID_VALUE
    assert out["memset_misaligned"] == CUDA_ERROR_INVALID_VALUE
    assert out["memset_past_end"] == CUDA_ERROR_INVALID_VALUE
    assert out["bogus_stream"] == CUDA_ERROR_INVALID_HANDLE
    assert out["bogus_event"] == CUDA_ERROR_INVALID_HANDLE
    assert out["bogus_ctx"] == CUDA_ERROR_INVALID_CONTEXT


def test_a_kernel_on_a_bad_pointer_is_a_sticky_illegal_address(built):
    """As on a GPU: the launch succeeds, the next synchronisation reports
    CUDA_ERROR_ILLEGAL_ADDRESS (the twin's fault is contained)."""
    fatbin = BIN / "test-drvapi.fatbin"
    out = run_py(f"""
        context()
        image = open({str(fatbin)!r}, "rb").read()
        mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
        assert cuda.cuModuleLoadData(ctypes.byref(mod), image) == 0
        assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"add_one") == 0
        dp, n = ctypes.c_uint64(0x1000), ctypes.c_int(16)
        params = (ctypes.c_void_p * 2)(ctypes.addressof(dp), ctypes.addressof(n))
        cuda.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        out["launch"] = cuda.cuLaunchKernel(fn, 1, 1, 1, 16, 1, 1, 0, None, params, None)
        out["sync"] = cuda.cuCtxSynchronize()
        out["again"] = cuda.cuCtxSynchronize()
    """, SIMGPU_TWINS=str(BIN / "test-drvapi.twins.so"))
    assert out == {"launch": 0, "sync": CUDA_ERROR_ILLEGAL_ADDRESS, "again": CUDA_ERROR_ILLEGAL_ADDRESS}


def test_cubins_and_module_globals(built, tmp_path):
    """A bare cubin loads too (wrapped in a fat binary); __device__
    variables come with their size and initial value."""
    nvcc = shutil.which(os.environ.get("NVCC", "nvcc"))
    if not nvcc:
        pytest.skip("nvcc not installed")
    cubin = tmp_path / "k.cubin"
    subprocess.run([nvcc, "-cubin", "-arch=sm_90", "-o", str(cubin), str(ROOT / "tests" / "drv" / "kernels.cu")],
                   check=True, capture_output=True)
    out = run_py(f"""
        context()
        mod, fn, dp, size = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_size_t()
        assert cuda.cuModuleLoad(ctypes.byref(mod), {str(cubin)!r}.encode()) == 0
        assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"_Z5scalePffi") == 0
        cuda.cuModuleGetGlobal_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                                              ctypes.c_void_p, ctypes.c_char_p]
        assert cuda.cuModuleGetGlobal_v2(ctypes.byref(dp), ctypes.byref(size), mod, b"magic") == 0
        v = ctypes.c_int()
        cuda.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        assert cuda.cuMemcpyDtoH_v2(ctypes.byref(v), dp.value, 4) == 0
        out["magic"] = [size.value, v.value]
        assert cuda.cuModuleGetGlobal_v2(ctypes.byref(dp), ctypes.byref(size), mod, b"table") == 0
        out["table"] = size.value
        out["missing"] = cuda.cuModuleGetGlobal_v2(ctypes.byref(dp), ctypes.byref(size), mod, b"nope")
        n = ctypes.c_uint()
        cuda.cuModuleGetFunctionCount.argtypes = [ctypes.POINTER(ctypes.c_uint), ctypes.c_void_p]
        assert cuda.cuModuleGetFunctionCount(ctypes.byref(n), mod) == 0
        out["functions"] = n.value
        assert cuda.cuModuleUnload(mod) == 0
        out["stale_function"] = cuda.cuFuncGetName(ctypes.byref(ctypes.c_char_p()), fn)
    """)
    assert out == {"magic": [4, 4242], "table": 64, "missing": CUDA_ERROR_NOT_FOUND, "functions": 3,
                   "stale_function": CUDA_ERROR_INVALID_HANDLE}


def test_runtime_and_driver_share_one_device(built):
    """cudaMalloc memory is the driver's device memory and back; streams and
    events cross over; a failing driver call leaves cudaGetLastError alone."""
    out = run_py("""
        rt = ctypes.CDLL("libcudart.so.13")
        context()
        p = ctypes.c_void_p()
        assert rt.cudaMalloc(ctypes.byref(p), 256) == 0
        src = (ctypes.c_ubyte * 256)(*range(256))
        cuda.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
        assert cuda.cuMemcpyHtoD_v2(p.value, src, 256) == 0
        dst = (ctypes.c_ubyte * 256)()
        rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        assert rt.cudaMemcpy(dst, p, 256, 2) == 0
        out["roundtrip"] = list(dst) == list(range(256))
        # a driver allocation, set by the runtime, read by the driver
        dp = ctypes.c_uint64()
        assert cuda.cuMemAlloc_v2(ctypes.byref(dp), 64) == 0
        rt.cudaMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        assert rt.cudaMemset(ctypes.c_void_p(dp.value), 0x5a, 64) == 0
        got = (ctypes.c_ubyte * 64)()
        cuda.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
        assert cuda.cuMemcpyDtoH_v2(got, dp.value, 64) == 0
        out["memset"] = set(got) == {0x5a}
        # D32 with a pattern that is not one byte repeated
        cuda.cuMemsetD32_v2.argtypes = [ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t]
        assert cuda.cuMemsetD32_v2(dp.value, 0x01020304, 16) == 0
        words = (ctypes.c_uint32 * 16)()
        assert cuda.cuMemcpyDtoH_v2(words, dp.value, 64) == 0
        out["d32"] = set(words) == {0x01020304}
        # a runtime stream is a driver stream; a driver event a runtime event
        s, ev = ctypes.c_void_p(), ctypes.c_void_p()
        assert rt.cudaStreamCreate(ctypes.byref(s)) == 0
        assert cuda.cuEventCreate(ctypes.byref(ev), 0) == 0
        cuda.cuEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        assert cuda.cuEventRecord(ev, s) == 0
        rt.cudaEventSynchronize.argtypes = [ctypes.c_void_p]
        out["event"] = rt.cudaEventSynchronize(ev)
        cuda.cuStreamQuery.argtypes = [ctypes.c_void_p]
        out["query"] = cuda.cuStreamQuery(s)
        cst = ctypes.c_int(-1)
        cuda.cuStreamIsCapturing.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        out["capturing"] = [cuda.cuStreamIsCapturing(s, ctypes.byref(cst)), cst.value]
        ap = ctypes.c_uint64()
        cuda.cuMemAllocAsync.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t, ctypes.c_void_p]
        assert cuda.cuMemAllocAsync(ctypes.byref(ap), 128, s) == 0
        cuda.cuMemFreeAsync.argtypes = [ctypes.c_uint64, ctypes.c_void_p]
        out["free_async"] = cuda.cuMemFreeAsync(ap.value, s)
        # the runtime's last error is the runtime's
        assert rt.cudaGetLastError() == 0
        bogus = ctypes.create_string_buffer(64)
        cuda.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        assert cuda.cuStreamSynchronize(ctypes.addressof(bogus)) == 400
        out["last_error"] = rt.cudaGetLastError()
        free_b, total_b = ctypes.c_size_t(), ctypes.c_size_t()
        assert cuda.cuMemGetInfo_v2(ctypes.byref(free_b), ctypes.byref(total_b)) == 0
        rfree, rtotal = ctypes.c_size_t(), ctypes.c_size_t()
        assert rt.cudaMemGetInfo(ctypes.byref(rfree), ctypes.byref(rtotal)) == 0
        out["total"] = total_b.value == rtotal.value > 0
    """)
    assert out == {"roundtrip": True, "memset": True, "d32": True, "event": 0, "query": 0,
                   "capturing": [0, 0], "free_async": 0, "last_error": 0, "total": True}


def test_runtime_entry_points_are_the_drivers_once_it_is_loaded(built):
    """cudaGetDriverEntryPoint[ByVersion] hands out simgpu's libcuda
    functions while it is loaded; without it, the emulated VMM calls only."""
    body = """
        get = rt.cudaGetDriverEntryPointByVersion
        get.argtypes = [ctypes.c_char_p, c_void_pp, ctypes.c_uint, ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_int)]
        def entry(name, version=13000, flags=0):
            fn, st = ctypes.c_void_p(), ctypes.c_int(-1)
            rc = get(name.encode(), ctypes.byref(fn), version, flags, ctypes.byref(st))
            return rc, fn.value, st.value
    """
    without = textwrap.dedent("""
        import ctypes, json
        c_void_pp = ctypes.POINTER(ctypes.c_void_p)
        rt = ctypes.CDLL("libcudart.so.13")
    """) + textwrap.dedent(body) + textwrap.dedent("""
        out = {"create": entry("cuMemCreate")[0], "alloc": entry("cuMemAlloc")[:1] + entry("cuMemAlloc")[2:]}
        print(json.dumps(out))
    """)
    r = subprocess.run([sys.executable, "-c", without], env=sim_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(r.stdout) == {"create": 0, "alloc": [500, 1]}   # cudaErrorSymbolNotFound

    out = run_py('rt = ctypes.CDLL("libcudart.so.13")\n' + textwrap.dedent(body) + textwrap.dedent("""
        out["alloc"] = entry("cuMemAlloc")[1] == addr(cuda, "cuMemAlloc_v2")
        out["launch_ptsz"] = entry("cuLaunchKernel", flags=2)[1] == addr(cuda, "cuLaunchKernel_ptsz")
        out["vmm"] = entry("cuMemCreate")[1] == addr(cuda, "cuMemCreate")
        out["old"] = entry("cuMemAlloc", 3000)[::2]
        out["unknown"] = entry("cuNoSuchFunction")[::2]
        get0 = rt.cudaGetDriverEntryPoint
        get0.argtypes = [ctypes.c_char_p, c_void_pp, ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_int)]
        fn, st = ctypes.c_void_p(), ctypes.c_int(-1)
        out["unversioned"] = get0(b"cuCtxCreate", ctypes.byref(fn), 0, ctypes.byref(st)) == 0 \
            and fn.value == addr(cuda, "cuCtxCreate_v4")
    """))
    assert out == {"alloc": True, "launch_ptsz": True, "vmm": True, "old": [500, 2], "unknown": [500, 1],
                   "unversioned": True}


# A library with its own (static) cudart launching through the driver into
# an app's runtime stream capture, as cuBLAS does under CUDA graphs: the
# captured launch runs nothing then, and each graph launch runs it once.
CAPDRV_C = r"""
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#define CK(x) do { int e_ = (int)(x); if (e_) { printf("FAIL %s -> %d\n", #x, e_); exit(1); } } while (0)
int main(int argc, char **argv)
{
	FILE *f = fopen(argv[1], "rb");
	long n;
	char *img;
	CUdevice dev;
	CUcontext ctx;
	CUmodule m;
	CUfunction fa;
	cudaStream_t s;
	cudaGraph_t g;
	cudaGraphExec_t x;
	int *d, k = 1, nn = 4, h = 0, i;
	void *params[] = { &d, &k, &nn };

	if (!f)
		return 2;
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	img = malloc(n);
	if (!img || fread(img, 1, n, f) != (size_t)n)
		return 2;
	fclose(f);
	CK(cuInit(0));
	CK(cuDeviceGet(&dev, 0));
	CK(cuDevicePrimaryCtxRetain(&ctx, dev));
	CK(cuCtxSetCurrent(ctx));
	CK(cuModuleLoadData(&m, img));
	CK(cuModuleGetFunction(&fa, m, "_Z7add_i32Piii"));
	CK(cudaMalloc((void **)&d, 1024));
	CK(cudaMemset(d, 0, 1024));
	CK(cudaDeviceSynchronize());   /* s does not wait for the legacy stream */
	CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
	CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
	CK(cuLaunchKernel(fa, 1, 1, 1, 32, 1, 1, 0, (CUstream)s, params, NULL));
	CK(cudaStreamEndCapture(s, &g));
	CK(cudaGraphInstantiate(&x, g, 0));
	for (i = 0; i < 5; i++)
		CK(cudaGraphLaunch(x, s));
	CK(cudaStreamSynchronize(s));
	CK(cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost));
	printf("PASS d0=%d\n", h);
	return h != 5;
}
"""


def test_a_driver_launch_into_a_runtime_capture_counts_once_per_graph_launch(built, controller, rundir,
                                                                              tmp_path):
    src, exe = tmp_path / "capdrv.c", tmp_path / "capdrv"
    src.write_text(CAPDRV_C)
    inc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    subprocess.run(["cc", "-O1", "-I", str(inc), "-o", str(exe), str(src), f"-L{paths.SIMGPU_DIR}",
                    "-l:libcuda.so.1", "-l:libcudart.so.13"], check=True, capture_output=True, text=True)
    env = dict(os.environ, SIMGPU_TWINS=str(BIN / "drvcheck.twins.so"), SIMGPU_TIMESCALE="0")
    res = subprocess.run([*COLOCATE, "run", "--runtime-dir", str(rundir), "--device", "sim", "--name",
                          "capdrv", "--", str(exe), str(BIN / "drvcheck.fatbin")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert res.returncode == 0 and "PASS d0=5" in res.stdout, res.stdout + res.stderr
    rec = wait_until(lambda: (r := app_record(rundir, "capdrv"))["state"] == "exited" and r,
                     what="final record")
    assert [(k["name"], k["launches"]) for k in rec["kernels"]] == [("_Z7add_i32Piii", 5)], rec
    assert rec["launches"] == 5
