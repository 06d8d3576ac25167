"""Loops and calls in the Program IR: ``ForLoop`` (``mpmd.for``), ``CallOp`` (``mpmd.call``), ``Func``.

The frontend turns a ``jax.lax.scan`` (``fori_loop`` with static bounds lowers to one) whose body
calls named computations into a :class:`ForLoop`; ``passes/loops.py`` unrolls it into one
:class:`CallOp` per iteration (``unroll_counter`` = the iteration), turns unroll counters into call
counters, and ``passes/calls.py`` inlines the calls. All three exist only before mesh assignment:
after ``call_inline`` a program holds none of them.

Scan semantics (as ``jax.lax.scan_p``): operands are ``consts + carry + xs`` (``num_consts``,
``num_carry``); iteration ``k`` (``length - 1 - k``-th step when ``reverse``) binds the body's
parameters to the consts, the current carry and ``xs[k]`` (the k-th slice along axis 0), and its
results are the next carry and ``ys[k]``; the loop's results are the final carry, then every ``ys``
stacked along a new axis 0.

Printed form (:func:`op_lines`, used by ``compiler.program.print_program``)::

    %3:2 = for<length=4, num_consts=1, num_carry=1> (%arg0, %2, %arg1) (%a0: f32[8], ...) {
      %b0 = named_computation<"layer"> ...
      return %b0, %b0
    } : (...) -> (...)
    %4:2 = call @body<unroll_counter=0> (%arg0, 0:i32, %x) : ...
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from compiler.program import Atom, Eqn, MeshlessOp, NamedComputation, TensorType


@dataclass(frozen=True, slots=True)
class Func:
    """A callee: block parameters, ops (NamedComputation, MeshlessOp, ForLoop, CallOp), results.

    ``name`` identifies the function: all calls of one unrolled loop share it, and passes that
    change a callee change it for every call (``erase_unused_callee_block_arguments``).
    ``results`` may name parameters (a carry passed through unchanged).
    """

    name: str
    params: tuple[str, ...]
    ops: tuple[Any, ...]
    results: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ForLoop:
    """A scan whose body calls named computations (see the module docstring).

    Attributes:
        operands: ``consts + carry + xs`` (names or literals).
        outputs: final carry, then the stacked ``ys``.
        length: number of iterations. reverse: iterate from the last slice to the first.
        name: a label for errors (the scan's position in the step, e.g. ``"scan#0"``).
    """

    operands: tuple[Atom, ...]
    outputs: tuple[str, ...]
    body: Func
    length: int
    num_consts: int
    num_carry: int
    reverse: bool = False
    name: str = "scan"

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(a for a in self.operands if isinstance(a, str))

    def printed_lines(self, names: Any, res: str, types: Mapping[str, TensorType],
                      printer: Any) -> list[str]:
        """This op's lines in the printed program (:func:`op_lines`)."""
        return op_lines(self, names, res, types, printer)


@dataclass(frozen=True, slots=True)
class CallOp:
    """A call of ``callee`` (``mpmd.call``): its parameters bound to ``operands``.

    ``unroll_counter``: the loop iteration it came from (``unroll_for_loops``); ``call_counter``:
    the microbatch index it gives the named computations it calls (``from_unroll_to_call_counter``);
    ``index``: the layer index it appends to their names (``"layer"`` -> ``"layer[2]"``), for loops
    over layers whose iterations are assigned one by one.
    """

    callee: Func
    operands: tuple[Atom, ...]
    outputs: tuple[str, ...]
    unroll_counter: int | None = None
    call_counter: int | None = None
    index: int | None = None

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(a for a in self.operands if isinstance(a, str)))

    def printed_lines(self, names: Any, res: str, types: Mapping[str, TensorType],
                      printer: Any) -> list[str]:
        """This op's lines in the printed program (:func:`op_lines`)."""
        return op_lines(self, names, res, types, printer)


def op_reads(op: Any) -> tuple[str, ...]:
    """Names ``op`` reads (for a NamedComputation: its free inputs)."""
    return tuple(op.inputs)


def substitute(op: Any, m: Mapping[str, Atom]) -> Any:
    """``op`` with reads of names in ``m`` replaced by ``m``'s atoms (names or literals).

    A NamedComputation's free inputs that become literals leave its ``inputs``; callee bodies are
    not touched (they only read their parameters)."""
    if not any(v in m for v in op.inputs):
        return op
    if isinstance(op, MeshlessOp):
        return MeshlessOp(_eqn(op.eqn, m))
    if isinstance(op, NamedComputation):
        ins = tuple(dict.fromkeys(x for v in op.inputs for x in [m.get(v, v)] if isinstance(x, str)))
        return replace(op, inputs=ins, body=tuple(_eqn(e, m) for e in op.body))
    if isinstance(op, (ForLoop, CallOp)):
        return replace(op, operands=tuple(m.get(a, a) if isinstance(a, str) else a
                                          for a in op.operands))
    raise TypeError(f"substitute: op {type(op).__name__} does not occur before mesh assignment")


def _eqn(e: Eqn, m: Mapping[str, Atom]) -> Eqn:
    return replace(e, inputs=tuple(m.get(a, a) if isinstance(a, str) else a for a in e.inputs))


def func_uses(f: Func) -> set[str]:
    """Names read by ``f``'s ops (the terminator's reads excluded)."""
    return {v for op in f.ops for v in op_reads(op)}


def walk_named(ops: Sequence[Any]):
    """Every NamedComputation in ``ops``, through callee and loop bodies."""
    for op in ops:
        if isinstance(op, NamedComputation):
            yield op
        elif isinstance(op, ForLoop):
            yield from walk_named(op.body.ops)
        elif isinstance(op, CallOp):
            yield from walk_named(op.callee.ops)


# --------------------------------------------------------------------------- printing


def op_lines(op: Any, names: Any, res: str, types: Mapping[str, TensorType],
             printer: Any) -> list[str]:
    """Printed lines of a ForLoop or CallOp (``printer(op, names, res)`` prints nested ops)."""
    operands = ", ".join(names(a) for a in op.operands)
    in_t = ", ".join(str(types[a]) if isinstance(a, str) else str(a) for a in op.operands)
    out_t = ", ".join(str(types[v]) for v in op.outputs)
    if isinstance(op, CallOp):
        attrs = [f"{k}={getattr(op, k)}" for k in ("unroll_counter", "call_counter", "index")
                 if getattr(op, k) is not None]
        return [f"{res}call @{op.callee.name}{'<' + ', '.join(attrs) + '>' if attrs else ''} "
                f"({operands}) : ({in_t}) -> ({out_t})"]
    f = op.body
    attrs = f"length={op.length}, num_consts={op.num_consts}, num_carry={op.num_carry}"
    if op.reverse:
        attrs += ", reverse"
    head = f"{res}for @{f.name}<{attrs}> ({operands})"
    fl = func_lines(f, names, types, printer)
    return [head + " " + fl[0]] + fl[1:] + [f"}} : ({in_t}) -> ({out_t})"]


def func_lines(f: Func, names: Any, types: Mapping[str, TensorType], printer: Any) -> list[str]:
    """``(%p0: t, ...) {`` then the body ops and ``return``; names continue the caller's."""
    k = 0
    for i, v in enumerate(f.params):
        names.m[v] = f"%{f.name}.p{i}"
    lines = ["(" + ", ".join(f"{names(v)}: {types[v]}" for v in f.params) + ") {"]
    for op in f.ops:
        outs = op.outputs
        res = ""
        if outs:
            for j, v in enumerate(outs):
                names.m[v] = f"%{f.name}.{k}" + (f"#{j}" if len(outs) > 1 else "")
            res = f"%{f.name}.{k}" + (f":{len(outs)}" if len(outs) > 1 else "") + " = "
            k += 1
        lines.extend("  " + ln for ln in printer(op, names, res))
    lines.append("  return " + ", ".join(names(v) for v in f.results))
    return lines


__all__ = ["Func", "ForLoop", "CallOp", "substitute", "func_uses", "walk_named", "op_lines"]
