"""The CP-SAT model against brute force on instances small enough to enumerate."""

from __future__ import annotations

import itertools

import pytest

from ir import Layout
from planner.search import Candidate, solve
from simulator.stage_cost import StageCost


def option(block_s: float, cap: float = 1e12, static: float = 0.0, resid: float = 0.0,
           post_s: float = 0.0) -> StageCost:
    return StageCost(layout=Layout(1, 1), recompute=False, block_s=block_s, pre_s=0.0,
                      post_s=post_s, overhead_s=0.0, merge_saving_s=0.0, tail_block_s=0.0,
                      tail_pre_s=0.0, tail_post_s=0.0, static_block=static, static_pre=0.0,
                      static_post=0.0, resid_block=resid, resid_pre=0.0, resid_post=0.0,
                      working=0.0, capacity=cap)


def brute_force(times: list[float], L: int, M: int) -> float:
    """min over mesh subsets, orders and splits of M*max(T) + sum(T) - max(T)."""
    best = float("inf")
    n = len(times)
    for k in range(1, n + 1):
        for order in itertools.permutations(range(n), k):
            for cuts in itertools.combinations(range(1, L), k - 1):
                sizes = [b - a for a, b in zip((0,) + cuts, cuts + (L,))]
                t = [times[i] * s for i, s in zip(order, sizes)]
                best = min(best, M * max(t) + sum(t) - max(t))
    return best


@pytest.mark.parametrize("times,L,M", [([1.0, 2.0], 6, 4), ([1.0, 1.0, 3.0], 7, 8),
                                       ([0.5, 2.0, 2.0], 5, 2)])
def test_optimum_equals_brute_force(times, L, M):
    n = len(times)
    c = Candidate("1f1b", M, 1, L, tuple(f"m{i}" for i in range(n)),
                  tuple((option(t),) for t in times), tuple((0.0,) * n for _ in range(n)), False)
    a = solve(c, time_limit_s=10.0)
    assert a is not None and a.status == "OPTIMAL"
    assert a.objective_s == pytest.approx(brute_force(times, L, M), rel=1e-6)
    assert sum(a.blocks) == L


def test_memory_caps_blocks_per_mesh():
    # each block needs 10 units; mesh m0 holds at most 2 blocks, so m1 takes the rest
    c = Candidate("1f1b", 4, 1, 6, ("m0", "m1"), ((option(1.0, cap=25e6, static=10e6),),
                                                  (option(3.0),)), ((0.0, 0.0), (0.0, 0.0)), False)
    a = solve(c, time_limit_s=10.0)
    assert a is not None
    assert dict(zip(a.order, a.blocks))["m0"] <= 2


def test_inflight_memory_depends_on_pipeline_position():
    # residuals of 10 MB per block per microbatch in flight; capacity 45 MB: at position 0 of a
    # 2-mesh 1F1B pipeline a mesh holds 2 microbatches (2 blocks max), at position 1 one (4 max)
    opt = option(1.0, cap=45e6, resid=10e6)
    c = Candidate("1f1b", 8, 1, 6, ("m0", "m1"), ((opt,), (opt,)), ((0.0, 0.0), (0.0, 0.0)), False)
    a = solve(c, time_limit_s=10.0)
    assert a is not None and len(a.order) == 2
    assert a.blocks[0] <= 2 and a.blocks[1] <= 4


def test_infeasible_returns_none():
    c = Candidate("1f1b", 2, 1, 4, ("m0",), ((option(1.0, cap=1e6, static=1e6),),), ((0.0,),), False)
    assert solve(c, time_limit_s=5.0) is None
