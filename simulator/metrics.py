"""Summaries of a :class:`ir.Timeline`, simulated or measured, computed the same way.

Definitions (SI units):
    - step time: the latest event end (``Timeline.step_time_s``), s.
    - busy seconds of a mesh: the length of the union of its ``"<mesh>/compute"`` intervals, s
      (a union, so that measured timelines with overlapping records are not double counted).
    - bubble fraction of a mesh: ``1 - busy / step_time`` (0 when the step time is 0).
    - peak memory of a mesh: the largest of its memory samples, per device, bytes.
    - link volume: the bytes of the events on track ``"link:<name>"``.
    - MFU: model FLOP / (step time * cluster peak FLOP/s) (0 when either is unknown).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from ir import Timeline

_STREAMS = ("compute", "send", "recv", "collective", "alltoall")


@dataclass(frozen=True, slots=True)
class TimelineMetrics:
    """Per-step metrics of one timeline (see the module docstring for definitions)."""

    step_time_s: float
    busy_s: Mapping[str, float]
    bubble: Mapping[str, float]
    peak_memory_bytes: Mapping[str, float]
    link_bytes: Mapping[str, float]
    send_bytes: Mapping[str, float] = field(default_factory=dict)
    flops: float = 0.0
    mfu: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (nested per-mesh and per-link mappings)."""
        return {"step_time_s": self.step_time_s, "mfu": self.mfu, "flops": self.flops,
                "busy_s": dict(self.busy_s), "bubble": dict(self.bubble),
                "peak_memory_bytes": dict(self.peak_memory_bytes),
                "link_bytes": dict(self.link_bytes), "send_bytes": dict(self.send_bytes)}


def split_track(track: str) -> tuple[str, str]:
    """``"m/compute"`` -> ``("m", "compute")``; ``"link:x"`` -> ``("x", "link")``; else (track, "")."""
    if track.startswith("link:"):
        return track[5:], "link"
    head, sep, tail = track.rpartition("/")
    if sep and tail in _STREAMS:
        return head, tail
    return track, ""


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals, s."""
    total, cur_s = 0.0, 0.0
    cur_e: float | None = None  # end of the current merged interval; None before the first
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def summarize(timeline: Timeline, *, meshes: Iterable[str] = (), flops: float = 0.0,
              peak_flops: float = 0.0) -> TimelineMetrics:
    """Summarise ``timeline``.

    Args:
        timeline: events and memory samples of one step.
        meshes: meshes to report even if they have no events (busy 0, bubble 1).
        flops: model FLOP of the step, for MFU.
        peak_flops: cluster peak FLOP/s, for MFU.
    """
    step = timeline.step_time_s
    compute: dict[str, list[tuple[float, float]]] = {m: [] for m in meshes}
    links: dict[str, float] = {}
    sends: dict[str, float] = {}
    parsed: dict[str, tuple[str, str]] = {}
    for e in timeline.events:
        ts = parsed.get(e.track)
        if ts is None:
            ts = parsed[e.track] = split_track(e.track)
        owner, stream = ts
        if stream == "compute":
            compute.setdefault(owner, []).append((e.start_s, e.end_s))
        elif stream == "link":
            links[owner] = links.get(owner, 0.0) + e.bytes
        elif stream == "send":
            sends[owner] = sends.get(owner, 0.0) + e.bytes
    for m in timeline.memory:
        compute.setdefault(m, [])
    busy = {m: union_length(iv) for m, iv in compute.items()}
    bubble = {m: (1.0 - b / step) if step > 0 else 0.0 for m, b in busy.items()}
    peak = {m: max((b for _, b in s), default=0.0) for m, s in timeline.memory.items()}
    mfu = flops / (step * peak_flops) if step > 0 and peak_flops > 0 else 0.0
    return TimelineMetrics(step_time_s=step, busy_s=busy, bubble=bubble, peak_memory_bytes=peak,
                           link_bytes=links, send_bytes=sends, flops=flops, mfu=mfu)
