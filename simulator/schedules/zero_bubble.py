"""Zero Bubble handcrafted schedules ZB-H1 and ZB-H2 (Qi et al., ICLR 2024, Sec. 2).

The backward is split into B (input gradient, on the critical path) and W (weight gradient,
free to move). One stage per rank (S = P). Activations are held until W ends.

- **ZB-H1** (Sec. 2.1, Fig. 3 top): the 1F1B order with W placed after B, where rank r delays
  its W's by r microbatches. Rank r runs ``min(P - r, M)`` forwards before its first B, then
  rounds ``F(next), B(k), W(k - r)``, then the remaining B/W pairs and W's. Every rank holds at
  most P activations, 1F1B's peak (rank 0). Paper: bubble ``(P - 1)(F + B - W)``, a third of
  1F1B's when F = B = W.
- **ZB-H2** (Sec. 2.2, Fig. 3 bottom): more warm-up forwards (up to ``2P - 1`` activations per
  rank) and W's pushed to the tail, so that, when F = B = W and ``M >= 2P - 1``, each rank's
  span from its first to its last fragment has no idle time ("zero bubble"; the paper's bubble
  ``(P - 1)(F + B - 2W)``); the step still includes the last rank's start-up offset (P-1) F. Built here by the paper's greedy rule, played out with unit times
  F = B = W = 1: a free rank runs its next B if its input arrived, else its next F if its input
  arrived and it holds fewer than ``2P - 1`` activations, else its oldest pending W.
  The resulting order is an execution order of the dependency graph, hence deadlock-free for
  any durations.
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

from ir import FragmentRef, ScheduleTable

from .base import B, F, ScheduleError, W, check_sizes, make_table, no_forward_only
from .kind import ScheduleKind

H1, H2 = "zb-h1", "zb-h2"


def zb_h1(num_ranks: int, microbatches: int, *, forward_only: bool = False,
          w_lag: Sequence[int] | None = None) -> ScheduleTable:
    """ZB-H1 on ``num_ranks`` ranks for ``microbatches`` microbatches.

    Args:
        w_lag: per rank, how many microbatches its W's trail its B's (default ``r`` on rank r, the
            paper's; a rank then holds ``min(P - r, M) + lag`` activations at most, so a smaller
            lag fits a rank whose microbatches keep more memory).

    Raises:
        ScheduleError: a size below 1, a negative lag or one per rank missing, or
            ``forward_only=True``.
    """
    check_sizes(H1, num_ranks, microbatches)
    no_forward_only(H1, forward_only)
    P, M = num_ranks, microbatches
    lags = list(range(P)) if w_lag is None else [int(x) for x in w_lag]
    if len(lags) != P or min(lags) < 0:
        raise ScheduleError(f"{H1}: w_lag={w_lag!r} must give one lag >= 0 per rank ({P})")
    order = []
    for r in range(P):
        nf = min(P - r, M)
        frags = [F(r, m) for m in range(nf - 1)]
        wq: deque[int] = deque()
        for k in range(M):
            if nf - 1 + k < M:
                frags.append(F(r, nf - 1 + k))
            frags.append(B(r, k))
            wq.append(k)
            if len(wq) > lags[r]:
                frags.append(W(r, wq.popleft()))
        frags += [W(r, m) for m in wq]
        order.append(frags)
    return make_table(H1, P, M, range(P), order, split_backward=True)


def _greedy_unit(P: int, M: int, limit: Sequence[int]) -> list[list[FragmentRef]]:
    """Unit-time greedy of ZB-H2 (see module docstring) with rank r holding at most
    ``limit[r]`` activations; returns each rank's order."""
    done_f = [[-1] * M for _ in range(P)]  # end time of F(r, m), -1 while not run
    done_b = [[-1] * M for _ in range(P)]
    nf, nb = [0] * P, [0] * P
    wq: list[deque[int]] = [deque() for _ in range(P)]
    held = [0] * P
    order: list[list[FragmentRef]] = [[] for _ in range(P)]
    total = 3 * M * P
    ran, t = 0, 0
    while ran < total:
        for r in range(P):
            k = nb[r]
            if k < M and done_f[r][k] >= 0 and done_f[r][k] <= t and (
                    r == P - 1 or 0 <= done_b[r + 1][k] <= t):
                done_b[r][k] = t + 1
                nb[r] += 1
                wq[r].append(k)
                order[r].append(B(r, k))
            elif nf[r] < M and held[r] < limit[r] and (
                    r == 0 or 0 <= done_f[r - 1][nf[r]] <= t):
                done_f[r][nf[r]] = t + 1
                held[r] += 1
                order[r].append(F(r, nf[r]))
                nf[r] += 1
            elif wq[r]:
                held[r] -= 1
                order[r].append(W(r, wq[r].popleft()))
            else:
                continue
            ran += 1
        t += 1
    return order


def zb_h2(num_ranks: int, microbatches: int, *, forward_only: bool = False,
          limits: Sequence[int] | None = None) -> ScheduleTable:
    """ZB-H2 on ``num_ranks`` ranks for ``microbatches`` microbatches.

    Args:
        limits: per rank, the most activations it may hold (default ``2P - 1`` on every rank, the
            paper's); a smaller one fits a rank whose microbatches keep more memory.

    Raises:
        ScheduleError: a size below 1, a limit below 1 or one per rank missing, or
            ``forward_only=True``.
    """
    check_sizes(H2, num_ranks, microbatches)
    no_forward_only(H2, forward_only)
    P, M = num_ranks, microbatches
    lim = [2 * P - 1] * P if limits is None else [int(x) for x in limits]
    if len(lim) != P or min(lim) < 1:
        raise ScheduleError(f"{H2}: limits={limits!r} must give one limit >= 1 per rank ({P})")
    order = _greedy_unit(P, M, lim)
    return make_table(H2, P, M, range(P), order, split_backward=True)


KINDS = (
    ScheduleKind("zb-h1", order=3, inflight=lambda P, p, M, v: [P],   # Qi et al. 2024, Sec. 2.1
                 generate=lambda P, M, *, forward_only=False, **_: zb_h1(
                     P, M, forward_only=forward_only), split_backward=True, sync_exposed=True),
    ScheduleKind("zb-h2", order=4, inflight=lambda P, p, M, v: [2 * P - 1],   # the greedy limit
                 generate=lambda P, M, *, forward_only=False, **_: zb_h2(
                     P, M, forward_only=forward_only), split_backward=True, sync_exposed=True),
)
"""ZB-H1 holds P microbatches per rank, ZB-H2 2P - 1; both split the backward."""
