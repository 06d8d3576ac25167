"""A mesh listing's links as the topology between the nodes a carving joins.

A cluster file that lists one-node meshes joined by a partial set of links (a chain, a ring, a
tree: fast links between neighbouring meshes, a slow ``default_link`` elsewhere) still describes
node groups, but not a non-blocking fabric: two nodes far apart on a chain talk over the default
link, or over the chain through the nodes between them. :class:`Topology` keeps the listing's
links so the carving (:mod:`hardware_profiles.carve`) charges every transfer between the meshes it
carves at what those links can carry:

- traffic may take the direct link of a pair (the listing's entry, or its ``default_link``) or be
  forwarded along the **widest-path tree** (the maximum spanning tree of the listing's links by
  bandwidth: between two nodes its path has the largest bottleneck of any path, Hu 1961); links
  are full duplex, per direction, as the listing gives them;
- ``k`` flows at once (the ``R`` node pairs of two ``R``-node meshes, the hops of a ring) share
  each directed tree link they cross: each flow gets the least ``capacity / flows`` on its path,
  and the transfer the larger of that times ``k`` and the sum of the pairs' direct links;
- a ring over ``R`` consecutive nodes of a chain (a multi-node mesh's all-reduce) crosses each
  link once per direction, so it runs at the chain's link; its latency is the longest hop's path.

Every figure is a rate the listed links can sustain (never more), so the carving stays sound; with
every pair joined alike it equals the uniform reading's.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from hardware_profiles.types import Cluster, Link, NodeGroup, ProfileError

MAX_TOPOLOGY_NODES = 512
"""Largest listing read with its links as a topology (the widest-path tree takes ``n^2`` link
look-ups)."""


class Topology:
    """The links between the nodes (listed meshes) of node groups read from a listing.

    ``members``: group name -> the listed mesh names of its nodes, in node order.

    Raises:
        ProfileError: two nodes joined by no path of links (no ``default_link`` and a gap), or more
            than :data:`MAX_TOPOLOGY_NODES` nodes.
    """

    __slots__ = ("listing", "names", "first", "groups", "parent", "depth", "_cache")

    def __init__(self, listing: Cluster, members: Mapping[str, Sequence[str]],
                 groups: Mapping[str, NodeGroup]):
        self.listing = listing
        self.names = [m for g in members for m in members[g]]
        n = len(self.names)
        if n > MAX_TOPOLOGY_NODES:
            raise ProfileError(f"{n} meshes, over the {MAX_TOPOLOGY_NODES} read with their links as a topology")
        self.first: dict[str, int] = {}
        i = 0
        for g in members:
            self.first[g] = i
            i += len(members[g])
        self.groups = dict(groups)
        self._cache: dict = {}
        # Prim's maximum spanning tree by (bandwidth, -latency) from node 0
        best: list[tuple[float, float] | None] = [None] * n
        self.parent = [-1] * n
        self.depth = [0] * n
        done = [False] * n
        order: list[int] = []
        best[0] = (float("inf"), 0.0)
        for _ in range(n):
            u = max((x for x in range(n) if not done[x] and best[x] is not None),
                    key=lambda x: best[x], default=None)   # type: ignore[arg-type, return-value]
            if u is None:
                a = self.names[order[0]]
                b = self.names[next(x for x in range(n) if not done[x])]
                raise ProfileError(f"meshes {a!r} and {b!r} are joined by no path of links")
            done[u] = True
            order.append(u)
            if self.parent[u] >= 0:
                self.depth[u] = self.depth[self.parent[u]] + 1
            for v in range(n):
                if done[v]:
                    continue
                ln = self.link(u, v)
                if ln is None:
                    continue
                key = (ln.bandwidth, -ln.latency)
                cur = best[v]
                if cur is None or key > cur:
                    best[v], self.parent[v] = key, u

    def fits(self, cluster: Cluster) -> bool:
        """Whether ``cluster``'s node groups are (the first nodes of) the ones read here, unchanged."""
        for name, g in cluster.groups.items():
            h = self.groups.get(name)
            if h is None or g.nodes > h.nodes or replace_nodes(g) != replace_nodes(h):
                return False
        return True

    def node(self, group: str, j: int) -> int:
        return self.first[group] + j

    def link(self, u: int, v: int) -> Link | None:
        """The listing's direct link between nodes ``u`` and ``v`` (None: none)."""
        try:
            return self.listing.link_between(self.names[u], self.names[v]).link
        except ProfileError:
            return None

    def _path(self, u: int, v: int) -> list[tuple[int, bool]]:
        """The tree path from ``u`` to ``v`` as directed edges ``(child, upward)``."""
        up, down = [], []
        while self.depth[u] > self.depth[v]:
            up.append((u, True))
            u = self.parent[u]
        while self.depth[v] > self.depth[u]:
            down.append((v, False))
            v = self.parent[v]
        while u != v:
            up.append((u, True))
            down.append((v, False))
            u, v = self.parent[u], self.parent[v]
        return up + down[::-1]

    def _edge(self, child: int) -> Link:
        ln = self.link(child, self.parent[child])
        assert ln is not None          # a tree edge is a link
        return ln

    def route(self, flows: Sequence[tuple[int, int]]) -> tuple[float, float]:
        """(B/s per flow, latency s) of ``flows`` (node pairs, equal sizes) at once on the tree:
        each directed link's capacity shared by the flows crossing it."""
        loads: dict[tuple[int, bool], int] = {}
        lat = 0.0
        for u, v in flows:
            path = self._path(u, v)
            for e in path:
                loads[e] = loads.get(e, 0) + 1
            lat = max(lat, sum(self._edge(c).latency for c, _ in path))
        rate = min((self._edge(c).bandwidth / k for (c, _), k in loads.items()), default=float("inf"))
        return rate, lat

    def transfer(self, group: str, a: Sequence[int], b: Sequence[int], src: str) -> Link:
        """The aggregate link when node ``a[i]`` of ``group`` sends to node ``b[i]``, all at once:
        the better of the pairs' direct links summed and the flows forwarded on the tree."""
        flows = [(self.node(group, x), self.node(group, y)) for x, y in zip(a, b)]
        key = ("t", tuple(flows))
        got = self._cache.get(key)
        if got is None:
            direct = [self.link(u, v) for u, v in flows]
            d_bw = sum(ln.bandwidth for ln in direct if ln is not None)
            d_lat = max((ln.latency for ln in direct if ln is not None), default=0.0)
            rate, lat = self.route(flows)
            got = (len(flows) * rate, lat) if len(flows) * rate > d_bw else (d_bw, d_lat)
            self._cache[key] = got
        return Link(got[0], got[1], f"{src}: the listing's links between their nodes")

    def ring(self, group: str, nodes: Sequence[int], src: str) -> Link:
        """The node-level link of a ring over ``nodes`` of ``group`` in order (every hop at once)."""
        ids = [self.node(group, x) for x in nodes]
        flows = list(zip(ids, ids[1:] + ids[:1]))
        key = ("r", tuple(flows))
        got = self._cache.get(key)
        if got is None:
            got = self.route(flows)
            self._cache[key] = got
        return Link(got[0], got[1], f"{src}: a ring over the listing's links between its nodes")

    def widest(self, ga: str, a: Sequence[int], gb: str, b: Sequence[int], src: str) -> Link:
        """The widest single path between any node ``a`` of ``ga`` and any node ``b`` of ``gb``
        (one link's worth: the uniform reading caps two groups by one listed link likewise)."""
        key = ("w", ga, tuple(a), gb, tuple(b))
        got = self._cache.get(key)
        if got is None:
            targets = {self.node(gb, y) for y in b}
            got = (0.0, 0.0)
            for x in a:
                for v, (bw, lat) in self._from(self.node(ga, x)).items():
                    if v in targets and (bw, -lat) > (got[0], -got[1]):
                        got = (bw, lat)
            self._cache[key] = got
        return Link(got[0], got[1], f"{src}: the widest path of the listing's links between them")

    def _from(self, s: int) -> dict[int, tuple[float, float]]:
        """Bottleneck bandwidth and summed latency from ``s`` to every node on the tree."""
        key = ("f", s)
        got = self._cache.get(key)
        if got is None:
            kids: dict[int, list[int]] = {}
            for c, p in enumerate(self.parent):
                if p >= 0:
                    kids.setdefault(p, []).append(c)
            got = {s: (float("inf"), 0.0)}
            stack = [s]
            while stack:
                u = stack.pop()
                bw, lat = got[u]
                nbrs = kids.get(u, []) + ([self.parent[u]] if self.parent[u] >= 0 else [])
                for v in nbrs:
                    if v not in got:
                        ln = self._edge(v if self.parent[v] == u else u)
                        got[v] = (min(bw, ln.bandwidth), lat + ln.latency)
                        stack.append(v)
            self._cache[key] = got
        return got

    def best_within(self, group: str, count: int) -> Link:
        """The widest direct link between two nodes of ``group`` (its fabric)."""
        base = self.first[group]
        links = [ln for i in range(count) for j in range(i + 1, count)
                 if (ln := self.link(base + i, base + j)) is not None]
        if not links:
            raise ProfileError(f"no link joins two meshes of {group!r}")
        return max(links, key=lambda ln: (ln.bandwidth, -ln.latency))


def replace_nodes(g: NodeGroup) -> tuple:
    """A group's identity but its node count (a sub-cluster keeps a group's first nodes)."""
    return (g.name, g.device.name, g.devices_per_node, g.intra_link.bandwidth, g.intra_link.latency,
            g.scale_out_link.bandwidth, g.scale_out_link.latency, g.host, g.scale_up_domain)
