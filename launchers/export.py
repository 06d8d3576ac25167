"""The export driver: a plan, a target, the files to write (:func:`export_plan`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ir import DataParallelPlan, Plan
from launchers import maxtext, megatron, megatron_bridge, torchtitan
from launchers.view import LauncherError, PartView, part_views

Renderer = Callable[[PartView, str, Path], tuple[str, list[str]]]

TARGETS: dict[str, tuple[Renderer, str]] = {
    "megatron": (lambda v, s, p: megatron.render(v, s, p), ".args"),
    "megatron-bridge": (lambda v, s, p: megatron_bridge.render(v, s, p), ".overrides"),
    "torchtitan": (lambda v, s, p: torchtitan.render_module(v, s, p.stem), ".py"),
    "torchtitan@0.2": (lambda v, s, p: torchtitan.render(v, s), ".toml"),
    "maxtext": (lambda v, s, p: maxtext.render(v, s), ".yml"),
}
"""Target name -> (renderer, file suffix). ``torchtitan`` is torchtitan's current configuration
(0.3: a Python config module for ``--module/--config``), ``torchtitan@0.2`` its TOML job file,
``megatron-bridge`` a Megatron-Bridge (NeMo) recipe name and its ``KEY=VALUE`` overrides."""

VERSIONS: dict[str, str] = {
    "megatron": megatron.VERSION, "megatron-bridge": megatron_bridge.VERSION,
    "torchtitan": torchtitan.VERSION,
    "torchtitan@0.2": torchtitan.TOML_VERSION, "maxtext": maxtext.VERSION}
"""Target name -> the launcher release each file is written for (and checked against by the
``launchers`` test suite)."""


@dataclass(frozen=True, slots=True)
class Exported:
    """One file of an export: its path, its text, and what the target could not express."""

    path: Path
    text: str
    notes: tuple[str, ...]


def export_plan(plan: Plan | DataParallelPlan, target: str, out: str | Path, source: str = "plan"
                ) -> tuple[Exported, ...]:
    """The files of ``plan`` for ``target``: ``out`` itself for a one-pipeline plan, else
    ``out``'s stem + ``-part{i}`` + its suffix per part. A part the target cannot run (its
    device kind, its model) is not written: its one-line reason is a note of every other file.
    Nothing is written here.

    Raises:
        LauncherError: an unknown target, or a plan no file of the target can be written for
            (the first part's reason).
    """
    if target not in TARGETS:
        raise LauncherError(f"unknown export target {target!r}; use one of {sorted(TARGETS)}")
    render, _ = TARGETS[target]
    out = Path(out)
    views = part_views(plan)
    files: list[tuple[Path, str, list[str]]] = []
    refused: list[str] = []
    for v in views:
        path = out if len(views) == 1 else out.with_name(f"{out.stem}-{v.name}{out.suffix}")
        try:
            text, notes = render(v, source, path)
        except LauncherError as e:
            if len(views) == 1:
                raise
            refused.append(f"{v.name} not written: {e}")
            continue
        files.append((path, text, notes))
    if not files:
        raise LauncherError(refused[0])
    return tuple(Exported(p, t, tuple(n + refused)) for p, t, n in files)


def default_out(plan_path: str | Path, target: str) -> Path:
    """``PLAN-TARGET.suffix`` in the working directory: the file name when ``--out`` is not
    given."""
    name = target.replace("@", "-").replace(".", "")
    return Path(f"{Path(plan_path).stem}-{name}{TARGETS[target][1]}")
