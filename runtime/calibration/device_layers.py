"""Layer timings measured on one accelerator, against the cost model.

``benchmarks/bench_device_layers.py`` times, on one GPU or TPU, the zoo's decoder blocks (one
tensor-parallel shard each: :func:`zoo.tensor_shard`), their GEMMs and an HBM copy, and writes a CSV
(:data:`COLUMNS`). This module reads such a CSV and predicts every row with the same cost model the
planner uses, on a device profile:

- ``block``: :func:`simulator.cost_model.layer_time` of the shard's
  :func:`zoo.body_cost` on one device (the forward ``F``; the backward ``B`` = the measured
  ``FB`` - ``F``), with the attention kernel the row ran (``cudnn``: FlashAttention, the cost
  model's ``flash``; ``xla``: scores materialized, ``unfused``);
- ``gemm``: ``2 m k n`` FLOP at the profile's achievable rate, divided by the wave utilisation
  of an ``m x n`` output (:func:`simulator.cost_model.wave_utilisation`);
- ``copy``: bytes read and written at the profile's achievable bandwidth;
- ``attention``: the causal attention core alone (cuDNN flash attention): its FLOP
  (:func:`attention_flops`) at the profile's GEMM rate times its attention efficiency, forward
  and backward (``DeviceProfile.attention_efficiency`` / ``attention_backward_efficiency``).
  :func:`attention_efficiencies` measures those two from the same file: the attention rows'
  FLOP rate over its GEMM rows' median rate.
- ``experts`` (``benchmarks/bench_device_experts.py``): SwiGLU experts alone, ``m`` tokens per
  expert, through ``layer_time`` as a layer whose every FLOP and weight is routed
  (:func:`expert_matmuls_time`: the experts' own roofline).

The host-link rows (``h2d``, ``d2h``) and the whole routed layers (``moe``) are listed, not
predicted: no profile carries a host link, and a routed layer alone is no zoo body.
``mpmd validate --layers CSV`` prints the comparison (``reports/validation/device/README.md``
records the shipped measurements).
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from hardware_profiles import DeviceProfile
from hardware_profiles.paths import PACKAGE_ROOT
from hardware_profiles.types import Link, MeshSpec
from ir import LayerCost, Layout
from ir.workload import causal_fraction
from runtime.calibration.csv_fields import Row, choice, count, number, read_records, text
from runtime.calibration.fit import CalibrationError
from simulator.cost_model import layer_time, wave_utilisation
from zoo import body_cost, body_of, tensor_shard
from zoo.model_files import resolve_model

COLUMNS = ("device_kind", "backend", "jax_version", "item", "model", "tensor", "samples",
           "seq_len", "m", "k", "n", "pass", "seconds", "repeats", "nbytes", "attention")
"""The CSV's required columns (``benchmarks/bench_device_layers.py`` writes them, and
:data:`ATTENTION_COLUMNS` after them)."""
ATTENTION_COLUMNS = ("heads", "kv_heads", "head_dim")
"""The attention rows' shape columns (empty on other rows; absent from files written before them)."""
EXPERT_COLUMNS = ("experts", "top_k")
"""The expert rows' columns (``benchmarks/bench_device_experts.py``; absent from other files)."""

KIND_PROFILES = {"NVIDIA H100 80GB HBM3": "h100-sxm", "NVIDIA H200": "h200-sxm",
                 "NVIDIA A100-SXM4-80GB": "a100-80gb-sxm", "NVIDIA A100-SXM4-40GB": "a100-40gb-sxm",
                 "NVIDIA B200": "b200", "NVIDIA L40S": "l40s", "TPU v4": "tpu-v4",
                 "TPU v5 lite": "tpu-v5e", "TPU v5": "tpu-v5p", "TPU v6 lite": "tpu-v6e"}
"""JAX's ``device_kind`` -> the bundled profile it is measured against."""

_KERNELS = {"cudnn": "flash", "xla": "unfused"}
_PASSES = ("F", "B", "FB")
ITEMS = ("block", "gemm", "copy", "h2d", "d2h", "attention", "experts", "moe")
_PAIRED = ("block", "attention", "experts", "moe")     # items timed as F and FB


@dataclass(frozen=True, slots=True)
class LayerTiming:
    """One measured row. ``seconds``: one call's median; ``pass_``: ``F``, ``B`` or ``FB`` for a
    block (``B`` derived as ``FB - F``), empty otherwise; ``nbytes``: bytes moved (copy, host
    rows) or read and written (gemm)."""

    device_kind: str
    item: str
    seconds: float
    model: str = ""
    tensor: int = 0
    samples: int = 0
    seq_len: int = 0
    m: int = 0
    k: int = 0
    n: int = 0
    pass_: str = ""
    nbytes: float = 0.0
    attention: str = ""
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    experts: int = 0
    top_k: int = 0

    @property
    def label(self) -> str:
        """E.g. ``block llama3-8b t8 b1 s8192 cudnn B`` or ``gemm 8192x4096x14336``."""
        if self.item == "block":
            return (f"block {self.model} t{self.tensor} b{self.samples} s{self.seq_len} "
                    f"{self.attention} {self.pass_}")
        if self.item == "gemm":
            return f"gemm {self.m}x{self.k}x{self.n}"
        if self.item == "attention":
            return (f"attention h{self.heads}/{self.kv_heads} d{self.head_dim} b{self.samples} "
                    f"s{self.seq_len} {self.attention} {self.pass_}")
        if self.item in ("experts", "moe"):
            routing = f" top{self.top_k} s{self.seq_len}" if self.item == "moe" else ""
            return (f"{self.item} E{self.experts}{routing} C{self.m} {self.k}x{self.n} "
                    f"{self.pass_}")
        return f"{self.item} {self.nbytes / 2**30:g} GiB"


@dataclass(frozen=True, slots=True)
class Comparison:
    """A row's measured and predicted seconds (``predicted`` None: not predicted)."""

    timing: LayerTiming
    predicted: float | None

    @property
    def error(self) -> float | None:
        """``predicted / measured - 1`` (negative: the model is too fast)."""
        return None if self.predicted is None else self.predicted / self.timing.seconds - 1.0


def shipped_csv(path: str | Path) -> Path:
    """``path``, or, when it is relative and not found below the working directory, the same path
    from the repository root (the shipped ``reports/validation/device/*.csv``, named as in the
    README, from any directory)."""
    p = Path(path)
    if not p.is_file() and not p.is_absolute() and (PACKAGE_ROOT / p).is_file():
        return PACKAGE_ROOT / p
    return p


COUNT_COLUMNS = ("tensor", "samples", "seq_len", "m", "k", "n") + ATTENTION_COLUMNS + EXPERT_COLUMNS
"""The integer columns (empty where a row's item has no such size)."""
REQUIRED = {"block": ("tensor", "samples", "seq_len"), "gemm": ("m", "k", "n"),
            "attention": ("samples", "seq_len", "heads", "head_dim"),
            "experts": ("experts", "m", "k", "n")}
"""The integer columns an item's prediction needs (``copy`` needs ``nbytes``)."""
MAX_SIZE = 2**31
"""Largest size in a row (matrix rows and widths, heads, experts)."""
SIZE_LIMITS = {"samples": 2**12, "seq_len": 2**20}
"""Tighter limits: a block's traced shapes (samples x heads x tokens^2 for its attention scores)
must stay countable in 64 bits; the shipped rows reach 16 samples and 16,384 tokens."""
WRITE_IT = "time it with `python benchmarks/bench_device_layers.py --out FILE`"


def read_timings(path: str | Path) -> tuple[LayerTiming, ...]:
    """The rows of a ``bench_device_layers`` CSV, with each block's ``B = FB - F`` added; a
    relative path not found below the working directory is tried from the repository root (the
    shipped ``reports/validation/device/*.csv``). Read through the tool's guarded reader, every
    field checked (:mod:`runtime.calibration.csv_fields`).

    Raises:
        CalibrationError: the file is missing or has no rows; its header lacks a column of
            :data:`COLUMNS`; a row (line named) names an unknown item, pass or attention kernel,
            has seconds that are not a positive finite number, a size that is not an integer
            from 1 to :data:`MAX_SIZE` (or :data:`SIZE_LIMITS`), lacks a size its item needs
            (:data:`REQUIRED`). A block whose ``FB`` time is not above its ``F`` time (timer
            noise on a busy host) gets no ``B`` row.
        ir.files.InputError: an unreadable file (binary, not UTF-8, too large, malformed CSV).
    """
    p = shipped_csv(path)
    if not p.exists():
        raise CalibrationError(f"no layer-timing CSV at {str(p)!r}; fix: {WRITE_IT}")
    records = read_records(p, "layer-timing CSV", COLUMNS, WRITE_IT)
    if not records:
        raise CalibrationError(f"{p}: layer-timing CSV has no rows; fix: {WRITE_IT}")
    out = [(line, _timing(f"{p}: line {line}", r)) for line, r in records]
    forwards = {_block_key(t): (line, t) for line, t in out if t.item in _PAIRED and t.pass_ == "F"}
    backs = []
    for line, t in out:
        f_line, f = forwards.get(_block_key(t), (0, None))
        if t.pass_ != "FB" or f is None:
            continue
        if t.seconds <= f.seconds:
            continue      # timer noise on a busy host (tiny blocks): no backward time to compare
        backs.append(dataclasses.replace(t, pass_="B", seconds=t.seconds - f.seconds))
    return tuple(t for _, t in out) + tuple(backs)


def _timing(where: str, r: Row) -> LayerTiming:
    """One row as a :class:`LayerTiming` (``where``: ``FILE: line N``).

    Raises:
        CalibrationError: see :func:`read_timings`.
    """
    item = choice(where, r, "item", ITEMS)
    sizes = {c: count(where, r, c, SIZE_LIMITS.get(c, MAX_SIZE), WRITE_IT,
                      required=c in REQUIRED.get(item, ()))
             for c in COUNT_COLUMNS}
    paired = item in _PAIRED
    return LayerTiming(
        device_kind=text(r, "device_kind"), item=item,
        seconds=number(where, r, "seconds", f"give the measured seconds, above 0, or {WRITE_IT}"),
        model=text(r, "model"), pass_=choice(where, r, "pass", ("F", "FB")) if paired else "",
        nbytes=number(where, r, "nbytes", WRITE_IT, required=item == "copy"),
        attention=(choice(where, r, "attention", tuple(_KERNELS))
                   if item in ("block", "attention") else text(r, "attention")),
        **sizes)


def _block_key(t: LayerTiming) -> tuple:
    return (t.device_kind, t.item, t.model, t.tensor, t.samples, t.seq_len, t.attention,
            t.heads, t.kv_heads, t.head_dim, t.m, t.k, t.n, t.experts, t.top_k)


BACKWARD_FLOP_RATIO = 2.5
"""A flash attention backward's FLOP over its forward's: the scores ``Q K^T`` recomputed, then
four matmuls (dV, dP, dQ, dK) against the forward's two (Dao 2023, FlashAttention-2, Sec. 3.1-3.2;
``zoo.costing`` charges the same)."""


def attention_flops(t: LayerTiming) -> float:
    """The FLOP of attention row ``t``'s pass (``F``, ``B`` or ``FB``): the forward's
    ``4 b s^2 H d`` (``Q K^T`` and ``P V``) times the causal blocks a blocked kernel computes
    (:func:`ir.workload.causal_fraction`), the backward :data:`BACKWARD_FLOP_RATIO` times that."""
    fwd = 4.0 * t.samples * t.seq_len ** 2 * t.heads * t.head_dim * causal_fraction(t.seq_len)
    return fwd * {"F": 1.0, "B": BACKWARD_FLOP_RATIO, "FB": 1.0 + BACKWARD_FLOP_RATIO}[t.pass_]


@dataclass(frozen=True, slots=True)
class AttentionFit:
    """A fused attention kernel's rate relative to the GEMMs' (``DeviceProfile.attention_rate``):
    ``efficiency x s / (s + half_tokens)`` at ``s`` tokens, forward and backward, fitted on
    ``rows`` shapes; ``worst``: the largest relative residual of either pass's rates."""

    efficiency: float
    half_tokens: float
    backward_efficiency: float
    backward_half_tokens: float
    rows: int
    worst: float


def attention_efficiencies(timings: Sequence[LayerTiming]) -> AttentionFit:
    """Fit ``efficiency x s / (s + half)`` to the attention rows' FLOP rates over the median FLOP
    rate of the same file's GEMM rows, forward (``F``) and backward (``FB - F``) apart, by least
    squares on the relative residual (scipy): what ``DeviceProfile.attention_efficiency``,
    ``attention_half_tokens`` and their backward twins are.

    Raises:
        CalibrationError: the rows hold fewer than two attention pairs, or no GEMM.
    """
    import numpy as np
    from scipy.optimize import least_squares

    gemm = [2.0 * t.m * t.k * t.n / t.seconds for t in timings if t.item == "gemm"]
    att = [t for t in timings if t.item == "attention"]
    n_f = sum(t.pass_ == "F" for t in att)
    n_b = sum(t.pass_ == "B" for t in att)
    if not gemm or n_f < 2 or n_b < 2:
        raise CalibrationError(f"attention efficiencies need two or more attention rows (F and "
                               f"FB) and GEMM rows of one device; got {n_f} F, {n_b} B, "
                               f"{len(gemm)} GEMM rows (fix: bench_device_layers.py without "
                               f"--blocks-only)")
    g = statistics.median(gemm)
    out, worst = [], 0.0
    for p in ("F", "B"):
        rows = [t for t in att if t.pass_ == p]
        s = np.array([t.seq_len for t in rows], float)
        r = np.array([attention_flops(t) / t.seconds / g for t in rows])
        res = least_squares(lambda q: (q[0] * s / (s + q[1]) - r) / r,
                            [float(r.max()), float(s.min())], bounds=([1e-3, 0.0], [1.0, 1e6]))
        out += [float(res.x[0]), float(res.x[1])]
        worst = max(worst, float(np.abs(res.fun).max()))
    return AttentionFit(*out, rows=n_f, worst=worst)


def profile_for(timings: Sequence[LayerTiming]) -> str:
    """The bundled profile the rows' device kind is measured against.

    Raises:
        CalibrationError: the rows mix device kinds, or the kind has no profile here.
    """
    kinds = sorted({t.device_kind for t in timings})
    if len(kinds) != 1:
        raise CalibrationError(f"the rows come from {len(kinds)} device kinds {kinds}; "
                               "give one kind's rows per file")
    if kinds[0] not in KIND_PROFILES:
        raise CalibrationError(f"no bundled profile for device kind {kinds[0]!r}; name one with "
                               "--profile (see `mpmd profiles`)")
    return KIND_PROFILES[kinds[0]]


def _one_device(device: DeviceProfile) -> MeshSpec:
    # one device: no collective is costed, so the link is never read
    return MeshSpec(name="one", device=device, num_devices=1, axes={"data": 1},
                    intra_link=Link(bandwidth=1.0, latency=0.0))


def predict(t: LayerTiming, device: DeviceProfile) -> float | None:
    """Seconds the cost model gives row ``t`` on one ``device`` (None for the host-link rows).

    Raises:
        ZooError: a block row names a model the zoo lacks or a degree that does not divide it.
    """
    if t.item == "copy":
        return t.nbytes / device.achievable_bandwidth
    if t.item == "gemm":
        util = (wave_utilisation(t.m, t.n, device.gemm_tiling) if device.gemm_tiling else 1.0)
        return 2.0 * t.m * t.k * t.n / device.achievable_flops("bf16") / util
    if t.item == "attention":
        f = attention_flops(dataclasses.replace(t, pass_="F"))
        fwd = f / (device.achievable_flops("bf16") * device.attention_rate(t.seq_len))
        bwd = BACKWARD_FLOP_RATIO * f / (device.achievable_flops("bf16")
                                         * device.attention_rate(t.seq_len, backward=True))
        return {"F": fwd, "B": bwd, "FB": fwd + bwd}[t.pass_]
    if t.item == "experts":
        return expert_matmuls_time(t, device)
    if t.item != "block":
        return None
    cfg = dataclasses.replace(tensor_shard(resolve_model(t.model), t.tensor), seq_len=t.seq_len,
                              dtype="bfloat16", attention="plain",
                              attention_kernel=_KERNELS.get(t.attention, "flash"))
    cost = body_cost(cfg, body_of(cfg, "block0"))
    mesh, layout = _one_device(device), Layout(data=1, tensor=1)
    f = layer_time(cost, "F", t.samples, mesh, layout, seq_len=t.seq_len)
    b = layer_time(cost, "B", t.samples, mesh, layout, seq_len=t.seq_len)
    return {"F": f, "B": b, "FB": f + b}[t.pass_]


def expert_matmuls_time(t: LayerTiming, device: DeviceProfile) -> float:
    """Seconds :func:`simulator.cost_model.layer_time` gives an ``experts`` row on one device:
    SwiGLU experts alone (``t.experts`` experts of ``t.k`` x ``t.n`` weights, gate, up and down,
    ``t.m`` token rows each) as a layer whose every FLOP and weight is routed, so it runs at the
    experts' own roofline (:func:`simulator.cost_model.expert_matmul_work`)."""
    params = 3 * t.experts * t.k * t.n
    flops = 6.0 * t.experts * t.m * t.k * t.n
    cost = LayerCost(name="experts", fwd_flops_per_sample=flops, bwd_flops_per_sample=2 * flops,
                     bwd_input_flops_per_sample=flops, fwd_bytes_fixed=2.0 * params,
                     fwd_bytes_per_sample=0.0, bwd_bytes_fixed=4.0 * params,
                     bwd_bytes_per_sample=0.0, param_count=params, param_bytes=2.0 * params,
                     activation_bytes_per_sample=0.0, residual_bytes_per_sample=0.0,
                     tp_allreduce_bytes_per_sample=0.0, experts=t.experts,
                     expert_param_count=params, expert_fwd_flops_per_sample=flops)
    mesh, layout = _one_device(device), Layout(data=1, tensor=1)
    f = layer_time(cost, "F", 1, mesh, layout)
    b = layer_time(cost, "B", 1, mesh, layout)
    return {"F": f, "B": b, "FB": f + b}[t.pass_]


def compare(timings: Iterable[LayerTiming], device: DeviceProfile) -> list[Comparison]:
    """Every row with its prediction on ``device``."""
    return [Comparison(t, predict(t, device)) for t in timings]


def summary(comparisons: Sequence[Comparison]) -> dict[str, tuple[int, float, float, float]]:
    """Per item (attention cores and blocks per attention kernel and pass: ``attention cudnn F``,
    ..., ``block cudnn F``, ``block cudnn B``, ..., then ``copy``, ``gemm``): rows, mean signed
    error, mean absolute error and largest absolute error, as fractions; each kernel's F, B, FB in
    that order."""
    groups: dict[tuple, list[float]] = {}
    for c in comparisons:
        if c.error is None:
            continue
        t = c.timing
        key = ((0, t.item, t.attention, _PASSES.index(t.pass_)) if t.item in _PAIRED
               else (1, t.item, "", 0))
        groups.setdefault(key, []).append(c.error)
    return {(" ".join(x for x in (k[1], k[2], _PASSES[k[3]]) if x) if k[0] == 0 else k[1]):
            (len(v), statistics.fmean(v), statistics.fmean(abs(e) for e in v), max(abs(e) for e in v))
            for k, v in sorted(groups.items())}


def gemm_time_ratio(a: Sequence[LayerTiming], b: Sequence[LayerTiming]) -> tuple[float, int]:
    """The median over the GEMM shapes both measured of ``a``'s seconds / ``b``'s, and how many
    shapes: how much faster ``b``'s device multiplies matrices (same script, same software).

    Raises:
        CalibrationError: no shape in common.
    """
    ga = {(t.m, t.k, t.n): t.seconds for t in a if t.item == "gemm"}
    gb = {(t.m, t.k, t.n): t.seconds for t in b if t.item == "gemm"}
    shared = sorted(set(ga) & set(gb))
    if not shared:
        raise CalibrationError("the two files share no GEMM shape; measure both with the same "
                               "bench_device_layers.py")
    return statistics.median(ga[s] / gb[s] for s in shared), len(shared)
