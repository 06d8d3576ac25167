"""Rendering and writing of CLI outputs: the plan table, JSON Schema validation, atomic writes."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table

from mpmd.files import write_atomic  # noqa: F401  (moved to mpmd.files; re-exported for old imports)

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "planner" / "plan.schema.json"


@lru_cache(maxsize=1)
def plan_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def validate_plan_json(doc: dict[str, Any]) -> None:
    """Check a plan dict against ``planner/plan.schema.json`` (raises jsonschema.ValidationError)."""
    import jsonschema

    jsonschema.validate(doc, plan_schema())


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f}"


def search_gap_text(solver: dict[str, Any]) -> str:
    """The search-wide gap of a plan's ``solver`` record, or why it is unknown: "gap 12.3%" or
    "gap unknown: 7 of 12 candidates not searched" (their bound was never computed)."""
    total, done = solver.get("candidates_total"), solver.get("candidates")
    if total is not None and done is not None and done < total:
        return f"gap unknown: {total - done} of {total} candidates not searched"
    if solver.get("search_gap") is None:
        return "gap unknown"
    return f"gap {solver['search_gap'] * 100:.1f}%"


def plan_table(result: Any, cluster: Any) -> Group:
    """A readable summary of a :class:`planner.PlanResult`: stages, then step-level metrics.

    When the search was interrupted or left candidates unsearched, the solver row says its gap is
    the chosen candidate's own, and a "search gap" row gives the gap over all candidates (or why it
    is unknown).
    """
    p, pred = result.plan, result.prediction
    stages = Table(title=f"{p.model} on {p.cluster}: stages", title_justify="left")
    for col in ("stage", "layers", "mesh", "device", "layout", "compute/mb (ms)",
                "memory used / capacity (GB)"):
        stages.add_column(col, justify="right" if "(" in col else "left")
    for st, t in zip(p.stages, pred.stage_time_s):
        mesh = cluster.meshes[st.mesh]
        stages.add_row(str(st.index), f"{st.first}-{st.last - 1}", st.mesh,
                       f"{mesh.num_devices}x {mesh.device.name}", str(p.layouts[st.mesh]),
                       f"{t * 1e3:.2f}",
                       f"{_gb(pred.peak_memory_bytes[st.mesh])} / {_gb(pred.capacity_bytes[st.mesh])}")
    s = Table(title="step", title_justify="left", show_header=False)
    s.add_column("metric")
    s.add_column("value", justify="right")
    mean_bubble = sum(pred.bubble.values()) / len(pred.bubble)
    sv = p.solver
    rows = [
        ("schedule", p.schedule.name + (" (last stage F+B merged)" if p.merge_last_stage else "")),
        ("microbatches", f"{p.microbatches} x {p.global_batch // p.microbatches} samples"),
        ("step time", f"{pred.step_time_s:.3f} s"),
        ("tokens/s", f"{pred.tokens_per_s:,.0f}"),
        ("MFU", f"{pred.mfu * 100:.1f}%"),
        ("bubble (mean over meshes)", f"{mean_bubble * 100:.1f}%"),
        ("roofline bound", f"{pred.roofline_step_time_s:.3f} s"),
        ("solver", f"{sv.get('status')} objective {sv.get('objective', 0):.3f} s, bound "
                   f"{sv.get('bound', 0):.3f} s, gap {sv.get('gap', 0) * 100:.2f}%"),
        ("search", f"{sv.get('candidates')} candidates in {sv.get('search_wall_s', 0):.1f} s"),
    ]
    total = sv.get("candidates_total")
    if sv.get("interrupted") or (total is not None and sv.get("candidates", total) < total):
        rows[-2] = (rows[-2][0], rows[-2][1] + " (this candidate)")
        why = ", interrupted (Ctrl-C)" if sv.get("interrupted") else ", time limit reached"
        rows[-1] = ("search", f"{sv.get('candidates')} of {total} candidates in "
                              f"{sv.get('search_wall_s', 0):.1f} s{why}")
        gap = search_gap_text(sv)
        if sv.get("search_bound") is not None:
            gap += f" (bound {sv['search_bound']:.3f} s over all candidates)"
        rows.append(("search gap", gap.removeprefix("gap ")))
    for k, v in rows:
        s.add_row(k, v)
    return Group(stages, s)
