"""Run every benchmark, print the Markdown table and, with ``--out``, write it.

Usage:
    python benchmarks/run.py --out reports/benchmarks.md
"""

from __future__ import annotations

import os
import platform
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import bench_a100_175b  # noqa: E402
import bench_fixtures  # noqa: E402
import bench_peer  # noqa: E402
import bench_planner  # noqa: E402
import bench_shapes  # noqa: E402
import bench_simulator  # noqa: E402

from mpmd.files import write_atomic  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the Markdown here (e.g. reports/benchmarks.md)")
    args = ap.parse_args(argv)
    head = (f"# Benchmarks\n\nMade by `python benchmarks/run.py --out reports/benchmarks.md` on "
            f"{date.today()}, "
            f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}.\n")
    parts = [head, "## Simulator\n", bench_simulator.markdown(), "## Planner\n",
             bench_planner.markdown(), "## Planner at scale (node groups, 64 to 16,384 devices)\n",
             bench_shapes.markdown(),
             "## GPT-3 175B on 1,024 A100: the planner against Megatron-LM, with exposed communication\n",
             bench_a100_175b.markdown(),
             "## Published layouts as fixtures: the planner against the layouts experts ran\n",
             bench_fixtures.markdown(),
             "## A peer planner's case: Sailor's 320 GPUs of two kinds, for time and for cost\n",
             bench_peer.markdown()]
    text = "\n".join(parts)
    print(text)
    if args.out:
        write_atomic(Path(args.out), text)


if __name__ == "__main__":
    main()
