"""Chrome / Perfetto trace export: valid JSON, one process per mesh and per link, exact events."""

from __future__ import annotations

import json
import os

from simulator.engine import simulate
from simulator.program import SimOp, SimProgram, SimTransfer
from simulator.trace import to_chrome_trace, write_chrome_trace


def _result():
    ops = (SimOp(0, "F0.0", "F", "a", 0, 0, 1.0, alloc_bytes=4.0),
           SimOp(1, "F1.0", "F", "b", 1, 0, 2.0, inputs=(0,)),
           SimOp(2, "B0.0", "B", "a", 0, 0, 0.5, deps=(1,), free_bytes=4.0))
    trs = (SimTransfer(0, "A0.0", 0, "a", "b", "a<->b", 64.0, 0.25),)
    prog = SimProgram(meshes=("a", "b"), order={"a": (0, 2), "b": (1,)}, ops=ops, transfers=trs,
                      baseline_bytes={"a": 1.0, "b": 2.0})
    return simulate(prog)


def test_chrome_trace_layout_and_units():
    tr = to_chrome_trace(_result().timeline)
    evs = tr["traceEvents"]
    names = {e["args"]["name"]: e["pid"] for e in evs if e["ph"] == "M"
             and e["name"] == "process_name"}
    assert names == {"a": 1, "b": 2, "link:a<->b": 3}
    threads = sorted((e["pid"], e["tid"], e["args"]["name"]) for e in evs
                     if e["ph"] == "M" and e["name"] == "thread_name")
    assert threads == [(1, 1, "compute"), (1, 2, "send"), (2, 1, "compute"), (2, 3, "recv"),
                       (3, 1, "link")]
    xs = sorted((e["pid"], e["tid"], e["name"], e["ts"], e["dur"]) for e in evs if e["ph"] == "X")
    assert xs == [(1, 1, "B0.0", 3.25e6, 0.5e6), (1, 1, "F0.0", 0.0, 1e6),
                  (1, 2, "A0.0", 1e6, 0.25e6), (2, 1, "F1.0", 1.25e6, 2e6),
                  (2, 3, "A0.0", 1e6, 0.25e6), (3, 1, "A0.0", 1e6, 0.25e6)]
    cs = [(e["pid"], e["ts"], e["args"]["bytes"]) for e in evs if e["ph"] == "C"]
    assert cs == [(1, 0.0, 1.0), (1, 0.0, 5.0), (1, 3.75e6, 1.0), (2, 0.0, 2.0)]
    assert {e["cat"] for e in evs if e["ph"] == "X"} == {"F", "B", "transfer"}


def test_write_chrome_trace_is_valid_json_and_atomic(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text("old")
    write_chrome_trace(_result().timeline, path)
    data = json.loads(path.read_text())
    assert len([e for e in data["traceEvents"] if e["ph"] == "X"]) == 6
    assert os.listdir(tmp_path) == ["trace.json"]   # no temp file left behind
