"""``mpmd plan`` and Ctrl-C: the first stops the search and keeps the best plan, the second aborts.

The subprocess tests synchronise on the command's own output (its progress line, then its
"stopping" line), never on a fixed sleep, and allow minutes for each step: robust on a loaded
machine, with no timing assertions.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ir import SearchReport, plan_from_json, plan_to_json
from mpmd.cli.output import plan_table, search_gap_text, validate_plan_json
from mpmd.cli.search_ui import Aborted, CtrlC, SearchProgress

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "hardware_profiles" / "clusters" / "h100x16_p150bx32.yaml"
WAIT_S = 300.0
PROGRESS_WITH_PLAN = re.compile(
    r"^planning llama3-70b on \S+: \d+/\d+ candidates, best [0-9.]+ s/step")


class Plan:
    """``mpmd plan`` in a subprocess, its stderr read line by line in a helper thread."""

    def __init__(self, out: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mpmd", "plan", "--model", "llama3-70b",
             "--cluster", str(CLUSTER), "--out", str(out), "--time-limit", "60"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.err: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.err.append(line)
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, pattern: re.Pattern[str]) -> str:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=deadline - time.monotonic())
            except queue.Empty:
                break
            if line is None:
                break
            if pattern.search(line):
                return line
        self.proc.kill()
        pytest.fail(f"no line matching {pattern.pattern!r}; stderr so far:\n{''.join(self.err)}")

    def finish(self) -> tuple[int, str, str]:
        stdout = self.proc.stdout.read()
        rc = self.proc.wait(timeout=WAIT_S)
        self._reader.join(timeout=WAIT_S)
        return rc, stdout, "".join(self.err)


def test_first_ctrl_c_writes_best_plan_marked_interrupted(tmp_path):
    out = tmp_path / "plan.json"
    run = Plan(out)
    run.wait_for(PROGRESS_WITH_PLAN)
    run.proc.send_signal(signal.SIGINT)
    rc, stdout, stderr = run.finish()
    assert rc == 0, stderr
    assert "Traceback" not in stderr + stdout
    assert "stopping the search (Ctrl-C again to abort, writing nothing) ..." in stderr
    line = next(ln for ln in stderr.splitlines() if ln.startswith("interrupted after"))
    assert re.fullmatch(r"interrupted after \d+ s; best plan so far, "
                        r"gap (unknown: \d+ of \d+ candidates not searched|[0-9.]+%)", line), line
    assert "step time" in stdout and "interrupted (Ctrl-C)" in stdout and f"wrote {out}" in stdout
    doc = json.loads(out.read_text())
    validate_plan_json(doc)
    assert plan_to_json(plan_from_json(doc)) == doc
    sv = doc["solver"]
    assert sv["interrupted"] is True
    assert 1 <= sv["candidates"] <= sv["candidates_total"]
    assert (sv["search_bound"] is None) == (sv["candidates"] < sv["candidates_total"])
    assert search_gap_text(SearchReport.from_json(sv)) in line
    assert os.listdir(tmp_path) == ["plan.json"]


def test_second_ctrl_c_aborts_and_writes_nothing(tmp_path):
    out = tmp_path / "plan.json"
    run = Plan(out)
    run.wait_for(PROGRESS_WITH_PLAN)
    run.proc.send_signal(signal.SIGINT)
    run.wait_for(re.compile(r"^stopping the search"))
    run.proc.send_signal(signal.SIGINT)
    rc, stdout, stderr = run.finish()
    assert rc == 130, stderr
    assert "Traceback" not in stderr + stdout
    assert [ln for ln in stderr.splitlines() if "abort" in ln and "Ctrl-C again" not in ln] == [
        "aborted by a second Ctrl-C; nothing written"]
    assert stderr.rstrip("\n").splitlines()[-1] == "aborted by a second Ctrl-C; nothing written"
    assert os.listdir(tmp_path) == []


def test_ctrl_c_handler_sets_stop_then_aborts_and_is_restored():
    before = signal.getsignal(signal.SIGINT)
    with CtrlC() as c:
        c.check()
        signal.raise_signal(signal.SIGINT)
        assert c.stop.is_set() and not c.aborted
        c.check()
        signal.raise_signal(signal.SIGINT)        # never raises where it lands
        assert c.aborted
        with pytest.raises(Aborted):
            c.check()
        with pytest.raises(Aborted):
            with c.committing():
                pytest.fail("an aborted command must not write")
    assert signal.getsignal(signal.SIGINT) is before


def test_ctrl_c_after_the_commit_is_ignored():
    with CtrlC() as c:
        signal.raise_signal(signal.SIGINT)
        with c.committing():
            written = True
        signal.raise_signal(signal.SIGINT)
        c.check()
    assert written and c.stop.is_set() and not c.aborted


class FakeConsole:
    is_terminal = False

    def __init__(self) -> None:
        self.printed: list[str] = []
        self.file = sys.stderr

    def print(self, text: str, **kw) -> None:
        self.printed.append(text)


def test_plain_progress_is_silent_for_short_searches():
    con = FakeConsole()
    with SearchProgress(con, "m on c") as bar:
        bar(0, 4, None)
        bar(4, 4, 1.5)
    assert con.printed == []


def test_plain_progress_line_names_candidates_and_best(monkeypatch):
    import mpmd.cli.search_ui as ui

    monkeypatch.setattr(ui, "DELAY_S", 0.0)
    con = FakeConsole()
    with SearchProgress(con, "m on c") as bar:
        bar(3, 18, 75.3381)
    assert re.fullmatch(r"planning m on c: 3/18 candidates, best 75\.338 s/step, \d+ s elapsed",
                        con.printed[0]), con.printed
    assert bar.line().startswith("planning m on c: 3/18 candidates")


def test_table_says_gap_unknown_when_candidates_were_not_searched():
    """The interrupted plan's search block says its bound and gap are unknown; an uninterrupted
    one gives them."""
    from planner import PlanOptions, plan
    from rich.console import Console
    from tests.planner.conftest import cluster, device, workload

    fast, slow = device("fast", 400.0, 80.0), device("slow", 100.0, 80.0)
    c = cluster([("f0", fast, 2), ("s0", slow, 2)])
    stop = threading.Event()
    r = plan(workload(), c, PlanOptions(time_limit_s=20.0),
             lambda done, total, best: stop.set() if done == 2 else None, stop=stop)
    con = Console(width=200, record=True)
    con.print(plan_table(r, c))
    text = con.export_text()
    assert f"2 of {r.candidates_total} candidates" in text and "interrupted (Ctrl-C)" in text
    n = r.candidates_total
    assert f"unknown: {n - 2} of {n} candidates not searched" in text

    full = plan(workload(), c, PlanOptions(time_limit_s=20.0))
    con = Console(width=200, record=True)
    con.print(plan_table(full, c))
    text = con.export_text()
    assert f"{full.candidates_total} candidates in" in text
    assert "search gap" not in text and "unknown" not in text and "interrupted" not in text


def test_ctrl_c_before_any_feasible_plan_writes_nothing(tmp_path, monkeypatch):
    """The stop event is already set when the search starts (as if Ctrl-C came at once): one line,
    exit 2, no file."""
    from click.testing import CliRunner

    import planner
    from mpmd.cli.main import main

    real = planner.plan              # what `mpmd plan` calls

    def stopped_at_once(*args, stop, **kw):
        stop.set()
        return real(*args, stop=stop, **kw)

    monkeypatch.setattr(planner, "plan", stopped_at_once)
    out = tmp_path / "plan.json"
    res = CliRunner().invoke(main, ["plan", "--model", "llama3-8b", "--cluster",
                                    str(ROOT / "hardware_profiles" / "clusters" / "h100x64.yaml"),
                                    "--global-batch", "32", "--seq-len", "2048", "--out", str(out)])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    # the seconds are the machine's (tracing the model first): any whole number
    assert len(lines) == 1 and re.fullmatch(
        r"interrupted after \d+ s before any feasible plan; nothing written", lines[0]), lines
    assert os.listdir(tmp_path) == []
