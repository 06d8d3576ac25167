"""A plan: the stage partition, stage-to-mesh assignment, per-mesh layouts, schedule and predictions
(:class:`Plan`), and heterogeneous data parallel over several pipelines (:class:`DataParallelPlan`)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from ir.errors import IRError
from ir.report import Prediction, SearchReport
from ir.schedule import FragmentRef, ScheduleTable


EXPERT_DISPATCH = ("alltoall", "deepep", "tokendrop")
"""How a mixture of experts' tokens reach their experts (:attr:`Layout.expert_dispatch`)."""

GRAD_REDUCE = ("fp32", "bf16")
"""The dtypes a data-parallel gradient reduction runs in (:attr:`Layout.grad_reduce`)."""

OPTIMIZER_STATES = ("fp32", "bf16-moments", "bf16")
"""How the Adam optimizer keeps its state (:attr:`Layout.optimizer_state`)."""

CONTEXT_METHODS = ("ring", "allgather", "alltoall")
"""How a context-parallel group's attention sees the keys and values of the whole sequence
(:attr:`Layout.context_method`)."""


@dataclass(frozen=True, slots=True)
class Layout:
    """A mesh's SPMD layout: data-parallel x context-parallel x tensor-parallel degrees (product =
    devices, :attr:`devices`; ranks ordered tensor innermost, then context, then data: Megatron-
    Core's ``tp-cp-ep-dp`` rank order).

    ``context``: context parallelism (Megatron-Core's ``--context-parallel-size``; Liu et al. 2023,
    "Ring Attention"; Jacobs et al. 2023, "DeepSpeed-Ulysses"; Llama 3 405B's long-context
    training, Dubey et al. 2024 sec. 3.3.2): every sample's sequence is split ``context`` ways,
    each device holding ``seq / context`` of its tokens (the causal zig-zag split: chunks ``i``
    and ``2c - 1 - i``, so every device does the same attention work). Every layer but the
    attention core is token-local; the attention reaches the other tokens' keys and values by
    ``context_method`` (:data:`CONTEXT_METHODS`): ``"ring"`` (point-to-point KV passes around the
    group, each overlapped with the attention block of the chunk already held: Megatron's
    ``--cp-comm-type p2p``, PyTorch / torchtitan's ``alltoall`` rotate method, which despite
    its name shifts K/V to the next rank), ``"allgather"`` (the K/V of
    the whole sequence all-gathered before the attention, the gradients reduce-scattered after:
    Llama 3's choice, Megatron's ``all_gather``) or ``"alltoall"`` (heads and sequence swapped by
    four all-to-alls, each device attending over the whole sequence for ``heads / context`` heads:
    DeepSpeed-Ulysses, Megatron's ``a2a``). The parameters are replicated over ``data x context``
    (:attr:`replicas`): gradients are reduced and the distributed optimizer's state sharded over
    both (Megatron-Core's data-parallel group with context parallel).

    ``fsdp``: the data axis also shards parameters, gradients and optimizer state (ZeRO stage 3 /
    fully sharded data parallel), gathering each layer's parameters before use.

    ``hsdp`` (with ``fsdp``): hybrid sharded data parallel (PyTorch FSDP ``HYBRID_SHARD``; MaxText's
    ``dcn_data_parallelism`` over ``ici_fsdp_parallelism``): the data axis is ``hsdp`` replicas
    of ``data / hsdp`` devices each; a replica shards parameters, gradients and optimizer state,
    and the replicas all-reduce their gradient shards (typically across TPU slices or nodes).

    ``expert``: expert parallelism (Lepikhin et al. 2021, "GShard"; Megatron-LM's
    ``--expert-model-parallel-size``): a mixture of experts' experts are split ``expert`` ways,
    each device holding ``experts / expert`` of them; a layer's tokens reach their experts by an
    all-to-all over those ``expert`` devices and come back by another (dispatch and combine).
    1: every replica holds every expert. With ``fsdp`` (Megatron-FSDP's ``optim_grads_params``
    sharding beside expert parallelism), the dense parameters are sharded over the data x
    context devices and each device's experts over their expert-data replicas, both gathered
    before use; not combined with ``hsdp``.

    ``expert_tensor``: expert tensor parallelism (Megatron-Core's ``--expert-tensor-parallel-size``,
    ETP): each expert's inner width is split this many ways. 0 (the default) means ``tensor``:
    the experts are tensor-split as the attention is and ``expert`` must divide ``data`` (the
    data axis is what the experts are split over). Any other value is Megatron-Core's MoE
    parallel folding (Liu et al. 2025, "MoE Parallel Folding", arXiv:2504.14960): the experts lay
    their own ``expert_tensor x expert x expert-data`` grid over the attention's ``data x tensor``
    devices (``expert x expert_tensor`` must divide ``data x tensor``), so an ``expert`` larger
    than ``data`` is allowed (EP 8 with TP 8 x DP 1 on one node, experts not tensor-split:
    ``expert_tensor`` 1); expert ranks are laid out ETP innermost, then EP (Megatron-Core's
    ``tp-ep-dp`` expert rank order), so the all-to-all group has stride ``expert_tensor``.

    ``expert_dispatch``: how a mixture of experts' tokens reach their experts
    (:data:`EXPERT_DISPATCH`): ``"alltoall"`` (one NCCL all-to-all of a copy per routed expert:
    Megatron-Core's ``--moe-token-dispatcher-type alltoall``) or ``"deepep"`` (two hops, each token
    once per remote node over RDMA then to its experts over NVLink: DeepEP / HybridEP, Megatron-
    Core's ``flex`` dispatcher; :func:`hardware_profiles.collectives.span_two_hop_all_to_all`),
    both dropless (each layer's per-expert counts are read back by the host to size its buffers:
    ``DeviceProfile.dropless_routing_pair``), or ``"tokendrop"`` (the ``alltoall`` dispatcher with a
    capacity factor, every expert's input padded to its capacity: Megatron-Core's
    ``--moe-expert-capacity-factor`` with ``--moe-pad-expert-input-to-capacity``; static shapes,
    no read-back; tokens over an expert's capacity are dropped, which changes training, so the
    planner never picks it: a plan or a validation row states it).

    ``tp_overlap``: the tensor-parallel collectives run beside the GEMMs that produce and consume
    them instead of between them (Megatron-LM / Transformer Engine ``--tp-comm-overlap`` with
    userbuffers, Wang et al., "Overlap Communication with Dependent Computation via Decomposition
    in Large Deep Learning Models", ASPLOS 2023; XLA's collective matmul on TPU), so a layer
    takes the longer of its compute and its tensor-parallel traffic, slowed by the interference
    of the two (:func:`simulator.cost_model.overlapped`). False: they sit on the critical path.

    ``grad_reduce``: the dtype of the gradient buffer that data parallel reduces (and FSDP
    reduce-scatters), :data:`GRAD_REDUCE`: ``"fp32"`` (Megatron-Core's default: fp32 main
    gradients, 4 bytes a parameter, Micikevicius et al. 2018) or ``"bf16"`` (2 bytes, reduced in
    the compute dtype: Megatron's ``--grad-reduce-in-bf16``, ``grad_reduce_in_fp32=False`` in every
    NVIDIA NeMo / Megatron-Bridge performance recipe; FSDP's ``reduce_dtype`` bfloat16); the
    optimizer's state is ``optimizer_state``'s.

    ``optimizer_state``: how Adam keeps the state it shards over data parallel,
    :data:`OPTIMIZER_STATES`: ``"fp32"`` (fp32 master weights and first and second moments, 12
    bytes a parameter: Micikevicius et al. 2018, the ZeRO paper's K = 12), ``"bf16-moments"``
    (fp32 master weights, bf16 moments: 8 bytes; Megatron-Core's precision-aware optimizer,
    ``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``, as
    DeepSeek-V3's Megatron-Bridge recipe sets it; DeepSeek-V3's report, sec. 3.3.3, tracks AdamW's
    moments in BF16 too) or ``"bf16"`` (no master copy: the bf16 weights are
    updated in place and the moments are bf16, 4 bytes; MaxText's ``weight_dtype: bfloat16``).
    With an fp32 compute dtype the weights are their own master copy under every setting.
    """

    data: int
    tensor: int
    fsdp: bool = False
    hsdp: int = 1
    tp_overlap: bool = False
    expert: int = 1
    expert_tensor: int = 0
    expert_dispatch: str = "alltoall"
    context: int = 1
    context_method: str = "ring"
    grad_reduce: str = "fp32"
    optimizer_state: str = "fp32"

    def __post_init__(self) -> None:
        if self.grad_reduce not in GRAD_REDUCE:
            raise ValueError(f"Layout(grad_reduce={self.grad_reduce!r}): unknown; fix: one of "
                             f"{', '.join(GRAD_REDUCE)}")
        if self.optimizer_state not in OPTIMIZER_STATES:
            raise ValueError(f"Layout(optimizer_state={self.optimizer_state!r}): unknown; fix: "
                             f"one of {', '.join(OPTIMIZER_STATES)}")
        if self.context < 1 or self.context_method not in CONTEXT_METHODS:
            raise ValueError(f"Layout(context={self.context}, context_method="
                             f"{self.context_method!r}): context must be >= 1 and the method one "
                             f"of {', '.join(CONTEXT_METHODS)}; fix context or context_method")
        if self.context == 1:
            object.__setattr__(self, "context_method", "ring")   # one spelling per layout
        if self.expert_dispatch not in EXPERT_DISPATCH:
            raise ValueError(f"Layout(expert_dispatch={self.expert_dispatch!r}): unknown; fix: one "
                             f"of {', '.join(EXPERT_DISPATCH)}")
        if self.expert == 1 and self.expert_dispatch == "deepep":
            object.__setattr__(self, "expert_dispatch", "alltoall")   # no all-to-all to split
        if self.hsdp < 1 or self.data % self.hsdp or (self.hsdp > 1 and not self.fsdp):
            raise ValueError(f"Layout(data={self.data}, hsdp={self.hsdp}, fsdp={self.fsdp}): hsdp "
                             f"must divide data and needs fsdp; use hsdp=1 or fsdp=True")
        if self.expert_tensor < 0:
            raise ValueError(f"Layout(expert_tensor={self.expert_tensor}): must be >= 0 (0: the "
                             f"tensor degree); fix expert_tensor")
        if self.expert_tensor == self.tensor or self.expert == 1:
            # one spelling per layout: equal layouts compare and hash equal
            object.__setattr__(self, "expert_tensor", 0)
        devices = self.devices
        if self.expert < 1 or devices % (self.expert * self.etp) or (self.expert > 1
                                                                      and self.hsdp > 1):
            raise ValueError(f"Layout(data={self.data}, context={self.context}, tensor="
                             f"{self.tensor}, expert={self.expert}, expert_tensor={self.etp}, "
                             f"hsdp={self.hsdp}): expert x expert_tensor must divide data x "
                             f"context x tensor = {devices} and expert parallel is not combined "
                             f"with hybrid sharding; use expert=1, a divisor, or hsdp=1")

    @property
    def devices(self) -> int:
        """Devices of the layout: ``data x context x tensor``."""
        return self.data * self.context * self.tensor

    @property
    def replicas(self) -> int:
        """Devices holding the same shard of a dense parameter (tensor parallel apart): ``data x
        context``, what its gradients are reduced and the distributed optimizer's state is sharded
        over (stride ``tensor``: the context ranks sit between the tensor and the data ranks)."""
        return self.data * self.context

    @property
    def etp(self) -> int:
        """Expert tensor-parallel degree: ``expert_tensor``, or ``tensor`` when it is 0."""
        return self.expert_tensor or self.tensor

    @property
    def folded(self) -> bool:
        """Whether the experts' grid differs from the attention's (``etp != tensor``: MoE
        parallel folding)."""
        return self.etp != self.tensor

    @property
    def expert_data(self) -> int:
        """Replicas of each expert shard (expert data parallel): ``data x context x tensor /
        (expert x etp)``; what an expert's gradients are reduced over."""
        return self.devices // (self.expert * self.etp)

    @property
    def shard(self) -> int:
        """Devices one parameter is sharded over: ``data x context / hsdp`` with fsdp (FSDP
        shards over the context ranks too, as torchtitan's ``dp_shard_cp`` mesh does), else 1."""
        return self.replicas // self.hsdp if self.fsdp else 1

    def __str__(self) -> str:
        return (f"dp{self.data}" + (f"xcp{self.context}" if self.context > 1 else "")
                + f"xtp{self.tensor}" + ("-fsdp" if self.fsdp else "")
                + (f"x{self.hsdp}" if self.hsdp > 1 else "")
                + (f"-ep{self.expert}" if self.expert > 1 else "")
                + (f"-etp{self.etp}" if self.folded and self.expert > 1 else "")
                + (f"-{self.expert_dispatch}" if self.expert_dispatch != "alltoall" else "")
                + ("-tpo" if self.tp_overlap and self.tensor > 1 else "")
                + ("-gbf16" if self.grad_reduce == "bf16" else "")
                + (f"-opt{self.optimizer_state}" if self.optimizer_state != "fp32" else "")
                + (f"-{self.context_method}" if self.context > 1 and self.context_method != "ring"
                   else ""))


@dataclass(frozen=True, slots=True)
class StagePlan:
    """Stage ``index`` runs layers ``[first, last)`` of the workload on mesh ``mesh``."""

    index: int
    first: int
    last: int
    mesh: str


@dataclass(frozen=True, slots=True)
class Plan:
    """A complete MPMD plan, as written to plan.json (see ``ir/plan.schema.json``).

    Attributes:
        model / cluster: what was planned, by name (and the cluster file's path).
        stages: contiguous layer ranges in pipeline order, each on a mesh.
        layouts: mesh name -> layout, for every mesh the plan uses.
        schedule: the schedule table; ``rank_mesh[r]`` is the mesh of pipeline rank r.
        rank_mesh: mesh of each pipeline rank.
        merge_last_stage: whether the last stage's F and B of a microbatch form one fragment.
        global_batch / seq_len: the workload's shape.
        predicted: the replayed step's metrics (:class:`~ir.report.Prediction`); None for a
            hand-written plan that states none.
        search: how the search found it (:class:`~ir.report.SearchReport`: the chosen
            candidate's solve, the proven bound and gap, why the search stopped).
    """

    model: str
    cluster: str
    stages: tuple[StagePlan, ...]
    layouts: Mapping[str, Layout]
    schedule: ScheduleTable
    rank_mesh: tuple[str, ...]
    merge_last_stage: bool
    global_batch: int
    seq_len: int
    predicted: Prediction | None = None
    search: SearchReport = SearchReport()
    cluster_path: str = ""
    devices: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    """mesh name -> (device profile id, number of devices), for readers without the cluster."""
    grad_sync: str = "step"
    """When data-parallel gradients are all-reduced: ``"step"`` (once, at the end of the step, as
    Megatron-LM and DDP bucketing do) or ``"microbatch"`` (inside every backward fragment, as a
    program whose backward returns replicated gradients for each microbatch does)."""
    recompute: Mapping[str, bool] = field(default_factory=dict)
    """mesh name -> whether its stages recompute activations in the backward (full activation
    checkpointing: a forward keeps only each layer's input; the backward reruns the forward)."""
    carving: tuple[Mapping[str, Any], ...] = ()
    """For a cluster described as node groups: how the planner cut each group into the plan's
    meshes, one ``{"group", "nodes", "nodes_per_mesh", "meshes_per_node"}`` per group used
    (``hardware_profiles.carve.GroupShape``); empty when the cluster file lists its meshes."""
    schedules: tuple[Mapping[str, Any], ...] = ()
    """The candidate table: every (schedule, microbatches) the search replayed for the chosen
    shape, ``{"schedule", "microbatches", "step_time_s" (None: did not fit)}``, best first."""
    model_config: Mapping[str, Any] = field(default_factory=dict)
    """The model's fields (``zoo.ModelConfig``) when it was read from a model file (a Hugging Face
    config.json or a YAML model spec), so readers need not find the file; empty for a zoo model,
    which ``model`` names."""
    precision: str = "bf16"
    """The training precision recipe the blocks' GEMMs run in (:data:`ir.precision.PRECISIONS`;
    ``Workload.precision``)."""
    cross_entropy: str = "fused"
    """How the loss is computed (:data:`ir.workload.CROSS_ENTROPY`; ``Workload.cross_entropy``):
    what it keeps of the logits and holds beside them, which the plan's memory counts."""

    @property
    def replicas(self) -> Mapping[str, int]:
        """Mesh name -> pipeline replicas it carries: the nodes its data axis spans (1 for meshes
        inside one node or a cluster file's meshes)."""
        out = {}
        for shape in self.carving:
            for j in range(shape["nodes"] // shape["nodes_per_mesh"] * shape["meshes_per_node"]):
                out[f"{shape['group']}.{j}"] = shape["nodes_per_mesh"]
        return {m: out.get(m, 1) for m in self.rank_mesh}

    @property
    def microbatches(self) -> int:
        return self.schedule.microbatches

    def mesh_order(self, mesh: str) -> tuple[FragmentRef, ...]:
        return self.schedule.order[self.rank_mesh.index(mesh)]


@dataclass(frozen=True, slots=True)
class DataParallelPlan:
    """Heterogeneous data parallelism: independent pipelines (``parts``, each a :class:`Plan` on
    its own meshes, typically one device kind each) that take uneven shares of the global batch
    (each part's ``global_batch``, in whole microbatches), with gradients all-reduced across the
    parts at the end of the step, before the optimizer (Metis, Um et al. ATC'24; HetHub).

    Attributes:
        parts: the pipelines; their batch shares sum to ``global_batch``.
        sync_link / sync_bytes / sync_s: the cross-part gradient all-reduce: the narrowest link
            between parts, the fp32 gradient bytes, and its seconds (ring over the parts).
        reason: why the planner chose this over one mixed pipeline or fewer kinds (one line).
        predicted / search: as :attr:`Plan.predicted` and :attr:`Plan.search`, for the whole
            step.
    """

    model: str
    cluster: str
    global_batch: int
    seq_len: int
    parts: tuple[Plan, ...]
    sync_link: str
    sync_bytes: float
    sync_s: float
    predicted: Prediction | None = None
    search: SearchReport = SearchReport()
    cluster_path: str = ""
    reason: str = ""
    model_config: Mapping[str, Any] = field(default_factory=dict)
    """As :attr:`Plan.model_config` (every part carries the same)."""
    precision: str = "bf16"
    """As :attr:`Plan.precision` (every part carries the same)."""
    cross_entropy: str = "fused"
    """As :attr:`Plan.cross_entropy` (every part carries the same)."""

    def __post_init__(self) -> None:
        if not self.parts:
            raise IRError("DataParallelPlan has no parts")
        total = sum(p.global_batch for p in self.parts)
        if total != self.global_batch:
            raise IRError(f"DataParallelPlan: batch shares {[p.global_batch for p in self.parts]} sum to "
                          f"{total}, not the global batch {self.global_batch}")
        meshes = [m for p in self.parts for m in p.rank_mesh]
        if len(set(meshes)) != len(meshes):
            raise IRError("DataParallelPlan: two parts share a mesh; each part needs its own meshes")

    @property
    def carving(self) -> tuple[Mapping[str, Any], ...]:
        return tuple(c for p in self.parts for c in p.carving)


def with_model_config(plan: "Plan | DataParallelPlan", fields: Mapping[str, Any]
                      ) -> "Plan | DataParallelPlan":
    """``plan`` (and every part of a data-parallel plan) carrying the model's ``fields``
    (:attr:`Plan.model_config`)."""
    fields = dict(fields)
    if isinstance(plan, DataParallelPlan):
        return replace(plan, model_config=fields,
                       parts=tuple(replace(p, model_config=fields) for p in plan.parts))
    return replace(plan, model_config=fields)
