"""reports.render: the HTML stands alone; CSV and Markdown carry the same options."""

import base64
import re

import pandas as pd
from click.testing import CliRunner


def test_html_is_self_contained(small_report):
    text = small_report["html"].read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.IGNORECASE)
    assert "<script" not in text.lower() and "@import" not in text and "url(" not in text
    srcs = re.findall(r'<img [^>]*src="([^"]+)"', text)
    assert len(srcs) == 2 + 2          # two plots + a timeline per feasible option
    for s in srcs:
        assert s.startswith("data:image/png;base64,")
        assert base64.b64decode(s.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"


def test_html_names_every_option_reason_and_source(small_df, small_report):
    text = small_report["html"].read_text()
    for o in small_df["option"]:
        assert o in text
    assert "does not fit cluster &#x27;h100x1&#x27;" in text
    assert "Recommendation." in text and "Pareto frontier" in text
    assert "cloud price pages as quoted publicly" in text        # the H100 price source


def test_csv_and_markdown_match(small_df, small_report):
    csv = pd.read_csv(small_report["csv"])
    assert list(csv["option"]) == list(small_df["option"])
    assert "plan" not in csv and "sim" not in csv
    assert csv["usd_per_mtok_low"].iloc[0] == float(f"{small_df['usd_per_mtok_low'].iloc[0]:.6g}")
    md = small_report["md"].read_text()
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and " | " in ln]
    # a "Shape" column follows Plan when an option's plan was carved (render.summary_table)
    assert rows[0].startswith("| Option | Devices | Plan | ") and "| Step (s) |" in rows[0]
    for o in small_df["option"]:
        assert any(ln.startswith(f"| {o} |") for ln in rows)


def test_cli_writes_report_and_maps_errors(tmp_path):
    from mpmd.cli.main import main

    out = tmp_path / "r"
    res = CliRunner().invoke(main, ["whatif", "--model", "llama3-8b", "--options", "loudbox_p150bx8",
                                    "--global-batch", "16", "--seq-len", "2048", "--tokens", "1e10",
                                    "--time-limit", "1", "--price", "blackhole-p150b=0.5:1",
                                    "--no-screenshot", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert {p.name for p in tmp_path.iterdir()} == {"r.html", "r.csv", "r.md"}
    assert pd.read_csv(tmp_path / "r.csv")["usd_per_hour_low"].iloc[0] == 4.0
    bad = CliRunner().invoke(main, ["whatif", "--model", "llama3-8b", "--options", "h100x1",
                                    "--price", "h100-sxm=cheap", "--out", str(out)])
    assert bad.exit_code == 2 and "error:" in bad.output and "DEVICE=LOW:HIGH" in bad.output
    unknown = CliRunner().invoke(main, ["whatif", "--example", "nope"])
    assert unknown.exit_code == 2 and "unknown example 'nope'" in unknown.output
