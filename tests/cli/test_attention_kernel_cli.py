"""The attention kernel through the CLI: ``mpmd plan --attention-kernel flash2`` costs the core at
FlashAttention-2's rate, the plan file carries it (the model's config), ``mpmd simulate`` replays
it as predicted; a value the model does not know is one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARGS = ("--model", "llama3-8b", "--cluster", "hardware_profiles/clusters/h100x64_nodes.yaml",
        "--global-batch", "16", "--seq-len", "131072", "--context-parallel", "8")


def mpmd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mpmd", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})


def step(text: str) -> float:
    m = re.search(r"step time\s+│\s+([\d.]+) s", text)
    assert m, text[-800:]
    return float(m.group(1))


def test_flashattention_2_is_planned_carried_and_replayed(tmp_path):
    fa2 = tmp_path / "fa2.json"
    r = mpmd("plan", *ARGS, "--attention-kernel", "flash2", "--out", str(fa2))
    assert r.returncode == 0, r.stderr
    assert "flash2: FlashAttention-2" in r.stdout            # the inputs say which kernel
    doc = json.loads(fa2.read_text())
    assert doc["model_config"]["attention_kernel"] == "flash2"
    sim = mpmd("simulate", str(fa2))
    assert sim.returncode == 0, sim.stderr
    assert "(+0.00%)" in sim.stdout
    own = mpmd("plan", *ARGS)
    assert own.returncode == 0, own.stderr
    # at 128K tokens the core is most of the step: FlashAttention-2 (0.62 of cuDNN's rate on
    # Hopper) makes the same-degree plan markedly slower, never faster
    assert step(r.stdout) > 1.2 * step(own.stdout)


def test_an_unknown_attention_kernel_is_one_line():
    r = mpmd("plan", *ARGS, "--attention-kernel", "fa3")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "'fa3' is not one of 'flash', 'flash2', 'unfused'" in r.stderr
