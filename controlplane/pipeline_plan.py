"""`colocate pipeline plan SPEC`: Camelot's workflow (§VII) for a live pipeline
of Table I stages - profile each stage alone, learn its per-stage model,
solve the allocation, write the SPEC that `colocate pipeline run` runs.

  1. profile: every stage's Tonic network alone at each SM quota and batch,
     through `colocate profile tonic:NET` (predictors/profile.py: simgpu's
     device model, or the GPU when one is present), at the width the live
     pipeline runs it (suite.net_width of the run's scale), into the
     sample store (resumable: what is stored is not run again);
  2. per-stage models (§VII-A, Fig. 12): predictors.stages.store_samples,
     then a decision tree of duration, bandwidth and throughput on (batch,
     quota); memory and work per batch from bench/camelot/suite.py (the
     profile does not measure them);
  3. allocate (§VII-B..D): an allocator of controlplane/policies/camelot.py
     (camelot, camelot-nc, camelot-aff, ea, laius) for the peak (Eq. 1), or,
     with a load, the least resources that carry it (Eq. 2-3; laius_min for
     laius), for QoS = the SPEC's target less the runner's batching headroom;
  4. the SPEC: the same stages with the instances, quotas and devices (Fig. 13's
     placement) of the allocation, as TOML.

The plan is as good as the profile: on simgpu the profile is its device
model's time, while a live run on simgpu also pays the host twins' CPU time
(so its stages take longer than planned); on a GPU both are the GPU's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from controlplane.pipeline import HEADROOM, SCALE, PipelineSpec, SpecError, StageSpec, suite
from controlplane.policies import camelot as alloc
from shim.rundir import ColocateError

QUOTAS = tuple(range(10, 101, 10))
REPS = 2


@dataclass(frozen=True)
class Plan:
    spec: PipelineSpec             # the SPEC with the allocation's instances, quotas and devices
    allocation: alloc.Allocation
    allocator: str
    gpu: alloc.GPUSpec
    gpus: int
    load_qps: float | None
    qos_s: float                   # what the allocator planned for (the target less the headroom)
    width: float
    labels: dict[str, str]         # stage kind -> its profile label
    stages: list[Any]              # the per-stage models (PredictedStage)


def profile_stages(kinds: Sequence[str], width: float, batch: int, store: Any, quotas: Sequence[int] = QUOTAS,
                   reps: int = REPS, progress: bool = False) -> dict[str, str]:
    """Step 1: `colocate profile tonic:NET` of every kind's network at `width`
    (query sizes: one sentence for a word net; 1, 2, 4, ... up to `batch`
    queries of images for an image net); returns each kind's profile label."""
    from predictors import profile as P
    from predictors import profile_gpu
    s = suite()
    labels: dict[str, str] = {}
    targets = []
    for kind in dict.fromkeys(kinds):
        net, units = s.NETS[kind]
        words = kind in s.WORD_STAGES
        sizes = [units] if words else sorted({units * b for b in _batches(batch)})
        t = P.resolve([f"tonic:{net}"], [";".join(map(str, sizes))], f"--width {width:g}")
        labels[kind] = t[0].label
        targets += t
    try:
        P.check_built(shim=True, sim=not profile_gpu.gpu_present())
        summ = profile_gpu.profile_here(targets, list(quotas), reps, store, progress=progress)
    except P.ProfileError as e:
        raise ColocateError(f"profile: {e}") from None
    if summ.failed:
        raise ColocateError(f"profile: {summ.failed} configuration(s) failed (see `colocate profile`)")
    return labels


def _batches(batch: int) -> list[int]:
    out, b = [], 1
    while b < batch:
        out.append(b)
        b *= 2
    return out + [batch]


def stage_models(kinds: Sequence[str], labels: dict[str, str], batch: int, store: Any) -> list[Any]:
    """Step 2: a PredictedStage per stage, from the store."""
    from predictors.stages import StagePredictor, store_samples
    s = suite()
    desc = {st.name: st for stages in s.SERVICES.values() for st in stages}
    params = s.device_params("h100")
    out = []
    for kind in kinds:
        truth = s.DevStage(desc[kind], params)          # memory and work: the suite's description
        try:
            smp = store_samples(store, labels[kind], s.NETS[kind][1], kind in s.WORD_STAGES, truth.mem_gb,
                                truth.gflop, batches=_batches(batch), name=kind)
        except ValueError as e:
            raise ColocateError(str(e)) from None
        out.append(StagePredictor("dt").fit(smp).as_stage())
    return out


def _allocate(name: str, models: list[Any], gpu: alloc.GPUSpec, gpus: int, batch: int, qos: float,
              load: float | None, g: int) -> alloc.Allocation:
    """The allocator's answer on quotas in steps of g % (the profiled ones)."""
    if load is None:
        return alloc.allocate(name, models, gpu, gpus, batch, qos, **({} if name == "ea" else {"granularity": g}))
    if name in ("camelot", "camelot-nc", "camelot-aff"):
        return alloc.solve_min(models, gpu, load, batch, qos, max_gpus=gpus, bandwidth_cap=name != "camelot-nc",
                               affinity=name == "camelot-aff", granularity=g)
    if name == "laius":
        return alloc.laius_min(models, gpu, load, batch, qos, max_gpus=gpus, granularity=g)
    raise ColocateError(f"--load: allocator {name} has no low-load form (camelot, camelot-nc, camelot-aff, "
                        f"laius have)", 2)


def planned_spec(spec: PipelineSpec, a: alloc.Allocation) -> PipelineSpec:
    """Step 4: spec's stages with a's instances, quotas and devices (instance
    i of a stage on devices[i]: the GPUs Fig. 13 placed them on)."""
    devs: list[list[int]] = [[] for _ in spec.stages]
    for g, on in enumerate(a.placement):
        for i, _ in on:
            devs[i].append(g)
    stages = tuple(StageSpec(st.kind, n, q, tuple(d) or (0,))
                   for st, n, q, d in zip(spec.stages, a.instances, a.quotas, devs))
    return PipelineSpec(spec.name, spec.qos_ms, spec.batch, stages, spec.scale, spec.path)


def plan(spec: PipelineSpec, device: str, store: Any, allocator: str = "camelot", gpus: int = 1,
         load_qps: float | None = None, gpu_model: str = "h100", quotas: Sequence[int] = QUOTAS,
         scale: float | None = None, progress: bool = False,
         log: Callable[[str], None] = lambda m: None) -> Plan:
    """Steps 1-4 for `spec` on `device` ("sim" or "cuda")."""
    s = suite()
    if allocator not in alloc.ALLOCATORS:
        raise ColocateError(f"unknown allocator {allocator!r} (one of {', '.join(alloc.ALLOCATORS)})", 2)
    if gpus < 1:
        raise ColocateError(f"--gpus must be >= 1 (got {gpus})", 2)
    if load_qps is not None and not (load_qps > 0 and math.isfinite(load_qps)):
        raise ColocateError(f"--load must be a number > 0 (got {load_qps:g})", 2)
    bad = [st.kind for st in spec.stages if st.kind not in s.NETS]
    if bad:
        raise SpecError(f"{spec.path or spec.name}: plan profiles Table I stages (Tonic networks: "
                        f"{', '.join(s.NETS)}); {', '.join(bad)} is not one: give its instances and quota")
    try:
        gpu = alloc.gpu_preset(gpu_model)
    except ValueError as e:
        raise ColocateError(str(e), 2) from None
    width = s.net_width(scale or spec.scale or SCALE.get(device, 1.0))
    kinds = [st.kind for st in spec.stages]
    log(f"profiling {len(set(kinds))} stage(s) at width {width:g}, quotas {','.join(map(str, quotas))}")
    labels = profile_stages(kinds, width, spec.batch, store, quotas, progress=progress)
    models = stage_models(kinds, labels, spec.batch, store)
    qos = spec.qos_ms / 1e3 * (1 - HEADROOM)
    # quotas in steps of the profiled ones' gcd (10..100 by 10: steps of 10; the
    # models answer for unprofiled quotas in between with a neighbour's figures)
    a = _allocate(allocator, models, gpu, gpus, spec.batch, qos, load_qps, math.gcd(*quotas))
    if not a.feasible:
        raise ColocateError(f"{allocator}: no allocation of {spec.name} on {gpus} GPU(s) meets "
                            f"{spec.qos_ms:g} ms: {a.why}")
    return Plan(planned_spec(spec, a), a, allocator, gpu, gpus, load_qps, qos, width, labels, models)


def spec_toml(p: Plan) -> str:
    """The planned SPEC as TOML, with where it came from in comments."""
    s, a = p.spec, p.allocation
    lines = [f"# planned by `colocate pipeline plan` ({p.allocator}, {p.gpus} x {p.gpu.name}"
             + (f", load {p.load_qps:g} q/s" if p.load_qps else ", peak") + f", width {p.width:g}):",
             f"# predicted {a.throughput_qps:.1f} q/s, latency {a.latency_s * 1e3:.2f} ms "
             f"(planned for {p.qos_s * 1e3:.1f} ms: the target less the batching headroom)",
             f'name = "{s.name}"', f"qos_ms = {s.qos_ms:g}", f"batch = {s.batch}"]
    if s.scale is not None:
        lines.append(f"scale = {s.scale:g}")
    for st in s.stages:
        lines += ["", "[[stage]]", f'kind = "{st.kind}"', f"instances = {st.instances}", f"quota = {st.quota}",
                  f"devices = [{', '.join(map(str, st.devices))}]"]
    return "\n".join(lines) + "\n"


def write(p: Plan, path: Path) -> None:
    try:
        path.write_text(spec_toml(p))
    except OSError as e:
        raise ColocateError(f"cannot write {path}: {e.strerror}") from None
