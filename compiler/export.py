"""Export: Program -> :class:`~compiler.exported.ExportedProgram` (the runtime's input), plus
``run_sequential``, the executor ``Compiled`` uses by default (the runtime, unrecorded).

- One executable per unique (mesh, fragment body, operand/result shardings): fragments whose
  canonical body text (:func:`compiler.program.body_key`) is equal share one ``jax.jit`` function,
  e.g. the same stage's forward over all call counters (RFC "Export": dedup of programs).
- Each executable is ``jax.jit(body, in_shardings, out_shardings)`` with the propagated shardings
  (``NamedSharding`` on the fragment's mesh; replicated where propagation did not run).
- Donation: a call's operand may be donated when that call is its last use on the mesh (no later
  call or send reads it), it is not a program input (the caller owns it) or output, not sent
  between meshes that share a device, not read twice by the call, and, on CPU, not an accumulator
  ``init`` call's zeros (the runtime reuses those across calls) (``Call.donate``). The executable
  donates (``jax.jit``'s ``donate_argnums``, ``Executable.donate``) the positions donatable in
  every one of its calls that a result of the same shape, dtype and sharding can take over, on
  every platform (XLA:CPU honours donation too: its results then reuse those buffers instead of
  allocating new ones).
- Per-mesh programs: fragments become ``Call`` steps on their mesh, transfers ``Send`` steps on
  the source mesh, in program order.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import jax
from jax.sharding import NamedSharding

from compiler.errors import CompilerError
from compiler.exported import Call, Executable, ExportedProgram, MeshProgram, Send, Step
from compiler.passes.sharding import partition_spec
from compiler.program import Fragment, Program, Transfer, body_function, body_key, value_meshes
from compiler.runtime import run_program

_SUFFIX = {"F": "fwd", "B": "bwd", "W": "wgrad", "FB": "fwd_bwd", "other": "inferred",
           "init": "acc_init"}


def _sharding(p: Program, v: str, mesh: Any) -> NamedSharding:
    return NamedSharding(mesh, partition_spec(p.specs.get(v)))


def _exe_name(n: int, f: Fragment) -> str:
    names = list(dict.fromkeys(o.name for o in f.origin))
    label = "_".join(names) if len(names) <= 2 else f"{names[0]}_to_{names[-1]}"
    stage = f"_stage{f.stage}" if f.stage is not None else ""
    return f"p{n}_{f.mesh}{stage}_{label + '_' if label else ''}{_SUFFIX[f.kind]}"


def _aliasable(p: Program, f: Fragment, positions: set[int], ins: tuple, outs: tuple
               ) -> tuple[int, ...]:
    """Of the donatable input positions of ``f``, those whose buffer a result can take over (the
    same shape, dtype and sharding; each result once): donating the others would only free them
    early, which the runtime does after the call anyway, and makes ``jax.jit`` warn."""
    pool: dict[tuple, list[int]] = {}
    for k in sorted(positions):
        t = p.types[f.inputs[k]]
        pool.setdefault((tuple(t.shape), str(t.dtype), ins[k]), []).append(k)
    used = []
    for v, sh in zip(f.outputs, outs):
        t = p.types[v]
        free = pool.get((tuple(t.shape), str(t.dtype), sh))
        if free:
            used.append(free.pop(0))
    return tuple(sorted(used))


def export_program(p: Program, topology: Mapping[str, Any]) -> ExportedProgram:
    """Build the per-mesh programs and executables of a fully assigned program.

    Raises:
        CompilerError: a meshless op or unassigned input/output remains (run the passes first).
    """
    meshes = value_meshes(p)
    steps: dict[str, list[Step]] = {m: [] for m in p.meshes}
    frag_at: list[tuple[str, int, Fragment]] = []
    for op in p.ops:
        if isinstance(op, Fragment):
            frag_at.append((op.mesh, len(steps[op.mesh]), op))
            steps[op.mesh].append(None)  # type: ignore[arg-type]  # filled below
        elif isinstance(op, Transfer):
            steps[op.src].append(Send(op.value, op.dst, op.out,
                                      _sharding(p, op.out, topology[op.dst])))
        else:
            raise CompilerError(f"cannot export {type(op).__name__} with results {op.outputs}: "
                                f"run mesh assignment and inference first")
    # last use per mesh (step index); program inputs/outputs never donated (the caller owns the
    # inputs; the outputs are returned), nor a value sent between meshes that share a device
    # (the copy may be the same buffer)
    keep = set(p.inputs) | set(p.outputs)
    for op in p.ops:
        if isinstance(op, Transfer) and (set(topology[op.src].devices.flat)
                                         & set(topology[op.dst].devices.flat)):
            keep.update((op.value, op.out))
    # nor, on CPU, the accumulators' zeros: the runtime makes them once and reuses them
    # (compiler.runtime._run_deferred), which beats making them again each step to donate them
    for op in p.ops:
        if isinstance(op, Fragment) and op.kind == "init" and not op.inputs \
                and all(d.platform == "cpu" for d in topology[op.mesh].devices.flat):
            keep.update(op.outputs)
    last: dict[tuple[str, str], int] = {}
    for mesh, idx, f in frag_at:
        for v in f.inputs:
            last[(mesh, v)] = max(last.get((mesh, v), -1), idx)
    for mesh, ss in steps.items():
        for k, s in enumerate(ss):
            if isinstance(s, Send):
                last[(mesh, s.value)] = max(last.get((mesh, s.value), -1), k)
    keys: dict[str, str] = {}
    groups: dict[str, list[tuple[Fragment, tuple[int, ...]]]] = {}
    calls: list[tuple[str, int, Fragment, str, tuple[int, ...]]] = []
    for mesh, idx, f in frag_at:
        donate = tuple(k for k, v in enumerate(f.inputs)
                       if v not in keep and last.get((mesh, v)) == idx)
        key = body_key(f, p)
        if key not in keys:
            keys[key] = _exe_name(len(keys), f)
        groups.setdefault(keys[key], []).append((f, donate))
        calls.append((mesh, idx, f, keys[key], donate))
    executables: dict[str, Executable] = {}
    for name, fs in groups.items():
        f = fs[0][0]
        mesh = topology[f.mesh]
        ins = tuple(_sharding(p, v, mesh) for v in f.inputs)
        outs = tuple(_sharding(p, v, mesh) for v in f.outputs)
        donated = _aliasable(p, f, set.intersection(*(set(d) for _, d in fs)), ins, outs)
        fn = jax.jit(body_function(f, mesh), in_shardings=ins, out_shardings=outs,
                     donate_argnums=donated)
        executables[name] = Executable(name, f.mesh, fn, ins, outs, donated)
    for mesh, idx, f, name, donate in calls:
        mb = f.call_counter if f.call_counter is not None else -1
        st = f.stage if f.stage is not None else -1
        label = f"{f.kind}{st}.{mb}" if f.is_user else f"{name}.{mb}"
        steps[mesh][idx] = Call(name, label, f.kind, st, mb, f.inputs, f.outputs, donate)
    inputs = tuple((v, m, _sharding(p, v, topology[m])) for v, m in zip(p.inputs, p.input_meshes))
    outputs = tuple((v, meshes[v]) for v in p.outputs)
    for v, m in outputs:
        if m is None:
            raise CompilerError(f"program output {v} has no mesh; run mesh inference first")
    mbs = {f.call_counter for _, _, f in frag_at if f.call_counter is not None}
    return ExportedProgram(
        programs={m: MeshProgram(m, tuple(s)) for m, s in steps.items()},
        executables=executables, inputs=inputs, outputs=outputs,
        meta={"num_executables": len(executables), "microbatches": len(mbs),
              "calls": {n: len(fs) for n, fs in groups.items()}})


def run_sequential(ep: ExportedProgram, flat_args: Sequence[Any]) -> list[Any]:
    """Run an exported program on this process's devices (the default executor of
    ``Compiled``): :func:`compiler.runtime.run_program` unrecorded, whose static round-robin
    (steps of each mesh in order, meshes interleaved, a step waiting until its operands exist)
    is worked out once per program and replayed with asynchronous dispatch. Returns the
    flattened outputs.

    Raises:
        CompilerError: wrong argument count, or no mesh can make progress (a deadlock).
    """
    if len(flat_args) != len(ep.inputs):
        raise CompilerError(f"exported program takes {len(ep.inputs)} arguments, got "
                            f"{len(flat_args)}")
    outs = run_program(ep, list(flat_args), record=False).outputs
    return jax.tree.leaves(outs) if ep.meta.get("out_tree") is not None else list(outs)
