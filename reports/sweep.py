"""Budget sweeps: generate candidate clusters from counts of purchasable units per device type.

A sweep spec (YAML, or the ``sweep:`` block of an example) reads::

    budget_usd_per_hour: 100        # keep clusters whose LOW price is within this
    max_device_types: 2             # at most this many device types in one cluster
    max_options: 14                 # keep the most expensive (closest to budget) this many
    devices:
      h100-sxm:        {unit: 8, units: [0, 2, 4], mesh: per_unit, axes: {data: 8}}
      tpu-v5e:         {unit: 8, units: [0, 4, 8], mesh: slice}
      blackhole-p150b: {unit: 8, units: [0, 16, 32], mesh: per_unit, axes: {x: 2, y: 4}}

``unit`` is the device count of one purchasable unit (an 8-GPU DGX node, an 8-chip TPU v5e host,
a 2x4 TT-LoudBox of p150b); ``units`` the counts to try; ``mesh: per_unit`` makes every unit its
own mesh (pipeline stages across nodes/boxes), ``mesh: slice`` joins all units into one mesh (a TPU
slice on one ICI torus), ``mesh: nodes`` describes the units as a node group (each unit a node) and
lets the planner carve the meshes (``hardware_profiles.carve``). Link figures are copied from the
bundled clusters (:data:`LINK_FROM`).
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hardware_profiles import load_cluster, load_device
from planner import PlanOptions
from reports.errors import ReportError
from reports.pricing import cluster_price
from hardware_profiles.carve import carve, default_shapes
from hardware_profiles.types import Cluster, InterMeshLink, Link, MeshSpec, NodeGroup, ProfileError

LINK_FROM: dict[frozenset[str], tuple[str, tuple[str, str] | None]] = {
    frozenset({"h100-sxm"}): ("h100x64", None),
    frozenset({"blackhole-p150b", "ring"}): ("p150bx256", ("bh_00", "bh_01")),
    frozenset({"blackhole-p150b"}): ("p150bx256", None),
    frozenset({"tpu-v5e"}): ("tpuv5e256_h100x16", None),
    frozenset({"tpu-v5e", "h100-sxm"}): ("tpuv5e256_h100x16", None),
    frozenset({"tpu-v5e", "blackhole-p150b"}): ("tpuv5e256_h100x16", None),
    frozenset({"h100-sxm", "blackhole-p150b"}): ("h100x32_p150bx128", None),
}
"""Device pair -> (bundled cluster, mesh pair or None for its default_link) whose link is copied.

H100 node to node: IB NDR 8 x 400 Gb/s (h100x64). LoudBox to its ring neighbour: 4 x 400 GbE
card-to-card (p150bx256 bh_00<->bh_01); to other boxes: host 400 GbE (p150bx256 default). TPU slice
to anything: DCN 1600 Gb/s (tpuv5e256_h100x16 default). H100 to p150b: host-mediated 400 GbE
(h100x32_p150bx128 default). Any other pair falls back to that slowest host-mediated link."""
FALLBACK = ("h100x32_p150bx128", None)


@dataclass(frozen=True, slots=True)
class DeviceUnits:
    """One device type of a sweep: ``unit`` devices per unit, the unit counts to try."""

    device: str
    unit: int
    units: tuple[int, ...]
    mesh: str = "per_unit"
    axes: Mapping[str, int] | None = None


@dataclass(frozen=True, slots=True)
class SweepSpec:
    """A budget sweep (see the module docstring). Prices in USD per hour."""

    budget_usd_per_hour: float
    devices: tuple[DeviceUnits, ...]
    max_device_types: int = 3
    max_options: int = 16
    name: str = "sweep"


@dataclass(frozen=True, slots=True)
class SweepCandidate:
    cluster: Cluster
    label: str
    counts: Mapping[str, int]
    usd_per_hour_low: float
    max_tensor: int


@dataclass(frozen=True, slots=True)
class SweepResult:
    """Candidates kept (within budget, at most ``max_options``) and how many were dropped why."""

    spec: SweepSpec
    kept: tuple[SweepCandidate, ...]
    over_budget: int
    too_many_types: int
    cut_by_max_options: int
    notes: tuple[str, ...] = field(default_factory=tuple)


def _whole(x: Any) -> int:
    """``x`` as an int: an int, or a float or numeric string without a fractional part.

    Raises:
        ValueError: a bool, a fraction, a non-finite number or a string that is no number.
        TypeError: neither a number nor a string (a list, a mapping, None).
    """
    if isinstance(x, bool):
        raise ValueError(f"{x!r} is not an integer")
    f = float(x)
    if not (math.isfinite(f) and f == int(f)):
        raise ValueError(f"{x!r} is not an integer")
    return int(f)


def parse_spec(data: Any, name: str = "sweep") -> SweepSpec:
    """A :class:`SweepSpec` from a YAML mapping (optionally under a ``sweep:`` key).

    Raises:
        ReportError: a missing or bad key, an unknown device, a unit count that is not an integer.
    """
    if isinstance(data, Mapping) and "sweep" in data and isinstance(data["sweep"], Mapping):
        data = data["sweep"]
    if not isinstance(data, Mapping):
        raise ReportError("sweep spec is not a mapping; write 'budget_usd_per_hour:' and 'devices:'")
    unknown = set(data) - {"budget_usd_per_hour", "devices", "max_device_types", "max_options", "name"}
    if unknown:
        raise ReportError(f"sweep spec has unknown keys {sorted(unknown)}; use budget_usd_per_hour, "
                          f"devices, max_device_types, max_options, name")
    try:
        if isinstance(data.get("budget_usd_per_hour"), bool):
            raise TypeError("a bool")
        budget = float(data["budget_usd_per_hour"])
    except (KeyError, TypeError, ValueError, OverflowError):
        raise ReportError("sweep spec needs a numeric 'budget_usd_per_hour'; e.g. 100") from None
    if not 0 < budget <= 1e9:
        raise ReportError(f"sweep budget_usd_per_hour = {budget!r}; fix: use a number above 0 and "
                          f"at most 1e9")
    devs = data.get("devices")
    if not isinstance(devs, Mapping) or not devs:
        raise ReportError("sweep spec needs 'devices:' mapping device id -> {unit, units}")
    out = []
    for dev, d in devs.items():
        try:
            load_device(str(dev))
        except ProfileError as e:
            raise ReportError(f"sweep device {dev!r}: {e}") from None
        if not isinstance(d, Mapping):
            raise ReportError(f"sweep device {dev!r}: give a mapping {{unit: 8, units: [0, 1, 2]}}")
        try:
            unit = _whole(d.get("unit", 8))
            if not isinstance(d["units"], (list, tuple)):
                raise TypeError("units is not a list")
            units = tuple(_whole(u) for u in d["units"])
        except (KeyError, TypeError, ValueError, OverflowError):
            raise ReportError(f"sweep device {dev!r}: unit = {_brief(d.get('unit', 8))}, units = "
                              f"{_brief(d.get('units'))}; 'unit' must be an integer and 'units' a "
                              f"list of integers; e.g. units: [0, 2, 4]") from None
        mesh = str(d.get("mesh", "per_unit"))
        if (mesh not in ("per_unit", "slice", "nodes") or unit < 1 or not units
                or any(u < 0 for u in units)):
            raise ReportError(f"sweep device {dev!r}: need unit >= 1, units a non-empty list of "
                              f"counts >= 0 and mesh per_unit, slice or nodes (got unit={unit}, "
                              f"units={_shown(units)}, mesh={mesh!r})")
        most = MAX_UNITS_PER_UNIT_MESH if mesh in ("per_unit", "nodes") else MAX_SLICE_DEVICES // max(1, unit)
        if unit > MAX_SLICE_DEVICES or len(units) > MAX_UNIT_CHOICES or any(u > most for u in units):
            raise ReportError(f"sweep device {dev!r}: unit={unit}, units={_shown(units)} too large; "
                              f"fix: at most {MAX_UNIT_CHOICES} unit counts, each at most {most} "
                              f"(unit at most {MAX_SLICE_DEVICES} devices)")
        axes = d.get("axes")
        if axes is not None and not isinstance(axes, Mapping):
            raise ReportError(f"sweep device {dev!r}: axes {axes!r} is not a mapping; e.g. axes: {{data: 8}}")
        try:
            axes = {str(k): _whole(v) for k, v in axes.items()} if axes is not None else None
            axes_product = math.prod(axes.values()) if axes is not None else unit
        except (TypeError, ValueError, OverflowError):
            raise ReportError(f"sweep device {dev!r}: axes {dict(axes)} are not integers; "
                              f"e.g. axes: {{data: 8}}") from None
        if axes_product != unit:
            raise ReportError(f"sweep device {dev!r}: axes {dict(axes)} do not multiply to unit {unit}")
        out.append(DeviceUnits(str(dev), unit, units, mesh, axes or None))
    combos = math.prod(len(du.units) for du in out)
    if combos > MAX_COMBINATIONS:
        raise ReportError(f"sweep spec tries {combos} combinations of unit counts; fix: list fewer "
                          f"unit counts (at most {MAX_COMBINATIONS} combinations)")
    try:
        types, options = _whole(data.get("max_device_types", 3)), _whole(data.get("max_options", 16))
    except (TypeError, ValueError, OverflowError):
        raise ReportError(f"sweep max_device_types = {_brief(data.get('max_device_types', 3))}, "
                          f"max_options = {_brief(data.get('max_options', 16))}; both must be "
                          f"integers; e.g. 2 and 14") from None
    if not (1 <= types <= 64 and 1 <= options <= 1000):
        raise ReportError(f"sweep max_device_types = {types}, max_options = {options}; fix: use "
                          f"1 to 64 device types and 1 to 1000 options")
    return SweepSpec(budget, tuple(out), types, options, str(data.get("name", name)))


def _brief(value: Any) -> str:
    """``repr(value)``, cut to 40 characters (a value quoted from the user's spec)."""
    s = repr(value)
    return s if len(s) <= 40 else s[:37] + "..."


def _shown(units: tuple[int, ...]) -> str:
    s = str(list(units))
    return s if len(s) <= 60 else s[:57] + "..."


MAX_SLICE_DEVICES = 2**20
"""Most devices in one unit or one ``mesh: slice`` mesh (the cluster loader's per-mesh limit)."""
MAX_UNITS_PER_UNIT_MESH = 256
"""Most units of one device type with ``mesh: per_unit`` (each is a mesh; links grow as its square)."""
MAX_UNIT_CHOICES = 64
"""Most unit counts listed for one device type."""
MAX_COMBINATIONS = 10_000
"""Most unit-count combinations a sweep enumerates (the product of the list lengths)."""


def _short(device: str) -> str:
    """Mesh-name prefix of a device id: h100-sxm -> h100, tpu-v5e -> v5e, blackhole-p150b -> p150b."""
    for junk in ("blackhole-", "wormhole-", "tpu-", "-sxm"):
        device = device.replace(junk, "")
    return device.replace("-", "")


@functools.cache
def _link(a: str, b: str, ring: bool = False) -> tuple[Link, str]:
    key = frozenset({a, "ring"}) if ring and a == b else frozenset({a, b})
    stem, pair = LINK_FROM.get(key, FALLBACK)
    c = load_cluster(stem)
    ln = c.link_between(*pair).link if pair else c.default_link
    if ln is None:
        raise ReportError(f"bundled cluster {stem!r} has no default_link to copy for {a}<->{b}")
    return ln, f"{stem}:{'<->'.join(pair) if pair else 'default_link'}"


def _names(counts: Mapping[str, int], spec: SweepSpec) -> tuple[str, str]:
    """(cluster name, label) of ``counts`` units per device type, e.g. ``("h100x16+p150bx64",
    "16 h100-sxm + 64 blackhole-p150b")``."""
    used = [du for du in spec.devices if counts.get(du.device)]
    return ("+".join(f"{_short(du.device)}x{counts[du.device] * du.unit}" for du in used),
            " + ".join(f"{counts[du.device] * du.unit} {du.device}" for du in used))


SCALE_OUT_LATENCY = 10e-6
"""Per-hop latency between nodes of a generated node group, s (estimate: switch hops + collective
library; the bundled clusters use 5-20 us)."""


def _node_group_cluster(counts: Mapping[str, int], spec: SweepSpec) -> tuple[Cluster, int]:
    """A node-group cluster (every device type ``mesh: nodes`` or ``slice``): each unit a node
    (a ``slice`` type: one node of all its units), NICs from the device profiles, and between two
    types the copied link (:data:`LINK_FROM`) once per unit of the smaller type as the fabric cap."""
    groups: dict[str, NodeGroup] = {}
    units: dict[str, tuple[str, int]] = {}
    for du in spec.devices:
        n = counts.get(du.device, 0)
        if not n:
            continue
        dev = load_device(du.device)
        short = _short(du.device)
        nodes, per = (1, n * du.unit) if du.mesh == "slice" else (n, du.unit)
        intra = Link(dev.scale_up_bandwidth, dev.scale_up_latency,
                     f"device {dev.name} scale_up: {dev.sources.get('scale_up_bandwidth', '')}")
        so = Link(dev.scale_out_bandwidth, SCALE_OUT_LATENCY,
                  f"device {dev.name} scale_out: {dev.sources.get('scale_out_bandwidth', '')}; latency: estimate")
        groups[short] = NodeGroup(short, dev, nodes, per, intra, so)
        units[short] = (du.device, n)
    glinks = []
    for a, b in itertools.combinations(groups, 2):
        ln, src = _link(units[a][0], units[b][0])
        k = min(units[a][1], units[b][1])
        glinks.append(InterMeshLink(a, b, Link(k * ln.bandwidth, ln.latency,
                                                f"{k} x the link copied from {src}: {ln.source}")))
    name, label = _names(counts, spec)
    physical = Cluster(name=name, meshes={}, links=(), path="", groups=groups, group_links=tuple(glinks),
                       description=f"generated by the budget sweep (node groups): {label}")
    c = carve(physical, default_shapes(physical))
    return c, max(g.num_devices for g in groups.values())


def build_cluster(counts: Mapping[str, int], spec: SweepSpec) -> tuple[Cluster, int]:
    """The cluster of ``counts`` units per device type, and the largest mesh size.

    Meshes: ``<short>_<i>`` per unit, or one ``<short>_slice`` for ``mesh: slice``. Links: see
    :data:`LINK_FROM`; LoudBoxes form a ring (neighbours cabled card to card). When any type says
    ``mesh: nodes`` the cluster is described as node groups instead and the planner carves it
    (:func:`_node_group_cluster`).
    """
    if any(du.mesh == "nodes" and counts.get(du.device) for du in spec.devices):
        return _node_group_cluster(counts, spec)
    meshes: dict[str, MeshSpec] = {}
    kind: dict[str, tuple[str, int]] = {}  # mesh -> (device, index within its type)
    for du in spec.devices:
        n = counts.get(du.device, 0)
        if not n:
            continue
        dev = load_device(du.device)
        short = _short(du.device)
        groups = [(f"{short}_slice", n * du.unit)] if du.mesh == "slice" else \
            [(f"{short}_{i:02d}", du.unit) for i in range(n)]
        for i, (name, size) in enumerate(groups):
            axes = dict(du.axes) if du.axes and size == du.unit else {"data": size}
            intra = Link(dev.scale_up_bandwidth, dev.scale_up_latency,
                         f"device {dev.name} scale_up: {dev.sources.get('scale_up_bandwidth', '')}")
            meshes[name] = MeshSpec(name, dev, size, axes, intra)
            kind[name] = (du.device, i)
    links = []
    names = list(meshes)
    ring_n = {d: sum(1 for m in names if kind[m][0] == d) for d, _ in kind.values()}
    for a, b in itertools.combinations(names, 2):
        (da, ia), (db, ib) = kind[a], kind[b]
        ring = da == db == "blackhole-p150b" and (abs(ia - ib) == 1
                                                  or {ia, ib} == {0, ring_n[da] - 1})
        ln, src = _link(da, db, ring)
        links.append(InterMeshLink(a, b, Link(ln.bandwidth, ln.latency, f"copied from {src}: {ln.source}")))
    name, label = _names(counts, spec)
    c = Cluster(name=name, meshes=meshes, links=tuple(links), default_link=None,
                path="", description=f"generated by the budget sweep: {label}")
    return c, max(m.num_devices for m in meshes.values())


def generate(spec: SweepSpec, prices: Mapping[str, tuple[float, float]] | None = None
             ) -> SweepResult:
    """Enumerate unit counts, keep clusters within budget at the LOW price, cap the count.

    Order of the kept candidates: most expensive first (closest to the budget), then by label;
    when more than ``max_options`` fit, the cheapest are cut (and counted).

    Raises:
        ReportError: no combination fits the budget.
    """
    prices = prices or {}
    over = many = 0
    kept: list[SweepCandidate] = []
    for combo in itertools.product(*(du.units for du in spec.devices)):
        counts = {du.device: n for du, n in zip(spec.devices, combo) if n}
        if not counts:
            continue
        if len(counts) > spec.max_device_types:
            many += 1
            continue
        cluster, biggest = build_cluster(counts, spec)
        lo, _, _ = cluster_price(cluster, prices)
        if not lo <= spec.budget_usd_per_hour:
            over += 1
            continue
        label = " + ".join(f"{n * du.unit} {du.device}" for du, n in zip(spec.devices, combo) if n)
        # tensor parallel stays within 8 devices (one node's scale-up domain); FSDP covers memory
        kept.append(SweepCandidate(cluster, label, counts, lo, min(biggest, PlanOptions().max_tensor)))
    if not kept:
        raise ReportError(f"no cluster of the sweep fits ${spec.budget_usd_per_hour:g}/h at the low "
                          f"price; raise budget_usd_per_hour or add smaller unit counts")
    kept.sort(key=lambda c: (-c.usd_per_hour_low, c.label))
    cut = max(0, len(kept) - spec.max_options)
    return SweepResult(spec, tuple(kept[:spec.max_options]), over, many, cut)
