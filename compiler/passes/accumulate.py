"""Uniform accumulation: sums across microbatches become one add per fragment, into a zeroed buffer.

After scheduling, what is left of the inferred code is the combination of microbatches: ``jax.grad``
of a step that calls a layer once per microbatch sums the layer's parameter gradients with a tree
of ``add_any`` (``((g3 + g2) + g1) + g0``, last microbatch first), and the step sums the
microbatch losses with ``add``. Such a tree cannot be absorbed into the fragments as it is: each
node combines two microbatches, and merging a node into one of them gives that microbatch's fragment
a body of its own (one more executable per microbatch, the pass list's "gradient accumulation gone
wrong").

This pass rewrites every such tree into a sequential accumulation in the *scheduled* order of the
fragments that produce its leaves, starting from a zero-initialised accumulator::

    acc0 = zeros                     (the mesh's accumulator-init fragment, part="init")
    acc1 = acc0 + g_a                (absorbed into the fragment producing g_a)
    acc2 = acc1 + g_b                (absorbed into the fragment producing g_b)  ...

so every microbatch's fragment absorbs the same add (operand ``acc_in``, result ``acc_out``) and all
keep one body. The zeros of all trees of a mesh form one inferred fragment with ``part="init"``,
placed first in the program (one executable per mesh, called once per step; ``copy_constants``
leaves it alone). The root keeps its name, so its readers (program outputs, the optimizer) are
unchanged. Summation order follows the schedule: results equal the original up to float rounding.

A sum that is then scaled by a literal (``sum / M``, the mean over microbatches: an inferred
one-equation ``div`` by, or ``mul`` with, a literal, the sum's only reader) would be one more
inferred fragment after the last add; the scaling is distributed over the terms instead
(``acc + g / M``), so it is absorbed with the add (equal up to float rounding).

A tree is: inferred fragments holding one ``add``/``add_any`` of two same-typed operands on one
mesh, whose inner results are read once (by their parent) and are not program outputs; an
operand may be the literal 0 (Python's ``sum`` starts at 0), which is dropped. It is rewritten only
when it has at least two leaves and every leaf is a result of a user fragment on the tree's mesh
(so the adds can be absorbed there); other trees are left as they are.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from jax import lax

from compiler.passes._util import refresh_outputs, rename_program
from compiler.program import (Eqn, Fragment, Lit, MeshlessOp, Op, Program, fresh, producers,
                              users)

ACC_PRIMS = ("add", "add_any")
INIT_PART = "init"


def _is_zero(a: object) -> bool:
    return isinstance(a, Lit) and a.value == 0


def _acc_eqn(p: Program, op: Op) -> Eqn | None:
    """The single add of an accumulation node, or None."""
    if not (isinstance(op, Fragment) and not op.is_user and op.part != INIT_PART
            and len(op.body) == 1 and len(op.outputs) == 1):
        return None
    e = op.body[0]
    if e.prim.name not in ACC_PRIMS or len(e.inputs) != 2 or len(e.outputs) != 1:
        return None
    names = [a for a in e.inputs if isinstance(a, str)]
    if not names or any(not isinstance(a, str) and not _is_zero(a) for a in e.inputs):
        return None
    t = p.types[e.outputs[0]]
    if any(p.types[a] != t for a in names):
        return None
    return e


def fold_zero_adds(p: Program) -> Program:
    """Drop ``y = add 0, x`` (``add_any`` too; a meshless op or an inferred one-equation fragment,
    ``x`` and ``y`` of one type) and read ``x`` for ``y``.

    Python's ``sum`` starts from 0, so the first microbatch's loss gets such an add; absorbed into
    that microbatch's fragment it would give it a body of its own. Run before ``absorb``."""
    alias: dict[str, str] = {}
    ops: list[Op] = []
    for op in p.ops:
        e = op.eqn if isinstance(op, MeshlessOp) else (
            op.body[0] if isinstance(op, Fragment) and not op.is_user and len(op.body) == 1
            and len(op.outputs) == 1 else None)
        if (e is not None and e.prim.name in ACC_PRIMS and len(e.inputs) == 2
                and len(e.outputs) == 1 and sum(map(_is_zero, e.inputs)) == 1):
            (x,) = [a for a in e.inputs if not _is_zero(a)]
            if isinstance(x, str) and p.types[x] == p.types[e.outputs[0]]:
                alias[e.outputs[0]] = alias.get(x, x)
                continue
        ops.append(op)
    if not alias:
        return p
    return refresh_outputs(rename_program(p, ops, alias))


def _scale_eqn(p: Program, op: Op, v: str) -> Eqn | None:
    """``op`` as the one equation ``y = div v, c`` / ``mul v, c`` / ``mul c, v`` (``c`` a literal)."""
    if not (isinstance(op, Fragment) and not op.is_user and len(op.body) == 1
            and len(op.outputs) == 1 and op.inputs == (v,)):
        return None
    e = op.body[0]
    if len(e.inputs) != 2 or len(e.outputs) != 1 or p.types[e.outputs[0]] != p.types[v]:
        return None
    if e.prim.name == "div" and e.inputs[0] == v and isinstance(e.inputs[1], Lit):
        return e
    if e.prim.name == "mul" and v in e.inputs and any(isinstance(a, Lit) for a in e.inputs):
        return e
    return None


def zero_init_eqn(out: str, shape: tuple[int, ...], dtype: str) -> Eqn:
    """``out = broadcast_in_dim 0`` of ``shape``/``dtype`` (a zeroed accumulator)."""
    zero = Lit(np.zeros((), dtype).item(), dtype)
    return Eqn(lax.broadcast_in_dim_p, {"shape": tuple(shape), "broadcast_dimensions": (),
                                        "sharding": None}, (zero,), (out,))


def accumulate_uniformly(p: Program) -> Program:
    """Rewrite accumulation trees (see the module docstring); returns ``p`` when there are none."""
    prod = producers(p)
    use = users(p)
    n_uses = {v: len(ix) for v, ix in use.items()}
    for v in p.outputs:
        n_uses[v] = n_uses.get(v, 0) + 1
    acc = {i: e for i, op in enumerate(p.ops) for e in [_acc_eqn(p, op)] if e is not None}

    def inner(v: str, parent: int) -> bool:
        i = prod.get(v)
        return (i in acc and n_uses.get(v, 0) == 1 and p.ops[i].mesh == p.ops[parent].mesh
                and acc[i].prim is acc[parent].prim)

    parent_of = {prod[a]: i for i, e in acc.items() for a in e.inputs
                 if isinstance(a, str) and inner(a, i)}
    trees: list[tuple] = []  # (root, nodes, leaves, scale: (op index, eqn) | None)
    for root in sorted(i for i in acc if i not in parent_of):
        nodes, leaves, stack = [], [], [root]
        while stack:
            i = stack.pop()
            nodes.append(i)
            for a in reversed(acc[i].inputs):
                if not isinstance(a, str):
                    continue
                if inner(a, i):
                    stack.append(prod[a])
                else:
                    leaves.append(a)
        mesh = p.ops[root].mesh
        ok = len(leaves) >= 2 and len(set(leaves)) == len(leaves) and all(
            v in prod and isinstance(p.ops[prod[v]], Fragment) and p.ops[prod[v]].is_user
            and p.ops[prod[v]].mesh == mesh for v in leaves)
        if ok:
            scale = None
            out = acc[root].outputs[0]
            if n_uses.get(out, 0) == 1 and len(use.get(out, ())) == 1:
                j = use[out][0]
                e = _scale_eqn(p, p.ops[j], out)
                if e is not None and p.ops[j].mesh == mesh:
                    scale = (j, e)
            trees.append((root, nodes, leaves, scale))
    if not trees:
        return p
    types = dict(p.types)
    drop: set[int] = set()
    extra_body: dict[int, list[Eqn]] = {}
    extra_in: dict[int, list[str]] = {}
    init: dict[str, list[Eqn]] = {}
    for root, nodes, leaves, scale in trees:
        drop.update(nodes)
        e_root = acc[root]
        out = e_root.outputs[0]
        if scale is not None:
            drop.add(scale[0])
            out = scale[1].outputs[0]
        t = types[out]
        pos = {v: (prod[v], p.ops[prod[v]].outputs.index(v)) for v in leaves}
        leaves = sorted(leaves, key=pos.__getitem__)
        cur = fresh("acc")
        types[cur] = t
        init.setdefault(p.ops[root].mesh, []).append(zero_init_eqn(cur, t.shape, t.dtype))
        for k, v in enumerate(leaves):
            nxt = out if k == len(leaves) - 1 else fresh("acc")
            types[nxt] = t
            f = prod[v]
            body = extra_body.setdefault(f, [])
            if cur not in {o for e in body for o in e.outputs}:
                extra_in.setdefault(f, []).append(cur)
            if scale is not None:
                term = fresh("term")
                types[term] = t
                e_s = scale[1]
                body.append(replace(e_s, inputs=tuple(v if a == e_root.outputs[0] else a
                                                      for a in e_s.inputs), outputs=(term,)))
                v = term
            body.append(replace(e_root, inputs=(cur, v), outputs=(nxt,)))
            cur = nxt
    ops: list[Op] = [Fragment(m, (), (), tuple(e.outputs[0] for e in body), tuple(body),
                              part=INIT_PART) for m, body in init.items()]
    for i, op in enumerate(p.ops):
        if i in drop:
            continue
        if i in extra_body:
            op = replace(op, inputs=op.inputs + tuple(v for v in extra_in.get(i, ())
                                                      if v not in op.inputs),
                         body=op.body + tuple(extra_body[i]))
        ops.append(op)
    return refresh_outputs(p.with_ops(ops, types=types))
