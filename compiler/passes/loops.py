"""Loop unrolling: ``-mpmd-unroll-for-loops`` and ``-mpmd-from-unroll-to-call-counter``.

- :func:`unroll_for_loops`: every :class:`~compiler.calls.ForLoop` (a ``scan`` or static
  ``fori_loop`` whose body calls named computations) becomes ``length`` calls of its body, each
  with ``unroll_counter`` = its iteration (the slice of ``xs`` it reads). Operands: the consts, the
  carry (the loop's initial carry, then the previous call's results) and ``xs[k]`` (``xs[k]`` as
  ``jnp`` indexes it: ``slice`` + ``squeeze``; when ``xs`` is the stacked ``ys`` of a loop unrolled
  before, the k-th call result itself, so a backward scan reads each forward iteration's residuals
  directly; a loop of transposes only reuses the slices of the forward loop before it, as a Python
loop's backward reads the forward's ``ws[k]``). A carry that counts iterations (initial integer literal ``a``, next value ``c + 1``,
  what ``fori_loop`` carries) is passed as the literal ``a + s`` at step ``s``. After the calls,
  each ``ys`` is stacked (``jnp.stack``) and later reads of the final carry read the last call's
  results. Loops nested in a body are unrolled inside it. Mesh inference drops unused stacks.
- :func:`from_unroll_to_call_counter`: a call's unroll counter becomes its call counter (the
  microbatch index its named computations get when inlined) or, when the config assigns the
  iterations of its named computations one by one (``"layer[2]"`` placed), its ``index``: inlining
  then names them ``"layer[k]"``, so a scan over layers is split across meshes as assigned.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from compiler.calls import CallOp, ForLoop, Func, substitute, walk_named
from compiler.errors import CompilerError
from compiler.program import (CONSTANT, Atom, Eqn, Lit, MeshlessOp, Program, TensorType,
                              fresh)


def _spliced(fn: Callable[..., Any], args: Sequence[str], out: str | None,
             types: dict[str, TensorType]) -> tuple[list[MeshlessOp], str]:
    """The equations ``jax.make_jaxpr(fn)`` gives on ``args``' types, over fresh names (the
    result named ``out`` when given), as meshless ops; and the result's name."""
    specs = [jax.ShapeDtypeStruct(types[a].shape, np.dtype(types[a].dtype)) for a in args]
    closed = jax.make_jaxpr(fn)(*specs)
    env: dict[Any, Atom] = dict(zip(closed.jaxpr.invars, args))
    ops: list[MeshlessOp] = []
    for v, c in zip(closed.jaxpr.constvars, closed.consts):
        env[v] = fresh("c")
        types[env[v]] = TensorType(tuple(np.shape(c)), str(np.dtype(c.dtype)))
        ops.append(MeshlessOp(Eqn(CONSTANT, {"value": np.asarray(c)}, (), (env[v],))))
    last = closed.jaxpr.outvars[0]
    for e in closed.jaxpr.eqns:
        ins = tuple(Lit(np.asarray(a.val).item(), str(np.dtype(a.aval.dtype)))
                    if type(a).__name__ == "Literal" else env[a] for a in e.invars)
        outs = []
        for v in e.outvars:
            n = out if (v is last and out is not None) else fresh("u")
            env[v] = n
            types[n] = TensorType(tuple(int(d) for d in v.aval.shape), str(np.dtype(v.aval.dtype)))
            outs.append(n)
        ops.append(MeshlessOp(Eqn(e.primitive, dict(e.params), ins, tuple(outs),
                                  getattr(e, "ctx", None))))
    return ops, env[last]  # type: ignore[return-value]


def _induction(loop: ForLoop, j: int) -> int | None:
    """The initial value of carry ``j`` if it counts iterations (``c -> c + 1``), else None."""
    init = loop.operands[loop.num_consts + j]
    if not (isinstance(init, Lit) and np.issubdtype(np.dtype(init.dtype), np.integer)):
        return None
    f = loop.body
    param, res = f.params[loop.num_consts + j], f.results[j]
    for op in f.ops:
        if isinstance(op, MeshlessOp) and op.outputs == (res,) and op.eqn.prim.name == "add":
            ins = op.eqn.inputs
            if set(map(str, ins)) == {param, str(Lit(1, init.dtype))} and param in ins:
                return int(init.value)
    return None


def _const(value: Any, dtype: str, types: dict[str, TensorType]) -> tuple[MeshlessOp, str]:
    n = fresh("k")
    types[n] = TensorType((), dtype)
    return MeshlessOp(Eqn(CONSTANT, {"value": np.asarray(value, dtype)}, (), (n,))), n


def _unroll_ops(ops: Sequence[Any], types: dict[str, TensorType], done: dict[str, Func],
                out_names: Sequence[str]) -> tuple[list[Any], dict[str, Atom]]:
    """Unroll the ForLoops of ``ops``; returns the ops and the renaming of loop results."""
    alias: dict[str, Atom] = {}
    stacks: dict[str, list[Atom]] = {}
    slices: dict[tuple[str, int], str] = {}
    res: list[Any] = []
    for op in ops:
        op = substitute(op, alias) if alias else op
        if isinstance(op, CallOp):
            op = replace(op, callee=_unrolled(op.callee, types, done))
        if not isinstance(op, ForLoop):
            res.append(op)
            continue
        body = _unrolled(op.body, types, done)
        nc, nk, n = op.num_consts, op.num_carry, op.length
        consts = list(op.operands[:nc])
        carry = list(op.operands[nc:nc + nk])
        xs = op.operands[nc + nk:]
        ind = {j: _induction(op, j) for j in range(nk)}
        # a forward loop slices xs afresh (as each ``ws[k]`` of a Python loop does); a loop of
        # transposes only (a scan's backward) reads the slices of the forward loop before it
        forward = any(nc_.transpose == 0 for nc_ in walk_named(body.ops))
        ys: list[list[Atom]] = [[None] * n for _ in range(len(op.outputs) - nk)]  # type: ignore
        for s in range(n):
            k = n - 1 - s if op.reverse else s
            xk: list[Atom] = []
            for x in xs:
                if isinstance(x, str) and x in stacks:
                    xk.append(stacks[x][k])
                elif (x, k) in slices and not forward:
                    xk.append(slices[(x, k)])
                else:
                    if not isinstance(x, str):
                        raise CompilerError(f"loop {op.name}: scanned operand {x} is a literal; "
                                            f"scan over arrays")
                    more, name = _spliced(lambda a, k=k: a[k], [x], None, types)
                    res.extend(more)
                    slices[(x, k)] = name
                    xk.append(name)
            for j, a in ind.items():
                if a is not None:
                    carry[j] = Lit(a + s, op.operands[nc + j].dtype)  # type: ignore[union-attr]
            outs = tuple(fresh("r") for _ in body.results)
            for o, r in zip(outs, body.results):
                types[o] = types[r]
            res.append(CallOp(body, tuple(consts + carry + xk), outs, unroll_counter=k))
            carry = list(outs[:nk])
            for j, y in enumerate(outs[nk:]):
                ys[j][k] = y
        for j, (v, a) in enumerate(zip(op.outputs[:nk], carry)):
            if ind[j] is not None:
                a = Lit(ind[j] + n, op.operands[nc + j].dtype)  # type: ignore[operator,union-attr]
            alias[v] = a
        for v, elems in zip(op.outputs[nk:], ys):
            stacks[v] = elems
            more, _ = _spliced(lambda *a: jnp.stack(a), elems, v, types)
            res.extend(more)
    # loop results that the enclosing block returns as literals need a defining op
    for v in out_names:
        if isinstance(alias.get(v), Lit):
            lit = alias[v]
            c, name = _const(lit.value, lit.dtype, types)  # type: ignore[union-attr]
            res.append(c)
            alias[v] = name
    return res, alias


def _unrolled(f: Func, types: dict[str, TensorType], done: dict[str, Func]) -> Func:
    if f.name not in done:
        ops, alias = _unroll_ops(f.ops, types, done, f.results)
        done[f.name] = replace(f, ops=tuple(ops),
                               results=tuple(alias.get(v, v) for v in f.results))  # type: ignore
    return done[f.name]


def unroll_for_loops(p: Program) -> Program:
    """Unroll every ForLoop into calls (see the module docstring); ``p`` itself if it has none."""
    if not any(isinstance(op, (ForLoop, CallOp)) for op in p.ops):
        return p
    types = dict(p.types)
    ops, alias = _unroll_ops(p.ops, types, {}, p.outputs)
    return replace(p, ops=tuple(ops), outputs=tuple(alias.get(v, v) for v in p.outputs),
                   types=types)  # type: ignore[arg-type]


Placer = Callable[[str], Any]


def _counters(op: CallOp, place: Placer | None) -> CallOp:
    callee = replace(op.callee, ops=tuple(_counters(o, place) if isinstance(o, CallOp) else o
                                          for o in op.callee.ops))
    op = replace(op, callee=callee)
    k = op.unroll_counter
    if k is None:
        return op
    names = sorted(_unindexed_names(callee.ops))
    indexed = [n for n in names if place is not None and place(f"{n}[{k}]") is not None]
    if not indexed:
        return replace(op, unroll_counter=None, call_counter=k)
    if len(indexed) != len(names):
        miss = next(n for n in names if n not in indexed)
        raise CompilerError(f"named computation {miss!r} shares a loop with {indexed[0]!r}, whose "
                            f"iterations are assigned one by one ({indexed[0]}[{k}]), but "
                            f"'{miss}[{k}]' is not assigned; assign every iteration of both")
    return replace(op, unroll_counter=None, index=k)


def _unindexed_names(ops: Sequence[Any]) -> set[str]:
    """Names of the named computations in ``ops`` not inside a call that already indexes them
    (an inner loop over layers)."""
    out: set[str] = set()
    for op in ops:
        if isinstance(op, CallOp) and op.index is None:
            out |= _unindexed_names(op.callee.ops)
        elif not isinstance(op, CallOp):
            out |= {n.name for n in walk_named([op])}
    return out


def from_unroll_to_call_counter(p: Program, place: Placer | None = None) -> Program:
    """Turn every call's unroll counter into its call counter or layer index (module docstring).

    Args:
        place: ``MpmdConfig.place`` (name -> (mesh, stage) or None); None: always call counters.

    Raises:
        CompilerError: a loop body mixes named computations assigned per iteration and not.
    """
    if not any(isinstance(op, CallOp) for op in p.ops):
        return p
    return p.with_ops(_counters(op, place) if isinstance(op, CallOp) else op for op in p.ops)

