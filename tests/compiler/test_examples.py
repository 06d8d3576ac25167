"""examples/ runs: each script as a subprocess (its own 8 CPU devices), exiting 0 when its checks
against jax.jit pass (the script prints each check and exits 1 naming the failed ones)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpt_optax_example_matches_jax_jit():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # the script asks for its own 8 CPU devices
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "gpt_optax.py"), "--steps", "3",
                           "--repeats", "0"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "all checks passed" in out and "FAIL" not in out
    for needle in ("gradients == jax.jit's", "one SGD step", "AdamW's first step on the same",
                   "each lowering under 10 s", "AdamW steps' losses follow jax.jit's"):
        assert any(line.startswith("ok") and needle in line for line in out.splitlines()), needle
