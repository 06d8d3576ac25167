"""`mpmd run` executes a plan carved from node groups: two stage meshes, each spanning two
"nodes" of the 8 CPU devices (two pipeline replicas as the meshes' data axis)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from zoo.costing import workload
from runtime.train.run import run_plan
from hardware_profiles import GroupShape, carve, load_cluster
from planner import PlanOptions
from planner import api

CLUSTER = Path(__file__).resolve().parents[2] / "hardware_profiles" / "clusters" / "cpu4x2_nodes.yaml"


def test_carved_plan_with_replicas_runs_and_matches_jax_jit():
    w = workload("llama-tiny", 8)
    physical = load_cluster(CLUSTER)
    shape = GroupShape("cpu", 4, nodes_per_mesh=2)
    logical = carve(physical, [shape])
    r = api.plan_meshes(w, logical, PlanOptions(schedules=("1f1b",), microbatches=(2,), max_tensor=1, fsdp=False,
                                         fixed_order=True, time_limit_s=30))
    plan = replace(r.plan, carving=(shape.to_json(),))
    assert plan.rank_mesh == ("cpu.0", "cpu.1")
    assert plan.replicas == {"cpu.0": 2, "cpu.1": 2}
    assert all(plan.devices[m][1] == 4 for m in plan.rank_mesh)
    report = run_plan(plan, steps=2, cluster_path=CLUSTER, simulate=False, quiet=True)
    assert report.max_rel_error < 1e-5
    assert report.order_mismatches == ()
    assert set(report.executables) == {"cpu.0", "cpu.1"}
    assert all(c.ok for c in report.executables.values()), report.executables
