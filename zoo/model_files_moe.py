"""The readers of :mod:`zoo.model_files` for the mixtures of experts whose configs need more
than an expert count: OpenAI gpt-oss (``gpt_oss``), NVIDIA Nemotron-H / Nemotron 3
(``nemotron_h``, a Mamba-2 / attention / MoE hybrid) and DeepSeek-V2/V3 with multi-head latent
attention, including Moonshot's Kimi K2 (``kimi_k2``: DeepSeek-V3's architecture, 384 experts),
and Meta's Llama 4 with a mixture of experts in every layer (``llama4``: Scout).
:func:`zoo.model_files.from_hf` dispatches here by ``model_type``; each reader returns an
unchecked :class:`ModelConfig` that ``from_hf`` checks (:func:`zoo.schema.check_model`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from zoo.config import ModelConfig, ZooError
from zoo.model_fields import (SEQ_LEN_CAP, _bool, _count, _float, _get, _int,
                              _rope_scaling_note, _short, llama_like)

__all__ = ["read_deepseek", "read_gpt_oss", "read_llama4", "read_moe", "read_nemotron_h",
           "read_qwen3_next"]


def read_gpt_oss(doc: Mapping[str, Any], name: str, source: str, where: str) -> ModelConfig:
    """OpenAI gpt-oss (``gpt_oss``; OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card"): a
    llama-family decoder whose every block routes to ``num_experts_per_tok`` of
    ``num_local_experts`` SwiGLU experts of width ``intermediate_size`` (router and experts
    with biases, the SwiGLU clamped at ``swiglu_limit``), attention with q/k/v/o biases and one
    sink logit per head, its ``layer_types`` alternating ``sliding_attention`` (a window of
    ``sliding_window`` keys) and ``full_attention`` (Hugging Face's default when absent: every
    second block full). YaRN rope scaling is costed as plain RoPE (no parameters, the same
    FLOP); the published MXFP4 expert weights are costed in the compute dtype."""
    layers = _int(doc, "num_hidden_layers", where)
    types = doc.get("layer_types")
    if types is None:
        types = ["full_attention" if (i + 1) % 2 == 0 else "sliding_attention"
                 for i in range(layers)]
    if not isinstance(types, list) or "full_attention" not in types:
        raise ZooError(f"{where}: field 'layer_types' = {_short(types)} is not a list with "
                       f"'full_attention' layers; give the published per-layer list")
    every = types.index("full_attention") + 1
    want = ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)]
    if types != want:
        raise ZooError(f"{where}: field 'layer_types' = {_short(types)} is not one full-attention "
                       f"layer every {every} ({layers} entries); the zoo models a periodic pattern")
    window = _int(doc, "sliding_window", where)
    limit = _float(doc, where, "swiglu_limit", default=0.0)
    base = read_moe({**doc, "model_type": "mixtral"}, "mixtral", name, source, where)
    return dataclasses.replace(
        base, bias=_bool(doc, "attention_bias", where, True), attention_sinks=True,
        sliding_window=window, full_attention_every=every if every > 1 else 0, swiglu_limit=limit,
        rope_theta=_float(doc, where, "rope_theta", default=150000.0),
        source=f"{source}; gpt_oss ({base.experts} experts, top {base.experts_per_token}, "
               f"capacity factor 1; router and expert biases; attention sinks; sliding window {window} on "
          f"{sum(t == 'sliding_attention' for t in types)} of {layers} layers; SwiGLU clamped at "
          f"{limit:g}; YaRN rope scaling costed as plain RoPE; MXFP4 experts costed in the "
          f"compute dtype)")


def read_nemotron_h(doc: Mapping[str, Any], name: str, source: str, where: str) -> ModelConfig:
    """NVIDIA Nemotron-H / Nemotron 3 (``nemotron_h``): a hybrid of Mamba-2, attention, MLP and
    mixture-of-experts layers by ``hybrid_override_pattern`` (:mod:`zoo.hybrid`), squared-ReLU
    MLPs and experts (``mlp_hidden_act`` ``relu2``), ``n_routed_experts`` experts of
    ``moe_intermediate_size`` plus a shared expert of ``moe_shared_expert_intermediate_size``
    (a multiple of it), attention without positional embeddings. The router (sigmoid scores
    with a per-expert correction bias, scaled by ``routed_scaling_factor``) is costed as a
    softmax top-k; its 128 correction biases per MoE layer are left out. ``moe_latent_size``
    (Nemotron 3 Super's LatentMoE; absent or null: none) sets ``ModelConfig.moe_latent``."""
    layers = _int(doc, "num_hidden_layers", where)
    pattern = _get(doc, "hybrid_override_pattern", where)
    if not isinstance(pattern, str):
        raise ZooError(f"{where}: field 'hybrid_override_pattern' = {_short(pattern)} is not a "
                       f"string; give the published pattern")
    act = doc.get("mlp_hidden_act", "relu2")
    if act != "relu2":
        raise ZooError(f"{where}: field 'mlp_hidden_act' = {_short(act)} is not modelled; the "
                       f"zoo's Nemotron-H MLPs are relu2")
    moe = "E" in pattern
    fe = _int(doc, "moe_intermediate_size", where) if moe else 0
    shared = _count(doc, "moe_shared_expert_intermediate_size", where) if moe else 0
    if shared % max(fe, 1):
        raise ZooError(f"{where}: field 'moe_shared_expert_intermediate_size' = {shared} is not a "
                       f"multiple of moe_intermediate_size = {fe}; the zoo's shared experts are "
                       f"whole experts")
    hidden, heads = _int(doc, "hidden_size", where), _int(doc, "num_attention_heads", where)
    head_dim = _int(doc, "head_dim", where, default=hidden // heads)
    max_pos = _int(doc, "max_position_embeddings", where, default=SEQ_LEN_CAP)
    passes, mtp_pattern = _nemotron_mtp(doc, where)
    return ModelConfig(
        name=name, family="llama", layers=layers, hidden=hidden, heads=heads,
        kv_heads=_int(doc, "num_key_value_heads", where, default=heads),
        ffn=_int(doc, "intermediate_size", where), vocab=_int(doc, "vocab_size", where),
        seq_len=min(max_pos, SEQ_LEN_CAP), norm="rms", mlp="relu2", pos_emb="none",
        tie_embeddings=_bool(doc, "tie_word_embeddings", where, False),
        norm_eps=_float(doc, where, "layer_norm_epsilon", "norm_eps", default=1e-5),
        head_size=head_dim if head_dim * heads != hidden else 0,
        experts=_int(doc, "n_routed_experts", where) if moe else 0,
        experts_per_token=_int(doc, "num_experts_per_tok", where) if moe else 0,
        expert_ffn=fe, shared_experts=shared // fe if moe else 0, hybrid_pattern=pattern,
        moe_latent=(_count(doc, "moe_latent_size", where) if moe and doc.get("moe_latent_size")
                    is not None else 0),
        mtp_layers=passes, mtp_pattern=mtp_pattern,
        mamba_heads=_int(doc, "mamba_num_heads", where),
        mamba_head_dim=_int(doc, "mamba_head_dim", where),
        ssm_state=_int(doc, "ssm_state_size", where), mamba_groups=_int(doc, "n_groups", where),
        conv_kernel=_int(doc, "conv_kernel", where), ssm_chunk=_int(doc, "chunk_size", where, default=128),
        source=f"{source}; nemotron_h ({pattern.count('M')} Mamba-2, {pattern.count('*')} "
               f"attention, {pattern.count('E')} MoE and {pattern.count('-')} MLP layers"
               + (f"; LatentMoE: experts at latent width {doc['moe_latent_size']}"
                  if moe and doc.get("moe_latent_size") else "")
               + (f"; multi-token prediction: {passes} pass(es) of {mtp_pattern!r}"
                  if passes else "")
               + ("; router costed as softmax top-k, its correction biases left out)" if moe else ")"))


_MTP_TYPES = {"attention": "*", "moe": "E", "mamba": "M", "mlp": "-"}


def _nemotron_mtp(doc: Mapping[str, Any], where: str) -> tuple[int, str]:
    """(passes, pattern) of a Nemotron 3 multi-token-prediction module: ``mtp_layers_block_type``
    (``["attention", "moe"]`` -> ``"*E"``) run ``mtp_num_layers`` times (Megatron-Core's passes
    of its one repeated module; blank: ``num_nextn_predict_layers``, the modules the Hugging
    Face config states, 0 or 1); (0, "") without one."""
    modules = _count(doc, "num_nextn_predict_layers", where)
    if modules > 1:
        raise ZooError(f"{where}: field 'num_nextn_predict_layers' = {modules} is over 1; the zoo "
                       f"runs one repeated multi-token-prediction module (mtp_num_layers passes)")
    passes = _count(doc, "mtp_num_layers", where) or modules
    if not passes:
        return 0, ""
    kinds = doc.get("mtp_layers_block_type")
    if (not isinstance(kinds, list) or not kinds
            or any(k not in _MTP_TYPES for k in kinds)):
        raise ZooError(f"{where}: field 'mtp_layers_block_type' = {_short(kinds)} is not a list of "
                       f"{', '.join(_MTP_TYPES)}; give the module's layers")
    return passes, "".join(_MTP_TYPES[k] for k in kinds)


def read_qwen3_next(doc: Mapping[str, Any], name: str, source: str, where: str) -> ModelConfig:
    """Qwen3-Next (``qwen3_next``; Qwen team 2025, the Qwen3-Next-80B-A3B model card; Hugging
    Face ``Qwen3NextForCausalLM``) and the Qwen3.5 / Qwen3.6 mixtures of experts
    (``qwen3_5_moe_text``, the language model of ``qwen3_5_moe``: the same blocks, its attention
    output gate stated by ``attn_output_gate``, RoPE under ``rope_parameters``): a Qwen3-MoE decoder whose blocks are Gated DeltaNet linear
    attention (:mod:`zoo.gated_deltanet`: ``linear_num_key_heads`` / ``linear_num_value_heads``
    of ``linear_key_head_dim`` / ``linear_value_head_dim``, a convolution of
    ``linear_conv_kernel_dim`` taps) except every ``full_attention_interval``-th, which is
    gated grouped-query attention (queries and an output gate from one projection, q/k norms);
    every block's MLP routes to ``num_experts_per_tok`` of ``num_experts`` SwiGLU experts of
    ``moe_intermediate_size`` plus one gated shared expert of
    ``shared_expert_intermediate_size`` (a multiple of it); ``mtp_num_hidden_layers`` (0 or 1)
    multi-token-prediction modules, whose block is the last layer's (full attention), as
    Megatron-Core builds it. Partial RoPE (``partial_rotary_factor``) is costed as full RoPE
    (the same projections; the rotation's FLOP is negligible), zero-centred RMSNorm as
    RMSNorm. The chunk of the delta rule is 64 tokens (flash-linear-attention's
    ``chunk_gated_delta_rule``)."""
    if doc.get("mlp_only_layers") or _int(doc, "decoder_sparse_step", where, default=1) != 1:
        raise ZooError(f"{where}: dense layers among the sparse ones (mlp_only_layers, "
                       f"decoder_sparse_step) are not modelled; every layer must be sparse")
    fe = _int(doc, "moe_intermediate_size", where)
    shared = _count(doc, "shared_expert_intermediate_size", where)
    if shared % fe:
        raise ZooError(f"{where}: field 'shared_expert_intermediate_size' = {shared} is not a "
                       f"multiple of moe_intermediate_size = {fe}; the zoo's shared experts are "
                       f"whole experts")
    rope = doc.get("rope_parameters")
    if doc.get("rope_theta") is None and isinstance(rope, Mapping) and "rope_theta" in rope:
        doc = {**doc, "rope_theta": rope["rope_theta"]}      # Qwen3.5 nests it
    base = read_moe({**doc, "model_type": "qwen3_moe"}, "qwen3_moe", name, source, where)
    every = _int(doc, "full_attention_interval", where, default=4)
    kind = str(doc.get("model_type", "qwen3_next"))
    layers = base.layers
    return dataclasses.replace(
        base, shared_experts=shared // fe, shared_expert_gate=shared > 0,
        attention_output_gate=_bool(doc, "attn_output_gate", where, True),
        full_attention_interval=every,
        linear_key_heads=_int(doc, "linear_num_key_heads", where),
        linear_value_heads=_int(doc, "linear_num_value_heads", where),
        linear_key_head_dim=_int(doc, "linear_key_head_dim", where),
        linear_value_head_dim=_int(doc, "linear_value_head_dim", where),
        linear_conv_kernel=_int(doc, "linear_conv_kernel_dim", where, default=4), linear_chunk=64,
        mtp_layers=_count(doc, "mtp_num_hidden_layers", where),
        source=base.source.replace("; qwen3_moe", f"; {kind}", 1)
        + f" (Gated DeltaNet on {layers - layers // every} of {layers} layers, gated attention "
          f"on every {every}th; gated shared expert; partial RoPE costed as full RoPE"
          + ("; vision encoder not modelled" if kind.startswith("qwen3_5") else "") + ")")


def read_deepseek(doc: Mapping[str, Any], kind: str, name: str, source: str, where: str
              ) -> ModelConfig:
    """DeepSeek-V2/V3: multi-head latent attention, ``n_routed_experts`` routed and
    ``n_shared_experts`` shared experts of width ``moe_intermediate_size`` in every block after
    the first ``first_k_dense_replace`` (dense, width ``intermediate_size``). The router is
    costed as a softmax top-k (V3's sigmoid scores with group-limited selection move the same
    bytes); V3's multi-token-prediction module (``num_nextn_predict_layers``, 0 or 1) is read
    into ``mtp_layers`` (``zoo.ModelConfig``: costed in the head). The shipped ``DeepSeek-V3.json``
    sets it to 0, as the published 671B total leaves it out; ``DeepSeek-V3-MTP.json`` keeps the
    published 1."""
    freq = _int(doc, "moe_layer_freq", where, default=1)
    if freq != 1:
        raise ZooError(f"{where}: moe_layer_freq {freq} (dense layers between the sparse ones) is "
                       f"not modelled; every layer after the first dense ones must be sparse")
    hidden, heads = _int(doc, "hidden_size", where), _int(doc, "num_attention_heads", where)
    notes = ["router costed as softmax top-k"]
    if kind == "kimi_k2":             # Moonshot ships DeepSeek-V3's architecture under its own type
        archs = doc.get("architectures") or ["DeepseekV3ForCausalLM"]
        if archs != ["DeepseekV3ForCausalLM"]:
            raise ZooError(f"{where}: architectures = {_short(archs)} is not DeepseekV3ForCausalLM; "
                           f"the zoo reads kimi_k2 as DeepSeek-V3's architecture only")
        notes.insert(0, "DeepSeek-V3 architecture (DeepseekV3ForCausalLM)")
    mtp = _count(doc, "num_nextn_predict_layers", where)
    if mtp:
        notes.append(f"{mtp} multi-token-prediction module in the head")
    max_pos = _int(doc, "max_position_embeddings", where, default=SEQ_LEN_CAP)
    return ModelConfig(
        name=name, family="llama", layers=_int(doc, "num_hidden_layers", where), hidden=hidden,
        heads=heads, kv_heads=heads, ffn=_int(doc, "intermediate_size", where),
        vocab=_int(doc, "vocab_size", where), seq_len=min(max_pos, SEQ_LEN_CAP), norm="rms",
        mlp="swiglu", pos_emb="rope", tie_embeddings=_bool(doc, "tie_word_embeddings", where, False),
        rope_theta=_float(doc, where, "rope_theta", default=10000.0),
        norm_eps=_float(doc, where, "rms_norm_eps", default=1e-6),
        head_size=_int(doc, "qk_nope_head_dim", where),
        experts=_int(doc, "n_routed_experts", where),
        experts_per_token=_int(doc, "num_experts_per_tok", where),
        expert_ffn=_int(doc, "moe_intermediate_size", where),
        shared_experts=_count(doc, "n_shared_experts", where),
        dense_layers=_count(doc, "first_k_dense_replace", where),
        q_lora_rank=_count(doc, "q_lora_rank", where), kv_lora_rank=_int(doc, "kv_lora_rank", where),
        qk_rope_head_dim=_int(doc, "qk_rope_head_dim", where),
        v_head_dim=_int(doc, "v_head_dim", where), mtp_layers=mtp,
        source=f"{source}; {kind} ({'; '.join(notes)})")


def read_llama4(doc: Mapping[str, Any], name: str, source: str, where: str) -> ModelConfig:
    """Meta Llama 4 (``llama4``, its ``text_config``; or ``llama4_text``): GQA attention and, in
    every layer (``interleave_moe_layer_step`` 1, Llama 4 Scout), ``num_experts_per_tok`` of
    ``num_local_experts`` SwiGLU experts of width ``intermediate_size`` plus one shared expert of
    the same width (transformers' ``Llama4TextMoe``). Costed as: the router (sigmoid of the
    top-k logits) as softmax top-k; chunked attention (``attention_chunk_size`` tokens, on the
    RoPE layers) as full causal attention, exact for samples up to the chunk, an overestimate
    beyond; the NoPE layers and the weightless q/k L2 norms cost nothing extra; the vision
    encoder is not modelled. Maverick's dense layers between the MoE ones
    (``interleave_moe_layer_step`` > 1, width ``intermediate_size_mlp``) are refused."""
    vision = isinstance(doc.get("text_config"), Mapping)
    if vision:
        doc = doc["text_config"]
    layers = _int(doc, "num_hidden_layers", where)
    step = _int(doc, "interleave_moe_layer_step", where, default=1)
    moe_layers = doc.get("moe_layers")
    if step != 1 or (moe_layers is not None and moe_layers != list(range(layers))):
        raise ZooError(f"{where}: interleave_moe_layer_step {step} (dense layers between the "
                       f"MoE ones, Llama 4 Maverick) is not modelled; every layer must be MoE")
    chunk = _count(doc, "attention_chunk_size", where)
    fe = _int(doc, "intermediate_size", where)
    base = read_moe({**doc, "model_type": "mixtral", "num_local_experts": _get(doc, "num_local_experts", where)},
                "mixtral", name, source, where)
    notes = [f"{base.experts} experts, top {base.experts_per_token}, + 1 shared expert of {fe}",
             "router costed as softmax top-k"]
    if chunk:
        notes.append(f"chunked attention ({chunk}-token chunks) costed as full causal attention, "
                     f"exact up to {chunk} tokens per sample")
    notes += _rope_scaling_note(doc)
    if vision:
        notes.append("vision encoder not modelled")
    return dataclasses.replace(base, shared_experts=1, source=f"{source}; llama4 ({'; '.join(notes)})")


def read_moe(doc: Mapping[str, Any], kind: str, name: str, source: str, where: str) -> ModelConfig:
    """Mixtral (``num_local_experts``, ``intermediate_size`` per expert) and Qwen3-MoE
    (``num_experts``, ``moe_intermediate_size``; every layer sparse) as a llama-family decoder
    whose every block's MLP is a mixture of experts."""
    if kind.startswith("llama4"):
        return read_llama4(doc, name, source, where)
    if kind.startswith("deepseek") or kind == "kimi_k2":
        return read_deepseek(doc, kind, name, source, where)
    if kind == "gpt_oss":
        return read_gpt_oss(doc, name, source, where)
    if kind == "nemotron_h":
        return read_nemotron_h(doc, name, source, where)
    if kind in ("qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe"):
        return read_qwen3_next(doc, name, source, where)
    if kind == "qwen3_moe":
        if doc.get("mlp_only_layers") or _int(doc, "decoder_sparse_step", where, default=1) != 1:
            raise ZooError(f"{where}: dense layers among the sparse ones (mlp_only_layers, "
                           f"decoder_sparse_step) are not modelled; every layer must be sparse")
        experts, ffn = _int(doc, "num_experts", where), _int(doc, "moe_intermediate_size", where)
    else:
        experts, ffn = _int(doc, "num_local_experts", where), _int(doc, "intermediate_size", where)
    top_k = _int(doc, "num_experts_per_tok", where)
    base = llama_like({**doc, "intermediate_size": ffn}, "qwen3" if kind == "qwen3_moe" else "mistral",
                       name, source, where)
    return dataclasses.replace(base, experts=experts, experts_per_token=top_k, expert_ffn=ffn,
                               source=base.source.replace("; qwen3", "; qwen3_moe", 1)
                               .replace("; mistral", "; mixtral", 1)
                               + f" ({experts} experts, top {top_k}, capacity factor 1)")
