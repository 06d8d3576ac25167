"""The plan-level IR: the lingua franca between planner, simulator, compiler and reports.

Frozen dataclasses only; no logic beyond validation and (de)serialization. Units are SI:
seconds, bytes, FLOP. Every other package speaks these types. It imports nothing from the project
outside ``ir`` (the guarded plan-file read, which needs ``ir.files`` and the loader, is
``ir.plan_file``, imported on its own).

- :class:`LayerCost` / :class:`Workload` (``workload.py``): what a model costs, traced from JAX
  (``zoo.costing``).
- :class:`Recipe` (``precision.py``): a training precision recipe (BF16, FP8, blockwise FP8,
  MXFP8, NVFP4): the format a step's GEMMs run in and what it adds around them.
- :class:`FragmentRef` / :class:`ScheduleTable` (``schedule.py``): a pipeline schedule as data,
  per pipeline rank.
- :class:`Layout` / :class:`StagePlan` / :class:`Plan` / :class:`DataParallelPlan` (``plan.py``):
  stage partition + stage-to-mesh assignment + layouts + schedule + predictions.
- :class:`TimelineEvent` / :class:`Timeline` (``timeline.py``): what ran where and when.
- :class:`SearchReport` / :class:`Prediction` (``report.py``): how the search found a plan and
  what its replay predicts, as a plan carries them.
- ``plan_json.py``: plans as JSON documents and back.
- :class:`InferenceModel` / :class:`RequestMix` / :class:`ServiceObjectives` / :class:`BatchStep`
  (``serving.py``): LLM serving: per-token costs, the request mix, SLOs, one continuous-batch step.
"""

from ir.errors import IRError
from ir.plan import CONTEXT_METHODS, EXPERT_DISPATCH, GRAD_REDUCE, OPTIMIZER_STATES, DataParallelPlan, Layout, Plan, StagePlan, with_model_config
from ir.report import STOP_REASONS, PlanFamily, Prediction, SearchReport
from ir.plan_json import (PLAN_FORMAT, any_plan_to_json, data_parallel_from_json,
                          data_parallel_to_json, plan_from_json, plan_to_json,
                          schedule_to_json)
from ir.schedule import KINDS, FragmentKind, FragmentRef, ScheduleTable
from ir.serving import (WEIGHT_FORMATS, BatchStep, InferenceModel, RequestMix,
                        ServiceObjectives, format_bytes)
from ir.timeline import Timeline, TimelineEvent
from ir.precision import PRECISIONS, RECIPES, Recipe, canonical_precision, recipe
from ir.shards import ShardDims, layout_problem, layouts_problem
from ir.workload import CROSS_ENTROPY, SAVED_INPUTS, CrossEntropy, LayerCost, Workload, keep_blocks_in_compute_dtype

__all__ = ["STOP_REASONS", "CROSS_ENTROPY", "SAVED_INPUTS", "CrossEntropy", "keep_blocks_in_compute_dtype", "PlanFamily", "Prediction", "SearchReport", "with_model_config", "WEIGHT_FORMATS", "BatchStep", "InferenceModel", "RequestMix",
           "ServiceObjectives", "format_bytes", "KINDS", "PLAN_FORMAT", "DataParallelPlan", "FragmentKind", "FragmentRef", "IRError", "LayerCost",
           "Layout", "CONTEXT_METHODS", "EXPERT_DISPATCH", "GRAD_REDUCE", "OPTIMIZER_STATES", "Plan", "ScheduleTable", "ShardDims", "StagePlan", "Timeline", "TimelineEvent", "Workload",
           "layout_problem", "layouts_problem", "PRECISIONS", "RECIPES", "Recipe", "recipe",
           "canonical_precision",
           "any_plan_to_json", "data_parallel_from_json", "data_parallel_to_json",
           "plan_from_json", "plan_to_json", "schedule_to_json"]
