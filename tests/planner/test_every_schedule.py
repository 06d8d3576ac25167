"""Every pipeline schedule of the simulator as a planner candidate.

The generators are the truth for what a schedule accepts (``schedule_allowed``) and for how many
activations each rank holds (``inflight_count``: never below ``check.replay``'s peak, so the CP-SAT
model never under-counts memory); each schedule plans llama-tiny end to end, and the exact replay
(``predict``) agrees with the discrete-event simulator.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from ortools.sat.python import cp_model

from zoo.costing import workload
from ir import FragmentRef
from hardware_profiles import CLUSTERS_DIR, load_cluster
from planner.api import plan_meshes
from planner.construct import (SEARCHED_SCHEDULES, TRAIN_SCHEDULES, PlanOptions, build_plan,
                               fragment_kinds, make_candidate, schedule_allowed)
from planner.predict import predict
from planner.search import (V_SHAPED, Assignment, Candidate, _inflight_expr, _v_first_expr,
                            inflight_count, inflight_end_counts, solve)
from simulator.plan_sim import simulate_plan
from simulator.schedules import ScheduleError, generate, replay, validate, v_shape_stage_rank
from tests.planner.test_search import option

ZERO_BUBBLE = ("zb-h1", "zb-h2", "zb-1p", "zb-2p", "zb-v", "dualpipe-v")


def _stages_per_rank(s: str, v: int) -> int:
    return v if s in ("interleaved-1f1b", "interleaved-1f1b-a2a") else (2 if s in V_SHAPED else 1)


def _table(s: str, P: int, M: int, v: int = 2, seed: int | None = None):
    """The generator's table; the adaptive ones on seeded random stage times (F, B, W in 0.2..3)."""
    if seed is None:
        return generate(s, P, M, virtual_stages=v)
    rng = random.Random(seed)
    times = {(st, k): rng.uniform(0.2, 3.0) for st in range(P) for k in "FBW"}
    return generate(s, P, M, durations=lambda st, k: times[(st, k)], comm=rng.uniform(0.0, 0.5))


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tiny():
    return workload("llama-tiny", 16)


@pytest.fixture(scope="module")
def cpu4x2():
    return load_cluster(CLUSTERS_DIR / "cpu4x2.yaml")


@pytest.fixture(scope="module")
def cpu4x2_own_hosts(cpu4x2):
    """cpu4x2 with each mesh on its own compute (no host sharing): the replay path of predict."""
    return replace(cpu4x2, meshes={k: replace(m, host=None) for k, m in cpu4x2.meshes.items()},
                   host_slots={})


# ----------------------------------------------------------------------------- names and kinds
def test_train_schedules_are_all_eleven_in_order_and_nine_searched():
    assert TRAIN_SCHEDULES == ("1f1b", "interleaved-1f1b", "gpipe", "zb-h1", "zb-h2", "zb-1p",
                               "zb-2p", "zb-v", "dualpipe-v", "eager-1f1b",
                               "interleaved-1f1b-a2a")
    assert SEARCHED_SCHEDULES == TRAIN_SCHEDULES[:-2]     # eager-1f1b and the a2a overlap: named


def test_fragment_kinds():
    split = {"zb-h1", "zb-h2", "zb-1p", "zb-2p", "zb-v", "dualpipe-v"}
    for s in TRAIN_SCHEDULES:
        assert fragment_kinds(s, True) == (("F", "B", "W") if s in split else ("F", "B"))
        assert fragment_kinds(s, False) == ("F",)
        assert generate(s, 2, 4).split_backward == (s in split)


# ----------------------------------------------------------------------------- schedule_allowed
@pytest.mark.parametrize("s", TRAIN_SCHEDULES)
def test_schedule_allowed_agrees_with_generate(s):
    blocks = 60   # divisible by every stages-per-rank tried, and enough for 5 ranks
    for P in range(1, 6):
        for M in range(1, 13):
            for v in (1, 2, 3):
                ok = schedule_allowed(s, P, M, blocks, v)
                try:
                    t = generate(s, P, M, virtual_stages=v)
                except ScheduleError:
                    assert not ok, (s, P, M, v)
                    continue
                assert ok, (s, P, M, v)
                validate(t)
                assert t.num_stages == _stages_per_rank(s, v) * P
                if s in V_SHAPED:
                    assert t.stage_rank == v_shape_stage_rank(P)
                else:
                    assert t.stage_rank == tuple(x % P for x in range(t.num_stages))


def test_schedule_allowed_needs_blocks_for_every_stage():
    assert schedule_allowed("1f1b", 4, 8, 4, 2)
    assert not schedule_allowed("1f1b", 4, 8, 3, 2)
    assert schedule_allowed("zb-v", 4, 8, 8, 2) and not schedule_allowed("zb-v", 4, 8, 6, 2)
    assert not schedule_allowed("zb-v", 2, 8, 7, 2)           # a V needs an even block count
    assert schedule_allowed("interleaved-1f1b", 2, 4, 6, 3)
    assert not schedule_allowed("interleaved-1f1b", 2, 4, 8, 3)
    assert not schedule_allowed("dualpipe-v", 4, 7, 8, 2)
    assert schedule_allowed("dualpipe-v", 4, 8, 8, 2)
    assert not schedule_allowed("zb-3p", 2, 4, 8, 2)


# ----------------------------------------------------------------------------- in-flight counts
def _cases():
    for s in TRAIN_SCHEDULES:
        for P in range(1, 6):
            for M in range(1, 3 * P + 3):
                for v in ((2, 3) if s == "interleaved-1f1b" else (2,)):
                    if schedule_allowed(s, P, M, 60, v):
                        yield s, P, M, v


@pytest.mark.parametrize("s", TRAIN_SCHEDULES)
def test_inflight_count_never_below_replay_peak(s):
    """The CP-SAT memory terms (whole count x blocks, first-stage count x layers before the blocks,
    last-stage count x layers after) bound the replay's weighted peak on every rank."""
    pre, post = 7.0, 13.0          # extra bytes of the first and the last stage per instance
    for s_, P, M, v in _cases():
        if s_ != s:
            continue
        for seed in ((0, 1, 2) if s in ("zb-1p", "zb-2p") else (None,)):
            t = _table(s, P, M, v, seed)
            S = t.num_stages

            def act(rank: int, ref: FragmentRef) -> float:
                return (1.0 + (pre if ref.stage == 0 else 0.0)
                        + (post if ref.stage == S - 1 else 0.0))

            rp = replay(t, lambda r, f: 1.0, activation=act)
            first, last = inflight_end_counts(s, P, M, v)
            for r in range(P):
                n = inflight_count(s, r, P, M, v)
                assert rp.peak_inflight[r] <= n, (s, P, M, v, r)
                bound = (n + (pre * first if t.stage_rank[0] == r else 0.0)
                         + (post * last if t.stage_rank[S - 1] == r else 0.0))
                assert rp.peak_activation[r] <= bound + 1e-9, (s, P, M, v, r)


def test_inflight_counts_are_the_generators_peaks():
    """Exact for the fixed patterns once M is large: the published figures, counted on the
    generators' tables."""
    for P in range(1, 6):
        M = 3 * P + 2
        peaks = {s: replay(generate(s, P, M), lambda r, f: 1.0).peak_inflight
                 for s in ("1f1b", "zb-h1", "zb-h2", "zb-v", "dualpipe-v", "gpipe")}
        assert peaks["1f1b"] == tuple(P - r for r in range(P))
        assert peaks["zb-h1"] == (P,) * P                   # every rank, not only rank 0
        assert peaks["zb-h2"] == (2 * P - 1,) * P
        assert peaks["zb-v"] == (2 * P,) * P
        assert peaks["dualpipe-v"] == (2 * P + 1,) * P      # DualPipe's table: PP + 1
        assert peaks["gpipe"] == (M,) * P
        for s, pk in peaks.items():
            assert pk == tuple(inflight_count(s, r, P, M, 2) for r in range(P))


@pytest.mark.parametrize("s", TRAIN_SCHEDULES)
def test_variable_position_form_matches_constant_form(s):
    for P in range(1, 5):
        for M in (1, P, 2 * P + 1):
            for pos in range(P):
                model = cp_model.CpModel()
                n_used = model.NewIntVar(P, P, "n")
                p = model.NewIntVar(pos, pos, "p")
                c = Candidate(s, M, _stages_per_rank(s, 3), 6, ("a",), ((),), ((0.0,),), False,
                              v_shape=s in V_SHAPED)
                infl = _inflight_expr(model, c, p, n_used, "i")
                first = _v_first_expr(model, c, n_used, "f") if s in V_SHAPED else None
                solver = cp_model.CpSolver()
                assert solver.Solve(model) == cp_model.OPTIMAL
                assert solver.Value(infl) == inflight_count(s, pos, P, M, c.virtual_stages)
                if first is not None:
                    assert solver.Value(first) == inflight_end_counts(s, P, M, 2)[0]


# ----------------------------------------------------------------------------- CP-SAT in a V
@pytest.mark.parametrize("s,first_ok", [("1f1b", True), ("zb-v", False)])
def test_layers_after_the_blocks_go_to_the_first_mesh_in_a_v(s, first_ok):
    # m0 cannot hold the layers after the blocks: in 1F1B it must not be last, in a V not first
    heavy = replace(option(1.0, cap=100e6), static_post=200e6)
    c = Candidate(s, 4, 2 if s in V_SHAPED else 1, 4, ("m0", "m1"), ((heavy,), (option(1.0),)),
                  ((0.0, 0.0), (0.0, 0.0)), False, required_meshes=("m0", "m1"),
                  v_shape=s in V_SHAPED)
    a = solve(c, time_limit_s=10.0)
    assert a is not None
    assert (a.order[0] == "m0") == first_ok


# ----------------------------------------------------------------------------- candidates and plans
def test_make_candidate(tiny, cpu4x2):
    meshes = tuple(cpu4x2.meshes)
    c = make_candidate(tiny, cpu4x2, meshes, "dualpipe-v", 4, PlanOptions())
    assert c.v_shape and c.virtual_stages == 2 and c.rank_counts == (1, 2)
    assert all(o is c.options[0] for o in c.options)          # identical meshes share options
    fixed = PlanOptions(fixed_order=True)
    assert make_candidate(tiny, cpu4x2, meshes, "dualpipe-v", 4, fixed) is None
    c = make_candidate(tiny, cpu4x2, meshes, "interleaved-1f1b", 4, fixed)
    assert c.rank_counts == (4,) and c.virtual_stages == 2 and c.fixed_order
    # 16 microbatches of one sample: no data-parallel degree of 2 divides them with --max-tensor 1
    assert make_candidate(tiny, cpu4x2, meshes, "1f1b", 16, PlanOptions(max_tensor=1)) is None


def test_v_shaped_build_plan_places_stages_in_a_v(tiny, cpu4x2):
    meshes = tuple(cpu4x2.meshes)
    lay = make_candidate(tiny, cpu4x2, meshes, "zb-v", 4, PlanOptions()).options[0][0].layout
    a = Assignment(order=meshes, blocks=(1, 1, 1, 1), layouts=(lay,) * 4, recompute=(False,) * 4,
                   merge=False, status="OPTIMAL", objective_s=0.0, bound_s=0.0, wall_s=0.0)
    for s in V_SHAPED:
        p = build_plan(tiny, cpu4x2, a, s, 8, 2)
        assert [(st.first, st.last, st.mesh) for st in p.stages] == [
            (0, 2, "m0"), (2, 3, "m1"), (3, 4, "m2"), (4, 5, "m3"),
            (5, 6, "m3"), (6, 7, "m2"), (7, 8, "m1"), (8, 10, "m0")]
        assert p.schedule.name == s and p.schedule.stage_rank == (0, 1, 2, 3, 3, 2, 1, 0)
    # the adaptive ZB-2p, built from the plan's own fragment times, never loses to ZB-H2
    zb2 = predict(build_plan(tiny, cpu4x2, a, "zb-2p", 8, 2), tiny, cpu4x2).step_time_s
    h2 = predict(build_plan(tiny, cpu4x2, a, "zb-h2", 8, 2), tiny, cpu4x2).step_time_s
    assert zb2 <= h2 * (1 + 1e-9)


@pytest.mark.parametrize("s", TRAIN_SCHEDULES)
def test_every_schedule_plans_llama_tiny(s, tiny, cpu4x2, cpu4x2_own_hosts):
    for c in (cpu4x2_own_hosts, cpu4x2):
        r = plan_meshes(tiny, c, PlanOptions(schedules=(s,), time_limit_s=20.0))
        p = r.plan
        assert p.schedule.name == s and r.prediction.fits
        assert all(x[0] == s for x in r.candidates)
        sim = simulate_plan(p, tiny, c)
        assert r.prediction.step_time_s == pytest.approx(sim.step_time_s, rel=0.01)
        first = p.rank_mesh[0]
        assert p.stages[0].mesh == first and p.stages[0].first == 0
        assert p.stages[-1].last == len(tiny.layers)
        if s in V_SHAPED:      # embedding and LM head both on the first mesh
            assert p.stages[-1].mesh == first
            assert p.schedule.stage_rank == v_shape_stage_rank(len(p.rank_mesh))
        else:
            assert p.stages[-1].mesh == p.rank_mesh[-1]
        for m, peak in r.prediction.peak_memory_bytes.items():
            assert peak <= r.prediction.capacity_bytes[m] * (1 - PlanOptions().headroom)


@pytest.mark.parametrize("s", ["zb-v", "dualpipe-v", "zb-1p"])
def test_fixed_order_plans_every_mesh_in_order(s, tiny, cpu4x2_own_hosts):
    meshes = ("m2", "m0", "m3", "m1")
    r = plan_meshes(tiny, cpu4x2_own_hosts, PlanOptions(schedules=(s,), meshes=meshes, fixed_order=True,
                                                 microbatches=(8,), time_limit_s=20.0))
    assert r.plan.rank_mesh == meshes and r.plan.schedule.name == s
    assert r.plan.stages[0].mesh == "m2"
    assert r.plan.stages[-1].mesh == ("m2" if s in V_SHAPED else "m1")
    sim = simulate_plan(r.plan, tiny, cpu4x2_own_hosts)
    assert r.prediction.step_time_s == pytest.approx(sim.step_time_s, rel=0.01)


def test_zb_1p_reuses_the_zb_h1_solve_and_never_loses_to_it(tiny, cpu4x2_own_hosts, monkeypatch):
    import planner.api as api
    solved = []

    def counting(c, **kw):
        solved.append(c.schedule)
        return api_solve(c, **kw)

    api_solve = api.solve_outcome
    monkeypatch.setattr(api, "solve_outcome", counting)
    r = plan_meshes(tiny, cpu4x2_own_hosts, PlanOptions(schedules=("zb-h1", "zb-1p"), time_limit_s=20.0))
    steps = {(s, m): t for s, m, t in r.candidates}
    assert {s for s, _ in steps} == {"zb-h1", "zb-1p"}
    assert solved == ["zb-h1"] * (len(steps) // 2)          # one CP-SAT model for the two
    for (s, m), t in steps.items():
        if s == "zb-1p":
            assert t <= steps[("zb-h1", m)] * (1 + 1e-9)


def test_zero_bubble_beats_1f1b_on_llama3_8b():
    """llama3-8b, global batch 32, on 16 H100 + 32 Blackhole p150b: with every schedule the
    planner picks a zero-bubble one, more than 10% faster than the best 1F1B plan."""
    w = workload("llama3-8b", 32)
    c = load_cluster(CLUSTERS_DIR / "h100x16_p150bx32.yaml")
    opts = PlanOptions(time_limit_s=120.0, microbatches=(16,))
    best = plan_meshes(w, c, opts)
    one = plan_meshes(w, c, replace(opts, schedules=("1f1b",)))
    assert best.plan.schedule.name in ZERO_BUBBLE
    assert best.prediction.step_time_s < 0.9 * one.prediction.step_time_s
    assert {x[0] for x in best.candidates} == set(SEARCHED_SCHEDULES)


def test_rank_order_counts_from_the_generated_order():
    """Forwards after each rank's first B and W's before its last B, read off the generator's
    order: 1F1B's warm-up is P - r forwards (Narayanan et al. 2021, sec. 2.2), so M - (P - r)
    follow the first B; GPipe runs every forward first; ZB-H1 keeps 1F1B's forwards and runs W's
    between its B's; several stages per rank and the adaptive schedules give None."""
    from planner.inflight import rank_order_counts

    from simulator.schedules import generate

    def counted(name, p, m):
        out = []
        for order in generate(name, p, m).order:
            k = [f.kind for f in order]
            first, last = k.index("B"), len(k) - 1 - k[::-1].index("B")
            out.append((k[first:].count("F"), k[:last].count("W")))
        return tuple(out)

    for name in ("1f1b", "gpipe", "zb-h1", "zb-h2"):     # closed forms and generated alike
        for p, m in ((2, 1), (3, 2), (4, 8), (5, 3), (8, 8)):
            assert rank_order_counts(name, p, m) == counted(name, p, m), (name, p, m)
    P, M = 4, 8
    assert rank_order_counts("1f1b", P, M) == tuple((M - (P - r), 0) for r in range(P))
    assert rank_order_counts("gpipe", P, M) == ((0, 0),) * P
    zb = rank_order_counts("zb-h1", P, M)
    assert [f for f, _ in zb] == [M - (P - r) for r in range(P)]
    assert all(0 < w < M for _, w in zb)
    for name in ("zb-1p", "zb-2p", "interleaved-1f1b", "zb-v", "dualpipe-v"):
        assert rank_order_counts(name, P, M) is None
