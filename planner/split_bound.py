"""Lower bounds on the step time of heterogeneous data-parallel splits.

A heterogeneous cluster's plan (:mod:`planner.shaping`) is one group alone, one pipeline through
every group, or a data-parallel split: parts (each one pipeline, through one group or several)
each run a share of the global batch (whole granules of ``q`` samples), then the gradients are
all-reduced across the parts before the optimizer. Its step is at least every part's own step at
its share plus the cross-part all-reduce, so a split's step is no shorter than

    min over shares (b_1, ..., b_k) of  max_p L_p(b_p) + sync,

where ``L_p(b)`` is a lower bound on part ``p``'s step at batch ``b``: the least full bound
(:meth:`planner.shapes.Enumeration.refine`) over every candidate of its pipeline search at that
batch, never below its work bound (:func:`planner.bounds.work_bound`, linear in the batch).

:class:`PartBound` computes ``L_p`` lazily: a share's candidates are refined cheapest first, only
until the least bound left passes the level asked about (:meth:`PartBound.at_least`), and resumed
where they stopped when asked again. :func:`split_bound` solves the min-max over the envelopes
``min_{b' >= b} L_p(b')`` (a lower bound on ``L_p(b)``, monotone in ``b``), then refines each
part's largest share that the level admits, until those shares' bounds are exact, or the bound
reaches ``cap`` (a split that cannot beat the best plan needs no tighter bound), or the budget is
spent. Every value on the way is a valid lower bound.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import replace

from ir import Workload
from hardware_profiles.types import Cluster
from planner import construct
from planner.bounds import work_bound
from planner.budget import COSTS, Budget
from planner.shapes import Enumeration, OptionCache


class PartBound:
    """Lower bounds on one part's step time (seconds) as a function of its batch share.

    Args:
        w: the workload at the full global batch (shares replace its batch).
        groups: the part's node groups, in pipeline order.

    Every method that works takes the nominal work budget it charges (:class:`Budget`).
    """

    def __init__(self, w: Workload, cluster: Cluster, groups: tuple[str, ...], opts: construct.PlanOptions):
        self.w, self.cluster, self.groups, self.opts = w, cluster, groups, opts
        self.per_sample = work_bound(replace(w, global_batch=1), cluster, groups)
        self.enums: dict[int, Enumeration] = {}
        self.known: dict[int, float] = {}
        self.exact: set[int] = set()
        self.graph = False
        """Refine bounds by the schedules' dependence graphs too (dearer; set after a search)."""

    def enumeration(self, b: int, budget: Budget) -> Enumeration:
        """The part's pipeline candidates at batch ``b`` (enumerated once, charged to ``budget``);
        a search of the same part and batch takes them with the bounds refined so far."""
        if b not in self.enums:
            wb = replace(self.w, global_batch=b)
            e = Enumeration(wb, self.cluster, self.groups, self.opts, OptionCache(wb, self.opts),
                            None, budget)
            budget.charge(COSTS["candidate"] * len(e.items))
            self.enums[b] = e
        return self.enums[b]

    def value(self, b: int) -> float:
        """The best lower bound known on the part's step at batch ``b`` (no work done)."""
        return max(self.known.get(b, 0.0), self.per_sample * b)

    def at_least(self, b: int, level: float, budget: Budget) -> float:
        """A lower bound on the part's step at batch ``b``, refined (cheapest candidate first:
        its full bound, then, with :attr:`graph`, its schedules' dependence graphs') until it
        exceeds ``level`` or is exact (the least such bound of every candidate); stops early when
        ``budget`` is out."""
        if b in self.exact or self.value(b) > level or (b not in self.enums and budget.out()):
            return self.value(b)
        e = self.enumeration(b, budget)
        top = 2 if self.graph and self.w.training else 1
        heap = [(c.bound_s, i, 2 if i in e.graphed else int(i in e.full)) for i, c in enumerate(e.items)]
        heapq.heapify(heap)
        while heap and heap[0][0] <= level and heap[0][2] < top and not budget.out():
            _, i, got = heapq.heappop(heap)
            if got == 0:
                c = e.refine_item(i, budget)
            else:
                c = e.refine_orders(e.items[i], level * (1 + 1e-9), budget)
                e.items[i] = c
                e.graphed.add(i)
            if c.bound_s < math.inf:
                heapq.heappush(heap, (c.bound_s, i, got + 1))
        least = heap[0][0] if heap else math.inf
        if not heap or heap[0][2] >= top:
            self.exact.add(b)
        self.known[b] = max(self.known.get(b, 0.0), least)
        return self.value(b)


def _level(values: list[list[float]], units: int) -> tuple[float, list[int]]:
    """The least ``T`` at which shares of ``units`` granules exist with every part's envelope at
    most ``T``, and each part's largest admitted share (granules) at that ``T``.
    ``values[p][u - 1]``: part ``p``'s bound at ``u`` granules."""
    env = []
    for row in values:
        e, low = [0.0] * len(row), math.inf
        for u in range(len(row) - 1, -1, -1):
            low = min(low, row[u])
            e[u] = low
        env.append(e)

    def admitted(t: float) -> list[int]:
        return [max((u + 1 for u, x in enumerate(e) if x <= t), default=0) for e in env]

    levels = sorted({x for e in env for x in e})
    lo, hi = 0, len(levels) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        got = admitted(levels[mid])
        if min(got) >= 1 and sum(got) >= units:
            hi = mid
        else:
            lo = mid + 1
    t = levels[lo]
    got = admitted(t)
    if min(got) < 1 or sum(got) < units:
        return math.inf, got
    return t, got


def split_bound(parts: list[PartBound], batch: int, q: int, sync_s: float, budget: Budget,
                cap: float = math.inf) -> float:
    """A lower bound on the step of the data-parallel split of ``batch`` over ``parts`` in shares of
    ``q`` samples (each part at least one granule), plus the cross-part all-reduce ``sync_s``
    (seconds); refined lazily (see the module docstring) until exact, at least ``cap``, or the
    ``budget`` is spent."""
    units = batch // q
    k = len(parts)
    if units < k:
        return math.inf
    span = units - (k - 1)
    while True:
        values = [[p.value(u * q) for u in range(1, span + 1)] for p in parts]
        t, got = _level(values, units)
        if t + sync_s >= cap or t == math.inf:
            return t + sync_s
        todo = [(p, g) for p, g in zip(parts, got) if g * q not in p.exact]
        if not todo or budget.out():
            return t + sync_s
        for p, g in todo:
            p.at_least(g * q, t, budget)
