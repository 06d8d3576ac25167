"""A lower bound on a carved pipeline's step under one schedule: the schedule's own dependence
graph as a linear program over the layer partition (:func:`order_bound`).

The exact replay (:mod:`planner.predict`) runs every rank's fragments in the order the schedule's
generator gives (:func:`simulator.schedules.generate`), each as soon as the fragment before it on
its rank and the fragments it depends on have ended (plus the transfer between ranks): ``F(s, j)``
after ``F(s - 1, j)``, ``B(s, j)`` after ``B(s + 1, j)`` (the last stage's after its own ``F``),
``W(s, j)`` after ``B(s, j)``. Its step is therefore at least the longest path through that graph
with each fragment charged its least duration: a chunk of ``n`` blocks costs ``n`` times the least
per-block F, B or W time of the rank's layout option (plus its least dispatch and, on the first
and last stage, the layers outside the blocks), and each rank's end-of-step ops follow: its
stages' exposed gradient sync (``StageCost.sync_excess_s``), its collective stream running every
stage's buckets after the first of its last backwards, the straggler wait and the optimizer.

Start times, the partition (continuous blocks per rank and layout option: a mix of options relaxes
the choice of one, each option within its own memory cap; ``sum v n = L``) and the step are the
variables; minimising the step is a linear program (HiGHS) whose optimum is at most the replay of
any plan of the candidate: a plan's own partition and the earliest start times under the least
durations are feasible, and the replay's durations and waits are no shorter.

Long schedules are truncated: only the first and last :data:`KEEP` microbatches' fragments are
variables. Between two kept fragments of a rank every fragment between them in its order runs,
and after a kept fragment's start the rest of its order does: those sums (by kind, linear in the
partition) keep the middle's work in the program while its size stays bounded.

The adaptive ZB-1p/2p build their order from the fragment times, so they have no rank order
here: each stage runs its F, B and W in microbatch order (the generator takes the next B, the next
F, the oldest pending W), an F waits for the W that frees the activation ``inflight`` microbatches
before it, and a rank, running one fragment at a time, has run before ``F(j)``, ``B(j)`` or
``W(j)`` what must precede it and owes after it every fragment of the later microbatches
(:func:`_free_order`).
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

from ir.schedule import FragmentKind
from simulator.stage_cost import StageCost

F, B, W = FragmentKind.F, FragmentKind.B, FragmentKind.W

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from ir import FragmentRef, ScheduleTable

Terms = list[tuple[int, float]]
"""A constraint's left side: (variable index, coefficient) pairs."""
Sparse = Any   # a scipy.sparse matrix (scipy ships no types)

MAX_FRAGMENTS = 4000
"""Most fragments kept as variables (about 0.5 s of HiGHS on the reference machine)."""
KEEP = 8
"""Microbatches kept as variables at each end of a long schedule (the fill and the drain)."""


def kept_fragments(ranks: int, stages_per_rank: int, microbatches: int) -> int:
    """Fragments :func:`order_bound` keeps as variables (at most 3 per stage and kept
    microbatch); it applies when this is at most :data:`MAX_FRAGMENTS`."""
    return ranks * stages_per_rank * min(microbatches, 2 * KEEP) * 3


@functools.lru_cache(maxsize=64)
def _table(schedule: str, ranks: int, microbatches: int, virtual_stages: int) -> ScheduleTable:
    from simulator.schedules import generate
    return generate(schedule, ranks, microbatches, virtual_stages=virtual_stages)


def order_bound(schedule: str, work: Sequence[Sequence[StageCost]],
                caps: Sequence[Sequence[float]],
                microbatches: int, num_blocks: int, virtual_stages: int,
                post_rank: int, hop: Callable[[int, int], float] | None = None,
                straggler: Sequence[float] = (), mergeable: bool = False,
                inflight: Sequence[int] = (), nodes: int = 0,
                afford: Callable[[int], bool] | None = None) -> float:
    """The least step of the candidate's dependence graph (see the module docstring), seconds;
    0.0 when it does not apply (more than :data:`MAX_FRAGMENTS` kept fragments, an option without
    its forward time, an adaptive schedule without ``inflight``) or the solver fails.

    With ``nodes`` > 0 the graph is a mixed-integer program instead (each rank one layout option,
    ``z[r, o]`` binary with ``x[r, o] <= cap z[r, o]``, and whole blocks per stage) and the bound
    is the dual bound HiGHS proves within that many branch-and-bound nodes (1: its root node, cuts
    included), never below the linear program's; ``afford(nonzeros)`` is asked first with the
    integer program's constraint nonzeros (what its time grows with) and may decline it (the
    linear program's bound is returned then).

    Args:
        schedule: a schedule name.
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
            never below the replay's peak); needed for the adaptive schedules.
    """
    import numpy as np
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix
    from ir import FragmentRef, ScheduleTable
    from simulator.schedules import kind

    sk = kind(schedule)
    p, m, v, L = len(work), microbatches, virtual_stages, num_blocks
    kept_mbs = [j for j in range(m) if j < KEEP or j >= m - KEEP]
    if kept_fragments(p, v, m) > MAX_FRAGMENTS or p < 2 or (sk.adaptive and (v != 1 or not inflight)):
        return 0.0
    if any(o.block_f_s <= 0 for opts in work for o in opts):
        return 0.0
    if sk.adaptive:          # no fixed order: every fragment, each stage's in microbatch order
        table = ScheduleTable(schedule, p, p, m, tuple(range(p)), tuple(
            tuple(FragmentRef(k, r, j) for k in FragmentKind for j in range(m)) for r in range(p)),
            split_backward=True)
    else:
        table = _table(schedule, p, m, v)
    kinds = tuple(FragmentKind) if table.split_backward else (F, B)
    keep = set(kept_mbs)
    # variables: x[r, o] (blocks per chunk of rank r under option o), a start time per kept
    # fragment, the step
    col, nx = [], 0
    for opts in work:
        col.append(list(range(nx, nx + len(opts))))
        nx += len(opts)
    frags = [x for order in table.order for x in order if x.microbatch in keep]
    index = {(x.kind, x.stage, x.microbatch): nx + i for i, x in enumerate(frags)}
    tau = nx + len(frags)
    nvar = tau + 1
    rank_of = table.stage_rank
    last = table.num_stages - 1
    # one fragment's dispatch (merge_saving_s: FSDP's exposed gathers, which fall on some
    # kinds only, left out)
    dispatch = [min(o.merge_saving_s for o in opts) for opts in work]
    offset = [min(o.sync_offset_s for o in opts) for opts in work]
    slot: dict[str, int] = {F: 0, B: 1, W: 2}
    rows, cols, vals, rhs = [], [], [], []
    row = 0

    def add(terms: Terms, const: float) -> None:
        """``sum(coef x var) <= const``."""
        nonlocal row
        for var, coef in terms:
            if coef:
                rows.append(row)
                cols.append(var)
                vals.append(coef)
        rhs.append(const)
        row += 1

    def fixed(u: FragmentRef) -> float:
        """The fragment's least seconds beyond its blocks: its dispatch, and the layers before
        (first stage) or after (last stage) the blocks, at their least over the rank's options."""
        r, i = rank_of[u.stage], slot[u.kind]
        out = dispatch[r]
        if mergeable and u.kind == B and u.stage == last:     # may share F's dispatch
            out = max(0.0, out - max(o.merge_saving_s for o in work[r]))
        if u.stage == 0:
            out += min(o.pre_kinds_s[i] for o in work[r])
        if u.stage == last:
            out += min(o.post_kinds_s[i] for o in work[r])
        return out

    def span(r: int, counts: dict[str, int],
             extra: Callable[[StageCost], float] = lambda o: 0.0) -> Terms:
        """Terms of rank ``r`` running ``counts`` chunk fragments of each kind (plus ``extra``)
        per block variable."""
        return [(col[r][k], sum(c * o.block_kind_s(x) for x, c in counts.items()) + extra(o))
                for k, o in enumerate(work[r])]

    def wait(r: int) -> Terms:
        """The straggler wait of rank ``r``: its share of the rank's work, per option variable."""
        share = straggler[r] if r < len(straggler) else 0.0
        return ([(col[r][k], share * m * o.rank_time(v).per_block) for k, o in enumerate(work[r])]
                if share else [])

    def t(u: FragmentRef) -> int:
        return index[(u.kind, u.stage, u.microbatch)]

    def after(u: FragmentRef, x: FragmentRef, data: bool = False) -> None:
        """``t[x] >= t[u] + duration(u)`` (plus the transfer when ``data`` crosses ranks)."""
        r, q = rank_of[u.stage], rank_of[x.stage]
        move = hop(r, q) if data and hop is not None and q != r else 0.0
        add([(t(u), 1.0), (t(x), -1.0)] + span(r, {u.kind: 1}), -fixed(u) - move)

    def tail(o: StageCost) -> float:
        return v * o.tail_marginal_s

    for r, order in enumerate(table.order):
        if sk.adaptive:
            _free_order(r, order, keep, add, t, col[r], work[r], m, inflight[r], tau, tail, wait(r),
                        fixed)
            continue
        # kept fragments in the rank's order: between two, every fragment between them runs;
        # after one, the rest of the order does, then the rank's optimizer
        counts: dict[str, int] = {k: 0 for k in kinds}
        fixed_sum = 0.0
        prefix = []
        for f in order:
            prefix.append((dict(counts), fixed_sum))
            counts[f.kind] += 1
            fixed_sum += fixed(f)
        total, total_fixed = counts, fixed_sum
        kept = [i for i, f in enumerate(order) if f.microbatch in keep]
        for a, b in zip(kept, kept[1:]):
            (ca, fa), (cb, fb) = prefix[a], prefix[b]
            add([(t(order[a]), 1.0), (t(order[b]), -1.0)]
                + span(r, {k: cb[k] - ca[k] for k in kinds}), -(fb - fa))
        for i in kept:
            ci, fi = prefix[i]
            add([(t(order[i]), 1.0), (tau, -1.0)]
                + span(r, {k: total[k] - ci[k] for k in kinds}, tail) + wait(r),
                -(total_fixed - fi))
    for x in frags:
        if x.kind == F and x.stage > 0:
            after(FragmentRef(F, x.stage - 1, x.microbatch), x, True)
        elif x.kind == B:
            after(FragmentRef(F, last, x.microbatch) if x.stage == last
                  else FragmentRef(B, x.stage + 1, x.microbatch), x, True)
        elif x.kind == W:
            after(FragmentRef(B, x.stage, x.microbatch), x)
    # each stage's gradient sync outlasts its last backward by at least n x excess + offset
    # (planner.options._sync_excess), and the rank's optimizer follows its sync
    lastk = W if table.split_backward else B
    for stage in range(table.num_stages):
        r = rank_of[stage]
        u = FragmentRef(lastk, stage, m - 1)
        add([(t(u), 1.0), (tau, -1.0)]
            + span(r, {lastk: 1}, lambda o: o.sync_excess_s + tail(o)) + wait(r),
            -fixed(u) - offset[r])
    # the rank's collective stream runs every stage's buckets one after another, none before the
    # start of the first of its stages' last backwards; then the optimizer. A block's sync is its
    # exposed excess plus the backward it outlasts (0 when it does not outlast it: a bound)
    for r, order in enumerate(table.order):
        u = next(f for f in order if f.kind == lastk and f.microbatch == m - 1)
        add([(t(u), 1.0), (tau, -1.0)]
            + span(r, {}, lambda o: v * (o.sync_excess_s + o.block_kind_s(lastk)
                                              if o.sync_excess_s > 0 else 0.0) + tail(o))
            + wait(r), 0.0)
    # each rank's whole work with the layers outside the blocks
    for r, opts in enumerate(work):
        merged = mergeable and r == rank_of[last]
        least = min(m * o.rank_time(v).at(0, first=r == 0, holds_post=r == post_rank,
                                          merged=merged)
                    for o in opts)
        add([(col[r][k], m * o.rank_time(v).per_block + v * o.tail_marginal_s)
             for k, o in enumerate(opts)]
            + wait(r) + [(tau, -1.0)], -least)
    a_ub = coo_matrix((vals, (rows, cols)), shape=(row, nvar)).tocsr()
    a_eq = coo_matrix(([float(v)] * nx, ([0] * nx, list(range(nx)))), shape=(1, nvar)).tocsr()
    cost = np.zeros(nvar)
    cost[tau] = 1.0
    bounds: list[tuple[float, float | None]] = []
    for r, opts in enumerate(work):
        for k in range(len(opts)):
            c = caps[r][k]
            bounds.append((0.0, min(float(c), float(L)) / v if math.isfinite(c) else L / v))
    bounds += [(0.0, None)] * (len(frags) + 1)
    got = linprog(cost, A_ub=a_ub, b_ub=np.array(rhs), A_eq=a_eq, b_eq=np.array([float(L)]),
                  bounds=bounds, method="highs")
    if got.status != 0:
        return 0.0
    lp = max(0.0, float(got.fun) * (1 - 1e-6))
    if nodes <= 0 or (afford is not None and not afford(a_ub.nnz + 2 * nx)):
        return lp
    return max(lp, _integer_bound(a_ub, rhs, a_eq, L, bounds, cost, work, col, nx, nodes))


def _integer_bound(a_ub: Sparse, rhs: list[float], a_eq: Sparse, num_blocks: int,
                   bounds: list[tuple[float, float | None]], cost: npt.NDArray[np.float64],
                   work: Sequence[Sequence[StageCost]], col: list[list[int]], nx: int,
                   nodes: int) -> float:
    """The dual bound of the graph as a mixed-integer program (see :func:`order_bound`): whole
    blocks per stage, and one option per rank (binaries ``z``, ``x[r, o] <= cap_o z[r, o]``,
    ``sum_o z[r, o] = 1``); 0.0 when HiGHS proves none."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix, hstack, vstack

    nvar = a_ub.shape[1]
    hi = [math.floor(cast(float, b[1]) + 1e-9) for b in bounds[:nx]]   # the blocks' bounds: finite
    link = coo_matrix(([1.0] * nx + [-float(h) for h in hi],
                       (list(range(nx)) * 2, list(range(nx)) + [nvar + i for i in range(nx)])),
                      shape=(nx, nvar + nx))
    one = coo_matrix(([1.0] * nx, ([r for r, opts in enumerate(work) for _ in opts],
                                   [nvar + k for ks in col for k in ks])), shape=(len(work), nvar + nx))
    ub = vstack([hstack([a_ub, coo_matrix((a_ub.shape[0], nx))]), link]).tocsr()
    eq = vstack([hstack([a_eq, coo_matrix((1, nx))]), one]).tocsr()
    lo = np.zeros(nvar + nx)
    up = np.array([float(h) for h in hi] + [np.inf] * (nvar - nx) + [1.0] * nx)
    integrality = np.zeros(nvar + nx)
    integrality[:nx] = 1
    integrality[nvar:] = 1
    got = milp(np.concatenate([cost, np.zeros(nx)]),
               constraints=[LinearConstraint(ub, -np.inf, np.concatenate([np.array(rhs), np.zeros(nx)])),
                            LinearConstraint(eq, np.array([float(num_blocks)] + [1.0] * len(work)),
                                             np.array([float(num_blocks)] + [1.0] * len(work)))],
               bounds=Bounds(lo, up), integrality=integrality, options={"node_limit": nodes})
    best = getattr(got, "mip_dual_bound", None)
    if best is None or not math.isfinite(best):
        return 0.0
    return max(0.0, float(best) * (1 - 1e-6))


def _free_order(r: int, order: Sequence[FragmentRef], keep: set[int],
                add: Callable[[Terms, float], None], t: Callable[[FragmentRef], int], cols: list[int],
                opts: Sequence[StageCost], m: int, held: int, tau: int,
                tail: Callable[[StageCost], float], wait: Terms,
                fixed: Callable[[FragmentRef], float]) -> None:
    """Rank ``r``'s constraints when its order is not fixed (the adaptive schedules, one stage
    per rank; see the module docstring), over its kept microbatches ``keep``: each kind's
    fragments run in microbatch order (between two kept ones, those between them); ``F(j)`` waits
    for the W that frees the activation ``held`` microbatches before it; running one fragment at a
    time from its first (``F(0)``), the rank has run before ``F(j)``: ``F(0..j-1)`` and the B and W
    memory demands first; before ``B(j)``: ``F(0..j)`` and ``B(0..j-1)``; before ``W(j)``:
    ``F(0..j)``, ``B(0..j)`` and ``W(0..j-1)``; after the start of ``F(j)`` it still runs every
    fragment of microbatches ``j..M-1``, after ``B(j)`` their B and W and the forwards memory
    keeps from starting before it (``M - j - held``), after ``W(j)`` their W; then its optimizer
    step (``tail``) and straggler wait (``wait``)."""
    from ir import FragmentRef
    one = {k: fixed(FragmentRef(k, r, 0)) for k in FragmentKind}   # every microbatch's alike

    def work_of(nf: int, nb: int, nw: int,
                extra: Callable[[StageCost], float] = lambda o: 0.0) -> Terms:
        return [(cols[i], nf * o.block_kind_s(F) + nb * o.block_kind_s(B) + nw * o.block_kind_s(W)
                 + extra(o)) for i, o in enumerate(opts)]

    def const(nf: int, nb: int, nw: int) -> float:
        return nf * one[F] + nb * one[B] + nw * one[W]

    kept = sorted(keep)
    for k in FragmentKind:
        for a, b in zip(kept, kept[1:]):
            n = {x: (b - a if x == k else 0) for x in FragmentKind}
            add([(t(FragmentRef(k, r, a)), 1.0), (t(FragmentRef(k, r, b)), -1.0)]
                + work_of(n[F], n[B], n[W]), -const(n[F], n[B], n[W]))
    for j in kept:
        if j - held in keep:
            add([(t(FragmentRef(W, r, j - held)), 1.0), (t(FragmentRef(F, r, j)), -1.0)]
                + work_of(0, 0, 1), -const(0, 0, 1))
    first = t(FragmentRef(F, r, 0))
    for j in kept:
        for k in FragmentKind:
            if j == 0 and k == F:
                continue
            freed = max(0, j - held + 1)
            done = {F: (j, freed, freed), B: (j + 1, j, 0), W: (j + 1, j + 1, j)}[k]
            add([(first, 1.0), (t(FragmentRef(k, r, j)), -1.0)] + work_of(*done), -const(*done))
            left = m - j
            late = max(0, m - j - held) if k == B else 0
            owed = {F: (left, left, left), B: (late, left, left), W: (0, 0, left)}[k]
            add([(t(FragmentRef(k, r, j)), 1.0), (tau, -1.0)] + work_of(*owed, tail) + wait,
                -const(*owed))
    owed = (m, m, m)
    add([(first, 1.0), (tau, -1.0)] + work_of(*owed, tail) + wait, -const(*owed))
