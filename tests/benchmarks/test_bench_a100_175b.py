"""benchmarks/bench_a100_175b.py at a short time limit: its Markdown table has the planner's row
and Megatron-LM's, the fixture's layout is exactly TP8 x PP8 x DP16 interleaved, and every figure
(step, MFU, exposed communication, memory) is there."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_a100_175b",
                                                  ROOT / "benchmarks" / "bench_a100_175b.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_table_has_both_rows_and_the_fixture_is_tp8_pp8_dp16_interleaved():
    bench = _bench()
    text = bench.markdown(time_limit=3.0)
    rows = [line.split("|")[1:-1] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| plan ")]
    rows = {r[0].strip(): [x.strip() for x in r[1:]] for r in rows}
    assert set(rows) == {"planner", bench.MEGATRON_LABEL}
    # stages (ranks), TP, DP, FSDP, schedule, microbatches, recompute
    assert rows[bench.MEGATRON_LABEL][:7] == ["16 (8)", "8", "16", "no", "interleaved-1f1b (v=2)", "96",
                                              "full"]
    for r in rows.values():
        step, mfu, exposed, frac, mem = r[7:]
        assert float(step) > 0 and 0 < float(mfu.rstrip("%")) < 100
        assert float(exposed) >= 0 and 0 <= float(frac.rstrip("%")) < 100
        assert re.fullmatch(r"\d+\.\d / 86", mem)     # an A100 80GB exposes 81,920 MiB
    assert "31.5 s per step" in text and "140 TFLOP/s per GPU" in text


def test_the_published_step_is_eq_3_over_n_x():
    """96 B s l h^2 (1 + s/6h + V/16lh) / (1024 x 140e12) for GPT-3 175B at batch 1536."""
    assert _bench().published_step_s() == pytest.approx(31.466, rel=1e-3)
