"""Gated DeltaNet (zoo/gated_deltanet.py) and Qwen3-Next: the chunked delta rule against the
token-by-token recurrence, the shipped Qwen3-Next config's counts, a tiny Qwen3-Next's forward
and backward, its costing as fused kernels, and the refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings, strategies as st

import zoo
from zoo import ZooError
from zoo.costing import HYBRID_BODY, body_cost, workload
from zoo.gated_deltanet import chunked_delta_rule, reference_delta_rule
from zoo.model_files import from_hf, resolve_model

TINY = {"model_type": "qwen3_next", "num_hidden_layers": 4, "hidden_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 96, "vocab_size": 128, "max_position_embeddings": 32,
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 16, "full_attention_interval": 2,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 8,
        "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6}
"""A Qwen3-Next at toy size: two Gated DeltaNet and two gated-attention layers."""


def _inputs(key, L, H=2, dk=4, dv=3):
    k = jax.random.split(key, 5)
    q = jax.random.normal(k[0], (2, H, L, dk))
    kk = jax.random.normal(k[1], (2, H, L, dk))
    kk = kk / jnp.linalg.norm(kk, axis=-1, keepdims=True)      # the mixer L2-normalises keys
    v = jax.random.normal(k[2], (2, H, L, dv))
    g = -jax.random.uniform(k[3], (2, H, L))
    beta = jax.random.uniform(k[4], (2, H, L))
    return q, kk, v, g, beta


@settings(max_examples=12, deadline=None)
@given(L=st.integers(1, 20), chunk=st.sampled_from([1, 2, 4, 8]), seed=st.integers(0, 99))
def test_the_chunked_rule_equals_the_recurrence(L, chunk, seed):
    args = _inputs(jax.random.PRNGKey(seed), L)
    assert jnp.allclose(chunked_delta_rule(*args, chunk), reference_delta_rule(*args), atol=1e-4)


def test_the_chunked_rule_has_the_recurrences_gradients():
    args = _inputs(jax.random.PRNGKey(3), 11)
    loss = (lambda f: lambda *a: jnp.sum(jnp.sin(f(*a))))
    g1 = jax.grad(loss(lambda *a: chunked_delta_rule(*a, 4)), argnums=(0, 1, 2, 3, 4))(*args)
    g2 = jax.grad(loss(reference_delta_rule), argnums=(0, 1, 2, 3, 4))(*args)
    for u, v in zip(g1, g2):
        assert jnp.allclose(u, v, atol=1e-3)


def test_qwen3_next_counts_match_the_model_card():
    """Qwen/Qwen3-Next-80B-A3B-Instruct: 80B parameters, 48 layers in 12 x (3 Gated DeltaNet
    + 1 gated attention), 512 experts of 512, 10 routed + 1 shared; the multi-token-prediction
    module is stored beside them (the 80B leaves it out)."""
    cfg = resolve_model("Qwen3-Next-80B-A3B")
    assert cfg.name == "Qwen3-Next-80B-A3B"
    bodies = [zoo.body_of(cfg, f"block{i}") for i in range(cfg.layers)]
    assert bodies[:4] == ["linear_block"] * 3 + ["decoder_block"]
    assert (bodies.count("linear_block"), bodies.count("decoder_block")) == (36, 12)
    assert (cfg.experts, cfg.experts_per_token, cfg.expert_ffn, cfg.shared_experts,
            cfg.mtp_layers) == (512, 10, 512, 1, 1)
    main = zoo.get_config(cfg, mtp_layers=0)
    assert zoo.param_count(main) == 79_674_385_152
    assert abs(zoo.param_count(main) - 80e9) / 80e9 < 0.01


@pytest.mark.parametrize("name,total,active", [("Qwen3.5_VL_35B_A3B", 35e9, 3),
                                               ("qwen35_vl_122b_a10b", 122e9, 10),
                                               ("Qwen3.5-397B-A17B", 397e9, 17)])
def test_qwen3_5_language_models_match_their_names(name, total, active):
    """Qwen3.5's MoE sizes (the model names' totals and A<n>B actives; their vision encoders of
    about 0.4B are not modelled): the language model without its multi-token-prediction module
    within 1.1% of the total, the active count rounding to the name's."""
    cfg = resolve_model(name)
    assert cfg.linear_attention and cfg.attention_output_gate and cfg.mtp_layers == 1
    main = zoo.get_config(cfg, mtp_layers=0)
    assert abs(zoo.param_count(main) - total) / total < 0.011
    assert round(zoo.active_param_count(main) / 1e9) == active


def test_tiny_qwen3_next_trains_forward_and_backward():
    cfg = from_hf(TINY, "tiny-qwen3-next", "tiny.json")
    params = zoo.init_params(cfg, jax.random.PRNGKey(0))
    batch = zoo.example_batch(cfg, jax.random.PRNGKey(1), 2)
    loss, grads = jax.jit(jax.value_and_grad(zoo.forward_loss(cfg)))(params, batch)
    assert jnp.isfinite(loss)
    for k in ("in_proj_qkvz", "in_proj_ba", "conv_w", "a_log", "dt_b", "gate_norm", "out_proj",
              "w_up", "ws_router"):
        assert float(jnp.abs(grads["blocks"][0][k]).sum()) > 0, k
    assert grads["blocks"][1]["wq"].shape == (64, 2 * 4 * 16)      # queries and their gate
    assert float(jnp.abs(grads["blocks"][1]["wq"]).sum()) > 0


def test_the_rule_is_costed_as_a_fused_kernel():
    """The Gated DeltaNet block's rule runs at the attention-kernel rate (its FLOP in the
    attention figures, all input gradient), its unfused chunk traffic is not charged, and the
    backward keeps about what an attention block keeps."""
    cfg = zoo.get_config(resolve_model("Qwen3-Next-80B-A3B"), seq_len=256)
    lin, att = body_cost(cfg, "linear_block"), body_cost(cfg, "decoder_block")
    assert 0 < lin.attention_fwd_flops_per_sample < 0.1 * lin.fwd_flops_per_sample
    assert lin.attention_bwd_flops_per_sample <= lin.bwd_input_flops_per_sample
    assert lin.fwd_other_bytes_per_sample < 1.5 * att.fwd_other_bytes_per_sample
    assert lin.residual_bytes_per_sample < 1.5 * att.residual_bytes_per_sample
    assert lin.fwd_ops < 2 * att.fwd_ops
    w = workload(cfg, 8)
    assert set(w.layers) == {"embed", HYBRID_BODY, "head"}
    assert w.costs[HYBRID_BODY].experts == 512


@pytest.mark.parametrize("change,match", [
    ({"linear_num_value_heads": 3}, "linear_num_value_heads = 3 is not a multiple of "
                                    "linear_num_key_heads = 2"),
    ({"full_attention_interval": 1}, "full_attention_interval = 1 is below 2"),
    ({"shared_expert_intermediate_size": 24}, "not a multiple of moe_intermediate_size = 16"),
])
def test_a_bad_qwen3_next_config_is_refused_in_one_line(change, match):
    with pytest.raises(ZooError, match=match) as e:
        from_hf({**TINY, **change}, "m", "m.json")
    assert "\n" not in str(e.value)
