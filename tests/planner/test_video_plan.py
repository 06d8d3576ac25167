"""planner.video: the latency plan is the optimum of its space (checked by brute force), its bound
holds, memory decides placements, and bad input is one line."""

from __future__ import annotations

import itertools

import pytest

from hardware_profiles import load_cluster
from ir import LayerCost, Workload
from ir.shards import ShardDims
from planner.errors import InfeasibleError, PlannerError
from planner.video import VideoComponent, _memory, _moves, component_options, plan_video
from simulator.cost_model import usable_bytes
from simulator.spatial import SpatialLayer

QB = load_cluster("hardware_profiles/clusters/quietbox_p150x4.yaml")
UNEVEN = load_cluster("hardware_profiles/clusters/cpu_uneven.yaml")


def _layer(name: str, flops: float, params: int, act: float, tp: float = 0.0) -> LayerCost:
    return LayerCost(name, flops, 0.0, 0.0, 2.0 * params, act * 4, 0.0, 0.0, params, 2.0 * params,
                     act, act, tp)


def _transformer(name: str, layers: int, flops: float, params: int, heads: int = 8) -> Workload:
    block = _layer("block", flops, params, 4e7, tp=8e7)
    return Workload(name, ("block",) * layers, {"block": block}, seq_len=4096, global_batch=1,
                    training=False, shards=ShardDims(heads, heads, (4096,), 0, name))


def _components(dit_params: int = 500_000_000) -> tuple[VideoComponent, ...]:
    enc = VideoComponent("encoder", _transformer("enc", 4, 2e11, 400_000_000), 1, 2,
                         out_bytes=4e6)
    dit = VideoComponent("dit", _transformer("dit", 8, 4e12, dit_params), 16, 2,
                         out_bytes=4e6, guidance_bytes=4e6)
    conv = _layer("res", 5e12, 20_000_000, 3e9)
    w = Workload("dec", ("res",) * 3, {"res": conv}, seq_len=1, global_batch=1, training=False)
    layers = tuple(SpatialLayer(conv, 60, 3e9 / 60, convs=2, halo_rows=1, norms=2,
                                stat_bytes=512.0) for _ in range(3))
    dec = VideoComponent("decoder", w, 1, 1, spatial=layers, frames=4)
    return enc, dit, dec


def _brute_force(comps, cluster):
    caps = {(m.name, d): usable_bytes(m, 0.1)
            for m in cluster.meshes.values() for d in range(m.num_devices)}
    best = None
    for chosen in itertools.product(*(component_options(c, cluster) for c in comps)):
        if any(v > caps[k] for k, v in _memory(chosen).items()):
            continue
        t = sum(o.total_s for o in chosen) + _moves(chosen, comps, cluster)
        best = t if best is None else min(best, t)
    return best


@pytest.mark.parametrize("cluster", [QB, UNEVEN], ids=["quietbox", "cpu-uneven"])
def test_plan_is_the_optimum_of_its_space(cluster):
    comps = _components()
    plan = plan_video(comps, cluster)
    assert plan.seconds_per_video == pytest.approx(_brute_force(comps, cluster), rel=1e-12)
    assert plan.seconds_per_video == pytest.approx(
        sum(o.total_s for o in plan.components) + plan.moves_s)
    assert [o.component for o in plan.components] == ["encoder", "dit", "decoder"]
    assert plan.bound_s <= plan.seconds_per_video


def test_runs_and_samples_scale_the_component():
    enc, dit, dec = _components()
    plan = plan_video((enc, dit, dec), QB)
    d = plan.components[1]
    assert d.total_s == pytest.approx(16 * d.run_s)


def test_decoder_spatial_degree_fixed():
    plan = plan_video(_components(), QB, spatial_degree=2)
    dec = plan.components[2]
    assert dec.spatial == dec.devices == 2 and dec.describe().startswith("spatial 2 (height)")


def test_decoder_spatial_degree_that_cannot_split_is_infeasible():
    with pytest.raises(InfeasibleError, match="at spatial degree 7.*--decoder-spatial"):
        plan_video(_components(), QB, spatial_degree=7)


def test_weights_too_large_for_any_group_is_one_line():
    with pytest.raises(InfeasibleError, match="component 'dit' .* fits no group of quietbox_p150x4"):
        plan_video(_components(dit_params=80_000_000_000), QB)


def test_memory_forces_tensor_parallel():
    # 14e9 parameters = 28 GB of weights: one 32 GB chip holds it only without the others
    comps = _components(dit_params=14_000_000_000 // 8)
    plan = plan_video(comps, QB)
    assert plan.components[1].layout.tensor > 1
    fullest, cap = plan.memory_bytes
    assert fullest <= cap


def test_empty_pipeline_and_bad_degree_refused():
    with pytest.raises(PlannerError, match="no components"):
        plan_video((), QB)
    with pytest.raises(PlannerError, match="spatial degree -1"):
        plan_video(_components(), QB, spatial_degree=-1)
