"""Stacked-layer slicing: ``fold_stacked_slices``, the pass that lets each mesh hold its own layers.

A ``scan`` over stacked layer weights ``ws`` (shape ``[L, ...]``) whose iterations are assigned
to meshes one by one (``"layer[k]"`` placed, ``passes/loops.py``) reads ``ws[k]`` in iteration
``k`` and returns gradients (and, with an optimizer in the step, updated weights) as one stacked
``[L, ...]`` array. Left as one array, ``ws`` sits on one mesh and is sent whole to every other
mesh, and every iteration's gradient travels back to the mesh of the stacked result (one
transfer per layer, microbatch and leaf).

The frontend (``compiler/frontend.py``, ``_split_stacked``) splits such a program input at the
stage boundaries: the program takes one input per run of consecutive iterations on one mesh
(``ws[a:b]``, placed on that mesh) and rebuilds ``ws`` as ``concatenate`` of the chunks; each
program output of the same shape and dtype (the gradient, the update) is returned as the same
chunks, ``y[a:b]``, placed on the chunk's mesh (the compiled callable reassembles them).

This pass then folds the slices through that structure, so nothing crosses a stage boundary that
the unrolled program would not move. For a dim-0 ``slice`` ``v[a:b]``:

- ``v = concatenate(parts, dimension=0)`` (the split input): the parts overlapping ``[a, b)``,
  sliced (one part: that part itself; several: their ``concatenate``);
- ``v = stack(ys, axis=0)`` (a loop's per-iteration results, ``passes/loops.py``):
  ``stack(ys[a:b])``;
- ``v = f(x1, ..., xn)`` with ``f`` elementwise (:data:`ELEMENTWISE`) and ``v`` derived from a
  dim-0 ``concatenate`` through elementwise ops: ``f(x1[a:b], ..., xn[a:b])`` (literals as they
  are); an operand ``broadcast_in_dim`` that does not map onto dim 0 is rebuilt at ``b - a`` rows;
- anything else: the slice as it was.

Each layer of a split chunk is then read once: a ``slice``/``squeeze`` chain from a chunk equal to
an earlier one (each loop over the layers, one per microbatch, slices them afresh) reads the
earlier result, so every microbatch's fragments keep one body (one executable, not one per
microbatch). Ops left unused by the folding (the whole-array ``concatenate`` and elementwise ops) are dropped.
The result computes the same values (only slices are moved), so ``jax.jit`` equality holds exactly.
Runs before mesh assignment, on a loop-free program (after ``unroll``); a program without a dim-0
``concatenate`` or axis-0 ``stack`` is returned unchanged.

Shapes: every rewritten value keeps its dtype and its shape but for dim 0 (``b - a``).
Raises nothing (a slice it cannot fold stays as written).
"""

from __future__ import annotations

from typing import Any

from jax import lax

from compiler.passes._util import rename_program
from compiler.program import Atom, Eqn, Lit, MeshlessOp, Program, TensorType, fresh

ELEMENTWISE = frozenset({
    "add", "add_any", "sub", "mul", "div", "neg", "max", "min", "pow", "integer_pow", "sqrt",
    "rsqrt", "exp", "log", "tanh", "logistic", "abs", "sign", "square", "convert_element_type",
    "select_n", "sin", "cos", "clamp", "rem", "exp2", "log1p", "expm1", "copy", "copy_p", "erf",
    "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "is_finite", "stop_gradient"})
"""Primitives whose result row ``i`` depends only on row ``i`` of same-shaped operands."""


def _prim(op: Any) -> str:
    return getattr(op.eqn.prim, "name", "") if isinstance(op, MeshlessOp) else ""


def dim0_slice(e: Eqn, shape: tuple[int, ...]) -> tuple[int, int] | None:
    """``(a, b)`` if ``e`` is ``slice`` of an operand of ``shape`` along dim 0 only, else None."""
    if getattr(e.prim, "name", "") != "slice" or e.params.get("strides") not in (None, (1,) * len(shape)):
        return None
    start, limit = tuple(e.params["start_indices"]), tuple(e.params["limit_indices"])
    if not shape or start[1:] != (0,) * (len(shape) - 1) or limit[1:] != tuple(shape[1:]):
        return None
    return int(start[0]), int(limit[0])


def _is_stack(op: Any) -> bool:
    """``op`` is a dim-0 ``concatenate`` or an axis-0 ``stack`` (``jnp.stack`` of a loop's ys)."""
    name = _prim(op)
    return (name == "concatenate" and op.eqn.params.get("dimension") == 0) or \
        (name == "stack" and op.eqn.params.get("axis") == 0)


class _Folder:
    def __init__(self, p: Program) -> None:
        self.p = p
        self.types: dict[str, TensorType] = dict(p.types)
        self.defs: dict[str, MeshlessOp] = {v: op for op in p.ops if isinstance(op, MeshlessOp)
                                            for v in op.outputs}
        self.stacked: set[str] = set()
        for op in p.ops:
            name = _prim(op)
            if _is_stack(op):
                self.stacked.add(op.outputs[0])
            elif name in ELEMENTWISE and len(op.outputs) == 1 and self._rowwise(op) and \
                    any(a in self.stacked for a in op.inputs):
                self.stacked.add(op.outputs[0])
        self.memo: dict[tuple[str, int, int], str] = {}
        self.emitted: list[MeshlessOp] = []

    def _rowwise(self, op: MeshlessOp) -> bool:
        shape = self.types[op.outputs[0]].shape
        return bool(shape) and all(self.types[a].shape == shape for a in op.inputs)

    def _emit(self, prim: Any, params: dict[str, Any], ins: tuple[Atom, ...],
              t: TensorType) -> str:
        out = fresh("s")
        self.types[out] = t
        self.emitted.append(MeshlessOp(Eqn(prim, params, ins, (out,))))
        return out

    def sliced(self, v: str, a: int, b: int) -> str:
        """A value equal to ``v[a:b]`` (dim 0), emitting the ops it needs."""
        t = self.types[v]
        if (a, b) == (0, t.shape[0]):
            return v
        key = (v, a, b)
        if key in self.memo:
            return self.memo[key]
        rt = TensorType((b - a,) + t.shape[1:], t.dtype)
        op = self.defs.get(v)
        name = _prim(op) if op is not None else ""
        if v in self.stacked and name == "stack":
            out = self._emit(op.eqn.prim, dict(op.eqn.params),  # type: ignore[union-attr]
                             tuple(op.eqn.inputs[a:b]), rt)  # type: ignore[union-attr]
        elif v in self.stacked and name == "concatenate":
            pieces, off = [], 0
            for part in op.eqn.inputs:  # type: ignore[union-attr]
                n = self.types[part].shape[0]  # type: ignore[index]
                lo, hi = max(a, off), min(b, off + n)
                if lo < hi:
                    pieces.append(self.sliced(part, lo - off, hi - off))  # type: ignore[arg-type]
                off += n
            out = pieces[0] if len(pieces) == 1 else self._emit(
                op.eqn.prim, dict(op.eqn.params), tuple(pieces), rt)  # type: ignore[union-attr]
        elif v in self.stacked and name in ELEMENTWISE:
            ins = tuple(x if isinstance(x, Lit) else self.sliced(x, a, b)
                        for x in op.eqn.inputs)  # type: ignore[union-attr]
            out = self._emit(op.eqn.prim, dict(op.eqn.params), ins, rt)  # type: ignore[union-attr]
        elif name == "broadcast_in_dim" and 0 not in op.eqn.params["broadcast_dimensions"]:
            params = dict(op.eqn.params, shape=rt.shape)  # type: ignore[union-attr]
            out = self._emit(op.eqn.prim, params, op.eqn.inputs, rt)  # type: ignore[union-attr]
        else:
            start = (a,) + (0,) * (len(t.shape) - 1)
            limit = (b,) + tuple(t.shape[1:])
            out = self._emit(lax.slice_p, {"start_indices": start, "limit_indices": limit,
                                           "strides": None}, (v,), rt)
        self.memo[key] = out
        return out


def fold_stacked_slices(p: Program) -> Program:
    """Fold dim-0 slices of stacked values into their parts (see the module docstring)."""
    if not any(_is_stack(op) for op in p.ops):
        return p
    f = _Folder(p)
    ops: list[Any] = []
    alias: dict[str, str] = {}
    for op in p.ops:
        if _prim(op) == "slice":
            (src,) = op.inputs
            ab = dim0_slice(op.eqn, f.types[src].shape)
            if ab is not None and src in f.stacked:
                f.emitted = []
                alias[op.outputs[0]] = f.sliced(src, *ab)
                ops.extend(f.emitted)
                continue
        ops.append(op)
    if not alias:
        return p
    q = rename_program(p, ops, alias)
    chunks = {a for op in p.ops if _prim(op) == "concatenate" and op.eqn.params.get("dimension") == 0
              for a in op.inputs if a in set(p.inputs)}
    return _drop_unused(_shared_reads(q, chunks), f.stacked, f.types)


def _shared_reads(p: Program, roots: set[str]) -> Program:
    """Read each layer of a split chunk once: later ``slice``/``squeeze`` chains from ``roots``
    equal to an earlier one (every loop over the layers, e.g. one per microbatch, slices them
    afresh) read the earlier one's result, so each microbatch's fragments keep one body."""
    seen: dict[tuple[Any, ...], str] = {}
    alias: dict[str, str] = {}
    derived = set(roots)
    ops: list[Any] = []
    for op in p.ops:
        if _prim(op) in ("slice", "squeeze") and len(op.outputs) == 1:
            src = alias.get(op.inputs[0], op.inputs[0])
            if src in derived:
                key = (_prim(op), repr(sorted(op.eqn.params.items())), src)
                if key in seen:
                    alias[op.outputs[0]] = seen[key]
                    continue
                seen[key] = op.outputs[0]
                derived.add(op.outputs[0])
        ops.append(op)
    return rename_program(p, ops, alias) if alias else p


def _drop_unused(p: Program, candidates: set[str], types: dict[str, TensorType]) -> Program:
    """Drop the meshless ops defining ``candidates`` (and the slices and broadcasts feeding only
    them) that nothing reads any more."""
    used: dict[str, int] = {}
    for v in p.outputs:
        used[v] = used.get(v, 0) + 1
    for op in p.ops:
        for v in op.inputs:
            used[v] = used.get(v, 0) + 1
    keep = [True] * len(p.ops)
    for i in range(len(p.ops) - 1, -1, -1):
        op = p.ops[i]
        if not isinstance(op, MeshlessOp) or any(used.get(v, 0) for v in op.outputs):
            continue
        if op.outputs[0] in candidates or _prim(op) in ("slice", "broadcast_in_dim", "squeeze"):
            keep[i] = False
            for v in op.inputs:
                used[v] -= 1
    return p.with_ops([op for op, k in zip(p.ops, keep) if k], types=types)
