"""Tests of simulator.pipeline_layout (Megatron-Core layout strings, the recipes' uneven split) and
of their use by the validation plans (simulator.validation_setup.build_plan)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from ir import LayerCost, Workload
from simulator import validate as V
from simulator.pipeline_layout import (LayoutError, StageLayers, check_layout, parse_layout,
                                       recipe_split, split_summary, split_text)
from simulator.validation_rows import ValidationError, parse_row
from tests.simulator.test_validation_rows import HEAD, bundled


def _blocks(text: str) -> list[int]:
    return [s.blocks for s in parse_layout(text)]


# --------------------------------------------------------------------------- parsing
def test_nvidia_deepseek_v3_h100_layout_parses_to_32_stages():
    """Megatron-Bridge's DeepSeek-V3 H100 layout (scripts/performance/configs/deepseek/
    deepseek_llm_pretrain.py at 08968b3): E and one block, 30 stages of two, MTP and loss."""
    stages = parse_layout("Et|(tt|)*30mL")
    assert len(stages) == 32
    assert stages[0] == StageLayers(True, 1, 0, False)
    assert all(s == StageLayers(False, 2, 0, False) for s in stages[1:31])
    assert stages[31] == StageLayers(False, 0, 1, True)
    assert check_layout(stages, "Et|(tt|)*30mL", 8, 61) == 4          # pp 8 x vp 4


def test_repetition_commas_and_single_character_counts():
    assert _blocks("Et*3|(t*4|)*14t*2mL") == [3] + [4] * 14 + [2]      # NeMo's pp 16 split
    assert _blocks("E,t,t|t,t,L") == [2, 2]                            # commas are cosmetic
    assert _blocks("E|(t|)*2L") == [0, 1, 1, 0]                        # E alone, L alone
    assert _blocks("Et|(tt|)*0tL") == [1, 1]                           # *0 repeats nothing
    assert parse_layout("  EtL ") == (StageLayers(True, 1, 0, True),)


@pytest.mark.parametrize("text, message", [
    ("Etx|L", "pipeline_layout 'Etx|L': 'x' is not a layer; fix: E embedding, t decoder block"),
    ("E tL", "pipeline_layout 'E tL': ' ' is not a layer; fix:"),
    ("Et|((t|)*2)*2L", "'(' is a repetition left over (nested or unbalanced parentheses"),
    ("Et|tt*|L", "'*' is a repetition left over"),
    ("(tt|)*2", "has 0 E and 0 L; fix: exactly one embedding E and one loss L"),
    ("Et|EtL", "has 2 E and 1 L; fix: exactly one embedding E and one loss L"),
    ("LtE", "must start with E (the embedding) and end with L (the loss); fix the layout"),
    ("EtmtL", "places a decoder block (t) after an MTP layer (m); fix: every m after every t"),
    ("EtL|", "stage 1 is empty; fix: give it a layer (t) or drop it and its '|'"),
    ("Et||tL", "stage 1 is empty"),
    ("Et|m|L", "stage 1 holds MTP (m) without the loss L; fix: put m in L's stage"),
    ("E(t|)*99999999L", "expands to over 65536 layers; fix the repetition counts"),
])
def test_malformed_layouts_are_refused_in_one_line(text, message):
    with pytest.raises(LayoutError) as e:
        parse_layout(text)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_layout_checked_against_pp_blocks_and_vp():
    stages = parse_layout("Et|(tt|)*30mL")
    with pytest.raises(LayoutError, match=r"has 32 stages, not a multiple of pp=6; fix the "
                                          r"layout \(pp x vp stages"):
        check_layout(stages, "Et|(tt|)*30mL", 6, 61)
    with pytest.raises(LayoutError, match=r"has 61 decoder blocks \(t\), the model has 62; fix"):
        check_layout(stages, "Et|(tt|)*30mL", 8, 62)
    with pytest.raises(LayoutError, match=r"has 32 stages = pp 8 x vp 4, but vp=2; fix vp"):
        check_layout(stages, "Et|(tt|)*30mL", 8, 61, vp=2)
    assert check_layout(stages, "Et|(tt|)*30mL", 16, 61, vp=2) == 2


# --------------------------------------------------------------------------- the recipes' split
def test_recipe_split_reproduces_the_recipes():
    # DeepSeek-V3 recipe's layout_map (recipes/deepseek/deepseek_v3.py at 08968b3)
    assert recipe_split(61, 4) == ((16, 16, 16, 13), "first stages full")
    assert recipe_split(61, 8) == ((8,) * 7 + (5,), "first stages full")
    assert recipe_split(61, 16) == ((4,) * 15 + (1,), "first stages full")
    # ... and its H100 performance layout Et|(tt|)*30mL
    assert recipe_split(61, 32)[0] == tuple(_blocks("Et|(tt|)*30mL"))
    # Qwen3-235B-A22B (account_for_embedding/loss_in_pipeline_split): 94 + 2 over 32
    assert recipe_split(94, 32) == ((2,) + (3,) * 30 + (2,), "embedding and loss counted")
    assert recipe_split(94, 16) == ((5,) + (6,) * 14 + (5,), "embedding and loss counted")
    assert recipe_split(22, 8) == ((2, 3, 3, 3, 3, 3, 3, 2), "embedding and loss counted")
    assert recipe_split(22, 24)[0] == (0,) + (1,) * 22 + (0,)          # E and L alone
    assert recipe_split(64, 64) == ((1,) * 64, "even")
    assert recipe_split(7, 1) == ((7,), "even")
    assert recipe_split(22, 16) == ((1,) * 5 + (2,) * 6 + (1,) * 5,
                                    "as even as possible, the extra blocks in the middle")


def test_split_summary_has_no_table_separator():
    assert split_summary((4,) * 15 + (1,)) == "4 x 15, 1"
    assert split_summary((2,) + (3,) * 30 + (2,)) == "2, 3 x 30, 2"
    assert split_summary((0, 1, 1, 0)) == "0, 1 x 2, 0"


def test_recipe_split_refuses_a_stage_without_a_layer():
    with pytest.raises(LayoutError, match=r"^61 decoder blocks cannot fill 64 pipeline stages \(each "
                                          r"stage but the first and last needs one\); fix: fewer "
                                          r"stages \(vp\), or give a pipeline_layout$"):
        recipe_split(61, 64)
    assert recipe_split(62, 64)[0] == (0,) + (1,) * 62 + (0,)


@settings(max_examples=300, deadline=None)
@given(stages=st.integers(1, 96), extra=st.integers(-2, 200))
def test_recipe_split_places_every_block_once_and_leaves_no_stage_empty(stages, extra):
    blocks = max(stages + extra, 0)
    try:
        counts, rule = recipe_split(blocks, stages)
    except LayoutError:
        assert blocks < stages - 2                       # refused only when it cannot fill them
        return
    assert len(counts) == stages and sum(counts) == blocks and min(counts) >= 0
    assert all(c >= 1 for c in counts[1:-1])             # only E's or L's stage may hold none
    if blocks % stages == 0:
        assert rule == "even" and len(set(counts)) == 1
    # as a layout string it parses back to the same stages, in order (E first, L last)
    text = split_text(counts)
    parsed = parse_layout(text)
    assert tuple(s.blocks for s in parsed) == counts
    assert parsed[0].embedding and parsed[-1].loss and check_layout(parsed, text, 1, blocks) == stages


# --------------------------------------------------------------------------- in the plans
def _lc(name: str, experts: int = 0) -> LayerCost:
    return LayerCost(name=name, fwd_flops_per_sample=1e9, bwd_flops_per_sample=2e9,
                     bwd_input_flops_per_sample=1e9, fwd_bytes_fixed=1e6, fwd_bytes_per_sample=1e6,
                     bwd_bytes_fixed=2e6, bwd_bytes_per_sample=2e6, param_count=1000,
                     param_bytes=2000.0, activation_bytes_per_sample=1e6,
                     residual_bytes_per_sample=1e7, tp_allreduce_bytes_per_sample=0.0,
                     experts=experts)


def _workload(row: V.Row, mtp: bool = False) -> Workload:
    costs = {"embed": _lc("embed"), "decoder_block": _lc("decoder_block", 8),
             "head": _lc("head", 8 if mtp else 0)}
    return Workload(model="fake-moe", layers=("embed",) + ("decoder_block",) * row.layers
                    + ("head",), costs=costs, seq_len=row.seq_len, global_batch=row.global_batch)


def _ds(**kw) -> V.Row:
    base = dict(source="x", model="ds", layers=61, hidden=7168, heads=128, seq_len=4096,
                vocab=None, device="h100-sxm", gpus=1024, tp=2, pp=16, dp=32, global_batch=8192,
                micro_batch=1, microbatches=None, schedule=None, metric="iteration_s",
                value=50.0, vp=1, model_config="deepseek-v3")
    base.update(kw)
    return V.Row(**base)


def _plan_blocks(plan) -> list[int]:
    S = len(plan.stages)
    return [st.last - st.first - (st.index == 0) - (st.index == S - 1) for st in plan.stages]


def test_deepseek_v3_pp16_rows_no_longer_leave_an_empty_stage():
    """61 blocks over 16 ranks: 4 chunks per rank split each rank's 3 or 4 blocks with a chunk
    of none on rank 14 ("plan stage 62 covers layers [62, 62)"); the recipes' split is used, and
    v 4 (64 stages) is no longer a candidate."""
    tuned = _ds(vp=None)
    assert V.virtual_stage_candidates(tuned) == [2]
    s = V.row_setup(tuned, _workload)
    assert s.virtual_stages == 2 and len(s.plan.stages) == 32
    assert _plan_blocks(s.plan) == [1] + [2] * 30 + [0]
    assert min(st.last - st.first for st in s.plan.stages) >= 1
    plain = V.row_setup(_ds(), _workload)
    assert _plan_blocks(plain.plan) == [4] * 15 + [1]
    assert ("blocks per stage 4 x 15, 1 (first stages full; no pipeline_layout)"
            in plain.assumptions)
    with pytest.raises(ValidationError, match=r"^row 0: 61 decoder blocks cannot fill 64 "):
        V.build_plan(_ds(vp=4), _workload(_ds()), schedule="interleaved-1f1b", micro_batch=1,
                     virtual_stages=4)


def test_a_published_layout_places_the_blocks_and_mtp_with_the_head():
    row = _ds(pp=8, dp=64, vp=4, pipeline_layout="Et|(tt|)*30mL")
    s = V.row_setup(row, lambda r: _workload(r, mtp=True))
    assert _plan_blocks(s.plan) == [1] + [2] * 30 + [0]
    assert s.plan.stages[-1].last - s.plan.stages[-1].first == 1       # the head (and MTP) alone
    assert [st.mesh for st in s.plan.stages[:9]] == [f"stage{k}" for k in range(8)] + ["stage0"]
    assert not any(a.startswith("blocks per stage") for a in s.assumptions)
    with pytest.raises(ValidationError, match=r"has MTP layer \(m\) but model fake-moe has none; "
                                              r"fix: name the model with MTP"):
        V.row_setup(row, _workload)
    no_m = dataclasses.replace(row, pipeline_layout="Et|(tt|)*30L")
    with pytest.raises(ValidationError, match=r"has no MTP layer \(m\) but model fake-moe has "
                                              r"MTP; fix: add m before L"):
        V.row_setup(no_m, lambda r: _workload(r, mtp=True))
    with pytest.raises(ValidationError, match=r"has 32 stages, the schedule runs 16 \(pp 8 x 2\)"):
        V.build_plan(row, _workload(row, mtp=True), schedule="interleaved-1f1b", micro_batch=1,
                     virtual_stages=2)


def test_csv_column_parses_checks_and_gives_vp(tmp_path):
    d = bundled(2, pipeline_layout="Ett|(ttt|)*6ttL")         # zb 1.5B: 22 layers, pp 8, 1f1b
    assert "pipeline_layout" in HEAD
    r = parse_row(d, 2, ["a100-80gb-sxm"])
    assert r.pipeline_layout == "Ett|(ttt|)*6ttL" and r.vp == 1
    inter = bundled(2, pipeline_layout="E|(tt|)*7(t|)*7tL", schedule="1f1b-interleaved")
    assert parse_row(inter, 2, ["a100-80gb-sxm"]).vp == 2
    with pytest.raises(ValidationError, match=r"^row 2: pipeline_layout 'Et\|\(ttt\|\)\*6ttL' has "
                                              r"21 decoder blocks \(t\), the model has 22; fix"):
        parse_row(bundled(2, pipeline_layout="Et|(ttt|)*6ttL"), 2, ["a100-80gb-sxm"])
    with pytest.raises(ValidationError, match=r"^row 2: pipeline_layout 'E\|\(tt\|\)\*7\(t\|\)\*7tL' "
                                              r"has 16 stages = pp 8 x vp 2, but vp=3"):
        parse_row(dict(inter, vp="3"), 2, ["a100-80gb-sxm"])
    with pytest.raises(ValidationError, match=r"^row 2: vp=2 but schedule 1f1b runs 1 stage per "
                                              r"rank"):
        parse_row(dict(inter, schedule="1f1b"), 2, ["a100-80gb-sxm"])
    with pytest.raises(ValidationError, match=r"^row 2: pipeline_layout 'Etq\|L': 'q' is not a layer"):
        parse_row(bundled(2, pipeline_layout="Etq|L"), 2, ["a100-80gb-sxm"])


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(1, 6), vp=st.integers(1, 3), data=st.data())
def test_a_layout_places_every_block_once_in_order_as_it_says(pp, vp, data):
    if pp == 1:
        vp = 1
    S = pp * vp
    counts = [data.draw(st.integers(0 if s in (0, S - 1) else 1, 4)) for s in range(S)]
    blocks = sum(counts)
    if blocks == 0:
        counts[0] = blocks = 1
    text = split_text(tuple(counts))
    row = _ds(layers=blocks, pp=pp, dp=1, tp=1, gpus=pp, global_batch=4 * pp, vp=vp,
              schedule="1f1b-interleaved" if vp > 1 else "1f1b", pipeline_layout=text)
    plan = V.row_setup(row, _workload).plan
    assert [st.first for st in plan.stages] == [0] + [st.last for st in plan.stages[:-1]]
    assert plan.stages[0].first == 0 and plan.stages[-1].last == blocks + 2
    assert _plan_blocks(plan) == counts
    assert [st.mesh for st in plan.stages] == [f"stage{s % pp}" for s in range(S)]
