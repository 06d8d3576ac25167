"""From a :class:`~ir.Plan` to the :class:`~compiler.config.MpmdConfig` that compiles it.

A plan's stage ``s`` covers layers ``[first, last)`` of the model's workload, whose layers are the
zoo's named computations in program order (``zoo.layer_names``: ``embed``, ``block0`` ..,
``head``). So layer ``i`` of every stage becomes ``stage_assignment[layer_names[i]] = s`` and
``stage_mesh[s]`` is the stage's mesh; the schedule is the plan's per-mesh order; the last stage's
forward and backward merge when the plan says so; W fragments exist when the schedule splits the
backward.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from compiler.config import MpmdConfig, schedule_from_plan
from compiler.errors import ConfigError
from ir import Plan


def config_from_plan(plan: Plan, topology: Mapping[str, object], *,
                     layer_names: Sequence[str]) -> MpmdConfig:
    """The compiler configuration that realises ``plan`` on ``topology``.

    Args:
        plan: the plan.
        topology: mesh name -> ``jax.sharding.Mesh`` for every mesh the plan uses.
        layer_names: the model's named computations in program order (for a zoo model,
            ``zoo.layer_names(plan.model)``; the compiler does not import the zoo, which sits
            above it).

    Raises:
        ConfigError: a plan mesh missing from ``topology``, a mesh whose size differs from its
            layout, or stages that do not tile the model's layers.
    """
    names = tuple(layer_names)
    missing = sorted({s.mesh for s in plan.stages} - set(topology))
    if missing:
        raise ConfigError(f"plan places stages on mesh {missing[0]!r}, which the topology lacks "
                          f"({sorted(topology)}); build the topology from the plan's cluster")
    for m, lay in plan.layouts.items():
        mesh = topology.get(m)
        size = getattr(getattr(mesh, "devices", None), "size", None)
        if size is not None and size != lay.devices:
            raise ConfigError(f"mesh {m!r} has {size} devices but the plan's layout {lay} needs "
                              f"{lay.devices}; use the plan's cluster")
    covered = 0
    stage_assignment: dict[str, int] = {}
    for st in sorted(plan.stages, key=lambda s: s.index):
        if st.first != covered or st.last <= st.first:
            raise ConfigError(f"plan stage {st.index} covers layers [{st.first}, {st.last}), "
                              f"expected to start at {covered}; stages must tile the layers")
        for i in range(st.first, st.last):
            stage_assignment[names[i]] = st.index
        covered = st.last
    if covered != len(names):
        raise ConfigError(f"plan stages cover {covered} layers, model {plan.model!r} has "
                          f"{len(names)} ({names[0]} .. {names[-1]}); re-plan for this model")
    used = {s.mesh for s in plan.stages}
    return MpmdConfig(
        topology={m: topology[m] for m in plan.rank_mesh if m in used},
        stage_assignment=stage_assignment,
        stage_mesh={s.index: s.mesh for s in plan.stages},
        schedule=schedule_from_plan(plan),
        merge_forward_backward=plan.merge_last_stage,
        microbatches=plan.microbatches,
        split_backward=plan.schedule.split_backward,
    )
