"""Call passes: ``-mpmd-erase-unused-callee-block-arguments``, ``-mpmd-sink-negligible-ops-into-call-op``,
``-mpmd-call-inline``.

- :func:`erase_unused_callee_block_arguments`: a callee parameter no op of the callee reads (unused,
  or only returned) is erased from the callee and from every call of it; a result that returned
  it is erased too, and the call's result there is replaced by the call's operand (a carry the
  loop passes through unchanged, e.g. weights carried by a ``fori_loop``).
- :func:`sink_negligible_ops_into_call_op`: an op without value operands and with one result (a
  constant, a broadcast of a literal), or a literal, that is the same operand of every call of a
  callee is cloned into the callee (the parameter becomes its result there) and the operand
  erased; the op leaves the caller when nothing else reads it.
- :func:`call_inline`: every call is replaced by a copy of its callee's ops over fresh names, with
  the call's attributes copied onto the named computations it inlines (``call_counter``; with
  ``index`` k, the name ``"name[k]"``). Literal operands are substituted into the copy, and what
  they make constant is folded (MLIR's canonicalizer does this after inlining): a scalar op whose
  operands are all literals becomes a literal, a ``convert_element_type`` to the dtype its operand
  already has is dropped. So a ``fori_loop``'s counter becomes the literal ``k`` in iteration k.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from compiler.calls import CallOp, Func, func_uses, substitute
from compiler.program import (CONSTANT, Atom, Eqn, Lit, MeshlessOp, NamedComputation, Program,
                              TensorType, eval_body, fresh)
import numpy as np


def _calls(p: Program) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for i, op in enumerate(p.ops):
        if isinstance(op, CallOp):
            out.setdefault(op.callee.name, []).append(i)
    return out


def _finish(p: Program, ops: list[Any], alias: dict[str, Atom], types: dict) -> Program:
    """Apply ``alias`` (name -> atom) to ``ops`` and the outputs; literal outputs get constants."""
    ops = [substitute(op, alias) if alias else op for op in ops]
    outputs = []
    for v in p.outputs:
        a = alias.get(v, v)
        if isinstance(a, Lit):
            n = fresh("k")
            types[n] = TensorType((), a.dtype)
            ops.append(MeshlessOp(Eqn(CONSTANT, {"value": _array(a)}, (), (n,))))
            a = n
        outputs.append(a)
    return replace(p, ops=tuple(ops), outputs=tuple(outputs), types=types)


def _array(a: Lit) -> Any:
    return np.asarray(a.value, a.dtype)


def _resolve(alias: dict[str, Atom], a: Atom) -> Atom:
    while isinstance(a, str) and a in alias:
        a = alias[a]
    return a


# --------------------------------------------------------------------------- erase unused arguments


def erase_unused_callee_block_arguments(p: Program) -> Program:
    """Erase callee parameters no op reads (see the module docstring)."""
    calls = _calls(p)
    if not calls:
        return p
    ops = list(p.ops)
    alias: dict[str, Atom] = {}
    for name, idx in calls.items():
        f: Func = ops[idx[0]].callee
        used = func_uses(f)
        drop = [i for i, v in enumerate(f.params) if v not in used]
        if not drop:
            continue
        dropped = {f.params[i] for i in drop}
        drop_res = [r for r, v in enumerate(f.results) if v in dropped]
        new_f = replace(f, params=tuple(v for i, v in enumerate(f.params) if i not in drop),
                        results=tuple(v for r, v in enumerate(f.results) if r not in drop_res))
        for i in idx:
            c = ops[i]
            for r in drop_res:
                alias[c.outputs[r]] = c.operands[f.params.index(f.results[r])]
            ops[i] = replace(c, callee=new_f,
                             operands=tuple(a for k, a in enumerate(c.operands) if k not in drop),
                             outputs=tuple(o for r, o in enumerate(c.outputs) if r not in drop_res))
    alias = {k: _resolve(alias, v) for k, v in alias.items()}
    return _finish(p, ops, alias, dict(p.types))


# --------------------------------------------------------------------------- sink negligible ops


def _negligible(op: Any) -> bool:
    return isinstance(op, MeshlessOp) and len(op.outputs) == 1 and not op.inputs and \
        not getattr(op.eqn.prim, "multiple_results", False)


def sink_negligible_ops_into_call_op(p: Program) -> Program:
    """Clone operand-free single-result ops shared by all calls of a callee into it."""
    calls = _calls(p)
    if not calls:
        return p
    defs = {op.outputs[0]: i for i, op in enumerate(p.ops) if _negligible(op)}
    ops = list(p.ops)
    for name, idx in calls.items():
        f: Func = ops[idx[0]].callee
        sink: dict[int, Atom] = {}
        for k in range(len(f.params)):
            vals = {ops[i].operands[k] for i in idx}
            if len(vals) == 1:
                a = next(iter(vals))
                if isinstance(a, Lit) or a in defs:
                    sink[k] = a
        if not sink:
            continue
        head: list[Any] = []
        lits: dict[str, Atom] = {}
        for k, a in sink.items():
            if isinstance(a, Lit):
                lits[f.params[k]] = a
            else:
                e = p.ops[defs[a]].eqn
                head.append(MeshlessOp(replace(e, outputs=(f.params[k],))))
        body = [substitute(op, lits) for op in f.ops]
        new_f = replace(f, params=tuple(v for k, v in enumerate(f.params) if k not in sink),
                        ops=tuple(head + body),
                        results=tuple(v for v in f.results))
        for i in idx:
            c = ops[i]
            ops[i] = replace(c, callee=new_f,
                             operands=tuple(a for k, a in enumerate(c.operands) if k not in sink))
    read = {v for op in ops for v in op.inputs} | set(p.outputs)
    ops = [op for op in ops if not (_negligible(op) and op.outputs[0] not in read)]
    return p.with_ops(ops)


# --------------------------------------------------------------------------- inline


def _fold(e: Eqn, types: dict[str, TensorType]) -> Atom | None:
    """The literal or name ``e``'s single result equals, when it folds (module docstring)."""
    if len(e.outputs) != 1 or e.prim is CONSTANT:
        return None
    if e.prim.name == "convert_element_type" and len(e.inputs) == 1 and \
            isinstance(e.inputs[0], str) and \
            types[e.inputs[0]].dtype == str(e.params.get("new_dtype")) and \
            types[e.inputs[0]] == types[e.outputs[0]]:
        return e.inputs[0]
    if e.inputs and all(isinstance(a, Lit) for a in e.inputs) and \
            types[e.outputs[0]].shape == () and not getattr(e.prim, "multiple_results", False):
        (val,) = eval_body((e,), (), e.outputs, ())
        return Lit(val.item(), types[e.outputs[0]].dtype)
    return None


def _inline(call: CallOp, types: dict[str, TensorType]) -> tuple[list[Any], list[Atom]]:
    f = call.callee
    env: dict[str, Atom] = dict(zip(f.params, call.operands))
    out: list[Any] = []

    def new(v: str) -> str:
        n = fresh("i")
        types[n] = types[v]
        env[v] = n
        return n

    for op in f.ops:
        if isinstance(op, CallOp):
            op = substitute(op, env)
            inner, results = _inline(op, types)
            for sub in inner:
                out.append(_attrs(sub, call))
            for v, a in zip(op.outputs, results):
                env[v] = a
            continue
        named_inputs = bool(op.inputs)
        op = substitute(op, env)
        if isinstance(op, MeshlessOp):
            e = op.eqn
            # fold only what substituted literals made constant (literal-only code the user
            # wrote stays as written, as in the unrolled Python loop)
            folded = _fold(e, types) if named_inputs else None
            if folded is not None:
                env[e.outputs[0]] = folded
                continue
            out.append(MeshlessOp(replace(e, outputs=tuple(new(o) for o in e.outputs))))
        elif isinstance(op, NamedComputation):
            loc: dict[str, Atom] = {}
            body = []
            for e in op.body:
                e = replace(e, inputs=tuple(loc.get(a, a) if isinstance(a, str) else a
                                            for a in e.inputs))
                outs = tuple(new(o) for o in e.outputs)
                loc.update(zip(e.outputs, outs))
                body.append(replace(e, outputs=outs))
            out.append(_attrs(replace(op, body=tuple(body),
                                      outputs=tuple(env[o] for o in op.outputs)), call))
        else:
            raise TypeError(f"call_inline: unexpected op {type(op).__name__} in a callee")
    return out, [env.get(v, v) for v in f.results]


def _attrs(op: Any, call: CallOp) -> Any:
    if not isinstance(op, NamedComputation):
        return op
    if call.index is not None:
        op = replace(op, name=f"{op.name}[{call.index}]")
    if call.call_counter is not None and op.call_counter is None:
        op = replace(op, call_counter=call.call_counter)
    return op


def call_inline(p: Program) -> Program:
    """Inline every call (see the module docstring); ``p`` itself if it has none."""
    if not any(isinstance(op, CallOp) for op in p.ops):
        return p
    types = dict(p.types)
    alias: dict[str, Atom] = {}
    ops: list[Any] = []
    for op in p.ops:
        op = substitute(op, alias) if alias else op
        if isinstance(op, CallOp):
            inner, results = _inline(op, types)
            ops.extend(inner)
            alias.update(zip(op.outputs, results))
        else:
            ops.append(op)
    return _finish(p, ops, {v: alias[v] for v in p.outputs if v in alias}, types)
