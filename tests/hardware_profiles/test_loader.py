"""Cluster loading and the one-line ProfileError for every bad input."""

import textwrap

import pytest

from hardware_profiles import CLUSTERS_DIR, DEVICES_DIR, Cluster, ProfileError, bundled_clusters, load_cluster, load_device

BUNDLED = ["a100x1024_nodes", "a100x128_gcp_nodes", "a100x128_v100x384_nodes", "a100x32_gcp_nodes", "a100x32_v100x96_nodes", "a100x80_gcp_nodes", "a100x80_v100x240_nodes", "b300x64_nodes", "gb200x256_nodes", "gb200x72_nodes", "gb300x256_nodes", "gb300x72_nodes", "h100x1", "h100x128", "h100x128_nodes", "h100x16384_nodes", "h100x16_p150bx32", "h100x2048_nodes", "h100x256_nodes", "h100x32_p150bx128", "h100x32_p150bx128_nodes",
           "h100x4096_nodes", "h100x512_nodes",
           "h100x64", "h100x64_nodes", "h200x1", "h800x2048_nodes", "loudbox_p150bx8", "mixed1024_nodes", "mixed4096_nodes", "mixed512_chain", "mixed512_nodes",
           "p150bx256", "p150bx256_nodes", "quietbox_n300x4", "quietbox_p150x4", "quietbox_p150x8_guide",
           "serve_h100x16_nodes", "serve_h100x8_p150bx8_nodes", "serve_h200x16_nodes", "serve_p150bx16_nodes",
           "serve_p150x8_quietbox_nodes", "serve_tpuv5e32_nodes", "serve_tpuv6e16_nodes",
           "tpuv5e256", "tpuv5e256_h100x16", "tpuv6e128"]


def test_bundled_cluster_names():
    # plus clusters of this machine's CPU devices, for compile-and-run (calibrated, not published)
    assert [p.stem for p in bundled_clusters() if not p.stem.startswith("cpu")] == BUNDLED


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_cluster_loads(name):
    c = load_cluster(CLUSTERS_DIR / f"{name}.yaml")
    assert isinstance(c, Cluster) and c.name == name and c.description
    for m in c.meshes.values():
        prod = 1
        for v in m.axes.values():
            prod *= v
        assert prod == m.num_devices
        assert m.intra_link.bandwidth > 0 and m.intra_link.source
    for ln in c.links:
        assert ln.link.bandwidth > 0 and ln.link.source
    names = list(c.meshes)
    names = names if len(names) <= 128 else names[:64] + names[-64:]   # a 2,048-node file: its ends
    for i, a in enumerate(names):  # every pair of meshes is joined
        for b in names[i + 1:]:
            assert c.link_between(a, b).link.bandwidth > 0


def test_cluster_sizes():
    sizes = {n: load_cluster(n).num_devices for n in BUNDLED}
    assert sizes == {"a100x1024_nodes": 1024, "a100x80_v100x240_nodes": 320,
                     "a100x32_v100x96_nodes": 128, "a100x128_v100x384_nodes": 512, "a100x32_gcp_nodes": 32,
                     "a100x80_gcp_nodes": 80, "a100x128_gcp_nodes": 128,
                     "b300x64_nodes": 64, "gb200x72_nodes": 72, "gb200x256_nodes": 256, "gb300x72_nodes": 72, "gb300x256_nodes": 256, "h100x1": 1, "h100x128": 128, "h100x16_p150bx32": 48, "h100x32_p150bx128": 160, "h100x64": 64,
                     "h200x1": 1, "loudbox_p150bx8": 8, "p150bx256": 256, "quietbox_n300x4": 4, "quietbox_p150x4": 4,
                     "quietbox_p150x8_guide": 8,
                     "tpuv5e256": 256, "tpuv5e256_h100x16": 272, "tpuv6e128": 128,
                     "h100x64_nodes": 64, "h100x128_nodes": 128, "h100x16384_nodes": 16384, "h100x2048_nodes": 2048, "h800x2048_nodes": 2048, "h100x256_nodes": 256, "h100x512_nodes": 512,
                     "mixed512_nodes": 512, "mixed512_chain": 512, "mixed1024_nodes": 1024, "mixed4096_nodes": 4096, "h100x4096_nodes": 4096, "p150bx256_nodes": 256,
                     "h100x32_p150bx128_nodes": 160,
                     # serving what-if options (reports/examples/llama70b-serve.yaml)
                     "serve_h100x16_nodes": 16, "serve_h200x16_nodes": 16, "serve_tpuv5e32_nodes": 32,
                     "serve_tpuv6e16_nodes": 16, "serve_p150x8_quietbox_nodes": 8,
                     "serve_p150bx16_nodes": 16, "serve_h100x8_p150bx8_nodes": 16}


def test_h100x64_links_and_units():
    c = load_cluster(CLUSTERS_DIR / "h100x64.yaml")
    assert list(c.meshes) == [f"h100_{i}" for i in range(8)]
    ln = c.link_between("h100_3", "h100_0")
    assert ln.link.bandwidth == 400e9  # 8 x 400 Gb/s = 3200 Gb/s = 400e9 B/s
    assert ln.link.latency == pytest.approx(5e-6, rel=1e-15)
    m = c.meshes["h100_0"]
    assert m.axes == {"data": 8} and m.intra_link.bandwidth == 450e9  # default: device scale-up
    assert c.peak_flops() == 64 * 989e12


def test_hetero_cluster_links():
    c = load_cluster(CLUSTERS_DIR / "h100x16_p150bx32.yaml")
    assert c.link_between("h100_0", "h100_1").link.bandwidth == 400e9
    assert c.link_between("bh_0", "bh_1").link.bandwidth == 200e9      # 1600 Gb/s
    assert c.link_between("h100_0", "bh_2").link.bandwidth == 50e9     # 400 Gb/s default
    assert c.meshes["bh_0"].axes == {"x": 2, "y": 4}
    assert c.meshes["bh_0"].device.name == "blackhole-p150b"


def _write(tmp_path, text, name="c.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


GOOD = """\
name: t
meshes:
  - name: a
    device: h100-sxm
    num_devices: 8
    axes: {data: 8}
    intra_link: {bandwidth_gb_per_s: 450, latency_us: 3, source: "NVLink4"}
    price_usd_per_device_hour: 3.0
    power_w_per_device: 650
  - {name: b, device: tpu-v5e, num_devices: 4, axes: {x: 2, y: 2}}
links:
  - {between: [a, b], bandwidth_gbit_per_s: 400, latency_us: 10, source: "x"}
default_link: {bandwidth_gb_per_s: 25, latency_us: 10, source: "y"}
"""


def test_good_cluster_conversions(tmp_path):
    c = load_cluster(_write(tmp_path, GOOD))
    a = c.meshes["a"]
    assert a.intra_link.bandwidth == 450e9 and a.intra_link.latency == pytest.approx(3e-6, rel=1e-15)
    assert a.price_per_hour == (24.0, 24.0) and a.power_watts == 8 * 650
    assert c.link_between("b", "a").link.bandwidth == 50e9
    assert c.default_link.bandwidth == 25e9
    assert c.path.endswith("c.yaml")


def _one_line_error(fn, *args):
    with pytest.raises(ProfileError) as info:
        fn(*args)
    msg = str(info.value)
    assert "\n" not in msg and info.value.__cause__ is None and type(info.value) is ProfileError
    return msg


def test_missing_file(tmp_path):
    msg = _one_line_error(load_cluster, tmp_path / "nope.yaml")
    assert msg == f"{tmp_path / 'nope.yaml'}: cluster file not found; fix: check the path"


def test_malformed_yaml(tmp_path):
    p = _write(tmp_path, "name: t\nmeshes: [a, b\n")
    msg = _one_line_error(load_cluster, p)
    assert msg.startswith(f"{p}: malformed YAML at line ") and msg.endswith("fix: correct the YAML syntax")


def test_top_level_not_mapping(tmp_path):
    p = _write(tmp_path, "- 1\n- 2\n")
    assert "top level is list, not a mapping" in _one_line_error(load_cluster, p)


def test_unknown_device(tmp_path):
    p = _write(tmp_path, GOOD.replace("device: tpu-v5e", "device: tpu-v9"))
    msg = _one_line_error(load_cluster, p)
    assert msg.startswith(f"{p}: mesh 'b': unknown device 'tpu-v9'; fix: use one of ['a100-40gb-sxm', 'a100-80gb-sxm', ")
    assert "'wormhole-n300']" in msg


def test_unknown_device_direct():
    msg = _one_line_error(load_device, "h300")
    assert msg.startswith("unknown device 'h300'; fix: use one of ['a100-40gb-sxm', 'a100-80gb-sxm'")


@pytest.mark.parametrize("bw", ["0", "-5"])
def test_non_positive_link_bandwidth(tmp_path, bw):
    p = _write(tmp_path, GOOD.replace("bandwidth_gbit_per_s: 400", f"bandwidth_gbit_per_s: {bw}"))
    msg = _one_line_error(load_cluster, p)
    assert msg == (f"{p}: links.0.bandwidth_gbit_per_s = {bw}: Input should be greater than or "
                   f"equal to 0.001; fix: use a number >= the minimum")


def test_zero_intra_bandwidth(tmp_path):
    p = _write(tmp_path, GOOD.replace("bandwidth_gb_per_s: 450", "bandwidth_gb_per_s: 0"))
    assert ("meshes.0.intra_link.bandwidth_gb_per_s = 0: Input should be greater than or equal to 0.001"
            in _one_line_error(load_cluster, p))


def test_axes_product(tmp_path):
    p = _write(tmp_path, """\
        meshes:
          - {name: lb0, device: blackhole-p150b, num_devices: 8, axes: {x: 2, y: 3}}
        """)
    msg = _one_line_error(load_cluster, p)
    assert msg == f"{p}: mesh 'lb0' axes {{x: 2, y: 3}} multiply to 6, not num_devices 8; fix the axis sizes"


def test_unknown_mesh_in_link(tmp_path):
    p = _write(tmp_path, GOOD.replace("between: [a, b]", "between: [a, c]"))
    assert _one_line_error(load_cluster, p) == f"{p}: links[0] names unknown mesh 'c'; fix: use one of ['a', 'b']"


def test_self_link_and_duplicate_link(tmp_path):
    p = _write(tmp_path, GOOD.replace("between: [a, b]", "between: [a, a]"))
    assert "joins mesh 'a' to itself" in _one_line_error(load_cluster, p)
    dup = GOOD.replace("default_link:", "  - {between: [b, a], bandwidth_gbit_per_s: 1, latency_us: 1}\ndefault_link:")
    p = _write(tmp_path, dup, "d.yaml")
    assert "links[1] duplicates the link between 'b' and 'a'" in _one_line_error(load_cluster, p)


def test_duplicate_mesh_names(tmp_path):
    p = _write(tmp_path, GOOD.replace("{name: b,", "{name: a,"))
    assert _one_line_error(load_cluster, p) == f"{p}: duplicate mesh name 'a'; fix: give every mesh a unique name"


def test_unknown_key_and_missing_key(tmp_path):
    p = _write(tmp_path, GOOD.replace("num_devices: 4", "num_device: 4"))
    msg = _one_line_error(load_cluster, p)
    assert msg.startswith(f"{p}: meshes.1.num_devices = missing: Field required; fix: add this key")
    p = _write(tmp_path, GOOD.replace("name: t", "name: t\nmeshs: []"), "e.yaml")
    assert "meshs = []: Extra inputs are not permitted; fix: remove this key or fix its spelling" in \
        _one_line_error(load_cluster, p)


def test_link_bandwidth_both_or_neither(tmp_path):
    p = _write(tmp_path, GOOD.replace("bandwidth_gbit_per_s: 400,", ""))
    assert "links[0] gives neither bandwidth_gbit_per_s and bandwidth_gb_per_s" in _one_line_error(load_cluster, p)


def _device_yaml(tmp_path, old, new, stem="h100-sxm", base="h100-sxm"):
    src = (DEVICES_DIR / f"{base}.yaml").read_text()
    assert old in src
    p = tmp_path / f"{stem}.yaml"
    p.write_text(src.replace(old, new, 1))
    return p


def test_device_zero_bandwidth(tmp_path):
    p = _device_yaml(tmp_path, "memory_bandwidth_gb_per_s:\n  value: 3350", "memory_bandwidth_gb_per_s:\n  value: 0")
    msg = _one_line_error(load_device, p)
    assert msg == (f"{p}: memory_bandwidth_gb_per_s.value = 0: Input should be greater than or "
                   f"equal to 0.001; fix: use a number >= the minimum")


def test_device_negative_scale_up(tmp_path):
    p = _device_yaml(tmp_path, "bandwidth_gb_per_s_per_direction:\n    value: 450",
                     "bandwidth_gb_per_s_per_direction:\n    value: -450")
    assert "scale_up.bandwidth_gb_per_s_per_direction.value = -450: Input should be greater than or equal to 0.001" in \
        _one_line_error(load_device, p)


def test_device_missing_source(tmp_path):
    p = _device_yaml(tmp_path, "tdp_w:\n  value: 700\n  source: NVIDIA H100 Tensor Core GPU datasheet, SXM column (up to 700 W)",
                     "tdp_w:\n  value: 700")
    assert f"{p}: tdp_w.source = missing: Field required; fix: add this key" in _one_line_error(load_device, p)


def test_device_efficiency_out_of_range(tmp_path):
    p = _device_yaml(tmp_path, "matmul:\n    value: 0.689", "matmul:\n    value: 1.5")
    assert "efficiency.matmul.value = 1.5: Input should be less than or equal to 1" in _one_line_error(load_device, p)


def test_device_name_mismatch(tmp_path):
    p = _device_yaml(tmp_path, "name: h100-sxm", "name: h100-sxm", stem="other")
    assert _one_line_error(load_device, p) == (f"{p}: name 'h100-sxm' differs from the file stem 'other'; "
                                               f"fix: set 'name: other' or rename the file")


def test_device_both_memory_keys(tmp_path):
    p = _device_yaml(tmp_path, "memory_gib:", "memory_gb:\n  value: 80\n  source: x\nmemory_gib:")
    assert "memory given as both memory_gb and memory_gib" in _one_line_error(load_device, p)


def test_device_bad_alternative_field(tmp_path):
    p = _device_yaml(tmp_path, "- field: memory_gb", "- field: memory_tb")
    assert "alternatives field 'memory_tb' is unknown" in _one_line_error(load_device, p)


def test_device_path_in_cluster_relative(tmp_path):
    (tmp_path / "devs").mkdir()
    (tmp_path / "devs" / "h100-sxm.yaml").write_text((DEVICES_DIR / "h100-sxm.yaml").read_text())
    p = _write(tmp_path, "meshes:\n  - {name: a, device: devs/h100-sxm.yaml, num_devices: 2, axes: {x: 2}}\n")
    c = load_cluster(p)
    assert c.name == "c" and c.meshes["a"].device.memory_bytes == 81559 * 2**20
    p = _write(tmp_path, "meshes:\n  - {name: a, device: devs/none.yaml, num_devices: 2}\n", "f.yaml")
    assert "none.yaml: device profile file not found; fix: check the path" in _one_line_error(load_cluster, p)


def test_no_link_between_meshes(tmp_path):
    p = _write(tmp_path, GOOD.split("links:")[0])
    c = load_cluster(p)
    with pytest.raises(ProfileError, match="has no link between meshes 'a' and 'b'"):
        c.link_between("a", "b")


def test_p2p_mode(tmp_path):
    assert load_cluster(_write(tmp_path, GOOD)).p2p == "overlapped"
    assert load_cluster(_write(tmp_path, GOOD + "p2p: blocking\n")).p2p == "blocking"
    p = _write(tmp_path, GOOD + "p2p: sometimes\n")
    msg = _one_line_error(load_cluster, p)
    assert msg.startswith(f"{p}: p2p") and "sometimes" in msg, msg


def test_device_gemm_tiling(tmp_path):
    assert load_device(DEVICES_DIR / "a100-80gb-sxm.yaml").gemm_tiling == (108, 256, 128)
    assert load_device(DEVICES_DIR / "tpu-v5e.yaml").gemm_tiling is None
    assert load_device(DEVICES_DIR / "h100-sxm.yaml").gemm_tiling is None   # measured: no waves
    p = _device_yaml(tmp_path, "  compute_units: 108\n", "  compute_units: 0\n",
                     stem="a100-80gb-sxm", base="a100-80gb-sxm")
    msg = _one_line_error(load_device, p)
    assert "gemm_tiling.compute_units = 0" in msg and "\n" not in msg


def test_device_elementwise_traffic(tmp_path):
    assert load_device(DEVICES_DIR / "mi300x.yaml").elementwise_traffic == 0.0
    field = "  elementwise_traffic:\n    value: {}\n    origin: test\n"
    old = "  elementwise_traffic:\n    value: 0.4\n"
    src = (DEVICES_DIR / "h100-sxm.yaml").read_text()
    start = src.index(old)
    end = src.index("\n", src.index("origin:", start)) + 1
    block = src[start:end]
    p = _device_yaml(tmp_path, block, field.format(0.6))
    d = load_device(p)
    assert d.elementwise_traffic == 0.6 and d.sources["elementwise_traffic"] == "test"
    (tmp_path / "bad").mkdir()
    p = _device_yaml(tmp_path / "bad", block, field.format(1.5))
    msg = _one_line_error(load_device, p)
    assert "elementwise_traffic.value = 1.5" in msg and "\n" not in msg


def test_node_groups_reach_production_scale_and_stop_at_what_no_machine_has(tmp_path):
    from hardware_profiles.loader import MAX_NODES
    big = load_cluster(CLUSTERS_DIR / "h100x16384_nodes.yaml")
    assert big.num_devices == 16384 and big.groups["h100"].nodes == 2048
    text = (CLUSTERS_DIR / "h100x16384_nodes.yaml").read_text()
    p = tmp_path / "huge.yaml"
    p.write_text(text.replace("nodes: 2048", f"nodes: {MAX_NODES}"))
    assert load_cluster(p).num_devices == MAX_NODES * 8
    p.write_text(text.replace("nodes: 2048", f"nodes: {MAX_NODES // 2}").replace(
        "node_groups:\n", "node_groups:\n- {name: more, device: a100-80gb-sxm, nodes: "
        f"{MAX_NODES // 2 + 1}, devices_per_node: 8, scale_out_link: {{latency_us: 5, source: t}}}}\n"))
    with pytest.raises(ProfileError, match=f"{MAX_NODES + 1} nodes in all; fix: use at most {MAX_NODES}"):
        load_cluster(p)


@pytest.mark.parametrize("body,total", [
    ("node_groups:\n- {name: g, device: h100-sxm, nodes: 16384, devices_per_node: 1048576,\n"
     "   scale_out_link: {latency_us: 5, source: x}}\n", "17,179,869,184"),
    ("meshes:\n" + "".join(f"- {{name: m{i}, device: h100-sxm, num_devices: 1048576}}\n"
                           for i in range(2)), "2,097,152"),
])
def test_a_cluster_of_more_devices_than_the_search_can_hold_is_refused(tmp_path, body, total):
    f = tmp_path / "c.yaml"
    f.write_text("name: c\n" + body)
    with pytest.raises(ProfileError) as e:
        load_cluster(f)
    assert str(e.value) == (f"{f}: {total} devices in all, over the limit 1,048,576 (the planner's "
                            "search grows with the device count: minutes at 2**26); fix: describe at "
                            "most 1,048,576 devices")


def test_device_names_as_tables_print_them():
    from hardware_profiles.loader import canonical_device

    printed = {"DGX-H100": "h100-sxm", "H100": "h100-sxm", "GB200 NVL72": "gb200",
               "DGX-GB200": "gb200", "DGX-B200": "b200", "GB300": "gb300", "HGX B300": "b300",
               "H200": "h200-sxm", "A100": "a100-80gb-sxm", "A100-40GB": "a100-40gb-sxm",
               "TPU v5e": "tpu-v5e", "tpu_v5p": "tpu-v5p", "Trillium": "tpu-v6e"}
    for name, want in printed.items():
        assert canonical_device(name) == want, name
        assert load_device(name).name == load_device(want).name
    with pytest.raises(ProfileError, match="unknown device 'V100'"):   # 16 or 32 GB: not guessed
        load_device("V100")
