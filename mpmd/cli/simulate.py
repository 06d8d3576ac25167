"""``mpmd simulate plan.json``: replay a plan in the discrete-event simulator."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import click
from rich.table import Table


def _pairs(items: tuple[str, ...], sep: str, what: str, fix: str) -> dict[str, float]:
    out = {}
    for it in items:
        key, _, val = it.rpartition(sep)
        try:
            out[key] = float(val)
        except ValueError:
            key = ""
        if not key:
            raise click.BadParameter(f"{what} {it!r} is not NAME{sep}NUMBER; {fix}")
    return out


def load_plan_inputs(plan_path: str):
    """(plan, workload, cluster) for a plan file, re-costing its model from the zoo."""
    from compiler.costing import workload
    from compiler.ir import plan_from_json
    from hardware_profiles import load_cluster

    plan = plan_from_json(json.loads(Path(plan_path).read_text()))
    cluster = load_cluster(plan.cluster_path or plan.cluster)
    w = workload(plan.model, global_batch=plan.global_batch, seq_len=plan.seq_len)
    return plan, w, cluster


def reschedule(plan, schedule: str | None, microbatches: int | None):
    """The plan with another schedule and/or microbatch count over the same stages and meshes.

    Raises:
        simulator.schedules.ScheduleError: the schedule does not fit the plan's stages.
    """
    from simulator.schedules import ScheduleError, generate

    if schedule is None and microbatches is None:
        return plan
    name = schedule or plan.schedule.name
    mb = microbatches or plan.microbatches
    p = len(plan.rank_mesh)
    v = max(1, plan.schedule.num_stages // p)
    table = generate(name, p, mb, virtual_stages=v if v > 1 else 2,
                     forward_only=plan.schedule.forward_only)
    if table.num_stages != plan.schedule.num_stages:
        raise ScheduleError(f"schedule {name!r} needs {table.num_stages} stages but the plan has "
                            f"{plan.schedule.num_stages}; re-plan with 'mpmd plan --schedule {name}'")
    if plan.global_batch % mb:
        raise ScheduleError(f"--microbatches {mb} does not divide the global batch "
                            f"{plan.global_batch}; pick a divisor")
    merge = plan.merge_last_stage and name == "1f1b"
    return replace(plan, schedule=table, merge_last_stage=merge)


def register(main: click.Group, guard) -> None:
    @main.command()
    @click.argument("plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False))
    @click.option("--trace", type=click.Path(dir_okay=False), default=None,
                  help="Write a Perfetto/Chrome trace (open in ui.perfetto.dev).")
    @click.option("--schedule", default=None, help="Replay with another schedule.")
    @click.option("--microbatches", type=click.IntRange(min=1), default=None,
                  help="Replay with another microbatch count.")
    @click.option("--jitter", type=float, default=0.0, help="Relative sigma of fragment-time noise.")
    @click.option("--seed", type=int, default=0, help="Seed of the jitter.")
    @click.option("--straggler", multiple=True, help="MESH=FACTOR: that mesh runs FACTOR x slower.")
    @click.option("--degrade-link", multiple=True, help="LINK=FACTOR: bandwidth multiplier in (0, 1].")
    @click.option("--fail-link", multiple=True, help="LINK@SECONDS: the link fails then.")
    @click.option("--fail-mesh", multiple=True, help="MESH@SECONDS: the mesh fails then.")
    @guard
    def simulate(plan_path: str, trace: str | None, schedule: str | None,
                 microbatches: int | None, jitter: float, seed: int, straggler: tuple[str, ...],
                 degrade_link: tuple[str, ...], fail_link: tuple[str, ...],
                 fail_mesh: tuple[str, ...]) -> None:
        """Replay PLAN.json in the discrete-event simulator and print its metrics."""
        from mpmd.cli.main import console
        from simulator.knobs import Knobs
        from simulator.plan_sim import simulate_plan
        from simulator.trace import write_chrome_trace

        plan, w, cluster = load_plan_inputs(plan_path)
        plan = reschedule(plan, schedule, microbatches)
        knobs = Knobs(seed=seed, jitter=jitter,
                      stragglers=_pairs(straggler, "=", "--straggler", "use MESH=2.0"),
                      degraded_links=_pairs(degrade_link, "=", "--degrade-link", "use LINK=0.5"),
                      failed_links=_pairs(fail_link, "@", "--fail-link", "use LINK@1.5"),
                      failed_meshes=_pairs(fail_mesh, "@", "--fail-mesh", "use MESH@1.5"))
        r = simulate_plan(plan, w, cluster, knobs=knobs)
        t = Table(title=f"{plan.model} on {plan.cluster}: {plan.schedule.name} x "
                        f"{plan.microbatches} microbatches", title_justify="left")
        for col in ("mesh", "busy (s)", "bubble", "peak memory (GB)", "capacity (GB)"):
            t.add_column(col, justify="left" if col == "mesh" else "right")
        for m in plan.rank_mesh:
            t.add_row(m, f"{r.busy_s[m]:.3f}", f"{r.bubble[m] * 100:.1f}%",
                      f"{r.peak_memory_bytes[m] / 1e9:.1f}",
                      f"{cluster.meshes[m].device.memory_bytes / 1e9:.1f}")
        console.print(t)
        links = Table(title="transfer volume per link", title_justify="left")
        links.add_column("link")
        links.add_column("GB", justify="right")
        for ln, b in sorted(r.link_bytes.items()):
            links.add_row(ln, f"{b / 1e9:.2f}")
        console.print(links)
        pred = plan.predicted.get("step_time_s")
        console.print(f"step time {r.step_time_s:.4f} s   MFU {r.mfu * 100:.1f}%"
                      + (f"   planner predicted {pred:.4f} s ({(r.step_time_s / pred - 1) * 100:+.2f}%)"
                         if pred and schedule is None and microbatches is None else ""))
        for e in r.errors:
            console.print(f"[red]memory:[/] {e}")
        if r.failure:
            console.print(f"[red]step failed:[/] {r.failure}")
        if trace:
            write_chrome_trace(r.timeline, trace)
            console.print(f"wrote {trace} (open it in ui.perfetto.dev)")
