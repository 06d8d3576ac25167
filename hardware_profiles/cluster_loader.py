"""Load cluster specs from YAML into :class:`hardware_profiles.types.Cluster` (SI units).

A cluster file lists its meshes (each of one device kind, with the links inside it and between
meshes) or describes its hardware as bought (``node_groups`` and ``group_links``: nodes of one
kind joined by a scale-out link, carved into meshes by :mod:`hardware_profiles.carve`). Devices
are loaded by :func:`hardware_profiles.loader.load_device`; the files' shapes and limits are
:mod:`hardware_profiles.file_shapes`'. Every bad input raises :class:`ProfileError` with one line
naming the file, the bad value and the fix.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from pydantic import ValidationError

from hardware_profiles.carve import carve, default_shapes
from hardware_profiles.file_shapes import (GB, GBIT, MAX_DEVICES, MAX_NODES, MAX_TOTAL_DEVICES,
                                           NAME_PATTERN, US, _ClusterFile, _GroupFile,
                                           _IntraLink, _MeshFile)
from hardware_profiles.loader import _from_validation, _read_yaml, load_device
from hardware_profiles.paths import CLUSTERS_DIR, resolve_cluster_path
from hardware_profiles.types import (Cluster, DeviceProfile, InterMeshLink, Link, MeshSpec,
                                     NodeGroup, ProfileError)


# ----------------------------------------------------------------------------- clusters
def _bandwidth(path: Path, where: str, gbit: float | None, gb: float | None) -> float:
    if (gbit is None) == (gb is None):
        raise ProfileError(f"{path}: {where} gives {'both' if gbit else 'neither'} bandwidth_gbit_per_s and "
                           f"bandwidth_gb_per_s; fix: give exactly one of them")
    return gbit * GBIT if gbit is not None else gb * GB


def _intra(path: Path, given: "_IntraLink | None", device: DeviceProfile, what: str) -> Link:
    """The per-device link inside a mesh or node: as given, else the device's scale-up fabric."""
    if given is not None:
        return Link(given.bandwidth_gb_per_s * GB, given.latency_us * US,
                    given.source or f"{path.name}: {what} intra_link")
    return Link(device.scale_up_bandwidth, device.scale_up_latency,
                f"device {device.name} scale_up: {device.sources.get('scale_up_bandwidth', '')}")


def _scale_up_domain(path: Path, what: str, domain: int | None, per_node: int | None) -> None:
    """Refuse a ``scale_up_domain`` that is not a whole number of nodes, in one line."""
    if domain is None:
        return
    if per_node is None:
        raise ProfileError(f"{path}: {what} scale_up_domain {domain} needs devices_per_node (the devices of one "
                           f"node); fix: set devices_per_node or remove scale_up_domain")
    if domain % per_node:
        lower, upper = domain // per_node * per_node, -(-domain // per_node) * per_node
        near = f"{upper}" if lower == 0 else f"{lower} or {upper}"
        raise ProfileError(f"{path}: {what} scale_up_domain {domain} is not a multiple of devices_per_node "
                           f"{per_node}; fix: use whole nodes (e.g. {near}) or remove it for one node's devices")


def _mesh(path: Path, m: _MeshFile) -> MeshSpec:
    device = load_device(m.device, base_dir=path.parent)
    _scale_up_domain(path, f"mesh {m.name!r}", m.scale_up_domain, m.devices_per_node)
    axes = dict(m.axes) if m.axes else {"data": m.num_devices}
    bad = {k: v for k, v in axes.items() if v < 1}
    if bad:
        raise ProfileError(f"{path}: mesh {m.name!r} axes {bad} have sizes < 1; fix: use positive axis sizes")
    big = {k: v for k, v in axes.items() if v > MAX_DEVICES}
    if big or len(axes) > 16:
        raise ProfileError(f"{path}: mesh {m.name!r} axes {big or len(axes)} exceed "
                           f"{'the size limit ' + str(MAX_DEVICES) if big else '16 axes'}; "
                           f"fix: use at most 16 axes of at most {MAX_DEVICES} devices")
    product = math.prod(axes.values())
    if product != m.num_devices:
        shown = "{" + ", ".join(f"{k}: {v}" for k, v in axes.items()) + "}"
        raise ProfileError(f"{path}: mesh {m.name!r} axes {shown} multiply to {product}, not num_devices "
                           f"{m.num_devices}; fix the axis sizes")
    intra = _intra(path, m.intra_link, device, f"mesh {m.name}")
    scale_out = None
    if m.scale_out_link is not None:
        so = m.scale_out_link
        scale_out = Link(_bandwidth(path, f"mesh {m.name!r} scale_out_link", so.bandwidth_gbit_per_s,
                                    so.bandwidth_gb_per_s), so.latency_us * US, so.source)
    return MeshSpec(name=m.name, device=device, num_devices=m.num_devices, axes=axes, intra_link=intra,
                    price_per_device_hour=m.price_usd_per_device_hour,
                    power_watts_per_device=m.power_w_per_device, host=m.host,
                    devices_per_node=m.devices_per_node, scale_out_link=scale_out,
                    scale_up_domain=(m.scale_up_domain if m.scale_up_domain != m.devices_per_node
                                     else None))


def _group(path: Path, g: _GroupFile) -> NodeGroup:
    _scale_up_domain(path, f"node group {g.name!r}", g.scale_up_domain, g.devices_per_node)
    device = load_device(g.device, base_dir=path.parent)
    intra = _intra(path, g.intra_link, device, f"node group {g.name}")
    so = g.scale_out_link
    if so.bandwidth_gbit_per_s is None and so.bandwidth_gb_per_s is None:
        bw, src = device.scale_out_bandwidth, (f"device {device.name} scale_out: "
                                               f"{device.sources.get('scale_out_bandwidth', '')}; {so.source}")
    else:
        bw = _bandwidth(path, f"node group {g.name!r} scale_out_link", so.bandwidth_gbit_per_s,
                        so.bandwidth_gb_per_s)
        src = so.source
    return NodeGroup(name=g.name, device=device, nodes=g.nodes, devices_per_node=g.devices_per_node,
                     intra_link=intra, scale_out_link=Link(bw, so.latency_us * US, src),
                     price_per_device_hour=g.price_usd_per_device_hour,
                     power_watts_per_device=g.power_w_per_device, host=g.host,
                     scale_up_domain=(g.scale_up_domain if g.scale_up_domain != g.devices_per_node
                                      else None))


def _named(p: Path, entries, kind: str, build) -> dict:
    """``build(p, entry)`` per entry, by name: a duplicate name or a bad entry is one line."""
    out: dict = {}
    for e in entries:
        if e.name in out:
            raise ProfileError(f"{p}: duplicate {kind} name {e.name!r}; fix: give every {kind.split()[-1]} a "
                               f"unique name")
        try:
            out[e.name] = build(p, e)
        except ProfileError as exc:
            msg = str(exc)
            raise ProfileError(msg if msg.startswith(str(p)) else f"{p}: {kind} {e.name!r}: {msg}") from None
    return out


def _links(p: Path, entries, names, key: str, kind: str) -> tuple[InterMeshLink, ...]:
    """The ``key`` list of links between named ``kind``s (meshes or node groups), checked."""
    out, seen = [], set()
    for i, ln in enumerate(entries):
        a, b = ln.between
        for end in (a, b):
            if end not in names:
                raise ProfileError(f"{p}: {key}[{i}] names unknown {kind} {end!r}; fix: use one of {list(names)}")
        if a == b:
            noun = "meshes" if kind == "mesh" else "groups"
            raise ProfileError(f"{p}: {key}[{i}] joins {kind} {a!r} to itself; fix: name two different {noun}")
        pair = frozenset((a, b))
        if pair in seen:
            raise ProfileError(f"{p}: {key}[{i}] duplicates the link between {a!r} and {b!r}; fix: keep one entry")
        seen.add(pair)
        bw = _bandwidth(p, f"{key}[{i}]", ln.bandwidth_gbit_per_s, ln.bandwidth_gb_per_s)
        out.append(InterMeshLink(a, b, Link(bw, ln.latency_us * US, ln.source)))
    return tuple(out)


def _common(p: Path, f: "_ClusterFile", hosts: set[str], users: str) -> Link | None:
    """Checks both cluster forms share (host slots naming a used host, a usable name) and the
    default link."""
    for h, n in f.host_slots.items():
        if h not in hosts:
            raise ProfileError(f"{p}: host_slots names host {h!r}, which no {users} uses; fix: use one of "
                               f"{sorted(hosts)}")
        if not 1 <= n <= MAX_DEVICES:
            raise ProfileError(f"{p}: host_slots[{h!r}] = {n}; fix: use a slot count from 1 to {MAX_DEVICES}")
    if f.name is None and not re.match(NAME_PATTERN, p.stem):
        raise ProfileError(f"{p}: the file name {p.stem!r} is not a usable cluster name; fix: set "
                           f"'name:' (letters, digits and _ . + - only)")
    if f.default_link is None:
        return None
    d = f.default_link
    return Link(_bandwidth(p, "default_link", d.bandwidth_gbit_per_s, d.bandwidth_gb_per_s),
                d.latency_us * US, d.source)


def _node_group_cluster(p: Path, f: _ClusterFile) -> Cluster:
    """A cluster described as node groups: its meshes are its nodes (one each) until carved."""
    if f.meshes or f.links:
        raise ProfileError(f"{p}: a cluster gives node_groups and also meshes/links; fix: describe "
                           f"the hardware as node_groups (with group_links) or as meshes, not both")
    if f.carve == "fixed":
        raise ProfileError(f"{p}: 'carve: fixed' keeps a mesh listing as written, but this cluster gives "
                           f"node_groups, which the planner always carves; fix: remove 'carve: fixed' "
                           f"or list the meshes under 'meshes'")
    groups: dict[str, NodeGroup] = _named(p, f.node_groups, "node group", _group)
    if sum(g.nodes for g in groups.values()) > MAX_NODES:
        raise ProfileError(f"{p}: {sum(g.nodes for g in groups.values())} nodes in all; fix: use at most "
                           f"{MAX_NODES} nodes (no cluster built is larger; describe larger nodes, e.g. "
                           f"a TPU slice as one node)")
    glinks = _links(p, f.group_links, groups, "group_links", "node group")
    default = _common(p, f, {g.host for g in groups.values() if g.host}, "node group")
    physical = Cluster(name=f.name or p.stem, meshes={}, links=(), default_link=default, path=str(p),
                       description=f.description, p2p=f.p2p, groups=groups, group_links=tuple(glinks),
                       host_slots=dict(f.host_slots))
    return carve(physical, default_shapes(physical))


def load_cluster(path: str | Path) -> Cluster:
    """Load a cluster spec: named meshes of one device type each, plus inter-mesh links.

    ``path`` may also be a bundled cluster's stem (``"h100x64"``) or a bundled file's path from the
    repository root (``"hardware_profiles/clusters/h100x64.yaml"``) when no such file exists below
    the working directory. Inter-mesh link bandwidth is the aggregate per direction between the two meshes.

    Raises:
        ProfileError: missing file, malformed YAML, unknown device, non-positive bandwidth, mesh axes
            whose product differs from ``num_devices``, duplicate mesh names, a link naming an unknown
            mesh or joining a mesh to itself, duplicate links, a ``scale_up_domain`` that is not a
            whole number of nodes (a multiple of ``devices_per_node``).
    """
    p = resolve_cluster_path(path)   # hardware_profiles.paths: also what the CLI checks first
    data = _read_yaml(p, "cluster")
    try:
        f = _ClusterFile.model_validate(data)
    except ValidationError as err:
        raise _from_validation(p, err) from None
    total = (sum(g.nodes * g.devices_per_node for g in f.node_groups) if f.node_groups
             else sum(m.num_devices for m in f.meshes))
    if total > MAX_TOTAL_DEVICES:
        raise ProfileError(f"{p}: {total:,} devices in all, over the limit {MAX_TOTAL_DEVICES:,} (the "
                           f"planner's search grows with the device count: minutes at 2**26); fix: "
                           f"describe at most {MAX_TOTAL_DEVICES:,} devices")
    if f.node_groups:
        return _node_group_cluster(p, f)
    if not f.meshes:
        raise ProfileError(f"{p}: the cluster lists no meshes and no node_groups; fix: describe its hardware "
                           f"under 'node_groups' (or list 'meshes')")
    meshes: dict[str, MeshSpec] = _named(p, f.meshes, "mesh", _mesh)
    links = _links(p, f.links, meshes, "links", "mesh")
    default = _common(p, f, {m.host for m in meshes.values() if m.host}, "mesh")
    return Cluster(name=f.name or p.stem, meshes=meshes, links=tuple(links), default_link=default,
                   path=str(p), description=f.description, host_slots=dict(f.host_slots),
                   p2p=f.p2p, carve_fixed=f.carve == "fixed")


def bundled_clusters() -> list[Path]:
    """Paths of the bundled cluster YAMLs in ``hardware_profiles/clusters``, sorted."""
    return sorted(CLUSTERS_DIR.glob("*.yaml"))
