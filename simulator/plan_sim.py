"""Simulate a plan: cost it (:class:`~simulator.plan_costs.PlanCosts`), lower its schedule into a
:class:`~simulator.program.SimProgram` and replay that on the discrete-event engine."""

from __future__ import annotations

from compiler.ir import FragmentRef, Plan, Workload
from hardware_profiles.types import Cluster
from simulator.engine import SimResult, simulate
from simulator.knobs import Knobs
from simulator.lowering import BoundaryCost, FragmentCost, TailOp, lower_schedule
from simulator.plan_costs import PlanCosts
from simulator.program import SimProgram


def plan_program(plan: Plan, workload: Workload, cluster: Cluster) -> SimProgram:
    """Lower ``plan`` into a :class:`SimProgram` with costs from the cost model.

    Raises:
        simulator.plan_costs.CostError: the plan does not match the workload or cluster.
    """
    costs = PlanCosts(plan, workload, cluster)

    def fragment(rank: int, ref: FragmentRef) -> FragmentCost:
        return FragmentCost(costs.fragment_time(ref), costs.fragment_flops(ref),
                            costs.residual_bytes(ref) if workload.training else 0.0)

    def boundary(src: int, dst: int, ref: FragmentRef) -> BoundaryCost | None:
        b = costs.boundary(src, dst)
        return None if b is None else BoundaryCost(*b)

    def tail(mesh: str) -> tuple[TailOp, ...]:
        return tuple(TailOp(kind, t) for kind, t in costs.tail(mesh))

    meshes = plan.rank_mesh
    return lower_schedule(
        plan.schedule, meshes, fragment, boundary, tail,
        baseline_bytes={m: costs.static_bytes(m) + costs.working_bytes(m) for m in meshes},
        capacity_bytes={m: costs.capacity(m) for m in meshes},
        peak_flops=costs.peak_flops,
        host_of={m: cluster.meshes[m].host for m in meshes if cluster.meshes[m].host},
        host_slots=dict(cluster.host_slots))


def simulate_plan(plan: Plan, workload: Workload, cluster: Cluster, *,
                  knobs: Knobs | None = None) -> SimResult:
    """Replay ``plan`` on the discrete-event engine; see :func:`simulator.engine.simulate`."""
    return simulate(plan_program(plan, workload, cluster), knobs=knobs)
