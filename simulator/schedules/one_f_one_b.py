"""1F1B (PipeDream-Flush): warm-up forwards, one-forward-one-backward, cool-down backwards.

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", Sec. 2.2.1 (the PipeDream-Flush schedule). One stage per rank (S = P). Rank r runs
``w = min(P - r - 1, M)`` warm-up forwards, then ``M - w`` pairs ``F(r, w+i), B(r, i)``, then the
``w`` remaining backwards. Uniform stages give the same step time as GPipe,
``(M + P - 1)(F + B)`` (bubble fraction ``(P - 1)/(M + P - 1)``), but rank r holds at most
``min(P - r, M)`` activations instead of M.

``forward_only=True`` degenerates to the GPipe forward pipeline (inference has no backwards).
"""

from __future__ import annotations

from typing import Callable

from ir import FragmentRef, ScheduleTable

from .base import B, F, check_sizes, make_table
from .gpipe import gpipe
from .kind import ScheduleKind

NAME = "1f1b"


def one_f_one_b(num_ranks: int, microbatches: int, *, forward_only: bool = False) -> ScheduleTable:
    """1F1B schedule on ``num_ranks`` ranks for ``microbatches`` microbatches.

    Raises:
        ScheduleError: a size below 1.
    """
    check_sizes(NAME, num_ranks, microbatches)
    if forward_only:
        return gpipe(num_ranks, microbatches, forward_only=True, name=NAME)
    P, M = num_ranks, microbatches
    return make_table(NAME, P, M, range(P), warm_up_then_pairs(P, M, lambda r: min(P - r - 1, M)))


def warm_up_then_pairs(P: int, M: int, warm_up: Callable[[int], int]) -> list[list[FragmentRef]]:
    """Every rank's 1F1B-shaped order, one stage per rank: ``w = warm_up(r)`` forwards, then
    ``M - w`` pairs ``F(r, w+i), B(r, i)``, then the ``w`` remaining backwards."""
    order = []
    for r in range(P):
        w = warm_up(r)
        frags = [F(r, m) for m in range(w)]
        for i in range(M - w):
            frags += [F(r, w + i), B(r, i)]
        frags += [B(r, m) for m in range(M - w, M)]
        order.append(frags)
    return order


KINDS = (ScheduleKind(
    NAME, order=0, inflight=lambda P, p, M, v: [P - p],   # Narayanan et al. 2021, Sec. 2.2
    generate=lambda P, M, *, forward_only=False, **_: one_f_one_b(P, M, forward_only=forward_only),
    fb_mergeable=True, sync_exposed=True),)
"""1F1B: rank p holds ``P - p`` microbatches; the last stage's F and B may merge."""
