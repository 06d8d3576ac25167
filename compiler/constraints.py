"""Sharding constraints written against mesh axis names, resolved on each fragment's own mesh.

A model pins a value's sharding with :func:`constrain` (``x``, a ``PartitionSpec`` over mesh axis
names): the zoo's mixture of experts does so to turn its dispatch and combine into all-to-alls
(``zoo.layers.moe_swiglu``). The meshes of an MPMD topology differ in size and shape, so the
frontend traces the program once under the topology's *logical mesh* (:func:`logical_mesh`:
every axis name of its meshes, each of size 1) as JAX's abstract mesh (:func:`tracing`), so a
constraint is recorded as a ``sharding_constraint`` on that abstract mesh, names only. Every
fragment resolves it on the mesh it runs on (:func:`resolve_params`, called by
``compiler.program.eval_body``): an axis that mesh lacks, or whose size does not divide the
dimension, is dropped, which only changes where XLA's partitioner puts the data, never the
numbers. This is the logical-axis idea of Flax/MaxText's ``with_logical_constraint``, with the
mesh axes themselves as the logical names. Being JAX's own context, the logical mesh is part of
JAX's trace-cache keys (a context variable of ours would not be: a function traced before
without it would come back from the cache without its constraints).

Outside the MPMD frontend, :func:`constrain` uses the ambient mesh (``jax.set_mesh``) when there
is one, and is the identity without any mesh (a plain ``jax.jit``). A fragment evaluated without
a mesh drops its constraints.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping

import jax
from jax.extend.core import ClosedJaxpr, Jaxpr
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

CONSTRAINT = "sharding_constraint"
"""The name of ``jax.lax.with_sharding_constraint``'s primitive."""


def logical_mesh(topology: Mapping[str, Any]) -> AbstractMesh | None:
    """The mesh a program is traced under: the axis names of ``topology``'s meshes (those with
    ``axis_names``: ``jax.sharding.Mesh``), in order of first appearance, each of size 1; None when
    no mesh names an axis."""
    names: dict[str, None] = {}
    for mesh in topology.values():
        for a in getattr(mesh, "axis_names", ()):
            names[str(a)] = None
    if not names:
        return None
    return AbstractMesh((1,) * len(names), tuple(names))


@contextlib.contextmanager
def tracing(topology: Mapping[str, Any]) -> Iterator[None]:
    """Context for tracing a program for ``topology``: its :func:`logical_mesh` as JAX's ambient
    abstract mesh (``jax.sharding.use_abstract_mesh``; part of JAX's trace-cache key, so a
    function traced here and outside is traced twice), nothing when it has none."""
    mesh = logical_mesh(topology)
    if mesh is None:
        yield
        return
    with jax.sharding.use_abstract_mesh(mesh):
        yield


def mesh_axes() -> tuple[str, ...]:
    """The axis names of the ambient mesh (``jax.sharding.get_abstract_mesh``: the traced
    topology's logical mesh, or one set with ``jax.set_mesh``); ``()`` without one."""
    ambient = jax.sharding.get_abstract_mesh()
    return () if ambient.empty else tuple(ambient.axis_names)


def constrain(x: jax.Array, spec: PartitionSpec) -> jax.Array:
    """``x`` constrained to ``spec`` on the ambient mesh, the axes it lacks dropped (see
    :func:`mesh_axes`); ``x`` itself without a mesh."""
    axes = mesh_axes()
    if not axes:
        return x
    dims = [_entry([a for a in _names(e) if a in axes]) for e in spec]
    return jax.lax.with_sharding_constraint(x, PartitionSpec(*dims))


def _names(entry: Any) -> tuple[str, ...]:
    """The mesh axes of one ``PartitionSpec`` entry (None, a name, or a tuple of names)."""
    return () if entry is None else (entry if isinstance(entry, tuple) else (entry,))


def _entry(axes: list[str]) -> Any:
    """A ``PartitionSpec`` entry for ``axes``: None, one name, or a tuple of names."""
    return None if not axes else axes[0] if len(axes) == 1 else tuple(axes)


def resolve_spec(spec: PartitionSpec, shape: tuple[int, ...], mesh: Any) -> PartitionSpec:
    """``spec`` on ``mesh`` for an array of ``shape``: per dimension, the longest prefix of its
    axes that ``mesh`` has and whose sizes' product divides the dimension."""
    sizes = dict(zip(mesh.axis_names, mesh.devices.shape)) if hasattr(mesh, "devices") \
        else dict(mesh.shape)
    dims: list[Any] = []
    for d, entry in enumerate(tuple(spec) + (None,) * (len(shape) - len(spec))):
        kept: list[str] = []
        n = 1
        for a in _names(entry):
            if a not in sizes or shape[d] % (n * sizes[a]):
                break
            kept.append(a)
            n *= sizes[a]
        dims.append(_entry(kept))
    while dims and dims[-1] is None:
        dims.pop()
    return PartitionSpec(*dims)


def _is_logical(sharding: Any) -> bool:
    return isinstance(sharding, NamedSharding) and isinstance(sharding.mesh, AbstractMesh)


def resolve_params(name: str, params: Mapping[str, Any], mesh: Any = None,
                   shape: tuple[int, ...] | None = None) -> dict[str, Any]:
    """An equation's ``params`` with every logical sharding constraint resolved on ``mesh`` (a
    ``jax.sharding.Mesh``), its own (``name`` is the primitive's; ``shape`` its operand's) and
    those in any sub-jaxpr it carries. The output shardings JAX records on other ops traced under
    an abstract mesh (``dot_general``'s ``out_sharding``, ``reshape``'s ``sharding``, ...; on
    ``Auto`` axes, unconstrained) become None, as a trace without a mesh records them: left as
    they are, they would pin those values replicated on the fragment's mesh."""
    out = dict(params)
    if name == CONSTRAINT and _is_logical(params.get("sharding")):
        if mesh is None or shape is None:
            return out
        spec = resolve_spec(params["sharding"].spec, shape, mesh)
        out["sharding"] = NamedSharding(mesh, spec)
        if "context_mesh" in out:
            out["context_mesh"] = mesh.abstract_mesh
        return out
    for k, v in params.items():
        if _is_logical(v):
            out[k] = None           # an op's output sharding recorded under the logical mesh
        elif isinstance(v, ClosedJaxpr):
            out[k] = ClosedJaxpr(_resolve_jaxpr(v.jaxpr, mesh), v.consts)
        elif isinstance(v, Jaxpr):
            out[k] = _resolve_jaxpr(v, mesh)
    return out


def _resolve_jaxpr(jaxpr: Jaxpr, mesh: Any) -> Jaxpr:
    eqns = []
    changed = False
    for e in jaxpr.eqns:
        shape = tuple(e.invars[0].aval.shape) if e.invars else None
        params = resolve_params(e.primitive.name, e.params, mesh, shape)
        if any(params[k] is not e.params[k] for k in params):
            e = e.replace(params=params)
            changed = True
        eqns.append(e)
    return jaxpr.replace(eqns=eqns) if changed else jaxpr


def is_logical_constraint(name: str, params: Mapping[str, Any]) -> bool:
    """Whether an equation is a sharding constraint written against the logical mesh."""
    return name == CONSTRAINT and _is_logical(params.get("sharding"))
