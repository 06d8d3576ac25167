"""planner.grid: the practitioners' sweep is every grid point, each the hand baseline's own plan,
and its best is the fastest point that fits."""

from __future__ import annotations

import pytest

from planner.construct import PlanOptions
from planner.baseline import HandLayout, hand_plan, megatron_plans
from planner.budget import Budget
from planner.errors import PlannerError
from planner.grid import grid_layouts, grid_sweep
from tests.planner.test_hand_layout import W, nodes


def test_grid_points_are_the_megatron_grid():
    pts = grid_layouts(W, nodes(), "g")
    # 32 devices: every point uses all of them with tensor parallel inside a node
    assert all(p.devices == 32 and 8 % p.tensor == 0 for p in pts)
    assert {p.tensor for p in pts} == {1, 2, 4, 8} and {p.fsdp for p in pts} == {False, True}
    assert all(p.virtual_stages == 1 for p in pts if p.pipeline == 1)
    assert all(W.global_batch % (p.data * p.micro_batch) == 0 for p in pts)
    assert len(set(pts)) == len(pts)


@pytest.mark.parametrize("mem_gb", [80.0, 1.0])
def test_the_sweep_keeps_the_fastest_point_that_fits(mem_gb):
    c = nodes(mem_gb=mem_gb)
    r = grid_sweep(W, c, "g")
    assert r.best is not None and r.best.prediction.fits and 0 < r.fitting <= r.evaluated
    # brute force over the same points: nothing that fits is faster
    steps = []
    for p in grid_layouts(W, c, "g"):
        for rc in ("none", "full"):
            try:
                h = hand_plan(W, c, HandLayout(p.tensor, p.pipeline, p.data, p.virtual_stages,
                                               p.micro_batch, rc, fsdp=p.fsdp), "g")
            except PlannerError:
                break
            if h.prediction.fits:
                steps.append(h.prediction.step_time_s)
                break
    assert r.best.prediction.step_time_s == pytest.approx(min(steps), rel=1e-12)
    # the grid contains the shortest-pipeline hand configurations, so it is never slower
    hand = min(h.prediction.step_time_s for h in megatron_plans(W, c, "g"))
    assert r.best.prediction.step_time_s <= hand * (1 + 1e-12)


def test_an_unknown_group_is_refused():
    with pytest.raises(PlannerError, match="no node group 'x'"):
        grid_sweep(W, nodes(), "x")


def test_the_planner_options_restrict_the_grid():
    all_pts = grid_layouts(W, nodes(), "g")
    pts = grid_layouts(W, nodes(), "g", PlanOptions(max_tensor=2, fsdp=False, schedules=("1f1b",)))
    assert pts and set(pts) < set(all_pts)
    assert {p.tensor for p in pts} == {1, 2} and not any(p.fsdp for p in pts)
    assert {p.schedule for p in pts} == {"1f1b"}
    m = grid_layouts(W, nodes(), "g", PlanOptions(microbatches=(4,)))
    assert m and all(W.global_batch // (p.data * p.micro_batch) == 4 for p in m)


def test_a_spent_budget_stops_the_sweep():
    import time

    full = grid_sweep(W, nodes(), "g")
    b = Budget(1e-3, time.monotonic() + 600)
    cut = grid_sweep(W, nodes(), "g", budget=b)
    assert full.complete and not cut.complete
    assert 0 < cut.evaluated < full.evaluated and b.out()


def test_a_mixture_of_experts_adds_expert_parallel_points():
    from zoo.costing import workload
    from zoo.model_files import resolve_model

    moe = workload(resolve_model("zoo/configs/tiny-moe.yaml"), 32, seq_len=64)
    experts = max(c.experts for c in moe.costs.values())
    pts = grid_layouts(moe, nodes(), "g")
    ep = [p for p in pts if p.expert > 1 and p.expert_tensor == 0]
    assert ep and all(not p.fsdp and p.data % p.expert == 0 and experts % p.expert == 0
                      for p in ep)
    assert {p.expert for p in ep} == {e for e in (2, 4, 8, 16, 32, 64) if experts % e == 0
                                      and any(q.data % e == 0 for q in pts)}
    # MoE parallel folding: with tensor parallel, EP over data x tensor, experts unsplit (ETP 1)
    folded = [p for p in pts if p.expert_tensor == 1]
    assert folded and all(p.tensor > 1 and p.expert > 1 and (p.data * p.tensor) % p.expert == 0
                          and experts % p.expert == 0 for p in folded)
    assert any(p.expert > p.data for p in folded)
    ep += folded
    # each expert-parallel point is a distributed-optimizer point of the grid with the experts split
    plain = {(p.tensor, p.pipeline, p.data, p.virtual_stages, p.micro_batch)
             for p in pts if p.expert == 1 and not p.fsdp}
    assert {(p.tensor, p.pipeline, p.data, p.virtual_stages, p.micro_batch) for p in ep} <= plain
    # a dense model's grid has none
    assert all(p.expert == 1 for p in grid_layouts(W, nodes(), "g"))


def test_the_grid_keeps_the_planners_optimizer_state():
    """``PlanOptions.optimizer_state`` reaches every grid point and the sweep's best plan, so the
    grid that seeds the search and the plans it finds are costed with the same state."""
    opts = PlanOptions(optimizer_state="bf16-moments")
    pts = grid_layouts(W, nodes(), "g", opts)
    assert pts and {p.optimizer_state for p in pts} == {"bf16-moments"}
    assert {p.optimizer_state for p in grid_layouts(W, nodes(), "g")} == {"fp32"}
    best = grid_sweep(W, nodes(), "g", opts=opts).best
    assert best is not None
    assert {lay.optimizer_state for lay in best.plan.layouts.values()} == {"bf16-moments"}
