"""The practitioner's hand configuration of one node group, evaluated by the same cost model.

Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (SC'21), sec. 3.3 and 5: tensor parallel across the GPUs of one node (8), the
shortest pipeline whose stages fit memory, data parallel over the remaining nodes, a small
microbatch (1 or 2 samples per pipeline replica) with as many microbatches per pipeline as the
batch gives, 1F1B or the interleaved schedule, layers split evenly, activation recomputation only
when the stages do not fit without it. :func:`megatron_plans` builds each such plan over a carved
node group and :func:`best_megatron` returns the fastest that fits: the bar the planner must clear.

:func:`hand_plan` builds one practitioner's layout as published (:class:`HandLayout`: tensor,
pipeline and data degrees, virtual stages, micro-batch size, recomputation, distributed
optimizer) through the same code path, e.g. :data:`MEGATRON_GPT3_175B`; :func:`hand_pipeline`
a published pipeline through several node groups (:class:`HandPipeline`, e.g. a peer planner's
plan: :data:`SAILOR_OPT_350M`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from ir import Layout, Plan, Prediction, Workload
from hardware_profiles.carve import GroupShape, carve
from hardware_profiles.types import Cluster, ProfileError
from planner import construct
from planner.errors import PlannerError
from planner.predict import predict
from planner.search import Assignment
from simulator import cost_model as cm
from simulator.cost_model import fastest_rate

MICROBATCH_SIZES = (1, 2)
"""Samples per microbatch per pipeline replica (Narayanan et al. use 1 and 2, Table 1 and sec. 5.5)."""
SCHEDULES = ("1f1b", "interleaved-1f1b")


@dataclass(frozen=True, slots=True)
class HandResult:
    plan: Plan
    prediction: Prediction
    label: str


def _even(blocks: int, ranks: int) -> tuple[int, ...]:
    base, extra = divmod(blocks, ranks)
    return tuple(base + (1 if r < extra else 0) for r in range(ranks))


def _evaluate(w: Workload, lc: Cluster, shape: GroupShape, layout: Layout, blocks: tuple[int, ...],
              recompute: bool, schedule: str, microbatches: int, virtual_stages: int,
              headroom: float, label: str) -> HandResult:
    """The hand plan over every mesh of ``lc`` (the group carved by ``shape``), in order, each with
    ``layout`` and ``blocks[rank]`` blocks per stage, predicted exactly (the planner's replay)."""
    meshes = tuple(lc.meshes)
    a = Assignment(order=meshes, blocks=blocks, layouts=(layout,) * len(meshes),
                   recompute=(recompute,) * len(meshes), merge=False, status="HAND", objective_s=0.0,
                   bound_s=0.0, wall_s=0.0)
    plan = construct.build_plan(w, lc, a, schedule, microbatches, virtual_stages)
    pred = predict(plan, w, lc, headroom=headroom)
    return HandResult(replace(plan, carving=(shape.to_json(),), predicted=pred), pred, label)


def megatron_plans(w: Workload, cluster: Cluster, group: str, headroom: float = 0.1,
                   virtual_stages: int = 2) -> list[HandResult]:
    """Every hand configuration of ``group`` at the shortest pipeline depth where one fits memory
    (each predicted exactly); empty when none fits."""
    g = cluster.groups[group]
    pre, nb, post = construct.split_layers(w)
    for p in [d for d in range(1, g.nodes + 1) if g.nodes % d == 0 and d <= nb]:
        r = g.nodes // p
        shape = GroupShape(group, g.nodes, r, 1)
        lc = carve(cluster, [shape])
        out = []
        for b in MICROBATCH_SIZES:
            if w.global_batch % (r * b):
                continue
            m = w.global_batch // (r * b)
            for sched in SCHEDULES:
                v = virtual_stages if sched == "interleaved-1f1b" else 1
                if not construct.schedule_allowed(sched, p, m, nb, v) or (v > 1 and p == 1):
                    continue
                blocks = _even(nb // v, p) if nb % v == 0 else None
                if blocks is None or min(blocks) < 1:
                    continue
                fit = None
                for rc in (False, True):
                    tpo = g.devices_per_node > 1 and cm.overlaps_tensor_parallel(g.device)
                    h = _evaluate(w, lc, shape, Layout(r, g.devices_per_node, tp_overlap=tpo),
                                  blocks, rc, sched, m, v,
                                  headroom, f"tp{g.devices_per_node} pp{p} dp{r} mb{b} {sched}"
                                  + (" recompute" if rc else ""))
                    if h.prediction.fits:
                        fit = h
                        break
                if fit is not None:
                    out.append(fit)
        if out:
            return out
    return []


def best_megatron(w: Workload, cluster: Cluster, group: str, headroom: float = 0.1) -> HandResult | None:
    """The fastest of :func:`megatron_plans`, or None when no hand configuration fits."""
    plans = megatron_plans(w, cluster, group, headroom)
    return min(plans, key=lambda h: h.prediction.step_time_s) if plans else None


# --------------------------------------------------------------------------- published layouts
RECOMPUTE = ("none", "selective", "full")
"""Activation recomputation as Megatron-LM names it: none, ``--recompute-granularity selective``
(Korthikanti et al. 2022: only the attention's softmax/dropout inputs) or full (every layer's
forward rerun in the backward, only its input kept)."""


@dataclass(frozen=True, slots=True)
class HandLayout:
    """A practitioner's layout of one node group, as a paper or a launch script gives it.

    Attributes:
        tensor: tensor-parallel degree ``t`` (inside a node: Megatron-LM's ``--tensor-model-parallel-size``).
        pipeline: pipeline-parallel degree ``p`` (pipeline ranks).
        data: data-parallel degree ``d`` (pipeline replicas); ``t x p x d`` devices in all.
        virtual_stages: model chunks per pipeline rank ``v``; 1 runs 1F1B, more the interleaved
            1F1B schedule (Narayanan et al. SC'21 sec. 2.2.2).
        micro_batch: samples per microbatch per pipeline replica (``--micro-batch-size``); the
            global batch gives ``global_batch / (d x micro_batch)`` microbatches.
        recompute: one of :data:`RECOMPUTE`.
        distributed_optimizer: optimizer state sharded over data parallel (Megatron-LM's
            ``--use-distributed-optimizer``, ZeRO-1), gradients reduce-scattered and weights
            all-gathered; the cost model models only this (the bytes a plain all-reduce moves are
            the same: a ring all-reduce is a reduce-scatter then an all-gather).
        fsdp: the data axis shards parameters too (ZeRO-3: torchtitan's FSDP x TP, PyTorch FSDP2),
            gathering each layer's parameters before use (``Layout.fsdp``).
        expert: expert-parallel degree (``Layout.expert``: a mixture of experts' experts split over
            that many devices; Megatron-LM's ``--expert-model-parallel-size``).
        expert_tensor: the experts' own tensor degree (``Layout.expert_tensor``; 0: ``tensor``;
            Megatron-Core's ``--expert-tensor-parallel-size``, MoE parallel folding).
        expert_dispatch: how the tokens reach their experts (``Layout.expert_dispatch``:
            ``"alltoall"``, ``"deepep"`` two hops, ``"tokendrop"``).
        pipeline_schedule: a named schedule instead of 1F1B / interleaved 1F1B (e.g.
            ``"dualpipe-v"`` with ``virtual_stages=2``, the V of DeepSeek-V3's DualPipe); "" (the
            default) derives it from ``virtual_stages``.
        tp_overlap: the tensor-parallel collectives beside the GEMMs (``Layout.tp_overlap``);
            None (the default): as the device's stack runs them
            (:func:`simulator.cost_model.overlaps_tensor_parallel`, what the planner's own
            layouts get), so a practitioner's layout and the plan are costed alike.
        optimizer_state: how Adam keeps its state (``Layout.optimizer_state``; the grid takes
            the planner's ``PlanOptions.optimizer_state``, so both sides are costed alike).
    """

    tensor: int
    pipeline: int
    data: int
    virtual_stages: int = 1
    micro_batch: int = 1
    recompute: str = "none"
    distributed_optimizer: bool = True
    fsdp: bool = False
    expert: int = 1
    pipeline_schedule: str = ""
    expert_tensor: int = 0
    expert_dispatch: str = "alltoall"
    tp_overlap: bool | None = None
    optimizer_state: str = "fp32"

    @property
    def devices(self) -> int:
        return self.tensor * self.pipeline * self.data

    @property
    def schedule(self) -> str:
        if self.pipeline_schedule:
            return self.pipeline_schedule
        return "interleaved-1f1b" if self.virtual_stages > 1 else "1f1b"

    @property
    def label(self) -> str:
        """E.g. ``"tp8 pp8 dp16 mb1 interleaved-1f1b v2 full recompute"``."""
        return (f"tp{self.tensor} pp{self.pipeline} dp{self.data} mb{self.micro_batch} {self.schedule}"
                + (f" v{self.virtual_stages}" if self.virtual_stages > 1 else "")
                + (" fsdp" if self.fsdp else "")
                + (f" ep{self.expert}" if self.expert > 1 else "")
                + (f" etp{self.expert_tensor}" if self.expert > 1 and self.expert_tensor
                   not in (0, self.tensor) else "")
                + (f" {self.expert_dispatch}" if self.expert > 1
                   and self.expert_dispatch != "alltoall" else "")
                + (f" {self.recompute} recompute" if self.recompute != "none" else ""))


MEGATRON_GPT3_175B = HandLayout(tensor=8, pipeline=8, data=16, virtual_stages=2, micro_batch=1,
                                recompute="full", distributed_optimizer=True, tp_overlap=False)
"""Megatron-LM's GPT-3 175B layout on 1,024 A100 (128 DGX A100 nodes), global batch 1536.

Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", SC'21, sec. 5.1: "On n = 1024 A100 GPUs using batch size 1536, we achieve X = 140
teraFLOP/s per GPU" (34 days for 300B tokens). The paper does not print that run's layout; this
is the paper's own recipe applied to it: tensor parallel 8 = one DGX A100 node (sec. 5.4.1: "peak
performance when the tensor-parallel size is equal to the number of GPUs in a single node"),
pipeline parallel 8 as its nearest Table 1 row (145.6B, 80 layers: t = 8, p = 8, 1536 GPUs,
148 TFLOP/s), data parallel 16 = 1024 / 64, micro-batch 1 (Table 2's PTD-P rows for the 174.6B
model at batch 1536: micro-batch 1, 153 / 149 / 141 TFLOP/s on 384 / 768 / 1536 GPUs with
model-parallel size 96, which 1024 does not divide), the interleaved schedule with 2 chunks per
rank (sec. 2.2.2; the paper does not give ``v`` for this run) and full activation recomputation
(its FLOP count, eq. (3), "assumes activation recomputation"). 140 TFLOP/s by eq. (3), which
counts the recomputed forward, is about 105 TFLOP/s of model FLOP: 33.7% MFU of the A100's
312 TFLOP/s. The run predates Megatron-LM's distributed optimizer; the cost model shards the
optimizer state as it does (see :class:`HandLayout`). It also predates Transformer Engine's
tensor-parallel overlap (2023), so its all-reduces sit on the critical path (``tp_overlap``
False)."""


def hand_plan(w: Workload, cluster: Cluster, layout: HandLayout, group: str | None = None,
              headroom: float = 0.1) -> HandResult:
    """``layout`` on node group ``group`` of ``cluster`` (the only group when None): the group
    carved into ``layout.pipeline`` stage meshes of ``t x d`` devices (a mesh of ``R`` whole nodes
    when ``t x d`` fills ``R`` nodes, else ``s`` slices per node), blocks split evenly over the
    ``p x v`` stages, every mesh ``Layout(d, t)``, predicted exactly as the planner predicts its
    own plans (:func:`planner.predict.predict`; the plan records its ``carving`` and prediction).

    Raises:
        PlannerError: a cluster without node groups, an unknown group, a layout the group's nodes
            or the global batch do not divide, a schedule that does not accept the sizes,
            selective recomputation or no distributed optimizer (not in the cost model).
    """
    t, p, d, v, b = layout.tensor, layout.pipeline, layout.data, layout.virtual_stages, layout.micro_batch
    if min(t, p, d, v, b) < 1:
        raise PlannerError(f"hand layout {layout.label!r} has a degree below 1; fix: use positive "
                           f"tensor, pipeline, data, virtual_stages and micro_batch")
    if layout.recompute not in RECOMPUTE:
        raise PlannerError(f"hand layout recompute={layout.recompute!r}; fix: use one of {list(RECOMPUTE)}")
    if layout.recompute == "selective":
        raise PlannerError("hand layout recompute='selective' is not in the cost model (it recomputes "
                           "whole layers or nothing); fix: use 'full' (an upper bound on its time) or "
                           "'none' (a lower bound)")
    if not layout.distributed_optimizer:
        raise PlannerError("hand layout distributed_optimizer=False is not in the cost model (it shards "
                           "optimizer state over data parallel, as Megatron-LM's distributed optimizer "
                           "does); fix: use distributed_optimizer=True")
    if not cluster.groups:
        raise PlannerError(f"cluster {cluster.name!r} lists meshes, not node groups; fix: describe its "
                           f"hardware under 'node_groups'")
    if group is None:
        if len(cluster.groups) > 1:
            raise PlannerError(f"cluster {cluster.name!r} has node groups {sorted(cluster.groups)}; fix: "
                               f"name the group the hand layout runs on")
        group = next(iter(cluster.groups))
    g = cluster.groups.get(group)
    if g is None:
        raise PlannerError(f"cluster {cluster.name!r} has no node group {group!r}; fix: use one of "
                           f"{sorted(cluster.groups)}")
    k, per_mesh = g.devices_per_node, t * d
    if per_mesh >= k:
        if per_mesh % k or k % t:
            raise PlannerError(f"hand layout {layout.label!r}: a stage of tp{t} x dp{d} = {per_mesh} devices "
                               f"is not whole nodes of {k} with tensor parallel inside a node; fix: make "
                               f"t x d a multiple of {k} and t a divisor of {k}")
        shape_r, shape_s = per_mesh // k, 1
    else:
        if k % per_mesh or p % (k // per_mesh):
            raise PlannerError(f"hand layout {layout.label!r}: stages of tp{t} x dp{d} = {per_mesh} devices "
                               f"do not tile nodes of {k} devices over pipeline {p}; fix: make t x d "
                               f"divide {k} and the stages per node divide p")
        shape_r, shape_s = 1, k // per_mesh
    nodes = shape_r * p // shape_s
    if nodes > g.nodes:
        raise PlannerError(f"hand layout {layout.label!r} needs {layout.devices} devices ({nodes} nodes) but "
                           f"node group {group!r} has {g.nodes} nodes of {k}; fix: lower a degree")
    if w.global_batch % (d * b):
        raise PlannerError(f"hand layout {layout.label!r}: global batch {w.global_batch} is not a multiple "
                           f"of dp{d} x mb{b}; fix: pick a batch or micro-batch that divides")
    m = w.global_batch // (d * b)
    _, nb, _ = construct.split_layers(w)
    if not construct.schedule_allowed(layout.schedule, p, m, nb, v if v > 1 else 2) or (v > 1 and p == 1):
        raise PlannerError(f"hand layout {layout.label!r}: schedule {layout.schedule} does not accept {p} "
                           f"ranks x {v} chunks over {nb} blocks with {m} microbatches; fix: make the "
                           f"blocks a multiple of p x v and (interleaved) the microbatches a multiple of p")
    shape = GroupShape(group, nodes, shape_r, shape_s)
    return _evaluate(w, carve(cluster, [shape]), shape,
                     Layout(d, t, fsdp=layout.fsdp and d > 1, expert=layout.expert,
                            expert_tensor=layout.expert_tensor,
                            expert_dispatch=layout.expert_dispatch,
                            tp_overlap=t > 1 and (layout.tp_overlap
                                                  if layout.tp_overlap is not None
                                                  else cm.overlaps_tensor_parallel(g.device)),
                            optimizer_state=layout.optimizer_state),
                     _even(nb // v, p),
                     layout.recompute == "full", layout.schedule, m, v, headroom, layout.label)


# --------------------------------------------------------------------------- mixed pipelines
@dataclass(frozen=True, slots=True)
class HandPipeline:
    """A published pipeline through several node groups, stage by stage (a peer planner's plan).

    Attributes:
        shapes: how each node group used is carved (:class:`GroupShape`; its ``nodes_per_mesh``
            is the pipeline replicas, the data axis of every mesh of the group).
        orders: pipeline orders of the carved meshes (``"{group}.{j}"``) to replay; the fastest
            is kept (a source that names the stages but not their exact order gives several).
        tensor: tensor-parallel degree per node group; the rest of each mesh is its data axis.
        schedule: the schedule (a name of :mod:`simulator.schedules`).
        microbatches: microbatch counts tried (the fastest is kept).
        label / source: what it is and where it is published.
    """

    shapes: tuple[GroupShape, ...]
    orders: tuple[tuple[str, ...], ...]
    tensor: tuple[tuple[str, int], ...]
    schedule: str
    microbatches: tuple[int, ...]
    label: str
    source: str


SAILOR_OPT_350M = HandPipeline(
    shapes=(GroupShape("a100", 20, 20, 4), GroupShape("v100", 60, 20, 1)),
    orders=(("v100.0", "a100.0", "a100.1", "a100.2", "a100.3", "v100.1", "v100.2"),
            ("v100.0", "v100.1", "a100.0", "a100.1", "a100.2", "a100.3", "v100.2")),
    tensor=(("a100", 1), ("v100", 4)),
    schedule="1f1b", microbatches=(16, 32),
    label="Sailor's plan: 7 stages, V100 tp4 stages around A100 tp1 stages, dp20, 1f1b",
    source=("Strati et al., 'Sailor: Automating Distributed Training over Dynamic, Heterogeneous, "
            "and Geo-distributed Clusters', SOSP 2025 (arXiv:2504.17096): OPT-350M, global batch "
            "1024, sequence 2048, on 80 A100-40GB + 240 V100-16GB in one Google Cloud zone; its "
            "plan as the project's issue 23 describes it: 7 stages (four A100 stages of one GPU, "
            "three V100 stages of four GPUs, the V100 stages at both ends), data parallel 20, on "
            "Megatron-DeepSpeed (1F1B). The split of V100 stages between the ends and the layers "
            "per stage are not given: both splits are replayed and the layers balanced (below)"))
"""Sailor's plan for its 320-GPU heterogeneous case (bundled as ``a100x80_v100x240_nodes``)."""


def hand_pipeline(w: Workload, cluster: Cluster, hp: HandPipeline, headroom: float = 0.1) -> HandResult:
    """``hp`` replayed in the planner's model: its meshes carved, each ``Layout(data, tensor)``;
    the layers per stage are balanced as a practitioner balances them by profiling (blocks in
    proportion to each stage's achievable FLOP/s, then one block at a time moved between two
    stages while the predicted step improves and the plan fits memory), for every order and
    microbatch count of ``hp``; the fastest that fits.

    Raises:
        PlannerError: a shape that does not fit the cluster, an order naming a mesh the carving
            lacks or using one twice, a tensor degree that does not divide a mesh, or no
            configuration that fits memory.
    """
    try:
        lc = carve(cluster, hp.shapes)
    except ProfileError as e:
        raise PlannerError(f"hand pipeline {hp.label!r}: {e}") from None
    tensor = dict(hp.tensor)
    layouts = {}
    m: str | int                       # a mesh name here, a microbatch count below
    for m, spec in lc.meshes.items():
        t = tensor.get(m.split(".")[0], 1)
        if spec.num_devices % t:
            raise PlannerError(f"hand pipeline {hp.label!r}: tensor {t} does not divide mesh {m!r} of "
                               f"{spec.num_devices} devices; fix: use a divisor")
        layouts[m] = Layout(spec.num_devices // t, t,
                            tp_overlap=t > 1 and cm.overlaps_tensor_parallel(spec.device))
    _, nb, _ = construct.split_layers(w)
    best: HandResult | None = None
    for order in hp.orders:
        if len(set(order)) != len(order) or any(m not in lc.meshes for m in order):
            raise PlannerError(f"hand pipeline {hp.label!r}: order {list(order)} must name each of "
                               f"{sorted(lc.meshes)} at most once; fix: correct the order")
        if len(order) > nb:
            raise PlannerError(f"hand pipeline {hp.label!r}: {len(order)} stages for {nb} blocks; "
                               f"fix: use fewer stages")
        for m in hp.microbatches:
            got = _balanced(w, lc, hp, order, tuple(layouts[x] for x in order), m, nb, headroom)
            if got is not None and (best is None or got.prediction.step_time_s < best.prediction.step_time_s):
                best = got
    if best is None:
        raise PlannerError(f"hand pipeline {hp.label!r}: no order and microbatch count fits memory on "
                           f"cluster {cluster.name!r}")
    return best


def _balanced(w: Workload, lc: Cluster, hp: HandPipeline, order: tuple[str, ...],
              layouts: tuple[Layout, ...], microbatches: int, nb: int, headroom: float) -> HandResult | None:
    rate = [fastest_rate(lc.meshes[m].device, w) * lc.meshes[m].num_devices
            for m in order]
    blocks = [max(1, round(nb * r / sum(rate))) for r in rate]
    while sum(blocks) != nb:             # fix rounding on the stage with the most (or fewest) blocks
        i = blocks.index(max(blocks)) if sum(blocks) > nb else blocks.index(min(blocks))
        blocks[i] += 1 if sum(blocks) < nb else -1

    def run(b: tuple[int, ...]) -> HandResult:
        a = Assignment(order=order, blocks=b, layouts=layouts, recompute=(False,) * len(order),
                       merge=False, status="HAND", objective_s=0.0, bound_s=0.0, wall_s=0.0)
        plan = construct.build_plan(w, lc, a, hp.schedule, microbatches, 1)
        pred = predict(plan, w, lc, headroom=headroom)
        return HandResult(replace(plan, carving=tuple(s.to_json() for s in hp.shapes),
                                  predicted=pred), pred, hp.label)

    best = run(tuple(blocks))
    improved = True
    while improved:
        improved = False
        for i, j in itertools.permutations(range(len(order)), 2):
            b = list(blocks)
            if b[i] <= 1:
                continue
            b[i] -= 1
            b[j] += 1
            got = run(tuple(b))
            if got.prediction.fits and (not best.prediction.fits
                                        or got.prediction.step_time_s < best.prediction.step_time_s - 1e-9):
                best, blocks, improved = got, b, True
    return best if best.prediction.fits else None
