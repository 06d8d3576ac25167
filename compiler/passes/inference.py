"""Mesh inference: place every meshless op on meshes by use_set / src_set (RFC "Mesh inference").

- ``use_set(v)``: union of the meshes where ``v`` is transitively used (fragments on a mesh, the
  source mesh of a transfer, a program output's requested mesh). An op must live where it is used.
- ``src_set(v)``: intersection of the meshes where ``v``'s transitive sources are available (a value
  is available on its mesh and on every mesh it is transferred to). An op can live there without
  new transfers.

Each meshless op is cloned onto every mesh of its ``use_set`` as an inferred fragment (origin ``[]``).
A program output with no requested mesh takes the first mesh (topology order) of its ``src_set``; an
unassigned input goes to the first mesh of its ``use_set`` (the first topology mesh when unused).
When ``use_set`` is not contained in ``src_set`` a transfer is created, or, with transfer inference
off, :class:`InferenceError` is raised naming the value. Dead meshless ops are dropped.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping

import numpy as np

from compiler.errors import InferenceError
from compiler.passes._util import rename_uses
from compiler.program import Fragment, MeshlessOp, NamedComputation, Op, Program, Transfer, fresh


def _producer_desc(p: Program, v: str) -> str:
    for op in p.ops:
        if v in op.outputs:
            if isinstance(op, Fragment):
                o = ", ".join(str(x) for x in op.origin) or "inferred"
                return f"result of fragment [{o}] call_counter={op.call_counter}"
            if isinstance(op, Transfer):
                return f"transfer of {op.value}"
    return "program input" if v in p.inputs else "value"


def _bytes(p: Program, vs: Iterable[str]) -> int:
    return sum(int(np.prod(p.types[v].shape, dtype=np.int64)) * np.dtype(p.types[v].dtype).itemsize
               for v in vs)


def _weights(p: Program, home: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """Meshless value -> bytes of its sources per mesh, each source scaled down by the ratio of
    sizes of every op it flows through that shrinks it (a reduction of a gradient weighs as
    little as its result)."""
    w: dict[str, dict[str, float]] = {}
    for op in p.ops:
        if not isinstance(op, MeshlessOp):
            continue
        out_b = max(_bytes(p, op.outputs), 1)
        acc: dict[str, float] = {}
        for v in dict.fromkeys(op.inputs):
            src = w.get(v)
            if src is None:
                src = {home[v]: float(_bytes(p, [v]))} if v in home else {}
            f = min(1.0, out_b / max(_bytes(p, [v]), 1))
            for m, x in src.items():
                acc[m] = acc.get(m, 0.0) + f * x
        for v in op.outputs:
            w[v] = acc
    return w


def _heaviest(w: Mapping[str, float], among: Iterable[str], order: Mapping[str, int]) -> str:
    """The mesh of ``among`` with the most source bytes (topology order breaks ties)."""
    return min(among, key=lambda m: (-w.get(m, 0.0), order[m]))


def _placement(p: Program, op: MeshlessOp, use: set[str], src: Mapping[str, set[str]],
               weight: Mapping[str, Mapping[str, float]], home: Mapping[str, str],
               order: Mapping[str, int], readers: Mapping[str, int]) -> set[str]:
    """Where ``op`` is computed: its ``use_set``, or, when that is not within its ``src_set`` and
    its results are no larger than its operands (a reduction, an elementwise op), where its
    operands are (``use_set & src_set``, else the ``src_set`` mesh, else the ``use_set`` mesh
    with most source bytes), its results then moved to the rest of ``use_set``.

    Except: an op used on one mesh whose operands placed elsewhere are all program inputs is
    computed where it is used when moving those inputs costs fewer bytes than moving its
    results. A program input is moved to a mesh once and that copy serves every meshless op
    reading it, so its bytes are shared among its ``readers``. The first layer's ``x @ emb`` of
    each microbatch, ``emb`` tied to the last mesh, is so computed on the first mesh: ``emb``
    moves there once instead of ``x`` and the product making a round trip per microbatch."""
    s = src.get(op.outputs[0], set()) if op.outputs else set()
    ins = [v for v in dict.fromkeys(op.inputs)]
    if use <= s or not ins or _bytes(p, op.outputs) > _bytes(p, ins):
        return use
    if use & s:
        return use & s
    if len(use) == 1:
        (u,) = use
        inputs = set(p.inputs)
        far = [v for v in ins if v in home and home[v] != u]
        if all(v in inputs for v in far) and all(v in home or v in inputs for v in ins) and \
                sum(_bytes(p, [v]) / max(readers.get(v, 1), 1) for v in far) < _bytes(p, op.outputs):
            return use
    w: dict[str, float] = {}
    for v in ins:
        wv = weight.get(v) or ({home[v]: float(_bytes(p, [v]))} if v in home else {})
        for m, x in wv.items():
            w[m] = w.get(m, 0.0) + x
    return {_heaviest(w, s or use, order)}


def infer_meshes(p: Program, infer_transfers: bool = True) -> Program:
    """Place all meshless ops (see the module docstring).

    Raises:
        InferenceError: a transfer is needed while ``infer_transfers`` is False, or a named
            computation was never assigned.
    """
    order = {m: k for k, m in enumerate(p.meshes)}
    first = lambda s: min(s, key=order.__getitem__)  # noqa: E731
    for op in p.ops:
        if isinstance(op, NamedComputation):
            raise InferenceError(f"named computation {op.name!r} reached mesh inference unassigned;"
                                 f" run mesh assignment first")
    home: dict[str, str] = {v: m for v, m in zip(p.inputs, p.input_meshes) if m is not None}
    avail: dict[str, set[str]] = {}
    meshless: set[str] = set()
    for op in p.ops:
        if isinstance(op, Fragment):
            for v in op.outputs:
                home[v] = op.mesh
        elif isinstance(op, Transfer):
            home[op.out] = op.dst
            avail.setdefault(op.value, set()).add(op.dst)
        else:
            meshless.update(op.outputs)
    for v, m in home.items():
        avail.setdefault(v, set()).add(m)
    allm = set(p.meshes)
    # src_set, forward
    src: dict[str, set[str]] = {}
    for v in p.inputs:
        src[v] = set(avail[v]) if v in home else set(allm)
    for op in p.ops:
        if isinstance(op, MeshlessOp):
            s = set(allm)
            for v in op.inputs:
                s &= src.get(v, avail.get(v, allm))
            for v in op.outputs:
                src[v] = s
        else:
            for v in op.outputs:
                src[v] = set(avail[v])
    # output meshes: requested, or the first of src_set
    weight = _weights(p, home)
    out_mesh: list[str | None] = []
    for v, m in zip(p.outputs, p.output_meshes):
        if m is None and (v in meshless or v not in home):
            s = src.get(v)
            m = first(s) if s else _heaviest(weight.get(v, {}), allm, order)
        out_mesh.append(m)
    # use_set, backward
    use: dict[str, set[str]] = {}
    for v, m in zip(p.outputs, out_mesh):
        if m is not None:
            use.setdefault(v, set()).add(m)
    readers: dict[str, int] = {}
    for op in p.ops:
        if isinstance(op, MeshlessOp):
            for v in dict.fromkeys(op.inputs):
                readers[v] = readers.get(v, 0) + 1
    place: dict[int, set[str]] = {}
    for k in range(len(p.ops) - 1, -1, -1):
        op = p.ops[k]
        if isinstance(op, Fragment):
            ms = {op.mesh}
        elif isinstance(op, Transfer):
            ms = {op.src}
        else:
            ms = set().union(*(use.get(v, set()) for v in op.outputs))
            if isinstance(op, MeshlessOp) and ms:
                ms = _placement(p, op, ms, src, weight, home, order, readers)
                place[k] = ms
        for v in op.inputs:
            use.setdefault(v, set()).update(ms)
    in_m = list(p.input_meshes)
    for k, v in enumerate(p.inputs):
        if in_m[k] is None:
            in_m[k] = first(use[v]) if use.get(v) else p.meshes[0]
            home[v] = in_m[k]
    # clone meshless ops onto their use sets, rewriting reads
    name_on: dict[tuple[str, str], str] = {}
    for v, h in home.items():
        name_on[(v, h)] = v
    for t in p.ops:
        if isinstance(t, Transfer):
            name_on.setdefault((t.value, t.dst), t.out)
    types = dict(p.types)
    ops: list[Op] = []

    def on(v: str, m: str) -> str:
        if (v, m) in name_on:
            return name_on[(v, m)]
        if v in meshless and v not in home:
            raise InferenceError(f"internal: meshless value {v} has no copy on mesh {m!r}")
        h = home[v]
        if not infer_transfers:
            raise InferenceError(f"value {v} ({_producer_desc(p, v)}) lives on mesh {h!r} but is "
                                 f"needed on mesh {m!r}: a transfer is needed while transfer "
                                 f"inference is off; enable infer_transfers or assign the users "
                                 f"of {v} to {h!r}")
        n = fresh()
        types[n] = types[v]
        ops.append(Transfer(v, h, m, n))
        name_on[(v, m)] = n
        return n

    for i, op in enumerate(p.ops):
        if isinstance(op, MeshlessOp):
            ms = place.get(i, set())
            if not ms:
                continue  # dead
            full = set().union(*(use.get(v, set()) for v in op.outputs))
            if not full <= ms:  # computed on fewer meshes than it is used on: results travel
                for v in op.outputs:
                    home[v] = first(ms)
            for k, m in enumerate(sorted(ms, key=order.__getitem__)):
                ren = {v: on(v, m) for v in op.inputs}
                outs = {}
                for v in op.outputs:
                    if k == 0:
                        outs[v] = v
                    else:
                        outs[v] = fresh()
                        types[outs[v]] = types[v]
                    name_on[(v, m)] = outs[v]
                e = op.eqn.rename({**ren, **outs})
                ins = tuple(dict.fromkeys(a for a in e.inputs if isinstance(a, str)))
                ops.append(Fragment(m, (), ins, e.outputs, (e,)))
        elif isinstance(op, Fragment):
            ren = {v: on(v, op.mesh) for v in op.inputs if v in meshless or home.get(v) != op.mesh}
            ops.append(rename_uses(op, ren))
        else:
            ops.append(op)
    outputs = []
    for v, m in zip(p.outputs, out_mesh):
        if m is None:
            outputs.append(v)
        else:
            outputs.append(on(v, m))
    return replace(p, ops=tuple(ops), outputs=tuple(outputs), input_meshes=tuple(in_m),
                   output_meshes=tuple(out_mesh), types=types)
