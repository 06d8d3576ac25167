"""Mesh inference: place every meshless op on meshes by use_set / src_set (RFC "Mesh inference").

- ``use_set(v)``: union of the meshes where ``v`` is transitively used (fragments on a mesh, the
  source mesh of a transfer, a program output's requested mesh). An op must live where it is used.
- ``src_set(v)``: intersection of the meshes where ``v``'s transitive sources are available (a value
  is available on its mesh and on every mesh it is transferred to). An op can live there without
  new transfers.

Each meshless op is cloned onto every mesh of its ``use_set`` as an inferred fragment (origin ``[]``).
A program output with no requested mesh takes the first mesh (topology order) of its ``src_set``; an
unassigned input goes to the first mesh of its ``use_set`` (the first topology mesh when unused).
When ``use_set`` is not contained in ``src_set`` a transfer is created, or, with transfer inference
off, :class:`InferenceError` is raised naming the value. Dead meshless ops are dropped.
"""

from __future__ import annotations

from dataclasses import replace

from compiler.errors import InferenceError
from compiler.passes._util import rename_uses
from compiler.program import Fragment, MeshlessOp, NamedComputation, Op, Program, Transfer, fresh


def _producer_desc(p: Program, v: str) -> str:
    for op in p.ops:
        if v in op.outputs:
            if isinstance(op, Fragment):
                o = ", ".join(str(x) for x in op.origin) or "inferred"
                return f"result of fragment [{o}] call_counter={op.call_counter}"
            if isinstance(op, Transfer):
                return f"transfer of {op.value}"
    return "program input" if v in p.inputs else "value"


def infer_meshes(p: Program, infer_transfers: bool = True) -> Program:
    """Place all meshless ops (see the module docstring).

    Raises:
        InferenceError: a transfer is needed while ``infer_transfers`` is False, or a named
            computation was never assigned.
    """
    order = {m: k for k, m in enumerate(p.meshes)}
    first = lambda s: min(s, key=order.__getitem__)  # noqa: E731
    for op in p.ops:
        if isinstance(op, NamedComputation):
            raise InferenceError(f"named computation {op.name!r} reached mesh inference unassigned;"
                                 f" run mesh assignment first")
    home: dict[str, str] = {v: m for v, m in zip(p.inputs, p.input_meshes) if m is not None}
    avail: dict[str, set[str]] = {}
    meshless: set[str] = set()
    for op in p.ops:
        if isinstance(op, Fragment):
            for v in op.outputs:
                home[v] = op.mesh
        elif isinstance(op, Transfer):
            home[op.out] = op.dst
            avail.setdefault(op.value, set()).add(op.dst)
        else:
            meshless.update(op.outputs)
    for v, m in home.items():
        avail.setdefault(v, set()).add(m)
    allm = set(p.meshes)
    # src_set, forward
    src: dict[str, set[str]] = {}
    for v in p.inputs:
        src[v] = set(avail[v]) if v in home else set(allm)
    for op in p.ops:
        if isinstance(op, MeshlessOp):
            s = set(allm)
            for v in op.inputs:
                s &= src.get(v, avail.get(v, allm))
            for v in op.outputs:
                src[v] = s
        else:
            for v in op.outputs:
                src[v] = set(avail[v])
    # output meshes: requested, or the first of src_set
    out_mesh: list[str | None] = []
    for v, m in zip(p.outputs, p.output_meshes):
        if m is None and (v in meshless or v not in home):
            s = src.get(v) or allm
            m = first(s)
        out_mesh.append(m)
    # use_set, backward
    use: dict[str, set[str]] = {}
    for v, m in zip(p.outputs, out_mesh):
        if m is not None:
            use.setdefault(v, set()).add(m)
    for op in reversed(p.ops):
        if isinstance(op, Fragment):
            ms = {op.mesh}
        elif isinstance(op, Transfer):
            ms = {op.src}
        else:
            ms = set().union(*(use.get(v, set()) for v in op.outputs))
        for v in op.inputs:
            use.setdefault(v, set()).update(ms)
    in_m = list(p.input_meshes)
    for k, v in enumerate(p.inputs):
        if in_m[k] is None:
            in_m[k] = first(use[v]) if use.get(v) else p.meshes[0]
            home[v] = in_m[k]
    # clone meshless ops onto their use sets, rewriting reads
    name_on: dict[tuple[str, str], str] = {}
    for v, h in home.items():
        name_on[(v, h)] = v
    for t in p.ops:
        if isinstance(t, Transfer):
            name_on.setdefault((t.value, t.dst), t.out)
    types = dict(p.types)
    ops: list[Op] = []

    def on(v: str, m: str) -> str:
        if (v, m) in name_on:
            return name_on[(v, m)]
        if v in meshless:
            raise InferenceError(f"internal: meshless value {v} has no copy on mesh {m!r}")
        h = home[v]
        if not infer_transfers:
            raise InferenceError(f"value {v} ({_producer_desc(p, v)}) lives on mesh {h!r} but is "
                                 f"needed on mesh {m!r}: a transfer is needed while transfer "
                                 f"inference is off; enable infer_transfers or assign the users "
                                 f"of {v} to {h!r}")
        n = fresh()
        types[n] = types[v]
        ops.append(Transfer(v, h, m, n))
        name_on[(v, m)] = n
        return n

    for op in p.ops:
        if isinstance(op, MeshlessOp):
            ms = set().union(*(use.get(v, set()) for v in op.outputs))
            if not ms:
                continue  # dead
            for k, m in enumerate(sorted(ms, key=order.__getitem__)):
                ren = {v: on(v, m) for v in op.inputs}
                outs = {}
                for v in op.outputs:
                    if k == 0:
                        outs[v] = v
                    else:
                        outs[v] = fresh()
                        types[outs[v]] = types[v]
                    name_on[(v, m)] = outs[v]
                e = op.eqn.rename({**ren, **outs})
                ins = tuple(dict.fromkeys(a for a in e.inputs if isinstance(a, str)))
                ops.append(Fragment(m, (), ins, e.outputs, (e,)))
        elif isinstance(op, Fragment):
            ren = {v: on(v, op.mesh) for v in op.inputs if v in meshless or home.get(v) != op.mesh}
            ops.append(rename_uses(op, ren))
        else:
            ops.append(op)
    outputs = []
    for v, m in zip(p.outputs, out_mesh):
        if m is None:
            outputs.append(v)
        else:
            outputs.append(on(v, m))
    return replace(p, ops=tuple(ops), outputs=tuple(outputs), input_meshes=tuple(in_m),
                   output_meshes=tuple(out_mesh), types=types)
