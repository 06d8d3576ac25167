"""reports.uncertainty: a prior (never calibrated) profile widens a plan's best/worst range by
re-predicting it with that device's matmul efficiency +/-20%; a calibrated profile does not. And
the what-if report says which profiles are priors (Markdown, HTML, CSV)."""

from dataclasses import replace

import pandas as pd
import pytest

from ir import Layout, Plan, StagePlan
from planner.predict import predict
from reports.uncertainty import PRIOR_FIELD, alternatives_outcomes, prior_alternatives
from simulator.schedules import generate
from tests.planner.conftest import cluster, device, workload

FITTED = "fitted by `mpmd validate --fit` over the 6 toy rows of the published-training CSV: MAPE 4.1%"


def _plan() -> Plan:
    """The 14-layer toy workload in two stages on meshes a and b (2 devices each, data parallel)."""
    return Plan(model="toy", cluster="toy", stages=(StagePlan(0, 0, 7, "a"), StagePlan(1, 7, 14, "b")),
                layouts={"a": Layout(2, 1), "b": Layout(2, 1)}, schedule=generate("1f1b", 2, 4),
                rank_mesh=("a", "b"), merge_last_stage=False, global_batch=32, seq_len=1024,
                devices={"a": ("toy", 2), "b": ("toy", 2)}, recompute={"a": False, "b": False})


def _range(profile) -> tuple[float, float, list]:
    """(best, worst) step time, s, over the plan's own prediction and its re-predictions on
    meshes a and b of ``profile``, and the re-predictions."""
    c = cluster([("a", profile, 2), ("b", profile, 2)])
    base = predict(_plan(), workload(), c, headroom=0.1).step_time_s
    outcomes = alternatives_outcomes(_plan(), workload(), c)
    assert all(o.base_step_time_s == base for o in outcomes)
    steps = [base] + [o.step_time_s for o in outcomes if o.fits]
    return min(steps), max(steps), outcomes


def test_prior_profile_range_is_strictly_wider_than_calibrated():
    prior = device("toy", 400.0, 80.0)                       # no origin: a prior
    calibrated = replace(prior, sources={**prior.sources, "matmul_efficiency": FITTED})
    best, worst, outcomes = _range(prior)
    assert [(o.device, o.field, o.value, o.source) for o in outcomes] == [
        ("toy", "matmul_efficiency (prior, +/-20%)", 0.4, "never fitted: 0.5 x 0.8"),
        ("toy", "matmul_efficiency (prior, +/-20%)", 0.6, "never fitted: 0.5 x 1.2")]
    assert all(o.fits for o in outcomes)
    assert (best, worst) == (outcomes[1].step_time_s, outcomes[0].step_time_s)
    cal_best, cal_worst, cal_outcomes = _range(calibrated)
    assert cal_outcomes == [] and cal_best == cal_worst    # calibrated: no widening
    assert best < cal_best and worst > cal_worst           # the prior's range strictly contains it
    assert outcomes[0].describe().startswith(
        "toy matmul efficiency (prior, +/-20%) = 0.4 (never fitted: 0.5 x 0.8): step time +")


def test_prior_widening_caps_at_one_and_skips_calibrated():
    fast = replace(device("toy", 400.0, 80.0), matmul_efficiency=0.9)
    alts = prior_alternatives(fast)
    assert [(a.field, a.value, a.source) for a in alts] == [
        ("matmul_efficiency", pytest.approx(0.72), "never fitted: 0.9 x 0.8"),
        ("matmul_efficiency", 1.0, "never fitted: 0.9 x 1.2, capped at 1")]
    assert [a.value for a in prior_alternatives(replace(fast, matmul_efficiency=1.0))] == [0.8]
    assert prior_alternatives(replace(fast, sources={"matmul_efficiency": FITTED})) == []
    assert PRIOR_FIELD == "matmul_efficiency (prior, +/-20%)"


def test_report_says_which_profiles_are_priors(small_df, small_report):
    """The shared run's devices (H100 and p150b) per option in the CSV, and a table of every
    device kind's status in the Markdown and HTML; prior outcomes listed with the alternatives."""
    status = {p["device"]: p["status"] for p in small_df.attrs["profiles"]}
    assert set(status) == {"blackhole-p150b", "h100-sxm"}
    csv = pd.read_csv(small_report["csv"]).set_index("option")
    want = {"loudbox_p150bx8": f"blackhole-p150b {status['blackhole-p150b']}",
            "h100x1": f"h100-sxm {status['h100-sxm']}"}
    for option, text in want.items():
        assert csv.loc[option, "profiles"] == text
    md = small_report["md"].read_text()
    html = small_report["html"].read_text()
    assert "## Device profiles: calibrated or prior" in md
    assert "<h2>Device profiles: calibrated or prior</h2>" in html
    # p150b is fitted on tt-metal's serving rows (mpmd validate --serving --fit): no prior band
    assert "| blackhole-p150b | calibrated | fitted by `mpmd validate --serving --fit`" in md
    assert status["blackhole-p150b"] == "calibrated"
    r = small_df.set_index("option").loc["loudbox_p150bx8"]
    assert "(prior, +/-20%)" not in str(r["alternatives"])
    assert "matmul efficiency +/-20%" in md                 # the context sentence
