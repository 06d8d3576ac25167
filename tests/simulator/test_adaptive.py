"""Tests of the automatic zero-bubble scheduler (simulator.schedules.adaptive)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.schedules import (ADAPTIVE_SCHEDULES, ScheduleError, generate, replay,
                                 stages_per_rank, validate)
from simulator.schedules.adaptive import list_schedule, zero_bubble_auto


def unit(rank, ref):
    return 1.0


def stage_dur(table):
    return lambda rank, ref: table[(ref.stage, ref.kind)]


def heavy_last(P: int, factor: float = 1.7):
    """F=1, B=1, W=1 on every stage but the last, whose three are ``factor`` times longer."""
    return lambda s, k: factor if s == P - 1 else 1.0


def test_registry_generates_both_with_uniform_default():
    assert ADAPTIVE_SCHEDULES == ("zb-1p", "zb-2p")
    for name, limit in (("zb-1p", 4), ("zb-2p", 8)):
        t = generate(name, 4, 8)
        validate(t)
        assert t.name == name and t.split_backward and t.num_stages == 4
        assert stages_per_rank(name) == 1
        assert max(replay(t, unit).peak_inflight) <= limit


def test_generate_passes_durations_and_comm():
    d = heavy_last(4)
    t = generate("zb-2p", 4, 8, durations=d, comm=0.25)
    assert t == zero_bubble_auto(4, 8, d, 0.25, memory_limit=8)


@pytest.mark.parametrize("call, text", [
    (lambda: zero_bubble_auto(4, 8, memory_limit=0), "memory_limit=0"),
    (lambda: zero_bubble_auto(0, 8, memory_limit=4), "num_ranks=0"),
    (lambda: zero_bubble_auto(4, 8, lambda s, k: -1.0, memory_limit=4), "durations must be >= 0"),
    (lambda: zero_bubble_auto(4, 8, comm=-1.0, memory_limit=4), "comm=-1.0"),
    (lambda: zero_bubble_auto(4, 8, memory_limit=4, objective="speed"), "objective='speed'"),
    (lambda: generate("zb-1p", 4, 8, forward_only=True), "use 'gpipe'"),
])
def test_bad_arguments_raise_one_line(call, text):
    with pytest.raises(ScheduleError) as e:
        call()
    assert text in str(e.value) and "\n" not in str(e.value)


@settings(max_examples=40, deadline=None)
@given(P=st.integers(1, 5), M=st.integers(1, 10), extra=st.integers(-4, 6),
       times=st.lists(st.sampled_from([0.0, 0.1, 0.5, 1.0, 1.7, 3.0]), min_size=15, max_size=15),
       comm=st.sampled_from([0.0, 0.2, 1.5]), objective=st.sampled_from(["makespan", "span"]),
       replay_times=st.lists(st.floats(0.0, 2.0), min_size=3, max_size=3))
def test_valid_and_within_memory_for_any_durations(P, M, extra, times, comm, objective,
                                                   replay_times):
    limit = max(1, P + extra)
    d = {(s, k): times[(3 * s + i) % 15] for s in range(P) for i, k in enumerate("FBW")}
    t = zero_bubble_auto(P, M, lambda s, k: d[(s, k)], comm, memory_limit=limit,
                         objective=objective)
    validate(t)   # complete, dependency-safe, deadlock-free
    # an execution order: replays without deadlock under durations other than the built ones
    other = dict(zip("FBW", replay_times))
    rp = replay(t, lambda r, f: other[f.kind], lambda a, b, f: 0.3)
    assert max(rp.peak_inflight) <= limit
    # every single list schedule (not only the winner) is within the limit
    for fill in ("fit", "greedy"):
        order = list_schedule(P, M, lambda s, k: d[(s, k)], lambda a, b: comm, limit=limit,
                              fill=fill)
        assert sum(map(len, order)) == 3 * P * M


@pytest.mark.parametrize("P, M", [(4, 8), (4, 12), (8, 24)])
def test_uniform_zb2p_bubble_at_most_zb_h2(P, M):
    z2 = replay(generate("zb-2p", P, M), unit)
    h2 = replay(generate("zb-h2", P, M), unit)
    assert z2.makespan <= h2.makespan
    assert max(z2.bubble) <= max(h2.bubble) + 1e-12
    # the span objective reaches the paper's zero bubble: every rank's span is its 3M of work
    zs = replay(zero_bubble_auto(P, M, memory_limit=2 * P, objective="span"), unit)
    assert max(zs.span) == 3 * M


@pytest.mark.parametrize("P, M", [(4, 8), (8, 24)])
def test_zb1p_at_most_zb_h1_and_zb2p_at_most_zb1p(P, M):
    for d in (None, heavy_last(P)):
        fd = (lambda r, f: d(f.stage, f.kind)) if d else unit
        z1 = replay(generate("zb-1p", P, M, durations=d), fd).makespan
        z2 = replay(generate("zb-2p", P, M, durations=d), fd).makespan
        h1 = replay(generate("zb-h1", P, M), fd).makespan
        assert z2 <= z1 <= h1


def test_heavy_last_stage_zb2p_strictly_faster_than_zb1p():
    P, M = 8, 24
    d = heavy_last(P)
    fd = lambda r, f: d(f.stage, f.kind)   # noqa: E731
    z1 = zero_bubble_auto(P, M, d, 0.0, memory_limit=P, objective="span")
    z2 = zero_bubble_auto(P, M, d, 0.0, memory_limit=2 * P, objective="span")
    s1, s2 = max(replay(z1, fd).span), max(replay(z2, fd).span)
    assert s2 < s1
    # the bottleneck last stage is never idle under zb-2p: its span is its own work
    assert s2 == pytest.approx(M * 3 * 1.7)
    # the makespan objective too (the last rank's start-up offset is the same for both)
    m1 = replay(generate("zb-1p", P, M, durations=d), fd).makespan
    m2 = replay(generate("zb-2p", P, M, durations=d), fd).makespan
    assert m2 <= m1


def test_comm_is_respected():
    P, M = 4, 8
    t = generate("zb-1p", P, M, comm=0.5)
    rp = replay(t, unit, lambda a, b, f: 0.5)
    # rank 3's first F waits for three hops of F + comm
    assert min(s for (r, f), s in rp.start.items() if r == 3) == pytest.approx(3 * 1.5)


def test_ranking_on_synthetic_numbers():
    """Synthetic stage times of a heavy-head pipeline: samples/s rank 1F1B < ZB-1p < ZB-2p."""
    P, M = 8, 24
    d = heavy_last(P, 1.5)
    fd = lambda r, f: d(f.stage, f.kind)   # noqa: E731
    fb = lambda r, f: d(f.stage, "F") if f.kind == "F" else 2 * d(f.stage, "B")  # noqa: E731
    t_1f1b = replay(generate("1f1b", P, M), fb).makespan
    t_z1 = max(replay(zero_bubble_auto(P, M, d, memory_limit=P, objective="span"), fd).span)
    t_z2 = max(replay(zero_bubble_auto(P, M, d, memory_limit=2 * P, objective="span"), fd).span)
    assert M / t_1f1b < M / t_z1 < M / t_z2


def test_per_rank_limits_budget_bytes_from_the_first_two_stages():
    from simulator.schedules.adaptive import per_rank_limits

    # Qi et al.'s budget: limit x max(act[0], act[1]); the heavy last stage holds fewer
    assert per_rank_limits(8, [0.964, 1.446, 1.446, 2.279]) == [12, 8, 8, 5]
    assert per_rank_limits(4, [1.0, 1.0, 1.0]) == [4, 4, 4]
    assert per_rank_limits(2, [1.0, 1.0, 9.0]) == [2, 2, 1]      # never below one
    with pytest.raises(ScheduleError, match="activation"):
        per_rank_limits(4, [1.0, -1.0])


def test_zb_h1_w_lag_sets_each_ranks_peak():
    from simulator.schedules.zero_bubble import zb_h1, zb_h2

    P, M = 4, 8
    assert zb_h1(P, M) == zb_h1(P, M, w_lag=range(P))
    assert replay(zb_h1(P, M), unit).peak_inflight == (4, 4, 4, 4)
    t = zb_h1(P, M, w_lag=[0, 1, 1, 0])
    validate(t)
    assert replay(t, unit).peak_inflight == (4, 4, 3, 1)     # min(P - r, M) + lag
    capped = zb_h2(P, M, limits=[7, 7, 7, 3])
    validate(capped)
    assert replay(capped, unit).peak_inflight[3] <= 3 and zb_h2(P, M) == zb_h2(P, M, limits=[7] * 4)
    with pytest.raises(ScheduleError, match="w_lag"):
        zb_h1(P, M, w_lag=[0, 1])
    with pytest.raises(ScheduleError, match="limits"):
        zb_h2(P, M, limits=[0, 1, 1, 1])


@settings(max_examples=25, deadline=None)
@given(P=st.integers(2, 5), M=st.integers(1, 12),
       act=st.lists(st.floats(0.5, 3.0), min_size=5, max_size=5), two=st.booleans())
def test_activation_budget_holds_on_every_rank(P, M, act, two):
    """With per-stage activation bytes, no rank of the chosen table holds more than its budget,
    and uniform bytes give exactly the count-limited table."""
    from simulator.schedules.adaptive import per_rank_limits

    act = act[:P]
    limit = 2 * P if two else P
    d = heavy_last(P)
    t = zero_bubble_auto(P, M, d, 0.1, memory_limit=limit, objective="span", activation=act)
    validate(t)
    peaks = replay(t, stage_dur({(s, k): d(s, k) for s in range(P) for k in "FBW"})).peak_inflight
    assert all(n <= x for n, x in zip(peaks, per_rank_limits(limit, act)))
    assert zero_bubble_auto(P, M, d, 0.1, memory_limit=limit, objective="span",
                            activation=[1.0] * P) == zero_bubble_auto(
        P, M, d, 0.1, memory_limit=limit, objective="span")
