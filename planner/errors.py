"""Errors of the planner package (one-line messages naming the bad value and the fix)."""


class PlannerError(ValueError):
    """Base error of ``planner``: bad options or a workload the planner cannot partition."""


class InfeasibleError(PlannerError):
    """No plan fits the cluster's memory; the message names the mesh and the missing bytes."""
