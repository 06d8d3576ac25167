"""Bundled device profiles: every id loads, every published figure has a source, units are exact."""

import pytest
import yaml

from hardware_profiles import DEVICES_DIR, DeviceProfile, ProfileError, known_device_ids, list_devices, load_device

IDS = ["a100-40gb-sxm", "a100-80gb-sxm", "b200", "b300", "blackhole-p100a", "blackhole-p150a", "blackhole-p150b", "gaudi3", "gb200", "gb300", "h100-sxm", "h200-sxm", "h800-sxm", "l40s", "mi300x",
       "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "v100-sxm2-16gb", "v100-sxm2-32gb", "wormhole-n150", "wormhole-n300"]
SI_FIELDS = ["memory_bytes", "memory_bandwidth", "scale_up_bandwidth", "scale_up_latency", "scale_out_bandwidth",
             "tdp_watts", "matmul_efficiency", "memory_efficiency", "fragment_overhead"]


MEASURED = ["cpu-host"]
"""Profiles calibrated on this machine by ``mpmd calibrate`` rather than published."""


def test_exact_id_set():
    assert known_device_ids() == sorted(IDS + MEASURED)
    assert [d.name for d in list_devices()] == sorted(IDS + MEASURED)


@pytest.mark.parametrize("name", IDS)
def test_every_figure_has_a_source(name):
    d = load_device(name)
    assert isinstance(d, DeviceProfile) and d.name == name and d.vendor and d.description
    for f in SI_FIELDS:
        assert d.sources.get(f, "").strip(), f"{name}: no source for {f}"
    for dtype in d.peak_flops:
        assert d.sources[f"peak_flops.{dtype}"].strip()
    if d.price_per_hour is not None:
        assert d.sources["price_per_hour"].strip()
        assert 0 < d.price_per_hour[0] <= d.price_per_hour[1]
    assert 0 < d.matmul_efficiency <= 1 and 0 < d.memory_efficiency <= 1
    assert max(d.peak("bf16"), d.peak("fp16")) > 0      # a 16-bit rate of its own
    for dtype in d.precision_rules:
        assert d.sources[f"precision_rules.{dtype}"].strip()
    for a in d.alternatives:
        assert a.source and a.field


@pytest.mark.parametrize("name", IDS)
def test_every_yaml_figure_has_source_or_origin(name):
    """Walk the raw YAML: every mapping with a 'value' carries a 'source' (published) or 'origin' (efficiency)."""
    raw = yaml.safe_load((DEVICES_DIR / f"{name}.yaml").read_text())

    def walk(node, path):
        if isinstance(node, dict):
            if "value" in node:
                assert node.get("source") or node.get("origin"), f"{name}: {path} lacks a source"
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(raw, name)


def test_h100_units_exact():
    d = load_device("h100-sxm")
    assert d.memory_bytes == 81559 * 2**20     # nvidia-smi's total, not the datasheet's 80e9
    assert d.memory_bandwidth == 3.35e12
    assert d.peak_flops["bf16"] == 989e12 and d.peak_flops["fp8"] == 1979e12
    assert d.scale_up_bandwidth == 450e9
    assert d.scale_out_bandwidth == 50e9  # 400 Gb/s
    assert d.scale_up_latency == pytest.approx(3e-6, rel=1e-15)
    assert d.fragment_overhead == pytest.approx(20e-6, rel=1e-15)  # the prior, held by `mpmd validate --fit`
    assert d.tdp_watts == 700 and d.price_per_hour == (2.7, 4.9)
    assert d.achievable_flops("bf16") == pytest.approx(989e12 * 0.689)
    # measured on one H100 / H200 (reports/validation/device): no wave quantisation, a backward's
    # GEMMs at 0.92 of the forward's rate, the attention core at 0.789 s / (s + 647) forward
    assert d.gemm_tiling is None and d.backward_efficiency == 0.92
    assert (d.attention_efficiency, d.attention_half_tokens) == (0.789, 647)
    assert (d.attention_backward_efficiency, d.attention_backward_half_tokens) == (0.715, 1161)
    assert d.attention_rate(647) == pytest.approx(0.789 / 2)


def test_gib_conversion_exact():
    assert load_device("tpu-v4").memory_bytes == 32 * 2**30
    assert load_device("tpu-v5p").memory_bytes == 95 * 2**30


def test_tenstorrent_profiles():
    p150b = load_device("blackhole-p150b")
    assert p150b.memory_bytes == 32e9
    assert p150b.peak_flops["bf16"] == 332e12 and p150b.peak_flops["bfp8"] == 664e12
    alt = [a for a in p150b.alternatives if a.field == "memory_bytes"]
    assert len(alt) == 1 and alt[0].value == 16e9 and "004_fb84b110b421d1e0" in alt[0].source
    n300 = load_device("wormhole-n300")
    assert n300.memory_bytes == 24e9 and n300.memory_bandwidth == 576e9
    assert n300.peak_flops["bf16_hifi4"] == 131e12 and n300.peak_flops["bf16"] == 262e12
    assert "WHOLE CARD" in n300.description
    assert "HiFi2" in n300.description and "HiFi2" in p150b.description


def test_alternative_units_converted():
    alts = {a.field: a.value for a in load_device("b200").alternatives}
    assert alts == {"memory_bytes": 192e9, "peak_flops.fp32": 80e12}
    bf = {a.field: a.value for a in load_device("blackhole-p150a").alternatives}
    assert bf["peak_flops.bfp8"] == 774e12


def test_load_by_path_returns_same_values(tmp_path):
    src = (DEVICES_DIR / "h100-sxm.yaml").read_text()
    p = tmp_path / "h100-sxm.yaml"
    p.write_text(src)
    assert load_device(p) == load_device("h100-sxm")
    assert load_device(str(p)).memory_bytes == 81559 * 2**20


def test_achievable_flops_unknown_dtype():
    with pytest.raises(ProfileError, match="has no fp4 rate"):
        load_device("h100-sxm").achievable_flops("fp4")


def test_profiles_table_lists_every_device():
    from rich.console import Console

    from hardware_profiles import profiles_rows, profiles_table

    rows = profiles_rows()
    assert [r[0] for r in rows] == sorted(IDS + MEASURED)
    h100 = dict(zip(["id", "vendor", "bf16", "mem", "bw", "up", "tdp", "price", "eff"], next(r for r in rows if r[0] == "h100-sxm")))
    assert h100 == {"id": "h100-sxm", "vendor": "NVIDIA", "bf16": "989", "mem": "85.5", "bw": "3,350", "up": "450",
                    "tdp": "700", "price": "2.7-4.9", "eff": "0.69"}
    table = profiles_table()
    assert table.row_count == len(IDS + MEASURED) and len(table.columns) == 10
    console = Console(width=200, record=True)
    console.print(table)
    assert "blackhole-p150b" in console.export_text()


def test_v100_has_no_bf16_and_runs_16_bit_at_its_fp16_rate():
    d = load_device("v100-sxm2-16gb")
    assert "bf16" not in d.peak_flops
    assert d.peak("fp16") == 125e12 and d.peak("bf16") == 0.0
    assert d.achievable_flops("fp16") == 125e12 * d.matmul_efficiency
    with pytest.raises(ProfileError, match="has no bf16 rate"):
        d.achievable_flops("bf16")
    assert d.peak("fp8") == 0.0
    with pytest.raises(ProfileError, match="has no fp8 rate"):
        d.achievable_flops("fp8")
