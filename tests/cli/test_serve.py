"""``mpmd serve-plan``, ``mpmd validate --serving`` and ``mpmd validate --layers`` on serving-step
timings: what they print and write, and their one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from mpmd.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
MIXED = ROOT / "hardware_profiles" / "clusters" / "serve_h100x8_p150bx8_nodes.yaml"
SERVING_CSV = ROOT / "reports" / "validation" / "published_serving.csv"
H200_STEPS = ROOT / "reports" / "validation" / "device" / "h200_serving.csv"


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_serve_plan_writes_every_family_and_the_trace(tmp_path):
    out, trace = tmp_path / "plans.json", tmp_path / "trace.json"
    r = run("serve-plan", "--model", "llama3-8b", "--cluster", str(MIXED), "--prompt", "512",
            "--output", "64", "--ttft", "1", "--tpot", "0.05", "--requests", "60",
            "--out", str(out), "--trace", str(trace))
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    families = [p["family"] for p in doc["plans"]]
    # one kind alone (each), both colocated, and both prefill/decode pairings
    assert sorted(families) == sorted([
        "colocated h100-sxm", "colocated blackhole-p150b", "colocated, every kind",
        "disaggregated h100-sxm -> blackhole-p150b", "disaggregated blackhole-p150b -> h100-sxm"])
    best = doc["plans"][0]
    assert best["rate_per_s"] > 0 and best["ttft_s"] <= 1 and best["tpot_s"] <= 0.05
    assert best["checked"] is True and best["pools"]
    cost = [p["usd_per_m_tokens"] for p in doc["plans"] if p["usd_per_m_tokens"] is not None]
    assert cost == sorted(cost)                      # ranked by $ per million tokens
    assert f"plan: {best['family']}" in r.output
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)


def test_serve_plan_refuses_a_precision_for_a_kind_the_cluster_lacks():
    r = CliRunner().invoke(main, ["serve-plan", "--model", "llama3-8b", "--cluster", str(MIXED),
                                  "--prompt", "128", "--output", "16",
                                  "--precision", "tpu-v5e:int8"])
    assert r.exit_code == 2
    line = r.output.strip().splitlines()[-1]
    assert "tpu-v5e" in line and "h100-sxm" in line and "blackhole-p150b" in line


def test_serve_plan_says_what_no_deployment_meets():
    r = CliRunner().invoke(main, ["serve-plan", "--model", "llama3-70b", "--cluster", str(MIXED),
                                  "--prompt", "2048", "--output", "64", "--tpot", "0.001"])
    assert r.exit_code == 2
    assert "no deployment meets" in r.output and "fix:" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_validate_serving_scores_every_bundled_row(tmp_path):
    out = tmp_path / "serving.md"
    r = run("validate", "--serving", "--out", str(out))
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "**195 of 195 rows scored**" in text
    for kind in ("wormhole-n150", "wormhole-n300", "blackhole-p150a", "h100-sxm", "h200-sxm"):
        assert f"| {kind} |" in text


def test_validate_serving_refuses_a_bad_csv_in_one_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text(SERVING_CSV.read_text().splitlines()[0].replace(",engine", "") + "\n")
    r = CliRunner().invoke(main, ["validate", "--serving", "--csv", str(bad)])
    assert r.exit_code == 2
    assert "lacks column(s) engine" in r.output and len(r.output.strip().splitlines()) == 1


def test_profiles_out_needs_fit_with_serving():
    r = CliRunner().invoke(main, ["validate", "--serving", "--profiles-out", "x"])
    assert r.exit_code == 2 and "--profiles-out needs --fit" in r.output


def test_validate_layers_reads_serving_step_timings():
    r = run("validate", "--layers", str(H200_STEPS))
    assert r.exit_code == 0, r.output
    assert "against the serving cost model on profile `h200-sxm`" in r.output
    assert "| decode | 13 |" in r.output and "| prefill | 4 |" in r.output
    assert "| llama3-70b tp8 decode b128 ctx2048 |" in r.output
