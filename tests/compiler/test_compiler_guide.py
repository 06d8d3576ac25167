"""docs/compiler_guide.md runs: its ```python blocks, in order, in one namespace, on the 8 CPU
devices tests/conftest.py sets; the blocks check their results against jax.jit themselves."""

import re
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "compiler_guide.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_the_guide_has_blocks_for_each_topic():
    text = GUIDE.read_text()
    blocks = python_blocks(text)
    assert len(blocks) == text.count("```python") >= 8
    code = "\n".join(blocks)
    for needle in ("named_computation(", "assignment", "simulator.schedules", "compiler.jit(",
                   ".compile()", "run_program", "stage_mesh", "output_meshes", "jax.jit("):
        assert needle in code, needle


@pytest.mark.slow
def test_every_guide_block_runs_in_order(capsys):
    namespace: dict = {"__name__": "compiler_guide"}
    for k, block in enumerate(python_blocks(GUIDE.read_text())):
        try:
            exec(compile(block, f"{GUIDE.name}[block {k}]", "exec"), namespace)
        except Exception as e:  # name the block that failed
            raise AssertionError(f"block {k} of {GUIDE.name} failed: {type(e).__name__}: {e}") from e
    out = capsys.readouterr().out
    assert "did you mean" in out and "named computation 'norm' leaked" in out
