"""Chrome / Perfetto trace export of a :class:`ir.Timeline` (open it at ui.perfetto.dev).

Format: the Trace Event Format (JSON object form, ``{"traceEvents": [...]}``), see
https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU:
    - one process (pid) per mesh, with threads (tid) ``compute`` = 1, ``send`` = 2, ``recv`` = 3,
      ``collective`` = 4 (gradient reduce-scatters / all-reduces, parameter all-gathers),
      ``alltoall`` = 5 (a mixture of experts' dispatch and combine, inside its fragments);
    - one process per link (``link:<name>``), one thread;
    - intervals as complete events ``ph: "X"`` with ``ts`` / ``dur`` in microseconds;
    - ``process_name`` / ``thread_name`` / ``process_sort_index`` metadata events (``ph: "M"``);
    - per-mesh memory as counter events (``ph: "C"``, name ``memory``, ``args: {"bytes": ...}``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ir import Timeline
from simulator.metrics import split_track
from ir.files import write_atomic

_TIDS = {"compute": 1, "send": 2, "recv": 3, "collective": 4, "alltoall": 5, "link": 1}
_US = 1e6


def to_chrome_trace(timeline: Timeline) -> dict[str, Any]:
    """The timeline as a Chrome trace dict (see the module docstring for the layout)."""
    meshes: list[str] = []
    links: list[str] = []
    threads: dict[tuple[str, str], None] = {}

    def note(owner: str, stream: str) -> None:
        dest = links if stream == "link" else meshes
        if owner not in dest:
            dest.append(owner)
        threads[(owner, stream)] = None

    for e in timeline.events:
        note(*split_track(e.track))
    for m in timeline.memory:
        if m not in meshes:
            meshes.append(m)
    pid = {("mesh", m): i + 1 for i, m in enumerate(meshes)}
    pid.update({("link", ln): len(meshes) + i + 1 for i, ln in enumerate(links)})

    def pid_of(owner: str, stream: str) -> int:
        return pid["link" if stream == "link" else "mesh", owner]

    out: list[dict[str, Any]] = []
    for m in meshes:
        p = pid["mesh", m]
        out.append({"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": m}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": p, "tid": 0,
                    "args": {"sort_index": p}})
    for ln in links:
        p = pid["link", ln]
        out.append({"ph": "M", "name": "process_name", "pid": p, "tid": 0,
                    "args": {"name": f"link:{ln}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": p, "tid": 0,
                    "args": {"sort_index": p}})
    for (owner, stream) in threads:
        out.append({"ph": "M", "name": "thread_name", "pid": pid_of(owner, stream),
                    "tid": _TIDS.get(stream, 9), "args": {"name": stream or "events"}})
    for e in timeline.events:
        owner, stream = split_track(e.track)
        out.append({"ph": "X", "name": e.name, "cat": e.kind, "pid": pid_of(owner, stream),
                    "tid": _TIDS.get(stream, 9), "ts": e.start_s * _US,
                    "dur": (e.end_s - e.start_s) * _US,
                    "args": {"stage": e.stage, "microbatch": e.microbatch, "bytes": e.bytes,
                             "mesh": e.mesh}})
    for m, samples in timeline.memory.items():
        for t, b in samples:
            out.append({"ph": "C", "name": "memory", "pid": pid["mesh", m], "tid": 0,
                        "ts": t * _US, "args": {"bytes": b}})
    return {"traceEvents": out, "displayTimeUnit": "ms"}


def write_chrome_trace(timeline: Timeline, path: str | os.PathLike[str]) -> None:
    """Write :func:`to_chrome_trace` JSON to ``path`` atomically (:func:`ir.files.write_atomic`:
    a temporary file in the same folder, then a rename), so a reader never sees a half-written
    trace and a failure leaves none."""
    write_atomic(Path(path), json.dumps(to_chrome_trace(timeline), separators=(",", ":")))
