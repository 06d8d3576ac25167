"""Prices, power and efficiency figures a report uses, each with where it came from.

Precedence of a device-hour price (USD per device per hour, a (low, high) range):
    1. ``--price DEVICE=LOW:HIGH`` (or ``DEVICE=X``) on the command line / ``prices=`` in the API;
    2. ``price_usd_per_device_hour`` on a mesh in the cluster file (one figure: low = high);
    3. the device profile's ``price_usd_per_device_hour`` (``hardware_profiles/devices/*.yaml``).
A device with none of these makes the option's cost columns NaN and the report says so.

Efficiencies (matmul, memory, fragment overhead) and power come from the device profile (a mesh's
``power_w_per_device`` overrides the TDP); their origins are copied into the report verbatim.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hardware_profiles.types import Cluster, DeviceProfile
from reports.citations import cite
from reports.errors import ReportError
from hardware_profiles.loader import DEVICES_DIR
from ir.files import InputError, read_yaml


MAX_PRICE = 1e6
"""Largest price accepted, USD per device-hour (the cluster loader's limit too)."""


@dataclass(frozen=True, slots=True)
class PriceEntry:
    """One price used: USD per device-hour (low, high) and its origin."""

    device: str
    mesh: str | None
    low: float
    high: float
    source: str
    note: str = ""


def parse_price(text: str) -> tuple[str, float, float]:
    """Parse ``DEVICE=LOW:HIGH`` or ``DEVICE=X`` (USD per device-hour).

    Raises:
        ReportError: malformed text, non-positive or reversed range.
    """
    dev, sep, val = text.partition("=")
    lo_s, _, hi_s = val.partition(":")
    try:
        lo = float(lo_s)
        hi = float(hi_s) if hi_s else lo
    except ValueError:
        lo = hi = float("nan")
    if not sep or not dev or math.isnan(lo) or math.isnan(hi):
        raise ReportError(f"--price {text!r} is not DEVICE=LOW:HIGH; write e.g. h100-sxm=2.5:4.0")
    if not 0 <= lo <= hi <= MAX_PRICE:
        raise ReportError(f"--price {text!r}: need 0 <= LOW <= HIGH <= {MAX_PRICE:g} (finite); "
                          f"swap or fix the figures")
    return dev, lo, hi


def parse_prices(items: Iterable[str] | Mapping[str, object] | None) -> dict[str, tuple[float, float]]:
    """Price overrides from CLI strings or a ``{device: (low, high) | x}`` mapping.

    Raises:
        ReportError: a malformed entry.
    """
    out: dict[str, tuple[float, float]] = {}
    if not items:
        return out
    if isinstance(items, Mapping):
        for dev, v in items.items():
            if isinstance(v, (int, float)):
                lo = hi = float(v)
            else:
                try:
                    lo, hi = (float(x) for x in v)  # type: ignore[union-attr]
                except (TypeError, ValueError):
                    raise ReportError(f"price for {dev!r} is {v!r}; give a number or [low, high]") from None
            _, lo, hi = parse_price(f"{dev}={lo}:{hi}")
            out[str(dev)] = (lo, hi)
        return out
    for it in items:
        dev, lo, hi = parse_price(it)
        out[dev] = (lo, hi)
    return out


def mesh_prices(cluster: Cluster, overrides: Mapping[str, tuple[float, float]]) -> list[PriceEntry]:
    """The per-device-hour price of every mesh of ``cluster`` (one entry per mesh, in order)."""
    out = []
    for name, m in cluster.meshes.items():
        dev = m.device
        if dev.name in overrides:
            lo, hi = overrides[dev.name]
            out.append(PriceEntry(dev.name, name, lo, hi, "command line --price override"))
        elif m.price_per_device_hour is not None:
            p = m.price_per_device_hour
            out.append(PriceEntry(dev.name, name, p, p,
                                  f"cluster file {cluster.path or cluster.name}: mesh {name} "
                                  f"price_usd_per_device_hour"))
        elif dev.price_per_hour is not None:
            lo, hi = dev.price_per_hour
            out.append(PriceEntry(dev.name, name, lo, hi, dev.sources.get("price_per_hour", ""),
                                  _price_note(dev)))
        else:
            out.append(PriceEntry(dev.name, name, float("nan"), float("nan"),
                                  "no price known; pass --price " + dev.name + "=LOW:HIGH"))
    return out


def _price_note(dev: DeviceProfile) -> str:
    """The profile's price note is not kept by the loader; read it from the YAML (best effort,
    through the guarded reader :func:`ir.files.read_yaml`; any problem gives no note)."""
    path = DEVICES_DIR / f"{dev.name}.yaml"
    try:
        data = read_yaml(path, "device profile")
        return str((data.get("price_usd_per_device_hour") or {}).get("note", ""))
    except (InputError, AttributeError):
        return ""


def cluster_price(cluster: Cluster, overrides: Mapping[str, tuple[float, float]]
                  ) -> tuple[float, float, list[PriceEntry]]:
    """(low, high) USD per hour for the whole cluster and the entries used (NaN when unknown)."""
    entries = mesh_prices(cluster, overrides)
    lo = sum(e.low * m.num_devices for e, m in zip(entries, cluster.meshes.values()))
    hi = sum(e.high * m.num_devices for e, m in zip(entries, cluster.meshes.values()))
    return lo, hi, entries


def cluster_power_watts(cluster: Cluster) -> float:
    """Sum of the devices' board power (TDP or the mesh's ``power_w_per_device``), W."""
    return sum(m.power_watts for m in cluster.meshes.values())


def figure_rows(clusters: Iterable[Cluster], overrides: Mapping[str, tuple[float, float]]
                ) -> list[dict[str, str]]:
    """Every price, power and efficiency figure the report uses, one row each, with its source.

    Returns rows ``{"device", "figure", "value", "source"}``, devices in first-seen order, each
    figure once (distinct cluster-file prices get a row each).
    """
    rows: list[dict[str, str]] = []
    seen: set[tuple[str, str, str]] = set()

    def add(device: str, figure: str, value: str, source: str) -> None:
        key = (device, figure, value)
        if key not in seen:
            seen.add(key)
            rows.append({"device": device, "figure": figure, "value": value,
                         "source": cite(source)})

    for c in clusters:
        for e, m in zip(mesh_prices(c, overrides), c.meshes.values()):
            rng = f"${e.low:.4g}" if e.low == e.high else f"${e.low:.4g} - ${e.high:.4g}"
            add(e.device, "price per device-hour", rng,
                e.source + (f" ({e.note})" if e.note else ""))
            d = m.device
            per = m.power_watts_per_device
            add(d.name, "power per device", f"{per or d.tdp_watts:g} W",
                "cluster file power_w_per_device" if per else d.sources.get("tdp_watts", ""))
            add(d.name, "matmul efficiency", f"{d.matmul_efficiency:g}",
                d.sources.get("matmul_efficiency", ""))
            add(d.name, "memory-bandwidth efficiency", f"{d.memory_efficiency:g}",
                d.sources.get("memory_efficiency", ""))
            add(d.name, "fragment overhead", f"{d.fragment_overhead * 1e6:g} us",
                d.sources.get("fragment_overhead", ""))
            add(d.name, "peak bf16", f"{d.peak('bf16') / 1e12:g} TFLOP/s",
                d.sources.get("peak_flops.bf16", ""))
            add(d.name, "memory", f"{d.memory_bytes / 1e9:g} GB", d.sources.get("memory_bytes", ""))
            for a in d.alternatives:
                add(d.name, f"alternative {a.field}", _fmt_alt(a.field, a.value),
                    a.source + (f" ({a.note})" if a.note else ""))
    return rows


def _fmt_alt(field: str, value: float) -> str:
    if field.startswith("peak_flops"):
        return f"{value / 1e12:g} TFLOP/s"
    if field == "memory_bytes":
        return f"{value / 1e9:.4g} GB"
    if field.endswith("bandwidth"):
        return f"{value / 1e9:g} GB/s"
    if field.endswith("latency"):
        return f"{value * 1e6:g} us"
    if field == "tdp_watts":
        return f"{value:g} W"
    return f"{value:g}"
