"""What a search says about the plan it chose, as types: :class:`SearchReport` (the search's
outcome, proven bound and gap, why it stopped) and :class:`Prediction` (the replayed step's
metrics). A :class:`~ir.plan.Plan` carries both; plan JSON keeps them under its ``"solver"`` and
``"predicted"`` keys, as every earlier release wrote them, so older plan files still load
(``tests/ir/test_report.py`` reads a golden file from before these types).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ir.errors import IRError

STOP_REASONS = ("complete", "work budget", "time limit", "interrupted")
"""Why a node-group search ended: every option searched to its gap target or pruned by its
bound; the nominal work of ``--time-limit`` done; the wall clock cut it first (a machine slower
or busier than the reference); Ctrl-C."""


def _opt_float(d: Mapping[str, Any], key: str) -> float | None:
    x = d.get(key)
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise IRError(f"plan's {key!r} is {x!r}, not a number; regenerate it with 'mpmd plan'")
    return float(x)


def _opt_int(d: Mapping[str, Any], key: str) -> int | None:
    x = d.get(key)
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, int):
        raise IRError(f"plan's {key!r} is {x!r}, not an integer; regenerate it with 'mpmd plan'")
    return x


def _opt_bool(d: Mapping[str, Any], key: str) -> bool | None:
    x = d.get(key)
    if x is None:
        return None
    if not isinstance(x, bool):
        raise IRError(f"plan's {key!r} is {x!r}, not true or false; regenerate it with 'mpmd plan'")
    return x


@dataclass(frozen=True, slots=True)
class PlanFamily:
    """One option a node-group search weighed: a label (``"h100 alone"``, ``"data parallel
    ..."``, ``"one pipeline"``), its parts (the groups each part runs on, and its batch share),
    and its replayed step in seconds (None: no plan of it fits)."""

    label: str
    parts: tuple[tuple[tuple[str, ...], int], ...] = ()
    step_time_s: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label,
                "parts": [{"groups": list(g), "batch": b} for g, b in self.parts],
                "step_time_s": self.step_time_s}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> PlanFamily:
        return PlanFamily(str(d.get("label", "")),
                          tuple((tuple(str(g) for g in p.get("groups", ())), int(p.get("batch", 0)))
                                for p in d.get("parts", ())),
                          _opt_float(d, "step_time_s"))


@dataclass(frozen=True, slots=True)
class SearchReport:
    """How the plan was found (seconds; gaps as fractions).

    Attributes:
        status: the chosen candidate's CP-SAT status (``OPTIMAL``, ``FEASIBLE``), ``GRID`` (the
            practitioners' grid's best point, replayed) or ``HEURISTIC`` (a data-parallel split
            built from its parts' plans); ``""`` for a hand-written plan.
        objective_s / bound_s / gap / wall_s: that solve's surrogate objective, its proven bound
            on the surrogate, their gap and its wall seconds (None: no solve).
        search_wall_s: the whole search's wall seconds.
        search_bound_s: proven lower bound over every candidate (on the replayed step for a
            node-group cluster; on the surrogate for a mesh listing, None when some candidates
            were never searched).
        search_gap: ``(step - search_bound_s) / step`` (None with ``search_bound_s``).
        candidates / candidates_total / candidates_searched: candidates searched, meant to be
            searched, and (node-group searches) searched rather than pruned by their bound.
        interrupted: Ctrl-C ended the search.
        budget_spent: the work budget (or the wall clock) ended it.
        stopped: one of :data:`STOP_REASONS` (node-group searches), else ``""``.
        reason: which configuration won and the runners-up (one line).
        options: every option a node-group search weighed.
        goal: the goal other than the shortest step (``--objective cost``, a throughput floor, a
            budget per hour), its cost and every sub-cluster tried, as written by
            :func:`planner.objective.plan`; None for the shortest step.
    """

    status: str = ""
    objective_s: float | None = None
    bound_s: float | None = None
    gap: float | None = None
    wall_s: float | None = None
    search_wall_s: float | None = None
    search_bound_s: float | None = None
    search_gap: float | None = None
    candidates: int | None = None
    candidates_total: int | None = None
    candidates_searched: int | None = None
    interrupted: bool | None = None
    budget_spent: bool | None = None
    stopped: str = ""
    reason: str = ""
    options: tuple[PlanFamily, ...] | None = None
    goal: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.stopped and self.stopped not in STOP_REASONS:
            raise IRError(f"search stopped {self.stopped!r}: not one of {', '.join(STOP_REASONS)}")

    @staticmethod
    def of_solve(status: str, objective_s: float, bound_s: float, wall_s: float) -> SearchReport:
        """A CP-SAT solve's report: its status, objective, bound, their gap and wall seconds."""
        gap = (objective_s - bound_s) / objective_s if objective_s else 0.0
        return SearchReport(status, objective_s, bound_s, gap, wall_s)

    @property
    def bounded(self) -> bool:
        """The search proved a bound over every candidate (``search_bound_s`` is known)."""
        return self.search_bound_s is not None and math.isfinite(self.search_bound_s)

    def to_json(self) -> dict[str, Any]:
        """The plan file's ``"solver"`` object (the keys every earlier release wrote; a field
        that is None or empty is left out, but the search bound and gap, which may be null)."""
        keys = (("status", self.status), ("objective", self.objective_s), ("bound", self.bound_s),
                ("gap", self.gap), ("wall_s", self.wall_s), ("search_wall_s", self.search_wall_s),
                ("candidates", self.candidates), ("candidates_total", self.candidates_total),
                ("candidates_searched", self.candidates_searched),
                ("interrupted", self.interrupted), ("budget_spent", self.budget_spent),
                ("stopped", self.stopped), ("reason", self.reason))
        out: dict[str, Any] = {k: v for k, v in keys if v is not None and v != ""}
        if self.search_wall_s is not None or self.search_bound_s is not None:
            out["search_bound"] = self.search_bound_s
            out["search_gap"] = self.search_gap
        if self.options is not None:
            out["options"] = [o.to_json() for o in self.options]
        if self.goal is not None:
            out["goal"] = dict(self.goal)
        return out

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> SearchReport:
        """Read a plan file's ``"solver"`` object (any release's).

        Raises:
            IRError: a value of the wrong type, or an unknown stop reason, named."""
        if not isinstance(d, Mapping):
            raise IRError(f"plan's 'solver' is {type(d).__name__}, not an object; regenerate it "
                          f"with 'mpmd plan'")
        options = d.get("options")
        goal = d.get("goal")
        return SearchReport(
            status=str(d.get("status", "")), objective_s=_opt_float(d, "objective"),
            bound_s=_opt_float(d, "bound"), gap=_opt_float(d, "gap"), wall_s=_opt_float(d, "wall_s"),
            search_wall_s=_opt_float(d, "search_wall_s"),
            search_bound_s=_opt_float(d, "search_bound"), search_gap=_opt_float(d, "search_gap"),
            candidates=_opt_int(d, "candidates"), candidates_total=_opt_int(d, "candidates_total"),
            candidates_searched=_opt_int(d, "candidates_searched"),
            interrupted=_opt_bool(d, "interrupted"), budget_spent=_opt_bool(d, "budget_spent"),
            stopped=str(d.get("stopped", "")), reason=str(d.get("reason", "")),
            options=(tuple(PlanFamily.from_json(o) for o in options)
                     if isinstance(options, list) else None),
            goal=dict(goal) if isinstance(goal, Mapping) else None)


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted metrics of one step (seconds, bytes per device, fractions).

    Attributes:
        step_time_s: step makespan, end-of-step gradient sync and optimizer included.
        bubble: per mesh, idle fraction of the step.
        peak_memory_bytes: per mesh, peak per-device bytes (static + residuals + working set).
        capacity_bytes: per mesh, per-device capacity.
        stage_time_s: per stage, compute seconds of one microbatch (all kinds).
        mfu: model FLOP / (step time x the cluster's dense peak FLOP/s).
        roofline_step_time_s: model FLOP / the cluster's dense peak FLOP/s.
        tokens_per_s / samples_per_s: global batch (x sequence length) / step time.
        shortfall_bytes: per mesh whose peak exceeds its usable memory, the excess (not in plan
            files: a plan is written only when it fits).
        synced_s: per mesh, when its pipeline work and its own gradient all-reduce end.
        optimizer_s: per mesh, its end-of-step ops after its gradient sync: the optimizer step
            and the parameter all-gather after it.
    """

    step_time_s: float
    bubble: Mapping[str, float] = field(default_factory=dict)
    peak_memory_bytes: Mapping[str, float] = field(default_factory=dict)
    capacity_bytes: Mapping[str, float] = field(default_factory=dict)
    stage_time_s: tuple[float, ...] = ()
    mfu: float = 0.0
    roofline_step_time_s: float = 0.0
    tokens_per_s: float = 0.0
    samples_per_s: float = 0.0
    shortfall_bytes: Mapping[str, float] = field(default_factory=dict)
    synced_s: Mapping[str, float] = field(default_factory=dict)
    optimizer_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def fits(self) -> bool:
        """Every mesh's peak fits its usable memory."""
        return not self.shortfall_bytes

    def to_json(self) -> dict[str, Any]:
        """The plan file's ``"predicted"`` object."""
        return {
            "step_time_s": self.step_time_s,
            "bubble_fraction": dict(self.bubble),
            "peak_memory_bytes": dict(self.peak_memory_bytes),
            "capacity_bytes": dict(self.capacity_bytes),
            "stage_time_s": list(self.stage_time_s),
            "mfu": self.mfu,
            "roofline_step_time_s": self.roofline_step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "samples_per_s": self.samples_per_s,
        }

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Prediction:
        """Read a plan file's ``"predicted"`` object (the fields it lacks are empty or 0).

        Raises:
            IRError: no ``step_time_s``, or a value of the wrong type, named."""
        if not isinstance(d, Mapping):
            raise IRError(f"plan's 'predicted' is {type(d).__name__}, not an object; regenerate "
                          f"it with 'mpmd plan'")
        step = _opt_float(d, "step_time_s")
        if step is None:
            raise IRError("plan's 'predicted' has no 'step_time_s'; regenerate it with 'mpmd plan'")

        def per_mesh(key: str) -> dict[str, float]:
            x = d.get(key, {})
            if not isinstance(x, Mapping):
                raise IRError(f"plan's {key!r} is {x!r}, not an object; regenerate it with 'mpmd plan'")
            return {str(k): float(v) for k, v in x.items()}

        return Prediction(
            step_time_s=step, bubble=per_mesh("bubble_fraction"),
            peak_memory_bytes=per_mesh("peak_memory_bytes"), capacity_bytes=per_mesh("capacity_bytes"),
            stage_time_s=tuple(float(x) for x in d.get("stage_time_s", ())),
            mfu=_opt_float(d, "mfu") or 0.0,
            roofline_step_time_s=_opt_float(d, "roofline_step_time_s") or 0.0,
            tokens_per_s=_opt_float(d, "tokens_per_s") or 0.0,
            samples_per_s=_opt_float(d, "samples_per_s") or 0.0)
