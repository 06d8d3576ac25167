"""The simulator: the cost model and the simpy discrete-event replay of MPMD plans."""

from simulator.engine import SimResult, simulate
from simulator.exposure import Exposure, exposed_communication, free_cluster
from simulator.knobs import Knobs
from simulator.lowering import BoundaryCost, FragmentCost, TailOp, lower_schedule
from simulator.metrics import TimelineMetrics, summarize
from simulator.plan_costs import CostError, PlanCosts
from simulator.plan_sim import (data_parallel_program, plan_cluster, plan_meshes, plan_program,
                                simulate_any, simulate_data_parallel, simulate_plan)
from simulator.program import (COLLECTIVE_KINDS, OP_KINDS, SimCollective, SimError, SimOp,
                               SimProgram, SimTransfer)
from simulator.serving import ReplicaSpec, ServingResult, simulate_serving
from simulator.trace import to_chrome_trace, write_chrome_trace

__all__ = ["OP_KINDS", "BoundaryCost", "CostError", "Exposure", "FragmentCost", "Knobs", "PlanCosts",
           "ReplicaSpec", "ServingResult", "simulate_serving",
           "SimError", "SimOp", "SimCollective", "COLLECTIVE_KINDS", "SimProgram", "SimResult", "SimTransfer", "TailOp",
           "TimelineMetrics", "data_parallel_program", "exposed_communication",
           "free_cluster", "lower_schedule", "plan_cluster", "plan_meshes",
           "plan_program", "simulate", "simulate_any", "simulate_data_parallel", "simulate_plan",
           "summarize", "to_chrome_trace", "write_chrome_trace"]
