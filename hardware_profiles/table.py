"""A printable table of every bundled device profile (for ``mpmd profiles``).

Figures are shown in human units (TFLOP/s, GB, GB/s, W, USD per hour) converted back from the SI values
of the loaded profiles; the sources are in the YAML files and in ``DeviceProfile.sources``. The
"efficiency" column says whether the efficiencies were fitted to measured runs ("calibrated") or
are a "prior" (:func:`hardware_profiles.calibration.calibration_status`).
"""

from __future__ import annotations

from rich.table import Table

from hardware_profiles.calibration import calibration_status
from hardware_profiles.loader import list_devices
from hardware_profiles.types import DeviceProfile

COLUMNS = ("id", "vendor", "bf16 TFLOP/s", "memory GB", "mem BW GB/s", "scale-up GB/s/dir",
           "TDP W", "price $/device-h", "matmul eff", "efficiency")


def _fmt(x: float, digits: int = 0) -> str:
    return f"{x:,.{digits}f}"


def _row(d: DeviceProfile) -> tuple[str, ...]:
    if d.price_per_hour is None:
        price = "unknown"
    else:
        lo, hi = d.price_per_hour
        price = f"{lo:.3g}" if lo == hi else f"{lo:.3g}-{hi:.3g}"
    return (
        d.name,
        d.vendor,
        _fmt(d.peak("bf16") / 1e12),
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

    Columns: id, vendor, dense bf16 TFLOP/s, memory GB (1e9 B), memory bandwidth GB/s, scale-up GB/s per
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
