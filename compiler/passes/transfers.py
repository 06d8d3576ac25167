"""Transfer clean-up: merging duplicate transfers and removing transfer cycles.

- :func:`merge_transfers`: transfers of the same value to the same mesh become one (the pass list's
  ``-mpmd-merge-transfers`` also concatenates small transfers between the same fragments; that
  concatenation is not implemented).
- :func:`remove_transfer_cycles` (``-mpmd-remove-transfer-cycles``): a transfer whose value is a
  copy of a value already on the destination mesh (``x0 -> m1 -> m0``) is dropped and its users read
  the existing copy. All transfers here are device-to-device, so every cycle is removed.
"""

from __future__ import annotations

from compiler.passes._util import rename_program
from compiler.program import Op, Program, Transfer, value_meshes


def _clean(p: Program, through_copies: bool) -> Program:
    meshes = value_meshes(p)
    root: dict[str, str] = {}
    holders: dict[str, dict[str, str]] = {}
    alias: dict[str, str] = {}
    ops: list[Op] = []
    for op in p.ops:
        if isinstance(op, Transfer):
            v = alias.get(op.value, op.value)
            r = root.get(v, v) if through_copies else v
            h = holders.setdefault(r, {meshes[r]: r} if meshes.get(r) else {})
            if op.dst in h:
                alias[op.out] = h[op.dst]
                continue
            h[op.dst] = op.out
            root[op.out] = r
        ops.append(op)
    return rename_program(p, ops, alias)


def merge_transfers(p: Program) -> Program:
    """Keep one transfer per (value, destination mesh)."""
    return _clean(p, through_copies=False)


def remove_transfer_cycles(p: Program) -> Program:
    """Drop transfers that bring a value back to a mesh that already holds it (or a copy of it)."""
    return _clean(p, through_copies=True)
