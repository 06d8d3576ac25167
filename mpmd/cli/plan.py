"""``mpmd plan --model M --cluster C``: the planner's best plan of a model on a cluster, as a table
and (``--out``) a plan JSON.

The model name and the cluster path are checked before the planner, pydantic and JAX load, so a
typo is refused in a fraction of a second; those load inside the command.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from hardware_profiles.paths import resolve_cluster_path
from ir.files import check_output, write_atomic
from ir.plan import OPTIMIZER_STATES
from ir.precision import PRECISIONS
from ir.workload import ATTENTION_KERNELS, CROSS_ENTROPY
from ir.vocab import GOALS
from mpmd.cli.common import console, err_console, guard
from mpmd.cli.models import types_text
from mpmd.cli.params import (MAX_GLOBAL_BATCH, MAX_MICROBATCHES, MAX_SEQ_LEN, MAX_TENSOR,
                             MAX_TIME_LIMIT_S, FiniteFloat, int_range)
from mpmd.cli.video import PIPELINE_NAMES
from zoo.config import list_models
from zoo.model_files import config_fields, resolve_model

if TYPE_CHECKING:   # the command loads these only when it runs, after checking its input
    from ir import Workload
    from zoo.config import ModelConfig


def context_degree(value: str) -> int:
    """``--context-parallel``'s value as ``PlanOptions.context``: auto 0, off 1, else N >= 2.

    Raises:
        click.BadParameter: anything else (one line naming the value and the forms)."""
    v = value.strip().lower()
    if v in ("auto", "off"):
        return 0 if v == "auto" else 1
    if v.isdigit() and 1 <= int(v) <= 2**20:
        return int(v)
    raise click.BadParameter(f"{value!r}: give auto, off or a context degree N (1 to 1048576), "
                             f"e.g. --context-parallel 2", param_hint="'--context-parallel'")


@click.command("plan")
@click.option("--model", required=True,
              help=f"A zoo model ({', '.join(list_models())}), a shipped config's name (e.g. "
                   f"deepseek-v3) or a model file: {types_text()}. 'mpmd models' lists them all, "
                   f"with their families, sizes and experts.")
@click.option("--cluster", "cluster_path", required=True, type=click.Path(dir_okay=False),
              help="Cluster spec YAML.")
@click.option("--global-batch", type=int_range(1, MAX_GLOBAL_BATCH), default=None,
              help="Samples per step (default: the model's).")
@click.option("--seq-len", type=int_range(1, MAX_SEQ_LEN), default=None,
              help="Tokens per sample (default: the model's).")
@click.option("--time-limit", type=FiniteFloat(min=0.1, max=MAX_TIME_LIMIT_S), default=30.0, show_default=True,
              help="Search budget in seconds of work on the reference 2-core machine (about its wall "
                   "time there; node-group clusters): the same plan on any machine, a busy one takes "
                   "longer; the wall clock cuts the search at 20x this.")
@click.option("--schedule", "schedules", multiple=True,
              help="Restrict to these schedules (repeatable).")
@click.option("--microbatches", "microbatches", multiple=True, type=int_range(1, MAX_MICROBATCHES),
              help="Restrict to these microbatch counts (repeatable).")
@click.option("--max-tensor", type=int_range(1, MAX_TENSOR), default=8, show_default=True,
              help="Largest tensor-parallel degree considered.")
@click.option("--even-split", is_flag=True, help="Force the usual hand split (equal layers per stage).")
@click.option("--no-fsdp", is_flag=True, help="Do not consider fully sharded data parallel layouts.")
@click.option("--context-parallel", "context_parallel", default="auto", show_default=True,
              help="Context parallelism (each sequence split over devices, ring or all-to-all "
                   "attention): auto searches it from 16,384 tokens; off never; N runs every "
                   "mesh at context degree N (any length it divides).")
@click.option("--objective", type=click.Choice((*GOALS, "latency")), default="time",
              show_default=True,
              help="time: the shortest step; cost: the lowest USD per step (with --min-throughput, "
                   "among plans that reach it). Either may use part of the cluster. latency: one "
                   f"video at a time of a video pipeline (--model {' or '.join(PIPELINE_NAMES)}), "
                   f"as 'mpmd video': seconds per video and per component.")
@click.option("--min-throughput", type=FiniteFloat(min=1e-9, max=1e18), default=None,
              help="Throughput floor, tokens per second.")
@click.option("--max-usd-per-hour", type=FiniteFloat(min=1e-9, max=1e12), default=None,
              help="Budget: the plan's devices cost at most this, USD per hour.")
@click.option("--precision", type=click.Choice((*PRECISIONS, "auto")), default="bf16",
              show_default=True,
              help="Training precision recipe of the blocks' GEMMs: bf16; fp8 (one scale per "
                   "tensor, Transformer Engine); fp8-blockwise (DeepSeek-V3's 1x128/128x128 "
                   "scales); mxfp8 and nvfp4 (Blackwell microscaling); auto: one search per "
                   "recipe every device of the cluster runs, the best plan kept and the others' "
                   "steps printed beside it. Attention, norms, embedding and LM head stay bf16.")
@click.option("--optimizer-state", type=click.Choice(OPTIMIZER_STATES), default="fp32",
              show_default=True,
              help="How Adam keeps its state, sharded over data parallel: fp32 (fp32 master "
                   "weights and moments, 12 bytes a parameter); bf16-moments (fp32 master, bf16 "
                   "moments, 8: Megatron's --use-precision-aware-optimizer, as DeepSeek-V3's "
                   "recipe sets it); bf16 (no master copy, 4: MaxText's weight_dtype bfloat16). "
                   "Every layout the search costs keeps it; the exports ask for it.")
@click.option("--cross-entropy", type=click.Choice(tuple(CROSS_ENTROPY)), default="fused",
              show_default=True,
              help="How the loss is computed, which sets what it keeps of the logits and holds "
                   "beside them (tokens x vocabulary each): fused (Transformer Engine's kernel, "
                   "Megatron-Bridge's recipes; XLA: one compute-dtype copy); fp32 (Megatron-Core's "
                   "own: fp32 kept, the compute-dtype copy beside it); eager (PyTorch op by op, "
                   "torchtitan's: fp32 kept, two fp32 gradients beside it). Memory only.")
@click.option("--attention-kernel", type=click.Choice(tuple(ATTENTION_KERNELS)), default=None,
              help="The fused attention kernel the run uses (default: the model's, flash): flash "
                   "(the device's own: cuDNN / Transformer Engine on NVIDIA GPUs, splash on TPU); "
                   "flash2 (FlashAttention-2, PyTorch SDPA's flash backend, which torchtitan pins "
                   "under context parallelism: 0.62 of cuDNN's rate on Hopper); unfused (the "
                   "softmax materialized). The plan JSON carries it.")
@click.option("--out", type=click.Path(), default=None, help="Write the plan JSON here.")
@guard
def plan_command(model: str, cluster_path: str, global_batch: int | None, seq_len: int | None,
                 time_limit: float, schedules: tuple[str, ...], microbatches: tuple[int, ...],
                 max_tensor: int, even_split: bool, no_fsdp: bool, context_parallel: str,
                 objective: str,
                 min_throughput: float | None, max_usd_per_hour: float | None,
                 precision: str, optimizer_state: str, cross_entropy: str,
                 attention_kernel: str | None, out: str | None) -> None:
    """Plan MODEL on CLUSTER: stage assignment, layouts and schedule.

    The inputs come first: the model (parameters, total and active per token, and dtype), the
    global batch and sequence length (a default says so, and whose) and the cluster's devices by
    kind; then the plan.

    On a cluster described as node groups the plan also says how the nodes are carved into meshes
    (which nodes each mesh spans, the pipeline replicas it carries), and may split the batch over
    several pipelines (data parallelism across device kinds): the table then has one section per
    pipeline, its batch share, and the gradient sync across them. A cluster file that lists meshes
    which are whole nodes of one kind per group, joined alike, is planned the same way, as the node
    groups it describes; 'carve: fixed' in the file keeps its meshes as listed.

    --objective latency plans a video pipeline (mochi: T5-XXL, the 10B DiT for every denoising
    step with both guidance passes, the VAE decoder) one video at a time, as 'mpmd video' does:
    each component's devices and tensor / context / CFG / spatial degrees, and the seconds per
    video and per component (--out writes the video plan JSON); other models are refused.

    --objective cost, --min-throughput and --max-usd-per-hour plan on part of a node-group cluster
    too (each group at all, half or a quarter of its nodes, or left out), pricing the devices a
    plan uses at the cluster file's price_usd_per_device_hour (else the device profile's); the
    table then has a "cost" row.

    Searches that run over a few seconds show progress on stderr. Ctrl-C stops the search and
    keeps the best plan found so far: the table is printed and, with --out, the plan is written,
    marked "interrupted" in its solver record. That exits 0, as when --time-limit cuts the search
    short: a usable plan was produced (scripts can tell from the JSON). Ctrl-C before any feasible
    plan writes nothing and exits 2; a second Ctrl-C aborts at once, writes nothing and exits 130.
    """
    if objective == "latency" or model in PIPELINE_NAMES:   # a video pipeline, one video
        from mpmd.cli.video import latency_plan

        latency_plan(model, cluster_path, objective, out, {
            "--global-batch": global_batch not in (None, 1), "--seq-len": seq_len is not None,
            "--schedule": bool(schedules), "--microbatches": bool(microbatches),
            "--max-tensor": max_tensor != 8, "--even-split": even_split, "--no-fsdp": no_fsdp,
            "--context-parallel": context_parallel != "auto",
            "--min-throughput": min_throughput is not None,
            "--max-usd-per-hour": max_usd_per_hour is not None, "--precision": precision != "bf16",
            "--optimizer-state": optimizer_state != "fp32",
            "--cross-entropy": cross_entropy != "fused",
            "--attention-kernel": attention_kernel is not None})
        return
    context = context_degree(context_parallel)
    # the input first, before the planner, pydantic and JAX load (a typo is refused in ~0.2 s)
    if out:
        check_output(out, "plan JSON")
    cfg = resolve_model(model)            # ZooError: unknown model ("did you mean"), bad file
    if attention_kernel is not None and attention_kernel != cfg.attention_kernel:
        from zoo import get_config

        cfg = get_config(cfg, attention_kernel=attention_kernel)
    resolve_cluster_path(cluster_path)    # ProfileError: no such file, with "did you mean"
    from dataclasses import replace

    from mpmd.cli.output import (plan_inputs, plan_table, precision_table, recipe_origin,
                                 search_gap_text, validate_plan_json)
    from planner.precision import best_precision, precisions
    from mpmd.cli.search_ui import Aborted, CtrlC, SearchProgress
    from ir import any_plan_to_json, with_model_config
    from hardware_profiles import load_cluster
    from planner import Goal, PlanOptions, plan
    from planner.api import PlanInterrupted
    from planner.construct import TRAIN_SCHEDULES

    for s in schedules:
        if s not in TRAIN_SCHEDULES:
            raise click.BadParameter(f"unknown schedule {s!r}; use one of {', '.join(TRAIN_SCHEDULES)}")
    cluster = load_cluster(cluster_path)
    workload = replace(_workload(cfg, global_batch, seq_len), cross_entropy=cross_entropy)
    recipes = precisions(precision, cluster, workload.training)   # PlannerError: not run here
    goal = Goal(objective, min_throughput, max_usd_per_hour)
    # Ctrl-C handling spans the search and the output, so a second Ctrl-C never leaves a file
    with CtrlC() as ctrl_c:
        try:
            tried = []
            for recipe in recipes:
                label = f"{cfg.name} on {cluster.name}" + (f", {recipe}" if len(recipes) > 1 else "")
                with SearchProgress(err_console, label) as bar:
                    opts = PlanOptions(time_limit_s=time_limit, schedules=schedules or None,
                                       microbatches=microbatches or None, max_tensor=max_tensor,
                                       even_split=even_split, fsdp=not no_fsdp,
                                       context=context, optimizer_state=optimizer_state)
                    tried.append(plan(replace(workload, precision=recipe), cluster, opts, bar,
                                      goal=goal, stop=ctrl_c.stop))
                if tried[-1].interrupted:
                    break
            result = best_precision(tried, goal)
            workload = replace(workload, precision=result.plan.precision)
            ctrl_c.searching = False
            ctrl_c.check()
            if result.interrupted:
                sv = result.plan.search
                err_console.print(f"interrupted after {sv.search_wall_s or 0:.0f} s; "
                                  f"best plan so far, {search_gap_text(sv)}",
                                  highlight=False, soft_wrap=True)
            console.print(plan_inputs(model, cfg, workload, cluster,
                                      batch_given=global_batch is not None,
                                      seq_given=seq_len is not None))
            console.print(plan_table(result, cluster))
            if len(tried) > 1:
                console.print(precision_table(tried, result, cluster))
                if recipe_origin(cluster, result.plan.precision) == "prior":
                    console.print(f"note: {result.plan.precision}'s efficiency on these devices is "
                                  f"a prior, not fitted on a published run in it: its gain is a "
                                  f"guess (--precision names another)", highlight=False)
            ctrl_c.check()
            if out:
                # a model file's fields, or a zoo model's run with another attention kernel
                chosen = (with_model_config(result.plan, config_fields(cfg))
                          if cfg.name not in list_models() or cfg.attention_kernel != "flash"
                          else result.plan)
                doc = any_plan_to_json(chosen)   # a pipeline plan or a data-parallel plan
                validate_plan_json(doc)
                text = json.dumps(doc, indent=1)
            with ctrl_c.committing():
                if out:
                    write_atomic(Path(out), text)
        except (Aborted, PlanInterrupted) as e:
            if isinstance(e, Aborted) or ctrl_c.aborted:
                err_console.print("aborted by a second Ctrl-C; nothing written", highlight=False)
                sys.exit(130)
            err_console.print(f"{e}; nothing written", highlight=False, soft_wrap=True)
            sys.exit(2)
    if out:
        console.print(f"wrote {out}")


DEFAULT_GLOBAL_BATCH = 256
"""Samples per training step when --global-batch is not given (2M tokens at sequence length 8192)."""


def _workload(cfg: ModelConfig, global_batch: int | None, seq_len: int | None) -> Workload:
    """The traced workload of ``cfg``; inference models default to one video or request (a
    decoder has no sampling steps: one sample)."""
    from zoo.costing import workload

    if global_batch is None:    # an inference model: one video (Mochi), else one request
        global_batch = (DEFAULT_GLOBAL_BATCH if cfg.training
                        else max(1, cfg.sampling_steps * cfg.cfg_passes))
    return workload(cfg, global_batch=global_batch, seq_len=seq_len)
