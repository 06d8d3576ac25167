"""What-if inputs: options (a cluster plus per-option search settings) and bundled examples.

An example file (``reports/examples/<name>.yaml``)::

    name: llama70b-1t
    title: Train Llama 3 70B on 1T tokens
    model: llama3-70b
    global_batch: 256          # optional; samples per step
    tokens: 1.0e12             # training: token budget
    deadline_days: 60          # training: the deadline the recommendation checks
    videos_per_hour: 100       # inference: demand
    time_limit_s: 20           # per-option planner budget
    prices: {h100-sxm: [2.0, 3.0]}   # optional USD per device-hour overrides
    options:
      - cluster: h100x64       # bundled stem or a path (relative to the example file)
        label: 64 H100
        max_tensor: 8          # optional PlanOptions fields: time_limit_s, max_tensor,
                               #   schedules, microbatches
    sweep: {...}               # or a budget sweep (see reports.sweep)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from hardware_profiles import load_cluster
from hardware_profiles.types import Cluster, ProfileError
from ir.files import InputError
from ir.files import read_yaml as guarded_yaml
from reports.errors import ReportError

EXAMPLES_DIR = Path(__file__).parent / "examples"
"""Bundled example definitions (YAML)."""

_OPTION_KEYS = {"cluster", "label", "time_limit_s", "max_tensor", "schedules", "microbatches", "note"}
_EXAMPLE_KEYS = {"name", "title", "model", "global_batch", "seq_len", "tokens", "deadline_days",
                 "videos_per_hour", "time_limit_s", "prices", "options", "sweep", "description",
                 "serving"}


@dataclass(frozen=True, slots=True)
class Option:
    """One hardware option: a cluster and the planner settings used for it.

    Attributes:
        cluster: the cluster (SI units).
        label: the name shown in the report.
        time_limit_s: planner wall-clock budget for this option (None: the run's default).
        max_tensor: largest tensor-parallel degree (None: the planner's default, 8). Single-mesh
            TPU pods need more: the planner has no ZeRO/FSDP, so a 70B model fits 16 GB chips
            only with wide tensor parallelism.
        schedules / microbatches: restrict the search (None: the planner's defaults).
        note: shown next to the option.
    """

    cluster: Cluster
    label: str
    time_limit_s: float | None = None
    max_tensor: int | None = None
    schedules: tuple[str, ...] | None = None
    microbatches: tuple[int, ...] | None = None
    note: str = ""


OptionLike = Union[str, Path, Cluster, Option, Mapping[str, Any]]
"""What an option may be given as (:func:`to_option`): a cluster path or bundled stem, a
:class:`Cluster`, an :class:`Option`, or a mapping ``{cluster, label, time_limit_s, ...}``."""


def _load(path: str | Path, base: Path | None) -> Cluster:
    p = Path(path)
    if base is not None and not p.is_absolute() and (base / p).exists():
        p = base / p
    try:
        return load_cluster(p if p.exists() else str(path))
    except ProfileError as e:
        raise ReportError(f"option cluster {str(path)!r}: {e}") from None


def to_option(x: OptionLike, base: Path | None = None) -> Option:
    """An :class:`Option` from a path or bundled stem, a :class:`Cluster`, a mapping or an Option.

    Raises:
        ReportError: unknown keys, a cluster that does not load, a bad setting.
    """
    if isinstance(x, Option):
        return x
    if isinstance(x, Cluster):
        return Option(x, x.name)
    if isinstance(x, (str, Path)):
        c = _load(x, base)
        return Option(c, c.name)
    if not isinstance(x, Mapping) or "cluster" not in x:
        raise ReportError(f"option {x!r} is not a cluster path or a mapping with 'cluster:'")
    bad = set(x) - _OPTION_KEYS
    if bad:
        raise ReportError(f"option {x.get('cluster')!r} has unknown keys {sorted(bad)}; "
                          f"use {sorted(_OPTION_KEYS)}")
    if not isinstance(x["cluster"], (str, Path, Cluster)) or not str(x["cluster"]).strip():
        raise ReportError(f"option cluster {x['cluster']!r} is not a cluster file or bundled name; "
                          f"write e.g. 'cluster: h100x64'")
    c = x["cluster"] if isinstance(x["cluster"], Cluster) else _load(x["cluster"], base)
    where = f"option {c.name!r}"
    for key in ("schedules", "microbatches"):
        if x.get(key) is not None and not isinstance(x[key], (list, tuple)):
            raise ReportError(f"{where}: {key} = {x[key]!r} is not a list; fix: write e.g. "
                              f"'{key}: {'[1f1b]' if key == 'schedules' else '[4, 8]'}'")
    try:
        return Option(
            c, str(x.get("label") or c.name),
            time_limit_s=(_number(f"{where}: time_limit_s", x["time_limit_s"], float, 0.0, 86400.0)
                          if x.get("time_limit_s") is not None else None),
            max_tensor=(_number(f"{where}: max_tensor", x["max_tensor"], int, 1, 2**20)
                        if x.get("max_tensor") is not None else None),
            schedules=_schedules(where, x["schedules"]) if x.get("schedules") else None,
            microbatches=(tuple(_number(f"{where}: microbatches", m, int, 1, 2**16)
                                for m in x["microbatches"]) if x.get("microbatches") else None),
            note=str(x.get("note", "")))
    except (TypeError, ValueError) as e:
        if isinstance(e, ReportError):
            raise
        raise ReportError(f"option {c.name!r}: bad setting ({e}); time_limit_s is seconds, "
                          f"max_tensor an integer, schedules/microbatches lists") from None


def list_examples() -> list[str]:
    """Names of the bundled examples."""
    return sorted(p.stem for p in EXAMPLES_DIR.glob("*.yaml"))


def read_yaml(path: str | Path, what: str) -> dict[str, Any]:
    """A YAML mapping from ``path``, read through the tool's guarded reader
    (:func:`ir.files.read_yaml`: size, encoding, nesting, aliases and non-finite numbers).

    Raises:
        ReportError: missing or unreadable file, malformed or hostile YAML, not a mapping.
    """
    p = Path(path)
    try:
        data = guarded_yaml(p, f"{what} YAML")
    except InputError as e:
        raise ReportError(str(e)) from None
    if not isinstance(data, dict):
        raise ReportError(f"{what} file {str(p)!r} is not a mapping; write 'key: value' pairs")
    return data


def load_example(name_or_path: str | Path) -> tuple[dict[str, Any], Path]:
    """The example definition (a mapping) and the directory its relative paths resolve against.

    Raises:
        ReportError: unknown example (lists the bundled ones), unknown keys, malformed file.
    """
    p = Path(name_or_path)
    given_path = p.exists() or str(name_or_path).endswith((".yaml", ".yml")) or "/" in str(name_or_path)
    if not given_path:
        p = EXAMPLES_DIR / f"{name_or_path}.yaml"
        if not p.is_file():
            raise ReportError(f"unknown example {str(name_or_path)!r}; use one of {list_examples()} "
                              f"or a path to an example YAML")
    data = read_yaml(p, "example")
    bad = set(data) - _EXAMPLE_KEYS
    if bad:
        raise ReportError(f"example {str(p)!r} has unknown keys {sorted(bad)}; use {sorted(_EXAMPLE_KEYS)}")
    if "model" not in data or not ("options" in data or "sweep" in data):
        raise ReportError(f"example {str(p)!r} needs 'model:' and 'options:' or 'sweep:'")
    for key, kind, example in (("options", list, "options: [h100x64]"),
                               ("sweep", Mapping, "sweep: {budget_usd_per_hour: 100, devices: ...}"),
                               ("prices", Mapping, "prices: {h100-sxm: [2.0, 3.0]}"),
                               ("name", str, "name: my-example"), ("title", str, "title: My example"),
                               ("model", str, "model: llama3-70b")):
        if data.get(key) is not None and not isinstance(data[key], kind):
            raise ReportError(f"example {str(p)!r}: {key} is {type(data[key]).__name__}; "
                              f"write e.g. '{example}'")
    data.setdefault("name", p.stem)
    # PyYAML reads 1.0e12 (no exponent sign) as a string: coerce numeric keys explicitly
    for key, (kind, lo, hi) in _EXAMPLE_NUMBERS.items():
        if data.get(key) is not None:
            data[key] = _number(f"example {str(p)!r}: {key}", data[key], kind, lo, hi)
    return data, p.parent


_EXAMPLE_NUMBERS = {"tokens": (float, 0.0, 1e18), "videos_per_hour": (float, 0.0, 1e9),
                    "deadline_days": (float, 0.0, 1e5), "time_limit_s": (float, 0.0, 86400.0),
                    "global_batch": (int, 1, 2**24), "seq_len": (int, 1, 2**22)}
"""Example key -> (type, exclusive lower bound for floats / inclusive for ints, upper bound)."""


def _schedules(where: str, names: list[Any] | tuple[Any, ...]) -> tuple[str, ...]:
    """An option's ``schedules``: names of :data:`simulator.schedules.KINDS`.

    Raises:
        ReportError: a name that is not a schedule (the known ones listed).
    """
    from simulator.schedules import KINDS

    for s in names:
        if not isinstance(s, str) or s not in KINDS:
            raise ReportError(f"{where}: schedules holds {s!r}, not a schedule; fix: use "
                              f"{', '.join(KINDS)}")
    return tuple(names)


def _number(where: str, value: Any, kind: type, lo: float, hi: float) -> Any:
    """``value`` as ``kind`` within the bounds (never a bool), or a one-line :class:`ReportError`."""
    try:
        if isinstance(value, bool):
            raise TypeError("a bool")
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        raise ReportError(f"{where} = {value!r} is not a number; fix: write a number") from None
    ok = math.isfinite(x) and x <= hi and (lo <= x == int(x) if kind is int else lo < x)
    if not ok:
        want = (f"an integer from {int(lo)} to {int(hi)}" if kind is int
                else f"a number above {lo:g} and at most {hi:g}")
        raise ReportError(f"{where} = {value!r} is not {want}; fix: use {want}")
    return kind(x)
