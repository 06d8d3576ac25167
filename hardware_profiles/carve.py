"""Carve logical meshes out of node groups: the hardware as bought becomes the meshes a plan uses.

A node group is ``N`` identical nodes of ``k`` devices (:class:`~hardware_profiles.types.NodeGroup`).
A :class:`GroupShape` cuts it the way practitioners do (Narayanan et al. SC'21, sec. 3: tensor
parallel inside a node, pipeline and data parallel across nodes):

- ``meshes_per_node`` = ``s`` splits each node into ``s`` slices of ``k / s`` devices (two pipeline
  stages inside one DGX box talk over NVLink);
- ``nodes_per_mesh`` = ``R`` joins the same slice of ``R`` nodes into one mesh: its ``data`` axis
  spans the nodes (R pipeline replicas, gradients all-reduced across them over the scale-out
  network: a mesh of ``R`` x ``k / s`` devices is exactly R replicas of a ``k / s``-device stage);
- ``nodes`` = ``U`` nodes of the group are used (the rest idle), ``U`` a multiple of ``R``.

The group then yields ``U / R x s`` meshes, in pipeline order: the ``s`` slices of the first
node set, then of the next. Mesh ``j`` is named ``{group}.{j}``.

Links between two meshes (aggregate, per direction) follow from the devices at both ends: every
device sends its share of the activation over its own link, so two slices of the same node set
talk at ``R x k/s x intra-node bandwidth``, two meshes on different node sets at
``R x k/s x per-device NIC bandwidth`` (at most the smaller end's), and meshes of two groups at the
smaller end's NIC total, capped by the cluster's ``group_links`` (the fabric between the groups).
A collective inside a mesh spanning nodes uses :meth:`MeshSpec.collective_link` (intra-node for a
group inside one node, else ``k/s`` NIC rings in parallel).

A group whose ``scale_up_domain`` joins several nodes on one fabric (a GB200 NVL72 rack: 18 hosts
of 4 GPUs on one NVLink Switch fabric) counts its domains in blocks of
``scale_up_domain / devices_per_node`` consecutive nodes from node 0. Two meshes of the group whose
nodes all lie in one domain talk over the scale-up link like two slices of one node, and each mesh
carries its own ``MeshSpec.scale_up_domain`` (its devices in aligned blocks that never straddle a
domain: all of them when it lies inside one), so its collectives stay on the scale-up link up to
that size. Hosts are still ``devices_per_node`` devices (straggler counting).

A cluster file that lists meshes which are whole nodes (one mesh per DGX box, say) describes node
groups too: :func:`node_groups_of` reads it as them, with the listing's links as the groups' NICs
and fabric caps, so the planner shapes it and :func:`carve` carves it like a node-group file. When
its links join the nodes unequally (a chain, a ring, a tree of fast links and a slow default), the
listing's links become the topology between the nodes (:class:`hardware_profiles.topology.Topology`)
and the carving charges every transfer between the meshes it carves at what those links carry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Iterable, Mapping

from hardware_profiles.topology import Topology
from hardware_profiles.types import Cluster, InterMeshLink, Link, MeshSpec, NodeGroup, ProfileError


@dataclass(frozen=True, slots=True)
class GroupShape:
    """How one node group is cut into meshes (see the module docstring).

    Attributes:
        group: the node group's name.
        nodes: nodes used (``U``), a multiple of ``nodes_per_mesh``.
        nodes_per_mesh: nodes one mesh spans (``R``: pipeline replicas as the mesh's data axis).
        meshes_per_node: slices a node is cut into (``s``, dividing ``devices_per_node``).
    """

    group: str
    nodes: int
    nodes_per_mesh: int = 1
    meshes_per_node: int = 1

    @property
    def num_meshes(self) -> int:
        return self.nodes // self.nodes_per_mesh * self.meshes_per_node

    def mesh_devices(self, devices_per_node: int) -> int:
        """Devices in one mesh of this shape."""
        return self.nodes_per_mesh * devices_per_node // self.meshes_per_node

    def mesh_names(self) -> tuple[str, ...]:
        return tuple(f"{self.group}.{j}" for j in range(self.num_meshes))

    def mesh_nodes(self, j: int) -> tuple[int, int, int]:
        """(first node, nodes spanned, slice index) of mesh ``j``."""
        node_set, part = divmod(j, self.meshes_per_node)
        return node_set * self.nodes_per_mesh, self.nodes_per_mesh, part

    def describe(self, devices_per_node: int) -> str:
        """E.g. ``"4 meshes of 2 nodes x 8"`` or ``"2 meshes per node, 8 nodes"``."""
        per = devices_per_node // self.meshes_per_node
        if self.meshes_per_node == 1:
            return f"{self.num_meshes} x ({self.nodes_per_mesh} node{'s' * (self.nodes_per_mesh > 1)} x {per})"
        return (f"{self.num_meshes} x ({self.nodes_per_mesh} node{'s' * (self.nodes_per_mesh > 1)} x {per}: "
                f"{self.meshes_per_node} per node)")

    def to_json(self) -> dict:
        return {"group": self.group, "nodes": self.nodes, "nodes_per_mesh": self.nodes_per_mesh,
                "meshes_per_node": self.meshes_per_node}

    @staticmethod
    def from_json(d: Mapping) -> "GroupShape":
        return GroupShape(str(d["group"]), int(d["nodes"]), int(d.get("nodes_per_mesh", 1)),
                          int(d.get("meshes_per_node", 1)))


def check_shape(cluster: Cluster, shape: GroupShape) -> NodeGroup:
    """The shape's node group, after checking the shape fits it.

    Raises:
        ProfileError: unknown group, or a shape that does not divide the group's nodes/devices.
    """
    g = cluster.groups.get(shape.group)
    if g is None:
        raise ProfileError(f"cluster {cluster.name!r} has no node group {shape.group!r}; fix: use one of "
                           f"{sorted(cluster.groups)}")
    ok = (1 <= shape.nodes <= g.nodes and shape.nodes_per_mesh >= 1
          and shape.nodes % shape.nodes_per_mesh == 0 and shape.meshes_per_node >= 1
          and g.devices_per_node % shape.meshes_per_node == 0)
    if not ok:
        raise ProfileError(f"shape {shape.to_json()} does not fit node group {g.name!r} ({g.nodes} nodes "
                           f"of {g.devices_per_node}); fix: use nodes <= {g.nodes}, a multiple of "
                           f"nodes_per_mesh, and meshes_per_node dividing {g.devices_per_node}")
    return g


def _domain_nodes(g: NodeGroup, first: int, count: int) -> int:
    """The largest block of nodes, in aligned steps from ``first``, that never straddles a
    scale-up domain of ``g`` within nodes ``first`` .. ``first + count - 1``: ``count`` when they
    share one domain, else the gcd of ``count`` and the offsets of the domain boundaries inside
    them (1 when every node is its own domain)."""
    per = g.nodes_per_domain
    block = count
    boundary = (first // per + 1) * per
    while boundary < first + count and block > 1:
        block = math.gcd(block, boundary - first)
        boundary += per
    return block


def _mesh(g: NodeGroup, shape: GroupShape, j: int, topo: Topology | None = None) -> MeshSpec:
    per_node = g.devices_per_node // shape.meshes_per_node
    n = shape.nodes_per_mesh * per_node
    first, count, _ = shape.mesh_nodes(j)
    domain = _domain_nodes(g, first, count) * per_node
    so = g.scale_out_link
    if topo is not None and count > 1:
        # its collectives: a ring over its nodes on the listing's links, per device of a node
        ring = topo.ring(g.name, range(first, first + count), f"{g.name} nodes {first}-{first + count - 1}")
        so = Link(ring.bandwidth / g.devices_per_node, ring.latency,
                  f"{ring.source}, over a node's {g.devices_per_node} devices")
    return MeshSpec(name=f"{g.name}.{j}", device=g.device, num_devices=n, axes={"data": n},
                    intra_link=g.intra_link, price_per_device_hour=g.price_per_device_hour,
                    power_watts_per_device=g.power_watts_per_device, devices_per_node=per_node,
                    scale_out_link=so, host=g.host,
                    scale_up_domain=domain if domain != per_node else None)


def _group_link(cluster: Cluster, a: str, b: str) -> Link | None:
    for ln in cluster.group_links:
        if {ln.a, ln.b} == {a, b}:
            return ln.link
    return cluster.default_link


def mesh_link(cluster: Cluster, ga: NodeGroup, sa: GroupShape, ja: int,
              gb: NodeGroup, sb: GroupShape, jb: int, topo: Topology | None = None) -> Link:
    """The aggregate per-direction link between mesh ``ja`` of shape ``sa`` and mesh ``jb`` of ``sb``
    (see the module docstring); with ``topo`` (a listing read with its links as the topology)
    transfers between different nodes run on the listing's links."""
    na, nb = sa.mesh_devices(ga.devices_per_node), sb.mesh_devices(gb.devices_per_node)
    (fa, ca, _), (fb, cb, _) = sa.mesh_nodes(ja), sb.mesh_nodes(jb)
    if topo is not None:
        nodes_a, nodes_b = range(fa, fa + ca), range(fb, fb + cb)
        if ga.name == gb.name and fa != fb:
            # node i of one mesh to node i of the other, its slice's share of each node's links
            ln = topo.transfer(ga.name, nodes_a, nodes_b, f"{ga.name}.{ja} to {gb.name}.{jb}")
            return Link(ln.bandwidth / sa.meshes_per_node, ln.latency, ln.source)
        if ga.name != gb.name:
            ln = topo.widest(ga.name, nodes_a, gb.name, nodes_b, f"{ga.name}.{ja} to {gb.name}.{jb}")
            nics = min(na * ga.scale_out_link.bandwidth, nb * gb.scale_out_link.bandwidth)
            return Link(min(nics, ln.bandwidth), ln.latency, ln.source)
    if ga.name == gb.name:
        same_nodes = fa == fb
        # meshes on one scale-up fabric (a GB200 NVL72 rack's NVLink) talk over it too
        scale_up = same_nodes or ga.same_domain(min(fa, fb), max(fa + ca, fb + cb) - min(fa, fb))
        ln = ga.intra_link if scale_up else ga.scale_out_link
        what = "intra-node" if same_nodes else "scale-up domain" if scale_up else "scale-out"
        return Link(min(na, nb) * ln.bandwidth, ln.latency,
                    f"{min(na, nb)} devices x per-device {what} link of {ga.name}: {ln.source}")
    bw = min(na * ga.scale_out_link.bandwidth, nb * gb.scale_out_link.bandwidth)
    lat = max(ga.scale_out_link.latency, gb.scale_out_link.latency)
    src = f"the smaller end's NICs ({ga.name} {na}, {gb.name} {nb} devices)"
    cap = _group_link(cluster, ga.name, gb.name)
    if cap is not None and cap.bandwidth < bw:
        bw, src = cap.bandwidth, f"the fabric between {ga.name} and {gb.name}: {cap.source}"
    if cap is not None:
        lat = max(lat, cap.latency)
    return Link(bw, lat, src)


def carve(cluster: Cluster, shapes: Iterable[GroupShape]) -> Cluster:
    """The logical cluster of ``shapes`` (one per node group used): its meshes, in pipeline order
    within each group, and every link between them. A cluster that lists its meshes is carved as
    the node groups it describes (:func:`node_groups_of`).

    Raises:
        ProfileError: a mesh listing that describes no node groups, a shape that does not fit its
            group, or the same group shaped twice.
    """
    shapes = tuple(shapes)
    topo = _topology_of(cluster)
    if not cluster.groups:
        hardware, why = _from_listing(cluster)
        if hardware is None:
            raise ProfileError(f"cluster {cluster.name!r} lists meshes, not node groups; it cannot be "
                               f"carved: {why}; fix: re-plan on this file with 'mpmd plan', or describe "
                               f"its hardware under 'node_groups'")
        cluster = hardware
        topo = _topology_of(cluster)
    seen = [s.group for s in shapes]
    if len(set(seen)) != len(seen):
        raise ProfileError(f"a carving shapes node group(s) {sorted({g for g in seen if seen.count(g) > 1})} "
                           f"twice; fix: give one shape per group")
    meshes: dict[str, MeshSpec] = {}
    where: dict[str, tuple[NodeGroup, GroupShape, int]] = {}
    for s in shapes:
        g = check_shape(cluster, s)
        for j in range(s.num_meshes):
            m = _mesh(g, s, j, topo)
            meshes[m.name] = m
            where[m.name] = (g, s, j)
    names = list(meshes)
    rule = _LinkRule(cluster, where, topo)
    if len(names) > LISTED_LINKS_MESHES:
        return replace(cluster, meshes=meshes, links=(), link_rule=rule)
    links = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            links.append(InterMeshLink(a, b, mesh_link(cluster, *where[a], *where[b], topo=topo)))
    # a topology travels with the carving (a later carving of the same groups reads it)
    return replace(cluster, meshes=meshes, links=tuple(links), link_rule=rule if topo else None)


LISTED_LINKS_MESHES = 512
"""Up to this many meshes a carving lists the link between every two (``Cluster.links``); above
it (a node group of thousands of nodes read one mesh per node) the links are given on demand by
``Cluster.link_rule``: listing them would take ``n (n-1) / 2`` entries (134 million at 16,384
nodes)."""


class _LinkRule:
    """The link between two meshes of a carving, on demand (:func:`mesh_link`), named in mesh
    order; it carries the listing's :class:`Topology` when the node groups were read from a
    listing with its links as the topology."""

    __slots__ = ("cluster", "where", "index", "topology")

    def __init__(self, cluster: Cluster, where: dict[str, tuple[NodeGroup, GroupShape, int]],
                 topology: Topology | None = None):
        self.cluster, self.where, self.topology = cluster, where, topology
        self.index = {name: i for i, name in enumerate(where)}

    def __call__(self, a: str, b: str) -> InterMeshLink:
        if self.index[b] < self.index[a]:
            a, b = b, a
        return InterMeshLink(a, b, mesh_link(self.cluster, *self.where[a], *self.where[b],
                                             topo=self.topology))


def _topology_of(cluster: Cluster) -> Topology | None:
    """The listing topology ``cluster``'s node groups were read with, while they are unchanged
    (a cluster whose links were replaced, e.g. made free, carves on its groups' own links)."""
    rule = cluster.link_rule
    topo = rule.topology if isinstance(rule, _LinkRule) else None
    return topo if topo is not None and cluster.groups and topo.fits(cluster) else None


BOTH_READINGS_MESHES = 8
"""Listings joined unequally of at most this many meshes are planned both as listed and as node
groups (``planner.shaping``, which imports this figure); larger ones as node groups only."""


def read_with_topology(cluster: Cluster) -> bool:
    """Whether ``cluster`` is a listing's node groups read with the listing's links as the topology
    between its nodes (:func:`node_groups_of` of a listing whose links join the nodes unequally)."""
    return _topology_of(cluster) is not None


def default_shapes(cluster: Cluster) -> tuple[GroupShape, ...]:
    """One mesh per node of every group (how a node-group cluster reads before planning)."""
    return tuple(GroupShape(g.name, g.nodes) for g in cluster.groups.values())


def shapes_from_json(items: Iterable[Mapping]) -> tuple[GroupShape, ...]:
    """Parse a plan's ``carving`` list.

    Raises:
        ProfileError: a malformed entry.
    """
    try:
        return tuple(GroupShape.from_json(d) for d in items)
    except (KeyError, TypeError, ValueError) as e:
        raise ProfileError(f"plan carving entry is malformed ({e}); regenerate the plan with 'mpmd plan'") from None


# ----------------------------------------------------------------------------- mesh listings
def node_groups_of(cluster: Cluster) -> Cluster | None:
    """The node-group cluster a mesh listing describes, read one mesh per node as a node-group file
    loads (:func:`default_shapes`), so the planner can shape it; ``cluster`` itself when it already
    has node groups; None when the listing does not safely describe node groups (the planner then
    searches its meshes as listed).

    A listing converts when its file does not say ``carve: fixed``, it lists at least two meshes,
    every mesh is one node (no ``host``, ``devices_per_node`` or ``scale_out_link``), and:

    - meshes of the same device profile, device count, intra-mesh link (bandwidth and latency),
      price and power form one :class:`NodeGroup` (named after the device, made unique with
      ``-2``, ``-3``, ...; groups and their nodes in the listing's order) of at least two nodes;
    - every two meshes of a group are joined by the same link (an explicit ``links`` entry or the
      ``default_link``, same bandwidth and latency); its aggregate bandwidth over the mesh's ``k``
      devices is the group's per-device ``scale_out_link`` (B/s; its latency kept), so two one-node
      meshes of the carving talk exactly as the listing says (``k`` NICs side by side);
    - every mesh of one group and every mesh of another are joined by the same link; when it is
      narrower than one node's NICs at either end (or slower), it becomes the ``group_links`` cap
      between the two groups.

    ``name``, ``path``, ``description``, ``p2p`` and ``host_slots`` are kept; ``default_link`` is
    not (its role passed to the groups' links and caps).
    """
    if cluster.groups:
        return cluster
    return _from_listing(cluster)[0]


def _same(a: Link, b: Link) -> bool:
    return a.bandwidth == b.bandwidth and a.latency == b.latency


def _common_link(cluster: Cluster, pairs) -> tuple[Link | None, str]:
    """The one link joining every ``(a, b)`` mesh pair, or None and why not."""
    first: Link | None = None
    for a, b in pairs:
        try:
            ln = cluster.link_between(a, b).link
        except ProfileError:
            return None, f"meshes {a!r} and {b!r} have no link"
        if first is None:
            first = ln
        elif not _same(ln, first):
            return None, (f"meshes {a!r} and {b!r} are joined at {ln.bandwidth * 8 / 1e9:g} Gb/s, "
                          f"{ln.latency * 1e6:g} us, other pairs of the same kinds at "
                          f"{first.bandwidth * 8 / 1e9:g} Gb/s, {first.latency * 1e6:g} us")
    return first, ""


def _from_listing(cluster: Cluster) -> tuple[Cluster | None, str]:
    """:func:`node_groups_of` of a mesh listing, with why it does not convert ("" when it does)."""
    if cluster.carve_fixed:
        return None, "its file says 'carve: fixed'"
    meshes = list(cluster.meshes.values())
    if len(meshes) < 2:
        return None, f"it lists {len(meshes)} mesh{'es' * (len(meshes) != 1)}, no nodes to carve"
    kinds: dict[tuple, list[MeshSpec]] = {}
    for m in meshes:
        if m.host is not None:
            return None, f"mesh {m.name!r} shares host {m.host!r} with other meshes"
        if m.devices_per_node is not None or m.scale_out_link is not None:
            return None, f"mesh {m.name!r} spans several nodes"
        key = (m.device.name, m.num_devices, m.intra_link.bandwidth, m.intra_link.latency,
               m.price_per_device_hour, m.power_watts_per_device)
        kinds.setdefault(key, []).append(m)
        if m.device != kinds[key][0].device:
            return None, (f"meshes {kinds[key][0].name!r} and {m.name!r} use different profiles named "
                          f"{m.device.name!r}")
    for ms in kinds.values():
        if len(ms) < 2:
            return None, (f"mesh {ms[0].name!r} is the only one of its kind, so no link to its like "
                          f"gives its node's network")
    hardware, why = _uniform(cluster, list(kinds.values()))
    if hardware is not None:
        return hardware, ""
    # joined unequally: the listing's links become the topology between the nodes
    hardware, twhy = _with_topology(cluster, list(kinds.values()))
    if hardware is None:
        return None, f"{why}, and {twhy}"
    return hardware, ""


def _group_names(kinds: list[list[MeshSpec]]) -> list[str]:
    """Each kind's group name: its device's, made unique with ``-2``, ``-3``, ..."""
    names: list[str] = []
    for ms in kinds:
        name, i = ms[0].device.name, 1
        while name in names:
            i += 1
            name = f"{ms[0].device.name}-{i}"
        names.append(name)
    return names


def _physical(cluster: Cluster, groups: dict[str, NodeGroup], caps: list[InterMeshLink],
              topo: Topology | None = None) -> Cluster:
    physical = Cluster(name=cluster.name, meshes={}, links=(), default_link=None, path=cluster.path,
                       description=cluster.description, host_slots=dict(cluster.host_slots),
                       p2p=cluster.p2p, groups=groups, group_links=tuple(caps),
                       link_rule=None if topo is None else _LinkRule(cluster, {}, topo))
    return carve(physical, default_shapes(physical))


def _uniform(cluster: Cluster, kinds: list[list[MeshSpec]]) -> tuple[Cluster | None, str]:
    """The node groups of a listing whose every two meshes of a kind, and of two kinds, are joined
    alike (see :func:`node_groups_of`), or None and why not."""
    groups: dict[str, NodeGroup] = {}
    members: dict[str, list[str]] = {}
    for name, ms in zip(_group_names(kinds), kinds):
        first = ms[0]
        ln, why = _common_link(cluster, combinations([m.name for m in ms], 2))
        if ln is None:
            return None, why
        k = first.num_devices
        so = Link(ln.bandwidth / k, ln.latency,
                  f"the link between two {first.device.name} meshes of {k} devices in the listing, "
                  f"over their {k} devices: {ln.source}")
        groups[name] = NodeGroup(name, first.device, len(ms), k, first.intra_link, so,
                                 first.price_per_device_hour, first.power_watts_per_device)
        members[name] = [m.name for m in ms]
    caps = []
    for ga, gb in combinations(groups, 2):
        ln, why = _common_link(cluster, ((a, b) for a in members[ga] for b in members[gb]))
        if ln is None:
            return None, why
        a, b = groups[ga], groups[gb]
        nics = min(a.devices_per_node * a.scale_out_link.bandwidth,
                   b.devices_per_node * b.scale_out_link.bandwidth)
        if ln.bandwidth < nics or ln.latency > max(a.scale_out_link.latency, b.scale_out_link.latency):
            caps.append(InterMeshLink(ga, gb, ln))
    return _physical(cluster, groups, caps), ""


def _with_topology(cluster: Cluster, kinds: list[list[MeshSpec]]) -> tuple[Cluster | None, str]:
    """The node groups of a listing joined unequally, with its links as the topology between the
    nodes (:class:`~hardware_profiles.topology.Topology`): a group's ``scale_out_link`` is its
    widest link between two of its nodes over a node's devices (what any carving of it can reach,
    so the bounds that read it stay bounds), two groups are capped by the widest path between them;
    the carving charges each transfer on the listing's links. None and why when no path joins two
    meshes or the listing is too large to route."""
    names = _group_names(kinds)
    members = {n: [m.name for m in ms] for n, ms in zip(names, kinds)}
    bare = {n: NodeGroup(n, ms[0].device, len(ms), ms[0].num_devices, ms[0].intra_link,
                         ms[0].intra_link, ms[0].price_per_device_hour, ms[0].power_watts_per_device)
            for n, ms in zip(names, kinds)}
    try:
        topo = Topology(cluster, members, bare)
        groups: dict[str, NodeGroup] = {}
        for n, ms in zip(names, kinds):
            k = ms[0].num_devices
            ln = topo.best_within(n, len(ms))
            so = Link(ln.bandwidth / k, ln.latency,
                      f"the widest link between two {n} meshes of {k} devices in the listing, over "
                      f"their {k} devices: {ln.source}")
            groups[n] = replace(bare[n], scale_out_link=so)
    except ProfileError as e:
        return None, f"its links cannot be read as a topology ({e})"
    topo.groups = groups
    caps = [InterMeshLink(ga, gb, topo.widest(ga, range(groups[ga].nodes), gb, range(groups[gb].nodes),
                                              f"between {ga} and {gb}"))
            for ga, gb in combinations(groups, 2)]
    return _physical(cluster, groups, caps, topo), ""


def listing_reading(cluster: Cluster) -> str:
    """One line on how the planner reads a mesh listing: as the node groups it describes (with its
    links as the topology between the nodes when they join them unequally: then both ways), or as
    listed and why; "" for a node-group cluster or a listing of one mesh."""
    if cluster.groups or len(cluster.meshes) < 2:
        return ""                       # node groups already, or one mesh: nothing to read
    hardware, why = _from_listing(cluster)
    if hardware is None:
        n = len(cluster.meshes)
        return f"its {n} mesh{'es' * (n != 1)} as listed, not as node groups: {why}"
    groups = ", ".join(f"{g.name} ({g.nodes} x {g.devices_per_node})" for g in hardware.groups.values())
    if _topology_of(hardware) is not None:
        how = (f"as node groups {groups} with the listing's links as the topology between them "
               f"(they join the nodes unequally)")
        # the planner also searches a small one as listed (planner.shaping.BOTH_READINGS_MESHES)
        return (f"both as listed and {how}; the faster plan is kept"
                if len(cluster.meshes) <= BOTH_READINGS_MESHES else how)
    return f"as node groups {groups}: every two nodes joined alike"

