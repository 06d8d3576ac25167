"""Rack-scale NVLink (``scale_up_domain``): a GB200 NVL72 rack joins 18 hosts of 4 GPUs on one
NVLink fabric, so collectives and mesh-to-mesh links inside it run on NVLink; a DGX H100's domain
stays its node of 8; a domain that is not whole nodes is refused in one line; existing files load
as before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hardware_profiles import CLUSTERS_DIR, GroupShape, Link, ProfileError, bundled_clusters, carve, load_cluster
from hardware_profiles.collectives import ring_all_reduce, span_all_reduce
from hardware_profiles.types import MeshSpec, Span, straggler_hosts
from simulator import cost_model as cm

ROOT = Path(__file__).resolve().parents[2]
GB = 1e9
NVLINK5 = 900 * GB           # gb200 scale-up, per GPU per direction
NDR = 400 * GB / 8           # one ConnectX-7 / NDR NIC per GPU, per direction
NVLINK4 = 450 * GB           # h100-sxm scale-up
MB64 = 64e6
IB_US = 5 * 1e-6             # the bundled files' scale-out latency, 5 us, as the loader converts it


def _gb200(name: str = "gb200x72_nodes"):
    return load_cluster(CLUSTERS_DIR / f"{name}.yaml")


def _write(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(body)
    return p


# ------------------------------------------------------------------ collectives inside a mesh
def test_gb200_all_reduce_over_16_gpus_of_4_hosts_runs_on_nvlink():
    c = carve(_gb200(), [GroupShape("gb200", 16, nodes_per_mesh=4)])
    m = c.meshes["gb200.0"]
    assert (m.num_devices, m.devices_per_node, m.scale_up_domain, m.domain_devices) == (16, 4, 16, 16)
    assert m.collective_link(16) == m.intra_link == Link(NVLINK5, 3e-6, m.intra_link.source)
    span = m.collective_span(16)
    assert (span.nodes, span.inter, span.intra.bandwidth, span.bus_bandwidth) == (1, None, NVLINK5, NVLINK5)
    ring = ring_all_reduce(MB64, 16, m.intra_link)
    assert cm.collective(m, "all_reduce", MB64, 16) == ring == pytest.approx(2 * 15 / 16 * MB64 / NVLINK5 + 30 * 3e-6)
    # hosts are still the 4-GPU compute trays: straggler counting is unchanged
    assert straggler_hosts([m]) == 4


def test_dgx_h100_all_reduce_over_16_gpus_crosses_infiniband():
    c = carve(load_cluster(CLUSTERS_DIR / "h100x64_nodes.yaml"), [GroupShape("h100", 8, nodes_per_mesh=2)])
    m = c.meshes["h100.0"]
    assert (m.num_devices, m.devices_per_node, m.scale_up_domain, m.domain_devices) == (16, 8, None, 8)
    assert m.collective_link(8) == m.intra_link and m.intra_link.bandwidth == NVLINK4
    link = m.collective_link(16)
    assert (link.bandwidth, link.latency, link.source) == (8 * NDR, IB_US, m.scale_out_link.source)
    span = m.collective_span(16)
    assert span == Span(16, 2, m.intra_link, m.scale_out_link)
    assert (span.rails, span.bus_bandwidth) == (8, 8 * NDR)
    assert span_all_reduce(MB64, span)[1] == "ring"
    # 8 NICs side by side (400 GB/s), 28 NVLink hops and 2 network hops
    assert cm.collective(m, "all_reduce", MB64, 16) == span_all_reduce(MB64, span)[0] == pytest.approx(
        2 * 15 / 16 * MB64 / (8 * NDR) + 28 * 3e-6 + 2 * IB_US)


def test_gb200_collective_over_two_racks_crosses_infiniband_one_nic_per_gpu():
    # 256 GPUs: 4 racks of 16 active 4-GPU trays (scale_up_domain 64); a mesh of 32 trays = 2 racks
    c = carve(_gb200("gb200x256_nodes"), [GroupShape("gb200", 64, nodes_per_mesh=32)])
    m = c.meshes["gb200.0"]
    assert (m.num_devices, m.scale_up_domain) == (128, 64)
    assert m.collective_link(64) == m.intra_link
    span = m.collective_span(128)
    assert (span.nodes, span.rails, span.intra, span.inter) == (2, 64, m.intra_link, m.scale_out_link)
    assert m.collective_link(128).bandwidth == min(NVLINK5, 64 * NDR) == NVLINK5
    # the data-parallel group of a tp8 layout: 16 members, 8 apart, 8 in each rack
    assert m.collective_span(16, stride=8) == Span(16, 2, m.intra_link, m.scale_out_link)
    assert straggler_hosts([m]) == 32


def test_mesh_straddling_two_racks_keeps_only_whole_aligned_blocks_on_nvlink():
    # 6 trays per mesh on racks of 16 trays: mesh 2 is trays 12-17, 4 in rack 0 and 2 in rack 1,
    # so only aligned blocks of 2 trays (8 GPUs) never straddle a rack
    c = carve(_gb200("gb200x256_nodes"), [GroupShape("gb200", 60, nodes_per_mesh=6)])
    assert [c.meshes[f"gb200.{j}"].scale_up_domain for j in range(4)] == [24, 24, 8, 24]
    m = c.meshes["gb200.2"]
    assert m.collective_link(8) == m.intra_link
    assert m.collective_span(24) == Span(24, 3, m.intra_link, m.scale_out_link)
    # trays 15-17 (3 per mesh): the rack boundary after the first tray leaves one host per block,
    # which is the default (None: devices_per_node)
    c3 = carve(_gb200("gb200x256_nodes"), [GroupShape("gb200", 63, nodes_per_mesh=3)])
    assert c3.meshes["gb200.5"].scale_up_domain is None
    assert c3.meshes["gb200.4"].scale_up_domain == 12


def test_slices_of_a_tray_carry_the_domain_in_their_own_devices():
    c = carve(_gb200(), [GroupShape("gb200", 18, nodes_per_mesh=9, meshes_per_node=2)])
    m = c.meshes["gb200.0"]
    assert (m.num_devices, m.devices_per_node, m.scale_up_domain) == (18, 2, 18)
    assert m.collective_link(18) == m.intra_link


# ------------------------------------------------------------------ links between meshes
def test_meshes_of_one_rack_talk_over_nvlink_and_across_racks_over_infiniband():
    c = _gb200()
    assert len(c.meshes) == 18
    assert c.link_between("gb200.0", "gb200.17").link.bandwidth == 4 * NVLINK5
    assert "scale-up domain link of gb200" in c.link_between("gb200.0", "gb200.17").link.source
    big = _gb200("gb200x256_nodes")
    assert big.link_between("gb200.0", "gb200.15").link.bandwidth == 4 * NVLINK5
    cross = big.link_between("gb200.15", "gb200.16").link
    assert (cross.bandwidth, cross.latency) == (4 * NDR, IB_US)
    # meshes of 8 trays: 0 and 1 share rack 0; 1 and 2 do not
    c8 = carve(big, [GroupShape("gb200", 64, nodes_per_mesh=8)])
    assert c8.link_between("gb200.0", "gb200.1").link.bandwidth == 32 * NVLINK5
    assert c8.link_between("gb200.1", "gb200.2").link.bandwidth == 32 * NDR


def test_dgx_h100_meshes_on_different_nodes_talk_over_infiniband():
    c = load_cluster(CLUSTERS_DIR / "h100x64_nodes.yaml")
    ln = c.link_between("h100.0", "h100.1").link
    assert (ln.bandwidth, ln.latency) == (8 * NDR, IB_US)
    assert "scale-out link of h100" in ln.source


# ------------------------------------------------------------------ the file
GROUP = """name: bad
node_groups:
- name: gb200
  device: gb200
  nodes: 18
  devices_per_node: 4
  scale_up_domain: {domain}
  scale_out_link: {{latency_us: 5, source: test}}
"""


@pytest.mark.parametrize("domain,near", [(70, "68 or 72"), (2, "4"), (6, "4 or 8")])
def test_a_domain_of_part_of_a_node_is_refused_in_one_line(tmp_path, domain, near):
    p = _write(tmp_path, GROUP.format(domain=domain))
    with pytest.raises(ProfileError) as err:
        load_cluster(p)
    assert str(err.value) == (f"{p}: node group 'gb200' scale_up_domain {domain} is not a multiple of "
                              f"devices_per_node 4; fix: use whole nodes (e.g. {near}) or remove it for "
                              f"one node's devices")


def test_a_domain_below_one_is_refused_by_the_file_shape(tmp_path):
    p = _write(tmp_path, GROUP.format(domain=0))
    with pytest.raises(ProfileError) as err:
        load_cluster(p)
    assert str(err.value) == (f"{p}: node_groups.0.scale_up_domain = 0: Input should be greater than or "
                              f"equal to 1; fix: use a number >= the minimum")


def test_a_domain_of_one_node_is_the_default(tmp_path):
    c = load_cluster(_write(tmp_path, GROUP.format(domain=4)))
    assert c.groups["gb200"].scale_up_domain is None
    assert c.link_between("gb200.0", "gb200.1").link.bandwidth == 4 * NDR


MESHES = """name: listed
meshes:
- name: a
  device: gb200
  num_devices: 32
  devices_per_node: 4
  {domain}
  scale_out_link: {{bandwidth_gbit_per_s: 400, latency_us: 5, source: test}}
"""


def test_a_mesh_listing_may_name_its_domain(tmp_path):
    m = load_cluster(_write(tmp_path, MESHES.format(domain="scale_up_domain: 16"))).meshes["a"]
    assert (m.scale_up_domain, m.collective_link(16), m.collective_span(32).nodes) == (16, m.intra_link, 2)
    p = _write(tmp_path, MESHES.format(domain="scale_up_domain: 10"))
    with pytest.raises(ProfileError) as err:
        load_cluster(p)
    assert str(err.value) == (f"{p}: mesh 'a' scale_up_domain 10 is not a multiple of devices_per_node 4; "
                              f"fix: use whole nodes (e.g. 8 or 12) or remove it for one node's devices")
    p = _write(tmp_path, MESHES.format(domain="scale_up_domain: 16").replace("  devices_per_node: 4\n", ""))
    with pytest.raises(ProfileError) as err:
        load_cluster(p)
    assert str(err.value) == (f"{p}: mesh 'a' scale_up_domain 16 needs devices_per_node (the devices of one "
                              f"node); fix: set devices_per_node or remove scale_up_domain")


def test_existing_cluster_files_load_unchanged():
    for path in bundled_clusters():
        c = load_cluster(path)
        if path.stem.startswith(("gb200", "gb300")):   # the NVL72 racks: scale_up_domain set
            continue
        assert all(m.scale_up_domain is None for m in c.meshes.values()), path.stem
        assert all(g.scale_up_domain is None and g.domain_devices == g.devices_per_node
                   for g in c.groups.values()), path.stem
    c = carve(load_cluster(CLUSTERS_DIR / "h100x64_nodes.yaml"), [GroupShape("h100", 8, nodes_per_mesh=4)])
    m = c.meshes["h100.0"]
    # the mesh as it was built before scale_up_domain existed: equal, same hash, same links
    old = MeshSpec(name="h100.0", device=m.device, num_devices=32, axes={"data": 32}, intra_link=m.intra_link,
                   devices_per_node=8, scale_out_link=m.scale_out_link)
    assert m == old and hash(m) == hash(old)
    assert [(m.collective_link(g, s).bandwidth, m.collective_link(g, s).latency)
            for g, s in ((8, 1), (16, 1), (32, 1), (4, 8))] == [
        (NVLINK4, 3e-6), (8 * NDR, IB_US), (8 * NDR, IB_US), (1 * NDR, IB_US)]
    assert m.collective_span(32) == Span(32, 4, m.intra_link, m.scale_out_link)
    tpu = load_cluster(CLUSTERS_DIR / "tpuv5e256.yaml")
    assert all(x.scale_up_domain is None for x in tpu.meshes.values())


# ------------------------------------------------------------------ the CLI
def test_mpmd_plan_on_one_gb200_nvl72_rack(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mpmd", "plan", "--model", "llama3-8b", "--cluster",
                        str(CLUSTERS_DIR / "gb200x72_nodes.yaml"), "--global-batch", "64", "--seq-len", "4096",
                        "--time-limit", "10", "--out", str(tmp_path / "plan.json")],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert "gb200x72_nodes, 72 devices: 72 gb200 (18 nodes of 4)" in r.stdout
    assert "step time" in r.stdout and (tmp_path / "plan.json").is_file()
