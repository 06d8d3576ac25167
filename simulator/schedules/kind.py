"""A pipeline schedule as one object: its generator, the sizes it takes, the stages it puts on each
rank, how many microbatches each rank holds, and how the planner treats it.

Each schedule module defines ``KINDS``, a tuple of :class:`ScheduleKind`; the package collects
every module's kinds (:data:`simulator.schedules.KINDS`), and the simulator, the planner (candidate
sizes, CP-SAT memory terms, bounds) and validation ask the registry. Adding a schedule is one new
module in ``simulator/schedules/`` with its ``KINDS``, and its tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ir import ScheduleTable

Inflight = Callable[[Any, Any, int, int], list]
"""``(P, p, M, v) -> terms``: the microbatch instances (a stage's forward of one microbatch) pipeline
rank ``p`` of ``P`` holds at its peak is the least of these terms and ``v M`` (``v`` the stages per
rank). ``P`` and ``p`` are ints, or CP-SAT integer variables in the planner's model, so each term is
linear in them."""


def _one(virtual_stages: int) -> int:
    return 1


def _any_size(ranks: int, microbatches: int, virtual_stages: int) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class ScheduleKind:
    """One schedule.

    Attributes:
        name: its name in plans, options and errors (``"1f1b"``).
        order: its place in the planner's search order (lower first; ties by name).
        generate: ``(num_ranks, microbatches, *, forward_only, virtual_stages, durations, comm) ->
            ScheduleTable`` (each generator takes what it needs of the keywords).
        inflight: :data:`Inflight`, the count the planner charges residual memory for; never below
            the exact replay's peak (``tests/planner/test_every_schedule.py``).
        stages_per_rank: ``virtual_stages -> stages each rank holds`` (S = P times this).
        sizes_ok: ``(ranks, microbatches, virtual_stages) -> bool``: the sizes the generator takes
            beyond ``>= 1`` (Megatron's interleaved ``M % P == 0``, DualPipeV's ``M >= 2P``).
        v_shaped: its 2P stages sit in a V (``v_shape_stage_rank``): the first and last stage on
            rank 0.
        split_backward: the backward is split into B (input gradient) and W (weight gradient).
        adaptive: built from the fragment durations (``durations``, ``comm``).
        fb_mergeable: the planner may merge the last stage's forward and backward (1F1B).
        sync_exposed: each rank ends on a whole pass of one microbatch's backward over its
            first stage (the lowest it holds; B, or W when the backward is split), during which
            that stage's gradient buckets become ready: what their sync outlasts that fragment is
            exposed (a bound term: :func:`planner.bounds.candidate_bound`;
            ``tests/simulator/test_schedules.py`` checks the generated tables end so).
        training: offered for training plans (inference plans use GPipe's forward).
        searched: tried by the planner's default search (else only when named, ``--schedule``).
        hides_alltoall: a mixture of experts' dispatch and combine all-to-alls run under another
            microbatch's compute (DualPipe's overlapped forward-backward pairs, DeepSeek-V3
            Technical Report, Sec. 3.2.1: "both all-to-all and PP communication can be fully
            hidden"), so a fragment pays ``overlapped(work, all-to-all)``, not their sum
            (``simulator.cost_model.layer_time``'s ``alltoall_hidden``).
        aliases: other names published runs use for it (``"1f1b-interleaved"``), which
            validation reads.
    """

    name: str
    order: int
    generate: Callable[..., ScheduleTable]
    inflight: Inflight
    stages_per_rank: Callable[[int], int] = _one
    sizes_ok: Callable[[int, int, int], bool] = _any_size
    v_shaped: bool = False
    split_backward: bool = False
    adaptive: bool = False
    fb_mergeable: bool = False
    sync_exposed: bool = False
    training: bool = True
    searched: bool = True
    aliases: tuple[str, ...] = ()
    hides_alltoall: bool = False

    def inflight_count(self, pos: int, ranks: int, microbatches: int, virtual_stages: int) -> int:
        """The instances rank ``pos`` of ``ranks`` holds at its peak (:attr:`inflight`, capped at
        ``v M``)."""
        v = self.stages_per_rank(virtual_stages)
        return min([*self.inflight(ranks, pos, microbatches, v), microbatches * v])
