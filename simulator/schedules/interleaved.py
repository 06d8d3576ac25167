"""Interleaved 1F1B: v model chunks (virtual stages) per rank, Megatron-LM order.

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", Sec. 2.2.2. S = v * P stages; stage s runs on rank ``s % P`` (rank r holds chunks
r, r + P, ..., r + (v-1)P). Each rank walks its ``v * M`` chunk-microbatches in groups of P
microbatches per chunk: the k-th forward is chunk ``(k mod vP) // P`` of microbatch
``(k // vP) * P + k mod P``; backwards walk the chunks in reverse. Rank r runs
``min(2(P - r - 1) + (v - 1)P, vM)`` warm-up forwards, then 1F1B pairs, then cool-down backwards.
This needs ``M % P == 0`` (Megatron-LM's condition for the interleaved schedule).

With uniform chunks (forward f, backward b per chunk, so a rank's whole-model forward is F = v f)
the pipeline bubble is ``(P - 1)(f + b) = (P - 1)/v * (F + B)`` (Narayanan et al. 2021, Sec.
2.2.2), i.e. a bubble fraction ``(P - 1)/(vM + P - 1)``. Rank 0 holds up to
``min((v + 1)P - 1, vM)`` chunk activations, i.e. ``P (1 + (P - 1)/(vP))`` times one rank's
per-microbatch activation (Korthikanti et al. 2022, "Reducing Activation Recomputation", Sec. 4.2.3).
"""

from __future__ import annotations

from dataclasses import replace

from ir import ScheduleTable

from .base import B, F, ScheduleError, check_sizes, make_table, no_forward_only
from .kind import ScheduleKind

NAME = "interleaved-1f1b"
A2A_NAME = "interleaved-1f1b-a2a"


def interleaved_1f1b(num_ranks: int, microbatches: int, *, virtual_stages: int = 2,
                     forward_only: bool = False) -> ScheduleTable:
    """Interleaved 1F1B with ``virtual_stages`` chunks per rank.

    Raises:
        ScheduleError: sizes below 1, ``virtual_stages < 2``, ``microbatches % num_ranks != 0``,
            or ``forward_only=True``.
    """
    check_sizes(NAME, num_ranks, microbatches)
    no_forward_only(NAME, forward_only)
    P, M, v = num_ranks, microbatches, virtual_stages
    if not isinstance(v, int) or isinstance(v, bool) or v < 2:
        raise ScheduleError(f"schedule {NAME!r}: virtual_stages={v!r} must be an int >= 2; "
                            f"use '1f1b' for one stage per rank")
    if M % P:
        raise ScheduleError(f"schedule {NAME!r}: microbatches={M} is not a multiple of "
                            f"num_ranks={P} (Megatron-LM's condition); use "
                            f"{(M // P + 1) * P} microbatches")
    total = v * M

    def chunk_mb(k: int, forward: bool) -> tuple[int, int]:
        within = k % (P * v)
        chunk = within // P
        if not forward:
            chunk = v - 1 - chunk
        return chunk, (k // (P * v)) * P + within % P

    order = []
    for r in range(P):
        def fwd(k: int):
            c, m = chunk_mb(k, True)
            return F(c * P + r, m)

        def bwd(k: int):
            c, m = chunk_mb(k, False)
            return B(c * P + r, m)

        warm = min(2 * (P - r - 1) + (v - 1) * P, total)
        frags = [fwd(k) for k in range(warm)]
        for i in range(total - warm):
            frags += [fwd(warm + i), bwd(i)]
        frags += [bwd(k) for k in range(total - warm, total)]
        order.append(frags)
    return make_table(NAME, P, M, [s % P for s in range(v * P)], order)


def _interleaved_ok(ranks: int, microbatches: int, virtual_stages: int) -> bool:
    return virtual_stages >= 2 and microbatches % ranks == 0   # Megatron-LM's condition


KINDS: tuple[ScheduleKind, ...] = (ScheduleKind(
    NAME, order=1,
    # Megatron-LM's warm-up 2 (P - p - 1) + (v - 1) P, plus the one in flight
    inflight=lambda P, p, M, v: [2 * (P - p - 1) + (v - 1) * P + 1],
    generate=lambda P, M, *, forward_only=False, virtual_stages=2, **_: interleaved_1f1b(
        P, M, virtual_stages=virtual_stages, forward_only=forward_only),
    stages_per_rank=lambda virtual_stages: virtual_stages, sizes_ok=_interleaved_ok,
    aliases=("1f1b-interleaved",), sync_exposed=True),)
"""Interleaved 1F1B: ``virtual_stages`` chunks per rank, M a multiple of P."""


def interleaved_1f1b_a2a(num_ranks: int, microbatches: int, *, virtual_stages: int = 2,
                         forward_only: bool = False) -> ScheduleTable:
    """Interleaved 1F1B whose steady-state forward and backward of different microbatches run
    as one merged pass, each one's expert-parallel all-to-alls under the other's compute:
    Megatron-Core's ``--overlap-moe-expert-parallel-comm`` with ``--delay-wgrad-compute``
    (Megatron-Bridge's ``moe_a2a_overlap``; the scheme of DeepSeek-V3 Technical Report, Sec.
    3.2.1, on Megatron's interleaved order). The fragment order is :func:`interleaved_1f1b`'s;
    the table's name tells the cost model to hide the all-to-alls
    (:attr:`ScheduleKind.hides_alltoall`)."""
    try:
        table = interleaved_1f1b(num_ranks, microbatches, virtual_stages=virtual_stages,
                                 forward_only=forward_only)
    except ScheduleError as e:      # the same sizes' error, under this schedule's name
        raise ScheduleError(str(e).replace(repr(NAME), repr(A2A_NAME), 1)) from None
    return replace(table, name=A2A_NAME)


KINDS += (ScheduleKind(
    A2A_NAME, order=10,
    # a merged pass holds one more microbatch's forward beside the backward it overlaps
    inflight=lambda P, p, M, v: [2 * (P - p - 1) + (v - 1) * P + 2],
    generate=lambda P, M, *, forward_only=False, virtual_stages=2, **_: interleaved_1f1b_a2a(
        P, M, virtual_stages=virtual_stages, forward_only=forward_only),
    stages_per_rank=lambda virtual_stages: virtual_stages, sizes_ok=_interleaved_ok,
    aliases=("1f1b-interleaved-a2a",), sync_exposed=True, hides_alltoall=True, searched=False),)
"""Interleaved 1F1B with the MoE all-to-alls overlapped (:func:`interleaved_1f1b_a2a`): named
only (``--schedule``, a validation row's ``schedule``), never searched: the merged passes' extra
activation memory is charged as one more microbatch in flight, not measured."""
