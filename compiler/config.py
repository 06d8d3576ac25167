"""``MpmdConfig``: what the user tells the MPMD compiler (topology, assignment, schedule, merges).

Following the Shardy:MPMD RFC (``shared/reference/000_*.txt``, "MPMD + JAX" and "Detailed design"):

- ``topology``: mesh name -> ``jax.sharding.Mesh``.
- ``assignment``: named computation -> mesh; or ``stage_assignment`` (name -> stage) plus
  ``stage_mesh`` (stage -> mesh). With ``assignment`` only, a name's stage is its mesh's index in
  the topology (one stage per mesh).
- ``input_meshes`` / ``output_meshes``: flattened argument / result index -> mesh.
- ``in_specs``: flattened argument index -> ``PartitionSpec`` (else the argument's own
  ``NamedSharding`` spec, else replicated).
- ``schedule``: one of
    * a per-mesh order ``{mesh: [FragmentRef(kind, stage, microbatch), ...]}`` (a plan's order,
      see :func:`schedule_from_plan`);
    * a predicate ``should_precede(lhs: FragmentInfo, rhs: FragmentInfo) -> bool`` (the RFC's tuple
      comparator form, see ``compiler.passes.scheduling.comparator``);
    * a rule list ``[(FragmentPattern, FragmentPattern), ...]``: fragments matching the first run
      before fragments matching the second on the same mesh.
- ``merge_forward_backward``: merge a forward fragment with the backward fragment of the same stage
  and microbatch that immediately follows it on its mesh (the last stage of 1F1B).
- ``merge_rules``: ``[(FragmentPattern, FragmentPattern), ...]`` or a predicate
  ``should_merge(lhs, rhs) -> bool`` applied to consecutive user fragments of a mesh.
- ``infer_transfers``: mesh inference may create transfers (else it raises ``InferenceError``).
- ``microbatches``: the number of microbatches the step function loops over (checked against the
  call counters the frontend finds; None: not checked).
- ``split_backward``: split backward fragments into B (input gradient) and W (weight gradient);
  None means "when the schedule names a W fragment".
- ``transfer_aware_merge`` / ``split_transfer_independent``: run the optional passes of
  ``compiler.passes.transfer_aware`` (move inferred code across a transfer where that
  shrinks it; split a fragment so its part that waits on no transfer runs first).
- ``fuse_partials``: make a mesh's small inferred partial results (the sums of squares gradient
  clipping sends) inside the backward fragment they read, and in that fragment's other
  microbatches too so they keep one executable (``compiler.passes.fuse_partials``; default on:
  one executable and one call fewer per mesh; off where a dead reduction per microbatch, or the
  norm computed before a backward's results are sent, costs more than that, e.g. many
  microbatches of a large stage on an accelerator).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, Union

from compiler.errors import ConfigError, did_you_mean
from ir import FragmentRef, Plan


@dataclass(frozen=True, slots=True)
class FragmentInfo:
    """What schedules and merge rules see of a user fragment (RFC's ``mpmd.Fragment``).

    ``microbatch`` is the call counter, ``mesh_index`` the mesh's position in the topology, ``kind``
    F/B/W/FB, ``names`` the origin names.
    """

    names: tuple[str, ...]
    mesh: str
    mesh_index: int
    stage: int | None
    transpose: int
    microbatch: int | None
    kind: str


@dataclass(frozen=True, slots=True)
class FragmentPattern:
    """Matches fragments whose given (non-None) fields are equal (``name``: one of the origins)."""

    name: str | None = None
    transpose: int | None = None
    stage: int | None = None
    microbatch: int | None = None
    mesh: str | None = None
    kind: str | None = None

    def matches(self, f: FragmentInfo) -> bool:
        return ((self.name is None or self.name in f.names)
                and (self.transpose is None or self.transpose == f.transpose)
                and (self.stage is None or self.stage == f.stage)
                and (self.microbatch is None or self.microbatch == f.microbatch)
                and (self.mesh is None or self.mesh == f.mesh)
                and (self.kind is None or self.kind == f.kind))


Predicate = Callable[[FragmentInfo, FragmentInfo], bool]
Schedule = Union[Mapping[str, Sequence[FragmentRef]], Predicate,
                 Sequence[tuple[FragmentPattern, FragmentPattern]], None]


@dataclass(frozen=True)
class MpmdConfig:
    """The MPMD partitioning of a step function (see the module docstring for each field).

    Raises:
        ConfigError: a name, stage, input, output or ``FragmentPattern`` assigned to a mesh not in
            ``topology`` (with the closest mesh names), a stage without a mesh, or a name whose
            ``assignment`` and stage mesh disagree. A computation name the step lacks is refused
            when it is traced (``compiler.diagnose.check_names``).
    """

    topology: Mapping[str, Any]
    assignment: Mapping[str, str] = field(default_factory=dict)
    stage_assignment: Mapping[str, int] = field(default_factory=dict)
    stage_mesh: Mapping[int, str] = field(default_factory=dict)
    input_meshes: Mapping[int, str] = field(default_factory=dict)
    output_meshes: Mapping[int, str] = field(default_factory=dict)
    in_specs: Mapping[int, Any] = field(default_factory=dict)
    schedule: Schedule = None
    merge_forward_backward: bool = False
    merge_rules: Union[Sequence[tuple[FragmentPattern, FragmentPattern]], Predicate] = ()
    infer_transfers: bool = True
    microbatches: int | None = None
    split_backward: bool | None = None
    transfer_aware_merge: bool = False
    split_transfer_independent: bool = False
    fuse_partials: bool = True

    def __post_init__(self) -> None:
        meshes = list(self.topology)
        if not meshes:
            raise ConfigError("MpmdConfig.topology is empty; give at least one mesh name -> Mesh")
        for name, m in self.assignment.items():
            if m not in self.topology:
                raise ConfigError(f"named computation {name!r} is assigned to mesh {m!r}, which is "
                                  f"not in the topology; {did_you_mean(m, meshes)}; fix "
                                  f"'assignment' or add the mesh to 'topology'")
        for s, m in self.stage_mesh.items():
            if m not in self.topology:
                raise ConfigError(f"stage {s} is assigned to mesh {m!r}, which is not in the "
                                  f"topology; {did_you_mean(m, meshes)}; fix 'stage_mesh' or add "
                                  f"the mesh to 'topology'")
        for name, s in self.stage_assignment.items():
            if s not in self.stage_mesh:
                raise ConfigError(f"named computation {name!r} is in stage {s}, which has no mesh "
                                  f"in 'stage_mesh' {dict(self.stage_mesh)}; add it")
            if name in self.assignment and self.assignment[name] != self.stage_mesh[s]:
                raise ConfigError(f"named computation {name!r} is assigned to mesh "
                                  f"{self.assignment[name]!r} but its stage {s} is on "
                                  f"{self.stage_mesh[s]!r}; make them agree")
        for what, d in (("input_meshes", self.input_meshes), ("output_meshes", self.output_meshes)):
            for i, m in d.items():
                if m not in self.topology:
                    raise ConfigError(f"{what}[{i}] is mesh {m!r}, which is not in the "
                                      f"topology; {did_you_mean(m, meshes)}; fix '{what}' or add "
                                      f"the mesh to 'topology'")

        for what, rules in (("schedule", self.schedule), ("merge_rules", self.merge_rules)):
            if callable(rules) or not isinstance(rules, (list, tuple)):
                continue
            for pair in rules:
                for pat in (pair if isinstance(pair, (list, tuple)) else ()):
                    if (isinstance(pat, FragmentPattern) and pat.mesh is not None
                            and pat.mesh not in self.topology):
                        raise ConfigError(f"a FragmentPattern in '{what}' names mesh {pat.mesh!r}, "
                                          f"which is not in the topology; "
                                          f"{did_you_mean(pat.mesh, meshes)}; fix '{what}'")

    @property
    def mesh_names(self) -> tuple[str, ...]:
        return tuple(self.topology)

    def names(self) -> set[str]:
        """The named computations this config places (``"layer"`` too when it places iterations
        of a loop over it one by one: ``"layer[0]"``, ``"layer[1]"``, ...)."""
        named = set(self.assignment) | set(self.stage_assignment)
        return named | {n[:n.index("[")] for n in named if n.endswith("]") and "[" in n}

    def place(self, name: str) -> tuple[str, int] | None:
        """(mesh, stage) of a named computation, or None if the config does not place it."""
        if name in self.stage_assignment:
            s = self.stage_assignment[name]
            return self.stage_mesh[s], s
        if name in self.assignment:
            m = self.assignment[name]
            return m, self.mesh_names.index(m)
        return None

    def wants_split_backward(self) -> bool:
        if self.split_backward is not None:
            return self.split_backward
        if isinstance(self.schedule, Mapping):
            return any(r.kind == "W" for refs in self.schedule.values() for r in refs)
        return False


def schedule_from_plan(plan: Plan) -> dict[str, tuple[FragmentRef, ...]]:
    """A plan's per-mesh fragment order, for ``MpmdConfig.schedule``."""
    return {m: plan.schedule.order[r] for r, m in enumerate(plan.rank_mesh)}
