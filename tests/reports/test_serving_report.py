"""The serving what-if (``reports/serving.py``): one row per option, its cheapest deployment within the
objectives, the recommendation, the three files, and one-line refusals of a bad ``serving:``."""

from __future__ import annotations

import math

import pytest

from reports.errors import ReportError
from reports.serving import COLUMNS, serving_whatif, to_markdown, write_serving_report

SERVING = {"prompt": 512, "output": 64, "ttft_s": 1.0, "tpot_s": 0.1, "requests": 60,
           "precision": {"default": "bf16", "blackhole-p150b": "bfp8,gate_up=bfp4"}}
OPTIONS = [{"cluster": "serve_h100x8_p150bx8_nodes", "label": "DGX + LoudBox"},
           {"cluster": "serve_p150bx16_nodes", "label": "2 LoudBox"}]


@pytest.fixture(scope="module")
def df():
    return serving_whatif("llama3-8b", SERVING, OPTIONS, title="serve 8B")


def test_one_row_per_option_meeting_the_objectives(df):
    assert list(df.columns) == list(COLUMNS)
    assert list(df["option"]) == ["DGX + LoudBox", "2 LoudBox"]
    for _, r in df.iterrows():
        assert r["TTFT"] <= 1.0 and r["TPOT"] <= 0.1
        assert math.isclose(r["tokens/s/user"], 1 / r["TPOT"])
        assert math.isclose(r["tokens/s"], r["req/s"] * 64)
    # the mixed option's every family is listed, the p150b ones in their precision
    fams = [f["family"] for f in df.attrs["families"] if f["option"] == "DGX + LoudBox"]
    assert "disaggregated blackhole-p150b -> h100-sxm" in fams and "colocated h100-sxm" in fams
    assert "bfp8,gate_up=bfp4" in df.loc[1, "plan"]


def test_recommendation_is_the_cheapest_option(df):
    best = df.loc[df["$/M tokens"].idxmin()]
    assert df.attrs["recommendation"].startswith(f"{best['option']}: ${best['$/M tokens']:.3f}")
    assert df.attrs["objectives"] == "prompt 512 and output 64 tokens; p99 TTFT <= 1 s, p99 TPOT <= 100 ms"


def test_report_files(df, tmp_path):
    paths = write_serving_report(df, tmp_path / "serve")
    assert sorted(p.name for p in paths.values()) == ["serve.csv", "serve.html", "serve.md"]
    html = paths["html"].read_text()
    assert "<img class='plot'" in html and "data:image/png;base64," in html and "http" not in html
    md = paths["md"].read_text()
    assert md == to_markdown(df) and "| 2 LoudBox |" in md
    with pytest.raises(ReportError, match="is a directory"):
        write_serving_report(df, tmp_path)


@pytest.mark.parametrize("serving, says", [
    ({"prompt": 512}, "'output' is required"),
    ({"prompt": 512, "output": 64, "latency": 1}, "unknown keys ['latency']"),
    ({"prompt": 512, "output": 64, "tpot_s": -1}, "fix"),
])
def test_bad_serving_section(serving, says):
    with pytest.raises(ReportError, match=None) as e:
        serving_whatif("llama3-8b", serving, OPTIONS[:1])
    assert says in str(e.value) and "\n" not in str(e.value)
