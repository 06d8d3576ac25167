"""A mesh's layout options are the layouts that can run the model (ir.shards.layout_problem):
a tensor degree that does not divide the heads or an MLP width is never offered, so no plan
the search returns holds one; the same rule bounds the practitioners' grid and serving."""

from __future__ import annotations

import dataclasses

from ir import ShardDims, layout_problem
from planner import api
from planner.construct import PlanOptions
from planner.options import _layouts
from tests.planner.conftest import cluster, device, workload

OPT = ShardDims(heads=16, kv_heads=16, widths=(4096,), model="opt-350m")


def test_a_tensor_degree_that_cannot_split_the_heads_is_never_offered():
    c = cluster([("m", device("d", 100.0, 80.0), 12)])
    mesh = c.meshes["m"]
    tensors = {lay.tensor for lay in _layouts(mesh, 24.0, 64, False)}
    assert tensors == {1, 2, 3, 4, 6, 12}                     # no model dimensions: any divisor
    tensors = {lay.tensor for lay in _layouts(mesh, 24.0, 64, False, shards=OPT)}
    assert tensors == {1, 2, 4}


def test_no_plan_holds_a_layout_that_cannot_run():
    # 3 GB devices: the stage needs tensor parallel 3 or more; without the model's dimensions
    # the search takes 3 (the least traffic), with OPT-350M's 16 heads it must take 4
    w = workload(blocks=6, batch=24)
    c = cluster([("a", device("a", 400.0, 3.0), 12)])
    opts = PlanOptions(time_limit_s=5, fsdp=False)
    assert api.plan_meshes(w, c, opts).plan.layouts["a"].tensor == 3
    plan = api.plan_meshes(dataclasses.replace(w, shards=OPT), c, opts).plan
    assert plan.layouts["a"].tensor == 4
    for lay in plan.layouts.values():
        assert layout_problem(OPT, lay.tensor, lay.expert) is None


def test_the_option_cache_tells_precisions_apart():
    """``--precision auto`` searches one workload in several recipes in one process: the same
    layers and costs (``dataclasses.replace``), other rates, so other options."""
    from planner.options import _cached_mesh_options

    fp8 = dataclasses.replace(device("d", 100.0, 80.0),
                              peak_flops={"bf16": 100e12, "fp8": 200e12},
                              format_efficiency={"fp8": 1.0})
    mesh = cluster([("m", fp8, 4)]).meshes["m"]
    w = workload(blocks=4, batch=8)
    w = dataclasses.replace(w, costs={**w.costs, "block": dataclasses.replace(
        w.costs["block"], low_precision=True)})
    args = (mesh, 2.0, ("F", "B"), False, 0.1, 4, False)
    bf16, _ = _cached_mesh_options(w, *args)
    low, costed = _cached_mesh_options(dataclasses.replace(w, precision="fp8"), *args)
    assert costed > 0                                  # not served from the BF16 entry
    assert min(o.block_s for o in low) < min(o.block_s for o in bf16)


def test_tensor_parallel_is_offered_overlapped_where_the_stack_overlaps_it():
    """On an NVIDIA GPU every tensor degree > 1 runs its collectives beside the GEMMs
    (Transformer Engine's userbuffers, as NVIDIA's dense recipes run); a TPU's or a toy
    device's collectives stay on the critical path, as their validation rows fit."""
    from hardware_profiles.cluster_loader import load_cluster

    gpu = next(iter(load_cluster("hardware_profiles/clusters/h100x64_nodes.yaml").meshes.values()))
    lays = _layouts(gpu, 64.0, 8, False)
    assert {lay.tensor for lay in lays} == {1, 2, 4, 8}
    assert all(lay.tp_overlap == (lay.tensor > 1) for lay in lays)
    tpu = next(iter(load_cluster("hardware_profiles/clusters/tpuv5e256.yaml").meshes.values()))
    assert not any(lay.tp_overlap for lay in _layouts(tpu, 256.0, 8, False))
    toy = cluster([("m", device("d", 100.0, 80.0), 8)]).meshes["m"]
    assert not any(lay.tp_overlap for lay in _layouts(toy, 8.0, 8, False))


def test_low_precision_optimizer_state_lets_the_search_take_less_tensor_parallel():
    """``PlanOptions.optimizer_state`` (``mpmd plan --optimizer-state``): every layout the search
    costs keeps that state, so on 2 GB devices, where fp32 Adam state (12 bytes a parameter over
    data parallel) needs tensor parallel 6, bf16 moments (8 bytes) fit at tensor 4 and the step is
    shorter; an unknown state is refused."""
    import pytest

    from planner.errors import PlannerError

    w = workload(blocks=6, batch=24)
    c = cluster([("a", device("a", 400.0, 2.0), 12)])
    fp32 = api.plan_meshes(w, c, PlanOptions(time_limit_s=5, fsdp=False))
    low = api.plan_meshes(w, c, PlanOptions(time_limit_s=5, fsdp=False,
                                            optimizer_state="bf16-moments"))
    assert str(fp32.plan.layouts["a"]) == "dp2xtp6"
    assert str(low.plan.layouts["a"]) == "dp3xtp4-optbf16-moments"
    assert low.prediction.step_time_s < fp32.prediction.step_time_s
    mesh = c.meshes["a"]
    assert {lay.optimizer_state for lay in _layouts(mesh, 24.0, 12, True,
                                                   optimizer_state="bf16")} == {"bf16"}
    with pytest.raises(PlannerError, match=r"optimizer_state='fp16'\): unknown; fix: one of "
                                           r"fp32, bf16-moments, bf16"):
        PlanOptions(optimizer_state="fp16")


def test_the_search_costs_the_loss_the_workload_names():
    """``Workload.cross_entropy`` (``mpmd plan --cross-entropy``): the head's logits are kept and
    held as that loss does, so PyTorch's eager loss (4 bytes kept and 8 beside, a logit) needs
    smaller microbatches on 2 GB devices than a fused one (2 kept) and a longer step; the plan
    carries it and its file too."""
    from ir import plan_from_json, plan_to_json

    w = workload(blocks=6, batch=24)
    head = dataclasses.replace(w.costs["head"], logits_per_sample=4e7)
    w = dataclasses.replace(w, costs={**w.costs, "head": head})
    c = cluster([("a", device("a", 400.0, 2.0), 12)])
    fused, eager = (api.plan_meshes(dataclasses.replace(w, cross_entropy=ce), c,
                                    PlanOptions(time_limit_s=5, fsdp=False))
                    for ce in ("fused", "eager"))
    assert (fused.plan.cross_entropy, eager.plan.cross_entropy) == ("fused", "eager")
    assert eager.plan.schedule.microbatches > fused.plan.schedule.microbatches
    assert eager.prediction.step_time_s > fused.prediction.step_time_s
    assert fused.prediction.fits and eager.prediction.fits
    doc = plan_to_json(eager.plan)
    assert doc["cross_entropy"] == "eager" and "cross_entropy" not in plan_to_json(fused.plan)
    assert plan_from_json(doc).cross_entropy == "eager"
