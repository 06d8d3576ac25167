"""A plan as Megatron-Bridge (NeMo) recipe overrides: the recipe that builds the model's
``ConfigContainer``, and the Hydra-style ``KEY=VALUE`` overrides that set it to the plan.

Megatron-Bridge's training entry (``scripts/training/run_recipe.py``) takes ``--recipe NAME`` (a
recipe function of ``megatron.bridge.recipes``, which builds a ``ConfigContainer`` from the
model's Hugging Face config) and trailing ``KEY=VALUE`` overrides, applied by
``megatron.bridge.training.utils.omegaconf_utils.process_config_with_overrides`` with OmegaConf in
struct mode (a key the container lacks is an error). The file holds one override per line:
``model.*`` (``GPTModelProvider``, a Megatron-Core ``TransformerConfig``: the degrees, the
pipeline layout, recomputation, the architecture), ``train.*`` (micro and global batch),
``dataset.seq_length`` (the runner copies it to ``model.seq_length``), ``ddp.*`` (the distributed
optimizer or Megatron-FSDP), ``checkpoint.ckpt_format`` and ``mixed_precision`` (a registered
recipe name of ``megatron.bridge.training.mixed_precision``: :data:`PRECISIONS`).

Degrees as in :mod:`launchers.megatron` (the same Megatron-Core underneath): data parallelism is
what is left, ``world / (tensor x pipeline x context)``; uneven stages are written as
``model.pipeline_model_parallel_layout``, in the list form Bridge's own recipes use
(``[["embedding", "decoder", ...], ..., [..., "loss"]]``, one list per virtual stage in
virtual-stage-major order), else the layout is cleared (``null``) so a recipe's own layout (the
DeepSeek-V3 recipe sets one) does not apply. Megatron-Core runs 1F1B, and interleaved 1F1B with
virtual stages; any other schedule is a note.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from launchers.megatron import CP_COMM_TYPES, MEGATRON_FLASH2_NOTE, MEGATRON_LOSS_NOTE, MEGATRON_MASTER_NOTE, SCHEDULES
from launchers.view import GPU_KINDS, LauncherError, PartView, refuse_device
from zoo.config import ModelConfig

VERSION = "megatron-bridge 0.6.2"
"""The Megatron-Bridge release (PyPI ``megatron-bridge==0.6.2``: its recipes, ``ConfigContainer``
and mixed-precision recipes; the runner ``scripts/training/run_recipe.py`` of its repository)
the files are written for, and whose field names the tests check them against."""

RECIPES: dict[str, str] = {
    "llama3-8b": "llama3_8b_pretrain_2gpu_h100_bf16_config",
    "llama3-70b": "llama3_70b_pretrain_32gpu_h100_bf16_config",
    "llama3-405b": "llama31_405b_pretrain_256gpu_h100_bf16_config",
    "llama-3.1-8b": "llama31_8b_pretrain_2gpu_h100_bf16_config",
    "llama-3.2-1b-instruct": "llama32_1b_pretrain_1gpu_h100_bf16_config",
    "llama-3.2-3b-instruct": "llama32_3b_pretrain_1gpu_h100_bf16_config",
    "qwen2.5-7b": "qwen25_7b_pretrain_2gpu_h100_bf16_config",
    "qwen3-0.6b": "qwen3_600m_pretrain_1gpu_h100_bf16_config",
    "qwen3-1.7b": "qwen3_1p7b_pretrain_1gpu_h100_bf16_config",
    "qwen3-4b": "qwen3_4b_pretrain_2gpu_h100_bf16_config",
    "qwen3-8b": "qwen3_8b_pretrain_4gpu_h100_bf16_config",
    "qwen3-14b": "qwen3_14b_pretrain_8gpu_h100_bf16_config",
    "qwen3-32b": "qwen3_32b_pretrain_16gpu_h100_bf16_config",
    "qwen3-30b-a3b": "qwen3_30b_a3b_pretrain_8gpu_h100_bf16_config",
    "qwen3-235b-a22b": "qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config",
    "qwen3-next-80b-a3b": "qwen3_next_80b_a3b_pretrain_32gpu_h100_bf16_config",
    "deepseek-v3": "deepseek_v3_pretrain_1024gpu_h100_bf16_config",
    "deepseek-v3-mtp": "deepseek_v3_pretrain_1024gpu_h100_bf16_config",
    "gpt3-175b": "gpt3_175b_pretrain_32gpu_h100_bf16_config",
    "gpt-oss-120b": "gpt_oss_120b_pretrain_64gpu_h100_bf16_config",
}
"""Zoo model (lower case) -> the Megatron-Bridge 0.6.2 pretraining recipe of that model
(``megatron/bridge/recipes/{llama,qwen,deepseek,gpt,gpt_oss}/h100/*.py``; each builds the model
from the published Hugging Face config of the same release). Bridge 0.6.2 has no Mixtral or
Mistral recipe: those plans are refused (:func:`recipe`)."""

PRECISIONS: dict[str, str] = {
    "bf16": "bf16_mixed",
    "fp8": "bf16_with_fp8_current_scaling_mixed",
    "fp8-blockwise": "bf16_with_fp8_subchannel_scaling_mixed",
    "mxfp8": "bf16_with_mxfp8_mixed",
    "nvfp4": "bf16_with_nvfp4_mixed",
}
"""Plan precision recipe -> Megatron-Bridge's mixed-precision recipe name
(``megatron/bridge/training/mixed_precision.py``, ``MIXED_PRECISION_RECIPES``): FP8 per tensor is
its current-scaling recipe (``fp8="hybrid"``, ``fp8_recipe="tensorwise"``), blockwise its
"subchannel" recipe (128x128 weights, 1x128 activations, ``fp8_recipe="blockwise"``), MXFP8
``fp8_recipe="mxfp8"``, NVFP4 ``fp4_recipe="nvfp4"``. A float16 model takes the ``fp16_``
variant where Bridge has one (:data:`FP16_PRECISIONS`)."""

FP16_PRECISIONS = {"bf16": "fp16_mixed", "fp8": "fp16_with_fp8_current_scaling_mixed",
                   "fp8-blockwise": "fp16_with_fp8_subchannel_scaling_mixed",
                   "mxfp8": "fp16_with_mxfp8_mixed"}


def recipe(v: PartView) -> str:
    """The recipe function for the part's model.

    Raises:
        LauncherError: Megatron-Bridge 0.6.2 has no recipe for the model (one line naming the
            models it has and the other targets).
    """
    got = RECIPES.get(v.model.name.lower())
    if got is None:
        raise LauncherError(
            f"Megatron-Bridge {VERSION.split()[-1]} has no recipe for {v.model.name} (mpmd "
            f"exports its llama3 8B/70B, llama3.1 8B/405B, llama3.2 1B/3B, qwen2.5 7B, qwen3 "
            f"0.6B-32B, 30B-A3B, 235B-A22B, qwen3-next 80B-A3B, deepseek-v3, gpt3-175b and gpt-oss-120b recipes); "
            f"export this plan to megatron")
    return got


def _layout(v: PartView) -> list[list[str]]:
    code = {"embed": "embedding", "head": "loss"}
    out = []
    for layers in v.stage_layers:
        stage = []
        for n in layers:
            if n == "head" and v.model.mtp_layers:
                stage += ["mtp"] * v.model.mtp_layers
            stage.append(code.get(n, "decoder"))
        out.append(stage)
    return out


def value(x: object) -> str:
    """``x`` in Hydra's override grammar: ``true``/``false``, ``null``, numbers, bare words,
    lists as ``[a,b]``."""
    if x is None:
        return "null"
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, (list, tuple)):
        return "[" + ",".join(value(y) for y in x) + "]"
    return str(x)


def rope_scaling_overrides(c: ModelConfig, notes: list[str]) -> list[tuple[str, object]]:
    """The model's RoPE scaling as Megatron-Bridge 0.6.2 model-provider fields
    (``GPTModelProvider``: ``rope_scaling``/``rope_scaling_factor`` for Llama 3.1's bands, whose
    low/high frequency factors 1 and 4 over 8,192 positions Megatron-Core fixes (another is one
    note); ``position_embedding_type`` ``yarn`` with the ``yarn_*`` fields; ``seq_len_
    interpolation_factor`` for linear scaling; with multi-latent attention the
    ``MLATransformerConfig`` fields ``rotary_scaling_factor``, ``original_max_position_embeddings``,
    ``beta_fast``, ``beta_slow``, ``mscale``, ``mscale_all_dim``)."""
    if not c.rope_scaling:
        return []
    if c.rope_scaling == "llama3":
        band = (c.rope_low_freq_factor or 1.0, c.rope_high_freq_factor or 4.0,
                c.rope_original_max_position or 8192)
        if band != (1.0, 4.0, 8192):
            notes.append(f"llama3 rope scaling with low/high frequency factors {band[0]:g}/"
                         f"{band[1]:g} over {band[2]} positions: Megatron-Core fixes 1/4 over 8192")
        return [("model.rope_scaling", True), ("model.rope_scaling_factor", float(c.rope_factor))]
    if c.rope_scaling == "linear":
        return [("model.seq_len_interpolation_factor", float(c.rope_factor))]
    orig, fast, slow = (c.rope_original_max_position or 4096, float(c.rope_beta_fast or 32.0),
                        float(c.rope_beta_slow or 1.0))
    if c.mla:
        out: list[tuple[str, object]] = [
            ("model.rope_type", "yarn"), ("model.rotary_scaling_factor", float(c.rope_factor)),
            ("model.original_max_position_embeddings", orig), ("model.beta_fast", fast),
            ("model.beta_slow", slow)]
        if c.rope_mscale:
            out += [("model.mscale", float(c.rope_mscale)),
                    ("model.mscale_all_dim", float(c.rope_mscale_all_dim))]
        return out
    return [("model.position_embedding_type", "yarn"),
            ("model.yarn_rotary_scaling_factor", float(c.rope_factor)),
            ("model.yarn_original_max_position_embeddings", orig),
            ("model.yarn_beta_fast", fast), ("model.yarn_beta_slow", slow),
            ("model.yarn_correction_range_round_to_int", bool(c.rope_truncate))]


def _model(v: PartView, notes: list[str]) -> list[tuple[str, object]]:
    """The architecture overrides: the plan's model, so the job is the plan's even where the
    recipe's Hugging Face config differs."""
    c = v.model
    out: list[tuple[str, object]] = [
        ("model.num_layers", c.layers), ("model.hidden_size", c.hidden),
        ("model.num_attention_heads", c.heads)]
    if not c.moe or c.dense_layers:
        out.append(("model.ffn_hidden_size", c.ffn))
    if not c.mla:
        out += [("model.num_query_groups", c.kv_heads), ("model.kv_channels", c.head_dim)]
    out += [("model.vocab_size", c.vocab),
            ("model.share_embeddings_and_output_weights", bool(c.tie_embeddings)),
            ("model.qk_layernorm", bool(c.qk_norm))]
    if c.pos_emb == "rope":
        out.append(("model.rotary_base", float(c.rope_theta) if c.mla else int(c.rope_theta)))
        out += rope_scaling_overrides(c, notes)
    if c.moe:
        out += [("model.num_moe_experts", c.experts),
                ("model.moe_router_topk", c.experts_per_token),
                ("model.moe_ffn_hidden_size", c.expert_ffn), ("model.moe_grouped_gemm", True)]
        if c.shared_experts:
            out.append(("model.moe_shared_expert_intermediate_size",
                        c.shared_experts * c.expert_ffn))
        if c.moe_latent:
            out.append(("model.moe_latent_size", c.moe_latent))
        if c.dense_layers:
            dense, moe = c.dense_layers, c.layers - c.dense_layers
            out.append(("model.moe_layer_freq", [0] * dense + [1] * moe))
    if c.mla or "deepseek" in c.name.lower():
        out.append(("model.mtp_num_layers", c.mtp_layers or None))
    if c.sliding_window:
        if c.full_attention_every:
            notes.append(f"{c.name} alternates sliding-window ({c.sliding_window}) and full "
                         f"attention every {c.full_attention_every} blocks: the recipe's model "
                         f"keeps its own pattern; model.window_size is not written")
        else:
            # Transformer Engine's (left, right): W keys, self included, is left = W - 1
            out.append(("model.window_size", [c.sliding_window - 1, 0]))
    if c.hybrid:
        notes.append("a hybrid Mamba model: the recipe's model keeps its own layer pattern")
    return out


def overrides(v: PartView) -> tuple[str, list[tuple[str, object]], list[str]]:
    """(the recipe, the overrides as ``(key, value)`` pairs in file order, what Megatron-Bridge
    cannot express).

    Raises:
        LauncherError: a device kind Bridge cannot run (TPU, Blackhole: it runs NVIDIA GPUs), or
            a model without a Bridge recipe.
    """
    refuse_device(v, "Megatron-Bridge", GPU_KINDS)
    name = recipe(v)
    notes = list(v.notes)
    lay = v.layout
    out: list[tuple[str, object]] = [
        ("model.tensor_model_parallel_size", lay.tensor),
        ("model.pipeline_model_parallel_size", v.pipeline),
        ("model.virtual_pipeline_model_parallel_size", v.virtual if v.virtual > 1 else None),
        ("model.context_parallel_size", lay.context),
        ("model.sequence_parallel", lay.tensor > 1)]
    if lay.context > 1:
        out.append(("model.cp_comm_type", CP_COMM_TYPES[lay.context_method]))
    blocks = {v.decoder_layers(s) for s in range(len(v.stage_layers))}
    uneven = v.pipeline > 1 and (len(blocks) > 1 or v.model.mtp_layers > 0)
    out.append(("model.pipeline_model_parallel_layout", _layout(v) if uneven else None))
    # the plan's split, not a recipe's own (Qwen3-235B's counts the embedding and the loss as
    # layers; Megatron-Core refuses those beside a layout)
    out += [("model.account_for_embedding_in_pipeline_split", False),
            ("model.account_for_loss_in_pipeline_split", False),
            ("model.num_layers_in_first_pipeline_stage", None),
            ("model.num_layers_in_last_pipeline_stage", None)]
    if v.schedule not in SCHEDULES:
        notes.append(f"schedule {v.schedule} has no Megatron-Bridge setting (Megatron-Core runs "
                     f"{' or '.join(SCHEDULES)}): written for "
                     f"{'interleaved-1f1b' if v.virtual > 1 else '1f1b'}")
    if any(r != s % v.pipeline for s, r in enumerate(v.stage_rank)):
        notes.append(f"schedule {v.schedule} places stages in a V (rank {list(v.stage_rank)}); "
                     f"Megatron-Core places stage s on rank s mod {v.pipeline}")
    if v.model.moe:
        out.append(("model.expert_model_parallel_size", lay.expert))
        out.append(("model.expert_tensor_parallel_size", lay.etp if lay.expert > 1 else lay.tensor))
        deepep = lay.expert > 1 and lay.expert_dispatch == "deepep"
        out.append(("model.moe_token_dispatcher_type", "flex" if deepep else "alltoall"))
        if deepep:
            out.append(("model.moe_flex_dispatcher_backend", "deepep"))
        drop = lay.expert_dispatch == "tokendrop"     # else dropless (no capacity)
        out.append(("model.moe_expert_capacity_factor", v.model.capacity_factor if drop else None))
        if drop:
            out.append(("model.moe_pad_expert_input_to_capacity", True))
        if v.schedule == "interleaved-1f1b-a2a":
            out += [("comm_overlap.overlap_moe_expert_parallel_comm", True),
                    ("comm_overlap.delay_wgrad_compute", True)]
    if lay.tp_overlap and lay.tensor > 1:
        notes.append("Megatron-Bridge overlaps tensor-parallel communication through the "
                     "recipe's comm_overlap (CommOverlapConfig), which an override cannot create: "
                     "the plan's overlapped tensor-parallel collectives are not asked for")
    out += [("train.micro_batch_size", v.micro_batch), ("train.global_batch_size", v.global_batch),
            ("dataset.seq_length", v.seq_len), ("model.seq_length", v.seq_len)]
    if v.recompute:
        out += [("model.recompute_granularity", "full"), ("model.recompute_method", "uniform"),
                ("model.recompute_num_layers", 1)]
    else:
        out += [("model.recompute_granularity", None), ("model.recompute_method", None),
                ("model.recompute_num_layers", None)]
    if lay.fsdp:
        out += [("ddp.use_megatron_fsdp", True), ("ddp.use_distributed_optimizer", True),
                ("ddp.data_parallel_sharding_strategy", "optim_grads_params"),
                ("checkpoint.ckpt_format", "fsdp_dtensor")]
        if lay.hsdp > 1:
            replicas = (f"data {lay.data}" if lay.context == 1 else
                        f"data x context {lay.data} x {lay.context}")
            notes.append(f"hybrid sharding over {lay.hsdp} replicas: written as Megatron-FSDP's "
                         f"full sharding over {replicas}")
    else:
        out += [("ddp.use_megatron_fsdp", False), ("ddp.use_distributed_optimizer", True),
                ("ddp.data_parallel_sharding_strategy", "no_shard")]
    if lay.grad_reduce == "bf16":
        out.append(("ddp.grad_reduce_in_fp32", False))
    if lay.optimizer_state != "fp32":
        if lay.fsdp:
            notes.append(f"the plan keeps {lay.optimizer_state} optimizer state, which "
                         f"Megatron-Bridge's precision-aware optimizer gives but not under "
                         f"Megatron-FSDP: the run keeps fp32 state (12 bytes a parameter)")
        else:
            out += [("optimizer.use_precision_aware_optimizer", True),
                    ("optimizer.exp_avg_dtype", "torch.bfloat16"),
                    ("optimizer.exp_avg_sq_dtype", "torch.bfloat16")]
        if lay.optimizer_state == "bf16":
            notes.append(MEGATRON_MASTER_NOTE)
    if v.cross_entropy == "eager":
        notes.append(MEGATRON_LOSS_NOTE)
    if v.model.attention_kernel == "flash2":
        notes.append(MEGATRON_FLASH2_NOTE)
    table = FP16_PRECISIONS if v.model.dtype == "float16" else PRECISIONS
    out.append(("mixed_precision", table.get(v.precision, PRECISIONS[v.precision])))
    if v.precision == "fp8":
        notes.append("Megatron-Bridge's FP8 current-scaling recipe keeps the first and last "
                     "transformer blocks in BF16; the plan's step assumed every block in FP8")
    return name, out + _model(v, notes), notes


def launch_line(v: PartView, name: str, path: Path | str = "THIS_FILE") -> str:
    """The shell line that starts Megatron-Bridge's runner on the recipe with the file's
    overrides (read by ``xargs``, with the file's own shell quoting)."""
    nodes = max(1, v.devices // 8)
    env = ("CUDA_DEVICE_MAX_CONNECTIONS=1 " if (v.layout.tensor > 1 or v.context > 1)
           and not v.layout.fsdp else "")
    return (f"grep -v '^#' {Path(path).name} | {env}xargs torchrun --nnodes {nodes} "
            f"--nproc-per-node {v.devices // nodes} scripts/training/run_recipe.py --recipe "
            f"{name} --mode pretrain")


def render(v: PartView, source: str, path: Path | str = "THIS_FILE") -> tuple[str, list[str]]:
    """(the overrides file's text, notes): a comment header naming the release, the recipe and
    the launch line (:func:`launch_line`), then one ``KEY=VALUE`` per line, shell-quoted."""
    name, out, notes = overrides(v)
    head = [f"# Megatron-Bridge recipe overrides ({VERSION}) for {v.model.name}"
            f"{' ' + v.name if v.name else ''}, exported by mpmd from {source}",
            f"# recipe: {name} (megatron.bridge.recipes); {v.devices} x {v.device}: data "
            f"{v.data} x " + (f"context {v.context} ({v.layout.context_method}) x "
                              if v.context > 1 else "")
            + f"tensor {v.layout.tensor} x pipeline {v.pipeline}; {v.microbatches} microbatches "
              f"of {v.micro_batch} per replica",
            f"# launch from a Megatron-Bridge checkout, then your data and tokenizer overrides: "
            f"{launch_line(v, name, path)}"]
    lines = [shlex.quote(f"{k}={value(x)}") for k, x in out]
    return "\n".join(head + lines) + "\n", notes
