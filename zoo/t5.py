"""The T5 v1.1 encoder (Raffel et al. 2020; T5 v1.1 / google/t5-v1_1-xxl), inference only: the
text encoder of Mochi 1 (Genmo 2024: ``T5-XXL``, 256 tokens).

Architecture after Hugging Face transformers' ``T5EncoderModel`` (``modeling_t5.py``) with the
published ``google/t5-v1_1-xxl`` config (``zoo.config``'s ``t5-xxl-encoder`` cites it):

* a token embedding ``[vocab, h]`` (no scaling, no absolute positions);
* blocks of: RMSNorm without mean or bias (T5LayerNorm) -> multi-head self-attention, not
  causal, with no ``1/sqrt(d)`` scaling of the scores (T5 folds it into the initialisation) and
  a learned relative position bias added to the scores -> residual; RMSNorm -> gated-GELU MLP
  ``(gelu_new(h W_i0) * (h W_i1)) W_o`` (``feed_forward_proj`` ``gated-gelu``, ``gelu_new`` the
  tanh approximation) -> residual; no biases anywhere;
* a final RMSNorm; its output ``[B, S, h]`` is what the DiT reads as ``text``.

The relative position bias: each (query i, key j) pair falls into one of
``relative_buckets`` buckets of ``j - i`` (:func:`relative_bucket`, bidirectional), and a table
``[buckets, heads]`` gives each head's bias. transformers keeps that table in block 0's attention
(``has_relative_attention_bias``) and hands the computed bias ``[1, H, S, S]`` to every later
block; here the embedding layer holds the table (the same ``buckets x heads`` parameters), computes
the bias once and passes it along with ``x``, so all blocks are one fragment body.

Layer functions (``B`` texts of ``S`` tokens, width ``h``, ``H`` heads):
    embed ``(params, {"tokens": int32 [B,S]}) -> (x [B,S,h], bias [1,H,S,S])``;
    block ``(params, (x, bias)) -> (x, bias)``;
    head  ``(params, (x, bias)) -> hidden states [B,S,h]`` (the final RMSNorm).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from zoo.config import ModelConfig
from zoo.layers import rms_norm

__all__ = ["batch_shapes", "embed_shapes", "block_shapes", "head_shapes", "relative_bucket",
           "position_bias", "embed_fn", "block_fn", "head_fn", "BLOCK"]

BLOCK = "t5_block"
"""The fragment body of every encoder block."""


def batch_shapes(cfg: ModelConfig, batch: int, seq_len: int | None = None
                 ) -> dict[str, jax.ShapeDtypeStruct]:
    """``{"tokens": int32 [batch, seq_len or cfg.seq_len]}``."""
    return {"tokens": jax.ShapeDtypeStruct((batch, seq_len or cfg.seq_len), jnp.int32)}


def embed_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The token embedding and the relative position bias table."""
    return {"tok": (cfg.vocab, cfg.hidden), "rel_bias": (cfg.relative_buckets, cfg.heads)}


def block_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """One encoder block: two RMSNorm weights, q/k/v/o (``heads x head_dim`` inner width) and
    the gated-GELU MLP (``wi_0``, ``wi_1``: ``h x ffn``; ``wo``: ``ffn x h``)."""
    h, inner, f = cfg.hidden, cfg.heads * cfg.head_dim, cfg.ffn
    return {"attn_norm": (h,), "q": (h, inner), "k": (h, inner), "v": (h, inner),
            "o": (inner, h), "mlp_norm": (h,), "wi_0": (h, f), "wi_1": (h, f), "wo": (f, h)}


def head_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The final RMSNorm."""
    return {"final_norm": (cfg.hidden,)}


def relative_bucket(relative_position: np.ndarray | jax.Array, num_buckets: int,
                    max_distance: int) -> jax.Array:
    """T5's bidirectional relative position buckets (transformers
    ``T5Attention._relative_position_bucket`` with ``bidirectional=True``).

    Args:
        relative_position: ``key - query`` positions (integers, any shape).
        num_buckets: buckets in all (half for keys before the query, half after).
        max_distance: distance from which every position shares the last bucket of its side.
    Returns: int32 buckets in ``[0, num_buckets)``, the shape of ``relative_position``: with
        ``n = num_buckets // 2`` and ``e = n // 2``, keys after the query add ``n``; distances
        ``|r| < e`` have their own bucket ``|r|``; larger ones share logarithmically spaced
        buckets ``e + floor(log(|r| / e) / log(max_distance / e) * (n - e))``, at most ``n - 1``.
    """
    rp = jnp.asarray(relative_position, jnp.int32)
    n = num_buckets // 2
    buckets = (rp > 0).astype(jnp.int32) * n
    rp = jnp.abs(rp)
    exact = n // 2
    scaled = (jnp.log(jnp.maximum(rp, 1).astype(jnp.float32) / exact)
              / math.log(max_distance / exact) * (n - exact))
    large = jnp.minimum(exact + scaled.astype(jnp.int32), n - 1)
    return buckets + jnp.where(rp < exact, rp, large)


def position_bias(table: jax.Array, seq: int, num_buckets: int, max_distance: int) -> jax.Array:
    """The additive attention bias ``[1, H, seq, seq]`` of a ``[num_buckets, H]`` table:
    ``bias[0, h, i, j] = table[bucket(j - i), h]`` (transformers ``T5Attention.compute_bias``)."""
    pos = np.arange(seq)
    buckets = relative_bucket(pos[None, :] - pos[:, None], num_buckets, max_distance)
    return jnp.transpose(table[buckets], (2, 0, 1))[None]


def embed_fn(cfg: ModelConfig):
    def embed(p: dict, batch: dict):
        tokens = batch["tokens"]
        x = p["tok"][tokens]
        bias = position_bias(p["rel_bias"], tokens.shape[1], cfg.relative_buckets,
                             cfg.relative_max_distance)
        return x, bias.astype(x.dtype)
    return embed


def _attention(q: jax.Array, k: jax.Array, v: jax.Array, bias: jax.Array) -> jax.Array:
    """T5 attention core: ``softmax(q k^T + bias) v`` per head, no scaling, softmax in float32
    (q, k, v ``[B,S,H,d]``, bias ``[1,H,S,S]``) -> ``[B,S,H,d]``."""
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) + bias
    w = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(v.dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", w, v)


def block_fn(cfg: ModelConfig):
    H, d, eps = cfg.heads, cfg.head_dim, cfg.norm_eps

    def block(p: dict, xb):
        x, bias = xb
        B, S, _ = x.shape
        h = rms_norm(x, p["attn_norm"], eps)
        q, k, v = ((h @ p[w]).reshape(B, S, H, d) for w in ("q", "k", "v"))
        x = x + _attention(q, k, v, bias).reshape(B, S, H * d) @ p["o"]
        h = rms_norm(x, p["mlp_norm"], eps)
        x = x + (jax.nn.gelu(h @ p["wi_0"], approximate=True) * (h @ p["wi_1"])) @ p["wo"]
        return x, bias
    return block


def head_fn(cfg: ModelConfig):
    def head(p: dict, xb):
        return rms_norm(xb[0], p["final_norm"], cfg.norm_eps)
    return head
