"""A plan as a MaxText config YAML (``MaxText/configs/base.yml`` keys).

MaxText names each mesh axis twice: ``ici_*`` inside a slice or node (ICI, NVLink) and ``dcn_*``
across them (the data-center network). A stage mesh's data axis spans ``nodes_per_mesh`` nodes
(or slices): those are ``dcn_data_parallelism`` (``dcn_fsdp_parallelism`` under FSDP, with HSDP's
replicas as ``dcn_data_parallelism``), the rest ``ici_*``; tensor parallelism stays inside a node;
the pipeline crosses nodes except between meshes that share one. Context parallelism is
``ici_context_parallelism`` / ``dcn_context_parallelism``: the context ranks sit inside the data
ranks (:class:`ir.Layout`'s rank order), so they stay inside a node unless the data axis alone is
spread one replica per node (then the nodes left over split the context axis, written as
``dcn_context_parallelism``); ``context_parallel_strategy`` (:func:`context_keys`) and
``context_parallel_load_balance`` (MaxText's causal load balancing, the plan's zig-zag split).
MaxText shards parameters over its context axis too (its ``embed`` logical axis rule names
``fsdp`` and ``context``), as the plan's FSDP layout does (:attr:`ir.Layout.shard`).
``per_device_batch_size`` is the global batch over every device (context ranks included: it may
be a fraction). MaxText's pipeline is its own circular one (the stages' forward
loop with ``num_pipeline_repeats`` for virtual stages, the backward by autodiff), with uniform
stages (``num_layers_per_pipeline_stage``); a plan schedule or uneven stages are notes.
Written with PyYAML.
"""

from __future__ import annotations

import yaml

from launchers.view import GPU_KINDS, TPU_KINDS, LauncherError, PartView, refuse_device
from zoo.config import ModelConfig

VERSION = "maxtext 0.2.5"
"""The MaxText release (its ``maxtext/configs/base.yml``, model configs and ``pyconfig``) the
files are written for and checked against."""

MODEL_NAMES = {"llama3-8b": "llama3-8b", "llama3-70b": "llama3-70b",
               "llama3-405b": "llama3.1-405b", "gpt3-175b": "gpt3-175b",
               "qwen3-8b": "qwen3-8b", "qwen3-14b": "qwen3-14b", "qwen3-32b": "qwen3-32b",
               "qwen3-30b-a3b": "qwen3-30b-a3b", "qwen3-235b-a22b": "qwen3-235b-a22b",
               "mixtral-8x7b-v0.1": "mixtral-8x7b", "mixtral-8x22b-v0.1": "mixtral-8x22b",
               "mistral-7b-v0.1": "mistral-7b", "deepseek-v3": "deepseek3-671b",
               "gpt-oss-120b": "gpt-oss-120b", "gpt-oss-20b": "gpt-oss-20b"}
"""Zoo model (lower case) -> MaxText ``model_name`` (``maxtext/configs/models/NAME.yml``, whose
decoder block, dimensions, RoPE base, QK-norm, MLA, dense first layers and shared experts are
MaxText's own for the model; gpt-oss's its sliding-window and full attention blocks)."""


def _model(v: PartView, notes: list[str]) -> dict:
    c = v.model
    if c.name.lower() in MODEL_NAMES:     # its own config; base.yml's capacity is dropless (-1)
        return {"model_name": MODEL_NAMES[c.name.lower()],
                **({"capacity_factor": c.capacity_factor}
                   if c.moe and v.layout.expert_dispatch == "tokendrop" else {})}
    slides = c.sliding_window and not c.full_attention_every   # every block: one MaxText key
    if c.mla or c.hybrid or c.linear_attention or (c.sliding_window and not slides):
        kind = ("MLA" if c.mla else "hybrid" if c.hybrid else
                "Gated DeltaNet" if c.linear_attention else "sliding-window")
        notes.append(f"MaxText has no model config for {c.name} and its {kind} "
                     f"attention is not written: add the model to MaxText first")
    block = ("mixtral" if c.moe else "llama2") if c.family == "llama" else "gpt3"
    notes.append(f"MaxText has no model config for {c.name}: its dimensions are written as "
                 f"base_* keys on MaxText's {block} decoder block")
    out = {"decoder_block": block,
           "base_num_decoder_layers": c.layers, "base_emb_dim": c.hidden,
           "base_mlp_dim": c.expert_ffn if c.moe else c.ffn, "base_num_query_heads": c.heads,
           "base_num_kv_heads": c.kv_heads, "head_dim": c.head_dim, "vocab_size": c.vocab,
           "rope_max_timescale": int(c.rope_theta),
           "logits_via_embedding": bool(c.tie_embeddings)}
    if c.qk_norm:      # per-head RMSNorm of queries and keys (base.yml ``use_qk_norm``)
        out["use_qk_norm"] = True
    out |= rope_scaling_keys(c, notes)
    if slides:         # base.yml: attention_type local_sliding, sliding_window_size
        out |= {"attention_type": "local_sliding", "sliding_window_size": c.sliding_window}
    if c.moe:
        out |= {"num_experts": c.experts, "num_experts_per_tok": c.experts_per_token,
                "base_moe_mlp_dim": c.expert_ffn,
                # dropless (base.yml's -1) unless the plan drops tokens at a capacity
                "capacity_factor": (c.capacity_factor if v.layout.expert_dispatch == "tokendrop"
                                    else -1.0)}
    return out


def rope_scaling_keys(c: ModelConfig, notes: list[str]) -> dict:
    """The model's RoPE scaling as MaxText 0.2.5 ``base.yml`` keys: ``rope_type`` ``llama3.1``
    (MaxText's ``LLaMARotaryEmbedding`` fixes Llama 3.1's factor 8, low/high frequency factors 1
    and 4 over 8,192 positions: another is one note), ``yarn`` with ``rope_factor``,
    ``original_max_position_embeddings``, ``beta_fast``, ``beta_slow``, ``mscale`` and
    ``rope_truncate``, or ``default`` with ``rope_linear_scaling_factor`` for linear scaling."""
    if c.pos_emb != "rope" or not c.rope_scaling:
        return {}
    if c.rope_scaling == "llama3":
        band = (c.rope_factor, c.rope_low_freq_factor or 1.0, c.rope_high_freq_factor or 4.0,
                c.rope_original_max_position or 8192)
        if band != (8.0, 1.0, 4.0, 8192):
            notes.append(f"llama3 rope scaling factor {band[0]:g}, low/high frequency factors "
                         f"{band[1]:g}/{band[2]:g} over {band[3]} positions: MaxText's llama3.1 "
                         f"RoPE fixes 8, 1/4 over 8192")
        return {"rope_type": "llama3.1", "rope_use_scale": True}
    if c.rope_scaling == "linear":
        return {"rope_type": "default", "rope_linear_scaling_factor": c.rope_factor}
    return {"rope_type": "yarn", "rope_factor": c.rope_factor,
            "original_max_position_embeddings": c.rope_original_max_position or 4096,
            "beta_fast": c.rope_beta_fast or 32.0, "beta_slow": c.rope_beta_slow or 1.0,
            "mscale": c.rope_mscale or 1.0, "rope_truncate": c.rope_truncate}


MODEL_DIFFS = {"mixtral-8x22b-v0.1": {"vocab_size": 32768}}
"""Zoo model -> MaxText's model-config values (``maxtext/configs/models/NAME.yml``, 0.2.5) that
differ from the published release the zoo carries (MaxText's ``mixtral-8x22b`` has the later
32768-token vocabulary; Mixtral-8x22B-v0.1's ``config.json`` 32000)."""


def model_overrides(v: PartView) -> list[str]:
    """``key=value`` words for the launch line that set the plan's model where MaxText's model
    config differs (:data:`MODEL_DIFFS`): MaxText's model config overrides the config file's
    keys, and only command-line keys with ``override_model_config=true`` override it."""
    c = v.model
    plan = {"vocab_size": c.vocab, "rope_max_timescale": int(c.rope_theta)}
    diff = {k: plan[k] for k, x in MODEL_DIFFS.get(c.name.lower(), {}).items() if plan[k] != x}
    return ["override_model_config=true", *(f"{k}={x}" for k, x in diff.items())] if diff else []


def _quantization(v: PartView, notes: list[str]) -> dict:
    """MaxText's ``quantization`` for the plan's precision recipe: ``fp8`` (its FP8 training
    through Flax's scaled dot products, one scale per tensor); none for BF16. MaxText has no
    blockwise or microscaling training recipe: those are written as ``fp8`` with a note."""
    if v.precision == "bf16":
        return {}
    if v.precision != "fp8":
        notes.append(f"MaxText has no {v.precision} training recipe: written as quantization "
                     f"fp8 (one scale per tensor; the plan's step assumes {v.precision})")
    return {"quantization": "fp8"}


def _optimizer(v: PartView, notes: list[str]) -> dict:
    """MaxText's dtype keys for the plan's :attr:`ir.Layout.optimizer_state` (``base.yml``:
    ``weight_dtype``, the dtype parameters and, by default, AdamW's moments are stored in, float32;
    ``mu_dtype``, the first moment's, blank for ``weight_dtype``): ``bf16`` is ``weight_dtype``
    bfloat16 (no master copy), ``bf16-moments`` is ``mu_dtype`` bfloat16 with a note (optax's
    AdamW keeps the second moment in the parameters' dtype); a plan whose loss is not ``fused``
    gets a note (XLA fuses MaxText's)."""
    if v.cross_entropy != "fused":
        notes.append(f"MaxText's loss is XLA-fused (the compute-dtype logits kept): the plan "
                     f"costed its loss as {v.cross_entropy}, more memory than the run holds")
    if v.model.attention_kernel == "flash2":
        notes.append("the plan costed the attention core as FlashAttention-2; MaxText runs its "
                     "own fused kernel (cuDNN's on GPUs, splash attention on TPUs), at the rate "
                     "the device profile describes (plan without --attention-kernel)")
    state = v.layout.optimizer_state
    if state == "bf16":
        return {"weight_dtype": "bfloat16"}
    if state == "bf16-moments":
        notes.append("MaxText stores AdamW's second moment in weight_dtype (float32): written as "
                     "mu_dtype bfloat16, 2 bytes a parameter more optimizer state than the plan's")
        return {"mu_dtype": "bfloat16"}
    return {}


def _tpu(v: PartView) -> bool:
    return v.device.lower().startswith("tpu")


def context_keys(v: PartView, dcn_context: int, notes: list[str]) -> dict:
    """MaxText's context-parallel keys besides the axes, for a layout with ``context`` > 1.

    ``context_parallel_strategy`` (``MaxText/configs/base.yml``: ``all_gather`` (default),
    ``ring``, ``ulysses``; ``maxtext/configs/types.py`` checks them): the plan's ``allgather`` is
    ``all_gather`` and its ``ring`` is ``ring`` on either device; its ``alltoall``
    (DeepSpeed-Ulysses) is ``ulysses`` on TPU, with ``context_parallel_load_balance`` false
    (MaxText requires it: Ulysses attends the whole sequence in order) and the context axis
    inside a slice (MaxText has no DCN Ulysses), and ``all_gather`` with a note on GPUs (MaxText's
    Ulysses is TPU-only). On TPU, ``ring`` and ``ulysses`` run in the Tokamax splash kernel
    (``attention: flash``, ``use_tokamax_splash: true``, both written); on GPUs MaxText's context
    parallel attention is Transformer Engine's (``attention: cudnn_flash_te``, written)."""
    lay = v.layout
    tpu = _tpu(v)
    strategy = {"ring": "ring", "allgather": "all_gather", "alltoall": "ulysses"}[
        lay.context_method]
    if strategy == "ulysses" and not tpu:
        strategy = "all_gather"
        split = ("" if v.seq_len % (2 * lay.context) == 0 else
                 f"; its causal split into {2 * lay.context} chunks does not divide {v.seq_len} "
                 f"tokens: set context_parallel_load_balance false")
        notes.append(f"MaxText runs all-to-all (Ulysses) context parallel on TPU only: context "
                     f"{lay.context} written as all_gather (the plan's step assumed heads "
                     f"scattered by all-to-all){split}")
    if strategy == "ulysses" and dcn_context > 1:
        notes.append(f"MaxText's Ulysses context parallel stays inside a slice; the plan's context "
                     f"axis spans {dcn_context} slices (dcn_context_parallelism {dcn_context}): "
                     f"MaxText refuses it, re-plan with fewer slices per mesh")
    out: dict = {"context_parallel_strategy": strategy,
                 "context_parallel_load_balance": strategy != "ulysses"}
    if tpu and strategy in ("ring", "ulysses"):
        out |= {"attention": "flash", "use_tokamax_splash": True}
    elif not tpu:
        out["attention"] = "cudnn_flash_te"
    return out


def _dcn_split(data: int, context: int, nodes: int) -> tuple[int, int] | None:
    """(data, context) degrees across ``nodes`` nodes: the data axis first (it is the outer one),
    then the context axis once every data replica has nodes of its own; None when neither
    divides."""
    if data % nodes == 0:
        return nodes, 1
    if nodes % data == 0 and context % (nodes // data) == 0:
        return data, nodes // data
    return None


def pipeline_blocks(v: PartView, model_name: str, notes: list[str]) -> int:
    """MaxText's ``num_layers_per_pipeline_stage`` for a pipelined part. MaxText's pipeline
    (``maxtext/configs/types.py``) runs ``pipeline_parallel_layers`` blocks (every block, or on
    its DeepSeek decoder every block after the dense first ones), the same number on every stage
    (stages x repeats x layers per stage must equal them), with the embedding and the head outside
    it. A plan whose stages hold different block counts is written as the even split with a note
    (the plan's uneven split balanced the embedding and head MaxText runs outside the pipeline).

    Raises:
        LauncherError: the pipelined blocks do not divide over the plan's stages (one line)."""
    stages = len(v.stage_layers)
    counts = [v.decoder_layers(s) for s in range(stages)]
    dense = v.model.dense_layers if model_name.startswith("deepseek") else 0
    piped = v.model.layers - dense
    if piped % stages:
        where = f"{v.name} runs" if v.name else "the plan runs"
        raise LauncherError(
            f"{where} {piped} transformer blocks on {stages} pipeline stages ({counts}); MaxText's "
            f"pipeline runs as many blocks on every stage (num_layers_per_pipeline_stage), which "
            f"{piped} blocks over {stages} stages cannot: export it to megatron or torchtitan "
            f"(per-stage layers) or re-plan with a stage count dividing {piped}")
    if len(set(counts)) > 1 or dense:
        notes.append(f"the plan's stages hold {counts} blocks; MaxText's pipeline stages are "
                     f"uniform, with the embedding and head outside the pipeline"
                     + (f" and its {dense} dense first blocks before it" if dense else "")
                     + f": written as {piped // stages} blocks per stage")
    return piped // stages


def config(v: PartView, source: str) -> tuple[dict, list[str]]:
    """(the config as a dict, what MaxText cannot express)."""
    refuse_device(v, "MaxText", TPU_KINDS + GPU_KINDS)
    notes = list(v.notes)
    lay = v.layout
    split = _dcn_split(lay.data, lay.context, v.nodes_per_mesh)
    nodes, dcn_context = split or (1, 1)
    if split is None:
        what = (f"data {lay.data}" if lay.context == 1 else
                f"data {lay.data} x context {lay.context}")
        notes.append(f"{what} does not split over {v.nodes_per_mesh} nodes: all of it "
                     f"written as ici")
    per_node = v.meshes_per_node if v.pipeline % v.meshes_per_node == 0 else 1
    axes = {"ici_data_parallelism": 1, "ici_fsdp_parallelism": 1,
            "ici_tensor_parallelism": lay.tensor, "ici_pipeline_parallelism": per_node,
            "dcn_data_parallelism": 1, "dcn_fsdp_parallelism": 1,
            "dcn_pipeline_parallelism": v.pipeline // per_node}
    if lay.context > 1:    # the keys MaxText defaults to 1 are written only for a context layout
        axes |= {"ici_context_parallelism": lay.context // dcn_context,
                 "dcn_context_parallelism": dcn_context}
        if not lay.fsdp:
            notes.append(f"MaxText shards parameters over its context axis (FSDP over the "
                         f"{lay.context} context ranks); the plan kept whole parameters on each "
                         f"device: expect the parameter gathers the plan did not cost, or plan "
                         f"with FSDP")
    if lay.expert > 1 and lay.expert_dispatch == "deepep":
        notes.append("the plan dispatches tokens in two hops (DeepEP), which MaxText does not: "
                     "its expert all-to-all runs as one")
    if lay.fsdp:
        replicas = lay.hsdp if nodes % lay.hsdp == 0 else 1
        axes |= {"ici_fsdp_parallelism": lay.data // nodes, "dcn_fsdp_parallelism": nodes // replicas,
                 "dcn_data_parallelism": replicas}
        if replicas != lay.hsdp:
            notes.append(f"hybrid sharding over {lay.hsdp} replicas does not follow the "
                         f"{nodes} nodes of a mesh: written as full sharding")
    elif lay.expert > 1 and (lay.data // nodes) % lay.expert == 0:
        axes |= {"ici_data_parallelism": lay.data // nodes // lay.expert,
                 "ici_expert_parallelism": lay.expert, "dcn_data_parallelism": nodes}
        if lay.folded:
            notes.append(f"expert tensor parallel {lay.etp} (MoE parallel folding) has no MaxText "
                         f"axis: the experts are written tensor-split {lay.tensor} ways, as the "
                         f"attention")
    else:
        axes |= {"ici_data_parallelism": lay.data // nodes, "dcn_data_parallelism": nodes}
        if lay.expert > 1:
            notes.append(f"expert parallel {lay.expert}"
                         + (f" over data x tensor (MoE parallel folding, expert tensor parallel "
                            f"{lay.etp})" if lay.expert > lay.data else " spans nodes")
                         + ": written as data parallel (MaxText's ici_expert_parallelism is a "
                           "split of the data devices inside one node)")
    doc = {"run_name": f"{v.model.name}{'-' + v.name if v.name else ''}-mpmd",
           **_model(v, notes), "max_target_length": v.seq_len,
           "per_device_batch_size": (v.global_batch / v.devices if v.pipeline > 1 else
                                     v.global_batch / v.microbatches / v.devices),
           **({"gradient_accumulation_steps": v.microbatches}
              if v.pipeline == 1 and v.microbatches > 1 else {}),
           "hardware": "tpu" if _tpu(v) else "gpu",   # one process per host, as the launch line
           **axes,
           "remat_policy": "full" if v.recompute else "minimal",
           **(context_keys(v, dcn_context, notes) if lay.context > 1 else {}),
           **_quantization(v, notes), **_optimizer(v, notes)}
    if v.pipeline > 1:
        per_stage = pipeline_blocks(v, doc.get("model_name", ""), notes)
        doc |= {"num_pipeline_microbatches": v.microbatches,
                "num_layers_per_pipeline_stage": per_stage,
                "num_pipeline_repeats": v.virtual}
        notes.append(f"MaxText runs its circular pipeline, not {v.schedule}: the plan's step time "
                     f"assumed {v.schedule}")
    return doc, notes


def render(v: PartView, source: str) -> tuple[str, list[str]]:
    """(the YAML text with a comment header, notes)."""
    doc, notes = config(v, source)
    over = model_overrides(v)
    if over:
        notes.append(f"MaxText's {doc['model_name']} model config differs from the plan's model: "
                     f"the launch line sets {' '.join(over[1:])} (override_model_config=true), "
                     f"which the config file cannot")
    slices = 1
    for k, x in doc.items():
        if k.startswith("dcn_") and k.endswith("_parallelism"):
            slices *= x
    env = ("" if _tpu(v) or slices == 1 else
           f"JAX_COORDINATOR_IP=HOST0 JAX_COORDINATOR_PORT=PORT NNODES={slices} NODE_RANK=i ")
    head = (f"# MaxText config ({VERSION}) for {v.model.name}{' ' + v.name if v.name else ''} on "
            f"{v.devices} x {v.device}, exported by mpmd from {source}\n"
            f"# its keys override MaxText's base.yml (base_config); launch on every host"
            f"{'' if _tpu(v) or slices == 1 else f' (host i of {slices})'}: {env}python -m "
            f"maxtext.trainers.pre_train.train THIS_FILE.yml "
            f"{''.join(w + ' ' for w in model_overrides(v))}base_output_directory=DIR "
            f"dataset_path=DATA\n")
    return head + yaml.safe_dump({"base_config": "base.yml", **doc}, sort_keys=False), notes
