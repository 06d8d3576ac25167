"""The simulator's input: a lowered program of compute ops and inter-mesh transfers (SI units).

A :class:`SimProgram` is what :func:`simulator.engine.simulate` replays. It is mesh-level, not
schedule-level: every op already knows its mesh, duration, memory effect and dependencies, and
every cross-mesh value is a :class:`SimTransfer` on a named link. ``simulator.lowering`` builds one
from a :class:`ir.ScheduleTable` plus cost callbacks; tests build them by hand.

Conventions:
    - ``SimOp.deps`` are ops (on any mesh) that must have *finished* before the op may start, with
      no data movement modelled; ``SimOp.inputs`` are transfers that must have *arrived*.
    - A transfer becomes ready when its ``src_op`` ends.
    - Memory is per device of a mesh: ``baseline_bytes[mesh]`` (parameters, gradients, optimizer
      state) + the ``alloc_bytes`` of every started op - the ``free_bytes`` of every finished op.
    - Each mesh also has a **collective stream**: its :class:`SimCollective` ops (data-parallel
      gradient reduce-scatters and all-reduces in buckets, the parameter all-gather after the
      optimizer) run there one after another, in list order, overlapping its compute. A collective
      becomes ready once ``after_fraction`` of its ``after_op`` has run (a bucket of gradients is
      ready part-way through the backward that produces it); ``SimOp.waits`` names collectives
      an op must wait for (the optimizer waits for its gradients).
    - ``link`` is the name of one contended resource. A full-duplex link whose two directions do
      not contend should be given two names (e.g. ``"a->b"`` and ``"b->a"``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ir.schedule import FragmentKind

OP_KINDS = (FragmentKind.F, FragmentKind.B, FragmentKind.W, "allreduce", "optimizer")
"""Kinds of compute op: forward, backward (input grad, or whole), weight grad, DP all-reduce, optimizer."""

COLLECTIVE_KINDS = ("reduce_scatter", "all_reduce", "all_gather")
"""Kinds of collective-stream op."""


class SimError(ValueError):
    """Base error of the ``simulator`` package (one-line message naming the bad value and the fix)."""


@dataclass(frozen=True, slots=True)
class SimOp:
    """One compute op on one mesh.

    Attributes:
        id: index into ``SimProgram.ops``.
        name: display name, e.g. ``"F3.7"`` (kind, stage, microbatch).
        kind: one of :data:`OP_KINDS`.
        mesh: the mesh whose compute stream runs it.
        stage / microbatch: pipeline stage and microbatch (-1 for per-step ops such as the optimizer).
        duration_s: compute time, s.
        deps: op ids that must finish before this op starts (same or other mesh, no transfer).
        inputs: transfer ids that must have arrived before this op starts.
        alloc_bytes: per-device bytes allocated on ``mesh`` when the op starts.
        free_bytes: per-device bytes freed on ``mesh`` when the op ends.
        flops: model FLOP of the op (whole mesh), for MFU.
        recv_s: seconds the mesh's compute stream spends receiving the op's inputs before it
            starts (blocking point-to-point: the receive runs on the compute stream, so the op
            starts no earlier than the previous op's end plus ``recv_s``); 0 for none.
    """

    id: int
    name: str
    kind: str
    mesh: str
    stage: int
    microbatch: int
    duration_s: float
    deps: tuple[int, ...] = ()
    inputs: tuple[int, ...] = ()
    alloc_bytes: float = 0.0
    free_bytes: float = 0.0
    flops: float = 0.0
    waits: tuple[int, ...] = ()
    recv_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SimCollective:
    """A collective on its mesh's collective stream.

    Attributes:
        id: index into ``SimProgram.collectives``.
        name: display name, e.g. ``"RS3.L12"`` (stage 3's gradient bucket of layer 12).
        kind: one of :data:`COLLECTIVE_KINDS`.
        mesh: the mesh whose collective stream runs it.
        after_op: the op whose progress releases it.
        after_fraction: it is ready once this fraction (0..1) of ``after_op``'s duration has run.
        duration_s: time on the stream, s.
        bytes: per-device buffer bytes (the collective's input; the output for an all-gather).
    """

    id: int
    name: str
    kind: str
    mesh: str
    after_op: int
    after_fraction: float
    duration_s: float
    bytes: float = 0.0


@dataclass(frozen=True, slots=True)
class SimTransfer:
    """One value moved from ``src_mesh`` to ``dst_mesh`` over ``link`` after op ``src_op`` ends.

    Attributes:
        id: index into ``SimProgram.transfers``.
        name: display name, e.g. ``"A3.7"`` (activation of stage 3, microbatch 7).
        src_op: the op producing the value (on ``src_mesh``).
        link: name of the contended link resource.
        bytes: bytes moved.
        duration_s: time on the link (latency + bytes / bandwidth), s.
    """

    id: int
    name: str
    src_op: int
    src_mesh: str
    dst_mesh: str
    link: str
    bytes: float
    duration_s: float


@dataclass(frozen=True, slots=True)
class SimProgram:
    """A complete step to replay.

    Attributes:
        meshes: mesh names, in display order.
        order: mesh -> its compute order (op ids); every op appears in exactly one mesh's order,
            exactly once, and on its own mesh.
        ops: all ops, ``ops[i].id == i``.
        transfers: all transfers, ``transfers[i].id == i``.
        baseline_bytes: mesh -> static per-device memory (params, grads, optimizer state), bytes.
        capacity_bytes: mesh -> per-device memory capacity, bytes (missing: unbounded).
        peak_flops: cluster peak FLOP/s (for MFU; 0 disables MFU).
        host_of: mesh -> host it shares compute with (missing: its own devices).
        host_slots: host -> ops that may run at once on it (missing host: 1 slot).

    Raises:
        SimError: an inconsistent program (the message names the op, transfer or mesh).
    """

    meshes: tuple[str, ...]
    order: Mapping[str, tuple[int, ...]]
    ops: tuple[SimOp, ...]
    transfers: tuple[SimTransfer, ...] = ()
    baseline_bytes: Mapping[str, float] = field(default_factory=dict)
    capacity_bytes: Mapping[str, float] = field(default_factory=dict)
    peak_flops: float = 0.0
    host_of: Mapping[str, str] = field(default_factory=dict)
    host_slots: Mapping[str, int] = field(default_factory=dict)
    collectives: tuple[SimCollective, ...] = ()

    def __post_init__(self) -> None:
        meshes = set(self.meshes)
        if len(meshes) != len(self.meshes):
            raise SimError(f"SimProgram.meshes {list(self.meshes)} has duplicates; name each mesh once")
        extra = sorted(set(self.order) - meshes)
        if extra:
            raise SimError(f"SimProgram.order names mesh {extra[0]!r}, not in meshes {list(self.meshes)}")
        n, nt = len(self.ops), len(self.transfers)
        for i, op in enumerate(self.ops):
            if op.id != i:
                raise SimError(f"op {op.name!r} has id {op.id} at position {i}; ids must equal positions")
            if op.mesh not in meshes:
                raise SimError(f"op {op.name!r} runs on unknown mesh {op.mesh!r}; add it to meshes")
            if op.kind not in OP_KINDS:
                raise SimError(f"op {op.name!r} has kind {op.kind!r}; use one of {OP_KINDS}")
            if not (op.duration_s >= 0 and op.alloc_bytes >= 0 and op.free_bytes >= 0
                    and op.recv_s >= 0):
                raise SimError(f"op {op.name!r}: duration_s, alloc_bytes, free_bytes and recv_s "
                               f"must be >= 0")
            for d in op.deps:
                if not 0 <= d < n or d == i:
                    raise SimError(f"op {op.name!r} depends on op {d}, which is not another op id")
            for t in op.inputs:
                if not 0 <= t < nt:
                    raise SimError(f"op {op.name!r} takes input transfer {t}, which does not exist")
            for c in op.waits:
                if not 0 <= c < len(self.collectives):
                    raise SimError(f"op {op.name!r} waits for collective {c}, which does not exist")
        for i, col in enumerate(self.collectives):
            if col.id != i:
                raise SimError(f"collective {col.name!r} has id {col.id} at position {i}; "
                               f"ids must equal positions")
            if col.kind not in COLLECTIVE_KINDS:
                raise SimError(f"collective {col.name!r} has kind {col.kind!r}; use one of "
                               f"{COLLECTIVE_KINDS}")
            if col.mesh not in meshes:
                raise SimError(f"collective {col.name!r} runs on unknown mesh {col.mesh!r}")
            if not 0 <= col.after_op < n:
                raise SimError(f"collective {col.name!r} follows op {col.after_op}, which is not an "
                               f"op id")
            if not 0.0 <= col.after_fraction <= 1.0:
                raise SimError(f"collective {col.name!r}: after_fraction {col.after_fraction!r} "
                               f"must be in [0, 1]")
            if not col.duration_s >= 0 or not col.bytes >= 0:
                raise SimError(f"collective {col.name!r}: bytes and duration_s must be >= 0")
        for i, tr in enumerate(self.transfers):
            if tr.id != i:
                raise SimError(f"transfer {tr.name!r} has id {tr.id} at position {i}; "
                               f"ids must equal positions")
            if not 0 <= tr.src_op < n:
                raise SimError(f"transfer {tr.name!r} has src_op {tr.src_op}, which is not an op id")
            if self.ops[tr.src_op].mesh != tr.src_mesh:
                raise SimError(f"transfer {tr.name!r}: src_mesh {tr.src_mesh!r} differs from its "
                               f"src_op's mesh {self.ops[tr.src_op].mesh!r}")
            if tr.dst_mesh not in meshes:
                raise SimError(f"transfer {tr.name!r} goes to unknown mesh {tr.dst_mesh!r}")
            if not tr.duration_s >= 0 or not tr.bytes >= 0:
                raise SimError(f"transfer {tr.name!r}: bytes and duration_s must be >= 0")
        seen = [False] * n
        for m, ids in self.order.items():
            for i in ids:
                if not 0 <= i < n:
                    raise SimError(f"order of mesh {m!r} names op {i}, which does not exist")
                if seen[i]:
                    raise SimError(f"op {self.ops[i].name!r} appears twice in the per-mesh orders")
                if self.ops[i].mesh != m:
                    raise SimError(f"op {self.ops[i].name!r} of mesh {self.ops[i].mesh!r} is in the "
                                   f"order of mesh {m!r}")
                seen[i] = True
        if not all(seen):
            i = seen.index(False)
            raise SimError(f"op {self.ops[i].name!r} is in no mesh's order; add it to "
                           f"order[{self.ops[i].mesh!r}]")
        for h, s in self.host_slots.items():
            if int(s) < 1:
                raise SimError(f"host {h!r} has {s} slots; give it at least 1")

    @property
    def total_flops(self) -> float:
        """Sum of the ops' model FLOP."""
        return sum(op.flops for op in self.ops)
