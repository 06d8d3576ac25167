"""DualPipeV: DualPipe "cut in half" into a V on P ranks (deepseek-ai/DualPipe, ``DualPipeV``;
DualPipe itself: DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", Sec. 3.2.1).

S = 2P stages in a V (rank r holds chunk 0 = stage r and chunk 1 = stage ``2P - 1 - r``).
The backward is split into B (input gradient) and W (weight gradient). A *full* backward is
B immediately followed by its W; a *zero-bubble* backward defers its W to a FIFO queue that the
schedule drains at set points. Rank r's order, in the eight steps of DualPipeV (counters per chunk
advance 0..M-1):

1. ``2(P - r - 1)`` forwards of chunk 0;
2. ``r + 1`` pairs ``F0, F1``;
3. ``P - r - 1`` rounds: zero-bubble ``B1``, one queued W, ``F1``;
4. ``M - 2P + r + 1`` rounds ``F0 & B1``, ``F1 & B0`` (full backwards; "&" is DualPipe's
   overlapped forward-backward pair, run here as the forward then the backward);
5. ``P - r - 1`` rounds: full ``B1``, then ``F1 & B0``;
6. ``r + 1`` rounds ``B1, B0``, switching to zero-bubble backwards half-way (at round
   ``(r + 1) // 2``: before that round's B1 on odd ranks, after it on even ranks);
7. ``P - r - 1`` rounds: one queued W, zero-bubble ``B0``;
8. ``r + 1`` queued W's.

DualPipeV needs ``M >= 2P``. The repository's table gives, with PP = 2P stages, a bubble of
``(PP/2 - 1)(F&B + B - 3W)`` where B is a *full* backward and F&B the time of an overlapped
forward-backward pair, and ``PP + 1`` chunk activations per device. This simulator runs the pair
sequentially, so F&B = F + B + W in our split notation and the bound reads
``(P - 1)(F + 2B - W)``.
"""

from __future__ import annotations

from collections import deque

from ir import FragmentRef, ScheduleTable

from .base import B, F, W, ScheduleError, check_sizes, make_table, no_forward_only, v_shape_stage_rank
from .kind import ScheduleKind

NAME = "dualpipe-v"


def dualpipe_v(num_ranks: int, microbatches: int, *, forward_only: bool = False) -> ScheduleTable:
    """DualPipeV on ``num_ranks`` ranks (2 stages each) for ``microbatches`` microbatches.

    Raises:
        ScheduleError: a size below 1, ``microbatches < 2 * num_ranks``, or ``forward_only``.
    """
    check_sizes(NAME, num_ranks, microbatches)
    no_forward_only(NAME, forward_only)
    P, M = num_ranks, microbatches
    if M < 2 * P:
        raise ScheduleError(f"schedule {NAME!r}: microbatches={M} is below 2 * num_ranks = "
                            f"{2 * P} (DualPipeV's condition); use at least {2 * P} microbatches")
    order = []
    for r in range(P):
        stage = (r, 2 * P - 1 - r)
        nf, nb = [0, 0], [0, 0]
        queue: deque[FragmentRef] = deque()
        frags: list[FragmentRef] = []

        def f(c: int) -> None:
            frags.append(F(stage[c], nf[c]))
            nf[c] += 1

        def b(c: int, zero_bubble: bool) -> None:
            frags.append(B(stage[c], nb[c]))
            if zero_bubble:
                queue.append(W(stage[c], nb[c]))
            else:
                frags.append(W(stage[c], nb[c]))
            nb[c] += 1

        def w() -> None:
            frags.append(queue.popleft())

        for _ in range(2 * (P - r - 1)):
            f(0)
        for _ in range(r + 1):
            f(0)
            f(1)
        for _ in range(P - r - 1):
            b(1, True)
            w()
            f(1)
        for _ in range(M - 2 * P + r + 1):
            f(0)
            b(1, False)
            f(1)
            b(0, False)
        for _ in range(P - r - 1):
            b(1, False)
            f(1)
            b(0, False)
        zb = False
        for i in range(r + 1):
            if i == (r + 1) // 2 and r % 2 == 1:
                zb = True
            b(1, zb)
            if i == (r + 1) // 2 and r % 2 == 0:
                zb = True
            b(0, zb)
        for _ in range(P - r - 1):
            w()
            b(0, True)
        while queue:
            w()
        order.append(frags)
    return make_table(NAME, P, M, v_shape_stage_rank(P), order, split_backward=True)


KINDS = (ScheduleKind(
    NAME, order=8, inflight=lambda P, p, M, v: [2 * P + 1],   # deepseek-ai/DualPipe: PP + 1 chunks
    generate=lambda P, M, *, forward_only=False, **_: dualpipe_v(P, M, forward_only=forward_only),
    stages_per_rank=lambda virtual_stages: 2,
    sizes_ok=lambda ranks, microbatches, virtual_stages: microbatches >= 2 * ranks,
    v_shaped=True, split_backward=True, hides_alltoall=True, sync_exposed=True),)
"""DualPipeV: two stages per rank in a V, M >= 2P, the backward split."""
