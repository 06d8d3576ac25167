"""``--precision`` of ``mpmd plan`` and ``mpmd whatif``: which training precision recipes a cluster
runs, and the best plan over them (``auto``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ir.precision import PRECISIONS

if TYPE_CHECKING:
    from hardware_profiles.types import Cluster, DeviceProfile
    from planner.objective import Goal
    from planner.api import PlanResult


def _devices(cluster: "Cluster") -> dict[str, "DeviceProfile"]:
    """The cluster's device kinds by profile name (its node groups' or its meshes')."""
    specs = cluster.groups.values() if cluster.groups else cluster.meshes.values()
    return {s.device.name: s.device for s in specs}


def precisions(choice: str, cluster: "Cluster", training: bool) -> tuple[str, ...]:
    """The recipes ``--precision choice`` plans on ``cluster``: the one named, or (``auto``) every
    recipe all of its device kinds run (``DeviceProfile.training_formats``), widest first.

    Raises:
        PlannerError: a named recipe some device kind does not run, or a low-precision recipe
            for a model that does not train (one line: the value, the devices and the fix).
    """
    from planner.errors import PlannerError

    devices = _devices(cluster)
    if not training:
        if choice not in ("bf16", "auto"):
            raise PlannerError(f"--precision {choice} is a training recipe and the model does not "
                               f"train (an inference model); fix: drop --precision")
        return ("bf16",)
    if choice == "auto":
        return tuple(p for p in PRECISIONS
                     if all(p in d.training_formats for d in devices.values()))
    lacking = sorted(n for n, d in devices.items() if choice not in d.training_formats)
    if lacking:
        common = [p for p in PRECISIONS if all(p in d.training_formats for d in devices.values())]
        raise PlannerError(f"--precision {choice}: {', '.join(lacking)} do not run {choice} GEMMs "
                           f"(every device of {cluster.name} runs: {', '.join(common)}); fix: "
                           f"use one of those or --precision auto")
    return (choice,)


def best_precision(results: Sequence["PlanResult"], goal: "Goal") -> "PlanResult":
    """The plan ``goal`` prefers among one search per recipe: the lowest USD per step for a cost
    goal (where a plan records it), else the shortest replayed step."""
    def key(r: "PlanResult") -> float:
        g = r.plan.search.goal or {}
        usd = g.get("usd_per_step") if goal.kind == "cost" else None
        return float(usd) if isinstance(usd, (int, float)) else r.prediction.step_time_s
    return min(results, key=key)
