"""Hybrid Mamba-2 / attention / mixture-of-experts decoders (NVIDIA Nemotron-H, Nemotron 3):
each layer one of four residual sublayers, named by a character of
``ModelConfig.hybrid_pattern`` (Hugging Face ``nemotron_h``'s ``hybrid_override_pattern``):

- ``M``: a Mamba-2 mixer (Dao & Gu 2024, "Transformers are SSMs: Generalized Models and
  Efficient Algorithms Through Structured State Space Duality", Sec. 7-8): an input projection
  to ``z``, ``x``, ``B``, ``C`` and ``dt``; a causal depthwise convolution of width
  ``conv_kernel`` over ``x, B, C`` and SiLU; the state-space scan by the chunked SSD algorithm
  (:func:`ssd`, chunks of ``ssm_chunk`` tokens); ``D`` skip; an RMSNorm gated by ``silu(z)``
  per group; an output projection;
- ``*``: grouped-query attention, no positional embedding (Nemotron-H's attention has none);
- ``-``: a dense MLP (squared ReLU, not gated, for ``mlp`` ``relu2``);
- ``E``: a mixture of experts (``zoo.layers.moe_swiglu``; squared-ReLU experts and shared
  experts for ``relu2``; LatentMoE's down- and up-projections around the routed experts when
  ``moe_latent`` is set).

Every sublayer is ``x + mixer(rmsnorm(x))``. Shapes: ``x [B, S, h]``; Mamba-2 heads ``H =
mamba_heads`` of width ``P = mamba_head_dim`` (``d_inner = H P``), ``G = mamba_groups`` groups
of ``B`` and ``C`` of width ``N = ssm_state``.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from zoo import fused
from zoo.config import ModelConfig
from zoo.layers import attention, moe_swiglu, relu2_mlp, rms_norm

BODIES = {"M": "mamba_block", "*": "attention_block", "-": "mlp_block", "E": "moe_block"}
"""The fragment body of each ``hybrid_pattern`` character."""


def _mamba_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    H, P, G, N, h = cfg.mamba_heads, cfg.mamba_head_dim, cfg.mamba_groups, cfg.ssm_state, cfg.hidden
    d, conv = H * P, H * P + 2 * G * N
    return {"in_proj": (h, 2 * d + 2 * G * N + H), "conv_w": (cfg.conv_kernel, conv),
            "conv_b": (conv,), "dt_b": (H,), "a_log": (H,), "d_skip": (H,),
            "gate_norm": (d,), "out_proj": (d, h)}


def block_shapes(cfg: ModelConfig, body: str) -> dict[str, tuple[int, ...]]:
    """One hybrid layer's parameter shapes (``norm`` its pre-norm)."""
    h, f = cfg.hidden, cfg.ffn
    s: dict[str, tuple[int, ...]] = {"norm": (h,)}
    if body == "mamba_block":
        s.update(_mamba_shapes(cfg))
    elif body == "attention_block":
        d, H, KV = cfg.head_dim, cfg.heads, cfg.kv_heads
        s.update(wq=(h, H * d), wk=(h, KV * d), wv=(h, KV * d), wo=(H * d, h))
    elif body == "mlp_block":
        s.update(w_up=(h, f), w_down=(f, h))
    else:
        E, fe, L = cfg.experts, cfg.expert_ffn, cfg.expert_input
        s.update(w_router=(h, E), w_up=(E, L, fe), w_down=(E, fe, L))
        if cfg.moe_latent:          # LatentMoE's projections around the dispatch
            s.update(w_latent_down=(h, L), w_latent_up=(L, h))
        if cfg.shared_experts:
            fs = cfg.shared_experts * fe
            s.update(ws_up=(h, fs), ws_down=(fs, h))
    return s


def _segsum(a: jax.Array) -> jax.Array:
    """``out[..., i, j] = a[..., j+1] + ... + a[..., i]`` for ``j <= i``, -inf above: the log
    decay from position ``j`` to ``i`` (Dao & Gu 2024, Listing 1, ``segsum``)."""
    T = a.shape[-1]
    x = jnp.broadcast_to(a[..., None], (*a.shape, T))                  # [..., i, j] = a[i]
    x = jnp.where(jnp.tril(jnp.ones((T, T), bool), -1), x, 0.0)
    x = jnp.cumsum(x, axis=-2)
    return jnp.where(jnp.tril(jnp.ones((T, T), bool)), x, -jnp.inf)


def ssd(x: jax.Array, a: jax.Array, b: jax.Array, c: jax.Array, chunk: int) -> jax.Array:
    """The SSD chunked scan (Dao & Gu 2024, Sec. 7, Listing 1): ``h_t = exp(a_t) h_{t-1} +
    b_t x_t^T``, ``y_t = c_t h_t``, computed per chunk as a masked quadratic form, plus the
    states passed between chunks by a recurrence over the chunks.

    Args:
        x: ``[B, L, H, P]`` (inputs already scaled by ``dt``); a: ``[B, L, H]`` (log decays,
            ``A dt``); b, c: ``[B, L, H, N]``; chunk: tokens per chunk (``L`` is padded to a
            multiple).
    Returns: ``y [B, L, H, P]`` (float32).
    """
    Bt, L, H, P = x.shape
    pad = -L % chunk
    if pad:
        x, b, c = (jnp.pad(t, ((0, 0), (0, pad), (0, 0), (0, 0))) for t in (x, b, c))
        a = jnp.pad(a, ((0, 0), (0, pad), (0, 0)))
    n = (L + pad) // chunk
    x, b, c = (t.reshape(Bt, n, chunk, H, -1).astype(jnp.float32) for t in (x, b, c))
    a = a.reshape(Bt, n, chunk, H).transpose(0, 3, 1, 2).astype(jnp.float32)   # [B, H, n, l]
    a_cum = jnp.cumsum(a, axis=-1)
    decay = jnp.exp(_segsum(a))                                                # [B, H, n, l, l]
    y_diag = jnp.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", c, b, decay, x)
    to_end = jnp.exp(a_cum[..., -1:] - a_cum)                                  # [B, H, n, l]
    states = jnp.einsum("bclhn,bhcl,bclhp->bchpn", b, to_end, x)
    states = jnp.concatenate([jnp.zeros_like(states[:, :1]), states], axis=1)
    across = jnp.exp(_segsum(jnp.pad(a_cum[..., -1], ((0, 0), (0, 0), (1, 0)))))
    states = jnp.einsum("bhzc,bchpn->bzhpn", across, states)[:, :-1]
    y_off = jnp.einsum("bclhn,bchpn,bhcl->bclhp", c, states, jnp.exp(a_cum))
    return (y_diag + y_off).reshape(Bt, n * chunk, H, P)[:, :L]


@jax.checkpoint
def _conv_silu(x: jax.Array, w: jax.Array, bias: jax.Array) -> jax.Array:
    """SiLU of the causal depthwise convolution of ``x [B, S, c]`` by ``w [K, c]`` plus ``bias``
    (``causal_conv1d``'s fused kernel: the backward keeps ``x`` and recomputes)."""
    K, S = w.shape[0], x.shape[1]
    padded = jnp.pad(x, ((0, 0), (K - 1, 0), (0, 0)))
    return jax.nn.silu(sum(padded[:, k:k + S] * w[k] for k in range(K)) + bias)


@partial(jax.checkpoint, static_argnums=(6,))
def _ssd_core(x: jax.Array, dt: jax.Array, a_log: jax.Array, bmat: jax.Array, cmat: jax.Array,
              d_skip: jax.Array, chunk: int) -> jax.Array:
    """The SSD scan as ``mamba_chunk_scan_combined`` runs it from the mixer's raw tensors:
    ``x [B, S, H, P]``, ``dt [B, S, H]`` (after softplus), ``bmat, cmat [B, S, G, N]`` (each
    group shared by ``H / G`` heads), the ``D`` skip; ``y [B, S, H, P]`` in ``x``'s dtype."""
    H, G = x.shape[2], bmat.shape[2]
    b, c = (jnp.repeat(t, H // G, axis=2) for t in (bmat, cmat))
    a = -jnp.exp(a_log.astype(jnp.float32)) * dt
    xf = x.astype(jnp.float32)
    y = ssd(xf * dt[..., None], a, b, c, chunk)
    return (y + d_skip.astype(jnp.float32)[:, None] * xf).astype(x.dtype)


@partial(jax.checkpoint, static_argnums=(3, 4))
def _gated_norm(y: jax.Array, z: jax.Array, w: jax.Array, groups: int, eps: float) -> jax.Array:
    """Mamba-2's ``RMSNormGated``: ``y silu(z)`` RMS-normed over each of ``groups`` groups of
    channels, times ``w`` (one fused kernel)."""
    Bt, S, d = y.shape
    g = (y.astype(jnp.float32) * jax.nn.silu(z.astype(jnp.float32))).astype(y.dtype)
    return rms_norm(g.reshape(Bt, S, groups, d // groups), None, eps).reshape(Bt, S, d) * w


def mamba2(cfg: ModelConfig, p: dict, u: jax.Array) -> jax.Array:
    """The Mamba-2 mixer of the normed input ``u [B, S, h]`` -> ``[B, S, h]`` (module doc)."""
    Bt, S, _ = u.shape
    H, P, G, N = cfg.mamba_heads, cfg.mamba_head_dim, cfg.mamba_groups, cfg.ssm_state
    d = H * P
    zxbcdt = u @ p["in_proj"]
    z, xbc, dt = zxbcdt[..., :d], zxbcdt[..., d:2 * d + 2 * G * N], zxbcdt[..., 2 * d + 2 * G * N:]
    xbc = _conv_silu(xbc, p["conv_w"], p["conv_b"])
    x = xbc[..., :d].reshape(Bt, S, H, P)
    bmat = xbc[..., d:d + G * N].reshape(Bt, S, G, N)
    cmat = xbc[..., d + G * N:].reshape(Bt, S, G, N)
    dt = jax.nn.softplus(dt.astype(jnp.float32) + p["dt_b"].astype(jnp.float32))   # [B, S, H]
    y = _ssd_core(x, dt, p["a_log"], bmat, cmat, p["d_skip"], cfg.ssm_chunk)
    y = _gated_norm(y.reshape(Bt, S, d), z, p["gate_norm"], G, cfg.norm_eps)
    return y @ p["out_proj"]


def kernel_correction(cfg: ModelConfig, body: str, b: int, training: bool) -> dict[str, float]:
    """The corrections from the traced ``mamba_block`` of ``b`` samples to the fused kernels
    production runs (:func:`zoo.fused.correction`): the convolution, the SSD scan (its FLOP at
    the fused-kernel rate) and the gated norm. Empty for any other body."""
    if body != "mamba_block" or not cfg.hybrid:
        return {}
    H, P, G, N, S = cfg.mamba_heads, cfg.mamba_head_dim, cfg.mamba_groups, cfg.ssm_state, cfg.seq_len
    d, conv = H * P, H * P + 2 * G * N
    spec = (lambda *shape, dtype=cfg.jnp_dtype: jax.ShapeDtypeStruct(shape, dtype))
    chunk, eps = cfg.ssm_chunk, cfg.norm_eps
    pieces: list[fused.Piece] = [
        (_conv_silu, (spec(b, S, conv), spec(cfg.conv_kernel, conv), spec(conv)), False),
        (lambda *a: _ssd_core(*a, chunk),
         (spec(b, S, H, P), spec(b, S, H, dtype=jnp.float32), spec(H), spec(b, S, G, N),
          spec(b, S, G, N), spec(H)), True),
        (lambda y, z, w: _gated_norm(y, z, w, G, eps), (spec(b, S, d), spec(b, S, d), spec(d)),
         False)]
    return fused.correction(pieces, training)


def block_fn(cfg: ModelConfig, body: str):
    """One hybrid layer as ``(p, x [B, S, h]) -> [B, S, h]``."""
    H, KV, d = cfg.heads, cfg.kv_heads, cfg.head_dim

    def block(p: dict, x: jax.Array) -> jax.Array:
        Bt, S, _ = x.shape
        u = rms_norm(x, p["norm"], cfg.norm_eps)
        if body == "mamba_block":
            return x + mamba2(cfg, p, u)
        if body == "attention_block":
            q = (u @ p["wq"]).reshape(Bt, S, H, d)
            k = (u @ p["wk"]).reshape(Bt, S, KV, d)
            v = (u @ p["wv"]).reshape(Bt, S, KV, d)
            o = attention(q, k, v, causal=True, impl=cfg.attention).reshape(Bt, S, H * d)
            return x + o @ p["wo"]
        if body == "mlp_block":
            return x + relu2_mlp(u, p["w_up"], p["w_down"])
        y = moe_swiglu(u, p["w_router"], None, p["w_up"], p["w_down"],
                       top_k=cfg.experts_per_token, capacity_factor=cfg.capacity_factor,
                       latent=(p["w_latent_down"], p["w_latent_up"]) if cfg.moe_latent else None)
        if cfg.shared_experts:
            y = y + relu2_mlp(u, p["ws_up"], p["ws_down"])
        return x + y
    return block
