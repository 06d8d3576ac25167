"""Transfer-aware passes: ``-mpmd-split-and-prioritize-transfer-independent-computations`` and
``-mpmd-transfer-aware-merge``. Both are optimisations, off by default (``MpmdConfig``
``split_transfer_independent`` / ``transfer_aware_merge``).

- :func:`split_and_prioritize_transfer_independent_computations`: a fragment reading a transfer
  result is split into ``A -> B``: ``A`` is the largest part of its body that reads no transfer
  result (directly or through the body), ``B`` the rest. ``A`` is moved up to just after the last
  producer of its operands, so the mesh computes it before it waits on the transfer; ``B`` stays
  where the fragment was. Both keep the fragment's origin, stage, call counter and part. A
  fragment whose body all depends on transfers, or none of it, is left alone (so the pass is
  idempotent).
- :func:`transfer_aware_merge`: an inferred fragment is moved across a transfer, and merged there,
  when that makes the transfer smaller. The pass list says only that it "merges inferred with
  user-defined or other inferred fragments" and is "more invasive" than
  ``-mpmd-merge-inferred-fragments``; the rule here is ours:

  1. *pull*: an inferred fragment whose operands all arrived by transfer from one mesh ``s``, and
     whose results are fewer bytes than those operands (a reduction, a slice), is computed on
     ``s`` instead, merged into the fragment there that produces its last operand, and its results
     are transferred (under their old names, so readers are unchanged);
  2. *push*: an inferred fragment whose results are read only by one transfer each, all to one
     mesh ``d``, and whose operands are fewer bytes than its results (a broadcast, a concatenation
     of a small value), is computed on ``d`` instead, from transferred operands, merged into its
     first reader there.

  Applied to a fixed point. Merges that would make a cycle are skipped (the fragment is still
  moved). Transfers nothing reads any more are dropped.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from compiler.errors import MergeError
from compiler.passes._util import merge_pair, refresh_outputs
from compiler.program import (Eqn, Fragment, Op, Program, TensorType, Transfer, body_free_inputs,
                              fresh, producers, users)

# --------------------------------------------------------------------------- split


def _split(f: Fragment, from_transfer: set[str]) -> tuple[Fragment, Fragment] | None:
    tainted = set(v for v in f.inputs if v in from_transfer)
    if not tainted:
        return None
    a_body: list[Eqn] = []
    b_body: list[Eqn] = []
    for e in f.body:
        if any(isinstance(x, str) and x in tainted for x in e.inputs):
            tainted.update(e.outputs)
            b_body.append(e)
        else:
            a_body.append(e)
    if not a_body or not b_body:
        return None
    b_in = body_free_inputs(b_body)
    a_defs = {o for e in a_body for o in e.outputs}
    outs = set(f.outputs)
    a_out = tuple(dict.fromkeys(o for e in a_body for o in e.outputs if o in outs or o in b_in))
    b_out = tuple(o for e in b_body for o in e.outputs if o in outs)
    a = replace(f, inputs=body_free_inputs(a_body), outputs=a_out, body=tuple(a_body))
    b = replace(f, inputs=b_in, outputs=b_out, body=tuple(b_body))
    assert all(v in a_defs or v in f.inputs for v in b_in)
    return a, b


def split_and_prioritize_transfer_independent_computations(p: Program) -> Program:
    """Split fragments into transfer-independent and -dependent parts (module docstring)."""
    ops: list[Op] = list(p.ops)
    k = 0
    while k < len(ops):
        f = ops[k]
        if isinstance(f, Fragment):
            from_transfer = {op.out for op in ops[:k] if isinstance(op, Transfer)}
            parts = _split(f, from_transfer)
            if parts is not None:
                a, b = parts
                where = {v: i for i, op in enumerate(ops[:k]) for v in op.outputs}
                at = max((where[v] + 1 for v in a.inputs if v in where), default=0)
                ops[k] = b
                ops.insert(at, a)
                k += 1
        k += 1
    return p.with_ops(ops)


# --------------------------------------------------------------------------- transfer-aware merge


def _bytes(t: TensorType) -> int:
    return int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize


def _movable(f: object) -> bool:
    return isinstance(f, Fragment) and not f.is_user and f.part != "init" and bool(f.inputs) \
        and not any(getattr(e.prim, "effects", None) for e in f.body)


def _pull(p: Program, i: int) -> Program | None:
    g = p.ops[i]
    prod = producers(p)
    ts = [p.ops[prod[v]] if v in prod else None for v in g.inputs]
    if not all(isinstance(t, Transfer) and t.dst == g.mesh for t in ts):
        return None
    src = {t.src for t in ts}
    if len(src) != 1:
        return None
    size = lambda vs: sum(_bytes(p.types[v]) for v in vs)  # noqa: E731
    if size(g.outputs) >= size(g.inputs):
        return None
    (s,) = src
    types = dict(p.types)
    ren = {t.out: t.value for t in ts}
    new_out = {}
    for o in g.outputs:
        new_out[o] = fresh("p")
        types[new_out[o]] = types[o]
    body = tuple(e.rename({**ren, **new_out}) for e in g.body)
    moved = Fragment(s, (), tuple(dict.fromkeys(ren[v] for v in g.inputs)),
                     tuple(new_out[o] for o in g.outputs), body)
    sends = [Transfer(new_out[o], s, g.mesh, o) for o in g.outputs]
    ops = list(p.ops[:i]) + [moved] + sends + list(p.ops[i + 1:])
    q = _drop_dead_transfers(replace(p, ops=tuple(ops), types=types))
    k = q.ops.index(moved)
    prod = producers(q)
    last = max(prod[v] for v in moved.inputs if v in prod) if any(v in prod for v in moved.inputs) \
        else None
    if last is not None and isinstance(q.ops[last], Fragment) and q.ops[last].mesh == s:
        try:
            return merge_pair(q, last, k, at="first")
        except MergeError:
            pass
    return q


def _push(p: Program, i: int) -> Program | None:
    g = p.ops[i]
    use = users(p)
    readers = {o: use.get(o, []) for o in g.outputs}
    if set(g.outputs) & set(p.outputs):
        return None
    if not all(len(r) == 1 and isinstance(p.ops[r[0]], Transfer) for r in readers.values()):
        return None
    ts = {o: p.ops[r[0]] for o, r in readers.items()}
    dst = {t.dst for t in ts.values()}
    if len(dst) != 1:
        return None
    size = lambda vs: sum(_bytes(p.types[v]) for v in vs)  # noqa: E731
    if size(g.inputs) >= size(g.outputs):
        return None
    (d,) = dst
    types = dict(p.types)
    have = {t.value: t.out for t in p.ops if isinstance(t, Transfer) and t.dst == d}
    sends, ren = [], {}
    for v in g.inputs:
        if v in have:
            ren[v] = have[v]
        else:
            ren[v] = fresh("t")
            types[ren[v]] = types[v]
            sends.append(Transfer(v, g.mesh, d, ren[v]))
    out_ren = {o: t.out for o, t in ts.items()}
    body = tuple(e.rename({**ren, **out_ren}) for e in g.body)
    moved = Fragment(d, (), tuple(ren[v] for v in g.inputs), tuple(out_ren[o] for o in g.outputs),
                     body)
    gone = {id(t) for t in ts.values()} | {id(g)}
    at = max(p.ops.index(t) for t in ts.values())
    ops = [op for op in p.ops[:at + 1] if id(op) not in gone] + sends + [moved] + \
        [op for op in p.ops[at + 1:] if id(op) not in gone]
    q = replace(p, ops=tuple(ops), types=types)
    k = q.ops.index(moved)
    use = users(q)
    first = min((j for o in moved.outputs for j in use.get(o, [])), default=None)
    if first is not None and isinstance(q.ops[first], Fragment) and q.ops[first].mesh == d:
        try:
            return merge_pair(q, k, first, at="last")
        except MergeError:
            pass
    return q


def _drop_dead_transfers(p: Program) -> Program:
    read = {v for op in p.ops for v in op.inputs} | set(p.outputs)
    return p.with_ops(op for op in p.ops if not (isinstance(op, Transfer) and op.out not in read))


def transfer_aware_merge(p: Program) -> Program:
    """Move inferred fragments across transfers where that shrinks them (module docstring)."""
    changed = True
    while changed:
        changed = False
        for i, g in enumerate(p.ops):
            if not _movable(g):
                continue
            q = _pull(p, i) or _push(p, i)
            if q is not None:
                p = refresh_outputs(q)
                changed = True
                break
    return p
