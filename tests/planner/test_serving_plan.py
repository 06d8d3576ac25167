"""planner.serving: serving plans on bundled node-group clusters. Checked plans meet the objectives
in their simulated figures, the steady state and the price per token follow the module's formulas,
plans come sorted by $/M tokens, and objectives nothing meets are refused with the fix."""

from __future__ import annotations

import math

import pytest

from hardware_profiles.cluster_loader import load_cluster
from hardware_profiles.types import Link, NodeGroup
from ir import RequestMix, ServiceObjectives
from planner.errors import PlannerError
from planner.serving import BATCHES, CHUNK_TOKENS, plan_serving, serving_groups, tp_degrees
from simulator.serving_cost import Replica, load_cost, tp_span
from zoo.inference import inference_model

H100X64 = "hardware_profiles/clusters/h100x64_nodes.yaml"
MIXED = "hardware_profiles/clusters/h100x32_p150bx128_nodes.yaml"
SMALL_MIXED = "hardware_profiles/clusters/serve_h100x8_p150bx8_nodes.yaml"

MIX = RequestMix(512, 128)
SLO = ServiceObjectives(ttft_s=1.0, tpot_s=0.05)


@pytest.fixture(scope="module")
def llama8b():
    return inference_model("llama3-8b")


@pytest.fixture(scope="module")
def h100x64():
    return load_cluster(H100X64)


@pytest.fixture(scope="module")
def mixed():
    return load_cluster(MIXED)


def _sorted_by_cost(plans):
    costs = [p.usd_per_m_tokens for p in plans if p.rate_per_s > 0]
    assert all(c is not None for c in costs)
    assert costs == sorted(costs)
    # plans that serve nothing come last
    served = [p.rate_per_s > 0 for p in plans]
    assert served == sorted(served, reverse=True)


@pytest.mark.parametrize("path, mix", [(H100X64, MIX), (SMALL_MIXED, RequestMix(256, 64))])
def test_checked_plans_meet_the_objectives_in_simulation(llama8b, path, mix):
    cluster = load_cluster(path)
    plans = plan_serving(llama8b, cluster, mix, SLO, check=True, requests=100)
    with_pools = [p for p in plans if p.pools]
    assert with_pools
    sizes = {name: g.num_devices for name, g in serving_groups(cluster).items()}
    for p in with_pools:
        assert p.checked and p.result is not None
        assert p.rate_per_s > 0, p.note
        assert p.ttft_s <= SLO.ttft_s and p.tpot_s <= SLO.tpot_s
        # the figures are the simulation's percentiles at the objectives' percentile
        assert p.ttft_s == p.result.percentile("ttft", SLO.percentile)
        assert p.tpot_s == p.result.percentile("tpot", SLO.percentile)
        assert p.output_tokens_per_s == pytest.approx(p.rate_per_s * mix.output_tokens)
        for pool in p.pools:
            assert pool.replicas >= 1 and pool.devices <= sizes[pool.group]
    if path == SMALL_MIXED:      # both directions of disaggregation were checked too
        assert sum(p.family.startswith("disaggregated") for p in with_pools) == 2
    _sorted_by_cost(plans)


def test_colocated_steady_state_and_price_by_the_module_formulas(llama8b, h100x64):
    (plan,) = plan_serving(llama8b, h100x64, MIX, SLO, check=False)
    assert plan.family == "colocated h100-sxm" and not plan.checked
    (pool,) = plan.pools
    assert pool.role == "both" and pool.replicas * pool.tp == 64 and pool.max_batch in BATCHES
    g = h100x64.groups["h100"]
    rep = Replica(llama8b, g.device, pool.tp, tp_span(g, pool.tp))
    # a step decodes d = B and prefills r = B / (O - 1) prompts; TPOT ~ T; TTFT ~ (steps + 1/2) T
    p, o, b = 512, 128, pool.max_batch
    r = min(b / (o - 1), CHUNK_TOKENS / p)
    d = r * (o - 1)
    ctx = p + o / 2
    t = load_cost(rep, d + r * p, d * ctx + r * p * (p + 1) / 2, d * ctx + r * p, min(1.0, r),
                  d + r).total_s
    assert plan.tpot_s == pytest.approx(t, rel=1e-12)
    assert plan.ttft_s == pytest.approx((math.ceil(max(1.0, r) * p / CHUNK_TOKENS) + 0.5) * t,
                                        rel=1e-12)
    assert plan.rate_per_s == pytest.approx(pool.replicas * r / t, rel=1e-12)
    assert plan.tpot_s <= SLO.tpot_s and plan.ttft_s <= SLO.ttft_s
    # 64 H100 at $2.70 and 700 W each over the output tokens of an hour
    tokens_per_h = plan.output_tokens_per_s * 3600
    assert plan.usd_per_m_tokens == pytest.approx(64 * 2.7 * 1e6 / tokens_per_h, rel=1e-12)
    assert plan.kwh_per_m_tokens == pytest.approx(64 * 0.7 * 1e6 / tokens_per_h, rel=1e-12)


def test_mixed_cluster_families_sorted_by_cost(llama8b, mixed):
    plans = plan_serving(llama8b, mixed, MIX, SLO, check=False)
    families = {p.family for p in plans}
    assert families == {"colocated h100-sxm", "colocated blackhole-p150b", "colocated, every kind",
                        "disaggregated h100-sxm -> blackhole-p150b",
                        "disaggregated blackhole-p150b -> h100-sxm"}
    _sorted_by_cost(plans)
    sizes = {"h100": 32, "p150b": 128}
    for p in plans:
        if not p.pools:
            continue
        assert p.ttft_s <= SLO.ttft_s and p.tpot_s <= SLO.tpot_s
        for pool in p.pools:
            assert 1 <= pool.replicas and pool.devices <= sizes[pool.group]
            assert pool.tp in tp_degrees(mixed.groups[pool.group])
        if p.family.startswith("disaggregated"):
            assert [pool.role for pool in p.pools] == ["prefill", "decode"]
            assert "KV cache" in p.note


def test_a_precision_per_group(mixed):
    models = {"h100": inference_model("llama3-8b", "fp8"),
              "p150b": inference_model("llama3-8b", "bfp8,gate_up=bfp4", "bfp8")}
    plans = plan_serving(models, mixed, MIX, SLO, check=False)
    for p in plans:
        for pool in p.pools:
            assert pool.precision == models[pool.group].weight_format


def test_impossible_objectives_are_refused_with_the_fix(llama8b, h100x64):
    with pytest.raises(PlannerError) as e:
        plan_serving(llama8b, h100x64, MIX, ServiceObjectives(ttft_s=1.0, tpot_s=1e-6),
                     check=False)
    msg = str(e.value)
    assert "\n" not in msg
    assert "no deployment meets TTFT 1 s and TPOT 1e-06 s" in msg
    assert "512+128-token requests" in msg and "best TPOT" in msg
    assert "fix: relax --ttft / --tpot" in msg


def test_a_mesh_list_of_whole_nodes_plans_as_its_node_group(llama8b, h100x64):
    meshes = load_cluster("hardware_profiles/clusters/h100x64.yaml")
    (g,) = serving_groups(meshes).values()
    assert (g.device.name, g.nodes, g.devices_per_node) == ("h100-sxm", 8, 8)
    (a,) = plan_serving(llama8b, meshes, MIX, SLO, check=False)
    (b,) = plan_serving(llama8b, h100x64, MIX, SLO, check=False)
    assert a.family == b.family
    assert [(p.tp, p.replicas, p.max_batch) for p in a.pools] == [
        (p.tp, p.replicas, p.max_batch) for p in b.pools]
    assert (a.rate_per_s, a.ttft_s, a.tpot_s, a.usd_per_m_tokens) == pytest.approx(
        (b.rate_per_s, b.ttft_s, b.tpot_s, b.usd_per_m_tokens), rel=1e-12)


def test_tp_degrees(h100x64):
    assert tp_degrees(h100x64.groups["h100"]) == [1, 2, 4, 8, 16, 32, 64]
    dev = h100x64.groups["h100"].device
    link = Link(1e9, 1e-6)
    # divisors of a node, then 2, 4, 8 whole nodes at most
    assert tp_degrees(NodeGroup("g", dev, 4, 6, link, link)) == [1, 2, 3, 6, 12, 24]
    assert tp_degrees(NodeGroup("g", dev, 128, 8, link, link)) == [1, 2, 4, 8, 16, 32, 64]
    assert tp_degrees(NodeGroup("g", dev, 1, 8, link, link)) == [1, 2, 4, 8]
    assert tp_degrees(NodeGroup("g", dev, 3, 4, link, link)) == [1, 2, 4, 8]
