"""Plans for cost and within a budget on part of a cluster (planner.objective)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from zoo.costing import workload
from hardware_profiles import load_cluster
from planner import Goal, PlanOptions, PlannerError, plan
from planner.objective import group_price, sub_clusters, usd_per_hour, used_devices

CLUSTER = """name: priced
node_groups:
- name: a100
  device: a100-40gb-sxm
  nodes: 4
  devices_per_node: 4
  price_usd_per_device_hour: 3.0
  scale_out_link: {bandwidth_gbit_per_s: 50, latency_us: 30, source: test}
- name: v100
  device: v100-sxm2-16gb
  nodes: 2
  devices_per_node: 4
  price_usd_per_device_hour: 2.0
  scale_out_link: {bandwidth_gbit_per_s: 50, latency_us: 30, source: test}
group_links:
- between: [a100, v100]
  bandwidth_gbit_per_s: 100
  latency_us: 30
  source: test
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    p = tmp_path_factory.mktemp("objective") / "priced.yaml"
    p.write_text(CLUSTER)
    return load_cluster(p)


@pytest.fixture(scope="module")
def opt():
    return workload("opt-350m", 64, 2048)


@pytest.fixture(scope="module")
def fastest(cluster, opt):
    return plan(opt, cluster, PlanOptions(time_limit_s=6), goal=Goal())


def test_sub_clusters_are_every_share_of_every_group(cluster):
    subs = sub_clusters(cluster)
    counts = [tuple(s.groups[g].nodes if g in s.groups else 0 for g in ("a100", "v100")) for s in subs]
    # a100: 4, 2, 1 or none; v100: 2, 1 or none; never nothing at all
    assert sorted(counts) == sorted((a, v) for a in (4, 2, 1, 0) for v in (2, 1, 0) if a or v)
    one = next(s for s in subs if set(s.groups) == {"a100"})
    assert one.group_links == ()          # no link to a group left out


def test_group_price_from_the_file_else_the_profile_else_an_error(cluster):
    assert group_price(cluster.groups["a100"]) == 3.0
    g = replace(cluster.groups["a100"], price_per_device_hour=None,
                device=replace(cluster.groups["a100"].device, price_per_hour=(1.0, 2.0)))
    assert group_price(g) == 1.5
    with pytest.raises(PlannerError, match="no price; fix: set price_usd_per_device_hour"):
        group_price(replace(g, device=replace(g.device, price_per_hour=None)))


def test_the_cost_goal_meets_the_floor_cheaper_than_the_fastest_plan(cluster, opt, fastest):
    tokens = opt.global_batch * opt.seq_len
    fast_usd = usd_per_hour(fastest.plan, cluster) * fastest.prediction.step_time_s / 3600
    floor = 0.4 * tokens / fastest.prediction.step_time_s
    r = plan(opt, cluster, PlanOptions(time_limit_s=12), goal=Goal("cost", min_tokens_per_s=floor))
    goal = r.plan.search.goal
    assert goal is not None
    assert tokens / r.prediction.step_time_s >= floor
    assert goal["usd_per_step"] == pytest.approx(usd_per_hour(r.plan, cluster) * r.prediction.step_time_s / 3600)
    assert goal["usd_per_step"] < fast_usd
    assert goal["devices"] == used_devices(r.plan, cluster)
    met = [t for t in goal["tried"] if t["why"] == "meets the goal"]
    assert met and min(t["usd_per_step"] for t in met) == pytest.approx(goal["usd_per_step"])
    assert all(t["tokens_per_s"] < floor for t in goal["tried"] if t["why"] == "below the floor")


def test_the_budget_goal_stays_within_the_budget(cluster, opt, fastest):
    budget = 0.5 * usd_per_hour(fastest.plan, cluster)
    r = plan(opt, cluster, PlanOptions(time_limit_s=12), goal=Goal("time", max_usd_per_hour=budget))
    assert usd_per_hour(r.plan, cluster) <= budget
    assert r.prediction.step_time_s >= fastest.prediction.step_time_s * 0.99


def test_an_unreachable_floor_is_one_line_with_the_fix(cluster, opt):
    with pytest.raises(PlannerError, match="even at its FLOP bound; fix: lower --min-throughput"):
        plan(opt, cluster, PlanOptions(time_limit_s=2), goal=Goal("cost", min_tokens_per_s=1e12))
    with pytest.raises(PlannerError, match="goal 'money'"):
        plan(opt, cluster, goal=Goal("money"))
    with pytest.raises(PlannerError, match="min_tokens_per_s -1"):
        plan(opt, cluster, goal=Goal("cost", min_tokens_per_s=-1))


def test_the_goal_needs_node_groups(opt):
    listing = load_cluster(Path(__file__).resolve().parents[2] / "hardware_profiles/clusters/cpu_uneven.yaml")
    with pytest.raises(PlannerError, match="lists meshes that are not whole nodes of one kind"):
        plan(opt, listing, goal=Goal("cost", min_tokens_per_s=1.0))
