"""The read-back half of the ``launchers`` suite: what a plan JSON says a job is
(:func:`expected_parts`, read from the plan's IR and the zoo model, not from the exporters), and
the differences between that and a launcher's parsed config (:func:`mismatches`, the values the
checkers in ``checks/`` print): micro batch and accumulation, the data / context / tensor /
pipeline / virtual / expert degrees and FSDP, the schedule and each stage's blocks,
recomputation, precision, and the model's architecture.

Where a target cannot say what the plan says, the exporter's one-line note must say so: the
comparison then accepts the written value only if that note is among the file's notes (the
notes' phrases are named here, next to each allowance)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ir import DataParallelPlan, Plan
from zoo.config import ModelConfig
from zoo.model_files import plan_model
from zoo.models import layer_names


@dataclass(frozen=True)
class Expect:
    """One pipeline of a plan as a launcher should run it."""

    data: int
    context: int
    tensor: int
    expert: int
    fsdp: bool
    hsdp: int
    pipeline: int
    virtual: int
    schedule: str
    microbatches: int
    micro_batch: int
    global_batch: int
    seq_len: int
    recompute: bool
    precision: str
    blocks: tuple[int, ...]       # transformer blocks of each stage, in stage order
    model: ModelConfig


def _expect(p: Plan) -> Expect:
    cfg = plan_model(p.model, p.model_config) if p.model_config else plan_model(p.model)
    meshes = list(p.rank_mesh)
    lay = Counter(p.layouts[m] for m in meshes).most_common(1)[0][0]
    t = p.schedule
    names = layer_names(cfg)
    blocks = tuple(sum(1 for n in names[s.first:s.last] if n.startswith("block"))
                   for s in p.stages)
    return Expect(data=lay.data, context=lay.context, tensor=lay.tensor, expert=lay.expert,
                  fsdp=lay.fsdp, hsdp=lay.hsdp, pipeline=t.num_ranks,
                  virtual=t.num_stages // t.num_ranks, schedule=t.name,
                  microbatches=t.microbatches,
                  micro_batch=p.global_batch // (t.microbatches * lay.data),
                  global_batch=p.global_batch, seq_len=p.seq_len,
                  recompute=any(bool(p.recompute.get(m, False)) for m in meshes),
                  precision=p.precision, blocks=blocks, model=cfg)


def expected_parts(plan: Plan | DataParallelPlan) -> dict[str, Expect]:
    """Part name (``""`` for a one-pipeline plan, else ``part{i}``) -> :class:`Expect`."""
    if isinstance(plan, Plan):
        return {"": _expect(plan)}
    return {f"part{i}": _expect(p) for i, p in enumerate(plan.parts)}


def _noted(notes, *phrases: str) -> bool:
    return any(all(ph in n for ph in phrases) for n in notes)


def _cmp(out: list[str], what: str, got, want) -> None:
    if got != want:
        out.append(f"{what}: launcher {got!r}, plan {want!r}")


def _qk_norm(m: ModelConfig) -> bool:
    # the plan's model field (Qwen3's per-head q/k RMSNorm, set by the zoo's config reader)
    return m.qk_norm


def _rope(m: ModelConfig) -> tuple:
    """The plan model's RoPE scaling as the read-back compares it: ``()`` none; ``("llama3",
    factor)``; ``("linear", factor)``; ``("yarn", factor, original positions, beta fast, beta
    slow, truncate)`` with YaRN's defaults (4096, 32, 1) where the config gives none."""
    if m.pos_emb != "rope" or not m.rope_scaling:
        return ()
    if m.rope_scaling in ("llama3", "linear"):
        return (m.rope_scaling, float(m.rope_factor))
    return ("yarn", float(m.rope_factor), m.rope_original_max_position or 4096,
            float(m.rope_beta_fast or 32.0), float(m.rope_beta_slow or 1.0), m.rope_truncate)


def _megatron_rope(v: dict, mla: bool) -> tuple:
    """Megatron-LM's parsed arguments as :func:`_rope`'s tuple (MLA's YaRN: the fixed
    ``MLATransformerConfig`` range 4096 / 32 / 1, rounded)."""
    if v.get("use_rope_scaling"):
        return ("llama3", float(v["rope_scaling_factor"]))
    if v.get("rotary_seq_len_interpolation_factor"):
        return ("linear", float(v["rotary_seq_len_interpolation_factor"]))
    if mla and v.get("rope_type") == "yarn":
        return ("yarn", float(v["rotary_scaling_factor"]), 4096, 32.0, 1.0, True)
    if v.get("position_embedding_type") == "yarn":
        return ("yarn", float(v["rotary_scaling_factor"]),
                v.get("yarn_original_max_position_embeddings") or 4096,
                float(v.get("yarn_beta_fast") or 32.0), float(v.get("yarn_beta_slow") or 1.0),
                v.get("yarn_correction_range_round_to_int") is not False)
    return ()


def _bridge_rope(v: dict, mla: bool) -> tuple:
    """Megatron-Bridge's model provider as :func:`_rope`'s tuple."""
    if v.get("rope_scaling"):
        return ("llama3", float(v["rope_scaling_factor"]))
    if v.get("seq_len_interpolation_factor"):
        return ("linear", float(v["seq_len_interpolation_factor"]))
    if mla and v.get("rope_type") == "yarn":
        return ("yarn", float(v["rotary_scaling_factor"]), v["original_max_position_embeddings"],
                float(v["beta_fast"]), float(v["beta_slow"]), True)
    if v.get("position_embedding_type") == "yarn":
        return ("yarn", float(v["yarn_rotary_scaling_factor"]),
                v.get("yarn_original_max_position_embeddings") or 4096,
                float(v.get("yarn_beta_fast") or 32.0), float(v.get("yarn_beta_slow") or 1.0),
                v.get("yarn_correction_range_round_to_int") is not False)
    return ()


def _rope_full(m: ModelConfig) -> list:
    """:func:`_rope` with Llama 3.1's band figures too (torchtitan sets them):
    ``["llama3", factor, low, high, original positions]``."""
    r = list(_rope(m))
    if r and r[0] == "llama3":
        r += [m.rope_low_freq_factor or 1.0, m.rope_high_freq_factor or 4.0,
              m.rope_original_max_position or 8192]
    return r


def _rope_cmp(out: list[str], got: tuple, m: ModelConfig, notes, *allow: str) -> None:
    """Compare the RoPE scaling; a difference is accepted where the exporter's note (one of the
    phrases ``allow``) said the target cannot express it."""
    if got != _rope(m) and not any(_noted(notes, a) for a in allow):
        out.append(f"rope scaling: launcher {got!r}, plan {_rope(m)!r}")


def _megatron(e: Expect, v: dict, notes) -> list[str]:
    out: list[str] = []
    m = e.model
    _cmp(out, "tensor", v["tensor_model_parallel_size"], e.tensor)
    _cmp(out, "pipeline", v["pipeline_model_parallel_size"], e.pipeline)
    _cmp(out, "context", v["context_parallel_size"], e.context)
    _cmp(out, "data", v["data_parallel_size"], e.data)
    _cmp(out, "virtual", v["virtual_pipeline_model_parallel_size"] or 1, e.virtual)
    if m.moe:
        _cmp(out, "expert", v["expert_model_parallel_size"], e.expert)
    _cmp(out, "fsdp", bool(v.get("use_megatron_fsdp") or v.get("use_torch_fsdp2")), e.fsdp)
    _cmp(out, "micro batch", v["micro_batch_size"], e.micro_batch)
    _cmp(out, "global batch", v["global_batch_size"], e.global_batch)
    _cmp(out, "accumulation", v["global_batch_size"] // (v["micro_batch_size"]
                                                       * v["data_parallel_size"]), e.microbatches)
    _cmp(out, "seq length", v["seq_length"], e.seq_len)
    if e.pipeline > 1:
        layout = v.get("pipeline_model_parallel_layout")
        if layout:     # validate_args parses it into its layout object; str() of the stages
            got = _layout_blocks(str(layout), e)
        else:
            per = v["num_layers_per_virtual_pipeline_stage"] or v["num_layers"] // e.pipeline
            got = tuple([per] * (e.pipeline * e.virtual))
        _cmp(out, "stage blocks", got, e.blocks)
        if e.schedule not in ("1f1b", "interleaved-1f1b") and not _noted(
                notes, f"schedule {e.schedule} has no Megatron-LM setting"):
            out.append(f"schedule {e.schedule} written without a note")
    _cmp(out, "recompute", v["recompute_granularity"] == "full", e.recompute)
    prec = {"bf16": (None, None), "fp8": ("tensorwise", None),
            "fp8-blockwise": ("blockwise", None), "mxfp8": ("mxfp8", None),
            "nvfp4": (None, "nvfp4")}[e.precision]
    _cmp(out, "precision", (v["fp8_recipe"] if v["fp8"] else None,
                            v.get("fp4_recipe") if v.get("fp4") else None), prec)
    _cmp(out, "layers", v["num_layers"], m.layers)
    _cmp(out, "hidden", v["hidden_size"], m.hidden)
    _cmp(out, "heads", v["num_attention_heads"], m.heads)
    if not m.mla:
        _cmp(out, "kv heads", v["num_query_groups"] if v["group_query_attention"] else
             v["num_attention_heads"], m.kv_heads)
    _cmp(out, "vocab", v["vocab_size"], m.vocab)
    if m.family == "llama":
        _cmp(out, "rope base", v["rotary_base"], int(m.rope_theta))
        _rope_cmp(out, _megatron_rope(v, m.mla), m, notes, "rope scaling", "YaRN")
    if m.sliding_window and m.full_attention_every:    # Transformer Engine's (left, right)
        win = v.get("window_size")
        _cmp(out, "sliding window", win[0] + 1 if win else 0, m.sliding_window)
        _cmp(out, "full attention every", v.get("window_attn_skip_freq"), m.full_attention_every)
    _cmp(out, "mla", bool(v["multi_latent_attention"]), m.mla)
    if m.mla:
        _cmp(out, "kv lora rank", v["kv_lora_rank"], m.kv_lora_rank)
        _cmp(out, "q lora rank", v["q_lora_rank"] or 0, m.q_lora_rank)
    _cmp(out, "qk norm", bool(v["qk_layernorm"]), _qk_norm(m))
    _cmp(out, "tied embeddings", not v["untie_embeddings_and_output_weights"], m.tie_embeddings)
    if not m.moe or m.dense_layers:
        _cmp(out, "ffn", v["ffn_hidden_size"], m.ffn)
    _cmp(out, "experts", v["num_experts"] or 0, m.experts)
    if m.moe:
        _cmp(out, "top k", v["moe_router_topk"], m.experts_per_token)
        _cmp(out, "expert ffn", v["moe_ffn_hidden_size"], m.expert_ffn)
        _cmp(out, "shared expert ffn", v["moe_shared_expert_intermediate_size"] or 0,
             m.shared_experts * m.expert_ffn)
        freq = v["moe_layer_freq"]
        dense = freq.count(0) if isinstance(freq, list) else 0
        _cmp(out, "dense first blocks", dense, m.dense_layers)
    return out


def _layout_blocks(text: str, e: Expect) -> tuple[int, ...]:
    """Blocks per stage of Megatron-core's parsed layout, in virtual-stage-major order, from its
    string form (``E``/``t``/``L`` per stage, ``|`` between, or the object's list repr)."""
    if "|" in text:
        return tuple(s.count("t") for s in text.split("|"))
    import ast
    stages = ast.literal_eval(text)     # [[...per rank...] per virtual stage] of layer names
    flat = [st for vs in zip(*stages) for st in vs] if isinstance(stages[0][0], list) else stages
    return tuple(sum(1 for n in st if "decoder" in str(n)) for st in flat)


BRIDGE_PRECISION = {"bf16": (None, None), "fp8": ("tensorwise", None),
                    "fp8-blockwise": ("blockwise", None), "mxfp8": ("mxfp8", None),
                    "nvfp4": (None, "nvfp4")}
"""Plan precision -> Megatron-Bridge's resolved ``MixedPrecisionConfig`` (fp8_recipe when fp8 is
on, fp4_recipe when fp4 is on)."""


def _bridge(e: Expect, v: dict, notes) -> list[str]:
    """A Megatron-Bridge ConfigContainer after the overrides and ``runtime_config_update``
    (``checks/megatron_bridge_check.py``'s values) against the plan."""
    out: list[str] = []
    m = e.model
    _cmp(out, "tensor", v["tensor_model_parallel_size"], e.tensor)
    _cmp(out, "pipeline", v["pipeline_model_parallel_size"], e.pipeline)
    _cmp(out, "context", v["context_parallel_size"], e.context)
    _cmp(out, "data", v["data_parallel_size"], e.data)
    _cmp(out, "virtual", v["virtual_pipeline_model_parallel_size"] or 1, e.virtual)
    if m.moe:
        _cmp(out, "expert", v["expert_model_parallel_size"], e.expert)
    _cmp(out, "fsdp", v["use_megatron_fsdp"], e.fsdp)
    _cmp(out, "micro batch", v["micro_batch_size"], e.micro_batch)
    _cmp(out, "global batch", v["global_batch_size"], e.global_batch)
    _cmp(out, "accumulation", v["global_batch_size"] // (v["micro_batch_size"]
                                                       * v["data_parallel_size"]), e.microbatches)
    _cmp(out, "seq length", (v["seq_length"], v["dataset_seq_length"]), (e.seq_len, e.seq_len))
    if e.pipeline > 1:
        layout = v.get("pipeline_model_parallel_layout")
        if layout:
            got = _layout_blocks(str(layout), e)
        else:
            got = tuple([v["num_layers"] // (e.pipeline * e.virtual)] * (e.pipeline * e.virtual))
        _cmp(out, "stage blocks", got, e.blocks)
        if e.schedule not in ("1f1b", "interleaved-1f1b") and not _noted(
                notes, f"schedule {e.schedule} has no Megatron-Bridge setting"):
            out.append(f"schedule {e.schedule} written without a note")
    _cmp(out, "recompute", v["recompute_granularity"] == "full", e.recompute)
    _cmp(out, "precision", (v["mp_fp8_recipe"] if v["mp_fp8"] else None,
                            v["mp_fp4_recipe"] if v["mp_fp4"] else None),
         BRIDGE_PRECISION[e.precision])
    _cmp(out, "layers", v["num_layers"], m.layers)
    _cmp(out, "hidden", v["hidden_size"], m.hidden)
    _cmp(out, "heads", v["num_attention_heads"], m.heads)
    if not m.mla:
        _cmp(out, "kv heads", v["num_query_groups"], m.kv_heads)
        _cmp(out, "head width", v["kv_channels"], m.head_dim)
    _cmp(out, "vocab", v["vocab_size"], m.vocab)
    if m.family == "llama":
        _cmp(out, "rope base", int(v["rotary_base"]), int(m.rope_theta))
        _rope_cmp(out, _bridge_rope(v, m.mla), m, notes, "rope scaling")
    _cmp(out, "mla", bool(v["multi_latent_attention"]), m.mla)
    if m.mla:
        _cmp(out, "kv lora rank", v["kv_lora_rank"], m.kv_lora_rank)
        _cmp(out, "q lora rank", v["q_lora_rank"] or 0, m.q_lora_rank)
    _cmp(out, "qk norm", bool(v["qk_layernorm"]), _qk_norm(m))
    _cmp(out, "tied embeddings", bool(v["share_embeddings_and_output_weights"]), m.tie_embeddings)
    _cmp(out, "mtp layers", v["mtp_num_layers"] or 0, m.mtp_layers)
    win = v.get("window_size")     # Transformer Engine's (left, right): left + 1 keys
    _cmp(out, "sliding window", win[0] + 1 if win else 0, m.sliding_window)
    if not m.moe or m.dense_layers:
        _cmp(out, "ffn", v["ffn_hidden_size"], m.ffn)
    _cmp(out, "experts", v["num_moe_experts"] or 0, m.experts)
    if m.moe:
        _cmp(out, "top k", v["moe_router_topk"], m.experts_per_token)
        _cmp(out, "expert ffn", v["moe_ffn_hidden_size"], m.expert_ffn)
        _cmp(out, "shared expert ffn", v["moe_shared_expert_intermediate_size"] or 0,
             m.shared_experts * m.expert_ffn)
        freq = v["moe_layer_freq"]
        _cmp(out, "dense first blocks", freq.count(0) if isinstance(freq, list) else 0,
             m.dense_layers)
    return out


SCHEDULES_TT = {"1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B", "gpipe": "GPipe",
                "zb-v": "ZBVZeroBubble", "dualpipe-v": "DualPipeV"}
"""Plan schedule -> the ``torch.distributed.pipelining`` schedule class torchtitan runs it as."""


def _torchtitan(e: Expect, v: dict, notes, version: str) -> list[str]:
    out: list[str] = []
    p, t, m = v["parallelism"], v["training"], e.model
    _cmp(out, "tensor", p["tensor_parallel_degree"], e.tensor)
    _cmp(out, "pipeline", p["pipeline_parallel_degree"], e.pipeline)
    _cmp(out, "context", p["context_parallel_degree"], e.context)
    _cmp(out, "data", v["dp_replicate"] * v["dp_shard"], e.data)
    if m.moe:
        _cmp(out, "expert", p.get("expert_parallel_degree", 1), e.expert)
    if e.fsdp:
        _cmp(out, "hsdp replicas", v["dp_replicate"], e.hsdp)
    elif e.data * e.context > 1 and not _noted(notes, "torchtitan shards parameters"):
        out.append("a replicated data axis written as FSDP without a note")
    _cmp(out, "global batch", t["global_batch_size"], e.global_batch)
    _cmp(out, "seq length", t["seq_len"], e.seq_len)
    if e.pipeline > 1:
        mb = p["pipeline_parallel_microbatch_size"]
        _cmp(out, "micro batch", mb, e.micro_batch)
        _cmp(out, "microbatches", t["local_batch_size"] // mb, e.microbatches)
        _cmp(out, "accumulation", v["accumulation"], 1)
        _cmp(out, "schedule", p["pipeline_parallel_schedule"], SCHEDULES_TT.get(e.schedule))
        parts = p["module_fqns_per_model_part"] or []
        _cmp(out, "stage blocks", tuple(sum(1 for n in s if n.startswith("layers."))
                                        for s in parts), e.blocks)
    else:
        _cmp(out, "micro batch", t["local_batch_size"], e.micro_batch)
        _cmp(out, "accumulation", v["accumulation"], e.microbatches)
    ac = v["activation_checkpoint"]
    _cmp(out, "recompute", ac in ("full", "FullAC.Config"), e.recompute)
    if e.precision == "bf16" and v.get("converters") is not None:   # 0.2's [model] converters
        _cmp(out, "precision converters", v["converters"], [])
    s = v["model_config"]
    _cmp(out, "layers", s["layers"], m.layers)
    _cmp(out, "hidden", s["dim"], m.hidden)
    _cmp(out, "heads", s["n_heads"], m.heads)
    if not m.mla:
        _cmp(out, "kv heads", s["n_kv_heads"], m.kv_heads)
    _cmp(out, "vocab", s["vocab_size"], m.vocab)
    if s["rope_theta"] is not None and not _noted(notes, "the 0.2 TOML cannot set it"):
        _cmp(out, "rope base", float(s["rope_theta"]), float(m.rope_theta))
    if "rope" in s and not _noted(notes, "rope scaling", "the 0.2 TOML cannot set it") and not \
            _noted(notes, "has no linear scaling"):
        _cmp(out, "rope scaling", [float(x) if isinstance(x, (int, float)) and not isinstance(
            x, bool) else x for x in s["rope"]], [float(x) if isinstance(x, (int, float)) and not
                                                  isinstance(x, bool) else x for x in _rope_full(m)])
    _cmp(out, "qk norm", s["qk_norm"], _qk_norm(m))
    _cmp(out, "kv lora rank", s["kv_lora_rank"] or 0, m.kv_lora_rank)
    _cmp(out, "q lora rank", s["q_lora_rank"] or 0, m.q_lora_rank)
    _cmp(out, "experts", s["num_experts"] or 0, m.experts)
    if m.moe:
        _cmp(out, "top k", s["top_k"], m.experts_per_token)
        _cmp(out, "expert ffn", s["moe_hidden"], m.expert_ffn)
        _cmp(out, "shared expert ffn", s["shared_hidden"] or 0, m.shared_experts * m.expert_ffn)
        _cmp(out, "dense first blocks", s["dense_layers"], m.dense_layers)
    if s["ffn_hidden"] is not None and (not m.moe or m.dense_layers):
        _cmp(out, "ffn", s["ffn_hidden"], m.ffn)
    _cmp(out, "tied embeddings", s["tied_embeddings"], m.tie_embeddings)
    if "windows" in s:      # each block's sliding window, 0 for full attention
        _cmp(out, "sliding windows", s["windows"], [m.layer_window(i) for i in range(m.layers)])
    return out


def _maxtext_rope(v: dict) -> tuple:
    """MaxText's parsed config as :func:`_rope`'s tuple: ``llama3.1`` RoPE (by ``rope_type`` or a
    ``llama3.1`` model name: ``attentions.py``) scales by a fixed 8; ``yarn`` by its keys."""
    kind = str(v.get("rope_type") or "default").lower()
    if kind.startswith("llama3.1") or str(v.get("model_name", "")).startswith("llama3.1"):
        return ("llama3", 8.0) if v.get("rope_use_scale", True) else ()
    if kind.startswith("yarn"):
        return ("yarn", float(v["rope_factor"]), v["original_max_position_embeddings"],
                float(v["beta_fast"]), float(v["beta_slow"]), bool(v["rope_truncate"]))
    factor = float(v.get("rope_linear_scaling_factor") or 1.0)
    return ("linear", factor) if factor != 1.0 else ()


def _maxtext(e: Expect, v: dict, notes) -> list[str]:
    out: list[str] = []
    m = e.model

    def axis(*names: str) -> int:
        n = 1
        for a in names:
            for lvl in ("ici", "dcn"):
                n *= max(1, v.get(f"{lvl}_{a}_parallelism", 1))
        return n

    _cmp(out, "data", axis("data", "fsdp", "fsdp_transpose", "expert"), e.data)
    _cmp(out, "context", axis("context"), e.context)
    _cmp(out, "tensor", axis("tensor", "tensor_transpose", "tensor_sequence"), e.tensor)
    _cmp(out, "pipeline", axis("pipeline"), e.pipeline)
    if e.fsdp:
        _cmp(out, "fsdp", axis("fsdp") > 1 or e.data == 1, True)
    if m.moe and e.expert > 1 and axis("expert") != e.expert and not _noted(
            notes, f"expert parallel {e.expert}"):
        out.append(f"expert {axis('expert')} written for the plan's {e.expert} without a note")
    _cmp(out, "global batch", v["global_batch_size_to_train_on"], e.global_batch)
    _cmp(out, "seq length", v["max_target_length"], e.seq_len)
    if e.pipeline > 1:
        _cmp(out, "microbatches", v["num_pipeline_microbatches"], e.microbatches)
        _cmp(out, "micro batch", v["micro_batch_size_to_train_on"]
             // v["num_pipeline_microbatches"] // e.data, e.micro_batch)
        _cmp(out, "accumulation", v["gradient_accumulation_steps"], 1)
        _cmp(out, "virtual", v["num_pipeline_repeats"], e.virtual)
        per = v["num_layers_per_pipeline_stage"]
        if len(set(e.blocks)) == 1 and not m.dense_layers:
            _cmp(out, "stage blocks", per, e.blocks[0])
        elif not _noted(notes, "MaxText's pipeline stages are uniform"):
            out.append(f"stages {list(e.blocks)} written as {per} blocks each without a note")
        if not _noted(notes, "MaxText runs its circular pipeline"):
            out.append(f"schedule {e.schedule} written as MaxText's circular one without a note")
    else:
        _cmp(out, "micro batch", v["micro_batch_size_to_train_on"] // e.data, e.micro_batch)
        _cmp(out, "accumulation", v["gradient_accumulation_steps"], e.microbatches)
    _cmp(out, "recompute", v["remat_policy"] == "full", e.recompute)
    q = v.get("quantization") or ""
    if e.precision == "bf16":
        _cmp(out, "precision", q, "")
    elif e.precision != "fp8" and not _noted(notes, f"MaxText has no {e.precision}"):
        out.append(f"precision {e.precision} written as {q!r} without a note")
    _cmp(out, "layers", v["num_decoder_layers"], m.layers)
    _cmp(out, "hidden", v["emb_dim"], m.hidden)
    _cmp(out, "heads", v["num_query_heads"], m.heads)
    if not m.mla:
        _cmp(out, "kv heads", v["num_kv_heads"], m.kv_heads)
        _cmp(out, "head dim", v["head_dim"], m.head_dim)
    _cmp(out, "vocab", v["vocab_size"], m.vocab)
    _cmp(out, "rope base", float(v["rope_max_timescale"]), float(m.rope_theta))
    _rope_cmp(out, _maxtext_rope(v), m, notes, "MaxText's llama3.1 RoPE fixes")
    _cmp(out, "qk norm", bool(v.get("use_qk_norm")), _qk_norm(m))
    _cmp(out, "mla", v.get("attention_type") == "mla", m.mla)
    if m.mla:
        _cmp(out, "kv lora rank", v["kv_lora_rank"], m.kv_lora_rank)
        _cmp(out, "q lora rank", v["q_lora_rank"], m.q_lora_rank)
    _cmp(out, "tied embeddings", bool(v["logits_via_embedding"]), m.tie_embeddings)
    if m.sliding_window:    # MaxText's window counts the keys a query attends, self included
        _cmp(out, "sliding window", v.get("sliding_window_size"), m.sliding_window)
        every = v.get("inhomogeneous_layer_cycle_interval") if v.get(
            "attention_type") != "local_sliding" else 0
        _cmp(out, "full attention every", every or 0, m.full_attention_every)
    _cmp(out, "experts", v["num_experts"] if m.moe else 0, m.experts)
    if m.moe:
        _cmp(out, "top k", v["num_experts_per_tok"], m.experts_per_token)
        _cmp(out, "expert ffn", v["moe_mlp_dim"], m.expert_ffn)
        _cmp(out, "shared experts", v.get("shared_experts", 0), m.shared_experts)
        _cmp(out, "dense first blocks", v.get("first_num_dense_layers", 0), m.dense_layers)
    if not m.moe or m.dense_layers:
        _cmp(out, "ffn", v["mlp_dim"], m.ffn)
    return out


def mismatches(target: str, e: Expect, values: dict, notes=()) -> list[str]:
    """Each way ``values`` (a checker's parsed config for ``target``) differs from ``e``, one
    line each; empty when the launcher runs the plan."""
    if target == "megatron":
        return _megatron(e, values, notes)
    if target == "megatron-bridge":
        return _bridge(e, values, notes)
    if target.startswith("torchtitan"):
        return _torchtitan(e, values, notes, target)
    return _maxtext(e, values, notes)
