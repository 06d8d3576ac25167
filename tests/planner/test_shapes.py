"""The shape search: lower bounds that hold, and no better plan than the planner's on small
instances searched exhaustively under the planner's own cost model (the exact replay)."""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from zoo.costing import workload
from ir import Layout
from hardware_profiles import carve, load_cluster
from planner import construct
from planner.predict import predict
from planner.search import Assignment
from simulator.stage_cost import StageCost
from planner.bounds import candidate_bound, quick_bound
from planner.budget import Budget
from planner.shapes import Enumeration, OptionCache, group_shapes, prove, search_pipeline

SCHEDULES = ("1f1b", "interleaved-1f1b", "gpipe", "zb-h1", "zb-h2", "zb-v", "dualpipe-v")


def _cluster(tmp_path: Path, groups: list[tuple[str, str, int, int]]):
    body = "name: tiny\nnode_groups:\n"
    for name, device, nodes, per in groups:
        body += (f"- name: {name}\n  device: {device}\n  nodes: {nodes}\n  devices_per_node: {per}\n"
                 f"  scale_out_link:\n    latency_us: 5\n    source: test\n")
    if len(groups) > 1:
        body += "default_link:\n  bandwidth_gbit_per_s: 400\n  latency_us: 20\n  source: test\n"
    p = tmp_path / "tiny.yaml"
    p.write_text(body)
    return load_cluster(p)


def _compositions(n: int, k: int):
    for cut in itertools.combinations(range(1, n), k - 1):
        edges = (0,) + cut + (n,)
        yield tuple(b - a for a, b in zip(edges, edges[1:]))


def _brute_force(w, cluster, groups, opts) -> float:
    """The least exact step time over every shape, microbatch count, schedule, layer partition,
    per-mesh layout and recomputation the planner may choose (same option sets, same memory
    check)."""
    pre, nb, post = construct.split_layers(w)
    best = math.inf
    per_group = [group_shapes(cluster.groups[g], 8) for g in groups]
    for shapes in itertools.product(*per_group):
        lc = carve(cluster, shapes)
        meshes = tuple(lc.meshes)
        p = len(meshes)
        for m in construct.microbatch_counts(w, opts, p):
            for sched in opts.schedules:
                v = construct.stages_per_rank(sched, opts.virtual_stages)
                if not construct.schedule_allowed(sched, p, m, nb, opts.virtual_stages):
                    continue
                o = replace(opts, fixed_order=True, schedules=(sched,), microbatches=(m,))
                cand = construct.make_candidate(w, lc, meshes, sched, m, o)
                if cand is None:
                    continue
                for blocks in _compositions(nb // v, p):
                    for picks in itertools.product(*cand.options):
                        for merge in ((False, True) if cand.mergeable else (False,)):
                            a = Assignment(meshes, blocks, tuple(x.layout for x in picks),
                                           tuple(x.recompute for x in picks), merge, "BRUTE", 0, 0, 0)
                            plan = construct.build_plan(w, lc, a, sched, m, v)
                            pred = predict(plan, w, lc, headroom=opts.headroom)
                            if pred.fits:
                                best = min(best, pred.step_time_s)
    return best


@pytest.mark.parametrize("groups,spec", [
    (("h100",), [("h100", "h100-sxm", 2, 2)]),
    (("h100", "a100"), [("h100", "h100-sxm", 1, 2), ("a100", "a100-80gb-sxm", 1, 2)]),
    (("a100", "h100"), [("h100", "h100-sxm", 1, 2), ("a100", "a100-80gb-sxm", 1, 2)]),
    (("h200", "a100", "h100"), [("h100", "h100-sxm", 1, 1), ("a100", "a100-80gb-sxm", 1, 1),
                                ("h200", "h200-sxm", 1, 1)]),
    pytest.param(("h200", "a100", "h100", "b200"),
                 [("h100", "h100-sxm", 1, 1), ("a100", "a100-80gb-sxm", 1, 1), ("h200", "h200-sxm", 1, 1),
                  ("b200", "b200", 1, 1)], marks=pytest.mark.slow),
    pytest.param(("h100",), [("h100", "h100-sxm", 4, 1)], marks=pytest.mark.slow),
])
def test_brute_force_finds_nothing_better(tmp_path, groups, spec):
    """Every shape, microbatch count, schedule, partition, layout and merge the planner may choose,
    replayed exactly: none beats the planner's plan, and none beats its bound (up to 4 node groups
    or 4 nodes: the last two cases are slow)."""
    w = workload("llama-tiny", 8)
    cluster = _cluster(tmp_path, spec)
    opts = construct.PlanOptions(schedules=SCHEDULES, microbatches=(2, 4, 8))
    got = search_pipeline(w, cluster, groups, opts, deadline=time.monotonic() + 600, target_gap=0.0)
    brute = _brute_force(w, cluster, groups, opts)
    assert got.prediction is not None and math.isfinite(brute)
    assert got.prediction.step_time_s <= brute * (1 + 1e-9)
    assert got.bound_s <= brute * (1 + 1e-9)       # the bound holds
    # raised after the search (dependence graphs, then as integer programs): it still holds
    proved = prove(got, Budget(math.inf, math.inf), target_gap=0.0)
    assert got.bound_s <= proved.bound_s <= brute * (1 + 1e-9)
    assert proved.plan is got.plan


def _opt(block, pre=0.0, tail=0.0, static=0.0, resid=0.0, cap=1e12, ovh=0.0):
    return StageCost(Layout(1, 1), False, block, pre, 0.0, ovh, 0.0, tail, 0.0, 0.0, static, 0.0, 0.0,
                      resid, 0.0, 0.0, 0.0, cap)


def test_work_bound_identical_meshes_is_even_split():
    # 4 identical meshes, 8 blocks of 1 s, 3 microbatches: busiest mesh >= 3 x 2 s
    opts = [[_opt(1.0)]] * 4
    assert candidate_bound(opts, opts, 3, 8, 0.0, [1] * 4) == pytest.approx(6.0)
    assert quick_bound(opts, 3, 8) == pytest.approx(6.0)


def test_chain_bound_one_stage_per_rank():
    # 2 ranks, 4 blocks of 1 s, M = 2: rank 0 ends by 2 n0, rank 1 by n0 + 2 n1; over (n0, n1)
    # = (4,0) 8, (3,1) 6, (2,2) 6, (1,3) 7: the chain bound is 6 (the work bound alone 2 x 2 = 4)
    opts = [[_opt(1.0)]] * 2
    assert candidate_bound(opts, opts, 2, 4, 0.0, [2, 1]) == pytest.approx(4.0)
    assert candidate_bound(opts, opts, 2, 4, 1.0, [2, 1]) == pytest.approx(6.0)


def test_bound_counts_whole_blocks():
    # 2 meshes, 3 blocks of 1 s, 1 microbatch: one mesh runs 2 blocks (the fluid level says 1.5)
    opts = [[_opt(1.0)]] * 2
    assert candidate_bound(opts, opts, 1, 3, 0.0, [1, 1]) == pytest.approx(2.0)
    # interleaved with 2 chunks per rank: 4 blocks on 2 ranks -> 2 each; 6 blocks -> 4 and 2
    assert candidate_bound(opts, opts, 1, 6, 0.0, [1, 1], virtual_stages=2) == pytest.approx(4.0)


def test_memory_caps_force_a_slower_option():
    # fast option holds at most 1 block, slow one any: 2 blocks on 1 mesh -> the slow one
    fast = _opt(1.0, static=10.0, cap=15.0)
    slow = _opt(3.0)
    assert candidate_bound([[fast, slow]], [[fast, slow]], 1, 2, 0.0, [1]) == pytest.approx(6.0)
    assert candidate_bound([[fast]], [[fast]], 1, 2, 0.0, [1]) == math.inf


def test_quick_bound_never_above_full_bound(tmp_path):
    w = workload("llama-tiny", 8)
    cluster = _cluster(tmp_path, [("h100", "h100-sxm", 4, 2)])
    opts = construct.PlanOptions(schedules=SCHEDULES)
    e = Enumeration(w, cluster, ("h100",), opts, OptionCache(w, opts), None)
    assert e.items
    for c in e.items:
        assert c.bound_s <= e.refine(c).bound_s + 1e-12


def test_group_shapes_cover_every_divisor_pair(tmp_path):
    cluster = _cluster(tmp_path, [("h100", "h100-sxm", 4, 8)])
    shapes = group_shapes(cluster.groups["h100"], 64)
    assert {(s.nodes_per_mesh, s.meshes_per_node) for s in shapes} == {
        (r, s) for r in (1, 2, 4) for s in (1, 2, 4, 8)}
    assert all(s.num_meshes == 4 // s.nodes_per_mesh * s.meshes_per_node for s in shapes)
    assert len(group_shapes(cluster.groups["h100"], 2)) == 3   # (4,1), (2,1), (4,2)


def test_work_bound_adds_the_straggler_wait():
    # the gradient sync waits 10% of each rank's work for the slowest host: 1.1 x 6 s
    opts = [[_opt(1.0)]] * 4
    assert candidate_bound(opts, opts, 3, 8, 0.0, [1] * 4, straggler=[0.1] * 4) == pytest.approx(6.6)
    # a rank's share weighs on its own work only: rank 1 waits 50%, so (5, 3) blocks: max(5, 4.5)
    two = [[_opt(1.0)]] * 2
    assert candidate_bound(two, two, 1, 8, 0.0, [1, 1], straggler=[0.0, 0.5]) == pytest.approx(5.0)


def _jittered(tmp_path: Path, jitter: float) -> str:
    """The bundled H100 profile with ``sync_jitter`` set to ``jitter`` (a profile file)."""
    import yaml

    from hardware_profiles.loader import DEVICES_DIR

    doc = yaml.safe_load((DEVICES_DIR / "h100-sxm.yaml").read_text())
    doc["efficiency"]["sync_jitter"] = {"value": jitter, "origin": "test"}
    doc["name"] = "h100-jitter"
    p = tmp_path / "h100-jitter.yaml"
    p.write_text(yaml.safe_dump(doc))
    return str(p)


@pytest.mark.parametrize("jitter,schedules,mixed,moe", [(0.0, SCHEDULES, False, False),
                                                         (0.08, SCHEDULES, False, False),
                                                         (0.0, ("zb-1p", "zb-2p"), False, False),
                                                         (0.0, SCHEDULES, True, False),
                                                         (0.0, SCHEDULES, False, True)])
def test_bound_holds_for_random_plans(tmp_path, jitter, schedules, mixed, moe):
    """Every schedule's bound of a candidate (the closed-form terms and its dependence graph's,
    ``planner.dag_bound``) is at most the exact step of any plan of that candidate that fits
    memory: 4 nodes of 2 devices, every shape, random partitions and layouts, with and without a
    straggler wait at the gradient sync (``sync_jitter``), the adaptive ZB-1p/2p (whose
    graph bound has no fixed order), a mixed pipeline (2 H100 nodes then 2 A100 nodes, the
    kinds joined by a slower link: what a heterogeneous search's bound refines), and a mixture
    of experts (``tiny-moe``: expert-parallel layouts, DualPipeV hiding the all-to-alls)."""
    import random

    from zoo.model_files import resolve_model

    rng = random.Random(0)
    w = workload(resolve_model("zoo/configs/tiny-moe.yaml"), 16, seq_len=64) if moe else \
        workload("llama-tiny", 16)
    if mixed:
        cluster = _cluster(tmp_path, [("h100", "h100-sxm", 2, 2), ("a100", "a100-80gb-sxm", 2, 2)])
        groups = ("h100", "a100")
    else:
        cluster = _cluster(tmp_path, [("h100", _jittered(tmp_path, jitter), 4, 2)])
        assert cluster.groups["h100"].device.sync_jitter == jitter
        groups = ("h100",)
    opts = construct.PlanOptions(schedules=schedules)
    e = Enumeration(w, cluster, groups, opts, OptionCache(w, opts), None)
    pre, nb, post = construct.split_layers(w)
    checked = 0
    for c in e.items:
        c = e.refine_orders(e.refine(c), math.inf, Budget(math.inf, math.inf))
        if not mixed and not moe and jitter == 0.0:
            # the same graphs as mixed-integer programs (one layout, whole blocks per rank)
            c = e.refine_orders(c, math.inf, Budget(math.inf, math.inf), integer=True)
        lc, meshes = e.lc[c.shapes]
        p = len(meshes)
        for sched, bound in c.schedule_bounds:
            v = construct.stages_per_rank(sched, opts.virtual_stages)
            o = replace(opts, fixed_order=True, schedules=(sched,), microbatches=(c.microbatches,))
            cand = construct.make_candidate(w, lc, meshes, sched, c.microbatches, o)
            parts = list(_compositions(nb // v, p))
            for _ in range(3):
                blocks = rng.choice(parts)
                picks = [rng.choice(x) for x in cand.options]
                a = Assignment(meshes, blocks, tuple(x.layout for x in picks),
                               tuple(x.recompute for x in picks), cand.mergeable and rng.random() < 0.5,
                               "RANDOM", 0, 0, 0)
                pred = predict(construct.build_plan(w, lc, a, sched, c.microbatches, v), w, lc,
                               headroom=opts.headroom)
                if pred.fits:
                    assert bound <= pred.step_time_s * (1 + 1e-9), (c.shapes, c.microbatches, sched)
                    checked += 1
    assert checked > 100


def test_fill_bound_waits_for_one_microbatchs_forward_and_backward():
    """2 ranks, 4 blocks each F 1, B 1, W 1 s, 2 microbatches. In a line, rank 0's first B waits
    for a forward over all 4 blocks and the B of rank 1's, then runs its own 2 x n x (B + W):
    with n blocks on rank 0, ``8 - n + 4 n``, against rank 1's work ``6 (4 - n)``: n = 2 gives
    max(14, 12) = 14 (a ZB-H1 table of that split ends at 14), n = 1 max(11, 18). In a V (rank 0
    holds the first and the last stage) rank 0 also runs its last stage's second forward after
    the first: ``4 + 4.5 n`` against ``6 (4 - n)``, least at n = 2: 13."""
    from planner.bounds import _ranks, fill_level

    o = replace(_opt(3.0), block_f_s=1.0, block_w_s=1.0)
    opts = [[o], [o]]
    line = _ranks(opts, [2, 1], 1, 2)
    assert fill_level(opts, line, 2, 4, 1, v_shaped=False) == pytest.approx(14.0)
    assert candidate_bound(opts, opts, 2, 4, 1.0, [2, 1]) == pytest.approx(14.0)
    vee = _ranks(opts, [2, 2], 2, 2)
    assert fill_level(opts, vee, 2, 4, 2, v_shaped=True) == pytest.approx(13.0)
    # without a forward time, or without a backward (forward-only), no fill term
    assert fill_level([[_opt(3.0)]] * 2, line, 2, 4, 1, v_shaped=False) == 0.0
    fwd = replace(_opt(1.0), block_f_s=1.0)
    assert fill_level([[fwd]] * 2, _ranks([[fwd]] * 2, [2, 1], 1, 2), 2, 4, 1, False) == 0.0


def test_line_fill_bound_every_rank_waits_for_its_round_trip():
    """One stage per rank, F 1 s, B 2 s per block (no W), 6 blocks, 4 microbatches, 1F1B on 3
    ranks (rank r runs M - (P - r) forwards after its first B). Rank r with n blocks:
    ``n (1 + late) + 8 n + max(3 (6 - n), 6 - n)``: 7n + 18, 8n + 18, 9n + 18; the even split
    gives the last rank 36 = (M + P - 1) x 6 s, the uniform 1F1B step (Narayanan et al. 2021),
    which any other split exceeds. With a 6 s LM head on the last rank, all of whose 4 fragments
    run after its first B (non-split backward), that rank needs 42 s even with no block:
    ``(L - 0) (F + B) + 4 x 6``. The 2-rank split-backward case of the rank-0 fill bound gives
    the same 14 s."""
    from planner.bounds import _ranks, line_fill_level
    from planner.inflight import rank_order_counts

    o = replace(_opt(3.0), block_f_s=1.0)
    opts = [[o]] * 3
    orders = rank_order_counts("1f1b", 3, 4)
    assert orders == ((1, 0), (2, 0), (3, 0))
    ranks = _ranks(opts, [3, 2, 1], 1, 4)
    assert line_fill_level(opts, ranks, 4, 6, [3, 2, 1], (), 0.0, orders) == pytest.approx(36.0)
    assert line_fill_level(opts, ranks, 4, 6, [3, 2, 1], (), 0.0) == pytest.approx(36.0)
    assert candidate_bound(opts, opts, 4, 6, 1.0, [3, 2, 1], orders=orders) == pytest.approx(36.0)
    head = [[o], [o], [replace(o, post_s=6.0)]]
    ranks = _ranks(head, [3, 2, 1], 1, 4, post_rank=2)
    assert line_fill_level(head, ranks, 4, 6, [3, 2, 1], (), 0.0, orders) == pytest.approx(42.0)
    split = replace(_opt(3.0), block_f_s=1.0, block_w_s=1.0)
    two = [[split], [split]]
    assert line_fill_level(two, _ranks(two, [2, 1], 1, 2), 2, 4, [2, 1]) == pytest.approx(14.0)
    # a transfer at the boundary after a rank lies on its round trip
    assert line_fill_level(opts, _ranks(opts, [3, 2, 1], 1, 4), 4, 6, [3, 2, 1], (5.0, 5.0), 0.0,
                           orders) > 36.0


def test_started_bound_waits_for_the_forward_to_reach_each_rank():
    """2 ranks in a line, 4 blocks of 1 s (F 0.25 s), 2 microbatches: rank 1 starts only once
    microbatch 0's forward crosses rank 0's ``n0`` blocks, then runs its ``2 n1`` s:
    ``max(2 n0, 0.25 n0 + 2 n1)`` is 4.5 at (2, 2), 6 at (3, 1): 4.5 (the work term alone: 4)."""
    from planner.bounds import _ranks, _started
    from planner.level import water_level

    o = replace(_opt(1.0), block_f_s=0.25)
    opts = [[o], [o]]
    ranks = _ranks(opts, [2, 1], 1, 2)
    assert water_level(ranks, 4, 0.0) == pytest.approx(4.0)
    assert water_level(_started(ranks, opts), 4, 1.0) == pytest.approx(4.5)
    assert candidate_bound(opts, opts, 2, 4, 1.0, [2, 1]) >= 4.5 * (1 - 1e-6)
    # in a V (chain 1/2) rank 1's first stage follows one of rank 0's two: 0.25 x n0 / 2
    assert water_level(_started(ranks, opts), 4, 0.5, 2) == pytest.approx(4.25)


def test_every_rank_holds_a_block():
    """3 ranks of 1, 1 and 5 s per block, 3 blocks, 1 microbatch: left free the slow rank holds
    none (2, 1, 0): 2 s; when every rank holds one (the shape search's pipelines): 5 s; 2 blocks
    cannot cover 3 ranks."""
    from planner.level import water_level

    opts = [[_opt(1.0)], [_opt(1.0)], [_opt(5.0)]]
    assert candidate_bound(opts, opts, 1, 3, 0.0, [1] * 3) == pytest.approx(2.0)
    assert candidate_bound(opts, opts, 1, 3, 0.0, [1] * 3, every_rank=True) == pytest.approx(5.0)
    from planner.bounds import _ranks
    assert water_level(_ranks(opts, [1] * 3, 1, 1), 2, 0.0, least=1) == math.inf


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 2.0), st.floats(0.0, 1.0),
                          st.lists(st.tuples(st.floats(0.1, 3.0), st.floats(0.05, 1.0),
                                             st.integers(0, 6), st.floats(0.0, 2.0)),
                                   min_size=1, max_size=2)), min_size=1, max_size=4),
       st.integers(1, 8), st.sampled_from([0.0, 0.5, 1.0]), st.sampled_from([1, 2]),
       st.booleans(), st.floats(0.0, 30.0))
def test_capacity_matches_every_partition(ranks, blocks, chain, per_rank, every, tau):
    """``block_capacity`` decides, at any ``tau``, exactly whether some partition of ``blocks`` over
    the ranks (whole multiples of ``per_rank``, each at least ``per_rank`` when ``every``) meets
    every rank's ``tau >= fixed + chain (fixed chain of the ranks before + their blocks x the
    least chain seconds per block) + extra + n x step`` (``n <= cap``) for some option."""
    from planner.level import block_capacity

    num_blocks = blocks * per_rank
    least = per_rank if every else 0
    # (fixed, fixed chain, ((step per block, chain per block, cap, extra, 0, 0), ...)); a block's
    # step seconds are at least its chain seconds, as in every rank the bounds build
    rs = [(f, fc, tuple((s + c, c, cap, x, 0.0, 0.0) for s, c, cap, x in opts))
          for f, fc, opts in ranks]
    fastest = min(c for _, _, opts in rs for _, c, _, _, _, _ in opts)

    def fits(r: int, n: int, before: int) -> bool:
        if n == 0 and not every:
            return True
        fixed, _, opts = rs[r]
        room = tau - fixed - chain * (sum(x[1] for x in rs[:r]) + before * fastest)
        return any(n <= cap and room > extra and n * step <= (room - extra) * (1 + 1e-12)
                   for step, _, cap, extra, _, _ in opts)

    def brute(r: int, before: int) -> bool:
        if r == len(rs):
            return before == num_blocks
        return any(fits(r, n, before) and brute(r + 1, before + n)
                   for n in range(least, num_blocks - before + 1, per_rank))

    got = block_capacity(rs, chain, per_rank, (), num_blocks, least)(tau) >= num_blocks
    assert got == brute(0, 0)
