"""Automatic zero-bubble schedules ZB-1p and ZB-2p (Qi et al., "Zero Bubble Pipeline
Parallelism", ICLR 2024, Sec. 3 "Automatic pipeline scheduling").

Unlike the handcrafted ZB-H1/ZB-H2 (:mod:`.zero_bubble`, built for F = B = W), the paper's ZB-1p and
ZB-2p are found by a heuristic over the *profiled* per-stage times ``T_F, T_B, T_W`` and the
communication time ``T_comm``, under an activation-memory limit ``M_limit`` (1p: the memory of 1F1B,
i.e. P in-flight microbatches, the peak of 1F1B's rank 0; 2p: twice that). The paper's heuristic
(Sec. 3.1) is: in the warm-up, each stage schedules as many F's as memory allows before its first
B ("to minimise the bubble before the first B"); afterwards it follows 1F-1B but inserts a W to fill
any bubble "when the waiting time is larger than T_W" (and whenever memory demands it); at the end
the remaining W's. The paper then refines the heuristic's schedule with an ILP.

This module plays that heuristic out as a *list schedule over real durations* (an event-driven
simulation): each time a rank becomes free it picks, in priority order,

1. its next B if the gradient has arrived (B is on the critical path);
2. its next F if the activation has arrived and it holds fewer than ``memory_limit`` activations;
3. its oldest pending W, either always (``fill="greedy"``) or only when the W ends before the next
   known arrival of an F or B input (``fill="fit"``: otherwise it waits, as the paper's
   "waiting time larger than T_W" rule); a W is always run when memory blocks the next F;
4. else it idles until an input arrives.

A fragment is placed only once all its inputs have been placed, at a time no earlier than their
ends plus ``comm``, so every rank's order is a real execution order: the table never deadlocks, for
ANY durations (the global start-time order is a topological order consistent with every rank's
order). Activations are counted as in :mod:`.check` (from the start of F to the end of W), so the
peak per rank is at most its limit: ``memory_limit``, or, given each stage's activation bytes, a
byte budget of ``memory_limit`` microbatches of the first two stages (:func:`per_rank_limits`, as
Qi et al.'s implementation budgets it), so a stage whose microbatch keeps more (the vocabulary
head's) holds fewer.

"Local improvement" (the paper's ILP, replaced by a cheap search): several candidates are built
(both W-fill rules; warm-up forwards capped at ``memory_limit - k`` for small k; the handcrafted
ZB-H1 and ZB-H2, each also with its W lag or warm-up cut to every rank's limit) and, of those
within every rank's limit, the one with the smallest exact :func:`.check.replay` makespan (or
span) wins; ties keep the earlier one. So ZB-2p is never slower than ZB-1p or ZB-H2, nor ZB-1p
than ZB-H1, for the given durations, whenever those fit the limits.
"""

from __future__ import annotations

import heapq
import sys
from collections import deque
from typing import Callable, Sequence, Union

from ir import FragmentRef, ScheduleTable
from ir.schedule import FragmentKind

from .base import B, F, ScheduleError, W, check_sizes, make_table, no_forward_only
from .check import replay
from .zero_bubble import zb_h1, zb_h2
from .kind import ScheduleKind

StageDuration = Callable[[int, str], float]
"""``durations(stage, kind) -> seconds`` with kind a :class:`~ir.schedule.FragmentKind`
(``"F"``, ``"B"`` or ``"W"``)."""
StageComm = Union[float, Callable[[int, int], float]]
"""Seconds from a producer's end to the consumer's earliest start across ranks: a constant or
``comm(src_stage, dst_stage) -> seconds``."""

NAMES = {1: "zb-1p", 2: "zb-2p"}


def _uniform(stage: int, kind: str) -> float:
    return 1.0


def _comm_fn(comm: StageComm) -> Callable[[int, int], float]:
    if callable(comm):
        return comm
    c = float(comm)
    if not c >= 0:
        raise ScheduleError(f"comm={comm!r} must be >= 0 seconds")
    return lambda a, b: c


def list_schedule(P: int, M: int, dur: StageDuration, comm: Callable[[int, int], float], *,
                  limit: int | Sequence[int], fill: str = "greedy", warmup: int | None = None
                  ) -> list[list[FragmentRef]]:
    """One greedy list schedule (see the module docstring); returns each rank's order.

    ``limit`` is the most activations a rank may hold (one int for every rank, or one per rank);
    ``warmup`` caps the forwards a rank runs before its first B (None: its limit).
    """
    d = {(s, k): dur(s, k) for s in range(P) for k in FragmentKind}
    for key, v in d.items():
        if not v >= 0:
            raise ScheduleError(f"duration of {key[1]} on stage {key[0]} is {v!r}; durations must "
                                f"be >= 0 seconds")
    cm = {(a, b): comm(a, b) for a in range(P) for b in range(P) if abs(a - b) == 1}
    for pair, v in cm.items():
        if not v >= 0:
            raise ScheduleError(f"comm from stage {pair[0]} to {pair[1]} is {v!r}; use >= 0 "
                                f"seconds")
    lim = [limit] * P if isinstance(limit, int) else [int(x) for x in limit]
    if len(lim) != P or min(lim) < 1:
        raise ScheduleError(f"limit={limit!r}: give one int >= 1, or one per rank ({P})")
    warm = [x if warmup is None else max(1, min(warmup, x)) for x in lim]
    end_f: list[list[float | None]] = [[None] * M for _ in range(P)]  # end of F(r, m) once placed
    end_b: list[list[float | None]] = [[None] * M for _ in range(P)]
    nf, nb, nw = [0] * P, [0] * P, [0] * P
    free = [0.0] * P
    order: list[list[FragmentRef]] = [[] for _ in range(P)]
    heap = [(0.0, r) for r in range(P)]
    waiting: set[int] = set()
    remaining = 3 * P * M

    def arrival_f(r: int) -> float | None:          # input of F(r, nf[r]); None: not placed yet
        if r == 0:
            return 0.0
        e = end_f[r - 1][nf[r]]
        return None if e is None else e + cm[(r - 1, r)]

    def arrival_b(r: int) -> float | None:          # inputs of B(r, nb[r])
        k = nb[r]
        if k >= nf[r]:
            return None
        if r == P - 1:
            return end_f[r][k]
        e = end_b[r + 1][k]
        if e is None:
            return None
        f = end_f[r][k]
        assert f is not None                        # k < nf[r]: F(r, k) is placed
        return max(e + cm[(r + 1, r)], f)

    def place(r: int, t: float, kind: FragmentKind) -> None:
        nonlocal remaining
        if kind == FragmentKind.F:
            m = nf[r]
            end_f[r][m] = free[r] = t + d[(r, FragmentKind.F)]
            nf[r] += 1
            order[r].append(F(r, m))
            wake = (r + 1,) if r + 1 < P else ()
        elif kind == FragmentKind.B:
            m = nb[r]
            end_b[r][m] = free[r] = t + d[(r, FragmentKind.B)]
            nb[r] += 1
            order[r].append(B(r, m))
            wake = (r - 1,) if r > 0 else ()
        else:
            order[r].append(W(r, nw[r]))
            nw[r] += 1
            free[r] = t + d[(r, FragmentKind.W)]
            wake = ()
        remaining -= 1
        heapq.heappush(heap, (free[r], r))
        for q in wake:
            if q in waiting:
                waiting.discard(q)
                heapq.heappush(heap, (max(t, free[q]), q))

    while remaining:
        if not heap:   # cannot happen: some rank can always progress (see module docstring)
            raise ScheduleError(f"zero-bubble list schedule stalled at P={P}, M={M}; report this")
        t, r = heapq.heappop(heap)
        if t < free[r] or nw[r] == M:
            continue
        ab = arrival_b(r)
        if ab is not None and ab <= t:
            place(r, t, FragmentKind.B)
            continue
        held = nf[r] - nw[r]
        f_ok = nf[r] < M and held < lim[r] and (nb[r] > 0 or nf[r] < warm[r])
        af = arrival_f(r) if f_ok else None
        if af is not None and af <= t:
            place(r, t, FragmentKind.F)
            continue
        pending_w = nw[r] < nb[r]
        if pending_w and (fill == "greedy" or (nf[r] < M and held >= lim[r])):
            place(r, t, FragmentKind.W)   # greedy fill, or memory blocks the next F
            continue
        if pending_w:          # fill == "fit": a W only if it ends before the next input
            can_b = nb[r] < nf[r]
            if not can_b and not f_ok:
                place(r, t, FragmentKind.W)   # nothing but W's can come next
                continue
            bounds = []
            if can_b:
                bounds.append(ab if ab is not None
                              else t + d[(r + 1, FragmentKind.B)] + cm[(r + 1, r)])
            if f_ok:
                bounds.append(af if af is not None
                              else t + d[(r - 1, FragmentKind.F)] + cm[(r - 1, r)])
            if t + d[(r, FragmentKind.W)] <= min(bounds):
                place(r, t, FragmentKind.W)
                continue
        nxt = min((a for a in (ab, af) if a is not None), default=None)
        if nxt is not None:
            heapq.heappush(heap, (nxt, r))
        waiting.add(r)
    return order


def per_rank_limits(memory_limit: int, activation: Sequence[float]) -> list[int]:
    """Activations each rank may hold when the limit is a byte budget: ``memory_limit`` times the
    larger per-microbatch activation of the first two stages, divided by each stage's own
    (at least 1). Qi et al.'s implementation sets ZB-1p's budget that way (``--zero-bubble-max-
    pending-backward`` x the profiled activation of stages 0 and 1, the same for every stage), so a
    stage whose microbatch keeps more (the last, with the vocabulary head's logits) holds fewer.

    Raises:
        ScheduleError: a negative activation, or none given.
    """
    if not activation or min(activation) < 0:
        raise ScheduleError(f"activation={list(activation)!r}: give each stage's bytes, >= 0")
    budget = memory_limit * max(activation[:2])
    return [max(1, int(budget // a)) if a > 0 else sys.maxsize for a in activation]


def zero_bubble_auto(num_ranks: int, microbatches: int,
                     durations: StageDuration | None = None, comm: StageComm = 0.0, *,
                     memory_limit: int, name: str | None = None, objective: str = "makespan",
                     forward_only: bool = False,
                     activation: Sequence[float] | None = None,
                     receive: StageDuration | None = None) -> ScheduleTable:
    """The automatic zero-bubble schedule for the given stage times and memory limit.

    Args:
        num_ranks: pipeline ranks P (one stage each, S = P).
        microbatches: M >= 1.
        durations: ``durations(stage, kind) -> seconds`` for kind F, B (input gradient), W
            (weight gradient); None: F = B = W = 1.
        comm: seconds between a producer's end and a consumer's earliest start on the next or
            previous rank (a constant or ``comm(src_stage, dst_stage)``).
        memory_limit: the most activations (microbatches in flight, F start to W end) any rank may
            hold; ``P`` gives ZB-1p, ``2P`` ZB-2p (Qi et al. 2024, Sec. 3).
        activation: optional bytes one microbatch keeps on each stage; the limit then becomes a
            byte budget (:func:`per_rank_limits`), so each rank holds as many as its own fit.
        receive: optional ``receive(stage, kind) -> seconds`` a rank's stream spends receiving a
            fragment's input (blocking point-to-point), used when the candidates are timed.
        name: table name (default ``"zb-1p"``/``"zb-2p"`` for those limits, else ``"zb-auto"``).
        objective: what the candidate search minimises: ``"makespan"`` (one isolated step: the
            optimizer waits for every rank) or ``"span"`` (the largest per-rank span, first start to
            last end: the iteration period when iterations overlap because the optimizer step is
            not synchronised across stages, Qi et al. Sec. 4; the paper's scheduler objective).

    Raises:
        ScheduleError: a size below 1, ``memory_limit < 1``, a negative duration or comm, or
            ``forward_only=True``.
    """
    if objective not in ("makespan", "span"):
        raise ScheduleError(f"objective={objective!r} unknown; use 'makespan' or 'span'")
    label = name or {num_ranks * k: v for k, v in NAMES.items()}.get(memory_limit, "zb-auto")
    check_sizes(label, num_ranks, microbatches)
    no_forward_only(label, forward_only)
    if not isinstance(memory_limit, int) or memory_limit < 1:
        raise ScheduleError(f"schedule {label!r}: memory_limit={memory_limit!r} must be an int >= 1 "
                            f"(activations in flight per rank; {num_ranks} for zb-1p)")
    P, M = num_ranks, microbatches
    dur = durations or _uniform
    cfn = _comm_fn(comm)
    if activation is not None and len(activation) != P:
        raise ScheduleError(f"activation has {len(activation)} stages; give one per rank ({P})")
    lim = per_rank_limits(memory_limit, activation) if activation is not None else [memory_limit] * P
    lim1 = per_rank_limits(P, activation) if activation is not None else [P] * P
    candidates: list[list[list[FragmentRef]]] = []
    for fill in ("fit", "greedy"):
        for k in range(min(3, memory_limit)):
            candidates.append(list_schedule(P, M, dur, cfn, limit=lim, fill=fill,
                                            warmup=memory_limit - k))
    candidates.append([list(o) for o in zb_h1(P, M).order])
    lags = [max(0, min(r, x - (P - r))) for r, x in enumerate(lim1)]
    if lags != list(range(P)):       # ZB-H1 with each rank's W lag cut to its memory
        candidates.append([list(o) for o in zb_h1(P, M, w_lag=lags).order])
    candidates.append([list(o) for o in zb_h2(P, M).order])
    caps = [min(2 * P - 1, x) for x in lim]
    if caps != [2 * P - 1] * P:      # ZB-H2 with each rank's warm-up cut to its memory
        candidates.append([list(o) for o in zb_h2(P, M, limits=caps).order])
    if memory_limit >= 2 * P:   # ZB-2p may also run any ZB-1p candidate
        for fill in ("fit", "greedy"):
            candidates.append(list_schedule(P, M, dur, cfn, limit=lim1, fill=fill))

    def fdur(rank: int, ref: FragmentRef) -> float:
        return dur(ref.stage, ref.kind)

    def fcomm(a: int, b: int, ref: FragmentRef) -> float:
        return cfn(a, b)

    frecv = None if receive is None else (lambda rank, ref: receive(ref.stage, ref.kind))

    best, best_t = None, None
    for order in candidates:
        table = make_table(label, P, M, range(P), order, split_backward=True)
        rp = replay(table, fdur, fcomm, receive=frecv)
        if any(n > x for n, x in zip(rp.peak_inflight, lim)):
            continue       # a handcrafted table over this memory budget
        t = rp.makespan if objective == "makespan" else max(rp.span)
        if best_t is None or t < best_t * (1 - 1e-12):
            best, best_t = table, t
    assert best is not None
    return best


def zb_1p(num_ranks: int, microbatches: int, *, durations: StageDuration | None = None,
          comm: StageComm = 0.0, forward_only: bool = False) -> ScheduleTable:
    """ZB-1p: :func:`zero_bubble_auto` with ``memory_limit = num_ranks`` (1F1B's peak)."""
    return zero_bubble_auto(num_ranks, microbatches, durations, comm, memory_limit=num_ranks,
                            name="zb-1p", forward_only=forward_only)


def zb_2p(num_ranks: int, microbatches: int, *, durations: StageDuration | None = None,
          comm: StageComm = 0.0, forward_only: bool = False) -> ScheduleTable:
    """ZB-2p: :func:`zero_bubble_auto` with ``memory_limit = 2 * num_ranks``."""
    return zero_bubble_auto(num_ranks, microbatches, durations, comm,
                            memory_limit=2 * num_ranks, name="zb-2p", forward_only=forward_only)


KINDS = (
    ScheduleKind("zb-1p", order=5, inflight=lambda P, p, M, v: [P],   # ZB-1p's memory limit
                 generate=lambda P, M, *, forward_only=False, durations=None, comm=0.0, **_: zb_1p(
                     P, M, durations=durations, comm=comm, forward_only=forward_only),
                 split_backward=True, adaptive=True, sync_exposed=True),
    ScheduleKind("zb-2p", order=6, inflight=lambda P, p, M, v: [2 * P],   # ZB-2p's limit
                 generate=lambda P, M, *, forward_only=False, durations=None, comm=0.0, **_: zb_2p(
                     P, M, durations=durations, comm=comm, forward_only=forward_only),
                 split_backward=True, adaptive=True, sync_exposed=True),
)
"""Qi et al. 2024's automatic ZB-1p / ZB-2p, built from the fragment durations."""
