"""The fake libcuda.so.1 (shim/fakecuda) and tests/progs/drvapi.c, the program
that talks to the driver the way cudart and CuPy do.  These run without the
shim: they pin down the behaviour the driver-level hooks are tested against.
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAKE_DIR = ROOT / "shim" / "lib" / "fakecuda"
FAKE = FAKE_DIR / "libcuda.so.1"
DRVAPI_SRC = ROOT / "tests" / "progs" / "drvapi.c"
DRVAPI = ROOT / "bench" / "bin" / "test-drvapi"

CUDA_SUCCESS = 0
CUDA_ERROR_NOT_FOUND = 500
SYMBOL_SUCCESS, SYMBOL_NOT_FOUND, VERSION_NOT_SUFFICIENT = 0, 1, 2
LEGACY, PER_THREAD = 1, 2


def _cuda_include() -> Path | None:
    for cand in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if cand and (Path(cand) / "include" / "cuda.h").exists():
            return Path(cand) / "include"
    nvcc = shutil.which("nvcc")
    if nvcc and (Path(nvcc).resolve().parent.parent / "include" / "cuda.h").exists():
        return Path(nvcc).resolve().parent.parent / "include"
    return None


INCLUDE = _cuda_include()
pytestmark = pytest.mark.skipif(INCLUDE is None, reason="CUDA headers (cuda.h) not installed")


def _stale(out: Path, srcs: list[Path]) -> bool:
    return not out.exists() or any(s.stat().st_mtime > out.stat().st_mtime for s in srcs)


@pytest.fixture(scope="module")
def fake() -> Path:
    """The fake driver, built if missing or older than its sources."""
    if _stale(FAKE, list((ROOT / "shim" / "fakecuda").glob("*.[ch]"))):
        r = subprocess.run([sys.executable, "-m", "shim.build"], cwd=ROOT, capture_output=True, text=True)
        if r.returncode != 0 or not FAKE.exists():
            pytest.fail(f"building the shim libraries failed:\n{r.stderr[-4000:]}")
    return FAKE


@pytest.fixture(scope="module")
def drvapi(fake) -> Path:
    """bench/bin/test-drvapi, compiled as the Makefile does if missing or stale."""
    if _stale(DRVAPI, [DRVAPI_SRC]):
        DRVAPI.parent.mkdir(parents=True, exist_ok=True)
        cc = os.environ.get("CC", "cc")
        r = subprocess.run([cc, "-O2", "-Wall", f"-I{INCLUDE}", "-o", str(DRVAPI), str(DRVAPI_SRC),
                            "-ldl", "-lpthread"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    return DRVAPI


def run_drvapi(prog: Path, *counts: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD",) and not k.startswith("COLOCATE_")}
    env["LD_LIBRARY_PATH"] = str(FAKE_DIR)
    return subprocess.run([str(prog), *map(str, counts)], env=env, capture_output=True, text=True, timeout=30)


def test_drvapi_passes_on_the_fake_driver(drvapi):
    r = run_drvapi(drvapi)
    assert r.returncode == 0, r.stdout + r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"DRVAPI launches=13 allocs=1 PASS", last), r.stdout
    # 5 + 3 + 4 add_one launches plus the cuLaunchKernelEx one, all executed
    assert "DRIVER launch_count=13" in r.stdout


def test_drvapi_launch_counts_from_argv(drvapi):
    r = run_drvapi(drvapi, 2, 0, 7)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "DRVAPI launches=10 allocs=1 PASS" in r.stdout
    assert "DRIVER launch_count=10" in r.stdout


class Driver:
    """The fake driver loaded into this process through ctypes."""

    def __init__(self, path: Path):
        self.lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL | os.RTLD_NOW)
        self.gpa = self.lib.cuGetProcAddress_v2
        self.gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                             ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
        self.gpa.restype = ctypes.c_int

    def addr(self, name: str) -> int:
        return ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value

    def proc(self, name: str, version: int = 13000, flags: int = 0) -> tuple[int, int | None, int]:
        fn, st = ctypes.c_void_p(), ctypes.c_int(-1)
        rc = self.gpa(name.encode(), ctypes.byref(fn), version, flags, ctypes.byref(st))
        return rc, fn.value, st.value


@pytest.fixture(scope="module")
def driver(fake) -> Driver:
    return Driver(fake)


def test_proc_address_honours_per_thread_flag(driver):
    for name in ("cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel", "cuGraphLaunch"):
        assert driver.proc(name, flags=0) == (CUDA_SUCCESS, driver.addr(name), SYMBOL_SUCCESS)
        assert driver.proc(name, flags=LEGACY)[1] == driver.addr(name)
        assert driver.proc(name, flags=PER_THREAD)[1] == driver.addr(name + "_ptsz")
    assert driver.proc("cuMemcpyHtoD", flags=PER_THREAD)[1] == driver.addr("cuMemcpyHtoD_v2_ptds")


def test_proc_address_is_version_aware(driver):
    assert driver.proc("cuMemAlloc", 3020)[1] == driver.addr("cuMemAlloc_v2")
    assert driver.proc("cuMemAlloc", 12000)[1] == driver.addr("cuMemAlloc_v2")
    rc, fn, st = driver.proc("cuMemAlloc", 3000)
    assert (rc, fn, st) == (CUDA_ERROR_NOT_FOUND, None, VERSION_NOT_SUFFICIENT)
    assert driver.proc("cuGetProcAddress", 12000)[1] == driver.addr("cuGetProcAddress_v2")
    assert driver.proc("cuGetProcAddress", 11030)[1] == driver.addr("cuGetProcAddress")
    assert driver.proc("cuNoSuchFunction") == (CUDA_ERROR_NOT_FOUND, None, SYMBOL_NOT_FOUND)


def test_export_table_passes_through(driver):
    table = ctypes.c_void_p()
    uuid = (ctypes.c_char * 16)()
    f = driver.lib.cuGetExportTable
    f.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    assert f(ctypes.byref(table), uuid) == CUDA_SUCCESS and table.value
    assert f(ctypes.byref(table), None) != CUDA_SUCCESS
    name = ctypes.c_char_p()
    driver.lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    assert driver.lib.cuGetErrorName(CUDA_ERROR_NOT_FOUND, ctypes.byref(name)) == CUDA_SUCCESS
    assert name.value == b"CUDA_ERROR_NOT_FOUND"


def test_bad_handles_and_pointers_are_errors(driver):
    lib = driver.lib
    assert lib.cuInit(0) == CUDA_SUCCESS
    lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
    bogus = ctypes.create_string_buffer(64)
    assert lib.cuLaunchKernel(ctypes.addressof(bogus), 1, 1, 1, 1, 1, 1, 0, None, None, None) != CUDA_SUCCESS
    mod, fn = ctypes.c_void_p(), ctypes.c_void_p()
    assert lib.cuModuleLoadData(ctypes.byref(mod), b"not a module") != CUDA_SUCCESS
    assert lib.cuModuleLoadData(ctypes.byref(mod), b"FAKEMOD add_one") == CUDA_SUCCESS
    assert lib.cuModuleGetFunction(ctypes.byref(fn), mod, b"scale2") == CUDA_ERROR_NOT_FOUND
    assert lib.cuModuleGetFunction(ctypes.byref(fn), mod, b"add_one") == CUDA_SUCCESS
    # add_one on memory the driver never allocated: an error, not a crash
    dp, n = ctypes.c_uint64(0x1000), ctypes.c_int(16)
    params = (ctypes.c_void_p * 2)(ctypes.addressof(dp), ctypes.addressof(n))
    lib.fakecuda_launch_count.restype = ctypes.c_ulonglong
    before = lib.fakecuda_launch_count()
    assert lib.cuLaunchKernel(fn, 1, 1, 1, 16, 1, 1, 0, None, params, None) == 700
    assert lib.fakecuda_launch_count() == before
    lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    assert lib.cuMemFree_v2(0x1000) != CUDA_SUCCESS
