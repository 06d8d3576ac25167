"""The MPMD compiler on JAX, with the plan-level IR, the model zoo it traces, its calibration and the
training driver, one subpackage each:

- :mod:`compiler.ir`: the plan-level IR every package speaks (imports nothing else of the project).
- :mod:`compiler.zoo`: JAX models whose layers are named computations, and ``zoo.costing``: each
  unique fragment body costed from XLA's analysis (a ``Workload``).
- :mod:`compiler.core`: the compiler proper (frontend, program IR, passes, export, runtime).
- :mod:`compiler.calibration`: ``mpmd calibrate``.
- :mod:`compiler.train`: ``mpmd run``.

The compiler proper's face is re-exported here: ``from compiler import jit, named_computation``.
It is loaded on first use (PEP 562), so ``import compiler.ir``, which the planner and the simulator
need, does not import JAX (``tests/compiler/test_ir_imports.py``).
"""

from __future__ import annotations

import importlib

__all__ = ["CompilerError", "FragmentInfo", "FragmentPattern", "MpmdConfig", "Program",
           "config_from_plan", "default_pipeline", "export_program", "jit", "named_computation",
           "print_program", "run_passes", "run_sequential", "schedule_from_plan", "verify"]


def __getattr__(name: str):
    """The compiler proper's face (``compiler.core``), imported on first use; the subpackages as
    attributes once imported."""
    if name in __all__:
        return getattr(importlib.import_module("compiler.core"), name)
    if name in ("ir", "zoo", "core", "calibration", "train"):
        return importlib.import_module(f"compiler.{name}")
    raise AttributeError(f"module 'compiler' has no attribute {name!r}")
