"""A mesh listing plans no slower than its fastest kind alone: read as node groups when its links
form a chain (hardware_profiles.topology), or, kept as listed, with every kind searched alone first
(planner.api.plan_meshes)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from zoo.costing import workload
from hardware_profiles import load_cluster
from planner import PlanOptions, plan
from planner.api import KIND_SHARE, flop_floor, plan_meshes

CLUSTERS = Path(__file__).resolve().parents[2] / "hardware_profiles" / "clusters"


def test_fixed_listing_searches_each_kind_alone():
    w = workload("llama3-8b", 16, 2048)
    c = replace(load_cluster(CLUSTERS / "h100x16_p150bx32.yaml"), carve_fixed=True)
    r = plan_meshes(w, c, PlanOptions(time_limit_s=4))
    alone = []
    for kind in ("h100-sxm", "blackhole-p150b"):
        ms = tuple(m for m, s in c.meshes.items() if s.device.name == kind)
        alone.append(plan_meshes(w, c, PlanOptions(time_limit_s=4 * KIND_SHARE / 2, meshes=ms))
                     .prediction.step_time_s)
    assert r.prediction.step_time_s <= min(alone) * (1 + 1e-9)
    # the gap is bounded even when candidates were left unsearched
    assert r.search_bound_s is not None and 0 < r.search_bound_s <= r.prediction.step_time_s
    assert r.search_bound_s >= flop_floor(w, c, tuple(c.meshes)) * (1 - 1e-9)


@pytest.mark.slow
def test_mixed512_chain_plans_like_the_node_group_file():
    # the README's mixed512 case; about 1 minute per plan on the reference machine
    w = workload("llama3-70b", 512, 8192)
    chain = plan(w, load_cluster(CLUSTERS / "mixed512_chain.yaml"), PlanOptions())
    nodes = plan(w, load_cluster(CLUSTERS / "mixed512_nodes.yaml"), PlanOptions())
    h100 = plan(w, load_cluster(CLUSTERS / "h100x128_nodes.yaml"), PlanOptions())
    step = chain.prediction.step_time_s
    assert chain.plan.carving                       # read as node groups, carved
    assert step <= h100.prediction.step_time_s
    assert step <= 1.05 * nodes.prediction.step_time_s


def test_a_small_unequal_listing_plans_no_slower_than_as_listed():
    """h100x16_p150bx32 (6 meshes, Blackhole boxes on a ring) is searched both as listed and as
    node groups (planner.shaping._both_readings): never slower than the listing as written."""
    w = workload("llama3-8b", 16, 2048)
    listing = load_cluster(CLUSTERS / "h100x16_p150bx32.yaml")
    both = plan(w, listing, PlanOptions(time_limit_s=4))
    fixed = plan_meshes(w, replace(listing, carve_fixed=True), PlanOptions(time_limit_s=4))
    assert both.prediction.step_time_s <= fixed.prediction.step_time_s * (1 + 1e-9)
    assert both.search_bound_s is None or both.search_bound_s <= both.prediction.step_time_s
