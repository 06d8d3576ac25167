"""Fuse small partial results into the user fragment they are made from (pass ``fuse_partials``).

What ``merge_inferred`` leaves first on a mesh, with gradient clipping, is the mesh's partial
sums of squares of its gradients: an inferred fragment that reads only the accumulated gradients
(results of the mesh's last backward fragment) and makes a few scalars, sent to the mesh that
adds up the global norm. It cannot join the update (which waits for that global norm) and
``absorb`` leaves it alone (it reads every microbatch's accumulation), so it is one executable
and one call per mesh of its own.

Rule (ours; in the spirit of the pass list's "merges inferred with user-defined fragments"): an
inferred fragment ``G`` (not an accumulator ``init``) is fused into ``L``, the last user fragment
of its mesh before it, when

- ``G`` reads only what ``L`` reads or makes (``L``'s operands and results), and at least one
  value; and
- every result of ``G`` is small (at most :data:`MAX_BYTES`, as ``concat_transfers`` packs):
  partial sums, norms, a flag, not an update.

``G``'s body is appended to ``L``'s, at ``L``'s place, and its results become ``L``'s. So that
``L`` keeps sharing one executable with the other user fragments of its mesh whose body is
``L``'s (the same stage's backward of the other microbatches), each of those gets ``G``'s body
too, over its own operands and results (position for position; fresh names), with results
that nothing reads: on the first microbatch's backward, the sums of squares of the gradients
accumulated so far, computed and dropped. The cost is that small reduction per other
microbatch; the gain is one executable and one call per mesh (GPT + AdamW with
``clip_by_global_norm`` on 4 meshes of 2 CPU devices: 19 executables and 27 calls a step become
17 and 25).

Why it is safe: ``G`` reads only values defined by or before ``L``, so its equations can run at
``L``'s place, and its results are then defined earlier than before (every reader of them still
comes after). No fragment gains an operand: neither ``L`` nor its peers, so no new dependency
and no cycle; their results only grow. ``L``'s results are kept as they were (even one that only
``G`` read) so that its signature stays its peers'. The pass runs after the last ``dce``, which
would drop the peers' unread results and make their bodies differ again; the verifier accepts
results that nothing reads.
"""

from __future__ import annotations

from dataclasses import replace

from compiler.passes.accumulate import INIT_PART
from compiler.passes.concat_transfers import MAX_BYTES, _nbytes
from compiler.program import Fragment, Op, Program, body_key, fresh


def _fusable(p: Program, g: Op, last: Fragment | None) -> bool:
    if not (isinstance(g, Fragment) and not g.is_user and g.part != INIT_PART):
        return False
    if last is None or not g.inputs or not g.outputs:
        return False
    avail = set(last.inputs) | set(last.outputs)
    return all(v in avail for v in g.inputs) and all(
        _nbytes(p.types[v]) <= MAX_BYTES for v in g.outputs)


def _fuse(p: Program, i: int, j: int) -> Program:
    """Fuse ``ops[j]`` (inferred) into ``ops[i]`` (user) and copy it into ``ops[i]``'s peers."""
    last, g = p.ops[i], p.ops[j]
    assert isinstance(last, Fragment) and isinstance(g, Fragment)
    key = body_key(last, p)
    types = dict(p.types)
    ops: list[Op] = []
    for k, op in enumerate(p.ops):
        if k == j:
            continue
        if k == i:
            op = replace(last, outputs=last.outputs + g.outputs, body=last.body + g.body)
        elif (isinstance(op, Fragment) and op.is_user and op.mesh == last.mesh
              and len(op.inputs) == len(last.inputs) and len(op.outputs) == len(last.outputs)
              and body_key(op, p) == key):
            ren: dict[str, str] = dict(zip(last.inputs, op.inputs))
            ren.update(zip(last.outputs, op.outputs))
            for e in g.body:
                for o in e.outputs:
                    ren[o] = fresh("u")
                    types[ren[o]] = types[o]
            body = tuple(e.rename(ren) for e in g.body)
            op = replace(op, outputs=op.outputs + tuple(ren[v] for v in g.outputs),
                         body=op.body + body)
        ops.append(op)
    return p.with_ops(ops, types=types)


def fuse_partials(p: Program) -> Program:
    """Fuse small inferred partial results into the user fragment they read (see the module
    docstring); returns ``p`` when there is nothing to fuse."""
    while True:
        last: dict[str, int] = {}
        for j, op in enumerate(p.ops):
            if isinstance(op, Fragment) and op.is_user:
                last[op.mesh] = j
            elif isinstance(op, Fragment) and op.mesh in last:
                i = last[op.mesh]
                l_op = p.ops[i]
                assert isinstance(l_op, Fragment)
                if _fusable(p, op, l_op):
                    p = _fuse(p, i, j)
                    break
        else:
            return p
