"""Tests of the T5 v1.1 encoder (zoo/t5.py): published config and parameter count, relative
position buckets, the tiny encoder against a NumPy reference, and its costing."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

import zoo
from zoo import ZooError, costing
from zoo.t5 import position_bias, relative_bucket


def test_t5_xxl_encoder_is_the_published_config():
    # google/t5-v1_1-xxl config.json: d_model 4096, num_layers 24, num_heads 64, d_kv 64,
    # d_ff 10240 gated-gelu, vocab 32128, 32 buckets, max distance 128, eps 1e-6
    c = zoo.get_config("t5-xxl-encoder")
    assert (c.family, c.layers, c.hidden, c.heads, c.kv_heads, c.head_dim, c.ffn, c.vocab) == \
        ("t5", 24, 4096, 64, 64, 64, 10240, 32128)
    assert (c.relative_buckets, c.relative_max_distance, c.norm_eps, c.seq_len) == (32, 128, 1e-6, 256)
    assert (c.training, c.mlp, c.pos_emb, c.norm, c.bias, c.tie_embeddings) == \
        (False, "gelu", "relative", "rms", False, False)


def test_param_count_is_the_published_encoders():
    c = zoo.get_config("t5-xxl-encoder")
    h, inner, f = c.hidden, c.heads * c.head_dim, c.ffn
    block = 4 * h * inner + 3 * h * f + 2 * h            # q, k, v, o; wi_0, wi_1, wo; 2 RMSNorms
    expect = c.vocab * h + c.relative_buckets * c.heads + c.layers * block + h   # + final norm
    assert zoo.param_count(c) == expect == 4_762_310_656
    # published: 4.76B params, the Hugging Face safetensors of the encoder alone
    # (huggingface.co/lnyan/t5-v1_1-xxl-encoder); the Tenstorrent Mochi guide says 4.7B
    assert round(zoo.param_count(c) / 1e9, 2) == 4.76


def test_relative_buckets_hand_computed():
    # 32 buckets, max distance 128: n = 16 per side, exact = 8; |r| >= 8 goes to
    # 8 + floor(ln(|r|/8) / ln(16) * 8), at most 15; keys after the query add 16.
    # -20: 8 + floor(0.91629 / 2.77259 * 8 = 2.644) = 10; -50: 8 + floor(5.288) = 13;
    # 12: 16 + 8 + floor(1.170) = 25; +-200: ln(25)/ln(16)*8 = 9.29 -> 17, capped at 15
    rel = np.array([-200, -128, -50, -20, -8, -7, -1, 0, 1, 7, 8, 12, 200])
    want = [15, 15, 13, 10, 8, 7, 1, 0, 17, 23, 24, 25, 31]
    assert relative_bucket(rel, 32, 128).tolist() == want
    # the tiny encoder's 8 buckets, max distance 16: n = 4, exact = 2; 6 -> 2 + floor(ln 3 /
    # ln 8 * 2 = 1.057) = 3, 5 -> 2 + floor(0.881) = 2
    assert relative_bucket(np.arange(-7, 8), 8, 16).tolist() == \
        [3, 3, 2, 2, 2, 2, 1, 0, 5, 6, 6, 6, 6, 7, 7]


def test_position_bias_is_the_table_at_each_pairs_bucket():
    table = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)     # [buckets, heads]
    bias = np.asarray(position_bias(table, 5, 8, 16))
    assert bias.shape == (1, 3, 5, 5)
    b = np.asarray(relative_bucket(np.arange(5)[None, :] - np.arange(5)[:, None], 8, 16))
    for h in range(3):
        for i in range(5):
            for j in range(5):
                assert bias[0, h, i, j] == table[int(b[i, j]), h]


def _bucket64(r: int, n_buckets: int, max_dist: int) -> int:
    n, e = n_buckets // 2, n_buckets // 4
    base, r = (n if r > 0 else 0), abs(r)
    if r < e:
        return base + r
    return base + min(e + int(math.log(r / e) / math.log(max_dist / e) * (n - e)), n - 1)


def _reference(cfg, params, tokens):
    """The encoder in float64 NumPy, written from transformers' T5EncoderModel."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    S, H, d = tokens.shape[1], cfg.heads, cfg.head_dim

    def rms(x, w):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + cfg.norm_eps) * w

    def gelu_new(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))

    buckets = np.array([[_bucket64(j - i, cfg.relative_buckets, cfg.relative_max_distance)
                         for j in range(S)] for i in range(S)])
    bias = p["embed"]["rel_bias"][buckets].transpose(2, 0, 1)          # [H, S, S]
    x = p["embed"]["tok"][np.asarray(tokens)]
    for b in p["blocks"]:
        h = rms(x, b["attn_norm"])
        q, k, v = ((h @ b[w]).reshape(*h.shape[:2], H, d) for w in ("q", "k", "v"))
        s = np.einsum("bqhd,bkhd->bhqk", q, k) + bias
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + np.einsum("bhqk,bkhd->bqhd", a, v).reshape(x.shape) @ b["o"]
        h = rms(x, b["mlp_norm"])
        x = x + (gelu_new(h @ b["wi_0"]) * (h @ b["wi_1"])) @ b["wo"]
    return rms(x, p["head"]["final_norm"])


def test_tiny_encoder_runs_forward_and_matches_the_reference():
    cfg = zoo.get_config("t5-tiny-encoder")
    assert (cfg.hidden, cfg.seq_len) == (32, 8)      # what mochi-dit-tiny reads as text
    params = zoo.init_params(cfg, jax.random.PRNGKey(0))
    # larger weights than the 0.02 init, so attention and the bias matter
    params = jax.tree.map(lambda a: a * 20 if a.ndim == 2 else a, params)
    batch = zoo.example_batch(cfg, jax.random.PRNGKey(1), 2)
    out = jax.jit(zoo.forward(cfg))(params, batch)
    assert out.shape == (2, 8, 32) and out.dtype == np.float32
    np.testing.assert_allclose(np.asarray(out), _reference(cfg, params, batch["tokens"]),
                               rtol=1e-4, atol=1e-4)


def test_workload_is_traced_forward_only():
    cfg = zoo.get_config("t5-xxl-encoder")
    w = costing.workload("t5-xxl-encoder", 1)
    assert w.layers == ("embed", *["t5_block"] * 24, "head") and not w.training
    assert w.param_count == zoo.param_count(cfg) and w.seq_len == 256
    blk = w.costs["t5_block"]
    for c in w.costs.values():
        assert c.bwd_flops_per_sample == 0 and c.residual_bytes_per_sample == 0
    # 2 FLOP per weight per token, plus q k^T and (softmax) v: 4 S^2 (heads x head_dim)
    S, inner = cfg.seq_len, cfg.heads * cfg.head_dim
    analytic = 2 * S * (4 * cfg.hidden * inner + 3 * cfg.hidden * cfg.ffn) + 4 * S * S * inner
    assert blk.fwd_flops_per_sample == pytest.approx(analytic, rel=0.01)
    assert blk.activation_bytes_per_sample == S * cfg.hidden * 2          # x; the bias is fixed
    assert blk.tp_allreduce_bytes_per_sample == 2 * S * cfg.hidden * 2
    assert w.costs["head"].tp_allreduce_bytes_per_sample == 0
    tiny = costing.workload("t5-tiny-encoder", 2)
    assert tiny.layers == ("embed", "t5_block", "t5_block", "head")


@pytest.mark.parametrize("fields,match", [
    (dict(relative_buckets=7), "relative_buckets = 7 is not an even count"),
    (dict(relative_max_distance=8), "relative_max_distance = 8 is not above 8"),
    (dict(mlp="swiglu"), "mlp = 'swiglu' is not 'gelu'"),
    (dict(training=True), "training = True is true; the T5 encoder is modelled for inference"),
])
def test_bad_t5_configs_are_refused(fields, match):
    with pytest.raises(ZooError, match=match):
        zoo.get_config("t5-xxl-encoder", **fields)


def test_t5_fields_belong_to_t5():
    with pytest.raises(ZooError, match="relative_buckets = 32 applies to family t5 only"):
        zoo.get_config("llama-tiny", relative_buckets=32)
    with pytest.raises(ZooError, match="pos_emb = 'relative' is T5's relative position bias"):
        zoo.get_config("llama-tiny", pos_emb="relative")
