"""Overlap as frameworks achieve it: FSDP's exposed first gather / last reduce-scatter, the
interference of overlapped collectives, after-backward gradient sync, and the straggler wait."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ir import Layout
from planner.predict import predict
from simulator import cost_model as cm
from simulator.plan_costs import PlanCosts
from simulator.plan_sim import simulate_plan
from tests.simulator.test_grad_sync import W, _setup


def test_overlapped_is_max_plus_interference():
    assert cm.overlapped(2.0, 1.0, 0.0) == 2.0
    assert cm.overlapped(2.0, 1.0, 0.1) == pytest.approx(2.1)
    assert cm.overlapped(1.0, 3.0, 0.5) == 3.0            # comm-bound: the compute hides under it


def test_fsdp_exposes_the_first_gather_and_the_last_reduce_scatter():
    plan, cluster, mesh = _setup(Layout(8, 1, fsdp=True))
    costs = PlanCosts(plan, W, cluster)
    block = W.layer(0)
    ag, rs = cm.fsdp_traffic(block, mesh, Layout(8, 1, fsdp=True))
    assert ag == pytest.approx(7 / 8 * block.param_bytes / 100e9, rel=1e-12)
    assert rs == pytest.approx(7 / 8 * block.param_count * 4.0 / 100e9, rel=1e-12)
    assert costs.fsdp_exposed(0, "F") == pytest.approx(ag, rel=1e-12)
    assert costs.fsdp_exposed(0, "B") == pytest.approx(ag + rs, rel=1e-12)
    per_layer_f = cm.layer_time(block, "F", costs.samples, mesh, Layout(8, 1, fsdp=True),
                                seq_len=W.seq_len)
    ref = plan.schedule.order[0][0]
    assert costs.fragment_time(ref) == pytest.approx(4 * per_layer_f + ag, rel=1e-12)
    # no fsdp, nothing exposed
    plain, cl2, _ = _setup(Layout(8, 1))
    assert PlanCosts(plain, W, cl2).fsdp_exposed(0, "B") == 0.0


def test_interference_slows_the_overlapped_compute():
    plan, cluster, mesh = _setup(Layout(8, 1, fsdp=True))
    mesh = dataclasses.replace(mesh, device=dataclasses.replace(mesh.device, comm_interference=0.0))
    slow_dev = dataclasses.replace(mesh.device, comm_interference=0.2)
    slow = dataclasses.replace(mesh, device=slow_dev)
    lay = Layout(8, 1, fsdp=True)
    block = W.layer(0)
    base = cm.layer_time(block, "F", 8, mesh, lay, seq_len=W.seq_len)
    ag, _ = cm.fsdp_traffic(block, mesh, lay)
    work = base                      # the gather hides: the layer is compute-bound
    assert ag < work
    assert cm.layer_time(block, "F", 8, slow, lay, seq_len=W.seq_len) == pytest.approx(
        work + 0.2 * ag, rel=1e-12)


def test_after_backward_sync_releases_every_bucket_at_the_end():
    plan, cluster, mesh = _setup(Layout(8, 1))
    dev = dataclasses.replace(mesh.device, grad_sync_overlap="after_backward")
    mesh2 = dataclasses.replace(mesh, device=dev)
    cluster2 = dataclasses.replace(cluster, meshes={"m": mesh2})
    buckets = PlanCosts(plan, W, cluster2).grad_buckets(0)
    assert [f for *_, f in buckets] == [1.0] * 4
    r = simulate_plan(plan, W, cluster2)
    rs = buckets[0][3]
    hidden = simulate_plan(plan, W, cluster).step_time_s
    assert r.step_time_s == pytest.approx(hidden + 3 * rs, rel=1e-9)   # 3 more buckets exposed
    assert predict(plan, W, cluster2).step_time_s == pytest.approx(r.step_time_s, rel=1e-12)


def test_straggler_wait_scales_with_lockstep_units():
    plan, cluster, mesh = _setup(Layout(16, 1), num_devices=16, per_node=2)
    plan = dataclasses.replace(plan, devices={"m": ("a100-80gb-sxm", 16)})
    mesh = dataclasses.replace(mesh, num_devices=16, axes={"data": 16, "tensor": 1},
                               device=dataclasses.replace(mesh.device, sync_jitter=0.01))
    cluster = dataclasses.replace(cluster, meshes={"m": mesh})
    costs = PlanCosts(plan, W, cluster)
    assert costs.hosts == 8                      # 16 devices on nodes of 2
    busy = sum(costs.fragment_time(f) for f in plan.schedule.order[0])
    assert costs.straggler_wait("m") == pytest.approx(busy * 0.01 * math.sqrt(2 * math.log(8)))
    r = simulate_plan(plan, W, cluster)
    assert predict(plan, W, cluster).step_time_s == pytest.approx(r.step_time_s, rel=1e-12)
    calm = dataclasses.replace(cluster, meshes={"m": dataclasses.replace(
        mesh, device=dataclasses.replace(mesh.device, sync_jitter=0.0))})
    assert r.step_time_s > simulate_plan(plan, W, calm).step_time_s


def test_tensor_parallel_overlap_hides_the_traffic_under_the_gemms():
    block = dataclasses.replace(W.layer(0), tp_allreduce_bytes_per_sample=1e6)
    plan, cluster, mesh = _setup(Layout(2, 4))
    dev = dataclasses.replace(mesh.device, comm_interference=0.0)
    mesh = dataclasses.replace(mesh, device=dev)
    on, off = Layout(2, 4, tp_overlap=True), Layout(2, 4)
    silent = dataclasses.replace(block, tp_allreduce_bytes_per_sample=0.0)
    for kind in ("F", "B"):
        exposed = cm.layer_time(block, kind, 8.0, mesh, off, seq_len=W.seq_len)
        hidden = cm.layer_time(block, kind, 8.0, mesh, on, seq_len=W.seq_len)
        no_traffic = cm.layer_time(silent, kind, 8.0, mesh, off, seq_len=W.seq_len)
        tp = cm.collective(mesh, "all_reduce", block.tp_allreduce_bytes_per_sample * 4.0, 4)
        assert exposed == pytest.approx(no_traffic + tp, rel=1e-12)
        # compute-bound and no interference: the traffic hides entirely
        assert hidden == pytest.approx(no_traffic, rel=1e-12) and tp < hidden
    # interference slows the GEMMs by k x the overlapped traffic
    noisy = dataclasses.replace(mesh, device=dataclasses.replace(dev, comm_interference=0.25))
    tp = cm.collective(noisy, "all_reduce", block.tp_allreduce_bytes_per_sample * 4.0, 4)
    base = cm.layer_time(silent, "F", 8.0, noisy, off, seq_len=W.seq_len)
    assert cm.layer_time(block, "F", 8.0, noisy, on, seq_len=W.seq_len) == pytest.approx(
        base + 0.25 * tp, rel=1e-12)


def test_tp_overlap_round_trips_through_plan_json_and_prints():
    from ir import plan_from_json, plan_to_json
    plan, _, _ = _setup(Layout(2, 4, tp_overlap=True))
    doc = plan_to_json(plan)
    assert doc["meshes"]["m"]["layout"]["tp_overlap"] is True
    assert plan_from_json(doc).layouts["m"] == Layout(2, 4, tp_overlap=True)
    assert str(Layout(2, 4, tp_overlap=True)) == "dp2xtp4-tpo" and str(Layout(8, 1, tp_overlap=True)) == "dp8xtp1"
    assert "tp_overlap" not in plan_to_json(_setup(Layout(2, 4))[0])["meshes"]["m"]["layout"]
    # the gradient reduction's dtype travels the same way
    bf16 = Layout(2, 4, tp_overlap=True, grad_reduce="bf16")
    doc = plan_to_json(_setup(bf16)[0])
    assert doc["meshes"]["m"]["layout"]["grad_reduce"] == "bf16"
    assert plan_from_json(doc).layouts["m"] == bf16
    assert "grad_reduce" not in plan_to_json(plan)["meshes"]["m"]["layout"]
