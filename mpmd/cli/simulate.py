"""``mpmd simulate plan.json``: replay a plan in the discrete-event simulator."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.table import Table

from mpmd.cli.common import console, guard
from mpmd.cli.params import MAX_MICROBATCHES, FiniteFloat, int_range

if TYPE_CHECKING:   # the command loads these only when it runs, after checking its input
    from hardware_profiles.types import Cluster
    from ir import DataParallelPlan, Plan, Workload


def _pairs(items: tuple[str, ...], sep: str, what: str, fix: str,
           lo: float, hi: float, lo_open: bool = False) -> dict[str, float]:
    """``NAME<sep>NUMBER`` strings as a dict; every number finite and in ``[lo, hi]``
    (``(lo, hi]`` with ``lo_open``).

    Raises:
        click.BadParameter: a malformed item or a number out of range (one line with the fix).
    """
    out = {}
    for it in items:
        key, _, val = it.rpartition(sep)
        try:
            x = float(val)
        except ValueError:
            key = ""
        if not key:
            raise click.BadParameter(f"{it!r} is not NAME{sep}NUMBER; {fix}", param_hint=what)
        if not (math.isfinite(x) and (lo < x if lo_open else lo <= x) and x <= hi):
            raise click.BadParameter(f"{it!r}: {val} is not a number in {'(' if lo_open else '['}"
                                     f"{lo:g}, {hi:g}]; {fix}", param_hint=what)
        out[key] = x
    return out


def _names(names: list[str], limit: int = 24) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def link_names(plan, cluster) -> dict[str, str]:
    """Every spelling of a link a knob may name -> the name the simulator uses (``a<->b``).

    The links are the cluster's explicit links plus the link between every two meshes of the plan
    (the cluster's ``default_link`` where no explicit one exists), and for a data-parallel plan its
    cross-part ``sync_link``; ``b<->a`` means ``a<->b``.
    """
    from ir import DataParallelPlan
    from hardware_profiles.types import ProfileError
    from simulator.plan_sim import plan_meshes

    links = {ln.name: (ln.a, ln.b) for ln in cluster.links}
    if isinstance(plan, DataParallelPlan) and plan.sync_link:
        a, _, b = plan.sync_link.partition("<->")
        links.setdefault(plan.sync_link, (a, b or a))
    meshes = list(dict.fromkeys(plan_meshes(plan)))
    explicit = {frozenset((ln.a, ln.b)) for ln in cluster.links}   # a carved cluster links every pair
    for i, a in enumerate(meshes):
        for b in meshes[i + 1:]:
            if frozenset((a, b)) in explicit:
                continue
            try:
                ln = cluster.link_between(a, b)
            except ProfileError:
                continue
            links[ln.name] = (ln.a, ln.b)
    out = {}
    for name, (a, b) in links.items():
        out[name] = name
        out.setdefault(f"{b}<->{a}", name)
    return out


def check_knob_names(plan, cluster, stragglers: dict[str, float], degraded: dict[str, float],
                     failed_links: dict[str, float], failed_meshes: dict[str, float]
                     ) -> tuple[dict[str, float], dict[str, float]]:
    """Check that the knobs name meshes of the plan and links of the cluster; return the link
    knobs keyed by the simulator's link names (``degraded``, ``failed_links``).

    Raises:
        click.BadParameter: an unknown mesh or link (one line listing the valid names).
    """
    from simulator.plan_sim import plan_meshes

    meshes = list(dict.fromkeys(plan_meshes(plan)))
    for opt, knob in (("--straggler", stragglers), ("--fail-mesh", failed_meshes)):
        for m in knob:
            if m not in meshes:
                raise click.BadParameter(f"{m!r} is not a mesh of the plan; use one of "
                                         f"{_names(meshes)}", param_hint=opt)
    if not degraded and not failed_links:
        return {}, {}
    names = link_names(plan, cluster)
    canonical = sorted(set(names.values()))
    fixed = []
    for opt, knob in (("--degrade-link", degraded), ("--fail-link", failed_links)):
        out = {}
        for ln, x in knob.items():
            if ln not in names:
                raise click.BadParameter(
                    f"{ln!r} is not a link of cluster {cluster.name!r}; use one of "
                    f"{_names(canonical) or '(none: the plan has one mesh)'}", param_hint=opt)
            out[names[ln]] = x
        fixed.append(out)
    return fixed[0], fixed[1]


def load_plan_inputs(plan_path: str, plan: Plan | DataParallelPlan | None = None
                     ) -> tuple[Plan | DataParallelPlan, Workload, Cluster]:
    """(plan, workload, cluster) for a plan file, re-costing its model from the zoo.

    The plan is read by :func:`ir.plan_file.load_plan` (guarded read, schema, sizes): a
    :class:`~ir.Plan` or a :class:`~ir.DataParallelPlan`; ``plan``, when given, is that plan
    already read from ``plan_path``, and the file is not read again. The cluster is the one
    the plan runs on (:func:`simulator.plan_sim.plan_cluster`: the plan's cluster file, carved as
    the plan's ``carving`` says). The plan's meshes must exist in it with the devices the plan
    names, and its stages (every part's) must cover the model's layers. The workload is the whole
    step's (a data-parallel plan's parts take their batch shares of it).

    Raises:
        ir.files.InputError, ir.IRError: a bad plan file (one line).
        hardware_profiles.types.ProfileError: a bad cluster file, or a carving that does not fit it.
    """
    from zoo.costing import workload
    from zoo.model_files import plan_model
    from ir import DataParallelPlan, IRError
    from ir.plan_file import load_plan
    from hardware_profiles import load_cluster
    from simulator.plan_sim import plan_cluster

    if plan is None:
        plan = load_plan(plan_path)
    cluster = plan_cluster(plan, load_cluster(plan.cluster_path or plan.cluster))
    parts = plan.parts if isinstance(plan, DataParallelPlan) else (plan,)
    for part in parts:
        for m, lay in part.layouts.items():
            if m not in cluster.meshes:
                raise IRError(f"{plan_path}: plan mesh {m!r} is not in cluster {cluster.name!r} "
                              f"({_names(list(cluster.meshes))}); fix: re-plan on this cluster")
            dev, n = part.devices.get(m, ("", 0))
            spec = cluster.meshes[m]
            if (dev and dev != spec.device.name) or (n and n != spec.num_devices):
                raise IRError(f"{plan_path}: plan mesh {m!r} has {n} x {dev} but the cluster's has "
                              f"{spec.num_devices} x {spec.device.name}; fix: re-plan on this cluster")
    w = workload(plan_model(plan.model, plan.model_config), global_batch=plan.global_batch,
                 seq_len=plan.seq_len)
    w = replace(w, precision=plan.precision, cross_entropy=plan.cross_entropy)
    for spec in cluster.meshes.values():      # a recipe the plan's devices do not run: one line
        spec.device.format_rate(plan.precision)
    for part in parts:
        if part.stages[-1].last != len(w.layers):
            raise IRError(f"{plan_path}: plan stages cover layers [0, {part.stages[-1].last}) but "
                          f"{plan.model} has {len(w.layers)}; fix: regenerate it with 'mpmd plan'")
    return plan, w, cluster


def reschedule(plan, schedule: str | None, microbatches: int | None):
    """The plan with another schedule and/or microbatch count over the same stages and meshes
    (for a data-parallel plan: every part's, each over its own batch share).

    Raises:
        simulator.schedules.ScheduleError: the schedule does not fit the plan's stages.
    """
    from ir import DataParallelPlan
    from simulator.schedules import ScheduleError, generate

    if schedule is None and microbatches is None:
        return plan
    if isinstance(plan, DataParallelPlan):
        parts = []
        for i, part in enumerate(plan.parts):
            try:
                parts.append(reschedule(part, schedule, microbatches))
            except ScheduleError as e:
                raise ScheduleError(f"part {i + 1} of the data-parallel plan: {e}") from None
        return replace(plan, parts=tuple(parts))
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


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f}"


def print_simulation(console, plan, cluster, r, *, compare: bool = True, exposed=None,
                     alltoall=None) -> None:
    """Print a simulated step: per mesh busy, bubble, peak memory and capacity; per link volume;
    per mesh with expert parallelism, its mixture-of-experts all-to-all volume and seconds
    (``alltoall``: :meth:`simulator.plan_costs.PlanCosts.expert_alltoall`, charged inside the
    fragments and drawn on each mesh's ``<mesh>/alltoall`` track of the timeline:
    :func:`simulator.plan_sim.alltoall_events`);
    for a data-parallel plan one line per part and the cross-part gradient all-reduce; the step
    time, MFU and (``compare``) the planner's prediction; the exposed communication per step
    (``exposed``, a :class:`simulator.exposure.Exposure`, when given); memory errors and a
    failure."""
    from rich.markup import escape
    from rich.text import Text

    from ir import DataParallelPlan
    from simulator.plan_sim import plan_meshes

    dp = isinstance(plan, DataParallelPlan)
    if dp:
        title = (f"{plan.model} on {plan.cluster}: data parallel over {len(plan.parts)} pipelines, "
                 f"global batch {plan.global_batch}")
    else:
        title = (f"{plan.model} on {plan.cluster}: {plan.schedule.name} x "
                 f"{plan.microbatches} microbatches")
    console.print(Text(title, style="table.title"), soft_wrap=True)   # not a table title: rich
    t = Table()                                                        # wraps those to its width
    cols = (("part",) if dp else ()) + ("mesh", "busy (s)", "bubble", "peak memory (GB)",
                                        "capacity (GB)")
    for col in cols:
        t.add_column(col, justify="left" if col in ("mesh", "part") else "right")
    part_of = {m: i for i, p in enumerate(plan.parts) for m in p.rank_mesh} if dp else {}
    for m in plan_meshes(plan):
        row = [str(part_of[m] + 1)] if dp else []
        t.add_row(*row, m, f"{r.busy_s[m]:.3f}", f"{r.bubble[m] * 100:.1f}%",
                  _gb(r.peak_memory_bytes[m]), _gb(cluster.meshes[m].device.memory_bytes))
    console.print(t)
    links = Table(title="transfer volume per link", title_justify="left")
    links.add_column("link")
    links.add_column("GB", justify="right")
    for ln, b in sorted(r.link_bytes.items()):
        links.add_row(escape(ln), f"{b / 1e9:.2f}")
    console.print(links)
    if alltoall:
        a2a = Table(title="expert all-to-all per mesh (inside the fragments: dispatch and combine, "
                          "forward and backward; drawn on the trace's '<mesh>/alltoall' track)",
                    title_justify="left")
        for col in ("mesh", "GB", "seconds per device"):
            a2a.add_column(col, justify="left" if col == "mesh" else "right")
        for m, (b, s) in alltoall.items():
            a2a.add_row(escape(m), f"{b / 1e9:.2f}", f"{s:.4f}")
        console.print(a2a)
    if dp:
        for p in r.extra.get("parts", []):
            console.print(
                f"part {p['index'] + 1}: {p['global_batch']} of {plan.global_batch} samples, "
                f"{escape(p['schedule'])} x {p['microbatches']} microbatches on "
                f"{escape(_names(p['meshes'], 6))}: pipeline and its gradient all-reduce done at "
                f"{p['pipeline_s']:.4f} s", highlight=False, soft_wrap=True)
        sync = r.extra.get("sync", {})
        planned = sync.get("seconds", 0.0)
        if sync.get("start_s") is not None:
            took = sync["end_s"] - sync["start_s"]
            when = (f"in {took:.4f} s" + (f" (planned {planned:.4f} s)" if abs(took - planned) > 1e-12
                                          else "") + f", {sync['start_s']:.4f}-{sync['end_s']:.4f} s")
        else:
            when = f"of {planned:.4f} s: did not run"
        console.print(f"sync: gradient all-reduce across parts, {sync.get('bytes', 0) / 1e9:.2f} GB "
                      f"over {escape(str(sync.get('link')))} {when}; then every mesh runs its optimizer",
                      highlight=False, soft_wrap=True)
        if plan.reason:
            console.print(f"reason: {escape(plan.reason)}", highlight=False, soft_wrap=True)
    pred = plan.predicted.step_time_s if plan.predicted is not None else None
    pred = pred if pred is not None and pred > 0 else None
    console.print(f"step time {r.step_time_s:.4f} s   MFU {r.mfu * 100:.1f}%"
                  + (f"   planner predicted {pred:.4f} s ({(r.step_time_s / pred - 1) * 100:+.2f}%)"
                     if pred and compare else ""))
    if exposed is not None:
        console.print(f"exposed communication: {exposed.exposed_s:.4f} s per step "
                      f"({exposed.fraction * 100:.1f}% of the step)", highlight=False)
    for e in r.errors:
        console.print(f"[red]memory:[/] {escape(e)}")
    if r.failure:
        console.print(f"[red]step failed:[/] {escape(r.failure)}")


@click.command()
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False))
@click.option("--trace", type=click.Path(), default=None,
              help="Write a Perfetto/Chrome trace (open in ui.perfetto.dev).")
@click.option("--schedule", default=None, help="Replay with another schedule.")
@click.option("--microbatches", type=int_range(1, MAX_MICROBATCHES), default=None,
              help="Replay with another microbatch count.")
@click.option("--jitter", type=FiniteFloat(min=0.0, max=10.0), default=0.0,
              help="Relative sigma of fragment-time noise (0 to 10).")
@click.option("--seed", type=int, default=0, help="Seed of the jitter.")
@click.option("--straggler", multiple=True,
              help="MESH=FACTOR: that mesh runs FACTOR x slower (FACTOR in (0, 1e6]).")
@click.option("--degrade-link", multiple=True,
              help="LINK=FACTOR: bandwidth multiplier in (0, 1]; LINK is A<->B (two meshes).")
@click.option("--fail-link", multiple=True, help="LINK@SECONDS: the link A<->B fails then.")
@click.option("--fail-mesh", multiple=True, help="MESH@SECONDS: the mesh fails then.")
@guard
def simulate(plan_path: str, trace: str | None, schedule: str | None,
             microbatches: int | None, jitter: float, seed: int, straggler: tuple[str, ...],
             degrade_link: tuple[str, ...], fail_link: tuple[str, ...],
             fail_mesh: tuple[str, ...]) -> None:
    """Replay PLAN.json in the discrete-event simulator and print its metrics.

    A data-parallel plan (several pipelines) is replayed as one step: every part's pipeline,
    the gradient all-reduce across parts, then every mesh's optimizer. The exposed
    communication is the step time minus that of the same replay with every link free."""
    # the input first, before the simulator, pydantic and JAX load: an output path that cannot
    # be written, a malformed knob, a missing or malformed plan file or a missing cluster file
    # is refused in ~0.2 s
    from hardware_profiles.paths import resolve_cluster_path
    from ir.files import check_output
    from ir.plan_file import load_plan

    if trace:
        check_output(trace, "trace")
    stragglers = _pairs(straggler, "=", "--straggler", "use MESH=2.0", 0.0, 1e6, lo_open=True)
    degraded = _pairs(degrade_link, "=", "--degrade-link", "use A<->B=0.5", 0.0, 1.0, lo_open=True)
    failed_l = _pairs(fail_link, "@", "--fail-link", "use A<->B@1.5", 0.0, 1e9)
    failed_m = _pairs(fail_mesh, "@", "--fail-mesh", "use MESH@1.5", 0.0, 1e9)
    plan = load_plan(plan_path)                              # InputError / IRError
    resolve_cluster_path(plan.cluster_path or plan.cluster)  # ProfileError: no such file
    from simulator.exposure import exposure
    from simulator.knobs import Knobs
    from ir import DataParallelPlan
    from simulator.plan_costs import PlanCosts
    from simulator.plan_sim import plan_cluster, simulate_any
    from simulator.trace import write_chrome_trace

    plan, w, cluster = load_plan_inputs(plan_path, plan)
    plan = reschedule(plan, schedule, microbatches)
    degraded, failed_l = check_knob_names(plan, cluster, stragglers, degraded, failed_l, failed_m)
    knobs = Knobs(seed=seed, jitter=jitter, stragglers=stragglers, degraded_links=degraded,
                  failed_links=failed_l, failed_meshes=failed_m)
    r = simulate_any(plan, w, cluster, knobs=knobs)
    # the same replay with every link free; a step that failed has no step time to compare
    exposed = (None if r.failure else
               exposure(plan, w, cluster, knobs=knobs, step_time_s=r.step_time_s))
    a2a = ({} if isinstance(plan, DataParallelPlan)
           else PlanCosts(plan, w, plan_cluster(plan, cluster)).expert_alltoall())
    print_simulation(console, plan, cluster, r,
                     compare=schedule is None and microbatches is None, exposed=exposed,
                     alltoall=a2a)
    if trace:
        write_chrome_trace(r.timeline, trace)
        console.print(f"wrote {trace} (open it in ui.perfetto.dev)")
