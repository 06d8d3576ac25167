"""The planner: a CP-SAT search over stage assignment, layouts, microbatches and schedules."""

from planner.api import PlanOptions, PlanResult, build_plan, explain_infeasible, plan
from planner.errors import InfeasibleError, PlannerError
from planner.predict import Prediction, predict

__all__ = ["InfeasibleError", "PlanOptions", "PlanResult", "PlannerError", "Prediction",
           "build_plan", "explain_infeasible", "plan", "predict"]
