"""README's planner figures are the benchmark's: each figure README quotes for a case must be the
one ``reports/benchmarks.md`` records for it (``python benchmarks/run.py --out
reports/benchmarks.md`` writes that file), so the two cannot drift apart unnoticed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
BENCH = (ROOT / "reports" / "benchmarks.md").read_text()


def rows(text: str) -> list[dict[str, str]]:
    """Every row of every Markdown table in ``text``, as header -> cell."""
    out, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-: "):
            out.append(dict(zip(header, cells)))
    return out


def row(**match: str) -> dict[str, str]:
    got = [r for r in rows(BENCH) if all(r.get(k) == v for k, v in match.items())]
    assert len(got) == 1, f"reports/benchmarks.md has {len(got)} rows matching {match}"
    return got[0]


def readme_paragraph(start: str) -> str:
    i = README.index(start)
    return README[i:README.index("\n\n", i)].replace("\n", " ")


H100_128 = readme_paragraph("Measured 2026-11-29 on this project's 2-core machine, the test suite")
H100_16K = readme_paragraph("On this project's 2-core machine (2026-11-29, the test suite beside it; 15.5 s idle")
FIXTURES = readme_paragraph("Published layouts as fixtures:")
PEER = readme_paragraph("On this project's 2-core machine, busy (the test suite beside it, 2026-11-29), the first uses both kinds")
MOE = readme_paragraph("On this project's 2-core machine (2026-11-29), DeepSeek-V3")


@pytest.mark.parametrize("text,match,cells", [
    (H100_128, {"model": "llama3-70b", "H100": "128"},
     {"step (s)": "at {} s per step", "MFU": "(MFU {})", "gap": "proven gap of {}",
      "grid step (s)": "grid's best point (tensor parallel 8, pipeline 2 with 4 virtual stages, micro-batch 1) at {} s",
      "hand step (s)": "hand configuration replays at {} s"}),
    (H100_16K, {"model": "llama3-70b", "H100": "16384"},
     {"step (s)": "at {} s per step", "MFU": "s per step, {} MFU", "gap": "proven gap of {}"}),
    (H100_128, {"cluster": "mixed512_nodes"},
     {"step (s)": "TPU v5e at {} s", "gap": "proven gap {} against the bounds", "wall (s)": "({} s in all)",
      "H100 alone (s)":
      "(the H100 alone: {} s)"}),
    (FIXTURES, {"run": "narayanan", "model": "1008B"},
     {"plan (s)": "3,072 A100 at {} s", "layout in model (s)": "published layout's {} s"}),
    (FIXTURES, {"run": "llama3-405b", "model": "llama3-405B"},
     {"plan (s)": "Llama 3 405B ({} s", "layout in model (s)": "against {} s) and",
      "layout peak memory (GB)": "(peak GB: {} and"}),
    (FIXTURES, {"run": "dgxc-h100", "model": "llama3.1-70B"},
     {"plan (s)": "70B ({} s", "layout in model (s)": "against {} s). In", "layout peak memory (GB)": "and {}), though"}),
    (PEER, {"plan": "mpmd plan (every schedule)"},
     {"step (s)": "at {} s per step", "USD per step": "USD {} per step; Sailor"}),
    (PEER, {"plan": "Sailor's plan (7 stages, V100 tp4 around A100 tp1, dp20, 1f1b), replayed"},
     {"step (s)": "replays at {} s in the same"}),
    (PEER, {"plan": "mpmd plan --schedule 1f1b"}, {"step (s)": "between the kinds at {} s"}),
    (MOE, {"model": "DeepSeek-V3", "cluster": "h100x2048_nodes", "what": "plan, --time-limit 30"},
     {"step (s)": "zero-bubble H2) at {} s per step", "MFU": "per step ({} MFU"}),
    (MOE, {"model": "DeepSeek-V3", "cluster": "h100x2048_nodes", "what": "plan, --time-limit 120"},
     {"step (s)": "at {} s per step", "MFU": "({} MFU", "tokens/s/GPU": "{} tokens/s per GPU"}),
    (MOE, {"model": "DeepSeek-V3", "cluster": "h100x2048_nodes",
           "what": "DeepSeek's layout, dualpipe-v"}, {"step (s)": "replays at {} s"}),
    (MOE, {"model": "DeepSeek-V3", "cluster": "h100x2048_nodes",
           "what": "DeepSeek's layout, dualpipe-v, full recompute"},
     {"step (s)": "and {} s with full recomputation"}),
    (MOE, {"model": "DeepSeek-V3", "cluster": "h100x2048_nodes",
           "what": "DeepSeek's layout, 1f1b, full recompute"},
     {"step (s)": "all-to-alls exposed: {} s"}),
    (MOE, {"model": "DeepSeek-V3", "cluster": "h800x2048_nodes", "what": "plan, --time-limit 30"},
     {"step (s)": "dispatched in two hops (DualPipeV): {} s per step", "MFU": "per step, {} MFU"}),
    (MOE, {"model": "Mixtral-8x22B-v0.1"},
     {"step (s)": "DualPipeV, {} s per step", "MFU": "per step, {} MFU"}),
    (PEER, {"plan": "mpmd plan --objective cost --min-throughput 2000000"},
     {"step (s)": "80 A100 only: {} s per step", "tokens/s": "({} tokens/s)", "USD per step": "USD {} per step, "}),
])
def test_readme_quotes_the_recorded_benchmark(text, match, cells):
    r = row(**match)
    for column, phrase in cells.items():
        assert phrase.format(r[column]) in text, (column, r[column], phrase)


def test_readme_says_how_much_cheaper_the_cost_plan_is():
    first = float(row(plan="mpmd plan (every schedule)")["USD per step"])
    cheap = float(row(plan="mpmd plan --objective cost --min-throughput 2000000")["USD per step"])
    assert f"USD {cheap:.4f} per step, {round(100 * (1 - cheap / first))}% cheaper" in PEER


def test_the_row_parser_reads_tables_exactly():
    got = rows("x\n| a | b |\n|---|---:|\n| 1 | 2 |\n| 3 | 4 |\n\n| c |\n|---|\n| 5 |\n")
    assert got == [{"a": "1", "b": "2"}, {"a": "3", "b": "4"}, {"c": "5"}]
