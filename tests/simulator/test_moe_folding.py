"""MoE parallel folding in the cost model (``ir.Layout.expert_tensor``): expert parallel over the
data x tensor devices with the experts' own tensor degree (Megatron-Core's ETP)."""

from __future__ import annotations

import dataclasses

import pytest

from ir import LayerCost, Layout
from hardware_profiles import load_device
from hardware_profiles.types import Link, MeshSpec
from simulator import cost_model as cm

MOE = LayerCost(name="decoder_block", fwd_flops_per_sample=2e12, bwd_flops_per_sample=4e12,
                bwd_input_flops_per_sample=2e12, fwd_bytes_fixed=2e9, fwd_bytes_per_sample=1e8,
                bwd_bytes_fixed=4e9, bwd_bytes_per_sample=2e8, param_count=1_000_000_000,
                param_bytes=2e9, activation_bytes_per_sample=1e6, residual_bytes_per_sample=1e7,
                tp_allreduce_bytes_per_sample=8e7, experts=64, expert_param_count=800_000_000,
                expert_fwd_flops_per_sample=1e12, alltoall_bytes_per_sample=2e8,
                routed_pairs_per_sample=0.0)

NVLINK, IB = Link(400e9, 1e-6), Link(50e9, 5e-6)


def _mesh(devices: int = 16, per_node: int = 8) -> MeshSpec:
    return MeshSpec("m", load_device("h100-sxm"), devices, {"data": devices}, NVLINK,
                    devices_per_node=per_node, scale_out_link=IB)


def test_layout_spelling_and_checks():
    assert Layout(4, 2, expert=4, expert_tensor=2) == Layout(4, 2, expert=4)   # etp = tp: default
    assert Layout(4, 2, expert=4).etp == 2 and not Layout(4, 2, expert=4).folded
    f = Layout(2, 8, expert=16, expert_tensor=1)
    assert (f.etp, f.folded, f.expert_data, str(f)) == (1, True, 1, "dp2xtp8-ep16-etp1")
    assert Layout(4, 2, expert=4, expert_tensor=1).expert_data == 2
    with pytest.raises(ValueError, match="must divide data x context x tensor = 16"):
        Layout(2, 8, expert=32, expert_tensor=1)
    with pytest.raises(ValueError, match="must divide data x context x tensor"):
        Layout(4, 2, expert=8)        # unfolded, ep 8 > dp 4: the data axis cannot hold it


def test_a_device_holds_its_share_of_the_experts():
    # 0.8 of the parameters are experts: each device holds 1/(ep x etp) of them, 1/tp of the rest
    for lay in (Layout(2, 8, expert=16, expert_tensor=1), Layout(8, 2, expert=8),
                Layout(4, 4, expert=8, expert_tensor=2)):
        held = cm.held_fraction(MOE, lay) / lay.tensor * MOE.param_count
        assert held == pytest.approx(0.2e9 / lay.tensor + 0.8e9 / (lay.expert * lay.etp))
    assert cm.expert_matmul_work(MOE, "F", 1.0, Layout(2, 8, expert=16, expert_tensor=1))[1] \
        == pytest.approx(2e9 * 0.8 / 16)


def test_the_all_to_all_of_a_folded_group_stays_inside_the_node():
    mesh = _mesh(16, 8)
    folded = Layout(2, 8, expert=8, expert_tensor=1)     # EP 8 over one node's 8 TP ranks
    plain = Layout(8, 2, expert=8)                       # EP 8 strided by TP 2: spans two nodes
    nb = cm.expert_alltoall_bytes(MOE, 1.0, folded)
    assert nb == pytest.approx(2e8 / 8)
    assert cm.expert_alltoall(MOE, "F", 1.0, mesh, folded) == pytest.approx(
        2 * cm.collective(mesh, "all_to_all", nb, 8, 1))
    # the same bytes over a group strided by tp 2 cross the node boundary: slower
    assert cm.collective(mesh, "all_to_all", nb, 8, 2) > 2 * cm.collective(mesh, "all_to_all", nb, 8, 1)
    assert cm.expert_alltoall(MOE, "F", 1.0, mesh, plain) == pytest.approx(
        2 * cm.collective(mesh, "all_to_all", 2e8 / 2, 8, 2))


def test_a_folded_mlp_leaves_the_tensor_group():
    mesh = _mesh(16, 8)
    t8 = Layout(2, 8, expert=2)                  # experts tensor-split 8 ways: all of it over tp
    etp1 = Layout(2, 8, expert=16, expert_tensor=1)
    full = cm.collective(mesh, "all_reduce", 8e7, 8)
    assert cm.tensor_parallel_comm(MOE, mesh, t8, 8e7) == pytest.approx(full)
    assert cm.tensor_parallel_comm(MOE, mesh, etp1, 8e7) == pytest.approx(
        cm.collective(mesh, "all_reduce", 8e7 * (1 - cm.MOE_TP_SHARE), 8))
    dense = dataclasses.replace(MOE, experts=0, expert_param_count=0, expert_fwd_flops_per_sample=0,
                                alltoall_bytes_per_sample=0)
    assert cm.tensor_parallel_comm(dense, mesh, etp1, 8e7) == pytest.approx(full)
    assert cm.tensor_parallel_comm(MOE, mesh, Layout(2, 8, expert=2, expert_tensor=8), 8e7) \
        == pytest.approx(full)


def test_expert_gradients_reduce_over_their_replicas_even_without_data_parallel():
    mesh = _mesh(16, 8)
    lay = Layout(1, 16, expert=8, expert_tensor=1)       # 2 replicas of each expert shard
    op, nbytes, seconds = cm.layer_grad_sync(MOE, mesh, lay)
    local = 0.8e9 * cm.GRAD_BYTES_PER_PARAM / 8
    assert op == "reduce_scatter" and nbytes == pytest.approx(0.2e9 * cm.GRAD_BYTES_PER_PARAM / 16
                                                              + local)
    assert seconds == pytest.approx(cm.collective(mesh, "reduce_scatter", local, 2, 8))
    assert cm.layer_grad_sync(MOE, mesh, Layout(1, 16, expert=16, expert_tensor=1)) is None


def test_a_two_hop_dispatch_is_carried_and_costed():
    lay = Layout(16, 1, expert=16, expert_dispatch="deepep")
    assert str(lay) == "dp16xtp1-ep16-deepep"
    assert Layout(16, 1, expert_dispatch="deepep").expert_dispatch == "alltoall"   # no experts
    with pytest.raises(ValueError, match="expert_dispatch='nccl'"):
        Layout(16, 1, expert=16, expert_dispatch="nccl")
    cost = dataclasses.replace(MOE, experts_per_token=8.0)
    mesh = _mesh(16, 8)
    plain = cm.expert_alltoall(cost, "F", 1.0, mesh, Layout(16, 1, expert=16))
    two = cm.expert_alltoall(cost, "F", 1.0, mesh, lay)
    nb = cm.expert_alltoall_bytes(cost, 1.0, lay)
    from hardware_profiles.collectives import span_two_hop_all_to_all
    assert two == pytest.approx(2 * span_two_hop_all_to_all(nb, mesh.collective_span(16, 1), 8))
    assert two < plain
    # a layer that does not say its top-k is dispatched as one all-to-all
    assert cm.expert_alltoall(MOE, "F", 1.0, mesh, lay) == pytest.approx(
        cm.expert_alltoall(MOE, "F", 1.0, mesh, Layout(16, 1, expert=16)))


def test_the_planner_offers_two_hops_only_where_the_group_leaves_the_node():
    from planner.options import _layouts

    many = [lay for lay in _layouts(_mesh(16, 8), 16, 8, False, experts=64)
            if lay.expert_dispatch == "deepep"]
    assert many and all(_mesh(16, 8).collective_span(lay.expert, lay.etp).nodes > 1
                        for lay in many)
    assert not [lay for lay in _layouts(_mesh(8, 8), 8, 8, False, experts=64)
                if lay.expert_dispatch == "deepep"]


def test_the_plan_file_carries_folding_and_dispatch():
    from ir import plan_from_json, plan_to_json
    from tests.planner.conftest import cluster, device, workload
    from planner import PlanOptions, plan

    w = workload(blocks=4, batch=8)
    cl = cluster([("a", device("a", 100.0, 80.0), 4)])
    doc = plan_to_json(plan(w, cl, PlanOptions(time_limit_s=5)).plan)
    lay = next(iter(doc["meshes"].values()))["layout"]
    assert "expert_tensor" not in lay and "expert_dispatch" not in lay     # as before
    lay.update(data=2, tensor=2, fsdp=False, expert=4, expert_tensor=1, expert_dispatch="deepep")
    back = plan_from_json(doc)
    assert set(back.layouts.values()) == {Layout(2, 2, expert=4, expert_tensor=1,
                                                 expert_dispatch="deepep")}
    again = next(iter(plan_to_json(back)["meshes"].values()))["layout"]
    assert (again["expert_tensor"], again["expert_dispatch"]) == (1, "deepep")
