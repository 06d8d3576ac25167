"""The planner's prediction is the discrete-event replay of its plan (planner.replayed): on a
pipeline whose stage boundaries carry much traffic over one link, the analytic replay (no link
contention) calls a three-stage GPipe plan 0.43 s while the simulator, which queues transfers
on the link, replays it at 1.42 s; the planner must then choose the one-mesh plan (0.63 s, no
transfers) and print what `mpmd simulate` prints."""

from __future__ import annotations

import dataclasses

import pytest

from ir import Workload
from planner import plan
from planner.construct import PlanOptions
from planner.predict import predict
from planner.replayed import rank_by_replay, replayed
from simulator.plan_sim import plan_cluster, simulate_any
from tests.planner.conftest import cluster, device, layer

COSTS = {"embed": layer("embed", 1.0, 50.0, act_mb=200.0, resid_mb=1.0),
         "block": layer("block", 200.0, 100.0, act_mb=200.0),
         "head": layer("head", 150.0, 50.0, act_mb=200.0)}
W = Workload("toy", ("embed",) + ("block",) * 12 + ("head",), COSTS, seq_len=1024, global_batch=64)


def three_meshes(bw_gbs: float):
    return cluster([(n, device(n, 400.0, 40.0), 4) for n in "abc"], bw_gbs=bw_gbs)


def test_the_plan_is_chosen_and_predicted_on_its_replay():
    c = three_meshes(20.0)
    # the meshes named: no kinds-alone searches (planner.api.KIND_SHARE), whose one-mesh plans
    # would win on their replay
    contended = plan(W, c, PlanOptions(time_limit_s=5, schedules=("gpipe",), microbatches=(16,),
                                       meshes=tuple("abc"))).plan
    assert len(contended.stages) == 3
    analytic = predict(contended, W, c).step_time_s
    replay = simulate_any(contended, W, plan_cluster(contended, c)).step_time_s
    assert analytic == pytest.approx(0.4294255) and replay == pytest.approx(1.4152255)
    assert contended.predicted.step_time_s == replay              # the plan carries the replay
    best = plan(W, c, PlanOptions(time_limit_s=5)).plan
    assert (best.schedule.name, len(best.stages)) == ("1f1b", 1)
    # 0.642652 before the kinds-alone searches (issue 45) found a faster one-mesh plan
    assert best.predicted.step_time_s == pytest.approx(0.6277165)
    assert best.predicted.step_time_s == simulate_any(best, W, plan_cluster(best, c)).step_time_s


def test_replayed_scales_the_step_figures_and_keeps_memory():
    c = three_meshes(20.0)
    p = plan(W, c, PlanOptions(time_limit_s=5, schedules=("gpipe",), microbatches=(16,))).plan
    pred = predict(p, W, c)
    new = replayed(p, pred, W, c)
    k = pred.step_time_s / new.step_time_s
    assert (new.mfu, new.tokens_per_s) == (pytest.approx(pred.mfu * k), pytest.approx(pred.tokens_per_s * k))
    assert new.peak_memory_bytes == pred.peak_memory_bytes
    one = dataclasses.replace(p, rank_mesh=p.rank_mesh[:1])
    assert replayed(one, pred, W, c) is pred                      # one mesh: nothing to queue
    with pytest.raises(ValueError):
        rank_by_replay([], lambda x: x, W, c)
