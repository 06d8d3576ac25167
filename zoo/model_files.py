"""Models from their published configuration files: a Hugging Face ``config.json`` or a small
YAML model spec, so ``--model`` takes the model a user trains, not only a zoo name.

:func:`resolve_model` is what a command calls with the user's ``--model``: a zoo name
(:func:`zoo.config.get_config`) or a path ending in ``.json``, ``.yaml`` or ``.yml``
(:func:`load_model_file`). A Hugging Face config is read by its ``model_type`` (the
``architectures`` entry when the type is absent) into a decoder :class:`ModelConfig`:

- Llama-style (RMSNorm, gated MLP, rotary positions, no biases): ``llama``, ``mistral``,
  ``qwen2``, ``qwen3``, ``gemma``, ``gemma2``, ``gemma3`` / ``gemma3_text``;
- GPT-style (LayerNorm, GeLU or ReLU MLP, biases): ``gpt2``, ``gpt_neox``, ``opt``.

What the cost model does not distinguish is mapped to what costs the same and named in the
config's ``source``: Gemma's GeGLU is costed as SwiGLU (the same three matrices), Qwen2's q/k/v
biases and Qwen3's q/k norms are left out (under 0.01% of the parameters), sliding-window layers
(Mistral 7B v0.1, Gemma 2/3) are costed as full causal attention, GPT-NeoX's partial rotary as
full rotary (no parameters either way), a ``rope_scaling`` (Llama 3.1's ``llama3``, YaRN) as plain
RoPE (the same FLOP, no parameters), and Gemma 3's vision encoder is not modelled. The tokens
per sample default to ``min(max_position_embeddings, 8192)`` (``--seq-len`` overrides it).
A mixture of experts (``mixtral``, ``qwen3_moe``; ``deepseek_v2`` / ``deepseek_v3`` with
multi-head latent attention, shared experts and dense first layers, and ``kimi_k2``, Moonshot's
Kimi K2, which is DeepSeek-V3's architecture (``DeepseekV3ForCausalLM``) under its own type;
``gpt_oss`` with biases, attention sinks, a clamped SwiGLU and sliding-window attention on
alternate layers, which is modelled, not costed as full attention; ``nemotron_h``, a Mamba-2
hybrid; ``llama4`` / ``llama4_text`` with every layer a mixture of experts plus a shared expert,
Llama 4 Scout) sets the config's expert fields (``ModelConfig.experts`` ...); the MoE
families are read by :mod:`zoo.model_files_moe`, the typed field reads all readers share are
:mod:`zoo.model_fields`. Qwen2-MoE (a gated shared expert),
Qwen3-Next (Gated DeltaNet linear attention, which is not Mamba-2's scan), Llama 4 Maverick
(dense layers interleaved with the MoE ones) and other MoE designs, and any other type, are
refused in one line naming the type,
what is missing and the supported list (:data:`UNSUPPORTED_MOE`). :data:`ALIASES` maps a few
recipe names (``llama-3.1-405b``) to the zoo's own.

A YAML model spec is a mapping of :class:`ModelConfig` fields (``name``, ``family``: ``llama`` or
``gpt``, ``layers``, ``hidden``, ``heads``, ``ffn``, ``vocab``, and optionally every other field);
an unknown field is refused in one line listing the valid ones. A plan made from a file carries
the model's fields (``Plan.model_config``), so ``mpmd simulate``, ``run`` and ``export`` need not
find the file again (:func:`plan_model`).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from pathlib import Path
from typing import Any, Mapping

from hardware_profiles.paths import PACKAGE_ROOT
from ir.files import read_json, read_yaml
from zoo.config import ModelConfig, ZooError, get_config, list_models
from zoo.model_fields import (SEQ_LEN_CAP, _bool, _float, _int, _short, llama_like as _llama_like,
                               rope_scaling_fields)
from zoo.model_files_moe import read_moe
from zoo.schema import check_model

MODEL_FILE_SUFFIXES = (".json", ".yaml", ".yml")
"""A ``--model`` ending in one of these is a model file, anything else a zoo name."""

LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text")
GPT_TYPES = ("gpt2", "gpt_neox", "opt")
MOE_TYPES = ("mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3", "kimi_k2", "gpt_oss", "nemotron_h",
             "llama4", "llama4_text", "qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text")
SUPPORTED_TYPES = LLAMA_TYPES + GPT_TYPES + MOE_TYPES
"""Hugging Face ``model_type`` values read into a decoder (dense, or a mixture of experts in
every block)."""

UNSUPPORTED_MOE = {
    "qwen2_moe": "a gated shared expert", "dbrx": "its fine-grained experts' clipped QKV",
    "jamba": "Mamba layers", "olmoe": "q/k norms with experts", "granitemoe": "its router",
    "phimoe": "its sparse-mixer routing", "grok-1": "its attention and routing"}
"""Mixture-of-experts ``model_type`` values with what the zoo cannot yet express of each."""

NOT_MODELLED = {
    "deepseek-v4": "DeepSeek-V4's hyper-connections (several residual streams mixed at every "
                   "layer) and compressed sparse attention",
    "deepseekv4": "DeepSeek-V4's hyper-connections (several residual streams mixed at every "
                  "layer) and compressed sparse attention",
    "glm-5": "GLM-5's DeepSeek sparse attention (a lightning indexer picks each query's keys)",
    "glm5": "GLM-5's DeepSeek sparse attention (a lightning indexer picks each query's keys)",
    "nemotron-3-ultra": "Nemotron 3 Ultra's full config (its hidden size and layer pattern) is "
                        "not at hand",
    "nemotron3-ultra": "Nemotron 3 Ultra's full config (its hidden size and layer pattern) is "
                       "not at hand",
    "llama4-maverick": "Llama 4 Maverick's dense layers between its MoE ones "
                       "(interleave_moe_layer_step 2)",
    "llama-4-maverick": "Llama 4 Maverick's dense layers between its MoE ones "
                        "(interleave_moe_layer_step 2)"}
"""Models NVIDIA's and others' recipes train that the zoo knows by name but cannot yet cost, by
the start of their :func:`canonical_name`, with what is missing: :func:`resolve_model` names it
instead of guessing at a near name."""

ALIASES = {"llama-3.1-405b": "llama3-405b", "llama3.1-405b": "llama3-405b",
           "llama-3.1-70b": "llama-3.1-70b-instruct", "llama3.1-70b": "llama-3.1-70b-instruct",
           "llama3.1-8b": "llama-3.1-8b", "llama31-405b": "llama3-405b",
           "llama31-70b": "llama-3.1-70b-instruct", "llama31-8b": "llama-3.1-8b",
           "deepseekv3": "deepseek-v3-mtp",
           "deepseekv3-mtp": "deepseek-v3-mtp",
           "deepseek-v3-671b": "deepseek-v3", "kimi-k2": "kimi-k2-instruct",
           "nemotron-h-56b": "nemotron-h-56b-base-8k", "nemotronh-56b": "nemotron-h-56b-base-8k",
           "nemotron-3-nano": "nemotron-3-nano-30b-a3b", "nemotron3-nano": "nemotron-3-nano-30b-a3b",
           "nemotron-3-super": "nemotron-3-super-mtp",
           "nemotron3-super": "nemotron-3-super-mtp",
           "nemotron-3-super-120b-a12b": "nemotron-3-super-mtp",
           "nemotron3-super-mtp": "nemotron-3-super-mtp",
           "nemotron-3-super-120b-a12b-mtp": "nemotron-3-super-mtp",
           "nemotron3.5-lightning": "nemotron-3.5-lightning",
           "nemotron-3-5-lightning": "nemotron-3.5-lightning",
           "nemotron35-lightning": "nemotron-3.5-lightning",
           "nemotron-3.5-lightning-30b-a3b": "nemotron-3.5-lightning",
           "llama4-scout": "llama-4-scout-17b-16e", "llama-4-scout": "llama-4-scout-17b-16e",
           "grok1-314b": "grok-1-314b", "grok-1": "grok-1-314b",
           "mixtral-8x22b": "mixtral-8x22b-v0.1",
           "qwen3-next-80b-a3b-instruct": "qwen3-next-80b-a3b",
           "qwen3-next-80b": "qwen3-next-80b-a3b",
           "qwen3-vl-30b-a3b": "qwen3-30b-a3b", "qwen3-vl-30b-a3b-instruct": "qwen3-30b-a3b",
           "qwen3-vl-235b-a22b": "qwen3-235b-a22b",
           "qwen3-vl-235b-a22b-instruct": "qwen3-235b-a22b"}
ALIASES.update({f"{prefix}-{size}": f"qwen3.5-{size}"
                for prefix in ("qwen3-5", "qwen35", "qwen3.5-vl", "qwen3-5-vl", "qwen35-vl")
                for size in ("35b-a3b", "122b-a10b", "397b-a17b")})
ALIASES.update({"qwen3.6-35b-a3b": "qwen3.5-35b-a3b", "qwen3-6-35b-a3b": "qwen3.5-35b-a3b",
                "qwen3.6-vl-35b-a3b": "qwen3.5-35b-a3b", "qwen3-6-vl-35b-a3b": "qwen3.5-35b-a3b"})
"""Names a recipe or a published table uses for a model the zoo has under another (after
:func:`canonical_name`): Llama 3.1 405B is the zoo's ``llama3-405b`` (the Llama 3 paper's Table 3
with the Hugging Face vocabulary), Llama 3.1 70B and 8B the shipped Hugging Face configs (the base
models' architecture and count); NVIDIA's Megatron-Bridge performance summary prints
``LLAMA3.1_405B`` (its recipes ``llama31_405b``), ``DeepSeekV3``, ``Kimi_K2``, ``Nemotron_H_56B`` and the like, its
dgxc-benchmarking tables ``Grok1 314b``; Kimi K2's base and instruct releases share one
architecture (Moonshot's ``config.json``), as do Nemotron-H 56B's 8K base and its other releases, and Qwen3-Next-80B-A3B's base, instruct
and thinking releases (Megatron-Bridge's recipes build it from the instruct repository's config).
Qwen3-VL-30B-A3B and Qwen3-VL-235B-A22B stand for their language models, Qwen3-30B-A3B's and
Qwen3-235B-A22B's architectures (the Qwen3-VL configs' ``text_config``: the same widths, layers,
heads and experts; multimodal RoPE costs as RoPE); their vision encoders (27 ViT layers of 1,152,
about 0.5B parameters) are not modelled: on Megatron-Bridge's benchmark data, one 256 x 256 image
per 4,096-token sample (``MockVLMSFTDatasetConfig``), 256 patches cost about 0.2 TFLOP a sample
in the forward against 27 (30B-A3B) and 180 (235B-A22B) in the language model. Qwen3.5-VL and
Qwen3.6-VL (``Qwen3.5_VL_35B_A3B``, ``qwen35_vl_397b_a17b`` as Megatron-Bridge's recipes name them)
are their language models the same way (``zoo/configs/Qwen3.5-*.json``; Qwen3.6 35B-A3B shares
Qwen3.5's architecture, Megatron-Bridge ``recipes/qwen_vl/h100/qwen35_vl.py``)."""


WITHOUT_MTP = {"deepseek-v3-mtp": "deepseek-v3", "nemotron-3-super-mtp": "nemotron-3-super-120b"}
"""The model without its multi-token-prediction module, for a name qualified ``(w/o MTP)``."""


def canonical_name(name: str) -> str:
    """``name`` as the zoo spells its models: lower case, spaces and underscores as hyphens
    (``"Qwen3_30B_a3B"`` -> ``"qwen3-30b-a3b"``, ``"GPT OSS 120B"`` -> ``"gpt-oss-120b"``), then
    :data:`ALIASES`. A parenthesised qualifier as NVIDIA's tables print one is dropped
    (``"Qwen3_30B_a3B (tokendrop)"``: the routing is the row's ``dispatcher``), except the
    multi-token-prediction ones: ``(w/ MTP)`` names the model with its module
    (``"DeepSeekV3 (w/ MTP)"`` -> ``"deepseek-v3-mtp"``), ``(w/o MTP)`` without it
    (:data:`WITHOUT_MTP`). A table's name without either is the model as NVIDIA's recipes train
    it: ``"DeepSeekV3"`` is ``deepseek-v3-mtp`` (Megatron-Bridge ``recipes/deepseek/
    deepseek_v3.py``: ``mtp_num_layers`` 1 by default), ``"Nemotron3_Super"`` its two passes."""
    text = str(name).strip().lower()
    mtp = bool(re.search(r"\(\s*w/\s*mtp\s*\)", text))
    without = bool(re.search(r"\(\s*w/o\s*mtp\s*\)", text))
    text = re.sub(r"\([^)]*\)", " ", text) + (" mtp" if mtp else "")
    key = re.sub(r"[\s_]+", "-", text.strip()).strip("-")
    key = re.sub(r"-{2,}", "-", key)
    key = ALIASES.get(key, key)
    return WITHOUT_MTP.get(key, key) if without else key


_ARCH_TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
               "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
               "GemmaForCausalLM": "gemma", "Gemma2ForCausalLM": "gemma2",
               "Gemma3ForCausalLM": "gemma3_text", "Gemma3ForConditionalGeneration": "gemma3",
               "GPT2LMHeadModel": "gpt2", "GPTNeoXForCausalLM": "gpt_neox",
               "OPTForCausalLM": "opt", "MixtralForCausalLM": "mixtral",
               "Qwen3MoeForCausalLM": "qwen3_moe", "DeepseekV3ForCausalLM": "deepseek_v3",
               "GptOssForCausalLM": "gpt_oss", "NemotronHForCausalLM": "nemotron_h",
               "Llama4ForConditionalGeneration": "llama4", "Llama4ForCausalLM": "llama4_text",
               "Qwen3NextForCausalLM": "qwen3_next", "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text",
               "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe"}


def is_model_file(name: str) -> bool:
    """Whether a ``--model`` value names a file (by its suffix) rather than a zoo model."""
    return str(name).lower().endswith(MODEL_FILE_SUFFIXES)


def shipped_models() -> dict[str, Path]:
    """The published configs shipped in ``zoo/configs/``, by lower-case name (``deepseek-v3``,
    ``mixtral-8x22b-v0.1``, ``qwen3-235b-a22b``, ...): ``--model`` takes these names too."""
    folder = Path(__file__).resolve().parent / "configs"
    return {p.stem.lower(): p for p in sorted(folder.iterdir()) if p.suffix in MODEL_FILE_SUFFIXES}


def resolve_model(name: str) -> ModelConfig:
    """The model a ``--model`` value names: a zoo model, a shipped config by its name
    (:func:`shipped_models`, case-insensitive) or a model file.

    Raises:
        ZooError: an unknown name (with the closest known one and the list), or a model file this
            module refuses.
        ir.files.InputError: a file that cannot be read or parsed.
    """
    if is_model_file(name):
        return load_model_file(name)
    name = canonical_name(name)
    shipped = shipped_models()
    try:
        return get_config(name)
    except ZooError:
        if str(name).lower() in shipped:
            return load_model_file(shipped[str(name).lower()])
        known = list_models() + sorted(shipped) + sorted(ALIASES)
        missing = next((why for key, why in NOT_MODELLED.items() if str(name).startswith(key)),
                       None)
        if missing:
            raise ZooError(f"model {name!r} is not modelled yet: the zoo lacks {missing}; fix: "
                           f"give a supported model ({', '.join(list_models()[:4])}, ...) or a "
                           f"config.json of a supported architecture") from None
        close = difflib.get_close_matches(str(name).lower(), known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ZooError(f"unknown model {name!r}; {hint}known models: {', '.join(known)}; or give "
                       f"a config.json / model spec path") from None


def load_model_file(path: str | Path) -> ModelConfig:
    """A Hugging Face ``config.json`` or a YAML model spec as a :class:`ModelConfig` (see the
    module docstring); the model is named after the file (``Qwen3-8B.json`` -> ``Qwen3-8B``)
    unless the spec names it.

    Raises:
        ZooError: an unsupported architecture, a missing or bad field (one line, with the fix).
        ir.files.InputError: a file that cannot be read or parsed.
    """
    path = bundled_path(path)
    doc = (read_json(path, "model config") if path.suffix.lower() == ".json"
           else read_yaml(path, "model spec"))
    if not isinstance(doc, Mapping):
        raise ZooError(f"{path}: a model file holds a mapping of fields, not {type(doc).__name__}; "
                       f"give a config.json or a YAML model spec")
    name = _name(path.stem)
    if "model_type" in doc or "architectures" in doc:
        return from_hf(doc, name, f"{path.name} (Hugging Face config)")
    return from_spec(doc, name, f"{path.name} (model spec)")


def bundled_path(path: str | Path) -> Path:
    """``path`` itself when it exists, else a bundled file at that path from the checkout's root
    (``hardware_profiles.paths.PACKAGE_ROOT``), so ``zoo/configs/Qwen3-8B.json`` works from any
    directory as bundled cluster paths do; else ``path`` (the reader then says it is missing)."""
    p = Path(path)
    try:
        if not p.exists() and not p.is_absolute() and (PACKAGE_ROOT / p).is_file():
            return PACKAGE_ROOT / p
    except (OSError, ValueError):
        pass
    return p


def _name(stem: str) -> str:
    keep = "".join(c if c.isalnum() or c in "_.+-" else "-" for c in stem)
    return keep.strip("-") or "model"


def model_type(doc: Mapping[str, Any]) -> str:
    """The config's ``model_type``, else the type of its first ``architectures`` entry."""
    if isinstance(doc.get("model_type"), str):
        return doc["model_type"]
    archs = doc.get("architectures") or []
    first = archs[0] if isinstance(archs, list) and archs else ""
    return _ARCH_TYPES.get(str(first), str(first))


HF_NAMES = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
            "kv_heads": "num_key_value_heads", "ffn": "intermediate_size", "vocab": "vocab_size",
            "seq_len": "max_position_embeddings", "head_size": "head_dim",
            "norm_eps": "rms_norm_eps", "experts_per_token": "num_experts_per_tok",
            "tie_embeddings": "tie_word_embeddings"}
"""The Hugging Face key of each :class:`ModelConfig` field a Llama-style config sets (what a
message names); :data:`_KIND_NAMES` adds or replaces keys per ``model_type``."""

_KIND_NAMES: dict[str, dict[str, str]] = {
    "mixtral": {"experts": "num_local_experts", "expert_ffn": "intermediate_size"},
    "qwen3_moe": {"experts": "num_experts", "expert_ffn": "moe_intermediate_size",
                  "ffn": "moe_intermediate_size"},
    "qwen3_next": {"experts": "num_experts", "expert_ffn": "moe_intermediate_size",
                   "ffn": "moe_intermediate_size", "full_attention_interval": "full_attention_interval",
                   "linear_key_heads": "linear_num_key_heads",
                   "linear_value_heads": "linear_num_value_heads",
                   "linear_key_head_dim": "linear_key_head_dim",
                   "linear_value_head_dim": "linear_value_head_dim",
                   "linear_conv_kernel": "linear_conv_kernel_dim",
                   "shared_experts": "shared_expert_intermediate_size",
                   "mtp_layers": "mtp_num_hidden_layers"},
    "nemotron_h": {"experts": "n_routed_experts", "expert_ffn": "moe_intermediate_size",
                   "hybrid_pattern": "hybrid_override_pattern", "mamba_heads": "mamba_num_heads",
                   "mamba_head_dim": "mamba_head_dim", "ssm_state": "ssm_state_size",
                   "mamba_groups": "n_groups", "conv_kernel": "conv_kernel",
                   "ssm_chunk": "chunk_size", "norm_eps": "layer_norm_epsilon",
                   "mlp": "mlp_hidden_act"},
    "llama4": {"experts": "num_local_experts", "expert_ffn": "intermediate_size"},
    "gpt_oss": {"experts": "num_local_experts", "expert_ffn": "intermediate_size",
                "full_attention_every": "layer_types", "bias": "attention_bias"},
    "deepseek": {"kv_heads": "num_attention_heads", "head_size": "qk_nope_head_dim",
                 "experts": "n_routed_experts", "expert_ffn": "moe_intermediate_size",
                 "shared_experts": "n_shared_experts", "dense_layers": "first_k_dense_replace",
                 "mtp_layers": "num_nextn_predict_layers"},
    "gpt2": {"layers": "n_layer", "hidden": "n_embd", "heads": "n_head", "kv_heads": "n_head",
             "ffn": "n_inner", "seq_len": "n_positions", "norm_eps": "layer_norm_epsilon"},
    "gpt": {"kv_heads": "num_attention_heads", "norm_eps": "layer_norm_eps"},
}


def hf_names(kind: str) -> dict[str, str]:
    """The Hugging Face key of each field for a config of ``model_type`` ``kind``."""
    family = ("deepseek" if kind.startswith("deepseek") or kind == "kimi_k2" else
              "llama4" if kind.startswith("llama4") else
              "qwen3_next" if kind.startswith("qwen3_5_moe") else
              kind if kind in ("mixtral", "qwen3_moe", "qwen3_next", "gpt2", "gpt_oss",
                               "nemotron_h") else
              "gpt" if kind in GPT_TYPES else "")
    return {**HF_NAMES, **_KIND_NAMES.get(family, {})}


def from_hf(doc: Mapping[str, Any], name: str, source: str) -> ModelConfig:
    """A Hugging Face config as a decoder :class:`ModelConfig` (module docstring), checked by
    :func:`zoo.schema.check_model` with the config's own keys named in a message.

    Raises:
        ZooError: an unsupported ``model_type``, a missing field or one of the wrong type, or
            fields that do not make a valid model (one line naming the key, the value, the fix).
    """
    kind = model_type(doc)
    where = f"{source}: model_type {kind!r}"
    if kind in UNSUPPORTED_MOE:
        raise ZooError(f"{where} is a mixture of experts with {UNSUPPORTED_MOE[kind]}, which the "
                       f"zoo does not model yet; supported: {', '.join(SUPPORTED_TYPES)}")
    if kind not in SUPPORTED_TYPES:
        raise ZooError(f"{where} is not supported; supported: {', '.join(SUPPORTED_TYPES)}")
    if kind == "gemma3" and isinstance(doc.get("text_config"), Mapping):
        doc = {**doc["text_config"], "model_type": "gemma3_text"}
    if kind == "qwen3_5_moe" and isinstance(doc.get("text_config"), Mapping):
        # Qwen3.5's published config: the language model's under text_config, beside a vision
        # encoder the zoo does not model (stated in the model's source)
        doc = {**doc["text_config"], "model_type": "qwen3_5_moe_text"}
        kind = "qwen3_5_moe_text"
    if kind in LLAMA_TYPES:
        cfg = _llama_like(doc, kind, name, source, where)
    elif kind in MOE_TYPES:
        cfg = read_moe(doc, kind, name, source, where)
    else:
        cfg = _gpt_like(doc, kind, name, source, where)
    text = doc.get("text_config") if isinstance(doc.get("text_config"), Mapping) else doc
    cfg = dataclasses.replace(cfg, **rope_scaling_fields(text, where))
    return check_model(cfg, source, hf_names(kind))


def _gpt_like(doc: Mapping[str, Any], kind: str, name: str, source: str, where: str
              ) -> ModelConfig:
    if kind == "gpt2":
        layers, hidden = _int(doc, "n_layer", where), _int(doc, "n_embd", where)
        heads = _int(doc, "n_head", where)
        ffn = _int(doc, "n_inner", where, default=4 * hidden)
        max_pos, act, pos, tie = _int(doc, "n_positions", where), "gelu", "learned", True
    else:
        layers, hidden = _int(doc, "num_hidden_layers", where), _int(doc, "hidden_size", where)
        heads = _int(doc, "num_attention_heads", where)
        ffn = _int(doc, "intermediate_size", where, "ffn_dim")
        max_pos = _int(doc, "max_position_embeddings", where, default=2048)
        act = "relu" if str(doc.get("activation_function", "")).startswith("relu") else "gelu"
        pos = "rope" if kind == "gpt_neox" else "learned"
        tie = _bool(doc, "tie_word_embeddings", where, kind == "opt")
    notes = []
    if kind == "gpt_neox" and doc.get("rotary_pct", 1.0) != 1.0:
        notes.append(f"rotary on {_short(doc['rotary_pct'], 20)} of each head costed as full rotary")
    if kind == "opt" and doc.get("word_embed_proj_dim", hidden) != hidden:
        notes.append(f"embedding projected to {_short(doc['word_embed_proj_dim'], 20)} costed at "
                     f"width {hidden}")
    return ModelConfig(
        name=name, family="gpt", layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
        ffn=ffn, vocab=_int(doc, "vocab_size", where), seq_len=min(max_pos, SEQ_LEN_CAP),
        norm="layer", mlp=act, pos_emb=pos, bias=True, tie_embeddings=tie,
        rope_theta=_float(doc, where, "rotary_emb_base", default=10000.0),
        norm_eps=_float(doc, where, "layer_norm_eps", "layer_norm_epsilon", default=1e-5),
        source=f"{source}; {kind}" + (f" ({'; '.join(notes)})" if notes else ""))


SPEC_FAMILIES = ("llama", "gpt")
"""The families a YAML model spec may name (a Mochi DiT is the zoo's ``mochi-dit-*``)."""

REQUIRED = ("family", "layers", "hidden", "heads", "ffn", "vocab")
"""The fields a YAML model spec must give (``kv_heads`` defaults to ``heads``)."""


def from_spec(doc: Mapping[str, Any], name: str, source: str, where: str | None = None
              ) -> ModelConfig:
    """A YAML model spec (a mapping of :class:`ModelConfig` fields) as a :class:`ModelConfig`,
    checked by :func:`zoo.schema.check_model`; also what :func:`plan_model` reads back from a
    plan. A float field takes a number or a numeric string (YAML reads ``1e6`` as a string).

    Args:
        where: what messages name (default ``source``).

    Raises:
        ZooError: an unknown field, a missing required one, or fields that do not make a valid
            model (one line naming the field, its value and the fix).
    """
    where = where or source
    fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    bad = sorted(set(doc) - set(fields), key=str)
    if bad:
        close = difflib.get_close_matches(str(bad[0]), list(fields), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ZooError(f"{where}: unknown field {_short(bad[0])}; {hint}valid fields: {', '.join(fields)}")
    for k in REQUIRED:
        if k not in doc:
            raise ZooError(f"{where}: field {k!r} is missing; a model spec needs {', '.join(REQUIRED)}")
    if doc["family"] not in SPEC_FAMILIES:
        raise ZooError(f"{where}: family = {_short(doc['family'])} is not one of "
                       f"{', '.join(SPEC_FAMILIES)}; fix: give one (a Mochi DiT is the zoo's "
                       f"mochi-dit-10b)")
    out: dict[str, Any] = {"name": name, "source": source, "kv_heads": doc["heads"]}
    for k, v in doc.items():
        if str(fields[k].type) == "float" and isinstance(v, str):
            try:
                v = float(v)
            except ValueError:
                pass                     # check_model names it
        out[k] = v
    return check_model(ModelConfig(**out), where)


def config_fields(cfg: ModelConfig) -> dict[str, Any]:
    """``cfg`` as the mapping a plan carries (``Plan.model_config``)."""
    return dataclasses.asdict(cfg)


def plan_model(model: str, model_config: Mapping[str, Any] | None = None) -> ModelConfig:
    """The model of a plan: the fields it carries when it was made from a model file, else the
    zoo model it names.

    Raises:
        ZooError: an unknown zoo name, or carried fields that are not a valid model.
    """
    if model_config:
        fields = dict(model_config)
        return from_spec(fields, str(fields.pop("name", model)), str(fields.pop("source", "plan")),
                         where="the plan's model_config")
    return get_config(model)
