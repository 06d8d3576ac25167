"""Mesh listings read as the node groups they describe (``hardware_profiles.carve.node_groups_of``):
the conversion of the bundled listings, its exact links, and every refusal."""

from __future__ import annotations

import pytest

from hardware_profiles import CLUSTERS_DIR, GroupShape, ProfileError, carve, load_cluster
from hardware_profiles.carve import listing_reading, node_groups_of

GBIT = 1e9 / 8


def _write(tmp_path, body: str, name: str = "c.yaml"):
    p = tmp_path / name
    p.write_text(body)
    return p


def _meshes(*specs: str) -> str:
    """``meshes:`` entries from ``"name device num_devices [extra yaml]"`` strings."""
    out = ["meshes:"]
    for s in specs:
        name, dev, n, *extra = s.split(" ", 3)
        out.append(f"- {{name: {name}, device: {dev}, num_devices: {n}{', ' + extra[0] if extra else ''}}}")
    return "\n".join(out) + "\n"


DEFAULT = "default_link: {bandwidth_gbit_per_s: 3200, latency_us: 5, source: 'test: fat tree'}\n"


def test_h100x128_is_one_group_of_16_nodes_of_8_at_400_gbit_per_gpu():
    listing = load_cluster(CLUSTERS_DIR / "h100x128.yaml")
    c = node_groups_of(listing)
    assert list(c.groups) == ["h100-sxm"]
    g = c.groups["h100-sxm"]
    assert (g.nodes, g.devices_per_node, g.num_devices) == (16, 8, 128)
    assert g.scale_out_link.bandwidth == 50e9 == 400 * GBIT
    assert g.scale_out_link.latency == listing.default_link.latency
    assert listing.default_link.source in g.scale_out_link.source
    assert g.intra_link == listing.meshes["h100_0"].intra_link
    assert g.device == listing.meshes["h100_0"].device and g.host is None
    assert (g.price_per_device_hour, g.power_watts_per_device) == (None, None)
    # read one mesh per node, as a node-group file loads; every link as the listing's
    assert list(c.meshes) == [f"h100-sxm.{j}" for j in range(16)]
    assert all(m.num_devices == 8 and m.devices_per_node == 8 for m in c.meshes.values())
    ln = c.link_between("h100-sxm.0", "h100-sxm.15").link
    assert (ln.bandwidth, ln.latency) == (3200 * GBIT, listing.default_link.latency)
    assert (c.name, c.path, c.description, c.p2p, c.host_slots) == (
        listing.name, listing.path, listing.description, listing.p2p, listing.host_slots)
    assert c.group_links == () and c.default_link is None and not c.carve_fixed


def test_the_listing_carves_as_its_node_group_file_does():
    listing = load_cluster(CLUSTERS_DIR / "h100x128.yaml")
    nodes = load_cluster(CLUSTERS_DIR / "h100x128_nodes.yaml")
    a, b = node_groups_of(listing).groups["h100-sxm"], nodes.groups["h100"]
    assert (a.device, a.nodes, a.devices_per_node, a.intra_link) == (b.device, b.nodes, b.devices_per_node,
                                                                     b.intra_link)
    assert (a.scale_out_link.bandwidth, a.scale_out_link.latency) == (b.scale_out_link.bandwidth,
                                                                      b.scale_out_link.latency)
    ca = carve(listing, [GroupShape("h100-sxm", 16, 4, 2)])     # carving converts the listing first
    cb = carve(nodes, [GroupShape("h100", 16, 4, 2)])
    assert [m.num_devices for m in ca.meshes.values()] == [m.num_devices for m in cb.meshes.values()] == [16] * 8
    for (x, y), (p, q) in zip(zip(ca.meshes, list(ca.meshes)[1:]), zip(cb.meshes, list(cb.meshes)[1:])):
        assert ca.link_between(x, y).link.bandwidth == cb.link_between(p, q).link.bandwidth


def test_a_node_group_cluster_is_its_own():
    c = load_cluster(CLUSTERS_DIR / "h100x64_nodes.yaml")
    assert node_groups_of(c) is c


def test_two_kinds_keep_their_order_and_get_no_cap_when_the_link_matches_the_nics():
    listing = load_cluster(CLUSTERS_DIR / "tpuv5e256_h100x16.yaml")
    c = node_groups_of(listing)
    assert list(c.groups) == ["tpu-v5e", "h100-sxm"]
    tpu, h100 = c.groups["tpu-v5e"], c.groups["h100-sxm"]
    assert (tpu.nodes, tpu.devices_per_node, tpu.scale_out_link.bandwidth) == (4, 64, 1600 * GBIT / 64)
    assert (h100.nodes, h100.devices_per_node, h100.scale_out_link.bandwidth) == (2, 8, 3200 * GBIT / 8)
    assert c.group_links == ()      # 1600 Gb/s between kinds = one TPU slice's NICs
    assert c.link_between("tpu-v5e.0", "h100-sxm.0").link.bandwidth == 1600 * GBIT


def test_a_narrower_link_between_kinds_becomes_the_group_cap(tmp_path):
    body = ("name: two\n" + _meshes("a0 h100-sxm 8", "a1 h100-sxm 8", "b0 a100-80gb-sxm 8", "b1 a100-80gb-sxm 8")
            + "links:\n- {between: [a0, a1], bandwidth_gbit_per_s: 3200, latency_us: 5}\n"
            + "- {between: [b0, b1], bandwidth_gbit_per_s: 1600, latency_us: 5}\n"
            + "default_link: {bandwidth_gbit_per_s: 800, latency_us: 20, source: 'test: uplink'}\n")
    c = node_groups_of(load_cluster(_write(tmp_path, body)))
    assert [(g.name, g.nodes, g.scale_out_link.bandwidth) for g in c.groups.values()] == [
        ("h100-sxm", 2, 400 * GBIT), ("a100-80gb-sxm", 2, 200 * GBIT)]
    (cap,) = c.group_links
    assert (cap.a, cap.b, cap.link.bandwidth, cap.link.source) == ("h100-sxm", "a100-80gb-sxm", 800 * GBIT,
                                                                   "test: uplink")
    ln = c.link_between("h100-sxm.1", "a100-80gb-sxm.0").link
    assert (ln.bandwidth, ln.latency) == (800 * GBIT, cap.link.latency)


def test_the_same_device_at_two_prices_is_two_groups_with_unique_names(tmp_path):
    body = ("name: p\n" + _meshes("a h100-sxm 8", "b h100-sxm 8", "c h100-sxm 8 price_usd_per_device_hour: 1.5",
                                  "d h100-sxm 8 price_usd_per_device_hour: 1.5") + DEFAULT)
    c = node_groups_of(load_cluster(_write(tmp_path, body)))
    assert [(g.name, g.nodes, g.price_per_device_hour) for g in c.groups.values()] == [
        ("h100-sxm", 2, None), ("h100-sxm-2", 2, 1.5)]


REFUSED = {
    "meshes sharing a host": lambda tmp: CLUSTERS_DIR / "cpu4x2.yaml",
    "a single mesh": lambda tmp: CLUSTERS_DIR / "h100x1.yaml",
    "carve: fixed": lambda tmp: _write(tmp, (CLUSTERS_DIR / "h100x128.yaml").read_text() + "carve: fixed\n"),
    "a multi-node mesh": lambda tmp: _write(tmp, "name: m\n" + _meshes(
        "a h100-sxm 16 devices_per_node: 8", "b h100-sxm 16 devices_per_node: 8") + DEFAULT),
    "a kind of one mesh": lambda tmp: _write(tmp, "name: k\n" + _meshes(
        "a h100-sxm 8", "b h100-sxm 8", "c a100-80gb-sxm 8") + DEFAULT),
    "a pair with no link": lambda tmp: _write(tmp, "name: n\n" + _meshes("a h100-sxm 8", "b h100-sxm 8")),
}
WHY = {
    "meshes sharing a host": "mesh 'm0' shares host 'local' with other meshes",
    "a single mesh": "it lists 1 mesh, no nodes to carve",
    "carve: fixed": "its file says 'carve: fixed'",
    "a multi-node mesh": "mesh 'a' spans several nodes",
    "a kind of one mesh": "mesh 'c' is the only one of its kind",
    "a pair with no link": "meshes 'a' and 'b' have no link",
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_listings_that_do_not_describe_node_groups_are_kept(tmp_path, case):
    c = load_cluster(REFUSED[case](tmp_path))
    assert not c.groups and node_groups_of(c) is None
    assert c.carve_fixed == (case == "carve: fixed")
    # carving one is refused in one line that says why and how to fix it
    with pytest.raises(ProfileError) as e:
        carve(c, [GroupShape(next(iter(c.meshes.values())).device.name, 1)])
    msg = str(e.value)
    assert "\n" not in msg and "lists meshes, not node groups; it cannot be carved: " + WHY[case] in msg
    assert "fix: re-plan on this file with 'mpmd plan'" in msg


def test_carve_fixed_is_for_mesh_listings_only(tmp_path):
    nodes = (CLUSTERS_DIR / "h100x64_nodes.yaml").read_text()
    with pytest.raises(ProfileError, match=r"'carve: fixed' keeps a mesh listing as written, but this "
                                           r"cluster gives node_groups.*fix: remove 'carve: fixed'") as e:
        load_cluster(_write(tmp_path, nodes + "carve: fixed\n"))
    assert "\n" not in str(e.value)
    listing = (CLUSTERS_DIR / "h100x64.yaml").read_text()
    with pytest.raises(ProfileError, match=r"carve = 'fixd'.*fix: correct this value"):
        load_cluster(_write(tmp_path, listing + "carve: fixd\n"))
    assert not load_cluster(_write(tmp_path, listing + "carve: auto\n")).carve_fixed


def test_unequal_links_read_with_the_listing_as_topology(tmp_path):
    # once kept as listed (issue 45): joined unequally, a listing is read as node groups whose
    # carving uses its links (hardware_profiles.topology; tests/hardware_profiles/test_topology.py)
    within = load_cluster(CLUSTERS_DIR / "h100x16_p150bx32.yaml")
    between = load_cluster(_write(tmp_path, "name: u\n" + _meshes(
        "a h100-sxm 8", "b h100-sxm 8", "c a100-80gb-sxm 8", "d a100-80gb-sxm 8") + DEFAULT
        + "links:\n- {between: [a, c], bandwidth_gbit_per_s: 100, latency_us: 5}\n"))
    for c in (within, between):
        h = node_groups_of(c)
        assert h is not None and h.groups and "topology" in listing_reading(c)
    lc = carve(between, [GroupShape("h100-sxm", 2), GroupShape("a100-80gb-sxm", 2)])
    # a to c: their own 100 Gb/s link is narrower than the 3200 Gb/s default: the default's path
    assert lc.link_between("h100-sxm.0", "a100-80gb-sxm.0").link.bandwidth == 3200 * GBIT
