"""``plan(workload, cluster)``: the search driver.

For every schedule family and microbatch count (the outer loop) one CP-SAT solve
(:mod:`planner.search`) picks the pipeline order, layer partition, per-mesh layouts and merge; each
answer becomes a :class:`~compiler.ir.Plan`, is replayed exactly (:mod:`planner.predict`), and the
fastest plan that fits memory wins. Deterministic: fixed candidate order, seed and worker count.

A ``stop`` event ends the search early (checked between candidates; the running CP-SAT solve is
stopped too): the result is the best plan so far, marked interrupted, with the honest search-wide
bound (None when some candidates were never searched).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Callable

from compiler.ir import Layout, Plan, StagePlan, Workload
from hardware_profiles.types import Cluster, MeshSpec
from planner.errors import InfeasibleError, PlannerError
from planner.predict import Prediction, predict
from planner.search import Assignment, Candidate, MeshOption, solve_outcome
from simulator import cost_model as cm
from simulator.schedules import generate

TRAIN_SCHEDULES = ("1f1b", "interleaved-1f1b", "gpipe")
"""Schedule families searched for training, in tie-break order."""
MERGEABLE = ("1f1b",)
"""Schedules whose last stage runs each microbatch's F immediately before its B."""


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """Search options.

    Attributes:
        time_limit_s: wall-clock budget of the whole search (CP-SAT solves share it).
        schedules: schedule families to consider (None: all for the workload).
        microbatches: microbatch counts to consider (None: divisors of the global batch).
        max_tensor: largest tensor-parallel degree considered.
        headroom: fraction of device memory kept free.
        virtual_stages: virtual stages per mesh for interleaved 1F1B.
        even_split: force equal blocks per stage on every mesh (the usual hand split).
        meshes: restrict to these meshes (None: all of the cluster's).
        fsdp: also consider fully sharded data parallel layouts.
        seed / workers: CP-SAT determinism controls.
    """

    time_limit_s: float = 30.0
    schedules: tuple[str, ...] | None = None
    microbatches: tuple[int, ...] | None = None
    max_tensor: int = 8
    headroom: float = 0.1
    virtual_stages: int = 2
    seed: int = 0
    workers: int = 1
    even_split: bool = False
    meshes: tuple[str, ...] | None = None
    fsdp: bool = True


class PlanInterrupted(PlannerError):
    """The search was stopped before any candidate gave a plan that fits memory."""


Progress = Callable[[int, int, "float | None"], None]
"""Progress callback ``(done, total, best_s)``: candidates searched, candidates in all, best
predicted step time so far in seconds (None before the first plan that fits)."""


@dataclass(frozen=True, slots=True)
class PlanResult:
    """The best plan, its prediction, and every candidate tried (for reports).

    Attributes:
        candidates: (schedule, microbatches, predicted step time or None) per candidate searched.
        interrupted: the ``stop`` event ended the search.
        candidates_total: candidates the search meant to try (searched or not).
        search_bound_s: proven lower bound on the surrogate step time over every candidate, seconds;
            None when some candidates were not searched (their bound is unknown).
        search_gap: ``(objective - search_bound_s) / objective`` of the chosen plan's surrogate
            objective, or None with ``search_bound_s``.
    """

    plan: Plan
    prediction: Prediction
    candidates: tuple[tuple[str, int, float | None], ...]   # (schedule, M, step time or None)
    interrupted: bool = False
    candidates_total: int = 0
    search_bound_s: float | None = None
    search_gap: float | None = None

    @property
    def unsearched(self) -> int:
        """Candidates never searched (the time limit or a stop came first)."""
        return max(0, self.candidates_total - len(self.candidates))


def _split_layers(w: Workload) -> tuple[int, int, int]:
    """(pre, blocks, post): layers before, count of, and layers after the repeated block."""
    body = max(set(w.layers), key=w.layers.count)
    first = w.layers.index(body)
    n = w.layers.count(body)
    if w.layers[first:first + n] != (body,) * n:
        raise PlannerError(f"model {w.model!r}: its repeated layer {body!r} is not contiguous; "
                           f"the planner partitions a run of identical blocks")
    return first, n, len(w.layers) - first - n


def _layouts(mesh: MeshSpec, samples: float, max_tensor: int, fsdp: bool) -> list[Layout]:
    """Data x tensor factorizations of the mesh (data dividing the microbatch), each also with
    fully sharded data parallel when training with more than one replica."""
    out = []
    for t in range(1, mesh.num_devices + 1):
        if mesh.num_devices % t or t > max_tensor:
            continue
        d = mesh.num_devices // t
        if samples >= d and float(samples / d).is_integer():
            out.append(Layout(d, t))
            if fsdp and d > 1:
                out.append(Layout(d, t, fsdp=True))
    return out


def _mesh_options(w: Workload, mesh: MeshSpec, samples: float, kinds: tuple[str, ...],
                  split: bool, headroom: float, max_tensor: int, fsdp: bool = True
                  ) -> tuple[MeshOption, ...]:
    pre, nb, post = _split_layers(w)
    dtype = cm.compute_dtype(w)
    ovh = cm.fragment_overhead(mesh)
    opts = []
    choices = [(lay, rc) for lay in _layouts(mesh, samples, max_tensor, fsdp and w.training)
               for rc in ((False, True) if w.training else (False,))]
    for lay, rc in choices:
        def t(lo: int, hi: int) -> float:
            return sum(cm.layer_time(w.layer(i), k, samples, mesh, lay, dtype, split_backward=split,
                                     recompute=rc)
                       for i in range(lo, hi) for k in kinds)

        def tail(lo: int, hi: int) -> float:
            if hi <= lo:
                return 0.0
            return cm.grad_sync_time(w, lo, hi, mesh, lay) + cm.optimizer_time(w, lo, hi, mesh, lay)

        def mem(lo: int, hi: int) -> cm.StageMemory:
            if hi <= lo:
                return cm.StageMemory(0.0, 0.0, 0.0)
            return cm.stage_memory(w, lo, hi, lay, samples, rc)

        blk, pr, po = mem(pre, pre + 1), mem(0, pre), mem(pre + nb, len(w.layers))
        opts.append(MeshOption(
            layout=lay, recompute=rc, block_s=t(pre, pre + 1), pre_s=t(0, pre), post_s=t(pre + nb, len(w.layers)),
            overhead_s=ovh * len(kinds), merge_saving_s=ovh if "B" in kinds else 0.0,
            tail_block_s=tail(pre, pre + 1), tail_pre_s=tail(0, pre),
            tail_post_s=tail(pre + nb, len(w.layers)),
            static_block=blk.static_bytes, static_pre=pr.static_bytes, static_post=po.static_bytes,
            resid_block=blk.residual_bytes_per_microbatch, resid_pre=pr.residual_bytes_per_microbatch,
            resid_post=po.residual_bytes_per_microbatch,
            working=max(blk.working_bytes, pr.working_bytes, po.working_bytes),
            capacity=cm.usable_bytes(mesh, headroom)))
    return _undominated(opts)


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


def build_plan(w: Workload, cluster: Cluster, a: Assignment, schedule: str, microbatches: int,
               virtual_stages: int) -> Plan:
    """Turn a solve's :class:`Assignment` into a :class:`Plan` with its schedule table."""
    pre, nb, post = _split_layers(w)
    p = len(a.order)
    v = virtual_stages if schedule == "interleaved-1f1b" else 1
    stages, cursor = [], pre
    for r in range(v):
        for rank, (mesh, n) in enumerate(zip(a.order, a.blocks)):
            idx = r * p + rank
            lo = 0 if idx == 0 else cursor
            cursor += n
            hi = len(w.layers) if idx == v * p - 1 else cursor
            stages.append(StagePlan(idx, lo, hi, mesh))
    table = generate(schedule, p, microbatches, virtual_stages=v, forward_only=not w.training)
    if tuple(table.stage_rank) != tuple(s % p for s in range(v * p)):
        raise PlannerError(f"schedule {schedule!r} places stages {table.stage_rank}, "
                           f"the planner expects round-robin placement")
    return Plan(model=w.model, cluster=cluster.name, stages=tuple(stages),
                layouts=dict(zip(a.order, a.layouts)),
                recompute={m: rc for m, rc in zip(a.order, a.recompute) if rc}, schedule=table, rank_mesh=a.order,
                merge_last_stage=a.merge, global_batch=w.global_batch, seq_len=w.seq_len,
                cluster_path=cluster.path,
                devices={m: (cluster.meshes[m].device.name, cluster.meshes[m].num_devices)
                         for m in a.order})


def _microbatch_counts(w: Workload, opts: PlanOptions, nmeshes: int) -> list[int]:
    if opts.microbatches:
        return [m for m in opts.microbatches if w.global_batch % m == 0]
    divs = [m for m in range(1, w.global_batch + 1) if w.global_batch % m == 0]
    # powers of two and multiples of the mesh count: what practitioners try
    keep = sorted({m for m in divs if (m & (m - 1)) == 0 or m % nmeshes == 0})
    return [m for m in keep if m >= min(nmeshes, w.global_batch)]


def plan(w: Workload, cluster: Cluster, opts: PlanOptions = PlanOptions(),
         progress: Progress | None = None, *, stop: threading.Event | None = None) -> PlanResult:
    """Search plans for ``w`` on ``cluster``; return the fastest that fits memory.

    Args:
        progress: called ``(done, total, best_s)`` before each candidate and once at the end.
        stop: when set (from a signal handler, another thread, or ``progress``), the search ends
            within about 50 ms: no further candidate starts and the running CP-SAT solve stops,
            keeping its best solution. Unset, the search is deterministic as before.

    Raises:
        InfeasibleError: no candidate fits; the message names the mesh that lacks the most bytes.
        PlanInterrupted: ``stop`` was set before any candidate gave a plan that fits.
        PlannerError: bad options (an unknown schedule, no microbatch count dividing the batch).
    """
    t0 = time.monotonic()
    meshes = tuple(opts.meshes or cluster.meshes)
    specs = [cluster.meshes[m] for m in meshes]
    if w.training:
        scheds = opts.schedules or TRAIN_SCHEDULES
        kinds_of = {s: ("F", "B", "W") if s.startswith("zb") else ("F", "B") for s in scheds}
    else:
        scheds = ("gpipe",)
        kinds_of = {"gpipe": ("F",)}
    counts = _microbatch_counts(w, opts, len(meshes))
    if not counts:
        raise PlannerError(f"no microbatch count divides global batch {w.global_batch}; "
                           f"pass --global-batch with more divisors")
    pre, nb, post = _split_layers(w)
    combos = [(s, m) for m in counts for s in scheds
              if not (s == "interleaved-1f1b" and nb % opts.virtual_stages)]
    tried: list[tuple[str, int, float | None]] = []
    bounds: list[float] = []          # per searched candidate: proven surrogate lower bound, s
    best: tuple[float, Plan, Prediction] | None = None
    det_used = 0.0
    interrupted = False               # the stop event cut the search short
    for n, (sched, mb) in enumerate(combos):
        if progress:
            progress(len(tried), len(combos), best[0] if best else None)
        if stop is not None and stop.is_set():
            interrupted = True
            break
        left = opts.time_limit_s - (time.monotonic() - t0)
        if left <= 0:
            break
        samples = w.global_batch / mb
        split = sched.startswith("zb")
        v = opts.virtual_stages if sched == "interleaved-1f1b" else 1
        options = tuple(_mesh_options(w, ms, samples, kinds_of[sched], split, opts.headroom,
                                      opts.max_tensor, opts.fsdp) for ms in specs)
        if any(not o for o in options):
            tried.append((sched, mb, None))
            bounds.append(math.inf)
            continue
        act = w.layer(pre).activation_bytes_per_sample * samples
        comm = tuple(tuple(0.0 if a == b else 2 * cm.transfer_time(
            act, cluster.link_between(a, b).link) for b in meshes) for a in meshes)
        cand = Candidate(sched, mb, v, nb, meshes, options, comm, sched in MERGEABLE and w.training,
                         even_split=opts.even_split,
                         required_meshes=meshes if opts.even_split else ())
        # an equal share of the deterministic budget still unused (CP-SAT's deterministic time is
        # reproducible, so is the split), capped by the wall clock left
        share = max(0.05, (opts.time_limit_s - det_used) / (len(combos) - n))
        out = solve_outcome(cand, time_limit_s=left, seed=opts.seed, workers=opts.workers,
                            deterministic_limit=share, stop=stop)
        det_used += out.deterministic_s
        bounds.append(out.bound_s)
        interrupted |= out.stopped
        a = out.assignment
        if a is None:
            tried.append((sched, mb, None))
            continue
        p = build_plan(w, cluster, a, sched, mb, v)
        pred = predict(p, w, cluster, headroom=opts.headroom)
        tried.append((sched, mb, pred.step_time_s if pred.fits else None))
        if not pred.fits:
            continue
        solver = {"status": a.status, "objective": a.objective_s, "bound": a.bound_s,
                  "gap": (a.objective_s - a.bound_s) / a.objective_s if a.objective_s else 0.0,
                  "wall_s": a.wall_s}
        p = replace(p, predicted=pred.to_json(), solver=solver)
        if best is None or pred.step_time_s < best[0] * (1 - 1e-9):
            best = (pred.step_time_s, p, pred)
    if progress:
        progress(len(tried), len(combos), best[0] if best else None)
    total_wall = time.monotonic() - t0
    if best is None:
        if interrupted:
            raise PlanInterrupted(f"interrupted after {total_wall:.0f} s before any feasible plan")
        raise InfeasibleError(explain_infeasible(w, cluster, meshes, opts.headroom,
                                                 opts.max_tensor))
    _, p, pred = best
    # the bound over every candidate is known only when every candidate was searched
    bound = min(bounds) if len(tried) == len(combos) else None
    obj = p.solver["objective"]
    gap = None if bound is None else (max(0.0, (obj - bound) / obj) if obj else 0.0)
    p = replace(p, solver={**p.solver, "search_wall_s": total_wall, "candidates": len(tried),
                           "candidates_total": len(combos), "interrupted": interrupted,
                           "search_bound": bound, "search_gap": gap})
    return PlanResult(p, pred, tuple(tried), interrupted=interrupted,
                      candidates_total=len(combos), search_bound_s=bound, search_gap=gap)


def explain_infeasible(w: Workload, cluster: Cluster, meshes: tuple[str, ...], headroom: float,
                       max_tensor: int = 8) -> str:
    """One line: which mesh lacks how many bytes in the most memory-frugal plan.

    That plan uses every mesh, splits layers in proportion to each mesh's usable memory, shards
    everything over the mesh (tensor parallel across all its devices) and runs one sample per
    microbatch; if even that does not fit, no plan does. If it fits only with more tensor
    parallelism than ``max_tensor`` allows, the message says so.
    """
    specs = [cluster.meshes[m] for m in meshes]
    usable = [cm.usable_bytes(s, headroom) * s.num_devices for s in specs]
    total = sum(usable)
    n = len(w.layers)
    bounds, acc = [0], 0.0
    for u in usable:
        acc += u
        bounds.append(min(n, round(n * acc / total)))
    worst = None
    for i, (m, s) in enumerate(zip(meshes, specs)):
        lo, hi = bounds[i], max(bounds[i + 1], bounds[i] + 1) if bounds[i] < n else n
        if lo >= hi:
            continue
        mem = cm.stage_memory(w, lo, hi, Layout(1, s.num_devices), 1.0, w.training)
        need = mem.static_bytes + mem.residual_bytes_per_microbatch * max(1, len(meshes) - i)
        lack = need - cm.usable_bytes(s, headroom)
        if worst is None or lack > worst[1]:
            worst = (m, lack, need, cm.usable_bytes(s, headroom))
    if worst is None or worst[1] <= 0:
        widest = max(s.num_devices for s in specs)
        if widest > max_tensor:
            return (f"model {w.model!r} fits cluster {cluster.name!r} only with tensor parallelism "
                    f"wider than --max-tensor {max_tensor} (meshes of up to {widest} devices); "
                    f"raise --max-tensor or split the cluster into more meshes")
        return (f"model {w.model!r} found no plan on cluster {cluster.name!r} within the time "
                f"limit; raise --time-limit")
    m, lack, need, has = worst
    return (f"model {w.model!r} does not fit cluster {cluster.name!r}: mesh {m!r} lacks "
            f"{lack / 1e9:.1f} GB per device (needs {need / 1e9:.1f} GB, has {has / 1e9:.1f} GB "
            f"usable) even with layers split by memory; add devices or lower --global-batch/--seq-len")
