"""validate() and replay(): completeness, deadlocks, exact longest-path timing, memory, speed."""

from __future__ import annotations

import dataclasses
import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ir import FragmentRef
from simulator.schedules import (SCHEDULES, ScheduleError, dependencies, generate, kind, replay,
                                 validate)


def _with_order(table, rank, order):
    new = list(table.order)
    new[rank] = tuple(order)
    return dataclasses.replace(table, order=tuple(new))


def test_swapped_fragments_deadlock_names_every_stuck_rank():
    t = generate("gpipe", 2, 2)
    o = list(t.order[0])
    assert [str(f) for f in o] == ["F0.0", "F0.1", "B0.0", "B0.1"]
    o[0], o[2] = o[2], o[0]  # B0.0 first: waits for B1.0, which waits (via F1.0) for F0.0
    broken = _with_order(t, 0, o)
    with pytest.raises(ScheduleError) as e:
        validate(broken)
    assert str(e.value).startswith("schedule 'gpipe' deadlocks: rank 0 waits at B0.0 for B1.0; "
                                   "rank 1 waits at F1.0 for F0.0;")
    with pytest.raises(ScheduleError, match="deadlocks"):
        replay(broken, lambda r, f: 1.0)


def test_same_rank_cycle_in_1f1b():
    t = generate("1f1b", 2, 2)
    o = list(t.order[1])
    assert [str(f) for f in o] == ["F1.0", "B1.0", "F1.1", "B1.1"]
    o[0], o[1] = o[1], o[0]
    with pytest.raises(ScheduleError) as e:
        validate(_with_order(t, 1, o))
    assert "rank 1 waits at B1.0 for F1.0" in str(e.value)


def test_cross_rank_cycle_in_zb_v():
    t = generate("zb-v", 2, 4)
    o = list(t.order[0])
    i = o.index(FragmentRef("F", 0, 0))
    j = o.index(FragmentRef("F", 3, 0))  # last stage, on rank 0 too
    o[i], o[j] = o[j], o[i]
    with pytest.raises(ScheduleError) as e:
        validate(_with_order(t, 0, o))
    assert "rank 0 waits at F3.0 for F2.0" in str(e.value)
    assert "rank 1 waits at F1.0 for F0.0" in str(e.value)


@pytest.mark.parametrize("edit, text", [
    (lambda o: o[:-1], "never runs B0.2"),
    (lambda o: o + [o[0]], "lists F0.0 twice"),
    (lambda o: o + [FragmentRef("F", 1, 0)], "stage 1 is on rank 1"),
    (lambda o: o + [FragmentRef("W", 0, 0)], "fragment kinds are ('F', 'B')"),
    (lambda o: o + [FragmentRef("F", 0, 9)], "outside 2 stages x 3 microbatches"),
])
def test_completeness_errors(edit, text):
    t = generate("1f1b", 2, 3)
    bad = _with_order(t, 0, edit(list(t.order[0])))
    with pytest.raises(ScheduleError) as e:
        validate(bad)
    assert text in str(e.value)


def test_dependencies_table():
    t = generate("zb-h1", 3, 2)
    assert dependencies(t, FragmentRef("F", 0, 1)) == ()
    assert dependencies(t, FragmentRef("F", 2, 1)) == (FragmentRef("F", 1, 1),)
    assert dependencies(t, FragmentRef("B", 2, 1)) == (FragmentRef("F", 2, 1),)
    assert dependencies(t, FragmentRef("B", 0, 1)) == (FragmentRef("B", 1, 1),
                                                       FragmentRef("F", 0, 1))
    assert dependencies(t, FragmentRef("W", 1, 0)) == (FragmentRef("B", 1, 0),)


def _sizes(name, P, m):
    """The ``m``-th microbatch count the schedule takes on ``P`` ranks (its own ``sizes_ok``, at
    the generator's default of 2 virtual stages), so every registered kind is drawn."""
    ok = [M for M in range(1, 2 * P * m + 2 * P + 1) if kind(name).sizes_ok(P, M, 2)]
    return ok[m - 1]


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(SCHEDULES), P=st.integers(1, 6), m=st.integers(1, 6),
       seed=st.integers(0, 2**31), with_comm=st.booleans())
def test_replay_respects_dependencies_and_ranks(name, P, m, seed, with_comm):
    t = generate(name, P, _sizes(name, P, m))
    rnd = random.Random(seed)
    d = {f: rnd.choice([0.0, rnd.uniform(0.1, 3.0)]) for o in t.order for f in o}
    c = {}

    def comm(src, dst, ref):
        return c.setdefault((src, dst, ref), rnd.uniform(0.0, 1.0))

    rp = replay(t, lambda r, f: d[f], comm if with_comm else None)
    tol = 1e-9
    for r, frags in enumerate(t.order):
        prev_end = 0.0
        for f in frags:
            s, e = rp.start[(r, f)], rp.end[(r, f)]
            assert e == pytest.approx(s + d[f])
            assert s >= prev_end - tol  # one fragment at a time, in order
            ready = prev_end
            for p in dependencies(t, f):
                pr = t.stage_rank[p.stage]
                arrive = rp.end[(pr, p)] + (c[(p.stage, f.stage, p)] if with_comm and pr != r
                                            else 0.0)
                assert s >= arrive - tol
                ready = max(ready, arrive)
            assert s == pytest.approx(ready)  # exact longest path: no needless waiting
            prev_end = e
        assert rp.busy[r] == pytest.approx(sum(d[f] for f in frags))
    assert rp.makespan == pytest.approx(max(rp.end.values()))
    for r in range(P):
        expect = 1 - rp.busy[r] / rp.makespan if rp.makespan > 0 else 0.0
        assert rp.bubble[r] == pytest.approx(expect)


def test_peak_inflight_convention_and_weights():
    # split backward: held until W ends; unsplit: until B ends
    t = generate("zb-h1", 2, 4)
    rp = replay(t, lambda r, f: 1.0,
                activation=lambda r, f: 10.0 * (f.microbatch + 1))
    assert rp.peak_inflight == (2, 2)
    order0 = [str(f) for f in t.order[0]]
    assert order0[:4] == ["F0.0", "F0.1", "B0.0", "W0.0"]
    # rank 0 peaks holding F0.2 and F0.3 after W0.1 frees mb 1 (30 + 40)
    assert rp.peak_activation[0] == pytest.approx(70.0)
    assert replay(generate("gpipe", 2, 4), lambda r, f: 1.0).peak_activation == (4.0, 4.0)


def test_negative_duration_rejected():
    with pytest.raises(ScheduleError, match="must be >= 0"):
        replay(generate("1f1b", 2, 2), lambda r, f: -1.0)


def test_replay_32_ranks_256_microbatches():
    t = generate("1f1b", 32, 256)
    rp = replay(t, lambda r, f: 1.0 if f.kind == "F" else 2.0)
    assert rp.makespan == pytest.approx(3.0 * (256 + 31))


@pytest.mark.slow
def test_replay_speed_32_ranks_256_microbatches():
    """Measures wall time (slow: the bound assumes an otherwise idle machine; 0.04 s on the
    2-core development VM)."""
    t = generate("1f1b", 32, 256)
    t0 = time.perf_counter()
    replay(t, lambda r, f: 1.0 if f.kind == "F" else 2.0)
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, f"replay took {elapsed:.3f} s"
