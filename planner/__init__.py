"""The planner: shapes node-group clusters into meshes, pipelines and data-parallel parts
(:mod:`planner.shaping`), with a CP-SAT search over stage assignment, layouts, microbatches and
schedules inside each pipeline (:mod:`planner.api`, :mod:`planner.search`)."""

from ir import Prediction
from planner.api import PlanResult, explain_infeasible
from planner.construct import PlanOptions, build_plan
from planner.errors import InfeasibleError, PlannerError
from planner.objective import Goal, plan
from planner.predict import predict

__all__ = ["Goal", "InfeasibleError", "PlanOptions", "PlanResult", "PlannerError", "Prediction",
           "build_plan", "explain_infeasible", "plan", "predict"]
