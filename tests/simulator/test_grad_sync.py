"""Data-parallel gradient sync on the collective stream: the engine's collective ops, the
per-layer reduce-scatter buckets overlapped with the last backward (ZeRO-1 / Megatron's
distributed optimizer), the parameter all-gather after the optimizer, hybrid sharding (HSDP)
across nodes, TPU torus collectives, and predict = simulate."""

from __future__ import annotations

import dataclasses

import pytest

from ir import LayerCost, Layout, Plan, StagePlan, Workload
from hardware_profiles import load_device
from hardware_profiles.collectives import all_gather, reduce_scatter, ring_all_reduce
from hardware_profiles.types import Cluster, Link, MeshSpec, torus_axes_spanned, torus_shape
from planner.predict import predict
from simulator import cost_model as cm
from simulator.engine import simulate
from simulator.plan_costs import PlanCosts
from simulator.plan_sim import simulate_plan
from simulator.program import SimCollective, SimError, SimOp, SimProgram
from simulator.schedules import generate


def test_collective_starts_part_way_through_its_op_and_holds_the_waiting_op():
    """B runs [0, 10); a collective ready at 50% of B (t=5) takes 8 s -> [5, 13); a second one,
    ready at 100% (t=10), queues behind it on the stream -> [13, 15); the optimizer waits for
    both -> starts at 15."""
    ops = (SimOp(0, "B0.0", "B", "m", 0, 0, 10.0),
           SimOp(1, "optimizer@m", "optimizer", "m", -1, -1, 1.0, waits=(0, 1)))
    colls = (SimCollective(0, "RS0.L1", "reduce_scatter", "m", 0, 0.5, 8.0, 100.0),
             SimCollective(1, "RS0.L0", "reduce_scatter", "m", 0, 1.0, 2.0, 50.0))
    r = simulate(SimProgram(meshes=("m",), order={"m": (0, 1)}, ops=ops, collectives=colls))
    ev = {e.name: (e.track, e.start_s, e.end_s) for e in r.timeline.events}
    assert ev["RS0.L1"] == ("m/collective", 5.0, 13.0)
    assert ev["RS0.L0"] == ("m/collective", 13.0, 15.0)
    assert ev["optimizer@m"] == ("m/compute", 15.0, 16.0)
    assert r.step_time_s == 16.0 and r.busy_s["m"] == 11.0


def test_bad_collectives_are_refused():
    op = (SimOp(0, "B0.0", "B", "m", 0, 0, 1.0),)
    with pytest.raises(SimError, match="after_fraction"):
        SimProgram(meshes=("m",), order={"m": (0,)}, ops=op,
                   collectives=(SimCollective(0, "x", "reduce_scatter", "m", 0, 1.5, 1.0),))
    with pytest.raises(SimError, match="kind 'broadcast'"):
        SimProgram(meshes=("m",), order={"m": (0,)}, ops=op,
                   collectives=(SimCollective(0, "x", "broadcast", "m", 0, 0.5, 1.0),))
    with pytest.raises(SimError, match="waits for collective 3"):
        SimProgram(meshes=("m",), order={"m": (0,)},
                   ops=(SimOp(0, "B0.0", "B", "m", 0, 0, 1.0, waits=(3,)),))


# --------------------------------------------------------------------------- a one-stage DP plan
def _cost(name: str, params: int) -> LayerCost:
    return LayerCost(name=name, fwd_flops_per_sample=1e12, bwd_flops_per_sample=2e12,
                     bwd_input_flops_per_sample=1e12, fwd_bytes_fixed=0.0, fwd_bytes_per_sample=0.0,
                     bwd_bytes_fixed=0.0, bwd_bytes_per_sample=0.0, param_count=params,
                     param_bytes=2.0 * params, activation_bytes_per_sample=1e6,
                     residual_bytes_per_sample=1e6, tp_allreduce_bytes_per_sample=0.0)


W = Workload(model="toy", layers=("block",) * 4, costs={"block": _cost("block", 50_000_000)},
             seq_len=128, global_batch=32)


def _setup(layout: Layout, num_devices: int = 8, per_node: int | None = None,
           microbatches: int = 4):
    # no wave quantisation: the toy's 64-token GEMMs would fill a fraction of the SMs, and these
    # tests are about the buckets
    dev = dataclasses.replace(load_device("a100-80gb-sxm"), fragment_overhead=0.0, gemm_tiling=None)
    mesh = MeshSpec("m", dev, num_devices, {"data": layout.data, "tensor": layout.tensor},
                    Link(100e9, 0.0), devices_per_node=per_node,
                    scale_out_link=Link(10e9, 0.0) if per_node else None)
    cluster = Cluster("c", {"m": mesh}, ())
    table = generate("1f1b", 1, microbatches)
    plan = Plan(model="toy", cluster="c", stages=(StagePlan(0, 0, 4, "m"),),
                layouts={"m": layout}, schedule=table, rank_mesh=("m",), merge_last_stage=False,
                global_batch=32, seq_len=128, devices={"m": ("a100-80gb-sxm", num_devices)})
    return plan, cluster, mesh


def test_reduce_scatter_buckets_hide_under_the_last_backward_exactly():
    plan, cluster, mesh = _setup(Layout(8, 1))
    costs = PlanCosts(plan, W, cluster)
    buckets = costs.grad_buckets(0)
    rs = reduce_scatter(50_000_000 * 4.0, 8, mesh.intra_link)
    # one bucket per layer, last layer first, ready after 1/4, 2/4, 3/4, 4/4 of the last B
    assert [(n, k, b, s) for n, k, b, s, _ in buckets] == [
        (f"RS0.L{i}", "reduce_scatter", 2e8, rs) for i in (3, 2, 1, 0)]
    assert [f for *_, f in buckets] == pytest.approx([0.25, 0.5, 0.75, 1.0], rel=1e-12)
    r = simulate_plan(plan, W, cluster)
    last_b = max((e for e in r.timeline.events if e.kind == "B"), key=lambda e: e.start_s)
    coll = sorted((e for e in r.timeline.events if e.track == "m/collective"),
                  key=lambda e: e.start_s)
    b = last_b.end_s - last_b.start_s
    assert rs < b / 4                    # each bucket is shorter than a layer's backward
    for k, e in enumerate(coll[:4]):     # so each starts the moment its layer is done
        assert e.start_s == pytest.approx(last_b.start_s + (k + 1) * b / 4, rel=1e-12)
    ag = all_gather(2.0 * 50_000_000 * 4, 8, mesh.intra_link)
    opt = cm.optimizer_time(W, 0, 4, mesh, Layout(8, 1))
    # exposed: the last bucket, the optimizer, the parameter all-gather (ZeRO-1's second half)
    assert coll[-1].kind == "all_gather" and coll[-1].end_s - coll[-1].start_s == pytest.approx(ag)
    assert r.step_time_s == pytest.approx(last_b.end_s + rs + opt + ag, rel=1e-12)
    assert predict(plan, W, cluster).step_time_s == pytest.approx(r.step_time_s, rel=1e-12)
    # cheaper than an exposed all-reduce of the same gradients at the end of the step
    assert rs + ag < ring_all_reduce(50_000_000 * 4.0 * 4, 8, mesh.intra_link)


def test_slow_buckets_queue_and_predict_agrees():
    """Across nodes at 10 GB/s per device the buckets outlast the backward: they queue on the
    stream, and the predicted step matches the replay."""
    plan, cluster, mesh = _setup(Layout(8, 1), num_devices=16, per_node=2)
    plan = dataclasses.replace(plan, layouts={"m": Layout(16, 1)},
                               devices={"m": ("a100-80gb-sxm", 16)})
    mesh = dataclasses.replace(mesh, num_devices=16, axes={"data": 16, "tensor": 1})
    cluster = Cluster("c", {"m": mesh}, ())
    r = simulate_plan(plan, W, cluster)
    coll = [e for e in r.timeline.events if e.track == "m/collective" and e.kind == "reduce_scatter"]
    assert all(b.start_s == pytest.approx(a.end_s, rel=1e-12) for a, b in zip(coll[1:], coll[2:]))
    assert predict(plan, W, cluster).step_time_s == pytest.approx(r.step_time_s, rel=1e-12)


def test_hsdp_shards_within_a_node_and_all_reduces_shards_across_nodes():
    lay = Layout(16, 1, fsdp=True, hsdp=2)
    assert lay.shard == 8 and str(lay) == "dp16xtp1-fsdpx2"
    plan, cluster, mesh = _setup(lay, num_devices=16, per_node=8)
    mesh = dataclasses.replace(mesh, axes={"data": 16, "tensor": 1})
    cluster = Cluster("c", {"m": mesh}, ())
    costs = PlanCosts(plan, W, cluster)
    # shard over the 8 devices of a node (intra link); replicas all-reduce the 1/8 shard over
    # the network (2 replicas, one per node)
    ar = ring_all_reduce(50_000_000 * 4.0 / 8, 2, mesh.scale_out_link)
    assert [(k, b, s) for _, k, b, s, _ in costs.grad_buckets(0)] == [("all_reduce", 2.5e7, ar)] * 4
    assert costs.param_gather("m") == 0.0
    mem = cm.stage_memory(W, 0, 4, lay, 8.0)
    assert mem.static_bytes == pytest.approx(4 * 50_000_000 * (2 + 4 + 12) / 8)
    r = simulate_plan(plan, W, cluster)
    assert predict(plan, W, cluster).step_time_s == pytest.approx(r.step_time_s, rel=1e-12)
    with pytest.raises(ValueError, match="hsdp must divide data"):
        Layout(16, 1, fsdp=True, hsdp=3)
    with pytest.raises(ValueError, match="needs fsdp"):
        Layout(16, 1, hsdp=2)


def test_hsdp_layout_round_trips_through_plan_json():
    plan, _, _ = _setup(Layout(8, 1, fsdp=True, hsdp=2))
    from ir import plan_from_json, plan_to_json

    d = plan_to_json(plan)
    assert d["meshes"]["m"]["layout"] == {"data": 8, "tensor": 1, "fsdp": True, "hsdp": 2}
    assert plan_from_json(d).layouts["m"] == Layout(8, 1, fsdp=True, hsdp=2)
    plain = plan_to_json(_setup(Layout(8, 1))[0])
    assert "hsdp" not in plain["meshes"]["m"]["layout"]
    assert plan_from_json(plain).layouts["m"].hsdp == 1


# --------------------------------------------------------------------------- TPU torus
def test_torus_shapes_and_axes_spanned():
    assert torus_shape(256, 2) == (16, 16) and torus_shape(64, 3) == (4, 4, 4)
    assert torus_shape(128, 3) == (4, 4, 8) and torus_shape(12, 2) == (12,)
    assert torus_axes_spanned(256, 2, 16) == 1 and torus_axes_spanned(256, 2, 256) == 2
    assert torus_axes_spanned(256, 2, 16, stride=16) == 1          # the outer axis only
    assert torus_axes_spanned(64, 3, 4) == 1 and torus_axes_spanned(64, 3, 16) == 2
    assert torus_axes_spanned(64, 3, 64) == 3


def test_tpu_collectives_use_the_torus_axes_they_span():
    v5p = load_device("tpu-v5p")
    assert v5p.torus_dims == 3
    ici = Link(v5p.scale_up_bandwidth, v5p.scale_up_latency)
    mesh = MeshSpec("s", v5p, 64, {"data": 16, "tensor": 4}, ici)
    assert mesh.collective_link(4).bandwidth == pytest.approx(ici.bandwidth / 3)    # 1 of 3 axes
    assert mesh.collective_link(16, 4).bandwidth == pytest.approx(ici.bandwidth * 2 / 3)
    assert mesh.collective_link(64).bandwidth == pytest.approx(ici.bandwidth)      # all ports
    h100 = load_device("h100-sxm")                                                   # a switch
    gpu = MeshSpec("g", h100, 8, {"data": 2, "tensor": 4}, Link(450e9, 1e-6))
    assert gpu.collective_link(4) is gpu.intra_link
