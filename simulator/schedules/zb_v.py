"""ZB-V: the zero-bubble V-shape schedule (Qi et al. 2024, "Pipeline Parallelism with
Controllable Memory", Sec. 4 and Fig. 4; also the Zero Bubble repository's "ZBV").

S = 2P stages in a V: stage s on rank s for s < P and on rank ``2P - 1 - s`` after (rank r
holds chunk 0 = stage r and chunk 1 = stage ``2P - 1 - r``; rank 0 holds the first and the last
stage). The backward is split into B and W; activations are held until W ends.

Rank r's order, in phases (counters per chunk advance 0..M-1; an op whose counter has reached M
is skipped):

1. ``2(P - r) - 1`` forwards of chunk 0;
2. ``r`` pairs ``F1, F0``;
3. ``P - r`` triples ``F1, B1, W1``;
4. steady rounds ``F0 (while any left), B0, W0, F1, B1, W1`` until chunk 1 has run all forwards;
5. ``r`` pairs ``B0, B1`` with their W's deferred;
6. ``P - r`` pairs ``B0, W0`` (the W of the oldest deferred chunk-0 backward);
7. the deferred W's, chunk 1 first, then chunk 0.

Any M >= 1 is accepted. With F = B = W per chunk and ``M >= 2P - 1``, each rank's span from
first to last fragment has no idle time (measured; the paper's "zero bubble" for ZB-V, its table:
bubble rate 0 at 1x 1F1B memory), the step takes ``6M + (P - 1)`` units (the start-up offset of
the last rank), and every rank holds at most 2P chunk activations = P whole-rank activations,
1F1B's rank-0 peak. Smaller M leaves a bubble (the schedule skips the missing microbatches).
"""

from __future__ import annotations

from ir import FragmentRef, ScheduleTable

from .base import B, F, W, check_sizes, make_table, no_forward_only, v_shape_stage_rank
from .kind import ScheduleKind

NAME = "zb-v"


def zb_v(num_ranks: int, microbatches: int, *, forward_only: bool = False) -> ScheduleTable:
    """ZB-V on ``num_ranks`` ranks (2 stages each) for ``microbatches`` microbatches.

    Raises:
        ScheduleError: a size below 1, or ``forward_only=True``.
    """
    check_sizes(NAME, num_ranks, microbatches)
    no_forward_only(NAME, forward_only)
    P, M = num_ranks, microbatches
    order = []
    for r in range(P):
        stage = (r, 2 * P - 1 - r)
        nf, nb, nw = [0, 0], [0, 0], [0, 0]
        frags: list[FragmentRef] = []

        def f(c: int) -> None:
            if nf[c] < M:
                frags.append(F(stage[c], nf[c]))
                nf[c] += 1

        def b(c: int) -> None:
            if nb[c] < M:
                frags.append(B(stage[c], nb[c]))
                nb[c] += 1

        def w(c: int) -> None:
            if nw[c] < nb[c]:
                frags.append(W(stage[c], nw[c]))
                nw[c] += 1

        for _ in range(2 * (P - r) - 1):
            f(0)
        for _ in range(r):
            f(1)
            f(0)
        for _ in range(P - r):
            f(1)
            b(1)
            w(1)
        while nf[1] < M:
            f(0)
            b(0)
            w(0)
            f(1)
            b(1)
            w(1)
        for _ in range(r):
            b(0)
            b(1)
        for _ in range(P - r):
            b(0)
            w(0)
        while nw[1] < nb[1]:
            w(1)
        while nw[0] < nb[0]:
            w(0)
        order.append(frags)
    return make_table(NAME, P, M, v_shape_stage_rank(P), order, split_backward=True)


KINDS = (ScheduleKind(
    NAME, order=7,
    # Qi et al. 2024 (controllable memory): 2P chunk activations; M + p + 1 for small M
    inflight=lambda P, p, M, v: [2 * P, M + p + 1],
    generate=lambda P, M, *, forward_only=False, **_: zb_v(P, M, forward_only=forward_only),
    stages_per_rank=lambda virtual_stages: 2, v_shaped=True, split_backward=True,
    aliases=("zbv",), sync_exposed=True),)
"""ZB-V: two stages per rank in a V, the backward split."""
