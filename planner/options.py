"""Per-mesh layout options: each data x tensor layout (with or without FSDP) and recomputation
choice of a mesh, costed per microbatch for the CP-SAT model (:class:`simulator.stage_cost.StageCost`),
with the options another beats on every term dropped, and a cache so identical meshes share them.
"""

from __future__ import annotations

import threading
from dataclasses import fields, replace
from typing import Any

from ir import CONTEXT_METHODS, Layout, ShardDims, Workload, layout_problem
from hardware_profiles.types import MeshSpec
from planner.errors import PlannerError
from simulator.cost_model import overlaps_tensor_parallel
from simulator.stage_cost import StageCost, stage_cost


def _split_layers(w: Workload) -> tuple[int, int, int]:
    """(pre, blocks, post): layers before, count of, and layers after the repeated block."""
    body = max(set(w.layers), key=w.layers.count)
    first = w.layers.index(body)
    n = w.layers.count(body)
    if w.layers[first:first + n] != (body,) * n:
        raise PlannerError(f"model {w.model!r}: its repeated layer {body!r} is not contiguous; "
                           f"the planner partitions a run of identical blocks")
    return first, n, len(w.layers) - first - n


CONTEXT_MIN_TOKENS = 16384
"""The shortest sequence the search splits by context parallelism unless asked
(``PlanOptions.context``, ``mpmd plan --context-parallel``). Why not lower: a context layout only
wins where data parallel over the same devices cannot take the microbatch (its token-local
work is data parallel's, :func:`_context_layouts`), which at 8,192 tokens and below the search
reaches by more microbatches of whole samples about as well, while every degree it offers
multiplies the layout choices it costs against its work budget. NVIDIA's Megatron-Bridge
Llama 3 70B and 405B recipes do run CP 2 at 8,192 tokens: ``--context-parallel 2`` plans that."""

CONTEXT_MIN_CHUNK = 1024
"""The fewest tokens of a sequence one device holds under context parallelism (the search's
largest degree is ``seq_len / 1024``): a ring step's attention block of fewer rows cannot hide
its key/value pass on any profiled device."""


def context_degrees(seq_len: int, devices: int, context: int = 0) -> list[int]:
    """Context-parallel degrees the search offers a mesh of ``devices`` (after tensor parallel)
    for sequences of ``seq_len`` tokens. ``context`` 0 (search): 1, and from
    :data:`CONTEXT_MIN_TOKENS` every power of two dividing ``devices`` that leaves chunks of at
    least :data:`CONTEXT_MIN_CHUNK` tokens; 1: only 1; ``N > 1``: only ``N`` (when it divides
    ``devices``; none otherwise)."""
    if context >= 1:
        return [context] if devices % context == 0 else []
    out = [1]
    if seq_len < CONTEXT_MIN_TOKENS:
        return out
    c = 2
    while devices % c == 0 and seq_len // c >= CONTEXT_MIN_CHUNK:
        out.append(c)
        c *= 2
    return out


def _layouts(mesh: MeshSpec, samples: float, max_tensor: int, fsdp: bool, experts: int = 0,
             shards: ShardDims | None = None, seq_len: int = 0, context: int = 0,
             optimizer_state: str = "fp32") -> list[Layout]:
    """Data x tensor factorizations of the mesh (data dividing the microbatch) whose tensor degree
    can run the model (:func:`ir.shards.layout_problem` on ``shards``: it divides the heads and
    the MLP widths), each also with fully sharded data parallel when training with more than one
    replica, and, for a model with ``experts`` experts per layer, with every expert-parallel
    degree that divides both the data degree and the experts (the all-to-all is costed over the
    fabric levels its group spans) and, with tensor parallel, every degree that divides the
    data x tensor devices and the experts with the experts not tensor-split (``expert_tensor``
    1: Megatron-Core's MoE parallel folding, what NVIDIA's MoE recipes run); an expert group
    that spans scale-up domains is offered with each dispatch (``Layout.expert_dispatch``).
    A sequence of ``seq_len`` tokens may also be split over the :func:`context_degrees`, by the
    ring or by all-to-all where the model's heads allow (:func:`_context_layouts` says why only
    those, and only where data parallel over the same devices cannot take the microbatch).
    Every layout keeps its optimizer state as ``optimizer_state`` says (:attr:`Layout.optimizer_state`:
    the user's choice, not searched)."""
    out = []
    for t in range(1, mesh.num_devices + 1):
        if mesh.num_devices % t or t > max_tensor or layout_problem(shards, t) is not None:
            continue
        for c in context_degrees(seq_len, mesh.num_devices // t, context):
            out += _context_layouts(mesh, samples, fsdp, experts, shards, seq_len, t, c,
                                    prune=context == 0)
    return out if optimizer_state == "fp32" else [replace(lay, optimizer_state=optimizer_state)
                                                  for lay in out]


def _context_layouts(mesh: MeshSpec, samples: float, fsdp: bool, experts: int,
                     shards: ShardDims | None, seq_len: int, t: int, c: int,
                     prune: bool = True) -> list[Layout]:
    """:func:`_layouts`' layouts of tensor degree ``t`` and context degree ``c`` (``prune``
    False: a degree the user fixed, offered without the first pruning below).

    Two exact prunings (the cost model's, :mod:`simulator.context_parallel`): a context layout
    ``(d, c, t)`` costs what data parallel ``(d c, t)`` costs on every term (the same tokens per
    device, replicas and memory) plus its exchange, so it is offered only where that data-parallel
    layout cannot take the microbatch (fewer samples than ``d c``, or not a multiple: more
    microbatches of fewer samples is what context parallelism buys); and the all-gather method
    is never offered, as the ring moves the same bytes, hides some under the attention core and
    holds one chunk instead of the whole sequence's keys and values."""
    out: list[Layout] = []
    d = mesh.num_devices // (t * c)
    if prune and c > 1 and samples >= d * c and float(samples / (d * c)).is_integer():
        return out
    methods = ("ring",) if c == 1 else tuple(
        m for m in CONTEXT_METHODS if m != "allgather"
        and layout_problem(shards, t, 1, 0, c, m, seq_len) is None)
    for m in methods:
        if samples >= d and float(samples / d).is_integer():
            # tensor-parallel collectives beside the GEMMs where the device's stack does so
            base = Layout(d, t, context=c, context_method=m,
                          tp_overlap=t > 1 and overlaps_tensor_parallel(mesh.device))
            out.append(base)
            if fsdp and d * c > 1:
                out.append(replace(base, fsdp=True))
            # the experts split the data x context devices (or, folded, all of them)
            ep = [replace(base, expert=e) for e in range(2, min(d * c, experts) + 1)
                  if (d * c) % e == 0 and experts % e == 0]
            if t > 1:
                ep += [replace(base, expert=e, expert_tensor=1)
                       for e in range(2, min(d * c * t, experts) + 1)
                       if (d * c * t) % e == 0 and experts % e == 0
                       and layout_problem(shards, t, e, 1) is None]
            # an expert group across scale-up domains may also dispatch in two hops (DeepEP)
            out += ep + [replace(lay, expert_dispatch="deepep") for lay in ep
                         if mesh.collective_span(lay.expert, lay.etp).nodes > 1]
    return out


def _mesh_options(w: Workload, mesh: MeshSpec, samples: float, kinds: tuple[str, ...],
                  split: bool, headroom: float, max_tensor: int, fsdp: bool = True,
                  hidden: bool = False, context: int = 0, optimizer_state: str = "fp32"
                  ) -> tuple[tuple[StageCost, ...], int]:
    """Every undominated layout option of ``mesh``, each costed by the cost model
    (:func:`simulator.stage_cost.stage_cost`), and how many layout choices were costed (the
    search charges its work budget per choice, ``planner.budget.COSTS["option"]``); ``hidden``:
    the schedule hides a mixture of experts' all-to-alls (``ScheduleKind.hides_alltoall``), as
    the layer costs then do."""
    split_layers = _split_layers(w)
    experts = max(c.experts for c in w.costs.values())
    costed = [stage_cost(w, mesh, lay, rc, samples, kinds, split, headroom, split_layers, hidden)
              for lay in _layouts(mesh, samples, max_tensor, fsdp and w.training, experts,
                                  w.shards, w.seq_len, context, optimizer_state)
              for rc in ((False, True) if w.training else (False,))]
    return _undominated(costed), len(costed)


def _undominated(opts: list[StageCost]) -> tuple[StageCost, ...]:
    """Drop options another option beats or ties on every time and memory term (exact pruning:
    the CP-SAT model is monotone in each of them), keeping the first of equal ones."""
    def terms(o: StageCost) -> tuple[float, ...]:
        return (o.block_s, o.pre_s, o.post_s, o.overhead_s, -o.merge_saving_s, o.tail_block_s,
                o.tail_pre_s, o.tail_post_s, o.static_block, o.static_pre, o.static_post,
                o.resid_block, o.resid_pre, o.resid_post, o.working)

    keep = []
    for i, o in enumerate(opts):
        t = terms(o)
        if not any(all(a <= b for a, b in zip(terms(p), t)) and (terms(p) != t or j < i)
                   for j, p in enumerate(opts) if j != i):
            keep.append(o)
    return tuple(keep)


_OPTIONS_LOCK = threading.Lock()
_OPTIONS_CACHE: dict[str, Any] = {}
"""``_mesh_options`` results of the latest workload: ``{"w": workload, "entries": {key: [(the
mesh's fields but its name, options), ...]}}``; the workload is held (its layers and costs
compared by identity, :func:`_same_program`), so another model cannot take its place
unnoticed."""


def _same_program(a: Workload | None, b: Workload) -> bool:
    """Whether workloads ``a`` and ``b`` have the same layers, costs, step kind, dimensions,
    precision recipe and the memory its loss and GEMM inputs take (``cross_entropy``,
    ``saved_inputs``), which decide the layouts offered and their costs: a mesh's
    options depend on the samples per microbatch, never on the global batch, so the batch shares
    of one model (``dataclasses.replace(w, global_batch=...)`` keeps the layers and costs
    objects) share them. Compared by identity, so another model cannot take their place."""
    return a is b or (a is not None and a.costs is b.costs and a.layers is b.layers
                      and a.seq_len == b.seq_len and a.training == b.training
                      and a.dtype_bytes == b.dtype_bytes and a.dtype == b.dtype
                      and a.shards == b.shards and a.precision == b.precision
                      and a.cross_entropy == b.cross_entropy
                      and a.saved_inputs == b.saved_inputs)


def _cached_mesh_options(w: Workload, mesh: MeshSpec, samples: float, kinds: tuple[str, ...],
                         split: bool, headroom: float, max_tensor: int, fsdp: bool,
                         hidden: bool = False, context: int = 0, optimizer_state: str = "fp32"
                         ) -> tuple[tuple[StageCost, ...], int]:
    """:func:`_mesh_options`, computed once per workload and mesh spec (meshes that differ only by
    name share their options: clusters repeat identical meshes): the options and how many layout
    choices this call costed (0 when they were cached)."""
    # only a mixture of experts has all-to-alls to hide: a dense model's options are the same
    # either way, so they are computed (and charged to the work budget) once
    hidden = hidden and any(c.alltoall_bytes_per_sample > 0 for c in w.costs.values())
    spec = tuple(getattr(mesh, f.name) for f in fields(mesh) if f.name != "name")
    key = (samples, kinds, split, headroom, max_tensor, fsdp, hidden, context, optimizer_state)
    with _OPTIONS_LOCK:
        if not _same_program(_OPTIONS_CACHE.get("w"), w):
            _OPTIONS_CACHE.clear()
            _OPTIONS_CACHE.update(w=w, entries={})
        bucket = _OPTIONS_CACHE["entries"].setdefault(key, [])
        for other, opts in bucket:
            if other == spec:
                return opts, 0
    opts, costed = _mesh_options(w, mesh, samples, kinds, split, headroom, max_tensor, fsdp, hidden,
                                 context, optimizer_state)
    with _OPTIONS_LOCK:
        if _same_program(_OPTIONS_CACHE.get("w"), w):
            bucket.append((spec, opts))
    return opts, costed
