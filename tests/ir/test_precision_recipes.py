"""Training precision recipes (``ir.precision``) and their round trip through a plan file."""

from __future__ import annotations

import pytest

from ir import IRError, PRECISIONS, RECIPES, plan_from_json, plan_to_json, recipe


def test_recipes_in_order_of_width():
    assert PRECISIONS == ("bf16", "fp8", "fp8-blockwise", "mxfp8", "nvfp4")
    assert [RECIPES[p].element_bytes for p in PRECISIONS] == [2.0, 1.0, 1.0, 1.0, 0.5]


def test_saved_bytes_count_the_scales():
    assert recipe("fp8").saved_bytes_per_element == 1.0            # one scale per tensor
    assert recipe("fp8-blockwise").saved_bytes_per_element == 1.0 + 4 / 128
    assert recipe("mxfp8").saved_bytes_per_element == 1.0 + 1 / 32
    assert recipe("nvfp4").saved_bytes_per_element == 0.5 + 1 / 16


def test_bf16_is_no_recipe_and_blank_is_bf16():
    assert recipe("") is RECIPES["bf16"]
    assert not recipe("bf16").low_precision
    assert all(recipe(p).low_precision for p in PRECISIONS[1:])


def test_unknown_recipe_is_one_line():
    with pytest.raises(IRError, match=r"^unknown precision 'fp6'; fix: use one of bf16, fp8, "
                                      r"fp8-blockwise, mxfp8, nvfp4$"):
        recipe("fp6")


def _plan_doc():
    from tests.planner.conftest import cluster, device, workload
    from planner import PlanOptions, plan

    w = workload(blocks=4, batch=8)
    cl = cluster([("a", device("a", 100.0, 80.0), 2), ("b", device("b", 100.0, 80.0), 2)])
    return plan_to_json(plan(w, cl, PlanOptions(time_limit_s=5)).plan)


def test_plan_file_carries_the_precision():
    doc = _plan_doc()
    assert "precision" not in doc                     # a BF16 plan's file is as before
    assert plan_from_json(doc).precision == "bf16"
    doc["precision"] = "fp8"
    assert plan_from_json(doc).precision == "fp8"
    assert plan_to_json(plan_from_json(doc))["precision"] == "fp8"
    doc["precision"] = "int3"
    with pytest.raises(IRError, match="plan precision 'int3' is not a known recipe"):
        plan_from_json(doc)


def test_blocks_kept_in_the_compute_dtype():
    """``keep_blocks_in_compute_dtype``: the first and last blocks run a copy of their body with
    ``low_precision`` off; embedding and head untouched; 0 and 0 is the same workload; covering
    every block is refused in one line."""
    from ir import keep_blocks_in_compute_dtype
    from tests.planner.conftest import workload

    w = workload(blocks=5, batch=8)
    assert keep_blocks_in_compute_dtype(w, 0, 0) is w
    body = w.layers[1]
    k = keep_blocks_in_compute_dtype(w, 1, 2)
    assert k.layers == (w.layers[0], body + "_bf16", body, body, body + "_bf16", body + "_bf16",
                        w.layers[-1])
    assert k.costs[body + "_bf16"].low_precision is False
    assert k.costs[body + "_bf16"].fwd_flops_per_sample == w.costs[body].fwd_flops_per_sample
    assert k.param_count == w.param_count
    with pytest.raises(IRError, match=r"^Workload '.*': 2 first and 3 last blocks in the compute "
                                      r"dtype leave none of its 5 blocks to the recipe; fix: keep "
                                      r"fewer than 5 blocks$"):
        keep_blocks_in_compute_dtype(w, 2, 3)


def test_plan_file_carries_the_loss():
    """A plan's ``cross_entropy`` (absent: fused) round-trips; an unknown one is one line."""
    doc = _plan_doc()
    assert "cross_entropy" not in doc and plan_from_json(doc).cross_entropy == "fused"
    doc["cross_entropy"] = "eager"
    assert plan_to_json(plan_from_json(doc))["cross_entropy"] == "eager"
    doc["cross_entropy"] = "triton"
    with pytest.raises(IRError, match=r"plan cross_entropy 'triton' is not known; fix: use one of "
                                      r"fused, fp32, eager"):
        plan_from_json(doc)
