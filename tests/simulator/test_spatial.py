"""simulator.spatial: a height-sharded convolutional layer's per-device work, halos and GroupNorm
all-reduces against the cost model's own primitives."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from hardware_profiles import load_cluster
from ir import LayerCost, Layout
from ir.schedule import FragmentKind
from simulator.cost_model import collective, layer_time, transfer_time
from simulator.spatial import (SpatialError, SpatialLayer, check_degree, spatial_layer_time,
                               spatial_memory, spatial_time, sub_mesh)

MESH = next(iter(load_cluster("hardware_profiles/clusters/quietbox_p150x4.yaml").meshes.values()))


def _cost(flops: float = 1e13, act: float = 2e9) -> LayerCost:
    return LayerCost("res_block", flops, 0.0, 0.0, 6e7, 1e9, 0.0, 0.0, 30_000_000, 6e7, act, 0.0, 0.0)


CONV = SpatialLayer(_cost(), rows=120, row_bytes=2e9 / 120, convs=2, halo_rows=1, norms=2,
                    stat_bytes=32 * 28 * 4.0)


def test_degree_one_is_the_cost_model_forward():
    t = spatial_layer_time(CONV, 1.0, MESH, 1)
    assert t.halo == 0.0 and t.norm == 0.0
    assert t.work == layer_time(CONV.cost, FragmentKind.F, 1.0, MESH, Layout(1, 1), "bf16")


def test_four_way_split_work_halos_and_norms():
    sub = sub_mesh(MESH, 4)
    t = spatial_layer_time(CONV, 1.0, sub, 4)
    assert t.work == layer_time(CONV.cost, FragmentKind.F, 0.25, sub, Layout(1, 1), "bf16")
    # two convolutions, each one row of 2e9 / 120 bytes to / from each neighbour at once
    assert t.halo == pytest.approx(2 * transfer_time(2e9 / 120, sub.collective_link(4)))
    # two GroupNorms, mean and variance each all-reduced over the 4 devices
    assert t.norm == pytest.approx(4 * collective(sub, "all_reduce", 32 * 28 * 4.0, 4))
    assert t.total == pytest.approx(t.work + t.halo + t.norm)


def test_split_is_faster_than_one_device_for_a_big_layer():
    one = spatial_time((CONV,), 1.0, MESH, 1).total
    four = spatial_time((CONV,), 1.0, sub_mesh(MESH, 4), 4).total
    assert four < one / 3


@pytest.mark.parametrize("degree", [7, 0, 240])
def test_degree_that_does_not_split_the_rows_is_refused(degree):
    with pytest.raises(SpatialError, match=f"spatial degree {degree}"):
        check_degree((CONV,), degree)


def test_sub_mesh_refuses_more_devices_than_the_mesh():
    with pytest.raises(SpatialError, match="5 devices does not fit mesh 'bh_0' of 4"):
        sub_mesh(MESH, 5)


@given(st.sampled_from([1, 2, 3, 4, 5, 6, 8, 10, 12]))
def test_memory_weights_whole_activations_split(degree):
    w1, a1 = spatial_memory((CONV,), 1.0, 1)
    w, a = spatial_memory((CONV,), 1.0, degree)
    assert w == w1 == CONV.cost.param_bytes
    halo = 2 * (degree > 1)
    assert a == pytest.approx(a1 * (120 // degree + halo) / 120)
