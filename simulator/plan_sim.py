"""Simulate a plan: cost it (:class:`~simulator.plan_costs.PlanCosts`), lower its schedule into a
:class:`~simulator.program.SimProgram` and replay that on the discrete-event engine.

Also the two things every consumer of a plan file shares: :func:`plan_cluster` (the carved
cluster a plan of a node-group cluster runs on) and :func:`simulate_data_parallel` (a
:class:`~ir.DataParallelPlan`: independent pipelines on disjoint meshes joined by a
cross-part gradient all-reduce before the optimizer); :func:`simulate_any` takes either kind.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from ir import DataParallelPlan, FragmentRef, Plan, Timeline, TimelineEvent, Workload
from ir.schedule import FragmentKind
from hardware_profiles.carve import carve, shapes_from_json
from hardware_profiles.types import Cluster
from simulator import cost_model as cm
from simulator.context_parallel import context_exchange
from simulator.engine import SimResult, simulate
from simulator.knobs import Knobs
from simulator.lowering import BoundaryCost, FragmentCost, TailOp, lower_schedule
from simulator.plan_costs import CostError, PlanCosts
from simulator.program import SimCollective, SimOp, SimProgram, SimTransfer


def plan_program(plan: Plan, workload: Workload, cluster: Cluster) -> SimProgram:
    """Lower ``plan`` into a :class:`SimProgram` with costs from the cost model.

    Raises:
        simulator.plan_costs.CostError: the plan does not match the workload or cluster.
    """
    costs = PlanCosts(plan, workload, cluster)

    def fragment(rank: int, ref: FragmentRef) -> FragmentCost:
        return FragmentCost(costs.fragment_time(ref), costs.fragment_flops(ref),
                            costs.residual_bytes(ref) if workload.training else 0.0,
                            costs.recv_time(ref))

    def boundary(src: int, dst: int, ref: FragmentRef) -> BoundaryCost | None:
        b = costs.boundary(src, dst)
        return None if b is None else BoundaryCost(*b)

    def tail(mesh: str) -> tuple[TailOp, ...]:
        return tuple(TailOp(kind, t) for kind, t in costs.tail(mesh))

    meshes = plan.rank_mesh
    return lower_schedule(
        plan.schedule, meshes, fragment, boundary, tail,
        baseline_bytes={m: costs.static_bytes(m) + costs.working_bytes(m) for m in meshes},
        capacity_bytes={m: costs.capacity(m) for m in meshes},
        peak_flops=costs.peak_flops,
        host_of={m: h for m in meshes if (h := cluster.meshes[m].host)},
        host_slots=dict(cluster.host_slots), grad_buckets=costs.grad_buckets,
        last_backward=costs.last_backward, param_gather=costs.param_gather)


def simulate_plan(plan: Plan, workload: Workload, cluster: Cluster, *,
                  knobs: Knobs | None = None) -> SimResult:
    """Replay ``plan`` on the discrete-event engine; see :func:`simulator.engine.simulate`. A plan
    with expert parallelism also gets its all-to-alls drawn in its timeline
    (:func:`alltoall_events`), one with context parallelism its key/value exchanges
    (:func:`context_events`)."""
    res = simulate(plan_program(plan, workload, cluster), knobs=knobs)
    drawn: tuple[TimelineEvent, ...] = ()
    if any(lay.expert > 1 for lay in plan.layouts.values()):
        drawn += alltoall_events(plan, workload, cluster, res.timeline.events)
    if any(lay.context > 1 for lay in plan.layouts.values()):
        drawn += context_events(plan, workload, cluster, res.timeline.events)
    if not drawn:
        return res
    return replace(res, timeline=Timeline(res.timeline.events + drawn, res.timeline.memory))


ALLTOALL_TRACK = "{mesh}/alltoall"
"""The timeline track of a mesh's expert all-to-alls (its fabric: NVLink inside a node, the
network across nodes)."""


def alltoall_events(plan: Plan, workload: Workload, cluster: Cluster,
                    events: Sequence[TimelineEvent]) -> tuple[TimelineEvent, ...]:
    """The expert-parallel all-to-alls inside the fragments of ``events`` (the replay's compute
    events), as events of kind ``all_to_all`` on each mesh's :data:`ALLTOALL_TRACK`: per
    mixture-of-experts layer of a forward, its dispatch at the start of the layer's share of the
    fragment and its combine at the end (the experts wait for the one, the next layer for the
    other: ``cost_model.expert_alltoall``); a backward runs its layers last to first and sends the
    transposes (the combine's gradient first). Each takes half the layer's
    ``cost_model.expert_alltoall`` seconds, the bytes one device sends
    (``cost_model.expert_alltoall_bytes``). Drawing only: the fragments already include that time
    (or, under DualPipe, hide it under another microbatch's compute), so the step is unchanged."""
    samples = plan.global_batch / plan.microbatches
    out: list[TimelineEvent] = []
    for e in events:
        if (e.kind not in (FragmentKind.F, FragmentKind.B) or not e.track.endswith("/compute")
                or e.stage < 0):
            continue
        lay = plan.layouts.get(e.mesh)
        if lay is None or lay.expert <= 1:
            continue
        st = plan.stages[e.stage]
        mesh = cluster.meshes[e.mesh]
        per_dev = samples / lay.replicas
        n = st.last - st.first
        width = e.duration_s / max(1, n)
        for j, i in enumerate(range(st.first, st.last)):
            c = workload.layer(i)
            half = cm.expert_alltoall(c, e.kind, per_dev, mesh, lay) / 2
            if half <= 0:
                continue
            half = min(half, width / 2)
            pos = j if e.kind == FragmentKind.F else n - 1 - j
            w0 = e.start_s + pos * width
            nbytes = cm.expert_alltoall_bytes(c, per_dev, lay)
            first, second = (("dispatch", "combine") if e.kind == FragmentKind.F
                             else ("combine^T", "dispatch^T"))
            for what, t0 in ((first, w0), (second, w0 + width - half)):
                out.append(TimelineEvent(
                    name=f"{what} L{i} {e.name}", kind="all_to_all",
                    track=ALLTOALL_TRACK.format(mesh=e.mesh), mesh=e.mesh, stage=e.stage,
                    microbatch=e.microbatch, start_s=t0, end_s=t0 + half, bytes=nbytes))
    return tuple(out)


CONTEXT_TRACK = "{mesh}/context"
"""The timeline track of a mesh's context-parallel exchanges (ring passes, gathers or
all-to-alls of the attention's keys and values)."""


def context_events(plan: Plan, workload: Workload, cluster: Cluster,
                   events: Sequence[TimelineEvent]) -> tuple[TimelineEvent, ...]:
    """The context-parallel exchanges inside the fragments of ``events`` (the replay's compute
    events), as events of kind ``context`` on each mesh's :data:`CONTEXT_TRACK`: per attention
    layer, one event at the start of the layer's share of the fragment (a backward runs its
    layers last to first) lasting the exchange's seconds
    (:func:`simulator.context_parallel.context_exchange`: a ring's run beside the attention
    core, so they may overlap the layer's compute), at most the layer's share, with the bytes
    one device sends. Drawing only: the fragments already include what the exchange adds."""
    samples = plan.global_batch / plan.microbatches
    out: list[TimelineEvent] = []
    for e in events:
        if (e.kind not in (FragmentKind.F, FragmentKind.B) or not e.track.endswith("/compute")
                or e.stage < 0):
            continue
        lay = plan.layouts.get(e.mesh)
        if lay is None or lay.context <= 1:
            continue
        st = plan.stages[e.stage]
        mesh = cluster.meshes[e.mesh]
        n = st.last - st.first
        width = e.duration_s / max(1, n)
        for j, i in enumerate(range(st.first, st.last)):
            nbytes, seconds = context_exchange(workload.layer(i), e.kind,
                                               samples / lay.replicas, mesh, lay)
            if seconds <= 0:
                continue
            pos = j if e.kind == FragmentKind.F else n - 1 - j
            t0 = e.start_s + pos * width
            out.append(TimelineEvent(
                name=f"{lay.context_method} L{i} {e.name}", kind="context",
                track=CONTEXT_TRACK.format(mesh=e.mesh), mesh=e.mesh, stage=e.stage,
                microbatch=e.microbatch, start_s=t0, end_s=t0 + min(seconds, width),
                bytes=nbytes))
    return tuple(out)


# --------------------------------------------------------------------------- carved clusters
def plan_cluster(plan: "Plan | DataParallelPlan", cluster: Cluster) -> Cluster:
    """The cluster ``plan`` runs on: ``cluster`` carved by the plan's ``carving`` (a plan for a
    cluster described as node groups, :mod:`hardware_profiles.carve`, or for a mesh listing the
    planner shaped as the node groups it describes, :func:`hardware_profiles.carve.node_groups_of`),
    else ``cluster`` itself.

    For a :class:`~ir.DataParallelPlan` the carvings of all its parts are carved together
    (each part carves its own node groups). Every consumer of a plan (``mpmd simulate``, ``mpmd
    run``, the what-if reports) goes through this one function, so a plan is always replayed on
    the meshes it was planned for.

    Raises:
        hardware_profiles.types.ProfileError: a carving on a mesh listing that describes no node
            groups (or says ``carve: fixed``), an unknown node group, a shape that does not fit
            its group, or a group carved twice.
    """
    carving = plan.carving
    if not carving:
        return cluster
    return carve(cluster, shapes_from_json(carving))


def plan_meshes(plan: "Plan | DataParallelPlan") -> tuple[str, ...]:
    """The meshes ``plan`` uses, in pipeline order (a data-parallel plan's parts one after another)."""
    if isinstance(plan, DataParallelPlan):
        return tuple(m for p in plan.parts for m in p.rank_mesh)
    return tuple(plan.rank_mesh)


# --------------------------------------------------------------------------- data parallel
SYNC_NAME = "gradient all-reduce across parts"
"""Name of the cross-part gradient all-reduce in a data-parallel plan's timeline."""
_BARRIER = "parts done"


def part_workloads(dp: DataParallelPlan, workload: "Workload | Sequence[Workload]"
                   ) -> tuple[Workload, ...]:
    """One workload per part of ``dp``: the part's batch share of the same model.

    ``workload`` is either the whole step's workload (each part's is the same model at its
    ``global_batch``: a workload's costs are per sample and per step, so only the batch differs,
    as ``zoo.costing.workload(model, share, seq_len)`` gives) or one workload per part.

    Raises:
        simulator.plan_costs.CostError: a workload of another model or sequence length, or a
            count that does not match the parts.
    """
    if isinstance(workload, Workload):
        ws = tuple(replace(workload, global_batch=p.global_batch) for p in dp.parts)
    else:
        ws = tuple(workload)
        if len(ws) != len(dp.parts):
            raise CostError(f"{len(ws)} workloads for a data-parallel plan of {len(dp.parts)} parts; "
                            f"give one per part (or the whole step's)")
    for i, (p, w) in enumerate(zip(dp.parts, ws)):
        if w.global_batch != p.global_batch or w.seq_len != p.seq_len:
            raise CostError(f"part {i} of the data-parallel plan takes {p.global_batch} x {p.seq_len} "
                            f"tokens but its workload is {w.global_batch} x {w.seq_len}; cost each "
                            f"part at its batch share")
    return ws


def _merge(programs: Sequence[SimProgram]
           ) -> tuple[list[SimOp], list[SimTransfer], dict, tuple[str, ...], list[SimCollective]]:
    """Ops, transfers, orders and collectives of ``programs`` (on disjoint meshes) renumbered
    into one."""
    ops: list[SimOp] = []
    trs: list[SimTransfer] = []
    colls: list[SimCollective] = []
    order: dict[str, list[int]] = {}
    meshes: list[str] = []
    for prog in programs:
        off, toff, coff = len(ops), len(trs), len(colls)
        for op in prog.ops:
            ops.append(replace(op, id=op.id + off, deps=tuple(d + off for d in op.deps),
                               inputs=tuple(t + toff for t in op.inputs),
                               waits=tuple(c + coff for c in op.waits)))
        for tr in prog.transfers:
            trs.append(replace(tr, id=tr.id + toff, src_op=tr.src_op + off))
        for c in prog.collectives:
            colls.append(replace(c, id=c.id + coff, after_op=c.after_op + off))
        for m in prog.meshes:
            if m in order:
                raise CostError(f"mesh {m!r} is in two parts of the data-parallel plan; give each "
                                f"part its own meshes")
            meshes.append(m)
            order[m] = [i + off for i in prog.order.get(m, ())]
    return ops, trs, order, tuple(meshes), colls


def _sync_ends(dp: DataParallelPlan) -> tuple[str, str]:
    """(source, destination) meshes of the cross-part all-reduce: the two meshes ``sync_link``
    joins (``"a<->b"``) when both are meshes of the plan, else the first meshes of the first two
    parts (the transfer then holds those meshes' idle send and receive streams)."""
    meshes = plan_meshes(dp)
    a, sep, b = dp.sync_link.partition("<->")
    if sep and a in meshes and b in meshes and a != b:
        return a, b
    first = dp.parts[0].rank_mesh[0]
    return first, (dp.parts[1].rank_mesh[0] if len(dp.parts) > 1 else first)


def data_parallel_program(dp: DataParallelPlan, workload: "Workload | Sequence[Workload]",
                          cluster: Cluster) -> SimProgram:
    """Lower every part of ``dp`` (:func:`plan_program`, each at its batch share) into one
    :class:`SimProgram` on their disjoint meshes, joined by the cross-part gradient all-reduce.

    Each mesh runs its part's pipeline, then its own end-of-step ops (``allreduce`` over its data
    axis, ``optimizer``). The cross-part all-reduce is a transfer of ``dp.sync_bytes`` taking
    ``dp.sync_s`` on link ``dp.sync_link``; it becomes ready when every mesh of every part has
    finished its ``allreduce`` (a zero-time barrier op that depends on all of them), and every
    mesh's ``optimizer`` waits for it. So the step is ``S0 + sync_s + max optimizer``, ``S0`` the
    last mesh's end of pipeline and own all-reduce: the planner's prediction. Forward-only
    (inference) parts have no gradients and no sync.

    ``cluster`` is the cluster the plan runs on (:func:`plan_cluster`). The program's peak FLOP/s
    (MFU's denominator) is that of the meshes the parts use.

    Raises:
        simulator.plan_costs.CostError: a part that does not match its workload or the cluster.
    """
    ws = part_workloads(dp, workload)
    progs = [plan_program(p, w, cluster) for p, w in zip(dp.parts, ws)]
    ops, trs, order, meshes, colls = _merge(progs)
    training = ws[0].training
    if training:
        reduce_ops = [op.id for op in ops if op.kind == "allreduce" and op.stage == -1]
        opt_ops = {op.mesh: op.id for op in ops if op.kind == "optimizer"}
        src, dst = _sync_ends(dp)
        bid = len(ops)
        ops.append(SimOp(id=bid, name=_BARRIER, kind="allreduce", mesh=src, stage=-1, microbatch=-1,
                         duration_s=0.0, deps=tuple(reduce_ops)))
        own = order[src]
        at = own.index(opt_ops[src]) if src in opt_ops else len(own)
        own.insert(at, bid)
        tid = len(trs)
        trs.append(SimTransfer(id=tid, name=SYNC_NAME, src_op=bid, src_mesh=src, dst_mesh=dst,
                               link=dp.sync_link, bytes=float(dp.sync_bytes),
                               duration_s=float(dp.sync_s)))
        for m, oid in opt_ops.items():
            ops[oid] = replace(ops[oid], inputs=ops[oid].inputs + (tid,))
    used = [cluster.meshes[m] for m in meshes]
    # the used devices' own peaks at the precision the workload's GEMMs run in (MFU's denominator)
    peak = sum(cm.peak_rate(s.device, ws[0]) * s.num_devices for s in used)
    host_of: dict[str, str] = {}
    for prog in progs:
        host_of.update(prog.host_of)
    return SimProgram(
        meshes=meshes, order={m: tuple(v) for m, v in order.items()}, ops=tuple(ops),
        transfers=tuple(trs),
        baseline_bytes={m: b for prog in progs for m, b in prog.baseline_bytes.items()},
        capacity_bytes={m: b for prog in progs for m, b in prog.capacity_bytes.items()},
        peak_flops=peak, host_of=host_of, host_slots=dict(cluster.host_slots),
        collectives=tuple(colls))


def simulate_data_parallel(dp: DataParallelPlan, workload: "Workload | Sequence[Workload]",
                           cluster: Cluster, *, knobs: Knobs | None = None) -> SimResult:
    """Replay a data-parallel plan (:func:`data_parallel_program`) on the discrete-event engine.

    Knobs act as on one pipeline: jitter (one seeded draw per op of the whole step), stragglers
    and failed meshes (any mesh of any part), degraded and failed links (a part's links and the
    cross-part ``sync_link``).

    Returns:
        A :class:`SimResult` over every mesh of every part. The cross-part all-reduce is one event of
        kind ``"allreduce"`` on track ``"link:<sync_link>"``. ``extra`` holds ``"parts"`` (per part:
        ``index``, ``global_batch``, ``meshes``, ``schedule``, ``microbatches``, ``pipeline_s``: when
        its last mesh finished its pipeline and own all-reduce) and ``"sync"`` (``link``,
        ``bytes``, ``seconds``, ``start_s``, ``end_s``; the times None when it never ran).
    """
    prog = data_parallel_program(dp, workload, cluster)
    res = simulate(prog, knobs=knobs)
    events, sync_ev = [], None
    for e in res.timeline.events:
        if e.name == _BARRIER and e.kind == "allreduce":
            continue                                  # the zero-time barrier is bookkeeping
        if e.name == SYNC_NAME and e.kind == "transfer":
            if e.track == f"link:{dp.sync_link}":
                e = sync_ev = replace(e, kind="allreduce", stage=-1, microbatch=-1)
            else:
                continue                              # the all-reduce is shown on its link only
        events.append(e)
    timeline = Timeline(events=tuple(events), memory=res.timeline.memory)
    parts = []
    for i, p in enumerate(dp.parts):
        mine = set(p.rank_mesh)
        end = max((e.end_s for e in events if e.mesh in mine and e.kind != "optimizer"
                   and e.track.endswith("/compute")), default=0.0)
        parts.append({"index": i, "global_batch": p.global_batch, "meshes": list(p.rank_mesh),
                      "schedule": p.schedule.name, "microbatches": p.microbatches,
                      "pipeline_s": end})
    sync = {"link": dp.sync_link, "bytes": float(dp.sync_bytes), "seconds": float(dp.sync_s),
            "start_s": None if sync_ev is None else sync_ev.start_s,
            "end_s": None if sync_ev is None else sync_ev.end_s}
    return replace(res, timeline=timeline, extra={"parts": parts, "sync": sync})


def simulate_any(plan: "Plan | DataParallelPlan", workload: "Workload | Sequence[Workload]",
                 cluster: Cluster, *, knobs: Knobs | None = None) -> SimResult:
    """:func:`simulate_plan` or :func:`simulate_data_parallel`, whichever ``plan`` is. ``cluster``
    is the cluster the plan runs on (:func:`plan_cluster`)."""
    if isinstance(plan, DataParallelPlan):
        return simulate_data_parallel(plan, workload, cluster, knobs=knobs)
    if not isinstance(workload, Workload):
        raise CostError("a pipeline plan takes one workload, not one per part")
    return simulate_plan(plan, workload, cluster, knobs=knobs)
