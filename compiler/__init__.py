"""The MPMD compiler on JAX, with the plan-level IR, the model zoo it traces, its calibration and the
training driver, one subpackage each:

- :mod:`compiler.ir`: the plan-level IR every package speaks (imports nothing else of the project).
- :mod:`compiler.zoo`: JAX models whose layers are named computations, and ``zoo.costing``: each
  unique fragment body costed from XLA's analysis (a ``Workload``).
- :mod:`compiler.core`: the compiler proper (frontend, program IR, passes, export, runtime).
- :mod:`compiler.calibration`: ``mpmd calibrate``.
- :mod:`compiler.train`: ``mpmd run``.

The compiler proper's face is re-exported here: ``from compiler import jit, named_computation``.
"""

from compiler.core import (CompilerError, FragmentInfo, FragmentPattern, MpmdConfig, Program,
                           config_from_plan, default_pipeline, export_program, jit,
                           named_computation, print_program, run_passes, run_sequential,
                           schedule_from_plan, verify)

__all__ = ["CompilerError", "FragmentInfo", "FragmentPattern", "MpmdConfig", "Program",
           "config_from_plan", "default_pipeline", "export_program", "jit", "named_computation",
           "print_program", "run_passes", "run_sequential", "schedule_from_plan", "verify"]
