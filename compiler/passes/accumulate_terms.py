"""Inferred terms of a microbatch sum, added after it: ``separate_inferred_terms``.

A gradient summed over microbatches can have a term that no microbatch computes: an L2 penalty
``lam * sum(w ** 2)`` added to the loss outside the named pieces gives the weight's gradient one
more leaf, ``2 * lam * w``, in the ``add_any`` tree that ``jax.grad`` builds over the
microbatches' gradients. Left in the tree, ``absorb`` merges that leaf's add into one microbatch's
backward fragment, which then has a body of its own (one more executable per mesh), and the
tree is no longer one ``accumulate`` can rewrite (``passes/accumulate.py``: every leaf must be a
user fragment's result).

This pass reassociates such a tree: the microbatch terms (the leaves that user fragments on the
tree's mesh produce) are summed first, in a chain of the tree's own primitive, and the other
leaves are added to that sum afterwards with the *other* of ``add`` / ``add_any`` (equal on
arrays), so the microbatch sum is a tree of its own that ``accumulate`` rewrites, and the final
adds stay inferred work that ``merge_inferred`` puts with the update. The root keeps its name.

A tree is as in ``passes/accumulate.py`` (inferred one-equation ``add``/``add_any`` fragments on
one mesh, inner results read once); it is rewritten when it has at least two microbatch leaves and
at least one other leaf, all distinct. Runs on meshes, before ``absorb``. Results equal the
original up to float rounding (the order of the sum changes).
"""

from __future__ import annotations

from jax import lax
from jax.extend.core.primitives import add_jaxvals_p  # add_any

from compiler.passes._util import refresh_outputs
from compiler.passes.accumulate import _acc_eqn
from compiler.program import Eqn, Fragment, Op, Program, fresh, producers, users


def separate_inferred_terms(p: Program) -> Program:
    """Sum the microbatch leaves of each accumulation tree first (see the module docstring);
    returns ``p`` when no tree has an inferred term."""
    acc = {i: e for i, op in enumerate(p.ops) for e in [_acc_eqn(p, op)] if e is not None}
    if not acc:
        return p
    prod = producers(p)
    n_uses = {v: len(ix) for v, ix in users(p).items()}
    for v in p.outputs:
        n_uses[v] = n_uses.get(v, 0) + 1

    def inner(v: str, parent: int) -> bool:
        i = prod.get(v)
        return (i in acc and n_uses.get(v, 0) == 1 and p.ops[i].mesh == p.ops[parent].mesh
                and acc[i].prim is acc[parent].prim)

    parent_of = {prod[a]: i for i, e in acc.items() for a in e.inputs
                 if isinstance(a, str) and inner(a, i)}
    types = dict(p.types)
    drop: set[int] = set()
    new_at: dict[int, list[Op]] = {}
    for root in sorted(i for i in acc if i not in parent_of):
        nodes, leaves, stack = [], [], [root]
        while stack:
            i = stack.pop()
            nodes.append(i)
            for a in reversed(acc[i].inputs):
                if isinstance(a, str):
                    (stack.append(prod[a]) if inner(a, i) else leaves.append(a))
        mesh = p.ops[root].mesh
        mb = [v for v in leaves if v in prod and isinstance(p.ops[prod[v]], Fragment)
              and p.ops[prod[v]].is_user and p.ops[prod[v]].mesh == mesh]
        other = [v for v in leaves if v not in mb]
        if len(mb) < 2 or not other or len(set(leaves)) != len(leaves):
            continue
        prim = acc[root].prim
        out = acc[root].outputs[0]
        t = types[out]
        ops: list[Op] = []
        cur = mb[0]
        for k, v in enumerate(mb[1:] + other):
            nxt = out if k == len(mb) + len(other) - 2 else fresh("sum")
            types[nxt] = t
            pr = prim if k < len(mb) - 1 else (lax.add_p if prim.name == "add_any"
                                               else add_jaxvals_p)
            ops.append(Fragment(mesh, (), (cur, v), (nxt,), (Eqn(pr, {}, (cur, v), (nxt,)),)))
            cur = nxt
        drop.update(nodes)
        new_at[root] = ops
    if not new_at:
        return p
    res: list[Op] = []
    for i, op in enumerate(p.ops):
        res.extend(new_at.get(i, ()))
        if i not in drop:
            res.append(op)
    return refresh_outputs(p.with_ops(res, types=types))
