"""One candidate of the shape search: a CP-SAT solve of a carved pipeline for one schedule, then
the exact replay closes the gap between CP-SAT's surrogate objective and the replayed step:
an exhaustive search of small candidates, or steepest descent (:func:`solve_schedule`)."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import replace
from typing import Iterator

from ir import Plan, Prediction, SearchReport, Workload
from hardware_profiles.types import Cluster
from planner import construct
from planner.budget import COSTS, Budget, _fragments, _work
from planner.predict import predict
from planner.search import Assignment, Candidate, solve_outcome
from simulator.stage_cost import StageCost
import itertools


POLISH_MAX_FRAGMENTS = 256
"""Largest ranks x microbatches whose CP-SAT answer is polished on the exact replay (each
neighbour costs one replay)."""
POLISH_ROUNDS = 8
POLISH_WITHIN = 1.10
"""Only answers within this factor of the best plan so far are polished."""
POLISH_PAIR_MESHES = 4
"""Up to this many meshes, a block move is also tried together with a layout change of one of the
two meshes it touches."""


def solve_schedule(w: Workload, lc: Cluster, meshes: tuple[str, ...], sched: str, m: int,
                   opts: construct.PlanOptions, left: float, stop: threading.Event | None,
                   incumbent: float = math.inf, budget: Budget | None = None
                   ) -> tuple[Plan, Prediction, bool] | None:
    """One CP-SAT solve of the pipeline ``meshes`` (in order) of ``lc`` for schedule ``sched`` at
    ``m`` microbatches, then the exact replay (exhaustive for small candidates, else
    :func:`_polish` when within :data:`POLISH_WITHIN` of ``incumbent``); the plan, its
    prediction and whether it is this (pipeline, schedule, microbatches)'s optimum (the exhaustive
    search covered every plan of it), or None when no layout fits or CP-SAT finds nothing.
    ``left``: wall seconds left; ``budget``: charged for the work done
    (:class:`planner.budget.Budget`)."""
    o = replace(opts, fixed_order=True, schedules=(sched,), microbatches=(m,))
    cand = construct.make_candidate(w, lc, meshes, sched, m, o)
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
    exact = False
    if simulated:
        budget.charge(COSTS["simulated"] * _fragments(p))
    elif _plans_in(cand) <= EXACT_MAX_PLANS and len(meshes) * m <= EXACT_MAX_FRAGMENTS:
        a, p, pred = _exhaustive(w, lc, cand, a, p, pred, sched, m, opts, budget)
        exact = True
    elif len(meshes) * m <= POLISH_MAX_FRAGMENTS and _score(pred) <= POLISH_WITHIN * incumbent:
        a, p, pred = _polish(w, lc, cand, a, p, pred, sched, m, opts, time.monotonic() + left, budget)
    search = SearchReport.of_solve(a.status, a.objective_s, a.bound_s, a.wall_s)
    return replace(p, predicted=pred, search=search), pred, exact


EXACT_MAX_PLANS = 2000
"""Candidates with at most this many (partition, layouts, merge) plans are searched exhaustively
on the exact replay after CP-SAT (small pipelines: the brute-force test's instances)."""
EXACT_MAX_FRAGMENTS = 64


def _compositions(n: int, k: int) -> Iterator[tuple[int, ...]]:
    """Every way to give ``k`` ranks at least one of ``n`` blocks each, in order."""
    for cut in itertools.combinations(range(1, n), k - 1):
        edges = (0,) + cut + (n,)
        yield tuple(b - a for a, b in zip(edges, edges[1:]))


def _plans_in(cand: Candidate) -> int:
    p = len(cand.meshes)
    per = cand.num_blocks // cand.virtual_stages
    return (math.comb(per - 1, p - 1) * math.prod(len(o) for o in cand.options)
            * (2 if cand.mergeable else 1)) if per >= p else 0


def rank_work(cand: Candidate, i: int, o: StageCost, n: int) -> float:
    """Seconds rank ``i`` of ``cand`` computes in one step under option ``o`` with ``n`` blocks
    per virtual stage: ``M x`` its per-microbatch work as the CP-SAT model charges it (its blocks
    in every virtual stage, the layers before the blocks on the first rank and after them on the
    rank that holds them, one dispatch per virtual stage), less the last stage's F+B merge saving
    where it may merge. Every schedule runs a rank's fragments one after another, so no plan with
    that rank's choice is faster: a lower bound on the replayed step."""
    last = len(cand.meshes) - 1
    t = o.rank_time(cand.virtual_stages).at(
        n, first=i == 0, holds_post=i == 0 if cand.v_shape else i == last,
        merged=cand.mergeable and i == last)
    return cand.microbatches * t


def _exhaustive(w: Workload, lc: Cluster, cand: Candidate, a: Assignment, p: Plan, pred: Prediction,
                sched: str, m: int, opts: construct.PlanOptions, budget: Budget
                ) -> tuple[Assignment, Plan, Prediction]:
    """The best of every plan of a small candidate on the exact replay (CP-SAT's answer first),
    visited by their busiest rank's work (:func:`rank_work`) and stopped once that lower bound
    cannot beat the best replay found: the answer is the same as replaying them all."""
    best = (_score(pred), a, p, pred)
    per = cand.num_blocks // cand.virtual_stages
    plans = []
    for blocks in _compositions(per, len(cand.meshes)):
        for picks in itertools.product(*cand.options):
            lower = max(rank_work(cand, i, o, n) for i, (o, n) in enumerate(zip(picks, blocks)))
            plans.append((lower, blocks, picks))
    budget.charge(COSTS["bound"] * len(plans))
    plans.sort(key=lambda x: x[0])
    for lower, blocks, picks in plans:
        if lower >= best[0] * (1 - 1e-9):
            break                           # neither this plan nor any after it can win
        for merge in ((False, True) if cand.mergeable else (False,)):
            na = replace(a, blocks=blocks, layouts=tuple(x.layout for x in picks),
                         recompute=tuple(x.recompute for x in picks), merge=merge)
            np_, npred = _evaluate(w, lc, na, sched, m, cand.virtual_stages, opts)
            budget.charge(_work(np_))
            if _score(npred) < best[0] * (1 - 1e-12):
                best = (_score(npred), na, np_, npred)
    return best[1], best[2], best[3]


def _evaluate(w: Workload, lc: Cluster, a: Assignment, sched: str, m: int, v: int,
              opts: construct.PlanOptions) -> tuple[Plan, Prediction]:
    p = construct.build_plan(w, lc, a, sched, m, v)
    return p, predict(p, w, lc, headroom=opts.headroom)


def _score(pred: Prediction) -> float:
    return pred.step_time_s if pred.fits else math.inf


def _polish(w: Workload, lc: Cluster, cand: Candidate, a: Assignment, p: Plan, pred: Prediction,
            sched: str, m: int, opts: construct.PlanOptions, deadline: float = math.inf,
            budget: Budget | None = None) -> tuple[Assignment, Plan, Prediction]:
    """Steepest descent on the exact replay from CP-SAT's answer: move one block between
    neighbouring stages, switch one mesh to another of its layout options, or toggle the last
    stage's F+B merge, while the replayed
    step improves (the surrogate CP-SAT minimises is not the replay; this closes the difference on
    small pipelines, where the test brute-forces the space). A neighbour whose busiest rank's work
    (:func:`rank_work`) cannot beat the best replay is not replayed."""
    picks = [next(k for k, o in enumerate(cand.options[i])
                  if o.layout == a.layouts[i] and o.recompute == a.recompute[i])
             for i in range(len(a.order))]
    best = (_score(pred), a, p, pred)
    nb: list[int] | tuple[int, ...]     # a list while building the moves, then each move's blocks
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
            if max(rank_work(cand, i, cand.options[i][k], n)
                   for i, (k, n) in enumerate(zip(pk, nb))) >= best[0] * (1 - 1e-9):
                continue                    # its busiest rank alone cannot beat the best replay
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
