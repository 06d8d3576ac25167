"""A mixture of experts' token path (``cost_model.token_path_time``): seconds per routed
(token, expert, hidden) element, a third in the forward and the rest in the input gradient,
none in a weight gradient or a dense layer; the profile key ``routed_element_ps`` and the
writer of ``mpmd validate --fit-moe``."""

from __future__ import annotations

import dataclasses

import pytest

from ir import FragmentKind, LayerCost, Layout
from hardware_profiles import load_device
from hardware_profiles.loader import DEVICES_DIR
from hardware_profiles.types import Link, MeshSpec
from simulator import cost_model as cm
from mpmd.cli.validate_moe import write_entry

# one sample routes 4,096 tokens x top-8 x hidden 2,048 x 2 bytes in a dispatch
MOE = LayerCost(name="decoder_block", fwd_flops_per_sample=2e12, bwd_flops_per_sample=4e12,
                bwd_input_flops_per_sample=2e12, fwd_bytes_fixed=2e9, fwd_bytes_per_sample=1e8,
                bwd_bytes_fixed=4e9, bwd_bytes_per_sample=2e8, param_count=1_000_000_000,
                param_bytes=2e9, activation_bytes_per_sample=1e6, residual_bytes_per_sample=1e7,
                tp_allreduce_bytes_per_sample=8e7, experts=128, expert_param_count=800_000_000,
                expert_fwd_flops_per_sample=1e12,
                alltoall_bytes_per_sample=4096 * 8 * 2048 * 2.0,
                routed_pairs_per_sample=4096 * 8.0, experts_per_token=8.0)
DENSE = dataclasses.replace(MOE, experts=0, expert_param_count=0, expert_fwd_flops_per_sample=0.0,
                            alltoall_bytes_per_sample=0.0, routed_pairs_per_sample=0.0,
                            experts_per_token=0.0)
ELEMENTS = 4096 * 8 * 2048          # routed elements per sample


def _device(ps: float):
    return dataclasses.replace(load_device("h100-sxm"), routed_element=ps * 1e-12)


def test_forward_third_backward_rest_weight_gradient_none():
    dev = _device(30.0)
    f = cm.token_path_time(MOE, FragmentKind.F, 2.0, dev, 2)
    b = cm.token_path_time(MOE, FragmentKind.B, 2.0, dev, 2)
    assert f == pytest.approx(2 * ELEMENTS * 30e-12 / 3)
    assert b == pytest.approx(2 * f)
    assert cm.token_path_time(MOE, FragmentKind.W, 2.0, dev, 2) == 0.0
    assert cm.token_path_time(DENSE, FragmentKind.F, 2.0, dev, 2) == 0.0
    assert cm.token_path_time(MOE, FragmentKind.F, 2.0, _device(0.0), 2) == 0.0


def test_layer_time_adds_exactly_the_token_path_on_the_devices_share():
    mesh = MeshSpec("m", _device(0.0), 16, {"data": 16}, Link(400e9, 1e-6), devices_per_node=8,
                    scale_out_link=Link(50e9, 5e-6))
    with_term = dataclasses.replace(mesh, device=_device(50.0))
    layout = Layout(8, 2, expert=8)
    for kind in (FragmentKind.F, FragmentKind.B):
        base = cm.layer_time(MOE, kind, 32, mesh, layout, "bf16", seq_len=4096)
        more = cm.layer_time(MOE, kind, 32, with_term, layout, "bf16", seq_len=4096)
        # 32 samples over data 8, then split over tensor 2 as sequence parallelism splits them
        share = 1 / 3 if kind == FragmentKind.F else 2 / 3
        assert more - base == pytest.approx(32 / 8 / 2 * ELEMENTS * 50e-12 * share)


def test_profile_key_is_read_in_picoseconds_and_written_in_place(tmp_path):
    src = DEVICES_DIR / "a100-80gb-sxm.yaml"
    assert load_device(str(src)).routed_element == 0.0
    out = tmp_path / "a100-80gb-sxm.yaml"
    write_entry(src, 12.5, "a test's origin", out=out)
    assert load_device(str(out)).routed_element == pytest.approx(12.5e-12)
    again = tmp_path / "again" / "a100-80gb-sxm.yaml"   # (load_device memoises by path)
    again.parent.mkdir()
    write_entry(out, 7.0, "replaced", out=again)         # replaced, not appended twice
    text = again.read_text()
    assert text.count("routed_element_ps:") == 1 and "replaced" in text
    assert load_device(str(again)).routed_element == pytest.approx(7e-12)
    # every other line of the profile is kept
    assert text.replace("  routed_element_ps:\n    value: 7\n    origin: 'replaced'\n", "") \
        == src.read_text()


def test_bundled_hopper_profiles_carry_the_fitted_term():
    h100 = load_device("h100-sxm")
    assert h100.routed_element > 0
    assert "validate --fit-moe" in h100.sources["routed_element"]
    for twin in ("h200-sxm", "h800-sxm"):
        assert load_device(twin).routed_element == h100.routed_element
