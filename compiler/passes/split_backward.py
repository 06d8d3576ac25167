"""Split backward fragments into input-gradient (B) and weight-gradient (W) parts (zero bubble).

Pass ``-mpmd-split-bwd-fragments``: computation of a backward fragment that does not flow into its
*activation-gradient* outputs (outputs read by another user fragment or by a transfer) becomes a
fragment of its own, the W part; the rest is the B part. W reads the residual values of B it needs
as extra operands (more memory held between B and W, as the pass list notes). A backward fragment
with no activation-gradient output (the first stage) gets an empty B part, so every stage has both
kinds for the schedule. Parts are labelled ``part="B"`` / ``part="W"``; W is placed right after B.
"""

from __future__ import annotations

from dataclasses import replace

from compiler.passes._util import refresh_outputs
from compiler.program import Fragment, Op, Program, Transfer, users


def split_backward(p: Program) -> Program:
    """Split every user fragment of transpose count 1 that is not split yet."""
    use = users(p)
    ops: list[Op] = []
    for f in p.ops:
        if not (isinstance(f, Fragment) and f.is_user and f.kind == "B" and not f.part):
            ops.append(f)
            continue
        act = set()
        for v in f.outputs:
            for j in use.get(v, []):
                u = p.ops[j]
                if isinstance(u, Transfer) or (isinstance(u, Fragment) and u.is_user):
                    act.add(v)
        need = set(act)
        keep = [False] * len(f.body)
        for k in range(len(f.body) - 1, -1, -1):
            e = f.body[k]
            if any(o in need for o in e.outputs):
                keep[k] = True
                need.update(a for a in e.inputs if isinstance(a, str))
        b_body = tuple(e for e, k in zip(f.body, keep) if k)
        w_body = tuple(e for e, k in zip(f.body, keep) if not k)
        b_def = {o for e in b_body for o in e.outputs}
        w_def = {o for e in w_body for o in e.outputs}
        w_in = tuple(dict.fromkeys(a for e in w_body for a in e.inputs
                                   if isinstance(a, str) and a not in w_def))
        b_in = tuple(v for v in f.inputs if any(v in e.inputs for e in b_body))
        b_out = tuple(v for v in f.outputs if v in b_def) + tuple(v for v in w_in if v in b_def)
        w_out = tuple(v for v in f.outputs if v in w_def)
        ops.append(replace(f, inputs=b_in, outputs=tuple(dict.fromkeys(b_out)), body=b_body,
                           part="B"))
        ops.append(replace(f, inputs=w_in, outputs=w_out, body=w_body, part="W"))
    return refresh_outputs(p.with_ops(ops))
