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


def _plan(*args: str):
    return CliRunner().invoke(main, ["plan", *args], catch_exceptions=False)


def test_plan_latency_prints_what_mpmd_video_prints(tmp_path):
    """mpmd plan --objective latency of a pipeline is mpmd video's plan: same table, same seconds
    per video and per component, same JSON."""
    a, b = tmp_path / "plan.json", tmp_path / "video.json"
    r = _plan("--model", "mochi-tiny", "--objective", "latency", "--cluster",
              "hardware_profiles/clusters/cpu_uneven.yaml", "--out", str(a))
    v = _video("--pipeline", "mochi-tiny", "--cluster",
               "hardware_profiles/clusters/cpu_uneven.yaml", "--out", str(b))
    assert r.exit_code == 0 == v.exit_code, r.output
    assert "seconds per video:" in r.output and "components encoder" in r.output
    assert r.output.replace(str(a), "X") == v.output.replace(str(b), "X")
    assert json.loads(a.read_text()) == json.loads(b.read_text())


@pytest.mark.slow
def test_plan_latency_of_mochi_on_the_4_chip_quietbox():
    r = _plan("--model", "mochi", "--objective", "latency", "--cluster",
              "hardware_profiles/clusters/quietbox_p150x4.yaml")
    assert r.exit_code == 0, r.output
    assert "seconds per video: 325.93 (components encoder 0.01, dit 324.25, decoder 1.67" in r.output
    assert "vs 337.5 s for the guide's TP 4" in r.output


def test_plan_latency_of_a_training_model_is_refused_naming_the_pipelines():
    r = _plan("--model", "llama3-70b", "--objective", "latency", "--cluster", "h100x1")
    assert r.exit_code == 2
    assert r.output.count("\n") == 1
    assert "'llama3-70b' is not one: use --model mochi or mochi-tiny" in r.output
    r = _plan("--model", "mochi-dit-10b", "--objective", "latency", "--cluster", "h100x1")
    assert r.exit_code == 2 and "component of the mochi pipeline" in r.output


def test_plan_of_a_pipeline_needs_the_latency_objective_and_no_training_options():
    r = _plan("--model", "mochi", "--cluster", "h100x1")
    assert r.exit_code == 2 and "use --objective latency" in r.output
    r = _plan("--model", "mochi", "--objective", "latency", "--global-batch", "4", "--cluster",
              "h100x1")
    assert r.exit_code == 2
    assert "--global-batch does not apply to a latency plan" in r.output
