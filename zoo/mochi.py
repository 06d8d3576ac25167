"""The Mochi 1 DiT (Genmo 2024): a 48-block asymmetric diffusion transformer, inference only.

Architecture after Genmo's ``asymm_models_joint.py`` and the Tenstorrent 'Sharding for Mochi'
guide (shared/reference/004, section 6): a visual stream of width 3072 and a text stream of width
1536 meet in a joint (non-causal) attention of 24 heads x 128 over the concatenated tokens; each
stream has its own QKV / output projections, per-head RMSNorm of q and k, adaLN modulation from the
conditioning vector ``c`` (timestep + pooled T5), tanh-gated residuals and a SwiGLU MLP (inner 8192
and 4096). The last block is ``context_pre_only``: the text stream only feeds the attention (no
text output projection, no text MLP). Simplification: RoPE over the flattened visual token index
with fixed frequencies (Mochi learns 3-D frequencies; the difference is elementwise and tiny).

Layer functions (``B`` videos, ``N`` visual tokens, ``T`` text tokens):
    embed ``(params, batch) -> (x [B,N,3072], y [B,T,1536], c [B,3072])`` with
        ``batch = {"latent": [B,C,F,H,W], "timestep": float32 [B], "text": [B,T,4096]}``;
    block ``(params, (x, y, c)) -> (x, y, c)``;
    head  ``(params, (x, y, c)) -> velocity [B,C,F,H,W]``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from zoo.config import ModelConfig
from zoo.layers import attention, layer_norm, rms_norm, rope, swiglu

T_FREQ = 256          # sinusoidal timestep features (Genmo TimestepEmbedder)
POOL_HEADS = 8        # AttentionPool heads over the T5 tokens


def batch_shapes(cfg: ModelConfig, batch: int) -> dict[str, jax.ShapeDtypeStruct]:
    dt = cfg.jnp_dtype
    return {"latent": jax.ShapeDtypeStruct((batch, cfg.latent_channels, cfg.latent_frames,
                                            cfg.latent_height, cfg.latent_width), dt),
            "timestep": jax.ShapeDtypeStruct((batch,), jnp.float32),
            "text": jax.ShapeDtypeStruct((batch, cfg.text_tokens, cfg.text_dim), dt)}


def embed_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, hy, td = cfg.hidden, cfg.hidden_y, cfg.text_dim
    pin = cfg.latent_channels * cfg.patch_size ** 2
    return {"x_proj": (pin, h), "x_proj_b": (h,),
            "t_mlp1": (T_FREQ, h), "t_mlp1_b": (h,), "t_mlp2": (h, h), "t_mlp2_b": (h,),
            "pool_kv": (td, 2 * td), "pool_kv_b": (2 * td,), "pool_q": (td, td), "pool_q_b": (td,),
            "pool_out": (td, h), "pool_out_b": (h,), "y_proj": (td, hy), "y_proj_b": (hy,)}


def block_shapes(cfg: ModelConfig, final: bool) -> dict[str, tuple[int, ...]]:
    h, hy, d, f, fy = cfg.hidden, cfg.hidden_y, cfg.head_dim, cfg.ffn, cfg.ffn_y
    s = {"mod_x": (h, 4 * h), "mod_x_b": (4 * h,),
         "mod_y": (h, (1 if final else 4) * hy), "mod_y_b": ((1 if final else 4) * hy,),
         "qkv_x": (h, 3 * h), "qkv_y": (hy, 3 * h),
         "q_norm_x": (d,), "k_norm_x": (d,), "q_norm_y": (d,), "k_norm_y": (d,),
         "proj_x": (h, h), "proj_x_b": (h,),
         "mlp_x_gate": (h, f), "mlp_x_up": (h, f), "mlp_x_down": (f, h)}
    if not final:
        s.update({"proj_y": (h, hy), "proj_y_b": (hy,),
                  "mlp_y_gate": (hy, fy), "mlp_y_up": (hy, fy), "mlp_y_down": (fy, hy)})
    return s


def head_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, pout = cfg.hidden, cfg.latent_channels * cfg.patch_size ** 2
    return {"mod": (h, 2 * h), "mod_b": (2 * h,), "out": (h, pout), "out_b": (pout,)}


def _timestep_features(t: jax.Array) -> jax.Array:
    half = T_FREQ // 2
    freqs = jnp.exp(-math.log(10000.0) * jnp.arange(half, dtype=jnp.float32) / half)
    ang = t.astype(jnp.float32)[:, None] * 1000.0 * freqs[None]
    return jnp.concatenate([jnp.cos(ang), jnp.sin(ang)], axis=-1)


def embed_fn(cfg: ModelConfig):
    p_, C = cfg.patch_size, cfg.latent_channels

    def embed(p: dict, batch: dict):
        lat = batch["latent"]
        B, _, F, Hh, W = lat.shape
        patches = lat.reshape(B, C, F, Hh // p_, p_, W // p_, p_)
        patches = patches.transpose(0, 2, 3, 5, 1, 4, 6).reshape(B, -1, C * p_ * p_)
        x = patches @ p["x_proj"] + p["x_proj_b"]
        dt = x.dtype
        tf = _timestep_features(batch["timestep"]).astype(dt)
        t = jax.nn.silu(tf @ p["t_mlp1"] + p["t_mlp1_b"]) @ p["t_mlp2"] + p["t_mlp2_b"]
        text = batch["text"]
        # AttentionPool: the mean token queries all T5 tokens (Genmo t5_y_embedder)
        kv = (text @ p["pool_kv"] + p["pool_kv_b"]).reshape(B, text.shape[1], 2, POOL_HEADS, -1)
        q = (jnp.mean(text, axis=1) @ p["pool_q"] + p["pool_q_b"]).reshape(B, 1, POOL_HEADS, -1)
        pooled = attention(q, kv[:, :, 0], kv[:, :, 1], causal=False).reshape(B, -1)
        c = t + pooled @ p["pool_out"] + p["pool_out_b"]
        y = text @ p["y_proj"] + p["y_proj_b"]
        return x, y, c
    return embed


def block_fn(cfg: ModelConfig, final: bool):
    H, d, eps = cfg.heads, cfg.head_dim, cfg.norm_eps

    def block(p: dict, xyc):
        x, y, c = xyc
        B, N, _ = x.shape
        T = y.shape[1]
        sc = jax.nn.silu(c)
        mx = (sc @ p["mod_x"] + p["mod_x_b"])[:, None, :]
        scale_msa_x, gate_msa_x, scale_mlp_x, gate_mlp_x = jnp.split(mx, 4, axis=-1)
        my = (sc @ p["mod_y"] + p["mod_y_b"])[:, None, :]
        scale_msa_y = my if final else jnp.split(my, 4, axis=-1)[0]
        # joint attention: per-stream modulated RMSNorm, QKV, per-head q/k RMSNorm, RoPE on x
        xa = rms_norm(x, None, eps) * (1 + scale_msa_x)
        ya = rms_norm(y, None, eps) * (1 + scale_msa_y)
        qx, kx, vx = jnp.split((xa @ p["qkv_x"]).reshape(B, N, 3 * H, d), 3, axis=2)
        qy, ky, vy = jnp.split((ya @ p["qkv_y"]).reshape(B, T, 3 * H, d), 3, axis=2)
        pos = jnp.arange(N)
        qx = rope(rms_norm(qx, p["q_norm_x"], eps), pos, 10000.0)
        kx = rope(rms_norm(kx, p["k_norm_x"], eps), pos, 10000.0)
        qy, ky = rms_norm(qy, p["q_norm_y"], eps), rms_norm(ky, p["k_norm_y"], eps)
        o = attention(jnp.concatenate([qx, qy], 1), jnp.concatenate([kx, ky], 1),
                      jnp.concatenate([vx, vy], 1), causal=False, impl=cfg.attention)
        ox, oy = o[:, :N].reshape(B, N, H * d), o[:, N:].reshape(B, T, H * d)
        x = x + rms_norm(ox @ p["proj_x"] + p["proj_x_b"], None, eps) * jnp.tanh(gate_msa_x)
        xm = rms_norm(x, None, eps) * (1 + scale_mlp_x)
        x = x + rms_norm(swiglu(xm, p["mlp_x_gate"], p["mlp_x_up"], p["mlp_x_down"]),
                         None, eps) * jnp.tanh(gate_mlp_x)
        if not final:
            _, gate_msa_y, scale_mlp_y, gate_mlp_y = jnp.split(my, 4, axis=-1)
            y = y + rms_norm(oy @ p["proj_y"] + p["proj_y_b"], None, eps) * jnp.tanh(gate_msa_y)
            ym = rms_norm(y, None, eps) * (1 + scale_mlp_y)
            y = y + rms_norm(swiglu(ym, p["mlp_y_gate"], p["mlp_y_up"], p["mlp_y_down"]),
                             None, eps) * jnp.tanh(gate_mlp_y)
        return x, y, c
    return block


def head_fn(cfg: ModelConfig):
    p_, C = cfg.patch_size, cfg.latent_channels
    F, Hh, W = cfg.latent_frames, cfg.latent_height, cfg.latent_width

    def head(p: dict, xyc):
        x, _, c = xyc
        B = x.shape[0]
        shift, scale = jnp.split((jax.nn.silu(c) @ p["mod"] + p["mod_b"])[:, None, :], 2, -1)
        x = layer_norm(x, None, None, 1e-6) * (1 + scale) + shift
        out = x @ p["out"] + p["out_b"]                                  # [B, N, C*p*p]
        out = out.reshape(B, F, Hh // p_, W // p_, C, p_, p_)
        return out.transpose(0, 4, 1, 2, 5, 3, 6).reshape(B, C, F, Hh, W)
    return head
