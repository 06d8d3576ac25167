"""Lowering: a :class:`ir.ScheduleTable` plus cost callbacks -> a :class:`SimProgram`.

Dependencies (S stages, microbatch m):
    - ``F(s, m)`` after ``F(s-1, m)`` (s > 0): the activation.
    - ``B(S-1, m)`` after ``F(S-1, m)``; ``B(s, m)`` after ``B(s+1, m)`` (the gradient) and
      ``F(s, m)``.
    - ``W(s, m)`` after ``B(s, m)`` (split-backward schedules only).
    An activation or gradient crossing ranks becomes a :class:`SimTransfer` when ``boundary``
    returns a cost for it, else a plain dependency. Same-rank stage boundaries are plain deps.

Memory convention (per device of the mesh): ``F(s, m)`` allocates its ``residual_bytes`` when it
starts; the *last* backward fragment of ``(s, m)`` frees them when it ends: ``W(s, m)`` in
split-backward schedules (the weight gradient still needs the stored inputs), ``B(s, m)``
otherwise. In forward-only schedules each ``F`` frees its own ``residual_bytes`` when it ends
(a transient working set). Tail ops (DP all-reduce, optimizer) allocate nothing. So memory returns
to the baseline at the end of every lowered step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ir import FragmentRef, ScheduleTable
from ir.schedule import FragmentKind
from simulator.program import SimCollective, SimError, SimOp, SimProgram, SimTransfer


@dataclass(frozen=True, slots=True)
class FragmentCost:
    """Cost of one fragment on its rank's mesh: time (s), model FLOP, residual bytes per device,
    and the seconds its compute stream spends receiving its inputs first (blocking P2P, else 0).

    ``residual_bytes`` is read from F fragments only (what the forward keeps for the backward).
    """

    duration_s: float
    flops: float = 0.0
    residual_bytes: float = 0.0
    recv_s: float = 0.0


@dataclass(frozen=True, slots=True)
class BoundaryCost:
    """A cross-rank value: the link it uses, its bytes and its time on the link (s)."""

    link: str
    bytes: float
    duration_s: float


@dataclass(frozen=True, slots=True)
class TailOp:
    """A per-step op appended to a mesh's order: ``"allreduce"`` or ``"optimizer"``."""

    kind: str
    duration_s: float
    flops: float = 0.0


def _check_table(table: ScheduleTable, rank_mesh: tuple[str, ...]) -> None:
    if len(rank_mesh) != table.num_ranks:
        raise SimError(f"rank_mesh has {len(rank_mesh)} meshes for a {table.num_ranks}-rank "
                       f"schedule {table.name!r}; give one mesh per rank")
    if len(set(rank_mesh)) != len(rank_mesh):
        raise SimError(f"rank_mesh {list(rank_mesh)} repeats a mesh; give each rank its own mesh")
    kinds: tuple[FragmentKind, ...] = (
        (FragmentKind.F,) if table.forward_only
        else (FragmentKind.F, FragmentKind.B, FragmentKind.W) if table.split_backward
        else (FragmentKind.F, FragmentKind.B))
    seen: set[tuple[str, int, int]] = set()
    for r, frags in enumerate(table.order):
        for f in frags:
            key = (f.kind, f.stage, f.microbatch)
            if f.kind not in kinds:
                raise SimError(f"schedule {table.name!r} rank {r} has {f}, but a "
                               f"{'forward-only' if table.forward_only else 'split' if table.split_backward else 'plain'}"
                               f" schedule has only kinds {kinds}")
            if f.stage >= table.num_stages or f.microbatch >= table.microbatches:
                raise SimError(f"schedule {table.name!r} rank {r} has {f}, outside "
                               f"{table.num_stages} stages x {table.microbatches} microbatches")
            if table.stage_rank[f.stage] != r:
                raise SimError(f"schedule {table.name!r} puts {f} on rank {r}, but stage {f.stage} "
                               f"belongs to rank {table.stage_rank[f.stage]}")
            if key in seen:
                raise SimError(f"schedule {table.name!r} runs {f} twice; run each fragment once")
            seen.add(key)
    want = len(kinds) * table.num_stages * table.microbatches
    if len(seen) != want:
        for k in kinds:
            for s in range(table.num_stages):
                for m in range(table.microbatches):
                    if (k, s, m) not in seen:
                        raise SimError(f"schedule {table.name!r} never runs {k}{s}.{m}; "
                                       f"add it to rank {table.stage_rank[s]}'s order")


def lower_schedule(
    table: ScheduleTable,
    rank_mesh: tuple[str, ...],
    fragment: Callable[[int, FragmentRef], FragmentCost],
    boundary: Callable[[int, int, FragmentRef], BoundaryCost | None],
    tail: Callable[[str], tuple[TailOp, ...]] | None = None,
    baseline_bytes: Mapping[str, float] | None = None,
    capacity_bytes: Mapping[str, float] | None = None,
    peak_flops: float = 0.0,
    host_of: Mapping[str, str] | None = None,
    host_slots: Mapping[str, int] | None = None,
    grad_buckets: Callable[[int], tuple[tuple[str, str, float, float, float], ...]] | None = None,
    last_backward: Callable[[int], FragmentRef] | None = None,
    param_gather: Callable[[str], float] | None = None,
) -> SimProgram:
    """Lower ``table`` into a :class:`SimProgram` (see the module docstring for the rules).

    Args:
        table: the schedule; rank r runs on mesh ``rank_mesh[r]``.
        fragment: ``(rank, ref) -> FragmentCost`` for every fragment in the table.
        boundary: ``(src_stage, dst_stage, producer_ref) -> BoundaryCost | None`` for every
            cross-rank activation (``producer_ref`` = ``F(src_stage, m)``) and gradient
            (``producer_ref`` = ``B(src_stage, m)``); None means no modelled transfer.
        tail: ``mesh -> TailOps`` appended, in order, after all of the mesh's fragments.
        baseline_bytes / capacity_bytes: per-mesh static memory and capacity per device, bytes.
        peak_flops: cluster peak FLOP/s, for MFU.
        host_of / host_slots: meshes sharing a host and the host's concurrent-op slots.
        grad_buckets / last_backward: ``stage -> (name, collective, bytes, seconds, fraction)``
            gradient buckets, each a collective on the stage's mesh released once ``fraction`` of
            ``last_backward(stage)`` has run; the mesh's ``"allreduce"`` tail op waits for them
            all (with ``tail``).
        param_gather: ``mesh -> seconds`` of an all-gather collective after the mesh's last tail
            op (the optimizer); 0 adds none.

    Raises:
        SimError: a table inconsistent with its own stage_rank, kinds or sizes, or a bad rank_mesh.
    """
    _check_table(table, rank_mesh)
    S = table.num_stages
    ids: dict[tuple[str, int, int], int] = {}
    flat: list[tuple[int, FragmentRef]] = []
    for r, frags in enumerate(table.order):
        for f in frags:
            ids[f.kind, f.stage, f.microbatch] = len(flat)
            flat.append((r, f))
    costs = [fragment(r, f) for r, f in flat]
    free_kind = (None if table.forward_only
                 else FragmentKind.W if table.split_backward else FragmentKind.B)
    ops: list[SimOp] = []
    transfers: list[SimTransfer] = []

    def edge(src_stage: int, dst_stage: int, kind: FragmentKind, m: int, deps: list[int],
             inputs: list[int]) -> None:
        src = ids[kind, src_stage, m]
        rs, rd = table.stage_rank[src_stage], table.stage_rank[dst_stage]
        cost = None if rs == rd else boundary(src_stage, dst_stage, FragmentRef(kind, src_stage, m))
        if cost is None:
            deps.append(src)
            return
        inputs.append(len(transfers))
        transfers.append(SimTransfer(
            id=len(transfers), name=f"{'A' if kind == FragmentKind.F else 'G'}{src_stage}.{m}",
            src_op=src,
            src_mesh=rank_mesh[rs], dst_mesh=rank_mesh[rd], link=cost.link, bytes=cost.bytes,
            duration_s=cost.duration_s))

    for i, (r, f) in enumerate(flat):
        s, m = f.stage, f.microbatch
        deps: list[int] = []
        inputs: list[int] = []
        alloc = free = 0.0
        if f.kind == FragmentKind.F:
            if s > 0:
                edge(s - 1, s, FragmentKind.F, m, deps, inputs)
            alloc = costs[i].residual_bytes
            if free_kind is None:
                free = alloc
        elif f.kind == FragmentKind.B:
            if s < S - 1:
                edge(s + 1, s, FragmentKind.B, m, deps, inputs)
            deps.append(ids[FragmentKind.F, s, m])
        else:
            deps.append(ids[FragmentKind.B, s, m])
        if f.kind == free_kind:
            free = costs[ids[FragmentKind.F, s, m]].residual_bytes
        ops.append(SimOp(id=i, name=str(f), kind=f.kind, mesh=rank_mesh[r], stage=s, microbatch=m,
                         duration_s=costs[i].duration_s, deps=tuple(deps), inputs=tuple(inputs),
                         alloc_bytes=alloc, free_bytes=free, flops=costs[i].flops,
                         recv_s=costs[i].recv_s))
    order = {mesh: [ids[f.kind, f.stage, f.microbatch] for f in table.order[r]]
             for r, mesh in enumerate(rank_mesh)}
    colls: list[SimCollective] = []
    by_mesh: dict[str, list[int]] = {m: [] for m in rank_mesh}
    if grad_buckets is not None and last_backward is not None and not table.forward_only:
        pos = {oid: k for m in rank_mesh for k, oid in enumerate(order[m])}
        # (position of the op in its mesh order, fraction, arrival, name, kind, bytes, s, op id)
        pending: list[tuple[int, float, int, str, str, float, float, int]] = []
        for s in range(S):
            ref = last_backward(s)
            oid = ids[ref.kind, ref.stage, ref.microbatch]
            for name, kind, nbytes, secs, frac in grad_buckets(s):
                pending.append((pos[oid], frac, len(pending), name, kind, nbytes, secs, oid))
        for _, frac, _, name, kind, nbytes, secs, oid in sorted(pending):
            mesh = ops[oid].mesh
            by_mesh[mesh].append(len(colls))
            colls.append(SimCollective(id=len(colls), name=name, kind=kind, mesh=mesh,
                                       after_op=oid, after_fraction=frac, duration_s=secs,
                                       bytes=nbytes))
    if tail is not None:
        for mesh in rank_mesh:
            last = None
            for t in tail(mesh):
                i = len(ops)
                waits = tuple(by_mesh[mesh]) if t.kind == "allreduce" else ()
                ops.append(SimOp(id=i, name=f"{t.kind}@{mesh}", kind=t.kind, mesh=mesh, stage=-1,
                                 microbatch=-1, duration_s=t.duration_s, flops=t.flops,
                                 waits=waits))
                order[mesh].append(i)
                last = i
            secs = param_gather(mesh) if param_gather is not None else 0.0
            if last is not None and secs > 0:
                colls.append(SimCollective(id=len(colls), name=f"AG@{mesh}", kind="all_gather",
                                           mesh=mesh, after_op=last, after_fraction=1.0,
                                           duration_s=secs))
    return SimProgram(meshes=tuple(rank_mesh), order={k: tuple(v) for k, v in order.items()},
                      ops=tuple(ops), transfers=tuple(transfers),
                      baseline_bytes=dict(baseline_bytes or {}),
                      capacity_bytes=dict(capacity_bytes or {}), peak_flops=float(peak_flops),
                      host_of=dict(host_of or {}), host_slots=dict(host_slots or {}),
                      collectives=tuple(colls))
