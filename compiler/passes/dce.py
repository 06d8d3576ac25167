"""Dead-code elimination and deduplication (passes ``-mpmd-fragment-dce``, ``-mpmd-fragment-dedup``).

- :func:`fragment_dce`: drops unused fragment results, the body equations they needed, unused
  fragment operands, dead transfers, dead meshless ops and inferred fragments with no used result.
  User fragments are kept even when empty (they are scheduling units).
- :func:`fragment_dedup`: an inferred fragment identical to an earlier one on the same mesh (same
  body and operands) is removed and its results read from the earlier one (CSE of clones).
"""

from __future__ import annotations

from dataclasses import replace

from compiler.passes._util import rename_program
from compiler.program import Fragment, MeshlessOp, NamedComputation, Op, Program, Transfer, body_key


def fragment_dce(p: Program) -> Program:
    """See the module docstring."""
    live = set(p.outputs)
    kept: list[Op] = []
    for op in reversed(p.ops):
        if isinstance(op, Fragment):
            outs = tuple(v for v in op.outputs if v in live)
            need = set(outs)
            body = []
            for e in reversed(op.body):
                if any(o in need for o in e.outputs) or getattr(e.prim, "effects", None):
                    body.append(e)
                    need.update(a for a in e.inputs if isinstance(a, str))
            body.reverse()
            defined = {o for e in body for o in e.outputs}
            ins = tuple(v for v in op.inputs if v in need and v not in defined)
            extra = tuple(dict.fromkeys(a for e in body for a in e.inputs
                                        if isinstance(a, str) and a not in defined and a not in ins))
            ins = ins + extra
            if not outs and not op.is_user and not body:
                continue
            if not outs and not op.is_user:
                continue
            op = replace(op, inputs=ins, outputs=outs, body=tuple(body))
        elif isinstance(op, (Transfer, MeshlessOp)):
            if not any(v in live for v in op.outputs):
                continue
        elif isinstance(op, NamedComputation):
            pass
        live.update(op.inputs)
        kept.append(op)
    kept.reverse()
    return p.with_ops(kept)


def fragment_dedup(p: Program) -> Program:
    """See the module docstring."""
    seen: dict[tuple, Fragment] = {}
    alias: dict[str, str] = {}
    ops: list[Op] = []
    for op in p.ops:
        if isinstance(op, Fragment) and not op.is_user:
            ins = tuple(alias.get(v, v) for v in op.inputs)
            key = (op.mesh, ins, body_key(op, p))
            if key in seen:
                alias.update(zip(op.outputs, seen[key].outputs))
                continue
            seen[key] = op
        ops.append(op)
    return rename_program(p, ops, alias)
