"""Pipeline schedules as data: generators for the published schedules, a checker and a replay.

``generate(name, num_ranks, microbatches, *, virtual_stages=2, forward_only=False)`` returns a
:class:`ir.ScheduleTable` for one of :data:`SCHEDULES`; :func:`validate` checks a table
(completeness, dependency safety, deadlock freedom) and :func:`replay` times it exactly for given
fragment durations (the planner's prediction). Errors raise :class:`ScheduleError` (a ValueError).
"""

from __future__ import annotations

from typing import Callable

from ir import ScheduleTable

from .adaptive import zb_1p, zb_2p, zero_bubble_auto
from .base import ScheduleError, v_shape_stage_rank
from .check import Replay, dependencies, replay, validate
from .dualpipe_v import dualpipe_v
from .gpipe import gpipe
from .interleaved import interleaved_1f1b
from .one_f_one_b import one_f_one_b
from .zb_v import zb_v
from .zero_bubble import zb_h1, zb_h2

__all__ = ["ADAPTIVE_SCHEDULES", "SCHEDULES", "SPLIT_BACKWARD", "Replay", "ScheduleError", "dependencies",
           "dualpipe_v", "generate", "gpipe", "interleaved_1f1b", "one_f_one_b", "replay",
           "stages_per_rank", "v_shape_stage_rank", "validate", "zb_1p", "zb_2p", "zb_h1", "zb_h2", "zb_v",
           "zero_bubble_auto"]

_REGISTRY: dict[str, Callable[..., ScheduleTable]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved-1f1b": interleaved_1f1b,
    "zb-h1": zb_h1,
    "zb-h2": zb_h2,
    "zb-v": zb_v,
    "dualpipe-v": dualpipe_v,
}

SCHEDULES: tuple[str, ...] = tuple(_REGISTRY)
"""Names accepted by :func:`generate`."""

_ADAPTIVE: dict[str, Callable[..., ScheduleTable]] = {"zb-1p": zb_1p, "zb-2p": zb_2p}

ADAPTIVE_SCHEDULES: tuple[str, ...] = tuple(_ADAPTIVE)
"""Schedules built from the fragment durations (Qi et al. 2024's automatic ZB-1p / ZB-2p; see
:mod:`.adaptive`), also accepted by :func:`generate`; split-backward, one stage per rank. Kept out
of :data:`SCHEDULES` (the fixed-pattern generators) so callers listing those see no change."""

SPLIT_BACKWARD: frozenset[str] = frozenset({"zb-h1", "zb-h2", "zb-v", "dualpipe-v"})
"""Schedules whose backward is split into B (input gradient) and W (weight gradient)."""


def stages_per_rank(name: str, virtual_stages: int = 2) -> int:
    """Stages each rank holds under schedule ``name`` (S = P * this)."""
    if name in _ADAPTIVE:
        return 1
    if name not in _REGISTRY:
        raise ScheduleError(f"unknown schedule {name!r}; use one of {', '.join(SCHEDULES)}")
    if name == "interleaved-1f1b":
        return virtual_stages
    return 2 if name in ("zb-v", "dualpipe-v") else 1


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
    if name in _ADAPTIVE:
        return _ADAPTIVE[name](num_ranks, microbatches, durations=durations, comm=comm,
                               forward_only=forward_only)
    fn = _REGISTRY.get(name)
    if fn is None:
        raise ScheduleError(f"unknown schedule {name!r}; use one of "
                            f"{', '.join(SCHEDULES + ADAPTIVE_SCHEDULES)}")
    if name == "interleaved-1f1b":
        return fn(num_ranks, microbatches, virtual_stages=virtual_stages,
                  forward_only=forward_only)
    return fn(num_ranks, microbatches, forward_only=forward_only)
