"""Eager 1F1B: 1F1B with one more warm-up forward on every rank.

Rank r runs ``w = min(P - r, M)`` warm-up forwards (1F1B runs ``P - r - 1``), then ``M - w`` pairs
``F(r, w+i), B(r, i)``, then the ``w`` remaining backwards. Each rank has its next forward's input
before its backward's gradient arrives, so a slow point-to-point receive of that gradient overlaps a
forward instead of idling the rank; the price is one more microbatch of activations (rank r holds
``min(P - r + 1, M)``). Same step time as 1F1B with uniform stages and free transfers. One stage
per rank (S = P). Not in the planner's default search (``searched=False``): name it with
``--schedule eager-1f1b``.

``forward_only=True`` degenerates to the GPipe forward pipeline (inference has no backwards).
"""

from __future__ import annotations

from ir import ScheduleTable

from .base import check_sizes, make_table
from .gpipe import gpipe
from .kind import ScheduleKind
from .one_f_one_b import warm_up_then_pairs

NAME = "eager-1f1b"


def eager_1f1b(num_ranks: int, microbatches: int, *, forward_only: bool = False) -> ScheduleTable:
    """Eager 1F1B on ``num_ranks`` ranks for ``microbatches`` microbatches.

    Raises:
        ScheduleError: a size below 1.
    """
    check_sizes(NAME, num_ranks, microbatches)
    if forward_only:
        return gpipe(num_ranks, microbatches, forward_only=True, name=NAME)
    P, M = num_ranks, microbatches
    return make_table(NAME, P, M, range(P), warm_up_then_pairs(P, M, lambda r: min(P - r, M)))


KINDS = (ScheduleKind(
    NAME, order=9, inflight=lambda P, p, M, v: [P - p + 1],
    generate=lambda P, M, *, forward_only=False, **_: eager_1f1b(P, M, forward_only=forward_only),
    sync_exposed=True, searched=False),)
"""Eager 1F1B: rank p holds ``P - p + 1`` microbatches; named only, not searched by default."""
