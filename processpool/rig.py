"""A launch-forwarding rig: a private runtime dir with a control block, a
stand-in controller (it only answers "register" and claims a slot, so a
caller writes routes directly, as the real controller would) and
process-pool workers started with the pool's contract.

bench/forwarding.py measures with it and the forwarding tests drive it;
programs come from bench/bin of the checkout (BIN).
"""
from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import zmq

from processpool.mps import Mps
from shim import paths
from shim.ctlblock import ControlBlock, is_partition, stop_flag
from shim.launcher import libzmq_path

BIN = Path(__file__).resolve().parent.parent / "bench" / "bin"
WORKER = paths.LIB_DIR / "colocate-worker"


class Rig:
    """A runtime dir with a control block, a stand-in controller and workers."""

    def __init__(self, timescale: str = "0", device: str = "sim", workers: bool = True):
        """workers=False on cuda: no MPS daemon (apps only, on partitions or
        local: bench/partitions.py --device cuda)."""
        self.dir = Path(tempfile.mkdtemp(prefix="cf-", dir="/tmp"))   # short: ipc paths
        self.device = device
        self.mps: Mps | None = None
        self.cb = ControlBlock.create(self.dir / "ctlblock")
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("COLOCATE_", "SIMGPU_", "CUDA_MPS_")) and k != "LD_PRELOAD"}
        self.env.update(COLOCATE_LIBZMQ=libzmq_path() or "", COLOCATE_RUNTIME_DIR=str(self.dir))
        self.worker_env: dict[str, str] = {}
        self.fast: dict[str, str] = {}      # a local run on a full-speed device of its own
        if device == "cuda" and workers:
            # workers are MPS clients, apps are not (as under `colocate
            # run`); a GPU worker takes only apps whose memory is VMM-shared
            self.mps = Mps(self.dir)
            print(f"forwarding: {self.mps.ensure()}", file=sys.stderr)
            self.worker_env = self.mps.env()
            self.env.update(COLOCATE_MEM="vmm")
        elif device != "cuda":
            self.env.update(LD_LIBRARY_PATH=str(paths.SIMGPU_DIR), SIMGPU_DIR=str(self.dir / "sim"),
                            SIMGPU_TIMESCALE=timescale)
            self.fast = {"SIMGPU_TIMESCALE": "0", "SIMGPU_DIR": str(self.dir / "sim-fast")}
        self.slots: dict[int, int] = {}
        # the route the next app to register gets before its registration is
        # answered, so that even its first launch follows it (run(routes=N))
        self.route_at_register: int | None = None
        self.last_slot = -1                      # the slot of the last run() app
        self.route_every: int | None = None        # the same for every app, until reset
        self.workers: dict[int, subprocess.Popen] = {}
        self.ctx = zmq.Context()
        self._stop = threading.Event()
        self._router = self.ctx.socket(zmq.ROUTER)
        self._router.bind(f"ipc://{self.dir}/ctl.sock")
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._router.poll(20):
                continue
            frames = self._router.recv_multipart()
            msg = json.loads(frames[-1])
            if msg.get("type") == "register":
                slot = self.cb.claim(msg["pid"])
                route, self.route_at_register = self.route_at_register, None
                route = self.route_every if route is None else route
                if route is not None:
                    self.cb.set_route(slot, route, 50)
                self.slots[msg["pid"]] = slot
                reply = {"v": 1, "type": "registered", "slot": slot, "quota_pct": 100,
                         "route": 0, "controller_pid": os.getpid()}
                if route is not None and is_partition(route):
                    reply["partitions"] = True     # as `serve --route partition` says
            else:
                reply = {"v": 1, "type": "ok"}
            self._router.send_multipart([frames[0], b"", json.dumps(reply).encode()])

    def start_worker(self, wid: int, quota: int) -> subprocess.Popen:
        env = {**self.env, **self.worker_env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(quota)}
        p = subprocess.Popen([str(WORKER), "--id", str(wid), "--quota", str(quota),
                              "--runtime-dir", str(self.dir)], env=env, stdout=subprocess.PIPE,
                             stderr=open(self.dir / f"worker-{wid}.err", "wb"))
        assert p.stdout is not None                        # stdout=PIPE
        if not select.select([p.stdout], [], [], 10)[0]:
            p.kill()
            raise RuntimeError(f"worker {wid} did not start: {self.worker_log(wid)}")
        line = p.stdout.readline().decode()
        if line != f"READY worker {wid} quota {quota} pid {p.pid}\n":
            raise RuntimeError(f"worker {wid}: unexpected first line {line!r}")
        self.workers[wid] = p
        return p

    def worker_log(self, wid: int) -> str:
        return (self.dir / f"worker-{wid}.err").read_text(errors="replace")

    def request(self, wid: int, *frames: bytes, timeout: float = 3.0) -> list[bytes]:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"ipc://{self.dir}/worker-{wid}.sock")
        try:
            s.send_multipart(list(frames))
            if not s.poll(int(timeout * 1000)):
                raise TimeoutError(f"worker {wid} did not answer")
            return s.recv_multipart()
        finally:
            s.close()

    def stats(self, wid: int) -> dict:
        return json.loads(self.request(wid, b"", b'{"v":1,"type":"stats"}')[-1])

    def app(self, prog: str, *args: str, **env: str) -> subprocess.Popen:
        return subprocess.Popen([str(BIN / prog), *args],
                                env={**self.env, "LD_PRELOAD": str(paths.LIBCOLOCATE), **env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def slot_of(self, proc: subprocess.Popen, timeout: float = 5.0) -> int:
        end = time.monotonic() + timeout
        while proc.pid not in self.slots:
            if time.monotonic() > end or proc.poll() is not None:
                raise RuntimeError("app did not register")
            time.sleep(0.0005)
        return self.slots[proc.pid]

    def run(self, prog: str, *args: str, routes=None, period: float = 0.03, timeout: float = 120,
            flips: list | None = None, **env: str) -> tuple[str, str, dict]:
        """Run an app to its end.  routes: None (local), a worker id (set
        before its registration is answered, so before its first launch; one
        app at a time), or a list cycled every `period` s while it runs;
        flips, if given, collects (monotonic ns before the write, route,
        monotonic ns just after its publishing store) of each change
        (ControlBlock.flip_routes).  Returns stdout, stderr, final
        counters."""
        if isinstance(routes, int):
            self.route_at_register = routes
        p = self.app(prog, *args, **env)
        slot = self.last_slot = self.slot_of(p)
        flipper = None
        if routes and not isinstance(routes, int):
            stop = stop_flag()
            made: list[tuple[int, int, int]] = []
            failed: list[BaseException] = []

            # the flipper writes from C (ControlBlock.flip_routes), with the
            # write's end stamped there: on two cores a Python thread waking
            # for each write and going back to sleep after it delayed the
            # app's next launch by 10-20 us, which the switch figures counted
            def flip() -> None:
                try:
                    made.extend(self.cb.flip_routes(slot, list(routes), 50, period, stop,
                                                    int(timeout / period) + 2))
                except BaseException as e:      # raised in run(), not lost with the thread
                    failed.append(e)
            flipper = threading.Thread(target=flip, daemon=True)
            flipper.start()
        try:
            out, err = p.communicate(timeout=timeout)
        finally:
            if flipper is not None:     # done with the control block before the caller may close it
                stop[0] = 1
                flipper.join()
                if flips is not None:
                    flips.extend(made)
        if flipper is not None and failed:
            raise RuntimeError(f"the route flipper failed: {failed[0]}") from failed[0]
        if p.returncode != 0:
            raise RuntimeError(f"{prog} exited {p.returncode}:\n{out}\n{err}")
        return out, err, self.cb.counters(slot)

    def close(self) -> None:
        for p in self.workers.values():
            if p.poll() is None:
                p.kill()
            p.wait()
            if p.stdout is not None:
                p.stdout.close()
        self._stop.set()
        self._thread.join()
        self._router.close(0)
        self.ctx.destroy(linger=0)     # never hang on a socket a failed test left open
        self.cb.close()
        if self.mps:
            self.mps.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
