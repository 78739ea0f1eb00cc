"""SYNTHETIC samples from simgpu's device model, until real profiles exist.

Every sample written here has src "synthetic", and the report says so.

Task durations follow simgpu's fluid model (SIMGPU_MODEL=fluid:
shim/simgpu/engine.c with every mechanism off) exactly (tested against simgpu
itself; the default block-level model adds waves, warps and queueing): a
kernel of F flops and B bytes that can use s SMs (its quota,
and no more SMs than its blocks fill) takes

    launch + max(F / (s * sm_flops), B / min(s * sm_bw, bw))

with the fluid model's defaults (132 SMs, 500 GFLOP/s and 3 * bw / SMs bytes/s
per SM, 3350 GB/s, 3 us launch, 25 GB/s PCIe; SIMGPU_* variables override them
as in config.c).  The full model's DRAM curve (101.3 GB/s an SM, a soft limit)
is not this module's: these samples are the fluid model's.
Bandwidth is B over the kernel's run time; IPC is an invented instruction
count (flops / 128 + bytes / 64 warp instructions) over the SMs' cycles at
1.755 GHz, capped at 4: plausible in shape, not measured anywhere.  Each
target gets its own multiplicative log-normal noise (default 2 %).

Queries are chains of layers of five invented services (CNNs whose work
scales with the batch, transformers with batch x sequence) plus PCIe copies;
groups are Abacus-style operator ranges of up to four of eight invented
models run together, timed by a fluid overlap model (the slowest member, or
the summed compute, or the summed memory traffic, whichever is largest, plus
a few % interference per extra member).

Sampling: a configuration (task, size, block, quota ...) is drawn from a
discrete space and measured `reps` times, as a profiler repeats runs; the
sample key is "<configuration>#r<rep>", so a split can keep all repetitions
of one configuration on the same side.
"""
from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from predictors import schema as S

SOURCE = "synthetic"
QUOTAS = tuple(range(10, 101, 10))     # the pool's quota units (controller asks 10..100 %)


@dataclass(frozen=True)
class Device:
    """simgpu's fluid-model parameters (shim/simgpu/config.c, SIMGPU_MODEL=fluid)."""
    sms: int = 132
    bw: float = 3350e9
    sm_flops: float = 500e9
    sm_bw: float = 3.0 * 3350e9 / 132
    launch_s: float = 3e-6
    pcie: float = 25e9
    clock_hz: float = 1.755e9           # for the synthetic IPC only
    name: str = "simgpu H100-like (CPU model)"

    @staticmethod
    def from_env(env: dict[str, str] | None = None) -> "Device":
        e = os.environ if env is None else env

        def num(k: str, d: float) -> float:
            try:
                return float(e[k]) if e.get(k) else d
            except ValueError:
                return d
        sms = int(num("SIMGPU_SMS", 132))
        bw = num("SIMGPU_BW_GBS", 3350) * 1e9
        return Device(sms=sms, bw=bw, sm_flops=num("SIMGPU_SM_GFLOPS", 500) * 1e9,
                      sm_bw=num("SIMGPU_SM_BW_GBS", 3.0 * bw / 1e9 / sms) * 1e9,
                      launch_s=num("SIMGPU_LAUNCH_US", 3) * 1e-6,
                      pcie=num("SIMGPU_PCIE_GBS", 25) * 1e9,
                      name=e.get("SIMGPU_NAME") or Device.name)


def quota_sms(dev: Device, pct: float) -> int:
    """config.c: the percentage's SMs in whole TPCs (shim/devmodel.py)."""
    from shim.devmodel import quota_sms as whole_tpcs
    return whole_tpcs(pct, dev.sms)


def kernel_sms(dev: Device, grid: tuple[int, int, int], block: tuple[int, int, int],
               pct: float) -> int:
    """The fluid model's SMs: the quota, and no more SMs than the blocks fill."""
    tpb = max(1.0, float(block[0] * block[1] * block[2]))
    bps = min(32.0, max(1.0, math.floor(2048.0 / tpb)))
    need = max(1.0, math.ceil(float(grid[0] * grid[1] * grid[2]) / bps))
    q = quota_sms(dev, pct)
    return int(need) if need < q else q


def solo_s(dev: Device, flops: float, nbytes: float, sms: float) -> float:
    """The fluid model: seconds of work for a kernel alone on s SMs."""
    s = sms if sms > 0 else 1
    mbw = min(s * dev.sm_bw, dev.bw)
    return max(flops / (s * dev.sm_flops), nbytes / mbw)


def kernel_us(dev: Device, flops: float, nbytes: float, grid: tuple[int, int, int],
              block: tuple[int, int, int], pct: float) -> float:
    """A launch's modelled duration as simgpu reports it (launch overhead included)."""
    s = kernel_sms(dev, grid, block, pct)
    return (dev.launch_s + solo_s(dev, flops, nbytes, s)) * 1e6


def _ipc(dev: Device, flops: float, nbytes: float, sms: int, run_s: float) -> float:
    inst = flops / 128.0 + nbytes / 64.0
    return min(4.0, inst / (sms * max(run_s, 1e-12) * dev.clock_hz))


def _noisy(rng: np.random.Generator, v: float, sigma: float) -> float:
    return float(v * math.exp(rng.normal(0.0, sigma))) if sigma > 0 else float(v)


# ------------------------------------------------------------------ tasks

@dataclass(frozen=True)
class TaskCfg:
    name: str
    size: int
    block: tuple[int, int, int]
    quota: int


@dataclass(frozen=True)
class KernelSpec:
    """One invented kernel or library call: its size axis and cost."""
    name: str
    sizes: tuple[int, ...]
    blocks: tuple[tuple[int, int, int], ...]
    # size, block -> grid, shmem, flops, bytes, input bytes, params
    cost: Callable[[int, tuple[int, int, int]], dict[str, Any]]
    library: bool = False


def _geo(lo: int, hi: int, per_octave: int) -> tuple[int, ...]:
    n = int(round(math.log2(hi / lo) * per_octave))
    return tuple(sorted({int(round(lo * 2 ** (i / per_octave))) for i in range(n + 1)}))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _k1d(flops: float, nbytes: float, inbytes: float, shm: Callable[[int], int] = lambda b: 0,
         per_thread: int = 1):
    def cost(n: int, blk: tuple[int, int, int]) -> dict[str, Any]:
        return {"grid": (_cdiv(n, blk[0] * per_thread), 1, 1), "shmem": shm(blk[0]),
                "flops": flops * n, "bytes": nbytes * n, "input": inbytes * n, "params": ()}
    return cost


def _stencil(n: int, blk: tuple[int, int, int]) -> dict[str, Any]:
    return {"grid": (_cdiv(n, blk[0]), _cdiv(n, blk[1]), 1), "shmem": 0,
            "flops": 15.0 * n * n, "bytes": 12.0 * n * n, "input": 8.0 * n * n, "params": ()}


def _sgemm(n: int, blk: tuple[int, int, int]) -> dict[str, Any]:
    t = blk[0]
    return {"grid": (_cdiv(n, t), _cdiv(n, t), 1), "shmem": 2 * t * t * 4,
            "flops": 2.0 * n ** 3, "bytes": 8.0 * n ** 3 / t + 4.0 * n * n,
            "input": 8.0 * n * n, "params": ()}


def _softmax(rows: int, blk: tuple[int, int, int]) -> dict[str, Any]:
    cols = 4096
    return {"grid": (rows, 1, 1), "shmem": blk[0] * 4, "flops": 5.0 * rows * cols,
            "bytes": 8.0 * rows * cols, "input": 4.0 * rows * cols, "params": ()}


# cuDNN-like convolution: (c, h, w, k, r, stride, pad) layer shapes; the size axis is the batch
CONV_SHAPES = ((3, 224, 224, 64, 7, 2, 3), (64, 56, 56, 64, 3, 1, 1), (128, 28, 28, 128, 3, 1, 1),
               (256, 14, 14, 256, 3, 1, 1), (512, 7, 7, 512, 3, 1, 1), (256, 56, 56, 64, 1, 1, 0),
               (1024, 14, 14, 256, 1, 1, 0), (2048, 7, 7, 512, 1, 1, 0))


def _conv(code: int, blk: tuple[int, int, int]) -> dict[str, Any]:
    n, (c, h, w, k, r, st, pad) = code // 100, CONV_SHAPES[code % 100]
    oh, ow = (h + 2 * pad - r) // st + 1, (w + 2 * pad - r) // st + 1
    out = n * k * oh * ow
    flops = 2.0 * out * c * r * r
    nbytes = 4.0 * (n * c * h * w * 1.5 + k * c * r * r + out)
    # the library's kernels: one block of 256 threads per 256 outputs
    return {"grid": (_cdiv(out, 256), 1, 1), "shmem": 0, "flops": flops, "bytes": nbytes,
            "input": 4.0 * n * c * h * w,
            "params": (("n", n), ("c", c), ("h", h), ("w", w), ("k", k), ("r", r), ("s", r),
                       ("stride", st), ("pad", pad))}


def _gemm(code: int, blk: tuple[int, int, int]) -> dict[str, Any]:
    m, n, k = GEMM_SHAPES[code]
    return {"grid": (_cdiv(m, 128) * _cdiv(n, 128), 1, 1), "shmem": 0,
            "flops": 2.0 * m * n * k, "bytes": 4.0 * (m * k + k * n + 2 * m * n),
            "input": 4.0 * (m * k + k * n), "params": (("m", m), ("n", n), ("k", k))}


GEMM_SHAPES = tuple((m, n, k) for m in (64, 256, 1024, 4096) for n in (64, 512, 4096)
                    for k in (128, 1024, 8192))

B1 = ((128, 1, 1), (256, 1, 1), (512, 1, 1), (1024, 1, 1))
KERNELS: tuple[KernelSpec, ...] = (
    KernelSpec("_Z6vecaddPKfS0_Pfi", _geo(1 << 12, 1 << 26, 2), B1, _k1d(1, 12, 8)),
    KernelSpec("_Z5saxpyifPKfPf", _geo(1 << 12, 1 << 26, 2), B1, _k1d(2, 12, 8)),
    KernelSpec("_Z10reduce_sumPKfPfi", _geo(1 << 12, 1 << 26, 2), B1[1:],
               _k1d(1, 4, 4, shm=lambda b: 4 * b, per_thread=2)),
    KernelSpec("_Z10bfs_expandPKiS0_Pii", _geo(1 << 10, 1 << 24, 2), B1[:3], _k1d(2, 40, 16)),
    KernelSpec("_Z12hotspot_stepPKfS0_Pfiifffff", _geo(64, 8192, 2), ((16, 16, 1),), _stencil),
    KernelSpec("_Z11sgemm_tiledPKfS0_Pfi", _geo(64, 4096, 2), ((16, 16, 1), (32, 32, 1)), _sgemm),
    KernelSpec("_Z12softmax_rowsPKfPfi", _geo(1, 8192, 2), ((256, 1, 1), (1024, 1, 1)), _softmax),
    KernelSpec("cudnnConvolutionForward",
               tuple(b * 100 + i for b in (1, 2, 4, 8, 16, 32) for i in range(len(CONV_SHAPES))),
               ((0, 0, 0),), _conv, library=True),
    KernelSpec("cublasSgemm", tuple(range(len(GEMM_SHAPES))), ((0, 0, 0),), _gemm, library=True),
)


def task_sample(dev: Device, spec: KernelSpec, cfg: TaskCfg, rng: np.random.Generator,
                noise: float) -> tuple[dict[str, Any], dict[str, float]]:
    c = spec.cost(cfg.size, cfg.block)
    grid = c["grid"]
    # a library task's kernels fill SMs as their grid says; the row shows no geometry
    blk = (256, 1, 1) if spec.library else cfg.block
    s = kernel_sms(dev, grid, blk, cfg.quota)
    run = solo_s(dev, c["flops"], c["bytes"], s)
    dur = (dev.launch_s + run) * 1e6
    row = S.task_row(spec.name, c["input"], (0, 0, 0) if spec.library else grid,
                     cfg.block, c["shmem"], cfg.quota, c["params"])
    t = {"duration_us": _noisy(rng, dur, noise),
         "bandwidth_gbs": _noisy(rng, c["bytes"] / run / 1e9, noise),
         "ipc": _noisy(rng, _ipc(dev, c["flops"], c["bytes"], s, run), noise)}
    return row, t


# ---------------------------------------------------------------- services

@dataclass(frozen=True)
class Net:
    """An invented DNN: per-layer flops and activation bytes per item (per
    token for sequence models), weight bytes; what one item's input and
    output occupy."""
    name: str
    flops: tuple[float, ...]
    act: tuple[float, ...]
    weights: tuple[float, ...]
    item_bytes: float
    out_bytes: float
    seq: bool = False                  # work per item scales with the sequence length

    @property
    def ops(self) -> int:
        return len(self.flops)


def _net(name: str, layers: int, gflops: float, mparams: float, item_bytes: float,
         out_bytes: float, seq: bool = False) -> Net:
    """Layers shaped like real networks.  A CNN has four stages of equal
    compute (each halves the activations and quadruples the weights per
    layer, as ResNet and VGG do); a transformer's operators are its encoder
    or decoder layers, all alike.  Every layer then gets +-10 % of its own."""
    rng = np.random.default_rng(_seed(name))
    if seq:
        shape, act_shape, w_shape = np.ones(layers), np.ones(layers), np.ones(layers)
    else:
        stage = np.minimum(4 * np.arange(layers) // layers, 3)
        shape = np.ones(layers)
        act_shape = 0.5 ** stage
        w_shape = 4.0 ** stage
    jit = rng.uniform(0.9, 1.1, (3, layers))
    fl = shape * jit[0] / (shape * jit[0]).sum() * gflops * 1e9
    act = act_shape * jit[1]
    act = act / act.sum() * gflops * 1e9 / 40.0          # ~40 flops per activation byte
    w = w_shape * jit[2]
    w = w / w.sum() * mparams * 4e6
    return Net(name, tuple(fl), tuple(act), tuple(w), item_bytes, out_bytes, seq)


def _seed(name: str) -> int:
    """A stable seed per name (Python's hash() changes between runs)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


SERVICES: tuple[Net, ...] = (
    _net("resnet50-syn", 54, 4.1, 25.6, 3 * 224 * 224 * 4, 4000),
    _net("vgg16-syn", 16, 15.5, 138.0, 3 * 224 * 224 * 4, 4000),
    _net("inception3-syn", 48, 5.7, 23.8, 3 * 299 * 299 * 4, 4000),
    _net("bert-base-syn", 12, 0.022, 110.0, 8, 3072, seq=True),       # per token
    _net("lstm-syn", 8, 0.004, 20.0, 8, 1024, seq=True),
)

# Abacus' model zoo, invented: slot i of the group bitmap is GROUP_NETS[i]
GROUP_NETS: tuple[Net, ...] = (
    _net("resnet50-syn", 54, 4.1, 25.6, 3 * 224 * 224 * 4, 4000),
    _net("resnet101-syn", 105, 7.8, 44.5, 3 * 224 * 224 * 4, 4000),
    _net("resnet152-syn", 156, 11.5, 60.2, 3 * 224 * 224 * 4, 4000),
    _net("inception3-syn", 48, 5.7, 23.8, 3 * 299 * 299 * 4, 4000),
    _net("vgg16-syn", 16, 15.5, 138.0, 3 * 224 * 224 * 4, 4000),
    _net("vgg19-syn", 19, 19.6, 143.7, 3 * 224 * 224 * 4, 4000),
    _net("bert-base-syn", 12, 0.022, 110.0, 8, 3072, seq=True),
    _net("gpt2-syn", 24, 0.025, 124.0, 8, 3072, seq=True),
)
BATCHES = (1, 2, 4, 8, 16, 32)
SEQS = (16, 32, 64, 128, 256, 384, 512)


def _layer_cost(net: Net, i: int, batch: int, seq: int) -> tuple[float, float, int]:
    items = batch * (seq if net.seq else 1)
    att = (1.0 + seq / 512.0) if net.seq else 1.0           # attention grows with the sequence
    flops = net.flops[i] * items * att
    nbytes = net.weights[i] + net.act[i] * items
    blocks = max(1, _cdiv(int(net.act[i] * items / 4), 256))
    return flops, nbytes, blocks


def layers_us(dev: Device, net: Net, lo: int, hi: int, batch: int, seq: int,
              pct: float) -> tuple[float, float, float]:
    """Layers [lo, hi) run alone at quota pct: (duration us, SM-seconds of
    compute demand, bytes moved)."""
    dur = sm_s = nbytes = 0.0
    for i in range(lo, hi):
        f, b, blocks = _layer_cost(net, i, batch, seq)
        grid = (blocks, 1, 1)
        dur += kernel_us(dev, f, b, grid, (256, 1, 1), pct)
        sm_s += f / dev.sm_flops
        nbytes += b
    return dur, sm_s, nbytes


def query_sample(dev: Device, net: Net, batch: int, seq: int, pct: int,
                 rng: np.random.Generator, noise: float) -> tuple[dict[str, Any], dict[str, float]]:
    items = batch * (seq if net.seq else 1)
    gpu, _, _ = layers_us(dev, net, 0, net.ops, batch, seq, pct)
    inb = net.item_bytes * items
    pcie = ((inb + net.out_bytes * batch) / dev.pcie) * 1e6 + 2 * 8.0   # two copies, ~8 us each
    row = {"service": net.name, "input_bytes": inb, "batch": batch, "quota": pct}
    return row, {"duration_us": _noisy(rng, gpu + pcie, noise), "pcie_us": _noisy(rng, pcie, noise)}


def group_latency_us(dev: Device, members: dict[int, tuple[int, int, int, int]]) -> float:
    """Fluid overlap of the members' operator ranges on the whole device."""
    slow = sm_s = nbytes = 0.0
    for slot, (lo, hi, batch, seq) in members.items():
        d, c, b = layers_us(dev, GROUP_NETS[slot], lo, hi, batch, seq, 100)
        slow = max(slow, d)
        sm_s += c
        nbytes += b
    bound = max(slow, sm_s / dev.sms * 1e6, nbytes / dev.bw * 1e6)
    return bound * (1.0 + 0.04 * (len(members) - 1))


# ------------------------------------------------------------- generators

Sample = dict[str, Any]


def _repeat(key: str, row: dict[str, Any], make_t: Callable[[], dict[str, float]],
            reps: int) -> Iterator[Sample]:
    for r in range(reps):
        yield {"key": f"{key}#r{r}", "src": SOURCE, "f": row, "t": make_t()}


def tasks(n: int, seed: int = 0, noise: float = 0.02, reps: int = 3,
          dev: Device | None = None, quotas: tuple[int, ...] = QUOTAS) -> list[Sample]:
    """About n task samples: n / reps random configurations, reps measurements each."""
    dev = dev or Device.from_env()
    rng = np.random.default_rng(seed)
    out: list[Sample] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        spec = KERNELS[rng.integers(len(KERNELS))]
        cfg = TaskCfg(spec.name, int(spec.sizes[rng.integers(len(spec.sizes))]),
                      spec.blocks[rng.integers(len(spec.blocks))],
                      int(quotas[rng.integers(len(quotas))]))
        key = f"{cfg.name}|{cfg.size}|{'x'.join(map(str, cfg.block))}|q{cfg.quota}"
        if key in seen:
            continue
        seen.add(key)
        row, _ = task_sample(dev, spec, cfg, rng, 0.0)
        out.extend(_repeat(key, row, lambda: task_sample(dev, spec, cfg, rng, noise)[1],
                           min(reps, n - len(out))))
    return out


def queries(n: int, seed: int = 0, noise: float = 0.02, reps: int = 3,
            dev: Device | None = None, quotas: tuple[int, ...] = QUOTAS) -> list[Sample]:
    dev = dev or Device.from_env()
    rng = np.random.default_rng(seed + 1)
    out: list[Sample] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        net = SERVICES[rng.integers(len(SERVICES))]
        batch = int(BATCHES[rng.integers(len(BATCHES))])
        seq = int(SEQS[rng.integers(len(SEQS))]) if net.seq else 0
        pct = int(quotas[rng.integers(len(quotas))])
        key = f"{net.name}|b{batch}|s{seq}|q{pct}"
        if key in seen:
            continue
        seen.add(key)
        row, _ = query_sample(dev, net, batch, seq, pct, rng, 0.0)
        out.extend(_repeat(key, row, lambda: query_sample(dev, net, batch, seq, pct, rng, noise)[1],
                           min(reps, n - len(out))))
    return out


def groups(n: int, seed: int = 0, noise: float = 0.02, dev: Device | None = None,
           max_members: int = 4, max_ops: int = 24) -> list[Sample]:
    """n groups of 2..max_members services, each a run of at most max_ops operators."""
    dev = dev or Device.from_env()
    rng = np.random.default_rng(seed + 2)
    out: list[Sample] = []
    for i in range(n):
        k = int(rng.integers(2, max_members + 1))
        members: dict[int, tuple[int, int, int, int]] = {}
        for slot in sorted(rng.choice(len(GROUP_NETS), size=k, replace=False).tolist()):
            net = GROUP_NETS[slot]
            lo = int(rng.integers(0, net.ops))
            hi = int(rng.integers(lo + 1, min(net.ops, lo + max_ops) + 1))
            seq = int(SEQS[rng.integers(len(SEQS))]) if net.seq else 0
            members[slot] = (lo, hi, int(BATCHES[rng.integers(len(BATCHES))]), seq)
        lat = group_latency_us(dev, members)
        # each member's solo time, as the sampler's per-operator table gives it
        solo = {s: (*m, layers_us(dev, GROUP_NETS[s], m[0], m[1], m[2], m[3], 100)[0])
                for s, m in members.items()}
        out.append({"key": f"group{seed}-{i}#r0", "src": SOURCE, "f": S.group_row(solo),
                    "t": {"latency_us": _noisy(rng, lat, noise)}})
    return out


def generate(kind: str, n: int, seed: int = 0, noise: float = 0.02) -> list[Sample]:
    """n synthetic samples of a kind."""
    if kind == "task":
        return tasks(n, seed, noise)
    if kind == "query":
        return queries(n, seed, noise)
    if kind == "group":
        return groups(n, seed, noise)
    raise KeyError(f"unknown sample kind {kind!r}")
