"""simulator.plan_sim on carved and data-parallel plans: ``plan_cluster`` carves what the plan says,
and ``simulate_data_parallel`` replays each part's pipeline, then the gradient all-reduce across
the parts (on ``sync_link``, once every mesh of every part has finished its pipeline and its own
all-reduce), then every mesh's optimizer: step = S0 + sync_s + max optimizer, exactly.

Plans are built by hand on a synthetic node-group cluster (no tracing, no planner): two groups of
two nodes of four devices, "fast" carved one mesh per node (a two-stage pipeline), "slow" carved
into one mesh spanning both nodes (two pipeline replicas as its data axis).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from ir import DataParallelPlan, Layout, Plan, StagePlan
from hardware_profiles.carve import GroupShape, carve
from hardware_profiles.types import Cluster, Link, NodeGroup, ProfileError
from simulator.knobs import Knobs
from simulator.plan_costs import CostError, PlanCosts
from simulator.plan_sim import (SYNC_NAME, data_parallel_program, part_workloads, plan_cluster,
                                plan_meshes, simulate_any, simulate_data_parallel, simulate_plan)
from simulator.trace import to_chrome_trace
from tests.planner.conftest import device, workload

FAST, SLOW = device("fast", 400.0, 80.0), device("slow", 100.0, 80.0)
SYNC_LINK = "fast.0<->slow.0"
SYNC_S, SYNC_BYTES = 0.05, 1e9


def group(name: str, dev, nodes: int, per_node: int) -> NodeGroup:
    return NodeGroup(name, dev, nodes, per_node, Link(100e9, 1e-6, "intra"), Link(25e9, 5e-6, "nic"))


@pytest.fixture(scope="module")
def physical() -> Cluster:
    """As ``load_cluster`` returns a node-group cluster: carved one mesh per node."""
    raw = Cluster("toy", {}, (), None, groups={"fast": group("fast", FAST, 2, 4),
                                               "slow": group("slow", SLOW, 2, 4)})
    return carve(raw, (GroupShape("fast", 2), GroupShape("slow", 2)))


def make_plan(meshes, bounds, share, microbatches, carving, layouts, schedule="1f1b") -> Plan:
    from simulator.schedules import generate

    stages = tuple(StagePlan(i, bounds[i], bounds[i + 1], m) for i, m in enumerate(meshes))
    return Plan("toy", "toy", stages, dict(zip(meshes, layouts)),
                generate(schedule, len(meshes), microbatches), tuple(meshes), False, share, 1024,
                devices={m: (m.split(".")[0], lay.data * lay.tensor) for m, lay in zip(meshes, layouts)},
                carving=(carving,))


PART_FAST = dict(meshes=["fast.0", "fast.1"], bounds=[0, 7, 14], share=32, microbatches=4,
                 carving={"group": "fast", "nodes": 2, "nodes_per_mesh": 1, "meshes_per_node": 1},
                 layouts=[Layout(4, 1), Layout(4, 1)])
PART_SLOW = dict(meshes=["slow.0"], bounds=[0, 14], share=16, microbatches=2,
                 carving={"group": "slow", "nodes": 2, "nodes_per_mesh": 2, "meshes_per_node": 1},
                 layouts=[Layout(8, 1)])


@pytest.fixture(scope="module")
def dp() -> DataParallelPlan:
    return DataParallelPlan("toy", "toy", 48, 1024, (make_plan(**PART_FAST), make_plan(**PART_SLOW)),
                            SYNC_LINK, SYNC_BYTES, SYNC_S, reason="test")


@pytest.fixture(scope="module")
def w():
    return workload(12, 48)


def test_plan_cluster_carves_the_plans_shape(physical, dp):
    assert list(physical.meshes) == ["fast.0", "fast.1", "slow.0", "slow.1"]   # one per node
    lc = plan_cluster(dp, physical)
    assert list(lc.meshes) == ["fast.0", "fast.1", "slow.0"]
    assert lc.meshes["slow.0"].num_devices == 8 and lc.meshes["fast.0"].num_devices == 4
    assert plan_cluster(dp.parts[1], physical).meshes.keys() == {"slow.0"}
    uncarved = replace(dp.parts[0], carving=())
    assert plan_cluster(uncarved, physical) is physical
    assert plan_meshes(dp) == ("fast.0", "fast.1", "slow.0")


def test_plan_cluster_refuses_a_carving_on_a_mesh_listing_cluster(dp):
    listing = Cluster("listing", {}, (), None)
    with pytest.raises(ProfileError, match="lists meshes, not node groups"):
        plan_cluster(dp, listing)


def test_step_is_last_pipeline_end_plus_sync_plus_slowest_optimizer(physical, dp, w):
    """The exact semantics, against each part simulated alone with the existing engine."""
    lc = plan_cluster(dp, physical)
    r = simulate_data_parallel(dp, w, lc)
    alone = [simulate_plan(p, replace(w, global_batch=p.global_batch), lc) for p in dp.parts]
    after = ("optimizer", "all_gather")       # the optimizer, then the parameter all-gather
    ends = [max(e.end_s for e in a.timeline.events if e.kind not in after) for a in alone]
    tail = {}
    for a in alone:
        for e in a.timeline.events:
            if e.kind in after:
                tail[e.mesh] = tail.get(e.mesh, 0.0) + e.duration_s
    opt = {e.mesh: e.duration_s for a in alone for e in a.timeline.events if e.kind == "optimizer"}
    assert any(e.kind == "all_gather" for a in alone for e in a.timeline.events)
    s0 = max(ends)
    assert ends[1] > ends[0]                       # the slow part finishes its pipeline last
    assert r.step_time_s == pytest.approx(s0 + SYNC_S + max(tail.values()), rel=1e-12)
    # the cross-part all-reduce: one event, on its link, from S0 for sync_s
    sync = [e for e in r.timeline.events if e.name == SYNC_NAME]
    assert len(sync) == 1
    (e,) = sync
    assert (e.kind, e.track, e.bytes) == ("allreduce", f"link:{SYNC_LINK}", SYNC_BYTES)
    assert e.start_s == pytest.approx(s0, rel=1e-12) and e.end_s == pytest.approx(s0 + SYNC_S, rel=1e-12)
    # every optimizer starts when the sync ends; everything before it is as in the part alone
    for ev in r.timeline.events:
        if ev.kind == "optimizer":
            assert ev.start_s == pytest.approx(s0 + SYNC_S, rel=1e-12)
            assert ev.duration_s == pytest.approx(opt[ev.mesh], rel=1e-12)
    for a in alone:
        want = sorted((x.name, x.track, x.start_s, x.end_s) for x in a.timeline.events
                      if x.kind not in after)
        got = sorted((x.name, x.track, x.start_s, x.end_s) for x in r.timeline.events
                     if x.kind not in after and x.name != SYNC_NAME
                     and x.mesh in {y.mesh for y in a.timeline.events})
        assert [g[:2] for g in got] == [x[:2] for x in want]
        # flat lists: pytest >= 9.2 refuses approx over nested tuples
        assert [t for g in got for t in g[2:]] == pytest.approx(
            [t for x in want for t in x[2:]], rel=1e-12)
    assert r.extra["parts"][0]["pipeline_s"] == pytest.approx(ends[0], rel=1e-12)
    assert r.extra["parts"][1]["pipeline_s"] == pytest.approx(ends[1], rel=1e-12)
    assert r.extra["sync"] == {"link": SYNC_LINK, "bytes": SYNC_BYTES, "seconds": SYNC_S,
                               "start_s": e.start_s, "end_s": e.end_s}
    assert [p["global_batch"] for p in r.extra["parts"]] == [32, 16]


def test_agrees_with_the_planners_prediction(physical, dp, w):
    """The planner predicts a data-parallel step as max over meshes of (pipeline + own all-reduce)
    + sync + max optimizer, from each part's exact replay (``Prediction.synced_s`` /
    ``optimizer_s``); the discrete-event replay agrees within 1% when links are uncontended."""
    from planner.predict import predict

    lc = plan_cluster(dp, physical)
    preds = [predict(p, replace(w, global_batch=p.global_batch), lc) for p in dp.parts]
    if not all(getattr(p, "synced_s", None) for p in preds):
        pytest.skip("this planner's Prediction has no synced_s / optimizer_s")
    want = (max(t for p in preds for t in p.synced_s.values()) + SYNC_S
            + max(t for p in preds for t in p.optimizer_s.values()))
    assert simulate_data_parallel(dp, w, lc).step_time_s == pytest.approx(want, rel=0.01)


def test_metrics_cover_every_mesh_of_every_part(physical, dp, w):
    lc = plan_cluster(dp, physical)
    r = simulate_data_parallel(dp, w, lc)
    alone = {m: (a, p) for p in dp.parts
             for a in [simulate_plan(p, replace(w, global_batch=p.global_batch), lc)] for m in p.rank_mesh}
    assert set(r.busy_s) == set(r.bubble) == set(r.peak_memory_bytes) == {"fast.0", "fast.1", "slow.0"}
    for m, (a, _) in alone.items():
        assert r.busy_s[m] == pytest.approx(a.busy_s[m], rel=1e-12)     # the same work, moved
        assert r.bubble[m] == pytest.approx(1 - a.busy_s[m] / r.step_time_s, rel=1e-12)
        assert r.peak_memory_bytes[m] == pytest.approx(a.peak_memory_bytes[m], rel=1e-12)
    # MFU: the whole step's model FLOP over the peak of the devices the parts use
    peak = 8 * 400e12 + 8 * 100e12
    assert r.flops == pytest.approx(w.step_flops, rel=1e-9)
    assert r.mfu == pytest.approx(w.step_flops / (r.step_time_s * peak), rel=1e-9)
    assert r.link_bytes[SYNC_LINK] == SYNC_BYTES
    assert not r.errors and r.failure is None


def test_per_part_workloads_equal_the_whole_steps(physical, dp, w):
    ws = part_workloads(dp, w)
    assert [x.global_batch for x in ws] == [32, 16] and all(x.costs == w.costs for x in ws)
    lc = plan_cluster(dp, physical)
    assert simulate_data_parallel(dp, ws, lc).step_time_s == simulate_data_parallel(dp, w, lc).step_time_s
    with pytest.raises(CostError, match="1 workloads for a data-parallel plan of 2 parts"):
        part_workloads(dp, [w])
    with pytest.raises(CostError, match="part 0 of the data-parallel plan takes 32 x 1024"):
        part_workloads(dp, [w, w])


def test_simulate_any_dispatches(physical, dp, w):
    lc = plan_cluster(dp, physical)
    assert simulate_any(dp, w, lc).step_time_s == simulate_data_parallel(dp, w, lc).step_time_s
    one = dp.parts[0]
    w1 = replace(w, global_batch=32)
    assert simulate_any(one, w1, lc).step_time_s == simulate_plan(one, w1, lc).step_time_s


def test_knobs_straggler_degraded_sync_and_failed_sync(physical, dp, w):
    lc = plan_cluster(dp, physical)
    base = simulate_data_parallel(dp, w, lc)
    sync = base.extra["sync"]
    slow = simulate_data_parallel(dp, w, lc, knobs=Knobs(degraded_links={SYNC_LINK: 0.5}))
    assert slow.step_time_s == pytest.approx(base.step_time_s + SYNC_S, rel=1e-12)
    strag = simulate_data_parallel(dp, w, lc, knobs=Knobs(stragglers={"fast.1": 3.0}))
    assert strag.step_time_s > base.step_time_s
    t = sync["start_s"] + SYNC_S / 2
    failed = simulate_data_parallel(dp, w, lc, knobs=Knobs(failed_links={SYNC_LINK: t}))
    assert failed.failure == f"link {SYNC_LINK!r} failed at {t:.6g} s while transferring {SYNC_NAME}"
    assert failed.step_time_s == pytest.approx(t)
    late = simulate_data_parallel(dp, w, lc, knobs=Knobs(failed_links={SYNC_LINK: sync["end_s"] + 1}))
    assert late.failure is None and late.step_time_s == base.step_time_s
    a = simulate_data_parallel(dp, w, lc, knobs=Knobs(jitter=0.1, seed=3))
    b = simulate_data_parallel(dp, w, lc, knobs=Knobs(jitter=0.1, seed=3))
    assert a.step_time_s == b.step_time_s != base.step_time_s


def test_program_joins_parts_with_one_barrier_and_one_transfer(physical, dp, w):
    lc = plan_cluster(dp, physical)
    prog = data_parallel_program(dp, w, lc)
    sync = [t for t in prog.transfers if t.name == SYNC_NAME]
    assert len(sync) == 1 and (sync[0].src_mesh, sync[0].dst_mesh) == ("fast.0", "slow.0")
    barrier = prog.ops[sync[0].src_op]
    assert barrier.duration_s == 0 and len(barrier.deps) == 3          # every mesh's all-reduce
    assert all(sync[0].id in op.inputs for op in prog.ops if op.kind == "optimizer")
    assert prog.peak_flops == 8 * 400e12 + 8 * 100e12


def test_forward_only_parts_have_no_sync(physical, dp):
    inf = workload(12, 48, training=False)
    parts = tuple(replace(p, schedule=replace(p.schedule, forward_only=True,
                                              order=tuple(tuple(f for f in o if f.kind == "F")
                                                          for o in p.schedule.order)))
                  for p in dp.parts)
    d = replace(dp, parts=parts)
    lc = plan_cluster(d, physical)
    r = simulate_data_parallel(d, inf, lc)
    alone = [simulate_plan(p, replace(inf, global_batch=p.global_batch), lc).step_time_s for p in parts]
    assert r.step_time_s == pytest.approx(max(alone), rel=1e-12)
    assert not [e for e in r.timeline.events if e.name == SYNC_NAME]
    assert r.extra["sync"]["start_s"] is None


def test_trace_has_the_sync_on_its_link(physical, dp, w):
    r = simulate_data_parallel(dp, w, plan_cluster(dp, physical))
    tr = to_chrome_trace(r.timeline)["traceEvents"]
    names = {e["args"]["name"] for e in tr if e.get("name") == "process_name"}
    assert {"fast.0", "fast.1", "slow.0", f"link:{SYNC_LINK}"} <= names
    assert [e for e in tr if e.get("ph") == "X" and e["name"] == SYNC_NAME][0]["cat"] == "allreduce"


def test_sync_on_an_unnamed_link_uses_the_first_meshes(physical, dp, w):
    d = replace(dp, sync_link="fast<->slow")
    prog = data_parallel_program(d, w, plan_cluster(d, physical))
    (t,) = [t for t in prog.transfers if t.name == SYNC_NAME]
    assert (t.src_mesh, t.dst_mesh, t.link) == ("fast.0", "slow.0", "fast<->slow")


def test_costs_of_a_replicated_mesh_follow_its_carving(physical, dp, w):
    """slow.0 spans both slow nodes: 8 devices, so its gradient all-reduce crosses nodes."""
    lc = plan_cluster(dp, physical)
    costs = PlanCosts(dp.parts[1], replace(w, global_batch=16), lc)
    assert lc.meshes["slow.0"].devices_per_node == 4
    assert dp.parts[1].replicas == {"slow.0": 2} and dp.parts[0].replicas == {"fast.0": 1, "fast.1": 1}
    buckets = [b for st in dp.parts[1].stages if st.mesh == "slow.0"
               for b in costs.grad_buckets(st.index)]
    assert buckets and all(kind == "reduce_scatter" and secs > 0 for _, kind, _, secs, _ in buckets)
    assert costs.param_gather("slow.0") > 0
