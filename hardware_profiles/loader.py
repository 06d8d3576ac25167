"""Load device profiles from YAML into the SI types of ``hardware_profiles.types`` (cluster specs:
:mod:`hardware_profiles.cluster_loader`, which shares this module's error translation).

Files are validated with pydantic v2 (their shapes, human units in key names) and converted once, on
load, into frozen dataclasses in SI units: FLOP/s, bytes, B/s, seconds, watts.

Unit conversions (exact):
    TFLOP/s -> x 1e12 FLOP/s;  GB -> x 1e9 B;  GiB -> x 2**30 B;  GB/s -> x 1e9 B/s;
    Gbit/s -> x 1e9 / 8 B/s;   us -> x 1e-6 s.

Every bad input raises :class:`ProfileError` with one line naming the file, the bad value and the fix;
pydantic ``ValidationError``, ``KeyError`` and YAML errors never escape.

Files are read through :func:`ir.files.read_yaml` (the tool's one guarded reader: size limit,
UTF-8 only, no binary files, bounded nesting and aliases, no ``.inf``/``.nan``); its
:class:`ir.files.InputError` is re-raised as :class:`ProfileError` with the same one-line message.
Layering: ``hardware_profiles`` imports no other project package except that leaf module
(``ir.files`` imports nothing from the project).

Absurd values are refused with one line naming the value and the limit: at most
:data:`MAX_DEVICES` devices per mesh (and per axis), figures in human units (TFLOP/s, GB, GB/s, W,
USD per device-hour) at most :data:`MAX_FIGURE` and, except prices, at least :data:`MIN_FIGURE`;
Gbit/s at most :data:`MAX_GBIT`; latencies and overheads under a second (:data:`MAX_US` us); at
most :data:`MAX_MESHES` meshes (or :data:`MAX_NODES` nodes in node groups); names as :data:`NAME_PATTERN`; no value infinite or NaN.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ir.files import InputError, read_yaml
from ir.precision import RECIPES

from hardware_profiles.paths import DEVICES_DIR, looks_like_path
from hardware_profiles.file_shapes import (  # noqa: F401  (limits re-exported: other modules name them here)
    GB, GBIT, GIB, MAX_DEVICES, MAX_FIGURE, MAX_GBIT, MAX_MESHES, MAX_NODES, MAX_TOTAL_DEVICES, MAX_US,
    MIN_FIGURE, NAME_PATTERN, TFLOPS, US, _AltFile, _DeviceFile)
from hardware_profiles.types import Alternative, DeviceProfile, ProfileError


# ----------------------------------------------------------------------------- error translation
_FIXES = {
    "missing": "add this key",
    "extra_forbidden": "remove this key or fix its spelling",
    "greater_than": "use a positive number",
    "greater_than_equal": "use a number >= the minimum",
    "less_than_equal": "use a value <= the maximum",
    "less_than": "use a value below the maximum",
    "finite_number": "use a finite number",
    "string_too_long": "use a shorter string",
    "string_pattern_mismatch": "use letters, digits and _ . + - only (starting with a letter or digit)",
    "float_parsing": "use a number",
    "float_type": "use a number",
    "int_parsing": "use an integer",
    "int_type": "use an integer",
    "int_from_float": "use an integer",
    "string_type": "use a string",
    "dict_type": "use a mapping (key: value)",
    "list_type": "use a list",
    "tuple_type": "use a list of two mesh names",
    "too_short": "add at least one entry",
    "too_long": "use exactly two mesh names",
    "model_type": "use a mapping (key: value)",
}


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _from_validation(path: Path, err: ValidationError) -> ProfileError:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"]) or "<top level>"
    fix = _FIXES.get(e["type"], "correct this value")
    value = "missing" if e["type"] == "missing" else repr(e.get("input"))
    if len(value) > 80:
        value = value[:77] + "..."
    more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return ProfileError(_one_line(f"{path}: {loc} = {value}: {e['msg']}; fix: {fix}{more}"))


def _read_yaml(path: Path, what: str) -> dict[str, Any]:
    try:
        data = read_yaml(path, what)
    except InputError as exc:
        raise ProfileError(str(exc)) from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: top level is {type(data).__name__}, not a mapping; "
                           f"fix: write the {what} as 'key: value' pairs")
    return data


# ----------------------------------------------------------------------------- devices
_ALT_FIELDS = {  # file key -> (SI field, factor)
    "memory_gb": ("memory_bytes", GB),
    "memory_gib": ("memory_bytes", GIB),
    "memory_bandwidth_gb_per_s": ("memory_bandwidth", GB),
    "scale_up.bandwidth_gb_per_s_per_direction": ("scale_up_bandwidth", GB),
    "scale_up.latency_us": ("scale_up_latency", US),
    "scale_out.bandwidth_gbit_per_s_per_direction": ("scale_out_bandwidth", GBIT),
    "tdp_w": ("tdp_watts", 1.0),
    "price_usd_per_device_hour": ("price_per_hour", 1.0),
}


def _alternative(path: Path, alt: _AltFile) -> Alternative:
    if alt.field.startswith("peak_tflops."):
        return Alternative(f"peak_flops.{alt.field.split('.', 1)[1]}", alt.value * TFLOPS, alt.source, alt.note)
    if alt.field not in _ALT_FIELDS:
        raise ProfileError(f"{path}: alternatives field {alt.field!r} is unknown; fix: use one of "
                           f"{sorted(_ALT_FIELDS) + ['peak_tflops.<dtype>']}")
    name, factor = _ALT_FIELDS[alt.field]
    return Alternative(name, alt.value * factor, alt.source, alt.note)


def _device_from_file(path: Path) -> DeviceProfile:
    data = _read_yaml(path, "device profile")
    try:
        f = _DeviceFile.model_validate(data)
    except ValidationError as err:
        raise _from_validation(path, err) from None
    if f.name != path.stem:
        raise ProfileError(f"{path}: name {f.name!r} differs from the file stem {path.stem!r}; "
                           f"fix: set 'name: {path.stem}' or rename the file")
    if (f.memory_gb is None) == (f.memory_gib is None):
        raise ProfileError(f"{path}: memory given as {'both' if f.memory_gb else 'neither'} memory_gb and memory_gib; "
                           f"fix: give exactly one of them")
    if "bf16" not in f.peak_tflops and "fp16" not in f.peak_tflops:
        raise ProfileError(f"{path}: peak_tflops has no 'bf16' or 'fp16' entry (has {sorted(f.peak_tflops)}); "
                           f"fix: add the device's 16-bit matmul rate")
    for dtype, rule in f.precision_rules.items():
        if rule.value not in f.peak_tflops:
            raise ProfileError(f"{path}: precision_rules.{dtype} names {rule.value!r}, which peak_tflops lacks "
                               f"(has {sorted(f.peak_tflops)}); fix: name one of them or add its rate")
    for name in f.training_formats:
        got = RECIPES.get(name)
        if got is None or not got.low_precision:
            raise ProfileError(f"{path}: training_formats names {name!r}, not a low-precision "
                               f"recipe; fix: use one of "
                               f"{', '.join(r for r in RECIPES if RECIPES[r].low_precision)}")
        if got.peak not in f.peak_tflops:
            raise ProfileError(f"{path}: training_formats.{name} runs at the {got.peak} rate, "
                               f"which peak_tflops lacks (has {sorted(f.peak_tflops)}); fix: add "
                               f"peak_tflops.{got.peak} with its source or drop {name}")
    if f.price_usd_per_device_hour and f.price_usd_per_device_hour.low > f.price_usd_per_device_hour.high:
        p = f.price_usd_per_device_hour
        raise ProfileError(f"{path}: price_usd_per_device_hour low {p.low} > high {p.high}; fix: swap them")
    mem, mem_key, mem_factor = (f.memory_gb, "memory_gb", GB) if f.memory_gb else (f.memory_gib, "memory_gib", GIB)
    sources = {f"peak_flops.{k}": v.source for k, v in f.peak_tflops.items()}
    sources.update({f"precision_rules.{k}": v.source for k, v in f.precision_rules.items()})
    sources.update({f"training_formats.{k}": v.origin for k, v in f.training_formats.items()})
    sources.update({
        "memory_bytes": f"{mem.source} [{mem_key}]",
        "memory_bandwidth": f.memory_bandwidth_gb_per_s.source,
        "scale_up_bandwidth": f.scale_up.bandwidth_gb_per_s_per_direction.source,
        "scale_up_latency": f.scale_up.latency_us.source,
        "scale_out_bandwidth": f.scale_out.bandwidth_gbit_per_s_per_direction.source,
        "tdp_watts": f.tdp_w.source,
        "matmul_efficiency": f.efficiency.matmul.origin,
        "memory_efficiency": f.efficiency.memory.origin,
        "fragment_overhead": f.efficiency.fragment_overhead_us.origin,
    })
    if f.efficiency.weight_stream is not None:
        sources["weight_stream_efficiency"] = f.efficiency.weight_stream.origin
    if f.efficiency.backward is not None:
        sources["backward_efficiency"] = f.efficiency.backward.origin
    for key, attr in (("attention", "attention_efficiency"),
                      ("attention_backward", "attention_backward_efficiency"),
                      ("attention_half_tokens", "attention_half_tokens"),
                      ("attention_backward_half_tokens", "attention_backward_half_tokens"),
                      ("flash2_attention", "flash2_attention")):
        got = getattr(f.efficiency, key)
        if got is not None:
            sources[attr] = got.origin
    if f.efficiency.roofline is not None:
        sources["roofline"] = f.efficiency.roofline.origin
    if f.efficiency.elementwise_traffic is not None:
        sources["elementwise_traffic"] = f.efficiency.elementwise_traffic.origin
    for key, attr in (("scale_out", "scale_out_efficiency"), ("comm_interference", "comm_interference"),
                      ("grad_sync_overlap", "grad_sync_overlap"), ("sync_jitter", "sync_jitter")):
        got = getattr(f.efficiency, key)
        if got is not None:
            sources[attr] = got.origin
    if f.lockstep_devices is not None:
        sources["lockstep_devices"] = f.lockstep_devices.source
    if f.chip is not None:
        sources["chip"] = f.chip.source
    if f.scale_up.topology:
        sources["scale_up_topology"] = f.scale_up.topology
    if f.scale_up.one_hop is not None:
        sources["scale_up_one_hop"] = f.scale_up.one_hop.source
    if f.scale_up.domain is not None:
        sources["scale_up_domain"] = f.scale_up.domain.source
    for key, unit in (("decode_layer_overhead", "_us"), ("prefill_layer_overhead", "_us"),
                      ("forward_layer_overhead", "_us"), ("backward_layer_overhead", "_us"),
                      ("logit_overhead", "_ns"), ("forward_routing_pair", "_ns"),
                      ("backward_routing_pair", "_ns"), ("routed_element", "_ps"),
                      ("dropless_routing_pair", "_ns")):
        got = getattr(f.efficiency, key + unit)
        if got is not None:
            sources[key] = got.origin
    if f.scale_up.torus_dimensions is not None:
        sources["torus_dims"] = f.scale_up.torus_dimensions.source
    tiling = None
    if f.gemm_tiling is not None:
        g = f.gemm_tiling
        tiling = (g.compute_units, g.tile_m, g.tile_n)
        sources["gemm_tiling"] = g.source
    price = None
    if f.price_usd_per_device_hour is not None:
        price = (f.price_usd_per_device_hour.low, f.price_usd_per_device_hour.high)
        sources["price_per_hour"] = f.price_usd_per_device_hour.source
    return DeviceProfile(
        name=f.name,
        vendor=f.vendor,
        description=f.description,
        peak_flops={k: v.value * TFLOPS for k, v in f.peak_tflops.items()},
        memory_bytes=mem.value * mem_factor,
        memory_bandwidth=f.memory_bandwidth_gb_per_s.value * GB,
        scale_up_bandwidth=f.scale_up.bandwidth_gb_per_s_per_direction.value * GB,
        scale_up_latency=f.scale_up.latency_us.value * US,
        torus_dims=f.scale_up.torus_dimensions.value if f.scale_up.torus_dimensions else 0,
        scale_out_bandwidth=f.scale_out.bandwidth_gbit_per_s_per_direction.value * GBIT,
        tdp_watts=f.tdp_w.value,
        price_per_hour=price,
        matmul_efficiency=f.efficiency.matmul.value,
        memory_efficiency=f.efficiency.memory.value,
        weight_stream_efficiency=(f.efficiency.weight_stream.value
                                  if f.efficiency.weight_stream else None),
        fragment_overhead=f.efficiency.fragment_overhead_us.value * US,
        backward_efficiency=f.efficiency.backward.value if f.efficiency.backward else 1.0,
        attention_efficiency=f.efficiency.attention.value if f.efficiency.attention else 1.0,
        attention_backward_efficiency=(f.efficiency.attention_backward.value
                                       if f.efficiency.attention_backward else None),
        attention_half_tokens=(f.efficiency.attention_half_tokens.value
                               if f.efficiency.attention_half_tokens else 0.0),
        attention_backward_half_tokens=(f.efficiency.attention_backward_half_tokens.value
                                        if f.efficiency.attention_backward_half_tokens else 0.0),
        flash2_attention=(f.efficiency.flash2_attention.value
                          if f.efficiency.flash2_attention else 1.0),
        roofline=f.efficiency.roofline.value if f.efficiency.roofline else "max",
        elementwise_traffic=(f.efficiency.elementwise_traffic.value
                             if f.efficiency.elementwise_traffic else 0.0),
        gemm_tiling=tiling,
        scale_out_efficiency=f.efficiency.scale_out.value if f.efficiency.scale_out else 1.0,
        comm_interference=(f.efficiency.comm_interference.value
                           if f.efficiency.comm_interference else 0.0),
        grad_sync_overlap=(f.efficiency.grad_sync_overlap.value
                           if f.efficiency.grad_sync_overlap else "bucketed"),
        sync_jitter=f.efficiency.sync_jitter.value if f.efficiency.sync_jitter else 0.0,
        lockstep_devices=f.lockstep_devices.value if f.lockstep_devices else 8,
        chip=f.chip.value if f.chip else f.name,
        scale_up_one_hop=bool(f.scale_up.one_hop and f.scale_up.one_hop.value),
        scale_up_domain=f.scale_up.domain.value if f.scale_up.domain is not None else None,
        decode_layer_overhead=(f.efficiency.decode_layer_overhead_us.value * US
                               if f.efficiency.decode_layer_overhead_us else None),
        prefill_layer_overhead=(f.efficiency.prefill_layer_overhead_us.value * US
                                if f.efficiency.prefill_layer_overhead_us else None),
        forward_layer_overhead=(f.efficiency.forward_layer_overhead_us.value * US
                                if f.efficiency.forward_layer_overhead_us else 0.0),
        backward_layer_overhead=(f.efficiency.backward_layer_overhead_us.value * US
                                 if f.efficiency.backward_layer_overhead_us else 0.0),
        forward_routing_pair=(f.efficiency.forward_routing_pair_ns.value * 1e-9
                              if f.efficiency.forward_routing_pair_ns else 0.0),
        backward_routing_pair=(f.efficiency.backward_routing_pair_ns.value * 1e-9
                               if f.efficiency.backward_routing_pair_ns else 0.0),
        routed_element=(f.efficiency.routed_element_ps.value * 1e-12
                        if f.efficiency.routed_element_ps else 0.0),
        dropless_routing_pair=(f.efficiency.dropless_routing_pair_ns.value * 1e-9
                               if f.efficiency.dropless_routing_pair_ns else 0.0),
        layer_overhead_ops=tuple((getattr(f.efficiency, k).ops or 0)
                                 if getattr(f.efficiency, k) else 0
                                 for k in ("forward_layer_overhead_us",
                                           "backward_layer_overhead_us")),
        logit_overhead=(f.efficiency.logit_overhead_ns.value * 1e-9
                        if f.efficiency.logit_overhead_ns else 0.0),
        precision_rules={k: v.value for k, v in f.precision_rules.items()},
        format_efficiency={k: v.efficiency for k, v in f.training_formats.items()},
        sources=sources,
        alternatives=tuple(_alternative(path, a) for a in f.alternatives),
    )


@functools.lru_cache(maxsize=None)
def _device_cached(resolved: str) -> DeviceProfile:
    return _device_from_file(Path(resolved))


def known_device_ids() -> list[str]:
    """Sorted ids of the bundled device profiles (the YAML stems in ``hardware_profiles/devices``)."""
    return sorted(p.stem for p in DEVICES_DIR.glob("*.yaml"))


DEVICE_ALIASES = {"h100": "h100-sxm", "h100-sxm5": "h100-sxm", "h100-80gb": "h100-sxm",
                  "h100-sxm-80gb": "h100-sxm", "h200": "h200-sxm", "h800": "h800-sxm",
                  "a100": "a100-80gb-sxm", "a100-80gb": "a100-80gb-sxm",
                  "a100-sxm4-80gb": "a100-80gb-sxm", "a100-40gb": "a100-40gb-sxm",
                  "a100-sxm4-40gb": "a100-40gb-sxm", "v100-16gb": "v100-sxm2-16gb",
                  "v100-32gb": "v100-sxm2-32gb", "v5e": "tpu-v5e", "v5litepod": "tpu-v5e",
                  "tpu-v5-lite": "tpu-v5e", "v5p": "tpu-v5p", "v6e": "tpu-v6e",
                  "trillium": "tpu-v6e", "tpu-trillium": "tpu-v6e", "v4": "tpu-v4"}
"""Device names as published tables and papers print them (after :func:`canonical_device`'s
normalising) -> the bundled profile ids. A plain ``A100`` is the 80 GB part (the one NVIDIA's and
MLPerf's recent tables run); a plain ``V100`` is left unresolved (16 and 32 GB parts both ran)."""


def canonical_device(name: str) -> str:
    """``name`` as a bundled device id where it spells one: lower case, spaces and underscores as
    hyphens, a system prefix (``DGX-``, ``HGX-``) and a rack suffix (``-NVL72``, ``-NVL36``)
    dropped, then :data:`DEVICE_ALIASES` (``"DGX-H100"`` -> ``"h100-sxm"``, ``"GB200 NVL72"`` ->
    ``"gb200"``, ``"TPU v5e"`` -> ``"tpu-v5e"``); any other name normalised and returned (the
    caller says it is unknown)."""
    key = "-".join(str(name).strip().lower().replace("_", " ").split())
    key = re.sub(r"^(dgx|hgx)-", "", key)
    key = re.sub(r"-nvl\d+$", "", key)
    if key.startswith("tpu") and not key.startswith("tpu-"):
        key = "tpu-" + key[3:].lstrip("-")
    return DEVICE_ALIASES.get(key, key)


def load_device(name_or_path: str | Path, base_dir: str | Path | None = None) -> DeviceProfile:
    """Load a device profile by bundled id (``"h100-sxm"``) or by path to a device YAML.

    Args:
        name_or_path: a profile id (or a name :func:`canonical_device` resolves to one), or a path (``str`` ending in ``.yaml``/containing ``/``, or ``Path``).
        base_dir: directory that relative paths are resolved against (default: the working directory).

    Returns:
        The profile in SI units (cached: the same file returns the same frozen object).

    Raises:
        ProfileError: unknown id (the message lists the known ids), missing file, malformed YAML,
            or an invalid value.
    """
    if isinstance(name_or_path, Path) or looks_like_path(str(name_or_path)):
        path = Path(name_or_path)
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
    else:
        path = DEVICES_DIR / f"{name_or_path}.yaml"
        if not path.is_file():
            path = DEVICES_DIR / f"{canonical_device(str(name_or_path))}.yaml"
        if not path.is_file():
            raise ProfileError(f"unknown device {str(name_or_path)!r}; fix: use one of {known_device_ids()} "
                               f"or a path to a device YAML")
    return _device_cached(str(path.resolve()))


def list_devices() -> list[DeviceProfile]:
    """Every bundled device profile, sorted by name.

    Raises:
        ProfileError: a bundled profile is invalid.
    """
    return [load_device(n) for n in known_device_ids()]
