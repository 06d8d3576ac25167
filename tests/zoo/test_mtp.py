"""DeepSeek-V3's multi-token-prediction module (``ModelConfig.mtp_layers``,
``zoo/configs/DeepSeek-V3-MTP.json``): read from the published config, counted, costed in the
head as one more MoE block, its projection and a second head pass, and a tiny version traced
and differentiated."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import zoo
from zoo import ZooError
from zoo.costing import body_cost
from zoo.model_files import load_model_file, resolve_model

CONFIGS = Path(__file__).resolve().parents[2] / "zoo" / "configs"


def test_the_published_config_has_one_module_and_deepseek_v3_none():
    mtp, base = resolve_model("deepseek-v3-mtp"), resolve_model("deepseek-v3")
    assert (mtp.mtp_layers, base.mtp_layers) == (1, 0)
    assert dataclasses.replace(mtp, mtp_layers=0, name=base.name,
                               source=base.source) == base


def test_mtp_parameters_against_the_published_685b():
    """Hugging Face deepseek-ai/DeepSeek-V3 README: 685B stored, 671B main model and 14B MTP
    module (which stores its own embedding and head copies; the zoo counts them once)."""
    mtp, base = resolve_model("deepseek-v3-mtp"), resolve_model("deepseek-v3")
    block = sum(s.size for s in zoo.layer_param_shapes(base, "block3").values())
    module = block + 2 * 7168 * 7168 + 3 * 7168           # the block, the projection, 3 norms
    assert zoo.param_count(mtp) - zoo.param_count(base) == module == 11_610_067_968
    stored = zoo.param_count(mtp) + 2 * mtp.vocab * mtp.hidden
    assert abs(stored - 685e9) / 685e9 < 0.001
    assert zoo.param_count(mtp, unique=False) - zoo.param_count(mtp) == mtp.vocab * mtp.hidden
    # the module's routed experts: 8 of 256 active, as in every MoE block
    assert (zoo.active_param_count(mtp) - zoo.active_param_count(base)
            == module - 248 * zoo.expert_param_count(mtp) // 256)


def test_the_head_costs_a_second_head_pass_and_one_more_moe_block():
    mtp = dataclasses.replace(resolve_model("deepseek-v3-mtp"), seq_len=512)
    base = dataclasses.replace(mtp, mtp_layers=0)
    head, plain, block = body_cost(mtp, "head"), body_cost(base, "head"), body_cost(base, "decoder_block")
    proj = 2.0 * 512 * 2 * 7168 * 7168
    want = 2 * plain.fwd_flops_per_sample + block.fwd_flops_per_sample + proj
    assert head.fwd_flops_per_sample == pytest.approx(want, rel=0.01)
    assert (head.experts, head.expert_param_count) == (256, block.expert_param_count)
    assert head.expert_fwd_flops_per_sample == block.expert_fwd_flops_per_sample
    assert head.attention_fwd_flops_per_sample == block.attention_fwd_flops_per_sample
    assert head.alltoall_bytes_per_sample == block.alltoall_bytes_per_sample
    assert plain.experts == 0 and plain.attention_fwd_flops_per_sample == 0
    w = zoo.workload(mtp, 8)
    assert w.layers[-2:] == ("decoder_block", "head") and len(w.layers) == 63


def test_tiny_mla_moe_with_mtp_traces_and_differentiates():
    """tiny-mla-moe with one MTP module: the loss is the main loss plus the module's (its
    prediction of the token after next), every module parameter gets a gradient."""
    cfg = dataclasses.replace(load_model_file(CONFIGS / "tiny-mla-moe.yaml"), mtp_layers=1)
    base = dataclasses.replace(cfg, mtp_layers=0)
    params = zoo.init_params(cfg, jax.random.PRNGKey(0))
    batch = zoo.example_batch(cfg, jax.random.PRNGKey(1), 2)
    loss, grads = jax.jit(jax.value_and_grad(zoo.forward_loss(cfg)))(params, batch)
    head = {k: v for k, v in params["head"].items() if k in ("norm", "out")}
    main = zoo.forward_loss(base)({**params, "head": head}, batch)
    assert jnp.isfinite(loss) and float(loss) > float(main) + 1.0   # two ~log(256) losses
    for k in ("mtp_proj", "mtp_w_gate", "mtp_wkv_b", "tok", "mtp_hnorm"):
        assert float(jnp.abs(grads["head"][k]).sum()) > 0, k


def test_mtp_is_refused_where_it_is_not_modelled():
    with pytest.raises(ZooError, match="mtp_layers = 1 is not 0 or 1 on a llama-family mixture"):
        zoo.get_config("llama-tiny", mtp_layers=1)
    doc = dict(load_model_file.__globals__["read_json"](CONFIGS / "DeepSeek-V3-MTP.json", "x"))
    from zoo.model_files import from_hf
    with pytest.raises(ZooError, match="num_nextn_predict_layers = 2"):
        from_hf({**doc, "num_nextn_predict_layers": 2}, "m", "m.json")
