"""The planner on a mixture of experts: expert parallelism chosen where it pays."""

from __future__ import annotations

from pathlib import Path

import pytest

from hardware_profiles import load_cluster
from planner import PlanOptions, plan
from zoo.costing import workload
from zoo.model_files import load_model_file

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_qwen3_235b_on_512_h100_uses_expert_parallelism():
    """Slow (about 15 s): Qwen3-235B-A22B (128 experts, top 8) on 64 DGX H100 nodes. Without
    expert parallelism every data-parallel replica holds all 128 experts of its layers; the
    plan splits them over the data axis."""
    cfg = load_model_file(ROOT / "zoo" / "configs" / "Qwen3-235B-A22B.json")
    w = workload(cfg, 512, seq_len=4096)
    cluster = load_cluster(ROOT / "hardware_profiles" / "clusters" / "h100x512_nodes.yaml")
    result = plan(w, cluster, PlanOptions(time_limit_s=15))
    p = result.plan
    layouts = [p.layouts[m] for m in p.rank_mesh]
    assert any(lay.expert > 1 for lay in layouts)
    assert p.predicted["step_time_s"] > 0
