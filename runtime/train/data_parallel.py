"""``mpmd run`` on a heterogeneous data-parallel plan: pipelines side by side on uneven shares of the
batch, their gradients all-reduced across the parts before the optimizer.

A :class:`~ir.DataParallelPlan` (``mpmd plan`` on a cluster of several device kinds, when
data parallelism across the kinds wins) has ``parts``, each a one-pipeline :class:`~ir.Plan`
on its own meshes with its own share ``B_p`` of the global batch ``B`` (whole microbatches). Each
part is compiled as :func:`runtime.train.run.run_plan` compiles a plan (its layouts as shardings,
its schedule, merges and splits) and runs its share: the first ``B_0`` samples of every global
batch go to part 0, the next ``B_1`` to part 1, and so on, each part splitting its share into its
own microbatches. A part's loss is the mean over its samples, so the step's loss and gradients are
the share-weighted sums ``sum_p (B_p / B) x_p``. That sum is the cross-part gradient all-reduce:
every part's gradient leaves are moved (``jax.device_put``) onto part 0's placement of the leaf,
summed there, and the result is moved back onto every part's placement, so each part keeps a full
replica of the parameters and of Adam's state, updated identically (Metis, Um et al. ATC'24;
HetHub). The parts run one after the other in this process; the measured step is their summed step
times plus the all-reduce, against the simulator's replay of the whole plan
(:func:`simulator.plan_sim.simulate_data_parallel`; meshes sharing a host are serialised there too).

The checks are those of a one-pipeline run: loss and gradients against ``jax.jit`` of the whole
batch on one device, every part's per-mesh order against its schedule, one executable per unique
fragment body and mesh.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping

import jax
import numpy as np

import zoo
from zoo.config import ModelConfig
from zoo.model_files import plan_model
from compiler.plan_config import config_from_plan
from compiler.runtime import run_program
from hardware_profiles.types import Cluster
from ir import DataParallelPlan
from runtime.train import check
from runtime.train.context import layer_splits
from runtime.train.report import RunReport
from runtime.train.step import (RunError, check_layouts, adam_init, adam_update, batches, compile_step,
                                executed_plan, load_text, measured_step_time, place_inputs,
                                plan_topology, run_cluster, split_microbatches, step_outputs,
                                train_step_fn, with_plan_specs)
from simulator.plan_sim import simulate_data_parallel


def _shares(plan: DataParallelPlan, batch: Mapping[str, np.ndarray]) -> list[tuple[dict, ...]]:
    """The global batch ``{k: [1, B, S]}`` cut into each part's microbatches ``[b_p, S]``."""
    out, at = [], 0
    for part in plan.parts:
        n, M = part.global_batch, part.microbatches
        if n % M:
            raise RunError(f"part on {part.rank_mesh[0]!r}: its batch share {n} is not divisible by "
                           f"its {M} microbatches; re-plan")
        piece = {k: v[0, at:at + n].reshape(M, n // M, *v.shape[2:]) for k, v in batch.items()}
        out.append(split_microbatches(piece))
        at += n
    return out


def cross_part_sum(trees: list[Any], weights: list[float]) -> list[Any]:
    """The all-reduce across parts: ``sum_p weights[p] * trees[p]`` leaf by leaf, computed on
    part 0's placement of each leaf and returned on every part's own placement."""
    flat = [jax.tree.flatten(t) for t in trees]
    leaves0, tree0 = flat[0]
    total = []
    for k, x0 in enumerate(leaves0):
        s = x0 * weights[0]
        for (leaves, _), w in zip(flat[1:], weights[1:]):
            s = s + jax.device_put(leaves[k], x0.sharding) * w
        total.append(s)
    return [jax.tree.unflatten(tree, [jax.device_put(t, x.sharding) for t, x in zip(total, leaves)])
            for leaves, tree in flat]


def simulated_step_time(plan: DataParallelPlan, cluster: Cluster, cfg: ModelConfig) -> float:
    """The simulator's step of ``plan`` as executed here (every part's backward syncing its
    microbatch's gradients itself, ``grad_sync="microbatch"``), without the optimizer ops, s."""

    dp = dataclasses.replace(plan, parts=tuple(executed_plan(p) for p in plan.parts))
    wls = [zoo.workload(cfg, p.global_batch, p.seq_len) for p in plan.parts]
    res = simulate_data_parallel(dp, wls, cluster)
    return max((e.end_s for e in res.timeline.events if e.kind != "optimizer"), default=0.0)


def run_data_parallel(plan: DataParallelPlan, steps: int, *, cluster_path: str, lr: float,
                      seed: int, check_every: int, model_overrides: Mapping[str, Any] | None,
                      simulate: bool, console: Any, quiet: bool) -> RunReport:
    """Compile and run ``steps`` training steps of a data-parallel plan (see the module docstring);
    the arguments are :func:`runtime.train.run.run_plan`'s.

    Raises:
        RunError: a share not divisible by its part's microbatches, or too few devices.
    """

    cluster = run_cluster(plan, cluster_path)
    cfg = zoo.get_config(plan_model(plan.model, plan.model_config), seq_len=plan.seq_len,
                         **dict(model_overrides or {}))
    check_layouts(plan, cfg)
    names = zoo.layer_names(cfg)
    data = batches(load_text(), 1, plan.global_batch, plan.seq_len, seed=seed)
    batch = next(data)
    shares = _shares(plan, batch)
    weights = [p.global_batch / plan.global_batch for p in plan.parts]
    params0 = zoo.init_params(cfg, jax.random.PRNGKey(seed))
    exported, params, opts, out_trees = [], [], [], []
    for part, mbs in zip(plan.parts, shares):
        topology = plan_topology(part, cluster)
        step = train_step_fn(cfg, part.microbatches, layer_splits(part, cfg, topology))
        config = config_from_plan(part, topology, layer_names=names)
        ex = compile_step(step, with_plan_specs(config, part, cfg, params0, mbs), (params0, mbs))
        placed = place_inputs(params0, ex)
        exported.append(ex)
        out_trees.append(jax.tree.structure(jax.eval_shape(step, params0, mbs)))
        params.append(placed)
        opts.append(adam_init(placed))
        run_program(ex, (placed, mbs), record=False)     # compile and warm every executable
    ref_dev = jax.devices()[0]
    ref_step = jax.jit(train_step_fn(cfg, 1))
    losses, lerr, gerr, leaf_err, times, timelines = [], [], [], [], [], []
    orders: list[Mapping[str, tuple[str, ...]]] = [{} for _ in plan.parts]
    for i in range(steps):
        part_loss, part_grads, step_s = [], [], 0.0
        for k, (ex, mbs) in enumerate(zip(exported, shares)):
            run = run_program(ex, (params[k], mbs))
            loss_k, grads_k = step_outputs(run.outputs, out_trees[k])
            part_loss.append(float(loss_k))
            part_grads.append(grads_k)
            step_s += run.timeline.step_time_s
            timelines.append(run.timeline)
            orders[k] = run.order
        t0 = time.perf_counter()
        synced = cross_part_sum(part_grads, weights)
        jax.block_until_ready(synced)
        step_s += time.perf_counter() - t0
        loss = sum(w * x for w, x in zip(weights, part_loss))
        losses.append(loss)
        times.append(step_s)
        if i == 0 or (check_every and i % check_every == 0) or i == steps - 1:
            whole = split_microbatches(batch)
            rl, rg = ref_step(jax.device_put(jax.device_get(params[0]), ref_dev),
                              jax.device_put(whole, ref_dev))
            lerr.append(abs(loss - float(rl)) / max(abs(float(rl)), 1e-30))
            for g in synced:
                gerr.append(check.tree_rel_error(g, rg))
                leaf_err.append(check.max_rel_error(g, rg))
        if not quiet and console is not None:
            console.print(f"step {i}: loss {loss:.4f}  step {step_s * 1e3:.1f} ms")
        for k in range(len(plan.parts)):
            params[k], opts[k] = adam_update(params[k], synced[k], opts[k], lr)
        batch = next(data)
        shares = _shares(plan, batch)
    bodies = zoo.workload(cfg, plan.global_batch, plan.seq_len).layers
    mismatches, counts, order = [], {}, {}
    for part, ex, o in zip(plan.parts, exported, orders):
        mismatches += check.order_mismatches(part, o)
        counts.update(check.executable_counts(ex, part, bodies))
        order.update({m: o[m] for m in part.rank_mesh if m in o})
    sim = simulated_step_time(plan, cluster, cfg) if simulate else None
    replicas_equal = all(check.tree_rel_error(p, params[0]) == 0.0 for p in params[1:])
    return RunReport(plan=plan, losses=tuple(losses), loss_rel_errors=tuple(lerr),
                     grad_rel_errors=tuple(gerr), grad_leaf_rel_errors=tuple(leaf_err),
                     order_mismatches=tuple(mismatches), executables=counts,
                     measured_step_s=measured_step_time(times), simulated_step_s=sim,
                     step_times_s=tuple(times), executed_order=order, timelines=tuple(timelines),
                     opt_state_follows_params=replicas_equal and all(
                         check.same_shardings(p, o["m"], o["v"]) for p, o in zip(params, opts)))
