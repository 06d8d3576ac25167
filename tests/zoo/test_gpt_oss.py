"""gpt-oss in the zoo (``zoo/configs/gpt-oss-120b.json``): its published parameter counts,
sliding-window attention on alternate layers costed by its window, attention sinks, the
router's and experts' biases and the clamped SwiGLU, and a tiny version's forward and backward
against a per-token reference."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest

import zoo
from ir.workload import causal_fraction
from zoo import ZooError
from zoo.costing import body_cost, mean_cost, window_fraction, workload
from zoo.layers import attention
from zoo.model_files import from_hf, resolve_model

TINY = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 64,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2,
        "intermediate_size": 32, "sliding_window": 8, "swiglu_limit": 7.0,
        "attention_bias": True, "max_position_embeddings": 32, "rope_theta": 150000,
        "layer_types": ["sliding_attention", "full_attention"] * 2}


def _tiny(**kw):
    return dataclasses.replace(from_hf(TINY, "tiny-gpt-oss", "test"), dtype="float32",
                               capacity_factor=2.0, **kw)


def test_gpt_oss_120b_parameters_match_the_model_card():
    """OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv:2508.10925), Table 1: MLP
    114.71B, attention 0.96B, embed + unembed 1.16B, 116.83B in total, 5.13B active
    (unembedding counted, embedding not)."""
    cfg = resolve_model("gpt-oss-120b")
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.vocab) == (
        36, 2880, 64, 8, 64, 201088)
    assert (cfg.experts, cfg.experts_per_token, cfg.expert_ffn, cfg.bias) == (128, 4, 2880, True)
    assert (cfg.sliding_window, cfg.full_attention_every, cfg.attention_sinks,
            cfg.swiglu_limit) == (128, 2, True, 7.0)
    assert zoo.param_count(cfg) == 116_829_156_672
    assert round(zoo.param_count(cfg) / 1e7) == 11683
    assert round(zoo.active_param_count(cfg, embedding=False) / 1e7) == 513
    block = zoo.layer_param_shapes(cfg, "block0")
    attn = sum(math.prod(s.shape) for k, s in block.items() if k in ("wq", "wk", "wv", "wo", "wq_b", "wk_b", "wv_b", "wo_b", "sinks"))
    mlp = sum(math.prod(s.shape) for k, s in block.items() if k.startswith(("w_router", "w_gate", "w_up", "w_down")))
    assert round(36 * mlp / 1e7) == 11471 and round(36 * attn / 1e7) == 96
    assert zoo.expert_param_count(cfg) == 128 * (3 * 2880 * 2880 + 2 * 2880 + 2880)


def test_alternate_layers_slide():
    cfg = resolve_model("gpt-oss-120b")
    assert [zoo.body_of(cfg, f"block{i}") for i in range(4)] == [
        "sliding_block", "decoder_block"] * 2
    assert [cfg.layer_window(i) for i in range(3)] == [128, 0, 128]


def test_window_fraction_counts_the_tiles_in_the_band():
    assert window_fraction(4096, 128) == (2 * 32 - 1) / 32**2
    assert window_fraction(4096, 4096) == causal_fraction(4096)
    assert window_fraction(100, 8) == 1.0          # one tile
    assert window_fraction(512, 129) == (1 + 2 + 2 + 2) / 16   # query 256 sees keys 128..256
    assert window_fraction(512, 130) == (1 + 2 + 3 + 3) / 16   # and 127: a third tile
    with pytest.raises(ZooError, match="window=0"):
        window_fraction(128, 0)


def test_a_sliding_layer_costs_its_window_not_the_causal_sequence():
    """At 4,096 tokens the sliding layer's attention core computes the 63 of 1,024 score tiles
    in its band (about seq x 2 x 128 scores per head), the full layer 528; the rest of the
    two layers is the same, and the planner's workload costs each block as their mean."""
    cfg = dataclasses.replace(resolve_model("gpt-oss-120b"), seq_len=4096)
    slide, full = body_cost(cfg, "sliding_block"), body_cost(cfg, "decoder_block")
    core = 4.0 * 4096 * 4096 * 64 * 64            # Q K^T and P V over every score, per sample
    # the traced core also counts the softmax's elementwise FLOP (under 3% of the matmuls')
    assert slide.attention_fwd_flops_per_sample == pytest.approx(core * 63 / 1024, rel=0.03)
    assert (slide.attention_fwd_flops_per_sample / full.attention_fwd_flops_per_sample
            == pytest.approx((63 / 1024) / (33 / 64), rel=1e-9))
    assert (slide.attention_bwd_flops_per_sample / full.attention_bwd_flops_per_sample
            == pytest.approx((63 / 1024) / (33 / 64), rel=1e-9))
    rest = lambda c: c.fwd_flops_per_sample - c.attention_fwd_flops_per_sample
    assert rest(slide) == pytest.approx(rest(full), rel=1e-6)
    assert slide.param_count == full.param_count and slide.experts == 128
    w = workload(cfg, 8)
    assert w.layers == ("embed",) + ("decoder_block",) * 36 + ("head",)
    mean = w.costs["decoder_block"]
    assert mean.fwd_flops_per_sample == pytest.approx(
        (slide.fwd_flops_per_sample + full.fwd_flops_per_sample) / 2)
    assert mean.expert_param_count == slide.expert_param_count
    own = workload(cfg, 8, per_layer=True)
    assert own.layers[1:5] == ("sliding_block", "decoder_block") * 2
    assert sum(own.layer(i).fwd_flops_per_sample for i in range(1, 37)) == pytest.approx(
        sum(w.layer(i).fwd_flops_per_sample for i in range(1, 37)))


def test_mean_cost_refuses_bodies_with_different_weights():
    cfg = dataclasses.replace(resolve_model("gpt-oss-120b"), seq_len=256)
    head, block = body_cost(cfg, "head"), body_cost(cfg, "decoder_block")
    with pytest.raises(ZooError, match="hold different parameters"):
        mean_cost([(head, 1), (block, 1)], "x")


def _reference_attention(q, k, v, window, sinks):
    """Each query's softmax over its visible keys and its head's sink, one by one."""
    B, S, H, D = q.shape
    rep = H // k.shape[2]
    k, v = jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2)
    s = jnp.einsum("bshd,bthd->bhst", q, k) / math.sqrt(D)
    i, j = jnp.arange(S)[:, None], jnp.arange(S)[None, :]
    seen = (j <= i) & ((i - j < window) if window else True)
    s = jnp.where(seen, s, -jnp.inf)
    z = jnp.exp(s - s.max(-1, keepdims=True))
    sink = jnp.exp(sinks[None, :, None] - s.max(-1))
    p = z / (z.sum(-1) + sink)[..., None]
    return jnp.einsum("bhst,bthd->bshd", p, v)


@pytest.mark.parametrize("impl", ["plain", "flash"])
@pytest.mark.parametrize("window", [0, 3])
def test_attention_with_sinks_and_a_window_matches_the_reference_with_gradients(impl, window):
    ks = jax.random.split(jax.random.PRNGKey(0), 4)
    q = jax.random.normal(ks[0], (2, 10, 4, 8))
    k = jax.random.normal(ks[1], (2, 10, 2, 8))
    v = jax.random.normal(ks[2], (2, 10, 2, 8))
    sinks = jax.random.normal(ks[3], (4,))
    ours = lambda *a: attention(*a[:3], causal=True, impl=impl, window=window, sinks=a[3])
    ref = lambda *a: _reference_attention(*a[:3], window, a[3])
    assert jnp.allclose(ours(q, k, v, sinks), ref(q, k, v, sinks), atol=1e-5)
    loss = lambda f: (lambda *a: jnp.sum(jnp.sin(f(*a))))
    g1 = jax.grad(loss(ours), argnums=(0, 1, 2, 3))(q, k, v, sinks)
    g2 = jax.grad(loss(ref), argnums=(0, 1, 2, 3))(q, k, v, sinks)
    for a, b in zip(g1, g2):
        assert jnp.allclose(a, b, atol=1e-4), float(jnp.abs(a - b).max())


def test_the_clamped_swiglu_is_gpt_oss():
    from zoo.layers import glu
    g = jnp.asarray([-8.0, 0.5, 9.0])
    u = jnp.asarray([-9.0, 1.0, 3.0])
    gc = jnp.minimum(g, 7.0)
    want = gc * jax.nn.sigmoid(1.702 * gc) * (jnp.clip(u, -7.0, 7.0) + 1)
    assert jnp.allclose(glu(g, u, 7.0), want) and jnp.allclose(glu(g, u), jax.nn.silu(g) * u)


def test_tiny_gpt_oss_trains_forward_and_backward():
    """The tiny gpt-oss (4 layers, 4 experts top 2, window 8 of 32 tokens, sinks, biases):
    a finite loss and a gradient for every parameter, the sinks' and the expert biases'
    included; a sliding block's output differs from the same block attending in full."""
    cfg = _tiny()
    assert cfg.seq_len == 32 and zoo.body_of(cfg, "block0") == "sliding_block"
    params = zoo.init_params(cfg, jax.random.PRNGKey(0))
    params = jax.tree.map(lambda a: a + 0.05 * jax.random.normal(jax.random.PRNGKey(1), a.shape),
                          params)                                 # biases and sinks not zero
    batch = zoo.example_batch(cfg, jax.random.PRNGKey(2), 2)
    loss, grads = jax.jit(jax.value_and_grad(zoo.forward_loss(cfg)))(params, batch)
    assert jnp.isfinite(loss)
    b0 = grads["blocks"][0]
    for k in ("sinks", "w_router_b", "w_gate_b", "w_up_b", "w_down_b", "wq_b"):
        assert float(jnp.abs(b0[k]).sum()) > 0, k
    fns = zoo.layer_fns(cfg)
    x = jax.random.normal(jax.random.PRNGKey(3), (1, 32, 64))
    slide = fns["block0"](params["blocks"][0], x)
    full = fns["block1"](params["blocks"][0], x)
    assert jnp.allclose(slide[:, :8], full[:, :8], atol=1e-5)     # within the window: the same
    assert not jnp.allclose(slide[:, 8:], full[:, 8:], atol=1e-3)


def test_layer_types_must_be_periodic():
    with pytest.raises(ZooError, match="is not one full-attention layer every 2"):
        from_hf({**TINY, "layer_types": ["sliding_attention", "full_attention",
                                         "full_attention", "sliding_attention"]}, "m", "m.json")
    with pytest.raises(ZooError, match="full_attention_every = 2 is set but sliding_window = 0"):
        zoo.get_config("llama-tiny", full_attention_every=2)
