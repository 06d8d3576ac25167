"""Lower bounds on a carved pipeline's step time, valid for every layer partition, layout and
schedule the planner may choose (:func:`candidate_bound`, :func:`quick_bound`).

The shape search (:mod:`planner.shapes`) prunes by them, so they must never exceed a plan it could
produce: ``tests/planner/test_shapes.py`` checks them against every plan of small instances
(brute force) and random plans of larger ones.
"""

from __future__ import annotations

import bisect
import math
from typing import Sequence

from ir import LayerCost, Workload
from hardware_profiles.types import (Cluster, DeviceProfile, MeshSpec, straggler_factor,
                                     straggler_hosts)
from simulator.schedules import kind
from planner.level import Rank, block_capacity, least_feasible, water_level
from simulator.stage_cost import StageCost


def _ranks(options: Sequence[Sequence[StageCost]], inflight: Sequence[int], virtual_stages: int,
           microbatches: int, *, chain: bool = False, merge: bool = False,
           post_rank: int | None = None, ends: tuple[int, int] = (0, 0),
           straggler: Sequence[float] = (), sync_exposed: bool = False) -> list[Rank]:
    """Per rank, for :func:`water_level`. Work ranks (``chain`` False): step cost ``M x T + tail``:
    fixed ``M x`` (overhead, the first rank's pre-block layers, ``post_rank``'s post-block layers),
    per block ``M x block + the tail one more block adds`` (a stage's all-reduce pays its latency
    once). Chain ranks: the rank's critical work between its first forward and its last backward:
    all its fragments except the weight gradients it may still owe after its last backward, at most
    its in-flight count of chunk instances (each W waits on a held activation): per block ``M x
    block - min(M v, in-flight) x W / v``, plus the F and B dispatches, plus what one more block
    adds to the optimizer step and parameter all-gather that follow the rank's last fragment
    (``tail_marginal_s``); its chain seconds per block are F and B (the path through the rank).
    Memory: the most blocks an option holds with ``inflight[r]`` chunk instances of residuals,
    after the pre/post layers' weights and ``ends`` (first, last stage) instances of their
    residuals on the ranks holding them (the CP-SAT model's own memory terms). ``straggler[r]``:
    rank ``r``'s straggler wait as a share of its work (work ranks only: the gradient sync waits
    that long after its last fragment, :meth:`simulator.plan_costs.PlanCosts.straggler_wait`).
    ``sync_exposed``: every rank's last fragment is a whole backward (B, or W when split) of its
    first stage, which holds ``1/v`` of its blocks (``ScheduleKind.sync_exposed``): a work rank's
    step is also at least its work plus what that stage's gradient sync outlasts the fragment
    (``StageCost.sync_excess_s`` per block of the stage, ``sync_offset_s``), a second constraint
    on its blocks."""
    out = []
    last = len(options) - 1
    m, v = microbatches, virtual_stages
    for r, opts in enumerate(options):
        split = any(o.block_w_s > 0 for o in opts)
        fixed = least = min(o.overhead_s for o in opts)
        share = 2 / 3 if chain and split else 1.0
        if chain:
            # on the path: the F and B dispatches only; pre/post layers left out (their weight
            # gradients may be owed after the last backward)
            fixed *= share
        else:
            if r == 0:
                fixed += min(o.pre_s for o in opts)
            if r == post_rank:           # the layers after the blocks (the LM head)
                fixed += min(o.post_s for o in opts)
        least_pre = min(o.pre_s for o in opts) if not chain and r == 0 else 0.0
        least_post = min(o.post_s for o in opts) if not chain and r == post_rank else 0.0
        if merge and r == last:          # the last stage's F and B may share one dispatch
            fixed = max(0.0, fixed - max(o.merge_saving_s for o in opts))
        per = []
        owed = min(m * v, inflight[r]) / v
        slow = 1.0 if chain or r >= len(straggler) else 1.0 + straggler[r]
        for o in opts:
            need = o.block_bytes(v, inflight[r])
            # less the layers before the blocks and their residuals on the first rank, and the
            # layers after them on the rank holding them (the last, or the first in a V)
            room = o.room_bytes(first=r == 0, holds_post=r == post_rank,
                                first_instances=ends[0], post_instances=ends[1])
            cap = math.inf if need <= 0 else max(0.0, math.floor(room / need))
            # the option's own fixed seconds beyond the rank's least (e.g. FSDP's exposed gathers)
            own = (o.overhead_s - least) * share
            if not chain and r == 0:
                own += o.pre_s - least_pre
            if not chain and r == post_rank:
                own += o.post_s - least_post
            extra = m * own * slow
            if chain:
                # after its last backward the rank still runs its optimizer (and the parameter
                # all-gather after it): the tail no overlap hides, as in the work term
                per.append((m * o.block_s - owed * o.block_w_s + o.tail_marginal_s,
                            o.block_s - o.block_w_s, cap, extra, 0.0, 0.0))
            else:
                # the gradient buckets exposed past the last backward (one stage per rank, its
                # last B the rank's last fragment: a last stage that may merge F and B is left out)
                sync = sync_exposed and not (merge and r == last)
                # (its first stage holds 1/v of the rank's blocks)
                per.append((slow * m * o.block_s + o.tail_marginal_s, o.block_s, cap, extra,
                            o.sync_excess_s / v if sync else 0.0, o.sync_offset_s if sync else 0.0))
        out.append((slow * m * fixed, fixed, tuple(per)))
    return out


def candidate_bound(work: Sequence[Sequence[StageCost]], critical: Sequence[Sequence[StageCost]],
                    microbatches: int, num_blocks: int, chain: float, inflight: Sequence[int],
                    virtual_stages: int = 1, mergeable: bool = False, comm: Sequence[float] = (),
                    post_rank: int | None = None, ends: tuple[int, int] = (0, 0),
                    straggler: Sequence[float] = (), sync_exposed: bool = False,
                    v_shaped: bool = False, orders: Sequence[tuple[int, int]] | None = None,
                    every_rank: bool = False) -> float:
    """A lower bound on the step time of a pipeline over meshes with these options, seconds,
    valid for every layer partition and layout the CP-SAT model admits (Narayanan et al. SC'21
    sec. 2.2 give the uniform case it generalises).

    - Work: every schedule runs each mesh's fragments one after another, so the step is at
      least the busiest mesh's ``M x T_m`` (``T_m``: its per-microbatch work, ``work`` options: all
      fragment kinds), where a mesh holding ``n`` blocks can only use a layout whose weights,
      gradients, optimizer state and ``inflight`` residuals of ``n`` blocks fit its memory.
    - Chain (``chain > 0``, schedules whose stage ``r`` runs on rank ``r``): rank ``r`` cannot start
      before microbatch 0's forward has crossed ranks ``0..r-1`` and cannot end before the last
      microbatch's backward has crossed them back, so the step is at least
      ``chain x S_r + C_r`` with ``C_r`` its critical work (every fragment but the weight
      gradients it may still owe after its last backward, at most its in-flight count) and ``S_r``
      the F and B time of the ranks before it (``critical`` options are no longer used: kept for
      the signature). ``chain`` is 1 for one stage per rank, ``1/v`` for ``v`` interleaved
      chunks, 1/2 for V-shaped placements (:func:`_chain`).

    Both are minimised over integer partitions (:func:`water_level`: whole blocks per rank, a
    multiple of the virtual stages; a water level filled greedily in pipeline order); in the work
    term each mesh also pays, after its last fragment, the end-of-step gradient sync and optimizer
    time of its blocks under the same option (``step >= M x T_m + tail_m``). ``inf`` when no
    partition fits memory. ``comm``: per boundary, the forward plus backward transfer seconds on
    the chain's path; ``post_rank``: the rank holding the post-block layers (the last for a line,
    the first for a V); ``ends``: residual instances of the first and last stage their ranks hold
    (:func:`planner.inflight.inflight_end_counts`); ``straggler``: per rank, ``straggler_factor -
    1`` of its device over the pipeline's hosts (the gradient sync waits that share of the rank's
    work for the slowest host, after its last fragment: the work term becomes ``(1 + straggler) x M
    x T_m + tail_m``; :func:`straggler_shares`); ``sync_exposed``: the schedule ends each rank on a
    whole backward (B or W) of its first stage (:func:`_ranks`).
    - Fill (:func:`fill_level`): rank 0's backwards wait for one microbatch's forward over the
      whole pipeline (and, in a line, its backward back to rank 0's last chunk), coupled with
      the work of the other ranks over the blocks rank 0 leaves them; ``v_shaped``: the schedule
      puts the first and last stage on rank 0.
    - Fill of every rank (:func:`line_fill_level`, one stage per rank): each rank's backwards
      wait for one microbatch's round trip through the ranks after it, and its last backward's
      input gradient still crosses the ranks before it; ``orders``: per rank, the forwards after
      its first B and the W's before its last B in the schedule's order
      (:func:`planner.inflight.rank_order_counts`; None: from the in-flight count).

    ``every_rank``: the pipeline uses every rank, each holding at least one block per stage (the
    shape search's pipelines: :func:`planner.candidate.solve_schedule` fixes the order and uses
    every mesh), so no partition leaves a rank idle; without it a rank may hold none.
    """
    least = virtual_stages if every_rank else 0
    work_ranks = _ranks(work, inflight, virtual_stages, microbatches, merge=mergeable,
                        post_rank=post_rank, ends=ends, straggler=straggler,
                        sync_exposed=sync_exposed)
    level = water_level(work_ranks, num_blocks, 0.0, virtual_stages, least=least)
    if chain > 0 and level < math.inf and all(o.block_f_s > 0 for opts in work for o in opts):
        # the work term again, each rank idle until microbatch 0's forward reaches it
        level = max(level, water_level(_started(work_ranks, work), num_blocks, chain,
                                       virtual_stages, [c / 2 for c in comm], least))
    if chain > 0 and level < math.inf:
        level = fill_level(work, work_ranks, microbatches, num_blocks, virtual_stages, v_shaped,
                           level, inflight[0] if inflight else None, least)
    if chain > 0 and level < math.inf and virtual_stages == 1 and not v_shaped:
        level = line_fill_level(work, work_ranks, microbatches, num_blocks, inflight, comm, level,
                                orders, least)
    if chain > 0 and level < math.inf:
        chained = _ranks(work, inflight, virtual_stages, microbatches, chain=True,
                         merge=mergeable, post_rank=post_rank, ends=ends)
        level = max(level, water_level(chained, num_blocks, chain, virtual_stages, comm, least))
    return level


def _started(work_ranks: Sequence[Rank], work: Sequence[Sequence[StageCost]]) -> list[Rank]:
    """``work_ranks`` (:func:`_ranks`, work terms) with each option's chain seconds per block its
    forward alone (``block_f_s``) and no fixed chain seconds: with them :func:`water_level` bounds
    the step by every rank's whole work (and tail) after the time microbatch 0's forward takes to
    reach its first stage. Every fragment of rank ``r`` depends on some microbatch's forward over
    the stages before its first, and each microbatch's forward crosses those stages' blocks, so
    rank ``r`` starts no earlier than ``chain x S_r`` (the blocks of the ranks before it at the
    least forward seconds of any) and runs all its work after that. The forward's transfers are
    half the round trip's ``comm``; the dispatches and the layers before the blocks on the path
    are left out (each only adds)."""
    return [(fixed, 0.0, tuple((step, o.block_f_s, cap, extra, more, off)
                               for (step, _, cap, extra, more, off), o in zip(per, opts)))
            for (fixed, _, per), opts in zip(work_ranks, work)]


def fill_level(work: Sequence[Sequence[StageCost]], work_ranks: Sequence[Rank], microbatches: int,
               num_blocks: int, virtual_stages: int, v_shaped: bool, level: float = 0.0,
               held_first: int | None = None, least: int = 0) -> float:
    """A lower bound on the step from the pipeline's fill, coupled with the work of the ranks after
    the first (seconds), or ``level`` (a bound already known) when it is no higher; ``level``
    also when an option lacks its forward time ``block_f_s`` or the schedule has no backward.

    Rank 0's first backward fragment (B of its last chunk in pipeline order) waits for one
    microbatch's forward over every chunk, then (in a line) that microbatch's input-gradient
    backward over the chunks after it (the last round's, on ranks ``1..p-1``): ``t0 >= sum of
    the forward over all blocks + the B of the last-round chunks``, whichever microbatch it is
    (each depends on the one before it). Every B and W of rank 0 runs after ``t0``, and in a V
    (rank 0 holds the first and the last stage) so do ``M - 1`` of its last stage's forwards
    (every generated schedule runs a stage's microbatches in order; the first of them ends at
    ``t0``). So with ``n`` blocks on rank 0 under option ``o`` (fitting its memory):
    ``step >= n f_o + (L - n) f_min + [line] (L - n) / v x b_min + M n (block_o - f_o) +
    n tail_o + [V] (M - 1) (n / 2 x f_o + post_o)`` plus the B and W dispatches (``f``, ``b``: F
    and input-gradient B per block and microbatch, the minima over the other ranks' options;
    ``tail``: what a block adds to the optimizer step and parameter gather after the rank's last
    fragment; ``post``: the layers after the blocks, all of whose fragments run on rank 0 after
    ``t0`` in a V), and the other ranks must hold ``L - n`` blocks:
    ``step >= work level of ranks 1..p-1`` (:func:`water_level`, no chain). The bound is the least
    over ``n`` (multiples of ``v``) of the larger of the two: the first rises with ``n`` (taken
    as its least over ``n' >= n``, which keeps it a bound), so at a step ``tau`` rank 0 takes
    the most blocks it allows and the others must hold the rest (:func:`block_capacity`); a
    bisection on ``tau`` above ``level`` finds the least feasible one. The layers before the
    blocks, transfers and the F dispatches before ``t0`` are left out (each only adds).

    ``held_first``: the most chunk instances whose residuals rank 0 holds at once under the
    schedule (:func:`planner.inflight.inflight_count`, never below the replay's peak). No
    residual of rank 0 is freed before its first backward, so at most that many of its ``v M``
    chunk forwards start before ``t0``: the other ``v M - held_first`` (``n / v`` blocks and one
    dispatch each) run after it, which replaces the V's ``M - 1`` when larger (Narayanan et al.
    2021, sec. 2.2: 1F1B's warm-up is the in-flight count). ``least``: blocks every rank holds at
    least (rank 0 then holds at most ``L - (p - 1) least``)."""
    if len(work) < 2 or any(o.block_f_s <= 0 for opts in work for o in opts):
        return level
    if any(o.block_s - o.block_f_s <= 0 for opts in work for o in opts):
        return level         # no backward (a forward-only plan): no fill to wait for
    m, v, L = microbatches, virtual_stages, num_blocks
    f_min = min(o.block_f_s for opts in work[1:] for o in opts)
    b_min = min(o.block_b_s for opts in work[1:] for o in opts)
    caps = [opt[2] for opt in work_ranks[0][2]]
    kinds = 3 if any(o.block_w_s > 0 for o in work[0]) else 2
    dispatch = min(o.merge_saving_s for o in work[0])   # one fragment's dispatch (no FSDP share)
    # rank 0's fragments after t0 beyond its blocks' B and W: every B and W dispatch, the chunk
    # forwards its residual memory cannot hold before t0 (in a V at least its last stage's M - 1)
    # with their dispatches, and in a V the layers after the blocks (M - 1 x all their fragments)
    late = max((m - 1) if v_shaped else 0, m * v - held_first if held_first is not None else 0)
    fixed_after = m * v * dispatch * (kinds - 1) + late * dispatch
    counts = range(least, L - (len(work) - 1) * least + 1, v)
    fill = []
    for n in counts:
        best = math.inf
        for o, cap in zip(work[0], caps):
            if n > cap:
                continue
            t0 = n * o.block_f_s + (L - n) * f_min + (0.0 if v_shaped else (L - n) / v * b_min)
            after = (m * n * (o.block_s - o.block_f_s) + n * o.tail_marginal_s + fixed_after
                     + late * n / v * o.block_f_s + ((m - 1) * o.post_s if v_shaped else 0.0))
            best = min(best, t0 + after)
        fill.append(best)
    for i in range(len(fill) - 2, -1, -1):      # the least over n' >= n: non-decreasing in n
        fill[i] = min(fill[i], fill[i + 1])
    held = block_capacity(work_ranks[1:], 0.0, v, (), L, least)

    def feasible(tau: float) -> bool:
        """Rank 0 takes the most blocks its fill allows at ``tau``; the others hold the rest."""
        i = bisect.bisect_right(fill, tau) - 1
        return i >= 0 and held(tau) >= L - counts[i]

    if feasible(level):
        return level             # no better than the level it is checked against
    got = least_feasible(feasible, level, max(level, 1e-6) * 2, 1e12 * max(level, 1.0))
    return level if got == math.inf else got    # nothing fits: the work level already says so


def line_fill_level(work: Sequence[Sequence[StageCost]], work_ranks: Sequence[Rank],
                    microbatches: int, num_blocks: int, inflight: Sequence[int],
                    comm: Sequence[float] = (), level: float = 0.0,
                    orders: Sequence[tuple[int, int]] | None = None, least: int = 0) -> float:
    """A lower bound on the step of a pipeline with one stage per rank in a line (1F1B, GPipe,
    ZB-H1/H2, ZB-1p/2p), from every rank's fill and drain at once (seconds), or ``level`` when it
    is no higher; ``level`` also when an option lacks ``block_f_s`` or there is no backward.

    Every generated schedule runs a stage's microbatches in order, so rank ``r``'s first backward
    (microbatch 0's B) starts no earlier than ``t_r``: microbatch 0's forward over the ``P``
    blocks of the ranks before ``r`` and over its own ``n``, then its forward and input-gradient
    backward over the ``L - P - n`` blocks after it, with the transfers at the boundaries after
    ``r`` (``comm``, both ways). After ``t_r`` the rank runs the forwards its order puts after its
    first B (``orders[r][0]``; without an order, those its residual memory cannot hold before
    ``t_r``: ``M - inflight[r]``), its ``M`` input-gradient backwards and its ``M`` weight
    gradients (with their dispatches). Its last B's gradient then crosses the ``P`` blocks before
    it (the drain), which only its weight gradients after that last B (all but ``orders[r][1]``)
    and its end-of-step tail may overlap. With option ``o`` (``f_o``, ``b_o``, ``w_o``: F, B and
    W per block and microbatch; ``f``, ``b`` the least of any rank)::

        step >= P f + n f_o + (L - P - n)(f + b) + hops_r + late n f_o + M n b_o
                + max(P b + early n w_o, M n w_o + n tail_o)

    The layers outside the blocks add ``(1 + late)`` x all their fragments on their rank (their F
    and B precede the last B only when the backward is not split). A longer prefix ``P`` never
    tightens a rank's constraint (its coefficient is 0 or ``-b``), so filling the ranks in
    pipeline order with the most blocks each allows at ``tau`` (intersected with its work term)
    holds the most blocks in all: that greedy decides feasibility, and a bisection on ``tau``
    above ``level`` finds the bound. Transfers before ``r``, the layers before the blocks' own
    forwards and the straggler wait are left out (each only adds). For uniform stages and
    ``late = M - (P - r)`` (1F1B) the last rank's term is ``(M + P - 1) T`` with the blocks split
    evenly (Narayanan et al. 2021, sec. 2.2). ``least``: blocks every rank holds at least (the
    greedy then leaves that many for each later rank: a shorter prefix for them, which the
    greedy's longest prefixes still dominate)."""
    if len(work) < 2 or any(o.block_f_s <= 0 for opts in work for o in opts):
        return level
    if any(o.block_s - o.block_f_s <= 0 for opts in work for o in opts):
        return level
    m, L, p = microbatches, num_blocks, len(work)
    f = min(o.block_f_s for opts in work for o in opts)
    b = min(o.block_b_s for opts in work for o in opts)
    prepared = []
    for r, opts in enumerate(work):
        late, early = orders[r] if orders else (m - min(inflight[r], m), 0)
        kinds = 3 if any(o.block_w_s > 0 for o in opts) else 2
        dispatch = 0.0 if r == p - 1 else min(o.merge_saving_s for o in opts)   # one dispatch
        after = m * dispatch * (kinds - 1) + late * dispatch
        after += sum(comm[q] for q in range(r, min(len(comm), p - 1)))
        rows = []
        for o, (_, _, cap, _, _, _) in zip(opts, work_ranks[r][2]):
            b_o = o.block_b_s
            own = (1 + late) * o.block_f_s + m * b_o - f - b      # net of the path it replaces
            # the layers outside the blocks on their rank, (1 + late) x all their fragments:
            # their F and B precede the rank's last B, their W (when split) may not
            ends = (1 + late) * ((o.pre_s if r == 0 else 0.0) + (o.post_s if r == p - 1 else 0.0))
            drained = ends if o.block_w_s == 0 else 0.0
            rows.append((own + early * o.block_w_s, drained,
                         own + m * o.block_w_s + o.tail_marginal_s, ends, cap))
        prepared.append((after, tuple(rows), block_capacity([work_ranks[r]], 0.0, 1, (), L)))

    def feasible(tau: float) -> bool:
        pre = 0
        for r, (after, rows, held) in enumerate(prepared):
            base = after + pre * f + (L - pre) * (f + b)     # the path with no block of its own
            drain = pre * b if r > 0 else None               # nothing before rank 0: no drain
            best = -1
            for s1, c1, s2, c2, cap in rows:
                room2 = tau - base - c2
                room1 = tau - base - (drain + c1 if drain is not None else 0.0)
                if room1 < 0 or room2 < 0:
                    continue
                k = min(room1 / s1 if drain is not None and s1 > 0 else math.inf,
                        room2 / s2 if s2 > 0 else math.inf, cap, L)
                best = max(best, math.floor(k * (1 + 1e-12)))
            take = min(best, held(tau), L - least * (p - 1 - r) - pre)
            if take < least:                             # -1: no option fits
                return False
            pre += take
            if pre >= L:
                return True
        return pre >= L

    if feasible(level):
        return level
    got = least_feasible(feasible, level, max(level, 1e-6) * 2, 1e12 * max(level, 1.0))
    return level if got == math.inf else got


def straggler_shares(specs: Sequence[MeshSpec]) -> tuple[float, ...]:
    """Per pipeline rank (mesh ``specs`` in order), ``straggler_factor - 1`` over the hosts the
    pipeline's meshes form (:func:`hardware_profiles.types.straggler_hosts`) with that rank's
    device's ``sync_jitter``: what :meth:`simulator.plan_costs.PlanCosts.straggler_wait` charges,
    as a share of the rank's work."""
    hosts = straggler_hosts(specs)
    return tuple(straggler_factor(hosts, s.device.sync_jitter) - 1.0 for s in specs)


def chain_share(sched: str, virtual_stages: int) -> float:
    """The chain coefficient of :func:`candidate_bound`: the share of a rank's per-microbatch work
    in the stage that microbatch 0's forward (and the last backward) crosses on its way to a later
    rank: the whole rank with one stage per rank, one chunk of ``v`` interleaved, one of 2 in a V
    (rank ``r``'s first-chunk stage ``r`` lies on the forward path to every later rank, and the
    last microbatch's backward leaves rank ``r`` through it, after all of rank ``r``'s other
    backwards: every generated schedule runs a stage's microbatches in order)."""
    return 1.0 / kind(sched).stages_per_rank(virtual_stages)


def quick_bound(work: Sequence[Sequence[StageCost]], microbatches: int, num_blocks: int) -> float:
    """A cheap lower bound, never above :func:`candidate_bound`: the fluid work bound without
    memory, ``M x tau`` with ``sum_r (tau - f_r) / b_r = L`` left unclamped (a negative term only
    lowers ``tau``)."""
    b = [min(o.block_s for o in x) for x in work]
    f = [min(o.overhead_s for o in x) for x in work]
    f[0] += min(o.pre_s for o in work[0])
    f[-1] = max(0.0, f[-1] - max(o.merge_saving_s for o in work[-1]))
    inv = sum(1.0 / x for x in b if x > 0)
    tau = (num_blocks + sum(fi / bi for fi, bi in zip(f, b) if bi > 0)) / inv if inv else 0.0
    return microbatches * max(0.0, tau)


def layer_work_per_sample(cost: LayerCost, device: DeviceProfile, dtype: str, training: bool,
                          precision: str = "") -> float:
    """A lower bound on the device-seconds one sample of one layer costs on ``device`` under any
    layout, microbatch and schedule (s): the cost model's own terms that grow with the samples,
    at their most favourable. Per device, :func:`simulator.cost_model.layer_time` charges
    ``FLOP / (d t) / (rate x utilisation)`` (utilisation at most 1), per-sample bytes
    ``/ (d t) / bandwidth`` combined with it by the device's roofline, and the unfused elementwise
    bytes; its ``d x t`` devices therefore spend at least ``FLOP / rate`` and the rest per sample
    in all. Everything else it charges (weights streamed, collectives, FSDP gathers, dispatch and
    fixed times per layer, recomputation) is at least 0 and left out. Forward plus (when
    ``training``) the whole backward at ``backward_efficiency`` x the rate. Under a low-precision
    ``precision`` recipe the rate is the faster of its GEMM rate and the compute dtype's (the
    attention core stays at the latter)."""
    from simulator.cost_model import combine_work, layer_recipe
    rate = device.achievable_flops(dtype)
    low = layer_recipe(cost, precision)
    if low is not None:
        rate = max(rate, device.format_rate(low.name, dtype))
    bw = device.achievable_bandwidth

    def part(flops: float, nbytes: float, other: float, r: float) -> float:
        return (combine_work(flops / r, nbytes / bw, device.roofline)
                + device.elementwise_traffic * other / bw)
    out = part(cost.fwd_flops_per_sample, cost.fwd_bytes_per_sample, cost.fwd_other_bytes_per_sample,
               rate)
    if training:
        out += part(cost.bwd_flops_per_sample, cost.bwd_bytes_per_sample,
                    cost.bwd_other_bytes_per_sample, rate * device.backward_efficiency)
    return out


def work_bound(w: Workload, cluster: Cluster, groups: Sequence[str]) -> float:
    """A lower bound on the step time of any plan of workload ``w`` on node ``groups`` of
    ``cluster``, seconds: every sample of every layer is run on some device, costing it at least
    :func:`layer_work_per_sample`, and a group of ``N`` devices has ``N x step`` device-seconds.
    The least ``step`` for which the layers' samples can be shared out so (a linear program over
    the share of each distinct layer on each group, solved by HiGHS) is the bound: tighter than
    the FLOP bound because it charges what the cost model charges for the backward, the unfused
    elementwise traffic and memory-bound layers, on each kind, and lets each kind take the layers
    it runs best. Lowered by one part in 10^6 against the solver's tolerance."""
    import numpy as np
    from scipy.optimize import linprog
    from simulator.cost_model import compute_dtype

    dtype = compute_dtype(w)
    counts: dict[str, int] = {}
    for name in w.layers:
        counts[name] = counts.get(name, 0) + 1
    layers, gs = list(counts), list(groups)
    if not layers or not gs:
        return 0.0
    e = np.array([[layer_work_per_sample(w.costs[n], cluster.groups[g].device, dtype, w.training,
                                         w.precision)
                   for g in gs] for n in layers])
    nl, ng = len(layers), len(gs)
    # variables: x[l, g] (the share of layer l's samples on group g), then the step
    cost = np.zeros(nl * ng + 1)
    cost[-1] = 1.0
    a_eq = np.zeros((nl, nl * ng + 1))
    for i in range(nl):
        a_eq[i, i * ng:(i + 1) * ng] = 1.0
    a_ub = np.zeros((ng, nl * ng + 1))
    for j, g in enumerate(gs):
        for i, n in enumerate(layers):
            a_ub[j, i * ng + j] = w.global_batch * counts[n] * e[i, j]
        a_ub[j, -1] = -float(cluster.groups[g].num_devices)
    got = linprog(cost, A_ub=a_ub, b_ub=np.zeros(ng), A_eq=a_eq, b_eq=np.ones(nl),
                  bounds=[(0, None)] * (nl * ng + 1), method="highs")
    if got.status != 0:
        return 0.0
    return max(0.0, float(got.fun) * (1 - 1e-6))
