"""Pipeline schedules as data: generators for the published schedules, a checker and a replay.

Each schedule is one :class:`ScheduleKind` (``kind.py``), defined in its module's ``KINDS`` and
collected here into :data:`KINDS`, which the planner, the bounds and validation ask.

``generate(name, num_ranks, microbatches, *, virtual_stages=2, forward_only=False)`` returns a
:class:`ir.ScheduleTable` for one of :data:`SCHEDULES`; :func:`validate` checks a table
(completeness, dependency safety, deadlock freedom) and :func:`replay` times it exactly for given
fragment durations (the planner's prediction). Errors raise :class:`ScheduleError` (a ValueError).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Callable

from ir import ScheduleTable

from .adaptive import zb_1p, zb_2p, zero_bubble_auto
from .base import ScheduleError, v_shape_stage_rank
from .check import Replay, dependencies, replay, validate
from .dualpipe_v import dualpipe_v
from .gpipe import gpipe
from .interleaved import interleaved_1f1b
from .kind import ScheduleKind
from .one_f_one_b import one_f_one_b
from .zb_v import zb_v
from .zero_bubble import zb_h1, zb_h2

__all__ = ["ADAPTIVE_SCHEDULES", "KINDS", "SCHEDULES", "SPLIT_BACKWARD", "Replay", "ScheduleError",
           "ScheduleKind", "dependencies", "dualpipe_v", "generate", "gpipe", "interleaved_1f1b",
           "kind", "one_f_one_b", "replay", "stages_per_rank", "v_shape_stage_rank", "validate",
           "zb_1p", "zb_2p", "zb_h1", "zb_h2", "zb_v", "zero_bubble_auto"]


def _discover() -> dict[str, ScheduleKind]:
    """Every ``KINDS`` of this package's modules, in search order (:attr:`ScheduleKind.order`)."""
    found: list[ScheduleKind] = []
    for info in pkgutil.iter_modules(__path__):
        found += getattr(importlib.import_module(f"{__name__}.{info.name}"), "KINDS", ())
    names = [k.name for k in found]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ScheduleError(f"schedule {dup[0]!r} is defined twice; give each schedule one name")
    return {k.name: k for k in sorted(found, key=lambda k: (k.order, k.name))}


KINDS: dict[str, ScheduleKind] = _discover()
"""Every schedule by name, in the planner's search order: the registry everything asks."""

SCHEDULES: tuple[str, ...] = tuple(n for n, k in KINDS.items() if not k.adaptive)
"""The fixed-pattern schedules, accepted by :func:`generate`."""

ADAPTIVE_SCHEDULES: tuple[str, ...] = tuple(n for n, k in KINDS.items() if k.adaptive)
"""Schedules built from the fragment durations (Qi et al. 2024's automatic ZB-1p / ZB-2p; see
:mod:`.adaptive`), also accepted by :func:`generate`; split-backward, one stage per rank. Kept out
of :data:`SCHEDULES` (the fixed-pattern generators) so callers listing those see no change."""

SPLIT_BACKWARD: frozenset[str] = frozenset(n for n, k in KINDS.items()
                                           if k.split_backward and not k.adaptive)
"""Fixed-pattern schedules whose backward is split into B (input gradient) and W (weight
gradient)."""


def kind(name: str) -> ScheduleKind:
    """The schedule called ``name``.

    Raises:
        ScheduleError: no such schedule (the message lists them).
    """
    try:
        return KINDS[name]
    except KeyError:
        raise ScheduleError(f"unknown schedule {name!r}; use one of {', '.join(KINDS)}") from None


def stages_per_rank(name: str, virtual_stages: int = 2) -> int:
    """Stages each rank holds under schedule ``name`` (S = P * this)."""
    return kind(name).stages_per_rank(virtual_stages)


def generate(name: str, num_ranks: int, microbatches: int, *, virtual_stages: int = 2,
             forward_only: bool = False, durations: Callable[[int, str], float] | None = None,
             comm: float | Callable[[int, int], float] = 0.0) -> ScheduleTable:
    """The schedule ``name`` on ``num_ranks`` pipeline ranks for ``microbatches`` microbatches.

    Args:
        name: one of :data:`SCHEDULES`.
        num_ranks: pipeline ranks P >= 1.
        microbatches: M >= 1 (interleaved-1f1b: a multiple of P; dualpipe-v: >= 2P).
        virtual_stages: chunks per rank for ``interleaved-1f1b`` (>= 2); ignored otherwise.
        forward_only: inference (F only); supported by ``gpipe`` and ``1f1b``.
        durations: ``durations(stage, kind) -> seconds`` for :data:`ADAPTIVE_SCHEDULES` (None:
            F = B = W = 1); ignored by the fixed-pattern schedules.
        comm: inter-rank transfer seconds for :data:`ADAPTIVE_SCHEDULES` (a constant or
            ``comm(src_stage, dst_stage)``); ignored otherwise.

    Raises:
        ScheduleError: unknown name or a size the schedule does not support.
    """
    return kind(name).generate(num_ranks, microbatches, forward_only=forward_only,
                               virtual_stages=virtual_stages, durations=durations, comm=comm)
