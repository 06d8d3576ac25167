"""planner.baseline.hand_plan: a practitioner's published layout (tensor, pipeline, data, virtual
stages, micro-batch, recomputation) built on a carved node group through the hand baseline's own
code path, and Megatron-LM's GPT-3 175B layout on 1,024 A100 (TP8 x PP8 x DP16, interleaved)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from ir import Layout
from hardware_profiles import load_cluster
from hardware_profiles.types import Cluster, Link, NodeGroup
from planner.baseline import MEGATRON_GPT3_175B, HandLayout, hand_plan, megatron_plans
from planner.errors import PlannerError
from simulator.plan_sim import plan_cluster, simulate_any
from tests.planner.conftest import device, workload

ROOT = Path(__file__).resolve().parents[2]


def nodes(n: int = 4, per_node: int = 8, mem_gb: float = 80.0) -> Cluster:
    g = NodeGroup("g", device("fast", 400.0, mem_gb), n, per_node, Link(100e9, 1e-6), Link(25e9, 5e-6))
    return Cluster("toy", {}, (), None, groups={"g": g})


W = workload(12, 32)


@pytest.mark.parametrize("mem_gb", [80.0, 1.0])
def test_a_hand_layout_is_the_hand_baselines_plan(mem_gb):
    """megatron_plans' own configurations (one pipeline stage at 80 GB; four, one recomputing, at
    1 GB) come out the same through hand_plan."""
    c = nodes(mem_gb=mem_gb)
    hands = megatron_plans(W, c, "g")
    assert len(hands) == 2
    for h in hands:
        tp, pp, dp, mb, sched = h.label.split()[:5]
        lay = HandLayout(int(tp[2:]), int(pp[2:]), int(dp[2:]),
                         virtual_stages=2 if sched == "interleaved-1f1b" else 1, micro_batch=int(mb[2:]),
                         recompute="full" if h.label.endswith("recompute") else "none")
        mine = hand_plan(W, c, lay)
        assert mine.plan.carving == h.plan.carving and mine.plan.stages == h.plan.stages
        assert mine.prediction.step_time_s == pytest.approx(h.prediction.step_time_s, rel=1e-12)


def test_the_shape_follows_the_layout():
    c = nodes()
    # two stages per node (tp2 x dp2 = 4 devices), pipeline 4 over 2 nodes
    h = hand_plan(W, c, HandLayout(2, 4, 2, virtual_stages=1, micro_batch=2))
    assert h.plan.carving == ({"group": "g", "nodes": 2, "nodes_per_mesh": 1, "meshes_per_node": 2},)
    assert set(h.plan.layouts.values()) == {Layout(2, 2)} and h.plan.microbatches == 8
    # a stage of two whole nodes (tp8 x dp2), pipeline 2: four nodes
    h = hand_plan(W, c, HandLayout(8, 2, 2, virtual_stages=2, recompute="full"))
    assert h.plan.carving == ({"group": "g", "nodes": 4, "nodes_per_mesh": 2, "meshes_per_node": 1},)
    assert h.plan.schedule.name == "interleaved-1f1b" and len(h.plan.stages) == 4
    assert all(h.plan.recompute.get(m) for m in h.plan.rank_mesh)
    assert h.label == "tp8 pp2 dp2 mb1 interleaved-1f1b v2 full recompute"


@pytest.mark.parametrize("layout, match", [
    (HandLayout(8, 2, 1, recompute="selective"), "selective"),
    (HandLayout(8, 2, 1, recompute="some"), "recompute='some'"),
    (HandLayout(8, 2, 1, distributed_optimizer=False), "distributed_optimizer=False"),
    (HandLayout(8, 8, 1), "needs 64 devices"),
    (HandLayout(16, 1, 1), "tensor parallel inside a node"),
    (HandLayout(8, 2, 1, micro_batch=3), "global batch 32"),
    (HandLayout(8, 3, 1, virtual_stages=2), "schedule interleaved-1f1b does not accept 3 ranks"),
    (HandLayout(8, 0, 1), "degree below 1"),
])
def test_bad_layouts_are_refused_in_one_line(layout, match):
    with pytest.raises(PlannerError, match=match) as e:
        hand_plan(W, nodes(), layout)
    assert "\n" not in str(e.value) and "fix" in str(e.value)


def test_a_cluster_without_node_groups_or_with_an_unknown_group_is_refused():
    with pytest.raises(PlannerError, match="lists meshes, not node groups"):
        hand_plan(W, Cluster("listing", {}, ()), HandLayout(8, 1, 1))
    with pytest.raises(PlannerError, match="no node group 'x'"):
        hand_plan(W, nodes(), HandLayout(8, 1, 1), group="x")


def test_megatron_gpt3_175b_on_1024_a100_is_tp8_pp8_dp16_interleaved():
    from zoo.costing import workload as traced

    lay = MEGATRON_GPT3_175B
    assert (lay.tensor, lay.pipeline, lay.data, lay.virtual_stages, lay.micro_batch) == (8, 8, 16, 2, 1)
    assert lay.devices == 1024 and lay.schedule == "interleaved-1f1b" and lay.recompute == "full"
    w = traced("gpt3-175b", 1536, 2048)
    c = load_cluster(ROOT / "hardware_profiles" / "clusters" / "a100x1024_nodes.yaml")
    h = hand_plan(w, c, lay)
    p = h.plan
    assert p.carving == ({"group": "a100", "nodes": 128, "nodes_per_mesh": 16, "meshes_per_node": 1},)
    assert len(p.rank_mesh) == 8 and len(p.stages) == 16 and p.microbatches == 96
    assert set(p.layouts.values()) == {Layout(16, 8)}
    assert [s.last - s.first for s in p.stages][1:-1] == [6] * 14      # 96 blocks, 6 per chunk
    assert h.prediction.fits
    sim = simulate_any(p, w, plan_cluster(p, c))
    assert sim.step_time_s == pytest.approx(h.prediction.step_time_s, rel=0.01)
    assert replace(lay, virtual_stages=1).schedule == "1f1b"


def test_sailors_plan_is_replayed_as_described():
    """Sailor's 7-stage plan on its 320-GPU case: V100 tp4 stages at both ends of A100 tp1 stages,
    data parallel 20 on every stage, every block placed, the fastest order and split kept."""
    from zoo.costing import workload as traced
    from planner.baseline import SAILOR_OPT_350M, hand_pipeline

    c = load_cluster(ROOT / "hardware_profiles/clusters/a100x80_v100x240_nodes.yaml")
    w = traced("opt-350m", 1024, 2048)
    h = hand_pipeline(w, c, SAILOR_OPT_350M)
    meshes = [s.mesh for s in h.plan.stages]
    assert len(meshes) == 7 and meshes[0].startswith("v100") and meshes[-1].startswith("v100")
    assert sorted(meshes) == sorted(f"{g}.{j}" for g, n in (("a100", 4), ("v100", 3)) for j in range(n))
    assert all(h.plan.layouts[m] == (Layout(20, 4) if m.startswith("v100") else Layout(20, 1)) for m in meshes)
    assert h.plan.stages[0].first == 0 and h.plan.stages[-1].last == len(w.layers)
    assert all(a.last == b.first for a, b in zip(h.plan.stages, h.plan.stages[1:]))
    assert h.plan.schedule.name == "1f1b" and h.prediction.fits
    assert h.plan.microbatches in SAILOR_OPT_350M.microbatches


def test_a_hand_pipeline_naming_a_mesh_twice_is_one_line():
    from planner.baseline import SAILOR_OPT_350M, HandPipeline, hand_pipeline
    from zoo.costing import workload as traced

    c = load_cluster(ROOT / "hardware_profiles/clusters/a100x80_v100x240_nodes.yaml")
    bad = replace(SAILOR_OPT_350M, orders=(("v100.0", "v100.0", "a100.0"),))
    with pytest.raises(PlannerError, match="must name each of"):
        hand_pipeline(traced("opt-350m", 1024, 2048), c, bad)
    assert isinstance(bad, HandPipeline)
