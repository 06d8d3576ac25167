"""The planner's prediction for a plan: an exact analytic replay of its schedule.

Each rank runs its fragment order back to back; a fragment starts once its rank is free and its
inputs have arrived (producer end + transfer time). That longest-path evaluation
(:func:`simulator.schedules.check.replay`) plus each mesh's end-of-step ops gives the step time; the
discrete-event simulator replays the same plan with streams and link contention, and the two must
agree within 1% when links are not contended (a test holds them together). Meshes that share one
host's compute (``MeshSpec.host``, e.g. CPU devices of one machine) are the exception: the replay has
no notion of that contention, so their plans are timed by the simulator.
"""

from __future__ import annotations

from typing import Mapping

from ir import FragmentKind, FragmentRef, Plan, Prediction, Workload
from hardware_profiles.types import Cluster
from simulator.plan_costs import PlanCosts
from simulator.plan_sim import simulate_plan
from simulator.schedules.check import replay


def _collective_ends(plan: Plan, costs: PlanCosts, end: Mapping[tuple[int, FragmentRef], float]
                     ) -> dict[str, float]:
    """Per mesh, when its collective stream finishes the gradient buckets
    (:meth:`~simulator.plan_costs.PlanCosts.grad_buckets`), replayed as the engine does: in
    order of their releasing fragment's position in the mesh's order, then ready fraction; each
    starts when the stream is free and its fragment has run that fraction."""
    if not costs.workload.training or plan.schedule.forward_only:
        return {}
    table = plan.schedule
    pending: dict[str, list[tuple[int, float, int, int, float, float]]] = {}
    for s in range(table.num_stages):
        buckets = costs.grad_buckets(s)
        if not buckets:
            continue
        ref = costs.last_backward(s)
        rank = table.stage_rank[s]
        dur = costs.fragment_time(ref)
        start = end[(rank, ref)] - dur
        pos = table.order[rank].index(ref)
        for k, (_, _, _, secs, frac) in enumerate(buckets):
            pending.setdefault(plan.rank_mesh[rank], []).append(
                (pos, frac, s, k, start + frac * dur, secs))
    out = {}
    for mesh, items in pending.items():
        t = 0.0
        for *_, ready, secs in sorted(items):
            t = max(t, ready) + secs
        out[mesh] = t
    return out


def predict(plan: Plan, workload: Workload, cluster: Cluster, *, headroom: float = 0.0
            ) -> Prediction:
    """Replay ``plan`` analytically and return its :class:`Prediction`.

    Args:
        headroom: fraction of each device's memory kept free; a mesh whose peak exceeds
            ``capacity x (1 - headroom)`` is listed in ``shortfall_bytes`` with the excess.

    Raises:
        simulator.plan_costs.CostError: the plan does not match the workload or cluster.
    """
    costs = PlanCosts(plan, workload, cluster)
    table = plan.schedule

    def duration(rank: int, ref: FragmentRef) -> float:
        return costs.fragment_time(ref)

    def comm(src: int, dst: int, ref: FragmentRef) -> float:
        b = costs.boundary(src, dst)
        return 0.0 if b is None else b[2]

    def residual(rank: int, ref: FragmentRef) -> float:
        return costs.residual_bytes(ref)

    def receive(rank: int, ref: FragmentRef) -> float:
        return costs.recv_time(ref)

    rp = replay(table, duration, comm, activation=residual if workload.training else None,
                receive=receive if costs.blocking_p2p else None)
    step = 0.0
    busy: dict[str, float] = {}
    peak, cap, short, synced, opt = {}, {}, {}, {}, {}
    coll_end = _collective_ends(plan, costs, rp.end)
    for rank, mesh in enumerate(plan.rank_mesh):
        parts = dict(costs.tail(mesh))
        tail = sum(parts.values())
        busy[mesh] = rp.busy[rank] + tail
        last_end = max((rp.end[(rank, f)] for f in table.order[rank]), default=0.0)
        synced[mesh] = max(last_end, coll_end.get(mesh, 0.0)) + parts.get("allreduce", 0.0)
        opt[mesh] = parts.get("optimizer", 0.0) + costs.param_gather(mesh)
        step = max(step, synced[mesh] + opt[mesh])
        resid = rp.peak_activation[rank] if workload.training else 0.0
        peak[mesh] = costs.static_bytes(mesh) + resid + costs.working_bytes(mesh)
        cap[mesh] = costs.capacity(mesh)
        usable = cap[mesh] * (1.0 - headroom)
        if peak[mesh] > usable:
            short[mesh] = peak[mesh] - usable
    F, B, W = FragmentKind.F, FragmentKind.B, FragmentKind.W
    kinds = (F,) + (((B, W) if table.split_backward else (B,)) if workload.training else ())
    stage_time = tuple(sum(costs.fragment_time(FragmentRef(k, s.index, 0)) for k in kinds)
                       for s in plan.stages)
    if any(cluster.meshes[m].host for m in plan.rank_mesh):
        # meshes sharing a host's compute (MeshSpec.host) contend for its slots, which the
        # contention-free replay cannot express: the discrete-event simulator times such plans
        sim = simulate_plan(plan, workload, cluster)
        step = sim.step_time_s
        busy = dict(sim.busy_s)
    peak_flops = costs.peak_flops
    tokens = plan.global_batch * plan.seq_len
    return Prediction(
        step_time_s=step,
        bubble={m: 1.0 - busy[m] / step for m in plan.rank_mesh},
        peak_memory_bytes=peak, capacity_bytes=cap, stage_time_s=stage_time,
        mfu=workload.step_flops / (step * peak_flops),
        roofline_step_time_s=costs.roofline_step_time(),
        tokens_per_s=tokens / step, samples_per_s=plan.global_batch / step,
        shortfall_bytes=short, synced_s=synced, optimizer_s=opt)
