"""Fragment scheduling: order each mesh's fragments by a user schedule (RFC "Fragment scheduling").

The schedule adds dependencies between user fragments of a mesh; with the data-flow dependencies,
a topological sort (ties broken by original program order) gives the new program order. Forms:

- per-mesh order ``{mesh: [FragmentRef(kind, stage, microbatch), ...]}`` (kind F = transpose 0,
  B = transpose 1 (the input-gradient part after split_backward), W = the weight-gradient part;
  microbatch = call counter): consecutive entries become dependencies; every user fragment of a
  listed mesh must be listed exactly once;
- a predicate ``should_precede(lhs, rhs)`` over :class:`~compiler.config.FragmentInfo`
  (see :func:`comparator`, :func:`gpipe_key`, :func:`one_f_one_b_key`);
- rules ``[(lhs_pattern, rhs_pattern), ...]``.

Raises ``ScheduleError`` naming the fragment when the schedule names a fragment the program lacks,
leaves one out, or contradicts the data flow (a cycle).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from compiler.config import FragmentInfo, Schedule
from compiler.errors import ScheduleError
from ir import FragmentRef
from compiler.passes._util import describe
from compiler.passes.merging import fragment_info
from compiler.program import Fragment, Program, producers


def comparator(key: Callable[[FragmentInfo], Any]) -> Callable[[FragmentInfo, FragmentInfo], bool]:
    """RFC's tuple comparator: on one mesh, ``lhs`` precedes ``rhs`` iff ``key(lhs) < key(rhs)``."""
    def should_precede(lhs: FragmentInfo, rhs: FragmentInfo) -> bool:
        return lhs.mesh == rhs.mesh and key(lhs) < key(rhs)
    return should_precede


def gpipe_key(f: FragmentInfo) -> tuple:
    """GPipe: all forwards, then all backwards, each in microbatch order."""
    return (f.transpose, f.microbatch)


def one_f_one_b_key(num_meshes: int) -> Callable[[FragmentInfo], tuple]:
    """1F1B (RFC): ``(microbatch + (num_meshes - mesh_index) * transpose, -transpose)``."""
    def key(f: FragmentInfo) -> tuple:
        return (f.microbatch + (num_meshes - f.mesh_index) * f.transpose, -f.transpose)
    return key


def _ref_of(f: Fragment) -> tuple[str, int | None, int | None]:
    return (f.kind, f.stage, f.call_counter)


def schedule_fragments(p: Program, schedule: Schedule) -> Program:
    """Reorder ``p`` per ``schedule`` (see the module docstring); None returns ``p`` unchanged."""
    if schedule is None:
        return p
    n = len(p.ops)
    succ: list[set[int]] = [set() for _ in range(n)]
    user = [i for i, op in enumerate(p.ops) if isinstance(op, Fragment) and op.is_user]
    if isinstance(schedule, Mapping):
        for mesh, refs in schedule.items():
            if mesh not in p.meshes:
                raise ScheduleError(f"schedule names mesh {mesh!r}, which is not in the program's "
                                    f"topology {list(p.meshes)}; fix the schedule")
            have = {_ref_of(p.ops[i]): i for i in user if p.ops[i].mesh == mesh}
            seq = []
            for r in refs:
                r = r if isinstance(r, FragmentRef) else FragmentRef(*r)
                i = have.pop((r.kind, r.stage, r.microbatch), None)
                if i is None:
                    stages = sorted({k[1] for k in _all(p, user, mesh)}, key=str)
                    mbs = sorted({k[2] for k in _all(p, user, mesh)}, key=str)
                    raise ScheduleError(
                        f"schedule for mesh {mesh!r} names fragment {r} (kind {r.kind}, stage "
                        f"{r.stage}, microbatch {r.microbatch}), which the program lacks or lists "
                        f"twice; the mesh has stages {stages}, microbatches {mbs}")
                seq.append(i)
            if have:
                k, i = next(iter(have.items()))
                raise ScheduleError(f"schedule for mesh {mesh!r} leaves out fragment "
                                    f"{describe(p.ops[i])} (kind {k[0]}); list it")
            for a, b in zip(seq, seq[1:]):
                succ[a].add(b)
    else:
        infos = {i: fragment_info(p, p.ops[i]) for i in user}
        if callable(schedule):
            pred = schedule
        else:
            rules = list(schedule)

            def pred(a: FragmentInfo, b: FragmentInfo) -> bool:
                return a.mesh == b.mesh and any(x.matches(a) and y.matches(b) for x, y in rules)
        for a in user:
            for b in user:
                if a != b and pred(infos[a], infos[b]):
                    succ[a].add(b)
    prod = producers(p)
    pred: list[set[int]] = [set() for _ in range(n)]
    for j, op in enumerate(p.ops):
        for v in op.inputs:
            if v in prod:
                pred[j].add(prod[v])
    for a in range(n):
        for b in succ[a]:
            pred[b].add(a)
    # MLIR-style topological sort: sweep the remaining ops in program order, emitting every op
    # whose predecessors are emitted; repeat (keeps the original order wherever it is legal)
    done = [False] * n
    order: list[int] = []
    remaining = list(range(n))
    while remaining:
        rest = []
        for i in remaining:
            if all(done[k] for k in pred[i]):
                done[i] = True
                order.append(i)
            else:
                rest.append(i)
        if len(rest) == len(remaining):
            stuck = next((i for i in rest if isinstance(p.ops[i], Fragment)), rest[0])
            what = describe(p.ops[stuck]) if isinstance(p.ops[stuck], Fragment) \
                else str(p.ops[stuck])
            raise ScheduleError(f"schedule contradicts the data flow: fragment {what} is in a "
                                f"dependency cycle; reorder the schedule")
        remaining = rest
    return p.with_ops([p.ops[i] for i in order])


def _all(p: Program, user: list[int], mesh: str) -> list[tuple]:
    return [_ref_of(p.ops[i]) for i in user if p.ops[i].mesh == mesh]
