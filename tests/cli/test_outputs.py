"""Command-line flags that choose what is read and written: several `--options` after one flag,
`python -m mpmd`, and commands that write nothing unless told where."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
from click.testing import CliRunner

from mpmd.cli.main import main


def _invoke(args, cwd):
    import os

    old = os.getcwd()
    os.chdir(cwd)
    try:
        return CliRunner().invoke(main, args)
    finally:
        os.chdir(old)


def test_whatif_options_take_several_values_after_one_flag(tmp_path):
    r = _invoke(["whatif", "--model", "llama-tiny", "--options", "cpu4x2", "h100x1",
                 "--time-limit", "0.2", "--no-screenshot", "--out", "w/x"], tmp_path)
    assert r.exit_code == 0, r.output
    df = pd.read_csv(tmp_path / "w" / "x.csv")
    assert len(df) == 2
    assert sorted(tmp_path.joinpath("w").iterdir()) == [tmp_path / "w" / f"x.{e}"
                                                       for e in ("csv", "html", "md")]


def test_whatif_repeated_options_equal_one_flag(tmp_path):
    r = _invoke(["whatif", "--model", "llama-tiny", "--options", "cpu4x2", "--options", "h100x1",
                 "--time-limit", "0.2", "--no-screenshot"], tmp_path)
    assert r.exit_code == 0, r.output
    assert len(pd.read_csv(tmp_path / "whatif" / "llama-tiny.csv")) == 2   # default: whatif/NAME


def test_whatif_stray_argument_is_one_line(tmp_path):
    r = _invoke(["whatif", "--model", "llama-tiny", "a.yaml"], tmp_path)
    assert r.exit_code == 2
    assert r.output.strip().splitlines() == [
        "error: unexpected argument 'a.yaml'; list the clusters to compare after --options, "
        "e.g. --options a.yaml"]
    assert list(tmp_path.iterdir()) == []


def test_validate_profiles_out_needs_fit(tmp_path):
    r = _invoke(["validate", "--profiles-out", "p"], tmp_path)
    assert r.exit_code == 2
    assert "--profiles-out needs --fit" in r.output
    assert list(tmp_path.iterdir()) == []


def test_python_dash_m_mpmd_is_the_cli():
    r = subprocess.run([sys.executable, "-m", "mpmd", "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0
    for cmd in ("plan", "simulate", "run", "calibrate", "validate", "whatif", "profiles"):
        assert f"  {cmd} " in r.stdout


def test_a_node_group_search_says_why_it_stopped_and_whose_solve_is_optimal():
    from ir import SearchReport
    from mpmd.cli.plan_search import STOPPED, search_rows
    base = {"status": "OPTIMAL", "objective": 1.9, "bound": 1.9, "gap": 0.0, "search_wall_s": 27.0,
            "search_bound": 1.5, "search_gap": 0.21, "options": [{}, {}], "candidates_total": 9,
            "candidates_searched": 4}
    for why in ("work budget", "time limit", "complete", "interrupted"):
        rows = dict(search_rows(SearchReport.from_json({**base, "stopped": why}), 1.9))
        rest = "pruned by their bounds" if why == "complete" else "unsearched"
        assert rows["candidates"] == (f"4 of 9 searched, the rest {rest}; "
                                      "2 configurations in 27.0 s" + STOPPED[why])
        assert rows["objective"] == "1.900 s: the step time above (chosen: OPTIMAL)"
        assert rows["proven bound"] == "1.500 s over every option the search covers"
        assert rows["gap"] == "21.0% = (step - bound) / step"
    assert "raise --time-limit" in STOPPED["time limit"] and "raise it" in STOPPED["work budget"]


def test_a_refit_profile_keeps_every_efficiency_entry_it_does_not_fit(tmp_path):
    """``mpmd validate --fit --profiles-out`` rewrites the four fitted values and keeps the rest
    (serving overheads, the attention kernel's rates, ...) as they were."""
    import yaml

    from hardware_profiles import load_device
    from hardware_profiles.paths import DEVICES_DIR
    from mpmd.cli.validate import extra_efficiency, write_profile_efficiency

    src = DEVICES_DIR / "h100-sxm.yaml"
    out = tmp_path / "h100-sxm.yaml"
    write_profile_efficiency(src, 0.7, 0.8, 25, "a test fit", 0.2, out=out,
                             extra=extra_efficiency(load_device("h100-sxm"), None))
    old = yaml.safe_load(src.read_text())["efficiency"]
    new = yaml.safe_load(out.read_text())["efficiency"]
    assert set(new) == set(old)
    assert [new[k]["value"] for k in ("matmul", "memory", "fragment_overhead_us",
                                      "elementwise_traffic")] == [0.7, 0.8, 25, 0.2]
    for k in set(old) - {"matmul", "memory", "fragment_overhead_us", "elementwise_traffic"}:
        assert new[k] == old[k], k
    dev = load_device(str(out))
    assert (dev.attention_efficiency, dev.decode_layer_overhead) == (
        load_device("h100-sxm").attention_efficiency, load_device("h100-sxm").decode_layer_overhead)


def test_every_stop_reason_has_its_line_and_only_those():
    """The stop reasons are spelled once (``ir.STOP_REASONS``, what ``planner.shaping`` writes);
    the search block has a line for each and for nothing else."""
    from ir import STOP_REASONS
    from mpmd.cli.plan_search import STOPPED
    assert set(STOPPED) == set(STOP_REASONS)
