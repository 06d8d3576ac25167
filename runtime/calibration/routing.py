"""A mixture of experts' token routing, timed and fitted as a time per (token, expert) pair.

A mixture-of-experts block moves each token's row into the slots of the experts it is routed to
and back (``zoo.layers.moe_swiglu``: a gather each way, their transposes in the backward). On an
accelerator those gathers run at its memory bandwidth, which the layer's bytes already charge; on
XLA:CPU a gather runs as a scalar loop, row by row, and the small routed block below took 1.5 to
2.5 times what the cost model charged it without a term of its own (2026-11-27, this project's
2-core host: 2.0 ms measured against 1.3 ms at 2 samples, 25.7 ms against 10.0 ms at 32).

:func:`measure_routed_block` times the tiny mixture of experts' block (``zoo/configs/tiny-moe.yaml``)
forward (keeping its residuals) and whole backward under data and expert parallelism at two
microbatches (:data:`ROUTED_SAMPLES`); :func:`fit_routing_pairs` charges each timing what ``simulator.cost_model.layer_time``
charges it on the calibrated profile (routing terms 0) plus the fragment overhead, and fits what is
left as seconds per pair of the device's tokens (``DeviceProfile.forward_routing_pair`` /
``backward_routing_pair``), least squares in relative error so each timing counts alike.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding

from ir import Layout
from hardware_profiles.types import MeshSpec
from hardware_profiles.paths import PACKAGE_ROOT
from runtime.calibration.fit import ROUTED_MODEL, CalibrationError, FragmentTiming
from runtime.calibration.timing import placed_params, time_interleaved
from runtime.train.layouts import batch_spec, layout_mesh
from simulator import cost_model as cm
from zoo.costing import workload
from zoo.decoder import block_fn, block_shapes
from zoo.model_files import load_model_file

ROUTED_PATH = PACKAGE_ROOT / ROUTED_MODEL
"""The timed block's model file (:data:`runtime.calibration.fit.ROUTED_MODEL`)."""

ROUTED_SAMPLES = (2, 4, 8)
"""Microbatches (the mesh's samples) the routed block is timed at."""

ROUTED_LAYOUTS = ("dp", "ep")
"""Data parallel over the mesh, and expert parallel over it (the batch split as under data
parallel, each device holding ``1 / n`` of the experts, tokens exchanged by all-to-all)."""

ROUTED_CALLS = 5
"""Calls of each timing per round (the median is kept)."""


def routed_layout(name: str, devices: int) -> Layout:
    """The :class:`~ir.Layout` routed-block layout ``name`` (``"dp"``, ``"ep"``) means.

    Raises:
        ValueError: an unknown name.
    """
    if name == "dp":
        return Layout(devices, 1)
    if name == "ep":
        return Layout(devices, 1, expert=devices)
    raise ValueError(f"unknown routed-block layout {name!r}; use one of {', '.join(ROUTED_LAYOUTS)}")


def measure_routed_block(mesh: Mesh, samples: Sequence[int] = ROUTED_SAMPLES, *,
                         repeats: int = 5) -> list[FragmentTiming]:
    """Time the tiny mixture of experts' block (:data:`~runtime.calibration.fit.ROUTED_MODEL`) on
    ``mesh`` under each of :data:`ROUTED_LAYOUTS` at each of ``samples``: its training forward (keeping the residuals)
    and whole backward, in ``max(15, 3 x repeats)`` interleaved rounds of
    :data:`ROUTED_CALLS` calls each (the median; see
    :func:`runtime.calibration.timing.time_interleaved`). FLOP and bytes are left 0: the fit
    costs each timing through the cost model itself (:func:`fit_routing_pairs`)."""
    cfg = load_model_file(ROUTED_PATH)
    n = mesh.devices.size
    calls: list[tuple[Any, tuple]] = []
    keys: list[tuple[str, int, str]] = []
    for name in ROUTED_LAYOUTS:
        lay = routed_layout(name, n)
        m = layout_mesh(list(mesh.devices.flat), lay)
        params = placed_params(cfg, block_shapes(cfg), m, lay, jax.random.PRNGKey(0))
        with jax.set_mesh(m):
            fwd = jax.jit(lambda p, h: jax.vjp(lambda p, h: block_fn(cfg)(p, h), p, h))
            bwd = jax.jit(lambda f, c: f(c))
            for b in samples:
                x = jax.device_put(
                    jax.random.normal(jax.random.PRNGKey(b), (b, cfg.seq_len, cfg.hidden),
                                      cfg.jnp_dtype) * 0.1, NamedSharding(m, batch_spec(lay)))
                y, vjp_fn = fwd(params, x)
                ct = jnp.ones_like(y)
                calls += [(fwd, (params, x)), (bwd, (vjp_fn, ct))]
                keys += [(name, b, "F"), (name, b, "B")]
    seconds = time_interleaved(calls, max(15, 3 * repeats), per_round=ROUTED_CALLS, warmup=1)
    return [FragmentTiming("routed_block", kind, b, 0.0, 0.0, s, name, cfg.seq_len)
            for (name, b, kind), s in zip(keys, seconds)]


def fit_routing_pairs(timings: Sequence[FragmentTiming], mesh: MeshSpec, overhead: float
                      ) -> tuple[float, float]:
    """(forward, backward) seconds per routed (token, expert) pair on one device of ``mesh``.

    Each timing ``i`` of kind ``k`` leaves ``r_i = seconds_i - overhead - layer_time(...)`` (the
    simulator's charge for the block on ``mesh``, whose device must have no routing terms yet)
    for its ``p_i`` pairs per device (``LayerCost.routed_pairs_per_sample x samples / data``);
    the fit minimises ``sum ((r_i - x p_i) / seconds_i)^2``: ``x = sum(p r / s^2) / sum(p^2 /
    s^2)``, at least 0.

    Raises:
        CalibrationError: a kind without timings, or a device that already charges routing.
    """
    dev = mesh.device
    if dev.forward_routing_pair or dev.backward_routing_pair:
        raise CalibrationError(f"device {dev.name!r} already charges routing; fit on a profile "
                               f"without forward/backward_routing_pair")
    cfg = load_model_file(ROUTED_PATH)
    out = []
    for kind in ("F", "B"):
        num = den = 0.0
        rows = [t for t in timings if t.kind == kind]
        if not rows:
            raise CalibrationError(f"no routed-block {kind} timings to fit the routing time on")
        for t in rows:
            lay = routed_layout(t.layout, mesh.num_devices)
            w = workload(cfg, max(1, t.samples))
            cost = w.costs["decoder_block"]
            charged = cm.layer_time(cost, kind, float(t.samples), mesh, lay,
                                    cm.compute_dtype(w), seq_len=w.seq_len)
            pairs = cost.routed_pairs_per_sample * t.samples / lay.data
            rest = t.seconds - overhead - charged
            num += pairs * rest / t.seconds ** 2
            den += pairs ** 2 / t.seconds ** 2
        out.append(max(0.0, num / den) if den > 0 else 0.0)
    return out[0], out[1]
