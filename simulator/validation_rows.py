"""Validation rows: a published run (CSV row) -> its workload, cluster and plan, and its metric.

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
taken as 100 Gb/s per GPU: :data:`ZB_ROCE_BANDWIDTH`). A link between two pipeline meshes is NVLink
when both lie in one node, else the scale-out network; its bandwidth is aggregate: every device of the mesh sends its
slice of the activation (data parallel splits the batch; Megatron's scatter/gather optimisation,
Narayanan et al. Sec. 4.1, and sequence parallelism, Korthikanti et al., split it over tensor parallel).
Point-to-point transfers are blocking (``Cluster.p2p = "blocking"``): all three sources ran Megatron-LM,
whose pipeline schedules wait for each send/receive before the next compute
(``p2p_communication._communicate``: ``batch_isend_irecv`` then ``wait`` on every request, then a
device synchronize), so a sending stage's compute stream is held for the transfer.
"""


from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping

from compiler.ir import Layout, Plan, StagePlan, Workload
from hardware_profiles.types import Cluster, DeviceProfile, InterMeshLink, Link, MeshSpec
from simulator.plan_costs import CostError
from simulator.schedules import generate

DEFAULT_VOCAB = 51200
"""Vocabulary when a row leaves it blank (Narayanan et al. 2021 and Korthikanti et al. 2022 use 51200)."""

DEVICES_PER_NODE = 8
"""GPUs per DGX A100 node (NVIDIA DGX A100 reference architecture)."""

SCALE_OUT_LATENCY_S = 5e-6
"""Per-message latency of HDR InfiniBand / RoCE between nodes: an estimate (a few us for RDMA
send/recv through one switch tier, NCCL inter-node small-message figures), not a datasheet number."""

ZB_ROCE_BANDWIDTH = 100e9 / 8
"""Per-GPU RoCE bandwidth of Qi et al.'s cluster, B/s (100 Gb/s per direction). Not published
("4 nodes interconnected by a RoCE RDMA network"); of the two common A100 builds, 100 and 200 Gb/s
per GPU, 100 gives the lower error on the only rows that cross nodes (14.6B, 16 stages on two
nodes: the interleaved rows are 6.6 / 5.5 / 4.0% fast at 200 Gb/s, see the closing note of issue 3).
A choice made against the data, stated as such."""

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


INT_LIMITS = {"layers": 1024, "hidden": 2**18, "heads": 2**12, "seq_len": 2**22, "vocab": 2**24,
              "gpus": 2**20, "tp": 1024, "pp": 1024, "dp": 2**20, "global_batch": 2**24,
              "micro_batch": 2**24, "microbatches": 2**16}
"""Largest value accepted per integer column (every integer column is at least 1); far above any
published run (at most 128 layers, 8-way tensor and 64-way pipeline parallelism in the sources)."""


def _int(d: Mapping[str, str], k: str, line: int, default: int | None = None) -> int | None:
    v = (d.get(k) or "").strip()
    if not v:
        if default is None and k not in ("micro_batch", "microbatches"):
            raise ValidationError(f"row {line}: field {k!r} is blank; fill it in")
        return default
    try:
        x = int(v)
    except ValueError:
        raise ValidationError(f"row {line}: {k}={v[:40]!r} is not an integer; fix the CSV") from None
    if not 1 <= x <= INT_LIMITS[k]:
        raise ValidationError(f"row {line}: {k}={x} is out of range; fix the CSV (an integer from 1 "
                              f"to {INT_LIMITS[k]})")
    return x


def _field(d: Mapping[str, str | None], k: str, line: int) -> str:
    v = d.get(k)
    if not isinstance(v, str) or not v.strip():
        raise ValidationError(f"row {line}: field {k!r} is blank; fill it in")
    return v.strip()


def load_rows(path: str | Path) -> tuple[Row, ...]:
    """Parse the published-training CSV (header as in ``published_training.csv``), read through
    the tool's guarded reader (:func:`mpmd.files.read_csv_rows`: size, UTF-8, no binary files).

    Raises:
        ValidationError: an unreadable file, a missing or malformed field, an integer out of
            range (:data:`INT_LIMITS`), a device that is not a bundled profile id
            (:func:`hardware_profiles.loader.known_device_ids`), an unknown metric or schedule, a
            value that is not a finite positive number, ``tp * pp * dp != gpus``, or micro
            batches that do not divide the global batch.
    """
    from hardware_profiles.loader import known_device_ids
    from mpmd.files import InputError, read_csv_rows

    try:
        records = read_csv_rows(path, "validation CSV")
    except InputError as e:
        raise ValidationError(str(e)) from None
    if not records:
        raise ValidationError(f"{path}: validation CSV has no rows; fix: add published runs below the header")
    known = known_device_ids()
    rows = []
    for line, d in enumerate(records, start=2):
        if None in d:
            raise ValidationError(f"row {line}: {len(d) - 1 + len(d[None])} fields, more than the "
                                  f"{len(d) - 1} columns of the header; fix the row")
        sched = (d.get("schedule") or "").strip() or None
        if sched is not None and sched not in SCHEDULE_MAP:
            raise ValidationError(f"row {line}: schedule {sched[:40]!r} unknown; use one of "
                                  f"{sorted(SCHEDULE_MAP)} or leave it blank")
        metric = (d.get("metric") or "").strip()
        if metric not in METRICS:
            raise ValidationError(f"row {line}: metric {metric[:40]!r} unknown; use one of {METRICS}")
        device = _field(d, "device", line)
        if device not in known:
            raise ValidationError(f"row {line}: device {device[:40]!r} is not a known profile; "
                                  f"fix: use one of {known}")
        try:
            value = float(d["value"])
        except (KeyError, TypeError, ValueError):
            raise ValidationError(f"row {line}: value {str(d.get('value'))[:40]!r} is not a number; "
                                  f"fix the CSV") from None
        if not 0 < value < 1e12:
            raise ValidationError(f"row {line}: value {value!r} is not a finite positive number; "
                                  f"fix the CSV")
        r = Row(source=_field(d, "source", line), model=_field(d, "model", line),
                layers=_int(d, "layers", line), hidden=_int(d, "hidden", line),
                heads=_int(d, "heads", line), seq_len=_int(d, "seq_len", line),
                vocab=_int(d, "vocab", line, DEFAULT_VOCAB), device=device,
                gpus=_int(d, "gpus", line), tp=_int(d, "tp", line), pp=_int(d, "pp", line),
                dp=_int(d, "dp", line), global_batch=_int(d, "global_batch", line),
                micro_batch=_int(d, "micro_batch", line), microbatches=_int(d, "microbatches", line),
                schedule=sched, metric=metric, value=value)
        if r.tp * r.pp * r.dp != r.gpus:
            raise ValidationError(f"row {line}: tp*pp*dp = {r.tp * r.pp * r.dp} != gpus={r.gpus}; "
                                  f"fix the layout")
        per = r.dp * (r.micro_batch or 1) * (r.microbatches or 1)
        if r.global_batch % per or (r.micro_batch and r.microbatches and per != r.global_batch):
            raise ValidationError(
                f"row {line}: global_batch {r.global_batch} is not micro_batch x microbatches x dp "
                f"({r.micro_batch or '-'} x {r.microbatches or '-'} x {r.dp}); fix the row")
        if r.global_batch // (r.dp * (r.micro_batch or 1)) > INT_LIMITS["microbatches"]:
            raise ValidationError(
                f"row {line}: global_batch {r.global_batch} makes over {INT_LIMITS['microbatches']} "
                f"microbatches per pipeline; fix the row (set micro_batch)")
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
    if row.source == "zb":
        out = Link(ZB_ROCE_BANDWIDTH, SCALE_OUT_LATENCY_S,
                   "RoCE (Qi et al. 2024), bandwidth not published: taken as 100 Gb/s per GPU")
    else:
        out = Link(device.scale_out_bandwidth, SCALE_OUT_LATENCY_S,
                   "InfiniBand HDR 200 Gb/s per GPU (DGX A100)")
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
                   links=tuple(links), description="synthetic DGX A100 cluster for validation",
                   p2p="blocking")


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
                    memory: float | None = None, overhead_s: float | None = None,
                    elementwise: float | None = None) -> DeviceProfile:
    """``device`` with the given efficiency values (None keeps the profile's)."""
    return replace(device,
                   matmul_efficiency=device.matmul_efficiency if matmul is None else matmul,
                   memory_efficiency=device.memory_efficiency if memory is None else memory,
                   fragment_overhead=device.fragment_overhead if overhead_s is None else overhead_s,
                   elementwise_traffic=(device.elementwise_traffic if elementwise is None
                                        else elementwise))
