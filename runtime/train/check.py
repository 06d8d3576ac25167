"""Checks of a measured MPMD run against its plan, a plain ``jax.jit`` reference and the simulation.

(a) :func:`rel_error` / :func:`max_rel_error`: outputs equal to the reference, ``||a - b|| / ||b||``
    per leaf (float64 accumulation).
(b) :func:`order_mismatches`: the executed per-mesh fragment order equals the plan's.
(c) :func:`executable_counts`: one compiled executable per unique fragment body per mesh (plan
    bodies plus the mesh's accumulator-init fragment; no left-over inferred executables).
(d) :func:`step_time_error`: measured vs simulated step time, ``|measured - simulated| / measured``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from compiler.exported import Call, ExportedProgram
from ir import Plan
from jax.sharding import NamedSharding, PartitionSpec

FRAGMENT_KINDS = ("F", "B", "W", "FB")


def rel_error(a: Any, b: Any) -> float:
    """``||a - b|| / ||b||`` over one array (0 when both are zero)."""
    a = np.asarray(jax.device_get(a), np.float64)
    b = np.asarray(jax.device_get(b), np.float64)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {b.shape}; compare the same outputs")
    nb = float(np.linalg.norm(b))
    diff = float(np.linalg.norm(a - b))
    return diff / nb if nb > 0 else diff


def tree_rel_error(a: Any, b: Any) -> float:
    """``||a - b|| / ||b||`` over all leaves of two pytrees together (the gradient as one vector).

    This is the error :func:`run_plan`'s check (a) holds under 1e-5. Per-leaf relative errors
    (:func:`max_rel_error`) of leaves whose norm is tiny next to the rest (e.g. attention query/key
    gradients at ~1e-4 of the largest) measure float32 cancellation under a different summation
    order, which a plain ``jax.jit`` on other devices shows as well, not a wrong gradient.
    """
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    if len(la) != len(lb):
        raise ValueError(f"pytrees differ: {len(la)} vs {len(lb)} leaves")
    diff = ref = 0.0
    for x, y in zip(la, lb):
        x = np.asarray(jax.device_get(x), np.float64)
        y = np.asarray(jax.device_get(y), np.float64)
        if x.shape != y.shape:
            raise ValueError(f"shapes differ: {x.shape} vs {y.shape}; compare the same outputs")
        diff += float(np.sum((x - y) ** 2))
        ref += float(np.sum(y ** 2))
    return (diff / ref) ** 0.5 if ref > 0 else diff ** 0.5


def max_rel_error(a: Any, b: Any) -> float:
    """Largest :func:`rel_error` over the leaves of two pytrees of equal structure."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    if len(la) != len(lb):
        raise ValueError(f"pytrees differ: {len(la)} vs {len(lb)} leaves")
    return max((rel_error(x, y) for x, y in zip(la, lb)), default=0.0)


def _fragment_names(plan_order: Sequence[Any]) -> tuple[str, ...]:
    return tuple(str(f) for f in plan_order)


def executed_fragments(names: Sequence[str]) -> tuple[str, ...]:
    """The plan-level fragments of an executed call list: ``"F1.0"`` stays, a merged ``"FB3.1"``
    (or ``"F3.1+B3.1"``) becomes ``"F3.1", "B3.1"``; calls that are not fragments are dropped."""
    out: list[str] = []
    for n in names:
        for part in n.split("+"):
            kind = part.rstrip("0123456789.")
            rest = part[len(kind):]
            if kind in ("F", "B", "W") and "." in rest:
                out.append(part)
            elif kind == "FB" and "." in rest:
                out += [f"F{rest}", f"B{rest}"]
    return tuple(out)


def order_mismatches(plan: Plan, executed: Mapping[str, Sequence[str]]) -> list[str]:
    """Meshes whose executed fragment order differs from the plan's, as one line each."""
    bad = []
    for r, mesh in enumerate(plan.rank_mesh):
        want = _fragment_names(plan.schedule.order[r])
        got = executed_fragments(executed.get(mesh, ()))
        if got != want:
            i = next((k for k, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
            bad.append(f"{mesh}: position {i}: executed {got[i:i + 3]} but the plan has {want[i:i + 3]}")
    return bad


@dataclass(frozen=True, slots=True)
class ExecutableCount:
    """Per mesh: compiled executables against the unique fragment bodies its calls need.

    Attributes:
        executables: executables compiled for the mesh.
        unique_bodies: unique plan fragment bodies (kind F/B/W/FB and the stage's layers).
        init: accumulator-init fragment bodies (``passes/accumulate.py``: the zeros that the
            gradient and loss sums start from, one fragment per mesh called once per step).
        other: executables of any other calls (left-over inferred code); must be 0.
        shared_wrongly: plan bodies served by more than one executable.
    """

    mesh: str
    executables: int
    unique_bodies: int
    other: int
    shared_wrongly: tuple[str, ...] = ()
    init: int = 0

    @property
    def fragment_bodies(self) -> int:
        """All fragment bodies of the mesh: plan bodies plus accumulator-init bodies."""
        return self.unique_bodies + self.init

    @property
    def ok(self) -> bool:
        return (self.executables == self.fragment_bodies and self.other == 0
                and not self.shared_wrongly)

    def __str__(self) -> str:
        s = f"{self.mesh}: {self.executables} exe / {self.unique_bodies} bodies"
        if self.init:
            s += f" + {self.init} init"
        if self.other:
            s += f" + {self.other} OTHER"
        return s


def executable_counts(exported: ExportedProgram, plan: Plan,
                      bodies: Sequence[str]) -> dict[str, ExecutableCount]:
    """Count executables per mesh against the unique fragment bodies its calls need.

    A fragment call's body is its kind plus the bodies of its stage's layers (``bodies[i]`` is the
    unique body of layer ``i``, e.g. ``ir.Workload.layers``); the stage's position (first or
    last, which hold the embedding or the loss) is part of its layers. Calls of kind ``"init"``
    (accumulator-init fragments) count once per distinct executable as ``init``; any other call
    (inferred code that was not absorbed) counts as ``other`` and fails the check.
    """
    stage_bodies = {s.index: tuple(bodies[s.first:s.last]) for s in plan.stages}
    out: dict[str, ExecutableCount] = {}
    for mesh, prog in exported.programs.items():
        groups: dict[tuple, set[str]] = {}
        init: set[str] = set()
        other: set[str] = set()
        for st in prog.steps:
            if not isinstance(st, Call):
                continue
            if st.kind in FRAGMENT_KINDS and st.stage in stage_bodies:
                groups.setdefault((st.kind, stage_bodies[st.stage]), set()).add(st.executable)
            elif st.kind == "init":
                init.add(st.executable)
            else:
                other.add(st.executable)
        frag_keys = set().union(*groups.values()) if groups else set()
        other -= frag_keys | init
        init -= frag_keys
        shared: list[str] = [f"{k[0]} of {len(k[1])} layers uses {sorted(v)}"
                             for k, v in groups.items() if len(v) > 1]
        n = sum(1 for e in exported.executables.values() if e.mesh == mesh)
        out[mesh] = ExecutableCount(mesh, n, len(groups), len(other), tuple(shared), len(init))
    return out


def placements(tree: Any, topology: Mapping[str, Any]) -> Any:
    """``tree`` with each array replaced by ``(mesh name, PartitionSpec)``: the mesh of
    ``topology`` (name -> ``jax.sharding.Mesh``) its ``NamedSharding`` is on, or ``(None, None)``
    for an array placed otherwise. Trailing unsharded dimensions are dropped from the spec
    (``P("model", None)`` reads ``P("model")``)."""
    def where(x: Any) -> tuple[str | None, Any]:
        s = getattr(x, "sharding", None)
        if isinstance(s, NamedSharding):
            for name, mesh in topology.items():
                if s.mesh == mesh:
                    dims = list(s.spec)
                    while dims and dims[-1] is None:
                        dims.pop()
                    return name, PartitionSpec(*dims)
        return None, None
    return jax.tree.map(where, tree)


def same_shardings(params: Any, *trees: Any) -> bool:
    """Whether every leaf of each of ``trees`` has the sharding of the matching leaf of ``params``
    (e.g. Adam's moments against the parameters they belong to)."""
    ps = [x.sharding for x in jax.tree.leaves(params)]
    return all([x.sharding for x in jax.tree.leaves(t)] == ps for t in trees)


def step_time_error(measured_s: float, simulated_s: float) -> float:
    """``|measured - simulated| / measured``."""
    if measured_s <= 0:
        raise ValueError(f"measured step time {measured_s} s must be positive")
    return abs(measured_s - simulated_s) / measured_s
