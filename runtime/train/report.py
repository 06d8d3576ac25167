"""What a training run measured and checked (:class:`RunReport`), its printed table, and the
warning a timing miss (check (d)) gets: one labelled line with the likely causes of this run
(:func:`timing_warning`: too few steps, other processes on the CPUs, a profile measured on
another machine or at another time), each with its fix.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from rich.console import Console
from rich.table import Table

from ir import DataParallelPlan, Plan, Timeline
from runtime.train import check
from runtime.train.generate import GenerateReport, print_generate_report

STEP_TIME_TOLERANCE = 0.15
"""Check (d) passes when the measured step is within this fraction of the simulated one."""
MIN_TIMED_STEPS = 10
"""Steps below which check (d)'s median (of the later half) still holds XLA's warm-up."""
BUSY_CORES = 0.25
"""Cores' worth of other processes' CPU time during a run above which it counts as shared."""
REPO = Path(__file__).resolve().parents[2]

@dataclass(frozen=True)
class RunReport:
    """What :func:`run_plan` measured and checked (SI units).

    ``loss_rel_errors`` / ``grad_rel_errors`` hold the checked steps' errors against ``jax.jit``
    (the gradient as one vector, :func:`runtime.train.check.tree_rel_error`; the worst single leaf is in
    ``grad_leaf_rel_errors``, for information);
    ``measured_step_s`` is :func:`measured_step_time` of the recorded steps; ``simulated_step_s``
    the simulator's step without the optimizer op (the optimizer runs outside the MPMD program here).
    ``param_shardings`` is the parameter pytree after the last step with each leaf replaced by
    ``(mesh name, PartitionSpec)`` of where it lives; ``opt_state_follows_params`` says whether
    both Adam moments of every leaf are sharded exactly like it.
    """

    plan: Plan | DataParallelPlan
    losses: tuple[float, ...]
    loss_rel_errors: tuple[float, ...]
    grad_rel_errors: tuple[float, ...]
    order_mismatches: tuple[str, ...]
    executables: Mapping[str, check.ExecutableCount]
    measured_step_s: float
    simulated_step_s: float | None
    step_times_s: tuple[float, ...]
    executed_order: Mapping[str, tuple[str, ...]]
    timelines: tuple[Timeline, ...] = field(default=(), repr=False)
    grad_leaf_rel_errors: tuple[float, ...] = ()
    param_shardings: Any = field(default=None, repr=False)
    opt_state_follows_params: bool | None = None

    @property
    def max_rel_error(self) -> float:
        return max(self.loss_rel_errors + self.grad_rel_errors, default=0.0)

    @property
    def step_time_error(self) -> float | None:
        if self.simulated_step_s is None:
            return None
        return check.step_time_error(self.measured_step_s, self.simulated_step_s)

    @property
    def executables_ok(self) -> bool:
        return all(c.ok for c in self.executables.values())

    @property
    def failed_checks(self) -> tuple[str, ...]:
        """The correctness checks (a)-(c) that failed, one line each (check (d), the timing,
        depends on the machine and is a warning: :func:`timing_warning`)."""
        out = []
        if self.max_rel_error >= 1e-5:
            out.append(f"(a) loss and gradients differ from jax.jit by {self.max_rel_error:.2e} "
                       f"(limit 1e-5)")
        if self.order_mismatches:
            out.append("(b) executed order differs from the plan: " + "; ".join(self.order_mismatches))
        if not self.executables_ok:
            out.append("(c) executables do not match the fragment bodies: " + ", ".join(
                str(c) for c in self.executables.values() if not c.ok))
        return tuple(out)

    @property
    def timing_ok(self) -> bool:
        """Check (d) passed, or there was no simulation to check against."""
        err = self.step_time_error
        return err is None or err < STEP_TIME_TOLERANCE


@dataclass(frozen=True)
class CpuSample:
    """A point of :func:`cpu_sample`: wall time, the machine's busy CPU seconds (all cores, from
    ``/proc/stat``) and this process's CPU seconds (all its threads)."""

    wall_s: float
    busy_s: float
    own_s: float


def cpu_sample() -> CpuSample | None:
    """The machine's and this process's CPU use now; None where ``/proc/stat`` is not readable
    (not Linux)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        ticks = [int(x) for x in fields]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)      # idle + iowait
    hz = os.sysconf("SC_CLK_TCK")
    t = os.times()
    return CpuSample(time.monotonic(), (sum(ticks[:8]) - idle) / hz, t.user + t.system)


def other_cores(start: CpuSample | None, end: CpuSample | None) -> float | None:
    """Cores' worth of CPU time other processes used between two :func:`cpu_sample` points (e.g.
    1.3: other work kept 1.3 cores busy on average), or None when unknown."""
    if start is None or end is None or end.wall_s <= start.wall_s:
        return None
    others = (end.busy_s - start.busy_s) - (end.own_s - start.own_s)
    return max(0.0, others / (end.wall_s - start.wall_s))


def _cluster_origin(cluster_path: str | Path | None) -> tuple[bool, str]:
    """(the cluster file ships with the project, its device kinds with the origin of each one's
    profile, e.g. ``"cpu-host: measured by mpmd calibrate on 2026-11-24"``)."""
    if not cluster_path:
        return False, ""
    try:
        from hardware_profiles import load_cluster
        from hardware_profiles.calibration import calibration_origin
        from hardware_profiles.paths import resolve_cluster_path

        path = resolve_cluster_path(cluster_path).resolve()
    except Exception:  # noqa: BLE001 - the hint only; the run has already read the cluster
        return False, ""
    bundled = path.is_relative_to(REPO / "hardware_profiles")
    try:
        cluster = load_cluster(path)
        specs = cluster.groups.values() if cluster.groups else cluster.meshes.values()
        kinds = {s.device.name: calibration_origin(s.device).split(" (")[0] for s in specs}
    except Exception:  # noqa: BLE001 - the hint only; the run has already read the cluster
        return bundled, ""
    return bundled, "; ".join(f"{k}: {v}" for k, v in kinds.items())


def timing_warning(report: RunReport, cluster_path: str | Path | None = None,
                   others: float | None = None, cores: int | None = None) -> str | None:
    """The one-line warning of a failed check (d), or None when it passed.

    It names the measured and simulated steps and the likely causes of this run, each with its
    fix: fewer than :data:`MIN_TIMED_STEPS` steps; other processes' CPU time during the run
    (``others``, cores' worth: :func:`other_cores`) of ``cores`` (default ``os.cpu_count()``);
    a cluster file shipped with the project (its profile describes the machine it was measured
    on: calibrate this one); else a profile calibrated here that this machine no longer matches
    (calibrate again on an idle machine). ``cluster_path`` is the cluster the run simulated.
    """
    if report.timing_ok:
        return None
    assert report.simulated_step_s is not None and report.step_time_error is not None
    cores = cores or os.cpu_count() or 1
    steps = len(report.step_times_s)
    why = []
    if steps < MIN_TIMED_STEPS:
        why.append(f"only {steps} step{'s' * (steps != 1)} ran, so the measured step still holds "
                   f"XLA's warm-up (give --steps {MIN_TIMED_STEPS} or more)")
    if others is not None and others >= BUSY_CORES:
        why.append(f"other processes kept {others:.1f} of this machine's {cores} cores busy during "
                   f"the run (rerun when it is otherwise idle)")
    bundled, origin = _cluster_origin(cluster_path)
    origin = f" ({origin})" if origin else ""
    if bundled:
        why.append(f"{cluster_path} ships with the project: its profile{origin} describes the "
                   f"machine it was measured on, not necessarily this one (run 'mpmd calibrate "
                   f"--out calibrated' here while the machine is idle, plan on "
                   f"calibrated/cpu4x2.yaml and run that plan)")
    elif cluster_path and not why:
        why.append(f"this machine no longer runs at the speed recorded in {cluster_path}{origin} "
                   f"(run 'mpmd calibrate --out calibrated' again while it is idle, then rerun "
                   f"this plan)")
    return (f"warning: check (d) failed: measured step {report.measured_step_s * 1e3:.1f} ms is "
            f"{report.step_time_error * 100:.1f}% off the simulated {report.simulated_step_s * 1e3:.1f}"
            f" ms (limit {STEP_TIME_TOLERANCE * 100:.0f}%); likely: " + "; ".join(why or [
                "the profile does not describe this machine (run 'mpmd calibrate --out calibrated' "
                "while it is idle)"]))



def print_report(report: RunReport | GenerateReport, console: Any = None, *,
                 cluster_path: str | Path | None = None, others: float | None = None) -> None:
    """Print a :class:`RunReport` (or a forward-only run's ``GenerateReport``) as rich tables,
    then, when check (d) failed, :func:`timing_warning`'s line (``cluster_path``: the cluster the
    run simulated, default the plan's; ``others``: other processes' cores during the run)."""
    if not isinstance(report, RunReport):
        return print_generate_report(report, console)

    console = console or Console()
    p = report.plan
    if isinstance(p, DataParallelPlan):
        how = " + ".join(f"{q.schedule.name} x{q.microbatches} on {q.global_batch} samples"
                         for q in p.parts)
        t = Table(title=f"mpmd run: {p.model} on {p.cluster}, data parallel: {how}")
    else:
        t = Table(title=f"mpmd run: {p.model} on {p.cluster}, {p.schedule.name}, "
                        f"{p.microbatches} microbatches")
    t.add_column("check")
    t.add_column("result", justify="right")
    t.add_column("ok")
    t.add_row("losses", " ".join(f"{x:.4f}" for x in report.losses[:6])
              + (" ..." if len(report.losses) > 6 else ""), "")
    t.add_row("(a) max rel error vs jax.jit (loss, gradients)", f"{report.max_rel_error:.2e}"
              + (f" (worst leaf {max(report.grad_leaf_rel_errors):.1e})"
                 if report.grad_leaf_rel_errors else ""),
              "yes" if report.max_rel_error < 1e-5 else "NO")
    t.add_row("(b) per-mesh order", "as planned" if not report.order_mismatches
              else "; ".join(report.order_mismatches), "yes" if not report.order_mismatches else "NO")
    t.add_row("(c) executables = fragment bodies", ", ".join(
        str(c) for c in report.executables.values()),
        "yes" if report.executables_ok else "NO")
    if report.simulated_step_s is not None:
        err = report.step_time_error
        t.add_row("(d) step time measured / simulated",
                  f"{report.measured_step_s * 1e3:.1f} / {report.simulated_step_s * 1e3:.1f} ms "
                  f"({err * 100:.1f}%)", "yes" if report.timing_ok else "NO")
    console.print(t)
    warning = timing_warning(report, cluster_path or p.cluster_path or None, others)
    if warning:
        console.print(warning, highlight=False, soft_wrap=True, markup=False)
