"""Kernels shipped to pool workers as fat binaries (forwarding protocol v4:
MODULE frames, DEFINE.mid), on simgpu, through the CUDA calls a GPU gets.

The shim captures each fat binary at __cudaRegisterFatBinary, writes it once
to <runtime dir>/modules/<image hash>-<size>.fatbin and sends a MODULE frame
before the first DEFINE of one of its kernels; the worker checks the file,
loads it with cudaLibraryLoadData (cached by hash and size), and takes each
kernel with cudaLibraryGetKernel, its layout checked with
cudaFuncGetParamInfo.  Workers here run with COLOCATE_WORKER_BY_NAME=0, so
they never find a kernel by name (simgpu_kernel_by_name), as on a GPU.

Covered: a 3-kernel program gives the local run's bits, and its kernels
ran in the worker from the module; two
apps of one binary load one library; damaged module files (planted where
the shim looks, or named by a fake shim) are refused with a log line naming
the file and the reason, and the app completes locally; kernels without a
module are refused by such a worker; simgpu's cudaLibrary* API directly;
fuzzing of MODULE frames and DEFINE's module id; a slow module load
(COLOCATE_WORKER_LOAD_DELAY_MS) stalls neither the worker's main thread nor
other apps; a fat binary registered again (dlclose, dlopen) is followed by
its kernels.

Refusals are soft (page version 5): a MODULE or DEFINE the worker cannot
serve costs that kernel, not the connection.  The verdict of each DEFINE
comes through the page (defines_done, refused_kid[]); the shim then runs
that kernel locally, in order, and keeps forwarding the others.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import time
from pathlib import Path

import fwdclient as fwd
import pytest
from fwdclient import MAX_MODULES, NO_MODULE, RingApp, image_hash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_forwarding import HOT, result_of

from processpool.rig import Rig
from shim import paths
from shim._proto import lib

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "bench" / "bin"
WORKER = paths.LIB_DIR / "colocate-worker"

pytestmark = pytest.mark.skipif(
    not (BIN / "lud").exists() or not (BIN / "vecadd").exists() or not WORKER.exists()
    or not paths.SIMGPU_CUDART.exists(),
    reason="bench programs, simgpu or colocate-worker not built (make build)")

VECADD = b"_Z6vecaddPKfS0_Pfi"
VECADD_PARAMS = [(0, 8), (8, 8), (16, 8), (24, 4)]
LUD = ["--size", "64", "--repeat", "20", "--check"]


# ---------------------------------------------------------------- helpers


def fatbins(exe: Path) -> list[bytes]:
    """The fat binaries nvcc embedded in exe (its .nv_fatbin section)."""
    d = exe.read_bytes()
    shoff, = struct.unpack_from("<Q", d, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
    secs = [struct.unpack_from("<IIQQQQ", d, shoff + i * shentsize) for i in range(shnum)]
    strtab = secs[shstrndx][4]
    for name, _, _, _, off, size in secs:
        if d[strtab + name:d.index(b"\0", strtab + name)] != b".nv_fatbin":
            continue
        out, p = [], off
        while p + 16 <= off + size:
            magic, _, hdr, fat = struct.unpack_from("<IHHQ", d, p)
            if magic != 0xBA55ED50:
                break
            out.append(d[p:p + hdr + fat])
            p = (p + hdr + fat + 7) & ~7
        return out
    raise AssertionError(f"{exe} has no .nv_fatbin section")


def module_of(exe: Path, kernel: bytes) -> bytes:
    """The fat binary of exe that holds kernel (its cubin is not compressed)."""
    found = [fb for fb in fatbins(exe) if b".nv.info." + kernel in fb]
    assert len(found) == 1, [len(f) for f in fatbins(exe)]
    return found[0]


class FakeApp:
    """Plays the shim's side of a connection: MODULE, DEFINE and LAUNCH go
    into the page's launch ring.  A frame the worker refuses stops the ring
    (the code in the page, the reason in the worker's log); errors() says
    so and goes on over a fresh connection, as the shim would after its
    local replay."""

    def __init__(self, r: Rig, wid: int, name: str = "fakeapp", twins: str = ""):
        self.r, self.wid, self.name, self.twins = r, wid, name, twins
        self.ring = RingApp(r, wid, name=name, twins=twins)

    def send(self, frame: bytes) -> None:
        self.ring.write(frame)

    def errors(self) -> list[tuple[int, str]]:
        """The refusal of what was sent so far, if any: waits until the
        worker's launcher has run every frame and sleeps on the empty ring
        (its tail is stored before a frame runs, ring_sleeping only once
        the ring was found empty), or until it refused one."""
        app, end = self.ring, time.monotonic() + 5
        while not app.refused():
            # a refused launcher sleeps too (waiting for the app to leave):
            # a refusal that lands between the two reads shows as idle, so
            # read the code again once idle (it is stored before it sleeps)
            if app.idle() and not app.refused():
                return []
            assert time.monotonic() < end, "worker did not run the ring's frames"
            time.sleep(0.002)
        code = app.refused()
        why = re.findall(rf"app {re.escape(self.name)} \(pid {os.getpid()}\): refusing its launch "
                         r"ring: (.*)$", self.r.worker_log(self.wid), re.M)
        app.close()
        self.ring = RingApp(self.r, self.wid, name=self.name, twins=self.twins)
        return [(code, why[-1] if why else "")]

    def page(self, field: str) -> int:
        return self.ring.page(field)

    def verdicts(self, n: int) -> None:
        self.ring.verdicts(n)

    def refused(self, kid: int) -> bool:
        return self.ring.refused_kernel(kid)

    def close(self) -> None:
        self.ring.close()


def by_module_worker(r: Rig, wid: int, quota: int = 40, **env: str) -> subprocess.Popen:
    """A worker that takes kernels from modules only, as on a GPU."""
    saved = dict(r.env)
    r.env.update(COLOCATE_WORKER_BY_NAME="0", **env)
    try:
        return r.start_worker(wid, quota)
    finally:
        r.env.clear()
        r.env.update(saved)


def lud_result(out: str) -> dict[str, str]:
    got = {k: re.search(rf"^{k} (.*)$", out, re.M) for k in ("CHECK", "STATS")}
    assert all(got.values()) and re.search(r"^PASS lud", out, re.M), out
    return {k: m.group(1) for k, m in got.items()}


@pytest.fixture
def rig():
    r = Rig()
    yield r
    r.close()


# ---------------------------------------------------------------- through the shim


def test_multi_kernel_app_runs_in_the_worker_from_its_module(rig):
    report = rig.dir / "worker.report"
    w = by_module_worker(rig, 1, SIMGPU_REPORT=str(report))
    out, _, local = rig.run("lud", *LUD, **rig.fast)
    want = lud_result(out)
    assert local["launches"] == 200 and local["forwarded"] == 0

    out, err, fwd = rig.run("lud", *LUD, routes=1)
    assert lud_result(out) == want, err
    assert fwd == {**fwd, "launches": 200, "forwarded": 200,
                   "h2d_bytes": local["h2d_bytes"], "d2h_bytes": local["d2h_bytes"]}
    assert "lost" not in err and "runs locally" not in err, err
    s = rig.stats(1)
    assert s["forwarded"] == 200 and s["by_name"] is False
    assert s["modules"] == 1 and s["module_loads"] == 1 and s["bad_frames"] == 0

    # one file, private, named after the image nvcc embedded
    files = list((rig.dir / "modules").iterdir())
    image = module_of(BIN / "lud", b"_Z12lud_diagonalPfii")
    assert [f.name for f in files] == [f"{image_hash(image):016x}-{len(image)}.fatbin"]
    assert files[0].read_bytes() == image
    assert stat.S_IMODE(files[0].stat().st_mode) == 0o600
    assert stat.S_IMODE((rig.dir / "modules").stat().st_mode) == 0o700
    assert f"loaded module {files[0]}" in rig.worker_log(1)

    # the worker ran lud's three kernels, each with its twin, 200 launches
    w.send_signal(signal.SIGTERM)
    assert w.wait(10) == 0
    runs = [json.loads(ln) for ln in report.read_text().splitlines()]
    mine = {k["name"]: k for k in runs if k["pid"] == w.pid}
    assert set(mine) == {"_Z12lud_diagonalPfii", "_Z13lud_perimeterPfii", "_Z12lud_internalPfii"}
    assert all(k["twin"] for k in mine.values())
    assert sum(k["launches"] for k in mine.values()) == 200


def test_two_apps_of_one_binary_load_one_library(rig):
    by_module_worker(rig, 1, 50)
    out, _, _ = rig.run("hotspot", *HOT, **rig.fast)
    want = result_of(out)
    rig.route_every = 1                  # from each app's first launch on
    apps = [rig.app("hotspot", *HOT) for _ in range(2)]
    for p in apps:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0 and result_of(out) == want, out + err
        c = rig.cb.counters(rig.slots[p.pid])
        assert c["launches"] == c["forwarded"] == 300, c
    rig.route_every = None
    # and a third one later: the library is cached for the worker's life
    out, err, c = rig.run("hotspot", *HOT, routes=1)
    assert result_of(out) == want and c["forwarded"] == 300, err
    end = time.monotonic() + 5           # each left with a BYE (on another socket)
    while rig.stats(1)["apps"]:
        assert time.monotonic() < end
        time.sleep(0.02)
    s = rig.stats(1)
    assert s["forwarded"] == 900
    assert s["modules"] == 1 and s["module_loads"] == 1
    assert rig.worker_log(1).count("loaded module") == 1
    assert len(list((rig.dir / "modules").iterdir())) == 1


LOAD_DELAY_MS = 3000      # longer than the apps' 2 s heartbeat timeout


@pytest.mark.serial      # modelled or wall time that other tests' load would move
def test_a_slow_module_load_stalls_nothing(rig):
    """Loads run outside the module table's mutex and never on the main
    thread (COLOCATE_WORKER_LOAD_DELAY_MS makes each take 3 s, as a big or
    JIT-compiled image would): during them the worker answers stats at once
    and heartbeats go on (no app drops it), a second app of the same binary
    waits for the load under way instead of loading again, and an app of
    another binary loads its own module meanwhile; all three forward
    everything and finish."""
    by_module_worker(rig, 1, 50, COLOCATE_WORKER_LOAD_DELAY_MS=str(LOAD_DELAY_MS))
    want_hot = result_of(rig.run("hotspot", *HOT, **rig.fast)[0])
    want_lud = lud_result(rig.run("lud", *LUD, **rig.fast)[0])
    rig.route_every = 1
    apps = [(rig.app("hotspot", *HOT), 300), (rig.app("hotspot", *HOT), 300),
            (rig.app("lud", *LUD), 200)]
    slowest, during = 0.0, 0
    try:
        end = time.monotonic() + 60
        while any(p.poll() is None for p, _ in apps):
            assert time.monotonic() < end, "apps did not finish"
            t0 = time.monotonic()
            s = rig.stats(1)
            slowest = max(slowest, time.monotonic() - t0)
            during += s["apps"] > 0 and s["module_loads"] < 2
            time.sleep(0.05)
    finally:
        rig.route_every = None
    for p, n in apps:
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, out + err
        assert (lud_result(out) == want_lud) if n == 200 else (result_of(out) == want_hot), err
        c = rig.cb.counters(rig.slots[p.pid])
        assert c["launches"] == c["forwarded"] == n, (c, err)
        assert "lost" not in err and "heartbeat" not in err and "runs locally" not in err, err
    # stats were asked many times while the loads ran, and never waited for one
    assert during >= 10, during
    assert slowest < 1.0, slowest
    s = rig.stats(1)
    assert s["modules"] == 2 and s["module_loads"] == 2 and s["forwarded"] == 800
    assert rig.worker_log(1).count("loaded module") == 2


def planted(rig: Rig, exe: str, kernel: bytes) -> Path:
    """Where the shim looks for (or writes) exe's module of kernel."""
    image = module_of(BIN / exe, kernel)
    (rig.dir / "modules").mkdir(mode=0o700, exist_ok=True)
    return rig.dir / "modules" / f"{image_hash(image):016x}-{len(image)}.fatbin"


@pytest.mark.parametrize("damage,reason", [
    ("magic", "no fatbin magic"),
    ("hash", "does not match the app's hash"),
], ids=["bad-magic", "bad-hash"])
def test_damaged_module_file_is_refused_and_the_app_runs_locally(rig, damage, reason):
    """A file of the right size at the module's path is taken by the shim as
    is (it does not read it back); the worker checks it, refuses it, says
    why in its log, and the app runs that module's kernel locally; the
    connection stays (no lost worker, a BYE at the end)."""
    out, _, _ = rig.run("hotspot", *HOT, **rig.fast)
    want = result_of(out)
    path = planted(rig, "hotspot", b"_Z12hotspot_stepPKfS0_Pfiifffff")
    image = bytearray(module_of(BIN / "hotspot", b"_Z12hotspot_stepPKfS0_Pfiifffff"))
    if damage == "magic":
        image[0:4] = b"\0\0\0\0"
    else:
        image[len(image) // 2] ^= 0x5A
    path.write_bytes(bytes(image))
    path.chmod(0o600)
    by_module_worker(rig, 2)
    out, err, c = rig.run("hotspot", *HOT, routes=2)
    assert result_of(out) == want, err
    assert c["launches"] == 300 and c["forwarded"] == 0, c       # every launch ran here
    assert "lost" not in err and "could not run" not in err, err
    assert err.count("kernel _Z12hotspot_stepPKfS0_Pfiifffff runs locally while routed to "
                     "worker 2: the worker cannot run it (see the worker's log)") == 1, err
    log = rig.worker_log(2)
    assert re.search(rf"module file {re.escape(str(path))} refused: .*{reason}", log), log
    assert "its module 0 was refused" in log, log
    s = rig.stats(2)
    assert s["modules"] == 0 and s["forwarded"] == 0 and s["refused_kernels"] == 1
    assert s["bad_frames"] == 0
    end = time.monotonic() + 5           # the app left with a BYE
    while rig.stats(2)["apps"]:
        assert time.monotonic() < end
        time.sleep(0.05)
    assert "is gone" not in rig.worker_log(2)


@pytest.mark.parametrize("plant", ["symlink", "other-writable", "group-writable", "short"])
def test_unsafe_file_at_the_module_path_is_replaced_by_the_shim(rig, plant, tmp_path):
    """What the worker would refuse the shim does not reuse: it writes the
    image afresh (temp file, rename) and the app is forwarded."""
    path = planted(rig, "hotspot", b"_Z12hotspot_stepPKfS0_Pfiifffff")
    image = module_of(BIN / "hotspot", b"_Z12hotspot_stepPKfS0_Pfiifffff")
    target = tmp_path / "elsewhere.fatbin"
    target.write_bytes(image)
    if plant == "symlink":
        path.symlink_to(target)
    elif plant == "other-writable":
        path.write_bytes(image)
        path.chmod(0o606)
    elif plant == "group-writable":        # the worker would refuse it too
        path.write_bytes(image)
        path.chmod(0o620)
    else:
        path.write_bytes(image[:100])
    by_module_worker(rig, 1)
    out, err, c = rig.run("hotspot", *HOT, routes=1)
    assert "PASS hotspot" in out and c["forwarded"] == 300, err
    st_ = path.lstat()
    assert stat.S_ISREG(st_.st_mode) and stat.S_IMODE(st_.st_mode) == 0o600
    assert path.read_bytes() == image and target.read_bytes() == image
    assert rig.stats(1)["module_loads"] == 1


def test_module_that_cannot_be_shipped_leaves_its_kernels_local(rig):
    """A modules folder open to others is not written to: the module's
    kernels run locally, in order, said once; the worker gets nothing."""
    (rig.dir / "modules").mkdir()
    (rig.dir / "modules").chmod(0o777)
    by_module_worker(rig, 1)
    out, err, c = rig.run("hotspot", *HOT, routes=1)
    assert "PASS hotspot" in out, err
    assert c["launches"] == 300 and c["forwarded"] == 0
    assert err.count("run locally even when routed") == 1, err
    assert "is not a folder of ours closed to others" in err
    assert list((rig.dir / "modules").iterdir()) == []
    assert rig.stats(1)["module_loads"] == 0


def test_a_kernel_registered_again_follows_its_new_module(rig, tmp_path):
    """A fat binary unregistered and registered again under the same host
    stub (a CUDA library dlclose'd and dlopen'ed at the same address; made
    by hand by test-reregister): the kernel takes the new module (a new id:
    the old one is gone for good) and a DEFINE built anew.  The first round
    runs locally, the app is routed to the worker only after the first image
    was unregistered: still naming module 0, every launch of the second
    round would run locally ("its fat binary was unregistered")."""
    prog = BIN / "test-reregister"
    if not prog.exists():
        pytest.skip("test-reregister not built (make build)")
    image = tmp_path / "vecadd.fatbin"
    image.write_bytes(module_of(BIN / "vecadd", VECADD))
    by_module_worker(rig, 1)
    p = subprocess.Popen([str(prog), str(image), "10", "wait"], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**rig.env, "LD_PRELOAD": str(paths.LIBCOLOCATE),
                              "SIMGPU_TWINS": str(BIN / "vecadd.twins.so")})
    try:
        assert p.stdout.readline() == "REREG round=0 launches=10 PASS\n"
        slot = rig.slot_of(p)
        assert rig.cb.counters(slot)["forwarded"] == 0
        rig.cb.set_route(slot, 1, 50)
        out, err = p.communicate("go\n", timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, out + err
    assert out == "REREG round=1 launches=10 PASS\nPASS reregister\n", out + err
    c = rig.cb.counters(slot)
    assert c["launches"] == 20 and c["forwarded"] == 10, (c, err)
    assert "unregistered" not in err and "runs locally" not in err, err
    s = rig.stats(1)
    assert s["forwarded"] == 10 and s["modules"] == 1 and s["module_loads"] == 1, s
    assert s["refused_kernels"] == 0 and s["bad_frames"] == 0, s


def test_kernels_without_a_module_are_refused_by_a_gpu_like_worker(rig):
    """simgpu's CPU cuDNN/cuBLAS kernels are registered without a fat binary:
    their DEFINEs carry no module, which a worker that does not look kernels
    up by name refuses; the app then runs them locally, correctly."""
    if not (BIN / "tonic-service").exists():
        pytest.skip("tonic-service not built")
    by_module_worker(rig, 1, 30)
    args = ("--net", "dig", "--check", "--size", "4")
    out_l, _, c_l = rig.run("tonic-service", *args)
    out_f, err, c_f = rig.run("tonic-service", *args, routes=1)
    assert "PASS tonic-dig" in out_f, err
    sums = [re.search(r"checksum=(\w+)", o).group(1) for o in (out_l, out_f)]
    assert sums[0] == sums[1]
    assert c_f["launches"] == c_l["launches"] and c_f["forwarded"] == 0
    assert "comes without a module, and this worker does not find kernels by name" \
        in rig.worker_log(1)
    assert "runs locally while routed to worker 1" in err and "lost" not in err, err


PERIMETER = "_Z13lud_perimeterPfii"


def test_a_refused_kernel_runs_locally_and_the_connection_stays(rig):
    """lud's second kernel is refused by the worker (test hook) while its
    first one's launches are in flight there: that kernel runs here, in
    order, the other two stay forwarded, nothing runs twice or is reported
    failed, and the app leaves with a BYE (no lost worker)."""
    by_module_worker(rig, 1, COLOCATE_WORKER_REFUSE="lud_perimeter")
    out, _, local = rig.run("lud", *LUD, **rig.fast)
    want = lud_result(out)
    out, err, fwd = rig.run("lud", *LUD, routes=1)
    assert lud_result(out) == want, err
    assert fwd["launches"] == 200 and 0 < fwd["forwarded"] < 200, fwd
    assert "lost" not in err and "could not run" not in err and "launch failure" not in err, err
    assert err.count(f"kernel {PERIMETER} runs locally while routed to worker 1: the worker "
                     "cannot run it (see the worker's log)") == 1, err
    assert f"{200 - fwd['forwarded']} launches ran locally while routed" in err, err
    s = rig.stats(1)
    assert s["forwarded"] == fwd["forwarded"] and s["refused_kernels"] == 1, s
    assert s["bad_frames"] == 0 and s["modules"] == 1
    log = rig.worker_log(1)
    assert log.count(f"kernel {PERIMETER} refused by COLOCATE_WORKER_REFUSE") == 1, log
    end = time.monotonic() + 5              # left with a BYE, not found dead
    while rig.stats(1)["apps"]:
        assert time.monotonic() < end
        time.sleep(0.02)
    assert "is gone" not in rig.worker_log(1)


def test_a_return_to_the_worker_does_not_ask_again(rig):
    """Routes flip between the worker and local while lud runs: the kept
    connection remembers the refusal, so the worker judges the kernel once
    and the app says it once."""
    by_module_worker(rig, 1, COLOCATE_WORKER_REFUSE="lud_perimeter")
    args = ["--size", "64", "--repeat", "1500", "--check"]
    out, _, _ = rig.run("lud", *args, **rig.fast)
    want = lud_result(out)
    flips: list = []
    out, err, fwd = rig.run("lud", *args, routes=[1, 0], period=0.005, flips=flips)
    assert lud_result(out) == want, err
    assert len(flips) >= 4, flips           # it went back to the worker at least once
    assert 0 < fwd["forwarded"] < fwd["launches"] == 15000, fwd
    assert "lost" not in err and "could not run" not in err, err
    assert err.count(f"kernel {PERIMETER} runs locally while routed to worker 1") == 1, err
    assert rig.worker_log(1).count(f"kernel {PERIMETER} refused by") == 1
    assert rig.stats(1)["refused_kernels"] == 1


# ---------------------------------------------------------------- the worker, frame by frame


@pytest.fixture(scope="module")
def mod_worker():
    r = Rig()
    by_module_worker(r, 5, 20)
    r.files = r.dir / "files"
    r.files.mkdir(mode=0o700)
    r.image = module_of(BIN / "vecadd", VECADD)
    r.good = r.files / "vecadd.fatbin"
    r.good.write_bytes(r.image)
    r.good.chmod(0o600)
    yield r
    r.close()


def bad_files(r: Rig) -> dict[str, tuple[Path, int, int, str]]:
    """name -> (path, size and hash the frame says, reason the worker gives);
    made once per worker fixture."""
    if getattr(r, "bad", None):
        return r.bad
    img, h = r.image, image_hash(r.image)
    d = r.files

    def put(name: str, data: bytes, mode: int = 0o600) -> Path:
        p = d / name
        p.write_bytes(data)
        p.chmod(mode)
        return p

    link = d / "link.fatbin"
    link.symlink_to(r.good)
    magic = bytearray(img)
    magic[0] ^= 1
    flipped = bytearray(img)
    flipped[-5] ^= 1
    header = bytearray(img)
    header[8:16] = struct.pack("<Q", len(img))          # payload size: 16 bytes too many
    (d / "dir.fatbin").mkdir()
    r.bad = {
        "symlink": (link, len(img), h, "symbolic link"),
        "other-writable": (put("ow.fatbin", img, 0o602), len(img), h, "writable by others"),
        "group-writable": (put("gw.fatbin", img, 0o620), len(img), h, "writable by its group"),
        "short": (put("short.fatbin", img[:-64]), len(img), h,
                  f"{len(img) - 64} bytes, the app says"),
        "missing": (d / "none.fatbin", len(img), h, "No such file"),
        "directory": (d / "dir.fatbin", len(img), h, "not a regular file"),
        "magic": (put("magic.fatbin", bytes(magic)), len(img), image_hash(bytes(magic)),
                  "no fatbin magic"),
        "header": (put("header.fatbin", bytes(header)), len(img), image_hash(bytes(header)),
                   "its header says"),
        "hash": (put("hash.fatbin", bytes(flipped)), len(img), h, "does not match the app's hash"),
    }
    return r.bad


def test_module_files_the_worker_refuses(mod_worker):
    """Each bad file is refused softly: the ring goes on, the reason is in the log, and
    the DEFINE naming that module is refused in the page (it says why)."""
    r = mod_worker
    app = FakeApp(r, 5)
    try:
        cases = bad_files(r)
        for mid, (path, size, h, _) in enumerate(cases.values()):
            app.send(fwd.module(mid, size, h, str(path).encode()))
            app.send(fwd.define(mid, VECADD, VECADD_PARAMS, 28, mid))
        assert app.errors() == []
        app.verdicts(len(cases))
        assert all(app.refused(kid) for kid in range(len(cases)))
        log = r.worker_log(5)
        for mid, (path, _, _, reason) in enumerate(cases.values()):
            pat = rf"app fakeapp .*module file {re.escape(str(path))} refused: .*{reason}"
            assert re.search(pat, log), (path, log)
            assert f"kernel {mid} refused, the app runs it locally: kernel " \
                   f"{VECADD.decode()}: its module {mid} was refused" in log, log
        # out of the protocol's range: a malformed frame
        app.send(fwd.module(MAX_MODULES, len(r.image), 0, str(r.good).encode()))
        assert [c for c, _ in app.errors()] == [lib.FWD_E_MALFORMED]
    finally:
        app.close()
    assert r.stats(5)["modules"] == 0


def test_module_path_with_a_nul_byte_is_malformed(mod_worker):
    """Opened as a C string, "<good file>\\0junk" would load the good file:
    the frame is malformed instead."""
    r = mod_worker
    app = FakeApp(r, 5, name="nulpath")
    try:
        app.send(fwd.module(0, len(r.image), image_hash(r.image), str(r.good).encode() + b"\0/x"))
        errs = app.errors()
        assert [c for c, _ in errs] == [lib.FWD_E_MALFORMED] and "NUL byte in the module path" in errs[0][1]
        app.send(fwd.define(0, VECADD + b"\0x", VECADD_PARAMS, 28, 0))
        errs = app.errors()
        assert [c for c, _ in errs] == [lib.FWD_E_MALFORMED] and "NUL byte in the kernel name" in errs[0][1]
        assert app.page("defines_done") == 0
    finally:
        app.close()
    assert r.stats(5)["modules"] <= 1


def test_defines_against_a_module(mod_worker):
    """DEFINE takes the kernel from the module its mid names: a mid never
    shipped, a name not in the module, a layout other than the module's and
    a DEFINE without a module are refused (softly: in the page, the reason
    in the log); the right one runs."""
    r = mod_worker
    app = FakeApp(r, 5, name="defines", twins=str(BIN / "vecadd.twins.so"))
    try:
        before = r.stats(5)["forwarded"]
        good = fwd.module(3, len(r.image), image_hash(r.image), str(r.good).encode())
        app.send(good)
        app.send(good)                    # the same module again: fine
        assert app.errors() == []
        wrong = [(0, 8), (8, 8), (16, 8), (24, 8)]
        app.send(fwd.define(0, VECADD, VECADD_PARAMS, 28, 4))             # module 4 never shipped
        app.send(fwd.define(1, b"_Z7missingv", [(0, 8)], 8, 3))           # not in the module
        app.send(fwd.define(2, VECADD, wrong, 32, 3))                     # another layout
        app.send(fwd.define(3, VECADD, VECADD_PARAMS[:3], 24, 3))         # a parameter short
        app.send(fwd.define(4, VECADD, VECADD_PARAMS, 28, NO_MODULE))     # by name: not here
        assert app.errors() == []
        app.verdicts(5)
        assert [app.refused(k) for k in range(5)] == [True] * 5
        log = r.worker_log(5)
        msgs = [re.search(rf"app defines .*: kernel {k} refused, the app runs it locally: (.*)$",
                          log, re.M)
                for k in range(5)]
        assert all(msgs), log
        msgs = [m.group(1) for m in msgs]
        assert "module 4 was not shipped" in msgs[0]
        assert f"_Z7missingv is not in module file {r.good}" in msgs[1]
        assert "cudaErrorSymbolNotFound" in msgs[1]
        assert "parameter 3 is not what the app says (layout mismatch)" in msgs[2]
        assert "parameter 3 is not what the app says" in msgs[3]
        assert "comes without a module" in msgs[4] and "COLOCATE_WORKER_BY_NAME=0" in msgs[4]
        app.send(fwd.define(5, VECADD, VECADD_PARAMS, 28, 3))
        app.verdicts(6)
        assert not app.refused(5)
        for seq in (1, 2, 3):             # vecadd with n = 0 touches no memory
            app.send(fwd.launch(seq, 5, struct.pack("<QQQi", 0, 0, 0, 0)))
        assert app.errors() == []
        end = time.monotonic() + 5
        while app.page("done") != 3:
            assert time.monotonic() < end, "launches did not complete"
            time.sleep(0.002)
        assert app.page("executed") == 3
        # a launch of a refused kernel is malformed: the shim never sends one
        app.send(fwd.launch(4, 1, struct.pack("<Q", 0)))
        assert [c for c, _ in app.errors()] == [4]          # FWD_E_UNKNOWN_KERNEL
        s = r.stats(5)
        assert s["forwarded"] == before + 3 and s["modules"] >= 1
    finally:
        app.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mid=st.one_of(st.integers(0, MAX_MODULES + 2), st.just(NO_MODULE), st.integers(0, 2**32 - 1)),
       size=st.one_of(st.just(-1), st.integers(0, 2**64 - 1), st.integers(0, 1 << 20)),
       hash_=st.one_of(st.just(-1), st.integers(0, 2**64 - 1)),
       path=st.one_of(st.sampled_from(["good", "symlink", "short", "hash", "magic", "header",
                                       "missing", "directory", "/etc/passwd", "/dev/zero", "",
                                       "/proc/self/mem"]),
                      st.binary(max_size=80).map(lambda b: b.decode("latin-1"))),
       skew=st.sampled_from([0, 0, 0, -1, 1, -40]),
       dmid=st.one_of(st.integers(0, 8), st.just(NO_MODULE), st.integers(0, 2**32 - 1)),
       kid=st.integers(0, 4100),
       name=st.one_of(st.just(VECADD), st.binary(min_size=0, max_size=40)),
       params=st.lists(st.tuples(st.integers(0, 64), st.integers(0, 16)), max_size=6))
def test_fuzz_module_and_define_frames(mod_worker, mid, size, hash_, path, skew, dmid, kid, name,
                                       params):
    """MODULE frames with any id, size, hash and path (sound files, damaged
    ones, devices, garbage), then a DEFINE naming any module: each is taken
    or refused (the ring stopped: malformed), and the worker stays up."""
    r = mod_worker
    app = fuzz_app(r)
    files = {k: str(v[0]) for k, v in bad_files(r).items()} | {"good": str(r.good)}
    p = files.get(path, path).encode("latin-1")
    size = len(r.image) if size < 0 else size
    hash_ = image_hash(r.image) if hash_ < 0 else hash_
    app.send(fwd.module(mid, size, hash_, p, skew))
    argbytes = max([o + n for o, n in params] + [0])
    app.send(fwd.define(kid, name, params, argbytes, dmid))
    for code, msg in app.errors():
        assert code in (lib.FWD_E_MALFORMED, lib.FWD_E_MODULE), (code, msg)
    assert r.workers[5].poll() is None


_fuzz_app: dict[int, FakeApp] = {}


def fuzz_app(r: Rig) -> FakeApp:
    """One connection for every example (a HELLO each would be slow)."""
    if id(r) not in _fuzz_app:
        _fuzz_app.clear()
        _fuzz_app[id(r)] = FakeApp(r, 5, name="modfuzz", twins=str(BIN / "vecadd.twins.so"))
    return _fuzz_app[id(r)]


def test_worker_survives_module_fuzzing(mod_worker):
    r = mod_worker
    assert r.workers[5].poll() is None
    s = r.stats(5)
    assert s["state"] == "ready" and s["bad_frames"] > 0
    assert s["modules"] <= 1 and s["module_loads"] <= 1     # one sound image among them
    for app in _fuzz_app.values():
        app.close()
    _fuzz_app.clear()


# ---------------------------------------------------------------- simgpu's cudaLibrary* API


LIBLOAD_C = r"""
/* libload FATBIN: cudaLibraryLoadData on a fat binary, vecadd taken from it
 * by name and launched, and the errors of the library API. */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
	printf("FAIL %s: %s\n", #x, cudaGetErrorName(e_)); return 1; } } while (0)
#define EXPECT(c) do { if (!(c)) { printf("FAIL %s (line %d)\n", #c, __LINE__); return 1; } } while (0)

static unsigned char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	unsigned char *b;
	long len;

	if (!f || fseek(f, 0, SEEK_END) < 0 || (len = ftell(f)) <= 0 || fseek(f, 0, SEEK_SET) < 0)
		return NULL;
	b = malloc((size_t)len);
	if (!b || fread(b, 1, (size_t)len, f) != (size_t)len)
		return NULL;
	fclose(f);
	*n = (size_t)len;
	return b;
}

static int load(cudaLibrary_t *lib, const unsigned char *img)
{
	int e = cudaLibraryLoadData(lib, img, NULL, NULL, 0, NULL, NULL, 0);

	cudaGetLastError();
	return e;
}

int main(int argc, char **argv)
{
	const char *name = "_Z6vecaddPKfS0_Pfi";
	enum { N = 1000 };
	float a[N], b[N], c[N], *da, *db, *dc;
	unsigned char *img, *bad;
	cudaLibrary_t lib, lib2;
	cudaKernel_t k, other, all[8];
	unsigned count, i;
	size_t n, off, size;
	uint32_t eh;
	const char *got;
	int nn = N;

	if (argc != 2 || !(img = slurp(argv[1], &n)))
		return 2;
	CK(cudaLibraryLoadData(&lib, img, NULL, NULL, 0, NULL, NULL, 0));
	CK(cudaLibraryGetKernelCount(&count, lib));
	EXPECT(count == 1);
	CK(cudaLibraryEnumerateKernels(all, 8, lib));
	CK(cudaLibraryGetKernel(&k, lib, name));
	EXPECT(all[0] == k);
	CK(cudaFuncGetName(&got, (const void *)k));
	EXPECT(strcmp(got, name) == 0);
	for (i = 0; cudaFuncGetParamInfo((const void *)k, i, &off, &size) == cudaSuccess; i++)
		printf("PARAM %u %zu %zu\n", i, off, size);
	cudaGetLastError();
	memset(img, 0, n);                       /* the caller's buffer may go once loaded */
	for (i = 0; i < N; i++) {
		a[i] = (float)i;
		b[i] = 2.0f * (float)i + 0.5f;
	}
	CK(cudaMalloc((void **)&da, sizeof(a)));
	CK(cudaMalloc((void **)&db, sizeof(b)));
	CK(cudaMalloc((void **)&dc, sizeof(c)));
	CK(cudaMemcpy(da, a, sizeof(a), cudaMemcpyHostToDevice));
	CK(cudaMemcpy(db, b, sizeof(b), cudaMemcpyHostToDevice));
	{
		void *args[] = { &da, &db, &dc, &nn };
		dim3 g = { (N + 127) / 128, 1, 1 }, bl = { 128, 1, 1 };

		CK(cudaLaunchKernel((const void *)k, g, bl, args, 0, 0));
	}
	CK(cudaMemcpy(c, dc, sizeof(c), cudaMemcpyDeviceToHost));
	for (i = 0; i < N; i++)
		EXPECT(c[i] == a[i] + b[i]);
	printf("RESULT ok\n");

	/* errors, as the real runtime gives them */
	EXPECT(cudaLibraryGetKernel(&other, lib, "_Z7nothingv") == cudaErrorSymbolNotFound);
	EXPECT(cudaGetLastError() == cudaErrorSymbolNotFound);
	free(img);
	img = slurp(argv[1], &n);
	bad = malloc(n);
	memcpy(bad, img, n);
	bad[0] ^= 0xff;                                     /* the fatbin magic */
	printf("DAMAGED magic %d\n", load(&lib2, bad));
	memcpy(bad, img, n);
	memcpy(&eh, img + 16 + 4, 4);
	memset(bad + 16 + 4, 0, 4);                         /* an entry header of 0 bytes */
	bad[16 + 4] = 8;
	printf("DAMAGED entry %d\n", load(&lib2, bad));
	memcpy(bad, img, n);
	bad[16 + eh + 1] = 'X';                             /* the cubin's ELF magic */
	printf("DAMAGED elf %d\n", load(&lib2, bad));
	memcpy(bad, img, n);
	memset(bad + 16 + eh + 0x3c, 0xff, 2);              /* e_shnum: headers past the end */
	printf("DAMAGED sections %d\n", load(&lib2, bad));
	CK(cudaLibraryUnload(lib));
	EXPECT(cudaLibraryGetKernel(&other, lib, name) == cudaErrorInvalidResourceHandle);
	cudaGetLastError();
	{
		void *args[] = { &da, &db, &dc, &nn };
		dim3 g = { 1, 1, 1 }, bl = { 32, 1, 1 };

		EXPECT(cudaLaunchKernel((const void *)k, g, bl, args, 0, 0) ==
		       cudaErrorInvalidDeviceFunction);
	}
	printf("PASS libload\n");
	return 0;
}
"""


def test_simgpu_library_api(tmp_path):
    cuda = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    if not (cuda / "include" / "cuda_runtime_api.h").exists() or not shutil.which("cc"):
        pytest.skip("CUDA headers or cc missing")
    (tmp_path / "libload.c").write_text(LIBLOAD_C)
    subprocess.run(["cc", "-O2", "-Wall", "-I", str(cuda / "include"), "-o", "libload", "libload.c",
                    "-L", str(cuda / "lib64"), "-lcudart"], cwd=tmp_path, check=True)
    image = module_of(BIN / "vecadd", VECADD)
    (tmp_path / "vecadd.fatbin").write_bytes(image)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIMGPU_", "COLOCATE_"))}
    env.update(LD_LIBRARY_PATH=str(paths.SIMGPU_DIR), SIMGPU_DIR=str(tmp_path / "sim"),
               SIMGPU_TWINS=str(BIN / "vecadd.twins.so"), SIMGPU_TIMESCALE="0")
    res = subprocess.run([str(tmp_path / "libload"), str(tmp_path / "vecadd.fatbin")], env=env,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and "PASS libload" in res.stdout, res.stdout + res.stderr
    assert re.findall(r"^PARAM (.*)$", res.stdout, re.M) == ["0 0 8", "1 8 8", "2 16 8", "3 24 4"]
    assert "RESULT ok" in res.stdout
    damaged = dict(re.findall(r"^DAMAGED (\w+) (\d+)$", res.stdout, re.M))
    # cudaErrorInvalidKernelImage for each
    assert damaged == {k: "200" for k in ("magic", "entry", "elf", "sections")}


def test_a_module_with_device_variables_stays_in_the_app(rig):
    """vecadd's module defines a __device__ variable: a worker that runs
    kernels as a GPU does would use its own copy of it, so it refuses the
    module (softly: the app's kernels run locally, correctly); a simgpu
    worker (twins never read device variables) takes it."""
    by_module_worker(rig, 1)
    rig.start_worker(2, 40)
    out, err, c = rig.run("vecadd", "--symbol", "--repeat", "5", routes=1)
    assert "PASS vecadd" in out, out + err
    assert c["launches"] == 5 and c["forwarded"] == 0, c
    assert "has __device__/__constant__ variables" in rig.worker_log(1)
    assert "lost" not in err and "failure" not in err, err
    out, err, c = rig.run("vecadd", "--symbol", "--repeat", "5", routes=2)
    assert "PASS vecadd" in out and c["forwarded"] == 5, (c, err)
