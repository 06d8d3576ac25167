"""``mpmd plan --precision``: a recipe the cluster's devices lack is refused in one line; ``auto``
searches every recipe they all run, keeps the fastest plan and prints the others beside it; the
plan file carries the recipe and ``mpmd simulate`` replays it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
H100 = str(ROOT / "hardware_profiles/clusters/h100x1.yaml")
A100_CLUSTER = str(ROOT / "hardware_profiles/clusters/a100x1024_nodes.yaml")


def mpmd(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mpmd", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_recipe_the_devices_lack_is_one_line(tmp_path):
    r = mpmd("plan", "--model", "llama-tiny", "--cluster", H100, "--precision", "mxfp8",
             cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines() == [
        "error: --precision mxfp8: h100-sxm do not run mxfp8 GEMMs (every device of h100x1 runs: "
        "bf16, fp8, fp8-blockwise); fix: use one of those or --precision auto"]
    r = mpmd("plan", "--model", "llama-tiny", "--cluster", A100_CLUSTER, "--precision", "fp8",
             cwd=tmp_path)
    assert r.returncode != 0 and "a100-80gb-sxm do not run fp8 GEMMs" in r.stderr
    assert not list(tmp_path.iterdir())


def test_auto_plans_each_recipe_and_keeps_the_fastest(tmp_path):
    r = mpmd("plan", "--model", "opt-350m", "--cluster", H100, "--global-batch", "16",
             "--seq-len", "2048", "--precision", "auto", "--time-limit", "5", "--out", "p.json",
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    table = r.stdout[r.stdout.index("precisions searched"):]
    rows = [ln.split()[0] for ln in table.splitlines()[3:] if ln.strip() and "wrote" not in ln]
    assert rows == ["bf16", "fp8", "fp8-blockwise"]
    assert "fp8 (chosen)" in table
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["precision"] == "fp8"
    r = mpmd("simulate", "p.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "(+0.00%)" in r.stdout           # the replay is the plan's own prediction
