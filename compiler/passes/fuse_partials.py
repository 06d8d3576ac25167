"""Fuse small partial results into the user fragment they are made from (pass ``fuse_partials``).

What ``merge_inferred`` leaves first on a mesh, with gradient clipping, is the mesh's partial
sums of squares of its gradients: an inferred fragment that reads only the accumulated gradients
(results of the mesh's last backward fragment) and makes a few scalars, sent to the mesh that
adds up the global norm. It cannot join the update (which waits for that global norm) and
``absorb`` leaves it alone (it reads every microbatch's accumulation), so it is one executable
and one call per mesh of its own.

Rule (ours; in the spirit of the pass list's "merges inferred with user-defined fragments"): an
inferred fragment ``G`` (not an accumulator ``init``) is fused into ``L``, the last user fragment
of its mesh before it, when ``G`` reads only what ``L`` reads or makes (``L``'s operands and
results), and at least one value, and some result of ``G`` is small (at most :data:`MAX_BYTES`,
as ``concat_transfers`` packs: partial sums, norms, a flag). The equations those small results
need are appended to ``L``'s body, at ``L``'s place, and the small results become ``L``'s. When
``G`` also makes large results (the gradients with an L2 term's gradient added, which the
update reads), they must all be read by one later inferred fragment ``U`` of the mesh (not a
program output, not sent): the equations they need are prepended to ``U``'s body, over ``L``'s
values, so those made for both (``2 * l2 * w + g``) are computed twice, elementwise, and no
large result is added to ``L``; otherwise ``G`` is left as it is. A ``G`` with an effectful
equation is left as it is too (its copies would repeat the effect).

So that ``L`` keeps sharing one executable with the other user fragments of its mesh whose body
is ``L``'s (the same stage's backward of the other microbatches), each of those gets the fused
equations too, over its own operands and results (position for position; fresh names), with
results that nothing reads: on the first microbatch's backward, the sums of squares of the
gradients accumulated so far, computed and dropped. The cost is that small reduction per other
microbatch; the gain is one executable and one call per mesh (GPT + AdamW with
``clip_by_global_norm`` on 4 meshes of 2 CPU devices, ``examples/gpt_optax.py``: 19 executables
and 27 calls a step become 17 and 25; with an L2 term on the loss,
``benchmarks/bench_compiler_optimizer.py``: 20 executables become 17).

Why it is safe: ``G`` reads only values defined by or before ``L``, so its equations can run at
``L``'s place (and at ``U``'s, later), and its small results are then defined earlier than
before (every reader of them still comes after). Neither ``L`` nor its peers gain an operand,
so no new dependency and no cycle; their results only grow. ``U`` gains operands defined before
``G`` was, and loses ``G``'s large results, which it now makes. ``L``'s results are kept as
they were (even one that only ``G`` read) so that its signature stays its peers'. The pass runs
after the last ``dce``, which would drop the peers' unread results and make their bodies differ
again; the verifier accepts results that nothing reads.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from compiler.passes.accumulate import INIT_PART
from compiler.passes.concat_transfers import MAX_BYTES, _nbytes
from compiler.program import (Eqn, Fragment, Op, Program, body_free_inputs, body_key, fresh,
                              users)

_Plan = tuple[tuple[Eqn, ...], tuple[str, ...], tuple[Eqn, ...], int | None]


def _slice(body: Sequence[Eqn], outs: Sequence[str]) -> tuple[Eqn, ...]:
    """The equations of ``body`` that ``outs`` need, in body order."""
    need = set(outs)
    kept = []
    for e in reversed(body):
        if any(o in need for o in e.outputs):
            kept.append(e)
            need.update(a for a in e.inputs if isinstance(a, str))
    return tuple(reversed(kept))


def _plan(p: Program, g: Op, last: Fragment, readers: dict[str, list[int]]) -> _Plan | None:
    """``(fused, small, rest, k)``: the equations made in ``last`` (those ``g``'s small results
    ``small`` need), and those ``g``'s large results need, prepended to ``ops[k]`` (``()`` and
    None when ``g`` has no large result); None when ``g`` is not fused."""
    if not (isinstance(g, Fragment) and not g.is_user and g.part != INIT_PART):
        return None
    avail = set(last.inputs) | set(last.outputs)
    if not g.inputs or not all(v in avail for v in g.inputs):
        return None
    if any(getattr(e.prim, "effects", None) for e in g.body):
        return None     # copied into the peers, an effect would happen once per microbatch
    small = tuple(v for v in g.outputs if _nbytes(p.types[v]) <= MAX_BYTES)
    big = tuple(v for v in g.outputs if _nbytes(p.types[v]) > MAX_BYTES)
    if not small:
        return None
    if not big:
        return g.body, small, (), None
    ks = {k for v in big for k in readers.get(v, ())}
    if len(ks) != 1 or any(v in p.outputs for v in big):
        return None
    (k,) = ks
    u = p.ops[k]
    if not (isinstance(u, Fragment) and not u.is_user and u.part != INIT_PART
            and u.mesh == g.mesh):
        return None
    rest = _slice(g.body, big)
    if any(o in small for e in rest for o in e.outputs):
        return None
    return _slice(g.body, small), small, rest, k


def _fuse(p: Program, i: int, j: int, plan: _Plan) -> Program:
    """Fuse ``ops[j]`` (inferred) into ``ops[i]`` (user) and its peers as ``plan`` says."""
    last = p.ops[i]
    assert isinstance(last, Fragment)
    fused, small, rest, k = plan
    key = body_key(last, p)
    types = dict(p.types)

    def renamed(keep: dict[str, str], own: set[str]) -> tuple[Eqn, ...]:
        """``fused`` over fresh names, but for ``own`` results (and the renaming ``keep``)."""
        ren = dict(keep)
        for e in fused:
            for o in e.outputs:
                if o not in own:
                    ren[o] = fresh("u")
                    types[ren[o]] = types[o]
        return tuple(e.rename(ren) for e in fused)

    ops: list[Op] = []
    for n, op in enumerate(p.ops):
        if n == j:
            continue
        if n == i:
            # with a rest, the values both need are made twice: fresh names here
            body = renamed({}, set(small)) if rest else fused
            op = replace(last, outputs=last.outputs + small, body=last.body + body)
        elif n == k:
            assert isinstance(op, Fragment)
            made_here = {o for e in rest for o in e.outputs}
            ins = tuple(dict.fromkeys(v for v in op.inputs + body_free_inputs(rest)
                                      if v not in made_here))
            op = replace(op, inputs=ins, body=rest + op.body)
        elif (isinstance(op, Fragment) and op.is_user and op.mesh == last.mesh
              and len(op.inputs) == len(last.inputs) and len(op.outputs) == len(last.outputs)
              and body_key(op, p) == key):
            ren = dict(zip(last.inputs, op.inputs))
            ren.update(zip(last.outputs, op.outputs))
            body = renamed(ren, set())
            made = {o: b for e, be in zip(fused, body) for o, b in zip(e.outputs, be.outputs)}
            op = replace(op, outputs=op.outputs + tuple(made[v] for v in small),
                         body=op.body + body)
        ops.append(op)
    return p.with_ops(ops, types=types)


def fuse_partials(p: Program) -> Program:
    """Fuse small inferred partial results into the user fragment they read (see the module
    docstring); returns ``p`` when there is nothing to fuse."""
    while True:
        readers = users(p)
        last: dict[str, int] = {}
        for j, op in enumerate(p.ops):
            if isinstance(op, Fragment) and op.is_user:
                last[op.mesh] = j
            elif isinstance(op, Fragment) and op.mesh in last:
                i = last[op.mesh]
                l_op = p.ops[i]
                assert isinstance(l_op, Fragment)
                plan = _plan(p, op, l_op, readers)
                if plan is not None:
                    p = _fuse(p, i, j, plan)
                    break
        else:
            return p
