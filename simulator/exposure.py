"""Exposed communication per step: the communication time a plan does not hide under compute.

Definition (seconds per step): the simulated step time of the plan on its cluster minus the
simulated step time of the same plan, same schedule and same knobs, on the same cluster with every
communication made free: every link (each mesh's ``intra_link`` and ``scale_out_link``, the
cluster's inter-mesh ``links`` and ``default_link``, each node group's links and the
``group_links`` between groups, so a carved plan's meshes and links are free too) at an
effectively infinite bandwidth (:data:`FREE_BANDWIDTH`) and zero latency, and a data-parallel
plan's cross-part gradient all-reduce (``DataParallelPlan.sync_s``) at zero seconds.

What it counts is every communication that lengthens the step: pipeline-boundary transfers (and
the bubbles they widen), tensor-parallel all-reduces inside fragments, FSDP parameter gathers and
gradient reduce-scatters that the cost model does not hide under a fragment's compute, the part of
the data-parallel gradient sync (per-layer buckets on the collective stream) that runs past the
last backward, the parameter all-gather after the optimizer, and a data-parallel plan's cross-part
all-reduce. Communication that overlaps compute costs nothing here, by definition. Both replays
go through :func:`simulator.plan_sim.simulate_any`, the entry point ``mpmd simulate`` uses, so the
figure is whatever the cost model and the engine charge (contention, streams, blocking
point-to-point included).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from ir import DataParallelPlan, Plan, Workload
from hardware_profiles.carve import node_groups_of
from hardware_profiles.types import Cluster, Link
from simulator.knobs import Knobs
from simulator.plan_sim import plan_cluster, simulate_any

FREE_BANDWIDTH = 1e30
"""Bytes per second of a free link: effectively infinite (a terabyte moves in 1e-18 s) yet finite,
so that no cost formula meets ``inf - inf`` or ``0 x inf``."""
FREE_LINK = Link(FREE_BANDWIDTH, 0.0, "free: every communication costs nothing (exposure baseline)")
"""The link every communication of the free cluster runs on (:func:`free_cluster`)."""


def free_cluster(cluster: Cluster) -> Cluster:
    """``cluster`` with every link free (:data:`FREE_LINK`): each mesh's ``intra_link`` and
    ``scale_out_link`` (when it has one), the explicit inter-mesh ``links``, the ``default_link``
    (when set), each node group's ``intra_link`` and ``scale_out_link`` and the ``group_links``.
    Devices, meshes, hosts and the ``p2p`` mode are unchanged, so the plan costs the same compute
    and memory; carving the result (:func:`simulator.plan_sim.plan_cluster`) gives free mesh links."""
    meshes = {name: replace(m, intra_link=FREE_LINK,
                            scale_out_link=None if m.scale_out_link is None else FREE_LINK)
              for name, m in cluster.meshes.items()}
    groups = {name: replace(g, intra_link=FREE_LINK, scale_out_link=FREE_LINK)
              for name, g in cluster.groups.items()}
    rule = cluster.link_rule
    return replace(cluster, meshes=meshes,
                   links=tuple(replace(ln, link=FREE_LINK) for ln in cluster.links),
                   link_rule=None if rule is None else (lambda a, b: replace(rule(a, b), link=FREE_LINK)),
                   default_link=None if cluster.default_link is None else FREE_LINK,
                   groups=groups,
                   group_links=tuple(replace(ln, link=FREE_LINK) for ln in cluster.group_links))


def free_plan(plan: "Plan | DataParallelPlan") -> "Plan | DataParallelPlan":
    """``plan`` with its recorded communication made free: a data-parallel plan's cross-part
    gradient all-reduce (``sync_s``, costed at planning time) at 0 s; a pipeline plan unchanged
    (its costs all come from the cluster)."""
    if isinstance(plan, DataParallelPlan):
        return replace(plan, sync_s=0.0)
    return plan


@dataclass(frozen=True, slots=True)
class Exposure:
    """A plan's simulated step with and without communication (see the module docstring).

    Attributes:
        step_time_s: the simulated step time on the cluster as it is, s.
        free_step_time_s: the simulated step time with every communication free, s.
    """

    step_time_s: float
    free_step_time_s: float

    @property
    def exposed_s(self) -> float:
        """Exposed communication per step, s: ``step_time_s - free_step_time_s``."""
        return self.step_time_s - self.free_step_time_s

    @property
    def fraction(self) -> float:
        """Exposed communication as a fraction of the step (0 for an empty step)."""
        return self.exposed_s / self.step_time_s if self.step_time_s > 0 else 0.0


def exposure(plan: "Plan | DataParallelPlan", workload: "Workload | Sequence[Workload]",
             cluster: Cluster, *, knobs: Knobs | None = None,
             step_time_s: float | None = None) -> Exposure:
    """Simulate ``plan`` on ``cluster`` and on :func:`free_cluster` of it; see the module docstring.

    Args:
        plan: a pipeline plan or a data-parallel plan.
        workload: as :func:`simulator.plan_sim.simulate_any` takes it.
        cluster: the cluster as loaded or the one the plan runs on: the plan's carving is applied
            to it either way (:func:`simulator.plan_sim.plan_cluster`; carving a carved cluster
            again gives the same meshes, since carving reads only the node groups).
        knobs: the same knobs for both replays (jitter draws, stragglers, degraded links).
        step_time_s: the step time already simulated on ``cluster`` with ``knobs`` (``mpmd
            simulate`` has it), to skip the first replay; seconds.

    Raises:
        simulator.plan_costs.CostError: the plan does not match its workload or cluster.
        hardware_profiles.types.ProfileError: a carving that does not fit the cluster.
    """
    if plan.carving:
        # a mesh listing as the node groups it describes, before its links are freed: free links
        # would merge groups that differ only in them
        cluster = node_groups_of(cluster) or cluster
    if step_time_s is None:
        step_time_s = simulate_any(plan, workload, plan_cluster(plan, cluster), knobs=knobs).step_time_s
    free = free_cluster(plan_cluster(plan, free_cluster(cluster)))
    free_step = simulate_any(free_plan(plan), workload, free, knobs=knobs).step_time_s
    return Exposure(float(step_time_s), float(free_step))


def exposed_communication(plan: "Plan | DataParallelPlan", workload: "Workload | Sequence[Workload]",
                          cluster: Cluster, *, knobs: Knobs | None = None) -> float:
    """Exposed communication of one step of ``plan``, seconds: its simulated step time minus the
    simulated step time with every communication free (:func:`exposure`; the module docstring
    says what it counts). 0 on a cluster whose links are already free."""
    return exposure(plan, workload, cluster, knobs=knobs).exposed_s
