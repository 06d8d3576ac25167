"""``mpmd run``: compile a plan into per-mesh programs, train on the shipped text, check the run.

:func:`run_plan` loads ``plan.json``, builds the topology from the plan's cluster file over
``jax.devices()``, compiles the training step (``compiler.frontend.jit(step, config_from_plan(...))``),
and runs ``steps`` real training steps of the plan's zoo model on the shipped public-domain text
(``runtime/train/data/kjv_pentateuch.txt``, bytes as tokens, vocabulary 256) with Adam in plain JAX.
It checks (a) loss and gradients against a plain ``jax.jit`` of the same step on one device,
(b) the executed per-mesh order against the plan, (c) executables against unique fragment bodies,
(d) the measured step time against the simulator's replay of the same plan on the calibrated cluster.
"""


from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import jax

import zoo
from compiler.runtime import run_program
from ir import DataParallelPlan, Plan
from runtime.train import check
from runtime.train.data_parallel import run_data_parallel
from runtime.train.generate import GenerateReport, generate_plan
from runtime.train.report import RunReport, print_report
from runtime.train.step import (RunError, adam_init, adam_update, compile_plan, load_run_plan,
                                measured_step_time, place_inputs, plan_topology, run_cluster,
                                simulated_step_time, split_microbatches, step_outputs)

__all__ = ["RunError", "RunReport", "print_report", "run_plan"]


def run_plan(plan_path: str | Path | Plan | DataParallelPlan, steps: int = 3, *,
             cluster_path: str | Path | None = None,
             lr: float = 1e-3, seed: int = 0, check_every: int = 1,
             model_overrides: Mapping[str, Any] | None = None, simulate: bool = True,
             console: Any = None, quiet: bool = False) -> RunReport | GenerateReport:
    """Compile and run ``steps`` training steps of a plan; see the module docstring. A forward-only
    (inference) plan runs its DiT's sampler instead (``steps``, ``lr`` and ``check_every`` unused)
    and returns :class:`runtime.train.generate.GenerateReport`.

    Args:
        plan_path: a plan.json path, or a :class:`Plan` or :class:`DataParallelPlan`.
        steps: training steps (Adam, learning rate ``lr``).
        cluster_path: the cluster YAML (default: the plan's ``cluster_path``).
        check_every: compare against ``jax.jit`` every this many steps (the first always).
        model_overrides: zoo ``ModelConfig`` fields to override (smaller test models).
        simulate: also simulate the plan for check (d).

    Raises:
        RunError: missing cluster, too few devices, no compiler.
        ir.files.InputError / ir.IRError: an unreadable or malformed plan file
            (:func:`ir.plan_file.load_plan`).
    """
    plan = load_run_plan(plan_path)
    if not isinstance(plan, DataParallelPlan) and plan.schedule.forward_only:
        return generate_plan(plan, cluster_path=cluster_path, seed=seed, simulate=simulate,
                             model_overrides=model_overrides, console=console, quiet=quiet)
    cpath = cluster_path or plan.cluster_path
    if isinstance(plan, DataParallelPlan):   # pipelines side by side on uneven batch shares
        if not cpath:
            raise RunError("the plan names no cluster file; pass cluster_path (--cluster)")
        return run_data_parallel(plan, steps, cluster_path=cpath, lr=lr, seed=seed,
                                 check_every=check_every, model_overrides=model_overrides,
                                 simulate=simulate, console=console, quiet=quiet)
    if not cpath:
        raise RunError("the plan names no cluster file; pass cluster_path (--cluster)")
    cluster = run_cluster(plan, cpath)
    topology = plan_topology(plan, cluster)
    prog = compile_plan(plan, topology, seed=seed, model_overrides=model_overrides)
    cfg, step, params, data, first = prog.cfg, prog.step, prog.params, prog.data, prog.first
    exported = prog.exported
    params = place_inputs(params, exported)
    out_tree = jax.tree.structure(jax.eval_shape(step, params, first))
    ref_dev = jax.devices()[0]
    ref_step = jax.jit(step)
    opt = adam_init(params)
    losses, lerr, gerr, leaf_err, times, timelines = [], [], [], [], [], []
    order: Mapping[str, tuple[str, ...]] = {}
    batch = first
    # one untimed execution first: compiles every executable and warms XLA's buffers, so the timed
    # steps measure running, not compiling (the report's step time is the median of steps 1..)
    run_program(exported, (params, batch), record=False)
    for i in range(steps):
        ex = run_program(exported, (params, batch))
        loss, grads = step_outputs(ex.outputs, out_tree)
        losses.append(float(loss))
        times.append(ex.timeline.step_time_s)
        timelines.append(ex.timeline)
        order = ex.order
        if i == 0 or (check_every and i % check_every == 0) or i == steps - 1:
            rl, rg = ref_step(jax.device_put(jax.device_get(params), ref_dev),
                              jax.device_put(batch, ref_dev))
            lerr.append(check.rel_error(loss, rl))
            gerr.append(check.tree_rel_error(grads, rg))
            leaf_err.append(check.max_rel_error(grads, rg))
        if not quiet and console is not None:
            console.print(f"step {i}: loss {losses[-1]:.4f}  step {times[-1] * 1e3:.1f} ms")
        params, opt = adam_update(params, grads, opt, lr)
        batch = split_microbatches(next(data))
    measured = measured_step_time(times)
    sim = simulated_step_time(plan, cluster, cfg) if simulate else None
    bodies = zoo.workload(cfg, plan.global_batch, plan.seq_len).layers
    return RunReport(param_shardings=check.placements(params, topology),
                     opt_state_follows_params=check.same_shardings(params, opt["m"], opt["v"]),
                     plan=plan, losses=tuple(losses), loss_rel_errors=tuple(lerr),
                     grad_rel_errors=tuple(gerr), grad_leaf_rel_errors=tuple(leaf_err),
                     order_mismatches=tuple(check.order_mismatches(plan, order)),
                     executables=check.executable_counts(exported, plan, bodies),
                     measured_step_s=measured, simulated_step_s=sim, step_times_s=tuple(times),
                     executed_order=order, timelines=tuple(timelines))


