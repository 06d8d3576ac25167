"""``mpmd plan`` and ``mpmd simulate`` on bad input: one line, exit status 2, no output file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mpmd.cli.main import main

CLUSTERS = Path(__file__).resolve().parents[2] / "hardware_profiles" / "clusters"

GOOD_MESH = """
  - name: a
    device: h100-sxm
    num_devices: 8
    axes: {data: 8}
"""


def run(args: list[str]):
    return CliRunner().invoke(main, args)


def cluster_file(tmp_path: Path, meshes: str, links: str = "") -> str:
    p = tmp_path / "c.yaml"
    p.write_text(f"name: c\nmeshes:{meshes}\n{links}")
    return str(p)


def assert_clean_failure(res, out: Path, *needles: str) -> None:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert "Traceback" not in res.output
    for n in needles:
        assert n in lines[0], lines[0]
    assert not out.exists()


@pytest.mark.parametrize("case,meshes,links,needles", [
    ("unknown device", GOOD_MESH.replace("h100-sxm", "h900"), "", ("h900",)),
    ("axes do not multiply", GOOD_MESH.replace("{data: 8}", "{data: 3}"), "", ("multiply", "8")),
    ("zero bandwidth", GOOD_MESH + GOOD_MESH.replace("name: a", "name: b"),
     "links:\n  - {between: [a, b], bandwidth_gbit_per_s: 0, latency_us: 5}", ("bandwidth",)),
])
def test_bad_cluster(tmp_path, case, meshes, links, needles):
    out = tmp_path / "plan.json"
    res = run(["plan", "--model", "llama3-8b", "--cluster", cluster_file(tmp_path, meshes, links),
               "--out", str(out)])
    assert_clean_failure(res, out, *needles)


def test_missing_cluster_file(tmp_path):
    out = tmp_path / "plan.json"
    res = run(["plan", "--model", "llama3-8b", "--cluster", str(tmp_path / "nope.yaml"),
               "--out", str(out)])
    assert_clean_failure(res, out, "nope.yaml")


def test_malformed_cluster_file(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("meshes: [ {name: a, device: h100-sxm\n")
    out = tmp_path / "plan.json"
    assert_clean_failure(run(["plan", "--model", "llama3-8b", "--cluster", str(p), "--out", str(out)]),
                         out, "bad.yaml")


def test_unknown_model(tmp_path):
    out = tmp_path / "plan.json"
    res = run(["plan", "--model", "llama9-1t", "--cluster", str(CLUSTERS / "h100x1.yaml"),
               "--out", str(out)])
    assert_clean_failure(res, out, "llama9-1t")


def test_model_that_does_not_fit_names_mesh_and_bytes(tmp_path):
    out = tmp_path / "plan.json"
    res = run(["plan", "--model", "llama3-70b", "--cluster", str(CLUSTERS / "h100x1.yaml"),
               "--time-limit", "5", "--out", str(out)])
    assert_clean_failure(res, out, "lacks", "GB")


def test_plan_writes_schema_valid_json_and_simulate_agrees(tmp_path):
    # one microbatch count (3 candidates, each OPTIMAL in about 0.1 s of CP-SAT deterministic time,
    # 2 s of wall time in all) and a budget far above it: the same plan on any machine. (All 12
    # candidates within 10 s was cut by the wall clock after 5 on a busy 2-core VM.)
    out = tmp_path / "plan.json"
    res = run(["plan", "--model", "llama3-8b", "--cluster", str(CLUSTERS / "h100x16_p150bx32.yaml"),
               "--global-batch", "64", "--seq-len", "2048", "--microbatches", "16",
               "--time-limit", "30", "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    for key in ("stages", "meshes", "schedule", "predicted", "solver"):
        assert key in doc
    assert set(doc["schedule"]["order"]) == set(doc["rank_mesh"])
    trace = tmp_path / "trace.json"
    res = run(["simulate", str(out), "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    assert "planner predicted" in res.output
    line = next(ln for ln in res.output.splitlines() if "planner predicted" in ln)
    pct = float(line.split("(")[-1].split("%")[0])
    assert abs(pct) <= 1.0
    assert json.loads(trace.read_text())["traceEvents"]


def test_simulate_rejects_plan_with_unknown_mesh(tmp_path):
    doc = {"format": "mpmd-plan/1", "model": "llama3-8b", "cluster": "h100x1",
           "cluster_path": str(CLUSTERS / "h100x1.yaml"), "global_batch": 8, "seq_len": 2048,
           "stages": [{"index": 0, "layers": [0, 34], "mesh": "nowhere"}],
           "meshes": {"nowhere": {"layout": {"data": 8, "tensor": 1}}}, "rank_mesh": ["nowhere"],
           "schedule": {"name": "gpipe", "microbatches": 1, "num_stages": 1, "stage_rank": [0],
                        "order": {"nowhere": [{"kind": "F", "stage": 0, "microbatch": 0},
                                              {"kind": "B", "stage": 0, "microbatch": 0}]}},
           "predicted": {}, "solver": {}}
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(doc))
    res = run(["simulate", str(p)])
    assert res.exit_code == 2 and "nowhere" in res.output and "Traceback" not in res.output


def test_simulate_rejects_malformed_json(tmp_path):
    p = tmp_path / "plan.json"
    p.write_text("{not json")
    res = run(["simulate", str(p)])
    assert res.exit_code == 2 and "malformed JSON" in res.output


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory) -> Path:
    """A plan over several of h100x64's meshes as listed ('carve: fixed': shaped, the planner
    puts llama3-8b on one mesh of all 64 GPUs, and these tests need a link between two)."""
    d = tmp_path_factory.mktemp("plan")
    out, cluster = d / "plan.json", d / "h100x64_fixed.yaml"
    cluster.write_text((CLUSTERS / "h100x64.yaml").read_text() + "carve: fixed\n")
    res = run(["plan", "--model", "llama3-8b", "--cluster", str(cluster),
               "--global-batch", "32", "--seq-len", "2048", "--schedule", "1f1b",
               "--time-limit", "30", "--out", str(out)])   # ~2 s; 30: never cut by the clock
    assert res.exit_code == 0, res.output
    return out


def test_simulate_rejects_deadlocking_schedule(small_plan, tmp_path):
    doc = json.loads(small_plan.read_text())
    order = doc["schedule"]["order"]
    first, last = doc["rank_mesh"][0], doc["rank_mesh"][-1]
    # the last stage's first backward before its first forward: waits on itself forever
    order[last][0], order[last][1] = order[last][1], order[last][0]
    p = tmp_path / "deadlock.json"
    p.write_text(json.dumps(doc))
    res = run(["simulate", str(p)])
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert "B" in res.output


def test_simulate_rejects_negative_straggler_factor(small_plan):
    mesh = json.loads(small_plan.read_text())["rank_mesh"][0]
    res = run(["simulate", str(small_plan), "--straggler", f"{mesh}=-2"])
    assert res.exit_code == 2 and "-2" in res.output and "Traceback" not in res.output


def test_simulate_failed_link_reports_where_and_when(small_plan):
    doc = json.loads(small_plan.read_text())
    a, b = sorted(doc["rank_mesh"][:2])
    res = run(["simulate", str(small_plan), "--fail-link", f"{a}<->{b}@0.001"])
    assert res.exit_code == 0, res.output
    assert "step failed" in res.output and f"{a}<->{b}" in res.output


def test_simulate_prints_the_exposed_communication(small_plan):
    """One line: the step minus the same replay with every link free (simulator.exposure), in
    seconds and as a share of the step; none when the step failed."""
    import re

    from mpmd.cli.simulate import load_plan_inputs
    from simulator.exposure import exposure

    res = run(["simulate", str(small_plan)])
    assert res.exit_code == 0, res.output
    m = re.search(r"^exposed communication: (\d+\.\d{4}) s per step \((\d+\.\d)% of the step\)$",
                  res.output, re.M)
    assert m, res.output
    plan, w, cluster = load_plan_inputs(str(small_plan))
    ex = exposure(plan, w, cluster)
    assert m.group(1) == f"{ex.exposed_s:.4f}" and m.group(2) == f"{ex.fraction * 100:.1f}"
    doc = json.loads(small_plan.read_text())
    a, b = sorted(doc["rank_mesh"][:2])
    failed = run(["simulate", str(small_plan), "--fail-link", f"{a}<->{b}@0.001"])
    assert "step failed" in failed.output and "exposed communication" not in failed.output


PRICED = """name: priced
node_groups:
- name: a100
  device: a100-40gb-sxm
  nodes: 2
  devices_per_node: 4
  price_usd_per_device_hour: 3.0
  scale_out_link: {bandwidth_gbit_per_s: 50, latency_us: 30, source: test}
"""


def test_plan_for_cost_prints_the_cost_and_the_goal(tmp_path):
    f = tmp_path / "priced.yaml"
    f.write_text(PRICED)
    r = run(["plan", "--model", "opt-350m", "--cluster", str(f), "--global-batch", "32", "--seq-len", "2048",
             "--objective", "cost", "--min-throughput", "1000", "--time-limit", "4", "--out", str(tmp_path / "p.json")])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.replace("│", " ").split())      # the table's cells, rows unwrapped
    assert "goal: lowest cost per step at >= 1,000 tokens/s" in text
    doc = json.loads((tmp_path / "p.json").read_text())
    goal = doc["solver"]["goal"]
    assert goal["kind"] == "cost" and goal["min_tokens_per_s"] == 1000
    assert goal["usd_per_step"] == pytest.approx(goal["usd_per_hour"] * doc["predicted"]["step_time_s"] / 3600)
    assert goal["usd_per_hour"] == 3.0 * sum(goal["devices"].values())


@pytest.mark.parametrize("args,needle", [
    (["--min-throughput", "-5"], "--min-throughput"),
    (["--objective", "money"], "--objective"),
    (["--objective", "cost", "--min-throughput", "1e15"], "even at its FLOP bound; fix: lower --min-throughput"),
])
def test_plan_for_cost_refuses_bad_goals_in_one_line(tmp_path, args, needle):
    f = tmp_path / "priced.yaml"
    f.write_text(PRICED)
    r = run(["plan", "--model", "opt-350m", "--cluster", str(f), "--global-batch", "32", *args])
    assert r.exit_code == 2 and needle in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("args, needle", [
    (["plan", "--model", "llama3-70", "--cluster", "hardware_profiles/clusters/mixed512_nodes.yaml"],
     "unknown model 'llama3-70'; did you mean 'llama3-70b'?"),
    (["plan", "--model", "llama3-70b", "--cluster", "hardware_profiles/clusters/mixed512_node.yaml"],
     "cluster file not found; fix: check the path (did you mean "
     "hardware_profiles/clusters/mixed512_nodes.yaml?)"),
    (["whatif", "--model", "llama3-8", "--options", "h100x64"],
     "unknown model 'llama3-8'; did you mean 'llama3-8b'?"),
])
def test_a_mistyped_name_is_refused_before_the_heavy_imports(args, needle, tmp_path, fresh_mpmd):
    """A fresh ``python -m mpmd`` process: one line with the closest name, exit 2, and neither JAX,
    OR-Tools nor pydantic imported (read from ``-X importtime``, not from a clock)."""
    code, said, _, heavy = fresh_mpmd(*args)
    assert code == 2 and len(said) == 1 and needle in said[0], said
    assert heavy == set(), heavy
    assert not list(tmp_path.iterdir())


def _plan_on_missing_cluster(folder: Path) -> Path:
    """A bundled plan whose cluster file is gone: ``plan/p.json``, naming ``gone/h100x128_node.yaml``."""
    doc = json.loads((Path(__file__).resolve().parents[2] / "tests" / "launchers" / "data"
                      / "llama3-70b-h100x128.json").read_text())
    doc["cluster_path"] = "gone/h100x128_node.yaml"
    (folder / "plan").mkdir()
    (folder / "plan" / "p.json").write_text(json.dumps(doc))
    return folder / "plan" / "p.json"


@pytest.mark.parametrize("args, line", [
    (["simulate", "missing.json"], "error: missing.json: plan JSON file not found; fix: check the path"),
    (["simulate", "missing.json", "--straggler", "m0"],
     "error: Invalid value for --straggler: 'm0' is not NAME=NUMBER; use MESH=2.0; "
     "see 'mpmd simulate --help'"),
    (["simulate", "missing.json", "--jitter", "x"],
     "error: Invalid value for '--jitter': 'x' is not a valid finite float; "
     "see 'mpmd simulate --help'"),
    (["simulate", "plan/p.json"],
     "error: gone/h100x128_node.yaml: cluster file not found; fix: check the path (did you mean "
     "hardware_profiles/clusters/h100x128_nodes.yaml?)"),
])
def test_simulate_refuses_a_missing_file_or_a_bad_flag_before_the_heavy_imports(
        args, line, tmp_path, fresh_mpmd):
    """``mpmd simulate`` in a fresh process: a missing plan file, a malformed knob or flag value and
    a plan whose cluster file is missing are each one line on stderr, nothing on stdout, exit 2,
    with neither JAX, OR-Tools nor pydantic imported (read from ``-X importtime``)."""
    _plan_on_missing_cluster(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    code, said, out, heavy = fresh_mpmd(*args)
    assert (code, said, out) == (2, [line], ""), said
    assert heavy == set(), heavy
    assert sorted(tmp_path.rglob("*")) == before
