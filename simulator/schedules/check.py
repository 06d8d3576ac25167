"""Soundness check and exact replay of a pipeline :class:`~ir.ScheduleTable`.

Dependencies (S stages, microbatch m):

- ``F(s, m)`` after ``F(s-1, m)`` (s > 0);
- ``B(S-1, m)`` after ``F(S-1, m)``; ``B(s, m)`` after ``B(s+1, m)`` and ``F(s, m)``;
- ``W(s, m)`` after ``B(s, m)`` (split-backward schedules only).

:func:`validate` checks completeness (every rank lists exactly the fragments of its stages, each
once) and deadlock freedom (a symbolic execution in which each rank runs its order). :func:`replay`
evaluates start and end times under "each rank runs its order sequentially; a fragment starts when
its rank is free and all its inputs have arrived" (a longest-path evaluation without contention),
in O(fragments) with plain dicts and lists.

Activation convention (``peak_inflight``): a forward's activation is held on its rank from the
start of ``F(s, m)`` until the end of ``B(s, m)`` (unsplit backward) or of ``W(s, m)`` (split
backward: the weight gradient still needs the layer inputs). In forward-only schedules an
activation lives only while its ``F`` runs (its output is handed to the next stage), so the peak
is 1 on every rank that runs anything. Because both ends of the interval are on the same rank and
a rank runs its fragments one at a time, the peak depends only on the order, not on durations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from ir import FragmentRef, ScheduleTable
from ir.schedule import FragmentKind

from .base import ScheduleError

Duration = Callable[[int, FragmentRef], float]
"""``duration(rank, ref) -> seconds``."""
Comm = Callable[[int, int, FragmentRef], float]
"""``comm(src_stage, dst_stage, producer_ref) -> seconds`` from the producer's end to the earliest
start of the consumer, applied only when the two stages are on different ranks."""


@dataclass(frozen=True, slots=True)
class Replay:
    """The timing of one step under a schedule (seconds from step start).

    Attributes:
        start / end: ``(rank, ref) -> seconds`` for every fragment of the table.
        makespan: latest end over all fragments.
        busy: per rank, sum of its fragments' durations.
        bubble: per rank, ``1 - busy / makespan`` (0 when the makespan is 0).
        span: per rank, its last end minus its first start (0 for an idle rank); the Zero Bubble
            papers' "stage time", whose excess over ``busy`` is their per-stage bubble.
        peak_inflight: per rank, the maximum number of activations held (see module docstring).
        peak_activation: per rank, the same peak weighted by ``activation(rank, ref)`` (bytes),
            equal to ``peak_inflight`` when no weight function is given.
    """

    start: Mapping[tuple[int, FragmentRef], float]
    end: Mapping[tuple[int, FragmentRef], float]
    makespan: float
    busy: tuple[float, ...]
    bubble: tuple[float, ...]
    span: tuple[float, ...]
    peak_inflight: tuple[int, ...]
    peak_activation: tuple[float, ...]

    def bubble_time(self, rank: int) -> float:
        """Idle seconds of ``rank`` within the makespan."""
        return self.makespan - self.busy[rank]


def dependencies(table: ScheduleTable, ref: FragmentRef) -> tuple[FragmentRef, ...]:
    """The fragments whose outputs ``ref`` consumes (see module docstring)."""
    k, s, m = ref.kind, ref.stage, ref.microbatch
    if k == FragmentKind.F:
        return (FragmentRef(FragmentKind.F, s - 1, m),) if s > 0 else ()
    if k == FragmentKind.B:
        if s == table.num_stages - 1:
            return (FragmentRef(FragmentKind.F, s, m),)
        return (FragmentRef(FragmentKind.B, s + 1, m), FragmentRef(FragmentKind.F, s, m))
    return (FragmentRef(FragmentKind.B, s, m),)


def _check_complete(table: ScheduleTable) -> None:
    name, P, S, M = table.name, table.num_ranks, table.num_stages, table.microbatches
    if S < 1 or M < 1:
        raise ScheduleError(f"schedule {name!r}: num_stages={S}, microbatches={M} must be >= 1")
    for s, r in enumerate(table.stage_rank):
        if not 0 <= r < P:
            raise ScheduleError(f"schedule {name!r}: stage_rank[{s}]={r} is not a rank in "
                                f"0..{P - 1}; fix stage_rank")
    if table.forward_only and table.split_backward:
        raise ScheduleError(f"schedule {name!r}: forward_only and split_backward are exclusive; "
                            f"set split_backward=False")
    kinds: tuple[FragmentKind, ...] = (
        (FragmentKind.F,) if table.forward_only
        else (FragmentKind.F, FragmentKind.B, FragmentKind.W) if table.split_backward
        else (FragmentKind.F, FragmentKind.B))
    seen: set[tuple[str, int, int]] = set()
    for r, frags in enumerate(table.order):
        for f in frags:
            if f.kind not in kinds:
                raise ScheduleError(f"schedule {name!r}: rank {r} lists {f}, but the schedule's "
                                    f"fragment kinds are {kinds}; fix split_backward/forward_only "
                                    f"or remove it")
            if f.stage >= S or f.microbatch >= M:
                raise ScheduleError(f"schedule {name!r}: rank {r} lists {f}, outside {S} stages x "
                                    f"{M} microbatches; remove it")
            if table.stage_rank[f.stage] != r:
                raise ScheduleError(f"schedule {name!r}: rank {r} lists {f}, but stage {f.stage} "
                                    f"is on rank {table.stage_rank[f.stage]}; move it there")
            key = (f.kind, f.stage, f.microbatch)
            if key in seen:
                raise ScheduleError(f"schedule {name!r}: rank {r} lists {f} twice; keep one")
            seen.add(key)
    if len(seen) != S * M * len(kinds):
        for s in range(S):
            r = table.stage_rank[s]
            for m in range(M):
                for k in kinds:
                    if (k, s, m) not in seen:
                        raise ScheduleError(f"schedule {name!r}: rank {r} never runs "
                                            f"{FragmentRef(k, s, m)}; add it to rank {r}'s order")


def _execute(table: ScheduleTable, duration: Duration, comm: Optional[Comm],
             receive: Optional[Duration] = None):
    """Run every rank's order; returns per-rank lists of start times aligned with ``order``
    and end times keyed by ``(kind, stage, microbatch)``, or raises on deadlock.

    Internally fragments are keyed by ``(kind, stage, microbatch)`` tuples (cheap to build).
    """
    S, sr, order = table.num_stages, table.stage_rank, table.order
    last = S - 1
    P = table.num_ranks
    pos = [0] * P
    free = [0.0] * P
    start: list[list[float]] = [[] for _ in range(P)]
    end: dict[tuple[str, int, int], float] = {}
    waiting: dict[tuple[str, int, int], list[int]] = {}
    blocked_on: dict[int, tuple[str, int, int]] = {}
    stack = list(range(P - 1, -1, -1))
    get = end.get
    F, B = FragmentKind.F, FragmentKind.B   # as locals: the loop below is the replay's hot path
    while stack:
        r = stack.pop()
        frags = order[r]
        n = len(frags)
        i, t = pos[r], free[r]
        while i < n:
            ref = frags[i]
            k, s, m = ref.kind, ref.stage, ref.microbatch
            deps: tuple[tuple[str, int, int], ...]
            if k == F:
                deps = ((F, s - 1, m),) if s > 0 else ()
            elif k == B:
                deps = ((F, s, m),) if s == last else ((B, s + 1, m), (F, s, m))
            else:
                deps = ((B, s, m),)
            ready = t
            missing = None
            for d in deps:
                e = get(d)
                if e is None:
                    missing = d
                    break
                if comm is not None and sr[d[1]] != r:
                    e += comm(d[1], s, FragmentRef(*d))
                if e > ready:
                    ready = e
            if missing is not None:
                waiting.setdefault(missing, []).append(r)
                blocked_on[r] = missing
                break
            if receive is not None:
                ready = max(ready, t + receive(r, ref))
            dt = duration(r, ref)
            if not dt >= 0:
                raise ScheduleError(f"schedule {table.name!r}: duration of {ref} on rank {r} is "
                                    f"{dt!r}; durations must be >= 0 seconds")
            start[r].append(ready)
            t = ready + dt
            key = (k, s, m)
            end[key] = t
            i += 1
            woken = waiting.pop(key, None)
            if woken:
                stack.extend(woken)
        pos[r], free[r] = i, t
    stuck = [r for r in range(P) if pos[r] < len(order[r])]
    if stuck:
        parts = "; ".join(f"rank {r} waits at {order[r][pos[r]]} for {FragmentRef(*blocked_on[r])}"
                          for r in stuck)
        raise ScheduleError(f"schedule {table.name!r} deadlocks: {parts}; reorder so that each "
                            f"fragment's producers can run before it")
    return start, end


def validate(table: ScheduleTable) -> None:
    """Check completeness, dependency safety and deadlock freedom of ``table``.

    Raises:
        ScheduleError: naming the first missing, misplaced or duplicated fragment, or, for a
            deadlock, every stuck rank with the fragment it waits at and the input it waits for.
    """
    _check_complete(table)
    _execute(table, lambda r, f: 1.0, None)


def _peaks(table: ScheduleTable, weight: Optional[Callable[[int, FragmentRef], float]]):
    release = FragmentKind.W if table.split_backward else FragmentKind.B
    counts, weights = [], []
    for r, frags in enumerate(table.order):
        if table.forward_only:
            counts.append(1 if frags else 0)
            weights.append(max((weight(r, f) for f in frags), default=0.0) if weight
                           else float(counts[-1]))
            continue
        n = pk = 0
        w = pw = 0.0
        held: dict[tuple[int, int], float] = {}
        for f in frags:
            if f.kind == FragmentKind.F:
                n += 1
                x = weight(r, f) if weight else 1.0
                held[(f.stage, f.microbatch)] = x
                w += x
                if n > pk:
                    pk = n
                if w > pw:
                    pw = w
            elif f.kind == release:
                n -= 1
                w -= held.pop((f.stage, f.microbatch), 0.0)
        counts.append(pk)
        weights.append(pw if weight else float(pk))
    return tuple(counts), tuple(weights)


def replay(table: ScheduleTable, duration: Duration, comm: Optional[Comm] = None, *,
           activation: Optional[Callable[[int, FragmentRef], float]] = None,
           receive: Optional[Duration] = None) -> Replay:
    """Exact timing of ``table`` (a pure function; no contention on links or ranks).

    Args:
        table: a complete schedule.
        duration: ``duration(rank, ref) -> seconds`` of each fragment.
        comm: ``comm(src_stage, dst_stage, producer_ref) -> seconds`` added between a producer's
            end and its consumer's earliest start when the stages are on different ranks
            (None: 0). Same-rank hand-offs (e.g. the V-shape's turn) cost nothing.
        activation: optional ``activation(rank, F-ref) -> bytes`` weighting ``peak_activation``.
        receive: optional ``receive(rank, ref) -> seconds`` the rank's stream spends receiving
            ``ref``'s inputs (blocking point-to-point): ``ref`` starts no earlier than the rank's
            previous fragment's end plus this.

    Returns:
        A :class:`Replay`.

    Raises:
        ScheduleError: the table is incomplete or deadlocks (see :func:`validate`).
    """
    _check_complete(table)
    start, end = _execute(table, duration, comm, receive)
    P = table.num_ranks
    busy = [0.0] * P
    span = [0.0] * P
    st: dict[tuple[int, FragmentRef], float] = {}
    en: dict[tuple[int, FragmentRef], float] = {}
    makespan = 0.0
    for r, frags in enumerate(table.order):
        b = 0.0
        for f, s0 in zip(frags, start[r]):
            e0 = end[(f.kind, f.stage, f.microbatch)]
            key = (r, f)
            st[key] = s0
            en[key] = e0
            b += e0 - s0
        busy[r] = b
        if frags:
            e_last = en[(r, frags[-1])]
            span[r] = e_last - start[r][0]
            if e_last > makespan:
                makespan = e_last
    bubble = tuple((1.0 - b / makespan) if makespan > 0 else 0.0 for b in busy)
    counts, weights = _peaks(table, activation)
    return Replay(start=st, end=en, makespan=makespan, busy=tuple(busy), bubble=bubble,
                  span=tuple(span), peak_inflight=counts, peak_activation=weights)
