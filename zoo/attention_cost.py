"""The attention core of a fragment body as a fused kernel runs it: its shapes, the share of
the score matrix a causal or sliding-window blocked kernel computes, and the corrections from
the traced (materialized-softmax) layer to FlashAttention's FLOPs and HBM traffic (Dao et al.
2022, 2023), used by :mod:`zoo.costing`.
"""

from __future__ import annotations

import functools
import math

import jax

from ir.workload import ATTENTION_KERNELS, FLASH_BLOCK, causal_fraction
from zoo.config import ModelConfig, ZooError
from zoo.layers import attention
from zoo.tracing import nbytes, trace_costs, vjp_parts

__all__ = ["ATTENTION_BODIES", "attention_core", "attention_kernel_correction", "window_fraction"]


ATTENTION_BODIES = ("decoder_block", "dense_block", "sliding_block", "attention_block")
"""The decoder bodies with an attention core (the head too with a multi-token-prediction
module, whose block attends)."""


def attention_core(cfg: ModelConfig, body: str, b: int):
    """Shapes of the body's attention core (q, k, v) or None, whether it is causal, and its
    sliding window (0: none)."""
    window = cfg.sliding_window if body == "sliding_block" else 0
    if cfg.family == "t5":       # bidirectional, every head its own keys (zoo.t5)
        if body != "t5_block":
            return None, False, 0
        q = jax.ShapeDtypeStruct((b, cfg.seq_len, cfg.heads, cfg.head_dim), cfg.jnp_dtype)
        return (q, q, q), False, 0
    if cfg.family == "mochi_vae":    # convolutions only
        return None, False, 0
    if body in ATTENTION_BODIES or (body == "head" and cfg.mtp_layers):
        S = cfg.seq_len
        if cfg.mla:
            H = cfg.heads
            qk = jax.ShapeDtypeStruct((b, S, H, cfg.head_dim + cfg.qk_rope_head_dim), cfg.jnp_dtype)
            return (qk, qk, jax.ShapeDtypeStruct((b, S, H, cfg.v_head_dim), cfg.jnp_dtype)), True, 0
        d = cfg.head_dim
        q = jax.ShapeDtypeStruct((b, S, cfg.heads, d), cfg.jnp_dtype)
        kv = jax.ShapeDtypeStruct((b, S, cfg.kv_heads, d), cfg.jnp_dtype)
        return (q, kv, kv), True, window
    if body.startswith("asymm_dit_block"):
        q = jax.ShapeDtypeStruct((b, cfg.visual_tokens + cfg.text_tokens, cfg.heads, cfg.head_dim),
                                 cfg.jnp_dtype)
        return (q, q, q), False, 0
    return None, False, 0


def window_fraction(seq: int, window: int, block: int = FLASH_BLOCK) -> float:
    """Fraction of a ``seq x seq`` score matrix's FLOPs a blocked kernel computes under a causal
    sliding window of ``window`` keys (query ``i`` sees ``i - window < j <= i``): the
    ``block x block`` tiles any of whose scores is in the band, of ``n^2``, ``n = ceil(seq /
    block)`` (FlashAttention-2 skips the others, as it skips those above the diagonal: Dao 2023,
    Sec. 3.1). ``window >= seq`` gives :func:`ir.workload.causal_fraction`; gpt-oss's window 128
    at 4,096 tokens gives ``(2n - 1) / n^2`` (the diagonal tile and the one before it), about
    ``2 x 128 / seq``.

    Raises:
        ZooError: ``seq``, ``window`` or ``block`` not positive.
    """
    if seq <= 0 or window <= 0 or block <= 0:
        raise ZooError(f"window_fraction(seq={seq}, window={window}, block={block}): all must be "
                       f"positive")
    n = math.ceil(seq / block)
    tiles = sum(i - max(0, i * block - window + 1) // block + 1 for i in range(n))
    return tiles / (n * n)


def attention_kernel_correction(cfg: ModelConfig, body: str, b: int, training: bool
                                 ) -> dict[str, float]:
    """What the attention core of ``b`` samples costs under ``cfg.attention_kernel``, as
    corrections to the plain (materialized-softmax) trace of the layer, keyed like
    :func:`_probe`'s figures (``fwd_bytes``, ``fwd_other``, ``fwd_flops``, ``bwd_*``,
    ``bwdx_*``), added to them.

    ``"unfused"``: none (the trace is that kernel). ``"flash"`` (Dao et al. 2022, 2023):

    * bytes: the core's HBM traffic is FlashAttention's I/O (reads q, k, v, writes o and the
      log-sum-exp; the backward reads q, k, v, o, do, lse and writes dq, dk, dv) instead of the
      materialized scores', and the softmax's own elementwise traffic is fused away;
    * FLOPs: a causal mask skips the blocks above the diagonal (:func:`causal_fraction` of the
      trace's; a sliding window also those left of its band, :func:`window_fraction`), and the backward recomputes the scores ``Q K^T`` before its four matmuls, so it
      is 2.5x the forward's matmul FLOPs instead of 2x (FlashAttention-2, Sec. 3.1-3.2). The
      core has no weights, so its backward FLOPs are all input-gradient (B) FLOPs.
    """
    zero = dict.fromkeys(("fwd_bytes", "fwd_other", "fwd_flops", "bwd_bytes", "bwd_other",
                          "bwd_flops", "bwdx_other", "bwdx_flops", "attn_fwd_flops",
                          "attn_bwd_flops"), 0.0)
    qkv, causal, window = attention_core(cfg, body, b)
    if qkv is None or cfg.attention_kernel == "unfused":
        return zero
    if cfg.attention_kernel not in ("flash", "flash2"):
        raise ZooError(f"attention_kernel {cfg.attention_kernel!r} is not one of "
                       f"{sorted(ATTENTION_KERNELS)}")
    q = qkv[0]
    frac = (window_fraction(q.shape[1], window) if window else
            causal_fraction(q.shape[1]) if causal else 1.0)
    scores_flops = 2.0 * math.prod(q.shape) * qkv[1].shape[1]   # Q K^T: 2 b S T H D
    core = functools.partial(attention, causal=causal, impl="plain", window=window)
    flops_fwd, plain_fwd, other_fwd, _ = trace_costs(core, *qkv)
    io = nbytes(qkv) + nbytes(q)                          # q, k, v in; o out
    lse = math.prod(q.shape[:3]) * 4                        # float32 per (b, s, head)
    out = dict(zero, fwd_bytes=io + lse - plain_fwd, fwd_other=-other_fwd,
               fwd_flops=(frac - 1.0) * flops_fwd, attn_fwd_flops=frac * flops_fwd)
    if not training:
        return out
    bwd_fn, leaves, ct = vjp_parts(lambda p, q, k, v: core(q, k, v), {}, qkv, (), True)
    flops_bwd, plain_bwd, other_bwd, _ = trace_costs(bwd_fn, leaves, ct)
    flash_bwd = frac * (flops_bwd + scores_flops)
    out.update(bwd_bytes=(io + nbytes(q) + lse) + nbytes(qkv) - plain_bwd,  # q,k,v,o,do,lse in
               bwd_other=-other_bwd, bwdx_other=-other_bwd,
               bwd_flops=flash_bwd - flops_bwd, bwdx_flops=flash_bwd - flops_bwd,
               attn_bwd_flops=flash_bwd)
    return out
