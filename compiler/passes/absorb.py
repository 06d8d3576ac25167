"""Absorb inferred fragments into user fragments (pass ``-mpmd-absorb-inferred-fragments``).

Applied to a fixed point, over user fragments ``rf`` (root fragments):

1. an inferred producer ``ipf`` whose closest (first) consumer is ``rf`` is merged into ``rf``;
2. an inferred consumer ``icf`` whose closest (last) producer is ``rf`` is merged into ``rf``.

Guard (ours): an inferred fragment is absorbed only if every user fragment it reads from
(pattern 2) or feeds (pattern 1) has ``rf``'s call counter, so code that combines microbatches
(gradient accumulation) or is shared by them (a weight cast) stays a separate inferred fragment
instead of tying one microbatch's fragment to another's and defeating the schedule.
"""

from __future__ import annotations

from compiler.passes._util import merge_pair
from compiler.program import Fragment, Program, producers, users


def _step(p: Program) -> Program | None:
    prod = producers(p)
    use = users(p)
    for i, f in enumerate(p.ops):
        if not isinstance(f, Fragment) or f.is_user:
            continue
        # (1) closest consumer
        cons = sorted({j for v in f.outputs for j in use.get(v, [])})
        if cons:
            rf = p.ops[cons[0]]
            if isinstance(rf, Fragment) and rf.is_user and rf.mesh == f.mesh:
                ccs = {p.ops[j].call_counter for j in cons
                       if isinstance(p.ops[j], Fragment) and p.ops[j].is_user}
                if ccs == {rf.call_counter}:
                    return merge_pair(p, i, cons[0], at="last")
        # (2) closest producer
        prods = sorted({prod[v] for v in f.inputs if v in prod})
        if prods:
            rf = p.ops[prods[-1]]
            if isinstance(rf, Fragment) and rf.is_user and rf.mesh == f.mesh:
                ccs = {p.ops[j].call_counter for j in prods
                       if isinstance(p.ops[j], Fragment) and p.ops[j].is_user}
                if ccs == {rf.call_counter}:
                    return merge_pair(p, prods[-1], i, at="first")
    return None


def absorb_inferred_fragments(p: Program) -> Program:
    """Merge inferred fragments into user fragments until nothing changes."""
    while True:
        q = _step(p)
        if q is None:
            return p
        p = q
