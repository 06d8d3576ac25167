"""SPMD sharding propagation across the MPMD program (RFC "SPMD sharding propagation").

Inside a fragment, JAX/XLA propagates: the fragment body is lowered with ``jax.jit`` on its mesh,
its operands' shardings given, and the result shardings XLA chooses are read back from the compiled
executable (once per unique body and operand shardings). A fragment whose operands are all
replicated and whose body holds nothing that shards (no sharding constraint, ``shard_map``,
``device_put``, nor any ``Sharding`` parameter, nested jaxprs included) is not compiled: with no
sharding to propagate, its results are replicated. Across a transfer, the MPMD layer propagates: the destination value gets the source's
sharding by mesh-axis name (RFC: "we simply propagate using the Shardy axes names"), dropping an
axis the destination mesh lacks or whose size does not divide the dimension. Inputs take the
given spec, else replicated. Propagation is forward in program order (results whose sharding XLA
leaves unspecified become replicated). Fills ``Program.specs`` for every top-level value.

Accumulators (``compiler.passes.accumulate``: a mesh's ``part="init"`` fragment makes the
zeros that each microbatch's fragment adds its gradient to) take the sharding of what is added to
them: a second sweep gives each zero the spec XLA chose for the sum it starts. Otherwise the zeros
would be replicated, the first microbatch's fragment would read a replicated accumulator and the
others a sharded one, and one body would need two executables (tensor parallel, FSDP).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Mapping

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from compiler.program import Fragment, Program, Spec, Transfer, body_function, body_key
from compiler.passes.accumulate import ACC_PRIMS, INIT_PART


def spec_of(ps: Any, ndim: int) -> Spec:
    """A ``PartitionSpec`` (or None) as a :data:`Spec` of length ``ndim``."""
    dims: list[tuple[str, ...]] = []
    for d in tuple(ps or ())[:ndim]:
        if d is None:
            dims.append(())
        elif isinstance(d, str):
            dims.append((d,))
        else:
            dims.append(tuple(d))
    return tuple(dims) + ((),) * (ndim - len(dims))


def partition_spec(spec: Spec | None) -> PartitionSpec:
    if not spec:
        return PartitionSpec()
    return PartitionSpec(*[None if not d else (d[0] if len(d) == 1 else d) for d in spec])


def adapt(spec: Spec, shape: tuple[int, ...], mesh: Any) -> Spec:
    """``spec`` restricted to the axes of ``mesh`` that divide each dimension."""
    sizes = dict(mesh.shape)
    out = []
    for d, n in zip(spec, shape):
        axes = tuple(a for a in d if a in sizes)
        if axes and n % int(np.prod([sizes[a] for a in axes])) != 0:
            axes = ()
        out.append(axes)
    return tuple(out)


def _sharding_spec(s: Any, ndim: int, mesh: Any = None) -> Spec:
    """The spec of an output sharding XLA chose. JAX names it (``NamedSharding``) when it can;
    otherwise (a ``GSPMDSharding``, e.g. past a sharding constraint) the spec over ``mesh``'s
    axes of size > 1 (each on one dimension or none, several on one dimension in mesh order)
    that is equivalent to it; replicated when none is."""
    if isinstance(s, NamedSharding):
        return spec_of(s.spec, ndim)
    if mesh is None or ndim == 0 or s.is_fully_replicated:
        return ((),) * ndim
    axes = [a for a, n in zip(mesh.axis_names, mesh.devices.shape) if n > 1]
    for dims in itertools.product(range(ndim + 1), repeat=len(axes)):
        spec = tuple(tuple(a for a, d in zip(axes, dims) if d == k) for k in range(ndim))
        if NamedSharding(mesh, partition_spec(spec)).is_equivalent_to(s, ndim):
            return spec
    return ((),) * ndim


_SHARDING_PRIMS = frozenset({"sharding_constraint", "shard_map", "custom_partitioning",
                             "mesh_cast", "reshard", "device_put", "xla_pmap"})


def _may_shard(eqns: Any) -> bool:
    """Whether equations (nested jaxprs included) may give XLA a sharding to propagate: a
    sharding primitive (a constraint, ``shard_map``, ``device_put``, ...) or any parameter that
    is a ``jax.sharding.Sharding`` other than a replicated ``NamedSharding`` (a ``jit`` with
    in/out shardings, an explicit-sharding broadcast); a nested ``jit``'s context mesh is not."""
    for e in eqns:
        if getattr(e.prim if hasattr(e, "prim") else e.primitive, "name", "") in _SHARDING_PRIMS:
            return True
        for v in e.params.values():
            for x in (v if isinstance(v, (tuple, list)) else (v,)):
                if isinstance(x, (jax.sharding.Mesh, jax.sharding.AbstractMesh)):
                    continue  # the context mesh of a nested jit, not a sharding
                if isinstance(x, NamedSharding) and all(d is None for d in x.spec):
                    continue  # replicated
                if isinstance(x, jax.sharding.Sharding):
                    return True
                j = getattr(x, "jaxpr", x)
                if type(j).__name__ == "Jaxpr" and _may_shard(j.eqns):
                    return True
    return False


def _accumulator_specs(p: Program, specs: Mapping[str, Spec]) -> dict[str, Spec]:
    """Init-fragment output -> the spec of the sum it starts (the output of the ``add`` /
    ``add_any`` that reads it in the first fragment using it)."""
    zeros = {v for op in p.ops if isinstance(op, Fragment) and op.part == INIT_PART
             for v in op.outputs}
    out: dict[str, Spec] = {}
    for op in p.ops:
        if not isinstance(op, Fragment) or op.part == INIT_PART:
            continue
        outs = set(op.outputs)
        for e in op.body:
            if getattr(e.prim, "name", None) in ACC_PRIMS and len(e.outputs) == 1 \
                    and e.outputs[0] in outs and e.outputs[0] in specs:
                for a in e.inputs:
                    if isinstance(a, str) and a in zeros and a not in out:
                        out[a] = specs[e.outputs[0]]
    return out


def propagate_shardings(p: Program, topology: Mapping[str, Any],
                        in_specs: Mapping[int, Spec] | None = None) -> Program:
    """Fill ``specs`` (see the module docstring).

    Args:
        topology: mesh name -> ``jax.sharding.Mesh``.
        in_specs: flattened input index -> spec (others replicated).
    """
    fixed: dict[str, Spec] = {}
    specs = _sweep(p, topology, in_specs, fixed)
    for _ in range(3):     # converges in one round: an accumulator's sum keeps the spec it had
        new = _accumulator_specs(p, specs)
        if not new or new == fixed:
            break
        fixed = new
        specs = _sweep(p, topology, in_specs, fixed)
    return replace(p, specs=specs)


def _sweep(p: Program, topology: Mapping[str, Any], in_specs: Mapping[int, Spec] | None,
           fixed: Mapping[str, Spec]) -> dict[str, Spec]:
    specs: dict[str, Spec] = {}
    for k, (v, m) in enumerate(zip(p.inputs, p.input_meshes)):
        shape = p.types[v].shape
        s = (in_specs or {}).get(k)
        specs[v] = adapt(spec_of(s, len(shape)), shape, topology[m]) if m is not None and s is not None \
            else ((),) * len(shape)
    cache: dict[str, tuple[Spec, ...]] = {}
    for op in p.ops:
        if isinstance(op, Transfer):
            t = p.types[op.out]
            specs[op.out] = adapt(specs[op.value], t.shape, topology[op.dst])
        elif isinstance(op, Fragment):
            if not op.outputs:
                continue
            if all(not any(specs[v]) for v in op.inputs) and not _may_shard(op.body):
                # replicated operands and nothing in the body that shards: XLA has no sharding to
                # propagate, its results are replicated (no need to compile the body to see it)
                specs.update((v, ((),) * len(p.types[v].shape)) for v in op.outputs)
            else:
                key = body_key(op, replace(p, specs={v: specs[v] for v in op.inputs}))
                if key not in cache:
                    mesh = topology[op.mesh]
                    args = [jax.ShapeDtypeStruct(
                        p.types[v].shape, np.dtype(p.types[v].dtype),
                        sharding=NamedSharding(mesh, partition_spec(specs[v]))) for v in op.inputs]
                    compiled = jax.jit(body_function(op, mesh)).lower(*args).compile()
                    cache[key] = tuple(_sharding_spec(s, len(p.types[v].shape), mesh)
                                       for s, v in zip(compiled.output_shardings, op.outputs))
                specs.update(zip(op.outputs, cache[key]))
            for v in op.outputs:
                if v in fixed:
                    specs[v] = adapt(fixed[v], p.types[v].shape, topology[op.mesh])
    return specs
