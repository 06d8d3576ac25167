"""Node-group clusters: loading, one-line errors, and carving into logical meshes and links."""

from __future__ import annotations

import pytest

from hardware_profiles import CLUSTERS_DIR, GroupShape, ProfileError, carve, load_cluster, shapes_from_json
from hardware_profiles.carve import check_shape

GBIT = 1e9 / 8


def _write(tmp_path, body: str):
    p = tmp_path / "c.yaml"
    p.write_text(body)
    return p


TWO = """name: two
node_groups:
- name: h100
  device: h100-sxm
  nodes: 4
  devices_per_node: 8
  scale_out_link: {latency_us: 5, source: test}
- name: bh
  device: blackhole-p150b
  nodes: 2
  devices_per_node: 8
  scale_out_link: {bandwidth_gbit_per_s: 100, latency_us: 10, source: test}
group_links:
- between: [h100, bh]
  bandwidth_gbit_per_s: 400
  latency_us: 30
  source: test
"""


def test_node_group_cluster_loads_with_one_mesh_per_node(tmp_path):
    c = load_cluster(_write(tmp_path, TWO))
    assert list(c.groups) == ["h100", "bh"]
    h = c.groups["h100"]
    assert (h.nodes, h.devices_per_node, h.num_devices) == (4, 8, 32)
    assert h.scale_out_link.bandwidth == 400 * GBIT       # from the h100-sxm profile
    assert h.scale_out_link.latency == pytest.approx(5e-6)
    assert c.groups["bh"].scale_out_link.bandwidth == 100 * GBIT
    assert list(c.meshes) == ["h100.0", "h100.1", "h100.2", "h100.3", "bh.0", "bh.1"]
    assert c.num_devices == 48


def test_carve_joins_and_splits_nodes(tmp_path):
    c = load_cluster(_write(tmp_path, TWO))
    lc = carve(c, [GroupShape("h100", 4, nodes_per_mesh=2, meshes_per_node=2)])
    assert list(lc.meshes) == ["h100.0", "h100.1", "h100.2", "h100.3"]
    m = lc.meshes["h100.0"]
    assert (m.num_devices, m.devices_per_node) == (8, 4)   # 2 nodes x 4 devices
    # slices of the same node set talk over NVLink, 8 devices x the per-device link
    same = lc.link_between("h100.0", "h100.1").link
    assert same.bandwidth == pytest.approx(8 * c.groups["h100"].intra_link.bandwidth)
    # different node sets: 8 devices x 400 Gb/s NICs
    other = lc.link_between("h100.1", "h100.2").link
    assert other.bandwidth == pytest.approx(8 * 400 * GBIT)
    assert other.latency == pytest.approx(5e-6)
    # dp2 x tp4: each data-parallel ring pairs one device per node over its own NIC (the 4 rings
    # run side by side, each on a quarter of the bytes); dp8: 4 rings per node, one per NIC
    assert m.collective_link(2, 4).bandwidth == pytest.approx(400 * GBIT)
    assert m.collective_link(8, 1).bandwidth == pytest.approx(min(m.intra_link.bandwidth, 4 * 400 * GBIT))
    assert m.collective_link(4, 1).bandwidth == m.intra_link.bandwidth     # inside one node


def test_links_between_kinds_take_the_narrower_end_and_the_fabric_cap(tmp_path):
    c = load_cluster(_write(tmp_path, TWO))
    lc = carve(c, [GroupShape("h100", 2, 2), GroupShape("bh", 2, 1)])
    # 16 H100 x 400 Gb/s against 8 p150b x 100 Gb/s = 800 Gb/s, then capped at 400 Gb/s
    ln = lc.link_between("h100.0", "bh.0").link
    assert ln.bandwidth == pytest.approx(400 * GBIT)
    assert ln.latency == pytest.approx(30e-6)


def test_shapes_round_trip_and_bad_shapes_are_one_line(tmp_path):
    c = load_cluster(_write(tmp_path, TWO))
    s = GroupShape("h100", 4, 2, 4)
    assert shapes_from_json([s.to_json()]) == (s,)
    assert s.num_meshes == 8 and s.mesh_devices(8) == 4 and s.mesh_nodes(5) == (2, 2, 1)
    for bad in (GroupShape("h100", 3, 2), GroupShape("h100", 4, 1, 3), GroupShape("h100", 5)):
        with pytest.raises(ProfileError, match="does not fit node group 'h100'"):
            check_shape(c, bad)
    with pytest.raises(ProfileError, match="no node group 'tpu'"):
        carve(c, [GroupShape("tpu", 1)])
    with pytest.raises(ProfileError, match="twice"):
        carve(c, [GroupShape("h100", 4), GroupShape("h100", 2)])
    with pytest.raises(ProfileError, match="malformed"):
        shapes_from_json([{"nodes": 2}])


@pytest.mark.parametrize("edit,message", [
    (lambda t: t + "meshes:\n- {name: m, device: h100-sxm, num_devices: 8}\n", "node_groups and also meshes"),
    (lambda t: t.replace("between: [h100, bh]", "between: [h100, tpu]"), "unknown node group 'tpu'"),
    (lambda t: t.replace("- name: bh", "- name: h100"), "duplicate node group name 'h100'"),
    (lambda t: t.replace("nodes: 4", "nodes: 0"), "nodes = 0"),
    (lambda t: t.replace("device: blackhole-p150b", "device: nope"), "unknown device 'nope'"),
    (lambda t: t + "host_slots: {local: 1}\n", "host_slots names host 'local'"),
    (lambda t: t.replace("scale_out_link: {latency_us: 5, source: test}", "scale_out_link: {source: test}"),
     "latency_us = missing"),
])
def test_bad_node_group_files_are_one_line(tmp_path, edit, message):
    with pytest.raises(ProfileError, match=message) as e:
        load_cluster(_write(tmp_path, edit(TWO)))
    assert "\n" not in str(e.value)


def test_bundled_node_group_clusters_carve_every_default_shape():
    for name in ("h100x64_nodes", "mixed512_nodes", "cpu4x2_nodes"):
        c = load_cluster(CLUSTERS_DIR / f"{name}.yaml")
        assert c.groups and sum(g.num_devices for g in c.groups.values()) == c.num_devices


def test_a_carving_past_the_listed_limit_gives_the_same_links_on_demand():
    from hardware_profiles.carve import LISTED_LINKS_MESHES
    big = load_cluster(CLUSTERS_DIR / "h100x16384_nodes.yaml")
    assert len(big.meshes) == 2048 > LISTED_LINKS_MESHES and big.links == () and big.link_rule
    small = carve(load_cluster(CLUSTERS_DIR / "h100x512_nodes.yaml"), (GroupShape("h100", 64),))
    assert len(small.links) == 64 * 63 // 2 and small.link_rule is None
    for a, b in (("h100.0", "h100.1"), ("h100.63", "h100.2")):
        lazy, listed = big.link_between(a, b), small.link_between(a, b)
        assert (lazy.a, lazy.b, lazy.link) == (listed.a, listed.b, listed.link)
    assert big.link_between("h100.2047", "h100.5").a == "h100.5"
