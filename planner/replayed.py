"""The final prediction: the discrete-event replay of the plans the search chooses between.

The search ranks candidates by the analytic replay (:func:`planner.predict.predict`: each
fragment starts when its rank is free and its inputs have arrived), which is exact while links
are not contended. The discrete-event simulator (:func:`simulator.plan_sim.simulate_any`) also
queues the transfers that share a link, a send stream or a receive stream (FIFO), as ``mpmd
simulate`` does; it can only add delay, so the analytic step (and every bound below it) stays a
lower bound of the replayed one. On a plan whose stage boundaries carry much traffic the two
differ: an OPT-350M cost plan on 80 A100 in five 16-GPU meshes, 0.625 s analytic and 0.786 s
replayed. So the drivers choose among their final alternatives on the replay
(:func:`rank_by_replay`, exact: the analytic step bounds the replayed one from below) and the
plan they return carries the replay's step: "predicted" is what ``mpmd simulate`` of the written JSON
prints, by construction.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence, TypeVar

from ir import DataParallelPlan, Plan, Prediction, Workload
from hardware_profiles.types import Cluster
from simulator.plan_sim import plan_cluster, simulate_any

__all__ = ["rank_by_replay", "replayed"]

T = TypeVar("T")


def replayed(plan: Plan | DataParallelPlan, pred: Prediction, w: Workload, cluster: Cluster
             ) -> Prediction:
    """``pred`` with the step time, bubbles, MFU and throughput of the discrete-event replay of
    ``plan`` on ``cluster`` (the cluster the planner was given, carved as the plan records:
    :func:`simulator.plan_sim.plan_cluster`); memory figures stay the analytic ones. A plan on
    one mesh moves nothing between meshes and keeps ``pred`` (the two agree).

    Raises:
        simulator.plan_costs.CostError: the plan does not match the workload or cluster (a
            planner bug: it made the plan from them).
    """
    meshes = ({m for part in plan.parts for m in part.rank_mesh} if isinstance(plan, DataParallelPlan)
              else set(plan.rank_mesh))
    if len(meshes) == 1:
        return pred
    sim = simulate_any(plan, w, plan_cluster(plan, cluster))
    step = sim.step_time_s
    scale = pred.step_time_s / step
    return replace(pred, step_time_s=step,
                   bubble={m: sim.bubble.get(m, b) for m, b in pred.bubble.items()},
                   mfu=pred.mfu * scale, tokens_per_s=pred.tokens_per_s * scale,
                   samples_per_s=pred.samples_per_s * scale)


def rank_by_replay(items: Sequence[T], plan_of: Callable[[T], tuple[Plan | DataParallelPlan, Prediction]],
                   w: Workload, cluster: Cluster) -> list[tuple[Prediction, T]]:
    """The best of ``items`` on the step ``mpmd simulate`` will print, first, then the others
    replayed on the way, in order of their replayed step: ``items`` are taken in order of their
    analytic step and replayed (:func:`replayed`) until the next analytic step is no shorter
    than the best replayed one (a replay only adds delay to its analytic step, so none after it
    can win). Ties keep the analytic order.

    Raises:
        ValueError: ``items`` is empty.
    """
    if not items:
        raise ValueError("rank_by_replay: no items")
    out: list[tuple[Prediction, T]] = []
    for it in sorted(items, key=lambda x: plan_of(x)[1].step_time_s):
        plan, pred = plan_of(it)
        if out and pred.step_time_s >= min(p.step_time_s for p, _ in out):
            break
        out.append((replayed(plan, pred, w, cluster), it))
    order = sorted(range(len(out)), key=lambda i: (out[i][0].step_time_s, i))
    return [out[i] for i in order]
