"""The Camelot suite as device work: the four end-to-end services of §III-A
(Table I) and the artifact stages c1-c3, m1-m3, p1-p3 of §III-B, each stage
a list of kernels (and copies) per batch that simgpu's device model runs.

A stage is data: its layers' work per query, the weights every batch reads
once, and what it hands the next stage.  The real services' layers follow
the shapes of the models Table I names (VGG-16, an LSTM, DC-GAN, BERT-base,
a Transformer decoder, FSRCNN, a ResNet-style face detector); they are our
approximations of those networks' arithmetic and traffic, not the networks.
Their flops per query are the usual published counts (VGG-16 at 224x224:
15.5 GFLOP; BERT-base at 128 tokens: ~22 GFLOP; ResNet-34 at 224: 3.6 GFLOP;
FSRCNN: ~0.5 GFLOP per 64x64 output; DC-GAN 64x64 generator: ~0.9 GFLOP),
and their weights the parameter counts in fp32.

Intensities (§VIII-E's naming: x_i is more intensive than x_j when i > j;
§III-B names m1 the most memory-intensive, the opposite order, and we follow
§VIII-E because Fig. 18's 27 pipelines are named with it):
  c_i   compute-bound: 2, 4, 8 GFLOP per query, few bytes
  m_i   bandwidth-bound: 0.15, 0.3, 0.6 GB per query streamed, few flops
  p_i   PCIe-bound: 8, 16, 32 MB per query copied host-to-device, then a
        light kernel over it

`DevStage` turns a stage into the allocator's StageModel (§VII-A's
predictions: duration, bandwidth, PCIe traffic, footprint, work) by asking the device
model how long each kernel takes alone at a quota: the ground truth that
the predictors of predict.py learn from samples.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from shim.devmodel import H2D, KERNEL, Params, quota_sms, solo

MB = 1e6
GB = 1e9
THREADS = 256


@dataclass(frozen=True)
class Layer:
    """One kernel of a stage.  Work scales with the batch; weights do not."""
    name: str
    gflop: float                 # per query
    act_mb: float                # activations read + written per query
    weight_mb: float = 0.0       # read once per batch
    blocks: float = 64.0         # thread blocks per query (steps > 1: per step, whatever the batch)
    steps: int = 1               # sequential launches (an RNN's time steps): work split evenly
    h2d_mb: float = 0.0          # host-to-device copy per query before the kernel (PCIe stages)


@dataclass(frozen=True)
class Stage:
    """A microservice stage: its layers, what it hands on, its footprint."""
    name: str
    layers: tuple[Layer, ...]
    out_mb: float                # result per query handed to the next stage
    mem_base_gb: float           # model + runtime context per instance
    mem_query_mb: float          # workspace per query of a batch

    @property
    def weight_mb(self) -> float:
        return sum(la.weight_mb for la in self.layers)


def _fc_stack(name: str, gflop: float, weight_mb: float, act_mb: float, n: int, blocks: float) -> list[Layer]:
    return [Layer(f"{name}{i}", gflop / n, act_mb / n, weight_mb / n, blocks) for i in range(n)]


def _rnn(name: str, hidden: int, steps: int, layers: int = 2) -> Layer:
    """An LSTM: 4 gates of (input + hidden) x hidden per step and layer; its
    weights are re-read every step (no persistent-RNN kernels)."""
    per_step = 2 * 4 * (2 * hidden) * hidden * layers
    weight_mb = 4 * (2 * hidden) * hidden * layers * 4 / MB
    return Layer(name, per_step * steps / GB, 8 * hidden * steps * layers * 4 / MB,
                 weight_mb * steps, blocks=hidden / 32, steps=steps)


# --- the four services (Table I) ------------------------------------------------

def _services() -> dict[str, tuple[Stage, ...]]:
    fr = Stage("face-recognition", tuple(
        [Layer("conv1", 0.24, 3.2, 0.04, 784)]
        + [Layer(f"res{i}", 0.84, 1.6, 21.0 / 4, 196) for i in range(4)]
        + [Layer("detect", 0.02, 0.2, 2.0, 16)]), out_mb=0.15, mem_base_gb=0.9, mem_query_mb=60)
    fsrcnn = Stage("image-enhancement", (
        Layer("feature", 0.08, 0.6, 0.02, 64), Layer("shrink-map", 0.3, 1.0, 0.05, 64),
        Layer("expand", 0.08, 0.6, 0.02, 64), Layer("deconv", 0.05, 0.5, 0.04, 64)),
        out_mb=0.05, mem_base_gb=0.5, mem_query_mb=8)
    vgg = Stage("image-features", tuple(
        [Layer(f"conv{i}", 14.6 / 13, 12.0 / 13, 58.9 / 13, 392) for i in range(13)]
        + _fc_stack("fc", 0.25, 495.0, 0.1, 3, 16)), out_mb=0.016, mem_base_gb=1.2, mem_query_mb=90)
    caption = Stage("image-caption", (_rnn("lstm", 512, 20), Layer("vocab", 0.2, 0.8, 20.0, 40)),
                    out_mb=0.001, mem_base_gb=0.6, mem_query_mb=4)
    semantic = Stage("semantic-understanding", (_rnn("lstm", 256, 30), Layer("embed", 0.02, 0.2, 8.0, 8)),
                     out_mb=0.0005, mem_base_gb=0.5, mem_query_mb=2)
    dcgan = Stage("image-generation", (
        Layer("project", 0.03, 0.1, 6.0, 16), Layer("deconv1", 0.21, 1.0, 8.4, 128),
        Layer("deconv2", 0.34, 2.0, 2.1, 256), Layer("deconv3", 0.27, 3.0, 0.5, 512),
        Layer("deconv4", 0.05, 1.5, 0.01, 512)), out_mb=0.05, mem_base_gb=0.6, mem_query_mb=20)
    bert = Stage("text-summarization", tuple(
        Layer(f"enc{i}", 22.0 / 12, 9.0 / 12, 440.0 / 12, 192) for i in range(12)),
        out_mb=0.4, mem_base_gb=1.4, mem_query_mb=40)
    nmt = Stage("text-translation", (
        Layer("encoder", 1.5, 2.0, 90.0, 96),
        Layer("decoder", 3.0, 6.0, 120.0 * 30, 48, steps=30)), out_mb=0.001, mem_base_gb=1.0, mem_query_mb=12)
    return {"img-to-img": (fr, fsrcnn), "img-to-text": (vgg, caption),
            "text-to-img": (semantic, dcgan), "text-to-text": (bert, nmt)}


# what each service's first stage receives from the client, per query
SERVICE_INPUT_MB = {"img-to-img": 0.6, "img-to-text": 0.6, "text-to-img": 0.001, "text-to-text": 0.004}

# The same stages live (`colocate pipeline run`, bench/camelot/tonic_stage.cu):
# each a Tonic network of cuDNN / cuBLAS layers (bench/tonic/nets/<net>.c,
# whose headers say how each approximates the named model), and the units of
# one query - images of an image net, words of a word net (BERT's 128-token
# input; 30-step LSTM and decoder as in the layers above).  Their FLOPs per
# query are within about 2x of the layers above (bench/tonic/README.md).
NETS: dict[str, tuple[str, int]] = {
    "face-recognition": ("face", 1), "image-enhancement": ("fsr", 1),
    "image-features": ("vgg", 1), "image-caption": ("cap", 1),
    "semantic-understanding": ("sem", 30), "image-generation": ("gan", 1),
    "text-summarization": ("bert", 128), "text-translation": ("nmt", 30),
}
# the stages whose network reads words: a query is one sentence, run alone
WORD_STAGES = frozenset({"semantic-understanding", "text-summarization", "text-translation"})


def net_width(scale: float) -> float:
    """A Table I stage's network width at `scale` of its work: sqrt(scale)
    (convolutions and GEMMs scale with in x out channels), within [1/64, 1]."""
    return min(1.0, max(1.0 / 64, math.sqrt(scale)))


def first_input_mb(kind: str) -> float:
    """What the client sends a pipeline whose first stage is `kind`, per query:
    its service's input when a service of Table I starts with it."""
    return input_mb(next((k for k, v in SERVICES.items() if v[0].name == kind), kind))


# --- the artifact stages (§III-B) -----------------------------------------------------

def _artifacts() -> dict[str, Stage]:
    st: dict[str, Stage] = {}
    for i, g in enumerate((2.0, 4.0, 8.0), 1):
        st[f"c{i}"] = Stage(f"c{i}", (Layer("fma", g, 0.5, 0.0, 256),), out_mb=0.5, mem_base_gb=0.4,
                            mem_query_mb=4)
    for i, gb in enumerate((0.15, 0.3, 0.6), 1):
        st[f"m{i}"] = Stage(f"m{i}", (Layer("stream", gb * 0.05, gb * 1e3, 0.0, 256),), out_mb=0.5,
                            mem_base_gb=0.4, mem_query_mb=gb * 1e3)
    for i, mb in enumerate((8.0, 16.0, 32.0), 1):
        st[f"p{i}"] = Stage(f"p{i}", (Layer("scan", 0.02, 2 * mb, 0.0, 128, h2d_mb=mb),), out_mb=0.5,
                            mem_base_gb=0.4, mem_query_mb=mb)
    return st


SERVICES: dict[str, tuple[Stage, ...]] = _services()
ARTIFACT: dict[str, Stage] = _artifacts()
ARTIFACT_PIPELINES: tuple[str, ...] = tuple(f"p{p}+c{c}+m{m}" for p in (1, 2, 3) for c in (1, 2, 3)
                                            for m in (1, 2, 3))   # Fig. 18's 27


def pipeline(name: str) -> tuple[Stage, ...]:
    """A service of Table I by name, or an artifact pipeline 'p1+c2+m3'."""
    if name in SERVICES:
        return SERVICES[name]
    parts = name.split("+")
    if all(p in ARTIFACT for p in parts) and parts:
        return tuple(ARTIFACT[p] for p in parts)
    raise KeyError(f"unknown pipeline {name!r}: one of {', '.join(SERVICES)}, or artifact stages "
                   f"joined by '+' ({', '.join(ARTIFACT)}), e.g. p1+c2+m3")


def input_mb(name: str) -> float:
    """What the client sends the first stage per query."""
    return SERVICE_INPUT_MB.get(name, 0.5)


# --- device work ------------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """One device task of a batch: a kernel or a host-to-device copy."""
    kind: int
    blocks: float
    flops: float
    bytes: float


def batch_ops(stage: Stage, batch: int) -> list[Op]:
    """The device tasks one batch of `batch` queries runs, in order."""
    ops: list[Op] = []
    for la in stage.layers:
        if la.h2d_mb:
            ops.append(Op(H2D, 1, 0.0, la.h2d_mb * MB * batch))
        per = 1.0 / la.steps
        for _ in range(la.steps):
            # a step of a recurrent layer tiles its weights, not the batch:
            # its blocks grow only past 64 queries (one GEMM tile column)
            blocks = la.blocks * math.ceil(batch / 64) if la.steps > 1 else la.blocks * batch
            ops.append(Op(KERNEL, blocks,
                          la.gflop * GB * batch * per, (la.act_mb * batch + la.weight_mb) * MB * per))
    return ops


@dataclass(frozen=True, eq=False)
class DevStage:
    """A Stage as the allocator's StageModel (§VII-A): what it costs alone
    at pct % of the SMs, from the device model's solo times (the profile
    the predictors are trained on).  Durations are memoised per (pct, batch)."""
    stage: Stage
    params: Params = field(repr=False)
    _memo: dict = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.stage.name

    def duration_s(self, pct: int, batch: int) -> float:
        if (pct, batch) not in self._memo:
            sms = quota_sms(pct, int(self.params.sms))
            self._memo[pct, batch] = sum(solo(self.params, o.kind, o.blocks, THREADS, 0, 0, o.flops, o.bytes, sms)
                                         for o in batch_ops(self.stage, batch))
        return self._memo[pct, batch]

    def bandwidth_gbs(self, pct: int, batch: int) -> float:
        """Device-memory traffic over the batch's duration (b(p) of Eq. 1)."""
        traffic = sum(o.bytes for o in batch_ops(self.stage, batch) if o.kind == KERNEL)
        return traffic / self.duration_s(pct, batch) / GB

    def pcie_gbs(self, pct: int, batch: int) -> float:
        """Host-to-device traffic over the batch's duration (the allocator's
        optional PCIe rate, its constraint C-P): the bytes the stage's own H2D
        copies move per batch (the copies between stages are not the stage's:
        pipesim adds those) over duration_s(pct, batch)."""
        traffic = sum(o.bytes for o in batch_ops(self.stage, batch) if o.kind == H2D)
        return traffic / self.duration_s(pct, batch) / GB

    def mem_gb(self, batch: int) -> float:
        """M(i, s): model, context and a batch's workspace."""
        return self.stage.mem_base_gb + self.stage.mem_query_mb * batch / 1e3

    def gflop(self, batch: int) -> float:
        """C(i, s)."""
        return sum(o.flops for o in batch_ops(self.stage, batch)) / GB


def dev_stages(stages: Sequence[Stage], params: Params) -> list[DevStage]:
    return [DevStage(s, params) for s in stages]


# --- devices -------------------------------------------------------------------------------

# The GPUs of the paper's testbeds (§VIII, Table III) as our H100-calibrated
# device model rescaled to their datasheet figures: SM count, FP32 peak,
# memory bandwidth (the 616 / 897 GB/s the paper itself uses as BW), memory
# size, and PCIe 3.0 x16 at the 12.16 GB/s effective bandwidth §VI-A cites.
# Everything else (block limits, DRAM's curve and shares, time slices) stays the
# H100 calibration: these are spec-scaled models, not measured 2080Ti/V100s.
# name: (SMs, FP32 TFLOP/s, memory GB/s, memory GB, PCIe GB/s; None = preset)
DEVICES: dict[str, tuple[int, float, float, float, float | None]] = {
    "2080ti": (68, 13.45, 616.0, 11.0, 12.16),      # TU102: 68 SMs, 13.45 TFLOP/s boost, 11 GB GDDR6
    "v100": (80, 15.7, 897.0, 32.0, 12.16),         # V100-SXM3 (DGX-2): 80 SMs, 15.7 TFLOP/s, 32 GB HBM2
    "h100": (132, 66.0, 3350.0, 80.0, None),        # the compiled-in preset (SXM5, 80 GB)
}


def device_params(name: str) -> Params:
    """The device model for one of DEVICES (a fresh params struct)."""
    from shim.devmodel import default_params
    if name not in DEVICES:
        raise KeyError(f"unknown device {name!r}: one of {', '.join(DEVICES)}")
    sms, tflops, bw, _mem, pcie = DEVICES[name]
    p = default_params(mps=True)
    if name == "h100":
        return p
    h100 = default_params(mps=True)
    p.sms = sms
    p.sm_flops = tflops * 1e12 / sms
    p.bw = bw * GB
    # no per-SM pull measured on these: the H100's SMs together pull
    # 132 x 101.3 / 3350 = 4.0 x its bandwidth (config.c), kept here
    p.sm_bw = h100.sm_bw * h100.sms / h100.bw * p.bw / sms
    if pcie is not None:
        p.pcie_h2d = p.pcie_d2h = pcie * GB
    return p


def device_mem_gb(name: str) -> float:
    return DEVICES[name][3]
