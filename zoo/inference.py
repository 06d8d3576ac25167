"""What a zoo decoder costs to serve: :class:`ir.InferenceModel` from a :class:`zoo.ModelConfig`.

Closed-form from the architecture (no JAX): a forward step's matmuls read every weight once and do
2 FLOP per weight per token (Kaplan et al. 2020, "Scaling Laws for Neural Language Models", Sec.
2.1: ``C_forward ~ 2 N`` per token, the attention term separate); attention does ``2 d`` FLOP for
each of QK^T and PV per head per (query, key) pair; the KV cache keeps one key and one value
vector per key/value head per layer per token (Pope et al. 2022, "Efficiently Scaling Transformer
Inference", Sec. 2-3), or for multi-head latent attention the ``kv_lora_rank`` latent plus the
shared rotary key (DeepSeek-AI 2024, "DeepSeek-V2", Sec. 2.1.2: MLA caches
``(d_c + d_h^R) l`` elements per token).

Weight formats. ``precision`` is one format for every weight (``"bf16"``, ``"fp8"``, ``"bfp8"``,
...; :data:`ir.WEIGHT_FORMATS`) or a default followed by per-part overrides,
``"bfp8,gate_up=bfp4"``: parts are ``attention`` (q, k, v, o projections), ``gate_up`` (the MLP's
gate and up projections, or GeLU's up), ``down`` (its down projection), ``head`` (the output
head). Tenstorrent's tt-transformers "performance" precision, for instance, is bfp4 gate/up
(FF1/FF3) and bfp8 everywhere else: ``"bfp8,gate_up=bfp4"``. Routed experts take the MLP parts'
formats. Norms, biases and the router stay at 2 bytes (bf16), as the engines keep them.
"""

from __future__ import annotations

from ir import InferenceModel
from ir.serving import MATMUL_DTYPE, format_bytes
from zoo.config import ModelConfig, ZooError, get_config, shard_dims

PARTS = ("attention", "gate_up", "down", "head")
"""The weight groups a precision can set one by one."""

SMALL_BYTES = 2.0
"""Bytes per norm / bias / router value (bf16)."""


def parse_precision(precision: str) -> dict[str, str]:
    """``"bfp8,gate_up=bfp4"`` -> ``{"attention": "bfp8", "gate_up": "bfp4", "down": "bfp8",
    "head": "bfp8"}``.

    Raises:
        ZooError: an unknown part or format, or no default format first.
    """
    items = [s.strip() for s in precision.split(",") if s.strip()]
    if not items or "=" in items[0]:
        raise ZooError(f"precision {precision!r} must start with a default format, e.g. 'bf16' or "
                       "'bfp8,gate_up=bfp4'")
    try:
        format_bytes(items[0])
    except ValueError as e:
        raise ZooError(str(e)) from None
    out = dict.fromkeys(PARTS, items[0])
    for item in items[1:]:
        part, _, fmt = item.partition("=")
        if part not in PARTS:
            raise ZooError(f"unknown weight part {part!r} in precision {precision!r}; fix: use "
                           f"{', '.join(PARTS)}")
        try:
            format_bytes(fmt)
        except ValueError as e:
            raise ZooError(str(e)) from None
        out[part] = fmt
    return out


def _attention_params(cfg: ModelConfig) -> tuple[int, int]:
    """(projection weights of one block's attention, KV-cache elements per token per layer)."""
    h, d = cfg.hidden, cfg.head_dim
    if cfg.mla:
        qk = d + cfg.qk_rope_head_dim
        q = (h * cfg.q_lora_rank + cfg.q_lora_rank * cfg.heads * qk if cfg.q_lora_rank
             else h * cfg.heads * qk)
        kv = (h * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)
              + cfg.kv_lora_rank * cfg.heads * (d + cfg.v_head_dim))
        o = cfg.heads * cfg.v_head_dim * h
        return q + kv + o, cfg.kv_lora_rank + cfg.qk_rope_head_dim
    return h * d * (cfg.heads + 2 * cfg.kv_heads) + cfg.heads * d * h, 2 * cfg.kv_heads * d


def _mlp_params(cfg: ModelConfig, width: int) -> tuple[int, int]:
    """(gate+up, down) weights of one MLP of inner width ``width``."""
    gates = 2 if cfg.mlp == "swiglu" else 1
    return gates * cfg.hidden * width, width * cfg.hidden


def inference_model(cfg: ModelConfig | str, precision: str = "bf16",
                    kv_format: str = "bf16") -> InferenceModel:
    """The per-token serving costs of decoder ``cfg`` at ``precision`` and ``kv_format``.

    Raises:
        ZooError: a model that is not a decoder (Mochi), or a bad precision / KV format.
    """
    cfg = get_config(cfg) if isinstance(cfg, str) else cfg
    if cfg.family == "mochi" or cfg.vocab == 0:
        raise ZooError(f"{cfg.name} is not a decoder language model; fix: serve a decoder "
                       "(llama3-8b, llama3-70b, a Hugging Face config.json, ...)")
    fmt = parse_precision(precision)
    try:
        kv_b = format_bytes(kv_format)
    except ValueError as e:
        raise ZooError(str(e)) from None
    b = {p: format_bytes(f) for p, f in fmt.items()}
    h, L = cfg.hidden, cfg.layers
    attn, kv_elems = _attention_params(cfg)
    moe_layers = L - cfg.dense_layers if cfg.moe else 0
    dense_gu, dense_dn = _mlp_params(cfg, cfg.ffn)
    exp_gu, exp_dn = _mlp_params(cfg, cfg.expert_ffn) if cfg.moe else (0, 0)
    shared = cfg.shared_experts
    # norm weights (and LayerNorm biases), MLA's two latent norms, linear biases: bf16, read
    norms = 2 * h * L + h
    if cfg.norm == "layer" and cfg.bias:
        norms *= 2
    if cfg.mla:
        norms += (cfg.q_lora_rank + cfg.kv_lora_rank) * L
    if cfg.bias:
        gates = 2 if cfg.mlp == "swiglu" else 1
        norms += L * ((cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim + h + gates * cfg.ffn + h)
    router = moe_layers * cfg.experts * h

    dense_mlp_layers = L - moe_layers
    gate_up = dense_mlp_layers * dense_gu + moe_layers * shared * exp_gu
    down = dense_mlp_layers * dense_dn + moe_layers * shared * exp_dn
    head = h * cfg.vocab
    dense_bytes = (L * attn * b["attention"] + gate_up * b["gate_up"] + down * b["down"]
                   + head * b["head"] + (norms + router) * SMALL_BYTES)
    expert_bytes = moe_layers * cfg.experts * (exp_gu * b["gate_up"] + exp_dn * b["down"])
    k = cfg.experts_per_token if cfg.moe else 0
    flops: dict[str, float] = {}
    for part, weights in (("attention", L * attn),
                          ("gate_up", gate_up + moe_layers * k * exp_gu),
                          ("down", down + moe_layers * k * exp_dn), ("head", head)):
        dtype = MATMUL_DTYPE[fmt[part]]
        flops[dtype] = flops.get(dtype, 0.0) + 2.0 * weights
    if cfg.mla:
        qk, v = cfg.head_dim + cfg.qk_rope_head_dim, cfg.v_head_dim
    else:
        qk = v = cfg.head_dim
    embedding = 0.0 if cfg.tie_embeddings else cfg.vocab * h * SMALL_BYTES
    if cfg.pos_emb == "learned":
        embedding += cfg.seq_len * h * SMALL_BYTES
    return InferenceModel(
        name=cfg.name, layers=L, hidden=h, vocab=cfg.vocab, kv_heads=1 if cfg.mla else cfg.kv_heads,
        weight_format=precision, kv_format=kv_format,
        dense_weight_bytes=float(dense_bytes), expert_weight_bytes=float(expert_bytes),
        experts=cfg.experts if cfg.moe else 0, experts_per_token=k, moe_layers=moe_layers,
        flops_per_token=tuple(sorted(flops.items())),
        attention_flops_per_pair=float(2 * L * cfg.heads * (qk + v)),
        kv_bytes_per_token=float(L * kv_elems * kv_b),
        tp_allreduce_bytes_per_token=float(2 * L * h * SMALL_BYTES),
        embedding_bytes=float(embedding), shards=shard_dims(cfg))
