"""The search's outcome and the replay's prediction as types (:mod:`ir.report`): plan files
written before them still load, and what a plan carries survives its JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ir import (IRError, PlanFamily, Prediction, SearchReport, any_plan_to_json,
                data_parallel_from_json, plan_from_json)
from ir.plan import DataParallelPlan

GOLDEN = Path(__file__).parent / "golden"
"""Plan files in the format of the release before :class:`SearchReport` (commit 3054aba, 2026-11-27:
``mpmd plan`` of llama-tiny on ``cpu4x2.yaml``, llama3-70b on ``h100x64_nodes.yaml``-like node
groups (``mixed1024_nodes.yaml``, cut by its time limit), OPT-350M's cost goal on
``a100x80_v100x240_nodes.yaml`` and llama3-70b's data-parallel plan on ``mixed1024_nodes.yaml``)."""


def _load(name: str) -> dict:
    return json.loads((GOLDEN / name).read_text())


@pytest.mark.parametrize("name", sorted(p.name for p in GOLDEN.glob("*.json")))
def test_a_plan_file_from_before_the_types_loads_and_writes_back_the_same(name):
    d = _load(name)
    plan = data_parallel_from_json(d) if "parts" in d else plan_from_json(d)
    assert plan.predicted is not None
    assert plan.predicted.step_time_s == d["predicted"]["step_time_s"]
    assert plan.search.status == d["solver"]["status"]
    back = any_plan_to_json(plan)
    assert back["solver"] == d["solver"]
    for key in ("step_time_s", "bubble_fraction", "peak_memory_bytes", "mfu",
                "roofline_step_time_s", "tokens_per_s"):
        assert back["predicted"][key] == d["predicted"][key], key


def test_the_node_group_report_reads_as_types():
    plan = plan_from_json(_load("node_groups.json"))
    s = plan.search
    assert s.stopped == "time limit" and s.budget_spent is True
    assert s.options is not None and s.options[0] == PlanFamily(
        "h100 alone", ((("h100",), 512),), s.options[0].step_time_s)
    assert s.search_bound_s is not None and s.search_gap is not None
    assert s.bounded and 0.0 < s.search_gap < 1.0
    assert s.candidates_searched == 2 and s.candidates_total == 102


def test_the_goal_and_the_data_parallel_plan_keep_their_records():
    goal = plan_from_json(_load("cost_goal.json")).search.goal
    assert goal is not None and goal["kind"] == "cost" and goal["usd_per_step"] > 0
    dp = data_parallel_from_json(_load("data_parallel.json"))
    assert isinstance(dp, DataParallelPlan) and dp.search.status == "HEURISTIC"
    assert dp.predicted is not None and all(p.predicted is not None for p in dp.parts)


def test_of_solve_computes_the_gap():
    s = SearchReport.of_solve("FEASIBLE", 2.0, 1.5, 0.25)
    assert (s.status, s.objective_s, s.bound_s, s.gap, s.wall_s) == ("FEASIBLE", 2.0, 1.5, 0.25, 0.25)
    assert SearchReport.of_solve("OPTIMAL", 0.0, 0.0, 0.0).gap == 0.0
    assert not s.bounded
    assert s.to_json() == {"status": "FEASIBLE", "objective": 2.0, "bound": 1.5, "gap": 0.25,
                           "wall_s": 0.25}


def test_a_mesh_listing_search_without_a_bound_writes_null():
    s = SearchReport("OPTIMAL", search_wall_s=3.0, candidates=2, candidates_total=5)
    d = s.to_json()
    assert d["search_bound"] is None and d["search_gap"] is None
    assert SearchReport.from_json(d) == s


@pytest.mark.parametrize("solver,message", [
    ({"objective": "fast"}, "plan's 'objective' is 'fast', not a number"),
    ({"candidates": 2.5}, "plan's 'candidates' is 2.5, not an integer"),
    ({"interrupted": "no"}, "plan's 'interrupted' is 'no', not true or false"),
    ({"stopped": "bored"}, "search stopped 'bored': not one of complete, work budget"),
    ([1, 2], "plan's 'solver' is list, not an object"),
])
def test_a_malformed_report_is_refused_naming_the_value(solver, message):
    with pytest.raises(IRError, match=message):
        SearchReport.from_json(solver)


def test_a_prediction_round_trips_and_needs_its_step():
    p = Prediction(2.5, {"m0": 0.1}, {"m0": 1e9}, {"m0": 8e10}, (1.0, 1.5), 0.4, 1.0, 1e5, 12.0)
    assert Prediction.from_json(p.to_json()) == p
    assert p.fits and not Prediction(1.0, shortfall_bytes={"m0": 1.0}).fits
    with pytest.raises(IRError, match="has no 'step_time_s'"):
        Prediction.from_json({"mfu": 0.5})
    with pytest.raises(IRError, match="'bubble_fraction' is 3"):
        Prediction.from_json({"step_time_s": 1.0, "bubble_fraction": 3})
