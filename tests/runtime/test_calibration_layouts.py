"""Tests of runtime.calibration.layouts: the costs and collectives of fragments timed under the
data-parallel, tensor-parallel and FSDP layouts, as the simulator charges them."""

from __future__ import annotations

import pytest

from runtime.calibration.fit import FragmentTiming, fit_additive
from runtime.calibration.layouts import collective_terms, layout_costs, layout_of
from ir import Layout
from zoo.costing import workload


def _frag(layout: str, kind: str = "F", layer: str = "block", samples: int = 4) -> FragmentTiming:
    return FragmentTiming(layer, kind, samples, 0.0, 0.0, 1.0, layout)


def test_layout_names():
    assert layout_of("dp", 2) == Layout(2, 1)
    assert layout_of("tp", 4) == Layout(1, 4)
    assert layout_of("fsdp", 2) == Layout(2, 1, fsdp=True)
    with pytest.raises(ValueError, match="unknown layout 'zero'; use one of dp, tp, fsdp"):
        layout_of("zero", 2)


def test_layout_costs_split_work_like_the_simulator():
    c = workload("llama-tiny", 4).costs["decoder_block"]
    dp, tp, fs = layout_costs([_frag("dp"), _frag("tp"), _frag("fsdp")], 2)
    assert dp.flops == pytest.approx(c.fwd_flops_per_sample * 4 / 2, rel=1e-12)
    assert tp.flops == pytest.approx(c.fwd_flops_per_sample * 4 / 2, rel=1e-12)
    assert dp.bytes == pytest.approx(c.fwd_bytes_fixed + c.fwd_bytes_per_sample * 2, rel=1e-12)
    assert tp.bytes == pytest.approx((c.fwd_bytes_fixed + c.fwd_bytes_per_sample * 4) / 2, rel=1e-12)
    assert fs.flops == dp.flops and fs.bytes == dp.bytes


def test_collective_terms_are_the_ring_formulas():
    c = workload("llama-tiny", 4).costs["decoder_block"]
    lat = 1e-4
    # data parallel: no collective in the forward; the backward all-reduces fp32 gradients:
    # 2 (n-1) latency + 2 (n-1)/n bytes / B, n = 2
    assert collective_terms(_frag("dp"), 2, lat) == (0.0, 0.0)
    fixed, per = collective_terms(_frag("dp", "B"), 2, lat)
    assert fixed == pytest.approx(2 * lat) and per == pytest.approx(c.param_count * 4.0)
    # tensor parallel: the activations all-reduced, forward and backward
    fixed, per = collective_terms(_frag("tp"), 2, lat)
    assert fixed == pytest.approx(2 * lat)
    assert per == pytest.approx(c.tp_allreduce_bytes_per_sample * 4)
    # FSDP: all-gather of the parameters ((n-1) latency + (n-1)/n bytes / B) in the forward,
    # plus the reduce-scatter of the fp32 gradients in the backward
    fixed, per = collective_terms(_frag("fsdp"), 2, lat)
    assert fixed == pytest.approx(lat) and per == pytest.approx(c.param_bytes / 2)
    fixed, per = collective_terms(_frag("fsdp", "B"), 2, lat)
    assert fixed == pytest.approx(2 * lat)
    assert per == pytest.approx(c.param_bytes / 2 + c.param_count * 4.0 / 2)
    assert collective_terms(_frag("tp"), 1, lat) == (0.0, 0.0)


def test_additive_fit_recovers_rates_and_link_from_all_layouts():
    """Fragments timed exactly as the additive model says, under all three layouts: one solve
    recovers the forward and backward rates and the one intra-mesh link bandwidth."""
    F, Fb, B, bw, lat, ovh = 2e10, 1.6e10, 4e8, 5e9, 1e-4, 2e-4
    frags = []
    for lay in ("dp", "tp", "fsdp"):
        for kind in ("F", "B"):
            for layer in ("embed", "block", "head"):
                for s in (2, 8):
                    f = layout_costs([_frag(lay, kind, layer, s)], 2)[0]
                    fixed, per = collective_terms(f, 2, lat)
                    t = ovh + f.flops / (F if kind == "F" else Fb) + f.bytes / bw + fixed + per / B
                    frags.append(FragmentTiming(layer, kind, s, f.flops, f.bytes, t, lay))
    f_s, fb_s, b_s, err = fit_additive(frags, ovh, bw, 2, lat)
    assert f_s == pytest.approx(F, rel=1e-6) and fb_s == pytest.approx(Fb, rel=1e-6)
    assert b_s == pytest.approx(B, rel=1e-6) and err < 1e-9
