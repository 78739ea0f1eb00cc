"""The trace must not change what a traced app sees (shim_trace.c): its
last CUDA error, graphs it captures, a device reset.  A small interposer
sits between the shim and simgpu (the shim finds the real runtime with
RTLD_NEXT, so it finds this first) and behaves as real cudart can: event
calls that fail and set the thread's last error, streams that are being
captured, events that die with cudaDeviceReset."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, clean_env

from shim import paths

BIN = ROOT / "bench" / "bin"
CUDA_INC = Path("/usr/local/cuda/include")

pytestmark = pytest.mark.skipif(
    not (BIN / "vecadd").exists() or not paths.SIMGPU_CUDART.exists() or not paths.LIBCOLOCATE.exists(),
    reason="bench programs or simgpu not built (make build)")

# Modes (MISBEHAVE): "fail" - every 3rd record, 2nd query, 4th elapsed and
# 5th create of an event fails after setting the last error, as real cudart
# does for cudaErrorNotReady or a dead handle; "capture" - every stream is
# being captured.  cudaDeviceReset kills every event made so far: a later
# use of one is counted as stale (and fails, as it would on a GPU).
INTERPOSER_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define MAXEV 65536
static void *made[MAXEV];
static int nmade, ndead, stale, records, mode;
static void *next(const char *n) { return dlsym(RTLD_NEXT, n); }
static void dirty(void)   /* sets the calling thread's last error */
{
	((int (*)(void *))next("cudaEventQuery"))(NULL);
}
static int dead(void *e)
{
	for (int i = 0; i < ndead; i++)
		if (made[i] == e)
			return 1;
	return 0;
}
static int bad(void *e) { if (e && dead(e)) { stale++; dirty(); return 1; } return 0; }
static void report(void)
{
	FILE *f = fopen(getenv("INTERPOSER_OUT"), "w");
	if (f) { fprintf(f, "{\"stale\":%d,\"records\":%d,\"made\":%d}\n", stale, records, nmade); fclose(f); }
}
__attribute__((constructor)) static void init(void)
{
	const char *m = getenv("MISBEHAVE");
	mode = !m ? 0 : !strcmp(m, "fail") ? 1 : !strcmp(m, "capture") ? 2 : !strcmp(m, "exit") ? 3 : 0;
	atexit(report);
}
int cudaEventCreateWithFlags(void **e, unsigned f)
{
	static int n;
	if (mode == 1 && ++n % 5 == 0) { dirty(); return 2; }
	int r = ((int (*)(void **, unsigned))next("cudaEventCreateWithFlags"))(e, f);
	if (!r && nmade < MAXEV) made[nmade++] = *e;
	return r;
}
int cudaEventRecord(void *e, void *s)
{
	static int n;
	if (bad(e)) return 400;
	if (mode == 1 && ++n % 3 == 0) { dirty(); return 400; }
	records++;
	return ((int (*)(void *, void *))next("cudaEventRecord"))(e, s);
}
int cudaEventQuery(void *e)
{
	static int n;
	if (bad(e)) return 400;
	if (mode == 3)
		exit(3);        /* as a signal handler might, under the trace's lock */
	int r = ((int (*)(void *))next("cudaEventQuery"))(e);
	if (mode == 1 && r == 0 && ++n % 2 == 1) { dirty(); return 600; }
	return r;
}
int cudaEventElapsedTime(float *ms, void *a, void *b)
{
	static int n;
	if (bad(a) || bad(b)) return 400;
	if (mode == 1 && ++n % 4 == 0) { dirty(); return 400; }
	return ((int (*)(float *, void *, void *))next("cudaEventElapsedTime"))(ms, a, b);
}
int cudaEventDestroy(void *e)
{
	if (bad(e)) return 400;
	return ((int (*)(void *))next("cudaEventDestroy"))(e);
}
int cudaStreamIsCapturing(void *s, int *st)
{
	int r = ((int (*)(void *, int *))next("cudaStreamIsCapturing"))(s, st);
	if (mode == 2 && r == 0) *st = 1;   /* cudaStreamCaptureStatusActive */
	return r;
}
int cudaDeviceReset(void)
{
	ndead = nmade;
	return ((int (*)(void))next("cudaDeviceReset"))();
}
"""

# Launches a no-op kernel (simgpu_kernel_define: no twin, modelled time)
# argv[1] times, checking cudaGetLastError after each launch and after the
# sync; with "reset", resets the device and does it all again.
PROG_C = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime_api.h>
static void ck(cudaError_t e, const char *what)
{
	if (e != cudaSuccess) { printf("FAIL %s: %d\n", what, (int)e); exit(1); }
}
static void round_(int n)
{
	void *(*def)(const char *, int, const unsigned *) =
		(void *(*)(const char *, int, const unsigned *))dlsym(RTLD_DEFAULT, "simgpu_kernel_define");
	unsigned size = sizeof(int);
	int v = 1;
	void *args[] = { &v };
	void *k = def ? def("_Z4noopi", 1, &size) : NULL;
	if (!k) { printf("FAIL no simgpu_kernel_define\n"); exit(1); }
	for (int i = 0; i < n; i++) {
		ck(cudaLaunchKernel(k, (dim3){ 64, 1, 1 }, (dim3){ 128, 1, 1 }, args, 0, 0), "launch");
		ck(cudaGetLastError(), "last error after a launch");
	}
	ck(cudaDeviceSynchronize(), "sync");
	ck(cudaGetLastError(), "last error after the sync");
	ck(cudaPeekAtLastError(), "peek after the sync");
}
int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 4;
	round_(n);
	if (argc > 2 && !strcmp(argv[2], "reset")) {
		ck(cudaDeviceReset(), "reset");
		round_(n);
	}
	printf("PASS\n");
	return 0;
}
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("robust")
    (d / "ip.c").write_text(INTERPOSER_C)
    (d / "prog.c").write_text(PROG_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", d / "libip.so", d / "ip.c", "-ldl"], check=True)
    subprocess.run(["cc", "-O2", f"-I{CUDA_INC}", "-o", d / "prog", d / "prog.c",
                    f"-L{paths.SIMGPU_DIR}", "-l:libcudart.so.13", "-ldl"], check=True)
    return {"lib": d / "libip.so", "prog": d / "prog"}


def traced(tmp: Path, built: dict[str, Path], cmd: list, **extra: str) -> tuple[list[dict], dict]:
    trace, out = tmp / "t.jsonl", tmp / "ip.json"
    env = clean_env(LD_PRELOAD=f"{paths.LIBCOLOCATE}:{built['lib']}", LD_LIBRARY_PATH=str(paths.SIMGPU_DIR),
                    SIMGPU_DIR=str(tmp / "sim"), SIMGPU_TIMESCALE="0", COLOCATE_RUNTIME_DIR=str(tmp / "rd"),
                    COLOCATE_TRACE=str(trace), INTERPOSER_OUT=str(out), **extra)
    r = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout + r.stderr
    recs = [json.loads(ln) for ln in trace.read_text().splitlines()]
    return [k for k in recs if k["kind"] == "kernel"], json.loads(out.read_text())


def test_failing_trace_events_leave_the_apps_last_error_alone(tmp_path, built):
    """vecadd checks cudaGetLastError after every launch; the shim's own
    event calls fail around those launches and set the last error, as real
    cudart's cudaEventQuery does with cudaErrorNotReady."""
    ks, ip = traced(tmp_path, built, [BIN / "vecadd", "--n", "4000", "--repeat", "24"], MISBEHAVE="fail")
    assert len(ks) == 24
    timed = [k for k in ks if k["dur_us"] is not None]
    assert 0 < len(timed) < 24 and ip["records"] > 0     # the failures really happened, and not all


def test_own_program_last_error_and_peek_after_sync(tmp_path, built):
    ks, _ = traced(tmp_path, built, [built["prog"], "10"], MISBEHAVE="fail")
    assert len(ks) == 10 and all(k["grid"] == [64, 1, 1] for k in ks)


def test_capturing_streams_get_no_trace_events(tmp_path, built):
    ks, ip = traced(tmp_path, built, [BIN / "vecadd", "--n", "4000", "--repeat", "5"], MISBEHAVE="capture")
    assert len(ks) == 5 and all(k["dur_us"] is None and k["start_us"] is None for k in ks)
    assert ip["records"] == 0       # not one event recorded into a "captured" stream


def test_events_are_forgotten_at_device_reset(tmp_path, built):
    """Events die with cudaDeviceReset: the trace never touches one again
    (no record, query, timing or destroy), and tasks after the reset are
    timed with fresh events against a new time zero."""
    ks, ip = traced(tmp_path, built, [built["prog"], "5", "reset"])
    assert ip["stale"] == 0
    assert len(ks) == 10 and all(k["dur_us"] is not None and k["dur_us"] > 0 for k in ks)
    assert ks[5]["start_us"] == 0     # the second round's first task: time zero again


def test_exit_while_the_trace_lock_is_held_does_not_hang(tmp_path, built):
    """exit() on a thread inside the trace (as from a signal handler that
    interrupted it): the exit handler gives up the flush after a bounded
    wait for the lock, says so, and the process ends with its status."""
    env = clean_env(LD_PRELOAD=f"{paths.LIBCOLOCATE}:{built['lib']}", LD_LIBRARY_PATH=str(paths.SIMGPU_DIR),
                    SIMGPU_DIR=str(tmp_path / "sim"), SIMGPU_TIMESCALE="0",
                    COLOCATE_RUNTIME_DIR=str(tmp_path / "rd"), COLOCATE_TRACE=str(tmp_path / "t.jsonl"),
                    INTERPOSER_OUT=str(tmp_path / "ip.json"), MISBEHAVE="exit")
    r = subprocess.run([str(built["prog"]), "3"], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 3 and "PASS" not in r.stdout, r.stdout + r.stderr
    assert "trace lock stayed busy" in r.stderr
