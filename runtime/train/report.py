"""What a training run measured and checked (:class:`RunReport`), and its printed table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from rich.console import Console
from rich.table import Table

from ir import DataParallelPlan, Plan, Timeline
from runtime.train import check
from runtime.train.generate import GenerateReport, print_generate_report

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



def print_report(report: RunReport | GenerateReport, console: Any = None) -> None:
    """Print a :class:`RunReport` (or a forward-only run's ``GenerateReport``) as rich tables."""
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
                  f"({err * 100:.1f}%)", "yes" if err < 0.15 else "NO")
    console.print(t)
    if report.simulated_step_s is not None and report.step_time_error >= 0.15:
        console.print("step time off by more than 15%: the cpu-host profile was calibrated on "
                      "another machine or at another time; run 'mpmd calibrate --out calibrated' on "
                      "an otherwise idle machine, then 'mpmd run PLAN.json --cluster "
                      "calibrated/cpu4x2.yaml'")
