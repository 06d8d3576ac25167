"""The "search" block of ``mpmd plan``'s table: how the plan was found, as the plan JSON's
``"solver"`` object records it.

A plan has one step time: its discrete-event replay (the step table's "step time", the JSON's
``predicted.step_time_s``). The search block gives the search's own figures, once each, every
number as the JSON holds it (``tests/cli/test_plan_block.py`` compares them):

- **candidates**: ``solver.candidates`` of ``solver.candidates_total`` searched (a node-group
  search: ``candidates_searched``, the rest pruned by their bounds or left unsearched, and
  ``len(options)`` configurations), in ``solver.search_wall_s`` seconds, and why it stopped.
- **objective**: what the proven bound bounds. On a cluster listing its meshes that is CP-SAT's
  surrogate step of the chosen candidate (``solver.objective``; :mod:`planner.search`), which
  the replay refines; on node groups (``solver.options`` present) it is the replayed step itself
  (:mod:`planner.shaping`).
- **proven bound**: ``solver.search_bound``, a lower bound on that objective over every
  candidate (unknown while candidates were left unsearched).
- **gap**: ``solver.search_gap`` = (objective - bound) / objective.

The chosen candidate's own CP-SAT bound and gap (``solver.bound``, ``solver.gap``) stay in the
JSON; the table gives the search-wide gap only.
"""

from __future__ import annotations


from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ir import SearchReport

STOPPED = {
    "interrupted": ", interrupted (Ctrl-C)",
    "work budget": "; stopped: work budget of --time-limit spent (raise it to search more)",
    "time limit": ("; stopped: wall clock hit 20x --time-limit before the work budget was spent "
                   "(this machine is over 20x slower or busier than the reference, so the plan may "
                   "depend on its load; raise --time-limit)"),
    "complete": "; complete: every option searched to its gap target or pruned by its bound",
}
"""How a node-group search's ``SearchReport.stopped`` reads in the search block."""

STATUS = {
    "FEASIBLE": "FEASIBLE: not proven optimal",
    "GRID": "GRID: the practitioners' grid's best point",
    "HEURISTIC": "HEURISTIC: a data-parallel split of its parts' plans",
}
"""The chosen candidate's ``SearchReport.status`` in words."""

TITLE = "search (objective, proven bound and gap; the step time above is the plan's replay)"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s"


def on_replay(sv: SearchReport) -> bool:
    """Whether the search's bound and gap are on the replayed step (a node-group search, which
    records the options it weighed) rather than on CP-SAT's surrogate (a mesh listing)."""
    return sv.options is not None


def _candidates(sv: SearchReport) -> str:
    wall = "?" if sv.search_wall_s is None else f"{sv.search_wall_s:.1f}"
    total, done = sv.candidates_total, sv.candidates
    if on_replay(sv):
        searched = sv.candidates_searched
        rest = ("the rest pruned by their bounds" if (sv.stopped or "complete") == "complete"
                else "the rest unsearched")
        what = (f"{searched} of {total} searched, {rest}; "
                if searched is not None and total is not None else "")
        n = len(sv.options or ())
        why = STOPPED.get(sv.stopped, ", budget spent" if sv.budget_spent else "")
        return f"{what}{n} configuration{'s' * (n != 1)} in {wall} s{why}"
    if done is None:
        return f"{wall} s"
    if sv.interrupted or (total is not None and done < total):
        why = ", interrupted (Ctrl-C)" if sv.interrupted else ", time limit reached"
        return f"{done} of {total} candidates in {wall} s{why}"
    return f"{done} candidates in {wall} s, all searched"


def _objective(sv: SearchReport, step_s: float | None) -> str:
    status = STATUS.get(sv.status, sv.status)
    if on_replay(sv) or sv.objective_s is None:
        return f"{_s(step_s)}: the step time above" + (f" (chosen: {status})" if status else "")
    return f"{_s(sv.objective_s)}: CP-SAT's surrogate of the step (chosen candidate {status})"


def _bound(sv: SearchReport) -> str:
    total, done = sv.candidates_total, sv.candidates
    if sv.search_bound_s is None:
        if total is not None and done is not None and done < total:
            return f"unknown: {total - done} of {total} candidates not searched"
        return "unknown"
    where = ("every option the search covers" if on_replay(sv) else "every candidate")
    if sv.goal is not None:
        where += " on the devices the cost row names"
    text = f"{sv.search_bound_s:.3f} s over {where}"
    if not on_replay(sv) and sv.search_bound_s <= 0:
        text += ": a candidate's solve ended (status UNKNOWN) before proving any bound"
    return text


def _gap(sv: SearchReport) -> str:
    if sv.search_gap is None:
        return "unknown"
    what = "step" if on_replay(sv) or sv.objective_s is None else "objective"
    return f"{sv.search_gap * 100:.1f}% = ({what} - bound) / {what}"


def search_rows(sv: SearchReport, step_s: float | None) -> list[tuple[str, str]]:
    """The search block's rows (label, text) of a plan's :class:`~ir.SearchReport`; ``step_s``
    is the plan's replayed step, seconds. Empty for a plan no search made (a hand-written one)."""
    if not sv.status and sv.search_wall_s is None and sv.objective_s is None:
        return []
    return [("candidates", _candidates(sv)), ("objective", _objective(sv, step_s)),
            ("proven bound", _bound(sv)), ("gap", _gap(sv))]


def search_block(sv: SearchReport, step_s: float | None) -> Group | None:
    """The titled search block (:func:`search_rows`), or None when there is nothing to show."""
    rows = search_rows(sv, step_s)
    if not rows:
        return None
    t = Table(show_header=False)
    t.add_column("what")
    t.add_column("value")
    for k, v in rows:
        t.add_row(escape(k), escape(v))
    return Group(Text(TITLE, style="table.title"), t)

