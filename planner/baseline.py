"""The practitioner's hand configuration of one node group, evaluated by the same cost model.

Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC'21), sec. 3.3 and 5: tensor parallel across the GPUs of one node (8), the
shortest pipeline whose stages fit memory, data parallel over the remaining nodes, a small
microbatch (1 or 2 samples per pipeline replica) with as many microbatches per pipeline as the
batch gives, 1F1B or the interleaved schedule, layers split evenly, activation recomputation only
when the stages do not fit without it. :func:`megatron_plans` builds each such plan over a carved
node group and :func:`best_megatron` returns the fastest that fits: the bar the planner must clear.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from compiler.ir import Layout, Plan, Workload
from hardware_profiles.carve import GroupShape, carve
from hardware_profiles.types import Cluster
from planner import api
from planner.predict import Prediction, predict
from planner.search import Assignment

MICROBATCH_SIZES = (1, 2)
"""Samples per microbatch per pipeline replica (Narayanan et al. use 1 and 2, Table 1 and sec. 5.5)."""
SCHEDULES = ("1f1b", "interleaved-1f1b")


@dataclass(frozen=True, slots=True)
class HandResult:
    plan: Plan
    prediction: Prediction
    label: str


def _even(blocks: int, ranks: int) -> tuple[int, ...]:
    base, extra = divmod(blocks, ranks)
    return tuple(base + (1 if r < extra else 0) for r in range(ranks))


def megatron_plans(w: Workload, cluster: Cluster, group: str, headroom: float = 0.1,
                   virtual_stages: int = 2) -> list[HandResult]:
    """Every hand configuration of ``group`` at the shortest pipeline depth where one fits memory
    (each predicted exactly); empty when none fits."""
    g = cluster.groups[group]
    pre, nb, post = api._split_layers(w)
    for p in [d for d in range(1, g.nodes + 1) if g.nodes % d == 0 and d <= nb]:
        r = g.nodes // p
        shape = GroupShape(group, g.nodes, r, 1)
        lc = carve(cluster, [shape])
        meshes = tuple(lc.meshes)
        out = []
        for b in MICROBATCH_SIZES:
            if w.global_batch % (r * b):
                continue
            m = w.global_batch // (r * b)
            for sched in SCHEDULES:
                v = virtual_stages if sched == "interleaved-1f1b" else 1
                if not api.schedule_allowed(sched, p, m, nb, v) or (v > 1 and p == 1):
                    continue
                blocks = _even(nb // v, p) if nb % v == 0 else None
                if blocks is None or min(blocks) < 1:
                    continue
                fit = None
                for rc in (False, True):
                    a = Assignment(order=meshes, blocks=blocks, layouts=(Layout(r, g.devices_per_node),) * p,
                                   recompute=(rc,) * p, merge=False, status="HAND", objective_s=0.0,
                                   bound_s=0.0, wall_s=0.0)
                    plan = api.build_plan(w, lc, a, sched, m, v)
                    pred = predict(plan, w, lc, headroom=headroom)
                    if pred.fits:
                        fit = HandResult(replace(plan, carving=(shape.to_json(),), predicted=pred.to_json()),
                                         pred, f"tp{g.devices_per_node} pp{p} dp{r} mb{b} {sched}"
                                         + (" recompute" if rc else ""))
                        break
                if fit is not None:
                    out.append(fit)
        if out:
            return out
    return []


def best_megatron(w: Workload, cluster: Cluster, group: str, headroom: float = 0.1) -> HandResult | None:
    """The fastest of :func:`megatron_plans`, or None when no hand configuration fits."""
    plans = megatron_plans(w, cluster, group, headroom)
    return min(plans, key=lambda h: h.prediction.step_time_s) if plans else None
