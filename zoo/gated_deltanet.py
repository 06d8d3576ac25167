"""Gated DeltaNet linear attention (Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks:
Improving Mamba2 with Delta Rule", ICLR 2025), as Qwen3-Next's ``linear_attention`` layers use
it (Hugging Face ``Qwen3NextGatedDeltaNet``; Megatron-Core's ``gated_delta_net`` attention
variant).

Per head, a state ``S [dk, dv]`` is decayed by ``alpha_t = exp(g_t)`` and corrected toward the
new value by the delta rule, then read by the query (Sec. 3, eq. 10):

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t.

:func:`chunked_delta_rule` computes it as production kernels do (flash-linear-attention's
``chunk_gated_delta_rule``; the paper's Sec. 3.3): per chunk of ``C`` tokens the WY form
``T = (I + tril(diag(beta) K K^T * Gamma, -1))^-1`` (a unit lower-triangular solve), then the
chunk's output from the state passed in plus a masked ``C x C`` attention, then the state passed
on. The mixer (:func:`gated_deltanet`): one input projection to ``q, k, v, z`` and one to
``beta, a`` (Qwen3-Next's ``in_proj_qkvz`` and ``in_proj_ba``); a causal depthwise convolution of
``linear_conv_kernel`` taps over ``q, k, v`` and SiLU; ``q`` and ``k`` L2-normalised per head
(``q`` also scaled by ``dk^-1/2``), key heads repeated to the value heads;
``beta = sigmoid(b)``, ``g = -exp(A_log) softplus(a + dt_bias)``; the output RMS-normed per head
and gated by ``silu(z)``; an output projection.

Shapes: ``x [B, S, h]``; ``Hk = linear_key_heads`` query/key heads of ``dk =
linear_key_head_dim``, ``Hv = linear_value_heads`` value heads of ``dv = linear_value_head_dim``.

Costing (:func:`kernel_correction`): the chunked rule is one fused kernel in production
(flash-linear-attention's Triton kernels, which Megatron-Core calls): its HBM traffic is its
inputs and output (the backward: those, the output gradient and the input gradients), not the
trace's unfused chunk intermediates, and its FLOP run at the device's attention-kernel rate, in
BF16 under every precision recipe, as the attention core's do. The mixer checkpoints the rule
(``jax.checkpoint``): the backward keeps its inputs and recomputes the chunk states, as the
kernel's backward does. XLA's cost analysis counts no FLOP for the triangular solve
(``C^2 (dk + dv) / 2`` multiply-adds a chunk and head, about 5% of the chunked rule's and well
under 1% of a Qwen3-Next layer's); the inter-chunk recurrence is unrolled (a ``scan``'s body is
counted once), so tracing time grows with ``seq_len / C`` (7 s for a Qwen3-Next layer at 4,096
tokens on this project's 2-core machine).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from zoo import fused
from zoo.config import ModelConfig
from zoo.layers import rms_norm

__all__ = ["chunked_delta_rule", "core_inputs", "gated_deltanet", "kernel_correction",
           "reference_delta_rule", "shapes"]


def shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The mixer's parameter shapes (Hugging Face ``Qwen3NextGatedDeltaNet``'s names)."""
    h, Hk, Hv = cfg.hidden, cfg.linear_key_heads, cfg.linear_value_heads
    kd, vd = Hk * cfg.linear_key_head_dim, Hv * cfg.linear_value_head_dim
    conv = 2 * kd + vd
    return {"in_proj_qkvz": (h, 2 * kd + 2 * vd), "in_proj_ba": (h, 2 * Hv),
            "conv_w": (cfg.linear_conv_kernel, conv), "dt_b": (Hv,), "a_log": (Hv,),
            "gate_norm": (cfg.linear_value_head_dim,), "out_proj": (vd, h)}


def _l2norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def chunked_delta_rule(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
                       chunk: int) -> jax.Array:
    """The gated delta rule by chunks of ``chunk`` tokens (module doc), zero initial state.

    Args:
        q, k: ``[B, H, L, dk]`` (already normalised and scaled); v: ``[B, H, L, dv]``;
        g: ``[B, H, L]`` log decays (``<= 0``); beta: ``[B, H, L]`` in ``[0, 1]``.
        chunk: tokens per chunk; ``L`` is padded to a multiple with ``g = beta = 0`` (the
            padding changes no earlier output).
    Returns: ``o [B, H, L, dv]`` float32.
    """
    Bt, H, L, dk = q.shape
    dv = v.shape[-1]
    pad = -L % chunk
    if pad:
        q, k, v = (jnp.pad(t, ((0, 0), (0, 0), (0, pad), (0, 0))) for t in (q, k, v))
        g, beta = (jnp.pad(t, ((0, 0), (0, 0), (0, pad))) for t in (g, beta))
    n = (L + pad) // chunk
    q, k, v = (t.astype(jnp.float32).reshape(Bt, H, n, chunk, -1) for t in (q, k, v))
    g = jnp.cumsum(g.astype(jnp.float32).reshape(Bt, H, n, chunk), axis=-1)   # within a chunk
    beta = beta.astype(jnp.float32).reshape(Bt, H, n, chunk)
    lower = jnp.tril(jnp.ones((chunk, chunk), bool))
    gamma = jnp.where(lower, jnp.exp(jnp.where(lower, g[..., :, None] - g[..., None, :], 0.0)), 0.0)
    k_beta = k * beta[..., None]
    a = jnp.where(jnp.tril(lower, -1), jnp.einsum("bhncd,bhnsd->bhncs", k_beta, k) * gamma, 0.0)
    eye = jnp.eye(chunk, dtype=jnp.float32)
    rhs = jnp.concatenate([k_beta * jnp.exp(g)[..., None], v * beta[..., None]], axis=-1)
    wu = jax.lax.linalg.triangular_solve(a + eye, rhs, left_side=True, lower=True,
                                         unit_diagonal=True)          # T [k_beta e^g, v beta]
    w, u = wu[..., :dk], wu[..., dk:]
    attn = jnp.einsum("bhncd,bhnsd->bhncs", q, k) * gamma
    q_decay = q * jnp.exp(g)[..., None]
    k_decay = k * jnp.exp(g[..., -1:] - g)[..., None]
    last = jnp.exp(g[..., -1])                                           # [B, H, n]
    state = jnp.zeros((Bt, H, dk, dv), jnp.float32)
    out = []
    for i in range(n):          # the state passed between chunks (unrolled: see module doc)
        v_new = u[:, :, i] - w[:, :, i] @ state
        out.append(q_decay[:, :, i] @ state + attn[:, :, i] @ v_new)
        state = state * last[:, :, i, None, None] + jnp.swapaxes(k_decay[:, :, i], -1, -2) @ v_new
    return jnp.stack(out, axis=2).reshape(Bt, H, n * chunk, dv)[:, :, :L]


def reference_delta_rule(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array,
                         beta: jax.Array) -> jax.Array:
    """The recurrence of the module doc token by token (a test's reference; same shapes as
    :func:`chunked_delta_rule`)."""
    def step(state, t):
        qt, kt, vt, gt, bt = t
        state = state * jnp.exp(gt)[..., None, None]
        pred = jnp.einsum("bhkv,bhk->bhv", state, kt)
        state = state + jnp.einsum("bhk,bhv->bhkv", kt, bt[..., None] * (vt - pred))
        return state, jnp.einsum("bhkv,bhk->bhv", state, qt)
    f32 = (t.astype(jnp.float32) for t in (q, k, v, g, beta))
    q, k, v, g, beta = (jnp.moveaxis(t, 2, 0) for t in f32)
    init = jnp.zeros((q.shape[1], q.shape[2], q.shape[-1], v.shape[-1]), jnp.float32)
    _, o = jax.lax.scan(step, init, (q, k, v, g, beta))
    return jnp.moveaxis(o, 0, 2)


@jax.checkpoint
def _conv_silu(x: jax.Array, w: jax.Array) -> jax.Array:
    """SiLU of the causal depthwise convolution of ``x [B, S, c]`` by ``w [K, c]`` (a fused
    ``causal_conv1d`` kernel: the backward keeps ``x`` and recomputes)."""
    K, S = w.shape[0], x.shape[1]
    padded = jnp.pad(x, ((0, 0), (K - 1, 0), (0, 0)))
    return jax.nn.silu(sum(padded[:, j:j + S] * w[j] for j in range(K)))


@partial(jax.checkpoint, static_argnums=(3,))
def _gated_norm(o: jax.Array, z: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """``rmsnorm(o) w silu(z)`` per head (Qwen3-Next's ``RMSNormGated``; a fused kernel)."""
    return rms_norm(o, w, eps) * jax.nn.silu(z.astype(jnp.float32)).astype(o.dtype)


def _normed_rule(q: jax.Array, k: jax.Array, v: jax.Array, g: jax.Array, beta: jax.Array,
                 chunk: int) -> jax.Array:
    """The rule on raw ``q, k``: L2-normalised per head in the kernel (``q`` also scaled by
    ``dk^-1/2``: flash-linear-attention's ``use_qk_l2norm_in_kernel``), output in ``v``'s dtype."""
    qf, kf = (_l2norm(t.astype(jnp.float32)) for t in (q, k))
    o = chunked_delta_rule(qf * q.shape[-1] ** -0.5, kf, v, g, beta, chunk)
    return o.astype(v.dtype)


_core = jax.checkpoint(_normed_rule, static_argnums=(5,))
"""The rule as the mixer calls it: the backward keeps its inputs and recomputes the rest."""


def core_inputs(cfg: ModelConfig, b: int) -> tuple[jax.ShapeDtypeStruct, ...]:
    """The rule's inputs for ``b`` samples as the mixer passes them: ``q, k [b, Hv, S, dk]``
    and ``v [b, Hv, S, dv]`` in the compute dtype, ``g, beta [b, Hv, S]`` float32."""
    Hv, S = cfg.linear_value_heads, cfg.seq_len
    qk = jax.ShapeDtypeStruct((b, Hv, S, cfg.linear_key_head_dim), cfg.jnp_dtype)
    v = jax.ShapeDtypeStruct((b, Hv, S, cfg.linear_value_head_dim), cfg.jnp_dtype)
    gb = jax.ShapeDtypeStruct((b, Hv, S), jnp.float32)
    return qk, qk, v, gb, gb


def _fused_pieces(cfg: ModelConfig, b: int):
    """``(function, inputs, is the rule)`` of each piece production fuses into one kernel: the
    convolution with its SiLU, the chunked rule, the gated norm."""
    S, Hv, dv = cfg.seq_len, cfg.linear_value_heads, cfg.linear_value_head_dim
    conv = 2 * cfg.linear_key_heads * cfg.linear_key_head_dim + Hv * dv
    spec = (lambda *shape: jax.ShapeDtypeStruct(shape, cfg.jnp_dtype))
    chunk, eps = cfg.linear_chunk, cfg.norm_eps
    return ((_conv_silu, (spec(b, S, conv), spec(cfg.linear_conv_kernel, conv)), False),
            (lambda *a: _core(*a, chunk), core_inputs(cfg, b), True),
            (lambda o, z, w: _gated_norm(o, z, w, eps),
             (spec(b, S, Hv, dv), spec(b, S, Hv, dv), spec(dv)), False))


def kernel_correction(cfg: ModelConfig, body: str, b: int, training: bool) -> dict[str, float]:
    """The corrections from the traced ``linear_block`` of ``b`` samples to its fused kernels
    (module doc; :func:`zoo.fused.correction`): the convolution, the delta rule (its FLOP at the
    fused-kernel rate) and the gated norm. Empty for any other body."""
    if body != "linear_block" or not cfg.linear_attention:
        return {}
    return fused.correction(_fused_pieces(cfg, b), training)


def gated_deltanet(cfg: ModelConfig, p: dict, u: jax.Array) -> jax.Array:
    """The Gated DeltaNet mixer of the normed input ``u [B, S, h]`` -> ``[B, S, h]``."""
    Bt, S, _ = u.shape
    Hk, Hv = cfg.linear_key_heads, cfg.linear_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    kd, vd = Hk * dk, Hv * dv
    qkvz = u @ p["in_proj_qkvz"]
    qkv, z = qkvz[..., :2 * kd + vd], qkvz[..., 2 * kd + vd:]
    ba = (u @ p["in_proj_ba"]).astype(jnp.float32)
    qkv = _conv_silu(qkv, p["conv_w"])
    rep = Hv // Hk
    heads_first = (lambda t: jnp.swapaxes(t, 1, 2))
    q = heads_first(jnp.repeat(qkv[..., :kd].reshape(Bt, S, Hk, dk), rep, axis=2))
    k = heads_first(jnp.repeat(qkv[..., kd:2 * kd].reshape(Bt, S, Hk, dk), rep, axis=2))
    v = heads_first(qkv[..., 2 * kd:].reshape(Bt, S, Hv, dv))
    beta = jax.nn.sigmoid(ba[..., :Hv])
    g = -jnp.exp(p["a_log"].astype(jnp.float32)) * jax.nn.softplus(
        ba[..., Hv:] + p["dt_b"].astype(jnp.float32))
    o = _core(q, k, v, heads_first(g), heads_first(beta), cfg.linear_chunk)
    o = _gated_norm(jnp.swapaxes(o, 1, 2), z.reshape(Bt, S, Hv, dv), p["gate_norm"],
                    cfg.norm_eps)
    return o.reshape(Bt, S, vd) @ p["out_proj"]
