"""simulator.exposure: exposed communication per step = the simulated step minus the simulated step
with every link free. Exact on hand-built plans whose communication is known; >= 0 and 0 on a
cluster that is already free, as properties; carved and data-parallel plans get free links too."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ir import DataParallelPlan, Layout, Plan, StagePlan, Workload
from hardware_profiles.carve import GroupShape, carve
from hardware_profiles.types import Cluster, InterMeshLink, Link, MeshSpec, NodeGroup
from simulator import cost_model as cm
from simulator.exposure import (FREE_BANDWIDTH, Exposure, exposed_communication, exposure,
                                free_cluster, free_plan)
from simulator.plan_sim import plan_cluster, simulate_any
from simulator.schedules import generate
from tests.planner.conftest import device, layer, workload

DEV = replace(device("toy", 100.0, 80.0), fragment_overhead=0.0)


def two_stage(bw: float, latency: float, *, microbatches: int = 1, schedule: str = "1f1b",
              layouts=(Layout(1, 1), Layout(1, 1))) -> tuple[Plan, Cluster]:
    """Layers [0, 2) on mesh a, [2, 4) on mesh b, the link a<->b of ``bw`` B/s and ``latency`` s."""
    meshes = {m: MeshSpec(m, DEV, lay.data * lay.tensor, {"data": lay.data, "tensor": lay.tensor},
                          Link(100e9, 1e-6)) for m, lay in zip("ab", layouts)}
    c = Cluster("toy", meshes, (InterMeshLink("a", "b", Link(bw, latency)),))
    plan = Plan("toy", "toy", (StagePlan(0, 0, 2, "a"), StagePlan(1, 2, 4, "b")),
                dict(zip("ab", layouts)), generate(schedule, 2, microbatches), ("a", "b"), False,
                8, 1024)
    return plan, c


W = workload(2, 8)          # embed, block, block, head; activations 8 MB per sample


def test_a_two_stage_pipeline_exposes_both_boundary_transfers():
    """One microbatch of 8 samples: F0 -> activation (8 x 8 MB = 64 MB) -> F1, B1 -> its gradient
    (64 MB) -> B0, then each mesh's optimizer (equal parameters on both, so mesh a ends last).
    Nothing overlaps the two transfers, each 20 us + 64e6 B / 10e9 B/s = 6.42 ms: 12.84 ms exposed."""
    plan, c = two_stage(10e9, 20e-6)
    ex = exposure(plan, W, c)
    assert ex.exposed_s == pytest.approx(2 * (20e-6 + 64e6 / 10e9), rel=1e-9)
    assert ex.exposed_s == pytest.approx(0.01284, rel=1e-9)
    assert ex.step_time_s == pytest.approx(simulate_any(plan, W, c).step_time_s, rel=1e-15)
    assert ex.fraction == pytest.approx(ex.exposed_s / ex.step_time_s)
    assert exposed_communication(plan, W, c) == pytest.approx(ex.exposed_s, rel=1e-12)


def test_the_step_time_given_skips_the_first_replay():
    plan, c = two_stage(10e9, 20e-6)
    ex = exposure(plan, W, c, step_time_s=5.0)
    free = exposure(plan, W, c).free_step_time_s
    assert ex.step_time_s == 5.0 and ex.exposed_s == pytest.approx(5.0 - free)


def test_the_data_parallel_gradient_syncs_tail_is_exposed():
    """One stage of one layer on 2 devices (data 2), one microbatch: the layer's reduce-scatter
    bucket is released when the backward ends (nothing left to hide it under), the optimizer waits
    for it, and the parameter all-gather follows the optimizer: all of both are exposed."""
    w = Workload("toy", ("block",), {"block": layer("block", 200.0, 100.0)}, seq_len=1024,
                 global_batch=8)
    lay = Layout(2, 1)
    mesh = MeshSpec("m", DEV, 2, {"data": 2}, Link(50e9, 2e-6))
    c = Cluster("toy", {"m": mesh}, ())
    plan = Plan("toy", "toy", (StagePlan(0, 0, 1, "m"),), {"m": lay}, generate("1f1b", 1, 1), ("m",),
                False, 8, 1024)
    rs = cm.layer_grad_sync(w.layer(0), mesh, lay)[2]
    ag = cm.param_gather_time(w, 0, 1, mesh, lay)
    assert rs > 0 and ag > 0
    assert exposed_communication(plan, w, c) == pytest.approx(rs + ag, rel=1e-9)


def test_a_free_cluster_is_free_everywhere():
    g = NodeGroup("g", DEV, 4, 8, Link(300e9, 3e-6), Link(25e9, 5e-6))
    c = Cluster("toy", {"x": MeshSpec("x", DEV, 8, {"data": 8}, Link(1e9, 1e-6), devices_per_node=4,
                                      scale_out_link=Link(1e9, 1e-5)),
                        "y": MeshSpec("y", DEV, 8, {"data": 8}, Link(1e9, 1e-6))},
                (InterMeshLink("x", "y", Link(1e9, 1e-5)),), default_link=Link(1e9, 1e-5),
                groups={"g": g}, group_links=(InterMeshLink("g", "g", Link(1e9, 1e-5)),))
    f = free_cluster(c)
    links = ([m.intra_link for m in f.meshes.values()] + [f.meshes["x"].scale_out_link, f.default_link]
             + [ln.link for ln in f.links + f.group_links]
             + [x for gr in f.groups.values() for x in (gr.intra_link, gr.scale_out_link)])
    assert all(ln.bandwidth == FREE_BANDWIDTH and ln.latency == 0.0 for ln in links)
    assert f.meshes["y"].scale_out_link is None and f.meshes["x"].devices_per_node == 4
    assert f.meshes["x"].device is DEV and f.groups["g"].nodes == 4
    assert free_cluster(f) == f


# --------------------------------------------------------------------------- carved and DP plans
def physical() -> Cluster:
    groups = {"g": NodeGroup("g", DEV, 2, 4, Link(100e9, 1e-6, "nvlink"), Link(25e9, 5e-6, "nic"))}
    return carve(Cluster("toy", {}, (), None, groups=groups), (GroupShape("g", 2),))


def carved_plan(microbatches: int = 4, share: int = 32) -> Plan:
    return Plan("toy", "toy", (StagePlan(0, 0, 7, "g.0"), StagePlan(1, 7, 14, "g.1")),
                {"g.0": Layout(4, 1), "g.1": Layout(4, 1)}, generate("1f1b", 2, microbatches),
                ("g.0", "g.1"), False, share, 1024,
                carving=({"group": "g", "nodes": 2, "nodes_per_mesh": 1, "meshes_per_node": 1},))


def test_a_carved_plan_runs_on_free_carved_links():
    plan, w, phys = carved_plan(), workload(12, 32), physical()
    free = plan_cluster(plan, free_cluster(phys))
    assert all(ln.link.bandwidth >= FREE_BANDWIDTH and ln.link.latency == 0.0 for ln in free.links)
    ex = exposure(plan, w, phys)
    assert ex.exposed_s > 0
    # the cluster as loaded or the one the plan runs on: the same figure
    assert exposure(plan, w, plan_cluster(plan, phys)).exposed_s == pytest.approx(ex.exposed_s, rel=1e-12)
    assert exposure(plan, w, free_cluster(phys)).exposed_s == pytest.approx(0.0, abs=1e-12)


def test_a_data_parallel_plans_cross_part_sync_is_free_in_the_free_replay():
    """Two single-group parts; the cross-part all-reduce (0.05 s, on the critical path between
    every mesh's gradient sync and its optimizer) is exposed in full, and more."""
    groups = {"p": NodeGroup("p", DEV, 2, 4, Link(100e9, 1e-6), Link(25e9, 5e-6)),
              "q": NodeGroup("q", DEV, 1, 4, Link(100e9, 1e-6), Link(25e9, 5e-6))}
    phys = carve(Cluster("toy", {}, (), None, groups=groups), (GroupShape("p", 2), GroupShape("q", 1)))
    part_p = carved_plan(4, 32)
    part_q = Plan("toy", "toy", (StagePlan(0, 0, 14, "q.0"),), {"q.0": Layout(4, 1)},
                  generate("1f1b", 1, 2), ("q.0",), False, 16, 1024,
                  carving=({"group": "q", "nodes": 1, "nodes_per_mesh": 1, "meshes_per_node": 1},))
    part_p = replace(part_p, carving=({"group": "p", "nodes": 2, "nodes_per_mesh": 1,
                                       "meshes_per_node": 1},),
                     stages=tuple(replace(s, mesh=s.mesh.replace("g", "p")) for s in part_p.stages),
                     layouts={"p.0": Layout(4, 1), "p.1": Layout(4, 1)}, rank_mesh=("p.0", "p.1"))
    dp = DataParallelPlan("toy", "toy", 48, 1024, (part_p, part_q), "p.0<->q.0", 1e9, 0.05)
    assert free_plan(dp).sync_s == 0.0 and free_plan(part_p) is part_p
    ex = exposure(dp, workload(12, 48), phys)
    assert ex.exposed_s >= 0.05 - 1e-12
    assert ex.exposed_s < ex.step_time_s


# --------------------------------------------------------------------------- properties
@settings(max_examples=25)
@given(bw=st.floats(1e8, 1e12), latency=st.floats(0.0, 1e-3), mb=st.sampled_from([1, 2, 4, 8]),
       schedule=st.sampled_from(["1f1b", "gpipe"]),
       lays=st.tuples(*[st.sampled_from([Layout(1, 1), Layout(2, 1), Layout(1, 2), Layout(2, 2)])] * 2))
def test_exposure_is_never_negative_and_zero_on_a_free_cluster(bw, latency, mb, schedule, lays):
    plan, c = two_stage(bw, latency, microbatches=mb, schedule=schedule, layouts=lays)
    ex = exposure(plan, W, c)
    assert isinstance(ex, Exposure) and ex.exposed_s >= 0.0
    assert exposure(plan, W, free_cluster(c)).exposed_s == pytest.approx(0.0, abs=1e-12)
