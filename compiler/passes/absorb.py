"""Absorb inferred fragments into user fragments (pass ``-mpmd-absorb-inferred-fragments``).

Applied to a fixed point, over user fragments ``rf`` (root fragments):

1. an inferred producer ``ipf`` whose closest (first) consumer is ``rf`` is merged into ``rf``;
2. an inferred consumer ``icf`` whose closest (last) producer is ``rf`` is merged into ``rf``.

First, an inferred fragment without operands (a constant, e.g. the loss cotangent shared by all
microbatches) is cloned into each user fragment that reads it (``clone_inferred_fragments`` of
``-mpmd-merge-inferred-fragments``), so every microbatch's fragment computes it itself; chains of
such code (an inferred fragment reading only operand-free results, e.g. ``1.0 / M``) are cloned
link by link. Cloning is repeated whenever merging reaches a fixed point (a merge can make an
operand-free fragment's reader a user fragment).

Guards (ours): an inferred fragment is absorbed only if every user fragment it reaches through
inferred code only (upstream or downstream) has ``rf``'s call counter, so code that combines
microbatches (gradient and loss accumulation) or is shared by them (a weight cast, the loss
cotangent) stays a separate inferred fragment instead of tying one microbatch's fragment to
another's and defeating the schedule. Pattern 1 does not apply to inferred fragments reading program inputs
only (slicing a microbatch out of the batch), so the fragments of all microbatches keep one body.
"""

from __future__ import annotations

from dataclasses import replace

from compiler.passes._util import merge_pair, refresh_outputs
from compiler.program import Fragment, Program, fresh, producers, users


def _taint(p: Program) -> list[set]:
    """Per op: call counters of user fragments reachable through non-user ops (up or down)."""
    up: dict[str, set] = {}
    down: dict[str, set] = {}
    res: list[set] = [set() for _ in p.ops]
    for i, op in enumerate(p.ops):
        if isinstance(op, Fragment) and op.is_user:
            s = {op.call_counter}
        else:
            s = set().union(*(up.get(v, set()) for v in op.inputs))
            res[i] |= s
        for v in op.outputs:
            up[v] = s
    for i in range(len(p.ops) - 1, -1, -1):
        op = p.ops[i]
        if isinstance(op, Fragment) and op.is_user:
            s = {op.call_counter}
        else:
            s = set().union(*(down.get(v, set()) for v in op.outputs))
            res[i] |= s
        for v in op.inputs:
            down.setdefault(v, set()).update(s)
    return res


def _step(p: Program) -> Program | None:
    prod = producers(p)
    use = users(p)
    taint = _taint(p)
    for i, f in enumerate(p.ops):
        if not isinstance(f, Fragment) or f.is_user:
            continue
        # (1) closest consumer; not for code reading program inputs only (e.g. the slicing of a
        # microbatch out of the batch), which would make each microbatch's body differ
        cons = sorted({j for v in f.outputs for j in use.get(v, [])})
        if cons and any(v in prod for v in f.inputs):
            rf = p.ops[cons[0]]
            if isinstance(rf, Fragment) and rf.is_user and rf.mesh == f.mesh:
                if taint[i] <= {rf.call_counter}:
                    return merge_pair(p, i, cons[0], at="last")
        # (2) closest producer
        prods = sorted({prod[v] for v in f.inputs if v in prod})
        if prods:
            rf = p.ops[prods[-1]]
            if isinstance(rf, Fragment) and rf.is_user and rf.mesh == f.mesh:
                if taint[i] <= {rf.call_counter}:
                    return merge_pair(p, prods[-1], i, at="first")
    return None


def clone_operandless(p: Program) -> Program:
    """Clone every operand-free inferred fragment into the user fragments that read it, and into
    inferred fragments reading only such values (``p`` itself when there is nothing to clone)."""
    src = {v: op for op in p.ops if isinstance(op, Fragment) and not op.is_user and not op.inputs
           and op.part != "init" for v in op.outputs}

    def target(op: object) -> bool:
        # user readers; and inferred readers of operand-free values only (a chain of constant
        # code, which then becomes operand-free itself and is cloned on, recursively)
        return isinstance(op, Fragment) and op.part != "init" and bool(op.inputs) and (
            any(v in src for v in op.inputs) if op.is_user else all(v in src for v in op.inputs))

    if not any(target(op) for op in p.ops):
        return p
    types = dict(p.types)
    ops = []
    for op in p.ops:
        if target(op):
            frags = list(dict.fromkeys(src[v] for v in op.inputs if v in src))
            ren: dict[str, str] = {}
            pre = []
            for f in frags:
                local = {}
                for e in f.body:
                    for o in e.outputs:
                        local[o] = fresh("k")
                        types[local[o]] = types[o]
                    pre.append(e.rename(local))
                ren.update(local)
            body = tuple(pre) + tuple(replace(e, inputs=tuple(
                ren.get(a, a) if isinstance(a, str) else a for a in e.inputs)) for e in op.body)
            op = replace(op, inputs=tuple(v for v in op.inputs if v not in ren), body=body)
        ops.append(op)
    return refresh_outputs(p.with_ops(ops, types=types))


def absorb_inferred_fragments(p: Program) -> Program:
    """Clone operand-free inferred fragments into their user readers, then merge inferred
    fragments into user fragments, cloning again whenever merging stops, until nothing changes
    (dead clones are left to DCE)."""
    p = clone_operandless(p)
    while True:
        q = _step(p)
        if q is None:
            # absorbing may have made an operand-free fragment's reader a user fragment
            q = clone_operandless(p)
            if q is p:
                return p
        p = q
