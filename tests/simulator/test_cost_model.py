"""Tests of simulator.cost_model.layer_time: the roofline (max) and the additive (sum) combination."""

from __future__ import annotations

import dataclasses

import pytest

from compiler.ir import LayerCost, Layout
from hardware_profiles import load_device
from hardware_profiles.types import Link, MeshSpec
from simulator.cost_model import layer_time

COST = LayerCost(name="block", fwd_flops_per_sample=4e12, bwd_flops_per_sample=8e12,
                 bwd_input_flops_per_sample=4e12, fwd_bytes_fixed=2e9, fwd_bytes_per_sample=1e9,
                 bwd_bytes_fixed=4e9, bwd_bytes_per_sample=2e9, param_count=1000,
                 param_bytes=2000.0, activation_bytes_per_sample=1e6,
                 residual_bytes_per_sample=1e7, tp_allreduce_bytes_per_sample=0.0)


def _mesh(roofline: str) -> MeshSpec:
    dev = dataclasses.replace(load_device("h100-sxm"), roofline=roofline, backward_efficiency=1.0,
                              elementwise_traffic=0.0)
    return MeshSpec("m", dev, 2, {"data": 2}, Link(1e11, 1e-6))


@pytest.mark.parametrize("kind,flops,nbytes", [("F", 4e12, 2e9 + 1e9), ("B", 8e12, 4e9 + 2e9)])
def test_max_and_sum_rooflines(kind, flops, nbytes):
    lay = Layout(data=2, tensor=1)
    m, s = _mesh("max"), _mesh("sum")
    rate, bw = m.device.achievable_flops("bf16"), m.device.achievable_bandwidth
    compute, memory = flops / rate, nbytes / bw       # 2 samples over data 2: one per device
    assert layer_time(COST, kind, 2, m, lay) == pytest.approx(max(compute, memory), rel=1e-12)
    assert layer_time(COST, kind, 2, s, lay) == pytest.approx(compute + memory, rel=1e-12)


OTHER = dataclasses.replace(COST, fwd_other_bytes_per_sample=3e9, bwd_other_bytes_per_sample=5e9,
                            bwd_input_other_bytes_per_sample=4e9)


@pytest.mark.parametrize("kind,split,other", [("F", False, 3e9), ("B", False, 5e9),
                                               ("B", True, 4e9), ("W", True, 1e9)])
def test_elementwise_traffic_adds_after_the_roofline(kind, split, other):
    lay = Layout(data=2, tensor=1)
    m = _mesh("max")
    half = dataclasses.replace(m, device=dataclasses.replace(m.device, elementwise_traffic=0.5))
    base = layer_time(OTHER, kind, 2, m, lay, split_backward=split)
    assert base == layer_time(COST, kind, 2, m, lay, split_backward=split)   # fraction 0: no change
    extra = 0.5 * other / m.device.achievable_bandwidth                       # one sample per device
    assert layer_time(OTHER, kind, 2, half, lay, split_backward=split) == pytest.approx(
        base + extra, rel=1e-12)
