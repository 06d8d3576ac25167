"""``mpmd run`` of a forward-only plan of a Llama-family decoder: greedy decoding with a KV cache,
prefill and decode each compiled as an MPMD program.

:func:`decode_plan` loads a forward-only plan of a dense Llama-family decoder (e.g. ``mpmd plan
--model spec.yaml`` of llama-tiny's fields with ``training: false``; the planner gives inference
models the forward-only GPipe schedule) and compiles two programs with the project's compiler
(``compiler.frontend.jit(step, config_from_plan(...))``, the plan's stages, meshes, layouts and
per-mesh order, as :mod:`runtime.train.generate` compiles a DiT forward):

- the **prefill** step: the plan's microbatches of prompts ``[b, P]`` through every layer
  (:func:`zoo.kv_decode.prefill_fn`), returning each microbatch's last-position logits, greedy
  token and per-block caches ``[b, max_len, kv_heads, head_dim]``;
- the **decode** step: each microbatch's previous token at position ``pos`` through every layer
  (:func:`zoo.kv_decode.decode_fn`) with its caches as explicit inputs and outputs. Each block's
  caches are read and written only by that block's named computation, so the compiler places them
  on the block's mesh (sharded over ``model`` by KV head under tensor parallelism, over ``data``
  by row) and they stay there from step to step; only the token and the scalar ``pos`` cross
  meshes besides the activations.

It runs one prefill and ``new_tokens`` decode executions, feeding each step's greedy tokens back
(outside the program, as ``mpmd run`` runs Adam outside the training step), and checks
(a) the tokens, exactly, against one ``jax.jit`` of the cached greedy decoding
(:func:`zoo.kv_decode.greedy_decode`, one device, unsplit batch) and against ``jax.jit`` of
greedy decoding without a cache (:func:`zoo.kv_decode.greedy_reference`: the zoo's full forward
of the growing sequence), with the logits' relative error; (b) each program's executed per-mesh
order against the plan; (c) executables against unique fragment bodies; (d) every block's
caches in and out of the decode program on that block's mesh; and reports (e) the
measured decode step time next to the simulator's forward of the plan at ``seq_len`` 1 (see
:class:`DecodeReport` for what that figure leaves out).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec
from rich.console import Console
from rich.table import Table

import zoo
from compiler.exported import ExportedProgram, Send
from compiler.plan_config import config_from_plan
from compiler.runtime import run_program
from ir import DataParallelPlan, Plan
from ir.plan_file import load_plan
from runtime.train import check
from runtime.train.layouts import MODEL, batch_spec, layer_meshes, param_specs
from runtime.train.step import (RunError, compile_step, load_text, measured_step_time,
                                plan_topology, run_cluster, simulated_step_time)
from zoo import kv_decode
from zoo.config import ModelConfig, ZooError
from zoo.model_files import plan_model

NEW_TOKENS = 32
"""Decode executions after the prefill (each one new greedy token)."""
PROMPT_LEN = 16
"""Prompt tokens per sequence (a window of the shipped text, bytes as tokens)."""


def is_decoder_plan(plan: Plan | DataParallelPlan) -> bool:
    """Whether ``plan`` is a forward-only single-pipeline plan of a Llama-family decoder (what
    :func:`decode_plan` runs; a forward-only DiT plan goes to :mod:`runtime.train.generate`)."""
    if isinstance(plan, DataParallelPlan) or not plan.schedule.forward_only:
        return False
    return plan_model(plan.model, plan.model_config).family == "llama"


def check_decoder_plan(plan: Plan, cfg: ModelConfig) -> None:
    """Raise :class:`RunError` unless ``plan`` is forward-only over a dense Llama-family decoder
    whose global batch splits into its microbatches."""
    if not plan.schedule.forward_only:
        raise RunError(f"plan of {plan.model!r} is not forward-only; train it with run_plan")
    try:
        kv_decode.check_decoder(cfg)
    except ZooError as e:
        raise RunError(str(e)) from None
    if plan.global_batch % plan.microbatches:
        raise RunError(f"global batch {plan.global_batch} is not divisible by "
                       f"{plan.microbatches} microbatches; re-plan with a multiple")


def prefill_step_fn(cfg: ModelConfig, microbatches: int, max_len: int):
    """``(params, prompts) -> tuple of M (logits [b,V], token [b], caches)``: the prefill of each
    of the M microbatches ``prompts`` (int32 ``[b, P]`` each), layers named."""
    pre = kv_decode.prefill_fn(cfg, max_len)

    def step(params, prompts):
        if len(prompts) != microbatches:
            raise ValueError(f"the step takes {microbatches} microbatches, got {len(prompts)}")
        return tuple(pre(params, p) for p in prompts)
    return step


def decode_step_fn(cfg: ModelConfig, microbatches: int):
    """``(params, tokens, caches, pos) -> tuple of M (logits [b,V], token [b], caches')``: one
    decode step of each microbatch (its tokens ``[b]`` at position ``pos``, its caches: one
    ``(k, v)`` pair per block), layers named."""
    dec = kv_decode.decode_fn(cfg)

    def step(params, tokens, caches, pos):
        if len(tokens) != microbatches or len(caches) != microbatches:
            raise ValueError(f"the step takes {microbatches} microbatches, got {len(tokens)}")
        return tuple(dec(params, t, c, pos) for t, c in zip(tokens, caches))
    return step


def cache_spec(plan: Plan, cfg: ModelConfig, block: str) -> PartitionSpec:
    """A block's cache ``[b, T, KV, d]`` on its mesh: rows over the data axes, KV heads over
    ``model`` (the compiler drops an axis that does not divide its dimension)."""
    lay = plan.layouts[layer_meshes(plan, zoo.layer_names(cfg))[block]]
    return PartitionSpec(batch_spec(lay)[0], None, MODEL, None)


def _specs(plan: Plan, cfg: ModelConfig, params: Any, rest: Any) -> dict[int, PartitionSpec]:
    """Flat argument index -> spec: the parameters as the plan's layouts say, then ``rest``
    (a pytree whose leaves are already specs)."""
    names = zoo.layer_names(cfg)
    is_spec = lambda x: isinstance(x, PartitionSpec)   # noqa: E731
    leaves = jax.tree.leaves(param_specs(cfg, plan, params, names), is_leaf=is_spec)
    leaves += jax.tree.leaves(rest, is_leaf=is_spec)
    return dict(enumerate(leaves))


def _place(args: Any, exported: ExportedProgram) -> Any:
    """``args`` with every leaf on the sharding the program's matching input expects (a no-op for
    a leaf already there, e.g. a cache the previous step left on its mesh)."""
    leaves, tree = jax.tree.flatten(args)
    return jax.tree.unflatten(tree, [x if sh is None or getattr(x, "sharding", None) == sh
                                     else jax.device_put(x, sh)
                                     for x, (_, _, sh) in zip(leaves, exported.inputs)])


def cache_placement_errors(exported: ExportedProgram, plan: Plan, cfg: ModelConfig,
                           microbatches: int, params: Any) -> list[str]:
    """Caches of the decode program not on their block's mesh, as one line each: every cache
    input and output (flat positions after the parameters and tokens; outputs: each microbatch's
    logits, token, then its caches) must live on the mesh the plan gives its block."""
    blocks = zoo.layer_names(cfg)[1:-1]
    where = layer_meshes(plan, zoo.layer_names(cfg))
    n_par = len(jax.tree.leaves(params))
    bad = []
    for m in range(microbatches):
        for j, name in enumerate(blocks):
            for kv in (0, 1):
                i_in = n_par + microbatches + (m * len(blocks) + j) * 2 + kv
                i_out = m * (2 + 2 * len(blocks)) + 2 + 2 * j + kv
                got_in, got_out = exported.inputs[i_in][1], exported.outputs[i_out][1]
                if got_in != where[name] or got_out != where[name]:
                    bad.append(f"microbatch {m} {name} {'kv'[kv]} cache: input on {got_in}, "
                               f"output on {got_out}, block on {where[name]}")
    return bad


def transfers_per_step(exported: ExportedProgram) -> int:
    """Transfers (``Send`` steps) one execution of ``exported`` makes between meshes."""
    return sum(1 for prog in exported.programs.values() for st in prog.steps
               if isinstance(st, Send))


@dataclass(frozen=True)
class DecodeReport:
    """What :func:`decode_plan` measured and checked (SI units).

    ``tokens`` ``[B, new_tokens + 1]``: the prefill's greedy token then one per decode step, from
    the MPMD programs; ``reference_tokens`` the same from one ``jax.jit`` of the cached greedy
    decoding on one device; ``recompute_tokens`` from ``jax.jit`` of greedy decoding without a
    cache (full forward per token). ``logits_rel_error``: the MPMD logits of every step against
    the cached ``jax.jit``'s (one vector). ``prefill_s``: the timed prefill execution;
    ``decode_times_s`` one per decode execution, ``measured_decode_s`` their
    :func:`~runtime.train.step.measured_step_time`. ``simulated_decode_s``: the simulator's
    forward of the plan at ``seq_len`` 1 (the decode step's matmuls and weight reads through the
    plan's stages, pipeline and transfers: with one sequence per microbatch each device's matmuls
    are matrix-vector products, costed at the profile's weight-stream rate plus its per-layer
    ``decode_layer_overhead``, both measured by ``mpmd calibrate``; it does not cost the
    attention's read of the KV cache nor the cache write, small next to the weights for the tiny
    model);
    ``simulated_prefill_s`` the same at ``seq_len`` = the prompt length.
    ``cache_placement_errors``: decode-program caches not on their block's mesh
    (:func:`cache_placement_errors`); ``decode_transfers``: transfers per decode execution.
    """

    plan: Plan
    prompt: Any = field(repr=False)
    tokens: Any = field(repr=False)
    reference_tokens: Any = field(repr=False)
    recompute_tokens: Any = field(repr=False)
    logits_rel_error: float
    recompute_logits_rel_error: float
    order_mismatches: tuple[str, ...]
    executables: Mapping[str, Mapping[str, check.ExecutableCount]]
    prefill_s: float
    decode_times_s: tuple[float, ...]
    measured_decode_s: float
    simulated_decode_s: float | None
    simulated_prefill_s: float | None
    max_len: int
    cache_placement_errors: tuple[str, ...]
    decode_transfers: int
    executed_order: Mapping[str, Mapping[str, tuple[str, ...]]]

    @property
    def tokens_match(self) -> bool:
        return (np.array_equal(self.tokens, self.reference_tokens)
                and np.array_equal(self.tokens, self.recompute_tokens))

    @property
    def executables_ok(self) -> bool:
        return all(c.ok for per in self.executables.values() for c in per.values())


def decode_plan(plan_path: str | Path | Plan, *, cluster_path: str | Path | None = None,
                new_tokens: int = NEW_TOKENS, prompt_len: int = PROMPT_LEN,
                max_len: int | None = None, seed: int = 0,
                model_overrides: Mapping[str, Any] | None = None, simulate: bool = True,
                console: Any = None, quiet: bool = False) -> DecodeReport:
    """Greedy decoding of a forward-only decoder plan through MPMD programs; see the module
    docstring.

    Args:
        plan_path: a plan.json path, or a :class:`Plan` (forward-only, Llama-family decoder).
        cluster_path: the cluster YAML (default: the plan's ``cluster_path``).
        new_tokens: decode executions after the prefill.
        prompt_len: prompt tokens per sequence (windows of the shipped text).
        max_len: the caches' length (default ``prompt_len + new_tokens``).
        seed: draws the parameters and the prompts' offsets.
        model_overrides: zoo ``ModelConfig`` fields to override.
        simulate: also simulate the plan for (e).

    Raises:
        RunError: not a forward-only decoder plan, missing cluster, too few devices, a cache
            shorter than the prompt and the decoded tokens.
        ir.files.InputError / ir.IRError: an unreadable or malformed plan file.
    """
    plan = plan_path if isinstance(plan_path, Plan) else load_plan(plan_path)
    if isinstance(plan, DataParallelPlan):
        raise RunError(f"the plan is data parallel over {len(plan.parts)} pipelines, but "
                       f"'mpmd run' executes one pipeline; run a single-pipeline plan")
    cfg = zoo.get_config(plan_model(plan.model, plan.model_config), **dict(model_overrides or {}))
    check_decoder_plan(plan, cfg)
    max_len = max_len or prompt_len + new_tokens
    if prompt_len < 1 or new_tokens < 1 or prompt_len + new_tokens > max_len:
        raise RunError(f"prompt {prompt_len} + {new_tokens} new tokens must fit the cache length "
                       f"{max_len} (each at least 1)")
    cpath = cluster_path or plan.cluster_path
    if not cpath:
        raise RunError("the plan names no cluster file; pass cluster_path (--cluster)")
    cluster = run_cluster(plan, cpath)
    topology = plan_topology(plan, cluster)
    M, B = plan.microbatches, plan.global_batch
    b = B // M
    k_p, k_o = jax.random.split(jax.random.PRNGKey(seed))
    params = zoo.init_params(cfg, k_p)
    text = load_text()
    starts = np.asarray(jax.random.randint(k_o, (B,), 0, len(text) - prompt_len))
    prompt = np.stack([text[s:s + prompt_len] for s in starts]).astype(np.int32)
    prompts = tuple(jnp.asarray(prompt[m * b:(m + 1) * b]) for m in range(M))
    names = zoo.layer_names(cfg)
    base = config_from_plan(plan, topology, layer_names=names)
    first_mesh = min(plan.stages, key=lambda s: s.index).mesh
    bspec = batch_spec(plan.layouts[first_mesh])

    pre_step = prefill_step_fn(cfg, M, max_len)
    pre_cfg = dataclasses.replace(base, in_specs=_specs(plan, cfg, params, [bspec] * M))
    pre_ex = compile_step(pre_step, pre_cfg, (params, prompts))

    dec_step = decode_step_fn(cfg, M)
    kv = kv_decode.cache_shape(cfg, b, max_len)
    caches0 = tuple([(jax.ShapeDtypeStruct(kv, cfg.jnp_dtype),) * 2 for _ in names[1:-1]]
                    for _ in range(M))
    toks0 = tuple(jax.ShapeDtypeStruct((b,), jnp.int32) for _ in range(M))
    pos0 = jax.ShapeDtypeStruct((), jnp.int32)
    cspecs = [(cache_spec(plan, cfg, n),) * 2 for n in names[1:-1]]
    dec_cfg = dataclasses.replace(base, in_specs=_specs(
        plan, cfg, params, ([bspec] * M, [cspecs] * M, PartitionSpec())))
    dec_ex = compile_step(dec_step, dec_cfg, (params, toks0, caches0, pos0))

    pre_tree = jax.tree.structure(jax.eval_shape(pre_step, params, prompts))
    dec_tree = jax.tree.structure(jax.eval_shape(dec_step, params, toks0, caches0, pos0))

    # references on one device: cached greedy decoding, and greedy decoding without a cache
    ref_dev = jax.devices()[0]
    host_params = jax.device_get(params)
    ref_args = jax.device_put((host_params, jnp.asarray(prompt)), ref_dev)
    ref_toks, ref_logits = jax.jit(kv_decode.greedy_decode(cfg, new_tokens, max_len))(*ref_args)
    rec_toks, rec_logits = jax.jit(kv_decode.greedy_reference(cfg, new_tokens))(*ref_args)

    params_pre = _place(params, pre_ex)
    run_program(pre_ex, (params_pre, prompts), record=False)   # compile every executable first
    ex = run_program(pre_ex, (params_pre, prompts))
    outs = jax.tree.unflatten(pre_tree, list(ex.outputs))
    prefill_s = ex.timeline.step_time_s
    orders = {"prefill": ex.order}
    tokens = [tuple(o[1] for o in outs)]
    logits = [tuple(o[0] for o in outs)]
    caches = tuple(o[2] for o in outs)
    params_dec = _place(params, dec_ex)
    step_args = lambda i: _place((params_dec, tokens[-1], caches, jnp.int32(prompt_len + i)),  # noqa: E731
                                 dec_ex)
    run_program(dec_ex, step_args(0), record=False)   # compile every executable; outputs dropped
    times: list[float] = []
    for i in range(new_tokens):
        ex = run_program(dec_ex, step_args(i))
        outs = jax.tree.unflatten(dec_tree, list(ex.outputs))
        times.append(ex.timeline.step_time_s)
        orders["decode"] = ex.order
        tokens.append(tuple(o[1] for o in outs))
        logits.append(tuple(o[0] for o in outs))
        caches = tuple(o[2] for o in outs)
    host = lambda xs: np.concatenate([np.asarray(jax.device_get(x)) for x in xs])   # noqa: E731
    got = np.stack([host(t) for t in tokens], axis=1)                  # [B, new_tokens + 1]
    got_logits = np.stack([host(lg) for lg in logits], axis=1)         # [B, new_tokens + 1, V]
    if not quiet and console is not None:
        console.print(f"prefill {prefill_s * 1e3:.1f} ms, {new_tokens} decode steps, median "
                      f"{measured_step_time(times) * 1e3:.1f} ms")
    bodies = [zoo.body_of(cfg, n) for n in names]
    sim_dec = sim_pre = None
    if simulate:
        sim_dec = simulated_step_time(dataclasses.replace(plan, seq_len=1), cluster, cfg)
        sim_pre = simulated_step_time(dataclasses.replace(plan, seq_len=prompt_len), cluster, cfg)
    return DecodeReport(
        plan=plan, prompt=prompt, tokens=got, reference_tokens=np.asarray(ref_toks),
        recompute_tokens=np.asarray(rec_toks),
        logits_rel_error=check.rel_error(got_logits, np.asarray(ref_logits)),
        recompute_logits_rel_error=check.rel_error(got_logits, np.asarray(rec_logits)),
        order_mismatches=tuple(f"{k}: {m}" for k, o in orders.items()
                               for m in check.order_mismatches(plan, o)),
        executables={"prefill": check.executable_counts(pre_ex, plan, bodies),
                     "decode": check.executable_counts(dec_ex, plan, bodies)},
        prefill_s=prefill_s, decode_times_s=tuple(times),
        measured_decode_s=measured_step_time(times), simulated_decode_s=sim_dec,
        simulated_prefill_s=sim_pre, max_len=max_len,
        cache_placement_errors=tuple(cache_placement_errors(dec_ex, plan, cfg, M, params)),
        decode_transfers=transfers_per_step(dec_ex), executed_order=orders)


def print_decode_report(report: DecodeReport, console: Any = None) -> None:
    """Print a :class:`DecodeReport` as a rich table."""
    console = console or Console()
    p = report.plan
    B, n = report.tokens.shape
    t = Table(title=f"mpmd run (greedy decoding, KV cache): {p.model} on {p.cluster}, "
                    f"{p.schedule.name}, {p.microbatches} microbatches, {B} sequences, prompt "
                    f"{report.prompt.shape[1]}, {n - 1} decode steps, cache {report.max_len}")
    t.add_column("check")
    t.add_column("result", justify="right")
    t.add_column("ok")
    same = report.tokens_match
    t.add_row("(a) tokens = jax.jit greedy (cached; no cache)",
              f"{n} x {B} tokens; logits rel error {report.logits_rel_error:.1e}; "
              f"{report.recompute_logits_rel_error:.1e}", "yes" if same else "NO")
    bad = report.order_mismatches
    t.add_row("(b) per-mesh order (prefill, decode)", "; ".join(bad) if bad else "as planned",
              "NO" if bad else "yes")
    t.add_row("(c) executables = fragment bodies", "; ".join(
        f"{k}: " + ", ".join(str(c) for c in per.values())
        for k, per in report.executables.items()), "yes" if report.executables_ok else "NO")
    cbad = report.cache_placement_errors
    t.add_row("(d) caches on their block's mesh (decode)",
              "; ".join(cbad[:2]) if cbad else f"yes; {report.decode_transfers} transfers per "
              f"step (activations, pos)", "NO" if cbad else "yes")
    dec = f"{report.measured_decode_s * 1e3:.1f}"
    pre = f"{report.prefill_s * 1e3:.1f}"
    if report.simulated_decode_s is not None:
        dec += f" / {report.simulated_decode_s * 1e3:.1f}"
        pre += f" / {report.simulated_prefill_s * 1e3:.1f}"
    t.add_row("(e) decode step measured / simulated (seq 1, no KV read)", dec + " ms", "info")
    t.add_row("    prefill measured / simulated", pre + " ms", "info")
    console.print(t)
