"""A mesh listing joined by a partial set of links (a chain) read as node groups with its links as
the topology between the nodes (hardware_profiles.topology, hardware_profiles.carve)."""

from dataclasses import replace

import pytest

from hardware_profiles import CLUSTERS_DIR, load_cluster
from hardware_profiles.carve import GroupShape, carve, listing_reading, node_groups_of
from hardware_profiles.types import Cluster, InterMeshLink, Link

GBIT = 1e9 / 8


@pytest.fixture(scope="module")
def chain() -> Cluster:
    return load_cluster(CLUSTERS_DIR / "mixed512_chain.yaml")


def _gbit(ln: Link) -> float:
    return round(ln.bandwidth / GBIT, 6)


def test_chain_is_read_as_node_groups_with_its_links(chain):
    assert len(chain.meshes) == 36 and not chain.groups
    assert "topology" in listing_reading(chain)
    h = node_groups_of(chain)
    assert h is not None
    assert {n: (g.nodes, g.devices_per_node, _gbit(g.scale_out_link)) for n, g in h.groups.items()} == {
        "h100-sxm": (16, 8, 400.0), "blackhole-p150b": (16, 8, 400.0), "tpu-v5e": (4, 64, 25.0)}
    caps = {frozenset((ln.a, ln.b)): _gbit(ln.link) for ln in h.group_links}
    # h100 and tpu meet only through the LoudBox chain (3200 Gb/s per hop)
    assert caps == {frozenset(("h100-sxm", "blackhole-p150b")): 6400.0,
                    frozenset(("blackhole-p150b", "tpu-v5e")): 6400.0,
                    frozenset(("h100-sxm", "tpu-v5e")): 3200.0}


def test_carving_charges_transfers_on_the_chain(chain):
    lc = carve(chain, [GroupShape("h100-sxm", 16, 8), GroupShape("blackhole-p150b", 16, 8),
                       GroupShape("tpu-v5e", 4, 2, 2)])
    link = lambda a, b: lc.link_between(a, b).link   # noqa: E731
    # 8 node pairs cross the one chain link between nodes 7 and 8: 3200 Gb/s, not 8 x 3200
    assert _gbit(link("h100-sxm.0", "h100-sxm.1")) == 3200.0
    assert link("h100-sxm.0", "h100-sxm.1").latency == pytest.approx(8 * 5e-6)
    # a ring over 8 chain nodes crosses each link once per direction: the node's NICs per device
    assert _gbit(lc.meshes["h100-sxm.0"].scale_out_link) == 400.0
    # across kinds: the one link from the last H100 node to the first LoudBox
    assert _gbit(link("h100-sxm.1", "blackhole-p150b.0")) == 6400.0
    # h100 nodes 0-7 to the TPU: along the chain (its narrowest hop), never the 100 Gb/s default
    assert _gbit(link("h100-sxm.0", "tpu-v5e.0")) == 1600.0
    # two slices of TPU nodes 0-1 to the slices of nodes 2-3: 2 flows share the hop 1-2, half each
    assert _gbit(link("tpu-v5e.1", "tpu-v5e.2")) == 800.0


def test_one_node_meshes_keep_the_listing_links(chain):
    lc = carve(chain, [GroupShape("h100-sxm", 16)])
    assert _gbit(lc.link_between("h100-sxm.3", "h100-sxm.4").link) == 3200.0
    far = lc.link_between("h100-sxm.0", "h100-sxm.5").link       # forwarded along 5 links
    assert _gbit(far) == 3200.0 and far.latency == pytest.approx(5 * 5e-6)


def test_uniform_listing_reads_as_before():
    c = load_cluster(CLUSTERS_DIR / "h100x128.yaml")
    assert "joined alike" in listing_reading(c)
    lc = carve(c, [GroupShape("h100-sxm", 16, 8)])
    assert _gbit(lc.link_between("h100-sxm.0", "h100-sxm.1").link) == 8 * 3200.0   # fat tree
    assert lc.link_rule is None


def test_replaced_group_links_drop_the_topology(chain):
    free = Link(1e30, 0.0, "free")
    h = node_groups_of(chain)
    assert h is not None
    freed = replace(h, groups={n: replace(g, scale_out_link=free) for n, g in h.groups.items()},
                    group_links=tuple(replace(ln, link=free) for ln in h.group_links))
    lc = carve(freed, [GroupShape("h100-sxm", 16, 8)])
    assert lc.link_between("h100-sxm.0", "h100-sxm.1").link.bandwidth >= 1e30


def test_disconnected_listing_says_why(chain):
    # no default link and the H100 chain cut between meshes 7 and 8
    links = tuple(ln for ln in chain.links if {ln.a, ln.b} != {"h100_07", "h100_08"})
    cut = replace(chain, links=links, default_link=None)
    why = listing_reading(cut)
    assert why.startswith("its 36 meshes as listed, not as node groups: ")
    assert "no path of links" in why and "\n" not in why
    assert node_groups_of(cut) is None


def test_carve_fixed_says_why(chain):
    assert listing_reading(replace(chain, carve_fixed=True)) == (
        "its 36 meshes as listed, not as node groups: its file says 'carve: fixed'")


def test_bundled_ring_listing_reads_as_node_groups():
    # 16 LoudBoxes cabled in a ring (4 x 400 GbE between neighbours), 400 Gb/s host Ethernet elsewhere
    c = load_cluster(CLUSTERS_DIR / "h100x32_p150bx128.yaml")
    assert listing_reading(c) == ("as node groups h100-sxm (4 x 8), blackhole-p150b (16 x 8) with the "
                                  "listing's links as the topology between them (they join the nodes "
                                  "unequally)")     # 20 meshes: node groups only (BOTH_READINGS_MESHES)
    assert listing_reading(load_cluster(CLUSTERS_DIR / "h100x1.yaml")) == ""   # one mesh: nothing to read
