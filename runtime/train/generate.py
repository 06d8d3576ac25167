"""``mpmd run`` of a forward-only (inference) plan: a DiT generates from noise through MPMD.

:func:`generate_plan` loads a forward-only plan of a zoo DiT (``mochi-dit-tiny``,
``mochi-dit-10b``), compiles one denoising forward (``compiler.frontend.jit(
forward_step_fn(...), config_from_plan(...))``: the plan's microbatches through its stages, F
fragments only) and drives a sampler with it: ``cfg.sampling_steps`` Euler steps from Gaussian
noise, each one execution of the MPMD program followed by the guidance and Euler update in plain
JAX (as ``mpmd run`` runs Adam outside the training program). It checks (a) the generated latents
and every step's velocities against one ``jax.jit`` of the whole sampler (:func:`sample_fn`: the
same forward and update, on one device, from the same noise), (b) the executed per-mesh order
against the plan, (c) executables against unique fragment bodies (:mod:`runtime.train.check`),
and reports (d) the measured step (one denoising forward) against the simulator's.

Sampler (after Genmo's Mochi 1 ``sample_model``, github.com/genmoai/mochi ``pipelines.py``):
rectified flow, the DiT predicts the velocity ``v = z_0 - eps`` at noise level ``sigma`` (its
timestep input); Euler steps ``z <- z + (sigma_i - sigma_{i+1}) * v`` over ``sigma`` from 1 to 0,
with classifier-free guidance ``v = v_uncond + s * (v_cond - v_uncond)``. Simplifications: a
linear sigma schedule (Mochi uses a linear-quadratic one), a constant guidance scale ``s``
(Mochi 1: 4.5), zero text features for the unconditional pass (Mochi encodes the empty prompt).

Batch: the plan's ``global_batch`` is the DiT inputs of one denoising step, ``videos * cfg_passes``
(``mpmd plan`` defaults it to ``sampling_steps * cfg_passes`` for inference models); rows
``[0, videos)`` are the conditional pass, ``[videos, 2 * videos)`` the unconditional one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from rich.console import Console
from rich.table import Table

import zoo
from zoo.config import ModelConfig
from zoo.model_files import plan_model
from compiler.plan_config import config_from_plan
from compiler.runtime import run_program
from ir import DataParallelPlan, Plan
from ir.plan_file import load_plan
from runtime.train import check
from runtime.train.step import (RunError, check_layouts, compile_step, measured_step_time, place_inputs,
                                plan_topology, run_cluster, simulated_step_time, with_plan_specs)

CFG_SCALE = 4.5
"""Classifier-free guidance scale: Mochi 1's (Genmo 2024, github.com/genmoai/mochi; "CFG 4.5" in
the source of the zoo's ``mochi-dit-10b``, ``zoo.config``)."""


def sigma_schedule(steps: int) -> np.ndarray:
    """Noise levels ``1, 1 - 1/steps, ..., 0`` (``steps + 1`` float32 values), linear in ``sigma``.

    Raises:
        ValueError: ``steps`` < 1.
    """
    if steps < 1:
        raise ValueError(f"sampling steps {steps} must be at least 1; set sampling_steps >= 1")
    return np.linspace(1.0, 0.0, steps + 1, dtype=np.float32)


def split_rows(batch: Mapping[str, Any], microbatches: int) -> tuple[dict, ...]:
    """``{k: [B, ...]}`` -> ``microbatches`` dicts ``{k: [B / M, ...]}`` of consecutive rows.

    Raises:
        RunError: ``B`` not divisible by ``microbatches``.
    """
    B = len(next(iter(batch.values())))
    if B % microbatches:
        raise RunError(f"batch {B} is not divisible by {microbatches} microbatches; "
                       f"re-plan with a global batch that is a multiple of the microbatch count")
    b = B // microbatches
    return tuple({k: v[m * b:(m + 1) * b] for k, v in batch.items()} for m in range(microbatches))


def forward_step_fn(cfg: ModelConfig, microbatches: int):
    """``(params, mbs) -> velocities``: the zoo DiT forward (named layers) of each of the M
    microbatches ``mbs`` (``{"latent" [b,C,F,H,W], "timestep" float32 [b], "text" [b,T,td]}``,
    see :func:`split_rows`), a tuple of M velocities ``[b,C,F,H,W]``.

    Raises:
        ValueError: called with a different number of microbatches.
    """
    fwd = zoo.forward(cfg)

    def step(params, mbs):
        if len(mbs) != microbatches:
            raise ValueError(f"the step takes {microbatches} microbatches, got {len(mbs)}; "
                             f"split the batch with split_rows")
        return tuple(fwd(params, mb) for mb in mbs)
    return step


def dit_inputs(z: jax.Array, sigma: float, text: jax.Array) -> dict:
    """One step's DiT batch: latents ``z`` [V,C,F,H,W] twice (conditional, unconditional), the
    timestep ``sigma`` per row, ``text`` [V,T,td] then zeros (the unconditional text)."""
    zz = jnp.concatenate([z, z])
    return {"latent": zz, "timestep": jnp.full((zz.shape[0],), sigma, jnp.float32),
            "text": jnp.concatenate([text, jnp.zeros_like(text)])}


def euler_update(z: jax.Array, v_all: jax.Array, dsigma: float, scale: float) -> jax.Array:
    """``z + dsigma * (v_u + scale * (v_c - v_u))`` with ``v_all = [v_c; v_u]`` [2V,C,F,H,W]."""
    v_c, v_u = jnp.split(v_all, 2)
    return z + dsigma * (v_u + scale * (v_c - v_u))


def sample_fn(cfg: ModelConfig, microbatches: int, scale: float = CFG_SCALE):
    """``(params, noise [V,C,F,H,W], text [V,T,td]) -> (latents [V,C,F,H,W], velocities
    [steps, 2V,C,F,H,W])``: the whole sampler in one function (``cfg.sampling_steps`` Euler steps
    of :func:`forward_step_fn`, a ``jax.lax.scan`` over the steps), with every step's DiT
    velocities; the reference that :func:`generate_plan` checks the MPMD run against under
    ``jax.jit``."""
    step = forward_step_fn(cfg, microbatches)
    sig = sigma_schedule(cfg.sampling_steps)

    def sample(params, noise, text):
        def one(z, s):
            sigma, dsigma = s[0], s[1]
            v = jnp.concatenate(step(params, split_rows(dit_inputs(z, sigma, text), microbatches)))
            return euler_update(z, v, dsigma, scale), v
        return jax.lax.scan(one, noise, jnp.stack([sig[:-1], sig[:-1] - sig[1:]], axis=1))
    return sample


@dataclass(frozen=True)
class GenerateReport:
    """What :func:`generate_plan` measured and checked (SI units).

    ``latent_rel_error``: the generated latents against ``jax.jit`` of :func:`sample_fn`;
    ``velocity_rel_errors``: per denoising step, the step's velocities (all rows, one vector)
    against the same step of ``jax.jit`` of :func:`sample_fn`;
    ``step_times_s``: one MPMD forward per denoising step; ``measured_step_s`` their
    :func:`~runtime.train.run.measured_step_time`; ``simulated_step_s`` the simulator's step.
    """

    plan: Plan
    latents: Any = field(repr=False)
    latent_rel_error: float
    velocity_rel_errors: tuple[float, ...]
    order_mismatches: tuple[str, ...]
    executables: Mapping[str, check.ExecutableCount]
    measured_step_s: float
    simulated_step_s: float | None
    step_times_s: tuple[float, ...]
    executed_order: Mapping[str, tuple[str, ...]]

    @property
    def max_rel_error(self) -> float:
        return max((self.latent_rel_error, *self.velocity_rel_errors))

    @property
    def executables_ok(self) -> bool:
        return all(c.ok for c in self.executables.values())


def check_forward_only(plan: Plan, cfg: ModelConfig) -> None:
    """Raise :class:`RunError` unless ``plan`` is a forward-only plan of an inference DiT."""
    if not plan.schedule.forward_only:
        raise RunError(f"plan of {plan.model!r} is not forward-only; train it with run_plan")
    if cfg.family != "mochi" or cfg.training:
        raise RunError(f"forward-only plans run zoo DiTs (mochi-dit-tiny, mochi-dit-10b), not "
                       f"{plan.model!r}; plan a DiT")
    if plan.global_batch % cfg.cfg_passes or cfg.cfg_passes != 2:
        raise RunError(f"global batch {plan.global_batch} must be videos x 2 guidance passes "
                       f"({cfg.name} has cfg_passes={cfg.cfg_passes}); re-plan with an even "
                       f"--global-batch")


def generate_plan(plan_path: str | Path | Plan, *, cluster_path: str | Path | None = None,
                  seed: int = 0, scale: float = CFG_SCALE,
                  model_overrides: Mapping[str, Any] | None = None, simulate: bool = True,
                  console: Any = None, quiet: bool = False) -> GenerateReport:
    """Run a forward-only plan's sampler through the MPMD program; see the module docstring.

    Args:
        plan_path: a plan.json path, or a :class:`Plan` (forward-only, of a zoo DiT).
        cluster_path: the cluster YAML (default: the plan's ``cluster_path``).
        seed: draws the parameters, the noise and the text features.
        scale: classifier-free guidance scale.
        model_overrides: zoo ``ModelConfig`` fields to override (e.g. ``sampling_steps``).
        simulate: also simulate the plan for check (d).

    Raises:
        RunError: not a forward-only DiT plan, missing cluster, too few devices.
        ir.files.InputError / ir.IRError: an unreadable or malformed plan file.
    """

    if isinstance(plan_path, Plan):
        plan = plan_path
    else:
        plan = load_plan(plan_path)
    if isinstance(plan, DataParallelPlan):
        raise RunError(f"the plan is data parallel over {len(plan.parts)} pipelines, but "
                       f"'mpmd run' executes one pipeline; run a single-pipeline plan")
    cfg = zoo.get_config(plan_model(plan.model, plan.model_config),
                         **dict(model_overrides or {}))
    check_forward_only(plan, cfg)
    check_layouts(plan, cfg)
    cpath = cluster_path or plan.cluster_path
    if not cpath:
        raise RunError("the plan names no cluster file; pass cluster_path (--cluster)")
    cluster = run_cluster(plan, cpath)
    topology = plan_topology(plan, cluster)
    M, V = plan.microbatches, plan.global_batch // 2
    k_p, k_z, k_t = jax.random.split(jax.random.PRNGKey(seed), 3)
    params = zoo.init_params(cfg, k_p)
    spec = zoo.batch_spec(cfg, V)
    noise = jax.random.normal(k_z, spec["latent"].shape, spec["latent"].dtype)
    text = jax.random.normal(k_t, spec["text"].shape, spec["text"].dtype)
    sig = sigma_schedule(cfg.sampling_steps)
    step = forward_step_fn(cfg, M)
    first = split_rows(dit_inputs(noise, sig[0], text), M)
    config = config_from_plan(plan, topology, layer_names=zoo.layer_names(cfg))
    exported = compile_step(step, with_plan_specs(config, plan, cfg, params, first), (params, first))
    params = place_inputs(params, exported)
    ref_dev = jax.devices()[0]
    ref_z, ref_v = jax.jit(sample_fn(cfg, M, scale))(
        *jax.device_put((jax.device_get(params), noise, text), ref_dev))
    update = jax.jit(euler_update, static_argnums=(3,))
    run_program(exported, (params, first), record=False)   # compile every executable first
    z, verr, times, order = noise, [], [], {}
    for i in range(cfg.sampling_steps):
        ex = run_program(exported, (params, split_rows(dit_inputs(z, sig[i], text), M)))
        v = jnp.concatenate([jax.device_put(o, ref_dev) for o in ex.outputs])
        verr.append(check.rel_error(v, ref_v[i]))
        times.append(ex.timeline.step_time_s)
        order = ex.order
        z = update(jax.device_put(z, ref_dev), v, float(sig[i] - sig[i + 1]), scale)
        if not quiet and console is not None:
            console.print(f"denoising step {i}: sigma {sig[i]:.3f} -> {sig[i + 1]:.3f}  "
                          f"forward {times[-1] * 1e3:.1f} ms  velocity rel error {verr[-1]:.1e}")
    bodies = [zoo.body_of(cfg, n) for n in zoo.layer_names(cfg)]
    return GenerateReport(
        plan=plan, latents=z, latent_rel_error=check.rel_error(z, ref_z),
        velocity_rel_errors=tuple(verr),
        order_mismatches=tuple(check.order_mismatches(plan, order)),
        executables=check.executable_counts(exported, plan, bodies),
        measured_step_s=measured_step_time(times),
        simulated_step_s=simulated_step_time(plan, cluster, cfg) if simulate else None,
        step_times_s=tuple(times), executed_order=order)


def print_generate_report(report: GenerateReport, console: Any = None) -> None:
    """Print a :class:`GenerateReport` as a rich table."""

    console = console or Console()
    p = report.plan
    t = Table(title=f"mpmd run (forward only): {p.model} on {p.cluster}, {p.schedule.name}, "
                    f"{p.microbatches} microbatches, {len(report.step_times_s)} denoising steps")
    t.add_column("check")
    t.add_column("result", justify="right")
    t.add_column("ok")
    t.add_row("(a) rel error vs jax.jit (latents; worst step's velocities)",
              f"{report.latent_rel_error:.2e}; {max(report.velocity_rel_errors):.2e}",
              "yes" if report.max_rel_error < 1e-5 else "NO")
    bad = report.order_mismatches
    t.add_row("(b) per-mesh order", "; ".join(bad) if bad else "as planned",
              "NO" if bad else "yes")
    t.add_row("(c) executables = fragment bodies", ", ".join(
        str(c) for c in report.executables.values()), "yes" if report.executables_ok else "NO")
    if report.simulated_step_s is not None:
        err = check.step_time_error(report.measured_step_s, report.simulated_step_s)
        t.add_row("(d) forward measured / simulated",
                  f"{report.measured_step_s * 1e3:.1f} / {report.simulated_step_s * 1e3:.1f} ms "
                  f"({err * 100:.1f}%)", "info")
    console.print(t)
