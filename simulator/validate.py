"""Validation against published training runs: a CSV row -> workload + cluster + plan -> metric.

The calibration set is ``reports/validation/published_training.csv`` (a copy of
``/work/shared/validation/published_training.csv``; sources in its README). For each row this
module builds the run's exact setup and converts the simulated step time into the row's metric:

- ``samples_per_gpu_s`` = global_batch / step_time / gpus (Qi et al., ICLR 2024, Tables 3-4);
- ``iteration_s``       = step_time (Korthikanti et al. 2022, Table 5);
- ``tflops_per_gpu``    = F / step_time / gpus / 1e12 with Narayanan et al. (SC 2021) eq. (3):
  ``F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` (FLOPs of one step with activation recomputation).

Layering: the simulator may not import ``compiler``, so the workload is built by a callable the
caller passes in (``workload_fn(row) -> Workload``; the CLI passes one around
``compiler.costing.workload(gpt_config(...))``). Everything here is a pure function of its inputs.

Cluster (synthetic, per row): ``pp`` meshes ``stage0..stage{pp-1}`` of ``tp*dp`` A100s each, axes
``{data: dp, tensor: tp}``, placed in Megatron's rank order (tensor innermost, then data, then
pipeline) on DGX A100 nodes of 8 GPUs (NVLink/NVSwitch inside, one 200 Gb/s HDR InfiniBand NIC per
GPU between nodes, NVIDIA DGX A100 reference architecture; Qi et al. used RoCE, bandwidth not stated,
taken as the same 200 Gb/s per GPU). A link between two pipeline meshes is NVLink when both lie in
one node, else the scale-out network; its bandwidth is aggregate: every device of the mesh sends its
slice of the activation (data parallel splits the batch; Megatron's scatter/gather optimisation,
Narayanan et al. Sec. 4.1, and sequence parallelism, Korthikanti et al., split it over tensor parallel).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from compiler.ir import FragmentRef, LayerCost, Layout, Plan, StagePlan, Workload
from hardware_profiles.types import Cluster, DeviceProfile, InterMeshLink, Link, MeshSpec
from simulator.plan_costs import CostError, PlanCosts
from simulator.plan_sim import simulate_plan
from simulator.schedules import generate
from simulator.schedules.adaptive import zero_bubble_auto

__all__ = ["ValidationError", "Row", "Setup", "RowResult", "FitResult", "load_rows", "row_setup",
           "build_cluster", "build_plan", "split_layers", "selective_recompute", "narayanan_flops",
           "metric_from_step", "evaluate", "ranking_agrees", "zb_rankings", "mape", "fit",
           "leave_one_source_out", "with_efficiency", "adapt_plan", "post_validation_step",
           "SCHEDULE_MAP", "ZB_SCHEDULES", "ADAPTIVE"]

DEFAULT_VOCAB = 51200
"""Vocabulary when a row leaves it blank (Narayanan et al. 2021 and Korthikanti et al. 2022 use 51200)."""

DEVICES_PER_NODE = 8
"""GPUs per DGX A100 node (NVIDIA DGX A100 reference architecture)."""

SCALE_OUT_LATENCY_S = 5e-6
"""Per-message latency of HDR InfiniBand / RoCE between nodes: an estimate (a few us for RDMA
send/recv through one switch tier, NCCL inter-node small-message figures), not a datasheet number."""

SCHEDULE_MAP = {"1f1b": "1f1b", "1f1b-interleaved": "interleaved-1f1b", "zb-1p": "zb-1p",
                "zb-2p": "zb-2p"}
"""CSV schedule -> simulator schedule. Qi et al.'s ZB-1p / ZB-2p are found by their automatic
scheduler over the profiled stage times under a 1p / 2p activation-memory limit (Sec. 3):
:mod:`simulator.schedules.adaptive`, rebuilt for each device from the row's own fragment and
transfer times (:func:`adapt_plan`)."""

ADAPTIVE = ("zb-1p", "zb-2p")
"""Simulator schedules built from the row's costs, and timed with post-validation (see
:func:`post_validation_step`)."""

ZB_SCHEDULES = ("1f1b", "1f1b-interleaved", "zb-1p", "zb-2p")

METRICS = ("samples_per_gpu_s", "iteration_s", "tflops_per_gpu")


class ValidationError(CostError):
    """A malformed validation row or an impossible setup (the message names the value and fix)."""


# --------------------------------------------------------------------------- rows
@dataclass(frozen=True, slots=True)
class Row:
    """One published measurement (a CSV row); blank optional fields are None."""

    source: str
    model: str
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    device: str
    gpus: int
    tp: int
    pp: int
    dp: int
    global_batch: int
    micro_batch: int | None
    microbatches: int | None
    schedule: str | None
    metric: str
    value: float

    @property
    def key(self) -> str:
        return f"{self.source}/{self.model}/b{self.global_batch}/{self.schedule or '-'}"


def _int(d: Mapping[str, str], k: str, line: int, default: int | None = None) -> int | None:
    v = (d.get(k) or "").strip()
    if not v:
        if default is None and k not in ("micro_batch", "microbatches"):
            raise ValidationError(f"row {line}: field {k!r} is blank; fill it in")
        return default
    try:
        return int(v)
    except ValueError:
        raise ValidationError(f"row {line}: {k}={v!r} is not an integer; fix the CSV") from None


def load_rows(path: str | Path) -> tuple[Row, ...]:
    """Parse the published-training CSV (header as in ``published_training.csv``).

    Raises:
        ValidationError: a missing or malformed field, an unknown metric or schedule, or
            ``tp * pp * dp != gpus``.
    """
    rows = []
    with open(path, newline="") as f:
        for line, d in enumerate(csv.DictReader(f), start=2):
            sched = (d.get("schedule") or "").strip() or None
            if sched is not None and sched not in SCHEDULE_MAP:
                raise ValidationError(f"row {line}: schedule {sched!r} unknown; use one of "
                                      f"{sorted(SCHEDULE_MAP)} or leave it blank")
            metric = (d.get("metric") or "").strip()
            if metric not in METRICS:
                raise ValidationError(f"row {line}: metric {metric!r} unknown; use one of {METRICS}")
            try:
                value = float(d["value"])
            except (KeyError, TypeError, ValueError):
                raise ValidationError(f"row {line}: value {d.get('value')!r} is not a number") from None
            r = Row(source=d["source"].strip(), model=d["model"].strip(),
                    layers=_int(d, "layers", line), hidden=_int(d, "hidden", line),
                    heads=_int(d, "heads", line), seq_len=_int(d, "seq_len", line),
                    vocab=_int(d, "vocab", line, DEFAULT_VOCAB), device=d["device"].strip(),
                    gpus=_int(d, "gpus", line), tp=_int(d, "tp", line), pp=_int(d, "pp", line),
                    dp=_int(d, "dp", line), global_batch=_int(d, "global_batch", line),
                    micro_batch=_int(d, "micro_batch", line), microbatches=_int(d, "microbatches", line),
                    schedule=sched, metric=metric, value=value)
            if r.tp * r.pp * r.dp != r.gpus:
                raise ValidationError(f"row {line}: tp*pp*dp = {r.tp * r.pp * r.dp} != gpus={r.gpus}; "
                                      f"fix the layout")
            rows.append(r)
    return tuple(rows)


# --------------------------------------------------------------------------- setup choices
@dataclass(frozen=True, slots=True)
class Setup:
    """What a row is simulated as: the plan, its workload, and every assumption made."""

    row: Row
    micro_batch: int
    microbatches: int
    schedule: str            # simulator schedule name
    virtual_stages: int
    recompute: str           # "none", "selective" or "full"
    assumptions: tuple[str, ...]
    workload: Workload
    plan: Plan


def _choices(row: Row) -> tuple[int, str, int, str, list[str]]:
    """(micro_batch, simulator schedule, virtual_stages, recompute, assumptions) for ``row``."""
    notes: list[str] = []
    mb = row.micro_batch
    if mb is None:
        mb = 1
        notes.append("micro batch 1 (not published)")
    sched = row.schedule
    if sched is None:
        sched = "1f1b-interleaved" if row.pp > 1 else "1f1b"
        notes.append(f"{sched} (not published)" if row.pp > 1 else "no pipeline: grad accumulation")
    name = SCHEDULE_MAP[sched]
    v = 1
    if name == "interleaved-1f1b":
        # Korthikanti 530B (3 layers per rank) and Qi et al. (3 per middle rank): one layer per
        # chunk, so chunks are uniform; Narayanan et al.: Megatron's 2 chunks per rank.
        v = max(2, -(-row.layers // row.pp)) if row.source in ("korthikanti", "zb") else 2
        notes.append(f"{v} virtual stages")
    if sched in ("zb-1p", "zb-2p"):
        notes.append("auto schedule from the row's costs; post-validation")
    recompute = {"korthikanti": "selective", "narayanan": "full"}.get(row.source, "none")
    if recompute != "none":
        notes.append(f"{recompute} recompute")
    return mb, name, v, recompute, notes


def split_layers(n: int, parts: int) -> list[int]:
    """``n`` layers over ``parts`` stages as evenly as possible; the extra layers go to the
    middle stages first, so the first and last stages (which also hold the embedding and the
    head) get the fewer (Qi et al.'s 22 = 3*8 - 2 and 46 = 3*16 - 2 layer models are this split).

    Raises:
        ValidationError: fewer layers than stages.
    """
    if n < parts:
        raise ValidationError(f"{n} layers cannot fill {parts} pipeline stages; use fewer stages")
    base, rem = divmod(n, parts)
    counts = [base] * parts
    for s in sorted(range(parts), key=lambda s: (-min(s, parts - 1 - s), s))[:rem]:
        counts[s] += 1
    return counts


def _same_node(a: int, b: int, n: int) -> bool:
    """Meshes ``a`` and ``b`` of ``n`` devices each (Megatron rank order) lie in one node."""
    ranks = [r for m in (a, b) for r in (m * n, (m + 1) * n - 1)]
    return len({r // DEVICES_PER_NODE for r in ranks}) == 1


def build_cluster(row: Row, device: DeviceProfile) -> Cluster:
    """The row's synthetic cluster (see the module docstring) of ``device``."""
    n = row.tp * row.dp
    intra = Link(device.scale_up_bandwidth, device.scale_up_latency, "NVLink3 / NVSwitch (profile)")
    net = "RoCE (Qi et al. 2024), taken as 200 Gb/s per GPU" if row.source == "zb" else \
        "InfiniBand HDR 200 Gb/s per GPU (DGX A100)"
    out = Link(device.scale_out_bandwidth, SCALE_OUT_LATENCY_S, net)
    meshes = {}
    for k in range(row.pp):
        big = n > DEVICES_PER_NODE
        meshes[f"stage{k}"] = MeshSpec(
            name=f"stage{k}", device=device, num_devices=n, axes={"data": row.dp, "tensor": row.tp},
            intra_link=intra, devices_per_node=DEVICES_PER_NODE if big else None,
            scale_out_link=out if big else None)
    links = []
    pairs = {(k, k + 1) for k in range(row.pp - 1)} | ({(0, row.pp - 1)} if row.pp > 2 else set())
    for a, b in sorted(pairs):
        per = intra if _same_node(a, b, n) else out
        links.append(InterMeshLink(f"stage{a}", f"stage{b}",
                                   Link(per.bandwidth * n, per.latency, per.source)))
    return Cluster(name=f"{row.source}-{row.model}-a100x{row.gpus}", meshes=meshes,
                   links=tuple(links), description="synthetic DGX A100 cluster for validation")


def selective_recompute(workload: Workload, hidden: int) -> Workload:
    """The workload under Korthikanti et al.'s selective recomputation: each decoder block's
    backward first recomputes its attention core (``Q K^T`` and ``softmax . V``: ``4 s^2 h`` FLOP
    per sample, Korthikanti et al. 2022 Sec. 5; no causal saving, as in Megatron). The residuals
    are unchanged: the traced ones already exclude the ``s x s`` scores (flash-attention style),
    which is exactly what selective recomputation drops."""
    extra = 4.0 * workload.seq_len ** 2 * hidden
    costs = {}
    for name, c in workload.costs.items():
        if name == "decoder_block":
            c = replace(c, bwd_flops_per_sample=c.bwd_flops_per_sample + extra,
                        bwd_input_flops_per_sample=c.bwd_input_flops_per_sample + extra)
        costs[name] = c
    return replace(workload, costs=costs)


def build_plan(row: Row, workload: Workload, *, schedule: str, micro_batch: int,
               virtual_stages: int = 1, recompute: bool = False) -> Plan:
    """The row's plan: ``pp * virtual_stages`` stages (layers split over ranks by
    :func:`split_layers`, then each rank's layers evenly over its chunks, so every schedule gives a
    rank the same layers; embedding with the first stage, head with the last), stage ``s`` on mesh ``stage{s % pp}``,
    layout ``Layout(dp, tp)`` per mesh, ``global_batch / (micro_batch * dp)`` microbatches.

    Raises:
        ValidationError: the batch does not divide into microbatches.
        simulator.schedules.ScheduleError: the schedule does not support the sizes.
    """
    per_pipe, rem = divmod(row.global_batch, micro_batch * row.dp)
    if rem or per_pipe < 1:
        raise ValidationError(f"{row.key}: global batch {row.global_batch} is not a multiple of "
                              f"micro_batch*dp = {micro_batch * row.dp}; fix micro_batch")
    if row.microbatches is not None and row.microbatches != per_pipe:
        raise ValidationError(f"{row.key}: microbatches={row.microbatches} but global_batch/"
                              f"(micro_batch*dp) = {per_pipe}; fix the row")
    table = generate(schedule, row.pp, per_pipe, virtual_stages=max(virtual_stages, 2))
    S = table.num_stages
    blocks = len(workload.layers) - 2
    if blocks != row.layers:
        raise ValidationError(f"{row.key}: workload has {blocks} blocks, row says {row.layers}")
    per_rank = split_layers(blocks, row.pp)
    chunks = S // row.pp
    counts = [0] * S
    for r, n in enumerate(per_rank):                 # rank r holds stages r, r + pp, ...
        base, rem = divmod(n, chunks)
        within = [base + (c < rem) for c in range(chunks)]
        if r == 0:                                   # the embedding's chunk takes the fewest
            within.reverse()
        for c, k in enumerate(within):
            counts[c * row.pp + r] = k
    stages, first = [], 0
    for s, c in enumerate(counts):
        last = first + c + (1 if s == 0 else 0) + (1 if s == S - 1 else 0)
        stages.append(StagePlan(s, first, last, f"stage{table.stage_rank[s]}"))
        first = last
    meshes = tuple(f"stage{r}" for r in range(row.pp))
    return Plan(model=workload.model, cluster=f"{row.source}-{row.model}-a100x{row.gpus}",
                stages=tuple(stages), layouts={m: Layout(row.dp, row.tp) for m in meshes},
                schedule=table, rank_mesh=meshes, merge_last_stage=False,
                global_batch=row.global_batch, seq_len=row.seq_len,
                devices={m: (row.device, row.tp * row.dp) for m in meshes},
                recompute={m: recompute for m in meshes})


def row_setup(row: Row, workload_fn: Callable[[Row], Workload]) -> Setup:
    """Build the :class:`Setup` of ``row``; ``workload_fn(row)`` costs its model (see module doc)."""
    mb, name, v, rc, notes = _choices(row)
    w = workload_fn(row)
    if rc == "selective":
        w = selective_recompute(w, row.hidden)
    plan = build_plan(row, w, schedule=name, micro_batch=mb, virtual_stages=v,
                      recompute=rc == "full")
    return Setup(row, mb, plan.microbatches, name, v, rc, tuple(notes), w, plan)


# --------------------------------------------------------------------------- metrics
def narayanan_flops(batch: int, seq_len: int, layers: int, hidden: int, vocab: int) -> float:
    """FLOPs of one training step with activation recomputation, Narayanan et al. 2021 eq. (3):
    ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``."""
    B, s, l, h, V = batch, seq_len, layers, hidden, vocab
    return 96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h))


def metric_from_step(row: Row, step_s: float) -> float:
    """The row's metric for a step of ``step_s`` seconds (see the module docstring)."""
    if row.metric == "iteration_s":
        return step_s
    if row.metric == "samples_per_gpu_s":
        return row.global_batch / step_s / row.gpus
    if row.metric == "tflops_per_gpu":
        f = narayanan_flops(row.global_batch, row.seq_len, row.layers, row.hidden, row.vocab)
        return f / step_s / row.gpus / 1e12
    raise ValidationError(f"unknown metric {row.metric!r}; use one of {METRICS}")


def with_efficiency(device: DeviceProfile, matmul: float | None = None,
                    memory: float | None = None, overhead_s: float | None = None) -> DeviceProfile:
    """``device`` with the given efficiency values (None keeps the profile's)."""
    return replace(device,
                   matmul_efficiency=device.matmul_efficiency if matmul is None else matmul,
                   memory_efficiency=device.memory_efficiency if memory is None else memory,
                   fragment_overhead=device.fragment_overhead if overhead_s is None else overhead_s)


# --------------------------------------------------------------------------- evaluation
StepFn = Callable[[Plan, Workload, Cluster], float]


def sim_step(plan: Plan, workload: Workload, cluster: Cluster) -> float:
    """Step time of the discrete-event replay (:func:`simulator.plan_sim.simulate_plan`), s."""
    return simulate_plan(plan, workload, cluster).step_time_s


@dataclass(frozen=True, slots=True)
class RowResult:
    setup: Setup
    step_s: float
    predicted: float

    @property
    def row(self) -> Row:
        return self.setup.row

    @property
    def ape(self) -> float:
        """Absolute percentage error of the predicted metric, %."""
        return abs(self.predicted - self.row.value) / abs(self.row.value) * 100.0


def adapt_plan(plan: Plan, workload: Workload, cluster: Cluster) -> Plan:
    """``plan`` with its ZB-1p / ZB-2p schedule rebuilt by the automatic scheduler
    (:func:`simulator.schedules.adaptive.zero_bubble_auto`) from the plan's own costs on
    ``cluster``: each stage's F, B, W fragment seconds (dispatch overhead included) and each
    boundary's transfer seconds, as Qi et al. profile them (Sec. 3). Other plans are returned as is.
    """
    name = plan.schedule.name
    if name not in ADAPTIVE:
        return plan
    costs = PlanCosts(plan, workload, cluster)
    P, M = plan.schedule.num_ranks, plan.microbatches
    dur = {(s, k): costs.fragment_time(FragmentRef(k, s, 0)) for s in range(P) for k in "FBW"}
    comm = {}
    for a in range(P):
        for b in (a - 1, a + 1):
            if 0 <= b < P:
                x = costs.boundary(a, b)
                comm[(a, b)] = 0.0 if x is None else x[2]
    limit = P if name == "zb-1p" else 2 * P
    table = zero_bubble_auto(P, M, lambda s, k: dur[(s, k)], lambda a, b: comm[(a, b)],
                             memory_limit=limit, name=name, objective="span")
    return replace(plan, schedule=table)


def _repeat(plan: Plan, times: int) -> Plan:
    """``plan`` run ``times`` iterations back to back as one schedule (microbatch ids offset by
    M per iteration; each rank finishes iteration k before it starts k + 1)."""
    t, M = plan.schedule, plan.microbatches
    order = tuple(tuple(FragmentRef(f.kind, f.stage, f.microbatch + i * M)
                        for i in range(times) for f in o) for o in t.order)
    table = replace(t, microbatches=M * times, order=order)
    return replace(plan, schedule=table, global_batch=plan.global_batch * times)


def post_validation_step(plan: Plan, workload: Workload, cluster: Cluster,
                         step_fn: StepFn) -> float:
    """Steady-state seconds per iteration when the optimizer step is not synchronised across
    pipeline stages (Qi et al. 2024, Sec. 4 "bypassing optimizer synchronizations": the global
    gradient-norm / NaN all-reduce is replaced by a post-update validation, so each rank starts the
    next iteration right after its own last W and optimizer step, and consecutive iterations
    overlap; ZB-2p's zero bubble depends on it). Measured as the step time of two iterations run
    back to back minus that of one, plus the largest end-of-step op time (the optimizer step that
    the concatenation omits between the two iterations; an upper bound)."""
    one = step_fn(plan, workload, cluster)
    two = step_fn(_repeat(plan, 2), workload, cluster)
    costs = PlanCosts(plan, workload, cluster)
    tail = max(sum(t for _, t in costs.tail(m)) for m in plan.rank_mesh)
    return two - one + tail


def evaluate(setups: Sequence[Setup], device: DeviceProfile, step_fn: StepFn = sim_step
             ) -> tuple[RowResult, ...]:
    """Simulate every setup on ``device`` and convert to the row's metric. ZB-1p / ZB-2p plans are
    first rebuilt for ``device`` (:func:`adapt_plan`) and timed by :func:`post_validation_step`."""
    out = []
    for s in setups:
        cluster = build_cluster(s.row, device)
        if s.plan.schedule.name in ADAPTIVE:
            plan = adapt_plan(s.plan, s.workload, cluster)
            t = post_validation_step(plan, s.workload, cluster, step_fn)
        else:
            t = step_fn(s.plan, s.workload, cluster)
        out.append(RowResult(s, t, metric_from_step(s.row, t)))
    return tuple(out)


def mape(results: Iterable[RowResult]) -> float:
    """Mean absolute percentage error, %."""
    r = [x.ape for x in results]
    return sum(r) / len(r) if r else float("nan")


def ranking_agrees(measured: Mapping[str, float], predicted: Mapping[str, float]) -> bool:
    """Whether ``predicted`` orders the schedules as ``measured`` does (higher = better): every
    pair with different measured values must keep its order; measured ties accept any order."""
    names = sorted(measured)
    if set(names) != set(predicted):
        raise ValidationError(f"ranking over {names} vs {sorted(predicted)}: give the same schedules")
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            dm = measured[a] - measured[b]
            if dm != 0 and (predicted[a] - predicted[b]) * dm <= 0:
                return False
    return True


def zb_rankings(results: Sequence[RowResult]) -> list[tuple[str, dict, dict, bool]]:
    """Per zero-bubble group (same source, model, global batch) with all of :data:`ZB_SCHEDULES`:
    (group, measured by schedule, predicted by schedule, ranking agrees)."""
    groups: dict[str, dict[str, RowResult]] = {}
    for r in results:
        if r.row.schedule in ZB_SCHEDULES and r.row.source == "zb":
            groups.setdefault(f"{r.row.model} b{r.row.global_batch}", {})[r.row.schedule] = r
    out = []
    for g, by in groups.items():
        if set(by) == set(ZB_SCHEDULES):
            m = {k: v.row.value for k, v in by.items()}
            p = {k: v.predicted for k, v in by.items()}
            out.append((g, m, p, ranking_agrees(m, p)))
    return out


# --------------------------------------------------------------------------- calibration
@dataclass(frozen=True, slots=True)
class FitResult:
    matmul: float
    memory: float
    overhead_s: float
    mape: float
    evaluations: int
    trials: tuple[tuple[float, float, float], ...] = field(default=())   # (overhead, matmul, mape)


def fit(setups: Sequence[Setup], device: DeviceProfile, step_fn: StepFn = sim_step, *,
        overheads_s: Sequence[float] = (0.0, 50e-6),
        matmul_bounds: tuple[float, float] = (0.4, 0.95), xatol: float = 2e-3) -> FitResult:
    """Fit ONE set of efficiency values to all ``setups`` (no per-row tuning), minimising the
    mean absolute percentage error: for each fragment overhead in ``overheads_s`` a bounded
    scalar search (scipy ``minimize_scalar``, method ``bounded``) over the matmul efficiency;
    the memory efficiency is kept at the profile's (these rows are compute-bound; see the
    report's memory-bound share). Step times come from ``step_fn``.
    """
    from scipy.optimize import minimize_scalar

    best: FitResult | None = None
    trials, n = [], 0
    for o in overheads_s:
        cache: dict[float, float] = {}

        def loss(e: float) -> float:
            nonlocal n
            if e not in cache:
                n += 1
                cache[e] = mape(evaluate(setups, with_efficiency(device, e, None, o), step_fn))
            return cache[e]

        res = minimize_scalar(loss, bounds=matmul_bounds, method="bounded",
                              options={"xatol": xatol})
        e = round(float(res.x), 3)
        err = loss(e)
        trials.append((o, e, err))
        if best is None or err < best.mape:
            best = FitResult(e, device.memory_efficiency, o, err, 0)
    assert best is not None
    return replace(best, evaluations=n, trials=tuple(trials))


def leave_one_source_out(setups: Sequence[Setup], device: DeviceProfile,
                         step_fn: StepFn = sim_step, **fit_kw) -> dict[str, tuple[FitResult, float]]:
    """For each source: fit on the other sources, then the MAPE on the held-out one, %."""
    out = {}
    for src in dict.fromkeys(s.row.source for s in setups):
        train = [s for s in setups if s.row.source != src]
        test = [s for s in setups if s.row.source == src]
        f = fit(train, device, step_fn, **fit_kw)
        dev = with_efficiency(device, f.matmul, f.memory, f.overhead_s)
        out[src] = (f, mape(evaluate(test, dev, step_fn)))
    return out
