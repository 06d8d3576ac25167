"""benchmarks/bench_residual_forward.py at 3 calls per figure: the table has the dense block and the
MoE block under data and expert parallelism, each ratio is its two forwards' quotient and the
residual column is what ``zoo.costing`` says each block keeps (no timing is asserted)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_has_each_block_and_layout_with_consistent_figures():
    spec = importlib.util.spec_from_file_location(
        "bench_residual_forward", ROOT / "benchmarks" / "bench_residual_forward.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    text = bench.markdown(samples=2, repeats=3)
    body = [[c.strip() for c in line.split("|")[1:-1]] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| block ")]
    assert [(r[0], r[1]) for r in body] == [("dense", "dp2xtp1"), ("moe", "dp2xtp1"),
                                            ("moe", "dp2xtp1-ep2")]
    for r in body:
        plain, keep, ratio = float(r[2]), float(r[3]), float(r[4])
        assert plain > 0 and keep > 0 and abs(ratio - round(keep / plain, 2)) <= 0.011
    assert [r[6] for r in body] == ["460", "925", "925"]
