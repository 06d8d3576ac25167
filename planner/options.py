"""Per-mesh layout options: each data x tensor layout (with or without FSDP) and recomputation
choice of a mesh, costed per microbatch for the CP-SAT model (:class:`planner.search.MeshOption`),
with the options another beats on every term dropped, and a cache so identical meshes share them.
"""

from __future__ import annotations

import threading
from dataclasses import fields

from ir import Layout, Workload
from hardware_profiles.types import MeshSpec
from planner.errors import PlannerError
from planner.search import MeshOption
from simulator import cost_model as cm


def _split_layers(w: Workload) -> tuple[int, int, int]:
    """(pre, blocks, post): layers before, count of, and layers after the repeated block."""
    body = max(set(w.layers), key=w.layers.count)
    first = w.layers.index(body)
    n = w.layers.count(body)
    if w.layers[first:first + n] != (body,) * n:
        raise PlannerError(f"model {w.model!r}: its repeated layer {body!r} is not contiguous; "
                           f"the planner partitions a run of identical blocks")
    return first, n, len(w.layers) - first - n


def _layouts(mesh: MeshSpec, samples: float, max_tensor: int, fsdp: bool, experts: int = 0
             ) -> list[Layout]:
    """Data x tensor factorizations of the mesh (data dividing the microbatch), each also with
    fully sharded data parallel when training with more than one replica, and, for a model with
    ``experts`` experts per layer, with every expert-parallel degree that divides both the data
    degree and the experts (the all-to-all is costed over the fabric levels its group spans)."""
    out = []
    for t in range(1, mesh.num_devices + 1):
        if mesh.num_devices % t or t > max_tensor:
            continue
        d = mesh.num_devices // t
        if samples >= d and float(samples / d).is_integer():
            out.append(Layout(d, t))
            if fsdp and d > 1:
                out.append(Layout(d, t, fsdp=True))
            out += [Layout(d, t, expert=e) for e in range(2, min(d, experts) + 1)
                    if d % e == 0 and experts % e == 0]
    return out


computed = [0]
"""Layout choices costed by :func:`_mesh_options` so far in this process (cache misses only): the
search charges its work budget per choice (``planner.budget.COSTS["option"]``)."""


def _mesh_options(w: Workload, mesh: MeshSpec, samples: float, kinds: tuple[str, ...],
                  split: bool, headroom: float, max_tensor: int, fsdp: bool = True,
                  hidden: bool = False) -> tuple[MeshOption, ...]:
    """Every undominated layout option of ``mesh``; ``hidden``: the schedule hides a mixture of
    experts' all-to-alls (``ScheduleKind.hides_alltoall``), as the layer costs then do."""
    pre, nb, post = _split_layers(w)
    dtype = cm.compute_dtype(w)
    ovh = cm.fragment_overhead(mesh)
    opts = []
    experts = max(c.experts for c in w.costs.values())
    choices = [(lay, rc) for lay in _layouts(mesh, samples, max_tensor, fsdp and w.training, experts)
               for rc in ((False, True) if w.training else (False,))]
    computed[0] += len(choices)
    for lay, rc in choices:
        def t(lo: int, hi: int) -> float:
            return sum(cm.layer_time(w.layer(i), k, samples, mesh, lay, dtype, split_backward=split,
                                     recompute=rc, seq_len=w.seq_len, alltoall_hidden=hidden)
                       for i in range(lo, hi) for k in kinds)

        def by_kind(lo: int, hi: int) -> tuple[float, float, float]:
            return tuple(sum(cm.layer_time(w.layer(i), k, samples, mesh, lay, dtype, split_backward=split,
                                           recompute=rc, seq_len=w.seq_len, alltoall_hidden=hidden)
                             for i in range(lo, hi)) if k in kinds else 0.0
                         for k in ("F", "B", "W"))

        def tail(lo: int, hi: int) -> float:
            if hi <= lo:
                return 0.0
            # what no overlap can hide: the optimizer step and the parameter all-gather after it
            # (the gradient buckets may hide under the last backward: a lower bound on the tail)
            return cm.optimizer_time(w, lo, hi, mesh, lay) + cm.param_gather_time(w, lo, hi, mesh, lay)

        def mem(lo: int, hi: int) -> cm.StageMemory:
            if hi <= lo:
                return cm.StageMemory(0.0, 0.0, 0.0)
            return cm.stage_memory(w, lo, hi, lay, samples, rc)

        blk, pr, po = mem(pre, pre + 1), mem(0, pre), mem(pre + nb, len(w.layers))
        opts.append(MeshOption(
            layout=lay, recompute=rc, block_s=t(pre, pre + 1), pre_s=t(0, pre), post_s=t(pre + nb, len(w.layers)),
            overhead_s=ovh * len(kinds) + _fsdp_exposed(w, mesh, lay, kinds, split),
            merge_saving_s=ovh if "B" in kinds else 0.0,
            tail_block_s=tail(pre, pre + 1), tail_pre_s=tail(0, pre),
            tail_post_s=tail(pre + nb, len(w.layers)),
            static_block=blk.static_bytes, static_pre=pr.static_bytes, static_post=po.static_bytes,
            resid_block=blk.residual_bytes_per_microbatch, resid_pre=pr.residual_bytes_per_microbatch,
            resid_post=po.residual_bytes_per_microbatch,
            working=max(blk.working_bytes, pr.working_bytes, po.working_bytes),
            capacity=cm.usable_bytes(mesh, headroom),
            tail_marginal_s=(tail(pre, pre + 2) - tail(pre, pre + 1)) if nb >= 2 else tail(pre, pre + 1),
            block_f_s=(cm.layer_time(w.layer(pre), "F", samples, mesh, lay, dtype, recompute=rc,
                                     seq_len=w.seq_len, alltoall_hidden=hidden)
                       if nb and "F" in kinds else 0.0),
            block_w_s=(sum(cm.layer_time(w.layer(i), "W", samples, mesh, lay, dtype, split_backward=True,
                                         recompute=rc, seq_len=w.seq_len, alltoall_hidden=hidden)
                           for i in range(pre, pre + 1))
                       if "W" in kinds else 0.0),
            pre_kinds_s=by_kind(0, pre), post_kinds_s=by_kind(pre + nb, len(w.layers)),
            **_sync_excess(w, mesh, lay, samples, rc, kinds, (pre, nb, post), hidden)))
    return _undominated(opts)


def _sync_excess(w: Workload, mesh: MeshSpec, lay: Layout, samples: float, rc: bool,
                 kinds: tuple[str, ...], split_layers: tuple[int, int, int],
                 hidden: bool = False) -> dict[str, float]:
    """``sync_excess_s`` and ``sync_offset_s`` of a :class:`MeshOption`: the buckets become ready
    during the stage's last backward fragment (the last microbatch's B, or its W when the backward
    is split: :meth:`simulator.plan_costs.PlanCosts.last_backward`). A stage of ``n`` blocks
    exposes ``max(0, sync - last) >= n x excess + offset``, where ``offset`` (<= 0) counts the
    layers outside the blocks at their least and subtracts that fragment's dispatch and FSDP
    exposure at their most."""
    if not w.training or "B" not in kinds:
        return {}
    last = "W" if "W" in kinds else "B"
    pre, nb, post = split_layers
    dtype = cm.compute_dtype(w)

    def sync(i: int) -> float:
        x = cm.layer_grad_sync(w.layer(i), mesh, lay)
        return x[2] if x is not None else 0.0

    def bwd(i: int) -> float:
        return cm.layer_time(w.layer(i), last, samples, mesh, lay, dtype, recompute=rc,
                             seq_len=w.seq_len, alltoall_hidden=hidden, split_backward=last == "W")

    excess = sync(pre) - bwd(pre)
    if excess <= 0:
        return {}
    outside = [i for i in range(len(w.layers)) if not pre <= i < pre + nb]
    offset = sum(min(0.0, sync(i) - bwd(i)) for i in outside) - cm.fragment_overhead(mesh)
    if lay.fsdp:
        traffic = [cm.fsdp_traffic(w.layer(i), mesh, lay) for i in _distinct(w)]
        gathers = 0 if last == "W" else (2 if rc else 1)     # a W only reduce-scatters
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
    if not lay.fsdp or lay.shard <= 1 or mesh.device.roofline == "sum" or "B" not in kinds:
        return 0.0
    traffic = [cm.fsdp_traffic(w.layer(i), mesh, lay) for i in _distinct(w)
               if w.layer(i).param_count > 0]
    if not traffic:
        return 0.0
    g, sc = min(x[0] for x in traffic), min(x[1] for x in traffic)
    return 3.0 * min(g, sc) if split else 2.0 * g + sc


def _undominated(opts: list[MeshOption]) -> tuple[MeshOption, ...]:
    """Drop options another option beats or ties on every time and memory term (exact pruning:
    the CP-SAT model is monotone in each of them), keeping the first of equal ones."""
    def terms(o: MeshOption) -> tuple[float, ...]:
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
_OPTIONS_CACHE: dict = {}
"""``_mesh_options`` results of the latest workload: ``{"w": workload, "entries": {key: [(the
mesh's fields but its name, options), ...]}}``; the workload is held (its layers and costs
compared by identity, :func:`_same_program`), so another model cannot take its place
unnoticed."""


def _same_program(a: Workload | None, b: Workload) -> bool:
    """Whether workloads ``a`` and ``b`` have the same layers, costs and step kind: a mesh's
    options depend on the samples per microbatch, never on the global batch, so the batch shares
    of one model (``dataclasses.replace(w, global_batch=...)`` keeps the layers and costs
    objects) share them. Compared by identity, so another model cannot take their place."""
    return a is b or (a is not None and a.costs is b.costs and a.layers is b.layers
                      and a.seq_len == b.seq_len and a.training == b.training
                      and a.dtype_bytes == b.dtype_bytes)


def _cached_mesh_options(w: Workload, mesh: MeshSpec, samples: float, kinds: tuple[str, ...],
                         split: bool, headroom: float, max_tensor: int, fsdp: bool,
                         hidden: bool = False) -> tuple[MeshOption, ...]:
    """:func:`_mesh_options`, computed once per workload and mesh spec (meshes that differ only by
    name share their options: clusters repeat identical meshes)."""
    # only a mixture of experts has all-to-alls to hide: a dense model's options are the same
    # either way, so they are computed (and charged to the work budget) once
    hidden = hidden and any(c.alltoall_bytes_per_sample > 0 for c in w.costs.values())
    spec = tuple(getattr(mesh, f.name) for f in fields(mesh) if f.name != "name")
    key = (samples, kinds, split, headroom, max_tensor, fsdp, hidden)
    with _OPTIONS_LOCK:
        if not _same_program(_OPTIONS_CACHE.get("w"), w):
            _OPTIONS_CACHE.clear()
            _OPTIONS_CACHE.update(w=w, entries={})
        bucket = _OPTIONS_CACHE["entries"].setdefault(key, [])
        for other, opts in bucket:
            if other == spec:
                return opts
    opts = _mesh_options(w, mesh, samples, kinds, split, headroom, max_tensor, fsdp, hidden)
    with _OPTIONS_LOCK:
        if _same_program(_OPTIONS_CACHE.get("w"), w):
            bucket.append((spec, opts))
    return opts
