"""App device memory shared with pool workers at the same address through
the driver's VMM calls, on simgpu.

simgpu emulates cuMemCreate / cuMemAddressReserve / cuMemMap / export and
import of POSIX fds, handed out by cudaGetDriverEntryPointByVersion as on a
GPU.  With COLOCATE_MEM=vmm the shim allocates the app's memory that way in
its slot of the colocate region and, once a worker accepted its HELLO with
FWD_HF_VMM, sends every allocation (fd by SCM_RIGHTS) on the worker's mem
socket; the worker maps it at the same address, or elsewhere, and then
translates the pointer arguments of the app's launches.  Workers here run
with COLOCATE_WORKER_BY_NAME=0 (kernels from the apps' modules, as on a GPU).

Covered: the emulation itself across two processes (hint honoured, data
shared, hint ignored on request, unknown entry point); lud and hotspot give
the local run's bits when forwarded with shared memory, at the same address
(translated == 0) and with the worker refused the address (translated ==
every launch); hotspot's cudaFree while routed unmaps in the worker; an app
that also uses cudaMallocManaged stays local with the reason logged;
fuzzed mem-socket messages are refused and logged and the worker survives.

Review fixes: a mem connection voided mid-run (its worker stopped while a
MAP waited) is left before the next launch; a worker's mappings belong to
their connection (a return on a new connection maps the same range at once;
no MAP over another connection's live range or outside the region); routes
over more workers than the shim keeps; no allocation native during set-up
by other threads; cuMemAlloc_v2/cuMemFree_v2 and cudaFreeAsync take the
VMM allocator, interior pointers and double frees refused; a forked child
allocates natively; simgpu's cuMemMap gives no access until cuMemSetAccess,
which may span mappings.
"""
from __future__ import annotations

import array
import os
import signal
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_forwarding import HOT, result_of
from test_modules import LUD, by_module_worker, lud_result

from processpool.rig import Rig
from shim import paths
from shim._proto import ffi, lib

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "bench" / "bin"
WORKER = paths.LIB_DIR / "colocate-worker"
CUDA_INC = Path("/usr/local/cuda/include")

pytestmark = pytest.mark.skipif(
    not (BIN / "lud").exists() or not (BIN / "hotspot").exists() or not WORKER.exists()
    or not paths.SIMGPU_CUDART.exists() or not (CUDA_INC / "cuda.h").exists(),
    reason="bench programs, simgpu, colocate-worker or CUDA headers missing (make build)")

# the mem socket of shim/proto/fwd_proto.h, its constants from the header
MEM_MAGIC, MEM_VERSION = lib.FWD_MEM_MAGIC, lib.FWD_MEM_VERSION
MAP, UNMAP, ACK = lib.FWD_MEM_MAP, lib.FWD_MEM_UNMAP, lib.FWD_MEM_ACK
S_OK, S_REFUSED, S_FAILED = lib.FWD_MEM_S_OK, lib.FWD_MEM_S_REFUSED, lib.FWD_MEM_S_FAILED
MEM_BASE, MEM_SIZE, ALIGN = lib.FWD_MEM_BASE, lib.FWD_MEM_SIZE, lib.FWD_MEM_ALIGN
MSG_FIELDS = ("magic", "version", "op", "len", "status", "pid", "pad", "addr", "size", "waddr")
MSG = struct.Struct("<IHHIIIIQQQ")   # struct fwd_mem_msg, field for field
assert MSG.size == ffi.sizeof("struct fwd_mem_msg")
assert [ffi.offsetof("struct fwd_mem_msg", f) for f in MSG_FIELDS] == \
    [struct.calcsize("<" + MSG.format[1:i]) for i in range(1, len(MSG_FIELDS) + 1)]


# ---------------------------------------------------------------- the emulation

PROBE_C = r"""
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define SZ (2u << 20)
typedef cudaError_t (*get_fn)(const char *, void **, unsigned, unsigned long long,
                              enum cudaDriverEntryPointQueryResult *);
static void *fn(const char *n)
{
    enum cudaDriverEntryPointQueryResult q = 7;
    void *f = NULL;
    cudaError_t e = cudaGetDriverEntryPointByVersion(n, &f, 12000, cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !f) {
        printf("ENTRY %s %d %d\n", n, (int)e, (int)q);
        exit(2);
    }
    return f;
}
#define D(name) ((__typeof__(&name))fn(#name))

int main(int argc, char **argv)
{
    CUdeviceptr hint = strtoull(argv[2], NULL, 0), p = 0;
    CUmemGenericAllocationHandle h;
    CUmemAllocationProp prop = {0};
    CUmemAccessDesc acc = {0};
    struct cudaPointerAttributes at;
    size_t g = 0;
    unsigned v[4] = {0};
    int fd = -1, child = !strcmp(argv[1], "child");

    if (!strcmp(argv[1], "unknown")) {
        enum cudaDriverEntryPointQueryResult q = 7;
        void *f = (void *)1;
        cudaError_t e = cudaGetDriverEntryPointByVersion("cuNoSuchThing", &f, 12000, 0, &q);
        cudaError_t e2 = cudaGetDriverEntryPoint("cuNoSuchThing", &f, 0, &q);
        printf("UNKNOWN %d %d %d %d\n", (int)e, (int)q, f == NULL, (int)e2);
        return 0;
    }
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    if (D(cuMemGetAllocationGranularity)(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) || g != SZ)
        return 3;
    if (D(cuMemAddressReserve)(&p, 4 * SZ, g, hint, 0))
        return 4;
    printf("%s RESERVED %d\n", argv[1], p == hint);
    if (child) {
        if (D(cuMemImportFromShareableHandle)(&h, (void *)(long)atoi(argv[3]),
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
            return 5;
    } else if (D(cuMemCreate)(&h, SZ, &prop, 0)) {
        return 5;
    }
    if (D(cuMemMap)(p + SZ, SZ, 0, h, 0))
        return 6;
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (D(cuMemSetAccess)(p + SZ, SZ, &acc, 1))
        return 7;
    if (cudaPointerGetAttributes(&at, (void *)(p + SZ + 64)) || at.type != cudaMemoryTypeDevice)
        return 8;
    if (child) {
        /* a copy from it is a device-to-host copy: it is device memory */
        if (cudaMemcpy(v, (void *)(p + SZ + 4096), sizeof(v), cudaMemcpyDeviceToHost))
            return 9;
        printf("child READ %u %u %u %u\n", v[0], v[1], v[2], v[3]);
        v[0] = 77;
        if (cudaMemcpy((void *)(p + SZ), v, 4, cudaMemcpyHostToDevice))
            return 10;
        return 0;
    }
    v[0] = 11, v[1] = 22, v[2] = 33, v[3] = 44;
    if (cudaMemcpy((void *)(p + SZ + 4096), v, sizeof(v), cudaMemcpyHostToDevice))
        return 9;
    if (cudaMemset((void *)(p + SZ), 0, 4))
        return 9;
    if (D(cuMemExportToShareableHandle)(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0))
        return 11;
    fflush(stdout);
    if (fork() == 0) {
        char fds[16];
        snprintf(fds, sizeof(fds), "%d", fd);
        execl(argv[0], argv[0], "child", argv[2], fds, (char *)NULL);
        _exit(99);
    }
    {
        int stt;
        wait(&stt);
        if (!WIFEXITED(stt) || WEXITSTATUS(stt))
            return 20 + WEXITSTATUS(stt);
    }
    if (cudaMemcpy(v, (void *)(p + SZ), 4, cudaMemcpyDeviceToHost))
        return 12;
    printf("parent SEES %u\n", v[0]);
    if (D(cuMemUnmap)(p + SZ, SZ) || D(cuMemRelease)(h) || D(cuMemAddressFree)(p, 4 * SZ))
        return 13;
    /* unmapped: no longer device memory */
    printf("parent AFTER %d\n",
           cudaMemcpy(v, (void *)(p + SZ), 4, cudaMemcpyDeviceToHost) != cudaSuccess);
    return 0;
}
"""


SIMGPU_LINK = (f"-L{paths.SIMGPU_DIR}", "-l:libcudart.so.13", f"-Wl,-rpath,{paths.SIMGPU_DIR}")
PRELOAD_LIB = ("-shared", "-fPIC")


def build_c(d: Path, name: str, source: str, *flags: str) -> Path:
    """source compiled against the CUDA headers into d/name (flags: how it links)."""
    (d / f"{name}.c").write_text(source)
    out = d / name
    subprocess.run(["gcc", "-O1", "-o", str(out), str(d / f"{name}.c"), f"-I{CUDA_INC}", *flags],
                   check=True)
    return out


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    return build_c(tmp_path_factory.mktemp("vmmprobe"), "probe", PROBE_C, *SIMGPU_LINK)


def run_probe(exe: Path, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SIMGPU_", "COLOCATE_"))}
    e.pop("LD_PRELOAD", None)
    e.update(LD_LIBRARY_PATH=str(paths.SIMGPU_DIR), SIMGPU_DIR=str(tmp_path / "sim"),
             SIMGPU_TIMESCALE="0", **env)
    return subprocess.run([str(exe), *args], env=e, capture_output=True, text=True, timeout=30)


def test_emulated_vmm_shares_memory_at_the_same_address(probe, tmp_path):
    hint = hex(0x3F0000000000)
    p = run_probe(probe, tmp_path, "parent", hint)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    out = p.stdout.splitlines()
    assert "parent RESERVED 1" in out and "child RESERVED 1" in out
    assert "child READ 11 22 33 44" in out       # the parent's data, through the fd
    assert "parent SEES 77" in out               # and the child's write back
    assert "parent AFTER 1" in out               # unmapped: not device memory any more


def test_emulated_hint_ignored_on_request(probe, tmp_path):
    p = run_probe(probe, tmp_path, "parent", hex(0x3F0000000000), SIMGPU_VMM_IGNORE_HINT="1")
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    out = p.stdout.splitlines()
    assert "parent RESERVED 0" in out and "child RESERVED 0" in out
    # elsewhere, but still one memory
    assert "child READ 11 22 33 44" in out and "parent SEES 77" in out


def test_unknown_entry_point(probe, tmp_path):
    p = run_probe(probe, tmp_path, "unknown", "0")
    assert p.returncode == 0, p.stderr
    # cudaErrorSymbolNotFound (500), cudaDriverEntryPointSymbolNotFound (1), NULL
    assert "UNKNOWN 500 1 1 500" in p.stdout.splitlines()


# ---------------------------------------------------------------- through the shim


@pytest.fixture
def rig():
    r = Rig()
    yield r
    r.close()


def settle(rig: Rig, wid: int, key: str, want: int, timeout: float = 3.0) -> dict:
    """Stats once stats[key] == want (the worker ticks every 100 ms)."""
    end = time.monotonic() + timeout
    while True:
        s = rig.stats(wid)
        if s[key] == want or time.monotonic() > end:
            return s
        time.sleep(0.05)


@pytest.mark.parametrize("prog", ["lud", "hotspot"])
def test_forwarded_with_shared_memory_at_the_same_address(rig, prog):
    by_module_worker(rig, 1)
    args, res = (LUD, lud_result) if prog == "lud" else (HOT, result_of)
    out, _, local = rig.run(prog, *args, **rig.fast)
    want = res(out)

    out, err, fwd = rig.run(prog, *args, routes=1, COLOCATE_MEM="vmm")
    assert res(out) == want, err
    assert fwd["forwarded"] == fwd["launches"] == local["launches"] > 0, err
    assert fwd["allocs_live"] == 0 and fwd["alloc_bytes_live"] == 0
    assert "COLOCATE_MEM=vmm: device memory shared from slot" in err, err
    assert "lost" not in err and "runs locally" not in err and "running locally" not in err, err
    s = settle(rig, 1, "vmm_live", 0)
    assert s["vmm"] is True and s["vmm_same_address"] is True and s["by_name"] is False
    assert s["forwarded"] == fwd["launches"] and s["translated"] == 0
    nalloc = 3 if prog == "hotspot" else 1
    # every cudaMalloc mapped there; the frees (made while routed) unmapped
    assert s["vmm_mapped"] == s["vmm_unmapped"] == nalloc and s["vmm_live"] == 0
    assert s["bad_mem"] == 0
    log = rig.worker_log(1)
    assert "could not be had" not in log and "translated" not in log.replace(
        "0 launches translated", ""), log


@pytest.mark.parametrize("prog", ["lud", "hotspot"])
def test_forwarded_with_pointers_translated_when_the_address_is_refused(rig, prog):
    by_module_worker(rig, 1, SIMGPU_VMM_IGNORE_HINT="1")
    args, res = (LUD, lud_result) if prog == "lud" else (HOT, result_of)
    out, _, local = rig.run(prog, *args, **rig.fast)
    want = res(out)

    out, err, fwd = rig.run(prog, *args, routes=1, COLOCATE_MEM="vmm")
    assert res(out) == want, err
    assert fwd["forwarded"] == fwd["launches"] == local["launches"] > 0, err
    s = settle(rig, 1, "vmm_live", 0)
    assert s["vmm_same_address"] is False
    # every launch of these programs passes a device pointer
    assert s["translated"] == fwd["launches"], s
    log = rig.worker_log(1)
    assert "not at its address" in log and "could not be had" in log, log
    assert log.count("pointer arguments of its launches are translated") == 1, log
    end = time.monotonic() + 3
    while f"{fwd['launches']} launches translated" not in log and time.monotonic() < end:
        time.sleep(0.05)
        log = rig.worker_log(1)
    assert f"VMM-shared memory, {fwd['launches']} launches translated" in log, log


MANAGED_C = r"""
#include <cuda_runtime_api.h>
#include <unistd.h>
/* preloaded after libcolocate.so: an app that also takes managed memory */
__attribute__((constructor)) static void grab(void)
{
    void *p;
    if (cudaMallocManaged(&p, 4096, cudaMemAttachGlobal) != cudaSuccess)
        _exit(3);
}
"""


def test_app_with_managed_memory_stays_local(rig, tmp_path):
    lib = build_c(tmp_path, "libmanaged.so", MANAGED_C, *PRELOAD_LIB)
    by_module_worker(rig, 1)
    out, _, _ = rig.run("hotspot", *HOT, **rig.fast)
    want = result_of(out)

    out, err, fwd = rig.run("hotspot", *HOT, routes=1, COLOCATE_MEM="vmm",
                            LD_PRELOAD=f"{paths.LIBCOLOCATE} {lib}")
    assert result_of(out) == want, err
    assert fwd["launches"] == 300 and fwd["forwarded"] == 0, err
    assert "cudaMallocManaged made device memory that is not shared with workers" in err, err
    assert err.count("not forwarding to worker 1") == 1, err
    s = rig.stats(1)
    assert s["forwarded"] == 0 and s["vmm_mapped"] == 0


MIDRUN_C = r"""
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* preloaded BEFORE libcolocate.so: at the app's 10th host-to-device copy
 * (hotspot: its 9th run, 48 launches forwarded by then) allocate and free
 * (MIDRUN=alloc), the same with the worker (STALL_PID) stopped while the
 * allocation is made, so that its MAP is not acked (MIDRUN=stall), or take
 * managed memory (MIDRUN=managed).  glibc's own
 * dlsym: libcolocate.so overrides dlsym, and RTLD_NEXT is the caller's */
typedef void *(*dlsym_fn)(void *, const char *);
static int copies;
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k)
{
    static __typeof__(&cudaMemcpy) next;
    const char *mode = getenv("MIDRUN");
    void *b;

    if (!next) {
        dlsym_fn real = (dlsym_fn)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.34");
        if (!real)
            real = (dlsym_fn)dlvsym(RTLD_DEFAULT, "dlsym", "GLIBC_2.2.5");
        next = (__typeof__(next))real(RTLD_NEXT, "cudaMemcpy");
    }
    if (k == cudaMemcpyHostToDevice && ++copies == 10 && mode) {
        if (!strcmp(mode, "alloc")) {
            if (cudaMalloc(&b, n) || next(b, s, n, k) || cudaFree(b))
                _exit(3);
        } else if (!strcmp(mode, "stall")) {
            pid_t w = (pid_t)atoi(getenv("STALL_PID"));
            int r;
            kill(w, SIGSTOP);
            r = cudaMalloc(&b, n);
            kill(w, SIGCONT);
            if (r || next(b, s, n, k) || cudaFree(b))
                _exit(3);
        } else if (cudaMallocManaged(&b, n, cudaMemAttachGlobal)) {
            _exit(3);
        }
    }
    return next(d, s, n, k);
}
"""


@pytest.fixture(scope="module")
def midrun(tmp_path_factory) -> Path:
    return build_c(tmp_path_factory.mktemp("midrun"), "libmidrun.so", MIDRUN_C, *PRELOAD_LIB, "-ldl")


def test_malloc_and_free_while_routed_reach_the_worker(rig, midrun):
    by_module_worker(rig, 1)
    out, _, _ = rig.run("hotspot", *HOT, **rig.fast)
    want = result_of(out)

    out, err, fwd = rig.run("hotspot", *HOT, routes=1, COLOCATE_MEM="vmm", MIDRUN="alloc",
                            LD_PRELOAD=f"{midrun} {paths.LIBCOLOCATE}")
    assert result_of(out) == want, err
    assert fwd["forwarded"] == 300 and fwd["allocs_live"] == 0, err
    s = settle(rig, 1, "vmm_live", 0)
    # hotspot's three and the one made and freed mid-run, while routed
    assert s["vmm_mapped"] == s["vmm_unmapped"] == 4 and s["bad_mem"] == 0, s


def test_managed_memory_while_routed_leaves_the_worker(rig, midrun):
    by_module_worker(rig, 1)
    out, _, _ = rig.run("hotspot", *HOT, **rig.fast)
    want = result_of(out)

    out, err, fwd = rig.run("hotspot", *HOT, routes=1, COLOCATE_MEM="vmm", MIDRUN="managed",
                            LD_PRELOAD=f"{midrun} {paths.LIBCOLOCATE}")
    assert result_of(out) == want, err
    # copy 1 is hotspot's power grid, copies 2..9 start its first eight
    # runs (48 launches, to the worker); from the ninth run on, all local
    assert fwd["launches"] == 300 and fwd["forwarded"] == 48, (fwd, err)
    assert "leaving worker 1: cudaMallocManaged made device memory" in err, err
    assert rig.stats(1)["forwarded"] == 48


def test_worker_without_its_mem_socket_is_not_used(rig):
    by_module_worker(rig, 1)
    (rig.dir / "worker-1.mem.sock").unlink()       # as if it could not listen
    out, _, _ = rig.run("hotspot", *HOT, **rig.fast)
    want = result_of(out)

    out, err, fwd = rig.run("hotspot", *HOT, routes=1, COLOCATE_MEM="vmm")
    assert result_of(out) == want, err
    assert fwd["forwarded"] == 0, err
    assert "cannot forward to worker 1: worker 1: memory not shared: connect" in err, err
    assert err.count("cannot forward to worker 1") == 1, err
    # the worker was told BYE after its HELLO: it holds nothing of the app
    end = time.monotonic() + 3
    while rig.stats(1)["apps"] and time.monotonic() < end:
        time.sleep(0.05)
    s = rig.stats(1)
    assert s["apps"] == 0 and s["forwarded"] == 0 and s["vmm_mapped"] == 0


def test_native_mode_is_the_default(rig):
    by_module_worker(rig, 1)
    out, err, fwd = rig.run("hotspot", *HOT, routes=1)
    result_of(out)
    assert "COLOCATE_MEM" not in err
    # simgpu's arena is shared anyway: forwarded, nothing on the mem socket
    assert fwd["forwarded"] == 300
    assert rig.stats(1)["vmm_mapped"] == 0


# ---------------------------------------------------------------- the mem socket


def msg(op=MAP, addr=MEM_BASE + (200 << 30), size=ALIGN, pid=None, magic=MEM_MAGIC,
        version=MEM_VERSION, length=48, status=0, pad=0, waddr=0) -> bytes:
    return MSG.pack(magic, version, op, length, status, os.getpid() if pid is None else pid,
                    pad, addr, size, waddr)


def memfd(size: int = ALIGN) -> int:
    fd = os.memfd_create("vmmtest")
    os.ftruncate(fd, size)
    return fd


class MemConn:
    def __init__(self, path: Path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(3)
        self.s.connect(str(path))

    def send(self, data: bytes, fd: int | None = None) -> None:
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))] if fd else []
        self.s.sendmsg([data], anc)

    def ack(self) -> tuple | None:
        """The ACK, or None when the worker closed the connection."""
        buf = b""
        while len(buf) < 48:
            try:
                part = self.s.recv(48 - len(buf))
            except ConnectionResetError:
                return None
            if not part:
                return None
            buf += part
        return MSG.unpack(buf)

    def close(self) -> None:
        self.s.close()


def check(m: bytes, nfds: int) -> str | None:
    """fwd_mem_check() of fwd_proto.h, plus the worker's pid test."""
    magic, version, op, length, status, pid, pad, addr, size, waddr = MSG.unpack(m)
    if magic != MEM_MAGIC or version != MEM_VERSION or length != 48:
        return "framing"
    if op not in (MAP, UNMAP) or status or pad or waddr:
        return "field"
    if not addr or not size or addr % ALIGN or size % ALIGN or addr + size >= 1 << 64:
        return "field"
    if nfds != (1 if op == MAP else 0):
        return "fds"
    if pid != os.getpid():
        return "pid"
    if op == MAP and not (MEM_BASE <= addr and addr + size <= MEM_BASE + MEM_SIZE):
        return "region"
    return None


@pytest.fixture(scope="module")
def mem_worker():
    r = Rig()
    w = by_module_worker(r, 1)
    yield r, w
    r.close()


def test_mem_socket_is_private_and_maps_at_the_same_address(mem_worker):
    r, _ = mem_worker
    path = r.dir / "worker-1.mem.sock"
    assert (path.stat().st_mode & 0o777) == 0o600
    c = MemConn(path)
    fd = memfd()
    try:
        addr = MEM_BASE + (250 << 30)
        c.send(msg(MAP, addr), fd)
        a = c.ack()
        assert a and a[2] == ACK and a[4] == S_OK and a[7] == addr and a[9] == addr
        c.send(msg(MAP, addr), fd)                      # twice: refused
        assert c.ack()[4] == S_REFUSED
        c.send(msg(UNMAP, addr))
        assert c.ack()[4] == S_OK
        c.send(msg(UNMAP, addr))                        # not mapped any more
        assert c.ack()[4] == S_REFUSED
        c.send(msg(MAP, addr, pid=1), fd)               # someone else's pid
        assert c.ack()[4] == S_REFUSED
    finally:
        os.close(fd)
        c.close()
    assert "message for pid 1 from pid" in r.worker_log(1)


fields = st.fixed_dictionaries({
    "op": st.sampled_from([0, MAP, UNMAP, ACK, 9]),
    "addr": st.one_of(st.just(MEM_BASE + (100 << 30)), st.integers(0, (1 << 64) - 1),
                      st.integers(0, 1 << 20).map(lambda k: MEM_BASE + k * ALIGN)),
    "size": st.one_of(st.just(ALIGN), st.just(2 * ALIGN), st.integers(0, (1 << 64) - 1)),
    "magic": st.sampled_from([MEM_MAGIC, MEM_MAGIC, MEM_MAGIC, 0, 0xC0FFEE]),
    "version": st.sampled_from([MEM_VERSION, MEM_VERSION, 2]),
    "length": st.sampled_from([48, 48, 48, 0, 47, 4096]),
    "status": st.sampled_from([0, 0, 1]),
    "pad": st.sampled_from([0, 0, 5]),
    "waddr": st.sampled_from([0, 0, MEM_BASE]),
    "pid": st.sampled_from([None, None, 1, 0]),
})


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(f=fields, with_fd=st.booleans(), fd_size=st.sampled_from([ALIGN, 4096, 3 * ALIGN]),
       truncated=st.integers(0, 47))
def test_fuzz_mem_messages(mem_worker, f, with_fd, fd_size, truncated):
    r, w = mem_worker
    m = msg(**f)
    c = MemConn(r.dir / "worker-1.mem.sock")
    fd = memfd(fd_size) if with_fd else None
    try:
        if truncated and not with_fd and truncated % 7 == 0:
            # a message cut short, then the peer leaves: nothing to answer
            c.send(m[:truncated])
            c.close()
            return
        c.send(m, fd)
        a = c.ack()
        why = check(m, 1 if with_fd else 0)
        if why:
            assert a is not None and a[4] == S_REFUSED, (why, a)
            if why == "framing":   # cannot resynchronise a stream: closed
                assert c.ack() is None
        elif f["op"] == UNMAP:
            assert a is not None and a[4] == S_REFUSED, a      # nothing mapped there
        else:
            assert a is not None and a[4] in (S_OK, S_FAILED), a
            if a[4] == S_OK and f["op"] == MAP:
                c.send(msg(UNMAP, f["addr"], f["size"]))
                assert c.ack()[4] == S_OK
    finally:
        if fd is not None:
            os.close(fd)
        c.close()
    assert w.poll() is None


def test_worker_survives_mem_fuzzing(mem_worker):
    r, w = mem_worker
    assert w.poll() is None
    s = r.stats(1)
    assert s["state"] == "ready" and s["bad_mem"] > 0
    assert "mem socket: refused:" in r.worker_log(1)
    # and still maps what is sound
    c = MemConn(r.dir / "worker-1.mem.sock")
    fd = memfd()
    try:
        c.send(msg(MAP, MEM_BASE + (7 << 30)), fd)
        assert c.ack()[4] == S_OK
    finally:
        os.close(fd)
        c.close()
    w.send_signal(signal.SIGTERM)
    assert w.wait(10) == 0


# ---------------------------------------------------------------- review fixes

# Frees, the driver allocator and fork through the shim, without a worker:
# an unregistered app takes its slot by pid hash.  Exit code says where it
# stopped; lines say what it saw.
SHIMPROBE_C = r"""
#define _GNU_SOURCE
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BASE 0x300000000000ull
#define SIZE (256ull * (64ull << 30))
static int in_region(const void *p)
{
    uint64_t a = (uint64_t)(uintptr_t)p;
    return a >= BASE && a - BASE < SIZE;
}

#define NT 8
static pthread_barrier_t bar;
static void *ptrs[NT];
static void *grab(void *arg)
{
    long i = (long)arg;
    pthread_barrier_wait(&bar);
    if (cudaMalloc(&ptrs[i], 4096))
        ptrs[i] = NULL;
    return NULL;
}

int main(int argc, char **argv)
{
    typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
    typedef CUresult (*free_fn)(CUdeviceptr);
    unsigned v[4] = {1, 2, 3, 4}, w[4] = {0};
    CUdeviceptr d = 0;
    void *p = NULL, *q = NULL;
    int st, i;

    if (!strcmp(argv[1], "race")) {
        /* the first allocations of the process, from NT threads at once */
        pthread_t t[NT];
        int shared = 0;
        pthread_barrier_init(&bar, NULL, NT);
        for (i = 0; i < NT; i++)
            pthread_create(&t[i], NULL, grab, (void *)(long)i);
        for (i = 0; i < NT; i++)
            pthread_join(t[i], NULL);
        for (i = 0; i < NT; i++)
            shared += ptrs[i] && in_region(ptrs[i]);
        printf("RACE %d of %d shared\n", shared, NT);
        return 0;
    }
    if (!strcmp(argv[1], "drv")) {
        alloc_fn al = (alloc_fn)dlsym(RTLD_DEFAULT, "cuMemAlloc_v2");
        free_fn fr = (free_fn)dlsym(RTLD_DEFAULT, "cuMemFree_v2");
        if (!al || !fr)
            return 2;
        st = (int)al(&d, 1 << 20);
        printf("ALLOC %d %d\n", st, in_region((void *)d));
        if (cudaMemcpy((void *)d, v, sizeof(v), cudaMemcpyHostToDevice) ||
            cudaMemcpy(w, (void *)d, sizeof(w), cudaMemcpyDeviceToHost))
            return 3;
        printf("DATA %u %u %u %u\n", w[0], w[1], w[2], w[3]);
        printf("FREE interior %d\n", (int)fr(d + 4096));
        printf("FREE start %d\n", (int)fr(d));
        printf("FREE again %d\n", (int)fr(d));
        return 0;
    }
    if (!strcmp(argv[1], "rt")) {
        if (cudaMalloc(&p, 1 << 20) || !in_region(p))
            return 2;
        printf("FREE interior %d\n", (int)cudaFree((char *)p + 4096));
        printf("FREEASYNC start %d\n", (int)cudaFreeAsync(p, 0));
        printf("SYNC %d\n", (int)cudaDeviceSynchronize());
        printf("FREE again %d\n", (int)cudaFree(p));
        printf("FREEASYNC again %d\n", (int)cudaFreeAsync(p, 0));
        return 0;
    }
    /* fork */
    if (cudaMalloc(&p, 1 << 20) || !in_region(p) ||
        cudaMemcpy(p, v, sizeof(v), cudaMemcpyHostToDevice))
        return 2;
    fflush(stdout);
    if (fork() == 0) {
        if (cudaMalloc(&q, 4096))
            _exit(3);
        printf("CHILD native %d free %d\n", !in_region(q), (int)cudaFree(q));
        fflush(stdout);
        _exit(0);
    }
    if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st))
        return 4;
    if (cudaMemcpy(w, p, sizeof(w), cudaMemcpyDeviceToHost))
        return 5;
    printf("PARENT %u %u %u %u free %d\n", w[0], w[1], w[2], w[3], (int)cudaFree(p));
    return 0;
}
"""


@pytest.fixture(scope="module")
def shimprobe(tmp_path_factory) -> Path:
    return build_c(tmp_path_factory.mktemp("shimprobe"), "shimprobe", SHIMPROBE_C, "-pthread",
                   *SIMGPU_LINK, "-ldl")


def run_shimprobe(exe: Path, tmp_path: Path, mode: str) -> subprocess.CompletedProcess:
    p = run_probe(exe, tmp_path, mode, LD_PRELOAD=str(paths.LIBCOLOCATE), COLOCATE_MEM="vmm",
                  COLOCATE_RUNTIME_DIR=str(tmp_path / "run"))
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    assert "device memory shared from slot" in p.stderr, p.stderr
    return p


def test_setup_race_leaves_no_allocation_native(shimprobe, tmp_path):
    # review 3: a thread that found set-up in progress went native
    for _ in range(5):
        p = run_shimprobe(shimprobe, tmp_path, "race")
        assert "RACE 8 of 8 shared" in p.stdout.splitlines(), (p.stdout, p.stderr)
        assert "not shared with workers" not in p.stderr, p.stderr


def test_driver_allocations_are_shared_and_bad_frees_refused(shimprobe, tmp_path):
    # review 4 and 5: cuMemAlloc_v2 from outside the runtime takes the VMM
    # allocator; cuMemFree_v2 of an interior pointer or twice is refused
    # (CUDA_ERROR_INVALID_VALUE = 1) and never reaches the real free
    p = run_shimprobe(shimprobe, tmp_path, "drv")
    out = p.stdout.splitlines()
    assert "ALLOC 0 1" in out and "DATA 1 2 3 4" in out, (out, p.stderr)
    assert "FREE interior 1" in out and "FREE start 0" in out and "FREE again 1" in out, out
    assert "not shared with workers" not in p.stderr, p.stderr


def test_runtime_frees_of_shared_memory(shimprobe, tmp_path):
    # review 5: cudaFreeAsync frees a VMM allocation; an interior pointer or
    # a second free is cudaErrorInvalidValue (1)
    p = run_shimprobe(shimprobe, tmp_path, "rt")
    out = p.stdout.splitlines()
    assert out == ["FREE interior 1", "FREEASYNC start 0", "SYNC 0", "FREE again 1",
                   "FREEASYNC again 1"], (out, p.stderr)


def test_forked_child_allocates_natively(shimprobe, tmp_path):
    # review 6: the child does not use (or free) the parent's VMM state
    p = run_shimprobe(shimprobe, tmp_path, "fork")
    out = p.stdout.splitlines()
    assert "CHILD native 1 free 0" in out, (out, p.stderr)
    assert "PARENT 1 2 3 4 free 0" in out, (out, p.stderr)
    assert "a forked child does not share the parent's device memory" in p.stderr, p.stderr


ACCESS_C = r"""
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>

#define SZ (2u << 20)
typedef cudaError_t (*get_fn)(const char *, void **, unsigned, unsigned long long,
                              enum cudaDriverEntryPointQueryResult *);
static void *fn(const char *n)
{
    enum cudaDriverEntryPointQueryResult q;
    void *f = NULL;
    cudaGetDriverEntryPointByVersion(n, &f, 12000, cudaEnableDefault, &q);
    return f;
}
#define D(name) ((__typeof__(&name))fn(#name))

int main(void)
{
    CUmemAllocationProp prop = {0};
    CUmemAccessDesc acc = {0};
    CUmemGenericAllocationHandle h1, h2;
    CUdeviceptr p = 0;
    unsigned v = 5, w = 0;

    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    if (D(cuMemAddressReserve)(&p, 4 * SZ, SZ, 0, 0) || D(cuMemCreate)(&h1, SZ, &prop, 0) ||
        D(cuMemCreate)(&h2, SZ, &prop, 0) || D(cuMemMap)(p, SZ, 0, h1, 0) ||
        D(cuMemMap)(p + SZ, SZ, 0, h2, 0))
        return 2;
    /* mapped without access: not usable, as on a GPU */
    printf("NOACCESS copy %d\n", cudaMemcpy((void *)p, &v, 4, cudaMemcpyHostToDevice) != 0);
    cudaGetLastError();
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    /* one call over both mappings, as the driver allows; not past them */
    printf("ACCESS beyond %d\n", (int)D(cuMemSetAccess)(p, 3 * SZ, &acc, 1));
    printf("ACCESS both %d\n", (int)D(cuMemSetAccess)(p, 2 * SZ, &acc, 1));
    printf("COPY %d", (int)cudaMemcpy((void *)(p + SZ + 64), &v, 4, cudaMemcpyHostToDevice));
    printf(" %d\n", (int)cudaMemcpy(&w, (void *)(p + SZ + 64), 4, cudaMemcpyDeviceToHost));
    printf("VALUE %u\n", w);
    return 0;
}
"""


def test_emulated_map_needs_set_access(tmp_path):
    # review 8: cuMemMap gives no access; cuMemSetAccess spans mappings
    exe = build_c(tmp_path, "access", ACCESS_C, *SIMGPU_LINK)
    p = run_probe(exe, tmp_path)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    out = p.stdout.splitlines()
    assert out == ["NOACCESS copy 1", "ACCESS beyond 1", "ACCESS both 0", "COPY 0 0",
                   "VALUE 5"], (out, p.stderr)


def test_void_mem_connection_is_left_before_the_next_launch(rig, midrun):
    # review 1: the worker is stopped while the app allocates mid-run (its
    # MAP times out: the connection is void); the app's next launch leaves
    # that worker (before the fix, launches went on to it until the next
    # liveness check, 64 launches on)
    w = by_module_worker(rig, 1)
    out, _, _ = rig.run("hotspot", *HOT, **rig.fast)
    want = result_of(out)

    # the heartbeat's limit well above the MAP's 2 s: the stalled worker must
    # be left for its void connection, not found dead first (a race)
    out, err, fwd = rig.run("hotspot", *HOT, routes=1, COLOCATE_MEM="vmm", MIDRUN="stall",
                            STALL_PID=str(w.pid), LD_PRELOAD=f"{midrun} {paths.LIBCOLOCATE}",
                            COLOCATE_WORKER_TIMEOUT_MS="10000")
    assert result_of(out) == want, err
    assert "its connection is void" in err, err
    assert "leaving worker 1: it did not map or unmap some of the app's memory" in err, err
    # copies 2..9 started the first eight runs (48 launches); none after
    assert fwd["launches"] == 300 and fwd["forwarded"] == 48, (fwd, err)
    assert "lost" not in err, err
    s = settle(rig, 1, "vmm_live", 0)
    assert s["forwarded"] == 48 and s["vmm_live"] == 0, s


def test_mem_mappings_belong_to_their_connection(rig):
    # review 2 and 7, on the worker's mem socket
    by_module_worker(rig, 1)
    path = rig.dir / "worker-1.mem.sock"
    addr = MEM_BASE + (9 << 30)
    fd = memfd(2 * ALIGN)
    c1, c2 = MemConn(path), MemConn(path)
    try:
        c1.send(msg(MAP, addr, 2 * ALIGN), fd)
        a = c1.ack()
        assert a[4] == S_OK and a[9] == addr, a
        # another connection: not over a live mapping, even one that lies
        # wholly inside its range (both ends outside it)
        c2.send(msg(MAP, addr - ALIGN, 4 * ALIGN), fd)
        assert c2.ack()[4] == S_REFUSED
        c2.send(msg(UNMAP, addr, 2 * ALIGN))           # not its mapping
        assert c2.ack()[4] == S_REFUSED
        c2.send(msg(MAP, 64 * ALIGN, ALIGN), fd)        # outside the colocate region
        assert c2.ack()[4] == S_REFUSED
        c2.send(msg(MAP, MEM_BASE + MEM_SIZE - ALIGN, 2 * ALIGN), fd)   # across its end
        assert c2.ack()[4] == S_REFUSED
        # the first connection closes and the same app maps the same range
        # again at once on a new one (a return right after an eviction):
        # its orphans do not stand in the way, nor move it elsewhere
        c1.close()
        c3 = MemConn(path)
        try:
            c3.send(msg(MAP, addr, 2 * ALIGN), fd)
            a = c3.ack()
            assert a[4] == S_OK and a[9] == addr, a
            c3.send(msg(UNMAP, addr, 2 * ALIGN))
            assert c3.ack()[4] == S_OK
        finally:
            c3.close()
    finally:
        os.close(fd)
        c2.close()
    s = settle(rig, 1, "vmm_live", 0)
    assert s["vmm_live"] == 0 and s["bad_mem"] == 4, s
    log = rig.worker_log(1)
    assert "overlaps a live mapping" in log and "outside the colocate region" in log, log


def test_routes_across_more_workers_than_are_kept(rig, midrun):
    # review 2 through the shim: routes cycle over four workers, one more
    # than the shim keeps connections to (FWD_KEEP = 3), so a worker's
    # connection is evicted and the app comes back to it on a new one,
    # with memory made and freed meanwhile.  How often that happens depends
    # on timing; what must hold is that it never fails
    for wid in (1, 2, 3, 4):
        by_module_worker(rig, wid)
    args = ["--size", "64", "--iters", "6", "--repeat", "300", "--pyramid", "1", "--check"]
    out, _, _ = rig.run("hotspot", *args, **rig.fast)
    want = result_of(out)

    out, err, fwd = rig.run("hotspot", *args, routes=[1, 2, 3, 4], period=0.002,
                            COLOCATE_MEM="vmm", MIDRUN="alloc",
                            LD_PRELOAD=f"{midrun} {paths.LIBCOLOCATE}")
    assert result_of(out) == want, err
    assert "memory not shared" not in err and "void" not in err and "lost" not in err, err
    total = 0
    for wid in (1, 2, 3, 4):
        s = settle(rig, wid, "vmm_live", 0)
        assert s["vmm_live"] == 0 and s["bad_mem"] == 0, (wid, s, rig.worker_log(wid))
        total += s["forwarded"]
    assert total == fwd["forwarded"], (total, fwd)
