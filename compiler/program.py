"""The MPMD program IR: fragments on meshes, transfers between them, and meshless ops.

A :class:`Program` is a flat, SSA list of ops over string-named values (each defined once):

- :class:`NamedComputation`: a user-labelled computation before mesh assignment (frontend output);
- :class:`MeshlessOp`: one JAX equation not yet on a mesh (mesh inference places it);
- :class:`Fragment`: a SPMD computation unit on one mesh, its body a tuple of :class:`Eqn` over the
  same global value names (so merging two fragments is concatenating their bodies);
- :class:`Transfer`: a value moved from one mesh to another, under a new name.

The textual form (:func:`print_program`) is MLIR-like and stable: values are renumbered in order of
definition (``%arg0`` program inputs, ``%0``/``%0#1`` op results, ``%a0`` fragment block arguments,
``%b0`` fragment-local values), so tests compare programs as strings. Following the Shardy:MPMD RFC
(``shared/reference/000_*.txt``): ``fragment<mesh="m1", origin=["layer1"(1)], stage=0,
call_counter=1>``, where ``"name"(n)`` is the n-th transpose (derivative) of ``name``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping, Sequence, Union

import numpy as np
import jax.numpy as jnp

from compiler.constraints import is_logical_constraint, resolve_params

# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class TensorType:
    """Shape and dtype of a value (dtype as numpy name, e.g. ``"float32"``)."""

    shape: tuple[int, ...]
    dtype: str

    def __str__(self) -> str:
        return f"{_short_dtype(self.dtype)}[{','.join(str(d) for d in self.shape)}]"


Spec = tuple[tuple[str, ...], ...]
"""A sharding spec: per array dimension, the mesh axes it is sharded over (``()`` replicated)."""


@dataclass(frozen=True, slots=True)
class Lit:
    """A scalar literal operand (as in a jaxpr ``Literal``)."""

    value: Any
    dtype: str

    def __str__(self) -> str:
        return f"{self.value!r}:{_short_dtype(self.dtype)}"


Atom = Union[str, Lit]


class _Constant:
    """Pseudo-primitive of a constant equation: ``params['value']`` is the array."""

    name = "constant"
    multiple_results = False

    def __repr__(self) -> str:
        return "constant"


CONSTANT = _Constant()


@dataclass(frozen=True, slots=True, eq=False)
class Eqn:
    """One JAX equation over program value names.

    Attributes:
        prim: a ``jax.extend.core.Primitive`` (or :data:`CONSTANT`).
        params: the primitive's parameters (bound as ``prim.bind(*inputs, **params)``).
        inputs: operand names or literals.
        outputs: result names.
        ctx: the jaxpr equation context (its ``manager`` is entered on evaluation), or None.
    """

    prim: Any
    params: Mapping[str, Any]
    inputs: tuple[Atom, ...]
    outputs: tuple[str, ...]
    ctx: Any = None

    def rename(self, m: Mapping[str, Atom]) -> "Eqn":
        return replace(self,
                       inputs=tuple(m.get(a, a) if isinstance(a, str) else a for a in self.inputs),
                       outputs=tuple(m.get(o, o) for o in self.outputs))  # type: ignore[misc]


# --------------------------------------------------------------------------- ops


@dataclass(frozen=True, slots=True, order=True)
class Origin:
    """A named computation ``name`` at transpose count ``transpose`` (0 forward, 1 backward)."""

    name: str
    transpose: int = 0

    def __str__(self) -> str:
        return f'"{self.name}"' + (f"({self.transpose})" if self.transpose else "")


@dataclass(frozen=True, slots=True)
class NamedComputation:
    """A labelled computation before mesh assignment (one inlined ``jit`` equation)."""

    name: str
    transpose: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    body: tuple[Eqn, ...]
    call_counter: int | None = None


@dataclass(frozen=True, slots=True)
class MeshlessOp:
    """One equation outside any named computation, not yet on a mesh."""

    eqn: Eqn

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(a for a in self.eqn.inputs if isinstance(a, str))

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.eqn.outputs


@dataclass(frozen=True, slots=True)
class Fragment:
    """A SPMD computation unit on one mesh.

    Attributes:
        mesh: mesh name.
        origin: the named computations it came from (empty for an inferred fragment).
        inputs: values it reads (defined outside, on ``mesh``), in block-argument order.
        outputs: values of its body used outside, in result order.
        body: equations in dependency order.
        stage: pipeline stage (None when unassigned).
        call_counter: microbatch index (None when not unrolled).
        part: ``""`` (whole), ``"B"`` / ``"W"`` after splitting a backward fragment, or
            ``"init"`` for an inferred fragment that zero-initialises accumulators
            (``passes/accumulate.py``).
    """

    mesh: str
    origin: tuple[Origin, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    body: tuple[Eqn, ...]
    stage: int | None = None
    call_counter: int | None = None
    part: str = ""

    @property
    def is_user(self) -> bool:
        return bool(self.origin)

    @property
    def transpose(self) -> int:
        """The largest transpose count among the origins (0 for inferred fragments)."""
        return max((o.transpose for o in self.origin), default=0)

    @property
    def kind(self) -> str:
        """F, B, W (schedule kinds), ``"FB"`` for merged forward+backward, ``"init"`` for an
        accumulator-init fragment, ``"other"`` for any other inferred fragment."""
        if not self.origin:
            return "init" if self.part == "init" else "other"
        ts = {o.transpose for o in self.origin}
        if ts == {0}:
            return "F"
        if 0 in ts:
            return "FB"
        return self.part or "B"


@dataclass(frozen=True, slots=True)
class Transfer:
    """Move ``value`` (on mesh ``src``) to mesh ``dst``, where it is named ``out``."""

    value: str
    src: str
    dst: str
    out: str

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.value,)

    @property
    def outputs(self) -> tuple[str, ...]:
        return (self.out,)


Op = Union[NamedComputation, MeshlessOp, Fragment, Transfer]


@dataclass(frozen=True, slots=True)
class Program:
    """An MPMD program.

    Attributes:
        meshes: topology mesh names, in topology order.
        inputs: flattened argument value names.
        input_meshes: mesh of each input (None while unassigned).
        outputs: flattened result value names (may repeat, may name inputs).
        output_meshes: requested mesh of each output (None: wherever it is computed).
        ops: ops in program order (a topological order of the data flow).
        types: value name -> :class:`TensorType`, for every value including fragment-local ones.
        specs: value name -> :data:`Spec` (filled by sharding propagation; absent = unknown).
    """

    meshes: tuple[str, ...]
    inputs: tuple[str, ...]
    input_meshes: tuple[str | None, ...]
    outputs: tuple[str, ...]
    output_meshes: tuple[str | None, ...]
    ops: tuple[Op, ...]
    types: Mapping[str, TensorType]
    specs: Mapping[str, Spec] = field(default_factory=dict)

    def with_ops(self, ops: Iterable[Op], **kw: Any) -> "Program":
        return replace(self, ops=tuple(ops), **kw)

    def fragments(self) -> list[Fragment]:
        return [op for op in self.ops if isinstance(op, Fragment)]


# --------------------------------------------------------------------------- helpers

_fresh = itertools.count()


def fresh(base: str = "t") -> str:
    """A value name unique in this process (names from the frontend never start with ``_``)."""
    return f"_{base}{next(_fresh)}"


def producers(p: Program) -> dict[str, int]:
    """Value name -> index of the op defining it (inputs absent)."""
    return {v: i for i, op in enumerate(p.ops) for v in op.outputs}


def users(p: Program) -> dict[str, list[int]]:
    """Value name -> indices of the ops reading it (in program order)."""
    out: dict[str, list[int]] = {}
    for i, op in enumerate(p.ops):
        for v in dict.fromkeys(op.inputs):
            out.setdefault(v, []).append(i)
    return out


def value_meshes(p: Program) -> dict[str, str | None]:
    """Value name -> the mesh it lives on (None for meshless values)."""
    out: dict[str, str | None] = dict(zip(p.inputs, p.input_meshes))
    for op in p.ops:
        if isinstance(op, Fragment):
            m: str | None = op.mesh
        elif isinstance(op, Transfer):
            m = op.dst
        else:
            m = None
        for v in op.outputs:
            out[v] = m
    return out


def body_free_inputs(body: Sequence[Eqn]) -> tuple[str, ...]:
    """Names read by ``body`` but not defined in it, in first-use order."""
    defined: set[str] = set()
    free: dict[str, None] = {}
    for e in body:
        for a in e.inputs:
            if isinstance(a, str) and a not in defined:
                free[a] = None
        defined.update(e.outputs)
    return tuple(free)


def make_fragment(mesh: str, origin: tuple[Origin, ...], body: Sequence[Eqn],
                  used_outside: Callable[[str], bool], *, inputs: Sequence[str] | None = None,
                  stage: int | None = None, call_counter: int | None = None,
                  part: str = "") -> Fragment:
    """A fragment whose inputs are the body's free names and outputs the names used outside."""
    body = tuple(body)
    outs = tuple(v for e in body for v in e.outputs if used_outside(v))
    ins = tuple(inputs) if inputs is not None else body_free_inputs(body)
    return Fragment(mesh, origin, ins, outs, body, stage, call_counter, part)


def eval_body(body: Sequence[Eqn], inputs: Sequence[str], outputs: Sequence[str],
              args: Sequence[Any], mesh: Any = None) -> tuple[Any, ...]:
    """Evaluate equations on ``args`` (bound to ``inputs``) and return ``outputs``' values.

    ``mesh``: the ``jax.sharding.Mesh`` the body runs on; sharding constraints traced against the
    logical mesh are resolved on it (:mod:`compiler.constraints`), or dropped without one."""
    env: dict[str, Any] = dict(zip(inputs, args))

    def read(a: Atom) -> Any:
        return np.asarray(a.value, dtype=a.dtype) if isinstance(a, Lit) else env[a]

    for e in body:
        if e.prim is CONSTANT:
            env[e.outputs[0]] = jnp.asarray(e.params["value"])
            continue
        vals = [read(a) for a in e.inputs]
        name = getattr(e.prim, "name", "")
        if mesh is None and is_logical_constraint(name, e.params):
            env[e.outputs[0]] = vals[0]
            continue
        raw = resolve_params(name, e.params, mesh, tuple(np.shape(vals[0])) if vals else None)
        params = e.prim.get_bind_params(raw)
        if e.ctx is not None:
            with e.ctx.manager:
                ans = e.prim.bind(*vals, **params)
        else:
            ans = e.prim.bind(*vals, **params)
        if e.prim.multiple_results:
            env.update(zip(e.outputs, ans))
        else:
            env[e.outputs[0]] = ans
    return tuple(read(o) for o in outputs)


def body_function(frag: Fragment, mesh: Any = None) -> Callable[..., tuple[Any, ...]]:
    """``fn(*inputs) -> tuple(outputs)`` evaluating the fragment's body (traceable by jax.jit) on
    ``mesh`` (see :func:`eval_body`)."""
    body, ins, outs = frag.body, frag.inputs, frag.outputs

    def fn(*args: Any) -> tuple[Any, ...]:
        return eval_body(body, ins, outs, args, mesh)

    return fn


# --------------------------------------------------------------------------- printing

_DT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int32": "i32",
       "int64": "i64", "int8": "i8", "uint8": "ui8", "uint32": "ui32", "bool": "i1"}


def _short_dtype(d: str) -> str:
    return _DT.get(d, d)


def spec_str(spec: Spec) -> str:
    return "[" + ",".join("{" + ",".join(f'"{a}"' for a in dim) + "}" for dim in spec) + "]"


def _param_str(k: str, v: Any, full: bool) -> str | None:
    tname = type(v).__name__
    if v is None and not full:
        return None
    if tname in ("ClosedJaxpr", "Jaxpr"):
        return f"{k}={v}" if full else None
    if callable(v) and not isinstance(v, type):
        return f"{k}={getattr(v, '__name__', tname)}" if full else None
    if isinstance(v, np.ndarray):
        return f"{k}=<{v.dtype}{list(v.shape)} {hash(v.tobytes())}>" if full else None
    return f"{k}={v}"


def eqn_str(e: Eqn, name: Callable[[Atom], str], types: Mapping[str, TensorType],
            full: bool = False) -> str:
    """``%b1 = mul %b0, 2.0:f32 : f32[4]`` (``full`` adds nested jaxprs, for canonical keys)."""
    ps = [s for k, v in sorted(e.params.items()) if k != "value" or full
          for s in [_param_str(k, v, full)] if s is not None]
    if e.prim is CONSTANT and full:
        arr = np.asarray(e.params["value"])
        ps = [f"value={arr.tobytes().hex() if arr.size <= 64 else hash(arr.tobytes())}"]
    pstr = f"[{' '.join(ps)}]" if ps else ""
    lhs = ", ".join(name(o) for o in e.outputs)
    args = ", ".join(name(a) for a in e.inputs)
    tys = ", ".join(str(types[o]) for o in e.outputs)
    return f"{lhs} = {e.prim.name}{pstr} {args} : {tys}".replace("  :", " :")


class _Names:
    def __init__(self) -> None:
        self.m: dict[str, str] = {}

    def __call__(self, a: Atom) -> str:
        if isinstance(a, Lit):
            return str(a)
        return self.m.get(a, f"%?{a}")


def _vtype(p: Program, v: str, mesh: str | None) -> str:
    t = str(p.types[v])
    if mesh is None:
        return t
    spec = p.specs.get(v)
    return f"{t}@{mesh}" + (spec_str(spec) if spec is not None else "")


def _tuple(xs: Sequence[str]) -> str:
    return xs[0] if len(xs) == 1 else "(" + ", ".join(xs) + ")"


def body_lines(inputs: Sequence[str], outputs: Sequence[str], body: Sequence[Eqn],
               types: Mapping[str, TensorType], full: bool = False,
               outer: _Names | None = None) -> tuple[str, list[str]]:
    """Block arguments and body lines of a region, in local numbering (``%a`` args, ``%b`` values)."""
    loc = _Names()
    for i, v in enumerate(inputs):
        loc.m[v] = f"%a{i}"
    n = 0
    lines = []
    for e in body:
        for o in e.outputs:
            loc.m[o] = f"%b{n}"
            n += 1
        lines.append(eqn_str(e, loc, types, full))
    lines.append(("return " + ", ".join(loc(o) for o in outputs)).rstrip())
    args = ", ".join(f"{loc(v)}: {types[v]}" for v in inputs)
    return args, lines


def body_key(frag: Fragment, p: Program) -> str:
    """Canonical text of a fragment's body and signature: equal keys mean one executable."""
    args, lines = body_lines(frag.inputs, frag.outputs, frag.body, p.types, full=True)
    sig = [_vtype(p, v, frag.mesh) for v in frag.inputs] + ["->"] + \
          [_vtype(p, v, frag.mesh) for v in frag.outputs]
    return f"{frag.mesh}|{' '.join(sig)}|({args})|" + "; ".join(lines)


def print_program(p: Program) -> str:
    """The program in a stable MLIR-like text form (see the module docstring)."""
    names = _Names()
    meshes = value_meshes(p)
    for i, v in enumerate(p.inputs):
        names.m.setdefault(v, f"%arg{i}")
    k = 0
    out_lines: list[str] = []
    for op in p.ops:
        outs = op.outputs
        res = ""
        if outs:
            if len(outs) == 1:
                names.m[outs[0]] = f"%{k}"
            else:
                for j, v in enumerate(outs):
                    names.m[v] = f"%{k}#{j}"
            res = f"%{k}" + (f":{len(outs)}" if len(outs) > 1 else "") + " = "
            k += 1
        out_lines.extend(_op_lines(p, op, names, res, meshes))
    ins = ", ".join(f"%arg{i}: {_vtype(p, v, meshes.get(v))}" for i, v in enumerate(p.inputs))
    outs_t = _tuple([_vtype(p, v, meshes.get(v)) for v in p.outputs]) if p.outputs else "()"
    head = f"func @main({ins}) -> {outs_t} {{"
    ret = "  return " + ", ".join(names(v) for v in p.outputs)
    return "\n".join([head] + ["  " + ln for ln in out_lines] + [ret, "}"]) + "\n"


def _op_lines(p: Program, op: Op, names: _Names, res: str,
              meshes: Mapping[str, str | None]) -> list[str]:
    if not isinstance(op, (MeshlessOp, Transfer, NamedComputation, Fragment)):
        # ForLoop / CallOp (before mesh assignment; compiler.calls) print themselves
        return op.printed_lines(names, res, p.types, lambda o, n, r: _op_lines(p, o, n, r, meshes))
    if isinstance(op, MeshlessOp):
        return [res + eqn_str(op.eqn, names, p.types).split(" = ", 1)[1]]
    if isinstance(op, Transfer):
        return [f"{res}transfer {names(op.value)} : {_vtype(p, op.value, op.src)} -> "
                f"{_vtype(p, op.out, op.dst)}"]
    if isinstance(op, NamedComputation):
        attrs = str(Origin(op.name, op.transpose))
        if op.call_counter is not None:
            attrs += f", call_counter={op.call_counter}"
        head = f"{res}named_computation<{attrs}>"
        mesh = None
    else:
        attrs = f'mesh="{op.mesh}", origin=[{", ".join(str(o) for o in op.origin)}]'
        if op.stage is not None:
            attrs += f", stage={op.stage}"
        if op.call_counter is not None:
            attrs += f", call_counter={op.call_counter}"
        if op.part:
            attrs += f', part="{op.part}"'
        head = f"{res}fragment<{attrs}>"
        mesh = op.mesh
    args, lines = body_lines(op.inputs, op.outputs, op.body, p.types)
    operands = ", ".join(names(v) for v in op.inputs)
    in_t = ", ".join(_vtype(p, v, mesh if mesh else meshes.get(v)) for v in op.inputs)
    out_t = _tuple([_vtype(p, v, mesh) for v in op.outputs]) if op.outputs else "()"
    return ([f"{head} ({operands}) ({args}) {{"] + ["  " + ln for ln in lines]
            + [f"}} : ({in_t}) -> {out_t}"])
