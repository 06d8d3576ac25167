"""Stopping the planner: between candidates, during a CP-SAT solve; the honest bound it reports."""

from __future__ import annotations

import json
import threading

import pytest

import planner.api as api
from ir import plan_from_json, plan_to_json
from mpmd.cli.output import validate_plan_json
from planner import PlanOptions, plan
from planner.api import PlanInterrupted
from planner.search import solve_outcome
from tests.planner.conftest import cluster, device, workload

OPTS = PlanOptions(time_limit_s=20.0)


@pytest.fixture(scope="module")
def hard():
    """Seven meshes of seven different devices: each 1F1B solve takes CP-SAT a good fraction of a
    second (far longer than the 50 ms stop poll), so a stop lands mid-solve."""
    devs = [device(f"d{i}", 100.0 + 37 * i, 40.0 + 9 * i, bw_gbs=1000 + 300 * i) for i in range(7)]
    return workload(blocks=48, batch=64), cluster([(f"m{i}", d, 2) for i, d in enumerate(devs)])


HARD_OPTS = PlanOptions(time_limit_s=20.0, schedules=("1f1b",), microbatches=(8, 16))


def _json_roundtrip(p):
    doc = json.loads(json.dumps(plan_to_json(p)))
    validate_plan_json(doc)
    assert plan_to_json(plan_from_json(doc)) == doc
    return doc


def test_uninterrupted_search_reports_its_bound(fast_slow_cluster):
    r = plan(workload(), fast_slow_cluster, OPTS)
    s = r.plan.search
    assert not r.interrupted and s.interrupted is False
    assert r.unsearched == 0 and s.candidates == s.candidates_total == len(r.candidates)
    assert s.objective_s is not None and r.search_bound_s is not None
    assert r.search_bound_s == s.search_bound_s <= s.objective_s + 1e-9
    assert r.search_gap is not None and 0.0 <= r.search_gap == s.search_gap <= 1.0
    assert _json_roundtrip(r.plan)["solver"]["interrupted"] is False


def test_stop_set_before_the_search_gives_no_plan(fast_slow_cluster):
    stop = threading.Event()
    stop.set()
    with pytest.raises(PlanInterrupted,
                       match=r"^interrupted after \d+ s before any feasible plan$"):
        plan(workload(), fast_slow_cluster, OPTS, stop=stop)


def test_stop_from_progress_after_first_candidate(fast_slow_cluster):
    w = workload()
    full = plan(w, fast_slow_cluster, OPTS)
    stop, calls = threading.Event(), []

    def progress(done, total, best_s):
        calls.append((done, total, best_s))
        if done == 1:
            stop.set()

    r = plan(w, fast_slow_cluster, OPTS, progress, stop=stop)
    total = len(full.candidates)
    assert r.interrupted and r.plan.search.interrupted is True
    assert r.candidates == full.candidates[:1]           # the same first solve, then nothing
    assert r.candidates_total == total and r.unsearched == total - 1
    assert r.search_bound_s is None and r.search_gap is None
    assert r.prediction.step_time_s == full.candidates[0][2]
    assert calls[0] == (0, total, None) and calls[-1] == (1, total, full.candidates[0][2])
    doc = _json_roundtrip(r.plan)
    assert doc["solver"]["search_bound"] is None and doc["solver"]["candidates"] == 1


def test_progress_reports_every_candidate_and_the_best_so_far(fast_slow_cluster):
    calls = []
    r = plan(workload(), fast_slow_cluster, OPTS, lambda *a: calls.append(a))
    total = len(r.candidates)
    assert [c[0] for c in calls] == list(range(total + 1))
    assert {c[1] for c in calls} == {total}
    fits = [c[2] for c in r.candidates]
    for done, _, best in calls:
        seen = [t for t in fits[:done] if t is not None]
        assert best == (min(seen) if seen else None)
    assert calls[-1][2] == r.prediction.step_time_s


def test_stop_during_a_solve_keeps_its_best_solution(hard, monkeypatch):
    """The stop is set just as the last candidate's solve starts: CP-SAT is stopped mid-search;
    every candidate was searched, so the search-wide bound is known and honest."""
    w, c = hard
    stop, outcomes = threading.Event(), []

    def solve_then_stop(cand, **kw):
        if cand.microbatches == 16:
            stop.set()
        outcomes.append(solve_outcome(cand, **kw))
        return outcomes[-1]

    monkeypatch.setattr(api, "solve_outcome", solve_then_stop)
    r = plan(w, c, HARD_OPTS, stop=stop)
    assert [o.stopped for o in outcomes] == [False, True]
    assert outcomes[0].status == "OPTIMAL" and outcomes[1].status in ("FEASIBLE", "UNKNOWN")
    assert r.interrupted and r.unsearched == 0 and len(r.candidates) == 2
    assert r.search_bound_s == min(o.bound_s for o in outcomes)
    obj = r.plan.search.objective_s
    assert obj is not None
    assert r.search_gap == pytest.approx((obj - r.search_bound_s) / obj)
    assert 0.0 <= r.search_gap <= 1.0
    assert _json_roundtrip(r.plan)["solver"]["interrupted"] is True


def test_keyboard_interrupt_while_solving_stops_the_solver_thread(hard, monkeypatch):
    """An exception in the waiting thread (a second Ctrl-C) ends the CP-SAT solve before it
    propagates: no solver thread is left running."""
    class Boom(threading.Event):
        def is_set(self) -> bool:
            raise KeyboardInterrupt

    class Captured(Exception):
        pass

    def capture(cand, **kw):
        cands.append(cand)
        raise Captured

    w, c = hard
    cands = []
    monkeypatch.setattr(api, "solve_outcome", capture)
    with pytest.raises(Captured):
        plan(w, c, HARD_OPTS)
    with pytest.raises(KeyboardInterrupt):
        solve_outcome(cands[0], time_limit_s=20.0, stop=Boom())
    assert not [t for t in threading.enumerate() if t.name == "cp-sat" and t.is_alive()]


def test_an_unset_stop_event_changes_nothing(fast_slow_cluster):
    w = workload()
    a = plan(w, fast_slow_cluster, OPTS)
    b = plan(w, fast_slow_cluster, OPTS, stop=threading.Event())
    strip = lambda p: {k: v for k, v in plan_to_json(p).items() if k != "solver"}
    assert json.dumps(strip(a.plan), sort_keys=True) == json.dumps(strip(b.plan), sort_keys=True)
    assert a.candidates == b.candidates and not b.interrupted


@pytest.mark.parametrize("when", ["before", "after"])
def test_keyboard_interrupt_at_thread_start_leaves_no_solver_running(hard, monkeypatch, when):
    """A Ctrl-C landing as the solver thread starts (found by a core dump: a solver thread still in
    CP-SAT at interpreter exit aborts the process) still ends the solve before propagating."""
    import planner.search as search

    class Captured(Exception):
        pass

    def capture(cand, **kw):
        cands.append(cand)
        raise Captured

    cands = []
    w, c = hard
    monkeypatch.setattr(api, "solve_outcome", capture)
    with pytest.raises(Captured):
        plan(w, c, HARD_OPTS)
    monkeypatch.undo()

    class InterruptedStart(threading.Thread):
        def start(self) -> None:
            if when == "after":
                super().start()
            raise KeyboardInterrupt

    monkeypatch.setattr(search.threading, "Thread", InterruptedStart)
    with pytest.raises(KeyboardInterrupt):
        solve_outcome(cands[0], time_limit_s=20.0)
    monkeypatch.undo()
    assert not [t for t in threading.enumerate() if t.name == "cp-sat" and t.is_alive()]
