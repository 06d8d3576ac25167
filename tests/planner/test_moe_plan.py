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
    assert p.predicted is not None and p.predicted.step_time_s > 0


def test_deepseek_v3_published_layout_replays_with_expert_parallel_64():
    """DeepSeek-V3's own layout (PP16 x EP64 x ZeRO-1 DP128, no TP; DeepSeek-V3 Technical Report,
    Sec. 3.2) on 2,048 GPUs as a hand layout: every stage mesh splits the experts 64 ways, and
    in the model it fits only with recomputation (DeepSeek recomputes selectively and keeps
    activations in FP8, neither of which the model expresses)."""
    from planner.baseline import HandLayout, hand_plan

    cfg = load_model_file(ROOT / "zoo" / "configs" / "DeepSeek-V3.json")
    w = workload(cfg, 15360, seq_len=4096)
    cluster = load_cluster(ROOT / "hardware_profiles" / "clusters" / "h100x2048_nodes.yaml")
    plain = hand_plan(w, cluster, HandLayout(tensor=1, pipeline=16, data=128, expert=64))
    full = hand_plan(w, cluster, HandLayout(tensor=1, pipeline=16, data=128, expert=64,
                                            recompute="full"))
    assert len(plain.plan.stages) == 16
    assert {str(lay) for lay in plain.plan.layouts.values()} == {"dp128xtp1-ep64"}
    assert plain.label == "tp1 pp16 dp128 mb1 1f1b ep64"
    assert not plain.prediction.fits and full.prediction.fits
    assert full.prediction.step_time_s > plain.prediction.step_time_s
    # in two hops, as DeepSeek dispatched (DeepEP): no all-to-all dispatcher's host read-back
    two_hop = hand_plan(w, cluster, HandLayout(tensor=1, pipeline=16, data=128, expert=64,
                                               recompute="full", expert_dispatch="deepep"))
    assert {str(lay) for lay in two_hop.plan.layouts.values()} == {"dp128xtp1-ep64-deepep"}
    assert two_hop.label == "tp1 pp16 dp128 mb1 1f1b ep64 deepep full recompute"
    assert two_hop.prediction.step_time_s < full.prediction.step_time_s
