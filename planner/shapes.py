"""The shape search: carve node groups into one pipeline's meshes and find its best plan.

For a cluster described as node groups (``hardware_profiles.carve``), a *pipeline* is an ordered
tuple of node groups; a *shape* gives each of them a :class:`~hardware_profiles.carve.GroupShape`
(nodes joined into a mesh: pipeline replicas as the mesh's data axis; nodes split into several
meshes). Each (shape, microbatch count) is a candidate. Its **lower bound** on the step time holds
for every layer partition, layout and schedule (:func:`work_bound`: the busiest mesh must run its
share of the step's work, after which every mesh still syncs gradients), so candidates are
searched best-bound first and the search stops when the next bound is no better than the best plan
found (branch and bound): the gap it reports is against a true lower bound.

A searched candidate runs one CP-SAT solve per schedule family that the candidate allows (the
layer partition and per-mesh layouts, :mod:`planner.search`, with the pipeline order fixed by the
carving so the model is linear); every answer is replayed exactly (:mod:`planner.predict`) and the
fastest that fits memory wins. The expert's hand configuration (:func:`megatron_shape`) is
searched first so that the answer is never worse than it.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from compiler.ir import Plan, Workload
from hardware_profiles.carve import GroupShape, carve
from hardware_profiles.types import Cluster, MeshSpec, NodeGroup
from planner import api
from planner.errors import PlannerError
from planner.predict import Prediction, predict
from planner.search import MeshOption, inflight_count, inflight_end_counts, solve_outcome

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


def megatron_shape(w: Workload, g: NodeGroup, headroom: float) -> list[GroupShape]:
    """The practitioner's hand shapes for one group (Narayanan et al. SC'21, sec. 3.3 and 5):
    tensor parallel across one node, the shortest pipeline whose weights, gradients and optimizer
    state fit, data parallel over the rest. Returned shortest first (one to three shapes), since
    activations may need a longer one."""
    from simulator import cost_model as cm
    from compiler.ir import Layout

    out = []
    for p in _divisors(g.nodes):
        r = g.nodes // p
        lay = Layout(r, g.devices_per_node)
        static = cm.stage_memory(w, 0, len(w.layers), lay, 1.0, False).static_bytes / p
        if static <= g.device.memory_bytes * (1 - headroom) * 0.8:
            out.append(GroupShape(g.name, g.nodes, r, 1))
        if len(out) == 3:
            break
    return out


class Budget:
    """A search budget: nominal seconds of work, counted from what the search did (CP-SAT's
    deterministic time, fragments replayed, bounds refined) so the same inputs stop at the same
    point on any machine, and a wall-clock deadline that cuts a search on a machine too slow to
    spend the nominal budget in time (only then do results depend on the machine).

    The nominal costs (:data:`COSTS`) are this project's 2-core reference machine's seconds.
    """

    def __init__(self, work_s: float, deadline: float, parent: "Budget | None" = None):
        self.work_s, self.deadline, self.parent, self.used = work_s, deadline, parent, 0.0

    def charge(self, nominal_s: float) -> None:
        self.used += nominal_s
        if self.parent is not None:
            self.parent.charge(nominal_s)

    def left(self) -> float:
        """Nominal seconds left (never more than the parent's)."""
        own = self.work_s - self.used
        return own if self.parent is None else min(own, self.parent.left())

    def wall_left(self) -> float:
        return self.deadline - time.monotonic()

    def out(self) -> bool:
        return self.left() <= 0 or self.wall_left() <= 0

    def sub(self, work_s: float) -> "Budget":
        """A child budget of at most ``work_s`` nominal seconds, charged to this one too."""
        return Budget(min(work_s, max(0.0, self.left())), self.deadline, self)


COSTS = {"cpsat": 5.0, "fragment": 1.0e-5, "adaptive": 5e-5, "simulated": 1e-3, "bound": 6e-5,
         "candidate": 8e-4}
"""Nominal seconds per unit of search work, measured on the reference machine (2 cores; timed
per category over four searches of 64-512 devices, 2026-11-23): per second of CP-SAT
deterministic time (3.5-12 s measured), per fragment built and replayed (4e-6 to 2e-5 s), per
fragment of an automatic ZB-1p/2p schedule built (its local search: 4.8e-5 s), per fragment
simulated (meshes sharing a host are timed by the simulator; estimate), per rank and
schedule of a bound refined (5e-5 to 7e-5 s), per candidate enumerated (7e-4 to 9e-4 s)."""


def _fragments(plan: Plan) -> int:
    return sum(len(o) for o in plan.schedule.order)


def _work(plan: Plan) -> float:
    """Nominal seconds of building and replaying ``plan`` (see :data:`COSTS`)."""
    per = COSTS["fragment"] + (COSTS["adaptive"] if plan.schedule.name in api.ADAPTIVE_SCHEDULES else 0.0)
    return per * _fragments(plan)


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

    @property
    def gap(self) -> float | None:
        if self.prediction is None:
            return None
        s = self.prediction.step_time_s
        return max(0.0, (s - self.bound_s) / s)


class _Options:
    """Per-mesh layout options, cached by what they depend on (identical meshes share them)."""

    def __init__(self, w: Workload, opts: api.PlanOptions):
        self.w, self.opts = w, opts

    def get(self, mesh: MeshSpec, samples: float, kinds: tuple[str, ...], split: bool
            ) -> tuple[MeshOption, ...]:
        return api._cached_mesh_options(self.w, mesh, samples, kinds, split, self.opts.headroom,
                                        self.opts.max_tensor, self.opts.fsdp)


Rank = tuple[float, float, tuple[tuple[float, float, float], ...]]
"""A rank for the bound: (fixed step seconds, fixed seconds per microbatch on the chain, ((step
seconds per block, chain seconds per block and microbatch, most blocks that fit memory), ...) per
layout option)."""


def _level(ranks: Sequence[Rank], num_blocks: int, chain: float, per_rank: int = 1,
           comm: Sequence[float] = ()) -> float:
    """The least ``tau`` such that ranks with ``tau >= chain * S_r + cost_r(n_r)`` can hold
    ``num_blocks`` blocks in all, where rank ``r`` holds a whole multiple of ``per_rank`` blocks
    ``n_r`` (its virtual stages hold equal counts) under one option that fits them,
    ``cost_r(n) = fixed step seconds + n x step seconds per block``, and ``S_r`` is the chain time
    of the ranks before ``r`` (fixed chain seconds plus their blocks at the fastest chain seconds
    per block of any rank: a lower bound on it). As ``S_r`` does not depend on which earlier rank
    holds a block and a block costs a rank at least as much step time as it adds to a later rank's
    chain, moving a block to an earlier rank never tightens a constraint: filling ranks greedily
    in order decides feasibility. Bisection on ``tau`` (the greedy total is monotone in it).
    ``comm[r]``: seconds the path spends between rank ``r`` and ``r + 1`` (the forward's and the
    backward's transfers), added to the chain in full.
    """
    fastest = min(c for _, _, opts in ranks for _, c, _ in opts)
    hops = [0.0]
    for r in range(len(ranks) - 1):
        hops.append(hops[-1] + (comm[r] if r < len(comm) and chain > 0 else 0.0))

    prepared = [(hops[r], fixed, fixed_chain,
                 tuple((cost, cap) for cost, _, cap in opts if cost > 0),
                 min((cap for cost, _, cap in opts if cost <= 0), default=-1))
                for r, (fixed, fixed_chain, opts) in enumerate(ranks)]
    floor = math.floor

    def blocks(tau: float) -> int:
        total, s = 0, 0.0
        for hop, fixed, fixed_chain, opts, free_cap in prepared:
            room = tau - chain * s - hop - fixed
            n = 0
            if room > 0:
                for cost, cap in opts:
                    k = floor(room / cost * (1 + 1e-12))
                    k = cap if cap < k else k
                    if k > n:
                        n = k
            if free_cap >= 0 and room >= 0:
                n = max(n, min(free_cap, num_blocks))
            n = int(n) // per_rank * per_rank
            total += n
            s += fixed_chain + n * fastest
        return total
    # bracket: double from the fluid level without memory (a lower bound), then bisect to a
    # relative 1e-7 (the returned lower end is never feasible: a valid bound)
    lo = 0.0
    hi = max(1e-9, sum(f for f, _, _ in ranks) + num_blocks * min(c for _, _, o in ranks for c, _, _ in o)
             / len(ranks))
    worst = (sum(f for f, _, _ in ranks) + num_blocks * max(c for _, _, o in ranks for c, _, _ in o)
             + chain * (sum(fc for _, fc, _ in ranks) + num_blocks * fastest) + hops[-1]) * 2 + 1.0
    while blocks(hi) < num_blocks:
        lo, hi = hi, hi * 2
        if hi > worst:
            if blocks(worst) < num_blocks:
                return math.inf      # no partition fits memory
            hi = worst
            break
    while hi - lo > 1e-7 * hi:
        mid = (lo + hi) / 2
        if blocks(mid) >= num_blocks:
            hi = mid
        else:
            lo = mid
    return lo


def _ranks(options: Sequence[Sequence[MeshOption]], inflight: Sequence[int], virtual_stages: int,
           microbatches: int, *, chain: bool = False, merge: bool = False,
           post_rank: int | None = None, ends: tuple[int, int] = (0, 0)) -> list[Rank]:
    """Per rank, for :func:`_level`. Work ranks (``chain`` False): step cost ``M x T + tail``: fixed
    ``M x`` (overhead, the first rank's pre-block layers, ``post_rank``'s post-block layers), per
    block ``M x block + the tail one more block adds`` (a stage's all-reduce pays its latency once).
    Chain ranks: the rank's critical work between its first forward and its last backward: all its
    fragments except the weight gradients it may still owe after its last backward, at most its
    in-flight count of chunk instances (each W waits on a held activation): per block
    ``M x block - min(M v, in-flight) x W / v``, plus the F and B dispatches; its chain seconds per
    block are F and B (the path through the rank). Memory: the most blocks an
    option holds with ``inflight[r]`` chunk instances of residuals, after the pre/post layers'
    weights and ``ends`` (first, last stage) instances of their residuals on the ranks holding
    them (the CP-SAT model's own memory terms)."""
    out = []
    last = len(options) - 1
    m, v = microbatches, virtual_stages
    for r, opts in enumerate(options):
        split = any(o.block_w_s > 0 for o in opts)
        fixed = min(o.overhead_s for o in opts)
        if chain:
            # on the path: the F and B dispatches only; pre/post layers left out (their weight
            # gradients may be owed after the last backward)
            fixed *= 2 / 3 if split else 1.0
        else:
            if r == 0:
                fixed += min(o.pre_s for o in opts)
            if r == post_rank:           # the layers after the blocks (the LM head)
                fixed += min(o.post_s for o in opts)
        if merge and r == last:          # the last stage's F and B may share one dispatch
            fixed = max(0.0, fixed - max(o.merge_saving_s for o in opts))
        per = []
        owed = min(m * v, inflight[r]) / v
        for o in opts:
            need = o.static_block + inflight[r] * o.resid_block / v
            room = o.capacity - o.working
            if r == 0:                   # the layers before the blocks and their residuals
                room -= o.static_pre + ends[0] * o.resid_pre
            if r == post_rank:           # the layers after them (on the last rank, or the first in a V)
                room -= o.static_post + ends[1] * o.resid_post
            cap = math.inf if need <= 0 else max(0.0, math.floor(room / need))
            if chain:
                per.append((m * o.block_s - owed * o.block_w_s, o.block_s - o.block_w_s, cap))
            else:
                per.append((m * o.block_s + o.tail_marginal_s, o.block_s, cap))
        out.append((m * fixed, fixed, tuple(per)))
    return out


def candidate_bound(work: Sequence[Sequence[MeshOption]], critical: Sequence[Sequence[MeshOption]],
                    microbatches: int, num_blocks: int, chain: float, inflight: Sequence[int],
                    virtual_stages: int = 1, mergeable: bool = False, comm: Sequence[float] = (),
                    post_rank: int | None = None, ends: tuple[int, int] = (0, 0)) -> float:
    """A lower bound on the step time of a pipeline over meshes with these options, seconds,
    valid for every layer partition and layout the CP-SAT model admits (Narayanan et al. SC'21
    sec. 2.2 give the uniform case it generalises).

    - Work: every schedule runs each mesh's fragments one after another, so the step is at
      least the busiest mesh's ``M x T_m`` (``T_m``: its per-microbatch work, ``work`` options: all
      fragment kinds), where a mesh holding ``n`` blocks can only use a layout whose weights,
      gradients, optimizer state and ``inflight`` residuals of ``n`` blocks fit its memory.
    - Chain (``chain > 0``, schedules whose stage ``r`` runs on rank ``r``): rank ``r`` cannot start
      before microbatch 0's forward has crossed ranks ``0..r-1`` and cannot end before the last
      microbatch's backward has crossed them back, so the step is at least
      ``chain x S_r + C_r`` with ``C_r`` its critical work (every fragment but the weight
      gradients it may still owe after its last backward, at most its in-flight count) and ``S_r``
      the F and B time of the ranks before it (``critical`` options are no longer used: kept for
      the signature). ``chain`` is 1 for one stage per rank, ``1/v`` for ``v`` interleaved
      chunks, 1/2 for V-shaped placements (:func:`_chain`).

    Both are minimised over integer partitions (:func:`_level`: whole blocks per rank, a multiple
    of the virtual stages; a water level filled greedily in pipeline order); in the work term
    each mesh also pays, after its last fragment, the end-of-step gradient sync and optimizer time
    of its blocks under the same option (``step >= M x T_m + tail_m``).
    ``inf`` when no partition fits memory. ``comm``: per boundary, the forward plus backward
    transfer seconds on the chain's path; ``post_rank``: the rank holding the post-block layers
    (the last for a line, the first for a V); ``ends``: residual instances of the first and
    last stage their ranks hold (:func:`planner.search.inflight_end_counts`).
    """
    level = _level(_ranks(work, inflight, virtual_stages, microbatches, merge=mergeable,
                          post_rank=post_rank, ends=ends), num_blocks, 0.0, virtual_stages)
    if chain > 0 and level < math.inf:
        level = max(level, _level(_ranks(work, inflight, virtual_stages, microbatches, chain=True,
                                         merge=mergeable, post_rank=post_rank, ends=ends),
                                  num_blocks, chain, virtual_stages, comm))
    return level


_V_SHAPED = ("zb-v", "dualpipe-v")


def _schedules(w: Workload, opts: api.PlanOptions) -> tuple[str, ...]:
    return opts.schedules or (api.TRAIN_SCHEDULES if w.training else ("gpipe",))


def _kinds(sched: str, training: bool) -> tuple[str, ...]:
    return api.fragment_kinds(sched, training)


def _split(sched: str) -> bool:
    return "W" in api.fragment_kinds(sched, True)


def _chain(sched: str, virtual_stages: int) -> float:
    """The chain coefficient of :func:`candidate_bound`: the share of a rank's per-microbatch work
    in the stage that microbatch 0's forward (and the last backward) crosses on its way to a later
    rank: the whole rank with one stage per rank, one chunk of ``v`` interleaved, one of 2 in a V
    (rank ``r``'s first-chunk stage ``r`` lies on the forward path to every later rank, and the
    last microbatch's backward leaves rank ``r`` through it, after all of rank ``r``'s other
    backwards: every generated schedule runs a stage's microbatches in order)."""
    if sched in _V_SHAPED:
        return 0.5
    return 1.0 / virtual_stages if sched == "interleaved-1f1b" else 1.0


def _allowed(sched: str, ranks: int, m: int, num_blocks: int, virtual_stages: int) -> bool:
    return api.schedule_allowed(sched, ranks, m, num_blocks, virtual_stages)


def _pipeline_meshes(cluster: Cluster, shapes: tuple[GroupShape, ...]) -> tuple[Cluster, tuple[str, ...]]:
    lc = carve(cluster, shapes)
    return lc, tuple(lc.meshes)


def quick_bound(work: Sequence[Sequence[MeshOption]], microbatches: int, num_blocks: int) -> float:
    """A cheap lower bound, never above :func:`candidate_bound`: the fluid work bound without
    memory, ``M x tau`` with ``sum_r (tau - f_r) / b_r = L`` left unclamped (a negative term only
    lowers ``tau``)."""
    b = [min(o.block_s for o in x) for x in work]
    f = [min(o.overhead_s for o in x) for x in work]
    f[0] += min(o.pre_s for o in work[0])
    f[-1] = max(0.0, f[-1] - max(o.merge_saving_s for o in work[-1]))
    inv = sum(1.0 / x for x in b if x > 0)
    tau = (num_blocks + sum(fi / bi for fi, bi in zip(f, b) if bi > 0)) / inv if inv else 0.0
    return microbatches * max(0.0, tau)


class _Enumeration:
    """The candidates of one pipeline search, each with a quick bound; full (memory- and
    schedule-aware) bounds computed on demand (:meth:`refine`)."""

    def __init__(self, w: Workload, cluster: Cluster, groups: tuple[str, ...], opts: api.PlanOptions,
                 cache: _Options, nodes: dict[str, int] | None):
        self.w, self.cluster, self.opts, self.cache = w, cluster, opts, cache
        pre, self.nb, post = api._split_layers(w)
        per_group = []
        for gname in groups:
            g = cluster.groups[gname]
            limit = min(MAX_STAGES, self.nb) if len(groups) == 1 else max(1, min(16, self.nb) // len(groups))
            per_group.append(group_shapes(g, limit, (nodes or {}).get(gname)))
        hand = set()
        if len(groups) == 1:
            hand = set(megatron_shape(w, cluster.groups[groups[0]], opts.headroom))
        combos: list[tuple[GroupShape, ...]] = [()]
        for shapes in per_group:
            combos = [c + (s,) for c in combos for s in shapes]
        combos = [c for c in combos if sum(s.num_meshes for s in c) <= min(MAX_STAGES, self.nb)]
        self.scheds = _schedules(w, opts)
        self.lc: dict[tuple[GroupShape, ...], tuple[Cluster, tuple[str, ...]]] = {}
        self.items: list[ShapeCandidate] = []
        for shapes in combos:
            lc, meshes = _pipeline_meshes(cluster, shapes)
            self.lc[shapes] = (lc, meshes)
            specs = [lc.meshes[m] for m in meshes]
            for m in api._microbatch_counts(w, opts, len(meshes)):
                kinds = api.fragment_kinds(self.scheds[0], w.training) if len(self.scheds) == 1 else \
                    (("F", "B") if w.training else ("F",))
                work = [cache.get(x, w.global_batch / m, kinds, "W" in kinds) for x in specs]
                if any(not o for o in work):
                    continue
                self.items.append(ShapeCandidate(shapes, m, quick_bound(work, m, self.nb),
                                                 hand=all(s in hand for s in shapes)))
        self.memo: dict = {}

    def comm(self, shapes: tuple[GroupShape, ...], samples: float) -> tuple[float, ...]:
        """Per boundary of the pipeline: the forward's activation plus the backward's gradient
        transfer of one microbatch, seconds (what :func:`planner.api.make_candidate` charges)."""
        from simulator import cost_model as cm
        lc, meshes = self.lc[shapes]
        pre = api._split_layers(self.w)[0]
        act = self.w.layer(pre).activation_bytes_per_sample * samples
        mult = 2 if self.w.training else 1
        return tuple(mult * cm.transfer_time(act, lc.link_between(a, b).link)
                     for a, b in zip(meshes, meshes[1:]))

    def refine(self, c: ShapeCandidate) -> ShapeCandidate:
        """``c`` with its full bound: per allowed schedule, :func:`candidate_bound`; the candidate's
        bound is the least of them (``inf`` when no schedule fits memory)."""
        w, opts, nb = self.w, self.opts, self.nb
        lc, meshes = self.lc[c.shapes]
        specs = [lc.meshes[x] for x in meshes]
        m, p = c.microbatches, len(meshes)
        samples = w.global_batch / m
        named = []
        for sched in self.scheds:
            if not _allowed(sched, p, m, nb, opts.virtual_stages):
                continue
            if p == 1 and sched != self.scheds[0] and self.scheds[0] == "1f1b":
                continue        # one stage: every schedule runs F, B per microbatch; 1F1B holds least
            if sched in api.ADAPTIVE_SCHEDULES and p * m > ADAPTIVE_MAX_FRAGMENTS:
                continue
            kinds = _kinds(sched, w.training)
            work = [self.cache.get(x, samples, kinds, _split(sched)) for x in specs]
            if any(not o for o in work):
                continue
            crit = ([self.cache.get(x, samples, ("F", "B"), True) for x in specs]
                    if _split(sched) and w.training else work)
            v = opts.virtual_stages if sched == "interleaved-1f1b" else (2 if sched in _V_SHAPED else 1)
            infl = tuple(inflight_count(sched, r, p, m, v) for r in range(p))
            chain = _chain(sched, opts.virtual_stages)
            post_rank = 0 if sched in _V_SHAPED else p - 1
            comm = self.comm(c.shapes, samples)
            # the first/last stage's residual instances (the interleaved schedule's end stages are
            # one chunk of several, which the CP-SAT model over-counts: left out, a bound)
            ends = ((0, 0) if sched == "interleaved-1f1b" or not w.training
                    else inflight_end_counts(sched, p, m, v))
            key = (tuple(id(x) for x in work), m, chain, infl, v, sched in api.MERGEABLE, comm, post_rank,
                   ends)
            if key not in self.memo:
                self.memo[key] = candidate_bound(work, crit, m, nb, chain, infl, v,
                                                 mergeable=sched in api.MERGEABLE and w.training,
                                                 comm=comm, post_rank=post_rank, ends=ends)
            named.append((sched, max(self.memo[key], c.bound_s)))
        named.sort(key=lambda x: x[1])
        return replace(c, bound_s=named[0][1] if named else math.inf, schedule_bounds=tuple(named))


ADAPTIVE_MAX_FRAGMENTS = 512
"""Largest ranks x microbatches for which the automatic ZB-1p/2p are built (their local search
replays the schedule many times; above this the fixed ZB-H1/H2/V patterns stand in)."""


def enumerate_candidates(w: Workload, cluster: Cluster, groups: tuple[str, ...], opts: api.PlanOptions,
                         cache: _Options, nodes: dict[str, int] | None = None) -> list[ShapeCandidate]:
    """Every (shape, microbatch count) of a pipeline over ``groups`` (in that order) with its full
    bound, best first (the hand configurations first)."""
    e = _Enumeration(w, cluster, groups, opts, cache, nodes)
    out = [e.refine(c) for c in e.items]
    out = [c for c in out if c.bound_s < math.inf]
    out.sort(key=lambda c: (not c.hand, c.bound_s))
    return out


def search_pipeline(w: Workload, cluster: Cluster, groups: tuple[str, ...], opts: api.PlanOptions, *,
                    deadline: float, stop: threading.Event | None = None,
                    nodes: dict[str, int] | None = None,
                    progress: Callable[[int, int, float | None], None] | None = None,
                    target_gap: float = TARGET_GAP, budget: Budget | None = None) -> PipelineResult:
    """The best plan of one pipeline over node ``groups`` (in order) for workload ``w``.

    Branch and bound: candidates come off a heap by bound (the practitioner's shapes first); a
    candidate's cheap bound is replaced by its full one before it is searched; the search stops
    when the least bound left is no better than the best plan (every candidate left is pruned),
    or at ``deadline``/``stop``. The result's bound is the least of the best plan's step and every
    unsearched candidate's bound.

    Args:
        deadline: ``time.monotonic()`` at which to stop searching (keeping the best plan so far).
        nodes: use only this many nodes of a group (default: all).
        target_gap: stop once the best plan is within this fraction of the least bound left.
        budget: nominal work budget (:class:`Budget`; default: none beyond ``deadline``).

    Raises:
        PlannerError: a group name the cluster lacks.
    """
    import heapq

    for gname in groups:
        if gname not in cluster.groups:
            raise PlannerError(f"cluster {cluster.name!r} has no node group {gname!r}; use one of "
                               f"{sorted(cluster.groups)}")
    budget = budget or Budget(math.inf, deadline)
    cache = _Options(w, opts)
    e = _Enumeration(w, cluster, groups, opts, cache, nodes)
    budget.charge(COSTS["candidate"] * len(e.items))
    heap = [(not c.hand, c.bound_s, i, False, c) for i, c in enumerate(e.items)]
    heapq.heapify(heap)
    total = len(heap)
    best: tuple[float, Plan, Prediction] | None = None
    searched = solves = 0
    searched_bounds: list[float] = []      # a searched candidate's bound still bounds its plans
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
        heapq.heappop(heap)
        if not full:
            cand = e.refine(cand)
            budget.charge(COSTS["bound"] * len(e.lc[cand.shapes][1]) * max(1, len(cand.schedule_bounds)))
            if cand.bound_s < math.inf:
                heapq.heappush(heap, (unhanded, cand.bound_s, i, True, cand))
            continue
        if progress:
            progress(searched, total, best[0] if best else None)
        lc, meshes = e.lc[cand.shapes]
        table = []
        for sched, sbound in cand.schedule_bounds:
            if best is not None and sbound >= best[0]:
                continue                            # this schedule cannot beat the best plan
            left = min(deadline - time.monotonic(), budget.wall_left())
            if left <= 0 or budget.out() or (stop is not None and stop.is_set()):
                interrupted = True
                break
            got = _solve_schedule(w, lc, meshes, sched, cand.microbatches, opts, cache, left, stop,
                                  best[0] if best else math.inf, budget)
            solves += 1
            if got is None:
                continue
            p, pred = got
            table.append({"schedule": sched, "microbatches": cand.microbatches,
                          "step_time_s": pred.step_time_s if pred.fits else None})
            if pred.fits and (best is None or pred.step_time_s < best[0] * (1 - 1e-9)):
                best = (pred.step_time_s, replace(p, carving=tuple(s.to_json() for s in cand.shapes)), pred)
        if best is not None and best[1].carving == tuple(s.to_json() for s in cand.shapes) \
                and best[1].microbatches == cand.microbatches:
            ranked = sorted(table, key=lambda r: (r["step_time_s"] is None, r["step_time_s"] or 0.0))
            best = (best[0], replace(best[1], schedules=tuple(ranked)), best[2])
        searched += 1
        searched_bounds.append(cand.bound_s)
        if interrupted:
            break
    left_bound = min([h[1] for h in heap] + searched_bounds, default=math.inf)
    if best is None:
        return PipelineResult(None, None, left_bound, searched, total, solves, interrupted)
    return PipelineResult(best[1], best[2], min(left_bound, best[0]), searched, total, solves, interrupted)


POLISH_MAX_FRAGMENTS = 256
"""Largest ranks x microbatches whose CP-SAT answer is polished on the exact replay (each
neighbour costs one replay)."""
POLISH_ROUNDS = 8
POLISH_WITHIN = 1.10
"""Only answers within this factor of the best plan so far are polished."""
POLISH_PAIR_MESHES = 4
"""Up to this many meshes, a block move is also tried together with a layout change of one of the
two meshes it touches."""


def _solve_schedule(w: Workload, lc: Cluster, meshes: tuple[str, ...], sched: str, m: int,
                    opts: api.PlanOptions, cache: _Options, left: float,
                    stop: threading.Event | None, incumbent: float = math.inf,
                    budget: Budget | None = None) -> tuple[Plan, Prediction] | None:
    """One CP-SAT solve of a carved pipeline for one schedule, polished on the exact replay
    (:func:`_polish`); the plan and its prediction."""
    o = replace(opts, fixed_order=True, schedules=(sched,), microbatches=(m,))
    cand = api.make_candidate(w, lc, meshes, sched, m, o)
    if cand is None:
        return None
    budget = budget or Budget(math.inf, time.monotonic() + left)
    det = max(0.01, min(1.0, budget.left() / COSTS["cpsat"]))
    out = solve_outcome(cand, time_limit_s=max(0.05, min(left, 10.0)), seed=opts.seed,
                        workers=opts.workers, deterministic_limit=det, stop=stop)
    budget.charge(COSTS["cpsat"] * out.deterministic_s)
    if out.assignment is None:
        return None
    a = out.assignment
    p, pred = _evaluate(w, lc, a, sched, m, cand.virtual_stages, opts)
    budget.charge(_work(p))
    simulated = any(lc.meshes[x].host for x in meshes)   # predict runs the simulator: costly
    if simulated:
        budget.charge(COSTS["simulated"] * _fragments(p))
    elif _plans_in(cand) <= EXACT_MAX_PLANS and len(meshes) * m <= EXACT_MAX_FRAGMENTS:
        a, p, pred = _exhaustive(w, lc, cand, a, p, pred, sched, m, opts, budget)
    elif len(meshes) * m <= POLISH_MAX_FRAGMENTS and _score(pred) <= POLISH_WITHIN * incumbent:
        a, p, pred = _polish(w, lc, cand, a, p, pred, sched, m, opts, time.monotonic() + left, budget)
    solver = {"status": a.status, "objective": a.objective_s, "bound": a.bound_s,
              "gap": (a.objective_s - a.bound_s) / a.objective_s if a.objective_s else 0.0,
              "wall_s": a.wall_s}
    return replace(p, predicted=pred.to_json(), solver=solver), pred


EXACT_MAX_PLANS = 2000
"""Candidates with at most this many (partition, layouts, merge) plans are searched exhaustively
on the exact replay after CP-SAT (small pipelines: the brute-force test's instances)."""
EXACT_MAX_FRAGMENTS = 64


def _compositions(n: int, k: int):
    """Every way to give ``k`` ranks at least one of ``n`` blocks each, in order."""
    import itertools
    for cut in itertools.combinations(range(1, n), k - 1):
        edges = (0,) + cut + (n,)
        yield tuple(b - a for a, b in zip(edges, edges[1:]))


def _plans_in(cand) -> int:
    p = len(cand.meshes)
    per = cand.num_blocks // cand.virtual_stages
    return (math.comb(per - 1, p - 1) * math.prod(len(o) for o in cand.options)
            * (2 if cand.mergeable else 1)) if per >= p else 0


def _exhaustive(w, lc, cand, a, p, pred, sched, m, opts, budget):
    """The best of every plan of a small candidate on the exact replay (CP-SAT's answer first)."""
    import itertools
    best = (_score(pred), a, p, pred)
    per = cand.num_blocks // cand.virtual_stages
    for blocks in _compositions(per, len(cand.meshes)):
        for picks in itertools.product(*cand.options):
            for merge in ((False, True) if cand.mergeable else (False,)):
                na = replace(a, blocks=blocks, layouts=tuple(x.layout for x in picks),
                             recompute=tuple(x.recompute for x in picks), merge=merge)
                np_, npred = _evaluate(w, lc, na, sched, m, cand.virtual_stages, opts)
                budget.charge(_work(np_))
                if _score(npred) < best[0] * (1 - 1e-12):
                    best = (_score(npred), na, np_, npred)
    return best[1], best[2], best[3]


def _evaluate(w, lc, a, sched, m, v, opts):
    p = api.build_plan(w, lc, a, sched, m, v)
    return p, predict(p, w, lc, headroom=opts.headroom)


def _score(pred: Prediction) -> float:
    return pred.step_time_s if pred.fits else math.inf


def _polish(w, lc, cand, a, p, pred, sched, m, opts, deadline: float = math.inf,
            budget: Budget | None = None):
    """Steepest descent on the exact replay from CP-SAT's answer: move one block between
    neighbouring stages, switch one mesh to another of its layout options, or toggle the last
    stage's F+B merge, while the replayed
    step improves (the surrogate CP-SAT minimises is not the replay; this closes the difference on
    small pipelines, where the test brute-forces the space)."""
    picks = [next(k for k, o in enumerate(cand.options[i])
                  if o.layout == a.layouts[i] and o.recompute == a.recompute[i])
             for i in range(len(a.order))]
    best = (_score(pred), a, p, pred)
    for _ in range(POLISH_ROUNDS):
        cur = best[1]
        moves = []
        blocks = list(cur.blocks)
        for i in range(len(blocks) - 1):
            for d in (1, -1):
                nb = list(blocks)
                nb[i] -= d
                nb[i + 1] += d
                if min(nb) >= 1:
                    moves.append((tuple(nb), picks))
                    # with a layout change on either mesh (memory may need both at once)
                    for j in ((i, i + 1) if len(blocks) <= POLISH_PAIR_MESHES else ()):
                        for k in range(len(cand.options[j])):
                            if k != picks[j]:
                                moves.append((tuple(nb), picks[:j] + [k] + picks[j + 1:]))
        for i, opts_i in enumerate(cand.options):
            for k in range(len(opts_i)):
                if k != picks[i]:
                    moves.append((tuple(blocks), picks[:i] + [k] + picks[i + 1:]))
        merges = [(tuple(blocks), picks, not cur.merge)] if cand.mergeable else []
        improved = None
        for nb, pk, mg in [(b, k, cur.merge) for b, k in moves] + merges:
            if time.monotonic() >= deadline or (budget is not None and budget.out()):
                break
            na = replace(cur, blocks=nb, layouts=tuple(cand.options[i][k].layout for i, k in enumerate(pk)),
                         recompute=tuple(cand.options[i][k].recompute for i, k in enumerate(pk)), merge=mg)
            np_, npred = _evaluate(w, lc, na, sched, m, cand.virtual_stages, opts)
            if budget is not None:
                budget.charge(_work(np_))
            if _score(npred) < best[0] * (1 - 1e-12) and (improved is None or _score(npred) < improved[0]):
                improved = (_score(npred), na, np_, npred, pk)
        if improved is None:
            break
        best = improved[:4]
        picks = list(improved[4])
    return best[1], best[2], best[3]
