"""Plans carved from node groups and data-parallel plans, end to end through every consumer:
``load_plan`` (round trip, one-line errors for a malformed ``parts`` or ``carving``), ``mpmd
simulate`` (per-mesh table, per-part lines, the sync, the trace), ``mpmd plan``'s table, ``mpmd
run`` (the carved cluster; a data-parallel plan refused in one line) and the what-if report.

The plans are built by hand (no planner) for llama-tiny on a node-group cluster written per test
module: 4 DGX H100 nodes and 2 DGX A100 nodes. Part 1 carves the H100s into 2 meshes of 2 nodes
(2 pipeline replicas each), part 2 the A100s one mesh per node.
"""

from __future__ import annotations

import importlib
import json
import re
import tempfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from zoo.costing import workload
from ir import (DataParallelPlan, IRError, Layout, Plan, Prediction, SearchReport, StagePlan,
                any_plan_to_json)
from ir.plan_file import load_plan
from hardware_profiles import load_cluster
from mpmd.cli.main import main
from tests.cli.test_mutation import check, mutated
from simulator.plan_sim import plan_cluster, simulate_any, simulate_data_parallel
from simulator.schedules import generate

CLUSTER = """
name: dgx6
node_groups:
- name: h100
  device: h100-sxm
  nodes: 4
  devices_per_node: 8
  scale_out_link: {latency_us: 5, source: 'test: one 400 Gb/s NIC per GPU'}
- name: a100
  device: a100-80gb-sxm
  nodes: 2
  devices_per_node: 8
  scale_out_link: {bandwidth_gbit_per_s: 200, latency_us: 5, source: 'test: HDR'}
group_links:
- {between: [h100, a100], bandwidth_gbit_per_s: 800, latency_us: 10, source: 'test: fabric'}
"""
SYNC_LINK, SYNC_BYTES, SYNC_S = "h100.0<->a100.0", 4e8, 0.01


def run(args) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


def cells(line: str) -> list[str]:
    """The cells of a rich table row (``│ a │ b │``)."""
    return [c.strip() for c in line.strip().strip("│").split("│")]


def rows_of(text: str, first: str) -> dict[str, list[str]]:
    """Table rows whose first cell matches ``first``, by that cell."""
    out = {}
    for ln in text.splitlines():
        if ln.startswith("│"):
            c = cells(ln)
            if re.fullmatch(first, c[0]):
                out[c[0]] = c
    return out


def one_line(res, *needles: str) -> str:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def part(cluster_path: str, meshes, share: int, microbatches: int, carving: dict, device: str,
         per_mesh: int) -> Plan:
    n = len(meshes)
    bounds = [0] + [round(10 * (i + 1) / n) for i in range(n)]
    return Plan(model="llama-tiny", cluster="dgx6", cluster_path=cluster_path,
                stages=tuple(StagePlan(i, bounds[i], bounds[i + 1], m) for i, m in enumerate(meshes)),
                layouts={m: Layout(per_mesh, 1) for m in meshes},
                schedule=generate("1f1b", n, microbatches), rank_mesh=tuple(meshes),
                merge_last_stage=False, global_batch=share, seq_len=128,
                devices={m: (device, per_mesh) for m in meshes}, recompute={m: False for m in meshes},
                carving=(carving,),
                schedules=({"schedule": "1f1b", "microbatches": microbatches, "step_time_s": 0.5},
                           {"schedule": "gpipe", "microbatches": microbatches, "step_time_s": 0.6},
                           {"schedule": "zb-h1", "microbatches": microbatches, "step_time_s": None}))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("shaped")
    c = d / "dgx6.yaml"
    c.write_text(CLUSTER)
    h100 = part(str(c), ["h100.0", "h100.1"], 48, 3,
                {"group": "h100", "nodes": 4, "nodes_per_mesh": 2, "meshes_per_node": 1}, "h100-sxm", 16)
    a100 = part(str(c), ["a100.0", "a100.1"], 16, 2,
                {"group": "a100", "nodes": 2, "nodes_per_mesh": 1, "meshes_per_node": 1},
                "a100-80gb-sxm", 8)
    dp = DataParallelPlan("llama-tiny", "dgx6", 64, 128, (h100, a100), SYNC_LINK, SYNC_BYTES, SYNC_S,
                          cluster_path=str(c), reason="the A100s take a quarter of the batch")
    w = workload("llama-tiny", 64)
    lc = plan_cluster(dp, load_cluster(c))
    step = simulate_data_parallel(dp, w, lc).step_time_s
    dp = replace(dp, predicted=Prediction(step), search=SearchReport("OPTIMAL"))
    one_step = simulate_any(h100, replace(w, global_batch=48), lc).step_time_s
    h100 = replace(h100, predicted=Prediction(one_step))
    paths = {"cluster": c, "dp": d / "dp.json", "carved": d / "carved.json"}
    paths["dp"].write_text(json.dumps(any_plan_to_json(dp)))
    paths["carved"].write_text(json.dumps(any_plan_to_json(h100)))
    return SimpleNamespace(dp_plan=dp, carved_plan=h100, w=w, lc=lc, **paths)


# ----------------------------------------------------------------------------- plan files
def test_both_kinds_round_trip_through_load_plan(files):
    dp = load_plan(files.dp)
    assert isinstance(dp, DataParallelPlan) and dp == files.dp_plan
    carved = load_plan(files.carved)
    assert isinstance(carved, Plan) and carved == files.carved_plan
    assert carved.carving == ({"group": "h100", "nodes": 4, "nodes_per_mesh": 2, "meshes_per_node": 1},)
    assert carved.replicas == {"h100.0": 2, "h100.1": 2}
    assert carved.schedules[2] == {"schedule": "zb-h1", "microbatches": 3, "step_time_s": None}


def test_written_plans_follow_the_strict_schema(files):
    from mpmd.cli.output import validate_plan_json

    doc = json.loads(files.dp.read_text())
    doc["predicted"] = {"step_time_s": 1.0, "mfu": 0.4}
    validate_plan_json(doc)
    import jsonschema

    with pytest.raises(jsonschema.ValidationError):
        validate_plan_json(json.loads(files.carved.read_text()))   # written without the planner's records


def _edit(files, tmp_path, which: str, fn) -> Path:
    doc = json.loads(getattr(files, which).read_text())
    fn(doc)
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc))
    return p


BAD_DOCS = {
    "parts not a list": ("dp", lambda d: d.update(parts={"x": 1}),
                         "plan field parts = {'x': 1} fails 'type: 'array''"),
    "no parts": ("dp", lambda d: d.update(parts=[]), "plan field parts = [] fails 'minItems: 1'"),
    "part lacks its schedule": ("dp", lambda d: d["parts"][1].pop("schedule"),
                                "plan field parts[1] lacks the key 'schedule'"),
    "shares do not sum": ("dp", lambda d: d["parts"][0].update(global_batch=40),
                          "plan field global_batch = 64; fix: the parts' batch shares [40, 16] sum to 56"),
    "two parts share a mesh": ("dp", lambda d: d["parts"][1]["meshes"].update(
        {"h100.0": d["parts"][1]["meshes"]["a100.0"]}),
        "plan field parts[1].meshes.'h100.0' = 'h100.0'; fix: the carving makes meshes ['a100.0', 'a100.1']"),
    "part of another model": ("dp", lambda d: d["parts"][1].update(model="llama3-8b"),
                              "plan field parts[1].model = 'llama3-8b'; fix: every part runs the "
                              "plan's model"),
    "sync lacks seconds": ("dp", lambda d: d["sync"].pop("seconds"),
                           "plan field sync lacks the key 'seconds'"),
    "markup in the sync link": ("dp", lambda d: d["sync"].update(link="[/]"),
                                "plan field sync.link = '[/]'; fix: name a link A<->B"),
    "carving not a list": ("carved", lambda d: d.update(carving="h100"),
                           "plan field carving = 'h100' fails 'type: 'array''"),
    "carving entry lacks nodes": ("carved", lambda d: d["carving"][0].pop("nodes"),
                                  "plan field carving[0] lacks the key 'nodes'"),
    "nodes not a multiple": ("carved", lambda d: d["carving"][0].update(nodes=3),
                             "plan field carving[0].nodes = 3; fix: use a multiple of nodes_per_mesh 2"),
    "group carved twice": ("carved", lambda d: d["carving"].append(dict(d["carving"][0])),
                           "plan field carving[1].group = 'h100'; fix: shape each node group once"),
    "mesh the carving does not make": ("carved", lambda d: d["carving"][0].update(nodes=2),
                                       "plan field meshes.'h100.1' = 'h100.1'; fix: the carving makes "
                                       "meshes ['h100.0']"),
    "unknown node group": ("carved", lambda d: d["carving"][0].update(group="h200"),
                           "plan field meshes.'h100.0' = 'h100.0'; fix: the carving makes meshes "
                           "['h200.0', 'h200.1']"),
    "cluster path too long": ("dp", lambda d: d.update(cluster_path="/tmp/" + "9" * 300 + "/c.yaml"),
                              "plan field cluster_path = '/tmp/999"),
    "part's cluster path too long": ("dp", lambda d: d["parts"][0].update(cluster_path="x" * 5000),
                                     "plan field parts[0].cluster_path = 'xxx"),
    "surrogate in the cluster path": ("carved", lambda d: d.update(cluster_path="/tmp/\ud800.yaml"),
                                      "plan field cluster_path = '/tmp/\\ud800.yaml'"),
    "NUL in the cluster path": ("carved", lambda d: d.update(cluster_path="/tmp/\x00.yaml"),
                                "plan field cluster_path = '/tmp/\\x00.yaml'"),
    "huge carving": ("carved", lambda d: d["carving"][0].update(nodes=10**9),
                     "plan field carving[0].nodes = 1000000000; fix: use at most 1048576"),
}


@pytest.mark.parametrize("case", sorted(BAD_DOCS))
def test_malformed_parts_and_carving_are_one_line(files, tmp_path, case):
    which, fn, needle = BAD_DOCS[case]
    p = _edit(files, tmp_path, which, fn)
    with pytest.raises(IRError) as e:
        load_plan(p)
    assert "\n" not in str(e.value) and str(e.value).startswith(f"{p}: ") and needle in str(e.value), e.value
    trace = tmp_path / "t.json"
    one_line(run(["simulate", p, "--trace", trace]), needle)
    assert not trace.exists()


def test_carving_that_does_not_fit_the_cluster_is_one_line(files, tmp_path):
    """More nodes than the group has: the plan file is well formed, the cluster refuses it."""
    def more(d):
        d["carving"][0].update(nodes=6)
        d["carving"][0].update(nodes_per_mesh=3)
    one_line(run(["simulate", _edit(files, tmp_path, "carved", more)]),
             "does not fit node group 'h100' (4 nodes of 8)")


def _listing(name: str) -> str:
    return str(Path(f"hardware_profiles/clusters/{name}.yaml").resolve())


def test_carved_plan_on_a_mesh_listing_cluster_is_one_line(files, tmp_path):
    """A listing that describes no node groups (meshes sharing a host) cannot be carved; a listing
    of whole nodes is carved as its node groups, named after their devices."""
    p = _edit(files, tmp_path, "carved", lambda d: d.update(cluster_path=_listing("cpu4x2")))
    one_line(run(["simulate", p]), "lists meshes, not node groups; it cannot be carved: mesh 'm0' "
                                   "shares host 'local' with other meshes; fix: re-plan")
    p = _edit(files, tmp_path, "carved", lambda d: d.update(cluster_path=_listing("h100x64")))
    one_line(run(["simulate", p]), "has no node group 'h100'; fix: use one of ['h100-sxm']")


def test_plan_of_a_mesh_listing_is_shaped_and_every_consumer_carves_it(tmp_path):
    """``mpmd plan`` on h100x64.yaml (8 meshes of one DGX H100 each) shapes the nodes; ``mpmd
    simulate`` and ``mpmd run`` carve the same listing into the same meshes."""
    from runtime.train.step import run_cluster

    out = tmp_path / "plan.json"
    res = run(["plan", "--model", "llama-tiny", "--cluster", _listing("h100x64"), "--global-batch", "16",
               "--seq-len", "128", "--time-limit", "5", "--out", out])
    assert res.exit_code == 0, res.output
    assert "meshes carved from node groups: h100-sxm: " in res.output and "of 8 nodes" in res.output
    plan = load_plan(out)
    assert [c["group"] for c in plan.carving] == ["h100-sxm"] and plan.cluster == "h100x64"
    assert all(m.startswith("h100-sxm.") for m in plan.rank_mesh)
    assert set(plan.rank_mesh) <= set(run_cluster(plan, _listing("h100x64")).meshes)
    res = run(["simulate", out])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if "planner predicted" in ln)
    assert abs(float(line.split("(")[-1].split("%")[0])) <= 1.0, line


# ----------------------------------------------------------------------------- mpmd simulate
def test_simulate_carved_plan(files, tmp_path):
    trace = tmp_path / "trace.json"
    res = run(["simulate", files.carved, "--trace", trace])
    assert res.exit_code == 0, res.output
    r = simulate_any(files.carved_plan, replace(files.w, global_batch=48), files.lc)
    rows = rows_of(res.output, r"h100\.\d")
    assert set(rows) == {"h100.0", "h100.1"}
    for m in rows:
        assert rows[m] == [m, f"{r.busy_s[m]:.3f}", f"{r.bubble[m] * 100:.1f}%",
                           f"{r.peak_memory_bytes[m] / 1e9:.1f}",
                           f"{files.lc.meshes[m].device.memory_bytes / 1e9:.1f}"]
    assert f"step time {r.step_time_s:.4f} s" in res.output
    assert "planner predicted" in res.output and "(+0.00%)" in res.output
    assert json.loads(trace.read_text())["traceEvents"]


def test_simulate_data_parallel_plan(files, tmp_path):
    trace = tmp_path / "trace.json"
    res = run(["simulate", files.dp, "--trace", trace])
    assert res.exit_code == 0, res.output
    r = simulate_data_parallel(files.dp_plan, files.w, files.lc)
    out = res.output
    assert "llama-tiny on dgx6: data parallel over 2 pipelines, global batch 64" in out
    rows = {cells(ln)[1]: cells(ln) for ln in out.splitlines() if re.match(r"│ [12] ", ln)}
    assert {m: rows[m][0] for m in rows} == {"h100.0": "1", "h100.1": "1", "a100.0": "2", "a100.1": "2"}
    for m in rows:
        assert rows[m][2:4] == [f"{r.busy_s[m]:.3f}", f"{r.bubble[m] * 100:.1f}%"]
        assert rows[m][4:] == [f"{r.peak_memory_bytes[m] / 1e9:.1f}",
                               f"{files.lc.meshes[m].device.memory_bytes / 1e9:.1f}"]
    p1, p2 = r.extra["parts"]
    assert (f"part 1: 48 of 64 samples, 1f1b x 3 microbatches on h100.0, h100.1: pipeline and its "
            f"gradient all-reduce done at {p1['pipeline_s']:.4f} s") in out
    assert (f"part 2: 16 of 64 samples, 1f1b x 2 microbatches on a100.0, a100.1: pipeline and its "
            f"gradient all-reduce done at {p2['pipeline_s']:.4f} s") in out
    s0 = max(p1["pipeline_s"], p2["pipeline_s"])
    assert (f"sync: gradient all-reduce across parts, 0.40 GB over {SYNC_LINK} in 0.0100 s, "
            f"{s0:.4f}-{s0 + SYNC_S:.4f} s; then every mesh runs its optimizer") in out
    assert "reason: the A100s take a quarter of the batch" in out
    assert f"step time {r.step_time_s:.4f} s   MFU {r.mfu * 100:.1f}%   planner predicted" in out
    assert "(+0.00%)" in out
    ev = json.loads(trace.read_text())["traceEvents"]
    sync = [e for e in ev if e.get("ph") == "X" and e["cat"] == "allreduce"
            and e["name"].startswith("gradient")]
    assert len(sync) == 1 and sync[0]["ts"] == pytest.approx(s0 * 1e6)


def test_simulate_data_parallel_knobs(files):
    res = run(["simulate", files.dp, "--degrade-link", f"a100.0<->h100.0=0.5"])
    assert res.exit_code == 0, res.output
    base = simulate_data_parallel(files.dp_plan, files.w, files.lc).step_time_s
    assert f"step time {base + SYNC_S:.4f} s" in res.output
    assert "in 0.0200 s (planned 0.0100 s)" in res.output
    res = run(["simulate", files.dp, "--straggler", "a100.1=2", "--jitter", "0.05"])
    assert res.exit_code == 0, res.output
    one_line(run(["simulate", files.dp, "--straggler", "h100.7=2"]), "'h100.7' is not a mesh of the plan")
    one_line(run(["simulate", files.dp, "--microbatches", "3"]),
             "part 2 of the data-parallel plan: --microbatches 3 does not divide the global batch 16")
    res = run(["simulate", files.dp, "--schedule", "gpipe"])
    assert res.exit_code == 0 and "planner predicted" not in res.output, res.output


# ----------------------------------------------------------------------------- mpmd plan's table
def _prediction(step: float, meshes) -> SimpleNamespace:
    return SimpleNamespace(step_time_s=step, mfu=0.4, tokens_per_s=64 * 128 / step,
                           samples_per_s=64 / step, roofline_step_time_s=step / 3,
                           bubble={m: 0.25 for m in meshes}, peak_memory_bytes={m: 2e9 for m in meshes},
                           capacity_bytes={m: 80e9 for m in meshes}, stage_time_s=(0.01, 0.02), fits=True)


def _table(result, files) -> str:
    from mpmd.cli.output import plan_table

    con = Console(width=220, record=True)
    con.print(plan_table(result, load_cluster(files.cluster)))
    return con.export_text()


def test_plan_table_of_a_carved_plan(files):
    pred = _prediction(0.5, ["h100.0", "h100.1"])
    text = _table(SimpleNamespace(plan=files.carved_plan, prediction=pred), files)
    assert "meshes carved from node groups: h100: 2 x (2 nodes x 8) of 4 nodes" in text
    assert re.search(r"h100\.0 +│ nodes 0-1 \(2 x 8 h100-sxm\) +│ +16 │ dp16xtp1", text), text
    assert re.search(r"h100\.1 +│ nodes 2-3 \(2 x 8 h100-sxm\) +│ +16 │ dp16xtp1", text), text
    assert re.search(r"│ 0 +│ 0-4 +│ h100\.0 +│ 16x h100-sxm +│ dp16xtp1 +│ +10\.00 │ +2\.0 / 80\.0",
                     text), text
    assert "schedule candidates of this shape (contention-free estimates" in text
    assert re.search(r"gpipe +│ +3 │ +0\.6 │ +\+20\.0%", text) and "does not fit" in text
    assert "step time" in text and "0.500 s" in text


def test_plan_table_of_a_data_parallel_plan(files):
    meshes = ["h100.0", "h100.1", "a100.0", "a100.1"]
    pred = SimpleNamespace(step_time_s=0.7, mfu=0.3, tokens_per_s=1000.0, samples_per_s=90.0,
                           roofline_step_time_s=0.2, bubble={m: 0.1 for m in meshes},
                           peak_memory_bytes={m: 3e9 for m in meshes},
                           capacity_bytes={m: 80e9 for m in meshes}, stage_time_s=(), fits=True)
    text = _table(SimpleNamespace(plan=files.dp_plan, prediction=pred), files)
    assert "part 1 of 2, 48 of 64 samples (75%), 1f1b x 3 microbatches of 16" in text
    assert "part 2 of 2, 16 of 64 samples (25%), 1f1b x 2 microbatches of 8" in text
    assert "meshes carved from node groups: a100: 2 x (1 node x 8) of 2 nodes" in text
    assert re.search(r"a100\.1 +│ node 1 \(8 a100-80gb-sxm\) +│ +8 │ dp8xtp1", text), text
    assert "2 pipelines, batch shares 48 + 16 = 64 samples" in text
    assert f"0.40 GB over {SYNC_LINK} in 10.0 ms, before the optimizer" in text
    assert "the A100s take a quarter of the batch" in text
    assert re.search(r"step time +│ +0\.700 s", text) and "30.0%" in text and "10.0%" in text
    assert re.search(r"objective +│ +0\.700 s: the step time above \(chosen: OPTIMAL\)", text), text
    fitted = r"calibrated \(fitted by `mpmd validate --fit` on \d+ rows, MAPE [0-9.]+%\)"
    prior = r"prior \(never fitted: predictions may be off by \+/-20%\)"
    line = next(ln for ln in text.splitlines() if ln.startswith("profiles: "))
    assert re.fullmatch(rf"profiles: h100-sxm ({prior}|{fitted}); a100-80gb-sxm {fitted}",
                        line.rstrip()), line


def test_plan_table_says_which_profiles_are_priors():
    """One line under the step table: per device kind in pipeline order, calibrated (with its
    fit) or a prior (with its uncertainty); a kind used twice is named once."""
    from mpmd.cli.output import plan_table
    from tests.planner.conftest import cluster, device

    pri = device("pri", 400.0, 80.0)
    cal = replace(device("cal", 400.0, 80.0), sources={"matmul_efficiency": (
        "fitted by `mpmd validate --fit` over the 6 cal rows of the published-training CSV: "
        "MAPE 4.1%, 0 zero-bubble groups ranked wrongly (fitted)")})
    c = cluster([("c0", cal, 2), ("p0", pri, 2), ("c1", cal, 2)])
    meshes = ("c0", "p0", "c1")
    p = Plan(model="toy", cluster="toy", stages=tuple(StagePlan(i, 4 * i, 4 * i + 4, m)
                                                     for i, m in enumerate(meshes)),
             layouts={m: Layout(2, 1) for m in meshes}, schedule=generate("1f1b", 3, 3),
             rank_mesh=meshes, merge_last_stage=False, global_batch=6, seq_len=1024,
             devices={m: (c.meshes[m].device.name, 2) for m in meshes},
             recompute={m: False for m in meshes})
    con = Console(width=220, record=True)
    con.print(plan_table(SimpleNamespace(plan=p, prediction=_prediction(0.5, meshes)), c))
    lines = con.export_text().splitlines()
    i = lines.index("profiles: cal calibrated (fitted by `mpmd validate --fit` on 6 rows, MAPE 4.1%); "
                    "pri prior (never fitted: predictions may be off by +/-20%)")
    assert lines[i - 1].startswith("└")                    # right under the step table


def test_plan_command_writes_a_data_parallel_plan(files, tmp_path, monkeypatch):
    """``mpmd plan`` with the planner stubbed to return the data-parallel plan: the table, and
    the JSON written with any_plan_to_json, reading back equal."""
    import planner

    pred = _prediction(0.7, ["h100.0", "h100.1", "a100.0", "a100.1"])
    dp = replace(files.dp_plan, predicted=Prediction(0.7),
                 search=SearchReport("OPTIMAL", candidates=3, candidates_total=3, search_wall_s=1.0))
    monkeypatch.setattr(planner, "plan", lambda *a, **k: SimpleNamespace(plan=dp, prediction=pred,
                                                                          interrupted=False))
    out = tmp_path / "plan.json"
    res = run(["plan", "--model", "llama-tiny", "--cluster", files.cluster, "--global-batch", "64",
               "--out", out])
    assert res.exit_code == 0, res.output
    assert "2 pipelines, batch shares 48 + 16 = 64 samples" in res.output
    assert load_plan(out) == dp


# ----------------------------------------------------------------------------- mpmd run
def test_run_loads_the_carved_cluster(files):
    from runtime.train.step import run_cluster

    c = run_cluster(files.carved_plan, files.cluster)
    assert list(c.meshes) == ["h100.0", "h100.1"] and c.meshes["h100.0"].num_devices == 16
    assert list(run_cluster(replace(files.carved_plan, carving=()), files.cluster).meshes) == [
        "h100.0", "h100.1", "h100.2", "h100.3", "a100.0", "a100.1"]


def test_run_of_a_data_parallel_plan_too_big_for_this_host_is_one_line(files):
    """Data-parallel plans run (tests/runtime/test_run_layouts.py); this one's cluster has 48
    devices, more than the 8 CPU devices here: one line naming the count and the fix."""
    one_line(run(["run", files.dp, "--steps", "1"]),
             "cluster 'dgx6' needs 48 devices and this host's JAX has 8",
             "not this host; fix: plan for a cluster of at most 8 devices")


# ----------------------------------------------------------------------------- what-if report
def test_whatif_reports_a_data_parallel_plan(files, monkeypatch, tmp_path):
    """The report replays the plan on the carved cluster and shows its shape."""
    wi = importlib.import_module("reports.whatif")    # reports.whatif is also the function
    from reports.render import summary_table, to_html, to_markdown

    pred = _prediction(0.7, ["h100.0", "h100.1", "a100.0", "a100.1"])
    monkeypatch.setattr(wi, "run_plan", lambda *a, **k: SimpleNamespace(plan=files.dp_plan, prediction=pred))
    df = wi.whatif("llama-tiny", [str(files.cluster)], global_batch=64, seq_len=128, tokens=1e9)
    r = df.iloc[0]
    sim = simulate_data_parallel(files.dp_plan, files.w, files.lc)
    assert r["feasible"] and r["step_time_s"] == pytest.approx(sim.step_time_s, rel=1e-12)
    assert r["pipelines"] == 2 and r["carved"] and r["microbatches"] == 5 and r["stages"] == 4
    assert r["schedule"] == "1f1b x 3 | 1f1b x 2"
    assert r["shape"] == ("48 samples: h100: 2 x (2 nodes x 8), dp16 | "
                          "16 samples: a100: 2 x (1 node x 8), dp8")
    assert r["tokens_per_s"] == pytest.approx(64 * 128 / sim.step_time_s, rel=1e-12)
    t = summary_table(df)
    assert t.iloc[0]["Shape"] == r["shape"]
    assert t.iloc[0]["Plan"] == ("data parallel over 2 pipelines: part 1: 2 meshes: 2 x h100-sxm(16) "
                                 "DP16xTP1 | part 2: 2 meshes: 2 x a100-80gb-sxm(8) DP8xTP1; schedules "
                                 "1f1b x 3 | 1f1b x 2, 4 stages in all")
    assert r["shape"].replace("|", "\\|") in to_markdown(df)
    html = to_html(df)
    assert "data parallel over 2 pipelines, schedules 1f1b x 3 | 1f1b x 2, 4 stages in all" in html
    assert "shape: 48 samples: h100: 2 x (2 nodes x 8), dp16 | 16 samples" in html


def test_whatif_reports_a_carved_plan(files, monkeypatch):
    wi = importlib.import_module("reports.whatif")    # reports.whatif is also the function
    from reports.render import summary_table

    plan = replace(files.carved_plan, global_batch=64)
    pred = _prediction(0.5, ["h100.0", "h100.1"])
    monkeypatch.setattr(wi, "run_plan", lambda *a, **k: SimpleNamespace(plan=plan, prediction=pred))
    df = wi.whatif("llama-tiny", [str(files.cluster)], global_batch=64, seq_len=128)
    r = df.iloc[0]
    assert r["pipelines"] == 1 and r["carved"] and r["shape"] == "h100: 2 x (2 nodes x 8), dp16"
    assert r["step_time_s"] == pytest.approx(simulate_any(plan, files.w, files.lc).step_time_s, rel=1e-12)
    t = summary_table(df)
    assert t.iloc[0]["Shape"] == "h100: 2 x (2 nodes x 8), dp16"
    assert t.iloc[0]["Plan"] == "2 meshes: 2 x h100-sxm(16) DP16xTP1; 1f1b x 3 microbatches, 2 stages"


def test_a_data_parallel_plan_with_nothing_to_sync_loads(files, tmp_path):
    """Forward-only parts have no gradients: the planner writes an empty sync link."""
    p = _edit(files, tmp_path, "dp", lambda d: d["sync"].update(link="", seconds=0.0))
    assert load_plan(p).sync_link == ""


# ----------------------------------------------------------------------------- mutated files
@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_mutated_shaped_plans_give_output_or_one_line(files, data):
    """Property (as tests/cli/test_mutation.py for plan files): a mutated data-parallel or carved
    plan file either simulates, with a trace, or fails in one line, exit 2, writing nothing."""
    src = data.draw(st.sampled_from([files.dp, files.carved]))
    text = json.dumps(json.loads(src.read_text()), indent=1).encode()   # lines to mutate
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        f = d / "plan.json"
        f.write_bytes(data.draw(mutated(text)))
        out_dir = d / "out"
        out_dir.mkdir()
        trace = out_dir / "trace.json"
        res = CliRunner().invoke(main, ["simulate", str(f), "--trace", str(trace)])
        check(res, [trace], out_dir, valid=lambda: json.loads(trace.read_text())["traceEvents"])


# ----------------------------------------------------------------------------- the planner (slow)
@pytest.mark.slow
def test_planned_shape_simulates_as_predicted(tmp_path):
    """``mpmd plan`` on two node groups of similar speed (where the planner, as of writing, splits
    the batch over one pipeline per group), then ``mpmd simulate``: within 1% of the prediction,
    whichever shape it chose."""
    c = tmp_path / "hh.yaml"
    c.write_text(CLUSTER.replace("a100-80gb-sxm", "h200-sxm").replace("nodes: 4", "nodes: 2")
                 .replace("name: a100", "name: h200").replace("[h100, a100]", "[h100, h200]"))
    out = tmp_path / "plan.json"
    res = run(["plan", "--model", "llama3-8b", "--cluster", c, "--global-batch", "128",
               "--seq-len", "2048", "--time-limit", "60", "--out", out])
    assert res.exit_code == 0, res.output
    plan = load_plan(out)
    assert plan.carving
    res = run(["simulate", out])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if "planner predicted" in ln)
    assert abs(float(line.split("(")[-1].split("%")[0])) <= 1.0, line
