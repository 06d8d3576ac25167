"""reports.pricing and reports.sweep: price precedence, parsing, budget enumeration, copied links."""

import pandas as pd
import pytest

from hardware_profiles import load_cluster
from reports import ReportError, generate_sweep, pareto_front, parse_sweep
from reports.pricing import cluster_price, parse_price, parse_prices


@pytest.mark.parametrize("text, want", [("h100-sxm=2:3", ("h100-sxm", 2.0, 3.0)),
                                        ("tpu-v5e=1.5", ("tpu-v5e", 1.5, 1.5))])
def test_parse_price(text, want):
    assert parse_price(text) == want


@pytest.mark.parametrize("text", ["h100-sxm", "=2:3", "h100-sxm=x:3", "h100-sxm=3:2", "h100-sxm=-1"])
def test_parse_price_rejects(text):
    with pytest.raises(ReportError):
        parse_price(text)


def test_price_precedence(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("name: c\nmeshes:\n- {name: a, device: h100-sxm, num_devices: 8, price_usd_per_device_hour: 2.0}\n"
                 "- {name: b, device: h100-sxm, num_devices: 8}\ndefault_link: {bandwidth_gbit_per_s: 400, latency_us: 5}\n")
    c = load_cluster(f)
    lo, hi, entries = cluster_price(c, {})
    assert (lo, hi) == pytest.approx((8 * 2.0 + 8 * 2.7, 8 * 2.0 + 8 * 4.9))
    assert "price_usd_per_device_hour" in entries[0].source
    lo, hi, entries = cluster_price(c, parse_prices(["h100-sxm=1:1.5"]))
    assert (lo, hi) == pytest.approx((16.0, 24.0))
    assert entries[0].source == entries[1].source == "command line --price override"


SPEC = {"budget_usd_per_hour": 30, "max_device_types": 2,
        "devices": {"h100-sxm": {"unit": 8, "units": [0, 1, 2], "axes": {"data": 8}},
                    "blackhole-p150b": {"unit": 8, "units": [0, 2], "axes": {"x": 2, "y": 4}}}}


def test_sweep_keeps_clusters_within_budget_at_low_price():
    r = generate_sweep(parse_sweep(SPEC))
    # H100 node 8 x 2.7 = 21.6 $/h, LoudBox 8 x 0.0494 = 0.3952 $/h
    assert [c.label for c in r.kept] == ["8 h100-sxm + 16 blackhole-p150b", "8 h100-sxm", "16 blackhole-p150b"]
    assert [round(c.usd_per_hour_low, 4) for c in r.kept] == [22.3904, 21.6, 0.7904]
    assert r.over_budget == 2 and r.too_many_types == 0 and r.cut_by_max_options == 0


def test_sweep_links_copied_from_bundled_clusters():
    c = generate_sweep(parse_sweep(SPEC)).kept[0].cluster
    assert list(c.meshes) == ["h100_00", "p150b_00", "p150b_01"]
    assert c.link_between("p150b_00", "p150b_01").link.bandwidth == pytest.approx(1600e9 / 8)
    assert c.link_between("h100_00", "p150b_00").link.bandwidth == pytest.approx(400e9 / 8)
    assert "h100x32_p150bx128" in c.link_between("h100_00", "p150b_01").link.source
    assert c.meshes["p150b_00"].axes == {"x": 2, "y": 4}


def test_sweep_rejects_bad_specs():
    with pytest.raises(ReportError, match="unknown keys"):
        parse_sweep({**SPEC, "budget": 3})
    with pytest.raises(ReportError, match="no cluster of the sweep fits"):
        generate_sweep(parse_sweep({**SPEC, "budget_usd_per_hour": 0.1}))
    with pytest.raises(ReportError, match="unknown device"):
        parse_sweep({**SPEC, "devices": {"h999": {"unit": 8, "units": [1]}}})


def test_pareto_front_exact():
    df = pd.DataFrame({"option": list("abcde"), "feasible": [True, True, True, True, False],
                       "usd_per_hour_low": [1.0, 2.0, 2.0, 5.0, 0.5],
                       "tokens_per_s": [10.0, 30.0, 20.0, 25.0, float("nan")]})
    df.attrs["kind"] = "training"
    assert pareto_front(df) == ["a", "b"]
