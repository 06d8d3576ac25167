"""What a low-precision recipe changes in the cost model (``simulator.cost_model`` with
``Workload.precision``): the blocks' GEMMs at the format's rate, the attention core, embedding and
head at the compute dtype's, the casts, and the memory."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hardware_profiles import load_device
from hardware_profiles.types import Link, MeshSpec, ProfileError
from ir import Layout
from ir.schedule import FragmentKind
from simulator import cost_model as cm
from zoo.costing import workload

H100 = load_device("h100-sxm")


@pytest.fixture(scope="module")
def llama8b():
    return workload("llama3-8b", 16, 8192)


def _mesh(dev=H100, n=8):
    return MeshSpec("m", dev, n, {"x": n}, Link(dev.scale_up_bandwidth, dev.scale_up_latency))


def _time(c, kind, precision, mesh=None, layout=Layout(1, 1)):
    return cm.layer_time(c, kind, 1, mesh or _mesh(), layout, "bf16", seq_len=8192,
                         precision=precision)


def test_gemm_inputs_of_a_llama_block(llama8b):
    # fused QKV, output projection, fused gate/up and down read 3 h + ffn = 26,624 per token
    per_token = cm.quantized_elements(llama8b.costs["decoder_block"], 8192, 2) / 8192
    assert per_token == pytest.approx(3 * 4096 + 14336, rel=1e-3)


def test_gemm_inputs_of_routed_experts_are_counted_per_row():
    # Qwen3-30B-A3B (h 2,048, 8 of 128 experts of 768): each routed row is quantised for its
    # fused gate/up projection (K = h) and its down projection (K = 768); the attention
    # projections (QKV 2,048 -> 4,096 + 2 x 512, output 4,096 -> 2,048) and the router by FLOP
    from zoo.model_files import resolve_model
    cfg = resolve_model("qwen3-30b-a3b")
    c = workload(cfg, 8, 4096).costs["decoder_block"]
    per_token = cm.quantized_elements(c, 4096, 2) / 4096
    dense_flops = 2 * (2048 * (4096 + 2 * 512) + 4096 * 2048 + 2048 * 128)
    assert per_token == pytest.approx(8 * (2048 + 768) + dense_flops / (4 * 2048), rel=1e-3)


def test_bf16_and_blank_are_the_compute_dtype(llama8b):
    c = llama8b.costs["decoder_block"]
    for kind in ("F", "B"):
        assert _time(c, kind, "") == _time(c, kind, "bf16")


def test_only_the_blocks_run_low_precision(llama8b):
    assert [n for n, c in llama8b.costs.items() if c.low_precision] == ["decoder_block"]
    for name in ("embed", "head"):
        c = llama8b.costs[name]
        assert _time(c, "F", "fp8") == _time(c, "F", "bf16")


def test_fp8_block_is_faster_but_not_past_its_gemm_rate(llama8b):
    """The speed-up stays below the FP8 GEMM rate over the BF16 one: the attention core stays
    at the BF16 rate and the casts add time."""
    c = llama8b.costs["decoder_block"]
    gemm_gain = H100.format_rate("fp8") / H100.achievable_flops("bf16")
    for kind in (FragmentKind.F, FragmentKind.B):
        bf16, fp8 = _time(c, kind, "bf16"), _time(c, kind, "fp8")
        assert 1.2 < bf16 / fp8 < gemm_gain
        # blockwise scaling runs slower GEMMs than per-tensor scaling
        assert _time(c, kind, "fp8-blockwise") > fp8


def test_casts_are_charged_at_the_memory_rate(llama8b):
    """Removing the FP8 casts' bytes (a recipe with cast_bytes 0) saves exactly their time."""
    import ir.precision as P

    c = llama8b.costs["decoder_block"]
    with_casts = _time(c, "F", "fp8")
    free = replace(P.RECIPES["fp8"], cast_bytes=0.0)
    try:
        P.RECIPES["fp8"] = free
        cm.layer_time.cache_clear()
        without = _time(c, "F", "fp8")
    finally:
        P.RECIPES["fp8"] = replace(free, cast_bytes=2.0)
        cm.layer_time.cache_clear()
    cast = cm.quantized_elements(c, 8192, 2) * 2.0 / H100.achievable_bandwidth
    assert with_casts - without == pytest.approx(cast, rel=1e-9)


def test_a_device_without_the_format_is_refused_in_one_line(llama8b):
    a100 = _mesh(load_device("a100-80gb-sxm"))
    with pytest.raises(ProfileError, match=r"^device 'a100-80gb-sxm' does not run fp8 GEMMs "
                                           r"\(it runs: bf16\); fix: .*--precision"):
        _time(llama8b.costs["decoder_block"], "F", "fp8", mesh=a100)
    with pytest.raises(ProfileError, match="does not run mxfp8 GEMMs"):
        _time(llama8b.costs["decoder_block"], "F", "mxfp8")      # Hopper has no microscaling


def test_memory_of_the_low_precision_copies(llama8b):
    lay = Layout(data=8, tensor=1)
    n = len(llama8b.layers)
    mem = {p: cm.stage_memory(replace(llama8b, precision=p), 0, n, lay, 1)
           for p in ("bf16", "fp8", "nvfp4")}
    # FP8 keeps weight + transpose at 1 byte in place of the BF16 copy: no change
    assert mem["fp8"].static_bytes == mem["bf16"].static_bytes
    # NVFP4's two copies of half a byte (+ a scale per 16) are smaller than BF16's 2 bytes
    block = llama8b.costs["decoder_block"]
    assert mem["bf16"].static_bytes - mem["nvfp4"].static_bytes == pytest.approx(
        32 * block.param_count * (2 - 2 * (0.5 + 1 / 16)))
    # the GEMM inputs kept for the weight gradient are saved in the format
    assert mem["fp8"].residual_bytes_per_microbatch < mem["bf16"].residual_bytes_per_microbatch
    saved = 32 * cm.quantized_elements(block, 8192, 2) * (2 - 1) / 8
    assert (mem["bf16"].residual_bytes_per_microbatch - mem["fp8"].residual_bytes_per_microbatch
            == pytest.approx(saved))
    # unless the GEMMs keep their compute-dtype inputs (torchao's Float8Linear): then as BF16
    hp = cm.stage_memory(replace(llama8b, precision="fp8", saved_inputs="compute"), 0, n, lay, 1)
    assert hp.residual_bytes_per_microbatch == mem["bf16"].residual_bytes_per_microbatch
    assert hp.static_bytes == mem["fp8"].static_bytes


def test_mfu_denominator_is_the_format_peak(llama8b):
    assert cm.peak_rate(H100, llama8b) == H100.peak_flops["bf16"]
    assert cm.peak_rate(H100, replace(llama8b, precision="fp8")) == H100.peak_flops["fp8"]
    assert cm.fastest_rate(H100, replace(llama8b, precision="fp8")) == H100.format_rate("fp8")
