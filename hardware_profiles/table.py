"""Printable tables of every bundled device profile (for ``mpmd profiles``).

Figures are shown in human units (TFLOP/s, GB, GB/s, W, USD per hour) converted back from the SI values
of the loaded profiles; the sources are in the YAML files and in ``DeviceProfile.sources``. The
"efficiency" column says whether the efficiencies were fitted to measured runs ("calibrated") or
are a "prior" (:func:`hardware_profiles.calibration.calibration_status`).

:func:`precision_table` lists each device's matmul rates by the precisions it really has (a V100:
fp16 125 and fp32 15.7, no bf16), "-" where it has none (a model of that dtype is refused there),
and the entry a float32 model runs at (:meth:`DeviceProfile.matmul_precision`).
"""

from __future__ import annotations

from rich.table import Table

from hardware_profiles.calibration import calibration_status
from hardware_profiles.loader import list_devices
from hardware_profiles.types import DeviceProfile

COLUMNS = ("id", "vendor", "bf16 TFLOP/s", "memory GB", "mem BW GB/s", "scale-up GB/s/dir",
           "TDP W", "price $/device-h", "matmul eff", "efficiency")


PRECISION_COLUMNS = ("id", "bf16 TFLOP/s", "fp16 TFLOP/s", "tf32 TFLOP/s", "fp32 TFLOP/s",
                     "fp8 TFLOP/s", "other TFLOP/s", "float32 model at")
"""The columns of :func:`precision_rows`: the dense rates of the common precisions, the device's
other entries (``int8``, Tenstorrent's ``bfp8`` and ``bf16_hifi4``, ``fp4``), and the entry a
float32 model's matmuls run at."""

_NAMED = ("bf16", "fp16", "tf32", "fp32", "fp8")


def _fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def _tflops(flops: float | None) -> str:
    """A rate in TFLOP/s as published: at most one decimal from 1 up (494.5, 2,250), three
    significant digits below (0.147); "-" for a precision the device has no rate for."""
    if flops is None:
        return "-"
    t = flops / 1e12
    return _fmt(t, 1).removesuffix(".0") if t >= 1 else f"{t:.3g}"


def _row(d: DeviceProfile) -> tuple[str, ...]:
    if d.price_per_hour is None:
        price = "unknown"
    else:
        lo, hi = d.price_per_hour
        price = f"{lo:.3g}" if lo == hi else f"{lo:.3g}-{hi:.3g}"
    return (
        d.name,
        d.vendor,
        _tflops(d.peak_flops.get("bf16")),
        _fmt(d.memory_bytes / 1e9, 1),
        _fmt(d.memory_bandwidth / 1e9),
        _fmt(d.scale_up_bandwidth / 1e9),
        _fmt(d.tdp_watts),
        price,
        f"{d.matmul_efficiency:.2f}",
        calibration_status(d),
    )


def profiles_rows(devices: list[DeviceProfile] | None = None) -> list[tuple[str, ...]]:
    """The table's rows as strings (one per device, sorted by id), in ``COLUMNS`` order."""
    return [_row(d) for d in (list_devices() if devices is None else sorted(devices, key=lambda d: d.name))]


def profiles_table(devices: list[DeviceProfile] | None = None) -> Table:
    """A ``rich.table.Table`` listing every bundled device (or ``devices``).

    Columns: id, vendor, dense bf16 TFLOP/s ("-" for a device without bf16: the V100), memory GB (1e9 B), memory bandwidth GB/s, scale-up GB/s per
    direction, TDP W, price range USD per device-hour, matmul efficiency, and whether the
    efficiencies are "calibrated" (fitted to measured runs) or a "prior".

    Raises:
        ProfileError: a bundled profile is invalid.
    """
    table = Table(title="Device profiles (dense peaks; sources in hardware_profiles/devices/*.yaml)")
    for i, col in enumerate(COLUMNS):
        # a header's unit on its own line and no cell wrapped: the table fits 120 columns
        table.add_column("\n".join(col.rsplit(" ", 1)), no_wrap=True,
                         justify="left" if i < 2 or col == "efficiency" else "right")
    for row in profiles_rows(devices):
        table.add_row(*row)
    return table


def _precision_row(d: DeviceProfile) -> tuple[str, ...]:
    other = ", ".join(f"{k} {_tflops(v)}" for k, v in sorted(d.peak_flops.items()) if k not in _NAMED)
    fp32 = d.matmul_precision("fp32") if "fp32" in d.model_dtypes else "-"
    return (d.name, *(_tflops(d.peak_flops.get(k)) for k in _NAMED), other or "-", fp32)


def precision_rows(devices: list[DeviceProfile] | None = None) -> list[tuple[str, ...]]:
    """Each device's matmul rates by precision (one row per device, sorted by id), in
    :data:`PRECISION_COLUMNS` order: dense TFLOP/s of the precisions it has, "-" where it has none,
    and the ``peak_flops`` entry a float32 model runs at ("-": refused)."""
    return [_precision_row(d)
            for d in (list_devices() if devices is None else sorted(devices, key=lambda d: d.name))]


def precision_table(devices: list[DeviceProfile] | None = None) -> Table:
    """:func:`precision_rows` as a ``rich.table.Table`` (fits 120 columns).

    Raises:
        ProfileError: a bundled profile is invalid.
    """
    table = Table(title="Matmul rates by precision (dense TFLOP/s; '-': none, a model of that dtype "
                        "is refused)",
                  caption="A bfloat16 or float16 model runs at its own rate only; a float32 model at "
                          "the last column's (JAX's default: TF32 on NVIDIA Ampere and later, one "
                          "bfloat16 pass on TPU; hardware_profiles.types.DEFAULT_PRECISION and each "
                          "profile's precision_rules)")
    for i, col in enumerate(PRECISION_COLUMNS):
        table.add_column("\n".join(col.rsplit(" ", 1)), no_wrap=i != len(PRECISION_COLUMNS) - 2,
                         justify="left" if i == 0 or i >= len(PRECISION_COLUMNS) - 2 else "right")
    for row in precision_rows(devices):
        table.add_row(*row)
    return table


def recipe_origin(device: DeviceProfile, recipe: str) -> str:
    """Where ``device``'s efficiency for a low-precision ``recipe`` comes from, read off its
    origin in the profile: ``"fitted"`` (on published runs, by ``mpmd validate --fit``, its own or
    its die's), ``"derived"`` (a fitted recipe scaled by a measured GEMM ratio), ``"prior"``, else
    ``"measured"`` (GEMMs timed on the device)."""
    origin = device.sources.get(f"training_formats.{recipe}", "prior")
    if origin.startswith("prior"):
        return "prior"
    if "fitted per-tensor FP8 efficiency" in origin[:100]:
        return "derived"
    return "fitted" if "fitted by" in origin[:100] else "measured"


def recipe_rows(devices: list[DeviceProfile] | None = None) -> list[tuple[str, str]]:
    """Each device that runs low-precision training recipes (``DeviceProfile.training_formats``),
    sorted by id: its id and, per recipe, the recipe's GEMM efficiency relative to BF16 and where it
    comes from (``fitted`` on published runs, ``measured`` GEMMs, ``prior``), e.g.
    ``"fp8 0.875 fitted, fp8-blockwise 0.773 measured"``."""
    out = []
    for d in (list_devices() if devices is None else sorted(devices, key=lambda d: d.name)):
        parts = [f"{r} {d.format_efficiency[r]:.3f} {recipe_origin(d, r)}"
                 for r in d.training_formats[1:]]
        if parts:
            out.append((d.name, ", ".join(parts)))
    return out


def recipe_table(devices: list[DeviceProfile] | None = None) -> Table:
    """:func:`recipe_rows` as a ``rich.table.Table``.

    Raises:
        ProfileError: a bundled profile is invalid.
    """
    table = Table(title="Training precision recipes (mpmd plan --precision): GEMM efficiency "
                        "relative to BF16, and its origin",
                  caption="A recipe a device does not list is refused on it; every device runs "
                          "bf16")
    table.add_column("id")
    table.add_column("recipes")
    for row in recipe_rows(devices):
        table.add_row(*row)
    return table
