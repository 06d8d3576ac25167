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
- ``copy``: bytes read and written at the profile's achievable bandwidth.

The host-link rows (``h2d``, ``d2h``) are listed, not predicted: no profile carries a host link.
``mpmd validate --layers CSV`` prints the comparison (``reports/validation/device/README.md``
records the shipped measurements).
"""

from __future__ import annotations

import csv
import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from hardware_profiles import DeviceProfile
from hardware_profiles.paths import PACKAGE_ROOT
from hardware_profiles.types import Link, MeshSpec
from ir import Layout
from runtime.calibration.fit import CalibrationError
from simulator.cost_model import layer_time, wave_utilisation
from zoo import body_cost, body_of, get_config, tensor_shard

COLUMNS = ("device_kind", "backend", "jax_version", "item", "model", "tensor", "samples",
           "seq_len", "m", "k", "n", "pass", "seconds", "repeats", "nbytes", "attention")
"""The CSV's header, as ``benchmarks/bench_device_layers.py`` writes it."""

KIND_PROFILES = {"NVIDIA H100 80GB HBM3": "h100-sxm", "NVIDIA H200": "h200-sxm",
                 "NVIDIA A100-SXM4-80GB": "a100-80gb-sxm", "NVIDIA A100-SXM4-40GB": "a100-40gb-sxm",
                 "NVIDIA B200": "b200", "NVIDIA L40S": "l40s", "TPU v4": "tpu-v4",
                 "TPU v5 lite": "tpu-v5e", "TPU v5": "tpu-v5p", "TPU v6 lite": "tpu-v6e"}
"""JAX's ``device_kind`` -> the bundled profile it is measured against."""

_KERNELS = {"cudnn": "flash", "xla": "unfused"}
_PASSES = ("F", "B", "FB")
ITEMS = ("block", "gemm", "copy", "h2d", "d2h")


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

    @property
    def label(self) -> str:
        """E.g. ``block llama3-8b t8 b1 s8192 cudnn B`` or ``gemm 8192x4096x14336``."""
        if self.item == "block":
            return (f"block {self.model} t{self.tensor} b{self.samples} s{self.seq_len} "
                    f"{self.attention} {self.pass_}")
        if self.item == "gemm":
            return f"gemm {self.m}x{self.k}x{self.n}"
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


def _int(v: str) -> int:
    return int(v) if v not in ("", None) else 0


def shipped_csv(path: str | Path) -> Path:
    """``path``, or, when it is relative and not found below the working directory, the same path
    from the repository root (the shipped ``reports/validation/device/*.csv``, named as in the
    README, from any directory)."""
    p = Path(path)
    if not p.is_file() and not p.is_absolute() and (PACKAGE_ROOT / p).is_file():
        return PACKAGE_ROOT / p
    return p


def read_timings(path: str | Path) -> tuple[LayerTiming, ...]:
    """The rows of a ``bench_device_layers`` CSV, with each block's ``B = FB - F`` added; a
    relative path not found below the working directory is tried from the repository root (the
    shipped ``reports/validation/device/*.csv``).

    Raises:
        CalibrationError: the file is missing, lacks a column of :data:`COLUMNS`, or names an
            unknown item.
    """
    p = shipped_csv(path)
    if not p.is_file():
        raise CalibrationError(f"no layer-timing CSV at {str(p)!r}; write one with "
                               "`python benchmarks/bench_device_layers.py --out FILE`")
    with p.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise CalibrationError(f"{p} lacks column(s) {missing}; expected {list(COLUMNS)}")
        rows = list(reader)
    out: list[LayerTiming] = []
    for i, r in enumerate(rows, start=2):
        if r["item"] not in ITEMS:
            raise CalibrationError(f"{p}:{i}: unknown item {r['item']!r}; one of {list(ITEMS)}")
        out.append(LayerTiming(
            device_kind=r["device_kind"], item=r["item"], seconds=float(r["seconds"]),
            model=r["model"], tensor=_int(r["tensor"]), samples=_int(r["samples"]),
            seq_len=_int(r["seq_len"]), m=_int(r["m"]), k=_int(r["k"]), n=_int(r["n"]),
            pass_=r["pass"], nbytes=float(r["nbytes"] or 0), attention=r["attention"]))
    forwards = {_block_key(t): t for t in out if t.item == "block" and t.pass_ == "F"}
    backs = [dataclasses.replace(t, pass_="B", seconds=t.seconds - forwards[_block_key(t)].seconds)
             for t in out if t.item == "block" and t.pass_ == "FB" and _block_key(t) in forwards]
    return tuple(out) + tuple(backs)


def _block_key(t: LayerTiming) -> tuple:
    return (t.device_kind, t.model, t.tensor, t.samples, t.seq_len, t.attention)


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
    if t.item != "block":
        return None
    cfg = dataclasses.replace(tensor_shard(get_config(t.model), t.tensor), seq_len=t.seq_len,
                              dtype="bfloat16", attention="plain",
                              attention_kernel=_KERNELS.get(t.attention, "flash"))
    cost = body_cost(cfg, body_of(cfg, "block0"))
    mesh, layout = _one_device(device), Layout(data=1, tensor=1)
    f = layer_time(cost, "F", t.samples, mesh, layout, seq_len=t.seq_len)
    b = layer_time(cost, "B", t.samples, mesh, layout, seq_len=t.seq_len)
    return {"F": f, "B": b, "FB": f + b}[t.pass_]


def compare(timings: Iterable[LayerTiming], device: DeviceProfile) -> list[Comparison]:
    """Every row with its prediction on ``device``."""
    return [Comparison(t, predict(t, device)) for t in timings]


def summary(comparisons: Sequence[Comparison]) -> dict[str, tuple[int, float, float, float]]:
    """Per item (blocks per attention kernel and pass: ``block cudnn F``, ``block cudnn B``, ...,
    then ``copy``, ``gemm``): rows, mean signed error, mean absolute error and largest absolute
    error, as fractions; blocks first, each kernel's F, B, FB in that order."""
    groups: dict[tuple, list[float]] = {}
    for c in comparisons:
        if c.error is None:
            continue
        t = c.timing
        key = ((0, t.attention, _PASSES.index(t.pass_)) if t.item == "block" else (1, t.item, 0))
        groups.setdefault(key, []).append(c.error)
    return {(f"block {k[1]} {_PASSES[k[2]]}" if k[0] == 0 else k[1]):
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
