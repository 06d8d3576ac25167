"""A plan as a torchtitan job TOML (``torchtitan/config/job_config.py`` names).

``[parallelism]``: ``data_parallel_shard_degree`` is the FSDP degree and
``data_parallel_replicate_degree`` the replicas around it (HSDP), or plain DDP when the layout does
not shard; both exclude context parallelism, ``context_parallel_degree`` (torchtitan's world is
``replicate x shard x cp x tp x pp``, its FSDP shards over ``shard x cp``, the ``dp_shard_cp``
mesh, as the plan's layout does: :attr:`ir.Layout.shard`), with
``context_parallel_rotate_method`` (:data:`ROTATE_METHODS`); torchtitan's causal load balancing
of the context split is on by default (the plan's zig-zag split) and is not written, since its
key changed between releases; ``tensor_parallel_degree`` (``enable_async_tensor_parallel`` for a
layout that overlaps its tensor-parallel collectives); ``pipeline_parallel_degree``,
``pipeline_parallel_schedule``, ``pipeline_parallel_microbatch_size`` and
``module_fqns_per_model_part`` (each stage's modules, so uneven stages are written as planned).
``[activation_checkpoint] mode``: ``full`` or ``none``. Written with ``tomli_w``.
"""

from __future__ import annotations

import tomli_w

from launchers.view import PartView

SCHEDULES = {"1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B", "gpipe": "GPipe",
             "zb-v": "ZBVZeroBubble", "dualpipe-v": "DualPipeV"}
"""Plan schedule -> torchtitan's ``pipeline_parallel_schedule`` (PyTorch's
``torch.distributed.pipelining`` schedule classes)."""

ROTATE_METHODS = {"ring": "alltoall", "allgather": "allgather", "alltoall": "allgather"}
"""Plan context method (:data:`ir.CONTEXT_METHODS`) -> torchtitan's
``context_parallel_rotate_method``. Both of torchtitan's methods are ring attention
(``torch.distributed.tensor.experimental._attention``): ``"alltoall"`` passes each K/V shard to the
next rank (``_AllToAllRotater``, a ``permute_tensor`` ring shift) while attending the one held, and
the K/V gradients around the ring in the backward: the plan's ``ring``, exactly, despite the name.
``"allgather"`` all-gathers the K/V once (``_AllGatherRotater``), the plan's ``allgather``, but its
backward still passes the K/V gradients around the ring where the plan reduce-scatters them (a
note). torchtitan has no head-scattering (DeepSpeed-Ulysses) context parallel: the plan's
``alltoall`` is written as ``"allgather"`` with a note."""

FLAVORS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"),
           "llama3-405b": ("llama3", "405B")}
"""Zoo model -> torchtitan ``[model] name, flavor`` (torchtitan's Llama 3 flavors)."""


def _fqns(layers: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for n in layers:
        if n == "embed":
            out.append("tok_embeddings")
        elif n == "head":
            out += ["norm", "output"]
        else:
            out.append(f"layers.{int(n[5:])}")
    return out


def job(v: PartView, source: str) -> tuple[dict, list[str]]:
    """(the job config as a dict of TOML tables, what torchtitan cannot express)."""
    notes = list(v.notes)
    lay = v.layout
    name, flavor = FLAVORS.get(v.model.name, ("llama3" if v.model.family == "llama" else
                                              v.model.family, v.model.name))
    if v.model.name not in FLAVORS:
        notes.append(f"torchtitan has no {name} flavor {v.model.name!r}: [model] written as "
                     f"name {name!r}, flavor {v.model.name!r}; add the model to torchtitan first")
    if lay.fsdp:
        replicate, shard = lay.hsdp, lay.data // lay.hsdp
    else:
        replicate, shard = lay.data, 1
        if lay.context > 1:
            notes.append(f"with context parallel torchtitan shards parameters, gradients and "
                         f"optimizer state over the {lay.context} context ranks (FSDP over "
                         f"dp_shard x cp) and replicates them over data {lay.data}; the plan kept "
                         f"whole parameters and sharded the optimizer state over data x context "
                         f"{lay.replicas} (distributed optimizer): expect the parameter gathers "
                         f"the plan did not cost, or plan with FSDP")
        elif lay.data > 1:
            notes.append(f"torchtitan's DDP keeps the optimizer state on every replica; the plan "
                         f"sharded it over data {lay.data} (distributed optimizer): check memory "
                         f"or plan with FSDP")
    rotate = ROTATE_METHODS[lay.context_method]
    if lay.context > 1 and lay.context_method != "ring":
        _context_note(v, rotate, notes)
    if lay.expert > 1 and lay.expert_dispatch == "deepep":
        notes.append("the plan dispatches tokens in two hops (DeepEP); torchtitan's expert "
                     "parallel runs one all-to-all: expect the all-to-all the plan did not cost")
    par: dict = {"data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": shard,
                 "tensor_parallel_degree": lay.tensor,
                 "enable_async_tensor_parallel": bool(lay.tp_overlap and lay.tensor > 1),
                 "pipeline_parallel_degree": v.pipeline, "context_parallel_degree": lay.context,
                 **({"context_parallel_rotate_method": rotate} if lay.context > 1 else {}),
                 **({"expert_parallel_degree": lay.expert,
                     "expert_tensor_parallel_degree": lay.etp} if lay.expert > 1 else {})}
    if v.pipeline > 1:
        sched = SCHEDULES.get(v.schedule)
        if sched is None:
            sched = "Interleaved1F1B" if v.virtual > 1 else "1F1B"
            notes.append(f"schedule {v.schedule} has no torchtitan name: written as {sched}")
        par |= {"pipeline_parallel_schedule": sched,
                "pipeline_parallel_microbatch_size": v.micro_batch,
                "module_fqns_per_model_part": [_fqns(s) for s in v.stage_layers]}
    converters, quantize = _precision(v, notes)
    doc = {
        "job": {"description": f"{v.model.name}{' ' + v.name if v.name else ''} on {v.devices} x "
                               f"{v.device}, exported by mpmd from {source}"},
        "model": {"name": name, "flavor": flavor,
                  **({"converters": converters} if converters else {})},
        "training": {"local_batch_size": v.global_batch // max(1, v.data),
                     "global_batch_size": v.global_batch, "seq_len": v.seq_len,
                     "mixed_precision_param": v.model.dtype},   # a torchtitan TORCH_DTYPE_MAP name
        "parallelism": par,
        "activation_checkpoint": {"mode": "full" if v.recompute else "none"},
        **quantize,
    }
    return doc, notes


def _context_note(v: PartView, rotate: str, notes: list[str]) -> None:
    """The note for a context method torchtitan has only an approximation of
    (:data:`ROTATE_METHODS`)."""
    lay = v.layout
    if lay.context_method == "allgather":
        notes.append("torchtitan's allgather context parallel gathers the K/V once but passes "
                     "their gradients around the ring in the backward; the plan reduce-scattered "
                     "them")
        return
    split = ("" if v.seq_len % (2 * lay.context) == 0 else
             f"; its causal split into {2 * lay.context} chunks does not divide {v.seq_len} "
             f"tokens: turn torchtitan's context load balancing off")
    notes.append(f"torchtitan has no all-to-all (DeepSpeed-Ulysses) context parallel: context "
                 f"{lay.context} written as its {rotate} ring attention (the plan's step assumed "
                 f"heads scattered by all-to-all){split}")


def _precision(v: PartView, notes: list[str]) -> tuple[list[str], dict]:
    """(``[model] converters``, the converter's own table) for the plan's precision recipe:
    torchtitan's ``float8`` converter (torchao float8 training, ``recipe_name`` ``tensorwise``
    or ``rowwise``; FP8 all-gathers under FSDP) and its ``mx`` converter (``mxfp8``); a recipe
    torchtitan has no converter for is written as the nearest with a note."""
    if v.precision == "bf16":
        return [], {}
    if v.precision in ("mxfp8", "nvfp4"):
        if v.precision == "nvfp4":
            notes.append("torchtitan has no nvfp4 training converter: written as its mx "
                         "converter's mxfp8 (the plan's step assumes NVFP4 GEMMs)")
        return ["mx"], {"mx": {"recipe_name": "mxfp8"}}
    if v.precision == "fp8-blockwise":
        notes.append("torchtitan's float8 converter has no fp8-blockwise (1x128/128x128) "
                     "recipe: written as rowwise scaling (the plan's step assumes blockwise "
                     "scales)")
    recipe = "rowwise" if v.precision == "fp8-blockwise" else "tensorwise"
    return ["float8"], {"float8": {"recipe_name": recipe,
                                   "enable_fsdp_float8_all_gather": bool(v.layout.fsdp)}}


def render(v: PartView, source: str) -> tuple[str, list[str]]:
    """(the TOML text, notes)."""
    doc, notes = job(v, source)
    return tomli_w.dumps(doc), notes
