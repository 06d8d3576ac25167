"""reports.whatif: every row's rates and costs follow from its plan, the simulator and the prices."""

import math

import pytest

from zoo.costing import workload
from hardware_profiles import load_cluster, load_device
from reports import ReportError, whatif
from simulator.plan_sim import plan_cluster, simulate_plan


def _price(cluster_name: str, which: int) -> float:
    """USD/hour straight from the device profiles (every mesh of the cluster, used or idle)."""
    c = load_cluster(cluster_name)
    return sum(load_device(m.device.name).price_per_hour[which] * m.num_devices
               for m in c.meshes.values())


def test_one_row_per_option_in_order(small_df, small_spec):
    assert list(small_df["option"]) == list(small_spec[0])
    assert list(small_df["feasible"]) == [True, True, False]


def test_rates_and_costs_recomputed_from_plan_and_prices(small_df, small_spec):
    SMALL = small_spec[1]
    w = workload("llama3-8b", global_batch=SMALL["global_batch"], seq_len=SMALL["seq_len"])
    for r in small_df[small_df["feasible"]].to_dict("records"):
        plan = r["plan"]
        # on the meshes the plan was planned for (a listing's carving when it was read as node groups)
        step = simulate_plan(plan, w, plan_cluster(plan, load_cluster(r["cluster"]))).step_time_s
        assert r["step_time_s"] == pytest.approx(step, rel=1e-12)
        tps = plan.global_batch * plan.seq_len / step
        lo, hi = _price(r["cluster"], 0), _price(r["cluster"], 1)
        assert r["usd_per_hour_low"] == pytest.approx(lo, rel=1e-12)
        assert r["usd_per_hour_high"] == pytest.approx(hi, rel=1e-12)
        assert r["tokens_per_s"] == pytest.approx(tps, rel=1e-12)
        assert r["usd_per_mtok_low"] == pytest.approx(lo / (tps * 3600) * 1e6, rel=1e-12)
        assert r["usd_per_mtok_high"] == pytest.approx(hi / (tps * 3600) * 1e6, rel=1e-12)
        days = SMALL["tokens"] / tps / 86400
        assert r["time_to_train_days"] == pytest.approx(days, rel=1e-12)
        assert r["cost_to_train_usd_low"] == pytest.approx(lo * days * 24, rel=1e-12)
        watts = sum(m.num_devices * m.device.tdp_watts for m in load_cluster(r["cluster"]).meshes.values())
        assert r["energy_kwh"] == pytest.approx(watts * days * 24 / 1e3, rel=1e-12)
        assert r["meets_deadline"] == (days <= SMALL["deadline_days"])
        # ranges bracket the nominal figures
        assert r["tokens_per_s_worst"] <= r["tokens_per_s"] <= r["tokens_per_s_best"]
        assert r["usd_per_mtok_best"] <= r["usd_per_mtok_low"] <= r["usd_per_mtok_high"] <= r["usd_per_mtok_worst"]


def test_p150b_alternative_figures_move_the_range(small_df):
    """The p150b profile's pre-binning 387 TFLOP/s speeds it up; its 16 GB figure breaks the fit."""
    r = small_df.set_index("option").loc["loudbox_p150bx8"]
    assert r["tokens_per_s_best"] > r["tokens_per_s"] * 1.05
    assert not r["alternatives_fit"]
    assert "memory bytes = 16 GB" in r["alternatives"] and "no longer fits" in r["alternatives"]


def test_infeasible_option_keeps_the_planners_reason(small_df):
    r = small_df.set_index("option").loc["h100x1"]
    assert not r["feasible"] and r["plan"] is None and r["sim"] is None
    assert r["reason"].startswith("model 'llama3-8b' does not fit cluster 'h100x1': mesh 'h100_0' lacks")
    assert "\n" not in r["reason"]
    assert r["usd_per_hour_low"] == pytest.approx(2.7)
    assert math.isnan(r["tokens_per_s"])


def test_recommendation_names_cheapest_option_meeting_deadline(small_df):
    ok = small_df[small_df["feasible"] & small_df["meets_deadline"].fillna(False).astype(bool)]
    cheapest = ok.sort_values("cost_to_train_usd_low").iloc[0]["option"]
    rec = small_df.attrs["recommendation"]
    assert rec.startswith(f"Cheapest option that meets the 20-day deadline: {cheapest} ")
    assert "h100x1 (model 'llama3-8b' does not fit" in rec


def test_attrs_list_every_price_with_source(small_df):
    figs = small_df.attrs["figures"]
    prices = {f["device"]: f for f in figs if f["figure"] == "price per device-hour"}
    assert set(prices) == {"blackhole-p150b", "h100-sxm"}
    assert prices["h100-sxm"]["value"] == "$2.7 - $4.9"
    assert all(f["source"] for f in figs)
    assert {f["figure"] for f in figs if f["device"] == "h100-sxm"} >= {
        "matmul efficiency", "memory-bandwidth efficiency", "power per device", "price per device-hour"}


def test_price_override_and_no_options():
    with pytest.raises(ReportError, match="no options"):
        whatif("llama3-8b", [])
    with pytest.raises(ReportError, match="DEVICE=LOW:HIGH"):
        whatif("llama3-8b", ["h100x1"], prices=["h100-sxm"])


def test_mochi_videos_per_hour_and_fleet():
    df = whatif("mochi-dit-10b", ["h100x1"], videos_per_hour=25, time_limit_s=2,
                prices={"h100-sxm": (2.0, 3.0)})
    r = df.iloc[0]
    assert df.attrs["kind"] == "inference" and df.attrs["samples_per_video"] == 128
    assert r["videos_per_hour"] == pytest.approx(r["samples_per_s"] * 3600 / (64 * 2), rel=1e-12)
    assert r["usd_per_hour_low"] == 2.0 and r["usd_per_hour_high"] == 3.0
    assert r["usd_per_video_low"] == pytest.approx(2.0 / r["videos_per_hour"], rel=1e-12)
    assert r["replicas"] == math.ceil(25 / r["videos_per_hour"])
    assert r["fleet_usd_per_hour_high"] == pytest.approx(3.0 * r["replicas"])
    assert df.attrs["figures"][0]["source"] == "command line --price override"


def test_every_option_plans_in_the_named_precision_or_says_why_not():
    """``precision``: each option plans in that recipe (the row's ``precision``, the attrs'), so
    H100s plan FP8 and their step beats the BF16 one; A100s, which run no FP8 GEMMs, are
    infeasible with the one-line reason."""
    kw = dict(global_batch=64, seq_len=2048, time_limit_s=30.0)
    fp8 = whatif("llama3-8b", ["h100x64", "a100x32_gcp_nodes"], precision="fp8", **kw)
    bf16 = whatif("llama3-8b", ["h100x64"], **kw)
    h100, a100 = fp8.to_dict("records")
    assert fp8.attrs["precision"] == "fp8" and bf16.attrs["precision"] == "bf16"
    assert h100["feasible"] and h100["precision"] == "fp8" and h100["plan"].precision == "fp8"
    assert bf16.iloc[0]["precision"] == "bf16"
    assert h100["step_time_s"] < bf16.iloc[0]["step_time_s"]
    assert not a100["feasible"] and a100["reason"].startswith(
        "--precision fp8: a100-40gb-sxm do not run fp8 GEMMs")
