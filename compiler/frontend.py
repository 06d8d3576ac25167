"""The MPMD frontend: ``jit(fn, config).lower(*args).compile()``, and tracing into the Program IR.

Usage (RFC "MPMD + JAX")::

    lowered = compiler.jit(step, config).lower(*args)   # traces and runs the passes
    lowered.program      # the final Program (print with compiler.program.print_program)
    lowered.exported     # the ExportedProgram for the runtime
    compiled = lowered.compile()
    outs = compiled(*args)  # same pytree as step(*args)

Microbatching is the RFC's: the step function calls each named computation once per microbatch in a
Python loop; the ``unroll`` pass gives those calls their call counters (see ``passes/unroll.py``).
A ``scan`` (or static ``fori_loop``) whose body calls named computations becomes a
:class:`~compiler.calls.ForLoop` (body traced the same way, its named computations' transpose
counts including the scan's own); the loop passes unroll it (``passes/loops.py``). An argument that
such a scan over layers placed one by one reads is split at the stage boundaries, one program
input per mesh's run of layers, and results of its shape come back in the same chunks
(``passes/stacked_split.py``, ``passes/stacked.py``; ``jit(..., split_stacked=False)`` keeps it whole). A config naming
a computation the step lacks, a tracer error inside a named computation's body, and a traced value
leaked out of one are refused in one line naming the piece (``compiler/diagnose.py``). A named
computation inside a ``while_loop``, ``cond`` or any other higher-order primitive raises
:class:`CompilerError` naming it. An empty named ``jit`` (a residue of partial evaluation) is dropped.

Tracing: 
``jax.make_jaxpr`` gives the step's jaxpr. Each top-level ``jit`` equation whose ``name`` is a named
computation (``compiler.named.named_computation``) becomes a :class:`NamedComputation` with its body
inlined; its transpose count is the number of ``transpose(`` in the equation's
``source_info.name_stack`` (``jax.grad`` names the backward ``transpose(jvp(...))``). A ``jit``
equation that is not named but contains named computations is inlined; every other equation becomes
a :class:`MeshlessOp`; closed-over constants become ``constant`` meshless ops.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any, Callable, Iterable

import jax
import numpy as np

from compiler.calls import ForLoop, Func
from compiler.config import MpmdConfig
from compiler.constraints import tracing
from compiler.diagnose import check_names, constant, tracing_error
from compiler.errors import CompilerError
from compiler.exported import ExportedProgram
from compiler.program import (CONSTANT, Atom, Eqn, Lit, MeshlessOp, NamedComputation, Op, Program,
                              TensorType)
from compiler.driver import default_pipeline, run_passes
from compiler.export import export_program, run_sequential
from compiler.passes.stacked_split import Layout, remap, split_stacked

_JIT = ("jit", "pjit")


def _is_jit(eqn: Any) -> bool:
    return eqn.primitive.name in _JIT and "jaxpr" in eqn.params


def _sub_jaxprs(eqn: Any) -> list[Any]:
    """The jaxprs nested in ``eqn``'s parameters (scan/while bodies, cond branches, ...)."""
    out = []
    for v in eqn.params.values():
        for x in (v if isinstance(v, (tuple, list)) else (v,)):
            j = getattr(x, "jaxpr", x)
            if type(j).__name__ == "Jaxpr":
                out.append(j)
    return out


def _contains_named(jaxpr: Any, names: set[str] | None) -> bool:
    for e in jaxpr.eqns:
        if _is_jit(e) and (names is None or e.params.get("name") in names):
            return True
        if any(_contains_named(j, names) for j in _sub_jaxprs(e)):
            return True
    return False


def _first_named(jaxpr: Any, names: set[str] | None) -> str:
    for e in jaxpr.eqns:
        if _is_jit(e) and (names is None or e.params.get("name") in names):
            return str(e.params["name"])
        for j in _sub_jaxprs(e):
            if _contains_named(j, names):
                return _first_named(j, names)
    return "?"


_WHY = {"while": "a while_loop (a fori_loop with traced bounds, or a data-dependent trip count) "
                 "cannot be unrolled; use jax.lax.fori_loop with Python int bounds or jax.lax.scan",
        "cond": "a lax.cond branch cannot be placed on meshes; compute both branches and select, "
                "or move the cond inside the named computation"}


def _transpose_count(eqn: Any) -> int:
    return str(eqn.source_info.name_stack).count("transpose(")


class _Tracer:
    def __init__(self, names: set[str] | None) -> None:
        self.names = names
        self.ids = itertools.count()
        self.types: dict[str, TensorType] = {}
        self.ops: list[Op] = []
        self.loops = itertools.count()
        self.tbase = 0  # transposes of the enclosing loops (a scan body's name stack is relative)

    def new(self, aval: Any) -> str:
        if not hasattr(aval, "shape") or not hasattr(aval, "dtype"):
            raise CompilerError(f"value of abstract type {aval} is not an array; the MPMD compiler "
                                f"traces array programs only")
        n = f"v{next(self.ids)}"
        self.types[n] = TensorType(tuple(int(d) for d in aval.shape), str(np.dtype(aval.dtype)))
        return n

    def atom(self, env: dict[Any, Atom], a: Any) -> Atom:
        if type(a).__name__ == "Literal":
            return Lit(np.asarray(a.val).item(), str(np.dtype(a.aval.dtype)))
        return env[a]

    def eqns(self, jaxpr: Any, consts: Iterable[Any], env: dict[Any, Atom],
             sink: Callable[[Eqn], None]) -> None:
        """Translate ``jaxpr``'s equations (constvars bound to ``consts``) through ``sink``."""
        for v, c in zip(jaxpr.constvars, consts):
            n = self.new(v.aval)
            env[v] = n
            sink(Eqn(CONSTANT, {"value": constant(c)}, (), (n,)))
        for e in jaxpr.eqns:
            ins = tuple(self.atom(env, a) for a in e.invars)
            outs = tuple(self.new(v.aval) for v in e.outvars)
            for v, n in zip(e.outvars, outs):
                env[v] = n
            sink(Eqn(e.primitive, dict(e.params), ins, outs, getattr(e, "ctx", None)))

    def inline(self, closed: Any, ins: tuple[Atom, ...]) -> tuple[list[Eqn], list[Atom]]:
        env: dict[Any, Atom] = dict(zip(closed.jaxpr.invars, ins))
        body: list[Eqn] = []
        self.eqns(closed.jaxpr, closed.consts, env, body.append)
        return body, [self.atom(env, a) for a in closed.jaxpr.outvars]

    def top(self, jaxpr: Any, consts: Iterable[Any], env: dict[Any, Atom],
            ops: list[Any] | None = None) -> None:
        """Translate ``jaxpr`` into ops appended to ``ops`` (default: the program's)."""
        ops = self.ops if ops is None else ops
        for v, c in zip(jaxpr.constvars, consts):
            n = self.new(v.aval)
            env[v] = n
            ops.append(MeshlessOp(Eqn(CONSTANT, {"value": constant(c)}, (), (n,))))
        for e in jaxpr.eqns:
            ins = tuple(self.atom(env, a) for a in e.invars)
            if _is_jit(e) and (self.names is None or e.params.get("name") in self.names):
                if not e.outvars and not e.params["jaxpr"].jaxpr.eqns:
                    continue  # an empty residue of partial evaluation: computes nothing
                body, outs = self.inline(e.params["jaxpr"], ins)
                defined = {o for b in body for o in b.outputs}
                for v, a in zip(e.outvars, outs):
                    env[v] = a
                free = {}
                for b in body:
                    for a in b.inputs:
                        if isinstance(a, str) and a not in defined:
                            free[a] = None
                outputs = tuple(dict.fromkeys(a for a in outs if isinstance(a, str) and a in defined))
                ops.append(NamedComputation(str(e.params["name"]), _transpose_count(e) + self.tbase,
                                            tuple(free), outputs, tuple(body)))
            elif _is_jit(e) and _contains_named(e.params["jaxpr"].jaxpr, self.names):
                inner = e.params["jaxpr"]
                ienv: dict[Any, Atom] = dict(zip(inner.jaxpr.invars, ins))
                self.top(inner.jaxpr, inner.consts, ienv, ops)
                for v, a in zip(e.outvars, inner.jaxpr.outvars):
                    env[v] = self.atom(ienv, a)
            elif e.primitive.name == "scan" and _contains_named(e.params["jaxpr"].jaxpr,
                                                                self.names):
                outs = tuple(self.new(v.aval) for v in e.outvars)
                env.update(zip(e.outvars, outs))
                ops.append(self.loop(e, ins, outs))
            elif any(_contains_named(j, self.names) for j in _sub_jaxprs(e)):
                name = next(_first_named(j, self.names) for j in _sub_jaxprs(e)
                            if _contains_named(j, self.names))
                why = _WHY.get(e.primitive.name, f"{e.primitive.name} is not a loop the compiler "
                               f"unrolls; call the named computation outside it")
                raise CompilerError(f"named computation {name!r} is called inside "
                                    f"{e.primitive.name}: {why}")
            else:
                outs = tuple(self.new(v.aval) for v in e.outvars)
                for v, n in zip(e.outvars, outs):
                    env[v] = n
                ops.append(MeshlessOp(Eqn(e.primitive, dict(e.params), ins, outs,
                                          getattr(e, "ctx", None))))

    def loop(self, e: Any, ins: tuple[Atom, ...], outs: tuple[str, ...]) -> ForLoop:
        """A ``scan`` equation whose body calls named computations, as a :class:`ForLoop`."""
        closed = e.params["jaxpr"]
        k = next(self.loops)
        params = tuple(self.new(v.aval) for v in closed.jaxpr.invars)
        benv: dict[Any, Atom] = dict(zip(closed.jaxpr.invars, params))
        body: list[Any] = []
        base, self.tbase = self.tbase, self.tbase + _transpose_count(e)
        try:
            self.top(closed.jaxpr, closed.consts, benv, body)
        finally:
            self.tbase = base
        results = []
        for a in closed.jaxpr.outvars:
            x = self.atom(benv, a)
            if isinstance(x, Lit):
                n = self.new(a.aval)
                body.append(MeshlessOp(Eqn(CONSTANT, {"value": np.asarray(x.value, x.dtype)},
                                           (), (n,))))
                x = n
            results.append(x)
        return ForLoop(ins, outs, Func(f"loop{k}", params, tuple(body), tuple(results)),
                       int(e.params["length"]), int(e.params["num_consts"]),
                       int(e.params["num_carry"]), bool(e.params["reverse"]), f"scan#{k}")


def trace_program(fn: Callable[..., Any], args: tuple[Any, ...], *, meshes: tuple[str, ...],
                  names: set[str] | None = None) -> tuple[Program, Any, Any]:
    """Trace ``fn(*args)`` into a Program.

    Args:
        fn: the step function (calls named computations).
        args: example arguments (arrays or ``jax.ShapeDtypeStruct``), any pytree.
        meshes: topology mesh names, in order.
        names: the labels that count as named computations (None: every ``jit`` equation).

    Returns:
        ``(program, in_tree, out_tree)``; inputs are the flattened ``args``.
    """
    return _program(*_make_jaxpr(fn, args), args, meshes=meshes, names=names)


def _make_jaxpr(fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Any, Any]:
    """``jax.make_jaxpr(fn, return_shape=True)(*args)``; a JAX tracer error inside a named
    computation becomes a :class:`CompilerError` naming it (``compiler.diagnose``)."""
    try:
        return jax.make_jaxpr(fn, return_shape=True)(*args)
    except Exception as e:
        err = tracing_error(e)
        if err is None:
            raise
        raise err from e


def _program(closed: Any, out_shape: Any, args: tuple[Any, ...], *, meshes: tuple[str, ...],
             names: set[str] | None) -> tuple[Program, Any, Any]:
    in_tree = jax.tree.structure(args)
    out_tree = jax.tree.structure(out_shape)
    t = _Tracer(names)
    env: dict[Any, Atom] = {}
    inputs = tuple(t.new(v.aval) for v in closed.jaxpr.invars)
    env.update(zip(closed.jaxpr.invars, inputs))
    t.top(closed.jaxpr, closed.consts, env)
    outputs = []
    for a in closed.jaxpr.outvars:
        x = t.atom(env, a)
        if isinstance(x, Lit):
            n = t.new(a.aval)
            t.ops.append(MeshlessOp(Eqn(CONSTANT, {"value": np.asarray(x.value, x.dtype)}, (), (n,))))
            x = n
        outputs.append(x)
    prog = Program(meshes=tuple(meshes), inputs=inputs, input_meshes=(None,) * len(inputs),
                   outputs=tuple(outputs), output_meshes=(None,) * len(outputs),
                   ops=tuple(t.ops), types=dict(t.types))
    return prog, in_tree, out_tree


# --------------------------------------------------------------------------- jit API


def _arg_specs(flat: list[Any]) -> dict[int, Any]:
    out = {}
    for k, a in enumerate(flat):
        sh = getattr(a, "sharding", None)
        if isinstance(sh, jax.sharding.NamedSharding):
            out[k] = sh.spec
    return out


class Compiled:
    """A compiled MPMD program, callable like the original function.

    ``executor(exported, flat_args) -> flat_outputs`` runs it (default: the sequential executor of
    ``compiler.export``; ``compiler.runtime`` provides the real one).
    """

    def __init__(self, lowered: "Lowered", executor: Callable[..., Any] | None = None) -> None:
        self.lowered = lowered
        self.program = lowered.program
        self.exported = lowered.exported
        self.executor = executor or run_sequential

    def __call__(self, *args: Any) -> Any:
        flat, tree = jax.tree.flatten(args)
        if tree != self.lowered.in_tree:
            raise CompilerError(f"arguments have structure {tree}, the program was lowered for "
                                f"{self.lowered.in_tree}; call it with the same pytree")
        layout = self.lowered.layout
        if layout is not None:
            flat = layout.split_args(flat)
        outs = list(self.executor(self.exported, flat))
        if layout is not None:
            outs = layout.join_outputs(outs)
        return jax.tree.unflatten(self.lowered.out_tree, outs)


class Lowered:
    """The result of :meth:`MpmdFunction.lower`: programs before/after the passes and the export.

    Attributes:
        initial_program: the traced Program. program: after all passes. history: (pass, Program).
        exported: the ExportedProgram. input_shardings: one ``NamedSharding`` per program input.
        layout: None, or how split stacked arguments and results map onto the program's inputs
            and outputs (``jit(..., split_stacked=True)``).
    """

    def __init__(self, initial: Program, history: list[tuple[str, Program]], final: Program,
                 exported: ExportedProgram, in_tree: Any, out_tree: Any,
                 layout: Layout | None = None) -> None:
        self.layout = layout
        self.initial_program = initial
        self.history = history
        self.program = final
        self.exported = exported
        self.in_tree = in_tree
        self.out_tree = out_tree
        self.input_shardings = tuple(s for _v, _m, s in exported.inputs)

    def compile(self, executor: Callable[..., Any] | None = None) -> Compiled:
        """The callable program (its executables compile on first call)."""
        return Compiled(self, executor)


class MpmdFunction:
    """``jit(fn, config)``: lower with :meth:`lower`."""

    def __init__(self, fn: Callable[..., Any], config: MpmdConfig, verify: bool = False,
                 split_stacked: bool = True) -> None:
        self.fn = fn
        self.config = config
        self.verify = verify
        self.split_stacked = split_stacked

    def lower(self, *args: Any) -> Lowered:
        """Trace ``fn(*args)``, run the pass pipeline and export.

        Raises:
            ConfigError: the config names a computation ``fn`` does not have (``compiler.diagnose``).
            CompilerError: a named computation's body cannot be traced (a tracer error inside it,
                or a traced value leaked out of it), or any subclass from the passes (assignment,
                inference, schedule, ...).
        """
        cfg = self.config
        with tracing(cfg.topology):
            closed, out_shape = _make_jaxpr(self.fn, args)
        check_names(cfg, closed.jaxpr)
        prog, in_tree, out_tree = _program(closed, out_shape, args, meshes=cfg.mesh_names,
                                           names=cfg.names())
        specs = _arg_specs(jax.tree.leaves(args))
        specs.update(cfg.in_specs)
        layout = None
        if self.split_stacked:
            prog, layout = split_stacked(prog, cfg.place)
            if layout.trivial:
                layout = None
            else:
                ins, outs = layout.index_map("in"), layout.index_map("out")
                whole_in = {j: v for j, v in cfg.input_meshes.items() if not layout.ins[j]}
                whole_out = {j: v for j, v in cfg.output_meshes.items() if not layout.outs[j]}
                cfg = replace(cfg, input_meshes=remap(whole_in, ins),
                              output_meshes=remap(whole_out, outs))
                specs = remap(specs, ins)
        history: list[tuple[str, Program]] = []
        final = run_passes(prog, default_pipeline(cfg, specs), verify=self.verify,
                           history=history)
        return Lowered(prog, history, final, export_program(final, cfg.topology), in_tree,
                       out_tree, layout)

    def __call__(self, *args: Any) -> Any:
        return self.lower(*args).compile()(*args)


def jit(fn: Callable[..., Any], config: MpmdConfig, *, verify: bool = False,
        split_stacked: bool = True) -> MpmdFunction:
    """MPMD-partition ``fn`` per ``config`` (an :class:`~compiler.config.MpmdConfig`).

    ``verify=True`` runs the IR verifier between passes. ``split_stacked`` (default on): an
    argument that a ``scan`` over layers placed one by one reads (``"layer[k]"`` assigned) is
    split at the stage boundaries, each mesh taking its own layers, and results of its shape and
    dtype come back in the same chunks, reassembled (``passes/stacked.py``); the program then
    takes one input per chunk (``Lowered.layout``), which ``Compiled`` slices from the argument.
    """
    return MpmdFunction(fn, config, verify, split_stacked)
