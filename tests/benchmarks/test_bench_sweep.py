"""benchmarks/bench_sweep.py on a few fixed cases: each is planned, its layout valid, its
prediction its replay, its exports written or refused in one line; a case the checks must flag
is flagged (a hand-broken plan file)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from click.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_sweep", ROOT / "benchmarks" / "bench_sweep.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_draw_is_reproducible_and_in_range():
    b = _bench()
    cases = b.draw(50, 3)
    assert cases == b.draw(50, 3) and cases != b.draw(50, 4)
    for model, cluster, batch, seq in cases:
        assert model in b.MODELS and cluster in b.CLUSTERS
        assert batch in b.BATCHES and seq in b.SEQS
        assert (ROOT / "hardware_profiles" / "clusters" / f"{cluster}.yaml").exists()


def test_cases_pass_every_check_and_a_broken_plan_is_flagged(tmp_path):
    b = _bench()
    runner = CliRunner()
    for model, cluster, batch, seq in (("gpt2", "h100x64_nodes", 64, 1024),
                                       ("qwen3-30b-a3b", "gb200x72_nodes", 8, 4096)):
        r = b.run_case(runner, tmp_path, model, cluster, batch, seq, time_limit=1.0)
        assert r["status"] == "planned", r["why"]
        assert set(r["exports"]) == set(b.EXPORT_TARGETS)
        assert set(r["exports"].values()) <= {"written", "refused"}
    # the last case's plan file edited by hand: a prediction 10% off its replay, an MFU above 1
    path = tmp_path / "plan.json"
    assert b.check_plan(path, "qwen3-30b-a3b") == []
    doc = json.loads(path.read_text())
    doc["predicted"]["step_time_s"] *= 1.1
    doc["predicted"]["mfu"] = 1.5
    path.write_text(json.dumps(doc))
    bad = b.check_plan(path, "qwen3-30b-a3b")
    assert len(bad) == 2 and bad[0].startswith("predicted ") and bad[0].endswith("(+10.0%)"), bad
    assert bad[1] == "MFU 1.500 outside (0, 1]"
