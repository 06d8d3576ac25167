"""A batch too small for the whole cluster is planned on part of its nodes (planner.objective)."""

import pytest

from hardware_profiles import load_cluster
from planner import PlanOptions, plan
from planner.errors import InfeasibleError
from planner.objective import halved
from zoo.costing import workload
from zoo.model_files import resolve_model

CLUSTER = "hardware_profiles/clusters/h100x64_nodes.yaml"


def test_halved_halves_every_group_down_to_one_node():
    c = load_cluster(CLUSTER)
    assert c.groups["h100"].nodes == 8
    sizes = []
    while c is not None:
        sizes.append(c.groups["h100"].nodes)
        c = halved(c)
    assert sizes == [8, 4, 2, 1]


def test_small_batch_plans_on_fewer_nodes(monkeypatch):
    w = workload(resolve_model("tiny-moe"), global_batch=2, seq_len=256)
    c = load_cluster(CLUSTER)
    r = plan(w, c, PlanOptions(time_limit_s=1))
    used = sum(s["nodes"] for s in r.plan.carving)
    assert 1 <= used < c.groups["h100"].nodes
    assert r.plan.search.reason.startswith(f"at most {used * 8} of 64 devices: no plan occupies every "
                                           f"node at global batch 2")
    assert r.prediction.step_time_s > 0
    # without the fallback the whole cluster has no plan: the fallback is what found it
    import planner.objective as obj

    def whole_only(w, cluster, opts, stop, whole):
        raise whole
    monkeypatch.setattr(obj, "_on_fewer_nodes", whole_only)
    with pytest.raises(InfeasibleError):
        plan(w, c, PlanOptions(time_limit_s=1))


def test_batch_too_small_for_one_listed_mesh_is_named():
    """A listed mesh cannot be shrunk: the refusal names the batch, not the model's memory."""
    w = workload(resolve_model("llama-tiny"), global_batch=2, seq_len=256)
    with pytest.raises(InfeasibleError, match=r"global batch 2 cannot occupy cluster 'tpuv5e256'.s "
                                              r"meshes of up to 256 devices.*raise --global-batch"):
        plan(w, load_cluster("hardware_profiles/clusters/tpuv5e256.yaml"), PlanOptions(time_limit_s=1))
