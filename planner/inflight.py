"""Microbatches in flight per pipeline rank, by schedule: how many activations (residuals) each
rank holds at its peak, which the CP-SAT model's memory terms and the shape search's bounds use.

Every count is checked against the exact replay's peak on every generator
(``tests/planner/test_every_schedule.py``).
"""

from __future__ import annotations

import functools

from ir.schedule import FragmentKind
from simulator.schedules import KINDS, kind

V_SHAPED = frozenset(n for n, k in KINDS.items() if k.v_shaped)
"""Schedules whose 2P stages sit in a V (:func:`simulator.schedules.v_shape_stage_rank`)."""


def _chunks(schedule: str, virtual_stages: int) -> int:
    """Stages per rank (the schedule's :attr:`~simulator.schedules.ScheduleKind.stages_per_rank`):
    ``virtual_stages`` for interleaved 1F1B, 2 in a V, else 1."""
    return kind(schedule).stages_per_rank(virtual_stages)


def inflight_count(schedule: str, pos: int, ranks: int, microbatches: int, virtual_stages: int
                   ) -> int:
    """Virtual-stage instances (a stage's forward of one microbatch) whose residuals pipeline rank
    ``pos`` of ``ranks`` holds at its peak under ``schedule``: an activation is held from the start
    of its F to the end of its B (W when the backward is split), as
    :func:`simulator.schedules.check.replay` counts it. Never below the replay's ``peak_inflight``
    (``tests/planner/test_every_schedule.py`` holds every generator to it), so memory is never
    under-counted:

    - gpipe: every instance, ``v M``;
    - 1F1B: ``P - p`` (Narayanan et al. 2021, Sec. 2.2);
    - interleaved 1F1B: Megatron-LM's warm-up ``2 (P - p - 1) + (v - 1) P`` plus the one in flight;
    - ZB-H1 and ZB-1p: ``P`` on every rank (Qi et al. 2024, Sec. 2.1: rank p delays its W's by p,
      holding P - p forwards plus p pending W's; ZB-1p's memory limit is P activations per rank);
    - ZB-H2: ``2P - 1`` on every rank (the generator's greedy limit, reached by every rank once
      M >= 2P - 1, not only by rank 0); ZB-2p: ``2P`` (its limit);
    - ZB-V: ``min(2P, M + p + 1)`` (Qi et al. 2024, "Pipeline Parallelism with Controllable
      Memory": 2P chunk activations, i.e. 1F1B's rank-0 peak, on every rank in the steady state;
      ``M + p + 1`` counted on the generator for small M);
    - DualPipeV: ``2P + 1`` (deepseek-ai/DualPipe's table: PP + 1 chunk activations per device).

    Each is capped at ``v M``, ``v`` the stages per rank: ``virtual_stages`` for interleaved 1F1B,
    2 in a V, else 1 (so any ``virtual_stages`` may be passed for the other schedules). The terms
    live with each schedule (:attr:`simulator.schedules.ScheduleKind.inflight`).
    """
    return kind(schedule).inflight_count(pos, ranks, microbatches, virtual_stages)


def inflight_end_counts(schedule: str, ranks: int, microbatches: int, virtual_stages: int
                        ) -> tuple[int, int]:
    """(first, last): instances of the first stage (which holds the layers before the repeated
    block) and of the last stage (the layers after it) that their rank holds at its peak.

    For the V-shaped schedules both stages are on rank 0, which holds at most ``min(2P, M)``
    first-stage instances (chunk 0 of rank 0) and one last-stage instance (its B and W follow its
    F on the same rank: ZB-V's phase 3 and DualPipeV's step 2 run ``F1`` then ``B1`` of the last
    stage without another ``F1`` between); counted on the generators in the tests. Otherwise the
    rank's whole count (:func:`inflight_count` at positions 0 and P - 1; an over-count for
    interleaved 1F1B, whose end stages are one chunk of several).
    """
    P, M = ranks, microbatches
    if schedule in V_SHAPED:
        return min(2 * P, M), 1
    return (inflight_count(schedule, 0, P, M, virtual_stages),
            inflight_count(schedule, P - 1, P, M, virtual_stages))


ORDER_MAX_FRAGMENTS = 2048
"""Largest ranks x microbatches whose order is generated for :func:`rank_order_counts` (beyond
it the generator costs more than the bound gains; the bound falls back to the in-flight count)."""


@functools.lru_cache(maxsize=512)
def rank_order_counts(schedule: str, ranks: int, microbatches: int) -> tuple[tuple[int, int], ...] | None:
    """Per pipeline rank of a line with one stage per rank, from the schedule's own per-rank
    order (:func:`simulator.schedules.generate`, which every plan with that schedule replays):
    (forwards after the rank's first B, weight gradients W before its last B). None for the
    adaptive schedules (their order depends on the fragment times), those with several stages
    per rank, and orders over :data:`ORDER_MAX_FRAGMENTS` (1F1B's and GPipe's are closed forms).
    :func:`planner.bounds.line_fill_level` uses them: every F after the first B runs after the
    pipeline's fill reaches the rank, and every W before the last B delays it."""
    k = kind(schedule)
    if k.adaptive or k.stages_per_rank(2) != 1:
        return None
    if schedule == "1f1b":      # its warm-up: P - r forwards (Narayanan et al. 2021, sec. 2.2)
        return tuple((microbatches - min(ranks - r, microbatches), 0) for r in range(ranks))
    if schedule == "gpipe":     # every forward first
        return ((0, 0),) * ranks
    if ranks * microbatches > ORDER_MAX_FRAGMENTS:
        return None
    from simulator.schedules import generate
    table = generate(schedule, ranks, microbatches)
    out = []
    for order in table.order:
        kinds = [f.kind for f in order]
        B = FragmentKind.B
        first_b = kinds.index(B) if B in kinds else len(kinds)
        last_b = len(kinds) - 1 - kinds[::-1].index(B) if B in kinds else -1
        out.append((sum(1 for x in kinds[first_b:] if x == FragmentKind.F),
                    sum(1 for x in kinds[:last_b] if x == FragmentKind.W)))
    return tuple(out)
