"""The shape search: carve node groups into one pipeline's meshes and find its best plan.

For a cluster described as node groups (``hardware_profiles.carve``), a *pipeline* is an ordered
tuple of node groups; a *shape* gives each of them a :class:`~hardware_profiles.carve.GroupShape`
(nodes joined into a mesh: pipeline replicas as the mesh's data axis; nodes split into several
meshes). Each (shape, microbatch count) is a candidate. Its **lower bound** on the step time holds
for every layer partition, layout and schedule (:mod:`planner.bounds`), so candidates are searched
best-bound first and the search stops when the least bound left is within :data:`TARGET_GAP` of
the best plan found (branch and bound): the gap it reports is against a true lower bound.

A searched candidate runs one CP-SAT solve per schedule whose own bound can still win
(:func:`planner.candidate.solve_schedule`: the layer partition and per-mesh layouts, with the
pipeline order fixed by the carving so the model is linear, then the exact replay); the fastest
that fits memory wins. The practitioner's shapes (:func:`megatron_shape`) are searched first. The
search spends a deterministic work budget (:class:`planner.budget.Budget`).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, NamedTuple

from hardware_profiles.carve import GroupShape, carve
from hardware_profiles.types import Cluster, MeshSpec, NodeGroup
from planner import construct
from planner.errors import PlannerError
from planner.bounds import _ranks, candidate_bound, chain_share, quick_bound, straggler_shares
from planner.dag_bound import MAX_FRAGMENTS, kept_fragments, order_bound
from planner.budget import COSTS, Budget
from planner.candidate import solve_schedule
from planner.inflight import inflight_count, inflight_end_counts, rank_order_counts
from planner.options import _cached_mesh_options
from simulator.stage_cost import StageCost
import heapq
from ir import FragmentKind, Layout, Plan, Prediction, Workload
from simulator import cost_model as cm
from simulator.schedules import KINDS, kind

MAX_STAGES = 64
TARGET_GAP = 0.01
"""A pipeline search stops once its best plan is proven within this fraction of the optimum."""
"""Longest pipeline a shape may have (meshes in one pipeline)."""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def group_shapes(g: NodeGroup, max_meshes: int, nodes: int | None = None) -> list[GroupShape]:
    """Every shape of ``g`` (or of its first ``nodes`` nodes) with at most ``max_meshes`` meshes:
    ``nodes_per_mesh`` dividing the nodes, ``meshes_per_node`` dividing the node's devices."""
    used = g.nodes if nodes is None else nodes
    out = []
    for r in _divisors(used):
        for s in _divisors(g.devices_per_node):
            sh = GroupShape(g.name, used, r, s)
            if sh.num_meshes <= max_meshes:
                out.append(sh)
    return out


def megatron_shape(w: Workload, g: NodeGroup, headroom: float,
                   optimizer_state: str = "fp32") -> list[GroupShape]:
    """The practitioner's hand shapes for one group (Narayanan et al. SC'21, sec. 3.3 and 5):
    tensor parallel across one node, the shortest pipeline whose weights, gradients and optimizer
    state (in ``optimizer_state``, :attr:`ir.Layout.optimizer_state`) fit, data parallel over the
    rest. Returned shortest first (one to three shapes), since activations may need a longer one."""
    out = []
    for p in _divisors(g.nodes):
        r = g.nodes // p
        lay = Layout(r, g.devices_per_node, optimizer_state=optimizer_state)
        static = cm.stage_memory(w, 0, len(w.layers), lay, 1.0, False).static_bytes / p
        if static <= g.device.memory_bytes * (1 - headroom) * 0.8:
            out.append(GroupShape(g.name, g.nodes, r, 1))
        if len(out) == 3:
            break
    return out


@dataclass(frozen=True, slots=True)
class ShapeCandidate:
    """One (shape, microbatch count) of a pipeline, with its lower bound (seconds)."""

    shapes: tuple[GroupShape, ...]
    microbatches: int
    bound_s: float
    hand: bool = False      # the practitioner's configuration (searched first)
    schedule_bounds: tuple[tuple[str, float], ...] = ()
    """(schedule, its own lower bound) for every schedule the candidate allows, best first."""


@dataclass(frozen=True, slots=True)
class PipelineResult:
    """The best plan of a pipeline search.

    Attributes:
        plan / prediction: the fastest plan that fits memory (None when none was found).
        bound_s: a true lower bound on the step time of every candidate (seconds).
        searched / total: candidates searched / enumerated.
        solves: CP-SAT solves run.
        interrupted: the time limit or ``stop`` ended the search before the bound did.
    """

    plan: Plan | None
    prediction: Prediction | None
    bound_s: float
    searched: int
    total: int
    solves: int
    interrupted: bool
    open: tuple[tuple[float, int, str | None, bool], ...] = ()
    """What holds the bound below the plan: (bound, candidate index, schedule, exact) for every
    searched candidate's schedule (``exact``: its optimum, which no bound can raise) and (bound,
    index, None, False) for every candidate left unsearched, all below the plan's step."""
    enumeration: Enumeration | None = field(default=None, compare=False, repr=False)
    """The search's :class:`Enumeration` (for :func:`prove`)."""

    @property
    def gap(self) -> float | None:
        if self.prediction is None:
            return None
        s = self.prediction.step_time_s
        return max(0.0, (s - self.bound_s) / s)


class Pending(NamedTuple):
    """A candidate waiting in the search's heap, ordered as the search takes them: the
    Megatron-style hand shapes first, then the least bound, then enumeration order."""

    unhanded: bool
    bound_s: float
    item: int
    """Its index in the enumeration."""
    refined: int
    """0: its quick bound only; 1: its full closed-form bounds; 2: its dependence graphs' too."""
    candidate: ShapeCandidate


class Open(NamedTuple):
    """What holds a searched pipeline's bound below its plan (:func:`prove`'s heap): a bound,
    the candidate's index, the schedule (None: a candidate left unsearched, all its schedules)
    and how far it is raised (2: as far as the proof goes)."""

    bound_s: float
    item: int
    schedule: str | None
    level: int


class OptionCache:
    """Per-mesh layout options, cached by what they depend on (identical meshes share them)."""

    def __init__(self, w: Workload, opts: construct.PlanOptions):
        self.w, self.opts = w, opts

    def get(self, mesh: MeshSpec, samples: float, kinds: tuple[str, ...], split: bool,
            hidden: bool = False, budget: Budget | None = None) -> tuple[StageCost, ...]:
        """The options, with the layout choices costed to get them (none when cached) charged to
        ``budget``."""
        got, costed = _cached_mesh_options(self.w, mesh, samples, kinds, split, self.opts.headroom,
                                           self.opts.max_tensor, self.opts.fsdp, hidden,
                                           self.opts.context, self.opts.optimizer_state)
        if budget is not None and costed:
            budget.charge(COSTS["option"] * costed)
        return got


def _schedules(w: Workload, opts: construct.PlanOptions) -> tuple[str, ...]:
    return opts.schedules or (construct.SEARCHED_SCHEDULES if w.training else ("gpipe",))


def _kinds(sched: str, training: bool) -> tuple[str, ...]:
    return construct.fragment_kinds(sched, training)


def _split(sched: str) -> bool:
    return FragmentKind.W in construct.fragment_kinds(sched, True)

def _allowed(sched: str, ranks: int, m: int, num_blocks: int, virtual_stages: int) -> bool:
    return construct.schedule_allowed(sched, ranks, m, num_blocks, virtual_stages)


def _pipeline_meshes(cluster: Cluster, shapes: tuple[GroupShape, ...]) -> tuple[Cluster, tuple[str, ...]]:
    lc = carve(cluster, shapes)
    return lc, tuple(lc.meshes)

class Enumeration:
    """The candidates of one pipeline search, each with a quick bound; full (memory- and
    schedule-aware) bounds computed on demand (:meth:`refine`)."""

    def __init__(self, w: Workload, cluster: Cluster, groups: tuple[str, ...], opts: construct.PlanOptions,
                 cache: OptionCache, nodes: dict[str, int] | None, budget: Budget | None = None):
        self.w, self.cluster, self.opts, self.cache = w, cluster, opts, cache
        pre, self.nb, post = construct.split_layers(w)
        per_group = []
        for gname in groups:
            g = cluster.groups[gname]
            limit = min(MAX_STAGES, self.nb) if len(groups) == 1 else max(1, min(16, self.nb) // len(groups))
            per_group.append(group_shapes(g, limit, (nodes or {}).get(gname)))
        hand = set()
        if len(groups) == 1:
            hand = set(megatron_shape(w, cluster.groups[groups[0]], opts.headroom,
                                      opts.optimizer_state))
        shapes: list[GroupShape] | tuple[GroupShape, ...]   # a group's shapes, then one combination's
        combos: list[tuple[GroupShape, ...]] = [()]
        for shapes in per_group:
            combos = [c + (s,) for c in combos for s in shapes]
        combos = [c for c in combos if sum(s.num_meshes for s in c) <= min(MAX_STAGES, self.nb)]
        self.scheds = _schedules(w, opts)
        hides = any(kind(s).hides_alltoall for s in self.scheds)
        self.lc: dict[tuple[GroupShape, ...], tuple[Cluster, tuple[str, ...]]] = {}
        self.items: list[ShapeCandidate] = []
        for shapes in combos:
            lc, meshes = _pipeline_meshes(cluster, shapes)
            self.lc[shapes] = (lc, meshes)
            specs = [lc.meshes[m] for m in meshes]
            for m in construct.microbatch_counts(w, opts, len(meshes)):
                kinds = construct.fragment_kinds(self.scheds[0], w.training) if len(self.scheds) == 1 else \
                    ((FragmentKind.F, FragmentKind.B) if w.training else (FragmentKind.F,))
                # a bound over every schedule: the all-to-alls hidden if any schedule hides them
                work = [cache.get(x, w.global_batch / m, kinds, FragmentKind.W in kinds, hides, budget)
                        for x in specs]
                if any(not o for o in work):
                    continue
                self.items.append(ShapeCandidate(shapes, m, quick_bound(work, m, self.nb),
                                                 hand=all(s in hand for s in shapes)))
        self.memo: dict[tuple[object, ...], float] = {}
        self.graphed: set[int] = set()
        """Indices of ``items`` whose schedules' bounds were raised by :meth:`refine_orders`."""
        self.full: set[int] = set()
        """Indices of ``items`` whose bound is the full one (:meth:`refine`), kept in ``items``
        so that a search and a bound (:mod:`planner.split_bound`) share the work."""

    def refine_item(self, i: int, budget: Budget | None) -> ShapeCandidate:
        """``items[i]`` refined (:meth:`refine`), stored back, and charged to ``budget``."""
        if i not in self.full:
            c = self.refine(self.items[i], budget)
            if budget is not None:
                budget.charge(COSTS["bound"] * len(self.lc[c.shapes][1]) * max(1, len(c.schedule_bounds)))
            self.items[i] = c
            self.full.add(i)
        return self.items[i]

    def transfer(self, shapes: tuple[GroupShape, ...], samples: float, a: int, b: int) -> float:
        """Seconds one microbatch's boundary activation (or its gradient) takes from pipeline
        rank ``a`` to rank ``b`` of ``shapes`` (what :func:`planner.construct.make_candidate` charges)."""
        lc, meshes = self.lc[shapes]
        pre = construct.split_layers(self.w)[0]
        act = self.w.layer(pre).activation_bytes_per_sample * samples
        return cm.transfer_time(act, lc.link_between(meshes[a], meshes[b]).link)

    def comm(self, shapes: tuple[GroupShape, ...], samples: float) -> tuple[float, ...]:
        """Per boundary of the pipeline: the forward's activation plus the backward's gradient
        transfer of one microbatch, seconds (what :func:`planner.construct.make_candidate` charges)."""
        mult = 2 if self.w.training else 1
        return tuple(mult * self.transfer(shapes, samples, r, r + 1)
                     for r in range(len(self.lc[shapes][1]) - 1))

    def _schedule_inputs(self, c: ShapeCandidate, sched: str, budget: Budget | None
                         ) -> tuple[list[tuple[StageCost, ...]], int, tuple[int, ...], tuple[int, int]]:
        """Per rank of ``c`` under ``sched``: its layout options (all fragment kinds), the
        stages per rank ``v``, the in-flight counts, and the first/last stage's residual
        instances (an interleaved schedule's end stages are one chunk of several, which the
        CP-SAT model over-counts: left out, a bound)."""
        w = self.w
        lc, meshes = self.lc[c.shapes]
        m, p = c.microbatches, len(meshes)
        sk = kind(sched)
        work = [self.cache.get(lc.meshes[x], w.global_batch / m, _kinds(sched, w.training),
                               _split(sched), sk.hides_alltoall, budget) for x in meshes]
        v = sk.stages_per_rank(self.opts.virtual_stages)
        infl = tuple(inflight_count(sched, r, p, m, v) for r in range(p))
        interleaved = v > 1 and not sk.v_shaped
        ends = (0, 0) if interleaved or not w.training else inflight_end_counts(sched, p, m, v)
        return work, v, infl, ends

    def refine(self, c: ShapeCandidate, budget: Budget | None = None) -> ShapeCandidate:
        """``c`` with its full bound: per allowed schedule, :func:`candidate_bound`; the candidate's
        bound is the least of them (``inf`` when no schedule fits memory). The layout options it
        costs are charged to ``budget``."""
        w, opts, nb = self.w, self.opts, self.nb
        lc, meshes = self.lc[c.shapes]
        specs = [lc.meshes[x] for x in meshes]
        m, p = c.microbatches, len(meshes)
        samples = w.global_batch / m
        slow = straggler_shares(specs) if w.training else ()
        named = []
        for sched in self.scheds:
            if not _allowed(sched, p, m, nb, opts.virtual_stages):
                continue
            if p == 1 and sched != self.scheds[0] and self.scheds[0] == "1f1b":
                continue        # one stage: every schedule runs F, B per microbatch; 1F1B holds least
            if kind(sched).adaptive and p * m > ADAPTIVE_MAX_FRAGMENTS:
                continue
            sk = kind(sched)
            work, v, infl, ends = self._schedule_inputs(c, sched, budget)
            if any(not o for o in work):
                continue
            crit = ([self.cache.get(x, samples, (FragmentKind.F, FragmentKind.B), True, sk.hides_alltoall,
                                    budget)
                     for x in specs]
                    if _split(sched) and w.training else work)
            chain = chain_share(sched, opts.virtual_stages)
            post_rank = 0 if sk.v_shaped else p - 1
            comm = self.comm(c.shapes, samples)
            orders = rank_order_counts(sched, p, m) if w.training and p > 1 else None
            key = (tuple(id(x) for x in work), m, chain, infl, v, sched in construct.MERGEABLE, comm,
                   post_rank, ends, slow, sched in SYNC_EXPOSED, orders)
            if key not in self.memo:
                self.memo[key] = candidate_bound(work, crit, m, nb, chain, infl, v,
                                                 mergeable=sched in construct.MERGEABLE and w.training,
                                                 comm=comm, post_rank=post_rank, ends=ends,
                                                 straggler=slow, sync_exposed=sched in SYNC_EXPOSED,
                                                 v_shaped=sk.v_shaped, orders=orders,
                                                 every_rank=True)
            named.append((sched, max(self.memo[key], c.bound_s)))
        named.sort(key=lambda x: x[1])
        return replace(c, bound_s=named[0][1] if named else math.inf, schedule_bounds=tuple(named))

    def refine_orders(self, c: ShapeCandidate, best: float, budget: Budget,
                      integer: bool = False) -> ShapeCandidate:
        """``c`` with each schedule's bound raised to its dependence graph's
        (:func:`planner.dag_bound.order_bound`), for the schedules whose bound is below ``best``
        (the others cannot win either way) and whose program costs at most
        :data:`GRAPH_SHARE` of the work left (a small budget goes to searching instead); charged to
        ``budget`` per fragment. ``integer``: the graph as a mixed-integer program instead (its
        dual bound within :data:`INTEGER_NODES` nodes: one layout and whole blocks per rank), within
        :data:`INTEGER_MAX_FRAGMENTS` and the budget left."""
        w = self.w
        lc, meshes = self.lc[c.shapes]
        specs = [lc.meshes[x] for x in meshes]
        m, p = c.microbatches, len(meshes)
        samples = w.global_batch / m
        hops: dict[tuple[int, int], float] = {}

        def hop(a: int, b: int) -> float:
            if (a, b) not in hops:
                hops[(a, b)] = self.transfer(c.shapes, samples, a, b)
            return hops[(a, b)]
        named = []
        for sched, sbound in c.schedule_bounds:
            sk = kind(sched)
            v = sk.stages_per_rank(self.opts.virtual_stages)
            frags = kept_fragments(p, v, m)
            cost = COSTS["fragment"] * 8 * frags            # the linear program
            if integer:
                fits = frags <= INTEGER_MAX_FRAGMENTS and cost <= budget.left()
            else:
                fits = frags <= MAX_FRAGMENTS and cost <= GRAPH_SHARE * budget.left()
            if sbound < best and p > 1 and fits:
                key = ("integer" if integer else "order", c.shapes, m, sched)
                if key not in self.memo:
                    work, _, infl, ends = self._schedule_inputs(c, sched, budget)
                    ranks = _ranks(work, infl, v, m, post_rank=0 if sk.v_shaped else p - 1,
                                   ends=ends)
                    caps = [[x[2] for x in rank[2]] for rank in ranks]
                    budget.charge(cost)

                    def afford(nonzeros: int) -> bool:
                        # the integer program, charged by its size (its time grows with it)
                        more = COSTS["integer_nonzero"] * nonzeros
                        if more > budget.left():
                            return False
                        budget.charge(more)
                        return True
                    self.memo[key] = order_bound(sched, work, caps, m, self.nb, v,
                                                 0 if sk.v_shaped else p - 1, hop,
                                                 straggler_shares(specs),
                                                 sched in construct.MERGEABLE and w.training, infl,
                                                 nodes=INTEGER_NODES if integer else 0, afford=afford)
                sbound = max(sbound, self.memo[key])
            named.append((sched, sbound))
        named.sort(key=lambda x: x[1])
        return replace(c, bound_s=named[0][1] if named else math.inf, schedule_bounds=tuple(named))


GRAPH_SHARE = 0.05
"""Most of a search's work left that one dependence-graph bound may cost (nominal seconds)."""

INTEGER_MAX_FRAGMENTS = 1600
"""Largest dependence graph (kept fragments) bounded as a mixed-integer program (:func:`prove`;
about 6 s of HiGHS at this size)."""

INTEGER_NODES = 200
"""Branch-and-bound nodes HiGHS may explore for that bound (its dual bound then; the root node
costs most of the time: gpt3-175b on 16,384 H100, ZB-V on 16 ranks, 1,536 kept fragments: root
0.854 s in 4.6 s, 200 nodes 0.886 s in 6.1 s, 2026-11-27)."""

SYNC_EXPOSED = tuple(n for n, k in KINDS.items() if k.sync_exposed)
"""Schedules whose ranks hold one stage each and end on their last microbatch's backward (B):
their gradient sync's excess over that B is a bound term (:func:`planner.bounds.candidate_bound`)."""

DIVE_SHARE = 0.3
"""A search that has no plan when this share of its budget is left searches its best fully
bounded candidate out of the bound order (:func:`search_pipeline`): a mixed pipeline's cheap
bounds are far below its full ones, and refining them all could spend the whole budget."""

ADAPTIVE_MAX_FRAGMENTS = 512
"""Largest ranks x microbatches for which the automatic ZB-1p/2p are built (their local search
replays the schedule many times; above this the fixed ZB-H1/H2/V patterns stand in)."""


def search_pipeline(w: Workload, cluster: Cluster, groups: tuple[str, ...], opts: construct.PlanOptions, *,
                    deadline: float, stop: threading.Event | None = None,
                    nodes: dict[str, int] | None = None,
                    progress: Callable[[int, int, float | None], None] | None = None,
                    target_gap: float = TARGET_GAP, budget: Budget | None = None,
                    incumbent: tuple[Plan, Prediction] | None = None,
                    graph_bounds: bool = True, enumeration: Enumeration | None = None) -> PipelineResult:
    """The best plan of one pipeline over node ``groups`` (in order) for workload ``w``.

    Branch and bound: candidates come off a heap by bound (the practitioner's shapes first); a
    candidate's cheap bound is replaced by its full one, then (training, ``graph_bounds``) each
    schedule's by its dependence graph's (:meth:`Enumeration.refine_orders`), before it is
    searched; the search stops
    when the least bound left is no better than the best plan (every candidate left is pruned),
    or at ``deadline``/``stop``. The result's bound is the least of the best plan's step and every
    unsearched candidate's bound.

    Args:
        deadline: ``time.monotonic()`` at which to stop searching (keeping the best plan so far).
        nodes: use only this many nodes of a group (default: all).
        target_gap: stop once the best plan is within this fraction of the least bound left.
        budget: nominal work budget (:class:`Budget`; default: none beyond ``deadline``).
        incumbent: a plan of the same pipeline that fits memory, and its prediction (e.g. the
            practitioners' grid's best, :mod:`planner.grid`): the search starts from it, prunes
            every candidate whose bound cannot beat it, and returns it when nothing beats it.
        graph_bounds: refine the bounds by the schedules' dependence graphs (a linear program per
            candidate and schedule, charged to ``budget``).
        enumeration: the candidates of the same pipeline and workload, some bounds already
            refined (:class:`planner.split_bound.PartBound`): used instead of enumerating again.

    Raises:
        PlannerError: a group name the cluster lacks.
    """
    for gname in groups:
        if gname not in cluster.groups:
            raise PlannerError(f"cluster {cluster.name!r} has no node group {gname!r}; use one of "
                               f"{sorted(cluster.groups)}")
    budget = budget or Budget(math.inf, deadline)
    if enumeration is not None:
        e = enumeration
    else:
        e = Enumeration(w, cluster, groups, opts, OptionCache(w, opts), nodes, budget)
        budget.charge(COSTS["candidate"] * len(e.items))
    heap = [Pending(not c.hand, c.bound_s, i, int(i in e.full), c) for i, c in enumerate(e.items)]
    heapq.heapify(heap)
    total = len(heap)
    best: tuple[float, Plan, Prediction] | None = None
    if incumbent is not None and incumbent[1].fits:
        best = (incumbent[1].step_time_s, incumbent[0], incumbent[1])
    searched = solves = 0
    searched_bounds: list[float] = []      # a searched candidate's bound still bounds its plans
    opened: list[tuple[float, int, str, bool]] = []
    interrupted = False
    while heap:
        unhanded, bound, i, full, cand = heap[0]
        if best is not None and unhanded:
            least = min([bound] + searched_bounds)
            if (best[0] - least) <= target_gap * best[0]:
                break                               # proven within the target gap
        if best is not None and bound >= best[0]:
            if unhanded:
                break                               # the least bound left cannot beat the best plan
            heapq.heappop(heap)                     # a hand shape that cannot beat it: pruned
            continue
        if budget.out() or time.monotonic() >= deadline or (stop is not None and stop.is_set()):
            interrupted = True
            break
        top = 2 if w.training and graph_bounds else 1
        first = None
        if (best is None and budget.left() <= DIVE_SHARE * budget.work_s
                and any(h.refined >= top for h in heap)):
            # no plan yet and the budget nearly spent: search the best fully bounded candidate
            # now, out of the bound order (the search then ends with a plan; the proof is unchanged)
            first = min((k for k, h in enumerate(heap) if h.refined >= top), key=lambda k: heap[k].bound_s)
        if first is not None:
            unhanded, bound, i, full, cand = heap[first]
            heap[first] = heap[-1]
            heap.pop()
            heapq.heapify(heap)
        else:
            heapq.heappop(heap)
        if not full:
            cand = e.refine_item(i, budget)
            if cand.bound_s < math.inf:
                heapq.heappush(heap, Pending(unhanded, cand.bound_s, i, 1, cand))
            continue
        if full == 1 and w.training and graph_bounds:
            # the schedules' own dependence graphs, for those that can still win
            cand = e.refine_orders(cand, best[0] if best is not None else math.inf, budget)
            if cand.bound_s < math.inf:
                heapq.heappush(heap, Pending(unhanded, cand.bound_s, i, 2, cand))
            continue
        if progress:
            progress(searched, total, best[0] if best else None)
        lc, meshes = e.lc[cand.shapes]
        table = []
        # what this candidate's plans can be no faster than, per schedule: its bound, or its
        # optimum where the exhaustive search covered every plan of it
        proven = [sb for _, sb in cand.schedule_bounds]
        for k, (sched, sbound) in enumerate(cand.schedule_bounds):
            if best is not None and sbound >= best[0]:
                continue                            # this schedule cannot beat the best plan
            left = min(deadline - time.monotonic(), budget.wall_left())
            if left <= 0 or budget.out() or (stop is not None and stop.is_set()):
                interrupted = True
                break
            got = solve_schedule(w, lc, meshes, sched, cand.microbatches, opts, left, stop,
                                 best[0] if best else math.inf, budget)
            solves += 1
            if got is None:
                continue
            p, pred, exact = got
            if exact:
                proven[k] = max(sbound, pred.step_time_s if pred.fits else math.inf)
            table.append({"schedule": sched, "microbatches": cand.microbatches,
                          "step_time_s": pred.step_time_s if pred.fits else None})
            if pred.fits and (best is None or pred.step_time_s < best[0] * (1 - 1e-9)):
                best = (pred.step_time_s, replace(p, carving=tuple(s.to_json() for s in cand.shapes)), pred)
        if best is not None and best[1].carving == tuple(s.to_json() for s in cand.shapes) \
                and best[1].microbatches == cand.microbatches:
            ranked = sorted(table, key=lambda r: (r["step_time_s"] is None, r["step_time_s"] or 0.0))
            best = (best[0], replace(best[1], schedules=tuple(ranked)), best[2])
        searched += 1
        searched_bounds.append(min(proven, default=cand.bound_s))
        opened += [(b, i, sched, b > sb) for (sched, sb), b in zip(cand.schedule_bounds, proven)]
        if interrupted:
            break
    left_bound = min([h[1] for h in heap] + searched_bounds, default=math.inf)
    if best is None:
        return PipelineResult(None, None, left_bound, searched, total, solves, interrupted)
    held = tuple(sorted([x for x in opened if x[0] < best[0]]
                        + [(h[1], h[2], None, False) for h in heap if h[1] < best[0]]))
    return PipelineResult(best[1], best[2], min(left_bound, best[0]), searched, total, solves, interrupted,
                          held, e)


def prove(r: PipelineResult, budget: Budget, target_gap: float = TARGET_GAP) -> PipelineResult:
    """``r`` with its bound raised, after its search, by what the search had no budget for: from
    the least of what holds it below the plan (:attr:`PipelineResult.open`) up, each schedule's
    dependence-graph bound, then the same graph as a mixed-integer program (one layout and whole
    blocks per rank: :meth:`Enumeration.refine_orders`), until the gap is within
    ``target_gap``, the least can be raised no further, or ``budget`` is spent. The plan is
    unchanged."""
    e = r.enumeration
    if r.prediction is None or e is None or not r.open:
        return r
    best = r.prediction.step_time_s
    heap = [Open(b, i, sched, 2 if exact else 0) for b, i, sched, exact in r.open]
    heapq.heapify(heap)
    while heap and heap[0].bound_s < best * (1 - target_gap) and heap[0].level < 2 and not budget.out():
        b, i, sched, _ = heapq.heappop(heap)
        if sched is None:                   # a candidate left unsearched: all its schedules
            c = e.refine_item(i, budget)
            c = e.refine_orders(e.refine_orders(c, best, budget), best, budget, integer=True)
            for name, sb in c.schedule_bounds:
                heapq.heappush(heap, Open(sb, i, name, 2))
            continue
        one = replace(e.items[i], schedule_bounds=((sched, b),))
        one = e.refine_orders(e.refine_orders(one, best, budget), best, budget, integer=True)
        heapq.heappush(heap, Open(max(b, one.bound_s), i, sched, 2))
    least = min([h.bound_s for h in heap] + [best])
    return replace(r, bound_s=max(r.bound_s, least))
