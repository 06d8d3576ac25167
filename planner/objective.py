"""Plan for cost, or for throughput within a budget, on part of a cluster.

The fastest plan on every device is not what a buyer of cloud time asks for. Sailor (Strati et
al., "Sailor: Automating Distributed Training over Dynamic, Heterogeneous, and Geo-distributed
Clusters", SOSP 2025, arXiv:2504.17096) plans for the two questions they do ask, and so does
:func:`plan`:

- ``Goal("cost", min_tokens_per_s=F)``: the lowest cost per step (USD) among plans reaching ``F``
  tokens per second;
- ``Goal("time", max_usd_per_hour=B)``: the shortest step among plans whose devices cost at most
  ``B`` USD per hour.

Both pick how many nodes of each group to use. The candidates are **sub-clusters**: every node
group at all, half or a quarter of its nodes (whole nodes, at least one), or left out, each
planned by :func:`planner.shaping.shape_and_plan` (which may itself use fewer nodes). A plan's cost counts
the devices its carving uses, at the cluster file's ``price_usd_per_device_hour`` (else the
middle of the device profile's range).

Sub-clusters are searched best bound first and pruned by bounds, as the shape search is: no plan
on a sub-cluster steps faster than its FLOP bound (:func:`planner.shaping.flop_bound`), so its
throughput is at most ``tokens / bound``, and (with every device paid for) its cost per step
at least ``price per second x bound``. A sub-cluster whose bound cannot reach the floor, cannot
beat the best plan found, or (budget) whose price is over it is never planned. The whole cluster
is planned first (when its price is within the budget), on :data:`WHOLE_SHARE` of
``--time-limit``, as the incumbent; each other
sub-cluster then gets an equal share of the time left (nominal seconds, so the split does not
depend on the machine's load).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from itertools import product
from typing import Any, Callable

from ir import DataParallelPlan, Plan, Workload
from hardware_profiles.carve import node_groups_of
from hardware_profiles.types import Cluster, NodeGroup
from planner import api, construct
from planner.errors import InfeasibleError, PlannerError
from planner.shaping import achievable_flops, flop_bound, shape_and_plan
from ir.vocab import GOALS
from simulator import cost_model as cm

WHOLE_SHARE = 0.4
"""Share of ``--time-limit`` for the whole cluster's plan, searched first as the incumbent that the
plans on parts of the cluster must beat (on an equal share of the time a part could otherwise win
only because the whole cluster's search was cut short)."""
FRACTIONS = (1.0, 0.5, 0.25)
"""Shares of a node group's nodes a sub-cluster may use (and 0: the group left out)."""


@dataclass(frozen=True, slots=True)
class Goal:
    """What the plan optimises.

    Attributes:
        kind: ``"time"`` (shortest step) or ``"cost"`` (lowest USD per step).
        min_tokens_per_s: a throughput floor, tokens per second (None: none).
        max_usd_per_hour: a budget: the plan's devices cost at most this, USD per hour (None: none).
    """

    kind: str = "time"
    min_tokens_per_s: float | None = None
    max_usd_per_hour: float | None = None

    @property
    def plain(self) -> bool:
        """The default goal: the fastest plan on the whole cluster, no floor and no budget."""
        return self.kind == "time" and self.min_tokens_per_s is None and self.max_usd_per_hour is None


def group_price(g: NodeGroup) -> float:
    """USD per device-hour of node group ``g``: the cluster file's price, else the middle of the
    device profile's range.

    Raises:
        PlannerError: neither is known.
    """
    if g.price_per_device_hour is not None:
        return g.price_per_device_hour
    if g.device.price_per_hour is not None:
        lo, hi = g.device.price_per_hour
        return (lo + hi) / 2
    raise PlannerError(f"node group {g.name!r} ({g.device.name}) has no price; fix: set "
                       f"price_usd_per_device_hour on the group in the cluster file")


def used_devices(plan: Plan | DataParallelPlan, cluster: Cluster) -> dict[str, int]:
    """Devices of each node group that ``plan``'s carving uses (every part's, for a data-parallel
    plan)."""
    parts = plan.parts if isinstance(plan, DataParallelPlan) else (plan,)
    out: dict[str, int] = {}
    for p in parts:
        for shape in p.carving:
            g = cluster.groups[shape["group"]]
            out[g.name] = out.get(g.name, 0) + int(shape["nodes"]) * g.devices_per_node
    return out


def usd_per_hour(plan: Plan | DataParallelPlan, cluster: Cluster) -> float:
    """What the devices ``plan`` uses cost, USD per hour."""
    return sum(group_price(cluster.groups[g]) * n for g, n in used_devices(plan, cluster).items())


def sub_clusters(cluster: Cluster) -> list[Cluster]:
    """Every sub-cluster of :data:`FRACTIONS` of each group's nodes (or none of them), at least
    one group used, distinct."""
    names = tuple(cluster.groups)
    choices = []
    counts: list[int] | tuple[int, ...]     # a group's counts, then one count per group
    for g in cluster.groups.values():
        counts = sorted({max(1, math.ceil(g.nodes * f)) for f in FRACTIONS}, reverse=True)
        choices.append(counts + ([0] if len(names) > 1 else []))
    out = []
    for counts in product(*choices):
        if not any(counts):
            continue
        groups = {n: replace(cluster.groups[n], nodes=c) for n, c in zip(names, counts) if c}
        out.append(replace(cluster, groups=groups,
                           group_links=tuple(ln for ln in cluster.group_links
                                             if ln.a in groups and ln.b in groups)))
    return out


def halved(cluster: Cluster) -> Cluster | None:
    """``cluster`` with each node group at half its nodes (rounded up, at least one); None when
    every group is down to one node."""
    if all(g.nodes <= 1 for g in cluster.groups.values()):
        return None
    return replace(cluster, groups={n: replace(g, nodes=max(1, math.ceil(g.nodes / 2)))
                                    for n, g in cluster.groups.items()})


def _on_fewer_nodes(w: Workload, cluster: Cluster, opts: construct.PlanOptions,
                    stop: threading.Event | None, whole: InfeasibleError) -> api.PlanResult:
    """The fastest plan on the largest half, quarter, ... of every node group's nodes, when no
    plan occupies the whole cluster (``whole``): a global batch too small for it (each pipeline
    needs a sample per data-parallel replica and a microbatch per stage, and every mesh's layout
    must use its devices) leaves some nodes idle, as a practitioner would. Node-group clusters
    (and listings of whole nodes) only; each try searches on ``opts.time_limit_s / 2``. The plan's
    carving records the nodes it uses, which the CLI prints ("of N nodes").

    Raises:
        InfeasibleError: ``whole``, when the weights do not fit the whole cluster (fewer nodes
            cannot help), the cluster lists meshes, or no part of it has a plan either.
    """
    grouped = cluster if cluster.groups else node_groups_of(cluster)
    if grouped is None or opts.meshes or "does not fit" in str(whole):
        raise whole
    sub = halved(grouped)
    while sub is not None and not (stop is not None and stop.is_set()):
        try:
            r = shape_and_plan(w, sub, replace(opts, time_limit_s=max(0.5, opts.time_limit_s / 2)),
                               None, stop=stop)
        except InfeasibleError:
            sub = halved(sub)
            continue
        used, whole_n = (sum(g.num_devices for g in c.groups.values()) for c in (sub, grouped))
        why = (f"at most {used} of {whole_n} devices: no plan occupies every node at global "
               f"batch {w.global_batch}")
        p = r.plan
        if isinstance(p, DataParallelPlan):
            p = replace(p, reason=f"{why}; {p.reason}" if p.reason else why)
        else:
            p = replace(p, search=replace(p.search, reason=f"{why}; {p.search.reason}"
                                          if p.search.reason else why))
        return replace(r, plan=p)
    raise whole


def plan(w: Workload, cluster: Cluster, opts: construct.PlanOptions = construct.PlanOptions(),
         progress: Callable[[int, int, float | None], None] | None = None, *, goal: Goal = Goal(),
         stop: threading.Event | None = None) -> api.PlanResult:
    """The planner's one entry point: the plan that best meets ``goal`` (default: the shortest
    step on the whole cluster) on ``cluster`` or on part of it (see the module docstring).

    Args:
        w: the model's workload. cluster: the cluster (node groups or a listing of meshes).
        opts: search options (budget, schedules, microbatches, layouts).
        progress: called ``(done, total, best_s)`` as candidates are searched.
        goal: what to optimise (:class:`Goal`). stop: set to end the search early, keeping the best
            plan found.

    Returns:
        The plan and its prediction (:class:`planner.api.PlanResult`). The plan's ``search.goal`` records the goal, its cost and every sub-cluster
    tried.

    Raises:
        PlannerError: a bad goal, a node group without a price, or no plan that meets the floor
            or the budget (the message gives the best figure reached and the fix).
        InfeasibleError: the model fits no sub-cluster.
    """
    if goal.kind not in GOALS:
        raise PlannerError(f"goal {goal.kind!r}; fix: use one of {list(GOALS)}")
    for name, v in (("min_tokens_per_s", goal.min_tokens_per_s), ("max_usd_per_hour", goal.max_usd_per_hour)):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise PlannerError(f"{name} {v!r}; fix: give a positive number")
    if goal.plain:
        try:
            return shape_and_plan(w, cluster, opts, progress, stop=stop)
        except InfeasibleError as whole:
            return _on_fewer_nodes(w, cluster, opts, stop, whole)
    if not cluster.groups:
        cluster = node_groups_of(cluster) or cluster     # a listing of whole nodes: its node groups
    if not cluster.groups or opts.meshes:
        raise PlannerError(f"cluster {cluster.name!r} lists meshes that are not whole nodes of one kind: "
                           f"a plan for {goal.kind} or within a budget picks how many nodes to use; fix: "
                           f"describe the hardware under 'node_groups'")
    tokens = w.global_batch * w.seq_len
    cands = []
    for sub in sub_clusters(cluster):
        bound = flop_bound(w, sub, tuple(sub.groups))
        if goal.min_tokens_per_s is not None and tokens / bound < goal.min_tokens_per_s:
            continue                       # even its FLOP bound misses the floor
        if goal.max_usd_per_hour is not None and min(
                group_price(g) * g.devices_per_node for g in sub.groups.values()) > goal.max_usd_per_hour:
            continue                       # not even one node of it fits the budget
        if goal.kind == "cost":            # the best price per FLOP/s among its kinds, on all the FLOP
            key = w.step_flops * min(group_price(g) / 3600 / (achievable_flops(sub, (g.name,), w) / g.num_devices)
                                     for g in sub.groups.values())
        else:
            key = bound
        cands.append((key, sum(g.num_devices for g in sub.groups.values()), sub))
    cands.sort(key=lambda c: (c[0], c[1]))
    tried: list[dict[str, Any]] = []
    best = None                            # (value, result, usd/h)
    spent = 0.0

    def consider(sub: Cluster, share: float
                 ) -> tuple[float | None, tuple[api.PlanResult, float] | None] | None:
        """Plan ``sub`` on ``share`` nominal seconds, record it, and return (its value when it
        meets the goal else None, the result); the result is None when it fits nowhere, and the
        whole is None when Ctrl-C ended the search."""
        nodes = {g.name: g.nodes for g in sub.groups.values()}
        try:
            r = shape_and_plan(w, sub, replace(opts, time_limit_s=max(0.5, share)), None, stop=stop,
                               prove=False)
        except InfeasibleError:
            tried.append({"nodes": nodes, "step_time_s": None, "usd_per_step": None, "why": "does not fit"})
            return None, None
        except api.PlanInterrupted:
            return None
        step = r.prediction.step_time_s
        usd_h = usd_per_hour(r.plan, cluster)
        ok_floor = goal.min_tokens_per_s is None or tokens / step >= goal.min_tokens_per_s
        ok_budget = goal.max_usd_per_hour is None or usd_h <= goal.max_usd_per_hour
        tried.append({"nodes": nodes, "step_time_s": step, "tokens_per_s": tokens / step,
                      "usd_per_hour": usd_h, "usd_per_step": usd_h * step / 3600,
                      "why": "meets the goal" if ok_floor and ok_budget
                      else "below the floor" if not ok_floor else "over the budget"})
        value = (usd_h * step / 3600 if goal.kind == "cost" else step) if ok_floor and ok_budget else None
        return value, (r, usd_h)

    # the whole cluster first, on a fixed share: the incumbent every part of it must beat
    def incumbent(sub: Cluster) -> bool:
        return sub.num_devices == cluster.num_devices and (
            goal.max_usd_per_hour is None
            or sum(group_price(g) * g.num_devices for g in sub.groups.values()) <= goal.max_usd_per_hour)
    order = sorted(cands, key=lambda c: not incumbent(c[2]))
    for i, (key, devices, sub) in enumerate(order):
        if stop is not None and stop.is_set():
            break
        if best is not None and key >= best[0]:
            continue
        if i == 0 and incumbent(sub):
            share = opts.time_limit_s * WHOLE_SHARE
        else:
            share = (opts.time_limit_s - spent) / sum(1 for c in order[i:] if best is None or c[0] < best[0])
        spent += share
        got = consider(sub, share)
        if got is None:
            break                          # Ctrl-C
        value, res = got
        if value is not None and (best is None or value < best[0]):
            assert res is not None         # a value comes with its result
            best = (value, *res)
        if progress:
            progress(i + 1, len(order), best[1].prediction.step_time_s if best else None)
        if res is not None and res[0].interrupted:
            break
    n_planned = len(tried)
    if best is None:
        reached = max((t["tokens_per_s"] for t in tried if t.get("tokens_per_s")), default=None)
        asked = ([f"reaches {goal.min_tokens_per_s:,.0f} tokens/s"] if goal.min_tokens_per_s is not None else []) \
            + ([f"costs at most USD {goal.max_usd_per_hour:g} per hour"] if goal.max_usd_per_hour is not None else [])
        what = " and ".join(asked)
        if not tried and not cands:
            raise PlannerError(f"no part of cluster {cluster.name!r} {what}, even at its FLOP bound; fix: "
                               f"lower --min-throughput or raise --max-usd-per-hour")
        if not any(t["step_time_s"] for t in tried):
            raise InfeasibleError(f"model {w.model!r} fits no part of cluster {cluster.name!r} that "
                                  f"could meet the goal; add nodes or lower --global-batch")
        raise PlannerError(f"no plan found on cluster {cluster.name!r} that {what} (the fastest "
                           f"reached {reached or 0:,.0f} tokens/s); fix: lower --min-throughput, raise "
                           f"--max-usd-per-hour or raise --time-limit")
    value, r, usd_h = best
    record = {"kind": goal.kind, "min_tokens_per_s": goal.min_tokens_per_s,
              "max_usd_per_hour": goal.max_usd_per_hour, "usd_per_hour": usd_h,
              "usd_per_step": usd_h * r.prediction.step_time_s / 3600,
              "devices": used_devices(r.plan, cluster), "sub_clusters": len(cands),
              "planned": n_planned, "tried": tried}
    plan = replace(r.plan, search=replace(r.plan.search, goal=record))
    return replace(r, plan=plan)
