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
full rotary (no parameters either way), and Gemma 3's vision encoder is not modelled. The tokens
per sample default to ``min(max_position_embeddings, 8192)`` (``--seq-len`` overrides it).
A mixture of experts (``mixtral``, ``qwen3_moe``; ``deepseek_v2`` / ``deepseek_v3`` with
multi-head latent attention, shared experts and dense first layers) sets the config's expert
fields (``ModelConfig.experts`` ...); Qwen2-MoE (a gated shared expert) and other MoE designs,
and any other type, are refused in one line naming the type, what is missing and the supported
list.

A YAML model spec is a mapping of :class:`ModelConfig` fields (``name``, ``family``: ``llama`` or
``gpt``, ``layers``, ``hidden``, ``heads``, ``ffn``, ``vocab``, and optionally every other field);
an unknown field is refused in one line listing the valid ones. A plan made from a file carries
the model's fields (``Plan.model_config``), so ``mpmd simulate``, ``run`` and ``export`` need not
find the file again (:func:`plan_model`).
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any, Mapping

from hardware_profiles.paths import PACKAGE_ROOT
from ir.files import read_json, read_yaml
from zoo.config import ModelConfig, ZooError, get_config, list_models

MODEL_FILE_SUFFIXES = (".json", ".yaml", ".yml")
"""A ``--model`` ending in one of these is a model file, anything else a zoo name."""

SEQ_LEN_CAP = 8192
"""Default tokens per sample of a file's model: its ``max_position_embeddings``, at most this
(long-context windows such as Llama 3.1's 131,072 are reached by continued training, not the
pretraining step a plan is usually for)."""

LLAMA_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gemma3_text")
GPT_TYPES = ("gpt2", "gpt_neox", "opt")
MOE_TYPES = ("mixtral", "qwen3_moe", "deepseek_v2", "deepseek_v3")
SUPPORTED_TYPES = LLAMA_TYPES + GPT_TYPES + MOE_TYPES
"""Hugging Face ``model_type`` values read into a decoder (dense, or a mixture of experts in
every block)."""

UNSUPPORTED_MOE = {
    "qwen2_moe": "a gated shared expert", "dbrx": "its fine-grained experts' clipped QKV",
    "jamba": "Mamba layers", "olmoe": "q/k norms with experts", "granitemoe": "its router",
    "phimoe": "its sparse-mixer routing", "grok-1": "its attention and routing"}
"""Mixture-of-experts ``model_type`` values with what the zoo cannot yet express of each."""

_ARCH_TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
               "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
               "GemmaForCausalLM": "gemma", "Gemma2ForCausalLM": "gemma2",
               "Gemma3ForCausalLM": "gemma3_text", "Gemma3ForConditionalGeneration": "gemma3",
               "GPT2LMHeadModel": "gpt2", "GPTNeoXForCausalLM": "gpt_neox",
               "OPTForCausalLM": "opt", "MixtralForCausalLM": "mixtral",
               "Qwen3MoeForCausalLM": "qwen3_moe", "DeepseekV3ForCausalLM": "deepseek_v3"}


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
    shipped = shipped_models()
    try:
        return get_config(name)
    except ZooError:
        if str(name).lower() in shipped:
            return load_model_file(shipped[str(name).lower()])
        known = list_models() + sorted(shipped)
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


def _get(doc: Mapping[str, Any], key: str, where: str, *alts: str, default: Any = None) -> Any:
    for k in (key, *alts):
        if doc.get(k) is not None:
            return doc[k]
    if default is not None:
        return default
    raise ZooError(f"{where}: field {key!r} is missing; give it (the model's published config has it)")


def _int(doc: Mapping[str, Any], key: str, where: str, *alts: str, default: int | None = None) -> int:
    v = _get(doc, key, where, *alts, default=default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ZooError(f"{where}: field {key!r} = {v!r} is not a positive integer; fix the config")
    return v


def model_type(doc: Mapping[str, Any]) -> str:
    """The config's ``model_type``, else the type of its first ``architectures`` entry."""
    if isinstance(doc.get("model_type"), str):
        return doc["model_type"]
    archs = doc.get("architectures") or []
    first = archs[0] if isinstance(archs, list) and archs else ""
    return _ARCH_TYPES.get(str(first), str(first))


def from_hf(doc: Mapping[str, Any], name: str, source: str) -> ModelConfig:
    """A Hugging Face config as a dense decoder :class:`ModelConfig` (module docstring).

    Raises:
        ZooError: a mixture-of-experts or unsupported ``model_type``, or a missing/bad field.
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
    if kind in LLAMA_TYPES:
        return _llama_like(doc, kind, name, source, where)
    if kind in MOE_TYPES:
        return _moe(doc, kind, name, source, where)
    return _gpt_like(doc, kind, name, source, where)


def _llama_like(doc: Mapping[str, Any], kind: str, name: str, source: str, where: str
                ) -> ModelConfig:
    hidden = _int(doc, "hidden_size", where)
    heads = _int(doc, "num_attention_heads", where)
    head_dim = _int(doc, "head_dim", where, default=hidden // heads)
    gemma = kind.startswith("gemma")
    notes = []
    if gemma:
        notes.append("GeGLU costed as SwiGLU (the same three matrices)")
    if kind == "qwen2":
        notes.append("q/k/v biases left out")
    if kind == "qwen3":
        notes.append("q/k norms left out")
    if doc.get("sliding_window") and (kind != "qwen2" or doc.get("use_sliding_window")):
        notes.append(f"sliding-window layers ({doc['sliding_window']} tokens) costed as full attention")
    max_pos = _int(doc, "max_position_embeddings", where, default=SEQ_LEN_CAP)
    return ModelConfig(
        name=name, family="llama", layers=_int(doc, "num_hidden_layers", where),
        hidden=hidden, heads=heads, kv_heads=_int(doc, "num_key_value_heads", where, default=heads),
        ffn=_int(doc, "intermediate_size", where), vocab=_int(doc, "vocab_size", where),
        seq_len=min(max_pos, SEQ_LEN_CAP), norm="rms", mlp="swiglu", pos_emb="rope",
        bias=bool(doc.get("attention_bias", False)) and kind == "llama",
        tie_embeddings=bool(doc.get("tie_word_embeddings", gemma)),
        rope_theta=float(doc.get("rope_theta") or 10000.0),
        norm_eps=float(doc.get("rms_norm_eps") or 1e-6),
        head_size=head_dim if head_dim != hidden // heads else 0,
        source=f"{source}; {kind}" + (f" ({'; '.join(notes)})" if notes else ""))


def _moe(doc: Mapping[str, Any], kind: str, name: str, source: str, where: str) -> ModelConfig:
    """Mixtral (``num_local_experts``, ``intermediate_size`` per expert) and Qwen3-MoE
    (``num_experts``, ``moe_intermediate_size``; every layer sparse) as a llama-family decoder
    whose every block's MLP is a mixture of experts."""
    if kind.startswith("deepseek"):
        return _deepseek(doc, kind, name, source, where)
    if kind == "qwen3_moe":
        if doc.get("mlp_only_layers") or int(doc.get("decoder_sparse_step", 1)) != 1:
            raise ZooError(f"{where}: dense layers among the sparse ones (mlp_only_layers, "
                           f"decoder_sparse_step) are not modelled; every layer must be sparse")
        experts, ffn = _int(doc, "num_experts", where), _int(doc, "moe_intermediate_size", where)
    else:
        experts, ffn = _int(doc, "num_local_experts", where), _int(doc, "intermediate_size", where)
    top_k = _int(doc, "num_experts_per_tok", where)
    if top_k > experts:
        raise ZooError(f"{where}: num_experts_per_tok {top_k} exceeds the {experts} experts; fix the config")
    base = _llama_like({**doc, "intermediate_size": ffn}, "qwen3" if kind == "qwen3_moe" else "mistral",
                       name, source, where)
    return dataclasses.replace(base, experts=experts, experts_per_token=top_k, expert_ffn=ffn,
                               source=base.source.replace("; qwen3", "; qwen3_moe", 1)
                               .replace("; mistral", "; mixtral", 1)
                               + f" ({experts} experts, top {top_k}, capacity factor 1)")


def _deepseek(doc: Mapping[str, Any], kind: str, name: str, source: str, where: str
              ) -> ModelConfig:
    """DeepSeek-V2/V3: multi-head latent attention, ``n_routed_experts`` routed and
    ``n_shared_experts`` shared experts of width ``moe_intermediate_size`` in every block after
    the first ``first_k_dense_replace`` (dense, width ``intermediate_size``). The router is
    costed as a softmax top-k (V3's sigmoid scores with group-limited selection move the same
    bytes); V3's multi-token-prediction module (``num_nextn_predict_layers``) is left out, as the
    published 671B total leaves it out."""
    if int(doc.get("moe_layer_freq", 1)) != 1:
        raise ZooError(f"{where}: moe_layer_freq {doc['moe_layer_freq']} (dense layers between the "
                       f"sparse ones) is not modelled; every layer after the first dense ones must be sparse")
    hidden, heads = _int(doc, "hidden_size", where), _int(doc, "num_attention_heads", where)
    q_rank = doc.get("q_lora_rank") or 0
    notes = ["router costed as softmax top-k"]
    if doc.get("num_nextn_predict_layers"):
        notes.append("multi-token prediction module left out")
    max_pos = _int(doc, "max_position_embeddings", where, default=SEQ_LEN_CAP)
    return ModelConfig(
        name=name, family="llama", layers=_int(doc, "num_hidden_layers", where), hidden=hidden,
        heads=heads, kv_heads=heads, ffn=_int(doc, "intermediate_size", where),
        vocab=_int(doc, "vocab_size", where), seq_len=min(max_pos, SEQ_LEN_CAP), norm="rms",
        mlp="swiglu", pos_emb="rope", tie_embeddings=bool(doc.get("tie_word_embeddings", False)),
        rope_theta=float(doc.get("rope_theta") or 10000.0),
        norm_eps=float(doc.get("rms_norm_eps") or 1e-6),
        head_size=_int(doc, "qk_nope_head_dim", where),
        experts=_int(doc, "n_routed_experts", where),
        experts_per_token=_int(doc, "num_experts_per_tok", where),
        expert_ffn=_int(doc, "moe_intermediate_size", where),
        shared_experts=int(doc.get("n_shared_experts") or 0),
        dense_layers=int(doc.get("first_k_dense_replace") or 0),
        q_lora_rank=int(q_rank), kv_lora_rank=_int(doc, "kv_lora_rank", where),
        qk_rope_head_dim=_int(doc, "qk_rope_head_dim", where),
        v_head_dim=_int(doc, "v_head_dim", where),
        source=f"{source}; {kind} ({'; '.join(notes)})")


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
        tie = bool(doc.get("tie_word_embeddings", kind == "opt"))
    notes = []
    if kind == "gpt_neox" and doc.get("rotary_pct", 1.0) != 1.0:
        notes.append(f"rotary on {doc['rotary_pct']} of each head costed as full rotary")
    if kind == "opt" and doc.get("word_embed_proj_dim", hidden) != hidden:
        notes.append(f"embedding projected to {doc['word_embed_proj_dim']} costed at width {hidden}")
    if hidden % heads:
        raise ZooError(f"{where}: hidden size {hidden} is not divisible by {heads} heads; fix the config")
    return ModelConfig(
        name=name, family="gpt", layers=layers, hidden=hidden, heads=heads, kv_heads=heads,
        ffn=ffn, vocab=_int(doc, "vocab_size", where), seq_len=min(max_pos, SEQ_LEN_CAP),
        norm="layer", mlp=act, pos_emb=pos, bias=True, tie_embeddings=tie,
        rope_theta=float(doc.get("rotary_emb_base") or 10000.0),
        norm_eps=float(doc.get("layer_norm_eps") or doc.get("layer_norm_epsilon") or 1e-5),
        source=f"{source}; {kind}" + (f" ({'; '.join(notes)})" if notes else ""))


_CHOICES = {"family": ("llama", "gpt"), "norm": ("rms", "layer"),
            "mlp": ("swiglu", "gelu", "relu"), "pos_emb": ("rope", "learned", "none"),
            "dtype": ("bfloat16", "float32"), "attention_kernel": ("flash", "unfused"),
            "attention": ("plain", "flash", "fused")}
"""The fields of a model spec with a fixed vocabulary, and their values."""


def from_spec(doc: Mapping[str, Any], name: str, source: str) -> ModelConfig:
    """A YAML model spec (a mapping of :class:`ModelConfig` fields) as a :class:`ModelConfig`;
    also what :func:`plan_model` reads back from a plan.

    Raises:
        ZooError: an unknown field, a missing required one, or a value of the wrong type.
    """
    fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
    bad = sorted(set(doc) - set(fields))
    if bad:
        raise ZooError(f"{source}: unknown field {bad[0]!r}; valid fields: {', '.join(fields)}")
    required = ("family", "layers", "hidden", "heads", "ffn", "vocab")
    for k in required:
        if k not in doc:
            raise ZooError(f"{source}: field {k!r} is missing; a model spec needs "
                           f"{', '.join(required)}")
    defaults = {f.name: f.default for f in fields.values()}
    out: dict[str, Any] = {"name": name, "source": source, "kv_heads": doc["heads"]}
    for k, v in doc.items():
        want = defaults.get(k)
        if k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "seq_len"):
            want = 1
        ok = (isinstance(v, bool) if isinstance(want, bool) else
              isinstance(v, (int, float)) and not isinstance(v, bool) if isinstance(want, float) else
              isinstance(v, int) and not isinstance(v, bool) if isinstance(want, int) else
              isinstance(v, str))
        if not ok or (isinstance(v, int) and not isinstance(v, bool) and v < 0):
            raise ZooError(f"{source}: field {k!r} = {v!r} has the wrong type or sign; give a "
                           f"{type(want).__name__ if want is not None else 'str'}")
        if k in _CHOICES and v not in _CHOICES[k]:
            raise ZooError(f"{source}: {k} {v!r} is not one of {', '.join(_CHOICES[k])}")
        out[k] = float(v) if isinstance(want, float) else v
    for k in required[1:]:
        if out[k] < 1:
            raise ZooError(f"{source}: field {k!r} must be at least 1")
    if out.get("head_size", 0) == 0 and out["hidden"] % out["heads"]:
        raise ZooError(f"{source}: hidden {out['hidden']} is not divisible by {out['heads']} heads; "
                       f"set head_size")
    return ModelConfig(**out)


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
        return from_spec(fields, str(fields.pop("name", model)), str(fields.pop("source", "plan")))
    return get_config(model)
