"""Plan a cluster described as node groups: the planner shapes the cluster.

:func:`plan` is the planner's entry point. A cluster of node groups is shaped here, and so is a
cluster file that lists meshes when they are whole nodes of one kind per group (read as the node
groups they describe: :func:`hardware_profiles.carve.node_groups_of`). Any other listing, one whose
file says ``carve: fixed``, or a search over meshes the user names (``PlanOptions.meshes``) goes
to the mesh-level search (:func:`planner.api.plan_meshes`). Shaping:

1. **One group alone** (:func:`planner.shapes.search_pipeline`): its nodes carved into a pipeline
   of stage meshes (nodes joined as the data axis = pipeline replicas, or split), every schedule,
   branch and bound on a true lower bound. The practitioners' grid (:func:`planner.grid.grid_sweep`,
   the layouts an engineer sweeps) is replayed first on at most :data:`GRID_SHARE` of the work
   and its best seeds the search as the incumbent: the plan is never slower than the grid's, and
   the grid's step prunes every candidate whose bound cannot beat it.
2. **Heterogeneous data parallel**: the groups split into parts, each part one pipeline (through
   one group, or a mixed pipeline through several) on a share of the global batch (whole
   microbatches; shares first those that would balance the parts' measured rates, then moved a
   granule at a time from the part that finishes last while the step improves), gradients all-reduced across
   the parts over the links between groups (:func:`cross_sync`) before the optimizer. Subsets
   that leave groups out are tried too.
3. **One mixed pipeline** over all groups (stage meshes of different kinds in one pipeline, the
   groups ordered by device memory, the largest first since the first stage holds the most
   activations in flight).

The fastest wins; the result says which and why. The reported bound is a true lower bound: for one
group, the search's own (every candidate's bound); for several, the least over the options the
search covers (:func:`_space_bound`): each group alone's and the one pipeline's search bound, and
each data-parallel split's (:mod:`planner.split_bound`: the min-max over batch shares of its
parts' bounds plus the cross-part all-reduce), refined after the search up to the plan's step on
:data:`BOUND_SHARE` of ``--time-limit``; never below the time in which the groups' devices,
working side by side, could run every layer of every sample at the least device-seconds the cost
model charges it on their kind (:func:`planner.bounds.work_bound`, a linear program) nor the
batch's model FLOP over the sum of every device's achievable FLOP/s.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, replace
from itertools import combinations
from typing import Callable, Iterable, Iterator, NamedTuple, cast

from ir import DataParallelPlan, Layout, Plan, PlanFamily, Prediction, SearchReport, Workload
from hardware_profiles.carve import BOTH_READINGS_MESHES, node_groups_of, read_with_topology
from hardware_profiles.collectives import ring_all_reduce
from hardware_profiles.types import Cluster, Link
from planner import api, construct
from planner.replayed import rank_by_replay
from planner.errors import InfeasibleError
from planner.bounds import work_bound
from planner.budget import Budget
from planner.grid import GridResult, grid_sweep
from planner.budget import WALL_FACTOR, WORK_SHARE
from planner.shapes import PipelineResult, search_pipeline
from planner.shapes import prove as prove_bound
from planner.split_bound import PartBound, split_bound
from simulator import cost_model as cm


GRID_SHARE = 0.25
"""Most of a one-group pipeline search's work that the practitioners' grid may take (it needs
about 2 s of CPU for Llama 3 70B on 128 H100, under 10% of the default budget)."""

ALONE_SHARE = 0.35
"""Share of a heterogeneous search's work for the groups alone (their plans give the rates that
seed the data-parallel shares)."""

SPLITS_SHARE = 0.6
"""Share of the work left after the groups alone for the data-parallel splits; the one pipeline
through every group gets the rest."""

ONE_GROUP_GAP = 0.01
"""A one-group search's target gap (its pipeline search's, and its bound's after it)."""

BOUND_SHARE = 0.5
"""Nominal work for a search's bound after its plan is chosen, as a share of ``--time-limit``
(one group: :func:`planner.shapes.prove`; several: :func:`_space_bound`, the data-parallel
splits' and the one pipeline's bounds refined up to the plan's step)."""

class Found(NamedTuple):
    """A configuration that found a plan: its replayed step, its label, and the pipeline
    search's result or the data-parallel plan with its prediction."""

    step_s: float
    label: str
    result: "PipelineResult | tuple[DataParallelPlan, Prediction]"


@dataclass(frozen=True, slots=True)
class Option:
    """One configuration tried: a label, its parts' (groups, batch share), its step time."""

    label: str
    parts: tuple[tuple[tuple[str, ...], int], ...]
    step_time_s: float | None


def achievable_flops(cluster: Cluster, groups: Iterable[str], w: Workload) -> float:
    """The summed achievable matmul FLOP/s of every device of ``groups``, each at the fastest
    rate ``w``'s FLOP run at there (:func:`simulator.cost_model.fastest_rate`: the compute dtype's
    peak x matmul efficiency, or the low-precision recipe's GEMM rate; a device without one raises
    ``ProfileError``)."""
    out = 0.0
    for g in groups:
        dev = cluster.groups[g].device
        out += cm.fastest_rate(dev, w) * cluster.groups[g].num_devices
    return out


def flop_bound(w: Workload, cluster: Cluster, groups: Iterable[str]) -> float:
    """A lower bound on any plan's step on ``groups``: the step's model FLOP over the sum of the
    devices' achievable FLOP/s (the cost model charges every FLOP at most that fast), seconds."""
    return w.step_flops / achievable_flops(cluster, groups, w)


def cross_sync(w: Workload, cluster: Cluster, parts: tuple[tuple[str, ...], ...]) -> tuple[str, float, float]:
    """(link name, bytes, seconds) of the gradient all-reduce across data-parallel ``parts``.

    fp32 gradients of every parameter (``cm.GRAD_BYTES_PER_PARAM``), a ring over the parts
    (Patarasuk and Yuan 2009: ``2 (K-1)/K x bytes / bandwidth``) at the narrowest link between
    two parts. Each part's gradients are spread over all its devices, so a link between parts is
    the smaller side's NIC total (devices x per-device scale-out bandwidth), capped by the
    cluster's ``group_links`` between them.
    """
    nbytes = w.param_count * cm.GRAD_BYTES_PER_PARAM
    k = len(parts)
    if k < 2 or not w.training:
        return "", nbytes, 0.0

    def nic(part: tuple[str, ...]) -> float:
        return sum(cluster.groups[g].num_devices * cluster.groups[g].scale_out_link.bandwidth for g in part)

    best: tuple[float, float, str] | None = None
    for a, b in combinations(parts, 2):
        bw, lat, name = min(nic(a), nic(b)), 0.0, f"{'+'.join(a)}<->{'+'.join(b)}"
        for ga in a:
            for gb in b:
                lat = max(lat, cluster.groups[ga].scale_out_link.latency, cluster.groups[gb].scale_out_link.latency)
                cap = next((ln.link for ln in cluster.group_links if {ln.a, ln.b} == {ga, gb}),
                           cluster.default_link)
                if cap is not None:
                    bw = min(bw, cap.bandwidth)
                    lat = max(lat, cap.latency)
        if best is None or bw < best[0]:
            best = (bw, lat, name)
    assert best is not None            # two parts or more: one pair at least
    bw, lat, name = best
    return name, nbytes, ring_all_reduce(nbytes, k, Link(bw, lat))


def data_parallel_prediction(w: Workload, cluster: Cluster, plans: tuple[Plan, ...],
                             preds: tuple[Prediction, ...], sync_s: float) -> Prediction:
    """The prediction of parts run side by side: every mesh finishes its pipeline and its part's
    gradient all-reduce (``Prediction.synced_s``), then the cross-part all-reduce (``sync_s``),
    then every mesh's optimizer: ``step = max synced + sync_s + max optimizer``."""
    s0 = max(t for p in preds for t in p.synced_s.values())
    step = s0 + sync_s + max(t for p in preds for t in p.optimizer_s.values())
    bubble: dict[str, float]
    peak: dict[str, float]
    cap: dict[str, float]
    stage: tuple[float, ...]
    bubble, peak, cap, stage = {}, {}, {}, ()
    for p in preds:
        for m, b in p.bubble.items():
            bubble[m] = 1.0 - (1.0 - b) * p.step_time_s / step
        peak.update(p.peak_memory_bytes)
        cap.update(p.capacity_bytes)
        stage += p.stage_time_s
    peak_flops = 0.0                        # the devices the parts' meshes use
    for plan in plans:
        for shape in plan.carving:
            dev = cluster.groups[shape["group"]].device
            devices = shape["nodes"] * cluster.groups[shape["group"]].devices_per_node
            peak_flops += cm.peak_rate(dev, w) * devices
    tokens = w.global_batch * w.seq_len
    return Prediction(step_time_s=step, bubble=bubble, peak_memory_bytes=peak, capacity_bytes=cap,
                      stage_time_s=stage, mfu=w.step_flops / (step * peak_flops),
                      roofline_step_time_s=w.step_flops / peak_flops, tokens_per_s=tokens / step,
                      samples_per_s=w.global_batch / step,
                      shortfall_bytes={k: v for p in preds for k, v in p.shortfall_bytes.items()},
                      synced_s={k: v for p in preds for k, v in p.synced_s.items()},
                      optimizer_s={k: v for p in preds for k, v in p.optimizer_s.items()})


def _granule(batch: int, parts: int) -> int:
    """The batch-share step: the largest power of two dividing the batch that leaves at least 4
    granules per part (coarse shares keep each part's microbatches divisible by its data-parallel
    degree: a 256-chip TPU mesh needs multiples of 32 samples)."""
    q = 1
    while batch % (2 * q) == 0 and batch // (2 * q) >= 4 * parts:
        q *= 2
    return q


def _shares(batch: int, rates: list[float], q: int) -> list[int]:
    """Shares of ``batch`` in multiples of ``q``, each at least ``q``, that minimise the slowest
    part's time ``share / rate`` (the step of a data-parallel split waits for its last part): the
    proportional shares rounded down, then each granule left to the part that finishes first with
    it (water filling: each part's time grows linearly with its share)."""
    units = batch // q
    got = [max(1, int(units * r / sum(rates))) for r in rates]
    while sum(got) > units:             # tiny parts kept at one granule: take from the slowest
        i = max((i for i in range(len(got)) if got[i] > 1), key=lambda i: got[i] / rates[i])
        got[i] -= 1
    while sum(got) < units:
        i = min(range(len(got)), key=lambda i: (got[i] + 1) / rates[i])
        got[i] += 1
    return [g * q for g in got]


class _Search:
    """Shared state of one cluster search: deadline, stop, progress and every option tried."""

    def __init__(self, w: Workload, cluster: Cluster, opts: construct.PlanOptions,
                 progress: Callable[[int, int, float | None], None] | None,
                 stop: threading.Event | None):
        self.w, self.cluster, self.opts, self.stop = w, cluster, opts, stop
        self.t0 = time.monotonic()
        self.deadline = self.t0 + opts.time_limit_s * WALL_FACTOR
        self.budget = Budget(opts.time_limit_s * WORK_SHARE, self.deadline)
        self.progress = progress
        self.tried: list[Option] = []
        self.cache: dict[tuple[tuple[str, ...], int], PipelineResult] = {}
        self.grids: dict[tuple[str, int], GridResult] = {}
        self.interrupted = False
        self.done, self.total = 0, 1
        self.parts: dict[tuple[str, ...], PartBound] = {}
        self.splits: dict[tuple[tuple[str, ...], ...], float] = {}

    def part(self, groups: tuple[str, ...]) -> PartBound:
        """The lower bounds of pipeline ``groups`` at every batch share (shared with its searches;
        their work is charged to the budget each call is given)."""
        if groups not in self.parts:
            self.parts[groups] = PartBound(self.w, self.cluster, groups, self.opts)
        return self.parts[groups]

    def split_bound(self, parts: tuple[tuple[str, ...], ...], cap: float) -> float:
        """A lower bound on every plan of the data-parallel split ``parts`` (the search's shares:
        granules of :func:`_granule`), refined until it reaches ``cap`` or the budget is out
        (:func:`planner.split_bound.split_bound`)."""
        got = split_bound([self.part(p) for p in parts], self.w.global_batch,
                          _granule(self.w.global_batch, len(parts)), cross_sync(self.w, self.cluster, parts)[2],
                          self.budget, cap)
        self.splits[parts] = max(self.splits.get(parts, 0.0), got)
        return self.splits[parts]

    def left(self) -> float:
        """Nominal seconds of work left (see :class:`planner.shapes.Budget`)."""
        return self.budget.left()

    def out(self) -> bool:
        """The work budget or the wall clock is spent, or Ctrl-C."""
        return self.budget.out() or (self.stop is not None and self.stop.is_set())

    def pipeline(self, groups: tuple[str, ...], batch: int, budget: float,
                 target_gap: float = 0.01) -> PipelineResult:
        key = (groups, batch)
        if key in self.cache:
            return self.cache[key]
        w = replace(self.w, global_batch=batch)
        sub = self.budget.sub(max(0.2, budget))
        incumbent = None
        if len(groups) == 1 and not self.opts.fixed_order and w.training:
            grid = grid_sweep(w, self.cluster, groups[0], self.opts.headroom,
                              sub.sub(sub.left() * GRID_SHARE), self.opts, self.stop)
            self.grids[(groups[0], batch)] = grid
            if grid.best is not None:
                step = grid.best.prediction.step_time_s
                gp = replace(grid.best.plan, search=SearchReport("GRID", step, step, 0.0, 0.0))
                grid = replace(grid, best=replace(grid.best, plan=gp))
                self.grids[(groups[0], batch)] = grid
                assert grid.best is not None       # replaced just above
                incumbent = (gp, grid.best.prediction)
        # the dependence-graph bounds tighten a one-group search's proven gap inside it; with
        # several groups the budget goes to searching, and the bound comes after (_space_bound).
        # The candidates are enumerated once per part and share (charged to the phase's budget:
        # a bound may have enumerated them already), then searched on the sub-budget
        r = search_pipeline(w, self.cluster, groups, self.opts, deadline=self.deadline, stop=self.stop,
                            target_gap=target_gap, budget=sub, incumbent=incumbent,
                            graph_bounds=len(self.cluster.groups) == 1,
                            enumeration=self.part(groups).enumeration(batch, self.budget))
        self.interrupted |= r.interrupted and (self.stop is not None and self.stop.is_set())
        self.cache[key] = r
        self.done += 1
        if self.progress:
            best = min((o.step_time_s for o in self.tried if o.step_time_s), default=None)
            self.progress(self.done, max(self.total, self.done + 1), best)
        return r


def _both_readings(w: Workload, listing: Cluster, grouped: Cluster, opts: construct.PlanOptions,
                   progress: api.Progress | None, stop: threading.Event | None,
                   prove: bool) -> api.PlanResult:
    """A listing whose links join its nodes unequally, searched both ways: its meshes as listed
    (:func:`planner.api.plan_meshes`) and the node groups it describes with its links as the
    topology (:func:`hardware_profiles.carve.read_with_topology`), each on the whole budget; the
    faster plan by its replay, so reading a listing as node groups never plans slower than the
    listing as written. The bound is the lower of the two searches' (either space may hold the
    optimum); None when either has none.

    Only for a listing of at most ``BOTH_READINGS_MESHES`` meshes (:mod:`hardware_profiles.carve`):
    the node-group search orders a pipeline's kinds by its own rules and can miss the listing's
    best order (the README's 6-mesh ``h100x16_p150bx32``: Blackhole boxes first at 80.75 s as
    listed, 89.17 s as node groups), and a listing that small is cheap to search exactly; a larger
    one (``mixed512_chain.yaml``'s 36 meshes) is searched as node groups only."""
    fixed: api.PlanResult | None = None
    try:
        fixed = api.plan_meshes(w, listing, opts, progress, stop=stop)
    except InfeasibleError:
        pass
    if stop is not None and stop.is_set():
        if fixed is None:
            raise api.PlanInterrupted("interrupted before any feasible plan")
        return fixed
    try:
        carved: api.PlanResult | None = shape_and_plan(w, grouped, opts, progress, stop=stop,
                                                       prove=prove)
    except (InfeasibleError, api.PlanInterrupted):
        if fixed is None:
            raise
        carved = None
    results = [r for r in (fixed, carved) if r is not None]
    best = min(results, key=lambda r: r.prediction.step_time_s)
    bounds = [r.search_bound_s for r in results]
    if len(results) < 2 or any(b is None for b in bounds):
        return best
    bound = min(b for b in bounds if b is not None)
    plan = best.plan
    obj = plan.search.objective_s or 0.0
    gap = max(0.0, (obj - bound) / obj) if obj else 0.0
    plan = replace(plan, search=replace(plan.search, search_bound_s=bound, search_gap=gap))
    return replace(best, plan=plan, search_bound_s=bound, search_gap=gap)


def shape_and_plan(w: Workload, cluster: Cluster, opts: construct.PlanOptions = construct.PlanOptions(),
                   progress: Callable[[int, int, float | None], None] | None = None, *,
                   stop: threading.Event | None = None, prove: bool = True) -> api.PlanResult:
    """The fastest plan on the whole cluster (:func:`planner.plan`'s default goal): shape a node-group cluster (see the module docstring), or search
    a mesh-listing cluster's meshes (:func:`planner.api.plan_meshes`).

    A cluster that lists meshes which are whole nodes of one kind per group is shaped as the node
    groups it describes (:func:`hardware_profiles.carve.node_groups_of`): the plan then names the
    carved meshes (``{group}.{j}``) and records its carving, which every consumer re-applies to the
    same file (:func:`simulator.plan_sim.plan_cluster`). ``opts.meshes`` (the user naming meshes)
    or ``carve: fixed`` in the cluster file keeps the listing as written.

    ``prove``: spend up to :data:`BOUND_SHARE` of ``--time-limit`` after the search on its bound
    (one group: :func:`planner.shapes.prove` while the gap exceeds :data:`ONE_GROUP_GAP`;
    several: :func:`_space_bound`); without it the bound uses what the search refined (a cost
    objective's many sub-cluster searches, which compare costs, not gaps).

    The final alternatives (each kind alone, the data-parallel splits, the one mixed pipeline)
    are ranked by their discrete-event replays (:func:`planner.replayed.rank_by_replay`), and the
    plan carries its replay's step: what ``mpmd simulate`` prints for the written plan.

    Raises:
        InfeasibleError: no configuration fits memory.
        PlanInterrupted: ``stop`` was set before any plan was found.
        PlannerError: bad options.
        ProfileError: a device of the cluster has no rate for the model's compute dtype
            (``DeviceProfile.matmul_precision``), before any search.
    """
    devices = [g.device for g in cluster.groups.values()] + [m.device for m in cluster.meshes.values()]
    for dev in {d.name: d for d in devices}.values():
        dev.matmul_precision(cm.compute_dtype(w))     # a dtype a device has no rate for: refused now
    if not cluster.groups and not opts.meshes:
        grouped = node_groups_of(cluster)              # a listing of whole nodes: shape them
        if (grouped is not None and read_with_topology(grouped)
                and len(cluster.meshes) <= BOTH_READINGS_MESHES):
            return _both_readings(w, cluster, grouped, opts, progress, stop, prove)
        cluster = grouped or cluster
    if not cluster.groups or opts.meshes:
        return api.plan_meshes(w, cluster, opts, progress, stop=stop)
    s = _Search(w, cluster, opts, progress, stop)
    groups = tuple(cluster.groups)
    k = len(groups)
    s.total = k + (k + 2 if k > 1 else 0)
    alone: dict[str, PipelineResult] = {}
    # 1. every group alone, on the whole batch
    for i, g in enumerate(groups):
        budget = s.left() * (ALONE_SHARE if k > 1 else 1.0) / (k - i)
        alone[g] = s.pipeline((g,), w.global_batch, budget, ONE_GROUP_GAP if k == 1 else 0.03)
        r = alone[g]
        s.tried.append(Option(f"{g} alone", (((g,), w.global_batch),),
                              r.prediction.step_time_s if r.prediction else None))
    candidates: list[Found] = []
    for g, r in alone.items():
        if r.plan is not None:
            assert r.prediction is not None    # found with its plan
            candidates.append(Found(r.prediction.step_time_s, f"{g} alone", r))
    if k > 1:
        # data-parallel splits get 60% of the work left, the one pipeline through every kind the rest
        whole = s.budget
        s.budget = whole.sub(whole.left() * SPLITS_SHARE)
        _heterogeneous(s, alone, candidates)
        s.budget = whole
        _mixed(s, groups, candidates)
    if not candidates:
        if s.interrupted:
            raise api.PlanInterrupted(f"interrupted after {time.monotonic() - s.t0:.0f} s before any "
                                      f"feasible plan")
        raise InfeasibleError(_infeasible(w, cluster, s.opts.optimizer_state))
    ranked = rank_by_replay(candidates, _plan_of, w, cluster)
    pred, (_, label, chosen) = ranked[0]
    step = pred.step_time_s
    others = [f"{c.label} {p.step_time_s:.2f} s" for p, c in ranked[1:4]]
    grid = s.grids.get((label.removesuffix(" alone"), w.global_batch))
    if grid is not None and grid.best is not None and isinstance(chosen, PipelineResult) \
            and chosen.plan is grid.best.plan:
        label += f" (the practitioners' grid's {grid.best.label}: the search found nothing faster)"
    reason = f"{label}: {step:.2f} s per step" + (f" (next: {'; '.join(others)})" if others else "")
    stopped, spent = _stopped(s), s.budget.out() and not s.interrupted
    if k == 1:
        r = cast(PipelineResult, chosen)      # one group: only its own search's result
        if prove and r.gap is not None and r.gap > ONE_GROUP_GAP:
            # the bound's own work, after the search (the plan does not depend on it)
            r = prove_bound(r, Budget(opts.time_limit_s * BOUND_SHARE, s.deadline), ONE_GROUP_GAP)
        bound = max(r.bound_s, work_bound(w, cluster, groups))
    else:
        # the bound's own work, after the search (the plan does not depend on it)
        s.budget = Budget(opts.time_limit_s * BOUND_SHARE if prove else 0.0, s.deadline)
        bound = max(flop_bound(w, cluster, groups), work_bound(w, cluster, groups),
                    _space_bound(s, alone, step))
    gap = max(0.0, (step - bound) / step)
    wall = time.monotonic() - s.t0
    options = tuple(PlanFamily(o.label, o.parts, o.step_time_s)
                    for o in s.tried)

    def finished(r: SearchReport) -> SearchReport:
        return replace(r, search_wall_s=wall, search_bound_s=bound, search_gap=gap,
                       interrupted=s.interrupted, reason=reason, budget_spent=spent,
                       stopped=stopped, options=options)

    p: Plan | DataParallelPlan
    if isinstance(chosen, PipelineResult):
        assert chosen.plan is not None and chosen.prediction is not None   # a candidate found it
        p = replace(chosen.plan, predicted=pred,
                    search=replace(finished(chosen.plan.search), candidates=chosen.total,
                                   candidates_total=chosen.total,
                                   candidates_searched=chosen.searched))
    else:
        dp, _ = chosen
        p = replace(dp, search=finished(dp.search), reason=reason, predicted=pred)
    cands = tuple((o.label, 0, o.step_time_s) for o in s.tried)
    return api.PlanResult(p, pred, cands, interrupted=s.interrupted, candidates_total=len(cands),
                          search_bound_s=bound, search_gap=gap)


def _plan_of(c: Found) -> tuple[Plan | DataParallelPlan, Prediction]:
    """A final alternative's plan and analytic prediction."""
    if isinstance(c.result, PipelineResult):
        assert c.result.plan is not None and c.result.prediction is not None   # found with it
        return c.result.plan, c.result.prediction
    return c.result


def _space_bound(s: _Search, alone: dict[str, PipelineResult], best: float) -> float:
    """A lower bound on every plan of a heterogeneous search's space, seconds: the least of each
    group alone's search bound, the one pipeline through every group's, and every data-parallel
    split's (:meth:`_Search.split_bound`, refined to ``best`` while the budget lasts), and
    ``best`` itself."""
    got = [best] + [r.bound_s for r in alone.values()]
    order = _by_memory(s, tuple(s.cluster.groups))
    for part in s.parts.values():
        part.graph = True                # the dependence graphs' bounds too, now that time allows
    mixed = s.cache.get((order, s.w.global_batch))
    whole = s.part(order).at_least(s.w.global_batch, best, s.budget)
    got.append(max(mixed.bound_s, whole) if mixed is not None else whole)
    got += [s.split_bound(parts, best) for parts in list(s.splits)]
    return min(got)


def _stopped(s: _Search) -> str:
    """Why the search ended: ``"interrupted"`` (Ctrl-C), ``"time limit"`` (the wall clock cut it
    before its work budget was spent: a machine slower or busier than the reference, and the plan
    may then depend on the load), ``"work budget"`` (the nominal work of ``--time-limit`` done),
    or ``"complete"`` (every option searched to its gap target or pruned by its bound)."""
    if s.interrupted:
        return "interrupted"
    if s.budget.left() <= 0:
        return "work budget"
    if s.budget.wall_left() <= 0:
        return "time limit"
    return "complete"


def _partitions(items: list[str]) -> Iterator[list[list[str]]]:
    """Every set partition of ``items`` (Bell-number many: 5 for 3 kinds, 15 for 4)."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for p in _partitions(rest):
        yield [[first]] + p
        for i in range(len(p)):
            yield p[:i] + [[first] + p[i]] + p[i + 1:]


def _by_memory(s: _Search, groups: Iterable[str]) -> tuple[str, ...]:
    """A mixed pipeline's group order: largest device memory first (the first stage holds the
    most activations in flight)."""
    return tuple(sorted(groups, key=lambda g: -s.cluster.groups[g].device.memory_bytes))


def _heterogeneous(s: _Search, alone: dict[str, PipelineResult], candidates: list[Found]) -> None:
    """Heterogeneous data parallel: every split of the groups that run alone into two or more
    parts (a part of several groups is one mixed pipeline through them), subsets that leave
    groups out included; the most promising first (ideal step: the batch over the parts' summed
    rates plus the cross-part sync), skipping any that cannot beat the best group alone."""
    w = s.w
    rates = {g: w.global_batch / r.prediction.step_time_s for g, r in alone.items() if r.prediction}
    # (the key is looked up for the dict's own keys: never None)
    ranked = sorted(rates, key=cast("Callable[[str], float]", rates.get), reverse=True)
    configs = []
    for n in range(len(ranked), 1, -1):
        for sub in combinations(ranked, n):
            for split in _partitions(list(sub)):
                if len(split) >= 2 and len(ranked) <= 4:
                    configs.append(tuple(_by_memory(s, part) for part in split))

    def ideal(parts: tuple[tuple[str, ...], ...]) -> float:
        return (w.global_batch / sum(rates[g] for part in parts for g in part)
                + cross_sync(w, s.cluster, parts)[2])
    # fewer mixed parts first among equals: one kind per part is the cheaper search
    configs.sort(key=lambda parts: (ideal(parts), sum(len(x) > 1 for x in parts)))
    best_alone = min((r.prediction.step_time_s for r in alone.values() if r.prediction), default=math.inf)
    for parts in configs:
        s.splits.setdefault(parts, 0.0)  # bounded after the search (:func:`_space_bound`)
    for parts in configs:
        if s.out():
            break
        if ideal(parts) >= best_alone:
            continue                     # cannot beat the best group alone even perfectly balanced
        got = _balance(s, parts, [sum(rates[g] for g in part) for part in parts])
        if got is not None:
            candidates.append(got)


def _balance(s: _Search, parts: tuple[tuple[str, ...], ...], rates: list[float]) -> Found | None:
    w = s.w
    q = _granule(w.global_batch, len(parts))
    shares = _shares(w.global_batch, rates, q)
    link, nbytes, sync = cross_sync(w, s.cluster, parts)
    label = "data parallel " + " + ".join(" -> ".join(part) for part in parts)
    best = None
    seen = set()
    for _ in range(6):
        key = tuple(shares)
        if key in seen or s.out():
            break
        seen.add(key)
        results = [s.pipeline(part, b, s.left() / (2 * len(parts)), 0.02) for part, b in zip(parts, shares)]
        if any(r.plan is None for r in results):
            break
        # (none is None: every part found a plan, with its prediction)
        preds = cast("tuple[Prediction, ...]", tuple(r.prediction for r in results))
        plans = cast("tuple[Plan, ...]", tuple(r.plan for r in results))
        wp = data_parallel_prediction(w, s.cluster, plans, preds, sync)
        s.tried.append(Option(label, tuple((part, b) for part, b in zip(parts, shares)), wp.step_time_s))
        if best is None or wp.step_time_s < best[0]:
            best = (wp.step_time_s, plans, wp)
        # move one granule from the part that finishes last to the one that finishes first
        ends = [max(p.synced_s.values()) for p in preds]
        slow, fast = max(range(len(ends)), key=ends.__getitem__), min(range(len(ends)), key=ends.__getitem__)
        if slow == fast or shares[slow] <= q:
            break
        shares = list(shares)
        shares[slow] -= q
        shares[fast] += q
    if best is None:
        return None
    step, plans, wp = best
    dp = DataParallelPlan(model=w.model, cluster=s.cluster.name, global_batch=w.global_batch,
                          seq_len=w.seq_len, parts=plans, sync_link=link, sync_bytes=nbytes, sync_s=sync,
                          predicted=wp, search=SearchReport("HEURISTIC"),
                          cluster_path=s.cluster.path, precision=w.precision or "bf16",
                          cross_entropy=w.cross_entropy)
    return Found(step, label, (dp, wp))


def _mixed(s: _Search, groups: tuple[str, ...], candidates: list[Found]) -> None:
    """One pipeline through every group, the groups ordered by device memory (largest first)."""
    if s.out():
        return
    order = _by_memory(s, groups)
    r = s.pipeline(order, s.w.global_batch, s.left())
    label = "one pipeline " + " -> ".join(order)
    s.tried.append(Option(label, ((order, s.w.global_batch),), r.prediction.step_time_s if r.prediction else None))
    if r.plan is not None:
        assert r.prediction is not None        # found with its plan
        candidates.append(Found(r.prediction.step_time_s, label, r))


def _infeasible(w: Workload, cluster: Cluster, optimizer_state: str = "fp32") -> str:
    mem = sum(g.device.memory_bytes * g.num_devices for g in cluster.groups.values())
    need = cm.stage_memory(w, 0, len(w.layers), Layout(1, 1, optimizer_state=optimizer_state),
                           1.0, w.training).static_bytes
    if need > mem:
        return (f"model {w.model!r} does not fit cluster {cluster.name!r}: its weights, gradients and optimizer "
                f"state need {need / 1e9:.0f} GB, the devices hold {mem / 1e9:.0f} GB; add nodes")
    return (f"model {w.model!r} found no plan that fits memory on cluster {cluster.name!r} within the time "
            f"limit; raise --time-limit or lower --global-batch/--seq-len")
