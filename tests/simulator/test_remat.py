"""Tests of simulator.remat: MaxText's remat policy names, their fractions and costing, host offload."""

from __future__ import annotations

import pytest

from simulator import remat as R

# MaxText's 16B / 32B synthetic model layer (global_parameter_scale; the v5e / v5p CSV rows)
L = R.LayerShape(hidden=8192, heads=64, kv_heads=64, head_dim=128, ffn=28672, glu=True,
                 seq_len=2048)
F = L.flops()
TOTAL = sum(F.values())

MAXTEXT = ("minimal", "minimal_with_context", "minimal_flash", "save_dot_with_context_except_mlp",
           "save_dot_except_mlpwi", "save_dot_except_mlp", "save_qkv_proj", "save_out_proj",
           "qkv_proj_offloaded", "minimal_offloaded", "custom", "full")


def test_every_maxtext_name_maps_to_a_policy():
    # plus torchtitan's op-level and layer-wise policies, charged by validation_setup, not by parts
    assert set(MAXTEXT) | {"none", "selective", "op", "layer"} == set(R.NAMES)
    for name in MAXTEXT:
        p = R.policy(name, L)
        assert p.name == name and p.cost_model in R.COST_MODEL
        assert 0.0 <= p.recompute_fraction <= 1.0 and 0.0 < p.saved_fraction <= 1.0
        assert p.costed_as.startswith(f"remat {name}") and "\n" not in p.costed_as


def test_full_and_none_are_exact():
    full, none = R.policy("full", L), R.policy("none", L)
    assert full.recompute_fraction == 1.0 and full.cost_model == "full"
    assert none.recompute_fraction == 0.0 and none.cost_model == "none"
    assert none.saved_fraction == 1.0 and none.offload_bytes_fraction == 0.0
    e = L.elements()
    assert full.saved_fraction == e["input"] / sum(e.values())
    assert R.policy("custom", L).recompute_fraction == 1.0      # base.yml: every tensor 'remat'


def test_names_are_case_insensitive():
    assert R.policy("Save_QKV_Proj", L) == R.policy("save_qkv_proj", L)
    assert R.policy(" FULL ", L).name == "full"


def test_fractions_follow_what_each_policy_saves():
    def frac(*parts):
        return sum(F[p] for p in parts) / TOTAL

    # minimal keeps every weight matmul's output: only the attention core is rerun, = selective
    assert R.policy("minimal", L).recompute_fraction == frac("context")
    assert R.policy("minimal", L).cost_model == "selective"
    assert R.policy("selective", L).recompute_fraction == frac("context")
    assert R.policy("minimal_with_context", L).recompute_fraction == 0.0
    assert R.policy("save_dot_with_context_except_mlp", L).recompute_fraction == frac("mlpwi", "mlpwo")
    assert R.policy("save_dot_except_mlp", L).recompute_fraction == frac("context", "mlpwi", "mlpwo")
    assert R.policy("save_dot_except_mlpwi", L).recompute_fraction == frac("context", "mlpwi")
    assert R.policy("save_qkv_proj", L).recompute_fraction == frac("context", "out_proj", "mlpwi",
                                                                   "mlpwo")
    assert R.policy("save_out_proj", L).recompute_fraction == frac("qkv", "context", "mlpwi", "mlpwo")
    assert R.policy("save_qkv_proj", L).cost_model == "full"
    assert "costed as full recompute" in R.policy("save_qkv_proj", L).costed_as
    # this layer: attention core 4 s H d = 67.1 M of 2013 M FLOP per token
    assert F["context"] == 4.0 * 2048 * 64 * 128 and TOTAL == 2013265920.0


def test_offloading_policies_move_their_bytes_to_host():
    q = R.policy("qkv_proj_offloaded", L)
    assert q.offload_bytes_per_token == (64 + 2 * 64) * 128 * 2 and q.cost_model == "full"
    m = R.policy("minimal_offloaded", L)
    assert m.offload_bytes_per_token == (3 * 8192 + 2 * 28672 + 8192 + 8192) * 2
    assert m.cost_model == "selective" and "offloads qkv, out_proj, mlpwi, mlpwo to host" in m.costed_as
    e = L.elements()
    moved = e["qkv"] + e["out_proj"] + e["mlpwi"] + e["mlpwo"]
    assert m.offload_bytes_fraction == moved / sum(e.values())
    # out in the forward, back in the backward: 2 x bytes x tokens x layers / bandwidth
    t = R.offload_seconds(q, tokens_per_device=6 * 2048, layers_per_device=32, device="tpu-v5e")
    assert t == 2.0 * (192 * 128 * 2) * 6 * 2048 * 32 / 1.5e10
    assert R.offload_seconds(R.policy("full", L), 6 * 2048, 32, "b200") == 0.0


def test_host_links_and_unknowns_fail_in_one_line():
    assert R.host_link("h100-sxm") == 64e9 and R.host_link("a100-80gb-sxm") == 32e9
    assert R.host_link("tpu-v5p") == 1.5e10
    with pytest.raises(R.RematError, match=r"no host-link bandwidth for device 'b200'"):
        R.offload_seconds(R.policy("minimal_offloaded", L), 1.0, 1, "b200")
    with pytest.raises(R.RematError, match=r"recompute 'bogus_policy' unknown; fix: use one of "
                                           r"none, selective, full, minimal, "):
        R.policy("bogus_policy", L)
