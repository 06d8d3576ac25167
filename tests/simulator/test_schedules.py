"""Schedule generators against the papers' formulas (uniform stages, no communication).

Notation: P ranks, M microbatches, v chunks per rank; F, B, W the per-fragment times.
"Bubble time" of a rank = makespan - busy; "span bubble" = (last end - first start) - busy, the
Zero Bubble papers' per-stage measure (their zero-bubble claims exclude the start-up offset).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ir import FragmentRef
from simulator.schedules import (KINDS, SCHEDULES, SPLIT_BACKWARD, ScheduleError, generate, replay,
                                 stages_per_rank, validate)


def dur(f: float, b: float, w: float = 0.0):
    table = {"F": f, "B": b, "W": w}
    return lambda rank, ref: table[ref.kind]


def bubble_times(rp):
    return [rp.makespan - b for b in rp.busy]


def span_bubbles(rp):
    return [s - b for s, b in zip(rp.span, rp.busy)]


def test_registry_names():
    assert SCHEDULES == ("1f1b", "interleaved-1f1b", "gpipe", "zb-h1", "zb-h2", "zb-v",
                         "dualpipe-v", "eager-1f1b", "interleaved-1f1b-a2a")   # search order
    assert SPLIT_BACKWARD == {"zb-h1", "zb-h2", "zb-v", "dualpipe-v"}
    for name in SCHEDULES:
        t = generate(name, 4, 8)
        assert t.name == name
        assert t.split_backward == (name in SPLIT_BACKWARD)
        assert t.num_stages == 4 * stages_per_rank(name)


@pytest.mark.parametrize("call, text", [
    (lambda: generate("pipedream", 4, 8), "unknown schedule 'pipedream'"),
    (lambda: generate("1f1b", 0, 8), "num_ranks=0"),
    (lambda: generate("gpipe", 4, 0), "microbatches=0"),
    (lambda: generate("interleaved-1f1b", 4, 6), "use 8 microbatches"),
    (lambda: generate("interleaved-1f1b", 4, 8, virtual_stages=1), "virtual_stages=1"),
    (lambda: generate("dualpipe-v", 4, 7), "use at least 8 microbatches"),
    (lambda: generate("zb-h1", 4, 8, forward_only=True), "use 'gpipe'"),
    (lambda: generate("zb-v", 4, 8, forward_only=True), "use 'gpipe'"),
])
def test_invalid_requests_raise_one_line(call, text):
    with pytest.raises(ScheduleError) as e:
        call()
    assert text in str(e.value)
    assert "\n" not in str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("P, M", [(1, 1), (2, 3), (4, 8), (4, 2), (8, 32)])
def test_gpipe_bubble_and_memory(P, M):
    t = generate("gpipe", P, M)
    assert t.stage_rank == tuple(range(P))
    rp = replay(t, dur(1.0, 2.0))
    assert rp.makespan == pytest.approx((M + P - 1) * 3.0)
    for frac in rp.bubble:  # GPipe Sec. 2.3: (P-1)/(M+P-1)
        assert frac == pytest.approx((P - 1) / (M + P - 1))
    assert rp.peak_inflight[0] == M


@pytest.mark.parametrize("P, M", [(1, 1), (2, 3), (4, 8), (4, 2), (8, 32)])
def test_1f1b_bubble_and_memory(P, M):
    t = generate("1f1b", P, M)
    rp = replay(t, dur(1.0, 2.0))
    for frac in rp.bubble:  # Narayanan et al. 2021 Sec. 2.2.1: same bubble as GPipe
        assert frac == pytest.approx((P - 1) / (M + P - 1))
    assert rp.peak_inflight == tuple(min(P - r, M) for r in range(P))
    assert rp.peak_inflight[0] == min(P, M)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_forward_only_inference(name):
    t = generate(name, 4, 6, forward_only=True)
    assert t.forward_only and not t.split_backward
    assert all(f.kind == "F" for o in t.order for f in o)
    validate(t)
    rp = replay(t, dur(1.0, 0.0))
    assert rp.makespan == pytest.approx(6 + 3)
    assert rp.peak_inflight == (1, 1, 1, 1)


@pytest.mark.parametrize("P, M, v", [(2, 2, 2), (2, 8, 2), (4, 8, 2), (4, 16, 3), (8, 16, 2),
                                     (3, 9, 4)])
def test_interleaved_bubble_and_memory(P, M, v):
    t = generate("interleaved-1f1b", P, M, virtual_stages=v)
    assert t.num_stages == v * P
    assert t.stage_rank == tuple(s % P for s in range(v * P))
    f, b = 1.0, 2.0  # per chunk; a rank's whole-model forward/backward is v*f / v*b
    rp = replay(t, dur(f, b))
    for bt, frac in zip(bubble_times(rp), rp.bubble):
        # Narayanan et al. 2021 Sec. 2.2.2: bubble time (P-1)/v * (F + B)
        assert bt == pytest.approx((P - 1) / v * (v * f + v * b))
        assert frac == pytest.approx((P - 1) / (v * M + P - 1))
    peak = min((v + 1) * P - 1, v * M)  # Megatron warm-up + 1
    assert rp.peak_inflight[0] == peak
    if v * M >= (v + 1) * P - 1:  # Korthikanti et al. 2022: P (1 + (P-1)/(vP)) rank-activations
        assert rp.peak_inflight[0] / v == pytest.approx(P * (1 + (P - 1) / (v * P)))


@pytest.mark.parametrize("P, M", [(2, 4), (4, 8), (4, 16), (8, 32)])
@pytest.mark.parametrize("F, B, W", [(1, 1, 1), (1, 1.5, 0.5), (1, 2, 1), (2, 1, 1)])
def test_zb_h1_bubble_and_memory(P, M, F, B, W):
    t = generate("zb-h1", P, M)
    rp = replay(t, dur(F, B, W))
    for bt in bubble_times(rp):  # Qi et al. 2024 Sec. 2.1: (P-1)(F+B-W)
        assert bt == pytest.approx((P - 1) * (F + B - W))
    one = replay(generate("1f1b", P, M), dur(F, B + W))
    assert rp.peak_inflight == (one.peak_inflight[0],) * P  # 1F1B's peak (rank 0), every rank
    if (F, B, W) == (1, 1, 1):  # a third of 1F1B's bubble
        assert bubble_times(rp)[0] == pytest.approx(bubble_times(one)[0] / 3)


@pytest.mark.parametrize("P, M", [(2, 3), (4, 7), (4, 16), (8, 15), (8, 32)])
def test_zb_h2_zero_bubble_when_equal(P, M):
    t = generate("zb-h2", P, M)
    rp = replay(t, dur(1, 1, 1))
    # Qi et al. 2024 Sec. 2.2: (P-1)(F+B-2W) = 0 when F=B=W, per rank span ("parallelogram")
    assert span_bubbles(rp) == pytest.approx([0.0] * P)
    # the start-up offset remains: rank P-1 starts after (P-1) F
    assert rp.makespan == pytest.approx(3 * M + (P - 1))
    assert max(rp.peak_inflight) == 2 * P - 1  # the paper's (2p-1) M_B


@pytest.mark.parametrize("P, M", [(4, 16), (8, 32)])
@pytest.mark.parametrize("F, B, W", [(1, 1.5, 0.5), (1, 2, 1)])
def test_zb_h2_general_durations(P, M, F, B, W):
    rp = replay(generate("zb-h2", P, M), dur(F, B, W))
    assert max(span_bubbles(rp)) == pytest.approx((P - 1) * (F + B - 2 * W))


def test_zb_h2_small_m_keeps_memory_bound():
    for P in range(1, 7):
        for M in range(1, 2 * P):
            rp = replay(generate("zb-h2", P, M), dur(1, 1, 1))
            assert max(rp.peak_inflight) <= 2 * P - 1


@pytest.mark.parametrize("P, M", [(1, 3), (2, 3), (4, 7), (4, 16), (8, 15), (8, 32)])
def test_zb_v_zero_bubble_and_1f1b_memory(P, M):
    t = generate("zb-v", P, M)
    assert t.num_stages == 2 * P
    assert t.stage_rank == tuple(s if s < P else 2 * P - 1 - s for s in range(2 * P))
    f = b = w = 1.0  # per chunk (half a rank's layers)
    rp = replay(t, dur(f, b, w))
    # Controllable-memory paper / ZB repo table: ZB-V bubble rate 0 when F=B=W (M >= 2P-1)
    assert span_bubbles(rp) == pytest.approx([0.0] * P)
    assert rp.makespan == pytest.approx(6 * M + (P - 1))
    assert bubble_times(rp) == pytest.approx([P - 1.0] * P)
    # activation memory 1x 1F1B: 2P half-size chunk activations = P rank-activations
    assert rp.peak_inflight == (2 * P,) * P
    assert rp.peak_inflight[0] / 2 == replay(generate("1f1b", P, M), dur(2, 4)).peak_inflight[0]


@pytest.mark.parametrize("P, M", [(1, 2), (2, 4), (4, 8), (4, 13), (8, 16), (8, 40)])
def test_dualpipe_v_bubble_and_memory(P, M):
    t = generate("dualpipe-v", P, M)
    assert t.stage_rank == tuple(s if s < P else 2 * P - 1 - s for s in range(2 * P))
    F = B = W = 1.0
    rp = replay(t, dur(F, B, W))
    # exact value of this (sequential, no F&B overlap) replay: P-1 on every rank
    assert bubble_times(rp) == pytest.approx([P - 1.0] * P)
    assert span_bubbles(rp) == pytest.approx([P - 1.0 - r for r in range(P)])
    # DualPipe table: (PP/2-1)(F&B + B_full - 3W), PP = 2P; sequential F&B = F+B+W, B_full = B+W
    bound = (P - 1) * ((F + B + W) + (B + W) - 3 * W)
    assert max(bubble_times(rp)) <= bound + 1e-9
    assert rp.peak_inflight == (2 * P + 1,) * P  # the table's PP+1 chunk activations


@pytest.mark.parametrize("F, B, W", [(1, 1.5, 0.5), (1, 2, 1), (2, 1, 1)])
def test_dualpipe_v_within_bound_general(F, B, W):
    P, M = 8, 32
    rp = replay(generate("dualpipe-v", P, M), dur(F, B, W))
    bound = (P - 1) * ((F + B + W) + (B + W) - 3 * W)
    assert max(bubble_times(rp)) <= bound + 1e-9


def _sizes(name: str, P: int, m: int) -> int:
    if name in ("interleaved-1f1b", "interleaved-1f1b-a2a"):
        return P * m
    if name == "dualpipe-v":
        return 2 * P + m - 1
    return m


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(SCHEDULES), P=st.integers(1, 8), m=st.integers(1, 12),
       v=st.integers(2, 4))
def test_every_generated_table_is_valid(name, P, m, v):
    M = _sizes(name, P, m)
    t = generate(name, P, M, virtual_stages=v)
    validate(t)
    stages = {s for s, r in enumerate(t.stage_rank)}
    assert stages == set(range(t.num_stages))
    for r, frags in enumerate(t.order):
        assert all(t.stage_rank[f.stage] == r for f in frags)
    kinds = 3 if t.split_backward else 2
    assert sum(len(o) for o in t.order) == kinds * t.num_stages * M


@pytest.mark.parametrize("name", SCHEDULES)
def test_exhaustive_small_sizes_valid(name):
    for P in range(1, 9):
        for m in (1, 2, 3, 5, 8):
            validate(generate(name, P, _sizes(name, P, m)))


def test_forward_only_tables_valid():
    for P in range(1, 9):
        for M in (1, 2, 5, 9):
            for name in ("gpipe", "1f1b"):
                t = generate(name, P, M, forward_only=True)
                validate(t)
                assert sum(len(o) for o in t.order) == P * M
                assert FragmentRef("F", P - 1, M - 1) in t.order[P - 1]


def test_every_schedule_is_one_kind_found_in_its_module():
    """The registry is the schedule modules' ``KINDS``, in search order; a name not there is one
    line listing them."""
    import importlib

    from simulator.schedules import KINDS, ScheduleError, kind

    assert list(KINDS) == ["1f1b", "interleaved-1f1b", "gpipe", "zb-h1", "zb-h2", "zb-1p", "zb-2p",
                           "zb-v", "dualpipe-v", "eager-1f1b", "interleaved-1f1b-a2a"]
    for name, k in KINDS.items():
        module = importlib.import_module(k.generate.__module__)
        assert k in module.KINDS and k.name == name
        assert k.split_backward == (generate(name, 2, 4).split_backward)
    with pytest.raises(ScheduleError, match="unknown schedule 'zb-h3'; use one of 1f1b, "):
        kind("zb-h3")


def test_eager_1f1b_runs_one_more_warm_up_forward_than_1f1b():
    """P = 2, M = 3: rank 0 runs F0 F1 before B0 in 1F1B, F0 F1 F2 in eager 1F1B; the last rank
    F0 then B0 in 1F1B, F0 F1 then B0 eagerly; the replay's peak is one more microbatch."""
    eager, plain = generate("eager-1f1b", 2, 3), generate("1f1b", 2, 3)
    show = lambda t: [" ".join(f"{f.kind}{f.microbatch}" for f in rank) for rank in t.order]  # noqa: E731
    assert show(plain) == ["F0 F1 B0 F2 B1 B2", "F0 B0 F1 B1 F2 B2"]
    assert show(eager) == ["F0 F1 F2 B0 B1 B2", "F0 F1 B0 F2 B1 B2"]
    validate(eager)
    ones = lambda rank, ref: 1.0  # noqa: E731
    e, p = replay(eager, ones), replay(plain, ones)
    assert e.makespan == p.makespan == 8.0   # (M + P - 1)(F + B) with F = B = 1
    assert e.peak_inflight == (3, 2) and p.peak_inflight == (2, 1)


@pytest.mark.parametrize("name", sorted(n for n, k in KINDS.items() if k.sync_exposed and not k.adaptive))
def test_sync_exposed_schedules_end_each_rank_on_its_first_stages_backward(name):
    """ScheduleKind.sync_exposed (a bound term of the planner): every rank's last fragment is a
    whole backward of its lowest stage, the W when the backward is split, else the B."""
    k = KINDS[name]
    checked = 0
    for P in (2, 3, 4):
        for M in (2 * P, 4 * P):
            v = 2 if k.v_shaped or name.startswith("interleaved") else 1
            if not k.sizes_ok(P, M, v):
                continue
            t = generate(name, P, M, virtual_stages=v) if v > 1 else generate(name, P, M)
            for order in t.order:
                last = order[-1]
                assert last.kind == ("W" if t.split_backward else "B")
                assert last.stage == min(f.stage for f in order)
            checked += 1
    assert checked >= 2
