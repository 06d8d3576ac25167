"""The export driver: a plan, a target, the files to write (:func:`export_plan`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ir import DataParallelPlan, Plan
from ir.vocab import EXPORT_TARGETS
from launchers import maxtext, megatron, torchtitan
from launchers.view import LauncherError, PartView, part_views

Renderer = Callable[[PartView, str], tuple[str, list[str]]]

_RENDERERS: dict[str, tuple[Renderer, str]] = {
    "megatron": (megatron.render, ".args"),
    "torchtitan": (torchtitan.render, ".toml"),
    "maxtext": (maxtext.render, ".yaml"),
}
TARGETS: dict[str, tuple[Renderer, str]] = {t: _RENDERERS[t] for t in EXPORT_TARGETS}
"""Target name -> (renderer, file suffix), one per :data:`ir.vocab.EXPORT_TARGETS`."""


@dataclass(frozen=True, slots=True)
class Exported:
    """One file of an export: its path, its text, and what the target could not express."""

    path: Path
    text: str
    notes: tuple[str, ...]


def export_plan(plan: Plan | DataParallelPlan, target: str, out: str | Path, source: str = "plan"
                ) -> tuple[Exported, ...]:
    """The files of ``plan`` for ``target``: ``out`` itself for a one-pipeline plan, else
    ``out``'s stem + ``-part{i}`` + its suffix per part. Nothing is written here.

    Raises:
        LauncherError: an unknown target, or a plan no launcher file can be written for.
    """
    if target not in TARGETS:
        raise LauncherError(f"unknown export target {target!r}; use one of {sorted(TARGETS)}")
    render, _ = TARGETS[target]
    out = Path(out)
    views = part_views(plan)
    files = []
    for v in views:
        path = out if len(views) == 1 else out.with_name(f"{out.stem}-{v.name}{out.suffix}")
        text, notes = render(v, source)
        files.append(Exported(path, text, tuple(notes)))
    return tuple(files)


def default_out(plan_path: str | Path, target: str) -> Path:
    """``PLAN-TARGET.suffix`` next to the working directory: the file name when ``--out`` is
    not given."""
    return Path(f"{Path(plan_path).stem}-{target}{TARGETS[target][1]}")
