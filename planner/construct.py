"""Candidate construction, below every search: the planner's vocabulary of schedules, its
options (:class:`PlanOptions`), a pipeline's CP-SAT input (:func:`make_candidate`: per-mesh
:class:`~simulator.stage_cost.StageCost` options and boundary transfers) and the
:class:`~ir.Plan` an answer makes (:func:`build_plan`). The searches (:mod:`planner.api`'s
mesh-listing driver, :mod:`planner.shapes`, :mod:`planner.candidate`, :mod:`planner.baseline`)
call down into it; nothing here calls up.
"""

from __future__ import annotations

from dataclasses import dataclass

from ir import OPTIMIZER_STATES, FragmentKind, FragmentRef, Plan, ScheduleTable, StagePlan, Workload
from hardware_profiles.types import Cluster
from planner.budget import COSTS, Budget
from planner.errors import PlannerError
from planner.inflight import V_SHAPED
from planner.options import _cached_mesh_options
from planner.options import _split_layers
from planner.search import Assignment, Candidate
from simulator import cost_model as cm
from simulator.plan_costs import PlanCosts
from simulator.schedules import KINDS, generate, kind, v_shape_stage_rank

split_layers = _split_layers   # re-exported for the planner's modules (an explicit export for mypy)

TRAIN_SCHEDULES = tuple(n for n, k in KINDS.items() if k.training)
"""Schedule families a training plan may name, in tie-break order: every schedule of
:mod:`simulator.schedules` (the fixed patterns and the adaptive ZB-1p / ZB-2p), in their
:attr:`~simulator.schedules.ScheduleKind.order`."""
SEARCHED_SCHEDULES = tuple(n for n in TRAIN_SCHEDULES if KINDS[n].searched)
"""The schedules searched when the options name none (:attr:`ScheduleKind.searched`)."""
MERGEABLE = tuple(n for n, k in KINDS.items() if k.fb_mergeable)
"""Schedules whose last stage runs each microbatch's F immediately before its B."""
SAME_MODEL = {"zb-1p": "zb-h1"}
"""Schedules whose CP-SAT model is another's (same fragment kinds, in-flight counts and
placement): the search solves it once and builds both plans from the one assignment."""


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """Search options.

    Attributes:
        time_limit_s: wall-clock budget of the whole search (CP-SAT solves share it).
        schedules: schedule families to consider (None: all for the workload).
        microbatches: microbatch counts to consider (None: divisors of the global batch).
        max_tensor: largest tensor-parallel degree considered.
        headroom: fraction of device memory kept free.
        virtual_stages: virtual stages per mesh for interleaved 1F1B.
        even_split: force equal blocks per stage on every mesh (the usual hand split).
        meshes: restrict to these meshes (None: all of the cluster's).
        fsdp: also consider fully sharded data parallel layouts.
        fixed_order: use every mesh of ``meshes`` in that order as the pipeline (a carved
            pipeline): the solve then only partitions layers and picks layouts (a linear model).
        seed / workers: CP-SAT determinism controls.
        context: context parallelism (:attr:`ir.Layout.context`): 0 searches the degrees
            :func:`planner.options.context_degrees` offers (sequences of
            :data:`planner.options.CONTEXT_MIN_TOKENS` or more), 1 never splits a sequence, and
            ``N > 1`` runs every mesh at context degree ``N`` (any sequence it divides).
        optimizer_state: how every layout keeps Adam's state (:attr:`ir.Layout.optimizer_state`:
            ``"fp32"``, ``"bf16-moments"`` or ``"bf16"``), the user's choice, not searched.
    """

    time_limit_s: float = 30.0
    schedules: tuple[str, ...] | None = None
    microbatches: tuple[int, ...] | None = None
    max_tensor: int = 8
    headroom: float = 0.1
    virtual_stages: int = 2
    seed: int = 0
    workers: int = 1
    even_split: bool = False
    meshes: tuple[str, ...] | None = None
    fsdp: bool = True
    fixed_order: bool = False
    context: int = 0
    optimizer_state: str = "fp32"

    def __post_init__(self) -> None:
        if self.optimizer_state not in OPTIMIZER_STATES:
            raise PlannerError(f"PlanOptions(optimizer_state={self.optimizer_state!r}): unknown; "
                             f"fix: one of {', '.join(OPTIMIZER_STATES)}")


def fragment_kinds(schedule: str, training: bool) -> tuple[FragmentKind, ...]:
    """The fragment kinds one microbatch runs per stage under ``schedule``: F for inference,
    F, B and W when the backward is split into input and weight gradients (the schedule's
    :attr:`~simulator.schedules.ScheduleKind.split_backward`), else F and B."""
    if not training:
        return (FragmentKind.F,)
    if kind(schedule).split_backward:
        return (FragmentKind.F, FragmentKind.B, FragmentKind.W)
    return (FragmentKind.F, FragmentKind.B)


def stages_per_rank(schedule: str, virtual_stages: int) -> int:
    """Stages each pipeline rank holds: ``virtual_stages`` for interleaved 1F1B, 2 in a V (ZB-V,
    DualPipeV), else 1 (the schedule's :attr:`~simulator.schedules.ScheduleKind.stages_per_rank`)."""
    return kind(schedule).stages_per_rank(virtual_stages)


def schedule_allowed(schedule: str, ranks: int, microbatches: int, num_blocks: int,
                     virtual_stages: int) -> bool:
    """Whether the planner can build ``schedule`` on ``ranks`` pipeline ranks for ``microbatches``
    microbatches over ``num_blocks`` repeated blocks: the generator accepts the sizes
    (:func:`simulator.schedules.generate`) and every stage gets at least one block, the same number
    on each of a rank's stages.

    Conditions: a schedule of :data:`TRAIN_SCHEDULES`; ``ranks, microbatches >= 1``; stages per rank
    ``k`` (``virtual_stages`` >= 2 for interleaved 1F1B, 2 for ZB-V and DualPipeV, else 1) with
    ``num_blocks % k == 0`` and ``num_blocks >= k * ranks``; interleaved 1F1B:
    ``microbatches % ranks == 0`` (Megatron-LM's condition, ``interleaved.py``); DualPipeV:
    ``microbatches >= 2 * ranks`` (``dualpipe_v.py``). The other generators take any sizes >= 1.
    """
    if schedule not in TRAIN_SCHEDULES or ranks < 1 or microbatches < 1:
        return False
    sk = kind(schedule)
    if not sk.sizes_ok(ranks, microbatches, virtual_stages):   # before k: interleaved needs v >= 2
        return False
    k = sk.stages_per_rank(virtual_stages)
    return not (num_blocks % k or num_blocks < k * ranks)


def make_candidate(w: Workload, cluster: Cluster, meshes: tuple[str, ...], schedule: str,
                   microbatches: int, opts: PlanOptions, budget: Budget | None = None
                   ) -> Candidate | None:
    """The CP-SAT input for ``schedule`` at ``microbatches`` microbatches over ``meshes``: per-mesh
    layout options, the F + B transfer time of one microbatch's boundary activation between every
    ordered pair of meshes (seconds), the pipeline depths the schedule accepts
    (:func:`schedule_allowed`), and ``opts.even_split``, ``opts.fixed_order`` and
    ``opts.virtual_stages``.

    ``budget``: charged the candidate and the layout choices costed for it (none when cached).

    Returns None when some mesh has no layout option (no data-parallel degree divides the
    microbatch) or the schedule accepts no pipeline depth (with ``fixed_order`` or ``even_split``
    the depth is ``len(meshes)``).
    """
    pre, nb, _ = split_layers(w)
    nm = len(meshes)
    depths = (nm,) if (opts.fixed_order or opts.even_split) else tuple(range(1, nm + 1))
    counts = tuple(p for p in depths
                   if schedule_allowed(schedule, p, microbatches, nb, opts.virtual_stages))
    if not counts:
        return None
    samples = w.global_batch / microbatches
    kinds = fragment_kinds(schedule, w.training)
    split = FragmentKind.W in kinds
    options = []
    for m in meshes:
        o, costed = _cached_mesh_options(w, cluster.meshes[m], samples, kinds, split,
                                         opts.headroom, opts.max_tensor, opts.fsdp,
                                         kind(schedule).hides_alltoall, opts.context,
                                         opts.optimizer_state)
        if budget is not None:
            budget.charge(COSTS["option"] * costed)
        if not o:
            return None
        options.append(o)
    act = w.layer(pre).activation_bytes_per_sample * samples
    comm = tuple(tuple(0.0 if a == b else 2 * cm.transfer_time(
        act, cluster.link_between(a, b).link) for b in meshes) for a in meshes)
    return Candidate(schedule, microbatches, stages_per_rank(schedule, opts.virtual_stages), nb,
                     meshes, tuple(options), comm, schedule in MERGEABLE and w.training,
                     even_split=opts.even_split,
                     required_meshes=meshes if opts.even_split else (),
                     fixed_order=opts.fixed_order, v_shape=schedule in V_SHAPED,
                     rank_counts=counts)


def build_plan(w: Workload, cluster: Cluster, a: Assignment, schedule: str, microbatches: int,
               virtual_stages: int) -> Plan:
    """Turn a solve's :class:`Assignment` into a :class:`Plan` with its schedule table.

    Stages follow the schedule's placement: round-robin (stage s on rank ``s % P``; interleaved
    1F1B has ``virtual_stages`` per rank), or a V for ZB-V and DualPipeV (rank r holds stages r and
    2P-1-r, :func:`simulator.schedules.v_shape_stage_rank`), each with ``a.blocks[rank]`` blocks;
    the first stage also takes the layers before the blocks and the last the layers after them.
    The adaptive ZB-1p / ZB-2p are generated from the plan's own per-stage fragment times and
    boundary transfers (:class:`simulator.plan_costs.PlanCosts` of the plan under a placeholder
    ZB-H1 table, which has the same stages and split backward).

    Raises:
        PlannerError: the generator placed stages other than expected (a bug).
        simulator.schedules.ScheduleError: the schedule does not accept the sizes
            (see :func:`schedule_allowed`).
    """
    pre, nb, post = split_layers(w)
    p = len(a.order)
    v = stages_per_rank(schedule, virtual_stages)
    placement = (v_shape_stage_rank(p) if schedule in V_SHAPED
                 else tuple(s % p for s in range(v * p)))
    stages, cursor = [], pre
    for idx, rank in enumerate(placement):
        lo = 0 if idx == 0 else cursor
        cursor += a.blocks[rank]
        hi = len(w.layers) if idx == len(placement) - 1 else cursor
        stages.append(StagePlan(idx, lo, hi, a.order[rank]))

    def make(table: ScheduleTable) -> Plan:
        return Plan(model=w.model, cluster=cluster.name, stages=tuple(stages),
                    layouts=dict(zip(a.order, a.layouts)),
                    recompute={m: rc for m, rc in zip(a.order, a.recompute) if rc},
                    schedule=table, rank_mesh=a.order, merge_last_stage=a.merge,
                    global_batch=w.global_batch, seq_len=w.seq_len, cluster_path=cluster.path,
                    precision=w.precision or "bf16", cross_entropy=w.cross_entropy,
                    devices={m: (cluster.meshes[m].device.name, cluster.meshes[m].num_devices)
                             for m in a.order})

    if kind(schedule).adaptive and w.training:
        costs = PlanCosts(make(generate("zb-h1", p, microbatches)), w, cluster)

        def durations(stage: int, kind: str) -> float:
            return costs.fragment_time(FragmentRef(kind, stage, 0))

        def comm(src: int, dst: int) -> float:
            b = costs.boundary(src, dst)
            return 0.0 if b is None else b[2]

        table = generate(schedule, p, microbatches, durations=durations, comm=comm)
    else:
        table = generate(schedule, p, microbatches, virtual_stages=v, forward_only=not w.training)
    if tuple(table.stage_rank) != placement:
        raise PlannerError(f"schedule {schedule!r} places stages {table.stage_rank}, "
                           f"the planner expects {placement}")
    return make(table)


def microbatch_counts(w: Workload, opts: PlanOptions, nmeshes: int) -> list[int]:
    if opts.microbatches:
        return [m for m in opts.microbatches if w.global_batch % m == 0]
    divs = [m for m in range(1, w.global_batch + 1) if w.global_batch % m == 0]
    # powers of two and multiples of the mesh count: what practitioners try
    keep = sorted({m for m in divs if (m & (m - 1)) == 0 or m % nmeshes == 0})
    return [m for m in keep if m >= min(nmeshes, w.global_batch)]
