"""``plan_meshes(workload, cluster)``: the search driver for a cluster that lists its meshes.

With several device kinds, each kind's meshes are then searched alone (on :data:`KIND_SHARE` of
the work), so the plan is never slower than the fastest kind alone.

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

from ir import DataParallelPlan, Layout, Plan, Prediction, SearchReport, Workload
from hardware_profiles.types import Cluster
from planner.errors import InfeasibleError, PlannerError
from planner.construct import TRAIN_SCHEDULES as TRAIN_SCHEDULES   # re-exported for the CLI
from planner.construct import (SAME_MODEL, SEARCHED_SCHEDULES, PlanOptions,
                               build_plan, make_candidate, microbatch_counts, schedule_allowed,
                               split_layers)
from planner.budget import COSTS, WALL_FACTOR, WORK_SHARE, Budget
from planner.budget import _work as plan_work
from planner.predict import predict
from planner.replayed import rank_by_replay
from planner.search import Candidate, SolveOutcome, solve_outcome
from simulator import cost_model as cm



class PlanInterrupted(PlannerError):
    """The search was stopped before any candidate gave a plan that fits memory."""


Progress = Callable[[int, int, "float | None"], None]
"""Progress callback ``(done, total, best_s)``: candidates searched, candidates in all, best
predicted step time so far in seconds (None before the first plan that fits)."""


@dataclass(frozen=True, slots=True)
class PlanResult:
    """The best plan, its prediction, and every candidate tried (for reports).

    Attributes:
        candidates: (schedule, microbatches, predicted step time or None) per candidate searched;
            a listing of several device kinds also plans each kind alone (not listed here: those
            plans lie in the space the candidates' bound covers).
        interrupted: the ``stop`` event ended the search.
        candidates_total: candidates the search meant to try (searched or not).
        search_bound_s: proven lower bound on the surrogate step time over every candidate, seconds;
            when some candidates were not searched (their bound is unknown), the FLOP floor of the
            meshes (:func:`flop_floor`), so the gap stays bounded; None when a stop cut the search.
        search_gap: ``(objective - search_bound_s) / objective`` of the chosen plan's surrogate
            objective, or None with ``search_bound_s``.
    """

    plan: Plan | DataParallelPlan
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
    counts = microbatch_counts(w, opts, len(meshes))
    if not counts:
        raise PlannerError(f"no microbatch count divides global batch {w.global_batch}; "
                           f"pass --global-batch with more divisors")
    _, nb, _ = split_layers(w)
    depths = ((len(meshes),) if (opts.fixed_order or opts.even_split)
              else range(1, len(meshes) + 1))
    combos = [(s, m) for m in counts for s in scheds
              if any(schedule_allowed(s, p, m, nb, opts.virtual_stages) for p in depths)]
    tried: list[tuple[str, int, float | None]] = []
    bounds: list[float] = []          # per searched candidate: proven surrogate lower bound, s
    best: tuple[float, Plan, Prediction] | None = None
    feasible: list[tuple[Plan, Prediction]] = []
    kinds = mesh_kinds(cluster, meshes) if opts.meshes is None else []
    share = 1.0 - KIND_SHARE if len(kinds) > 1 else 1.0
    # nominal work (planner.budget): CP-SAT's deterministic time, the layout choices costed and
    # the plans replayed, so the search stops at the same point on any machine; the wall clock
    # cuts it only at WALL_FACTOR x the limit
    budget = Budget(opts.time_limit_s * WORK_SHARE * share, t0 + opts.time_limit_s * WALL_FACTOR)
    interrupted = False               # the stop event cut the search short
    solved: dict[Candidate, SolveOutcome] = {}   # by model (SAME_MODEL): solves to reuse
    for n, (sched, mb) in enumerate(combos):
        if progress:
            progress(len(tried), len(combos), best[0] if best else None)
        if stop is not None and stop.is_set():
            interrupted = True
            break
        if budget.out():
            break
        cand = make_candidate(w, cluster, meshes, sched, mb, opts, budget)
        if cand is None:
            tried.append((sched, mb, None))
            bounds.append(math.inf)
            continue
        v = cand.virtual_stages
        key = replace(cand, schedule=SAME_MODEL.get(sched, sched))
        out = solved.get(key)
        if out is None:
            # an equal share of the work budget still unused, in CP-SAT's deterministic seconds
            # (reproducible, so is the split), capped by the wall clock left
            share = max(0.05, budget.left() / COSTS["cpsat"] / (len(combos) - n))
            out = solve_outcome(cand, time_limit_s=max(budget.wall_left(), 0.05), seed=opts.seed,
                                workers=opts.workers, deterministic_limit=share, stop=stop)
            budget.charge(out.deterministic_s * COSTS["cpsat"])
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
        budget.charge(plan_work(p))
        tried.append((sched, mb, pred.step_time_s if pred.fits else None))
        if not pred.fits:
            continue
        p = replace(p, predicted=pred,
                    search=SearchReport.of_solve(a.status, a.objective_s, a.bound_s, a.wall_s))
        feasible.append((p, pred))
        if best is None or pred.step_time_s < best[0] * (1 - 1e-9):
            best = (pred.step_time_s, p, pred)
    # then every kind alone (the plan is never slower than the fastest of them), on KIND_SHARE
    for ms in kinds if len(kinds) > 1 and not interrupted else []:
        if stop is not None and stop.is_set():
            interrupted = True
            break
        sub = replace(opts, meshes=ms, time_limit_s=opts.time_limit_s * KIND_SHARE / len(kinds))
        try:
            r = plan_meshes(w, cluster, sub, stop=stop)
        except PlannerError:            # it does not fit alone, or was stopped first
            continue
        assert isinstance(r.plan, Plan)           # a mesh search's plan is one pipeline
        feasible.append((r.plan, r.prediction))
        if best is None or r.prediction.step_time_s < best[0] * (1 - 1e-9):
            best = (r.prediction.step_time_s, r.plan, r.prediction)
    if progress:
        progress(len(tried), len(combos), best[0] if best else None)
    total_wall = time.monotonic() - t0
    if best is None:
        if interrupted:
            raise PlanInterrupted(f"interrupted after {total_wall:.0f} s before any feasible plan")
        raise InfeasibleError(explain_infeasible(w, cluster, meshes, opts.headroom,
                                                 opts.max_tensor, opts.optimizer_state))
    # the best few on their discrete-event replays: what mpmd simulate prints (planner.replayed)
    pred, (p, _) = rank_by_replay(feasible, lambda x: x, w, cluster)[0]
    p = replace(p, predicted=pred)
    # the bound over every candidate is known only when every candidate was searched (it covers
    # every subset of the meshes, so the kinds alone too); else, unless stopped, the FLOP floor
    # bounds the gap
    bound = (min(bounds) if len(tried) == len(combos)
             else None if interrupted else flop_floor(w, cluster, meshes))
    obj = p.search.objective_s or 0.0
    gap = None if bound is None else (max(0.0, (obj - bound) / obj) if obj else 0.0)
    p = replace(p, search=replace(p.search, search_wall_s=total_wall, candidates=len(tried),
                                  candidates_total=len(combos), interrupted=interrupted,
                                  search_bound_s=bound, search_gap=gap))
    return PlanResult(p, pred, tuple(tried), interrupted=interrupted,
                      candidates_total=len(combos), search_bound_s=bound, search_gap=gap)


KIND_SHARE = 0.35
"""Share of a mesh listing's work for its device kinds alone (each kind's meshes searched on
their own, as the node-group search plans each group alone) when it has several kinds."""


def mesh_kinds(cluster: Cluster, meshes: tuple[str, ...]) -> list[tuple[str, ...]]:
    """``meshes`` by device profile name, each kind's in listing order, kinds by first mesh."""
    out: dict[str, list[str]] = {}
    for m in meshes:
        out.setdefault(cluster.meshes[m].device.name, []).append(m)
    return [tuple(v) for v in out.values()]


def flop_floor(w: Workload, cluster: Cluster, meshes: tuple[str, ...]) -> float:
    """A lower bound on any plan's step on ``meshes``, seconds: the step's model FLOP over the sum
    of their devices' achievable FLOP/s (:func:`simulator.cost_model.fastest_rate`; the cost model
    charges no FLOP faster)."""
    rate = sum(cm.fastest_rate(cluster.meshes[m].device, w) * cluster.meshes[m].num_devices
               for m in meshes)
    return w.step_flops / rate


def explain_infeasible(w: Workload, cluster: Cluster, meshes: tuple[str, ...], headroom: float,
                       max_tensor: int = 8, optimizer_state: str = "fp32") -> str:
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
        mem = cm.stage_memory(w, lo, hi, Layout(1, s.num_devices, optimizer_state=optimizer_state),
                              1.0, w.training)
        need = mem.static_bytes + mem.residual_bytes_per_microbatch * max(1, len(meshes) - i)
        lack = need - cm.usable_bytes(s, headroom)
        if worst is None or lack > worst[1]:
            worst = (m, lack, need, cm.usable_bytes(s, headroom))
    if worst is None or worst[1] <= 0:
        widest = max(s.num_devices for s in specs)
        if widest > max_tensor and widest > max_tensor * w.global_batch:
            return (f"global batch {w.global_batch} cannot occupy cluster {cluster.name!r}'s meshes "
                    f"of up to {widest} devices (each mesh runs data x tensor parallel, data at "
                    f"most the batch, tensor at most --max-tensor {max_tensor}); raise "
                    f"--global-batch or --max-tensor, or split the cluster into more meshes")
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
