"""The training driver behind ``mpmd run``: compile a plan, train the plan's zoo model on the shipped
text (``data/``) and check the run against ``jax.jit``, the plan's order, the executables per unique
fragment body and the simulator.

``run.py`` (the run and its report), ``check.py`` (the checks), ``process_run.py`` (one process of
a multi-process run), ``launch.py`` (starting those processes on this host: ``runtime.train.launch.launch``).
"""

from runtime.train.check import (ExecutableCount, executable_counts, max_rel_error,
                                 order_mismatches, rel_error, step_time_error)
from runtime.train.launch import LaunchError
from runtime.train.process_run import DistributedReport, ProcessRunError, run_worker
from runtime.train.run import RunError, RunReport, print_report, run_plan

__all__ = ["DistributedReport", "ExecutableCount", "LaunchError", "ProcessRunError", "RunError",
           "RunReport", "executable_counts", "max_rel_error", "order_mismatches", "print_report",
           "rel_error", "run_plan", "run_worker", "step_time_error"]
