"""Benchmark: how fast the CLI refuses bad input, before the planner, pydantic and JAX load.

Usage:
    python benchmarks/bench_cli.py [--repeats 5]

Each command runs ``repeats`` times as a fresh ``python -m mpmd`` process (what the ``mpmd`` script
runs); the table gives the median wall time, the imports' own total from ``python -X importtime``
(the sum of every module's self time, s) and whether JAX, OR-Tools or pydantic were imported.
``mpmd --help`` is the floor: the interpreter, click and rich.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

CASES = (
    ("mpmd --help", ["--help"]),
    ("mpmd plan --model llama3-70 (a typo)",
     ["plan", "--model", "llama3-70", "--cluster", "hardware_profiles/clusters/mixed512_nodes.yaml"]),
    ("mpmd plan --cluster (a missing file)",
     ["plan", "--model", "llama3-70b", "--cluster", "hardware_profiles/clusters/mixed512_node.yaml"]),
    ("mpmd simulate missing.json (a missing plan file)", ["simulate", "missing.json"]),
    ("mpmd run missing.json (a missing plan file)", ["run", "missing.json"]),
)
HEAVY = ("jax", "ortools", "pydantic")


def measure(args: list[str], repeats: int) -> tuple[float, float, list[str], int, str]:
    """(median wall s, imports' self time s, heavy packages imported, exit status, first line of
    stderr or stdout) of ``python -m mpmd ARGS``."""
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "mpmd", *args], cwd=ROOT, capture_output=True)
        walls.append(time.perf_counter() - t0)
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "mpmd", *args], cwd=ROOT,
                         capture_output=True, text=True)
    self_us, heavy = 0, set()
    for line in out.stderr.splitlines():
        if line.startswith("import time:") and "|" in line and "self [us]" not in line:
            own, _, name = (s.strip() for s in line[len("import time:"):].split("|"))
            self_us += int(own)
            if name.split(".")[0] in HEAVY:
                heavy.add(name.split(".")[0])
    said = [ln for ln in out.stderr.splitlines() if not ln.startswith("import time:")]
    first = (said or out.stdout.splitlines() or [""])[0]
    return statistics.median(walls), self_us / 1e6, sorted(heavy), out.returncode, first


def markdown(repeats: int = 5) -> str:
    rows = ["| command | median wall (s) | imports (s, -X importtime) | heavy imports | exit | says |",
            "|---|---|---|---|---|---|"]
    for what, args in CASES:
        wall, imp, heavy, rc, said = measure(args, repeats)
        said = said if len(said) <= 90 else said[:87] + "..."
        rows.append(f"| `{what}` | {wall:.2f} | {imp:.2f} | {', '.join(heavy) or 'none'} | {rc} | "
                    f"{said.replace('|', '/')} |")
    return ("Each refusal comes before the planner, pydantic and JAX load (`--help` is the floor). "
            f"Median of {repeats} fresh processes.\n\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    print(markdown(ap.parse_args().repeats))
