"""A plan as Megatron-LM arguments (``pretrain_gpt.py``), one per line.

Degrees: ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size``, virtual stages
(``--num-layers-per-virtual-pipeline-stage`` when every stage holds as many blocks, else
``--pipeline-model-parallel-layout``, Megatron-core's per-stage layout string: ``E`` the
embedding, ``t`` one transformer block, ``L`` the output layer and loss, stages split by ``|``, in
virtual-stage-major order). Context parallelism: ``--context-parallel-size`` and ``--cp-comm-type``
(:data:`CP_COMM_TYPES`). Data parallelism is what is left: Megatron-LM derives it as
``world / (tensor x pipeline x context)`` (``validate_args``), the plan's data degree, which the
global batch must divide into micro batches; gradients are reduced, and the distributed
optimizer's or FSDP2's shards spread, over data x context (Megatron-Core's data-parallel group
``with_context_parallel``), as the plan's layout does (:attr:`ir.Layout.replicas`). The distributed
optimizer (``--use-distributed-optimizer``, ZeRO-1) for a plain data axis, which is what the cost
model's memory assumes, or PyTorch FSDP2 (``--use-torch-fsdp2``) for an FSDP layout. Names as in
Megatron-LM's ``megatron/training/arguments.py``.

Megatron-LM runs 1F1B, and interleaved 1F1B with virtual stages; any other schedule is a note.
"""

from __future__ import annotations

import shlex

from pathlib import Path

from launchers.view import GPU_KINDS, LauncherError, PartView, refuse_device
from zoo.config import ModelConfig

VERSION = "megatron-core 0.19.2"
"""The Megatron-LM release whose ``megatron/training/arguments.py`` (shipped in the megatron-core
wheel) the files are written for and checked against."""

SCHEDULES = {"1f1b": "1F1B (Megatron's default with a pipeline)",
             "interleaved-1f1b": "interleaved 1F1B (virtual pipeline stages)",
             "interleaved-1f1b-a2a": "interleaved 1F1B with the MoE all-to-alls overlapped "
                                     "(--overlap-moe-expert-parallel-comm)"}
"""The plan schedules Megatron-LM runs, with what it calls them."""

CP_COMM_TYPES = {"ring": "p2p", "allgather": "all_gather", "alltoall": "a2a"}
"""Plan context method (:data:`ir.CONTEXT_METHODS`) -> ``--cp-comm-type``: the values Megatron-Core
passes to Transformer Engine's ``DotProductAttention(cp_comm_type=...)`` (``p2p``: KV passed around
the ring, ``all_gather``: KV all-gathered, ``a2a``: DeepSpeed-Ulysses' head/sequence all-to-all;
``transformer_engine/pytorch/attention``'s ``attn_forward_func_with_cp`` accepts exactly
``p2p``, ``all_gather``, ``a2a``, ``a2a+p2p``; Megatron-LM's ``--cp-comm-type`` help text spells
the second ``allgather``, which Transformer Engine rejects). Every method maps exactly; TE's
``p2p`` and ``all_gather`` split the sequence causally load-balanced (DualChunkSwap, the plan's
zig-zag split)."""

MEGATRON_LOSS_NOTE = ("the plan costed PyTorch's eager loss; Megatron-Core computes it fused "
                      "(--cross-entropy-loss-fusion; Transformer Engine's kernel with "
                      "--cross-entropy-fusion-impl te), which holds less memory than the plan")
"""The note of a plan whose loss is ``eager`` (:attr:`ir.Plan.cross_entropy`): Megatron has no
op-by-op loss to ask for."""


MEGATRON_FLASH2_NOTE = ("the plan costed the attention core as FlashAttention-2; Megatron-Core "
                        "runs Transformer Engine's fused attention (cuDNN's on Hopper and "
                        "Blackwell), which the device profile's attention rate describes: the run's "
                        "attention is faster than the plan's (plan without --attention-kernel)")
"""The note of a plan whose model runs ``flash2`` (``ModelConfig.attention_kernel``): Megatron's
stacks run Transformer Engine's kernel (``--attention-backend`` auto picks cuDNN's fused
attention where it runs)."""


MEGATRON_MASTER_NOTE = ("the plan keeps bf16 optimizer state with no master copy (4 bytes a "
                        "parameter); Megatron-Core's precision-aware optimizer keeps fp32 master "
                        "weights (--main-params-dtype takes fp32 or fp16), so the run holds 4 "
                        "bytes a parameter more than the plan, sharded over data parallel")
"""The note of a plan whose :attr:`ir.Layout.optimizer_state` is ``bf16``: Megatron writes its
moments in bf16 (``--exp-avg-dtype`` / ``--exp-avg-sq-dtype``) but keeps an fp32 master copy."""


def _layout_string(v: PartView) -> str:
    code = {"embed": "E", "head": "L"}
    return "|".join("".join(code.get(n, "t") for n in layers) for layers in v.stage_layers)


def _model_args(v: PartView) -> list[tuple[str, object]]:
    c = v.model
    out: list[tuple[str, object]] = [
        ("--num-layers", c.layers), ("--hidden-size", c.hidden), ("--ffn-hidden-size", c.ffn),
        ("--num-attention-heads", c.heads)]
    if c.kv_heads != c.heads:
        out += [("--group-query-attention", None), ("--num-query-groups", c.kv_heads)]
    out += [("--seq-length", v.seq_len), ("--max-position-embeddings", max(v.seq_len, c.seq_len)),
            ("--vocab-size", c.vocab)]
    if c.family == "llama":
        out += [("--swiglu", None), ("--normalization", "RMSNorm"),
                ("--position-embedding-type",
                 "yarn" if c.rope_scaling == "yarn" and not c.mla else "rope"),
                ("--rotary-base", int(c.rope_theta)),
                ("--disable-bias-linear", None)]
    if c.mla:        # DeepSeek's multi-head latent attention
        out += [("--multi-latent-attention", None), ("--kv-lora-rank", c.kv_lora_rank),
                ("--qk-head-dim", c.head_dim), ("--qk-pos-emb-head-dim", c.qk_rope_head_dim),
                ("--v-head-dim", c.v_head_dim)]
        if c.q_lora_rank:
            out.append(("--q-lora-rank", c.q_lora_rank))
    if c.qk_norm:    # per-head RMSNorm of queries and keys (Qwen3)
        out.append(("--qk-layernorm", None))
    if c.hybrid:     # Megatron-LM's hybrid (Mamba) model: its pattern and Mamba-2 mixer
        out += [("--hybrid-override-pattern", c.hybrid_pattern),
                ("--mamba-num-heads", c.mamba_heads), ("--mamba-head-dim", c.mamba_head_dim),
                ("--mamba-state-dim", c.ssm_state), ("--mamba-num-groups", c.mamba_groups)]
    if c.mtp_layers:
        out.append(("--mtp-num-layers", c.mtp_layers))
        if c.hybrid:    # passes of one module of these layers (Nemotron 3 Super's recipes)
            out += [("--mtp-hybrid-override-pattern", c.mtp_pattern),
                    ("--mtp-use-repeated-layer", None)]
    if c.sliding_window and c.full_attention_every:
        # Transformer Engine's (left, right) window: a query attends keys i - left .. i, so the
        # zoo's window of W keys (self included) is left = W - 1 (Bridge's gpt-oss: 128 -> 127)
        out += [("--window-size", f"{c.sliding_window - 1},0"),
                ("--window-attn-skip-freq", c.full_attention_every)]
    if not c.tie_embeddings:
        out.append(("--untie-embeddings-and-output-weights", None))
    # the model's own precision: Megatron-LM trains in fp32 without a flag
    flag = {"bfloat16": "--bf16", "float16": "--fp16"}.get(c.dtype)
    if flag:
        out.append((flag, None))
    return out


MLA_YARN_DEFAULTS = {"rope_original_max_position": 4096, "rope_beta_fast": 32.0,
                     "rope_beta_slow": 1.0}
"""What Megatron-Core's ``MLATransformerConfig`` fixes for YaRN (``original_max_position_embeddings``,
``beta_fast``, ``beta_slow``: megatron-core 0.19.2 ``transformer_config.py``), which Megatron-LM's
arguments cannot set for multi-latent attention."""


def rope_scaling_args(c: ModelConfig) -> tuple[list[tuple[str, object]], list[str]]:
    """The model's RoPE scaling as Megatron-LM arguments (megatron-core 0.19.2
    ``megatron/training/arguments.py``), and one note per figure they cannot say:

    - ``llama3``: ``--use-rope-scaling --rope-scaling-factor F`` (Megatron-Core applies Llama
      3.1's bands with low/high frequency factors 1 and 4 over 8,192 original positions, fixed);
    - ``yarn`` with multi-latent attention: ``--rope-type yarn --rotary-scaling-factor F --mscale
      M --mscale-all-dim A`` (the MLA config fixes the rest: :data:`MLA_YARN_DEFAULTS`); without it
      ``--position-embedding-type yarn`` with ``--yarn-original-max-position-embeddings``,
      ``--yarn-beta-fast/-slow`` and, for gpt-oss's unrounded correction range,
      ``--no-yarn-correction-range-round-to-int``;
    - ``linear``: ``--rotary-seq-len-interpolation-factor F`` (an integer in Megatron-LM)."""
    if c.pos_emb != "rope" or not c.rope_scaling:
        return [], []
    notes: list[str] = []
    if c.rope_scaling == "llama3":
        fixed = (c.rope_low_freq_factor or 1.0, c.rope_high_freq_factor or 4.0,
                 c.rope_original_max_position or 8192)
        if fixed != (1.0, 4.0, 8192):
            notes.append(f"llama3 rope scaling with low/high frequency factors {fixed[0]:g}/"
                         f"{fixed[1]:g} over {fixed[2]} positions: Megatron-LM fixes 1/4 over 8192")
        return [("--use-rope-scaling", None), ("--rope-scaling-factor", c.rope_factor)], notes
    if c.rope_scaling == "linear":
        if c.rope_factor != int(c.rope_factor):
            notes.append(f"linear rope scaling factor {c.rope_factor:g}: Megatron-LM takes an "
                         f"integer interpolation factor; written {int(c.rope_factor)}")
        return [("--rotary-seq-len-interpolation-factor", int(c.rope_factor))], notes
    out: list[tuple[str, object]] = [("--rotary-scaling-factor", c.rope_factor)]
    if c.rope_mscale:
        out += [("--mscale", c.rope_mscale), ("--mscale-all-dim", c.rope_mscale_all_dim)]
    if c.mla:
        for field, fixed in MLA_YARN_DEFAULTS.items():
            if getattr(c, field) and getattr(c, field) != fixed:
                notes.append(f"YaRN {field.removeprefix('rope_')} {getattr(c, field):g}: "
                             f"Megatron-LM's multi-latent attention fixes {fixed:g}")
        return [("--rope-type", "yarn"), *out], notes
    out += [("--yarn-original-max-position-embeddings", c.rope_original_max_position or 4096),
            ("--yarn-beta-fast", c.rope_beta_fast or 32.0),
            ("--yarn-beta-slow", c.rope_beta_slow or 1.0)]
    if not c.rope_truncate:     # gpt-oss's ``truncate: false``
        out.append(("--no-yarn-correction-range-round-to-int", None))
    return out, notes


PRECISION_ARGS: dict[str, tuple[tuple[str, object], ...]] = {
    "bf16": (),
    "fp8": (("--fp8-format", "hybrid"), ("--fp8-recipe", "tensorwise"), ("--fp8-param-gather", None)),
    "fp8-blockwise": (("--fp8-format", "e4m3"), ("--fp8-recipe", "blockwise"),
                      ("--fp8-param-gather", None)),
    "mxfp8": (("--fp8-format", "e4m3"), ("--fp8-recipe", "mxfp8"), ("--fp8-param-gather", None)),
    "nvfp4": (("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")),
}
"""Megatron-LM's Transformer Engine arguments for each training precision recipe (``megatron/
training/arguments.py``, ``_add_transformer_engine_args``: ``--fp8-format {e4m3,hybrid}``,
``--fp8-recipe {tensorwise,delayed,mxfp8,blockwise}``, ``--fp8-param-gather``, ``--fp4-format
e2m1``, ``--fp4-recipe nvfp4``). FP8 per tensor is written as current scaling (``tensorwise``)
with the hybrid format (E4M3 forward, E5M2 gradients); the parameter gather in the format is what
the cost model's memory assumes (``simulator.cost_model.low_precision_weight_bytes``)."""


def megatron_args(v: PartView) -> tuple[list[tuple[str, object]], list[str]]:
    """(the arguments as ``(flag, value or None)`` pairs, what Megatron-LM cannot express)."""
    refuse_device(v, "Megatron-LM", GPU_KINDS)
    if v.model.linear_attention:
        raise LauncherError(f"{v.model.name}'s Gated DeltaNet layers (Qwen3-Next) are not written "
                            f"as Megatron-LM arguments by mpmd; export this plan to megatron-bridge "
                            f"(its qwen3_next recipe)")
    notes = list(v.notes)
    lay = v.layout
    args: list[tuple[str, object]] = [
        ("--tensor-model-parallel-size", lay.tensor),
        ("--pipeline-model-parallel-size", v.pipeline)]
    if lay.context > 1:
        args += [("--context-parallel-size", lay.context),
                 ("--cp-comm-type", CP_COMM_TYPES[lay.context_method])]
        kv = v.model.kv_heads // lay.tensor     # a tensor rank's key/value heads
        if lay.context_method == "alltoall" and kv and kv % lay.context:
            notes.append(f"Transformer Engine's a2a context parallel splits each tensor rank's "
                         f"{kv} key/value heads {lay.context} ways and refuses this layout: "
                         f"re-plan with another context method")
        if lay.context_method == "ring" and v.model.sliding_window:
            notes.append("Transformer Engine's p2p context parallel has no sliding-window "
                         "attention (its all_gather and a2a do): Megatron-LM refuses this model "
                         "with --cp-comm-type p2p; re-plan with another context method")
    args += PRECISION_ARGS[v.precision]
    if v.schedule not in SCHEDULES:
        notes.append(f"schedule {v.schedule} has no Megatron-LM setting (it runs "
                     f"{' or '.join(SCHEDULES)}): written for {'interleaved-1f1b' if v.virtual > 1 else '1f1b'}")
    if any(r != s % v.pipeline for s, r in enumerate(v.stage_rank)):
        notes.append(f"schedule {v.schedule} places stages in a V (rank {list(v.stage_rank)}); "
                     f"Megatron-LM places stage s on rank s mod {v.pipeline}")
    blocks = {v.decoder_layers(s) for s in range(len(v.stage_layers))}
    if v.pipeline > 1 and len(blocks) > 1:
        args.append(("--pipeline-model-parallel-layout", _layout_string(v)))
    elif v.virtual > 1 and v.pipeline > 1:
        args.append(("--num-layers-per-virtual-pipeline-stage", blocks.pop()))
    if lay.tensor > 1:
        args.append(("--sequence-parallel", None))
        if lay.tp_overlap:
            args.append(("--tp-comm-overlap", None))
    replicas = (f"data {lay.data}" if lay.context == 1 else
                f"data x context {lay.data} x {lay.context}")
    if lay.fsdp:     # Megatron-FSDP: it composes with tensor, pipeline and expert parallel
        args += [("--use-megatron-fsdp", None), ("--use-distributed-optimizer", None),
                 ("--data-parallel-sharding-strategy", "optim_grads_params"),
                 ("--ckpt-format", "fsdp_dtensor")]
        if lay.hsdp > 1:
            notes.append(f"hybrid sharding over {lay.hsdp} replicas: written as Megatron-FSDP's "
                         f"full sharding over {replicas}")
    elif lay.replicas > 1:     # the gradients' group is data x context (with_context_parallel)
        args += [("--use-distributed-optimizer", None), ("--overlap-param-gather", None)]
    if lay.replicas > 1:
        args.append(("--overlap-grad-reduce", None))
    if lay.grad_reduce == "bf16":
        args.append(("--grad-reduce-in-bf16", None))
    if lay.optimizer_state != "fp32":
        args += [("--use-precision-aware-optimizer", None), ("--exp-avg-dtype", "bf16"),
                 ("--exp-avg-sq-dtype", "bf16")]
        if lay.optimizer_state == "bf16":
            notes.append(MEGATRON_MASTER_NOTE)
    if v.cross_entropy == "eager":
        notes.append(MEGATRON_LOSS_NOTE)
    if v.model.attention_kernel == "flash2":
        notes.append(MEGATRON_FLASH2_NOTE)
    if v.model.moe:
        args += [("--num-experts", v.model.experts), ("--moe-router-topk", v.model.experts_per_token),
                 ("--moe-ffn-hidden-size", v.model.expert_ffn),
                 ("--moe-token-dispatcher-type",
                  "flex" if lay.expert_dispatch == "deepep" else "alltoall"),
                 ("--moe-grouped-gemm", None)]
        if lay.expert_dispatch == "tokendrop":     # else dropless, Megatron-Core's default
            args += [("--moe-expert-capacity-factor", v.model.capacity_factor),
                     ("--moe-pad-expert-input-to-capacity", None)]
        if v.schedule == "interleaved-1f1b-a2a":
            args += [("--overlap-moe-expert-parallel-comm", None), ("--delay-wgrad-compute", None)]
        if v.model.dense_layers:
            dense, moe = v.model.dense_layers, v.model.layers - v.model.dense_layers
            args.append(("--moe-layer-freq", f"([0]*{dense}+[1]*{moe})"))
        if v.model.shared_experts:
            args.append(("--moe-shared-expert-intermediate-size",
                         v.model.shared_experts * v.model.expert_ffn))
        if v.model.moe_latent:
            args.append(("--moe-latent-size", v.model.moe_latent))
        if lay.expert > 1:
            args.append(("--expert-model-parallel-size", lay.expert))
            args.append(("--expert-tensor-parallel-size", lay.etp))
            if lay.expert_dispatch == "deepep":
                args.append(("--moe-enable-deepep", None))
    args += [("--micro-batch-size", v.micro_batch), ("--global-batch-size", v.global_batch)]
    if v.recompute:
        args += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                 ("--recompute-num-layers", 1)]
    if v.model.hybrid:
        notes.append("a hybrid Mamba model: launch these arguments with Megatron-LM's "
                     "pretrain_mamba.py, not pretrain_gpt.py")
    rope, rope_notes = rope_scaling_args(v.model)
    return args + _model_args(v) + rope, notes + rope_notes


def launch_line(v: PartView, path: Path | str = "THIS_FILE") -> str:
    """The shell line that starts Megatron-LM with the file's arguments (the file's own
    shell quoting read by ``xargs``), with the environment ``validate_args`` asks for:
    ``CUDA_DEVICE_MAX_CONNECTIONS=1`` for tensor or context parallel, unset under FSDP, which
    refuses it."""
    nodes = max(1, v.devices // 8)
    env = ("CUDA_DEVICE_MAX_CONNECTIONS=1 " if (v.layout.tensor > 1 or v.context > 1)
           and not v.layout.fsdp else "")
    script = "pretrain_mamba.py" if v.model.hybrid else "pretrain_gpt.py"
    return (f"grep -v '^#' {Path(path).name} | {env}xargs torchrun --nnodes {nodes} "
            f"--nproc-per-node {v.devices // nodes} {script}")


def render(v: PartView, source: str, path: Path | str = "THIS_FILE") -> tuple[str, list[str]]:
    """(the arguments file's text, notes): a comment header with the launch line
    (:func:`launch_line`), then one argument per line, shell-quoted."""
    args, notes = megatron_args(v)
    head = [f"# Megatron-LM arguments ({VERSION}) for {v.model.name}"
            f"{' ' + v.name if v.name else ''}, exported by mpmd from {source}",
            f"# {v.devices} x {v.device}: data {v.data} x "
            + (f"context {v.context} ({v.layout.context_method}) x " if v.context > 1 else "")
            + f"tensor {v.layout.tensor} x pipeline {v.pipeline}; {v.microbatches} microbatches "
              f"of {v.micro_batch} per replica",
            f"# launch, then your data and tokenizer flags: {launch_line(v, path)}"]
    lines = [f if x is None else f"{f} {shlex.quote(str(x))}" for f, x in args]
    return "\n".join(head + lines) + "\n", notes
