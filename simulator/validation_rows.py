"""Validation rows: a published run (CSV row), parsed and checked, and its metric.

The calibration set is ``reports/validation/published_training.csv`` (a copy of
``/work/shared/validation/published_training.csv``; sources and columns in its README). Every
row is data: its model, hardware, layout and recomputation come from its own columns, never from
the name of its source. A blank field is None here; :data:`simulator.validation_setup.RULES` fills
it, printed with the row as an assumption.

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
  device profile's dense bf16; a fraction (0.45, not 45). The count equals :func:`maxtext_flops`
  (6 x the weight matmuls incl. the vocabulary projection + 12 L H d s per token), so it is also
  MaxText's MFU (its TFLOP/s per device over the peak).

A row may give ``per_device_batch`` (MaxText's ``per_device_batch_size``, every chip counted)
instead of ``global_batch``: global batch = per_device_batch x gpus.

A row may give the peak memory per device its source measured (``peak_memory_gb``, decimal GB,
or ``peak_memory_gib``, GiB as PyTorch and ``nvidia-smi`` print it; converted to bytes here, both
given is an error): ``mpmd validate`` checks the model's peak against it. Sources measure what
their allocator holds (PyTorch's ``max_memory_reserved``, ``nvidia-smi``'s used memory), so the
published figure is an upper reading of the live bytes the model counts; each row's note says
which reading it is. ``cross_entropy`` says how the run computed its loss
(:data:`ir.workload.CROSS_ENTROPY`: ``fused``, the blank default, ``fp32``, Megatron-Core's own,
or ``eager``, PyTorch's op by op, as torchtitan did): the loss's logits in the model's peak.
``cp_comm`` says how context parallelism exchanged keys and values (:data:`CP_COMM`), and
``saved_inputs`` what a low-precision recipe kept of its GEMMs' inputs
(:data:`ir.workload.SAVED_INPUTS`: ``format``, the blank default, or ``compute``).

A row may name its model (``model_config``: a zoo name or a model file, resolved by the caller's
``fill`` hook, which fills the blank :data:`SHAPE_COLUMNS`; the simulator imports no zoo) and its
context, virtual-pipeline and expert degrees (``cp``: gpus = tp x pp x dp x cp, dp excluding cp;
a blank ``dp`` is what that leaves, as NVIDIA's tables, which print no DP, imply; ``vp``; ``ep``
and ``etp``); how each is simulated is :mod:`simulator.validation_setup`. A row may
give its ``pipeline_layout`` (Megatron-Core's ``--pipeline-model-parallel-layout`` string:
:mod:`simulator.pipeline_layout`): it is parsed and checked against ``pp``, ``vp`` and the
model's layers here, and a blank ``vp`` is the layout's (its stages / pp, as Megatron-Core
derives it).

Loading (:func:`load_rows_lenient`) separates the rows that parse from those that do not: a row
with a bad value is a :class:`SkippedRow` (its line and the one-line reason); a problem with the
file itself (unreadable, no rows, a header missing a column) raises. :func:`load_rows` is the
strict form: the first bad row raises.

The setup each row is simulated as (cluster, plan, recomputation, the rule for each blank field) is
:mod:`simulator.validation_setup`.
"""


from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence, cast

from ir.plan import CONTEXT_METHODS, GRAD_REDUCE, OPTIMIZER_STATES
from ir.precision import RECIPES, canonical_precision
from ir.workload import ATTENTION_KERNELS, CROSS_ENTROPY, SAVED_INPUTS
from simulator import remat
from simulator.plan_costs import CostError
from simulator.pipeline_layout import LayoutError, check_layout, parse_layout
from simulator.schedules import KINDS, stages_per_rank
from hardware_profiles.loader import canonical_device, known_device_ids
from ir.files import InputError, read_csv_rows


DEFAULT_VOCAB = 51200
"""Vocabulary when a row leaves it blank: Megatron-LM's padded GPT-2 vocabulary, which Narayanan et
al. 2021 and Korthikanti et al. 2022 use."""

DEVICES_PER_NODE = 8
"""Devices per node when a row gives neither ``devices_per_node`` nor ``slices``: the 8-GPU HGX /
DGX board (NVIDIA DGX A100 / H100 reference architectures)."""

SCHEDULE_MAP = {**{n: n for n in KINDS}, **{a: n for n, k in KINDS.items() for a in k.aliases}}
"""CSV schedule -> simulator schedule. Qi et al.'s ZB-1p / ZB-2p are found by their automatic
scheduler over the profiled stage times under a 1p / 2p activation-memory limit (Sec. 3):
:mod:`simulator.schedules.adaptive`, rebuilt for each device from the row's own fragment and
transfer times (:func:`adapt_plan`)."""

ZB_SCHEDULES = ("1f1b", "1f1b-interleaved", "zb-1p", "zb-2p")

INTERLEAVED = ("interleaved-1f1b", "interleaved-1f1b-a2a")
"""The simulator's interleaved schedules: ``v`` chunks per rank, the row's ``vp`` (or tuned)."""

METRICS = ("samples_per_gpu_s", "iteration_s", "tflops_per_gpu", "tflops_per_device",
           "tokens_per_gpu_s", "mfu")

RECOMPUTE = remat.NAMES
"""Recomputation policies the ``recompute`` column accepts (case-insensitive): none; selective
(Korthikanti et al. 2022: the attention core is recomputed); full (the whole forward is
recomputed); MaxText's ``remat_policy`` names (minimal, save_dot_except_mlp, ..., the
``*_offloaded`` ones); Megatron-Core's named modules as ``modules:core_attn,moe_act,...``
(:data:`simulator.remat.MODULES`). What each keeps, reruns and offloads, and how it is costed:
:mod:`simulator.remat`."""

REQUIRED = ("source", "model", "layers", "hidden", "heads", "seq_len", "device", "gpus", "tp", "pp",
            "metric", "value")
"""Columns the header must name (and ``global_batch`` or ``per_device_batch``), but for the
:data:`SHAPE_COLUMNS` among them, which a row's model may fill."""

COLUMNS_OPTIONAL = ("dp", "vocab", "global_batch", "per_device_batch", "micro_batch", "microbatches", "schedule",
            "ffn", "kv_heads", "head_dim", "glu", "fsdp", "recompute", "slices",
            "devices_per_node", "scale_out_gbit_per_device", "power_limit_w",
            "memory_bandwidth_gb_per_s", "eager", "tp_overlap", "attention", "precision", "note",
            "model_config", "cp", "vp", "ep", "etp", "scale_up_domain", "dispatcher",
            "pipeline_layout", "offload_layers", "bf16_first_layers", "bf16_last_layers",
            "grad_reduce", "optimizer_state", "peak_memory_gb", "peak_memory_gib",
            "cross_entropy", "cp_comm", "saved_inputs")
"""Columns a header may name besides :data:`REQUIRED`; any other is an error naming it (a
column the reader would ignore would score a run as something it was not)."""

SHAPE_COLUMNS = ("layers", "hidden", "heads", "vocab", "ffn", "kv_heads", "head_dim", "glu")
"""The model-shape columns a ``model_config`` may fill: blank ones are filled from the model (a
``fill`` hook of :func:`load_rows_lenient`, e.g. the CLI's, which reads the model zoo), given ones
must agree with it. The header may leave the required ones (``layers``, ``hidden``, ``heads``)
out: a row then names its model (``model_config``, or a ``model`` the hook resolves) or is skipped
for the blank field."""


COMPUTE_DTYPES = ("bf16", "fp16", "fp32")
"""``precision`` values naming a compute dtype (the model built in it, every GEMM in it: no
low-precision recipe): ``bf16``; ``fp16``, mixed precision with FP16 activations and FP32 master
weights and loss scaling (Micikevicius et al., "Mixed Precision Training", ICLR 2018: PyTorch AMP,
TensorFlow's automatic mixed precision), the 16-bit format of a device without BF16 (a V100);
``fp32``. A blank ``precision`` is bf16, or fp16 where the row's device has no bf16 rate
(:func:`simulator.validation_setup.row_precision`, stated with the row)."""


class ValidationError(CostError):
    """A malformed validation row or an impossible setup (the message names the value and fix)."""


@dataclass(frozen=True, slots=True)
class SkippedRow:
    """A row that is not simulated: its CSV line, source and model (as written, possibly blank)
    and the one-line reason (naming the bad value and the fix)."""

    line: int
    source: str
    model: str
    reason: str

    @property
    def message(self) -> str:
        """``row N: reason``, the error the strict form raises."""
        return f"row {self.line}: {self.reason}"


def skipped(line: int, source: str, model: str, error: BaseException) -> SkippedRow:
    """The :class:`SkippedRow` of ``error`` raised for the row at ``line`` (its ``row N: `` prefix
    dropped from the reason, the first line only)."""
    text = (str(error).splitlines() or [type(error).__name__])[0]
    prefix = f"row {line}: "
    return SkippedRow(line, source, model, text[len(prefix):] if text.startswith(prefix) else text)


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
    power_limit_w: float | None = None
    memory_bandwidth_gb_per_s: float | None = None
    eager: bool | None = None
    tp_overlap: bool | None = None
    attention: str | None = None
    precision: str = "bf16"
    note: str = ""
    line: int = 0
    per_device_batch: float | None = None
    global_batch_derived: bool = False
    model_config: str | None = None
    cp: int = 1
    vp: int | None = None
    ep: int = 1
    etp: int | None = None
    scale_up_domain: int | None = None
    dispatcher: str | None = None
    grad_reduce: str = "fp32"
    optimizer_state: str = "fp32"
    pipeline_layout: str | None = None
    precision_given: bool = True
    offload_layers: int = 0
    bf16_first_layers: int = 0
    bf16_last_layers: int = 0
    microbatches_published: int | None = None
    peak_memory_bytes: float | None = None
    cross_entropy: str = "fused"
    cp_comm: str = "ring"
    saved_inputs: str = "format"

    @property
    def dtype(self) -> str:
        """The compute dtype its model is built in (``"bf16"``, ``"fp16"``, ``"fp32"``): the
        ``precision`` column's when it names one of :data:`COMPUTE_DTYPES`, else bf16 (every
        recipe of :mod:`ir.precision` computes in BF16 around its GEMMs)."""
        return self.precision if self.precision in COMPUTE_DTYPES else "bf16"

    @property
    def recipe(self) -> str:
        """Its training precision recipe (:data:`ir.precision.RECIPES`): the ``precision``
        column's, ``"bf16"`` (every GEMM in the compute dtype) for a compute dtype."""
        return self.precision if self.precision in RECIPES else "bf16"

    @property
    def low_precision(self) -> bool:
        """Whether its recipe runs GEMMs below the compute dtype (FP8, FP4): ``--fit`` fits
        those rows' format efficiency, the others the kind's own efficiencies."""
        return RECIPES[self.recipe].low_precision

    @property
    def replicas(self) -> int:
        """Devices of a pipeline stage that hold the same parameters (tensor parallel apart):
        ``dp x cp`` (:attr:`ir.Layout.replicas`; gradients are reduced over them)."""
        return self.dp * self.cp

    @property
    def key(self) -> str:
        return f"{self.source}/{self.model}/b{self.global_batch}/{self.schedule or '-'}"

    @property
    def node_size(self) -> int:
        """Devices per node (one scale-up domain): the row's ``scale_up_domain`` (a fabric over
        several hosts: a GB200 NVL72 rack), its ``devices_per_node``, else the :data:`RULES`
        rule (``simulator.validation_setup.node_devices`` also asks the device profile)."""
        if self.scale_up_domain:
            return self.scale_up_domain
        if self.devices_per_node:
            return self.devices_per_node
        return self.gpus // self.slices if self.slices else DEVICES_PER_NODE


CP_COMM = {"ring": "ring", "p2p": "ring", "allgather": "allgather", "alltoall": "alltoall",
           "a2a": "alltoall"}
"""The ``cp_comm`` column's values (how a context-parallel group's attention reaches the other
chunks' keys and values, as Megatron-Core's ``--cp-comm-type`` and PyTorch's context parallel's
``rotate_method`` name it; ``_`` ignored) -> :attr:`ir.Layout.context_method`: ``p2p``/``ring``
the overlapped ring (the blank default), ``all_gather`` the keys and values gathered before the
attention, ``a2a`` DeepSpeed-Ulysses' all-to-alls."""


DISPATCHERS = {"alltoall": "alltoall", "deepep": "deepep", "hybridep": "deepep",
               "flex": "deepep", "tokendrop": "tokendrop"}
"""The ``dispatcher`` column's values (Megatron-Core's token dispatcher as a run names it) ->
:attr:`ir.Layout.expert_dispatch`: ``alltoall`` one NCCL all-to-all; DeepEP and HybridEP (the
``flex`` dispatcher's backends) two hops, RDMA once per remote node then NVLink; these three
dropless. ``tokendrop``: the ``alltoall`` dispatcher with a capacity factor and each expert's
input padded to capacity (a run its source labels token-dropping)."""

INT_LIMITS = {"layers": 1024, "hidden": 2**18, "heads": 2**12, "seq_len": 2**22, "vocab": 2**24,
              "gpus": 2**20, "tp": 1024, "pp": 1024, "dp": 2**20, "global_batch": 2**24,
              "micro_batch": 2**24, "microbatches": 2**16, "ffn": 2**20, "kv_heads": 2**12,
              "head_dim": 2**12, "slices": 2**12, "devices_per_node": 2**16, "cp": 1024,
              "vp": 1024, "ep": 2**16, "etp": 1024, "scale_up_domain": 2**16,
              "offload_layers": 1024, "bf16_first_layers": 1024, "bf16_last_layers": 1024}
"""Largest value accepted per integer column (every integer column is at least 1); far above any
published run (at most 128 layers, 8-way tensor and 64-way pipeline parallelism in the sources)."""


OPTIONAL = ("dp", "vocab", "micro_batch", "microbatches", "ffn", "kv_heads", "head_dim", "slices",
            "devices_per_node", "global_batch", "cp", "vp", "ep", "etp", "scale_up_domain",
            "offload_layers", "bf16_first_layers", "bf16_last_layers")
"""Integer columns that may be blank (:data:`RULES` fills them)."""


NOT_STATED = ("na", "n/a", "-", "none", "null")
"""Cell values a published table prints for a degree it does not use or state (``VP``: ``NA``),
read as blank in the :data:`OPTIONAL` integer columns."""


def _int(d: Mapping[str, str], k: str, line: int) -> int | None:
    v = (d.get(k) or "").strip()
    if k in OPTIONAL and v.lower() in NOT_STATED:
        v = ""
    if not v:
        if k not in OPTIONAL:
            hint = (" (or have the model_config filled in: mpmd validate does)"
                    if k in SHAPE_COLUMNS and (d.get("model_config") or "").strip() else "")
            raise ValidationError(f"row {line}: field {k!r} is blank; fill it in{hint}")
        return None
    try:
        x = int(v)
    except ValueError:
        raise ValidationError(f"row {line}: {k}={v[:40]!r} is not an integer; fix the CSV") from None
    if not 1 <= x <= INT_LIMITS[k]:
        raise ValidationError(f"row {line}: {k}={x} is out of range; fix the CSV (an integer from 1 "
                              f"to {INT_LIMITS[k]})")
    return x


def _required_int(d: Mapping[str, str], k: str, line: int) -> int:
    """:func:`_int` of a column not in :data:`OPTIONAL` (blank raises there, so never None)."""
    x = _int(d, k, line)
    assert x is not None, k
    return x


def _flag(d: Mapping[str, str], k: str, line: int) -> bool | None:
    v = (d.get(k) or "").strip()
    if not v:
        return None
    if v not in ("0", "1"):
        raise ValidationError(f"row {line}: {k}={v[:40]!r} is not 0 or 1; fix the CSV (or leave it "
                              f"blank)")
    return v == "1"


def _real(d: Mapping[str, str], k: str, line: int, lo: float, hi: float, unit: str
          ) -> float | None:
    """Optional column ``k`` as a number in ``[lo, hi]`` (``unit`` says what and the range, for
    the message), or None when blank or absent.

    Raises:
        ValidationError: not a number, or out of range.
    """
    v = (d.get(k) or "").strip()
    if not v:
        return None
    try:
        x = float(v)
    except ValueError:
        raise ValidationError(f"row {line}: {k}={v[:40]!r} is not a number; fix the CSV") from None
    if not lo <= x <= hi:
        raise ValidationError(f"row {line}: {k}={x!r} is out of range; fix the CSV ({unit})")
    return x


def _field(d: Mapping[str, str | None], k: str, line: int) -> str:
    v = d.get(k)
    if not isinstance(v, str) or not v.strip():
        raise ValidationError(f"row {line}: field {k!r} is blank; fill it in")
    return v.strip()


Fill = Callable[[dict[str, str]], dict[str, str]]
"""A hook of :func:`load_rows_lenient`: a CSV record -> the record to parse (e.g. its blank shape
columns filled from its ``model_config``). It raises :class:`ValidationError` for a bad record (the
row is then skipped with that reason)."""


def load_rows(path: str | Path, fill: Fill | None = None) -> tuple[Row, ...]:
    """Parse the published-training CSV (header as in ``published_training.csv``), read through
    the tool's guarded reader (:func:`ir.files.read_csv_rows`: size, UTF-8, no binary files);
    strict: the first row that does not parse raises (:func:`load_rows_lenient` skips it).

    Raises:
        ValidationError: a file-level problem (:func:`load_rows_lenient`), or the first bad row's
            (:func:`parse_row`), as ``row N: reason``.
    """
    rows, bad = load_rows_lenient(path, fill)
    if bad:
        raise ValidationError(bad[0].message)
    return rows


def load_rows_lenient(path: str | Path, fill: Fill | None = None
                      ) -> tuple[tuple[Row, ...], tuple[SkippedRow, ...]]:
    """(the rows that parse, the rows that do not, each a :class:`SkippedRow` with its reason):
    the CSV read as :func:`load_rows` reads it. ``fill(record)``, when given, is applied to each
    record before it is parsed (:data:`Fill`: the CLI fills a ``model_config`` row's blank shape
    columns from the model zoo, which the simulator may not import).

    Raises:
        ValidationError: a problem with the file, not a row: unreadable (missing, not UTF-8,
            binary, too large, malformed CSV), no rows, or a header that lacks a
            :data:`REQUIRED` column or both ``global_batch`` and ``per_device_batch``.
    """
    try:
        records = read_csv_rows(path, "validation CSV")
    except InputError as e:
        raise ValidationError(str(e)) from None
    if not records:
        raise ValidationError(f"{path}: validation CSV has no rows; fix: add published runs below the header")
    header = [k for k in records[0] if k is not None]
    # the shape columns may be missing: a row names its model instead (mpmd validate's fill
    # hook), else is skipped for the blank field
    missing = [k for k in REQUIRED if k not in header and k not in SHAPE_COLUMNS]
    if "global_batch" not in header and "per_device_batch" not in header:
        missing.append("global_batch")
    unknown = [k for k in header if k not in REQUIRED and k not in COLUMNS_OPTIONAL]
    if missing:     # a misspelt column is both: the missing one is named first
        also = (f" and has unknown column(s) {', '.join(repr(k[:40]) for k in unknown[:5])}"
                if unknown else "")
        raise ValidationError(f"{path}: the validation CSV header lacks column(s) "
                              f"{', '.join(m[:40] for m in missing)}{also}; fix the header "
                              f"(columns as in reports/validation/README.md)")
    if unknown:
        raise ValidationError(f"{path}: the validation CSV header has unknown column(s) "
                              f"{', '.join(repr(k[:40]) for k in unknown[:5])}; fix: rename or "
                              f"drop them (columns as in reports/validation/README.md: "
                              f"{', '.join(REQUIRED + COLUMNS_OPTIONAL)})")
    known = known_device_ids()
    rows: list[Row] = []
    bad: list[SkippedRow] = []
    for line, d in enumerate(records, start=2):
        try:
            rows.append(parse_row(fill(d) if fill else d, line, known))
        except ValidationError as e:
            bad.append(skipped(line, _raw(d, "source"), _raw(d, "model"), e))
    return tuple(rows), tuple(bad)


def _raw(d: Mapping[str, str | None], k: str) -> str:
    v = d.get(k)
    return v.strip()[:40] if isinstance(v, str) else ""


def _batch(d: Mapping[str, str], line: int, gpus: int) -> tuple[int, float | None, bool]:
    """(global batch, per-device batch or None, whether the global batch was derived from it)."""
    gb = _int(d, "global_batch", line)
    v = (d.get("per_device_batch") or "").strip()
    if not v:
        if gb is None:
            raise ValidationError(f"row {line}: global_batch and per_device_batch are both blank; "
                                  f"fill in one")
        return gb, None, False
    try:
        pdb = float(v)
    except ValueError:
        raise ValidationError(f"row {line}: per_device_batch={v[:40]!r} is not a number; fix the "
                              f"CSV") from None
    if not 0 < pdb <= INT_LIMITS["global_batch"]:
        raise ValidationError(f"row {line}: per_device_batch={pdb!r} is out of range; fix the CSV "
                              f"(a positive number, at most {INT_LIMITS['global_batch']})")
    total = pdb * gpus
    if abs(total - round(total)) > 1e-6 * max(1.0, total) or round(total) < 1:
        raise ValidationError(f"row {line}: per_device_batch {pdb:g} x gpus {gpus} = {total:g} is "
                              f"not a whole batch; fix the row")
    if gb is None:
        if round(total) > INT_LIMITS["global_batch"]:
            raise ValidationError(f"row {line}: per_device_batch {pdb:g} x gpus {gpus} = "
                                  f"{total:g} is out of range; fix the row (a global batch of at "
                                  f"most {INT_LIMITS['global_batch']})")
        return int(round(total)), pdb, True
    if gb != round(total):
        raise ValidationError(f"row {line}: global_batch {gb} != per_device_batch {pdb:g} x gpus "
                              f"{gpus} = {total:g}; fix the row (or leave one of them blank)")
    return gb, pdb, False


def _choice(d: Mapping[str, str], k: str, line: int, allowed: Sequence[str], default: str,
            aliases: Mapping[str, str] | None = None) -> str:
    """Optional column ``k`` as one of ``allowed`` (case-insensitive; blank: ``default``); with
    ``aliases`` (names as runs spell them, ``_`` ignored: ``all_gather``) mapped to it first.

    Raises:
        ValidationError: a value that is none of them, named with the ones the column takes.
    """
    v = (d.get(k) or "").strip().lower() or default
    if aliases is not None:
        v = aliases.get(v.replace("_", ""), v.replace("_", ""))
    if v not in allowed:
        raise ValidationError(f"row {line}: {k} {v[:40]!r} unknown; fix: use one of "
                              f"{', '.join(aliases or allowed)} or leave it blank ({default})")
    return v


def _peak_memory(d: Mapping[str, str], line: int) -> float | None:
    """The published peak memory per device in bytes: ``peak_memory_gb`` x 1e9 or
    ``peak_memory_gib`` x 2**30; None when both are blank.

    Raises:
        ValidationError: both given, or one that is not a number in [0.001, 1e5].
    """
    gb = _real(d, "peak_memory_gb", line, 1e-3, 1e5, "GB per device, 0.001 to 1e5")
    gib = _real(d, "peak_memory_gib", line, 1e-3, 1e5, "GiB per device, 0.001 to 1e5")
    if gb is not None and gib is not None:
        raise ValidationError(f"row {line}: peak_memory_gb {gb:g} and peak_memory_gib {gib:g} both "
                              f"given; fix: keep the one the source prints")
    return gb * 1e9 if gb is not None else (gib * 2.0 ** 30 if gib is not None else None)


def parse_row(d: Mapping[str, str], line: int, known: tuple[str, ...] | list[str]) -> Row:
    """One CSV record (``csv.DictReader`` dict) at ``line`` as a :class:`Row`; ``known`` are the
    device profile ids.

    Raises:
        ValidationError: ``row N: ...``: a missing or malformed field, an integer out of range
            (:data:`INT_LIMITS`), a device that is not a bundled profile id
            (:func:`hardware_profiles.loader.known_device_ids`), an unknown metric, schedule or
            recompute policy, a value that is not a finite positive number (an ``mfu`` above 1),
            ``tp * pp * dp * cp != gpus``, batches that disagree (global vs per-device, micro
            batches that do not divide the global batch), a ``vp`` the schedule or the layers
            cannot take, a malformed ``pipeline_layout`` or one that disagrees with ``pp``,
            ``vp`` or the layers (:func:`_layout_vp`), ``ep`` > 1 on a row without a ``model_config`` (its shape columns
            describe a dense model), more fields than the header.
    """
    if None in d:   # csv.DictReader's restkey: the fields past the header's columns
        extra = cast("Mapping[str | None, list[str]]", d)[None]
        raise ValidationError(f"row {line}: {len(d) - 1 + len(extra)} fields, more than the "
                              f"{len(d) - 1} columns of the header; fix the row")
    sched = (d.get("schedule") or "").strip().lower() or None
    if sched is not None and sched not in SCHEDULE_MAP:
        raise ValidationError(f"row {line}: schedule {sched[:40]!r} unknown; fix: use one of "
                              f"{', '.join(sorted(SCHEDULE_MAP))} or leave it blank")
    metric = (d.get("metric") or "").strip()
    if metric not in METRICS:
        raise ValidationError(f"row {line}: metric {metric[:40]!r} unknown; fix: use one of "
                              f"{', '.join(METRICS)}")
    printed = _field(d, "device", line)
    # "DGX-H100", "GB200 NVL72" as tables print them
    device = printed if printed in known else canonical_device(printed)
    if device not in known:
        raise ValidationError(f"row {line}: device {printed[:40]!r} is not a known profile; "
                              f"fix: use one of {known}")
    try:
        value = float(d["value"])
    except (KeyError, TypeError, ValueError):
        raise ValidationError(f"row {line}: value {str(d.get('value'))[:40]!r} is not a number; "
                              f"fix the CSV") from None
    if not 0 < value < 1e12:
        raise ValidationError(f"row {line}: value {value!r} is not a finite positive number; "
                              f"fix the CSV")
    if metric == "mfu" and value > 1:
        raise ValidationError(f"row {line}: mfu {value!r} is above 1; fix: write MFU as a "
                              f"fraction (45% -> 0.45)")
    rc = (d.get("recompute") or "").strip() or None
    if rc is not None and rc.lower().startswith(remat.MODULES_PREFIX):
        try:
            rc = remat.MODULES_PREFIX + ",".join(remat.parse_modules(rc))
        except remat.RematError as e:
            raise ValidationError(f"row {line}: {e}") from None
    elif rc is not None and rc.lower() not in RECOMPUTE:
        raise ValidationError(f"row {line}: recompute {rc[:40]!r} unknown; fix: use one of "
                              f"{', '.join(RECOMPUTE)}, modules:<{','.join(remat.MODULES)}> "
                              f"or leave it blank")
    rc = rc.lower() if rc is not None else None
    gpus = _required_int(d, "gpus", line)
    global_batch, per_device, derived = _batch(d, line, gpus)
    scale_out = _real(d, "scale_out_gbit_per_device", line, 1e-3, 1e6,
                      "Gb/s per device, 0.001 to 1e6")
    power = _real(d, "power_limit_w", line, 1.0, 1e5, "W per device, 1 to 1e5")
    mem_bw = _real(d, "memory_bandwidth_gb_per_s", line, 1.0, 1e6, "GB/s per device, 1 to 1e6")
    peak_mem = _peak_memory(d, line)
    att = (d.get("attention") or "").strip().lower() or None
    if att is not None and att not in ATTENTION_KERNELS:
        raise ValidationError(f"row {line}: attention {att[:40]!r} unknown; fix: use one of "
                              f"{', '.join(ATTENTION_KERNELS)} or leave it blank")
    given = (d.get("precision") or "").strip().lower()
    prec = canonical_precision(given) if given else "bf16"     # "FP8-CS" as tables print it
    if prec not in RECIPES and prec not in COMPUTE_DTYPES:
        raise ValidationError(f"row {line}: precision {prec[:40]!r} unknown; fix: use one of "
                              f"{', '.join((*RECIPES, *COMPUTE_DTYPES[1:]))} or leave it blank "
                              f"(bf16, or fp16 on a device without a bf16 rate)")
    vp = _int(d, "vp", line)
    disp = (d.get("dispatcher") or "").strip().lower() or None
    if disp is not None:        # "token-drop", "all_to_all", "a2a" as runs spell them
        disp = "".join(c for c in disp if c not in "-_ ")
        disp = "alltoall" if disp == "a2a" else disp
    if disp is not None and disp not in DISPATCHERS:
        raise ValidationError(f"row {line}: dispatcher {disp[:40]!r} unknown; fix: use one of "
                              f"{', '.join(DISPATCHERS)} or leave it blank (alltoall)")
    grad = _choice(d, "grad_reduce", line, GRAD_REDUCE, "fp32")
    opt = _choice(d, "optimizer_state", line, OPTIMIZER_STATES, "fp32")
    cp_comm = _choice(d, "cp_comm", line, CONTEXT_METHODS, "ring", aliases=CP_COMM)
    saved = _choice(d, "saved_inputs", line, SAVED_INPUTS, "format")
    loss = _choice(d, "cross_entropy", line, tuple(CROSS_ENTROPY), "fused")
    model_config = (d.get("model_config") or "").strip() or None
    tp, pp, cp = _required_int(d, "tp", line), _required_int(d, "pp", line), _int(d, "cp", line) or 1
    dp = _int(d, "dp", line)
    if dp is None:          # NVIDIA's tables print no DP: the GPUs the other degrees leave
        if gpus % (tp * pp * cp):
            raise ValidationError(f"row {line}: dp is blank and gpus={gpus} is not a multiple of "
                                  f"tp*pp*cp = {tp * pp * cp}; fix: give dp or the layout")
        dp = gpus // (tp * pp * cp)
    r = Row(source=_field(d, "source", line), model=_field(d, "model", line),
            layers=_required_int(d, "layers", line), hidden=_required_int(d, "hidden", line),
            heads=_required_int(d, "heads", line), seq_len=_required_int(d, "seq_len", line),
            vocab=_int(d, "vocab", line), device=device,
            gpus=gpus, tp=tp, pp=pp, dp=dp, global_batch=global_batch,
            micro_batch=_int(d, "micro_batch", line), microbatches=_int(d, "microbatches", line),
            schedule=sched, metric=metric, value=value, ffn=_int(d, "ffn", line),
            kv_heads=_int(d, "kv_heads", line), head_dim=_int(d, "head_dim", line),
            glu=_flag(d, "glu", line), fsdp=_flag(d, "fsdp", line), recompute=rc,
            slices=_int(d, "slices", line), devices_per_node=_int(d, "devices_per_node", line),
            scale_out_gbit_per_device=scale_out, power_limit_w=power,
            memory_bandwidth_gb_per_s=mem_bw,
            eager=_flag(d, "eager", line), tp_overlap=_flag(d, "tp_overlap", line),
            attention=att, precision=prec,
            note=(d.get("note") or "").strip(), line=line, per_device_batch=per_device,
            global_batch_derived=derived, model_config=model_config,
            cp=cp, vp=vp, ep=_int(d, "ep", line) or 1,
            etp=_int(d, "etp", line), scale_up_domain=_int(d, "scale_up_domain", line),
            dispatcher=DISPATCHERS[disp] if disp is not None else None, grad_reduce=grad,
            optimizer_state=opt, pipeline_layout=(d.get("pipeline_layout") or "").strip() or None,
            precision_given=bool(given), offload_layers=_int(d, "offload_layers", line) or 0,
            bf16_first_layers=_int(d, "bf16_first_layers", line) or 0,
            bf16_last_layers=_int(d, "bf16_last_layers", line) or 0,
            peak_memory_bytes=peak_mem, cross_entropy=loss, cp_comm=cp_comm,
            saved_inputs=saved)
    kept = r.bf16_first_layers + r.bf16_last_layers
    if kept and not r.low_precision:
        raise ValidationError(f"row {line}: bf16_first_layers/bf16_last_layers keep blocks in BF16 "
                              f"under a low-precision recipe, and precision is {r.recipe!r}; fix: "
                              f"blank them or give the row's fp8/mxfp8/nvfp4 precision")
    if kept >= r.layers:
        raise ValidationError(f"row {line}: bf16_first_layers + bf16_last_layers = {kept} leave "
                              f"none of the {r.layers} layers to the {r.recipe} recipe; fix: keep "
                              f"fewer in BF16")
    if r.offload_layers and (r.pp > 1 or r.offload_layers > r.layers):
        raise ValidationError(f"row {line}: offload_layers={r.offload_layers} needs pp 1 and at "
                              f"most the {r.layers} layers (Megatron-Core's "
                              f"--cpu-offloading-num-layers, below the layers; a MaxText remat "
                              f"policy offloading decoder_layer_input: all); fix offload_layers "
                              f"or pp")
    if r.kv_heads is not None and r.heads % r.kv_heads:
        raise ValidationError(f"row {line}: heads={r.heads} is not a multiple of kv_heads="
                              f"{r.kv_heads}; fix the row")
    if r.head_dim is None and r.hidden % r.heads:
        raise ValidationError(f"row {line}: hidden={r.hidden} is not a multiple of heads="
                              f"{r.heads}; fix the row or give head_dim")
    if r.slices and (r.gpus % r.slices or (r.replicas * r.pp) % r.slices):
        raise ValidationError(f"row {line}: slices={r.slices} does not divide the data-parallel "
                              f"devices (gpus={r.gpus}, dp={r.dp}"
                              f"{f', cp={r.cp}' if r.cp > 1 else ''}); fix the row")
    if r.cp > 1 and r.tp * r.pp * r.dp * r.cp != r.gpus:
        raise ValidationError(f"row {line}: tp*pp*dp*cp = {r.tp * r.pp * r.dp * r.cp} != "
                              f"gpus={r.gpus}; fix the layout (dp excludes cp: gpus = tp x pp x "
                              f"dp x cp)")
    if r.tp * r.pp * r.dp * r.cp != r.gpus:
        raise ValidationError(f"row {line}: tp*pp*dp = {r.tp * r.pp * r.dp} != gpus={r.gpus}; "
                              f"fix the layout")
    if r.pipeline_layout is not None:
        r = replace(r, vp=_layout_vp(r))
    if r.vp is not None:
        _check_virtual(r)
    if (r.vp is not None and r.vp > 1 and r.layers // r.pp < r.vp
            and r.pipeline_layout is None and (r.layers + 2) % (r.pp * r.vp)):
        # (the embedding and the loss counted as layers fill the chunks NVIDIA's 405B recipes
        # run, 126 blocks on pp 16 x vp 8: simulator.pipeline_layout.recipe_split)
        raise ValidationError(f"row {line}: vp={r.vp} chunks per rank cannot be held: {r.layers} "
                              f"layers over pp={r.pp} ranks leave {r.layers // r.pp} on the "
                              f"smallest; fix vp (at most {max(r.layers // r.pp, 1)}) or leave it "
                              f"blank")
    if r.ep > 1 and r.model_config is None:
        raise ValidationError(f"row {line}: ep={r.ep} but the row's model is not a mixture of "
                              f"experts (its shape columns describe a dense model); fix: ep 1 "
                              f"(or blank), or name a mixture of experts in model_config")
    per = r.dp * (r.micro_batch or 1) * (r.microbatches or 1)
    if (r.micro_batch and r.microbatches and r.tp > 1 and per != r.global_batch
            and per * r.tp == r.global_batch):
        # the micro batch is per device, every chip counted (MaxText's per_device_batch_size)
        r = replace(r, micro_batch=r.micro_batch * r.tp)
        per = r.global_batch
    whole = r.dp * (r.micro_batch or 1)
    if r.microbatches and per != r.global_batch and r.global_batch % whole == 0:
        # a published gradient-accumulation count that disagrees with the batch it states
        # (NVIDIA's 25.11 GB300 Qwen3-235B row: GBS 8192, MBS 2, 64-way DP, GA 32): the batch kept
        r = replace(r, microbatches=None, microbatches_published=r.microbatches)
        per = whole
    if r.global_batch % per or (r.micro_batch and r.microbatches and per != r.global_batch):
        raise ValidationError(
            f"row {line}: global_batch {r.global_batch} is not micro_batch x microbatches x dp "
            f"({r.micro_batch or '-'} x {r.microbatches or '-'} x {r.dp}); fix the row")
    if r.global_batch // (r.dp * (r.micro_batch or 1)) > INT_LIMITS["microbatches"]:
        raise ValidationError(
            f"row {line}: global_batch {r.global_batch} makes over {INT_LIMITS['microbatches']} "
            f"microbatches per pipeline; fix the row (set micro_batch)")
    return r


def _layout_vp(r: Row) -> int:
    """The virtual stages per rank of the row's ``pipeline_layout`` (its stages / ``pp``), the
    layout parsed and checked against ``pp``, a given ``vp`` and the row's ``layers``
    (:func:`simulator.pipeline_layout.parse_layout`, :func:`~simulator.pipeline_layout.
    check_layout`).

    Raises:
        ValidationError: ``row N: `` and the layout's one-line problem and fix.
    """
    assert r.pipeline_layout is not None
    try:
        return check_layout(parse_layout(r.pipeline_layout), r.pipeline_layout, r.pp, r.layers,
                            r.vp)
    except LayoutError as e:
        raise ValidationError(f"row {r.line}: {e}") from None


def _check_virtual(r: Row) -> None:
    """Check the row's ``vp`` (virtual pipeline stages per rank) against its pipeline and schedule:
    vp > 1 needs a pipeline; a given schedule must run ``vp`` stages per rank (an interleaved one
    at least 2). A blank schedule is chosen from vp (:func:`simulator.validation_setup`'s
    ``_choices``: vp > 1 interleaved, vp 1 plain 1F1B).

    Raises:
        ValidationError: vp > 1 without a pipeline, or a schedule that runs another number of
            stages per rank.
    """
    assert r.vp is not None
    if r.vp > 1 and r.pp == 1:
        raise ValidationError(f"row {r.line}: vp={r.vp} needs a pipeline (pp > 1); fix: vp 1 (or "
                              f"blank)")
    if r.schedule is None:
        return
    name = SCHEDULE_MAP[r.schedule]
    per_rank = stages_per_rank(name, r.vp)
    if per_rank != r.vp or (name in INTERLEAVED and r.vp < 2):
        need = "at least 2" if name in INTERLEAVED else str(per_rank)
        raise ValidationError(f"row {r.line}: vp={r.vp} but schedule {r.schedule} runs {need} "
                              f"stage{'' if need == '1' else 's'} per rank; fix vp or the "
                              f"schedule (vp > 1: 1f1b-interleaved)")


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
