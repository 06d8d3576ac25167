"""Tests of the multi-process runtime (compiler.distributed), its worker
(runtime.train.process_run) and launcher (runtime.train.launch), and ``mpmd run --processes``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from compiler.distributed import (DistributedError, allgather, assign_meshes, barrier,
                                  mesh_devices, prepare, process_topology, run_process,
                                  serial_order)
from compiler.exported import Call, Executable, ExportedProgram, MeshProgram, Send
from compiler.runtime import run_program
from ir import Timeline, TimelineEvent
from ir.plan_json import plan_to_json
from runtime.train.launch import LaunchError, _kill, _wait, free_port, launch
from runtime.train.process_run import DistributedReport, merge_timelines, timeline_from_json
from runtime.train.run import run_plan

from tests.runtime.test_run import make_plan

#: a 2-block Llama (plan layers: embed, 2 blocks, head), small enough for 3 compiles in ~60 s
TINY = dict(layers=2, hidden=32, heads=2, kv_heads=2, ffn=64)


def test_assign_meshes_contiguous_groups():
    ms = ("m0", "m1", "m2", "m3")
    assert assign_meshes(ms, 4) == (("m0",), ("m1",), ("m2",), ("m3",))
    assert assign_meshes(ms, 2) == (("m0", "m1"), ("m2", "m3"))
    assert assign_meshes(ms, 3) == (("m0", "m1"), ("m2",), ("m3",))
    assert assign_meshes(ms, 1) == (ms,)
    with pytest.raises(DistributedError, match="--processes 5 does not fit a plan of 4 meshes"):
        assign_meshes(ms, 5)
    with pytest.raises(DistributedError, match="--processes 0"):
        assign_meshes(ms, 0)


def test_process_topology_places_meshes_on_their_process_devices():
    devs = jax.devices()[:4]          # one process here: process 0 holds m0 and m1
    topo = process_topology({"m0": {"data": 2}, "m1": {"data": 1, "tensor": 2}}, (("m0", "m1"),),
                            devs)
    assert [d.id for d in topo["m0"].devices.flat] == [devs[0].id, devs[1].id]
    assert topo["m1"].axis_names == ("data", "tensor") and topo["m1"].devices.shape == (1, 2)
    assert [d.id for d in topo["m1"].devices.flat] == [devs[2].id, devs[3].id]
    with pytest.raises(DistributedError, match=r"process 0 has 4 devices but its meshes "
                                               r"\['m0', 'm1'\] need 6"):
        process_topology({"m0": {"data": 2}, "m1": {"data": 4}}, (("m0", "m1"),), devs)


def test_mesh_devices_rejects_a_mesh_across_processes():
    @dataclass(frozen=True)
    class Dev:
        id: int
        process_index: int

    d = [Dev(i, i // 2) for i in range(4)]
    sh = lambda *ix: SimpleNamespace(device_set={d[i] for i in ix})  # noqa: E731
    ok = ExportedProgram({"a": MeshProgram("a", ()), "b": MeshProgram("b", ())}, {},
                         (("x", "a", sh(0, 1)), ("y", "b", sh(2, 3))), ())
    assert {m: [x.id for x in v] for m, v in mesh_devices(ok).items()} == {"a": [0, 1], "b": [2, 3]}
    bad = ExportedProgram({"a": MeshProgram("a", ())}, {}, (("x", "a", sh(1, 2)),), ())
    with pytest.raises(DistributedError, match=r"mesh 'a' spans processes \[0, 1\]"):
        mesh_devices(bad)


def _two_mesh_program():
    """a: y = 2x, send y to b; b: z = y + 1, send z back to a; a: w = z * y."""
    dev = jax.devices()
    sa = jax.sharding.SingleDeviceSharding(dev[0])
    sb = jax.sharding.SingleDeviceSharding(dev[1])
    exes = {"dbl": Executable("dbl", "a", jax.jit(lambda x: (2 * x,)), (sa,), (sa,)),
            "inc": Executable("inc", "b", jax.jit(lambda y: (y + 1,)), (sb,), (sb,)),
            "mul": Executable("mul", "a", jax.jit(lambda z, y: (z * y,)), (sa, sa), (sa,))}
    progs = {"a": MeshProgram("a", (Call("dbl", "F0.0", "F", 0, 0, ("x",), ("y",)),
                                    Send("y", "b", "y_b", sb),
                                    Call("mul", "F0.1", "F", 0, 1, ("z_a", "y"), ("w",)))),
             "b": MeshProgram("b", (Call("inc", "F1.0", "F", 1, 0, ("y_b",), ("z",)),
                                    Send("z", "a", "z_a", sa)))}
    return ExportedProgram(progs, exes, (("x", "a", sa),), (("w", "a"), ("z", "b")))


def test_serial_order_is_the_single_process_round_robin():
    ep = _two_mesh_program()
    assert serial_order(ep) == (("a", 0), ("a", 1), ("b", 0), ("b", 1), ("a", 2))


def test_run_process_in_one_process_equals_run_program():
    ep = _two_mesh_program()
    x = np.arange(3, dtype=np.float32)
    pp = prepare(ep, [x])
    assert pp.meshes == ("a", "b") and pp.avals["z_a"].shape == (3,)
    ex = run_process(pp, (x,))
    ref = run_program(ep, (x,))
    np.testing.assert_array_equal(np.asarray(ex.outputs[0]), (2 * x + 1) * 2 * x)
    np.testing.assert_array_equal(np.asarray(ex.outputs[1]), np.asarray(ref.outputs[1]))
    assert ex.order == ref.order == {"a": ("F0.0", "F0.1"), "b": ("F1.0",)}
    assert ex.steps == {"a": ("call:F0.0", "send:y->b", "call:F0.1"),
                        "b": ("call:F1.0", "send:z->a")}
    assert [e.track for e in ex.timeline.events] == ["a/compute", "a/send", "b/compute", "b/send",
                                                     "a/compute"]


def test_merge_timelines_and_report_json_round_trip():
    e = lambda n, tr, s: TimelineEvent(n, "F", tr, tr.split("/")[0], 0, 0, s, s + 1)  # noqa: E731
    t0, t1 = Timeline((e("F0.0", "m0/compute", 0.0), e("F0.1", "m0/compute", 2.0))), \
        Timeline((e("F1.0", "m1/compute", 1.0),))
    m = merge_timelines([t0, t1])
    assert [x.name for x in m.events] == ["F0.0", "F1.0", "F0.1"]
    assert timeline_from_json(m.to_json()) == m
    r = DistributedReport("p.json", 2, (("m0",), ("m1",)), (5.5, 4.5), (3.0, 2.0),
                          {"m0": ("F0.0",)}, (), (m,))
    assert DistributedReport.from_json(json.loads(json.dumps(r.to_json()))) == r


def test_allgather_in_one_process_and_its_64_bit_guard():
    np.testing.assert_array_equal(allgather(np.array([[1, 2], [3, 4]], np.int32)),
                                  [[[1, 2], [3, 4]]])
    barrier()
    with pytest.raises(DistributedError, match="allgather of float64 would be cast to 32 bits"):
        allgather(np.array([1.0]))


def _sleeper(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL)


def test_launcher_names_the_failed_process_and_leaves_no_orphans(tmp_path):
    errs = [tmp_path / "e0", tmp_path / "e1"]
    errs[0].write_text("")
    errs[1].write_text("warning: noise\nValueError: boom in process one\n")
    procs = [_sleeper("import time; time.sleep(60)"), _sleeper("import sys; sys.exit(3)")]
    t = time.monotonic()
    try:
        with pytest.raises(LaunchError, match=r"^process 1 of 2 failed \(exit 3\): ValueError: "
                                              r"boom in process one$"):
            _wait(procs, errs, timeout_s=30)
    finally:
        _kill(procs)
    assert procs[0].poll() is not None and time.monotonic() - t < 20


def test_launcher_time_out_kills_every_process(tmp_path):
    procs = [_sleeper("import time; time.sleep(60)")]
    try:
        with pytest.raises(LaunchError, match=r"processes \[0\] did not finish within 0.5 s"):
            _wait(procs, [tmp_path / "e0"], timeout_s=0.5)
    finally:
        _kill(procs)
    assert procs[0].poll() is not None


def test_free_port_is_on_loopback():
    import socket

    p = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", p))   # still free


def _plan_file(tmp_path, schedule: str, **kw):
    path = tmp_path / f"{schedule}.json"
    path.write_text(json.dumps(plan_to_json(make_plan(schedule, **kw))))
    return path


def test_two_processes_match_the_single_process_run(tmp_path):
    """Two processes of two meshes each, a small Llama on 1F1B: the same losses as one process,
    the planned order on every mesh, and one trace with every mesh's compute and send tracks."""
    path = _plan_file(tmp_path, "1f1b", layers=4, global_batch=4, seq_len=16)
    trace = tmp_path / "trace.json"
    r = launch(path, 2, steps=2, model_overrides=TINY, trace_path=trace, timeout_s=300)
    ref = run_plan(path, steps=2, model_overrides=TINY, simulate=False)
    assert r.groups == (("m0", "m1"), ("m2", "m3"))
    assert np.allclose(r.losses, ref.losses, rtol=0, atol=1e-6), (r.losses, ref.losses)
    assert r.order_mismatches == ()
    assert r.order == ref.executed_order
    doc = json.loads(trace.read_text())
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {"m0", "m1", "m2", "m3"}
    threads = {(e["pid"], e["args"]["name"]) for e in doc["traceEvents"]
               if e["name"] == "thread_name"}
    assert {t for _, t in threads} == {"compute", "send", "recv"}
    calls = [e for e in doc["traceEvents"] if e.get("ph") == "X" and e["cat"] != "transfer"]
    assert len(calls) == sum(len(v) for v in ref.executed_order.values())


@pytest.mark.slow
def test_three_processes_with_uneven_groups_match_one(tmp_path):
    """4 meshes over 3 processes: process 0 holds m0 and m1 (4 devices), processes 1 and 2 one mesh
    (2 devices) each; ZB-H1 (split backward) sends across and within processes."""
    path = _plan_file(tmp_path, "zb-h1", layers=4, global_batch=4, seq_len=16)
    r = launch(path, 3, steps=2, model_overrides=TINY, timeout_s=300)
    ref = run_plan(path, steps=2, model_overrides=TINY, simulate=False)
    assert r.groups == (("m0", "m1"), ("m2",), ("m3",))
    assert np.allclose(r.losses, ref.losses, rtol=0, atol=1e-6), (r.losses, ref.losses)
    assert r.order_mismatches == () and r.order == ref.executed_order


def test_cli_rejects_bad_process_flags(tmp_path):
    from click.testing import CliRunner

    from mpmd.cli.main import main

    path = _plan_file(tmp_path, "1f1b")
    for args, msg in ((["--processes", "5"], "--processes 5 does not fit a plan of 4 meshes"),
                      (["--process-id", "1"], "--process-id and --coordinator need --processes"),
                      (["--processes", "2", "--process-id", "1"], "give --process-id and "
                                                                  "--coordinator together"),
                      (["--processes", "2", "--process-id", "0", "--coordinator", "nohost"],
                       "--coordinator 'nohost' is not HOST:PORT"),
                      (["--processes", "0"], "1<=x<=4096"),
                      (["--processes", "2", "--timeout", "5"], "10<=x<=86400")):
        res = CliRunner().invoke(main, ["run", str(path), *args])
        assert res.exit_code == 2, (args, res.output)
        assert msg in res.output, (args, res.output)


LLAMA_TINY_PLANS = ("1f1b", "interleaved-1f1b", "zb-h1")


@pytest.mark.slow
@pytest.mark.parametrize("schedule", LLAMA_TINY_PLANS)
def test_llama_tiny_four_processes_match_one(tmp_path, schedule):
    """The issue's figure: the planner's llama-tiny plan on cpu4x2 (data parallel meshes) as 4
    processes gives the single-process losses within 1e-6."""
    from click.testing import CliRunner

    from mpmd.cli.main import main

    path = tmp_path / "p.json"
    res = CliRunner().invoke(main, ["plan", "--model", "llama-tiny", "--cluster",
                                    "hardware_profiles/clusters/cpu4x2.yaml", "--global-batch", "8",
                                    "--schedule", schedule, "--max-tensor", "1", "--no-fsdp",
                                    "--out", str(path)])
    assert res.exit_code == 0, res.output
    r = launch(path, 4, steps=2, trace_path=tmp_path / "t.json", timeout_s=900)
    ref = run_plan(path, steps=2, simulate=False)
    assert np.allclose(r.losses, ref.losses, rtol=0, atol=1e-6), (r.losses, ref.losses)
    assert r.order_mismatches == () and r.order == ref.executed_order
    assert (tmp_path / "t.json").exists()


def test_a_failing_worker_fails_the_launch_in_one_line(tmp_path):
    """Workers that fail after joining jax.distributed (here: a bad model override, raised while
    compiling) stop the run promptly with one line naming a process and its error."""
    path = _plan_file(tmp_path, "1f1b", layers=4, global_batch=4, seq_len=16)
    t = time.monotonic()
    with pytest.raises(LaunchError, match=r"^process [01] of 2 failed \(exit 2\): ZooError: unknown "
                                          r"ModelConfig field\(s\) \['bogus'\]"):
        launch(path, 2, steps=1, model_overrides={**TINY, "bogus": 1}, timeout_s=120)
    assert time.monotonic() - t < 90


def test_launcher_relays_step_lines_from_every_worker(tmp_path):
    from runtime.train.launch import _Progress

    class Console:
        lines: list = []

        def print(self, line, highlight=True):
            self.lines.append(line)

    a, b = tmp_path / "process0.out", tmp_path / "process1.out"
    a.write_text("[Gloo] Rank 0 is connected to 1 peer ranks\n")
    b.write_text("step 0: loss 5.5900  process step 12.0 ms\nstep 1: lo")
    con = Console()
    relay = _Progress([a, b, tmp_path / "process2.out"], con)
    relay()
    assert con.lines == ["step 0: loss 5.5900  process step 12.0 ms"]
    with open(b, "a") as f:
        f.write("ss 4.5190  process step 11.0 ms\n")
    relay()
    assert con.lines[1:] == ["step 1: loss 4.5190  process step 11.0 ms"]


def test_a_worker_dies_with_its_launcher():
    """A worker sets PR_SET_PDEATHSIG itself: when the launcher process is killed, so is it."""
    import os
    import signal

    child = ("import os, sys, time; from runtime.train.launch import _die_with_parent; "
             "_die_with_parent(os.getppid()); print('armed', flush=True); time.sleep(60)")
    parent = ("import subprocess, sys, time; "
              f"c = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.PIPE); "
              "c.stdout.readline(); print(c.pid, flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        worker = int(p.stdout.readline())
        os.kill(worker, 0)               # alive while its launcher lives
    finally:
        p.kill()
        p.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(worker, signal.SIGKILL)
        pytest.fail(f"worker {worker} outlived its launcher")


def test_single_process_run_writes_the_last_steps_trace(tmp_path, monkeypatch):
    """``mpmd run PLAN --trace FILE`` without --processes: the last step's timeline as a trace
    (run_plan is replaced by a stub report here; the trace writer is the simulator's)."""
    from click.testing import CliRunner

    import runtime.train.run as run_mod
    from mpmd.cli.main import main

    ev = lambda n, s: TimelineEvent(n, "F", "m0/compute", "m0", 0, 0, s, s + 0.5)  # noqa: E731
    report = SimpleNamespace(timelines=(Timeline((ev("F0.0", 0.0),)), Timeline((ev("F0.1", 1.0),))))
    monkeypatch.setattr(run_mod, "run_plan", lambda *a, **k: report)
    monkeypatch.setattr(run_mod, "print_report", lambda *a, **k: None)
    trace = tmp_path / "t.json"
    res = CliRunner().invoke(main, ["run", str(_plan_file(tmp_path, "1f1b")), "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    xs = [e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["ts"], e["dur"]) for e in xs] == [("F0.1", 1e6, 0.5e6)]
