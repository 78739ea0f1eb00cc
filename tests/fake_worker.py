"""A stand-in for shim/lib/colocate-worker that honours the same contract:

    fake_worker.py --id N --quota Q --runtime-dir DIR
    prints "READY worker N quota Q pid P", serves ROUTER ipc://DIR/worker-N.sock,
    writes DIR/worker-N.pid, answers {"v":1,"type":"stats"}, exits 0 on SIGTERM.

Misbehaviour for tests, chosen by environment:
    FAKE_WORKER_DIE=Q1,Q2   workers at these quotas exit with code 3 before READY
    FAKE_WORKER_HANG=Q1     never print READY
    FAKE_WORKER_MUTE=Q1     READY, but never answer stats
    FAKE_WORKER_IGNORE_TERM=Q1  ignore SIGTERM (stop must SIGKILL it)
It also writes its environment to DIR/worker-N.env (JSON) so tests can check it.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import zmq


def quotas(var: str) -> set[int]:
    return {int(x) for x in os.environ.get(var, "").split(",") if x.strip()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--id", type=int, required=True)
    ap.add_argument("--quota", type=int, required=True)
    ap.add_argument("--runtime-dir", required=True)
    a = ap.parse_args()
    d = a.runtime_dir
    with open(os.path.join(d, f"worker-{a.id}.env"), "w") as f:
        json.dump(dict(os.environ), f)
    print(f"fake worker {a.id} starting (quota {a.quota})", file=sys.stderr, flush=True)
    if a.quota in quotas("FAKE_WORKER_DIE"):
        print("fake worker: dying at once as asked", file=sys.stderr)
        return 3
    stopping = False

    def on_term(sig, frame):
        nonlocal stopping
        stopping = True
    signal.signal(signal.SIGTERM, signal.SIG_IGN if a.quota in quotas("FAKE_WORKER_IGNORE_TERM") else on_term)
    if a.quota in quotas("FAKE_WORKER_HANG"):
        while not stopping:
            time.sleep(0.05)
        return 0
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    s.bind(f"ipc://{d}/worker-{a.id}.sock")
    with open(os.path.join(d, f"worker-{a.id}.pid"), "w") as f:
        f.write(f"{os.getpid()}\n")
    print(f"READY worker {a.id} quota {a.quota} pid {os.getpid()}", flush=True)
    mute = a.quota in quotas("FAKE_WORKER_MUTE")
    peers: set[bytes] = set()
    forwarded = 0
    while not stopping:
        if not s.poll(50):
            continue
        frames = s.recv_multipart()
        ident, body = frames[0], frames[-1]
        try:
            m = json.loads(body)
        except ValueError:
            continue
        if m.get("type") == "stats":
            if not mute:
                s.send_multipart([ident, b"", json.dumps({
                    "v": 1, "type": "stats", "id": a.id, "quota_pct": a.quota, "pid": os.getpid(),
                    "forwarded": forwarded, "apps": len(peers), "state": "ready",
                    # optional counters: one the pool passes on, one of a wrong type it drops
                    "modules": forwarded + 1, "module_loads": True}).encode()])
        else:                                         # anything else counts as a forwarded task
            peers.add(ident)
            forwarded += 1
            s.send_multipart([ident, b"", json.dumps({"v": 1, "type": "done"}).encode()])
    s.close()
    ctx.term()
    print(f"fake worker {a.id} stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
