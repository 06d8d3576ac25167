"""The Mochi 1 VAE decoder (Genmo 2024, AsymmVAE), inference only: the latent video the DiT
denoises to RGB frames.

Architecture after diffusers' ``MochiDecoder3D`` / ``AutoencoderKLMochi``
(``src/diffusers/models/autoencoders/autoencoder_kl_mochi.py``) with the published
``genmo/mochi-1-preview`` ``vae/config.json`` (``zoo.config``'s ``mochi-vae-decoder`` cites it).
With ``n`` channel widths ``c = vae_channels`` (narrowest first), ``vae_blocks`` (``n + 1``
residual block counts) and ``n - 1`` temporal / spatial expansions:

* ``conv_in``: a 1x1x1 convolution ``latent_channels -> c[-1]`` (with bias);
* level 0 (the latent's resolution, width ``c[-1]``): ``vae_blocks[-1]`` residual blocks
  (diffusers' ``block_in``) then the first up block's ``vae_blocks[-2]``;
* up block ``k`` (``k = 0 .. n-2``): its residual blocks at width ``c[-k-1]``, then a linear
  projection to ``c[-k-2] * t * s * s`` channels and depth-to-space: frames x ``t =
  temporal_expansions[-k-1]``, height and width x ``s = spatial_expansions[-k-1]``; the next
  level's residual blocks are up block ``k + 1``'s (``vae_blocks[-k-3]``), the last level's are
  ``block_out``'s (``vae_blocks[0]`` at ``c[0]``);
* a residual block (``MochiResnetBlock3D``): ``x + conv2(silu(gn2(conv1(silu(gn1(x))))))`` with
  ``gn`` a GroupNorm of ``norm_groups`` groups computed per frame (``MochiChunkedGroupNorm3D``:
  statistics over a group's channels, height and width, eps ``norm_eps``) and ``conv`` a causal
  3x3x3 convolution with bias (``CogVideoXCausalConv3d``, ``pad_mode="replicate"``): the input
  padded by repeating its edge, 2 frames before the first (none after) and 1 row / column on
  each side, then convolved without padding (:func:`causal_conv3d`);
* head: SiLU, a linear projection ``c[0] -> out_channels`` (with bias), and the first
  ``prod(temporal_expansions) - 1`` frames dropped (``drop_last_temporal_frames``): ``F`` latent
  frames give ``6 (F - 1) + 1`` video frames (28 -> 163).

Not modelled: the pipeline's un-normalisation of the latent (``z * latents_std + latents_mean``
per channel, before ``decode``: elementwise, no parameters) and diffusers' optional tiled or
frame-wise decoding (memory-saving variants of the same computation).

Layout ``[B, C, T, H, W]`` (PyTorch's ``NCDHW``, as the DiT's velocity and the guide's
``[1, 12, 4, 60, 106]``); convolution weights ``[3, 3, 3, C_in, C_out]`` (``DHWIO``).

Layer functions (``B`` videos):
    embed ``(params, {"latent": [B, latent_channels, F, H, W]}) -> x [B, c[-1], F, H, W]``;
    ``res_block{k}`` ``(params, x) -> x`` (the same shape);
    ``upsample{k}`` ``(params, x [B, c_k, T, H, W]) -> [B, c_{k+1}, t T, s H, s W]``;
    head ``(params, x [B, c[0], T, H, W]) -> video [B, out_channels, T - (prod t - 1), H, W]``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from zoo.config import ModelConfig

__all__ = ["batch_shapes", "embed_shapes", "res_shapes", "upsample_shapes", "head_shapes",
           "bodies", "body_shapes", "causal_conv3d", "group_norm", "layer_fns",
           "output_shape", "KERNEL"]

KERNEL = 3
"""Kernel size of every residual convolution (3 x 3 x 3)."""


def batch_shapes(cfg: ModelConfig, batch: int) -> dict[str, jax.ShapeDtypeStruct]:
    """``{"latent": [batch, latent_channels, latent_frames, latent_height, latent_width]}``."""
    return {"latent": jax.ShapeDtypeStruct((batch, cfg.latent_channels, cfg.latent_frames,
                                            cfg.latent_height, cfg.latent_width), cfg.jnp_dtype)}


def _level_width(cfg: ModelConfig, k: int) -> int:
    """Channels of level ``k`` (0: the latent's resolution, the widest)."""
    return cfg.vae_channels[-k - 1]


def bodies(cfg: ModelConfig) -> tuple[str, ...]:
    """The body of each block, in order: ``res_block0`` x (``vae_blocks[-1] + vae_blocks[-2]``),
    ``upsample0``, ``res_block1`` x ``vae_blocks[-3]``, ..., ``res_block{n-1}`` x
    ``vae_blocks[0]`` (``n`` channel widths; ``sum(vae_blocks) + n - 1`` blocks)."""
    n, vb = len(cfg.vae_channels), cfg.vae_blocks
    out = ["res_block0"] * (vb[n] + vb[n - 1])
    for k in range(1, n):
        out += [f"upsample{k - 1}"] + [f"res_block{k}"] * vb[n - 1 - k]
    return tuple(out)


def embed_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The 1x1x1 ``conv_in`` as a ``[latent_channels, c[-1]]`` matrix and its bias."""
    c = cfg.vae_channels[-1]
    return {"conv_in": (cfg.latent_channels, c), "conv_in_b": (c,)}


def res_shapes(cfg: ModelConfig, k: int) -> dict[str, tuple[int, ...]]:
    """A level-``k`` residual block: two GroupNorms (weight, bias) and two 3x3x3 convolutions
    (weight, bias): ``2 (27 C^2 + C) + 4 C`` parameters at width ``C``."""
    c, kk = _level_width(cfg, k), KERNEL
    return {"norm1": (c,), "norm1_b": (c,), "conv1": (kk, kk, kk, c, c), "conv1_b": (c,),
            "norm2": (c,), "norm2_b": (c,), "conv2": (kk, kk, kk, c, c), "conv2_b": (c,)}


def _expansion(cfg: ModelConfig, k: int) -> tuple[int, int]:
    """(temporal, spatial) expansion of up block ``k``."""
    return cfg.temporal_expansions[-k - 1], cfg.spatial_expansions[-k - 1]


def upsample_shapes(cfg: ModelConfig, k: int) -> dict[str, tuple[int, ...]]:
    """Up block ``k``'s projection ``c_k -> c_{k+1} t s^2`` (diffusers ``MochiUpBlock3D.proj``)
    and its bias."""
    t, s = _expansion(cfg, k)
    out = _level_width(cfg, k + 1) * t * s * s
    return {"proj": (_level_width(cfg, k), out), "proj_b": (out,)}


def head_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """``proj_out``: ``c[0] -> out_channels`` and its bias."""
    return {"proj_out": (cfg.vae_channels[0], cfg.out_channels),
            "proj_out_b": (cfg.out_channels,)}


def body_shapes(cfg: ModelConfig, body: str) -> dict[str, tuple[int, ...]]:
    """The parameter shapes of ``body`` (``embed``, ``head``, ``res_block{k}``,
    ``upsample{k}``)."""
    if body == "embed":
        return embed_shapes(cfg)
    if body == "head":
        return head_shapes(cfg)
    if body.startswith("res_block"):
        return res_shapes(cfg, int(body[len("res_block"):]))
    return upsample_shapes(cfg, int(body[len("upsample"):]))


def output_shape(cfg: ModelConfig, batch: int) -> tuple[int, int, int, int, int]:
    """The decoded video ``(batch, out_channels, frames, height, width)``: frames ``F prod(t) -
    (prod(t) - 1)`` when ``F prod(t) >= prod(t)`` (diffusers' condition), height and width
    times ``prod(s)``."""
    tt, ss = math.prod(cfg.temporal_expansions), math.prod(cfg.spatial_expansions)
    frames = cfg.latent_frames * tt
    if frames >= tt:
        frames -= tt - 1
    return (batch, cfg.out_channels, frames, cfg.latent_height * ss, cfg.latent_width * ss)


def group_norm(x: jax.Array, w: jax.Array, b: jax.Array, groups: int, eps: float) -> jax.Array:
    """Per-frame GroupNorm of ``x [B, C, T, H, W]`` (``C`` a multiple of ``groups``): each
    (sample, frame, group) normalised over its ``C / groups`` channels and ``H x W`` positions
    (biased variance, float32), then ``* w + b`` per channel."""
    B, C, T, H, W = x.shape
    xf = x.astype(jnp.float32).reshape(B, groups, C // groups, T, H, W)
    mu = jnp.mean(xf, axis=(2, 4, 5), keepdims=True)
    var = jnp.mean(jnp.square(xf - mu), axis=(2, 4, 5), keepdims=True)
    y = ((xf - mu) * jax.lax.rsqrt(var + eps)).reshape(B, C, T, H, W)
    y = y * w.astype(jnp.float32)[:, None, None, None] + b.astype(jnp.float32)[:, None, None, None]
    return y.astype(x.dtype)


def causal_conv3d(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    """Causal 3-D convolution, stride 1 (``CogVideoXCausalConv3d``, ``pad_mode="replicate"``).

    Args:
        x: ``[B, C_in, T, H, W]``.
        w: ``[kt, kh, kw, C_in, C_out]`` (odd ``kh``, ``kw``).
        b: ``[C_out]``.
    Returns: ``[B, C_out, T, H, W]``: ``x`` padded by repeating its edge values, ``kt - 1``
        frames before the first and none after (output frame ``t`` sees input frames ``t - kt +
        1 .. t`` only), ``(kh - 1) / 2`` rows and ``(kw - 1) / 2`` columns on each side, then
        convolved without padding (``jax.lax.conv_general_dilated``, ``NCDHW`` / ``DHWIO``).
    """
    kt, kh, kw = w.shape[:3]
    pad = ((0, 0), (0, 0), (kt - 1, 0), ((kh - 1) // 2,) * 2, ((kw - 1) // 2,) * 2)
    xp = jnp.pad(x, pad, mode="edge")
    y = jax.lax.conv_general_dilated(xp, w.astype(x.dtype), (1, 1, 1), "VALID",
                                     dimension_numbers=("NCDHW", "DHWIO", "NCDHW"))
    return y + b.astype(y.dtype)[:, None, None, None]


def _res_block(cfg: ModelConfig):
    g, eps = cfg.norm_groups, cfg.norm_eps

    def block(p: dict, x: jax.Array) -> jax.Array:
        h = jax.nn.silu(group_norm(x, p["norm1"], p["norm1_b"], g, eps))
        h = causal_conv3d(h, p["conv1"], p["conv1_b"])
        h = jax.nn.silu(group_norm(h, p["norm2"], p["norm2_b"], g, eps))
        return x + causal_conv3d(h, p["conv2"], p["conv2_b"])
    return block


def _linear(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    """A per-position linear map over the channels of ``x [B, C, T, H, W]``."""
    return jnp.einsum("bcthw,cd->bdthw", x, w) + b[:, None, None, None]


def _upsample(cfg: ModelConfig, k: int):
    t, s = _expansion(cfg, k)

    def up(p: dict, x: jax.Array) -> jax.Array:
        y = _linear(x, p["proj"], p["proj_b"])
        B, _, T, H, W = y.shape
        y = y.reshape(B, -1, t, s, s, T, H, W).transpose(0, 1, 5, 2, 6, 3, 7, 4)
        return y.reshape(B, -1, T * t, H * s, W * s)
    return up


def _embed(cfg: ModelConfig):
    def embed(p: dict, batch: dict) -> jax.Array:
        return _linear(batch["latent"], p["conv_in"], p["conv_in_b"])
    return embed


def _head(cfg: ModelConfig):
    drop = math.prod(cfg.temporal_expansions) - 1

    def head(p: dict, x: jax.Array) -> jax.Array:
        y = _linear(jax.nn.silu(x), p["proj_out"], p["proj_out_b"])
        return y[:, :, drop:] if y.shape[2] > drop else y
    return head


def layer_fns(cfg: ModelConfig) -> dict[str, object]:
    """Each body's function (``embed``, ``res_block{k}``, ``upsample{k}``, ``head``)."""
    n = len(cfg.vae_channels)
    fns: dict[str, object] = {"embed": _embed(cfg), "head": _head(cfg)}
    fns.update({f"res_block{k}": _res_block(cfg) for k in range(n)})
    fns.update({f"upsample{k}": _upsample(cfg, k) for k in range(n - 1)})
    return fns
