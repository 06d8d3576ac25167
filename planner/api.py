"""``plan(workload, cluster)``: the search driver.

For every schedule family and microbatch count (the outer loop) one CP-SAT solve
(:mod:`planner.search`) picks the pipeline order, layer partition, per-mesh layouts and merge; each
answer becomes a :class:`~ir.Plan`, is replayed exactly (:mod:`planner.predict`), and the
fastest plan that fits memory wins. Deterministic: fixed candidate order, seed and worker count.

A ``stop`` event ends the search early (checked between candidates; the running CP-SAT solve is
stopped too): the result is the best plan so far, marked interrupted, with the honest search-wide
bound (None when some candidates were never searched).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from ir import FragmentRef, Layout, Plan, ScheduleTable, StagePlan, Workload
from hardware_profiles.types import Cluster
from planner.errors import InfeasibleError, PlannerError
from planner.options import _cached_mesh_options, _split_layers
from planner.predict import Prediction, predict
from planner.inflight import V_SHAPED
from planner.search import Assignment, Candidate, SolveOutcome, solve_outcome
from simulator import cost_model as cm
from simulator.plan_costs import PlanCosts
from simulator.schedules import KINDS, generate, kind, v_shape_stage_rank

TRAIN_SCHEDULES = tuple(n for n, k in KINDS.items() if k.training)
"""Schedule families a training plan may name, in tie-break order: every schedule of
:mod:`simulator.schedules` (the fixed patterns and the adaptive ZB-1p / ZB-2p), in their
:attr:`~simulator.schedules.ScheduleKind.order`."""
SEARCHED_SCHEDULES = tuple(n for n in TRAIN_SCHEDULES if KINDS[n].searched)
"""The schedules searched when the options name none (:attr:`ScheduleKind.searched`)."""
MERGEABLE = tuple(n for n, k in KINDS.items() if k.fb_mergeable)
"""Schedules whose last stage runs each microbatch's F immediately before its B."""
SAME_MODEL = {"zb-1p": "zb-h1"}
"""Schedules whose CP-SAT model is another's (same fragment kinds, in-flight counts and
placement): the search solves it once and builds both plans from the one assignment."""


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """Search options.

    Attributes:
        time_limit_s: wall-clock budget of the whole search (CP-SAT solves share it).
        schedules: schedule families to consider (None: all for the workload).
        microbatches: microbatch counts to consider (None: divisors of the global batch).
        max_tensor: largest tensor-parallel degree considered.
        headroom: fraction of device memory kept free.
        virtual_stages: virtual stages per mesh for interleaved 1F1B.
        even_split: force equal blocks per stage on every mesh (the usual hand split).
        meshes: restrict to these meshes (None: all of the cluster's).
        fsdp: also consider fully sharded data parallel layouts.
        fixed_order: use every mesh of ``meshes`` in that order as the pipeline (a carved
            pipeline): the solve then only partitions layers and picks layouts (a linear model).
        seed / workers: CP-SAT determinism controls.
    """

    time_limit_s: float = 30.0
    schedules: tuple[str, ...] | None = None
    microbatches: tuple[int, ...] | None = None
    max_tensor: int = 8
    headroom: float = 0.1
    virtual_stages: int = 2
    seed: int = 0
    workers: int = 1
    even_split: bool = False
    meshes: tuple[str, ...] | None = None
    fsdp: bool = True
    fixed_order: bool = False


class PlanInterrupted(PlannerError):
    """The search was stopped before any candidate gave a plan that fits memory."""


Progress = Callable[[int, int, "float | None"], None]
"""Progress callback ``(done, total, best_s)``: candidates searched, candidates in all, best
predicted step time so far in seconds (None before the first plan that fits)."""


@dataclass(frozen=True, slots=True)
class PlanResult:
    """The best plan, its prediction, and every candidate tried (for reports).

    Attributes:
        candidates: (schedule, microbatches, predicted step time or None) per candidate searched.
        interrupted: the ``stop`` event ended the search.
        candidates_total: candidates the search meant to try (searched or not).
        search_bound_s: proven lower bound on the surrogate step time over every candidate, seconds;
            None when some candidates were not searched (their bound is unknown).
        search_gap: ``(objective - search_bound_s) / objective`` of the chosen plan's surrogate
            objective, or None with ``search_bound_s``.
    """

    plan: Plan
    prediction: Prediction
    candidates: tuple[tuple[str, int, float | None], ...]   # (schedule, M, step time or None)
    interrupted: bool = False
    candidates_total: int = 0
    search_bound_s: float | None = None
    search_gap: float | None = None

    @property
    def unsearched(self) -> int:
        """Candidates never searched (the time limit or a stop came first)."""
        return max(0, self.candidates_total - len(self.candidates))


def fragment_kinds(schedule: str, training: bool) -> tuple[str, ...]:
    """The fragment kinds one microbatch runs per stage under ``schedule``: ``("F",)`` for
    inference, ``("F", "B", "W")`` when the backward is split into input and weight gradients
    (the schedule's :attr:`~simulator.schedules.ScheduleKind.split_backward`), else
    ``("F", "B")``."""
    if not training:
        return ("F",)
    if kind(schedule).split_backward:
        return ("F", "B", "W")
    return ("F", "B")


def _stages_per_rank(schedule: str, virtual_stages: int) -> int:
    """Stages each pipeline rank holds: ``virtual_stages`` for interleaved 1F1B, 2 in a V (ZB-V,
    DualPipeV), else 1 (the schedule's :attr:`~simulator.schedules.ScheduleKind.stages_per_rank`)."""
    return kind(schedule).stages_per_rank(virtual_stages)


def schedule_allowed(schedule: str, ranks: int, microbatches: int, num_blocks: int,
                     virtual_stages: int) -> bool:
    """Whether the planner can build ``schedule`` on ``ranks`` pipeline ranks for ``microbatches``
    microbatches over ``num_blocks`` repeated blocks: the generator accepts the sizes
    (:func:`simulator.schedules.generate`) and every stage gets at least one block, the same number
    on each of a rank's stages.

    Conditions: a schedule of :data:`TRAIN_SCHEDULES`; ``ranks, microbatches >= 1``; stages per rank
    ``k`` (``virtual_stages`` >= 2 for interleaved 1F1B, 2 for ZB-V and DualPipeV, else 1) with
    ``num_blocks % k == 0`` and ``num_blocks >= k * ranks``; interleaved 1F1B:
    ``microbatches % ranks == 0`` (Megatron-LM's condition, ``interleaved.py``); DualPipeV:
    ``microbatches >= 2 * ranks`` (``dualpipe_v.py``). The other generators take any sizes >= 1.
    """
    if schedule not in TRAIN_SCHEDULES or ranks < 1 or microbatches < 1:
        return False
    sk = kind(schedule)
    if not sk.sizes_ok(ranks, microbatches, virtual_stages):   # before k: interleaved needs v >= 2
        return False
    k = sk.stages_per_rank(virtual_stages)
    return not (num_blocks % k or num_blocks < k * ranks)


def make_candidate(w: Workload, cluster: Cluster, meshes: tuple[str, ...], schedule: str,
                   microbatches: int, opts: PlanOptions) -> Candidate | None:
    """The CP-SAT input for ``schedule`` at ``microbatches`` microbatches over ``meshes``: per-mesh
    layout options, the F + B transfer time of one microbatch's boundary activation between every
    ordered pair of meshes (seconds), the pipeline depths the schedule accepts
    (:func:`schedule_allowed`), and ``opts.even_split``, ``opts.fixed_order`` and
    ``opts.virtual_stages``.

    Returns None when some mesh has no layout option (no data-parallel degree divides the
    microbatch) or the schedule accepts no pipeline depth (with ``fixed_order`` or ``even_split``
    the depth is ``len(meshes)``).
    """
    pre, nb, _ = _split_layers(w)
    nm = len(meshes)
    depths = (nm,) if (opts.fixed_order or opts.even_split) else tuple(range(1, nm + 1))
    counts = tuple(p for p in depths
                   if schedule_allowed(schedule, p, microbatches, nb, opts.virtual_stages))
    if not counts:
        return None
    samples = w.global_batch / microbatches
    kinds = fragment_kinds(schedule, w.training)
    split = "W" in kinds
    options = []
    for m in meshes:
        o, _ = _cached_mesh_options(w, cluster.meshes[m], samples, kinds, split, opts.headroom,
                                 opts.max_tensor, opts.fsdp, kind(schedule).hides_alltoall)
        if not o:
            return None
        options.append(o)
    act = w.layer(pre).activation_bytes_per_sample * samples
    comm = tuple(tuple(0.0 if a == b else 2 * cm.transfer_time(
        act, cluster.link_between(a, b).link) for b in meshes) for a in meshes)
    return Candidate(schedule, microbatches, _stages_per_rank(schedule, opts.virtual_stages), nb,
                     meshes, tuple(options), comm, schedule in MERGEABLE and w.training,
                     even_split=opts.even_split,
                     required_meshes=meshes if opts.even_split else (),
                     fixed_order=opts.fixed_order, v_shape=schedule in V_SHAPED,
                     rank_counts=counts)


def build_plan(w: Workload, cluster: Cluster, a: Assignment, schedule: str, microbatches: int,
               virtual_stages: int) -> Plan:
    """Turn a solve's :class:`Assignment` into a :class:`Plan` with its schedule table.

    Stages follow the schedule's placement: round-robin (stage s on rank ``s % P``; interleaved
    1F1B has ``virtual_stages`` per rank), or a V for ZB-V and DualPipeV (rank r holds stages r and
    2P-1-r, :func:`simulator.schedules.v_shape_stage_rank`), each with ``a.blocks[rank]`` blocks;
    the first stage also takes the layers before the blocks and the last the layers after them.
    The adaptive ZB-1p / ZB-2p are generated from the plan's own per-stage fragment times and
    boundary transfers (:class:`simulator.plan_costs.PlanCosts` of the plan under a placeholder
    ZB-H1 table, which has the same stages and split backward).

    Raises:
        PlannerError: the generator placed stages other than expected (a bug).
        simulator.schedules.ScheduleError: the schedule does not accept the sizes
            (see :func:`schedule_allowed`).
    """
    pre, nb, post = _split_layers(w)
    p = len(a.order)
    v = _stages_per_rank(schedule, virtual_stages)
    placement = (v_shape_stage_rank(p) if schedule in V_SHAPED
                 else tuple(s % p for s in range(v * p)))
    stages, cursor = [], pre
    for idx, rank in enumerate(placement):
        lo = 0 if idx == 0 else cursor
        cursor += a.blocks[rank]
        hi = len(w.layers) if idx == len(placement) - 1 else cursor
        stages.append(StagePlan(idx, lo, hi, a.order[rank]))

    def make(table: ScheduleTable) -> Plan:
        return Plan(model=w.model, cluster=cluster.name, stages=tuple(stages),
                    layouts=dict(zip(a.order, a.layouts)),
                    recompute={m: rc for m, rc in zip(a.order, a.recompute) if rc},
                    schedule=table, rank_mesh=a.order, merge_last_stage=a.merge,
                    global_batch=w.global_batch, seq_len=w.seq_len, cluster_path=cluster.path,
                    devices={m: (cluster.meshes[m].device.name, cluster.meshes[m].num_devices)
                             for m in a.order})

    if kind(schedule).adaptive and w.training:
        costs = PlanCosts(make(generate("zb-h1", p, microbatches)), w, cluster)

        def durations(stage: int, kind: str) -> float:
            return costs.fragment_time(FragmentRef(kind, stage, 0))

        def comm(src: int, dst: int) -> float:
            b = costs.boundary(src, dst)
            return 0.0 if b is None else b[2]

        table = generate(schedule, p, microbatches, durations=durations, comm=comm)
    else:
        table = generate(schedule, p, microbatches, virtual_stages=v, forward_only=not w.training)
    if tuple(table.stage_rank) != placement:
        raise PlannerError(f"schedule {schedule!r} places stages {table.stage_rank}, "
                           f"the planner expects {placement}")
    return make(table)


def _microbatch_counts(w: Workload, opts: PlanOptions, nmeshes: int) -> list[int]:
    if opts.microbatches:
        return [m for m in opts.microbatches if w.global_batch % m == 0]
    divs = [m for m in range(1, w.global_batch + 1) if w.global_batch % m == 0]
    # powers of two and multiples of the mesh count: what practitioners try
    keep = sorted({m for m in divs if (m & (m - 1)) == 0 or m % nmeshes == 0})
    return [m for m in keep if m >= min(nmeshes, w.global_batch)]


def plan_meshes(w: Workload, cluster: Cluster, opts: PlanOptions = PlanOptions(),
                progress: Progress | None = None, *, stop: threading.Event | None = None) -> PlanResult:
    """Search plans for ``w`` on ``cluster``'s meshes as listed; return the fastest that fits memory.

    Args:
        progress: called ``(done, total, best_s)`` before each candidate and once at the end.
        stop: when set (from a signal handler, another thread, or ``progress``), the search ends
            within about 50 ms: no further candidate starts and the running CP-SAT solve stops,
            keeping its best solution. Unset, the search is deterministic as before.

    Raises:
        InfeasibleError: no candidate fits; the message names the mesh that lacks the most bytes.
        PlanInterrupted: ``stop`` was set before any candidate gave a plan that fits.
        PlannerError: bad options (an unknown schedule, no microbatch count dividing the batch).
    """
    t0 = time.monotonic()
    meshes = tuple(opts.meshes or cluster.meshes)
    if w.training:
        scheds = opts.schedules or SEARCHED_SCHEDULES
        unknown = [s for s in scheds if s not in TRAIN_SCHEDULES]
        if unknown:
            raise PlannerError(f"unknown schedule {unknown[0]!r}; use one of "
                               f"{', '.join(TRAIN_SCHEDULES)}")
    else:
        scheds = ("gpipe",)
    counts = _microbatch_counts(w, opts, len(meshes))
    if not counts:
        raise PlannerError(f"no microbatch count divides global batch {w.global_batch}; "
                           f"pass --global-batch with more divisors")
    _, nb, _ = _split_layers(w)
    depths = ((len(meshes),) if (opts.fixed_order or opts.even_split)
              else range(1, len(meshes) + 1))
    combos = [(s, m) for m in counts for s in scheds
              if any(schedule_allowed(s, p, m, nb, opts.virtual_stages) for p in depths)]
    tried: list[tuple[str, int, float | None]] = []
    bounds: list[float] = []          # per searched candidate: proven surrogate lower bound, s
    best: tuple[float, Plan, Prediction] | None = None
    det_used = 0.0
    interrupted = False               # the stop event cut the search short
    solved: dict[Candidate, SolveOutcome] = {}   # by model (SAME_MODEL): solves to reuse
    for n, (sched, mb) in enumerate(combos):
        if progress:
            progress(len(tried), len(combos), best[0] if best else None)
        if stop is not None and stop.is_set():
            interrupted = True
            break
        left = opts.time_limit_s - (time.monotonic() - t0)
        if left <= 0:
            break
        cand = make_candidate(w, cluster, meshes, sched, mb, opts)
        if cand is None:
            tried.append((sched, mb, None))
            bounds.append(math.inf)
            continue
        v = cand.virtual_stages
        key = replace(cand, schedule=SAME_MODEL.get(sched, sched))
        out = solved.get(key)
        if out is None:
            # an equal share of the deterministic budget still unused (CP-SAT's deterministic time
            # is reproducible, so is the split), capped by the wall clock left
            share = max(0.05, (opts.time_limit_s - det_used) / (len(combos) - n))
            out = solve_outcome(cand, time_limit_s=left, seed=opts.seed, workers=opts.workers,
                                deterministic_limit=share, stop=stop)
            det_used += out.deterministic_s
            if not out.stopped:
                solved[key] = out
        bounds.append(out.bound_s)
        interrupted |= out.stopped
        a = out.assignment
        if a is None:
            tried.append((sched, mb, None))
            continue
        p = build_plan(w, cluster, a, sched, mb, v)
        pred = predict(p, w, cluster, headroom=opts.headroom)
        tried.append((sched, mb, pred.step_time_s if pred.fits else None))
        if not pred.fits:
            continue
        solver = {"status": a.status, "objective": a.objective_s, "bound": a.bound_s,
                  "gap": (a.objective_s - a.bound_s) / a.objective_s if a.objective_s else 0.0,
                  "wall_s": a.wall_s}
        p = replace(p, predicted=pred.to_json(), solver=solver)
        if best is None or pred.step_time_s < best[0] * (1 - 1e-9):
            best = (pred.step_time_s, p, pred)
    if progress:
        progress(len(tried), len(combos), best[0] if best else None)
    total_wall = time.monotonic() - t0
    if best is None:
        if interrupted:
            raise PlanInterrupted(f"interrupted after {total_wall:.0f} s before any feasible plan")
        raise InfeasibleError(explain_infeasible(w, cluster, meshes, opts.headroom,
                                                 opts.max_tensor))
    _, p, pred = best
    # the bound over every candidate is known only when every candidate was searched
    bound = min(bounds) if len(tried) == len(combos) else None
    obj = p.solver["objective"]
    gap = None if bound is None else (max(0.0, (obj - bound) / obj) if obj else 0.0)
    p = replace(p, solver={**p.solver, "search_wall_s": total_wall, "candidates": len(tried),
                           "candidates_total": len(combos), "interrupted": interrupted,
                           "search_bound": bound, "search_gap": gap})
    return PlanResult(p, pred, tuple(tried), interrupted=interrupted,
                      candidates_total=len(combos), search_bound_s=bound, search_gap=gap)


def explain_infeasible(w: Workload, cluster: Cluster, meshes: tuple[str, ...], headroom: float,
                       max_tensor: int = 8) -> str:
    """One line: which mesh lacks how many bytes in the most memory-frugal plan.

    That plan uses every mesh, splits layers in proportion to each mesh's usable memory, shards
    everything over the mesh (tensor parallel across all its devices) and runs one sample per
    microbatch; if even that does not fit, no plan does. If it fits only with more tensor
    parallelism than ``max_tensor`` allows, the message says so.
    """
    specs = [cluster.meshes[m] for m in meshes]
    usable = [cm.usable_bytes(s, headroom) * s.num_devices for s in specs]
    total = sum(usable)
    n = len(w.layers)
    bounds, acc = [0], 0.0
    for u in usable:
        acc += u
        bounds.append(min(n, round(n * acc / total)))
    worst = None
    for i, (m, s) in enumerate(zip(meshes, specs)):
        lo, hi = bounds[i], max(bounds[i + 1], bounds[i] + 1) if bounds[i] < n else n
        if lo >= hi:
            continue
        mem = cm.stage_memory(w, lo, hi, Layout(1, s.num_devices), 1.0, w.training)
        need = mem.static_bytes + mem.residual_bytes_per_microbatch * max(1, len(meshes) - i)
        lack = need - cm.usable_bytes(s, headroom)
        if worst is None or lack > worst[1]:
            worst = (m, lack, need, cm.usable_bytes(s, headroom))
    if worst is None or worst[1] <= 0:
        widest = max(s.num_devices for s in specs)
        if widest > max_tensor:
            return (f"model {w.model!r} fits cluster {cluster.name!r} only with tensor parallelism "
                    f"wider than --max-tensor {max_tensor} (meshes of up to {widest} devices); "
                    f"raise --max-tensor or split the cluster into more meshes")
        return (f"model {w.model!r} found no plan on cluster {cluster.name!r} within the time "
                f"limit; raise --time-limit")
    m, lack, need, has = worst
    return (f"model {w.model!r} does not fit cluster {cluster.name!r}: mesh {m!r} lacks "
            f"{lack / 1e9:.1f} GB per device (needs {need / 1e9:.1f} GB, has {has / 1e9:.1f} GB "
            f"usable) even with layers split by memory; add devices or lower --global-batch/--seq-len")
