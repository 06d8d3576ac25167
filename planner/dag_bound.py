"""A lower bound on a carved pipeline's step under one fixed-order schedule: the schedule's own
dependence graph as a linear program over the layer partition (:func:`order_bound`).

The exact replay (:mod:`planner.predict`) runs every rank's fragments in the order the schedule's
generator gives (:func:`simulator.schedules.generate`; the adaptive ZB-1p/2p build theirs from the
fragment times, so they are left out), each as soon as the fragment before it on its rank and the
fragments it depends on have ended: ``F(s, j)`` after ``F(s - 1, j)``, ``B(s, j)`` after
``B(s + 1, j)`` (the last stage's after its own ``F``), ``W(s, j)`` after ``B(s, j)``. Its step is
therefore at least the longest path through that graph with each fragment charged its least
duration: a chunk of ``n_r`` blocks on rank ``r`` costs ``n_r`` times the least per-block F, B or W
time of any layout option of the rank (plus its least dispatch), and a rank's end-of-step tail
(gradient sync, optimizer) follows its last fragment. Start times, the partition ``n_r``
(continuous, ``sum v n_r = L``, at most the blocks the roomiest option holds) and the step are the
variables; minimising the step under the path constraints is a linear program (HiGHS), whose
optimum is at most the replay of any plan of the candidate: a plan's own partition and the
earliest start times under the least durations are feasible, and the replay's durations and
waits (transfers, link contention, straggler) are no shorter. Each rank's whole work with the
layers outside the blocks (the work term of :func:`planner.bounds.candidate_bound`) is a
constraint too. This captures the bubble of every schedule in its own order, which the
closed-form bounds of :mod:`planner.bounds` only approximate per rank.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

from planner.search import MeshOption

MAX_FRAGMENTS = 4000
"""Largest schedule (fragments) whose graph is solved: beyond it the LP costs more than the
closed-form bounds save (about 0.1 s at this size on the reference machine)."""


@functools.lru_cache(maxsize=64)
def _table(schedule: str, ranks: int, microbatches: int, virtual_stages: int):
    from simulator.schedules import generate
    return generate(schedule, ranks, microbatches, virtual_stages=virtual_stages)


def order_bound(schedule: str, work: Sequence[Sequence[MeshOption]],
                caps: Sequence[Sequence[float]],
                microbatches: int, num_blocks: int, virtual_stages: int,
                post_rank: int, hop: Callable[[int, int], float] | None = None,
                straggler: Sequence[float] = (), mergeable: bool = False,
                inflight: Sequence[int] = ()) -> float:
    """The least step of the candidate's dependence graph (see the module docstring), seconds;
    0.0 when it does not apply (an adaptive schedule, more than :data:`MAX_FRAGMENTS`
    fragments, an option without its forward time) or the solver fails.

    Args:
        schedule: a fixed-order schedule name.
        work: per rank, its layout options (``block_f_s``, ``block_w_s``, ``block_s``, ...).
        caps: per rank, per option, the most blocks (all its chunks) it holds in memory.
        microbatches / num_blocks / virtual_stages: ``M``, ``L``, stages per rank ``v``.
        post_rank: the rank holding the layers after the blocks.
        hop: seconds an activation (or its gradient) takes from rank ``a`` to rank ``b``
            (:func:`simulator.cost_model.transfer_time` over the link between their meshes, what
            the replay adds between a producer's end and its consumer's start); None: 0.
        straggler: per rank, its straggler wait as a share of its work
            (:func:`planner.bounds.straggler_shares`): the gradient sync point waits that long
            after the rank's last fragment and its buckets, before the optimizer.
        mergeable: the last stage's F and B may merge into one fragment (one dispatch).
        inflight: per rank, the most activations it holds (:func:`planner.inflight.inflight_count`,
            never below the replay's peak): for the adaptive ZB-1p/2p, whose order depends on
            the fragment times, the graph has no rank order but each stage's F, B and W in
            microbatch order, ``F(j)`` after ``W(j - inflight)`` (its activation freed), and
            each rank's remaining work after its ``j``-th F, B or W (:func:`_free_order`).
    """
    import numpy as np
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix
    from ir import FragmentRef, ScheduleTable
    from simulator.schedules import kind

    sk = kind(schedule)
    p, m, v, L = len(work), microbatches, virtual_stages, num_blocks
    if p * v * m * 3 > MAX_FRAGMENTS or p < 2 or (sk.adaptive and (v != 1 or not inflight)):
        return 0.0
    if any(o.block_f_s <= 0 for opts in work for o in opts):
        return 0.0
    if sk.adaptive:          # no fixed order: every fragment, each stage's in microbatch order
        table = ScheduleTable(schedule, p, p, m, tuple(range(p)), tuple(
            tuple(FragmentRef(k, r, j) for k in "FBW" for j in range(m)) for r in range(p)),
            split_backward=True)
    else:
        table = _table(schedule, p, m, v)
    # variables: x[r, o] (blocks per chunk of rank r under option o: a mix of options relaxes the
    # choice of one), a start time per fragment, the step
    col, nx = [], 0
    for opts in work:
        col.append(list(range(nx, nx + len(opts))))
        nx += len(opts)
    frags = [x for order in table.order for x in order]
    index = {(x.kind, x.stage, x.microbatch): nx + i for i, x in enumerate(frags)}
    tau = nx + len(frags)
    nvar = tau + 1
    rank_of = table.stage_rank
    per_block = {"F": lambda o: o.block_f_s, "W": lambda o: o.block_w_s,
                 "B": lambda o: o.block_s - o.block_f_s - o.block_w_s}
    # one fragment's dispatch (merge_saving_s: FSDP's exposed gathers, which fall on some
    # kinds only, left out)
    dispatch = [min(o.merge_saving_s for o in opts) for opts in work]
    offset = [min(o.sync_offset_s for o in opts) for opts in work]
    rows, cols, vals, rhs = [], [], [], []
    row = 0

    def add(terms, const: float) -> None:
        """``sum(coef x var) <= const``."""
        nonlocal row
        for var, coef in terms:
            if coef:
                rows.append(row)
                cols.append(var)
                vals.append(coef)
        rhs.append(const)
        row += 1

    def wait(r: int) -> list:
        """The straggler wait of rank ``r``: its share of the rank's work, per option variable."""
        share = straggler[r] if r < len(straggler) else 0.0
        return [(col[r][k], share * m * v * o.block_s) for k, o in enumerate(work[r])] if share else []

    last = table.num_stages - 1
    slot = {"F": 0, "B": 1, "W": 2}

    def duration(u, extra=lambda o: 0.0) -> list:
        r = rank_of[u.stage]
        return [(col[r][k], per_block[u.kind](o) + extra(o)) for k, o in enumerate(work[r])]

    def fixed(u) -> float:
        """The fragment's least seconds beyond its blocks: its dispatch, and the layers before
        (first stage) or after (last stage) the blocks, at their least over the rank's options."""
        r, i = rank_of[u.stage], slot[u.kind]
        out = dispatch[r]
        if mergeable and u.kind == "B" and u.stage == last:     # may share F's dispatch
            out = max(0.0, out - max(o.merge_saving_s for o in work[r]))
        if u.stage == 0:
            out += min(o.pre_kinds_s[i] for o in work[r])
        if u.stage == last:
            out += min(o.post_kinds_s[i] for o in work[r])
        return out

    def after(u, x, data: bool = False) -> None:
        """``t[x] >= t[u] + duration(u)`` (plus the transfer when ``data`` crosses ranks)."""
        r, q = rank_of[u.stage], rank_of[x.stage]
        move = hop(r, q) if data and hop is not None and q != r else 0.0
        add([(index[(u.kind, u.stage, u.microbatch)], 1.0), (index[(x.kind, x.stage, x.microbatch)], -1.0)]
            + duration(u), -fixed(u) - move)

    for r, order in enumerate(table.order):
        if sk.adaptive:
            _free_order(r, order, after, add, index, col[r], work[r], m, inflight[r], tau,
                        lambda o: v * o.tail_marginal_s, wait(r), dispatch[r])
            u = FragmentRef("W", r, m - 1)          # every fragment of the rank precedes it
        else:
            for a, b in zip(order, order[1:]):
                after(a, b)
            u = order[-1]
        # the rank's optimizer step (and parameter gather) follows its last fragment
        add([(index[(u.kind, u.stage, u.microbatch)], 1.0), (tau, -1.0)]
            + duration(u, lambda o: v * o.tail_marginal_s) + wait(r), -fixed(u))
    for x in frags:
        if x.kind == "F" and x.stage > 0:
            after(FragmentRef("F", x.stage - 1, x.microbatch), x, True)
        elif x.kind == "B":
            after(FragmentRef("F", last, x.microbatch) if x.stage == last
                  else FragmentRef("B", x.stage + 1, x.microbatch), x, True)
        elif x.kind == "W":
            after(FragmentRef("B", x.stage, x.microbatch), x)
    # each stage's gradient sync outlasts its last backward by at least n x excess + offset
    # (planner.options._sync_excess), and the rank's optimizer follows its sync
    for stage in range(table.num_stages):
        r = rank_of[stage]
        lastk = "W" if table.split_backward else "B"
        u = [f for f in table.order[r] if f.kind == lastk and f.stage == stage][-1]
        add([(index[(u.kind, u.stage, u.microbatch)], 1.0), (tau, -1.0)]
            + duration(u, lambda o: o.sync_excess_s + v * o.tail_marginal_s) + wait(r),
            -fixed(u) - offset[r])
    # the rank's collective stream runs every stage's buckets one after another, none before the
    # start of the first of its stages' last backwards; then the optimizer. A block's sync is its
    # exposed excess plus the backward it outlasts (0 when it does not outlast it: a bound)
    lastk = "W" if table.split_backward else "B"
    last_of = {"W": lambda o: o.block_w_s, "B": lambda o: o.block_s - o.block_f_s - o.block_w_s}[lastk]
    for r, order in enumerate(table.order):
        u = next(f for f in order if f.kind == lastk and f.microbatch == m - 1)
        add([(index[(u.kind, u.stage, u.microbatch)], 1.0), (tau, -1.0)]
            + [(col[r][k], v * ((o.sync_excess_s + last_of(o) if o.sync_excess_s > 0 else 0.0)
                                + o.tail_marginal_s)) for k, o in enumerate(work[r])] + wait(r), 0.0)
    # each rank's whole work with the layers outside the blocks
    for r, opts in enumerate(work):
        merged = mergeable and r == rank_of[last]
        fixed = min(m * o.overhead_s * v - (m * o.merge_saving_s if merged else 0.0)
                    + m * ((o.pre_s if r == 0 else 0.0) + (o.post_s if r == post_rank else 0.0))
                    for o in opts)
        add([(col[r][k], v * (m * o.block_s + o.tail_marginal_s)) for k, o in enumerate(opts)]
            + wait(r) + [(tau, -1.0)], -fixed)
    a_ub = coo_matrix((vals, (rows, cols)), shape=(row, nvar)).tocsr()
    a_eq = coo_matrix(([float(v)] * nx, ([0] * nx, list(range(nx)))), shape=(1, nvar)).tocsr()
    cost = np.zeros(nvar)
    cost[tau] = 1.0
    bounds = []
    for r, opts in enumerate(work):
        for k in range(len(opts)):
            c = caps[r][k]
            bounds.append((0.0, min(float(c), float(L)) / v if math.isfinite(c) else L / v))
    bounds += [(0.0, None)] * (len(frags) + 1)
    got = linprog(cost, A_ub=a_ub, b_ub=np.array(rhs), A_eq=a_eq, b_eq=np.array([float(L)]),
                  bounds=bounds, method="highs")
    if got.status != 0:
        return 0.0
    return max(0.0, float(got.fun) * (1 - 1e-6))


def _free_order(r, order, after, add, index, col, opts, m, held, tau, tail, wait, dispatch) -> None:
    """Rank ``r``'s constraints when its order is not fixed (see :func:`order_bound`): each
    stage's F, B and W run in microbatch order (the adaptive generator picks the next B, the next
    F, the oldest pending W), an F waits for the W that frees the activation ``held`` microbatches
    before it, and the rank, running one fragment at a time, still owes after the start of
    ``F(j)`` every fragment of microbatches ``j..M-1``, after ``B(j)`` their B and W and the
    forwards that memory keeps from starting before it (``M - j - held``), after ``W(j)`` their
    W: each then its optimizer step (``tail``) and straggler wait (``wait``)."""
    from ir import FragmentRef
    byk = {k: [f for f in order if f.kind == k] for k in "FBW"}
    for k in "FBW":
        for a, b in zip(byk[k], byk[k][1:]):
            after(a, b)
    for j in range(held, m):
        after(FragmentRef("W", r, j - held), FragmentRef("F", r, j))
    per = {"F": lambda o: o.block_s, "B": lambda o: o.block_s - o.block_f_s,
           "W": lambda o: o.block_w_s}
    for k in "FBW":
        for j in range(m):
            left = m - j
            late = max(0, m - j - held) if k == "B" else 0
            add([(index[(k, r, j)], 1.0), (tau, -1.0)]
                + [(col[i], left * per[k](o) + late * o.block_f_s + tail(o))
                   for i, o in enumerate(opts)] + wait,
                -dispatch * (left * (3 if k == "F" else 2 if k == "B" else 1) + late))
