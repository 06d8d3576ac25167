"""Decoder-only language models: the Llama family and the GPT family.

Llama (Dubey et al. 2024; Touvron et al. 2023): token embedding; blocks of pre-RMSNorm grouped-query
attention with RoPE and a SwiGLU MLP, no biases; final RMSNorm and an untied output head.
GPT (Radford et al. 2019; Brown et al. 2020; Megatron-LM, Shoeybi et al. 2019): token plus learned
position embedding; blocks of pre-LayerNorm multi-head attention and a 4h GeLU MLP, with biases;
final LayerNorm and the output head (tied to the embedding in the published models).

Layer functions (all shapes ``B`` samples of ``S`` tokens, width ``h``):
    embed ``(params, tokens int32 [B,S]) -> x [B,S,h]``;
    block ``(params, x [B,S,h]) -> x [B,S,h]``;
    head  ``(params, x [B,S,h], targets int32 [B,S]) -> mean cross-entropy (float32 scalar)``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from zoo import gated_deltanet, hybrid
from zoo.config import ModelConfig
from zoo.layers import (attention, cross_entropy, gelu_mlp, layer_norm, moe_swiglu, relu_mlp,
                        rms_norm, rope, swiglu)

MTP = "mtp_"
"""Prefix of the multi-token-prediction module's block parameters in the head
(``zoo.ModelConfig.mtp_layers``)."""

EXPERT_BIASES = ("w_router_b", "w_gate_b", "w_up_b", "w_down_b")
"""A mixture of experts' router and expert biases (``bias`` on a MoE block: gpt-oss)."""


def embed_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    s: dict[str, tuple[int, ...]] = {"tok": (cfg.vocab, cfg.hidden)}
    if cfg.pos_emb == "learned":
        s["pos"] = (cfg.seq_len, cfg.hidden)
    return s


def _mla_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Multi-head latent attention's weights (DeepSeek-V2, Sec. 2.1; ``zoo.ModelConfig``)."""
    h, H, dn, dr, dv = cfg.hidden, cfg.heads, cfg.head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    s: dict[str, tuple[int, ...]] = {"attn_norm": (h,)}
    if cfg.q_lora_rank:
        s.update(wq_a=(h, cfg.q_lora_rank), q_a_norm=(cfg.q_lora_rank,),
                 wq_b=(cfg.q_lora_rank, H * (dn + dr)))
    else:
        s.update(wq=(h, H * (dn + dr)))
    s.update(wkv_a=(h, cfg.kv_lora_rank + dr), kv_a_norm=(cfg.kv_lora_rank,),
             wkv_b=(cfg.kv_lora_rank, H * (dn + dv)), wo=(H * dv, h), mlp_norm=(h,))
    return s


def block_shapes(cfg: ModelConfig, dense: bool = False,
                 linear: bool = False) -> dict[str, tuple[int, ...]]:
    """One block's parameter shapes; ``dense``: a mixture of experts' dense first blocks;
    ``linear``: a Gated DeltaNet block (:mod:`zoo.gated_deltanet`) in place of attention."""
    h, d, H, KV, f = cfg.hidden, cfg.head_dim, cfg.heads, cfg.kv_heads, cfg.ffn
    s: dict[str, tuple[int, ...]]
    if linear:
        s = {"attn_norm": (h,), **gated_deltanet.shapes(cfg), "mlp_norm": (h,)}
    elif cfg.mla:
        s = _mla_shapes(cfg)
    else:
        gate = 2 if cfg.attention_output_gate else 1       # queries and their output gate
        s = {"attn_norm": (h,), "wq": (h, gate * H * d), "wk": (h, KV * d), "wv": (h, KV * d),
             "wo": (H * d, h), "mlp_norm": (h,)}
    if cfg.attention_sinks and not linear:
        s["sinks"] = (H,)
    if cfg.moe and not dense:
        E, fe = cfg.experts, cfg.expert_ffn
        s.update(w_router=(h, E), w_gate=(E, h, fe), w_up=(E, h, fe), w_down=(E, fe, h))
        if cfg.bias:
            s.update(w_router_b=(E,), w_gate_b=(E, fe), w_up_b=(E, fe), w_down_b=(E, h))
        if cfg.shared_experts:
            fs = cfg.shared_experts * fe
            s.update(ws_gate=(h, fs), ws_up=(h, fs), ws_down=(fs, h))
            if cfg.shared_expert_gate:
                s["ws_router"] = (h, 1)
    elif cfg.mlp == "swiglu":
        s.update(w_gate=(h, f), w_up=(h, f), w_down=(f, h))
    else:
        s.update(w_in=(h, f), w_out=(f, h))
    if cfg.bias and not linear:
        s.update(wq_b=(H * d,), wk_b=(KV * d,), wv_b=(KV * d,), wo_b=(h,))
        if cfg.mlp in ("gelu", "relu"):
            s.update(w_in_b=(f,), w_out_b=(h,))
    if cfg.norm == "layer":
        s.update(attn_norm_b=(h,), mlp_norm_b=(h,))
    return s


def head_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The final norm and output head; with ``mtp_layers``, also the multi-token-prediction
    module (``zoo.ModelConfig``): its two input norms, the ``2h x h`` projection, one
    mixture-of-experts block (:data:`MTP`-prefixed; a hybrid model's ``mtp_pattern`` layers,
    ``mtp_<i>_``-prefixed), its output norm and the head's copy of the embedding table (shared
    with the input embedding)."""
    h = cfg.hidden
    s: dict[str, tuple[int, ...]] = {"norm": (h,), "out": (h, cfg.vocab)}
    if cfg.norm == "layer":
        s["norm_b"] = (h,)
    if cfg.mtp_layers:
        s.update(tok=(cfg.vocab, h), mtp_hnorm=(h,), mtp_enorm=(h,), mtp_proj=(2 * h, h),
                 mtp_head_norm=(h,))
        if cfg.hybrid:      # one module of mtp_pattern's layers, run mtp_layers times
            for i, ch in enumerate(cfg.mtp_pattern):
                s.update({f"{MTP}{i}_{k}": v
                          for k, v in hybrid.block_shapes(cfg, hybrid.BODIES[ch]).items()})
        else:
            s.update({MTP + k: v for k, v in block_shapes(cfg).items()})
    return s


def _norm(cfg: ModelConfig, p: dict, name: str, x: jax.Array) -> jax.Array:
    if cfg.norm == "rms":
        return rms_norm(x, p[name], cfg.norm_eps)
    return layer_norm(x, p[name], p[name + "_b"], cfg.norm_eps)


def embed_fn(cfg: ModelConfig):
    def embed(p: dict, tokens: jax.Array) -> jax.Array:
        x = jnp.take(p["tok"], tokens, axis=0)
        if cfg.pos_emb == "learned":
            x = x + p["pos"][: tokens.shape[1]][None]
        return x
    return embed


def _mla(cfg: ModelConfig, p: dict, a: jax.Array) -> jax.Array:
    """Multi-head latent attention of the normed input ``a`` ``[B, S, h]`` -> ``[B, S, H x dv]``:
    queries (through the rank-``q_lora_rank`` bottleneck when set) and the key-value latent, each
    head's key the latent's ``head_size`` part plus the rotary part shared by all heads."""
    B, S, _ = a.shape
    H, dn, dr, dv = cfg.heads, cfg.head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    if cfg.q_lora_rank:
        q = rms_norm(a @ p["wq_a"], p["q_a_norm"], cfg.norm_eps) @ p["wq_b"]
    else:
        q = a @ p["wq"]
    q = q.reshape(B, S, H, dn + dr)
    kv_a = a @ p["wkv_a"]
    latent = rms_norm(kv_a[..., :cfg.kv_lora_rank], p["kv_a_norm"], cfg.norm_eps)
    kv = (latent @ p["wkv_b"]).reshape(B, S, H, dn + dv)
    pos = jnp.arange(S)
    q_rope = rope(q[..., dn:], pos, cfg.rope_theta)
    k_rope = rope(kv_a[..., cfg.kv_lora_rank:].reshape(B, S, 1, dr), pos, cfg.rope_theta)
    q = jnp.concatenate([q[..., :dn], q_rope], axis=-1)
    k = jnp.concatenate([kv[..., :dn], jnp.broadcast_to(k_rope, (B, S, H, dr))], axis=-1)
    o = attention(q, k, kv[..., dn:], causal=True, impl=cfg.attention)
    return o.reshape(B, S, H * dv)


def block_fn(cfg: ModelConfig, dense: bool = False, window: int = 0, linear: bool = False):
    """One block as a function ``(p, x [B, S, h]) -> [B, S, h]``; ``dense``: a mixture of
    experts' dense first blocks (a SwiGLU MLP of width ``ffn``); ``window``: its attention's
    sliding window (0: full causal attention); ``linear``: Gated DeltaNet in place of
    attention (:mod:`zoo.gated_deltanet`)."""
    H, KV, d = cfg.heads, cfg.kv_heads, cfg.head_dim

    def lin(p, name, x):
        y = x @ p[name]
        return y + p[name + "_b"] if cfg.bias else y

    def block(p: dict, x: jax.Array) -> jax.Array:
        B, S, _ = x.shape
        a = _norm(cfg, p, "attn_norm", x)
        if linear:
            return _mlp(p, x + gated_deltanet.gated_deltanet(cfg, p, a))
        if cfg.mla:
            o = _mla(cfg, p, a)
        else:
            q = lin(p, "wq", a)
            gate = None
            if cfg.attention_output_gate:      # Qwen3-Next: per head, queries then the gate
                q, gate = jnp.split(q.reshape(B, S, H, 2 * d), 2, axis=-1)
            q = q.reshape(B, S, H, d)
            k = lin(p, "wk", a).reshape(B, S, KV, d)
            v = lin(p, "wv", a).reshape(B, S, KV, d)
            if cfg.pos_emb == "rope":
                pos = jnp.arange(S)
                q, k = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
            o = attention(q, k, v, causal=True, impl=cfg.attention, window=window,
                          sinks=p.get("sinks"))
            if gate is not None:
                o = o * jax.nn.sigmoid(gate)
            o = o.reshape(B, S, H * d)
        return _mlp(p, x + lin(p, "wo", o))

    def _mlp(p: dict, x: jax.Array) -> jax.Array:
        m = _norm(cfg, p, "mlp_norm", x)
        limit = cfg.swiglu_limit
        if cfg.moe and not dense:
            y = moe_swiglu(m, p["w_router"], p["w_gate"], p["w_up"], p["w_down"],
                           top_k=cfg.experts_per_token, capacity_factor=cfg.capacity_factor,
                           biases={k: p[k] for k in EXPERT_BIASES if k in p}, limit=limit)
            if cfg.shared_experts:
                shared = swiglu(m, p["ws_gate"], p["ws_up"], p["ws_down"], limit)
                if cfg.shared_expert_gate:
                    shared = shared * jax.nn.sigmoid(m @ p["ws_router"])
                y = y + shared
            return x + y
        if cfg.mlp == "swiglu":
            return x + swiglu(m, p["w_gate"], p["w_up"], p["w_down"], limit)
        mlp = relu_mlp if cfg.mlp == "relu" else gelu_mlp
        return x + mlp(m, p["w_in"], p["w_in_b"], p["w_out"], p["w_out_b"])
    return block


def head_fn(cfg: ModelConfig):
    """``(p, x [B, S, h], targets int32 [B, S]) -> loss``: the mean cross-entropy of the next
    token; with ``mtp_layers``, plus that of the multi-token-prediction module (DeepSeek-V3
    Technical Report, Sec. 2.2): at position ``i`` it combines the last block's output with
    the embedding of token ``i + 1`` (``targets[i]``) and predicts token ``i + 2``
    (``targets[i + 1]``), through the same output head. A hybrid model runs its module
    ``mtp_layers`` times with the same weights: pass ``d`` takes the previous pass's output and
    the embedding of token ``i + d`` and predicts token ``i + d + 1`` (Megatron-Core's
    ``--mtp-use-repeated-layer``)."""
    block = block_fn(cfg)
    layers = [(f"{MTP}{i}_", hybrid.block_fn(cfg, hybrid.BODIES[ch]))
              for i, ch in enumerate(cfg.mtp_pattern)] if cfg.hybrid else []

    def module(p: dict, x: jax.Array) -> jax.Array:
        if not cfg.hybrid:
            return block({k[len(MTP):]: v for k, v in p.items() if k.startswith(MTP)}, x)
        for pre, fn in layers:
            x = fn({k[len(pre):]: v for k, v in p.items() if k.startswith(pre)}, x)
        return x

    def logits(p: dict, norm: str, x: jax.Array) -> jax.Array:
        return jnp.einsum("bsh,hv->bsv", _norm(cfg, p, norm, x), p["out"],
                          preferred_element_type=jnp.float32)

    def head(p: dict, x: jax.Array, targets: jax.Array) -> jax.Array:
        loss = cross_entropy(logits(p, "norm", x), targets)
        y = x
        for d in range(1, cfg.mtp_layers + 1):
            # token i + d at position i (the positions past the end wrap and get no loss)
            nxt = targets if d == 1 else jnp.roll(targets, 1 - d, axis=1)
            e = jnp.take(p["tok"], nxt, axis=0)
            both = jnp.concatenate([rms_norm(y, p["mtp_hnorm"], cfg.norm_eps),
                                    rms_norm(e, p["mtp_enorm"], cfg.norm_eps)], axis=-1)
            y = module(p, both @ p["mtp_proj"])
            loss = loss + cross_entropy(logits(p, "mtp_head_norm", y)[:, :-d], targets[:, d:])
        return loss
    return head
