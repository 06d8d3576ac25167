"""``mpmd video --pipeline mochi --cluster C``: the latency plan of one text-to-video video (the
encoder once, the DiT for every denoising step with both guidance passes, the decoder once):
which devices run each component, with which layout, and the seconds per video and per component
(:mod:`planner.video`). ``--run`` executes a tiny pipeline's plan on the JAX CPU devices and
checks the video against ``jax.jit`` of the unsharded program (:mod:`runtime.video`).

The pipeline name and the cluster path are checked before JAX and the planner load.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, NoReturn

import click
from rich.markup import escape

from hardware_profiles.paths import resolve_cluster_path
from ir.files import check_output, write_atomic
from mpmd.cli.common import console, err_console, guard
from mpmd.cli.params import FiniteFloat, int_range

if TYPE_CHECKING:
    from hardware_profiles.types import Cluster
    from planner.video import ComponentPlan, VideoPlan

PIPELINE_NAMES = ("mochi", "mochi-tiny")
"""``zoo.mochi_pipeline.PIPELINES``' names (listed here so ``--help`` needs no zoo import)."""

RUN_TOLERANCE = 1e-5
"""Largest absolute difference ``--run`` accepts between the run's video and ``jax.jit``'s."""


def _with_memory(cluster: Cluster, gb: float) -> Cluster:
    """``cluster`` with every device's memory set to ``gb`` GB."""
    from dataclasses import replace

    meshes = {k: replace(m, device=replace(m.device, memory_bytes=gb * 1e9))
              for k, m in cluster.meshes.items()}
    return replace(cluster, meshes=meshes)


def _where(o: ComponentPlan) -> str:
    last = o.first + o.devices - 1
    return f"{o.mesh}[{o.first}]" if o.devices == 1 else f"{o.mesh}[{o.first}..{last}]"


def dit_reason(plan: VideoPlan) -> str:
    """Why the DiT runs as it does: its layout against the guide's (tensor parallel over the same
    devices), with both times and their collective seconds."""
    dit = next(o for o in plan.components if o.component == "dit")
    opts = plan.options.get("dit", ())
    tp = [o for o in opts if o.mesh == dit.mesh and o.devices == dit.devices
          and o.layout.tensor == dit.devices]
    head = f"DiT {dit.describe()} on {dit.devices} device(s): {dit.total_s:.1f} s per video"
    if dit.devices == 1:
        return head + " (one device: no layout to choose)"
    if not tp:
        return head + (f"; tensor parallel {dit.devices} (the guide's layout) cannot run it "
                       f"here (heads or widths not divisible, or memory)")
    g = tp[0]
    if g.layout == dit.layout:
        return head + (f": the guide's layout is the fastest found (its all-reduces "
                       f"{g.comm_s:.1f} s per video)")
    return head + (f", vs {g.total_s:.1f} s for the guide's TP {dit.devices} "
                   f"({g.total_s - dit.total_s:+.1f} s): TP {dit.devices} puts "
                   f"{g.comm_s:.1f} s of activation all-reduces (2 per block) on the critical path; "
                   f"{dit.describe()} moves {dit.comm_s:.1f} s of keys / values / velocities, "
                   f"a ring's under the attention it overlaps")


def video_table(plan: VideoPlan, title: str):  # -> rich.table.Table
    from rich import box
    from rich.table import Table

    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False)
    for col in ("component", "devices", "layout", "runs", "s per run", "s per video",
                "collectives s", "weights GB", "activations GB"):
        t.add_column(col, justify="left" if col in ("component", "devices", "layout") else "right")
    for o in plan.components:
        runs = round(o.total_s / o.run_s) if o.run_s > 0 else 0
        t.add_row(o.component, _where(o), o.describe(), str(runs), f"{o.run_s:.3f}",
                  f"{o.total_s:.2f}", f"{o.comm_s:.2f}", f"{o.weight_bytes / 1e9:.2f}",
                  f"{o.activation_bytes / 1e9:.2f}")
    return t


def plan_json(plan: VideoPlan, pipeline: str, frames: int, steps: int) -> dict:
    """The plan as plain JSON data (seconds, bytes)."""
    return {"pipeline": pipeline, "cluster": plan.cluster, "frames": frames, "steps": steps,
            "seconds_per_video": plan.seconds_per_video, "bound_s": plan.bound_s,
            "moves_s": plan.moves_s, "searched": plan.searched,
            "components": [{"component": o.component, "mesh": o.mesh, "first": o.first,
                            "devices": o.devices, "data": o.layout.data,
                            "context": o.layout.context,
                            "context_method": o.layout.context_method,
                            "tensor": o.layout.tensor, "spatial": o.spatial,
                            "frame_chunks": o.chunks, "run_s": o.run_s, "total_s": o.total_s,
                            "collective_s": o.comm_s, "weight_bytes": o.weight_bytes,
                            "activation_bytes": o.activation_bytes}
                           for o in plan.components]}


@click.command("video")
@click.option("--pipeline", "pipeline_name", type=click.Choice(PIPELINE_NAMES), default="mochi",
              show_default=True, help="mochi: T5-XXL, the 10B DiT and the VAE decoder (480x848); "
                                      "mochi-tiny: their CPU test versions.")
@click.option("--cluster", "cluster_path", required=True, type=click.Path(dir_okay=False),
              help="Cluster spec YAML (or a bundled cluster's name).")
@click.option("--frames", type=int_range(0, 6 * 2**10 + 1), default=0,
              help="Video frames, 6k + 1 (default: the configs': 163 for mochi).")
@click.option("--steps", type=int_range(0, 2**16), default=0,
              help="Denoising steps (default: the DiT's, 64 for mochi as Genmo and diffusers).")
@click.option("--memory-gb", type=FiniteFloat(min=0.001, max=1e6), default=None,
              help="Per-device memory in GB instead of the profiles' (e.g. the Mochi guide's 16).")
@click.option("--headroom", type=FiniteFloat(min=0.0, max=0.9), default=0.1, show_default=True,
              help="Fraction of device memory kept free.")
@click.option("--decoder-spatial", type=int_range(0, 2**20), default=0,
              help="Fix the decoder's spatial degree (0: searched).")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="Write the plan as JSON here.")
@click.option("--run", "run_it", is_flag=True,
              help="Run the plan on the JAX devices (mochi-tiny only) and check the video "
                   "against jax.jit of the unsharded program.")
@guard
def video(pipeline_name: str, cluster_path: str, frames: int, steps: int,
          memory_gb: float | None, headroom: float, decoder_spatial: int, out: str | None,
          run_it: bool) -> None:
    """Plan one video at a time (latency): which devices run the text encoder, the DiT and the
    VAE decoder, each one's tensor / context / CFG / spatial degrees, and the seconds per video
    and per component."""
    path = resolve_cluster_path(cluster_path)
    if out:
        check_output(out, "video plan")
    if run_it and pipeline_name != "mochi-tiny":
        _refuse(f"--run executes only the tiny pipeline, not {pipeline_name}; use --pipeline "
                f"mochi-tiny")
    show_video_plan(pipeline_name, str(path), frames, steps, memory_gb, headroom,
                    decoder_spatial, out, run_it)


LATENCY_UNUSED = ("--global-batch", "--seq-len", "--schedule", "--microbatches", "--max-tensor",
                  "--even-split", "--no-fsdp", "--context-parallel", "--min-throughput",
                  "--max-usd-per-hour", "--precision", "--optimizer-state", "--cross-entropy",
                  "--attention-kernel")
"""``mpmd plan`` options a latency plan has no use for (a video is one sample at batch 1, planned
by :mod:`planner.video`, not by the training planner)."""


def _refuse(msg: str) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
    sys.exit(2)


def latency_plan(model: str, cluster_path: str, objective: str, out: str | None,
                 given: dict[str, bool]) -> None:
    """``mpmd plan --model PIPELINE --objective latency``: the same plan and table as ``mpmd video
    --pipeline PIPELINE`` (the pipeline's default frames and steps, the profiles' memory).

    ``given``: for each of :data:`LATENCY_UNUSED`, whether the command line set it to other than
    its default; any set one is refused, as is a latency objective on a model that is not a video
    pipeline, and a video pipeline under another objective (each one line, exit 2)."""
    if model not in PIPELINE_NAMES:
        from zoo.mochi_pipeline import PIPELINES

        part = next((p.name for p in PIPELINES.values()
                     if model in (p.encoder, p.dit, p.decoder)), None)
        hint = (f" ({model} is a component of the {part} pipeline)" if part else "")
        _refuse(f"--objective latency plans one video at a time of a video pipeline; "
                f"{model!r} is not one{hint}: use --model {' or '.join(PIPELINE_NAMES)}, or "
                f"--objective time / cost for a training plan")
    if objective != "latency":
        _refuse(f"{model} is a video pipeline, planned one video at a time: use --objective "
                f"latency (or mpmd video --pipeline {model})")
    bad = [k for k in LATENCY_UNUSED if given.get(k)]
    if bad:
        _refuse(f"{', '.join(bad)} {'does' if len(bad) == 1 else 'do'} not apply to a latency "
                f"plan (one video at batch 1); drop {'it' if len(bad) == 1 else 'them'}, or use "
                f"mpmd video for --frames, --steps, --memory-gb and --decoder-spatial")
    path = resolve_cluster_path(cluster_path)
    if out:
        check_output(out, "video plan")
    show_video_plan(model, str(path), out=out)


def show_video_plan(pipeline_name: str, cluster_path: str, frames: int = 0, steps: int = 0,
                    memory_gb: float | None = None, headroom: float = 0.1,
                    decoder_spatial: int = 0, out: str | None = None,
                    run_it: bool = False) -> None:
    """Plan one video of ``pipeline_name`` on the cluster file ``cluster_path`` (checked by the
    caller), print the table, the seconds per video and per component, the bound and the DiT's
    layout against the guide's; write the JSON to ``out``; with ``run_it`` run it (tiny only).
    Exits 2 on a spatial degree or run the plan cannot take, 1 on a run over tolerance."""
    import json

    if run_it:
        from mpmd.cli.run import cpu_devices

        cpu_devices(8)     # before JAX starts: the CPU meshes' 8 devices
    from hardware_profiles import load_cluster
    from planner.video import plan_video
    from simulator.spatial import SpatialError
    from zoo.mochi_pipeline import components, pipeline

    try:
        _, _, dit, _ = pipeline(pipeline_name, frames, steps)
        comps = components(pipeline_name, frames, steps)
        cluster = load_cluster(cluster_path)
        if memory_gb is not None:
            cluster = _with_memory(cluster, memory_gb)
        plan = plan_video(comps, cluster, headroom, spatial_degree=decoder_spatial)
    except SpatialError as e:
        _refuse(str(e))
    video_frames = frames or (6 * (dit.latent_frames - 1) + 1)
    devices = sum(m.num_devices for m in cluster.meshes.values())
    console.print(video_table(plan, (
        f"{pipeline_name} on {cluster.name} ({devices} devices"
        f"{f', {memory_gb:g} GB each' if memory_gb is not None else ''}): one video of "
        f"{video_frames} frames, {dit.sampling_steps} steps x {dit.cfg_passes} guidance passes")))
    fullest, cap = plan.memory_bytes
    console.print(f"seconds per video: {plan.seconds_per_video:.2f} (components "
                  f"{', '.join(f'{o.component} {o.total_s:.2f}' for o in plan.components)}; "
                  f"moves {plan.moves_s:.4f})", highlight=False)
    console.print(f"bound: {plan.bound_s:.2f} s (every FLOP at the achievable matmul rate of all "
                  f"{devices} devices, no communication); gap "
                  f"{plan.seconds_per_video / plan.bound_s - 1:.1%}; search: exhaustive, "
                  f"{plan.searched} complete assignments examined; fullest device "
                  f"{fullest / 1e9:.1f} of {cap / 1e9:.1f} GB usable", highlight=False)
    console.print(dit_reason(plan), highlight=False)
    if out:
        write_atomic(out, json.dumps(plan_json(plan, pipeline_name, video_frames,
                                               dit.sampling_steps), indent=2) + "\n")
        console.print(f"wrote {out}", highlight=False)
    if run_it:
        from runtime.video import VideoRunError, run_video

        try:
            rep = run_video(plan, cluster, pipeline_name, frames=frames, steps=steps)
        except VideoRunError as e:
            _refuse(str(e))
        placed = "; ".join(f"{k} on devices {list(v)} ({rep.layouts[k]}, {rep.seconds[k]:.2f} s)"
                           for k, v in rep.devices.items())
        ok = rep.max_abs_error <= RUN_TOLERANCE
        console.print(f"ran {pipeline_name}: video {list(rep.shape)}; {placed}", highlight=False)
        console.print(f"check: max |video - jax.jit| = {rep.max_abs_error:.3g} "
                      f"({'within' if ok else 'OVER'} {RUN_TOLERANCE:g})", highlight=False)
        if not ok:
            sys.exit(1)
