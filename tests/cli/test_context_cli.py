"""Context parallelism through the CLI (issue 44): ``mpmd plan --context-parallel`` fixes the degree,
the plan file carries it, ``mpmd simulate`` replays it as predicted; a bad value is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = "hardware_profiles/clusters/cpu4x2.yaml"


def mpmd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mpmd", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_context_plan_is_planned_replayed_and_exported(tmp_path):
    plan = tmp_path / "cp.json"
    r = mpmd("plan", "--model", "llama-tiny", "--cluster", CLUSTER, "--global-batch", "8",
             "--context-parallel", "2", "--out", str(plan))
    assert r.returncode == 0, r.stderr
    doc = json.loads(plan.read_text())
    layouts = [m["layout"] for m in doc["meshes"].values()]
    assert layouts and all(lay["context"] == 2 and lay["data"] * 2 * lay["tensor"] == 2
                           for lay in layouts)
    method = layouts[0]["context_method"]
    assert method in ("ring", "alltoall")
    sim = mpmd("simulate", str(plan))
    assert sim.returncode == 0, sim.stderr
    assert "(+0.00%)" in sim.stdout
    # a CPU plan is refused by the GPU launchers in one line (what each target writes for a
    # context-parallel plan on GPUs and TPUs: tests/launchers/test_export_context.py)
    out = tmp_path / "cp.args"
    e = mpmd("export", str(plan), "--to", "megatron", "--out", str(out))
    assert e.returncode == 2 and not out.exists()
    assert e.stderr.strip().splitlines()[-1].startswith(
        "error: the plan runs on cpu-host, which Megatron-LM cannot run")


def test_a_bad_context_value_is_one_line():
    r = mpmd("plan", "--model", "llama-tiny", "--cluster", CLUSTER, "--context-parallel", "two")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == (
        "error: Invalid value for '--context-parallel': 'two': give auto, off or a context degree "
        "N (1 to 1048576), e.g. --context-parallel 2; see 'mpmd plan --help'")
