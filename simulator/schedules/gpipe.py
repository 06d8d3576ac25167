"""GPipe: every rank runs all forwards, then all backwards (Huang et al. 2019, "GPipe").

One stage per rank (S = P). Rank r runs ``F(r, 0..M-1)`` then ``B(r, 0..M-1)``. With uniform
stages (forward F, backward B, no communication) the step takes ``(M + P - 1)(F + B)``, so every
rank's bubble fraction is ``(P - 1) / (M + P - 1)`` (GPipe, Sec. 2.3), and rank 0 holds all M
activations at its peak. ``forward_only=True`` gives the inference pipeline: forwards only.
"""

from __future__ import annotations

from ir import ScheduleTable

from .base import B, F, check_sizes, make_table
from .kind import ScheduleKind

NAME = "gpipe"


def gpipe(num_ranks: int, microbatches: int, *, forward_only: bool = False,
          name: str = NAME) -> ScheduleTable:
    """GPipe schedule on ``num_ranks`` ranks for ``microbatches`` microbatches.

    Raises:
        ScheduleError: a size below 1.
    """
    check_sizes(name, num_ranks, microbatches)
    order = []
    for r in range(num_ranks):
        frags = [F(r, m) for m in range(microbatches)]
        if not forward_only:
            frags += [B(r, m) for m in range(microbatches)]
        order.append(frags)
    return make_table(name, num_ranks, microbatches, range(num_ranks), order,
                      forward_only=forward_only)


KINDS = (ScheduleKind(
    NAME, order=2, inflight=lambda P, p, M, v: [],   # every instance, v M
    generate=lambda P, M, *, forward_only=False, **_: gpipe(P, M, forward_only=forward_only),
    sync_exposed=True),)
"""GPipe holds every microbatch's activations until its backwards."""
