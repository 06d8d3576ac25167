"""Mesh assignment: named computations become fragments on their meshes; direct transfers are created.

RFC "Mesh assignment": the user maps names (or stages) to meshes, and input/output indices to
meshes. A named computation the config does not place is dissolved into meshless ops (mesh inference
places them). An unassigned input read by a user fragment goes to that fragment's mesh (the first in
program order). A transfer is created only for a direct mesh change: a user fragment (or assigned
input) value read by a user fragment on another mesh; it is placed right after the producer.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from compiler.errors import AssignmentError
from compiler.passes._util import rename_uses
from compiler.program import Fragment, MeshlessOp, NamedComputation, Op, Origin, Program, Transfer, fresh

Placer = Callable[[str], "tuple[str, int] | None"]


def assign_meshes(p: Program, place: Placer, input_meshes: dict[int, str] | None = None,
                  output_meshes: dict[int, str] | None = None) -> Program:
    """Assign named computations, inputs and outputs to meshes and create direct transfers.

    Args:
        place: name -> (mesh, stage), or None for a name the user did not assign
            (``MpmdConfig.place``).
        input_meshes / output_meshes: flattened index -> mesh.

    Raises:
        AssignmentError: a name, input or output placed on a mesh not in ``p.meshes``.
    """
    ops: list[Op] = []
    for op in p.ops:
        if not isinstance(op, NamedComputation):
            ops.append(op)
            continue
        pl = place(op.name)
        if pl is None:
            ops.extend(MeshlessOp(e) for e in op.body)
            continue
        mesh, stage = pl
        if mesh not in p.meshes:
            raise AssignmentError(f"named computation {op.name!r} is assigned to mesh {mesh!r}, "
                                  f"which is not in the topology {list(p.meshes)}; fix the assignment")
        ops.append(Fragment(mesh, (Origin(op.name, op.transpose),), op.inputs, op.outputs, op.body,
                            stage, op.call_counter))
    in_m = list(p.input_meshes)
    for i, m in (input_meshes or {}).items():
        if m not in p.meshes:
            raise AssignmentError(f"input {i} is assigned to mesh {m!r}, which is not in the "
                                  f"topology {list(p.meshes)}; fix input_meshes")
        in_m[i] = m
    out_m = list(p.output_meshes)
    for i, m in (output_meshes or {}).items():
        if m not in p.meshes:
            raise AssignmentError(f"output {i} is assigned to mesh {m!r}, which is not in the "
                                  f"topology {list(p.meshes)}; fix output_meshes")
        out_m[i] = m
    # unassigned inputs read by user fragments go to the first reader's mesh
    idx = {v: k for k, v in enumerate(p.inputs)}
    for op in ops:
        if isinstance(op, Fragment):
            for v in op.inputs:
                if v in idx and in_m[idx[v]] is None:
                    in_m[idx[v]] = op.mesh
    home: dict[str, str] = {v: m for v, m in zip(p.inputs, in_m) if m is not None}
    copies: dict[tuple[str, str], str] = {}
    head: list[Op] = []
    after: dict[str, list[Op]] = {}
    out: list[Op] = []
    for op in ops:
        if isinstance(op, Fragment):
            ren = {}
            for v in op.inputs:
                h = home.get(v)
                if h is not None and h != op.mesh:
                    key = (v, op.mesh)
                    if key not in copies:
                        copies[key] = fresh()
                        t = Transfer(v, h, op.mesh, copies[key])
                        (after.setdefault(v, []) if v not in idx else head).append(t)
                    ren[v] = copies[key]
            op = rename_uses(op, ren)
            for v in op.outputs:
                home[v] = op.mesh
        out.append(op)
    final: list[Op] = list(head)
    for op in out:
        final.append(op)
        for v in op.outputs:
            final.extend(after.pop(v, []))
    types = dict(p.types)
    for (v, _m), n in copies.items():
        types[n] = types[v]
    return replace(p, ops=tuple(final), input_meshes=tuple(in_m), output_meshes=tuple(out_m),
                   types=types)
