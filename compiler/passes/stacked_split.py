"""Splitting stacked layer arguments at the stage boundaries (the frontend's half of
``passes/stacked.py``).

:func:`split_stacked` finds each program input that a ``scan`` over layers placed one by one
(``"layer[k]"`` assigned) scans over, directly or through the consts of an enclosing loop, and
whose iterations' meshes form runs of consecutive layers (:data:`Chunks`); it gives the program
one input per run (``ws[a:b]`` on that run's mesh) rebuilt by a dim-0 ``concatenate``, and returns
each output of the same shape and dtype (its gradient, its update) as the same runs, sliced.
:class:`Layout` records the mapping: ``Compiled`` slices the user's argument into the chunks and
reassembles the result chunks into one array (:func:`assemble`: sharded over the meshes' devices
along dim 0, no copy, when the chunks are equal; concatenated on the first chunk's mesh
otherwise). An input scanned by loops that disagree, by a loop not placed layer by layer, read
whole elsewhere as a program output, or passed twice is left whole.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import jax
import numpy as np

from compiler.calls import ForLoop
from compiler.program import Eqn, MeshlessOp, NamedComputation, Program, TensorType

Chunks = tuple[tuple[int, int, str], ...]
"""A stacked array's split: ``(start, stop, mesh)`` per run of consecutive layers on one mesh."""


def _loop_chunks(loop: ForLoop, place: Callable[[str], Any]) -> Chunks | None:
    """The meshes of ``loop``'s iterations, as runs, when its body's own named computations are
    placed iteration by iteration (``"layer[k]"``) and agree on each iteration's mesh."""
    names = {op.name for op in loop.body.ops if isinstance(op, NamedComputation)}
    if not names:
        return None
    meshes = []
    for k in range(loop.length):
        where = {place(f"{n}[{k}]") for n in names}
        if None in where or len({w[0] for w in where}) != 1:
            return None
        meshes.append(next(iter(where))[0])
    runs: list[tuple[int, int, str]] = []
    for k, m in enumerate(meshes):
        if runs and runs[-1][2] == m:
            runs[-1] = (runs[-1][0], k + 1, m)
        else:
            runs.append((k, k + 1, m))
    return tuple(runs) if len(runs) > 1 else None


def _stacked_inputs(ops: Iterable[Any], alias: dict[str, str], place: Callable[[str], Any],
                    found: dict[str, set[Chunks | None]]) -> None:
    """Record, per program input scanned over by a layer-placed loop, the chunks it splits into
    (through loop consts: a scan nested in a loop over microbatches reads the outer input)."""
    for op in ops:
        if not isinstance(op, ForLoop):
            continue
        nc, nk = op.num_consts, op.num_carry
        chunks = _loop_chunks(op, place)
        for x in op.operands[nc + nk:]:
            if isinstance(x, str) and x in alias:
                found.setdefault(alias[x], set()).add(chunks)
        inner = {p: alias[a] for p, a in zip(op.body.params[:nc], op.operands[:nc])
                 if isinstance(a, str) and a in alias}
        _stacked_inputs(op.body.ops, inner, place, found)


class Layout:
    """How the user's flat arguments and results map onto the program's (stacked inputs split).

    ``ins[j]``: ``None`` (argument ``j`` is one program input) or its chunks; ``outs`` likewise."""

    def __init__(self, ins: list[Chunks | None], outs: list[Chunks | None]) -> None:
        self.ins, self.outs = ins, outs

    @property
    def trivial(self) -> bool:
        return not any(self.ins) and not any(self.outs)

    def index_map(self, which: str) -> dict[int, list[int]]:
        """User flat index -> program flat indices."""
        out, n = {}, 0
        for j, c in enumerate(self.ins if which == "in" else self.outs):
            k = len(c) if c else 1
            out[j] = list(range(n, n + k))
            n += k
        return out

    def split_args(self, flat: list[Any]) -> list[Any]:
        res: list[Any] = []
        for x, c in zip(flat, self.ins):
            res.extend([x] if not c else [x[a:b] for a, b, _ in c])
        return res

    def join_outputs(self, flat: list[Any]) -> list[Any]:
        res, it = [], iter(flat)
        for c in self.outs:
            res.append(next(it) if not c else assemble([next(it) for _ in c]))
        return res


def assemble(parts: list[Any]) -> Any:
    """One array from chunks on different meshes: sharded over the meshes' devices along dim 0
    when the chunks are equal and equally sharded (no copy), else concatenated on the first."""
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    shs = [getattr(x, "sharding", None) for x in parts]
    if all(isinstance(s, NamedSharding) for s in shs):
        m0, spec0 = shs[0].mesh, tuple(shs[0].spec)
        same = all(s.mesh.axis_names == m0.axis_names and s.mesh.devices.shape == m0.devices.shape
                   and tuple(s.spec) == spec0 for s in shs) and \
            len({x.shape for x in parts}) == 1 and (not spec0 or spec0[0] is None)
        if same and "_layers" not in m0.axis_names:
            mesh = Mesh(np.stack([s.mesh.devices for s in shs]), ("_layers",) + m0.axis_names)
            spec = PartitionSpec("_layers", *spec0[1:])
            shape = (parts[0].shape[0] * len(parts),) + parts[0].shape[1:]
            shards = [s.data for x in parts for s in x.addressable_shards]
            return jax.make_array_from_single_device_arrays(shape, NamedSharding(mesh, spec),
                                                            shards)
    first = shs[0] if shs[0] is not None else None
    return jnp.concatenate([jax.device_put(x, first) if first is not None else x for x in parts])


def split_stacked(prog: Program, place: Callable[[str], Any]) -> tuple[Program, Layout]:
    """Split each program input that a loop over layers placed one by one scans (its chunks:
    the runs of consecutive layers on one mesh) into one input per chunk on that mesh, rebuilt
    by a ``concatenate``; and each output of the same shape and dtype into the same chunks.
    ``passes/stacked.py`` then folds the slices (its docstring tells the whole story)."""
    found: dict[str, set[Chunks | None]] = {}
    _stacked_inputs(prog.ops, {v: v for v in prog.inputs}, place, found)
    split = {v: next(iter(c)) for v, c in found.items() if len(c) == 1 and None not in c
             and prog.inputs.count(v) == 1 and v not in prog.outputs}
    if not split:
        return prog, Layout([None] * len(prog.inputs), [None] * len(prog.outputs))
    types = dict(prog.types)
    inputs, in_meshes, ins, pre = [], [], [], []
    for v, m in zip(prog.inputs, prog.input_meshes):
        c = split.get(v)
        ins.append(c)
        if not c:
            inputs.append(v)
            in_meshes.append(m)
            continue
        t = types[v]
        parts = []
        for a, b, mesh in c:
            n = f"{v}_{a}_{b}"
            types[n] = TensorType((b - a,) + t.shape[1:], t.dtype)
            parts.append(n)
            inputs.append(n)
            in_meshes.append(mesh)
        pre.append(MeshlessOp(Eqn(jax.lax.concatenate_p, {"dimension": 0}, tuple(parts), (v,))))
    by_type = {}
    for v, c in split.items():
        by_type.setdefault(types[v], c)
    outputs, out_meshes, outs, post = [], [], [], []
    for v, m in zip(prog.outputs, prog.output_meshes):
        c = by_type.get(types[v])
        outs.append(c)
        if not c:
            outputs.append(v)
            out_meshes.append(m)
            continue
        t = types[v]
        for a, b, mesh in c:
            n = f"{v}_out_{len(post)}"
            types[n] = TensorType((b - a,) + t.shape[1:], t.dtype)
            post.append(MeshlessOp(Eqn(jax.lax.slice_p, {
                "start_indices": (a,) + (0,) * (len(t.shape) - 1),
                "limit_indices": (b,) + tuple(t.shape[1:]), "strides": None}, (v,), (n,))))
            outputs.append(n)
            out_meshes.append(mesh)
    q = Program(prog.meshes, tuple(inputs), tuple(in_meshes), tuple(outputs), tuple(out_meshes),
                tuple(pre) + tuple(prog.ops) + tuple(post), types, prog.specs)
    return q, Layout(ins, outs)


def remap(d: Mapping[int, Any], index: dict[int, list[int]]) -> dict[int, Any]:
    """A config's per-flat-index mapping, onto the program's indices (a split argument's entry
    applies to each of its chunks)."""
    return {k: v for j, v in d.items() for k in index.get(j, [])}
