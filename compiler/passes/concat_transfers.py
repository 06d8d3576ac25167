"""Transfer concatenation: small transfers between the same fragments become one
(the concatenation half of the pass list's ``-mpmd-merge-transfers``, which "concatenates small
transfers between the same fragments"; ``passes/transfers.py`` does the de-duplication half).

A training step with its optimizer sends many scalars from one fragment to the same other mesh at
one point of the schedule: each mesh's partial sums of squares for the global gradient norm, the
L2 term's partial sums, the clipping scale. Each is a separate device-to-device copy at run time.
:func:`concat_transfers` packs them:

- **Group**: within a run of consecutive transfers (nothing else between them, so they happen at
  the same point of the schedule), the transfers whose value a same fragment ``F`` produces, to the
  same destination mesh, of the same dtype, each of at most ``max_bytes``, and whose result only
  fragments read (not a program output, not forwarded by another transfer). A group of two or more
  is packed.
- **Pack**: ``F`` gets ``concatenate([v.reshape(-1) for v in values])`` at the end of its body;
  one transfer moves the packed vector where the group's first transfer was.
- **Unpack**: each reading fragment on the destination starts with a ``slice`` + ``reshape`` of
  the packed vector per value it reads (under fresh names, its body's reads renamed), so no value
  is defined twice.

Values are copied bit for bit (concatenation, slicing and reshaping of one dtype), so results are
unchanged. Fragment bodies change, not their number: the executable count stays the same.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from compiler.passes._util import refresh_outputs
from compiler.program import Atom, Eqn, Fragment, Lit, Op, Program, TensorType, Transfer, fresh

MAX_BYTES = 4096
"""Largest value (bytes) packed: scalars and small vectors; activations move on their own."""


def _spliced(fn: Callable[..., Any], args: Sequence[str], outs: Sequence[str] | None,
             types: dict[str, TensorType]) -> tuple[list[Eqn], list[str]]:
    """The equations of ``jax.make_jaxpr(fn)`` on ``args``' types over fresh names (results
    named ``outs`` when given); and the results' names."""
    specs = [jax.ShapeDtypeStruct(types[a].shape, np.dtype(types[a].dtype)) for a in args]
    closed = jax.make_jaxpr(fn)(*specs)
    assert not closed.consts, "packing code has no constants"
    env: dict[Any, Atom] = dict(zip(closed.jaxpr.invars, args))
    final = dict(zip(closed.jaxpr.outvars, outs)) if outs is not None else {}
    eqns: list[Eqn] = []
    for e in closed.jaxpr.eqns:
        ins = tuple(Lit(np.asarray(a.val).item(), str(np.dtype(a.aval.dtype)))
                    if type(a).__name__ == "Literal" else env[a] for a in e.invars)
        names = []
        for v in e.outvars:
            n = final.get(v) or fresh("cat")
            env[v] = n
            types[n] = TensorType(tuple(int(d) for d in v.aval.shape), str(np.dtype(v.aval.dtype)))
            names.append(n)
        eqns.append(Eqn(e.primitive, dict(e.params), ins, tuple(names), getattr(e, "ctx", None)))
    res = [env[v] for v in closed.jaxpr.outvars]
    assert all(isinstance(r, str) for r in res), "every packed piece is computed"
    return eqns, res  # type: ignore[return-value]


def _nbytes(t: TensorType) -> int:
    return int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize


def _groups(p: Program, max_bytes: int) -> list[list[int]]:
    """Indices (into ``p.ops``) of each group of transfers to pack (see the module docstring)."""
    prod = {v: i for i, op in enumerate(p.ops) if isinstance(op, Fragment) for v in op.outputs}
    readers: dict[str, list[Op]] = {}
    for op in p.ops:
        for v in dict.fromkeys(op.inputs):
            readers.setdefault(v, []).append(op)
    outs = set(p.outputs)

    def packable(t: Transfer) -> bool:
        rs = readers.get(t.out, [])
        return (t.value in prod and t.out not in outs and bool(rs)
                and all(isinstance(r, Fragment) and r.mesh == t.dst for r in rs)
                and _nbytes(p.types[t.value]) <= max_bytes)

    groups: list[list[int]] = []
    i = 0
    while i < len(p.ops):
        if not isinstance(p.ops[i], Transfer):
            i += 1
            continue
        j = i
        by: dict[tuple, list[int]] = {}
        while j < len(p.ops) and isinstance(p.ops[j], Transfer):
            t = p.ops[j]
            assert isinstance(t, Transfer)
            if packable(t):
                by.setdefault((prod[t.value], t.dst, p.types[t.value].dtype), []).append(j)
            j += 1
        groups.extend(g for g in by.values() if len(g) > 1)
        i = j
    return groups


def _rename_body(body: Sequence[Eqn], m: dict[str, str]) -> tuple[Eqn, ...]:
    return tuple(replace(e, inputs=tuple(m.get(a, a) if isinstance(a, str) else a
                                         for a in e.inputs)) for e in body)


def concat_transfers(p: Program, max_bytes: int = MAX_BYTES) -> Program:
    """Pack each group of small transfers into one (see the module docstring); ``p`` itself
    when there is nothing to pack."""
    groups = _groups(p, max_bytes)
    if not groups:
        return p
    types = dict(p.types)
    ops: list[Op | None] = list(p.ops)
    # per destination value: (packed name on the destination, offset, size, shape)
    piece: dict[str, tuple[str, int, int, tuple[int, ...]]] = {}
    for g in groups:
        ts = [p.ops[k] for k in g]
        assert all(isinstance(t, Transfer) for t in ts)
        values = [t.value for t in ts]  # type: ignore[union-attr]
        fi = next(i for i, op in enumerate(p.ops)
                  if isinstance(op, Fragment) and values[0] in op.outputs)
        f = ops[fi]
        assert isinstance(f, Fragment)
        packed = fresh("packed")
        eqns, _ = _spliced(lambda *xs: jnp.concatenate([jnp.reshape(x, (-1,)) for x in xs]),
                           values, [packed], types)
        ops[fi] = replace(f, body=f.body + tuple(eqns), outputs=f.outputs + (packed,))
        first = ts[0]
        assert isinstance(first, Transfer)
        moved = fresh("packed")
        types[moved] = types[packed]
        ops[g[0]] = Transfer(packed, first.src, first.dst, moved)
        for k in g[1:]:
            ops[k] = None
        off = 0
        for t in ts:
            assert isinstance(t, Transfer)
            tt = types[t.value]
            n = int(np.prod(tt.shape, dtype=np.int64))
            piece[t.out] = (moved, off, n, tt.shape)
            off += n
    new_ops: list[Op] = []
    for op in ops:
        if op is None:
            continue
        if isinstance(op, Fragment) and any(v in piece for v in op.inputs):
            need = [v for v in op.inputs if v in piece]
            ren: dict[str, str] = {}
            pre: list[Eqn] = []
            for src in dict.fromkeys(piece[v][0] for v in need):
                mine = [v for v in need if piece[v][0] == src]
                spans = [(piece[v][1], piece[v][2], piece[v][3]) for v in mine]
                eqns, names = _spliced(
                    lambda x, spans=spans: tuple(jnp.reshape(x[o:o + n], s) for o, n, s in spans),
                    [src], None, types)
                pre.extend(eqns)
                ren.update(zip(mine, names))
            ins = tuple(dict.fromkeys(piece[v][0] if v in piece else v for v in op.inputs))
            op = replace(op, inputs=ins, body=tuple(pre) + _rename_body(op.body, ren))
        new_ops.append(op)
    return refresh_outputs(p.with_ops(new_ops, types=types))
