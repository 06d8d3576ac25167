"""What ran where and when, simulated or measured: :class:`TimelineEvent` and :class:`Timeline`
(seconds from the step's start)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Mapping



@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """One interval on one track.

    ``track`` is ``"<mesh>/compute"``, ``"<mesh>/send"``, ``"<mesh>/recv"``, ``"link:<name>"`` or
    ``"<mesh>/alltoall"`` (a mixture of experts' token exchange on the mesh's fabric, drawn inside
    the fragments that pay it) or ``"<mesh>/context"`` (context parallelism's key/value exchange,
    drawn the same way); ``kind`` is F, B, W, ``transfer``, ``allreduce``, ``optimizer``,
    ``all_to_all`` or ``context``. Times in seconds from step start.
    """

    name: str
    kind: str
    track: str
    mesh: str
    stage: int
    microbatch: int
    start_s: float
    end_s: float
    bytes: float = 0.0

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class Timeline:
    """Events of one step plus per-mesh memory samples ``(time_s, bytes)``."""

    events: tuple[TimelineEvent, ...]
    memory: Mapping[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)

    @property
    def step_time_s(self) -> float:
        return max((e.end_s for e in self.events), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {"events": [asdict(e) for e in self.events],
                "memory": {k: [list(p) for p in v] for k, v in self.memory.items()}}
