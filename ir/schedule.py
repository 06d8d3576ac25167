"""A pipeline schedule as data: :class:`FragmentRef` (kind, stage, microbatch) and the per-rank
:class:`ScheduleTable`."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping

from ir.errors import IRError


class FragmentKind(enum.StrEnum):
    """The kind of a fragment in a schedule; each member is its one-letter string (``FragmentKind.F
    == "F"``), so plans, tables and timelines spell it as before.

    - ``F``: the forward of a stage for one microbatch.
    - ``B``: the backward: only the input gradient when the schedule splits the backward, else the
      whole backward.
    - ``W``: the weight gradient (only in split-backward schedules).
    """

    F = "F"
    B = "B"
    W = "W"

    def __repr__(self) -> str:
        """``'F'``, the plain string's repr: refs, tables and messages print as with strings."""
        return str.__repr__(self)


KINDS: tuple[str, ...] = tuple(k.value for k in FragmentKind)
"""Fragment kinds in a schedule, as strings (``("F", "B", "W")``): see :class:`FragmentKind`."""


@dataclass(frozen=True, slots=True, order=True)
class FragmentRef:
    """One fragment instance in a schedule: ``kind`` of ``stage`` for ``microbatch``."""

    kind: str
    stage: int
    microbatch: int

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise IRError(f"fragment kind {self.kind!r} is not one of {KINDS}")
        if self.stage < 0 or self.microbatch < 0:
            raise IRError(f"fragment {self.kind}{self.stage}.{self.microbatch}: negative index")

    def __str__(self) -> str:
        return f"{self.kind}{self.stage}.{self.microbatch}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "stage": self.stage, "microbatch": self.microbatch}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "FragmentRef":
        return FragmentRef(str(d["kind"]), int(d["stage"]), int(d["microbatch"]))


@dataclass(frozen=True, slots=True)
class ScheduleTable:
    """A pipeline schedule as data, over pipeline ranks (not yet meshes).

    Attributes:
        name: e.g. ``"1f1b"``, ``"interleaved-1f1b"``, ``"zb-h1"``.
        num_ranks: pipeline ranks P (one per mesh in a plan).
        num_stages: stages S (``P * virtual_stages``).
        microbatches: M.
        stage_rank: for each stage, the rank that runs it (length S).
        order: for each rank, its ordered fragments (length P).
        split_backward: True when B is the input gradient and W the weight gradient.
        forward_only: True for inference schedules (F only).
    """

    name: str
    num_ranks: int
    num_stages: int
    microbatches: int
    stage_rank: tuple[int, ...]
    order: tuple[tuple[FragmentRef, ...], ...]
    split_backward: bool = False
    forward_only: bool = False

    def __post_init__(self) -> None:
        if len(self.stage_rank) != self.num_stages:
            raise IRError(f"schedule {self.name}: stage_rank has {len(self.stage_rank)} entries, "
                          f"expected num_stages={self.num_stages}")
        if len(self.order) != self.num_ranks:
            raise IRError(f"schedule {self.name}: order has {len(self.order)} ranks, "
                          f"expected {self.num_ranks}")
