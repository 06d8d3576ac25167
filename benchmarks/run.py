"""Run every benchmark and write ``reports/benchmarks.md``.

Usage:
    python benchmarks/run.py
"""

from __future__ import annotations

import os
import platform
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import bench_planner  # noqa: E402
import bench_simulator  # noqa: E402

from mpmd.cli.output import write_atomic  # noqa: E402


def main() -> None:
    head = (f"# Benchmarks\n\nMade by `python benchmarks/run.py` on {date.today()}, "
            f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}.\n")
    parts = [head, "## Simulator\n", bench_simulator.markdown(), "## Planner\n",
             bench_planner.markdown()]
    text = "\n".join(parts)
    out = Path(__file__).resolve().parent.parent / "reports" / "benchmarks.md"
    write_atomic(out, text)
    print(text)


if __name__ == "__main__":
    main()
