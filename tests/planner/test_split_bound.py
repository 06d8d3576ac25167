"""Lower bounds on heterogeneous data-parallel splits: the min-max over batch shares against brute
force, and each part's bound against the plans its search finds."""

from __future__ import annotations

import math
from dataclasses import replace
from itertools import product
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zoo.costing import workload
from hardware_profiles import load_cluster
from planner import PlanOptions
from planner.bounds import work_bound
from planner.budget import Budget
from planner.shapes import search_pipeline
from planner.split_bound import PartBound, _level, split_bound


class _Table:
    """A part whose bounds are a table, all exact (what :func:`split_bound` asks of a part)."""

    def __init__(self, q: int, values: list[float]):
        self.vals = {q * (u + 1): v for u, v in enumerate(values)}
        self.exact = set(self.vals)

    def value(self, b: int) -> float:
        return self.vals[b]

    def at_least(self, b: int, level: float, budget: Budget) -> float:
        return self.vals[b]


def test_level_is_the_least_slowest_part_over_whole_granules():
    # 4 granules: (3, 1) gives max(3, 2) = 3; (2, 2) gives 4; (1, 3) gives 6
    t, got = _level([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]], 4)
    assert t == 3.0 and got == [3, 1]
    # a bound that falls with the share is read through its envelope (never above the table)
    t, got = _level([[5.0, 1.0, 9.0], [2.0, 4.0, 6.0]], 3)
    assert t == 2.0 and got == [2, 1]
    assert _level([[1.0], [math.inf]], 2)[0] == math.inf


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.floats(0.1, 50.0), min_size=6, max_size=6), min_size=2, max_size=3),
       st.floats(0.0, 2.0), st.booleans())
def test_split_bound_is_below_every_split_and_exact_when_bounds_grow_with_the_share(rows, sync, grow):
    """Against every split of the batch into whole granules (each part at least one)."""
    q, k = 8, len(rows)
    units = 6 + k - 1
    if grow:
        rows = [sorted(r) for r in rows]
    parts = [_Table(q, r) for r in rows]
    got = split_bound(parts, units * q, q, sync, Budget(math.inf, math.inf))
    brute = min(max(rows[p][u - 1] for p, u in enumerate(combo)) + sync
                for combo in product(range(1, 7), repeat=k) if sum(combo) == units)
    assert got <= brute + 1e-12
    if grow:
        assert got == pytest.approx(brute, rel=1e-12)


def test_split_bound_stops_at_its_cap():
    parts = [_Table(8, [1.0, 2.0, 3.0]), _Table(8, [2.0, 4.0, 6.0])]
    endless = Budget(math.inf, math.inf)
    assert split_bound(parts, 32, 8, 0.5, endless, cap=1.0) == pytest.approx(3.5)
    assert split_bound(parts, 32, 8, 0.5, endless) == pytest.approx(3.5)


ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def two_kinds(tmp_path_factory):
    p = tmp_path_factory.mktemp("split") / "two.yaml"
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
    return load_cluster(p)


@pytest.mark.parametrize("groups,graph", [(("a100",), False), (("h100", "a100"), False),
                                          (("h100", "a100"), True)])
def test_a_parts_bound_is_below_the_plan_its_search_finds_at_every_share(two_kinds, groups, graph):
    w = workload("llama3-8b", 64, 4096)
    opts = PlanOptions(time_limit_s=30)
    part, endless = PartBound(w, two_kinds, groups, opts), Budget(math.inf, math.inf)
    part.graph = graph
    assert part.per_sample == pytest.approx(work_bound(replace(w, global_batch=1), two_kinds, groups))
    for b in (16, 32, 48):
        exact = part.at_least(b, math.inf, endless)
        assert b in part.exact
        # exact: the least full (or dependence-graph) bound of every candidate, never below the
        # work bound
        e = part.enumeration(b, endless)
        assert exact == min(c.bound_s for c in e.items)
        assert bool(e.graphed) == graph
        assert exact >= part.per_sample * b
        r = search_pipeline(replace(w, global_batch=b), two_kinds, groups, opts, deadline=math.inf,
                            budget=Budget(3.0, math.inf), graph_bounds=False)
        assert r.prediction is not None and exact <= r.prediction.step_time_s
        # asked again below what is known, no work is done and the answer stands
        assert part.at_least(b, 0.0, endless) == exact
