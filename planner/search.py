"""The CP-SAT model: pipeline order, layer partition, per-mesh layout and merge for one candidate.

One solve fixes the schedule family and the microbatch count (the outer loop in
:mod:`planner.api` enumerates those) and decides, jointly:

- which meshes take part and their order in the pipeline (a circuit through a depot node,
  ``AddCircuit``; an unused mesh takes its self-loop),
- how many transformer blocks each mesh runs per virtual stage (a contiguous partition: the
  pipeline order fixes which blocks; the layers before and after the repeated block, such as the
  embedding and the LM head, go to the first and last stage, which for the V-shaped schedules
  ZB-V and DualPipeV are both on the first mesh),
- each mesh's data x tensor parallel layout among the factorizations of its size, and whether it
  recomputes activations in the backward (trading compute for memory),
- whether the last stage's forward and backward merge into one fragment (one dispatch per pair),

minimising the steady-state step time of a pipeline with per-mesh work ``T_m`` per microbatch
(Narayanan et al. 2021, sec. 2.2; heterogeneous form: the slowest mesh sets the rate)::

    step ~ M * max_m T_m + (sum_m T_m + transfers - max_m T_m) / v + max_m tail_m

subject to every mesh's memory (static + residuals of the microbatches in flight at its pipeline
position, per the schedule: :func:`inflight_count`) fitting its devices. Times are integer
microseconds, memory integer megabytes (rounded against the plan). The surrogate charges every
schedule the bubble of (interleaved) 1F1B, which overstates the bubble of the zero-bubble schedules
(ZB-H1/H2, ZB-1p/2p, ZB-V, DualPipeV); the exact replay ranks the candidates, and the solver's
bound is a bound on the surrogate. The exact step time of the chosen plan comes from the analytic
replay in :mod:`planner.predict`, not from this surrogate.

Stopping: the solve runs in a helper thread (:func:`planner.cpsat_thread.run_solver`) while the
calling thread waits, so the caller's signal
handlers keep running; setting the ``stop`` event ends the search through
``CpSolver.StopSearch()``, keeping the best solution and the proven bound. CP-SAT's own SIGINT
handling (``catch_sigint_signal``) is off: it replaces the process's SIGINT handler during a
solve and resets it to the default (kill) afterwards.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, Sequence, cast

from ortools.sat.python import cp_model

from ir import Layout
from planner.cpsat_thread import run_solver
from simulator.stage_cost import Affine, StageCost
from planner.inflight import (  # noqa: F401  (re-exported: the model's callers name them here)
    V_SHAPED, _chunks, inflight_count, inflight_end_counts)
from simulator.schedules import kind

US = 1e6
"""Objective unit: microseconds per second."""
MB = 1e6
"""Memory unit: bytes per megabyte."""
Term = Any   # an int (a fixed order's constant) or a CP-SAT variable or expression (a free order)


class _Model(Protocol):
    """The pre-PEP 8 names of :class:`cp_model.CpModel` this module calls: CP-SAT sets them on each
    model when it is made (wrapping the snake-case methods), so its stubs do not declare them; the
    signatures are the snake-case methods'."""

    def NewIntVar(self, lb: int, ub: int, name: str) -> cp_model.IntVar: ...
    def NewBoolVar(self, name: str) -> cp_model.IntVar: ...
    def Add(self, ct: cp_model.BoundedLinearExpression | bool) -> cp_model.Constraint: ...
    def AddMinEquality(self, target: cp_model.LinearExprT,
                       expressions: Iterable[cp_model.LinearExprT]) -> cp_model.Constraint: ...
    def AddImplication(self, a: cp_model.LiteralT, b: cp_model.LiteralT) -> cp_model.Constraint: ...
    def AddExactlyOne(self, literals: Iterable[cp_model.LiteralT]) -> cp_model.Constraint: ...
    def AddLinearExpressionInDomain(self, linear_expr: cp_model.LinearExprT,
                                    domain: cp_model.Domain) -> cp_model.Constraint: ...
    def AddCircuit(self, arcs: Sequence[cp_model.ArcT]) -> cp_model.Constraint: ...
    def AddBoolAnd(self, literals: Iterable[cp_model.LiteralT]) -> cp_model.Constraint: ...
    def AddBoolOr(self, literals: Iterable[cp_model.LiteralT]) -> cp_model.Constraint: ...
    def AddMultiplicationEquality(self, target: cp_model.LinearExprT,
                                  expressions: Iterable[cp_model.LinearExprT]) -> cp_model.Constraint: ...
    def Minimize(self, obj: cp_model.ObjLinearExprT) -> None: ...
    def AddHint(self, var: cp_model.IntVar, value: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Candidate:
    """The fixed part of one solve."""

    schedule: str
    microbatches: int
    virtual_stages: int
    num_blocks: int
    meshes: tuple[str, ...]
    options: tuple[tuple[StageCost, ...], ...]      # per mesh, per allowed layout
    comm_s: tuple[tuple[float, ...], ...]            # per ordered mesh pair: F + B transfer time
    mergeable: bool
    even_split: bool = False
    required_meshes: tuple[str, ...] = ()
    fixed_order: bool = False
    """Use every mesh, in the given order (a pipeline carved from node groups, whose order the
    carving decides): no circuit, constant positions and in-flight counts, so the model is linear."""
    v_shape: bool = False
    """Stages in a V (ZB-V, DualPipeV; ``virtual_stages`` = 2): rank r holds stage r and stage
    2P-1-r, so the layers after the repeated block (the LM head) run on the first mesh too."""
    rank_counts: tuple[int, ...] = ()
    """Pipeline depths (meshes used) the schedule accepts; empty: any from 1 to ``len(meshes)``."""

    def __post_init__(self) -> None:
        if self.v_shape and self.virtual_stages != 2:
            raise ValueError(f"candidate {self.schedule!r}: a V has 2 stages per rank, not "
                             f"virtual_stages={self.virtual_stages}; pass virtual_stages=2")


@dataclass(frozen=True, slots=True)
class Assignment:
    """A solve's answer: the pipeline order with blocks per virtual stage and layouts."""

    order: tuple[str, ...]
    blocks: tuple[int, ...]
    layouts: tuple[Layout, ...]
    recompute: tuple[bool, ...]
    merge: bool
    status: str
    objective_s: float
    bound_s: float
    wall_s: float
    deterministic_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SolveOutcome:
    """Everything one solve tells the search driver.

    Attributes:
        assignment: the best solution found, or None (proven infeasible, or none found in time).
        status: CP-SAT's status name (OPTIMAL, FEASIBLE, INFEASIBLE, UNKNOWN, MODEL_INVALID).
        bound_s: proven lower bound on this candidate's surrogate step time, seconds; ``inf`` when
            proven infeasible. Without a solution CP-SAT reports no bound, and 0 is used (valid: the
            objective is never negative, as ``v * M >= 1``).
        deterministic_s: CP-SAT's deterministic time spent.
        stopped: the ``stop`` event ended the search before its limits did.
    """

    assignment: Assignment | None
    status: str
    bound_s: float
    deterministic_s: float
    stopped: bool = False


def _mb(nbytes: float) -> int:
    """Bytes as whole megabytes, rounded up (so the model never under-counts memory)."""
    return math.ceil(nbytes / MB - 1e-9)


def _us(seconds: float) -> int:
    """Seconds as whole microseconds, rounded to the nearest (the objective's unit)."""
    return int(round(seconds * US))


def _linear(a: Affine, blocks: Any, first: Any, post: Any, on: Any = 1, merged: Any = 0,
            unit: Callable[[float], int] = _us) -> Any:
    """``a`` (a :class:`simulator.stage_cost.Affine` of a :class:`StageCost`) as a CP-SAT linear
    expression in integer ``unit`` s: ``blocks`` blocks per virtual stage, ``first`` / ``post``
    whether the rank holds the end layers, ``on`` whether the option is chosen (its fixed term),
    ``merged`` whether the last stage's F and B merge (constants or model variables)."""
    return (unit(a.per_block) * blocks + unit(a.first) * first + unit(a.post) * post
            + unit(a.fixed) * on - unit(a.merged) * merged)


def _hull(a: Affine, blocks: Any, chosen: Any, first: int, post: int) -> Any:
    """One option's share of ``a`` in the disaggregated (convex-hull) form of a fixed pipeline
    order: ``blocks`` the option's block count (0 unless ``chosen``), ``first`` / ``post``
    constants (whether the rank holds the end layers); the merge term is left to the caller."""
    return _us(a.per_block) * blocks + (_us(a.first) * first + _us(a.post) * post
                                        + _us(a.fixed)) * chosen


def _inflight_expr(model: _Model, c: Candidate, pos: cp_model.IntVar, n_used: cp_model.IntVar,
                   name: str) -> cp_model.IntVar:
    """:func:`inflight_count` with a variable position ``pos`` and pipeline depth ``n_used``."""
    m, s = c.microbatches, c.schedule
    v = _chunks(s, c.virtual_stages)
    cap = m * v
    infl = model.NewIntVar(0, cap, name)
    terms = kind(s).inflight(n_used, pos, m, v)   # the schedule's terms, linear in n_used and pos
    if terms:
        model.AddMinEquality(infl, [*terms, cap])
    else:   # every instance (GPipe)
        model.Add(infl == cap)
    return infl


def _v_first_expr(model: _Model, c: Candidate, n_used: cp_model.IntVar, name: str) -> cp_model.IntVar:
    """The first count of :func:`inflight_end_counts` for a V, with a variable pipeline depth."""
    infl = model.NewIntVar(0, c.microbatches, name)
    model.AddMinEquality(infl, [2 * n_used, c.microbatches])
    return infl


def _hint(model: _Model, c: Candidate, used: Sequence[cp_model.IntVar], first: Sequence[cp_model.IntVar],
          last: Sequence[cp_model.IntVar], nblk: Sequence[cp_model.IntVar], pos: Sequence[cp_model.IntVar],
          sel: Sequence[Sequence[cp_model.IntVar]]) -> None:
    """A warm start: every mesh in cluster order, blocks in proportion to the speed of its fastest
    layout, and per mesh the fastest option whose memory fits that share at the first pipeline
    position's in-flight count (the least memory-hungry option when none does)."""
    nm, v, L = len(c.meshes), c.virtual_stages, c.num_blocks
    per = L // v
    if per < nm:
        return
    fastest = [min(range(len(opts)), key=lambda k: opts[k].block_s) for opts in c.options]
    speed = [1.0 / max(c.options[i][fastest[i]].block_s, 1e-12) for i in range(nm)]
    share = [max(1, int(per * sp / sum(speed))) for sp in speed]
    share[max(range(nm), key=lambda i: speed[i])] += per - sum(share)
    if min(share) < 1:
        return
    inflight = (min(nm, c.microbatches) * v if not kind(c.schedule).split_backward
                else inflight_count(c.schedule, 0, nm, c.microbatches, v))

    def need(o: StageCost, n: int) -> float:
        # every mesh charged the end layers, and ``inflight`` residuals per virtual stage (a
        # conservative share for the warm start only)
        return o.memory_bytes(n, v, inflight * v, first=True, holds_post=True,
                              first_instances=inflight, post_instances=inflight)

    for i in range(nm):
        opts = c.options[i]
        fits = [k for k in range(len(opts)) if need(opts[k], share[i]) <= opts[k].capacity]
        best = (min(fits, key=lambda k: opts[k].block_s) if fits
                else min(range(len(opts)), key=lambda k: need(opts[k], share[i])))
        model.AddHint(used[i], 1)
        model.AddHint(first[i], int(i == 0))
        model.AddHint(last[i], int(i == nm - 1))
        model.AddHint(pos[i], i)
        model.AddHint(nblk[i], share[i])
        for k in range(len(sel[i])):
            model.AddHint(sel[i][k], int(k == best))


def surrogate_s(c: Candidate, blocks: Sequence[int], picks: Sequence[StageCost],
                merge: bool = False) -> float:
    """The objective the CP-SAT model minimises, in seconds, for a pipeline that uses every mesh
    of ``c`` in order (as a fixed-order candidate does) with ``blocks`` blocks per virtual stage
    and the options ``picks`` per mesh: ``M x max_m T_m + (sum_m T_m - max_m T_m) / v +
    transfers + max_m tail_m``, with ``T_m`` and ``tail_m`` the picks' :meth:`StageCost.rank_time`
    and :meth:`StageCost.tail` (the same terms the model takes, before their rounding to whole
    microseconds)."""
    v, last = c.virtual_stages, len(picks) - 1
    ranks = [(i == 0, i == 0 if c.v_shape else i == last) for i in range(len(picks))]
    times = [o.rank_time(v).at(n, first=f, holds_post=h, merged=merge and c.mergeable and i == last)
             for i, (o, n, (f, h)) in enumerate(zip(picks, blocks, ranks))]
    tails = [o.tail(v).at(n, first=f, holds_post=h) for o, n, (f, h) in zip(picks, blocks, ranks)]
    slowest = max(times)
    transfers = sum(c.comm_s[i][i + 1] for i in range(last))
    return c.microbatches * slowest + (sum(times) - slowest) / v + transfers + max(tails)


def solve(c: Candidate, *, time_limit_s: float, seed: int = 0, workers: int = 1,
          deterministic_limit: float | None = None,
          stop: threading.Event | None = None) -> Assignment | None:
    """Solve one candidate; None when CP-SAT proves it infeasible or finds nothing in time.

    See :func:`solve_outcome`, which also returns the status, bound and deterministic time.
    """
    return solve_outcome(c, time_limit_s=time_limit_s, seed=seed, workers=workers,
                         deterministic_limit=deterministic_limit, stop=stop).assignment


def solve_timed(c: Candidate, *, time_limit_s: float, seed: int = 0, workers: int = 1,
                deterministic_limit: float | None = None,
                stop: threading.Event | None = None) -> tuple[Assignment | None, float]:
    """(the solve's :class:`Assignment` or None, CP-SAT's deterministic time spent); see
    :func:`solve_outcome`."""
    o = solve_outcome(c, time_limit_s=time_limit_s, seed=seed, workers=workers,
                      deterministic_limit=deterministic_limit, stop=stop)
    return o.assignment, o.deterministic_s


def solve_outcome(c: Candidate, *, time_limit_s: float, seed: int = 0, workers: int = 1,
                  deterministic_limit: float | None = None,
                  stop: threading.Event | None = None) -> SolveOutcome:
    """Solve one candidate: the best :class:`Assignment` with its status and proven bound.

    Deterministic for the same inputs: a fixed seed and worker count, interleaved search, and a
    budget in CP-SAT's deterministic time (``deterministic_limit``, default ``time_limit_s``), so a
    loaded machine gives the same answer as an idle one unless the wall-clock ``time_limit_s``
    runs out first, or ``stop`` is set (the search then ends within about 50 ms, keeping the best
    solution found so far; ``SolveOutcome.stopped`` says so).
    """
    model = cast(_Model, cp_model.CpModel())
    nm, v, L, M = len(c.meshes), c.virtual_stages, c.num_blocks, c.microbatches
    big_t = 0
    used, first, last, nblk, pos, sel, tm, tail = [], [], [], [], [], [], [], []
    for i, name in enumerate(c.meshes):
        used.append(model.NewBoolVar(f"used_{name}"))
        first.append(model.NewBoolVar(f"first_{name}"))
        last.append(model.NewBoolVar(f"last_{name}"))
        nblk.append(model.NewIntVar(0, L, f"blocks_{name}"))
        pos.append(model.NewIntVar(0, nm - 1, f"pos_{name}"))
        model.Add(nblk[i] >= 1).OnlyEnforceIf(used[i])
        model.Add(nblk[i] == 0).OnlyEnforceIf(used[i].Not())
        model.AddImplication(first[i], used[i])
        model.AddImplication(last[i], used[i])
        if name in c.required_meshes:
            model.Add(used[i] == 1)
        sel.append([model.NewBoolVar(f"sel_{name}_{k}") for k in range(len(c.options[i]))])
        model.Add(sum(sel[i]) == used[i])
        # the horizon bounds every time variable: a rank's work and its tail (the optimizer and
        # the gradient sync can outlast the pipeline work when that is small)
        worst = max(max(o.rank_time(v).at(L, first=True, holds_post=True),
                        o.tail(v).at(L, first=True, holds_post=True)) for o in c.options[i])
        big_t = max(big_t, int(worst * US) + 1)
    model.Add(v * sum(nblk) == L)
    model.AddExactlyOne(first)
    model.AddExactlyOne(last)
    n_used = model.NewIntVar(1, nm, "num_meshes")
    model.Add(n_used == sum(used))
    # pipeline depths the schedule's generator accepts (Candidate.rank_counts, from
    # planner.construct.schedule_allowed); the schedule's sizes also on their own, for hand-made
    # candidates (an interleaved schedule's always stated)
    sk = kind(c.schedule)
    ok = [p for p in range(1, nm + 1) if (not c.rank_counts or p in c.rank_counts)
          and sk.sizes_ok(p, M, c.virtual_stages)]
    if len(ok) < nm or (c.virtual_stages > 1 and not sk.v_shaped):
        if not ok:
            return SolveOutcome(None, "INFEASIBLE", math.inf, 0.0)
        model.AddLinearExpressionInDomain(n_used, cp_model.Domain.FromValues(ok))

    comm_terms: list[int | cp_model.LinearExpr]
    arcs: list[cp_model.ArcT]
    if c.fixed_order:
        for i in range(nm):
            model.Add(used[i] == 1)
            model.Add(first[i] == int(i == 0))
            model.Add(last[i] == int(i == nm - 1))
            model.Add(pos[i] == i)
        comm_terms = [int(round(v * c.comm_s[i][i + 1] * US)) for i in range(nm - 1)]
    else:
        # pipeline order: a circuit over a depot (node 0) and the meshes (nodes 1..nm)
        arcs, comm_terms = [], []
        for i in range(nm):
            arcs.append((0, i + 1, first[i]))
            arcs.append((i + 1, 0, last[i]))
            arcs.append((i + 1, i + 1, used[i].Not()))
            model.Add(pos[i] == 0).OnlyEnforceIf(first[i])
            model.Add(pos[i] == 0).OnlyEnforceIf(used[i].Not())
            model.Add(pos[i] == n_used - 1).OnlyEnforceIf(last[i])
            for j in range(nm):
                if i != j:
                    s = model.NewBoolVar(f"succ_{c.meshes[i]}_{c.meshes[j]}")
                    arcs.append((i + 1, j + 1, s))
                    model.Add(pos[j] == pos[i] + 1).OnlyEnforceIf(s)
                    comm_terms.append(s * int(round(v * c.comm_s[i][j] * US)))
        model.AddCircuit(arcs)

    # even split (the usual hand split), for the baseline
    if c.even_split:
        for i in range(nm):
            for j in range(nm):
                if i != j:
                    model.Add(nblk[i] - nblk[j] <= 1).OnlyEnforceIf([used[i], used[j]])

    # symmetry breaking: interchangeable meshes (same options, same links to every other mesh)
    # are used in index order and appear in the pipeline in index order
    for i in range(nm):
        for j in range(i + 1, nm):
            same = c.options[i] == c.options[j] and all(
                c.comm_s[i][k] == c.comm_s[j][k] and c.comm_s[k][i] == c.comm_s[k][j]
                for k in range(nm) if k not in (i, j))
            if same and c.meshes[j] not in c.required_meshes and not c.fixed_order:
                model.AddImplication(used[j], used[i])
                model.Add(pos[i] < pos[j]).OnlyEnforceIf([used[i], used[j]])

    merge = model.NewBoolVar("merge_last_stage")
    if not c.mergeable:
        model.Add(merge == 0)
    infl: Term
    infl_pre: Term
    infl_post: Term
    mx = model.NewIntVar(0, big_t, "max_mesh_time")
    tail_mx = model.NewIntVar(0, big_t, "max_tail")
    for i, name in enumerate(c.meshes):
        tm.append(model.NewIntVar(0, big_t, f"T_{name}"))
        tail.append(model.NewIntVar(0, big_t, f"tail_{name}"))
        merged = model.NewBoolVar(f"merged_{name}")
        model.AddBoolAnd([merge, last[i]]).OnlyEnforceIf(merged)
        model.AddBoolOr([merge.Not(), last[i].Not()]).OnlyEnforceIf(merged.Not())
        model.Add(tm[i] == 0).OnlyEnforceIf(used[i].Not())
        model.Add(tail[i] == 0).OnlyEnforceIf(used[i].Not())
        # the layers after the repeated block run on the last mesh, or on the first in a V
        post_on = first[i] if c.v_shape else last[i]
        if c.fixed_order:
            infl = inflight_count(c.schedule, i, nm, M, v)
            infl_blocks = infl * nblk[i]
            ends = inflight_end_counts(c.schedule, nm, M, v)
            infl_pre = ends[0] if i == 0 else 0
            infl_post = ends[1] if (i == 0 if c.v_shape else i == nm - 1) else 0
        else:
            infl = _inflight_expr(model, c, pos[i], n_used, f"inflight_{name}")
            infl_blocks = model.NewIntVar(0, M * v * L, f"inflight_blocks_{name}")
            model.AddMultiplicationEquality(infl_blocks, [infl, nblk[i]])
            # first (last) stage instances: the whole count at position 0 (P - 1), except in a V
            first_count = (_v_first_expr(model, c, n_used, f"inflight_first_{name}") if c.v_shape
                           else infl)
            infl_pre = model.NewIntVar(0, M * v, f"inflight_pre_{name}")
            model.Add(infl_pre == first_count).OnlyEnforceIf(first[i])
            model.Add(infl_pre == 0).OnlyEnforceIf(first[i].Not())
            infl_post = model.NewIntVar(0, M * v, f"inflight_post_{name}")
            model.Add(infl_post == (1 if c.v_shape else infl)).OnlyEnforceIf(post_on)
            model.Add(infl_post == 0).OnlyEnforceIf(post_on.Not())
        if c.fixed_order:
            # a disaggregated (convex-hull) form: blocks split over per-option counts n_ik, at
            # most one nonzero; time, tail and memory are then linear in n_ik and sel_ik, whose LP
            # relaxation is much tighter than big-M implications (Balas 1979)
            pre_on, po = int(i == 0), int(i == 0 if c.v_shape else i == nm - 1)
            merged_c = merge if (i == nm - 1 and c.mergeable) else 0
            n_k = [model.NewIntVar(0, L, f"blocks_{name}_{k}") for k in range(len(c.options[i]))]
            for k in range(len(n_k)):
                model.Add(n_k[k] <= L * sel[i][k])
            model.Add(sum(n_k) == nblk[i])
            opts_i = c.options[i]
            # (every option's merge saving is the same dispatch: the first's is taken once)
            model.Add(tm[i] == sum(_hull(o.rank_time(v), n_k[k], sel[i][k], pre_on, po)
                                   for k, o in enumerate(opts_i))
                      - _us(opts_i[0].rank_time(v).merged) * merged_c)
            model.Add(tail[i] == sum(_hull(o.tail(v), n_k[k], sel[i][k], pre_on, po)
                                     for k, o in enumerate(opts_i)))
            for k, o in enumerate(opts_i):
                st, rs = o.static(v), o.residual()
                room = int(o.capacity // MB) - (_mb(st.first) * pre_on + _mb(st.post) * po
                                                + _mb(rs.first) * infl_pre + _mb(rs.post) * infl_post
                                                + _mb(st.fixed))
                if room < 0:
                    model.Add(sel[i][k] == 0)
                    continue
                model.Add((_mb(st.per_block) + _mb(rs.per_block) * infl) * n_k[k]
                          <= room * sel[i][k])
            opts_loop: tuple[tuple[int, StageCost], ...] = ()
        else:
            opts_loop = tuple(enumerate(c.options[i]))
        for k, o in opts_loop:
            model.Add(tm[i] == _linear(o.rank_time(v), nblk[i], first[i], post_on, 1, merged)
                      ).OnlyEnforceIf(sel[i][k])
            model.Add(tail[i] == _linear(o.tail(v), nblk[i], first[i], post_on)
                      ).OnlyEnforceIf(sel[i][k])
            # memory, in MB per device: static + residuals in flight + working set <= usable
            model.Add(_linear(o.static(v), nblk[i], first[i], post_on, unit=_mb)
                      + _linear(o.residual(), infl_blocks, infl_pre, infl_post, 0, unit=_mb)
                      <= int(o.capacity // MB)).OnlyEnforceIf(sel[i][k])
        # redundant but tightens the LP bound: no layout beats this mesh's fastest block time
        model.Add(tm[i] >= int(min(o.rank_time(v).per_block for o in c.options[i]) * US) * nblk[i])
        model.Add(mx >= tm[i])
        model.Add(tail_mx >= tail[i])
    model.Add(nm * mx >= sum(tm))      # redundant: tightens the bound of the max
    total = sum(tm) + sum(comm_terms)
    # v * step = v*M*max + (sum - max) + v*tail   (integer form of the docstring's formula)
    model.Minimize(v * M * mx + total - mx + v * tail_mx)

    _hint(model, c, used, first, last, nblk, pos, sel)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, time_limit_s)
    solver.parameters.max_deterministic_time = max(0.05, deterministic_limit or time_limit_s)
    solver.parameters.random_seed = seed
    solver.parameters.num_workers = workers
    solver.parameters.interleave_search = True
    solver.parameters.catch_sigint_signal = False   # see the module docstring
    status, stopped = run_solver(solver, cast(cp_model.CpModel, model), stop)
    name = solver.StatusName(status)
    if status == cp_model.INFEASIBLE:
        return SolveOutcome(None, name, math.inf, solver.deterministic_time, stopped)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return SolveOutcome(None, name, 0.0, solver.deterministic_time, stopped)
    bound_s = max(0.0, solver.BestObjectiveBound() / v / US)
    chosen = sorted((i for i in range(nm) if solver.Value(used[i])), key=lambda i: solver.Value(pos[i]))
    picked = [c.options[i][next(k for k in range(len(sel[i])) if solver.Value(sel[i][k]))]
              for i in chosen]
    return SolveOutcome(Assignment(
        order=tuple(c.meshes[i] for i in chosen),
        blocks=tuple(solver.Value(nblk[i]) for i in chosen),
        layouts=tuple(o.layout for o in picked),
        recompute=tuple(o.recompute for o in picked),
        merge=bool(solver.Value(merge)),
        status=name,
        objective_s=solver.ObjectiveValue() / v / US,
        bound_s=solver.BestObjectiveBound() / v / US,
        wall_s=solver.WallTime(),
        deterministic_s=solver.deterministic_time,
    ), name, bound_s, solver.deterministic_time, stopped)
