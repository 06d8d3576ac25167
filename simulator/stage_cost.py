"""What a pipeline stage costs on a mesh under one layout: one typed object, produced by the cost
model, from which the planner's CP-SAT surrogate, its rank work and every lower bound derive.

A stage of the planner holds ``n`` copies of the model's repeated block per virtual stage, plus
(on the ranks that hold them) the layers before the blocks (the embedding: ``pre``) and after them
(the LM head: ``post``). :class:`StageCost` gives, per microbatch and per device, the seconds and
bytes of each part under one data x tensor (x expert, FSDP) layout and recomputation choice;
:class:`Affine` is the one formula that composes them into a rank's time, tail or memory::

    rank time per microbatch = v n block_s + [first] pre_s + [holds post] post_s + v overhead_s
                               - [merged] merge_saving_s
    end-of-step tail          = v n tail_block_s + [first] tail_pre_s + [holds post] tail_post_s
    static bytes              = v n static_block + [first] static_pre + [holds post] static_post
                               + working

with residual bytes ``resid_*`` per microbatch (chunk instance) in flight on top. The layer terms
come from :func:`simulator.cost_model.layer_time` (the same per-layer seconds the replay,
:class:`simulator.plan_costs.PlanCosts`, sums into fragments), the memory from
:func:`simulator.cost_model.stage_memory`, the tail from :func:`~simulator.cost_model.optimizer_time`
and :func:`~simulator.cost_model.param_gather_time`. ``tests/planner/test_stage_cost.py`` draws
random workloads, layouts and schedules and holds the surrogate and every bound against the replay.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hardware_profiles.types import MeshSpec
from ir import Layout, Workload
from ir.schedule import FragmentKind
from simulator import cost_model as cm
from simulator.exposure import FREE_LINK


@dataclass(frozen=True, slots=True)
class Affine:
    """``per_block x n + first x [first] + post x [holds post] + fixed - merged x [merged]``: a
    rank's seconds or bytes as a function of its blocks per virtual stage ``n`` and where it sits
    (the first rank holds the layers before the blocks; the rank holding the layers after them
    is the last, or the first in a V; the last stage's F and B may merge into one dispatch).

    The CP-SAT model (:func:`planner.search.solve_outcome`) takes these coefficients as they are
    (scaled to integers); :meth:`at` evaluates them for a fixed assignment.
    """

    per_block: float
    first: float = 0.0
    post: float = 0.0
    fixed: float = 0.0
    merged: float = 0.0

    def at(self, blocks: float, *, first: bool = False, holds_post: bool = False,
           merged: bool = False) -> float:
        """The value at ``blocks`` blocks per virtual stage."""
        return (self.per_block * blocks + (self.first if first else 0.0)
                + (self.post if holds_post else 0.0) + self.fixed
                - (self.merged if merged else 0.0))


@dataclass(frozen=True, slots=True)
class StageCost:
    """Costs of one mesh under one layout, per microbatch (seconds, per-device bytes).

    Attributes:
        layout: the data x tensor parallel layout.
        recompute: whether the mesh recomputes activations in the backward.
        block_s / pre_s / post_s: time of one repeated block, of the layers before the blocks,
            and of the layers after them (all fragment kinds of one microbatch summed).
        overhead_s: dispatch overhead of one virtual stage's fragments for one microbatch (and
            a lower bound on the FSDP gathers and reduce-scatters they expose).
        merge_saving_s: overhead saved per microbatch when the last stage's F and B merge.
        tail_block_s / tail_pre_s / tail_post_s: end-of-step optimizer step and parameter
            all-gather (what no overlap hides).
        static_block / static_pre / static_post: weights, gradients, optimizer state bytes.
        resid_block / resid_pre / resid_post: residual bytes per microbatch in flight.
        working: transient bytes of a running fragment.
        capacity: usable bytes per device.
    """

    layout: Layout
    recompute: bool
    block_s: float
    pre_s: float
    post_s: float
    overhead_s: float
    merge_saving_s: float
    tail_block_s: float
    tail_pre_s: float
    tail_post_s: float
    static_block: float
    static_pre: float
    static_post: float
    resid_block: float
    resid_pre: float
    resid_post: float
    working: float
    capacity: float
    block_w_s: float = 0.0
    """The weight-gradient (W) part of ``block_s`` when the backward is split, else 0."""
    block_f_s: float = 0.0
    """The forward (F) part of ``block_s`` (0: not given; the bounds then leave out the pipeline's
    fill, :func:`planner.bounds.fill_level`)."""
    tail_marginal_s: float = 0.0
    """What one more block adds to the end-of-step tail (a stage's gradient all-reduce is one
    collective: its latency is paid once, so ``tail_block_s`` x blocks over-counts it)."""
    sync_excess_s: float = 0.0
    """Per block, how much its data-parallel gradient sync outlasts its backward of one microbatch
    (``max(0, sync - B)``, seconds): the buckets are synced one after another during and after the
    stage's last backward, so what exceeds that backward is exposed (bounds only)."""
    pre_kinds_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """The layers before the blocks' F, B and W per microbatch (their sum is ``pre_s``; zeros:
    not given; bounds only, :func:`planner.dag_bound.order_bound`)."""
    post_kinds_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """The same for the layers after the blocks (``post_s``)."""
    sync_offset_s: float = 0.0
    """At most 0: the same excess's constant part over the layers outside the blocks and the
    backward fragment's fixed costs (bounds only; see :func:`planner.bounds.candidate_bound`)."""
    block_comm_s: float = 0.0
    """The exposed communication in ``block_s``: what the block's tensor-parallel all-reduces,
    expert all-to-alls and FSDP gathers and reduce-scatters add to it beyond the overlap they get
    (``block_s`` less the same block with every link free, as :mod:`simulator.exposure` defines
    exposure for a step), seconds per microbatch."""

    @property
    def block_compute_s(self) -> float:
        """The rest of ``block_s``: compute, memory traffic and the layers' fixed times."""
        return self.block_s - self.block_comm_s

    @property
    def block_b_s(self) -> float:
        """The backward (B) part of ``block_s``: the whole backward, or its input gradient when
        the backward is split (``block_s - block_f_s - block_w_s``)."""
        return self.block_s - self.block_f_s - self.block_w_s

    def block_kind_s(self, kind: str) -> float:
        """Seconds of one block's ``kind`` (``"F"``, ``"B"`` or ``"W"``) for one microbatch.

        Raises:
            ValueError: an unknown kind."""
        if kind == FragmentKind.F:
            return self.block_f_s
        if kind == FragmentKind.B:
            return self.block_b_s
        if kind == FragmentKind.W:
            return self.block_w_s
        raise ValueError(f"unknown fragment kind {kind!r}; use F, B or W")

    def rank_time(self, virtual_stages: int) -> Affine:
        """A rank's seconds per microbatch under this option with ``virtual_stages`` stages per
        rank: its blocks in every virtual stage, the layers before the blocks on the first rank
        and after them on the rank that holds them, one dispatch per virtual stage, less the
        merge saving when the last stage's F and B run as one fragment."""
        v = virtual_stages
        return Affine(v * self.block_s, self.pre_s, self.post_s, v * self.overhead_s,
                      self.merge_saving_s)

    def tail(self, virtual_stages: int) -> Affine:
        """A rank's end-of-step seconds after its last fragment under this option (the optimizer
        step and the parameter all-gather; the gradient buckets may hide under the backward)."""
        v = virtual_stages
        return Affine(v * self.tail_block_s, self.tail_pre_s, self.tail_post_s)

    def static(self, virtual_stages: int) -> Affine:
        """A rank's bytes per device that do not depend on the microbatches in flight: weights,
        gradients and optimizer state of its blocks and end layers, plus the working set."""
        v = virtual_stages
        return Affine(v * self.static_block, self.static_pre, self.static_post, self.working)

    def residual(self) -> Affine:
        """Residual bytes per device of one chunk instance in flight: per block of a virtual
        stage, of the layers before the blocks (first stage), after them (last stage)."""
        return Affine(self.resid_block, self.resid_pre, self.resid_post)

    def memory_bytes(self, blocks: int, virtual_stages: int, inflight: int, *, first: bool = False,
                     holds_post: bool = False, first_instances: int = 0,
                     post_instances: int = 0) -> float:
        """A rank's peak bytes per device with ``blocks`` blocks per virtual stage and
        ``inflight`` chunk instances of residuals (``first_instances`` / ``post_instances`` of
        the first / last stage's end layers)."""
        r = self.residual()
        return (self.static(virtual_stages).at(blocks, first=first, holds_post=holds_post)
                + r.per_block * inflight * blocks
                + (r.first * first_instances if first else 0.0)
                + (r.post * post_instances if holds_post else 0.0))

    def block_bytes(self, virtual_stages: int, inflight: int) -> float:
        """Bytes per device one more block on the rank costs (counting blocks over all its
        virtual stages): its static bytes and its residuals for ``inflight`` chunk instances
        spread over the ``virtual_stages`` stages."""
        return self.static_block + inflight * self.resid_block / virtual_stages

    def room_bytes(self, *, first: bool = False, holds_post: bool = False,
                   first_instances: int = 0, post_instances: int = 0) -> float:
        """Bytes per device left for the blocks: the capacity less the working set and the end
        layers' static bytes and residuals on the ranks that hold them."""
        room = self.capacity - self.working
        if first:
            room -= self.static_pre + first_instances * self.resid_pre
        if holds_post:
            room -= self.static_post + post_instances * self.resid_post
        return room


def stage_cost(w: Workload, mesh: MeshSpec, layout: Layout, recompute: bool, samples: float,
               kinds: tuple[str, ...], split: bool, headroom: float,
               split_layers: tuple[int, int, int], hidden: bool = False) -> StageCost:
    """The :class:`StageCost` of ``mesh`` under ``layout`` for a microbatch of ``samples``.

    Args:
        kinds: the fragment kinds a microbatch runs (``("F",)`` for inference; ``("F", "B")``;
            ``("F", "B", "W")`` with a split backward).
        split: the backward is split into B and W (zero-bubble schedules).
        headroom: fraction of device memory kept free.
        split_layers: ``(pre, blocks, post)``: layers before, count of, and layers after the
            repeated block (:func:`planner.options._split_layers`).
        hidden: the schedule hides a mixture of experts' all-to-alls
            (``ScheduleKind.hides_alltoall``), as the layer costs then do.
    """
    pre, nb, post = split_layers
    n_layers = len(w.layers)
    dtype = cm.compute_dtype(w)
    ovh = cm.fragment_overhead(mesh)

    def layer(i: int, k: str, split_backward: bool = split, on: MeshSpec = mesh) -> float:
        return cm.layer_time(w.layer(i), k, samples, on, layout, dtype,
                             split_backward=split_backward, recompute=recompute,
                             seq_len=w.seq_len, alltoall_hidden=hidden, precision=w.precision)

    def t(lo: int, hi: int) -> float:
        return sum(layer(i, k) for i in range(lo, hi) for k in kinds)

    def by_kind(lo: int, hi: int) -> tuple[float, float, float]:
        f, b, wg = (sum(layer(i, k) for i in range(lo, hi)) if k in kinds else 0.0
                    for k in FragmentKind)
        return f, b, wg

    def tail(lo: int, hi: int) -> float:
        if hi <= lo:
            return 0.0
        # what no overlap can hide: the optimizer step and the parameter all-gather after it
        # (the gradient buckets may hide under the last backward: a lower bound on the tail)
        return (cm.optimizer_time(w, lo, hi, mesh, layout)
                + cm.param_gather_time(w, lo, hi, mesh, layout))

    def mem(lo: int, hi: int) -> cm.StageMemory:
        if hi <= lo:
            return cm.StageMemory(0.0, 0.0, 0.0)
        return cm.stage_memory(w, lo, hi, layout, samples, recompute)

    blk, pr, po = mem(pre, pre + 1), mem(0, pre), mem(pre + nb, n_layers)
    free = replace(mesh, intra_link=FREE_LINK,
                   scale_out_link=None if mesh.scale_out_link is None else FREE_LINK)
    block_s = t(pre, pre + 1)
    return StageCost(
        layout=layout, recompute=recompute, block_s=block_s, pre_s=t(0, pre),
        post_s=t(pre + nb, n_layers),
        overhead_s=ovh * len(kinds) + _fsdp_exposed(w, mesh, layout, kinds, split),
        merge_saving_s=ovh if FragmentKind.B in kinds else 0.0,
        tail_block_s=tail(pre, pre + 1), tail_pre_s=tail(0, pre), tail_post_s=tail(pre + nb, n_layers),
        static_block=blk.static_bytes, static_pre=pr.static_bytes, static_post=po.static_bytes,
        resid_block=blk.residual_bytes_per_microbatch, resid_pre=pr.residual_bytes_per_microbatch,
        resid_post=po.residual_bytes_per_microbatch,
        working=max(blk.working_bytes, pr.working_bytes, po.working_bytes),
        capacity=cm.usable_bytes(mesh, headroom),
        tail_marginal_s=(tail(pre, pre + 2) - tail(pre, pre + 1)) if nb >= 2 else tail(pre, pre + 1),
        block_f_s=layer(pre, FragmentKind.F, False) if nb and FragmentKind.F in kinds else 0.0,
        block_w_s=layer(pre, FragmentKind.W, True) if FragmentKind.W in kinds else 0.0,
        pre_kinds_s=by_kind(0, pre), post_kinds_s=by_kind(pre + nb, n_layers),
        block_comm_s=max(0.0, block_s - sum(layer(pre, k, on=free) for k in kinds)),
        **_sync_excess(w, mesh, layout, samples, recompute, kinds, split_layers, hidden))


def _sync_excess(w: Workload, mesh: MeshSpec, lay: Layout, samples: float, rc: bool,
                 kinds: tuple[str, ...], split_layers: tuple[int, int, int],
                 hidden: bool = False) -> dict[str, float]:
    """``sync_excess_s`` and ``sync_offset_s`` of a :class:`StageCost`: the buckets become ready
    during the stage's last backward fragment (the last microbatch's B, or its W when the backward
    is split: :meth:`simulator.plan_costs.PlanCosts.last_backward`). A stage of ``n`` blocks
    exposes ``max(0, sync - last) >= n x excess + offset``, where ``offset`` (<= 0) counts the
    layers outside the blocks at their least and subtracts that fragment's dispatch and FSDP
    exposure at their most."""
    if not w.training or FragmentKind.B not in kinds:
        return {}
    last = FragmentKind.W if FragmentKind.W in kinds else FragmentKind.B
    pre, nb, post = split_layers
    dtype = cm.compute_dtype(w)

    def sync(i: int) -> float:
        x = cm.layer_grad_sync(w.layer(i), mesh, lay)
        return x[2] if x is not None else 0.0

    def bwd(i: int) -> float:
        return cm.layer_time(w.layer(i), last, samples, mesh, lay, dtype, recompute=rc,
                             seq_len=w.seq_len, alltoall_hidden=hidden,
                             split_backward=last == FragmentKind.W, precision=w.precision)

    excess = sync(pre) - bwd(pre)
    if excess <= 0:
        return {}
    outside = [i for i in range(len(w.layers)) if not pre <= i < pre + nb]
    offset = sum(min(0.0, sync(i) - bwd(i)) for i in outside) - cm.fragment_overhead(mesh)
    if lay.fsdp:
        traffic = [cm.fsdp_traffic(w.layer(i), mesh, lay) for i in _distinct(w)]
        gathers = 0 if last == FragmentKind.W else (2 if rc else 1)     # a W only reduce-scatters
        offset -= max(g for g, _ in traffic) * gathers + max(s for _, s in traffic)
    return {"sync_excess_s": excess, "sync_offset_s": min(0.0, offset)}


def _distinct(w: Workload) -> list[int]:
    """The index of each distinct layer of ``w`` (its first occurrence)."""
    return list({name: i for i, name in reversed(list(enumerate(w.layers)))}.values())


def _fsdp_exposed(w: Workload, mesh: MeshSpec, lay: Layout, kinds: tuple[str, ...],
                  split: bool) -> float:
    """A lower bound on the FSDP traffic one virtual stage's fragments of one microbatch expose,
    whatever layers the stage holds (:func:`simulator.cost_model.fsdp_exposed`: F its first
    gather, B its last gather and, unless split, its first reduce-scatter, W that reduce-scatter),
    seconds: the least gather ``g`` and reduce-scatter ``s`` of any layer with parameters, so F + B
    (+ W) >= ``2 g + s``. With a split backward it is ``3 min(g, s)``, so that the chain bound's
    F and B share (2/3 of it, :func:`planner.bounds._ranks`) stays at most ``2 g``. 0 without
    FSDP or on a ``"sum"`` roofline (whose layers already pay all of it)."""
    if (not lay.fsdp or lay.shard <= 1 or mesh.device.roofline == "sum"
            or FragmentKind.B not in kinds):
        return 0.0
    traffic = [cm.fsdp_traffic(w.layer(i), mesh, lay) for i in _distinct(w)
               if w.layer(i).param_count > 0]
    if not traffic:
        return 0.0
    g, sc = min(x[0] for x in traffic), min(x[1] for x in traffic)
    return 3.0 * min(g, sc) if split else 2.0 * g + sc
