"""mpmd video: the Mochi latency plan on the Tenstorrent boxes and one H100, its JSON, and
one-line errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mpmd.cli.main import main


def _video(*args: str):
    return CliRunner().invoke(main, ["video", *args], catch_exceptions=False)


@pytest.mark.slow
def test_quietbox_plan_prints_seconds_per_video_and_writes_json(tmp_path):
    out = tmp_path / "video.json"
    r = _video("--cluster", "hardware_profiles/clusters/quietbox_p150x8_guide.yaml",
               "--out", str(out))
    assert r.exit_code == 0, r.output
    assert "seconds per video:" in r.output and "the guide's TP 8" in r.output
    data = json.loads(out.read_text())
    assert [c["component"] for c in data["components"]] == ["encoder", "dit", "decoder"]
    assert data["steps"] == 64 and data["frames"] == 163
    assert data["seconds_per_video"] == pytest.approx(
        sum(c["total_s"] for c in data["components"]) + data["moves_s"])
    dit = data["components"][1]
    assert dit["data"] * dit["context"] * dit["tensor"] == dit["devices"] == 8
    assert data["bound_s"] <= data["seconds_per_video"]


def test_run_of_the_full_pipeline_is_refused_in_one_line():
    r = _video("--cluster", "h100x1", "--run")
    assert r.exit_code == 2
    assert "--run executes only the tiny pipeline" in r.output


def test_bad_frame_count_is_one_line():
    r = _video("--cluster", "h100x1", "--frames", "50")
    assert r.exit_code == 2
    assert "frames=50" in r.output and "use 49 or 55" in r.output
