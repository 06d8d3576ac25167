"""Fragments timed under the layouts plans use, and the collectives inside them.

A plan's mesh runs its fragments data parallel (``"dp"``: the batch split over ``n`` devices,
parameters replicated, the backward all-reducing its layer's gradients), tensor parallel (``"tp"``:
Megatron-LM's column/row/vocabulary-parallel weights over ``n`` devices, the activations
all-reduced twice per block in the forward and twice in the backward) or fully sharded
(``"fsdp"``: the batch and every parameter split over ``n`` devices, the forward all-gathering the
layer's parameters and the backward gathering them again and reduce-scattering its gradients).
``mpmd calibrate`` times the zoo's layers under all three (:func:`runtime.calibration.measure.
measure_fragments`), so the fitted link is the one these collectives really reach inside a fragment.

For each timed fragment, :func:`layout_costs` gives what ``simulator.cost_model.layer_time``
charges it (FLOP and bytes per device) and :func:`collective_terms` its collectives as
``fixed + per / bandwidth`` seconds (the ring formulas of ``hardware_profiles.collectives``, split
into the latency part and the part linear in 1 / bandwidth, which the fits solve for).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

from ir import Layout
from hardware_profiles.collectives import all_gather, reduce_scatter, ring_all_reduce
from hardware_profiles.types import Link
from simulator.cost_model import GRAD_BYTES_PER_PARAM
from zoo.costing import workload

LAYOUTS = ("dp", "tp", "fsdp")
"""Layouts fragments are timed under (see the module docstring)."""

LAYER_BODY = {"embed": "embed", "block": "decoder_block", "head": "head"}
"""Timed layer -> the unique fragment body of the workload it is costed as."""

def layout_of(name: str, devices: int) -> Layout:
    """The :class:`~ir.Layout` of ``devices`` devices that layout ``name`` means.

    Raises:
        ValueError: an unknown layout name.
    """
    if name == "dp":
        return Layout(devices, 1)
    if name == "tp":
        return Layout(1, devices)
    if name == "fsdp":
        return Layout(devices, 1, fsdp=True)
    raise ValueError(f"unknown layout {name!r}; use one of {', '.join(LAYOUTS)}")


def _cost(model: str, samples: int, layer: str, seq_len: int = 0):
    return workload(model, max(1, samples), seq_len=seq_len or None).costs[LAYER_BODY[layer]]


def layout_costs(frags: Sequence, devices: int, *, model: str = "llama-tiny") -> list:
    """``frags`` (:class:`~runtime.calibration.fit.FragmentTiming`) with per-device FLOP and bytes
    replaced by what ``simulator.cost_model.layer_time`` charges, so the fitted rates reproduce the
    measured times through the simulator's own costing: ``flops_per_sample x samples /
    d / t`` and ``(bytes_fixed + bytes_per_sample x samples / d) / t`` for the fragment's layout
    ``d x t`` (the ``zoo.costing`` workload's figures, at the fragment's ``seq_len``), with
    ``bytes_fixed / t`` of them as its ``weight_bytes`` and the layer's primitive ops in that
    kind as its ``ops``."""
    out = []
    for f in frags:
        c = _cost(model, f.samples, f.layer, f.seq_len)
        lay = layout_of(f.layout, devices)
        per_dev = f.samples / lay.data
        if f.kind == "F":
            flops, fixed = c.fwd_flops_per_sample * per_dev, c.fwd_bytes_fixed
            nbytes = fixed + c.fwd_bytes_per_sample * per_dev
        else:
            flops, fixed = c.bwd_flops_per_sample * per_dev, c.bwd_bytes_fixed
            nbytes = fixed + c.bwd_bytes_per_sample * per_dev
        out.append(replace(f, flops=flops / lay.tensor, bytes=nbytes / lay.tensor,
                           weight_bytes=fixed / lay.tensor,
                           ops=c.fwd_ops if f.kind == "F" else c.bwd_ops))
    return out


def collective_terms(f, devices: int, latency: float, *,
                     model: str = "llama-tiny") -> tuple[float, float]:
    """``(fixed, per)``: fragment ``f``'s collectives over its mesh of ``devices`` take
    ``fixed + per / bandwidth`` seconds on a link of ``latency`` and ``bandwidth``, as
    ``simulator.cost_model.layer_time`` charges them (with ``grad_sync="microbatch"``, what the
    runtime executes):

    - ``dp`` backward: the ring all-reduce of the layer's fp32 gradients;
    - ``tp`` forward and backward: the ring all-reduce of the activations
      (``tp_allreduce_bytes_per_sample`` x samples);
    - ``fsdp`` forward: the all-gather of the layer's parameters; backward: that all-gather and
      the reduce-scatter of its fp32 gradients (a device that overlaps nothing inside a fragment,
      as XLA:CPU, adds them to the compute: ``roofline: sum``).
    """
    c = _cost(model, f.samples, f.layer, f.seq_len)
    lay = layout_of(f.layout, devices)

    def terms(op, nbytes: float) -> tuple[float, float]:
        if nbytes <= 0 or devices <= 1:
            return 0.0, 0.0
        return op(nbytes, devices, Link(math.inf, latency)), op(nbytes, devices, Link(1.0, 0.0))

    parts: list[tuple[float, float]] = []
    if f.layout == "dp" and f.kind != "F":
        parts.append(terms(ring_all_reduce, c.param_count * GRAD_BYTES_PER_PARAM))
    elif f.layout == "tp":
        parts.append(terms(ring_all_reduce, c.tp_allreduce_bytes_per_sample * f.samples / lay.data))
    elif f.layout == "fsdp":
        parts.append(terms(all_gather, c.param_bytes))
        if f.kind != "F":
            parts.append(terms(reduce_scatter, c.param_count * GRAD_BYTES_PER_PARAM))
    return sum(p[0] for p in parts), sum(p[1] for p in parts)
