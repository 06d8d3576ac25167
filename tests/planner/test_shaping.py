"""The cluster-level planner: shapes node groups, chooses among one kind, data parallel across
kinds and one mixed pipeline, beats the hand configuration, and is deterministic."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zoo.costing import workload
from ir import DataParallelPlan, any_plan_to_json
from hardware_profiles import load_cluster
from hardware_profiles.collectives import ring_all_reduce
from hardware_profiles.types import Link
from planner import PlanOptions, plan
from planner.baseline import best_megatron
from planner.grid import grid_sweep
from planner.bounds import layer_work_per_sample, work_bound
from planner.shaping import _granule, _shares, cross_sync, flop_bound
from simulator import cost_model as cm
from simulator.plan_sim import plan_cluster, simulate_any

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "hardware_profiles" / "clusters"


@pytest.fixture(scope="module")
def llama8b():
    return workload("llama3-8b", 64, 4096)


def _two_kinds(tmp_path: Path) -> Path:
    p = tmp_path / "two.yaml"
    p.write_text("""name: two
node_groups:
- name: h100
  device: h100-sxm
  nodes: 2
  devices_per_node: 8
  scale_out_link: {latency_us: 5, source: test}
- name: a100
  device: a100-80gb-sxm
  nodes: 2
  devices_per_node: 8
  scale_out_link: {latency_us: 5, source: test}
group_links:
- between: [h100, a100]
  bandwidth_gbit_per_s: 800
  latency_us: 20
  source: test
""")
    return p


def test_one_group_beats_hand_configuration_and_bound_holds(llama8b):
    c = load_cluster(CLUSTERS / "h100x64_nodes.yaml")
    r = plan(llama8b, c, PlanOptions(time_limit_s=30))
    hand = best_megatron(llama8b, c, "h100")
    grid = grid_sweep(llama8b, c, "h100").best
    assert r.plan.carving and hand is not None and grid is not None
    assert r.prediction.step_time_s <= hand.prediction.step_time_s
    # the grid's best seeds the search: the plan is never slower than the practitioners' sweep
    assert r.prediction.step_time_s <= grid.prediction.step_time_s * (1 + 1e-12)
    assert r.search_bound_s <= r.prediction.step_time_s
    assert r.search_gap is not None and r.search_gap <= 0.07      # 6.0% measured 2026-11-25
    # the plan replays in the simulator on the carved cluster
    sim = simulate_any(r.plan, llama8b, plan_cluster(r.plan, c))
    assert sim.step_time_s == pytest.approx(r.prediction.step_time_s, rel=0.01)


def test_one_group_gap_within_three_percent(llama8b):
    """The issue's target for homogeneous cases (6.0% before the pipeline-fill bound,
    ``planner.bounds.fill_level``)."""
    r = plan(llama8b, load_cluster(CLUSTERS / "h100x64_nodes.yaml"), PlanOptions(time_limit_s=30))
    assert r.search_gap is not None and r.search_gap <= 0.03


def test_deterministic(llama8b):
    c = load_cluster(CLUSTERS / "h100x64_nodes.yaml")
    docs = []
    for _ in range(2):
        r = plan(llama8b, c, PlanOptions(time_limit_s=30))
        d = any_plan_to_json(r.plan)
        d["solver"] = {k: v for k, v in d["solver"].items() if "wall" not in k}
        docs.append(d)
    assert docs[0] == docs[1]


def test_two_kinds_choose_the_fastest_option_and_say_why(tmp_path, llama8b):
    c = load_cluster(_two_kinds(tmp_path))
    r = plan(llama8b, c, PlanOptions(time_limit_s=30))
    options = r.plan.search.options
    assert options is not None
    labels = {o.label for o in options}
    assert {"h100 alone", "a100 alone"} <= labels
    assert any(lab.startswith("data parallel") for lab in labels)
    assert any(lab.startswith("one pipeline") for lab in labels)
    found = [o.step_time_s for o in options if o.step_time_s is not None]
    assert r.prediction.step_time_s == pytest.approx(min(found))
    assert r.plan.search.reason.split(":")[0] in labels
    assert flop_bound(llama8b, c, ("h100", "a100")) <= r.prediction.step_time_s
    # the reported bound: no lower than the work bound (itself above the FLOP bound), no higher
    # than any option tried (each option's bound is checked in test_split_bound.py)
    wb = work_bound(llama8b, c, ("h100", "a100"))
    assert flop_bound(llama8b, c, ("h100", "a100")) < wb <= r.search_bound_s <= min(found)
    assert r.search_gap == pytest.approx(1 - r.search_bound_s / r.prediction.step_time_s, rel=1e-9)
    if isinstance(r.plan, DataParallelPlan):
        assert sum(p.global_batch for p in r.plan.parts) == 64


def test_cross_sync_is_a_ring_over_the_parts_at_the_narrowest_link(tmp_path, llama8b):
    c = load_cluster(_two_kinds(tmp_path))
    name, nbytes, secs = cross_sync(llama8b, c, (("h100",), ("a100",)))
    assert name == "h100<->a100"
    assert nbytes == llama8b.param_count * cm.GRAD_BYTES_PER_PARAM
    # 16 devices x 400 Gb/s per side, capped by the 800 Gb/s group link
    assert secs == pytest.approx(ring_all_reduce(nbytes, 2, Link(800e9 / 8, 20e-6)))
    assert cross_sync(llama8b, c, (("h100",),))[2] == 0.0


def test_shares_in_granules_proportional_to_rates():
    assert _granule(512, 3) == 32
    assert _granule(64, 2) == 8
    # the slowest part's time is least: 320/17.7 = 18.1 (largest remainder's 128/7.0 = 18.3)
    assert _shares(512, [17.7, 7.0, 6.2], 32) == [320, 96, 96]
    assert _shares(64, [1.0, 1.0], 8) == [32, 32]
    assert sum(_shares(96, [5.0, 1.0, 0.01], 8)) == 96
    assert min(_shares(96, [5.0, 1.0, 0.01], 8)) == 8      # every part keeps one granule


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.01, 100.0), min_size=2, max_size=4), st.integers(4, 12))
def test_shares_minimise_the_slowest_part(rates, units):
    """Against every split into whole granules, each part at least one."""
    from itertools import product
    got = _shares(units * 8, rates, 8)
    assert sum(got) == units * 8 and min(got) >= 8
    best = min(max(c / r for c, r in zip(combo, rates))
               for combo in product(range(1, units + 1), repeat=len(rates)) if sum(combo) == units)
    assert max(g / 8 / r for g, r in zip(got, rates)) == pytest.approx(best, rel=1e-12)


def test_the_search_says_why_it_stopped():
    import time
    from types import SimpleNamespace
    from planner.budget import Budget
    from planner.shaping import _stopped
    far, past = time.monotonic() + 3600, time.monotonic() - 1
    spent = Budget(1.0, far)
    spent.charge(1.0)
    assert _stopped(SimpleNamespace(interrupted=True, budget=Budget(1.0, far))) == "interrupted"
    assert _stopped(SimpleNamespace(interrupted=False, budget=spent)) == "work budget"
    assert _stopped(SimpleNamespace(interrupted=False, budget=Budget(1.0, past))) == "time limit"
    assert _stopped(SimpleNamespace(interrupted=False, budget=Budget(1.0, far))) == "complete"


def test_the_work_budget_governs_and_the_wall_clock_cuts_only_at_twenty_times_the_limit(llama8b):
    """--time-limit is nominal work (the same plan on a busy machine, only later); the wall clock
    cuts at WALL_FACTOR times it."""
    from planner.shaping import WALL_FACTOR, WORK_SHARE, _Search
    c = load_cluster(CLUSTERS / "h100x64_nodes.yaml")
    s = _Search(llama8b, c, PlanOptions(time_limit_s=30), None, None)
    assert WALL_FACTOR == 20.0
    assert s.deadline - s.t0 == pytest.approx(600.0)
    assert s.budget.work_s == 30 * WORK_SHARE


# ----------------------------------------------------------------------------- mesh listings
def test_a_listing_of_whole_nodes_is_shaped_unless_kept_as_written():
    """Two 2-device meshes of one kind: shaped as a node group (the plan names carved meshes and
    records its carving); ``carve: fixed`` or naming meshes keeps the mesh-level search."""
    from dataclasses import replace

    from tests.planner.conftest import cluster, device, workload as toy

    c = cluster([("f0", device("fast", 400.0, 80.0), 2), ("f1", device("fast", 400.0, 80.0), 2)])
    w = toy()
    shaped = plan(w, c, PlanOptions(time_limit_s=10))
    assert [s["group"] for s in shaped.plan.carving] == ["fast"]
    assert set(shaped.plan.rank_mesh) <= {"fast.0", "fast.1"} and shaped.plan.cluster == "toy"
    lc = plan_cluster(shaped.plan, c)                 # the consumers carve the same listing
    assert simulate_any(shaped.plan, w, lc).step_time_s == pytest.approx(shaped.prediction.step_time_s, rel=0.01)
    for kept, opts in ((replace(c, carve_fixed=True), PlanOptions(time_limit_s=10)),
                       (c, PlanOptions(time_limit_s=10, meshes=("f0", "f1")))):
        r = plan(w, kept, opts)
        assert r.plan.carving == () and set(r.plan.rank_mesh) <= {"f0", "f1"}
        assert plan_cluster(r.plan, kept) is kept


def test_llama3_70b_on_the_h100x128_listing_plans_as_on_its_node_groups():
    """The listing of 16 DGX H100 nodes (h100x128.yaml) and the same nodes as a node group
    (h100x128_nodes.yaml) get the same search, so the same step (within 2%; measured equal)."""
    w = workload("llama3-70b", 256, 8192)
    listing = plan(w, load_cluster(CLUSTERS / "h100x128.yaml"), PlanOptions(time_limit_s=30))
    nodes = plan(w, load_cluster(CLUSTERS / "h100x128_nodes.yaml"), PlanOptions(time_limit_s=30))
    assert [s["group"] for s in listing.plan.carving] == ["h100-sxm"]
    assert listing.prediction.step_time_s == pytest.approx(nodes.prediction.step_time_s, rel=0.02)


def test_work_bound_is_the_fluid_share_of_every_layers_least_device_seconds(llama8b):
    """One kind: the bound is the batch's least device-seconds over the devices. Two kinds with
    the same layers: the devices' speeds add (an H100 group and an A100 group side by side)."""
    import dataclasses
    c = load_cluster(CLUSTERS / "h100x64_nodes.yaml")
    (g,) = c.groups
    dev = c.groups[g].device
    per = sum(layer_work_per_sample(llama8b.costs[n], dev, "bf16", True) for n in llama8b.layers)
    assert work_bound(llama8b, c, (g,)) == pytest.approx(64 * per / 64 * (1 - 1e-6), rel=1e-9)
    # each layer's per-sample seconds hold the FLOP at the forward and backward rates
    blk = llama8b.costs["decoder_block"]
    rate = dev.achievable_flops("bf16")
    assert layer_work_per_sample(blk, dev, "bf16", True) >= (
        blk.fwd_flops_per_sample / rate + blk.bwd_flops_per_sample / (rate * dev.backward_efficiency))
    two = dataclasses.replace(c, groups={"a": c.groups[g], "b": c.groups[g]})
    assert work_bound(llama8b, two, ("a", "b")) == pytest.approx(
        work_bound(llama8b, c, (g,)) / 2, rel=1e-6)
