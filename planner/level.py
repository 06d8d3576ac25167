"""The water level over whole blocks that every closed-form pipeline bound solves
(:func:`water_level`): the least step ``tau`` at which ranks, each paying its own work for the
blocks it holds after the chain time of the blocks before it, can hold a model's blocks in all;
decided by a greedy fill in pipeline order (:func:`block_capacity`) inside a bisection
(:func:`least_feasible`).

Used by :mod:`planner.bounds`; checked against every partition of small instances in
``tests/planner/test_shapes.py``.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

Rank = tuple[float, float, tuple[tuple[float, float, float, float, float, float], ...]]
"""A rank for the bound: (fixed step seconds, fixed chain seconds per microbatch, ((step
seconds per block, chain seconds per block, most blocks that fit memory, the option's own fixed
step seconds beyond the rank's, and a second constraint on the same blocks: what it adds per
block and to the fixed seconds, 0 and 0 for none), ...) per layout option)."""


def water_level(ranks: Sequence[Rank], num_blocks: int, chain: float, per_rank: int = 1,
                comm: Sequence[float] = (), least: int = 0) -> float:
    """The least ``tau`` such that ranks with ``tau >= chain * S_r + cost_r(n_r)`` can hold
    ``num_blocks`` blocks in all, where rank ``r`` holds a whole multiple of ``per_rank`` blocks
    ``n_r`` (its virtual stages hold equal counts) under one option that fits them,
    ``cost_r(n) = fixed step seconds + n x step seconds per block``, and ``S_r`` is the chain time
    of the ranks before ``r`` (fixed chain seconds plus their blocks at the fastest chain seconds
    per block of any rank: a lower bound on it). As ``S_r`` does not depend on which earlier rank
    holds a block and a block costs a rank at least as much step time as it adds to a later rank's
    chain, moving a block to an earlier rank never tightens a constraint: filling ranks greedily
    in order decides feasibility. Bisection on ``tau`` (the greedy total is monotone in it).
    ``comm[r]``: seconds the path spends between rank ``r`` and ``r + 1`` (the forward's and the
    backward's transfers), added to the chain in full. ``least``: blocks every rank holds at
    least (``inf`` when the ranks cannot all hold that many).
    """
    if least * len(ranks) > num_blocks:
        return math.inf
    blocks = block_capacity(ranks, chain, per_rank, comm, num_blocks, least)
    # bracket: double from the fluid level without memory (a lower bound), then bisect to a
    # relative 1e-7 (the returned lower end is never feasible: a valid bound)
    lo = 0.0
    hi = max(1e-9, sum(f for f, _, _ in ranks)
             + num_blocks * min(c for _, _, o in ranks for c, _, _, _, _, _ in o) / len(ranks))
    fastest = min(c for _, _, opts in ranks for _, c, _, _, _, _ in opts)
    hop_total = sum(comm[r] for r in range(min(len(comm), len(ranks) - 1))) if chain > 0 else 0.0
    worst = (sum(f + max(max(e, e + off) for _, _, _, e, _, off in o) for f, _, o in ranks)
             + num_blocks * max(c + more for _, _, o in ranks for c, _, _, _, more, _ in o)
             + chain * (sum(fc for _, fc, _ in ranks) + num_blocks * fastest) + hop_total) * 2 + 1.0
    return least_feasible(lambda tau: blocks(tau) >= num_blocks, lo, hi, worst)


def least_feasible(feasible: Callable[[float], bool], lo: float, hi: float, worst: float) -> float:
    """The lower end of the least ``tau`` at which ``feasible`` (monotone in ``tau``) holds, to a
    relative 1e-7, searched from the infeasible ``lo`` by doubling ``hi`` up to ``worst``, then
    bisecting: the returned end is never feasible (a valid bound); ``inf`` when ``worst`` is not
    feasible either."""
    while not feasible(hi):
        lo, hi = hi, hi * 2
        if hi > worst:
            if not feasible(worst):
                return math.inf
            hi = worst
            break
    while hi - lo > 1e-7 * hi:
        mid = (lo + hi) / 2
        if feasible(mid):
            hi = mid
        else:
            lo = mid
    return lo


def block_capacity(ranks: Sequence[Rank], chain: float, per_rank: int = 1,
                   comm: Sequence[float] = (), num_blocks: int = 0,
                   least: int = 0) -> Callable[[float], int]:
    """The greedy of :func:`water_level`: ``tau -> `` the most blocks the ranks hold in all with
    every rank's ``chain x S_r + cost_r(n_r) <= tau`` (a rank holding no matmul cost holds up to
    ``num_blocks``), or -1 when some rank cannot hold ``least`` blocks (every rank of a pipeline
    holds at least one block per stage: the shape search's pipelines use every rank).

    With ``least`` the prefixes ``P_r`` (blocks before rank ``r``) reachable with every rank's
    constraint met form an interval ``[r least, hi_r]``: a rank's most blocks ``cap_r(P)`` falls
    by at most one block per block of prefix (a block costs the rank at least what it adds to
    its chain), so ``P + cap_r(P)`` never falls as ``P`` grows and ``hi_{r+1}`` is that at the
    largest reachable ``P`` whose ``cap_r(P) >= least`` (found by bisection: ``cap_r`` only
    falls). Every total in ``[p least, hi_p]`` is reachable, so the caller's ``>= num_blocks``
    test stays exact; without ``least`` this is the plain greedy."""
    fastest = min(c for _, _, opts in ranks for _, c, _, _, _, _ in opts)
    hops = [0.0]
    for r in range(len(ranks) - 1):
        hops.append(hops[-1] + (comm[r] if r < len(comm) and chain > 0 else 0.0))

    prepared = [(hops[r], fixed, fixed_chain,
                 tuple((cost, cap, extra, (cost + more, extra + off) if more or off else None)
                       for cost, _, cap, extra, more, off in opts if cost > 0),
                 min((cap for cost, _, cap, _, _, _ in opts if cost <= 0), default=-1))
                for r, (fixed, fixed_chain, opts) in enumerate(ranks)]
    floor = math.floor
    if least * len(prepared) > num_blocks:
        return lambda tau: -1        # the ranks cannot all hold ``least``

    def most(room: float, opts: tuple[tuple[float, float, float, tuple[float, float] | None], ...],
             free_cap: float) -> int:
        """The most blocks (a multiple of ``per_rank``) a rank holds with ``room`` seconds."""
        n: float = 0               # the memory caps are floats (whole numbers or inf)
        if room > 0:
            for cost, cap, extra, second in opts:
                if room <= extra:
                    continue
                k: float = floor((room - extra) / cost * (1 + 1e-12))
                if second is not None:
                    if room <= second[1]:
                        continue
                    k2 = floor((room - second[1]) / second[0] * (1 + 1e-12))
                    k = k2 if k2 < k else k
                k = cap if cap < k else k
                if k > n:
                    n = k
        if free_cap >= 0 and room >= 0:
            n = max(n, min(free_cap, num_blocks))
        return int(n) // per_rank * per_rank

    def blocks(tau: float) -> int:
        total, s = 0, 0.0            # s: the fixed chain seconds of the ranks before
        for r, (hop, fixed, fixed_chain, opts, free_cap) in enumerate(prepared):
            base = tau - hop - fixed - chain * s
            n = most(base - chain * total * fastest, opts, free_cap)
            if n < least:
                # the largest reachable prefix at which this rank still holds ``least``
                lo, hi = r * least, total - per_rank
                if lo > hi or most(base - chain * lo * fastest, opts, free_cap) < least:
                    return -1
                while hi > lo:
                    mid = lo + (hi - lo) // (2 * per_rank) * per_rank + per_rank
                    if most(base - chain * mid * fastest, opts, free_cap) >= least:
                        lo = mid
                    else:
                        hi = mid - per_rank
                total = lo
                n = most(base - chain * lo * fastest, opts, free_cap)
            total += n
            s += fixed_chain
        return total
    return blocks
