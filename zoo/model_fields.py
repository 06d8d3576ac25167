"""Field readers shared by :mod:`zoo.model_files` and :mod:`zoo.model_files_moe`: typed, checked
reads of a Hugging Face config's keys (each bad value one line naming the key and the fix), and
the llama-family decoder every other reader starts from."""

from __future__ import annotations

import math
from typing import Any, Mapping

from zoo.config import ModelConfig, ZooError

__all__ = ["SEQ_LEN_CAP", "llama_like"]


SEQ_LEN_CAP = 8192
"""Default tokens per sample of a file's model: its ``max_position_embeddings``, at most this
(long-context windows such as Llama 3.1's 131,072 are reached by continued training, not the
pretraining step a plan is usually for)."""


def _get(doc: Mapping[str, Any], key: str, where: str, *alts: str, default: Any = None) -> Any:
    for k in (key, *alts):
        if doc.get(k) is not None:
            return doc[k]
    if default is not None:
        return default
    raise ZooError(f"{where}: field {key!r} is missing; give it (the model's published config has it)")


def _int(doc: Mapping[str, Any], key: str, where: str, *alts: str, default: int | None = None) -> int:
    """A required (or defaulted) positive integer field; its upper limit is :func:`check_model`'s."""
    v = _get(doc, key, where, *alts, default=default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ZooError(f"{where}: field {key!r} = {_short(v)} is not a positive integer; fix the config")
    return v


def _count(doc: Mapping[str, Any], key: str, where: str, default: int = 0) -> int:
    """An optional integer field that may be 0 (``null`` reads as ``default``)."""
    v = doc.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ZooError(f"{where}: field {key!r} = {_short(v)} is not a whole number >= 0; fix the config")
    return v


def _float(doc: Mapping[str, Any], where: str, *keys: str, default: float) -> float:
    """The first of ``keys`` present (``null`` and 0 read as absent, as Hugging Face does), as a
    finite number; its range is :func:`check_model`'s."""
    for key in keys:
        v = doc.get(key)
        if v is None or v == 0:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ZooError(f"{where}: field {key!r} = {_short(v)} is not a finite number; fix the config")
        return float(v)
    return default


def _bool(doc: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    v = doc.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ZooError(f"{where}: field {key!r} = {_short(v)} is not true or false; fix the config")
    return v


def _short(v: Any, limit: int = 60) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def llama_like(doc: Mapping[str, Any], kind: str, name: str, source: str, where: str
                ) -> ModelConfig:
    hidden = _int(doc, "hidden_size", where)
    heads = _int(doc, "num_attention_heads", where)
    head_dim = _int(doc, "head_dim", where) if doc.get("head_dim") is not None else 0
    gemma = kind.startswith("gemma")
    notes = []
    if gemma:
        notes.append("GeGLU costed as SwiGLU (the same three matrices)")
    if kind == "qwen2":
        notes.append("q/k/v biases left out")
    if kind == "qwen3":
        notes.append("q/k norms left out")
    window = doc.get("sliding_window")
    if window and (kind != "qwen2" or doc.get("use_sliding_window")):
        notes.append(f"sliding-window layers ({_short(window, 20)} tokens) costed as full attention")
    notes += _rope_scaling_note(doc)
    max_pos = _int(doc, "max_position_embeddings", where, default=SEQ_LEN_CAP)
    return ModelConfig(
        name=name, family="llama", layers=_int(doc, "num_hidden_layers", where),
        hidden=hidden, heads=heads, kv_heads=_int(doc, "num_key_value_heads", where, default=heads),
        ffn=_int(doc, "intermediate_size", where), vocab=_int(doc, "vocab_size", where),
        seq_len=min(max_pos, SEQ_LEN_CAP), norm="rms", mlp="swiglu", pos_emb="rope",
        bias=_bool(doc, "attention_bias", where, False) and kind == "llama",
        tie_embeddings=_bool(doc, "tie_word_embeddings", where, gemma),
        rope_theta=_float(doc, where, "rope_theta", default=10000.0),
        norm_eps=_float(doc, where, "rms_norm_eps", default=1e-6),
        head_size=head_dim if head_dim * heads != hidden else 0,   # 0: hidden / heads
        qk_norm=kind == "qwen3",      # Qwen3's q_norm / k_norm (Qwen3-MoE is read as qwen3)
        source=f"{source}; {kind}" + (f" ({'; '.join(notes)})" if notes else ""))


ROPE_SCALING_KINDS = ("linear", "llama3", "yarn")
"""The ``rope_scaling`` types the zoo carries (Hugging Face's ``rope_type``, or ``type`` in older
configs); another (``dynamic``, ``longrope``) is refused in one line."""


def rope_scaling_fields(doc: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A config's ``rope_scaling`` as :class:`~zoo.config.ModelConfig` fields (``rope_scaling``,
    ``rope_factor``, ...: its docstring); ``{}`` when the config has none.

    Raises:
        ZooError: a ``rope_scaling`` that is not a mapping, of an unsupported type, or with a
            figure that is not a number.
    """
    scaling = doc.get("rope_scaling")
    if scaling is None:
        return {}
    if not isinstance(scaling, Mapping):
        raise ZooError(f"{where}: field 'rope_scaling' = {_short(scaling)} is not a mapping; fix: "
                       f"give the published rope_scaling or remove it")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return {}
    if kind not in ROPE_SCALING_KINDS:
        raise ZooError(f"{where}: rope_scaling type {_short(kind)} is not supported; supported: "
                       f"{', '.join(ROPE_SCALING_KINDS)}")
    keys = {"rope_factor": "factor", "rope_original_max_position": "original_max_position_embeddings",
            "rope_low_freq_factor": "low_freq_factor", "rope_high_freq_factor": "high_freq_factor",
            "rope_beta_fast": "beta_fast", "rope_beta_slow": "beta_slow", "rope_mscale": "mscale",
            "rope_mscale_all_dim": "mscale_all_dim"}
    out: dict[str, Any] = {"rope_scaling": kind}
    for field, key in keys.items():
        if key in scaling:
            value = _float({key: scaling[key]}, f"{where}: rope_scaling", key, default=0.0)
            out[field] = int(value) if field == "rope_original_max_position" else value
    if "truncate" in scaling:
        out["rope_truncate"] = _bool(scaling, "truncate", f"{where}: rope_scaling", True)
    return out


def _rope_scaling_note(doc: Mapping[str, Any]) -> list[str]:
    """A config's ``rope_scaling`` (Llama 3.1's ``llama3``, YaRN) rescales the rotary frequencies:
    no parameters and the same FLOP, so it is costed as plain RoPE and named in the source."""
    scaling = doc.get("rope_scaling")
    if not isinstance(scaling, Mapping):
        return []
    kind = scaling.get("rope_type", scaling.get("type", "rope"))
    return [f"{_short(kind, 20)} rope scaling costed as plain RoPE (carried for the exports)"]
