"""The plan-level IR is importable without JAX: the planner and the simulator speak it, and the
compiler's face (``from compiler import jit``) loads on first use."""

from __future__ import annotations

import subprocess
import sys


def _modules_after(stmt: str) -> set[str]:
    code = f"import sys; {stmt}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(out.stdout.split())


def test_compiler_ir_imports_no_jax():
    mods = _modules_after("import compiler.ir")
    assert "compiler.ir" in mods and "jax" not in mods and "compiler.core" not in mods


def test_the_compiler_face_still_loads_on_use():
    mods = _modules_after("from compiler import jit, named_computation; import compiler; compiler.verify")
    assert "jax" in mods and "compiler.core" in mods


def test_an_unknown_attribute_is_an_attribute_error():
    import compiler
    try:
        compiler.nonsense
    except AttributeError as e:
        assert "no attribute 'nonsense'" in str(e)
    else:
        raise AssertionError("compiler.nonsense did not raise")


def test_the_planner_and_the_simulator_import_no_jax():
    mods = _modules_after("import planner, simulator, hardware_profiles")
    assert {"planner", "simulator", "hardware_profiles"} <= mods and "jax" not in mods
