"""A plan as a MaxText config YAML (``MaxText/configs/base.yml`` keys).

MaxText names each mesh axis twice: ``ici_*`` inside a slice or node (ICI, NVLink) and ``dcn_*``
across them (the data-center network). A stage mesh's data axis spans ``nodes_per_mesh`` nodes
(or slices): those are ``dcn_data_parallelism`` (``dcn_fsdp_parallelism`` under FSDP, with HSDP's
replicas as ``dcn_data_parallelism``), the rest ``ici_*``; tensor parallelism stays inside a node;
the pipeline crosses nodes except between meshes that share one. ``per_device_batch_size`` is the
global batch over every device. MaxText's pipeline is its own circular one (the stages' forward
loop with ``num_pipeline_repeats`` for virtual stages, the backward by autodiff), with uniform
stages (``num_layers_per_pipeline_stage``); a plan schedule or uneven stages are notes.
Written with PyYAML.
"""

from __future__ import annotations

import yaml

from launchers.view import PartView

MODEL_NAMES = {"llama3-8b": "llama3-8b", "llama3-70b": "llama3-70b",
               "llama3-405b": "llama3.1-405b", "gpt3-175b": "gpt3-175b"}
"""Zoo model -> MaxText ``model_name`` (``MaxText/configs/models``)."""


def _model(v: PartView, notes: list[str]) -> dict:
    c = v.model
    if c.name in MODEL_NAMES:
        return {"model_name": MODEL_NAMES[c.name]}
    notes.append(f"MaxText has no model config for {c.name}: its dimensions are written as "
                 f"base_* keys on MaxText's {'gpt3' if c.family != 'llama' else 'mistral' if c.moe else 'llama2'} "
                 f"decoder block")
    out = {"decoder_block": ("mistral" if c.moe else "llama2") if c.family == "llama" else "gpt3",
           "base_num_decoder_layers": c.layers, "base_emb_dim": c.hidden,
           "base_mlp_dim": c.expert_ffn if c.moe else c.ffn, "base_num_query_heads": c.heads,
           "base_num_kv_heads": c.kv_heads, "head_dim": c.head_dim, "vocab_size": c.vocab}
    if c.moe:
        out |= {"num_experts": c.experts, "num_experts_per_tok": c.experts_per_token,
                "capacity_factor": c.capacity_factor}
    return out


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


def config(v: PartView, source: str) -> tuple[dict, list[str]]:
    """(the config as a dict, what MaxText cannot express)."""
    notes = list(v.notes)
    lay = v.layout
    nodes = v.nodes_per_mesh if lay.data % v.nodes_per_mesh == 0 else 1
    if nodes != v.nodes_per_mesh:
        notes.append(f"data {lay.data} does not split over {v.nodes_per_mesh} nodes: all of it "
                     f"written as ici")
    per_node = v.meshes_per_node if v.pipeline % v.meshes_per_node == 0 else 1
    axes = {"ici_data_parallelism": 1, "ici_fsdp_parallelism": 1,
            "ici_tensor_parallelism": lay.tensor, "ici_pipeline_parallelism": per_node,
            "dcn_data_parallelism": 1, "dcn_fsdp_parallelism": 1,
            "dcn_pipeline_parallelism": v.pipeline // per_node}
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
           "per_device_batch_size": v.global_batch / v.devices, **axes,
           "remat_policy": "full" if v.recompute else "minimal",
           **_quantization(v, notes)}
    if v.pipeline > 1:
        blocks = {v.decoder_layers(s) for s in range(len(v.stage_layers))}
        if len(blocks) > 1:
            notes.append(f"stages hold {sorted(blocks)} blocks; MaxText's stages are uniform: "
                         f"written as {v.model.layers // len(v.stage_layers)} per stage")
        doc |= {"num_pipeline_microbatches": v.microbatches,
                "num_layers_per_pipeline_stage": v.model.layers // len(v.stage_layers),
                "num_pipeline_repeats": v.virtual}
        notes.append(f"MaxText runs its circular pipeline, not {v.schedule}: the plan's step time "
                     f"assumed {v.schedule}")
    return doc, notes


def render(v: PartView, source: str) -> tuple[str, list[str]]:
    """(the YAML text with a comment header, notes)."""
    doc, notes = config(v, source)
    head = (f"# MaxText config for {v.model.name}{' ' + v.name if v.name else ''} on {v.devices} x "
            f"{v.device}, exported by mpmd from {source}\n"
            f"# each key overrides MaxText/configs/base.yml: pass it as KEY=VALUE after that file on "
            f"the MaxText.train command line\n")
    return head + yaml.safe_dump(doc, sort_keys=False), notes
