"""Call-counter unrolling: a Python loop over microbatches gives each named computation its call counter.

The step function calls each named computation once per microbatch, in a Python loop (the RFC's
way: the frontend sees the unrolled loop). Forward calls (transpose count 0) of a name get call
counters 0, 1, ... in program order. A backward call (transpose count t > 0) gets the call counter of
the forward call of the same name it depends on through the data flow when that is unique;
the remaining backward calls take the remaining counters in reverse program order (``jax.grad``
transposes a loop last-microbatch-first).

A call counter already set (by ``from_unroll_to_call_counter``, for a named computation from an
unrolled ``fori_loop``) is kept.

Raises ``ConfigError`` when ``microbatches`` is given and a name is called a different number of times.
"""

from __future__ import annotations

from dataclasses import replace

from compiler.errors import ConfigError
from compiler.program import NamedComputation, Program


def unroll_call_counters(p: Program, microbatches: int | None = None) -> Program:
    """Set ``call_counter`` on every :class:`NamedComputation` (see the module docstring)."""
    anc: dict[str, int] = {}  # value -> bitmask over op indices of forward named computations
    fwd_cc: dict[int, int] = {}
    counts: dict[str, int] = {}
    cc: dict[int, int] = {}
    cands: dict[int, set[int]] = {}
    for i, op in enumerate(p.ops):
        mask = 0
        for v in op.inputs:
            mask |= anc.get(v, 0)
        if isinstance(op, NamedComputation):
            if op.transpose == 0:
                # a counter set by an unrolled loop (from_unroll_to_call_counter) is kept
                cc[i] = fwd_cc[i] = counts.get(op.name, 0) if op.call_counter is None \
                    else op.call_counter
                counts[op.name] = max(counts.get(op.name, 0), cc[i] + 1)
                mask |= 1 << i
            elif op.call_counter is not None:
                cc[i] = op.call_counter
                cands[i] = {op.call_counter}
            else:
                cands[i] = {fwd_cc[k] for k in fwd_cc
                            if mask >> k & 1 and p.ops[k].name == op.name}  # type: ignore[union-attr]
        for v in op.outputs:
            anc[v] = mask
    by_name: dict[tuple[str, int], list[int]] = {}
    for i in cands:
        op = p.ops[i]
        by_name.setdefault((op.name, op.transpose), []).append(i)  # type: ignore[union-attr]
    for (name, _t), idx in by_name.items():
        used: set[int] = set()
        for i in idx:
            if len(cands[i]) == 1 and not (cands[i] & used):
                cc[i] = next(iter(cands[i]))
                used.add(cc[i])
        total = max(counts.get(name, 0), len(idx))
        free = sorted(set(range(total)) - used, reverse=True)
        for i in idx:
            if i not in cc:
                cc[i] = free.pop(0)
        if microbatches is not None and len(idx) != microbatches:
            raise ConfigError(f"named computation {name!r} has {len(idx)} backward calls but "
                              f"microbatches={microbatches}; call it once per microbatch")
    if microbatches is not None:
        for name, n in counts.items():
            if n != microbatches:
                raise ConfigError(f"named computation {name!r} is called {n} times but "
                                  f"microbatches={microbatches}; call it once per microbatch")
    ops = [replace(op, call_counter=cc[i]) if i in cc else op for i, op in enumerate(p.ops)]
    return p.with_ops(ops)
