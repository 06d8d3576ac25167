"""The plan-level IR: the lingua franca between planner, simulator, compiler and reports.

Frozen dataclasses only; no logic beyond validation and (de)serialization. Units are SI:
seconds, bytes, FLOP. Every other package speaks these types.

- :class:`LayerCost` / :class:`Workload`: what a model costs, traced from JAX (``compiler.costing``).
- :class:`FragmentRef` / :class:`ScheduleTable`: a pipeline schedule as data, per pipeline rank.
- :class:`Plan`: stage partition + stage-to-mesh assignment + layouts + schedule + predictions.
- :class:`TimelineEvent` / :class:`Timeline`: what ran where and when (simulated or measured).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

KINDS = ("F", "B", "W")
"""Fragment kinds in a schedule: forward, backward (input gradient only when the schedule splits the
backward, else the whole backward), and weight gradient (only in split-backward schedules)."""


class IRError(ValueError):
    """A value of the IR is malformed (the message names the field and the bad value)."""


# --------------------------------------------------------------------------- workload
@dataclass(frozen=True, slots=True)
class LayerCost:
    """The cost of one unique fragment body (a named computation), traced from XLA.

    All ``*_per_sample`` figures are per sequence (one sample of ``seq_len`` tokens) and scale
    linearly with the microbatch size; ``*_fixed`` figures do not depend on it (weights read once).

    Attributes:
        name: the named computation, e.g. ``"decoder_block"``.
        fwd_flops_per_sample: forward FLOP for one sample (XLA ``cost_analysis()['flops']``).
        bwd_flops_per_sample: whole backward (input + weight gradient) FLOP for one sample.
        bwd_input_flops_per_sample: the input-gradient part of the backward (B of zero-bubble);
            the weight-gradient part (W) is ``bwd_flops_per_sample - bwd_input_flops_per_sample``.
        fwd_bytes_fixed / fwd_bytes_per_sample: bytes accessed by the forward, split into the part
            independent of the batch (weights) and the per-sample part.
        bwd_bytes_fixed / bwd_bytes_per_sample: the same for the backward.
        param_count: parameters of this layer.
        param_bytes: bytes of those parameters in the compute dtype.
        activation_bytes_per_sample: bytes of the layer's output (what a stage boundary transfers).
        residual_bytes_per_sample: bytes the forward keeps for the backward, parameters excluded.
        tp_allreduce_bytes_per_sample: bytes all-reduced over the tensor-parallel axis per forward
            (Megatron layout; the backward all-reduces the same amount), 0 for no tensor parallel.
        fwd_other_bytes_per_sample / bwd_other_bytes_per_sample / bwd_input_other_bytes_per_sample:
            HBM bytes of the ops other than matmuls and the attention core (norms, activations,
            residual adds, loss), counted unfused (every op reads its operands and writes its
            result), in the forward, the whole backward and the input-gradient part B; the cost
            model charges a device-specific fraction of them as memory-bound time outside the
            roofline (see ``simulator.cost_model.layer_time``). 0 when not traced.
    """

    name: str
    fwd_flops_per_sample: float
    bwd_flops_per_sample: float
    bwd_input_flops_per_sample: float
    fwd_bytes_fixed: float
    fwd_bytes_per_sample: float
    bwd_bytes_fixed: float
    bwd_bytes_per_sample: float
    param_count: int
    param_bytes: float
    activation_bytes_per_sample: float
    residual_bytes_per_sample: float
    tp_allreduce_bytes_per_sample: float
    fwd_other_bytes_per_sample: float = 0.0
    bwd_other_bytes_per_sample: float = 0.0
    bwd_input_other_bytes_per_sample: float = 0.0

    def __post_init__(self) -> None:
        for f in ("fwd_flops_per_sample", "bwd_flops_per_sample", "bwd_input_flops_per_sample",
                  "fwd_bytes_fixed", "fwd_bytes_per_sample", "bwd_bytes_fixed",
                  "bwd_bytes_per_sample", "param_bytes", "activation_bytes_per_sample",
                  "residual_bytes_per_sample", "tp_allreduce_bytes_per_sample",
                  "fwd_other_bytes_per_sample", "bwd_other_bytes_per_sample",
                  "bwd_input_other_bytes_per_sample"):
            v = getattr(self, f)
            if not v >= 0:
                raise IRError(f"LayerCost {self.name!r}: {f}={v!r} must be >= 0")
        if self.bwd_input_flops_per_sample > self.bwd_flops_per_sample:
            raise IRError(f"LayerCost {self.name!r}: input-gradient FLOP exceed the backward's")
        if self.bwd_input_other_bytes_per_sample > self.bwd_other_bytes_per_sample:
            raise IRError(f"LayerCost {self.name!r}: input-gradient other bytes exceed the backward's")


@dataclass(frozen=True, slots=True)
class Workload:
    """A model's step, as a sequence of layers (each an instance of a unique :class:`LayerCost`).

    Attributes:
        model: zoo name, e.g. ``"llama3-70b"``.
        layers: the layer sequence in program order, as names into ``costs`` (length L).
        costs: unique fragment bodies by name.
        seq_len: tokens per sample.
        global_batch: samples per step.
        training: True for a training step (forward, backward, optimizer), False for forward only.
        dtype_bytes: bytes per element of the compute dtype (2 for bfloat16).
        source: citation of the model's published config.
    """

    model: str
    layers: tuple[str, ...]
    costs: Mapping[str, LayerCost]
    seq_len: int
    global_batch: int
    training: bool = True
    dtype_bytes: int = 2
    source: str = ""

    def __post_init__(self) -> None:
        if not self.layers:
            raise IRError(f"Workload {self.model!r} has no layers")
        missing = sorted({n for n in self.layers if n not in self.costs})
        if missing:
            raise IRError(f"Workload {self.model!r}: layers {missing} have no LayerCost")
        if self.seq_len <= 0 or self.global_batch <= 0:
            raise IRError(f"Workload {self.model!r}: seq_len and global_batch must be positive")

    def layer(self, i: int) -> LayerCost:
        return self.costs[self.layers[i]]

    @property
    def param_count(self) -> int:
        return sum(self.costs[n].param_count for n in self.layers)

    @property
    def step_flops(self) -> float:
        """Model FLOP of one step (forward, plus backward when training), no recomputation."""
        per = sum(self.costs[n].fwd_flops_per_sample
                  + (self.costs[n].bwd_flops_per_sample if self.training else 0.0)
                  for n in self.layers)
        return per * self.global_batch


# --------------------------------------------------------------------------- schedules
@dataclass(frozen=True, slots=True, order=True)
class FragmentRef:
    """One fragment instance in a schedule: ``kind`` of ``stage`` for ``microbatch``."""

    kind: str
    stage: int
    microbatch: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise IRError(f"fragment kind {self.kind!r} is not one of {KINDS}")
        if self.stage < 0 or self.microbatch < 0:
            raise IRError(f"fragment {self.kind}{self.stage}.{self.microbatch}: negative index")

    def __str__(self) -> str:
        return f"{self.kind}{self.stage}.{self.microbatch}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "stage": self.stage, "microbatch": self.microbatch}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "FragmentRef":
        return FragmentRef(str(d["kind"]), int(d["stage"]), int(d["microbatch"]))


@dataclass(frozen=True, slots=True)
class ScheduleTable:
    """A pipeline schedule as data, over pipeline ranks (not yet meshes).

    Attributes:
        name: e.g. ``"1f1b"``, ``"interleaved-1f1b"``, ``"zb-h1"``.
        num_ranks: pipeline ranks P (one per mesh in a plan).
        num_stages: stages S (``P * virtual_stages``).
        microbatches: M.
        stage_rank: for each stage, the rank that runs it (length S).
        order: for each rank, its ordered fragments (length P).
        split_backward: True when B is the input gradient and W the weight gradient.
        forward_only: True for inference schedules (F only).
    """

    name: str
    num_ranks: int
    num_stages: int
    microbatches: int
    stage_rank: tuple[int, ...]
    order: tuple[tuple[FragmentRef, ...], ...]
    split_backward: bool = False
    forward_only: bool = False

    def __post_init__(self) -> None:
        if len(self.stage_rank) != self.num_stages:
            raise IRError(f"schedule {self.name}: stage_rank has {len(self.stage_rank)} entries, "
                          f"expected num_stages={self.num_stages}")
        if len(self.order) != self.num_ranks:
            raise IRError(f"schedule {self.name}: order has {len(self.order)} ranks, "
                          f"expected {self.num_ranks}")


# --------------------------------------------------------------------------- plan
@dataclass(frozen=True, slots=True)
class Layout:
    """A mesh's SPMD layout: data-parallel x tensor-parallel degrees (product = devices).

    ``fsdp``: the data axis also shards parameters, gradients and optimizer state (ZeRO stage 3 /
    fully sharded data parallel), gathering each layer's parameters before use.

    ``hsdp`` (with ``fsdp``): hybrid sharded data parallel (PyTorch FSDP ``HYBRID_SHARD``; MaxText's
    ``dcn_data_parallelism`` over ``ici_fsdp_parallelism``): the data axis is ``hsdp`` replicas
    of ``data / hsdp`` devices each; a replica shards parameters, gradients and optimizer state,
    and the replicas all-reduce their gradient shards (typically across TPU slices or nodes).
    """

    data: int
    tensor: int
    fsdp: bool = False
    hsdp: int = 1

    def __post_init__(self) -> None:
        if self.hsdp < 1 or self.data % self.hsdp or (self.hsdp > 1 and not self.fsdp):
            raise ValueError(f"Layout(data={self.data}, hsdp={self.hsdp}, fsdp={self.fsdp}): hsdp "
                             f"must divide data and needs fsdp; use hsdp=1 or fsdp=True")

    @property
    def shard(self) -> int:
        """Devices one parameter is sharded over: ``data / hsdp`` with fsdp, else 1."""
        return self.data // self.hsdp if self.fsdp else 1

    def __str__(self) -> str:
        return (f"dp{self.data}xtp{self.tensor}" + ("-fsdp" if self.fsdp else "")
                + (f"x{self.hsdp}" if self.hsdp > 1 else ""))


@dataclass(frozen=True, slots=True)
class StagePlan:
    """Stage ``index`` runs layers ``[first, last)`` of the workload on mesh ``mesh``."""

    index: int
    first: int
    last: int
    mesh: str


@dataclass(frozen=True, slots=True)
class Plan:
    """A complete MPMD plan, as written to plan.json (see ``planner/plan.schema.json``).

    Attributes:
        model / cluster: what was planned, by name (and the cluster file's path).
        stages: contiguous layer ranges in pipeline order, each on a mesh.
        layouts: mesh name -> layout, for every mesh the plan uses.
        schedule: the schedule table; ``rank_mesh[r]`` is the mesh of pipeline rank r.
        rank_mesh: mesh of each pipeline rank.
        merge_last_stage: whether the last stage's F and B of a microbatch form one fragment.
        global_batch / seq_len: the workload's shape.
        predicted: metrics predicted by the planner (seconds, bytes, fractions).
        solver: status, objective, bound, gap, wall_s of the CP-SAT search.
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
    predicted: Mapping[str, Any] = field(default_factory=dict)
    solver: Mapping[str, Any] = field(default_factory=dict)
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
    carving: tuple[Mapping[str, int], ...] = ()
    """For a cluster described as node groups: how the planner cut each group into the plan's
    meshes, one ``{"group", "nodes", "nodes_per_mesh", "meshes_per_node"}`` per group used
    (``hardware_profiles.carve.GroupShape``); empty when the cluster file lists its meshes."""
    schedules: tuple[Mapping[str, Any], ...] = ()
    """The candidate table: every (schedule, microbatches) the search replayed for the chosen
    shape, ``{"schedule", "microbatches", "step_time_s" (None: did not fit)}``, best first."""

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
    """

    model: str
    cluster: str
    global_batch: int
    seq_len: int
    parts: tuple[Plan, ...]
    sync_link: str
    sync_bytes: float
    sync_s: float
    predicted: Mapping[str, Any] = field(default_factory=dict)
    solver: Mapping[str, Any] = field(default_factory=dict)
    cluster_path: str = ""
    reason: str = ""

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
    def carving(self) -> tuple[Mapping[str, int], ...]:
        return tuple(c for p in self.parts for c in p.carving)


# --------------------------------------------------------------------------- timeline
@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """One interval on one track.

    ``track`` is ``"<mesh>/compute"``, ``"<mesh>/send"``, ``"<mesh>/recv"`` or ``"link:<name>"``;
    ``kind`` is F, B, W, ``transfer``, ``allreduce`` or ``optimizer``. Times in seconds from step start.
    """

    name: str
    kind: str
    track: str
    mesh: str
    stage: int
    microbatch: int
    start_s: float
    end_s: float
    bytes: float = 0.0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class Timeline:
    """Events of one step plus per-mesh memory samples ``(time_s, bytes)``."""

    events: tuple[TimelineEvent, ...]
    memory: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)

    @property
    def step_time_s(self) -> float:
        return max((e.end_s for e in self.events), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {"events": [asdict(e) for e in self.events],
                "memory": {k: [list(p) for p in v] for k, v in self.memory.items()}}


# --------------------------------------------------------------------------- plan JSON
PLAN_FORMAT = "mpmd-plan/1"


def schedule_to_json(t: ScheduleTable, rank_mesh: tuple[str, ...]) -> dict[str, Any]:
    return {
        "name": t.name,
        "microbatches": t.microbatches,
        "num_stages": t.num_stages,
        "split_backward": t.split_backward,
        "forward_only": t.forward_only,
        "stage_rank": list(t.stage_rank),
        "order": {rank_mesh[r]: [f.to_json() for f in frags] for r, frags in enumerate(t.order)},
    }


def _header(plan: "Plan | DataParallelPlan") -> dict[str, Any]:
    """The keys every plan document starts with."""
    return {"format": PLAN_FORMAT, "model": plan.model, "cluster": plan.cluster,
            "cluster_path": plan.cluster_path, "global_batch": plan.global_batch,
            "seq_len": plan.seq_len}


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The plan as a JSON-ready dict following ``planner/plan.schema.json``."""
    return {
        **_header(plan),
        "merge_last_stage": plan.merge_last_stage,
        "grad_sync": plan.grad_sync,
        "stages": [{"index": s.index, "layers": [s.first, s.last], "mesh": s.mesh}
                   for s in plan.stages],
        "meshes": {m: {"device": plan.devices.get(m, ("", 0))[0],
                       "num_devices": plan.devices.get(m, ("", l.data * l.tensor))[1],
                       "layout": {"data": l.data, "tensor": l.tensor, "fsdp": l.fsdp,
                                  **({"hsdp": l.hsdp} if l.hsdp > 1 else {})},
                       "recompute": bool(plan.recompute.get(m, False))}
                   for m, l in plan.layouts.items()},
        "rank_mesh": list(plan.rank_mesh),
        "schedule": schedule_to_json(plan.schedule, plan.rank_mesh),
        "predicted": dict(plan.predicted),
        "solver": dict(plan.solver),
        "carving": [dict(c) for c in plan.carving],
        "schedules": [dict(c) for c in plan.schedules],
    }


def data_parallel_to_json(plan: DataParallelPlan) -> dict[str, Any]:
    """A :class:`DataParallelPlan` as a JSON-ready dict: the parts as plans, plus the sync."""
    return {
        **_header(plan),
        "parts": [plan_to_json(p) for p in plan.parts],
        "sync": {"link": plan.sync_link, "bytes": plan.sync_bytes, "seconds": plan.sync_s},
        "reason": plan.reason,
        "predicted": dict(plan.predicted),
        "solver": dict(plan.solver),
    }


def any_plan_to_json(plan: "Plan | DataParallelPlan") -> dict[str, Any]:
    """:func:`plan_to_json` or :func:`data_parallel_to_json`, whichever ``plan`` is."""
    return data_parallel_to_json(plan) if isinstance(plan, DataParallelPlan) else plan_to_json(plan)


@contextmanager
def _parsing():
    """Turn a missing key or a malformed value met while parsing a plan into one-line IRError."""
    try:
        yield
    except KeyError as e:
        raise IRError(f"plan is missing key {e.args[0]!r}; regenerate it with 'mpmd plan'") from None
    except (TypeError, ValueError) as e:
        if isinstance(e, IRError):
            raise
        raise IRError(f"plan has a malformed value ({e}); regenerate it with 'mpmd plan'") from None


def data_parallel_from_json(d: Mapping[str, Any]) -> DataParallelPlan:
    """Parse a dict written by :func:`data_parallel_to_json`.

    Raises:
        IRError: a missing key or inconsistent value, named in the message.
    """
    with _parsing():
        sync = d["sync"]
        return DataParallelPlan(
            model=str(d["model"]), cluster=str(d["cluster"]), global_batch=int(d["global_batch"]),
            seq_len=int(d["seq_len"]), parts=tuple(plan_from_json(p) for p in d["parts"]),
            sync_link=str(sync["link"]), sync_bytes=float(sync["bytes"]), sync_s=float(sync["seconds"]),
            predicted=dict(d.get("predicted", {})), solver=dict(d.get("solver", {})),
            cluster_path=str(d.get("cluster_path", "")), reason=str(d.get("reason", "")))


def plan_from_json(d: Mapping[str, Any]) -> Plan:
    """Parse a plan dict (as written by :func:`plan_to_json`).

    Raises:
        IRError: a missing key or inconsistent value, named in the message.
    """
    with _parsing():
        rank_mesh = tuple(str(m) for m in d["rank_mesh"])
        s = d["schedule"]
        unknown = sorted(set(s["order"]) - set(rank_mesh))
        if unknown:
            raise IRError(f"plan schedule names mesh {unknown[0]!r}, which no pipeline rank uses "
                          f"(ranks: {list(rank_mesh)}); fix 'schedule.order' or 'rank_mesh'")
        order = tuple(tuple(FragmentRef.from_json(f) for f in s["order"].get(m, []))
                      for m in rank_mesh)
        table = ScheduleTable(
            name=str(s["name"]), num_ranks=len(rank_mesh), num_stages=int(s["num_stages"]),
            microbatches=int(s["microbatches"]), stage_rank=tuple(int(r) for r in s["stage_rank"]),
            order=order, split_backward=bool(s.get("split_backward", False)),
            forward_only=bool(s.get("forward_only", False)))
        stages = tuple(StagePlan(int(x["index"]), int(x["layers"][0]), int(x["layers"][1]),
                                 str(x["mesh"])) for x in d["stages"])
        try:
            layouts = {str(m): Layout(int(v["layout"]["data"]), int(v["layout"]["tensor"]),
                                      bool(v["layout"].get("fsdp", False)),
                                      int(v["layout"].get("hsdp", 1)))
                       for m, v in d["meshes"].items()}
        except ValueError as e:
            raise IRError(f"plan layout: {e}") from None
        for st in stages:
            if st.mesh not in layouts:
                raise IRError(f"plan stage {st.index} names mesh {st.mesh!r}, which is not under "
                              f"'meshes' ({sorted(layouts)}); fix the stage's mesh")
        return Plan(model=str(d["model"]), cluster=str(d["cluster"]), stages=stages,
                    layouts=layouts, schedule=table, rank_mesh=rank_mesh,
                    merge_last_stage=bool(d.get("merge_last_stage", False)),
                    grad_sync=str(d.get("grad_sync", "step")),
                    global_batch=int(d["global_batch"]), seq_len=int(d["seq_len"]),
                    predicted=dict(d.get("predicted", {})), solver=dict(d.get("solver", {})),
                    cluster_path=str(d.get("cluster_path", "")),
                    devices={str(m): (str(v.get("device", "")), int(v.get("num_devices", 0)))
                             for m, v in d["meshes"].items()},
                    recompute={str(m): bool(v.get("recompute", False))
                               for m, v in d["meshes"].items()},
                    carving=tuple({"group": str(c["group"]), "nodes": int(c["nodes"]),
                                   "nodes_per_mesh": int(c.get("nodes_per_mesh", 1)),
                                   "meshes_per_node": int(c.get("meshes_per_node", 1))}
                                  for c in d.get("carving", [])),
                    schedules=tuple(dict(c) for c in d.get("schedules", [])))
