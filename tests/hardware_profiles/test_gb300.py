"""The GB300 (Blackwell Ultra, GB300 NVL72) profile and its bundled rack clusters: the published
peaks, memory and fabric figures (hardware_profiles/devices/gb300.yaml cites each), its 72-GPU
NVLink domain, and the Blackwell efficiencies it inherits from gb200 through its chip."""

import pytest

from hardware_profiles import CLUSTERS_DIR, load_cluster, load_device

T = 1e12


def test_gb300_loads_with_the_published_dense_peaks():
    d = load_device("gb300")
    assert d.name == "gb300" and d.vendor == "NVIDIA"
    # NVIDIA GB300 NVL72 specifications per rack / 72, dense; fp4: 15 PFLOPS dense NVFP4
    assert dict(d.peak_flops) == {"bf16": 2500 * T, "fp16": 2500 * T, "fp8": 5000 * T,
                                  "fp4": 15000 * T, "tf32": 1250 * T, "fp32": 80 * T}
    assert d.peak("bf16") == 2500 * T and d.peak("fp32") == 1250 * T    # float32 runs at tf32
    for dtype in d.peak_flops:
        assert "PFLOPS" in d.sources[f"peak_flops.{dtype}"]


def test_gb300_memory_fabric_power_and_host():
    d = load_device("gb300")
    assert d.memory_bytes == 284208 * 2**20         # nvidia-smi's total ("GB300-288GB" marketed)
    assert d.memory_bandwidth == 8000e9             # 8 TB/s HBM3e
    assert d.scale_up_bandwidth == 900e9            # NVLink 5: 1.8 TB/s bidirectional
    assert d.scale_up_domain == 72 and d.scale_up_one_hop
    assert d.scale_out_bandwidth == 800e9 / 8       # one ConnectX-8 800 Gb/s per GPU
    assert d.tdp_watts == 1400 and d.lockstep_devices == 4


def test_gb300_differs_from_gb200_where_blackwell_ultra_does():
    ultra, gb200 = load_device("gb300"), load_device("gb200")
    assert ultra.peak_flops["fp4"] == 1.5 * gb200.peak_flops["fp4"]
    for dtype in ("bf16", "fp16", "fp8", "tf32", "fp32"):
        assert ultra.peak_flops[dtype] == gb200.peak_flops[dtype], dtype
    assert ultra.memory_bytes > gb200.memory_bytes and ultra.tdp_watts > gb200.tdp_watts
    assert ultra.scale_out_bandwidth == 2 * gb200.scale_out_bandwidth
    assert ultra.scale_up_bandwidth == gb200.scale_up_bandwidth
    assert ultra.scale_up_domain == gb200.scale_up_domain == 72


def test_gb300_fits_its_matmul_and_takes_the_rest_from_its_chip():
    """`mpmd validate --fit` gives a kind with fewer than FEW_ROWS dense BF16 rows its chip's
    fitted memory efficiency, dispatch overhead and elementwise fraction and fits only its matmul
    efficiency (mpmd/cli/validate.py): gb300, on gb200's chip, has one (the DGX Station's Llama 3
    8B run) and runs its GEMMs faster than gb200; its FP8, MXFP8 and NVFP4 efficiencies are
    fitted on its own rows, each origin saying so."""
    from mpmd.cli.validate import FEW_ROWS, _same_chip

    ultra, gb200 = load_device("gb300"), load_device("gb200")
    assert ultra.chip == gb200.chip == "b200" and FEW_ROWS == 3
    assert _same_chip(ultra, {"gb200": gb200, "gb300": ultra}, ["gb200"]) is gb200
    assert (ultra.memory_efficiency, ultra.fragment_overhead, ultra.elementwise_traffic) == (
        gb200.memory_efficiency, gb200.fragment_overhead, gb200.elementwise_traffic)
    assert ultra.matmul_efficiency > gb200.matmul_efficiency
    assert "over the 1 gb300 rows" in ultra.sources["matmul_efficiency"]
    assert "are gb200's (the same chip, b200; fewer than 3 BF16 rows)" in \
        ultra.sources["memory_efficiency"]
    for recipe in ("fp8", "mxfp8", "nvfp4"):
        assert "over the" in ultra.sources[f"training_formats.{recipe}"] \
            and "gb300 rows" in ultra.sources[f"training_formats.{recipe}"]
    assert "dgx-station-nvfp4" in ultra.sources["training_formats.nvfp4"]
    assert gb200.sources["training_formats.nvfp4"].startswith("prior")
    assert ultra.training_formats == ("bf16", "fp8", "fp8-blockwise", "mxfp8", "nvfp4")
    # the attention core stays at the GEMM rate, the SFU gain named but not credited
    assert ultra.attention_rate(8192) == 1.0
    assert "SFU" in ultra.sources["attention_efficiency"]
    assert ultra.comm_interference == pytest.approx(16 / 160)


def test_gb300_runs_nvfp4_at_its_own_fp4_peak():
    ultra, gb200 = load_device("gb300"), load_device("gb200")
    # 1.5x GB200's FP4 peak; the rates differ by the efficiencies each kind's rows fitted
    assert ultra.peak_flops["fp4"] == pytest.approx(1.5 * gb200.peak_flops["fp4"])
    assert ultra.format_rate("fp8") / ultra.format_efficiency["fp8"] / ultra.matmul_efficiency \
        == pytest.approx(gb200.format_rate("fp8") / gb200.format_efficiency["fp8"]
                         / gb200.matmul_efficiency)
    assert ultra.format_rate("nvfp4") == pytest.approx(
        15000 * T * ultra.matmul_efficiency * ultra.format_efficiency["nvfp4"])


@pytest.mark.parametrize("name, nodes, domain", [("gb300x72_nodes", 18, 72),
                                                 ("gb300x256_nodes", 64, 64)])
def test_gb300_rack_clusters(name, nodes, domain):
    c = load_cluster(CLUSTERS_DIR / f"{name}.yaml")
    g = c.groups["gb300"]
    assert (g.device.name, g.nodes, g.devices_per_node, g.scale_up_domain) == (
        "gb300", nodes, 4, domain)
    assert c.num_devices == nodes * 4
