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

from launchers.view import GPU_KINDS, LauncherError, PartView, refuse_device
from zoo.config import ModelConfig

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

VERSION = "0.3.0"
"""The torchtitan release the default target (``--to torchtitan``, a Python config module) writes
for; :data:`TOML_VERSION` for ``--to torchtitan@0.2`` (a job TOML)."""

TOML_VERSION = "0.2.2"
"""The last torchtitan release that reads TOML job files (``--job.config_file``)."""

FLAVORS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"),
           "llama3-405b": ("llama3", "405B"), "qwen3-0.6b": ("qwen3", "0.6B"),
           "qwen3-1.7b": ("qwen3", "1.7B"), "qwen3-4b": ("qwen3", "4B"), "qwen3-8b": ("qwen3", "8B"),
           "qwen3-14b": ("qwen3", "14B"), "qwen3-32b": ("qwen3", "32B"),
           "qwen3-30b-a3b": ("qwen3", "30B-A3B"), "qwen3-235b-a22b": ("qwen3", "235B-A22B"),
           "deepseek-v3": ("deepseek_v3", "671B"), "gpt-oss-120b": ("gpt_oss", "120b"),
           "gpt-oss-20b": ("gpt_oss", "20b")}
"""Zoo model name (lower case) -> torchtitan ``(model, flavor)``: the models torchtitan 0.2.2 and
0.3.0 both ship (``torchtitan/models/{llama3,qwen3,deepseek_v3,gpt_oss}/__init__.py``), whose
flavours are these models' published shapes; gpt-oss's flavours carry its sliding-window
attention (128 tokens on every even block, full on the odd ones: the zoo's
``sliding_window`` / ``full_attention_every`` 2), its attention sinks and clamped SwiGLU. A model not here has no torchtitan model and is refused
(:func:`model_flavor`)."""

FLAVOR_ROPE_THETA = {"qwen3-235b-a22b": 5000000.0}
"""Zoo model -> the RoPE base of torchtitan's flavour (0.2.2 and 0.3.0), where it is not the
published model's: torchtitan's ``235B-A22B`` is Qwen3-235B-A22B-2507's (``theta=5000000``), the
original release's ``config.json`` has ``rope_theta`` 1e6. The 0.3 module sets the plan's base on
every block's RoPE; 0.2's TOML cannot (a note)."""

FLAVOR_ROPE: dict[str, tuple] = {
    "llama3": ("llama3", 8.0, 1.0, 4.0, 8192), "qwen3": (),
    "deepseek_v3": ("yarn", 40.0, 4096, 32.0, 1.0, True),
    "gpt_oss": ("yarn", 32.0, 4096, 32.0, 1.0, False)}
"""torchtitan model -> the RoPE scaling every flavour of it runs (0.3.0
``torchtitan/models/*/__init__.py``: ``ComplexRoPE``/``CosSinRoPE.Config(scaling=...)``; 0.2.2's
llama3 ``RoPEScalingArgs`` default): ``("llama3", factor, low, high, original positions)`` (all
three Llama 3 flavours, Llama 3.1's bands, also for Llama 3 8B/70B, which have none), ``("yarn",
factor, original positions, beta fast, beta slow, truncate)``, ``()`` none."""


FLAVOR_ROPE_02 = {**FLAVOR_ROPE, "gpt_oss": ("yarn", 32.0, 4096, 32.0, 1.0, True)}
""":data:`FLAVOR_ROPE` as torchtitan 0.2.2 runs it: its gpt_oss YaRN has no ``truncate`` and
rounds the correction range (``models/gpt_oss/model/args.py``), where gpt-oss's config and 0.3
do not."""



def cp_attention_note(kernel: str) -> str:
    """The note of a context-parallel plan whose attention core is costed as ``kernel``
    (``ModelConfig.attention_kernel``) rather than FlashAttention-2: under context parallelism
    torchtitan pins SDPA to its flash and efficient backends (``get_train_context``), the only
    ops PyTorch's context parallel dispatches."""
    return ("under context parallelism torchtitan pins SDPA to its flash and efficient backends "
            "(FlashAttention-2; PyTorch's context parallel dispatches no other): the plan costed "
            f"the {kernel} kernel, faster than the run's on Hopper (plan with --attention-kernel "
            "flash2)")

def rope_of(c: ModelConfig) -> tuple:
    """The model's RoPE scaling in :data:`FLAVOR_ROPE`'s form (YaRN's defaults 4096, 32, 1 where
    the config gives none; Llama 3.1's 1, 4, 8192)."""
    if c.pos_emb != "rope" or not c.rope_scaling:
        return ()
    if c.rope_scaling == "llama3":
        return ("llama3", float(c.rope_factor), c.rope_low_freq_factor or 1.0,
                c.rope_high_freq_factor or 4.0, c.rope_original_max_position or 8192)
    if c.rope_scaling == "linear":
        return ("linear", float(c.rope_factor))
    return ("yarn", float(c.rope_factor), c.rope_original_max_position or 4096,
            float(c.rope_beta_fast or 32.0), float(c.rope_beta_slow or 1.0), c.rope_truncate)


def rope_text(rope: tuple) -> str:
    """A :func:`rope_of` tuple in words: ``"llama3 x8 (low/high 1/4 over 8192)"``, ``"yarn x40
    over 4096 (beta 32/1)"``, ``"none"``."""
    if not rope:
        return "none"
    if rope[0] == "llama3":
        return f"llama3 x{rope[1]:g} (low/high {rope[2]:g}/{rope[3]:g} over {rope[4]})"
    if rope[0] == "linear":
        return f"linear x{rope[1]:g}"
    return (f"yarn x{rope[1]:g} over {rope[2]} (beta {rope[3]:g}/{rope[4]:g}"
            + (", untruncated)" if not rope[5] else ")"))


def _rope_fields(rope: tuple) -> dict[str, object]:
    """0.3's ``RoPE.Config`` fields for a :func:`rope_of` tuple (``rope.py``: ``scaling``
    ``none``/``llama``/``yarn``, ``scaling_factor``, ``low_freq_factor``, ``high_freq_factor``,
    ``original_max_position_embeddings``; ``rope_factor``, ``original_seq_len``, ``beta_fast``,
    ``beta_slow``, ``truncate``)."""
    if not rope:
        return {"scaling": "none"}
    if rope[0] == "llama3":
        return {"scaling": "llama", "scaling_factor": rope[1], "low_freq_factor": rope[2],
                "high_freq_factor": rope[3], "original_max_position_embeddings": rope[4]}
    return {"scaling": "yarn", "rope_factor": rope[1], "original_seq_len": rope[2],
            "beta_fast": rope[3], "beta_slow": rope[4], "truncate": rope[5]}


RECIPES = {"llama3": {"8B": "llama3_8b", "70B": "llama3_70b", "405B": "llama3_405b"},
           "qwen3": {}, "deepseek_v3": {}, "gpt_oss": {"20b": "gpt_oss_20b", "120b": "gpt_oss_120b"}}
"""torchtitan 0.3's ``config_registry`` function the module starts from (optimizer, data loader,
checkpointing): the flavour's own where torchtitan has one, else :data:`BASE_RECIPE`'s, whose
model is then replaced by the flavour's."""

BASE_RECIPE = {"llama3": "llama3_8b", "qwen3": "qwen3_14b", "deepseek_v3": "deepseek_v3_671b",
               "gpt_oss": "gpt_oss_120b"}


def model_flavor(v: PartView) -> tuple[str, str]:
    """torchtitan's ``(model, flavor)`` for the part's model.

    Raises:
        LauncherError: torchtitan ships no such model (one line naming the models it ships).
    """
    got = FLAVORS.get(v.model.name.lower())
    if got is None:
        raise LauncherError(
            f"torchtitan ships no model for {v.model.name} (it ships llama3 8B/70B/405B, qwen3 "
            f"0.6B-32B, 30B-A3B, 235B-A22B, deepseek_v3 671B and gpt_oss 20b/120b); export this "
            f"plan to {'megatron-bridge' if v.model.linear_attention else 'megatron or maxtext'}")
    return got


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


def job(v: PartView, source: str, toml: bool = True) -> tuple[dict, list[str]]:
    """(the job config as a dict of TOML tables, what torchtitan cannot express; ``toml``: for
    0.2's TOML, else for 0.3's module)."""
    notes = list(v.notes)
    lay = v.layout
    refuse_device(v, "torchtitan", GPU_KINDS)
    name, flavor = model_flavor(v)
    theta = FLAVOR_ROPE_THETA.get(v.model.name.lower())
    if theta is not None and theta != v.model.rope_theta:
        notes.append(f"torchtitan's {name} {flavor} flavour has RoPE base {theta:g}, the plan's "
                     f"model {v.model.rope_theta:g}"
                     + (": the 0.2 TOML cannot set it" if toml else
                        ": the module sets the plan's on every block"))
    plan_rope, flavour_rope = rope_of(v.model), (FLAVOR_ROPE_02 if toml else FLAVOR_ROPE)[name]
    if plan_rope != flavour_rope:
        if plan_rope and plan_rope[0] == "linear":
            notes.append(f"torchtitan's RoPE has no linear scaling: the plan's model scales by "
                         f"{plan_rope[1]:g}, the {name} {flavor} flavour's rope scaling is kept")
        else:
            notes.append(f"torchtitan's {name} {flavor} flavour has rope scaling "
                         f"{rope_text(flavour_rope)}, the plan's model {rope_text(plan_rope)}"
                         + (": the 0.2 TOML cannot set it" if toml else
                            ": the module sets the plan's on every block"))
    if lay.fsdp:
        replicate, shard = lay.hsdp, lay.data // lay.hsdp
    else:
        # torchtitan refuses DDP beside tensor or pipeline parallel, and its expert parallel
        # is carved out of dp_shard x cp: the data axis is written as FSDP
        replicate, shard = 1, lay.data
        if lay.data > 1 or lay.context > 1:
            notes.append(f"torchtitan shards parameters, gradients and optimizer state over "
                         f"data x context {lay.replicas} (FSDP: its DDP does not combine with "
                         f"tensor, pipeline or expert parallel); the plan kept whole parameters "
                         f"and sharded the optimizer state (distributed optimizer): expect "
                         f"parameter gathers the plan did not cost, or plan with FSDP")
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
    if v.context > 1 and v.model.attention_kernel != "flash2":
        notes.append(cp_attention_note(v.model.attention_kernel))
    if v.cross_entropy != "eager":
        notes.append(f"torchtitan computes the loss with PyTorch's cross_entropy on the fp32 "
                     f"logits, op by op: the run holds more memory at the loss than the plan's "
                     f"{v.cross_entropy} loss (plan with --cross-entropy eager)")
    if lay.optimizer_state != "fp32":
        notes.append(f"torchtitan keeps fp32 parameters and AdamW state (FSDP2 computes in "
                     f"mixed_precision_param): the plan's {lay.optimizer_state} optimizer state "
                     f"is not asked for, and the run holds more memory than the plan")
    doc = {
        "job": {"description": f"{v.model.name}{' ' + v.name if v.name else ''} on {v.devices} x "
                               f"{v.device}, exported by mpmd from {source}"},
        "model": {"name": name, "flavor": flavor,
                  **({"converters": converters} if converters else {})},
        "training": {"local_batch_size": (v.micro_batch if v.pipeline == 1 else
                                          v.global_batch // max(1, v.data)),
                     "global_batch_size": v.global_batch, "seq_len": v.seq_len,
                     "mixed_precision_param": v.model.dtype,    # a torchtitan TORCH_DTYPE_MAP name
                     **({"mixed_precision_reduce": "bfloat16"}
                        if lay.grad_reduce == "bf16" else {})},
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


PARALLELISM_03 = ("data_parallel_replicate_degree", "data_parallel_shard_degree",
                  "tensor_parallel_degree", "pipeline_parallel_degree",
                  "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                  "module_fqns_per_model_part", "context_parallel_degree",
                  "expert_parallel_degree")
"""The ``[parallelism]`` keys torchtitan 0.3.0's ``ParallelismConfig`` still has (it dropped
``enable_async_tensor_parallel``, ``context_parallel_rotate_method`` and
``expert_tensor_parallel_degree``)."""


def _launch(v: PartView, config: str) -> str:
    nodes = max(1, v.devices // 8)
    per = v.devices // nodes
    return (f"torchrun --nnodes {nodes} --nproc-per-node {per} -m torchtitan.train {config}")


def module(v: PartView, source: str, stem: str) -> tuple[str, list[str]]:
    """(a torchtitan 0.3 config module's text, notes): a ``mpmd_plan()`` config function
    starting from torchtitan's own recipe for the model (:data:`RECIPES`), its model replaced by
    the plan's flavour and its training, parallelism and activation checkpointing set to the
    plan's. torchtitan 0.3 reads ``--module`` (a config module on ``PYTHONPATH``) and
    ``--config`` (a function in it)."""
    doc, notes = job(v, source, toml=False)
    name, flavor = model_flavor(v)
    theta = FLAVOR_ROPE_THETA.get(v.model.name.lower())
    rope = ([f"    for block in config.model_spec.model.layers:   # the plan's RoPE base, not the "
             f"flavour's {theta:g}",
             f"        block.attention.rope.theta = {float(v.model.rope_theta)!r}"]
            if theta is not None and theta != v.model.rope_theta else [])
    plan_rope = rope_of(v.model)
    if plan_rope != FLAVOR_ROPE[name] and not (plan_rope and plan_rope[0] == "linear"):
        rope += ["    for block in config.model_spec.model.layers:   # the plan's rope scaling, "
                 "not the flavour's"]
        rope += [f"        block.attention.rope.{k} = {x!r}"
                 for k, x in _rope_fields(plan_rope).items()]
    par = {k: x for k, x in doc["parallelism"].items() if k in PARALLELISM_03}
    dropped = [k for k in doc["parallelism"] if k not in PARALLELISM_03 and doc["parallelism"][k]
               not in (False, 1)]
    for k in dropped:
        if k == "expert_tensor_parallel_degree":
            notes.append(f"torchtitan {VERSION} has no expert tensor parallel: the experts are "
                         f"split over expert parallel only (the plan's etp "
                         f"{doc['parallelism'][k]})")
        elif k == "enable_async_tensor_parallel":
            notes.append(f"torchtitan {VERSION} has no async tensor parallel switch: the plan's "
                         f"overlapped tensor-parallel collectives are not asked for")
    recipe = RECIPES[name].get(flavor, BASE_RECIPE[name])
    conv = doc["model"].get("converters", [])
    imports = ["from torchtitan.config import ParallelismConfig",
               "from torchtitan.distributed.activation_checkpoint import FullAC",
               "from torchtitan.models.common.config_utils import decoder_vocab_size",
               f"from torchtitan.models.{name} import config_registry, model_registry"]
    converters = ""
    if "float8" in conv:
        imports.append("from torchtitan.components.quantization import Float8LinearConverter")
        if doc["float8"]["recipe_name"] != "rowwise":
            notes.append(f"torchtitan {VERSION}'s float8 converter scales rowwise only: the "
                         f"plan's per-tensor FP8 written as rowwise")
        converters = ", converters=[Float8LinearConverter.Config(recipe_name=\"rowwise\")]"
    elif "mx" in conv:
        imports.append("from torchtitan.components.quantization import MXFP8LinearConverter")
        converters = ", converters=[MXFP8LinearConverter.Config()]"
    training = doc["training"]
    ac = "FullAC.Config()" if v.recompute else "None"
    cuda_graphs_off = v.pipeline > 1 or v.layout.expert > 1
    launch = _launch(v, f"--module {stem} --config mpmd_plan")
    lines = [
        f'"""torchtitan {VERSION} config for {v.model.name}{" " + v.name if v.name else ""} on '
        f'{v.devices} x {v.device}, exported by mpmd from {source}.',
        "",
        f"Launch from the directory holding this file: PYTHONPATH=. {launch}",
        '"""',
        "",
        *imports,
        "",
        "TORCHTITAN_VERSION = " + repr(VERSION),
        "",
        "",
        "def mpmd_plan():",
        f"    config = config_registry.{recipe}()   # torchtitan's recipe: optimizer, data, "
        f"checkpoints",
        f"    config.model_spec = model_registry({flavor!r}{converters})",
        *rope,
        "    config.loss.loss_fn.global_vocab_size = decoder_vocab_size(config.model_spec)",
        "    # the recipe's training settings (steps, dtype, ...) kept; the plan's batch and sequence",
        f"    config.training.local_batch_size = {training['local_batch_size']}",
        f"    config.training.global_batch_size = {training['global_batch_size']}",
        f"    config.training.seq_len = {training['seq_len']}",
        f"    config.training.mixed_precision_param = {training['mixed_precision_param']!r}",
        *([f"    config.training.mixed_precision_reduce = {training['mixed_precision_reduce']!r}"]
          if "mixed_precision_reduce" in training else []),
        *(["    # torchtitan's trainer refuses CUDA graphs with pipeline parallel and with its "
           "all-to-all expert dispatch",
           "    config.training.disable_cuda_graphs = True"] if cuda_graphs_off else []),
        "    config.parallelism = ParallelismConfig(",
        *[f"        {k}={x!r}," for k, x in par.items()],
        "    )",
        f"    config.activation_checkpoint = {ac}",
        "    return config",
        ""]
    return "\n".join(lines), notes


def render_module(v: PartView, source: str, stem: str = "plan") -> tuple[str, list[str]]:
    """(the torchtitan 0.3 config module, notes); ``stem`` is the module name it is launched
    as (the file's name without ``.py``)."""
    return module(v, source, stem)


def render(v: PartView, source: str) -> tuple[str, list[str]]:
    """(the torchtitan 0.2 job TOML text, notes)."""
    doc, notes = job(v, source)
    launch = _launch(v, "--job.config_file THIS_FILE")
    head = (f"# torchtitan {TOML_VERSION} job config (the last release that reads TOML job files)"
            f"\n# launch: {launch}\n")
    return head + tomli_w.dumps(doc), notes
