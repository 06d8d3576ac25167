"""The MPMD compiler on JAX, plus the plan-level IR and the workloads it traces.

Frontend in JAX's idiom: label pieces of a program with :func:`named_computation`, then
``jit(fn, config).lower(*args).compile()`` gives per-mesh programs that run like ``fn``.
"""

from compiler.config import FragmentInfo, FragmentPattern, MpmdConfig, schedule_from_plan
from compiler.driver import default_pipeline, run_passes
from compiler.errors import CompilerError
from compiler.export import export_program, run_sequential
from compiler.frontend import jit
from compiler.named import named_computation
from compiler.plan_config import config_from_plan
from compiler.program import Program, print_program
from compiler.verify import verify

__all__ = ["CompilerError", "FragmentInfo", "FragmentPattern", "MpmdConfig", "Program",
           "config_from_plan", "default_pipeline", "export_program", "jit", "named_computation",
           "print_program", "run_passes", "run_sequential", "schedule_from_plan", "verify"]
