"""The lower layers import without JAX: the plan IR, the hardware profiles, the simulator and the
planner (and the zoo's configs, which the CLI checks a model name against) run in an environment
where ``import jax`` fails. The layering itself is import-linter's contracts in ``pyproject.toml``,
run by ``scripts/test.sh``."""

from __future__ import annotations

import subprocess
import sys

# A meta-path finder that makes JAX (and jaxlib) unimportable, as in an environment without them.
_BLOCK_JAX = """
import sys
class _NoJax:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('jax', 'jaxlib'):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)")
        return None
sys.meta_path.insert(0, _NoJax())
"""


def _run(stmt: str) -> subprocess.CompletedProcess:
    code = _BLOCK_JAX + stmt + "\nprint(' '.join(sorted(sys.modules)))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_the_block_really_blocks_jax():
    out = _run("import jax")
    assert out.returncode == 1 and "No module named 'jax' (blocked by the test)" in out.stderr


def test_ir_planner_simulator_import_without_jax():
    out = _run("import ir, planner, simulator, hardware_profiles, ir.plan_file, ir.files")
    assert out.returncode == 0, out.stderr
    mods = set(out.stdout.split())
    assert {"ir", "planner", "simulator", "hardware_profiles", "ir.plan_file"} <= mods
    assert not {m for m in mods if m.split(".")[0] in ("jax", "jaxlib", "compiler", "runtime")}


def test_the_zoo_configs_need_no_jax_and_its_programs_do():
    out = _run("import zoo\nassert 'llama3-70b' in zoo.list_models()\n"
               "assert zoo.get_config('llama3-70b').dtype_bytes == 2")
    assert out.returncode == 0, out.stderr
    out = _run("import zoo\nzoo.init_params")
    assert out.returncode == 1 and "blocked by the test" in out.stderr


def test_the_zoo_face_loads_its_programs_on_use():
    import zoo
    assert callable(zoo.layer_fns) and callable(zoo.workload)
    assert zoo.layer_names("llama-tiny")[:2] == ("embed", "block0")
    try:
        zoo.nonsense
    except AttributeError as e:
        assert "module 'zoo' has no attribute 'nonsense'" in str(e)
    else:
        raise AssertionError("zoo.nonsense did not raise")
