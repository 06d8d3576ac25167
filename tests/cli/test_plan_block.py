"""``mpmd plan``'s search block says what the plan JSON says: every number it prints is the
JSON's ``solver`` (or ``predicted``) value at the printed precision, and the plan has one step
time (issue 50, item 1)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ir import SearchReport
from mpmd.cli.plan_search import TITLE, search_rows

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "hardware_profiles" / "clusters"
NUMBER = re.compile(r"(?<![\w.-])\d[\d,]*(?:\.\d+)?")


def numbers(text: str) -> list[float]:
    """Every number printed in ``text`` (thousands separators dropped)."""
    return [float(x.replace(",", "")) for x in NUMBER.findall(text)]


def table_rows(lines: list[str], start: int) -> dict[str, str]:
    """label -> text of the rich box table that starts after line ``start`` (wrapped cells
    joined)."""
    rows: dict[str, str] = {}
    last = None
    for ln in lines[start + 1:]:
        if ln.startswith("└"):
            break
        if not ln.startswith("│"):
            continue
        label, value = (c.strip() for c in ln.strip().strip("│").split("│", 1))
        value = value.rstrip("│").strip()
        if label:
            rows[label], last = value, label
        elif last is not None:
            rows[last] += " " + value
    return rows


def plan_cli(tmp_path: Path, cluster: str) -> tuple[str, dict]:
    out = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "mpmd", "plan", "--model", "llama-tiny",
                        "--cluster", str(CLUSTERS / cluster), "--global-batch", "8",
                        "--out", str(out)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "COLUMNS": "400"})
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, json.loads(out.read_text())


def blocks(stdout: str) -> tuple[dict[str, str], dict[str, str]]:
    lines = stdout.splitlines()
    step = next(i for i, ln in enumerate(lines) if ln.strip() == "step")
    search = next(i for i, ln in enumerate(lines) if ln.startswith(TITLE))
    return table_rows(lines, step), table_rows(lines, search)


@pytest.mark.parametrize("cluster", ["cpu4x2.yaml", "cpu4x2_nodes.yaml"])
def test_every_number_of_the_search_block_is_the_plan_jsons(tmp_path, cluster):
    stdout, doc = plan_cli(tmp_path, cluster)
    step_rows, block = blocks(stdout)
    sv, step = doc["solver"], doc["predicted"]["step_time_s"]
    # one step time: the replay the JSON records, nowhere a second one
    assert numbers(step_rows["step time"]) == [round(step, 3)]
    assert not {"solver", "search", "search gap"} & set(step_rows)
    assert set(block) == {"candidates", "objective", "proven bound", "gap"}
    replay = "options" in sv                  # a node-group search: bounds the replayed step
    wall = round(sv["search_wall_s"], 1)
    if replay:
        assert numbers(block["candidates"]) == [sv["candidates_searched"], sv["candidates_total"],
                                                len(sv["options"]), wall]
        objective = step
        assert block["objective"].startswith(f"{step:.3f} s: the step time above")
    else:
        assert sv["candidates"] == sv["candidates_total"]
        assert numbers(block["candidates"]) == [sv["candidates"], wall]
        objective = sv["objective"]
        assert "surrogate" in block["objective"]
    assert numbers(block["objective"]) == [round(objective, 3)]
    assert numbers(block["proven bound"]) == [round(sv["search_bound"], 3)]
    assert numbers(block["gap"]) == [round(sv["search_gap"] * 100, 1)]
    # the printed formula is the one the JSON's gap follows
    assert sv["search_gap"] == pytest.approx((objective - sv["search_bound"]) / objective, abs=1e-9)
    assert [k for k, v in block.items() if "%" in v] == ["gap"]      # one gap, the search's


def test_a_vacuous_bound_prints_as_the_json_holds_it():
    """The quick-start case: a candidate whose solve proved no bound leaves the search bound at 0
    and the gap at 100% in the JSON; the block prints those and says why, not the chosen
    candidate's own 0% gap."""
    sv = SearchReport.from_json({"status": "OPTIMAL", "objective": 75.708125, "bound": 75.708125,
                                 "gap": 0.0, "search_wall_s": 28.8, "candidates": 54,
                                 "candidates_total": 54, "search_bound": 0.0, "search_gap": 1.0})
    rows = dict(search_rows(sv, 77.08))
    assert rows["objective"] == "75.708 s: CP-SAT's surrogate of the step (chosen candidate OPTIMAL)"
    assert rows["proven bound"] == ("0.000 s over every candidate: a candidate's solve ended "
                                    "(status UNKNOWN) before proving any bound")
    assert rows["gap"] == "100.0% = (objective - bound) / objective"
    assert "0.00%" not in " ".join(rows.values())


def test_unsearched_candidates_leave_bound_and_gap_unknown_as_in_the_json():
    sv = SearchReport.from_json({"status": "FEASIBLE", "objective": 2.0, "bound": 1.5, "gap": 0.25,
                                 "search_wall_s": 3.0, "candidates": 2, "candidates_total": 18,
                                 "interrupted": True, "search_bound": None, "search_gap": None})
    assert sv.to_json()["search_bound"] is None and sv.to_json()["search_gap"] is None
    rows = dict(search_rows(sv, 2.1))
    assert rows["candidates"] == "2 of 18 candidates in 3.0 s, interrupted (Ctrl-C)"
    assert rows["proven bound"] == "unknown: 16 of 18 candidates not searched"
    assert rows["gap"] == "unknown"
    assert rows["objective"].endswith("(chosen candidate FEASIBLE: not proven optimal)")


def test_a_data_parallel_plan_bounds_its_replayed_step():
    sv = SearchReport.from_json({"status": "HEURISTIC", "search_wall_s": 56.8, "candidates": 3,
                                 "candidates_total": 3, "options": [{}, {}, {}],
                                 "stopped": "work budget", "search_bound": 18.35,
                                 "search_gap": 0.055})
    rows = dict(search_rows(sv, 19.42))
    assert rows["objective"] == ("19.420 s: the step time above (chosen: HEURISTIC: a "
                                 "data-parallel split of its parts' plans)")
    assert rows["proven bound"] == "18.350 s over every option the search covers"
    assert rows["gap"] == "5.5% = (step - bound) / step"
    assert "work budget of --time-limit spent" in rows["candidates"]
