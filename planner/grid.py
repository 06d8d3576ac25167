"""The practitioners' sweep: the baseline a planner must beat.

A careful engineer (or NeMo's auto-configurator, "NeMo Framework: Auto Configurator", NVIDIA docs;
Megatron-LM's performance guide) does not stop at the shortest pipeline that fits: they sweep a grid
of Megatron-style layouts on one node group and keep the fastest. :func:`grid_sweep` evaluates that
grid in the planner's own replay (:func:`planner.baseline.hand_plan`, so both sides are costed
alike):

- tensor parallel ``t`` in {1, 2, 4, 8} (dividing the node: Megatron keeps TP inside NVLink) that
  can run the model (:func:`ir.shards.layout_problem`: it divides the heads and MLP widths);
- pipeline parallel ``p``: every divisor of the layer blocks that the nodes allow;
- virtual stages ``v`` in {1, 2, 4} (the interleaved 1F1B schedule when ``v > 1``);
- micro-batch size in {1, 2, 4, 8};
- recomputation: none, else full when nothing fits without it (``selective`` is not in the cost
  model: it lies between the two);
- data parallel with the distributed optimizer (ZeRO-1, Megatron-LM) or FSDP (ZeRO-3, torchtitan's
  FSDP x TP), data parallel = the devices left;
- for a mixture of experts, expert parallel ``e`` in {1, 2, 4, ..., 64} dividing the data degree
  and the experts (Megatron-LM's ``--expert-model-parallel-size`` over the data-parallel ranks;
  with the distributed optimizer only, as ``Layout.expert`` is), and with tensor parallel also
  ``e`` dividing data x tensor with the experts not tensor-split (expert tensor parallel 1:
  Megatron-Core's MoE parallel folding, Liu et al. 2025, arXiv:2504.14960, what NVIDIA's MoE
  recipes run).

Configurations that do not fit memory (at ``headroom``) are dropped. Each is one exact replay, so a
sweep costs one prediction per grid point (hundreds to a few thousand: 518 points, 2 s of CPU
for Llama 3 70B on 128 H100). The planner runs the sweep first and searches with its best as the
incumbent (:func:`planner.shapes.search_pipeline`), so its plan is never slower than the grid's.
"""

from __future__ import annotations

import dataclasses

import threading
from dataclasses import dataclass

from ir import Workload, layout_problem
from hardware_profiles.types import Cluster
from planner import construct
from planner.baseline import HandLayout, HandResult, hand_plan
from planner.budget import Budget, _work
from planner.errors import PlannerError

TENSOR = (1, 2, 4, 8)
VIRTUAL = (1, 2, 4)
MICRO_BATCH = (1, 2, 4, 8)
EXPERT = (2, 4, 8, 16, 32, 64)


@dataclass(frozen=True, slots=True)
class GridResult:
    """The fastest grid configuration that fits (``best``; None when none does), and how many
    grid points were evaluated (``evaluated``) and fit memory (``fitting``); ``complete`` is False
    when a work budget ended the sweep early."""

    best: HandResult | None
    evaluated: int
    fitting: int
    complete: bool = True


def grid_layouts(w: Workload, cluster: Cluster, group: str,
                 opts: construct.PlanOptions | None = None) -> list[HandLayout]:
    """Every grid point of :mod:`planner.grid` for node group ``group`` (expert parallel only for
    a workload with experts; recomputation left
    ``"none"``; :func:`grid_sweep` adds full recomputation where a point does not fit). With
    ``opts``, only the points the planner's options allow (schedules, microbatch counts, largest
    tensor-parallel degree, FSDP; its ``virtual_stages`` joins the grid's)."""
    g = cluster.groups[group]
    devices, k = g.num_devices, g.domain_devices     # tensor parallel inside one scale-up fabric
    _, blocks, _ = construct.split_layers(w)
    experts = max(c.experts for c in w.costs.values())
    virtual = VIRTUAL if opts is None else tuple(sorted({*VIRTUAL, opts.virtual_stages}))
    out = []
    for t in (x for x in TENSOR if k % x == 0 and (opts is None or x <= opts.max_tensor)
              and layout_problem(w.shards, x) is None):
        for p in (x for x in range(1, blocks + 1) if blocks % x == 0):
            if devices % (t * p):
                continue
            d = devices // (t * p)
            for v in virtual:
                if (v > 1 and p == 1) or (blocks // p) % v:
                    continue
                for b in MICRO_BATCH:
                    if w.global_batch % (d * b):
                        continue
                    ep = [(1, 0), *((e, 0) for e in EXPERT
                                    if experts and d % e == 0 and experts % e == 0)]
                    if t > 1:       # MoE parallel folding: EP over DP x TP, experts unsplit
                        ep += [(e, 1) for e in EXPERT if experts and (d * t) % e == 0
                               and experts % e == 0 and layout_problem(w.shards, t, e, 1) is None]
                    fsdps = (False, True) if d > 1 and (opts is None or opts.fsdp) else (False,)
                    for fsdp in fsdps:
                        for e, et in (((1, 0),) if fsdp else ep):   # Layout.expert: not with FSDP
                            h = HandLayout(tensor=t, pipeline=p, data=d, virtual_stages=v,
                                           micro_batch=b, fsdp=fsdp, expert=e, expert_tensor=et,
                                           optimizer_state=("fp32" if opts is None
                                                            else opts.optimizer_state))
                            if opts is None or _allowed(h, w, opts):
                                out.append(h)
    return out


def _allowed(h: HandLayout, w: Workload, opts: construct.PlanOptions) -> bool:
    m = w.global_batch // (h.data * h.micro_batch)
    return ((opts.schedules is None or h.schedule in opts.schedules)
            and (opts.microbatches is None or m in opts.microbatches))


def grid_sweep(w: Workload, cluster: Cluster, group: str, headroom: float = 0.1,
               budget: Budget | None = None, opts: construct.PlanOptions | None = None,
               stop: threading.Event | None = None) -> GridResult:
    """The fastest configuration of the practitioners' grid on node group ``group`` of ``cluster``
    that fits memory, each point predicted exactly (:func:`planner.baseline.hand_plan`).

    ``opts`` restricts the grid as :func:`grid_layouts` says. ``budget``, when given, is charged each replay's nominal work (:data:`planner.budget.COSTS`)
    and the sweep stops (``complete`` False) once it is spent, or once ``stop`` is set (Ctrl-C).

    Raises:
        PlannerError: ``group`` is not a node group of ``cluster``.
    """
    if group not in cluster.groups:
        raise PlannerError(f"cluster {cluster.name!r} has no node group {group!r}; fix: use one of "
                           f"{sorted(cluster.groups)}")
    best: HandResult | None = None
    evaluated = fitting = 0
    for layout in grid_layouts(w, cluster, group, opts):
        if (budget is not None and budget.out()) or (stop is not None and stop.is_set()):
            return GridResult(best, evaluated, fitting, complete=False)
        for rc in ("none", "full"):
            try:
                h = hand_plan(w, cluster, _with(layout, rc), group, headroom)
            except PlannerError:
                break                        # the schedule or the nodes refuse these sizes
            evaluated += 1
            if budget is not None:
                budget.charge(_work(h.plan))
            if h.prediction.fits:
                fitting += 1
                if best is None or h.prediction.step_time_s < best.prediction.step_time_s:
                    best = h
                break                        # recomputation only when nothing fits without it
    return GridResult(best, evaluated, fitting)


def _with(layout: HandLayout, recompute: str) -> HandLayout:
    return dataclasses.replace(layout, recompute=recompute)
