"""What a valid model description is: the one check every model source passes.

A :class:`zoo.config.ModelConfig` reaches the cost model and JAX from five sources: a zoo entry
with overrides (:func:`zoo.config.get_config`, which is also how ``--seq-len`` and a plan's
sequence length are applied), :func:`zoo.config.gpt_config` (validation rows), a Hugging Face
``config.json`` and a YAML model spec (:mod:`zoo.model_files`), and the fields a plan carries
(:func:`zoo.model_files.plan_model`). Each ends in :func:`check_model`, which checks, in order:

1. **types**: every field has its declared type (an ``int`` field takes an integer, never a
   bool; a ``float`` field a finite number; a ``str`` field a string);
2. **ranges**: counts are at least 0, sizes at least 1, and every one at most its
   :data:`LIMITS` entry; ``rope_theta``, ``norm_eps`` and ``capacity_factor`` lie in
   :data:`FLOAT_RANGES`; the name matches :data:`ir.files.NAME_PATTERN` (a plan file names its
   model, and its reader refuses any other name);
3. **vocabularies**: :data:`CHOICES`;
4. **relations**: key/value heads divide the heads; the heads divide the width unless
   ``head_size`` is set; rotary heads are even-width; a mixture of experts has 1 <= top-k <=
   experts, an expert width, and fewer dense first layers than layers, and a dense model sets
   none of those; multi-head latent attention sets its ranks and head widths together or not at
   all; a Mochi DiT sets its video fields (patches tiling the latent), no other family sets them
   (the Mochi VAE decoder only the latent's); a T5 encoder sets its relative position bias
   (:func:`_check_t5`) and a Mochi VAE decoder its stages (:func:`_check_vae`), no other family
   sets either.

A failure is one line naming the field (by the file's own key when the caller gives
``names``), its value and the fix: :class:`zoo.errors.ZooError`.

Why limits at all: the analytic cost model holds far larger numbers (a 65,536-layer Llama-style
spec plans on ``h100x16384_nodes.yaml`` in 22 s using 0.3 GB on the project's 2-core machine,
``python -m mpmd plan --model SPEC --cluster hardware_profiles/clusters/h100x16384_nodes.yaml
--global-batch 4096 --time-limit 5``, 2026-11-28), but a layer count of 10**9 grew the process by
about 300 MB/s until the kernel killed it, and a 10**12-entry vocabulary or a 0-token sequence
crashed inside JAX. Each limit is a power of two 16x or more above the largest published value
named beside it, so no real model is refused.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from ir.files import NAME_PATTERN
from ir.workload import ATTENTION_KERNELS
from zoo.errors import ZooError

ModelConfig = Any
"""A :class:`zoo.config.ModelConfig` (not imported: :mod:`zoo.config` imports this module)."""

__all__ = ["CHOICES", "FLOAT_RANGES", "LIMITS", "MAX_NAME", "check_model"]

LIMITS: dict[str, int] = {
    "layers": 2**14,           # deepest published decoder 126 (Llama 3 405B); DeepNet trained 1,000
    "hidden": 2**18,           # widest published 25,600 (Megatron-LM 1T, Narayanan et al. 2021)
    "ffn": 2**20,              # 53,248 (Llama 3 405B); 4 x 25,600 for GPT-style
    "heads": 2**12,            # 128 (Llama 3 405B, DeepSeek-V3)
    "kv_heads": 2**12,
    "head_size": 2**12,        # 256 (Gemma)
    "vocab": 2**24,            # 262,144 (Gemma 3)
    "seq_len": 2**22,          # 4 Mi tokens: what a plan file holds (ir.plan_file.LIMITS)
    "experts": 2**14,          # 256 routed (DeepSeek-V3)
    "experts_per_token": 2**14,
    "expert_ffn": 2**20,       # 2,048 (DeepSeek-V3), 16,384 (Mixtral 8x22B)
    "shared_experts": 2**10,   # 1 (DeepSeek-V3), 2 (DeepSeek-V2)
    "moe_latent": 2**18,       # 1,024 (Nemotron 3 Super), at most hidden
    "dense_layers": 2**14,
    "q_lora_rank": 2**16,      # 1,536 (DeepSeek-V3)
    "kv_lora_rank": 2**16,     # 512 (DeepSeek-V3)
    "qk_rope_head_dim": 2**12,  # 64 (DeepSeek-V3)
    "v_head_dim": 2**12,       # 128 (DeepSeek-V3)
    "hidden_y": 2**18, "ffn_y": 2**20,   # Mochi: 1,536 / 4,096
    "text_tokens": 2**16, "text_dim": 2**16,   # 256 tokens of T5-XXL width 4,096
    "latent_channels": 2**10, "latent_frames": 2**12,   # 12 channels, 28 frames
    "latent_height": 2**14, "latent_width": 2**14,      # 60 x 106
    "patch_size": 2**8, "sampling_steps": 2**16, "cfg_passes": 2**4,   # 2, 64, 2
    "sliding_window": 2**22,   # 4,096 (Mistral 7B v0.1), 128 (gpt-oss); at most the sequence
    "full_attention_every": 2**14,   # 2 (gpt-oss, Gemma 2), 6 (Gemma 3)
    "mtp_layers": 2**4,        # 1 (DeepSeek-V3), 2 passes (Nemotron 3 Super); at most 4
    "mamba_heads": 2**12, "mamba_head_dim": 2**12,   # 64 x 64 (Nemotron 3 Nano), 256 (H-56B)
    "ssm_state": 2**12, "mamba_groups": 2**12,       # 128, 8 (Nemotron-H)
    "conv_kernel": 2**6, "ssm_chunk": 2**16,         # 4, 128 (Nemotron-H)
    "full_attention_interval": 2**14,                # 4 (Qwen3-Next)
    "linear_key_heads": 2**12, "linear_value_heads": 2**12,        # 16, 32 (Qwen3-Next)
    "linear_key_head_dim": 2**12, "linear_value_head_dim": 2**12,  # 128, 128
    "linear_conv_kernel": 2**6, "linear_chunk": 2**12,             # 4, 64
    "relative_buckets": 2**12, "relative_max_distance": 2**16,   # 32, 128 (T5 v1.1)
    "out_channels": 2**6, "norm_groups": 2**10,      # 3 (RGB), 32 (Mochi VAE GroupNorm)
    "rope_original_max_position": 2**24,             # 4,096 (YaRN: DeepSeek-V3), 8,192 (Llama 3.1)
}
"""Largest value of each integer field (counts; tokens; widths in elements)."""

FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "rope_theta": (1.0, 1e12),         # 10,000 (RoPE) to 1,000,000 (Qwen3); open at neither end
    "norm_eps": (1e-30, 0.1),          # 1e-5 / 1e-6 published
    "capacity_factor": (1e-3, 64.0),   # 1.0-2.0 (GShard, Switch Transformer)
    "swiglu_limit": (0.0, 1e6),        # 7.0 (gpt-oss); 0: no clamp
    "rope_factor": (1e-3, 1e6),        # 8 (Llama 3.1), 32 (gpt-oss, Kimi K2), 40 (DeepSeek-V3)
    "rope_low_freq_factor": (0.0, 1e6), "rope_high_freq_factor": (0.0, 1e6),   # 1, 4 (Llama 3.1)
    "rope_beta_fast": (0.0, 1e6), "rope_beta_slow": (0.0, 1e6),   # 32, 1 (YaRN's defaults)
    "rope_mscale": (0.0, 1e6), "rope_mscale_all_dim": (0.0, 1e6),   # 1, 1 (DeepSeek-V3)
}
"""Closed range of each float field."""

TUPLE_LIMITS: dict[str, int] = {
    "vae_channels": 2**14,          # 768 (Mochi VAE decoder)
    "vae_blocks": 2**10,            # 6
    "temporal_expansions": 2**6, "spatial_expansions": 2**6,   # 3, 2
}
"""Largest entry of each tuple field (at most :data:`MAX_STAGES` entries, each at least 1)."""

MAX_STAGES = 16
"""Most entries of a tuple field (the Mochi VAE decoder has 5 stages)."""

CHOICES: dict[str, tuple[str, ...]] = {
    "family": ("llama", "gpt", "mochi", "t5", "mochi_vae"), "norm": ("rms", "layer"),
    "mlp": ("swiglu", "gelu", "relu", "relu2"), "pos_emb": ("rope", "learned", "none", "relative"),
    "dtype": ("bfloat16", "float16", "float32"), "attention_kernel": tuple(ATTENTION_KERNELS),
    "attention": ("plain", "flash", "fused"), "rope_scaling": ("", "linear", "llama3", "yarn")}
"""The fields with a fixed vocabulary, and their values."""

MAX_NAME = 200
"""Longest model name (a plan file's limit)."""

_AT_LEAST_ONE = ("layers", "hidden", "heads", "kv_heads", "ffn", "seq_len")
_MOCHI = ("hidden_y", "ffn_y", "text_tokens", "text_dim", "latent_channels", "latent_frames",
          "latent_height", "latent_width", "patch_size", "sampling_steps", "cfg_passes")
_LATENT = ("latent_channels", "latent_frames", "latent_height", "latent_width")
_MOE = ("experts_per_token", "expert_ffn", "shared_experts", "moe_latent", "dense_layers")
_MLA = ("q_lora_rank", "qk_rope_head_dim", "v_head_dim")


def check_model(cfg: ModelConfig, where: str = "", names: Mapping[str, str] | None = None
                ) -> ModelConfig:
    """``cfg`` itself when it is a valid model description (module docstring), else an error.

    Args:
        cfg: the model description.
        where: what it was read from, prefixed to the message (``"Qwen3-8B.json (Hugging Face
            config)"``); default: the model's name.
        names: the source's own key for a field (``{"kv_heads": "num_key_value_heads"}``), so a
            message names what the user wrote.

    Raises:
        ZooError: the first bad field: one line naming it, its value and the fix.
    """
    label = dict(names or {})

    def key(field: str) -> str:
        return label.get(field, field)

    def bad(field: str, problem: str, fix: str) -> ZooError:
        value = getattr(cfg, field)
        at = where or f"model {cfg.name!r}"
        return ZooError(" ".join(f"{at}: {key(field)} = {value!r} {problem}; fix: {fix}".split()))

    _check_types(cfg, bad)
    _check_ranges(cfg, bad)
    _check_relations(cfg, bad, key)
    return cfg


def _check_types(cfg: ModelConfig, bad: Any) -> None:
    for f in dataclasses.fields(cfg):
        v, kind = getattr(cfg, f.name), str(f.type)
        if kind == "int" and (isinstance(v, bool) or not isinstance(v, int)):
            raise bad(f.name, "is not an integer", "give a whole number")
        if kind == "bool" and not isinstance(v, bool):
            raise bad(f.name, "is not true or false", "give true or false")
        if kind == "str" and not isinstance(v, str):
            raise bad(f.name, "is not a string", "give a string")
        if kind == "float" and (isinstance(v, bool) or not isinstance(v, (int, float))
                                or not math.isfinite(v)):
            raise bad(f.name, "is not a finite number", "give a number such as 1.5")
        if kind.startswith("tuple") and (not isinstance(v, tuple) or any(
                isinstance(x, bool) or not isinstance(x, int) for x in v)):
            raise bad(f.name, "is not a tuple of whole numbers", "give whole numbers, e.g. (1, 2)")


def _check_ranges(cfg: ModelConfig, bad: Any) -> None:
    if not re.match(NAME_PATTERN, cfg.name) or len(cfg.name) > MAX_NAME:
        raise bad("name", f"is not a model name (letters, digits and _ . + - only, at most "
                  f"{MAX_NAME} characters)", "rename the model or its file")
    for field, choices in CHOICES.items():
        if getattr(cfg, field) not in choices:
            raise bad(field, f"is not one of {', '.join(choices)}", f"use one of {', '.join(choices)}")
    for field, limit in LIMITS.items():
        v = getattr(cfg, field)
        least = 1 if field in _AT_LEAST_ONE or (field == "vocab" and cfg.family not in
                                                 ("mochi", "mochi_vae")) else 0
        if v < least:
            raise bad(field, f"is below {least}", f"give at least {least}")
        if v > limit:
            raise bad(field, f"is over the limit {limit:,} (far above any published model; the "
                      f"cost model's tables and the traced program grow with it)",
                      f"give at most {limit:,}")
    for field, (lo, hi) in FLOAT_RANGES.items():
        if not lo <= getattr(cfg, field) <= hi:
            raise bad(field, f"is outside [{lo:g}, {hi:g}]", f"give a value in [{lo:g}, {hi:g}]")
    for field, limit in TUPLE_LIMITS.items():
        v = getattr(cfg, field)
        if len(v) > MAX_STAGES or any(not 1 <= x <= limit for x in v):
            raise bad(field, f"has more than {MAX_STAGES} entries or one outside [1, {limit:,}]",
                      f"give at most {MAX_STAGES} entries, each 1 to {limit:,}")


def _check_relations(cfg: ModelConfig, bad: Any, key: Any) -> None:
    if cfg.head_size == 0 and cfg.hidden % cfg.heads:
        raise bad("hidden", f"is not divisible by {key('heads')} = {cfg.heads}",
                  f"pick heads dividing the width, or set {key('head_size')}")
    if cfg.kv_heads > cfg.heads or cfg.heads % cfg.kv_heads:
        raise bad("kv_heads", f"does not divide {key('heads')} = {cfg.heads} (each key/value head "
                  f"serves a whole group of query heads)", f"give a divisor of {cfg.heads}")
    if cfg.pos_emb == "rope" and not cfg.mla and cfg.head_dim % 2:
        field = "head_size" if cfg.head_size else "hidden"
        raise bad(field, f"gives odd-width heads ({cfg.head_dim}), which rotary embeddings "
                  "cannot rotate in pairs", "use an even head width")
    _check_experts(cfg, bad, key)
    _check_window(cfg, bad, key)
    _check_hybrid(cfg, bad, key)
    _check_linear(cfg, bad, key)
    _check_mla(cfg, bad, key)
    _check_mochi(cfg, bad, key)
    _check_t5(cfg, bad, key)
    _check_vae(cfg, bad, key)


def _check_experts(cfg: ModelConfig, bad: Any, key: Any) -> None:
    if not cfg.moe:
        for field in _MOE:
            if getattr(cfg, field):
                raise bad(field, f"is set but {key('experts')} = 0 (a dense model)",
                          f"set {key('experts')} or drop {key(field)}")
        return
    if not 1 <= cfg.experts_per_token <= cfg.experts:
        raise bad("experts_per_token", f"is not between 1 and the {cfg.experts} experts",
                  f"route each token to 1 to {cfg.experts} experts")
    if cfg.expert_ffn < 1:
        raise bad("expert_ffn", "is not set for a mixture of experts", "give each expert's width")
    if cfg.moe_latent and not cfg.hybrid:
        raise bad("moe_latent", "is set on a model that is not a Mamba hybrid (the zoo runs "
                  "LatentMoE in nemotron_h models)", f"drop {key('moe_latent')}")
    if cfg.moe_latent > cfg.hidden:
        raise bad("moe_latent", f"is wider than hidden = {cfg.hidden}", "give a latent width "
                  "at most the hidden size")
    if cfg.dense_layers >= cfg.layers:
        raise bad("dense_layers", f"leaves no mixture-of-experts layer of the {cfg.layers}",
                  f"give fewer than {cfg.layers} dense first layers")


def _check_window(cfg: ModelConfig, bad: Any, key: Any) -> None:
    if cfg.full_attention_every and not cfg.sliding_window:
        raise bad("full_attention_every", f"is set but {key('sliding_window')} = 0 (no sliding "
                  "layers)", f"set {key('sliding_window')} or drop {key('full_attention_every')}")
    if cfg.sliding_window and (cfg.family == "mochi" or cfg.mla or cfg.dense_layers):
        raise bad("sliding_window", "is set on a model whose attention the zoo runs full (a Mochi "
                  "DiT, latent attention or dense first blocks)", f"drop {key('sliding_window')}")
    if cfg.attention_sinks and (cfg.family == "mochi" or cfg.mla):
        raise bad("attention_sinks", "is set on a Mochi DiT or latent attention, which the zoo "
                  "runs without sinks", f"drop {key('attention_sinks')}")
    if cfg.swiglu_limit and cfg.mlp != "swiglu":
        raise bad("swiglu_limit", f"clamps a SwiGLU but {key('mlp')} = {cfg.mlp!r}",
                  f"drop {key('swiglu_limit')}")
    if cfg.mtp_pattern and not (cfg.hybrid and cfg.mtp_layers):
        raise bad("mtp_pattern", "is set on a model that is not a hybrid with mtp_layers",
                  f"drop {key('mtp_pattern')} or set {key('mtp_layers')} on a hybrid model")
    if cfg.hybrid and cfg.mtp_layers:
        if (cfg.mtp_layers > 4 or not cfg.mtp_pattern or len(cfg.mtp_pattern) > 8
                or set(cfg.mtp_pattern) - set("M*-E")):
            raise bad("mtp_layers", "on a hybrid model is 1 to 4 passes of one module whose "
                      f"layers {key('mtp_pattern')} names (M, *, - or E; got "
                      f"{cfg.mtp_pattern[:20]!r})", f"give {key('mtp_layers')} 1 to 4 and an "
                      f"{key('mtp_pattern')} such as '*E'")
    elif cfg.mtp_layers and (cfg.mtp_layers > 1 or not cfg.moe or cfg.family != "llama"):
        raise bad("mtp_layers", "is not 0 or 1 on a llama-family mixture of experts (the zoo "
                  "models DeepSeek-V3's one multi-token-prediction module)",
                  f"give {key('mtp_layers')} 0 or 1 on a mixture of experts")


_MAMBA = ("mamba_heads", "mamba_head_dim", "ssm_state", "mamba_groups", "conv_kernel", "ssm_chunk")


def _check_hybrid(cfg: ModelConfig, bad: Any, key: Any) -> None:
    if not cfg.hybrid_pattern:
        for field in _MAMBA:
            if getattr(cfg, field):
                raise bad(field, f"is set but {key('hybrid_pattern')} is empty (no Mamba layers)",
                          f"give {key('hybrid_pattern')} or drop {key(field)}")
        if cfg.mlp == "relu2" and cfg.family != "llama":
            raise bad("mlp", "is the squared ReLU of a llama-family block only", "use gelu or relu")
        return
    p = cfg.hybrid_pattern
    if set(p) - set("M*-E") or len(p) != cfg.layers or cfg.family != "llama":
        raise bad("hybrid_pattern", f"is not {cfg.layers} characters of M (Mamba-2), * "
                  f"(attention), - (MLP) and E (experts) on a llama-family model",
                  f"give one character per layer ({key('layers')} = {cfg.layers})")
    if ("E" in p) != cfg.moe:
        raise bad("hybrid_pattern", f"has {'no ' if 'E' not in p else ''}E layers but "
                  f"{key('experts')} = {cfg.experts}", "give experts exactly when E layers exist")
    if "M" in p:
        for field in _MAMBA:
            if getattr(cfg, field) < 1:
                raise bad(field, "is not set for the Mamba-2 layers", f"give {key(field)}")
        if cfg.mamba_heads % cfg.mamba_groups:
            raise bad("mamba_groups", f"does not divide {key('mamba_heads')} = "
                      f"{cfg.mamba_heads}", "give a divisor of the Mamba heads")
    if cfg.dense_layers or cfg.mla or cfg.sliding_window or cfg.bias:
        raise bad("hybrid_pattern", "is combined with dense first layers, latent attention, "
                  "a sliding window or biases, which the hybrid layers do not model",
                  "drop those fields")


_LINEAR = ("full_attention_interval", "linear_key_heads", "linear_value_heads",
           "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel", "linear_chunk")


def _check_linear(cfg: ModelConfig, bad: Any, key: Any) -> None:
    """Gated DeltaNet blocks (Qwen3-Next): every width set, value heads a multiple of the key
    heads, on a llama-family decoder without the extras its blocks do not model."""
    if cfg.shared_expert_gate and not cfg.shared_experts:
        raise bad("shared_expert_gate", f"is set but {key('shared_experts')} = 0",
                  f"give shared experts or drop {key('shared_expert_gate')}")
    if cfg.attention_output_gate and (cfg.mla or cfg.family != "llama" or cfg.hybrid):
        raise bad("attention_output_gate", "gates a llama-family decoder's grouped-query "
                  "attention only", f"drop {key('attention_output_gate')}")
    if not cfg.linear_key_heads:
        for field in _LINEAR:
            if getattr(cfg, field):
                raise bad(field, f"is set but {key('linear_key_heads')} = 0 (no Gated DeltaNet "
                          "layers)", f"give {key('linear_key_heads')} or drop {key(field)}")
        return
    for field in _LINEAR:
        if getattr(cfg, field) < 1:
            raise bad(field, "is not set for the Gated DeltaNet layers", f"give {key(field)}")
    if cfg.linear_value_heads % cfg.linear_key_heads:
        raise bad("linear_value_heads", f"is not a multiple of {key('linear_key_heads')} = "
                  f"{cfg.linear_key_heads}", "give a multiple of the key heads")
    if cfg.full_attention_interval < 2:
        raise bad("full_attention_interval", "is below 2 (every layer full attention)",
                  "give 2 or more, or drop the Gated DeltaNet fields")
    if cfg.family != "llama" or cfg.hybrid or cfg.mla or cfg.sliding_window or cfg.dense_layers \
            or cfg.bias:
        raise bad("linear_key_heads", "is combined with a family other than llama, a hybrid "
                  "pattern, latent attention, a sliding window, dense first layers or biases, "
                  "which the Gated DeltaNet blocks do not model", "drop those fields")


def _check_mla(cfg: ModelConfig, bad: Any, key: Any) -> None:
    if not cfg.mla:
        for field in _MLA:
            if getattr(cfg, field):
                raise bad(field, f"is set but {key('kv_lora_rank')} = 0 (no latent attention)",
                          f"set {key('kv_lora_rank')} with it, or drop {key(field)}")
        return
    for field in ("qk_rope_head_dim", "v_head_dim", "head_size"):
        if getattr(cfg, field) < 1:
            raise bad(field, f"is not set but {key('kv_lora_rank')} = {cfg.kv_lora_rank} "
                      "(latent attention needs its head widths)", f"give {key(field)}")
    if cfg.pos_emb == "rope" and cfg.qk_rope_head_dim % 2:
        raise bad("qk_rope_head_dim", "is odd; rotary embeddings rotate pairs",
                  "use an even rotary width")


def _check_mochi(cfg: ModelConfig, bad: Any, key: Any) -> None:
    if cfg.family != "mochi":
        for field in _MOCHI:
            if getattr(cfg, field) and not (cfg.family == "mochi_vae" and field in _LATENT):
                raise bad(field, f"applies to family mochi only, not {cfg.family}",
                          f"drop {key(field)}")
        return
    for field in _MOCHI:
        if getattr(cfg, field) < 1:
            raise bad(field, "is not set for a Mochi DiT", f"give {key(field)}")
    for field in ("latent_height", "latent_width"):
        if getattr(cfg, field) % cfg.patch_size:
            raise bad(field, f"is not a multiple of {key('patch_size')} = {cfg.patch_size}",
                      "give a latent the patches tile")
    if cfg.training:
        raise bad("training", "is true; the Mochi DiT is modelled for inference only",
                  "set training false")


_T5 = ("relative_buckets", "relative_max_distance")
_VAE = ("vae_channels", "vae_blocks", "temporal_expansions", "spatial_expansions",
        "out_channels", "norm_groups")
_DECODER_ONLY = ("experts", "kv_lora_rank", "hybrid_pattern", "sliding_window",
                 "attention_sinks", "mtp_layers", "bias", "tie_embeddings")


def _check_component(cfg: ModelConfig, bad: Any, key: Any, family: str, what: str) -> None:
    """A T5 encoder or Mochi VAE decoder: inference only, none of a decoder's extras."""
    if cfg.training:
        raise bad("training", f"is true; the {what} is modelled for inference only",
                  "set training false")
    for field in _DECODER_ONLY:
        if getattr(cfg, field):
            raise bad(field, f"is set on a {family} model, which the zoo models without it",
                      f"drop {key(field)}")


def _check_t5(cfg: ModelConfig, bad: Any, key: Any) -> None:
    """T5 v1.1 encoder: its relative position bias (bidirectional buckets: an even count whose
    exact quarter is below the maximum distance), gated GELU, RMSNorm, every head its own keys."""
    if cfg.family != "t5":
        for field in _T5:
            if getattr(cfg, field):
                raise bad(field, f"applies to family t5 only, not {cfg.family}",
                          f"drop {key(field)}")
        if cfg.pos_emb == "relative":
            raise bad("pos_emb", f"is T5's relative position bias, not a {cfg.family} model's",
                      "use rope, learned or none")
        return
    _check_component(cfg, bad, key, "t5", "T5 encoder")
    b = cfg.relative_buckets
    if b < 4 or b % 2:
        raise bad("relative_buckets", "is not an even count of at least 4 (half for keys "
                  "before the query, half after)", "give an even number such as 32")
    if cfg.relative_max_distance <= b // 4:
        raise bad("relative_max_distance", f"is not above {b // 4} (the distances with their "
                  f"own bucket)", f"give more than {b // 4}, e.g. 128")
    for field, want in (("pos_emb", "relative"), ("mlp", "gelu"), ("norm", "rms")):
        if getattr(cfg, field) != want:
            raise bad(field, f"is not {want!r}, which the T5 v1.1 encoder uses", f"give {want}")
    if cfg.kv_heads != cfg.heads:
        raise bad("kv_heads", f"is not {key('heads')} = {cfg.heads} (T5 attention has a key "
                  "and value per head)", f"give {cfg.heads}")


def _check_vae(cfg: ModelConfig, bad: Any, key: Any) -> None:
    """Mochi VAE decoder: ``n >= 2`` channel widths, ``n + 1`` residual block counts and
    ``n - 1`` expansions of each kind; widths divisible by the GroupNorm groups; ``layers`` =
    the residual blocks and up-block projections; ``hidden`` the widest level; one head."""
    if cfg.family != "mochi_vae":
        for field in _VAE:
            if getattr(cfg, field):
                raise bad(field, f"applies to family mochi_vae only, not {cfg.family}",
                          f"drop {key(field)}")
        return
    _check_component(cfg, bad, key, "mochi_vae", "Mochi VAE decoder")
    n = len(cfg.vae_channels)
    if n < 2:
        raise bad("vae_channels", "has fewer than 2 levels", "give a width per level, e.g. "
                  "(128, 256, 512, 768)")
    for field, count in (("vae_blocks", n + 1), ("temporal_expansions", n - 1),
                         ("spatial_expansions", n - 1)):
        if len(getattr(cfg, field)) != count:
            raise bad(field, f"does not have {count} entries ({key('vae_channels')} has {n})",
                      f"give {count}")
    for field in (*_LATENT, "out_channels", "norm_groups"):
        if getattr(cfg, field) < 1:
            raise bad(field, "is not set for a Mochi VAE decoder", f"give {key(field)}")
    if any(c % cfg.norm_groups for c in cfg.vae_channels):
        raise bad("norm_groups", f"does not divide every width of {key('vae_channels')} = "
                  f"{cfg.vae_channels}", "give a common divisor")
    blocks = sum(cfg.vae_blocks) + n - 1
    if cfg.layers != blocks:
        raise bad("layers", f"is not the {blocks} residual blocks and up-block projections",
                  f"give {blocks}")
    if cfg.hidden != cfg.vae_channels[-1] or cfg.heads != 1 or cfg.kv_heads != 1:
        raise bad("hidden", f"is not the widest level {cfg.vae_channels[-1]} with one head "
                  f"(heads = {cfg.heads}, kv_heads = {cfg.kv_heads})",
                  f"give hidden {cfg.vae_channels[-1]}, heads 1 and kv_heads 1")
