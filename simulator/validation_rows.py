"""Validation rows: a published run (CSV row) -> its workload, cluster and plan, and its metric.

The calibration set is ``reports/validation/published_training.csv`` (a copy of
``/work/shared/validation/published_training.csv``; sources and columns in its README). Every
row is data: its model, hardware, layout and recomputation come from its own columns, never from
the name of its source. A blank field gets one practitioner's rule (:data:`RULES`), printed with
the row as an assumption.

Metrics (each with its source's own FLOP count):

- ``samples_per_gpu_s`` = global_batch / step_time / gpus (Qi et al., ICLR 2024, Tables 3-4);
- ``iteration_s``       = step_time (Korthikanti et al. 2022, Table 5);
- ``tokens_per_gpu_s``  = global_batch x seq_len / step_time / gpus (torchtitan's per-GPU WPS);
- ``tflops_per_gpu``    = F / step_time / gpus / 1e12 with Narayanan et al. (SC 2021) eq. (3):
  ``F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h))`` (FLOPs of one step with activation recomputation);
- ``tflops_per_device`` = MaxText's ``calculate_tflops_training_per_device`` per step / step_time
  (:func:`maxtext_flops`: 3 x (the weight matmuls of every layer + the output projection) + 3 x
  the attention ``Q K^T`` and ``softmax V``, no recomputation counted);
- ``mfu``               = (6 N + 12 L H d s) x tokens / step_time / (gpus x peak) (PaLM's model
  FLOPs, Chowdhery et al. 2022 app. B; torchtitan's ``get_num_flop_per_token``), peak = the row's
  device profile's dense bf16.

Layering: the simulator may not import ``compiler`` beyond its IR, so the workload is built by a
callable the caller passes in (``workload_fn(row) -> Workload``; the CLI builds the row's decoder
through the model zoo). Everything here is a pure function of its inputs.

Cluster (synthetic, per row): ``pp`` meshes ``stage0..stage{pp-1}`` of ``tp*dp`` devices of the
row's device each, axes ``{data: dp, tensor: tp}``, placed in Megatron's rank order (tensor
innermost, then data, then pipeline) on nodes of ``devices_per_node`` devices (the scale-up
fabric inside: NVLink/NVSwitch, or a TPU slice's ICI torus), joined by the scale-out network at
``scale_out_gbit_per_device`` (blank: the device profile's NIC / data-center-network figure). A
link between two pipeline meshes is the scale-up fabric when both lie in one node, else the
scale-out network; its bandwidth is aggregate: every device of the mesh sends its slice of the
activation (Megatron's scatter/gather optimisation, Narayanan et al. Sec. 4.1, and sequence
parallelism split it over tensor parallel). Point-to-point transfers are blocking
(``Cluster.p2p = "blocking"``): Megatron-LM's pipeline schedules wait for each send/receive before
the next compute (``p2p_communication._communicate``), so a sending stage's compute stream is
held for the transfer. Layout: ``Layout(dp, tp)``, with ``fsdp`` when the row says so and, across
``slices`` > 1, hybrid sharding (each slice shards, slices all-reduce: MaxText's
``dcn_data_parallelism``).
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
"""Vocabulary when a row leaves it blank: Megatron-LM's padded GPT-2 vocabulary, which Narayanan et
al. 2021 and Korthikanti et al. 2022 use."""

DEVICES_PER_NODE = 8
"""Devices per node when a row gives neither ``devices_per_node`` nor ``slices``: the 8-GPU HGX /
DGX board (NVIDIA DGX A100 / H100 reference architectures)."""

SCALE_OUT_LATENCY_S = 5e-6
"""Per-message latency of the scale-out network (InfiniBand / RoCE / data-center network): an
estimate (a few us for RDMA send/recv through one switch tier, NCCL inter-node small-message
figures), not a datasheet number."""

LAYERS_PER_CHUNK_MAX = 4
"""Interleaved 1F1B with no published chunk count: one layer per chunk when a rank holds at most
this many layers (Megatron-LM's ``--num-layers-per-virtual-pipeline-stage 1``, the finest
interleaving), else 2 chunks per rank (Narayanan et al. 2021, Sec. 2.2's example)."""

RULES = {
    "vocab": f"{DEFAULT_VOCAB} (Megatron-LM's padded GPT-2 vocabulary)",
    "ffn": "4 x hidden",
    "kv_heads": "heads (multi-head attention)",
    "head_dim": "hidden / heads",
    "glu": "0 (a GeLU MLP, GPT-style: LayerNorm, biases, learned positions)",
    "fsdp": "0 (replicated weights; ZeRO-1 distributed optimizer)",
    "recompute": "none",
    "slices": "1",
    "devices_per_node": f"gpus / slices when slices are given, else {DEVICES_PER_NODE}",
    "scale_out_gbit_per_device": "the device profile's scale-out figure",
    "micro_batch": "1",
    "schedule": "1f1b-interleaved when pp > 1 (Megatron-LM's), else gradient accumulation",
}
"""The practitioner's rule applied to each blank optional field (printed with the row)."""

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

METRICS = ("samples_per_gpu_s", "iteration_s", "tflops_per_gpu", "tflops_per_device",
           "tokens_per_gpu_s", "mfu")

RECOMPUTE = ("none", "selective", "minimal", "full")
"""Recomputation policies: none; selective (Korthikanti et al. 2022: the attention core is
recomputed); minimal (MaxText's ``remat_policy: minimal``, which saves the weight matmuls' outputs
and recomputes the rest: costed as selective); full (the whole forward is recomputed)."""


class ValidationError(CostError):
    """A malformed validation row or an impossible setup (the message names the value and fix)."""


# --------------------------------------------------------------------------- rows
@dataclass(frozen=True, slots=True)
class Row:
    """One published measurement (a CSV row); blank optional fields are None (see :data:`RULES`)."""

    source: str
    model: str
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int | None
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
    ffn: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    glu: bool | None = None
    fsdp: bool | None = None
    recompute: str | None = None
    slices: int | None = None
    devices_per_node: int | None = None
    scale_out_gbit_per_device: float | None = None
    note: str = ""
    line: int = 0

    @property
    def key(self) -> str:
        return f"{self.source}/{self.model}/b{self.global_batch}/{self.schedule or '-'}"

    @property
    def node_size(self) -> int:
        """Devices per node (one scale-up domain): the row's, else the :data:`RULES` rule."""
        if self.devices_per_node:
            return self.devices_per_node
        return self.gpus // self.slices if self.slices else DEVICES_PER_NODE


INT_LIMITS = {"layers": 1024, "hidden": 2**18, "heads": 2**12, "seq_len": 2**22, "vocab": 2**24,
              "gpus": 2**20, "tp": 1024, "pp": 1024, "dp": 2**20, "global_batch": 2**24,
              "micro_batch": 2**24, "microbatches": 2**16, "ffn": 2**20, "kv_heads": 2**12,
              "head_dim": 2**12, "slices": 2**12, "devices_per_node": 2**16}
"""Largest value accepted per integer column (every integer column is at least 1); far above any
published run (at most 128 layers, 8-way tensor and 64-way pipeline parallelism in the sources)."""


OPTIONAL = ("vocab", "micro_batch", "microbatches", "ffn", "kv_heads", "head_dim", "slices",
            "devices_per_node")
"""Integer columns that may be blank (:data:`RULES` fills them)."""


def _int(d: Mapping[str, str], k: str, line: int) -> int | None:
    v = (d.get(k) or "").strip()
    if not v:
        if k not in OPTIONAL:
            raise ValidationError(f"row {line}: field {k!r} is blank; fill it in")
        return None
    try:
        x = int(v)
    except ValueError:
        raise ValidationError(f"row {line}: {k}={v[:40]!r} is not an integer; fix the CSV") from None
    if not 1 <= x <= INT_LIMITS[k]:
        raise ValidationError(f"row {line}: {k}={x} is out of range; fix the CSV (an integer from 1 "
                              f"to {INT_LIMITS[k]})")
    return x


def _flag(d: Mapping[str, str], k: str, line: int) -> bool | None:
    v = (d.get(k) or "").strip()
    if not v:
        return None
    if v not in ("0", "1"):
        raise ValidationError(f"row {line}: {k}={v[:40]!r} is not 0 or 1; fix the CSV (or leave it "
                              f"blank)")
    return v == "1"


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
            raise ValidationError(f"row {line}: schedule {sched[:40]!r} unknown; fix: use one of "
                                  f"{', '.join(sorted(SCHEDULE_MAP))} or leave it blank")
        metric = (d.get("metric") or "").strip()
        if metric not in METRICS:
            raise ValidationError(f"row {line}: metric {metric[:40]!r} unknown; fix: use one of "
                                  f"{', '.join(METRICS)}")
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
        rc = (d.get("recompute") or "").strip() or None
        if rc is not None and rc not in RECOMPUTE:
            raise ValidationError(f"row {line}: recompute {rc[:40]!r} unknown; fix: use one of "
                                  f"{', '.join(RECOMPUTE)} or leave it blank")
        so = (d.get("scale_out_gbit_per_device") or "").strip()
        try:
            scale_out = float(so) if so else None
        except ValueError:
            raise ValidationError(f"row {line}: scale_out_gbit_per_device={so[:40]!r} is not a "
                                  f"number; fix the CSV") from None
        if scale_out is not None and not 1e-3 <= scale_out <= 1e6:
            raise ValidationError(f"row {line}: scale_out_gbit_per_device={scale_out!r} is out of "
                                  f"range; fix the CSV (Gb/s per device, 0.001 to 1e6)")
        r = Row(source=_field(d, "source", line), model=_field(d, "model", line),
                layers=_int(d, "layers", line), hidden=_int(d, "hidden", line),
                heads=_int(d, "heads", line), seq_len=_int(d, "seq_len", line),
                vocab=_int(d, "vocab", line), device=device,
                gpus=_int(d, "gpus", line), tp=_int(d, "tp", line), pp=_int(d, "pp", line),
                dp=_int(d, "dp", line), global_batch=_int(d, "global_batch", line),
                micro_batch=_int(d, "micro_batch", line), microbatches=_int(d, "microbatches", line),
                schedule=sched, metric=metric, value=value, ffn=_int(d, "ffn", line),
                kv_heads=_int(d, "kv_heads", line), head_dim=_int(d, "head_dim", line),
                glu=_flag(d, "glu", line), fsdp=_flag(d, "fsdp", line), recompute=rc,
                slices=_int(d, "slices", line), devices_per_node=_int(d, "devices_per_node", line),
                scale_out_gbit_per_device=scale_out, note=(d.get("note") or "").strip(), line=line)
        if r.kv_heads is not None and r.heads % r.kv_heads:
            raise ValidationError(f"row {line}: heads={r.heads} is not a multiple of kv_heads="
                                  f"{r.kv_heads}; fix the row")
        if r.head_dim is None and r.hidden % r.heads:
            raise ValidationError(f"row {line}: hidden={r.hidden} is not a multiple of heads="
                                  f"{r.heads}; fix the row or give head_dim")
        if r.slices and (r.gpus % r.slices or (r.dp * r.pp) % r.slices):
            raise ValidationError(f"row {line}: slices={r.slices} does not divide the data-parallel "
                                  f"devices (gpus={r.gpus}, dp={r.dp}); fix the row")
        if r.tp * r.pp * r.dp != r.gpus:
            raise ValidationError(f"row {line}: tp*pp*dp = {r.tp * r.pp * r.dp} != gpus={r.gpus}; "
                                  f"fix the layout")
        per = r.dp * (r.micro_batch or 1) * (r.microbatches or 1)
        if (r.micro_batch and r.microbatches and r.tp > 1 and per != r.global_batch
                and per * r.tp == r.global_batch):
            # the micro batch is per device, every chip counted (MaxText's per_device_batch_size)
            r = replace(r, micro_batch=r.micro_batch * r.tp)
            per = r.global_batch
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
    """(micro_batch, simulator schedule, virtual_stages, recompute, assumptions) for ``row``:
    its own fields, and the :data:`RULES` rule for each blank one (listed in the assumptions)."""
    notes: list[str] = []
    for k in ("vocab", "ffn", "kv_heads", "head_dim", "glu", "fsdp", "recompute",
              "devices_per_node", "scale_out_gbit_per_device"):
        if getattr(row, k) is None:
            if k == "kv_heads" and row.glu is None:
                continue                      # a GPT-style row: multi-head attention is implied
            if k == "devices_per_node" and row.slices:
                notes.append(f"{row.node_size} devices per slice")
                continue
            if k in ("glu", "fsdp") or (k == "scale_out_gbit_per_device" and row.gpus <= row.node_size):
                continue                      # the defaults of the format; one node: no network
            notes.append(f"{k}: {RULES[k]}")
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
        per_rank = -(-row.layers // row.pp)
        v = max(2, per_rank) if per_rank <= LAYERS_PER_CHUNK_MAX else 2
        notes.append(f"{v} virtual stages")
    if sched in ("zb-1p", "zb-2p"):
        notes.append("auto schedule from the row's costs; post-validation")
    recompute = row.recompute or "none"
    if recompute != "none":
        notes.append(f"{recompute} recompute" + (" (costed as selective)"
                                                 if recompute == "minimal" else ""))
    if row.fsdp and (row.slices or 1) > 1:
        notes.append(f"hybrid sharding: fsdp within each of {row.slices} slices")
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


def _same_node(a: int, b: int, n: int, node: int) -> bool:
    """Meshes ``a`` and ``b`` of ``n`` devices each (Megatron rank order) lie in one node of
    ``node`` devices."""
    ranks = [r for m in (a, b) for r in (m * n, (m + 1) * n - 1)]
    return len({r // node for r in ranks}) == 1


def cluster_name(row: Row) -> str:
    return f"{row.source}-{row.model}-{row.device}x{row.gpus}"


def build_cluster(row: Row, device: DeviceProfile) -> Cluster:
    """The row's synthetic cluster of ``device`` (see the module docstring)."""
    n, node = row.tp * row.dp, row.node_size
    fabric = "ICI torus (profile)" if device.torus_dims else "NVLink / NVSwitch (profile)"
    intra = Link(device.scale_up_bandwidth, device.scale_up_latency, fabric)
    if row.scale_out_gbit_per_device is not None:
        out = Link(row.scale_out_gbit_per_device * 1e9 / 8, SCALE_OUT_LATENCY_S,
                   f"{row.scale_out_gbit_per_device:g} Gb/s per device (the row's)")
    else:
        out = Link(device.scale_out_bandwidth, SCALE_OUT_LATENCY_S,
                   f"{device.name} scale-out (profile; not published for the row)")
    meshes = {}
    for k in range(row.pp):
        big = n > node
        meshes[f"stage{k}"] = MeshSpec(
            name=f"stage{k}", device=device, num_devices=n, axes={"data": row.dp, "tensor": row.tp},
            intra_link=intra, devices_per_node=node if big else None,
            scale_out_link=out if big else None)
    links = []
    pairs = {(k, k + 1) for k in range(row.pp - 1)} | ({(0, row.pp - 1)} if row.pp > 2 else set())
    for a, b in sorted(pairs):
        per = intra if _same_node(a, b, n, node) else out
        links.append(InterMeshLink(f"stage{a}", f"stage{b}",
                                   Link(per.bandwidth * n, per.latency, per.source)))
    return Cluster(name=cluster_name(row), meshes=meshes, links=tuple(links),
                   description=f"synthetic {device.name} cluster for validation", p2p="blocking")


def row_layout(row: Row) -> Layout:
    """``Layout(dp, tp)``; with ``fsdp``, sharded over each slice's devices and replicated across
    slices (hybrid sharding) when ``slices`` > 1."""
    fsdp = bool(row.fsdp) and row.dp > 1
    hsdp = (row.slices or 1) if fsdp else 1
    return Layout(row.dp, row.tp, fsdp=fsdp, hsdp=hsdp if row.dp % hsdp == 0 else 1)


def selective_recompute(workload: Workload, width: int) -> Workload:
    """The workload under Korthikanti et al.'s selective recomputation: each decoder block's
    backward first recomputes its attention core (``Q K^T`` and ``softmax . V``: ``4 s^2 w`` FLOP
    per sample, ``w`` = heads x head width, Korthikanti et al. 2022 Sec. 5; no causal saving, as in
    Megatron). The residuals are unchanged: the traced ones already exclude the ``s x s`` scores
    (flash-attention style), which is exactly what selective recomputation drops."""
    extra = 4.0 * workload.seq_len ** 2 * width
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
    layout :func:`row_layout` per mesh, ``global_batch / (micro_batch * dp)`` microbatches.

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
    return Plan(model=workload.model, cluster=cluster_name(row),
                stages=tuple(stages), layouts={m: row_layout(row) for m in meshes},
                schedule=table, rank_mesh=meshes, merge_last_stage=False,
                global_batch=row.global_batch, seq_len=row.seq_len,
                devices={m: (row.device, row.tp * row.dp) for m in meshes},
                recompute={m: recompute for m in meshes})


def row_setup(row: Row, workload_fn: Callable[[Row], Workload]) -> Setup:
    """Build the :class:`Setup` of ``row``; ``workload_fn(row)`` costs its model (see module doc)."""
    mb, name, v, rc, notes = _choices(row)
    w = workload_fn(row)
    if rc in ("selective", "minimal"):
        w = selective_recompute(w, row.heads * (row.head_dim or row.hidden // row.heads))
    plan = build_plan(row, w, schedule=name, micro_batch=mb, virtual_stages=v,
                      recompute=rc == "full")
    return Setup(row, mb, plan.microbatches, name, v, rc, tuple(notes), w, plan)


# --------------------------------------------------------------------------- metrics
def narayanan_flops(batch: int, seq_len: int, layers: int, hidden: int, vocab: int) -> float:
    """FLOPs of one training step with activation recomputation, Narayanan et al. 2021 eq. (3):
    ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``."""
    B, s, l, h, V = batch, seq_len, layers, hidden, vocab
    return 96.0 * B * s * l * h * h * (1.0 + s / (6.0 * h) + V / (16.0 * l * h))


def maxtext_flops(row: Row) -> float:
    """FLOPs of one training step as MaxText counts them (``maxtext_utils.
    calculate_tflops_training_per_device``, at the configs' date): per token, 2 x the weight
    matmuls of a layer (FFN: ``emb x ffn`` x 3 with a gated MLP, else x 2; QKV ``emb x (H + 2 KV)
    d``; output projection ``H d x emb``) times the layers, plus the vocabulary projection ``emb x
    V``, all x 3 (forward and backward); plus the attention ``4 s H d`` per token per layer x 3 (no
    causal saving). Recomputation is not counted."""
    h, H = row.hidden, row.heads
    kv, d = row.kv_heads or H, row.head_dim or h // H
    ffn = row.ffn or 4 * h
    weights = h * ffn * (3 if row.glu else 2) + h * (H + 2 * kv) * d + H * d * h
    tokens = row.global_batch * row.seq_len
    per_token = 2 * (weights * row.layers + h * (row.vocab or DEFAULT_VOCAB))
    attention = 4 * row.seq_len * H * d * row.layers
    return 3.0 * tokens * (per_token + attention)


def palm_flops(row: Row) -> float:
    """Model FLOPs of one step, ``(6 N + 12 L H d s) x tokens`` (Chowdhery et al. 2022, app. B;
    torchtitan's ``get_num_flop_per_token``), ``N`` the parameters outside the input embedding."""
    h, H = row.hidden, row.heads
    kv, d = row.kv_heads or H, row.head_dim or h // H
    ffn = row.ffn or 4 * h
    per_layer = h * ffn * (3 if row.glu else 2) + h * (H + 2 * kv) * d + H * d * h
    n = per_layer * row.layers + h * (row.vocab or DEFAULT_VOCAB)
    tokens = row.global_batch * row.seq_len
    return (6.0 * n + 12.0 * row.layers * H * d * row.seq_len) * tokens


def metric_from_step(row: Row, step_s: float, peak_flops: float = 0.0) -> float:
    """The row's metric for a step of ``step_s`` seconds (see the module docstring);
    ``peak_flops`` (the device's dense bf16 FLOP/s) is needed for ``mfu`` only.

    Raises:
        ValidationError: an unknown metric, or ``mfu`` without a peak.
    """
    if row.metric == "iteration_s":
        return step_s
    if row.metric == "samples_per_gpu_s":
        return row.global_batch / step_s / row.gpus
    if row.metric == "tokens_per_gpu_s":
        return row.global_batch * row.seq_len / step_s / row.gpus
    if row.metric == "tflops_per_gpu":
        f = narayanan_flops(row.global_batch, row.seq_len, row.layers, row.hidden,
                            row.vocab or DEFAULT_VOCAB)
        return f / step_s / row.gpus / 1e12
    if row.metric == "tflops_per_device":
        return maxtext_flops(row) / step_s / row.gpus / 1e12
    if row.metric == "mfu":
        if not peak_flops > 0:
            raise ValidationError(f"{row.key}: metric mfu needs the device's peak FLOP/s")
        return palm_flops(row) / step_s / (row.gpus * peak_flops)
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
