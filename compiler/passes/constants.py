"""Copy constants into their consumers (pass ``-mpmd-copy-constants``).

A fragment result computed by an equation with no value operands (a ``constant``, a broadcast of a
literal, an ``iota``) and read by another fragment, directly or through a transfer, is recomputed
inside the consumer instead: the consumer gets a copy of the equation and no longer reads the
result (DCE then removes the dead transfer and result). This avoids transferring constants.
Accumulator-init fragments (``part="init"``, ``passes/accumulate.py``) are not copied from: their
zeros are the starting value of a running sum, and copying them into the first accumulating
fragment would give that fragment a body of its own.
"""

from __future__ import annotations

from dataclasses import replace

from compiler.passes._util import refresh_outputs
from compiler.program import Eqn, Fragment, Op, Program, Transfer, fresh


def _is_constant(e: Eqn) -> bool:
    return not any(isinstance(a, str) for a in e.inputs) and len(e.outputs) == 1 and \
        not getattr(e.prim, "multiple_results", False) and not getattr(e.prim, "effects", None)


def copy_constants(p: Program) -> Program:
    """See the module docstring."""
    const: dict[str, Eqn] = {}
    for op in p.ops:
        if isinstance(op, Fragment) and op.part != "init":  # zeroed accumulators stay put
            for e in op.body:
                if _is_constant(e) and e.outputs[0] in op.outputs:
                    const[e.outputs[0]] = e
        elif isinstance(op, Transfer) and op.value in const:
            const[op.out] = const[op.value]
    if not const:
        return p
    types = dict(p.types)
    ops: list[Op] = []
    for op in p.ops:
        if isinstance(op, Fragment):
            hit = [v for v in op.inputs if v in const]
            if hit:
                ren, pre = {}, []
                for v in hit:
                    n = fresh("c")
                    types[n] = types[v]
                    ren[v] = n
                    pre.append(replace(const[v], outputs=(n,)))
                body = tuple(pre) + tuple(replace(e, inputs=tuple(
                    ren.get(a, a) if isinstance(a, str) else a for a in e.inputs)) for e in op.body)
                op = replace(op, inputs=tuple(v for v in op.inputs if v not in ren), body=body)
        ops.append(op)
    return refresh_outputs(p.with_ops(ops, types=types))
