"""``mpmd run`` for a new user (issue 50, item 4): a failed check says so (exit status 1 for
(a)-(c), one labelled warning line with this run's causes for (d), never a fix the run already
used), the default step count is sized for a first run and says so, and a multi-process run names
whom it waits for and ends a wait for a process that never comes in one line, exit status 2."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ir.plan_json import plan_to_json
from mpmd.cli.main import main
from runtime.train.join import ProcessRunError, roll_call
from runtime.train.report import (RunReport, cpu_sample, other_cores, print_report,
                                  timing_warning)
from tests.runtime.test_run import make_plan

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = "hardware_profiles/clusters/cpu4x2.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def plan_file(tmp_path: Path, cluster_path: str = BUNDLED) -> Path:
    p = tmp_path / "tiny.json"
    doc = plan_to_json(make_plan("1f1b"))
    doc["cluster_path"] = cluster_path
    p.write_text(json.dumps(doc))
    return p


def report(measured: float = 1.0, simulated: float | None = 1.0, steps: int = 10,
           cluster_path: str = BUNDLED, **kw) -> RunReport:
    from dataclasses import replace

    plan = replace(make_plan("1f1b"), cluster_path=cluster_path)
    base = dict(plan=plan, losses=(5.0,) * steps, loss_rel_errors=(0.0,), grad_rel_errors=(0.0,),
                order_mismatches=(), executables={}, measured_step_s=measured,
                simulated_step_s=simulated, step_times_s=(measured,) * steps, executed_order={})
    return RunReport(**{**base, **kw})


def mpmd(*args: str, cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mpmd", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"})


# ------------------------------------------------------------------- check (d): the warning
def test_a_passing_timing_check_prints_no_warning():
    assert timing_warning(report(1.0, 1.1)) is None
    assert timing_warning(report(1.0, None)) is None


def test_a_timing_miss_on_the_bundled_profile_names_few_steps_and_calibration():
    w = timing_warning(report(2.0, 1.0, steps=2), BUNDLED, others=0.0, cores=2)
    assert w.startswith("warning: check (d) failed: measured step 2000.0 ms is 50.0% off the "
                        "simulated 1000.0 ms (limit 15%); likely: only 2 steps ran")
    assert "--steps 10 or more" in w
    assert (f"{BUNDLED} ships with the project: its profile (cpu-host: measured by mpmd calibrate "
            f"on ") in w
    assert "not necessarily this one (run 'mpmd calibrate --out calibrated' here" in w
    assert "other processes" not in w and "\n" not in w


def test_a_timing_miss_on_a_profile_calibrated_here_never_suggests_the_cluster_it_ran_on(tmp_path):
    """The README's flow: plan on calibrated/cpu4x2.yaml, run; the old hint told the user to rerun
    with --cluster calibrated/cpu4x2.yaml, the very file the plan already used."""
    (tmp_path / "calibrated").mkdir()
    mine = tmp_path / "calibrated" / "cpu4x2.yaml"
    shutil.copy(ROOT / BUNDLED, mine)
    shutil.copy(ROOT / "hardware_profiles" / "devices" / "cpu-host.yaml", tmp_path / "calibrated")
    w = timing_warning(report(1.34, 1.0, cluster_path=str(mine)), str(mine), others=0.05, cores=2)
    assert w.startswith("warning: check (d) failed: measured step 1340.0 ms is 25.4% off")
    assert f"this machine no longer runs at the speed recorded in {mine} (cpu-host: measured" in w
    assert "run 'mpmd calibrate --out calibrated' again while it is idle, then rerun this plan" in w
    assert "--cluster" not in w and "plan on calibrated" not in w and "--steps" not in w
    busy = timing_warning(report(1.34, 1.0, cluster_path=str(mine)), str(mine), others=1.3,
                          cores=2)
    assert "other processes kept 1.3 of this machine's 2 cores busy during the run (rerun when " \
           "it is otherwise idle)" in busy
    assert "no longer runs at the speed" not in busy     # the load explains it first


def test_print_report_puts_the_warning_on_one_labelled_line():
    from rich.console import Console

    con = Console(record=True, width=80)
    print_report(report(3.0, 1.0, steps=3), con, others=0.0)
    lines = [ln for ln in con.export_text().splitlines() if "warning" in ln]
    assert len(lines) == 1 and lines[0].startswith("warning: check (d) failed:")


def test_other_cores_counts_another_process_busy_beside_this_one():
    start = cpu_sample()
    if start is None:
        pytest.skip("no /proc/stat")
    burn = subprocess.Popen([sys.executable, "-c",
                             "import time\nt = time.time()\nwhile time.time() - t < 1.0: pass"])
    burn.wait()
    assert other_cores(start, cpu_sample()) >= 0.5
    assert other_cores(None, start) is None


# --------------------------------------------------------------- exit status of the checks
@pytest.mark.parametrize("kw,code,line", [
    ({}, 0, None),
    ({"measured_step_s": 3.0}, 0, "warning: check (d) failed"),
    ({"order_mismatches": ("m0: position 0: executed ('B0.0',) but the plan has ('F0.0',)",)}, 1,
     "error: check (b) executed order differs from the plan: m0: position 0"),
    ({"loss_rel_errors": (1e-3,)}, 1,
     "error: check (a) loss and gradients differ from jax.jit by 1.00e-03 (limit 1e-5)"),
])
def test_run_exit_status_says_whether_the_checks_passed(tmp_path, monkeypatch, kw, code, line):
    import runtime.train.run as run_mod

    r = report(1.0, 1.0, **kw)
    monkeypatch.setattr(run_mod, "run_plan", lambda *a, **k: r)
    res = CliRunner().invoke(main, ["run", str(plan_file(tmp_path))])
    assert res.exit_code == code, res.output
    if line is None:
        assert not any(ln.startswith(("warning", "error")) for ln in res.output.splitlines())
    else:
        assert sum(ln.startswith(line) for ln in res.output.splitlines()) == 1, res.output


def test_run_help_says_the_default_steps_suit_a_first_run():
    res = CliRunner().invoke(main, ["run", "--help"])
    text = " ".join(res.output.split())
    assert "The default is sized for a first run" in text and "[default: 10;" in text
    assert "--join-timeout" in text and "Exit status 1 when (a), (b) or (c) fails" in text


# ----------------------------------------------------------------- multi-process: who, how long
def test_a_coordinator_host_that_does_not_resolve_is_refused_at_once(tmp_path):
    t = time.monotonic()
    res = CliRunner().invoke(main, ["run", str(plan_file(tmp_path)), "--processes", "2",
                                    "--process-id", "1", "--coordinator", "host0.invalid:6000"])
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith("error: --coordinator host0.invalid:6000: host 'host0.invalid' does "
                               "not resolve on this machine (")
    assert lines[0].endswith("); pass process 0's IP address or a name this host resolves; see "
                             "'main run --help'")      # 'mpmd' when run as the mpmd script
    assert time.monotonic() - t < 10


@pytest.mark.parametrize("pid,waits,error", [
    (1, "process 1 of 2: waiting up to 2 s for process 0 at 127.0.0.1:{port}",
     "error: process 1 of 2: process 0 did not answer at 127.0.0.1:{port} within 2 s; start "
     "process 0 there"),
    (0, "process 0 of 2: waiting up to 2 s at 127.0.0.1:{port} for process 1 (started with "
        "--processes 2 --process-id I --coordinator 127.0.0.1:{port})",
     "error: process 0 of 2: process 1 did not join at 127.0.0.1:{port} within 2 s; start it "
     "with --processes 2 --process-id I --coordinator 127.0.0.1:{port} (the same plan), or raise "
     "--join-timeout"),
])
def test_a_process_that_never_comes_ends_the_wait_in_one_line(tmp_path, pid, waits, error):
    port = free_port()
    t = time.monotonic()
    r = mpmd("run", str(plan_file(tmp_path)), "--processes", "2", "--process-id", str(pid),
             "--coordinator", f"127.0.0.1:{port}", "--join-timeout", "2", "--steps", "1")
    took = time.monotonic() - t
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines[0] == waits.format(port=port)
    assert lines[-1].startswith(error.format(port=port)), lines
    assert len(lines) == 2 and "Traceback" not in r.stderr and r.stdout == ""
    assert took < 60


def _call(results: dict, pid: int, processes: int, port: int, timeout: float = 10) -> None:
    said: list[str] = []
    try:
        roll_call(f"127.0.0.1:{port}", processes, pid, timeout, loopback=True, say=said.append)
        results[pid] = ("ok", said)
    except ProcessRunError as e:
        results[pid] = (str(e), said)


def test_a_roll_call_names_each_process_as_it_joins():
    port, results = free_port(), {}
    threads = [threading.Thread(target=_call, args=(results, i, 3, port)) for i in (2, 0, 1)]
    for t in threads:
        t.start()
        time.sleep(0.2)
    for t in threads:
        t.join(30)
    assert {i: r[0] for i, r in results.items()} == {0: "ok", 1: "ok", 2: "ok"}
    said = results[0][1]
    assert said[0].startswith("process 0 of 3: waiting up to 10 s at 127.0.0.1:")
    assert said[0].split(" for processes ")[1].startswith("1, 2 ")
    assert said[-1].endswith(": all 3 processes joined")
    with socket.socket() as s:            # the port is free again for jax.distributed
        s.bind(("127.0.0.1", port))


def test_a_roll_call_refuses_another_process_count():
    port, results = free_port(), {}
    host = threading.Thread(target=_call, args=(results, 0, 2, port, 2))
    host.start()
    time.sleep(0.2)
    _call(results, 1, 3, port, 5)
    host.join(30)
    assert results[1][0] == ("process 1 of 3: process 0 runs --processes 2, process 1 passed "
                             "--processes 3; give every process the same count")
    assert results[0][0].startswith("process 0 of 2: process 1 did not join")
