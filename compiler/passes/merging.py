"""Fragment merging: stages into scheduling units, forward+backward of the last stage, user rules.

- :func:`merge_stages` (``-mpmd-merge-user-fragments-into-scheduling-units``): user fragments of one
  mesh, stage, transpose count, part and call counter become one fragment (a stage is the set of
  named computations assigned to one mesh); it raises ``MergeError`` when a stage is not contiguous.
- :func:`merge_forward_backward` (``-mpmd-merge-forward-with-backward``): a forward fragment
  immediately followed on its mesh (among user fragments) by a backward fragment of the same stage and call counter that
  consumes it is merged with it (the last stage of 1F1B).
- :func:`merge_by_rules` (``-mpmd-rule-based-merge``): consecutive user fragments of a mesh
  matching a rule ``(lhs_pattern, rhs_pattern)`` or a predicate ``should_merge(lhs, rhs)``.
"""

from __future__ import annotations

from typing import Callable, Sequence, Union

from compiler.config import FragmentInfo, FragmentPattern
from compiler.errors import MergeError
from compiler.passes._util import describe, merge_pair
from compiler.program import Fragment, Program


def fragment_info(p: Program, f: Fragment) -> FragmentInfo:
    return FragmentInfo(tuple(dict.fromkeys(o.name for o in f.origin)), f.mesh,
                        p.meshes.index(f.mesh), f.stage, f.transpose, f.call_counter, f.kind)


def merge_stages(p: Program) -> Program:
    """Merge user fragments with equal (mesh, stage, transpose, part, call counter)."""
    while True:
        seen: dict[tuple, int] = {}
        for j, f in enumerate(p.ops):
            if not (isinstance(f, Fragment) and f.is_user) or f.stage is None:
                continue
            key = (f.mesh, f.stage, f.transpose, f.part, f.call_counter)
            if key in seen:
                try:
                    p = merge_pair(p, seen[key], j, at="last")
                except MergeError as e:
                    raise MergeError(f"stage {f.stage} is not contiguous: {e}") from None
                break
            seen[key] = j
        else:
            return p


def _mesh_pairs(p: Program):
    """Consecutive user fragments of each mesh (inferred fragments and transfers in between are
    skipped; ``merge_pair`` moves them or refuses when that would make a cycle)."""
    last: dict[str, int] = {}
    for j, f in enumerate(p.ops):
        if not (isinstance(f, Fragment) and f.is_user):
            continue
        i = last.get(f.mesh)
        last[f.mesh] = j
        if i is not None:
            yield i, j


def merge_forward_backward(p: Program) -> Program:
    """Merge F with the B that immediately follows it on its mesh and consumes it (same stage, mb)."""
    changed = True
    while changed:
        changed = False
        for i, j in _mesh_pairs(p):
            a, b = p.ops[i], p.ops[j]
            if (a.is_user and b.is_user and a.kind == "F" and b.kind in ("B", "FB")
                    and a.stage == b.stage and a.call_counter == b.call_counter
                    and set(a.outputs) & set(b.inputs)):
                try:
                    p = merge_pair(p, i, j, at="last")
                except MergeError:
                    continue
                changed = True
                break
    return p


Rules = Union[Sequence[tuple[FragmentPattern, FragmentPattern]],
              Callable[[FragmentInfo, FragmentInfo], bool]]


def merge_by_rules(p: Program, rules: Rules) -> Program:
    """Merge consecutive user fragments of a mesh that a rule matches.

    Raises:
        MergeError: a matched pair cannot be merged without a cycle (names both fragments).
    """
    def match(a: FragmentInfo, b: FragmentInfo) -> bool:
        if callable(rules):
            return bool(rules(a, b))
        return any(pa.matches(a) and pb.matches(b) for pa, pb in rules)

    if not callable(rules) and not rules:
        return p
    changed = True
    while changed:
        changed = False
        for i, j in _mesh_pairs(p):
            a, b = p.ops[i], p.ops[j]
            if a.is_user and b.is_user and match(fragment_info(p, a), fragment_info(p, b)):
                try:
                    p = merge_pair(p, i, j, at="last")
                except MergeError as e:
                    raise MergeError(f"merge rule matched {describe(a)} and {describe(b)} but: {e}") \
                        from None
                changed = True
                break
    return p
