"""Run every benchmark, print the Markdown table and, with ``--out``, write it.

Usage:
    python benchmarks/run.py --out reports/benchmarks.md
    python benchmarks/run.py --only cli --out reports/benchmarks.md   # one section, in place
"""

from __future__ import annotations

import os
import platform
import sys
from datetime import date
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import bench_a100_175b  # noqa: E402
import bench_cli  # noqa: E402
import bench_compiler_optimizer  # noqa: E402
import bench_context  # noqa: E402
import bench_fixtures  # noqa: E402
import bench_moe  # noqa: E402
import bench_peer  # noqa: E402
import bench_planner  # noqa: E402
import bench_precision  # noqa: E402
import bench_residual_forward  # noqa: E402
import bench_run_check  # noqa: E402
import bench_shapes  # noqa: E402
import bench_simulator  # noqa: E402
import bench_sweep  # noqa: E402

from ir.files import write_atomic  # noqa: E402


SECTIONS = {
    "simulator": ("## Simulator\n", bench_simulator.markdown),
    "planner": ("## Planner\n", bench_planner.markdown),
    "shapes": ("## Planner at scale (node groups, 64 to 16,384 devices)\n", bench_shapes.markdown),
    "a100": ("## GPT-3 175B on 1,024 A100: the planner against Megatron-LM, with exposed "
             "communication\n", bench_a100_175b.markdown),
    "fixtures": ("## Published layouts as fixtures: the planner against the layouts experts ran\n",
                 bench_fixtures.markdown),
    "moe": ("## Mixtures of experts: Mixtral, Qwen3-MoE and DeepSeek-V3, and DeepSeek's own layout\n",
            bench_moe.markdown),
    "precision": ("## NVIDIA's published tables in their recipes (BF16, FP8, MXFP8): published, "
                  "replayed and planned\n", bench_precision.markdown),
    "moe-precision": ("## NVIDIA's published mixture-of-experts runs in their recipes: published, "
                      "replayed and planned\n", bench_precision.moe_markdown),
    "context": ("## Long sequences: context parallelism searched and off\n", bench_context.markdown),
    "peer": ("## A peer planner's case: Sailor's 320 GPUs of two kinds, for time and for cost\n",
             bench_peer.markdown),
    "sweep": ("## A random sweep: 500 plans checked for valid layouts, prediction = replay and "
              "exports\n", bench_sweep.markdown),
    "run": ("## CPU runs against the simulation, after `mpmd calibrate`\n",
            bench_run_check.markdown),
    "compiler": ("## Compiled training steps with their optimizer: executables, lowering and step "
                 "time against jax.jit\n", bench_compiler_optimizer.markdown),
    "residual": ("## XLA:CPU: the training forward against the plain forward\n",
                 bench_residual_forward.markdown),
    "cli": ("## CLI: bad input refused before the heavy imports\n", bench_cli.markdown),
}
"""Section key -> (heading, the benchmark's Markdown)."""


def _machine() -> str:
    return (f"{date.today()}, {platform.machine()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}")


def _replace_section(text: str, heading: str, body: str) -> str:
    """``text`` with the section under ``heading`` (up to the next ``## ``) replaced by ``body``,
    or ``body`` appended when the heading is absent."""
    new = heading + "\n" + body
    if heading not in text:
        return text.rstrip("\n") + "\n\n" + new
    start = text.index(heading)
    nxt = text.find("\n## ", start + len(heading))
    return text[:start] + new + ("" if nxt < 0 else "\n" + text[nxt + 1:])


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="write the Markdown here (e.g. reports/benchmarks.md)")
    ap.add_argument("--only", choices=sorted(SECTIONS), default=None,
                    help="run one section and replace it in --out (the other sections kept)")
    args = ap.parse_args(argv)
    if args.only:
        heading, fn = SECTIONS[args.only]
        body = f"Section re-measured by `python benchmarks/run.py --only {args.only}` on {_machine()}.\n\n" + fn()
        print(heading + "\n" + body)
        if args.out:
            old = Path(args.out).read_text() if Path(args.out).exists() else ""
            write_atomic(Path(args.out), _replace_section(old, heading, body))
        return
    head = (f"# Benchmarks\n\nMade by `python benchmarks/run.py --out reports/benchmarks.md` on "
            f"{_machine()}.\n")
    parts = [head]
    for heading, fn in SECTIONS.values():
        parts += [heading, fn()]
    text = "\n".join(parts)
    print(text)
    if args.out:
        write_atomic(Path(args.out), text)


if __name__ == "__main__":
    main()
