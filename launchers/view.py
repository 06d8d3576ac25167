"""A plan as a launcher sees it: one pipeline with one set of degrees.

Megatron-LM, torchtitan and MaxText each describe a training job as a handful of degrees (data,
context, tensor, pipeline, virtual stages), a micro batch, a schedule name and an
activation-checkpointing mode, the same for every stage. An ``mpmd`` plan is richer: every stage
mesh has its own layout, device kind and recomputation, and a :class:`~ir.DataParallelPlan` runs
several such pipelines.
:func:`part_views` reads a plan into one :class:`PartView` per pipeline and lists, as one line
each, whatever a single set of degrees cannot say (:attr:`PartView.notes`); the exporters
(:mod:`launchers.megatron`, :mod:`launchers.torchtitan`, :mod:`launchers.maxtext`) add what their
own target lacks.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from ir import DataParallelPlan, Layout, Plan, layout_problem, layouts_problem
from zoo.config import ModelConfig, ZooError, shard_dims
from zoo.model_files import plan_model
from zoo.models import layer_names


class LauncherError(Exception):
    """A plan no launcher file can be written for (one line naming the value and the fix)."""


@dataclass(frozen=True, slots=True)
class PartView:
    """One pipeline of a plan with the degrees a launcher takes.

    Attributes:
        name: ``""`` for a one-pipeline plan, else ``"part{i}"`` (a data-parallel plan's parts).
        model: the zoo model the plan was made for.
        device: the device kind of the pipeline's first mesh.
        devices: devices the written degrees describe (``data x context x tensor x pipeline``; a
            note says when the plan's stage meshes hold another total).
        layout: the data x context x tensor layout written (the most common one of the stage
            meshes; a note names every mesh whose layout, context degree included, differs).
        pipeline: pipeline ranks (P).
        virtual: stages per rank (V: interleaved and V-shaped schedules).
        schedule: the plan's schedule name (``simulator.schedules.KINDS``).
        microbatches: microbatches per step (M).
        micro_batch: samples in one microbatch of one data-parallel replica (the context ranks
            of a replica share its samples, each holding ``seq_len / context`` of their tokens).
        global_batch: samples per step of this pipeline; seq_len: tokens per sample.
        recompute: full activation recomputation (on any stage mesh).
        stage_layers: per stage, in stage order, the model's layer names it runs (``embed``,
            ``block{i}``, ``head``; :func:`zoo.models.layer_names`).
        stage_rank: per stage, the pipeline rank that runs it.
        nodes_per_mesh: scale-up domains (nodes, slices) one stage mesh's data axis spans.
        meshes_per_node: stage meshes that share one node.
        notes: what the plan has that this one set of degrees cannot say, one line each.
        precision: the plan's training precision recipe (``ir.precision.PRECISIONS``).
        cross_entropy: how the plan costed the loss (``ir.workload.CROSS_ENTROPY``).
        kinds: every device kind the part's stage meshes run on, in stage order.
    """

    name: str
    model: ModelConfig
    device: str
    devices: int
    layout: Layout
    pipeline: int
    virtual: int
    schedule: str
    microbatches: int
    micro_batch: int
    global_batch: int
    seq_len: int
    recompute: bool
    stage_layers: tuple[tuple[str, ...], ...]
    stage_rank: tuple[int, ...]
    nodes_per_mesh: int
    meshes_per_node: int
    notes: tuple[str, ...]
    precision: str = "bf16"
    cross_entropy: str = "fused"
    kinds: tuple[str, ...] = ()

    @property
    def data(self) -> int:
        """Data-parallel replicas of the pipeline: ``devices / (context x tensor x pipeline)``, the
        data-parallel size Megatron-LM derives (``world / (tp x pp x cp)``) and the degree the
        global batch is split over (the context ranks split each sample's sequence instead)."""
        return self.layout.data

    @property
    def context(self) -> int:
        """Context-parallel degree of the written layout (1: none)."""
        return self.layout.context

    def decoder_layers(self, stage: int) -> int:
        """Transformer blocks of ``stage``."""
        return sum(1 for n in self.stage_layers[stage] if n.startswith("block"))


GPU_KINDS = ("a100", "b200", "gb200", "gb300", "h100", "h200", "h800", "l40s", "v100")
"""Device profile name prefixes (``hardware_profiles/devices``) of NVIDIA GPUs: what Megatron-LM
and torchtitan run (CUDA); MaxText runs them and TPUs (:data:`TPU_KINDS`)."""

TPU_KINDS = ("tpu",)


def refuse_device(v: PartView, target: str, runs: tuple[str, ...]) -> None:
    """Raise when a stage mesh of ``v`` is on a device kind ``target`` cannot run.

    Raises:
        LauncherError: one line naming the kind, the part and the kinds ``target`` runs.
    """
    bad = [k for k in v.kinds if not k.lower().startswith(runs)]
    if bad:
        where = f"{v.name} runs" if v.name else "the plan runs"
        raise LauncherError(f"{where} on {', '.join(bad)}, which {target} cannot run (it runs "
                            f"{', '.join(runs)} devices); export that part to a launcher for "
                            f"{bad[0]} or re-plan without it")


def _model(plan: Plan) -> ModelConfig:
    if plan.model_config:
        cfg = plan_model(plan.model, plan.model_config)   # ZooError: the carried model is invalid
    else:
        try:
            cfg = plan_model(plan.model)
        except ZooError as e:
            raise LauncherError(f"plan model {plan.model!r} is not a zoo model ({e}); export a "
                                f"plan made with mpmd plan --model NAME") from None
    if cfg.family not in ("llama", "gpt") or not cfg.training:
        raise LauncherError(f"model {cfg.name!r} ({cfg.family}) is not a decoder language model "
                            f"trained by the launchers; export supports the zoo's gpt and llama "
                            f"models")
    return cfg


def _sequence_problem(plan: Plan, layouts: dict[str, Layout]) -> str | None:
    """The first context-parallel mesh whose split of the sequence does not divide the plan's
    ``seq_len`` (:func:`ir.shards.layout_problem` with ``seq_len``: 2 x context chunks for the
    causal zig-zag split of ring and all-gather, context chunks for all-to-all), as one line."""
    for mesh, lay in layouts.items():
        if lay.context > 1:
            why = layout_problem(None, 1, context=lay.context, context_method=lay.context_method,
                                 seq_len=plan.seq_len)
            if why:
                return (f"mesh {mesh}'s layout cannot run: {why}; fix: re-plan with another "
                        f"--seq-len or edit its context degree")
    return None


def part_view(plan: Plan, name: str = "") -> PartView:
    """The launcher view of one pipeline plan (see the module docstring).

    Raises:
        LauncherError: the plan's model is not a zoo decoder language model, its stages do not
            cover the model's layers, or a mesh's layout cannot run it
            (:func:`ir.shards.layout_problem`; a context-parallel layout's split of the sequence
            must also divide the plan's ``seq_len``).
    """
    cfg = _model(plan)
    names = layer_names(cfg)
    if plan.stages[-1].last != len(names) or plan.stages[0].first != 0:
        raise LauncherError(f"plan stages cover layers [{plan.stages[0].first}, "
                            f"{plan.stages[-1].last}) but {cfg.name} has {len(names)}; "
                            f"regenerate the plan")
    meshes = list(plan.rank_mesh)
    notes: list[str] = []
    layouts = [plan.layouts[m] for m in meshes]
    bad = layouts_problem(shard_dims(cfg), dict(zip(meshes, layouts))) or _sequence_problem(
        plan, dict(zip(meshes, layouts)))
    if bad:
        raise LauncherError(bad)
    layout = Counter(layouts).most_common(1)[0][0]
    for lay in dict.fromkeys(layouts):
        if lay != layout:
            odd = [m for m, x in zip(meshes, layouts) if x == lay]
            notes.append(f"mesh{'es' if len(odd) > 1 else ''} {', '.join(odd)} run{'' if len(odd) > 1 else 's'} "
                         f"{lay}, the others {layout}: one layout per pipeline is written ({layout})")
    kinds = [plan.devices[m][0] if m in plan.devices else "" for m in meshes]
    if len(set(kinds)) > 1:
        notes.append(f"the stages run on {len(set(kinds))} device kinds ({', '.join(dict.fromkeys(kinds))}): "
                     f"a launcher starts one kind per job; launch each kind's ranks with this "
                     f"file and its own device settings")
    sizes = [plan.devices[m][1] if m in plan.devices else plan.layouts[m].devices
             for m in meshes]
    devices = layout.devices * len(meshes)
    if sum(sizes) != devices:
        notes.append(f"the stage meshes hold {', '.join(map(str, sizes))} devices: written for "
                     f"{len(meshes)} meshes of {layout.devices} ({devices} devices)")
    rc = [bool(plan.recompute.get(m, False)) for m in meshes]
    if len(set(rc)) > 1:
        notes.append(f"only meshes {', '.join(m for m, r in zip(meshes, rc) if r)} recompute "
                     f"activations: written as full recomputation on every stage")
    t = plan.schedule
    m_count = t.microbatches
    per_micro = plan.global_batch / (m_count * layout.data)
    if per_micro != int(per_micro) or per_micro < 1:
        notes.append(f"a microbatch of {plan.global_batch // m_count} samples does not split over "
                     f"{layout.data} data-parallel replicas: micro batch written as "
                     f"{max(1, int(per_micro))}")
    shapes = list(plan.carving)
    nodes = {plan.replicas.get(m, 1) for m, lay in zip(meshes, layouts) if lay == layout}
    per_node = {int(s.get("meshes_per_node", 1)) for s in shapes} or {1}
    stage_layers = tuple(tuple(names[s.first:s.last]) for s in plan.stages)
    return PartView(name=name, model=cfg, device=kinds[0], devices=devices, layout=layout,
                    pipeline=t.num_ranks, virtual=t.num_stages // t.num_ranks, schedule=t.name,
                    microbatches=m_count, micro_batch=max(1, int(per_micro)),
                    global_batch=plan.global_batch, seq_len=plan.seq_len, recompute=any(rc),
                    stage_layers=stage_layers, stage_rank=tuple(t.stage_rank),
                    nodes_per_mesh=max(nodes), meshes_per_node=max(per_node), notes=tuple(notes),
                    precision=plan.precision, cross_entropy=plan.cross_entropy, kinds=tuple(dict.fromkeys(k for k in kinds if k)))


def part_views(plan: Plan | DataParallelPlan) -> tuple[PartView, ...]:
    """One :class:`PartView` per pipeline: the plan itself, or each part of a data-parallel plan
    (named ``part0``, ``part1``, ...; their cross-part gradient all-reduce is a note, since no
    launcher joins two jobs' gradients).

    Raises:
        LauncherError: see :func:`part_view`.
    """
    if isinstance(plan, Plan):
        return (part_view(plan),)
    out = []
    for i, p in enumerate(plan.parts):
        v = part_view(p, f"part{i}")
        sync = (f"the parts' gradient all-reduce over {plan.sync_link or 'the link between them'} "
                f"joins {len(plan.parts)} jobs: no launcher flag does that; run the parts in one "
                f"job with a process group across them")
        out.append(replace(v, notes=v.notes + (sync,)))
    return tuple(out)
