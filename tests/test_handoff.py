"""The pipeline hand-off API (shim/include/colocate_handoff.h, shim/handoff.py):
device buffers handed between processes on simgpu by handle, reference
counted, freed when the last stage releases them or dies, a copy where the
importer cannot map them, clear errors for bad handles.

Each stage is an `agent` process on one simulated device (simgpu_env),
driven over stdin/stdout with one JSON request and reply per line."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import PY, ROOT, ensure_simgpu, simgpu_env

from shim import handoff as H

AGENT = r'''
import ctypes, json, os, sys, time, zlib
import numpy as np
from shim import handoff as H

rt = ctypes.CDLL("libcudart.so.13")          # simgpu's, by LD_LIBRARY_PATH
ex = imp = None
bufs, views = {}, {}

def used():
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) == 0
    return total.value - free.value

def do(q):
    global ex, imp
    op = q["op"]
    if op == "exporter":
        ex = H.Exporter(q["dir"], prepaid_timeout_s=q.get("prepaid_timeout_s")); return {"path": ex.path}
    if op == "alloc":
        b = ex.alloc(q["n"], vmm=q.get("vmm", False)); bufs[b.ptr] = b
        a = b.numpy(np.uint8); a[:] = np.arange(a.size, dtype=np.uint64).astype(np.uint8) ^ q.get("seed", 0)
        crc = zlib.crc32(a); del a
        return {"ptr": b.ptr, "crc": crc}
    if op == "export":
        kw = {"consumers": q["consumers"]} if "consumers" in q else {}
        return {"handle": ex.export(bufs[q["ptr"]], **kw).hex()}
    if op == "export_drop":                   # the header's example: send, then drop at once
        h = ex.export(bufs[q["ptr"]], consumers=q.get("consumers", 1)).hex()
        ex.drop(bufs.pop(q["ptr"])); return {"handle": h}
    if op == "revoke":
        return {"n": ex.revoke(q["ptr"])}
    if op == "hstats":
        return ex.hold_stats()
    if op == "trim":
        imp_ = imp or H.Importer(); t0 = time.monotonic_ns()
        return {"n": imp_.trim(all=q.get("all", False)), "t0": t0}
    if op == "close_exporter":
        ex.close(wait_s=q.get("wait", 0.0)); return {}
    if op == "lasterr":                       # the runtime's last error, as the app would see it
        return {"err": rt.cudaGetLastError()}
    if op == "drop":
        ex.drop(bufs.pop(q["ptr"])); return {}
    if op == "refs":
        return {"refs": ex.refs(q["ptr"])}
    if op == "estats":
        return ex.stats()
    if op == "crc_buf":
        return {"crc": zlib.crc32(bufs[q["ptr"]].numpy())}
    if op == "open":
        imp = imp or H.Importer()
        v = imp.open(bytes.fromhex(q["handle"]), expect_size=q.get("expect", 0), copy=q.get("copy", False),
                     host=q.get("host", False))
        views.setdefault(v.ptr, []).append(v)     # two views of one buffer: one pointer
        return {"ptr": v.ptr, "how": v.how, "size": v.size}
    if op == "crc_view":
        return {"crc": zlib.crc32(views[q["ptr"]][-1].numpy())}
    if op == "write_view":
        a = views[q["ptr"]][-1].numpy(); a[:] = q["byte"]; del a; return {}
    if op == "alive":
        return {"alive": views[q["ptr"]][-1].alive()}
    if op == "release":
        vs = views[q["ptr"]]; v = vs.pop()
        if not vs:
            del views[q["ptr"]]
        return {"exporter_alive": v.release()}
    if op == "istats":
        return imp.stats()
    if op == "cstats":
        return imp.cache_stats()
    if op == "remote_refs":
        return {"refs": H.remote_refs(bytes.fromhex(q["handle"]))}
    if op == "used":
        return {"used": used()}
    if op == "probe":                         # a fresh slot: simgpu reclaims dead ones
        p = ctypes.c_void_p(); assert rt.cudaMalloc(ctypes.byref(p), 1 << 20) == 0
        u = used(); rt.cudaFree(p); return {"used": u}
    if op == "app_malloc":                    # the app's cudaMalloc: a preloaded shim's hook, if any
        p = ctypes.c_void_p(); assert ctypes.CDLL(None).cudaMalloc(ctypes.byref(p), q["n"]) == 0
        return {"ptr": p.value}
    if op == "export_ptr":
        return {"handle": ex.export_pointer(q["ptr"], q["n"]).hex()}
    if op == "kind":
        return {"kind": H.parse(bytes.fromhex(q["handle"]))["kind"]}
    if op == "fds":
        return {"fds": len(os.listdir("/proc/self/fd"))}
    raise ValueError(op)

for line in sys.stdin:
    q = json.loads(line)
    try:
        r = {"ok": True, **do(q)}
    except H.HandoffError as e:
        r = {"ok": False, "code": e.code, "name": e.name, "msg": str(e)}
    print(json.dumps(r), flush=True)
'''

MIB = 1 << 20


class Agent:
    """One stage process; call(op, ...) returns its reply (a dict)."""

    def __init__(self, script: Path, env: dict[str, str]):
        self.p = subprocess.Popen([PY, str(script)], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def call(self, op: str, **kw: object) -> dict:
        assert self.p.stdin and self.p.stdout
        self.p.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        assert line, f"agent died: {self.p.wait(5)} {self.p.stderr.read() if self.p.stderr else ''}"
        return json.loads(line)

    def ok(self, op: str, **kw: object) -> dict:
        r = self.call(op, **kw)
        assert r["ok"], r
        return r

    def kill(self) -> None:
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(10)

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    ensure_simgpu()
    from shim.build import build_native
    build_native()                                # libcolocate_handoff.so up to date
    p = tmp_path_factory.mktemp("handoff") / "agent.py"
    p.write_text(AGENT)
    return p


@pytest.fixture
def stages(script, simdir):
    """agent(simdir=None) starts a stage on the test's device (or another)."""
    rd = tempfile.mkdtemp(prefix="hf-", dir="/tmp")     # short: socket paths <= 107 bytes
    started: list[Agent] = []

    def agent(device_dir: str | None = None, **extra: str) -> Agent:
        a = Agent(script, simgpu_env(device_dir or simdir, **extra))
        started.append(a)
        return a

    agent.rundir = rd  # type: ignore[attr-defined]
    yield agent
    for a in started:
        a.close()
    shutil.rmtree(rd, ignore_errors=True)


def exporter_with_buffer(stages, n: int = MIB, vmm: bool = False) -> tuple[Agent, int, int, str]:
    e = stages()
    e.ok("exporter", dir=stages.rundir)
    b = e.ok("alloc", n=n, vmm=vmm, seed=5)
    h = e.ok("export", ptr=b["ptr"])["handle"]
    return e, b["ptr"], b["crc"], h


def wait_for(fn, timeout: float = 5.0):
    end = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() > end:
            return v
        time.sleep(0.02)


# ---------------------------------------------------------------- round trip


@pytest.mark.parametrize("vmm", [False, True], ids=["cuda-ipc", "vmm-fd"])
def test_round_trip_zero_copy_refcounted(stages, vmm):
    e, ptr, crc, h = exporter_with_buffer(stages, vmm=vmm)
    base_used = e.ok("used")["used"]
    i = stages()
    v1 = i.ok("open", handle=h, expect=MIB)
    assert v1["how"] == "mapped" and v1["size"] == MIB
    assert i.ok("crc_view", ptr=v1["ptr"])["crc"] == crc          # the exporter's data
    assert e.ok("refs", ptr=ptr)["refs"] == 1
    assert i.ok("remote_refs", handle=h)["refs"] == 1
    if not vmm:
        assert v1["ptr"] == ptr            # simgpu: one address space per device
    # zero copy: what the importer writes, the exporter reads
    i.ok("write_view", ptr=v1["ptr"], byte=0xAB)
    assert e.ok("crc_buf", ptr=ptr)["crc"] == i.ok("crc_view", ptr=v1["ptr"])["crc"]
    # a second view of the same buffer in another importer: two references
    i2 = stages()
    v2 = i2.ok("open", handle=h)
    assert e.ok("refs", ptr=ptr)["refs"] == 2
    assert e.ok("estats")["connections"] == 2
    # the exporter drops its own reference: the buffer lives on for the importers
    e.ok("drop", ptr=ptr)
    st = e.ok("estats")
    assert st["live_buffers"] == 1 and st["held_refs"] == 2 and st["frees"] == 0
    assert i.ok("release", ptr=v1["ptr"])["exporter_alive"] is True
    assert e.ok("estats")["live_buffers"] == 1
    assert i2.ok("release", ptr=v2["ptr"])["exporter_alive"] is True
    # a release after the exporter's drop is a one-way message (the exporter
    # frees the buffer when its service thread reads it): the counts settle
    def settled():
        st = e.ok("estats")
        return (st["live_buffers"], st["held_refs"], st["frees"], st["releases"])
    assert wait_for(lambda: settled() == (0, 0, 1, 2)), settled()
    # each importer keeps its connection idle for the next handle: no reference on it
    assert i.ok("istats") == {"ok": True, "open_views": 0, "connections": 1, "maps": 1, "copies": 0,
                              "copy_bytes": 0, "gone": 0}
    if not vmm:                            # simgpu accounts cudaMalloc memory, not VMM memfds
        assert e.ok("used")["used"] == base_used - MIB
    # the freed buffer's handle is stale now
    r = i.call("open", handle=h)
    assert not r["ok"] and r["name"] == "E_STALE" and "freed" in r["msg"]


def test_same_process_open_gives_own_pointer(stages):
    e, ptr, crc, h = exporter_with_buffer(stages)
    r = e.ok("open", handle=h)
    assert (r["how"], r["ptr"]) == ("same-process", ptr)
    assert e.ok("refs", ptr=ptr)["refs"] == 1
    e.ok("release", ptr=ptr)
    # the release may be a one-way message its own service thread reads
    # later (handoff_import.c): wait for the count (failed once at once
    # under `pytest -n 4` on 2 cores: refs 1)
    assert wait_for(lambda: e.ok("refs", ptr=ptr)["refs"] == 0), e.ok("refs", ptr=ptr)


def test_under_the_shim_with_vmm_memory(stages):
    """COLOCATE_MEM=vmm: the app's cudaMalloc (the shim's) gives VMM memory
    that cudaIpcGetMemHandle cannot export.  alloc() sees that and makes a
    buffer shared by fd instead; exporting the shim's own pointer needs
    cuMemRetainAllocationHandle, which simgpu lacks: a clear error."""
    from shim import paths
    shim_env = {"LD_PRELOAD": str(paths.LIBCOLOCATE), "COLOCATE_MEM": "vmm", "COLOCATE_QUIET": "1",
                "COLOCATE_RUNTIME_DIR": stages.rundir}
    e = stages(**shim_env)
    e.ok("exporter", dir=stages.rundir)
    b = e.ok("alloc", n=MIB, seed=3)
    assert e.ok("lasterr")["err"] == 0        # cudaIpcGetMemHandle's expected failure, cleared
    h = e.ok("export", ptr=b["ptr"])["handle"]
    assert e.ok("kind", handle=h)["kind"] == "fd"
    i = stages(**shim_env)
    v = i.ok("open", handle=h)
    assert v["how"] == "mapped" and i.ok("crc_view", ptr=v["ptr"])["crc"] == b["crc"]
    assert i.ok("release", ptr=v["ptr"])["exporter_alive"] is True
    p = e.ok("app_malloc", n=MIB)["ptr"]
    r = e.call("export_ptr", ptr=p, n=MIB)
    assert not r["ok"] and r["name"] == "E_UNSUPPORTED" and "cuMemRetainAllocationHandle" in r["msg"]


# ---------------------------------------------------------------- the fast path and kept mappings


def test_kept_mapping_reused_without_round_trips(stages):
    """A buffer handed over again and again is mapped once, and its
    references taken and given back in shared memory, still counted."""
    e, ptr, crc, h = exporter_with_buffer(stages)
    i = stages()
    for _ in range(3):
        v = i.ok("open", handle=h, expect=MIB)
        assert v["how"] == "mapped" and i.ok("crc_view", ptr=v["ptr"])["crc"] == crc
        assert e.ok("refs", ptr=ptr)["refs"] == 1
        assert e.ok("estats")["held_refs"] == 1
        assert i.ok("release", ptr=v["ptr"])["exporter_alive"] is True
        assert e.ok("refs", ptr=ptr)["refs"] == 0
    c = i.ok("cstats")
    assert (c["map_calls"], c["hits"], c["cached"], c["unmaps"]) == (1, 2, 1, 0)
    assert (c["fast_acquires"], c["fast_releases"], c["slow_acquires"]) == (3, 3, 0)
    st = e.ok("estats")
    assert (st["acquires"], st["releases"], st["held_refs"]) == (3, 3, 0)
    assert i.ok("istats")["maps"] == 3


def test_kept_mapping_dropped_when_the_buffer_goes(stages):
    """The exporter frees the buffer: the kept mapping goes, and a new
    buffer in the same slot (often at the same address, a new generation)
    is mapped afresh and shows its own data; the old handle is stale."""
    e, ptr, crc, h = exporter_with_buffer(stages)
    i = stages()
    v = i.ok("open", handle=h)
    i.ok("release", ptr=v["ptr"])
    assert i.ok("cstats")["cached"] == 1
    e.ok("drop", ptr=ptr)
    # not freed under the importer's kept mapping (undefined behaviour on a
    # GPU): it goes at the importer's next call, here a trim
    assert e.ok("estats")["live_buffers"] == 1
    assert i.ok("trim")["n"] == 1
    assert wait_for(lambda: e.ok("estats")["live_buffers"] == 0)
    b2 = e.ok("alloc", n=MIB, seed=9)
    h2 = e.ok("export", ptr=b2["ptr"])["handle"]
    assert H.parse(bytes.fromhex(h2))["id"] == H.parse(bytes.fromhex(h))["id"]      # the slot, reused
    v2 = i.ok("open", handle=h2)
    assert i.ok("crc_view", ptr=v2["ptr"])["crc"] == b2["crc"] != crc
    c = i.ok("cstats")
    assert (c["map_calls"], c["hits"], c["unmaps"], c["cached"]) == (2, 0, 1, 1)
    i.ok("release", ptr=v2["ptr"])
    r = i.call("open", handle=h)
    assert not r["ok"] and r["name"] == "E_STALE"
    assert e.ok("refs", ptr=b2["ptr"])["refs"] == 0


@pytest.mark.parametrize("slow", [False, True], ids=["fast", "slow-one-way"])
def test_release_counts_before_a_later_acquire(stages, slow):
    """A release needs no reply (shared memory, or a one-way RELEASE the
    exporter reads in order): still, the exporter has counted it before it
    answers the next request of that importer."""
    e, ptr, crc, h = exporter_with_buffer(stages)
    i = stages(**({"COLOCATE_HANDOFF_SLOW": "1"} if slow else {}))
    for _ in range(20):
        v = i.ok("open", handle=h)
        i.ok("release", ptr=v["ptr"])
    e.ok("drop", ptr=ptr)                     # the exporter's own reference: the last one
    r = i.call("open", handle=h)              # answered after the releases
    assert not r["ok"] and r["name"] == "E_STALE", r
    st = e.ok("estats")
    assert (st["live_buffers"], st["held_refs"], st["frees"], st["acquires"], st["releases"]) == (0, 0, 1, 20, 20)
    c = i.ok("cstats")
    assert c["slow_acquires"] == (20 if slow else 0) and c["fast_acquires"] == (0 if slow else 20)


def test_fast_reference_keeps_a_dropped_buffer_until_released(stages):
    """The exporter drops its reference while an importer holds a fast one:
    the buffer lives on, and the importer's release (a notice to the
    exporter, no reply) frees it."""
    e, ptr, crc, h = exporter_with_buffer(stages)
    i = stages()
    v = i.ok("open", handle=h)
    assert i.ok("cstats")["fast_acquires"] == 1
    e.ok("drop", ptr=ptr)
    assert e.ok("estats")["live_buffers"] == 1
    assert i.ok("crc_view", ptr=v["ptr"])["crc"] == crc
    assert i.ok("release", ptr=v["ptr"])["exporter_alive"] is True
    st = wait_for(lambda: (lambda s: s if s["live_buffers"] == 0 else None)(e.ok("estats")))
    assert st and (st["frees"], st["held_refs"]) == (1, 0), e.ok("estats")
    assert i.ok("cstats")["cached"] == 0      # the kept mapping went with it


# ---------------------------------------------------------------- deaths


@pytest.mark.parametrize("vmm", [False, True], ids=["cuda-ipc", "vmm-fd"])
def test_killed_importer_references_dropped_buffer_freed(stages, vmm):
    e, ptr, crc, h = exporter_with_buffer(stages, vmm=vmm)
    used0 = e.ok("used")["used"]
    i = stages()
    i.ok("open", handle=h)
    i.ok("open", handle=h)                  # two references on one connection
    e.ok("drop", ptr=ptr)
    assert e.ok("estats")["held_refs"] == 2
    i.kill()
    st = wait_for(lambda: (lambda s: s if s["live_buffers"] == 0 else None)(e.ok("estats")))
    assert st, f"buffer not freed after the importer's SIGKILL: {e.ok('estats')}"
    assert (st["held_refs"], st["refs_dropped_dead"], st["frees"], st["connections"]) == (0, 2, 1, 0)
    if not vmm:
        assert e.ok("used")["used"] == used0 - MIB


def test_killed_importer_while_exporter_keeps_its_reference(stages):
    e, ptr, crc, h = exporter_with_buffer(stages)
    i = stages()
    i.ok("open", handle=h)
    i.kill()
    assert wait_for(lambda: e.ok("refs", ptr=ptr)["refs"] == 0)
    assert e.ok("estats")["live_buffers"] == 1          # still the exporter's
    e.ok("drop", ptr=ptr)
    assert e.ok("estats")["live_buffers"] == 0


@pytest.mark.parametrize("vmm", [False, True], ids=["cuda-ipc", "vmm-fd"])
def test_killed_exporter(stages, vmm):
    e, ptr, crc, h = exporter_with_buffer(stages, vmm=vmm)
    i = stages()
    i.ok("used")                            # the runtime's own files opened first
    fds0 = i.ok("fds")["fds"]
    v = i.ok("open", handle=h)
    assert i.ok("alive", ptr=v["ptr"])["alive"] is True
    e.kill()
    assert wait_for(lambda: i.ok("alive", ptr=v["ptr"])["alive"] is False)
    # what the importer had stays readable until it closes it (as CUDA IPC)
    assert i.ok("crc_view", ptr=v["ptr"])["crc"] == crc
    assert i.ok("release", ptr=v["ptr"])["exporter_alive"] is False
    st = i.ok("istats")
    assert (st["open_views"], st["connections"], st["gone"]) == (0, 0, 1)
    assert i.ok("fds")["fds"] == fds0       # no socket, no memfd left behind
    r = i.call("open", handle=h)
    assert not r["ok"] and r["name"] == "E_GONE" and "gone" in r["msg"]
    # the device holds nothing of the dead exporter's: only the probe's 1 MiB
    assert stages().ok("probe")["used"] == MIB


# ---------------------------------------------------------------- copies


def test_copy_fallback_counted(stages, simdir):
    e, ptr, crc, h = exporter_with_buffer(stages)
    i = stages()
    v = i.ok("open", handle=h, host=True)             # a host-only stage
    assert v["how"] == "copy-host"
    assert i.ok("crc_view", ptr=v["ptr"])["crc"] == crc
    v2 = i.ok("open", handle=h, copy=True)
    assert v2["how"] == "copy-device" and v2["ptr"] != ptr
    assert i.ok("crc_view", ptr=v2["ptr"])["crc"] == crc
    i.ok("write_view", ptr=v2["ptr"], byte=1)         # a private copy
    assert e.ok("crc_buf", ptr=ptr)["crc"] == crc
    st = i.ok("istats")
    assert (st["copies"], st["copy_bytes"], st["maps"]) == (2, 2 * MIB, 0)
    assert e.ok("refs", ptr=ptr)["refs"] == 0         # copies hold no reference
    assert e.ok("estats")["copies_served"] == 2
    i.ok("release", ptr=v["ptr"])
    i.ok("release", ptr=v2["ptr"])
    assert i.ok("istats")["open_views"] == 0


def test_another_device_gets_a_counted_copy(stages):
    """An importer on another (simulated) device cannot map the buffer: the
    same call gives it a device copy, counted."""
    e, ptr, crc, h = exporter_with_buffer(stages)
    other = tempfile.mkdtemp(prefix="simgpu-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    try:
        i = stages(other)
        v = i.ok("open", handle=h)
        assert v["how"] == "copy-device"
        assert i.ok("lasterr")["err"] == 0    # the failed mapping was ours, not the app's
        assert i.ok("crc_view", ptr=v["ptr"])["crc"] == crc
        st = i.ok("istats")
        assert (st["copies"], st["copy_bytes"], st["maps"], st["open_views"]) == (1, MIB, 0, 1)
        assert e.ok("refs", ptr=ptr)["refs"] == 0     # the failed mapping's reference went back
        i.ok("release", ptr=v["ptr"])
        i.close()
    finally:
        shutil.rmtree(other, ignore_errors=True)


# ---------------------------------------------------------------- bad handles


def fnv(data: bytes) -> int:
    x = 0xcbf29ce484222325
    for b in data:
        x = ((x ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return x


def reseal(h: bytes, off: int, fmt: str, value: int) -> bytes:
    """h with one field changed and a valid checksum: a forgery the
    checksum cannot catch, so the exporter must."""
    b = bytearray(h)
    struct.pack_into(fmt, b, off, value)
    struct.pack_into("<Q", b, 248, fnv(bytes(b[:248])))
    return bytes(b)


# offsets in struct colocate_handoff_handle
UID, ID, GEN, SIZE = 12, 16, 24, 32


def test_bad_handles_give_clear_errors(stages):
    e, ptr, crc, h = exporter_with_buffer(stages)
    i = stages()
    assert len(bytes.fromhex(h)) == H.HANDLE_BYTES
    raw = bytes.fromhex(h)
    cases = {
        "truncated": (raw[:100], "E_TRUNCATED", r"100 bytes"),
        "garbage": (os.urandom(H.HANDLE_BYTES), "E_FORGED", r"magic"),
        "flipped byte": (raw[:40] + bytes([raw[40] ^ 1]) + raw[41:], "E_FORGED", r"checksum"),
        "another user": (reseal(raw, UID, "<I", os.geteuid() + 1), "E_PERM", r"uid"),
        "forged id": (reseal(raw, ID, "<Q", 77), "E_STALE", r"no buffer 77"),
        "forged generation": (reseal(raw, GEN, "<Q", 12345), "E_STALE", r"freed"),
        "wrong size": (reseal(raw, SIZE, "<Q", 4096), "E_SIZE", r"4096"),
    }
    for name, (data, code, text) in cases.items():
        r = i.call("open", handle=data.hex())
        assert not r["ok"] and r["name"] == code, (name, r)
        assert re.search(text, r["msg"]) and "\n" not in r["msg"], (name, r)
    r = i.call("open", handle=h, expect=MIB + 1)       # not the size the stage expects
    assert not r["ok"] and r["name"] == "E_SIZE"
    # none of it took a reference, nor hurt the exporter: the real one opens
    assert e.ok("refs", ptr=ptr)["refs"] == 0
    assert i.ok("open", handle=h)["how"] == "mapped"


def test_truncated_and_foreign_messages_on_the_socket(stages):
    """The exporter answers a short or garbled request with an error and
    keeps serving (the socket speaks SOCK_SEQPACKET, so a message is never
    glued to the next)."""
    e, ptr, crc, h = exporter_with_buffer(stages)
    path = H.parse(bytes.fromhex(h))["path"]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.settimeout(5)
    s.connect(path)
    for msg in (b"x" * 10, b"\0" * 232, os.urandom(232), b"y" * 4000):
        s.send(msg)
        reply = s.recv(4096)
        assert len(reply) == 232
        status = struct.unpack_from("<i", reply, 32)[0]
        assert status == -9, (msg[:4], status)              # E_PROTO
        assert b"not a hand-off request" in reply
    s.close()
    i = stages()
    assert i.ok("open", handle=h)["how"] == "mapped"
    assert e.ok("refs", ptr=ptr)["refs"] == 1


def test_handle_checks_without_a_device():
    """parse() runs without CUDA: length, magic, checksum, uid, one-line errors."""
    with pytest.raises(H.HandoffError) as ei:
        H.parse(b"\0" * 10)
    assert ei.value.code == -2 and ei.value.name == "E_TRUNCATED" and "\n" not in str(ei.value)
    with pytest.raises(H.HandoffError) as ei:
        H.parse(b"\1" * H.HANDLE_BYTES)
    assert ei.value.name == "E_FORGED"
    with pytest.raises(H.HandoffError) as ei:
        H.open_handle("not bytes")  # type: ignore[arg-type]
    assert ei.value.name == "E_INVAL"


def test_exporter_gone_before_open(stages):
    e, ptr, crc, h = exporter_with_buffer(stages)
    e.kill()
    r = stages().call("open", handle=h)
    assert not r["ok"] and r["name"] == "E_GONE"


# ---------------------------------------------------------------- the C header and the cffi view of it


def test_python_declarations_match_the_header():
    header = (ROOT / "shim" / "include" / "colocate_handoff.h").read_text()
    in_header = set(re.findall(r"\b(colocate_handoff_\w+)\s*\(", header))
    in_cdef = set(re.findall(r"\b(colocate_handoff_\w+)\s*\(", H._CDEF))
    assert in_header == in_cdef
    codes = {int(v): k for k, v in re.findall(r"#define COLOCATE_HANDOFF_(E_\w+)\s+\((-\d+)\)", header)}
    assert codes == H.ERRORS
    assert H._ffi.sizeof("struct colocate_handoff_handle") == H.HANDLE_BYTES
    assert int(re.search(r"COLOCATE_HANDOFF_ABI\s+(\d+)", header).group(1)) == H.ABI
    nm = subprocess.run(["nm", "-D", "--defined-only", str(ROOT / "shim" / "lib" / "libcolocate_handoff.so")],
                        capture_output=True, text=True, check=True).stdout
    assert set(re.findall(r" T (\w+)", nm)) == in_header     # nothing else leaks out


# ---------------------------------------------------------------- never a free under an importer's mapping


def hstat(a: Agent, key: str):
    return lambda: a.ok("hstats")[key]


@pytest.mark.parametrize("vmm", [False, True], ids=["cuda-ipc", "vmm-fd"])
def test_no_free_under_a_kept_mapping(stages, vmm):
    """cudaFree before the importer's cudaIpcCloseMemHandle is undefined
    behaviour: a kept mapping holds the buffer.  The exporter's drop leaves
    it allocated while the importer maps it; the free comes after the
    importer's unmap (a trim here; its next open below), never before."""
    e, ptr, crc, h = exporter_with_buffer(stages, vmm=vmm)
    i = stages()
    v = i.ok("open", handle=h)
    i.ok("release", ptr=v["ptr"])
    assert i.ok("cstats")["cached"] == 1              # still mapped there
    assert e.ok("hstats")["mapped"] == 1
    # a hold, not a reference: the release may be a one-way message the
    # exporter's service thread has not read yet (handoff_import.c)
    assert wait_for(lambda: e.ok("refs", ptr=ptr)["refs"] == 0)
    e.ok("drop", ptr=ptr)
    time.sleep(0.2)                                   # past the exporter's reaping period
    st = e.ok("estats")
    assert (st["live_buffers"], st["frees"]) == (1, 0), st
    t = i.ok("trim")                                  # the importer unmaps: now it may go
    assert t["n"] == 1 and i.ok("cstats")["cached"] == 0
    assert wait_for(lambda: e.ok("estats")["frees"] == 1)
    hs = e.ok("hstats")
    assert hs["frees_after_unmap"] == 1 and hs["last_free_ns"] > t["t0"] and hs["mapped"] == 0
    # at the importer's next open of anything, without being asked
    b2 = e.ok("alloc", n=MIB, seed=7)
    h2 = e.ok("export", ptr=b2["ptr"])["handle"]
    v2 = i.ok("open", handle=h2)
    i.ok("release", ptr=v2["ptr"])
    e.ok("drop", ptr=b2["ptr"])
    time.sleep(0.2)
    assert e.ok("estats")["live_buffers"] == 1        # still mapped by the importer
    b3 = e.ok("alloc", n=MIB, seed=8)
    h3 = e.ok("export", ptr=b3["ptr"])["handle"]
    t0 = time.monotonic_ns()
    v3 = i.ok("open", handle=h3)                      # sweeps b2's mapping first
    assert i.ok("crc_view", ptr=v3["ptr"])["crc"] == b3["crc"]
    assert wait_for(lambda: e.ok("estats")["frees"] == 2)
    hs = e.ok("hstats")
    assert hs["frees_after_unmap"] == 2 and hs["last_free_ns"] > t0
    i.ok("release", ptr=v3["ptr"])


def test_killed_importer_kept_mapping_frees_the_buffer(stages):
    e, ptr, crc, h = exporter_with_buffer(stages)
    used0 = e.ok("used")["used"]
    i = stages()
    v = i.ok("open", handle=h)
    i.ok("release", ptr=v["ptr"])
    e.ok("drop", ptr=ptr)
    assert e.ok("estats")["live_buffers"] == 1
    i.kill()                                          # its mapping goes with it
    assert wait_for(lambda: e.ok("estats")["live_buffers"] == 0)
    assert e.ok("hstats")["mapped"] == 0
    assert e.ok("used")["used"] == used0 - MIB


@pytest.mark.parametrize("view", [False, True], ids=["kept-mapping", "open-view"])
def test_exporter_free_leaves_what_an_importer_maps(stages, view):
    """Freeing the exporter while a live importer still maps a buffer (a
    kept mapping, or an open view) does not cudaFree it: it stays until the
    exporter's process exits.  Buffers nobody maps are freed."""
    e, ptr, crc, h = exporter_with_buffer(stages)
    e.ok("alloc", n=MIB, seed=2)                     # nobody maps this one
    used0 = e.ok("used")["used"]
    i = stages()
    v = i.ok("open", handle=h)
    if not view:
        i.ok("release", ptr=v["ptr"])
    r = e.call("close_exporter", wait=0.05)
    assert r["ok"] if not view else (not r["ok"] and r["name"] == "E_TIMEOUT"), r
    assert e.ok("used")["used"] == used0 - MIB       # `other` freed, the mapped one kept
    if view:
        assert i.ok("crc_view", ptr=v["ptr"])["crc"] == crc
        assert i.ok("release", ptr=v["ptr"])["exporter_alive"] is False
    # the importer unmaps at its next call (the release above, or this trim)
    assert i.ok("trim")["n"] == (0 if view else 1) and i.ok("cstats")["cached"] == 0
    e.kill()
    assert stages().ok("probe")["used"] == MIB       # the exporter's exit frees it


# ---------------------------------------------------------------- pre-paid references (a handle in flight)


@pytest.mark.parametrize("vmm", [False, True], ids=["cuda-ipc", "vmm-fd"])
def test_send_then_drop_at_once(stages, vmm):
    """The header's example: export, send, drop at once.  The handle's
    pre-paid reference keeps the buffer until the consumer opens it."""
    e = stages()
    e.ok("exporter", dir=stages.rundir)
    b = e.ok("alloc", n=MIB, vmm=vmm, seed=4)
    h = e.ok("export_drop", ptr=b["ptr"])["handle"]   # Python's default: consumers=1
    assert e.ok("hstats")["prepaid"] == 1 and e.ok("estats")["live_buffers"] == 1
    time.sleep(0.2)                                   # the consumer comes later
    i = stages()
    v = i.ok("open", handle=h, expect=MIB)
    assert v["how"] == "mapped" and i.ok("crc_view", ptr=v["ptr"])["crc"] == b["crc"]
    hs = e.ok("hstats")
    assert (hs["prepaid"], hs["prepaid_issued"], hs["prepaid_claimed"]) == (0, 1, 1)
    assert e.ok("estats")["held_refs"] == 1
    i.ok("release", ptr=v["ptr"])                     # the last reference (and mapping): freed
    assert wait_for(lambda: e.ok("estats")["live_buffers"] == 0)
    st = e.ok("estats")
    assert (st["frees"], st["held_refs"]) == (1, 0)
    r = i.call("open", handle=h)
    assert not r["ok"] and r["name"] == "E_STALE"


def test_unclaimed_prepaid_reference_expires(stages):
    e = stages()
    e.ok("exporter", dir=stages.rundir, prepaid_timeout_s=1.0)
    used0 = e.ok("used")["used"]
    b = e.ok("alloc", n=MIB, seed=4)
    h = e.ok("export_drop", ptr=b["ptr"])["handle"]
    assert e.ok("estats")["live_buffers"] == 1
    assert wait_for(lambda: e.ok("estats")["live_buffers"] == 0, timeout=8)
    hs = e.ok("hstats")
    assert (hs["prepaid"], hs["prepaid_expired"], hs["prepaid_timeout_ms"]) == (0, 1, 1000)
    assert e.ok("used")["used"] == used0
    r = stages().call("open", handle=h)
    assert not r["ok"] and r["name"] == "E_STALE"


def test_consumer_killed_before_opening_leaks_nothing(stages):
    e = stages()
    e.ok("exporter", dir=stages.rundir, prepaid_timeout_s=2.0)     # longer than a loaded machine's steps below
    used0 = e.ok("used")["used"]
    b = e.ok("alloc", n=MIB, seed=4)
    h = e.ok("export_drop", ptr=b["ptr"])["handle"]
    i = stages()
    assert i.ok("kind", handle=h)["kind"] == "ipc"    # it has the handle...
    i.kill()                                          # ...and dies before opening it
    time.sleep(0.1)
    assert e.ok("estats")["live_buffers"] == 1        # the handle's reference, until the timeout
    assert wait_for(lambda: e.ok("estats")["live_buffers"] == 0, timeout=8)
    assert e.ok("hstats")["prepaid_expired"] == 1 and e.ok("used")["used"] == used0


def test_replayed_handle_claims_no_more_than_paid(stages):
    """Two consumers paid for: two views on one connection claim one; a
    second importer the other; none is left for a replay, which finds the
    buffer freed once its holders are gone."""
    e = stages()
    e.ok("exporter", dir=stages.rundir)
    b = e.ok("alloc", n=MIB, seed=4)
    h = e.ok("export_drop", ptr=b["ptr"], consumers=2)["handle"]
    a = stages()
    va = a.ok("open", handle=h)
    va2 = a.ok("open", handle=h)                      # the same consumer again: no second claim
    assert e.ok("hstats")["prepaid"] == 1
    c = stages()
    vc = c.ok("open", handle=h)
    assert e.ok("hstats")["prepaid"] == 0 and e.ok("hstats")["prepaid_claimed"] == 2
    for ag, vv in ((a, va), (a, va2), (c, vc)):
        ag.ok("release", ptr=vv["ptr"])
    assert wait_for(lambda: e.ok("estats")["live_buffers"] == 0)
    for ag in (a, c, stages()):                       # replays: nothing left to claim
        r = ag.call("open", handle=h)
        assert not r["ok"] and r["name"] == "E_STALE", r
    assert e.ok("hstats")["prepaid_claimed"] == 2


def test_revoke_and_copy_claim(stages):
    """revoke() drops what nobody claimed; a copy (host-only consumer)
    claims like a mapping does."""
    e = stages()
    e.ok("exporter", dir=stages.rundir)
    b = e.ok("alloc", n=MIB, seed=4)
    h = e.ok("export_drop", ptr=b["ptr"])["handle"]
    i = stages()
    v = i.ok("open", handle=h, host=True)
    assert v["how"] == "copy-host" and i.ok("crc_view", ptr=v["ptr"])["crc"] == b["crc"]
    assert wait_for(lambda: e.ok("estats")["live_buffers"] == 0)      # the copy claimed it
    assert e.ok("hstats")["prepaid_claimed"] == 1
    b2 = e.ok("alloc", n=MIB, seed=5)
    e.ok("export", ptr=b2["ptr"])
    assert e.ok("revoke", ptr=b2["ptr"])["n"] == 1
    e.ok("drop", ptr=b2["ptr"])
    assert e.ok("estats")["live_buffers"] == 0
    assert e.ok("hstats")["prepaid_revoked"] == 1


# ---------------------------------------------------------------- no CUDA error left behind


def test_no_cuda_error_left_for_the_app(stages):
    """The library's probes (an entry point simgpu lacks, cudaIpc on
    memory it cannot share) must not leave a last error the app's next
    cudaGetLastError() would report."""
    e = stages()
    assert e.ok("lasterr")["err"] == 0
    e.ok("exporter", dir=stages.rundir)
    b = e.ok("alloc", n=MIB, seed=1)                  # the first: loads the runtime, probes
    assert e.ok("lasterr")["err"] == 0
    h = e.ok("export", ptr=b["ptr"])["handle"]
    bv = e.ok("alloc", n=MIB, vmm=True)
    e.ok("export", ptr=bv["ptr"])
    assert e.ok("lasterr")["err"] == 0
    i = stages()
    v = i.ok("open", handle=h)
    i.ok("release", ptr=v["ptr"])
    v = i.ok("open", handle=h, copy=True)
    i.ok("release", ptr=v["ptr"])
    assert i.ok("lasterr")["err"] == 0
