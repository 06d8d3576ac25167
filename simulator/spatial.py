"""Spatial sharding: one tensor dimension (a video's height) split over devices, costed per device.

A convolutional decoder cannot be tensor-parallel the Megatron way (a convolution's kernel reaches
across any split of its output channels' inputs, and a GroupNorm needs all of a group's channels
on one device), so the Tenstorrent Mochi guide (shared/reference/004, section 6, "VAE Decoder:
Spatial Input Sharding (4 devices)") replicates the decoder's weights and shards its input along
the height: each of ``s`` devices holds ``rows / s`` consecutive rows of every activation.

Per device and per layer (``s`` the spatial degree, a layer of ``rows`` input rows):

- work     = the cost model's forward of the layer on ``rows / s`` of its rows
  (:func:`simulator.cost_model.layer_time` with the samples scaled by ``1 / s``: the FLOP and the
  activation bytes split, the weights are read whole by every device, the fixed per-layer
  dispatch is paid by every device);
- halos    = before each ``k x k`` convolution, a device sends its first ``(k - 1) / 2`` rows to
  the device above and its last ones to the device below, and receives theirs (the two
  directions and the two neighbours' links run at once, Ethernet / NVLink being full duplex):
  one :func:`~simulator.cost_model.transfer_time` of ``halo_rows x row_bytes`` per convolution
  over the mesh's link; the devices at the two ends pad their outer side themselves (a
  convolution's edge padding needs no data from elsewhere);
- norms    = a GroupNorm's statistics over the whole height: two all-reduces over the ``s``
  devices per GroupNorm (the mean, then the variance about it, as the two-pass
  ``zoo.mochi_vae.group_norm`` computes them; ``stat_bytes`` each: one float32 per
  (sample, group, frame)).

Exchanges are not overlapped with the convolutions (the guide's program and the runtime's
``shard_map`` both exchange, then convolve), so the three add. Memory: the weights whole, the
activations divided by ``s`` (:func:`spatial_memory`).

Errors: :class:`SpatialError` (a ``ValueError``) for a degree that does not divide a layer's rows
or leaves a shard thinner than its halo.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hardware_profiles.types import MeshSpec
from ir import LayerCost, Layout
from ir.schedule import FragmentKind
from simulator.cost_model import collective, layer_time, transfer_time

__all__ = ["SpatialError", "SpatialLayer", "SpatialTime", "spatial_layer_time", "spatial_time",
           "spatial_memory", "check_degree", "sub_mesh"]


class SpatialError(ValueError):
    """A spatial degree the layers cannot take; the message names the degree and the fix."""


@dataclass(frozen=True, slots=True)
class SpatialLayer:
    """One layer of a spatially sharded program.

    Attributes:
        cost: the layer's traced forward cost (whole rows, one sample).
        rows: rows (height) of the layer's input.
        row_bytes: bytes of one input row of one sample (channels x frames x width x dtype bytes).
        convs: convolutions in the layer that read beyond a shard's rows (each needs a halo).
        halo_rows: rows a convolution reads beyond its shard on each side (``(k - 1) / 2``).
        norms: GroupNorms in the layer (each all-reduces its statistics over the devices).
        stat_bytes: bytes of one of a GroupNorm's two statistics all-reduces for one sample
            (float32 per group and frame).
    """

    cost: LayerCost
    rows: int
    row_bytes: float
    convs: int = 0
    halo_rows: int = 0
    norms: int = 0
    stat_bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class SpatialTime:
    """Seconds one device spends: ``work`` (its rows' compute and memory traffic), ``halo`` (the
    halo exchanges), ``norm`` (the GroupNorm statistics all-reduces); ``total`` their sum."""

    work: float
    halo: float
    norm: float

    @property
    def total(self) -> float:
        return self.work + self.halo + self.norm

    def __add__(self, other: SpatialTime) -> SpatialTime:
        return SpatialTime(self.work + other.work, self.halo + other.halo, self.norm + other.norm)


ZERO = SpatialTime(0.0, 0.0, 0.0)


def sub_mesh(mesh: MeshSpec, devices: int) -> MeshSpec:
    """``devices`` consecutive devices of ``mesh`` as a mesh of their own (one axis ``x``): the
    link and fabric of the mesh they are cut from.

    Raises:
        SpatialError: ``devices`` not in ``1 .. mesh.num_devices``.
    """
    if not 1 <= devices <= mesh.num_devices:
        raise SpatialError(f"a group of {devices} devices does not fit mesh {mesh.name!r} of "
                           f"{mesh.num_devices}; use 1 to {mesh.num_devices} devices")
    if devices == mesh.num_devices:
        return mesh
    return replace(mesh, name=f"{mesh.name}[:{devices}]", num_devices=devices,
                   axes={"x": devices})


def check_degree(layers: tuple[SpatialLayer, ...], degree: int) -> None:
    """Refuse a spatial ``degree`` that does not split every layer's rows evenly into shards at
    least as thick as their halos.

    Raises:
        SpatialError: naming the first layer that cannot take it.
    """
    if degree < 1:
        raise SpatialError(f"spatial degree {degree} must be >= 1; use 1 (no split) or more")
    for layer in layers:
        if layer.rows % degree or (degree > 1 and layer.rows // degree < layer.halo_rows):
            raise SpatialError(
                f"spatial degree {degree} does not split layer {layer.cost.name!r}'s "
                f"{layer.rows} rows into even shards of at least {layer.halo_rows} rows; use a "
                f"divisor of {layer.rows}")


def spatial_layer_time(layer: SpatialLayer, samples: float, mesh: MeshSpec, degree: int,
                       dtype: str = "bf16", seq_len: int = 0) -> SpatialTime:
    """Seconds one device of a ``degree``-device group of ``mesh`` spends on ``layer`` for
    ``samples`` samples (see the module's formulas). ``mesh`` is the group's own mesh
    (:func:`sub_mesh`); ``seq_len`` is passed to the cost model (0: no GEMM wave sizing)."""
    work = layer_time(layer.cost, FragmentKind.F, samples / degree, mesh, Layout(1, 1), dtype,
                      seq_len=seq_len)
    if degree == 1:
        return SpatialTime(work, 0.0, 0.0)
    link = mesh.collective_link(degree)
    halo = layer.convs * transfer_time(layer.halo_rows * layer.row_bytes * samples, link)
    norm = layer.norms * 2 * collective(mesh, "all_reduce", layer.stat_bytes * samples, degree)
    return SpatialTime(work, halo, norm)


def spatial_time(layers: tuple[SpatialLayer, ...], samples: float, mesh: MeshSpec, degree: int,
                 dtype: str = "bf16", seq_len: int = 0) -> SpatialTime:
    """The sum of :func:`spatial_layer_time` over ``layers`` (checked by :func:`check_degree`).

    Raises:
        SpatialError: ``degree`` cannot split the layers.
    """
    check_degree(layers, degree)
    total = ZERO
    for layer in layers:
        total = total + spatial_layer_time(layer, samples, mesh, degree, dtype, seq_len)
    return total


LIVE_ACTIVATIONS = 4.0
"""Activations a convolutional layer holds at once, in units of its input: its input (kept for the
residual add), the normalised copy (float32 inside the GroupNorm: twice the bf16 bytes) and the
convolution's output; an estimate, not traced."""


def spatial_memory(layers: tuple[SpatialLayer, ...], samples: float, degree: int) -> tuple[float, float]:
    """(weights, activations) bytes per device: every layer's weights whole (replicated), and
    :data:`LIVE_ACTIVATIONS` times the largest layer input or output of ``samples`` samples,
    divided by ``degree`` (each device holds its rows), plus the halos."""
    weights = sum(layer.cost.param_bytes for layer in layers)
    act = 0.0
    for layer in layers:
        rows = layer.rows // degree + 2 * layer.halo_rows * (degree > 1)
        live = max(layer.rows * layer.row_bytes, layer.cost.activation_bytes_per_sample)
        act = max(act, LIVE_ACTIVATIONS * live * samples * rows / (layer.rows * 1.0))
    return weights, act
