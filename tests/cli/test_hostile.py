"""Hostile input always gets one line: exit status 2, one line starting with "error:", no
traceback, no output file, for every file format the tool reads (cluster, device profile, plan
JSON, what-if example, sweep spec, validation CSV) and the knobs and numbers a user types.

Timing ("within a second") is measured by the slow test at the end, not asserted by default.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mpmd.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CPU = ROOT / "hardware_profiles" / "clusters" / "cpu4x2.yaml"
H100 = ROOT / "hardware_profiles" / "devices" / "h100-sxm.yaml"
CSV = ROOT / "reports" / "validation" / "published_training.csv"
EXAMPLE = ROOT / "reports" / "examples" / "llama70b-1t.yaml"


def run(args: list[str]):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line(res, *outs: Path, needles: tuple[str, ...] = ()) -> str:
    """Assert the clean failure and return its line."""
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith("error: "), lines[0]
    for n in needles:
        assert n in lines[0], lines[0]
    for out in outs:
        assert not out.exists(), out
        if out.parent.exists():
            assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]
    return lines[0]


def plan_cmd(cluster, out: Path) -> list:
    return ["plan", "--model", "llama-tiny", "--cluster", cluster, "--global-batch", "8",
            "--time-limit", "1", "--out", out]


def two_meshes(link: str = "{between: [a, b], bandwidth_gb_per_s: 50, latency_us: 5}",
               n: str = "8", device: str = "h100-sxm") -> str:
    return (f"name: c\nmeshes:\n"
            f"  - {{name: a, device: {device}, num_devices: {n}}}\n"
            f"  - {{name: b, device: h100-sxm, num_devices: 8}}\n"
            f"links:\n  - {link}\n")


BILLION_LAUGHS = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{chr(97 + i)}: &{chr(97 + i)} [" + ",".join([f"*{chr(96 + i)}"] * 9) + "]"
       for i in range(1, 9)]) + "\n"


@pytest.fixture(scope="module")
def plan_json(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    res = run(["plan", "--model", "llama-tiny", "--cluster", CPU, "--global-batch", "8",
               "--time-limit", "2", "--out", out])
    assert res.exit_code == 0, res.output
    return out


# ----------------------------------------------------------------------------- cluster files
CLUSTERS = {
    "binary": (b"\x7fELF\x02\x01\x01\x00" + bytes(range(256)), ("NUL byte at offset 7", "binary file")),
    "not utf-8": ("name: caf".encode() + b"\xe9\n", ("not UTF-8", "offset 9")),
    "deep nesting": (("meshes: " + "[" * 100_000 + "]" * 100_000 + "\n").encode(),
                     ("nests deeper than 32 levels",)),
    "alias bomb": (BILLION_LAUGHS.encode(), ("alias bomb",)),
    "recursive alias": (b"meshes: &m [*m]\n", ("refers to a node that contains it",)),
    "infinite bandwidth": (two_meshes("{between: [a, b], bandwidth_gb_per_s: .inf, latency_us: 5}").encode(),
                           ("links[0].bandwidth_gb_per_s = inf is not a finite number",)),
    "overflowing bandwidth": (two_meshes("{between: [a, b], bandwidth_gbit_per_s: 1.0e+999, latency_us: 5}")
                              .encode(), ("links[0].bandwidth_gbit_per_s = inf",)),
    "absurd bandwidth": (two_meshes("{between: [a, b], bandwidth_gb_per_s: 1.0e+300, latency_us: 5}").encode(),
                         ("links.0.bandwidth_gb_per_s = 1e+300", "less than or equal to 1000000")),
    "nan latency": (two_meshes("{between: [a, b], bandwidth_gb_per_s: 50, latency_us: .nan}").encode(),
                    ("latency_us = nan is not a finite number",)),
    "latency over a second": (two_meshes("{between: [a, b], bandwidth_gb_per_s: 50, latency_us: 5.0e+6}")
                              .encode(), ("latency_us = 5000000.0", "less than or equal to 1000000")),
    "10**12 devices": (two_meshes(n="1000000000000").encode(),
                       ("meshes.0.num_devices = 1000000000000", "less than or equal to 1048576")),
    "syntax error": (b"meshes: [ {name: a\n", ("malformed YAML at line 2, column 1",)),
    "markup in a mesh name": (two_meshes().replace("name: a,", "name: '[/]',").encode(),
                              ("meshes.0.name = '[/]': String should match pattern",)),
    "513 meshes": (("name: c\nmeshes:\n" + "".join(f"  - {{name: m{i}, device: h100-sxm, num_devices: 1}}\n"
                                                   for i in range(513))).encode(),
                   ("List should have at most 512 items",)),
    "not a mapping": (b"- 1\n- 2\n", ("top level is list, not a mapping",)),
    "empty": (b"", ("top level is NoneType, not a mapping",)),
}


@pytest.mark.parametrize("case", list(CLUSTERS))
def test_hostile_cluster(tmp_path, case):
    data, needles = CLUSTERS[case]
    f = tmp_path / "c.yaml"
    f.write_bytes(data)
    out = tmp_path / "plan.json"
    line = one_line(run(plan_cmd(f, out)), out, needles=needles)
    assert str(f) in line


@pytest.mark.parametrize("path,needles", [
    ("/dev/zero", ("is not a regular file",)),
    ("/tmp", ("is a directory",)),
])
def test_cluster_that_is_not_a_file(tmp_path, path, needles):
    out = tmp_path / "plan.json"
    one_line(run(plan_cmd(path, out)), out, needles=needles)


def test_huge_cluster_file(tmp_path):
    f = tmp_path / "c.yaml"
    with open(f, "wb") as fh:
        fh.truncate(33 * 2**20)          # sparse: 33 MiB of NULs, over the 32 MiB limit
    out = tmp_path / "plan.json"
    one_line(run(plan_cmd(f, out)), out, needles=("over the 33554432-byte limit",))


# ----------------------------------------------------------------------------- device profiles
DEVICES = {
    "binary": (b"\x00\x01\x02", ("NUL byte at offset 0",)),
    "infinite peak": (None, ("peak_tflops.bf16.value = inf is not a finite number",)),
    "absurd memory bandwidth": (None, ("memory_bandwidth_gb_per_s.value = 1e+20",
                                       "less than or equal to 1000000")),
    "tiny peak": (None, ("peak_tflops.bf16.value = 1e-300", "greater than or equal to 0.001")),
    "deep nesting": (b"name: x\nvendor: " + b"[" * 50_000 + b"]" * 50_000 + b"\n", ("nests deeper",)),
}


@pytest.mark.parametrize("case", list(DEVICES))
def test_hostile_device_profile(tmp_path, case):
    data, needles = DEVICES[case]
    text = H100.read_text()
    if case == "infinite peak":
        data = text.replace("bf16:\n    value: ", "bf16:\n    value: .inf #", 1).encode()
    elif case == "tiny peak":
        data = text.replace("bf16:\n    value: ", "bf16:\n    value: 1.0e-300 #", 1).encode()
    elif case == "absurd memory bandwidth":
        data = text.replace("memory_bandwidth_gb_per_s:\n  value: ",
                            "memory_bandwidth_gb_per_s:\n  value: 1.0e+20 #", 1).encode()
    assert data != text.encode()
    dev = tmp_path / "h100-sxm.yaml"
    dev.write_bytes(data)
    cluster = tmp_path / "c.yaml"
    cluster.write_text(two_meshes(device="h100-sxm.yaml"))
    out = tmp_path / "plan.json"
    line = one_line(run(plan_cmd(cluster, out)), out, needles=needles)
    assert str(dev) in line


# ----------------------------------------------------------------------------- plan JSON
def broken_plans(doc: dict) -> dict[str, tuple[object, tuple[str, ...]]]:
    def edit(fn):
        d = json.loads(json.dumps(doc))
        fn(d)
        return json.dumps(d).encode()

    return {
        "binary": (b"\x89PNG\r\n\x1a\n\x00\x00", ("NUL byte at offset 8",)),
        "not utf-8": (b'{"model": "\xff"}', ("not UTF-8 (byte 0xff at offset 11)",)),
        "NaN": (json.dumps(doc).replace('"global_batch": 8', '"global_batch": NaN').encode(),
                ("holds the non-finite number NaN", "regenerate it with 'mpmd plan'")),
        "Infinity in predictions": (json.dumps(doc).replace('"step_time_s": ', '"step_time_s": Infinity, "x": ')
                                    .encode(), ("non-finite number Infinity",)),
        "deep nesting": (("[" * 100_000 + "]" * 100_000).encode(), ("nests deeper than 32 levels",)),
        "truncated": (json.dumps(doc)[:200].encode(), ("malformed JSON at line 1",)),
        "top level list": (b"[1, 2]", ("top level is list, not a plan object",)),
        "stages not a list": (edit(lambda d: d.update(stages="x")),
                              ("plan field stages = 'x' fails 'type: 'array''",)),
        "missing schedule": (edit(lambda d: d.pop("schedule")), ("lacks the key 'schedule'",)),
        "stage_rank out of range": (edit(lambda d: d["schedule"]["stage_rank"].__setitem__(1, 99)),
                                    ("schedule.stage_rank[1] = 99",)),
        "fragment of no stage": (edit(lambda d: d["schedule"]["order"]["m0"][0].__setitem__("stage", 7)),
                                 ("schedule.order.m0[0]",)),
        "global batch 10**15": (edit(lambda d: d.update(global_batch=10**15)),
                                ("global_batch = 1000000000000000", "use at most 16777216")),
        "microbatches 10**9": (edit(lambda d: d["schedule"].update(microbatches=10**9)),
                               ("schedule.microbatches = 1000000000",)),
        "layout over the mesh": (edit(lambda d: d["meshes"]["m0"]["layout"].update(data=64)),
                                 ("meshes.m0.layout", "data x context x tensor must equal num_devices 2")),
        "unknown mesh": (edit(lambda d: d.update(rank_mesh=["m0", "m1", "m2", "zz"])),
                         ("rank_mesh[3] = 'zz'",)),
        "markup in the cluster name": (edit(lambda d: d.update(cluster="[/]")),
                                       ("plan field cluster = '[/]'", "letters, digits")),
        "cluster file is binary": (edit(lambda d: d.update(cluster_path="/bin/sh")),
                                   ("/bin/sh: cluster file has a NUL byte",)),
        "layers do not cover the model": (edit(lambda d: d["stages"][-1]["layers"].__setitem__(1, 50)),
                                          ("stages cover layers [0, 50) but llama-tiny has 10",)),
    }


PLAN_CASES = ["binary", "not utf-8", "NaN", "Infinity in predictions", "deep nesting", "truncated",
              "top level list", "stages not a list", "missing schedule", "stage_rank out of range",
              "fragment of no stage", "global batch 10**15", "microbatches 10**9",
              "layout over the mesh", "unknown mesh", "markup in the cluster name", "cluster file is binary",
              "layers do not cover the model"]


@pytest.mark.parametrize("case", PLAN_CASES)
def test_hostile_plan_json(tmp_path, plan_json, case):
    data, needles = broken_plans(json.loads(plan_json.read_text()))[case]
    f = tmp_path / "plan.json"
    f.write_bytes(data)
    trace = tmp_path / "trace.json"
    line = one_line(run(["simulate", f, "--trace", trace]), trace, needles=needles)
    assert str(f) in line or case == "cluster file is binary"


def test_plan_cases_are_all_listed(plan_json):
    assert sorted(broken_plans(json.loads(plan_json.read_text()))) == sorted(PLAN_CASES)


def test_run_refuses_a_binary_plan(tmp_path):
    f = tmp_path / "plan.json"
    f.write_bytes(b"\x00" * 64)
    one_line(run(["run", f, "--steps", "1"]), needles=(f"{f}: plan JSON file has a NUL byte",))


BUNDLED_PLAN = ROOT / "tests" / "launchers" / "data" / "llama3-70b-h100x128.json"


@pytest.mark.parametrize("args, line", [
    (["run", "missing.json"], "error: missing.json: plan JSON file not found; fix: check the path"),
    (["run", "missing.json", "--steps", "0"],
     "error: Invalid value for '--steps': 0 is not in the range 1<=x<=1000000; "
     "see 'mpmd run --help'"),
    (["run", "missing.json", "--process-id", "1"],
     "error: --process-id and --coordinator need --processes N (the number of processes of the "
     "run); see 'mpmd run --help'"),
    (["run", "missing.json", "--processes", "2", "--process-id", "0"],
     "error: give --process-id and --coordinator together (each host runs one process), or "
     "neither to start all processes on this host; see 'mpmd run --help'"),
    (["run", "missing.json", "--processes", "2", "--process-id", "0", "--coordinator", "nohost"],
     "error: --coordinator 'nohost' is not HOST:PORT; pass e.g. 10.0.0.1:1234 (the host of "
     "process 0 and a free port); see 'mpmd run --help'"),
    (["run", "missing.json", "--processes", "2"],
     "error: missing.json: plan JSON file not found; fix: check the path"),
    (["run", str(BUNDLED_PLAN), "--cluster", "gone.yaml"],
     "error: gone.yaml: cluster file not found; fix: check the path"),
])
def test_run_refuses_a_missing_file_or_a_bad_flag_before_jax(args, line, tmp_path, fresh_mpmd):
    """``mpmd run`` in a fresh process: a missing plan or cluster file and bad flags (a value out
    of range, process flags no run can take) are each one line on stderr, nothing on stdout,
    exit 2, with neither JAX, OR-Tools nor pydantic imported (read from ``-X importtime``)."""
    code, said, out, heavy = fresh_mpmd(*args)
    assert (code, said, out) == (2, [line], ""), said
    assert heavy == set(), heavy
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------- simulate knobs
@pytest.mark.parametrize("args,needles", [
    (["--straggler", "nope=2"], ("--straggler", "'nope' is not a mesh of the plan",
                                 "use one of m0, m1, m2, m3")),
    (["--fail-mesh", "m9@0.5"], ("--fail-mesh", "'m9' is not a mesh of the plan")),
    (["--fail-link", "m0<->m9@1"], ("--fail-link", "'m0<->m9' is not a link of cluster 'cpu4x2'",
                                    "use one of m0<->m1, m0<->m2")),
    (["--degrade-link", "ib0=0.5"], ("--degrade-link", "'ib0' is not a link")),
    (["--degrade-link", "m0<->m1=2"], ("'m0<->m1=2': 2 is not a number in (0, 1]",)),
    (["--degrade-link", "m0<->m1=nan"], ("nan is not a number in (0, 1]",)),
    (["--straggler", "m0=inf"], ("inf is not a number in (0, 1e+06]",)),
    (["--straggler", "m0=0"], ("0 is not a number in (0, 1e+06]",)),
    (["--fail-mesh", "m0@-1"], ("-1 is not a number in [0, 1e+09]",)),
    (["--fail-link", "m0<->m1"], ("'m0<->m1' is not NAME@NUMBER",)),
    (["--jitter", "inf"], ("--jitter", "'inf' is not a finite number",)),
    (["--jitter", "nan"], ("'nan' is not a finite number",)),
    (["--jitter", "-0.1"], ("--jitter",)),
    (["--microbatches", "1000000000"], ("--microbatches", "1<=x<=65536")),
])
def test_simulate_knobs(tmp_path, plan_json, args, needles):
    trace = tmp_path / "trace.json"
    one_line(run(["simulate", plan_json, "--trace", trace, *args]), trace, needles=needles)


def test_simulate_knobs_accept_either_link_order(tmp_path, plan_json):
    trace = tmp_path / "trace.json"
    res = run(["simulate", plan_json, "--degrade-link", "m1<->m0=0.5", "--fail-mesh", "m3@100",
               "--straggler", "m2=1.5", "--trace", trace])
    assert res.exit_code == 0, res.output
    assert trace.exists()


# ----------------------------------------------------------------------------- CLI numbers
@pytest.mark.parametrize("args,needles", [
    (["--global-batch", "99999999999"], ("--global-batch", "1<=x<=16777216")),
    (["--seq-len", "10000000"], ("--seq-len", "1<=x<=4194304")),
    (["--microbatches", "100000"], ("--microbatches",)),
    (["--max-tensor", "2000000"], ("--max-tensor",)),
    (["--time-limit", "nan"], ("--time-limit", "'nan' is not a finite number")),
    (["--time-limit", "inf"], ("--time-limit", "'inf' is not a finite number")),
])
def test_plan_numbers(tmp_path, args, needles):
    out = tmp_path / "plan.json"
    one_line(run([*plan_cmd(CPU, out), *args]), out, needles=needles)


@pytest.mark.parametrize("args,needles", [
    (["--steps", "10000000"], ("--steps", "1<=x<=1000000")),
    (["--lr", "nan"], ("--lr", "not a finite number")),
    (["--check-every", "0"], ("--check-every",)),
])
def test_run_numbers(plan_json, args, needles):
    one_line(run(["run", plan_json, *args]), needles=needles)


# ----------------------------------------------------------------------------- what-if inputs
def whatif(tmp_path, *args) -> tuple[list, list[Path]]:
    stem = tmp_path / "out" / "report"
    outs = [stem.with_suffix(s) for s in (".html", ".csv", ".md", ".png")]
    return ["whatif", *args, "--out", stem, "--no-screenshot", "--time-limit", "1"], outs


EXAMPLES = {
    "binary": (b"\x00\x00", ("NUL byte at offset 0",)),
    "deep nesting": (("options: " + "[" * 100_000 + "]" * 100_000).encode(), ("nests deeper",)),
    "alias bomb": (BILLION_LAUGHS.encode(), ("alias bomb",)),
    "infinite tokens": (None, ("tokens = inf is not a finite number",)),
    "tokens as the string inf": (None, ("tokens = 'inf' is not a number above 0",)),
    "global batch 10**12": (None, ("global_batch = 1000000000000 is not an integer from 1 to 16777216",)),
    "option time limit nan": (None, ("time_limit_s = 'nan' is not a number above 0",)),
    "option without a cluster": (None, ("option cluster None is not a cluster file",)),
    "options not a list": (None, ("options is int; write e.g. 'options: [h100x64]'",)),
}


@pytest.mark.parametrize("case", list(EXAMPLES))
def test_hostile_example(tmp_path, case):
    data, needles = EXAMPLES[case]
    text = EXAMPLE.read_text()
    if case == "infinite tokens":
        data = text.replace("tokens: 1.0e12", "tokens: .inf").encode()
    elif case == "tokens as the string inf":
        data = text.replace("tokens: 1.0e12", "tokens: 'inf'").encode()
    elif case == "global batch 10**12":
        data = text.replace("global_batch: 256", "global_batch: 1000000000000").encode()
    elif case == "option without a cluster":
        data = text[:text.index("options:\n  - cluster:") + len("options:\n  - cluster:")].encode()
    elif case == "options not a list":
        data = text.split("options:\n")[0].encode() + b"options: 5\n"
    elif case == "option time limit nan":
        data = text.replace("options:\n  - cluster: h100x64_nodes\n",
                            "options:\n  - cluster: h100x64_nodes\n    time_limit_s: 'nan'\n").encode()
    assert data != text.encode(), case
    f = tmp_path / "ex.yaml"
    f.write_bytes(data)
    args, outs = whatif(tmp_path, "--example", f)
    one_line(run(args), *outs, needles=needles)


SWEEPS = {
    "binary": (b"\x00", ("NUL byte",)),
    "not utf-8": (b"budget_usd_per_hour: \xff\n", ("not UTF-8",)),
    "infinite budget": (b"budget_usd_per_hour: .inf\ndevices: {h100-sxm: {unit: 8, units: [1]}}\n",
                        ("budget_usd_per_hour = inf is not a finite number",)),
    "10**9 units": (b"budget_usd_per_hour: 100\ndevices: {h100-sxm: {unit: 8, units: [1000000000]}}\n",
                    ("too large",)),
    "combinatorial explosion": (("budget_usd_per_hour: 100\ndevices:\n"
                                 + "".join(f"  {d}: {{unit: 8, units: {list(range(40))}}}\n"
                                           for d in ("h100-sxm", "tpu-v5e", "b200"))).encode(),
                                ("tries 64000 combinations",)),
    "axes not a mapping": (b"budget_usd_per_hour: 100\ndevices: {h100-sxm: {unit: 8, units: [1], axes: [8]}}\n",
                           ("axes [8] is not a mapping",)),
}


@pytest.mark.parametrize("case", list(SWEEPS))
def test_hostile_sweep(tmp_path, case):
    data, needles = SWEEPS[case]
    f = tmp_path / "sweep.yaml"
    f.write_bytes(data)
    args, outs = whatif(tmp_path, "--model", "llama3-8b", "--sweep", f)
    one_line(run(args), *outs, needles=needles)


@pytest.mark.parametrize("args,needles", [
    (["--tokens", "nan"], ("--tokens", "'nan' is not a finite number")),
    (["--tokens", "inf"], ("--tokens", "'inf' is not a finite number")),
    (["--global-batch", "100000000000"], ("--global-batch", "1<=x<=16777216")),
    (["--deadline-days", "1e300"], ("--deadline-days",)),
    (["--price", "h100-sxm=inf"], ("--price 'h100-sxm=inf'", "(finite)")),
])
def test_whatif_numbers(tmp_path, args, needles):
    cmd, outs = whatif(tmp_path, "--example", EXAMPLE, *args)
    one_line(run(cmd), *outs, needles=needles)


def test_hostile_option_cluster(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text(two_meshes(n="1000000000000"))
    args, outs = whatif(tmp_path, "--model", "llama3-8b", "--options", f)
    one_line(run(args), *outs, needles=("num_devices = 1000000000000",))


# ----------------------------------------------------------------------------- validation CSV
def csv_with(line: int, column: str, value: str) -> str:
    rows = CSV.read_text().splitlines()
    head = rows[0].split(",")
    cells = rows[line - 1].split(",")
    cells[head.index(column)] = value
    rows[line - 1] = ",".join(cells)
    return "\n".join(rows) + "\n"


HEADER_COLUMNS = len(CSV.read_text().splitlines()[0].split(","))
"""Columns of the bundled validation CSV's header (a row one field longer is refused)."""

VALIDATION = {
    "unknown device": (lambda: csv_with(3, "device", "h900"),
                       ("row 3: device 'h900' is not a known profile", "a100-80gb-sxm")),
    "non-finite value": (lambda: csv_with(2, "value", "inf"), ("row 2: value inf is not a finite",)),
    "nan value": (lambda: csv_with(4, "value", "nan"), ("row 4: value nan",)),
    "microbatches do not divide": (lambda: csv_with(2, "micro_batch", "7"),
                                   ("row 2: global_batch 144 is not micro_batch x microbatches x dp",)),
    "inconsistent layout": (lambda: csv_with(2, "tp", "2"), ("row 2: tp*pp*dp = 16 != gpus=8",)),
    "absurd gpus": (lambda: csv_with(2, "gpus", "1000000000000"), ("row 2: gpus=1000000000000 is out of range",)),
    "too many microbatches": (lambda: csv_with(2, "global_batch", "16777216").replace(
        "16777216,6,24,", "16777216,,,", 1), ("row 2: global_batch 16777216 makes over 65536 microbatches",)),
    "binary": (lambda: b"source,model\x00\n", ("NUL byte at offset 12",)),
    "not utf-8": (lambda: CSV.read_bytes().replace(b"zb,1.5B", b"zb,1.5\xb5", 1), ("not UTF-8",)),
    "header only": (lambda: CSV.read_text().splitlines()[0] + "\n", ("validation CSV has no rows",)),
    "header lacks a column": (lambda: CSV.read_text().replace(",metric,", ",metrik,", 1),
                              ("header lacks column(s) metric",)),
    "extra field": (lambda: csv_with(2, "value", "11.8,99"),
                    (f"row 2: {HEADER_COLUMNS + 1} fields, more than the {HEADER_COLUMNS} columns",)),
}


@pytest.mark.parametrize("case", list(VALIDATION))
def test_hostile_validation_csv(tmp_path, case):
    """A file-level problem always fails; a bad row fails under --strict (without it the row is
    skipped and the others scored: tests/cli/test_validate_cli.py)."""
    make, needles = VALIDATION[case]
    data = make()
    f = tmp_path / "v.csv"
    f.write_bytes(data if isinstance(data, bytes) else data.encode())
    out = tmp_path / "validation.md"
    one_line(run(["validate", "--csv", f, "--out", out, "--strict"]), out, needles=needles)


# ----------------------------------------------------------------------------- timing (slow)
@pytest.mark.slow
def test_hostile_inputs_fail_within_a_second(tmp_path, plan_json):
    """Each hostile file fails in under a second in-process (after one warm-up import)."""
    run(plan_cmd(CPU, tmp_path / "warm.json") + ["--global-batch", "0"])
    cases = [("deep nesting", CLUSTERS["deep nesting"][0]), ("alias bomb", CLUSTERS["alias bomb"][0]),
             ("infinite bandwidth", CLUSTERS["infinite bandwidth"][0]),
             ("10**12 devices", CLUSTERS["10**12 devices"][0])]
    for name, data in cases:
        f = tmp_path / "c.yaml"
        f.write_bytes(data)
        out = tmp_path / "plan.json"
        t0 = time.perf_counter()
        one_line(run(plan_cmd(f, out)), out)
        assert time.perf_counter() - t0 < 1.0, name
    doc = json.loads(plan_json.read_text())
    for case in ("deep nesting", "NaN", "global batch 10**15"):
        f = tmp_path / "p.json"
        f.write_bytes(broken_plans(doc)[case][0])
        t0 = time.perf_counter()
        one_line(run(["simulate", f]))
        assert time.perf_counter() - t0 < 1.0, case
