"""Shared helpers of the passes: renaming uses, output recomputation, merging two fragments."""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

from compiler.errors import MergeError
from compiler.program import Atom, Fragment, MeshlessOp, NamedComputation, Op, Origin, Program, Transfer


def rename_uses(op: Op, m: Mapping[str, str]) -> Op:
    """``op`` with every read of a name in ``m`` replaced (definitions untouched)."""
    if not any(v in m for v in op.inputs):
        return op
    if isinstance(op, Transfer):
        return replace(op, value=m.get(op.value, op.value))
    if isinstance(op, MeshlessOp):
        e = op.eqn
        return MeshlessOp(replace(e, inputs=tuple(m.get(a, a) if isinstance(a, str) else a
                                                  for a in e.inputs)))
    body = tuple(replace(e, inputs=tuple(m.get(a, a) if isinstance(a, str) else a
                                         for a in e.inputs)) for e in op.body)
    ins = tuple(dict.fromkeys(m.get(v, v) for v in op.inputs))
    return replace(op, inputs=ins, body=body)


def rename_program(p: Program, ops: Sequence[Op], m: Mapping[str, str]) -> Program:
    """Program with ``ops`` whose reads (and the program outputs) are renamed by ``m``."""
    if not m:
        return p.with_ops(ops)
    return p.with_ops([rename_uses(op, m) for op in ops],
                      outputs=tuple(m.get(v, v) for v in p.outputs))


def used_names(ops: Sequence[Op], outputs: Sequence[str]) -> set[str]:
    s = set(outputs)
    for op in ops:
        s.update(op.inputs)
    return s


def refresh_outputs(p: Program) -> Program:
    """Recompute every fragment's outputs as the body values used outside it (in body order)."""
    used: dict[str, int] = {}
    for v in p.outputs:
        used[v] = used.get(v, 0) + 1
    for op in p.ops:
        for v in set(op.inputs):
            used[v] = used.get(v, 0) + 1
    ops = []
    for op in p.ops:
        if isinstance(op, Fragment):
            outs = tuple(v for e in op.body for v in e.outputs if used.get(v, 0) > 0)
            op = replace(op, outputs=outs)
        ops.append(op)
    return p.with_ops(ops)


def merged_origin(a: tuple[Origin, ...], b: tuple[Origin, ...]) -> tuple[Origin, ...]:
    return tuple(dict.fromkeys(a + b))


def _same(x: object, y: object) -> object:
    return x if x == y else None


def merge_pair(p: Program, i: int, j: int, *, at: str = "last") -> Program:
    """Merge fragments ``ops[i]`` and ``ops[j]`` (``i < j``, same mesh) into one.

    ``at="last"`` puts the merged fragment at ``j`` and moves the ops between that depend on
    ``ops[i]`` after it; ``at="first"`` puts it at ``i`` and moves the ops between that ``ops[j]``
    depends on before it. Attributes: origins concatenated; stage, call counter and part kept where
    equal, else taken from the user fragment when the other is inferred, else None/"".

    Raises:
        MergeError: the merge would make a cycle (``ops[j]`` depends on ``ops[i]`` through an op
            in between, which would then have to run inside the merged fragment).
    """
    a, b = p.ops[i], p.ops[j]
    assert isinstance(a, Fragment) and isinstance(b, Fragment) and a.mesh == b.mesh and i < j
    between = list(p.ops[i + 1:j])
    before: list[Op] = []
    after: list[Op] = []
    if at == "last":
        dep = set(a.outputs)
        for op in between:
            if any(v in dep for v in op.inputs):
                after.append(op)
                dep.update(op.outputs)
            else:
                before.append(op)
        bad = [v for v in b.inputs if v in dep and v not in a.outputs]
    else:
        need = set(b.inputs)
        for op in reversed(between):
            if any(v in need for v in op.outputs):
                before.insert(0, op)
                need.update(op.inputs)
            else:
                after.insert(0, op)
        bad = [v for op in before for v in op.inputs if v in a.outputs]
    if bad:
        raise MergeError(f"cannot merge fragment {_desc(a)} with {_desc(b)} on mesh {a.mesh!r}: "
                         f"the latter depends on the former through other ops (value {bad[0]}); "
                         f"merging would create a cycle")
    if a.is_user and b.is_user:
        stage, cc, part = _same(a.stage, b.stage), _same(a.call_counter, b.call_counter), \
            (a.part if a.part == b.part else "")
    else:
        u = a if a.is_user else b
        stage, cc, part = u.stage, u.call_counter, u.part
    body = a.body + b.body
    defined = {v for e in body for v in e.outputs}
    ins = tuple(dict.fromkeys([v for v in a.inputs + b.inputs if v not in defined]))
    merged = Fragment(a.mesh, merged_origin(a.origin, b.origin), ins, (), body, stage, cc, part)
    ops = list(p.ops[:i]) + before + [merged] + after + list(p.ops[j + 1:])
    return refresh_outputs(p.with_ops(ops))


def _desc(f: Fragment) -> str:
    o = ", ".join(str(x) for x in f.origin) or "inferred"
    return f"[{o}] (stage {f.stage}, call_counter {f.call_counter})"


def describe(f: Fragment) -> str:
    """One-line description of a fragment for error messages."""
    return _desc(f) + f" on mesh {f.mesh!r}"


def atom_name(a: Atom) -> str:
    return a if isinstance(a, str) else str(a)


__all__ = ["rename_uses", "rename_program", "refresh_outputs", "merge_pair", "describe",
           "used_names", "NamedComputation"]
