"""Shared pieces of the schedule generators: the error type, argument checks, table assembly.

A generator returns, for every pipeline rank, the ordered fragments it runs (see
:class:`ir.ScheduleTable`). Stages are numbered in pipeline order 0..S-1; microbatches
0..M-1. Fragment kinds: ``F`` forward, ``B`` backward (input gradient only when the schedule
splits the backward), ``W`` weight gradient (split schedules only).
"""

from __future__ import annotations

from typing import Sequence

from ir import FragmentRef, ScheduleTable
from ir.schedule import FragmentKind


class ScheduleError(ValueError):
    """A schedule cannot be generated or is unsound (the message names the value and the fix)."""


def check_sizes(name: str, num_ranks: int, microbatches: int) -> None:
    """Raise :class:`ScheduleError` unless ``num_ranks`` and ``microbatches`` are positive ints."""
    if not isinstance(num_ranks, int) or isinstance(num_ranks, bool) or num_ranks < 1:
        raise ScheduleError(f"schedule {name!r}: num_ranks={num_ranks!r} must be an int >= 1")
    if not isinstance(microbatches, int) or isinstance(microbatches, bool) or microbatches < 1:
        raise ScheduleError(f"schedule {name!r}: microbatches={microbatches!r} must be an int >= 1")


def no_forward_only(name: str, forward_only: bool) -> None:
    """Training-only schedules reject ``forward_only=True``."""
    if forward_only:
        raise ScheduleError(f"schedule {name!r} is a training schedule and has no forward_only "
                            f"form; use 'gpipe' (or '1f1b') with forward_only=True for inference")


def v_shape_stage_rank(num_ranks: int) -> tuple[int, ...]:
    """Stage -> rank for a V-shaped placement of ``2 * num_ranks`` stages.

    Stage s runs on rank s for s < P and on rank 2P-1-s after, so rank 0 holds the first and the
    last stage (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory", Fig. 2; DualPipeV).
    """
    p = num_ranks
    return tuple(s if s < p else 2 * p - 1 - s for s in range(2 * p))


def make_table(name: str, num_ranks: int, microbatches: int, stage_rank: Sequence[int],
               order: Sequence[Sequence[FragmentRef]], *, split_backward: bool = False,
               forward_only: bool = False) -> ScheduleTable:
    """Freeze per-rank lists into a :class:`ScheduleTable`."""
    return ScheduleTable(name=name, num_ranks=num_ranks, num_stages=len(stage_rank),
                         microbatches=microbatches, stage_rank=tuple(stage_rank),
                         order=tuple(tuple(o) for o in order), split_backward=split_backward,
                         forward_only=forward_only)


def F(stage: int, mb: int) -> FragmentRef:
    return FragmentRef(FragmentKind.F, stage, mb)


def B(stage: int, mb: int) -> FragmentRef:
    return FragmentRef(FragmentKind.B, stage, mb)


def W(stage: int, mb: int) -> FragmentRef:
    return FragmentRef(FragmentKind.W, stage, mb)
