"""Latency planning of a text-to-video pipeline: one video at a time, as fast as it can go.

A video is one MPMD program of components run one after another (Mochi 1: the T5-XXL text
encoder once, the DiT once per denoising step with both classifier-free-guidance passes, the VAE
decoder once). At batch 1 nothing overlaps across components, so the seconds per video are the
sum, over the components, of their runs times one run's seconds, plus the moves of their outputs
between device groups. The plan chooses, per component:

- a device group: the first or the last ``g`` devices of one mesh (components may share devices:
  they run one after another, but their weights all stay resident);
- a layout: for a transformer, data (the guidance passes of a step split over devices: CFG
  parallelism, as xDiT runs it) x context (Ulysses all-to-all or ring) x tensor (Megatron) degrees
  over the ``g`` devices, through :func:`simulator.cost_model.layer_time`; for a convolutional
  decoder, the spatial degree ``g`` (its input height split, :mod:`simulator.spatial`) and how many
  frame chunks it decodes at a time (``chunks``: a causal decoder with per-frame GroupNorm,
  Mochi's, decodes frame chunks exactly when each causal convolution keeps its last input frames,
  as diffusers' ``MochiDecoder3D`` framewise decoding does; chunks cut the activations, not the
  work, and pay one dispatch per layer per chunk).

The search is exhaustive over that space with branch and bound (each component's options sorted
by time; a partial assignment is dropped once its time plus the fastest remaining options reaches
the best found), so the plan is the optimum of the space, not a heuristic. Memory per device:
every component whose group holds the device keeps its weights there; the largest of their
working activations is added; the sum must fit ``capacity x (1 - headroom)``.

Bound printed beside the plan (:attr:`VideoPlan.bound_s`): each component's FLOP at the
achievable matmul rate of every device of the cluster at once, no communication, no memory
traffic; the plan is at least that slow.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hardware_profiles.types import Cluster, MeshSpec
from ir import Layout, Workload
from ir.schedule import FragmentKind
from ir.shards import layout_problem
from planner.errors import InfeasibleError, PlannerError
from simulator.context_parallel import context_exchange
from simulator.cost_model import (collective, compute_dtype, fastest_rate, fragment_overhead,
                                  layer_time, tensor_parallel_comm, transfer_time, usable_bytes)
from simulator.spatial import SpatialError, SpatialLayer, check_degree, spatial_memory, spatial_time, sub_mesh

__all__ = ["VideoComponent", "ComponentPlan", "VideoPlan", "component_options", "plan_video",
           "LIVE_ACTIVATIONS"]

LIVE_ACTIVATIONS = 2.0
"""A transformer layer's input and output held at once beside its intermediates (estimate)."""


@dataclass(frozen=True, slots=True)
class VideoComponent:
    """One component of the pipeline.

    Attributes:
        name: ``"encoder"``, ``"dit"``, ``"decoder"`` (any label).
        workload: its traced forward (``global_batch`` unused).
        runs: invocations per video (Mochi's DiT: the sampling steps).
        samples: samples per invocation (the encoder's prompt and negative prompt; the DiT's two
            guidance passes; the decoder's one latent).
        out_bytes: bytes of its output per video, moved to the next component's devices.
        spatial: the decoder's layers as :class:`~simulator.spatial.SpatialLayer` (empty: a
            transformer, laid out data x context x tensor).
        frames: frames of the decoder's input (the frame chunks must divide it); 0: none.
        guidance_bytes: bytes per sample the guidance passes exchange after each run when split
            over devices (the predicted velocity).
    """

    name: str
    workload: Workload
    runs: int
    samples: int
    out_bytes: float = 0.0
    spatial: tuple[SpatialLayer, ...] = ()
    frames: int = 0
    guidance_bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class ComponentPlan:
    """One option of one component (all times in seconds, bytes per device).

    ``layout``: the transformer layout (``Layout(1, 1)`` for a decoder); ``spatial`` the decoder's
    spatial degree (1 for a transformer), ``chunks`` its frame chunks; ``run_s`` one invocation,
    ``total_s`` all of a video's (``runs x run_s``); ``comm_s`` the part of ``total_s`` spent in
    collectives, halos and the guidance exchange; ``convolutional``: a spatially laid-out
    decoder."""

    component: str
    mesh: str
    first: int
    devices: int
    layout: Layout
    spatial: int
    chunks: int
    run_s: float
    total_s: float
    comm_s: float
    weight_bytes: float
    activation_bytes: float
    convolutional: bool = False

    @property
    def device_range(self) -> range:
        return range(self.first, self.first + self.devices)

    def describe(self) -> str:
        """``TP 8``, ``CFG 2 x TP 4``, ``Ulysses CP 2 x TP 4``, ``spatial 4 (height), 2 frame
        chunks``."""
        if self.convolutional:
            text = f"spatial {self.spatial} (height)" if self.spatial > 1 else "1 device"
            return text + (f", {self.chunks} frame chunks" if self.chunks > 1 else "")
        parts = []
        if self.layout.data > 1:
            parts.append(f"CFG {self.layout.data}")
        if self.layout.context > 1:
            method = "Ulysses" if self.layout.context_method == "alltoall" else self.layout.context_method
            parts.append(f"{method} CP {self.layout.context}")
        if self.layout.tensor > 1 or not parts:
            parts.append(f"TP {self.layout.tensor}")
        return " x ".join(parts)


@dataclass(frozen=True)
class VideoPlan:
    """The latency plan of one video.

    ``components``: the chosen option per component, in pipeline order; ``moves_s``: seconds
    moving outputs between component groups; ``seconds_per_video``: their sum with the
    components'; ``bound_s``: the lower bound (module docstring); ``options``: every feasible
    option per component (for the alternatives table), fastest first; ``searched``: assignments
    examined; ``memory_bytes``: the fullest device's bytes and its capacity (usable)."""

    cluster: str
    components: tuple[ComponentPlan, ...]
    moves_s: float
    seconds_per_video: float
    bound_s: float
    options: dict[str, tuple[ComponentPlan, ...]] = field(default_factory=dict)
    searched: int = 0
    memory_bytes: tuple[float, float] = (0.0, 0.0)


def _transformer_time(c: VideoComponent, mesh: MeshSpec, lay: Layout) -> tuple[float, float]:
    """(seconds, collective seconds) of one run of transformer ``c`` on ``mesh`` under ``lay``:
    the collective seconds count a ring's key/value passes whole, though the run's seconds charge
    only what the attention does not hide."""
    w, dtype = c.workload, compute_dtype(c.workload)
    per_dev = c.samples / (lay.data * lay.context)
    total = comm = 0.0
    for name in w.layers:
        cost = w.costs[name]
        total += layer_time(cost, FragmentKind.F, c.samples, mesh, lay, dtype, seq_len=w.seq_len)
        comm += tensor_parallel_comm(cost, mesh, lay, cost.tp_allreduce_bytes_per_sample * per_dev)
        comm += context_exchange(cost, FragmentKind.F, per_dev, mesh, lay)[1]
    if lay.data > 1 and c.guidance_bytes > 0:
        ex = collective(mesh, "all_gather", c.guidance_bytes * per_dev, lay.data,
                        lay.tensor * lay.context)
        total, comm = total + ex, comm + ex
    return total + fragment_overhead(mesh), comm


def _transformer_memory(c: VideoComponent, lay: Layout) -> tuple[float, float]:
    w = c.workload
    weights = sum(w.costs[n].param_bytes for n in w.layers) / lay.tensor
    per_dev = c.samples / (lay.data * lay.context)
    act = max(LIVE_ACTIVATIONS * w.costs[n].activation_bytes_per_sample
              + w.costs[n].residual_bytes_per_sample / lay.tensor for n in set(w.layers))
    return weights, act * per_dev


def _layouts(c: VideoComponent, g: int) -> list[Layout]:
    """The transformer layouts over ``g`` devices the model's dimensions allow."""
    out = []
    for data in (d for d in (1, 2) if c.samples % d == 0 and g % d == 0):
        for context in (x for x in range(1, g // data + 1) if (g // data) % x == 0):
            tensor = g // (data * context)
            for method in (("ring",) if context == 1 else ("alltoall", "ring")):
                if layout_problem(c.workload.shards, tensor, context=context,
                                  context_method=method, seq_len=c.workload.seq_len):
                    continue
                out.append(Layout(data=data, tensor=tensor, context=context,
                                  context_method=method))
    return out


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def component_options(c: VideoComponent, cluster: Cluster, headroom: float = 0.1,
                      max_chunks: int = 64, spatial_degree: int = 0) -> list[ComponentPlan]:
    """Every option of ``c`` on ``cluster`` whose own memory fits (first / last ``g`` devices of
    each mesh, each layout), fastest first; ``spatial_degree`` (0: any) keeps only that spatial
    degree for a decoder.

    Raises:
        PlannerError: ``c`` runs fewer than once or on no samples.
    """
    if c.runs < 1 or c.samples < 1:
        raise PlannerError(f"component {c.name!r}: runs {c.runs} and samples {c.samples} must be "
                           f">= 1; fix the pipeline's step count")
    out: list[ComponentPlan] = []
    for mesh in cluster.meshes.values():
        cap = usable_bytes(mesh, headroom)
        for g in range(1, mesh.num_devices + 1):
            sub = sub_mesh(mesh, g)
            starts = sorted({0, mesh.num_devices - g})
            found: list[tuple[Layout, int, int, float, float, float, float]] = []
            if c.spatial:
                if spatial_degree and g != spatial_degree:
                    continue
                try:
                    check_degree(c.spatial, g)
                except SpatialError:
                    continue
                t = spatial_time(c.spatial, c.samples, sub, g, compute_dtype(c.workload))
                weights, act = spatial_memory(c.spatial, c.samples, g)
                for k in (k for k in _divisors(max(c.frames, 1)) if k <= max_chunks):
                    extra = (k - 1) * len(c.spatial) * fragment_overhead(sub)
                    found.append((Layout(1, 1), g, k, t.total + extra + fragment_overhead(sub),
                                  t.halo + t.norm, weights, act / k))
            else:
                for lay in _layouts(c, g):
                    run, comm = _transformer_time(c, sub, lay)
                    weights, act = _transformer_memory(c, lay)
                    found.append((lay, 1, 1, run, comm, weights, act))
            for lay, s, k, run, comm, weights, act in found:
                if weights + act > cap:
                    continue
                for first in starts:
                    out.append(ComponentPlan(c.name, mesh.name, first, g, lay, s, k, run,
                                             c.runs * run, c.runs * comm, weights, act,
                                             bool(c.spatial)))
    # fastest first; among equals the fewest devices, the fewest chunks
    out.sort(key=lambda o: (round(o.total_s, 9), o.devices, o.chunks, o.first))
    return out


def _moves(chosen: tuple[ComponentPlan, ...], comps: tuple[VideoComponent, ...],
           cluster: Cluster) -> float:
    """Seconds moving each component's output to the next one's group (0 on the same group)."""
    total = 0.0
    for (a, ca), b in zip(zip(chosen, comps), chosen[1:]):
        nbytes = ca.out_bytes
        if (a.mesh, a.first, a.devices) == (b.mesh, b.first, b.devices) or nbytes <= 0:
            continue
        link = (cluster.meshes[a.mesh].intra_link if a.mesh == b.mesh
                else cluster.link_between(a.mesh, b.mesh).link)
        total += transfer_time(nbytes, link)
    return total


def _memory(chosen: tuple[ComponentPlan, ...]) -> dict[tuple[str, int], float]:
    """Bytes per (mesh, device): the weights of every component there, plus the largest
    activation among them."""
    weights: dict[tuple[str, int], float] = {}
    act: dict[tuple[str, int], float] = {}
    for o in chosen:
        for d in o.device_range:
            weights[(o.mesh, d)] = weights.get((o.mesh, d), 0.0) + o.weight_bytes
            act[(o.mesh, d)] = max(act.get((o.mesh, d), 0.0), o.activation_bytes)
    return {k: weights[k] + act[k] for k in weights}


def bound_seconds(comps: tuple[VideoComponent, ...], cluster: Cluster) -> float:
    """Every component's FLOP at the achievable rate of all the cluster's devices together."""
    total = 0.0
    for c in comps:
        rate = sum(m.num_devices * fastest_rate(m.device, c.workload)
                   for m in cluster.meshes.values())
        flops = sum(c.workload.costs[n].fwd_flops_per_sample for n in c.workload.layers)
        total += c.runs * c.samples * flops / rate
    return total


def plan_video(comps: tuple[VideoComponent, ...], cluster: Cluster,
               headroom: float = 0.1, spatial_degree: int = 0) -> VideoPlan:
    """The fastest assignment of ``comps`` to ``cluster`` for one video (module docstring);
    ``spatial_degree`` (0: searched) fixes the decoder's.

    Raises:
        InfeasibleError: a component has no option that fits, or no combination fits memory
            (the message names the component or the fullest device).
        PlannerError: an empty pipeline.
    """
    if not comps:
        raise PlannerError("the pipeline has no components; give at least one")
    if spatial_degree < 0:
        raise PlannerError(f"spatial degree {spatial_degree} must be >= 1 (0: searched); fix "
                           f"--decoder-spatial")
    options = {c.name: tuple(component_options(c, cluster, headroom,
                                               spatial_degree=spatial_degree)) for c in comps}
    for c in comps:
        if not options[c.name]:
            fixed = (f" at spatial degree {spatial_degree}" if spatial_degree and c.spatial
                     else "")
            raise InfeasibleError(
                f"component {c.name!r} ({c.workload.model}) fits no group of {cluster.name}'s "
                f"devices{fixed} within {1 - headroom:.0%} of their memory; use a cluster with "
                f"more or larger devices" + (", or another --decoder-spatial" if fixed else ""))
    caps = {(m.name, d): usable_bytes(m, headroom)
            for m in cluster.meshes.values() for d in range(m.num_devices)}
    lists = [options[c.name] for c in comps]
    rest = [sum(o[0].total_s for o in lists[i:]) for i in range(len(lists))] + [0.0]
    best: tuple[float, tuple[ComponentPlan, ...]] | None = None
    searched = 0

    def walk(i: int, chosen: tuple[ComponentPlan, ...], t: float) -> None:
        nonlocal best, searched
        if best is not None and t + rest[i] >= best[0] - 1e-12:
            return
        if i == len(lists):
            searched += 1
            mem = _memory(chosen)
            if any(v > caps[k] for k, v in mem.items()):
                return
            total = t + _moves(chosen, comps, cluster)
            if best is None or total < best[0] - 1e-12:
                best = (total, chosen)
            return
        for o in lists[i]:
            if best is not None and t + o.total_s + rest[i + 1] >= best[0] - 1e-12:
                break          # sorted: every later option is slower
            walk(i + 1, chosen + (o,), t + o.total_s)

    walk(0, (), 0.0)
    if best is None:
        full = min((max(_memory(ch).items(), key=lambda kv: kv[1] / caps[kv[0]])
                    for ch in itertools.product(*(ls[:1] for ls in lists))), key=lambda kv: kv[1])
        raise InfeasibleError(
            f"no assignment of {', '.join(c.name for c in comps)} fits {cluster.name}: the "
            f"fastest options need {full[1] / 1e9:.1f} GB on {full[0][0]} device {full[0][1]} of "
            f"{caps[full[0]] / 1e9:.1f} GB usable; use larger devices or lower --headroom")
    total, chosen = best
    mem = _memory(chosen)
    fullest = max(mem, key=lambda k: mem[k] / caps[k])
    moves = total - sum(o.total_s for o in chosen)
    return VideoPlan(cluster.name, chosen, moves, total, bound_seconds(comps, cluster), options,
                     searched, (mem[fullest], caps[fullest]))
