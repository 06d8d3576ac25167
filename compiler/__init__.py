"""The MPMD compiler proper (the Shardy:MPMD RFC in Python on JAX).

Label pieces of a program with :func:`named_computation`, then ``jit(fn, config).lower(*args)
.compile()`` gives per-mesh programs that run like ``fn`` (a walk-through:
``docs/compiler_guide.md``; a GPT trained with optax: ``docs/guide.md``). Modules: ``named.py`` (the label), ``config.py`` /
``plan_config.py`` (what the user or a plan tells the compiler), ``frontend.py`` (tracing into the
program IR), ``diagnose.py`` (names a config uses that the step lacks, and untraceable named
computations, refused in one line), ``program.py`` (the IR and its printer), ``passes/`` (pure
``Program -> Program`` passes) run by ``driver.py`` with ``verify.py`` between them in tests,
``export.py`` / ``exported.py`` (one executable per unique fragment body and mesh) and
``runtime.py`` (running the per-mesh programs on JAX devices), ``distributed.py`` (the same, one
process per mesh or group of meshes, on ``jax.distributed``).
"""

from compiler.config import FragmentInfo, FragmentPattern, MpmdConfig, schedule_from_plan
from compiler.distributed import (DistributedError, ProcessProgram, assign_meshes, prepare,
                                  process_topology, run_process)
from compiler.driver import default_pipeline, run_passes
from compiler.errors import CompilerError
from compiler.export import export_program, run_sequential
from compiler.exported import Call, Executable, ExportedProgram, MeshProgram, Send
from compiler.frontend import jit
from compiler.named import named_computation
from compiler.plan_config import config_from_plan
from compiler.program import Program, print_program
from compiler.runtime import DeadlockError, Execution, MpmdRuntimeError, execute, run_program
from compiler.verify import verify

__all__ = ["Call", "CompilerError", "DeadlockError", "DistributedError", "Executable", "Execution",
           "ExportedProgram", "ProcessProgram", "assign_meshes", "prepare", "process_topology",
           "run_process",
           "FragmentInfo", "FragmentPattern", "MeshProgram", "MpmdConfig", "MpmdRuntimeError", "Program",
           "Send",
           "config_from_plan", "default_pipeline", "execute", "export_program", "jit",
           "named_computation", "print_program", "run_passes", "run_program", "run_sequential",
           "schedule_from_plan", "verify"]
